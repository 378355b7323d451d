// weftd: the node daemon. Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot go on, 2 for bad flags.
import { defaultBackends } from '../backend/registry.js';
import { Daemon, FatalError } from '../network/daemon.js';
import { HealthServer } from '../network/http.js';
import { DaemonMetrics } from '../network/metrics.js';
import { readPreviousSubnets } from '../network/subnetenv.js';
import { EtcdSubnetManager } from '../subnet/etcd/manager.js';
import { AbortedError } from '../util/backoff.js';
import { createLogger } from '../util/log.js';
import { VERSION } from '../version.js';
import { buildParser, etcdConnectOptions, parseFlags } from './flags.js';

async function main(argv: string[]): Promise<number> {
  let flags: ReturnType<typeof parseFlags>;
  try {
    flags = parseFlags(argv);
  } catch (e) {
    process.stderr.write(`weftd: ${(e as Error).message}\n`);
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
  if (flags.kubeSubnetMgr) {
    logger.error('--kube-subnet-mgr is not available in this version of weftd; use the etcd subnet manager');
    return 1;
  }

  const backends = defaultBackends();
  const metrics = new DaemonMetrics();
  const previous = await readPreviousSubnets(flags.subnetFile).catch((e: Error) => {
    logger.warn('ignoring the previous subnet file', { error: e.message });
    return { subnet: null, ipv6Subnet: null };
  });
  let manager: EtcdSubnetManager;
  try {
    manager = new EtcdSubnetManager({
    ...etcdConnectOptions(flags),
    knownBackends: backends.types,
    logger: logger.child({ component: 'etcd' }),
    previous: { subnet: previous.subnet, ipv6Subnet: previous.ipv6Subnet },
    renewMarginSeconds: flags.subnetLeaseRenewMargin * 60,
    onStoreError: (op) => metrics.storeErrors.inc({ op }),
    });
  } catch (e) {
    process.stderr.write(`weftd: ${(e as Error).message}\n`);
    return 2;
  }
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
      ipMasq: flags.ipMasq,
      forwardRules: flags.iptablesForwardRules,
      fullyRandomDisable: flags.ipMasqFullyRandomDisable,
      rulesResync: flags.iptablesResync,
      blackholeRoute: flags.ipBlackholeRoute,
      reconcileInterval: flags.reconcileInterval,
    },
    { manager, backends, logger, metrics },
  );

  const stop = new AbortController();
  const onSignal = (sig: NodeJS.Signals) => {
    logger.info(`received ${sig}; stopping`);
    // A second signal kills the process, as with flanneld.
    process.off('SIGTERM', onSignal).off('SIGINT', onSignal);
    stop.abort();
  };
  process.on('SIGTERM', onSignal).on('SIGINT', onSignal);

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
