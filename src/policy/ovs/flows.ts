// The policy engine's output as OVS flows, kept incrementally (Antrea's conjunctive-match way).
//
// A rule as it applies to a group of pods is one conjunction: clause 1 the pods, then the peers
// (addresses and ipBlock prefixes) when the rule names any, then the ports when it names any; an
// egress rule's named ports are a second conjunction of (pod, (address, protocol, port)). The flow
// count is the sum of the dimensions, not their product. A conjunction whose only clause is the
// pod is a plain allow flow per pod address (OpenFlow needs two clauses). Pods of one rule whose
// ports resolve differently (ingress named ports) are different conjunctions.
//
// Flows with the same table, priority and match are one flow in OVS, so a flow here is an entry
// that conjunctions contribute to (counted: a peer can be in a rule as a pod and as an ipBlock):
// adding a peer to a rule adds one action to one entry, and only the entries an event touched are
// written. An allowed packet loads its conjunction id into reg2 (egress) or reg3 (ingress), which
// the commit table keeps in the connection's ct_label; an isolated pod's last flow per direction
// is a counted drop.
import { renderMatch } from '../../render/ofctl.js';
import { A, Category, cookieOf, TABLES, type Action, type Flow, type FlowMod, type Match, type Table } from '../../backend/ovs/pipeline.js';
import { applyDelta, emptySnapshot, ruleOfSetId, snapshotDelta, type Direction, type LocalPodPolicy, type MutableSnapshot, type PeerPort, type PolicyDelta, type PolicySnapshot, type RuleInfo } from '../model.js';
import type { PortRange } from '../ports.js';
import { intervalPrefixes, isV4, peerMatch, peerPortMatch, podMatch, portMatches } from './matches.js';

/** Clause flows and conjunction-id flows. */
const RULE_PRIORITY = 200;
/** A rule that allows a pod everything (its only clause is the pod). */
const POD_ONLY_PRIORITY = 210;
const DROP_PRIORITY = 200;

const RULE_TABLE = { egress: 'egressRule', ingress: 'ingressRule' } as const satisfies Record<Direction, Table>;
const DEFAULT_TABLE = { egress: 'egressDefaultRule', ingress: 'ingressDefaultRule' } as const satisfies Record<Direction, Table>;
/** Where an allowed packet goes on: egress to the ingress rules, ingress to the commit. */
const AFTER_ALLOW = { egress: 'ingressRule', ingress: 'conntrackCommit' } as const satisfies Record<Direction, Table>;

/** One rule as it applies to the pods whose ports resolved the same (or its named-port tuples). */
export interface Conjunction {
  readonly key: string;
  readonly id: number;
  readonly rule: RuleInfo;
  /** The egress named-port conjunction: (pod, (address, protocol, port)). */
  readonly named: boolean;
  readonly ports: 'any' | readonly PortRange[];
  readonly clauses: number;
  readonly peerClause: number | null;
  readonly portClause: number | null;
  /** Pod addresses in clause 1, counted. */
  readonly pods: Map<string, number>;
}

type Contribution = { readonly kind: 'conj'; readonly id: number; readonly clause: number; readonly clauses: number } | { readonly kind: 'allow'; readonly id: number } | { readonly kind: 'drop' };

interface Entry {
  readonly table: Table;
  readonly priority: number;
  readonly match: readonly Match[];
  readonly direction: Direction;
  /** conjunction id → clause, with a count. */
  readonly conj: Map<number, { clause: number; clauses: number; refs: number }>;
  /** conjunction id → count (plain allow flows and conj_id flows). */
  readonly allow: Map<number, number>;
  drop: number;
  /** The pod address a drop entry belongs to (counters). */
  readonly podIP: string | null;
}

const entryKey = (table: Table, priority: number, match: readonly Match[]): string => `${TABLES[table]} ${priority} ${match.map(renderMatch).sort().join(',')}`;

/** 32-bit FNV-1a: a conjunction id that is the same after a restart for the same rule and ports. */
function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

const portsSignature = (ports: 'any' | readonly PortRange[]): string => (ports === 'any' ? 'any' : ports.map((p) => `${p.protocol}:${p.first}-${p.last}`).join(','));

/** One pod address's place in the rules: conjunction memberships and default drops. */
interface Membership {
  readonly conj: { readonly key: string; readonly rule: RuleInfo; readonly named: boolean; readonly ports: 'any' | readonly PortRange[] } | null;
  readonly direction: Direction;
  readonly ip: string;
}

export class PolicyFlowModel {
  /** The engine's output as applied (explain, counters). */
  state: MutableSnapshot = emptySnapshot();
  private readonly entries = new Map<string, Entry>();
  private readonly conjs = new Map<string, Conjunction>();
  private readonly byId = new Map<number, Conjunction>();
  private readonly byRule = new Map<string, Set<Conjunction>>();
  /** What the bridge has for each entry key, as written (null: none). */
  private readonly installed = new Map<string, string>();
  private touched = new Set<string>();

  /** Starts again from `snap` (every flow recomputed; nothing counted as installed). */
  reset(snap: PolicySnapshot): void {
    this.state = emptySnapshot();
    this.entries.clear();
    this.conjs.clear();
    this.byId.clear();
    this.byRule.clear();
    this.installed.clear();
    this.touched.clear();
    this.apply(snapshotDelta(snap));
  }

  /**
   * Moves the model by one delta: sets and rules first, then the set changes for the conjunctions
   * already in use, then the pods (joining before leaving, so a conjunction a pod stays in is not
   * rebuilt), then what the delta removes.
   */
  apply(d: PolicyDelta): void {
    applyDelta(this.state, { setsCreated: d.setsCreated, setChanges: d.setChanges, rulesAdded: d.rulesAdded, pods: [], rulesRemoved: [], setsDeleted: [] });
    for (const ch of d.setChanges) {
      for (const c of this.byRule.get(ruleOfSetId(ch.id)) ?? []) {
        if (ch.kind === 'addresses' && !c.named && c.peerClause !== null && ruleUsesPodSet(c.rule, ch.id)) {
          for (const a of ch.add) if (isV4(a)) this.peer(c, a, 1);
          for (const a of ch.remove) if (isV4(a)) this.peer(c, a, -1);
        } else if (ch.kind === 'peerPorts' && c.named) {
          for (const pp of ch.add) this.peerPort(c, pp, 1);
          for (const pp of ch.remove) this.peerPort(c, pp, -1);
        }
      }
    }
    for (const p of d.pods) {
      const before = this.memberships(this.state.pods.get(p.key) ?? null);
      const after = this.memberships(p.policy);
      const key = (m: Membership) => `${m.direction} ${m.ip} ${m.conj?.key ?? 'drop'}`;
      const was = new Map(before.map((m) => [key(m), m]));
      const now = new Map(after.map((m) => [key(m), m]));
      for (const [k, m] of now) if (!was.has(k)) this.member(m, 1);
      for (const [k, m] of was) if (!now.has(k)) this.member(m, -1);
    }
    for (const id of d.rulesRemoved) for (const c of [...(this.byRule.get(id) ?? [])]) this.deactivate(c);
    applyDelta(this.state, { setsCreated: [], setChanges: [], rulesAdded: [], pods: d.pods, rulesRemoved: d.rulesRemoved, setsDeleted: d.setsDeleted });
  }

  /**
   * The flow mods that take the bridge from what was written to the model, for the entries touched
   * since the last commit. Nothing changes until `commit` (call it once the bundle was accepted):
   * after a refused bundle the same entries are written again by the next call.
   */
  pendingMods(round: number): { mods: FlowMod[]; commit: () => void } {
    const mods: FlowMod[] = [];
    const written = new Map<string, string | null>();
    const touched = [...this.touched];
    for (const key of touched) {
      const e = this.entries.get(key);
      const flow = e ? this.flowOf(e, round) : null;
      const text = flow ? flowText(flow) : null;
      if (text === (this.installed.get(key) ?? null)) continue;
      if (flow) mods.push({ op: 'add', flow });
      else if (e) mods.push({ op: 'delete-strict', flow: e });
      written.set(key, text);
    }
    return {
      mods,
      commit: () => {
        for (const [key, text] of written) {
          if (text === null) this.installed.delete(key);
          else this.installed.set(key, text);
        }
        for (const key of touched) {
          const e = this.entries.get(key);
          if (e && !this.flowOf(e, round)) this.entries.delete(key); // nothing contributes to it any more
          this.touched.delete(key);
        }
      },
    };
  }

  /** Every flow of the model (the section's part of a full table). */
  flows(round: number): Flow[] {
    const out: Flow[] = [];
    for (const e of this.entries.values()) {
      const f = this.flowOf(e, round);
      if (f) out.push(f);
    }
    return out;
  }

  /** After a whole write: what is on the bridge is exactly the model. */
  markAllWritten(round: number): void {
    this.installed.clear();
    this.touched.clear();
    for (const [key, e] of this.entries) {
      const f = this.flowOf(e, round);
      if (f) this.installed.set(key, flowText(f));
      else this.entries.delete(key);
    }
  }

  /** The entry key of a flow (the same for a dumped flow: see canonicalKey). */
  static keyOf(f: Pick<Flow, 'table' | 'priority' | 'match'>): string {
    return entryKey(f.table, f.priority, f.match);
  }

  /** What an entry key's flow decides, for counters and trace: the rule (by conjunction id) or the pod's drop. */
  describe(key: string): { readonly kind: 'allow'; readonly rule: RuleInfo; readonly conjunction: number } | { readonly kind: 'drop'; readonly direction: Direction; readonly podIP: string } | null {
    const e = this.entries.get(key);
    if (!e) return null;
    if (e.drop > 0 && e.podIP) return { kind: 'drop', direction: e.direction, podIP: e.podIP };
    const id = minKey(e.allow);
    const c = id === undefined ? undefined : this.byId.get(id);
    return c ? { kind: 'allow', rule: c.rule, conjunction: c.id } : null;
  }

  /** The conjunction id → rule of every conjunction in use (trace names rules by it). */
  conjunctions(): ReadonlyMap<number, RuleInfo> {
    return new Map([...this.byId].map(([id, c]) => [id, c.rule]));
  }

  // ---- memberships and conjunctions ----

  private memberships(policy: LocalPodPolicy | null): Membership[] {
    if (!policy) return [];
    const out: Membership[] = [];
    for (const direction of ['ingress', 'egress'] as const) {
      const dir = policy[direction];
      if (!dir.isolated) continue;
      for (const ip of policy.ips) {
        if (!isV4(ip)) continue;
        out.push({ conj: null, direction, ip });
        for (const ref of dir.rules) {
          const rule = this.state.rules.get(ref.rule);
          if (!rule) continue;
          if (ref.ports === 'any' || ref.ports.length > 0) out.push({ direction, ip, conj: { key: `${rule.id} ${portsSignature(ref.ports)}`, rule, named: false, ports: ref.ports } });
          if (direction === 'egress' && rule.namedPeerPorts) out.push({ direction, ip, conj: { key: `${rule.id} named`, rule, named: true, ports: 'any' } });
        }
      }
    }
    return out;
  }

  private member(m: Membership, sign: 1 | -1): void {
    if (!m.conj) {
      this.contribute(DEFAULT_TABLE[m.direction], DROP_PRIORITY, podMatch(m.direction, m.ip), { kind: 'drop' }, sign, m.ip);
      return;
    }
    let c = this.conjs.get(m.conj.key);
    if (!c) {
      if (sign < 0) return;
      c = this.activate(m.conj);
    }
    const refs = (c.pods.get(m.ip) ?? 0) + sign;
    if (refs > 0) c.pods.set(m.ip, refs);
    else c.pods.delete(m.ip);
    this.podClause(c, m.ip, sign);
    if (c.pods.size === 0) this.deactivate(c);
  }

  /** A conjunction gets its id, its conj_id flow and its peer and port clauses (its pods come one by one). */
  private activate(m: NonNullable<Membership['conj']>): Conjunction {
    const { rule, named, ports } = m;
    let clauses = 1;
    const peerClause = named || rule.peers === 'any' ? null : ++clauses;
    const portClause = named || ports === 'any' ? null : ++clauses;
    if (named) clauses = 2;
    let id = fnv1a(m.key) || 1;
    while (this.byId.has(id)) id = (id + 1) >>> 0 || 1;
    const c: Conjunction = { key: m.key, id, rule, named, ports, clauses, peerClause, portClause, pods: new Map() };
    this.conjs.set(c.key, c);
    this.byId.set(id, c);
    let set = this.byRule.get(rule.id);
    if (!set) this.byRule.set(rule.id, (set = new Set()));
    set.add(c);
    this.clauses(c, 1);
    return c;
  }

  private deactivate(c: Conjunction): void {
    for (const [ip, refs] of c.pods) for (let i = 0; i < refs; i++) this.podClause(c, ip, -1);
    c.pods.clear();
    this.clauses(c, -1);
    this.conjs.delete(c.key);
    this.byId.delete(c.id);
    const set = this.byRule.get(c.rule.id);
    set?.delete(c);
    if (set?.size === 0) this.byRule.delete(c.rule.id);
  }

  /** Everything of a conjunction but its pods: conj_id flow, peers, ports (or named-port tuples). */
  private clauses(c: Conjunction, sign: 1 | -1): void {
    if (c.clauses === 1) return;
    const dir = c.rule.direction;
    const table = RULE_TABLE[dir];
    this.contribute(table, RULE_PRIORITY, [{ field: 'conj_id', value: c.id }, { field: 'ip' }], { kind: 'allow', id: c.id }, sign);
    if (c.named) {
      const set = c.rule.namedPeerPorts ? this.state.sets.get(c.rule.namedPeerPorts) : undefined;
      if (set?.kind === 'peerPorts') for (const pp of set.elements.values()) this.peerPort(c, pp, sign);
      return;
    }
    if (c.peerClause !== null && c.rule.peers !== 'any') {
      const { pods, cidrs } = c.rule.peers;
      const podSet = pods ? this.state.sets.get(pods) : undefined;
      if (podSet?.kind === 'addresses') for (const a of podSet.elements) if (isV4(a)) this.peer(c, a, sign);
      const cidrSet = cidrs ? this.state.sets.get(cidrs) : undefined;
      if (cidrSet?.kind === 'intervals') for (const iv of cidrSet.intervals) for (const p of intervalPrefixes(iv)) this.peer(c, p, sign);
    }
    if (c.portClause !== null && c.ports !== 'any') {
      for (const r of c.ports) for (const match of portMatches(r)) this.contribute(table, RULE_PRIORITY, match, { kind: 'conj', id: c.id, clause: c.portClause, clauses: c.clauses }, sign);
    }
  }

  /** A pod address in clause 1 — or, when the pod is the only clause, its allow flow. */
  private podClause(c: Conjunction, ip: string, sign: 1 | -1): void {
    const dir = c.rule.direction;
    if (c.clauses === 1) this.contribute(RULE_TABLE[dir], POD_ONLY_PRIORITY, podMatch(dir, ip), { kind: 'allow', id: c.id }, sign);
    else this.contribute(RULE_TABLE[dir], RULE_PRIORITY, podMatch(dir, ip), { kind: 'conj', id: c.id, clause: 1, clauses: c.clauses }, sign);
  }

  /** An egress named port resolved on a peer: clause 2 of the rule's named-port conjunction. */
  private peerPort(c: Conjunction, pp: PeerPort, sign: 1 | -1): void {
    if (isV4(pp.ip)) this.contribute(RULE_TABLE.egress, RULE_PRIORITY, peerPortMatch(pp), { kind: 'conj', id: c.id, clause: 2, clauses: 2 }, sign);
  }

  private peer(c: Conjunction, addrOrPrefix: string, sign: 1 | -1): void {
    const dir = c.rule.direction;
    this.contribute(RULE_TABLE[dir], RULE_PRIORITY, peerMatch(dir, addrOrPrefix), { kind: 'conj', id: c.id, clause: c.peerClause!, clauses: c.clauses }, sign);
  }

  private contribute(table: Table, priority: number, match: readonly Match[], what: Contribution, sign: 1 | -1, podIP: string | null = null): void {
    const key = entryKey(table, priority, match);
    let e = this.entries.get(key);
    if (!e) {
      if (sign < 0) return;
      const direction: Direction = table === 'egressRule' || table === 'egressDefaultRule' ? 'egress' : 'ingress';
      e = { table, priority, match, direction, conj: new Map(), allow: new Map(), drop: 0, podIP };
      this.entries.set(key, e);
    }
    if (what.kind === 'drop') e.drop = Math.max(0, e.drop + sign);
    else if (what.kind === 'allow') count(e.allow, what.id, sign);
    else {
      const cur = e.conj.get(what.id);
      const refs = (cur?.refs ?? 0) + sign;
      if (refs > 0) e.conj.set(what.id, { clause: what.clause, clauses: what.clauses, refs });
      else e.conj.delete(what.id);
    }
    this.touched.add(key);
  }

  private flowOf(e: Entry, round: number): Flow | null {
    let actions: Action[];
    let id = 0;
    if (e.drop > 0) actions = [A.drop];
    else if (e.allow.size > 0) {
      id = minKey(e.allow)!;
      actions = [A.setRuleId(e.direction, id), A.goto(AFTER_ALLOW[e.direction])];
    } else if (e.conj.size > 0) {
      actions = [...e.conj].sort(([a], [b]) => a - b).map(([cid, c]): Action => ({ type: 'conjunction', id: cid, clause: c.clause, clauses: c.clauses }));
    } else return null;
    return { table: e.table, priority: e.priority, match: e.match, actions, cookie: cookieOf(round, Category.Policy, id) };
  }
}

function count(m: Map<number, number>, k: number, sign: 1 | -1): void {
  const n = (m.get(k) ?? 0) + sign;
  if (n > 0) m.set(k, n);
  else m.delete(k);
}

function minKey(m: ReadonlyMap<number, unknown>): number | undefined {
  let min: number | undefined;
  for (const k of m.keys()) if (min === undefined || k < min) min = k;
  return min;
}

function ruleUsesPodSet(rule: RuleInfo, setId: string): boolean {
  return rule.peers !== 'any' && rule.peers.pods === setId;
}

/** A flow's text without its cookie's round: what "the same flow" means between two writes. */
function flowText(f: Flow): string {
  return `${f.priority} ${f.match.map(renderMatch).join(',')} ${JSON.stringify(f.actions)} ${f.cookie & ((1n << 48n) - 1n)}`;
}
