// Arrival times of keyed events (a kernel notification, an etcd watch event), stamped with
// CLOCK_MONOTONIC as they are received, and waits for a set of keys to have arrived.
import { mono } from './common.js';

export interface ExpectResult {
  /** When the last expected key arrived; null when the wait timed out. */
  readonly doneAt: number | null;
  readonly missingCount: number;
  /** The first few keys that did not arrive. */
  readonly missing: string[];
}

interface Waiter {
  readonly outstanding: Set<string>;
  resolve(r: ExpectResult): void;
  timer: NodeJS.Timeout;
}

export class EventLog {
  private times = new Map<string, number[]>();
  private waiters = new Set<Waiter>();
  events = 0;

  record(key: string, t: number): void {
    this.events++;
    const list = this.times.get(key);
    if (list) list.push(t);
    else this.times.set(key, [t]);
    for (const w of this.waiters) {
      if (w.outstanding.delete(key) && w.outstanding.size === 0) this.finish(w, t);
    }
  }

  private finish(w: Waiter, doneAt: number | null): void {
    this.waiters.delete(w);
    clearTimeout(w.timer);
    const missing = [...w.outstanding];
    w.resolve({ doneAt, missingCount: missing.length, missing: missing.slice(0, 10) });
  }

  /**
   * Resolves when every key has arrived since the last reset (at once when they all have: then
   * with the latest of their first arrivals), or after timeoutMs with what is missing.
   */
  expect(keys: readonly string[], timeoutMs: number): Promise<ExpectResult> {
    const outstanding = new Set<string>();
    let latest = -Infinity;
    for (const k of keys) {
      const t = this.times.get(k);
      if (t) latest = Math.max(latest, t[0]!);
      else outstanding.add(k);
    }
    if (outstanding.size === 0) return Promise.resolve({ doneAt: keys.length ? latest : mono(), missingCount: 0, missing: [] });
    return new Promise((resolve) => {
      const w: Waiter = { outstanding, resolve, timer: setTimeout(() => this.finish(w, null), timeoutMs) };
      this.waiters.add(w);
    });
  }

  /** Every key's arrival times, oldest first. */
  snapshot(): Array<[string, number[]]> {
    return [...this.times];
  }

  reset(): void {
    this.times = new Map();
    this.events = 0;
    for (const w of [...this.waiters]) this.finish(w, null);
  }
}
