// The scratch state flannel keeps per container: `<dataDir>/<containerID>` holds the exact
// delegate config bytes of the ADD, replayed on DEL (and, here, CHECK). Same layout and modes as
// flannel (dir 0700, file 0600), so state written by flannel's plugin is read by weft's and back.
//
// GC (collectGarbage) removes only what is flannel state by name and by content, so a dataDir
// that is shared (host-local's store, a mistyped path) keeps everything else.
//
// File access is synchronous: the files are tiny, a plugin process serves one request, and
// node:fs/promises (plus node:crypto for the temp name) would add ~5 ms to every start.
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { OwnedFileError, readSmallRegularFile, regularFileNames, removeIfSameFile } from '../lib/owned-files.js';
import { randomBytesSync } from '../skel/random.js';
import { errnoCode } from '../../src/util/errors.js';

/** CNI_CONTAINERID's grammar (skel): no "/", cannot start with "." — safe as a file name. */
const CONTAINER_ID = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
/** Our temp files: `.<containerID>.tmp-<pid>-<hex>`, invisible to the container-ID grammar. */
const TEMP_FILE = /^\.([a-zA-Z0-9][a-zA-Z0-9_.-]*)\.tmp-\d+-[0-9a-f]+$/;

export class StateFileError extends Error {
  constructor(
    readonly path: string,
    readonly operation: 'read' | 'write' | 'remove' | 'list',
    cause: unknown,
  ) {
    super(`cannot ${operation} flannel state ${path}: ${cause instanceof Error ? cause.message : String(cause)}`, {
      cause,
    });
    this.name = 'StateFileError';
  }
}

export function statePath(dataDir: string, containerId: string): string {
  if (!CONTAINER_ID.test(containerId)) throw new RangeError(`invalid container ID ${JSON.stringify(containerId)}`);
  return join(dataDir, containerId);
}

/**
 * Writes the state atomically (temp file, fsync, rename, directory fsync): a crash leaves either
 * no file or a complete one, never the empty file that blocked deletions in flannel#1662.
 */
export function writeState(dataDir: string, containerId: string, data: string): void {
  const path = statePath(dataDir, containerId);
  const tmp = join(dataDir, `.${containerId}.tmp-${process.pid}-${randomBytesSync(4).toString('hex')}`);
  let tmpCreated = false;
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    const fd = openSync(tmp, 'wx', 0o600);
    tmpCreated = true;
    try {
      writeFileSync(fd, data, 'utf8');
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
    tmpCreated = false;
  } catch (e) {
    if (tmpCreated) {
      try {
        rmSync(tmp, { force: true });
      } catch {
        // the write error is the one to report
      }
    }
    throw new StateFileError(path, 'write', e);
  }
  try {
    const dir = openSync(dataDir, 'r');
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
  } catch {
    // fsync on a directory is refused by some filesystems; the file itself is synced.
  }
}

/** The stored bytes, or null when there is no state for this container. */
export function readState(dataDir: string, containerId: string): string | null {
  const path = statePath(dataDir, containerId);
  try {
    return readFileSync(path, 'utf8');
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw new StateFileError(path, 'read', e);
  }
}

/** Removes the state; already gone is fine. */
export function removeState(dataDir: string, containerId: string): void {
  const path = statePath(dataDir, containerId);
  try {
    unlinkSync(path);
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') return;
    throw new StateFileError(path, 'remove', e);
  }
}

/** The most a flannel state file can hold here (a delegate config is a few KiB). */
const MAX_STATE_BYTES = 1024 * 1024;

/**
 * Whether `text` is what flannel's ADD stores: the delegate netconf, a JSON object with a string
 * `name` (flannel sets it), a non-empty string `type` and an `ipam` object (flannel sets both).
 */
export function isDelegateConfText(text: string): boolean {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return false;
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const o = v as Record<string, unknown>;
  const ipam = o.ipam;
  return typeof o.name === 'string' && typeof o.type === 'string' && o.type !== '' && typeof ipam === 'object' && ipam !== null && !Array.isArray(ipam);
}

export interface GarbageReport {
  /** Names removed: state of attachments not in the valid set, and their leftover temp files. */
  readonly removed: readonly string[];
  /** Names that look like flannel state but do not hold it (left alone). */
  readonly leftAlone: readonly string[];
}

/**
 * GC of dataDir: removes the state file of every container not in `valid`, and the temp files
 * of interrupted writes for such containers, but only regular files directly in dataDir whose
 * name is ours (a container ID, or `.<containerID>.tmp-<pid>-<hex>`) and whose content is ours
 * (isDelegateConfText; a temp file may also be empty). Symlinks, directories, fifos and files of
 * any other name or content are not touched; the ones named like ours are reported.
 */
export function collectGarbage(dataDir: string, valid: ReadonlySet<string>): GarbageReport {
  const removed: string[] = [];
  const leftAlone: string[] = [];
  try {
    for (const name of regularFileNames(dataDir)) {
      const temp = TEMP_FILE.exec(name);
      const owner = temp ? temp[1]! : CONTAINER_ID.test(name) ? name : null;
      if (owner === null || valid.has(owner)) continue;
      const f = readSmallRegularFile(dataDir, name, MAX_STATE_BYTES);
      if (f === null || !(isDelegateConfText(f.text) || (temp !== null && f.text === ''))) {
        leftAlone.push(name);
      } else if (removeIfSameFile(dataDir, f) === 'replaced') {
        leftAlone.push(name);
      } else {
        removed.push(name);
      }
    }
  } catch (e) {
    if (e instanceof OwnedFileError) throw new StateFileError(e.path, e.operation, e.cause);
    throw e;
  }
  return { removed, leftAlone };
}
