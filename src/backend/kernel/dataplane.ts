// The kernel side of the vxlan and host-gw backends: a batch of peer changes is applied as the
// delta it makes to the model of what weft programmed (one netlink batch, the size of the change);
// the full dump-and-diff runs when the model cannot be trusted (start, a refused operation, a
// device rebuilt) and on the timer, and the model is rebuilt from what it leaves in the kernel.
import type { Netlink } from '../../netlink/index.js';
import { errorMessage } from '../../util/errors.js';
import type { Logger } from '../../util/log.js';
import type { DesiredState, FdbSpec, NeighSpec, Repairs, RouteSpec } from './diff.js';
import { DriftWatch } from './drift.js';
import { fdbKey, KernelModel, neighKey, opSubject, routeKey, type PeerEntries } from './model.js';
import { diffStateSliced } from './diff.js';
import { nexthopDevicesOf, program, readActual, sendOps, type ProgramScope } from './programmer.js';

export interface DataplanePass {
  /** Differences a full pass found and fixed (zero for a delta: events are not repairs). */
  readonly repairs: Repairs;
  readonly failures: number;
  /** Whether this was a full dump-and-diff. */
  readonly full: boolean;
}

const NO_REPAIRS: Repairs = { added: 0, changed: 0, removed: 0 };

/** What the drift watch needs from the backend that owns the dataplane. */
export interface DriftHooks {
  readonly families: ReadonlyArray<4 | 6>;
  /** Watch FDB entries too (vxlan). */
  readonly fdb: boolean;
  /** The backend's devices by name (its own, and the external interface). */
  readonly devIndex: (dev: string) => number | null;
  readonly scope: () => Promise<ProgramScope>;
  /** Runs `fn` in the backend's queue, after any pass in flight. */
  readonly exclusive: <T>(fn: () => Promise<T>) => Promise<T>;
  /** The backend's full pass (devices included). */
  readonly fullPass: () => Promise<unknown>;
  readonly onRepairs: (repairs: Repairs, failures: number) => void;
}

/** A lost notification or a deleted nexthop asks for a full pass; at most this often. */
const FULL_PASS_MIN_INTERVAL_MS = 1000;

export class KernelDataplane {
  private readonly model = new KernelModel({ nexthopDevices: new Set() });
  private drift: DriftWatch | null = null;
  private lastForcedFull = 0;
  private forcedFull: NodeJS.Timeout | null = null;

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

  /**
   * Starts watching the kernel for changes to what weft owns: an entry removed or changed by
   * someone else is put back within the watch's quiet time, not at the next timer.
   */
  watchDrift(hooks: DriftHooks): void {
    if (this.drift) return;
    this.drift = new DriftWatch({
      families: hooks.families,
      fdb: hooks.fdb,
      devIndex: hooks.devIndex,
      logger: this.logger,
      ignoring: () => this.model.uncertain,
      onDrift: (observations) => {
        void hooks
          .exclusive(async () => {
            if (this.model.uncertain) return; // a full pass is due anyway
            const scope = await hooks.scope();
            const { ops, commit, full } = this.model.repair(observations, {
              networks: scope.networks,
              l2Devices: new Set(scope.l2Devices.map((d) => d.index)),
              devIndex: hooks.devIndex,
              allow: (kind, key) => this.drift?.allowRepair(kind, key) ?? false,
            });
            if (full) this.model.uncertain = true;
            if (ops.length > 0) {
              const sent = await sendOps(this.nl, ops, this.logger);
              commit(sent.refused);
              this.logger.warn('repaired entries changed behind weft\'s back', { ...sent.repairs, refused: sent.refused.size });
              hooks.onRepairs(sent.repairs, sent.refused.size);
            }
            if (this.model.uncertain) this.requestFull(hooks);
          })
          .catch((e: unknown) => this.logger.error('drift repair failed', { error: errorMessage(e) }));
      },
      onLost: (why) => {
        this.logger.warn('kernel notifications were lost; running a full pass', { why });
        this.model.uncertain = true;
        this.requestFull(hooks);
      },
    });
    this.drift.start();
  }

  async stopDriftWatch(): Promise<void> {
    if (this.forcedFull) clearTimeout(this.forcedFull);
    await this.drift?.stop();
    this.drift = null;
  }

  /** A full pass soon, at most one per FULL_PASS_MIN_INTERVAL_MS. */
  private requestFull(hooks: DriftHooks): void {
    if (this.forcedFull) return;
    const wait = Math.max(0, this.lastForcedFull + FULL_PASS_MIN_INTERVAL_MS - Date.now());
    this.forcedFull = setTimeout(() => {
      this.forcedFull = null;
      this.lastForcedFull = Date.now();
      void hooks.exclusive(() => hooks.fullPass()).catch((e: unknown) => this.logger.error('full pass after drift failed', { error: errorMessage(e) }));
    }, wait);
  }

  /**
   * The timer's pass when the model is trusted: the kernel is read while events keep being
   * applied (the dump takes most of the time), then compared with the model in `exclusive`,
   * leaving out the entries events changed meanwhile (the dump's view of them is stale), and put
   * back where it differs. When the model is not trusted, a full pass from `peers()` instead.
   */
  async verify(scope: ProgramScope, exclusive: <T>(fn: () => Promise<T>) => Promise<T>, peers: () => ReadonlyMap<string, PeerEntries>): Promise<DataplanePass> {
    if (this.model.uncertain) return exclusive(() => this.full(scope, peers()));
    this.model.record();
    const generation = this.model.generation;
    let actual: Awaited<ReturnType<typeof readActual>>;
    const began = performance.now();
    try {
      actual = await readActual(this.nl, scope);
    } catch (e) {
      this.model.recorded();
      throw e;
    }
    const dumped = performance.now();
    // Compared outside the queue, a slice at a time, so events go on meanwhile: the model's view of
    // any entry an event changes from now on is recorded as stale too, and dropped below.
    const diff = await diffStateSliced(this.model.snapshot(), actual);
    const compared = performance.now();
    return exclusive(async () => {
      const queued = performance.now();
      const stale = this.model.recorded();
      if (this.model.uncertain) return this.full(scope, peers());
      // A full pass rebuilt the model meanwhile: it compared everything itself.
      if (this.model.generation !== generation) return { repairs: NO_REPAIRS, failures: 0, full: true };
      // Entries events changed since the dump began: the dump's (and maybe the snapshot's) view of
      // them is stale, so whatever the comparison says about them is dropped.
      const ops = stale.size === 0 ? diff.ops : diff.ops.filter((op) => !stale.has(opSubject(op)));
      const repairs = { added: 0, changed: 0, removed: 0 };
      for (const op of ops) repairs[op.repair]++;
      this.model.noteTakenIds(actual.allNexthopIds);
      this.drift?.forgive();
      this.logger.debug('timer pass compared the kernel with the model', {
        dumpMs: Math.round(dumped - began),
        compareMs: Math.round(compared - dumped),
        queuedMs: Math.round(queued - compared),
        stale: stale.size,
        ops: ops.length,
      });
      if (ops.length === 0) return { repairs, failures: 0, full: true };
      this.logger.warn('the kernel differed from what weft programmed; repairing it', { ...repairs });
      const sent = await sendOps(this.nl, ops, this.logger);
      if (sent.refused.size > 0) this.model.uncertain = true;
      return { repairs: sent.repairs, failures: sent.refused.size, full: true };
    });
  }

  /** Dump what weft owns, diff against every peer's entries, apply, and rebuild the model. */
  async full(scope: ProgramScope, peers: ReadonlyMap<string, PeerEntries>): Promise<DataplanePass> {
    const desired = union(peers);
    const result = await program(this.nl, scope, desired, this.logger);
    this.model.reset({ nexthopDevices: nexthopDevicesOf(scope) }, peers, result.want, result.takenIds);
    if (result.failures > 0) this.model.uncertain = true;
    // The timer forgives: entries weft stopped fighting for are watched again.
    this.drift?.forgive();
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
