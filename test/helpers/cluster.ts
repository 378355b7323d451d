// A small cluster of "hosts" as network namespaces on a shared underlay (a bridge in a namespace
// of its own, never the machine's root namespace), with a real etcd in the underlay, a weftd per
// host, a cni0-like bridge holding the lease's gateway address, and one "pod" namespace per host.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { StatusSnapshot } from '../../src/daemon/status.js';
import { EtcdCluster } from './etcd-cluster.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from './netns.js';
import { WaitAbort, waitFor } from './wait.js';
import { WeftdProcess } from './weftd.js';

export const UNDERLAY_V4 = '10.250.0';
export const UNDERLAY_V6 = 'fd50::';
export const ETCD_IP = `${UNDERLAY_V4}.254`;

export interface ClusterOptions {
  readonly hosts: number;
  readonly tag: string;
  /** The network config written to etcd before any weftd starts. */
  readonly config: Record<string, unknown>;
  readonly ipv6?: boolean;
  /** Extra weftd flags for every host. */
  readonly weftdArgs?: readonly string[];
  /**
   * etcd members (default 1: one etcd in the underlay namespace at ETCD_IP). More than one: an
   * EtcdCluster, every member in a namespace of its own on the underlay (at .201, .202, ...), and
   * every weftd given all their endpoints.
   */
  readonly etcdMembers?: number;
}

export interface SubnetEnvFile {
  FLANNEL_NETWORK?: string;
  FLANNEL_SUBNET?: string;
  FLANNEL_IPV6_NETWORK?: string;
  FLANNEL_IPV6_SUBNET?: string;
  FLANNEL_MTU?: string;
  FLANNEL_IPMASQ?: string;
}

export class Host {
  weftd: WeftdProcess | null = null;
  podIP: string | null = null;
  podIPv6: string | null = null;

  constructor(
    readonly cluster: Cluster,
    readonly i: number,
    readonly ns: string,
    readonly podNs: string,
  ) {}

  get underlayIP(): string {
    return `${UNDERLAY_V4}.${this.i}`;
  }

  get underlayIPv6(): string {
    return `${UNDERLAY_V6}${this.i}`;
  }

  get subnetFile(): string {
    return join(this.cluster.dir, `h${this.i}`, 'subnet.env');
  }

  /** This host's weftd CNI server socket (in a directory of its own, which weftd creates 0700). */
  get cniSocket(): string {
    return join(this.cluster.dir, `h${this.i}`, 'run', 'cni.sock');
  }

  subnetEnv(): SubnetEnvFile {
    const env: Record<string, string> = {};
    for (const line of readFileSync(this.subnetFile, 'utf8').split('\n')) {
      const m = /^([A-Z0-9_]+)=(.*)$/.exec(line);
      if (m) env[m[1]!] = m[2]!;
    }
    return env;
  }

  /** Starts weftd inside the host namespace and waits for its subnet.env. */
  async startWeftd(extra: readonly string[] = [], env: NodeJS.ProcessEnv = {}, opts: { readonly timeoutMs?: number } = {}): Promise<void> {
    const args = [
      '--etcd-endpoints', this.cluster.etcdEndpoints,
      '--iface', 'eth0',
      '--subnet-file', this.subnetFile,
      '--healthz-ip', '127.0.0.1', '--healthz-port', '8081',
      ...(this.cluster.opts.weftdArgs ?? []),
      ...extra,
    ];
    // A short timer unless the test sets its own (a repeated flag would become an array).
    if (!args.includes('--reconcile-interval')) args.push('--reconcile-interval', '1');
    // A CNI server socket per host unless the test sets its own: many weftd run at once.
    if (!args.some((a) => a === '--cni-socket' || a.startsWith('--cni-socket='))) args.push('--cni-socket', this.cniSocket);
    this.weftd = WeftdProcess.start(args, env, this.ns);
    const d = this.weftd;
    await waitFor(() => {
      if (!d.running) throw new WaitAbort(`weftd on ${this.ns} exited:\n${d.output}`);
      return /acquired lease/.test(d.output) && existsSync(this.subnetFile);
    }, { timeoutMs: opts.timeoutMs ?? 60_000, what: `weftd on ${this.ns} to write subnet.env` }).catch((e: Error) => {
      throw e instanceof WaitAbort ? e : new Error(`${e.message}; its output so far:\n${d.output.split('\n').slice(-15).join('\n')}`);
    });
  }

  /** The pod: a veth from cni0 into the pod namespace, with the next address of the lease. */
  async attachPod(): Promise<void> {
    const env = this.subnetEnv();
    const mtu = env.FLANNEL_MTU ?? '1450';
    await ipn(this.ns, 'link', 'add', 'cni0', 'type', 'bridge');
    await ipn(this.ns, 'link', 'set', 'cni0', 'mtu', mtu, 'up');
    await ipn(this.ns, 'link', 'add', 'veth0', 'mtu', mtu, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.podNs);
    await ipn(this.ns, 'link', 'set', 'veth0', 'master', 'cni0', 'up');
    await ipn(this.podNs, 'link', 'set', 'eth0', 'mtu', mtu, 'up');
    if (env.FLANNEL_SUBNET) {
      const [gw, len] = env.FLANNEL_SUBNET.split('/') as [string, string];
      const pod = gw.replace(/\.(\d+)$/, (_m, d: string) => `.${Number(d) + 1}`);
      await ipn(this.ns, 'addr', 'add', `${gw}/${len}`, 'dev', 'cni0');
      await ipn(this.podNs, 'addr', 'add', `${pod}/${len}`, 'dev', 'eth0');
      await ipn(this.podNs, 'route', 'add', 'default', 'via', gw);
      this.podIP = pod;
    }
    if (env.FLANNEL_IPV6_SUBNET) {
      const [gw, len] = env.FLANNEL_IPV6_SUBNET.split('/') as [string, string];
      const pod = gw.replace(/::1$/, '::2');
      await ipn(this.ns, 'addr', 'add', `${gw}/${len}`, 'dev', 'cni0', 'nodad');
      await ipn(this.podNs, 'addr', 'add', `${pod}/${len}`, 'dev', 'eth0', 'nodad');
      await ipn(this.podNs, '-6', 'route', 'add', 'default', 'via', gw);
      this.podIPv6 = pod;
    }
  }

  /** One ping from this host's pod; true when answered. */
  async ping(ip: string): Promise<boolean> {
    const args = ip.includes(':') ? ['-6', '-c', '1', '-W', '1', ip] : ['-c', '1', '-W', '1', ip];
    return nsExec(this.podNs, 'ping', ...args).then(
      () => true,
      () => false,
    );
  }

  /** The metrics text of this host's weftd (fetched from inside its namespace). */
  metrics(): Promise<string> {
    return nsExec(
      this.ns,
      process.execPath,
      '-e',
      "fetch('http://127.0.0.1:8081/metrics').then(r=>r.text()).then(t=>process.stdout.write(t))",
    );
  }

  /** weftd's /status (served before weftd is ready too). */
  async status(): Promise<StatusSnapshot> {
    const script = "fetch('http://127.0.0.1:8081/status').then(r=>r.text()).then(t=>process.stdout.write(t))";
    return JSON.parse(await nsExec(this.ns, process.execPath, '-e', script)) as StatusSnapshot;
  }

  /** The CNI server part of weftd's /status. */
  async cniServerStatus(): Promise<NonNullable<StatusSnapshot['cniServer']>> {
    const s = await this.status();
    if (!s.cniServer) throw new Error(`no cniServer in the /status of weftd on ${this.ns}`);
    return s.cniServer;
  }

  /** One sample, e.g. `weft_ipmasq_repairs_total{mode="iptables"}`; `missing` when it is not exported. */
  async metric(name: string, missing = NaN): Promise<number> {
    const m = new RegExp(`^${name.replace(/[{}]/g, '\\$&')} (\\S+)$`, 'm').exec(await this.metrics());
    return m ? Number(m[1]) : missing;
  }

  /** Waits for `n` more masquerade/forward rule passes, so "nothing happened" is seen over real passes. */
  async rulePasses(n: number): Promise<void> {
    const start = await this.metric('weft_ipmasq_checks_total');
    await waitFor(async () => (await this.metric('weft_ipmasq_checks_total')) >= start + n, { timeoutMs: 15_000, what: `${n} rule passes` });
  }
}

export class Cluster {
  readonly hosts: Host[] = [];
  readonly dir: string;
  readonly underlay: string;
  private etcdProc: ChildProcess | null = null;
  /** The etcd members when the cluster was made with `etcdMembers` > 1. */
  etcd: EtcdCluster | null = null;
  private readonly namespaces: string[] = [];

  private constructor(readonly opts: ClusterOptions) {
    this.dir = mkdtempSync(join(tmpdir(), `weft-cluster-${opts.tag}-`));
    this.underlay = `${nsPrefix(opts.tag)}-ul`;
  }

  static async create(opts: ClusterOptions): Promise<Cluster> {
    const c = new Cluster(opts);
    try {
      await c.build();
    } catch (e) {
      await c.destroy();
      throw e;
    }
    return c;
  }

  private async build(): Promise<void> {
    const { opts } = this;
    const prefix = nsPrefix(opts.tag);
    this.namespaces.push(await addNetns(this.underlay));
    await ipn(this.underlay, 'link', 'add', 'br0', 'type', 'bridge');
    await ipn(this.underlay, 'link', 'set', 'br0', 'up');
    await ipn(this.underlay, 'addr', 'add', `${ETCD_IP}/24`, 'dev', 'br0');
    for (let i = 1; i <= opts.hosts; i++) {
      const ns = await addNetns(`${prefix}-h${i}`);
      const podNs = await addNetns(`${prefix}-p${i}`);
      this.namespaces.push(ns, podNs);
      await ipn(this.underlay, 'link', 'add', `h${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
      await ipn(this.underlay, 'link', 'set', `h${i}`, 'master', 'br0', 'up');
      await ipn(ns, 'addr', 'add', `${UNDERLAY_V4}.${i}/24`, 'dev', 'eth0');
      if (opts.ipv6) await ipn(ns, 'addr', 'add', `${UNDERLAY_V6}${i}/64`, 'dev', 'eth0', 'nodad');
      await ipn(ns, 'link', 'set', 'eth0', 'up');
      await ipn(ns, 'route', 'add', 'default', 'via', ETCD_IP);
      await nsExec(ns, 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1');
      if (opts.ipv6) await nsExec(ns, 'sysctl', '-q', '-w', 'net.ipv6.conf.all.forwarding=1');
      this.hosts.push(new Host(this, i, ns, podNs));
    }
    if ((opts.etcdMembers ?? 1) > 1) {
      this.etcd = await EtcdCluster.start({ tag: opts.tag, size: opts.etcdMembers, underlay: { ns: this.underlay, bridge: 'br0' }, base: UNDERLAY_V4 });
    } else {
      await this.startEtcd();
    }
    await this.writeConfig(opts.config);
  }

  /** etcd inside the underlay namespace, on the bridge address every host reaches. */
  private async startEtcd(): Promise<void> {
    const url = `http://${ETCD_IP}:2379`;
    const peer = `http://${ETCD_IP}:2380`;
    const log = openSync(join(this.dir, 'etcd.log'), 'a');
    this.etcdProc = spawn(
      'ip',
      ['netns', 'exec', this.underlay, 'etcd', '--name', 'ul', '--data-dir', join(this.dir, 'etcd'),
        '--listen-client-urls', url, '--advertise-client-urls', url, '--listen-peer-urls', peer,
        '--initial-advertise-peer-urls', peer, '--initial-cluster', `ul=${peer}`, '--log-level', 'warn'],
      { stdio: ['ignore', log, log] },
    );
    closeSync(log);
    const proc = this.etcdProc;
    // A test process that ends without destroy() (killed: cleanupOnSignals routes signals to exit)
    // must not leave etcd and its data dir behind; weftd.ts and netns.ts do the same for theirs.
    const dir = this.dir;
    const orphaned = () => {
      proc.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    };
    process.once('exit', orphaned);
    proc.once('exit', () => process.off('exit', orphaned));
    await waitFor(async () => {
      if (proc.exitCode !== null) throw new Error(`etcd exited; see ${this.dir}/etcd.log`);
      return this.etcdctl('endpoint', 'health').then(() => true, () => false);
    }, { timeoutMs: 30_000, what: 'etcd in the underlay namespace' });
  }

  async writeConfig(config: Record<string, unknown>): Promise<void> {
    await this.etcdctl('put', '/coreos.com/network/config', JSON.stringify(config));
  }

  /** weftd's --etcd-endpoints: the one etcd, or every member of the EtcdCluster. */
  get etcdEndpoints(): string {
    return this.etcd ? this.etcd.endpointsFlag : `http://${ETCD_IP}:2379`;
  }

  /** etcdctl (v3) run inside the underlay namespace (against every reachable member of an EtcdCluster). */
  etcdctl(...args: string[]): Promise<string> {
    if (this.etcd) return this.etcd.etcdctl(...args);
    return sh('ip', ['netns', 'exec', this.underlay, 'env', 'ETCDCTL_API=3', 'etcdctl', '--endpoints', `http://${ETCD_IP}:2379`, ...args]);
  }

  async startAll(): Promise<void> {
    for (const h of this.hosts) await h.startWeftd();
    for (const h of this.hosts) await h.attachPod();
  }

  /** Every pod answers a ping from every other pod (IPv4, and IPv6 when the pods have it). */
  async allPodsReachable(): Promise<boolean> {
    for (const a of this.hosts) {
      for (const b of this.hosts) {
        if (a === b) continue;
        if (b.podIP && !(await a.ping(b.podIP))) return false;
        if (b.podIPv6 && !(await a.ping(b.podIPv6))) return false;
      }
    }
    return true;
  }

  async destroy(): Promise<void> {
    // Everything is removed even when a daemon hangs; the hang is reported afterwards.
    const stops = await Promise.allSettled(this.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve()));
    const etcd = this.etcdProc;
    if (etcd && etcd.exitCode === null && etcd.signalCode === null) {
      const exited = new Promise((resolve) => etcd.once('exit', resolve));
      etcd.kill('SIGTERM');
      const timer = setTimeout(() => etcd.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    const etcdStopped = await Promise.allSettled([this.etcd?.stop()]);
    for (const ns of this.namespaces) await delNetns(ns);
    rmSync(this.dir, { recursive: true, force: true });
    const failed = [...stops, ...etcdStopped].find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}
