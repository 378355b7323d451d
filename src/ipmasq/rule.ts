// One masquerade/forward rule as data: what it matches and what it does. Shared by flannel's
// chains (model.ts) and the ip-masq-agent chain (agent-rules.ts), rendered by iptables.ts and
// nftables.ts.
import type { IPNet } from '../util/ip.js';

/** kube-proxy marks packets it wants masqueraded with this bit; flannel leaves them alone. */
export const KUBE_PROXY_MARK = 0x4000;

export type Verdict = 'RETURN' | 'MASQUERADE' | 'ACCEPT';

export type Match =
  | { readonly kind: 'mark' }
  | { readonly kind: 'src' | 'dst'; readonly net: IPNet; readonly negate: boolean };

export interface Rule {
  readonly matches: readonly Match[];
  readonly verdict: Verdict;
  /** MASQUERADE only: `--random-fully` / `fully-random`. */
  readonly fullyRandom: boolean;
  /** iptables comment of this rule; the chain's comment when absent (nftables rules carry none). */
  readonly comment?: string;
}
