// weftd: the node daemon. Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot go on, 2 for bad flags.
import { defaultBackends } from '../backend/registry.js';
import { Daemon, FatalError } from '../daemon/daemon.js';
import { HealthServer } from '../daemon/http.js';
import { DaemonMetrics } from '../daemon/metrics.js';
import { RulesManager } from '../ipmasq/manager.js';
import type { SubnetManager } from '../subnet/manager.js';
import { AbortedError } from '../util/backoff.js';
import { createLogger } from '../util/log.js';
import { VERSION } from '../version.js';
import { buildParser, parseFlags } from './flags.js';
import { errorMessage } from '../util/errors.js';

async function main(argv: string[]): Promise<number> {
  let flags: ReturnType<typeof parseFlags>;
  try {
    flags = parseFlags(argv);
  } catch (e) {
    process.stderr.write(`weftd: ${errorMessage(e)}\n`);
    return 2;
  }
  if (flags.help) {
    process.stdout.write(`${await buildParser([]).getHelp()}\n`);
    return 0;
  }
  if (flags.version) {
    process.stdout.write(`${VERSION}\n`);
    return 0;
  }
  const logger = createLogger({ format: flags.logFormat, level: flags.logLevel });

  const backends = defaultBackends();
  const metrics = new DaemonMetrics();
  let manager: SubnetManager;
  let kubeSetupError = (_e: unknown): _e is Error => false;
  try {
    // Each mode's client library is loaded only when that mode runs.
    if (flags.kubeSubnetMgr) {
      const kube = await import('./kube-mode.js');
      kubeSetupError = kube.isKubeSetupError;
      manager = await kube.kubeManager(flags, backends.types, logger, metrics);
    } else {
      manager = await (await import('./etcd-mode.js')).etcdManager(flags, backends.types, logger, metrics);
    }
  } catch (e) {
    if (kubeSetupError(e)) {
      logger.error(e.message);
      return 1;
    }
    process.stderr.write(`weftd: ${errorMessage(e)}\n`);
    return 2;
  }
  const rules = new RulesManager({
    ipMasq: flags.ipMasq,
    ...(flags.ipMasqConfig ? { ipMasqConfig: flags.ipMasqConfig } : {}),
    forwardRules: flags.iptablesForwardRules,
    fullyRandomDisable: flags.ipMasqFullyRandomDisable,
    resyncSeconds: flags.iptablesResync,
    logger,
    metrics,
  });
  const daemon = new Daemon(
    {
      iface: {
        iface: flags.iface,
        ifaceRegex: flags.ifaceRegex,
        ifaceCanReach: flags.ifaceCanReach || undefined,
        publicIP: flags.publicIp || undefined,
        publicIPv6: flags.publicIpv6 || undefined,
      },
      subnetFile: flags.subnetFile,
      blackholeRoute: flags.ipBlackholeRoute,
      reconcileInterval: flags.reconcileInterval,
    },
    { manager, backends, rules, logger, metrics },
  );

  const stop = new AbortController();
  const onSignal = (sig: NodeJS.Signals) => {
    logger.info(`received ${sig}; stopping`);
    // A second signal kills the process, as with flanneld.
    process.off('SIGTERM', onSignal).off('SIGINT', onSignal);
    stop.abort();
  };
  process.on('SIGTERM', onSignal).on('SIGINT', onSignal);
  // etcd3 1.1.2 throws from a gRPC stream handler when a watch response arrives for a watcher
  // already cancelled — which happens when we stop while a watch is being created. Harmless
  // once we are stopping; anything else still ends the process as Node would (exit status 1).
  process.on('uncaughtException', (e: Error) => {
    if (stop.signal.aborted && /Failed to find watcher for IWatchResponse/.test(e.message)) {
      logger.debug('ignored a late etcd watch response during shutdown', { error: e.message });
      return;
    }
    logger.error(`unexpected error: ${e.stack ?? String(e)}`);
    process.exit(1);
  });

  let health: HealthServer | null = null;
  let code = 0;
  try {
    if (flags.healthzPort > 0) {
      health = new HealthServer({
        host: flags.healthzIp,
        port: flags.healthzPort,
        isReady: () => daemon.ready,
        status: (opts) => daemon.status(opts),
        metrics,
        logger,
      });
      const addr = await health.start();
      logger.info('serving /healthz, /readyz and /metrics', { address: `${addr.host}:${addr.port}` });
    }
    logger.info('starting weftd', { version: VERSION, etcdEndpoints: flags.etcdEndpoints.join(','), prefix: flags.etcdPrefix });
    await daemon.run(stop.signal);
  } catch (e) {
    if (!(e instanceof AbortedError && stop.signal.aborted)) {
      logger.error(e instanceof FatalError ? e.message : `unexpected error: ${(e as Error).stack ?? String(e)}`);
      code = 1;
    }
  } finally {
    stop.abort();
    await health?.stop();
    await manager.close();
  }
  return code;
}

process.exitCode = await main(process.argv.slice(2));
// gRPC keeps timers alive for a while after close; do not wait for them.
setImmediate(() => process.exit());
