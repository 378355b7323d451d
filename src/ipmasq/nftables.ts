// nftables rendering of the rule model (tables `ip flannel-ipv4` / `ip6 flannel-ipv6`, flannel's
// names) and the exact read-back comparison over `nft -j list table`. A table that differs in any
// way is replaced whole in one atomic `nft -f` transaction.
import type { Family } from '../util/ip.js';
import { nft, nftComment, nftJoin, nftName, nftRule, nftRuleBody, nftScript, nftWord, type NftPart, type NftRuleText, type NftScript } from '../render/nft.js';
import { diffOrdered } from './compare.js';
import { CHAIN_NAMES, type ChainKind, type ChainSpec } from './model.js';
import { KUBE_PROXY_MARK, type Match, type Rule } from './rule.js';
import { errorMessage } from '../util/errors.js';

export const nftTable = (family: Family): { family: 'ip' | 'ip6'; name: string } =>
  family === 4 ? { family: 'ip', name: 'flannel-ipv4' } : { family: 'ip6', name: 'flannel-ipv6' };

/** Base-chain properties as `nft -j` reports them. */
const CHAIN_PROPS: Record<ChainKind, { type: string; hook: string; prio: number; priorityText: string; comment: string }> = {
  masq: { type: 'nat', hook: 'postrouting', prio: 100, priorityText: 'srcnat', comment: 'chain to manage traffic masquerading by flannel' },
  forward: { type: 'filter', hook: 'forward', prio: 0, priorityText: 'filter', comment: 'chain to accept flannel traffic' },
  agent: { type: 'nat', hook: 'postrouting', prio: 100, priorityText: 'srcnat', comment: 'ip-masq-agent mode: masquerade all but the non-masquerade CIDRs' },
};

/**
 * A base chain has no jump to carry iptables' `-m addrtype ! --dst-type LOCAL`: a chain that takes
 * non-local destinations only starts with this rule instead.
 */
const LOCAL_RETURN = {
  text: nftRule`fib daddr type local return`,
  expr: [{ match: { op: '==', left: { fib: { result: 'type', flags: ['daddr'] } }, right: 'local' } }, { return: null }] as unknown[],
};

/** The chain's rules as nft text and as `nft -j` expressions, in order. */
function chainRules(family: Family, spec: ChainSpec): { text: NftRuleText; expr: unknown[] }[] {
  const rules = spec.rules.map((r) => ({ text: ruleText(family, r), expr: ruleExpr(family, r) }));
  return CHAIN_NAMES[spec.kind].nonLocalOnly ? [LOCAL_RETURN, ...rules] : rules;
}

const hex8 = (n: number): string => `0x${n.toString(16).padStart(8, '0')}`;

function matchText(family: Family, m: Match): NftPart {
  // flannel matches the mark exactly; kube-proxy owns one bit only, so weft masks like iptables does.
  if (m.kind === 'mark') return nft`meta mark & ${hex8(KUBE_PROXY_MARK)} == ${hex8(KUBE_PROXY_MARK)}`;
  const proto = family === 4 ? 'ip' : 'ip6';
  const field = m.kind === 'src' ? 'saddr' : 'daddr';
  return m.negate ? nft`${proto} ${field} != ${m.net}` : nft`${proto} ${field} ${m.net}`;
}

export function ruleText(family: Family, rule: Rule): NftRuleText {
  const verdict =
    rule.verdict === 'MASQUERADE' ? (rule.fullyRandom ? nft`masquerade fully-random` : nft`masquerade`) : nftWord('verdict', rule.verdict.toLowerCase());
  return nftRule`${nftJoin([...rule.matches.map((m) => matchText(family, m)), verdict])}`;
}

/** The rule's expression list as `nft -j` prints it. */
export function ruleExpr(family: Family, rule: Rule): unknown[] {
  const exprs: unknown[] = rule.matches.map((m) => {
    if (m.kind === 'mark') {
      return { match: { op: '==', left: { '&': [{ meta: { key: 'mark' } }, KUBE_PROXY_MARK] }, right: KUBE_PROXY_MARK } };
    }
    const addr = m.net.ip.toString();
    // A full-length prefix is printed as a plain address.
    const right = m.net.prefix === m.net.bits ? addr : { prefix: { addr, len: m.net.prefix } };
    const left = { payload: { protocol: family === 4 ? 'ip' : 'ip6', field: m.kind === 'src' ? 'saddr' : 'daddr' } };
    return { match: { op: m.negate ? '!=' : '==', left, right } };
  });
  if (rule.verdict === 'MASQUERADE') exprs.push({ masquerade: rule.fullyRandom ? { flags: 'fully-random' } : null });
  else exprs.push({ [rule.verdict.toLowerCase()]: null });
  return exprs;
}

/** `ip flannel-ipv4` / `ip6 flannel-ipv6`. */
function tableId(family: Family): NftPart {
  const t = nftTable(family);
  return nft`${t.family} ${nftName('table', t.name)}`;
}

/** The `nft -f` transaction that makes the family's table exactly `chains` (all of one family). */
export function renderTable(family: Family, chains: readonly ChainSpec[], replace: boolean): NftScript {
  const t = nftTable(family);
  const id = tableId(family);
  const lines: NftPart[] = [];
  const table = nft`add table ${id} { comment ${nftComment('table comment', `rules for ${t.name}`)} ; }`;
  // add + delete + add in one transaction: replaces an existing table atomically, works when there is none.
  if (replace) lines.push(table, nft`delete table ${id}`);
  lines.push(table);
  for (const spec of chains) {
    const chain = nftName('chain', CHAIN_NAMES[spec.kind].nftChain);
    const p = CHAIN_PROPS[spec.kind];
    lines.push(
      nft`add chain ${id} ${chain} { type ${p.type} hook ${p.hook} priority ${p.priorityText} ; policy accept ; comment ${nftComment('chain comment', p.comment)} ; }`,
    );
    for (const r of chainRules(family, spec)) lines.push(nft`add rule ${id} ${chain} ${nftRuleBody('rule', r.text)}`);
  }
  return nftScript(lines);
}

export function renderDeleteTable(family: Family): NftScript {
  return nftScript([nft`delete table ${tableId(family)}`]);
}

interface ListedChain {
  name: string;
  type?: string;
  hook?: string;
  prio?: number;
  policy?: string;
}

export interface ListedTable {
  readonly chains: readonly ListedChain[];
  /** Rule expressions per chain, in order. */
  readonly rules: ReadonlyMap<string, unknown[][]>;
}

export class NftParseError extends Error {
  constructor(detail: string) {
    super(`cannot read nft -j output: ${detail}`);
    this.name = 'NftParseError';
  }
}

export function parseListTable(json: string): ListedTable {
  let doc: unknown;
  try {
    doc = JSON.parse(json);
  } catch (e) {
    throw new NftParseError(errorMessage(e));
  }
  const items = (doc as { nftables?: unknown }).nftables;
  if (!Array.isArray(items)) throw new NftParseError('no "nftables" array');
  const chains: ListedChain[] = [];
  const rules = new Map<string, unknown[][]>();
  for (const item of items as Record<string, unknown>[]) {
    if (item.chain && typeof item.chain === 'object') chains.push(item.chain as ListedChain);
    const rule = item.rule as { chain?: string; expr?: unknown[] } | undefined;
    if (rule && typeof rule.chain === 'string') {
      const list = rules.get(rule.chain) ?? [];
      list.push(Array.isArray(rule.expr) ? rule.expr : []);
      rules.set(rule.chain, list);
    }
  }
  return { chains, rules };
}

/** JSON with sorted keys, so equal structures compare equal whatever order nft printed. */
export function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o).sort().map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`).join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/** What is wrong with the listed table (null: it does not exist) compared with `want`. */
export function compareTable(family: Family, want: readonly ChainSpec[], listed: ListedTable | null): string[] {
  const t = nftTable(family);
  if (!listed) return want.length > 0 ? [`table ${t.family} ${t.name} missing`] : [];
  if (want.length === 0) return [`table ${t.family} ${t.name}: not wanted, removing`];
  const problems: string[] = [];
  const wantNames = new Set(want.map((s) => CHAIN_NAMES[s.kind].nftChain));
  for (const c of listed.chains) if (!wantNames.has(c.name)) problems.push(`${t.name}: unexpected chain ${c.name}`);
  for (const spec of want) {
    const name = CHAIN_NAMES[spec.kind].nftChain;
    const p = CHAIN_PROPS[spec.kind];
    const chain = listed.chains.find((c) => c.name === name);
    if (!chain) {
      problems.push(`${t.name}: chain ${name} missing`);
      continue;
    }
    if (chain.type !== p.type || chain.hook !== p.hook || chain.prio !== p.prio || chain.policy !== 'accept') {
      problems.push(`${t.name}: chain ${name} is not a ${p.type} ${p.hook} chain at priority ${p.prio} with policy accept`);
    }
    const rules = chainRules(family, spec);
    const expected = rules.map((r) => canonical(r.expr));
    const actual = (listed.rules.get(name) ?? []).map(canonical);
    const texts = new Map(rules.map((r, i) => [expected[i]!, r.text]));
    problems.push(...diffOrdered(`${t.name}/${name}`, expected, actual, (k) => texts.get(k) ?? k));
  }
  return problems;
}
