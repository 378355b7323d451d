// iptables rendering of the rule model and the exact read-back comparison. Rules are rendered in
// the form `iptables-save` prints them, so the comparison is plain text: a chain is right when
// its `-A` lines equal ours, in order, once each, and the built-in chain jumps to it exactly once.
import type { Family } from '../util/ip.js';
import {
  iptablesPayload,
  xt,
  xtAppend,
  xtChain,
  xtDeclare,
  xtDelete,
  xtDeleteChain,
  xtJoin,
  xtQuote,
  type IptablesPayload,
  type XtLine,
  type XtSpec,
} from '../render/iptables.js';
import { diffOrdered } from './compare.js';
import { CHAIN_NAMES, type ChainKind, type ChainSpec } from './model.js';
import { KUBE_PROXY_MARK, type Match, type Rule } from './rule.js';

export type XtTable = 'nat' | 'filter';

const MARK = `0x${KUBE_PROXY_MARK.toString(16)}`;

function matchText(m: Match): XtSpec {
  if (m.kind === 'mark') return xt`-m mark --mark ${MARK}/${MARK}`;
  const flag = m.kind === 'src' ? '-s' : '-d';
  return m.negate ? xt`! ${flag} ${m.net}` : xt`${flag} ${m.net}`;
}

const commentMatch = (comment: string): XtSpec => xt`-m comment --comment ${xtQuote('comment', comment)}`;

/** The rule spec without `-A CHAIN`, as iptables-save prints it (addresses first, then matches). */
export function ruleSpec(rule: Rule, comment: string): XtSpec {
  const addrs = rule.matches.filter((m) => m.kind !== 'mark').map(matchText);
  const mods = rule.matches.filter((m) => m.kind === 'mark').map(matchText);
  const target = rule.verdict === 'MASQUERADE' && rule.fullyRandom ? xt`-j MASQUERADE --random-fully` : xt`-j ${rule.verdict}`;
  return xtJoin([...addrs, ...mods, commentMatch(rule.comment ?? comment), target]);
}

export function chainLines(spec: ChainSpec): string[] {
  const n = CHAIN_NAMES[spec.kind];
  return spec.rules.map((r) => `-A ${n.chain} ${ruleSpec(r, n.comment)}`);
}

/** The chain's rules as payload lines (the same text as `chainLines`). */
function appendLines(spec: ChainSpec): XtLine[] {
  const n = CHAIN_NAMES[spec.kind];
  return spec.rules.map((r) => xtAppend(n.chain, ruleSpec(r, n.comment)));
}

/** The jump from the built-in chain, spec only (no `-A HOOK`); matches in ip-masq-agent's order for the agent chain. */
export function jumpSpec(kind: ChainKind): XtSpec {
  const n = CHAIN_NAMES[kind];
  const pieces = [commentMatch(n.comment)];
  if (n.nonLocalOnly) pieces.push(xt`-m addrtype ! --dst-type LOCAL`);
  pieces.push(xt`-j ${xtChain('chain', n.chain)}`);
  return xtJoin(pieces);
}

export interface SavedTable {
  readonly chains: ReadonlySet<string>;
  /** Every `-A` line, in order. */
  readonly appends: readonly string[];
}

export function parseSave(text: string): SavedTable {
  const chains = new Set<string>();
  const appends: string[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (line.startsWith(':')) chains.add(line.slice(1).split(' ')[0]!);
    else if (line.startsWith('-A ')) appends.push(line);
  }
  return { chains, appends };
}

/** `iptables-save` of every table at once, split per table (a table it does not print is empty). */
export function parseSaveTables(text: string): (table: XtTable) => SavedTable {
  const sections = new Map<string, string[]>();
  let current: string[] | null = null;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) sections.set(line.slice(1).trim(), (current = []));
    else current?.push(line);
  }
  return (table) => parseSave((sections.get(table) ?? []).join('\n'));
}

export interface TablePlan {
  /** What was wrong, one line each, for the log. Empty when the table is as wanted. */
  readonly problems: string[];
  /** The `iptables-restore --noflush` payload that fixes it, or null. */
  readonly payload: IptablesPayload | null;
}

/**
 * Compares one table's read-back with the chains weft wants there (`want`) and the kinds it must
 * not have (`unwanted`: disabled, or left over from the other implementation).
 */
export function planTable(table: XtTable, want: readonly ChainSpec[], unwanted: readonly ChainKind[], saved: SavedTable): TablePlan {
  const problems: string[] = [];
  const body: XtLine[] = [];
  for (const spec of want) {
    const n = CHAIN_NAMES[spec.kind];
    const expected = chainLines(spec);
    const actual = saved.appends.filter((l) => l.startsWith(`-A ${n.chain} `));
    const chainProblems = saved.chains.has(n.chain) ? diffOrdered(n.chain, expected, actual) : [`${n.chain}: chain missing`];
    if (chainProblems.length > 0) {
      problems.push(...chainProblems);
      // Declaring a chain under --noflush empties it: the whole chain is rewritten in one go.
      body.push(xtDeclare(n.chain), ...appendLines(spec));
    }
    const jump = `-A ${n.hook} ${jumpSpec(spec.kind)}`;
    const jumps = saved.appends.filter((l) => l === jump).length;
    if (jumps === 0) {
      problems.push(`${n.hook}: jump to ${n.chain} missing`);
      body.push(xtAppend(n.hook, jumpSpec(spec.kind)));
    } else if (jumps > 1) {
      problems.push(`${n.hook}: jump to ${n.chain} present ${jumps} times`);
      for (let i = 1; i < jumps; i++) body.push(xtDelete(n.hook, jumpSpec(spec.kind)));
    }
  }
  for (const kind of unwanted) {
    const n = CHAIN_NAMES[kind];
    if (n.table !== table) continue;
    const jump = `-A ${n.hook} ${jumpSpec(kind)}`;
    const jumps = saved.appends.filter((l) => l === jump).length;
    if (!saved.chains.has(n.chain) && jumps === 0) continue;
    problems.push(`${n.chain}: not wanted, removing`);
    // Jumps first: a chain that is still referenced cannot be deleted.
    for (let i = 0; i < jumps; i++) body.push(xtDelete(n.hook, jumpSpec(kind)));
    if (saved.chains.has(n.chain)) body.push(xtDeclare(n.chain), xtDeleteChain(n.chain));
  }
  return { problems, payload: body.length > 0 ? iptablesPayload(table, body) : null };
}

export const xtablesCommands = (family: Family): { save: string; restore: string; main: string } =>
  family === 4
    ? { save: 'iptables-save', restore: 'iptables-restore', main: 'iptables' }
    : { save: 'ip6tables-save', restore: 'ip6tables-restore', main: 'ip6tables' };
