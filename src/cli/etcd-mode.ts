// weftd's etcd mode: the lease manager on etcd. Loaded only in etcd mode (weftd.ts imports it on
// demand), so a node in Kubernetes mode never loads the etcd client and gRPC.
import type { DaemonMetrics } from '../daemon/metrics.js';
import { readPreviousSubnets } from '../subnetenv/read.js';
import { EtcdSubnetManager } from '../subnet/etcd/manager.js';
import type { SubnetManager } from '../subnet/manager.js';
import type { Logger } from '../util/log.js';
import { etcdConnectOptions, type parseFlags } from './flags.js';

type Flags = ReturnType<typeof parseFlags>;

export async function etcdManager(flags: Flags, knownBackends: readonly string[], logger: Logger, metrics: DaemonMetrics): Promise<SubnetManager> {
  const previous = await readPreviousSubnets(flags.subnetFile).catch((e: Error) => {
    logger.warn('ignoring the previous subnet file', { error: e.message });
    return { subnet: null, ipv6Subnet: null };
  });
  return EtcdSubnetManager.connect({
    ...etcdConnectOptions(flags),
    knownBackends,
    logger: logger.child({ component: 'etcd' }),
    previous: { subnet: previous.subnet, ipv6Subnet: previous.ipv6Subnet },
    leaseTTLSeconds: flags.subnetLeaseTTL,
    renewMarginSeconds: flags.subnetLeaseRenewMarginSeconds,
    onStoreError: (op) => metrics.storeErrors.inc({ op }),
  });
}
