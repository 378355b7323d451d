// The names and fixed skeleton of the NetworkPolicy table on bridge-based nodes (vxlan, host-gw).
//
// One weft-owned table, `inet weft_policy`. Base chains (priority `filter - 10`: after DNAT at
// dstnat, so service traffic already carries the pod address; before iptables-nft's filter chains
// and ipmasq's flannel forward chain at `filter`, which only accept — a drop here is final
// whatever they say):
//   forward  bridged same-node pod↔pod (br_netfilter) and cross-node traffic: egress of the
//            source pod, then ingress of the destination pod;
//   input    a pod to its own node's addresses: egress of the source pod.
// There is no output chain: node → local pod traffic (kubelet probes) never crosses forward, so
// it is allowed by construction, and replies to it come back established.
// Dispatch is by verdict maps keyed by pod address (`ip saddr vmap @egress_v4` …): a pod not
// isolated in a direction is absent from that map, so the per-packet cost does not grow with the
// number of pods or policies. A pod's chain returns on the first rule that allows (so forward
// goes on to the destination's ingress) and ends in a counted drop.
import { createHash } from 'node:crypto';

import type { Direction } from '../model.js';

export const TABLE_FAMILY = 'inet';
export const TABLE_NAME = 'weft_policy';

export type Fam = 4 | 6;
export const FAMILIES: readonly Fam[] = [4, 6];

/** Base chains, in the order they are created. */
export const BASE_CHAINS = [
  { name: 'pod_forward', hook: 'forward', directions: ['egress', 'ingress'] as const },
  { name: 'pod_input', hook: 'input', directions: ['egress'] as const },
] as const;

/** nft's priority for our base chains: `filter - 10` (see the header). */
export const BASE_PRIORITY = -10;

/** The verdict map of one direction and family. */
export const mapName = (dir: Direction, fam: Fam): string => `${dir}_v${fam}`;

/** The address field the map is keyed by: the pod is the source of egress, the destination of ingress. */
export const podAddrField = (dir: Direction): 'saddr' | 'daddr' => (dir === 'egress' ? 'saddr' : 'daddr');
/** The peer's address field in a pod's chain. */
export const peerAddrField = (dir: Direction): 'saddr' | 'daddr' => (dir === 'egress' ? 'daddr' : 'saddr');

export const ipProto = (fam: Fam): 'ip' | 'ip6' => (fam === 4 ? 'ip' : 'ip6');

/**
 * A pod's chain: a hash of "namespace/name", never the names themselves (they are the API's
 * strings; a hash is always a plain nft name and always short).
 */
export function podChainName(podKey: string, dir: Direction): string {
  const h = createHash('sha256').update(podKey).digest('hex').slice(0, 20);
  return `pod_${h}_${dir === 'ingress' ? 'in' : 'eg'}`;
}

/** The nft set holding one family of an engine set (ids are `r` + 20 hex + `_pods|_cidrs|_ports`). */
export const setName = (engineSet: string, fam: Fam): string => `${engineSet}_v${fam}`;

/** A short digest put in each rule's comment: how a rule read back is matched to the one rendered. */
export function digest(text: string): string {
  return createHash('sha256').update(text).digest('hex').slice(0, 12);
}
