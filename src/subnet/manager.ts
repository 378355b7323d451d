// The contract between the daemon loop and a lease store, and the stores' errors. Two
// implementations: EtcdSubnetManager (etcd/manager.ts: flannel's keys under --etcd-prefix, each
// lease bound to an etcd lease with a TTL unless it is a reservation) and KubeSubnetManager (kube/manager.ts, --kube-subnet-mgr:
// the subnet is the Node's spec.podCIDR(s), peers are the Nodes carrying flannel's annotations, and
// nothing expires).
import type { NetworkConfig } from './config.js';
import type { IPAddr } from '../util/ip.js';
import type { Lease, LeaseAttrs } from './lease.js';
import type { WatchResult } from './watcher.js';

/** The network config is not there yet (etcd key, or net-conf.json file); the daemon waits for it. */
export class ConfigNotFoundError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigNotFoundError';
  }
}

/** The store could not be reached or refused a request; worth retrying. */
export class StoreUnavailableError extends Error {
  constructor(
    readonly op: string,
    cause: unknown,
  ) {
    super(`${op}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = 'StoreUnavailableError';
  }
}

/** etcd: every candidate subnet of the range is taken (in kube mode the controller manager allocates). */
export class OutOfSubnetsError extends Error {
  constructor(readonly family: 4 | 6) {
    super(`out of subnets: no free IPv${family} subnet left in [SubnetMin, SubnetMax]`);
    this.name = 'OutOfSubnetsError';
  }
}

/** How a lease was obtained, for logs and metrics. */
export type AcquireHow = 'reuse' | 'previous' | 'new' | 'reacquire' | 'renew';

export interface AcquiredLease {
  readonly lease: Lease;
  readonly how: AcquireHow;
  /** Lost races that were retried on the way. */
  readonly retries: number;
}

/** The subnets named in the previous subnet.env (etcd: tried before a random one). */
export interface PreviousLease {
  readonly subnet: Lease['subnet'];
  readonly ipv6Subnet: Lease['ipv6Subnet'];
}

export interface SubnetManager {
  readonly name: string;
  getNetworkConfig(signal?: AbortSignal): Promise<NetworkConfig>;
  acquireLease(attrs: LeaseAttrs, signal?: AbortSignal): Promise<AcquiredLease>;
  /**
   * Our lease as stored now, without taking it (null when none): etcd finds it by public IP,
   * Kubernetes reads our own Node.
   */
  findOwnLease(publicIP: IPAddr): Promise<Lease | null>;
  /** Extends the lease (a no-op where nothing expires); throws LeaseLostError when the store no longer holds it. */
  renewLease(lease: Lease, signal?: AbortSignal): Promise<Lease>;
  /**
   * Keeps our lease for as long as `signal` is not aborted: renews it before it expires and
   * acquires it again (same subnet if still free) when it is lost. `onChange` sees every new lease.
   */
  keepLease(lease: Lease, onChange: (lease: Lease, how: AcquireHow) => void, signal: AbortSignal): Promise<void>;
  /** A snapshot of every lease first, then changes; ends when `signal` aborts. */
  watchLeases(signal: AbortSignal): AsyncIterable<WatchResult>;
  close(): Promise<void>;
}

export class LeaseLostError extends Error {
  constructor(readonly key: string) {
    super(`lease ${key} is no longer in the store`);
    this.name = 'LeaseLostError';
  }
}
