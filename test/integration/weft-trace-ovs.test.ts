// `weft trace` on a real ovs node: two hosts as namespaces, each with its own Open vSwitch
// (userspace datapath, private run dir, the underlay NIC on br-phy), real etcd, weftd with
// --iface br-phy and OVS_RUNDIR, pods attached through the flannel CNI bundle (weft-ovs). Node 1
// runs in ip-masq-agent mode (--ip-masq-config naming a file that does not exist: the defaults).
// The trace reads OVS_RUNDIR from subnet.env and runs ofproto/trace on node 1's br-int.
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { listPodInterfaces } from '../../src/backend/ovs/bridge.js';
import type { Hop, HopKind, TraceReport } from '../../src/cli/trace/types.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { validate } from '../fixtures/trace/validate.js';
import { Cluster, ETCD_IP } from '../helpers/cluster.js';
import { nsExec } from '../helpers/netns.js';
import { startHostOvs, startOvsWeftd, subnetOf, type OvsHost } from '../helpers/ovs-cluster.js';
import { attachOvsPod } from '../helpers/ovs-pod.js';
import { waitFor } from '../helpers/wait.js';
import { runWeft } from '../helpers/weft-cli.js';

const NETWORK = '10.246.0.0/16';
const CONFIG = { Network: NETWORK, SubnetLen: 24, Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } };



function hop<K extends HopKind>(r: TraceReport, kind: K): Extract<Hop, { kind: K }> {
  const h = r.hops.find((x) => x.kind === kind);
  assert.ok(h, `no ${kind} hop in: ${r.hops.map((x) => `${x.kind}:${x.status}`).join(', ')}`);
  return h as Extract<Hop, { kind: K }>;
}

describe('weft trace: ovs backend (OVS netdev datapath in namespaces, etcd, weftd)', function () {
  this.timeout(60_000);
  let cluster: Cluster;
  const nodes: OvsHost[] = [];
  let cfgDir: string;

  async function trace(src: string, dst: string, subnetFile = nodes[0]!.host.subnetFile): Promise<{ code: number | null; report: TraceReport }> {
    const run = await runWeft(nodes[0]!.host.ns, 'trace', src, dst, '--subnet-file', subnetFile, '--etcd-endpoints', `http://${ETCD_IP}:2379`, '-o', 'json');
    assert.ok(run.stdout.startsWith('{'), `weft trace printed no JSON (exit ${run.code}): ${run.stderr}`);
    const report = JSON.parse(run.stdout) as TraceReport;
    assert.deepEqual(validate(report), [], 'trace JSON validates against the schema');
    return { code: run.code, report };
  }

  before(async function () {
    cluster = await Cluster.create({ hosts: 2, tag: 'wtov', config: CONFIG });
    cfgDir = join(cluster.dir, 'ipmasq');
    for (const host of cluster.hosts) nodes.push({ host, ovs: await startHostOvs(cluster, host), pod: null });
    const agent = ['--ip-masq-config', join(cfgDir, 'config.yaml')];
    await Promise.all(nodes.map((n, i) => startOvsWeftd(n, i === 0 ? agent : ['--ip-masq'])));
    for (const n of nodes) n.pod = await attachOvsPod(n.host, n.ovs, 'pod-a');
    // Pod to pod through the tunnel: node 1's flows know node 2, and its native tunnel knows node 2's MAC.
    const [a, b] = nodes as [OvsHost, OvsHost];
    await waitFor(() => nsExec(a.pod!.ns, 'ping', '-c', '1', '-W', '1', b.pod!.ip).then(() => true, () => false), { timeoutMs: 15_000, what: `${b.pod!.ip} to answer ${a.pod!.ns}` });
  });

  after(async function () {
    await Promise.allSettled(cluster?.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve()) ?? []);
    await Promise.allSettled(nodes.map((n) => n.ovs.stop()));
    await cluster?.destroy();
  });

  it('pod1 -> pod2: the pod port, the spoof guard, the tunnel to node 2 with VNI 1', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const peerNet = subnetOf(b.host).toString();
    const port = (await listPodInterfaces(new OvsClient({ runDir: a.ovs.runDir }), 'br-int')).find((p) => p.ofport === a.pod!.ofport);
    assert.ok(port);
    const { code, report } = await trace(a.pod!.ip, b.pod!.ip);
    assert.equal(code, 0, JSON.stringify(report.problems));
    assert.equal(report.verdict, 'ok');
    assert.deepEqual([report.node.backend, report.node.publicIP, report.node.leaseSource], ['ovs', a.host.underlayIP, 'etcd']);
    assert.deepEqual(report.hops.map((h) => `${h.kind}:${h.status}`), ['source:ok', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:ok']);

    const out = hop(report, 'ovs-output');
    assert.equal(out.summary, `into the tunnel weft-tun0 (ofport 32768): tun_dst ${b.host.underlayIP}, vni 1: the public IP of lease ${peerNet}; tunneling to ${b.host.underlayIP} via br-phy`);
    assert.deepEqual(out.evidence, {
      action: 'tunnel',
      outputPort: 32768,
      outputPortName: 'weft-tun0',
      droppedIn: null,
      tunnelDst: b.host.underlayIP,
      vni: 1,
      lease: peerNet,
      expectedTunnelDst: b.host.underlayIP,
      expectedVni: 1,
      tunnelMatchesLease: true,
      tunnelNotes: out.evidence.tunnelNotes,
    });
    assert.deepEqual(out.evidence.tunnelNotes.slice(0, 2), ['output to native tunnel', `tunneling to ${b.host.underlayIP} via br-phy`]);
    assert.match(out.evidence.tunnelNotes[2] ?? '', new RegExp(`^tunneling from \\S+ ${a.host.underlayIP.replace(/\./g, '\\.')} to \\S+ ${b.host.underlayIP.replace(/\./g, '\\.')}$`));

    const p = hop(report, 'pipeline').evidence;
    assert.deepEqual([p.bridge, p.datapath, p.runDir, p.entry, p.inPort, p.inPortName], ['br-int', 'netdev', a.ovs.runDir, 'pod', a.pod!.ofport, port.name]);
    assert.match(p.flow ?? '', new RegExp(`^in_port=${a.pod!.ofport},ip,dl_src=${a.pod!.mac},dl_dst=0a:58:[0-9a-f:]+,nw_src=${a.pod!.ip.replace(/\./g, '\\.')},nw_dst=${b.pod!.ip.replace(/\./g, '\\.')},nw_ttl=64$`));
    assert.deepEqual(p.tables.map((t) => `${t.table}:${t.owner}`), [`0:pod ofport ${a.pod!.ofport}`, `10:pod ofport ${a.pod!.ofport}`, `30:peer ${peerNet}`, '40:node', '50:node']);
    assert.match(p.trace ?? '', /^Flow: ip,in_port=/);
    assert.match(p.datapathActions ?? '', /tnl_push\(.*vxlan\(flags=0x8000000,vni=0x1\)/);
    assert.deepEqual(hop(report, 'spoofguard').evidence, { inPort: a.pod!.ofport, port: port.name, verdict: 'pass', allowedIP: a.pod!.ip, allowedMac: a.pod!.mac, src: a.pod!.ip, srcMac: a.pod!.mac });

    // The text form: one line per hop.
    const text = await runWeft(a.host.ns, 'trace', a.pod!.ip, b.pod!.ip, '--subnet-file', a.host.subnetFile, '--etcd-endpoints', `http://${ETCD_IP}:2379`);
    assert.equal(text.code, 0);
    const lines = text.stdout.trimEnd().split('\n');
    assert.equal(lines.length, 1 + 4 + 1);
    assert.equal(lines[4], `  ok          ovs-output into the tunnel weft-tun0 (ofport 32768): tun_dst ${b.host.underlayIP}, vni 1: the public IP of lease ${peerNet}; tunneling to ${b.host.underlayIP} via br-phy`);
    assert.equal(lines.at(-1), 'result: ok');
  });

  it('host -> pod2: the route via the peer gateway on weft-gw0, the gateway port, the tunnel; agent mode keeps the cluster unmasqueraded', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const gw = subnetOf(a.host).nth(1n).toString();
    const peer = subnetOf(b.host);
    const { code, report } = await trace(gw, b.pod!.ip);
    assert.equal(code, 0, JSON.stringify(report.problems));
    assert.deepEqual(report.hops.map((h) => h.kind), ['source', 'route', 'nexthop', 'pipeline', 'spoofguard', 'ovs-output', 'masquerade']);
    const route = hop(report, 'route').evidence;
    assert.deepEqual([route.prefix, route.gateway, route.device, route.onlink, route.protocol], [peer.toString(), peer.nth(1n).toString(), 'weft-gw0', true, '88']);
    assert.deepEqual([hop(report, 'pipeline').evidence.entry, hop(report, 'pipeline').evidence.inPort], ['gateway', 32769]);
    assert.deepEqual([hop(report, 'ovs-output').evidence.tunnelDst, hop(report, 'ovs-output').evidence.tunnelMatchesLease], [b.host.underlayIP, true]);
    const m = hop(report, 'masquerade').evidence;
    assert.deepEqual([m.ipMasqMode, m.chain, m.verdict, m.matchedCIDR, m.live, m.liveVerdict, m.liveChain], ['agent', 'WEFT-IP-MASQ', 'RETURN', NETWORK, 'present', 'RETURN', 'WEFT-IP-MASQ']);
  });

  it('ip-masq-agent mode: a nonMasqueradeCIDR keeps the pod address, anything else is masqueraded', async () => {
    const [a] = nodes as [OvsHost];
    const kept = await trace(a.pod!.ip, '203.0.113.10');
    assert.equal(kept.code, 0, JSON.stringify(kept.report.problems));
    assert.deepEqual(kept.report.hops.map((h) => h.kind), ['source', 'pipeline', 'spoofguard', 'ovs-output', 'route', 'nexthop', 'mtu', 'masquerade', 'forward']);
    assert.equal(hop(kept.report, 'ovs-output').summary, 'to the host through weft-gw0 (ofport 32769): the kernel routes it on');
    const rule = '-A WEFT-IP-MASQ -d 203.0.113.0/24 -m comment --comment "weft-ip-masq: nonMasqueradeCIDRs traffic is not subject to MASQUERADE" -j RETURN';
    const k = hop(kept.report, 'masquerade');
    assert.equal(k.summary, `not masqueraded: 203.0.113.10 is in nonMasqueradeCIDR 203.0.113.0/24: rule 12 of WEFT-IP-MASQ returns: ${rule} (ip-masq-agent mode, live: present)`);
    assert.deepEqual([k.evidence.liveRule, k.evidence.liveRuleText], [12, rule]);
    // The live rule is exactly what iptables-save shows on the node.
    assert.ok((await nsExec(a.host.ns, 'iptables-save', '-t', 'nat')).split('\n').includes(rule));
    const masq = await trace(a.pod!.ip, '8.8.8.8');
    assert.deepEqual([hop(masq.report, 'masquerade').evidence.verdict, hop(masq.report, 'masquerade').evidence.liveVerdict, hop(masq.report, 'masquerade').evidence.toSource], ['MASQUERADE', 'MASQUERADE', a.host.underlayIP]);
  });

  it('OVS not reachable (a run directory without sockets): a broken hop with the reason, exit 1', async () => {
    const [a, b] = nodes as [OvsHost, OvsHost];
    const dead = join(cluster.dir, 'no-ovs');
    const file = join(cluster.dir, 'subnet-no-ovs.env');
    writeFileSync(file, readFileSync(a.host.subnetFile, 'utf8').replace(/^WEFT_OVS_RUNDIR=.*$/m, `WEFT_OVS_RUNDIR=${dead}`));
    const { code, report } = await trace(a.pod!.ip, b.pod!.ip, file);
    assert.equal(code, 1);
    assert.deepEqual(report.hops.map((h) => `${h.kind}:${h.status}`), ['source:ok', 'pipeline:broken']);
    const p = hop(report, 'pipeline');
    assert.match(p.summary, new RegExp(`^cannot trace the packet through br-int: ovs-vsctl via ${dead.replace(/[.]/g, '\\.')}/db\\.sock: Open vSwitch is not reachable`));
    assert.equal(p.evidence.runDir, dead);
  });
});
