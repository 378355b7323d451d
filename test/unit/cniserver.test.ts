// The CNI server with fake plugins on a socket in a temp dir (no namespaces, no real plugin):
// serialization per container, the time bound, readiness, isolation of an uncaught exception,
// refused frames, the socket file's life (mode, stale, live, not a socket) and stop.
import assert from 'node:assert/strict';
import { linkSync, mkdirSync, mkdtempSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { pluginStderr } from '../../cni-plugins/skel/stderr.js';
import type { CniPlugin, CniRequest, CniResult } from '../../cni-plugins/skel/types.js';
import { InProcessExecutor } from '../../src/cniserver/executor.js';
import { CniServer, type CniServerOptions } from '../../src/cniserver/server.js';
import type { CniRequestResult } from '../../src/cniserver/types.js';
import { DaemonMetrics } from '../../src/daemon/metrics.js';
import { renderStatus } from '../../src/cli/status.js';
import { buildStatus, cniServerStatus, DaemonActivity } from '../../src/daemon/status.js';
import type { Logger } from '../../src/util/log.js';
import { cniCall, rawCall, replyError, requestFrame } from '../helpers/cni-client.js';
import { waitFor } from '../helpers/wait.js';

const silent: Logger = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {}, child: () => silent };
const CONF = JSON.stringify({ cniVersion: '1.0.0', name: 'net', type: 'fake' });

function env(command: string, containerId = 'c1'): Record<string, string> {
  return { CNI_COMMAND: command, CNI_CONTAINERID: containerId, CNI_IFNAME: 'eth0', CNI_NETNS: '/var/run/netns/x', CNI_PATH: '/opt/cni/bin' };
}

interface Span {
  id: string;
  verb: string;
  start: number;
  end: number;
}

/** A plugin whose ADD/DEL take `ms` (per container ID, from CNI_ARGS "MS=n"), recording spans. */
function fakePlugin(spans: Span[], hooks: { add?: (req: CniRequest) => Promise<void> } = {}): CniPlugin {
  const run = async (req: CniRequest) => {
    const start = performance.now();
    const ms = Number(req.args.get('MS') ?? '0');
    if (ms > 0) await new Promise((r) => setTimeout(r, ms));
    spans.push({ id: req.containerId, verb: req.command, start, end: performance.now() });
  };
  return {
    name: 'bridge',
    add: async (req): Promise<CniResult> => {
      await hooks.add?.(req);
      await run(req);
      pluginStderr(`added ${req.containerId}\n`);
      // The env a plugin sees: only the request's CNI_* and the server's PATH.
      const keys = Object.keys(req.env).filter((k) => !k.startsWith('CNI_'));
      return { cniVersion: '1.0.0', ips: [{ address: '10.0.0.2/24' }], dns: { search: keys } };
    },
    del: run,
    check: run,
  };
}

describe('CNI server (fake plugins, unix socket in a temp dir)', function () {
  this.timeout(30_000);
  let dir = '';
  const servers: CniServer[] = [];
  let spans: Span[] = [];
  let metrics: DaemonMetrics;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'wt-cnisrv-'));
    spans = [];
    metrics = new DaemonMetrics({ processMetrics: false });
  });
  afterEach(async () => {
    for (const s of servers.splice(0)) await s.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  let executor: InProcessExecutor;
  async function start(opts: Partial<CniServerOptions> = {}, plugin = fakePlugin(spans)): Promise<CniServer> {
    executor = new InProcessExecutor(() => new Map([['bridge', plugin]]));
    const s = new CniServer({
      socketPath: join(dir, 'run', 'cni.sock'),
      logger: silent,
      metrics,
      isReady: () => true,
      executor,
      ...opts,
    });
    servers.push(s);
    await s.start();
    return s;
  }

  const call = (s: CniServer, e: Record<string, string>, stdin = CONF) => cniCall(s.socketPath, { plugin: 'bridge', env: e, stdin });

  async function count(result: CniRequestResult): Promise<number> {
    const { values } = await metrics.cniRequests.get();
    return values.filter((v) => v.labels.result === result).reduce((a, v) => a + v.value, 0);
  }

  it('runs the plugin: its result on stdout, its diagnostics on stderr, only CNI_* and PATH in its env', async () => {
    const s = await start({ pluginPath: '/usr/bin' });
    assert.equal(s.serving, true);
    const r = await call(s, env('ADD'));
    assert.ok('status' in r, '\'status\' in r');
    assert.equal(r.status, 0, r.stdout);
    const result = JSON.parse(r.stdout) as CniResult;
    assert.equal(result.ips?.[0]?.address, '10.0.0.2/24');
    assert.deepEqual(result.dns?.search, ['PATH']);
    assert.equal(r.stderr, 'added c1\n');
    const v = await call(s, { CNI_COMMAND: 'VERSION' }, '');
    assert.ok('status' in v && v.status === 0 && /supportedVersions/.test(v.stdout), '\'status\' in v && v.status === 0 && /supportedVersions/.test(v.stdout)');
    // The skel's own checks apply: a bad container ID is the reference's code 4.
    assert.equal(replyError(await call(s, env('ADD', 'bad id!'))).code, 4);
    assert.equal(await count('ok'), 2);
    assert.equal(await count('error'), 1);
  });

  it('runs requests for one container one after the other, in order; others at once', async () => {
    const s = await start();
    const slow = (verb: string, id: string) => call(s, { ...env(verb, id), CNI_ARGS: 'MS=150' });
    await Promise.all([slow('ADD', 'a'), slow('DEL', 'a'), slow('ADD', 'b'), slow('ADD', 'c')]);
    const a = spans.filter((x) => x.id === 'a');
    assert.deepEqual(a.map((x) => x.verb), ['ADD', 'DEL']);
    assert.ok(a[1]!.start >= a[0]!.end, 'DEL of a started before its ADD ended');
    const b = spans.find((x) => x.id === 'b')!;
    const c = spans.find((x) => x.id === 'c')!;
    assert.ok(b.start < c.end && c.start < b.end, 'b and c did not overlap');
  });

  it('a delegate that comes back through the socket (nested) does not wait for its parent\'s container or slot', async () => {
    let socket = '';
    let nested: unknown = null;
    const plugin = fakePlugin(spans, {
      add: async (req) => {
        if (req.containerId !== 'outer') return;
        // As skel/delegate.ts runs a delegate program: the request's env, another verb.
        const e = Object.fromEntries(Object.entries(req.env).filter((kv): kv is [string, string] => kv[0].startsWith('CNI_') && kv[1] !== undefined));
        nested = await cniCall(socket, { plugin: 'bridge', env: { ...e, CNI_COMMAND: 'CHECK' }, stdin: CONF }, 5000);
      },
    });
    const s = await start({ maxRunning: 1, requestTimeoutMs: 10_000 }, plugin);
    socket = s.socketPath;
    const r = await call(s, env('ADD', 'outer'));
    assert.ok('status' in r && r.status === 0, JSON.stringify(r));
    assert.ok(nested !== null && typeof nested === 'object' && 'status' in nested && nested.status === 0, JSON.stringify(nested));
    assert.deepEqual(spans.map((x) => x.verb), ['CHECK', 'ADD']);
  });

  it('answers a request that takes too long with an error, and releases its container', async () => {
    let hang = true;
    const plugin = fakePlugin(spans, { add: () => (hang ? new Promise(() => {}) : Promise.resolve()) });
    const s = await start({ requestTimeoutMs: 300 }, plugin);
    const t0 = Date.now();
    const r = await call(s, env('ADD'));
    assert.ok(Date.now() - t0 < 3000, 'Date.now() - t0 < 3000');
    const e = replyError(r);
    assert.equal(e.code, 999);
    assert.match(e.msg, /did not finish within 0.3 s; abandoned/);
    await waitFor(() => s.state().abandoned === 1, { what: 'the abandoned request counted' });
    hang = false;
    const del = await call(s, env('DEL'));
    assert.ok('status' in del && del.status === 0, JSON.stringify(del));
    assert.equal(await count('timeout'), 1);
    const st = await cniServerStatus(s.state(), metrics);
    assert.equal(st.lastErrors[0]?.code, 999);
    assert.equal(st.results.timeout, 1);
  });

  it('ADD waits for readiness and then runs; gives up with code 11; DEL does not wait', async () => {
    let ready = false;
    const s = await start({ isReady: () => ready, readyTimeoutMs: 400 });
    const t0 = Date.now();
    assert.equal(replyError(await call(s, env('ADD', 'early'))).code, 11);
    assert.ok(Date.now() - t0 >= 350, 'Date.now() - t0 >= 350');
    const del = await call(s, env('DEL', 'other'));
    assert.ok('status' in del && del.status === 0, '\'status\' in del && del.status === 0');
    const s2 = await start({ socketPath: join(dir, 'run2', 'cni.sock'), isReady: () => ready, readyTimeoutMs: 10_000 });
    const pending = call(s2, env('ADD', 'waits'));
    await waitFor(() => s2.state().inFlight === 1, { what: 'the ADD to arrive' });
    assert.equal(spans.filter((x) => x.id === 'waits').length, 0);
    ready = true;
    const r = await pending;
    assert.ok('status' in r && r.status === 0, JSON.stringify(r));
    assert.equal(await count('not_ready'), 1);
  });

  it('tells the pod hooks of a pod\'s ADD (replying once they are done, code 11 past the bound) and DEL', async () => {
    const seen: string[] = [];
    let release = () => {};
    const s = await start({
      podHookTimeoutMs: 300,
      podHooks: {
        podAdded: (pod, ips) => {
          seen.push(`add ${pod.namespace}/${pod.name} ${pod.uid ?? '-'} ${pod.sandbox} ${ips.join(',')}`);
          return pod.name === 'slow' ? new Promise<void>((r) => (release = r)) : Promise.resolve();
        },
        podDeleted: (pod) => void seen.push(`del ${pod.namespace}/${pod.name} ${pod.sandbox}`),
      },
    });
    const pod = (command: string, name: string) => ({ ...env(command, name), CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME=${name};K8S_POD_UID=u-${name}` });
    const ok = await call(s, pod('ADD', 'p1'));
    assert.ok('status' in ok && ok.status === 0, JSON.stringify(ok));
    // The reply waits for the hook: still unanswered while it is pending, answered when it resolves.
    let answered = false;
    const pending = call(s, { ...pod('ADD', 'slow'), CNI_ARGS: 'K8S_POD_NAMESPACE=x;K8S_POD_NAME=slow' }).finally(() => (answered = true));
    await waitFor(() => seen.includes('add x/slow - slow 10.0.0.2'), { what: 'the hook to be called' });
    assert.equal(answered, false);
    release();
    const r = await pending;
    assert.ok('status' in r && r.status === 0, JSON.stringify(r));
    // A hook that does not finish within the bound: code 11, naming the pod.
    const s2 = await start({ socketPath: join(dir, 'run2', 'cni.sock'), podHookTimeoutMs: 200, podHooks: { podAdded: () => new Promise(() => {}), podDeleted: () => {} } });
    const late = replyError(await call(s2, pod('ADD', 'p2')));
    assert.equal(late.code, 11);
    assert.match(late.msg, /NetworkPolicy of pod x\/p2 is not in place/);
    // DEL tells the hook; requests without a pod in CNI_ARGS never reach it.
    const del = await call(s, pod('DEL', 'p1'));
    assert.ok('status' in del && del.status === 0, JSON.stringify(del));
    await call(s, env('ADD', 'no-pod'));
    // Nor do a pod's other attachments (Multus' net1): their addresses are not the pod's own.
    await call(s, { ...pod('ADD', 'p1'), CNI_IFNAME: 'net1' });
    assert.deepEqual(seen, ['add x/p1 u-p1 p1 10.0.0.2', 'add x/slow - slow 10.0.0.2', 'del x/p1 p1']);
  });

  it('an exception thrown from a request\'s own async work fails that request only', async () => {
    const plugin = fakePlugin(spans, {
      add: (req) =>
        req.containerId === 'boom'
          ? new Promise(() => {
              setTimeout(() => {
                throw new Error('exploded in a callback');
              }, 10);
            })
          : Promise.resolve(),
    });
    const s = await start({}, plugin);
    // Stand in for weftd's handler (mocha's would fail the test).
    const saved = process.listeners('uncaughtException');
    process.removeAllListeners('uncaughtException');
    const unclaimed: unknown[] = [];
    process.on('uncaughtException', (e) => {
      if (!executor.claimUncaught(e)) unclaimed.push(e);
    });
    try {
      const [boom, fine] = await Promise.all([call(s, env('ADD', 'boom')), call(s, env('ADD', 'fine'))]);
      assert.match(replyError(boom).msg, /bridge ADD failed: exploded in a callback/);
      assert.ok('status' in fine && fine.status === 0, '\'status\' in fine && fine.status === 0');
      assert.deepEqual(unclaimed, []);
      assert.equal(executor.claimUncaught(new Error('not a request')), false);
    } finally {
      process.removeAllListeners('uncaughtException');
      for (const l of saved) process.on('uncaughtException', l);
    }
  });

  it('refuses garbage, oversized, unknown-version and unknown-plugin requests, and goes on serving', async () => {
    const s = await start({ frameTimeoutMs: 500 });
    const sock = s.socketPath;
    const refusal = async (bytes: Buffer, opts: { keepOpen?: boolean } = {}) => {
      const o = await rawCall(sock, bytes, { timeoutMs: 10_000, ...opts });
      assert.ok('reply' in o, JSON.stringify(o));
      return replyError(o.reply);
    };
    const frame = (text: string) => {
      const b = Buffer.from(text);
      const h = Buffer.alloc(4);
      h.writeUInt32BE(b.length, 0);
      return Buffer.concat([h, b]);
    };
    assert.equal((await refusal(frame('not json at all'))).code, 6);
    assert.equal((await refusal(Buffer.from([0, 0]))).code, 6); // ended inside the header
    assert.equal((await refusal(Buffer.from([0, 0, 0, 9, 1]), { keepOpen: true })).code, 6); // never completed
    const huge = Buffer.alloc(2 * 1024 * 1024 + 4, 0x61);
    huge.writeUInt32BE(2 * 1024 * 1024, 0);
    const big = await refusal(huge);
    assert.equal(big.code, 5);
    assert.match(big.msg, /request too large/);
    assert.equal(big.cniVersion, '1.0.0');
    assert.equal((await refusal(frame(JSON.stringify({ v: 9, plugin: 'bridge', env: {}, stdin: '' })))).code, 1);
    const unknown = await cniCall(sock, { plugin: 'nope', env: env('ADD'), stdin: CONF });
    assert.equal(replyError(unknown).code, 4);
    assert.match(replyError(unknown).msg, /unknown plugin "nope"/);
    const r = await call(s, env('ADD'));
    assert.ok('status' in r && r.status === 0, '\'status\' in r && r.status === 0');
    assert.equal(await count('invalid'), 6);
    assert.equal(s.state().inFlight, 0);
  });

  it('creates its directory 0700 and the socket 0600, replaces a stale socket, removes it on stop', async () => {
    // A stale socket, as a weftd killed with -9 leaves it: bound, and nobody listening any more
    // (closing a Node server unlinks its path, so a hard link keeps the file).
    mkdirSync(join(dir, 'run'), { mode: 0o700 });
    const path = join(dir, 'run', 'cni.sock');
    const old: Server = createServer();
    await new Promise<void>((r) => old.listen(path, r));
    const keep = join(dir, 'keep.sock');
    linkSync(path, keep);
    await new Promise<void>((r) => old.close(() => r()));
    linkSync(keep, path);
    assert.ok(statSync(path).isSocket(), 'statSync(path).isSocket()');

    const s = await start();
    assert.equal(s.state().phase, 'serving');
    assert.equal(statSync(join(dir, 'run')).mode & 0o777, 0o700);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    const added = await call(s, env('ADD'));
    assert.ok('status' in added, JSON.stringify(added));
    await s.stop();
    assert.throws(() => statSync(path), /ENOENT/);
    assert.equal(s.state().phase, 'stopped');
  });

  it('never removes a file that is not a socket; waits for a live server to go away', async () => {
    mkdirSync(join(dir, 'run'));
    const path = join(dir, 'run', 'cni.sock');
    writeFileSync(path, 'precious');
    const s = await start();
    assert.equal(s.state().phase, 'failed');
    assert.match(s.state().reason ?? '', /not a socket/);
    rmSync(path);

    const live = createServer((c) => c.destroy());
    await new Promise<void>((r) => live.listen(path, r));
    const s2 = await start({ takeoverRetryMs: 100 });
    assert.equal(s2.state().phase, 'waiting');
    await new Promise<void>((r) => live.close(() => r()));
    await waitFor(() => s2.serving, { what: 'the server to take the socket over' });
    const deleted = await call(s2, env('DEL'));
    assert.ok('status' in deleted, JSON.stringify(deleted));
  });

  it('on stop lets a running request finish, within the grace', async () => {
    const plugin = fakePlugin(spans, { add: (req) => (req.containerId === 'hang' ? new Promise(() => {}) : Promise.resolve()) });
    const s = await start({ stopGraceMs: 1500 }, plugin);
    const running = call(s, { ...env('DEL', 'slow'), CNI_ARGS: 'MS=400' });
    const hung = rawCall(s.socketPath, requestFrame({ plugin: 'bridge', env: env('ADD', 'hang'), stdin: CONF }), { timeoutMs: 10_000 });
    await waitFor(() => s.state().inFlight === 2, { what: 'both requests to run' });
    const t0 = Date.now();
    await s.stop();
    const took = Date.now() - t0;
    assert.ok(took >= 1400 && took < 5000, `stop took ${took} ms`);
    const r = await running;
    assert.ok('status' in r && r.status === 0, JSON.stringify(r));
    const h = await hung;
    assert.ok('error' in h, JSON.stringify(h)); // cut off after the grace
  });

  it('on stop answers a waiting ADD serving:false and refuses new connections', async () => {
    const s = await start({ isReady: () => false, readyTimeoutMs: 20_000 });
    const waiting = call(s, env('ADD'));
    await waitFor(() => s.state().inFlight === 1, { what: 'the ADD to wait' });
    await s.stop();
    assert.deepEqual(await waiting, { v: 1, serving: false });
    assert.equal(await count('not_serving'), 1);
    const o = await rawCall(s.socketPath, Buffer.alloc(4), { timeoutMs: 5000 });
    assert.ok('error' in o && /ENOENT|ECONNREFUSED/.test(o.error), JSON.stringify(o));
  });

  it('serves a client of its own network namespace; one of another is answered serving:false', async () => {
    const s = await start();
    const own = readlinkSync('/proc/self/ns/net');
    const here = await cniCall(s.socketPath, { plugin: 'bridge', env: env('ADD'), stdin: CONF, netns: own });
    assert.ok('status' in here && here.status === 0, JSON.stringify(here));
    const elsewhere = await cniCall(s.socketPath, { plugin: 'bridge', env: env('ADD', 'c2'), stdin: CONF, netns: 'net:[1]' });
    assert.deepEqual(elsewhere, { v: 1, serving: false });
    assert.deepEqual(spans.map((x) => x.id), ['c1']);
    assert.equal(replyError(await cniCall(s.socketPath, { plugin: 'bridge', env: env('ADD'), stdin: CONF, netns: '/proc/1/ns/net' })).code, 6);
  });

  it('beyond maxConnections open at once, answers serving:false (the client runs the bundle)', async () => {
    const s = await start({ maxConnections: 2, isReady: () => false, readyTimeoutMs: 20_000 });
    const waiting = [call(s, env('ADD', 'w1')), call(s, env('ADD', 'w2'))];
    await waitFor(() => s.state().inFlight === 2, { what: 'two ADDs to wait' });
    assert.deepEqual(await call(s, env('ADD', 'w3')), { v: 1, serving: false });
    assert.equal(await count('not_serving'), 1);
    await s.stop();
    for (const w of await Promise.all(waiting)) assert.deepEqual(w, { v: 1, serving: false });
  });
});

describe('the CNI server in weft status', () => {
  it('is counted from weft_cni_requests_total and rendered as labelled lines', async () => {
    const metrics = new DaemonMetrics({ processMetrics: false });
    metrics.recordCniRequest('flannel', 'ADD', 'ok', 0.02);
    metrics.recordCniRequest('flannel', 'ADD', 'ok', 0.03);
    metrics.recordCniRequest('unknown', 'unknown', 'invalid', 0.001);
    const state = {
      socket: '/run/weft/cni.sock',
      phase: 'serving' as const,
      reason: null,
      inFlight: 1,
      abandoned: 0,
      lastErrors: [{ time: '2025-03-01T11:59:58.000Z', plugin: 'unknown', verb: 'unknown', containerId: '', code: 6, message: 'invalid request: not JSON\u001b[31m' }],
    };
    const c = await cniServerStatus(state, metrics);
    assert.equal(c.requests, 3);
    assert.equal(c.serving, true);
    assert.deepEqual(c.results, { ok: 2, error: 0, invalid: 1 });
    const base = await buildStatus(
      { weftVersion: '0.1.0', subnetFile: '/run/flannel/subnet.env', config: null, backendType: null, lease: null, peers: [], rejected: [], masquerade: false, forwardRules: false, rulesResync: 5, reconcileInterval: 10, activity: new DaemonActivity() },
      metrics,
      { now: new Date('2025-03-01T12:00:00Z') },
    );
    const text = renderStatus({ ...base, cniServer: c });
    assert.match(text, /^cni server {2}serving on \/run\/weft\/cni\.sock$/m);
    assert.match(text, /^cni reqs {4}3 \(ok 2, invalid 1\), 1 in flight$/m);
    assert.match(text, /^cni err {5}unknown unknown: code 6: invalid request: not JSON\\x1b\[31m \(2s ago\)$/m);
    const off = renderStatus({ ...base, cniServer: await cniServerStatus(null, new DaemonMetrics({ processMetrics: false })) });
    assert.match(off, /^cni server {2}off \(--cni-socket is empty; the plugins run on their own\)$/m);
  });
});
