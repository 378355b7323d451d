// How registry.ts configures etcd3 and gRPC: keepalive within what etcd 3.4 tolerates, deadlines
// on unary calls, and etcd's "require leader" metadata on watch streams.
import assert from 'node:assert/strict';
import { Metadata, type NextCall } from '@grpc/grpc-js';
import { etcdClientOptions, KEEPALIVE_GRPC_OPTIONS, requireLeader } from '../../src/subnet/etcd/registry.js';
import { createLogger } from '../../src/util/log.js';

const logger = createLogger({ level: 'error' });
const base = { endpoints: ['http://10.0.0.1:2379', 'http://10.0.0.2:2379'], prefix: '/coreos.com/network' };

describe('etcd client options', () => {
  it('turns on HTTP/2 keepalive within what etcd 3.4 accepts', () => {
    const o = etcdClientOptions(base, logger);
    assert.deepEqual(o.grpcOptions, KEEPALIVE_GRPC_OPTIONS);
    // etcd --grpc-keepalive-min-time defaults to 5 s and its policy refuses pings without a
    // stream: more frequent pings, or pings while idle, end in GOAWAY "too_many_pings".
    assert.ok(KEEPALIVE_GRPC_OPTIONS['grpc.keepalive_time_ms'] >= 2 * 5000);
    assert.equal(KEEPALIVE_GRPC_OPTIONS['grpc.keepalive_permit_without_calls'], 0);
    assert.ok(KEEPALIVE_GRPC_OPTIONS['grpc.keepalive_timeout_ms'] <= 10_000);
  });

  it("keeps the caller's channel options beside the keepalive ones", () => {
    const o = etcdClientOptions({ ...base, grpcOptions: { 'weft.bench.node': 3, 'grpc.keepalive_time_ms': 30_000 } }, logger);
    assert.deepEqual(o.grpcOptions, { ...KEEPALIVE_GRPC_OPTIONS, 'weft.bench.node': 3, 'grpc.keepalive_time_ms': 30_000 });
    assert.deepEqual(o.hosts, base.endpoints);
  });

  it('gives unary calls a deadline and streams none', () => {
    const f = etcdClientOptions(base, logger).defaultCallOptions as (ctx: { isStream: boolean }) => { deadline?: number };
    const before = Date.now();
    const unary = f({ isStream: false });
    assert.ok(unary.deadline !== undefined && unary.deadline >= before + 4000 && unary.deadline <= Date.now() + 6000);
    assert.deepEqual(f({ isStream: true }), {});
  });
});

describe('requireLeader (etcd clientv3.WithRequireLeader)', () => {
  it("adds hasleader=true to a watch call's metadata, on a copy", () => {
    let sent: Metadata | null = null;
    const next = {
      start: (md: Metadata) => (sent = md),
      cancelWithStatus: () => undefined,
      getPeer: () => '',
      sendMessageWithContext: () => undefined,
      sendMessage: () => undefined,
      startRead: () => undefined,
      halfClose: () => undefined,
    } as unknown as ReturnType<NextCall>;
    const auth = new Metadata();
    auth.set('token', 'abc');
    const call = requireLeader({ method_definition: {} } as never, () => next);
    call.start(auth, {});
    assert.ok(sent !== null);
    const md = sent as Metadata;
    assert.deepEqual(md.get('hasleader'), ['true']);
    assert.deepEqual(md.get('token'), ['abc'], 'the auth token goes along');
    assert.deepEqual(auth.get('hasleader'), [], "the client's shared metadata is not changed");
  });
});
