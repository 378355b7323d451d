// The OpenFlow pipeline of the ovs backend, Antrea's shape cut down to the lease model:
//
//   0 classifier → 10 spoof guard → 20 ARP responder (ARP) / 30 L3 forwarding (IP) → 40 L2 forwarding → 50 output
//
// Flows are declared with typed matches and actions and rendered in the exact OpenFlow 1.5 text
// `ovs-ofctl dump-flows` prints back, so `diff-flows` against the bridge is empty when nothing
// drifted. Every flow carries a cookie `round << 48 | category << 40 | object id`: the round tells
// a restart's flows from the previous run's, the category and id name the node, peer or pod a
// flow belongs to (the CNI plugin deletes a pod's flows by that cookie).
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

/** A match field in OpenFlow 1.5 text; the builders below are the only way to make one. */
export type Match = string & { readonly __match: unique symbol };
export type Action = string & { readonly __action: unique symbol };
const match = (text: string) => text as Match;
const action = (text: string) => text as Action;
const hex = (n: number) => `0x${n.toString(16)}`;

export const M = {
  ip: match('ip'),
  arp: match('arp'),
  arpRequest: match('arp_op=1'),
  inPort: (ofport: number) => match(`in_port=${ofport}`),
  tunnelId: (vni: number) => match(`tun_id=${hex(vni)}`),
  source: (s: Source) => match(`reg0=${hex(s)}/0xf`),
  portFound: match(`reg0=${hex(PORT_FOUND)}/${hex(PORT_FOUND)}`),
  ethSrc: (mac: string) => match(`dl_src=${mac}`),
  ethDst: (mac: string) => match(`dl_dst=${mac}`),
  ipSrc: (ip: IPAddr) => match(`nw_src=${ip.toString()}`),
  ipDst: (dst: IPAddr | IPNet) => match(`nw_dst=${dst.toString()}`),
  arpSenderIP: (ip: IPAddr) => match(`arp_spa=${ip.toString()}`),
  arpSenderMAC: (mac: string) => match(`arp_sha=${mac}`),
  arpTargetIP: (ip: IPAddr) => match(`arp_tpa=${ip.toString()}`),
};

export const A = {
  goto: (t: Table) => action(`goto_table:${TABLES[t]}`),
  setSource: (s: Source) => action(`set_field:${hex(s)}/0xf->reg0`),
  setOutPort: (ofport: number) => [action(`set_field:${hex(ofport)}->reg1`), action(`set_field:${hex(PORT_FOUND)}/${hex(PORT_FOUND)}->reg0`)],
  setEthSrc: (mac: string) => action(`set_field:${mac}->eth_src`),
  setEthDst: (mac: string) => action(`set_field:${mac}->eth_dst`),
  setTunnel: (dst: IPAddr, vni: number) => [action(`set_field:${dst.toString()}->tun_dst`), action(`set_field:${hex(vni)}->tun_id`)],
  decTtl: action('dec_ttl'),
  outputToReg1: action('output:NXM_NX_REG1[]'),
  normal: action('NORMAL'),
  drop: action('drop'),
  /** Turns an ARP request into the reply "`ip` is at `mac`" and sends it back where it came from. */
  arpReply: (ip: IPAddr, mac: string) => [
    action('move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]'),
    action(`set_field:${mac}->eth_src`),
    action('set_field:2->arp_op'),
    action('move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[]'),
    action(`set_field:${mac}->arp_sha`),
    action('move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[]'),
    action(`set_field:${ip.toString()}->arp_spa`),
    action('IN_PORT'),
  ],
};

export interface Flow {
  readonly table: Table;
  readonly priority: number;
  readonly match: readonly Match[];
  readonly actions: readonly Action[];
  readonly cookie: bigint;
}

export function renderFlow(f: Flow): string {
  const fields = [`cookie=0x${f.cookie.toString(16)}`, `table=${TABLES[f.table]}`, `priority=${f.priority}`, ...f.match];
  return `${fields.join(',')},actions=${f.actions.join(',')}`;
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
  return new FlowSet(cookieOf(round, Category.Pod, ofport))
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
  return new FlowSet(cookieOf(round, Category.Peer, Number(subnet.ip.value)))
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
