// The reference's on-disk store (backend/disk), byte for byte, so weft and the Go plugin can share
// a node: <dataDir>/<network>/<ip> holds "containerID\r\nifname" (no trailing newline; older
// releases wrote only the container ID), last_reserved_ip.<range set index> holds the last IP
// handed out from that set, and `lock` is the flock(2) target. Every method expects the caller
// to hold the lock (withLock), except init. Only regular files directly in the directory are
// read (never through a symlink), and GC frees only reservation files (isReservationFile).
//
// File access is synchronous on purpose: a plugin process serves one request, the files are tiny,
// and a thread-pool round trip per file costs more than the read itself.
import { closeSync, mkdirSync, openSync, readFileSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { IPAddr } from '../../src/util/ip.js';
import { OwnedFileError, readSmallRegularFile, regularFileNames, removeIfSameFile, type DirFile } from '../lib/owned-files.js';
import { CNI_NAME_RE, validateInterfaceName } from '../skel/env.js';
import { withFileLock } from '../skel/lock.js';
import { fromSync } from '../lib/promise.js';
import { errnoCode, errorMessage } from '../../src/util/errors.js';

export const LINE_BREAK = '\r\n';
export const LAST_IP_PREFIX = 'last_reserved_ip.';
export const LOCK_FILE = 'lock';
/** Upstream HEAD (since v1.4) writes reservations 0600; Debian's 1.1.1 wrote 0644. */
const FILE_MODE = 0o600;
/** More than any reservation holds (a container ID, CRLF, an interface name); larger files are not read. */
const MAX_RESERVATION_BYTES = 4096;

export class StoreError extends Error {
  constructor(
    readonly path: string,
    readonly reason: string,
  ) {
    super(`host-local store ${path}: ${reason}`);
    this.name = 'StoreError';
  }
}

export interface Reservation {
  readonly ip: IPAddr;
  /** File name inside the store directory (the IP as written by whoever reserved it). */
  readonly file: string;
  /** The file content with surrounding whitespace trimmed, as the reference compares it. */
  readonly content: string;
  readonly containerId: string;
  /** null for a legacy file that holds only the container ID. */
  readonly ifname: string | null;
  /** The file as read: a removal checks that the name still is this file. */
  readonly source: DirFile;
}

export interface Attachment {
  readonly containerId: string;
  readonly ifname: string;
}

/** The exact bytes the reference writes for an attachment. */
export function ownerContent(containerId: string, ifname: string): string {
  return containerId.trim() + LINE_BREAK + ifname;
}

export function parseContent(content: string): { containerId: string; ifname: string | null } {
  const i = content.indexOf(LINE_BREAK);
  return i < 0 ? { containerId: content, ifname: null } : { containerId: content.slice(0, i), ifname: content.slice(i + LINE_BREAK.length) };
}

/** Reservations owned by the attachment: new-format ones, or, when there is none, legacy CID-only ones (as ReleaseByID). */
export function ownedBy(list: readonly Reservation[], containerId: string, ifname: string): Reservation[] {
  const exact = ownerContent(containerId, ifname);
  const mine = list.filter((r) => r.content === exact);
  if (mine.length > 0) return mine;
  const legacy = containerId.trim();
  return list.filter((r) => r.content === legacy);
}

/** Both matches at once (GetByID / FindByID): any reservation of the attachment. */
export function heldBy(list: readonly Reservation[], containerId: string, ifname: string): Reservation[] {
  const exact = ownerContent(containerId, ifname);
  const legacy = containerId.trim();
  return list.filter((r) => r.content === exact || r.content === legacy);
}

function isInterfaceName(name: string): boolean {
  try {
    validateInterfaceName(name);
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether a file named as an IP is a reservation as a host-local writes it: named by the IP in its
 * canonical form, holding a container ID and, unless it is a legacy file, CRLF and an interface
 * name (CNI_CONTAINERID's and CNI_IFNAME's grammar). Anything else in the directory (a file some
 * other program keeps there, a name that only parses as an IP) is not ours to free.
 */
export function isReservationFile(r: Reservation): boolean {
  return r.ip.toString() === r.file && CNI_NAME_RE.test(r.containerId) && (r.ifname === null || isInterfaceName(r.ifname));
}

/**
 * GC: the reservations no valid attachment owns. A legacy CID-only file is kept when any valid
 * attachment has that container ID. An empty valid list selects every reservation; files that
 * are not reservations (isReservationFile) are never selected.
 */
export function selectGarbage(list: readonly Reservation[], valid: readonly Attachment[]): Reservation[] {
  const exact = new Set(valid.map((a) => ownerContent(a.containerId, a.ifname)));
  const cids = new Set(valid.map((a) => a.containerId.trim()));
  return list.filter((r) => isReservationFile(r) && !(r.ifname === null ? cids.has(r.content) : exact.has(r.content)));
}

export class DiskStore {
  readonly dir: string;

  constructor(dataDir: string, network: string) {
    this.dir = join(dataDir, network);
  }

  get lockPath(): string {
    return join(this.dir, LOCK_FILE);
  }

  /** Creates the network directory (0755, as upstream). */
  init(): void {
    try {
      mkdirSync(this.dir, { recursive: true, mode: 0o755 });
    } catch (e) {
      throw new StoreError(this.dir, errorMessage(e));
    }
  }

  /** init, then fn under the store's flock (fn is synchronous, as every store method). */
  async withLock<T>(fn: () => T): Promise<T> {
    this.init();
    return withFileLock(this.lockPath, () => fromSync(fn), { mode: 0o750 });
  }

  /**
   * Every regular file named as an IP (what ADD must treat as taken), read without following a
   * symlink or opening anything but a regular file; other files are left alone. A file removed
   * under us, unreadable or implausibly large is skipped (the reference skips unreadable ones too).
   */
  list(): Reservation[] {
    let names: string[];
    try {
      names = regularFileNames(this.dir);
    } catch (e) {
      throw new StoreError(this.dir, e instanceof OwnedFileError ? errorMessage(e.cause) : errorMessage(e));
    }
    const out: Reservation[] = [];
    for (const name of names) {
      const ip = IPAddr.tryParse(name);
      if (!ip) continue;
      const f = readSmallRegularFile(this.dir, name, MAX_RESERVATION_BYTES);
      if (f === null) continue;
      const content = f.text.trim();
      out.push({ ip, file: name, content, ...parseContent(content), source: f });
    }
    return out;
  }

  /**
   * Creates the reservation file exclusively; false when the IP is taken. On success records
   * the IP in last_reserved_ip.<rangeIndex>.
   */
  reserve(ip: IPAddr, containerId: string, ifname: string, rangeIndex: number): boolean {
    const path = join(this.dir, ip.toString());
    let fd: number;
    try {
      fd = openSync(path, 'wx', FILE_MODE);
    } catch (e) {
      if (errnoCode(e) === 'EEXIST') return false;
      throw new StoreError(path, errorMessage(e));
    }
    try {
      try {
        writeSync(fd, ownerContent(containerId, ifname));
      } finally {
        closeSync(fd);
      }
    } catch (e) {
      try {
        unlinkSync(path);
      } catch {
        // nothing more to undo
      }
      throw new StoreError(path, errorMessage(e));
    }
    const lastPath = join(this.dir, LAST_IP_PREFIX + String(rangeIndex));
    try {
      writeFileSync(lastPath, ip.toString(), { mode: FILE_MODE });
    } catch (e) {
      throw new StoreError(lastPath, errorMessage(e));
    }
    return true;
  }

  /** The content of last_reserved_ip.<rangeIndex> when it is an IP (Go: net.ParseIP, untrimmed). */
  lastReservedIP(rangeIndex: number): IPAddr | null {
    try {
      return IPAddr.tryParse(readFileSync(join(this.dir, LAST_IP_PREFIX + String(rangeIndex)), 'utf8'));
    } catch {
      return null;
    }
  }

  /**
   * Removes a reservation listed by list(), only while its name still is the file that was read
   * (not something put in its place since); one that is already gone is fine.
   */
  releaseListed(r: Reservation): void {
    try {
      removeIfSameFile(this.dir, r.source);
    } catch (e) {
      throw new StoreError(join(this.dir, r.file), e instanceof OwnedFileError ? errorMessage(e.cause) : errorMessage(e));
    }
  }

  /** Removes a reservation file this process just created; one that is already gone is fine. */
  release(file: string): void {
    try {
      unlinkSync(join(this.dir, file));
    } catch (e) {
      if (errnoCode(e) !== 'ENOENT') throw new StoreError(join(this.dir, file), errorMessage(e));
    }
  }
}
