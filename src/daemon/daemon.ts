// The daemon loop: interface → network config → backend → lease → subnet.env → peer events.
// Shutdown leaves the lease, subnet.env and every dataplane object in place.
import { access, constants, mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { Backend, BackendRegistry, Prepared } from '../backend/backend.js';
import { ConfigError, type NetworkConfig } from '../subnet/config.js';
import type { Lease } from '../subnet/lease.js';
import { leaseId } from '../subnet/lease.js';
import { ConfigNotFoundError, StoreUnavailableError, type AcquireHow, type SubnetManager } from '../subnet/manager.js';
import { LeaseWatcher } from '../subnet/watcher.js';
import { AbortedError, Backoff, delay } from '../util/backoff.js';
import { rateLimited, type Logger } from '../util/log.js';
import { EventBatcher } from './batcher.js';
import { selectExternalInterface, type ExternalInterface, type IfaceOptions, type SystemView } from './iface.js';
import type { DaemonMetrics } from './metrics.js';
import { writeSubnetEnv } from './subnetenv.js';
import { RuleKeeper, type Runner } from '../ipmasq/keeper.js';
import type { FamilyInput } from '../ipmasq/model.js';
import { describeAgentChange, defaultAgentConfig, loadAgentConfig, parseAgentConfig, type AgentConfig, type LoadedAgentConfig } from '../ipmasq/agent-config.js';
import { watchConfigFile, type FileState } from '../ipmasq/config-watch.js';
import { CommandError } from '../util/exec.js';
import { BlackholeRoutes } from './blackhole.js';
import { VERSION } from '../version.js';
import { buildStatus, DaemonActivity, type StatusOptions, type StatusSnapshot } from './status.js';

export interface DaemonOptions {
  /** Interface flags; the address families come from the network config. */
  readonly iface: Omit<IfaceOptions, 'enableIPv4' | 'enableIPv6'>;
  readonly subnetFile: string;
  readonly ipMasq: boolean;
  /**
   * `--ip-masq-config`: ip-masq-agent mode, configured by this YAML/JSON file and reloaded when it
   * changes. Exclusive with `ipMasq`.
   */
  readonly ipMasqConfig?: string;
  /** `--iptables-forward-rules`: accept rules for the cluster network in FORWARD. */
  readonly forwardRules: boolean;
  readonly fullyRandomDisable: boolean;
  /** Seconds between masquerade/forward rule checks (`--iptables-resync`); 0 disables. */
  readonly rulesResync: number;
  /** `--ip-blackhole-route`: a blackhole route for our own subnet(s), re-checked every resync. */
  readonly blackholeRoute?: boolean;
  /** Seconds between backend drift repairs; 0 disables. */
  readonly reconcileInterval: number;
}

export interface DaemonDeps {
  readonly manager: SubnetManager;
  readonly backends: BackendRegistry;
  readonly logger: Logger;
  readonly metrics: DaemonMetrics;
  readonly systemView?: SystemView;
  /** Runs iptables/nft; tests may inject one. */
  readonly ruleRunner?: Runner;
}

/** The daemon cannot go on; the message says why in one line. */
export class FatalError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FatalError';
  }
}

export class Daemon {
  private readyFlag = false;
  private lease: Lease | null = null;
  // For status(): what the loop knows that the metrics do not.
  private readonly activity = new DaemonActivity();
  private config: NetworkConfig | null = null;
  private backendType: string | null = null;
  private watcher: LeaseWatcher | null = null;
  private readonly blackholes = new BlackholeRoutes();

  constructor(
    private readonly opts: DaemonOptions,
    private readonly deps: DaemonDeps,
  ) {}

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
        peers: this.watcher?.peers ?? [],
        masquerade: this.masquerading,
        forwardRules: this.opts.forwardRules,
        rulesResync: this.opts.rulesResync,
        reconcileInterval: this.opts.reconcileInterval,
        activity: this.activity,
      },
      this.deps.metrics,
      opts,
    );
  }

  /** weft masquerades pod traffic itself (either mode): subnet.env tells the CNI plugin to leave the bridge's ipMasq off. */
  private get masquerading(): boolean {
    return this.opts.ipMasq || Boolean(this.opts.ipMasqConfig);
  }

  /** Runs until `signal` aborts (resolves) or something fatal happens (rejects with FatalError). */
  async run(signal: AbortSignal): Promise<void> {
    const { logger: log, metrics, manager } = this.deps;
    await this.checkSubnetFileWritable();
    const agentConfig = await this.loadAgentConfig();
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
      });
    } catch (e) {
      throw new FatalError((e as Error).message);
    }
    this.backendType = backend.type;
    // A backend that cannot set up its devices (OVS not running, ...) says why and stops us.
    const { attrs, mtu, subnetEnv } = await backend.prepare().catch((e: Error) => {
      throw new FatalError(`backend ${backend.type}: ${e.message}`);
    });

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
    const rules = this.ruleKeeper(config, agentConfig?.config ?? null);
    rules.setInput(ruleInputs(config, acquired.lease));
    await this.syncRules(rules, true);
    await this.syncBlackhole(config);
    this.readyFlag = true;
    metrics.ready.set(1);

    const watcher = new LeaseWatcher(() => this.lease);
    this.watcher = watcher;
    const batcher = new EventBatcher();
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
      // The old subnet may now be someone else's (that is usually why we moved): a peer.
      batcher.push(watcher.apply({ kind: 'events', events: [] }));
      rules.setInput(ruleInputs(config, lease));
      void backend
        .start(lease)
        .then(() => this.writeSubnetFile(config, lease, mtu, subnetEnv))
        .then(() => this.syncRules(rules, false))
        .then(() => this.syncBlackhole(config))
        .catch((e: Error) => log.error('applying the new lease failed', { error: e.message }));
    };

    try {
      await Promise.all([
        manager.keepLease(acquired.lease, onLease, signal),
        this.receiveEvents(watcher, batcher, signal),
        this.applyBatches(backend, watcher, batcher, signal),
        this.reconcileLoop(backend, watcher, signal),
        this.rulesLoop(rules, config, signal),
        this.agentConfigLoop(rules, agentConfig, signal),
      ]);
    } finally {
      await backend.close();
    }
    log.info('stopped; lease, subnet file and dataplane left in place');
  }

  private async receiveEvents(watcher: LeaseWatcher, batcher: EventBatcher, signal: AbortSignal): Promise<void> {
    for await (const result of this.deps.manager.watchLeases(signal)) {
      const events = watcher.apply(result);
      for (const ev of events) this.deps.metrics.eventsReceived.inc({ type: ev.type });
      this.deps.metrics.peers.set(watcher.peers.length);
      batcher.push(events);
    }
  }

  private async applyBatches(backend: Backend, watcher: LeaseWatcher, batcher: EventBatcher, signal: AbortSignal) {
    const { metrics, logger: log } = this.deps;
    while (true) {
      const batch = await batcher.next(signal);
      if (!batch) return;
      const end = metrics.programmingDuration.startTimer();
      try {
        await backend.apply(batch, watcher.peers);
        this.activity.backendPass('apply', null);
        for (const ev of batch) metrics.eventsApplied.inc({ type: ev.type });
        metrics.batchesApplied.inc();
        log.debug('applied lease events', { events: batch.length, peers: watcher.peers.length });
      } catch (e) {
        // The periodic reconcile converges on the full set; nothing is lost by going on.
        this.activity.backendPass('apply', e as Error);
        log.error('backend failed to apply a batch; the next reconcile retries', { error: (e as Error).message });
      } finally {
        end();
      }
    }
  }

  private async reconcileLoop(backend: Backend, watcher: LeaseWatcher, signal: AbortSignal): Promise<void> {
    if (this.opts.reconcileInterval <= 0) return;
    const { metrics, logger: log } = this.deps;
    while (!signal.aborted) {
      try {
        await delay(this.opts.reconcileInterval * 1000, signal);
      } catch {
        return;
      }
      const end = metrics.reconcileDuration.startTimer();
      try {
        await backend.reconcile(watcher.peers);
        this.activity.backendPass('reconcile', null);
      } catch (e) {
        this.activity.backendPass('reconcile', e as Error);
        log.error('reconcile failed', { error: (e as Error).message });
      } finally {
        end();
      }
    }
  }

  private ruleKeeper(config: NetworkConfig, agent: AgentConfig | null): RuleKeeper {
    const mode = config.enableNFTables ? 'nftables' : 'iptables';
    return new RuleKeeper({
      mode,
      masq: this.opts.ipMasq,
      agent,
      forward: this.opts.forwardRules,
      fullyRandomDisable: this.opts.fullyRandomDisable,
      logger: this.deps.logger.child({ component: mode }),
      metrics: this.deps.metrics,
      ...(this.deps.ruleRunner ? { runner: this.deps.ruleRunner } : {}),
    });
  }

  /** One rule pass; a missing iptables/nft program at start is fatal, anything else is retried by the loop. */
  private async syncRules(rules: RuleKeeper, atStart: boolean): Promise<void> {
    try {
      this.activity.rulePass(await rules.reconcile());
      this.deps.metrics.ruleChecks.inc();
    } catch (e) {
      this.activity.rulePass(e as Error);
      if (atStart && e instanceof CommandError && e.notFound) {
        throw new FatalError(`masquerade/forward rules: ${e.command} not found; install it, or run without --ip-masq/--ip-masq-config and with --iptables-forward-rules=false`);
      }
      this.deps.metrics.recordRuleError();
      this.deps.logger.error('masquerade/forward rules could not be applied; retrying at the next resync', { error: (e as Error).message });
    }
  }

  private async rulesLoop(rules: RuleKeeper, config: NetworkConfig, signal: AbortSignal): Promise<void> {
    if (this.opts.rulesResync <= 0) return;
    while (!signal.aborted) {
      try {
        await delay(this.opts.rulesResync * 1000, signal);
      } catch {
        return;
      }
      await this.syncRules(rules, false);
      await this.syncBlackhole(config);
    }
  }

  /**
   * ip-masq-agent mode: the config at start. A missing file means ip-masq-agent's defaults; an
   * invalid one is fatal, like an invalid network config (at run time it only keeps the old rules).
   */
  private async loadAgentConfig(): Promise<LoadedAgentConfig | null> {
    const path = this.opts.ipMasqConfig;
    if (!path) return null;
    if (this.opts.ipMasq) throw new FatalError('--ip-masq and --ip-masq-config are exclusive');
    let loaded: LoadedAgentConfig;
    try {
      loaded = await loadAgentConfig(path);
    } catch (e) {
      throw new FatalError(`invalid ip-masq config: ${(e as Error).message}`);
    }
    const log = this.deps.logger.child({ component: 'ip-masq-config' });
    for (const w of loaded.warnings) log.warn(`ip-masq config: ${w}`, { path });
    log.info(loaded.text === null ? 'no ip-masq config file; using the ip-masq-agent defaults' : 'loaded the ip-masq config', {
      path,
      nonMasqueradeCIDRs: loaded.config.nonMasqueradeCIDRs.map(String),
      masqLinkLocal: loaded.config.masqLinkLocal,
      masqLinkLocalIPv6: loaded.config.masqLinkLocalIPv6,
    });
    this.deps.metrics.recordConfigLoaded();
    return loaded;
  }

  /** ip-masq-agent mode: applies every change of the config file without a restart; a bad one keeps the rules. */
  private async agentConfigLoop(rules: RuleKeeper, start: LoadedAgentConfig | null, signal: AbortSignal): Promise<void> {
    const path = this.opts.ipMasqConfig;
    if (!path || !start) return;
    const { metrics } = this.deps;
    const log = this.deps.logger.child({ component: 'ip-masq-config' });
    let current = start.config;
    const onChange = async (state: FileState): Promise<void> => {
      let next: AgentConfig;
      try {
        if (state.kind === 'error') throw state.error;
        const parsed = state.kind === 'missing' ? { config: defaultAgentConfig(), warnings: [] } : parseAgentConfig(state.text, path);
        for (const w of parsed.warnings) log.warn(`ip-masq config: ${w}`, { path });
        next = parsed.config;
      } catch (e) {
        metrics.recordConfigReload('error');
        log.error('ip-masq config not applied; the previous rules stay', { path, error: (e as Error).message });
        return;
      }
      const changes = describeAgentChange(current, next);
      current = next;
      metrics.recordConfigReload('applied');
      log.info(state.kind === 'missing' ? 'ip-masq config file removed; using the ip-masq-agent defaults' : 'reloaded the ip-masq config', { path, changes });
      rules.setAgent(next);
      await this.syncRules(rules, false);
    };
    await watchConfigFile(path, {
      signal,
      initial: start.text,
      onChange,
      // ip-masq-agent's resyncInterval is how often it re-reads the file; here it is the safety net under the watch.
      pollIntervalMs: () => Math.max(1000, current.resyncIntervalMs),
      onWatchError: (dir, e) => log.warn('cannot watch the ip-masq config directory; re-reading it periodically', { dir, error: e.message }),
    });
  }

  private async syncBlackhole(config: NetworkConfig): Promise<void> {
    const lease = this.lease;
    if (!this.opts.blackholeRoute || !lease) return;
    const subnets = ruleInputs(config, lease).map((f) => f.subnet);
    try {
      const { added, removed } = await this.blackholes.sync(subnets);
      if (added.length > 0 || removed.length > 0) this.deps.logger.info('blackhole routes for the own subnet', { added, removed });
    } catch (e) {
      this.deps.logger.error('blackhole route could not be set; retrying at the next resync', { error: (e as Error).message });
    }
  }

  /** Fails before any lease is taken when the subnet file cannot be written. */
  private async checkSubnetFileWritable(): Promise<void> {
    const dir = dirname(this.opts.subnetFile);
    try {
      await mkdir(dir, { recursive: true, mode: 0o755 });
      await access(dir, constants.W_OK);
    } catch (e) {
      throw new FatalError(`cannot write subnet file ${this.opts.subnetFile}: ${(e as Error).message}`);
    }
  }

  private async selectInterface(config: NetworkConfig): Promise<ExternalInterface> {
    const opts = { ...this.opts.iface, enableIPv4: config.enableIPv4, enableIPv6: config.enableIPv6 };
    try {
      return await selectExternalInterface(opts, this.deps.systemView);
    } catch (e) {
      throw new FatalError(`choosing the external interface: ${(e as Error).message}`);
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
        say(`config ${reasonKey(e)}`, 'warn', 'waiting for the network config', { error: (e as Error).message });
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
        if (!(e instanceof StoreUnavailableError)) throw new FatalError(`acquiring a lease: ${(e as Error).message}`);
        this.deps.metrics.storeErrors.inc({ op });
        say(`${op} ${reasonKey(e)}`, 'warn', 'lease store unavailable; retrying', { error: (e as Error).message });
        await backoff.wait(signal);
      }
    }
  }

  private async writeSubnetFile(
    config: NetworkConfig,
    lease: Lease,
    mtu: number,
    extra: Prepared['subnetEnv'],
  ): Promise<void> {
    try {
      await writeSubnetEnv(this.opts.subnetFile, {
        network: config.enableIPv4 ? config.network : null,
        subnet: config.enableIPv4 ? lease.subnet : null,
        ipv6Network: config.enableIPv6 ? config.ipv6Network : null,
        ipv6Subnet: config.enableIPv6 ? lease.ipv6Subnet : null,
        mtu,
        ipMasq: this.masquerading,
        // Which of weft's masquerade modes made FLANNEL_IPMASQ true (weft trace reads it).
        extra: [...(extra ?? []), ...(this.opts.ipMasqConfig ? [['WEFT_IPMASQ', 'agent'] as const] : [])],
      });
    } catch (e) {
      throw new FatalError((e as Error).message);
    }
  }

  private setExpiry(lease: Lease): void {
    this.deps.metrics.leaseExpiry.set(lease.expiration ? lease.expiration.getTime() / 1000 : 0);
  }
}

/** The rule model's inputs: per enabled family, the cluster network and our subnet. */
function ruleInputs(config: NetworkConfig, lease: Lease): FamilyInput[] {
  const out: FamilyInput[] = [];
  if (config.enableIPv4 && config.network && lease.subnet) out.push({ network: config.network, subnet: lease.subnet });
  if (config.enableIPv6 && config.ipv6Network && lease.ipv6Subnet) out.push({ network: config.ipv6Network, subnet: lease.ipv6Subnet });
  return out;
}

/** An error's message without numbers (ports, timestamps), to rate-limit logs per kind of failure. */
function reasonKey(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).replace(/\d+/g, '#');
}
