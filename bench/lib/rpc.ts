// Request/response over Node's IPC channel (a helper process) or a worker thread's port: the
// bench drives helpers that run inside a namespace, and helpers drive their threads.
import type { ChildProcess } from 'node:child_process';
import { Worker, type MessagePort } from 'node:worker_threads';

import { BenchError } from './common.js';

/** op name → request and response types. */
export type OpsShape = Record<string, { req: unknown; res: unknown }>;
export type Handlers<Ops extends OpsShape> = { [K in keyof Ops]: (req: Ops[K]['req']) => Promise<Ops[K]['res']> };

interface RequestMsg {
  readonly id: number;
  readonly op: string;
  readonly req: unknown;
}
interface ReplyMsg {
  readonly id: number;
  readonly ok: boolean;
  readonly res?: unknown;
  readonly error?: string;
}

/** What both a child process (IPC) and a worker thread offer. */
interface Endpoint {
  post(msg: unknown): void;
  onMessage(fn: (msg: unknown) => void): void;
  onExit(fn: (why: string) => void): void;
}

function processEndpoint(proc: ChildProcess): Endpoint {
  return {
    post: (m) => proc.send(m as object),
    onMessage: (fn) => proc.on('message', fn),
    onExit: (fn) => proc.once('exit', (code, signal) => fn(`exited (${code ?? signal})`)),
  };
}

function workerEndpoint(w: Worker): Endpoint {
  return {
    post: (m) => w.postMessage(m),
    onMessage: (fn) => w.on('message', fn),
    onExit: (fn) => {
      w.once('error', (e) => fn(`failed: ${e.message}`));
      w.once('exit', (code) => fn(`exited (${code})`));
    },
  };
}

export class RpcClient<Ops extends OpsShape> {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; op: string }>();
  private gone: string | null = null;

  constructor(
    private readonly name: string,
    private readonly ep: Endpoint,
  ) {
    ep.onMessage((raw) => {
      const m = raw as ReplyMsg;
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.ok) p.resolve(m.res);
      else p.reject(new BenchError(`${name} ${p.op}: ${m.error ?? 'failed'}`));
    });
    ep.onExit((why) => {
      this.gone ??= why;
      for (const p of this.pending.values()) p.reject(new BenchError(`${name} ${why} during ${p.op}`));
      this.pending.clear();
    });
  }

  static forProcess<O extends OpsShape>(name: string, proc: ChildProcess): RpcClient<O> {
    return new RpcClient<O>(name, processEndpoint(proc));
  }

  static forWorker<O extends OpsShape>(name: string, w: Worker): RpcClient<O> {
    return new RpcClient<O>(name, workerEndpoint(w));
  }

  call<K extends keyof Ops & string>(op: K, req: Ops[K]['req']): Promise<Ops[K]['res']> {
    if (this.gone) return Promise.reject(new BenchError(`${this.name} ${this.gone}`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v), reject, op });
      this.ep.post({ id, op, req } satisfies RequestMsg);
    });
  }
}

/** Answers requests arriving on `port` (a worker's parentPort) or on the process IPC channel. */
export function serve<Ops extends OpsShape>(handlers: Handlers<Ops>, port?: MessagePort | null): void {
  const reply = (m: ReplyMsg) => (port ? port.postMessage(m) : process.send?.(m));
  const onMessage = (raw: unknown) => {
    const m = raw as RequestMsg;
    const handler = handlers[m.op];
    if (!handler) {
      reply({ id: m.id, ok: false, error: `unknown op ${m.op}` });
      return;
    }
    handler(m.req).then(
      (res) => reply({ id: m.id, ok: true, res }),
      (e: unknown) => reply({ id: m.id, ok: false, error: e instanceof Error ? e.message : String(e) }),
    );
  };
  if (port) port.on('message', onMessage);
  else process.on('message', onMessage);
}

/**
 * A worker thread running a TypeScript module: workers do not inherit tsx's loader from
 * `--import tsx`, so the thread registers it before importing the module.
 */
export function startTsWorker(moduleUrl: URL, workerData?: unknown): Worker {
  const tsx = import.meta.resolve('tsx/esm/api');
  const code = `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(moduleUrl.href)}); })`;
  return new Worker(code, { eval: true, workerData });
}
