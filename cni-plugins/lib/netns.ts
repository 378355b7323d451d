// The pod's network namespace as CNI_NETNS names it, held open as a file descriptor (so it cannot
// vanish or be swapped between the checks and the changes) and handed to child programs as fd 3
// (`nsenter --net=/proc/self/fd/3`, `ip … netns /proc/self/fd/3`). Validated as the reference
// ns.GetNS does it (Statfs magic), with the spec's errors for a netns that cannot be used.
import { closeSync, fstatSync, openSync, statfsSync, statSync } from 'node:fs';
import { errnoCode, errorMessage } from '../../src/util/errors.js';
import { netnsError } from './rollback.js';

/** statfs f_type of nsfs (and of procfs, for /proc/<pid>/ns/net on old kernels). */
const NSFS_MAGIC = 0x6e736673;
const PROC_SUPER_MAGIC = 0x9fa0;

/** CNI_NETNS does not exist (a DEL may ignore this; ADD and CHECK fail). */
export class NetnsNotFoundError extends Error {
  constructor(readonly path: string) {
    super(`failed to Statfs "${path}": no such file or directory`);
    this.name = 'NetnsNotFoundError';
  }
}

/** CNI_NETNS exists but is not a network namespace file (e.g. a stale bind-mount target). */
export class NetnsInvalidError extends Error {
  constructor(
    readonly path: string,
    readonly why: string,
  ) {
    super(why);
    this.name = 'NetnsInvalidError';
  }
}

/** An open handle on the pod's netns; children see it as /proc/self/fd/3. */
export class NetnsHandle {
  private closed = false;
  private constructor(
    readonly path: string,
    readonly fd: number,
  ) {}

  /** Validates and opens a netns path as the reference ns.GetNS does (Statfs magic check). */
  static open(path: string): NetnsHandle {
    let type: number;
    try {
      type = statfsSync(path).type;
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') throw new NetnsNotFoundError(path);
      throw new NetnsInvalidError(path, `failed to Statfs "${path}": ${errorMessage(e)}`);
    }
    if (type !== NSFS_MAGIC && type !== PROC_SUPER_MAGIC) {
      throw new NetnsInvalidError(path, `unknown FS magic on "${path}": ${type.toString(16)}`);
    }
    let fd: number;
    try {
      fd = openSync(path, 'r');
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') throw new NetnsNotFoundError(path);
      throw new NetnsInvalidError(path, `failed to open "${path}": ${errorMessage(e)}`);
    }
    return new NetnsHandle(path, fd);
  }

  /** For ADD and CHECK: the netns, or the spec's error for a CNI_NETNS that cannot be used. */
  static openForPod(path: string): NetnsHandle {
    try {
      return NetnsHandle.open(path);
    } catch (e) {
      throw netnsError(path, e);
    }
  }

  /**
   * For DEL: the netns, or null when `path` is empty, gone or not a netns (nothing of ours can be
   * in it then; the host side still has to be cleaned).
   */
  static openIfPresent(path: string): NetnsHandle | null {
    if (path === '') return null;
    try {
      return NetnsHandle.open(path);
    } catch (e) {
      if (e instanceof NetnsNotFoundError || e instanceof NetnsInvalidError) return null;
      throw e;
    }
  }

  /** The path a child process with this handle as fd 3 uses. */
  static readonly CHILD_PATH = '/proc/self/fd/3';

  /** True while `path` still names the netns we hold open (it was not deleted or replaced). */
  stillMounted(): boolean {
    try {
      const a = statSync(this.path);
      const b = fstatSync(this.fd);
      return a.dev === b.dev && a.ino === b.ino;
    } catch {
      return false;
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      closeSync(this.fd);
    } catch {
      // already closed
    }
  }
}
