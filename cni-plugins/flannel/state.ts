// The scratch state flannel keeps per container: `<dataDir>/<containerID>` holds the exact
// delegate config bytes of the ADD, replayed on DEL (and, here, CHECK). Same layout and modes as
// flannel (dir 0700, file 0600), so state written by flannel's plugin is read by weft's and back.
//
// File access is synchronous: the files are tiny, a plugin process serves one request, and
// node:fs/promises (plus node:crypto for the temp name) would add ~5 ms to every start.
import { closeSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytesSync } from '../skel/random.js';
import { errnoCode } from '../../src/util/errors.js';

/** CNI_CONTAINERID's grammar (skel): no "/", cannot start with "." — safe as a file name. */
const CONTAINER_ID = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
/** Our temp files: `.<containerID>.tmp-<pid>-<hex>`, invisible to the container-ID grammar. */
const TEMP_FILE = /^\.[a-zA-Z0-9][a-zA-Z0-9_.-]*\.tmp-\d+-[0-9a-f]+$/;

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

export interface StateListing {
  /** Container IDs that have a state file. */
  readonly containerIds: readonly string[];
  /** Leftover temp files of interrupted writes (names, relative to dataDir). */
  readonly tempFiles: readonly string[];
}

/** What is in dataDir; a missing dataDir is an empty listing. Anything else there is left alone. */
export function listState(dataDir: string): StateListing {
  let entries;
  try {
    entries = readdirSync(dataDir, { withFileTypes: true });
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') return { containerIds: [], tempFiles: [] };
    throw new StateFileError(dataDir, 'list', e);
  }
  const containerIds: string[] = [];
  const tempFiles: string[] = [];
  for (const ent of entries) {
    if (!ent.isFile()) continue;
    if (CONTAINER_ID.test(ent.name)) containerIds.push(ent.name);
    else if (TEMP_FILE.test(ent.name)) tempFiles.push(ent.name);
  }
  containerIds.sort();
  tempFiles.sort();
  return { containerIds, tempFiles };
}

/** Removes one leftover temp file (GC runs with no ADD in flight, so none is in use). */
export function removeTempFile(dataDir: string, name: string): void {
  if (!TEMP_FILE.test(name)) throw new RangeError(`not a flannel state temp file: ${JSON.stringify(name)}`);
  rmSync(join(dataDir, name), { force: true });
}
