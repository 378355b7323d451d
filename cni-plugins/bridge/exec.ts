// Runs a helper program (ip, bridge, nsenter, sysctl, iptables-restore, nft) with an argument
// array, optional stdin and extra inherited file descriptors. Unlike a "stdout or throw" runner it
// hands back the exit status with both streams, because `ip -force -batch` reports partial
// failures while still printing what it could read.
import { spawn } from 'node:child_process';

export interface ExecResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** The program could not be run at all (not installed, killed, timed out). */
export class ExecError extends Error {
  constructor(
    readonly command: string,
    readonly args: readonly string[],
    readonly reason: string,
  ) {
    super(`${command} ${args.join(' ')}: ${reason}`);
    this.name = 'ExecError';
  }

  get notFound(): boolean {
    return /ENOENT/.test(this.reason);
  }
}

/** A program that ran and failed; the message carries its stderr (what the user needs). */
export class CommandFailedError extends Error {
  constructor(
    readonly command: string,
    readonly args: readonly string[],
    readonly result: ExecResult,
  ) {
    super(`${command} ${args.join(' ')} failed (exit status ${result.code}): ${result.stderr.trim() || result.stdout.trim()}`);
    this.name = 'CommandFailedError';
  }
}

export interface ExecOptions {
  readonly input?: string;
  /** File descriptors the child inherits as fd 3, 4, … */
  readonly extraFds?: readonly number[];
  readonly timeoutMs?: number;
}

/** A program started before its input is known: it waits on stdin until `feed`. */
export interface StartedProgram {
  /** Writes `input` to the program's stdin and closes it; only the first call writes. */
  feed(input: string): void;
  /** Settles when the program has exited (rejects with ExecError when it could not run). */
  readonly result: Promise<ExecResult>;
}

function spawnProgram(command: string, args: readonly string[], stdin: 'ignore' | 'pipe', opts: ExecOptions): StartedProgram {
  let fed = false;
  let feedStdin: (input: string) => void = () => {};
  const result = new Promise<ExecResult>((resolve, reject) => {
    const child = spawn(command, [...args], {
      stdio: [stdin, 'pipe', 'pipe', ...(opts.extraFds ?? [])],
      timeout: opts.timeoutMs ?? 30_000,
      env: { ...process.env, LC_ALL: 'C' }, // messages we match on are the untranslated ones
    });
    let stdout = '';
    let stderr = '';
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', (e) => reject(new ExecError(command, args, e.message)));
    child.on('close', (code, signal) => {
      if (code === null) reject(new ExecError(command, args, `killed by ${signal ?? 'a signal'}${stderr ? `: ${stderr.trim()}` : ''}`));
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
  };
}

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

/** Runs and requires exit status 0. */
export async function execChecked(command: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  const r = await execProgram(command, args, opts);
  if (r.code !== 0) throw new CommandFailedError(command, args, r);
  return r;
}
