// `make demo`: weft doing its job on one machine. Three nodes as network namespaces on an underlay
// with a real etcd, one weftd per node (--ip-masq, its CNI server on <node dir>/run/cni.sock), our
// CNI plugins run the way a runtime runs a conflist to attach two pods per node (the native client
// with WEFT_CNI_SOCKET = that node's socket), then the proof: the lease table, every subnet.env, the
// CNI server's request counters (every ADD served by the node's weftd, none by the client's
// fallback), a pod-to-pod reachability grid, a hostPort reached from another node and a pod reaching
// an "internet" namespace through masquerade. Everything lives in `weftdemo-*` namespaces and under
// /run/weft-demo, and is removed at the end (also on failure and Ctrl-C) unless --keep.
//
// With `--backend ovs` every node also runs its own Open vSwitch (userspace datapath, started and
// stopped by the demo, see ovs.ts), its eth0 on the OVS bridge br-phy, and the pods join br-int
// through weft-ovs (flannel delegates to it when subnet.env says WEFT_BACKEND=ovs).
//
//   node --import=tsx demo/demo.ts [--backend vxlan|host-gw|ovs] [--keep] [--cni-source DIR]
//   node --import=tsx demo/demo.ts --clean        removes a demo kept with --keep
//
// Exit status: 0 when every check passed, 1 when a step or check failed (the step and the reason
// are printed), 2 for bad arguments, 130/143 when interrupted.
import { accessSync, constants, existsSync } from 'node:fs';
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { CNI_PLUGIN_NAMES, isScript } from '../src/cli/install-cni.js';
import { waitFor, WaitAbort } from '../test/helpers/wait.js';
import { cniRequests, connect, failedPairs, FAIL, OK, reachability, readiness, renderMatrix, startServer } from './checks.js';
import { moveUnderlayToBrPhy, OVS_BACKEND, OVS_PROGRAMS, OVS_SCHEMA, ovsEnv, ovsPaths, ovsVersion, startOvs, UNDERLAY_BRIDGE } from './ovs.js';
import { addPod, writeConflist, type Attached, type Pod } from './runtime.js';
import {
  addNetns,
  alive,
  type RemoveReport,
  childPath,
  demoNamespaces,
  nsRun,
  refuseNewProcesses,
  removeDemo,
  run,
  spawnInNs,
  STATE_DIR,
  NS_PREFIX,
} from './sys.js';
import {
  buildNode,
  buildUnderlay,
  ETCD_ENDPOINT,
  INTERNET_IP,
  INTERNET_NS,
  NETWORK,
  nodes,
  UNDERLAY_GW,
  UNDERLAY_NS,
  type Node,
} from './topology.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const WEFTD = join(ROOT, 'bin', 'weftd');
const WEFT = join(ROOT, 'bin', 'weft');
const DEFAULT_CNI_SOURCE = join(ROOT, 'dist', 'cni', 'bin');
const BACKENDS = ['vxlan', 'host-gw', 'ovs'] as const;
type BackendType = (typeof BACKENDS)[number];
const NODE_COUNT = 3;
const HEALTHZ_PORT = 8081;
const HOST_PORT = 30080;
const CONTAINER_PORT = 8080;
const INTERNET_PORT = 80;
const PROGRAMS = ['ip', 'etcd', 'etcdctl', 'iptables', 'ping', 'sysctl'];

const USAGE = `usage: node --import=tsx demo/demo.ts [--backend ${BACKENDS.join('|')}] [--keep] [--cni-source DIR]
       node --import=tsx demo/demo.ts --clean

  --backend     weftd backend for the network config (default vxlan); ovs also runs a private
                Open vSwitch (userspace datapath) on every node
  --keep        leave the demo running (namespaces ${NS_PREFIX}*, state in ${STATE_DIR}); remove it with --clean
  --clean       remove a kept demo and exit
  --cni-source  where the CNI plugin bundles are (default dist/cni/bin, made by \`npm run build\`)
`;

class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** A setup step that failed: the demo cannot go on. */
class StepError extends Error {
  constructor(
    readonly step: number,
    readonly title: string,
    readonly reason: string,
  ) {
    super(`step ${step} (${title}) failed: ${reason}`);
    this.name = 'StepError';
  }
}

/** A check that did not hold; the remaining checks still run. */
class CheckFailed extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CheckFailed';
  }
}

interface Options {
  readonly backend: BackendType;
  readonly keep: boolean;
  readonly clean: boolean;
  readonly cniSource: string;
}

function parseOptions(argv: string[]): Options | null {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        backend: { type: 'string', default: 'vxlan' },
        keep: { type: 'boolean', default: false },
        clean: { type: 'boolean', default: false },
        'cni-source': { type: 'string', default: DEFAULT_CNI_SOURCE },
        help: { type: 'boolean', short: 'h', default: false },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (values.help) return null;
  const backend = BACKENDS.find((b) => b === values.backend);
  if (!backend) throw new UsageError(`--backend must be one of ${BACKENDS.join(', ')}, got ${JSON.stringify(values.backend)}`);
  if (values.clean && values.keep) throw new UsageError('--clean and --keep do not go together');
  return { backend, keep: values.keep, clean: values.clean, cniSource: values['cni-source'] };
}

const out = (text: string): void => void process.stdout.write(text);

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(2)}s`;
}

/** Numbered steps, each printed as it starts and finished with ✔/✘ and its duration, then its details. */
class Progress {
  private n = 0;
  readonly failures: string[] = [];

  constructor(readonly total: number) {}

  /** A setup step: a failure stops the demo (StepError). */
  async setup<T>(title: string, fn: (say: (line: string) => void) => Promise<T>): Promise<T> {
    const r = await this.run(title, fn);
    if (!r.ok) throw new StepError(r.step, title, r.reason);
    return r.value;
  }

  /** A check: a failure is recorded (CheckFailed names why) and the next step runs. */
  async check(title: string, fn: (say: (line: string) => void) => Promise<void>): Promise<void> {
    const r = await this.run(title, fn);
    if (!r.ok) this.failures.push(`step ${r.step} (${title}): ${r.reason}`);
  }

  private async run<T>(
    title: string,
    fn: (say: (line: string) => void) => Promise<T>,
  ): Promise<{ ok: true; value: T } | { ok: false; step: number; reason: string }> {
    const step = ++this.n;
    const width = String(this.total).length;
    out(`[${String(step).padStart(width)}/${this.total}] ${title} … `);
    const lines: string[] = [];
    const t0 = Date.now();
    const flush = () => {
      for (const l of lines) out(`      ${l}\n`);
    };
    try {
      const value = await fn((l) => lines.push(...l.split('\n')));
      out(`${OK} ${seconds(Date.now() - t0)}\n`);
      flush();
      return { ok: true, value };
    } catch (e) {
      out(`${FAIL} ${seconds(Date.now() - t0)}\n`);
      flush();
      const reason = (e as Error).message;
      out(`      ${FAIL} ${reason.split('\n').join('\n        ')}\n`);
      return { ok: false, step, reason };
    }
  }
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function which(program: string): string | null {
  for (const dir of childPath().split(':')) {
    if (dir && isExecutable(join(dir, program))) return join(dir, program);
  }
  return null;
}

async function tail(file: string, n = 8): Promise<string> {
  const text = await readFile(file, 'utf8').catch(() => '');
  return text.trimEnd().split('\n').slice(-n).join('\n');
}

function etcdctl(...args: string[]): Promise<string> {
  return nsRun(UNDERLAY_NS, 'etcdctl', ['--endpoints', ETCD_ENDPOINT, '--dial-timeout', '2s', '--command-timeout', '5s', ...args], {
    env: { ...process.env, PATH: childPath(), ETCDCTL_API: '3' },
  });
}

function parseEnvFile(text: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const line of text.split('\n')) {
    const kv = /^([A-Z0-9_]+)=(.*)$/.exec(line);
    if (kv) m.set(kv[1]!, kv[2]!);
  }
  return m;
}

async function preflight(opts: Options, say: (l: string) => void): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run as root: the demo creates network namespaces');
  const ovs = opts.backend === 'ovs';
  const missing = [...PROGRAMS, ...(ovs ? OVS_PROGRAMS : [])].filter((p) => which(p) === null);
  if (missing.length > 0) throw new Error(`missing programs: ${missing.join(', ')} (\`make deps\` installs them)`);
  if (ovs && !existsSync(OVS_SCHEMA)) throw new Error(`${OVS_SCHEMA} is missing (\`make deps\` installs openvswitch-switch)`);
  for (const bin of [WEFTD, WEFT]) if (!isExecutable(bin)) throw new Error(`${bin} is missing or not executable`);
  // Every bundle `weft install-cni` copies (weft-ovs among them), so a stale build fails here.
  const bundles = CNI_PLUGIN_NAMES.filter((p) => !existsSync(join(opts.cniSource, p)));
  if (bundles.length > 0) throw new Error(`${opts.cniSource} lacks the CNI bundles ${bundles.join(', ')}: run \`npm run build\` first`);
  const left = await demoNamespaces();
  if (left.length > 0 || existsSync(STATE_DIR)) {
    const what = [...left, ...(existsSync(STATE_DIR) ? [STATE_DIR] : [])].join(', ');
    throw new Error(`an earlier demo is still there (${what}); remove it with \`make demo-clean\` (demo/demo.ts --clean)`);
  }
  const etcd = (await run('etcd', ['--version'])).split('\n')[0] ?? '';
  const iptables = (await run('iptables', ['--version'])).trim();
  say(`node ${process.version}, ${etcd.trim()}, ${iptables}${ovs ? `, ${await ovsVersion()}` : ''}`);
  say(`weft from ${existsSync(join(ROOT, 'dist', 'src', 'cli', 'weftd.js')) && !process.env.WEFT_FROM_SOURCE ? 'dist/ (npm run build)' : 'source (tsx)'}, CNI bundles from ${opts.cniSource}`);
}

async function startWeftd(node: Node, peers: number, backend: BackendType): Promise<{ pid: number; subnet: string }> {
  const log = join(node.dir, 'weftd.log');
  const ovs = backend === 'ovs';
  const pid = spawnInNs(
    node.ns,
    [
      WEFTD,
      '--etcd-endpoints', ETCD_ENDPOINT,
      // ovs: the address lives on br-phy, where userspace tunnelling sends from.
      '--iface', ovs ? UNDERLAY_BRIDGE : 'eth0',
      '--ip-masq',
      '--subnet-file', node.subnetFile,
      '--healthz-ip', '127.0.0.1',
      '--healthz-port', String(HEALTHZ_PORT),
      // The node's own CNI server: the runtime below hands this path to the plugin clients.
      '--cni-socket', node.cniSocket,
    ],
    log,
    ovs ? ovsEnv(ovsPaths(node)) : {},
  );
  const dead = async () => new WaitAbort(`weftd on ${node.name} exited; last lines of ${log}:\n${await tail(log)}`);
  await waitFor(
    async () => {
      if (!alive(pid)) throw await dead();
      return existsSync(node.subnetFile);
    },
    { timeoutMs: 30_000, intervalMs: 100, what: `weftd on ${node.name} to write ${node.subnetFile} (log: ${log})` },
  ).catch(async (e: Error) => {
    throw e instanceof WaitAbort ? e : new Error(`${e.message}; last lines of the log:\n${await tail(log)}`);
  });
  // Ready (lease held, subnet.env written, masquerade rules in place) and every peer programmed.
  let last = '';
  await waitFor(
    async () => {
      if (!alive(pid)) throw await dead();
      const r = await readiness(node.ns, HEALTHZ_PORT);
      last = r.error ?? `ready=${r.ready}, peers programmed=${r.peers}`;
      return r.ready && r.peers === peers;
    },
    { timeoutMs: 30_000, intervalMs: 250, what: `weftd on ${node.name} to be ready with ${peers} peers programmed` },
  ).catch(async (e: Error) => {
    throw e instanceof WaitAbort ? e : new Error(`${e.message}; last seen: ${last}; last lines of ${log}:\n${await tail(log)}`);
  });
  const subnet = parseEnvFile(await readFile(node.subnetFile, 'utf8')).get('FLANNEL_SUBNET') ?? '?';
  return { pid, subnet };
}

function podsOf(node: Node): Pod[] {
  return ['a', 'b'].map((x) => ({
    node,
    name: `${node.name}-${x}`,
    ns: `${NS_PREFIX}${node.name}-${x}`,
    containerId: `weftdemo-${node.name}-${x}`,
    // One pod per node publishes a hostPort, as a pod with `ports: [{hostPort}]` would.
    portMappings: x === 'a' ? [{ hostPort: HOST_PORT, containerPort: CONTAINER_PORT, protocol: 'tcp' as const }] : [],
  }));
}

async function demo(opts: Options, progress: Progress, onOwned: () => void): Promise<void> {
  const cluster = nodes(NODE_COUNT);
  const ovs = opts.backend === 'ovs';
  const config = { Network: NETWORK, Backend: ovs ? OVS_BACKEND : { Type: opts.backend } };

  await progress.setup('preflight: root, programs, CNI bundles, no earlier demo', (say) => preflight(opts, say));
  onOwned();

  await progress.setup(`namespaces: underlay, "internet" and ${NODE_COUNT} nodes`, async (say) => {
    await mkdir(STATE_DIR, { recursive: true, mode: 0o755 });
    await buildUnderlay();
    await Promise.all(cluster.map(async (n) => {
      await mkdir(n.dir, { recursive: true });
      await buildNode(n);
    }));
    await startServer(INTERNET_NS, 'internet', INTERNET_IP, INTERNET_PORT, join(STATE_DIR, 'internet-server.log'));
    say(`${UNDERLAY_NS}: bridge br0 ${UNDERLAY_GW}/24 (etcd, router to the internet)`);
    for (const n of cluster) say(`${n.ns}: eth0 ${n.ip}/24 on br0`);
    say(`${INTERNET_NS}: ${INTERNET_IP}/24, a TCP server on :${INTERNET_PORT} that answers with the source address it sees;`);
    say(`  it routes back to the node LAN only, never to ${NETWORK}`);
  });

  if (ovs) {
    await progress.setup(`Open vSwitch on ${cluster.map((n) => n.name).join(', ')}: ovsdb-server + ovs-vswitchd (netdev datapath), eth0 onto ${UNDERLAY_BRIDGE}`, async (say) => {
      const started = await Promise.all(cluster.map(async (n) => {
        const o = await startOvs(n);
        await moveUnderlayToBrPhy(o);
        return o;
      }));
      for (const o of started) {
        say(`${o.node.name}: ovsdb-server pid ${o.ovsdbServer}, ovs-vswitchd pid ${o.vswitchd}, OVS_RUNDIR=${o.paths.runDir}`);
      }
      say(`each node: eth0 is a port of ${UNDERLAY_BRIDGE} (datapath_type=netdev), its address and default route moved to ${UNDERLAY_BRIDGE};`);
      say(`  TX checksum offload off on the underlay end of its veth (OVS reads eth0 with AF_PACKET)`);
    });
  }

  await progress.setup('etcd in the underlay namespace, network config written', async (say) => {
    const log = join(STATE_DIR, 'etcd.log');
    const peer = 'http://127.0.0.1:2380';
    const pid = spawnInNs(
      UNDERLAY_NS,
      ['etcd', '--name', 'weftdemo', '--data-dir', join(STATE_DIR, 'etcd'),
        '--listen-client-urls', `${ETCD_ENDPOINT},http://127.0.0.1:2379`, '--advertise-client-urls', ETCD_ENDPOINT,
        '--listen-peer-urls', peer, '--initial-advertise-peer-urls', peer, '--initial-cluster', `weftdemo=${peer}`,
        '--log-level', 'warn'],
      log,
    );
    await waitFor(
      async () => {
        if (!alive(pid)) throw new WaitAbort(`etcd exited; last lines of ${log}:\n${await tail(log)}`);
        return etcdctl('endpoint', 'health').then(() => true, () => false);
      },
      { timeoutMs: 20_000, intervalMs: 200, what: `etcd at ${ETCD_ENDPOINT} to be healthy (log: ${log})` },
    );
    await etcdctl('put', '/coreos.com/network/config', JSON.stringify(config));
    say(`etcd ${ETCD_ENDPOINT} (pid ${pid})`);
    say(`/coreos.com/network/config = ${JSON.stringify(config)}`);
  });

  await progress.setup(`weftd on ${cluster.map((n) => n.name).join(', ')} (${opts.backend}, --ip-masq), each with ${NODE_COUNT - 1} peers programmed`, async (say) => {
    const started = await Promise.all(cluster.map((n) => startWeftd(n, NODE_COUNT - 1, opts.backend)));
    cluster.forEach((n, i) => say(`${n.name}: pid ${started[i]!.pid}, subnet ${started[i]!.subnet}, CNI server ${n.cniSocket}, log ${join(n.dir, 'weftd.log')}`));
  });

  await progress.setup(`weft leases --etcd-endpoints ${ETCD_ENDPOINT}`, async (say) => {
    say((await nsRun(UNDERLAY_NS, WEFT, ['leases', '--etcd-endpoints', ETCD_ENDPOINT])).trimEnd());
  });

  await progress.setup('subnet.env of every node', async (say) => {
    for (const n of cluster) {
      say(`${n.subnetFile}:`);
      say((await readFile(n.subnetFile, 'utf8')).trimEnd().replace(/^/gm, '  '));
    }
  });

  await progress.setup('CNI plugins installed with `weft install-cni`, conflist written', async (say) => {
    await Promise.all(cluster.map(async (n) => {
      await run(WEFT, ['install-cni', '--dest', n.cniBinDir, '--source', opts.cniSource]);
      await writeConflist(n);
    }));
    say(`${cluster.map((n) => n.cniBinDir).join(', ')}: ${(await readdir(cluster[0]!.cniBinDir)).sort().join(' ')}`);
    if (ovs) say(`subnet.env says WEFT_BACKEND=ovs: flannel delegates to weft-ovs, which puts each pod on br-int`);
    say(`${cluster[0]!.conflistFile}:`);
    say((await readFile(cluster[0]!.conflistFile, 'utf8')).trimEnd().replace(/^/gm, '  '));
  });

  const pods = await progress.setup(`${NODE_COUNT * 2} pods: flannel ADD, then portmap ADD with prevResult (runtimeConfig.portMappings on *-a), WEFT_CNI_SOCKET = the node's socket`, async (say) => {
    const perNode = await Promise.all(
      cluster.map(async (n) => {
        const attached: Attached[] = [];
        for (const p of podsOf(n)) {
          await addNetns(p.ns);
          attached.push(await addPod(p));
        }
        return attached;
      }),
    );
    const all = perNode.flat();
    for (const a of all) {
      const hp = a.pod.portMappings.map((m) => `, hostPort ${a.pod.node.ip}:${m.hostPort} → :${m.containerPort}/${m.protocol}`).join('');
      say(`${a.pod.name} on ${a.pod.node.name}: ${a.ip} (netns ${a.pod.ns}${hp})`);
    }
    return all;
  });

  await progress.check('every pod was set up by its node\'s CNI server (weft_cni_requests_total), none by the fallback', async (say) => {
    const bad: string[] = [];
    for (const n of cluster) {
      // Built with --no-native (or an old build): the plugins are the bundles themselves.
      if (await isScript(join(n.cniBinDir, 'flannel'))) {
        say(`${n.name}: ${join(n.cniBinDir, 'flannel')} is a Node.js bundle, not the native client: no CNI server involved`);
        continue;
      }
      const rows = await cniRequests(n.ns, HEALTHZ_PORT);
      const count = (plugin: string, verb: string, result: string) =>
        rows.filter((r) => r.plugin === plugin && r.verb === verb && r.result === result).reduce((a, r) => a + r.value, 0);
      const want = podsOf(n).length;
      const flannel = count('flannel', 'ADD', 'ok');
      const portmap = count('portmap', 'ADD', 'ok');
      const failed = rows.filter((r) => r.result !== 'ok' && r.value > 0).map((r) => `${r.plugin} ${r.verb} ${r.result} ×${r.value}`);
      const line = `${n.name} (${n.cniSocket}): flannel ADD ok ${flannel}, portmap ADD ok ${portmap}${failed.length > 0 ? `; not ok: ${failed.join(', ')}` : ''}`;
      if (flannel === want && portmap === want && failed.length === 0) {
        say(`${OK} ${line}`);
      } else {
        say(`${FAIL} ${line} (want ${want} each, nothing else)`);
        bad.push(`${n.name}: ${flannel}/${want} flannel and ${portmap}/${want} portmap ADDs served${failed.length > 0 ? `, ${failed.join(', ')}` : ''}` +
          (flannel + portmap < 2 * want ? ' — the rest ran through the client\'s fallback (the Node.js bundle) or elsewhere' : ''));
      }
    }
    if (bad.length > 0) throw new CheckFailed(bad.join('; '));
  });

  await progress.check(`pod-to-pod reachability (${pods.length * (pods.length - 1)} pings)`, async (say) => {
    const cells = await reachability(pods);
    const view = pods.map((p) => ({ name: p.pod.name, ip: p.ip }));
    for (const l of renderMatrix(view, cells)) say(l);
    const failed = failedPairs(view, cells);
    const total = pods.length * (pods.length - 1);
    say(`${total - failed.length}/${total} pod pairs answer`);
    if (failed.length > 0) throw new CheckFailed(`${failed.length} of ${total} pairs get no answer: ${failed.join(', ')}`);
  });

  const [n1, n2] = [cluster[0]!, cluster[1]!];
  const target = pods.find((p) => p.pod.node === n1 && p.pod.portMappings.length > 0)!;
  const client = pods.find((p) => p.pod.node === n2)!;
  await progress.check(`hostPort ${n1.ip}:${HOST_PORT} on ${n1.name}, from ${client.pod.name} on ${n2.name}`, async (say) => {
    const label = `${target.pod.name} ${target.ip}:${CONTAINER_PORT}`;
    await startServer(target.pod.ns, label, '0.0.0.0', CONTAINER_PORT, join(n1.dir, `${target.pod.name}-server.log`));
    const reply = await connect(client.pod.ns, n1.ip, HOST_PORT);
    const m = /^(\S+) (\S+) saw (\S+)$/.exec(reply);
    const head = `hostPort ${client.pod.name} (${client.ip}) → ${n1.ip}:${HOST_PORT} (${n1.name})`;
    if (!m || m[1] !== target.pod.name) {
      say(`${FAIL} ${head}: ${reply}`);
      throw new CheckFailed(`${head} did not reach ${label}: ${reply}`);
    }
    say(`${OK} ${head} → ${m[1]} ${m[2]}; the pod saw the client as ${m[3]}`);
  });

  await progress.check(`masquerade: a pod on every node → ${INTERNET_IP}:${INTERNET_PORT} ("internet")`, async (say) => {
    const clients = cluster.map((n) => pods.filter((p) => p.pod.node === n).at(-1)!);
    const replies = await Promise.all(clients.map((c) => connect(c.pod.ns, INTERNET_IP, INTERNET_PORT)));
    const bad: string[] = [];
    clients.forEach((c, i) => {
      const reply = replies[i]!;
      const node = c.pod.node;
      const seen = /^internet saw (\S+)$/.exec(reply)?.[1];
      const head = `masquerade ${c.pod.name} (${c.ip}) → ${INTERNET_IP}:${INTERNET_PORT}`;
      if (seen === node.ip) {
        say(`${OK} ${head}: the internet saw ${seen} = ${node.name}'s address`);
      } else {
        const why = seen ? `the internet saw ${seen}, not ${node.name}'s address ${node.ip}` : reply;
        say(`${FAIL} ${head}: ${why}`);
        bad.push(`${c.pod.name}: ${why}`);
      }
    });
    if (bad.length > 0) throw new CheckFailed(bad.join('; '));
  });
}

/** "n1: ovsdb-server 1234, ovs-vswitchd 1240; n2: …" from the labels "<daemon>@<node>", in start order. */
function daemonList(r: RemoveReport): string {
  const byNode = new Map<string, string[]>();
  for (const d of r.daemons) {
    const [name, node = '?'] = d.label.split('@');
    byNode.set(node, [...(byNode.get(node) ?? []), `${name} ${d.pid}`]);
  }
  return [...byNode].sort(([a], [b]) => a.localeCompare(b)).map(([node, ds]) => `${node}: ${ds.join(', ')}`).join('; ');
}

async function clean(): Promise<number> {
  const r = await removeDemo();
  if (r.namespaces.length === 0 && !r.stateDir && r.pids.length === 0 && r.daemons.length === 0) {
    out('no demo to remove\n');
  } else {
    out(`removed ${r.namespaces.length} namespaces, stopped ${r.pids.length} processes${r.stateDir ? `, removed ${STATE_DIR}` : ''}\n`);
    if (r.daemons.length > 0) out(`Open vSwitch went last: ${daemonList(r)}\n`);
  }
  return 0;
}

async function main(argv: string[]): Promise<number> {
  let opts: Options | null;
  try {
    opts = parseOptions(argv);
  } catch (e) {
    process.stderr.write(`${(e as Error).message}\n${USAGE}`);
    return 2;
  }
  if (!opts) {
    out(USAGE);
    return 0;
  }
  if (opts.clean) {
    if (process.getuid?.() !== 0) {
      process.stderr.write('run as root\n');
      return 1;
    }
    return clean();
  }

  const t0 = Date.now();
  const progress = new Progress(opts.backend === 'ovs' ? 14 : 13);
  let owned = false;
  let leaving = false;
  const finish = async (say: (line: string) => void): Promise<void> => {
    if (opts.keep) {
      say(`namespaces: ${(await demoNamespaces()).join(' ')}`);
      say(`state, logs, CNI bin dirs and conflists: ${STATE_DIR}`);
      say(`try: ip netns exec ${NS_PREFIX}n1-a ping -c1 <a pod IP above>; remove it all with \`make demo-clean\``);
      if (opts.backend === 'ovs') {
        const run1 = ovsPaths(nodes(1)[0]!).runDir;
        say(`     OVS_RUNDIR=${run1} ovs-ofctl -O OpenFlow15 dump-flows br-int; ovs-vsctl --db=unix:${run1}/db.sock show`);
      }
      return;
    }
    refuseNewProcesses();
    const r = await removeDemo();
    say(`stopped ${r.pids.length} processes, deleted ${r.namespaces.length} namespaces, removed ${STATE_DIR}`);
    if (r.daemons.length > 0) say(`Open vSwitch went last, after the weftd using it: ${daemonList(r)}`);
  };
  const onSignal = (sig: NodeJS.Signals): void => {
    if (leaving) return;
    leaving = true;
    out(`\ninterrupted (${sig})${owned && !opts.keep ? ': removing the demo' : ''}\n`);
    const say = (l: string) => out(`      ${l}\n`);
    void (owned ? finish(say) : Promise.resolve())
      .catch((e: Error) => out(`cleanup failed: ${e.message}; run \`make demo-clean\`\n`))
      .finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  let fatal: StepError | null = null;
  try {
    await demo(opts, progress, () => (owned = true));
  } catch (e) {
    if (leaving) return new Promise(() => {}); // the signal handler exits
    fatal = e instanceof StepError ? e : new StepError(0, 'demo', (e as Error).stack ?? String(e));
  }
  if (leaving) return new Promise(() => {});
  leaving = true;
  if (owned) {
    const removing = opts.backend === 'ovs'
      ? 'removing the demo: processes, then Open vSwitch (by PID), namespaces, state'
      : 'removing the demo: processes (by PID), namespaces, state';
    await progress.setup(opts.keep ? 'keeping the demo (--keep)' : removing, finish).catch(
      (e: Error) => out(`cleanup failed: ${e.message}; run \`make demo-clean\`\n`),
    );
  }
  const took = seconds(Date.now() - t0);
  if (fatal) {
    out(`\ndemo FAILED after ${took}: ${fatal.message}\n`);
    return 1;
  }
  if (progress.failures.length > 0) {
    out(`\ndemo FAILED after ${took}:\n${progress.failures.map((f) => `  ${f}`).join('\n')}\n`);
    return 1;
  }
  out(`\ndemo passed in ${took}: every pod reaches every pod, the hostPort answers across nodes, pods reach outside through masquerade\n`);
  return 0;
}

process.exitCode = await main(process.argv.slice(2));
