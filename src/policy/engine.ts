// The policy engine: Namespaces, Pods and NetworkPolicies in; per local pod ingress/egress rule
// lists, and per rule named peer sets, out (model.ts). Every event returns the delta it caused,
// at a cost proportional to what it touches:
//  - pods are indexed by namespace, by (label key, value) within it, by address and by container
//    port name, so a new rule's selectors scan only candidates;
//  - rule peers are indexed by the namespaces they cover (own namespace, or those a
//    namespaceSelector matches) and by one "In" requirement of their podSelector, so a pod event
//    evaluates only rules that can select it;
//  - set contents are reference counted per rule (two pods can claim one address), so a pod
//    leaving removes exactly the addresses no other member still holds.
// State and helpers: engine-state.ts; turning changes into output: engine-delta.ts.
// `snapshot()` lists the whole desired state, for start-up and the periodic compare. A rule's id
// covers its position too, so inserting a rule before others re-creates the ones after it.
//
// Choices the spec leaves open (for the README section on NetworkPolicy):
//  - hostNetwork pods are neither selected (their traffic is the node's) nor matched as peers by
//    pod/namespace selectors; an ipBlock covering the node address does match their traffic.
//  - Succeeded/Failed pods drop out (their address may already belong to a new pod); terminating
//    pods stay until deleted.
//  - Named ports resolve by name and protocol on the destination pod: on ingress the selected
//    pod's own ports; on egress each peer pod's ports, so such a rule has a per-peer-pod
//    (address, protocol, port) set. An egress named port with `to` empty or an ipBlock peer
//    matches pods (in the block) that have the port; non-pod destinations have no named ports.
//  - A namespace not seen yet, or deleted while pods remain, has only its name label.
import { IPAddr } from '../util/ip.js';
import { DeltaBuilder, finishDelta, podView, ruleSets } from './engine-delta.js';
import {
  candidatesFor,
  defaultNsLabels,
  dropFrom,
  EMPTY,
  type KeyedPeerPort,
  mapOf,
  type NsPeers,
  type NsState,
  type PeerState,
  podKey,
  type PodState,
  type PolicyState,
  ruleId,
  type RuleState,
  sameLabels,
  sameList,
  sameTuples,
  setIds,
  setOf,
} from './engine-state.js';
import { carve, intervalsContain, mergeIntervals } from './ipblock.js';
import { type Direction, type LocalPodPolicy, peerPortKey, type PolicyDelta, type PolicySnapshot, type RuleInfo, ruleSetId, type SetContent } from './model.js';
import { type Namespace, type NetworkPolicy, type Pod, podActive, type PolicyRule } from './objects.js';
import { type Protocol, resolveNamed, resolvePorts } from './ports.js';
import { type CniPod, LocalAddressBook } from './local-addresses.js';
import { indexableRequirements, type Labels, matches } from './selector.js';

export { ruleId };
export type { CniPod };

export class PolicyEngine {
  private readonly namespaces = new Map<string, NsState>();
  private readonly pods = new Map<string, PodState>();
  private readonly policies = new Map<string, PolicyState>();
  private readonly rules = new Map<string, RuleState>();
  private readonly policiesByNs = new Map<string, Set<PolicyState>>();
  private readonly localByNs = new Map<string, Set<PodState>>();
  /** namespace → the pod peers covering it, keyed by one "In" requirement of their podSelector. */
  private readonly nsPeers = new Map<string, NsPeers>();
  private readonly nsSelPeers = new Set<PeerState>();
  /** container port name → pods that have it */
  private readonly portNameIndex = new Map<string, Set<PodState>>();
  /** port name → egress rules with that named port whose peers are `any` or ipBlocks */
  private readonly namedWide = new Map<string, Set<RuleState>>();
  private readonly ipIndex = new Map<string, Set<PodState>>();
  private readonly lastViews = new Map<string, string>();
  /** What this node's CNI ADDs and DELs said of its pods' addresses, and the API's pods. */
  private readonly cni: LocalAddressBook;

  constructor(readonly nodeName: string) {
    this.cni = new LocalAddressBook(nodeName);
  }

  // ---- namespaces ----

  upsertNamespace(ns: Namespace): PolicyDelta {
    const d = new DeltaBuilder();
    const st = this.nsState(ns.name);
    st.hasObject = true;
    if (!sameLabels(st.labels, ns.labels)) {
      st.labels = ns.labels;
      this.reevaluateNamespace(st, d);
    }
    return finishDelta(d, this.pods, this.lastViews);
  }

  deleteNamespace(name: string): PolicyDelta {
    const d = new DeltaBuilder();
    const st = this.namespaces.get(name);
    if (st) {
      st.hasObject = false;
      const labels = defaultNsLabels(name);
      if (!sameLabels(st.labels, labels)) {
        st.labels = labels;
        this.reevaluateNamespace(st, d);
      }
      this.gcNamespace(st);
    }
    return finishDelta(d, this.pods, this.lastViews);
  }

  // ---- pods ----

  upsertPod(apiPod: Pod): PolicyDelta {
    const d = new DeltaBuilder();
    const key = podKey(apiPod.namespace, apiPod.name);
    const pod = this.cni.effective(key, apiPod);
    let ps = this.pods.get(key);
    const candidates = new Set<RuleState>();
    if (ps) {
      for (const r of ps.rules) candidates.add(r);
      this.addNamedWide(candidates, ps.pod);
      this.unindexPod(ps);
      ps.pod = pod;
    } else {
      ps = { key, pod, ipTexts: EMPTY, named: new Map(), peerOK: false, local: false, rules: new Set(), selectedBy: new Set() };
      this.pods.set(key, ps);
    }
    const wasLocal = ps.local;
    const texts = pod.ips.map((ip) => ip.toString());
    if (!sameList(texts, ps.ipTexts)) ps.ipTexts = texts;
    ps.named = new Map();
    ps.peerOK = podActive(pod) && !pod.hostNetwork;
    ps.local = ps.peerOK && pod.nodeName === this.nodeName;
    this.indexPod(ps);
    this.addPeerCandidates(candidates, pod.namespace, pod.labels);
    this.addNamedWide(candidates, pod);
    for (const r of candidates) this.updateMember(r, ps, d);
    if (wasLocal || ps.local) {
      for (const pst of this.policiesByNs.get(pod.namespace) ?? EMPTY) this.updateSelection(pst, ps);
    }
    d.touched.add(key);
    return finishDelta(d, this.pods, this.lastViews);
  }

  /**
   * The addresses a CNI ADD of sandbox `pod.sandbox` on this node gave the pod: its own from now
   * on, whatever the API's status says (local-addresses.ts); a pod the API has not shown yet gets
   * them when it arrives.
   */
  setLocalAddresses(pod: CniPod, ips: readonly IPAddr[]): PolicyDelta {
    const key = podKey(pod.namespace, pod.name);
    this.cni.added(key, pod, ips);
    return this.reapply(key);
  }

  /** A CNI DEL of sandbox `pod.sandbox`: the addresses it gave the pod are gone (another sandbox's DEL changes nothing). */
  releaseLocalAddresses(pod: CniPod): PolicyDelta {
    const key = podKey(pod.namespace, pod.name);
    return this.cni.deleted(key, pod) ? this.reapply(key) : finishDelta(new DeltaBuilder(), this.pods, this.lastViews);
  }

  /** Whether the API shows `pod` (by UID when given) bound to this node. */
  isLocalPod(pod: Pick<CniPod, 'namespace' | 'name' | 'uid'>): boolean {
    return this.cni.isLocal(podKey(pod.namespace, pod.name), pod);
  }

  /** The API's pod `key` again, after what the CNI said of it changed. */
  private reapply(key: string): PolicyDelta {
    const api = this.cni.apiPod(key);
    return api ? this.upsertPod(api) : finishDelta(new DeltaBuilder(), this.pods, this.lastViews);
  }

  deletePod(namespace: string, name: string): PolicyDelta {
    const d = new DeltaBuilder();
    const key = podKey(namespace, name);
    this.cni.apiDeleted(key);
    const ps = this.pods.get(key);
    if (ps) {
      this.unindexPod(ps);
      ps.peerOK = false;
      ps.local = false;
      for (const r of [...ps.rules]) this.updateMember(r, ps, d);
      for (const pst of ps.selectedBy) pst.selected.delete(ps);
      ps.selectedBy.clear();
      this.pods.delete(key);
      const st = this.namespaces.get(namespace);
      if (st) this.gcNamespace(st);
      d.touched.add(key);
    }
    return finishDelta(d, this.pods, this.lastViews);
  }

  // ---- policies ----

  upsertPolicy(np: NetworkPolicy): PolicyDelta {
    const d = new DeltaBuilder();
    const key = podKey(np.namespace, np.name);
    let pst = this.policies.get(key);
    const oldRules = new Map<string, RuleState>();
    if (pst) {
      for (const r of pst.rules) oldRules.set(r.id, r);
      pst.policy = np;
    } else {
      pst = { key, policy: np, rules: [], selected: new Set() };
      this.policies.set(key, pst);
      setOf(this.policiesByNs, np.namespace).add(pst);
    }
    const next: RuleState[] = [];
    const defs: Array<[Direction, readonly PolicyRule[]]> = [
      ['ingress', np.ingress ?? EMPTY],
      ['egress', np.egress ?? EMPTY],
    ];
    for (const [direction, list] of defs) {
      list.forEach((rule, index) => {
        const id = ruleId(np.namespace, np.name, direction, index, rule.canonical);
        const kept = oldRules.get(id);
        if (kept) {
          oldRules.delete(id);
          next.push(kept);
        } else {
          next.push(this.createRule(pst, id, direction, index, rule, d));
        }
      });
    }
    for (const r of oldRules.values()) this.destroyRule(r, d);
    pst.rules = next;
    for (const ps of pst.selected) d.touched.add(ps.key);
    for (const ps of this.localByNs.get(np.namespace) ?? EMPTY) {
      if (this.updateSelection(pst, ps)) d.touched.add(ps.key);
    }
    return finishDelta(d, this.pods, this.lastViews);
  }

  deletePolicy(namespace: string, name: string): PolicyDelta {
    const d = new DeltaBuilder();
    const key = podKey(namespace, name);
    const pst = this.policies.get(key);
    if (pst) {
      for (const r of pst.rules) this.destroyRule(r, d);
      pst.rules = [];
      for (const ps of pst.selected) {
        ps.selectedBy.delete(pst);
        d.touched.add(ps.key);
      }
      pst.selected.clear();
      this.policies.delete(key);
      const byNs = this.policiesByNs.get(namespace);
      byNs?.delete(pst);
      if (byNs?.size === 0) this.policiesByNs.delete(namespace);
    }
    return finishDelta(d, this.pods, this.lastViews);
  }

  // ---- queries ----

  /** The whole desired state, computed afresh. */
  snapshot(): PolicySnapshot {
    const sets = new Map<string, SetContent>();
    const rules = new Map<string, RuleInfo>();
    for (const r of this.rules.values()) {
      rules.set(r.id, r.info);
      for (const [id, content] of ruleSets(r)) sets.set(id, content);
    }
    const pods = new Map<string, LocalPodPolicy>();
    for (const ps of this.pods.values()) if (ps.local) pods.set(ps.key, podView(ps));
    return { sets, rules, pods };
  }

  /** Pods ("namespace/name") currently holding `ip` (normally one; more is a conflict). */
  podsWithIP(ip: string): string[] {
    const canon = IPAddr.tryParse(ip)?.toString() ?? ip;
    return [...(this.ipIndex.get(canon) ?? EMPTY)].map((p) => p.key).sort();
  }

  // ---- internals: namespaces ----

  private nsState(name: string): NsState {
    let st = this.namespaces.get(name);
    if (!st) {
      st = { name, labels: defaultNsLabels(name), hasObject: false, pods: new Set(), index: new Map() };
      this.namespaces.set(name, st);
      for (const peer of this.nsSelPeers) if (peer.nsSel && matches(peer.nsSel, st.labels)) this.coverNs(peer, name, true);
    }
    return st;
  }

  private gcNamespace(st: NsState): void {
    if (st.hasObject || st.pods.size > 0) return;
    for (const peer of this.nsSelPeers) if (peer.nsSel && peer.nsMatch.has(st.name)) this.coverNs(peer, st.name, false);
    this.namespaces.delete(st.name);
  }

  private reevaluateNamespace(st: NsState, d: DeltaBuilder): void {
    const affected = new Set<RuleState>();
    for (const peer of this.nsSelPeers) {
      if (!peer.nsSel) continue;
      const want = matches(peer.nsSel, st.labels);
      if (want !== peer.nsMatch.has(st.name)) {
        this.coverNs(peer, st.name, want);
        affected.add(peer.rule);
      }
    }
    for (const r of affected) for (const ps of st.pods) this.updateMember(r, ps, d);
  }

  /** Records that `peer` does (or no longer does) cover namespace `ns`. */
  private coverNs(peer: PeerState, ns: string, on: boolean): void {
    let b = this.nsPeers.get(ns);
    if (on) {
      peer.nsMatch.add(ns);
      if (!b) this.nsPeers.set(ns, (b = { byLabel: new Map(), rest: new Set() }));
      if (peer.hint) for (const v of peer.hint.values) setOf(mapOf<string, Set<PeerState>>(b.byLabel, peer.hint.key), v).add(peer);
      else b.rest.add(peer);
      return;
    }
    peer.nsMatch.delete(ns);
    if (!b) return;
    if (peer.hint) {
      const byValue = b.byLabel.get(peer.hint.key);
      if (byValue) {
        for (const v of peer.hint.values) dropFrom(byValue, v, peer);
        if (byValue.size === 0) b.byLabel.delete(peer.hint.key);
      }
    } else {
      b.rest.delete(peer);
    }
    if (b.byLabel.size === 0 && b.rest.size === 0) this.nsPeers.delete(ns);
  }

  /**
   * Rules that may select a pod of `ns` with `labels`: peers whose podSelector has no "In"
   * requirement, and peers whose indexed requirement the labels satisfy. (A rule the pod stops
   * matching holds something of it, so it is in the pod's `rules` already.)
   */
  private addPeerCandidates(into: Set<RuleState>, ns: string, labels: Labels): void {
    const b = this.nsPeers.get(ns);
    if (!b) return;
    for (const p of b.rest) into.add(p.rule);
    for (const [k, v] of labels) for (const p of b.byLabel.get(k)?.get(v) ?? EMPTY) into.add(p.rule);
  }

  // ---- internals: pods ----

  private indexPod(ps: PodState): void {
    const st = this.nsState(ps.pod.namespace);
    st.pods.add(ps);
    for (const [k, v] of ps.pod.labels) setOf(mapOf<string, Set<PodState>>(st.index, k), v).add(ps);
    for (const ip of ps.ipTexts) setOf(this.ipIndex, ip).add(ps);
    for (const cp of ps.pod.ports) if (cp.name) setOf(this.portNameIndex, cp.name).add(ps);
    if (ps.local) setOf(this.localByNs, ps.pod.namespace).add(ps);
  }

  private unindexPod(ps: PodState): void {
    const st = this.namespaces.get(ps.pod.namespace);
    if (st) {
      st.pods.delete(ps);
      for (const [k, v] of ps.pod.labels) {
        const byValue = st.index.get(k);
        const s = byValue?.get(v);
        s?.delete(ps);
        if (s?.size === 0) byValue!.delete(v);
        if (byValue?.size === 0) st.index.delete(k);
      }
    }
    for (const ip of ps.ipTexts) dropFrom(this.ipIndex, ip, ps);
    for (const cp of ps.pod.ports) if (cp.name) dropFrom(this.portNameIndex, cp.name, ps);
    dropFrom(this.localByNs, ps.pod.namespace, ps);
  }

  private addNamedWide(into: Set<RuleState>, pod: Pod): void {
    for (const cp of pod.ports) if (cp.name) for (const r of this.namedWide.get(cp.name) ?? EMPTY) into.add(r);
  }

  /**
   * Brings `r`'s sets in line with what pod `ps` should contribute now. The hot path of every
   * event: no allocation when nothing changed (a pod's address list is shared by reference).
   */
  private updateMember(r: RuleState, ps: PodState, d: DeltaBuilder): void {
    const pod = ps.pod;
    let selected = false;
    if (ps.peerOK) {
      for (const p of r.peers) {
        if (p.nsMatch.has(pod.namespace) && matches(p.podSel, pod.labels)) {
          selected = true;
          break;
        }
      }
    }
    const podSet = r.info.peers !== 'any' ? r.info.peers.pods : null;
    if (podSet) {
      const ips = selected ? ps.ipTexts : EMPTY;
      const old = r.contrib.get(ps) ?? EMPTY;
      if (old !== ips && !sameList(old, ips)) {
        for (const ip of old) if (!ips.includes(ip)) this.decAddr(r, podSet, ip, d);
        for (const ip of ips) if (!old.includes(ip)) this.incAddr(r, podSet, ip, d);
        if (ips.length) r.contrib.set(ps, ips);
        else r.contrib.delete(ps);
      }
    }
    const namedSet = r.info.namedPeerPorts;
    if (namedSet) {
      const tuples = ps.peerOK ? this.namedTuples(r, ps, selected) : EMPTY;
      const old = r.namedContrib.get(ps) ?? EMPTY;
      if (!sameTuples(old, tuples)) {
        for (const t of old) if (!tuples.some((x) => x.key === t.key)) this.decTuple(r, namedSet, t, d);
        for (const t of tuples) if (!old.some((x) => x.key === t.key)) this.incTuple(r, namedSet, t, d);
        if (tuples.length) r.namedContrib.set(ps, tuples);
        else r.namedContrib.delete(ps);
      }
    }
    if (r.contrib.has(ps) || r.namedContrib.has(ps)) ps.rules.add(r);
    else ps.rules.delete(r);
  }

  /** Egress named ports resolved on destination pod `ps`, for the addresses the rule's peers cover. */
  private namedTuples(r: RuleState, ps: PodState, selected: boolean): readonly KeyedPeerPort[] {
    const pod = ps.pod;
    if (!pod.ports.length) return EMPTY;
    const whole = selected || r.info.peers === 'any';
    // The common case (one name, every address) reuses the pod's cached list, so an unchanged
    // contribution compares equal by reference.
    if (whole && r.named.length === 1) return this.resolvedOn(ps, r.named[0]!.name, r.named[0]!.protocol);
    const out: KeyedPeerPort[] = [];
    for (const n of r.named) {
      for (const t of this.resolvedOn(ps, n.name, n.protocol)) {
        if (whole || intervalsContain(r.blocks, IPAddr.parse(t.pp.ip))) out.push(t);
      }
    }
    return out;
  }

  /** (address, protocol, port) for every address of `ps` and every port named `name`/`protocol`. */
  private resolvedOn(ps: PodState, name: string, protocol: Protocol): readonly KeyedPeerPort[] {
    const k = `${protocol}/${name}`;
    let list = ps.named.get(k);
    if (!list) {
      const ports = resolveNamed(name, protocol, ps.pod.ports);
      const out: KeyedPeerPort[] = [];
      for (const ip of ps.ipTexts) {
        for (const port of ports) {
          const pp = { ip, protocol, port };
          out.push({ key: peerPortKey(pp), pp });
        }
      }
      ps.named.set(k, (list = out));
    }
    return list;
  }


  private incAddr(r: RuleState, set: string, ip: string, d: DeltaBuilder): void {
    const n = r.addrs.get(ip) ?? 0;
    r.addrs.set(ip, n + 1);
    if (n === 0) d.add(set, ip, ip);
  }

  private decAddr(r: RuleState, set: string, ip: string, d: DeltaBuilder): void {
    const n = r.addrs.get(ip) ?? 0;
    if (n <= 1) {
      r.addrs.delete(ip);
      d.remove(set, ip, ip);
    } else {
      r.addrs.set(ip, n - 1);
    }
  }

  private incTuple(r: RuleState, set: string, t: KeyedPeerPort, d: DeltaBuilder): void {
    const e = r.tuples.get(t.key);
    if (e) e.n++;
    else {
      r.tuples.set(t.key, { pp: t.pp, n: 1 });
      d.add(set, t.key, t.pp);
    }
  }

  private decTuple(r: RuleState, set: string, t: KeyedPeerPort, d: DeltaBuilder): void {
    const e = r.tuples.get(t.key);
    if (e && e.n > 1) e.n--;
    else {
      r.tuples.delete(t.key);
      d.remove(set, t.key, t.pp);
    }
  }

  // ---- internals: policies and rules ----

  /** Re-decides whether `pst` selects local pod `ps`; true when that changed. */
  private updateSelection(pst: PolicyState, ps: PodState): boolean {
    const want = ps.local && ps.pod.namespace === pst.policy.namespace && matches(pst.policy.podSelector, ps.pod.labels);
    if (want === pst.selected.has(ps)) return false;
    if (want) {
      pst.selected.add(ps);
      ps.selectedBy.add(pst);
    } else {
      pst.selected.delete(ps);
      ps.selectedBy.delete(pst);
    }
    return true;
  }

  private createRule(pst: PolicyState, id: string, direction: Direction, index: number, rule: PolicyRule, d: DeltaBuilder): RuleState {
    const ns = pst.policy.namespace;
    const podPeers = rule.peers?.filter((p) => p.kind === 'pods') ?? [];
    const blocks = mergeIntervals((rule.peers ?? []).flatMap((p) => (p.kind === 'ipBlock' ? carve(p.cidr, p.except) : [])));
    const named = direction === 'egress' ? (rule.ports ?? []).flatMap((p) => (p.kind === 'named' ? [{ name: p.name, protocol: p.protocol }] : [])) : [];
    const hasNamed = (rule.ports ?? []).some((p) => p.kind === 'named');
    const peers: RuleInfo['peers'] =
      rule.peers === null ? 'any' : { pods: podPeers.length ? ruleSetId(id, 'pods') : null, cidrs: rule.peers.some((p) => p.kind === 'ipBlock') ? ruleSetId(id, 'cidrs') : null };
    let ports: RuleInfo['ports'];
    if (rule.ports === null) ports = 'any';
    else if (direction === 'ingress' && hasNamed) ports = null;
    else ports = resolvePorts(rule.ports, null);
    const info: RuleInfo = {
      id,
      policy: { namespace: ns, name: pst.policy.name },
      direction,
      index,
      peers,
      ports,
      namedPeerPorts: named.length ? ruleSetId(id, 'ports') : null,
    };
    const r: RuleState = {
      id,
      policy: pst,
      direction,
      index,
      rule,
      peers: [],
      blocks,
      named,
      info,
      contrib: new Map(),
      addrs: new Map(),
      namedContrib: new Map(),
      tuples: new Map(),
    };
    this.rules.set(id, r);
    d.rulesAdded.set(id, r);
    for (const sid of setIds(r.info)) d.created.add(sid);

    const candidates = new Set<PodState>();
    for (const p of podPeers) {
      if (p.kind !== 'pods') continue;
      const peer: PeerState = { rule: r, hint: indexableRequirements(p.pods)[0] ?? null, nsSel: p.namespaces, podSel: p.pods, nsMatch: new Set() };
      r.peers.push(peer);
      if (peer.nsSel) {
        this.nsSelPeers.add(peer);
        for (const st of this.namespaces.values()) if (matches(peer.nsSel, st.labels)) this.coverNs(peer, st.name, true);
      } else {
        this.coverNs(peer, ns, true);
      }
      for (const nsName of peer.nsMatch) {
        const st = this.namespaces.get(nsName);
        if (st) for (const ps of candidatesFor(st, peer.podSel)) candidates.add(ps);
      }
    }
    if (named.length && (peers === 'any' || blocks.length)) {
      for (const n of named) {
        setOf(this.namedWide, n.name).add(r);
        for (const ps of this.portNameIndex.get(n.name) ?? EMPTY) candidates.add(ps);
      }
    }
    for (const ps of candidates) this.updateMember(r, ps, d);
    return r;
  }

  private destroyRule(r: RuleState, d: DeltaBuilder): void {
    for (const ps of r.contrib.keys()) ps.rules.delete(r);
    for (const ps of r.namedContrib.keys()) ps.rules.delete(r);
    for (const peer of r.peers) {
      for (const ns of [...peer.nsMatch]) this.coverNs(peer, ns, false);
      this.nsSelPeers.delete(peer);
    }
    for (const n of r.named) dropFrom(this.namedWide, n.name, r);
    for (const sid of setIds(r.info)) {
      if (d.created.delete(sid)) continue;
      d.deleted.add(sid);
    }
    this.rules.delete(r.id);
    if (!d.rulesAdded.delete(r.id)) d.rulesRemoved.add(r.id);
  }
}
