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
  /** Every lease in the store, ours included: a lease that stops being ours becomes a peer. */
  private readonly all = new Map<string, Lease>();
  private lastOwn: Lease | null = null;

  /** `ownLease` is asked on every apply, since a re-acquired lease may differ from the first. */
  constructor(private readonly ownLease: () => Lease | null) {}

  get peers(): Lease[] {
    const own = this.ownLease();
    return [...this.all.values()].filter((l) => !(own && sameSubnet(own, l)));
  }

  /**
   * Applies a snapshot or a set of changes (an empty change set just re-checks our own lease)
   * and returns what changed for the backend: Added for new or changed peers, Removed (with the
   * last known attributes) for peers that went away or became our own subnet. Unchanged re-puts
   * (renewals) give nothing.
   */
  apply(result: WatchResult): LeaseEvent[] {
    const prevOwn = this.lastOwn;
    const own = this.ownLease();
    this.lastOwn = own;
    const wasPeer = (l: Lease) => !(prevOwn && sameSubnet(prevOwn, l));
    const isPeer = (l: Lease) => !(own && sameSubnet(own, l));
    // The peer each touched id was before this apply (null: none).
    const before = new Map<string, Lease | null>();
    const touch = (id: string) => {
      if (before.has(id)) return;
      const l = this.all.get(id);
      before.set(id, l && wasPeer(l) ? l : null);
    };
    if ((prevOwn && leaseId(prevOwn)) !== (own && leaseId(own))) {
      for (const [id, l] of this.all) if (!wasPeer(l) || !isPeer(l)) touch(id);
    }
    if (result.kind === 'snapshot') {
      for (const id of this.all.keys()) touch(id);
      this.all.clear();
      for (const l of result.leases) {
        touch(leaseId(l));
        this.all.set(leaseId(l), l);
      }
    } else {
      for (const ev of result.events) {
        const id = leaseId(ev.lease);
        touch(id);
        if (ev.type === 'added') this.all.set(id, ev.lease);
        else this.all.delete(id);
      }
    }
    // The net effect per lease, Added before Removed as in flannel's Reset.
    const added: LeaseEvent[] = [];
    const removed: LeaseEvent[] = [];
    for (const [id, was] of before) {
      const now = this.all.get(id);
      const peer = now && isPeer(now) ? now : null;
      // flannel's Reset emits only new leases; a peer whose attributes changed while we were not
      // watching (e.g. a new VTEP MAC) must be re-programmed too.
      if (peer && (!was || !sameAttrs(was, peer))) added.push({ type: 'added', lease: peer });
      else if (!peer && was) removed.push({ type: 'removed', lease: was });
    }
    return [...added, ...removed];
  }

  /** flannel's Reset: the whole set from a listing. */
  reset(snapshot: readonly Lease[]): LeaseEvent[] {
    return this.apply({ kind: 'snapshot', leases: snapshot });
  }

  /** flannel's Update: changes from the watch. */
  update(events: readonly RawLeaseEvent[]): LeaseEvent[] {
    return this.apply({ kind: 'events', events });
  }
}

function sameAttrs(a: Lease, b: Lease): boolean {
  return a.reservation === b.reservation && encodeLeaseAttrs(a.attrs) === encodeLeaseAttrs(b.attrs);
}
