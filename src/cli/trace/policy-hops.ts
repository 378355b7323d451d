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

/** The deciding rule as weftd names it, or why there is none. */
function isBy(by: unknown): by is PolicyDecision['by'] {
  if (by === 'unrestricted' || by === 'default-deny') return true;
  const r = by as Record<string, unknown> | null;
  return typeof r === 'object' && r !== null && typeof r['namespace'] === 'string' && typeof r['policy'] === 'string' && Number.isInteger(r['rule']);
}

function isDecision(x: unknown): x is PolicyDecision {
  const o = x as Record<string, unknown> | null;
  return typeof o === 'object' && o !== null && (o['direction'] === 'ingress' || o['direction'] === 'egress') && typeof o['pod'] === 'string' && typeof o['allowed'] === 'boolean' && isBy(o['by']);
}

function parseAnswer(doc: unknown): PolicyAnswer {
  const d = doc as { programmed?: unknown; decisions?: unknown } | null;
  if (typeof d?.programmed !== 'boolean' || !Array.isArray(d.decisions)) throw new Error('not a policy answer');
  for (const x of d.decisions as unknown[]) if (!isDecision(x)) throw new Error(`not a policy decision: ${JSON.stringify(x)}`);
  return { programmed: d.programmed, decisions: d.decisions as PolicyDecision[] };
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
