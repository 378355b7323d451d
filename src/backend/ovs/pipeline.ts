// The OpenFlow pipeline of the ovs backend, Antrea's shape cut down to the lease model:
//
//   0 classifier → 10 spoof guard → 20 ARP responder (ARP) / 30 L3 forwarding (IP) → 40 L2 forwarding → 50 output
//
// With NetworkPolicy (policyScaffold), IP packets whose output port is known go from 50 through
// conntrack and the policy tables before they leave:
//
//   50 output: ct(zone) → 51 conntrack state (+inv dropped; established and related skip to 60)
//     → 52 egress rules → 53 egress default (isolated pods' drops) → 54 ingress rules
//     → 55 ingress default → 56 conntrack commit (new connections, the rules' conjunction ids in
//     ct_label) → 60 policy output
//
// Policy is judged after forwarding, where every path (pod, gateway, tunnel) meets: nothing in the
// pipeline rewrites addresses, so egress (by source pod address) and ingress (by destination pod
// address) see the packet's own, and the pod flows the CNI plugin writes stay the same with or
// without policy. Service traffic is DNATed by the host, outside the bridge: see policyScaffold. The rule flows of 52–55 are the policy enforcer's (src/policy/ovs/); this file holds the
// tables' frame.
//
// Flows are declared with typed matches and actions and rendered by src/render/ofctl.ts (which
// checks every value against its field) in the exact OpenFlow 1.5 text `ovs-ofctl dump-flows`
// prints back, so `diff-flows` against the bridge is empty when nothing drifted. Every flow
// carries a cookie `round << 48 | category << 40 | object id`: the round tells a restart's flows
// from the previous run's, the category and id name the node, peer or pod a flow belongs to (the
// CNI plugin deletes a pod's flows by that cookie).
import { renderCookieMatch, renderFlow as renderOfFlow, renderStrictSelector, type OfAction, type OfMatch, type OfValue, type SetField } from '../../render/ofctl.js';
import { type IPAddr, type IPNet } from '../../util/ip.js';

export const TABLES = {
  classifier: 0,
  spoofGuard: 10,
  arpResponder: 20,
  l3Forwarding: 30,
  l2Forwarding: 40,
  output: 50,
  conntrackState: 51,
  egressRule: 52,
  egressDefaultRule: 53,
  ingressRule: 54,
  ingressDefaultRule: 55,
  conntrackCommit: 56,
  policyOutput: 60,
} as const;
export type Table = keyof typeof TABLES;

/** Every peer gateway answers ARP with this MAC; tunnelled frames carry it as destination. */
export const GLOBAL_VIRTUAL_MAC = 'aa:bb:cc:dd:ee:ff';
export const TUNNEL_OFPORT = 32768;
export const GATEWAY_OFPORT = 32769;

export enum Category {
  Pipeline = 1,
  Peer = 2,
  Pod = 3,
  /** NetworkPolicy rule flows (tables 52–55); the id is the flow's conjunction id, or 0. */
  Policy = 4,
}

/** Where a packet entered the bridge (reg0[0..3], Antrea's layout). */
export enum Source {
  Tunnel = 1,
  Gateway = 2,
  Pod = 3,
}
/** reg0[8]: table 40 found the output port (in reg1). */
const PORT_FOUND = 0x100;
/** The conntrack zone of pod traffic (Antrea's). */
export const CT_ZONE = 65520;

const ROUND_SHIFT = 48n;
const CATEGORY_SHIFT = 40n;
export const ROUND_MASK = 0xffffn << ROUND_SHIFT;
/** Category and object id: a cookie with the round masked off. */
export const OBJECT_MASK = (1n << ROUND_SHIFT) - 1n;

export function cookieOf(round: number, category: Category, objectId: number): bigint {
  return (BigInt(round & 0xffff) << ROUND_SHIFT) | (BigInt(category) << CATEGORY_SHIFT) | BigInt(objectId >>> 0);
}

/** The cookie bits of a round alone (use with ROUND_MASK to select a round's flows). */
export function roundCookie(round: number): bigint {
  return BigInt(round & 0xffff) << ROUND_SHIFT;
}

export function roundOf(cookie: bigint): number {
  return Number((cookie & ROUND_MASK) >> ROUND_SHIFT);
}

/** Round and category: with cookieOf(round, category, 0), a selector for one round's flows of a category. */
export const CATEGORY_MASK = ROUND_MASK | (0xffn << CATEGORY_SHIFT);
/** The category bits alone: with cookieOf(0, category, 0), a selector for a category's flows of every round. */
export const CATEGORY_ONLY_MASK = 0xffn << CATEGORY_SHIFT;

/** Every cookie bit: a selector for exactly one round's flows of one object. */
export const EXACT_MASK = (1n << 64n) - 1n;

/** The cookie of a peer's flows: its id is the peer subnet's address. */
export function peerCookie(round: number, subnet: IPNet): bigint {
  return cookieOf(round, Category.Peer, Number(subnet.ip.value));
}

/** The cookie of a local pod's flows: its id is the pod port's ofport. */
export function podCookie(round: number, ofport: number): bigint {
  return cookieOf(round, Category.Pod, ofport);
}

/** Matches and actions are data; src/render/ofctl.ts is the only place that turns them into text. */
export type Match = OfMatch;
export type Action = OfAction;

export const M = {
  ip: { field: 'ip' } as Match,
  arp: { field: 'arp' } as Match,
  arpRequest: { field: 'arp_op', value: 1 } as Match,
  inPort: (ofport: number): Match => ({ field: 'in_port', value: ofport }),
  tunnelId: (vni: number): Match => ({ field: 'tun_id', value: vni }),
  source: (s: Source): Match => ({ field: 'reg0', value: s, mask: 0xf }),
  portFound: { field: 'reg0', value: PORT_FOUND, mask: PORT_FOUND } as Match,
  ctState: (flags: string): Match => ({ field: 'ct_state', value: flags }),
  ethSrc: (mac: string): Match => ({ field: 'dl_src', value: mac }),
  ethDst: (mac: string): Match => ({ field: 'dl_dst', value: mac }),
  ipSrc: (ip: IPAddr): Match => ({ field: 'nw_src', value: ip.toString() }),
  ipDst: (dst: IPAddr | IPNet): Match => ({ field: 'nw_dst', value: dst.toString() }),
  arpSenderIP: (ip: IPAddr): Match => ({ field: 'arp_spa', value: ip.toString() }),
  arpSenderMAC: (mac: string): Match => ({ field: 'arp_sha', value: mac }),
  arpTargetIP: (ip: IPAddr): Match => ({ field: 'arp_tpa', value: ip.toString() }),
};

const setField = (field: SetField, value: OfValue, mask?: number): Action =>
  mask === undefined ? { type: 'set_field', field, value } : { type: 'set_field', field, value, mask };

export const A = {
  goto: (t: Table): Action => ({ type: 'goto_table', table: TABLES[t] }),
  setSource: (s: Source) => setField('reg0', s, 0xf),
  setOutPort: (ofport: number) => [setField('reg1', ofport), setField('reg0', PORT_FOUND, PORT_FOUND)],
  setEthSrc: (mac: string) => setField('eth_src', mac),
  setEthDst: (mac: string) => setField('eth_dst', mac),
  setTunnel: (dst: IPAddr, vni: number) => [setField('tun_dst', dst.toString()), setField('tun_id', vni)],
  decTtl: { type: 'dec_ttl' } as Action,
  outputToReg1: { type: 'output_field', field: 'NXM_NX_REG1' } as Action,
  /** Looks the packet up in the pod zone and continues in `t` with its ct_state. */
  conntrack: (t: Table): Action => ({ type: 'ct', zone: CT_ZONE, table: TABLES[t] }),
  /** Records the connection, with the deciding egress (reg2) and ingress (reg3) conjunction ids in ct_label. */
  commit: { type: 'ct', zone: CT_ZONE, commit: true, labels: [{ src: 'NXM_NX_REG2', low: 0 }, { src: 'NXM_NX_REG3', low: 32 }] } as Action,
  /** The conjunction id of the rule that allowed the packet, in reg2 (egress) or reg3 (ingress). */
  setRuleId: (direction: 'egress' | 'ingress', id: number): Action => setField(direction === 'egress' ? 'reg2' : 'reg3', id),
  normal: { type: 'normal' } as Action,
  drop: { type: 'drop' } as Action,
  /** Turns an ARP request into the reply "`ip` is at `mac`" and sends it back where it came from. */
  arpReply: (ip: IPAddr, mac: string): Action[] => [
    { type: 'move', src: 'NXM_OF_ETH_SRC', dst: 'NXM_OF_ETH_DST' },
    setField('eth_src', mac),
    setField('arp_op', 2),
    { type: 'move', src: 'NXM_NX_ARP_SHA', dst: 'NXM_NX_ARP_THA' },
    setField('arp_sha', mac),
    { type: 'move', src: 'NXM_OF_ARP_SPA', dst: 'NXM_OF_ARP_TPA' },
    setField('arp_spa', ip.toString()),
    { type: 'in_port' },
  ],
};

export interface Flow {
  readonly table: Table;
  readonly priority: number;
  readonly match: readonly Match[];
  readonly actions: readonly Action[];
  readonly cookie: bigint;
}

/** The flow as ovs-ofctl reads it; throws UnsafeValueError (src/render/word.ts) for a value that does not fit its field. */
export function renderFlow(f: Flow): string {
  return renderOfFlow({ cookie: f.cookie, table: TABLES[f.table], priority: f.priority, match: f.match, actions: f.actions });
}

/**
 * A change to the table, for one atomic `ovs-ofctl --bundle add-flows`: add (or overwrite the flow
 * with the same match and priority), delete every flow whose cookie matches under the mask, or
 * delete the one flow with exactly this table, priority and match.
 */
export type FlowMod =
  | { readonly op: 'add'; readonly flow: Flow }
  | { readonly op: 'delete'; readonly cookie: bigint; readonly mask: bigint }
  | { readonly op: 'delete-strict'; readonly flow: Pick<Flow, 'table' | 'priority' | 'match'> };

function renderFlowMod(m: FlowMod): string {
  switch (m.op) {
    case 'add':
      return `add ${renderFlow(m.flow)}\n`;
    case 'delete':
      return `delete ${renderCookieMatch(m.cookie, m.mask)}\n`;
    case 'delete-strict':
      return `delete_strict ${renderStrictSelector({ table: TABLES[m.flow.table], priority: m.flow.priority, match: m.flow.match })}\n`;
  }
}

/** Flow mods one per line, in the order given (a bundle applies them in order). */
export function renderFlowMods(mods: readonly FlowMod[]): string {
  return mods.map(renderFlowMod).join('');
}

/** One flow per line, in a stable order (table, then priority high to low, then text). */
export function renderFlows(flows: readonly Flow[]): string {
  const sorted = [...flows].sort((a, b) => TABLES[a.table] - TABLES[b.table] || b.priority - a.priority);
  return sorted.map((f) => `${renderFlow(f)}\n`).join('');
}

/** What the node's own flows depend on. */
export interface NodePorts {
  readonly vni: number;
  readonly tunnelPort: number;
  readonly gatewayPort: number;
  readonly gatewayIP: IPAddr;
  readonly gatewayMAC: string;
}

export interface PodPort {
  readonly ofport: number;
  readonly ip: IPAddr;
  readonly mac: string;
}

export interface PeerNode {
  readonly subnet: IPNet;
  readonly publicIP: IPAddr;
}

/** The gateway address of a lease subnet: its first host (flannel's cni0 address). */
export function gatewayOf(subnet: IPNet): IPAddr {
  return subnet.nth(1n);
}

/** A MAC derived from an IPv4 address, ovn-kubernetes style (0a:58 + the four address bytes). */
export function macFromIP(ip: IPAddr): string {
  if (ip.family !== 4) throw new RangeError(`macFromIP needs an IPv4 address, got ${ip.toString()}`);
  const v = Number(ip.value);
  const bytes = [0x0a, 0x58, (v >>> 24) & 0xff, (v >>> 16) & 0xff, (v >>> 8) & 0xff, v & 0xff];
  return bytes.map((b) => b.toString(16).padStart(2, '0')).join(':');
}

class FlowSet {
  readonly flows: Flow[] = [];
  constructor(private readonly cookie: bigint) {}
  add(table: Table, priority: number, match: readonly (Match | Match[])[], actions: readonly (Action | Action[])[]): this {
    this.flows.push({ table, priority, match: match.flat(), actions: actions.flat(), cookie: this.cookie });
    return this;
  }
}

/** Flows installed once per node: port classification, gateway handling and every table's default. */
/** With `policy`, the policy tables' frame; `serviceCIDRs`: the Services' ClusterIP ranges (see policyScaffold). */
export interface PipelineOptions {
  readonly policy?: boolean;
  readonly serviceCIDRs?: readonly IPNet[];
}

export function pipelineFlows(round: number, node: NodePorts, opts: PipelineOptions = {}): Flow[] {
  const { tunnelPort, gatewayPort, gatewayIP, gatewayMAC, vni } = node;
  const set = new FlowSet(cookieOf(round, Category.Pipeline, 0))
    .add('classifier', 200, [M.inPort(tunnelPort), M.tunnelId(vni)], [A.setSource(Source.Tunnel), A.goto('l3Forwarding')])
    .add('classifier', 200, [M.inPort(gatewayPort)], [A.setSource(Source.Gateway), A.goto('spoofGuard')])
    .add('classifier', 0, [], [A.drop])
    // The gateway is the host: it may send from any address (host traffic, forwarded traffic).
    .add('spoofGuard', 200, [M.ip, M.inPort(gatewayPort)], [A.goto('l3Forwarding')])
    .add('spoofGuard', 200, [M.arp, M.inPort(gatewayPort)], [A.goto('arpResponder')])
    .add('spoofGuard', 0, [], [A.drop])
    .add('arpResponder', 200, [M.arp, M.arpRequest, M.arpTargetIP(gatewayIP)], [A.arpReply(gatewayIP, gatewayMAC)])
    .add('arpResponder', 190, [M.arp], [A.normal])
    .add('arpResponder', 0, [], [A.drop])
    // Replies from a peer to this node's gateway address arrive addressed to the virtual MAC.
    .add('l3Forwarding', 210, [M.ip, M.ethDst(GLOBAL_VIRTUAL_MAC), M.ipDst(gatewayIP)], [A.setEthDst(gatewayMAC), A.goto('l2Forwarding')])
    .add('l3Forwarding', 0, [], [A.goto('l2Forwarding')])
    .add('l2Forwarding', 200, [M.ethDst(gatewayMAC)], [A.setOutPort(gatewayPort), A.goto('output')])
    .add('l2Forwarding', 200, [M.ethDst(GLOBAL_VIRTUAL_MAC)], [A.setOutPort(tunnelPort), A.goto('output')])
    .add('l2Forwarding', 0, [], [A.goto('output')]);
  if (opts.policy) policyScaffold(set, node, opts.serviceCIDRs ?? []);
  else set.add('output', 200, [M.portFound], [A.outputToReg1]);
  return set.add('output', 0, [], [A.drop]).flows;
}

/**
 * The frame of the policy tables (their defaults pass everything on; the enforcer adds the rules).
 *  - Traffic from the node itself (the gateway's own address: kubelet probes, host services) skips
 *    ingress rules, as it skips the nftables forward hook on bridge nodes; its connections are
 *    committed, so replies come back as established. (kube-proxy's masquerade of NodePort traffic
 *    to a local endpoint gives it the same address: such traffic passes too — see the README.)
 *  - A pod's packet to a Service address skips the egress rules on its way to the host: kube-proxy
 *    DNATs it there and it comes back through the gateway port with the pod's source address,
 *    where the egress rules (which match the source address, whatever the port) judge it against
 *    the backend — as nftables' forward hook, after DNAT, does.
 *  - Non-IP packets leave without conntrack. The ct flow of table 50 is above the plain output's
 *    priority, so while a restart that turns policy on still has the old round's output flow, the
 *    new one wins.
 */
function policyScaffold(set: FlowSet, node: NodePorts, serviceCIDRs: readonly IPNet[]): void {
  set
    .add('output', 210, [M.ip, M.portFound], [A.conntrack('conntrackState')])
    .add('output', 190, [M.portFound], [A.outputToReg1])
    .add('conntrackState', 210, [M.ctState('+inv+trk'), M.ip], [A.drop])
    .add('conntrackState', 200, [M.ctState('-new+trk'), M.ip], [A.goto('policyOutput')]);
  for (const cidr of serviceCIDRs) set.add('conntrackState', 190, [M.ip, M.ipDst(cidr)], [A.goto('ingressRule')]);
  set
    .add('conntrackState', 0, [], [A.goto('egressRule')])
    .add('egressRule', 0, [], [A.goto('egressDefaultRule')])
    .add('egressDefaultRule', 0, [], [A.goto('ingressRule')])
    .add('ingressRule', 220, [M.ip, M.source(Source.Gateway), M.ipSrc(node.gatewayIP)], [A.goto('conntrackCommit')])
    .add('ingressRule', 0, [], [A.goto('ingressDefaultRule')])
    .add('ingressDefaultRule', 0, [], [A.goto('conntrackCommit')])
    .add('conntrackCommit', 200, [M.ctState('+new+trk'), M.ip], [A.commit, A.goto('policyOutput')])
    .add('conntrackCommit', 0, [], [A.goto('policyOutput')])
    .add('policyOutput', 200, [M.portFound], [A.outputToReg1])
    .add('policyOutput', 0, [], [A.drop]);
}

/** A local pod (Antrea's InstallPodFlows): classification, spoof guard, tunnel ingress to it, L2 to it. */
export function podFlows(round: number, node: Pick<NodePorts, 'gatewayMAC'>, pod: PodPort): Flow[] {
  const { ofport, ip, mac } = pod;
  return new FlowSet(podCookie(round, ofport))
    .add('classifier', 190, [M.inPort(ofport)], [A.setSource(Source.Pod), A.goto('spoofGuard')])
    .add('spoofGuard', 200, [M.ip, M.inPort(ofport), M.ethSrc(mac), M.ipSrc(ip)], [A.goto('l3Forwarding')])
    .add('spoofGuard', 200, [M.arp, M.inPort(ofport), M.arpSenderIP(ip), M.arpSenderMAC(mac)], [A.goto('arpResponder')])
    .add('l3Forwarding', 200, [M.ip, M.ethDst(GLOBAL_VIRTUAL_MAC), M.ipDst(ip)], [A.setEthSrc(node.gatewayMAC), A.setEthDst(mac), A.decTtl, A.goto('l2Forwarding')])
    .add('l2Forwarding', 200, [M.ethDst(mac)], [A.setOutPort(ofport), A.goto('output')]).flows;
}

/**
 * A peer node (Antrea's InstallNodeFlows): its gateway answers ARP with the virtual MAC (for the
 * host's onlink route), and its subnet goes into the tunnel to its public IP. Pod traffic has
 * its TTL decremented; traffic from the gateway was already routed by the host.
 */
export function peerFlows(round: number, node: Pick<NodePorts, 'gatewayMAC' | 'vni'>, peer: PeerNode): Flow[] {
  const { subnet, publicIP } = peer;
  const gateway = gatewayOf(subnet);
  const toTunnel = [A.setEthSrc(node.gatewayMAC), A.setEthDst(GLOBAL_VIRTUAL_MAC), A.setTunnel(publicIP, node.vni)];
  return new FlowSet(peerCookie(round, subnet))
    .add('arpResponder', 200, [M.arp, M.arpRequest, M.arpTargetIP(gateway)], [A.arpReply(gateway, GLOBAL_VIRTUAL_MAC)])
    .add('l3Forwarding', 200, [M.ip, M.source(Source.Pod), M.ipDst(subnet)], [...toTunnel, A.decTtl, A.goto('l2Forwarding')])
    .add('l3Forwarding', 200, [M.ip, M.source(Source.Gateway), M.ipDst(subnet)], [...toTunnel, A.goto('l2Forwarding')]).flows;
}

/** The whole table for a node, its pods and its peers (with the policy tables' frame when `policy`). */
export function desiredFlows(round: number, node: NodePorts, pods: readonly PodPort[], peers: readonly PeerNode[], opts: PipelineOptions = {}): Flow[] {
  return [
    ...pipelineFlows(round, node, opts),
    ...pods.flatMap((p) => podFlows(round, node, p)),
    ...peers.flatMap((p) => peerFlows(round, node, p)),
  ];
}
