// flannel's etcd subnet manager with its defects fixed: every write is a transaction, a lost race
// retries, reservations stay reservations, a lost lease is acquired again instead of exiting,
// and a value that does not parse is skipped rather than read as "all peers gone".
import { AbortedError, Backoff, delay } from '../../util/backoff.js';
import { errorMessage } from '../../util/errors.js';
import type { Logger } from '../../util/log.js';
import { AsyncQueue } from '../../util/queue.js';
import type { IPAddr, IPNet } from '../../util/ip.js';
import { allocateSubnet, cryptoRandomBelow, inRange, type AllocationRange, type RandomBelow } from '../allocator.js';
import { ConfigError, parseNetworkConfig, subnetRange, type NetworkConfig } from '../config.js';
import { leaseId, type Lease, type LeaseAttrs } from '../lease.js';
import {
  ConfigNotFoundError,
  LeaseLostError,
  OutOfSubnetsError,
  StoreUnavailableError,
  type AcquireHow,
  type AcquiredLease,
  type PreviousLease,
  type SubnetManager,
} from '../manager.js';
import type { WatchResult } from '../watcher.js';
import type { Listing, Registry, RegistryWatch, StoredLease } from './contract.js';
import { EtcdRegistry, type EtcdConnectOptions } from './registry.js';

import { DEFAULT_LEASE_TTL_SECONDS } from './defaults.js';
export { DEFAULT_LEASE_TTL_SECONDS };
/** How long a start-up listing may be reused by the next step. */
const LISTING_REUSE_MS = 10_000;

/** How the manager allocates and keeps leases, whatever registry it runs on. */
export interface LeaseManagerOptions {
  readonly knownBackends: readonly string[];
  readonly logger: Logger;
  /** The subnets named in the previous subnet.env, tried before a random one. */
  readonly previous?: PreviousLease;
  readonly leaseTTLSeconds?: number;
  /** Renew this long before expiry (flannel --subnet-lease-renew-margin, in minutes there). */
  readonly renewMarginSeconds?: number;
  /** Lost create races to retry before giving up. */
  readonly maxRaceRetries?: number;
  readonly random?: RandomBelow;
  /** Called for every failed store request (metrics). */
  readonly onStoreError?: (op: string) => void;
}

/** The production wiring: the manager on an etcd registry. */
export interface EtcdManagerOptions extends EtcdConnectOptions, LeaseManagerOptions {}

export class EtcdSubnetManager implements SubnetManager {
  readonly name = 'etcd';
  readonly registry: Registry;
  private config: NetworkConfig | null = null;
  private preferred: PreviousLease | null;
  /** The stored form of leases we hold, by lease id. */
  private readonly own = new Map<string, StoredLease>();
  private readonly ttl: number;
  private readonly margin: number;
  private listing: { listing: Listing; at: number } | null = null;

  /** The manager on etcd at `opts.endpoints` (what weftd and `weft` run). */
  static connect(opts: EtcdManagerOptions): EtcdSubnetManager {
    return new EtcdSubnetManager(opts, new EtcdRegistry(opts, opts.logger));
  }

  /** The manager on `registry` (flannel's NewLocalManager(config, registry)). */
  constructor(
    private readonly opts: LeaseManagerOptions,
    registry: Registry,
  ) {
    this.registry = registry;
    this.preferred = opts.previous ?? null;
    this.ttl = opts.leaseTTLSeconds ?? DEFAULT_LEASE_TTL_SECONDS;
    this.margin = opts.renewMarginSeconds ?? 3600;
    if (this.margin >= this.ttl) throw new RangeError(`renew margin ${this.margin}s must be below the lease TTL ${this.ttl}s`);
  }

  async getNetworkConfig(): Promise<NetworkConfig> {
    const text = await this.registry.getConfig();
    if (text === null) {
      throw new ConfigNotFoundError(
        `network config not found in etcd at ${this.registry.configKey} (was it written with the etcd v3 API?)`,
      );
    }
    const cfg = parseNetworkConfig(text, { knownBackends: this.opts.knownBackends });
    if (!cfg.enableIPv4 || !cfg.network) {
      throw new ConfigError(null, 'EnableIPv4: the etcd lease store needs IPv4 (flannel keys always carry an IPv4 subnet)');
    }
    this.config = cfg;
    return cfg;
  }

  async acquireLease(attrs: LeaseAttrs, signal?: AbortSignal): Promise<AcquiredLease> {
    const cfg = this.config ?? (await this.getNetworkConfig());
    const range4 = subnetRange(cfg, 4)!;
    const range6 = cfg.enableIPv6 ? subnetRange(cfg, 6) : null;
    const maxRetries = this.opts.maxRaceRetries ?? 20;
    // An etcd lease for the key we create, kept across lost races. A node with no previous
    // subnet almost always creates a key, so it grants while it lists (one round trip less).
    let spare: string | null = null;
    let granting: Promise<string> | null = this.preferred ? null : this.registry.grant(this.ttl);
    try {
      for (let retries = 0; ; retries++) {
        if (signal?.aborted) throw new AbortedError();
        if (retries > maxRetries) throw new Error(`gave up acquiring a lease after ${maxRetries} lost races`);
        // The first attempt may use the listing start-up already made: every write is a
        // compare-and-swap, so a stale listing costs at most a lost race, never a duplicate.
        const fresh = retries === 0 ? this.takeListing() : null;
        const [listing, granted] = await Promise.all([fresh ?? this.registry.list(), granting]);
        const { leases } = listing;
        granting = null;
        if (granted) spare = granted;
        const mine = leases.find((s) => s.lease.attrs.publicIP.equals(attrs.publicIP) && !attrs.publicIP.isUnspecified());
        if (mine && this.compatible(mine.lease, range4, range6)) {
          const reused = await this.registry.reuse(mine, attrs);
          if (reused) return this.hold(reused, 'reuse', retries, listing);
          continue;
        }
        if (mine?.lease.reservation) {
          this.opts.logger.warn('reservation for our public IP does not fit the network config; leaving it alone', {
            key: mine.key,
          });
        }
        // An incompatible lease of ours is replaced in the same transaction; a reservation is never touched.
        const replaces = mine && !mine.lease.reservation ? mine : undefined;
        const others = leases.filter((s) => s !== replaces);
        const wanted4 = [mine?.lease.subnet ?? null, this.preferred?.subnet ?? null];
        const subnet = pickSubnet(range4, others.map((s) => s.lease.subnet), wanted4, this.random);
        if (!subnet) throw new OutOfSubnetsError(4);
        let ipv6Subnet: IPNet | null = null;
        if (range6) {
          const wanted6 = [mine?.lease.ipv6Subnet ?? null, this.preferred?.ipv6Subnet ?? null];
          ipv6Subnet = pickSubnet(range6, others.map((s) => s.lease.ipv6Subnet), wanted6, this.random);
          if (!ipv6Subnet) throw new OutOfSubnetsError(6);
        }
        spare ??= await this.registry.grant(this.ttl);
        const created = await this.registry.create({ subnet, ipv6Subnet, attrs, etcdLease: spare, ttlSeconds: this.ttl, replaces });
        if (created) {
          spare = null;
          const how: AcquireHow = mine?.lease.subnet?.equals(subnet)
            ? 'reuse'
            : this.preferred?.subnet?.equals(subnet)
              ? 'previous'
              : 'new';
          return this.hold(created, how, retries, listing);
        }
      }
    } finally {
      const unused = spare ?? (await granting?.catch(() => null));
      if (unused) await this.registry.revoke(unused).catch(() => undefined);
    }
  }

  async findOwnLease(publicIP: IPAddr): Promise<Lease | null> {
    if (publicIP.isUnspecified()) return null;
    const listing = await this.registry.list();
    this.keepListing(listing);
    return listing.leases.find((s) => s.lease.attrs.publicIP.equals(publicIP))?.lease ?? null;
  }

  /**
   * Start-up lists every lease up to three times (own lease, acquisition, watch); with thousands
   * of peers each listing costs a few hundred ms. One recent listing is kept for the next user.
   */
  private keepListing(listing: Listing): void {
    this.listing = { listing, at: Date.now() };
  }

  private takeListing(): Listing | null {
    const kept = this.listing;
    this.listing = null;
    return kept && Date.now() - kept.at < LISTING_REUSE_MS ? kept.listing : null;
  }

  async renewLease(lease: Lease): Promise<Lease> {
    const stored = this.own.get(leaseId(lease));
    if (!stored) throw new LeaseLostError(leaseId(lease));
    if (stored.etcdLease === '0') return stored.lease; // reservations do not expire
    const ttl = await this.registry.keepAlive(stored.etcdLease);
    if (ttl <= 0) {
      this.own.delete(leaseId(lease));
      throw new LeaseLostError(stored.key);
    }
    const renewed: StoredLease = { ...stored, lease: { ...stored.lease, expiration: new Date(Date.now() + ttl * 1000) } };
    this.own.set(leaseId(lease), renewed);
    return renewed.lease;
  }

  async keepLease(
    lease: Lease,
    onChange: (lease: Lease, how: AcquireHow) => void,
    signal: AbortSignal,
  ): Promise<void> {
    const log = this.opts.logger;
    let current = lease;
    // A failed renewal is retried often enough to land several attempts inside the margin: with a
    // short TTL a 60 s backoff would let the lease expire while etcd is reachable again.
    const retry = new Backoff(1000, Math.max(1000, Math.min(60_000, (this.margin * 1000) / 4)));
    while (!signal.aborted) {
      const stored = this.own.get(leaseId(current));
      const lost = new AbortController();
      const keyWatch = stored ? await this.watchOwnKey(stored, lost, signal) : null;
      if (!stored) lost.abort();
      try {
        while (!signal.aborted && !lost.signal.aborted) {
          const exp = current.expiration;
          const waitMs = exp ? Math.max(0, exp.getTime() - this.margin * 1000 - Date.now()) : 2 ** 31 - 1;
          await delay(Math.min(waitMs, 2 ** 31 - 1), AbortSignal.any([signal, lost.signal])).catch(() => undefined);
          if (signal.aborted || lost.signal.aborted) break;
          try {
            current = await this.renewLease(current);
            retry.reset();
            onChange(current, 'renew');
          } catch (e) {
            if (e instanceof LeaseLostError) break;
            this.opts.onStoreError?.('renew');
            log.warn('renewing the lease failed; retrying', { error: errorMessage(e) });
            await retry.wait(AbortSignal.any([signal, lost.signal])).catch(() => undefined);
          }
        }
      } finally {
        if (keyWatch) await keyWatch.cancel();
      }
      if (signal.aborted) return;
      // The lease is gone (expired during an outage, deleted by an operator): take it again,
      // keeping the same subnet when nobody else has it.
      log.warn('our lease is no longer in etcd; acquiring it again', { subnet: String(current.subnet) });
      this.own.delete(leaseId(current));
      this.preferred = { subnet: current.subnet, ipv6Subnet: current.ipv6Subnet };
      while (!signal.aborted) {
        try {
          const got = await this.acquireLease(current.attrs, signal);
          current = got.lease;
          retry.reset();
          onChange(current, 'reacquire');
          break;
        } catch (e) {
          if (e instanceof AbortedError) return;
          this.opts.onStoreError?.('acquire');
          log.warn('re-acquiring the lease failed; retrying', { error: errorMessage(e) });
          await retry.wait(signal).catch(() => undefined);
        }
      }
    }
  }

  watchLeases(signal: AbortSignal): AsyncIterable<WatchResult> {
    const queue = new AsyncQueue<WatchResult>();
    const log = this.opts.logger;
    let watcher: RegistryWatch | null = null;
    const backoff = new Backoff(100, 5000);
    let restarting = false;

    const stopWatcher = async () => {
      const w = watcher;
      watcher = null;
      if (w) await w.cancel();
    };

    // List, report the snapshot, and watch from the listing's revision; on failure retry with backoff.
    const start = async (): Promise<void> => {
      if (restarting) return;
      restarting = true;
      try {
        while (!signal.aborted) {
          try {
            await stopWatcher();
            // The watch replays everything after the listing's revision, so an older listing
            // loses nothing; it only means more events to apply.
            const listing = this.takeListing() ?? (await this.registry.list());
            const w: RegistryWatch = await this.registry.watchSubnets(nextRevision(listing.revision), {
              onEvents: (events) => queue.push({ kind: 'events', events }),
              // The watch was ended by the server (typically: our revision was compacted while we
              // were away). List again: the next snapshot yields exactly what changed.
              onError: (err) => {
                if (watcher === w) watcher = null;
                this.opts.onStoreError?.('watch');
                log.warn('etcd watch cancelled; listing again', { error: err.message });
                void start();
              },
            });
            if (signal.aborted) {
              await w.cancel();
              return;
            }
            watcher = w;
            queue.push({ kind: 'snapshot', leases: listing.leases.map((s) => s.lease) });
            backoff.reset();
            return;
          } catch (e) {
            this.opts.onStoreError?.('watch');
            log.warn('cannot watch leases in etcd; retrying', { error: errorMessage(e) });
            await backoff.wait(signal).catch(() => undefined);
          }
        }
      } finally {
        restarting = false;
      }
    };

    // An abort listener added to an already-aborted signal never runs: a daemon told to stop
    // during start-up would wait on this queue forever.
    if (signal.aborted) {
      queue.close();
      return queue;
    }
    signal.addEventListener(
      'abort',
      () => {
        void stopWatcher().finally(() => queue.close());
      },
      { once: true },
    );
    void start();
    return queue;
  }

  /** Every lease in the store with its remaining TTL (for `weft leases`). */
  async listLeases(): Promise<Lease[]> {
    const { leases } = await this.registry.list();
    return Promise.all(
      leases.map(async (s) => {
        if (s.etcdLease === '0') return s.lease;
        const ttl = await this.registry.timeToLive(s.etcdLease);
        return { ...s.lease, expiration: ttl > 0 ? new Date(Date.now() + ttl * 1000) : null };
      }),
    );
  }

  async close(): Promise<void> {
    await this.registry.close();
  }

  private get random(): RandomBelow {
    return this.opts.random ?? cryptoRandomBelow;
  }

  private hold(stored: StoredLease, how: AcquireHow, retries: number, listing?: Listing): AcquiredLease {
    if (listing) this.keepListing(listing);
    this.own.set(leaseId(stored.lease), stored);
    this.preferred = { subnet: stored.lease.subnet, ipv6Subnet: stored.lease.ipv6Subnet };
    return { lease: stored.lease, how, retries };
  }

  private compatible(lease: Lease, range4: AllocationRange, range6: AllocationRange | null): boolean {
    if (!lease.subnet || !inRange(range4, lease.subnet)) return false;
    if (range6) return lease.ipv6Subnet !== null && inRange(range6, lease.ipv6Subnet);
    return lease.ipv6Subnet === null;
  }

  /** Aborts `lost` when our key is deleted or rebound to another etcd lease. */
  private async watchOwnKey(stored: StoredLease, lost: AbortController, signal: AbortSignal): Promise<RegistryWatch | null> {
    const backoff = new Backoff(100, 5000);
    while (!signal.aborted) {
      try {
        return await this.registry.watchKey(stored.key, nextRevision(stored.revision), {
          onChange: (etcdLease) => {
            if (etcdLease !== stored.etcdLease) lost.abort();
          },
          // Compacted or refused: re-check by re-acquiring (which reuses our key if still there).
          onError: () => lost.abort(),
        });
      } catch (e) {
        if (!(e instanceof StoreUnavailableError)) throw e;
        await backoff.wait(signal).catch(() => undefined);
      }
    }
    return null;
  }
}

/** The revision after `revision`, where a watch of what follows a read starts. */
function nextRevision(revision: string): string {
  return (BigInt(revision) + 1n).toString();
}

/** The first wanted subnet that is a free candidate, else a random free one. */
function pickSubnet(
  range: AllocationRange,
  taken: ReadonlyArray<IPNet | null>,
  wanted: ReadonlyArray<IPNet | null>,
  random: RandomBelow,
): IPNet | null {
  const busy = taken.filter((t): t is IPNet => t !== null);
  for (const w of wanted) {
    if (w && inRange(range, w) && !busy.some((t) => t.overlaps(w))) return w;
  }
  return allocateSubnet(range, busy, random);
}
