// Hands lease events to the backend in batches. Events that arrive while the backend is busy
// are merged into the next batch, keeping only the latest event per lease: a burst becomes one
// batch, and a slow backend never loses an event (it sees the final state of every lease).
import { leaseId, type LeaseEvent } from '../subnet/lease.js';

export class EventBatcher {
  private pending = new Map<string, LeaseEvent>();
  private waiter: (() => void) | null = null;

  push(events: readonly LeaseEvent[]): void {
    for (const ev of events) {
      const id = leaseId(ev.lease);
      this.pending.delete(id); // re-insert so the batch keeps arrival order
      this.pending.set(id, ev);
    }
    if (this.pending.size > 0) {
      const w = this.waiter;
      this.waiter = null;
      w?.();
    }
  }

  get size(): number {
    return this.pending.size;
  }

  /** Waits for at least one event and takes everything pending; null when `signal` aborts first. */
  async next(signal: AbortSignal): Promise<LeaseEvent[] | null> {
    while (this.pending.size === 0) {
      if (signal.aborted) return null;
      await new Promise<void>((resolve) => {
        const onAbort = () => {
          this.waiter = null;
          resolve();
        };
        this.waiter = () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        };
        signal.addEventListener('abort', onAbort, { once: true });
      });
    }
    const batch = [...this.pending.values()];
    this.pending = new Map();
    return batch;
  }
}
