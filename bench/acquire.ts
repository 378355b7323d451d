// Lease-acquisition benchmark: N nodes acquire a lease from one etcd at the same moment, each
// with its own etcd client and TCP connection (as in a real cluster), spread over K worker
// processes that connect first and start together on a "go" message. Next to it, the store's
// own floor for the same work, N concurrent "grant a 24 h lease + create-if-absent txn on a
// distinct key" with etcd3, and the same plus a listing (weft's three round trips).
//
//   node --import=tsx bench/acquire.ts [--nodes 1000] [--workers K] [--runs 1] [--cold]
//        [--connections node|process] [--cpu-prof DIR]
//   (or BENCH_NODES / BENCH_WORKERS / BENCH_RUNS / BENCH_COLD=1 / BENCH_CONNECTIONS / BENCH_CPU_PROF)
import { fork, execFile, type ChildProcess } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { availableParallelism, loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';
import { Etcd3 } from 'etcd3';
import { decodeLeaseAttrs, parseSubnetKey } from '../src/subnet/codec.js';
import { EtcdSubnetManager } from '../src/subnet/etcd/manager.js';
import { IPAddr, type IPNet } from '../src/util/ip.js';
import { createLogger, type Logger } from '../src/util/log.js';
import { EtcdServer } from '../test/helpers/etcd.js';

const CONFIG = '{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"alloc"}}';
const LEASE_TTL = 24 * 3600;
const PHASE_TIMEOUT_MS = 180_000;

/** weft: EtcdSubnetManager.acquireLease; raw: grant + create txn; raw-list: list + grant + create txn. */
type Phase = 'weft' | 'raw' | 'raw-list';

interface Setup {
  readonly type: 'setup';
  readonly phase: Phase;
  readonly endpoint: string;
  readonly prefix: string;
  /** Node indices [first, first + count) run in this worker. */
  readonly first: number;
  readonly count: number;
  /** Do not connect before "go": the measured time then includes gRPC connection setup and the config read. */
  readonly cold: boolean;
  /** Write a CPU profile of the measured part of the phase to this file. */
  readonly profile: string | null;
  readonly connections: Connections;
}

/**
 * node: one TCP connection per node, as in a real cluster. process: grpc-js's default, where
 * every etcd3 client of a process shares one connection (its global subchannel pool keys
 * connections by address, credentials and channel options, which are all equal here).
 */
type Connections = 'node' | 'process';

/** etcd3 client options giving this node its own connection: a channel option no other client has. */
function connectionOptions(s: Setup, node: number): { grpcOptions?: Record<string, number> } {
  return s.connections === 'node' ? { grpcOptions: { 'weft.bench.node': node } } : {};
}
type ParentMsg = Setup | { readonly type: 'go' } | { readonly type: 'exit' };

/** One node's acquisition, measured inside its worker from "go" to the promise resolving. */
interface NodeResult {
  readonly node: number;
  readonly error: string | null;
  readonly ms: number;
  /** Absolute wall-clock ms (performance.timeOrigin based), comparable across processes. */
  readonly startAt: number;
  readonly endAt: number;
  readonly retries: number;
  readonly subnet: string | null;
  /** Time spent awaiting each store call during the acquisition (weft only). */
  readonly calls: CallStats | null;
}

interface CallStats {
  configMs: number;
  lists: number;
  listMs: number;
  /** Number of leases the first listing returned, and the most any listing returned. */
  listFirst: number;
  listMax: number;
  grants: number;
  grantMs: number;
  creates: number;
  createMs: number;
  /** From "go" to the first store call: time the node waited for its own worker's CPU. */
  firstCallMs: number;
}

interface WorkerStats {
  /** Worker CPU time (user + system) during the phase, ms. */
  readonly cpuMs: number;
  readonly loopDelayP99Ms: number;
  readonly loopDelayMaxMs: number;
}

type WorkerMsg =
  | { readonly type: 'ready'; readonly sockets: number }
  | { readonly type: 'done'; readonly results: NodeResult[]; readonly stats: WorkerStats }
  | { readonly type: 'failed'; readonly message: string };

class BenchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BenchError';
  }
}

const now = (): number => performance.timeOrigin + performance.now();

function nodeIP(i: number): IPAddr {
  const n = i + 1; // 10.0.0.1, 10.0.0.2, ...: one distinct public IP per node
  return IPAddr.parse(`10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n & 255}`);
}

// ---------------------------------------------------------------------------------------------
// Worker side

function finish(node: number, go: number, r: Pick<NodeResult, 'error' | 'retries' | 'subnet' | 'calls'>): NodeResult {
  const end = now();
  return { node, ms: end - go, startAt: go, endAt: end, ...r };
}

interface Participant {
  warm(): Promise<void>;
  acquire(goAt: number): Promise<NodeResult>;
  close(): Promise<void>;
}

let sharedLogger: Logger | null = null;

function weftParticipant(s: Setup, node: number): Participant {
  // One logger for all nodes of a worker: 1000 winston instances would only measure winston.
  sharedLogger ??= createLogger({ level: 'error' });
  const m = EtcdSubnetManager.connect({
    endpoints: [s.endpoint],
    prefix: s.prefix,
    knownBackends: ['alloc'],
    logger: sharedLogger,
    ...connectionOptions(s, node),
  });
  // Time every store call of the acquisition by wrapping the registry instance's methods.
  const st: CallStats = {
    configMs: 0,
    lists: 0,
    listMs: 0,
    listFirst: -1,
    listMax: 0,
    grants: 0,
    grantMs: 0,
    creates: 0,
    createMs: 0,
    firstCallMs: -1,
  };
  let goAt = 0;
  let measuring = false;
  const r = m.registry;
  const timed = async <T>(fn: () => Promise<T>, done: (ms: number, v: T) => void): Promise<T> => {
    const t = now();
    if (measuring && st.firstCallMs < 0) st.firstCallMs = t - goAt;
    const v = await fn();
    if (measuring) done(now() - t, v);
    return v;
  };
  const getConfig = r.getConfig.bind(r);
  const list = r.list.bind(r);
  const grant = r.grant.bind(r);
  const create = r.create.bind(r);
  r.getConfig = () => timed(getConfig, (ms) => (st.configMs += ms));
  r.list = () =>
    timed(list, (ms, v) => {
      st.lists++;
      st.listMs += ms;
      if (st.listFirst < 0) st.listFirst = v.leases.length;
      st.listMax = Math.max(st.listMax, v.leases.length);
    });
  r.grant = (ttl) =>
    timed(
      () => grant(ttl),
      (ms) => {
        st.grants++;
        st.grantMs += ms;
      },
    );
  r.create = (...args) =>
    timed(
      () => create(...args),
      (ms) => {
        st.creates++;
        st.createMs += ms;
      },
    );
  return {
    // What the daemon does before acquiring: read the network config (this also opens the connection).
    warm: async () => {
      await m.getNetworkConfig();
    },
    acquire: async (go) => {
      goAt = go;
      measuring = true;
      try {
        const got = await m.acquireLease({ publicIP: nodeIP(node), publicIPv6: null });
        return finish(node, go, { error: null, retries: got.retries, subnet: String(got.lease.subnet), calls: st });
      } catch (e) {
        return finish(node, go, { error: (e as Error).message, retries: -1, subnet: null, calls: st });
      } finally {
        measuring = false;
      }
    },
    close: () => m.close(),
  };
}

/** The store's floor: the same writes on a distinct key, no allocation; with `list`, weft's three round trips. */
function rawParticipant(s: Setup, node: number, list: boolean): Participant {
  const c = new Etcd3({ hosts: [s.endpoint], dialTimeout: 3000, ...connectionOptions(s, node) });
  const subnet = `10.${(node >> 8) & 255}.${node & 255}.0`; // distinct key per node, no allocation
  const key = `${s.prefix}/subnets/${subnet}-24`;
  const value = JSON.stringify({ PublicIP: nodeIP(node).toString(), PublicIPv6: null });
  return {
    warm: async () => {
      await c.get(`${s.prefix}/config`).string();
    },
    acquire: async (go) => {
      try {
        // Cold: connect and read the config inside the measured time, as weft's acquireLease then does.
        if (s.cold) await c.get(`${s.prefix}/config`).string();
        if (list) await c.getAll().prefix(`${s.prefix}/subnets/`).exec();
        const lease = await c.leaseClient.leaseGrant({ TTL: LEASE_TTL, ID: 0 });
        const res = await c
          .if(key, 'Create', '==', 0)
          .then(c.put(key).value(value).lease(lease.ID))
          .commit();
        if (!res.succeeded) {
          return finish(node, go, { error: `create-if-absent on ${key} lost`, retries: 0, subnet: null, calls: null });
        }
        return finish(node, go, { error: null, retries: 0, subnet: `${subnet}/24`, calls: null });
      } catch (e) {
        return finish(node, go, { error: (e as Error).message, retries: -1, subnet: null, calls: null });
      }
    },
    close: async () => c.close(),
  };
}

/** Open sockets of this process (the IPC channel to the parent is one). */
function socketCount(): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('socket:')) n++;
    } catch {
      // closed between listing and reading
    }
  }
  return n;
}

async function startProfile(): Promise<Session> {
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.start');
  return session;
}

async function stopProfile(session: Session, file: string): Promise<void> {
  const { profile } = await session.post('Profiler.stop');
  writeFileSync(file, JSON.stringify(profile));
  session.disconnect();
}

function runWorker(): void {
  const send = (m: WorkerMsg): void => {
    process.send?.(m);
  };
  let parts: Participant[] = [];
  let profile: string | null = null;
  // The parent is gone (Ctrl-C, crash): nothing left to report to.
  process.on('disconnect', () => process.exit(1));
  process.on('message', (raw: ParentMsg) => {
    void (async () => {
      try {
        if (raw.type === 'setup') {
          const setup = raw;
          const make = (i: number): Participant =>
            setup.phase === 'weft' ? weftParticipant(setup, i) : rawParticipant(setup, i, setup.phase === 'raw-list');
          parts = Array.from({ length: raw.count }, (_, i) => make(raw.first + i));
          profile = raw.profile;
          if (!raw.cold) await Promise.all(parts.map((p) => p.warm()));
          send({ type: 'ready', sockets: socketCount() });
        } else if (raw.type === 'go') {
          const session = profile ? await startProfile() : null;
          const go = now();
          const cpu0 = process.cpuUsage();
          const loop = monitorEventLoopDelay({ resolution: 10 });
          loop.enable();
          const results = await Promise.all(parts.map((p) => p.acquire(go)));
          loop.disable();
          const cpu = process.cpuUsage(cpu0);
          if (session && profile) await stopProfile(session, profile);
          await Promise.all(parts.map((p) => p.close()));
          parts = [];
          const stats = {
            cpuMs: (cpu.user + cpu.system) / 1000,
            loopDelayP99Ms: loop.percentile(99) / 1e6,
            loopDelayMaxMs: loop.max / 1e6,
          };
          send({ type: 'done', results, stats });
        } else {
          process.exit(0);
        }
      } catch (e) {
        send({ type: 'failed', message: (e as Error).stack ?? String(e) });
      }
    })();
  });
}

// ---------------------------------------------------------------------------------------------
// Parent side

interface Options {
  readonly nodes: number;
  readonly workers: number;
  readonly runs: number;
  readonly cold: boolean;
  readonly profileDir: string | null;
  readonly connections: Connections;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      nodes: { type: 'string' },
      workers: { type: 'string' },
      runs: { type: 'string' },
      cold: { type: 'boolean' },
      'cpu-prof': { type: 'string' },
      connections: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: node --import=tsx bench/acquire.ts [--nodes N] [--workers K] [--runs R] [--cold]\n' +
        '         [--connections node|process] [--cpu-prof DIR]\n',
    );
    process.exit(0);
  }
  const int = (v: string | undefined, env: string, dflt: number, min: number): number => {
    const text = v ?? process.env[env];
    if (text === undefined || text === '') return dflt;
    const n = Number(text);
    if (!Number.isInteger(n) || n < min) {
      throw new BenchError(`${env.toLowerCase().replace('bench_', '--')} must be an integer >= ${min}, got "${text}"`);
    }
    return n;
  };
  const nodes = int(values.nodes, 'BENCH_NODES', 1000, 1);
  if (nodes > 65_535) throw new BenchError(`--nodes ${nodes}: the 10.0.0.0/8 network has only 65535 /24 subnets`);
  // Leave one core to etcd; measured on 2 cores, one client process beats two (less contention
  // with etcd, one JIT warm-up instead of two).
  const workers = Math.min(nodes, int(values.workers, 'BENCH_WORKERS', Math.max(1, availableParallelism() - 1), 1));
  const runs = int(values.runs, 'BENCH_RUNS', 1, 1);
  const cold = values.cold === true || process.env.BENCH_COLD === '1';
  const profileDir = values['cpu-prof'] ?? process.env.BENCH_CPU_PROF ?? null;
  if (profileDir) mkdirSync(profileDir, { recursive: true });
  const connections = values.connections ?? process.env.BENCH_CONNECTIONS ?? 'node';
  if (connections !== 'node' && connections !== 'process') {
    throw new BenchError(`--connections must be "node" or "process", got "${connections}"`);
  }
  return { nodes, workers, runs, cold, connections, profileDir: profileDir ? resolve(profileDir) : null };
}

class Worker {
  private readonly child: ChildProcess;
  private waiting: { resolve: (m: WorkerMsg) => void; reject: (e: Error) => void } | null = null;

  constructor(readonly index: number) {
    this.child = fork(fileURLToPath(import.meta.url), ['--worker'], {
      execArgv: [`--import=${import.meta.resolve('tsx')}`],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    this.child.on('message', (m: WorkerMsg) => {
      const w = this.waiting;
      this.waiting = null;
      if (!w) return;
      if (m.type === 'failed') w.reject(new BenchError(`worker ${index}: ${m.message}`));
      else w.resolve(m);
    });
    this.child.on('exit', (code, sig) => {
      const w = this.waiting;
      this.waiting = null;
      w?.reject(new BenchError(`worker ${index} exited (${sig ?? code})`));
    });
  }

  /** Sends a message and waits for the worker's answer. */
  request(m: ParentMsg): Promise<WorkerMsg> {
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      this.child.send(m);
    });
  }

  exit(): void {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    if (this.child.connected) this.child.send({ type: 'exit' } satisfies ParentMsg);
    // By PID, in case it does not listen any more.
    setTimeout(() => this.child.kill('SIGKILL'), 5000).unref();
  }
}

interface PhaseResult {
  readonly results: NodeResult[];
  readonly stats: WorkerStats[];
  /** etcd CPU time (user + system) during the phase, ms. */
  readonly etcdCpuMs: number;
  /** Growth of etcd's own counters during the phase. */
  readonly etcdMetrics: EtcdMetrics;
  /** Sockets the workers had open at "go" (their etcd connections). */
  readonly sockets: number;
  /** CPU time all processes on the machine used during the phase, and the wall time it spanned, ms. */
  readonly machineBusyMs: number;
  readonly machineWallMs: number;
  readonly wallMs: number;
}

/** The etcd counters that show how writes were batched onto disk. */
interface EtcdMetrics {
  proposals: number;
  walFsyncs: number;
  walFsyncSeconds: number;
  backendCommits: number;
  backendCommitSeconds: number;
}

const METRIC_NAMES: Record<keyof EtcdMetrics, string> = {
  proposals: 'etcd_server_proposals_committed_total',
  walFsyncs: 'etcd_disk_wal_fsync_duration_seconds_count',
  walFsyncSeconds: 'etcd_disk_wal_fsync_duration_seconds_sum',
  backendCommits: 'etcd_disk_backend_commit_duration_seconds_count',
  backendCommitSeconds: 'etcd_disk_backend_commit_duration_seconds_sum',
};

async function etcdMetrics(endpoint: string): Promise<EtcdMetrics> {
  const text = await (await fetch(`${endpoint}/metrics`)).text();
  const out: EtcdMetrics = { proposals: 0, walFsyncs: 0, walFsyncSeconds: 0, backendCommits: 0, backendCommitSeconds: 0 };
  for (const line of text.split('\n')) {
    const [name, value] = line.split(' ');
    for (const [k, n] of Object.entries(METRIC_NAMES) as Array<[keyof EtcdMetrics, string]>) {
      if (name === n) out[k] = Number(value);
    }
  }
  return out;
}

function metricsDelta(a: EtcdMetrics, b: EtcdMetrics): EtcdMetrics {
  return {
    proposals: b.proposals - a.proposals,
    walFsyncs: b.walFsyncs - a.walFsyncs,
    walFsyncSeconds: b.walFsyncSeconds - a.walFsyncSeconds,
    backendCommits: b.backendCommits - a.backendCommits,
    backendCommitSeconds: b.backendCommitSeconds - a.backendCommitSeconds,
  };
}

/** CPU time (utime + stime) of a process, ms, from /proc. */
function procCpuMs(pid: number | undefined): number {
  if (pid === undefined) return 0;
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = Number(fields[11]) + Number(fields[12]); // utime, stime (fields 14 and 15)
  return (ticks * 1000) / 100; // USER_HZ is 100 on Linux
}

/** Busy and total CPU time of the whole machine (all cores), ms, from /proc/stat. */
function machineCpuMs(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '';
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  const total = v.reduce((a, b) => a + b, 0);
  const idle = (v[3] ?? 0) + (v[4] ?? 0); // idle + iowait
  return { busy: ((total - idle) * 1000) / 100, total: (total * 1000) / 100 };
}

async function withTimeout<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new BenchError(`${what} took longer than ${PHASE_TIMEOUT_MS / 1000} s`)), PHASE_TIMEOUT_MS);
  });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

async function runPhase(
  workers: Worker[],
  opts: Options,
  etcd: EtcdServer,
  phase: Phase,
  prefix: string,
  run: number,
): Promise<PhaseResult> {
  const per = Math.ceil(opts.nodes / workers.length);
  const ready = await withTimeout(
    Promise.all(
      workers.map((w, i) => {
        const first = i * per;
        const count = Math.max(0, Math.min(per, opts.nodes - first));
        const profile = opts.profileDir ? join(opts.profileDir, `run${run}-${phase}-worker${i}.cpuprofile`) : null;
        const { cold, connections } = opts;
        return w.request({ type: 'setup', phase, endpoint: etcd.endpoint, prefix, first, count, cold, profile, connections });
      }),
    ),
    `${phase}: connecting`,
  );
  // Less one per worker for the IPC channel to us.
  const sockets = ready.reduce((n, m) => n + (m.type === 'ready' ? m.sockets - 1 : 0), 0);
  const m0 = await etcdMetrics(etcd.endpoint);
  const cpu0 = procCpuMs(etcd.pid);
  const mach0 = machineCpuMs();
  const t0 = now();
  const answers = await withTimeout(Promise.all(workers.map((w) => w.request({ type: 'go' }))), `${phase}: acquiring`);
  const etcdCpuMs = procCpuMs(etcd.pid) - cpu0;
  const mach1 = machineCpuMs();
  const m1 = await etcdMetrics(etcd.endpoint);
  const results: NodeResult[] = [];
  const stats: WorkerStats[] = [];
  for (const a of answers) {
    if (a.type !== 'done') throw new BenchError(`unexpected worker answer ${a.type}`);
    results.push(...a.results);
    stats.push(a.stats);
  }
  // Total: from the first worker's "go" to the last node done; falls back to the parent's view.
  const start = Math.min(...results.map((r) => r.startAt));
  const end = Math.max(...results.map((r) => r.endAt));
  return { results, stats, etcdCpuMs, etcdMetrics: metricsDelta(m0, m1),
    sockets,
    machineBusyMs: mach1.busy - mach0.busy,
    machineWallMs: mach1.total - mach0.total,
    wallMs: results.length > 0 ? end - start : now() - t0 };
}

interface Check {
  readonly keys: number;
  readonly distinct: number;
  readonly duplicates: number;
  readonly problems: string[];
}

/** Reads back `<prefix>/subnets/` and checks it against what the nodes said they got. */
async function verify(client: Etcd3, prefix: string, results: readonly NodeResult[], weft: boolean): Promise<Check> {
  const kvs = await client.getAll().prefix(`${prefix}/subnets/`).strings();
  const problems: string[] = [];
  const nets: Array<{ net: IPNet; key: string }> = [];
  const byIP = new Map<string, string>();
  for (const [key, value] of Object.entries(kvs)) {
    const { subnet } = parseSubnetKey(key.slice(`${prefix}/subnets/`.length));
    nets.push({ net: subnet, key });
    const ip = decodeLeaseAttrs(value).publicIP.toString();
    if (byIP.has(ip)) problems.push(`public IP ${ip} holds two keys: ${byIP.get(ip)} and ${key}`);
    byIP.set(ip, subnet.toString());
  }
  // Overlaps: sorted by first address, each subnet must start after the previous one ends.
  nets.sort((a, b) => (a.net.first < b.net.first ? -1 : a.net.first > b.net.first ? 1 : 0));
  let duplicates = 0;
  for (let i = 1; i < nets.length; i++) {
    if (nets[i - 1]!.net.last >= nets[i]!.net.first) {
      duplicates++;
      problems.push(`overlapping keys ${nets[i - 1]!.key} and ${nets[i]!.key}`);
    }
  }
  // What each node was told must be what the store holds for its public IP, and nobody else's.
  const told = new Map<string, number>();
  for (const r of results) {
    if (r.subnet === null) continue;
    const prev = told.get(r.subnet);
    if (prev !== undefined) {
      duplicates++;
      problems.push(`nodes ${prev} and ${r.node} were both given ${r.subnet}`);
    }
    told.set(r.subnet, r.node);
    if (weft) {
      const stored = byIP.get(nodeIP(r.node).toString());
      if (stored !== r.subnet) problems.push(`node ${r.node} was given ${r.subnet} but the store has ${stored ?? 'nothing'}`);
    }
  }
  const distinct = new Set(nets.map((n) => n.net.toString())).size;
  return { keys: nets.length, distinct, duplicates, problems };
}

function pct(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

const fmt = (n: number): string => (Number.isFinite(n) ? n.toFixed(0) : '-');

function row(cols: ReadonlyArray<string | number>, widths: readonly number[]): string {
  return cols.map((c, i) => String(c).padEnd(widths[i] ?? 10)).join(' ').trimEnd();
}

const WIDTHS = [32, 9, 11, 11, 7, 7, 7, 9];
const HEADER = row(['', 'acquired', 'duplicates', 'lost-races', 'p50 ms', 'p99 ms', 'max ms', 'total ms'], WIDTHS);

function summaryRow(label: string, p: PhaseResult, check: Check): string {
  const ok = p.results.filter((r) => r.error === null);
  const ms = ok.map((r) => r.ms).sort((a, b) => a - b);
  const races = ok.reduce((s, r) => s + r.retries, 0);
  const max = ms[ms.length - 1] ?? NaN;
  return row(
    [label, ok.length, check.duplicates, races, fmt(pct(ms, 50)), fmt(pct(ms, 99)), fmt(max), fmt(p.wallMs)],
    WIDTHS,
  );
}

/** Where the weft time goes: per-node time awaiting each store call, and CPU of each side. */
function breakdown(weft: PhaseResult, raws: ReadonlyArray<[string, PhaseResult]>): string[] {
  const calls = weft.results.map((r) => r.calls).filter((c): c is CallStats => c !== null);
  const dist = (f: (c: CallStats) => number): string => {
    const v = calls.map(f).sort((a, b) => a - b);
    return `p50 ${fmt(pct(v, 50))} / p99 ${fmt(pct(v, 99))} / max ${fmt(v[v.length - 1] ?? NaN)}`;
  };
  const retriesHist = new Map<number, number>();
  for (const r of weft.results) if (r.error === null) retriesHist.set(r.retries, (retriesHist.get(r.retries) ?? 0) + 1);
  const hist = [...retriesHist.entries()].sort((a, b) => a[0] - b[0]).map(([k, v]) => `${k}:${v}`).join(' ');
  const cpu = (p: PhaseResult): string => {
    const m = p.etcdMetrics;
    const ours = p.etcdCpuMs + p.stats.reduce((a, s) => a + s.cpuMs, 0);
    return (
      `${p.sockets} sockets open at go; machine CPU busy ${fmt((100 * p.machineBusyMs) / Math.max(1, p.machineWallMs))}% ` +
      `(ours ${fmt(ours)} ms, other processes ~${fmt(Math.max(0, p.machineBusyMs - ours))} ms); ` +
      `CPU etcd ${fmt(p.etcdCpuMs)} ms, workers ${p.stats.map((s) => fmt(s.cpuMs)).join('+')} ms; ` +
      `worker event-loop delay p99 ${p.stats.map((s) => fmt(s.loopDelayP99Ms)).join('/')} ms, ` +
      `max ${p.stats.map((s) => fmt(s.loopDelayMaxMs)).join('/')} ms; ` +
      `etcd ${m.proposals} raft proposals in ${m.walFsyncs} WAL fsyncs (${fmt(m.walFsyncSeconds * 1000)} ms), ` +
      `${m.backendCommits} backend commits (${fmt(m.backendCommitSeconds * 1000)} ms)`
    );
  };
  const total = calls.reduce((s, c) => s + c.lists + c.grants + c.creates, 0);
  return [
    '  weft, per node (ms awaiting each store call, summed over retries):',
    `    go -> first call   ${dist((c) => c.firstCallMs)}`,
    ...(calls.some((c) => c.configMs > 0) ? [`    get config         ${dist((c) => c.configMs)}`] : []),
    `    list               ${dist((c) => c.listMs)}`,
    `    leases in listing  first: ${dist((c) => c.listFirst)}; any: max ${Math.max(0, ...calls.map((c) => c.listMax))}`,
    `    grant              ${dist((c) => c.grantMs)}`,
    `    create txn         ${dist((c) => c.createMs)}`,
    `    store calls        ${total} in all (${(total / Math.max(1, calls.length)).toFixed(2)} per node); ` +
      `nodes by lost races ${hist}`,
    `  during weft${' '.repeat(9)}${cpu(weft)}`,
    ...raws.map(([label, p]) => `  during ${label.padEnd(13)}${cpu(p)}`),
  ];
}

async function etcdVersion(): Promise<string> {
  const { stdout } = await promisify(execFile)('etcd', ['--version']);
  return stdout.split('\n')[0] ?? '';
}

async function main(): Promise<void> {
  const opts = options();
  let etcd: EtcdServer | null = null;
  let workers: Worker[] = [];
  let client: Etcd3 | null = null;
  let cleaning: Promise<void> | null = null;
  const cleanup = (): Promise<void> =>
    (cleaning ??= (async () => {
      for (const w of workers) w.exit();
      workers = [];
      client?.close();
      await etcd?.destroy();
    })());
  process.once('SIGINT', () => {
    process.stderr.write('\ninterrupted: stopping etcd and workers\n');
    void cleanup().finally(() => process.exit(130));
  });
  process.once('SIGTERM', () => void cleanup().finally(() => process.exit(143)));

  const conns =
    opts.connections === 'node'
      ? `${opts.nodes} TCP connections (one per node)`
      : `${opts.workers} TCP connection(s) (one per process, shared by its clients)`;
  const temperature = opts.cold
    ? 'cold (connect + config read inside the measured time)'
    : 'warm (connected, config read before "go")';
  let failed = false;
  try {
    process.stdout.write(
      `machine: nproc ${availableParallelism()}, ${await etcdVersion()}, node ${process.version}, ` +
        `load average ${loadavg().map((l) => l.toFixed(2)).join(' ')}\n` +
        `setup: ${opts.nodes} nodes, ${opts.nodes} etcd clients (one per node) in ${opts.workers} worker process(es), ` +
        `${conns}, ${temperature}\n`,
    );
    const server = (etcd = await EtcdServer.start());
    client = new Etcd3({ hosts: [server.endpoint] });
    for (let run = 1; run <= opts.runs; run++) {
      const weftPrefix = `/bench${run}/weft/coreos.com/network`;
      const rawPrefix = `/bench${run}/raw/coreos.com/network`;
      const rawListPrefix = `/bench${run}/raw-list/coreos.com/network`;
      for (const p of [weftPrefix, rawPrefix, rawListPrefix]) await client.put(`${p}/config`).value(CONFIG);
      // Fresh worker processes for every phase: each starts as cold (JIT, gRPC channels) as a new node daemon.
      const phase = async (ph: Phase, prefix: string): Promise<PhaseResult> => {
        workers = Array.from({ length: opts.workers }, (_, i) => new Worker(i));
        try {
          return await runPhase(workers, opts, server, ph, prefix, run);
        } finally {
          for (const w of workers) w.exit();
          workers = [];
        }
      };
      const weft = await phase('weft', weftPrefix);
      const raw = await phase('raw', rawPrefix);
      const rawList = await phase('raw-list', rawListPrefix);
      const weftCheck = await verify(client, weftPrefix, weft.results, true);
      const rawCheck = await verify(client, rawPrefix, raw.results, false);
      const rawListCheck = await verify(client, rawListPrefix, rawList.results, false);

      process.stdout.write(`\nrun ${run}/${opts.runs}\n${row([`${opts.nodes} nodes`], WIDTHS)}\n${HEADER}\n`);
      process.stdout.write(`${summaryRow('weft acquireLease', weft, weftCheck)}\n`);
      process.stdout.write(`${summaryRow('raw etcd grant+txn (reference)', raw, rawCheck)}\n`);
      process.stdout.write(`${summaryRow('raw etcd list+grant+txn', rawList, rawListCheck)}\n`);
      process.stdout.write(
        `check: ${weftCheck.keys} keys under ${weftPrefix}/subnets/, ${weftCheck.distinct} distinct subnets, ` +
          `duplicates: ${weftCheck.duplicates}\n`,
      );
      for (const line of breakdown(weft, [['raw', raw], ['raw-list', rawList]])) process.stdout.write(`${line}\n`);
      const errors = [...weft.results, ...raw.results, ...rawList.results].filter((r) => r.error !== null);
      for (const e of errors.slice(0, 5)) process.stdout.write(`  error: node ${e.node}: ${e.error}\n`);
      if (errors.length > 5) process.stdout.write(`  ... ${errors.length - 5} more errors\n`);
      const problems = [...weftCheck.problems, ...rawCheck.problems, ...rawListCheck.problems];
      for (const p of problems.slice(0, 10)) process.stdout.write(`  problem: ${p}\n`);
      const acquired = weft.results.filter((r) => r.error === null).length;
      const complete = acquired === opts.nodes && weftCheck.keys === opts.nodes && weftCheck.distinct === opts.nodes;
      if (!complete || problems.length > 0) failed = true;
    }
  } finally {
    await cleanup();
  }
  if (failed) {
    process.stdout.write('\nFAILED: not every node got a distinct subnet (see above)\n');
    process.exitCode = 1;
  }
}

if (process.argv.includes('--worker')) {
  runWorker();
} else {
  main().catch((e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exitCode = 1;
  });
}
