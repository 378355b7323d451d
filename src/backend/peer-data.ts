// Checks of a peer's backend data shared by the tunnel backends.
import type { JsonValue } from '../subnet/lease.js';
import type { PeerProblem } from '../subnet/peer-gate.js';

/** A peer whose backend data names another VNI is on another overlay: not ours to program. */
export function vniProblem(data: JsonValue | undefined, vni: number): PeerProblem | null {
  const theirs = data && typeof data === 'object' && !Array.isArray(data) ? data.VNI : undefined;
  if (theirs === undefined || theirs === vni) return null;
  return { reason: 'backend-data', detail: `VNI ${JSON.stringify(theirs)} differs from ours (${vni})` };
}
