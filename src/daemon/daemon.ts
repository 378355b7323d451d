// The daemon loop: interface → network config → backend → lease → subnet.env → peer events. It
// coordinates three interfaces, as flanneld does: the subnet manager (leases), the backend
// (dataplane) and the rules manager (masquerade/forward rules).
// Shutdown leaves the lease, subnet.env and every dataplane object in place.
import { access, constants, mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';

import type { Backend, BackendPass, BackendRegistry, ExternalInterface, Prepared } from '../backend/backend.js';
import { PeerSet } from '../backend/peer-set.js';
import type { PolicyFlowSection } from '../backend/ovs/policy-section.js';
import { RulesSetupError, ruleInputs, type RulesManager } from '../ipmasq/manager.js';
import { ConfigError, type NetworkConfig } from '../subnet/config.js';
import { leaseId, type Lease } from '../subnet/lease.js';
import { ConfigNotFoundError, StoreUnavailableError, type AcquireHow, type SubnetManager } from '../subnet/manager.js';
import { NO_WEFT_LINES } from '../subnetenv/format.js';
import { writeSubnetEnv } from '../subnetenv/write.js';
import { AbortedError, Backoff, delay } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import type { IPAddr } from '../util/ip.js';
import { rateLimited, type Logger } from '../util/log.js';
import { VERSION } from '../version.js';
import { EventBatcher } from './batcher.js';
import { BlackholeRoutes } from './blackhole.js';
import { ipCommandView, selectExternalInterface, type IfaceOptions, type SystemView } from './iface.js';
import type { DaemonMetrics } from './metrics.js';
import { Peers } from './peers.js';
import { buildStatus, DaemonActivity, type StatusOptions, type StatusSnapshot } from './status.js';

export interface DaemonOptions {
  /** Interface flags; the address families come from the network config. */
  readonly iface: Omit<IfaceOptions, 'enableIPv4' | 'enableIPv6'>;
  readonly subnetFile: string;
  /** `--ip-blackhole-route`: a blackhole route for our own subnet(s), re-checked every rule resync. */
  readonly blackholeRoute?: boolean;
  /** Seconds between backend drift repairs; 0 disables. */
  readonly reconcileInterval: number;
}

export interface DaemonDeps {
  readonly manager: SubnetManager;
  readonly backends: BackendRegistry;
  /** Masquerade and forward rules; the daemon only starts it, tells it the lease and runs it. */
  readonly rules: RulesManager;
  readonly logger: Logger;
  readonly metrics: DaemonMetrics;
  readonly systemView?: SystemView;
  /** With --network-policy: where an ovs backend hosts the policy enforcer's flows. */
  readonly policyFlows?: PolicyFlowSection;
}

/** The daemon cannot go on; the message says why in one line. */
export class FatalError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FatalError';
  }
}

/** The rules manager's setup errors stop the daemon; anything else is unexpected and propagates as is. */
function fatalIfSetup(e: unknown): never {
  throw e instanceof RulesSetupError ? new FatalError(e.message) : e;
}

export class Daemon {
  private readyFlag = false;
  private lease: Lease | null = null;
  // For status(): what the loop knows that the metrics do not.
  private readonly activity = new DaemonActivity();
  private config: NetworkConfig | null = null;
  private backendType: string | null = null;
  private peers: Peers | null = null;
  /** Addresses of this node, listed at start and when our lease moves: no peer may claim one. */
  private localAddresses: readonly IPAddr[] = [];
  /** Refused kernel/OVS operations are retried sooner than the reconcile interval, with backoff. */
  private readonly retryBackoff = new Backoff(1000, 30_000);
  private retryPending = false;
  private wakeReconcile: (() => void) | null = null;
  private readonly blackholes = new BlackholeRoutes();

  constructor(
    private readonly opts: DaemonOptions,
    private readonly deps: DaemonDeps,
  ) {
    deps.rules.observe((outcome) => this.activity.rulePass(outcome));
  }

  get ready(): boolean {
    return this.readyFlag;
  }

  get currentLease(): Lease | null {
    return this.lease;
  }

  /** The snapshot served on /status. */
  status(opts: StatusOptions = {}): Promise<StatusSnapshot> {
    return buildStatus(
      {
        weftVersion: VERSION,
        subnetFile: this.opts.subnetFile,
        config: this.config,
        backendType: this.backendType,
        lease: this.lease,
        peers: this.peers?.accepted ?? [],
        rejected: this.peers?.rejections ?? [],
        masquerade: this.deps.rules.masquerading,
        forwardRules: this.deps.rules.forwardRules,
        rulesResync: this.deps.rules.resyncSeconds,
        reconcileInterval: this.opts.reconcileInterval,
        activity: this.activity,
      },
      this.deps.metrics,
      opts,
    );
  }

  /** Runs until `signal` aborts (resolves) or something fatal happens (rejects with FatalError). */
  async run(signal: AbortSignal): Promise<void> {
    const { logger: log, metrics, manager, rules } = this.deps;
    await this.checkSubnetFileWritable();
    await rules.init().catch(fatalIfSetup);
    const config = await this.fetchConfig(signal);
    this.config = config;
    const extIface = await this.selectInterface(config);
    log.info('using interface', {
      iface: extIface.name,
      ifaceAddr: String(extIface.ifaceAddr),
      publicIP: String(extIface.extAddr),
      publicIPv6: String(extIface.extV6Addr),
    });

    // Best effort: our lease as stored, so a rebuilt device can keep its VTEP MAC.
    const previousLease = extIface.extAddr ? await manager.findOwnLease(extIface.extAddr).catch(() => null) : null;
    let backend: Backend;
    try {
      backend = this.deps.backends.create(config.backend, {
        config,
        extIface,
        previousLease,
        metrics,
        logger: log.child({ backend: config.backend.type }),
        ...(this.deps.policyFlows ? { policyFlows: this.deps.policyFlows } : {}),
      });
    } catch (e) {
      throw new FatalError(errorMessage(e));
    }
    this.backendType = backend.type;
    // A backend that cannot set up its devices (OVS not running, ...) says why and stops us.
    const { attrs, mtu, subnetEnv } = await backend.prepare().catch((e: unknown) => {
      throw new FatalError(`backend ${backend.type}: ${errorMessage(e)}`);
    });

    this.localAddresses = await this.listLocalAddresses(extIface);
    const acquired = await this.retryStore('acquire', signal, () => manager.acquireLease(attrs, signal));
    this.lease = acquired.lease;
    metrics.leaseAcquisitions.inc({ how: acquired.how });
    this.setExpiry(acquired.lease);
    log.info('acquired lease', {
      subnet: String(acquired.lease.subnet),
      ipv6Subnet: String(acquired.lease.ipv6Subnet),
      how: acquired.how,
      lostRaces: acquired.retries,
    });
    await backend.start(acquired.lease);
    await this.writeSubnetFile(config, acquired.lease, mtu, subnetEnv);
    await rules.start(config, acquired.lease).catch(fatalIfSetup);
    await this.syncBlackhole(config);
    this.readyFlag = true;
    metrics.ready.set(1);

    const peers = new Peers({ config, backend, ownLease: () => this.lease, localAddresses: () => this.localAddresses, logger: log, metrics });
    this.peers = peers;
    const batcher = new EventBatcher();
    // What the backend has been handed so far. The timer's pass gives the backend this set, not the
    // gate's: events still waiting in the batcher are not the backend's yet, and a set that runs
    // ahead of its batches would look like divergence and force a full pass on every tick of a churn.
    const handed = new PeerSet();
    const onLease = (lease: Lease, how: AcquireHow) => {
      this.setExpiry(lease);
      if (how === 'renew') return;
      metrics.leaseAcquisitions.inc({ how });
      const old = this.lease;
      this.lease = lease;
      if (old && leaseId(old) === leaseId(lease)) {
        log.info('lease acquired again with the same subnet', { subnet: String(lease.subnet) });
        return;
      }
      // Pods already running keep addresses from the old subnet: say it loudly.
      log.error('lease acquired again with a DIFFERENT subnet; pods on this node need to be restarted', {
        old: old ? leaseId(old) : null,
        new: leaseId(lease),
      });
      // The old subnet may now be someone else's (that is usually why we moved): a peer. Every
      // check depends on our subnet, so every peer is checked again.
      void this.listLocalAddresses(extIface)
        .then((local) => {
          this.localAddresses = local;
          batcher.push(peers.recheck());
        })
        .then(() => backend.start(lease))
        .then(() => this.writeSubnetFile(config, lease, mtu, subnetEnv))
        .then(() => rules.leaseChanged(lease))
        .then(() => this.syncBlackhole(config))
        .catch((e: unknown) => log.error('applying the new lease failed', { error: errorMessage(e) }));
    };

    try {
      await Promise.all([
        manager.keepLease(acquired.lease, onLease, signal),
        this.receiveEvents(peers, batcher, signal),
        this.applyBatches(backend, handed, batcher, signal),
        this.reconcileLoop(backend, handed, signal),
        rules.run(signal),
        this.blackholeLoop(config, signal),
      ]);
    } finally {
      await backend.close();
    }
    log.info('stopped; lease, subnet file and dataplane left in place');
  }

  private async receiveEvents(peers: Peers, batcher: EventBatcher, signal: AbortSignal): Promise<void> {
    for await (const result of this.deps.manager.watchLeases(signal)) batcher.push(peers.apply(result));
  }

  private async applyBatches(backend: Backend, handed: PeerSet, batcher: EventBatcher, signal: AbortSignal) {
    const { metrics, logger: log } = this.deps;
    while (true) {
      const batch = await batcher.next(signal);
      if (!batch) return;
      const end = metrics.programmingDuration.startTimer();
      try {
        handed.apply(batch);
        this.passDone('apply', await backend.apply(batch));
        for (const ev of batch) metrics.eventsApplied.inc({ type: ev.type });
        metrics.batchesApplied.inc();
        log.debug('applied lease events', { events: batch.length });
      } catch (e) {
        // The periodic reconcile converges on the full set; nothing is lost by going on.
        this.activity.backendPass('apply', e as Error);
        log.error('backend failed to apply a batch; the next reconcile retries', { error: errorMessage(e) });
      } finally {
        end();
      }
    }
  }

  /** The timer's full pass; sooner, with backoff, while operations are being refused. */
  private async reconcileLoop(backend: Backend, handed: PeerSet, signal: AbortSignal): Promise<void> {
    const { metrics, logger: log } = this.deps;
    const interval = this.opts.reconcileInterval > 0 ? this.opts.reconcileInterval * 1000 : null;
    while (!signal.aborted) {
      const wait = this.retryPending ? Math.min(this.retryBackoff.next(), interval ?? Infinity) : interval;
      try {
        await new Promise<void>((resolve, reject) => {
          this.wakeReconcile = resolve;
          if (wait !== null) delay(wait, signal).then(resolve, reject);
          else signal.addEventListener('abort', () => reject(new AbortedError()), { once: true });
        });
      } catch {
        return;
      } finally {
        this.wakeReconcile = null;
      }
      const end = metrics.reconcileDuration.startTimer();
      try {
        this.passDone('reconcile', await backend.reconcile([...handed.values()]));
      } catch (e) {
        this.activity.backendPass('reconcile', e as Error);
        log.error('reconcile failed', { error: errorMessage(e) });
      } finally {
        end();
      }
    }
  }

  /** Records a pass; refused operations schedule a retry pass with backoff. */
  private passDone(kind: 'apply' | 'reconcile', pass: BackendPass): void {
    if (pass.failures === 0) {
      this.activity.backendPass(kind, null);
      this.retryPending = false;
      this.retryBackoff.reset();
      return;
    }
    this.deps.metrics.backendFailures.inc(pass.failures);
    this.activity.backendPass(kind, new Error(`${pass.failures} kernel/OVS operations refused; retrying with backoff`));
    const first = !this.retryPending;
    this.retryPending = true;
    if (first) this.wakeReconcile?.();
  }

  /** This node's addresses (every interface) and its public ones; a failure to list leaves the public ones. */
  private async listLocalAddresses(ext: ExternalInterface): Promise<IPAddr[]> {
    const own = [ext.extAddr, ext.extV6Addr, ext.ifaceAddr, ext.ifaceV6Addr].filter((a): a is IPAddr => a !== null);
    try {
      const links = await (this.deps.systemView ?? ipCommandView()).links();
      return [...own, ...links.flatMap((l) => l.addrs.map((a) => a.ip))];
    } catch (e) {
      this.deps.logger.warn('cannot list this node\'s addresses; peers are checked against its public addresses only', { error: errorMessage(e) });
      return own;
    }
  }

  /** `--ip-blackhole-route`: re-checked as often as the rules (`--iptables-resync`). */
  private async blackholeLoop(config: NetworkConfig, signal: AbortSignal): Promise<void> {
    const seconds = this.deps.rules.resyncSeconds;
    if (!this.opts.blackholeRoute || seconds <= 0) return;
    while (!signal.aborted) {
      try {
        await delay(seconds * 1000, signal);
      } catch {
        return;
      }
      await this.syncBlackhole(config);
    }
  }

  private async syncBlackhole(config: NetworkConfig): Promise<void> {
    const lease = this.lease;
    if (!this.opts.blackholeRoute || !lease) return;
    const subnets = ruleInputs(config, lease).map((f) => f.subnet);
    try {
      const { added, removed } = await this.blackholes.sync(subnets);
      if (added.length > 0 || removed.length > 0) this.deps.logger.info('blackhole routes for the own subnet', { added, removed });
    } catch (e) {
      this.deps.logger.error('blackhole route could not be set; retrying at the next resync', { error: errorMessage(e) });
    }
  }

  /** Fails before any lease is taken when the subnet file cannot be written. */
  private async checkSubnetFileWritable(): Promise<void> {
    const dir = dirname(this.opts.subnetFile);
    try {
      await mkdir(dir, { recursive: true, mode: 0o755 });
      await access(dir, constants.W_OK);
    } catch (e) {
      throw new FatalError(`cannot write subnet file ${this.opts.subnetFile}: ${errorMessage(e)}`);
    }
  }

  private async selectInterface(config: NetworkConfig): Promise<ExternalInterface> {
    const opts = { ...this.opts.iface, enableIPv4: config.enableIPv4, enableIPv6: config.enableIPv6 };
    try {
      return await selectExternalInterface(opts, this.deps.systemView);
    } catch (e) {
      throw new FatalError(`choosing the external interface: ${errorMessage(e)}`);
    }
  }

  /** Waits for the network config; an invalid one is fatal (nothing good comes of guessing). */
  private async fetchConfig(signal: AbortSignal): Promise<NetworkConfig> {
    const say = rateLimited(this.deps.logger, 30_000);
    while (true) {
      try {
        const cfg = await this.deps.manager.getNetworkConfig(signal);
        for (const w of cfg.warnings) this.deps.logger.warn(`network config: ${w}`);
        return cfg;
      } catch (e) {
        if (e instanceof ConfigError) throw new FatalError(`invalid network config: ${e.message}`);
        if (!(e instanceof ConfigNotFoundError)) this.deps.metrics.storeErrors.inc({ op: 'config' });
        // Each distinct reason once per interval: a new reason is news.
        say(`config ${reasonKey(e)}`, 'warn', 'waiting for the network config', { error: errorMessage(e) });
        await delay(1000, signal);
      }
    }
  }

  /** Retries what fails for store reasons; other errors are fatal. */
  private async retryStore<T>(op: 'acquire', signal: AbortSignal, fn: () => Promise<T>): Promise<T> {
    const backoff = new Backoff(1000, 30_000);
    const say = rateLimited(this.deps.logger, 30_000);
    while (true) {
      try {
        return await fn();
      } catch (e) {
        if (e instanceof AbortedError || signal.aborted) throw new AbortedError();
        if (!(e instanceof StoreUnavailableError)) throw new FatalError(`acquiring a lease: ${errorMessage(e)}`);
        this.deps.metrics.storeErrors.inc({ op });
        say(`${op} ${reasonKey(e)}`, 'warn', 'lease store unavailable; retrying', { error: errorMessage(e) });
        await backoff.wait(signal);
      }
    }
  }

  private async writeSubnetFile(
    config: NetworkConfig,
    lease: Lease,
    mtu: number,
    backendLines: Prepared['subnetEnv'],
  ): Promise<void> {
    try {
      await writeSubnetEnv(this.opts.subnetFile, {
        networks: config.enableIPv4 && config.network ? [config.network] : [],
        subnet: config.enableIPv4 ? lease.subnet : null,
        ipv6Networks: config.enableIPv6 && config.ipv6Network ? [config.ipv6Network] : [],
        ipv6Subnet: config.enableIPv6 ? lease.ipv6Subnet : null,
        mtu,
        ipMasq: this.deps.rules.masquerading,
        weft: { ...NO_WEFT_LINES, ...backendLines, ipMasqMode: this.deps.rules.subnetEnvMode },
      });
    } catch (e) {
      throw new FatalError(errorMessage(e));
    }
  }

  private setExpiry(lease: Lease): void {
    this.deps.metrics.leaseExpiry.set(lease.expiration ? lease.expiration.getTime() / 1000 : 0);
  }
}

/** An error's message without numbers (ports, timestamps), to rate-limit logs per kind of failure. */
function reasonKey(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).replace(/\d+/g, '#');
}
