// Pure rendering of the policy engine's output into `nft -f` transactions for the table in
// layout.ts: a snapshot into the whole table (and the shape a read-back must have), a delta into
// one incremental transaction. Every text goes through src/render/nft.ts; the only names that
// reach it are layout names, engine ids (`r` + hex) and hashes of pod keys.
import { IPAddr } from '../../util/ip.js';
import { nft, nftComment, nftJoin, nftName, nftScript, type NftPart, type NftScript } from '../../render/nft.js';
import { intervalText } from '../ipblock.js';
import { type Direction, type DirectionPolicy, type LocalPodPolicy, type MutableSnapshot, type PeerPort, type PolicyDelta, type PolicySnapshot, type RuleInfo, ruleOfSetId, type SetContent } from '../model.js';
import type { PortRange, Protocol } from '../ports.js';
import {
  BASE_CHAINS,
  BASE_PRIORITY,
  digest,
  FAMILIES,
  type Fam,
  ipProto,
  mapName,
  peerAddrField,
  podAddrField,
  podChainName,
  setName,
  TABLE_FAMILY,
  TABLE_NAME,
} from './layout.js';

export interface RenderOptions {
  /** Log default-deny drops, rate limited (5/s per pod chain). */
  readonly logDrops?: boolean;
  /**
   * The address families the cluster uses (its network config): sets, maps and rules exist only
   * for these, so a single-stack node carries half the objects. Default: both.
   */
  readonly families?: readonly Fam[];
}

const familiesOf = (opts: RenderOptions): readonly Fam[] => opts.families ?? FAMILIES;

/** An engine set's content by id (ipBlock intervals are rendered into the rules that use them). */
type SetLookup = (id: string) => SetContent | undefined;

/** The kinds of set the table holds (ipBlock intervals are written into the rules). */
export type SetKind = 'addresses' | 'peerPorts';

/** What the table must hold, in the terms a read-back is compared in (see driver.ts). */
export interface DesiredTable {
  /** nft set → its kind and element keys (elementKey). */
  readonly sets: Map<string, { kind: SetKind; fam: Fam; keys: Set<string> }>;
  /** verdict map → pod address → the chain it jumps to. */
  readonly maps: Map<string, Map<string, string>>;
  /** chain → its rules' comments, in order (each ends with the digest of the rule's body). */
  readonly chains: Map<string, string[]>;
}

const TABLE = nft`${TABLE_FAMILY} ${nftName('table', TABLE_NAME)}`;
const PROTO_WORD: Record<Protocol, string> = { TCP: 'tcp', UDP: 'udp', SCTP: 'sctp' };

/** A rule body and the comment that carries its digest. */
interface RuleLine {
  readonly body: NftPart;
  readonly comment: string;
}

function line(tag: string, body: NftPart): RuleLine {
  return { body, comment: `${tag} ${digest(body.text)}` };
}

function addRule(chain: string, r: RuleLine): NftPart {
  return nft`add rule ${TABLE} ${nftName('chain', chain)} ${r.body} comment ${nftComment('rule comment', r.comment)}`;
}

/** "a, b, c" of checked pieces. */
function commaList(items: readonly NftPart[]): NftPart {
  return nftJoin(items.map((p, i) => (i < items.length - 1 ? nft`${p},` : p)));
}

/**
 * Addresses parsed once: a full render meets each pod address in many sets (hundreds of thousands
 * of elements at 10 000 pods), and parsing was half its time. Bounded: cleared when it is large.
 */
const parsed = new Map<string, IPAddr>();
function addr(ip: string): IPAddr {
  let a = parsed.get(ip);
  if (a === undefined) {
    if (parsed.size >= 100_000) parsed.clear();
    a = IPAddr.parse(ip);
    parsed.set(ip, a);
  }
  return a;
}

const familyOf = (ip: string): Fam => addr(ip).family;

// ---- sets ----

function setDecl(kind: 'addresses' | 'peerPorts', fam: Fam): NftPart {
  const t = fam === 4 ? 'ipv4_addr' : 'ipv6_addr';
  if (kind === 'peerPorts') return nft`{ type ${t} . inet_proto . inet_service ; }`;
  return nft`{ type ${t} ; }`;
}

const peerPortElement = (p: PeerPort): NftPart => nft`${addr(p.ip)} . ${PROTO_WORD[p.protocol]} . ${p.port}`;

/** The key a set element is compared by: canonical address, "first-last" as integers, "ip proto port". */
export const addressKey = (ip: string): string => addr(ip).toString();
export const peerPortKeyOf = (p: PeerPort): string => `${addressKey(p.ip)} ${PROTO_WORD[p.protocol]} ${p.port}`;

/** One family's elements of an engine set: what the command says and the compare keys. */
function elementsOf(content: SetContent & { kind: 'addresses' | 'peerPorts' }, fam: Fam): { parts: NftPart[]; keys: string[] } {
  const parts: NftPart[] = [];
  const keys: string[] = [];
  if (content.kind === 'addresses') {
    for (const a of [...content.elements].sort()) {
      if (familyOf(a) !== fam) continue;
      parts.push(nft`${addr(a)}`);
      keys.push(addressKey(a));
    }
  } else if (content.kind === 'peerPorts') {
    const keyed = [...content.elements.values()].filter((p) => familyOf(p.ip) === fam).map((p) => [peerPortKeyOf(p), p] as const);
    for (const [key, p] of keyed.sort((a, b) => a[0].localeCompare(b[0]))) {
      parts.push(peerPortElement(p));
      keys.push(key);
    }
  }
  return { parts, keys };
}

function elementCommand(verb: 'add' | 'delete', set: string, parts: readonly NftPart[]): NftPart[] {
  if (!parts.length) return [];
  return verb === 'add'
    ? [nft`add element ${TABLE} ${nftName('set', set)} { ${commaList(parts)} }`]
    : [nft`delete element ${TABLE} ${nftName('set', set)} { ${commaList(parts)} }`];
}

/**
 * Named sets hold pod addresses and named-port peers, which change as pods come and go. An
 * ipBlock's intervals never change for the life of its rule, so they are written into the rule as
 * ranges instead of an interval set: nft 1.0 reads back every interval set's elements before any
 * element command, which made one map edit cost ~1 s at 2 000 ipBlock sets (BENCHMARKS.md). Nor
 * is there a set no rule line refers to: the pods of an egress rule whose ports are all named
 * (its packets are matched by (address, protocol, port) in its peerPorts set).
 */
function rendered(id: string, content: SetContent, rules: ReadonlyMap<string, RuleInfo>): content is SetContent & { kind: 'addresses' | 'peerPorts' } {
  if (content.kind === 'intervals') return false;
  if (content.kind === 'peerPorts') return true;
  const rule = rules.get(ruleOfSetId(id));
  const namedOnly = rule !== undefined && rule.direction === 'egress' && Array.isArray(rule.ports) && rule.ports.length === 0;
  return !(namedOnly && rule.peers !== 'any' && rule.peers.pods === id);
}

/** Declares the set (each family) with its elements; returns each family's element keys. */
function createSet(id: string, content: SetContent & { kind: 'addresses' | 'peerPorts' }, out: NftPart[], opts: RenderOptions): Map<Fam, string[]> {
  const keys = new Map<Fam, string[]>();
  for (const fam of familiesOf(opts)) {
    const name = setName(id, fam);
    const els = elementsOf(content, fam);
    out.push(nft`add set ${TABLE} ${nftName('set', name)} ${setDecl(content.kind, fam)}`);
    out.push(...elementCommand('add', name, els.parts));
    keys.set(fam, els.keys);
  }
  return keys;
}

// ---- pod chains ----

function portMatches(ports: 'any' | readonly PortRange[]): NftPart[] {
  if (ports === 'any') return [nft``];
  const out: NftPart[] = [];
  for (const proto of ['TCP', 'UDP', 'SCTP'] as const) {
    const list = ports.filter((p) => p.protocol === proto);
    if (!list.length) continue;
    const w = PROTO_WORD[proto];
    if (list.some((p) => p.first === 0 && p.last === 65535)) {
      out.push(nft`meta l4proto ${w}`);
      continue;
    }
    // Single ports in one anonymous set; each range a match of its own (a set with ranges would
    // be an interval set, see createSet).
    const singles = list.filter((p) => p.first === p.last).map((p) => nft`${p.first}`);
    if (singles.length === 1) out.push(nft`${w} dport ${singles[0]!}`);
    else if (singles.length > 1) out.push(nft`${w} dport { ${commaList(singles)} }`);
    for (const p of list) if (p.first !== p.last) out.push(nft`${w} dport ${`${p.first}-${p.last}`}`);
  }
  return out;
}

/** The rules one rule reference puts in a pod's chain of direction `dir`. */
function refLines(rule: RuleInfo, ports: 'any' | readonly PortRange[], dir: Direction, sets: SetLookup, opts: RenderOptions): RuleLine[] {
  const out: RuleLine[] = [];
  const pm = portMatches(ports);
  const allow = (match: NftPart) => line(rule.id, nftJoin([match, nft`counter return`]));
  if (rule.peers === 'any') {
    for (const p of pm) out.push(allow(p));
  } else {
    const cidrs = rule.peers.cidrs === null ? null : sets(rule.peers.cidrs);
    if (cidrs !== undefined && cidrs !== null && cidrs.kind !== 'intervals') throw new Error(`rule ${rule.id}: set ${rule.peers.cidrs} is not an ipBlock`);
    if (cidrs === undefined) throw new Error(`rule ${rule.id} refers to set ${rule.peers.cidrs!}, which is not in the state`);
    for (const fam of familiesOf(opts)) {
      const peerField = nft`${ipProto(fam)} ${peerAddrField(dir)}`;
      const peers: NftPart[] = [];
      if (rule.peers.pods !== null) peers.push(nft`${peerField} @${nftName('set', setName(rule.peers.pods, fam))}`);
      for (const iv of cidrs?.intervals ?? []) if (iv.family === fam) peers.push(nft`${peerField} ${intervalText(iv)}`);
      for (const peer of peers) for (const p of pm) out.push(allow(nftJoin([peer, p])));
    }
  }
  if (dir === 'egress' && rule.namedPeerPorts !== null) {
    for (const fam of familiesOf(opts)) {
      out.push(allow(nft`${ipProto(fam)} daddr . meta l4proto . th dport @${nftName('set', setName(rule.namedPeerPorts, fam))}`));
    }
  }
  return out;
}

/** A pod's chain for one isolated direction: one line per allowing (rule, family, peer set, protocol), then drop. */
export function podChainLines(rules: ReadonlyMap<string, RuleInfo>, sets: SetLookup, dir: DirectionPolicy & { isolated: true }, direction: Direction, opts: RenderOptions): RuleLine[] {
  const out: RuleLine[] = [];
  for (const ref of dir.rules) {
    const rule = rules.get(ref.rule);
    if (!rule) throw new Error(`pod refers to rule ${ref.rule}, which is not in the state`);
    out.push(...refLines(rule, ref.ports, direction, sets, opts));
  }
  if (opts.logDrops) out.push(line('log', nft`limit rate 5/second burst 10 packets log prefix ${nftComment('log prefix', 'weft-policy drop: ')}`));
  out.push(line('default-deny', nft`counter drop`));
  return out;
}

function mapElement(ip: string, chain: string): NftPart {
  return nft`${addr(ip)} : jump ${nftName('chain', chain)}`;
}

/**
 * Who a verdict map sends an address to: of this node's pods isolated in `dir` and holding it, the
 * first by key. A map holds one entry per address; two pods claiming one (a terminating pod whose
 * DEL weftd did not see, and its address's next owner) would otherwise make every transaction
 * that writes the second fail. Over the local pods only (a node's hundred, not the cluster).
 */
function mapOwners(pods: ReadonlyMap<string, LocalPodPolicy>, dir: Direction, opts: RenderOptions): Map<string, string> {
  const owners = new Map<string, string>();
  for (const key of [...pods.keys()].sort()) {
    const pod = pods.get(key)!;
    if (!pod[dir].isolated) continue;
    for (const ip of pod.ips) {
      if (!familiesOf(opts).includes(familyOf(ip))) continue;
      const k = addressKey(ip);
      if (!owners.has(k)) owners.set(k, key);
    }
  }
  return owners;
}

// ---- base chains ----

function baseLines(opts: RenderOptions): Map<string, RuleLine[]> {
  const out = new Map<string, RuleLine[]>();
  for (const b of BASE_CHAINS) {
    const lines: RuleLine[] = [line('ct', nft`ct state established,related accept`), line('ct', nft`ct state invalid drop`)];
    for (const dir of b.directions) {
      for (const fam of familiesOf(opts)) {
        lines.push(line('dispatch', nft`${ipProto(fam)} ${podAddrField(dir)} vmap @${nftName('map', mapName(dir, fam))}`));
      }
    }
    out.set(b.name, lines);
  }
  return out;
}

const PRIORITY = nft`filter - ${-BASE_PRIORITY}`;

// ---- the whole table ----

/**
 * The transaction that makes the table exactly `snap`, and what a read-back must show. With
 * `replace`, an existing table goes in the same transaction (add + delete + add: works whether
 * or not it exists), so there is never a moment without policy.
 */
export function renderFull(snap: PolicySnapshot, opts: RenderOptions = {}, replace = false): { script: NftScript; desired: DesiredTable } {
  const desired: DesiredTable = { sets: new Map(), maps: new Map(), chains: new Map() };
  const out: NftPart[] = [];
  const table = nft`add table ${TABLE} { comment ${nftComment('table comment', 'weft NetworkPolicy')} ; }`;
  if (replace) out.push(table, nft`delete table ${TABLE}`);
  out.push(table);
  for (const id of [...snap.sets.keys()].sort()) {
    const content = snap.sets.get(id)!;
    if (!rendered(id, content, snap.rules)) continue;
    for (const [fam, keys] of createSet(id, content, out, opts)) desired.sets.set(setName(id, fam), { kind: content.kind, fam, keys: new Set(keys) });
  }
  const mapEls = new Map<string, NftPart[]>();
  for (const dir of ['ingress', 'egress'] as const) {
    for (const fam of familiesOf(opts)) {
      const m = mapName(dir, fam);
      out.push(nft`add map ${TABLE} ${nftName('map', m)} { type ${fam === 4 ? 'ipv4_addr' : 'ipv6_addr'} : verdict ; }`);
      desired.maps.set(m, new Map());
      mapEls.set(m, []);
    }
  }
  for (const key of [...snap.pods.keys()].sort()) {
    const pod = snap.pods.get(key)!;
    for (const dir of ['ingress', 'egress'] as const) {
      const dp = pod[dir];
      if (!dp.isolated) continue;
      const chain = podChainName(key, dir);
      const lines = podChainLines(snap.rules, (id) => snap.sets.get(id), dp, dir, opts);
      out.push(nft`add chain ${TABLE} ${nftName('chain', chain)}`);
      for (const l of lines) out.push(addRule(chain, l));
      desired.chains.set(chain, lines.map((l) => l.comment));
    }
  }
  for (const dir of ['ingress', 'egress'] as const) {
    for (const [ip, key] of mapOwners(snap.pods, dir, opts)) {
      const m = mapName(dir, familyOf(ip));
      mapEls.get(m)!.push(mapElement(ip, podChainName(key, dir)));
      desired.maps.get(m)!.set(ip, podChainName(key, dir));
    }
  }
  for (const [m, els] of mapEls) out.push(...elementCommand('add', m, els));
  for (const [name, lines] of baseLines(opts)) {
    const hook = BASE_CHAINS.find((b) => b.name === name)!.hook;
    out.push(nft`add chain ${TABLE} ${nftName('chain', name)} { type filter hook ${hook} priority ${PRIORITY} ; policy accept ; }`);
    for (const l of lines) out.push(addRule(name, l));
    desired.chains.set(name, lines.map((l) => l.comment));
  }
  return { script: nftScript(out), desired };
}

export function renderDeleteTable(): NftScript {
  return nftScript([nft`delete table ${TABLE}`]);
}

// ---- deltas ----

/**
 * One transaction for `delta` against `prev` (the state before it), or null when the kernel has
 * nothing to change. Order: new sets, element changes, map entries that go, pod chains added or
 * rewritten (flush + rules), map entries that come, pod chains that go, sets that go — so no
 * command refers to something that is not (or no longer) there.
 */
export function renderDelta(prev: MutableSnapshot | PolicySnapshot, delta: PolicyDelta, opts: RenderOptions = {}): NftScript | null {
  const out: NftPart[] = [];
  const oldRules = prev.rules;
  const newRules = new Map(prev.rules);
  for (const r of delta.rulesAdded) newRules.set(r.id, r);
  for (const c of delta.setsCreated) if (rendered(c.id, c.content, newRules)) createSet(c.id, c.content, out, opts);
  for (const ch of delta.setChanges) {
    if (ch.kind === 'addresses' && !rendered(ch.id, { kind: 'addresses', elements: new Set() }, newRules)) continue;
    for (const fam of familiesOf(opts)) {
      const name = setName(ch.id, fam);
      if (ch.kind === 'addresses') {
        out.push(...elementCommand('delete', name, ch.remove.filter((a) => familyOf(a) === fam).map((a) => nft`${addr(a)}`)));
        out.push(...elementCommand('add', name, ch.add.filter((a) => familyOf(a) === fam).map((a) => nft`${addr(a)}`)));
      } else {
        out.push(...elementCommand('delete', name, ch.remove.filter((p) => familyOf(p.ip) === fam).map(peerPortElement)));
        out.push(...elementCommand('add', name, ch.add.filter((p) => familyOf(p.ip) === fam).map(peerPortElement)));
      }
    }
  }
  const oldSets: SetLookup = (id) => prev.sets.get(id);
  const created = new Map(delta.setsCreated.map((c) => [c.id, c.content]));
  const newSets: SetLookup = (id) => created.get(id) ?? prev.sets.get(id);
  const inFamilies = (ip: string) => familiesOf(opts).includes(familyOf(ip));

  const mapDel = new Map<string, NftPart[]>();
  const mapAdd = new Map<string, NftPart[]>();
  const push = (m: Map<string, NftPart[]>, k: string, p: NftPart) => {
    const l = m.get(k);
    if (l) l.push(p);
    else m.set(k, [p]);
  };
  const chainCmds: NftPart[] = [];
  const chainDels: NftPart[] = [];
  const newPods = new Map(prev.pods);
  const touched = new Set<string>();
  for (const { key, policy } of delta.pods) {
    if (policy) newPods.set(key, policy);
    else newPods.delete(key);
    const old: LocalPodPolicy | undefined = prev.pods.get(key);
    for (const ip of [...(old?.ips ?? []), ...(policy?.ips ?? [])]) if (inFamilies(ip)) touched.add(addressKey(ip));
    for (const dir of ['ingress', 'egress'] as const) {
      const chain = podChainName(key, dir);
      const o = old?.[dir];
      const n = policy?.[dir];
      const oldLines = o?.isolated ? podChainLines(oldRules, oldSets, o, dir, opts) : null;
      const newLines = n?.isolated ? podChainLines(newRules, newSets, n, dir, opts) : null;
      if (newLines) {
        const same = oldLines !== null && oldLines.length === newLines.length && oldLines.every((l, i) => l.comment === newLines[i]!.comment);
        if (!same) {
          chainCmds.push(oldLines ? nft`flush chain ${TABLE} ${nftName('chain', chain)}` : nft`add chain ${TABLE} ${nftName('chain', chain)}`);
          for (const l of newLines) chainCmds.push(addRule(chain, l));
        }
      } else if (oldLines) {
        chainDels.push(nft`delete chain ${TABLE} ${nftName('chain', chain)}`);
      }
    }
  }
  // The map entries of the addresses the changed pods held or hold, from who owns them before and after.
  if (touched.size > 0) {
    for (const dir of ['ingress', 'egress'] as const) {
      const before = mapOwners(prev.pods, dir, opts);
      const after = mapOwners(newPods, dir, opts);
      for (const ip of [...touched].sort()) {
        const b = before.get(ip);
        const a = after.get(ip);
        if (a === b) continue;
        const m = mapName(dir, familyOf(ip));
        if (b !== undefined) push(mapDel, m, nft`${addr(ip)}`);
        if (a !== undefined) push(mapAdd, m, mapElement(ip, podChainName(a, dir)));
      }
    }
  }
  for (const [m, els] of mapDel) out.push(...elementCommand('delete', m, els));
  out.push(...chainCmds);
  for (const [m, els] of mapAdd) out.push(...elementCommand('add', m, els));
  out.push(...chainDels);
  for (const id of delta.setsDeleted) {
    const content = prev.sets.get(id);
    if (content === undefined || !rendered(id, content, oldRules)) continue;
    for (const fam of familiesOf(opts)) out.push(nft`delete set ${TABLE} ${nftName('set', setName(id, fam))}`);
  }
  return out.length ? nftScript(out) : null;
}
