// The NetworkPolicy hops of `weft trace`: weftd's decisions (its /policy, --network-policy) for
// the packet — egress at the source pod and ingress at the destination pod, for those on this
// node — each naming the policy and rule that allows it, or the default deny that drops it.
import { errorMessage } from '../../util/errors.js';
import type { PolicyAnswer, PolicyDecision } from '../../policy/explain.js';
import { TABLES } from '../../backend/ovs/pipeline.js';
import { tableName } from './ovs.js';
import type { Hop, OvsPolicyStep, Packet, PolicyEvidence } from './types.js';

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

const isIdList = (x: unknown): boolean => x === undefined || (Array.isArray(x) && x.every((n) => Number.isSafeInteger(n) && (n as number) >= 0));

function isDecision(x: unknown): x is PolicyDecision {
  const o = x as Record<string, unknown> | null;
  return (
    typeof o === 'object' &&
    o !== null &&
    (o['direction'] === 'ingress' || o['direction'] === 'egress') &&
    typeof o['pod'] === 'string' &&
    typeof o['allowed'] === 'boolean' &&
    isBy(o['by']) &&
    isIdList(o['conjunctions']) &&
    isIdList(o['otherConjunctions'])
  );
}

function parseAnswer(doc: unknown): PolicyAnswer {
  const d = doc as { programmed?: unknown; decisions?: unknown } | null;
  if (typeof d?.programmed !== 'boolean' || !Array.isArray(d.decisions)) throw new Error('not a policy answer');
  for (const x of d.decisions as unknown[]) if (!isDecision(x)) throw new Error(`not a policy decision: ${JSON.stringify(x)}`);
  return { programmed: d.programmed, decisions: d.decisions as PolicyDecision[] };
}

/**
 * What the bridge's policy tables did per direction, from the pipeline hop (ovs nodes); null when
 * no bridge was traced. A packet that never met conntrack was dropped before the policy tables,
 * or left the bridge without them.
 */
function bridgeDecisions(hops: readonly Hop[]): { bridge: string; steps: ReadonlyMap<'ingress' | 'egress', OvsPolicyStep> } | null {
  const p = hops.find((h): h is Extract<Hop, { kind: 'pipeline' }> => h.kind === 'pipeline' && h.evidence.tables.length > 0);
  if (!p) return null;
  const steps = new Map(p.evidence.policy.map((x) => [x.direction, x]));
  if (steps.size === 0) {
    const out = hops.find((h): h is Extract<Hop, { kind: 'ovs-output' }> => h.kind === 'ovs-output');
    const verdict = out && out.evidence.action !== 'drop' ? 'pass' : 'not-reached';
    for (const direction of ['egress', 'ingress'] as const) steps.set(direction, { direction, verdict, table: null, conjunction: null, cookie: null, priority: null, match: null });
  }
  return { bridge: p.evidence.bridge, steps };
}

const at = (b: OvsPolicyStep): string => (b.table === null ? 'the pipeline' : `${tableName(b.table)} (table ${b.table})`);

/** What the bridge did, in words. */
function bridgeSays(bridge: string, b: OvsPolicyStep): string {
  switch (b.verdict) {
    case 'allow':
      return `${bridge}: allowed by conj_id ${String(b.conjunction)} in ${at(b)}`;
    case 'drop':
      return b.table === TABLES.egressDefaultRule || b.table === TABLES.ingressDefaultRule ? `${bridge}: dropped by the pod's default deny flow in ${at(b)}` : `${bridge}: dropped in ${at(b)} (no flow matched)`;
    case 'pass':
      return b.table === null ? `${bridge}: the packet left the bridge without passing its policy tables` : `${bridge}: no ${b.direction} flow for the pod, passed on by ${at(b)}`;
    case 'node':
      return `${bridge}: the node's own traffic skips the ingress rules (table ${String(b.table)}, priority ${String(b.priority)})`;
    case 'not-reached':
      return `${bridge}: the ${b.direction} tables were not reached`;
  }
}

/**
 * weftd's decision against the bridge's: the same verdict, by a flow of the deciding rule (or of
 * another rule that allows the packet too). null: nothing to compare (not reached; node traffic).
 */
function judge(d: PolicyDecision, b: OvsPolicyStep, bridge: string): { agrees: boolean | null; text: string } {
  const says = bridgeSays(bridge, b);
  if (b.verdict === 'not-reached') return { agrees: null, text: says };
  const ids = (xs: readonly number[] | undefined) => `[${(xs ?? []).join(', ')}]`;
  if (typeof d.by === 'object') {
    if (b.verdict === 'allow') {
      if (d.conjunctions === undefined) return { agrees: null, text: says };
      if (b.conjunction !== null && d.conjunctions.includes(b.conjunction)) return { agrees: true, text: `${says}, a flow of this rule` };
      if (b.conjunction !== null && d.otherConjunctions?.includes(b.conjunction)) return { agrees: true, text: `${says}, the flow of another rule of the pod that allows it too` };
      return { agrees: false, text: `but ${says}, which is not one of the rule's conjunctions ${ids(d.conjunctions)}` };
    }
    if (b.verdict === 'node') return { agrees: null, text: says };
    if (b.verdict === 'drop') return { agrees: false, text: `but ${says} (the rule's conjunctions: ${ids(d.conjunctions)})` };
    return { agrees: false, text: `but ${says}: the pod is not isolated there` };
  }
  if (d.by === 'default-deny') {
    if (b.verdict === 'drop') return { agrees: true, text: says };
    if (b.verdict === 'node') return { agrees: null, text: says };
    return { agrees: false, text: `but ${says}${b.verdict === 'allow' ? ', although no rule of the pod allows the packet' : ': the default deny is missing'}` };
  }
  if (b.verdict === 'pass' || b.verdict === 'node') return { agrees: true, text: says };
  return { agrees: false, text: `but ${says}, although no NetworkPolicy selects the pod for ${d.direction}` };
}

export function policyHops(answer: PolicyAnswer | null, packet: Packet, hops: Hop[]): void {
  if (!answer) return;
  const portless = packet.proto !== 'icmp' && packet.dport === null;
  const bridge = bridgeDecisions(hops);
  for (const d of [...answer.decisions].sort((a, b) => (a.direction === b.direction ? 0 : a.direction === 'egress' ? -1 : 1))) {
    const at = `${d.direction} at pod ${d.pod}`;
    const by = typeof d.by === 'object' ? d.by : null;
    const b = bridge?.steps.get(d.direction) ?? null;
    const judged = b && bridge ? judge(d, b, bridge.bridge) : null;
    const evidence: PolicyEvidence = {
      direction: d.direction,
      pod: d.pod,
      allowed: d.allowed,
      policy: by ? `${by.namespace}/${by.policy}` : null,
      rule: by ? by.rule : null,
      reason: by ? 'rule' : d.by === 'unrestricted' ? 'unrestricted' : 'default-deny',
      programmed: answer.programmed,
      conjunctions: d.conjunctions ?? null,
      otherConjunctions: d.otherConjunctions ?? null,
      bridge: b,
      agrees: judged?.agrees ?? null,
    };
    let status: Hop['status'] = d.allowed ? 'ok' : 'broken';
    let summary = by
      ? `${at}: allowed by NetworkPolicy ${by.namespace}/${by.policy} (${d.direction}[${by.rule}])`
      : d.by === 'unrestricted'
        ? `${at}: not isolated (no NetworkPolicy selects it for ${d.direction}), allowed`
        : `${at}: dropped by the default deny (NetworkPolicies select it for ${d.direction} and none of their rules allows this packet)`;
    if (!d.allowed && b?.verdict === 'node') {
      // The rules would drop it, but the node's own traffic never meets them.
      status = 'ok';
      summary = `${at}: allowed: from the node itself, which ingress rules do not apply to (its rules alone would drop it: default deny)`;
    }
    if (!d.allowed && portless) summary += '; no --dport given: only rules without ports were considered';
    if (judged) summary += `; ${judged.text}`;
    if (judged?.agrees === false) status = 'broken';
    if (!answer.programmed) summary += '; weftd has not programmed its rule set yet: nothing is enforced now';
    hops.push({ kind: 'policy', status, summary, evidence });
  }
}
