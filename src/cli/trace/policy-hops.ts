// The NetworkPolicy hops of `weft trace`: weftd's decisions (its /policy, --network-policy) for
// the packet — egress at the source pod and ingress at the destination pod, for those on this
// node — each naming the policy and rule that allows it, or the default deny that drops it.
import { errorMessage } from '../../util/errors.js';
import type { PolicyAnswer, PolicyDecision } from '../../policy/explain.js';
import type { Hop, Packet, PolicyEvidence } from './types.js';

/** weftd's answer for `packet`; null when it runs without --network-policy (404) or cannot answer (a note says why). */
export async function fetchPolicy(endpoint: string, packet: Packet, notes: string[]): Promise<PolicyAnswer | null> {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    return null; // the status fetch reports the bad endpoint
  }
  url.pathname = `${url.pathname.replace(/\/+$/, '')}/policy`;
  url.search = new URLSearchParams({ src: packet.src.toString(), dst: packet.dst.toString(), proto: packet.proto, dport: String(packet.dport ?? 0) }).toString();
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
    if (res.status === 404) return null;
    const body = await res.text();
    if (res.status !== 200) {
      notes.push(`daemon /policy: HTTP ${res.status}: ${body.trim().slice(0, 200)}`);
      return null;
    }
    return parseAnswer(JSON.parse(body));
  } catch (e) {
    notes.push(`daemon /policy: ${errorMessage(e)}`);
    return null;
  }
}

function parseAnswer(doc: unknown): PolicyAnswer {
  const d = doc as { programmed?: unknown; decisions?: unknown };
  if (typeof d?.programmed !== 'boolean' || !Array.isArray(d.decisions)) throw new Error('not a policy answer');
  const decisions = (d.decisions as unknown[]).map((x): PolicyDecision => {
    const o = x as Record<string, unknown>;
    const by = o['by'];
    const okBy =
      by === 'unrestricted' || by === 'default-deny' || (typeof by === 'object' && by !== null && typeof (by as Record<string, unknown>)['policy'] === 'string' && typeof (by as Record<string, unknown>)['namespace'] === 'string' && Number.isInteger((by as Record<string, unknown>)['rule']));
    if ((o['direction'] !== 'ingress' && o['direction'] !== 'egress') || typeof o['pod'] !== 'string' || typeof o['allowed'] !== 'boolean' || !okBy) throw new Error(`not a policy decision: ${JSON.stringify(x)}`);
    return o as unknown as PolicyDecision;
  });
  return { programmed: d.programmed, decisions };
}

export function policyHops(answer: PolicyAnswer | null, packet: Packet, hops: Hop[]): void {
  if (!answer) return;
  const portless = packet.proto !== 'icmp' && packet.dport === null;
  for (const d of [...answer.decisions].sort((a, b) => (a.direction === b.direction ? 0 : a.direction === 'egress' ? -1 : 1))) {
    const at = `${d.direction} at pod ${d.pod}`;
    const by = typeof d.by === 'object' ? d.by : null;
    const evidence: PolicyEvidence = {
      direction: d.direction,
      pod: d.pod,
      allowed: d.allowed,
      policy: by ? `${by.namespace}/${by.policy}` : null,
      rule: by ? by.rule : null,
      reason: by ? 'rule' : d.by === 'unrestricted' ? 'unrestricted' : 'default-deny',
      programmed: answer.programmed,
    };
    let summary = by
      ? `${at}: allowed by NetworkPolicy ${by.namespace}/${by.policy} (${d.direction}[${by.rule}])`
      : d.by === 'unrestricted'
        ? `${at}: not isolated (no NetworkPolicy selects it for ${d.direction}), allowed`
        : `${at}: dropped by the default deny (NetworkPolicies select it for ${d.direction} and none of their rules allows this packet)`;
    if (!d.allowed && portless) summary += '; no --dport given: only rules without ports were considered';
    if (!answer.programmed) summary += '; weftd has not programmed its rule set yet: nothing is enforced now';
    hops.push({ kind: 'policy', status: d.allowed ? 'ok' : 'broken', summary, evidence });
  }
}
