// The ovs backend end to end: hosts as namespaces, each with its own Open vSwitch (userspace
// datapath, private run dir), the underlay NIC moved onto br-phy as netdev tunnelling needs,
// real etcd, one weftd per host, pods attached through the weft-ovs CNI plugin.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { Category, cookieOf, macFromIP, OBJECT_MASK } from '../../src/backend/ovs/pipeline.js';
import { attachPodPort } from '../../src/backend/ovs/podport.js';
import { WEFT_ROUTE_PROTOCOL } from '../../src/netlink/index.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { Cluster, ETCD_IP } from '../helpers/cluster.js';
import { ipn, lines, nsExec } from '../helpers/netns.js';
import { startHostOvs, startOvsWeftd, subnetOf, type OvsHost } from '../helpers/ovs-cluster.js';
import { waitFor } from '../helpers/wait.js';
import { WeftdProcess } from '../helpers/weftd.js';
import { attachOvsPod } from '../helpers/ovs-pod.js';

const CONFIG = {
  Network: '10.244.0.0/16',
  SubnetLen: 24,
  Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 },
};
const FIXTURE = join(import.meta.dirname, '..', 'fixtures', 'ovs', 'node-flows.txt');



/** dump-flows with a filter (cookie or match), through weft's own OVS client. */
function filteredFlows(n: OvsHost, filter: string): Promise<string[]> {
  return new OvsClient({ runDir: n.ovs.runDir }).dumpFlows('br-int', filter);
}


describe('ovs backend (integration: OVS netdev datapath in namespaces, etcd, weftd)', function () {
  this.timeout(120_000);
  let cluster: Cluster;
  const nodes: OvsHost[] = [];

  async function weftRound(n: OvsHost): Promise<number> {
    return Number((await n.ovs.vsctl('get', 'bridge', 'br-int', 'external_ids:roundNum')).trim().replace(/"/g, ''));
  }

  /** The flows the fixture says this node must have, for its lease, its pod and its one peer. */
  function expectedFlows(n: OvsHost, peer: OvsHost, round: number): string[] {
    const subnet = subnetOf(n.host);
    const gw = subnet.nth(1n);
    const peerNet = subnetOf(peer.host);
    const pod = n.pod!;
    const values: Record<string, string> = {
      C_NODE: `0x${cookieOf(round, Category.Pipeline, 0).toString(16)}`,
      C_POD: `0x${cookieOf(round, Category.Pod, pod.ofport).toString(16)}`,
      C_PEER: `0x${cookieOf(round, Category.Peer, Number(peerNet.ip.value)).toString(16)}`,
      GW: gw.toString(),
      GW_MAC: macFromIP(gw),
      POD_IP: pod.ip,
      POD_MAC: pod.mac,
      POD_PORT: String(pod.ofport),
      POD_PORT_HEX: `0x${pod.ofport.toString(16)}`,
      PEER_NET: peerNet.toString(),
      PEER_GW: peerNet.nth(1n).toString(),
      PEER_IP: peer.host.underlayIP,
    };
    const text = readFileSync(FIXTURE, 'utf8').replace(/\{\{(\w+)\}\}/g, (_m, k: string) => {
      const v = values[k];
      if (v === undefined) throw new Error(`fixture placeholder ${k} has no value`);
      return v;
    });
    return lines(text).sort();
  }

  before(async function () {
    cluster = await Cluster.create({ hosts: 3, tag: 'ovs', config: CONFIG });
    for (const host of cluster.hosts) nodes.push({ host, ovs: await startHostOvs(cluster, host), pod: null });
    for (const n of nodes.slice(0, 2)) await startOvsWeftd(n);
    for (const n of nodes.slice(0, 2)) n.pod = await attachOvsPod(n.host, n.ovs, 'pod-a');
  });

  after(async function () {
    // Daemons first (weftd, then OVS), namespaces last, even when a step fails.
    await Promise.allSettled(cluster?.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve()) ?? []);
    await Promise.allSettled(nodes.map((n) => n.ovs.stop()));
    await cluster?.destroy();
  });

  async function ping(fromNs: string, ip: string, extra: string[] = []): Promise<boolean> {
    return nsExec(fromNs, 'ping', '-c', '1', '-W', '1', ...extra, ip).then(() => true, () => false);
  }

  async function reachable(fromNs: string, ip: string): Promise<void> {
    await waitFor(() => ping(fromNs, ip), { timeoutMs: 20_000, what: `${ip} to answer from ${fromNs}` });
  }

  it('pods on two nodes reach each other through the tunnel; the host reaches the remote pod; a spoofed source is dropped', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    await reachable(a.pod!.ns, b.pod!.ip);
    await reachable(b.pod!.ns, a.pod!.ip);
    await reachable(a.host.ns, b.pod!.ip);
    await reachable(a.pod!.ns, subnetOf(b.host).nth(1n).toString());
    // The packets really were tunnelled: vswitchd pushed VXLAN headers.
    const dp = await a.ovs.appctl('dpctl/dump-flows');
    assert.match(dp, /tnl_push\(tnl_port\(\d+\),header\(size=50,type=4/);
    // A pod that sends from an address it was not given gets nothing through.
    const spoofed = subnetOf(a.host).nth(99n).toString();
    await ipn(a.pod!.ns, 'addr', 'add', `${spoofed}/32`, 'dev', 'eth0');
    try {
      assert.equal(await ping(a.pod!.ns, b.pod!.ip, ['-I', spoofed]), false, 'spoofed source passed the spoof guard');
      assert.equal(await ping(a.pod!.ns, b.pod!.ip), true);
    } finally {
      await ipn(a.pod!.ns, 'addr', 'del', `${spoofed}/32`, 'dev', 'eth0');
    }
  });

  it('installs exactly the expected flow set, and the host route via the peer gateway', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const round = await weftRound(a);
    assert.ok(round >= 1);
    await waitFor(async () => JSON.stringify((await a.ovs.dumpFlows('br-int')).sort()) === JSON.stringify(expectedFlows(a, b, round)), {
      timeoutMs: 10_000,
      what: 'the flow table to equal the fixture',
    }).catch(async (e: Error) => {
      assert.deepEqual((await a.ovs.dumpFlows('br-int')).sort(), expectedFlows(a, b, round), e.message);
    });
    const peerNet = subnetOf(b.host);
    const routes = await ipn(a.host.ns, 'route', 'show', peerNet.toString());
    assert.match(routes, new RegExp(`^${peerNet.toString().replace(/\./g, '\\.')} via ${peerNet.nth(1n).toString().replace(/\./g, '\\.')} dev weft-gw0 proto ${WEFT_ROUTE_PROTOCOL} onlink`, 'm'));
    const env = a.host.subnetEnv() as Record<string, string>;
    assert.equal(env.WEFT_BACKEND, 'ovs');
    assert.equal(env.WEFT_OVS_BRIDGE, 'br-int');
    assert.equal(env.WEFT_OVS_RUNDIR, a.ovs.runDir);
    assert.equal(env.FLANNEL_MTU, '1450');
  });

  it('a third node joins and is reached; when it leaves, its flows and host route go', async () => {
    const [a, , c] = nodes as [OvsHost, OvsHost, OvsHost];
    await startOvsWeftd(c);
    c.pod = await attachOvsPod(c.host, c.ovs, 'pod-c');
    await reachable(a.pod!.ns, c.pod.ip);
    await reachable(c.pod.ns, a.pod!.ip);
    const cNet = subnetOf(c.host);
    const peerCookie = `0x${cookieOf(0, Category.Peer, Number(cNet.ip.value)).toString(16)}/0x${((1n << 48n) - 1n).toString(16)}`;
    assert.equal((await filteredFlows(a, `cookie=${peerCookie}`)).length, 3);

    // Stop c's daemon and delete its lease: a forgets c.
    await c.host.weftd!.stop();
    c.host.weftd = null;
    await cluster.etcdctl('del', `/coreos.com/network/subnets/${cNet.ip.toString()}-${cNet.prefix}`);
    await waitFor(async () => (await filteredFlows(a, `cookie=${peerCookie}`)).length === 0, { timeoutMs: 10_000, what: "c's flows to leave a" });
    await waitFor(async () => (await ipn(a.host.ns, 'route', 'show', cNet.toString())).trim() === '', { timeoutMs: 10_000, what: "c's route to leave a" });
  });

  it('a weftd restart deletes no needed flow, advances the round and leaves no flow of the old round', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const before = await weftRound(a);
    // stdbuf: ovs-ofctl block-buffers its events when writing into a pipe.
    const monitor: ChildProcess = spawn('stdbuf', ['-oL', 'ovs-ofctl', 'monitor', `unix:${a.ovs.runDir}/br-int.mgmt`, 'watch:!initial'], {
      env: { ...process.env, OVS_RUNDIR: a.ovs.runDir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    // The events arrive on stderr (ovs-ofctl prints asynchronous messages there), replies on stdout.
    let events = '';
    monitor.stdout!.setEncoding('utf8').on('data', (d: string) => (events += d));
    monitor.stderr!.setEncoding('utf8').on('data', (d: string) => (events += d));
    try {
      // The monitor is subscribed once it reports a marker flow we add and remove.
      await waitFor(async () => {
        await a.ovs.ofctl('add-flow', 'br-int', 'cookie=0x77,table=60,priority=1,actions=drop');
        return events.includes('cookie=0x77');
      }, { timeoutMs: 10_000, what: 'ovs-ofctl monitor to subscribe' }).catch((e: Error) => {
        throw new Error(`${e.message}; monitor printed ${JSON.stringify(events.slice(0, 2000))}`);
      });
      await a.ovs.ofctl('del-flows', 'br-int', 'cookie=0x77/-1');
      await a.host.weftd!.stop();
      await startOvsWeftd(a);
      await waitFor(async () => (await weftRound(a)) === before + 1, { timeoutMs: 20_000, what: 'the new round to be persisted' });
      // During the whole restart pods kept talking.
      await reachable(a.pod!.ns, b.pod!.ip);
    } finally {
      monitor.kill();
    }
    const deleted = events.split('\n').filter((l) => l.includes('event=DELETED') && !l.includes('cookie=0x77'));
    assert.deepEqual(deleted, [], 'flows were deleted during the restart');
    const stale = await filteredFlows(a, `cookie=0x${cookieOf(before, Category.Pipeline, 0).toString(16)}/0xffff000000000000`);
    assert.deepEqual(stale, []);
    assert.deepEqual((await a.ovs.dumpFlows('br-int')).sort(), expectedFlows(a, b, before + 1));
  });

  it('repairs a deleted flow and removes a foreign flow in a weft table, and counts it', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const round = await weftRound(a);
    const repairs = async (kind: string) => a.host.metric(`weft_reconcile_repairs_total{kind="${kind}"}`, 0);
    const [added, removed] = [await repairs('added'), await repairs('removed')];
    const peerNet = subnetOf(b.host);
    // Both changes in one atomic bundle, so a reconcile pass sees both or neither.
    const drift = join(cluster.dir, 'drift.txt');
    writeFileSync(drift, `delete table=30,ip,reg0=0x3/0xf,nw_dst=${peerNet.toString()}\nadd table=30,priority=300,ip,nw_dst=10.244.0.0/16,actions=drop\n`);
    await a.ovs.ofctl('-O', 'OpenFlow15', '--bundle', 'add-flows', 'br-int', drift);
    await waitFor(async () => JSON.stringify((await a.ovs.dumpFlows('br-int')).sort()) === JSON.stringify(expectedFlows(a, b, round)), {
      timeoutMs: 10_000,
      what: 'the drift to be repaired',
    });
    await waitFor(async () => (await repairs('added')) >= added + 1 && (await repairs('removed')) >= removed + 1, {
      timeoutMs: 10_000,
      what: 'the repair to be counted',
    });
    await reachable(a.pod!.ns, b.pod!.ip);
  });

  it('keeps the flows of a pod port that exists and sweeps them once the port is gone', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const client = new OvsClient({ runDir: a.ovs.runDir });
    const subnet = subnetOf(a.host);
    const ip = subnet.nth(50n);
    await ipn(a.host.ns, 'link', 'add', 'wt-extra', 'type', 'veth', 'peer', 'name', 'wt-extra-p');
    const ofport = await attachPodPort(client, {
      bridge: 'br-int', hostIface: 'wt-extra', containerId: 'ctr-extra', ifName: 'eth0',
      ip, mac: macFromIP(ip), gateway: subnet.nth(1n),
    });
    const podCookie = `cookie=0x${cookieOf(0, Category.Pod, ofport).toString(16)}/0x${OBJECT_MASK.toString(16)}`;
    assert.equal((await filteredFlows(a, podCookie)).length, 5);
    // Two reconcile passes later they are still there: the daemon wants them too.
    const repairs = await a.host.metric('weft_reconcile_repairs_total{kind="removed"}', 0);
    const passes = async () => Number(/^weft_backend_reconcile_duration_seconds_count (\d+)/m.exec(await a.host.metrics())?.[1] ?? 0);
    const start = await passes();
    await waitFor(async () => (await passes()) >= start + 2, { timeoutMs: 10_000, what: 'two reconcile passes' });
    assert.equal((await filteredFlows(a, podCookie)).length, 5);
    assert.equal(await a.host.metric('weft_reconcile_repairs_total{kind="removed"}', 0), repairs);
    // The port goes behind weft's back (not through the plugin): its flows are swept.
    await a.ovs.vsctl('del-port', 'br-int', 'wt-extra');
    await waitFor(async () => (await filteredFlows(a, podCookie)).length === 0, { timeoutMs: 10_000, what: "the gone port's flows to be swept" });
    await ipn(a.host.ns, 'link', 'del', 'wt-extra');
    assert.deepEqual((await a.ovs.dumpFlows('br-int')).sort(), expectedFlows(a, b, await weftRound(a)));
  });

  it('puts the flows back after ovs-vswitchd restarts (with flow-restore-wait set) and clears flow-restore-wait', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const round = await weftRound(a);
    await a.ovs.killVswitchd();
    await a.ovs.startVswitchd({ flowRestoreWait: true });
    await waitFor(async () => JSON.stringify((await a.ovs.dumpFlows('br-int')).sort()) === JSON.stringify(expectedFlows(a, b, round)), {
      timeoutMs: 15_000,
      what: 'the flows to be replayed',
    });
    await waitFor(async () => (await a.ovs.vsctl('--if-exists', 'get', 'open_vswitch', '.', 'other_config:flow-restore-wait')).trim() === '', {
      timeoutMs: 10_000,
      what: 'flow-restore-wait to be cleared',
    });
    await reachable(a.pod!.ns, b.pod!.ip);
  });

  it('skips peers it cannot use (other backend, other VNI) with a warning and no flows', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const put = (key: string, value: object) => cluster.etcdctl('put', `/coreos.com/network/subnets/${key}`, JSON.stringify(value));
    await put('10.244.250.0-24', { PublicIP: '10.250.0.77', PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: '02:00:00:00:00:01' } });
    await put('10.244.251.0-24', { PublicIP: '10.250.0.78', PublicIPv6: null, BackendType: 'ovs', BackendData: { VNI: 99 } });
    try {
      await waitFor(() => /rejected a peer lease.*10\.244\.251\.0-24.*VNI 99/.test(a.host.weftd!.output), { timeoutMs: 10_000, what: 'the VNI warning' });
      await waitFor(() => /rejected a peer lease.*10\.244\.250\.0-24.*not ovs/.test(a.host.weftd!.output), { timeoutMs: 10_000, what: 'the backend warning' });
      const flows = (await a.ovs.dumpFlows('br-int')).join('\n');
      assert.doesNotMatch(flows, /10\.244\.25[01]\./);
      assert.deepEqual((await a.ovs.dumpFlows('br-int')).sort(), expectedFlows(a, b, await weftRound(a)));
    } finally {
      await cluster.etcdctl('del', '/coreos.com/network/subnets/10.244.250.0-24');
      await cluster.etcdctl('del', '/coreos.com/network/subnets/10.244.251.0-24');
    }
  });

  it('exits with an error naming the socket when Open vSwitch is not running', async () => {
    const c = nodes[2]!;
    const dir = join(cluster.dir, 'no-ovs');
    const d = WeftdProcess.start(
      ['--etcd-endpoints', `http://${ETCD_IP}:2379`, '--iface', 'br-phy', '--subnet-file', join(dir, 'subnet.env'), '--healthz-port', '8082'],
      { OVS_RUNDIR: dir },
      c.host.ns,
    );
    await waitFor(() => !d.running, { timeoutMs: 30_000, what: 'weftd without OVS to exit' }).catch(async (e: Error) => {
      await d.stop().catch(() => undefined);
      throw new Error(`${e.message}:\n${d.output}`);
    });
    assert.notEqual((await d.exited).code, 0);
    assert.match(d.output, new RegExp(`${dir.replace(/[.]/g, '\\.')}/db\\.sock`));
    assert.match(d.output, /Open vSwitch is not reachable/);
  });
});
