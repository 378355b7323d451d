// The one entry point of the masquerade/forward rules (flannel's trafficmngr.TrafficManager): the
// daemon builds a RulesManager from its flags, starts it with the network config and the first
// lease, tells it when the lease changes and lets it run. Everything else — which implementation
// (iptables or nftables), which masquerade mode (flannel's --ip-masq or ip-masq-agent's
// --ip-masq-config), the config file's load, watch and live reload, the periodic resync and the
// metrics — stays behind it.
import type { NetworkConfig } from '../subnet/config.js';
import type { Lease } from '../subnet/lease.js';
import { AbortedError, delay } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import { CommandError } from '../util/exec.js';
import type { Logger } from '../util/log.js';
import {
  defaultAgentConfig,
  describeAgentChange,
  loadAgentConfig,
  parseAgentConfig,
  type AgentConfig,
  type AgentConfigMetrics,
  type LoadedAgentConfig,
} from './agent-config.js';
import { watchConfigFile, type FileState } from './config-watch.js';
import { RuleKeeper, type IpMasqMetrics, type PassResult, type RulesMode, type Runner } from './keeper.js';
import type { FamilyInput } from './model.js';

export interface RulesMetrics extends IpMasqMetrics, AgentConfigMetrics {
  /** A pass ran (each reads the rules back). */
  recordRuleCheck(): void;
  /** The ip-masq config was loaded at start. */
  recordConfigLoaded(): void;
}

export interface RulesManagerOptions {
  /** `--ip-masq`: flannel's masquerade rules. */
  readonly ipMasq: boolean;
  /** `--ip-masq-config`: ip-masq-agent mode, configured by this YAML/JSON file and reloaded when it changes. Exclusive with `ipMasq`. */
  readonly ipMasqConfig?: string;
  /** `--iptables-forward-rules`: accept rules for the cluster network in FORWARD. */
  readonly forwardRules: boolean;
  /** `--ip-masq-fully-random-disable`. */
  readonly fullyRandomDisable: boolean;
  /** Seconds between rule checks (`--iptables-resync`); 0 disables. */
  readonly resyncSeconds: number;
  readonly logger: Logger;
  readonly metrics: RulesMetrics;
  /** Runs iptables/nft; tests may inject one. */
  readonly runner?: Runner;
}

/** The rules cannot be set up at all: the daemon must not go on. The message says why in one line. */
export class RulesSetupError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RulesSetupError';
  }
}

/** The rule model's inputs: per enabled family, the cluster network and our subnet. */
export function ruleInputs(config: NetworkConfig, lease: Lease): FamilyInput[] {
  const out: FamilyInput[] = [];
  if (config.enableIPv4 && config.network && lease.subnet) out.push({ network: config.network, subnet: lease.subnet });
  if (config.enableIPv6 && config.ipv6Network && lease.ipv6Subnet) out.push({ network: config.ipv6Network, subnet: lease.ipv6Subnet });
  return out;
}

export class RulesManager {
  private agentStart: LoadedAgentConfig | null = null;
  private keeper: RuleKeeper | null = null;
  private config: NetworkConfig | null = null;
  private readonly observers: Array<(outcome: PassResult | Error) => void> = [];

  constructor(private readonly opts: RulesManagerOptions) {}

  /** `listener` is told the outcome of every pass (the daemon's status). */
  observe(listener: (outcome: PassResult | Error) => void): void {
    this.observers.push(listener);
  }

  /** weft masquerades pod traffic itself (either mode): subnet.env tells the CNI plugin to leave the bridge's ipMasq off. */
  get masquerading(): boolean {
    return this.opts.ipMasq || Boolean(this.opts.ipMasqConfig);
  }

  /** subnet.env's WEFT_IPMASQ: which of weft's masquerade modes made FLANNEL_IPMASQ true (weft trace reads it). */
  get subnetEnvMode(): 'agent' | null {
    return this.opts.ipMasqConfig ? 'agent' : null;
  }

  get forwardRules(): boolean {
    return this.opts.forwardRules;
  }

  get resyncSeconds(): number {
    return this.opts.resyncSeconds;
  }

  /** The implementation in use once started. */
  get mode(): RulesMode | null {
    return this.config ? modeOf(this.config) : null;
  }

  /**
   * Before anything is touched: the ip-masq-agent config file. A missing file means
   * ip-masq-agent's defaults; an invalid one is fatal, like an invalid network config (at run
   * time it only keeps the old rules).
   */
  async init(): Promise<void> {
    const path = this.opts.ipMasqConfig;
    if (!path) return;
    if (this.opts.ipMasq) throw new RulesSetupError('--ip-masq and --ip-masq-config are exclusive');
    let loaded: LoadedAgentConfig;
    try {
      loaded = await loadAgentConfig(path);
    } catch (e) {
      throw new RulesSetupError(`invalid ip-masq config: ${errorMessage(e)}`);
    }
    const log = this.configLogger();
    for (const w of loaded.warnings) log.warn(`ip-masq config: ${w}`, { path });
    log.info(loaded.text === null ? 'no ip-masq config file; using the ip-masq-agent defaults' : 'loaded the ip-masq config', {
      path,
      nonMasqueradeCIDRs: loaded.config.nonMasqueradeCIDRs.map(String),
      masqLinkLocal: loaded.config.masqLinkLocal,
      masqLinkLocalIPv6: loaded.config.masqLinkLocalIPv6,
    });
    this.opts.metrics.recordConfigLoaded();
    this.agentStart = loaded;
  }

  /** The first pass, with the network config and our first lease. A missing iptables/nft program is fatal. */
  async start(config: NetworkConfig, lease: Lease): Promise<void> {
    const mode = modeOf(config);
    this.config = config;
    this.keeper = new RuleKeeper({
      mode,
      masq: this.opts.ipMasq,
      agent: this.agentStart?.config ?? null,
      forward: this.opts.forwardRules,
      fullyRandomDisable: this.opts.fullyRandomDisable,
      logger: this.opts.logger.child({ component: mode }),
      metrics: this.opts.metrics,
      ...(this.opts.runner ? { runner: this.opts.runner } : {}),
    });
    this.keeper.setInput(ruleInputs(config, lease));
    await this.sync(true);
  }

  /** Our lease moved to another subnet: the rules follow it now. */
  async leaseChanged(lease: Lease): Promise<void> {
    if (!this.keeper || !this.config) return;
    this.keeper.setInput(ruleInputs(this.config, lease));
    await this.sync(false);
  }

  /** The resync timer and the config file watch, until `signal` aborts. Never rejects but for an abort. */
  async run(signal: AbortSignal): Promise<void> {
    await Promise.all([this.resyncLoop(signal), this.agentConfigLoop(signal)]);
  }

  /** One pass; anything but a missing program at start is logged and retried by the resync. */
  private async sync(atStart: boolean): Promise<void> {
    const keeper = this.keeper;
    if (!keeper) return;
    try {
      const result = await keeper.reconcile();
      for (const o of this.observers) o(result);
      this.opts.metrics.recordRuleCheck();
    } catch (e) {
      const err = e instanceof Error ? e : new Error(errorMessage(e));
      for (const o of this.observers) o(err);
      if (atStart && e instanceof CommandError && e.notFound) {
        throw new RulesSetupError(`masquerade/forward rules: ${e.command} not found; install it, or run without --ip-masq/--ip-masq-config and with --iptables-forward-rules=false`);
      }
      this.opts.metrics.recordRuleError();
      this.opts.logger.error('masquerade/forward rules could not be applied; retrying at the next resync', { error: err.message });
    }
  }

  private async resyncLoop(signal: AbortSignal): Promise<void> {
    if (this.opts.resyncSeconds <= 0) return;
    while (!signal.aborted) {
      try {
        await delay(this.opts.resyncSeconds * 1000, signal);
      } catch (e) {
        if (e instanceof AbortedError) return;
        throw e;
      }
      await this.sync(false);
    }
  }

  /** ip-masq-agent mode: applies every change of the config file without a restart; a bad one keeps the rules. */
  private async agentConfigLoop(signal: AbortSignal): Promise<void> {
    const path = this.opts.ipMasqConfig;
    const start = this.agentStart;
    if (!path || !start) return;
    const { metrics } = this.opts;
    const log = this.configLogger();
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
        log.error('ip-masq config not applied; the previous rules stay', { path, error: errorMessage(e) });
        return;
      }
      const changes = describeAgentChange(current, next);
      current = next;
      metrics.recordConfigReload('applied');
      log.info(state.kind === 'missing' ? 'ip-masq config file removed; using the ip-masq-agent defaults' : 'reloaded the ip-masq config', { path, changes });
      this.keeper?.setAgent(next);
      await this.sync(false);
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

  private configLogger(): Logger {
    return this.opts.logger.child({ component: 'ip-masq-config' });
  }
}

function modeOf(config: NetworkConfig): RulesMode {
  return config.enableNFTables ? 'nftables' : 'iptables';
}
