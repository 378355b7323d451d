// A private Open vSwitch per test node: ovsdb-server and ovs-vswitchd run inside the node's
// namespace with their own run/db/log dirs under `dir`, userspace (netdev) datapath, stopped by
// PID. Clients (ovs-vsctl/-ofctl/-appctl) reach them through socket paths, not `ip netns exec`.
// vswitchd needs about a second to exit, so stopping polls the PIDs instead of waiting on a fixed time.
import { execFile, spawn } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

import { IPAddr, IPNet } from '../../src/util/ip.js';
import { ipn, lines } from './netns.js';
import { WaitAbort, waitFor } from './wait.js';

const execFileP = promisify(execFile);

const SCHEMA = '/usr/share/openvswitch/vswitch.ovsschema';
const CLIENT_TIMEOUT_S = 10;
const START_TIMEOUT_MS = 20_000;
const TERM_GRACE_MS = 5_000;
const KILL_GRACE_MS = 3_000;

export interface OvsOptions {
  /** true: set other_config:flow-restore-wait=true before vswitchd starts; false: remove the key;
   *  absent: leave the OVSDB as it is (the daemon under test owns the key after a restart). */
  readonly flowRestoreWait?: boolean;
}

/** An OVS client (ovs-vsctl, ovs-ofctl, ovs-appctl, ovsdb-tool) failed. */
export class OvsCommandError extends Error {
  constructor(
    readonly command: string,
    readonly args: readonly string[],
    readonly code: number | string | null,
    readonly stderr: string,
  ) {
    super(`${command} ${args.join(' ')} failed (${code}): ${stderr.trim()}`);
    this.name = 'OvsCommandError';
  }
}

/** A daemon did not start, did not become ready, or did not stop; the log file says why. */
export class OvsDaemonError extends Error {
  constructor(
    readonly daemon: 'ovsdb-server' | 'ovs-vswitchd',
    readonly ns: string,
    readonly logFile: string,
    detail: string,
  ) {
    super(`${daemon} in ${ns}: ${detail} (log: ${logFile})`);
    this.name = 'OvsDaemonError';
  }
}

/** A process we started, identified by pid and kernel start time so a recycled pid is never signalled. */
interface Daemon {
  readonly name: 'ovsdb-server' | 'ovs-vswitchd';
  readonly pid: number;
  readonly startTime: string;
}

/** /proc/<pid>/stat fields after the command name: [0] is the state, [19] the start time. */
function procStat(pid: number): string[] | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  return text.slice(text.lastIndexOf(')') + 2).split(' ');
}

/**
 * Whether the process still runs. A zombie counts as gone: it has exited and holds no sockets,
 * files or namespace; on this machine PID 1 reaps orphans only about 1.3 s later, and waiting for
 * that would make every stop slow for nothing.
 */
export function processRunning(pid: number, startTime?: string): boolean {
  const f = procStat(pid);
  if (!f || f[0] === 'Z' || f[0] === 'X') return false;
  return startTime === undefined || f[19] === startTime;
}

const live = new Set<Daemon>();
process.once('exit', () => {
  // Last resort for a run that ended without stop(): no OVS daemon outlives the test process.
  for (const d of live) {
    if (!processRunning(d.pid, d.startTime)) continue;
    try {
      process.kill(d.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
});

async function run(cmd: string, args: readonly string[], env?: NodeJS.ProcessEnv): Promise<string> {
  try {
    const { stdout } = await execFileP(cmd, [...args], { env, timeout: (CLIENT_TIMEOUT_S + 5) * 1000, maxBuffer: 64 << 20 });
    return stdout;
  } catch (e) {
    const err = e as Error & { stderr?: string; code?: number | string };
    throw new OvsCommandError(cmd, args, err.code ?? null, err.stderr || err.message);
  }
}

async function waitGone(d: Daemon, timeoutMs: number): Promise<boolean> {
  return waitFor(() => !processRunning(d.pid, d.startTime), { timeoutMs, intervalMs: 10 }).then(
    () => true,
    () => false,
  );
}

function signal(d: Daemon, sig: NodeJS.Signals): void {
  if (!processRunning(d.pid, d.startTime)) return;
  try {
    process.kill(d.pid, sig);
  } catch {
    // exited in between
  }
}

export class OvsInstance {
  readonly runDir: string;
  readonly dbSocket: string;
  private readonly dbFile: string;
  private readonly logDir: string;
  private ovsdb: Daemon | null = null;
  private vswitchd: Daemon | null = null;

  private constructor(
    readonly ns: string,
    readonly dir: string,
  ) {
    this.runDir = join(dir, 'run');
    this.dbSocket = join(this.runDir, 'db.sock');
    this.dbFile = join(dir, 'db', 'conf.db');
    this.logDir = join(dir, 'log');
  }

  /**
   * Creates (or reuses) dir/db/conf.db, starts ovsdb-server, `init`s the database and starts
   * ovs-vswitchd, both inside `ns`. On failure whatever did start is stopped again.
   */
  static async start(ns: string, dir: string, opts: OvsOptions = {}): Promise<OvsInstance> {
    // The daemons chdir to / when they detach: every path handed to them must be absolute.
    const ovs = new OvsInstance(ns, resolve(dir));
    for (const d of ['run', 'db', 'log']) mkdirSync(join(ovs.dir, d), { recursive: true });
    try {
      if (!existsSync(ovs.dbFile)) await run('ovsdb-tool', ['create', ovs.dbFile, SCHEMA]);
      ovs.ovsdb = await ovs.spawnDaemon('ovsdb-server', [
        ovs.dbFile,
        `--remote=punix:${ovs.dbSocket}`,
      ]);
      await ovs.vsctl('--no-wait', 'init');
      await ovs.startVswitchd(opts);
    } catch (e) {
      await ovs.stop();
      throw e;
    }
    return ovs;
  }

  /** The pids of the running daemons (null when not running), for assertions. */
  get pids(): { readonly ovsdbServer: number | null; readonly vswitchd: number | null } {
    return { ovsdbServer: this.ovsdb?.pid ?? null, vswitchd: this.vswitchd?.pid ?? null };
  }

  /** The vswitchd control socket; OVS names it after the pid, so `ovs-appctl -t ovs-vswitchd` finds it via OVS_RUNDIR. */
  get vswitchdCtl(): string {
    if (!this.vswitchd) throw new OvsDaemonError('ovs-vswitchd', this.ns, this.log('ovs-vswitchd'), 'not running');
    return join(this.runDir, `ovs-vswitchd.${this.vswitchd.pid}.ctl`);
  }

  /**
   * Environment for children (the daemon under test): with OVS_RUNDIR set, plain `ovs-vsctl`
   * uses <runDir>/db.sock, `ovs-ofctl br-int` uses <runDir>/br-int.mgmt and `ovs-appctl` finds
   * vswitchd through <runDir>/ovs-vswitchd.pid.
   */
  env(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined) out[k] = v;
    out.OVS_RUNDIR = this.runDir;
    return out;
  }

  /** ovs-vsctl against this instance's database; options such as `--no-wait` go first in `args`. */
  vsctl(...args: string[]): Promise<string> {
    return run('ovs-vsctl', [`--db=unix:${this.dbSocket}`, `--timeout=${CLIENT_TIMEOUT_S}`, ...args]);
  }

  /** ovs-ofctl; a bare bridge name resolves to <runDir>/<bridge>.mgmt. */
  ofctl(...args: string[]): Promise<string> {
    return run('ovs-ofctl', args, this.env());
  }

  /** ovs-appctl to this instance's ovs-vswitchd. */
  appctl(...args: string[]): Promise<string> {
    return run('ovs-appctl', [`--timeout=${CLIENT_TIMEOUT_S}`, '-t', this.vswitchdCtl, ...args]);
  }

  /** The bridge's flows as OpenFlow 1.5 text without counters, one trimmed line each, sorted. */
  async dumpFlows(bridge: string): Promise<string[]> {
    const out = await this.ofctl('-O', 'OpenFlow15', 'dump-flows', '--no-stats', bridge);
    // --no-stats prints no "OFPST_FLOW reply" header today; drop it should a version print one.
    return lines(out)
      .filter((l) => !/^(OFPST|NXST)_FLOW reply/.test(l))
      .sort();
  }

  /** Stops ovs-vswitchd alone with SIGTERM (it exits cleanly) and waits until it is gone. */
  async killVswitchd(): Promise<void> {
    const d = this.vswitchd;
    if (!d) return;
    signal(d, 'SIGTERM');
    if (!(await waitGone(d, TERM_GRACE_MS))) {
      throw new OvsDaemonError('ovs-vswitchd', this.ns, this.log('ovs-vswitchd'), `pid ${d.pid} still runs ${TERM_GRACE_MS} ms after SIGTERM`);
    }
    live.delete(d);
    this.vswitchd = null;
  }

  /**
   * Starts ovs-vswitchd against the existing database (ports and external_ids are kept; the
   * userspace datapath and all OpenFlow flows start empty). Returns once vswitchd answers on its
   * control socket and every bridge in the database has its .mgmt socket.
   */
  async startVswitchd(opts: OvsOptions = {}): Promise<void> {
    if (this.vswitchd) throw new OvsDaemonError('ovs-vswitchd', this.ns, this.log('ovs-vswitchd'), `already running as pid ${this.vswitchd.pid}`);
    if (!this.ovsdb) throw new OvsDaemonError('ovsdb-server', this.ns, this.log('ovsdb-server'), 'not running');
    // --no-wait: nothing would answer the "wait for vswitchd to apply" handshake yet.
    if (opts.flowRestoreWait === true) {
      await this.vsctl('--no-wait', 'set', 'open_vswitch', '.', 'other_config:flow-restore-wait=true');
    } else if (opts.flowRestoreWait === false) {
      await this.vsctl('--no-wait', 'remove', 'open_vswitch', '.', 'other_config', 'flow-restore-wait');
    }
    const d = await this.spawnDaemon('ovs-vswitchd', [`unix:${this.dbSocket}`]);
    this.vswitchd = d;
    // --detach returns after the first reconfiguration (measured: the .mgmt sockets already
    // exist); the checks below confirm it and poll should a version behave otherwise.
    const log = this.log('ovs-vswitchd');
    await waitFor(
      async () => {
        if (!processRunning(d.pid, d.startTime)) throw new WaitAbort(`ovs-vswitchd pid ${d.pid} exited; see ${log}`);
        return (await this.appctl('version')).startsWith('ovs-vswitchd');
      },
      { timeoutMs: START_TIMEOUT_MS, intervalMs: 20, what: `ovs-vswitchd in ${this.ns} to answer` },
    );
    const bridges = lines(await this.vsctl('list-br'));
    await waitFor(() => bridges.every((b) => existsSync(join(this.runDir, `${b}.mgmt`))), {
      timeoutMs: START_TIMEOUT_MS,
      intervalMs: 20,
      what: `the OpenFlow sockets of ${bridges.join(', ')} in ${this.runDir}`,
    });
  }

  /**
   * Stops both daemons by pid (SIGTERM, then SIGKILL after a grace period) and returns only when
   * they are gone, so the caller may delete the namespace next. Safe to call more than once.
   */
  async stop(): Promise<void> {
    const ds = [this.vswitchd, this.ovsdb].filter((d): d is Daemon => d !== null);
    for (const d of ds) signal(d, 'SIGTERM');
    const stuck: Daemon[] = [];
    for (const d of ds) if (!(await waitGone(d, TERM_GRACE_MS))) stuck.push(d);
    for (const d of stuck) signal(d, 'SIGKILL');
    const left: Daemon[] = [];
    for (const d of stuck) if (!(await waitGone(d, KILL_GRACE_MS))) left.push(d);
    for (const d of ds) if (!left.includes(d)) live.delete(d);
    if (this.vswitchd && !left.includes(this.vswitchd)) this.vswitchd = null;
    if (this.ovsdb && !left.includes(this.ovsdb)) this.ovsdb = null;
    const first = left[0];
    if (first) throw new OvsDaemonError(first.name, this.ns, this.log(first.name), `pid ${first.pid} survived SIGKILL`);
  }

  private log(daemon: 'ovsdb-server' | 'ovs-vswitchd'): string {
    return join(this.logDir, `${daemon}.log`);
  }

  /**
   * Runs `ip netns exec <ns> <daemon> ... --detach` and returns the daemon's pid. The daemon's
   * stderr (OVS prints "opened log file" there even with -vconsole:off) goes to
   * log/<daemon>.stderr rather than a pipe, so nothing waits on a pipe a detached process holds.
   */
  private async spawnDaemon(daemon: 'ovsdb-server' | 'ovs-vswitchd', args: readonly string[]): Promise<Daemon> {
    const pidfile = join(this.runDir, `${daemon}.pid`);
    const stderrFile = join(this.logDir, `${daemon}.stderr`);
    const log = this.log(daemon);
    const full = [...args, `--pidfile=${pidfile}`, `--log-file=${log}`, '--detach', '-vconsole:off'];
    const fd = openSync(stderrFile, 'a');
    let code: number | null;
    try {
      const child = spawn('ip', ['netns', 'exec', this.ns, daemon, ...full], {
        stdio: ['ignore', fd, fd],
        // OVS_RUNDIR: <bridge>.mgmt and the pid-named .ctl sockets; the others keep OVS away from
        // the system-wide /var/{run,log,lib}/openvswitch.
        env: { ...process.env, OVS_RUNDIR: this.runDir, OVS_LOGDIR: this.logDir, OVS_DBDIR: join(this.dir, 'db') },
      });
      code = await new Promise<number | null>((res, rej) => {
        const timer = setTimeout(() => child.kill('SIGKILL'), START_TIMEOUT_MS);
        child.once('error', (e) => {
          clearTimeout(timer);
          rej(e);
        });
        child.once('exit', (c) => {
          clearTimeout(timer);
          res(c);
        });
      });
    } finally {
      closeSync(fd);
    }
    if (code !== 0) {
      const stderr = readFileSync(stderrFile, 'utf8').trim().split('\n').slice(-5).join('\n');
      throw new OvsDaemonError(daemon, this.ns, log, `exited with ${code}: ${stderr}`);
    }
    // The parent exits only after the daemon wrote its pidfile (OVS daemonize_complete).
    const pid = Number.parseInt(readFileSync(pidfile, 'utf8').trim(), 10);
    const stat = Number.isInteger(pid) ? procStat(pid) : null;
    if (!stat || stat[19] === undefined) throw new OvsDaemonError(daemon, this.ns, log, `pidfile ${pidfile} names no running process`);
    const d: Daemon = { name: daemon, pid, startTime: stat[19] };
    live.add(d);
    return d;
  }
}

/**
 * Netdev underlay: userspace tunnelling routes through an OVS bridge that carries the node IP,
 * so `nic` (already in the namespace, holding `cidr`, e.g. "10.250.0.1/24") becomes a port of the
 * netdev bridge br-phy and the address moves to br-phy. Removing the last address from `nic`
 * flushes its routes, so the default route is re-added via br-phy: through `defaultVia` when
 * given, else through the gateway of the default route that used `nic` before (if any).
 * `arp off` on nic keeps the kernel from answering ARP on a port OVS reads with AF_PACKET.
 */
export async function moveUnderlayToBrPhy(ovs: OvsInstance, nic: string, cidr: string, defaultVia?: string): Promise<void> {
  if (!/^[A-Za-z0-9_.-]{1,15}$/.test(nic)) throw new Error(`bad interface name ${JSON.stringify(nic)}`);
  const { net } = IPNet.parseWithHost(cidr);
  const fam = `-${net.family}`;
  let gateway: string | null = null;
  if (defaultVia !== undefined) {
    const gw = IPAddr.parse(defaultVia);
    if (gw.family !== net.family) throw new Error(`default gateway ${defaultVia} is not in the family of ${cidr}`);
    gateway = gw.toString();
  } else {
    // `ip -j` prints nothing at all (not "[]") on some versions when there is no match.
    const out = (await ipn(ovs.ns, '-j', fam, 'route', 'show', 'default', 'dev', nic)).trim();
    const routes = (out === '' ? [] : JSON.parse(out)) as Array<{ gateway?: string }>;
    gateway = routes.find((r) => r.gateway !== undefined)?.gateway ?? null;
  }
  await ovs.vsctl(
    '--may-exist', 'add-br', 'br-phy', '--', 'set', 'bridge', 'br-phy', 'datapath_type=netdev',
    '--', '--may-exist', 'add-port', 'br-phy', nic,
  );
  await ipn(ovs.ns, 'link', 'set', nic, 'arp', 'off', 'up');
  await ipn(ovs.ns, 'addr', 'del', cidr, 'dev', nic);
  await ipn(ovs.ns, 'addr', 'add', cidr, 'dev', 'br-phy');
  await ipn(ovs.ns, 'link', 'set', 'br-phy', 'up');
  if (gateway !== null) await ipn(ovs.ns, fam, 'route', 'replace', 'default', 'via', gateway, 'dev', 'br-phy');
}
