import assert from 'node:assert/strict';
import { analyze } from '../../src/cli/trace/analyze.js';
import { exitCodeOf, parsePacket, TraceArgumentError } from '../../src/cli/trace/command.js';
import { renderTrace } from '../../src/cli/trace/render.js';
import type { Hop, HopKind, RouteLookup, TraceFacts, TraceReport } from '../../src/cli/trace/types.js';
import { chainLines, jumpSpec } from '../../src/ipmasq/iptables.js';
import { defaultAgentConfig } from '../../src/ipmasq/agent-config.js';
import { agentRules, LINK_LOCAL, type AgentMasq } from '../../src/ipmasq/agent-rules.js';
import { forwardRules, masqRules } from '../../src/ipmasq/model.js';
import { ruleExpr } from '../../src/ipmasq/nftables.js';
import { NUD, type FdbEntry, type LinkInfo, type NeighEntry } from '../../src/netlink/index.js';
import type { Lease } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { validate } from '../fixtures/trace/validate.js';

const NETWORK = IPNet.parse('10.5.0.0/16');
const SUBNET = IPNet.parse('10.5.1.0/24');
const MAC1 = '0e:00:00:00:00:01';
const MAC2 = '0e:00:00:00:00:02';
const MAC3 = '0e:00:00:00:00:03';

function lease(subnet: string, publicIP: string, mac: string, backendType = 'vxlan'): Lease {
  return {
    subnet: IPNet.parse(subnet),
    ipv6Subnet: null,
    attrs: { publicIP: IPAddr.parse(publicIP), publicIPv6: null, backendType, backendData: backendType === 'vxlan' ? { VNI: 1, VtepMAC: mac } : null },
    reservation: false,
    expiration: null,
  };
}

function link(index: number, name: string, mtu: number, kind: string | null, mac: string | null = null): LinkInfo {
  return {
    index,
    name,
    mtu,
    mac,
    adminUp: true,
    operState: 'UP',
    kind,
    vxlan: kind === 'vxlan' ? { vni: 1, local: IPAddr.parse('10.250.0.1'), link: 2, port: 8472, learning: false, gbp: false } : null,
  };
}

function route(prefix: string, gateway: string | null, device: string, extra: Partial<Extract<RouteLookup, { ok: true }>> = {}): RouteLookup {
  return {
    ok: true,
    type: 'unicast',
    prefix: IPNet.parse(prefix),
    gateway: gateway ? IPAddr.parse(gateway) : null,
    device,
    protocol: '88',
    onlink: false,
    nexthopId: null,
    prefsrc: null,
    table: null,
    ...extra,
  };
}

function neigh(ifindex: number, ip: string, mac: string | null, state: number): NeighEntry {
  return { ifindex, ip: IPAddr.parse(ip), mac, state, permanent: state === NUD.PERMANENT };
}

const fdbEntry = (mac: string, dst: string): FdbEntry => ({ ifindex: 4, mac, dst: IPAddr.parse(dst), self: true, permanent: true });

function natSave(before: string[] = [], withWeft = true): string {
  const spec = { family: 4 as const, kind: 'masq' as const, rules: masqRules(NETWORK, SUBNET, IPNet.parse('224.0.0.0/4'), true) };
  return ['*nat', ':POSTROUTING ACCEPT [0:0]', ...(withWeft ? [':FLANNEL-POSTRTG - [0:0]'] : []), ...before, ...(withWeft ? [`-A POSTROUTING ${jumpSpec('masq')}`, ...chainLines(spec)] : []), 'COMMIT'].join('\n');
}

function filterSave(): string {
  const spec = { family: 4 as const, kind: 'forward' as const, rules: forwardRules(NETWORK) };
  return ['*filter', ':FORWARD ACCEPT [0:0]', ':FLANNEL-FWD - [0:0]', `-A FORWARD ${jumpSpec('forward')}`, ...chainLines(spec), 'COMMIT'].join('\n');
}

const LINKS = [link(1, 'lo', 65536, null), link(2, 'eth0', 1500, 'veth'), link(4, 'flannel.1', 1450, 'vxlan', MAC1), link(5, 'cni0', 1450, 'bridge')];

/** Node 1 of a healthy vxlan cluster, tracing its pod 10.5.1.2 to a pod of node 2. */
function facts(over: Partial<TraceFacts> = {}): TraceFacts {
  return {
    packet: parsePacket('10.5.1.2', '10.5.2.3', 'icmp', null),
    subnetFile: '/run/flannel/subnet.env',
    env: { network: NETWORK, subnet: SUBNET, ipv6Network: null, ipv6Subnet: null, mtu: 1450, ipMasq: true, ipMasqMode: null, backend: null, ovsBridge: null, ovsRunDir: null, ovsDatapath: null },
    config: { network: NETWORK, ipv6Network: null, backendType: 'vxlan', enableNFTables: false },
    daemonBackend: 'vxlan',
    leases: [lease('10.5.1.0/24', '10.250.0.1', MAC1), lease('10.5.2.0/24', '10.250.0.2', MAC2)],
    leaseSource: 'etcd',
    addresses: [
      { ifindex: 1, ip: IPAddr.parse('127.0.0.1') },
      { ifindex: 2, ip: IPAddr.parse('10.250.0.1') },
      { ifindex: 4, ip: IPAddr.parse('10.5.1.0') },
      { ifindex: 5, ip: IPAddr.parse('10.5.1.1') },
    ],
    links: LINKS,
    ingress: 'cni0',
    route: route('10.5.2.0/24', '10.5.2.0', 'flannel.1', { onlink: true, nexthopId: 1459617792 }),
    neighbours: [neigh(4, '10.5.2.0', MAC2, NUD.PERMANENT)],
    fdb: [fdbEntry(MAC2, '10.250.0.2')],
    underlay: new Map([['10.250.0.2', route('10.250.0.0/24', null, 'eth0', { protocol: 'kernel', prefsrc: IPAddr.parse('10.250.0.1') })]]),
    bridge: LINKS[3]!,
    rules: { mode: 'iptables', modeSource: 'daemon', iptablesNat: natSave(), iptablesFilter: filterSave(), nft: null, forwardRules: true, errors: [] },
    ipForward: true,
    ovs: null,
    policy: null,
    notes: [],
    ...over,
  };
}

function hop<K extends HopKind>(r: TraceReport, kind: K): Extract<Hop, { kind: K }> {
  const h = r.hops.find((x) => x.kind === kind);
  assert.ok(h, `no ${kind} hop in ${r.hops.map((x) => x.kind).join(',')}`);
  return h as Extract<Hop, { kind: K }>;
}

function statuses(r: TraceReport): string[] {
  return r.hops.map((h) => `${h.kind}:${h.status}`);
}

function checkSchema(r: TraceReport): void {
  assert.deepEqual(validate(JSON.parse(JSON.stringify(r))), []);
}

describe('trace analysis: vxlan', () => {
  it('names the route, neighbour, FDB entry and public IP of a remote pod', () => {
    const r = analyze(facts());
    checkSchema(r);
    assert.equal(r.verdict, 'ok');
    assert.equal(exitCodeOf(r), 0);
    assert.deepEqual(statuses(r), ['source:ok', 'route:ok', 'neighbour:ok', 'fdb:ok', 'underlay:ok', 'mtu:ok', 'masquerade:ok', 'forward:ok']);
    assert.equal(hop(r, 'source').summary, '10.5.1.2 is a pod of this node (lease 10.5.1.0/24), enters on cni0');
    assert.equal(hop(r, 'route').summary, '10.5.2.0/24 nhid 1459617792 via 10.5.2.0 dev flannel.1 onlink proto 88: lease 10.5.2.0/24 of node 10.250.0.2');
    assert.deepEqual(hop(r, 'route').evidence, {
      destination: '10.5.2.3',
      destinationClass: 'remote-pod',
      lease: '10.5.2.0/24',
      leasePublicIP: '10.250.0.2',
      type: 'unicast',
      prefix: '10.5.2.0/24',
      gateway: '10.5.2.0',
      device: 'flannel.1',
      protocol: '88',
      weftOwned: true,
      nexthopId: 1459617792,
      onlink: true,
      expected: null,
    });
    assert.equal(hop(r, 'neighbour').summary, `10.5.2.0 lladdr ${MAC2} PERMANENT on flannel.1: the VtepMAC of lease 10.5.2.0/24`);
    assert.equal(hop(r, 'fdb').summary, `${MAC2} dst 10.250.0.2 on flannel.1 (vni 1, port 8472): public IP of lease 10.5.2.0/24`);
    assert.deepEqual(hop(r, 'fdb').evidence, { device: 'flannel.1', mac: MAC2, remoteIP: '10.250.0.2', vni: 1, port: 8472, lease: '10.5.2.0/24', expectedRemoteIP: '10.250.0.2' });
    assert.equal(hop(r, 'underlay').summary, 'VXLAN packet to 10.250.0.2:8472 leaves dev eth0 from 10.250.0.1');
    assert.equal(hop(r, 'mtu').summary, 'MTU cni0 1450, flannel.1 1450, eth0 1500 (subnet.env 1450): consistent');
    assert.equal(
      hop(r, 'masquerade').summary,
      'not masqueraded: rule 2 of FLANNEL-POSTRTG returns: -A FLANNEL-POSTRTG -s 10.5.1.0/24 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j RETURN (live: present)',
    );
    const m = hop(r, 'masquerade').evidence;
    assert.deepEqual([m.verdict, m.rule, m.live, m.liveVerdict, m.liveChain, m.liveRule], ['RETURN', 2, 'present', 'RETURN', 'FLANNEL-POSTRTG', 2]);
    assert.equal(hop(r, 'forward').summary, 'accepted by rule 1 of FLANNEL-FWD: -A FLANNEL-FWD -s 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT (live: present)');
    assert.deepEqual(r.node, { subnet: '10.5.1.0/24', network: '10.5.0.0/16', publicIP: '10.250.0.1', backend: 'vxlan', leaseSource: 'etcd', subnetFile: '/run/flannel/subnet.env' });
  });

  it('reports a missing neighbour entry as broken, with the MAC the lease publishes', () => {
    const r = analyze(facts({ neighbours: [] }));
    checkSchema(r);
    assert.equal(r.verdict, 'broken');
    assert.equal(exitCodeOf(r), 1);
    assert.equal(hop(r, 'neighbour').status, 'broken');
    assert.equal(
      hop(r, 'neighbour').summary,
      `no neighbour entry for 10.5.2.0 on flannel.1: the inner frame has no destination MAC and the packet is dropped (lease 10.5.2.0/24 publishes VtepMAC ${MAC2}; weftd re-adds it on its next reconcile)`,
    );
    // The FDB is still checked for the lease's MAC.
    assert.equal(hop(r, 'fdb').status, 'ok');
    assert.deepEqual(r.problems, [`neighbour: ${hop(r, 'neighbour').summary}`]);
  });

  it('reports a neighbour with a MAC other than the lease\'s', () => {
    const r = analyze(facts({ neighbours: [neigh(4, '10.5.2.0', MAC3, NUD.PERMANENT)], fdb: [fdbEntry(MAC3, '10.250.0.2')] }));
    assert.equal(hop(r, 'neighbour').status, 'broken');
    assert.equal(hop(r, 'neighbour').summary, `10.5.2.0 lladdr ${MAC3} on flannel.1, but lease 10.5.2.0/24 publishes VtepMAC ${MAC2}`);
  });

  it('reports a missing FDB entry as broken and stops before the underlay', () => {
    const r = analyze(facts({ fdb: [] }));
    checkSchema(r);
    assert.equal(hop(r, 'fdb').status, 'broken');
    assert.equal(
      hop(r, 'fdb').summary,
      `no FDB entry for ${MAC2} on flannel.1 (vni 1, port 8472): the kernel does not know which node to send the VXLAN packet to (lease 10.5.2.0/24 is at 10.250.0.2)`,
    );
    assert.deepEqual(hop(r, 'fdb').evidence, { device: 'flannel.1', mac: MAC2, remoteIP: null, vni: 1, port: 8472, lease: null, expectedRemoteIP: '10.250.0.2' });
    assert.ok(!r.hops.some((h) => h.kind === 'underlay'));
  });

  it('reports an FDB entry pointing at a public IP no lease has', () => {
    const r = analyze(facts({ fdb: [fdbEntry(MAC2, '10.250.0.9')], underlay: new Map() }));
    assert.equal(hop(r, 'fdb').status, 'broken');
    assert.equal(hop(r, 'fdb').summary, `${MAC2} dst 10.250.0.9 on flannel.1 (vni 1, port 8472): no lease has public IP 10.250.0.9 (a stale entry of a node that left?)`);
  });

  it('reports an FDB entry pointing at another lease\'s node', () => {
    const leases = [...facts().leases, lease('10.5.3.0/24', '10.250.0.3', MAC3)];
    const r = analyze(facts({ leases, fdb: [fdbEntry(MAC2, '10.250.0.3')] }));
    assert.equal(hop(r, 'fdb').summary, `${MAC2} dst 10.250.0.3 on flannel.1 (vni 1, port 8472) points at the node of lease 10.5.3.0/24, but lease 10.5.2.0/24 is at 10.250.0.2`);
  });

  it('does not judge ownership when no leases could be read', () => {
    const r = analyze(facts({ leases: [], leaseSource: 'none', fdb: [fdbEntry(MAC2, '10.250.0.9')], underlay: new Map() }));
    checkSchema(r);
    assert.equal(hop(r, 'route').status, 'info');
    assert.equal(hop(r, 'fdb').status, 'info');
    assert.equal(r.verdict, 'ok');
  });

  it('reports an MTU mismatch between cni0 and the VXLAN device', () => {
    const bridge = link(5, 'cni0', 1500, 'bridge');
    const r = analyze(facts({ bridge, links: [...LINKS.slice(0, 3), bridge] }));
    assert.equal(hop(r, 'mtu').status, 'broken');
    assert.equal(hop(r, 'mtu').summary, 'MTU mismatch: cni0 MTU 1500 > flannel.1 MTU 1450; pods send packets flannel.1 cannot carry');
    assert.deepEqual(hop(r, 'mtu').evidence, { bridge: 'cni0', bridgeMtu: 1500, device: 'flannel.1', deviceMtu: 1450, underlay: 'eth0', underlayMtu: 1500, subnetEnvMtu: 1450 });
  });

  it('reports a VXLAN device too large for the underlay and a subnet.env MTU above it', () => {
    const dev = link(4, 'flannel.1', 1480, 'vxlan', MAC1);
    const bridge = link(5, 'cni0', 1400, 'bridge');
    const r = analyze(facts({ links: [LINKS[0]!, LINKS[1]!, dev, bridge], bridge, env: { ...facts().env!, mtu: 1500 } }));
    assert.equal(
      hop(r, 'mtu').summary,
      'flannel.1 MTU 1480 + 50 bytes of VXLAN exceeds eth0 MTU 1500; subnet.env FLANNEL_MTU=1500 > flannel.1 MTU 1480: new pods get too large an MTU',
    );
  });

  it('reports a missing route for a peer\'s subnet and what the packet follows instead', () => {
    const r = analyze(facts({ route: route('0.0.0.0/0', '10.250.0.254', 'eth0', { protocol: 'boot' }) }));
    checkSchema(r);
    assert.equal(hop(r, 'route').status, 'broken');
    assert.equal(
      hop(r, 'route').summary,
      'default via 10.250.0.254 dev eth0 proto boot: no route for lease 10.5.2.0/24 (node 10.250.0.2): the packet follows default via 10.250.0.254 dev eth0 proto boot instead; expected 10.5.2.0/24 via 10.5.2.0 dev flannel.<VNI> onlink or 10.5.2.0/24 via 10.250.0.2 (DirectRouting)',
    );
    assert.deepEqual(r.hops.map((h) => h.kind), ['source', 'route']);
  });

  it('reports no route at all', () => {
    const r = analyze(facts({ route: { ok: false, error: 'RTNETLINK answers: Network is unreachable' } }));
    checkSchema(r);
    assert.deepEqual(statuses(r), ['source:ok', 'route:broken']);
    assert.equal(hop(r, 'route').summary, 'no route to 10.5.2.3: RTNETLINK answers: Network is unreachable');
  });

  it('reports forwarding switched off for a forwarded packet', () => {
    const r = analyze(facts({ ipForward: false }));
    assert.equal(hop(r, 'source').status, 'broken');
    assert.match(hop(r, 'source').summary, /IP forwarding is off on this node/);
  });

  it('stops at local delivery', () => {
    const r = analyze(facts({ packet: parsePacket('10.5.2.3', '10.5.1.1', 'icmp', null), ingress: 'flannel.1', route: route('10.5.1.1/32', null, 'cni0', { type: 'local', protocol: 'kernel' }) }));
    checkSchema(r);
    assert.deepEqual(statuses(r), ['source:ok', 'route:ok']);
    assert.equal(hop(r, 'route').summary, 'local 10.5.1.1/32 dev cni0 proto kernel: delivered to this node');
    assert.equal(hop(r, 'source').summary, '10.5.2.3 is a pod of lease 10.5.2.0/24 (node 10.250.0.2), enters on flannel.1');
  });
});

describe('trace analysis: masquerade', () => {
  const outside = () =>
    facts({
      packet: parsePacket('10.5.1.2', '203.0.113.5', 'tcp', 443),
      route: route('0.0.0.0/0', '10.250.0.254', 'eth0', { protocol: 'boot' }),
      neighbours: [neigh(2, '10.250.0.254', '0e:ff:00:00:00:fe', NUD.REACHABLE)],
      fdb: [],
      underlay: new Map(),
    });

  it('masquerades a pod leaving the cluster, naming the rule and the live rule', () => {
    const r = analyze(outside());
    checkSchema(r);
    assert.equal(r.verdict, 'ok');
    assert.deepEqual(statuses(r), ['source:ok', 'route:ok', 'nexthop:ok', 'mtu:ok', 'masquerade:ok', 'forward:ok']);
    assert.equal(hop(r, 'route').summary, 'default via 10.250.0.254 dev eth0 proto boot: leaves the cluster network');
    assert.equal(hop(r, 'nexthop').summary, 'next hop 10.250.0.254 on eth0: lladdr 0e:ff:00:00:00:fe REACHABLE');
    const rule5 = '-A FLANNEL-POSTRTG -s 10.5.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully';
    assert.equal(hop(r, 'masquerade').summary, `masqueraded to 10.250.0.1 by rule 5 of FLANNEL-POSTRTG: ${rule5} (live: present)`);
    assert.deepEqual(hop(r, 'masquerade').evidence, {
      mode: 'iptables',
      ipMasqMode: 'flannel',
      nonMasqueradeCIDRs: null,
      matchedCIDR: null,
      enabled: true,
      verdict: 'MASQUERADE',
      chain: 'FLANNEL-POSTRTG',
      rule: 5,
      ruleText: rule5,
      live: 'present',
      liveProblems: [],
      liveVerdict: 'MASQUERADE',
      liveChain: 'FLANNEL-POSTRTG',
      liveRule: 5,
      liveRuleText: rule5,
      unevaluated: [],
      toSource: '10.250.0.1',
    });
  });

  it('flags a foreign rule that would hide a pod IP inside the cluster', () => {
    const foreign = '-A POSTROUTING -s 10.5.0.0/16 -o flannel.1 -j MASQUERADE';
    const r = analyze(facts({ rules: { ...facts().rules, iptablesNat: natSave([foreign]) } }));
    checkSchema(r);
    const m = hop(r, 'masquerade');
    assert.equal(m.status, 'broken');
    assert.equal(
      m.summary,
      'not masqueraded: rule 2 of FLANNEL-POSTRTG returns: -A FLANNEL-POSTRTG -s 10.5.1.0/24 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j RETURN (live: present); ' +
        `masquerade would hide pod IP 10.5.1.2 from 10.5.2.3 inside the cluster (rule 1 of POSTROUTING: ${foreign}); ` +
        `the model says no masquerade but the live rules masquerade (rule 1 of POSTROUTING: ${foreign})`,
    );
    assert.deepEqual([m.evidence.liveVerdict, m.evidence.liveChain, m.evidence.liveRule], ['MASQUERADE', 'POSTROUTING', 1]);
  });

  it('reports weft\'s chain missing from the live rules', () => {
    const r = analyze(facts({ rules: { ...facts().rules, iptablesNat: natSave([], false) } }));
    const m = hop(r, 'masquerade');
    assert.equal(m.status, 'broken');
    assert.equal(m.evidence.live, 'missing');
    assert.deepEqual(m.evidence.liveProblems, ['FLANNEL-POSTRTG: chain missing', 'POSTROUTING: jump to FLANNEL-POSTRTG missing']);
  });

  it('says masquerade is off when subnet.env says so', () => {
    const r = analyze(facts({ env: { ...facts().env!, ipMasq: false }, rules: { ...facts().rules, iptablesNat: natSave([], false) } }));
    checkSchema(r);
    assert.equal(hop(r, 'masquerade').status, 'ok');
    assert.equal(hop(r, 'masquerade').summary, 'masquerade is off (FLANNEL_IPMASQ=false)');
    assert.equal(hop(r, 'masquerade').evidence.live, 'not-applicable');
    // weft's chain left behind while masquerade is off is worth a warning.
    const left = analyze(facts({ env: { ...facts().env!, ipMasq: false } }));
    assert.equal(hop(left, 'masquerade').status, 'warning');
    assert.equal(
      hop(left, 'masquerade').summary,
      "masquerade is off (FLANNEL_IPMASQ=false), but weft's masquerade rules are still there (FLANNEL-POSTRTG: present although not wanted)",
    );
  });

  it('evaluates weft\'s nftables table in nftables mode', () => {
    const rules = masqRules(NETWORK, SUBNET, IPNet.parse('224.0.0.0/4'), true);
    const fwd = forwardRules(NETWORK);
    const nft = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6', json_schema_version: 1 } },
        { table: { family: 'ip', name: 'flannel-ipv4', handle: 1 } },
        { chain: { family: 'ip', table: 'flannel-ipv4', name: 'postrtg', handle: 1, type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } },
        { chain: { family: 'ip', table: 'flannel-ipv4', name: 'forward', handle: 2, type: 'filter', hook: 'forward', prio: 0, policy: 'accept' } },
        ...rules.map((r) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'postrtg', expr: ruleExpr(4, r) } })),
        ...fwd.map((r) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'forward', expr: ruleExpr(4, r) } })),
      ],
    });
    const base = outside();
    const r = analyze({ ...base, rules: { mode: 'nftables', modeSource: 'daemon', iptablesNat: '*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n', iptablesFilter: null, nft, forwardRules: true, errors: [] } });
    checkSchema(r);
    assert.equal(r.verdict, 'ok');
    const m = hop(r, 'masquerade');
    assert.equal(m.summary, 'masqueraded to 10.250.0.1 by rule 5 of ip flannel-ipv4 postrtg: ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random (live: present)');
    assert.deepEqual([m.evidence.liveVerdict, m.evidence.liveChain, m.evidence.liveRule], ['MASQUERADE', 'ip flannel-ipv4 postrtg', 5]);
    assert.equal(hop(r, 'forward').summary, 'accepted by rule 1 of ip flannel-ipv4 forward: ip saddr 10.5.0.0/16 accept (live: present)');
  });
});

describe('trace analysis: IPv6', () => {
  it('follows the IPv6 family: flannel-v6 device, backendV6Data MAC, ip6tables rules', () => {
    const net6 = IPNet.parse('fd05::/32');
    const sub6 = IPNet.parse('fd05:0:1::/64');
    const v6lease = (sub4: string, sub: string, pub4: string, pub6: string, mac: string): Lease => ({
      ...lease(sub4, pub4, MAC1),
      ipv6Subnet: IPNet.parse(sub),
      attrs: { ...lease(sub4, pub4, MAC1).attrs, publicIPv6: IPAddr.parse(pub6), backendV6Data: { VNI: 1, VtepMAC: mac } },
    });
    const dev6: LinkInfo = { ...link(6, 'flannel-v6.1', 1430, 'vxlan', MAC1), vxlan: { vni: 1, local: IPAddr.parse('fd50::1'), link: 2, port: 8472, learning: false, gbp: false } };
    const spec = { family: 6 as const, kind: 'masq' as const, rules: masqRules(net6, sub6, IPNet.parse('ff00::/8'), true) };
    // Dual stack: pods get the smaller of the two device MTUs.
    const bridge = link(5, 'cni0', 1430, 'bridge');
    const nat6 = ['*nat', ':POSTROUTING ACCEPT [0:0]', ':FLANNEL-POSTRTG - [0:0]', `-A POSTROUTING ${jumpSpec('masq')}`, ...chainLines(spec), 'COMMIT'].join('\n');
    const r = analyze(
      facts({
        packet: parsePacket('fd05:0:1::2', 'fd05:0:2::2', 'udp', 53),
        env: { ...facts().env!, ipv6Network: net6, ipv6Subnet: sub6, mtu: 1430 },
        bridge,
        leases: [v6lease('10.5.1.0/24', 'fd05:0:1::/64', '10.250.0.1', 'fd50::1', MAC1), v6lease('10.5.2.0/24', 'fd05:0:2::/64', '10.250.0.2', 'fd50::2', MAC3)],
        addresses: [...facts().addresses, { ifindex: 2, ip: IPAddr.parse('fd50::1') }, { ifindex: 6, ip: IPAddr.parse('fd05:0:1::') }, { ifindex: 5, ip: IPAddr.parse('fd05:0:1::1') }],
        links: [...LINKS.slice(0, 3), bridge, dev6],
        route: route('fd05:0:2::/64', 'fd05:0:2::', 'flannel-v6.1', { onlink: true }),
        neighbours: [neigh(6, 'fd05:0:2::', MAC3, NUD.PERMANENT)],
        fdb: [{ ifindex: 6, mac: MAC3, dst: IPAddr.parse('fd50::2'), self: true, permanent: true }],
        underlay: new Map([['fd50::2', route('fd50::/64', null, 'eth0', { protocol: 'kernel', prefsrc: IPAddr.parse('fd50::1') })]]),
        rules: { ...facts().rules, iptablesNat: nat6, iptablesFilter: null, forwardRules: false },
      }),
    );
    checkSchema(r);
    assert.equal(r.verdict, 'ok', r.problems.join('\n'));
    assert.deepEqual(r.node, { subnet: 'fd05:0:1::/64', network: 'fd05::/32', publicIP: 'fd50::1', backend: 'vxlan', leaseSource: 'etcd', subnetFile: '/run/flannel/subnet.env' });
    assert.equal(hop(r, 'fdb').summary, `${MAC3} dst fd50::2 on flannel-v6.1 (vni 1, port 8472): public IP of lease fd05:0:2::/64`);
    assert.equal(hop(r, 'mtu').summary, 'MTU cni0 1430, flannel-v6.1 1430, eth0 1500 (subnet.env 1430): consistent');
    assert.equal(hop(r, 'masquerade').evidence.ruleText, '-A FLANNEL-POSTRTG -s fd05:0:1::/64 -d fd05::/32 -m comment --comment "flanneld masq" -j RETURN');
    assert.equal(hop(r, 'forward').status, 'info');
  });
});

describe('trace analysis: host-gw', () => {
  const hostgw = (gateway: string) =>
    facts({
      leases: [lease('10.5.1.0/24', '10.250.0.1', '', 'host-gw'), lease('10.5.2.0/24', '10.250.0.2', '', 'host-gw')],
      daemonBackend: 'host-gw',
      route: route('10.5.2.0/24', gateway, 'eth0'),
      neighbours: [neigh(2, '10.250.0.2', '0e:aa:00:00:00:02', NUD.REACHABLE)],
      fdb: [],
      underlay: new Map(),
    });

  it('names the next hop, the peer\'s public IP', () => {
    const r = analyze(hostgw('10.250.0.2'));
    checkSchema(r);
    assert.deepEqual(statuses(r), ['source:ok', 'route:ok', 'nexthop:ok', 'mtu:ok', 'masquerade:ok', 'forward:ok']);
    assert.equal(hop(r, 'route').summary, '10.5.2.0/24 via 10.250.0.2 dev eth0 proto 88: lease 10.5.2.0/24 of node 10.250.0.2');
    assert.equal(hop(r, 'nexthop').summary, 'next hop 10.250.0.2 on eth0 (public IP of lease 10.5.2.0/24): lladdr 0e:aa:00:00:00:02 REACHABLE');
  });

  it('reports a route through the wrong node', () => {
    const r = analyze(hostgw('10.250.0.7'));
    assert.equal(hop(r, 'route').status, 'broken');
    assert.equal(hop(r, 'route').evidence.expected, '10.5.2.0/24 via 10.250.0.2');
  });
});

describe('trace analysis: ip-masq-agent mode (WEFT_IPMASQ=agent)', () => {
  const AGENT_CHAIN_COMMENT = 'weft-ip-masq: nonMasqueradeCIDRs traffic is not subject to MASQUERADE';
  const agentNat = (agent: AgentMasq, extra: string[] = [], withChain = true): string => {
    const spec = { family: 4 as const, kind: 'agent' as const, rules: agentRules(NETWORK, agent, true) };
    const chains = withChain ? [':WEFT-IP-MASQ - [0:0]', `-A POSTROUTING ${jumpSpec('agent')}`, ...chainLines(spec)] : [];
    return ['*nat', ':POSTROUTING ACCEPT [0:0]', ...extra, ...chains, 'COMMIT'].join('\n');
  };
  const agentFacts = (dst: string, nat: string, route0 = route('0.0.0.0/0', '10.250.0.254', 'eth0', { protocol: 'boot' })) =>
    facts({
      packet: parsePacket('10.5.1.2', dst, 'icmp', null),
      env: { ...facts().env!, ipMasqMode: 'agent' },
      route: route0,
      neighbours: [neigh(2, '10.250.0.254', '0e:ff:00:00:00:fe', NUD.REACHABLE)],
      fdb: [],
      underlay: new Map(),
      rules: { ...facts().rules, iptablesNat: nat },
    });

  it('keeps a pod\'s address towards a nonMasqueradeCIDR, naming the CIDR and the rule', () => {
    const r = analyze(agentFacts('203.0.113.5', agentNat(defaultAgentConfig())));
    checkSchema(r);
    assert.equal(r.verdict, 'ok', r.problems.join('\n'));
    const m = hop(r, 'masquerade');
    const rule = `-A WEFT-IP-MASQ -d 203.0.113.0/24 -m comment --comment "${AGENT_CHAIN_COMMENT}" -j RETURN`;
    assert.equal(m.summary, `not masqueraded: 203.0.113.5 is in nonMasqueradeCIDR 203.0.113.0/24: rule 12 of WEFT-IP-MASQ returns: ${rule} (ip-masq-agent mode, live: present)`);
    assert.deepEqual(
      [m.evidence.ipMasqMode, m.evidence.verdict, m.evidence.matchedCIDR, m.evidence.rule, m.evidence.ruleText, m.evidence.live, m.evidence.liveVerdict, m.evidence.liveChain, m.evidence.liveRule, m.evidence.liveRuleText],
      ['agent', 'RETURN', '203.0.113.0/24', 12, rule, 'present', 'RETURN', 'WEFT-IP-MASQ', 12, rule],
    );
    assert.deepEqual(m.evidence.nonMasqueradeCIDRs, ['169.254.0.0/16', '10.5.0.0/16', '10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '192.0.0.0/24', '192.0.2.0/24', '192.88.99.0/24', '198.18.0.0/15', '198.51.100.0/24', '203.0.113.0/24', '240.0.0.0/4']);
  });

  it('masquerades a destination in no nonMasqueradeCIDR, and keeps cluster traffic', () => {
    const out = analyze(agentFacts('8.8.8.8', agentNat(defaultAgentConfig())));
    const masqRule = '-A WEFT-IP-MASQ -m comment --comment "weft-ip-masq: outbound traffic is subject to MASQUERADE (must be last in chain)" -j MASQUERADE --random-fully';
    assert.equal(hop(out, 'masquerade').summary, `masqueraded to 10.250.0.1 by rule 14 of WEFT-IP-MASQ: ${masqRule}: 8.8.8.8 is in none of its 13 non-masquerade CIDRs (ip-masq-agent mode, live: present)`);
    assert.deepEqual([hop(out, 'masquerade').evidence.liveVerdict, hop(out, 'masquerade').evidence.liveRule, hop(out, 'masquerade').evidence.matchedCIDR], ['MASQUERADE', 14, null]);
    const pod = analyze(agentFacts('10.5.2.3', agentNat(defaultAgentConfig()), route('10.5.2.0/24', '10.5.2.0', 'flannel.1', { onlink: true })));
    checkSchema(pod);
    assert.equal(hop(pod, 'masquerade').status, 'ok');
    assert.match(hop(pod, 'masquerade').summary, /^not masqueraded: 10\.5\.2\.3 is in the cluster network 10\.5\.0\.0\/16: rule 2 of WEFT-IP-MASQ returns: /);
  });

  it('reads a custom config back from the chain: masqLinkLocal, a configured CIDR', () => {
    const custom: AgentMasq = { nonMasqueradeCIDRs: [IPNet.parse('100.128.0.0/16')], masqLinkLocal: true, masqLinkLocalIPv6: true };
    const ll = analyze(agentFacts('169.254.10.1', agentNat(custom)));
    const m = hop(ll, 'masquerade');
    assert.deepEqual([m.status, m.evidence.verdict, m.evidence.rule, m.evidence.live, m.evidence.nonMasqueradeCIDRs], ['ok', 'MASQUERADE', 3, 'present', ['10.5.0.0/16', '100.128.0.0/16']]);
    assert.ok(!agentRules(NETWORK, custom, true).some((r) => r.matches.some((x) => x.kind === 'dst' && x.net.equals(LINK_LOCAL[4]))));
  });

  it('reports the chain missing, and flannel\'s chain left over beside it', () => {
    const missing = analyze(agentFacts('8.8.8.8', agentNat(defaultAgentConfig(), [], false)));
    checkSchema(missing);
    const m = hop(missing, 'masquerade');
    assert.equal(m.status, 'broken');
    assert.equal(m.evidence.live, 'missing');
    assert.equal(m.evidence.nonMasqueradeCIDRs, null);
    assert.deepEqual(m.evidence.liveProblems, ['WEFT-IP-MASQ: chain missing', 'POSTROUTING: jump to WEFT-IP-MASQ missing']);
    assert.match(m.summary, /^ip-masq-agent mode \(WEFT_IPMASQ=agent\), but WEFT-IP-MASQ is missing: weft masquerades nothing/);
    const flannel = masqRules(NETWORK, SUBNET, IPNet.parse('224.0.0.0/4'), true);
    const leftover = [':FLANNEL-POSTRTG - [0:0]', `-A POSTROUTING ${jumpSpec('masq')}`, ...chainLines({ family: 4, kind: 'masq', rules: flannel })];
    const both = analyze(agentFacts('203.0.113.5', agentNat(defaultAgentConfig(), leftover)));
    const b = hop(both, 'masquerade');
    assert.equal(b.status, 'broken');
    assert.deepEqual(b.evidence.liveProblems, ['FLANNEL-POSTRTG: present although not wanted']);
    // flannel's chain comes first in POSTROUTING and masquerades the pod: the live rules say so.
    assert.deepEqual([b.evidence.liveVerdict, b.evidence.liveChain, b.evidence.liveRule], ['MASQUERADE', 'FLANNEL-POSTRTG', 5]);
  });

  it('evaluates the ip-masq-agent chain of weft\'s nftables table', () => {
    const agent = agentRules(NETWORK, defaultAgentConfig(), true);
    const localReturn = [{ match: { op: '==', left: { fib: { result: 'type', flags: ['daddr'] } }, right: 'local' } }, { return: null }];
    const nft = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6', json_schema_version: 1 } },
        { table: { family: 'ip', name: 'flannel-ipv4', handle: 1 } },
        { chain: { family: 'ip', table: 'flannel-ipv4', name: 'ip-masq-agent', handle: 1, type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } },
        { chain: { family: 'ip', table: 'flannel-ipv4', name: 'forward', handle: 2, type: 'filter', hook: 'forward', prio: 0, policy: 'accept' } },
        { rule: { family: 'ip', table: 'flannel-ipv4', chain: 'ip-masq-agent', expr: localReturn } },
        ...agent.map((r) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'ip-masq-agent', expr: ruleExpr(4, r) } })),
        ...forwardRules(NETWORK).map((r) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'forward', expr: ruleExpr(4, r) } })),
      ],
    });
    const base = agentFacts('8.8.8.8', '');
    const r = analyze({ ...base, rules: { mode: 'nftables', modeSource: 'daemon', iptablesNat: '*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n', iptablesFilter: null, nft, forwardRules: true, errors: [] } });
    checkSchema(r);
    assert.equal(r.verdict, 'ok', r.problems.join('\n'));
    const m = hop(r, 'masquerade');
    assert.equal(m.summary, 'masqueraded to 10.250.0.1 by rule 15 of ip flannel-ipv4 ip-masq-agent: masquerade fully-random: 8.8.8.8 is in none of its 13 non-masquerade CIDRs (ip-masq-agent mode, live: present)');
    assert.deepEqual([m.evidence.liveVerdict, m.evidence.liveChain, m.evidence.liveRule, m.evidence.liveRuleText, m.evidence.unevaluated], ['MASQUERADE', 'ip flannel-ipv4 ip-masq-agent', 15, 'masquerade fully-random', []]);
    const kept = analyze({ ...base, packet: parsePacket('10.5.1.2', '192.168.7.7', 'icmp', null), rules: { mode: 'nftables', modeSource: 'daemon', iptablesNat: null, iptablesFilter: null, nft, forwardRules: true, errors: [] } });
    const k = hop(kept, 'masquerade');
    assert.deepEqual([k.evidence.verdict, k.evidence.rule, k.evidence.matchedCIDR, k.evidence.liveVerdict, k.evidence.liveRule, k.evidence.liveRuleText], ['RETURN', 6, '192.168.0.0/16', 'RETURN', 6, 'ip daddr 192.168.0.0/16 return']);
    assert.equal(hop(kept, 'forward').summary, 'accepted by rule 1 of ip flannel-ipv4 forward: ip saddr 10.5.0.0/16 accept (live: present)');
  });
});

describe('trace: arguments and text output', () => {
  it('names the NetworkPolicy that allows the packet at each end on this node, or the default deny that drops it', () => {
    const analyzed = (f: TraceFacts) => {
      const r = analyze(f);
      checkSchema(r);
      return r;
    };
    const allowed = analyzed(
      facts({
        packet: parsePacket('10.5.1.2', '10.5.2.3', 'tcp', 80),
        policy: {
          programmed: true,
          decisions: [
            { direction: 'ingress', pod: 'y/b', allowed: true, by: { namespace: 'y', policy: 'allow-web', rule: 1 } },
            { direction: 'egress', pod: 'x/a', allowed: true, by: 'unrestricted' },
          ],
        },
      }),
    );
    assert.equal(allowed.verdict, 'ok');
    const hops = allowed.hops.filter((h) => h.kind === 'policy');
    assert.deepEqual(
      hops.map((h) => [h.status, h.summary]),
      [
        ['ok', 'egress at pod x/a: not isolated (no NetworkPolicy selects it for egress), allowed'],
        ['ok', 'ingress at pod y/b: allowed by NetworkPolicy y/allow-web (ingress[1])'],
      ],
    );
    assert.deepEqual(hops[1]!.evidence, {
      direction: 'ingress',
      pod: 'y/b',
      allowed: true,
      policy: 'y/allow-web',
      rule: 1,
      reason: 'rule',
      programmed: true,
      conjunctions: null,
      otherConjunctions: null,
      bridge: null,
      agrees: null,
    });
    const denied = analyzed(facts({ packet: parsePacket('10.5.1.2', '10.5.2.3', 'tcp', null), policy: { programmed: true, decisions: [{ direction: 'egress', pod: 'x/a', allowed: false, by: 'default-deny' }] } }));
    assert.equal(denied.verdict, 'broken');
    assert.deepEqual(denied.problems, [
      'policy: egress at pod x/a: dropped by the default deny (NetworkPolicies select it for egress and none of their rules allows this packet); no --dport given: only rules without ports were considered',
    ]);
  });

  it('refuses bad packets with a clear message', () => {
    assert.throws(() => parsePacket('10.5.1.2', 'fd00::1', 'icmp', null), (e: unknown) => e instanceof TraceArgumentError && e.message === 'source 10.5.1.2 and destination fd00::1 are of different address families');
    assert.throws(() => parsePacket('10.5.1.2', '10.5.2.3', 'icmp', 80), { message: '--dport needs --proto tcp or udp' });
    assert.throws(() => parsePacket('10.5.1.2', '10.5.2.3', 'tcp', 70000), { message: '--dport 70000: must be 1..65535' });
    assert.throws(() => parsePacket('pod-a', '10.5.2.3', 'tcp', null), { message: 'source "pod-a" is not an IP address' });
  });

  it('renders one line per hop', () => {
    const r = analyze(facts({ route: { ok: false, error: 'RTNETLINK answers: Network is unreachable' }, notes: ['leases as the daemon knows them (etcd not reachable)'] }));
    assert.equal(
      renderTrace(r),
      [
        'trace 10.5.1.2 -> 10.5.2.3 icmp on node 10.250.0.1 (lease 10.5.1.0/24, network 10.5.0.0/16, backend vxlan, leases from etcd)',
        '  ok          source     10.5.1.2 is a pod of this node (lease 10.5.1.0/24), enters on cni0',
        '  BROKEN      route      no route to 10.5.2.3: RTNETLINK answers: Network is unreachable',
        'result: broken (1 broken hop)',
        'note: leases as the daemon knows them (etcd not reachable)',
        '',
      ].join('\n'),
    );
  });
});
