// vxlan convergence: N peer leases in etcd → every neighbour, FDB entry and route of those peers in
// the kernel, timed for weftd running in a network namespace, next to iproute2's batch mode
// (`ip -batch` + `bridge -batch`) programming the same entries in the same run.
//
// Scenarios, for each N in --peers:
//   (a) start  N leases are in etcd when weftd starts: from spawning weftd to "all N neighbours,
//              N FDB entries and N routes present", and from weftd's "acquired lease" log line
//              to the same point;
//   (b) burst  weftd runs idle with 0 peers, then all N leases arrive in one etcd transaction:
//              from sending the transaction to all entries present;
//   reference  a fresh namespace with an identical flannel.1 on its own veth: `ip -batch` (neigh
//              replace … nud permanent + route replace … via … dev flannel.1 onlink) and
//              `bridge -batch` (fdb replace … dst … self permanent), from spawn to exit; also the
//              nexthop-object form weft programs (`nexthop replace` + `route replace … nhid`).
//
// Layout: namespace "node" (eth0 172.16.0.1/16 on a veth whose peer end is in namespace "ul"),
// etcd and weftd inside it on 127.0.0.1; namespace "ref" with its own veth and flannel.1. A helper
// process (this file with --agent) runs inside "node": it writes the leases with etcd3 and polls
// the kernel with netlink route/neighbour dumps that it only counts (see KernelCounter and Agent.converge).
//
//   node --import tsx bench/convergence.ts [--peers 1000,10000] [--runs 3] [--poll-ms 5]
//       [--daemon compiled|source] [--reconcile-interval 10] [--settle-ms 12000] [--no-nexthop-ref]
//       [--cpu-prof DIR] [--keep-logs DIR] [--trace-polls]
//
// Run as root. The machine's own network namespace is never touched; namespaces, etcd, weftd and
// the helper are removed in `finally` and on SIGINT/SIGTERM.
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import { Etcd3, type IRequestOp } from 'etcd3';

import { WEFT_ROUTE_PROTOCOL } from '../src/netlink/index.js';
import { encodeLeaseAttrs, makeSubnetKey } from '../src/subnet/codec.js';
import { addNetns, delNetns, ipn, nsPrefix, sh } from '../test/helpers/netns.js';
import { WaitAbort, waitFor } from '../test/helpers/wait.js';
import { WeftdProcess } from '../test/helpers/weftd.js';
import {
  BenchError,
  checkCompiled,
  CpuMeter,
  cpuText,
  f0,
  f1,
  f2,
  fetchText,
  initClockTicks,
  loadavg,
  logLines,
  logTime,
  machineFacts,
  median,
  metricValue,
  peers,
  printTable,
  ROOT,
  rssOf,
  wall,
  type CpuSplit,
  spawnBenchEtcd,
  wireUnderlay,
} from './lib/common.js';
import { KernelCounter, pollConverged, VXLAN, type Counts, type PollResult } from './lib/kernel-counter.js';

const run = promisify(execFile);
const SELF = fileURLToPath(import.meta.url);

const { values: args } = parseArgs({
  options: {
    peers: { type: 'string', default: '1000,10000' },
    runs: { type: 'string', default: '3' },
    'poll-ms': { type: 'string', default: '5' },
    daemon: { type: 'string', default: 'compiled' },
    'reconcile-interval': { type: 'string', default: '10' },
    'no-nexthop-ref': { type: 'boolean', default: false },
    'cpu-prof': { type: 'string' },
    'trace-polls': { type: 'boolean', default: false },
    'settle-ms': { type: 'string', default: '12000' },
    'keep-logs': { type: 'string' },
    agent: { type: 'boolean', default: false },
  },
});

const cpuProfDir = args['cpu-prof'];
const ETCD_URL = 'http://127.0.0.1:2379';
const SUBNETS = '/coreos.com/network/subnets/';
const CONFIG_KEY = '/coreos.com/network/config';
const CONFIG = JSON.stringify({ Network: '10.0.0.0/8', SubnetLen: 24, Backend: { Type: 'vxlan' } });
const HEALTHZ_PORT = 8081;
const NODE_IP = '172.16.0.1';
/** flannel's device: VNI 1, the kernel's default port, no learning; MTU of eth0 minus 50. */
const VXLAN_ARGS = ['type', 'vxlan', 'id', '1', 'local', NODE_IP, 'dev', 'eth0', 'dstport', '8472', 'nolearning'];
const CONVERGE_TIMEOUT_MS = 120_000;

// ---------------------------------------------------------------------------------------------
// The helper inside the node namespace, driven over Node's IPC channel.

interface WriteResult {
  /** Just before the transaction was handed to the client; the value has been built before. */
  readonly startAt: number;
  /** When etcd's answer arrived. */
  readonly commitAt: number;
  readonly revision: string;
  /** Keys plus values, bytes. */
  readonly bytes: number;
}

interface ConvergeRequest {
  readonly n: number;
  /** Write the N leases in one transaction first and time from that write. */
  readonly burst: boolean;
  readonly pollMs: number;
  readonly timeoutMs: number;
  /** Each poll to stderr. */
  readonly trace: boolean;
}

interface ConvergeResult extends PollResult {
  readonly write: WriteResult | null;
}

interface WeftMetrics {
  readonly peers: number;
  readonly peersProgrammed: number;
  readonly programmingSeconds: number;
  readonly programmingCount: number;
  readonly batches: number;
  readonly reconciles: number;
  /** V8 heap used / total and memory outside the heap (Buffers), MB: live data versus what the heap holds. */
  readonly heapUsedMB: number;
  readonly heapTotalMB: number;
  readonly externalMB: number;
}

interface AgentOps {
  clock: { req: Record<string, never>; res: { wall: number } };
  setup: { req: { config: string }; res: { ms: number } };
  clear: { req: Record<string, never>; res: { deleted: number } };
  write: { req: { n: number }; res: WriteResult };
  counts: { req: Record<string, never>; res: Counts };
  converge: { req: ConvergeRequest; res: ConvergeResult };
  watchers: { req: { min: number; max: number; timeoutMs: number }; res: { watchers: number } };
  verify: { req: { n: number }; res: { problems: string[]; total: number } };
  metrics: { req: Record<string, never>; res: WeftMetrics };
}
type AgentOp = keyof AgentOps;

interface AgentRequestMsg {
  readonly id: number;
  readonly op: AgentOp;
  readonly req: unknown;
}
interface AgentReplyMsg {
  readonly id: number;
  readonly ok: boolean;
  readonly res?: unknown;
  readonly error?: string;
}

class Agent {
  private readonly etcd = new Etcd3({ hosts: ETCD_URL, dialTimeout: 3000 });
  private readonly kernel = new KernelCounter();

  readonly handlers: { [K in AgentOp]: (req: AgentOps[K]['req']) => Promise<AgentOps[K]['res']> } = {
    clock: async () => ({ wall: wall() }),
    setup: async ({ config }) => {
      const t = wall();
      await waitFor(() => this.etcd.get(CONFIG_KEY).string().then(() => true), { timeoutMs: 30_000, what: 'etcd' });
      await this.etcd.put(CONFIG_KEY).value(config);
      return { ms: wall() - t };
    },
    clear: async () => {
      const res = await this.etcd.delete().prefix(SUBNETS).exec();
      return { deleted: Number(res.deleted) };
    },
    write: async ({ n }) => this.commit(await this.prepareWrite(n)),
    counts: () => this.kernel.counts(),
    converge: (req) => this.converge(req),
    watchers: async ({ min, max, timeoutMs }) => {
      const watchers = await waitFor(
        async () => {
          const v = metricValue(await fetchText(`${ETCD_URL}/metrics`), 'etcd_debugging_mvcc_watcher_total');
          // Boxed: 0 is a valid answer.
          return v !== null && v >= min && v <= max ? { v } : null;
        },
        { timeoutMs, what: `between ${min} and ${max} etcd watchers`, intervalMs: 10 },
      );
      return { watchers: watchers.v };
    },
    verify: ({ n }) => this.kernel.verifyVxlan(Array.from({ length: n }, (_, i) => i)),
    metrics: async () => {
      const text = await fetchText(`http://127.0.0.1:${HEALTHZ_PORT}/metrics`);
      return {
        peers: metricValue(text, 'weft_peers') ?? -1,
        peersProgrammed: metricValue(text, 'weft_peers_programmed') ?? -1,
        programmingSeconds: metricValue(text, 'weft_backend_programming_duration_seconds_sum') ?? -1,
        programmingCount: metricValue(text, 'weft_backend_programming_duration_seconds_count') ?? -1,
        batches: metricValue(text, 'weft_lease_batches_applied_total') ?? -1,
        reconciles: metricValue(text, 'weft_backend_reconcile_duration_seconds_count') ?? -1,
        heapUsedMB: (metricValue(text, 'weft_nodejs_heap_size_used_bytes') ?? NaN) / 2 ** 20,
        heapTotalMB: (metricValue(text, 'weft_nodejs_heap_size_total_bytes') ?? NaN) / 2 ** 20,
        externalMB: (metricValue(text, 'weft_nodejs_external_memory_bytes') ?? NaN) / 2 ** 20,
      };
    },
  };

  /** The N puts (all bound to one etcd lease, as real leases are), built before any timing starts. */
  private async prepareWrite(n: number): Promise<{ ops: IRequestOp[]; bytes: number }> {
    const { ID } = await this.etcd.leaseClient.leaseGrant({ TTL: 3600, ID: 0 });
    let bytes = 0;
    const ops = peers(n).map((p): IRequestOp => {
      const key = Buffer.from(SUBNETS + makeSubnetKey(p.subnet, null));
      const value = Buffer.from(
        encodeLeaseAttrs({ publicIP: p.pub, publicIPv6: null, backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: p.mac } }),
      );
      bytes += key.length + value.length;
      return { request_put: { key, value, lease: ID } };
    });
    return { ops, bytes };
  }

  /** One transaction with every put (etcd runs with --max-txn-ops above the largest N). */
  private async commit(w: { ops: IRequestOp[]; bytes: number }): Promise<WriteResult> {
    const startAt = wall();
    const res = await this.etcd.kv.txn({ compare: [], success: w.ops, failure: [] });
    return { startAt, commitAt: wall(), revision: res.header.revision, bytes: w.bytes };
  }

  /**
   * Polls until every entry is present: the route count first (cheap, and weft sends routes after
   * the neighbours, FDB entries and nexthops), then the neighbour and FDB counts of flannel.1.
   * A kind found complete is not dumped again: entries are only added here.
   */
  private async converge(req: ConvergeRequest): Promise<ConvergeResult> {
    const prepared = req.burst ? await this.prepareWrite(req.n) : null;
    const writing = prepared ? this.commit(prepared) : null;
    const res = await pollConverged(this.kernel, { n: req.n, routesOnly: false, pollMs: req.pollMs, timeoutMs: req.timeoutMs, trace: req.trace }, wall);
    const write = writing ? await writing : null;
    return { ...res, startAt: write?.startAt ?? res.startAt, write };
  }

  close(): void {
    this.kernel.close();
    this.etcd.close();
  }
}

function runAgent(): void {
  const agent = new Agent();
  const dispatch = <K extends AgentOp>(op: K, req: unknown): Promise<AgentOps[K]['res']> => {
    const handler = agent.handlers[op] as (r: AgentOps[K]['req']) => Promise<AgentOps[K]['res']>;
    return handler(req as AgentOps[K]['req']);
  };
  process.on('message', (m: AgentRequestMsg) => {
    dispatch(m.op, m.req).then(
      (res) => process.send?.({ id: m.id, ok: true, res } satisfies AgentReplyMsg),
      (e: unknown) => process.send?.({ id: m.id, ok: false, error: e instanceof Error ? e.message : String(e) } satisfies AgentReplyMsg),
    );
  });
  // The bench went away (or closed the channel): nothing left to do.
  process.on('disconnect', () => {
    agent.close();
    process.exit(0);
  });
}

// ---------------------------------------------------------------------------------------------
// The bench process (machine's namespace; everything it changes is inside its own namespaces).

class AgentClient {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; op: string }>();
  readonly exited: Promise<void>;

  constructor(readonly proc: ChildProcess) {
    proc.on('message', (m: AgentReplyMsg) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.ok) p.resolve(m.res);
      else p.reject(new BenchError(`agent ${p.op}: ${m.error ?? 'failed'}`));
    });
    this.exited = new Promise((resolve) =>
      proc.once('exit', (code, signal) => {
        for (const p of this.pending.values()) p.reject(new BenchError(`agent exited (${code ?? signal}) during ${p.op}`));
        this.pending.clear();
        resolve();
      }),
    );
  }

  call<K extends AgentOp>(op: K, req: AgentOps[K]['req']): Promise<AgentOps[K]['res']> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v as AgentOps[K]['res']), reject, op });
      this.proc.send({ id, op, req } satisfies AgentRequestMsg);
    });
  }

  /** agent wall clock − bench wall clock, from the exchange with the shortest round trip. */
  async clockOffset(): Promise<{ offset: number; rtt: number }> {
    let best = { offset: 0, rtt: Infinity };
    for (let i = 0; i < 7; i++) {
      const t0 = wall();
      const { wall: a } = await this.call('clock', {});
      const t1 = wall();
      if (t1 - t0 < best.rtt) best = { offset: a - (t0 + t1) / 2, rtt: t1 - t0 };
    }
    return best;
  }
}

const heapText = (m: WeftMetrics): string => `${f0(m.heapUsedMB)} / ${f0(m.heapTotalMB)} + ${f0(m.externalMB)}`;

/**
 * When weftd logged the batch that brought the lease events it applied since it started to n
 * (each "applied lease events" line counts its batch's events; a burst may take several batches).
 */
function appliedTime(output: string, n: number): number | null {
  let sum = 0;
  for (const l of logLines(output)) {
    if (l.msg !== 'applied lease events') continue;
    sum += typeof l.events === 'number' ? l.events : 0;
    if (sum >= n) return Date.parse(l.time);
  }
  return null;
}

// ---------------------------------------------------------------------------------------------

interface Settled {
  readonly rssMB: number;
  readonly hwmMB: number;
  readonly reconciles: number;
  readonly heap: string;
}

interface StartResult {
  /** Spawn → all entries in the kernel. */
  readonly totalMs: number;
  /** weftd's "acquired lease" log line → all entries in the kernel. */
  readonly fromLeaseMs: number;
  /** Convergence lies within (doneAt − windowMs, doneAt]. */
  readonly windowMs: number;
  readonly phases: Record<string, number>;
  readonly pollMaxMs: number;
  readonly cpu: CpuSplit;
  readonly rss: { rssMB: number; hwmMB: number };
  /** --settle-ms after convergence (largest N only), with the periodic reconciles run meanwhile. */
  readonly settled: Settled | null;
  /** V8 heap used / total + external, MB, right after convergence. */
  readonly heap: string;
  readonly clockRttMs: number;
}

interface BurstResult {
  readonly totalMs: number;
  readonly windowMs: number;
  readonly phases: Record<string, number>;
  readonly pollMaxMs: number;
  readonly cpu: CpuSplit;
  readonly rss: { rssMB: number; hwmMB: number };
  /** --settle-ms after convergence (largest N only), with the periodic reconciles run meanwhile. */
  readonly settled: Settled | null;
  /** V8 heap used / total + external, MB, right after convergence. */
  readonly heap: string;
  /** Before the burst, with 0 peers. */
  readonly idle: { rssMB: number; hwmMB: number };
  readonly writeBytes: number;
}

interface RefResult {
  readonly ms: number;
  readonly ipMs: number;
  readonly bridgeMs: number;
  readonly cpu: CpuSplit;
}

class Bench {
  readonly dir = mkdtempSync(join(tmpdir(), 'weft-convergence-'));
  readonly prefix = nsPrefix('cv');
  readonly node = `${this.prefix}-node`;
  readonly ul = `${this.prefix}-ul`;
  readonly ref = `${this.prefix}-ref`;
  private readonly namespaces: string[] = [];
  private etcd: ChildProcess | null = null;
  agent: AgentClient | null = null;
  weftd: WeftdProcess | null = null;
  private weftdSeq = 0;
  private weftdName = '';
  private destroyed = false;

  constructor(
    private readonly daemonEnv: NodeJS.ProcessEnv,
    private readonly reconcileInterval: string,
    private readonly settleMs: number,
    private readonly largest: number,
  ) {}

  get subnetFile(): string {
    return join(this.dir, 'run', 'subnet.env');
  }

  async setup(): Promise<void> {
    for (const ns of [this.node, this.ul, this.ref]) this.namespaces.push(await addNetns(ns));
    // One underlay per host namespace, each on a veth whose other end is in "ul".
    await wireUnderlay(this.ul, [[this.node, 'n0'], [this.ref, 'r0']], NODE_IP);
    const etcd = spawnBenchEtcd(this.node, join(this.dir, 'etcd'), join(this.dir, 'etcd.log'), ETCD_URL);
    this.etcd = etcd;
    this.agent = new AgentClient(
      spawn('ip', ['netns', 'exec', this.node, process.execPath, '--import', 'tsx', SELF, '--agent'], {
        cwd: ROOT,
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      }),
    );
    const etcdDied = new Promise<never>((_, reject) =>
      etcd.once('exit', (code) =>
        reject(new BenchError(`etcd exited (${code}): ${readFileSync(join(this.dir, 'etcd.log'), 'utf8').slice(-2000)}`)),
      ),
    );
    etcdDied.catch(() => undefined); // only awaited during setup
    await Promise.race([this.agent.call('setup', { config: CONFIG }), etcdDied]);
  }

  get pids(): Record<'weftd' | 'etcd' | 'agent', number | undefined> {
    return { weftd: this.weftd?.proc.pid, etcd: this.etcd?.pid, agent: this.agent?.proc.pid };
  }

  private get a(): AgentClient {
    if (!this.agent) throw new BenchError('agent not started');
    return this.agent;
  }

  startWeftd(tag: string): WeftdProcess {
    const args = [
      '--etcd-endpoints', ETCD_URL, '--iface', 'eth0', '--subnet-file', this.subnetFile,
      '--healthz-ip', '127.0.0.1', '--healthz-port', String(HEALTHZ_PORT),
      '--reconcile-interval', this.reconcileInterval, '--log-format', 'json', '--log-level', 'debug',
    ];
    this.weftdSeq++;
    this.weftdName = `weftd-${this.weftdSeq}-${tag}`;
    // --cpu-prof writes the profile when weftd exits after SIGTERM.
    const prof = cpuProfDir ? ['--cpu-prof', `--cpu-prof-dir=${cpuProfDir}`, `--cpu-prof-name=${this.weftdName}.cpuprofile`] : [];
    this.weftd = WeftdProcess.start(args, this.daemonEnv, this.node, prof);
    return this.weftd;
  }

  async stopWeftd(): Promise<void> {
    const w = this.weftd;
    if (!w) return;
    this.weftd = null;
    const timer = setTimeout(() => w.kill(), 15_000);
    await w.stop();
    clearTimeout(timer);
    if (args['keep-logs']) {
      mkdirSync(args['keep-logs'], { recursive: true });
      writeFileSync(join(args['keep-logs'], `${this.weftdName}.log`), w.output);
    }
  }

  /** No leases, no flannel.1 (its neighbours, FDB entries, nexthops and routes go with it), no subnet.env. */
  private async resetNode(): Promise<void> {
    await this.a.call('clear', {});
    await ipn(this.node, 'link', 'del', VXLAN).catch(() => undefined);
    rmSync(this.subnetFile, { force: true });
    const c = await this.a.call('counts', {});
    if (c.routes !== 0 || c.neighbours !== 0 || c.fdb !== 0) throw new BenchError(`node namespace not clean: ${JSON.stringify(c)}`);
  }

  private async afterConvergence(w: WeftdProcess, n: number, tag: string): Promise<{ metrics: WeftMetrics; applied: number }> {
    // weftd logs the batch after apply() returns; the poller may have seen the kernel first.
    const applied = await waitFor(
      () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return appliedTime(w.output, n);
      },
      { timeoutMs: 30_000, what: `weftd to log the applied batch (${tag})` },
    );
    const v = await this.a.call('verify', { n });
    if (v.total > 0) throw new BenchError(`${tag}: kernel state wrong (${v.total} problems): ${v.problems.join('; ')}`);
    return { metrics: await this.a.call('metrics', {}), applied };
  }

  /** Memory once weftd has sat at N peers for a while (a periodic reconcile included by default). */
  private async settle(w: WeftdProcess, n: number): Promise<Settled | null> {
    if (this.settleMs <= 0 || n !== this.largest) return null;
    const before = await this.a.call('metrics', {});
    await sleep(this.settleMs);
    if (!w.running) throw new BenchError(`weftd exited while settling:\n${w.output.slice(-4000)}`);
    const after = await this.a.call('metrics', {});
    return { ...rssOf(w.proc.pid!), reconciles: after.reconciles - before.reconciles, heap: heapText(after) };
  }

  /** Waits for the agent's convergence answer, failing at once when weftd dies. */
  private async whileRunning<T>(w: WeftdProcess, p: Promise<T>): Promise<T> {
    return Promise.race([
      p,
      w.exited.then((e) => {
        throw new BenchError(`weftd exited (${e.code ?? e.signal}) before convergence:\n${w.output.slice(-4000)}`);
      }),
    ]);
  }

  /** (a): N leases in etcd, then weftd starts. */
  async scenarioStart(n: number, pollMs: number): Promise<StartResult> {
    await this.stopWeftd();
    await this.resetNode();
    await this.a.call('write', { n });
    const clock = await this.a.clockOffset();
    const cpu = new CpuMeter(() => this.pids);
    const converged = this.a.call('converge', { n, burst: false, pollMs, timeoutMs: CONVERGE_TIMEOUT_MS, trace: args['trace-polls'] });
    const t0 = wall();
    const w = this.startWeftd(`start-${n}`);
    const res = await this.whileRunning(w, converged);
    const usage = cpu.stop();
    const rss = rssOf(w.proc.pid!);
    const { metrics, applied } = await this.afterConvergence(w, n, `start N=${n}`);
    const settled = await this.settle(w, n);
    const done = res.doneAt - clock.offset;
    const at = (msg: string) => logTime(w.output, (l) => l.msg === msg);
    const acquired = at('acquired lease');
    if (acquired === null) throw new BenchError('weftd did not log "acquired lease"');
    const phase = (t: number | null) => (t === null ? NaN : t - t0);
    const progMs = metrics.programmingSeconds * 1000;
    return {
      totalMs: done - t0,
      fromLeaseMs: done - acquired,
      windowMs: res.lastMissAt === null ? done - t0 : res.doneAt - res.lastMissAt,
      phases: {
        'spawn → "starting weftd" (node start, modules, health server)': phase(at('starting weftd')),
        '→ "using interface" (config read, interface)': phase(at('using interface')),
        '→ "acquired lease" (own-lease listing, device, listing + grant + txn)': phase(acquired),
        '→ programming starts (subnet.env, listing for the watch, decode, batch)': phase(applied - progMs),
        '→ programming done ("applied lease events")': phase(applied),
        '→ all N routes seen by the poller': res.routesAt - clock.offset - t0,
        '→ all entries seen in the kernel by the poller': done - t0,
        'programming (backend apply: dump, diff, netlink), ms': progMs,
        'batches applied': metrics.batches,
      },
      pollMaxMs: res.pollMaxMs,
      cpu: usage,
      rss,
      settled,
      heap: heapText(metrics),
      clockRttMs: clock.rtt,
    };
  }

  /** (b): weftd idle with 0 peers, then N leases in one transaction. */
  async scenarioBurst(n: number, pollMs: number): Promise<BurstResult> {
    await this.stopWeftd();
    await this.resetNode();
    // The stopped weftd's watches are gone, so the count below is the new one's.
    await this.a.call('watchers', { min: 0, max: 0, timeoutMs: 30_000 });
    const w = this.startWeftd(`burst-${n}`);
    await waitFor(
      () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return logTime(w.output, (l) => l.msg === 'acquired lease') !== null && existsSync(this.subnetFile);
      },
      { timeoutMs: 60_000, what: 'weftd to acquire its lease' },
    );
    // Its own-key watch and the lease watch: from here on the burst arrives as watch events.
    await this.a.call('watchers', { min: 2, max: 1e9, timeoutMs: 30_000 });
    const before = await this.a.call('metrics', {});
    const idle = rssOf(w.proc.pid!);
    const cpu = new CpuMeter(() => this.pids);
    const res = await this.whileRunning(w, this.a.call('converge', { n, burst: true, pollMs, timeoutMs: CONVERGE_TIMEOUT_MS, trace: args['trace-polls'] }));
    const usage = cpu.stop();
    const rss = rssOf(w.proc.pid!);
    const { metrics, applied } = await this.afterConvergence(w, n, `burst N=${n}`);
    const settled = await this.settle(w, n);
    const clock = await this.a.clockOffset();
    const t0 = res.startAt;
    const progMs = (metrics.programmingSeconds - before.programmingSeconds) * 1000;
    const appliedAgent = applied + clock.offset;
    return {
      totalMs: res.doneAt - t0,
      windowMs: res.lastMissAt === null ? res.doneAt - t0 : res.doneAt - res.lastMissAt,
      phases: {
        'txn sent → etcd answered': res.write ? res.write.commitAt - t0 : NaN,
        '→ programming starts (watch event, decode, batch)': appliedAgent - progMs - t0,
        '→ programming done ("applied lease events")': appliedAgent - t0,
        '→ all N routes seen by the poller': res.routesAt - t0,
        '→ all entries seen in the kernel by the poller': res.doneAt - t0,
        'programming (backend apply: dump, diff, netlink), ms': progMs,
        'batches applied': metrics.batches - before.batches,
      },
      pollMaxMs: res.pollMaxMs,
      cpu: usage,
      rss,
      settled,
      heap: heapText(metrics),
      idle,
      writeBytes: res.write?.bytes ?? 0,
    };
  }

  private batchFiles(n: number): { plain: string; nexthops: string; fdb: string } {
    const plain = join(this.dir, `ref-${n}-plain.batch`);
    if (existsSync(plain)) return { plain, nexthops: join(this.dir, `ref-${n}-nh.batch`), fdb: join(this.dir, `ref-${n}-fdb.batch`) };
    const ps = peers(n);
    const neigh = ps.map((p) => `neigh replace ${p.subnet.ip.toString()} lladdr ${p.mac} dev ${VXLAN} nud permanent\n`).join('');
    writeFileSync(
      plain,
      neigh + ps.map((p) => `route replace ${p.subnet.toString()} via ${p.subnet.ip.toString()} dev ${VXLAN} onlink proto ${WEFT_ROUTE_PROTOCOL}\n`).join(''),
    );
    const nexthops = join(this.dir, `ref-${n}-nh.batch`);
    writeFileSync(
      nexthops,
      neigh +
        ps.map((p, i) => `nexthop replace id ${i + 1} via ${p.subnet.ip.toString()} dev ${VXLAN} onlink\n`).join('') +
        ps.map((p, i) => `route replace ${p.subnet.toString()} nhid ${i + 1} proto ${WEFT_ROUTE_PROTOCOL}\n`).join(''),
    );
    const fdb = join(this.dir, `ref-${n}-fdb.batch`);
    writeFileSync(fdb, ps.map((p) => `fdb replace ${p.mac} dev ${VXLAN} dst ${p.pub.toString()} self permanent\n`).join(''));
    return { plain, nexthops, fdb };
  }

  /** iproute2 on a fresh flannel.1 in the reference namespace, spawn to exit. */
  async reference(n: number, form: 'plain' | 'nexthops'): Promise<RefResult> {
    const files = this.batchFiles(n);
    await ipn(this.ref, 'link', 'del', VXLAN).catch(() => undefined);
    await ipn(this.ref, 'link', 'add', VXLAN, ...VXLAN_ARGS);
    await ipn(this.ref, 'link', 'set', VXLAN, 'mtu', '1450', 'up');
    const cpu = new CpuMeter(() => this.pids);
    const t0 = wall();
    await run('ip', ['-n', this.ref, '-batch', form === 'plain' ? files.plain : files.nexthops]);
    const t1 = wall();
    await run('bridge', ['-n', this.ref, '-batch', files.fdb]);
    const t2 = wall();
    const usage = cpu.stop();
    await this.checkReference(n, form);
    return { ms: t2 - t0, ipMs: t1 - t0, bridgeMs: t2 - t1, cpu: usage };
  }

  private async checkReference(n: number, form: 'plain' | 'nexthops'): Promise<void> {
    const count = async (...a: string[]) => (JSON.parse(await sh(a[0]!, ['-n', this.ref, '-j', ...a.slice(1)])) as unknown[]).length;
    const routes = await count('ip', 'route', 'show', 'proto', String(WEFT_ROUTE_PROTOCOL));
    const neigh = await count('ip', 'neigh', 'show', 'dev', VXLAN, 'nud', 'permanent');
    const fdb = (JSON.parse(await sh('bridge', ['-n', this.ref, '-j', 'fdb', 'show', 'dev', VXLAN])) as Array<{ dst?: string }>).filter(
      (f) => f.dst !== undefined,
    ).length;
    const nh = form === 'nexthops' ? await count('ip', 'nexthop', 'show', 'dev', VXLAN) : n;
    if (routes !== n || neigh !== n || fdb !== n || nh !== n) {
      throw new BenchError(`reference (${form}) N=${n}: ${routes} routes, ${neigh} neighbours, ${fdb} FDB entries, ${nh} nexthops`);
    }
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    await this.stopWeftd().catch(() => undefined);
    const stop = async (p: ChildProcess | undefined | null) => {
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((resolve) => p.once('exit', resolve));
      p.kill('SIGTERM');
      const timer = setTimeout(() => p.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    };
    await stop(this.agent?.proc);
    await stop(this.etcd);
    for (const ns of this.namespaces) await delNetns(ns);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// Reporting

interface SizeResults {
  start: StartResult[];
  burst: BurstResult[];
  ref: RefResult[];
  refNh: RefResult[];
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces)');
  const sizes = args.peers.split(',').map(Number);
  // One transaction holds all N puts (etcd runs with --max-txn-ops 20000), and weftd receives them
  // as one watch response of ~200 bytes per lease, under gRPC's default 4 MiB message limit.
  if (sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 15_000)) throw new BenchError('--peers: sizes between 1 and 15000');
  const runs = Number(args.runs);
  const pollMs = Number(args['poll-ms']);
  if (args.daemon !== 'compiled' && args.daemon !== 'source') throw new BenchError('--daemon: compiled or source');
  const daemon = args.daemon === 'compiled' ? checkCompiled() : 'from source (tsx)';
  const daemonEnv: NodeJS.ProcessEnv = { WEFT_FROM_SOURCE: args.daemon === 'source' ? '1' : '' };
  if (cpuProfDir) mkdirSync(cpuProfDir, { recursive: true });
  await initClockTicks();
  await machineFacts(daemon, 'cv');

  const bench = new Bench(daemonEnv, args['reconcile-interval'], Number(args['settle-ms']), Math.max(...sizes));
  const onSignal = (sig: NodeJS.Signals) => {
    interrupted = true;
    console.error(`\n${sig}: cleaning up`);
    void bench.destroy().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);

  const results = new Map<number, SizeResults>(sizes.map((n) => [n, { start: [], burst: [], ref: [], refNh: [] }]));
  const began = wall();
  try {
    await bench.setup();
    console.log(
      `runs ${runs}, peers ${sizes.join(', ')}, poll every ${pollMs} ms + dump time, weftd --reconcile-interval ${args['reconcile-interval']}\n`,
    );
    for (let r = 1; r <= runs; r++) {
      for (const n of sizes) {
        const res = results.get(n)!;
        const ref = await bench.reference(n, 'plain');
        res.ref.push(ref);
        const refNh = args['no-nexthop-ref'] ? null : await bench.reference(n, 'nexthops');
        if (refNh) res.refNh.push(refNh);
        const a = await bench.scenarioStart(n, pollMs);
        res.start.push(a);
        const b = await bench.scenarioBurst(n, pollMs);
        res.burst.push(b);
        console.log(
          `run ${r} N=${n}: iproute2 ${f0(ref.ms)} ms${refNh ? ` (nexthop form ${f0(refNh.ms)} ms)` : ''}` +
            ` | (a) start ${f0(a.totalMs)} ms, from "acquired lease" ${f0(a.fromLeaseMs)} ms → ratios ${f2(a.totalMs / ref.ms)}, ${f2(a.fromLeaseMs / ref.ms)}` +
            ` | (b) burst ${f0(b.totalMs)} ms → ratio ${f2(b.totalMs / ref.ms)}` +
            ` | RSS ${f0(a.rss.rssMB)}/${f0(b.rss.rssMB)} MB (peak ${f0(Math.max(a.rss.hwmMB, b.rss.hwmMB))} MB)`,
        );
      }
    }
    await bench.stopWeftd();
  } finally {
    await bench.destroy();
  }

  console.log(`\nfinished in ${f0((wall() - began) / 1000)} s\n`);
  const runCols = Array.from({ length: runs }, (_, i) => `run ${i + 1}`);
  console.log('## Times (ms) and ratios weft / iproute2 (same run)\n');
  const rows: string[][] = [];
  for (const [n, res] of results) {
    const ref = res.ref.map((x) => x.ms);
    const line = (what: string, xs: number[], fmt = f0) => rows.push([String(n), what, ...xs.map(fmt), fmt(median(xs))]);
    line('iproute2: ip -batch + bridge -batch (plain routes)', ref);
    rows.push([String(n), 'iproute2 split: ip -batch (neigh + routes) / bridge -batch (fdb)', ...res.ref.map((x) => `${f0(x.ipMs)} / ${f0(x.bridgeMs)}`), '']);
    if (res.refNh.length) line('iproute2, nexthop form (as weft programs)', res.refNh.map((x) => x.ms));
    line('weft (a) start: spawn → all in kernel', res.start.map((x) => x.totalMs));
    line('weft (a) start: "acquired lease" → all in kernel', res.start.map((x) => x.fromLeaseMs));
    line('weft (b) burst: txn → all in kernel', res.burst.map((x) => x.totalMs));
    line('ratio (a) spawn / iproute2', res.start.map((x, i) => x.totalMs / ref[i]!), f2);
    line('ratio (a) "acquired lease" / iproute2', res.start.map((x, i) => x.fromLeaseMs / ref[i]!), f2);
    line('ratio (b) burst / iproute2', res.burst.map((x, i) => x.totalMs / ref[i]!), f2);
    if (res.refNh.length) {
      const nh = res.refNh.map((x) => x.ms);
      line('ratio (a) "acquired lease" / iproute2 nexthop form', res.start.map((x, i) => x.fromLeaseMs / nh[i]!), f2);
      line('ratio (b) burst / iproute2 nexthop form', res.burst.map((x, i) => x.totalMs / nh[i]!), f2);
    }
    line('poll window (a): convergence within the last … ms', res.start.map((x) => x.windowMs), f1);
    line('poll window (b)', res.burst.map((x) => x.windowMs), f1);
    line('CPU of the rest of the machine during iproute2 (ms; other work disturbs)', res.ref.map((x) => x.cpu.rest));
    line('… during (a)', res.start.map((x) => x.cpu.rest));
    line('… during (b)', res.burst.map((x) => x.cpu.rest));
    line('longest poll cycle (a)', res.start.map((x) => x.pollMaxMs), f1);
    line('longest poll cycle (b)', res.burst.map((x) => x.pollMaxMs), f1);
  }
  printTable(['N', 'what', ...runCols, 'median'], rows);

  console.log('\n## weftd memory after convergence (MB)\n');
  const mem: string[][] = [];
  for (const [n, res] of results) {
    mem.push([String(n), '(a) VmRSS / VmHWM', ...res.start.map((x) => `${f0(x.rss.rssMB)} / ${f0(x.rss.hwmMB)}`)]);
    mem.push([String(n), '(b) VmRSS / VmHWM', ...res.burst.map((x) => `${f0(x.rss.rssMB)} / ${f0(x.rss.hwmMB)}`)]);
    mem.push([String(n), '(a) V8 heap used / total + external', ...res.start.map((x) => x.heap)]);
    mem.push([String(n), '(b) V8 heap used / total + external', ...res.burst.map((x) => x.heap)]);
    mem.push([String(n), '(b) idle with 0 peers, before the burst: VmRSS', ...res.burst.map((x) => f0(x.idle.rssMB))]);
    const settled = (x: { settled: Settled | null }) => (x.settled ? `${f0(x.settled.rssMB)} / ${f0(x.settled.hwmMB)} (${x.settled.reconciles} reconciles)` : '–');
    if (res.start.some((x) => x.settled)) {
      mem.push([String(n), `(a) ${f0(Number(args['settle-ms']) / 1000)} s later: VmRSS / VmHWM`, ...res.start.map(settled)]);
      mem.push([String(n), `(b) ${f0(Number(args['settle-ms']) / 1000)} s later: VmRSS / VmHWM`, ...res.burst.map(settled)]);
      const heap = (x: { settled: Settled | null }) => x.settled?.heap ?? '–';
      mem.push([String(n), '(a) then: V8 heap used / total + external', ...res.start.map(heap)]);
      mem.push([String(n), '(b) then: V8 heap used / total + external', ...res.burst.map(heap)]);
    }
  }
  printTable(['N', 'what', ...runCols], mem);

  console.log('\n## Where the time goes (ms from the start of the measurement; medians over runs)\n');
  const ph: string[][] = [];
  for (const [n, res] of results) {
    for (const [label, list] of [['(a)', res.start], ['(b)', res.burst]] as const) {
      const keys = Object.keys(list[0]?.phases ?? {});
      for (const k of keys) ph.push([String(n), label, k, f0(median(list.map((x) => x.phases[k]!)))]);
    }
  }
  printTable(['N', 'scenario', 'phase', 'ms'], ph);

  console.log('\n## CPU during each measurement (last run)\n');
  for (const [n, res] of results) {
    const last = (xs: { cpu: CpuSplit }[]) => xs[xs.length - 1]?.cpu;
    const ref = last(res.ref);
    const a = last(res.start);
    const b = last(res.burst);
    if (ref) console.log(`N=${n} iproute2: ${cpuText(ref)}`);
    if (a) console.log(`N=${n} (a):       ${cpuText(a)}`);
    if (b) console.log(`N=${n} (b):       ${cpuText(b)}; lease values ${f0((res.burst.at(-1)?.writeBytes ?? 0) / 1024)} KiB`);
  }
  console.log(`\nload average at end: ${loadavg()}`);
  console.log('targets: ratio ≤ 1.0 (weft no slower than iproute2 batch mode), weftd RSS < 150 MB at 10 000 peers');
}

/** Set on SIGINT/SIGTERM: what fails afterwards fails because of the cleanup. */
let interrupted = false;

if (args.agent) {
  runAgent();
} else {
  main().catch((e: unknown) => {
    if (interrupted) return;
    console.error(e instanceof Error ? e.message : e);
    process.exitCode = 1;
  });
}
