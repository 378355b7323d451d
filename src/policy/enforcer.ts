// weftd's NetworkPolicy component (`--network-policy`, Kubernetes mode): the API's Namespaces, Pods
// and NetworkPolicies (kube-source.ts) → the engine (engine.ts) → a dataplane (dataplane.ts): the
// weft_policy nftables table (nft/driver.ts) on bridge nodes, the OVS pipeline's policy tables
// (ovs/driver.ts, written through the ovs backend's flow section) on ovs nodes. The order of things:
//  1. nftables only: bridged pod traffic must reach the inet forward hook (bridge-nf-call-iptables/
//     ip6tables = 1); ovs only: the backend must have attached its flow section (its round);
//  2. the three lists are applied to the engine, then everything is written in one transaction
//     (one bundle) — only then is the enforcer ready (weftd's readiness and CNI ADD wait for it);
//  3. the engine's deltas are applied in the order they happened, those that arrive while a
//     write runs together in the next one — so a burst of events costs a few writes, not one
//     each, and the dataplane never falls behind the API by more than one write;
//  4. on the timer the dataplane is read back and compared (beside the queue), and rewritten whole
//     if it differs; after a failed write the model is uncertain and everything is rewritten from
//     the engine at once (backing off while that fails too).
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import type { NetworkConfig } from '../subnet/config.js';
import type { KubeClient } from '../subnet/kube/client.js';
import { AbortedError, delay, untilAborted } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import type { IPAddr, IPNet } from '../util/ip.js';
import type { Logger } from '../util/log.js';
import { type CniPod, PolicyEngine } from './engine.js';
import type { PolicyMetrics } from './counters.js';
import type { PolicyDataplane } from './dataplane.js';
import { explainPacket, type PolicyAnswer } from './explain.js';
import type { Protocol } from './ports.js';
import { KubePolicySource } from './kube-source.js';
import { isEmptyDelta, type PolicyDelta } from './model.js';
import { PolicyNftDriver, runNft, type NftRun } from './nft/driver.js';
import type { Fam } from './nft/layout.js';
import { PolicyOvsDriver } from './ovs/driver.js';
import { PolicyFlowSection } from '../backend/ovs/policy-section.js';

/** The sysctls that send bridged IPv4/IPv6 traffic through the inet hooks (br_netfilter). */
export const BRIDGE_NF_SYSCTLS = ['bridge-nf-call-iptables', 'bridge-nf-call-ip6tables'] as const;

export interface PolicyEnforcerOptions {
  readonly client: KubeClient;
  readonly nodeName: string;
  readonly logger: Logger;
  /** Seconds between read-back compares of the table. */
  readonly resyncSeconds: number;
  /** The cluster's network config (its address families; its backend, which must be bridge-based). */
  readonly networkConfig: () => Promise<Pick<NetworkConfig, 'enableIPv4' | 'enableIPv6' | 'backend'>>;
  /** The Services' ClusterIP ranges (--service-cidr; ovs nodes judge egress to them after the DNAT). */
  readonly serviceCIDRs?: readonly IPNet[];
  /** Log default-deny drops (rate limited), `--network-policy-log`. */
  readonly logDrops?: boolean;
  /** Rule counters per policy and pod, failures and repairs. */
  readonly metrics?: PolicyMetrics;
  /** nft runner (tests). */
  readonly run?: NftRun;
  /** Where the bridge sysctls live (tests). Default /proc/sys/net/bridge. */
  readonly bridgeSysctlDir?: string;
}

/** A resync pass waits at least this many times its last read-back's duration. */
const RESYNC_DUTY = 10;
/** How often the network config is looked for while it is missing. */
const CONFIG_RETRY_MS = 1000;

/** How often a CNI ADD looks for a pod the API has not shown yet. */
const POD_WAIT_POLL_MS = 25;

export class PolicyEnforcer {
  private readonly engine: PolicyEngine;
  /** Made in run(), once the network config says which dataplane and address families there are. */
  private driver: PolicyDataplane | null = null;
  /** Where the ovs backend hosts the rule flows on an ovs node (weftd hands it to the backend). */
  readonly flowSection: PolicyFlowSection;
  private readonly source: KubePolicySource;
  /** Deltas are applied one transaction after another, in order. */
  private queue: Promise<void> = Promise.resolve();
  /** The engine's snapshot has been handed to the driver: deltas from now on are applied. */
  private snapshotTaken = false;
  /** A transaction failed: the table is rewritten from the engine (at once: the timer is woken). */
  private uncertain = false;
  private programmed = false;
  /** Transactions that failed, compares that found drift (for status and tests). */
  failures = 0;
  repairs = 0;

  constructor(private readonly opts: PolicyEnforcerOptions) {
    this.engine = new PolicyEngine(opts.nodeName);
    this.flowSection = new PolicyFlowSection(opts.logger, opts.serviceCIDRs ?? []);
    this.source = new KubePolicySource({
      client: opts.client,
      engine: this.engine,
      logger: opts.logger,
      onDeltas: (deltas) => this.onDeltas(deltas),
    });
  }

  /** The full rule set has been programmed once (weftd is not ready before). */
  get ready(): boolean {
    return this.programmed;
  }

  /** Runs until `signal` aborts: sysctls, sync, the first full write, then deltas and the timer. */
  async run(signal: AbortSignal): Promise<void> {
    this.driver = await this.makeDriver(signal);
    if (this.driver instanceof PolicyNftDriver) await this.enableBridgeNetfilter();
    this.source.start();
    try {
      await untilAborted(this.source.synced, signal);
      this.enqueue(this.rewriteStep);
      await this.queue;
      while (!signal.aborted) {
        await this.sleep(this.nextPassMs(), signal);
        await this.pass();
      }
    } catch (e) {
      if (!(e instanceof AbortedError)) throw e;
    } finally {
      await this.source.stop();
    }
  }

  /** The decisions for one packet at this node's pods, from what is programmed (`weft trace`). */
  explain(src: IPAddr, dst: IPAddr, protocol: Protocol | null, port: number): PolicyAnswer {
    const conjunctions = this.driver instanceof PolicyOvsDriver ? this.driver.conjunctions() : undefined;
    return { programmed: this.programmed && !this.uncertain, decisions: this.driver ? explainPacket(this.driver.programmed, src, dst, protocol, port, conjunctions) : [] };
  }

  /**
   * A CNI ADD of sandbox `pod.sandbox` on this node gave the pod `ips`: they become the pod's in
   * the engine (the API's status lags the ADD), and this resolves once the table holds what follows
   * from them — the CNI server answers the ADD only then, so the pod's first packet meets its
   * policy. Until `signal` aborts it waits for the API to show the pod (this very pod, by UID when
   * the runtime names it) bound to this node, and for the table to be written.
   */
  async podAdded(pod: CniPod, ips: readonly IPAddr[], signal: AbortSignal): Promise<void> {
    while (!this.engine.isLocalPod(pod)) await delay(POD_WAIT_POLL_MS, signal);
    this.apply(() => this.engine.setLocalAddresses(pod, ips));
    await this.queue;
    // A failed transaction: the table is rewritten from the engine (the pod included) shortly.
    while (this.uncertain) {
      await delay(POD_WAIT_POLL_MS, signal);
      await this.queue;
    }
  }

  /** A CNI DEL: the addresses sandbox `pod.sandbox` gave the pod are gone (until the API deletes it). */
  podDeleted(pod: CniPod): void {
    this.apply(() => this.engine.releaseLocalAddresses(pod));
  }

  /** An engine change of our own, after the API's events seen before it. */
  private apply(change: () => PolicyDelta): void {
    this.source.flush();
    const d = change();
    if (!isEmptyDelta(d)) this.onDeltas([d]);
  }

  private onDeltas(deltas: readonly PolicyDelta[]): void {
    // Before the snapshot is taken the deltas are in it already.
    if (!this.snapshotTaken) return;
    this.pending.push(...deltas);
    if (this.drainQueued) return;
    this.drainQueued = true;
    this.enqueue(this.drainStep);
  }

  /** Deltas not yet handed to the driver; a drain step is queued while there are any. */
  private pending: PolicyDelta[] = [];
  private drainQueued = false;

  /** Everything pending at the moment it runs, as one transaction (none while uncertain: the rewrite has it). */
  private readonly drainStep = async (): Promise<void> => {
    this.drainQueued = false;
    const batch = this.pending;
    this.pending = [];
    if (batch.length > 0 && !this.uncertain) await this.driver!.applyAll(batch);
  };

  /**
   * The whole table from the engine's snapshot: at start, and after a failed transaction. The
   * source's gathered deltas are flushed first and dropped with the pending ones — the snapshot
   * holds them; deltas after it are applied on top.
   */
  private readonly rewriteStep = async (): Promise<void> => {
    this.source.flush();
    this.snapshotTaken = true;
    this.pending = [];
    const snap = this.engine.snapshot();
    await this.driver!.sync(snap);
    const first = !this.programmed;
    this.programmed = true;
    if (this.uncertain) {
      this.uncertain = false;
      this.failStreak = 0;
      this.repairs++;
      this.opts.metrics?.recordPolicyRepair();
      this.opts.logger.info('NetworkPolicy table rewritten from the engine');
    }
    if (first) this.opts.logger.info('NetworkPolicy programmed', { pods: snap.pods.size, rules: snap.rules.size, sets: snap.sets.size });
  };

  private enqueue(step: () => Promise<void>): void {
    this.queue = this.queue.then(async () => {
      try {
        await step();
      } catch (e) {
        this.failures++;
        this.failStreak++;
        this.uncertain = true;
        this.wake();
        try {
          this.opts.metrics?.recordPolicyFailure();
          this.opts.logger.error('NetworkPolicy: a write to the dataplane failed; everything is rewritten from the engine', { error: errorMessage(e) });
        } catch {
          // the queue goes on whatever the logger does
        }
      }
    });
  }

  /** Consecutive failed transactions (the retry backs off). */
  private failStreak = 0;
  /** How long the last read-back took (the passes are spaced by it). */
  private lastCheckMs = 0;
  /** Ends the timer's current wait (a failed transaction is retried soon, not at the next tick). */
  private wake: () => void = () => {};

  /**
   * Until the next pass: --iptables-resync, but at least ten times the last read-back (seconds at
   * 10 000 pods and 1 000 policies), so passes never take more than a tenth of the time. A failed
   * transaction wakes the timer at once (its rewrite is the next pass); while rewrites fail too,
   * 2 s, doubling, up to the regular wait.
   */
  private nextPassMs(): number {
    const regular = Math.max(this.opts.resyncSeconds * 1000, RESYNC_DUTY * this.lastCheckMs);
    return this.uncertain ? Math.min(1000 * 2 ** Math.min(this.failStreak - 1, 10), regular) : regular;
  }

  private async sleep(ms: number, signal: AbortSignal): Promise<void> {
    const ctl = new AbortController();
    const stop = () => ctl.abort();
    this.wake = stop;
    signal.addEventListener('abort', stop, { once: true });
    try {
      await delay(ms, ctl.signal);
    } catch (e) {
      if (signal.aborted || !(e instanceof AbortedError)) throw e;
    } finally {
      signal.removeEventListener('abort', stop);
      this.wake = () => {};
    }
  }

  /**
   * The timer's pass. Uncertain: rewrite from the engine. Else read the table back and compare —
   * beside the queue, since at scale that takes seconds and deltas and CNI ADDs must not wait for
   * it; a compare that a transaction overtook is dropped (the next pass looks again), one that
   * found drift queues a rewrite of what is programmed.
   */
  private async pass(): Promise<void> {
    const driver = this.driver!;
    if (this.uncertain) {
      this.enqueue(this.rewriteStep);
      await this.queue;
      return;
    }
    const generation = driver.generation;
    const t0 = performance.now();
    const problems = await driver.check();
    this.lastCheckMs = performance.now() - t0;
    this.opts.metrics?.recordPolicyCheck();
    const counts = driver.counts();
    if (counts && this.opts.metrics) this.opts.metrics.recordPolicyPackets(counts.allowed, counts.denied);
    if (problems.length === 0 || driver.generation !== generation) return;
    this.enqueue(async () => {
      if (driver.generation !== generation || this.uncertain) return; // overtaken: looked at again next pass
      await driver.rewrite();
      this.repairs++;
      this.opts.metrics?.recordPolicyRepair();
      this.opts.logger.warn('NetworkPolicy table differed from the desired state; rewritten', { problems: problems.slice(0, 5), count: problems.length });
    });
    await this.queue;
  }

  /**
   * On an ovs node the OVS pipeline's policy tables (its pods' traffic never crosses the nftables
   * hooks); elsewhere the nftables table, for the families the network config enables
   * (single-stack nodes carry half the objects).
   */
  private async makeDriver(signal: AbortSignal): Promise<PolicyDataplane> {
    let config: Awaited<ReturnType<PolicyEnforcerOptions['networkConfig']>>;
    for (let said = false; ; said = true) {
      try {
        config = await this.opts.networkConfig();
        break;
      } catch (e) {
        // The daemon waits for the network config file too (its ConfigMap may come later).
        if (!said) this.opts.logger.warn('NetworkPolicy waits for the network config', { error: errorMessage(e) });
        await delay(CONFIG_RETRY_MS, signal);
      }
    }
    if (config.backend.type === 'ovs') return new PolicyOvsDriver(this.flowSection, signal);
    const families: Fam[] = [...(config.enableIPv4 ? [4 as const] : []), ...(config.enableIPv6 ? [6 as const] : [])];
    return new PolicyNftDriver(this.opts.run ?? runNft, { families, ...(this.opts.logDrops ? { logDrops: true } : {}) });
  }

  /**
   * Bridged pod-to-pod traffic reaches the inet forward hook only with br_netfilter's sysctls on.
   * Built in here (shared/research/netpol.md); where it is a module that is not loaded, the files
   * are missing and policy between pods of one node cannot be enforced: an error, said once.
   */
  private async enableBridgeNetfilter(): Promise<void> {
    const dir = this.opts.bridgeSysctlDir ?? '/proc/sys/net/bridge';
    for (const name of BRIDGE_NF_SYSCTLS) {
      const file = join(dir, name);
      try {
        if ((await readFile(file, 'utf8')).trim() !== '1') {
          await writeFile(file, '1\n');
          this.opts.logger.info('enabled br_netfilter for NetworkPolicy', { sysctl: `net.bridge.${name}` });
        }
      } catch (e) {
        this.opts.logger.error('cannot enable br_netfilter: NetworkPolicy between pods of this node is not enforced (load the br_netfilter module)', {
          sysctl: `net.bridge.${name}`,
          error: errorMessage(e),
        });
      }
    }
  }
}
