// Runs async jobs one at a time, in order: a backend's event batches, timer reconciles and
// device rebuilds must not interleave their dump-diff-apply passes.
export class SerialQueue {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(job: () => Promise<T>): Promise<T> {
    const next = this.tail.then(job, job);
    this.tail = next.catch(() => undefined);
    return next;
  }

  /** Resolves when every job queued so far has finished. */
  async idle(): Promise<void> {
    await this.tail;
  }
}
