// What `weft status` shows about one running daemon: its lease, backend activity and rule keeper,
// served as JSON on /status. Counts come from the daemon's own metrics, so /status and /metrics
// can never disagree; times and last errors come from DaemonActivity, which metrics do not keep.
import type { CniServerPhase, CniServerRequestError, CniServerState } from '../cniserver/types.js';
import type { RulesMode } from '../ipmasq/keeper.js';
import type { NetworkConfig } from '../subnet/config.js';
import { vtepMacOf, type Lease } from '../subnet/lease.js';
import type { Rejection } from '../subnet/peer-gate.js';
import type { DaemonMetrics } from './metrics.js';

export const STATUS_KIND = 'weft-status';
export const STATUS_VERSION = 1;

export interface PeerStatus {
  readonly subnet: string | null;
  readonly ipv6Subnet: string | null;
  readonly publicIP: string;
  readonly publicIPv6: string | null;
  readonly backendType: string | null;
  readonly vtepMAC: string | null;
  readonly vtepMACv6: string | null;
}

/** A peer lease the peer gate refused: never programmed while it stays so. */
export interface RejectedPeerStatus extends PeerStatus {
  /** weft_leases_rejected_total's reason label. */
  readonly reason: string;
  readonly detail: string;
  /** When it was first rejected for this reason. */
  readonly since: string;
}

export interface LeaseStatus extends PeerStatus {
  readonly reservation: boolean;
  /** ISO time from weft_lease_expiration_timestamp_seconds (kept current by renewals); null for a reservation. */
  readonly expiration: string | null;
}

export interface TimedError {
  readonly time: string;
  readonly message: string;
}

export interface RepairCounts {
  readonly added: number;
  readonly changed: number;
  readonly removed: number;
  readonly device: number;
}

export interface BackendStatus {
  readonly type: string;
  /** weft_peers. */
  readonly peersKnown: number;
  /** weft_peers_programmed. */
  readonly peersProgrammed: number;
  /** weft_peers_rejected. */
  readonly peersRejected: number;
  /** The rejected peer leases and why. */
  readonly rejectedPeers: readonly RejectedPeerStatus[];
  /** weft_backend_op_failures_total: operations the kernel or OVS refused (retried with backoff). */
  readonly failures: number;
  /** When a batch of lease events was last applied. */
  readonly lastApply: string | null;
  /** When the periodic drift repair last completed. */
  readonly lastReconcile: string | null;
  /** Seconds between periodic repairs; 0 = disabled. */
  readonly reconcileInterval: number;
  /** weft_reconcile_repairs_total by kind. */
  readonly repairs: RepairCounts;
  /** The last failed apply or reconcile, cleared by the next success. */
  readonly lastError: TimedError | null;
}

export interface IpMasqStatus {
  readonly masquerade: boolean;
  readonly forwardRules: boolean;
  /** null until the network config is known. */
  readonly mode: RulesMode | null;
  readonly resyncSeconds: number;
  readonly lastCheck: string | null;
  /** Last pass after the first that found the rules changed behind weft's back and rewrote them. */
  readonly lastRepair: string | null;
  /** What that repair found wrong, one line each. */
  readonly lastRepairProblems: readonly string[];
  /** weft_ipmasq_checks_total. */
  readonly checks: number;
  /** weft_ipmasq_repairs_total, summed over modes. */
  readonly repairs: number;
  /** weft_ipmasq_errors_total. */
  readonly errors: number;
  /** The last failed pass, cleared by the next success. */
  readonly lastError: TimedError | null;
}

export interface CniServerStatus {
  /** The socket path ('' and phase 'off' when --cni-socket is empty). */
  readonly socket: string;
  readonly phase: CniServerPhase;
  /** phase === 'serving'. */
  readonly serving: boolean;
  /** Why it is waiting or failed. */
  readonly reason: string | null;
  /** weft_cni_requests_total, summed over plugins and verbs. */
  readonly requests: number;
  /** weft_cni_requests_total by result. */
  readonly results: Readonly<Record<string, number>>;
  /** Requests being read, waiting or running now. */
  readonly inFlight: number;
  /** Requests answered with a timeout or failure whose plugin work still runs. */
  readonly abandoned: number;
  /** The most recent failed requests, newest first. */
  readonly lastErrors: readonly CniServerRequestError[];
}

export interface StatusSnapshot {
  readonly kind: typeof STATUS_KIND;
  readonly version: typeof STATUS_VERSION;
  readonly weftVersion: string;
  readonly time: string;
  /** weft_ready: the same condition as /readyz. */
  readonly ready: boolean;
  readonly subnetFile: string;
  readonly network: {
    readonly network: string | null;
    readonly ipv6Network: string | null;
    readonly backendType: string;
    readonly enableNFTables: boolean;
  } | null;
  readonly lease: LeaseStatus | null;
  readonly backend: BackendStatus | null;
  readonly ipmasq: IpMasqStatus;
  /** Only when asked for (`/status?peers=true`): a large cluster makes this list long. */
  readonly peers?: readonly PeerStatus[];
  /** The CNI server (absent from a weftd older than it). */
  readonly cniServer?: CniServerStatus;
}

/** What the daemon loop records as it goes, for the parts of the status metrics cannot hold. */
export class DaemonActivity {
  lastApply: Date | null = null;
  lastReconcile: Date | null = null;
  backendError: { at: Date; message: string } | null = null;
  lastRuleCheck: Date | null = null;
  lastRuleRepair: { at: Date; problems: readonly string[] } | null = null;
  ruleError: { at: Date; message: string } | null = null;
  /** The keeper's first successful pass installs the rules; problems found later are repairs. */
  private rulesInstalled = false;

  backendPass(kind: 'apply' | 'reconcile', error: Error | null, now = new Date()): void {
    if (error) {
      this.backendError = { at: now, message: error.message };
      return;
    }
    this.backendError = null;
    if (kind === 'apply') this.lastApply = now;
    else this.lastReconcile = now;
  }

  rulePass(result: { problems: readonly string[] } | Error, now = new Date()): void {
    if (result instanceof Error) {
      this.ruleError = { at: now, message: result.message };
      return;
    }
    this.ruleError = null;
    this.lastRuleCheck = now;
    if (this.rulesInstalled && result.problems.length > 0) this.lastRuleRepair = { at: now, problems: [...result.problems] };
    this.rulesInstalled = true;
  }
}

/** The daemon's side of a snapshot. */
export interface StatusInput {
  readonly weftVersion: string;
  readonly subnetFile: string;
  readonly config: NetworkConfig | null;
  readonly backendType: string | null;
  readonly lease: Lease | null;
  readonly peers: readonly Lease[];
  readonly rejected: readonly Rejection[];
  readonly masquerade: boolean;
  readonly forwardRules: boolean;
  readonly rulesResync: number;
  readonly reconcileInterval: number;
  readonly activity: DaemonActivity;
}

export interface StatusOptions {
  /** Include the peer list. */
  readonly peers?: boolean;
  readonly now?: Date;
}

export function peerStatus(lease: Lease): PeerStatus {
  return {
    subnet: lease.subnet ? lease.subnet.toString() : null,
    ipv6Subnet: lease.ipv6Subnet ? lease.ipv6Subnet.toString() : null,
    publicIP: lease.attrs.publicIP.toString(),
    publicIPv6: lease.attrs.publicIPv6 ? lease.attrs.publicIPv6.toString() : null,
    backendType: lease.attrs.backendType ?? null,
    vtepMAC: vtepMacOf(lease, 4),
    vtepMACv6: vtepMacOf(lease, 6),
  };
}

interface MetricLike {
  get(): Promise<{ values: ReadonlyArray<{ value: number; labels: Readonly<Record<string, string | number | undefined>> }> }>;
}

/** Sum of a metric's values, optionally only those with `labels`. */
async function metricValue(m: MetricLike, labels: Record<string, string> = {}): Promise<number> {
  const { values } = await m.get();
  return values
    .filter((v) => Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want))
    .reduce((sum, v) => sum + v.value, 0);
}

const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);
const timed = (e: { at: Date; message: string } | null): TimedError | null => (e ? { time: e.at.toISOString(), message: e.message } : null);

/** The CNI server's part of the snapshot: its own state, the counts from weft_cni_requests_total. */
export async function cniServerStatus(state: CniServerState | null, metrics: DaemonMetrics): Promise<CniServerStatus> {
  const { values } = await metrics.cniRequests.get();
  const results: Record<string, number> = {};
  let requests = 0;
  for (const v of values) {
    const r = String(v.labels.result);
    results[r] = (results[r] ?? 0) + v.value;
    requests += v.value;
  }
  if (!state) return { socket: '', phase: 'off', serving: false, reason: null, requests, results, inFlight: 0, abandoned: 0, lastErrors: [] };
  return { ...state, serving: state.phase === 'serving', requests, results };
}

export async function buildStatus(input: StatusInput, metrics: DaemonMetrics, opts: StatusOptions = {}): Promise<StatusSnapshot> {
  const now = opts.now ?? new Date();
  const { activity: act, config, lease } = input;
  const [ready, expiry, peersKnown, peersProgrammed, peersRejected, failures, added, changed, removed, device, checks, ruleRepairs, ruleErrors] = await Promise.all([
    metricValue(metrics.ready),
    metricValue(metrics.leaseExpiry),
    metricValue(metrics.peers),
    metricValue(metrics.peersProgrammed),
    metricValue(metrics.peersRejected),
    metricValue(metrics.backendFailures),
    metricValue(metrics.reconcileRepairs, { kind: 'added' }),
    metricValue(metrics.reconcileRepairs, { kind: 'changed' }),
    metricValue(metrics.reconcileRepairs, { kind: 'removed' }),
    metricValue(metrics.reconcileRepairs, { kind: 'device' }),
    metricValue(metrics.ruleChecks),
    metricValue(metrics.ruleRepairs),
    metricValue(metrics.ruleErrors),
  ]);
  return {
    kind: STATUS_KIND,
    version: STATUS_VERSION,
    weftVersion: input.weftVersion,
    time: now.toISOString(),
    ready: ready === 1,
    subnetFile: input.subnetFile,
    network: config
      ? {
          network: config.network ? config.network.toString() : null,
          ipv6Network: config.ipv6Network ? config.ipv6Network.toString() : null,
          backendType: config.backend.type,
          enableNFTables: config.enableNFTables,
        }
      : null,
    lease: lease
      ? {
          ...peerStatus(lease),
          reservation: lease.reservation,
          expiration: lease.reservation || expiry <= 0 ? null : new Date(expiry * 1000).toISOString(),
        }
      : null,
    backend: input.backendType
      ? {
          type: input.backendType,
          peersKnown,
          peersProgrammed,
          peersRejected,
          rejectedPeers: input.rejected.map((r) => ({ ...peerStatus(r.lease), reason: r.reason, detail: r.detail, since: r.since.toISOString() })),
          failures,
          lastApply: iso(act.lastApply),
          lastReconcile: iso(act.lastReconcile),
          reconcileInterval: input.reconcileInterval,
          repairs: { added, changed, removed, device },
          lastError: timed(act.backendError),
        }
      : null,
    ipmasq: {
      masquerade: input.masquerade,
      forwardRules: input.forwardRules,
      mode: config ? (config.enableNFTables ? 'nftables' : 'iptables') : null,
      resyncSeconds: input.rulesResync,
      lastCheck: iso(act.lastRuleCheck),
      lastRepair: iso(act.lastRuleRepair?.at),
      lastRepairProblems: act.lastRuleRepair?.problems ?? [],
      checks,
      repairs: ruleRepairs,
      errors: ruleErrors,
      lastError: timed(act.ruleError),
    },
    ...(opts.peers ? { peers: input.peers.map(peerStatus) } : {}),
  };
}
