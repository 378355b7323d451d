// The peers a backend has been told about, kept up to date from batches of lease events, so the
// backend can apply a batch as a delta and still run its full comparison on its own (a device
// rebuilt behind its back) without asking the daemon for the whole set.
import { leaseId, type Lease, type LeaseEvent } from '../subnet/lease.js';

export interface PeerChange {
  readonly id: string;
  /** The lease before the batch (null: new). */
  readonly before: Lease | null;
  /** The lease after the batch (null: gone). */
  readonly after: Lease | null;
}

export class PeerSet {
  private readonly byId = new Map<string, Lease>();

  get size(): number {
    return this.byId.size;
  }

  values(): IterableIterator<Lease> {
    return this.byId.values();
  }

  /** Whether the set holds exactly these leases (the same objects). */
  sameAs(peers: readonly Lease[]): boolean {
    return peers.length === this.byId.size && peers.every((p) => this.byId.get(leaseId(p)) === p);
  }

  /** The whole set, as the daemon has it (start-up, the timer). */
  reset(peers: readonly Lease[]): void {
    this.byId.clear();
    for (const p of peers) this.byId.set(leaseId(p), p);
  }

  /** Applies a batch; the net change per lease, in the order the leases first appear in it. */
  apply(batch: readonly LeaseEvent[]): PeerChange[] {
    const before = new Map<string, Lease | null>();
    for (const ev of batch) {
      const id = leaseId(ev.lease);
      if (!before.has(id)) before.set(id, this.byId.get(id) ?? null);
      if (ev.type === 'added') this.byId.set(id, ev.lease);
      else this.byId.delete(id);
    }
    return [...before].map(([id, b]) => ({ id, before: b, after: this.byId.get(id) ?? null }));
  }
}
