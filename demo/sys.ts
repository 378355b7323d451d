// The demo's effectful edge: commands (argument arrays, never a shell), namespaces, detached
// long-lived processes logging to files, and the removal of everything a demo made. Removal finds
// its targets by the fixed `weftdemo-` prefix and the fixed state directory, so `--clean` can
// remove a demo kept by an earlier run.
import { spawn } from 'node:child_process';
import { runCommand } from '../src/util/exec.js';
import { appendFileSync, closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/** Every namespace of the demo starts with this; nothing else on the machine should. */
export const NS_PREFIX = 'weftdemo-';
/** Subnet files, CNI bin dirs, conflists, plugin state, etcd data and logs of a demo. */
export const STATE_DIR = '/run/weft-demo';

/** PATH for children: node's own directory first, so `#!/usr/bin/env node` plugins and bins find it. */
export function childPath(): string {
  const base = process.env.PATH || '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
  return `${dirname(process.execPath)}:${base}`;
}

export interface RunOptions {
  readonly timeoutMs?: number;
  readonly env?: NodeJS.ProcessEnv;
  readonly input?: string;
}

/** Runs a program to completion and returns its stdout; non-zero exit → CommandError. */
export function run(cmd: string, args: readonly string[], opts: RunOptions = {}): Promise<string> {
  return runCommand(cmd, args, {
    timeoutMs: opts.timeoutMs ?? 30_000,
    env: opts.env ?? { ...process.env, PATH: childPath() },
    ...(opts.input !== undefined ? { input: opts.input } : {}),
  });
}

/** `ip -n NS …` */
export function ipn(ns: string, ...args: string[]): Promise<string> {
  return run('ip', ['-n', ns, ...args]);
}

/** A program inside a namespace (`ip netns exec` execs it, so it keeps no wrapper process). */
export function nsRun(ns: string, cmd: string, args: readonly string[], opts: RunOptions = {}): Promise<string> {
  return run('ip', ['netns', 'exec', ns, cmd, ...args], opts);
}

export async function addNetns(name: string): Promise<void> {
  if (!name.startsWith(NS_PREFIX) || !/^[a-z0-9-]{1,40}$/.test(name)) throw new Error(`bad demo namespace name ${name}`);
  await run('ip', ['netns', 'add', name]);
  await ipn(name, 'link', 'set', 'lo', 'up');
}

/** The demo's namespaces that exist now. */
export async function demoNamespaces(): Promise<string[]> {
  const out = await run('ip', ['-j', 'netns', 'list']).catch(() => '');
  if (out.trim() === '') return [];
  const list = JSON.parse(out) as { name: string }[];
  return list.map((n) => n.name).filter((n) => n.startsWith(NS_PREFIX)).sort();
}

/** PIDs this process started with spawnInNs; stopped by removeDemo even if not (yet) inside a namespace. */
const started = new Set<number>();
let refusing = false;

/** From now on spawnInNs refuses: a removal is under way (Ctrl-C while the demo is starting). */
export function refuseNewProcesses(): void {
  refusing = true;
}

/**
 * Starts a long-lived program inside a namespace in a session of its own (a terminal's Ctrl-C
 * does not reach it; the demo stops it), stdout and stderr appended to `logFile`, not waited for
 * (so a `--keep` demo leaves it running). Returns its PID (that of the program: `ip netns exec` execs).
 */
export function spawnInNs(ns: string, argv: readonly string[], logFile: string, env: NodeJS.ProcessEnv = {}): number {
  if (refusing) throw new Error(`not starting ${argv[0]} in ${ns}: the demo is being removed`);
  const fd = openSync(logFile, 'a');
  try {
    const child = spawn('ip', ['netns', 'exec', ns, ...argv], {
      detached: true,
      stdio: ['ignore', fd, fd],
      env: { ...process.env, PATH: childPath(), ...env },
    });
    child.on('error', () => undefined); // reported through the exit status the caller polls for
    child.unref();
    if (child.pid === undefined) throw new Error(`could not start ${argv.join(' ')} in ${ns}`);
    started.add(child.pid);
    return child.pid;
  } finally {
    closeSync(fd);
  }
}

/**
 * Daemons other demo processes depend on (Open vSwitch under weftd), one `<pid> <start time>
 * <label>` line each: removeDemo stops them after everything else, also from `--clean` in a
 * later process. The start time keeps a recycled PID from being signalled.
 */
const DAEMONS_FILE = join(STATE_DIR, 'daemons');

/** The kernel start time of `pid` (field 22 of /proc/<pid>/stat), or null when it is gone. */
function startTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? null;
  } catch {
    return null;
  }
}

/** Records a daemon started with spawnInNs as one to stop last (see DAEMONS_FILE). */
export function recordDaemon(pid: number, label: string): void {
  const t = startTime(pid);
  if (t === null) return; // already gone: nothing to stop
  appendFileSync(DAEMONS_FILE, `${pid} ${t} ${label.replace(/\s+/g, '_')}\n`);
}

export interface RecordedDaemon {
  readonly pid: number;
  /** "ovs-vswitchd@n1" */
  readonly label: string;
}

/** The recorded daemons that still run as the process that was recorded. */
function recordedDaemons(): RecordedDaemon[] {
  let text: string;
  try {
    text = readFileSync(DAEMONS_FILE, 'utf8');
  } catch {
    return [];
  }
  const out: RecordedDaemon[] = [];
  for (const line of text.split('\n')) {
    const [pid, t, label] = line.split(' ');
    const n = Number(pid);
    if (!Number.isInteger(n) || n <= 0 || label === undefined) continue;
    if (startTime(n) === t && alive(n)) out.push({ pid: n, label });
  }
  return out;
}

/** Whether `pid` is alive (and not a zombie waiting to be reaped). */
export function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Field 3, after the parenthesised command name, is the state.
    return !/\) [ZX] /.test(stat);
  } catch {
    return false;
  }
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/** SIGTERM the PIDs, wait up to `graceMs` for them to go, then SIGKILL what is left. */
export async function stopPids(pids: readonly number[], graceMs = 5000): Promise<void> {
  for (const p of pids) signal(p, 'SIGTERM');
  const deadline = Date.now() + graceMs;
  while (pids.some(alive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  const left = pids.filter(alive);
  for (const p of left) signal(p, 'SIGKILL');
  const hard = Date.now() + 2000;
  while (left.some(alive) && Date.now() < hard) await new Promise((r) => setTimeout(r, 20));
}

/** The PIDs of processes inside a namespace. */
async function pidsIn(ns: string): Promise<number[]> {
  const out = await run('ip', ['netns', 'pids', ns]).catch(() => '');
  return out
    .split('\n')
    .map((l) => Number(l.trim()))
    .filter((n) => Number.isInteger(n) && n > 0 && n !== process.pid);
}

export interface RemoveReport {
  readonly namespaces: string[];
  /** Every process stopped, the recorded daemons included. */
  readonly pids: number[];
  /** The recorded daemons, stopped after the other processes. */
  readonly daemons: RecordedDaemon[];
  readonly stateDir: boolean;
}

/**
 * Removes a demo: stops every process inside a `weftdemo-` namespace (by PID; those are the
 * daemons, etcd and the test servers the demo started there), then the recorded daemons they
 * used (Open vSwitch: a weftd that outlived it would log errors while it stops), deletes the
 * namespaces (their links, addresses, routes and netfilter rules go with them) and the state
 * directory.
 */
export async function removeDemo(): Promise<RemoveReport> {
  const namespaces = await demoNamespaces();
  const daemons = recordedDaemons();
  const last = new Set(daemons.map((d) => d.pid));
  // `ip netns exec` keeps its PID when it execs the program, so a PID started a moment ago is
  // stopped even if it has not entered its namespace yet.
  const first = [...new Set([...started, ...(await Promise.all(namespaces.map(pidsIn))).flat()])].filter((p) => !last.has(p));
  await stopPids(first);
  await stopPids([...last]);
  for (const ns of namespaces) await run('ip', ['netns', 'del', ns]).catch(() => undefined);
  const stateDir = existsSync(STATE_DIR);
  await rm(STATE_DIR, { recursive: true, force: true });
  return { namespaces, pids: [...first, ...last], daemons, stateDir };
}

/** Runs `fn` over the items with at most `limit` in flight, results in input order. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
