// The ovs backend's programming speed at 1 000 peers and 200 local pods, next to the floor for the
// same work measured in the same run (issues 8, 15). No packet is sent; what is timed is OpenFlow
// and kernel state.
//
// Measured, per run, with the real OvsBackend (prepare → start(lease) → pods → apply(batch)):
//   pods: attachPodPort + detachPodPort of one probe pod, --samples times, on a bridge with no other
//       pod ("pod 1") and again with --pods − 1 others ("pod 200"), as the CNI plugin's OVS part;
//       every other pod's attachPodPort is timed too;
//   (a) "lease set known" → "complete flow set installed and every host route in the kernel": one
//       apply() with all N peer leases, on a bridge that already holds the node's and the pods'
//       flows (start() and the plugin put them there) — the first pass after start;
//   (b) one peer added: apply([added]) on top of (a) — an event, a delta — and (c) the same peer
//       removed: apply([removed]); --samples pairs, alternating with the references.
// References, same run, same namespace, same ovs-vswitchd:
//   - `ovs-ofctl -O OpenFlow15 --bundle add-flows` of exactly the flow file of (a) onto an empty
//     bridge `br-ref` (the floor for installing that table), and `ip -batch` of the N host routes
//     (`route add S via G dev D onlink proto 88`, weft's form) on a veth of its own, in table 100;
//   - for (b) `ovs-ofctl --bundle add-flows` of the peer's 3 flows onto br-ref holding the (a) table
//     plus one `ip route add`; for (c) `ovs-ofctl --bundle del-flows cookie=<peer>/-1` plus one
//     `ip route del`.
// Every measurement is checked afterwards: dump-flows count and `diff-flows` against the expected
// table (empty) after (a) and after the last (b) and (c), the peer's flows and route after each
// sample, the round number, route count and form. A failed check ends the bench with status 1.
//
// Layout: one namespace `wt-bovs-<pid>` holding a private Open vSwitch (userspace "netdev" datapath,
// run/db/log dirs in a temporary directory, test/helpers/ovs.ts). The backend programs weft-gw0 and
// routes through netlink in its own network namespace, so the measuring part is this file re-run
// inside that namespace (`ip netns exec <ns> node --import tsx bench/ovs.ts --inner …`); it prints
// its results as one JSON line, which the outer process turns into the table.
//
//   node --import tsx bench/ovs.ts [--runs 3] [--peers 1000] [--pods 200] [--samples 20]
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
import { desiredFlows, gatewayOf, macFromIP, peerCookie, peerFlows, podCookie, podFlows, renderFlows, type NodePorts, type PeerNode } from '../src/backend/ovs/pipeline.js';
import { attachPodPort, detachPodPort } from '../src/backend/ovs/podport.js';
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
    samples: { type: 'string', default: '20' },
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

type Calls = Record<string, { n: number; ms: number }>;

/** A probe phase: the pod's attach/detach by weft (with its OVS processes) and by hand. */
interface Probe {
  readonly attachMs: number[];
  readonly detachMs: number[];
  readonly calls: Calls[];
  readonly refAttachMs: number[];
  readonly refDetachMs: number[];
}

/** One event sample: weft's apply(), the reference's two commands, and the OVS processes weft ran. */
interface EventSample {
  readonly weftMs: number;
  readonly refFlowsMs: number;
  readonly refRouteMs: number;
  /** The same ovs-ofctl command on br-int itself, for another peer not in the set (what the bridge's size and ports cost). */
  readonly refBrIntFlowsMs: number;
  readonly calls: Calls;
}

interface RunResult {
  readonly run: number;
  readonly order: 'weft first' | 'references first';
  /** /proc/loadavg (1, 5, 15 min) before the timed part: other work on the machine disturbs. */
  readonly load: string;
  readonly prepareMs: number;
  readonly startMs: number;
  /** Every pod's attachPodPort, in order (the probe's samples not included). */
  readonly attachMs: number[];
  /** The probe pod attached and detached on a bridge with no other pod, then with pods − 1 others. */
  readonly first: Probe;
  readonly last: Probe;
  readonly flowsA: number;
  /** (a): the whole apply(), its part up to the end of the last OVS process, and the rest (host routes). */
  readonly applyMs: number;
  readonly applyFlowsMs: number;
  readonly applyRoutesMs: number;
  readonly applyCalls: Calls;
  readonly refAddFlowsMs: number;
  readonly refIpBatchMs: number;
  /** (b) one peer added, (c) removed: one entry per sample. */
  readonly add: EventSample[];
  readonly remove: EventSample[];
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
    /** Samples per probe phase and per event kind. */
    readonly samples: number,
  ) {
    this.plain = new OvsClient({ runDir, timeoutSeconds: 60 });
    this.leases = Array.from({ length: nPeers }, (_, i) => peerLease(i));
    this.extra = peerLease(nPeers);
    this.pods = Array.from({ length: nPods }, (_, i) => pod(i));
    if (nPods + 2 > 254) throw new BenchError('--pods: at most 252 (one /24)');
    if (nPods < 2) throw new BenchError('--pods: at least 2 (the probe is the last one)');
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

  /** Attaches pod `i` the way the CNI plugin does (after start: subnet.env exists). */
  private attach(ovs: OvsClient, i: number): Promise<number> {
    const p = this.pods[i]!;
    return attachPodPort(ovs, {
      bridge: BRIDGE,
      hostIface: p.host,
      containerId: `bench-${i}`,
      ifName: 'eth0',
      ip: p.ip,
      mac: macFromIP(p.ip),
      gateway: gatewayOf(OWN_SUBNET),
      podName: `pod-${i}`,
      podNamespace: 'bench',
    });
  }

  /**
   * ovs-vswitchd re-reads the routing table after every route change (its tunnel route cache),
   * holding up OpenFlow requests meanwhile: each measured step starts once the last route change
   * has been absorbed (two OpenFlow round trips), so no side pays for the one before.
   */
  private async settle(): Promise<void> {
    for (let i = 0; i < 2; i++) await this.plain.dumpFlows(BRIDGE, 'cookie=0x1/-1');
  }

  /** `samples` × (attach, detach) of pod `i`; the pod's 5 flows are checked after each attach, their absence after each detach. */
  private async probe(ovs: TimedOvsClient, i: number, round: number | null, others: number): Promise<Probe> {
    const out: Probe = { attachMs: [], detachMs: [], calls: [], refAttachMs: [], refDetachMs: [] };
    const r = round ?? 1;
    const podFlowsOf = async (ofport: number) => (await this.plain.dumpFlows(BRIDGE, `cookie=0x${podCookie(r, ofport).toString(16)}/-1`)).length;
    const weft = async (k: number) => {
      await this.settle();
      let t = performance.now();
      const ofport = await this.attach(ovs, i);
      const end = performance.now();
      out.attachMs.push(end - t);
      out.calls.push(ovs.between(t, end));
      if ((await podFlowsOf(ofport)) !== 5) throw new BenchCheckError(`probe pod (${others} others) sample ${k}: its flows`, await podFlowsOf(ofport), 5);
      await this.settle();
      t = performance.now();
      await detachPodPort(ovs, BRIDGE, { containerId: `bench-${i}`, ifName: 'eth0' });
      out.detachMs.push(performance.now() - t);
      if ((await podFlowsOf(ofport)) !== 0) throw new BenchCheckError(`probe pod (${others} others) sample ${k}: flows after detach`, await podFlowsOf(ofport), 0);
    };
    // The same OVS work by hand: the port with the same external_ids, its ofport, its 5 flows; then
    // the flows by cookie and the port. The floor for a CLI-driven attach at this bridge size.
    const p = this.pods[i]!;
    const vsctl = (a: readonly string[]) => ['--db', `unix:${join(this.runDir, 'db.sock')}`, '--timeout=60', ...a];
    const ids = Object.entries({ 'weft-container-id': `ref-${i}`, 'weft-ifname': 'eth0', 'weft-ip': p.ip.toString(), 'attached-mac': macFromIP(p.ip) }).map(
      ([k, v]) => `external_ids:${k}=${JSON.stringify(v)}`,
    );
    const ref = async (k: number) => {
      await this.settle();
      let t = performance.now();
      await tool('ovs-vsctl', vsctl(['--may-exist', 'add-port', BRIDGE, p.host, '--', 'set', 'interface', p.host, ...ids]));
      const ofport = Number((await tool('ovs-vsctl', vsctl(['get', 'interface', p.host, 'ofport']))).trim());
      const file = join(this.dir, 'ref-pod.txt');
      writeFileSync(file, renderFlows(podFlows(r, { gatewayMAC: macFromIP(gatewayOf(OWN_SUBNET)) }, { ofport, ip: p.ip, mac: macFromIP(p.ip) })));
      await tool('ovs-ofctl', ['-O', 'OpenFlow15', '--no-names', '--bundle', 'add-flows', `unix:${this.plain.mgmtSocket(BRIDGE)}`, file], this.env);
      out.refAttachMs.push(performance.now() - t);
      if ((await podFlowsOf(ofport)) !== 5) throw new BenchCheckError(`reference probe (${others} others) sample ${k}: its flows`, await podFlowsOf(ofport), 5);
      await this.settle();
      t = performance.now();
      await tool('ovs-ofctl', ['-O', 'OpenFlow15', '--no-names', 'del-flows', `unix:${this.plain.mgmtSocket(BRIDGE)}`, `cookie=0x${podCookie(r, ofport).toString(16)}/-1`], this.env);
      await tool('ovs-vsctl', vsctl(['--if-exists', 'del-port', BRIDGE, p.host]));
      out.refDetachMs.push(performance.now() - t);
      if ((await podFlowsOf(ofport)) !== 0) throw new BenchCheckError(`reference probe (${others} others) sample ${k}: flows after detach`, await podFlowsOf(ofport), 0);
    };
    for (let k = 0; k < this.samples; k++) {
      if (k % 2 === 0) {
        await weft(k);
        await ref(k);
      } else {
        await ref(k);
        await weft(k);
      }
    }
    const ports = (await listPodInterfaces(this.plain, BRIDGE)).length;
    if (ports !== others) throw new BenchCheckError('pod ports around the probe', ports, others);
    return out;
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

      // The probe is the last pod: attached and detached alone, then as the last of all.
      const probe = this.nPods - 1;
      const first = await this.probe(ovs, probe, await readRound(this.plain, BRIDGE), 0);
      const attachMs: number[] = [];
      for (let i = 0; i < probe; i++) {
        t = performance.now();
        await this.attach(ovs, i);
        attachMs.push(performance.now() - t);
      }
      const last = await this.probe(ovs, probe, await readRound(this.plain, BRIDGE), probe);
      await this.attach(ovs, probe);
      log(
        `prepare ${prepareMs.toFixed(0)} ms, start ${startMs.toFixed(0)} ms, ${probe} pods attached in ${sum(attachMs).toFixed(0)} ms; ` +
          `probe attach p90 ${quantile(first.attachMs, 0.9).toFixed(0)} ms alone, ${quantile(last.attachMs, 0.9).toFixed(0)} ms with ${probe} others`,
      );

      // The bridge was created by this run, so the backend took round 1 (checked after (a)).
      const round = nextRound(null);
      const all = [...this.leases, this.extra];
      const textA = await this.expectedFlows(round, this.leases);
      const textB = await this.expectedFlows(round, all);
      const fileA = join(this.dir, `flows-${r}-a.txt`);
      const filePeer = join(this.dir, `flows-${r}-peer.txt`);
      writeFileSync(fileA, textA);
      const gatewayIP = gatewayOf(OWN_SUBNET);
      writeFileSync(filePeer, renderFlows(peerFlows(round, { vni: 1, gatewayMAC: macFromIP(gatewayIP) }, peerNode(this.extra))));
      const peerSelector = `cookie=0x${peerCookie(round, this.extra.subnet!).toString(16)}/-1`;
      // A peer weft is never told about, for the reference on br-int itself.
      const other = peerLease(this.nPeers + 1);
      const fileOther = join(this.dir, `flows-${r}-other.txt`);
      writeFileSync(fileOther, renderFlows(peerFlows(round, { vni: 1, gatewayMAC: macFromIP(gatewayOf(OWN_SUBNET)) }, peerNode(other))));
      const otherSelector = `cookie=0x${peerCookie(round, other.subnet!).toString(16)}/-1`;
      const routesFile = join(this.dir, `routes-${r}.batch`);
      const routeLine = (l: Lease) => `${l.subnet!.toString()} via ${gatewayOf(l.subnet!).toString()} dev ${REF_DEV} onlink proto ${WEFT_ROUTE_PROTOCOL} table ${REF_TABLE}`;
      writeFileSync(routesFile, this.leases.map((l) => `route add ${routeLine(l)}\n`).join(''));
      // --no-names, as weft: ports by number, no port table fetched first.
      const ofctl = (cmd: string, arg: string, bridge = REF_BRIDGE) => ['-O', 'OpenFlow15', '--no-names', '--bundle', cmd, `unix:${this.plain.mgmtSocket(bridge)}`, arg];

      const load = loadavg();
      // Alternate which side goes first, so neither always runs on the warmer (or busier) machine.
      const weftFirst = r % 2 === 1;

      // (a): the first pass with every peer, against add-flows of the same table and ip -batch.
      const weftA = async () => {
        const batch: LeaseEvent[] = this.leases.map((lease) => ({ type: 'added', lease }));
        const t0 = performance.now();
        const pass = await backend.apply(batch);
        const t1 = performance.now();
        if (pass.failures !== 0) throw new BenchCheckError('(a) weft apply() failures', pass.failures, 0);
        const flowsA = await this.checkFlows(BRIDGE, textA, '(a) weft');
        await this.checkWeftRoutes(this.leases, '(a) weft');
        const saved = await readRound(this.plain, BRIDGE);
        if (saved !== round) throw new BenchCheckError('(a) round saved on the bridge', saved, round);
        const endA = ovs.lastEndBefore(t1);
        return { flowsA, applyMs: t1 - t0, applyFlowsMs: endA - t0, applyRoutesMs: t1 - endA, applyCalls: ovs.between(t0, t1) };
      };
      const refA = async () => {
        if ((await this.plain.dumpFlows(REF_BRIDGE)).length !== 0) throw new BenchCheckError(`${REF_BRIDGE} before add-flows`, 'flows', 'empty');
        const refAddFlowsMs = await timedTool('ovs-ofctl', ofctl('add-flows', fileA), this.env);
        await this.checkFlows(REF_BRIDGE, textA, '(a) reference add-flows');
        const refIpBatchMs = await timedTool('ip', ['-batch', routesFile]);
        const nA = await this.refRouteCount();
        if (nA !== this.nPeers) throw new BenchCheckError('(a) reference ip -batch: routes', nA, this.nPeers);
        return { refAddFlowsMs, refIpBatchMs };
      };
      const [a, ra] = weftFirst ? [await weftA(), await refA()] : await refA().then(async (x) => [await weftA(), x] as const);

      // (b), (c): one peer added and removed, as events, on top of (a); the references on br-ref
      // holding the (a) table and table 100 holding the (a) routes.
      const settle = () => this.settle();
      const weftEvent = async (type: 'added' | 'removed', k: number) => {
        await settle();
        const t0 = performance.now();
        const pass = await backend.apply([{ type, lease: this.extra }]);
        const t1 = performance.now();
        if (pass.failures !== 0) throw new BenchCheckError(`(${type}) weft apply() failures, sample ${k}`, pass.failures, 0);
        const want = type === 'added' ? 3 : 0;
        const got = (await this.plain.dumpFlows(BRIDGE, peerSelector)).length;
        if (got !== want) throw new BenchCheckError(`(${type}) weft: the peer's flows, sample ${k}`, got, want);
        const routes = (await this.nl.routes({ family: 4, table: 254, protocol: WEFT_ROUTE_PROTOCOL })).filter((x) => x.dst.equals(this.extra.subnet!)).length;
        if (routes !== want / 3) throw new BenchCheckError(`(${type}) weft: the peer's route, sample ${k}`, routes, want / 3);
        return { weftMs: t1 - t0, calls: ovs.between(t0, t1) };
      };
      const refEvent = async (type: 'added' | 'removed', k: number) => {
        await settle();
        const refFlowsMs = type === 'added' ? await timedTool('ovs-ofctl', ofctl('add-flows', filePeer), this.env) : await timedTool('ovs-ofctl', ofctl('del-flows', peerSelector), this.env);
        const refBrIntFlowsMs =
          type === 'added' ? await timedTool('ovs-ofctl', ofctl('add-flows', fileOther, BRIDGE), this.env) : await timedTool('ovs-ofctl', ofctl('del-flows', otherSelector, BRIDGE), this.env);
        const refRouteMs = await timedTool('ip', ['route', type === 'added' ? 'add' : 'del', ...routeLine(this.extra).split(' ')]);
        const want = type === 'added' ? 3 : 0;
        const got = (await this.plain.dumpFlows(REF_BRIDGE, peerSelector)).length;
        if (got !== want) throw new BenchCheckError(`(${type}) reference: the peer's flows, sample ${k}`, got, want);
        const gotBrInt = (await this.plain.dumpFlows(BRIDGE, otherSelector)).length;
        if (gotBrInt !== want) throw new BenchCheckError(`(${type}) reference on ${BRIDGE}: the other peer's flows, sample ${k}`, gotBrInt, want);
        const n = await this.refRouteCount();
        if (n !== this.nPeers + want / 3) throw new BenchCheckError(`(${type}) reference: routes, sample ${k}`, n, this.nPeers + want / 3);
        return { refFlowsMs, refRouteMs, refBrIntFlowsMs };
      };
      const add: EventSample[] = [];
      const remove: EventSample[] = [];
      for (let k = 0; k < this.samples; k++) {
        for (const type of ['added', 'removed'] as const) {
          const both = (k + (weftFirst ? 0 : 1)) % 2 === 0 ? [await weftEvent(type, k), await refEvent(type, k)] as const : await refEvent(type, k).then(async (x) => [await weftEvent(type, k), x] as const);
          (type === 'added' ? add : remove).push({ ...both[0], ...both[1] });
        }
        if (k === 0) {
          // The whole table and every route, once with the peer and once without.
          await backend.apply([{ type: 'added', lease: this.extra }]);
          await this.checkFlows(BRIDGE, textB, '(b) weft');
          await this.checkWeftRoutes(all, '(b) weft');
          await backend.apply([{ type: 'removed', lease: this.extra }]);
          await this.checkFlows(BRIDGE, textA, '(c) weft');
          await this.checkWeftRoutes(this.leases, '(c) weft');
        }
      }
      await this.checkFlows(REF_BRIDGE, textA, '(c) reference');
      await tool('ip', ['route', 'flush', 'table', String(REF_TABLE)]);
      log(
        `(a) weft ${a.applyMs.toFixed(0)} ms vs add-flows ${ra.refAddFlowsMs.toFixed(0)} + ip -batch ${ra.refIpBatchMs.toFixed(0)} ms; ` +
          `(b) add weft ${median(add.map((x) => x.weftMs)).toFixed(1)} ms vs ${median(add.map((x) => x.refFlowsMs + x.refRouteMs)).toFixed(1)} ms; ` +
          `(c) remove weft ${median(remove.map((x) => x.weftMs)).toFixed(1)} ms vs ${median(remove.map((x) => x.refFlowsMs + x.refRouteMs)).toFixed(1)} ms`,
      );
      return {
        run: r,
        order: weftFirst ? 'weft first' : 'references first',
        load,
        prepareMs,
        startMs,
        attachMs,
        first,
        last,
        ...a,
        ...ra,
        add,
        remove,
      };
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
  const bench = new Inner(runDir, workDir, positive('--peers', args.peers), positive('--pods', args.pods), positive('--samples', args.samples));
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
  const a = ['netns', 'exec', ns, process.execPath, '--import', 'tsx', SELF, '--inner', '--run-dir', runDir, '--work-dir', workDir, '--runs', args.runs, '--peers', args.peers, '--pods', args.pods, '--samples', args.samples];
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
  const n = rs[0]?.add.length ?? 0;
  console.log(`\n## ${peers} peers, ${res.pods} pods: medians over ${rs.length} runs (events and probes: the median of each run's ${n} samples) (ms)\n`);
  const rows: string[][] = [];
  const row = (what: string, weft: number[], ref: number[] | null, refWhat = '', target = '') => {
    const w = median(weft);
    const r = ref ? median(ref) : NaN;
    rows.push([what, f1(w), ref ? `${f1(r)}${refWhat ? ` (${refWhat})` : ''}` : '–', ref ? f2(w / r) : '–', target]);
  };
  const ev = (xs: readonly EventSample[], f: (x: EventSample) => number) => median(xs.map(f));
  row(`(a) ${peers} peers: complete flow set + ${peers} host routes (first pass)`, col((r) => r.applyMs), col((r) => r.refAddFlowsMs + r.refIpBatchMs), 'add-flows + ip -batch');
  row('(a) flow part (up to the last OVS call)', col((r) => r.applyFlowsMs), col((r) => r.refAddFlowsMs), '--bundle add-flows, empty bridge');
  row('(a) host-route part (after it)', col((r) => r.applyRoutesMs), col((r) => r.refIpBatchMs), 'ip -batch');
  row('**(b) one peer added** (event)', col((r) => ev(r.add, (x) => x.weftMs)), col((r) => ev(r.add, (x) => x.refFlowsMs + x.refRouteMs)), '--bundle add-flows of its 3 flows + ip route add', '≤ 1.5');
  row('(b) reference parts: add-flows / ip route add', col((r) => ev(r.add, (x) => x.refFlowsMs)), col((r) => ev(r.add, (x) => x.refRouteMs)), 'ip route add');
  row(`(b) weft vs the same add-flows on ${BRIDGE} itself`, col((r) => ev(r.add, (x) => x.weftMs)), col((r) => ev(r.add, (x) => x.refBrIntFlowsMs)), `--bundle add-flows onto ${BRIDGE}`);
  row('**(c) one peer removed** (event)', col((r) => ev(r.remove, (x) => x.weftMs)), col((r) => ev(r.remove, (x) => x.refFlowsMs + x.refRouteMs)), '--bundle del-flows cookie=…/-1 + ip route del', '≤ 1.5');
  row('(c) reference parts: del-flows / ip route del', col((r) => ev(r.remove, (x) => x.refFlowsMs)), col((r) => ev(r.remove, (x) => x.refRouteMs)), 'ip route del');
  row(`(c) weft vs the same del-flows on ${BRIDGE} itself`, col((r) => ev(r.remove, (x) => x.weftMs)), col((r) => ev(r.remove, (x) => x.refBrIntFlowsMs)), `--bundle del-flows on ${BRIDGE}`);
  row('prepare() (bridge, tunnel and gateway ports)', col((r) => r.prepareMs), null);
  row('start(lease) (gateway address, round, node flows)', col((r) => r.startMs), null);
  const last = res.pods;
  const p90 = (xs: readonly number[]) => quantile(xs, 0.9);
  row(`**attachPodPort p90: pod ${last} vs pod 1**`, col((r) => p90(r.last.attachMs)), col((r) => p90(r.first.attachMs)), 'pod 1', '≤ 1.2');
  row(`(reference) by hand: add-port + get + add-flows, p90: pod ${last} vs pod 1`, col((r) => p90(r.last.refAttachMs)), col((r) => p90(r.first.refAttachMs)), 'pod 1');
  row('attachPodPort p90 vs by hand, pod 1', col((r) => p90(r.first.attachMs)), col((r) => p90(r.first.refAttachMs)), 'by hand');
  row(`attachPodPort p90 vs by hand, pod ${last}`, col((r) => p90(r.last.attachMs)), col((r) => p90(r.last.refAttachMs)), 'by hand');
  row(`attachPodPort median: pod ${last} vs pod 1`, col((r) => median(r.last.attachMs)), col((r) => median(r.first.attachMs)), 'pod 1');
  row(`detachPodPort p90: pod ${last} vs pod 1`, col((r) => p90(r.last.detachMs)), col((r) => p90(r.first.detachMs)), 'pod 1');
  row(`(reference) by hand: del-flows + del-port, p90: pod ${last} vs pod 1`, col((r) => p90(r.last.refDetachMs)), col((r) => p90(r.first.refDetachMs)), 'pod 1');
  row(`attachPodPort, pods 1..${last - 1} one after the other (median)`, col((r) => median(r.attachMs)), null);
  row(`attachPodPort, all ${last - 1} of them`, col((r) => sum(r.attachMs)), null);
  printTable(['what', 'weft ms', 'reference ms', 'ratio', 'target'], rows);

  console.log('\n## Per run (ms)\n');
  const per: string[][] = [];
  const line = (what: string, f: (r: RunResult) => number | string) => per.push([what, ...rs.map((r) => (typeof f(r) === 'number' ? f0(f(r) as number) : String(f(r))))]);
  const l1 = (what: string, f: (r: RunResult) => string) => per.push([what, ...rs.map(f)]);
  line('order', (r) => r.order);
  line('load average before the timed part', (r) => r.load);
  line('(a) weft apply()', (r) => r.applyMs);
  line('(a) reference add-flows / ip -batch', (r) => `${f0(r.refAddFlowsMs)} / ${f0(r.refIpBatchMs)}`);
  line('(a) ratio', (r) => f2(r.applyMs / (r.refAddFlowsMs + r.refIpBatchMs)));
  l1('(b) add: weft / reference, median', (r) => `${f1(ev(r.add, (x) => x.weftMs))} / ${f1(ev(r.add, (x) => x.refFlowsMs + x.refRouteMs))}`);
  l1('(b) ratio (median, p90 of weft / median of reference)', (r) => `${f2(ev(r.add, (x) => x.weftMs) / ev(r.add, (x) => x.refFlowsMs + x.refRouteMs))}, ${f2(quantile(r.add.map((x) => x.weftMs), 0.9) / ev(r.add, (x) => x.refFlowsMs + x.refRouteMs))}`);
  l1('(c) remove: weft / reference, median', (r) => `${f1(ev(r.remove, (x) => x.weftMs))} / ${f1(ev(r.remove, (x) => x.refFlowsMs + x.refRouteMs))}`);
  l1('(c) ratio (median, p90 of weft / median of reference)', (r) => `${f2(ev(r.remove, (x) => x.weftMs) / ev(r.remove, (x) => x.refFlowsMs + x.refRouteMs))}, ${f2(quantile(r.remove.map((x) => x.weftMs), 0.9) / ev(r.remove, (x) => x.refFlowsMs + x.refRouteMs))}`);
  line('flows after (a) (checked: count and diff-flows)', (r) => r.flowsA);
  const mpm = (xs: readonly number[]) => `${f0(median(xs))} / ${f0(quantile(xs, 0.9))} / ${f0(Math.max(...xs))}`;
  l1('probe attach pod 1: median / p90 / max (by hand)', (r) => `${mpm(r.first.attachMs)} (${mpm(r.first.refAttachMs)})`);
  l1(`probe attach pod ${last}: median / p90 / max (by hand)`, (r) => `${mpm(r.last.attachMs)} (${mpm(r.last.refAttachMs)})`);
  l1('p90 ratio pod last / pod 1 (by hand)', (r) => `${f2(quantile(r.last.attachMs, 0.9) / quantile(r.first.attachMs, 0.9))} (${f2(quantile(r.last.refAttachMs, 0.9) / quantile(r.first.refAttachMs, 0.9))})`);
  printTable(['what', ...rs.map((r) => `run ${r.run}`)], per);

  const sections: Array<[string, (r: RunResult) => Calls[]]> = [
    ['(a)', (r) => [r.applyCalls]],
    ['(b) one peer added, per event', (r) => r.add.map((x) => x.calls)],
    ['(c) one peer removed, per event', (r) => r.remove.map((x) => x.calls)],
    ['attachPodPort of pod 1', (r) => r.first.calls],
    [`attachPodPort of pod ${res.pods}`, (r) => r.last.calls],
  ];
  for (const [label, get] of sections) {
    console.log(`\n## OVS processes weft ran during ${label} (median: count, ms)\n`);
    const all = rs.flatMap(get);
    const names = [...new Set(all.flatMap((c) => Object.keys(c)))];
    const total = (c: Calls) => sum(Object.values(c).map((x) => x.ms));
    const rowsC = names.map((nm) => [nm, f0(median(all.map((c) => c[nm]?.n ?? 0))), f1(median(all.map((c) => c[nm]?.ms ?? 0)))]);
    rowsC.push(['all of them', '', f1(median(all.map(total)))]);
    printTable(['process', 'count', 'ms'], rowsC);
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces, Open vSwitch)');
  positive('--runs', args.runs);
  positive('--peers', args.peers);
  positive('--pods', args.pods);
  positive('--samples', args.samples);
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
