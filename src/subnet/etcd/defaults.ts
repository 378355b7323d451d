// flannel's etcd defaults, apart from the client: the flag parsers need them without loading
// etcd3 and gRPC (a node in Kubernetes mode never does).
export const DEFAULT_ETCD_PREFIX = '/coreos.com/network';
export const DEFAULT_ETCD_ENDPOINTS = ['http://127.0.0.1:4001', 'http://127.0.0.1:2379'];
/** flannel's fixed subnet lease TTL. */
export const DEFAULT_LEASE_TTL_SECONDS = 24 * 3600;
