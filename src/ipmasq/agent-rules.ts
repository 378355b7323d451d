// ip-masq-agent mode as rule-model data: one chain in nat, jumped to from POSTROUTING for
// non-local destinations only, one RETURN per non-masquerade CIDR, MASQUERADE last. The shape is
// kubernetes-sigs/ip-masq-agent's; the chain is weft's own (WEFT-IP-MASQ), so weft can remove it
// when the mode is off without ever touching a real ip-masq-agent's IP-MASQ-AGENT chain.
import { IPNet, type Family } from '../util/ip.js';
import type { Match, Rule } from './rule.js';

export const AGENT_CHAIN = 'WEFT-IP-MASQ';
/** The chain a real ip-masq-agent writes; weft only warns when it sees one. */
export const FOREIGN_AGENT_CHAIN = 'IP-MASQ-AGENT';
export const AGENT_NFT_CHAIN = 'ip-masq-agent';

/** ip-masq-agent's comments with weft's prefix; the non-masquerade ones also say where the CIDR comes from. */
export const AGENT_COMMENTS = {
  jump: `weft-ip-masq: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom ${AGENT_CHAIN} chain`,
  linkLocal: 'weft-ip-masq: link-local traffic is not subject to MASQUERADE',
  network: 'weft-ip-masq: cluster network traffic is not subject to MASQUERADE',
  configured: 'weft-ip-masq: nonMasqueradeCIDRs traffic is not subject to MASQUERADE',
  masquerade: 'weft-ip-masq: outbound traffic is subject to MASQUERADE (must be last in chain)',
} as const;

export const LINK_LOCAL: Record<Family, IPNet> = { 4: IPNet.parse('169.254.0.0/16'), 6: IPNet.parse('fe80::/10') };

/** What the agent chain is built from besides the cluster network (the parsed config file). */
export interface AgentMasq {
  /** Both families mixed; each family's chain takes its own. */
  readonly nonMasqueradeCIDRs: readonly IPNet[];
  /** true: 169.254.0.0/16 is masqueraded like anything else. */
  readonly masqLinkLocal: boolean;
  /** true: fe80::/10 is masqueraded like anything else. */
  readonly masqLinkLocalIPv6: boolean;
}

/**
 * The agent chain of one family: link-local (unless masqueraded), the cluster network, the
 * configured CIDRs of this family, then MASQUERADE. A CIDR already listed is not repeated: the
 * exact reconcile counts identical rules as duplicates.
 */
export function agentRules(network: IPNet, agent: AgentMasq, fullyRandom: boolean): Rule[] {
  const family = network.family;
  const seen = new Set<string>();
  const rules: Rule[] = [];
  const ret = (net: IPNet, comment: string): void => {
    const key = net.toString();
    if (seen.has(key)) return;
    seen.add(key);
    const match: Match = { kind: 'dst', net, negate: false };
    rules.push({ matches: [match], verdict: 'RETURN', fullyRandom: false, comment });
  };
  const masqLinkLocal = family === 4 ? agent.masqLinkLocal : agent.masqLinkLocalIPv6;
  if (!masqLinkLocal) ret(LINK_LOCAL[family], AGENT_COMMENTS.linkLocal);
  ret(network, AGENT_COMMENTS.network);
  for (const net of agent.nonMasqueradeCIDRs) if (net.family === family) ret(net, AGENT_COMMENTS.configured);
  rules.push({ matches: [], verdict: 'MASQUERADE', fullyRandom, comment: AGENT_COMMENTS.masquerade });
  return rules;
}
