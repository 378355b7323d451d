// weftd's command line: flanneld's flags with flanneld's names and defaults, FLANNELD_* environment
// equivalents, and a few weft additions (logging, reconcile interval).
import { readFileSync } from 'node:fs';
import yargs from 'yargs';
import { errnoCode, errorMessage } from '../util/errors.js';
import { DEFAULT_ETCD_ENDPOINTS, DEFAULT_ETCD_PREFIX, DEFAULT_LEASE_TTL_SECONDS } from '../subnet/etcd/defaults.js';
import type { EtcdConnectOptions } from '../subnet/etcd/registry.js';
import { parseGoDuration } from '../ipmasq/agent-config.js';
import type { LogFormat, LogLevel } from '../util/log.js';
import { IPNet } from '../util/ip.js';
import { DEFAULT_CNI_SOCKET } from '../cniserver/types.js';

export interface WeftdFlags {
  etcdEndpoints: string[];
  etcdPrefix: string;
  etcdKeyfile: string;
  etcdCertfile: string;
  etcdCafile: string;
  etcdUsername: string;
  /** The password: --etcd-password (FLANNELD_ETCD_PASSWORD), or what --etcd-password-file holds. */
  etcdPassword: string;
  /** Where the password was read from ('' = not from a file). */
  etcdPasswordFile: string;
  iface: string[];
  ifaceRegex: string[];
  ifaceCanReach: string;
  subnetFile: string;
  publicIp: string;
  publicIpv6: string;
  /** flannel's --subnet-lease-renew-margin, in minutes, as given (60 when not). */
  subnetLeaseRenewMargin: number;
  /** --subnet-lease-ttl in seconds: the etcd lease a subnet key is bound to. */
  subnetLeaseTTL: number;
  /**
   * The renewal margin in effect, in seconds: the given margin, else the smaller of 60 minutes and
   * half the TTL (so a short --subnet-lease-ttl works without a margin of its own).
   */
  subnetLeaseRenewMarginSeconds: number;
  ipMasq: boolean;
  /** ip-masq-agent mode's config file ('' = off). */
  ipMasqConfig: string;
  ipMasqFullyRandomDisable: boolean;
  kubeSubnetMgr: boolean;
  kubeApiUrl: string;
  kubeAnnotationPrefix: string;
  kubeconfigFile: string;
  /** --network-policy: enforce Kubernetes NetworkPolicy (kube mode only). */
  networkPolicy: boolean;
  /** --network-policy-log: log denied packets, rate-limited. */
  networkPolicyLog: boolean;
  /** --service-cidr: the Services' ClusterIP ranges (ovs nodes with --network-policy judge egress after kube-proxy's DNAT). */
  serviceCidrs: readonly IPNet[];
  healthzIp: string;
  healthzPort: number;
  iptablesResync: number;
  iptablesForwardRules: boolean;
  ipBlackholeRoute: boolean;
  netConfigPath: string;
  setNodeNetworkUnavailable: boolean;
  logFormat: LogFormat;
  logLevel: LogLevel;
  reconcileInterval: number;
  /** The CNI server's unix socket ('' = no CNI server). */
  cniSocket: string;
  v: number;
}

/** The etcd connection flags, shared by weftd and weft. */
export type EtcdFlags = Pick<
  WeftdFlags,
  'etcdEndpoints' | 'etcdPrefix' | 'etcdCafile' | 'etcdCertfile' | 'etcdKeyfile' | 'etcdUsername' | 'etcdPassword'
>;

export function etcdConnectOptions(f: EtcdFlags): EtcdConnectOptions {
  return {
    endpoints: f.etcdEndpoints,
    prefix: f.etcdPrefix,
    caFile: f.etcdCafile || undefined,
    certFile: f.etcdCertfile || undefined,
    keyFile: f.etcdKeyfile || undefined,
    username: f.etcdUsername || undefined,
    password: f.etcdPassword || undefined,
  };
}

export class FlagError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FlagError';
  }
}

/**
 * The etcd password: `password` (--etcd-password or FLANNELD_ETCD_PASSWORD), or the content of
 * `file` (--etcd-password-file or FLANNELD_ETCD_PASSWORD_FILE) without its trailing line break,
 * read now. Both at once, an unreadable, empty or multi-line file: FlagError. Neither message
 * contains the password.
 */
export function resolveEtcdPassword(password: string, file: string): string {
  if (file === '') return password;
  if (password !== '') {
    throw new FlagError('--etcd-password and --etcd-password-file are exclusive (on the command line or as FLANNELD_ETCD_PASSWORD / FLANNELD_ETCD_PASSWORD_FILE); give one');
  }
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    const code = errnoCode(e);
    const why = code === 'ENOENT' ? 'no such file' : code === 'EACCES' ? 'permission denied' : code === 'EISDIR' ? 'is a directory' : errorMessage(e);
    throw new FlagError(`--etcd-password-file ${file}: cannot read it: ${why}`);
  }
  const value = text.replace(/\r?\n$/, '');
  if (value === '') throw new FlagError(`--etcd-password-file ${file}: the file is empty`);
  if (/[\r\n]/.test(value)) throw new FlagError(`--etcd-password-file ${file}: holds more than one line (the password is the whole file, one trailing newline allowed)`);
  return value;
}


/** Go's flag package takes `-name` as well as `--name`; yargs would read `-name` as short flags. */
export function normalizeGoFlags(argv: readonly string[]): string[] {
  return argv.map((a) => (/^-[a-zA-Z][a-zA-Z0-9-]+(=.*)?$/.test(a) ? `-${a}` : a));
}

/** Go's flag package: a repeated flag keeps its last value (yargs would make an array). */
function last<T>(v: T | T[]): T {
  return Array.isArray(v) ? (v[v.length - 1] as T) : v;
}
const lastString = (v: string | string[]): string => last(v);
const lastNumber = (v: number | number[]): number => last(v);
const lastBoolean = (v: boolean | boolean[]): boolean => last(v);

/** The list flags accept repeats and comma lists (flannel's --etcd-endpoints is comma-delimited). */
function splitList(values: readonly (string | number)[]): string[] {
  return values.flatMap((v) => String(v).split(',')).map((s) => s.trim()).filter((s) => s !== '');
}

export function buildParser(argv: readonly string[]) {
  return yargs(normalizeGoFlags(argv))
    .scriptName('weftd')
    .usage('weftd: flannel-compatible node network daemon\n\nUsage: weftd [flags]\nEvery flag can also be set as FLANNELD_<NAME> (e.g. FLANNELD_ETCD_ENDPOINTS).')
    .env('FLANNELD')
    .parserConfiguration({ 'camel-case-expansion': true, 'strip-dashed': false })
    .option('etcd-endpoints', { type: 'string', array: true, requiresArg: true, default: DEFAULT_ETCD_ENDPOINTS, describe: 'comma-separated etcd endpoints' })
    .option('etcd-prefix', { type: 'string', requiresArg: true, coerce: lastString, default: DEFAULT_ETCD_PREFIX, describe: 'etcd prefix' })
    .option('etcd-keyfile', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'SSL key file used to secure etcd communication' })
    .option('etcd-certfile', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'SSL certification file used to secure etcd communication' })
    .option('etcd-cafile', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'SSL Certificate Authority file used to secure etcd communication' })
    .option('etcd-username', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'username for BasicAuth to etcd' })
    .option('etcd-password', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'password for BasicAuth to etcd (visible in the process list: prefer FLANNELD_ETCD_PASSWORD or --etcd-password-file)' })
    .option('etcd-password-file', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'file holding the password for BasicAuth to etcd (read at start, trailing newline dropped); exclusive with --etcd-password' })
    .option('iface', { type: 'string', array: true, requiresArg: true, default: [], describe: 'interface to use (IP or name) for inter-host communication; repeatable, first match wins' })
    .option('iface-regex', { type: 'string', array: true, requiresArg: true, default: [], describe: 'regex of the IP or name of the interface to use; repeatable' })
    .option('iface-can-reach', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'use the interface that can reach this IP' })
    .option('subnet-file', { type: 'string', requiresArg: true, coerce: lastString, default: '/run/flannel/subnet.env', describe: 'filename where env variables (subnet, MTU, ...) will be written to' })
    .option('public-ip', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'IP accessible by other nodes for inter-host communication' })
    .option('public-ipv6', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'IPv6 accessible by other nodes for inter-host communication' })
    .option('subnet-lease-renew-margin', { type: 'number', requiresArg: true, coerce: lastNumber, describe: 'subnet lease renewal margin, in minutes, ranging from 1 to 1439 (default 60, or half the lease TTL when that is shorter)' })
    .option('subnet-lease-ttl', { type: 'string', requiresArg: true, coerce: lastString, describe: `how long a subnet lease in etcd outlives its node's last renewal, as a Go duration (e.g. 24h, 30m, 90s; at least ${MIN_LEASE_TTL_SECONDS}s, whole seconds; default 24h)` })
    .option('ip-masq', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'setup IP masquerade rule for traffic destined outside of overlay network' })
    .option('ip-masq-config', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'ip-masq-agent mode: masquerade all pod traffic except to the nonMasqueradeCIDRs of this YAML/JSON file (reloaded on change); exclusive with --ip-masq' })
    .option('ip-masq-fully-random-disable', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'disable --random-fully in the MASQUERADE rule' })
    .option('kube-subnet-mgr', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'contact the Kubernetes API for subnet assignment instead of etcd' })
    .option('kube-api-url', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'Kubernetes API server URL (not needed in-cluster)' })
    .option('kube-annotation-prefix', { type: 'string', requiresArg: true, coerce: lastString, default: 'flannel.alpha.coreos.com', describe: 'Kubernetes annotation prefix' })
    .option('kubeconfig-file', { type: 'string', requiresArg: true, coerce: lastString, default: '', describe: 'kubeconfig file location (not needed in-cluster)' })
    .option('network-policy', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'enforce Kubernetes NetworkPolicy with nftables (needs --kube-subnet-mgr)' })
    .option('network-policy-log', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'log packets denied by NetworkPolicy, rate-limited (needs --network-policy)' })
    .option('service-cidr', {
      type: 'string',
      requiresArg: true,
      coerce: lastString,
      default: '',
      describe: "the Services' ClusterIP ranges, comma-separated (kube-apiserver's --service-cluster-ip-range); with --network-policy on ovs nodes, egress to them is judged after kube-proxy's DNAT, against the backend pod",
    })
    .option('healthz-ip', { type: 'string', requiresArg: true, coerce: lastString, default: '0.0.0.0', describe: 'the IP address for the healthz server to listen on' })
    .option('healthz-port', { type: 'number', requiresArg: true, coerce: lastNumber, default: 0, describe: 'the port for the healthz and metrics server to listen on (0 disables it)' })
    .option('iptables-resync', { type: 'number', requiresArg: true, coerce: lastNumber, default: 5, describe: 'resync period for iptables rules, in seconds' })
    .option('iptables-forward-rules', { type: 'boolean', coerce: lastBoolean, default: true, describe: 'add default accept rules to the FORWARD chain' })
    .option('ip-blackhole-route', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'add a blackhole route for the local pod subnet' })
    .option('net-config-path', { type: 'string', requiresArg: true, coerce: lastString, default: '/etc/kube-flannel/net-conf.json', describe: 'path to the network configuration (Kubernetes mode)' })
    .option('set-node-network-unavailable', { type: 'boolean', coerce: lastBoolean, default: true, describe: 'set NodeNetworkUnavailable to false once up (Kubernetes mode)' })
    .option('log-format', { coerce: (v: LogFormat | LogFormat[]) => last(v), choices: ['text', 'json'] as const, default: 'text' as const, describe: 'log line format' })
    .option('log-level', { coerce: (v: LogLevel | LogLevel[]) => last(v), choices: ['error', 'warn', 'info', 'debug'] as const, default: 'info' as const, describe: 'lowest level logged' })
    .option('reconcile-interval', { type: 'number', requiresArg: true, coerce: lastNumber, default: 10, describe: 'seconds between backend drift repairs (0 disables)' })
    .option('cni-socket', { type: 'string', requiresArg: false, coerce: lastString, default: DEFAULT_CNI_SOCKET, describe: 'unix socket of the CNI server the plugin executables forward to (root only; empty disables it: the plugins then run on their own)' })
    .option('v', { type: 'number', requiresArg: true, coerce: lastNumber, default: 0, describe: 'flanneld verbosity; 4 or more logs at debug level' })
    .version(false)
    .option('version', { type: 'boolean', coerce: lastBoolean, default: false, describe: 'print version and exit' })
    .help('help')
    .strict()
    .exitProcess(false)
    .fail((msg, err) => {
      throw new FlagError(err?.message ?? msg);
    })
    .check((a) => {
      const margin = a['subnet-lease-renew-margin'];
      if (margin !== undefined && (!Number.isInteger(margin) || margin < 1 || margin > 1439)) {
        throw new FlagError(`--subnet-lease-renew-margin ${margin}: must be an integer from 1 to 1439`);
      }
      leaseTiming(a['subnet-lease-ttl'], margin); // throws FlagError
      const port = a['healthz-port'];
      if (!Number.isInteger(port) || port < 0 || port > 65535) {
        throw new FlagError(`--healthz-port ${port}: must be 0..65535`);
      }
      if (!(a['reconcile-interval'] >= 0)) throw new FlagError('--reconcile-interval: must be a non-negative number');
      const sock = a['cni-socket'];
      if (sock !== '' && !sock.startsWith('/')) throw new FlagError(`--cni-socket ${JSON.stringify(sock)}: must be an absolute path (or empty to disable the CNI server)`);
      if (Buffer.byteLength(sock) > 107) throw new FlagError(`--cni-socket: a unix socket path holds at most 107 bytes, ${JSON.stringify(sock)} has ${Buffer.byteLength(sock)}`);
      if (a['ip-masq'] && a['ip-masq-config']) {
        throw new FlagError('--ip-masq and --ip-masq-config are exclusive: --ip-masq installs flannel\'s masquerade rules, --ip-masq-config ip-masq-agent\'s; choose one');
      }
      // Policies, pods and namespaces come from the Kubernetes API: with etcd there is nothing to enforce.
      if (a['network-policy'] && !a['kube-subnet-mgr']) {
        throw new FlagError('--network-policy needs --kube-subnet-mgr: NetworkPolicy objects come from the Kubernetes API, which the etcd subnet manager does not use');
      }
      parseServiceCidrs(a['service-cidr']);
      if (a['network-policy-log'] && !a['network-policy']) {
        throw new FlagError('--network-policy-log needs --network-policy: it logs the packets that NetworkPolicy denies');
      }
      return true;
    });
}

/** --service-cidr's comma-separated IPv4 prefixes (canonical: no host bits); '' is none. */
export function parseServiceCidrs(text: string): IPNet[] {
  if (text.trim() === '') return [];
  return text.split(',').map((part) => {
    const net = IPNet.tryParse(part.trim());
    if (!net || net.family !== 4 || net.toString() !== part.trim() || net.prefix === 0) {
      throw new FlagError(`--service-cidr: ${JSON.stringify(part.trim().slice(0, 60))} is not an IPv4 prefix without host bits (e.g. 10.96.0.0/12)`);
    }
    return net;
  });
}

/** Below this, one failed keepalive exchange (5 s) and a retry would not fit in half the TTL. */
export const MIN_LEASE_TTL_SECONDS = 20;
/** etcd's MaxLeaseTTL. */
const MAX_LEASE_TTL_SECONDS = 9_000_000_000;

/**
 * The lease TTL and renewal margin in seconds from --subnet-lease-ttl (a Go duration, undefined
 * when not given) and --subnet-lease-renew-margin (minutes, undefined when not given).
 */
export function leaseTiming(ttlText: string | undefined, marginMinutes: number | undefined): { ttl: number; margin: number } {
  let ttl = DEFAULT_LEASE_TTL_SECONDS;
  if (ttlText !== undefined) {
    const ms = parseGoDuration(ttlText.trim());
    const shown = JSON.stringify(ttlText);
    if (ms === null) throw new FlagError(`--subnet-lease-ttl ${shown}: not a duration (write it as Go does: 24h, 30m, 1h30m, 90s)`);
    if (ms % 1000 !== 0) throw new FlagError(`--subnet-lease-ttl ${shown}: must be a whole number of seconds (etcd lease TTLs are in seconds)`);
    ttl = ms / 1000;
    if (ttl < MIN_LEASE_TTL_SECONDS) {
      throw new FlagError(`--subnet-lease-ttl ${shown}: must be at least ${MIN_LEASE_TTL_SECONDS}s, so that a renewal that meets a dead etcd member can retry on another before the lease expires`);
    }
    if (ttl > MAX_LEASE_TTL_SECONDS) throw new FlagError(`--subnet-lease-ttl ${shown}: etcd takes at most ${MAX_LEASE_TTL_SECONDS}s`);
  }
  if (marginMinutes === undefined) return { ttl, margin: Math.min(3600, Math.floor(ttl / 2)) };
  const margin = marginMinutes * 60;
  if (margin >= ttl) {
    throw new FlagError(
      `--subnet-lease-renew-margin ${marginMinutes} (minutes) must be below --subnet-lease-ttl ${ttlText ?? '24h'} (${ttl}s): the lease is renewed that long before it expires; give a smaller margin, or none: the default is 60 minutes, or half the TTL when that is shorter`,
    );
  }
  return { ttl, margin };
}

/** Parses argv (without node and script); throws FlagError with a one-line message. */
export function parseFlags(argv: readonly string[]): WeftdFlags & { help: boolean; version: boolean } {
  const a = buildParser(argv).parseSync();
  const timing = leaseTiming(a['subnet-lease-ttl'], a['subnet-lease-renew-margin']);
  return {
    etcdEndpoints: splitList(a['etcd-endpoints']),
    etcdPrefix: a['etcd-prefix'],
    etcdKeyfile: a['etcd-keyfile'],
    etcdCertfile: a['etcd-certfile'],
    etcdCafile: a['etcd-cafile'],
    etcdUsername: a['etcd-username'],
    etcdPassword: resolveEtcdPassword(a['etcd-password'], a['etcd-password-file']),
    etcdPasswordFile: a['etcd-password-file'],
    iface: splitList(a.iface),
    ifaceRegex: a['iface-regex'].map(String),
    ifaceCanReach: a['iface-can-reach'],
    subnetFile: a['subnet-file'],
    publicIp: a['public-ip'],
    publicIpv6: a['public-ipv6'],
    subnetLeaseRenewMargin: a['subnet-lease-renew-margin'] ?? 60,
    subnetLeaseTTL: timing.ttl,
    subnetLeaseRenewMarginSeconds: timing.margin,
    ipMasq: a['ip-masq'],
    ipMasqConfig: a['ip-masq-config'],
    ipMasqFullyRandomDisable: a['ip-masq-fully-random-disable'],
    kubeSubnetMgr: a['kube-subnet-mgr'],
    kubeApiUrl: a['kube-api-url'],
    kubeAnnotationPrefix: a['kube-annotation-prefix'],
    kubeconfigFile: a['kubeconfig-file'],
    networkPolicy: a['network-policy'],
    networkPolicyLog: a['network-policy-log'],
    serviceCidrs: parseServiceCidrs(a['service-cidr']),
    healthzIp: a['healthz-ip'],
    healthzPort: a['healthz-port'],
    iptablesResync: a['iptables-resync'],
    iptablesForwardRules: a['iptables-forward-rules'],
    ipBlackholeRoute: a['ip-blackhole-route'],
    netConfigPath: a['net-config-path'],
    setNodeNetworkUnavailable: a['set-node-network-unavailable'],
    logFormat: a['log-format'],
    logLevel: a.v >= 4 ? 'debug' : a['log-level'],
    reconcileInterval: a['reconcile-interval'],
    cniSocket: a['cni-socket'],
    v: a.v,
    help: Boolean(a.help),
    version: a.version,
  };
}
