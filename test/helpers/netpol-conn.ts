// The test side of netpol-conn-agent.ts: an agent per pod that serves TCP echo, opens new
// connections (probes) and holds connections open to send data through later — what
// test/integration/netpol-ovs.test.ts needs to tell an established connection from a new one.
import { fileURLToPath } from 'node:url';

import { NetnsAgent } from './netns-agent.js';

const AGENT = fileURLToPath(new URL('./netpol-conn-agent.ts', import.meta.url));

export interface ConnAnswer {
  readonly ok: boolean;
  readonly detail: string;
  readonly conn?: number;
}

export class ConnAgent {
  private constructor(private readonly agent: NetnsAgent) {}

  /** Starts the agent in `netns` (echo servers on `ports`) and waits until they listen. */
  static async start(netns: string, ports: readonly number[]): Promise<ConnAgent> {
    return new ConnAgent(await NetnsAgent.start(AGENT, netns, ports.map(String), 'connection agent'));
  }

  get netns(): string {
    return this.agent.netns;
  }

  get running(): boolean {
    return this.agent.running;
  }

  private async command(cmd: Record<string, unknown>): Promise<ConnAnswer> {
    const msg = await this.agent.request(cmd);
    if (typeof msg['ok'] !== 'boolean') throw new Error(`agent in ${this.netns}: no answer`);
    return { ok: msg['ok'], detail: typeof msg['detail'] === 'string' ? msg['detail'] : '', ...(typeof msg['conn'] === 'number' ? { conn: msg['conn'] } : {}) };
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
  stop(): Promise<void> {
    return this.agent.stop();
  }
}
