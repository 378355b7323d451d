// The client of weft-spawn (cni-plugins/native/weft-spawn.c), the CNI plugin process's spawn
// helper: a Node.js spawn forks the whole plugin process (~3.7 ms of its event loop at 57 MB; a pod
// ADD does ~7), the helper's posix_spawn costs this process one pipe write. Started once (by
// Node's spawn), restarted by the next call after it dies; if it cannot be started at all (not
// built), every call goes to Node's spawn for good. The wire format is described in weft-spawn.c.
//
// Results are what exec.ts's Node spawn gives: the same ExecResult, the same CommandError
// messages ("spawn <cmd> ENOENT" → notFound, "killed by SIGTERM" after the deadline). Differences:
// StartedProgram.pid is undefined, output over 16 MiB per stream fails the call, and programs
// still running when the plugin process dies keep running (as with Node's spawn).
import { existsSync, fstatSync } from 'node:fs';
import { constants } from 'node:os';
import {
  CommandError,
  startSpawnHelperProcess,
  useSpawnHelper,
  type ChildProcess,
  type ExecResult,
  type HelperSpawnRequest,
  type SpawnBackend,
  type StartedProgram,
} from './exec.js';

// Caps shared with weft-spawn.c.
const MAX_REQUEST = 32 << 20;
const MAX_OUTPUT = 16 << 20;
const MAX_REPLY = 2 * MAX_OUTPUT + 64;
const MAX_ARGS = 4096;
const MAX_ENV = 4096;
const MAX_NSFDS = 8;

export const REQ_START = 1;
export const REQ_FEED = 2;
const REP_EXIT = 1;
const REP_ERROR = 2;
/** ERROR reply codes (weft-spawn.c). */
export const HelperError = { Spawn: 1, BadRequest: 2, NsFd: 3, Output: 4, Limit: 5 } as const;

export type HelperReply =
  | { readonly t: 'exit'; readonly id: number; readonly signal: number | null; readonly code: number; readonly stdout: Buffer; readonly stderr: Buffer }
  | { readonly t: 'error'; readonly id: number; readonly code: number; readonly errno: number; readonly message: string };

/** A namespace fd as the helper checks it: the fd number in this process, and its identity. */
export interface NsFdRef {
  readonly fd: number;
  readonly dev: bigint;
  readonly ino: bigint;
}

/** One START frame (length prefix included). */
export function encodeStart(
  id: number,
  req: { readonly argv: readonly string[]; readonly env: readonly string[]; readonly pipeStdin: boolean; readonly input?: string; readonly timeoutMs: number; readonly nsFds: readonly NsFdRef[] },
): Buffer {
  const strs = [...req.argv, ...req.env].map((s) => Buffer.from(s, 'utf8'));
  const input = req.input !== undefined ? Buffer.from(req.input, 'utf8') : undefined;
  let size = 4 + 1 + 4 + 1 + 4 + 2 + 2 + 1 + req.nsFds.length * 20;
  for (const s of strs) size += 4 + s.length;
  if (input) size += 4 + input.length;
  const b = Buffer.allocUnsafe(size);
  let o = b.writeUInt32LE(size - 4, 0);
  o = b.writeUInt8(REQ_START, o);
  o = b.writeUInt32LE(id, o);
  o = b.writeUInt8((req.pipeStdin ? 1 : 0) | (input ? 2 : 0), o);
  o = b.writeUInt32LE(Math.min(Math.max(0, Math.floor(req.timeoutMs)), 0xffffffff), o);
  o = b.writeUInt16LE(req.argv.length, o);
  o = b.writeUInt16LE(req.env.length, o);
  o = b.writeUInt8(req.nsFds.length, o);
  for (const f of req.nsFds) {
    o = b.writeUInt32LE(f.fd, o);
    o = b.writeBigUInt64LE(f.dev, o);
    o = b.writeBigUInt64LE(f.ino, o);
  }
  for (const s of input ? [...strs, input] : strs) {
    o = b.writeUInt32LE(s.length, o);
    o += s.copy(b, o);
  }
  return b;
}

/** One FEED frame: `input` is program `id`'s whole stdin. */
export function encodeFeed(id: number, input: string): Buffer {
  const data = Buffer.from(input, 'utf8');
  const b = Buffer.allocUnsafe(9 + data.length);
  b.writeUInt32LE(5 + data.length, 0);
  b.writeUInt8(REQ_FEED, 4);
  b.writeUInt32LE(id, 5);
  data.copy(b, 9);
  return b;
}

/** Splits the helper's stdout into replies; throws on a malformed one (then the helper is not trusted). */
export class ReplyReader {
  private chunks: Buffer[] = [];
  private size = 0;

  push(chunk: Buffer): HelperReply[] {
    this.chunks.push(chunk);
    this.size += chunk.length;
    const out: HelperReply[] = [];
    while (this.size >= 4) {
      if (this.chunks[0]!.length < 4) this.flatten();
      const len = this.chunks[0]!.readUInt32LE(0);
      if (len > MAX_REPLY || len < 5) throw new Error(`spawn helper: reply of ${len} bytes`);
      if (this.size < 4 + len) break;
      // Concatenated once per complete reply, not per chunk (a reply may be 32 MiB).
      this.flatten();
      const all = this.chunks[0]!;
      out.push(decodeReply(all.subarray(4, 4 + len)));
      const rest = all.subarray(4 + len);
      this.chunks = rest.length > 0 ? [rest] : [];
      this.size = rest.length;
    }
    return out;
  }

  private flatten(): void {
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks, this.size)];
  }
}

function decodeReply(b: Buffer): HelperReply {
  let o = 0;
  const need = (n: number) => {
    if (o + n > b.length) throw new Error('spawn helper: truncated reply');
  };
  const u8 = () => (need(1), b.readUInt8(o++));
  const u32 = () => (need(4), (o += 4), b.readUInt32LE(o - 4));
  const bytes = () => {
    const n = u32();
    need(n);
    o += n;
    return b.subarray(o - n, o);
  };
  const type = u8();
  const id = u32();
  if (type === REP_EXIT) {
    const signaled = u8() === 1;
    const value = u32();
    return { t: 'exit', id, signal: signaled ? value : null, code: signaled ? -1 : value, stdout: bytes(), stderr: bytes() };
  }
  if (type === REP_ERROR) {
    const code = u8();
    const errno = u32() | 0;
    return { t: 'error', id, code, errno, message: bytes().toString('utf8') };
  }
  throw new Error(`spawn helper: reply type ${type}`);
}

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(Object.entries(constants.signals).map(([k, v]) => [v, k as NodeJS.Signals]));
const ERRNO_NAMES = new Map<number, string>(Object.entries(constants.errno).map(([k, v]) => [v, k]));

/** One call: its request until sent, then its settlement. */
interface Call {
  readonly req: HelperSpawnRequest;
  readonly fallback: () => StartedProgram;
  readonly nsFds: readonly NsFdRef[];
  readonly resolve: (r: ExecResult) => void;
  readonly reject: (e: Error) => void;
  /** The stdin given to feed (sent with the START when given before it went out). */
  input: string | undefined;
  fed: boolean;
  sent: boolean;
  /** Set when the helper handed the call back to Node's spawn. */
  moved: StartedProgram | undefined;
}

export class SpawnHelper implements SpawnBackend {
  private proc: ChildProcess | undefined;
  private running = false;
  private disabled = false;
  private nextId = 1;
  private readonly calls = new Map<number, Call>();
  /** Frames of this tick (built at its end), then the bytes to write. */
  private pendingFrames: Array<() => Buffer | undefined> = [];
  private queue: Buffer[] = [];
  private flushQueued = false;
  /** Calls the helper took, and those it handed back to Node's spawn (for tests). */
  readonly stats = { started: 0, moved: 0 };

  /** `file`: the weft-spawn binary; `ownerPid`: whose fds nsFds name (this process). */
  constructor(
    readonly file: string,
    private readonly ownerPid = process.pid,
  ) {}

  /** The helper's pid while it runs (for tests). */
  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** False once the helper could not be started: every call goes to Node's spawn. */
  get usable(): boolean {
    return !this.disabled;
  }

  start(req: HelperSpawnRequest, fallback: () => StartedProgram): StartedProgram | undefined {
    if (this.disabled) return undefined;
    const env = Object.entries(req.env).flatMap(([k, v]) => (v === undefined ? [] : [`${k}=${v}`]));
    if (req.args.length + 1 > MAX_ARGS || env.length > MAX_ENV || req.nsFds.length > MAX_NSFDS) return undefined;
    let nsFds: NsFdRef[];
    try {
      nsFds = req.nsFds.map((fd) => {
        const st = fstatSync(fd, { bigint: true });
        return { fd, dev: st.dev, ino: st.ino };
      });
    } catch {
      return undefined; // a closed fd: Node's spawn reports it as it always did
    }
    const proc = this.ensure();
    if (!proc) return undefined;
    const id = this.nextId;
    this.nextId = this.nextId >= 0xffffffff ? 1 : this.nextId + 1;
    let call!: Call;
    const result = new Promise<ExecResult>((resolve, reject) => {
      call = { req, fallback, nsFds, resolve, reject, input: undefined, fed: false, sent: false, moved: undefined };
    });
    result.catch(() => undefined); // as exec.ts: the caller may fail elsewhere before awaiting it
    this.calls.set(id, call);
    this.stats.started++;
    this.refWhileBusy();
    // The START goes out at the end of this tick, so execProgram's immediate feed rides along.
    this.enqueue(() => {
      call.sent = true;
      const argv = [req.command, ...req.args];
      const frame = encodeStart(id, { argv, env, pipeStdin: req.stdin === 'pipe', input: call.input, timeoutMs: req.timeoutMs, nsFds });
      if (frame.length - 4 > MAX_REQUEST) {
        this.settle(id, () => call.reject(new CommandError(req.command, req.args, null, '', 'request too large for the spawn helper')));
        return undefined;
      }
      return frame;
    });
    return {
      pid: undefined,
      result,
      feed: (input: string) => {
        if (call.fed || req.stdin !== 'pipe') return;
        call.fed = true;
        call.input = input; // before the START is sent it goes with it; kept too for a move
        if (call.moved) call.moved.feed(input);
        else if (call.sent && this.calls.get(id) === call) this.enqueue(() => encodeFeed(id, input));
      },
    };
  }

  /** Closes the helper's stdin: it exits (programs it started keep running). */
  close(): void {
    const p = this.proc;
    if (p) p.stdin?.end();
  }

  private enqueue(frame: () => Buffer | undefined): void {
    this.pendingFrames.push(frame);
    if (this.flushQueued) return;
    this.flushQueued = true;
    queueMicrotask(() => this.flush());
  }

  private flush(): void {
    this.flushQueued = false;
    const makers = this.pendingFrames;
    this.pendingFrames = [];
    for (const m of makers) {
      const f = m();
      if (f) this.queue.push(f);
    }
    const proc = this.proc;
    if (this.queue.length === 0 || !proc?.stdin) return;
    const data = this.queue.length === 1 ? this.queue[0]! : Buffer.concat(this.queue);
    this.queue = [];
    proc.stdin.write(data);
  }

  private ensure(): ChildProcess | undefined {
    if (this.proc) return this.proc;
    let proc: ChildProcess;
    try {
      proc = startSpawnHelperProcess(this.file, [String(this.ownerPid)]);
    } catch {
      this.disabled = true;
      return undefined;
    }
    this.proc = proc;
    this.running = false;
    const reader = new ReplyReader();
    proc.on('spawn', () => (this.running = true));
    proc.on('error', () => {
      this.lost(proc, this.running ? 'failed' : 'could not be started');
      if (this.running) proc.kill('SIGKILL'); // no longer ours: make sure it goes
    });
    // 'close', not 'exit': the replies still in its stdout are read first.
    proc.on('close', (code, signal) => this.lost(proc, signal ? `was killed by ${signal}` : `exited with status ${code}`));
    proc.stdin?.on('error', () => {}); // EPIPE once it is gone: 'exit' says so
    proc.stdout?.on('data', (chunk: Buffer) => {
      let replies: HelperReply[];
      try {
        replies = reader.push(chunk);
      } catch {
        proc.kill('SIGKILL'); // out of step: its 'exit' fails the calls
        return;
      }
      for (const r of replies) this.onReply(r);
    });
    proc.unref();
    unrefStream(proc.stdin);
    unrefStream(proc.stdout);
    return proc;
  }

  /** The helper is gone: fail what it was running, start a new one with the next call. */
  private lost(proc: ChildProcess, how: string): void {
    if (this.proc !== proc) return;
    this.proc = undefined;
    const never = !this.running;
    // Not running at all (not built, not executable): Node's spawn from now on, calls included.
    if (never) this.disabled = true;
    const calls = [...this.calls.entries()];
    this.calls.clear();
    this.pendingFrames = [];
    this.queue = [];
    for (const [, c] of calls) {
      if (never || !c.sent) this.move(c);
      else c.reject(new CommandError(c.req.command, c.req.args, null, '', `the spawn helper ${how} while the program ran`));
    }
    this.refWhileBusy();
  }

  /** Runs `c` with Node's spawn instead. */
  private move(c: Call): void {
    this.stats.moved++;
    const p = c.fallback();
    c.moved = p;
    if (c.fed && c.input !== undefined) p.feed(c.input);
    p.result.then(c.resolve, c.reject);
  }

  private settle(id: number, then: () => void): void {
    this.calls.delete(id);
    this.refWhileBusy();
    then();
  }

  private onReply(r: HelperReply): void {
    const c = this.calls.get(r.id);
    if (!c) return; // id 0: a request it could not read; ours are well formed
    const { command, args } = c.req;
    this.settle(r.id, () => {
      if (r.t === 'exit') {
        const stdout = r.stdout.toString('utf8');
        const stderr = r.stderr.toString('utf8');
        if (r.signal === null) {
          c.resolve({ code: r.code, stdout, stderr });
          return;
        }
        const sig = SIGNAL_NAMES.get(r.signal) ?? null;
        c.reject(new CommandError(command, args, null, stderr, `killed by ${sig ?? `signal ${r.signal}`}`, stdout, sig));
        return;
      }
      switch (r.code) {
        case HelperError.Spawn:
          // Node's words ("spawn ip ENOENT"): CommandError.notFound looks for ENOENT.
          c.reject(new CommandError(command, args, null, '', `spawn ${command} ${ERRNO_NAMES.get(r.errno) ?? `errno ${r.errno}`}`));
          return;
        case HelperError.NsFd:
        case HelperError.Limit:
          this.move(c);
          return;
        default:
          c.reject(new CommandError(command, args, null, '', `spawn helper: ${r.message}`));
      }
    });
  }

  /** The helper keeps this process alive only while it runs programs for it. */
  private refWhileBusy(): void {
    const out = this.proc?.stdout as unknown as Partial<RefCounted> | null | undefined;
    if (this.calls.size > 0) out?.ref?.();
    else out?.unref?.();
  }
}

interface RefCounted {
  ref(): void;
  unref(): void;
}

function unrefStream(s: unknown): void {
  (s as Partial<RefCounted> | null | undefined)?.unref?.();
}

/**
 * Has this process's programs started by the spawn helper: $WEFT_SPAWN_HELPER when set (empty:
 * none), else the first of `candidates` that exists. Returns the helper, or undefined (Node's spawn).
 */
export function enableSpawnHelper(candidates: readonly string[]): SpawnHelper | undefined {
  const env = process.env.WEFT_SPAWN_HELPER;
  const file = env !== undefined ? env || undefined : candidates.find((f) => existsSync(f));
  if (file === undefined || !existsSync(file)) return undefined;
  const helper = new SpawnHelper(file);
  useSpawnHelper(helper);
  return helper;
}
