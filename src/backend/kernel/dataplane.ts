// The kernel side of the vxlan and host-gw backends: a batch of peer changes is applied as the
// delta it makes to the model of what weft programmed (one netlink batch, the size of the change);
// the full dump-and-diff runs when the model cannot be trusted (start, a refused operation, a
// device rebuilt) and on the timer, and the model is rebuilt from what it leaves in the kernel.
import type { Netlink } from '../../netlink/index.js';
import type { Logger } from '../../util/log.js';
import type { DesiredState, FdbSpec, NeighSpec, Repairs, RouteSpec } from './diff.js';
import { fdbKey, KernelModel, neighKey, routeKey, type PeerEntries } from './model.js';
import { nexthopDevicesOf, program, sendOps, type ProgramScope } from './programmer.js';

export interface DataplanePass {
  /** Differences a full pass found and fixed (zero for a delta: events are not repairs). */
  readonly repairs: Repairs;
  readonly failures: number;
  /** Whether this was a full dump-and-diff. */
  readonly full: boolean;
}

const NO_REPAIRS: Repairs = { added: 0, changed: 0, removed: 0 };

export class KernelDataplane {
  private readonly model = new KernelModel({ nexthopDevices: new Set() });

  constructor(
    private readonly nl: Netlink,
    private readonly logger: Logger,
  ) {}

  /** Peers the model holds entries for. */
  get peerCount(): number {
    return this.model.peerCount;
  }

  /** The next pass must be a full one (a device was rebuilt, a pass was refused). */
  get uncertain(): boolean {
    return this.model.uncertain;
  }

  invalidate(): void {
    this.model.uncertain = true;
  }

  /**
   * These peers' entries changed (null: gone). When the model is uncertain this is a full pass
   * over `all()` instead.
   */
  async delta(scope: ProgramScope, changes: ReadonlyArray<{ readonly id: string; readonly entries: PeerEntries | null }>, all: () => ReadonlyMap<string, PeerEntries>): Promise<DataplanePass> {
    if (this.model.uncertain) return this.full(scope, all());
    const { ops, commit } = this.model.delta(changes);
    if (ops.length === 0) return { repairs: NO_REPAIRS, failures: 0, full: false };
    const sent = await sendOps(this.nl, ops, this.logger);
    commit(sent.refused);
    return { repairs: NO_REPAIRS, failures: sent.refused.size, full: false };
  }

  /** Dump what weft owns, diff against every peer's entries, apply, and rebuild the model. */
  async full(scope: ProgramScope, peers: ReadonlyMap<string, PeerEntries>): Promise<DataplanePass> {
    const desired = union(peers);
    const result = await program(this.nl, scope, desired, this.logger);
    this.model.reset({ nexthopDevices: nexthopDevicesOf(scope) }, peers, result.want, result.takenIds);
    if (result.failures > 0) this.model.uncertain = true;
    return { repairs: result.repairs, failures: result.failures, full: true };
  }
}

/** Every peer's entries as one desired state (an entry two peers want appears once). */
function union(peers: ReadonlyMap<string, PeerEntries>): DesiredState {
  const routes = new Map<string, RouteSpec>();
  const neighbours = new Map<string, NeighSpec>();
  const fdb = new Map<string, FdbSpec>();
  for (const e of peers.values()) {
    for (const r of e.routes) routes.set(routeKey(r), r);
    for (const n of e.neighbours) neighbours.set(neighKey(n), n);
    for (const f of e.fdb) fdb.set(fdbKey(f), f);
  }
  return { routes: [...routes.values()], neighbours: [...neighbours.values()], fdb: [...fdb.values()] };
}
