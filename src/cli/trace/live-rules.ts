// The live masquerade and forward rules (iptables-save, nft list) read back for the trace: checked
// against weft's rule model chain by chain, and evaluated for the packet to see what they really do.
import { parseSave, planTable, ruleSpec } from '../../ipmasq/iptables.js';
import { agentRules, LINK_LOCAL } from '../../ipmasq/agent-rules.js';
import { CHAIN_NAMES, masqRules, type ChainKind, type ChainSpec, type Rule } from '../../ipmasq/model.js';
import { compareTable, nftTable, parseListTable, ruleText, type ListedTable } from '../../ipmasq/nftables.js';
import { IPNet, MULTICAST } from '../../util/ip.js';
import type { Context } from './context.js';
import { evalNftChain, evalNftRules, evalXtChain, parseNftChain, parseXtTable, type RulePacket } from './rules.js';
import type { LiveState, MasqueradeEvidence } from './types.js';

export interface LiveRules {
  readonly nat: ReturnType<typeof parseXtTable> | null;
  readonly natSave: ReturnType<typeof parseSave> | null;
  readonly filterSave: ReturnType<typeof parseSave> | null;
  readonly nft: ListedTable | null;
  readonly fullyRandom: boolean;
}

export function readLive(c: Context): LiveRules {
  const r = c.f.rules;
  let nft: ListedTable | null = null;
  try {
    nft = r.nft ? parseListTable(r.nft) : null;
  } catch {
    nft = null;
  }
  const natSave = r.iptablesNat !== null ? parseSave(r.iptablesNat) : null;
  // The daemon probes --random-fully; whatever it wrote is the model's choice.
  const fullyRandom =
    r.mode === 'iptables'
      ? (natSave?.appends.some((l) => l.startsWith(`-A ${CHAIN_NAMES.masq.chain} `) && l.includes('--random-fully')) ?? true)
      : nft
        ? [...nft.rules.values()].flat().some((e) => JSON.stringify(e).includes('fully-random'))
        : true;
  return {
    nat: r.iptablesNat !== null ? parseXtTable(r.iptablesNat) : null,
    natSave,
    filterSave: r.iptablesFilter !== null ? parseSave(r.iptablesFilter) : null,
    nft,
    fullyRandom,
  };
}

export function modelRuleText(c: Context, kind: ChainKind, rule: Rule): string {
  const n = CHAIN_NAMES[kind];
  return c.f.rules.mode === 'iptables' ? `-A ${n.chain} ${ruleSpec(rule, n.comment)}` : ruleText(c.family, rule);
}

export function chainLabel(c: Context, kind: ChainKind): string {
  const n = CHAIN_NAMES[kind];
  if (c.f.rules.mode === 'iptables') return n.chain;
  const t = nftTable(c.family);
  return `${t.family} ${t.name} ${n.nftChain}`;
}

/** The keeper's problem lines, said from trace's side (trace removes nothing). */
const asFinding = (p: string): string => p.replace(/: not wanted, removing$/, ': present although not wanted');

/**
 * Live check of one chain against the model: iptables read back per table, nft per whole table.
 * `unwanted`: weft's chains that must not be there (flannel's chain in agent mode and the other way round).
 */
export function liveCheck(
  c: Context,
  live: LiveRules,
  kind: ChainKind,
  spec: ChainSpec | null,
  nftWant: readonly ChainSpec[],
  unwanted: readonly ChainKind[] = [],
): { state: LiveState; problems: string[] } {
  const r = c.f.rules;
  if (r.mode === 'iptables') {
    const save = CHAIN_NAMES[kind].table === 'nat' ? live.natSave : live.filterSave;
    if (!save) return { state: 'unknown', problems: [] };
    const plan = planTable(CHAIN_NAMES[kind].table, spec ? [spec] : [], spec ? unwanted : [kind, ...unwanted], save);
    if (plan.problems.length === 0) return { state: spec ? 'present' : 'not-applicable', problems: [] };
    const missing = plan.problems.some((p) => p.endsWith('chain missing') || / jump to \S+ missing$/.test(p));
    return { state: missing ? 'missing' : 'differs', problems: plan.problems.map(asFinding) };
  }
  if (r.nft === null && r.errors.some((e) => e.startsWith('nft'))) return { state: 'unknown', problems: [] };
  const name = CHAIN_NAMES[kind].nftChain;
  // Problems of this chain, and those of the table as a whole.
  const chainNames = Object.values(CHAIN_NAMES).map((n) => n.nftChain).join('|');
  const other = new RegExp(`(/|chain )(${chainNames})\\b`);
  const mine = (p: string) => p.includes(`/${name}:`) || p.includes(`chain ${name} `) || p.endsWith(`chain ${name}`);
  const theirs = (p: string) => unwanted.some((k) => p.endsWith(`unexpected chain ${CHAIN_NAMES[k].nftChain}`));
  const problems = compareTable(c.family, nftWant, live.nft).filter((p) => mine(p) || theirs(p) || !other.test(p));
  if (problems.length === 0) return { state: spec ? 'present' : 'not-applicable', problems: [] };
  const missing = problems.some((p) => /(^table .* missing|chain \S+ missing)$/.test(p));
  return { state: missing ? 'missing' : 'differs', problems: problems.map(asFinding) };
}

/** What ip-masq-agent mode's chain says, read from the live rules (its config file is the daemon's, not trace's). */
export interface AgentModel {
  /** The model rebuilt with the live chain's CIDRs: the shape (order, cluster network, MASQUERADE last) is checked, not the config. */
  readonly spec: ChainSpec;
  /** The destinations the live chain returns for, in order; null when the chain is missing. */
  readonly returns: readonly IPNet[] | null;
}

export function agentModel(c: Context, live: LiveRules, network: IPNet): AgentModel {
  const family = c.family;
  let returns: IPNet[] | null = null;
  let fullyRandom = true;
  if (c.f.rules.mode === 'iptables') {
    const chain = live.nat?.chains.get(CHAIN_NAMES.agent.chain);
    if (chain) {
      returns = chain.filter((r) => r.target === 'RETURN' && r.unknown.length === 0 && r.conds.length === 1 && r.conds[0]!.kind === 'dst' && !r.conds[0]!.negate).map((r) => (r.conds[0] as { net: IPNet }).net);
      const masq = chain.find((r) => r.target === 'MASQUERADE');
      if (masq) fullyRandom = masq.text.includes('--random-fully');
    }
  } else if (live.nft) {
    const rules = parseNftChain(live.nft, CHAIN_NAMES.agent.nftChain, family);
    if (rules) {
      returns = rules.filter((r) => r.verdict === 'RETURN' && r.conds?.length === 1 && r.conds[0]!.kind === 'dst' && !r.conds[0]!.negate).map((r) => (r.conds![0] as { net: IPNet }).net);
      const masq = rules.find((r) => r.verdict === 'MASQUERADE');
      if (masq) fullyRandom = masq.fullyRandom;
    }
  }
  const linkLocal = LINK_LOCAL[family];
  const configured = (returns ?? []).filter((n) => !n.equals(network) && !n.equals(linkLocal));
  const masqLinkLocal = returns !== null && !returns.some((n) => n.equals(linkLocal));
  const rules = agentRules(network, { nonMasqueradeCIDRs: configured, masqLinkLocal, masqLinkLocalIPv6: masqLinkLocal }, fullyRandom);
  return { spec: { family, kind: 'agent', rules }, returns };
}

interface LiveDecision {
  readonly verdict: MasqueradeEvidence['liveVerdict'];
  readonly chain: string | null;
  readonly index: number | null;
  readonly text: string | null;
  readonly label: string;
  readonly unevaluated: string[];
}

/**
 * What the live rules do: nat POSTROUTING (iptables, whoever wrote it), then weft's nft chain in
 * nftables mode (`kind`: flannel's postrtg, or ip-masq-agent mode's chain).
 */
export function liveDecision(c: Context, live: LiveRules, p: RulePacket, network: IPNet, subnet: IPNet, kind: 'masq' | 'agent'): LiveDecision {
  const unevaluated: string[] = [];
  const nft = c.f.rules.mode === 'nftables';
  const of = (verdict: LiveDecision['verdict'], chain: string | null, index: number | null, text: string | null): LiveDecision => ({
    verdict,
    chain,
    index,
    text,
    label: index !== null ? `rule ${index} of ${String(chain)}: ${String(text)}` : 'no rule',
    unevaluated,
  });
  if (live.nat) {
    const d = evalXtChain(live.nat, 'POSTROUTING', p);
    unevaluated.push(...d.unevaluated.map((u) => u.text));
    const rule = d.rule ?? d.returnedBy;
    const verdict = d.verdict === 'none' ? (d.returnedBy ? 'RETURN' : 'none') : d.verdict === 'DROP' ? 'ACCEPT' : d.verdict;
    // In nftables mode only a NAT done by someone's iptables rules matters; weft's own table follows.
    if (!nft || verdict === 'MASQUERADE' || verdict === 'SNAT') return of(verdict, rule?.chain ?? null, rule?.index ?? null, rule?.text ?? null);
  }
  if (nft && live.nft) {
    const chain = chainLabel(c, kind);
    if (kind === 'agent') {
      const rules = parseNftChain(live.nft, CHAIN_NAMES.agent.nftChain, c.family) ?? [];
      const d = evalNftRules(rules, p);
      unevaluated.push(...d.unevaluated.map((i) => `rule ${i} of ${chain}`));
      const verdict = d.verdict === 'MASQUERADE' ? 'MASQUERADE' : d.verdict === 'RETURN' ? 'RETURN' : 'none';
      return of(verdict, d.rule ? chain : null, d.rule?.index ?? null, d.rule?.text ?? null);
    }
    const multicast = IPNet.parse(MULTICAST[c.family]);
    const candidates = [true, false].flatMap((fr) => masqRules(network, subnet, multicast, fr));
    const d = evalNftChain(live.nft, CHAIN_NAMES.masq.nftChain, c.family, candidates, p);
    unevaluated.push(...d.unevaluated.map((i) => `rule ${i} of ${chain}`));
    const verdict = d.verdict === 'MASQUERADE' ? 'MASQUERADE' : d.verdict === 'RETURN' ? 'RETURN' : 'none';
    return of(verdict, d.index !== null ? chain : null, d.index, d.rule ? ruleText(c.family, d.rule) : null);
  }
  return live.nat || (nft && c.f.rules.nft === null && !c.f.rules.errors.some((e) => e.startsWith('nft'))) ? of('none', null, null, null) : of('unknown', null, null, null);
}
