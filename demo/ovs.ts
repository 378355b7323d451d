// Open vSwitch for `--backend ovs`: per node a private ovsdb-server and ovs-vswitchd inside the
// node's namespace (userspace `netdev` datapath: this kernel has no openvswitch module), with
// their database, sockets and logs under <node dir>/ovs so nothing touches the machine's own
// /var/run/openvswitch. They run in the foreground through spawnInNs like the demo's other
// daemons and are recorded with recordDaemon, so removeDemo (end of the demo, a failure, Ctrl-C,
// `--clean`) stops them by PID, after the weftd that uses them.
//
// Userspace tunnelling routes VXLAN through an OVS bridge that holds the node's address, so the
// node's eth0 becomes a port of br-phy and its address (and default route) move to br-phy; weftd
// then runs with `--iface br-phy` and OVS_RUNDIR pointing at the node's run dir.
import { existsSync } from 'node:fs';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { waitFor, WaitAbort } from '../test/helpers/wait.js';
import { alive, ipn, nsRun, recordDaemon, run, spawnInNs } from './sys.js';
import { UNDERLAY_GW, UNDERLAY_NS, type Node } from './topology.js';

export const OVS_SCHEMA = '/usr/share/openvswitch/vswitch.ovsschema';
/** What `--backend ovs` needs on top of the demo's other programs. */
export const OVS_PROGRAMS = ['ovsdb-tool', 'ovsdb-server', 'ovs-vswitchd', 'ovs-vsctl', 'ovs-ofctl', 'ovs-appctl', 'ethtool'];
/** The netdev bridge that carries the node's underlay address (weftd's --iface). */
export const UNDERLAY_BRIDGE = 'br-phy';
/** The network config's backend for the demo: userspace datapath. */
export const OVS_BACKEND = { Type: 'ovs', DatapathType: 'netdev' } as const;

const START_TIMEOUT_MS = 15_000;
const CLIENT_TIMEOUT_S = 10;

type Daemon = 'ovsdb-server' | 'ovs-vswitchd';

/** A daemon that did not come up; the last lines of its log say why. */
export class OvsStartError extends Error {
  constructor(
    readonly node: string,
    readonly daemon: Daemon,
    readonly logFile: string,
    detail: string,
  ) {
    super(`${daemon} on ${node}: ${detail} (log: ${logFile})`);
    this.name = 'OvsStartError';
  }
}

/** Where a node's Open vSwitch keeps its files. */
export interface OvsPaths {
  readonly dir: string;
  /** db.sock, <bridge>.mgmt, the pidfiles and vswitchd's pid-named control socket. */
  readonly runDir: string;
  readonly dbFile: string;
  readonly dbSocket: string;
  readonly logDir: string;
}

export function ovsPaths(node: Node): OvsPaths {
  const dir = join(node.dir, 'ovs');
  const runDir = join(dir, 'run');
  return { dir, runDir, dbFile: join(dir, 'db', 'conf.db'), dbSocket: join(runDir, 'db.sock'), logDir: join(dir, 'log') };
}

export interface NodeOvs {
  readonly node: Node;
  readonly paths: OvsPaths;
  readonly ovsdbServer: number;
  readonly vswitchd: number;
}

/** OVS_RUNDIR (sockets, pidfiles) and the log and db dirs, away from the system-wide ones. */
export function ovsEnv(p: OvsPaths): NodeJS.ProcessEnv {
  return { OVS_RUNDIR: p.runDir, OVS_LOGDIR: p.logDir, OVS_DBDIR: join(p.dir, 'db') };
}

/** ovs-vsctl against the node's database (the client needs no `ip netns exec`: it uses the socket path). */
export function vsctl(p: OvsPaths, ...args: string[]): Promise<string> {
  return run('ovs-vsctl', [`--db=unix:${p.dbSocket}`, `--timeout=${CLIENT_TIMEOUT_S}`, ...args], {
    timeoutMs: (CLIENT_TIMEOUT_S + 5) * 1000,
  });
}

async function tail(file: string, n = 6): Promise<string> {
  const text = await readFile(file, 'utf8').catch(() => '');
  return text.trimEnd().split('\n').slice(-n).join('\n') || 'no output';
}

/** Starts one daemon in the foreground inside the node's namespace, records it, waits until `ready`. */
async function startDaemon(node: Node, p: OvsPaths, daemon: Daemon, args: readonly string[], ready: (pid: number) => Promise<boolean>): Promise<number> {
  const log = join(p.logDir, `${daemon}.log`);
  // OVS prints a line or two to stderr even with -vconsole:off; they land beside its log.
  const out = join(p.logDir, `${daemon}.out`);
  const pid = spawnInNs(
    node.ns,
    [daemon, ...args, `--pidfile=${join(p.runDir, `${daemon}.pid`)}`, `--log-file=${log}`, '-vconsole:off'],
    out,
    ovsEnv(p),
  );
  recordDaemon(pid, `${daemon}@${node.name}`);
  await waitFor(
    async () => {
      if (!alive(pid)) throw new WaitAbort(`pid ${pid} exited: ${await tail(out)}\n${await tail(log)}`);
      return ready(pid);
    },
    { timeoutMs: START_TIMEOUT_MS, intervalMs: 50, what: `${daemon} on ${node.name} to answer` },
  ).catch(async (e: Error) => {
    throw new OvsStartError(node.name, daemon, log, e instanceof WaitAbort ? e.message : `${e.message}; last lines of its log:\n${await tail(log)}`);
  });
  return pid;
}

/** ovsdb-server with a fresh database, `init`ed, then ovs-vswitchd answering on its control socket. */
export async function startOvs(node: Node): Promise<NodeOvs> {
  const p = ovsPaths(node);
  for (const d of [p.runDir, join(p.dir, 'db'), p.logDir]) await mkdir(d, { recursive: true });
  await run('ovsdb-tool', ['create', p.dbFile, OVS_SCHEMA]);
  const ovsdbServer = await startDaemon(node, p, 'ovsdb-server', [p.dbFile, `--remote=punix:${p.dbSocket}`], () =>
    existsSync(p.dbSocket) ? vsctl(p, '--no-wait', 'init').then(() => true) : Promise.resolve(false),
  );
  // `ovs-appctl -t ovs-vswitchd` (weftd uses it) finds the pid-named control socket through the pidfile.
  const vswitchd = await startDaemon(node, p, 'ovs-vswitchd', [`unix:${p.dbSocket}`], async (pid) => {
    const ctl = join(p.runDir, `ovs-vswitchd.${pid}.ctl`);
    if (!existsSync(ctl)) return false;
    const v = await run('ovs-appctl', [`--timeout=${CLIENT_TIMEOUT_S}`, '-t', ctl, 'version'], { timeoutMs: (CLIENT_TIMEOUT_S + 5) * 1000 });
    return v.startsWith('ovs-vswitchd');
  });
  return { node, paths: p, ovsdbServer, vswitchd };
}

/**
 * eth0 becomes a port of the netdev bridge br-phy and the node's address moves to br-phy (taking
 * the LAN route with it; the default route is put back via br-phy). `arp off` on eth0: OVS reads
 * it with AF_PACKET, and the kernel must not answer ARP there too. On the underlay end of the
 * node's veth TX checksum offload goes off: AF_PACKET hands checksum-offloaded (partial) packets
 * to OVS, whose userspace datapath forwards them unfixed, and TCP to the node would fail.
 */
export async function moveUnderlayToBrPhy(o: NodeOvs): Promise<void> {
  const { node, paths: p } = o;
  const cidr = `${node.ip}/24`;
  await vsctl(
    p,
    '--may-exist', 'add-br', UNDERLAY_BRIDGE, '--', 'set', 'bridge', UNDERLAY_BRIDGE, 'datapath_type=netdev',
    '--', '--may-exist', 'add-port', UNDERLAY_BRIDGE, 'eth0',
  );
  await ipn(node.ns, 'link', 'set', 'eth0', 'arp', 'off', 'up');
  await ipn(node.ns, 'addr', 'del', cidr, 'dev', 'eth0');
  await ipn(node.ns, 'addr', 'add', cidr, 'dev', UNDERLAY_BRIDGE);
  await ipn(node.ns, 'link', 'set', UNDERLAY_BRIDGE, 'up');
  await ipn(node.ns, 'route', 'replace', 'default', 'via', UNDERLAY_GW, 'dev', UNDERLAY_BRIDGE);
  // The underlay end of node n's veth is named after the node (topology.ts).
  await nsRun(UNDERLAY_NS, 'ethtool', ['-K', node.name, 'tx', 'off']);
}

/** "ovs-vswitchd (Open vSwitch) 3.1.0" */
export async function ovsVersion(): Promise<string> {
  return ((await run('ovs-vswitchd', ['--version'])).split('\n')[0] ?? '').trim();
}
