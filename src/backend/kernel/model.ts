// What weft has programmed in the kernel, as weft believes it, and the delta a batch of peer
// changes makes to it. Pure: the dataplane (dataplane.ts) sends the operations and commits what
// the kernel accepted.
//
// Each peer contributes entries (routes, permanent neighbours, FDB entries); entries are keyed as
// the full diff keys them (diff.ts), and counted per key, so an entry two peers want (the same
// FDB entry for two subnets behind one VTEP) goes only when neither wants it. Onlink routes on
// weft's devices go through nexthop objects, one per (gateway, device), shared and counted the
// same way; their ids are taken from the ones the last full dump showed free.
import type { FdbSpec, KernelOp, NeighSpec, NexthopSpec, RouteSpec } from './diff.js';

/** What one peer wants in the kernel. */
export interface PeerEntries {
  readonly routes: readonly RouteSpec[];
  readonly neighbours: readonly NeighSpec[];
  readonly fdb: readonly FdbSpec[];
}

export const NO_ENTRIES: PeerEntries = { routes: [], neighbours: [], fdb: [] };

export const routeKey = (r: Pick<RouteSpec, 'dst'>): string => r.dst.toString();
export const neighKey = (n: Pick<NeighSpec, 'ifindex' | 'ip'>): string => `${n.ifindex} ${n.ip.toString()}`;
export const fdbKey = (f: FdbSpec): string => `${f.ifindex} ${f.mac} ${f.dst.toString()}`;
const nexthopKey = (gateway: string, oif: number, onlink: boolean): string => `${gateway} ${oif} ${onlink}`;

const routeValue = (r: RouteSpec): string => (r.nhid ? `nh ${r.nhid}` : `${r.gateway?.toString() ?? '-'} ${r.oif} ${r.onlink}`);

/** Nexthop ids weft allocates start here, away from the small ids other tools pick by hand. */
export const NEXTHOP_ID_BASE = 0x57000000;

export interface ModelScope {
  /** Devices whose gateway routes go through nexthop objects (empty: plain routes everywhere). */
  readonly nexthopDevices: ReadonlySet<number>;
}

/** Counted entries of one kind, keyed. */
class Counted<T> {
  readonly entries = new Map<string, T>();
  private readonly refs = new Map<string, number>();

  ref(key: string): number {
    return this.refs.get(key) ?? 0;
  }

  inc(key: string): void {
    this.refs.set(key, this.ref(key) + 1);
  }

  /** True when nobody wants the key any more. */
  dec(key: string): boolean {
    const n = this.ref(key) - 1;
    if (n > 0) {
      this.refs.set(key, n);
      return false;
    }
    this.refs.delete(key);
    return true;
  }

  clear(): void {
    this.entries.clear();
    this.refs.clear();
  }
}

export class KernelModel {
  private readonly routes = new Counted<RouteSpec>();
  private readonly neighbours = new Counted<NeighSpec>();
  private readonly fdb = new Counted<FdbSpec>();
  private readonly nexthops = new Counted<NexthopSpec>();
  /** (gateway, device, onlink) → nexthop id, for the nexthops in `nexthops`. */
  private readonly nexthopIds = new Map<string, number>();
  /** Ids that are taken in the kernel by anyone (ours included), from the last full dump on. */
  private readonly usedIds = new Set<number>();
  private nextId = NEXTHOP_ID_BASE;
  private readonly byPeer = new Map<string, PeerEntries>();
  /** The model does not match the kernel for sure: the next pass must be a full one. */
  uncertain = true;

  constructor(private scope: ModelScope) {}

  get peerCount(): number {
    return this.byPeer.size;
  }

  /** Entries the model holds, per kind (for tests and metrics). */
  counts(): { routes: number; neighbours: number; fdb: number; nexthops: number } {
    return { routes: this.routes.entries.size, neighbours: this.neighbours.entries.size, fdb: this.fdb.entries.size, nexthops: this.nexthops.entries.size };
  }

  /** The model's entries, as the full diff's desired state (nexthop form where the scope says so). */
  snapshot(): { routes: RouteSpec[]; neighbours: NeighSpec[]; fdb: FdbSpec[]; nexthops: NexthopSpec[] } {
    return {
      routes: [...this.routes.entries.values()],
      neighbours: [...this.neighbours.entries.values()],
      fdb: [...this.fdb.entries.values()],
      nexthops: [...this.nexthops.entries.values()],
    };
  }

  /**
   * After a full pass: the kernel now holds `want` (what the pass made it), wanted by these peers;
   * `takenIds` are every nexthop id the kernel had (ours and others').
   */
  reset(scope: ModelScope, peers: ReadonlyMap<string, PeerEntries>, want: { routes: readonly RouteSpec[]; nexthops: readonly NexthopSpec[] }, takenIds: Iterable<number>): void {
    this.scope = scope;
    for (const c of [this.routes, this.neighbours, this.fdb, this.nexthops]) c.clear();
    this.nexthopIds.clear();
    this.usedIds.clear();
    this.byPeer.clear();
    for (const id of takenIds) this.usedIds.add(id);
    for (const nh of want.nexthops) {
      const key = nexthopKey(nh.gateway.toString(), nh.oif, nh.onlink);
      this.nexthops.entries.set(key, nh);
      this.nexthopIds.set(key, nh.id);
      this.usedIds.add(nh.id);
    }
    const wantRoutes = new Map(want.routes.map((r) => [routeKey(r), r]));
    for (const [id, entries] of peers) {
      this.byPeer.set(id, entries);
      for (const r of entries.routes) {
        const key = routeKey(r);
        this.routes.inc(key);
        this.routes.entries.set(key, wantRoutes.get(key) ?? r);
        const nk = this.nexthopKeyOf(r);
        if (nk) this.nexthops.inc(nk);
      }
      for (const n of entries.neighbours) {
        this.neighbours.inc(neighKey(n));
        this.neighbours.entries.set(neighKey(n), n);
      }
      for (const f of entries.fdb) {
        this.fdb.inc(fdbKey(f));
        this.fdb.entries.set(fdbKey(f), f);
      }
    }
    this.uncertain = false;
  }

  private nexthopKeyOf(r: RouteSpec): string | null {
    if (!r.gateway || !this.scope.nexthopDevices.has(r.oif)) return null;
    return nexthopKey(r.gateway.toString(), r.oif, r.onlink);
  }

  private allocateId(): number {
    while (this.usedIds.has(this.nextId)) this.nextId++;
    const id = this.nextId++;
    this.usedIds.add(id);
    return id;
  }

  /**
   * The operations that take the kernel from the model to the model with these peers' entries
   * replaced (null: the peer is gone). The model itself changes only through `commit`.
   */
  delta(changes: ReadonlyArray<{ readonly id: string; readonly entries: PeerEntries | null }>): { ops: KernelOp[]; commit: (refused: ReadonlySet<KernelOp>) => void } {
    // One change per peer: the last one given for it.
    const last = new Map<string, PeerEntries | null>();
    for (const { id, entries } of changes) last.set(id, entries);
    // Counts first (who wants what after the batch); a key nobody wants any more is deleted, a key
    // somebody (still or newly) wants gets the newest value given for it.
    const routeWant = new Map<string, RouteSpec | null>();
    const neighWant = new Map<string, NeighSpec | null>();
    const fdbWant = new Map<string, FdbSpec | null>();
    const nexthopDrop = new Map<string, NexthopSpec>();
    const nexthopAdd = new Map<string, NexthopSpec>();
    for (const [id, entries] of last) {
      const old = this.byPeer.get(id) ?? NO_ENTRIES;
      const now = entries ?? NO_ENTRIES;
      for (const r of old.routes) {
        const key = routeKey(r);
        if (this.routes.dec(key)) routeWant.set(key, null);
        const nk = this.nexthopKeyOf(r);
        if (nk && this.nexthops.dec(nk)) {
          const nh = this.nexthops.entries.get(nk);
          if (nh) nexthopDrop.set(nk, nh);
        }
      }
      for (const n of old.neighbours) if (this.neighbours.dec(neighKey(n))) neighWant.set(neighKey(n), null);
      for (const f of old.fdb) if (this.fdb.dec(fdbKey(f))) fdbWant.set(fdbKey(f), null);
      for (const r of now.routes) {
        const key = routeKey(r);
        this.routes.inc(key);
        const nk = this.nexthopKeyOf(r);
        let spec = r;
        if (nk) {
          this.nexthops.inc(nk);
          nexthopDrop.delete(nk);
          let nh = this.nexthops.entries.get(nk) ?? nexthopAdd.get(nk);
          if (!nh) {
            nh = { id: this.nexthopIds.get(nk) ?? this.allocateId(), gateway: r.gateway!, oif: r.oif, onlink: r.onlink };
            nexthopAdd.set(nk, nh);
          }
          spec = { ...r, nhid: nh.id };
        }
        routeWant.set(key, spec);
      }
      for (const n of now.neighbours) {
        this.neighbours.inc(neighKey(n));
        neighWant.set(neighKey(n), n);
      }
      for (const f of now.fdb) {
        this.fdb.inc(fdbKey(f));
        fdbWant.set(fdbKey(f), f);
      }
      if (entries) this.byPeer.set(id, entries);
      else this.byPeer.delete(id);
    }

    const ops: KernelOp[] = [];
    const routeOps: KernelOp[] = [];
    const opRecord = new Map<KernelOp, () => void>();
    const push = (list: KernelOp[], op: KernelOp, onAccepted: () => void): void => {
      list.push(op);
      opRecord.set(op, onAccepted);
    };
    const deletes: KernelOp[] = [];
    const neighFdb: KernelOp[] = [];
    const nhReplace: KernelOp[] = [];
    const nhDelete: KernelOp[] = [];
    for (const [key, want] of routeWant) {
      const have = this.routes.entries.get(key);
      if (want === null) {
        if (have) push(deletes, { kind: 'route-delete', route: have, repair: 'removed' }, () => this.routes.entries.delete(key));
      } else if (!have || routeValue(have) !== routeValue(want)) {
        push(routeOps, { kind: 'route-replace', route: want, repair: have ? 'changed' : 'added' }, () => this.routes.entries.set(key, want));
      }
    }
    for (const [key, want] of neighWant) {
      const have = this.neighbours.entries.get(key);
      if (want === null) {
        if (have) push(deletes, { kind: 'neigh-delete', neigh: have, repair: 'removed' }, () => this.neighbours.entries.delete(key));
      } else if (!have || have.mac !== want.mac) {
        push(neighFdb, { kind: 'neigh-replace', neigh: want, repair: have ? 'changed' : 'added' }, () => this.neighbours.entries.set(key, want));
      }
    }
    for (const [key, want] of fdbWant) {
      const have = this.fdb.entries.get(key);
      if (want === null) {
        if (have) push(deletes, { kind: 'fdb-delete', fdb: have, repair: 'removed' }, () => this.fdb.entries.delete(key));
      } else if (!have) {
        push(neighFdb, { kind: 'fdb-replace', fdb: want, repair: 'added' }, () => this.fdb.entries.set(key, want));
      }
    }
    for (const [key, nh] of nexthopAdd) {
      push(nhReplace, { kind: 'nexthop-replace', nexthop: nh, repair: 'added' }, () => {
        this.nexthops.entries.set(key, nh);
        this.nexthopIds.set(key, nh.id);
      });
    }
    for (const [key, nh] of nexthopDrop) {
      // Deleting a nexthop takes its routes along: after the route deletes.
      push(nhDelete, { kind: 'nexthop-delete', nexthop: nh, repair: 'removed' }, () => {
        this.nexthops.entries.delete(key);
        this.nexthopIds.delete(key);
        this.usedIds.delete(nh.id);
      });
    }
    ops.push(...deletes, ...nhDelete, ...neighFdb, ...nhReplace, ...routeOps);
    return {
      ops,
      commit: (refused) => {
        for (const op of ops) if (!refused.has(op)) opRecord.get(op)!();
        // A refused operation leaves the kernel unknown for that entry: the next pass is a full one.
        if (refused.size > 0) this.uncertain = true;
      },
    };
  }
}
