// The set of peer leases, fed by snapshots and incremental events (flannel's LeaseWatcher),
// turning them into the Added/Removed batches a backend applies.
import { encodeLeaseAttrs } from './codec.js';
import { leaseId, sameSubnet, type Lease, type LeaseEvent } from './lease.js';

/** What a store watch reports: a full listing, or changes since the previous report. */
export type WatchResult =
  | { readonly kind: 'snapshot'; readonly leases: readonly Lease[] }
  | { readonly kind: 'events'; readonly events: readonly RawLeaseEvent[] };

/** A store event; a removal may know only the key (etcd DELETE events carry no value). */
export type RawLeaseEvent =
  | { readonly type: 'added'; readonly lease: Lease }
  | { readonly type: 'removed'; readonly lease: Pick<Lease, 'subnet' | 'ipv6Subnet'> };

export class LeaseWatcher {
  private readonly leases = new Map<string, Lease>();

  /** `ownLease` is asked each time, since a re-acquired lease may differ from the first. */
  constructor(private readonly ownLease: () => Lease | null) {}

  get peers(): Lease[] {
    return [...this.leases.values()];
  }

  apply(result: WatchResult): LeaseEvent[] {
    return result.kind === 'snapshot' ? this.reset(result.leases) : this.update(result.events);
  }

  /** Replaces the set: Added for new or changed leases, Removed for those no longer listed. */
  reset(snapshot: readonly Lease[]): LeaseEvent[] {
    const batch: LeaseEvent[] = [];
    const next = new Map<string, Lease>();
    for (const lease of snapshot) {
      if (this.isOwn(lease)) continue;
      const id = leaseId(lease);
      next.set(id, lease);
      const old = this.leases.get(id);
      // flannel emits only new leases here; a peer whose attributes changed while we were not
      // watching (e.g. a new VTEP MAC) must be re-programmed too.
      if (!old || !sameAttrs(old, lease)) batch.push({ type: 'added', lease });
    }
    for (const [id, old] of this.leases) {
      if (!next.has(id)) batch.push({ type: 'removed', lease: old });
    }
    this.leases.clear();
    for (const [id, l] of next) this.leases.set(id, l);
    return batch;
  }

  /** Applies store events; unchanged re-puts (renewals) are dropped, removals carry the last attrs. */
  update(events: readonly RawLeaseEvent[]): LeaseEvent[] {
    const batch: LeaseEvent[] = [];
    for (const ev of events) {
      const id = leaseId(ev.lease);
      if (ev.type === 'added') {
        const old = this.leases.get(id);
        if (this.isOwn(ev.lease)) {
          // A subnet that became ours (re-acquired) is no longer a peer.
          if (old) {
            this.leases.delete(id);
            batch.push({ type: 'removed', lease: old });
          }
          continue;
        }
        this.leases.set(id, ev.lease);
        if (!old || !sameAttrs(old, ev.lease)) batch.push({ type: 'added', lease: ev.lease });
      } else {
        const old = this.leases.get(id);
        if (!old) continue; // never known (or our own): nothing to undo
        this.leases.delete(id);
        batch.push({ type: 'removed', lease: old });
      }
    }
    return batch;
  }

  private isOwn(lease: Pick<Lease, 'subnet' | 'ipv6Subnet'>): boolean {
    const own = this.ownLease();
    return own !== null && sameSubnet(own, lease);
  }
}

function sameAttrs(a: Lease, b: Lease): boolean {
  return a.reservation === b.reservation && encodeLeaseAttrs(a.attrs) === encodeLeaseAttrs(b.attrs);
}
