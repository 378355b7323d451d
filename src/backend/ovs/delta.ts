// A batch of peer changes as the difference it makes to what the ovs backend has programmed: the
// peers whose flows and host route go, and those whose flows and route are (re)installed. Pure:
// the backend turns it into one `--bundle add-flows` (deletes by the peers' cookies first, then
// the adds) and one netlink batch, and moves its model forward only when both were accepted.
import type { PeerChange } from '../peer-set.js';
import type { Lease } from '../../subnet/lease.js';
import type { NetlinkOp } from '../../netlink/index.js';
import { EXACT_MASK, gatewayOf, peerCookie, peerFlows, type FlowMod, type NodePorts, type PeerNode } from './pipeline.js';

/** What the backend believes is programmed: one peer per subnet (flows under the current round, host route). */
export type PeerModel = ReadonlyMap<string, PeerNode>;

export interface PeerDelta {
  /** Programmed peers whose flows are deleted (by cookie, before anything is added); their route goes unless `add` has the subnet. */
  readonly remove: readonly PeerNode[];
  /** Peers whose flows are added and whose route is replaced. */
  readonly add: readonly PeerNode[];
}

export const peerKey = (p: Pick<PeerNode, 'subnet'>): string => p.subnet.toString();

function samePeer(a: PeerNode, b: PeerNode): boolean {
  return a.subnet.equals(b.subnet) && a.publicIP.equals(b.publicIP);
}

/**
 * The delta for a batch's net changes. `usable` turns a lease into the peer it programs (null:
 * not programmed). A peer that ends as it was programmed is left alone; the others are looked
 * up by subnet, so a lease replaced by another one for the same subnet in one batch is one change.
 */
export function planPeerDelta(model: PeerModel, changes: readonly PeerChange[], usable: (lease: Lease) => PeerNode | null): PeerDelta {
  const remove = new Map<string, PeerNode>();
  const add = new Map<string, PeerNode>();
  for (const c of changes) {
    for (const lease of [c.before, c.after]) {
      const key = lease?.subnet?.toString();
      const programmed = key === undefined ? undefined : model.get(key);
      if (key !== undefined && programmed) remove.set(key, programmed);
    }
  }
  for (const c of changes) {
    const peer = c.after ? usable(c.after) : null;
    if (peer) add.set(peerKey(peer), peer);
  }
  for (const [key, peer] of add) {
    const was = remove.get(key);
    if (was && samePeer(was, peer)) {
      remove.delete(key);
      add.delete(key);
    }
  }
  return { remove: [...remove.values()], add: [...add.values()] };
}

export function isEmptyDelta(d: PeerDelta): boolean {
  return d.remove.length === 0 && d.add.length === 0;
}

/** The flow mods of a delta, in bundle order: every delete, then every add. */
export function deltaFlowMods(d: PeerDelta, round: number, node: Pick<NodePorts, 'gatewayMAC' | 'vni'>): FlowMod[] {
  return [
    ...d.remove.map((p): FlowMod => ({ op: 'delete', cookie: peerCookie(round, p.subnet), mask: EXACT_MASK })),
    ...d.add.flatMap((p) => peerFlows(round, node, p).map((flow): FlowMod => ({ op: 'add', flow }))),
  ];
}

/**
 * The host routes of a delta (`peer subnet via peer gateway dev <gateway port> onlink`, protocol
 * 88): replaced for the added peers, deleted by destination (weft's protocol only) for the
 * removed ones that are not added back.
 */
export function deltaRouteOps(d: PeerDelta, gatewayIndex: number): NetlinkOp[] {
  const added = new Set(d.add.map(peerKey));
  return [
    ...d.remove.filter((p) => !added.has(peerKey(p))).map((p): NetlinkOp => ({ kind: 'route-delete', route: { dst: p.subnet } })),
    ...d.add.map((p): NetlinkOp => ({ kind: 'route-replace', route: { dst: p.subnet, gateway: gatewayOf(p.subnet), oif: gatewayIndex, onlink: true } })),
  ];
}

/** The model after the delta took effect. */
export function applyDelta(model: Map<string, PeerNode>, d: PeerDelta): void {
  for (const p of d.remove) model.delete(peerKey(p));
  for (const p of d.add) model.set(peerKey(p), p);
}
