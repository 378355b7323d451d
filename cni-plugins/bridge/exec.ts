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

export function execProgram(command: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const stdinMode = opts.input === undefined ? 'ignore' : 'pipe';
    const child = spawn(command, [...args], {
      stdio: [stdinMode, 'pipe', 'pipe', ...(opts.extraFds ?? [])],
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
      // A program that exits without reading all of stdin must not crash us with EPIPE.
      child.stdin.on('error', () => {});
      child.stdin.end(opts.input);
    }
  });
}

/** Runs and requires exit status 0. */
export async function execChecked(command: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  const r = await execProgram(command, args, opts);
  if (r.code !== 0) throw new CommandFailedError(command, args, r);
  return r;
}
