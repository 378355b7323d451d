// Prometheus metrics of one daemon. Flannel exports none; these are weft's own (names prefixed `weft_`).
// Each instance owns a private Registry so several daemons (or tests) can live in one process.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

import type { BackendMetrics } from '../backend/backend.js';
import { CNI_SERVER_PLUGINS, type CniRequestResult, type CniServerMetrics } from '../cniserver/types.js';
import type { Repairs } from '../backend/kernel/diff.js';
import type { ConfigReloadResult } from '../ipmasq/agent-config.js';
import type { RulesMode } from '../ipmasq/keeper.js';
import type { RulesMetrics } from '../ipmasq/manager.js';
import type { PodDeniedPackets, PolicyMetrics, PolicyPackets } from '../policy/counters.js';
import type { LeaseEventType } from '../subnet/lease.js';
import { REJECT_REASONS } from '../subnet/peer-gate.js';
import type { AcquireHow as AnyAcquireHow } from '../subnet/manager.js';

export type StoreOp = 'acquire' | 'renew' | 'watch' | 'config';
/** Renewals are not acquisitions. */
export type AcquireHow = Exclude<AnyAcquireHow, 'renew'>;

export interface DaemonMetricsOptions {
  /** Register the default process/Node.js metrics (`weft_process_*`, `weft_nodejs_*`). Default true. */
  processMetrics?: boolean;
}

// Kernel programming of one batch is normally milliseconds; a full reconcile of a large cluster may take seconds.
const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

export type RepairKind = 'added' | 'changed' | 'removed' | 'device';

// A CNI request is tens of milliseconds; one waiting for readiness or timing out takes up to 60 s.
const CNI_DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export class DaemonMetrics implements BackendMetrics, RulesMetrics, CniServerMetrics, PolicyMetrics {
  readonly registry: Registry;
  /** Unix seconds at which our lease expires; 0 for a reservation (no expiry). */
  readonly leaseExpiry: Gauge;
  readonly eventsReceived: Counter<'type'>;
  readonly eventsApplied: Counter<'type'>;
  readonly batchesApplied: Counter;
  readonly storeErrors: Counter<'op'>;
  readonly leaseAcquisitions: Counter<'how'>;
  /** Seconds spent programming the backend for one batch of lease events. */
  readonly programmingDuration: Histogram;
  /** Seconds spent by one full periodic reconcile of the backend. */
  readonly reconcileDuration: Histogram;
  /** Number of peer leases currently known. */
  readonly peers: Gauge;
  /** Peer leases known but not programmed (the peer gate refused them). */
  readonly peersRejected: Gauge;
  /** Peer lease rejections, by reason (once per lease and change). */
  readonly leasesRejected: Counter<'reason'>;
  /** Kernel/OVS operations refused during programming passes (retried with backoff). */
  readonly backendFailures: Counter;
  /** 1 once the daemon is ready (same condition as /readyz), else 0. */
  readonly ready: Gauge;
  /** Peers whose dataplane entries the backend programmed in its last pass. */
  readonly peersProgrammed: Gauge;
  /** Kernel entries the backend had to add, rewrite or remove, and devices it had to rebuild. */
  readonly reconcileRepairs: Counter<'kind'>;
  /** Rule transactions written (iptables-restore / nft -f), by implementation. */
  readonly ruleWrites: Counter<'mode'>;
  /** Rule reconcile passes that found the rules changed behind weft's back. */
  readonly ruleRepairs: Counter<'mode'>;
  readonly ruleErrors: Counter;
  /** Rule reconcile passes run (each reads the rules back). */
  readonly ruleChecks: Counter;
  /** ip-masq-agent mode: config file changes seen, by outcome (applied, or error: previous rules kept). */
  readonly ipMasqConfigReloads: Counter<'result'>;
  /** ip-masq-agent mode: 1 when the config in use is the file's current content, 0 after a bad change. */
  readonly ipMasqConfigLastReloadOk: Gauge;
  /** CNI server requests answered, by plugin, verb and result (src/cniserver/types.ts). */
  readonly cniRequests: Counter<'plugin' | 'verb' | 'result'>;
  /** Seconds from a CNI server request's arrival to its reply. */
  readonly cniRequestDuration: Histogram<'plugin' | 'verb'>;
  /** --network-policy: packets the table's rules counted (gauges: a rewritten pod chain starts at 0). */
  readonly policyAllowedPackets: Gauge<'namespace' | 'policy' | 'direction'>;
  readonly policyDeniedPackets: Gauge<'namespace' | 'pod' | 'direction'>;
  readonly policyFailures: Counter;
  readonly policyChecks: Counter;
  readonly policyRepairs: Counter;

  constructor(opts: DaemonMetricsOptions = {}) {
    const registry = new Registry();
    const registers = [registry];
    this.registry = registry;

    this.leaseExpiry = new Gauge({
      name: 'weft_lease_expiration_timestamp_seconds',
      help: 'Unix time at which this node\'s subnet lease expires (0 = reservation without expiry).',
      registers,
    });
    this.eventsReceived = new Counter({
      name: 'weft_lease_events_received_total',
      help: 'Lease events received from the subnet store.',
      labelNames: ['type'],
      registers,
    });
    this.eventsApplied = new Counter({
      name: 'weft_lease_events_applied_total',
      help: 'Lease events applied to the backend.',
      labelNames: ['type'],
      registers,
    });
    this.batchesApplied = new Counter({
      name: 'weft_lease_batches_applied_total',
      help: 'Batches of lease events applied to the backend.',
      registers,
    });
    this.storeErrors = new Counter({
      name: 'weft_store_errors_total',
      help: 'Errors talking to the subnet store, by operation.',
      labelNames: ['op'],
      registers,
    });
    this.leaseAcquisitions = new Counter({
      name: 'weft_lease_acquisitions_total',
      help: 'Subnet leases acquired, by how the subnet was chosen.',
      labelNames: ['how'],
      registers,
    });
    this.programmingDuration = new Histogram({
      name: 'weft_backend_programming_duration_seconds',
      help: 'Time to program the backend for one batch of lease events.',
      buckets: DURATION_BUCKETS,
      registers,
    });
    this.reconcileDuration = new Histogram({
      name: 'weft_backend_reconcile_duration_seconds',
      help: 'Time of one full backend reconcile.',
      buckets: DURATION_BUCKETS,
      registers,
    });
    this.peers = new Gauge({ name: 'weft_peers', help: 'Number of peer leases known.', registers });
    this.peersRejected = new Gauge({ name: 'weft_peers_rejected', help: 'Peer leases known but not programmed: they failed the peer checks.', registers });
    this.leasesRejected = new Counter({
      name: 'weft_leases_rejected_total',
      help: 'Peer lease rejections by reason (outside-network, subnet-size, overlaps-own, overlaps-peer, public-ip, backend-type, backend-data), once per lease and change.',
      labelNames: ['reason'],
      registers,
    });
    this.backendFailures = new Counter({ name: 'weft_backend_op_failures_total', help: 'Kernel or OVS operations refused during programming passes; retried with backoff.', registers });
    this.ready = new Gauge({ name: 'weft_ready', help: '1 when the daemon is ready, else 0.', registers });
    this.peersProgrammed = new Gauge({
      name: 'weft_peers_programmed',
      help: 'Peers whose dataplane entries were programmed in the last backend pass.',
      registers,
    });
    this.reconcileRepairs = new Counter({
      name: 'weft_reconcile_repairs_total',
      help: 'Kernel entries added, changed or removed to match the lease set, and devices rebuilt.',
      labelNames: ['kind'],
      registers,
    });

    this.ruleWrites = new Counter({
      name: 'weft_ipmasq_writes_total',
      help: 'Masquerade/forward rule transactions written, by implementation (iptables or nftables).',
      labelNames: ['mode'],
      registers,
    });
    this.ruleRepairs = new Counter({
      name: 'weft_ipmasq_repairs_total',
      help: 'Rule reconcile passes that found missing, extra, duplicated or reordered rules and rewrote them.',
      labelNames: ['mode'],
      registers,
    });
    this.ruleErrors = new Counter({ name: 'weft_ipmasq_errors_total', help: 'Rule reconcile passes that failed.', registers });
    this.ruleChecks = new Counter({ name: 'weft_ipmasq_checks_total', help: 'Rule reconcile passes run.', registers });
    this.ipMasqConfigReloads = new Counter({
      name: 'weft_ipmasq_config_reloads_total',
      help: 'ip-masq-agent mode: config file changes seen, by result (applied; error = invalid or unreadable, previous rules kept).',
      labelNames: ['result'],
      registers,
    });
    this.ipMasqConfigLastReloadOk = new Gauge({
      name: 'weft_ipmasq_config_last_reload_successful',
      help: 'ip-masq-agent mode: 1 when the last load of the config file succeeded, 0 when the rules follow an older version of it.',
      registers,
    });

    this.cniRequests = new Counter({
      name: 'weft_cni_requests_total',
      help: 'CNI server requests answered, by plugin, verb and result (ok, error, invalid, not_ready, not_serving, timeout).',
      labelNames: ['plugin', 'verb', 'result'],
      registers,
    });
    this.cniRequestDuration = new Histogram({
      name: 'weft_cni_request_duration_seconds',
      help: 'Time from a CNI server request\'s arrival to its reply (waiting for readiness and for the same container included).',
      labelNames: ['plugin', 'verb'],
      buckets: CNI_DURATION_BUCKETS,
      registers,
    });

    this.policyAllowedPackets = new Gauge({
      name: 'weft_network_policy_allowed_packets',
      help: 'Packets allowed by a NetworkPolicy\'s rules at this node\'s pods (read from the rule counters on each resync; a pod chain rewritten after a change starts again at 0).',
      labelNames: ['namespace', 'policy', 'direction'],
      registers,
    });
    this.policyDeniedPackets = new Gauge({
      name: 'weft_network_policy_denied_packets',
      help: 'Packets dropped by the default deny of an isolated pod of this node (read from the rule counters on each resync).',
      labelNames: ['namespace', 'pod', 'direction'],
      registers,
    });
    this.policyFailures = new Counter({ name: 'weft_network_policy_failures_total', help: 'NetworkPolicy nftables transactions that failed (the table is then rewritten).', registers });
    this.policyChecks = new Counter({ name: 'weft_network_policy_checks_total', help: 'NetworkPolicy resync passes run (each reads the table back and compares it).', registers });
    this.policyRepairs = new Counter({ name: 'weft_network_policy_repairs_total', help: 'Resync passes that found the NetworkPolicy table differing and rewrote it.', registers });

    // Export every label value from the start, so rate() and alerts see 0 rather than a missing series.
    for (const type of ['added', 'removed'] satisfies LeaseEventType[]) {
      this.eventsReceived.inc({ type }, 0);
      this.eventsApplied.inc({ type }, 0);
    }
    for (const op of ['acquire', 'renew', 'watch', 'config'] satisfies StoreOp[]) this.storeErrors.inc({ op }, 0);
    for (const how of ['reuse', 'previous', 'new', 'reacquire'] satisfies AcquireHow[]) {
      this.leaseAcquisitions.inc({ how }, 0);
    }
    for (const kind of ['added', 'changed', 'removed', 'device'] satisfies RepairKind[]) {
      this.reconcileRepairs.inc({ kind }, 0);
    }
    for (const mode of ['iptables', 'nftables'] satisfies RulesMode[]) {
      this.ruleWrites.inc({ mode }, 0);
      this.ruleRepairs.inc({ mode }, 0);
    }
    for (const result of ['applied', 'error'] satisfies ConfigReloadResult[]) this.ipMasqConfigReloads.inc({ result }, 0);
    this.ipMasqConfigLastReloadOk.set(0);
    // The ADD and DEL series of each plugin (the verbs a runtime calls on every pod).
    for (const plugin of CNI_SERVER_PLUGINS) {
      for (const verb of ['ADD', 'DEL']) for (const result of ['ok', 'error'] satisfies CniRequestResult[]) this.cniRequests.inc({ plugin, verb, result }, 0);
    }
    for (const reason of REJECT_REASONS) this.leasesRejected.inc({ reason }, 0);
    this.ready.set(0);

    if (opts.processMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: 'weft_' });
  }

  recordProgramming(peersProgrammed: number, repairs: Repairs, deviceRepairs: number): void {
    this.peersProgrammed.set(peersProgrammed);
    if (repairs.added) this.reconcileRepairs.inc({ kind: 'added' }, repairs.added);
    if (repairs.changed) this.reconcileRepairs.inc({ kind: 'changed' }, repairs.changed);
    if (repairs.removed) this.reconcileRepairs.inc({ kind: 'removed' }, repairs.removed);
    if (deviceRepairs) this.reconcileRepairs.inc({ kind: 'device' }, deviceRepairs);
  }

  recordRuleWrite(mode: RulesMode): void {
    this.ruleWrites.inc({ mode });
  }

  recordRuleRepair(mode: RulesMode): void {
    this.ruleRepairs.inc({ mode });
  }

  recordPolicyPackets(allowed: readonly PolicyPackets[], denied: readonly PodDeniedPackets[]): void {
    this.policyAllowedPackets.reset();
    this.policyDeniedPackets.reset();
    for (const a of allowed) this.policyAllowedPackets.set({ namespace: a.namespace, policy: a.policy, direction: a.direction }, a.packets);
    for (const d of denied) this.policyDeniedPackets.set({ namespace: d.namespace, pod: d.pod, direction: d.direction }, d.packets);
  }

  recordPolicyCheck(): void {
    this.policyChecks.inc();
  }

  recordPolicyFailure(): void {
    this.policyFailures.inc();
  }

  recordPolicyRepair(): void {
    this.policyRepairs.inc();
  }

  recordRuleCheck(): void {
    this.ruleChecks.inc();
  }

  recordRuleError(): void {
    this.ruleErrors.inc();
  }

  recordConfigReload(result: ConfigReloadResult): void {
    this.ipMasqConfigReloads.inc({ result });
    this.ipMasqConfigLastReloadOk.set(result === 'applied' ? 1 : 0);
  }

  recordCniRequest(plugin: string, verb: string, result: CniRequestResult, seconds: number): void {
    this.cniRequests.inc({ plugin, verb, result });
    this.cniRequestDuration.observe({ plugin, verb }, seconds);
  }

  /** The config file loaded at start (not a reload). */
  recordConfigLoaded(): void {
    this.ipMasqConfigLastReloadOk.set(1);
  }

  /** Prometheus exposition text of all metrics. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** Content type matching `text()`. */
  get contentType(): string {
    return this.registry.contentType;
  }
}
