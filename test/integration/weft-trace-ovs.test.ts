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
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { nsExec, nsPrefix } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { OvsPodAttacher } from '../helpers/netpol-probe.js';
import type { OvsInstance } from '../helpers/ovs.js';
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

// NetworkPolicy in the OVS pipeline: one ovs node in Kubernetes mode against the fake API server,
// weftd with --network-policy, two pods on br-int (x/a app=a, x/b app=b) and a policy allowing b's
// ingress from app=a on TCP 80 only. The trace follows ofproto/trace through the conntrack
// recirculation and names the conjunction id (or the default deny flow) that decided, next to
// weftd's /policy answer, which carries the rule's conjunction ids on ovs nodes.
describe('weft trace: NetworkPolicy in the OVS pipeline (Kubernetes mode, weftd --network-policy)', function () {
  this.timeout(120_000);
  let fake: FakeKube;
  let cluster: Cluster;
  let fwd: NetnsForward;
  let host: Host;
  let ovs: OvsInstance;
  const attacher = new OvsPodAttacher();
  const pods: Record<'a' | 'b', { netns: string; ip: string }> = {} as Record<'a' | 'b', { netns: string; ip: string }>;
  const tag = 'wtpo';

  before(async function () {
    this.timeout(120_000);
    fake = await FakeKube.start();
    cluster = await Cluster.create({ hosts: 1, tag, config: {} });
    host = cluster.hosts[0]!;
    fwd = await NetnsForward.start(cluster.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
    const netConf = join(cluster.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: '10.47.0.0/16', Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } }));
    fake.nodes.create('h1', { spec: { podCIDR: '10.47.1.0/24', podCIDRs: ['10.47.1.0/24'] } });
    fake.namespaces.put({ metadata: { name: 'x', labels: { team: 'x' } } });
    ovs = await startHostOvs(cluster, host);
    await host.startWeftd(
      ['--iface', 'br-phy', '--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf, '--network-policy', '--iptables-resync', '1'],
      { NODE_NAME: 'h1', OVS_RUNDIR: ovs.runDir },
    );
    for (const name of ['a', 'b'] as const) {
      pods[name] = await attacher.attach(host, `${nsPrefix(tag)}-${name}`);
      const pod: JsonObject = {
        metadata: { namespace: 'x', name, labels: { app: name } },
        spec: { nodeName: 'h1', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
        status: { phase: 'Running', podIP: pods[name].ip, podIPs: [{ ip: pods[name].ip }] },
      };
      fake.pods.put(pod);
    }
    const policy: JsonObject = {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      metadata: { namespace: 'x', name: 'b-ingress' },
      spec: { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress'], ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }] }] },
    };
    fake.networkPolicies.put(policy);
    await waitFor(async () => (await bridgeConjunction()) !== null, { timeoutMs: 20_000, what: 'the conj_id flow of b-ingress in table 54' });
    await waitFor(async () => ingressHop((await trace(80)).report)?.evidence.programmed === true, { timeoutMs: 20_000, what: 'weftd to answer /policy for x/b with its rule set programmed' });
  });

  after(async function () {
    this.timeout(60_000);
    await Promise.allSettled([attacher.destroy()]);
    await Promise.allSettled([host?.weftd?.stop() ?? Promise.resolve()]);
    await Promise.allSettled([ovs?.stop() ?? Promise.resolve()]);
    await cluster?.destroy();
    await fwd?.stop();
    await fake?.stop();
  });

  const traceArgs = (dport: number) => ['trace', pods.a.ip, pods.b.ip, '--proto', 'tcp', '--dport', String(dport), '--subnet-file', host.subnetFile, '--etcd-timeout', '1'];
  async function trace(dport: number): Promise<{ code: number | null; report: TraceReport }> {
    const run = await runWeft(host.ns, ...traceArgs(dport), '-o', 'json');
    assert.ok(run.stdout.startsWith('{'), `weft trace printed no JSON (exit ${run.code}): ${run.stderr}`);
    const report = JSON.parse(run.stdout) as TraceReport;
    assert.deepEqual(validate(report), [], 'trace JSON validates against the schema');
    return { code: run.code, report };
  }
  const ingressHop = (r: TraceReport) => r.hops.find((h) => h.kind === 'policy' && h.evidence.direction === 'ingress') as Extract<Hop, { kind: 'policy' }> | undefined;

  /** The conjunction id of b-ingress's flow in table 54, as the bridge has it. */
  async function bridgeConjunction(): Promise<number | null> {
    const flows = await ovs.ofctl('-O', 'OpenFlow15', 'dump-flows', 'br-int', 'table=54');
    const m = /conj_id=(\d+)/.exec(flows);
    return m ? Number(m[1]) : null;
  }

  it('a -> b TCP 80: allowed by the rule\'s conjunction in the ingress rules (the recirculated pipeline\'s table 54)', async () => {
    const conj = (await bridgeConjunction())!;
    const { code, report } = await trace(80);
    assert.equal(code, 0, JSON.stringify(report.problems));
    assert.equal(report.verdict, 'ok');
    const p = hop(report, 'pipeline');
    assert.match(p.summary, new RegExp(`-> output -> ct\\(trk\\|new\\) -> conntrack state -> egress rules -> egress default -> ingress rules \\[policy conj_id ${conj}\\] -> conntrack commit -> policy output$`));
    assert.deepEqual([p.evidence.conntrack?.table, p.evidence.conntrack?.ctState], [50, 'trk|new']);
    const ingress = ingressHop(report)!;
    assert.equal(ingress.status, 'ok');
    assert.equal(ingress.summary, `ingress at pod x/b: allowed by NetworkPolicy x/b-ingress (ingress[0]); br-int: allowed by conj_id ${conj} in ingress rules (table 54), a flow of this rule`);
    assert.deepEqual([ingress.evidence.conjunctions, ingress.evidence.bridge?.conjunction, ingress.evidence.agrees], [[conj], conj, true]);
    assert.equal(hop(report, 'ovs-output').evidence.action, 'pod');
    // The text form: the policy hop's line.
    const text = (await runWeft(host.ns, ...traceArgs(80))).stdout.split('\n');
    assert.ok(text.includes(`  ok          policy     ${ingress.summary}`), text.join('\n'));
  });

  it('a -> b TCP 81: dropped by b\'s default deny flow in the ingress default table, as weftd says', async () => {
    const { code, report } = await trace(81);
    assert.equal(code, 1);
    const out = hop(report, 'ovs-output');
    // The cookie: this run's round, category 4 (policy), id 0 (a drop flow).
    assert.match(out.summary, new RegExp(`^dropped in ingress default \\(table 55\\): the NetworkPolicy default deny of pod ${pods.b.ip.replace(/\./g, '\\.')} \\(ingress; cookie 0x[0-9a-f]{1,4}040000000000\\)$`));
    assert.equal(out.evidence.droppedIn, 55);
    const ingress = ingressHop(report)!;
    assert.equal(ingress.summary, "ingress at pod x/b: dropped by the default deny (NetworkPolicies select it for ingress and none of their rules allows this packet); br-int: dropped by the pod's default deny flow in ingress default (table 55)");
    assert.deepEqual([ingress.status, ingress.evidence.agrees, ingress.evidence.bridge?.verdict], ['broken', true, 'drop']);
  });
});
