// NetworkPolicy on ovs nodes: the flow model (flows.ts) written into the ovs backend's table
// through its policy section (src/backend/ovs/policy-section.ts). An event's delta is one atomic
// bundle of the flows it touched; the whole section is written at start and after a failure
// (adding every flow — a flow the bridge has with the same match is overwritten, never deleted
// first — then deleting what is left of earlier rounds); the timer's check reads the policy flows
// back with their packet counts (the metrics) and compares them with the model.
import { CATEGORY_MASK, Category, cookieOf, renderFlow, renderFlowMods, roundOf, type FlowMod } from '../../backend/ovs/pipeline.js';
import type { PolicyFlowHost, PolicyFlowSection } from '../../backend/ovs/policy-section.js';
import type { PodDeniedPackets, PolicyPackets } from '../counters.js';
import type { PolicyDataplane } from '../dataplane.js';
import type { PolicyDelta, PolicySnapshot } from '../model.js';
import { PolicyFlowModel } from './flows.js';

/** One flow as dump-flows printed it. */
export interface DumpedFlow {
  readonly cookie: bigint;
  /** Table, priority and match tokens sorted: PolicyFlowModel.keyOf of the same flow. */
  readonly key: string;
  readonly actions: string;
  readonly packets: number;
}

const STAT_FIELDS = new Set(['duration', 'n_packets', 'n_bytes', 'idle_age', 'hard_age', 'idle_timeout', 'hard_timeout', 'reset_counts', 'importance']);

/** Parses a dump-flows line (` cookie=0x…, duration=…, table=52, n_packets=3, …, priority=200,ip,nw_src=… actions=…`); null for anything else. */
export function parseDumpedFlow(line: string): DumpedFlow | null {
  const at = line.indexOf(' actions=');
  if (at < 0) return null;
  const fields = new Map<string, string>();
  const match: string[] = [];
  for (const token of line.slice(0, at).split(/[,\s]+/)) {
    if (token === '') continue;
    const eq = token.indexOf('=');
    const name = eq < 0 ? token : token.slice(0, eq);
    if (name === 'cookie' || name === 'table' || name === 'priority' || STAT_FIELDS.has(name)) fields.set(name, token.slice(eq + 1));
    else match.push(token);
  }
  const cookie = fields.get('cookie');
  if (cookie === undefined || !/^0x[0-9a-f]+$/.test(cookie)) return null;
  const table = Number(fields.get('table') ?? 0);
  const priority = Number(fields.get('priority') ?? 32768);
  return { cookie: BigInt(cookie), key: `${table} ${priority} ${match.sort().join(',')}`, actions: line.slice(at + ' actions='.length).trim(), packets: Number(fields.get('n_packets') ?? 0) };
}

export class PolicyOvsDriver implements PolicyDataplane {
  private readonly model = new PolicyFlowModel();
  private host: PolicyFlowHost | null = null;
  private writes = 0;
  private lastCounts: { allowed: PolicyPackets[]; denied: PodDeniedPackets[] } | null = null;

  constructor(
    private readonly section: PolicyFlowSection,
    private readonly signal: AbortSignal,
  ) {}

  get programmed(): PolicySnapshot {
    return this.model.state;
  }

  get generation(): number {
    return this.writes;
  }

  /** Conjunction id → rule id of the flows in use (`weft trace` names the rule a traced packet met). */
  conjunctions(): ReadonlyMap<number, string> {
    return new Map([...this.model.conjunctions()].map(([id, rule]) => [id, rule.id]));
  }

  async sync(snap: PolicySnapshot): Promise<void> {
    this.model.reset(snap);
    await this.writeWhole();
    this.section.provide((round) => this.model.flows(round));
  }

  async applyAll(deltas: readonly PolicyDelta[]): Promise<void> {
    for (const d of deltas) this.model.apply(d);
    const host = await this.attached();
    await this.section.exclusive(async () => {
      const { mods, commit } = this.model.pendingMods(host.round);
      if (mods.length === 0) return;
      this.writes++;
      await host.bundle(renderFlowMods(mods));
      commit();
    });
  }

  rewrite(): Promise<void> {
    return this.writeWhole();
  }

  async check(): Promise<string[]> {
    const host = await this.attached();
    const dumped = (await host.dumpPolicyFlows(true)).map(parseDumpedFlow).filter((f): f is DumpedFlow => f !== null);
    const want = new Map(this.model.flows(host.round).map((f) => [PolicyFlowModel.keyOf(f), actionsOf(renderFlow(f))]));
    const problems: string[] = [];
    const seen = new Set<string>();
    for (const f of dumped) {
      seen.add(f.key);
      const actions = want.get(f.key);
      if (actions === undefined) problems.push(`extra flow ${f.key}`);
      else if (actions !== f.actions) problems.push(`flow ${f.key}: actions ${f.actions}, want ${actions}`);
      else if (roundOf(f.cookie) !== host.round) problems.push(`flow ${f.key}: round ${roundOf(f.cookie)}, want ${host.round}`);
    }
    for (const key of want.keys()) if (!seen.has(key)) problems.push(`missing flow ${key}`);
    this.lastCounts = this.count(dumped);
    return problems;
  }

  counts(): { allowed: PolicyPackets[]; denied: PodDeniedPackets[] } | null {
    return this.lastCounts;
  }

  private async attached(): Promise<PolicyFlowHost> {
    this.host ??= await this.section.host(this.signal);
    return this.host;
  }

  /**
   * Every flow of the model in one bundle: added (overwriting the bridge's flow with the same
   * match, whatever its round), then the policy flows of other rounds that are left deleted by
   * their round's cookie. Flows of this round the model lacks (drift, a failed bundle) are swept
   * first, in the same bundle: no packet sees the table between the two.
   */
  private async writeWhole(): Promise<void> {
    const host = await this.attached();
    await this.section.exclusive(async () => {
      const flows = this.model.flows(host.round);
      const want = new Set(flows.map((f) => PolicyFlowModel.keyOf(f)));
      const dumped = (await host.dumpPolicyFlows(false)).map(parseDumpedFlow).filter((f): f is DumpedFlow => f !== null);
      const staleThisRound = dumped.some((f) => roundOf(f.cookie) === host.round && !want.has(f.key));
      const otherRounds = new Set(dumped.map((f) => roundOf(f.cookie)).filter((r) => r !== host.round));
      const mods: FlowMod[] = [
        ...(staleThisRound ? [{ op: 'delete', cookie: cookieOf(host.round, Category.Policy, 0), mask: CATEGORY_MASK } as const] : []),
        ...flows.map((flow): FlowMod => ({ op: 'add', flow })),
        ...[...otherRounds].map((r): FlowMod => ({ op: 'delete', cookie: cookieOf(r, Category.Policy, 0), mask: CATEGORY_MASK })),
      ];
      this.writes++;
      if (mods.length > 0) await host.bundle(renderFlowMods(mods));
      this.model.markAllWritten(host.round);
    });
  }

  /** Packets per policy (its rules' allow flows) and per isolated pod (its drops), from a dump with stats. */
  private count(dumped: readonly DumpedFlow[]): { allowed: PolicyPackets[]; denied: PodDeniedPackets[] } {
    const podOf = new Map<string, { namespace: string; name: string }>();
    for (const p of this.model.state.pods.values()) for (const ip of p.ips) podOf.set(ip, p);
    const allowed = new Map<string, PolicyPackets>();
    const denied: PodDeniedPackets[] = [];
    for (const f of dumped) {
      const what = this.model.describe(f.key);
      if (!what) continue;
      if (what.kind === 'drop') {
        const pod = podOf.get(what.podIP);
        if (pod) denied.push({ namespace: pod.namespace, pod: pod.name, direction: what.direction, packets: f.packets });
        continue;
      }
      const { policy, direction } = what.rule;
      const k = `${policy.namespace}/${policy.name}/${direction}`;
      allowed.set(k, { namespace: policy.namespace, policy: policy.name, direction, packets: (allowed.get(k)?.packets ?? 0) + f.packets });
    }
    return { allowed: [...allowed.values()], denied };
  }
}

/** The actions part of a rendered flow. */
function actionsOf(flowText: string): string {
  return flowText.slice(flowText.indexOf(',actions=') + ',actions='.length);
}
