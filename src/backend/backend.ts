// The contract between the daemon loop and a dataplane backend, and the registry of backend types.
import type { ExternalInterface } from '../daemon/iface.js';
import type { BackendConfig, NetworkConfig } from '../subnet/config.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../subnet/lease.js';
import type { Logger } from '../util/log.js';
import type { Repairs } from './kernel/diff.js';

/** What a backend reports after each programming pass. */
export interface BackendMetrics {
  recordProgramming(peersProgrammed: number, repairs: Repairs, deviceRepairs: number): void;
}

export interface BackendContext {
  readonly config: NetworkConfig;
  readonly extIface: ExternalInterface;
  readonly logger: Logger;
  /** Our lease as the store had it before this start (to keep the VTEP MAC across reboots). */
  readonly previousLease?: Lease | null;
  readonly metrics?: BackendMetrics;
}

export interface Prepared {
  readonly attrs: LeaseAttrs;
  readonly mtu: number;
  /** Extra `WEFT_*` lines for subnet.env (what the CNI plugin needs to attach pods). */
  readonly subnetEnv?: ReadonlyArray<readonly [string, string]>;
}

export interface Backend {
  readonly type: string;
  /** Prepares the node's own devices; returns what to publish in our lease and the pod MTU. */
  prepare(): Promise<Prepared>;
  /** Runs after every acquisition of our lease (the subnet can change on re-acquire). */
  start(lease: Lease): Promise<void>;
  /**
   * Applies a batch of peer changes. `peers` is the whole current peer set, so a backend that
   * works from desired state can ignore the batch and converge on the set.
   */
  apply(batch: readonly LeaseEvent[], peers: readonly Lease[]): Promise<void>;
  /** Periodic drift repair from the whole peer set. */
  reconcile(peers: readonly Lease[]): Promise<void>;
  /** Stops background work; leaves every kernel object in place. */
  close(): Promise<void>;
}

export type BackendFactory = (backend: BackendConfig, ctx: BackendContext) => Backend;

export class UnknownBackendError extends Error {
  constructor(readonly type: string, known: readonly string[]) {
    super(`unknown backend type "${type}" (known types: ${[...known].sort().join(', ')})`);
    this.name = 'UnknownBackendError';
  }
}

export class BackendRegistry {
  private readonly factories = new Map<string, BackendFactory>();

  register(type: string, factory: BackendFactory): this {
    this.factories.set(type, factory);
    return this;
  }

  get types(): string[] {
    return [...this.factories.keys()].sort();
  }

  create(backend: BackendConfig, ctx: BackendContext): Backend {
    const factory = this.factories.get(backend.type);
    if (!factory) throw new UnknownBackendError(backend.type, this.types);
    return factory(backend, ctx);
  }
}
