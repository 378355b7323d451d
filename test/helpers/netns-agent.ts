// A helper process in a network namespace that the test talks to in JSON lines: it prints
// {"ready":true} once it serves, and answers each request {"id":N,...} with {"id":N,...} (or
// {"id":N,"error":"..."}). The probe agent of the policy matrix and the connection agent of the
// ovs policy tests are both one of these.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { WaitAbort, waitFor } from './wait.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of live) p.kill('SIGKILL');
});

export type AgentMessage = Record<string, unknown> & { readonly id?: number; readonly ready?: boolean; readonly error?: string };

export class NetnsAgent {
  private buf = '';
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (m: AgentMessage) => void; reject: (e: Error) => void }>();
  private ready = false;
  stderr = '';

  private constructor(
    readonly netns: string,
    private readonly proc: ChildProcess,
  ) {
    live.add(proc);
    proc.stdout!.setEncoding('utf8').on('data', (d: string) => this.onData(d));
    proc.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    proc.stdin!.on('error', () => undefined);
    proc.once('exit', (code, signal) => {
      live.delete(proc);
      for (const p of this.pending.values()) p.reject(new Error(`agent in ${netns} exited (${code ?? signal}): ${this.stderr.trim()}`));
      this.pending.clear();
    });
  }

  /** Starts `script` (TypeScript, under tsx) in `netns` with `args` and waits until it says it is ready. */
  static async start(script: string, netns: string, args: readonly string[], what: string): Promise<NetnsAgent> {
    const proc = spawn('ip', ['netns', 'exec', netns, process.execPath, '--import', 'tsx', script, ...args], { cwd: REPO, stdio: ['pipe', 'pipe', 'pipe'] });
    const agent = new NetnsAgent(netns, proc);
    await waitFor(
      () => {
        if (!agent.running) throw new WaitAbort(`agent in ${netns} exited: ${agent.stderr.trim()}`);
        return agent.ready;
      },
      { timeoutMs: 30_000, what: `the ${what} in ${netns}` },
    ).catch(async (e: Error) => {
      await agent.stop();
      throw e;
    });
    return agent;
  }

  get running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** Sends `body` with a new id; resolves with the answer, rejects on its `error` or the agent's exit. */
  request(body: Record<string, unknown>): Promise<AgentMessage> {
    if (!this.running) return Promise.reject(new Error(`agent in ${this.netns} is not running: ${this.stderr.trim()}`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.proc.stdin!.write(`${JSON.stringify({ id, ...body })}\n`);
    });
  }

  /** Closes stdin (the agent exits), SIGKILL after 2 s. */
  async stop(): Promise<void> {
    if (!this.running) return;
    const exited = new Promise((resolve) => this.proc.once('exit', resolve));
    this.proc.stdin!.end();
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 2_000);
    await exited;
    clearTimeout(timer);
  }

  private onData(text: string): void {
    this.buf += text;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (!line.trim()) continue;
      const msg = JSON.parse(line) as AgentMessage;
      if (msg.ready) {
        this.ready = true;
        continue;
      }
      const p = msg.id === undefined ? undefined : this.pending.get(msg.id);
      if (!p) continue;
      this.pending.delete(msg.id!);
      if (msg.error !== undefined) p.reject(new Error(`agent in ${this.netns}: ${msg.error}`));
      else p.resolve(msg);
    }
  }
}
