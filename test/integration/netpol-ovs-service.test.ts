// NetworkPolicy on ovs nodes for Service traffic (issue 19, the ClusterIP escape): two ovs nodes
// (as netpol-ovs.test.ts: each host its own Open vSwitch, userspace datapath), weftd
// --network-policy --service-cidr 10.96.0.0/16 in Kubernetes mode against the fake API server,
// pods `server` and `near` on h1 and `far` on h2 (namespace x), each with a TCP agent
// (test/helpers/netpol-conn-agent.ts). No AntreaProxy: a "kube-proxy" is simulated in each NODE
// namespace by an iptables DNAT of 10.96.0.10:80 to the server pod's :80. A client's packet to the
// ClusterIP leaves OVS through the gateway port (its first pass: egress must not be judged against
// the ClusterIP), is DNATed by its own node and comes back into OVS from the gateway towards the
// server (locally on h1, through the tunnel from h2): egress must be judged then, against the
// backend pod's address, by the client's source address; ingress at the server as always.
//
// The reply half of kube-proxy's NAT: the server's replies do not pass the DNATing node — weft's
// pipeline sends them from the server's port straight to the client's port (same node) or into
// the tunnel and on to the client's port (h2), not back through the gateway of the node that did
// the DNAT (Antrea marks connections that entered from the gateway in conntrack and sends their
// replies back to the gateway; weft's conntrack is looked up only after forwarding, table 50). A
// host kube-proxy that DNATs without masquerading therefore gives pods on ovs nodes no working
// Service connection at all, policy or not. The test emulates the missing un-DNAT in each client
// pod, stateless, before its conntrack: a packet from the server's :80 gets the ClusterIP as its
// source. Policy is judged on the way to the server (where these cases differ) and the replies
// of allowed connections are established in OVS; direct connections to the server therefore use
// port 81 (its replies are not rewritten).
//  1. no policy: near and far reach the server through the ClusterIP (the simulation works);
//  2. egress on the clients only to pods app=server on TCP 80: through the ClusterIP still allowed;
//  3. egress on the clients only to ipBlock 0.0.0.0/0 except the pod network: through the ClusterIP
//     denied (the DNATed packet from the gateway is judged), and directly denied too;
//  4. ingress on the server only from `near`: near through the ClusterIP allowed, far denied.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { lines, nsExec, nsPrefix } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { ConnAgent } from '../helpers/netpol-conn.js';
import { OvsPodAttacher, tearDownPolicyCluster } from '../helpers/netpol-probe.js';
import { np } from '../helpers/netpol-reach.js';
import type { OvsInstance } from '../helpers/ovs.js';
import { startHostOvs } from '../helpers/ovs-cluster.js';
import { waitFor } from '../helpers/wait.js';

const NETWORK = '10.17.0.0/16';
const podCIDR = (i: number) => `10.17.${i}.0/24`;
const SERVICE_CIDR = '10.96.0.0/16';
const CLUSTER_IP = '10.96.0.10';
const NS = 'x';
const PORTS = [80, 81, 8080];
/** How long a new connection may take to be answered before it counts as denied. */
const PROBE_MS = 300;

interface Pod {
  readonly name: string;
  readonly host: Host;
  readonly labels: Record<string, string>;
  readonly ip: string;
  readonly agent: ConnAgent;
}

describe('NetworkPolicy on ovs nodes: Service traffic through a host kube-proxy (--service-cidr, 2 nodes, real packets)', function () {
  this.timeout(120_000);
  let c: Cluster | undefined;
  let fake: FakeKube | undefined;
  let fwd: NetnsForward | undefined;
  let netConf = '';
  const attacher = new OvsPodAttacher();
  const switches = new Map<Host, OvsInstance>();
  const pods: Pod[] = [];
  const pod = (name: string): Pod => pods.find((p) => p.name === name)!;
  const api = () => fake!;

  const podObject = (p: Pod): JsonObject => ({
    metadata: { namespace: NS, name: p.name, labels: p.labels },
    spec: { nodeName: `h${p.host.i}`, containers: [{ name: 'c', ports: PORTS.map((port) => ({ containerPort: port, protocol: 'TCP' })) }] },
    status: { phase: 'Running', podIP: p.ip, podIPs: [{ ip: p.ip }] },
  });

  function startWeftd(h: Host): Promise<void> {
    const ovs = switches.get(h)!;
    return h.startWeftd(
      [
        '--iface', 'br-phy', '--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf,
        '--network-policy', '--iptables-resync', '1',
        // WEFT_TEST_NO_SERVICE_CIDR=1: weftd without the flag (cases 2 and 3 must then fail).
        ...(process.env.WEFT_TEST_NO_SERVICE_CIDR === '1' ? [] : ['--service-cidr', SERVICE_CIDR]),
      ],
      { NODE_NAME: `h${h.i}`, OVS_RUNDIR: ovs.runDir },
    );
  }

  /** Where a cell's connection goes: the server through the ClusterIP, or a pod's own address. */
  const target = (to: string) => (to === 'svc' ? CLUSTER_IP : pod(to).ip);
  const connects = async (from: string, to: string, port: number): Promise<boolean> => (await pod(from).agent.probe(target(to), port, PROBE_MS)).ok;

  /** Cells `from>to:port` (`to` a pod, or `svc` for the ClusterIP) and whether a new connection must pass. */
  type Cells = ReadonlyArray<readonly [string, string, number, boolean]>;
  async function wrongCells(cells: Cells): Promise<string[]> {
    const seen = await Promise.all(cells.map(([from, to, port]) => connects(from, to, port)));
    return cells.flatMap(([from, to, port, want], i) =>
      seen[i] === want ? [] : [`${from} -> ${to === 'svc' ? `${CLUSTER_IP} (ClusterIP)` : to}:${port}: expected ${want ? 'allow' : 'deny'}, got ${seen[i] ? 'allow' : 'deny'}`],
    );
  }

  const ovsOf = (h: Host) => switches.get(h)!;
  const policyTables = async (h: Host) =>
    lines(await ovsOf(h).ofctl('-O', 'OpenFlow15', 'dump-flows', 'br-int').catch((e: Error) => e.message))
      .filter((l) => /\btable=(5\d|60)\b/.test(l))
      .join('\n');
  const natState = async (h: Host) =>
    `${await nsExec(h.ns, 'iptables', '-t', 'nat', '-S', 'PREROUTING', '-v').catch((e: Error) => e.message)}` +
    `${await nsExec(h.ns, 'conntrack', '-L', '-p', 'tcp', '--orig-dst', CLUSTER_IP).catch((e: Error) => e.message)}`;
  async function diagnostics(): Promise<string> {
    const out: string[] = [];
    for (const h of c?.hosts ?? []) out.push(`h${h.i} tables 50–60:\n${await policyTables(h)}`, `h${h.i} nat:\n${await natState(h)}`);
    return out.join('\n');
  }

  /**
   * Waits until every cell is as wanted in three probe rounds in a row (a policy change takes effect
   * within a deadline; a round's cells are probed at once, so one round may straddle the change).
   */
  async function cellsHold(what: string, cells: Cells, timeoutMs = 20_000): Promise<void> {
    let last: string[] = [];
    let inARow = 0;
    const check = async () => {
      last = await wrongCells(cells);
      inARow = last.length === 0 ? inARow + 1 : 0;
      return inARow >= 3;
    };
    await waitFor(check, { timeoutMs, intervalMs: 50, what }).catch(async (e: Error) => {
      throw new Error(`${e.message}; wrong: ${last.join('; ')}\n${await diagnostics()}`);
    });
  }

  before(async function () {
    this.timeout(180_000);
    fake = await FakeKube.start();
    c = await Cluster.create({ hosts: 2, tag: 'npsv', config: {} });
    const cl = c;
    fwd = await NetnsForward.start(cl.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
    netConf = join(cl.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: NETWORK, Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } }));
    for (const h of cl.hosts) fake.nodes.create(`h${h.i}`, { spec: { podCIDR: podCIDR(h.i), podCIDRs: [podCIDR(h.i)] } });
    fake.namespaces.put({ metadata: { name: NS, labels: { ns: NS } } });
    for (const h of cl.hosts) switches.set(h, await startHostOvs(cl, h));
    await Promise.all(cl.hosts.map((h) => startWeftd(h)));
    const [h1, h2] = cl.hosts as [Host, Host];
    const placed: Array<{ name: string; host: Host; labels: Record<string, string> }> = [
      { name: 'server', host: h1, labels: { app: 'server' } },
      { name: 'near', host: h1, labels: { app: 'client', role: 'near' } },
      { name: 'far', host: h2, labels: { app: 'client', role: 'far' } },
    ];
    for (const p of placed) {
      const { netns, ip } = await attacher.attach(p.host, `${nsPrefix('npsv')}-${p.name}`);
      pods.push({ ...p, ip, agent: await ConnAgent.start(netns, PORTS) });
    }
    for (const p of pods) fake.pods.put(podObject(p));
    // The simulated kube-proxy: the ClusterIP DNATed to the server in each node's own namespace,
    // which must forward (the DNATed packet is routed back out of the gateway into OVS).
    for (const h of cl.hosts) {
      const forwarding = (await nsExec(h.ns, 'sysctl', '-n', 'net.ipv4.ip_forward')).trim();
      if (forwarding !== '1') throw new Error(`h${h.i} does not forward IPv4 (net.ipv4.ip_forward=${forwarding}): the DNATed packet cannot go back into OVS`);
      await nsExec(h.ns, 'iptables', '-t', 'nat', '-A', 'PREROUTING', '-d', `${CLUSTER_IP}/32`, '-p', 'tcp', '--dport', '80', '-j', 'DNAT', '--to-destination', `${pod('server').ip}:80`);
    }
    // The replies' un-DNAT, emulated in the clients (see the header).
    for (const p of [pod('near'), pod('far')]) {
      const netns = p.agent.netns;
      await nsExec(netns, 'nft', 'add', 'table', 'ip', 'weft_test_undnat');
      await nsExec(netns, 'nft', 'add', 'chain', 'ip', 'weft_test_undnat', 'pre', '{ type filter hook prerouting priority -400; }');
      await nsExec(netns, 'nft', 'add', 'rule', 'ip', 'weft_test_undnat', 'pre', 'ip', 'saddr', pod('server').ip, 'tcp', 'sport', '80', 'ip', 'saddr', 'set', CLUSTER_IP);
    }
  });

  after(async function () {
    this.timeout(120_000);
    await tearDownPolicyCluster({
      agents: pods.map((p) => p.agent),
      attacher,
      hosts: c?.hosts ?? [],
      switches: switches.values(),
      others: [() => c?.destroy() ?? Promise.resolve(), () => fwd?.stop() ?? Promise.resolve(), () => fake?.stop() ?? Promise.resolve()],
    });
  });

  afterEach(async function () {
    if (!fake || pods.length < 3) return;
    for (const p of fake.networkPolicies.list()) {
      const m = p.metadata as { namespace: string; name: string };
      fake.networkPolicies.delete(`${m.namespace}/${m.name}`);
    }
    await cellsHold('every client to reach the server again, directly and through the ClusterIP (policies deleted)', [
      ['near', 'svc', 80, true],
      ['far', 'svc', 80, true],
      ['near', 'server', 81, true],
      ['far', 'server', 81, true],
    ]);
  });

  /** Packets the node's simulated kube-proxy DNATed so far (its rule's counter). */
  const dnatted = async (h: Host): Promise<number> => {
    const rule = lines(await nsExec(h.ns, 'iptables', '-t', 'nat', '-L', 'PREROUTING', '-v', '-x', '-n')).find((l) => l.includes(`DNAT`) && l.includes(CLUSTER_IP));
    if (!rule) throw new Error(`h${h.i} has no DNAT rule for ${CLUSTER_IP}`);
    return Number(rule.split(/\s+/)[0]);
  };

  it('no policy: near (same node) and far (other node) reach the server through the ClusterIP', async () => {
    await cellsHold('near and far to reach the server through the ClusterIP and directly', [
      ['near', 'svc', 80, true],
      ['far', 'svc', 80, true],
      ['near', 'server', 81, true],
      ['far', 'server', 81, true],
      ['near', 'far', 80, true],
    ], 30_000);
    // Each client's connection is DNATed by its own node, and only there.
    const [h1, h2] = [pod('near').host, pod('far').host];
    for (const [from, own, other] of [['near', h1, h2], ['far', h2, h1]] as const) {
      const before = [await dnatted(own), await dnatted(other)];
      assert.ok(await connects(from, 'svc', 80), `${from} -> ${CLUSTER_IP}:80 did not connect`);
      const after = [await dnatted(own), await dnatted(other)];
      assert.ok(after[0]! > before[0]!, `${from}'s connection to the ClusterIP was not DNATed by its node h${own.i}`);
      assert.equal(after[1], before[1], `${from}'s connection to the ClusterIP was DNATed by h${other.i}, not its own node`);
    }
  });

  it('egress on the clients only to app=server on TCP 80: the ClusterIP is allowed (judged against the backend pod)', async () => {
    api().networkPolicies.put(
      np(NS, 'clients-egress-to-server', { matchLabels: { app: 'client' } }, { egress: [{ peers: [{ podSelector: { matchLabels: { app: 'server' } } }], ports: [{ protocol: 'TCP', port: 80 }] }] }),
    );
    // The direct cells show the policy in force; the ClusterIP's :80 reaches the server's :80.
    await cellsHold('the egress policy to be in force', [
      ['near', 'far', 80, false],
      ['far', 'near', 80, false],
      ['near', 'server', 81, false], // not the rule's port
      ['far', 'server', 81, false],
      ['near', 'svc', 80, true],
      ['far', 'svc', 80, true],
    ]);
  });

  it('egress on the clients only to 0.0.0.0/0 except the pod network: the ClusterIP is denied, and the server directly too', async () => {
    api().networkPolicies.put(
      np(NS, 'clients-egress-internet', { matchLabels: { app: 'client' } }, { egress: [{ peers: [{ ipBlock: { cidr: '0.0.0.0/0', except: [NETWORK] } }] }] }),
    );
    await cellsHold('the egress policy to be in force', [
      ['near', 'server', 81, false],
      ['far', 'server', 81, false],
      ['near', 'far', 80, false],
      ['server', 'near', 80, true],
      ['near', 'svc', 80, false],
      ['far', 'svc', 80, false],
    ]);
  });

  it('ingress on the server only from near: near through the ClusterIP is allowed, far is denied', async () => {
    api().networkPolicies.put(
      np(NS, 'server-ingress-from-near', { matchLabels: { app: 'server' } }, { ingress: [{ peers: [{ podSelector: { matchLabels: { role: 'near' } } }] }] }),
    );
    await cellsHold('the ingress policy to be in force', [
      ['far', 'server', 81, false],
      ['near', 'server', 81, true],
      ['near', 'svc', 80, true],
      ['far', 'svc', 80, false],
    ]);
  });
});
