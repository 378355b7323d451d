// The decisions behind a watch that notices a silently dead etcd member: when to probe the stream
// with a progress request, when silence means the member is gone, and which endpoint to try next.
// Pure and clock-injected (every method takes `now`), so the unit tests need no timers.

export interface LivenessTimings {
  /** Probe (send a progress request) after this long without hearing anything on the stream. */
  readonly probeAfterMs: number;
  /** The member is declared dead when a probe stays unanswered this long. */
  readonly deadlineMs: number;
  /** How often the decision is taken (the detection error is at most this much). */
  readonly tickMs: number;
}

/**
 * The lease watch: a partitioned member must be left fast enough that a change acknowledged right
 * after the cut is still programmed within about 5 s. etcd answers a progress request from the
 * member's memory (no raft round), so 2 s without an answer is not load. From the last message
 * heard to "dead": at most probeAfterMs + deadlineMs + 2 × tickMs = 3.5 s. Cost: one small
 * request per second of silence per node.
 */
export const DEFAULT_LIVENESS: LivenessTimings = { probeAfterMs: 1000, deadlineMs: 2000, tickMs: 250 };

/**
 * The watch on a node's own lease key only hurries a re-acquisition that renewal would reach
 * anyway: at most 12 s, one request per 5 s of silence.
 */
export const KEY_WATCH_LIVENESS: LivenessTimings = { probeAfterMs: 5000, deadlineMs: 5000, tickMs: 1000 };

export type LivenessVerdict =
  | { readonly kind: 'wait' }
  | { readonly kind: 'probe' }
  | { readonly kind: 'dead'; readonly silentMs: number };

/** One stream's liveness: fed every message received, asked at every tick what to do. */
export class WatchLiveness {
  private lastHeard: number;
  private probeSentAt: number | null = null;

  constructor(
    private readonly timings: LivenessTimings,
    now: number,
  ) {
    if (!(timings.probeAfterMs > 0 && timings.deadlineMs > 0 && timings.tickMs > 0)) {
      throw new RangeError(`watch liveness timings must be positive (got ${JSON.stringify(timings)})`);
    }
    this.lastHeard = now;
  }

  /** Anything arrived on the stream (events, a progress answer, a creation): the member is there. */
  heard(now: number): void {
    this.lastHeard = Math.max(this.lastHeard, now);
    this.probeSentAt = null;
  }

  /**
   * What to do now. 'probe' means: send one progress request (it is recorded as sent); 'dead' means
   * the outstanding probe went unanswered for the deadline. At most one probe is outstanding.
   */
  check(now: number): LivenessVerdict {
    if (this.probeSentAt !== null) {
      if (now - this.probeSentAt >= this.timings.deadlineMs) return { kind: 'dead', silentMs: now - this.lastHeard };
      return { kind: 'wait' };
    }
    if (now - this.lastHeard >= this.timings.probeAfterMs) {
      this.probeSentAt = now;
      return { kind: 'probe' };
    }
    return { kind: 'wait' };
  }
}

/** How long an endpoint that failed is tried only when every other one failed too. */
export const SUSPECT_MS = 30_000;

/**
 * Which endpoint a watch connects to next: the endpoints in turn, starting after the one used last,
 * skipping those that failed within SUSPECT_MS; when all did, the one that failed longest ago.
 * (etcd3's own pool picks a random host per call and forgets failures with a new client, so it
 * can return to a dead member again and again.)
 */
export class EndpointRotation {
  private readonly suspectUntil = new Map<string, number>();
  private next: number;

  constructor(
    private readonly endpoints: readonly string[],
    start = 0,
    private readonly suspectMs = SUSPECT_MS,
  ) {
    if (endpoints.length === 0) throw new RangeError('no etcd endpoints');
    this.next = ((start % endpoints.length) + endpoints.length) % endpoints.length;
  }

  /** The endpoint to connect to now. */
  pick(now: number): string {
    const n = this.endpoints.length;
    let fallback: { endpoint: string; until: number; index: number } | null = null;
    for (let i = 0; i < n; i++) {
      const index = (this.next + i) % n;
      const endpoint = this.endpoints[index]!;
      const until = this.suspectUntil.get(endpoint) ?? 0;
      if (until <= now) return this.take(index);
      if (!fallback || until < fallback.until) fallback = { endpoint, until, index };
    }
    return this.take(fallback!.index);
  }

  /** The endpoint failed (did not answer, refused the watch, dropped the stream). */
  suspect(endpoint: string, now: number): void {
    this.suspectUntil.set(endpoint, now + this.suspectMs);
  }

  /** The endpoint served a watch: it is good again. */
  trust(endpoint: string): void {
    this.suspectUntil.delete(endpoint);
  }

  isSuspect(endpoint: string, now: number): boolean {
    return (this.suspectUntil.get(endpoint) ?? 0) > now;
  }

  private take(index: number): string {
    this.next = (index + 1) % this.endpoints.length;
    return this.endpoints[index]!;
  }
}
