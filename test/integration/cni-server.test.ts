// weftd's CNI server end to end: weftd in a host namespace of a one-host cluster (real etcd), and
// requests sent over its unix socket by a small client written here (test/helpers/cni-client.ts;
// the native client has tests of its own). The plugins run inside weftd, in the host namespace:
// flannel → bridge → host-local delegation in-process, pods in namespaces created here.
//  - ADD before weftd is ready waits (code 11 after 30 s when it stays unready), then succeeds;
//  - ADD/DEL through the chain; 50 concurrent ADDs → 50 distinct IPs, 50 DELs → the store empty;
//  - garbage and oversized frames get a CNI error and the server goes on;
//  - socket 0600 in a 0700 directory, a non-root caller refused;
//  - `weft status`, the metrics and the debug log show the server.
import assert from 'node:assert/strict';
import { chmodSync, linkSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';

import type { StatusSnapshot } from '../../src/daemon/status.js';
import { cniBinDir, flannelNetConf } from '../helpers/cni.js';
import { cniCall, hostLocalReservations, rawCall, replyError } from '../helpers/cni-client.js';
import { Cluster, type Host } from '../helpers/cluster.js';
import { addNetns, delNetns, ipn, nsPrefix, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';
import { runWeft } from '../helpers/weft-cli.js';

const NETWORK = 'wtcs';
const CONFIG = { Network: '10.42.0.0/16', Backend: { Type: 'vxlan' } };

describe('weftd CNI server (integration, namespaces)', function () {
  this.timeout(240_000);
  let c: Cluster;
  let h: Host;
  let tmp = '';
  let binDir = '';
  let started: Promise<void> | null = null;
  // Not the cluster's prefix ('cs'): its pod namespace is `<prefix>-p1`, and pod(1) would delete it.
  const prefix = nsPrefix('csp');
  const pods: string[] = [];

  async function pod(i: number): Promise<string> {
    // A test process killed earlier with the same pid may have left one of that name.
    await delNetns(`${prefix}-p${i}`);
    const name = await addNetns(`${prefix}-p${i}`);
    pods.push(name);
    return name;
  }

  const conf = () => flannelNetConf(NETWORK, h.subnetFile, tmp, { delegate: { isDefaultGateway: true } });

  function env(command: string, containerId: string, netns?: string): Record<string, string> {
    return {
      CNI_COMMAND: command,
      CNI_CONTAINERID: containerId,
      CNI_IFNAME: 'eth0',
      CNI_PATH: binDir,
      ...(netns ? { CNI_NETNS: `/run/netns/${netns}` } : {}),
    };
  }

  const flannel = (command: string, containerId: string, netns?: string, timeoutMs?: number) =>
    cniCall(h.cniSocket, { plugin: 'flannel', env: env(command, containerId, netns), stdin: conf() }, timeoutMs);

  const reservations = (): string[] => hostLocalReservations(join(tmp, 'ipam'), NETWORK);


  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'wt-cni-server-'));
    const dir = tmp;
    process.once('exit', () => rmSync(dir, { recursive: true, force: true })); // also when killed (cleanupOnSignals)
    binDir = await cniBinDir();
    c = await Cluster.create({ hosts: 1, tag: 'cs', config: CONFIG, weftdArgs: ['--log-level', 'debug'] });
    h = c.hosts[0]!;
    // No network config yet: weftd serves CNI requests but cannot take a lease (not ready).
    await c.etcdctl('del', '/coreos.com/network/config');
    // Its wait for subnet.env must outlast the first test's 30 s of "not ready".
    started = h.startWeftd([], {}, { timeoutMs: 180_000 });
    started.catch(() => undefined); // awaited in the readiness test
    await waitFor(() => statSync(h.cniSocket, { throwIfNoEntry: false })?.isSocket(), { timeoutMs: 60_000, what: 'the CNI server socket' });
  });

  after(async () => {
    // Each step runs whatever the others did (a weftd that does not stop makes destroy throw).
    try {
      await Promise.all(pods.map((p) => delNetns(p)));
      await c?.destroy();
    } finally {
      if (tmp) rmSync(tmp, { recursive: true, force: true });
    }
  });

  it('ADD before weftd is ready: code 11 after the 30 s bound; then waits, and succeeds once weftd has its lease', async () => {
    const p = await pod(0);
    const t0 = Date.now();
    const early = await flannel('ADD', 'early', p);
    const waited = Date.now() - t0;
    assert.equal(replyError(early).code, 11, JSON.stringify(early));
    assert.match(replyError(early).msg, /not ready/);
    assert.ok(waited >= 29_000 && waited < 45_000, `answered after ${waited} ms`);
    // DEL does not wait for readiness.
    const del = await flannel('DEL', 'early', p);
    assert.ok('status' in del && del.status === 0, JSON.stringify(del));

    const pending = flannel('ADD', 'ready-1', p);
    let answered = false;
    pending.then(
      () => (answered = true),
      () => (answered = true),
    );
    let add: Awaited<typeof pending> | Error = new Error('the ADD was not answered');
    try {
      await waitFor(async () => (await h.cniServerStatus()).inFlight === 1, { timeoutMs: 20_000, what: 'the ADD to wait in weftd' });
      assert.equal((await h.cniServerStatus()).phase, 'serving');
      assert.equal(answered, false, 'answered before the config was written');
    } finally {
      // Whatever happens, weftd gets its config and the waiting ADD is answered before the test
      // ends (cniCall's own bound, 90 s): no request of this test is left in flight for the next.
      await c.writeConfig(CONFIG);
      add = await pending.catch((e: unknown) => (e instanceof Error ? e : new Error(String(e))));
    }
    if (add instanceof Error) throw add;
    assert.ok('status' in add && add.status === 0, JSON.stringify(add));
    await started;
    const subnet = h.subnetEnv().FLANNEL_SUBNET!;
    const ip = (JSON.parse(add.stdout) as { ips: Array<{ address: string }> }).ips[0]!.address;
    assert.equal(ip.split('.').slice(0, 3).join('.'), subnet.split('.').slice(0, 3).join('.'));
    const podAddrs = await ipn(p, '-4', '-o', 'addr', 'show', 'dev', 'eth0');
    assert.ok(podAddrs.includes(ip), `pod addresses: ${podAddrs}`);
    const gone = await flannel('DEL', 'ready-1', p);
    assert.ok('status' in gone && gone.status === 0, JSON.stringify(gone));
    assert.deepEqual(reservations(), []);
  });

  it('ADD and DEL through flannel → bridge → host-local, in weftd', async () => {
    const p = await pod(1);
    const add = await flannel('ADD', 'ctr-1', p);
    assert.ok('status' in add && add.status === 0, JSON.stringify(add));
    const result = JSON.parse(add.stdout) as { cniVersion: string; interfaces: Array<{ name: string; sandbox?: string }>; ips: Array<{ address: string; gateway: string }> };
    assert.equal(result.cniVersion, '1.0.0');
    assert.deepEqual(result.interfaces.map((i) => i.name).filter((n) => !n.startsWith('veth')), ['cni0', 'eth0']);
    const gw = h.subnetEnv().FLANNEL_SUBNET!.split('/')[0]!;
    assert.equal(result.ips[0]!.gateway, gw);
    // The plugins acted on weftd's namespace (the host's): cni0 with the gateway there.
    const cni0 = await ipn(h.ns, '-4', '-o', 'addr', 'show', 'dev', 'cni0');
    assert.ok(cni0.includes(`${gw}/`), `cni0: ${cni0}`);
    assert.equal(reservations().length, 1);
    // The pod reaches its gateway.
    await sh('ip', ['netns', 'exec', p, 'ping', '-c', '1', '-W', '2', gw]);

    const check = await cniCall(h.cniSocket, { plugin: 'flannel', env: env('CHECK', 'ctr-1', p), stdin: JSON.stringify({ ...JSON.parse(conf()), prevResult: result }) });
    assert.ok('status' in check && check.status === 0, JSON.stringify(check));
    const del = await flannel('DEL', 'ctr-1', p);
    assert.ok('status' in del && del.status === 0 && del.stdout === '', JSON.stringify(del));
    assert.deepEqual(reservations(), []);
    assert.equal((await ipn(p, '-o', 'link', 'show')).includes('eth0'), false);
  });

  /** A peer lease put into etcd → its route in weftd's namespace, in ms (polled every few ms). */
  let peerSeq = 0;
  async function leaseLatency(): Promise<number> {
    const i = peerSeq++;
    const subnet = `10.42.${200 + i}.0`;
    const key = `/coreos.com/network/subnets/${subnet}-24`;
    const mac = `0e:00:00:00:01:${(16 + i).toString(16).padStart(2, '0')}`;
    await c.etcdctl('put', key, JSON.stringify({ PublicIP: `10.250.0.${100 + i}`, PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: mac } }));
    const t0 = performance.now();
    await waitFor(async () => (await ipn(h.ns, 'route', 'show', `${subnet}/24`)).trim() !== '', { timeoutMs: 10_000, intervalMs: 5, what: `the route of peer ${subnet}/24` });
    const ms = performance.now() - t0;
    await c.etcdctl('del', key);
    return ms;
  }

  it('50 concurrent ADDs get 50 distinct addresses; 50 DELs leave the store empty; lease events go on meanwhile', async () => {
    const n = 50;
    const names = await Promise.all(Array.from({ length: n }, (_, i) => pod(100 + i)));
    const idle: number[] = [];
    for (let i = 0; i < 5; i++) idle.push(await leaseLatency());
    let bursting = true;
    const burst = Promise.all(names.map((p, i) => flannel('ADD', `burst-${i}`, p))).finally(() => (bursting = false));
    burst.catch(() => undefined); // awaited below (a lease measurement may throw first)
    const during: number[] = [];
    let deleted = false;
    try {
      try {
        while (bursting || during.length < 3) during.push(await leaseLatency());
      } finally {
        // Never leave this test with the ADDs still running into the next ones (each is bounded).
        await burst.catch(() => undefined);
      }
      const adds = await burst;
      const fmt = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(' ');
      // Informational (the benchmark is bench/cni.ts); the bound only catches a blocked event loop.
      console.log(`      peer lease → route, ms: idle ${fmt(idle)}; during 50 concurrent ADDs ${fmt(during)}`);
      assert.ok(Math.max(...during) < 2000, `a lease event took ${Math.max(...during).toFixed(0)} ms during the ADD burst`);
      const ips = adds.map((r, i) => {
        assert.ok('status' in r && r.status === 0, `ADD ${i}: ${JSON.stringify(r)}`);
        return (JSON.parse(r.stdout) as { ips: Array<{ address: string }> }).ips[0]!.address;
      });
      assert.equal(new Set(ips).size, n, `addresses: ${ips.join(' ')}`);
      assert.equal(reservations().length, n);
      const dels = await Promise.all(names.map((p, i) => flannel('DEL', `burst-${i}`, p)));
      deleted = true;
      dels.forEach((r, i) => assert.ok('status' in r && r.status === 0, `DEL ${i}: ${JSON.stringify(r)}`));
      assert.deepEqual(reservations(), []);
      assert.deepEqual(readdirSync(join(tmp, 'flannel')), []);
    } finally {
      // A failure above leaves the pods attached: release them, so the next tests start clean.
      if (!deleted) await Promise.allSettled(names.map((p, i) => flannel('DEL', `burst-${i}`, p)));
    }
  });

  it('answers garbage and oversized frames with a CNI error and goes on serving', async () => {
    const frame = (text: string) => {
      const b = Buffer.from(text);
      const hd = Buffer.alloc(4);
      hd.writeUInt32BE(b.length, 0);
      return Buffer.concat([hd, b]);
    };
    const refusal = async (bytes: Buffer) => {
      const o = await rawCall(h.cniSocket, bytes, { timeoutMs: 30_000 });
      assert.ok('reply' in o, JSON.stringify(o));
      assert.ok('status' in o.reply && o.reply.status === 1, JSON.stringify(o.reply));
      return replyError(o.reply);
    };
    assert.equal((await refusal(frame('{"v":1,"plugin":'))).code, 6);
    assert.equal((await refusal(Buffer.from('GET / HTTP/1.1\r\n\r\n'))).code, 5); // "GET " read as a length
    const huge = Buffer.alloc(1024 * 1024 + 64 * 1024 + 1 + 4, 0x20);
    huge.writeUInt32BE(huge.length - 4, 0);
    const big = await refusal(huge);
    assert.equal(big.code, 5);
    assert.match(big.msg, /too large/);
    const oversizedStdin = frame(JSON.stringify({ v: 1, plugin: 'flannel', env: env('ADD', 'x'), stdin: 'x'.repeat(1024 * 1024 + 1) }));
    assert.equal((await refusal(oversizedStdin)).code, 5);
    assert.equal((await refusal(frame(JSON.stringify({ v: 2, plugin: 'flannel', env: {}, stdin: '' })))).code, 1);
    const unknown = await cniCall(h.cniSocket, { plugin: 'loopback', env: env('ADD', 'x'), stdin: conf() });
    assert.match(replyError(unknown).msg, /unknown plugin "loopback"/);
    assert.equal((await cniCall(h.cniSocket, { plugin: 'flannel', env: { ...env('ADD', 'x'), PATH: '/tmp' }, stdin: conf() }).then(replyError)).code, 4);
    // Still serving, and weftd still running.
    const v = await cniCall(h.cniSocket, { plugin: 'bridge', env: { CNI_COMMAND: 'VERSION' }, stdin: '' });
    assert.ok('status' in v && v.status === 0 && /supportedVersions/.test(v.stdout), JSON.stringify(v));
    assert.ok(h.weftd?.running, 'weftd exited');
  });

  it('the socket is 0600 in a 0700 directory; a non-root caller is refused', async () => {
    assert.equal(statSync(h.cniSocket).mode & 0o777, 0o600);
    assert.equal(statSync(join(h.cniSocket, '..')).mode & 0o777, 0o700);
    // The same socket reached through a directory anyone may enter: its own mode keeps nobody out.
    const open = mkdtempSync(join(tmpdir(), 'wt-cni-open-'));
    chmodSync(open, 0o755);
    try {
      const alias = join(open, 'cni.sock');
      linkSync(h.cniSocket, alias);
      // Prints "connected" or the connect error's code.
      const asNobody = (sock: string) =>
        sh('setpriv', [
          '--reuid=nobody', '--regid=nogroup', '--clear-groups', process.execPath, '-e',
          `require('net').createConnection(${JSON.stringify(sock)}).on('connect',()=>{console.log('connected');process.exit(0)}).on('error',(e)=>{console.log(e.code);process.exit(0)})`,
        ]);
      assert.equal((await asNobody(alias)).trim(), 'EACCES');
      assert.equal((await asNobody(h.cniSocket)).trim(), 'EACCES');
      // Root gets through the same alias.
      const v = await cniCall(alias, { plugin: 'host-local', env: { CNI_COMMAND: 'VERSION' }, stdin: '' });
      assert.ok('status' in v && v.status === 0, JSON.stringify(v));
    } finally {
      rmSync(open, { recursive: true, force: true });
    }
  });

  it('weft status, the metrics and the debug log show the server', async () => {
    const run = await runWeft(h.ns, 'status', '-o', 'json');
    assert.equal(run.code, 0, run.stderr);
    const s = JSON.parse(run.stdout) as StatusSnapshot;
    const cni = s.cniServer;
    assert.ok(cni, 'no cniServer in the status');
    assert.equal(cni.socket, h.cniSocket);
    assert.equal(cni.phase, 'serving');
    assert.equal(cni.serving, true);
    assert.ok(cni.requests >= 100, `requests ${cni.requests}`);
    assert.ok((cni.results.ok ?? 0) >= 100, JSON.stringify(cni.results));
    assert.ok((cni.results.invalid ?? 0) >= 5, JSON.stringify(cni.results));
    assert.equal(cni.results.not_ready, 1);
    assert.ok(cni.lastErrors.length > 0, 'no recent errors listed');
    const text = await runWeft(h.ns, 'status');
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^cni server +serving on ${h.cniSocket.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`, 'm'));
    assert.match(text.stdout, /^cni reqs +\d+ \(ok \d+/m);
    assert.match(text.stdout, /^cni err +/m);

    // Every assert.ok has a message: without one, Node builds it by parsing the source, which
    // under tsx took minutes of CPU.
    const addsOk = await h.metric('weft_cni_requests_total{plugin="flannel",verb="ADD",result="ok"}');
    assert.ok(addsOk >= 52, `flannel ADD ok: ${addsOk}`);
    const dels = await h.metric('weft_cni_request_duration_seconds_count{plugin="flannel",verb="DEL"}');
    assert.ok(dels >= 52, `flannel DEL durations: ${dels}`);
    assert.match(h.weftd?.output ?? '', /CNI request.*burst-7/);
  });
});
