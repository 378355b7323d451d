// The ovs backend applies lease events as deltas: an event writes only the changed peers' flows
// (one bundle) and host routes (one netlink batch) and reads nothing; a pod attach or detach
// touches only that pod's flows; a refused operation is reported and the next pass compares
// everything. Part 1 runs the real OvsBackend in a child process inside a namespace with a
// private Open vSwitch (test/helpers/ovs-driver.ts), so each pass's OVS processes and netlink
// calls are seen as well as every flow change (`ovs-ofctl monitor`). Part 2 is weftd itself with
// the reconcile timer set to an hour: only the retry after a refused bundle can converge.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { GATEWAY_PORT_NAME, listPodInterfaces, readRound, TUNNEL_PORT_NAME } from '../../src/backend/ovs/bridge.js';
import { desiredFlows, gatewayOf, macFromIP, peerCookie, podCookie, renderFlows, type NodePorts } from '../../src/backend/ovs/pipeline.js';
import { attachPodPort, detachPodPort } from '../../src/backend/ovs/podport.js';
import { WEFT_ROUTE_PROTOCOL } from '../../src/netlink/index.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { Cluster } from '../helpers/cluster.js';
import { addNetns, delNetns, ipn, nsPrefix } from '../helpers/netns.js';
import { OvsInstance } from '../helpers/ovs.js';
import { startHostOvs, startOvsWeftd, type OvsHost } from '../helpers/ovs-cluster.js';
import { OvsBackendDriver, type DriverCalls, type WireLease } from '../helpers/ovs-driver.js';
import { FlowMonitor, type FlowEvent } from '../helpers/ovs-monitor.js';
import { RecordingOvsClient } from '../helpers/ovs-recording.js';
import { waitFor } from '../helpers/wait.js';

const BRIDGE = 'br-int';
const CONFIG = { Network: '10.244.0.0/16', SubnetLen: 24, Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } };
const OWN: WireLease = { subnet: '10.244.1.0/24', publicIP: '172.16.0.1' };
const peer = (i: number, publicIP = `172.16.0.${i}`): WireLease => ({ subnet: `10.244.${i}.0/24`, publicIP });
const added = (lease: WireLease) => ({ type: 'added' as const, lease });
const removed = (lease: WireLease) => ({ type: 'removed' as const, lease });

/** What one event pass may run: one flow bundle and one netlink batch, nothing read. */
const DELTA: DriverCalls = { ovs: ['ovs-ofctl --bundle add-flows'], netlink: ['netlink apply'] };

const hex = (c: bigint) => `0x${c.toString(16)}`;
/** Events as "EVENT cookie", sorted: what changed, by whom. */
const summary = (events: readonly FlowEvent[]) => events.map((e) => `${e.event} ${hex(e.cookie)}`).sort();
const times = (n: number, s: string) => Array.from({ length: n }, () => s);

describe('ovs backend: lease events and pod attachments are deltas (integration, real OvsBackend in a namespace)', function () {
  this.timeout(120_000);
  const ns = nsPrefix('ovd');
  let dir = '';
  let ovs: OvsInstance | null = null;
  let driver: OvsBackendDriver | null = null;
  let client: OvsClient;
  let monitor: FlowMonitor | null = null;
  /** The peers the backend was told about, as the daemon's set would be. */
  const peers = new Map<string, WireLease>();

  function d(): OvsBackendDriver {
    assert.ok(driver);
    return driver;
  }

  function mon(): FlowMonitor {
    assert.ok(monitor);
    return monitor;
  }

  async function round(): Promise<number> {
    const r = await readRound(client, BRIDGE);
    assert.ok(r !== null, 'no round on the bridge');
    return r;
  }

  async function applied(events: ReadonlyArray<{ type: 'added' | 'removed'; lease: WireLease }>): Promise<{ failures: number }> {
    for (const e of events) {
      if (e.type === 'added') peers.set(e.lease.subnet, e.lease);
      else peers.delete(e.lease.subnet);
    }
    return d().apply(events);
  }

  /** The whole table the backend must have made: node, the bridge's pod ports, every peer. */
  async function expectedTable(): Promise<string> {
    const ofport = async (iface: string) => Number((await client.vsctl(['get', 'interface', iface, 'ofport'])).trim());
    const gatewayIP = gatewayOf(IPNet.parse(OWN.subnet));
    const node: NodePorts = { vni: 1, tunnelPort: await ofport(TUNNEL_PORT_NAME), gatewayPort: await ofport(GATEWAY_PORT_NAME), gatewayIP, gatewayMAC: macFromIP(gatewayIP) };
    const pods = await listPodInterfaces(client, BRIDGE);
    const nodes = [...peers.values()].map((p) => ({ subnet: IPNet.parse(p.subnet), publicIP: IPAddr.parse(p.publicIP) }));
    return renderFlows(desiredFlows(await round(), node, pods, nodes));
  }

  async function assertConverged(): Promise<void> {
    assert.deepEqual(await client.diffFlows(BRIDGE, await expectedTable()), [], 'the flow table differs from the desired one');
    const routes = JSON.parse(await ipn(ns, '-j', 'route', 'show', 'proto', String(WEFT_ROUTE_PROTOCOL))) as Array<{ dst: string; gateway?: string; dev: string; flags: string[] }>;
    assert.deepEqual(
      routes.map((r) => `${r.dst} via ${r.gateway ?? '-'} dev ${r.dev}${r.flags.includes('onlink') ? ' onlink' : ''}`).sort(),
      [...peers.values()].map((p) => `${p.subnet} via ${gatewayOf(IPNet.parse(p.subnet)).toString()} dev ${GATEWAY_PORT_NAME} onlink`).sort(),
    );
  }

  async function peerFlowCount(p: WireLease): Promise<number> {
    return (await client.dumpFlows(BRIDGE, `cookie=${hex(peerCookie(await round(), IPNet.parse(p.subnet)))}/-1`)).length;
  }

  /** What changed on the bridge since the last look (every change reported first). */
  async function changes(): Promise<string[]> {
    await mon().sync();
    const s = summary(mon().events());
    mon().clear();
    return s;
  }

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'wt-ovs-delta-'));
    await addNetns(ns);
    ovs = await OvsInstance.start(ns, join(dir, 'ovs'), { flowRestoreWait: false });
    client = new OvsClient({ runDir: ovs.runDir });
    await ipn(ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0p');
    await ipn(ns, 'addr', 'add', '172.16.0.1/16', 'dev', 'eth0');
    await ipn(ns, 'link', 'set', 'eth0', 'up');
    await ipn(ns, 'link', 'set', 'eth0p', 'up');
    driver = OvsBackendDriver.start(ns, ovs.runDir);
    await d().init(CONFIG, 'eth0');
    await d().start(OWN);
    // The first pass after start: the whole table in one replace, the round persisted.
    assert.deepEqual(await applied([added(peer(2)), added(peer(3)), added(peer(4))]), { failures: 0 });
    const first = await d().calls();
    assert.ok(first.ovs.includes('ovs-ofctl --bundle replace-flows'), `the first pass did not converge the table: ${first.ovs.join(', ')}`);
    await assertConverged();
    monitor = await FlowMonitor.start(ovs.runDir, BRIDGE);
  });

  after(async () => {
    monitor?.stop();
    await driver?.stop().catch(() => undefined);
    await ovs?.stop();
    await delNetns(ns);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  afterEach(function () {
    if (this.currentTest?.state === 'failed' && driver) console.error(`--- backend log ---\n${driver.log.slice(-4000)}`);
  });

  it('a peer added, changed and removed: one bundle of only its flows, one netlink batch of only its route, nothing read', async () => {
    const r = await round();
    await d().calls();
    mon().clear();

    const p5 = peer(5);
    assert.deepEqual(await applied([added(p5)]), { failures: 0 });
    assert.deepEqual(await d().calls(), DELTA);
    assert.deepEqual(await changes(), times(3, `ADDED ${hex(peerCookie(r, IPNet.parse(p5.subnet)))}`));
    await assertConverged();

    // A new public address: the peer's three flows are rewritten, nothing else; its route stays.
    const p4 = peer(4, '172.16.0.44');
    const c4 = hex(peerCookie(r, IPNet.parse(p4.subnet)));
    assert.deepEqual(await applied([removed(peer(4)), added(p4)]), { failures: 0 });
    assert.deepEqual(await d().calls(), DELTA);
    assert.deepEqual(await changes(), [...times(3, `ADDED ${c4}`), ...times(3, `DELETED ${c4}`)]);
    assert.match((await client.dumpFlows(BRIDGE, `cookie=${c4}/-1`)).join('\n'), /172\.16\.0\.44->tun_dst/);
    await assertConverged();

    const p3 = peer(3);
    assert.deepEqual(await applied([removed(p3)]), { failures: 0 });
    assert.deepEqual(await d().calls(), DELTA);
    assert.deepEqual(await changes(), times(3, `DELETED ${hex(peerCookie(r, IPNet.parse(p3.subnet)))}`));
    await assertConverged();

    // A batch that changes nothing the backend programmed runs nothing.
    assert.deepEqual(await applied([added(peer(6)), removed(peer(6))]), { failures: 0 });
    assert.deepEqual(await d().calls(), { ovs: [], netlink: [] });
  });

  it('a pod attach and detach touch only that pod: its port, its flows by cookie; the next full pass agrees', async () => {
    const rec = new RecordingOvsClient({ runDir: ovs!.runDir });
    await ipn(ns, 'link', 'add', 'wtpod1', 'type', 'veth', 'peer', 'name', 'wtpod1c');
    await ipn(ns, 'link', 'set', 'wtpod1', 'up');
    await ipn(ns, 'link', 'set', 'wtpod1c', 'up');
    const ip = IPNet.parse(OWN.subnet).nth(7n);
    mon().clear();
    const ofport = await attachPodPort(rec, {
      bridge: BRIDGE, hostIface: 'wtpod1', containerId: 'ctr-delta-1', ifName: 'eth0',
      ip, mac: macFromIP(ip), gateway: gatewayOf(IPNet.parse(OWN.subnet)), podName: 'p1', podNamespace: 'default',
    });
    assert.deepEqual(rec.take(), ['ovs-vsctl add-port', 'ovs-vsctl get', 'ovs-ofctl --bundle add-flows']);
    const cookie = hex(podCookie(await round(), ofport));
    assert.deepEqual(await changes(), times(5, `ADDED ${cookie}`));

    // The daemon's full pass wants exactly these flows: it compares and writes nothing.
    await d().calls();
    assert.deepEqual(await d().reconcile([...peers.values()]), { failures: 0 });
    const full = await d().calls();
    assert.ok(full.ovs.includes('ovs-ofctl diff-flows'), full.ovs.join(', '));
    assert.ok(!full.ovs.some((c) => c.includes('replace-flows')), `the full pass rewrote the table: ${full.ovs.join(', ')}`);
    assert.deepEqual(await changes(), []);
    await assertConverged();

    assert.equal(await detachPodPort(rec, BRIDGE, { containerId: 'ctr-delta-1', ifName: 'eth0' }), true);
    assert.deepEqual(rec.take(), ['ovs-vsctl find', 'ovs-ofctl del-flows', 'ovs-vsctl del-port']);
    assert.deepEqual(await changes(), times(5, `DELETED ${cookie}`));
    await ipn(ns, 'link', 'del', 'wtpod1');
    await assertConverged();
  });

  it('a refused flow bundle: the pass reports it, nothing of it is believed, the next pass compares everything and converges', async () => {
    // Table 30 full (OFPFMFC_TABLE_FULL): the bundle of the next batch is refused as a whole.
    const inTable30 = (await client.dumpFlows(BRIDGE, 'table=30')).length;
    await ovs!.vsctl('--', '--id=@ft', 'create', 'Flow_Table', `flow_limit=${inTable30}`, 'overflow_policy=refuse', '--', 'set', 'bridge', BRIDGE, 'flow_tables:30=@ft');
    const [p7, p8] = [peer(7), peer(8)];
    let limited = true;
    try {
      await d().calls();
      const pass = await applied([added(p7), added(p8)]);
      assert.ok(pass.failures > 0, `a refused bundle was reported as ${JSON.stringify(pass)}`);
      assert.deepEqual(await d().calls(), DELTA);
      assert.match(d().log, /flow bundle refused/);
      // Atomic: none of the batch's flows went in, not even those of table 20.
      assert.deepEqual([await peerFlowCount(p7), await peerFlowCount(p8)], [0, 0]);
      await ovs!.vsctl('clear', 'bridge', BRIDGE, 'flow_tables');
      limited = false;
    } finally {
      if (limited) await ovs!.vsctl('clear', 'bridge', BRIDGE, 'flow_tables');
    }
    // The next batch is about another peer; the backend does not build on what it could not do.
    const p9 = peer(9);
    assert.deepEqual(await applied([added(p9)]), { failures: 0 });
    const full = await d().calls();
    for (const c of ['ovs-ofctl diff-flows', 'ovs-ofctl --bundle replace-flows']) assert.ok(full.ovs.includes(c), `no ${c} in ${full.ovs.join(', ')}`);
    assert.ok(full.netlink.includes('netlink routes'), `the routes were not compared: ${full.netlink.join(', ')}`);
    assert.deepEqual([await peerFlowCount(p7), await peerFlowCount(p8), await peerFlowCount(p9)], [3, 3, 3]);
    await assertConverged();
    // Trusted again: the next event is a delta.
    assert.deepEqual(await applied([removed(p9)]), { failures: 0 });
    assert.deepEqual(await d().calls(), DELTA);
    await assertConverged();
  });

  it('a refused route: the pass reports it, and the full reconcile after it converges (gateway back up, routes back)', async () => {
    // A down device takes its routes with it and refuses new onlink routes (ENETDOWN).
    await ipn(ns, 'link', 'set', GATEWAY_PORT_NAME, 'down');
    const p10 = peer(10);
    await d().calls();
    const pass = await applied([added(p10)]);
    assert.ok(pass.failures > 0, `a refused route was reported as ${JSON.stringify(pass)}`);
    assert.deepEqual(await d().calls(), DELTA);
    assert.deepEqual(await d().reconcile([...peers.values()]), { failures: 0 });
    const full = await d().calls();
    assert.ok(full.netlink.includes('netlink routes'), full.netlink.join(', '));
    await assertConverged();
    const link = JSON.parse(await ipn(ns, '-j', 'link', 'show', 'dev', GATEWAY_PORT_NAME)) as Array<{ flags: string[] }>;
    assert.ok(link[0]!.flags.includes('UP'), `${GATEWAY_PORT_NAME} flags ${link[0]!.flags.join(',')}`);
    assert.deepEqual(await applied([removed(p10)]), { failures: 0 });
    assert.deepEqual(await d().calls(), DELTA);
    await assertConverged();
  });
});

describe('ovs backend in weftd: a refused bundle is retried by a full reconcile, with no timer (integration)', function () {
  this.timeout(120_000);
  let cluster: Cluster;
  let n: OvsHost;
  let client: OvsClient;
  const lease = (subnet: string, publicIP: string) => ({
    key: `/coreos.com/network/subnets/${subnet.replace('/', '-')}`,
    subnet,
    value: JSON.stringify({ PublicIP: publicIP, PublicIPv6: null, BackendType: 'ovs', BackendData: { VNI: 1 } }),
  });
  const p1 = lease('10.244.200.0/24', '10.250.0.77');
  const p2 = lease('10.244.201.0/24', '10.250.0.78');

  before(async () => {
    // The timer never fires during the test: what converges is the daemon's retry after failures.
    cluster = await Cluster.create({ hosts: 1, tag: 'ovsdl', config: CONFIG, weftdArgs: ['--reconcile-interval', '3600'] });
    const host = cluster.hosts[0]!;
    n = { host, ovs: await startHostOvs(cluster, host), pod: null };
    await startOvsWeftd(n);
    client = new OvsClient({ runDir: n.ovs.runDir });
  });

  after(async () => {
    await Promise.allSettled(cluster?.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve()) ?? []);
    await n?.ovs.stop().catch(() => undefined);
    await cluster?.destroy();
  });

  async function flowsOf(subnet: string): Promise<number> {
    const r = await readRound(client, BRIDGE);
    return (await client.dumpFlows(BRIDGE, `cookie=${hex(peerCookie(r ?? 0, IPNet.parse(subnet)))}/-1`)).length;
  }

  const routeOf = async (subnet: string) => (await ipn(n.host.ns, 'route', 'show', subnet, 'proto', String(WEFT_ROUTE_PROTOCOL))).trim();

  it('the batch fails, the model is not trusted, and the retry converges once OVS takes flows again', async () => {
    // The first peer's batch is the first pass (it converges the table and persists the round).
    await cluster.etcdctl('put', p1.key, p1.value);
    await waitFor(async () => (await readRound(client, BRIDGE)) !== null && (await flowsOf(p1.subnet)) === 3 && (await routeOf(p1.subnet)) !== '', {
      timeoutMs: 10_000,
      what: 'the first peer programmed',
    });
    const failures = await n.host.metric('weft_backend_op_failures_total', 0);
    const reconciles = async () => Number(/^weft_backend_reconcile_duration_seconds_count (\d+)/m.exec(await n.host.metrics())?.[1] ?? 0);
    const reconcilesBefore = await reconciles();

    const inTable30 = (await client.dumpFlows(BRIDGE, 'table=30')).length;
    await n.ovs.vsctl('--', '--id=@ft', 'create', 'Flow_Table', `flow_limit=${inTable30}`, 'overflow_policy=refuse', '--', 'set', 'bridge', BRIDGE, 'flow_tables:30=@ft');
    try {
      await cluster.etcdctl('put', p2.key, p2.value);
      await waitFor(async () => (await n.host.metric('weft_backend_op_failures_total', 0)) > failures, { timeoutMs: 10_000, what: 'the refused bundle to be counted' });
      assert.equal(await flowsOf(p2.subnet), 0);
    } finally {
      await n.ovs.vsctl('clear', 'bridge', BRIDGE, 'flow_tables');
    }
    await waitFor(async () => (await flowsOf(p2.subnet)) === 3 && (await routeOf(p2.subnet)) !== '', { timeoutMs: 20_000, what: 'the retry to program the second peer' });
    assert.ok((await reconciles()) > reconcilesBefore, 'no reconcile ran, yet the timer is an hour');
    assert.equal(await flowsOf(p1.subnet), 3);
    await cluster.etcdctl('del', p1.key);
    await cluster.etcdctl('del', p2.key);
    await waitFor(async () => (await flowsOf(p1.subnet)) + (await flowsOf(p2.subnet)) === 0 && (await routeOf(p2.subnet)) === '', { timeoutMs: 10_000, what: 'both peers to go' });
  });
});
