// weftd's NetworkPolicy component (`--network-policy`, Kubernetes mode): the API's Namespaces, Pods
// and NetworkPolicies (kube-source.ts) → the engine (engine.ts) → the weft_policy nftables table
// (nft/driver.ts). The order of things:
//  1. bridged pod traffic must reach the inet forward hook: bridge-nf-call-iptables/ip6tables = 1;
//  2. the three lists are applied to the engine, then the whole table is written in one
//     transaction — only then is the enforcer ready (weftd's readiness and CNI ADD wait for it);
//  3. the engine's deltas are applied in the order they happened, those that arrive while a
//     transaction runs together in the next one — so a burst of events costs a few transactions,
//     not one each, and the table never falls behind the API by more than one transaction;
//  4. on the timer the table is read back and compared, and rewritten whole if it differs; after a
//     failed transaction the model is uncertain and the next tick rewrites it from the engine.
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { FatalError } from '../daemon/daemon.js';
import type { NetworkConfig } from '../subnet/config.js';
import type { KubeClient } from '../subnet/kube/client.js';
import { AbortedError, delay } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import type { IPAddr } from '../util/ip.js';
import type { Logger } from '../util/log.js';
import { PolicyEngine } from './engine.js';
import { countPackets, type PolicyMetrics } from './counters.js';
import { explainPacket, type PolicyAnswer } from './explain.js';
import type { Protocol } from './ports.js';
import { KubePolicySource } from './kube-source.js';
import { isEmptyDelta, type PolicyDelta } from './model.js';
import { PolicyNftDriver, runNft, type NftRun } from './nft/driver.js';
import type { Fam } from './nft/layout.js';

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
  /** Log default-deny drops (rate limited), `--network-policy-log`. */
  readonly logDrops?: boolean;
  /** Rule counters per policy and pod, failures and repairs. */
  readonly metrics?: PolicyMetrics;
  /** nft runner (tests). */
  readonly run?: NftRun;
  /** Where the bridge sysctls live (tests). Default /proc/sys/net/bridge. */
  readonly bridgeSysctlDir?: string;
}

/** A resync pass waits at least this many times its last duration. */
const RESYNC_DUTY = 10;

/** How often a CNI ADD looks for a pod the API has not shown yet. */
const POD_WAIT_POLL_MS = 25;

export class PolicyEnforcer {
  private readonly engine: PolicyEngine;
  /** Made in run(), once the network config says which address families exist. */
  private driver: PolicyNftDriver | null = null;
  private readonly source: KubePolicySource;
  /** Deltas are applied one transaction after another, in order. */
  private queue: Promise<void> = Promise.resolve();
  /** The engine's snapshot has been handed to the driver: deltas from now on are applied. */
  private snapshotTaken = false;
  /** A transaction failed: the table is rewritten from the engine on the next tick. */
  private uncertain = false;
  private programmed = false;
  /** Transactions that failed, compares that found drift (for status and tests). */
  failures = 0;
  repairs = 0;

  constructor(private readonly opts: PolicyEnforcerOptions) {
    this.engine = new PolicyEngine(opts.nodeName);
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
    const driver = (this.driver = await this.makeDriver());
    await this.enableBridgeNetfilter();
    this.source.start();
    try {
      await Promise.race([this.source.synced, aborted(signal)]);
      this.snapshotTaken = true;
      const snap = this.engine.snapshot();
      this.enqueue(async () => {
        await driver.sync(snap);
        this.programmed = true;
        this.opts.logger.info('NetworkPolicy programmed', { pods: snap.pods.size, rules: snap.rules.size, sets: snap.sets.size });
      });
      await this.queue;
      let passMs = 0;
      while (!signal.aborted) {
        // A pass reads the whole table back (seconds at 10 000 pods and 1 000 policies): never
        // more than a tenth of the time, whatever --iptables-resync says.
        await delay(Math.max(this.opts.resyncSeconds * 1000, RESYNC_DUTY * passMs), signal);
        const t0 = performance.now();
        this.enqueue(this.resyncStep);
        await this.queue;
        passMs = performance.now() - t0;
      }
    } catch (e) {
      if (!(e instanceof AbortedError)) throw e;
    } finally {
      await this.source.stop();
    }
  }

  /** The decisions for one packet at this node's pods, from what is programmed (`weft trace`). */
  explain(src: IPAddr, dst: IPAddr, protocol: Protocol | null, port: number): PolicyAnswer {
    return { programmed: this.programmed, decisions: this.driver ? explainPacket(this.driver.programmed, src, dst, protocol, port) : [] };
  }

  /**
   * A CNI ADD of sandbox `sandbox` on this node gave pod namespace/name `ips`: they become the
   * pod's in the engine (the API's status lags the ADD), and this resolves once the table holds
   * what follows from them — the CNI server answers the ADD only then, so the pod's first packet
   * meets its policy. Waits, until `signal` aborts, for a pod the API has not shown yet. Rejects
   * for a pod of another node and when the table could not be written.
   */
  async podAdded(namespace: string, name: string, sandbox: string, ips: readonly IPAddr[], signal: AbortSignal): Promise<void> {
    while (this.engine.podNode(namespace, name) === undefined) await delay(POD_WAIT_POLL_MS, signal);
    const node = this.engine.podNode(namespace, name);
    if (node !== this.opts.nodeName) {
      throw new Error(`the API server has pod ${namespace}/${name} on ${node === null ? 'no node' : `node ${JSON.stringify(node)}`}, not on this node (${JSON.stringify(this.opts.nodeName)}): is NODE_NAME right?`);
    }
    this.apply(() => this.engine.setLocalAddresses(namespace, name, sandbox, ips));
    await this.queue;
    if (this.uncertain) throw new Error('the NetworkPolicy table could not be written (see the log); it is rewritten on the next pass');
  }

  /** A CNI DEL of sandbox `sandbox`: the pod has no addresses here any more (until the API deletes it). */
  podDeleted(namespace: string, name: string, sandbox: string): void {
    this.apply(() => this.engine.releaseLocalAddresses(namespace, name, sandbox));
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

  /** Everything pending at the moment it runs, as one transaction. */
  private readonly drainStep = async (): Promise<void> => {
    this.drainQueued = false;
    const batch = this.pending;
    this.pending = [];
    if (batch.length > 0) await this.driver!.applyAll(batch);
  };

  private enqueue(step: () => Promise<void>): void {
    this.queue = this.queue.then(async () => {
      if (this.uncertain && step !== this.resyncStep) {
        // The next resync rewrites it all from the engine, pending deltas included.
        if (step === this.drainStep) {
          this.drainQueued = false;
          this.pending = [];
        }
        return;
      }
      try {
        await step();
      } catch (e) {
        this.failures++;
        this.opts.metrics?.recordPolicyFailure();
        this.uncertain = true;
        this.opts.logger.error('NetworkPolicy: an nftables transaction failed; the table is rewritten on the next pass', { error: errorMessage(e) });
      }
    });
  }

  private readonly resyncStep = (): Promise<void> => this.resync();

  /** The timer's pass: rewrite from the engine when uncertain, else compare and repair. */
  private async resync(): Promise<void> {
    const driver = this.driver!;
    if (this.uncertain) {
      await driver.sync(this.engine.snapshot());
      this.uncertain = false;
      this.programmed = true;
      this.repairs++;
      this.opts.metrics?.recordPolicyRepair();
      this.opts.logger.info('NetworkPolicy table rewritten from the engine');
      return;
    }
    const problems = await driver.repair();
    this.opts.metrics?.recordPolicyCheck();
    if (driver.lastListing && this.opts.metrics) {
      const { allowed, denied } = countPackets(driver.programmed, driver.lastListing);
      this.opts.metrics.recordPolicyPackets(allowed, denied);
    }
    if (problems.length > 0) {
      this.repairs++;
      this.opts.metrics?.recordPolicyRepair();
      this.opts.logger.warn('NetworkPolicy table differed from the desired state; rewritten', { problems: problems.slice(0, 5), count: problems.length });
    }
  }

  /**
   * The families the network config enables (single-stack nodes carry half the objects). An ovs
   * node is refused: its pods' traffic stays in Open vSwitch and never crosses these hooks, so
   * rules here would look enforced and be not (policy in the OVS pipeline is its own work).
   */
  private async makeDriver(): Promise<PolicyNftDriver> {
    const config = await this.opts.networkConfig();
    if (config.backend.type === 'ovs') {
      throw new FatalError('--network-policy is enforced with nftables on vxlan and host-gw nodes; the ovs backend keeps pod traffic in Open vSwitch, where these rules never see it');
    }
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

function aborted(signal: AbortSignal): Promise<never> {
  return new Promise((_resolve, reject) => {
    if (signal.aborted) reject(new AbortedError());
    signal.addEventListener('abort', () => reject(new AbortedError()), { once: true });
  });
}
