// `ovs-ofctl monitor <bridge> watch:!initial` as a test sees it: every flow added, modified or
// deleted on the bridge, with its cookie. sync() makes "everything done so far has been reported"
// a condition to wait on: a marker flow is added and removed, and its events arrive after all
// earlier ones (the monitor reports in order).
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

import { waitFor } from './wait.js';

export interface FlowEvent {
  readonly event: 'ADDED' | 'MODIFIED' | 'DELETED' | 'ABBREV';
  readonly cookie: bigint;
  readonly line: string;
}

/** Cookies 0x7e57_0000_0000_xxxx: markers, never weft's (round 0x7e57 is not a flow round weft takes before 32 343 restarts, and category 0). */
const MARKER_BASE = 0x7e57_0000_0000_0000n;

export class FlowMonitor {
  private text = '';
  private markers = 0;

  private constructor(
    private readonly proc: ChildProcess,
    private readonly runDir: string,
    private readonly bridge: string,
  ) {
    // ovs-ofctl prints asynchronous messages on stderr and replies on stdout; stdbuf keeps them line-buffered.
    proc.stdout!.setEncoding('utf8').on('data', (d: string) => (this.text += d));
    proc.stderr!.setEncoding('utf8').on('data', (d: string) => (this.text += d));
  }

  /** Starts the monitor and returns once it reports (a marker proves it subscribed). */
  static async start(runDir: string, bridge: string): Promise<FlowMonitor> {
    const proc = spawn('stdbuf', ['-oL', 'ovs-ofctl', 'monitor', `unix:${join(runDir, `${bridge}.mgmt`)}`, 'watch:!initial'], {
      env: { ...process.env, OVS_RUNDIR: runDir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const m = new FlowMonitor(proc, runDir, bridge);
    try {
      await m.sync();
    } catch (e) {
      m.stop();
      throw e;
    }
    m.clear();
    return m;
  }

  /** The events so far, markers left out. */
  events(): FlowEvent[] {
    const out: FlowEvent[] = [];
    for (const line of this.text.split('\n')) {
      const m = /event=(ADDED|MODIFIED|DELETED|ABBREV)\b.*\bcookie=(0x[0-9a-f]+)/.exec(line);
      if (!m) continue;
      const cookie = BigInt(m[2]!);
      if ((cookie & ~0xffffn) === MARKER_BASE) continue;
      out.push({ event: m[1] as FlowEvent['event'], cookie, line: line.trim() });
    }
    return out;
  }

  clear(): void {
    this.text = '';
  }

  /** Adds and deletes a marker flow and waits for both events: every earlier change has then been reported. */
  async sync(): Promise<void> {
    const cookie = `0x${(MARKER_BASE + BigInt(++this.markers)).toString(16)}`;
    const mgmt = `unix:${join(this.runDir, `${this.bridge}.mgmt`)}`;
    const seen = (event: string) => this.text.split('\n').some((l) => l.includes(`event=${event}`) && l.includes(`cookie=${cookie}`));
    // Added again until reported: right after start the monitor may not have subscribed yet.
    await waitFor(
      async () => {
        if (seen('ADDED')) return true;
        await ofctl(this.runDir, ['add-flow', mgmt, `cookie=${cookie},table=250,priority=1,actions=drop`]);
        return false;
      },
      { timeoutMs: 10_000, intervalMs: 20, what: `the monitor to report marker ${cookie}` },
    ).catch((e: Error) => {
      throw new Error(`${e.message}; monitor printed ${JSON.stringify(this.text.slice(-2000))}`);
    });
    await ofctl(this.runDir, ['del-flows', mgmt, `cookie=${cookie}/-1`]);
    await waitFor(() => seen('DELETED'), { timeoutMs: 10_000, what: `the monitor to report marker ${cookie} deleted` });
  }

  stop(): void {
    this.proc.kill();
  }
}

function ofctl(runDir: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const p = spawn('ovs-ofctl', args, { env: { ...process.env, OVS_RUNDIR: runDir }, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
    p.once('error', reject);
    p.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`ovs-ofctl ${args.join(' ')}: ${code}: ${err.trim()}`))));
  });
}
