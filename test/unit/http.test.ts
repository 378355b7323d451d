import assert from 'node:assert/strict';
import http from 'node:http';
import { PassThrough } from 'node:stream';
import { HealthServer, HealthServerError, isLoopbackClient } from '../../src/daemon/http.js';
import { DaemonMetrics } from '../../src/daemon/metrics.js';
import { createLogger, rateLimited, type LogFields, type Logger, type LogLevel } from '../../src/util/log.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

interface Recorded {
  level: LogLevel;
  msg: string;
  fields: LogFields | undefined;
}

/** A Logger that keeps entries in memory. */
function recordingLogger(out: Recorded[] = [], base: LogFields = {}): Logger {
  const at = (level: LogLevel) => (msg: string, fields?: LogFields) =>
    out.push({ level, msg, fields: Object.keys(base).length > 0 ? { ...base, ...fields } : fields });
  return {
    error: at('error'),
    warn: at('warn'),
    info: at('info'),
    debug: at('debug'),
    child: (fields) => recordingLogger(out, { ...base, ...fields }),
  };
}

interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

function request(port: number, path: string, method = 'GET', agent?: http.Agent): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method, agent: agent ?? false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** Collects what is written to a stream and waits (with a deadline) for complete lines. */
function capture(): { stream: PassThrough; lines: (n: number) => Promise<string[]> } {
  const stream = new PassThrough();
  let text = '';
  stream.on('data', (c: Buffer) => (text += c.toString('utf8')));
  return {
    stream,
    async lines(n: number): Promise<string[]> {
      const deadline = Date.now() + 2000;
      for (;;) {
        const got = text.split('\n').slice(0, -1);
        if (got.length >= n) return got;
        if (Date.now() > deadline) assert.fail(`expected ${n} log lines, got ${JSON.stringify(text)}`);
        await new Promise((r) => setImmediate(r));
      }
    },
  };
}

describe('HealthServer', () => {
  const servers: HealthServer[] = [];
  let ready = false;
  let metrics: DaemonMetrics;
  let port: number;

  function newServer(p: number, m: DaemonMetrics = metrics, extra: { shutdownTimeoutMs?: number } = {}): HealthServer {
    const s = new HealthServer({
      host: '127.0.0.1',
      port: p,
      isReady: () => ready,
      metrics: m,
      logger: recordingLogger(),
      ...extra,
    });
    servers.push(s);
    return s;
  }

  before(async () => {
    metrics = new DaemonMetrics();
    const addr = await newServer(0).start();
    assert.equal(addr.host, '127.0.0.1');
    assert.ok(addr.port > 0);
    port = addr.port;
  });

  after(async () => {
    await Promise.all(servers.map((s) => s.stop()));
  });

  it('GET /healthz answers 200 "weftd is running"', async () => {
    const r = await request(port, '/healthz');
    assert.equal(r.status, 200);
    assert.equal(r.body, 'weftd is running');
    assert.equal(r.headers['content-type'], 'text/plain; charset=utf-8');
    assert.equal(r.headers['content-length'], '16');
  });

  it('GET /readyz follows isReady()', async () => {
    ready = false;
    let r = await request(port, '/readyz');
    assert.equal(r.status, 503);
    assert.equal(r.body, 'weftd is not ready yet');
    ready = true;
    r = await request(port, '/readyz');
    assert.equal(r.status, 200);
    assert.equal(r.body, 'weftd is ready');
    ready = false;
    r = await request(port, '/readyz?verbose=1');
    assert.equal(r.status, 503);
    assert.equal(r.body, 'weftd is not ready yet');
  });

  it('HEAD gives the status and length without a body', async () => {
    const r = await request(port, '/healthz', 'HEAD');
    assert.equal(r.status, 200);
    assert.equal(r.body, '');
    assert.equal(r.headers['content-length'], '16');
  });

  it('unknown paths answer 404, other methods 405', async () => {
    let r = await request(port, '/');
    assert.equal(r.status, 404);
    assert.equal(r.body, '404 page not found\n');
    r = await request(port, '/healthz/extra');
    assert.equal(r.status, 404);
    r = await request(port, '/healthz', 'POST');
    assert.equal(r.status, 405);
    assert.equal(r.headers.allow, 'GET, HEAD');
    assert.equal(r.body, 'method not allowed\n');
    r = await request(port, '/metrics', 'DELETE');
    assert.equal(r.status, 405);
  });

  it('tells loopback clients from others (the peer list is for this host only)', () => {
    for (const a of ['127.0.0.1', '127.255.0.9', '::1', '::ffff:127.0.0.1', '::FFFF:127.1.2.3']) assert.equal(isLoopbackClient(a), true, a);
    for (const a of [undefined, '', '10.0.0.1', '128.0.0.1', '1127.0.0.1', '::ffff:10.0.0.1', 'fd00::1', '::', '0.0.0.0', '127.0.0.1.evil', '::2']) {
      assert.equal(isLoopbackClient(a), false, String(a));
    }
  });

  it('GET /status?peers=true from loopback answers with the peer list', async () => {
    const asked: boolean[] = [];
    const s = new HealthServer({
      host: '127.0.0.1',
      port: 0,
      isReady: () => true,
      metrics,
      logger: recordingLogger(),
      status: (opts) => {
        asked.push(opts.peers ?? false);
        return Promise.resolve({ kind: 'weft-status', peers: opts.peers ? [] : undefined } as never);
      },
    });
    servers.push(s);
    const { port: p } = await s.start();
    const r = await request(p, '/status?peers=true');
    assert.equal(r.status, 200, r.body);
    assert.deepEqual(JSON.parse(r.body), { kind: 'weft-status', peers: [] });
    assert.equal((await request(p, '/status')).status, 200);
    assert.deepEqual(asked, [true, false]);
  });

  it('GET /metrics exposes the daemon metrics with their current values', async () => {
    metrics.leaseExpiry.set(1795344000);
    metrics.peers.set(7);
    metrics.ready.set(1);
    metrics.eventsReceived.inc({ type: 'added' }, 3);
    metrics.storeErrors.inc({ op: 'renew' });
    metrics.leaseAcquisitions.inc({ how: 'previous' });
    metrics.batchesApplied.inc();
    metrics.programmingDuration.observe(0.003);
    const r = await request(port, '/metrics');
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8');
    const lines = r.body.split('\n');
    for (const want of [
      'weft_lease_expiration_timestamp_seconds 1795344000',
      'weft_peers 7',
      'weft_ready 1',
      'weft_lease_events_received_total{type="added"} 3',
      'weft_lease_events_received_total{type="removed"} 0',
      'weft_lease_events_applied_total{type="added"} 0',
      'weft_store_errors_total{op="renew"} 1',
      'weft_store_errors_total{op="watch"} 0',
      'weft_lease_acquisitions_total{how="previous"} 1',
      'weft_lease_acquisitions_total{how="new"} 0',
      'weft_lease_batches_applied_total 1',
      'weft_backend_programming_duration_seconds_bucket{le="0.0025"} 0',
      'weft_backend_programming_duration_seconds_bucket{le="0.005"} 1',
      'weft_backend_programming_duration_seconds_count 1',
      'weft_backend_reconcile_duration_seconds_count 0',
      '# TYPE weft_process_cpu_user_seconds_total counter',
    ]) {
      assert.ok(lines.includes(want), `missing line ${JSON.stringify(want)} in:\n${r.body}`);
    }
  });

  it('metrics of two daemons in one process stay apart', async () => {
    const other = new DaemonMetrics({ processMetrics: false });
    other.peers.set(42);
    const text = await other.text();
    assert.ok(text.split('\n').includes('weft_peers 42'));
    assert.ok(!text.includes('weft_process_'));
    assert.ok((await metrics.text()).split('\n').includes('weft_peers 7'));
  });

  it('a second server on the same port fails with HealthServerError naming host:port', async () => {
    const s = newServer(port);
    await assert.rejects(s.start(), (err: unknown) => {
      assert.ok(err instanceof HealthServerError);
      assert.equal(err.message, `cannot listen on 127.0.0.1:${port}: EADDRINUSE`);
      assert.equal(err.host, '127.0.0.1');
      assert.equal(err.port, port);
      assert.equal(err.code, 'EADDRINUSE');
      return true;
    });
    // The first server is unaffected.
    assert.equal((await request(port, '/healthz')).status, 200);
  });

  it('start() twice is refused', async () => {
    const s = newServer(0);
    await s.start();
    await assert.rejects(s.start(), HealthServerError);
    await s.stop();
  });

  it('stop() closes idle keep-alive connections at once and releases the port', async () => {
    const s = newServer(0, new DaemonMetrics({ processMetrics: false }));
    const { port: p } = await s.start();
    const agent = new http.Agent({ keepAlive: true, keepAliveMsecs: 60_000 });
    try {
      const r = await request(p, '/healthz', 'GET', agent);
      assert.equal(r.status, 200);
      const t0 = Date.now();
      await s.stop();
      // Well under the 3 s grace: the idle socket was destroyed rather than waited for.
      assert.ok(Date.now() - t0 < 1000, `stop took ${Date.now() - t0} ms`);
      await s.stop(); // idempotent
      await assert.rejects(request(p, '/healthz'), (err: NodeJS.ErrnoException) => err.code === 'ECONNREFUSED');
      // The same port can be bound again.
      const again = newServer(p, new DaemonMetrics({ processMetrics: false }));
      assert.deepEqual(await again.start(), { host: '127.0.0.1', port: p });
      assert.equal((await request(p, '/healthz')).body, 'weftd is running');
      await again.stop();
    } finally {
      agent.destroy();
    }
  });

  it('stop() cuts requests still running after the shutdown timeout', async () => {
    class HangingMetrics extends DaemonMetrics {
      override text(): Promise<string> {
        return new Promise(() => {});
      }
    }
    const s = newServer(0, new HangingMetrics({ processMetrics: false }), { shutdownTimeoutMs: 100 });
    const { port: p } = await s.start();
    const pending = request(p, '/metrics');
    // Wait until the server has the request in hand (it is then an active, not idle, connection).
    const deadline = Date.now() + 2000;
    for (;;) {
      const conns = await new Promise<number>((resolve) =>
        (s as unknown as { server: http.Server }).server.getConnections((_e, n) => resolve(n)),
      );
      if (conns > 0) break;
      assert.ok(Date.now() < deadline, 'request never reached the server');
      await new Promise((r) => setImmediate(r));
    }
    const t0 = Date.now();
    await s.stop();
    const took = Date.now() - t0;
    assert.ok(took >= 90 && took < 2000, `stop took ${took} ms`);
    await assert.rejects(pending, (err: NodeJS.ErrnoException) => err.code === 'ECONNRESET');
  });
});

describe('createLogger', () => {
  const clock = () => new Date('2026-11-22T10:00:00.123Z');

  it('text: one line per entry, padded level, key=value fields, quoting values with spaces', async () => {
    const c = capture();
    const log = createLogger({ stream: c.stream, clock });
    log.info('acquired lease', { subnet: IPNet.parse('10.5.3.0/24'), publicIP: IPAddr.parse('10.0.0.1') });
    log.warn('retrying', { err: new Error('connection refused'), attempt: 2, skip: undefined });
    log.error('odd values', { empty: '', quote: 'a"b', eq: 'k=v', big: 10n, ok: true, obj: { a: 1 }, nl: 'x\ny' });
    log.debug('not shown at info level');
    log.child({ component: 'vxlan' }).info('multi\nline msg', { vni: 1 });
    assert.deepEqual(await c.lines(4), [
      '2026-11-22T10:00:00.123Z info  acquired lease subnet=10.5.3.0/24 publicIP=10.0.0.1',
      '2026-11-22T10:00:00.123Z warn  retrying err="connection refused" attempt=2',
      '2026-11-22T10:00:00.123Z error odd values empty="" quote="a\\"b" eq="k=v" big=10 ok=true obj={"a":1} nl="x\\ny"',
      '2026-11-22T10:00:00.123Z info  multi\\nline msg component=vxlan vni=1',
    ]);
  });

  it('text: uses the real time by default', async () => {
    const c = capture();
    createLogger({ stream: c.stream }).info('hello', { a: 1 });
    const [line] = await c.lines(1);
    assert.match(line ?? '', /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z info {2}hello a=1$/);
  });

  it('json: one object per line with time, level, msg and the fields', async () => {
    const c = capture();
    const log = createLogger({ format: 'json', level: 'debug', stream: c.stream });
    log.debug('acquired lease', { subnet: IPNet.parse('10.5.3.0/24'), ttl: 86400, err: new Error('boom') });
    log.child({ node: 'n1' }).warn('clash', { msg: 'field', level: 3, big: 5n });
    const lines = await c.lines(2);
    assert.equal(lines.length, 2);
    const [a, b] = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.match(String(a?.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.deepEqual(Object.keys(a ?? {}), ['time', 'level', 'msg', 'subnet', 'ttl', 'err']);
    assert.deepEqual({ ...a, time: 'T' }, {
      time: 'T',
      level: 'debug',
      msg: 'acquired lease',
      subnet: '10.5.3.0/24',
      ttl: 86400,
      err: 'boom',
    });
    assert.deepEqual({ ...b, time: 'T' }, {
      time: 'T',
      level: 'warn',
      msg: 'clash',
      node: 'n1',
      'field.msg': 'field',
      'field.level': 3,
      big: '5',
    });
  });

  it('level filters lower-priority entries', async () => {
    const c = capture();
    const log = createLogger({ level: 'warn', stream: c.stream, clock });
    log.info('dropped');
    log.debug('dropped');
    log.warn('kept');
    log.error('kept too');
    assert.deepEqual(await c.lines(2), [
      '2026-11-22T10:00:00.123Z warn  kept',
      '2026-11-22T10:00:00.123Z error kept too',
    ]);
  });
});

describe('rateLimited', () => {
  it('emits once per interval per key and reports what it suppressed', () => {
    const out: Recorded[] = [];
    let t = 1_000_000;
    const say = rateLimited(recordingLogger(out), 10_000, () => t);
    say('config', 'warn', 'config not found, retrying', { key: '/coreos.com/network/config' });
    t += 1000;
    say('config', 'warn', 'config not found, retrying', { key: '/coreos.com/network/config' });
    say('config', 'warn', 'config not found, retrying', { key: '/coreos.com/network/config' });
    say('lease', 'info', 'lease renewal failed');
    t += 8999; // 9999 ms after the first: still inside the interval
    say('config', 'warn', 'config not found, retrying', { key: '/coreos.com/network/config' });
    t += 1; // exactly one interval later
    say('config', 'warn', 'config not found, retrying', { key: '/coreos.com/network/config' });
    t += 10_000;
    say('config', 'error', 'config not found, retrying');
    assert.deepEqual(out, [
      { level: 'warn', msg: 'config not found, retrying', fields: { key: '/coreos.com/network/config' } },
      { level: 'info', msg: 'lease renewal failed', fields: undefined },
      {
        level: 'warn',
        msg: 'config not found, retrying',
        fields: { key: '/coreos.com/network/config', suppressed: 3 },
      },
      { level: 'error', msg: 'config not found, retrying', fields: undefined },
    ]);
  });
});
