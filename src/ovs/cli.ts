// Open vSwitch through its own command-line tools (no npm OVSDB or OpenFlow library exists): one
// process per call, argument arrays, flows passed on stdin. Every call names the socket it used,
// so "OVS is not running" reads as such instead of as a bare exit status.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { renderCookieMatch } from '../render/ofctl.js';
import { CommandError, runCommand } from '../util/exec.js';

/** Where Open vSwitch keeps db.sock and <bridge>.mgmt; OVS's own OVS_RUNDIR convention. */
export const DEFAULT_OVS_RUNDIR = '/var/run/openvswitch';

export class OvsError extends Error {
  constructor(
    readonly socket: string,
    readonly tool: string,
    reason: string,
  ) {
    super(`${tool} via ${socket}: ${reason}`);
    this.name = 'OvsError';
  }
}

export class OvsUnreachableError extends OvsError {
  constructor(socket: string, tool: string, reason: string) {
    super(socket, tool, `Open vSwitch is not reachable (is ${tool === 'ovs-vsctl' ? 'ovsdb-server' : 'ovs-vswitchd'} running with its socket at ${socket}?): ${reason}`);
    this.name = 'OvsUnreachableError';
  }
}

/** Every ovs-ofctl call: OpenFlow 1.5 text, ports by number. */
const OFCTL_BASE = ['-O', 'OpenFlow15', '--no-names'] as const;

const UNREACHABLE = /(database connection failed|failed to connect to socket|No such file or directory|Connection refused|not a bridge or a socket|timeout|time out)/i;

function oneLine(text: string): string {
  return text.trim().replace(/\s*\n\s*/g, '; ');
}

export interface OvsClientOptions {
  /** Directory with db.sock and the bridges' .mgmt sockets (default OVS_RUNDIR or /var/run/openvswitch). */
  readonly runDir?: string;
  /** Seconds an ovs-vsctl call may wait for the database or for ovs-vswitchd (default 10). */
  readonly timeoutSeconds?: number;
}

export class OvsClient {
  readonly runDir: string;
  readonly dbSocket: string;
  private readonly timeout: number;
  private readonly env: NodeJS.ProcessEnv;

  constructor(opts: OvsClientOptions = {}) {
    this.runDir = opts.runDir ?? process.env.OVS_RUNDIR ?? DEFAULT_OVS_RUNDIR;
    this.dbSocket = join(this.runDir, 'db.sock');
    this.timeout = opts.timeoutSeconds ?? 10;
    // ovs-appctl finds ovs-vswitchd's control socket through OVS_RUNDIR.
    this.env = { ...process.env, OVS_RUNDIR: this.runDir };
  }

  mgmtSocket(bridge: string): string {
    return join(this.runDir, `${bridge}.mgmt`);
  }

  /** ovs-vsctl against our database; `args` may chain commands with '--'. */
  vsctl(args: readonly string[]): Promise<string> {
    return this.run('ovs-vsctl', [`--db=unix:${this.dbSocket}`, `--timeout=${this.timeout}`, ...args], this.dbSocket);
  }

  /**
   * ovs-ofctl on a bridge's management socket, OpenFlow 1.5 text (the form dump-flows prints back).
   * `--no-names`: weft writes and reads ports by number only; without it every call first fetches
   * the whole port table (OFPST_PORT_DESC) to resolve names, which costs ovs-vswitchd a query per
   * port — the one part of a pod's or a peer's flow change that grew with the pods on the bridge.
   */
  ofctl(command: string, bridge: string, args: readonly string[] = [], stdin?: string, options: readonly string[] = []): Promise<string> {
    const socket = this.mgmtSocket(bridge);
    return this.run('ovs-ofctl', [...OFCTL_BASE, ...options, command, `unix:${socket}`, ...args], socket, stdin);
  }

  /** Atomically makes the bridge's flow table equal to `flows` (one flow per line), sending only the difference. */
  replaceFlows(bridge: string, flows: string): Promise<string> {
    return withFlowFile(flows, (file) => this.ofctl('replace-flows', bridge, [file], undefined, ['--bundle']));
  }

  /** Adds (or overwrites same-match) flows in one atomic bundle; removes nothing. */
  addFlows(bridge: string, flows: string): Promise<string> {
    return withFlowFile(flows, (file) => this.ofctl('add-flows', bridge, [file], undefined, ['--bundle']));
  }

  /**
   * Applies flow mods (`add <flow>` / `delete <selector>` lines) in order, in one atomic bundle:
   * all of them or, when ovs-vswitchd refuses one, none. Small, so passed on stdin (`-`).
   */
  bundleFlowMods(bridge: string, mods: string): Promise<string> {
    return this.ofctl('add-flows', bridge, ['-'], mods, ['--bundle']);
  }

  /** Deletes the flows whose cookie matches `cookie` under `mask`, in every table. */
  delFlowsByCookie(bridge: string, cookie: bigint, mask: bigint): Promise<string> {
    return this.ofctl('del-flows', bridge, [renderCookieMatch(cookie, mask)]);
  }

  /**
   * The difference between the bridge and `flows`: lines starting with '-' are on the bridge only
   * (or differ), '+' in `flows` only. Empty when equal (OpenFlow 1.5 text compares exactly).
   */
  diffFlows(bridge: string, flows: string): Promise<string[]> {
    const socket = this.mgmtSocket(bridge);
    return withFlowFile(flows, async (file) => {
      try {
        await runCommand('ovs-ofctl', [...OFCTL_BASE, 'diff-flows', `unix:${socket}`, file], { env: this.env, timeoutMs: (this.timeout + 5) * 1000 });
        return [];
      } catch (e) {
        // diff-flows exits 2 when the two sides differ; the difference is on stdout.
        if (e instanceof CommandError && e.exitCode === 2 && e.stdout !== undefined) {
          return e.stdout.split('\n').filter((l) => l.startsWith('-') || l.startsWith('+'));
        }
        throw this.wrap(e, 'ovs-ofctl', socket);
      }
    });
  }

  /** `ovs-ofctl dump-flows --no-stats` lines (header dropped), optionally filtered; with packet counts when `stats`. */
  async dumpFlows(bridge: string, filter?: string, stats = false): Promise<string[]> {
    const out = await this.ofctl('dump-flows', bridge, [...(stats ? [] : ['--no-stats']), ...(filter ? [filter] : [])]);
    return out
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l.length > 0 && !l.startsWith('NXST_FLOW') && !l.startsWith('OFPST_FLOW'));
  }

  /**
   * One ovs-appctl command over ovs-vswitchd's control socket (`ovs-vswitchd.<pid>.ctl`, JSON-RPC),
   * without starting a process: what the policy path runs after each write, where a process start
   * (~14 ms here) would be most of the cost. `method` and `params` are weft's own constants.
   */
  async unixctl(method: string, params: readonly string[] = []): Promise<string> {
    const pidFile = join(this.runDir, 'ovs-vswitchd.pid');
    let pid: string;
    try {
      pid = (await readFile(pidFile, 'utf8')).trim();
    } catch (e) {
      throw new OvsUnreachableError(pidFile, 'ovs-appctl', String((e as Error).message));
    }
    if (!/^[1-9][0-9]{0,9}$/.test(pid)) throw new OvsError(pidFile, 'ovs-appctl', `the pid file holds ${JSON.stringify(pid.slice(0, 20))}, not a pid`);
    const socket = join(this.runDir, `ovs-vswitchd.${pid}.ctl`);
    return new Promise<string>((resolve, reject) => {
      let text = '';
      let settled = false;
      const conn = createConnection(socket);
      const finish = (err: Error | null, result = '') => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        conn.destroy();
        if (err) reject(err);
        else resolve(result);
      };
      const timer = setTimeout(() => finish(new OvsUnreachableError(socket, 'ovs-appctl', `no answer to ${method} within ${this.timeout} s`)), this.timeout * 1000);
      conn.on('connect', () => conn.write(JSON.stringify({ method, params, id: 0 })));
      conn.on('data', (d: Buffer) => {
        text += d.toString('utf8');
        let reply: { result?: unknown; error?: unknown };
        try {
          reply = JSON.parse(text) as { result?: unknown; error?: unknown };
        } catch {
          return; // not all of it yet: the reply is one JSON object
        }
        if (reply.error !== null && reply.error !== undefined) finish(new OvsError(socket, 'ovs-appctl', `${method}: ${oneLine(typeof reply.error === "string" ? reply.error : JSON.stringify(reply.error))}`));
        else finish(null, typeof reply.result === 'string' ? reply.result : '');
      });
      conn.on('error', (e) => finish(new OvsUnreachableError(socket, 'ovs-appctl', e.message)));
      conn.on('close', () => finish(new OvsUnreachableError(socket, 'ovs-appctl', `closed before answering ${method}`)));
    });
  }

  appctl(args: readonly string[]): Promise<string> {
    return this.run('ovs-appctl', ['-t', 'ovs-vswitchd', ...args], join(this.runDir, 'ovs-vswitchd.pid'));
  }

  private async run(tool: string, args: readonly string[], socket: string, stdin?: string): Promise<string> {
    try {
      return await runCommand(tool, args, {
        env: this.env,
        timeoutMs: (this.timeout + 5) * 1000,
        ...(stdin !== undefined ? { input: stdin } : {}),
      });
    } catch (e) {
      throw this.wrap(e, tool, socket);
    }
  }

  private wrap(e: unknown, tool: string, socket: string): Error {
    if (!(e instanceof CommandError)) return e as Error;
    if (e.notFound) return new OvsError(socket, tool, `${tool} is not installed (Debian: apt-get install openvswitch-switch)`);
    // Judge reachability from what the tool said, not from our own command line (--timeout=10).
    const said = oneLine(e.stderr);
    const why = said || e.message;
    return UNREACHABLE.test(said) ? new OvsUnreachableError(socket, tool, why) : new OvsError(socket, tool, why);
  }
}

/**
 * ovs-ofctl reads flows from a file name only, and Node's child stdin is a socket, which
 * /dev/stdin cannot open: the flows go through a private temporary file.
 */
async function withFlowFile<T>(flows: string, fn: (file: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'weft-flows-'));
  try {
    const file = join(dir, 'flows.txt');
    await writeFile(file, flows, { mode: 0o600 });
    return await fn(file);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
