// The OpenFlow pipeline of the ovs backend, Antrea's shape cut down to the lease model:
//
//   0 classifier → 10 spoof guard → 20 ARP responder (ARP) / 30 L3 forwarding (IP) → 40 L2 forwarding → 50 output
//
// Flows are declared with typed matches and actions and rendered by src/render/ofctl.ts (which
// checks every value against its field) in the exact OpenFlow 1.5 text `ovs-ofctl dump-flows`
// prints back, so `diff-flows` against the bridge is empty when nothing drifted. Every flow
// carries a cookie `round << 48 | category << 40 | object id`: the round tells a restart's flows
// from the previous run's, the category and id name the node, peer or pod a flow belongs to (the
// CNI plugin deletes a pod's flows by that cookie).
import { renderCookieMatch, renderFlow as renderOfFlow, type OfAction, type OfMatch, type OfValue, type SetField } from '../../render/ofctl.js';
import { type IPAddr, type IPNet } from '../../util/ip.js';

export const TABLES = { classifier: 0, spoofGuard: 10, arpResponder: 20, l3Forwarding: 30, l2Forwarding: 40, output: 50 } as const;
export type Table = keyof typeof TABLES;

/** Every peer gateway answers ARP with this MAC; tunnelled frames carry it as destination. */
export const GLOBAL_VIRTUAL_MAC = 'aa:bb:cc:dd:ee:ff';
export const TUNNEL_OFPORT = 32768;
export const GATEWAY_OFPORT = 32769;

export enum Category {
  Pipeline = 1,
  Peer = 2,
  Pod = 3,
}

/** Where a packet entered the bridge (reg0[0..3], Antrea's layout). */
enum Source {
  Tunnel = 1,
  Gateway = 2,
  Pod = 3,
}
/** reg0[8]: table 40 found the output port (in reg1). */
const PORT_FOUND = 0x100;

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
 * with the same match and priority), or delete every flow whose cookie matches under the mask.
 */
export type FlowMod =
  | { readonly op: 'add'; readonly flow: Flow }
  | { readonly op: 'delete'; readonly cookie: bigint; readonly mask: bigint };

/** Flow mods one per line, in the order given (a bundle applies them in order). */
export function renderFlowMods(mods: readonly FlowMod[]): string {
  return mods.map((m) => (m.op === 'add' ? `add ${renderFlow(m.flow)}\n` : `delete ${renderCookieMatch(m.cookie, m.mask)}\n`)).join('');
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
export function pipelineFlows(round: number, node: NodePorts): Flow[] {
  const { tunnelPort, gatewayPort, gatewayIP, gatewayMAC, vni } = node;
  return new FlowSet(cookieOf(round, Category.Pipeline, 0))
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
    .add('l2Forwarding', 0, [], [A.goto('output')])
    .add('output', 200, [M.portFound], [A.outputToReg1])
    .add('output', 0, [], [A.drop]).flows;
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

/** The whole table for a node, its pods and its peers. */
export function desiredFlows(round: number, node: NodePorts, pods: readonly PodPort[], peers: readonly PeerNode[]): Flow[] {
  return [
    ...pipelineFlows(round, node),
    ...pods.flatMap((p) => podFlows(round, node, p)),
    ...peers.flatMap((p) => peerFlows(round, node, p)),
  ];
}
