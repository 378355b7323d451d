// The policy engine's state (engine.ts): what it keeps per namespace, pod, policy, rule and peer,
// and the small pure helpers over it.
import { createHash } from 'node:crypto';

import type { IPInterval } from './ipblock.js';
import type { Direction, PeerPort, RuleInfo } from './model.js';
import { NAMESPACE_NAME_LABEL, type NetworkPolicy, type Pod, type PolicyRule } from './objects.js';
import type { Protocol } from './ports.js';
import { indexableRequirements, type Labels, type LabelSelector } from './selector.js';

export interface NsState {
  readonly name: string;
  labels: Labels;
  hasObject: boolean;
  readonly pods: Set<PodState>;
  /** label key → value → pods */
  readonly index: Map<string, Map<string, Set<PodState>>>;
}

export interface NsPeers {
  readonly byLabel: Map<string, Map<string, Set<PeerState>>>;
  readonly rest: Set<PeerState>;
}

export interface PodState {
  readonly key: string;
  pod: Pod;
  /** The pod's addresses as text, computed once per upsert (shared by every rule's set). */
  ipTexts: readonly string[];
  /** Named-port resolutions of this pod version, by "protocol/name" (see resolvedOn). */
  named: Map<string, readonly KeyedPeerPort[]>;
  /** Can be a peer: active, not host-network. */
  peerOK: boolean;
  /** Enforced here: a peer-capable pod on this node. */
  local: boolean;
  /** Rules whose sets hold something of this pod. */
  readonly rules: Set<RuleState>;
  readonly selectedBy: Set<PolicyState>;
}

export interface KeyedPeerPort {
  readonly key: string;
  readonly pp: PeerPort;
}

export interface PolicyState {
  readonly key: string;
  policy: NetworkPolicy;
  rules: RuleState[];
  readonly selected: Set<PodState>;
}

export interface PeerState {
  readonly rule: RuleState;
  /** One "In" requirement of podSel (every match has one of `values` under `key`), or null. */
  readonly hint: { readonly key: string; readonly values: ReadonlySet<string> } | null;
  /** null: the policy's own namespace. */
  readonly nsSel: LabelSelector | null;
  readonly podSel: LabelSelector;
  readonly nsMatch: Set<string>;
}

export interface RuleState {
  readonly id: string;
  readonly policy: PolicyState;
  readonly direction: Direction;
  readonly index: number;
  readonly rule: PolicyRule;
  readonly peers: PeerState[];
  readonly blocks: readonly IPInterval[];
  readonly named: ReadonlyArray<{ readonly name: string; readonly protocol: Protocol }>;
  readonly info: RuleInfo;
  readonly contrib: Map<PodState, readonly string[]>;
  readonly addrs: Map<string, number>;
  readonly namedContrib: Map<PodState, readonly KeyedPeerPort[]>;
  readonly tuples: Map<string, { readonly pp: PeerPort; n: number }>;
}

export const EMPTY: readonly never[] = [];

export function mapOf<K, V>(m: Map<string, Map<K, V>>, k: string): Map<K, V> {
  let v = m.get(k);
  if (!v) m.set(k, (v = new Map<K, V>()));
  return v;
}

export function setOf<V>(m: Map<string, Set<V>>, k: string): Set<V> {
  let v = m.get(k);
  if (!v) m.set(k, (v = new Set<V>()));
  return v;
}

export function ruleId(namespace: string, name: string, direction: Direction, index: number, canonical: string): string {
  const h = createHash('sha256').update(JSON.stringify([namespace, name, direction, index, canonical])).digest('hex');
  return `r${h.slice(0, 20)}`;
}

export const podKey = (namespace: string, name: string) => `${namespace}/${name}`;

/** Pods of `st` that may match `sel`: the smallest posting list of an "In" requirement, else all. */
export function candidatesFor(st: NsState, sel: LabelSelector): Iterable<PodState> {
  let best: PodState[] | null = null;
  for (const req of indexableRequirements(sel)) {
    const byValue = st.index.get(req.key);
    const found: PodState[] = [];
    if (byValue) for (const v of req.values) for (const ps of byValue.get(v) ?? EMPTY) found.push(ps);
    if (best === null || found.length < best.length) best = found;
  }
  return best ?? st.pods;
}

export function setIds(info: RuleInfo): string[] {
  const out: string[] = [];
  if (info.peers !== 'any' && info.peers.pods) out.push(info.peers.pods);
  if (info.peers !== 'any' && info.peers.cidrs) out.push(info.peers.cidrs);
  if (info.namedPeerPorts) out.push(info.namedPeerPorts);
  return out;
}

export function dropFrom<V>(m: Map<string, Set<V>>, k: string, v: V): void {
  const s = m.get(k);
  if (!s) return;
  s.delete(v);
  if (s.size === 0) m.delete(k);
}

export function defaultNsLabels(name: string): Labels {
  return new Map([[NAMESPACE_NAME_LABEL, name]]);
}

export function sameLabels(a: Labels, b: Labels): boolean {
  if (a.size !== b.size) return false;
  for (const [k, v] of a) if (b.get(k) !== v) return false;
  return true;
}

export function sameTuples(a: readonly KeyedPeerPort[], b: readonly KeyedPeerPort[]): boolean {
  return a === b || (a.length === b.length && a.every((x, i) => x.key === b[i]!.key));
}

export function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
