// weftd's NetworkPolicy component (`--network-policy`, Kubernetes mode): the API's Namespaces, Pods
// and NetworkPolicies (kube-source.ts) → the engine (engine.ts) → the weft_policy nftables table
// (nft/driver.ts). The order of things:
//  1. bridged pod traffic must reach the inet forward hook: bridge-nf-call-iptables/ip6tables = 1;
//  2. the three lists are applied to the engine, then the whole table is written in one
//     transaction — only then is the enforcer ready (weftd's readiness and CNI ADD wait for it);
//  3. each batch of the engine's deltas is one `nft -f` transaction, in the order they happened;
//  4. on the timer the table is read back and compared, and rewritten whole if it differs; after a
//     failed transaction the model is uncertain and the next tick rewrites it from the engine.
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import type { KubeClient } from '../subnet/kube/client.js';
import { AbortedError, delay } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import type { Logger } from '../util/log.js';
import { PolicyEngine } from './engine.js';
import { KubePolicySource } from './kube-source.js';
import type { PolicyDelta } from './model.js';
import { PolicyNftDriver, runNft, type NftRun } from './nft/driver.js';

/** The sysctls that send bridged IPv4/IPv6 traffic through the inet hooks (br_netfilter). */
export const BRIDGE_NF_SYSCTLS = ['bridge-nf-call-iptables', 'bridge-nf-call-ip6tables'] as const;

export interface PolicyEnforcerOptions {
  readonly client: KubeClient;
  readonly nodeName: string;
  readonly logger: Logger;
  /** Seconds between read-back compares of the table. */
  readonly resyncSeconds: number;
  /** nft runner (tests). */
  readonly run?: NftRun;
  /** Where the bridge sysctls live (tests). Default /proc/sys/net/bridge. */
  readonly bridgeSysctlDir?: string;
}

export class PolicyEnforcer {
  private readonly engine: PolicyEngine;
  private readonly driver: PolicyNftDriver;
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
    this.driver = new PolicyNftDriver(opts.run ?? runNft);
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
    await this.enableBridgeNetfilter();
    this.source.start();
    try {
      await Promise.race([this.source.synced, aborted(signal)]);
      this.snapshotTaken = true;
      const snap = this.engine.snapshot();
      this.enqueue(async () => {
        await this.driver.sync(snap);
        this.programmed = true;
        this.opts.logger.info('NetworkPolicy programmed', { pods: snap.pods.size, rules: snap.rules.size, sets: snap.sets.size });
      });
      await this.queue;
      while (!signal.aborted) {
        await delay(this.opts.resyncSeconds * 1000, signal);
        this.enqueue(this.resyncStep);
        await this.queue;
      }
    } catch (e) {
      if (!(e instanceof AbortedError)) throw e;
    } finally {
      await this.source.stop();
    }
  }

  private onDeltas(deltas: readonly PolicyDelta[]): void {
    // Before the snapshot is taken the deltas are in it already.
    if (!this.snapshotTaken) return;
    for (const d of deltas) this.enqueue(() => this.driver.apply(d));
  }

  private enqueue(step: () => Promise<void>): void {
    this.queue = this.queue.then(async () => {
      if (this.uncertain && step !== this.resyncStep) return; // the next resync rewrites it all
      try {
        await step();
      } catch (e) {
        this.failures++;
        this.uncertain = true;
        this.opts.logger.error('NetworkPolicy: an nftables transaction failed; the table is rewritten on the next pass', { error: errorMessage(e) });
      }
    });
  }

  private readonly resyncStep = (): Promise<void> => this.resync();

  /** The timer's pass: rewrite from the engine when uncertain, else compare and repair. */
  private async resync(): Promise<void> {
    if (this.uncertain) {
      await this.driver.sync(this.engine.snapshot());
      this.uncertain = false;
      this.programmed = true;
      this.repairs++;
      this.opts.logger.info('NetworkPolicy table rewritten from the engine');
      return;
    }
    const problems = await this.driver.repair();
    if (problems.length > 0) {
      this.repairs++;
      this.opts.logger.warn('NetworkPolicy table differed from the desired state; rewritten', { problems: problems.slice(0, 5), count: problems.length });
    }
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
