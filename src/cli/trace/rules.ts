// Which rule decides a packet: on weft's rule model (src/ipmasq/model.ts), and on the live rules —
// every rule of nat POSTROUTING as iptables-save prints it (so rules of kube-proxy, docker or an
// operator count too), and weft's own nftables table. Pure.
import { canonical, ruleExpr, type ListedTable } from '../../ipmasq/nftables.js';
import { KUBE_PROXY_MARK, type Match, type Rule } from '../../ipmasq/model.js';
import { IPAddr, IPNet, type Family } from '../../util/ip.js';
import type { Proto } from './types.js';
import { splitRuleArgs } from '../../util/rule-args.js';

/** The packet as the POSTROUTING/FORWARD hooks see it. The mark is unknown to us; 0 is what a pod's packet carries. */
export interface RulePacket {
  readonly src: IPAddr;
  readonly dst: IPAddr;
  readonly proto: Proto;
  readonly dport: number | null;
  readonly iif: string | null;
  readonly oif: string | null;
  readonly mark: number;
  /** The destination is one of this node's addresses (`-m addrtype --dst-type LOCAL`, `fib daddr type local`). */
  readonly dstLocal?: boolean;
}

function matchModel(m: Match, p: RulePacket): boolean {
  if (m.kind === 'mark') return (p.mark & KUBE_PROXY_MARK) === KUBE_PROXY_MARK;
  const ip = m.kind === 'src' ? p.src : p.dst;
  return m.net.contains(ip) !== m.negate;
}

/** The first model rule that matches, with its 1-based position; null when none does. */
export function firstModelMatch(rules: readonly Rule[], p: RulePacket): { index: number; rule: Rule } | null {
  for (let i = 0; i < rules.length; i++) {
    const rule = rules[i]!;
    if (rule.matches.every((m) => matchModel(m, p))) return { index: i + 1, rule };
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// iptables-save

type XtCond =
  | { readonly kind: 'src' | 'dst'; readonly net: IPNet; readonly negate: boolean }
  | { readonly kind: 'iif' | 'oif'; readonly name: string; readonly negate: boolean }
  | { readonly kind: 'proto'; readonly proto: string; readonly negate: boolean }
  | { readonly kind: 'dport'; readonly from: number; readonly to: number; readonly negate: boolean }
  | { readonly kind: 'mark'; readonly value: number; readonly mask: number; readonly negate: boolean }
  | { readonly kind: 'dstLocal'; readonly negate: boolean };

export interface XtRule {
  readonly chain: string;
  /** 1-based position in its chain. */
  readonly index: number;
  /** The line as iptables-save printed it. */
  readonly text: string;
  readonly conds: readonly XtCond[];
  /** Matches this evaluator does not understand (e.g. `-m conntrack --ctstate DNAT`). */
  readonly unknown: readonly string[];
  readonly target: string | null;
  readonly goto: boolean;
}

export interface XtTableRules {
  readonly chains: ReadonlyMap<string, readonly XtRule[]>;
}


function parseNet(text: string): IPNet | null {
  if (text.includes('/')) return IPNet.tryParse(text);
  const ip = IPAddr.tryParse(text);
  return ip ? IPNet.of(ip, ip.bits) : null;
}

function parseNumber(text: string): number | null {
  const n = /^0x[0-9a-f]+$/i.test(text) ? parseInt(text, 16) : /^\d+$/.test(text) ? Number(text) : NaN;
  return Number.isFinite(n) ? n : null;
}

/** Modules whose options this evaluator reads (or can ignore: comment). */
const KNOWN_MODULES = new Set(['comment', 'mark', 'tcp', 'udp', 'icmp', 'icmp6', 'ipv6-icmp', 'addrtype']);

export function parseXtRule(line: string, index: number): XtRule | null {
  const tokens = splitRuleArgs(line);
  if (tokens[0] !== '-A' || tokens.length < 2) return null;
  const chain = tokens[1]!;
  const conds: XtCond[] = [];
  const unknown: string[] = [];
  let target: string | null = null;
  let goto = false;
  let negate = false;
  let i = 2;
  const value = (): string => tokens[i + 1] ?? '';
  /** Options after an unknown module belong to it until the next short option. */
  let inUnknownModule = false;
  while (i < tokens.length) {
    const t = tokens[i]!;
    if (t === '!') {
      negate = true;
      i++;
      continue;
    }
    const neg = negate;
    negate = false;
    if (t === '-j' || t === '--jump' || t === '-g' || t === '--goto') {
      target = value() || null;
      goto = t === '-g' || t === '--goto';
      break; // target options (--random-fully, --to-source ...) do not affect matching
    }
    if (t === '-s' || t === '--source' || t === '-d' || t === '--destination') {
      const net = parseNet(value());
      if (net) conds.push({ kind: t === '-s' || t === '--source' ? 'src' : 'dst', net, negate: neg });
      else unknown.push(`${t} ${value()}`);
      i += 2;
      inUnknownModule = false;
      continue;
    }
    if (t === '-i' || t === '--in-interface' || t === '-o' || t === '--out-interface') {
      conds.push({ kind: t === '-i' || t === '--in-interface' ? 'iif' : 'oif', name: value(), negate: neg });
      i += 2;
      inUnknownModule = false;
      continue;
    }
    if (t === '-p' || t === '--protocol') {
      conds.push({ kind: 'proto', proto: value().toLowerCase(), negate: neg });
      i += 2;
      inUnknownModule = false;
      continue;
    }
    if (t === '-m' || t === '--match') {
      inUnknownModule = !KNOWN_MODULES.has(value());
      if (inUnknownModule) unknown.push(`-m ${value()}`);
      i += 2;
      continue;
    }
    if (!inUnknownModule && t === '--comment') {
      i += 2;
      continue;
    }
    if (!inUnknownModule && t === '--mark') {
      const [v, m] = value().split('/');
      const val = parseNumber(v ?? '');
      const mask = m === undefined ? 0xffffffff : parseNumber(m);
      if (val === null || mask === null) unknown.push(`--mark ${value()}`);
      else conds.push({ kind: 'mark', value: val, mask, negate: neg });
      i += 2;
      continue;
    }
    // addrtype: only the destination-is-local test (ip-masq-agent's jump); other types stay unknown.
    if (!inUnknownModule && t === '--dst-type' && value() === 'LOCAL') {
      conds.push({ kind: 'dstLocal', negate: neg });
      i += 2;
      continue;
    }
    if (!inUnknownModule && (t === '--dport' || t === '--destination-port')) {
      const [a, b] = value().split(':');
      const from = parseNumber(a ?? '');
      const to = b === undefined ? from : parseNumber(b);
      if (from === null || to === null) unknown.push(`${t} ${value()}`);
      else conds.push({ kind: 'dport', from, to, negate: neg });
      i += 2;
      continue;
    }
    // Anything else is a match we cannot evaluate: keep it with its arguments.
    const args = [t];
    i++;
    while (i < tokens.length && !tokens[i]!.startsWith('-') && tokens[i] !== '!') args.push(tokens[i++]!);
    if (!inUnknownModule || unknown.length === 0) unknown.push(args.join(' '));
    else unknown[unknown.length - 1] += ` ${args.join(' ')}`;
  }
  return { chain, index, text: line, conds, unknown, target, goto };
}

export function parseXtTable(save: string): XtTableRules {
  const chains = new Map<string, XtRule[]>();
  for (const raw of save.split('\n')) {
    const line = raw.trimEnd();
    if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0]!;
      if (!chains.has(name)) chains.set(name, []);
    } else if (line.startsWith('-A ')) {
      const chain = line.split(' ')[1] ?? '';
      const list = chains.get(chain) ?? [];
      const rule = parseXtRule(line, list.length + 1);
      if (rule) list.push(rule);
      chains.set(chain, list);
    }
  }
  return { chains };
}

const PROTO_NAMES: Record<string, readonly string[]> = {
  tcp: ['tcp', '6'],
  udp: ['udp', '17'],
  icmp: ['icmp', '1', 'ipv6-icmp', 'icmpv6', 'icmp6', '58'],
};

function ifaceMatches(pattern: string, name: string | null): boolean {
  if (name === null) return false;
  return pattern.endsWith('+') ? name.startsWith(pattern.slice(0, -1)) : pattern === name;
}

function condMatches(c: XtCond, p: RulePacket): boolean {
  let hit: boolean;
  switch (c.kind) {
    case 'src':
      hit = c.net.contains(p.src);
      break;
    case 'dst':
      hit = c.net.contains(p.dst);
      break;
    case 'iif':
      hit = ifaceMatches(c.name, p.iif);
      break;
    case 'oif':
      hit = ifaceMatches(c.name, p.oif);
      break;
    case 'proto':
      hit = c.proto === 'all' || (PROTO_NAMES[p.proto] ?? []).includes(c.proto);
      break;
    case 'dport':
      hit = p.dport !== null && p.dport >= c.from && p.dport <= c.to;
      break;
    case 'mark':
      hit = ((p.mark & c.mask) >>> 0) === c.value;
      break;
    case 'dstLocal':
      hit = p.dstLocal === true;
      break;
  }
  return hit !== c.negate;
}

export type XtVerdict = 'MASQUERADE' | 'SNAT' | 'ACCEPT' | 'DROP' | 'none';

export interface XtDecision {
  /** 'none': the packet fell off the built-in chain (policy, no NAT). */
  readonly verdict: XtVerdict;
  /** The rule that decided, or null. */
  readonly rule: XtRule | null;
  /** With verdict 'none': the last RETURN rule taken, e.g. the one of FLANNEL-POSTRTG that keeps pod-to-pod traffic. */
  readonly returnedBy: XtRule | null;
  /** Rules whose known matches hit but that also use matches we cannot evaluate; assumed not to match. */
  readonly unevaluated: readonly XtRule[];
}

const TERMINAL: Readonly<Record<string, XtVerdict>> = {
  MASQUERADE: 'MASQUERADE',
  SNAT: 'SNAT',
  ACCEPT: 'ACCEPT',
  DROP: 'DROP',
  REJECT: 'DROP',
};

/** Walks `chain` (a built-in one) and the user chains it jumps to, as the kernel would. */
export function evalXtChain(table: XtTableRules, chain: string, p: RulePacket): XtDecision {
  const unevaluated: XtRule[] = [];
  let returnedBy: XtRule | null = null;
  type Outcome = { kind: 'terminal'; verdict: XtVerdict; rule: XtRule } | { kind: 'return' } | { kind: 'end' };
  const walk = (name: string, depth: number): Outcome => {
    if (depth > 32) return { kind: 'end' }; // a jump loop; iptables refuses those, be safe anyway
    for (const rule of table.chains.get(name) ?? []) {
      if (!rule.conds.every((c) => condMatches(c, p))) continue;
      if (rule.unknown.length > 0) {
        unevaluated.push(rule);
        continue;
      }
      const t = rule.target;
      if (t === null) continue;
      if (t === 'RETURN') {
        returnedBy = rule;
        return { kind: 'return' };
      }
      const verdict = TERMINAL[t];
      if (verdict) return { kind: 'terminal', verdict, rule };
      if (table.chains.has(t)) {
        const r = walk(t, depth + 1);
        if (r.kind === 'terminal') return r;
        if (rule.goto) return { kind: 'return' };
        continue;
      }
      // LOG, MARK, CONNMARK, CT ...: not terminating.
    }
    return { kind: 'end' };
  };
  const r = walk(chain, 0);
  return r.kind === 'terminal'
    ? { verdict: r.verdict, rule: r.rule, returnedBy: null, unevaluated }
    : { verdict: 'none', rule: null, returnedBy, unevaluated };
}

// ---------------------------------------------------------------------------------------------
// weft's nftables table

export interface NftDecision {
  readonly verdict: 'MASQUERADE' | 'RETURN' | 'ACCEPT' | 'none';
  /** 1-based position of the deciding rule in the listed chain. */
  readonly index: number | null;
  /** The model rule the deciding live rule was recognised as. */
  readonly rule: Rule | null;
  /** Positions of listed rules that are none of the model's (so cannot be evaluated); assumed not to match. */
  readonly unevaluated: readonly number[];
}

/**
 * Evaluates a listed chain of weft's nft table by recognising each rule as one of `candidates`
 * (the model's rules, rendered as `nft -j` prints them). A rule nobody rendered is reported, not guessed.
 */
export function evalNftChain(listed: ListedTable, chain: string, family: Family, candidates: readonly Rule[], p: RulePacket): NftDecision {
  const known = new Map(candidates.map((r) => [canonical(ruleExpr(family, r)), r]));
  const unevaluated: number[] = [];
  const rules = listed.rules.get(chain) ?? [];
  for (let i = 0; i < rules.length; i++) {
    const rule = known.get(canonical(rules[i]));
    if (!rule) {
      unevaluated.push(i + 1);
      continue;
    }
    if (rule.matches.every((m) => matchModel(m, p))) return { verdict: rule.verdict, index: i + 1, rule, unevaluated };
  }
  return { verdict: 'none', index: null, rule: null, unevaluated };
}

// ---------------------------------------------------------------------------------------------
// A chain of weft's nftables table read rule by rule (for ip-masq-agent mode, whose CIDRs come from a
// config file trace cannot see: the listed rules are the only statement of them).

type NftCond =
  | { readonly kind: 'src' | 'dst'; readonly net: IPNet; readonly negate: boolean }
  | { readonly kind: 'dstLocal' };

export interface NftRule {
  /** 1-based position in the listed chain. */
  readonly index: number;
  /** null: a rule whose expressions this reader does not know (not evaluated). */
  readonly conds: readonly NftCond[] | null;
  readonly verdict: 'MASQUERADE' | 'RETURN' | 'ACCEPT' | null;
  readonly fullyRandom: boolean;
  /** nft's text form, rebuilt from the expressions. */
  readonly text: string;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function nftNet(right: unknown, family: Family): IPNet | null {
  if (typeof right === 'string') {
    const ip = IPAddr.tryParse(right);
    return ip && ip.family === family ? IPNet.of(ip, ip.bits) : null;
  }
  if (isObj(right) && isObj(right.prefix) && typeof right.prefix.addr === 'string' && typeof right.prefix.len === 'number') {
    const n = IPNet.tryParse(`${right.prefix.addr}/${right.prefix.len}`);
    return n && n.family === family ? n : null;
  }
  return null;
}

/** One listed rule: address matches, `fib daddr type local`, and masquerade/return/accept; anything else is unknown. */
export function parseNftRule(expr: readonly unknown[], index: number, family: Family): NftRule {
  const conds: NftCond[] = [];
  const texts: string[] = [];
  let verdict: NftRule['verdict'] = null;
  let fullyRandom = false;
  let known = true;
  const proto = family === 4 ? 'ip' : 'ip6';
  for (const e of expr) {
    if (!isObj(e)) {
      known = false;
      continue;
    }
    const m = e.match;
    if (isObj(m) && (m.op === '==' || m.op === '!=')) {
      const left = m.left;
      if (isObj(left) && isObj(left.payload) && (left.payload.field === 'saddr' || left.payload.field === 'daddr')) {
        const net = nftNet(m.right, family);
        if (net) {
          const kind = left.payload.field === 'saddr' ? 'src' : 'dst';
          conds.push({ kind, net, negate: m.op === '!=' });
          texts.push(`${proto} ${String(left.payload.field)} ${m.op === '!=' ? '!= ' : ''}${net.prefix === net.bits ? net.ip.toString() : net.toString()}`);
          continue;
        }
      }
      if (m.op === '==' && isObj(left) && isObj(left.fib) && left.fib.result === 'type' && Array.isArray(left.fib.flags) && left.fib.flags.length === 1 && left.fib.flags[0] === 'daddr' && m.right === 'local') {
        conds.push({ kind: 'dstLocal' });
        texts.push('fib daddr type local');
        continue;
      }
      known = false;
      continue;
    }
    if ('masquerade' in e) {
      verdict = 'MASQUERADE';
      fullyRandom = JSON.stringify(e.masquerade ?? null).includes('fully-random');
      texts.push(fullyRandom ? 'masquerade fully-random' : 'masquerade');
      continue;
    }
    if ('return' in e || 'accept' in e) {
      verdict = 'return' in e ? 'RETURN' : 'ACCEPT';
      texts.push(verdict.toLowerCase());
      continue;
    }
    known = false;
  }
  if (!known || verdict === null) return { index, conds: null, verdict: null, fullyRandom, text: `${texts.join(' ')} (+ expressions trace does not read)`.trim() };
  return { index, conds, verdict, fullyRandom, text: texts.join(' ') };
}

export function parseNftChain(listed: ListedTable, chain: string, family: Family): NftRule[] | null {
  const rules = listed.rules.get(chain);
  if (!rules && !listed.chains.some((c) => c.name === chain)) return null;
  return (rules ?? []).map((expr, i) => parseNftRule(expr, i + 1, family));
}

function nftCondMatches(c: NftCond, p: RulePacket): boolean {
  if (c.kind === 'dstLocal') return p.dstLocal === true;
  return c.net.contains(c.kind === 'src' ? p.src : p.dst) !== c.negate;
}

export interface NftChainDecision {
  readonly verdict: 'MASQUERADE' | 'RETURN' | 'ACCEPT' | 'none';
  readonly rule: NftRule | null;
  /** Positions of rules that could not be read; assumed not to match. */
  readonly unevaluated: readonly number[];
}

/** The first rule of the chain that matches the packet (a base chain: its end is the policy, no NAT). */
export function evalNftRules(rules: readonly NftRule[], p: RulePacket): NftChainDecision {
  const unevaluated: number[] = [];
  for (const r of rules) {
    if (r.conds === null || r.verdict === null) {
      unevaluated.push(r.index);
      continue;
    }
    if (r.conds.every((c) => nftCondMatches(c, p))) return { verdict: r.verdict, rule: r, unevaluated };
  }
  return { verdict: 'none', rule: null, unevaluated };
}
