// Packets counted by the rules now in the policy table, per policy (allowed by one of its rules)
// and per isolated local pod (dropped by its default deny): what the metrics export. A rule line's
// comment starts with its engine rule id (render.ts), which names the policy; a pod chain's last
// line is its default deny. Counters live in the rules, so a rewritten pod chain starts again at 0.
import type { Direction, PolicySnapshot } from './model.js';
import type { ListedPolicyTable } from './nft/driver.js';
import { podChainName } from './nft/layout.js';

export interface PolicyPackets {
  readonly namespace: string;
  readonly policy: string;
  readonly direction: Direction;
  readonly packets: number;
}

export interface PodDeniedPackets {
  readonly namespace: string;
  readonly pod: string;
  readonly direction: Direction;
  readonly packets: number;
}

export interface PolicyMetrics {
  /** The counters of one read-back of the table (replacing the previous ones). */
  recordPolicyPackets(allowed: readonly PolicyPackets[], denied: readonly PodDeniedPackets[]): void;
  /** A resync pass ran (each reads the table back). */
  recordPolicyCheck(): void;
  /** A transaction failed (the table is rewritten on the next pass). */
  recordPolicyFailure(): void;
  /** A pass found the table differing from the engine's output and rewrote it. */
  recordPolicyRepair(): void;
}

export function countPackets(state: Pick<PolicySnapshot, 'pods' | 'rules'>, listed: ListedPolicyTable): { allowed: PolicyPackets[]; denied: PodDeniedPackets[] } {
  const allowed = new Map<string, PolicyPackets>();
  const denied: PodDeniedPackets[] = [];
  for (const [key, pod] of state.pods) {
    for (const direction of ['ingress', 'egress'] as const) {
      if (!pod[direction].isolated) continue;
      const chain = podChainName(key, direction);
      const comments = listed.rules.get(chain) ?? [];
      const packets = listed.packets.get(chain) ?? [];
      comments.forEach((comment, i) => {
        const n = packets[i] ?? 0;
        const tag = comment.split(' ')[0] ?? '';
        if (tag === 'default-deny') {
          denied.push({ namespace: pod.namespace, pod: pod.name, direction, packets: n });
          return;
        }
        const rule = state.rules.get(tag);
        if (!rule) return; // the log line, or a rule being replaced
        const k = `${rule.policy.namespace}/${rule.policy.name}/${direction}`;
        const prev = allowed.get(k);
        allowed.set(k, { namespace: rule.policy.namespace, policy: rule.policy.name, direction, packets: (prev?.packets ?? 0) + n });
      });
    }
  }
  return { allowed: [...allowed.values()], denied };
}
