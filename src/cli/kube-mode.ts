// weftd's Kubernetes mode: the lease manager on Node annotations. Loaded only in Kubernetes mode
// (weftd.ts imports it on demand): @kubernetes/client-node alone is ~60 MB of RSS, which a node
// in etcd mode has no use for.
import type { DaemonMetrics } from '../daemon/metrics.js';
import { KubeClient, KubeConfigError, loadKubeConfig, NodeNameError, resolveNodeName } from '../subnet/kube/client.js';
import { AnnotationValueError, storedPublicIPs } from '../subnet/kube/annotations.js';
import { KubeSubnetManager } from '../subnet/kube/manager.js';
import type { SubnetManager } from '../subnet/manager.js';
import type { PolicyEnforcer } from '../policy/enforcer.js';
import type { Logger } from '../util/log.js';
import type { parseFlags } from './flags.js';

type Flags = ReturnType<typeof parseFlags>;

/** The set-up errors that end weftd with status 1 and a one-line log. */
export function isKubeSetupError(e: unknown): e is Error {
  return e instanceof NodeNameError || e instanceof KubeConfigError || e instanceof AnnotationValueError;
}

/**
 * Kubernetes mode: the node is NODE_NAME, else the node of POD_NAMESPACE/POD_NAME (as flanneld).
 * With --network-policy, also the NetworkPolicy enforcer on the same API client.
 */
export async function kubeManager(
  flags: Flags,
  knownBackends: readonly string[],
  logger: Logger,
  metrics: DaemonMetrics,
): Promise<{ manager: SubnetManager; policy: PolicyEnforcer | null }> {
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
  const policy = flags.networkPolicy
    ? new (await import('../policy/enforcer.js')).PolicyEnforcer({
        client,
        nodeName,
        logger: logger.child({ component: 'netpol' }),
        resyncSeconds: flags.iptablesResync,
        networkConfig: () => manager.getNetworkConfig(),
        logDrops: flags.networkPolicyLog,
        serviceCIDRs: flags.serviceCidrs,
        metrics,
      })
    : null;
  return { manager, policy };
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
