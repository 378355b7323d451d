// What the policy enforcer needs of a dataplane: nftables on bridge nodes (nft/driver.ts), the OVS
// pipeline's policy tables on ovs nodes (ovs/driver.ts). Both keep the engine's output as applied
// (explain, counters) and tell a read-back overtaken by a write by its generation.
import type { PodDeniedPackets, PolicyPackets } from './counters.js';
import type { PolicyDelta, PolicySnapshot } from './model.js';

export interface PolicyDataplane {
  /** Programs everything as `snap`, replacing what is there. */
  sync(snap: PolicySnapshot): Promise<void>;
  /** Consecutive deltas in one write; on failure the caller rewrites from the engine. */
  applyAll(deltas: readonly PolicyDelta[]): Promise<void>;
  /** Reads the dataplane back: what differs from the desired state ([] when they agree). */
  check(): Promise<string[]>;
  /** Writes everything again from what is programmed (after check() found a difference). */
  rewrite(): Promise<void>;
  /** The engine's output as applied so far. */
  readonly programmed: PolicySnapshot;
  /** Bumped by every write: a read-back overtaken by one is stale. */
  readonly generation: number;
  /** The packet counters the last check() read; null before one. */
  counts(): { allowed: PolicyPackets[]; denied: PodDeniedPackets[] } | null;
}
