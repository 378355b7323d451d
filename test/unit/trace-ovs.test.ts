// `weft trace` on an ovs node, from ofproto/trace texts captured on a real Open vSwitch 3.1
// (test/fixtures/trace/capture-ovs.ts: br-int built by the backend's own code, netdev datapath,
// br-phy for userspace tunnelling). The node: lease 10.244.1.0/24 at 10.250.0.1, pods 10.244.1.2
// (vpod2, ofport 1) and 10.244.1.3 (vpod3, ofport 2); peers 10.244.2.0/24 at 10.250.0.2 and
// 10.244.3.0/24 at 10.250.0.9 (nobody answers ARP there); lease 10.244.4.0/24 has no flows.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { analyze } from '../../src/cli/trace/analyze.js';
import { parseSubnetEnvFacts } from '../../src/cli/trace/collect.js';
import { exitCodeOf, parsePacket } from '../../src/cli/trace/command.js';
import { cookieOwner, ovsEntry, parseOfTrace, planOvsTrace, summarizeOvsTrace } from '../../src/cli/trace/ovs.js';
import { renderTrace } from '../../src/cli/trace/render.js';
import type { Hop, HopKind, OvsEntry, OvsFacts, OvsPodPortFacts, RouteLookup, TraceFacts, TraceReport } from '../../src/cli/trace/types.js';
import { chainLines, jumpSpec } from '../../src/ipmasq/iptables.js';
import { forwardRules, masqRules } from '../../src/ipmasq/model.js';
import { NUD, type LinkInfo, type NeighEntry } from '../../src/netlink/index.js';
import { OvsUnreachableError } from '../../src/ovs/cli.js';
import type { Lease } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { validate } from '../fixtures/trace/validate.js';

const FIXTURES = new URL('../fixtures/trace/', import.meta.url);
const fixture = (name: string): string => readFileSync(new URL(`ovs-${name}.txt`, FIXTURES), 'utf8');
const CAPTURE = JSON.parse(readFileSync(new URL('ovs-flows.json', FIXTURES), 'utf8')) as {
  ports: { tunnel: number; gateway: number; pods: Array<{ name: string; ofport: number; ip: string; mac: string }> };
  cases: Record<string, string>;
};

const NETWORK = IPNet.parse('10.244.0.0/16');
const SUBNET = IPNet.parse('10.244.1.0/24');
const GW_MAC = '0a:58:0a:f4:01:01';
const VMAC = 'aa:bb:cc:dd:ee:ff';
const PODS: OvsPodPortFacts[] = CAPTURE.ports.pods.map((p) => ({ name: p.name, ofport: p.ofport, ip: IPAddr.parse(p.ip), mac: p.mac, containerId: `ctr-${p.name}` }));
const [VPOD2, VPOD3] = PODS as [OvsPodPortFacts, OvsPodPortFacts];
/** The native tunnel's last line names br-phy's and the peer's MACs, which differ per capture. */
const TUNNEL_FROM = /-> (tunneling from \S+ 10\.250\.0\.1 to \S+ 10\.250\.0\.2)$/m.exec(fixture('pod-to-remote'))![1]!;

function lease(subnet: string, publicIP: string): Lease {
  return {
    subnet: IPNet.parse(subnet),
    ipv6Subnet: null,
    attrs: { publicIP: IPAddr.parse(publicIP), publicIPv6: null, backendType: 'ovs', backendData: { VNI: 1 } },
    reservation: false,
    expiration: null,
  };
}
const LEASES = [lease('10.244.1.0/24', '10.250.0.1'), lease('10.244.2.0/24', '10.250.0.2'), lease('10.244.3.0/24', '10.250.0.9'), lease('10.244.4.0/24', '10.250.0.4')];

function link(index: number, name: string, mtu: number, kind: string | null, mac: string | null = null): LinkInfo {
  return { index, name, mtu, mac, adminUp: true, operState: 'UP', kind, vxlan: null };
}
const LINKS = [link(1, 'lo', 65536, null), link(2, 'eth0', 1500, 'veth'), link(3, 'br-phy', 1500, 'openvswitch', '3a:0f:1d:6f:d9:4c'), link(4, 'weft-gw0', 1450, 'tun', GW_MAC)];

function route(prefix: string, gateway: string | null, device: string, extra: Partial<Extract<RouteLookup, { ok: true }>> = {}): RouteLookup {
  return { ok: true, type: 'unicast', prefix: IPNet.parse(prefix), gateway: gateway ? IPAddr.parse(gateway) : null, device, protocol: '88', onlink: false, nexthopId: null, prefsrc: null, table: null, ...extra };
}
const neigh = (ifindex: number, ip: string, mac: string, state: number): NeighEntry => ({ ifindex, ip: IPAddr.parse(ip), mac, state, permanent: state === NUD.PERMANENT });

function natSave(): string {
  const spec = { family: 4 as const, kind: 'masq' as const, rules: masqRules(NETWORK, SUBNET, IPNet.parse('224.0.0.0/4'), true) };
  return ['*nat', ':POSTROUTING ACCEPT [0:0]', ':FLANNEL-POSTRTG - [0:0]', `-A POSTROUTING ${jumpSpec('masq')}`, ...chainLines(spec), 'COMMIT'].join('\n');
}
function filterSave(): string {
  const spec = { family: 4 as const, kind: 'forward' as const, rules: forwardRules(NETWORK) };
  return ['*filter', ':FORWARD ACCEPT [0:0]', ':FLANNEL-FWD - [0:0]', `-A FORWARD ${jumpSpec('forward')}`, ...chainLines(spec), 'COMMIT'].join('\n');
}

interface Case {
  readonly fixture: string | null;
  readonly src: string;
  readonly dst: string;
  readonly route: RouteLookup;
  readonly neighbours?: NeighEntry[];
  readonly leases?: Lease[];
  readonly ovsError?: string;
  readonly traceError?: string;
}

/**
 * Facts as collect gathers them on the node, with the OVS part made the way collect makes it:
 * entry and flow from ovsEntry/planOvsTrace (asserted equal to the flow the capture traced), the
 * trace's text from the fixture.
 */
function facts(k: Case): TraceFacts {
  const packet = parsePacket(k.src, k.dst, 'icmp', null);
  const leases = k.leases ?? LEASES;
  const addresses = [
    { ifindex: 1, ip: IPAddr.parse('127.0.0.1') },
    { ifindex: 3, ip: IPAddr.parse('10.250.0.1') },
    { ifindex: 4, ip: IPAddr.parse('10.244.1.1') },
  ];
  const srcIsNode = addresses.some((a) => a.ip.equals(packet.src));
  const srcLease = leases.slice(1).find((l) => l.subnet?.contains(packet.src)) ?? null;
  const neighbours = k.neighbours ?? [];
  const entryInput = { packet, srcIsNode, subnet: SUBNET, srcLease, route: k.route, gatewayDevice: 'weft-gw0' };
  const entry = ovsEntry(entryInput);
  let trace: OvsFacts['trace'] = null;
  if (entry) {
    const plan = planOvsTrace({ ...entryInput, entry, publicIP: IPAddr.parse('10.250.0.1'), pods: PODS, gatewayMac: GW_MAC, tunnelPort: 32768, gatewayPort: 32769, vni: 1, neighbours });
    if (k.fixture) assert.equal(plan.flow, CAPTURE.cases[k.fixture], 'trace picks the headers the capture traced');
    trace = { entry, inPort: plan.inPort, inPortName: plan.inPortName, flow: plan.flow, note: plan.note, output: k.fixture && !k.traceError ? fixture(k.fixture) : null, error: k.traceError ?? k.ovsError ?? null };
  }
  return {
    packet,
    subnetFile: '/run/flannel/subnet.env',
    env: { ...parseSubnetEnvFacts('FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\nWEFT_BACKEND=ovs\nWEFT_OVS_BRIDGE=br-int\nWEFT_OVS_RUNDIR=/var/run/openvswitch\nWEFT_OVS_DATAPATH=netdev\n') },
    config: { network: NETWORK, ipv6Network: null, backendType: 'ovs', enableNFTables: false },
    daemonBackend: 'ovs',
    leases,
    leaseSource: 'etcd',
    addresses,
    links: LINKS,
    ingress: srcIsNode ? null : 'weft-gw0',
    route: k.route,
    neighbours,
    fdb: [],
    underlay: new Map(),
    bridge: LINKS[3]!,
    rules: { mode: 'iptables', modeSource: 'daemon', iptablesNat: natSave(), iptablesFilter: filterSave(), nft: null, forwardRules: true, errors: [] },
    ipForward: true,
    policy: null,
    ovs: {
      bridge: 'br-int',
      runDir: '/var/run/openvswitch',
      datapath: 'netdev',
      tunnelPort: 32768,
      gatewayPort: 32769,
      gatewayMac: GW_MAC,
      pods: k.ovsError ? null : PODS,
      vni: 1,
      trace,
      error: k.ovsError ?? null,
    },
    notes: [],
  };
}

function hop<K extends HopKind>(r: TraceReport, kind: K): Extract<Hop, { kind: K }> {
  const h = r.hops.find((x) => x.kind === kind);
  assert.ok(h, `no ${kind} hop in ${r.hops.map((x) => x.kind).join(',')}`);
  return h as Extract<Hop, { kind: K }>;
}
const statuses = (r: TraceReport): string[] => r.hops.map((h) => `${h.kind}:${h.status}`);
function checked(f: TraceFacts): TraceReport {
  const r = analyze(f);
  assert.deepEqual(validate(JSON.parse(JSON.stringify(r))), []);
  return r;
}

const TO_PEER_ROUTE = route('10.244.2.0/24', '10.244.2.1', 'weft-gw0', { onlink: true });
const POD_TO_REMOTE: Case = { fixture: 'pod-to-remote', src: '10.244.1.2', dst: '10.244.2.5', route: TO_PEER_ROUTE };

describe('trace ovs: reading ofproto/trace', () => {
  it('reads the tables, actions, notes and the native tunnel continuing in br-phy', () => {
    const t = parseOfTrace(fixture('pod-to-remote'));
    assert.equal(t.flow, 'ip,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:01,nw_src=10.244.1.2,nw_dst=10.244.2.5,nw_proto=0,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no');
    assert.deepEqual(t.steps.map((s) => `${s.bridge}:${s.table}`), ['br-int:0', 'br-int:10', 'br-int:30', 'br-int:40', 'br-int:50', 'br-phy:0']);
    assert.deepEqual(t.steps[2], {
      bridge: 'br-int',
      table: 30,
      match: 'ip,reg0=0x3/0xf,nw_dst=10.244.2.0/24',
      priority: 200,
      cookie: '0x102000af40200',
      actions: ['set_field:0a:58:0a:f4:01:01->eth_src', 'set_field:aa:bb:cc:dd:ee:ff->eth_dst', 'set_field:10.250.0.2->tun_dst', 'set_field:0x1->tun_id', 'dec_ttl', 'goto_table:40'],
      notes: [],
      recirc: null,
    });
    assert.match(TUNNEL_FROM, /^tunneling from ([0-9a-f]{2}:){5}[0-9a-f]{2} 10\.250\.0\.1 to ([0-9a-f]{2}:){5}[0-9a-f]{2} 10\.250\.0\.2$/);
    assert.deepEqual(t.steps[4]!.notes, ['output port is 32768', 'output to native tunnel', 'tunneling to 10.250.0.2 via br-phy', TUNNEL_FROM]);
    // A catch-all flow prints no match, and no cookie when it has none.
    assert.deepEqual([t.steps[5]!.match, t.steps[5]!.priority, t.steps[5]!.cookie, t.steps[5]!.actions], ['', 0, null, ['NORMAL']]);
    assert.match(t.datapathActions ?? '', /^set\(eth\(src=0a:58:0a:f4:01:01,dst=aa:bb:cc:dd:ee:ff\)\),tnl_push\(.*vxlan\(flags=0x8000000,vni=0x1\)\),out_port\(2\)\),1$/);
  });

  it('reads "No match." tables and ">>" errors', () => {
    const t = parseOfTrace('Flow: ip,in_port=9\n\nbridge("br-int")\n----------------\n 0. No match.\n    drop\n\nFinal flow: unchanged\nMegaflow: recirc_id=0\nDatapath actions: drop\n');
    assert.deepEqual(t.steps, [{ bridge: 'br-int', table: 0, match: null, priority: null, cookie: null, actions: ['drop'], notes: [], recirc: null }]);
    const e = parseOfTrace('Flow: ip\n\nbridge("br-int")\n----------------\n50. priority 200\n    output:32768\n     -> output to native tunnel\n     >> native tunnel routing failed\n\nDatapath actions: drop\n');
    assert.deepEqual(e.steps[0]!.notes, ['output to native tunnel', 'native tunnel routing failed']);
    const p = summarizeOvsTrace(e, { tunnel: 32768, gateway: 32769, pods: new Set() }, () => null);
    assert.deepEqual([p.action, p.tunnelFailure], ['tunnel', 'native tunnel routing failed']);
    assert.throws(() => parseOfTrace('ovs-appctl: cannot connect'), { name: 'OfTraceParseError' });
  });

  it('names a flow\'s owner from its cookie', () => {
    const lease = (ip: IPAddr) => (ip.toString() === '10.244.2.0' ? '10.244.2.0/24' : null);
    assert.equal(cookieOwner('0x1010000000000', lease), 'node');
    assert.equal(cookieOwner('0x1030000000001', lease), 'pod ofport 1');
    assert.equal(cookieOwner('0x102000af40200', lease), 'peer 10.244.2.0/24');
    assert.equal(cookieOwner('0x102000af40300', lease), 'peer 10.244.3.0');
    assert.equal(cookieOwner('0x77', lease), "not weft's");
    assert.equal(cookieOwner(null, lease), "not weft's");
  });

  it('summarises the path: spoof guard verdict, output, tun_dst and VNI', () => {
    const ports = { tunnel: 32768, gateway: 32769, pods: new Set([1, 2]) };
    const s = (name: string) => summarizeOvsTrace(parseOfTrace(fixture(name)), ports, () => null);
    const tun = s('pod-to-remote');
    assert.deepEqual([tun.spoofGuard, tun.action, tun.outputPort, String(tun.tunnelDst), tun.vni, tun.tunnelFailure], ['pass', 'tunnel', 32768, '10.250.0.2', 1, null]);
    assert.deepEqual(tun.tables.map((x) => x.name), ['classifier', 'spoof guard', 'L3 forwarding', 'L2 forwarding', 'output']);
    const spoof = s('spoofed');
    assert.deepEqual([spoof.spoofGuard, spoof.action, spoof.droppedIn, spoof.outputPort], ['drop', 'drop', 10, null]);
    const ingress = s('remote-to-pod');
    assert.deepEqual([ingress.spoofGuard, ingress.action, ingress.outputPort], ['not-applied', 'pod', 1]);
    assert.deepEqual([s('pod-to-external').action, s('pod-to-pod').outputPort], ['gateway', 2]);
    assert.equal(s('pod-to-unresolved').tunnelFailure, 'neighbor cache miss for 10.250.0.9 on bridge br-phy, sending ARP request');
  });
});

describe('trace ovs: which packet is traced', () => {
  const packet = (src: string, dst: string) => parsePacket(src, dst, 'icmp', null);
  const base = { srcIsNode: false, subnet: SUBNET, srcLease: null as Lease | null, route: TO_PEER_ROUTE, gatewayDevice: 'weft-gw0' };

  it('enters at a pod port, the tunnel, or (host and forwarded traffic) the gateway port', () => {
    const e = (over: Partial<typeof base> & { packet: ReturnType<typeof packet> }): OvsEntry | null => ovsEntry({ ...base, ...over });
    assert.equal(e({ packet: packet('10.244.1.2', '10.244.2.5') }), 'pod');
    assert.equal(e({ packet: packet('10.244.2.5', '10.244.1.2'), srcLease: LEASES[1]! }), 'tunnel');
    assert.equal(e({ packet: packet('10.244.1.1', '10.244.2.5'), srcIsNode: true }), 'gateway');
    assert.equal(e({ packet: packet('10.250.0.1', '8.8.8.8'), srcIsNode: true, route: route('0.0.0.0/0', '10.250.0.254', 'br-phy') }), null);
  });

  it('sends from a pod port as that pod, and says so when the source is no pod\'s', () => {
    const plan = (src: string, dst: string, entry: OvsEntry, over: Record<string, unknown> = {}) =>
      planOvsTrace({ ...base, packet: packet(src, dst), entry, publicIP: IPAddr.parse('10.250.0.1'), pods: PODS, gatewayMac: GW_MAC, tunnelPort: 32768, gatewayPort: 32769, vni: 1, neighbours: [], ...over });
    assert.deepEqual(plan('10.244.1.99', '10.244.2.5', 'pod'), {
      inPort: 1,
      inPortName: 'vpod2',
      flow: CAPTURE.cases.spoofed,
      note: 'no pod port has 10.244.1.99: traced as sent by vpod2 (ofport 1, pod 10.244.1.2)',
      error: null,
    });
    assert.deepEqual(plan('10.244.1.99', '10.244.2.5', 'pod', { pods: [] }), {
      inPort: null,
      inPortName: null,
      flow: null,
      note: null,
      error: 'no pod port has 10.244.1.99, and there is no pod port to send it from',
    });
    // The host's next hop not resolved yet: what the ARP responder will answer.
    const host = plan('10.244.1.1', '10.244.2.5', 'gateway', { srcIsNode: true });
    assert.equal(host.flow, CAPTURE.cases['host-to-remote']);
    assert.equal(host.note, `no neighbour entry for 10.244.2.1 on weft-gw0 yet: traced with ${VMAC}, what the ARP responder answers for a peer's gateway`);
    // A resolved one is used as it is.
    const resolved = plan('10.244.1.1', '10.244.2.5', 'gateway', { srcIsNode: true, neighbours: [neigh(4, '10.244.2.1', '0e:00:00:00:00:99', NUD.REACHABLE)] });
    assert.match(resolved.flow ?? '', /,dl_dst=0e:00:00:00:00:99,/);
    assert.equal(plan('10.244.1.1', '10.244.1.2', 'gateway', { srcIsNode: true, route: route('10.244.1.0/24', null, 'weft-gw0') }).flow, CAPTURE.cases['host-to-pod']);
  });

  it('reads the ovs backend\'s and ip-masq-agent mode\'s lines of subnet.env', () => {
    const env = parseSubnetEnvFacts('FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_IPMASQ=true\nWEFT_BACKEND=ovs\nWEFT_OVS_BRIDGE=br-int\nWEFT_OVS_RUNDIR=/tmp/ovs/run\nWEFT_OVS_DATAPATH=netdev\nWEFT_IPMASQ=agent\n');
    assert.deepEqual([env.backend, env.ovsBridge, env.ovsRunDir, env.ovsDatapath, env.ipMasqMode], ['ovs', 'br-int', '/tmp/ovs/run', 'netdev', 'agent']);
    const plain = parseSubnetEnvFacts('FLANNEL_NETWORK=10.244.0.0/16\nWEFT_OVS_BRIDGE=\n');
    assert.deepEqual([plain.backend, plain.ovsBridge, plain.ipMasqMode], [null, null, null]);
  });
});

describe('trace ovs: the path through br-int', () => {
  it('local pod -> remote pod: spoof guard passed, into the tunnel to the lease\'s public IP', () => {
    const r = checked(facts(POD_TO_REMOTE));
    assert.equal(r.verdict, 'ok');
    assert.equal(exitCodeOf(r), 0);
    assert.deepEqual(statuses(r), ['source:ok', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:ok']);
    assert.equal(hop(r, 'source').summary, '10.244.1.2 is a pod of this node (lease 10.244.1.0/24), enters br-int on vpod2 (ofport 1)');
    assert.equal(hop(r, 'source').evidence.ingress, 'vpod2');
    assert.equal(
      hop(r, 'pipeline').summary,
      'br-int in_port 1 (vpod2): classifier [pod ofport 1] -> spoof guard [pod ofport 1] -> L3 forwarding [peer 10.244.2.0/24] -> L2 forwarding -> output',
    );
    const p = hop(r, 'pipeline').evidence;
    assert.deepEqual([p.bridge, p.datapath, p.runDir, p.entry, p.inPort, p.inPortName, p.flow, p.error], ['br-int', 'netdev', '/var/run/openvswitch', 'pod', 1, 'vpod2', CAPTURE.cases['pod-to-remote'], null]);
    assert.equal(p.trace, fixture('pod-to-remote'), 'the raw trace is kept as evidence');
    assert.deepEqual(p.tables[2], {
      table: 30,
      name: 'L3 forwarding',
      match: 'ip,reg0=0x3/0xf,nw_dst=10.244.2.0/24',
      priority: 200,
      cookie: '0x102000af40200',
      owner: 'peer 10.244.2.0/24',
      actions: ['set_field:0a:58:0a:f4:01:01->eth_src', 'set_field:aa:bb:cc:dd:ee:ff->eth_dst', 'set_field:10.250.0.2->tun_dst', 'set_field:0x1->tun_id', 'dec_ttl', 'goto_table:40'],
      recirc: null,
    });
    assert.equal(hop(r, 'spoofguard').summary, '10.244.1.2 from 0a:58:0a:f4:01:02 on vpod2 (ofport 1) passes: the address and MAC of its pod');
    assert.deepEqual(hop(r, 'spoofguard').evidence, { inPort: 1, port: 'vpod2', verdict: 'pass', allowedIP: '10.244.1.2', allowedMac: '0a:58:0a:f4:01:02', src: '10.244.1.2', srcMac: '0a:58:0a:f4:01:02' });
    assert.equal(hop(r, 'ovs-output').summary, 'into the tunnel weft-tun0 (ofport 32768): tun_dst 10.250.0.2, vni 1: the public IP of lease 10.244.2.0/24; tunneling to 10.250.0.2 via br-phy');
    assert.deepEqual(hop(r, 'ovs-output').evidence, {
      action: 'tunnel',
      outputPort: 32768,
      outputPortName: 'weft-tun0',
      droppedIn: null,
      tunnelDst: '10.250.0.2',
      vni: 1,
      lease: '10.244.2.0/24',
      expectedTunnelDst: '10.250.0.2',
      expectedVni: 1,
      tunnelMatchesLease: true,
      tunnelNotes: ['output to native tunnel', 'tunneling to 10.250.0.2 via br-phy', TUNNEL_FROM],
    });
  });

  it('reports a tunnel to a public IP other than the lease\'s (a stale peer flow)', () => {
    const leases = [LEASES[0]!, lease('10.244.2.0/24', '10.250.0.7'), lease('10.244.9.0/24', '10.250.0.2')];
    const r = checked(facts({ ...POD_TO_REMOTE, leases }));
    assert.equal(r.verdict, 'broken');
    const out = hop(r, 'ovs-output');
    assert.equal(out.status, 'broken');
    assert.equal(out.summary, "into the tunnel weft-tun0 (ofport 32768): tun_dst 10.250.0.2, vni 1, but lease 10.244.2.0/24 is at 10.250.0.7 (10.250.0.2 is lease 10.244.9.0/24's node)");
    assert.deepEqual([out.evidence.tunnelMatchesLease, out.evidence.expectedTunnelDst], [false, '10.250.0.7']);
    assert.deepEqual(r.problems, [`ovs-output: ${out.summary}`]);
  });

  it('remote pod -> local pod: out of the tunnel to the pod\'s port (no spoof guard on the tunnel)', () => {
    const r = checked(facts({ fixture: 'remote-to-pod', src: '10.244.2.5', dst: '10.244.1.2', route: route('10.244.1.0/24', null, 'weft-gw0', { protocol: 'kernel' }) }));
    assert.equal(r.verdict, 'ok');
    assert.deepEqual(statuses(r), ['source:ok', 'pipeline:ok', 'ovs-output:ok']);
    assert.equal(hop(r, 'source').summary, '10.244.2.5 is a pod of lease 10.244.2.0/24 (node 10.250.0.2), enters br-int from the tunnel weft-tun0 (VXLAN from 10.250.0.2)');
    assert.equal(hop(r, 'pipeline').summary, 'br-int in_port 32768 (weft-tun0): classifier -> L3 forwarding [pod ofport 1] -> L2 forwarding [pod ofport 1] -> output');
    assert.equal(hop(r, 'ovs-output').summary, 'to vpod2 (ofport 1), the port of pod 10.244.1.2');
  });

  it('a pod sending from an address it was not given: dropped by the spoof guard', () => {
    const r = checked(facts({ fixture: 'spoofed', src: '10.244.1.99', dst: '10.244.2.5', route: TO_PEER_ROUTE }));
    assert.equal(r.verdict, 'broken');
    assert.equal(exitCodeOf(r), 1);
    assert.deepEqual(statuses(r), ['source:ok', 'pipeline:ok', 'spoofguard:broken']);
    assert.equal(
      hop(r, 'pipeline').summary,
      'br-int in_port 1 (vpod2): classifier [pod ofport 1] -> spoof guard; no pod port has 10.244.1.99: traced as sent by vpod2 (ofport 1, pod 10.244.1.2)',
    );
    assert.equal(hop(r, 'source').summary, "10.244.1.99 is in this node's subnet 10.244.1.0/24 but no pod port on br-int has it, enters br-int on pod port vpod2 (ofport 1)");
    assert.equal(hop(r, 'spoofguard').summary, 'dropped: vpod2 (ofport 1) may send only from its pod\'s 10.244.1.2 / 0a:58:0a:f4:01:02, not from 10.244.1.99 (a pod using an address it was not given)');
    assert.deepEqual(hop(r, 'spoofguard').evidence, { inPort: 1, port: 'vpod2', verdict: 'drop', allowedIP: '10.244.1.2', allowedMac: '0a:58:0a:f4:01:02', src: '10.244.1.99', srcMac: '0a:58:0a:f4:01:02' });
  });

  it('host -> remote pod: the kernel route via the peer gateway on weft-gw0, then the bridge into the tunnel', () => {
    const r = checked(facts({ fixture: 'host-to-remote', src: '10.244.1.1', dst: '10.244.2.5', route: TO_PEER_ROUTE }));
    assert.equal(r.verdict, 'ok', r.problems.join('\n'));
    assert.deepEqual(statuses(r), ['source:ok', 'route:ok', 'nexthop:info', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:ok', 'masquerade:ok']);
    assert.equal(hop(r, 'route').summary, '10.244.2.0/24 via 10.244.2.1 dev weft-gw0 onlink proto 88: lease 10.244.2.0/24 of node 10.250.0.2');
    assert.equal(hop(r, 'nexthop').summary, `next hop 10.244.2.1 on weft-gw0 (gateway of lease 10.244.2.0/24): not resolved yet (ARP/ND on the first packet; the bridge's ARP responder answers ${VMAC})`);
    assert.equal(hop(r, 'pipeline').summary.split('; ')[1], `no neighbour entry for 10.244.2.1 on weft-gw0 yet: traced with ${VMAC}, what the ARP responder answers for a peer's gateway`);
    assert.equal(hop(r, 'spoofguard').summary, 'from the gateway port weft-gw0 (ofport 32769): the host may send from any address');
    assert.equal(hop(r, 'ovs-output').summary, 'into the tunnel weft-tun0 (ofport 32768): tun_dst 10.250.0.2, vni 1: the public IP of lease 10.244.2.0/24; tunneling to 10.250.0.2 via br-phy');
    // 10.244.1.1 is the gateway address, inside the network: pod-to-pod rules keep it.
    assert.equal(hop(r, 'masquerade').evidence.rule, 2);
  });

  it('reports a wrong route; a stale neighbour for the peer gateway does not matter (the peer flow rewrites the MAC)', () => {
    const wrong = checked(facts({ fixture: null, src: '10.244.1.1', dst: '10.244.2.5', route: route('10.244.2.0/24', '10.250.0.2', 'br-phy') }));
    assert.equal(hop(wrong, 'route').summary, "10.244.2.0/24 via 10.250.0.2 dev br-phy proto 88: the route does not lead to lease 10.244.2.0/24's node 10.250.0.2; expected 10.244.2.0/24 via 10.244.2.1 dev weft-gw0 onlink");
    assert.deepEqual(statuses(wrong), ['source:ok', 'route:broken']);
    const stale = checked(facts({ fixture: 'host-stale-neighbour', src: '10.244.1.1', dst: '10.244.2.5', route: TO_PEER_ROUTE, neighbours: [neigh(4, '10.244.2.1', '0e:00:00:00:00:99', NUD.STALE)] }));
    assert.equal(stale.verdict, 'ok', stale.problems.join('\n'));
    assert.equal(hop(stale, 'nexthop').summary, 'next hop 10.244.2.1 on weft-gw0 (gateway of lease 10.244.2.0/24): lladdr 0e:00:00:00:00:99 STALE');
    assert.equal(hop(stale, 'ovs-output').evidence.tunnelDst, '10.250.0.2');
    assert.equal(hop(stale, 'pipeline').evidence.tables[2]!.actions[1], `set_field:${VMAC}->eth_dst`);
  });

  it('local pod -> outside: the bridge hands it to the host, which routes and masquerades it', () => {
    const r = checked(facts({ fixture: 'pod-to-external', src: '10.244.1.2', dst: '203.0.113.10', route: route('0.0.0.0/0', '10.250.0.254', 'br-phy', { protocol: 'boot' }) }));
    assert.equal(r.verdict, 'ok', r.problems.join('\n'));
    assert.deepEqual(statuses(r), ['source:ok', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:ok', 'route:ok', 'nexthop:info', 'mtu:ok', 'masquerade:ok', 'forward:ok']);
    assert.equal(hop(r, 'ovs-output').summary, 'to the host through weft-gw0 (ofport 32769): the kernel routes it on');
    assert.equal(hop(r, 'route').summary, 'default via 10.250.0.254 dev br-phy proto boot: leaves the cluster network');
    assert.equal(hop(r, 'masquerade').evidence.verdict, 'MASQUERADE');
    assert.equal(hop(r, 'masquerade').evidence.toSource, '10.250.0.1');
  });

  it('a lease without flows on the bridge: to the host instead of the tunnel', () => {
    const r = checked(facts({ fixture: 'pod-to-unknown-peer', src: '10.244.1.2', dst: '10.244.4.5', route: route('10.244.4.0/24', '10.244.4.1', 'weft-gw0', { onlink: true }) }));
    assert.deepEqual(statuses(r), ['source:ok', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:broken']);
    assert.equal(hop(r, 'ovs-output').summary, 'to the host through weft-gw0 (ofport 32769): br-int has no flow for lease 10.244.4.0/24 (node 10.250.0.4), so the packet goes to the host instead of into the tunnel');
    assert.equal(hop(r, 'pipeline').summary, 'br-int in_port 1 (vpod2): classifier [pod ofport 1] -> spoof guard [pod ofport 1] -> L3 forwarding -> L2 forwarding -> output');
  });

  it('a peer whose node does not answer ARP: the native tunnel loses the packet', () => {
    const r = checked(facts({ fixture: 'pod-to-unresolved', src: '10.244.1.2', dst: '10.244.3.5', route: route('10.244.3.0/24', '10.244.3.1', 'weft-gw0', { onlink: true }) }));
    const out = hop(r, 'ovs-output');
    assert.equal(out.status, 'warning');
    assert.equal(out.summary, 'into the tunnel weft-tun0 (ofport 32768): tun_dst 10.250.0.9, vni 1: the public IP of lease 10.244.3.0/24; neighbor cache miss for 10.250.0.9 on bridge br-phy, sending ARP request (this packet is lost; the next one goes out once the node answers)');
    assert.equal(r.verdict, 'ok');
  });

  it('local pod -> local pod, host -> local pod: to the destination pod\'s port', () => {
    const pp = checked(facts({ fixture: 'pod-to-pod', src: '10.244.1.2', dst: '10.244.1.3', route: route('10.244.1.0/24', null, 'weft-gw0', { protocol: 'kernel' }) }));
    assert.deepEqual(statuses(pp), ['source:ok', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:ok']);
    assert.equal(hop(pp, 'ovs-output').summary, `to ${VPOD3.name} (ofport 2), the port of pod 10.244.1.3`);
    const hp = checked(facts({ fixture: 'host-to-pod', src: '10.244.1.1', dst: '10.244.1.2', route: route('10.244.1.0/24', null, 'weft-gw0', { protocol: 'kernel' }) }));
    assert.equal(hp.verdict, 'ok', hp.problems.join('\n'));
    assert.deepEqual(statuses(hp), ['source:ok', 'route:ok', 'pipeline:ok', 'spoofguard:ok', 'ovs-output:ok', 'masquerade:ok']);
    assert.equal(hop(hp, 'ovs-output').summary, `to ${VPOD2.name} (ofport 1), the port of pod 10.244.1.2`);
  });

  it('OVS not reachable: a broken hop that says so, not a crash', () => {
    const msg = new OvsUnreachableError('/var/run/openvswitch/db.sock', 'ovs-vsctl', 'ovs-vsctl: unix:/var/run/openvswitch/db.sock: database connection failed (No such file or directory)').message;
    const r = checked(facts({ ...POD_TO_REMOTE, fixture: null, ovsError: msg }));
    assert.equal(r.verdict, 'broken');
    assert.deepEqual(statuses(r), ['source:ok', 'pipeline:broken']);
    assert.equal(hop(r, 'pipeline').summary, `cannot trace the packet through br-int: ${msg}`);
    assert.equal(hop(r, 'pipeline').evidence.error, msg);
    assert.match(renderTrace(r), /^ {2}BROKEN {6}pipeline {3}cannot trace the packet through br-int: ovs-vsctl via \/var\/run\/openvswitch\/db\.sock: Open vSwitch is not reachable/m);
  });
});
