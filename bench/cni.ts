// CNI latency: ADD and DEL of the flannel → bridge → host-local chain plus portmap (2 mappings),
// weft's bundles next to Debian's reference plugins (containernetworking-plugins 1.1.1,
// /usr/lib/cni), interleaved in the same run.
//
//   [ITER=30] [WARMUP=2] [TRACE=1] node --import=tsx bench/cni.ts
//
// ITER: measured attachments per side; WARMUP: untimed ones per side first; TRACE=1: afterwards one
// more attachment per side with every plugin under `strace -f -e trace=execve`, printing the
// programs each step exec'd (the reference's iptables calls, our ip/nsenter/flock/iptables-restore).
//
// Run as root. Everything happens in namespaces of its own: a "host" netns `wt-bcni-<pid>-host`
// (where the plugins run, so the bridge, veths, sysctls and iptables rules land there) and a fresh
// pod netns per attachment (`wt-bcni-<pid>-o<i>` / `-r<i>`, created and deleted untimed).
// subnet.env, flannel's dataDir and host-local's dataDir live in a temp dir. Namespaces and the
// temp dir are removed in `finally` and on SIGINT/SIGTERM.
//
// Both sides run as a runtime runs a conflist: ADD of plugin 1, then portmap with prevResult =
// plugin 1's result; DEL in reverse order, both with the final result as prevResult.
//   ours       flannel (delegating in-process to weft's bridge + host-local), then weft's portmap;
//              CNI_PATH = the bundles built from cni-plugins/ at start.
//   reference  Debian has no flannel plugin: the reference bridge (exec'ing the reference
//              host-local, CNI_PATH=/usr/lib/cni) gets exactly the delegate config our flannel
//              wrote to its state file in the first warm-up ADD (and on DEL that config plus the
//              prevResult, which is what our flannel hands its delegate); then the reference portmap.
// Every plugin process is started the same way, `nsenter --net=/run/netns/<host> -- <plugin>`,
// and timed from spawn to the close of its stdio. The wrapper alone (`nsenter … -- true`, next to
// plain `true`) is measured in the same loop and printed: a runtime execs plugins directly, so the
// wrapper's extra cost is also taken out of the chain ratios in a second line.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { basename, join } from 'node:path';

import { buildCniPlugins } from '../cni-plugins/build.js';
import { IPNet } from '../src/util/ip.js';
import { cniEnv, REFERENCE_CNI_DIR } from '../test/helpers/cni.js';
import { addNetns, delNetns, sh } from '../test/helpers/netns.js';

class BenchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BenchError';
  }
}

/** A plugin that exited non-zero (or printed no usable result) during a measured step. */
class PluginRunError extends Error {
  constructor(
    readonly side: Side,
    readonly step: string,
    readonly containerId: string,
    readonly exitCode: number,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(`${side} ${step} (container ${containerId}) exited ${exitCode}: ${stdout.trim()} ${stderr.trim()}`.trim());
    this.name = 'PluginRunError';
  }
}

function envInt(name: string, dflt: number, min: number): number {
  const text = process.env[name];
  if (text === undefined || text === '') return dflt;
  const n = Number(text);
  if (!Number.isInteger(n) || n < min) throw new BenchError(`${name} must be an integer ≥ ${min}, got ${JSON.stringify(text)}`);
  return n;
}

const ITER = envInt('ITER', 30, 1);
/** TRACE=1: one more (untimed) attachment per side under strace, listing what each plugin exec'd. */
const TRACE = process.env.TRACE === '1';
/** Untimed attachments per side first: bridge, top-level chains and page cache exist afterwards. */
const WARMUP = envInt('WARMUP', 2, 1);

const NSENTER = '/usr/bin/nsenter';
const STRACE = '/usr/bin/strace';
const TRUE = '/bin/true';
const NETWORK = 'wt-bcni';
const CNI_VERSION = '1.0.0'; // the reference plugins speak up to 1.0.0
const POD_NET = IPNet.parse('10.244.77.0/24');
const SUBNET_ENV = 'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.77.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n';
const RUNTIME_CONFIG = {
  portMappings: [
    { hostPort: 8080, containerPort: 80, protocol: 'tcp' },
    { hostPort: 8053, containerPort: 53, protocol: 'udp' },
  ],
};
const PORTMAP_PLUGIN = { type: 'portmap', capabilities: { portMappings: true }, snat: true };
const EXEC_TIMEOUT_MS = 60_000;

type Side = 'ours' | 'ref';
type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

const isObject = (v: unknown): v is JsonObject => typeof v === 'object' && v !== null && !Array.isArray(v);

// ---------------------------------------------------------------------------------------------
// Timed process execution.

interface Timed {
  readonly ms: number;
  /** user + system CPU of the process and everything it waited for (clock-tick resolution). */
  readonly cpuMs: number;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
}

let clkTck = 100;
let running: ChildProcess | null = null;

/** cutime + cstime of this process: CPU of reaped children (and of their reaped children). */
function childCpuTicks(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); cutime and cstime are fields 16 and 17.
  return Number(fields[13]) + Number(fields[14]);
}

/** Runs one process (nothing else runs meanwhile, so the child-CPU delta is its own). */
function timedExec(file: string, args: readonly string[], env: NodeJS.ProcessEnv, stdin: string): Promise<Timed> {
  const cpu0 = childCpuTicks();
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(file, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    running = child;
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
      reject(new BenchError(`${file} ${args.join(' ')} did not finish within ${EXEC_TIMEOUT_MS} ms; stderr: ${stderr.trim()}`));
    }, EXEC_TIMEOUT_MS);
    child.on('error', (err) => {
      clearTimeout(timer);
      running = null;
      reject(err);
    });
    child.on('close', (code, signal) => {
      const ms = performance.now() - t0;
      clearTimeout(timer);
      running = null;
      const cpuMs = ((childCpuTicks() - cpu0) * 1000) / clkTck;
      resolve({ ms, cpuMs, exitCode: code ?? (signal ? 128 : -1), stdout, stderr });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(stdin);
  });
}

// ---------------------------------------------------------------------------------------------
// The two chains.

interface Paths {
  readonly tmp: string;
  readonly bin: string;
  readonly subnetFile: string;
  readonly flannelDir: string;
  readonly ipamDir: string;
}

interface Chain {
  readonly side: Side;
  /** Directory of the executables (= CNI_PATH). */
  readonly dir: string;
  /** Plugin 1: `flannel` (ours) or `bridge` (reference). */
  readonly first: string;
  /** Plugin 1's request config; prevResult is added for DEL. */
  readonly firstConfig: (prevResult: JsonObject | null) => string;
}

/** libcni's request config for portmap: list name and version, capabilities → runtimeConfig. */
function portmapConfig(prevResult: JsonObject): string {
  return JSON.stringify({ ...PORTMAP_PLUGIN, cniVersion: CNI_VERSION, name: NETWORK, runtimeConfig: RUNTIME_CONFIG, prevResult });
}

function oursChain(p: Paths): Chain {
  const plugin = {
    type: 'flannel',
    subnetFile: p.subnetFile,
    dataDir: p.flannelDir,
    // flannel hands `ipam` to host-local as the base of its config: the store goes to the temp dir.
    ipam: { dataDir: p.ipamDir },
    delegate: { hairpinMode: true, isDefaultGateway: true },
  };
  return {
    side: 'ours',
    dir: p.bin,
    first: 'flannel',
    firstConfig: (prev) => JSON.stringify({ ...plugin, cniVersion: CNI_VERSION, name: NETWORK, ...(prev ? { prevResult: prev } : {}) }),
  };
}

/** `delegateBytes`: what our flannel stored (and gave its bridge) for an ADD. */
function referenceChain(delegateBytes: string): Chain {
  const parsed: unknown = JSON.parse(delegateBytes);
  if (!isObject(parsed) || parsed.type !== 'bridge') throw new BenchError(`unexpected delegate config: ${delegateBytes}`);
  return {
    side: 'ref',
    dir: REFERENCE_CNI_DIR,
    first: 'bridge',
    // ADD gets the stored bytes as they are; DEL gets them plus prevResult, as our flannel replays them.
    firstConfig: (prev) => (prev ? JSON.stringify({ ...parsed, prevResult: prev }) : delegateBytes),
  };
}

const STEPS = ['first ADD', 'portmap ADD', 'portmap DEL', 'first DEL'] as const;
type Step = (typeof STEPS)[number];

interface Attachment {
  readonly times: Record<Step, Timed>;
  readonly result: JsonObject;
}

class Bench {
  readonly hostNs: string;
  private readonly pods = new Set<string>();
  private destroyed = false;

  constructor(
    readonly paths: Paths,
    readonly prefix: string,
  ) {
    this.hostNs = `${prefix}-host`;
  }

  async setup(): Promise<void> {
    await addNetns(this.hostNs);
  }

  /** The wrapper every process goes through; `traceFile`: under strace, logging execve there. */
  private wrap(bin: string, traceFile?: string): [string, string[]] {
    const tracer = traceFile === undefined ? [] : [STRACE, '-f', '-qq', '-e', 'trace=execve', '-o', traceFile];
    return [NSENTER, [`--net=/run/netns/${this.hostNs}`, '--', ...tracer, bin]];
  }

  /** One plugin process inside the host netns. */
  async plugin(chain: Chain, type: string, command: string, pod: { containerId: string; ns: string; traceFile?: string }, stdin: string): Promise<Timed> {
    const bin = join(chain.dir, type);
    const env = cniEnv({ bin, command, containerId: pod.containerId, netns: `/run/netns/${pod.ns}`, ifname: 'eth0', path: chain.dir });
    const [file, args] = this.wrap(bin, pod.traceFile);
    return timedExec(file, args, env, stdin);
  }

  async version(chain: Chain, type: string): Promise<Timed> {
    const bin = join(chain.dir, type);
    const [file, args] = this.wrap(bin);
    const t = await timedExec(file, args, cniEnv({ bin, command: 'VERSION', path: chain.dir }), `{"cniVersion":"${CNI_VERSION}"}`);
    if (t.exitCode !== 0 || !t.stdout.includes('supportedVersions')) {
      throw new PluginRunError(chain.side, `${type} VERSION`, '', t.exitCode, t.stdout, t.stderr);
    }
    return t;
  }

  /** `true` through the wrapper, and directly: what entering the host netns costs per process. */
  async wrapperAlone(): Promise<{ wrapped: Timed; direct: Timed }> {
    const [file, args] = this.wrap(TRUE);
    const wrapped = await timedExec(file, args, { PATH: process.env.PATH ?? '/usr/bin:/bin' }, '');
    const direct = await timedExec(TRUE, [], { PATH: process.env.PATH ?? '/usr/bin:/bin' }, '');
    if (wrapped.exitCode !== 0 || direct.exitCode !== 0) throw new BenchError(`true exited ${wrapped.exitCode} / ${direct.exitCode}`);
    return { wrapped, direct };
  }

  /**
   * ADD and DEL of one attachment in a fresh pod netns. `beforeDel` runs untimed between ADD and
   * DEL; with `traceDir` every plugin runs under strace, its execve log in `<traceDir>/<step>`.
   */
  async attachment(
    chain: Chain,
    tag: string,
    opts: { beforeDel?: (containerId: string) => Promise<void>; traceDir?: string } = {},
  ): Promise<Attachment> {
    const podNs = `${this.prefix}-${tag}`;
    const containerId = `bcni-${tag}`;
    const pod = (step: Step) => ({ containerId, ns: podNs, traceFile: opts.traceDir === undefined ? undefined : join(opts.traceDir, step) });
    this.pods.add(podNs);
    await addNetns(podNs);
    const check = (step: Step, t: Timed, wantResult: boolean): JsonObject | null => {
      let json: unknown = null;
      if (wantResult) {
        try {
          json = JSON.parse(t.stdout);
        } catch {
          json = null;
        }
      }
      if (t.exitCode !== 0 || (wantResult && !isObject(json)) || (!wantResult && t.stdout.trim() !== '')) {
        throw new PluginRunError(chain.side, step, containerId, t.exitCode, t.stdout, t.stderr);
      }
      return isObject(json) ? json : null;
    };
    const firstAdd = await this.plugin(chain, chain.first, 'ADD', pod('first ADD'), chain.firstConfig(null));
    const firstResult = check('first ADD', firstAdd, true)!;
    const pmAdd = await this.plugin(chain, 'portmap', 'ADD', pod('portmap ADD'), portmapConfig(firstResult));
    const result = check('portmap ADD', pmAdd, true)!;
    assertPodAddress(chain.side, containerId, result);
    if (opts.beforeDel) await opts.beforeDel(containerId);
    const pmDel = await this.plugin(chain, 'portmap', 'DEL', pod('portmap DEL'), portmapConfig(result));
    check('portmap DEL', pmDel, false);
    const firstDel = await this.plugin(chain, chain.first, 'DEL', pod('first DEL'), chain.firstConfig(result));
    check('first DEL', firstDel, false);
    await delNetns(podNs);
    this.pods.delete(podNs);
    return { times: { 'first ADD': firstAdd, 'portmap ADD': pmAdd, 'portmap DEL': pmDel, 'first DEL': firstDel }, result };
  }

  /** After all DELs: no veth, no per-container chain, no address in host-local's store. */
  async leftovers(): Promise<string[]> {
    const problems: string[] = [];
    const veths = JSON.parse(await sh('ip', ['-n', this.hostNs, '-j', 'link', 'show', 'type', 'veth'])) as { ifname: string }[];
    if (veths.length > 0) problems.push(`veths left in the host netns: ${veths.map((v) => v.ifname).join(', ')}`);
    const nat = await sh('ip', ['netns', 'exec', this.hostNs, 'iptables-save', '-t', 'nat']);
    const perContainer = nat.split('\n').filter((l) => /^:CNI-(DN-)?[0-9a-f]{2,}/.test(l));
    if (perContainer.length > 0) problems.push(`per-container nat chains left: ${perContainer.join(' ')}`);
    const storeDir = join(this.paths.ipamDir, NETWORK);
    const ips = existsSync(storeDir) ? readdirSync(storeDir).filter((f) => /^[0-9]/.test(f)) : ['(no store)'];
    if (ips.length > 0) problems.push(`host-local store still holds ${ips.join(', ')}`);
    const states = existsSync(this.paths.flannelDir) ? readdirSync(this.paths.flannelDir) : [];
    if (states.length > 0) problems.push(`flannel state files left: ${states.join(', ')}`);
    return problems;
  }

  /** Idempotent; also used from the signal handler. */
  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    const child = running;
    if (child?.pid !== undefined && child.exitCode === null) process.kill(child.pid, 'SIGKILL');
    for (const ns of this.pods) await delNetns(ns);
    await delNetns(this.hostNs);
    await rm(this.paths.tmp, { recursive: true, force: true });
  }
}

/**
 * The programs a traced plugin process exec'd, from strace's execve log: the first exec (the
 * plugin itself) is left out, so a weft plugin shows `node` (its shebang) first.
 */
async function execCounts(file: string): Promise<string> {
  const counts = new Map<string, number>();
  const pending = new Map<string, string>();
  let first = true;
  const count = (path: string): void => {
    if (first) {
      first = false;
      return;
    }
    const name = basename(path);
    counts.set(name, (counts.get(name) ?? 0) + 1);
  };
  for (const line of (await readFile(file, 'utf8')).split('\n')) {
    const call = /^(\d+) +execve\("([^"]+)"/.exec(line);
    if (call) {
      if (line.endsWith('<unfinished ...>')) pending.set(call[1]!, call[2]!);
      else if (/\) += 0$/.test(line)) count(call[2]!); // strace pads short lines before "="
      continue;
    }
    const resumed = /^(\d+) +<\.\.\. execve resumed>.*\) += 0$/.exec(line);
    const path = resumed ? pending.get(resumed[1]!) : undefined;
    if (path !== undefined) count(path);
  }
  // Concurrent children exec in any order: sorted by name for a stable line.
  return [...counts].sort(([a], [b]) => a.localeCompare(b)).map(([name, n]) => `${name} ×${n}`).join(', ') || '–';
}

function assertPodAddress(side: Side, containerId: string, result: JsonObject): void {
  const ips = result.ips;
  const first = Array.isArray(ips) ? ips[0] : undefined;
  const address = isObject(first) ? first.address : undefined;
  if (typeof address !== 'string' || !POD_NET.contains(IPNet.parseWithHost(address).ip)) {
    throw new BenchError(`${side} ADD of ${containerId}: result has no address in ${POD_NET.toString()}: ${JSON.stringify(result)}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Statistics and output.

function sorted(xs: readonly number[]): number[] {
  return [...xs].sort((a, b) => a - b);
}
function median(xs: readonly number[]): number {
  const s = sorted(xs);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}
/** Nearest rank, as cni-reference-run.sh computes it. */
function p90(xs: readonly number[]): number {
  const s = sorted(xs);
  return s.length === 0 ? NaN : s[Math.ceil(0.9 * s.length) - 1]!;
}
const mean = (xs: readonly number[]): number => (xs.length === 0 ? NaN : xs.reduce((a, b) => a + b, 0) / xs.length);
const f1 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(1));
const f2 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(2));

interface Series {
  ms: number[];
  cpu: number[];
}
const series = (): Series => ({ ms: [], cpu: [] });
const push = (s: Series, t: { ms: number; cpuMs: number }): void => {
  s.ms.push(t.ms);
  s.cpu.push(t.cpuMs);
};

type Row = 'first ADD' | 'portmap ADD' | 'chain ADD' | 'portmap DEL' | 'first DEL' | 'chain DEL' | 'VERSION';
const ROWS: readonly { key: Row; label: string }[] = [
  { key: 'first ADD', label: 'flannel/bridge ADD (incl. host-local)' },
  { key: 'portmap ADD', label: 'portmap ADD (2 mappings)' },
  { key: 'chain ADD', label: '**chain ADD**' },
  { key: 'portmap DEL', label: 'portmap DEL' },
  { key: 'first DEL', label: 'flannel/bridge DEL (incl. host-local)' },
  { key: 'chain DEL', label: '**chain DEL**' },
  { key: 'VERSION', label: 'bridge VERSION (start-up)' },
];

function newResults(): Record<Row, Series> {
  return Object.fromEntries(ROWS.map((r) => [r.key, series()])) as Record<Row, Series>;
}

function record(res: Record<Row, Series>, a: Attachment): void {
  const t = a.times;
  for (const s of STEPS) push(res[s], t[s]);
  const sum = (x: Timed, y: Timed) => ({ ms: x.ms + y.ms, cpuMs: x.cpuMs + y.cpuMs });
  push(res['chain ADD'], sum(t['first ADD'], t['portmap ADD']));
  push(res['chain DEL'], sum(t['portmap DEL'], t['first DEL']));
}

function printTable(header: string[], rows: string[][]): void {
  console.log(`| ${header.join(' | ')} |`);
  console.log(`|${header.map(() => '---').join('|')}|`);
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
}

const loadavg = (): string => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

async function machineFacts(prefix: string): Promise<void> {
  const cpu = cpus();
  const tool = async (cmd: string, a: string[]) => (await sh(cmd, a).catch((e: Error) => e.message)).split('\n')[0]!.trim();
  const [kernel, ipt, pkg] = await Promise.all([
    tool('uname', ['-r']),
    tool('iptables', ['--version']),
    tool('dpkg-query', ['-W', '-f=${Package} ${Version}', 'containernetworking-plugins']),
  ]);
  const others = existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => !n.startsWith(prefix)).length : 0;
  console.log(`machine: ${cpu.length} × ${cpu[0]?.model ?? '?'}, kernel ${kernel}, node ${process.version}, ${ipt}`);
  console.log(`reference: ${pkg} (${REFERENCE_CNI_DIR})`);
  console.log(`load average at start: ${loadavg()}; other network namespaces present (other tests running?): ${others}`);
}

// ---------------------------------------------------------------------------------------------

/** Set on SIGINT/SIGTERM: what fails afterwards fails because of the cleanup. */
let interrupted = false;

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces, iptables inside them)');
  for (const f of [NSENTER, TRUE, ...(TRACE ? [STRACE] : []), join(REFERENCE_CNI_DIR, 'bridge'), join(REFERENCE_CNI_DIR, 'host-local'), join(REFERENCE_CNI_DIR, 'portmap')]) {
    if (!existsSync(f)) throw new BenchError(`${f} is missing (reference plugins: apt-get install containernetworking-plugins)`);
  }
  clkTck = Number((await sh('getconf', ['CLK_TCK'])).trim()) || 100;
  const prefix = `wt-bcni-${process.pid}`;
  await machineFacts(prefix);

  const tmp = await mkdtemp(join(tmpdir(), 'wt-bcni-'));
  const paths: Paths = {
    tmp,
    bin: join(tmp, 'bin'),
    subnetFile: join(tmp, 'flannel', 'subnet.env'),
    flannelDir: join(tmp, 'flannel-data'),
    ipamDir: join(tmp, 'ipam'),
  };
  const bench = new Bench(paths, prefix);
  const onSignal = (sig: NodeJS.Signals): void => {
    interrupted = true;
    console.error(`\n${sig}: cleaning up`);
    void bench.destroy().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);

  const ours = newResults();
  const ref = newResults();
  const wrapped = series();
  const direct = series();
  let delegateBytes = '';
  let problems: string[] = [];
  const execs = new Map<string, string>();
  const began = performance.now();
  try {
    await mkdir(join(tmp, 'flannel'), { recursive: true });
    await writeFile(paths.subnetFile, SUBNET_ENV);
    await buildCniPlugins(paths.bin);
    await bench.setup();
    const our = oursChain(paths);

    // Warm-up: the first ours ADD also yields the delegate config the reference bridge gets.
    await bench.attachment(our, 'ow0', {
      beforeDel: async (cid) => {
        delegateBytes = await readFile(join(paths.flannelDir, cid), 'utf8');
      },
    });
    const reference = referenceChain(delegateBytes);
    await bench.attachment(reference, 'rw0');
    for (let w = 1; w < WARMUP; w++) {
      await bench.attachment(our, `ow${w}`);
      await bench.attachment(reference, `rw${w}`);
    }
    console.log(`delegate config (from our flannel's state file; the reference bridge's stdin): ${delegateBytes}`);
    console.log(`${ITER} iterations after ${WARMUP} warm-up attachment(s) per side; the side going first alternates\n`);

    for (let i = 0; i < ITER; i++) {
      const order: Chain[] = i % 2 === 0 ? [our, reference] : [reference, our];
      for (const chain of order) {
        record(chain.side === 'ours' ? ours : ref, await bench.attachment(chain, `${chain.side === 'ours' ? 'o' : 'r'}${i}`));
      }
      const versions = i % 2 === 0 ? [[our, ours], [reference, ref]] as const : [[reference, ref], [our, ours]] as const;
      for (const [chain, res] of versions) push(res.VERSION, await bench.version(chain, 'bridge'));
      const w = await bench.wrapperAlone();
      push(wrapped, w.wrapped);
      push(direct, w.direct);
    }
    if (TRACE) {
      for (const chain of [our, reference]) {
        const dir = join(tmp, `trace-${chain.side}`);
        await mkdir(dir);
        await bench.attachment(chain, `${chain.side === 'ours' ? 'o' : 'r'}t`, { traceDir: dir });
        for (const step of STEPS) execs.set(`${chain.side} ${step}`, await execCounts(join(dir, step)));
      }
    }
    problems = await bench.leftovers();
  } finally {
    await bench.destroy();
  }

  console.log(`finished in ${f1((performance.now() - began) / 1000)} s; load average at end: ${loadavg()}\n`);
  console.log(`## CNI latency, ms (${ITER} iterations; ours = weft bundles, ref = Debian 1.1.1; same run, interleaved)\n`);
  const rows = ROWS.map(({ key, label }) => {
    const o = ours[key];
    const r = ref[key];
    return [label, f1(median(o.ms)), f1(p90(o.ms)), f1(median(r.ms)), f1(p90(r.ms)), f2(median(o.ms) / median(r.ms)), f1(mean(o.cpu)), f1(mean(r.cpu))];
  });
  printTable(['step', 'ours median', 'ours p90', 'ref median', 'ref p90', 'ratio (medians)', 'ours CPU', 'ref CPU'], rows);
  console.log('\n(CPU: mean user+system ms per call of the plugin and all its children, from clock ticks of 1 s / ' + `${clkTck})`);

  // Start-up is about the same for every process of a side (VERSION is start-up plus a print):
  // what remains of a chain after two start-ups is the plugins' work.
  const work = (res: Record<Row, Series>, row: Row): number => median(res[row].ms) - 2 * median(res.VERSION.ms);
  console.log(
    `\nchain minus 2 × VERSION (the plugins' work without process start-up): ADD ours ${f1(work(ours, 'chain ADD'))}, ref ${f1(work(ref, 'chain ADD'))}; ` +
      `DEL ours ${f1(work(ours, 'chain DEL'))}, ref ${f1(work(ref, 'chain DEL'))} ms`,
  );
  if (execs.size > 0) {
    console.log('\n## Programs each plugin exec\'d (TRACE=1: one more attachment per side under strace)\n');
    const label = (step: Step): string => ROWS.find((r) => r.key === step)?.label ?? step;
    printTable(['step', 'ours', 'ref'], STEPS.map((step) => [label(step), execs.get(`ours ${step}`) ?? '–', execs.get(`ref ${step}`) ?? '–']));
  }

  const extra = median(wrapped.ms) - median(direct.ms);
  console.log(
    `\nwrapper: \`nsenter --net=… -- true\` median ${f1(median(wrapped.ms))} ms (p90 ${f1(p90(wrapped.ms))}), ` +
      `plain \`true\` ${f1(median(direct.ms))} ms (p90 ${f1(p90(direct.ms))}): nsenter adds ${f1(extra)} ms to every plugin process, on both sides`,
  );

  const verdict = (label: string, row: Row, target: number): void => {
    const o = median(ours[row].ms);
    const r = median(ref[row].ms);
    const raw = o / r;
    // Two plugin processes per chain step pair, each paying the wrapper once.
    const adj = (o - 2 * extra) / (r - 2 * extra);
    console.log(
      `target ${label} ≤ ${target}× reference: ${f2(raw)} → ${raw <= target ? 'met' : 'NOT met'}` +
        `; without the wrapper's extra ${f1(2 * extra)} ms per chain: ${f2(adj)} → ${adj <= target ? 'met' : 'NOT met'}`,
    );
  };
  console.log('');
  verdict('chain ADD', 'chain ADD', 1.2);
  verdict('chain DEL', 'chain DEL', 0.7);
  if (problems.length > 0) {
    console.log(`\nleft behind after the last DEL:\n  ${problems.join('\n  ')}`);
    process.exitCode = 1;
  } else {
    console.log('\nafter the last DEL: no veth, no per-container nat chain, no host-local address, no flannel state left');
  }
}

main().catch((e: unknown) => {
  if (interrupted) return;
  console.error(e instanceof Error ? e.message : e);
  process.exitCode = 1;
});
