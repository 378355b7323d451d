// The policy engine's output, shared by every dataplane (nftables now, the OVS pipeline later):
// per local pod an ingress and an egress rule list, rules that refer to named peer sets, and
// deltas that say which set elements, rules and pods changed. Pure data plus `applyDelta`, so a
// renderer (or a test) can keep the desired state the same way the engine does.
import type { IPInterval } from './ipblock.js';
import type { PortRange, Protocol } from './ports.js';

export type Direction = 'ingress' | 'egress';

/** One (address, protocol, port) a named port resolved to on a destination pod. */
export interface PeerPort {
  readonly ip: string;
  readonly protocol: Protocol;
  readonly port: number;
}

export function peerPortKey(p: PeerPort): string {
  return `${p.protocol} ${p.ip} ${p.port}`;
}

/**
 * A named set's content. `addresses`: pod IPs (canonical text, IPv4 and IPv6 mixed: split by
 * family when rendering) and changes as pods come and go. `intervals`: an ipBlock's CIDRs minus
 * their excepts, disjoint and sorted, fixed for the rule's lifetime. `peerPorts`: egress named
 * ports resolved per destination pod.
 */
export type SetContent =
  | { readonly kind: 'addresses'; readonly elements: ReadonlySet<string> }
  | { readonly kind: 'intervals'; readonly intervals: readonly IPInterval[] }
  | { readonly kind: 'peerPorts'; readonly elements: ReadonlyMap<string, PeerPort> };

/** The id of a rule's set of one kind: the rule's id and the kind (`r…_pods`, `r…_cidrs`, `r…_ports`). */
export const ruleSetId = (ruleId: string, kind: 'pods' | 'cidrs' | 'ports'): string => `${ruleId}_${kind}`;
/** The rule a set id belongs to. */
export const ruleOfSetId = (setId: string): string => setId.slice(0, setId.lastIndexOf('_'));

/** 'any': every address. Otherwise an address is a peer when it is in either set. */
export type RulePeers = 'any' | { readonly pods: string | null; readonly cidrs: string | null };

/**
 * One rule of one policy. `id` is derived from (namespace, name, direction, index, the rule's
 * meaning): stable across restarts, new whenever the rule changes — so a changed rule is a new
 * rule (new chain, new sets) and the old one is removed, never edited in place.
 */
export interface RuleInfo {
  readonly id: string;
  readonly policy: { readonly namespace: string; readonly name: string };
  readonly direction: Direction;
  readonly index: number;
  readonly peers: RulePeers;
  /**
   * The rule's ports when they are the same for every pod it applies to; null when an ingress
   * rule has named ports (each pod's entry holds its resolution).
   */
  readonly ports: 'any' | readonly PortRange[] | null;
  /** Egress named ports: a packet also matches when (daddr, proto, dport) is in this set. */
  readonly namedPeerPorts: string | null;
}

/**
 * A rule as it applies to one pod: a packet matches when its peer address is in the rule's
 * peers and its (protocol, port) in `ports`, or (egress) its (daddr, proto, dport) is in the
 * rule's namedPeerPorts set. `ports` of an egress rule with only named ports is [].
 */
export interface PodRuleRef {
  readonly rule: string;
  readonly ports: 'any' | readonly PortRange[];
}

/** Not isolated: everything passes. Isolated: only what some rule matches (none: deny all). */
export type DirectionPolicy = { readonly isolated: false } | { readonly isolated: true; readonly rules: readonly PodRuleRef[] };

export interface LocalPodPolicy {
  readonly namespace: string;
  readonly name: string;
  readonly ips: readonly string[];
  readonly ingress: DirectionPolicy;
  readonly egress: DirectionPolicy;
}

export interface PolicySnapshot {
  readonly sets: ReadonlyMap<string, SetContent>;
  readonly rules: ReadonlyMap<string, RuleInfo>;
  /** Keyed "namespace/name": every pod on this node that policy can apply to. */
  readonly pods: ReadonlyMap<string, LocalPodPolicy>;
}

export type SetChange =
  | { readonly id: string; readonly kind: 'addresses'; readonly add: readonly string[]; readonly remove: readonly string[] }
  | { readonly id: string; readonly kind: 'peerPorts'; readonly add: readonly PeerPort[]; readonly remove: readonly PeerPort[] };

/**
 * What one event changed. Apply in field order — create sets, change elements, add rules,
 * rewrite pods (null: the pod is no longer enforced here), remove rules, delete sets — and
 * nothing ever refers to an object that is not there.
 */
export interface PolicyDelta {
  readonly setsCreated: ReadonlyArray<{ readonly id: string; readonly content: SetContent }>;
  readonly setChanges: readonly SetChange[];
  readonly rulesAdded: readonly RuleInfo[];
  readonly pods: ReadonlyArray<{ readonly key: string; readonly policy: LocalPodPolicy | null }>;
  readonly rulesRemoved: readonly string[];
  readonly setsDeleted: readonly string[];
}

export function isEmptyDelta(d: PolicyDelta): boolean {
  return !d.setsCreated.length && !d.setChanges.length && !d.rulesAdded.length && !d.pods.length && !d.rulesRemoved.length && !d.setsDeleted.length;
}

/** The delta that builds `s` from nothing (every set, rule and pod created). */
export function snapshotDelta(s: PolicySnapshot): PolicyDelta {
  return {
    setsCreated: [...s.sets].map(([id, content]) => ({ id, content })),
    setChanges: [],
    rulesAdded: [...s.rules.values()],
    pods: [...s.pods].map(([key, policy]) => ({ key, policy })),
    rulesRemoved: [],
    setsDeleted: [],
  };
}

/** A mutable copy of desired state that deltas are applied to. */
export interface MutableSnapshot {
  sets: Map<string, SetContent>;
  rules: Map<string, RuleInfo>;
  pods: Map<string, LocalPodPolicy>;
}

export function emptySnapshot(): MutableSnapshot {
  return { sets: new Map(), rules: new Map(), pods: new Map() };
}

/** Applies `d` to `s`; throws on a delta that does not fit the state (a bug, not input). */
export function applyDelta(s: MutableSnapshot, d: PolicyDelta): void {
  for (const c of d.setsCreated) {
    if (s.sets.has(c.id)) throw new Error(`delta creates set ${c.id}, which exists`);
    s.sets.set(c.id, copyContent(c.content));
  }
  for (const ch of d.setChanges) {
    const cur = s.sets.get(ch.id);
    if (!cur || cur.kind !== ch.kind) throw new Error(`delta changes set ${ch.id}, which is not a ${ch.kind} set`);
    if (ch.kind === 'addresses' && cur.kind === 'addresses') {
      const el = new Set(cur.elements);
      for (const a of ch.remove) if (!el.delete(a)) throw new Error(`delta removes ${a} from ${ch.id}, which lacks it`);
      for (const a of ch.add) {
        if (el.has(a)) throw new Error(`delta adds ${a} to ${ch.id}, which has it`);
        el.add(a);
      }
      s.sets.set(ch.id, { kind: 'addresses', elements: el });
    } else if (ch.kind === 'peerPorts' && cur.kind === 'peerPorts') {
      const el = new Map(cur.elements);
      for (const p of ch.remove) if (!el.delete(peerPortKey(p))) throw new Error(`delta removes ${peerPortKey(p)} from ${ch.id}, which lacks it`);
      for (const p of ch.add) {
        if (el.has(peerPortKey(p))) throw new Error(`delta adds ${peerPortKey(p)} to ${ch.id}, which has it`);
        el.set(peerPortKey(p), p);
      }
      s.sets.set(ch.id, { kind: 'peerPorts', elements: el });
    }
  }
  for (const r of d.rulesAdded) {
    if (s.rules.has(r.id)) throw new Error(`delta adds rule ${r.id}, which exists`);
    s.rules.set(r.id, r);
  }
  for (const p of d.pods) {
    if (p.policy) s.pods.set(p.key, p.policy);
    else if (!s.pods.delete(p.key)) throw new Error(`delta drops pod ${p.key}, which is not there`);
  }
  for (const id of d.rulesRemoved) if (!s.rules.delete(id)) throw new Error(`delta removes rule ${id}, which is not there`);
  for (const id of d.setsDeleted) if (!s.sets.delete(id)) throw new Error(`delta deletes set ${id}, which is not there`);
}

function copyContent(c: SetContent): SetContent {
  switch (c.kind) {
    case 'addresses':
      return { kind: 'addresses', elements: new Set(c.elements) };
    case 'peerPorts':
      return { kind: 'peerPorts', elements: new Map(c.elements) };
    case 'intervals':
      return { kind: 'intervals', intervals: [...c.intervals] };
  }
}

/** A mutable copy of `s`. */
export function copySnapshot(s: PolicySnapshot): MutableSnapshot {
  const out = emptySnapshot();
  applyDelta(out, snapshotDelta(s));
  return out;
}
