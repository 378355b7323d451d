// The iptables driver: one `iptables-restore -w --noflush` transaction per family to change the
// nat table (the reference runs 27 iptables processes for an ADD). Usually that transaction is
// written without reading the table first (a "blind" plan whose -N/-C/-D lines only apply when
// the table is in the expected state, so it fails as a whole otherwise); when it fails, or when
// there is none, the table is read with one `iptables-save -t nat` and the plan is computed from
// what was read. Such a plan, written against a table another process changed in between, fails
// as a whole too and is recomputed from a fresh read.
//
// That read-plan-write path holds a lock (natLockPath) across processes: iptables' nf_tables
// backend (1.8.x) does not fail a transaction whose `-N` chain another one created meanwhile — on
// the generation change it refreshes its cache and commits anyway — so two ADDs on a fresh host
// could both append the shared jumps (measured here: 7 of 150 concurrent pairs of
// `-N X` + `-A PREROUTING -j X` left two jumps). The blind path, every pod after the first on a
// node, creates no shared rules and takes no lock.
import type { Family } from '../../src/util/ip.js';
import type { IptablesPayload } from '../../src/render/iptables.js';
import { withFileLock } from '../skel/lock.js';
import { parseSave, type SavedNat } from './rules.js';
import { runTool } from './sys.js';

const MAX_ATTEMPTS = 3;
/** One per family, machine-wide (critical sections are one read and one restore: milliseconds). */
const natLockPath = (family: Family): string => `/run/weft-portmap-nat-v${family}.lock`;
const NAT_LOCK_TIMEOUT_S = 30;

export const xtTools = (family: Family): { save: string; restore: string } =>
  family === 4 ? { save: 'iptables-save', restore: 'iptables-restore' } : { save: 'ip6tables-save', restore: 'ip6tables-restore' };

/** The family's iptables cannot be used at all (tool missing, no kernel support). */
export class IptablesUnusableError extends Error {
  constructor(
    readonly family: Family,
    override readonly cause: Error,
  ) {
    super(`${family === 4 ? 'iptables' : 'ip6tables'} is not usable: ${cause.message}`);
    this.name = 'IptablesUnusableError';
  }
}

/** A restore transaction failed even against a fresh read of the table. */
export class IptablesRestoreError extends Error {
  constructor(
    readonly family: Family,
    readonly payload: string,
    override readonly cause: Error,
  ) {
    super(`${xtTools(family).restore} failed: ${cause.message}`);
    this.name = 'IptablesRestoreError';
  }
}

export async function readNat(family: Family): Promise<SavedNat> {
  try {
    return parseSave(await runTool(xtTools(family).save, ['-t', 'nat']));
  } catch (e) {
    throw new IptablesUnusableError(family, e as Error);
  }
}

export async function restoreNat(family: Family, payload: IptablesPayload): Promise<void> {
  await runTool(xtTools(family).restore, ['-w', '--noflush'], payload);
}

export interface ApplyOptions {
  /** The table as already read. */
  readonly saved?: SavedNat;
  /**
   * A payload to try before reading the table: one that either does exactly what `plan` would
   * do or fails as a whole. Its failure only means "read the table and plan".
   */
  readonly blind?: IptablesPayload;
}

/**
 * Writes `opts.blind` if given and that succeeds; otherwise reads the family's nat table, writes
 * `plan(saved)` (nothing when it is null) and, if the transaction fails, re-reads and tries again
 * while the plan keeps changing.
 */
export async function applyNat(family: Family, plan: (saved: SavedNat) => IptablesPayload | null, opts: ApplyOptions = {}): Promise<void> {
  if (opts.blind !== undefined && opts.saved === undefined) {
    try {
      await restoreNat(family, opts.blind);
      return;
    } catch {
      // not in the expected state (or iptables is not usable): read it, and report from there
    }
  }
  // A table the caller read itself is planned from as given (no lock: that read was not under it).
  if (opts.saved !== undefined) return planAndWrite(family, plan, opts.saved);
  return withFileLock(natLockPath(family), async () => planAndWrite(family, plan, await readNat(family)), { timeoutSeconds: NAT_LOCK_TIMEOUT_S, mode: 0o600 });
}

async function planAndWrite(family: Family, plan: (saved: SavedNat) => IptablesPayload | null, saved: SavedNat): Promise<void> {
  let current = saved;
  let payload = plan(current);
  for (let attempt = 1; payload !== null; attempt++) {
    try {
      await restoreNat(family, payload);
      return;
    } catch (e) {
      if (attempt >= MAX_ATTEMPTS) throw new IptablesRestoreError(family, payload, e as Error);
      current = await readNat(family);
      const next = plan(current);
      // Same table, same plan: the failure is the plan's own, not a race.
      if (next === payload) throw new IptablesRestoreError(family, payload, e as Error);
      payload = next;
    }
  }
}
