// An unbounded async queue: producers push without waiting, one consumer iterates.
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: (() => void) | null = null;
  private closed = false;
  private failure: Error | null = null;

  push(item: T): void {
    if (this.closed) return;
    this.items.push(item);
    this.wake();
  }

  /** Ends the iteration after the queued items; with an error, the consumer gets it. */
  close(error?: Error): void {
    this.closed = true;
    if (error) this.failure = error;
    this.wake();
  }

  get size(): number {
    return this.items.length;
  }

  /** Takes everything queued now (possibly nothing). */
  drain(): T[] {
    return this.items.splice(0);
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    while (true) {
      if (this.items.length > 0) {
        yield this.items.shift()!;
        continue;
      }
      if (this.closed) {
        if (this.failure) throw this.failure;
        return;
      }
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }
}
