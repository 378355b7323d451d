// Watches one config file for content changes, the way a Kubernetes ConfigMap volume changes it:
// `<dir>/<key>` is a symlink to `..data/<key>`, and an update swaps the `..data` symlink to a new
// timestamped directory (one rename, nothing written to the file itself). Watching the file's
// inode would miss that, so the directories are watched instead — the one holding the path and
// the one holding the file it resolves to (an in-place edit through the symlink happens there) —
// and every notice leads to a debounced re-read whose content is compared with the last one seen.
// A periodic re-read catches anything a notice missed (a watch that could not be set up, a
// directory replaced under us).
import { watch, type FSWatcher } from 'node:fs';
import { readFile, realpath, stat } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';

export type FileState = { readonly kind: 'content'; readonly text: string } | { readonly kind: 'missing' } | { readonly kind: 'error'; readonly error: Error };

export interface ConfigWatchOptions {
  readonly signal: AbortSignal;
  /** The content already applied (null: the file was missing); only differences are reported. */
  readonly initial: string | null;
  /** Called, one call at a time, when the content differs from the last one seen or the read fails in a new way. */
  readonly onChange: (state: FileState) => void | Promise<void>;
  /** Re-read at least this often (asked before each wait, so a reload may change it). */
  readonly pollIntervalMs: () => number;
  /** Quiet time after the last notice before re-reading: a swap is several events. Default 100 ms. */
  readonly debounceMs?: number;
  /** A directory could not be watched (polling still works); default: ignored. */
  readonly onWatchError?: (dir: string, error: Error) => void;
}

/** Without a working watch, the file is re-read this often (so a change is still seen within a second). */
const UNWATCHED_POLL_MS = 1000;

async function readState(path: string): Promise<FileState> {
  try {
    return { kind: 'content', text: await readFile(path, 'utf8') };
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // A dangling symlink (the ..data target removed mid-swap) reads as missing too.
    if (err.code === 'ENOENT') return { kind: 'missing' };
    return { kind: 'error', error: err };
  }
}

const stateKey = (s: FileState): string => (s.kind === 'content' ? `c:${s.text}` : s.kind === 'missing' ? 'm' : `e:${s.error.message}`);

/** Runs until `signal` aborts; never rejects (errors go to onChange / onWatchError). */
export async function watchConfigFile(path: string, opts: ConfigWatchOptions): Promise<void> {
  const { signal } = opts;
  if (signal.aborted) return;
  const file = resolve(path);
  const debounceMs = opts.debounceMs ?? 100;
  let last = opts.initial === null ? 'm' : `c:${opts.initial}`;
  // dir → its watcher and the inode it watches (a directory replaced under us needs a new watch).
  const watchers = new Map<string, { w: FSWatcher; ino: number }>();
  let failed = false;
  let timer: NodeJS.Timeout | null = null;
  let checks: Promise<void> = Promise.resolve();

  const schedule = (): void => {
    if (signal.aborted) return;
    if (timer) clearTimeout(timer);
    timer = setTimeout(() => {
      timer = null;
      void check();
    }, debounceMs);
  };

  const unwatch = (dir: string): void => {
    watchers.get(dir)?.w.close();
    watchers.delete(dir);
  };

  /** Watches the directories the file currently lives in; true when all of them are watched. */
  const syncWatches = async (): Promise<boolean> => {
    const dirs = new Set([dirname(file)]);
    const real = await realpath(file).catch(() => null);
    if (real) dirs.add(dirname(real));
    for (const dir of [...watchers.keys()]) if (!dirs.has(dir)) unwatch(dir);
    let ok = true;
    for (const dir of dirs) {
      if (signal.aborted) return ok;
      const ino = await stat(dir).then((s) => s.ino, () => null);
      if (signal.aborted) return ok;
      const cur = watchers.get(dir);
      if (cur && cur.ino === ino) continue;
      if (cur) unwatch(dir);
      if (ino === null) {
        ok = false;
        continue;
      }
      try {
        const w = watch(dir, { persistent: false }, schedule);
        w.on('error', (e) => {
          unwatch(dir);
          opts.onWatchError?.(dir, e);
          schedule();
        });
        watchers.set(dir, { w, ino });
      } catch (e) {
        ok = false;
        opts.onWatchError?.(dir, e as Error);
      }
    }
    return ok;
  };

  const check = (): Promise<void> => {
    checks = checks.then(async () => {
      if (signal.aborted) return;
      // First the watches (the symlink may point somewhere new), then the read: a change after the read is noticed.
      failed = !(await syncWatches());
      const state = await readState(file);
      const key = stateKey(state);
      if (key === last || signal.aborted) return;
      last = key;
      try {
        await opts.onChange(state);
      } catch {
        // onChange owns its errors; a throw must not stop the watch.
      }
    });
    return checks;
  };

  await new Promise<void>((resolveDone) => {
    let poll: NodeJS.Timeout | null = null;
    signal.addEventListener(
      'abort',
      () => {
        if (poll) clearTimeout(poll);
        if (timer) clearTimeout(timer);
        for (const dir of [...watchers.keys()]) unwatch(dir);
        void checks.then(() => resolveDone());
      },
      { once: true },
    );
    const next = (): void => {
      if (signal.aborted) return;
      poll = setTimeout(() => void check().then(next), failed ? Math.min(UNWATCHED_POLL_MS, opts.pollIntervalMs()) : opts.pollIntervalMs());
    };
    void check().then(next);
  });
}
