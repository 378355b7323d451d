// The ovs backend's programming speed at 1 000 peers and 200 local pods, next to the floor for the
// same work measured in the same run (issue 8). No packet is sent; what is timed is OpenFlow and
// kernel state.
//
// Measured, per run, with the real OvsBackend (prepare → start(lease) → pods → apply(batch, peers)):
//   (a) "lease set known" → "complete flow set installed and every host route in the kernel": one
//       apply() with all N peer leases, on a bridge that already holds the node's and the pods'
//       flows (start() put them there);
//   (b) one peer added on top: apply() with N + 1 leases;
//   and, untimed by (a)/(b) but reported, prepare(), start(lease) and every attachPodPort().
// References, same run, same namespace, same ovs-vswitchd:
//   - `ovs-ofctl -O OpenFlow15 --bundle add-flows` of exactly the flow file of (a) onto an empty
//     bridge `br-ref` (the floor for installing that table);
//   - `ovs-ofctl --bundle replace-flows` of the N + 1 file onto br-ref holding the N table (b);
//   - `ip -batch` of the N host routes (`route add S via G dev D onlink proto 88`, weft's form) on a
//     veth of its own, in table 100 (weft's routes to the same subnets may be in main), and one `ip route add` for (b).
// Every measurement is checked afterwards: dump-flows count and `diff-flows` against the expected
// table (empty), round number, route count and form. A failed check ends the bench with status 1.
//
// Layout: one namespace `wt-bovs-<pid>` holding a private Open vSwitch (userspace "netdev" datapath,
// run/db/log dirs in a temporary directory, test/helpers/ovs.ts). The backend programs weft-gw0 and
// routes through netlink in its own network namespace, so the measuring part is this file re-run
// inside that namespace (`ip netns exec <ns> node --import tsx bench/ovs.ts --inner …`); it prints
// its results as one JSON line, which the outer process turns into the table.
//
//   node --import tsx bench/ovs.ts [--runs 3] [--peers 1000] [--pods 200]
//
// Run as root. The machine's own network namespace is never touched (the inner part refuses to run
// there); the namespace, the OVS daemons and the temporary directory are removed in `finally` and
// on SIGINT/SIGTERM.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import type { BackendContext } from '../src/backend/backend.js';
import { GATEWAY_PORT_NAME, listPodInterfaces, nextRound, readRound, TUNNEL_PORT_NAME } from '../src/backend/ovs/bridge.js';
import { OvsBackend, parseOvsOptions } from '../src/backend/ovs/ovs.js';
import { desiredFlows, gatewayOf, macFromIP, renderFlows, type NodePorts, type PeerNode } from '../src/backend/ovs/pipeline.js';
import { attachPodPort } from '../src/backend/ovs/podport.js';
import type { ExternalInterface } from '../src/backend/backend.js';
import { Netlink, WEFT_ROUTE_PROTOCOL } from '../src/netlink/index.js';
import { OvsClient } from '../src/ovs/cli.js';
import { parseNetworkConfig } from '../src/subnet/config.js';
import type { Lease, LeaseEvent } from '../src/subnet/lease.js';
import { IPAddr, IPNet } from '../src/util/ip.js';
import { createLogger } from '../src/util/log.js';
import { addNetns, delNetns, nsPrefix } from '../test/helpers/netns.js';
import { OvsInstance } from '../test/helpers/ovs.js';
import { waitFor } from '../test/helpers/wait.js';
import { assertPrivateNetns } from '../test/netns/setup.js';

const run = promisify(execFile);
const SELF = fileURLToPath(import.meta.url);
const ROOT = fileURLToPath(new URL('..', import.meta.url));

const { values: args } = parseArgs({
  options: {
    runs: { type: 'string', default: '3' },
    peers: { type: 'string', default: '1000' },
    pods: { type: 'string', default: '200' },
    inner: { type: 'boolean', default: false },
    'run-dir': { type: 'string' },
    'work-dir': { type: 'string' },
  },
});

const BRIDGE = 'br-int';
const REF_BRIDGE = 'br-ref';
const REF_DEV = 'wt-refgw';
/** The reference routes go to a table of their own: weft's routes to the same destinations may be present. */
const REF_TABLE = 100;
const NODE_IP = IPAddr.parse('172.16.0.1');
const OWN_SUBNET = IPNet.parse('10.0.0.0/24');
const PEER_BASE = IPAddr.parse('10.1.0.0').value;
const PUBLIC_BASE = IPAddr.parse('172.16.1.0').value;
const CONFIG = { Network: '10.0.0.0/8', SubnetLen: 24, Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } };
const RESULT_MARK = '@@bench-ovs ';

class BenchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BenchError';
  }
}

/** A measurement's after-check failed: what was timed did not (fully) happen. */
class BenchCheckError extends Error {
  constructor(what: string, got: unknown, want: unknown) {
    super(`${what}: got ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
    this.name = 'BenchCheckError';
  }
}

// ---------------------------------------------------------------------------------------------
// The peers and pods (identical for weft and the references)

function peerLease(i: number): Lease {
  return {
    subnet: IPNet.of(IPAddr.of(4, PEER_BASE + BigInt(i) * 256n), 24),
    ipv6Subnet: null,
    attrs: { publicIP: IPAddr.of(4, PUBLIC_BASE + BigInt(i)), publicIPv6: null, backendType: 'ovs', backendData: { VNI: 1 } },
    reservation: false,
    expiration: null,
  };
}
const peerNode = (l: Lease): PeerNode => ({ subnet: l.subnet!, publicIP: l.attrs.publicIP });

interface Pod {
  readonly host: string;
  readonly ip: IPAddr;
}
const pod = (i: number): Pod => ({ host: `wtp${i}`, ip: OWN_SUBNET.nth(BigInt(2 + i)) });

// ---------------------------------------------------------------------------------------------
// Inner part (inside the OVS node's namespace)

interface Call {
  readonly what: string;
  readonly start: number;
  readonly end: number;
}

/** weft's OVS client, recording every ovs-vsctl / ovs-ofctl process it runs. */
class TimedOvsClient extends OvsClient {
  readonly calls: Call[] = [];

  private async time<T>(what: string, fn: () => Promise<T>): Promise<T> {
    const start = performance.now();
    try {
      return await fn();
    } finally {
      this.calls.push({ what, start, end: performance.now() });
    }
  }

  override vsctl(a: readonly string[]): Promise<string> {
    return this.time(`ovs-vsctl ${a.find((x) => !x.startsWith('-')) ?? ''}`, () => super.vsctl(a));
  }

  override ofctl(command: string, bridge: string, a: readonly string[] = [], stdin?: string, options: readonly string[] = []): Promise<string> {
    return this.time(`ovs-ofctl ${[...options, command].join(' ')}`, () => super.ofctl(command, bridge, a, stdin, options));
  }

  override diffFlows(bridge: string, flows: string): Promise<string[]> {
    return this.time('ovs-ofctl diff-flows', () => super.diffFlows(bridge, flows));
  }

  /** Calls within [from, to], grouped by what: count and summed ms. */
  between(from: number, to: number): Record<string, { n: number; ms: number }> {
    const out: Record<string, { n: number; ms: number }> = {};
    for (const c of this.calls) {
      if (c.start < from || c.end > to) continue;
      const e = (out[c.what] ??= { n: 0, ms: 0 });
      e.n++;
      e.ms += c.end - c.start;
    }
    return out;
  }

  lastEndBefore(to: number): number {
    return Math.max(...this.calls.filter((c) => c.end <= to).map((c) => c.end));
  }
}

interface RunResult {
  readonly run: number;
  readonly order: 'weft first' | 'references first';
  /** /proc/loadavg (1, 5, 15 min) before the timed part: other work on the machine disturbs. */
  readonly load: string;
  readonly prepareMs: number;
  readonly startMs: number;
  readonly attachMs: number[];
  readonly flowsA: number;
  readonly flowsB: number;
  /** (a): the whole apply(), its part up to the end of the last OVS process, and the rest (host routes). */
  readonly applyMs: number;
  readonly applyFlowsMs: number;
  readonly applyRoutesMs: number;
  readonly applyCalls: Record<string, { n: number; ms: number }>;
  /** (b) */
  readonly addMs: number;
  readonly addFlowsMs: number;
  readonly addRoutesMs: number;
  readonly addCalls: Record<string, { n: number; ms: number }>;
  readonly refAddFlowsMs: number;
  readonly refReplaceFlowsMs: number;
  readonly refIpBatchMs: number;
  readonly refIpRouteAddMs: number;
}

interface InnerResult {
  readonly peers: number;
  readonly pods: number;
  readonly ovsVersion: string;
  readonly runs: RunResult[];
}

async function tool(cmd: string, a: readonly string[], env?: NodeJS.ProcessEnv): Promise<string> {
  try {
    const { stdout } = await run(cmd, [...a], { maxBuffer: 64 << 20, timeout: 60_000, ...(env ? { env } : {}) });
    return stdout;
  } catch (e) {
    const err = e as Error & { stderr?: string };
    throw new BenchError(`${cmd} ${a.join(' ')}: ${err.stderr?.trim() || err.message}`);
  }
}

async function timedTool(cmd: string, a: readonly string[], env?: NodeJS.ProcessEnv): Promise<number> {
  const t = performance.now();
  await tool(cmd, a, env);
  return performance.now() - t;
}

class Inner {
  private readonly plain: OvsClient;
  private readonly nl = Netlink.open();
  private readonly logger = createLogger({ level: 'info' }).child({ bench: 'ovs' });
  private readonly leases: Lease[];
  private readonly extra: Lease;
  private readonly pods: Pod[];
  private extIface: ExternalInterface | null = null;
  private refIndex = 0;

  constructor(
    private readonly runDir: string,
    /** Flow and batch files; inside the outer process's temporary directory, which it removes. */
    private readonly dir: string,
    readonly nPeers: number,
    readonly nPods: number,
  ) {
    this.plain = new OvsClient({ runDir, timeoutSeconds: 60 });
    this.leases = Array.from({ length: nPeers }, (_, i) => peerLease(i));
    this.extra = peerLease(nPeers);
    this.pods = Array.from({ length: nPods }, (_, i) => pod(i));
    if (nPods + 2 > 254) throw new BenchError('--pods: at most 252 (one /24)');
  }

  private get env(): NodeJS.ProcessEnv {
    return { ...process.env, OVS_RUNDIR: this.runDir };
  }

  /** The node's fake uplink, the reference route device, the pods' veth pairs and the reference bridge. */
  async setup(): Promise<void> {
    const batch = join(this.dir, 'setup.batch');
    const lines = [
      // veth pairs, not dummies: this kernel has no dummy driver.
      'link add eth0 type veth peer name eth0p',
      `addr add ${NODE_IP.toString()}/16 dev eth0`,
      'link set eth0 up',
      'link set eth0p up',
      `link add ${REF_DEV} type veth peer name ${REF_DEV}p`,
      `link set ${REF_DEV} up`,
      `link set ${REF_DEV}p up`,
    ];
    for (const p of this.pods) lines.push(`link add ${p.host} type veth peer name ${p.host}c`, `link set ${p.host} up`, `link set ${p.host}c up`);
    writeFileSync(batch, lines.map((l) => `${l}\n`).join(''));
    await tool('ip', ['-batch', batch]);
    const eth0 = await this.nl.link('eth0');
    const ref = await this.nl.link(REF_DEV);
    if (!eth0 || !ref) throw new BenchError('eth0 or the reference device is missing after set-up');
    this.refIndex = ref.index;
    this.extIface = { name: 'eth0', index: eth0.index, mtu: 1500, ifaceAddr: NODE_IP, ifaceV6Addr: null, extAddr: NODE_IP, extV6Addr: null };
    await this.plain.vsctl([
      '--may-exist', 'add-br', REF_BRIDGE,
      '--', 'set', 'bridge', REF_BRIDGE, 'datapath_type=netdev', 'fail_mode=secure', 'protocols=OpenFlow10,OpenFlow13,OpenFlow15',
    ]);
  }

  private async cleanSlate(): Promise<void> {
    await this.plain.vsctl(['--if-exists', 'del-br', BRIDGE]);
    await waitFor(async () => (await this.nl.link(GATEWAY_PORT_NAME)) === null, { timeoutMs: 10_000, what: `${GATEWAY_PORT_NAME} to go with ${BRIDGE}` });
    // Fails with "FIB table does not exist" before the first reference run; counted below.
    await tool('ip', ['route', 'flush', 'table', String(REF_TABLE)]).catch(() => undefined);
    if ((await this.refRouteCount()) !== 0) throw new BenchCheckError(`table ${REF_TABLE} routes left before the run`, 'some', 0);
    await this.plain.ofctl('del-flows', REF_BRIDGE);
    const left = (await this.nl.routes({ family: 4, table: 254, protocol: WEFT_ROUTE_PROTOCOL })).length;
    if (left !== 0) throw new BenchCheckError('proto 88 routes left before the run', left, 0);
  }

  private backendContext(): BackendContext {
    const config = parseNetworkConfig(JSON.stringify(CONFIG), { knownBackends: ['ovs'] });
    return { config, extIface: this.extIface!, logger: this.logger };
  }

  /** The table weft must end up with, computed from the pipeline module and the real ports. */
  private async expectedFlows(round: number, peers: readonly Lease[]): Promise<string> {
    const ofport = async (iface: string) => Number((await this.plain.vsctl(['get', 'interface', iface, 'ofport'])).trim());
    const gatewayIP = gatewayOf(OWN_SUBNET);
    const node: NodePorts = {
      vni: 1,
      tunnelPort: await ofport(TUNNEL_PORT_NAME),
      gatewayPort: await ofport(GATEWAY_PORT_NAME),
      gatewayIP,
      gatewayMAC: macFromIP(gatewayIP),
    };
    const pods = await listPodInterfaces(this.plain, BRIDGE);
    if (pods.length !== this.nPods) throw new BenchCheckError('pod ports on the bridge', pods.length, this.nPods);
    return renderFlows(desiredFlows(round, node, pods, peers.map(peerNode)));
  }

  private async checkFlows(bridge: string, expected: string, what: string): Promise<number> {
    const want = expected.split('\n').filter(Boolean).length;
    const got = (await this.plain.dumpFlows(bridge)).length;
    if (got !== want) throw new BenchCheckError(`${what}: dump-flows count on ${bridge}`, got, want);
    const diff = await this.plain.diffFlows(bridge, expected);
    if (diff.length !== 0) throw new BenchCheckError(`${what}: diff-flows ${bridge} against the expected table`, diff.slice(0, 4), []);
    return got;
  }

  /** Every peer's host route, in weft's form (`via <peer gateway> dev weft-gw0 onlink proto 88`), and nothing else. */
  private async checkWeftRoutes(peers: readonly Lease[], what: string): Promise<void> {
    const gw = await this.nl.link(GATEWAY_PORT_NAME);
    if (!gw) throw new BenchCheckError(`${what}: ${GATEWAY_PORT_NAME}`, 'missing', 'present');
    const routes = await this.nl.routes({ family: 4, table: 254, protocol: WEFT_ROUTE_PROTOCOL });
    if (routes.length !== peers.length) throw new BenchCheckError(`${what}: proto ${WEFT_ROUTE_PROTOCOL} routes`, routes.length, peers.length);
    const byDst = new Map(routes.map((r) => [r.dst.toString(), r]));
    for (const l of peers) {
      const r = byDst.get(l.subnet!.toString());
      const got = r ? `via ${r.gateway?.toString() ?? '-'} oif ${r.oif ?? '-'}${r.onlink ? ' onlink' : ''}` : 'missing';
      const want = `via ${gatewayOf(l.subnet!).toString()} oif ${gw.index} onlink`;
      if (got !== want) throw new BenchCheckError(`${what}: route ${l.subnet!.toString()}`, got, want);
    }
  }

  private async refRouteCount(): Promise<number> {
    return (await this.nl.routes({ family: 4, table: REF_TABLE, oif: this.refIndex })).filter((r) => r.gateway !== null && r.onlink).length;
  }

  async runOnce(r: number): Promise<RunResult> {
    const log = (msg: string) => process.stderr.write(`[bench-ovs run ${r}] ${msg}\n`);
    await this.cleanSlate();
    const ovs = new TimedOvsClient({ runDir: this.runDir, timeoutSeconds: 60 });
    const backend = new OvsBackend(parseOvsOptions(CONFIG.Backend), this.backendContext(), { ovs });
    try {
      let t = performance.now();
      const prepared = await backend.prepare();
      const prepareMs = performance.now() - t;
      const own: Lease = { subnet: OWN_SUBNET, ipv6Subnet: null, attrs: prepared.attrs, reservation: false, expiration: null };
      t = performance.now();
      await backend.start(own);
      const startMs = performance.now() - t;

      // Pods attach the way the CNI plugin attaches them, after start (subnet.env exists).
      const attachMs: number[] = [];
      const gateway = gatewayOf(OWN_SUBNET);
      for (const [i, p] of this.pods.entries()) {
        t = performance.now();
        await attachPodPort(ovs, {
          bridge: BRIDGE,
          hostIface: p.host,
          containerId: `bench-${i}`,
          ifName: 'eth0',
          ip: p.ip,
          mac: macFromIP(p.ip),
          gateway,
          podName: `pod-${i}`,
          podNamespace: 'bench',
        });
        attachMs.push(performance.now() - t);
      }
      log(`prepare ${prepareMs.toFixed(0)} ms, start ${startMs.toFixed(0)} ms, ${this.nPods} pods attached in ${sum(attachMs).toFixed(0)} ms`);

      // The bridge was created by this run, so the backend took round 1 (checked after (a)).
      const round = nextRound(null);
      const all = [...this.leases, this.extra];
      const textA = await this.expectedFlows(round, this.leases);
      const textB = await this.expectedFlows(round, all);
      const fileA = join(this.dir, `flows-${r}-a.txt`);
      const fileB = join(this.dir, `flows-${r}-b.txt`);
      writeFileSync(fileA, textA);
      writeFileSync(fileB, textB);
      const routesFile = join(this.dir, `routes-${r}.batch`);
      const routeLine = (l: Lease) => `${l.subnet!.toString()} via ${gatewayOf(l.subnet!).toString()} dev ${REF_DEV} onlink proto ${WEFT_ROUTE_PROTOCOL} table ${REF_TABLE}`;
      writeFileSync(routesFile, this.leases.map((l) => `route add ${routeLine(l)}\n`).join(''));

      const weft = async () => {
        const batch: LeaseEvent[] = this.leases.map((lease) => ({ type: 'added', lease }));
        const t0 = performance.now();
        await backend.apply(batch);
        const t1 = performance.now();
        const flowsA = await this.checkFlows(BRIDGE, textA, '(a) weft');
        await this.checkWeftRoutes(this.leases, '(a) weft');
        const saved = await readRound(this.plain, BRIDGE);
        if (saved !== round) throw new BenchCheckError('(a) round saved on the bridge', saved, round);

        const t2 = performance.now();
        await backend.apply([{ type: 'added', lease: this.extra }]);
        const t3 = performance.now();
        const flowsB = await this.checkFlows(BRIDGE, textB, '(b) weft');
        await this.checkWeftRoutes(all, '(b) weft');
        const endA = ovs.lastEndBefore(t1);
        const endB = ovs.lastEndBefore(t3);
        return {
          flowsA,
          flowsB,
          applyMs: t1 - t0,
          applyFlowsMs: endA - t0,
          applyRoutesMs: t1 - endA,
          applyCalls: ovs.between(t0, t1),
          addMs: t3 - t2,
          addFlowsMs: endB - t2,
          addRoutesMs: t3 - endB,
          addCalls: ovs.between(t2, t3),
        };
      };

      const references = async () => {
        const ofctl = (cmd: string, file: string) => ['-O', 'OpenFlow15', '--bundle', cmd, `unix:${this.plain.mgmtSocket(REF_BRIDGE)}`, file];
        if ((await this.plain.dumpFlows(REF_BRIDGE)).length !== 0) throw new BenchCheckError(`${REF_BRIDGE} before add-flows`, 'flows', 'empty');
        const refAddFlowsMs = await timedTool('ovs-ofctl', ofctl('add-flows', fileA), this.env);
        await this.checkFlows(REF_BRIDGE, textA, '(a) reference add-flows');
        const refReplaceFlowsMs = await timedTool('ovs-ofctl', ofctl('replace-flows', fileB), this.env);
        await this.checkFlows(REF_BRIDGE, textB, '(b) reference replace-flows');
        await this.plain.ofctl('del-flows', REF_BRIDGE);

        const refIpBatchMs = await timedTool('ip', ['-batch', routesFile]);
        const nA = await this.refRouteCount();
        if (nA !== this.nPeers) throw new BenchCheckError('(a) reference ip -batch: routes', nA, this.nPeers);
        const refIpRouteAddMs = await timedTool('ip', ['route', 'add', ...routeLine(this.extra).split(' ')]);
        const nB = await this.refRouteCount();
        if (nB !== this.nPeers + 1) throw new BenchCheckError('(b) reference ip route add: routes', nB, this.nPeers + 1);
        await tool('ip', ['route', 'flush', 'table', String(REF_TABLE)]);
        return { refAddFlowsMs, refReplaceFlowsMs, refIpBatchMs, refIpRouteAddMs };
      };

      const load = loadavg();
      // Alternate which side goes first, so neither always runs on the warmer (or busier) machine.
      const weftFirst = r % 2 === 1;
      let w: Awaited<ReturnType<typeof weft>>;
      let ref: Awaited<ReturnType<typeof references>>;
      if (weftFirst) {
        w = await weft();
        ref = await references();
      } else {
        ref = await references();
        w = await weft();
      }
      log(
        `(a) weft ${w.applyMs.toFixed(0)} ms vs add-flows ${ref.refAddFlowsMs.toFixed(0)} + ip -batch ${ref.refIpBatchMs.toFixed(0)} ms; ` +
          `(b) weft ${w.addMs.toFixed(0)} ms vs replace-flows ${ref.refReplaceFlowsMs.toFixed(0)} + ip route add ${ref.refIpRouteAddMs.toFixed(0)} ms`,
      );
      return { run: r, order: weftFirst ? 'weft first' : 'references first', load, prepareMs, startMs, attachMs, ...w, ...ref };
    } finally {
      await backend.close();
    }
  }

  async close(): Promise<void> {
    await this.plain.vsctl(['--if-exists', 'del-br', BRIDGE]).catch(() => undefined);
    await this.plain.vsctl(['--if-exists', 'del-br', REF_BRIDGE]).catch(() => undefined);
    this.nl.close();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

async function inner(): Promise<void> {
  // Everything below programs the current network namespace.
  assertPrivateNetns();
  const runDir = args['run-dir'];
  const workDir = args['work-dir'];
  if (!runDir || !workDir) throw new BenchError('--inner needs --run-dir and --work-dir');
  mkdirSync(workDir, { recursive: true });
  const runs = positive('--runs', args.runs);
  const bench = new Inner(runDir, workDir, positive('--peers', args.peers), positive('--pods', args.pods));
  const onSignal = () => {
    // The outer process owns the namespace and OVS and removes them.
    process.exit(130);
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);
  try {
    await bench.setup();
    const results: RunResult[] = [];
    for (let r = 1; r <= runs; r++) results.push(await bench.runOnce(r));
    const ovsVersion = (await tool('ovs-vswitchd', ['--version'])).split('\n')[0]!.trim();
    const out: InnerResult = { peers: bench.nPeers, pods: bench.nPods, ovsVersion, runs: results };
    process.stdout.write(`${RESULT_MARK}${JSON.stringify(out)}\n`);
  } finally {
    await bench.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Outer part: namespace, OVS, the inner process, the table

function positive(name: string, text: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new BenchError(`${name}: a positive integer, got ${JSON.stringify(text)}`);
  return n;
}

const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);
function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return s[lo]! + (s[hi]! - s[lo]!) * (pos - lo);
}
const median = (xs: readonly number[]): number => quantile(xs, 0.5);
const f0 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(0));
const f1 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(1));
const f2 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(2));
const loadavg = (): string => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

function printTable(header: string[], rows: string[][]): void {
  console.log(`| ${header.join(' | ')} |`);
  console.log(`|${header.map(() => '---').join('|')}|`);
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
}

/** Runs the inner part in `ns`; resolves with its result line. */
function runInner(ns: string, runDir: string, workDir: string, track: (c: ChildProcess) => void): Promise<InnerResult> {
  const a = ['netns', 'exec', ns, process.execPath, '--import', 'tsx', SELF, '--inner', '--run-dir', runDir, '--work-dir', workDir, '--runs', args.runs, '--peers', args.peers, '--pods', args.pods];
  // `ip netns exec` execs node in place: the child's pid is node's.
  // TMPDIR: weft's own temporary flow files land in workDir too, so an interrupted run leaves none behind.
  mkdirSync(workDir, { recursive: true });
  const child = spawn('ip', a, { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, TMPDIR: workDir } });
  track(child);
  let stdout = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => {
      const line = stdout.split('\n').find((l) => l.startsWith(RESULT_MARK));
      if (code !== 0 || !line) {
        reject(new BenchError(`the measuring process in ${ns} ended with ${signal ?? `status ${code}`}${line ? '' : ' and no result'}${stdout.trim() ? `; stdout: ${stdout.trim().slice(0, 500)}` : ''}`));
        return;
      }
      resolve(JSON.parse(line.slice(RESULT_MARK.length)) as InnerResult);
    });
  });
}

function report(res: InnerResult): void {
  const rs = res.runs;
  const col = (f: (r: RunResult) => number) => rs.map(f);
  const peers = res.peers.toLocaleString('en-US');
  console.log(`\n## ${peers} peers, ${res.pods} pods: medians of ${rs.length} runs (ms)\n`);
  const rows: string[][] = [];
  const row = (what: string, weft: number[], ref: number[] | null, refWhat = '') => {
    const w = median(weft);
    const r = ref ? median(ref) : NaN;
    rows.push([what, f1(w), ref ? `${f1(r)}${refWhat ? ` (${refWhat})` : ''}` : '–', ref ? f2(w / r) : '–']);
  };
  const refA = col((r) => r.refAddFlowsMs + r.refIpBatchMs);
  const refB = col((r) => r.refReplaceFlowsMs + r.refIpRouteAddMs);
  row(`(a) ${peers} peers: complete flow set + ${peers} host routes`, col((r) => r.applyMs), refA, 'add-flows + ip -batch');
  row('(a) flow part (up to the last OVS call)', col((r) => r.applyFlowsMs), col((r) => r.refAddFlowsMs), '--bundle add-flows, empty bridge');
  row('(a) host-route part (after it)', col((r) => r.applyRoutesMs), col((r) => r.refIpBatchMs), 'ip -batch');
  row('(b) one peer added', col((r) => r.addMs), col((r) => r.refReplaceFlowsMs), '--bundle replace-flows');
  row('(b) one peer added', col((r) => r.addMs), refB, 'replace-flows + ip route add');
  row('(b) flow part', col((r) => r.addFlowsMs), col((r) => r.refReplaceFlowsMs), '--bundle replace-flows');
  row('(b) host-route part', col((r) => r.addRoutesMs), col((r) => r.refIpRouteAddMs), 'ip route add');
  row('prepare() (bridge, tunnel and gateway ports)', col((r) => r.prepareMs), null);
  row('start(lease) (gateway address, round, node flows)', col((r) => r.startMs), null);
  row('attachPodPort, per pod (median)', col((r) => median(r.attachMs)), null);
  row('attachPodPort, per pod (p90)', col((r) => quantile(r.attachMs, 0.9)), null);
  row(`attachPodPort, all ${res.pods}`, col((r) => sum(r.attachMs)), null);
  const k = Math.min(20, res.pods);
  row(`attachPodPort, first ${k} pods (median)`, col((r) => median(r.attachMs.slice(0, k))), null);
  row(`attachPodPort, last ${k} pods (median)`, col((r) => median(r.attachMs.slice(-k))), null);
  printTable(['what', 'weft ms', 'reference ms', 'ratio'], rows);

  console.log('\n## Per run (ms)\n');
  const per: string[][] = [];
  const line = (what: string, f: (r: RunResult) => number | string) => per.push([what, ...rs.map((r) => (typeof f(r) === 'number' ? f0(f(r) as number) : String(f(r))))]);
  line('order', (r) => r.order);
  line('load average before the timed part', (r) => r.load);
  line('(a) weft apply()', (r) => r.applyMs);
  line('(a) reference add-flows / ip -batch', (r) => `${f0(r.refAddFlowsMs)} / ${f0(r.refIpBatchMs)}`);
  line('(a) ratio', (r) => f2(r.applyMs / (r.refAddFlowsMs + r.refIpBatchMs)));
  line('(b) weft apply()', (r) => r.addMs);
  line('(b) reference replace-flows / ip route add', (r) => `${f0(r.refReplaceFlowsMs)} / ${f0(r.refIpRouteAddMs)}`);
  line('(b) ratio to replace-flows', (r) => f2(r.addMs / r.refReplaceFlowsMs));
  line('flows after (a) / (b) (checked: count and diff-flows)', (r) => `${r.flowsA} / ${r.flowsB}`);
  line('attachPodPort median / p90 / max', (r) => `${f0(median(r.attachMs))} / ${f0(quantile(r.attachMs, 0.9))} / ${f0(Math.max(...r.attachMs))}`);
  printTable(['what', ...rs.map((r) => `run ${r.run}`)], per);

  for (const [label, key] of [['(a)', 'applyCalls'], ['(b)', 'addCalls']] as const) {
    console.log(`\n## OVS processes weft ran during ${label} (median over runs: count, ms)\n`);
    const names = [...new Set(rs.flatMap((r) => Object.keys(r[key])))];
    const total = (r: RunResult) => sum(Object.values(r[key]).map((c) => c.ms));
    const rowsC = names.map((n) => [n, f0(median(rs.map((r) => r[key][n]?.n ?? 0))), f1(median(rs.map((r) => r[key][n]?.ms ?? 0)))]);
    rowsC.push(['all of them', '', f1(median(rs.map(total)))]);
    rowsC.push(['apply() outside those processes (flock(1), netlink incl. the host routes, building and diffing in Node)', '', f1(median(rs.map((r) => (key === 'applyCalls' ? r.applyMs : r.addMs) - total(r))))]);
    printTable(['process', 'count', 'ms'], rowsC);
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces, Open vSwitch)');
  positive('--runs', args.runs);
  positive('--peers', args.peers);
  positive('--pods', args.pods);
  const ns = nsPrefix('bovs');
  const dir = mkdtempSync(join(tmpdir(), 'weft-bench-ovs-'));
  let ovs: OvsInstance | null = null;
  let child: ChildProcess | null = null;
  let cleaned: Promise<void> | null = null;
  const cleanup = () =>
    (cleaned ??= (async () => {
      if (child && child.exitCode === null && child.signalCode === null) {
        const c = child;
        const exited = new Promise((resolve) => c.once('close', resolve));
        c.kill('SIGTERM');
        const timer = setTimeout(() => c.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
      await ovs?.stop().catch((e: Error) => console.error(`stopping OVS: ${e.message}`));
      await delNetns(ns);
      rmSync(dir, { recursive: true, force: true });
    })());
  const onSignal = (sig: NodeJS.Signals) => {
    console.error(`\n${sig}: cleaning up`);
    void cleanup().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);

  const cpu = cpus();
  const kernel = (await tool('uname', ['-r'])).trim();
  console.log(`machine: ${cpu.length} × ${cpu[0]?.model ?? '?'}, kernel ${kernel}, node ${process.version}`);
  console.log(`load average at start: ${loadavg()}`);
  const began = performance.now();
  let res: InnerResult;
  try {
    await addNetns(ns);
    ovs = await OvsInstance.start(ns, join(dir, 'ovs'), { flowRestoreWait: false });
    res = await runInner(ns, ovs.runDir, join(dir, 'work'), (c) => (child = c));
  } finally {
    await cleanup();
  }
  console.log(`${res.ovsVersion}, userspace (netdev) datapath; finished in ${f0((performance.now() - began) / 1000)} s; load average at end: ${loadavg()}`);
  report(res);
}

const entry = args.inner ? inner : main;
entry().catch((e: unknown) => {
  console.error(e instanceof Error ? `${e.name}: ${e.message}` : e);
  process.exitCode = 1;
});
