// The contract between the daemon loop and a lease store (etcd today, Kubernetes Nodes later).
import type { NetworkConfig } from './config.js';
import type { IPAddr } from '../util/ip.js';
import type { Lease, LeaseAttrs } from './lease.js';
import type { WatchResult } from './watcher.js';

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

export interface PreviousLease {
  readonly subnet: Lease['subnet'];
  readonly ipv6Subnet: Lease['ipv6Subnet'];
}

export interface SubnetManager {
  readonly name: string;
  getNetworkConfig(signal?: AbortSignal): Promise<NetworkConfig>;
  acquireLease(attrs: LeaseAttrs, signal?: AbortSignal): Promise<AcquiredLease>;
  /** Our lease as stored now, found by public IP, without taking it (null when none). */
  findOwnLease(publicIP: IPAddr): Promise<Lease | null>;
  /** Extends the lease; throws LeaseLostError when the store no longer holds it. */
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
