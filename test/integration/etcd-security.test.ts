// The etcd subnet manager and bin/weftd against a real etcd secured two ways: TLS with client
// certificates, and v3 username/password auth. Right credentials work; wrong ones fail promptly
// with an error that says which endpoint and why.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Etcd3, type IOptions } from 'etcd3';
import { EtcdSubnetManager, type EtcdManagerOptions } from '../../src/subnet/etcd/manager.js';
import { StoreUnavailableError } from '../../src/subnet/manager.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { createLogger } from '../../src/util/log.js';
import { LeaseWatcher } from '../../src/subnet/watcher.js';
import { makeTestPki, type TestPki } from '../helpers/certs.js';
import { EtcdctlError, EtcdServer, freePort } from '../helpers/etcd.js';
import { waitFor } from '../helpers/wait.js';
import { WeftdProcess } from '../helpers/weftd.js';
import { httpGet } from '../helpers/http.js';

const execFileP = promisify(execFile);
const NETWORK = IPNet.parse('10.7.0.0/16');
const CONFIG = '{"Network":"10.7.0.0/16","Backend":{"Type":"alloc"}}';
const LO_MTU = Number(readFileSync('/sys/class/net/lo/mtu', 'utf8'));
/** How long a call with bad credentials may take to fail before we call it a hang. */
const FAIL_WITHIN_MS = 15_000;

class HangError extends Error {
  constructor(what: string, ms: number) {
    super(`${what} neither resolved nor rejected within ${ms / 1000} s`);
    this.name = 'HangError';
  }
}

/** The rejection of `p`, or a HangError if it takes longer than `withinMs`; a resolution is a test failure. */
async function rejectionOf(what: string, p: Promise<unknown>, withinMs = FAIL_WITHIN_MS): Promise<Error> {
  let timer: NodeJS.Timeout | undefined;
  const hang = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new HangError(what, withinMs)), withinMs)));
  try {
    await Promise.race([p, hang]);
  } catch (e) {
    if (e instanceof HangError) throw e;
    assert.ok(e instanceof Error, `${what} rejected with a non-Error: ${String(e)}`);
    return e;
  } finally {
    clearTimeout(timer);
  }
  assert.fail(`${what} succeeded but should have failed`);
}

/**
 * etcd3 keeps re-establishing the stream of a watcher that was neither created nor cancelled, even
 * after close(): a timer loop that keeps the process alive. A watch creation that hangs (the
 * auth-token test below) leaves such a watcher behind; drop it so that a failing run still exits.
 */
/** A daemon's lease: exactly one key for its public IP, flannel's alloc value, and a matching subnet.env. */
async function assertDaemonLease(client: Etcd3, prefix: string, publicIP: string, subnetFile: string): Promise<void> {
  const stored = await client.getAll().prefix(`${prefix}/subnets/`).strings();
  const mine = Object.entries(stored).filter(([, v]) => (JSON.parse(v) as { PublicIP: string }).PublicIP === publicIP);
  assert.equal(mine.length, 1, JSON.stringify(stored));
  const [key, value] = mine[0]!;
  assert.equal(value, `{"PublicIP":"${publicIP}","PublicIPv6":null}`);
  const subnet = IPNet.parse(key.slice(key.lastIndexOf('/') + 1).replace('-', '/'));
  assert.ok(NETWORK.containsNet(subnet));
  assert.equal(
    readFileSync(subnetFile, 'utf8'),
    `FLANNEL_NETWORK=10.7.0.0/16\nFLANNEL_SUBNET=${subnet.nth(1n)}/24\nFLANNEL_MTU=${LO_MTU}\nFLANNEL_IPMASQ=false\n`,
  );
}

/** Managers made by a suite, closed in its after hook. */
function managerFactory(endpoint: () => string, prefix: string) {
  const made: EtcdSubnetManager[] = [];
  const make = (opts: Partial<EtcdManagerOptions>): EtcdSubnetManager => {
    const m = EtcdSubnetManager.connect({
      endpoints: [endpoint()],
      prefix,
      knownBackends: ['alloc'],
      logger: createLogger({ level: 'error' }),
      ...opts,
    });
    made.push(m);
    return m;
  };
  const closeAll = async () => {
    await Promise.all(made.map((m) => m.close()));
  };
  return { make, closeAll };
}

/** Acquires a lease and checks it is a /24 of NETWORK stored under the flannel key with our value. */
async function acquireAndCheck(m: EtcdSubnetManager, client: Etcd3, prefix: string, publicIP: string): Promise<IPNet> {
  assert.equal((await m.getNetworkConfig()).network?.toString(), '10.7.0.0/16');
  const { lease } = await m.acquireLease({ publicIP: IPAddr.parse(publicIP), publicIPv6: null });
  const subnet = lease.subnet;
  assert.ok(subnet && NETWORK.containsNet(subnet), `${String(subnet)} inside ${NETWORK}`);
  assert.equal(subnet.prefix, 24);
  assert.equal(lease.attrs.publicIP.toString(), publicIP);
  const key = `${prefix}/subnets/${subnet.toString().replace('/', '-')}`;
  const kv = (await client.get(key).exec()).kvs[0];
  assert.ok(kv, `${key} present`);
  assert.equal(kv.value.toString(), `{"PublicIP":"${publicIP}","PublicIPv6":null}`);
  // Bound to a 24 h etcd lease, as flannel does.
  assert.equal(Number((await client.leaseClient.leaseTimeToLive({ ID: kv.lease })).grantedTTL), 86400);
  return subnet;
}

describe('etcd over TLS with client certificates', function () {
  this.timeout(120_000);
  const prefix = '/tls/coreos.com/network';
  let pki: TestPki;
  let etcd: EtcdServer;
  let client: Etcd3;
  let dir: string;
  const managers = managerFactory(() => etcd.endpoint, prefix);
  const procs: WeftdProcess[] = [];

  before(async () => {
    pki = await makeTestPki();
    dir = mkdtempSync(join(tmpdir(), 'weft-etcd-tls-'));
    etcd = await EtcdServer.start({
      tls: {
        certFile: pki.serverCertFile,
        keyFile: pki.serverKeyFile,
        trustedCaFile: pki.caFile,
        clientCertAuth: true,
        clientCertFile: pki.clientCertFile,
        clientKeyFile: pki.clientKeyFile,
      },
    });
    // Written with a client configured exactly as registry.ts configures one.
    client = new Etcd3({
      hosts: etcd.endpoint,
      credentials: {
        rootCertificate: readFileSync(pki.caFile),
        certChain: readFileSync(pki.clientCertFile),
        privateKey: readFileSync(pki.clientKeyFile),
      },
    });
    await client.put(`${prefix}/config`).value(CONFIG);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await managers.closeAll();
    client?.close();
    await etcd?.destroy();
    pki?.cleanup();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('serves https and refuses etcdctl without a client certificate', async () => {
    assert.equal(etcd.endpoint, `https://127.0.0.1:${etcd.clientPort}`);
    assert.equal((await etcd.etcdctl(['get', `${prefix}/config`, '--print-value-only'])).trim(), CONFIG);
    // The same etcdctl call without a client cert is refused: the server really checks certificates.
    await assert.rejects(
      execFileP(
        'etcdctl',
        ['--endpoints', etcd.endpoint, '--cacert', pki.caFile, '--dial-timeout', '3s', '--command-timeout', '5s', 'get', `${prefix}/config`],
        { env: { ...process.env, ETCDCTL_API: '3' } },
      ),
      (e: Error & { code?: number; stderr?: string }) => {
        assert.equal(e.code, 1);
        assert.match(e.stderr ?? '', /context deadline exceeded|bad certificate|certificate required/);
        return true;
      },
    );
  });

  it('acquires a lease with the CA, client cert and key', async () => {
    const m = managers.make({ caFile: pki.caFile, certFile: pki.clientCertFile, keyFile: pki.clientKeyFile });
    await acquireAndCheck(m, client, prefix, '10.0.0.1');
  });

  it('fails promptly, naming the endpoint, when the server is not signed by the given CA', async () => {
    // A client cert the server would accept, but our trust root does not know the server.
    const m = managers.make({ caFile: pki.otherCaFile, certFile: pki.clientCertFile, keyFile: pki.clientKeyFile });
    const err = await rejectionOf('getNetworkConfig with the wrong CA', m.getNetworkConfig());
    assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
    assert.ok(err.message.startsWith(`etcd get config (${etcd.endpoint}): 14 UNAVAILABLE: `), err.message);
    assert.match(err.message, /unable to verify the first certificate/);
  });

  it('fails promptly, naming the endpoint, without a client certificate', async () => {
    const m = managers.make({ caFile: pki.caFile });
    const err = await rejectionOf('getNetworkConfig without a client cert', m.getNetworkConfig());
    assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
    assert.ok(err.message.startsWith(`etcd get config (${etcd.endpoint}): 14 UNAVAILABLE: `), err.message);
    // The server's TLS alert 42 (bad_certificate): it wanted a client certificate.
    assert.match(err.message, /alert bad certificate/);
  });

  it('fails promptly with a client certificate from a CA the server does not trust', async () => {
    const m = managers.make({ caFile: pki.caFile, certFile: pki.otherClientCertFile, keyFile: pki.otherClientKeyFile });
    const err = await rejectionOf('getNetworkConfig with an untrusted client cert', m.getNetworkConfig());
    assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
    assert.ok(err.message.startsWith(`etcd get config (${etcd.endpoint}): 14 UNAVAILABLE: `), err.message);
    assert.match(err.message, /alert bad certificate/);
  });

  // flannel (etcd's transport.TLSInfo) refuses this with "KeyFile and CertFile must both be present";
  // quietly connecting without the client certificate the operator asked for hides the mistake.
  it('rejects a client certificate without its key as a configuration error, before connecting', async () => {
    const err = await rejectionOf(
      'a manager with certFile but no keyFile',
      (async () => {
        const m = managers.make({ caFile: pki.caFile, certFile: pki.clientCertFile });
        await m.getNetworkConfig();
      })(),
    );
    assert.ok(!(err instanceof StoreUnavailableError), `a config error, not a connection failure: ${err.message}`);
    assert.match(err.message, /cert/i);
    assert.match(err.message, /key/i);
  });

  // Something listening that never completes the TLS handshake (an overloaded or wedged etcd, a
  // wrong port behind a firewall that accepts): the call must give up with a timeout, not wait forever.
  it('fails promptly, naming the endpoint, when the endpoint never completes the TLS handshake', async () => {
    const held: Socket[] = [];
    const mute = createServer((sock) => held.push(sock));
    await new Promise<void>((resolve) => mute.listen(0, '127.0.0.1', resolve));
    const addr = mute.address();
    const endpoint = `https://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
    try {
      const m = managers.make({
        endpoints: [endpoint],
        caFile: pki.caFile,
        certFile: pki.clientCertFile,
        keyFile: pki.clientKeyFile,
      });
      // Generous: gRPC-Go (flannel) gives up a handshake after 20 s; what matters is that it ends.
      const err = await rejectionOf('getNetworkConfig against a silent endpoint', m.getNetworkConfig(), 30_000);
      assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
      assert.ok(err.message.startsWith(`etcd get config (${endpoint}): `), err.message);
      assert.ok(held.length >= 1, 'the client did connect');
    } finally {
      for (const sock of held) sock.destroy();
      await new Promise<void>((resolve) => mute.close(() => resolve()));
    }
  });

  it('runs bin/weftd with --etcd-cafile/--etcd-certfile/--etcd-keyfile to ready, writing subnet.env', async () => {
    const port = await freePort();
    const subnetFile = join(dir, 'node1', 'subnet.env');
    const p = WeftdProcess.start([
      '--etcd-endpoints', etcd.endpoint, '--etcd-prefix', prefix,
      '--etcd-cafile', pki.caFile, '--etcd-certfile', pki.clientCertFile, '--etcd-keyfile', pki.clientKeyFile,
      '--iface', 'lo', '--public-ip', '10.0.0.2', '--subnet-file', subnetFile,
      '--healthz-ip', '127.0.0.1', '--healthz-port', String(port),
    ]);
    procs.push(p);
    await waitFor(async () => (await httpGet(port, '/readyz'))?.status === 200, { timeoutMs: 60_000, what: `weftd ready: ${p.output}` });
    await assertDaemonLease(client, prefix, '10.0.0.2', subnetFile);
    assert.equal((await p.stop()).code, 0, p.output);
  });

  it('keeps bin/weftd unready, saying which endpoint fails, when it does not trust the server', async () => {
    const port = await freePort();
    const subnetFile = join(dir, 'node2', 'subnet.env');
    const p = WeftdProcess.start([
      '--etcd-endpoints', etcd.endpoint, '--etcd-prefix', prefix,
      '--etcd-cafile', pki.otherCaFile, '--etcd-certfile', pki.clientCertFile, '--etcd-keyfile', pki.clientKeyFile,
      '--iface', 'lo', '--public-ip', '10.0.0.3', '--subnet-file', subnetFile,
      '--healthz-ip', '127.0.0.1', '--healthz-port', String(port),
    ]);
    procs.push(p);
    const endpointRe = etcd.endpoint.replace(/[.:/]/g, (c) => `\\${c}`);
    await waitFor(() => new RegExp(`waiting for the network config.*${endpointRe}`).test(p.output), {
      timeoutMs: 30_000,
      what: `the failing-endpoint message: ${p.output}`,
    });
    assert.equal((await httpGet(port, '/readyz'))?.status, 503);
    assert.equal(existsSync(subnetFile), false);
    assert.equal((await p.stop()).code, 0, p.output);
  });
});

describe('etcd with username/password auth', function () {
  this.timeout(120_000);
  const prefix = '/auth/coreos.com/network';
  let etcd: EtcdServer;
  let root: Etcd3;
  let dir: string;
  const managers = managerFactory(() => etcd.endpoint, prefix);
  const procs: WeftdProcess[] = [];
  function weftd(args: string[]): WeftdProcess {
    const p = WeftdProcess.start(['--etcd-endpoints', etcd.endpoint, '--etcd-prefix', prefix, '--iface', 'lo', '--healthz-ip', '127.0.0.1', ...args]);
    procs.push(p);
    return p;
  }
  const clientWith = (auth?: IOptions['auth']): Etcd3 => new Etcd3({ hosts: etcd.endpoint, ...(auth ? { auth } : {}) });

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'weft-etcd-auth-'));
    etcd = await EtcdServer.start();
    await etcd.etcdctl(['user', 'add', 'root:rootpw', '--interactive=false']);
    await etcd.etcdctl(['user', 'grant-role', 'root', 'root']);
    // A least-privilege user, as a real deployment would give weftd: read/write under the prefix only.
    await etcd.etcdctl(['user', 'add', 'weft:weftpw', '--interactive=false']);
    await etcd.etcdctl(['role', 'add', 'weft']);
    await etcd.etcdctl(['role', 'grant-permission', 'weft', '--prefix=true', 'readwrite', `${prefix}/`]);
    await etcd.etcdctl(['user', 'grant-role', 'weft', 'weft']);
    await etcd.etcdctl(['user', 'add', 'nobody:nobodypw', '--interactive=false']);
    await etcd.etcdctl(['auth', 'enable']);
    root = clientWith({ username: 'root', password: 'rootpw' });
    await root.put(`${prefix}/config`).value(CONFIG);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await managers.closeAll();
    root?.close();
    await etcd?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('has auth really enabled: etcdctl without credentials is refused', async () => {
    await assert.rejects(etcd.etcdctl(['get', `${prefix}/config`]), (e: EtcdctlError) => {
      assert.ok(e instanceof EtcdctlError);
      assert.equal(e.code, 1);
      assert.match(e.stderr, /user name is empty/);
      return true;
    });
    assert.equal(
      (await etcd.etcdctl(['--user', 'root:rootpw', 'get', `${prefix}/config`, '--print-value-only'])).trim(),
      CONFIG,
    );
  });

  it('acquires a lease as root', async () => {
    const m = managers.make({ username: 'root', password: 'rootpw' });
    await acquireAndCheck(m, root, prefix, '10.0.1.1');
  });

  it('acquires a lease as a user whose role allows only the prefix', async () => {
    const m = managers.make({ username: 'weft', password: 'weftpw' });
    await acquireAndCheck(m, root, prefix, '10.0.1.2');
  });

  it('fails promptly with a wrong password, saying authentication failed at the endpoint', async () => {
    const m = managers.make({ username: 'root', password: 'wrong' });
    const err = await rejectionOf('getNetworkConfig with a wrong password', m.getNetworkConfig());
    assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
    assert.equal(err.message, `etcd get config (${etcd.endpoint}): 3 INVALID_ARGUMENT: etcdserver: authentication failed, invalid user ID or password`);
  });

  it('fails promptly without credentials, saying a user name is needed', async () => {
    const m = managers.make({});
    const err = await rejectionOf('getNetworkConfig without credentials', m.getNetworkConfig());
    assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
    assert.equal(err.message, `etcd get config (${etcd.endpoint}): 3 INVALID_ARGUMENT: etcdserver: user name is empty`);
  });

  it('fails with permission denied for a user without a role on the prefix, writing nothing', async () => {
    const m = managers.make({ username: 'nobody', password: 'nobodypw' });
    const err = await rejectionOf('getNetworkConfig as a user without permissions', m.getNetworkConfig());
    assert.ok(err instanceof StoreUnavailableError, `${err.name}: ${err.message}`);
    assert.equal(err.message, `etcd get config (${etcd.endpoint}): 7 PERMISSION_DENIED: etcdserver: permission denied`);
    const before = Object.keys(await root.getAll().prefix(`${prefix}/subnets/`).strings()).sort();
    const err2 = await rejectionOf(
      'acquireLease as a user without permissions',
      m.acquireLease({ publicIP: IPAddr.parse('10.0.1.9'), publicIPv6: null }),
    );
    assert.match(err2.message, /etcdserver: permission denied/);
    assert.deepEqual(Object.keys(await root.getAll().prefix(`${prefix}/subnets/`).strings()).sort(), before);
  });

  it('runs bin/weftd with --etcd-username/--etcd-password to ready, writing subnet.env', async () => {
    const port = await freePort();
    const subnetFile = join(dir, 'auth1', 'subnet.env');
    const p = weftd(['--etcd-username', 'weft', '--etcd-password', 'weftpw', '--public-ip', '10.0.1.4', '--subnet-file', subnetFile, '--healthz-port', String(port)]);
    await waitFor(async () => (await httpGet(port, '/readyz'))?.status === 200, { timeoutMs: 60_000, what: `weftd ready: ${p.output}` });
    await assertDaemonLease(root, prefix, '10.0.1.4', subnetFile);
    assert.equal((await p.stop()).code, 0, p.output);
  });

  it('keeps bin/weftd unready with a wrong password, logging the authentication failure', async () => {
    const port = await freePort();
    const subnetFile = join(dir, 'auth2', 'subnet.env');
    const p = weftd(['--etcd-username', 'weft', '--etcd-password', 'nope', '--public-ip', '10.0.1.5', '--subnet-file', subnetFile, '--healthz-port', String(port)]);
    await waitFor(() => /waiting for the network config.*authentication failed, invalid user ID or password/.test(p.output), {
      timeoutMs: 30_000,
      what: `the authentication failure in the log: ${p.output}`,
    });
    assert.ok(p.output.includes(`etcd get config (${etcd.endpoint})`), p.output);
    assert.equal((await httpGet(port, '/readyz'))?.status, 503);
    assert.equal(existsSync(subnetFile), false);
    assert.equal((await p.stop()).code, 0, p.output);
  });

  // etcd keeps simple auth tokens in memory: after a restart every token is invalid. A long-running
  // daemon meets the same when its token expires (--auth-token-ttl, 5 min idle by default) or when
  // it reconnects to another member of a cluster.
  it('renews its lease after an etcd restart invalidates its auth token', async () => {
    const m = managers.make({ username: 'weft', password: 'weftpw' });
    const { lease } = await m.acquireLease({ publicIP: IPAddr.parse('10.0.1.6'), publicIPv6: null });
    await etcd.restart();
    // Transient errors while the connection comes back are fine; a stale token must not stick.
    const renewed = await waitFor(() => m.renewLease(lease), { timeoutMs: 30_000, what: 'a renewal after the restart' });
    assert.equal(String(renewed.subnet), String(lease.subnet));
    assert.ok(renewed.expiration && renewed.expiration.getTime() > Date.now() + 86_000_000, 'renewed for 24 h');
    const key = `${prefix}/subnets/${String(lease.subnet).replace('/', '-')}`;
    assert.equal(await root.get(key).string(), '{"PublicIP":"10.0.1.6","PublicIPv6":null}');
  });

  it('keeps watching leases after an etcd restart invalidates its auth token', async () => {
    const m = managers.make({ username: 'weft', password: 'weftpw' });
    const { lease } = await m.acquireLease({ publicIP: IPAddr.parse('10.0.1.7'), publicIPv6: null });
    const ctl = new AbortController();
    const watcher = new LeaseWatcher(() => lease);
    const seen: string[] = [];
    let snapshots = 0;
    const done = (async () => {
      for await (const r of m.watchLeases(ctl.signal)) {
        if (r.kind === 'snapshot') snapshots++;
        for (const ev of watcher.apply(r)) seen.push(`${ev.type} ${ev.lease.subnet} ${ev.lease.attrs.publicIP}`);
      }
    })();
    try {
      await waitFor(() => snapshots > 0, { what: 'the initial snapshot' });
      await etcd.restart();
      // A peer appearing after the restart must reach us through a re-established, re-authenticated watch.
      await root.put(`${prefix}/subnets/10.7.250.0-24`).value('{"PublicIP":"10.0.1.250","PublicIPv6":null}');
      await waitFor(() => seen.includes('added 10.7.250.0/24 10.0.1.250'), {
        timeoutMs: 30_000,
        what: `the peer added after the restart (seen: ${seen.join('; ')})`,
      });
    } finally {
      ctl.abort();
      await done;
    }
  });
});
