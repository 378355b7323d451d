// A FIFO counting semaphore: bounds the requests in flight on one netlink socket, because the
// library aborts the process when the socket's receive buffer overflows (ENOBUFS ends in SIGABRT from native code). FIFO
// keeps the send order equal to the call order, and the kernel handles one socket's requests in
// the order they were sent.
export class Limiter {
  private active = 0;
  // A queue with a moving head: Array.shift() is O(n), and apply() can queue tens of thousands.
  private waiters: Array<() => void> = [];
  private head = 0;

  constructor(readonly max: number) {
    if (!Number.isInteger(max) || max < 1) throw new RangeError(`limit must be a positive integer, got ${max}`);
  }

  get inFlight(): number {
    return this.active;
  }

  acquire(): Promise<void> {
    if (this.active < this.max && this.head === this.waiters.length) {
      this.active++;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  release(): void {
    if (this.head < this.waiters.length) {
      const next = this.waiters[this.head]!;
      this.head++;
      if (this.head === this.waiters.length) {
        this.waiters = [];
        this.head = 0;
      } else if (this.head >= 1024 && this.head * 2 >= this.waiters.length) {
        this.waiters = this.waiters.slice(this.head);
        this.head = 0;
      }
      // The slot passes straight to the next waiter, so the count stays the same.
      next();
    } else {
      this.active--;
    }
  }

  /** Runs fn holding one slot. */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    await this.acquire();
    try {
      return await fn();
    } finally {
      this.release();
    }
  }
}

/** Runs one task at a time, in call order (a socket can have one dump in progress). */
export class Mutex {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.tail.then(fn);
    this.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
}
