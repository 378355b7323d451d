// What a plugin's GC may do in a directory it does not own alone (a dataDir set to a shared
// directory, flannel's next to host-local's): look only at the names readdir gives (so it never
// leaves the directory), open only regular files, never through a symlink and never blocking on a
// fifo (O_NOFOLLOW | O_NONBLOCK, then fstat), read only small ones, and remove a name only while
// it still is the very file that was read (same device, inode, size and change time). Deciding
// what is the plugin's own (name pattern and content) is the caller's job; everything else is
// left as it is.
//
// Synchronous, as the plugins' other state-file access: the files are tiny and few.
import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, readSync, unlinkSync, type BigIntStats } from 'node:fs';
import { join } from 'node:path';
import { errnoCode, errorMessage } from '../../src/util/errors.js';
import { pluginStderr } from '../skel/stderr.js';

/** A regular file read from a directory, with the identity a removal checks. */
export interface DirFile {
  readonly name: string;
  readonly text: string;
  /** Device, inode, size and change time (ns) when read: an inode number alone is soon reused. */
  readonly identity: string;
}

function identityOf(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.ctimeNs}`;
}

export class OwnedFileError extends Error {
  constructor(
    readonly path: string,
    readonly operation: 'list' | 'remove',
    cause: unknown,
  ) {
    super(`cannot ${operation} ${path}: ${errorMessage(cause)}`, { cause });
    this.name = 'OwnedFileError';
  }
}

/** Names of the regular files directly in `dir` (no symlinks, directories, fifos, sockets, devices), sorted; none when `dir` is missing. */
export function regularFileNames(dir: string): string[] {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') return [];
    throw new OwnedFileError(dir, 'list', e);
  }
  return entries
    .filter((e) => e.isFile())
    .map((e) => e.name)
    .sort();
}

const OPEN_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY;

/**
 * The content of `dir/name` when it is (still) a regular file of at most `maxBytes` bytes; null
 * when it is anything else, is larger, is gone or cannot be read. Never follows a symlink and
 * never waits on a fifo, even if one was put there after readdir.
 */
export function readSmallRegularFile(dir: string, name: string, maxBytes: number): DirFile | null {
  let fd: number;
  try {
    fd = openSync(join(dir, name), OPEN_FLAGS);
  } catch {
    return null;
  }
  try {
    const st = fstatSync(fd, { bigint: true });
    if (!st.isFile() || st.size > BigInt(maxBytes)) return null;
    // One byte more than allowed tells a file that grew since fstat.
    const buf = Buffer.alloc(maxBytes + 1);
    let len = 0;
    for (;;) {
      const n = readSync(fd, buf, len, buf.length - len, null);
      if (n === 0) break;
      len += n;
      if (len > maxBytes) return null;
    }
    return { name, text: buf.toString('utf8', 0, len), identity: identityOf(st) };
  } catch {
    return null;
  } finally {
    closeSync(fd);
  }
}

/**
 * Unlinks `dir/<f.name>` if that name still is the regular file `f` was read from (same device,
 * inode, size and change time): 'removed', or 'gone' (already removed), or 'replaced' (something
 * else is there now: left alone). The check and the unlink are two system calls; what could slip
 * in between is only a rename by someone who can write the directory (root, for these).
 */
export function removeIfSameFile(dir: string, f: DirFile): 'removed' | 'gone' | 'replaced' {
  const path = join(dir, f.name);
  try {
    const st = lstatSync(path, { bigint: true });
    if (!st.isFile() || identityOf(st) !== f.identity) return 'replaced';
    unlinkSync(path);
    return 'removed';
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return 'gone';
    throw new OwnedFileError(path, 'remove', e);
  }
}

/**
 * One line about the files a GC left alone because they look like its own by name but are not
 * by content (at most `shown` names, JSON-quoted so a name cannot break the line); '' for none.
 */
export function leftAloneLine(plugin: string, dir: string, what: string, names: readonly string[], shown = 10): string {
  if (names.length === 0) return '';
  const list = names.slice(0, shown).map((n) => JSON.stringify(n));
  if (names.length > shown) list.push(`and ${names.length - shown} more`);
  return `${plugin} GC: left alone ${names.length} file(s) in ${dir} named like ${what} but not holding it: ${list.join(', ')}`;
}

/**
 * Where a plugin's one GC warning goes by default: a line on stderr (the runtime's plugin log).
 * Through skel/stderr.ts so that, in weftd's CNI server, it reaches the request's caller.
 */
export function warnOnStderr(line: string): void {
  pluginStderr(`${line}\n`);
}
