// apply()'s transport: many requests per sendmsg on a raw rtnetlink socket of its own.
//
// Why this works (net/netlink/af_netlink.c, rtnetlink.c): a datagram sent to the kernel is
// handled inside the sendmsg call by netlink_rcv_skb(), which walks every message in it in order,
// runs each, and answers each with an NLMSG_ERROR — errno 0 (an ACK) only if the message asked
// for one with NLM_F_ACK, a real error always — then goes on with the next message even after a
// failure. The answers land on this socket's receive queue in that order. So every message has
// its own seq, an answer names the message it belongs to, and once the answer to a pack's last
// message has arrived every earlier message of the pack has been answered too.
//
// By default only the last message of a pack asks for an ACK: the messages before it answer only
// when they fail, and are known to have succeeded once the last one's answer is in. That saves
// the kernel an skb and us two recvmsg calls and a trip into JS per success — the receive side
// was most of the per-op cost. `ackEach` asks every message for an ACK instead (same results,
// slower; kept for comparison and as a fallback).
//
// maxInFlight bounds the messages sent and not yet answered, because every answer occupies the
// receive buffer (an skb of ~1 KiB truesize) and an overflow aborts the process in this library
// (its poll handler throws from native code on ENOBUFS: SIGABRT); it is further capped by what the socket's actual receive buffer can hold.
import { Protocol, RawNetlinkSocket, type ErrnoException, type MessageInfo } from 'netlink';

import { errnoName, toNetlinkError } from './codec.js';
import { describeOp, InvalidOpError, writeOp } from './ops.js';
import { NetlinkError, type NetlinkOp } from './types.js';
import { forEachMessage, MessageWriter, NLM_F_ACK, NLMSG_ERROR, type ReplyHeader } from './wire.js';

/** Receive-buffer bytes reserved per answer in flight (an ACK/error skb's truesize is ~0.7–1.3 KiB). */
const BYTES_PER_ANSWER = 2048;
/** Bytes reserved in a pack's buffer per message; it grows if a message is larger. */
const BYTES_PER_MESSAGE = 96;

export interface BatchOptions {
  maxInFlight: number;
  /** Messages per sendmsg (at most maxInFlight). */
  packSize: number;
  /** A pack without its last answer after this long fails with ETIMEDOUT; 0 = never. */
  timeoutMs: number;
  /** Ask every message for an ACK instead of only each pack's last one. */
  ackEach: boolean;
  recvBufferSize: number;
  sendBufferSize: number;
}

/** One apply() call: its ops in order, and where each op's outcome goes (null = applied). */
export interface BatchJob {
  readonly ops: readonly NetlinkOp[];
  settle(index: number, error: NetlinkError | null): void;
}

interface Queued {
  job: BatchJob;
  next: number;
}

interface Pack {
  firstSeq: number;
  count: number;
  jobs: BatchJob[];
  indices: number[];
  /** Per message: -1 not answered yet, 0 ACKed, > 0 the errno it failed with. */
  answers: Int32Array;
  answered: number;
  timer: NodeJS.Timeout | null;
}

export class BatchSocket {
  private readonly raw: RawNetlinkSocket;
  private readonly port: number;
  private readonly maxInFlight: number;
  private readonly packSize: number;
  private seq = 1;
  private inFlight = 0;
  private queue: Queued[] = [];
  private queueHead = 0;
  private queuedOps = 0;
  private readonly outstanding: Pack[] = [];
  private dead: NetlinkError | null = null;
  private referenced = false;

  constructor(
    private readonly opts: BatchOptions,
    private readonly onFatal: (err: NetlinkError) => void,
  ) {
    this.raw = new RawNetlinkSocket(Protocol.ROUTE, {
      recvBufferSize: opts.recvBufferSize,
      sendBufferSize: opts.sendBufferSize,
    });
    try {
      this.port = this.raw.address().port;
      // getsockopt(SO_RCVBUF) reports the doubled value the kernel accounts against.
      const byBuffer = Math.max(1, Math.floor(this.raw.getRecvBufferSize() / BYTES_PER_ANSWER));
      this.maxInFlight = Math.max(1, Math.min(opts.maxInFlight, byBuffer));
      this.packSize = Math.max(1, Math.min(opts.packSize, this.maxInFlight));
    } catch (e) {
      this.raw.close();
      throw e;
    }
    this.raw.unref();
    this.raw.on('message', (msg: Buffer, rinfo: MessageInfo) => this.receive(msg, rinfo));
    this.raw.on('error', (e: ErrnoException) => {
      const err = new NetlinkError(e.code || 'EIO', 'netlink batch socket', e.message);
      this.abort(err);
      this.onFatal(err);
    });
  }

  /** Messages in flight at most, after the receive-buffer cap. */
  get effectiveMaxInFlight(): number {
    return this.maxInFlight;
  }

  get effectivePackSize(): number {
    return this.packSize;
  }

  /** Queues a job's ops behind every earlier job's, and sends what the in-flight bound allows. */
  submit(job: BatchJob): void {
    if (job.ops.length === 0) return;
    if (this.dead) {
      for (let i = 0; i < job.ops.length; i++) job.settle(i, perOp(this.dead, job.ops[i]));
      return;
    }
    this.queue.push({ job, next: 0 });
    this.queuedOps += job.ops.length;
    this.pump();
  }

  /**
   * Fails everything queued or in flight with err (ops whose failure was already answered keep
   * their own errno); later submits fail with it too.
   */
  abort(err: NetlinkError): void {
    if (this.dead) return;
    this.dead = err; // before settling: nothing may be sent from here on
    for (const p of [...this.outstanding]) this.complete(p, err);
    const queued = this.queue.slice(this.queueHead);
    this.queue = [];
    this.queueHead = 0;
    this.queuedOps = 0;
    for (const q of queued) {
      for (let i = q.next; i < q.job.ops.length; i++) q.job.settle(i, perOp(err, q.job.ops[i]));
    }
    this.setRef(false);
  }

  close(err: NetlinkError): void {
    this.abort(err);
    this.raw.close();
  }

  private pump(): void {
    while (this.queuedOps > 0 && !this.dead) {
      // Wait for room for a full pack rather than send a trickle of small ones.
      const want = Math.min(this.packSize, this.queuedOps);
      if (this.maxInFlight - this.inFlight < want) return;
      this.sendPack(want);
    }
  }

  private sendPack(n: number): void {
    const w = new MessageWriter(n * BYTES_PER_MESSAGE);
    const jobs: BatchJob[] = [];
    const indices: number[] = [];
    const firstSeq = this.seq;
    let lastOffset = -1;
    const failed: Array<{ job: BatchJob; index: number; error: NetlinkError }> = [];
    while (jobs.length < n && this.queuedOps > 0) {
      const q = this.queue[this.queueHead]!;
      const index = q.next++;
      this.queuedOps--;
      if (q.next === q.job.ops.length) this.dropHead();
      const op = q.job.ops[index]!;
      const offset = w.length;
      try {
        writeOp(w, op, this.seq, this.port, this.opts.ackEach);
      } catch (e) {
        w.abort();
        const desc = safeDescribe(op);
        const error =
          e instanceof InvalidOpError ? new NetlinkError('EINVAL', desc, `invalid argument: ${e.reason}`) : toNetlinkError(e, desc);
        failed.push({ job: q.job, index, error });
        continue;
      }
      lastOffset = offset;
      this.seq = (this.seq + 1) >>> 0;
      jobs.push(q.job);
      indices.push(index);
    }
    const count = jobs.length;
    if (count > 0) {
      if (!this.opts.ackEach) w.orFlags(lastOffset, NLM_F_ACK);
      const pack: Pack = { firstSeq, count, jobs, indices, answers: new Int32Array(count).fill(-1), answered: 0, timer: null };
      this.outstanding.push(pack);
      this.inFlight += count;
      this.setRef(true);
      if (this.opts.timeoutMs > 0) {
        pack.timer = setTimeout(() => this.timeOut(pack), this.opts.timeoutMs);
      }
      try {
        this.raw.send(w.bytes(), {}, (error?: ErrnoException) => {
          if (error) this.sendFailed(pack, error);
        });
      } catch (e) {
        // Thrown synchronously only when the socket is closed or unusable: nothing more can go out.
        const err = toNetlinkError(e, 'netlink batch socket');
        this.abort(err);
        this.onFatal(err);
      }
    }
    // Outcomes of ops rejected before sending, after the pack is on its way: settling may run
    // the caller's code, which must not see a half-built pack.
    for (const f of failed) f.job.settle(f.index, f.error);
  }

  private dropHead(): void {
    this.queueHead++;
    if (this.queueHead === this.queue.length) {
      this.queue = [];
      this.queueHead = 0;
    } else if (this.queueHead >= 64 && this.queueHead * 2 >= this.queue.length) {
      this.queue = this.queue.slice(this.queueHead);
      this.queueHead = 0;
    }
  }

  private receive(msg: Buffer, rinfo: MessageInfo): void {
    if (rinfo.port !== 0) return; // only the kernel answers requests
    forEachMessage(msg, (h) => this.answer(h));
  }

  private answer(h: ReplyHeader): void {
    if (h.type !== NLMSG_ERROR) return; // NEW/DEL requests get nothing else
    for (const p of this.outstanding) {
      const i = (h.seq - p.firstSeq) >>> 0;
      if (i >= p.count) continue;
      if (p.answers[i]! !== -1) return; // duplicate: cannot happen, ignore
      p.answers[i] = h.errno;
      p.answered++;
      // In tail-ACK mode the last message's answer closes the pack; in ackEach mode every
      // message is answered.
      if (p.answered === p.count || (!this.opts.ackEach && i === p.count - 1)) this.complete(p, null);
      return;
    }
    // An answer for a pack already failed by its timeout: nothing is waiting for it.
  }

  /** Settles every op of the pack: by its answer, or (when given) with err where none came. */
  private complete(p: Pack, err: NetlinkError | null): void {
    const at = this.outstanding.indexOf(p);
    if (at < 0) return;
    this.outstanding.splice(at, 1);
    if (p.timer) clearTimeout(p.timer);
    this.inFlight -= p.count;
    if (this.outstanding.length === 0) this.setRef(false);
    for (let i = 0; i < p.count; i++) {
      const job = p.jobs[i]!;
      const index = p.indices[i]!;
      const a = p.answers[i]!;
      if (a > 0) {
        const name = errnoName(a);
        job.settle(index, new NetlinkError(name, safeDescribe(job.ops[index]!), `Request rejected: ${name}`));
      } else if (a === 0 || err === null) {
        // ACKed, or (tail-ACK mode) not answered before the pack's last message was: success.
        job.settle(index, null);
      } else {
        job.settle(index, perOp(err, job.ops[index]));
      }
    }
    this.pump();
  }

  private timeOut(p: Pack): void {
    p.timer = null;
    this.complete(p, new NetlinkError('ETIMEDOUT', 'netlink batch', `no answer after ${this.opts.timeoutMs} ms`));
  }

  private sendFailed(p: Pack, e: ErrnoException): void {
    // A failed sendmsg reached no handler in the kernel: nothing in the pack was applied.
    this.complete(p, new NetlinkError(e.code || 'EIO', 'netlink batch', e.message));
  }

  /** Keeps the process alive while answers are awaited, like the library's own sockets. */
  private setRef(on: boolean): void {
    if (on === this.referenced) return;
    this.referenced = on;
    try {
      if (on) this.raw.ref();
      else this.raw.unref();
    } catch {
      // The native socket closes itself after a poll error; a closed socket holds nothing alive.
    }
  }
}

function perOp(err: NetlinkError, op: NetlinkOp | undefined): NetlinkError {
  return new NetlinkError(err.errno, op ? safeDescribe(op) : err.op, err.detail);
}

/** describeOp of something that may not be a well-formed op (callers from plain JS). */
function safeDescribe(op: NetlinkOp): string {
  try {
    return describeOp(op);
  } catch {
    return 'malformed op';
  }
}
