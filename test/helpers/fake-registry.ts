// An in-memory lease registry with EtcdRegistry's contract (src/subnet/etcd/contract.ts), following
// etcd where the manager can observe it: one revision counter that every successful write bumps
// (a failed transaction bumps nothing), create/mod revisions per key, transactions that compare
// create revision 0 or modRevision and apply all or nothing, etcd leases with a TTL whose expiry or
// revocation deletes the keys bound to them in one revision, keepalive answering the granted TTL
// (0 for a lease that is gone), time-to-live answering -1 for one that is gone, a put bound to a
// lease that does not exist refused, watches that replay from a start revision and fail once that
// revision is compacted, and values under subnets/ that do not parse left out of listings and
// events. Keys and values are flannel's, through the real codecs.
// What it does not do: lease expiry happens at the next request or when a test calls expireLease
// (no timers, so a test controls time and nothing keeps mocha alive); a running watch is never
// behind, so compaction only affects watches started from an older revision (endWatches stands in
// for the server cancelling one); there is no auth or reconnection.
// Tests act as other writers and as the operator with put/deleteKey/expireLease, inject a request
// that lands just before one of the manager's (before), or make the store unreachable (down).
import { decodeLeaseAttrs, encodeLeaseAttrs, makeSubnetKey, parseSubnetKey } from '../../src/subnet/codec.js';
import {
  createdLease,
  type CreateRequest,
  type KeyWatchHandlers,
  type Listing,
  type Registry,
  type RegistryWatch,
  type StoredLease,
  type SubnetWatchHandlers,
} from '../../src/subnet/etcd/contract.js';
import type { Lease, LeaseAttrs } from '../../src/subnet/lease.js';
import { StoreUnavailableError } from '../../src/subnet/manager.js';
import type { RawLeaseEvent } from '../../src/subnet/watcher.js';
import type { IPNet } from '../../src/util/ip.js';

export type RegistryOp =
  | 'getConfig'
  | 'list'
  | 'create'
  | 'reuse'
  | 'grant'
  | 'revoke'
  | 'keepAlive'
  | 'timeToLive'
  | 'watchSubnets'
  | 'watchKey';

/** A key as stored, in etcd's terms. */
export interface FakeKv {
  readonly value: string;
  readonly createRevision: bigint;
  readonly modRevision: bigint;
  /** The etcd lease the key is bound to; '0' for none. */
  readonly lease: string;
}

interface HistoryEvent {
  readonly revision: bigint;
  readonly type: 'put' | 'delete';
  readonly key: string;
  /** For a put: what was written. */
  readonly kv: FakeKv | null;
}

interface FakeEtcdLease {
  readonly ttl: number;
  expiresAt: number;
}

/** What a watch sees: one call per revision, events in order, after the watch promise resolved. */
interface FakeWatch {
  readonly matches: (key: string) => boolean;
  readonly deliver: (events: readonly HistoryEvent[]) => void;
  readonly fail: (err: Error) => void;
  ended: boolean;
}

/** A request that lands just before the manager's next request of this kind (another writer, an outage). */
type Hook = (detail: string) => void | Promise<void>;

export const FAKE_PREFIX = '/coreos.com/network';

export class FakeRegistry implements Registry {
  readonly configKey = `${FAKE_PREFIX}/config`;
  readonly subnetsPrefix = `${FAKE_PREFIX}/subnets/`;
  /** Every request the manager made, `op detail`, in order. */
  readonly calls: string[] = [];
  /** Keys under subnets/ left out because they do not parse. */
  readonly skipped = new Set<string>();
  /** While true every request fails with StoreUnavailableError, as an unreachable etcd. */
  down = false;
  /** The clock of lease expiry (ms). */
  now: () => number = Date.now;

  private revision = 1n;
  private compactedAt = 0n;
  private nextLeaseId = 0x694d_8a1b_2c3d_0001n;
  private closed = false;
  private readonly kvs = new Map<string, FakeKv>();
  private readonly leases = new Map<string, FakeEtcdLease>();
  private readonly history: HistoryEvent[] = [];
  private readonly watches = new Set<FakeWatch>();
  private readonly hooks = new Map<RegistryOp, Hook[]>();

  // ---- the contract --------------------------------------------------------------------------

  async getConfig(): Promise<string | null> {
    await this.request('getConfig', '');
    return this.kvs.get(this.configKey)?.value ?? null;
  }

  async list(): Promise<Listing> {
    await this.request('list', '');
    const revision = this.revision.toString();
    const stored = [...this.kvs.keys()].sort().map((key) => this.storedAt(key, revision));
    return { leases: stored.filter((s) => s !== null), revision };
  }

  async create(req: CreateRequest): Promise<StoredLease | null> {
    const { etcdLease, replaces } = req;
    const key = this.keyFor(req.subnet, req.ipv6Subnet);
    await this.request('create', key);
    const replaced = replaces && replaces.key !== key ? replaces : undefined;
    const ok =
      !this.kvs.has(key) && (!replaced || this.kvs.get(replaced.key)?.modRevision.toString() === replaced.modRevision);
    if (!ok) return null;
    this.requireLease(etcdLease, 'create lease');
    this.write(() => {
      this.putNow(key, encodeLeaseAttrs(req.attrs), etcdLease);
      if (replaced) this.deleteNow(replaced.key);
    });
    const revision = this.revision.toString();
    return { lease: createdLease(req), key, modRevision: revision, etcdLease, revision };
  }

  async reuse(stored: StoredLease, attrs: LeaseAttrs): Promise<StoredLease | null> {
    await this.request('reuse', stored.key);
    const ttl = stored.etcdLease === '0' ? null : await this.keepAlive(stored.etcdLease);
    if (ttl !== null && ttl <= 0) return null;
    const expiration = ttl === null ? null : new Date(Date.now() + ttl * 1000);
    const value = encodeLeaseAttrs(attrs);
    if (value === encodeLeaseAttrs(stored.lease.attrs)) {
      return { ...stored, lease: { ...stored.lease, attrs, expiration } };
    }
    if (this.kvs.get(stored.key)?.modRevision.toString() !== stored.modRevision) return null;
    this.requireLease(stored.etcdLease, 'update lease');
    this.write(() => this.putNow(stored.key, value, stored.etcdLease));
    const revision = this.revision.toString();
    return { ...stored, modRevision: revision, revision, lease: { ...stored.lease, attrs, expiration } };
  }

  async grant(ttlSeconds: number): Promise<string> {
    await this.request('grant', String(ttlSeconds));
    return this.grantLease(ttlSeconds);
  }

  async revoke(etcdLease: string): Promise<void> {
    await this.request('revoke', etcdLease);
    this.requireLease(etcdLease, 'revoke lease');
    this.expireLease(etcdLease);
  }

  async keepAlive(etcdLease: string): Promise<number> {
    await this.request('keepAlive', etcdLease);
    const l = this.leases.get(etcdLease);
    if (!l) return 0;
    l.expiresAt = this.now() + l.ttl * 1000;
    return l.ttl;
  }

  async timeToLive(etcdLease: string): Promise<number> {
    await this.request('timeToLive', etcdLease);
    const l = this.leases.get(etcdLease);
    return l ? Math.floor((l.expiresAt - this.now()) / 1000) : -1;
  }

  async watchSubnets(fromRevision: string, handlers: SubnetWatchHandlers): Promise<RegistryWatch> {
    await this.request('watchSubnets', fromRevision);
    return this.watch(fromRevision, handlers.onError, (key) => key.startsWith(this.subnetsPrefix), (events) => {
      const out = events.flatMap((e) => this.leaseEvent(e));
      if (out.length > 0) handlers.onEvents(out);
    });
  }

  async watchKey(key: string, fromRevision: string, handlers: KeyWatchHandlers): Promise<RegistryWatch> {
    await this.request('watchKey', key);
    return this.watch(fromRevision, handlers.onError, (k) => k === key, (events) => {
      for (const e of events) handlers.onChange(e.kv ? e.kv.lease : null);
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const w of this.watches) w.ended = true;
    this.watches.clear();
  }

  // ---- what tests do ---------------------------------------------------------------------------

  /** The key of a lease, as EtcdRegistry names it. */
  keyFor(subnet: IPNet, ipv6Subnet: IPNet | null = null): string {
    return this.subnetsPrefix + makeSubnetKey(subnet, ipv6Subnet);
  }

  get currentRevision(): bigint {
    return this.revision;
  }

  /** A plain put by another writer (etcdctl, another node), bound to `etcdLease` ('0': none). */
  put(key: string, value: string, etcdLease = '0'): void {
    this.requireLease(etcdLease, 'put');
    this.write(() => this.putNow(key, value, etcdLease));
  }

  /** Another node's lease as flannel writes it: `{"PublicIP":…}` under the subnet's key. */
  putLease(subnet: IPNet, attrs: LeaseAttrs, etcdLease = '0', ipv6Subnet: IPNet | null = null): string {
    const key = this.keyFor(subnet, ipv6Subnet);
    this.put(key, encodeLeaseAttrs(attrs), etcdLease);
    return key;
  }

  setConfig(config: object | string): void {
    this.put(this.configKey, typeof config === 'string' ? config : JSON.stringify(config));
  }

  /** An operator's delete; false when the key is absent. */
  deleteKey(key: string): boolean {
    if (!this.kvs.has(key)) return false;
    this.write(() => this.deleteNow(key));
    return true;
  }

  /** A lease granted outside the manager (another node's). */
  grantLease(ttlSeconds: number): string {
    const id = (this.nextLeaseId++).toString();
    this.leases.set(id, { ttl: ttlSeconds, expiresAt: this.now() + ttlSeconds * 1000 });
    return id;
  }

  /** The lease's TTL runs out now: it and the keys bound to it go, in one revision. */
  expireLease(etcdLease: string): void {
    this.leases.delete(etcdLease);
    const bound = [...this.kvs].filter(([, kv]) => kv.lease === etcdLease).map(([k]) => k);
    if (bound.length > 0) this.write(() => bound.forEach((k) => this.deleteNow(k)));
  }

  /** The key as stored, or undefined. */
  get(key: string): FakeKv | undefined {
    return this.kvs.get(key);
  }

  /** Keys under subnets/, sorted. */
  subnetKeys(): string[] {
    return [...this.kvs.keys()].filter((k) => k.startsWith(this.subnetsPrefix)).sort();
  }

  /** The etcd leases that exist now, with their granted TTL. */
  liveLeases(): Map<string, number> {
    this.expireDue();
    return new Map([...this.leases].map(([id, l]) => [id, l.ttl]));
  }

  /** How many watches are running (created and not ended). */
  get runningWatches(): number {
    return this.watches.size;
  }

  /** Forgets history up to the current revision: a watch from an older revision fails. */
  compact(): void {
    this.compactedAt = this.revision;
    this.history.length = 0;
  }

  /** The server ends every running watch with `message` (as after a compaction it fell behind). */
  endWatches(message = 'etcdserver: mvcc: required revision has been compacted'): void {
    const running = [...this.watches];
    this.watches.clear();
    for (const w of running) w.fail(new Error(message));
  }

  /** Runs `hook` once, just before the manager's next `op` takes effect. */
  before(op: RegistryOp, hook: Hook): void {
    this.hooks.set(op, [...(this.hooks.get(op) ?? []), hook]);
  }

  /** Runs `hook` before every `op` until the returned function is called. */
  beforeEach(op: RegistryOp, hook: Hook): () => void {
    let active = true;
    const again: Hook = async (detail) => {
      if (!active) return;
      this.before(op, again);
      await hook(detail);
    };
    this.before(op, again);
    return () => (active = false);
  }

  /** How many requests of `op` the manager made. */
  count(op: RegistryOp): number {
    return this.calls.filter((c) => c === op || c.startsWith(`${op} `)).length;
  }

  // ---- internals -------------------------------------------------------------------------------

  /** A round trip: hooks, then outage and expiry as the store sees them when the request arrives. */
  private async request(op: RegistryOp, detail: string): Promise<void> {
    this.calls.push(detail ? `${op} ${detail}` : op);
    const hooks = this.hooks.get(op);
    const hook = hooks?.shift();
    if (hook) await hook(detail);
    await new Promise((resolve) => setImmediate(resolve));
    if (this.closed) throw new StoreUnavailableError(`etcd ${op}`, new Error('client closed'));
    if (this.down) throw new StoreUnavailableError(`etcd ${op}`, new Error('connect ECONNREFUSED'));
    this.expireDue();
  }

  private expireDue(): void {
    const now = this.now();
    for (const [id, l] of this.leases) if (l.expiresAt <= now) this.expireLease(id);
  }

  /** One revision: the writes in `apply` share it and reach watchers as one response. */
  private write(apply: () => void): void {
    const from = this.history.length;
    this.revision++;
    apply();
    const events = this.history.slice(from);
    for (const w of this.watches) {
      const seen = events.filter((e) => w.matches(e.key));
      if (seen.length > 0) w.deliver(seen);
    }
  }

  /** etcd refuses a write bound to a lease that does not exist (and a revoke of one). */
  private requireLease(etcdLease: string, op: string): void {
    if (etcdLease !== '0' && !this.leases.has(etcdLease)) {
      throw new StoreUnavailableError(`etcd ${op}`, new Error('etcdserver: requested lease not found'));
    }
  }

  private putNow(key: string, value: string, etcdLease: string): void {
    const prev = this.kvs.get(key);
    const kv: FakeKv = { value, createRevision: prev?.createRevision ?? this.revision, modRevision: this.revision, lease: etcdLease };
    this.kvs.set(key, kv);
    this.history.push({ revision: this.revision, type: 'put', key, kv });
  }

  private deleteNow(key: string): void {
    if (!this.kvs.delete(key)) return;
    this.history.push({ revision: this.revision, type: 'delete', key, kv: null });
  }

  /** A subnets/ key as EtcdRegistry reads it; null (and remembered) when it does not parse. */
  private storedAt(key: string, revision: string): StoredLease | null {
    const kv = this.kvs.get(key);
    const subnets = this.subnetsOf(key);
    if (!kv || !subnets) return null;
    try {
      const attrs = decodeLeaseAttrs(kv.value);
      const lease: Lease = { ...subnets, attrs, reservation: kv.lease === '0', expiration: null };
      return { lease, key, modRevision: kv.modRevision.toString(), etcdLease: kv.lease, revision };
    } catch {
      this.skipped.add(key);
      return null;
    }
  }

  private subnetsOf(key: string): Pick<Lease, 'subnet' | 'ipv6Subnet'> | null {
    if (!key.startsWith(this.subnetsPrefix)) return null;
    try {
      return parseSubnetKey(key.slice(this.subnetsPrefix.length));
    } catch {
      this.skipped.add(key);
      return null;
    }
  }

  private leaseEvent(e: HistoryEvent): RawLeaseEvent[] {
    if (e.type === 'delete') {
      const subnets = this.subnetsOf(e.key);
      return subnets ? [{ type: 'removed', lease: subnets }] : [];
    }
    const subnets = this.subnetsOf(e.key);
    if (!subnets || !e.kv) return [];
    try {
      const attrs = decodeLeaseAttrs(e.kv.value);
      return [{ type: 'added', lease: { ...subnets, attrs, reservation: e.kv.lease === '0', expiration: null } }];
    } catch {
      this.skipped.add(e.key);
      return [];
    }
  }

  /**
   * A watch from `fromRevision`: the history after it first, then every write as it happens, each
   * revision in its own macrotask (as responses arrive off the network), never before the caller
   * has the handle.
   */
  private watch(
    fromRevision: string,
    onError: (err: Error) => void,
    matches: (key: string) => boolean,
    onRevision: (events: readonly HistoryEvent[]) => void,
  ): RegistryWatch {
    const from = BigInt(fromRevision);
    const queue: Array<() => void> = [];
    const schedule = (fn: () => void) => {
      queue.push(fn);
      if (queue.length === 1) setImmediate(flush);
    };
    const flush = () => {
      const fn = queue.shift();
      if (fn && !w.ended) fn();
      if (queue.length > 0) setImmediate(flush);
    };
    const w: FakeWatch = {
      matches,
      deliver: (events) => schedule(() => onRevision(events)),
      fail: (err) =>
        schedule(() => {
          w.ended = true;
          onError(err);
        }),
      ended: false,
    };
    if (from <= this.compactedAt) {
      w.fail(new Error(`etcdserver: mvcc: required revision has been compacted (${from} <= ${this.compactedAt})`));
      return { cancel: async () => void (w.ended = true) };
    }
    const replay = this.history.filter((e) => e.revision >= from && matches(e.key));
    for (const rev of new Set(replay.map((e) => e.revision))) w.deliver(replay.filter((e) => e.revision === rev));
    this.watches.add(w);
    return {
      cancel: async () => {
        w.ended = true;
        this.watches.delete(w);
      },
    };
  }
}
