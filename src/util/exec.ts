// The one process runner of weftd, the weft CLI and the CNI plugins: a program with an argument
// array (never a shell), optional stdin, inherited file descriptors, a deadline, and one error type
// that carries the command line, the exit status and both streams.
//
// Two ways to wait: `runCommand` wants exit status 0 and gives stdout; `execProgram` gives back
// any exit status with both streams (`ip -force -batch` reports partial failures while still
// printing what it could read). `startProgram` starts a program before its input is known, so that
// its start-up overlaps the caller's remaining work (the CNI plugins' critical path).
// `forkModule` starts a long-lived Node.js child that talks over an IPC channel (the CNI server's
// plugin process).
import { fork, spawn, type ChildProcess } from 'node:child_process';

export type { ChildProcess };

export interface ExecResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** A program could not run (exitCode null: not installed, killed, timed out) or exited non-zero. */
export class CommandError extends Error {
  constructor(
    readonly command: string,
    readonly args: readonly string[],
    readonly exitCode: number | null,
    readonly stderr: string,
    why: string,
    /** What the program printed before failing (some report results through a non-zero exit). */
    readonly stdout?: string,
    /** The signal that ended it, when one did. */
    readonly signal: NodeJS.Signals | null = null,
  ) {
    const detail = stderr.trim() || (exitCode !== null ? (stdout ?? '').trim() : '');
    super(`${command} ${args.join(' ')}: ${why}${detail ? `: ${detail}` : ''}`);
    this.name = 'CommandError';
  }

  /** The program does not exist on this machine. */
  get notFound(): boolean {
    return this.exitCode === null && /ENOENT/.test(this.message);
  }

  /** A program that ran and exited non-zero. */
  static failed(command: string, args: readonly string[], r: ExecResult): CommandError {
    return new CommandError(command, args, r.code, r.stderr, `exit status ${r.code}`, r.stdout);
  }
}

export interface ExecOptions {
  readonly input?: string;
  /** File descriptors the child inherits as fd 3, 4, … (after nsFds) */
  readonly extraFds?: readonly number[];
  /**
   * Namespace files (open /run/netns/…, /proc/…/ns/… fds) the child gets as fd 3, 4, … Unlike
   * extraFds, the spawn helper (useSpawnHelper) can pass these: the same namespace reopened
   * through /proc is as good as the fd itself, which a lock's fd is not.
   */
  readonly nsFds?: readonly number[];
  /** Default 30 s; the child is killed (SIGTERM) after it. 0: no deadline. */
  readonly timeoutMs?: number;
  /** The child's environment (default: ours); LC_ALL=C is always set, the messages we match on are the untranslated ones. */
  readonly env?: NodeJS.ProcessEnv;
}

/** A program started before its input is known: it waits on stdin until `feed`. */
export interface StartedProgram {
  /** Writes `input` to the program's stdin and closes it; only the first call writes. */
  feed(input: string): void;
  /** Settles when the program has exited (rejects with a CommandError, exitCode null, when it could not run or was killed). */
  readonly result: Promise<ExecResult>;
  /**
   * The child's process id; undefined when it could not be started, and when the spawn helper
   * started it (pass extraFds to get Node's spawn, and a pid, in the CNI plugin process).
   */
  readonly pid: number | undefined;
}

/** What the spawn helper is asked to run (the environment is final: LC_ALL=C is in it). */
export interface HelperSpawnRequest {
  readonly command: string;
  readonly args: readonly string[];
  readonly stdin: 'ignore' | 'pipe';
  readonly env: NodeJS.ProcessEnv;
  readonly timeoutMs: number;
  readonly nsFds: readonly number[];
}

/** Starts programs for spawnProgram (src/util/spawn-helper.ts); see useSpawnHelper. */
export interface SpawnBackend {
  /**
   * Starts `req`, or returns undefined to have Node's spawn do it. `fallback` runs it with Node's
   * spawn instead, for a request the backend finds it cannot run after all (before it started).
   */
  start(req: HelperSpawnRequest, fallback: () => StartedProgram): StartedProgram | undefined;
}

let spawnBackend: SpawnBackend | undefined;

/**
 * From now on, programs without extraFds are started by `backend` (the CNI plugin process's spawn
 * helper: a fork of a 60 MB Node process costs its event loop ~3.7 ms); undefined: Node's spawn.
 */
export function useSpawnHelper(backend: SpawnBackend | undefined): void {
  spawnBackend = backend;
}

function childEnv(opts: Pick<ExecOptions, 'env'>): NodeJS.ProcessEnv {
  return { ...(opts.env ?? process.env), LC_ALL: 'C' };
}

function spawnProgram(command: string, args: readonly string[], stdin: 'ignore' | 'pipe', opts: Omit<ExecOptions, 'input'>): StartedProgram {
  if (spawnBackend && !opts.extraFds?.length) {
    const req = { command, args, stdin, env: childEnv(opts), timeoutMs: opts.timeoutMs ?? 30_000, nsFds: opts.nsFds ?? [] };
    const p = spawnBackend.start(req, () => nodeSpawnProgram(command, args, stdin, opts));
    if (p) return p;
  }
  return nodeSpawnProgram(command, args, stdin, opts);
}

/**
 * Starts the spawn helper (src/util/spawn-helper.ts) with pipes on its stdin and stdout, our
 * stderr. The caller must handle 'error' (e.g. ENOENT: not built).
 */
export function startSpawnHelperProcess(file: string, args: readonly string[]): ChildProcess {
  return spawn(file, [...args], { stdio: ['pipe', 'pipe', 'inherit'], env: childEnv({}) });
}

function nodeSpawnProgram(command: string, args: readonly string[], stdin: 'ignore' | 'pipe', opts: Omit<ExecOptions, 'input'>): StartedProgram {
  let fed = false;
  let feedStdin: (input: string) => void = () => {};
  let pid: number | undefined;
  const result = new Promise<ExecResult>((resolve, reject) => {
    const child = spawn(command, [...args], {
      stdio: [stdin, 'pipe', 'pipe', ...(opts.nsFds ?? []), ...(opts.extraFds ?? [])],
      timeout: opts.timeoutMs ?? 30_000,
      env: childEnv(opts),
    });
    pid = child.pid;
    let stdout = '';
    let stderr = '';
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', (e) => reject(new CommandError(command, args, null, stderr, e.message)));
    child.on('close', (code, signal) => {
      if (code === null) reject(new CommandError(command, args, null, stderr, `killed by ${signal ?? 'a signal'}`, stdout, signal));
      else resolve({ code, stdout, stderr });
    });
    if (child.stdin) {
      const input = child.stdin;
      // A program that exits without reading all of stdin must not crash us with EPIPE.
      input.on('error', () => {});
      feedStdin = (text) => input.end(text);
    }
  });
  // Whoever started it may fail elsewhere before awaiting it: that must not be an unhandled rejection.
  result.catch(() => undefined);
  return {
    feed(input: string): void {
      if (fed) return;
      fed = true;
      feedStdin(input);
    },
    result,
    pid,
  };
}

/** Resolves with the exit status and both streams, whatever the status. */
export function execProgram(command: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  if (opts.input === undefined) return spawnProgram(command, args, 'ignore', opts).result;
  const p = spawnProgram(command, args, 'pipe', opts);
  p.feed(opts.input);
  return p.result;
}

/**
 * Starts `command` now with its stdin open, so that its start-up (fork, exec, nsenter, loading)
 * overlaps whatever the caller still has to do before it knows the input. Every started program
 * must be fed (an empty input lets `ip -batch` and `sysctl -p-` exit doing nothing).
 */
export function startProgram(command: string, args: readonly string[], opts: Omit<ExecOptions, 'input'> = {}): StartedProgram {
  return spawnProgram(command, args, 'pipe', opts);
}

/** Runs and requires exit status 0; resolves with the whole result. */
export async function execChecked(command: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  const r = await execProgram(command, args, opts);
  if (r.code !== 0) throw CommandError.failed(command, args, r);
  return r;
}

/** Runs and requires exit status 0; resolves with stdout. stdin is always a pipe (empty by default). */
export async function runCommand(command: string, args: readonly string[], opts: ExecOptions = {}): Promise<string> {
  const r = await execChecked(command, args, { ...opts, input: opts.input ?? '' });
  return r.stdout;
}

export interface LineStream {
  /** Ends the program (SIGTERM); resolves when it has exited. */
  stop(): Promise<void>;
  /** Resolves with the exit status (null: killed) when the program ends on its own or is stopped. */
  readonly exited: Promise<number | null>;
}

/**
 * A long-running program whose output is read line by line as it comes (`ip monitor`): stdout
 * lines to `onLine`, stderr lines to `onErrorLine`. No deadline.
 */
export function streamLines(
  command: string,
  args: readonly string[],
  handlers: { readonly onLine: (line: string) => void; readonly onErrorLine?: (line: string) => void },
  opts: Pick<ExecOptions, 'env'> = {},
): LineStream {
  const child = spawn(command, [...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...(opts.env ?? process.env), LC_ALL: 'C' } });
  const split = (onLine: (line: string) => void) => {
    let rest = '';
    return (chunk: string) => {
      const parts = (rest + chunk).split('\n');
      rest = parts.pop() ?? '';
      for (const p of parts) onLine(p);
    };
  };
  child.stdout.setEncoding('utf8').on('data', split(handlers.onLine));
  child.stderr.setEncoding('utf8').on('data', split(handlers.onErrorLine ?? (() => {})));
  const exited = new Promise<number | null>((resolve) => {
    child.on('error', () => resolve(null));
    child.on('close', (code) => resolve(code));
  });
  return {
    exited,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}

const LOADER_FLAG = /^--(import|require|loader|experimental-loader)(=|$)/;
const MEMORY_FLAG = /^--max-(semi|old)-space-size=/;

/**
 * Starts `modulePath` in a new Node.js process with an IPC channel (JSON messages), its stdout
 * and stderr shared with ours. Of this process's Node.js flags only the module loaders and heap
 * sizes are passed on (not profiling or inspector flags). `loader` (a module URL for --import) is
 * used when this process has no loader flag (bin/weftd registers tsx through its API when running
 * from source, which leaves no flag behind).
 */
export function forkModule(modulePath: string, opts: { readonly loader?: string } = {}): ChildProcess {
  const execArgv: string[] = [];
  const own = process.execArgv;
  for (let i = 0; i < own.length; i++) {
    const a = own[i]!;
    if (MEMORY_FLAG.test(a) || (LOADER_FLAG.test(a) && a.includes('='))) execArgv.push(a);
    else if (LOADER_FLAG.test(a) && i + 1 < own.length) execArgv.push(a, own[++i]!);
  }
  if (opts.loader !== undefined && !execArgv.some((a) => LOADER_FLAG.test(a))) execArgv.push(`--import=${opts.loader}`);
  return fork(modulePath, [], { execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'], serialization: 'json' });
}
