// A cross-process exclusive lock that is a real flock(2) on a file, so it excludes (and is excluded
// by) the reference Go plugins, which flock the same files through go-filemutex. Node has no flock
// binding: we open the file ourselves and let flock(1) take the lock on an inherited copy of our
// descriptor. flock locks belong to the open file description, which the child shares with us, so
// the lock stays held after flock(1) exits and is released when we close our descriptor.
import { closeSync, constants, existsSync, openSync } from 'node:fs';

import { errorMessage } from './errors.js';
import { execProgram, type ExecResult } from './exec.js';

export class FileLockError extends Error {
  constructor(
    readonly path: string,
    readonly reason: string,
  ) {
    super(`failed to lock ${path}: ${reason}`);
    this.name = 'FileLockError';
  }
}

export interface FileLockOptions {
  /** Mode for a lock file we create. Default 0o750, what go-filemutex creates. */
  readonly mode?: number;
  /** Give up after this many seconds (flock -w). Default: wait as long as it takes, like the reference. */
  readonly timeoutSeconds?: number;
}

let flockBinary: string | undefined;

/** Runtimes often exec plugins with a minimal PATH; prefer the absolute util-linux path. */
function flockPath(): string {
  flockBinary ??= ['/usr/bin/flock', '/bin/flock', '/usr/local/bin/flock'].find((p) => existsSync(p)) ?? 'flock';
  return flockBinary;
}

// The descriptor number the child sees: stdio index 3.
const CHILD_FD = 3;

async function takeLock(path: string, fd: number, timeoutSeconds: number | undefined): Promise<void> {
  const args = ['-x'];
  if (timeoutSeconds !== undefined) args.push('-w', String(timeoutSeconds));
  args.push(String(CHILD_FD));
  let r: ExecResult;
  try {
    // No deadline of the runner's own: flock -w is the deadline, and without it we wait as the reference does.
    r = await execProgram(flockPath(), args, { extraFds: [fd], timeoutMs: 0 });
  } catch (e) {
    throw new FileLockError(path, `cannot run flock: ${errorMessage(e)}`);
  }
  if (r.code === 0) return;
  if (r.code === 1 && timeoutSeconds !== undefined) throw new FileLockError(path, `still held by another process after ${timeoutSeconds}s`);
  const why = `flock exit status ${r.code}`;
  throw new FileLockError(path, r.stderr.trim() ? `${why}: ${r.stderr.trim()}` : why);
}

/**
 * Runs `fn` while holding an exclusive flock(2) on `path` (created if missing). The lock is
 * released when `fn` settles, whatever the outcome. Not re-entrant: a nested call on the same
 * path from inside `fn` waits forever, as it would with flock(2) on two descriptors.
 */
export async function withFileLock<T>(path: string, fn: () => Promise<T>, opts: FileLockOptions = {}): Promise<T> {
  let fd: number;
  try {
    // Read-only like go-filemutex: flock needs no write access, and a read-only open works on a
    // lock file another user created with mode 0750. (Sync: node:fs/promises costs ~1.5 ms to load.)
    fd = openSync(path, constants.O_RDONLY | constants.O_CREAT, opts.mode ?? 0o750);
  } catch (e) {
    throw new FileLockError(path, errorMessage(e));
  }
  try {
    await takeLock(path, fd, opts.timeoutSeconds);
    return await fn();
  } finally {
    closeSync(fd);
  }
}
