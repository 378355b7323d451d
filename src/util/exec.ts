// Runs a program with an argument array (never a shell), optional stdin, a deadline, and an error
// that carries the command line and the program's stderr.
import { spawn } from 'node:child_process';

export class CommandError extends Error {
  constructor(
    readonly command: string,
    readonly args: readonly string[],
    readonly exitCode: number | null,
    readonly stderr: string,
    why: string,
    /** What the program printed before failing (some report results through a non-zero exit). */
    readonly stdout?: string,
  ) {
    super(`${command} ${args.join(' ')}: ${why}${stderr.trim() ? `: ${stderr.trim()}` : ''}`);
    this.name = 'CommandError';
  }

  /** The program does not exist on this machine. */
  get notFound(): boolean {
    return this.exitCode === null && /ENOENT/.test(this.message);
  }
}

export interface RunOptions {
  readonly stdin?: string;
  readonly timeoutMs?: number;
  /** The child's environment (default: ours). */
  readonly env?: NodeJS.ProcessEnv;
}

/** Resolves with stdout when the program exits 0. */
export function runCommand(command: string, args: readonly string[], opts: RunOptions = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe'], timeout: opts.timeoutMs ?? 30_000, ...(opts.env ? { env: opts.env } : {}) });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', (e) => reject(new CommandError(command, args, null, stderr, e.message)));
    child.on('close', (code, signal) => {
      if (code === 0) resolve(stdout);
      else reject(new CommandError(command, args, code, stderr, signal ? `killed by ${signal}` : `exit status ${code}`, stdout));
    });
    // A program that exits without reading stdin must not crash us with EPIPE.
    child.stdin.on('error', () => {});
    child.stdin.end(opts.stdin ?? '');
  });
}
