// weftd: the node daemon. Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot go on, 2 for bad flags.
import { defaultBackends } from '../backend/registry.js';
import { CniServer } from '../cniserver/server.js';
import { Daemon, FatalError } from '../daemon/daemon.js';
import { HealthServer } from '../daemon/http.js';
import { DaemonMetrics } from '../daemon/metrics.js';
import { cniServerStatus } from '../daemon/status.js';
import { RulesManager } from '../ipmasq/manager.js';
import type { PolicyEnforcer } from '../policy/enforcer.js';
import { answerPolicyQuery } from '../policy/explain.js';
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
  let policy: PolicyEnforcer | null = null;
  let kubeSetupError = (_e: unknown): _e is Error => false;
  try {
    // Each mode's client library is loaded only when that mode runs.
    if (flags.kubeSubnetMgr) {
      const kube = await import('./kube-mode.js');
      kubeSetupError = kube.isKubeSetupError;
      ({ manager, policy } = await kube.kubeManager(flags, backends.types, logger, metrics));
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
    { manager, backends, rules, logger, metrics, ...(policy ? { policyFlows: policy.flowSection } : {}) },
  );

  // Ready: the lease held and subnet.env written, and with --network-policy the whole rule set
  // programmed once — so no pod is set up before its policy can be in place.
  const ready = (): boolean => daemon.ready && (policy?.ready ?? true);
  // The CNI server: plugin requests forwarded by the native client, run in its plugin process. ADD
  // waits for readiness.
  const cniServer = flags.cniSocket
    ? new CniServer({
        socketPath: flags.cniSocket,
        logger: logger.child({ component: 'cni-server' }),
        metrics,
        isReady: ready,
        // With --network-policy an ADD is answered once the pod's rules are in the table.
        ...(policy ? { podHooks: policy } : {}),
      })
    : null;

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
        isReady: ready,
        status: async (opts) => ({ ...(await daemon.status(opts)), cniServer: await cniServerStatus(cniServer?.state() ?? null, metrics) }),
        ...(policy ? { policy: (q: URLSearchParams) => answerPolicyQuery(q, (src, dst, proto, port) => policy.explain(src, dst, proto, port)) } : {}),
        metrics,
        logger,
      });
      const addr = await health.start();
      logger.info('serving /healthz, /readyz and /metrics', { address: `${addr.host}:${addr.port}` });
    }
    // Before the lease: an ADD that comes early waits for readiness instead of failing.
    await cniServer?.start();
    logger.info('starting weftd', { version: VERSION, etcdEndpoints: flags.etcdEndpoints.join(','), prefix: flags.etcdPrefix });
    // NetworkPolicy runs beside the daemon's loop; a failure of it ends weftd like one of the loop's.
    const policyRun = policy?.run(stop.signal).catch((e: unknown) => {
      stop.abort();
      throw e;
    });
    await Promise.all([daemon.run(stop.signal).finally(() => stop.abort()), policyRun]);
  } catch (e) {
    if (!(e instanceof AbortedError && stop.signal.aborted)) {
      logger.error(e instanceof FatalError ? e.message : `unexpected error: ${(e as Error).stack ?? String(e)}`);
      code = 1;
    }
  } finally {
    stop.abort();
    await cniServer?.stop();
    await health?.stop();
    await manager.close();
  }
  return code;
}

process.exitCode = await main(process.argv.slice(2));
// gRPC keeps timers alive for a while after close; do not wait for them.
setImmediate(() => process.exit());
