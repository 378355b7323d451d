// The sockets under weft's rtnetlink client and the plumbing every request goes through. Every
// socket gets 4 MiB buffers and requests in flight are bounded, because a receive-buffer overflow
// aborts the whole process inside the library. Dumps run one at a time on their own socket: the
// library cannot tell a dump's parts from other replies interleaved with them, and the kernel
// allows one dump per socket at a time. A socket failure or close() ends every wait.
import { AttrStream, createRtNetlink, Flags, FlagsGet, type RtNetlinkSocket } from 'netlink';

import type { BatchSocket } from './batch.js';
import { toNetlinkError } from './codec.js';
import type { Limiter, Mutex } from './limiter.js';
import { NetlinkError, type Watch } from './types.js';

/** SO_RCVBUF/SO_SNDBUF for every socket; the kernel caps it at net.core.rmem_max/wmem_max. */
export const SOCKET_BUFFER_BYTES = 4 << 20;
export const DEFAULT_MAX_IN_FLIGHT = 128;
/** apply() sends this many requests per sendmsg (bounded by maxInFlight). */
export const DEFAULT_PACK_SIZE = 64;
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/** Dump entries parsed between two turns of the event loop. */
const PARSE_SLICE = 500;
const yieldToEvents = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** A dump the kernel marks inconsistent (NLM_F_DUMP_INTR) is retried this many times, then fails with EINTR. */
export const DUMP_ATTEMPTS = 4;

export interface NetlinkOptions {
  /**
   * Requests outstanding at once on the request socket, and apply()'s requests sent and not yet
   * answered on its own socket (default 128; apply() also caps it by that socket's receive
   * buffer: ~2 KiB per answer).
   */
  maxInFlight?: number;
  /** A request (for apply(): a pack) without an answer after this long fails with ETIMEDOUT (default 30 s). */
  requestTimeoutMs?: number;
  /** apply() requests per sendmsg (default 64, at most maxInFlight). 1 = one request per send. */
  packSize?: number;
  /**
   * apply() asks every request for an ACK instead of only each pack's last one (the others
   * answer only when they fail). Same results, more work for the kernel and for us; for
   * comparison. Default false.
   */
  ackEach?: boolean;
}

export type Describe = () => string;
/** Options every request carries: the timeout, and the socket's port so the library does not ask the kernel for it (getsockname) on every send. */
export interface ReqOpts {
  timeout: number;
  localPort: number;
}
export type SocketCall<T> = (s: RtNetlinkSocket, o: ReqOpts) => Promise<T>;

export function openSocket(ref: boolean): RtNetlinkSocket {
  return createRtNetlink({ ref, recvBufferSize: SOCKET_BUFFER_BYTES, sendBufferSize: SOCKET_BUFFER_BYTES });
}

export function invalid(op: string, reason: string): NetlinkError {
  return new NetlinkError('EINVAL', op, `invalid argument: ${reason}`);
}

/**
 * The request and dump sockets, apply()'s batch socket, and the state they share. The per-subject
 * modules (links.ts, addresses-routes.ts, neighbours.ts, events.ts) are functions over one of these.
 */
export class NetlinkConnection {
  private isClosed = false;
  /** Set when a socket reported an error; the handle is unusable and the owner must reopen. */
  private failure: NetlinkError | null = null;
  private readonly aborts = new Set<(e: NetlinkError) => void>();
  /** Open link watches (events.ts adds and removes them); close() closes them all. */
  readonly watches = new Set<Watch>();
  private readonly ctlOpts: ReqOpts;
  private readonly dumpOpts: ReqOpts;
  readonly batch: BatchSocket;
  /** supportsNexthops()'s probe (addresses-routes.ts): one per handle, dropped when it fails for another reason. */
  nexthopProbe: Promise<boolean> | null = null;

  constructor(
    private readonly ctl: RtNetlinkSocket,
    private readonly dumper: RtNetlinkSocket,
    private readonly limiter: Limiter,
    private readonly dumpLock: Mutex,
    private readonly timeoutMs: number,
    makeBatch: (onFatal: (err: NetlinkError) => void) => BatchSocket,
  ) {
    this.batch = makeBatch((err) => this.fail(err));
    this.ctlOpts = { timeout: timeoutMs, localPort: ctl.socket.address().port };
    this.dumpOpts = { timeout: timeoutMs, localPort: dumper.socket.address().port };
    for (const s of [ctl, dumper]) {
      s.socket.on('error', (e) => this.fail(new NetlinkError(e.code || 'EIO', 'netlink socket', e.message)));
    }
  }

  /** Whether close() was called. */
  get closed(): boolean {
    return this.isClosed;
  }

  /** Closes the sockets and every watch; requests still outstanding fail with ECANCELED. */
  close(): void {
    if (this.isClosed) return;
    this.isClosed = true;
    for (const w of [...this.watches]) w.close();
    const closed = new NetlinkError('ECANCELED', 'netlink', 'netlink handle closed');
    this.abortAll(closed);
    this.batch.close(closed);
    this.ctl.socket.close();
    this.dumper.socket.close();
  }

  // -------------------------------------------------------------------------------------------
  // Plumbing

  private fail(err: NetlinkError): void {
    if (this.failure || this.isClosed) return;
    this.failure = err;
    this.abortAll(err);
    this.batch.abort(new NetlinkError(err.errno, err.op, `netlink socket failed: ${err.detail}`));
  }

  private abortAll(err: NetlinkError): void {
    for (const abort of [...this.aborts]) abort(err);
    this.aborts.clear();
  }

  /** A request on the control socket, holding one in-flight slot. */
  request<T>(describe: Describe, fn: SocketCall<T>): Promise<T> {
    return this.guard(describe, () => this.limiter.run(() => this.guardOpen(describe, () => fn(this.ctl, this.ctlOpts))));
  }

  /**
   * A dump on the dump socket, one at a time. It goes through the untyped request so the
   * message flags survive: a dump that raced with changes (NLM_F_DUMP_INTR) is repeated.
   */
  dump<T>(describe: Describe, type: number, format: (out: AttrStream) => void, parse: (data: Buffer) => T): Promise<T[]> {
    const once = async (): Promise<{ items: T[]; interrupted: boolean }> => {
      const out = new AttrStream();
      format(out);
      const [msgs] = await this.dumper.socket.request(type, out.bufs, { ...this.dumpOpts, flags: FlagsGet.DUMP });
      let interrupted = false;
      const items: T[] = [];
      for (const m of msgs) {
        if (m.flags & Flags.DUMP_INTR) interrupted = true;
        items.push(parse(m.data));
        // A dump of 10 000 entries parsed in one go would hold lease events back for its whole
        // length: let them in every few hundred entries.
        if (items.length % PARSE_SLICE === 0) await yieldToEvents();
      }
      return { items, interrupted };
    };
    return this.guard(describe, () =>
      this.dumpLock.run(() =>
        this.guardOpen(describe, async () => {
          for (let attempt = 1; ; attempt++) {
            const { items, interrupted } = await once();
            if (!interrupted) return items;
            if (attempt >= DUMP_ATTEMPTS) {
              throw new NetlinkError('EINTR', describe(), `dump interrupted by concurrent changes ${attempt} times in a row`);
            }
          }
        }),
      ),
    );
  }

  /** Re-checks after waiting for a slot: the handle may have been closed meanwhile. */
  private guardOpen<T>(describe: Describe, fn: () => Promise<T>): Promise<T> {
    const dead = this.deadError(describe);
    return dead ? Promise.reject(dead) : fn();
  }

  private deadError(describe: Describe): NetlinkError | null {
    if (this.isClosed) return new NetlinkError('ECANCELED', describe(), 'netlink handle is closed');
    if (this.failure) return new NetlinkError(this.failure.errno, describe(), `netlink socket failed: ${this.failure.detail}`);
    return null;
  }

  /** Maps every rejection to a NetlinkError, and lets close()/socket failure end the wait. */
  private guard<T>(describe: Describe, fn: () => Promise<T>): Promise<T> {
    const dead = this.deadError(describe);
    if (dead) return Promise.reject(dead);
    return new Promise<T>((resolve, reject) => {
      const abort = (e: NetlinkError): void => reject(new NetlinkError(e.errno, describe(), e.detail));
      this.aborts.add(abort);
      fn().then(
        (v) => {
          this.aborts.delete(abort);
          resolve(v);
        },
        (e: unknown) => {
          this.aborts.delete(abort);
          reject(toNetlinkError(e, describe()));
        },
      );
    });
  }
}
