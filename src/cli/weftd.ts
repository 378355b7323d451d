// weftd: the node daemon. Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot go on, 2 for bad flags.
import { defaultBackends } from '../backend/registry.js';
import { Daemon, FatalError } from '../daemon/daemon.js';
import { HealthServer } from '../daemon/http.js';
import { DaemonMetrics } from '../daemon/metrics.js';
import { RulesManager } from '../ipmasq/manager.js';
import { readPreviousSubnets } from '../subnetenv/read.js';
import { EtcdSubnetManager } from '../subnet/etcd/manager.js';
import { KubeClient, KubeConfigError, loadKubeConfig, NodeNameError, resolveNodeName } from '../subnet/kube/client.js';
import { AnnotationValueError, storedPublicIPs } from '../subnet/kube/annotations.js';
import { KubeSubnetManager } from '../subnet/kube/manager.js';
import type { SubnetManager } from '../subnet/manager.js';
import type { Logger } from '../util/log.js';
import { AbortedError } from '../util/backoff.js';
import { createLogger } from '../util/log.js';
import { VERSION } from '../version.js';
import { buildParser, etcdConnectOptions, parseFlags } from './flags.js';
import { errorMessage } from '../util/errors.js';

type Flags = ReturnType<typeof parseFlags>;

async function etcdManager(flags: Flags, knownBackends: readonly string[], logger: Logger, metrics: DaemonMetrics): Promise<SubnetManager> {
  const previous = await readPreviousSubnets(flags.subnetFile).catch((e: Error) => {
    logger.warn('ignoring the previous subnet file', { error: e.message });
    return { subnet: null, ipv6Subnet: null };
  });
  return EtcdSubnetManager.connect({
    ...etcdConnectOptions(flags),
    knownBackends,
    logger: logger.child({ component: 'etcd' }),
    previous: { subnet: previous.subnet, ipv6Subnet: previous.ipv6Subnet },
    renewMarginSeconds: flags.subnetLeaseRenewMargin * 60,
    onStoreError: (op) => metrics.storeErrors.inc({ op }),
  });
}

/** Kubernetes mode: the node is NODE_NAME, else the node of POD_NAMESPACE/POD_NAME (as flanneld). */
async function kubeManager(flags: Flags, knownBackends: readonly string[], logger: Logger, metrics: DaemonMetrics): Promise<SubnetManager> {
  const connect = { ...(flags.kubeconfigFile ? { kubeconfigFile: flags.kubeconfigFile } : {}), ...(flags.kubeApiUrl ? { apiUrl: flags.kubeApiUrl } : {}) };
  const client = new KubeClient(loadKubeConfig(connect));
  const nodeName = await resolveNodeName(process.env, (ns, name) => client.getPodNodeName(ns, name));
  const manager = new KubeSubnetManager({
    ...connect,
    client,
    nodeName,
    netConfigPath: flags.netConfigPath,
    annotationPrefix: flags.kubeAnnotationPrefix,
    setNodeNetworkUnavailable: flags.setNodeNetworkUnavailable,
    knownBackends,
    logger: logger.child({ component: 'kube' }),
    onStoreError: (op) => metrics.storeErrors.inc({ op: op === 'acquire' || op === 'watch' || op === 'renew' ? op : 'config' }),
  });
  await adoptStoredPublicIPs(flags, manager, nodeName, logger);
  return manager;
}

/**
 * flannel's `node-public-ip` / `node-public-ipv6` annotations stand in for --public-ip /
 * --public-ipv6 when those are not given (they select the interface that owns the address).
 */
async function adoptStoredPublicIPs(flags: Flags, manager: KubeSubnetManager, nodeName: string, logger: Logger): Promise<void> {
  if (flags.publicIp && flags.publicIpv6) return;
  let node;
  try {
    node = await manager.client.getNode(nodeName);
  } catch {
    return; // the node may not exist yet; acquireLease waits for it and says so
  }
  const stored = storedPublicIPs(node, manager.names);
  if (!flags.publicIp && stored.v4) {
    flags.publicIp = String(stored.v4);
    logger.info('using the public IP from the node annotation', { annotation: manager.names.nodePublicIP, publicIP: flags.publicIp });
  }
  if (!flags.publicIpv6 && stored.v6) {
    flags.publicIpv6 = String(stored.v6);
    logger.info('using the public IPv6 from the node annotation', { annotation: manager.names.nodePublicIPv6, publicIPv6: flags.publicIpv6 });
  }
}

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
  try {
    manager = flags.kubeSubnetMgr ? await kubeManager(flags, backends.types, logger, metrics) : await etcdManager(flags, backends.types, logger, metrics);
  } catch (e) {
    if (e instanceof NodeNameError || e instanceof KubeConfigError || e instanceof AnnotationValueError) {
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
