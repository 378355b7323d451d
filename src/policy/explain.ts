// Which NetworkPolicy decides one packet at this node (`weft trace`): egress at the source pod and
// ingress at the destination pod, for those of them that run here, read from what is programmed.
import { IPAddr } from '../util/ip.js';
import type { Direction, PolicySnapshot } from './model.js';
import type { Protocol } from './ports.js';
import { decide } from './verdict.js';

export interface PolicyDecision {
  readonly direction: Direction;
  /** "namespace/name" of the pod of this node the direction applies to. */
  readonly pod: string;
  readonly allowed: boolean;
  /** The allowing rule's policy, or why there is none. */
  readonly by: { readonly namespace: string; readonly policy: string; readonly rule: number } | 'unrestricted' | 'default-deny';
  /**
   * ovs nodes, a decision by a rule: the conjunction ids of that rule's flows in the OVS pipeline
   * (`weft trace` matches them with the flow the bridge's trace met). Absent on nftables nodes.
   */
  readonly conjunctions?: readonly number[];
  /**
   * ovs nodes: the conjunction ids of the pod's other rules that allow the packet too (OVS may
   * meet any allowing rule's flow first: a rule that allows the pod everything is a flow of higher
   * priority than conjunctions).
   */
  readonly otherConjunctions?: readonly number[];
}

/**
 * `protocol` null: ICMP and other packets without ports; `port` is ignored then. `conjunctions`
 * (ovs nodes): the OVS driver's conjunction id → rule id, to name the flows of the rules.
 */
export function explainPacket(
  state: Pick<PolicySnapshot, 'pods' | 'sets' | 'rules'>,
  src: IPAddr,
  dst: IPAddr,
  protocol: Protocol | null,
  port: number,
  conjunctions?: ReadonlyMap<number, string>,
): PolicyDecision[] {
  const out: PolicyDecision[] = [];
  const at = (ip: IPAddr) => [...state.pods].filter(([, p]) => p.ips.some((a) => IPAddr.tryParse(a)?.equals(ip)));
  const idsOf = (ruleIds: ReadonlySet<string>): number[] => [...(conjunctions ?? [])].filter(([, rule]) => ruleIds.has(rule)).map(([id]) => id).sort((a, b) => a - b);
  for (const [direction, self, peer] of [['egress', src, dst], ['ingress', dst, src]] as const) {
    for (const [key, pod] of at(self)) {
      const dir = pod[direction];
      const v = decide(state, dir, peer.toString(), protocol, port);
      const rule = state.rules.get(v.by);
      const decision: PolicyDecision = {
        direction,
        pod: key,
        allowed: v.allowed,
        by: rule ? { namespace: rule.policy.namespace, policy: rule.policy.name, rule: rule.index } : v.by === 'unrestricted' ? 'unrestricted' : 'default-deny',
      };
      if (!conjunctions || !dir.isolated) {
        out.push(decision);
        continue;
      }
      // Every other rule of the pod that allows the packet on its own.
      const others = new Set(dir.rules.filter((ref) => ref.rule !== rule?.id && decide(state, { isolated: true, rules: [ref] }, peer.toString(), protocol, port).allowed).map((ref) => ref.rule));
      out.push({ ...decision, ...(rule ? { conjunctions: idsOf(new Set([rule.id])) } : {}), otherConjunctions: idsOf(others) });
    }
  }
  return out;
}

/** What /policy answers: the decisions for the packet of the query, or 400 naming the bad parameter. */
export interface PolicyAnswer {
  /** The whole rule set has been programmed once (before, nothing is enforced yet). */
  readonly programmed: boolean;
  readonly decisions: readonly PolicyDecision[];
}

const QUERY_PROTOCOLS = new Map<string, Protocol | null>([
  ['tcp', 'TCP'],
  ['udp', 'UDP'],
  ['sctp', 'SCTP'],
  ['icmp', null],
]);

/** /policy?src=&dst=&proto=tcp|udp|sctp|icmp&dport=: parses the query and asks `explain`. */
export function answerPolicyQuery(query: URLSearchParams, explain: (src: IPAddr, dst: IPAddr, protocol: Protocol | null, port: number) => PolicyAnswer): { status: number; body: unknown } {
  const src = IPAddr.tryParse(query.get('src') ?? '');
  const dst = IPAddr.tryParse(query.get('dst') ?? '');
  const proto = query.get('proto') ?? 'tcp';
  const dportText = query.get('dport') ?? '0';
  const dport = /^\d{1,5}$/.test(dportText) ? Number(dportText) : -1;
  if (!src || !dst) return { status: 400, body: { error: 'src and dst must be IP addresses' } };
  const protocol = QUERY_PROTOCOLS.get(proto);
  if (protocol === undefined) return { status: 400, body: { error: `proto must be one of ${[...QUERY_PROTOCOLS.keys()].join(', ')}` } };
  if (dport < 0 || dport > 65535) return { status: 400, body: { error: 'dport must be 0..65535' } };
  return { status: 200, body: explain(src, dst, protocol, dport) };
}
