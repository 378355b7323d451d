// weftd's health server bound to every address, asked from a loopback and from a non-loopback
// address of the private network namespace (test/netns/setup.ts): the peer list of /status is
// served to loopback clients only; /healthz, /metrics and /status without peers to anyone who
// reaches the address it listens on.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import http from 'node:http';
import { promisify } from 'node:util';

import { HealthServer } from '../../src/daemon/http.js';
import { DaemonMetrics } from '../../src/daemon/metrics.js';
import type { StatusSnapshot } from '../../src/daemon/status.js';
import { createLogger } from '../../src/util/log.js';
import { assertPrivateNetns } from './setup.js';

const run = promisify(execFile);
const LINK = 'weftpeers0';
const V4 = '10.77.0.1';
const V6 = 'fd77::1';

interface Reply {
  readonly status: number;
  readonly body: string;
}

/** A GET from `localAddress` to `host`: the server sees `localAddress` as the client. */
function get(host: string, localAddress: string, port: number, path: string): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host, localAddress, port, path, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

describe('health server: the peer list only for loopback clients (private netns)', () => {
  let server: HealthServer;
  let port = 0;
  const asked: boolean[] = [];

  before(async () => {
    assertPrivateNetns();
    // A veth pair (the dummy module may be missing): the addresses only need to be local.
    await run('ip', ['link', 'add', LINK, 'type', 'veth', 'peer', 'name', `${LINK}p`]);
    await run('ip', ['link', 'set', `${LINK}p`, 'up']);
    await run('ip', ['link', 'set', LINK, 'up']);
    await run('ip', ['addr', 'add', `${V4}/24`, 'dev', LINK]);
    await run('ip', ['addr', 'add', `${V6}/64`, 'dev', LINK, 'nodad']);
    server = new HealthServer({
      host: '::', // every address of both families, as --healthz-ip 0.0.0.0 or :: would
      port: 0,
      isReady: () => true,
      metrics: new DaemonMetrics(),
      logger: createLogger({ level: 'error' }),
      status: (opts) => {
        asked.push(opts.peers ?? false);
        return Promise.resolve({ kind: 'weft-status', ...(opts.peers ? { peers: [{ subnet: '10.244.9.0/24' }] } : {}) } as unknown as StatusSnapshot);
      },
    });
    port = (await server.start()).port;
  });

  after(async () => {
    await server?.stop();
    await run('ip', ['link', 'del', LINK]).catch(() => undefined);
  });

  it('serves the peer list to 127.0.0.1 and ::1', async () => {
    for (const [host, local] of [['127.0.0.1', '127.0.0.1'], ['::1', '::1'], ['127.0.0.1', '127.0.0.9']] as const) {
      const r = await get(host, local, port, '/status?peers=true');
      assert.equal(r.status, 200, `${local}: ${r.body}`);
      assert.deepEqual((JSON.parse(r.body) as { peers: unknown }).peers, [{ subnet: '10.244.9.0/24' }]);
    }
  });

  it('refuses it to a non-loopback client with 403, without asking the daemon', async () => {
    const before = asked.length;
    for (const [host, local] of [[V4, V4], [V6, V6]] as const) {
      const r = await get(host, local, port, '/status?peers=true');
      assert.equal(r.status, 403, `${local}: ${r.body}`);
      assert.equal(r.body, 'the peer list (/status?peers=true) is served to clients on this host (loopback) only\n');
      assert.equal((await get(host, local, port, '/status?peers=1')).status, 403);
    }
    assert.equal(asked.length, before, 'the daemon was asked for peers on behalf of a remote client');
  });

  it('still answers /healthz, /metrics and /status without peers to a non-loopback client', async () => {
    assert.equal((await get(V4, V4, port, '/healthz')).status, 200);
    assert.equal((await get(V4, V4, port, '/metrics')).status, 200);
    const r = await get(V4, V4, port, '/status');
    assert.equal(r.status, 200);
    assert.equal((JSON.parse(r.body) as { peers?: unknown }).peers, undefined);
    assert.equal((await get(V4, V4, port, '/status?peers=false')).status, 200);
  });
});
