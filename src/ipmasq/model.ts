// The masquerade and forward rules of one node, as data. Both the iptables and the nftables
// renderings come from this one description, so the two modes can never drift apart.
import { IPNet, MULTICAST, type Family } from '../util/ip.js';
import { AGENT_CHAIN, AGENT_COMMENTS, AGENT_NFT_CHAIN, agentRules, type AgentMasq } from './agent-rules.js';
import type { Match, Rule } from './rule.js';

export const MASQ_COMMENT = 'flanneld masq';
export const FORWARD_COMMENT = 'flanneld forward';

export { KUBE_PROXY_MARK, type Match, type Rule, type Verdict } from './rule.js';

/** `masq`: flannel's --ip-masq chain; `agent`: ip-masq-agent mode (--ip-masq-config); `forward`: FORWARD accepts. */
export type ChainKind = 'masq' | 'forward' | 'agent';

/** One chain weft owns, with the built-in chain that jumps to it. */
export interface ChainSpec {
  readonly family: Family;
  readonly kind: ChainKind;
  readonly rules: readonly Rule[];
}

export interface ChainNames {
  readonly table: 'nat' | 'filter';
  readonly chain: string;
  readonly hook: string;
  /** The jump's comment, and the rules' unless a rule has its own. */
  readonly comment: string;
  readonly nftChain: string;
  /** Only packets to a non-local destination enter the chain (ip-masq-agent's `-m addrtype ! --dst-type LOCAL`). */
  readonly nonLocalOnly?: boolean;
}

/** Per-kind names: iptables table/chain/hook and the nftables chain; flannel's for masq and forward. */
export const CHAIN_NAMES: Record<ChainKind, ChainNames> = {
  masq: { table: 'nat', chain: 'FLANNEL-POSTRTG', hook: 'POSTROUTING', comment: MASQ_COMMENT, nftChain: 'postrtg' },
  forward: { table: 'filter', chain: 'FLANNEL-FWD', hook: 'FORWARD', comment: FORWARD_COMMENT, nftChain: 'forward' },
  agent: { table: 'nat', chain: AGENT_CHAIN, hook: 'POSTROUTING', comment: AGENT_COMMENTS.jump, nftChain: AGENT_NFT_CHAIN, nonLocalOnly: true },
};

/** What the rules are built from, per address family. */
export interface FamilyInput {
  /** The cluster network (`Network` / `IPv6Network`). */
  readonly network: IPNet;
  /** This node's lease subnet. */
  readonly subnet: IPNet;
}

export interface MasqInput {
  readonly families: readonly FamilyInput[];
  readonly masq: boolean;
  readonly forward: boolean;
  readonly fullyRandom: boolean;
  /** ip-masq-agent mode (exclusive with `masq`); null or absent: off. */
  readonly agent?: AgentMasq | null;
}


const src = (net: IPNet, negate = false): Match => ({ kind: 'src', net, negate });
const dst = (net: IPNet, negate = false): Match => ({ kind: 'dst', net, negate });

/**
 * flannel's masquerade rules, in flannel's order. Rule 4 is the iptables one (`! -s Network -d podCIDR`):
 * flannel's nftables rule 4 (`saddr != podCIDR daddr Network`) also returns for traffic from the host
 * itself to remote pods, which makes rule 6 dead, so the host's own traffic into the overlay left with
 * its underlay address instead of being masqueraded. weft uses the iptables rule in both renderings.
 */
export function masqRules(network: IPNet, subnet: IPNet, multicast: IPNet, fullyRandom: boolean): Rule[] {
  const ret = (...matches: Match[]): Rule => ({ matches, verdict: 'RETURN', fullyRandom: false });
  const masq = (...matches: Match[]): Rule => ({ matches, verdict: 'MASQUERADE', fullyRandom });
  return [
    // kube-proxy already decided about marked packets.
    ret({ kind: 'mark' }),
    // Pod to pod inside the cluster keeps its source address, both ways.
    ret(src(subnet), dst(network)),
    ret(src(network), dst(subnet)),
    // Traffic from outside the cluster to our pods keeps its source address.
    ret(src(network, true), dst(subnet)),
    // Pods leaving the cluster (but not multicast) are masqueraded.
    masq(src(network), dst(multicast, true)),
    // The host (or anything outside the network) talking to remote pods is masqueraded so replies come back here.
    masq(src(network, true), dst(network)),
  ];
}

export function forwardRules(network: IPNet): Rule[] {
  return [
    { matches: [src(network)], verdict: 'ACCEPT', fullyRandom: false },
    { matches: [dst(network)], verdict: 'ACCEPT', fullyRandom: false },
  ];
}

/** Every chain weft wants, IPv4 before IPv6, masquerade (either mode) before forward. */
export function desiredChains(input: MasqInput): ChainSpec[] {
  const out: ChainSpec[] = [];
  for (const f of input.families) {
    if (input.masq) {
      out.push({ family: f.network.family, kind: 'masq', rules: masqRules(f.network, f.subnet, IPNet.parse(MULTICAST[f.network.family]), input.fullyRandom) });
    }
    if (input.agent) out.push({ family: f.network.family, kind: 'agent', rules: agentRules(f.network, input.agent, input.fullyRandom) });
    if (input.forward) out.push({ family: f.network.family, kind: 'forward', rules: forwardRules(f.network) });
  }
  return out;
}
