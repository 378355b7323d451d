// weftd's CNI server (Antrea's design: the plugin executables are thin clients that forward the call
// over a root-only unix socket; the TypeScript plugins run here, in a process that is already up).
// The wire protocol is in frame.ts. What the server guarantees:
//
//  - Access: the socket's directory is created 0700 and the socket is 0600 (bound under umask
//    0177, so it is never connectable by others, even for a moment); only root gets in. Node cannot
//    read a peer's credentials (no SO_PEERCRED), so file permissions are the whole check.
//  - The socket file: a stale one (nothing answers) is replaced; a live one (another weftd) is left
//    alone and taking it over is retried until it goes away; anything that is not a socket is never
//    removed (the server does not start: clients fall back to the bundles). On stop the file is
//    removed if it is still ours.
//  - Requests: each runs the plugin exactly as its bundle would (skel/run.ts `invoke`), with only
//    the request's CNI_* variables (plus the daemon's PATH, for delegates run as programs), in the
//    plugin process (plugin-process.ts), never on weftd's own event loop.
//  - Namespaces: the plugins act on the server's network namespace (the host's). A client in
//    another one (it sends its /proc/self/ns/net) is answered `serving:false` and runs the bundle
//    itself, where it is. So are connections beyond maxConnections.
//    Requests for one container (CNI_CONTAINERID) run one after the other, in arrival order; others
//    run concurrently, at most `maxRunning` at once. A delegate the plugin runs as a program that
//    comes back here (the native client) is a nested request (NESTED_ENV): it runs at once.
//  - Readiness: ADD waits (readyTimeoutMs, 30 s) for weftd's lease and subnet.env, then answers
//    code 11 "try again later". Other verbs run at once.
//  - Isolation: each request has a time bound (requestTimeoutMs, 60 s) after which it is answered
//    with an error and its work abandoned (its container is released, so a DEL can follow). An
//    exception thrown from a request's own asynchronous work fails that request; a plugin process
//    that dies or hangs fails the requests it held; weftd goes on.
//  - Stop: new connections are refused, requests not started yet are answered `serving:false` (the
//    client runs the bundle itself), running ones get stopGraceMs to finish.
import { chmod, lstat, mkdir, readlink, unlink } from 'node:fs/promises';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { dirname } from 'node:path';
import { performance } from 'node:perf_hooks';

import { CniError, ErrorCode } from '../../cni-plugins/skel/types.js';
import { AbortedError, delay } from '../util/backoff.js';
import { errnoCode, errorMessage } from '../util/errors.js';
import type { Logger } from '../util/log.js';
import {
  encodeFrame,
  errorReply,
  MAX_FRAME_BYTES,
  NOT_SERVING,
  parseRequestBody,
  ProtocolError,
  readFrame,
  statusReply,
  type Reply,
  type ServerRequest,
} from './frame.js';
import { PluginRunError, type PluginExecutor } from './executor.js';
import { PluginProcess } from './plugin-process.js';
import { type CniPodHooks, runPodHooks } from './pod-hooks.js';
import { KeyedLock, Slots } from './sync.js';
import {
  CNI_SERVER_PLUGINS,
  CNI_VERBS,
  type CniRequestResult,
  type CniServerMetrics,
  type CniServerPhase,
  type CniServerRequestError,
  type CniServerState,
} from './types.js';

const DEFAULT_PLUGIN_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const LAST_ERRORS = 10;
/**
 * Set in the env of every plugin the server runs, so a delegate it runs as a program inherits it
 * (skel/delegate.ts passes the env on). When that program is the native client, it forwards the
 * variable (a CNI_* one) and the nested request skips the container's queue, the readiness wait and
 * the slot its parent already holds: waiting for them would wait for the parent, which waits for it.
 */
export const NESTED_ENV = 'CNI_WEFT_NESTED';
const READY_POLL_MS = 100;

export interface CniServerOptions {
  readonly socketPath: string;
  readonly logger: Logger;
  readonly metrics: CniServerMetrics;
  /** weftd holds its lease and has written subnet.env. */
  readonly isReady: () => boolean;
  /** Where the plugin work runs (default: a PluginProcess running plugins.ts's plugins). */
  readonly executor?: PluginExecutor;
  /** Time bound of one request, from its arrival to its reply. Default 60 s. */
  readonly requestTimeoutMs?: number;
  /** How long an ADD waits for readiness before answering code 11. Default 30 s. */
  readonly readyTimeoutMs?: number;
  /** How long a connection may take to send its request. Default 10 s. */
  readonly frameTimeoutMs?: number;
  /** Requests running plugin work at once; more wait for a slot. Default 32. */
  readonly maxRunning?: number;
  /** Open connections at once; more are answered `serving:false` (the client runs the bundle). Default 1024. */
  readonly maxConnections?: number;
  /** On stop, how long running requests get to finish. Default 10 s. */
  readonly stopGraceMs?: number;
  /** How often taking over a socket another live server holds is retried. Default 2 s. */
  readonly takeoverRetryMs?: number;
  /** PATH given to the plugins (delegates run as programs need one). Default: weftd's own PATH. */
  readonly pluginPath?: string;
  /** Told of each Kubernetes pod's ADD (awaited before the reply) and DEL (--network-policy). */
  readonly podHooks?: CniPodHooks;
  /** How long an ADD's reply waits for podHooks.podAdded before failing with code 11. Default 10 s. */
  readonly podHookTimeoutMs?: number;
}

/** The socket path cannot be served (not a socket, directory unusable); the server stays off. */
export class CniServerSetupError extends Error {
  constructor(
    readonly socketPath: string,
    reason: string,
  ) {
    super(`CNI server socket ${socketPath}: ${reason}`);
    this.name = 'CniServerSetupError';
  }
}

/** What one request ended as: the reply, and its metric label. */
interface Outcome {
  readonly reply: Reply;
  readonly result: CniRequestResult;
}

const label = <T extends string>(known: readonly T[], v: string): string => ((known as readonly string[]).includes(v) ? v : 'unknown');

/** The code and message of a CNI error printed on stdout (0 and the text itself when it is none). */
function errorOf(stdout: string): { code: number; message: string } {
  try {
    const doc = JSON.parse(stdout) as { code?: unknown; msg?: unknown };
    if (typeof doc.code === 'number') return { code: doc.code, message: typeof doc.msg === 'string' ? doc.msg : '' };
  } catch {
    // not JSON
  }
  return { code: 0, message: stdout.trim().slice(0, 200) };
}

export class CniServer {
  private server: Server | null = null;
  private phase: CniServerPhase = 'off';
  private reason: string | null = null;
  /** The socket file we bound (dev, ino), so stop removes only our own. */
  private bound: { dev: number; ino: number } | null = null;
  private readonly executor: PluginExecutor;
  /** This process's network namespace (`net:[inode]`); null when it cannot be read. */
  private netns: string | null = null;
  private readonly locks = new KeyedLock();
  private readonly slots: Slots;
  private readonly stopping = new AbortController();
  private readonly sockets = new Set<Socket>();
  /** Requests received and not yet answered. */
  private pending = 0;
  private abandonedCount = 0;
  private idle: (() => void) | null = null;
  private readonly errors: CniServerRequestError[] = [];
  private takeover: Promise<void> | null = null;

  constructor(private readonly opts: CniServerOptions) {
    this.slots = new Slots(opts.maxRunning ?? 32);
    this.executor = opts.executor ?? new PluginProcess({ logger: opts.logger.child({ component: 'cni-plugins' }) });
  }

  get socketPath(): string {
    return this.opts.socketPath;
  }

  get serving(): boolean {
    return this.phase === 'serving';
  }

  state(): CniServerState {
    return {
      socket: this.opts.socketPath,
      phase: this.phase,
      reason: this.reason,
      inFlight: this.pending,
      abandoned: this.abandonedCount,
      lastErrors: [...this.errors],
    };
  }

  /**
   * Prepares the directory and starts listening. Resolves with the phase reached: 'serving';
   * 'waiting' (another live server holds the socket: retried in the background until stop);
   * 'failed' (logged, with the reason in state()). Never rejects: weftd runs on without it.
   */
  async start(): Promise<CniServerPhase> {
    const log = this.opts.logger;
    try {
      await this.prepareDirectory();
      if (await this.tryListen()) return this.phase;
    } catch (e) {
      this.phase = 'failed';
      this.reason = errorMessage(e);
      log.error('CNI server not started; the CNI plugins run on their own (bundle fallback)', { error: this.reason });
      return this.phase;
    }
    this.phase = 'waiting';
    log.warn('another CNI server answers on the socket; taking it over once it stops', { socket: this.opts.socketPath });
    this.takeover = this.retryTakeover();
    return this.phase;
  }

  private async retryTakeover(): Promise<void> {
    const signal = this.stopping.signal;
    while (!signal.aborted) {
      try {
        await delay(this.opts.takeoverRetryMs ?? 2000, signal);
        if (await this.tryListen()) return;
      } catch (e) {
        if (e instanceof AbortedError) return;
        this.phase = 'failed';
        this.reason = errorMessage(e);
        this.opts.logger.error('CNI server not started; the CNI plugins run on their own (bundle fallback)', { error: this.reason });
        return;
      }
    }
  }

  /** mkdir 0700 when missing; an existing directory keeps its mode (it may be shared). */
  private async prepareDirectory(): Promise<void> {
    const dir = dirname(this.opts.socketPath);
    try {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      const st = await lstat(dir);
      if (!st.isDirectory()) throw new Error(`${dir} is not a directory`);
      if ((st.mode & 0o077) !== 0) {
        this.opts.logger.debug('CNI server socket directory is open to others; the socket\'s own mode 0600 keeps them out', { dir, mode: (st.mode & 0o777).toString(8) });
      }
    } catch (e) {
      throw new CniServerSetupError(this.opts.socketPath, errorMessage(e));
    }
  }

  /** Whether something answers on the socket path now. */
  private probe(): Promise<boolean> {
    return new Promise((resolve) => {
      const c = createConnection(this.opts.socketPath);
      const done = (live: boolean) => {
        clearTimeout(timer);
        c.destroy();
        resolve(live);
      };
      // No answer to connect(2) within a second: busy, so alive.
      const timer = setTimeout(() => done(true), 1000);
      c.once('connect', () => done(true));
      c.once('error', (e) => done(!['ECONNREFUSED', 'ENOENT', 'ENOTSOCK'].includes(errnoCode(e) ?? '')));
    });
  }

  /** Listens when the path is free or stale; false when a live server holds it. */
  private async tryListen(): Promise<boolean> {
    const path = this.opts.socketPath;
    let st;
    try {
      st = await lstat(path);
    } catch (e) {
      if (errnoCode(e) !== 'ENOENT') throw new CniServerSetupError(path, errorMessage(e));
    }
    if (st) {
      if (!st.isSocket()) throw new CniServerSetupError(path, 'exists and is not a socket; not removed (remove it, or give --cni-socket another path)');
      if (await this.probe()) return false;
      try {
        await unlink(path);
        this.opts.logger.info('removed a stale CNI server socket', { socket: path });
      } catch (e) {
        if (errnoCode(e) !== 'ENOENT') throw new CniServerSetupError(path, `cannot remove the stale socket: ${errorMessage(e)}`);
      }
    }
    this.netns = await readlink('/proc/self/ns/net').catch(() => null);
    const server = createServer({ allowHalfOpen: true }, (s) => this.onConnection(s));
    const listening = new Promise<void>((resolve, reject) => {
      server.once('listening', resolve);
      server.once('error', reject);
    });
    // bind(2) happens inside listen(): under umask 0177 the socket is born 0600.
    const umask = process.umask(0o177);
    try {
      server.listen(path);
    } finally {
      process.umask(umask);
    }
    try {
      await listening;
    } catch (e) {
      server.close();
      if (errnoCode(e) === 'EADDRINUSE') return false; // someone bound it between our checks
      throw new CniServerSetupError(path, errorMessage(e));
    }
    await chmod(path, 0o600);
    const mine = await lstat(path);
    this.bound = { dev: mine.dev, ino: mine.ino };
    server.on('error', (e) => this.opts.logger.error('CNI server socket error', { error: errorMessage(e) }));
    this.server = server;
    this.phase = 'serving';
    this.reason = null;
    this.opts.logger.info('serving CNI requests', { socket: path });
    // Load the plugins now, off the request path.
    this.executor.start();
    if (this.stopping.signal.aborted) await this.closeListener();
    return true;
  }

  // ---- connections ----

  private onConnection(sock: Socket): void {
    const t0 = performance.now();
    if (this.stopping.signal.aborted) {
      sock.destroy();
      return;
    }
    if (this.sockets.size >= (this.opts.maxConnections ?? 1024)) {
      // Too many at once: this client runs the plugin itself (its request is read and dropped).
      sock.on('error', () => {});
      this.send(sock, NOT_SERVING);
      this.opts.metrics.recordCniRequest('unknown', 'unknown', 'not_serving', (performance.now() - t0) / 1000);
      return;
    }
    this.sockets.add(sock);
    this.pending++;
    // reading the frame → serving it → answered (a reply sent, or the client gone before one).
    let phase: 'reading' | 'serving' | 'answered' = 'reading';
    let buf: Buffer = Buffer.alloc(0);
    const frameTimeoutMs = this.opts.frameTimeoutMs ?? 10_000;
    const answer = (o: Outcome, plugin: string, verb: string, containerId: string) => {
      if (phase === 'answered') return;
      phase = 'answered';
      this.send(sock, o.reply);
      this.record(o, plugin, verb, containerId, t0);
      this.done();
    };
    const refuse = (e: ProtocolError) => {
      clearTimeout(timer);
      sock.off('data', onData);
      answer({ reply: errorReply(e), result: 'invalid' }, 'unknown', 'unknown', '');
    };
    const timer = setTimeout(() => refuse(new ProtocolError(ErrorCode.DecodeFailure, `incomplete request: no full frame within ${frameTimeoutMs} ms`)), frameTimeoutMs);
    const onData = (chunk: Buffer) => {
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      const frame = readFrame(buf);
      if (frame.kind === 'incomplete') return;
      if (frame.kind === 'oversize') {
        refuse(new ProtocolError(ErrorCode.IOFailure, `request too large: ${frame.length} bytes`, `a request frame holds at most ${MAX_FRAME_BYTES} bytes`));
        return;
      }
      let req: ServerRequest;
      try {
        req = parseRequestBody(frame.body);
      } catch (e) {
        refuse(e instanceof ProtocolError ? e : new ProtocolError(ErrorCode.DecodeFailure, errorMessage(e)));
        return;
      }
      clearTimeout(timer);
      sock.off('data', onData);
      phase = 'serving';
      const plugin = label(CNI_SERVER_PLUGINS, req.plugin);
      const verb = label(CNI_VERBS, req.env.CNI_COMMAND ?? '');
      const containerId = req.env.CNI_CONTAINERID ?? '';
      this.serve(req, t0).then(
        (o) => answer(o, plugin, verb, containerId),
        (e: unknown) => answer({ reply: errorReply(new CniError(ErrorCode.Internal, `weftd CNI server: ${errorMessage(e)}`)), result: 'error' }, plugin, verb, containerId),
      );
    };
    sock.on('data', onData);
    sock.on('error', (e) => this.opts.logger.debug('CNI client connection error', { error: errorMessage(e) }));
    // The client may half-close after its request (allowHalfOpen): only an end before a full frame is an error.
    sock.on('end', () => {
      if (phase === 'reading') refuse(new ProtocolError(ErrorCode.DecodeFailure, `incomplete request: the connection ended after ${buf.length} bytes`));
    });
    sock.on('close', () => {
      this.sockets.delete(sock);
      // Gone while reading: counted as a refused request. While serving: the work goes on and is answered into the void.
      if (phase === 'reading') refuse(new ProtocolError(ErrorCode.DecodeFailure, `the connection closed after ${buf.length} bytes`));
    });
  }

  /** Writes the reply and half-closes; input that still arrives is read and dropped, for a while. */
  private send(sock: Socket, reply: Reply): void {
    let frame: Buffer;
    try {
      frame = encodeFrame(reply);
    } catch (e) {
      frame = encodeFrame(errorReply(new CniError(ErrorCode.Internal, `weftd CNI server: the reply is too large to send: ${errorMessage(e)}`)));
    }
    if (sock.destroyed) return;
    // A client still writing an oversized request can finish its write and then read the reply.
    sock.resume();
    sock.end(frame);
    const linger = setTimeout(() => sock.destroy(), 5000);
    linger.unref();
    sock.once('close', () => clearTimeout(linger));
  }

  private done(): void {
    this.pending--;
    if (this.pending === 0) this.idle?.();
  }

  private record(o: Outcome, plugin: string, verb: string, containerId: string, t0: number): void {
    const seconds = (performance.now() - t0) / 1000;
    this.opts.metrics.recordCniRequest(plugin, verb, o.result, seconds);
    const reply = o.reply;
    const status = 'status' in reply ? reply.status : null;
    this.opts.logger.debug('CNI request', { plugin, verb, containerId, result: o.result, status, durationMs: Math.round(seconds * 10_000) / 10 });
    if (status !== null && status !== 0 && 'stdout' in reply) {
      const { code, message } = errorOf(reply.stdout);
      this.errors.unshift({ time: new Date().toISOString(), plugin, verb, containerId, code, message });
      this.errors.length = Math.min(this.errors.length, LAST_ERRORS);
    }
  }

  // ---- requests ----

  private async serve(req: ServerRequest, t0: number): Promise<Outcome> {
    const plugin = req.plugin;
    if (!(CNI_SERVER_PLUGINS as readonly string[]).includes(plugin)) {
      const e = new ProtocolError(ErrorCode.InvalidEnvironment, `unknown plugin ${JSON.stringify(req.plugin)}`, `this weftd serves ${[...CNI_SERVER_PLUGINS].join(', ')}`);
      return { reply: errorReply(e), result: 'invalid' };
    }
    if (this.stopping.signal.aborted) return { reply: NOT_SERVING, result: 'not_serving' };
    // Run where the caller is, not here: the plugins would act on this namespace instead of its.
    if (req.netns !== undefined && this.netns !== null && req.netns !== this.netns) {
      this.opts.logger.debug('CNI request from another network namespace; the client runs the plugin itself', { plugin, netns: req.netns });
      return { reply: NOT_SERVING, result: 'not_serving' };
    }

    const verb = req.env.CNI_COMMAND ?? '';
    const containerId = req.env.CNI_CONTAINERID ?? '';
    const nested = req.env[NESTED_ENV] === '1';
    const env: Record<string, string> = { ...req.env, [NESTED_ENV]: '1', PATH: this.opts.pluginPath ?? process.env.PATH ?? DEFAULT_PLUGIN_PATH };
    const timeoutMs = this.opts.requestTimeoutMs ?? 60_000;
    // Aborts the request's waits (container, readiness, slot) when it is answered or weftd stops.
    // (Not AbortSignal.any: on Node 20 it keeps a reference per call on the long-lived signal.)
    const waitsCtl = new AbortController();
    const waits = waitsCtl.signal;
    const onStop = () => waitsCtl.abort();
    this.stopping.signal.addEventListener('abort', onStop, { once: true });
    let answered = false;
    let releaseLock = () => {};
    let releaseSlot = () => {};
    let started = false;

    const work = (async (): Promise<Outcome> => {
      try {
        // Serialized per container, in arrival order (the readiness wait included, so a DEL sent
        // after an ADD never overtakes it).
        if (containerId !== '' && !nested) releaseLock = await this.locks.acquire(containerId, waits);
        if (verb === 'ADD' && !nested && !(await this.waitReady(waits))) {
          const e = new CniError(ErrorCode.TryAgainLater, 'weftd is not ready: no subnet lease or subnet.env yet; try again later', `waited ${Math.round((this.opts.readyTimeoutMs ?? 30_000) / 1000)} s`);
          return { reply: errorReply(e), result: 'not_ready' };
        }
        if (!nested) releaseSlot = await this.slots.acquire(waits);
      } catch (e) {
        if (e instanceof AbortedError && this.stopping.signal.aborted && !answered) return { reply: NOT_SERVING, result: 'not_serving' };
        throw e;
      }
      started = true;
      try {
        const out = await this.executor.run(plugin, env, req.stdin);
        // The plugin is done: its slot is free for others while the hooks wait.
        releaseSlot();
        const hooks = this.opts.podHooks;
        const hookError = nested || !hooks ? null : await runPodHooks(hooks, verb, req.env, out, waits, { boundMs: this.opts.podHookTimeoutMs ?? 10_000, logger: this.opts.logger });
        if (hookError) return { reply: errorReply(hookError), result: 'error' };
        return { reply: statusReply(out.exitCode, out.stdout, out.stderr), result: out.exitCode === 0 ? 'ok' : 'error' };
      } catch (e) {
        if (!(e instanceof PluginRunError)) throw e;
        return { reply: errorReply(new CniError(ErrorCode.Internal, `weftd CNI server: ${plugin} ${verb} failed: ${e.message}`)), result: 'error' };
      }
    })();

    let timer: NodeJS.Timeout | undefined;
    const remaining = Math.max(0, t0 + timeoutMs - performance.now());
    const timedOut = new Promise<Outcome>((resolve) => {
      timer = setTimeout(() => {
        const msg = started
          ? `weftd CNI server: ${plugin} ${verb} did not finish within ${timeoutMs / 1000} s; abandoned`
          : `weftd CNI server: ${plugin} ${verb} waited ${timeoutMs / 1000} s for earlier requests of the same container or a free slot; try again later`;
        resolve({ reply: errorReply(new CniError(started ? ErrorCode.Internal : ErrorCode.TryAgainLater, msg)), result: 'timeout' });
      }, remaining);
    });
    let outcome: Outcome;
    try {
      outcome = await Promise.race([work, timedOut]);
    } catch (e) {
      outcome = { reply: errorReply(new CniError(ErrorCode.Internal, `weftd CNI server: ${errorMessage(e)}`)), result: 'error' };
    } finally {
      clearTimeout(timer);
      answered = true;
      this.stopping.signal.removeEventListener('abort', onStop);
      waitsCtl.abort();
      releaseSlot();
      releaseLock();
    }
    if (started && (outcome.result === 'timeout' || outcome.result === 'error')) this.watchAbandoned(work, plugin, verb, containerId);
    return outcome;
  }

  /** Counts a request answered before its work settled until it does. */
  private watchAbandoned(work: Promise<Outcome>, plugin: string, verb: string, containerId: string): void {
    let settled = false;
    const mark = () => (settled = true);
    work.then(mark, mark);
    // The work may have settled already (an ordinary plugin error): only count it if not.
    setImmediate(() => {
      if (settled) return;
      this.abandonedCount++;
      this.opts.logger.warn('abandoned CNI request still running', { plugin, verb, containerId });
      const end = () => {
        this.abandonedCount--;
        this.opts.logger.info('abandoned CNI request finished', { plugin, verb, containerId });
      };
      work.then(end, end);
    });
  }

  /** Whether weftd is ready, waiting up to readyTimeoutMs. Rejects with AbortedError when `signal` aborts. */
  private async waitReady(signal: AbortSignal): Promise<boolean> {
    const deadline = performance.now() + (this.opts.readyTimeoutMs ?? 30_000);
    while (!this.opts.isReady()) {
      const left = deadline - performance.now();
      if (left <= 0) return false;
      await delay(Math.min(READY_POLL_MS, left), signal);
    }
    return true;
  }

  // ---- stop ----

  private async closeListener(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = null;
    // Stops accepting at once (its callback would wait for every open connection: stop() bounds that).
    server.close();
    // Closing removes the file in Node; make sure, but never a file that is no longer ours.
    await this.removeSocketFile();
  }

  private async removeSocketFile(): Promise<void> {
    const bound = this.bound;
    if (!bound) return;
    this.bound = null;
    try {
      const st = await lstat(this.opts.socketPath);
      if (st.dev === bound.dev && st.ino === bound.ino) await unlink(this.opts.socketPath);
    } catch {
      // gone already
    }
  }

  /** Stops accepting, answers waiting requests `serving:false`, gives running ones stopGraceMs. */
  async stop(): Promise<void> {
    if (this.phase === 'stopped' || this.phase === 'off') {
      this.phase = 'stopped';
      return;
    }
    this.phase = 'stopping';
    this.stopping.abort();
    await this.takeover;
    await this.closeListener();
    if (this.pending > 0) {
      const idle = new Promise<void>((resolve) => (this.idle = resolve));
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => (timer = setTimeout(resolve, this.opts.stopGraceMs ?? 10_000)));
      await Promise.race([idle, grace]);
      clearTimeout(timer);
      if (this.pending > 0) this.opts.logger.warn('stopping with CNI requests unanswered', { requests: this.pending });
    }
    for (const s of this.sockets) s.destroy();
    await this.executor.stop();
    this.phase = 'stopped';
  }
}
