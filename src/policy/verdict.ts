// What the engine's output decides for one packet direction at one pod: the reference reading of
// the model that every dataplane must implement, and what `weft trace` reports (which rule, or
// default deny).
import { IPAddr } from '../util/ip.js';
import { intervalsContain } from './ipblock.js';
import { type DirectionPolicy, peerPortKey, type PolicySnapshot } from './model.js';
import { portsContain, type Protocol } from './ports.js';

/** `by`: the deciding rule's id, 'unrestricted' (pod not isolated) or 'default-deny'. */
export type Verdict = { readonly allowed: true; readonly by: string } | { readonly allowed: false; readonly by: 'default-deny' };

/**
 * Decides traffic at one pod in one direction. `peer` is the other end's address: the source for
 * ingress, the destination for egress; `port` is the destination port. `protocol` null: a packet
 * without ports NetworkPolicy can name (ICMP), which only a rule without `ports` allows.
 */
export function decide(state: Pick<PolicySnapshot, 'sets' | 'rules'>, dir: DirectionPolicy, peer: string, protocol: Protocol | null, port: number): Verdict {
  if (!dir.isolated) return { allowed: true, by: 'unrestricted' };
  const ip = IPAddr.tryParse(peer);
  if (!ip) return { allowed: false, by: 'default-deny' };
  const text = ip.toString();
  for (const ref of dir.rules) {
    const rule = state.rules.get(ref.rule);
    if (!rule) continue;
    const portOK = ref.ports === 'any' || (protocol !== null && portsContain(ref.ports, protocol, port));
    if (portOK && peerMatches(state, rule.peers, ip, text)) return { allowed: true, by: rule.id };
    if (rule.namedPeerPorts && protocol !== null) {
      const set = state.sets.get(rule.namedPeerPorts);
      if (set?.kind === 'peerPorts' && set.elements.has(peerPortKey({ ip: text, protocol, port }))) return { allowed: true, by: rule.id };
    }
  }
  return { allowed: false, by: 'default-deny' };
}

function peerMatches(state: Pick<PolicySnapshot, 'sets'>, peers: 'any' | { pods: string | null; cidrs: string | null }, ip: IPAddr, text: string): boolean {
  if (peers === 'any') return true;
  if (peers.pods) {
    const s = state.sets.get(peers.pods);
    if (s?.kind === 'addresses' && s.elements.has(text)) return true;
  }
  if (peers.cidrs) {
    const s = state.sets.get(peers.cidrs);
    if (s?.kind === 'intervals' && intervalsContain(s.intervals, ip)) return true;
  }
  return false;
}
