// The CNI server's two waits: requests for one container run one after the other (KeyedLock), and
// at most N requests run plugin work at once (Slots). Both waits can be given up (an AbortSignal:
// the request timed out or the server is stopping) without blocking the ones queued behind.
import { AbortedError } from '../util/backoff.js';

/** Resolves with `p`, or rejects with AbortedError as soon as `signal` aborts. */
export function abortable<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(new AbortedError());
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(new AbortedError());
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}

/** A FIFO mutex per key; a key's entry is dropped when nobody holds or waits for it. */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<void>>();

  /** Waits for every earlier holder of `key`; resolves with the (idempotent) release. */
  async acquire(key: string, signal: AbortSignal): Promise<() => void> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((resolve) => (release = once(resolve)));
    const tail = prev.then(() => mine);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    try {
      await abortable(prev, signal);
    } catch (e) {
      // Given up while waiting: the ones behind still wait for `prev` only.
      release();
      throw e;
    }
    return release;
  }

  /** Keys held or waited for (for tests and status). */
  get size(): number {
    return this.tails.size;
  }
}

/** A counting semaphore, FIFO. */
export class Slots {
  private running = 0;
  private readonly waiting: Array<{ grant: () => void }> = [];

  constructor(readonly limit: number) {}

  async acquire(signal: AbortSignal): Promise<() => void> {
    if (this.running < this.limit && this.waiting.length === 0) {
      this.running++;
      return once(() => this.releaseOne());
    }
    const granted = new Promise<void>((resolve) => this.waiting.push({ grant: resolve }));
    const entry = this.waiting[this.waiting.length - 1]!;
    try {
      await abortable(granted, signal);
    } catch (e) {
      const i = this.waiting.indexOf(entry);
      if (i >= 0) this.waiting.splice(i, 1);
      else this.releaseOne(); // granted at the moment we gave up: pass it on
      throw e;
    }
    return once(() => this.releaseOne());
  }

  private releaseOne(): void {
    const next = this.waiting.shift();
    if (next) next.grant(); // the slot passes on: `running` stays
    else this.running--;
  }

  get inUse(): number {
    return this.running;
  }
}
