// What the namespace benchmarks (convergence.ts, dataplane.ts) share: the peer model, clocks,
// statistics and table printing, CPU and memory accounting from /proc, weftd's log and metrics,
// and the checks that the compiled daemon is current.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

import { IPAddr, IPNet } from '../../src/util/ip.js';
import { ipn, nsPrefix, sh } from '../../test/helpers/netns.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export class BenchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BenchError';
  }
}

/** Wall-clock milliseconds with sub-millisecond resolution (performance.timeOrigin + now). */
export const wall = (): number => performance.timeOrigin + performance.now();

/**
 * CLOCK_MONOTONIC in milliseconds (libuv's hrtime): one clock for every thread and process of the
 * machine, never stepped by NTP or `date`. Every latency dataplane.ts reports is a difference of
 * two of these stamps.
 */
export const mono = (): number => Number(process.hrtime.bigint()) / 1e6;

// ---------------------------------------------------------------------------------------------
// Peers: slot i is the same lease for etcd, the Kubernetes Node, the batch files and the checks.

export interface Peer {
  readonly subnet: IPNet;
  readonly mac: string;
  readonly pub: IPAddr;
}

export const hex2 = (v: number): string => (v & 255).toString(16).padStart(2, '0');
const SUBNET_BASE = IPAddr.parse('10.1.0.0').value;
const PUBLIC_BASE = IPAddr.parse('172.16.1.0').value;
/**
 * Slots 0 … MAX_SLOTS − 1: subnets 10.1.0.0/24 … 10.254.255.0/24 (10.255.0.0/16 stays free for
 * the node's own lease), public IPs 172.16.1.0 … 172.16.254.255 (inside the node's 172.16.0.0/16,
 * so host-gw can reach them), VTEP MACs 0e:00:00:xx:xx:xx.
 */
export const MAX_SLOTS = 254 * 256;

export function peer(i: number): Peer {
  if (!Number.isInteger(i) || i < 0 || i >= MAX_SLOTS) throw new BenchError(`peer slot ${i} out of range`);
  return {
    subnet: IPNet.of(IPAddr.of(4, SUBNET_BASE + BigInt(i) * 256n), 24),
    mac: `0e:00:00:${hex2(i >> 16)}:${hex2(i >> 8)}:${hex2(i)}`,
    pub: IPAddr.of(4, PUBLIC_BASE + BigInt(i)),
  };
}

const peerCache = new Map<number, Peer>();
/** peer(i), kept: the string forms are asked for many times. */
export function cachedPeer(i: number): Peer {
  let p = peerCache.get(i);
  if (!p) {
    p = peer(i);
    peerCache.set(i, p);
  }
  return p;
}

/** Slots 0 … n − 1. */
export function peers(n: number): Peer[] {
  return Array.from({ length: n }, (_, i) => cachedPeer(i));
}

// ---------------------------------------------------------------------------------------------
// Statistics and printing

export const median = (xs: readonly number[]): number => {
  const s = [...xs].filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/** Nearest-rank percentile (p in 0…100) of the values that are numbers; NaN when there are none. */
export function percentile(xs: readonly number[], p: number): number {
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * s.length));
  return s[Math.min(rank, s.length) - 1]!;
}

export interface Dist {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
}

export function dist(xs: readonly number[]): Dist {
  const v = xs.filter((x) => !Number.isNaN(x));
  return { n: v.length, p50: percentile(v, 50), p99: percentile(v, 99), max: v.reduce((m, x) => Math.max(m, x), v.length ? -Infinity : NaN) };
}

/** Fixed-point text; NaN (not measured) prints as –, an infinite value (never happened) as ∞. */
const fixed = (x: number, digits: number): string => (Number.isNaN(x) ? '–' : Number.isFinite(x) ? x.toFixed(digits) : '∞');
export const f0 = (x: number): string => fixed(x, 0);
export const f1 = (x: number): string => fixed(x, 1);
export const f2 = (x: number): string => fixed(x, 2);

export function printTable(header: string[], rows: string[][]): void {
  console.log(`| ${header.join(' | ')} |`);
  console.log(`|${header.map(() => '---').join('|')}|`);
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
}

// ---------------------------------------------------------------------------------------------
// CPU accounting from /proc, to see what else ran during a measurement (this machine is shared).

let CLK_TCK = 100;
export async function initClockTicks(): Promise<void> {
  CLK_TCK = Number((await sh('getconf', ['CLK_TCK'])).trim()) || 100;
}

export function procTicks(pid: number | 'self'): { own: number; children: number } {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { own: Number(f[11]) + Number(f[12]), children: Number(f[13]) + Number(f[14]) };
  } catch {
    return { own: 0, children: 0 };
  }
}

function machineBusyTicks(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal
  return f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + f[7]!;
}

export interface CpuSplit {
  /** CPU milliseconds during the measurement. */
  readonly weftd: number;
  readonly etcd: number;
  readonly agent: number;
  /** ip/bridge children of the bench plus the bench itself. */
  readonly bench: number;
  readonly rest: number;
  readonly wallMs: number;
}

export class CpuMeter {
  private readonly t0 = mono();
  private readonly busy0 = machineBusyTicks();
  private readonly start: Map<string, number>;

  constructor(private readonly pids: () => Record<'weftd' | 'etcd' | 'agent', number | undefined>) {
    this.start = this.sample();
  }

  private sample(): Map<string, number> {
    const m = new Map<string, number>();
    for (const [k, pid] of Object.entries(this.pids())) m.set(k, pid ? procTicks(pid).own : 0);
    const self = procTicks('self');
    m.set('bench', self.own + self.children);
    return m;
  }

  stop(): CpuSplit {
    const end = this.sample();
    const ms = (k: string) => ((end.get(k) ?? 0) - (this.start.get(k) ?? 0)) * (1000 / CLK_TCK);
    const busy = (machineBusyTicks() - this.busy0) * (1000 / CLK_TCK);
    const known = ms('weftd') + ms('etcd') + ms('agent') + ms('bench');
    return { weftd: ms('weftd'), etcd: ms('etcd'), agent: ms('agent'), bench: ms('bench'), rest: Math.max(0, busy - known), wallMs: mono() - this.t0 };
  }
}

export const cpuText = (c: CpuSplit): string =>
  `weftd ${f0(c.weftd)}, etcd ${f0(c.etcd)}, poller/writer ${f0(c.agent)}, bench+ip/bridge ${f0(c.bench)}, rest of machine ${f0(c.rest)} ms CPU in ${f0(c.wallMs)} ms`;

/** VmRSS and VmHWM of a process, MB; NaN when it is gone. */
export function rssOf(pid: number): { rssMB: number; hwmMB: number } {
  let status: string;
  try {
    status = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return { rssMB: NaN, hwmMB: NaN };
  }
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rssMB: kb('VmRSS') / 1024, hwmMB: kb('VmHWM') / 1024 };
}

// ---------------------------------------------------------------------------------------------
// weftd's JSON log and its metrics

export interface LogLine {
  readonly time: string;
  readonly msg: string;
  readonly [field: string]: unknown;
}

export function logLines(output: string): LogLine[] {
  const out: LogLine[] = [];
  for (const line of output.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const v = JSON.parse(line) as LogLine;
      if (typeof v.time === 'string' && typeof v.msg === 'string') out.push(v);
    } catch {
      // a partial line: the next read completes it
    }
  }
  return out;
}

/** Wall-clock time (ms) of the first log line `match` accepts, or null. */
export function logTime(output: string, match: (l: LogLine) => boolean): number | null {
  const l = logLines(output).find(match);
  return l ? Date.parse(l.time) : null;
}

export async function fetchText(url: string): Promise<string> {
  const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new BenchError(`GET ${url}: HTTP ${res.status}`);
  return res.text();
}

/** The value of an unlabelled Prometheus sample, or null when absent. */
export function metricValue(text: string, name: string): number | null {
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name} `)) return Number(line.slice(name.length + 1));
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// The machine and the daemon under test

export const loadavg = (): string => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

export async function machineFacts(daemon: string, ownTag: string): Promise<void> {
  const cpu = cpus();
  const tool = async (cmd: string, a: string[]) => (await sh(cmd, a).catch((e: Error) => e.message)).split('\n')[0]!.trim();
  const [ipv, etcdv, kernel] = await Promise.all([tool('ip', ['-V']), tool('etcd', ['--version']), tool('uname', ['-r'])]);
  const others = existsSync('/var/run/netns') ? readdirSync('/var/run/netns').filter((n) => !n.startsWith(nsPrefix(ownTag))).length : 0;
  console.log(`machine: ${cpu.length} × ${cpu[0]?.model ?? '?'}, ${(totalmem() / 1024 ** 3).toFixed(1)} GiB, kernel ${kernel}`);
  console.log(`software: node ${process.version}, ${etcdv}, ${ipv}; weftd ${daemon}`);
  console.log(`load average at start: ${loadavg()}; other network namespaces present (other tests running?): ${others}`);
}

/** The compiled daemon must not be older than its sources: the bench would time stale code. */
export function checkCompiled(): string {
  const stale: string[] = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts')) {
        const js = join(ROOT, 'dist', relative(ROOT, p).replace(/\.ts$/, '.js'));
        if (!existsSync(js) || statSync(js).mtimeMs < statSync(p).mtimeMs) stale.push(relative(ROOT, p));
      }
    }
  };
  walk(join(ROOT, 'src'));
  if (stale.length > 0) {
    throw new BenchError(`dist/ is missing or older than ${stale.slice(0, 3).join(', ')}${stale.length > 3 ? ` and ${stale.length - 3} more` : ''}: run \`npm run build\`, or pass --daemon source`);
  }
  return `compiled (dist/, built ${statSync(join(ROOT, 'dist/src/cli/weftd.js')).mtime.toISOString()})`;
}

/**
 * Puts each host namespace on the underlay namespace `ul` through a veth (`end` in ul, eth0 in
 * the host) with `ip`/16 on eth0: the node and the reference never talk to each other, so they
 * can share the address.
 */
export async function wireUnderlay(ul: string, hosts: ReadonlyArray<readonly [ns: string, end: string]>, ip: string): Promise<void> {
  for (const [ns, end] of hosts) {
    await ipn(ul, 'link', 'add', end, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    await ipn(ul, 'link', 'set', end, 'up');
    await ipn(ns, 'addr', 'add', `${ip}/16`, 'dev', 'eth0');
    await ipn(ns, 'link', 'set', 'eth0', 'up');
  }
}

/** A one-member etcd in `ns` on 127.0.0.1 (`clientUrl`), its output appended to `logFile`. */
export function spawnBenchEtcd(ns: string, dataDir: string, logFile: string, clientUrl: string): ChildProcess {
  const log = openSync(logFile, 'a');
  const peerUrl = 'http://127.0.0.1:2380';
  const proc = spawn(
    'ip',
    ['netns', 'exec', ns, 'etcd', '--name', 'node', '--data-dir', dataDir,
      '--listen-client-urls', clientUrl, '--advertise-client-urls', clientUrl,
      '--listen-peer-urls', peerUrl, '--initial-advertise-peer-urls', peerUrl, '--initial-cluster', `node=${peerUrl}`,
      // One transaction of 10 000 puts (~2 MB): above the default 128 ops and 1.5 MiB.
      '--max-txn-ops', '20000', '--max-request-bytes', String(32 << 20),
      '--quota-backend-bytes', String(8 * 1024 ** 3), '--log-level', 'warn'],
    { stdio: ['ignore', log, log] },
  );
  closeSync(log);
  return proc;
}
