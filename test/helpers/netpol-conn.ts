// The test side of netpol-conn-agent.ts: an agent per pod that serves TCP echo, opens new
// connections (probes) and holds connections open to send data through later — what
// test/integration/netpol-ovs.test.ts needs to tell an established connection from a new one.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { WaitAbort, waitFor } from './wait.js';

const AGENT = fileURLToPath(new URL('./netpol-conn-agent.ts', import.meta.url));
const REPO = fileURLToPath(new URL('../..', import.meta.url));

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of live) p.kill('SIGKILL');
});

export interface ConnAnswer {
  readonly ok: boolean;
  readonly detail: string;
  readonly conn?: number;
}

export class ConnAgent {
  private buf = '';
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (a: ConnAnswer) => void; reject: (e: Error) => void }>();
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

  /** Starts the agent in `netns` (echo servers on `ports`) and waits until they listen. */
  static async start(netns: string, ports: readonly number[]): Promise<ConnAgent> {
    const proc = spawn('ip', ['netns', 'exec', netns, process.execPath, '--import', 'tsx', AGENT, ...ports.map(String)], { cwd: REPO, stdio: ['pipe', 'pipe', 'pipe'] });
    const agent = new ConnAgent(netns, proc);
    await waitFor(
      () => {
        if (!agent.running) throw new WaitAbort(`agent in ${netns} exited: ${agent.stderr.trim()}`);
        return agent.ready;
      },
      { timeoutMs: 30_000, what: `the connection agent in ${netns}` },
    ).catch(async (e: Error) => {
      await agent.stop();
      throw e;
    });
    return agent;
  }

  get running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  private onData(text: string): void {
    this.buf += text;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (!line.trim()) continue;
      const msg = JSON.parse(line) as { ready?: boolean; id?: number; ok?: boolean; detail?: string; conn?: number; error?: string };
      if (msg.ready) {
        this.ready = true;
        continue;
      }
      const p = msg.id === undefined ? undefined : this.pending.get(msg.id);
      if (!p) continue;
      this.pending.delete(msg.id!);
      if (msg.error !== undefined || msg.ok === undefined) p.reject(new Error(`agent in ${this.netns}: ${msg.error ?? 'no answer'}`));
      else p.resolve({ ok: msg.ok, detail: msg.detail ?? '', ...(msg.conn !== undefined ? { conn: msg.conn } : {}) });
    }
  }

  private command(cmd: Record<string, unknown>): Promise<ConnAnswer> {
    if (!this.running) return Promise.reject(new Error(`agent in ${this.netns} is not running: ${this.stderr.trim()}`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.proc.stdin!.write(`${JSON.stringify({ id, ...cmd })}\n`);
    });
  }

  /** A new connection to ip:port (closed once connected): allowed or not. */
  probe(ip: string, port: number, timeoutMs = 500): Promise<ConnAnswer> {
    return this.command({ op: 'probe', ip, port, timeoutMs });
  }

  /** A connection to ip:port that stays open; its number for send(). */
  async open(ip: string, port: number, timeoutMs = 2_000): Promise<number> {
    const a = await this.command({ op: 'open', ip, port, timeoutMs });
    if (!a.ok || a.conn === undefined) throw new Error(`${this.netns}: cannot open a connection to ${ip}:${port}: ${a.detail}`);
    return a.conn;
  }

  /** A line through held connection `conn`, echoed back within the timeout or not. */
  send(conn: number, timeoutMs = 2_000): Promise<ConnAnswer> {
    return this.command({ op: 'send', conn, timeoutMs });
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
}
