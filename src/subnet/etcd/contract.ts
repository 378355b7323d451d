// What the etcd lease manager needs from storage (flannel's subnet/etcd Registry): the network
// config, the lease keys under <prefix>/subnets/ with their revisions, etcd leases (TTLs) and
// watches. Every write is conditional (create-if-absent, compare-and-swap on modRevision), so a
// stale read costs a lost race, never a duplicate. EtcdRegistry (registry.ts) is the etcd side;
// the unit tests drive the manager with an in-memory one (test/helpers/fake-registry.ts).
import type { IPNet } from '../../util/ip.js';
import type { Lease, LeaseAttrs } from '../lease.js';
import type { RawLeaseEvent } from '../watcher.js';

/** A lease as stored: what the conditional writes need besides the lease itself. */
export interface StoredLease {
  readonly lease: Lease;
  readonly key: string;
  readonly modRevision: string;
  /** The etcd lease ID the key is bound to; '0' for a reservation. */
  readonly etcdLease: string;
  /** The store revision at which this was read or written. */
  readonly revision: string;
}

export interface Listing {
  readonly leases: StoredLease[];
  readonly revision: string;
}

/** A new lease key for (subnet, ipv6Subnet), written only if absent. */
export interface CreateRequest {
  readonly subnet: IPNet;
  readonly ipv6Subnet: IPNet | null;
  readonly attrs: LeaseAttrs;
  /** The etcd lease the key is bound to; '0' for none (a reservation). */
  readonly etcdLease: string;
  /** That etcd lease's TTL, for the returned expiration. */
  readonly ttlSeconds: number;
  /** A key of ours deleted in the same transaction, if unchanged since read. */
  readonly replaces?: StoredLease;
}

/** The lease a successful create stands for: a reservation, or one that expires after its TTL. */
export function createdLease(req: CreateRequest): Lease {
  const { subnet, ipv6Subnet, attrs, etcdLease, ttlSeconds } = req;
  const reservation = etcdLease === '0';
  return { subnet, ipv6Subnet, attrs, reservation, expiration: reservation ? null : new Date(Date.now() + ttlSeconds * 1000) };
}

/** The callbacks of a watch on every lease key; none is called before the watch promise resolves. */
export interface SubnetWatchHandlers {
  /** Changes after the start revision, in store order; never empty, unparsable values left out. */
  readonly onEvents: (events: RawLeaseEvent[]) => void;
  /**
   * The store ended the watch (its start revision was compacted, the credentials were refused).
   * Nothing follows; the watch needs no cancel. The caller lists again.
   */
  readonly onError: (err: Error) => void;
}

/** The callbacks of a watch on one lease key; none is called before the watch promise resolves. */
export interface KeyWatchHandlers {
  /** The key was written (bound to `etcdLease`, '0' for none) or deleted (null). */
  readonly onChange: (etcdLease: string | null) => void;
  /** As SubnetWatchHandlers.onError. */
  readonly onError: (err: Error) => void;
}

export interface RegistryWatch {
  /** Stops the watch; resolves even when the store has already dropped it. */
  cancel(): Promise<void>;
}

/**
 * Lease storage for EtcdSubnetManager. Every method that talks to the store throws
 * StoreUnavailableError when it cannot be reached or refuses the request.
 */
export interface Registry {
  /** Where the network config lives, for messages. */
  readonly configKey: string;
  /** The network config text; null when the key is absent. */
  getConfig(): Promise<string | null>;
  /** Every lease key that parses, with the store revision of the listing. */
  list(): Promise<Listing>;
  /** Creates the key in one transaction (with the delete of `replaces`); null when another writer won. */
  create(req: CreateRequest): Promise<StoredLease | null>;
  /**
   * Takes over an existing key of ours: refreshes its etcd lease and rewrites the value only if it
   * differs, compared on modRevision. Returns null when the key changed or its lease is gone.
   */
  reuse(stored: StoredLease, attrs: LeaseAttrs): Promise<StoredLease | null>;
  /** A new etcd lease of `ttlSeconds`; its ID. */
  grant(ttlSeconds: number): Promise<string>;
  /** Ends an etcd lease, deleting the keys bound to it. */
  revoke(etcdLease: string): Promise<void>;
  /** One keepalive; the remaining TTL in seconds (the granted TTL), 0 when the lease no longer exists. */
  keepAlive(etcdLease: string): Promise<number>;
  /** Remaining TTL in seconds of an etcd lease; -1 when it does not exist. */
  timeToLive(etcdLease: string): Promise<number>;
  /** Watches every lease key from `fromRevision`. */
  watchSubnets(fromRevision: string, handlers: SubnetWatchHandlers): Promise<RegistryWatch>;
  /** Watches one lease key from `fromRevision`. */
  watchKey(key: string, fromRevision: string, handlers: KeyWatchHandlers): Promise<RegistryWatch>;
  close(): Promise<void>;
}
