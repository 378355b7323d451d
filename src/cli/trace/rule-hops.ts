// The masquerade and forward hops: what weft's rule model decides for the packet (flannel's
// --ip-masq chain or ip-masq-agent mode's chain, and the forward chain), cross-checked against the
// live rules.
import { FOREIGN_AGENT_CHAIN, LINK_LOCAL } from '../../ipmasq/agent-rules.js';
import { CHAIN_NAMES, desiredChains, forwardRules, masqRules, type ChainSpec } from '../../ipmasq/model.js';
import { IPNet, MULTICAST } from '../../util/ip.js';
import type { Context } from './context.js';
import { agentModel, chainLabel, liveCheck, liveDecision, modelRuleText, readLive, type AgentModel, type LiveRules } from './live-rules.js';
import { firstModelMatch, type RulePacket } from './rules.js';
import type { AddressClass, ForwardEvidence, Hop, MasqueradeEvidence, RouteLookup } from './types.js';

export function addRuleHops(c: Context, hops: Hop[], srcCls: AddressClass, dstCls: AddressClass, r: Extract<RouteLookup, { ok: true }>, forwarded: boolean): void {
  if (r.type === 'local') return; // delivered here: no POSTROUTING, no FORWARD
  if (!c.network || !c.subnet) {
    hops.push({
      kind: 'masquerade',
      status: 'warning',
      summary: `cannot evaluate the masquerade rules: the cluster network or this node's subnet is unknown (no subnet.env at ${c.f.subnetFile}?)`,
      evidence: emptyMasq(c),
    });
    return;
  }
  const live = readLive(c);
  const input = [{ network: c.network, subnet: c.subnet }];
  const agentMode = c.f.env?.ipMasqMode === 'agent';
  const masqEnabled = c.f.env?.ipMasq ?? null;
  // Only the daemon knows --iptables-forward-rules; a chain that is there says "on", a missing one proves nothing.
  const fwdPresent = c.f.rules.mode === 'iptables' ? live.filterSave?.chains.has(CHAIN_NAMES.forward.chain) : live.nft?.chains.some((x) => x.name === CHAIN_NAMES.forward.nftChain);
  const fwdEnabled = c.f.rules.forwardRules ?? (fwdPresent ? true : null);
  const specs = desiredChains({ families: input, masq: !agentMode && masqEnabled !== false, forward: fwdEnabled !== false, fullyRandom: live.fullyRandom });
  const masqSpec = agentMode || masqEnabled === false ? null : (specs.find((s) => s.kind === 'masq') ?? null);
  const agent = agentMode ? agentModel(c, live, c.network) : null;
  const fwdSpec = fwdEnabled === false ? null : (specs.find((s) => s.kind === 'forward') ?? null);
  const nftWant = [masqSpec, agent?.spec ?? null, fwdSpec].filter((s): s is ChainSpec => s !== null);
  const packet: RulePacket = { src: c.f.packet.src, dst: c.f.packet.dst, proto: c.f.packet.proto, dport: c.f.packet.dport, iif: c.f.ingress, oif: r.device, mark: 0, dstLocal: false };

  if (agent) agentMasqHop(c, hops, live, agent, nftWant, packet, srcCls, dstCls, r);
  else flannelMasqHop(c, hops, live, masqSpec, nftWant, packet, srcCls, dstCls, r, masqEnabled);

  // Forward.
  if (forwarded) {
    const chain = chainLabel(c, 'forward');
    const rules = forwardRules(c.network);
    const m = firstModelMatch(rules, packet);
    const check = liveCheck(c, live, 'forward', fwdSpec, nftWant);
    const ev: ForwardEvidence = {
      mode: c.f.rules.mode,
      enabled: fwdEnabled,
      verdict: fwdEnabled !== false && m ? 'ACCEPT' : 'none',
      chain,
      rule: fwdEnabled !== false ? (m?.index ?? null) : null,
      ruleText: fwdEnabled !== false && m ? modelRuleText(c, 'forward', m.rule) : null,
      live: fwdEnabled === false ? 'not-applicable' : check.state,
      liveProblems: check.problems,
    };
    if (fwdEnabled === false) {
      hops.push({ kind: 'forward', status: 'info', summary: `weft's forward rules are off (--iptables-forward-rules=false): the FORWARD chain's own rules and policy decide`, evidence: ev });
    } else if (fwdEnabled === null && check.state === 'missing') {
      hops.push({ kind: 'forward', status: 'warning', summary: `no weft forward rules in ${chain}: off (--iptables-forward-rules=false) or deleted; the daemon did not say which`, evidence: ev });
    } else if (check.problems.length > 0) {
      hops.push({ kind: 'forward', status: 'broken', summary: `forward rules differ from the model: ${check.problems.join('; ')}`, evidence: ev });
    } else if (m) {
      hops.push({ kind: 'forward', status: 'ok', summary: `accepted by rule ${m.index} of ${chain}: ${modelRuleText(c, 'forward', m.rule)} (live: ${check.state})`, evidence: ev });
    } else {
      hops.push({ kind: 'forward', status: 'info', summary: `not cluster traffic: no rule of ${chain} accepts it; the FORWARD chain's other rules and policy decide`, evidence: ev });
    }
  }
}

const inCluster = (cls: AddressClass) => cls === 'local-pod' || cls === 'remote-pod' || cls === 'cluster';

/** flannel's --ip-masq chain (FLANNEL-POSTRTG / postrtg). */
function flannelMasqHop(
  c: Context,
  hops: Hop[],
  live: LiveRules,
  masqSpec: ChainSpec | null,
  nftWant: readonly ChainSpec[],
  packet: RulePacket,
  srcCls: AddressClass,
  dstCls: AddressClass,
  r: Extract<RouteLookup, { ok: true }>,
  masqEnabled: boolean | null,
): void {
  const network = c.network!;
  const subnet = c.subnet!;
  const rules = masqRules(network, subnet, IPNet.parse(MULTICAST[c.family]), live.fullyRandom);
  const m = firstModelMatch(rules, packet);
  const check = liveCheck(c, live, 'masq', masqSpec, nftWant, ['agent']);
  const decision = liveDecision(c, live, packet, network, subnet, 'masq');
  const verdict = m ? (m.rule.verdict as 'MASQUERADE' | 'RETURN') : 'none';
  const toSource = c.firstAddress(r.device);
  const problems: string[] = [];
  const nat = decision.verdict === 'MASQUERADE' || decision.verdict === 'SNAT';
  if (nat && inCluster(srcCls) && inCluster(dstCls)) {
    problems.push(`masquerade would hide pod IP ${c.f.packet.src.toString()} from ${c.f.packet.dst.toString()} inside the cluster (${decision.label})`);
  }
  if (masqEnabled !== false && check.problems.length > 0) problems.push(`live rules differ from the model: ${check.problems.join('; ')}`);
  else if (masqEnabled !== false && decision.verdict !== 'unknown' && (verdict === 'MASQUERADE') !== nat) {
    problems.push(`the model says ${verdict === 'MASQUERADE' ? 'masquerade' : 'no masquerade'} but the live rules ${nat ? `masquerade (${decision.label})` : 'do not'}`);
  }
  let summary: string;
  const chain = chainLabel(c, 'masq');
  let leftover = false;
  if (masqEnabled === false) {
    leftover = check.problems.length > 0;
    summary = `masquerade is off (FLANNEL_IPMASQ=false)`;
    if (leftover) summary += `, but weft's masquerade rules are still there (${check.problems.join('; ')})`;
    if (nat) summary += `; the live rules NAT it (${decision.label})`;
  } else if (m && verdict === 'MASQUERADE') {
    summary = `masqueraded${toSource ? ` to ${toSource.toString()}` : ''} by rule ${m.index} of ${chain}: ${modelRuleText(c, 'masq', m.rule)}`;
  } else if (m) {
    summary = `not masqueraded: rule ${m.index} of ${chain} returns: ${modelRuleText(c, 'masq', m.rule)}`;
  } else {
    summary = `not masqueraded: no rule of ${chain} matches`;
  }
  if (masqEnabled !== false) summary += ` (live: ${check.state})`;
  if (problems.length > 0) summary += `; ${problems.join('; ')}`;
  hops.push({
    kind: 'masquerade',
    status: problems.length > 0 ? 'broken' : leftover ? 'warning' : 'ok',
    summary,
    evidence: {
      mode: c.f.rules.mode,
      ipMasqMode: 'flannel',
      nonMasqueradeCIDRs: null,
      matchedCIDR: null,
      enabled: masqEnabled,
      verdict: masqEnabled === false ? 'none' : verdict,
      chain,
      rule: masqEnabled === false ? null : (m?.index ?? null),
      ruleText: masqEnabled === false || !m ? null : modelRuleText(c, 'masq', m.rule),
      live: masqEnabled === false ? 'not-applicable' : check.state,
      liveProblems: check.problems,
      liveVerdict: decision.verdict,
      liveChain: decision.chain,
      liveRule: decision.index,
      liveRuleText: decision.text,
      unevaluated: decision.unevaluated,
      toSource: toSource ? toSource.toString() : null,
    },
  });
}

/**
 * ip-masq-agent mode (WEFT_IPMASQ=agent): WEFT-IP-MASQ returns for link-local, the cluster network and
 * each nonMasqueradeCIDR, and masquerades the rest; only non-local destinations enter it.
 */
function agentMasqHop(
  c: Context,
  hops: Hop[],
  live: LiveRules,
  agent: AgentModel,
  nftWant: readonly ChainSpec[],
  packet: RulePacket,
  srcCls: AddressClass,
  dstCls: AddressClass,
  r: Extract<RouteLookup, { ok: true }>,
): void {
  const network = c.network!;
  const dst = c.f.packet.dst;
  const chain = chainLabel(c, 'agent');
  const check = liveCheck(c, live, 'agent', agent.spec, nftWant, ['masq']);
  const decision = liveDecision(c, live, packet, network, c.subnet!, 'agent');
  const m = firstModelMatch(agent.spec.rules, packet);
  // The nft chain starts with "fib daddr type local return" (the iptables jump carries that test instead).
  const offset = c.f.rules.mode === 'nftables' ? 1 : 0;
  const verdict = m ? (m.rule.verdict as 'MASQUERADE' | 'RETURN') : 'none';
  const matchNet = m?.rule.matches[0]?.kind === 'dst' ? m.rule.matches[0].net : null;
  const toSource = c.firstAddress(r.device);
  const nat = decision.verdict === 'MASQUERADE' || decision.verdict === 'SNAT';
  const problems: string[] = [];
  const notes: string[] = [];
  let summary: string;
  if (agent.returns === null) {
    summary = `ip-masq-agent mode (WEFT_IPMASQ=agent), but ${chain} is missing: weft masquerades nothing, and the nonMasqueradeCIDRs of weftd's --ip-masq-config file are unknown here`;
    if (check.problems.length > 0) problems.push(`live rules differ from the model: ${check.problems.join('; ')}`);
  } else {
    const what = !matchNet
      ? null
      : matchNet.equals(network)
        ? `the cluster network ${matchNet.toString()}`
        : matchNet.equals(LINK_LOCAL[c.family])
          ? `link-local ${matchNet.toString()}`
          : `nonMasqueradeCIDR ${matchNet.toString()}`;
    if (m && verdict === 'MASQUERADE') {
      summary = `masqueraded${toSource ? ` to ${toSource.toString()}` : ''} by rule ${m.index + offset} of ${chain}: ${modelRuleText(c, 'agent', m.rule)}: ${dst.toString()} is in none of its ${agent.returns.length} non-masquerade CIDRs`;
    } else if (m) {
      summary = `not masqueraded: ${dst.toString()} is in ${String(what)}: rule ${m.index + offset} of ${chain} returns: ${modelRuleText(c, 'agent', m.rule)}`;
    } else {
      summary = `not masqueraded: no rule of ${chain} matches`;
    }
    summary += ` (ip-masq-agent mode, live: ${check.state})`;
    if (check.problems.length > 0) problems.push(`live rules differ from the model: ${check.problems.join('; ')}`);
    else if (decision.verdict !== 'unknown' && (verdict === 'MASQUERADE') !== nat) {
      problems.push(`the chain says ${verdict === 'MASQUERADE' ? 'masquerade' : 'no masquerade'} but the live rules ${nat ? `masquerade (${decision.label})` : 'do not'}`);
    }
  }
  if (nat && inCluster(srcCls) && inCluster(dstCls)) {
    problems.push(`masquerade would hide pod IP ${c.f.packet.src.toString()} from ${dst.toString()} inside the cluster (${decision.label})`);
  }
  if (c.f.rules.mode === 'iptables' && live.natSave?.chains.has(FOREIGN_AGENT_CHAIN)) {
    notes.push(`a real ip-masq-agent's chain ${FOREIGN_AGENT_CHAIN} is there too (it runs before or after weft's, whichever jump comes first)`);
  }
  if (problems.length > 0) summary += `; ${problems.join('; ')}`;
  if (notes.length > 0) summary += `; ${notes.join('; ')}`;
  hops.push({
    kind: 'masquerade',
    status: problems.length > 0 ? 'broken' : notes.length > 0 ? 'warning' : 'ok',
    summary,
    evidence: {
      mode: c.f.rules.mode,
      ipMasqMode: 'agent',
      nonMasqueradeCIDRs: agent.returns ? agent.returns.map((n) => n.toString()) : null,
      matchedCIDR: verdict === 'RETURN' && matchNet ? matchNet.toString() : null,
      enabled: c.f.env?.ipMasq ?? null,
      verdict,
      chain,
      rule: m ? m.index + offset : null,
      ruleText: m ? modelRuleText(c, 'agent', m.rule) : null,
      live: check.state,
      liveProblems: check.problems,
      liveVerdict: decision.verdict,
      liveChain: decision.chain,
      liveRule: decision.index,
      liveRuleText: decision.text,
      unevaluated: decision.unevaluated,
      toSource: toSource ? toSource.toString() : null,
    },
  });
}

function emptyMasq(c: Context): MasqueradeEvidence {
  const agent = c.f.env?.ipMasqMode === 'agent';
  return {
    mode: c.f.rules.mode,
    ipMasqMode: agent ? 'agent' : 'flannel',
    nonMasqueradeCIDRs: null,
    matchedCIDR: null,
    enabled: c.f.env?.ipMasq ?? null,
    verdict: 'none',
    chain: chainLabel(c, agent ? 'agent' : 'masq'),
    rule: null,
    ruleText: null,
    live: 'unknown',
    liveProblems: [],
    liveVerdict: 'unknown',
    liveChain: null,
    liveRule: null,
    liveRuleText: null,
    unevaluated: [],
    toSource: null,
  };
}
