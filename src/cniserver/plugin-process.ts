// The CNI server's plugin work in one long-lived child process (plugin-runner.ts), so that it never
// holds weftd's event loop: each helper program a plugin runs (ip, iptables, nsenter…) is a fork(2)
// of the process that starts it, which costs in proportion to that process's memory (25 ms per
// spawn from a 300 MB process against 2.8 ms from a fresh one, measured here), and 50 concurrent
// ADDs start hundreds of them. In weftd that stalled lease events for over a second; in the child
// it stalls nothing that matters.
//
// The child is started with the server and restarted when it exits (at once, unless it died young:
// then with the next request). Requests in flight when it dies fail with a PluginRunError. While it
// has requests it is pinged every second; silent for hangMs (a plugin stuck in a synchronous loop;
// 30 s while it is still starting) it is killed, which fails the requests it held — the server
// answers those with an error and goes on.
import { extname } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

import type { InvokeOutput } from '../../cni-plugins/skel/run.js';
import type { Env } from '../../cni-plugins/skel/env.js';
import { errorMessage } from '../util/errors.js';
import { forkModule, type ChildProcess } from '../util/exec.js';
import type { Logger } from '../util/log.js';
import { PluginRunError, type PluginExecutor } from './executor.js';

/** weftd → plugin process. */
export type ToRunner =
  | { readonly t: 'run'; readonly id: number; readonly plugin: string; readonly env: Env; readonly stdin: string }
  | { readonly t: 'ping' };

/** Plugin process → weftd. */
export type FromRunner =
  | { readonly t: 'done'; readonly id: number; readonly out: InvokeOutput }
  | { readonly t: 'failed'; readonly id: number; readonly message: string }
  | { readonly t: 'pong' }
  /** Sent once at start: until then, silence is start-up, not a hang. */
  | { readonly t: 'ready' }
  | { readonly t: 'log'; readonly level: 'info' | 'warn' | 'error'; readonly msg: string; readonly fields: Record<string, unknown> };

export interface PluginProcessOptions {
  readonly logger: Logger;
  /** Silence, while requests are in flight, after which the process is killed. Default 10 s. */
  readonly hangMs?: number;
  /** Ping interval while requests are in flight. Default 1 s. */
  readonly pingMs?: number;
  /** A process that lived less than this is restarted by the next request, not at once. Default 5 s. */
  readonly youngMs?: number;
  /** The module the process runs (tests: fake plugins). Default plugin-runner-main. */
  readonly modulePath?: string;
}

interface Pending {
  readonly child: ChildProcess;
  resolve(out: InvokeOutput): void;
  reject(e: Error): void;
}

const STARTUP_MS = 30_000;

/** plugin-runner-main.js next to this file when built, .ts when run from source. */
const RUNNER_MODULE = fileURLToPath(new URL(`./plugin-runner-main${extname(fileURLToPath(import.meta.url))}`, import.meta.url));

export class PluginProcess implements PluginExecutor {
  private child: ChildProcess | null = null;
  private startedAt = 0;
  private lastHeard = 0;
  /** The current process has said it is ready. */
  private ready = false;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private watchdog: NodeJS.Timeout | null = null;
  private stopped = false;
  /** Processes started so far (the first one included). */
  starts = 0;

  constructor(private readonly opts: PluginProcessOptions) {}

  start(): void {
    if (!this.stopped && !this.child) this.spawn();
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  private spawn(): ChildProcess {
    const module = this.opts.modulePath ?? RUNNER_MODULE;
    // From source, the process needs tsx to load TypeScript.
    const child = forkModule(module, module.endsWith('.ts') ? { loader: pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href } : {});
    this.child = child;
    this.starts++;
    this.startedAt = this.lastHeard = performance.now();
    this.ready = false;
    child.on('message', (m: FromRunner) => this.onMessage(child, m));
    child.on('exit', (code, signal) => this.onExit(child, signal ?? `status ${code}`));
    // A fork that failed (no 'exit' follows) or a send to a process that is gone.
    child.on('error', (e) => {
      this.opts.logger.error('CNI plugin process error', { error: errorMessage(e) });
      if (child.pid === undefined) this.onExit(child, errorMessage(e));
    });
    this.watchdog ??= setInterval(() => this.check(), this.opts.pingMs ?? 1000).unref();
    return child;
  }

  run(plugin: string, env: Env, stdin: string): Promise<InvokeOutput> {
    if (this.stopped) return Promise.reject(new PluginRunError('the plugin process is stopping'));
    const child = this.child ?? this.spawn();
    const id = this.nextId++;
    return new Promise<InvokeOutput>((resolve, reject) => {
      this.pending.set(id, { child, resolve, reject });
      this.send(child, { t: 'run', id, plugin, env, stdin });
    });
  }

  private send(child: ChildProcess, m: ToRunner): void {
    if (!child.connected) return; // gone: its 'exit' fails what it held
    child.send(m, (e) => {
      if (e) this.opts.logger.debug('could not send to the CNI plugin process', { error: errorMessage(e) });
    });
  }

  private onMessage(child: ChildProcess, m: FromRunner): void {
    if (child !== this.child) return;
    this.lastHeard = performance.now();
    switch (m.t) {
      case 'done':
      case 'failed': {
        const p = this.pending.get(m.id);
        if (!p) return;
        this.pending.delete(m.id);
        if (m.t === 'done') p.resolve(m.out);
        else p.reject(new PluginRunError(m.message));
        return;
      }
      case 'ready':
        this.ready = true;
        return;
      case 'pong':
        return;
      case 'log':
        this.opts.logger[m.level](m.msg, { ...m.fields, pid: child.pid });
        return;
    }
  }

  private onExit(child: ChildProcess, how: string): void {
    if (child === this.child) this.child = null;
    let failed = 0;
    for (const [id, p] of this.pending) {
      if (p.child !== child) continue;
      this.pending.delete(id);
      failed++;
      p.reject(new PluginRunError(`the CNI plugin process ended (${how}) while running this request`));
    }
    if (this.stopped) return;
    const young = performance.now() - this.startedAt < (this.opts.youngMs ?? 5000);
    this.opts.logger.warn('CNI plugin process ended', { how, pid: child.pid, requestsFailed: failed, restart: young ? 'with the next request' : 'now' });
    if (!young && !this.child) this.spawn();
  }

  /** Pings the process while it has requests; kills it when it has been silent for hangMs. */
  private check(): void {
    const child = this.child;
    const now = performance.now();
    if (!child || this.pending.size === 0) {
      this.lastHeard = now;
      return;
    }
    // Starting (loading Node.js and the plugins) may take a while on a busy node.
    const hangMs = this.ready ? (this.opts.hangMs ?? 10_000) : Math.max(STARTUP_MS, this.opts.hangMs ?? 0);
    if (now - this.lastHeard > hangMs) {
      this.opts.logger.error('CNI plugin process unresponsive; killing it (its requests fail, the next one starts a new process)', {
        pid: child.pid,
        silentMs: Math.round(now - this.lastHeard),
        requests: this.pending.size,
      });
      child.kill('SIGKILL');
      return;
    }
    this.send(child, { t: 'ping' });
  }

  /** Closes the channel (the process exits on it), killing it if it has not gone within 2 s. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.watchdog) clearInterval(this.watchdog);
    this.watchdog = null;
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once('exit', () => resolve());
    });
    if (child.connected) child.disconnect();
    const timer = setTimeout(() => child.kill('SIGKILL'), 2000);
    await exited;
    clearTimeout(timer);
    this.child = null;
  }
}
