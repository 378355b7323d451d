// Synchronous work behind a Promise-returning interface (a CNI verb, a lock's critical section).

/**
 * Runs `fn` now and returns its outcome as a promise: its value resolves it, its throw rejects it,
 * exactly as an `async` function with the same synchronous body would.
 */
export function fromSync<T>(fn: () => T): Promise<T> {
  return new Promise<T>((resolve) => resolve(fn()));
}
