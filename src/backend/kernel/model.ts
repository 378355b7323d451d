// What weft has programmed in the kernel, as weft believes it, and the delta a batch of peer
// changes makes to it. Pure: the dataplane (dataplane.ts) sends the operations and commits what
// the kernel accepted.
//
// Each peer contributes entries (routes, permanent neighbours, FDB entries); entries are keyed as
// the full diff keys them (diff.ts), and counted per key, so an entry two peers want (the same
// FDB entry for two subnets behind one VTEP) goes only when neither wants it. Onlink routes on
// weft's devices go through nexthop objects, one per (gateway, device), shared and counted the
// same way; their ids are taken from the ones the last full dump showed free.
import type { IPNet } from '../../util/ip.js';
import type { FdbSpec, KernelOp, NeighSpec, NexthopSpec, RouteSpec } from './diff.js';
import type { Observation } from './drift.js';

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
  /** The ids of the nexthops in `nexthops`. */
  private readonly ourNexthopIds = new Set<number>();
  /** Ids that are taken in the kernel by anyone (ours included), from the last full dump on. */
  private readonly usedIds = new Set<number>();
  private nextId = NEXTHOP_ID_BASE;
  private readonly byPeer = new Map<string, PeerEntries>();
  /** The model does not match the kernel for sure: the next pass must be a full one. */
  uncertain = true;
  /** Counts rebuilds (`reset`): a comparison that began before one compared with another model. */
  generation = 0;
  /** Keys changed since `record()` (per kind: route, neigh, fdb, nexthop), or null when not recording. */
  private touched: Set<string> | null = null;

  /** Starts noting which entries change (a dump is being read: its view of them is stale). */
  record(): void {
    this.touched = new Set();
  }

  /** Stops noting; returns the entries that changed, as `kind key`. */
  recorded(): Set<string> {
    const t = this.touched ?? new Set<string>();
    this.touched = null;
    return t;
  }

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
    this.ourNexthopIds.clear();
    this.usedIds.clear();
    this.byPeer.clear();
    for (const id of takenIds) this.usedIds.add(id);
    for (const nh of want.nexthops) {
      const key = nexthopKey(nh.gateway.toString(), nh.oif, nh.onlink);
      this.nexthops.entries.set(key, nh);
      this.nexthopIds.set(key, nh.id);
      this.ourNexthopIds.add(nh.id);
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
    this.generation++;
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
        this.ourNexthopIds.add(nh.id);
      });
    }
    for (const [key, nh] of nexthopDrop) {
      // Deleting a nexthop takes its routes along: after the route deletes.
      push(nhDelete, { kind: 'nexthop-delete', nexthop: nh, repair: 'removed' }, () => {
        this.nexthops.entries.delete(key);
        this.nexthopIds.delete(key);
        this.ourNexthopIds.delete(nh.id);
        this.usedIds.delete(nh.id);
      });
    }
    ops.push(...deletes, ...nhDelete, ...neighFdb, ...nhReplace, ...routeOps);
    return {
      ops,
      commit: (refused) => {
        for (const op of ops) if (!refused.has(op)) opRecord.get(op)!();
        if (this.touched) for (const op of ops) this.touched.add(opSubject(op));
        // A refused operation leaves the kernel unknown for that entry: the next pass is a full one.
        if (refused.size > 0) this.uncertain = true;
      },
    };
  }

  /**
   * What the kernel notified (drift.ts) against the model: the operations that put each entry
   * back as the model has it — re-add what went missing or changed, remove a weft-protocol route
   * or a permanent entry on weft's devices that the model does not have. A nexthop of ours
   * deleted behind our back took its routes along: that needs a full pass (`full`).
   */
  repair(observations: readonly Observation[], scope: RepairScope): { ops: KernelOp[]; commit: (refused: ReadonlySet<KernelOp>) => void; full: boolean } {
    const ops: KernelOp[] = [];
    const onAccepted = new Map<KernelOp, () => void>();
    let full = false;
    const add = (op: KernelOp, kind: string, key: string, accepted: () => void = () => {}): void => {
      if (!scope.allow(kind, key)) return;
      ops.push(op);
      onAccepted.set(op, accepted);
    };
    for (const o of observations) {
      switch (o.kind) {
        case 'route': {
          const have = this.routes.entries.get(o.key);
          if (have) {
            const same = o.present && (have.nhid ? o.nhid === have.nhid : o.nhid === null && o.gateway?.toString() === have.gateway?.toString() && scope.devIndex(o.dev ?? '') === have.oif);
            if (!same) add({ kind: 'route-replace', route: have, repair: o.present ? 'changed' : 'added' }, o.kind, o.key);
          } else if (o.present && o.proto === '88' && o.mainTable && scope.networks.some((n) => n.containsNet(o.dst))) {
            const oif = scope.devIndex(o.dev ?? '');
            add({ kind: 'route-delete', route: { dst: o.dst, gateway: o.gateway, oif: oif ?? 0, onlink: false, nhid: o.nhid }, repair: 'removed' }, o.kind, o.key);
          }
          break;
        }
        case 'neigh': {
          const have = this.neighbours.entries.get(o.key);
          if (have) {
            if (!o.present || !o.permanent || o.mac !== have.mac) add({ kind: 'neigh-replace', neigh: have, repair: o.present ? 'changed' : 'added' }, o.kind, o.key);
          } else if (o.present && o.permanent && scope.l2Devices.has(scope.devIndex(o.dev) ?? -1)) {
            add({ kind: 'neigh-delete', neigh: { ifindex: scope.devIndex(o.dev)!, ip: o.ip, mac: o.mac ?? '' }, repair: 'removed' }, o.kind, o.key);
          }
          break;
        }
        case 'fdb': {
          const have = this.fdb.entries.get(o.key);
          if (have && !o.present) add({ kind: 'fdb-replace', fdb: have, repair: 'added' }, o.kind, o.key);
          else if (!have && o.present && o.permanent && o.mac !== '00:00:00:00:00:00' && scope.l2Devices.has(scope.devIndex(o.dev) ?? -1)) {
            add({ kind: 'fdb-delete', fdb: { ifindex: scope.devIndex(o.dev)!, mac: o.mac, dst: o.dst }, repair: 'removed' }, o.kind, o.key);
          }
          break;
        }
        case 'nexthop': {
          if (this.ourNexthopIds.has(o.id) && !o.present) full = true;
          break;
        }
      }
    }
    return {
      ops,
      full,
      commit: (refused) => {
        for (const op of ops) if (!refused.has(op)) onAccepted.get(op)!();
        if (this.touched) for (const op of ops) this.touched.add(opSubject(op));
        if (refused.size > 0) this.uncertain = true;
      },
    };
  }

  /** The ids other tools hold, from a dump: never allocated. */
  noteTakenIds(ids: Iterable<number>): void {
    for (const id of ids) this.usedIds.add(id);
  }
}

/** `kind key` of the entry an operation is about, as the full diff keys it. */
export function opSubject(op: KernelOp): string {
  switch (op.kind) {
    case 'route-replace':
    case 'route-delete':
      return `route ${routeKey(op.route)}`;
    case 'neigh-replace':
    case 'neigh-delete':
      return `neigh ${neighKey(op.neigh)}`;
    case 'fdb-replace':
    case 'fdb-delete':
      return `fdb ${fdbKey(op.fdb)}`;
    case 'nexthop-replace':
    case 'nexthop-delete':
      return `nexthop ${op.nexthop.id}`;
  }
}

/** What a drift repair needs besides the model. */
export interface RepairScope {
  /** The cluster networks: weft-protocol routes inside them are weft's. */
  readonly networks: readonly IPNet[];
  /** weft's devices: permanent neighbours and FDB entries on them are weft's. */
  readonly l2Devices: ReadonlySet<number>;
  readonly devIndex: (dev: string) => number | null;
  /** The rate limit: false when weft stopped fighting for this entry. */
  readonly allow: (kind: string, key: string) => boolean;
}

