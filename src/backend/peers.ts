// Which peer leases a backend can program, with one warning per peer it has to skip.
import type { Lease } from '../subnet/lease.js';
import type { Logger } from '../util/log.js';
import { leaseId } from '../subnet/lease.js';

export class PeerFilter {
  private readonly warned = new Map<string, string>();

  constructor(private readonly logger: Logger) {}

  /** Logs `reason` for this peer unless the same reason was logged for it already. */
  skip(peer: Lease, reason: string): void {
    const id = leaseId(peer);
    if (this.warned.get(id) === reason) return;
    this.warned.set(id, reason);
    this.logger.warn('skipping peer lease', { lease: id, publicIP: peer.attrs.publicIP.toString(), reason });
  }

  /** Forgets peers no longer present, so a returning peer with the same problem is reported again. */
  retain(peers: readonly Lease[]): void {
    const live = new Set(peers.map(leaseId));
    for (const id of this.warned.keys()) if (!live.has(id)) this.warned.delete(id);
  }
}
