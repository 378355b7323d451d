// One etcd watch on a stream of its own, kept alive across members. etcd3's shared watch stream
// has no deadline and cannot carry progress requests (etcd 3.4 answers them with watch_id -1,
// which etcd3 1.1.2 throws on), so a member that goes silent holds it until TCP gives up. Here
// the stream is probed with progress requests when quiet (watch-liveness.ts); a member that does
// not answer, drops the stream or refuses it is left for the next endpoint, and the watch resumes
// after the last event delivered, so nothing is lost or delivered twice.
import type { IEvent, IWatchRequest, IWatchResponse } from 'etcd3';
import { errorMessage } from '../../util/errors.js';
import type { Logger } from '../../util/log.js';
import { DEFAULT_LIVENESS, WatchLiveness, type EndpointRotation, type LivenessTimings } from './watch-liveness.js';

/** The part of etcd3's IDuplexStream<IWatchRequest, IWatchResponse> a watch uses. */
export interface WatchStreamLike {
  write(req: IWatchRequest): unknown;
  on(event: 'data', fn: (res: IWatchResponse) => void): unknown;
  on(event: 'error', fn: (err: Error) => void): unknown;
  on(event: 'end', fn: () => void): unknown;
  cancel(): void;
}

/** A stream to one endpoint and what to release with it. */
export interface WatchConnection {
  readonly stream: WatchStreamLike;
  close(): void;
}

/** Opens a watch stream to `endpoint` (its own client and connection). */
export type WatchConnector = (endpoint: string) => Promise<WatchConnection>;

/** etcd ended the watch for good (compaction, refused permission): list again. */
export class WatchCanceledError extends Error {
  constructor(
    message: string,
    readonly compactRevision: string | null,
  ) {
    super(message);
    this.name = 'WatchCanceledError';
  }
}

export interface LivelyWatchOptions {
  /** What is watched, for messages. */
  readonly what: string;
  readonly key: Buffer;
  readonly rangeEnd?: Buffer;
  /** The first revision delivered. */
  readonly fromRevision: string;
  readonly connect: WatchConnector;
  readonly rotation: EndpointRotation;
  /** How many endpoints there are: a start-up tries each once before giving up. */
  readonly endpointCount: number;
  readonly logger: Logger;
  /** A stream not created within this long is given up (the next endpoint is tried). */
  readonly createTimeoutMs: number;
  readonly timings?: LivenessTimings;
  readonly now?: () => number;
  /** Events after the start revision, in store order, never empty. */
  readonly onEvents: (events: IEvent[]) => void;
  /** The watch is over (canceled by etcd); nothing follows. */
  readonly onError: (err: Error) => void;
}

/** flannel's watch retry backoff: 100 ms doubling up to 5 s, after every endpoint failed once. */
const RETRY_MIN_MS = 100;
const RETRY_MAX_MS = 5000;

export class LivelyWatch {
  private resume: bigint;
  /** No more callbacks: cancelled by the caller, or ended by etcd. */
  private closed = false;
  /** Cancelled by the caller: not even pending callbacks run. */
  private cancelled = false;
  private current: { conn: WatchConnection; endpoint: string; liveness: WatchLiveness; timer: NodeJS.Timeout } | null = null;
  private recovering = false;
  /** Wakes a recovery backoff when the watch is cancelled. */
  private wake: (() => void) | null = null;
  private readonly timings: LivenessTimings;
  private readonly now: () => number;

  constructor(private readonly o: LivelyWatchOptions) {
    if (!/^\d+$/.test(o.fromRevision)) throw new RangeError(`watch start revision ${JSON.stringify(o.fromRevision)}`);
    this.resume = BigInt(o.fromRevision);
    this.timings = o.timings ?? DEFAULT_LIVENESS;
    this.now = o.now ?? Date.now;
  }

  /** The revision the watch would resume from (the one after the last event delivered). */
  get resumeRevision(): string {
    return this.resume.toString();
  }

  /** The endpoint the watch is connected to, null while it reconnects. */
  get endpoint(): string | null {
    return this.current?.endpoint ?? null;
  }

  /**
   * Creates the watch, trying each endpoint once. Throws the last failure when none works, or
   * WatchCanceledError when etcd refuses it. No callback runs before this resolves.
   */
  async start(): Promise<void> {
    let last: unknown = new Error('no endpoint tried');
    for (let i = 0; i < Math.max(1, this.o.endpointCount) && !this.closed; i++) {
      const endpoint = this.o.rotation.pick(this.now());
      try {
        await this.attempt(endpoint);
        return;
      } catch (e) {
        if (e instanceof WatchCanceledError) throw e;
        this.o.rotation.suspect(endpoint, this.now());
        this.o.logger.debug('etcd watch not created; trying the next endpoint', { watch: this.o.what, endpoint, error: errorMessage(e) });
        last = e;
      }
    }
    throw last;
  }

  /** Stops the watch; resolves at once, whatever state the stream is in. */
  cancel(): Promise<void> {
    this.closed = true;
    this.cancelled = true;
    this.teardown();
    this.wake?.();
    return Promise.resolve();
  }

  /** Opens a stream to `endpoint`, creates the watch on it and installs the liveness checks. */
  private async attempt(endpoint: string): Promise<void> {
    const conn = await withTimeout(this.o.connect(endpoint), this.o.createTimeoutMs, release);
    if (this.closed) {
      release(conn);
      return;
    }
    const { stream } = conn;
    // One set of listeners for the stream's whole life: responses that arrive in the same turn as
    // the creation must not slip between a creation handler and the steady-state one.
    let phase: 'creating' | 'established' | 'failed' = 'creating';
    const early: IWatchResponse[] = [];
    let gotCreated = false;
    let settle: { resolve: () => void; reject: (e: Error) => void } | null = null;
    const created = new Promise<void>((resolve, reject) => (settle = { resolve, reject }));
    const outcome: { failure: Error | null } = { failure: null };
    const fail = (err: Error) => {
      if (phase === 'creating') {
        phase = 'failed';
        outcome.failure = err;
        settle?.reject(err);
      } else if (phase === 'established') {
        this.lost(conn, err.message, false);
      }
    };
    stream.on('data', (res) => {
      if (phase === 'established') return this.onData(conn, res);
      if (phase === 'failed') return;
      if (gotCreated) return void early.push(res);
      if (!isCreated(res)) return fail(new Error('etcd answered before creating the watch'));
      if (res.canceled) return fail(canceledError(res));
      gotCreated = true;
      settle?.resolve();
    });
    stream.on('error', (err) => fail(new Error(`stream failed: ${err.message}`)));
    stream.on('end', () => fail(new Error('etcd ended the stream')));
    try {
      stream.write({
        create_request: {
          key: this.o.key,
          ...(this.o.rangeEnd ? { range_end: this.o.rangeEnd } : {}),
          start_revision: this.resume.toString(),
        },
      });
      await withTimeout(created, this.o.createTimeoutMs);
    } catch (e) {
      phase = 'failed';
      release(conn);
      throw e;
    }
    if (this.closed || outcome.failure) {
      phase = 'failed';
      release(conn);
      if (outcome.failure) throw outcome.failure;
      return;
    }
    const liveness = new WatchLiveness(this.timings, this.now());
    const timer = setInterval(() => this.tick(), this.timings.tickMs);
    timer.unref();
    this.current = { conn, endpoint, liveness, timer };
    phase = 'established';
    this.o.rotation.trust(endpoint);
    for (const res of early.splice(0)) this.onData(conn, res);
  }

  private onData(conn: WatchConnection, res: IWatchResponse): void {
    const cur = this.current;
    if (this.closed || !cur || cur.conn !== conn) return;
    cur.liveness.heard(this.now());
    if (res.canceled) {
      const err = canceledError(res);
      this.closed = true;
      this.teardown();
      this.deliver(() => this.o.onError(err));
      return;
    }
    const events = Array.isArray(res.events) ? res.events : [];
    if (events.length === 0) return; // a progress answer: heard, nothing to deliver
    // Resume after the last event delivered, not after the header revision: etcd may send a
    // catching-up watcher part of the events up to the header revision (its 1000-revision batches).
    const rev = events[events.length - 1]?.kv?.mod_revision;
    if (typeof rev === 'string' && /^\d+$/.test(rev) && BigInt(rev) >= this.resume) this.resume = BigInt(rev) + 1n;
    this.deliver(() => this.o.onEvents(events));
  }

  private tick(): void {
    const cur = this.current;
    if (this.closed || !cur) return;
    const verdict = cur.liveness.check(this.now());
    switch (verdict.kind) {
      case 'wait':
        return;
      case 'probe':
        try {
          cur.conn.stream.write({ progress_request: {} });
        } catch (e) {
          this.lost(cur.conn, `progress request failed: ${errorMessage(e)}`, true);
        }
        return;
      case 'dead':
        this.o.logger.warn('etcd member stopped answering the watch; switching to another member', {
          watch: this.o.what,
          endpoint: cur.endpoint,
          silentMs: verdict.silentMs,
        });
        this.lost(cur.conn, `no answer for ${verdict.silentMs} ms`, true);
        return;
    }
  }

  /** The stream on `conn` is gone: drop it and re-establish through another member. */
  private lost(conn: WatchConnection, reason: string, silent: boolean): void {
    const cur = this.current;
    if (this.closed || !cur || cur.conn !== conn) return;
    this.o.rotation.suspect(cur.endpoint, this.now());
    if (!silent) this.o.logger.warn('etcd watch interrupted; re-establishing it', { watch: this.o.what, endpoint: cur.endpoint, reason });
    this.teardown();
    void this.recover();
  }

  private async recover(): Promise<void> {
    if (this.recovering) return;
    this.recovering = true;
    let delayMs = 0;
    let failures = 0;
    try {
      while (!this.closed) {
        // Every endpoint once without waiting, then back off between rounds.
        if (failures > 0 && failures % Math.max(1, this.o.endpointCount) === 0) {
          delayMs = Math.min(RETRY_MAX_MS, Math.max(RETRY_MIN_MS, delayMs * 2));
          await this.sleep(delayMs);
          if (this.closed) return;
        }
        const endpoint = this.o.rotation.pick(this.now());
        try {
          await this.attempt(endpoint);
          if (this.closed) return;
          this.o.logger.info('etcd watch re-established', { watch: this.o.what, endpoint, fromRevision: this.resume.toString() });
          return;
        } catch (e) {
          if (e instanceof WatchCanceledError) {
            this.closed = true;
            this.deliver(() => this.o.onError(e));
            return;
          }
          failures++;
          this.o.rotation.suspect(endpoint, this.now());
          // The first failure of an outage is worth a warning; the retries that follow are not.
          const log = failures === 1 ? this.o.logger.warn.bind(this.o.logger) : this.o.logger.debug.bind(this.o.logger);
          log('cannot re-establish the etcd watch; retrying', { watch: this.o.what, endpoint, error: errorMessage(e) });
        }
      }
    } finally {
      this.recovering = false;
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const t = setTimeout(done, ms);
      function done(): void {
        clearTimeout(t);
        resolve();
      }
      this.wake = done;
    }).finally(() => (this.wake = null));
  }

  private teardown(): void {
    const cur = this.current;
    this.current = null;
    if (!cur) return;
    clearInterval(cur.timer);
    release(cur.conn);
  }

  /**
   * Callbacks run on a later turn, in order, never after cancel(): the caller of start() has its
   * watch handle before the first one runs.
   */
  private deliver(fn: () => void): void {
    setImmediate(() => {
      if (!this.cancelled) fn();
    });
  }
}

function isCreated(res: IWatchResponse): boolean {
  return res.created === true;
}

function canceledError(res: IWatchResponse): WatchCanceledError {
  const compact = typeof res.compact_revision === 'string' && /^[1-9]\d*$/.test(res.compact_revision) ? res.compact_revision : null;
  const reason = typeof res.cancel_reason === 'string' && res.cancel_reason !== '' ? res.cancel_reason : null;
  const msg = compact ? `etcd canceled the watch: revision compacted (oldest kept: ${compact})` : `etcd canceled the watch: ${reason ?? 'no reason given'}`;
  return new WatchCanceledError(msg, compact);
}

/**
 * Ends a stream and its client. Its listeners stay (an 'error' without one would throw) and
 * ignore it from now on: they act only for the current connection.
 */
function release(conn: WatchConnection): void {
  try {
    conn.stream.cancel();
  } catch {
    // already gone
  }
  conn.close();
}

/** `p`, or a rejection after `ms`; what `p` yields after the timeout is handed to `discard`. */
async function withTimeout<T>(p: Promise<T>, ms: number, discard?: (late: T) => void): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  let timedOut = false;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      timedOut = true;
      reject(new Error(`no answer within ${ms} ms`));
    }, ms);
  });
  p.then(
    (v) => {
      if (timedOut) discard?.(v);
    },
    () => undefined,
  );
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
