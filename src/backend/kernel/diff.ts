// Desired kernel entries versus what the kernel has: the operations that turn one into the
// other. Pure, so drift repair is the same code on start, on events and on the timer.
import type { IPAddr, IPNet } from '../../util/ip.js';

export interface RouteSpec {
  readonly dst: IPNet;
  readonly gateway: IPAddr | null;
  readonly oif: number;
  readonly onlink: boolean;
  /** Forward through this nexthop object instead (gateway/oif/onlink then describe it). */
  readonly nhid?: number | null;
}

export interface NexthopSpec {
  readonly id: number;
  readonly gateway: IPAddr;
  readonly oif: number;
  readonly onlink: boolean;
}

export interface NeighSpec {
  readonly ifindex: number;
  readonly ip: IPAddr;
  readonly mac: string;
}

export interface FdbSpec {
  readonly ifindex: number;
  readonly mac: string;
  readonly dst: IPAddr;
}

/** What a backend wants in the kernel for the current peer set. */
export interface DesiredState {
  readonly routes: readonly RouteSpec[];
  readonly neighbours: readonly NeighSpec[];
  readonly fdb: readonly FdbSpec[];
  readonly nexthops?: readonly NexthopSpec[];
}

/** What the kernel has, already narrowed to the entries weft owns. */
export type ActualState = DesiredState;

/** Which repair an operation makes: an entry added, rewritten or removed. */
export type RepairKind = 'added' | 'changed' | 'removed';

export type KernelOp = (
  | { readonly kind: 'route-replace'; readonly route: RouteSpec }
  | { readonly kind: 'route-delete'; readonly route: RouteSpec }
  | { readonly kind: 'neigh-replace'; readonly neigh: NeighSpec }
  | { readonly kind: 'neigh-delete'; readonly neigh: NeighSpec }
  | { readonly kind: 'fdb-replace'; readonly fdb: FdbSpec }
  | { readonly kind: 'fdb-delete'; readonly fdb: FdbSpec }
  | { readonly kind: 'nexthop-replace'; readonly nexthop: NexthopSpec }
  | { readonly kind: 'nexthop-delete'; readonly nexthop: NexthopSpec }
) & { readonly repair: RepairKind };

export interface Repairs {
  /** Entries added because they were missing. */
  readonly added: number;
  /** Entries rewritten because they differed. */
  readonly changed: number;
  /** Entries removed because no lease wants them. */
  readonly removed: number;
}

/** Entries compared between two points where a sliced comparison lets other work in. */
const SLICE = 2000;

/**
 * Keyed entries of one kind: what to replace and what to delete. A generator that pauses every
 * SLICE entries: diffState runs it straight through, diffStateSliced gives the event loop a turn
 * at each pause (the timer's comparison of 30 000 entries must not hold lease events back).
 */
function* diffKind<T>(
  desired: readonly T[],
  actual: readonly T[],
  key: (x: T) => string,
  value: (x: T) => string,
  count: { added: number; changed: number; removed: number },
): Generator<void, { replace: Array<[T, RepairKind]>; remove: T[] }> {
  const have = new Map<string, T>();
  const actualKeys: string[] = [];
  for (const x of actual) {
    const k = key(x);
    actualKeys.push(k);
    have.set(k, x);
    if (actualKeys.length % SLICE === 0) yield;
  }
  const want = new Set<string>();
  const replace: Array<[T, RepairKind]> = [];
  for (const d of desired) {
    const k = key(d);
    want.add(k);
    if (want.size % SLICE === 0) yield;
    const h = have.get(k);
    if (h && value(h) === value(d)) continue;
    const kind = h ? 'changed' : 'added';
    count[kind]++;
    replace.push([d, kind]);
  }
  const remove = actual.filter((_, i) => !want.has(actualKeys[i]!));
  count.removed += remove.length;
  return { replace, remove };
}

const routeValue = (r: RouteSpec) =>
  r.nhid ? `nh ${r.nhid}` : `${r.gateway?.toString() ?? '-'} ${r.oif} ${r.onlink}`;
const nexthopValue = (n: NexthopSpec) => `${n.gateway.toString()} ${n.oif} ${n.onlink}`;

/**
 * The operations, in a safe order: stale entries go first (nexthops last, since deleting one
 * takes its routes along), then neighbours and FDB entries, then nexthops, then routes, so a
 * route never points at a next hop whose MAC or object does not exist yet.
 */
function* diffSteps(desired: DesiredState, actual: ActualState): Generator<void, { ops: KernelOp[]; repairs: Repairs }> {
  const count = { added: 0, changed: 0, removed: 0 };
  const neigh = yield* diffKind(desired.neighbours, actual.neighbours, (n) => `${n.ifindex} ${n.ip.toString()}`, (n) => n.mac, count);
  const fdb = yield* diffKind(desired.fdb, actual.fdb, (f) => `${f.ifindex} ${f.mac} ${f.dst.toString()}`, () => '', count);
  const nh = yield* diffKind(desired.nexthops ?? [], actual.nexthops ?? [], (n) => String(n.id), nexthopValue, count);
  const routes = yield* diffKind(desired.routes, actual.routes, (r) => r.dst.toString(), routeValue, count);
  const ops: KernelOp[] = [
    ...routes.remove.map((route) => ({ kind: 'route-delete' as const, route, repair: 'removed' as const })),
    ...neigh.remove.map((n) => ({ kind: 'neigh-delete' as const, neigh: n, repair: 'removed' as const })),
    ...fdb.remove.map((f) => ({ kind: 'fdb-delete' as const, fdb: f, repair: 'removed' as const })),
    ...nh.remove.map((nexthop) => ({ kind: 'nexthop-delete' as const, nexthop, repair: 'removed' as const })),
    ...neigh.replace.map(([n, repair]) => ({ kind: 'neigh-replace' as const, neigh: n, repair })),
    ...fdb.replace.map(([f, repair]) => ({ kind: 'fdb-replace' as const, fdb: f, repair })),
    ...nh.replace.map(([nexthop, repair]) => ({ kind: 'nexthop-replace' as const, nexthop, repair })),
    ...routes.replace.map(([route, repair]) => ({ kind: 'route-replace' as const, route, repair })),
  ];
  return { ops, repairs: count };
}

export function diffState(desired: DesiredState, actual: ActualState): { ops: KernelOp[]; repairs: Repairs } {
  const steps = diffSteps(desired, actual);
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
  }
}

/** diffState, giving the event loop a turn every few thousand entries. */
export async function diffStateSliced(desired: DesiredState, actual: ActualState): Promise<{ ops: KernelOp[]; repairs: Repairs }> {
  const steps = diffSteps(desired, actual);
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}
