// Abortable delays and capped exponential backoff for retry loops.

export class AbortedError extends Error {
  constructor() {
    super('aborted');
    this.name = 'AbortedError';
  }
}

/** `work`, or AbortedError as soon as `signal` aborts (the work itself goes on, unheeded). */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  const aborted = new Promise<never>((_resolve, reject) => {
    if (signal.aborted) reject(new AbortedError());
    signal.addEventListener('abort', () => reject(new AbortedError()), { once: true });
  });
  return Promise.race([work, aborted]);
}

/** Resolves after `ms`, or rejects with AbortedError as soon as `signal` aborts. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new AbortedError());
    const onAbort = () => {
      clearTimeout(timer);
      reject(new AbortedError());
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export class Backoff {
  private current: number;

  constructor(
    private readonly initialMs: number,
    private readonly maxMs: number,
  ) {
    this.current = initialMs;
  }

  /** The next delay: doubles each time up to the cap, with ±20% jitter so nodes do not retry in step. */
  next(): number {
    const d = this.current;
    this.current = Math.min(this.current * 2, this.maxMs);
    return Math.round(d * (0.8 + Math.random() * 0.4));
  }

  reset(): void {
    this.current = this.initialMs;
  }

  wait(signal?: AbortSignal): Promise<void> {
    return delay(this.next(), signal);
  }
}
