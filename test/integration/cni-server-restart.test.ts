// The CNI path while weftd goes away: the native client (dist/cni/bin/flannel), exec'd in the host
// namespace as a runtime does, against a weftd of a one-host cluster (real etcd).
//  - weftd killed (SIGKILL) with ADDs in flight: every call ends within its bound (a result, or a
//    CNI error for the ones cut off), none hangs; with weftd gone, calls fall back to the bundle,
//    and DEL cleans up every attachment, the cut-off ones included;
//  - weftd stopped (SIGTERM) with ADDs in flight, then started again: every ADD succeeds (served, or
//    answered serving:false and run by the bundle) with distinct addresses; the restarted server
//    serves again.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { execProgram, type ExecResult } from '../../src/util/exec.js';
import { hostLocalReservations } from '../helpers/cni-client.js';
import { Cluster, type Host } from '../helpers/cluster.js';
import { addNetns, delNetns, ipn, nsPrefix } from '../helpers/netns.js';
import { cniEnv, flannelNetConf } from '../helpers/cni.js';
import { waitFor } from '../helpers/wait.js';

const NETWORK = 'wtcr';
const CONFIG = { Network: '10.43.0.0/16', Backend: { Type: 'vxlan' } };
const BIN = join(process.cwd(), 'dist', 'cni', 'bin');
const PODS = 20;
/** The client's own bound on a reply: a call cut off by a dead server must end well before the test's. */
const CLIENT_TIMEOUT_MS = 20_000;

describe('CNI calls while weftd is killed or restarted (integration, namespaces)', function () {
  this.timeout(240_000);
  let c: Cluster;
  let h: Host;
  let tmp = '';
  const prefix = nsPrefix('crp');
  const pods: string[] = [];

  const conf = () => flannelNetConf(NETWORK, h.subnetFile, tmp);

  /** The native client as a runtime runs it: in the host namespace, only PATH and CNI_* (plus the socket). */
  function flannel(command: string, i: number): Promise<ExecResult> {
    const env = cniEnv({ bin: join(BIN, 'flannel'), command, containerId: `ctr-${i}`, netns: `/run/netns/${pods[i]}`, env: { WEFT_CNI_TIMEOUT_MS: String(CLIENT_TIMEOUT_MS) } }, h.cniSocket);
    return execProgram('ip', ['netns', 'exec', h.ns, join(BIN, 'flannel')], { env, input: conf(), timeoutMs: CLIENT_TIMEOUT_MS + 30_000 });
  }

  const reservations = (): string[] => hostLocalReservations(join(tmp, 'ipam'), NETWORK);


  const address = (r: ExecResult): string => {
    assert.equal(r.code, 0, `${r.stdout} ${r.stderr}`);
    return (JSON.parse(r.stdout) as { ips: { address: string }[] }).ips[0]!.address;
  };

  /** DEL of every pod (through whatever answers); then no reservation and no pod veth is left. */
  async function delAll(): Promise<void> {
    for (const r of await Promise.all(pods.map((_, i) => flannel('DEL', i)))) assert.equal(r.code, 0, `${r.stdout} ${r.stderr}`);
    assert.deepEqual(reservations(), []);
    // (cni0 itself may never have been made, when every ADD was cut off before the bridge.)
    const onBridge = (await ipn(h.ns, '-o', 'link', 'show')).split('\n').filter((l) => / master cni0 /.test(l));
    assert.deepEqual(onBridge, [], 'no pod veth left on cni0');
  }

  before(async () => {
    assert.ok(existsSync(join(BIN, 'flannel.cjs')), 'run `npm run build` first');
    tmp = mkdtempSync(join(tmpdir(), 'wt-cni-restart-'));
    c = await Cluster.create({ hosts: 1, tag: 'cr', config: CONFIG, weftdArgs: ['--log-level', 'debug'] });
    h = c.hosts[0]!;
    for (let i = 0; i < PODS; i++) {
      await delNetns(`${prefix}-p${i}`);
      pods.push(await addNetns(`${prefix}-p${i}`));
    }
    await h.startWeftd();
  });

  after(async () => {
    try {
      await Promise.all(pods.map((p) => delNetns(p)));
      await c?.destroy();
    } finally {
      if (tmp) rmSync(tmp, { recursive: true, force: true });
    }
  });

  it('weftd killed with ADDs in flight: no call hangs; then the bundle serves, and DEL cleans up everything', async () => {
    const t0 = performance.now();
    const adds = pods.map((_, i) => flannel('ADD', i));
    // Received by weftd: in flight now, or already answered (a fast machine may finish them first).
    const received = async (n: number) => {
      const st = await h.cniServerStatus();
      return st.inFlight + st.requests >= n;
    };
    await waitFor(() => received(3), { timeoutMs: 30_000, what: 'ADDs received by weftd' });
    h.weftd!.kill();
    await h.weftd!.exited;
    const results = await Promise.all(adds);
    const took = performance.now() - t0;
    assert.ok(took < CLIENT_TIMEOUT_MS + 20_000, `the calls ended after ${Math.round(took)} ms`);
    let cut = 0;
    for (const r of results) {
      if (r.code === 0) continue;
      cut++;
      // Cut off: a CNI error from the client, not a crash or a hang.
      assert.equal(r.code, 1, r.stderr);
      const e = JSON.parse(r.stdout) as { code: number; msg: string };
      assert.equal(typeof e.code, 'number', r.stdout);
    }
    console.log(`      killed after ${PODS} ADDs were sent: ${PODS - cut} finished, ${cut} cut off (CNI error), after ${Math.round(took)} ms`);
    // The socket file is left behind by the killed weftd: connecting is refused, the client runs the
    // bundle. A cut-off ADD left things behind (as a killed plugin process would): DEL removes them,
    // as a runtime does before it retries.
    assert.ok(statSync(h.cniSocket).isSocket());
    await delAll();
    assert.match(address(await flannel('ADD', 0)), /^10\.43\./);
    assert.equal((await flannel('DEL', 0)).code, 0);
  });

  it('weftd stopped with ADDs in flight and started again: every ADD succeeds; the new weftd serves', async () => {
    await h.startWeftd();
    await waitFor(async () => (await h.cniServerStatus()).phase === 'serving', { timeoutMs: 30_000, what: 'the new weftd to serve' });
    const adds = pods.map((_, i) => flannel('ADD', i));
    await waitFor(async () => {
      const st = await h.cniServerStatus();
      return st.inFlight + st.requests >= 1;
    }, { timeoutMs: 30_000, what: 'ADDs received by weftd' });
    const stopped = h.weftd!.stop();
    const addresses = (await Promise.all(adds)).map(address);
    assert.equal(new Set(addresses).size, PODS, addresses.join(' '));
    assert.equal((await stopped).code, 0);
    await h.startWeftd();
    await waitFor(async () => (await h.cniServerStatus()).phase === 'serving', { timeoutMs: 30_000, what: 'weftd to serve again' });
    await delAll();
    const served = await h.metric('weft_cni_requests_total{plugin="flannel",verb="DEL",result="ok"}', 0);
    assert.equal(served, PODS, 'the DELs went through the restarted server');
  });
});
