// A real multi-member etcd (Debian's etcd 3.4) for fault tests: every member in a network namespace
// of its own, attached by a veth to the underlay bridge, so a member can be SIGKILLed and restarted
// on the same data dir, and cut off (its link down, or all its traffic dropped by nftables inside its
// own namespace) without touching anyone else. Everything is removed by stop(), and at process exit
// as a last resort (namespaces by netns.ts, processes here).
//
// Also here: the instruments the fault scenarios use on a Cluster of weft hosts — a lease writer
// that churns flannel-format peer leases and records when etcd acknowledged each change, a kernel
// monitor per host (`ip monitor` + `bridge monitor`) that timestamps every add and delete of weft's
// entries, a readiness prober, and the CPU time of a process.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { addNetns, delNetns, ipn, nsPrefix, sh } from './netns.js';
import { prng } from './prng.js';
import { WaitAbort, waitFor } from './wait.js';

const children = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of children) p.kill('SIGKILL');
});

function track(p: ChildProcess): ChildProcess {
  children.add(p);
  p.once('exit', () => children.delete(p));
  return p;
}

/** SIGKILL (or `signal`) and wait for the exit; a process already gone resolves at once. */
async function killAndWait(p: ChildProcess, signal: NodeJS.Signals = 'SIGKILL', graceMs = 10_000): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => p.once('exit', () => resolve()));
  p.kill(signal);
  const timer = setTimeout(() => p.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

export type MemberState = 'up' | 'down' | 'partitioned';

export interface EtcdMember {
  /** 0-based index. */
  readonly i: number;
  readonly name: string;
  readonly ns: string;
  readonly ip: string;
  /** Client URL, http://ip:2379. */
  readonly url: string;
  readonly peerUrl: string;
  readonly dataDir: string;
  /** The etcd process (ip netns exec execs etcd itself), null while down. */
  readonly pid: number | null;
  readonly state: MemberState;
}

export interface EtcdClusterOptions {
  readonly tag: string;
  readonly size?: number;
  /**
   * The underlay to attach to: a namespace holding a bridge whose address is on `base`.0/24. Without
   * it the cluster makes an underlay of its own (bridge br0 with `base`.254).
   */
  readonly underlay?: { readonly ns: string; readonly bridge: string };
  /** First three octets of the underlay /24 (default 10.250.0); member i gets .(firstOctet + i). */
  readonly base?: string;
  readonly firstOctet?: number;
}

class Member {
  proc: ChildProcess | null = null;
  state: MemberState = 'down';
  partitionHow: 'link' | 'drop' | null = null;

  constructor(
    readonly i: number,
    readonly name: string,
    readonly ns: string,
    readonly ip: string,
    readonly dataDir: string,
    readonly logFile: string,
  ) {}

  get url(): string {
    return `http://${this.ip}:2379`;
  }

  get peerUrl(): string {
    return `http://${this.ip}:2380`;
  }

  get running(): boolean {
    return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  info(): EtcdMember {
    const { i, name, ns, ip, url, peerUrl, dataDir, state } = this;
    return { i, name, ns, ip, url, peerUrl, dataDir, state, pid: this.running ? (this.proc!.pid ?? null) : null };
  }
}

export class EtcdCluster {
  private readonly members: Member[] = [];
  private readonly namespaces: string[] = [];
  private ownUnderlay: string | null = null;
  readonly dir: string;

  private constructor(readonly opts: EtcdClusterOptions) {
    this.dir = mkdtempSync(join(tmpdir(), `weft-etcd-cluster-${opts.tag}-`));
  }

  /** Starts every member and waits until each answers a linearizable health check. */
  static async start(opts: EtcdClusterOptions): Promise<EtcdCluster> {
    const c = new EtcdCluster(opts);
    try {
      await c.build();
    } catch (e) {
      await c.stop().catch(() => undefined);
      throw e;
    }
    return c;
  }

  get size(): number {
    return this.members.length;
  }

  /** The namespace etcdctl runs in: the underlay, which reaches every member over the bridge. */
  get underlayNs(): string {
    return this.opts.underlay?.ns ?? this.ownUnderlay!;
  }

  member(i: number): EtcdMember {
    return this.m(i).info();
  }

  /** Every member's client URL, for weftd's --etcd-endpoints (comma-joined by `endpointsFlag`). */
  get endpoints(): string[] {
    return this.members.map((m) => m.url);
  }

  get endpointsFlag(): string {
    return this.endpoints.join(',');
  }

  /** The members neither down nor partitioned. */
  get reachable(): number[] {
    return this.members.filter((m) => m.state === 'up').map((m) => m.i);
  }

  /** Index of the member holding IP `ip`, or null. */
  indexOf(ip: string): number | null {
    return this.members.find((m) => m.ip === ip)?.i ?? null;
  }

  private m(i: number): Member {
    const m = this.members[i];
    if (!m) throw new Error(`no etcd member ${i} (the cluster has ${this.members.length})`);
    return m;
  }

  private async build(): Promise<void> {
    const size = this.opts.size ?? 3;
    const base = this.opts.base ?? '10.250.0';
    const first = this.opts.firstOctet ?? 200;
    const prefix = nsPrefix(this.opts.tag);
    let bridge = this.opts.underlay?.bridge ?? 'br0';
    if (!this.opts.underlay) {
      this.ownUnderlay = await addNetns(`${prefix}-eul`);
      this.namespaces.push(this.ownUnderlay);
      bridge = 'br0';
      await ipn(this.ownUnderlay, 'link', 'add', bridge, 'type', 'bridge');
      await ipn(this.ownUnderlay, 'link', 'set', bridge, 'up');
      await ipn(this.ownUnderlay, 'addr', 'add', `${base}.254/24`, 'dev', bridge);
    }
    for (let i = 0; i < size; i++) {
      const name = `e${i + 1}`;
      const ns = await addNetns(`${prefix}-${name}`);
      this.namespaces.push(ns);
      const ip = `${base}.${first + i + 1}`;
      await ipn(this.underlayNs, 'link', 'add', name, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
      await ipn(this.underlayNs, 'link', 'set', name, 'master', bridge, 'up');
      await ipn(ns, 'addr', 'add', `${ip}/24`, 'dev', 'eth0');
      await ipn(ns, 'link', 'set', 'eth0', 'up');
      this.members.push(new Member(i, name, ns, ip, join(this.dir, name), join(this.dir, `${name}.log`)));
    }
    for (const m of this.members) this.spawnMember(m);
    await waitFor(
      async () => {
        for (const m of this.members) if (!m.running) throw new WaitAbort(`etcd member ${m.name} exited; see ${m.logFile}:\n${this.tail(m)}`);
        return this.allHealthy();
      },
      { timeoutMs: 30_000, what: `${size} etcd members healthy` },
    );
  }

  private spawnMember(m: Member): void {
    const cluster = this.members.map((x) => `${x.name}=${x.peerUrl}`).join(',');
    const log = openSync(m.logFile, 'a');
    const proc = spawn(
      'ip',
      [
        'netns', 'exec', m.ns, 'etcd',
        '--name', m.name,
        '--data-dir', m.dataDir,
        // Loopback too, so a member can be asked about itself from inside its namespace while cut off.
        '--listen-client-urls', `${m.url},http://127.0.0.1:2379`,
        '--advertise-client-urls', m.url,
        '--listen-peer-urls', m.peerUrl,
        '--initial-advertise-peer-urls', m.peerUrl,
        '--initial-cluster', cluster,
        '--initial-cluster-token', `weft-${this.opts.tag}`,
        '--initial-cluster-state', 'new',
        '--log-level', 'warn',
      ],
      { stdio: ['ignore', log, log] },
    );
    closeSync(log);
    track(proc);
    m.proc = proc;
    m.state = m.partitionHow ? 'partitioned' : 'up';
  }

  private tail(m: Member): string {
    try {
      return readFileSync(m.logFile, 'utf8').split('\n').slice(-15).join('\n');
    } catch {
      return '';
    }
  }

  /**
   * etcdctl (v3) from the underlay namespace against `endpoints` (default: every reachable member;
   * every member when none is). Deadlines: 2 s to connect, 5 s per command.
   */
  etcdctl(...args: string[]): Promise<string> {
    return this.etcdctlAt(this.reachable.length > 0 ? this.reachable : this.members.map((m) => m.i), ...args);
  }

  etcdctlAt(members: readonly number[], ...args: string[]): Promise<string> {
    const eps = members.map((i) => this.m(i).url).join(',');
    return sh(
      'ip',
      ['netns', 'exec', this.underlayNs, 'env', 'ETCDCTL_API=3', 'etcdctl', '--endpoints', eps, '--dial-timeout', '2s', '--command-timeout', '5s', ...args],
      { timeoutMs: 15_000 },
    );
  }

  /** Whether member i answers a linearizable health check (it has a leader and can read through it). */
  async memberHealthy(i: number): Promise<boolean> {
    return this.etcdctlAt([i], 'endpoint', 'health').then(
      () => true,
      () => false,
    );
  }

  /** Every running, reachable member healthy, and every member in that state. */
  async allHealthy(): Promise<boolean> {
    for (const m of this.members) {
      if (m.state !== 'up' || !(await this.memberHealthy(m.i))) return false;
    }
    return true;
  }

  /** Waits until every member is up and healthy and they agree on a leader; returns the leader. */
  async waitHealthy(timeoutMs = 30_000): Promise<number> {
    return waitFor(
      async () => {
        for (const m of this.members) if (m.state === 'up' && !m.running) throw new WaitAbort(`etcd member ${m.name} exited:\n${this.tail(m)}`);
        return (await this.allHealthy()) ? this.leader() : null;
      },
      { timeoutMs, what: 'every etcd member healthy with one leader' },
    );
  }

  /**
   * The leader as the reachable members see it: the index every one of them names, or null (no
   * leader, disagreement during an election, or a leader that is not reachable).
   */
  async leader(): Promise<number | null> {
    const live = this.reachable;
    if (live.length === 0) return null;
    const out = await this.etcdctlAt(live, 'endpoint', 'status', '-w', 'json').catch(() => null);
    if (out === null) return null;
    // Member IDs are uint64: quote them before JSON.parse rounds them.
    const rows = JSON.parse(out.replace(/":(\d{15,})/g, '":"$1"')) as Array<{
      Endpoint: string;
      Status: { header: { member_id: string | number }; leader: string | number };
    }>;
    if (rows.length !== live.length) return null;
    const ids = new Map(rows.map((r) => [String(r.Status.header.member_id), r.Endpoint]));
    const leaders = new Set(rows.map((r) => String(r.Status.leader)));
    if (leaders.size !== 1) return null;
    const [leaderId] = [...leaders] as [string];
    const ep = ids.get(leaderId);
    if (!ep) return null;
    return this.members.find((m) => m.url === ep)?.i ?? null;
  }

  /** SIGKILL member i and wait for it to exit. */
  async kill(i: number): Promise<void> {
    const m = this.m(i);
    if (m.proc) await killAndWait(m.proc, 'SIGKILL');
    m.proc = null;
    m.state = 'down';
  }

  /** SIGTERM member i (a clean shutdown) and wait for it to exit. */
  async stopMember(i: number): Promise<void> {
    const m = this.m(i);
    if (m.proc) await killAndWait(m.proc, 'SIGTERM');
    m.proc = null;
    m.state = 'down';
  }

  /**
   * Starts member i again on its data dir. With `wait: 'healthy'` (the default) waits until it
   * answers a linearizable health check (needs quorum); with 'running' only until it listens for
   * its peers (what a member without quorum gets to).
   */
  async restart(i: number, wait: 'healthy' | 'running' = 'healthy'): Promise<void> {
    const m = this.m(i);
    if (m.running) await this.kill(i);
    this.spawnMember(m);
    await waitFor(
      async () => {
        if (!m.running) throw new WaitAbort(`etcd member ${m.name} exited after restart:\n${this.tail(m)}`);
        if (wait === 'healthy') return this.memberHealthy(i);
        // etcd serves clients only once it has published itself through raft (needs quorum); its
        // peer listener is up before that.
        return (await sh('ip', ['netns', 'exec', m.ns, 'ss', '-Hltn', 'sport', '=', ':2380'])).trim() !== '';
      },
      { timeoutMs: 30_000, what: `etcd member ${m.name} ${wait} after restart` },
    );
  }

  /**
   * Cuts member i off from everyone: 'link' sets its only link down (the bridge port loses carrier,
   * nothing answers, no RST), 'drop' keeps the link and drops every packet in and out of it with
   * nftables inside its namespace (loopback excepted). Either way its peers and clients see silence.
   */
  async partition(i: number, how: 'link' | 'drop' = 'link'): Promise<void> {
    const m = this.m(i);
    if (m.partitionHow) throw new Error(`etcd member ${m.name} is already partitioned`);
    if (how === 'link') {
      await ipn(m.ns, 'link', 'set', 'eth0', 'down');
    } else {
      await sh('ip', ['netns', 'exec', m.ns, 'nft', PARTITION_RULES]);
    }
    m.partitionHow = how;
    if (m.state === 'up') m.state = 'partitioned';
  }

  async heal(i: number): Promise<void> {
    const m = this.m(i);
    if (m.partitionHow === 'link') await ipn(m.ns, 'link', 'set', 'eth0', 'up');
    else if (m.partitionHow === 'drop') await sh('ip', ['netns', 'exec', m.ns, 'nft', 'delete', 'table', 'inet', 'weft_partition']);
    m.partitionHow = null;
    if (m.state === 'partitioned') m.state = 'up';
  }

  /**
   * Every member back: partitions healed, stopped members started. After a failed scenario
   * (`bestEffort`) errors are ignored, so a clean-up never hangs on a member that will not come back.
   */
  async restoreAll(bestEffort = false): Promise<void> {
    const tolerate = (p: Promise<void>) => (bestEffort ? p.catch(() => undefined) : p);
    for (let i = 0; i < this.size; i++) {
      if (this.member(i).state === 'partitioned') await tolerate(this.heal(i));
      if (this.member(i).pid === null) await tolerate(this.restart(i, 'running'));
    }
  }

  /** Member i's own view (serializable: answers without a leader): its revision, raft term and leader. */
  async memberStatus(i: number): Promise<{ revision: bigint; term: bigint; leader: string; appliedIndex: bigint } | null> {
    const out = await this.etcdctlAt([i], 'endpoint', 'status', '-w', 'json').catch(() => null);
    if (out === null) return null;
    const num = (re: RegExp) => BigInt(re.exec(out)?.[1] ?? 0);
    return {
      revision: num(/"revision":(\d+)/),
      term: num(/"raftTerm":(\d+)/),
      leader: /"leader":(\d+)/.exec(out)?.[1] ?? '0',
      appliedIndex: num(/"raftAppliedIndex":(\d+)/),
    };
  }

  /** The current revision, read through the reachable members. */
  async revision(): Promise<bigint> {
    const out = await this.etcdctl('get', '/weft-test/revision', '-w', 'json');
    const m = /"revision":(\d+)/.exec(out);
    if (!m) throw new Error(`no revision in ${out}`);
    return BigInt(m[1]!);
  }

  /** Compacts history up to the current revision (physically) and returns that revision. */
  async compact(): Promise<bigint> {
    const rev = await this.revision();
    await this.etcdctl('compact', String(rev), '--physical');
    return rev;
  }

  /** Defragments every reachable member, one by one; returns the time each took, in ms. */
  async defrag(): Promise<number[]> {
    const took: number[] = [];
    for (const i of this.reachable) {
      const t = Date.now();
      await this.etcdctlAt([i], 'defrag');
      took.push(Date.now() - t);
    }
    return took;
  }

  /** Stops every member (SIGKILL: nothing to keep), removes the namespaces and the data dirs. */
  async stop(): Promise<void> {
    await Promise.allSettled(this.members.map((m) => (m.proc ? killAndWait(m.proc, 'SIGKILL') : Promise.resolve())));
    for (const m of this.members) {
      m.proc = null;
      m.state = 'down';
    }
    for (const ns of this.namespaces) await delNetns(ns);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Drop everything but loopback, both ways (ARP is not inet: the link still resolves, then silence). */
const PARTITION_RULES =
  'add table inet weft_partition; ' +
  'add chain inet weft_partition in { type filter hook input priority -300; policy drop; }; ' +
  'add rule inet weft_partition in iif lo accept; ' +
  'add chain inet weft_partition out { type filter hook output priority -300; policy drop; }; ' +
  'add rule inet weft_partition out oif lo accept';

// ---------------------------------------------------------------------------------------------
// Instruments for fault scenarios on a cluster of weft hosts (kept free of cluster.ts's types, so
// this module does not import it back).

/** What the instruments need of a weft host. */
export interface HostLike {
  readonly ns: string;
  readonly underlayIP: string;
}

export const SUBNETS_PREFIX = '/coreos.com/network/subnets/';

/** A fake vxlan peer in flannel's format; every one has a subnet, MAC and public IP of its own. */
export interface FakeLease {
  readonly n: number;
  /** 10.65.0.0/24 */
  readonly subnet: string;
  readonly key: string;
  readonly publicIP: string;
  readonly mac: string;
  readonly value: string;
}

const hex2 = (n: number) => n.toString(16).padStart(2, '0');

/**
 * Fake lease number n: subnet 10.(firstOctet + n/256).(n%256).0/24 (never reused within a process,
 * so every kernel add or delete of one names exactly one change), VTEP MAC 0e:77:00:00:xx:xx, public
 * IP 10.251.x.y (an underlay address nobody has: only the FDB points at it).
 */
export function fakeLease(n: number, secondOctet = 65): FakeLease {
  const subnet = `10.${secondOctet + (n >> 8)}.${n & 255}.0/24`;
  const publicIP = `10.251.${Math.floor(n / 200)}.${(n % 200) + 1}`;
  const mac = `0e:77:00:00:${hex2((n >> 8) & 255)}:${hex2(n & 255)}`;
  return {
    n,
    subnet,
    key: SUBNETS_PREFIX + subnet.replace('/', '-'),
    publicIP,
    mac,
    value: JSON.stringify({ PublicIP: publicIP, PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: mac } }),
  };
}

export interface LeaseOp {
  readonly kind: 'put' | 'del';
  readonly lease: FakeLease;
  readonly phase: string;
  /** Date.now() when the first attempt was sent. */
  readonly sent: number;
  /** Date.now() when etcdctl returned success (etcd acknowledged the change). */
  acked: number;
  /** The revision etcd gave the change (0 until acknowledged). */
  revision: bigint;
  attempts: number;
}

/**
 * Puts and deletes fake peer leases through etcdctl, one change at a time, and records when each
 * was sent and acknowledged. A failed attempt (no leader, member gone) is retried until etcd
 * acknowledges it (both operations are idempotent), so the model always equals what etcd holds.
 */
export class LeaseWriter {
  readonly ops: LeaseOp[] = [];
  readonly live = new Map<string, FakeLease>();
  readonly bySubnet = new Map<string, FakeLease>();
  readonly byMac = new Map<string, FakeLease>();
  readonly delOf = new Map<string, LeaseOp>();
  readonly putOf = new Map<string, LeaseOp>();
  phase = '';
  failedAttempts = 0;
  private next = 0;
  private running: Promise<void> | null = null;
  private stopping = false;
  private readonly random: () => number;

  constructor(
    private readonly etcdctl: (...args: string[]) => Promise<string>,
    opts: { seed?: number; min?: number; max?: number; settleMs?: number } = {},
  ) {
    this.random = prng(opts.seed ?? 16);
    this.min = opts.min ?? 4;
    this.max = opts.max ?? 24;
    this.settleMs = opts.settleMs ?? 6000;
  }

  private readonly min: number;
  private readonly max: number;
  private readonly settleMs: number;

  /** Ops acknowledged so far (acked > 0). */
  get acked(): LeaseOp[] {
    return this.ops.filter((o) => o.acked > 0);
  }

  async put(): Promise<LeaseOp> {
    const lease = fakeLease(this.next++);
    this.bySubnet.set(lease.subnet, lease);
    this.byMac.set(lease.mac, lease);
    const op = await this.apply('put', lease, ['put', '-w', 'json', lease.key, lease.value]);
    this.putOf.set(lease.subnet, op);
    this.live.set(lease.subnet, lease);
    return op;
  }

  /** Deletes the oldest live fake (or `lease`). */
  async del(lease = this.live.values().next().value): Promise<LeaseOp> {
    if (!lease) throw new Error('no fake lease to delete');
    const op = await this.apply('del', lease, ['del', '-w', 'json', lease.key]);
    this.live.delete(lease.subnet);
    return op;
  }

  /**
   * One change: a put, or the deletion of the oldest fake, at random, keeping between `min` and
   * `max` fakes. Only a fake acknowledged more than `settleMs` ago is deleted, so no put is ever
   * superseded by its deletion before it must have been programmed: every change is timed.
   */
  step(): Promise<LeaseOp> {
    const oldest = this.live.values().next().value;
    const put = oldest ? this.putOf.get(oldest.subnet) : undefined;
    const deletable = put !== undefined && put.acked > 0 && put.acked + this.settleMs < Date.now();
    const n = this.live.size;
    if (!deletable || n < this.min) return this.put();
    if (n >= this.max) return this.del();
    return this.random() < 0.5 ? this.put() : this.del();
  }

  /** Changes back to back until stop(). */
  start(): void {
    if (this.running) return;
    this.stopping = false;
    this.running = (async () => {
      while (!this.stopping) await this.step();
    })();
  }

  /** Ends the loop after the change in flight is acknowledged. */
  async stop(): Promise<void> {
    this.stopping = true;
    const r = this.running;
    this.running = null;
    await r;
  }

  /**
   * For clean-up after a failure: stop within `timeoutMs` even if etcd never acknowledges the change
   * in flight again (it is given up; the model may then differ from etcd, so no later scenario may
   * rely on it — the suite is failing anyway).
   */
  async stopWithin(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<void>((resolve) => (timer = setTimeout(() => {
      this.abandoned = true;
      resolve();
    }, timeoutMs)));
    await Promise.race([this.stop().catch(() => undefined), late]);
    clearTimeout(timer);
  }

  private abandoned = false;

  /** Waits until `n` changes matching `filter` have been acknowledged. */
  async waitAcked(n: number, filter: (o: LeaseOp) => boolean = () => true, timeoutMs = 60_000): Promise<void> {
    await waitFor(() => this.ops.filter((o) => o.acked > 0 && filter(o)).length >= n, { timeoutMs, what: `${n} lease changes acknowledged`, intervalMs: 20 });
  }

  private async apply(kind: 'put' | 'del', lease: FakeLease, args: string[]): Promise<LeaseOp> {
    const op: LeaseOp = { kind, lease, phase: this.phase, sent: Date.now(), acked: 0, revision: 0n, attempts: 0 };
    this.ops.push(op);
    if (kind === 'del') this.delOf.set(lease.subnet, op);
    for (let backoff = 100; ; backoff = Math.min(backoff * 2, 1000)) {
      op.attempts++;
      try {
        const out = await this.etcdctl(...args);
        op.acked = Date.now();
        op.revision = BigInt(/"revision":(\d+)/.exec(out)?.[1] ?? 0);
        return op;
      } catch (e) {
        this.failedAttempts++;
        if (this.abandoned) throw e;
        // A retry backoff of the load generator (the cluster refused the change), not a wait for state.
        await new Promise((r) => setTimeout(r, backoff));
      }
    }
  }
}

export type EntryKind = 'route' | 'neigh' | 'nexthop' | 'fdb';

export interface KernelEvent {
  readonly t: number;
  readonly deleted: boolean;
  readonly kind: EntryKind;
  /** The subnet (route, neighbour, nexthop) or the MAC (FDB entry) the event is about. */
  readonly subject: string;
  readonly text: string;
}

const IPV4 = String.raw`\d+\.\d+\.\d+\.\d+`;

/**
 * `ip -o monitor route neigh nexthop` and `bridge monitor fdb` in a host namespace, every weft entry
 * event (routes and nexthops through flannel.1 or with weft's protocol, flannel.1's neighbours and
 * FDB entries) timestamped on arrival. Started only once both monitors are seen to be subscribed.
 */
export class KernelMonitor {
  readonly events: KernelEvent[] = [];
  startedAt = 0;
  private readonly procs: ChildProcess[] = [];
  private readonly nexthops = new Map<string, string>();
  private markers = '';

  private constructor(readonly host: HostLike) {}

  static async start(host: HostLike): Promise<KernelMonitor> {
    const m = new KernelMonitor(host);
    try {
      await m.run();
    } catch (e) {
      m.stop();
      throw e;
    }
    return m;
  }

  private async run(): Promise<void> {
    const ns = this.host.ns;
    for (const l of (await ipn(ns, 'nexthop', 'show').catch(() => '')).split('\n')) {
      const m = new RegExp(`^id (\\d+) via (${IPV4}) `).exec(l);
      if (m) this.nexthops.set(m[1]!, `${m[2]}/24`);
    }
    const feed = (p: ChildProcess) => {
      track(p);
      this.procs.push(p);
      onTimedLines(p, (t, l) => this.parse(t, l));
    };
    // -4: `ip monitor neigh` would print the bridge family's FDB entries as neighbours too.
    feed(spawn('ip', ['-4', '-n', ns, '-o', 'monitor', 'route', 'neigh', 'nexthop'], { stdio: ['ignore', 'pipe', 'ignore'] }));
    feed(spawn('bridge', ['-n', ns, 'monitor', 'fdb'], { stdio: ['ignore', 'pipe', 'ignore'] }));
    // An add made before a monitor subscribed is never reported: re-add the markers on every poll.
    // The route goes on lo, the FDB entry on a dummy bridge of our own: nothing weft owns.
    await ipn(ns, 'link', 'add', 'wmon0', 'type', 'bridge').catch(() => undefined);
    await ipn(ns, 'link', 'set', 'wmon0', 'up');
    let k = 0;
    await waitFor(
      async () => {
        if (this.markers.includes('route') && this.markers.includes('fdb')) return true;
        k++;
        await ipn(ns, 'route', 'replace', '192.0.2.77/32', 'dev', 'lo', 'metric', String(k));
        await sh('bridge', ['-n', ns, 'fdb', 'replace', `02:00:00:00:77:${hex2(k & 255)}`, 'dev', 'wmon0', 'self', 'permanent']);
        return false;
      },
      { timeoutMs: 10_000, what: `ip monitor and bridge monitor subscribed in ${ns}` },
    );
    await ipn(ns, 'route', 'flush', '192.0.2.77/32');
    await ipn(ns, 'link', 'del', 'wmon0');
    this.startedAt = Date.now();
  }

  private parse(t: number, raw: string): void {
    let l = raw.replace(/^\[[A-Z]+\]\s*/, '').trim();
    if (l.includes('192.0.2.77')) this.markers += 'route';
    if (l.includes('dev wmon0')) this.markers += 'fdb';
    const deleted = l.startsWith('Deleted ');
    if (deleted) l = l.slice('Deleted '.length);
    let m: RegExpExecArray | null;
    if ((m = new RegExp(`^(${IPV4}/\\d+) `).exec(l))) {
      if (l.includes('flannel.1') || l.includes(' proto 88')) this.events.push({ t, deleted, kind: 'route', subject: m[1]!, text: raw });
    } else if ((m = /^id (\d+)(?: via (\S+))?/.exec(l))) {
      const subject = m[2] ? `${m[2]}/24` : this.nexthops.get(m[1]!);
      if (m[2]) this.nexthops.set(m[1]!, `${m[2]}/24`);
      if (subject && (l.includes('flannel.1') || l.includes(' proto 88') || !m[2])) this.events.push({ t, deleted, kind: 'nexthop', subject, text: raw });
    } else if ((m = /^([0-9a-f]{2}(?::[0-9a-f]{2}){5}) dev flannel\.1 dst /.exec(l))) {
      this.events.push({ t, deleted, kind: 'fdb', subject: m[1]!, text: raw });
    } else if ((m = new RegExp(`^(${IPV4}) dev flannel\\.1 `).exec(l))) {
      this.events.push({ t, deleted, kind: 'neigh', subject: `${m[1]}/24`, text: raw });
    }
  }

  /** The first event of `kind` about `subject` at or after `since`. */
  first(kind: EntryKind, subject: string, deleted: boolean, since: number): KernelEvent | undefined {
    return this.events.find((e) => e.kind === kind && e.subject === subject && e.deleted === deleted && e.t >= since);
  }

  stop(): void {
    for (const p of this.procs) p.kill('SIGKILL');
  }
}

/** Polls GET `path` of a weftd from inside its namespace every 250 ms; every answer or failure is kept. */
export class HealthProbe {
  readonly samples: Array<{ t: number; status: string }> = [];
  private readonly proc: ChildProcess;

  constructor(
    readonly host: HostLike,
    readonly path = '/readyz',
    port = 8081,
  ) {
    const script =
      `(async()=>{for(;;){let s;try{const r=await fetch('http://127.0.0.1:${port}${path}',{signal:AbortSignal.timeout(5000)});` +
      "s=String(r.status);await r.text()}catch(e){s='error:'+(e&&e.name)}process.stdout.write(s+'\\n');" +
      'await new Promise(r=>setTimeout(r,250))}})()';
    this.proc = track(spawn('ip', ['netns', 'exec', host.ns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] }));
    let buf = '';
    this.proc.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      const lines = buf.split('\n');
      buf = lines.pop()!;
      for (const l of lines) this.samples.push({ t: Date.now(), status: l.trim() });
    });
  }

  get failures(): Array<{ t: number; status: string }> {
    return this.samples.filter((s) => s.status !== '200');
  }

  stop(): void {
    this.proc.kill('SIGKILL');
  }
}

let clockTicks: number | null = null;

/** CPU time (user + system) a process has used so far, in ms. */
export async function cpuMs(pid: number): Promise<number> {
  clockTicks ??= Number((await sh('getconf', ['CLK_TCK'])).trim());
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // After the command: state is field 3, utime 14, stime 15 (1-based over the whole line).
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / clockTicks;
}

export interface StoredPeer {
  readonly key: string;
  readonly subnet: string;
  readonly publicIP: string;
  readonly mac: string | null;
  /** The etcd lease ID (decimal text), '0' for none. */
  readonly etcdLease: string;
  readonly createRevision: string;
  readonly modRevision: string;
}

/** Every lease under the flannel prefix, as etcd has it. */
export async function storedLeases(etcdctl: (...args: string[]) => Promise<string>): Promise<StoredPeer[]> {
  const out = await etcdctl('get', '--prefix', SUBNETS_PREFIX, '-w', 'json');
  // int64 IDs and revisions: quoted before JSON.parse rounds them.
  const res = JSON.parse(out.replace(/":(\d{15,})/g, '":"$1"')) as {
    kvs?: Array<{ key: string; value: string; lease?: number | string; create_revision: number | string; mod_revision: number | string }>;
  };
  return (res.kvs ?? []).map((kv) => {
    const key = Buffer.from(kv.key, 'base64').toString();
    const v = JSON.parse(Buffer.from(kv.value, 'base64').toString()) as { PublicIP: string; BackendData?: { VtepMAC?: string } };
    const name = key.slice(SUBNETS_PREFIX.length);
    return {
      key,
      subnet: name.replace(/&.*$/, '').replace(/-(\d+)$/, '/$1'),
      publicIP: v.PublicIP,
      mac: v.BackendData?.VtepMAC ?? null,
      etcdLease: String(kv.lease ?? '0'),
      createRevision: String(kv.create_revision),
      modRevision: String(kv.mod_revision),
    };
  });
}

export interface KernelEntries {
  readonly neigh: string[];
  readonly fdb: string[];
  readonly routes: string[];
}

/** weft's vxlan entries on a host, as sorted text lines. */
export async function kernelEntries(h: HostLike): Promise<KernelEntries> {
  const lines = (t: string) => t.split('\n').map((l) => l.trim()).filter((l) => l !== '');
  const neigh = lines(await ipn(h.ns, 'neigh', 'show', 'dev', 'flannel.1', 'nud', 'permanent')).sort();
  const fdb = lines(await sh('bridge', ['-n', h.ns, 'fdb', 'show', 'dev', 'flannel.1'])).filter((l) => l.includes(' dst ')).sort();
  const routes = lines(await ipn(h.ns, 'route'))
    .filter((l) => l.includes(' proto 88'))
    .map((l) => l.replace(/nhid \d+ /, ''))
    .sort();
  return { neigh, fdb, routes };
}

/** The entries a host must have for the peers in `all` (everyone but itself). */
export function expectedEntries(h: HostLike, all: readonly StoredPeer[]): KernelEntries {
  const peers = all.filter((l) => l.publicIP !== h.underlayIP);
  return {
    neigh: peers.map((p) => `${p.subnet.split('/')[0]} lladdr ${p.mac} PERMANENT`).sort(),
    fdb: peers.map((p) => `${p.mac} dst ${p.publicIP} self permanent`).sort(),
    routes: peers.map((p) => `${p.subnet} via ${p.subnet.split('/')[0]} dev flannel.1 proto 88 onlink`).sort(),
  };
}

/** Hosts whose kernel entries differ from what etcd holds, with the first difference; [] when exact. */
export async function divergence(hosts: readonly HostLike[], etcdctl: (...args: string[]) => Promise<string>): Promise<string[]> {
  const all = await storedLeases(etcdctl);
  const out: string[] = [];
  for (const h of hosts) {
    const got = await kernelEntries(h);
    const want = expectedEntries(h, all);
    for (const k of ['routes', 'neigh', 'fdb'] as const) {
      const missing = want[k].filter((x) => !got[k].includes(x));
      const extra = got[k].filter((x) => !want[k].includes(x));
      if (missing.length + extra.length > 0) {
        out.push(`${h.ns} ${k}: ${missing.length} missing (${missing.slice(0, 2).join('; ')}), ${extra.length} extra (${extra.slice(0, 2).join('; ')})`);
      }
    }
  }
  return out;
}

export interface ProgrammingReport {
  /** Latency per (change, host): programmed − acknowledged, 0 when done before etcdctl returned. */
  readonly latencies: number[];
  /** The same from when the change was sent (etcdctl started; includes etcd's commit and the retries). */
  readonly fromSent: number[];
  /** Changes not programmed within the bound (or never), one line each. */
  readonly late: string[];
  /** Changes superseded within the bound by the deletion of the same lease (not timed). */
  readonly superseded: number;
}

/**
 * For every change in `ops`, on every monitored host, when its kernel entries were in place: a put
 * is programmed when its route, neighbour and FDB entry have all been added, a delete when every
 * one of them that had been added is gone. `now` is when the check runs: a change acknowledged less
 * than `boundMs` before it and not yet done is not counted late (call after the bound has passed).
 */
export function programming(ops: readonly LeaseOp[], writer: LeaseWriter, monitors: readonly KernelMonitor[], boundMs: number): ProgrammingReport {
  const latencies: number[] = [];
  const fromSent: number[] = [];
  const late: string[] = [];
  let superseded = 0;
  const kinds: Array<[EntryKind, (l: FakeLease) => string]> = [
    ['route', (l) => l.subnet],
    ['neigh', (l) => l.subnet],
    ['fdb', (l) => l.mac],
  ];
  for (const op of ops) {
    if (op.acked === 0) {
      late.push(`${op.kind} ${op.lease.subnet} never acknowledged by etcd`);
      continue;
    }
    const l = op.lease;
    for (const mon of monitors) {
      const where = `${mon.host.ns}: ${op.kind} ${l.subnet} (${op.phase}, acked at ${new Date(op.acked).toISOString().slice(11, 23)})`;
      if (op.kind === 'put') {
        const del = writer.delOf.get(l.subnet);
        if (del && del.sent <= op.acked + boundMs) {
          superseded++;
          continue;
        }
        const times = kinds.map(([k, subj]) => mon.first(k, subj(l), false, op.sent)?.t);
        if (times.some((t) => t === undefined)) {
          late.push(`${where}: never programmed (${kinds.filter((_, i) => times[i] === undefined).map(([k]) => k).join(', ')} missing)`);
          continue;
        }
        const done = Math.max(...(times as number[]));
        const lat = Math.max(0, done - op.acked);
        latencies.push(lat);
        fromSent.push(done - op.sent);
        if (lat > boundMs) late.push(`${where}: programmed after ${lat} ms`);
      } else {
        const put = writer.putOf.get(l.subnet)!;
        const seenPut = put.sent >= mon.startedAt;
        const times: number[] = [];
        const missing: string[] = [];
        for (const [k, subj] of kinds) {
          // Entries programmed before the monitor started were there (the scenario starts converged).
          const added = !seenPut || mon.first(k, subj(l), false, put.sent) !== undefined;
          if (!added) continue;
          const e = mon.first(k, subj(l), true, op.sent);
          if (e) times.push(e.t);
          else missing.push(k);
        }
        if (missing.length > 0) {
          late.push(`${where}: never removed (${missing.join(', ')} still there)`);
          continue;
        }
        const done = times.length === 0 ? op.sent : Math.max(...times);
        const lat = Math.max(0, done - op.acked);
        latencies.push(lat);
        fromSent.push(done - op.sent);
        if (lat > boundMs) late.push(`${where}: removed after ${lat} ms`);
      }
    }
  }
  return { latencies, fromSent, late, superseded };
}

/**
 * Deletions of entries that belonged to a live peer: any deletion of a real host's entry, and any
 * deletion of a fake lease's entry before its delete was sent. `realPeers` maps subnet and VTEP MAC
 * of every real host to its name.
 */
export function liveDeletions(writer: LeaseWriter, monitors: readonly KernelMonitor[], realPeers: ReadonlyMap<string, string>): string[] {
  const out: string[] = [];
  for (const mon of monitors) {
    for (const e of mon.events) {
      if (!e.deleted) continue;
      const real = realPeers.get(e.subject);
      if (real) {
        out.push(`${mon.host.ns}: ${e.kind} of ${real} deleted: ${e.text}`);
        continue;
      }
      const fake = e.kind === 'fdb' ? writer.byMac.get(e.subject) : writer.bySubnet.get(e.subject);
      const del = fake ? writer.delOf.get(fake.subnet) : undefined;
      if (!del || del.sent > e.t) out.push(`${mon.host.ns}: ${e.kind} deleted while its lease was in etcd: ${e.text}`);
    }
  }
  return out;
}

/** p-th percentile (0..100) of `xs`, NaN when empty. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

export interface ScenarioReport {
  readonly ops: LeaseOp[];
  /** The timed changes (all, unless finish() was given a filter). */
  readonly programming: ProgrammingReport;
  /** The changes finish()'s filter left untimed (only required to end up applied exactly). */
  readonly untimed: ProgrammingReport;
  /** Per change, ms from the ack until the first member delivered it to a bare watcher (NaN: none did). */
  readonly watchFloor: number[];
  readonly liveDeletions: string[];
  readonly probeSamples: number;
  readonly probeFailures: string[];
  /** Differences between kernel and etcd left at the end ([] when exact). */
  readonly divergence: string[];
  /** How long after the last acknowledged change the kernel matched etcd exactly, ms. */
  readonly exactAfterMs: number;
}

/**
 * One fault scenario's instruments on every host: a kernel monitor and a health probe each, and the
 * changes the writer makes from now on. finish() waits (bounded) until every change is programmed and
 * the kernel equals etcd, then reports.
 */
export class Scenario {
  private readonly firstOp: number;

  private constructor(
    readonly hosts: readonly HostLike[],
    readonly writer: LeaseWriter,
    private readonly etcdctl: (...args: string[]) => Promise<string>,
    readonly monitors: KernelMonitor[],
    readonly probes: HealthProbe[],
    readonly realPeers: Map<string, string>,
    readonly memberWatches: MemberWatches | null,
  ) {
    this.firstOp = writer.ops.length;
  }

  static async start(
    hosts: readonly HostLike[],
    writer: LeaseWriter,
    etcdctl: (...args: string[]) => Promise<string>,
    probePath = '/readyz',
    etcd: EtcdCluster | null = null,
  ): Promise<Scenario> {
    const realPeers = new Map<string, string>();
    for (const l of await storedLeases(etcdctl)) {
      const h = hosts.find((x) => x.underlayIP === l.publicIP);
      if (!h) continue;
      realPeers.set(l.subnet, h.ns);
      if (l.mac) realPeers.set(l.mac, h.ns);
    }
    const monitors: KernelMonitor[] = [];
    try {
      for (const h of hosts) monitors.push(await KernelMonitor.start(h));
    } catch (e) {
      for (const m of monitors) m.stop();
      throw e;
    }
    const probes = hosts.map((h) => new HealthProbe(h, probePath));
    const watches = etcd ? new MemberWatches(etcd, (await etcd.revision()) + 1n) : null;
    return new Scenario(hosts, writer, etcdctl, monitors, probes, realPeers, watches);
  }

  get ops(): LeaseOp[] {
    return this.writer.ops.slice(this.firstOp);
  }

  /**
   * Puts one fake lease and waits (up to `timeoutMs`, no bound asserted) until every host has
   * programmed it: how long after etcd's ack the slowest node caught up, in ms.
   */
  async catchUp(timeoutMs = 60_000): Promise<number> {
    const op = await this.writer.put();
    return waitFor(
      () => {
        const p = programming([op], this.writer, this.monitors, Infinity);
        return p.late.length === 0 && p.latencies.length === this.monitors.length ? Math.max(...p.latencies) : null;
      },
      { timeoutMs, what: `every host to program ${op.lease.subnet}` },
    );
  }

  /** Call with the writer stopped. Only the changes `timed` selects are held to the bound. */
  async finish(boundMs = 5000, timed: (o: LeaseOp) => boolean = () => true): Promise<ScenarioReport> {
    const ops = this.ops;
    const lastAck = Math.max(0, ...ops.map((o) => o.acked));
    // Done when every change is programmed; a change still missing after the bound is late.
    await waitFor(() => programming(ops, this.writer, this.monitors, boundMs).late.length === 0, {
      timeoutMs: Math.max(0, lastAck + boundMs + 500 - Date.now()),
      what: 'every change programmed',
    }).catch(() => undefined);
    let div: string[] = [];
    let exactAt = 0;
    await waitFor(
      async () => {
        div = await divergence(this.hosts, this.etcdctl);
        exactAt = Date.now();
        return div.length === 0;
      },
      { timeoutMs: 15_000, what: 'kernel entries equal to etcd on every host' },
    ).catch(() => undefined);
    // One more read with nothing changing: still exact.
    if (div.length === 0) div = await divergence(this.hosts, this.etcdctl);
    this.stop();
    const annotate = (p: ProgrammingReport): ProgrammingReport => {
      const w = this.memberWatches;
      if (!w) return p;
      // Each late change with when every member delivered it to a bare watcher (ms after the ack).
      const late = p.late.map((l) => {
        const op = ops.find((o) => l.includes(` ${o.kind} ${o.lease.subnet} `));
        return op ? `${l} [bare watch per member: ${w.lagText(op.revision, op.acked)}]` : l;
      });
      return { ...p, late };
    };
    const w = this.memberWatches;
    const floor = w
      ? ops.map((o) => {
          const ts = [...Array(w.size).keys()].map((i) => w.delivered(i, o.revision)).filter((t): t is number => t !== undefined);
          return ts.length ? Math.min(...ts) - o.acked : NaN;
        })
      : [];
    return {
      ops,
      programming: annotate(programming(ops.filter(timed), this.writer, this.monitors, boundMs)),
      untimed: annotate(programming(ops.filter((o) => !timed(o)), this.writer, this.monitors, boundMs)),
      watchFloor: floor,
      liveDeletions: liveDeletions(this.writer, this.monitors, this.realPeers),
      probeSamples: this.probes.reduce((n, p) => n + p.samples.length, 0),
      probeFailures: this.probes.flatMap((p) => p.failures.map((f) => `${p.host.ns} ${p.path} at ${new Date(f.t).toISOString().slice(11, 23)}: ${f.status}`)),
      divergence: div,
      exactAfterMs: div.length === 0 ? Math.max(0, exactAt - lastAck) : NaN,
    };
  }

  stop(): void {
    for (const m of this.monitors) m.stop();
    for (const p of this.probes) p.stop();
    this.memberWatches?.stop();
  }
}

/** `n changes, programmed p50/p99/max a/b/c ms` */
export function latencySummary(r: ScenarioReport): string {
  const l = r.programming.latencies;
  const s = r.programming.fromSent;
  const sup = r.programming.superseded > 0 ? `, ${r.programming.superseded} superseded` : '';
  const f = r.watchFloor.filter((x) => !Number.isNaN(x));
  const floor = r.watchFloor.length ? `; bare etcd watch p99/max ${percentile(f, 99)}/${f.length ? Math.max(...f) : NaN} ms` : '';
  const probes = r.probeFailures.length ? `; probe failures ${r.probeFailures.length}/${r.probeSamples}, first ${r.probeFailures[0]}` : '';
  return (
    `${r.ops.length} changes${sup}, on every node after etcd's ack p50/p99/max ${percentile(l, 50)}/${percentile(l, 99)}/${l.length ? Math.max(...l) : NaN} ms ` +
    `(after sending ${percentile(s, 50)}/${percentile(s, 99)}/${s.length ? Math.max(...s) : NaN} ms${floor})${probes}`
  );
}

export interface LeaseHolder extends HostLike {
  readonly subnetFile: string;
}

export interface HeldLease {
  readonly stored: StoredPeer;
  readonly env: string;
}

/** Each host's one lease as etcd has it, and its subnet.env, by namespace. */
export async function heldLeases(hosts: readonly LeaseHolder[], etcdctl: (...args: string[]) => Promise<string>): Promise<Map<string, HeldLease>> {
  const all = await storedLeases(etcdctl);
  const out = new Map<string, HeldLease>();
  for (const h of hosts) {
    const mine = all.filter((l) => l.publicIP === h.underlayIP);
    assert.equal(mine.length, 1, `${h.ns} holds ${mine.length} leases: ${mine.map((l) => l.key).join(', ')}`);
    out.set(h.ns, { stored: mine[0]!, env: readFileSync(h.subnetFile, 'utf8') });
  }
  return out;
}

/**
 * No lease lost or duplicated: every host keeps the same key on the same etcd lease (same creation
 * revision) and the same subnet.env, no subnet is leased twice, and the fakes in etcd are exactly
 * the writer's live ones (every acknowledged change is there, nothing else).
 */
export async function assertLeasesKept(
  hosts: readonly LeaseHolder[],
  etcdctl: (...args: string[]) => Promise<string>,
  before: ReadonlyMap<string, HeldLease>,
  writer: LeaseWriter,
): Promise<void> {
  const after = await heldLeases(hosts, etcdctl);
  for (const h of hosts) {
    const [b, a] = [before.get(h.ns)!, after.get(h.ns)!];
    assert.deepEqual([a.stored.key, a.stored.etcdLease, a.stored.createRevision], [b.stored.key, b.stored.etcdLease, b.stored.createRevision], `${h.ns} kept its lease`);
    assert.equal(a.env, b.env, `${h.ns} subnet.env unchanged`);
  }
  const all = await storedLeases(etcdctl);
  const subnets = all.map((l) => l.subnet);
  assert.equal(new Set(subnets).size, subnets.length, `a subnet leased twice: ${subnets.join(' ')}`);
  const fakes = all.filter((l) => !hosts.some((h) => h.underlayIP === l.publicIP)).map((l) => l.subnet).sort();
  assert.deepEqual(fakes, [...writer.live.keys()].sort(), 'etcd holds exactly the fake leases whose puts were acknowledged and deletes were not');
}

/** The invariants every scenario shares (assert after printing its figures). */
export function assertReport(r: ScenarioReport, boundMs: number, opts: { ready?: boolean } = {}): void {
  assert.deepEqual(r.liveDeletions.slice(0, 10), [], 'no entry of a live peer deleted');
  assert.deepEqual(r.programming.late.slice(0, 10), [], `every change programmed on every node within ${boundMs} ms of etcd acknowledging it`);
  assert.deepEqual(r.divergence, [], 'kernel entries equal to etcd on every host');
  if (opts.ready ?? true) assert.deepEqual(r.probeFailures.slice(0, 5), [], 'every weftd answered its probe throughout');
  assert.ok(r.probeSamples > 0, 'the probes ran');
}

/**
 * A bare `etcdctl watch` of the lease prefix on each member alone (from the underlay), restarted
 * from where it stopped when its member goes away: when each member delivered each revision to a
 * watcher. The floor weftd's watch is measured against — a member that lags or is cut off shows here.
 */
export class MemberWatches {
  private readonly seen: Array<Array<{ t: number; rev: bigint }>> = [];
  private readonly procs = new Set<ChildProcess>();
  private running = true;

  constructor(
    private readonly etcd: EtcdCluster,
    fromRevision: bigint,
  ) {
    for (let i = 0; i < etcd.size; i++) {
      this.seen.push([]);
      this.watch(i, fromRevision);
    }
  }

  private watch(i: number, from: bigint): void {
    if (!this.running) return;
    const m = this.etcd.member(i);
    const p = track(
      spawn(
        'ip',
        ['netns', 'exec', this.etcd.underlayNs, 'env', 'ETCDCTL_API=3', 'etcdctl', '--endpoints', m.url, '--dial-timeout', '2s',
          'watch', '--prefix', SUBNETS_PREFIX, '--rev', String(from), '-w', 'json'],
        { stdio: ['ignore', 'pipe', 'ignore'] },
      ),
    );
    this.procs.add(p);
    const seen = this.seen[i]!;
    onTimedLines(p, (t, l) => {
      let max = seen.at(-1)?.rev ?? 0n;
      for (const r of l.matchAll(/"mod_revision":(\d+)/g)) if (BigInt(r[1]!) > max) max = BigInt(r[1]!);
      if (max > (seen.at(-1)?.rev ?? 0n)) seen.push({ t, rev: max });
    });
    p.once('exit', () => {
      this.procs.delete(p);
      const next = (seen.at(-1)?.rev ?? from - 1n) + 1n;
      // Re-watch pace of an instrument whose member went away, not a wait for state.
      if (this.running) setTimeout(() => this.watch(i, next > from ? next : from), 500);
    });
  }

  get size(): number {
    return this.seen.length;
  }

  /** When member i delivered `rev` (or later) to its bare watcher; undefined: not (yet). */
  delivered(i: number, rev: bigint): number | undefined {
    return this.seen[i]!.find((s) => s.rev >= rev)?.t;
  }

  /** Per member, ms from `acked` until it delivered `rev` ('-' when it never did). */
  lagText(rev: bigint, acked: number): string {
    return this.seen.map((_, i) => {
      const t = this.delivered(i, rev);
      return `e${i + 1} ${t === undefined ? '-' : `${t - acked}`}`;
    }).join(' ');
  }

  /**
   * Restarts every bare watch from where it was: etcdctl's gRPC reconnect backs off up to minutes
   * after a long outage, which would make the floor meaningless once the members are back.
   */
  kick(): void {
    for (const p of this.procs) p.kill('SIGKILL');
  }

  stop(): void {
    this.running = false;
    for (const p of this.procs) p.kill('SIGKILL');
  }
}

/** Each whole line of `p`'s stdout with the time its chunk arrived (Date.now()). */
function onTimedLines(p: ChildProcess, each: (t: number, line: string) => void): void {
  let buf = '';
  p.stdout!.on('data', (d: Buffer) => {
    const t = Date.now();
    buf += d.toString();
    const lines = buf.split('\n');
    buf = lines.pop()!;
    for (const l of lines) each(t, l);
  });
}
