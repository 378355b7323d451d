// The contract between the daemon loop and a dataplane backend, and the registry of backend types.
// Everything a backend needs from the outside world is declared here, so src/backend never
// imports the daemon.
import type { BackendConfig, NetworkConfig } from '../subnet/config.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../subnet/lease.js';
import type { PeerProblem } from '../subnet/peer-gate.js';
import type { WeftSubnetEnv } from '../subnetenv/format.js';
import type { IPAddr } from '../util/ip.js';
import type { Logger } from '../util/log.js';
import type { Repairs } from './kernel/diff.js';
import type { PolicyFlowSection } from './ovs/policy-section.js';

/** The node's interface towards its peers (chosen by the daemon from --iface and friends). */
export interface ExternalInterface {
  readonly name: string;
  readonly index: number;
  readonly mtu: number;
  /** The interface's IPv4 address used (null when IPv4 is disabled). */
  readonly ifaceAddr: IPAddr | null;
  /** Its global IPv6 address (null when IPv6 is disabled). */
  readonly ifaceV6Addr: IPAddr | null;
  /** Public IPv4: --public-ip or ifaceAddr. */
  readonly extAddr: IPAddr | null;
  /** Public IPv6: --public-ipv6 or ifaceV6Addr. */
  readonly extV6Addr: IPAddr | null;
}

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
  /** With --network-policy: the flows the ovs backend hosts for the policy enforcer (other backends ignore it). */
  readonly policyFlows?: PolicyFlowSection;
}

export interface Prepared {
  readonly attrs: LeaseAttrs;
  readonly mtu: number;
  /** The `WEFT_*` lines of subnet.env this backend sets (what the CNI plugin needs to attach pods). */
  readonly subnetEnv?: Partial<Pick<WeftSubnetEnv, 'backend' | 'ovsBridge' | 'ovsRunDir' | 'ovsDatapath'>>;
}

/** What one programming pass left undone. */
export interface BackendPass {
  /** Operations the kernel (or OVS) refused; the daemon retries with backoff. */
  readonly failures: number;
}

export const CLEAN_PASS: BackendPass = { failures: 0 };

export interface Backend {
  readonly type: string;
  /** Prepares the node's own devices; returns what to publish in our lease and the pod MTU. */
  prepare(): Promise<Prepared>;
  /**
   * Why this backend cannot program a peer's lease (backend type, VNI, VTEP MAC), or null. The
   * daemon's peer gate asks before a lease reaches apply/reconcile, after prepare().
   */
  peerProblem(lease: Lease): PeerProblem | null;
  /** Runs after every acquisition of our lease (the subnet can change on re-acquire). */
  start(lease: Lease): Promise<void>;
  /**
   * Applies a batch of peer changes as a delta: the cost is the size of the batch, not of the
   * cluster (the backend keeps its own model of the peers and of what it programmed). The first
   * batch after start converges everything.
   */
  apply(batch: readonly LeaseEvent[]): Promise<BackendPass>;
  /**
   * The full comparison from the whole peer set: the safety net, run on the timer and after a
   * pass that left the model uncertain (refused operations).
   */
  reconcile(peers: readonly Lease[]): Promise<BackendPass>;
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
