// Issue 19, NetworkPolicy in the OVS pipeline: one ovs node with 200 local pods, 2 000 remote pods
// and 500 policies (bench/lib/netpol-workload.ts with 200 pods per node on 11 nodes: node n1 is
// ours). Every figure is printed next to its reference from the same run, same ovs-vswitchd, and
// the issue's target:
//
//   build        the engine fed 20 namespaces, 2 200 pods and 500 policies; snapshot().
//   full         PolicyOvsDriver.sync(snapshot) from no policy flow on br-int, which holds the
//                pipeline's frame with the policy tables (pipelineFlows(…, {policy: true})) and the
//                traffic pods' flows: split into the driver's JavaScript (model, render), its
//                dump-flows and its bundle; --full-runs times from empty. Reference: `ovs-ofctl
//                --bundle add-flows` of the same flow file (the driver's own bundle text) onto
//                br-ref, a second bridge with the same frame and no policy flow. The flow count
//                (policy flows by kind; the whole table).
//   incremental  --changes pod label changes (local pods, app a ↔ a + 20: the pod leaves the
//                peers of 15 rules and joins those of 15 others, and five other policies select it;
//                its address's flows are shared by all those conjunctions, so 4 flows are
//                rewritten) and --changes policy changes (policy k's ingress port 80 ↔ 81: a new
//                rule and conjunction, the old one removed: ~50 flows, the 44 peer addresses'
//                among them), each timed from the engine call to driver.applyAll([delta])
//                resolved, split engine / driver JS / its bundle (the ovs-ofctl process), with the
//                GC pauses that fell inside (PerformanceObserver). Reference: the very flow mods
//                of that change (the bundle text the driver wrote) applied with `ovs-ofctl --bundle
//                add-flows` (OvsClient.bundleFlowMods, as the driver) to br-ref, which went
//                through the same mods before, so it holds the same table: the bundle of the
//                change's own flows. Which of the two goes first alternates (an untimed shadow
//                PolicyFlowModel gives the mods before the driver runs; the driver's bundle must
//                be exactly that text). Target: change p99 ≤ 1.5× the reference's p99. Beside
//                them: ovs-vswitchd's and the ovs-ofctl processes' CPU per bundle, and the floor
//                of a one-flow bundle on the loaded br-ref.
//   check        driver.check() (the timer's read-back) after the changes, and br-int's policy
//                flows equal br-ref's.
//   traffic      three pods on br-int (veth pairs, each pod in its own namespace, TX checksum
//                offload off as the CNI plugin does on netdev): workload pod 64 (app64) as client,
//                pod 144 (app44) running `iperf3 -s` and pod 44 (app44) running tcp-rr's server
//                (bench/lib/tcp-rr.c, compiled with gcc), both on TCP 80. The client is isolated in
//                egress (allowed by the ipBlock rules), the servers in ingress (allowed: TCP 80 from
//                app64). Alternating per round: (a) the pipeline without policy tables, (b) the
//                frame with the policy tables but no rule (conntrack only), (c) the frame with the
//                500 policies' flows. Per mode and round: iperf3 TCP one stream, TCP_RR (one
//                connection, 1-byte round trips) and TCP_CRR (connect, 1-byte round trip, close).
//                Conntrack is flushed before each measurement. Medians; ratios to (a) (target
//                ≥ 0.9: throughput, and RR/CRR latency without ÷ with) and to (b).
//
// How the policy path is proven: with policy, a connection to port 81 of the iperf server is
// dropped (refused without), and the packet counts of the allowing policies' flows (driver.check()
// then driver.counts(), weftd's metrics path) grow by the connections made during the policy runs:
// only a connection's first packet walks tables 52–55 (egress and ingress rules); every later
// packet and every reply is +est and goes from table 51 to the output.
//
//   node --import=tsx bench/netpol-ovs.ts [--changes 100] [--full-runs 3] [--rounds 5]
//       [--iperf-seconds 5] [--rr 5000] [--crr 500] [--no-traffic] [--json FILE]
//   (npm run bench:netpol-ovs; each option also as BENCH_CHANGES, BENCH_FULL_RUNS, BENCH_ROUNDS,
//   BENCH_IPERF_SECONDS, BENCH_RR, BENCH_CRR)
//
// Run as root; needs Open vSwitch, gcc, ethtool and iperf3 (installed with apt-get when missing and
// traffic is on). The machine's own network namespace is never touched: ovsdb-server and
// ovs-vswitchd run in a namespace of their own (`wt-npovs-<pid>-n`, test/helpers/ovs.ts, userspace
// netdev datapath) with run/db/log dirs in a temporary directory; ovs-ofctl reaches them through
// their sockets. The pods' namespaces (`-pc`, `-ps`, `-pr`), the servers, the OVS daemons and the
// temporary directory are removed in `finally` and on SIGINT/SIGTERM/SIGHUP.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { PerformanceObserver } from 'node:perf_hooks';
import { parseArgs } from 'node:util';

import { Category, CATEGORY_ONLY_MASK, cookieOf, macFromIP, pipelineFlows, podFlows, renderFlowMods, renderFlows, type Flow, type NodePorts, type PodPort } from '../src/backend/ovs/pipeline.js';
import { PolicyFlowSection } from '../src/backend/ovs/policy-section.js';
import { OvsClient } from '../src/ovs/cli.js';
import { PolicyEngine } from '../src/policy/engine.js';
import type { PolicyDelta } from '../src/policy/model.js';
import { PolicyOvsDriver } from '../src/policy/ovs/driver.js';
import { PolicyFlowModel } from '../src/policy/ovs/flows.js';
import { renderCookieMatch } from '../src/render/ofctl.js';
import { IPAddr } from '../src/util/ip.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from '../test/helpers/netns.js';
import { OvsInstance } from '../test/helpers/ovs.js';
import { BenchError, dist, type Dist, f0, f1, f2, loadavg, median, mono, printTable, procTicks, ROOT } from './lib/common.js';
import { appOfPod, INGRESS_PORT, namespaces, nodeGateway, pod, podIP, podsOfNode, policy, toggledApp } from './lib/netpol-workload.js';

const env = process.env;
const { values: args } = parseArgs({
  options: {
    changes: { type: 'string', default: env['BENCH_CHANGES'] ?? '100' },
    'full-runs': { type: 'string', default: env['BENCH_FULL_RUNS'] ?? '3' },
    rounds: { type: 'string', default: env['BENCH_ROUNDS'] ?? '5' },
    'iperf-seconds': { type: 'string', default: env['BENCH_IPERF_SECONDS'] ?? '5' },
    rr: { type: 'string', default: env['BENCH_RR'] ?? '5000' },
    crr: { type: 'string', default: env['BENCH_CRR'] ?? '500' },
    'no-traffic': { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});

const CHANGES = Number(args.changes);
const FULL_RUNS = Number(args['full-runs']);
const ROUNDS = Number(args.rounds);
const IPERF_SECONDS = Number(args['iperf-seconds']);
const RR = Number(args.rr);
const CRR = Number(args.crr);
if (![CHANGES, FULL_RUNS, ROUNDS, IPERF_SECONDS, RR, CRR].every((n) => Number.isInteger(n) && n >= 1)) {
  throw new BenchError('--changes, --full-runs, --rounds, --iperf-seconds, --rr and --crr must be integers ≥ 1');
}

/** The issue's scale: 200 local pods (node n1), 2 000 remote ones on ten other nodes, 500 policies. */
const PER_NODE = 200;
const NODES = 11;
const PODS = PER_NODE * NODES;
const POLICIES = 500;
const TARGET = { changeRatio: 1.5, traffic: 0.9 } as const;

const BRIDGE = 'br-int';
const REF_BRIDGE = 'br-ref';
const ROUND = 7;
const GATEWAY_IP = IPAddr.parse(nodeGateway(1));
const NODE: NodePorts = { vni: 1, tunnelPort: 32768, gatewayPort: 32769, gatewayIP: GATEWAY_IP, gatewayMAC: macFromIP(GATEWAY_IP) };
/** A selector for the policy flows of every round. */
const POLICY_COOKIES = renderCookieMatch(cookieOf(0, Category.Policy, 0), CATEGORY_ONLY_MASK);

/** The traffic pods: workload pods of node n1 (app64 → app44 on TCP 80 is allowed both ways). */
const TRAFFIC = {
  client: { index: 64, tag: 'pc', port: 'vp64', ofport: 10 },
  iperf: { index: 144, tag: 'ps', port: 'vp144', ofport: 11 },
  rr: { index: 44, tag: 'pr', port: 'vp44', ofport: 12 },
} as const;
type Role = keyof typeof TRAFFIC;
const ROLES: readonly Role[] = ['client', 'iperf', 'rr'];
const SERVER_PORT = INGRESS_PORT;
const BLOCKED_PORT = INGRESS_PORT + 1;
const trafficApps = ROLES.map((r) => appOfPod(TRAFFIC[r].index));

const P = nsPrefix('npovs');
const NODE_NS = `${P}-n`;
const POD_NS = (r: Role) => `${P}-${TRAFFIC[r].tag}`;
const ipOf = (r: Role) => podIP(TRAFFIC[r].index, PER_NODE);
const podPort = (r: Role): PodPort => ({ ofport: TRAFFIC[r].ofport, ip: IPAddr.parse(ipOf(r)), mac: macFromIP(IPAddr.parse(ipOf(r))) });
const trafficPodFlows = (): Flow[] => ROLES.flatMap((r) => podFlows(ROUND, NODE, podPort(r)));

// ---------------------------------------------------------------------------------------------
// Set-up and clean-up

const children = new Set<ChildProcess>();
const namespacesMade: string[] = [];
let ovs: OvsInstance | undefined;
let workDir: string | undefined;

async function cleanup(): Promise<void> {
  for (const c of children) if (c.pid !== undefined && c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
  children.clear();
  await ovs?.stop().catch((e: Error) => console.error(`stopping OVS: ${e.message}`));
  ovs = undefined;
  for (const ns of namespacesMade.splice(0)) await delNetns(ns).catch((e: Error) => console.error(`deleting ${ns}: ${e.message}`));
  if (workDir) rmSync(workDir, { recursive: true, force: true });
  workDir = undefined;
}

function startChild(cmd: string, a: readonly string[]): ChildProcess {
  const c = spawn(cmd, [...a], { stdio: 'ignore' });
  children.add(c);
  c.once('exit', () => children.delete(c));
  return c;
}

async function setUp(): Promise<OvsClient> {
  workDir = mkdtempSync(join(tmpdir(), 'weft-npovs-'));
  namespacesMade.push(await addNetns(NODE_NS));
  ovs = await OvsInstance.start(NODE_NS, join(workDir, 'ovs'));
  for (const br of [BRIDGE, REF_BRIDGE]) {
    await ovs.vsctl('add-br', br, '--', 'set', 'bridge', br, 'datapath_type=netdev', 'fail-mode=secure', 'protocols=OpenFlow10,OpenFlow13,OpenFlow15');
  }
  // The traffic pods, as weft-ovs attaches a veth pod on netdev: `arp off` on the host end, TX
  // checksum offload off in the pod, the pod's MAC derived from its address; fixed ofports.
  for (const r of ROLES) {
    const { port, ofport } = TRAFFIC[r];
    const pns = POD_NS(r);
    namespacesMade.push(await addNetns(pns));
    const pp = podPort(r);
    await ipn(NODE_NS, 'link', 'add', port, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pns);
    await ipn(NODE_NS, 'link', 'set', port, 'arp', 'off', 'up');
    await ipn(pns, 'link', 'set', 'eth0', 'address', pp.mac);
    await ipn(pns, 'addr', 'add', `${ipOf(r)}/24`, 'dev', 'eth0');
    await ipn(pns, 'link', 'set', 'eth0', 'up');
    await nsExec(pns, 'ethtool', '-K', 'eth0', 'tx', 'off');
    for (const o of ROLES) if (o !== r) await ipn(pns, 'neigh', 'replace', ipOf(o), 'lladdr', podPort(o).mac, 'dev', 'eth0', 'nud', 'permanent');
    await ovs.vsctl('add-port', BRIDGE, port, '--', 'set', 'interface', port, `ofport_request=${ofport}`);
    const got = Number((await ovs.vsctl('get', 'interface', port, 'ofport')).trim());
    if (got !== ofport) throw new BenchError(`${port} got ofport ${got}, not ${ofport}`);
  }
  const client = new OvsClient({ runDir: ovs.runDir });
  // Both bridges: the frame with the policy tables and the pods' flows, no policy flow.
  const frame = renderFlows([...pipelineFlows(ROUND, NODE, { policy: true }), ...trafficPodFlows()]);
  for (const br of [BRIDGE, REF_BRIDGE]) await client.replaceFlows(br, frame);
  return client;
}

// ---------------------------------------------------------------------------------------------
// Garbage collection: this process's pauses (V8's 'gc' entries), on mono()'s clock.

const GC_OFFSET = mono() - performance.now();
const gcPauses: Array<readonly [number, number]> = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcPauses.push([e.startTime + GC_OFFSET, e.startTime + e.duration + GC_OFFSET]);
}).observe({ entryTypes: ['gc'] });

/** Milliseconds of GC pause overlapping the windows. */
function gcWithin(windows: ReadonlyArray<readonly [number, number]>): number {
  let ms = 0;
  for (const [a, b] of windows) for (const [s, e] of gcPauses) ms += Math.max(0, Math.min(b, e) - Math.max(a, s));
  return ms;
}

// ---------------------------------------------------------------------------------------------
// The driver on br-int, its host calls timed

interface HostCall {
  readonly kind: 'bundle' | 'dump';
  readonly ms: number;
  readonly text: string;
  /** The `revalidator/purge` after a bundle, as the ovs backend's host runs it (src/backend/ovs/ovs.ts). */
  readonly purgeMs?: number;
}

/** Purge the datapath's flows after each bundle, as weftd does (`--no-purge`: without, to see its share). */
const PURGE = !process.argv.includes('--no-purge');
const purgeTimes: number[] = [];

function attachSection(client: OvsClient): { section: PolicyFlowSection; calls: HostCall[] } {
  const calls: HostCall[] = [];
  const section = new PolicyFlowSection();
  section.attach({
    round: ROUND,
    bundle: async (mods) => {
      const t = mono();
      await client.bundleFlowMods(BRIDGE, mods);
      const t1 = mono();
      if (PURGE) await client.unixctl('revalidator/purge');
      calls.push({ kind: 'bundle', ms: t1 - t, text: mods, purgeMs: mono() - t1 });
    },
    dumpPolicyFlows: async (withStats) => {
      const t = mono();
      const out = await client.dumpFlows(BRIDGE, POLICY_COOKIES, withStats);
      calls.push({ kind: 'dump', ms: mono() - t, text: '' });
      return out;
    },
  });
  return { section, calls };
}

const policyFlowCount = async (client: OvsClient, br: string) => (await client.dumpFlows(br, POLICY_COOKIES)).length;

interface FullRun {
  readonly snapshotMs: number;
  readonly totalMs: number;
  readonly jsMs: number;
  readonly jsCpuMs: number;
  readonly dumpMs: number;
  readonly bundleMs: number;
  readonly refMs: number;
}

interface Change {
  readonly totalMs: number;
  readonly engineMs: number;
  readonly jsMs: number;
  readonly bundleMs: number;
  readonly refMs: number;
  /** Garbage-collection pauses of this process inside the timed part, and inside the reference's. */
  readonly gcMs: number;
  readonly refGcMs: number;
  readonly windows: { readonly timed: ReadonlyArray<readonly [number, number]>; readonly ref: ReadonlyArray<readonly [number, number]> };
  readonly mods: number;
  readonly bytes: number;
}

/** CPU milliseconds per bundle (the driver's and the reference's alike), averaged over a phase. */
interface BundleCpu {
  readonly vswitchd: number;
  readonly ofctl: number;
}

const cpuDelta = (a: { vswitchd: number; ofctl: number }, b: { vswitchd: number; ofctl: number }, bundles: number): BundleCpu => ({ vswitchd: (b.vswitchd - a.vswitchd) / bundles, ofctl: (b.ofctl - a.ofctl) / bundles });

interface FlowCounts {
  readonly policy: number;
  readonly kinds: Array<[string, number]>;
  readonly conjunctionActions: number;
  readonly bundleBytes: number;
  readonly frame: number;
  readonly frameNoPolicy: number;
  readonly pods: number;
  readonly table: number;
  readonly conjunctions: number;
}

async function programming(client: OvsClient): Promise<{
  engine: PolicyEngine;
  section: PolicyFlowSection;
  driver: PolicyOvsDriver;
  buildMs: number;
  full: FullRun[];
  counts: FlowCounts;
  label: Change[];
  policy: Change[];
  labelCpu: BundleCpu;
  policyCpu: BundleCpu;
  floor: number[];
  checkMs: number;
  checkProblems: string[];
  sameAsRef: boolean;
}> {
  const log = (s: string) => process.stderr.write(`  ${s}\n`);
  const { section, calls } = attachSection(client);
  const signal = new AbortController().signal;

  let t = mono();
  const engine = new PolicyEngine('n1');
  for (const ns of namespaces()) engine.upsertNamespace(ns);
  for (let i = 0; i < PODS; i++) engine.upsertPod(pod(i, appOfPod(i), PER_NODE));
  for (let k = 0; k < POLICIES; k++) engine.upsertPolicy(policy(k, 'matching'));
  const buildMs = mono() - t;
  log(`engine built in ${f0(buildMs)} ms`);

  // Full programming from no policy flow, --full-runs times; the reference alternates first/second
  // from the second run on (the first run gives the flow file).
  const full: FullRun[] = [];
  let file = '';
  let driver: PolicyOvsDriver | null = null;
  const clear = async () => {
    for (const br of [BRIDGE, REF_BRIDGE]) await client.delFlowsByCookie(br, cookieOf(0, Category.Policy, 0), CATEGORY_ONLY_MASK);
  };
  const reference = async () => {
    const s = mono();
    await client.addFlows(REF_BRIDGE, file);
    return mono() - s;
  };
  for (let r = 0; r < FULL_RUNS; r++) {
    await clear();
    const refFirst = r % 2 === 1;
    let refMs = refFirst ? await reference() : NaN;
    t = mono();
    const snap = engine.snapshot();
    const snapshotMs = mono() - t;
    driver = new PolicyOvsDriver(section, signal);
    const before = calls.length;
    const cpu0 = process.cpuUsage();
    t = mono();
    await driver.sync(snap);
    const totalMs = mono() - t;
    const cpu = process.cpuUsage(cpu0);
    const mine = calls.slice(before);
    const bundles = mine.filter((c) => c.kind === 'bundle');
    if (bundles.length !== 1) throw new BenchError(`driver.sync wrote ${bundles.length} bundles, not 1`);
    if (r === 0) file = bundles[0]!.text;
    else if (bundles[0]!.text !== file) throw new BenchError('driver.sync wrote another bundle than in the first run');
    if (!refFirst) refMs = await reference();
    const dumpMs = mine.filter((c) => c.kind === 'dump').reduce((s, c) => s + c.ms, 0);
    const bundleMs = bundles[0]!.ms;
    full.push({ snapshotMs, totalMs, jsMs: totalMs - dumpMs - bundleMs, jsCpuMs: (cpu.user + cpu.system) / 1000, dumpMs, bundleMs, refMs });
    const [a, b] = [await policyFlowCount(client, BRIDGE), await policyFlowCount(client, REF_BRIDGE)];
    const want = driver.programmed.rules.size > 0 ? file.split('\n').filter((l) => l.startsWith('add ')).length : 0;
    if (a !== want || b !== want) throw new BenchError(`after full run ${r + 1}: ${a} policy flows on ${BRIDGE}, ${b} on ${REF_BRIDGE}, want ${want}`);
    log(`full programming ${r + 1}/${FULL_RUNS}: driver.sync ${f0(totalMs)} ms (bundle ${f0(bundleMs)}), reference add-flows ${f0(refMs)} ms`);
  }
  if (!driver) throw new BenchError('no full run');

  // What is on the bridge.
  const policyFlows = section.flows(ROUND) ?? [];
  const kinds = new Map<string, number>();
  let conjunctionActions = 0;
  for (const f of policyFlows) {
    const a0 = f.actions[0];
    const what =
      a0?.type === 'drop' ? 'default drop (per isolated pod and direction)'
      : f.match.some((m) => m.field === 'conj_id') ? 'conj_id (one per conjunction: the rule, its id into reg2/reg3)'
      : a0?.type === 'conjunction' ? 'clause (pod, peer, port or named-port tuple)'
      : 'plain allow (a rule whose only clause is the pod)';
    const key = `${f.table}: ${what}`;
    kinds.set(key, (kinds.get(key) ?? 0) + 1);
    conjunctionActions += f.actions.filter((x) => x.type === 'conjunction').length;
  }
  const counts: FlowCounts = {
    policy: policyFlows.length,
    kinds: [...kinds].sort(([x], [y]) => x.localeCompare(y)),
    conjunctionActions,
    bundleBytes: file.length,
    frame: pipelineFlows(ROUND, NODE, { policy: true }).length,
    frameNoPolicy: pipelineFlows(ROUND, NODE).length,
    pods: trafficPodFlows().length,
    table: (await client.dumpFlows(BRIDGE)).length,
    conjunctions: driver.conjunctions().size,
  };

  // Incremental changes, each with its reference on br-ref. To alternate which of the two goes
  // first, a shadow of the driver's flow model (reset from the same snapshot, fed the same deltas,
  // untimed) gives a change's flow mods before the driver runs; the driver's bundle must be
  // exactly that text.
  const shadow = new PolicyFlowModel();
  shadow.reset(engine.snapshot());
  shadow.markAllWritten(ROUND);
  let changeNo = 0;
  const timed = async (change: () => PolicyDelta): Promise<Change> => {
    const refFirst = changeNo++ % 2 === 1;
    const before = calls.length;
    const t0 = mono();
    const delta = change();
    const t1 = mono();
    shadow.apply(delta);
    const pending = shadow.pendingMods(ROUND);
    pending.commit();
    const expected = renderFlowMods(pending.mods);
    const reference = async () => {
      const s = mono();
      await client.bundleFlowMods(REF_BRIDGE, expected);
      return mono() - s;
    };
    let refMs = refFirst ? await reference() : NaN;
    const t2 = mono();
    await driver.applyAll([delta]);
    const t3 = mono();
    if (!refFirst) refMs = await reference();
    const mine = calls.slice(before);
    if (mine.length !== 1 || mine[0]!.kind !== 'bundle') throw new BenchError(`a change made ${mine.length} host calls (${mine.map((c) => c.kind).join(', ')}), not one bundle`);
    const { ms: bundleMs, text, purgeMs = 0 } = mine[0]!;
    purgeTimes.push(purgeMs);
    if (text !== expected) throw new BenchError(`change ${changeNo}: the driver's bundle differs from the shadow model's mods (${text.length} vs ${expected.length} bytes)`);
    const refStart = refFirst ? t2 - refMs : t3;
    return {
      totalMs: t1 - t0 + (t3 - t2),
      engineMs: t1 - t0,
      jsMs: t3 - t2 - bundleMs - purgeMs,
      bundleMs,
      refMs,
      // filled in after the phase (GC entries arrive asynchronously)
      gcMs: NaN,
      refGcMs: NaN,
      windows: { timed: [[t0, t1], [t2, t3]], ref: [[refStart, refStart + refMs]] },
      mods: text.split('\n').filter((l) => l !== '').length,
      bytes: text.length,
    };
  };
  const withGc = async (xs: Change[]): Promise<Change[]> => {
    await new Promise((r) => setTimeout(r, 100));
    return xs.map((x) => ({ ...x, gcMs: gcWithin(x.windows.timed), refGcMs: gcWithin(x.windows.ref) }));
  };
  // CPU of ovs-vswitchd and of this process's reaped children (the ovs-ofctl processes) per phase.
  const clkTck = Number((await sh('getconf', ['CLK_TCK'])).trim()) || 100;
  const cpuNow = () => ({ vswitchd: procTicks(ovs!.pids.vswitchd!).own * (1000 / clkTck), ofctl: procTicks('self').children * (1000 / clkTck) });
  const trafficPods = new Set<number>(ROLES.map((r) => TRAFFIC[r].index));
  const locals = podsOfNode(1, PER_NODE).filter((i) => !trafficPods.has(i));
  const apps = new Map<number, number>();
  const label: Change[] = [];
  let cpu0 = cpuNow();
  for (let j = 0; j < CHANGES; j++) {
    const i = locals[j % locals.length]!;
    const app = toggledApp(i, apps.get(i) ?? appOfPod(i));
    apps.set(i, app);
    label.push(await timed(() => engine.upsertPod(pod(i, app, PER_NODE))));
  }
  const labelCpu = cpuDelta(cpu0, cpuNow(), 2 * CHANGES);
  label.splice(0, label.length, ...(await withGc(label)));
  log(`label changes: p50 ${f1(dist(label.map((x) => x.totalMs)).p50)} ms, reference ${f1(dist(label.map((x) => x.refMs)).p50)} ms`);
  const ks = Array.from({ length: POLICIES }, (_, k) => k).filter((k) => !trafficApps.includes(k % 100));
  const ports = new Map<number, number>();
  const pol: Change[] = [];
  cpu0 = cpuNow();
  for (let j = 0; j < CHANGES; j++) {
    const k = ks[j % ks.length]!;
    const port = (ports.get(k) ?? INGRESS_PORT) === INGRESS_PORT ? INGRESS_PORT + 1 : INGRESS_PORT;
    ports.set(k, port);
    pol.push(await timed(() => engine.upsertPolicy(policy(k, 'matching', port))));
  }
  const policyCpu = cpuDelta(cpu0, cpuNow(), 2 * CHANGES);
  pol.splice(0, pol.length, ...(await withGc(pol)));
  log(`policy changes: p50 ${f1(dist(pol.map((x) => x.totalMs)).p50)} ms, reference ${f1(dist(pol.map((x) => x.refMs)).p50)} ms`);

  // The floor of one bundle at this table size: one flow added to (then deleted from) a table
  // nothing uses, on br-ref, through the same OvsClient call.
  const floor: number[] = [];
  for (let j = 0; j < 20; j++) {
    const s = mono();
    await client.bundleFlowMods(REF_BRIDGE, j % 2 ? 'delete_strict table=250,priority=1\n' : 'add table=250,priority=1,actions=drop\n');
    floor.push(mono() - s);
  }
  log(`floor: one-flow bundle p50 ${f1(dist(floor).p50)} ms`);

  t = mono();
  const checkProblems = await driver.check();
  const checkMs = mono() - t;
  const [onInt, onRef] = [await client.dumpFlows(BRIDGE, POLICY_COOKIES), await client.dumpFlows(REF_BRIDGE, POLICY_COOKIES)];
  const refSorted = [...onRef].sort();
  const sameAsRef = onInt.length === onRef.length && [...onInt].sort().every((l, i) => l === refSorted[i]);
  log(`read-back compare ${f0(checkMs)} ms, ${checkProblems.length} problem(s); ${BRIDGE} ${sameAsRef ? 'equals' : 'DIFFERS FROM'} ${REF_BRIDGE}`);
  return { engine, section, driver, buildMs, full, counts, label, policy: pol, labelCpu, policyCpu, floor, checkMs, checkProblems, sameAsRef };
}

// ---------------------------------------------------------------------------------------------
// Traffic

type Mode = 'none' | 'conntrack' | 'policy';
const MODES: readonly Mode[] = ['none', 'conntrack', 'policy'];
const MODE_NAME: Record<Mode, string> = {
  none: 'no policy tables (pipelineFlows without policy)',
  conntrack: 'conntrack only (policy frame, no rule)',
  policy: '500 policies (frame + rule flows)',
};

interface Latency {
  readonly n: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly mean: number;
  readonly max: number;
}

interface TrafficRun {
  readonly gbps: number;
  readonly retransmits: number;
  readonly rr: Latency;
  readonly crr: Latency;
}

interface TrafficResult {
  readonly runs: Record<Mode, TrafficRun[]>;
  readonly probes: Record<Mode, string>;
  readonly allowedEgress: number;
  readonly allowedIngress: number;
  readonly deniedIngress: number;
  readonly connections: number;
}

async function ensureIperf(): Promise<string> {
  const have = await sh('iperf3', ['--version']).catch(() => null);
  if (have) return have.split('\n')[0]!.trim();
  console.log('iperf3 is not installed: installing it with apt-get (Debian package iperf3)');
  await sh('apt-get', ['install', '-y', '--no-install-recommends', 'iperf3'], { timeoutMs: 300_000 }).catch(async () => {
    await sh('apt-get', ['update'], { timeoutMs: 300_000 });
    await sh('apt-get', ['install', '-y', '--no-install-recommends', 'iperf3'], { timeoutMs: 300_000 });
  });
  return (await sh('iperf3', ['--version'])).split('\n')[0]!.trim();
}

async function buildTcpRr(): Promise<string> {
  const out = join(workDir!, 'tcp-rr');
  await sh('gcc', ['-O2', '-Wall', '-o', out, join(ROOT, 'bench/lib/tcp-rr.c')], { timeoutMs: 60_000 });
  return out;
}

function tableOf(mode: Mode, driverFlows: readonly Flow[]): string {
  const frame = pipelineFlows(ROUND, NODE, { policy: mode !== 'none' });
  return renderFlows([...frame, ...trafficPodFlows(), ...(mode === 'policy' ? driverFlows : [])]);
}

async function setMode(client: OvsClient, mode: Mode, driverFlows: readonly Flow[]): Promise<void> {
  await client.replaceFlows(BRIDGE, tableOf(mode, driverFlows));
  await client.appctl(['dpctl/flush-conntrack']);
}

/** Whether a TCP connection from the client pod to the iperf server on `port` is open, refused, or dropped (1 s). */
async function probe(port: number): Promise<'open' | 'refused' | 'dropped'> {
  const c = spawn('ip', ['netns', 'exec', POD_NS('client'), 'timeout', '1', 'bash', '-c', `exec 3<>/dev/tcp/${ipOf('iperf')}/${port}`], { stdio: 'ignore' });
  const code = await new Promise<number | null>((resolve) => c.once('exit', (x) => resolve(x)));
  return code === 0 ? 'open' : code === 124 ? 'dropped' : 'refused';
}

async function iperfRun(): Promise<{ gbps: number; retransmits: number }> {
  const out = await sh('ip', ['netns', 'exec', POD_NS('client'), 'iperf3', '-c', ipOf('iperf'), '-p', String(SERVER_PORT), '-t', String(IPERF_SECONDS), '-J'], { timeoutMs: (IPERF_SECONDS + 30) * 1000 });
  const j = JSON.parse(out) as { end: { sum_received: { bits_per_second: number }; sum_sent: { retransmits?: number } } };
  return { gbps: j.end.sum_received.bits_per_second / 1e9, retransmits: j.end.sum_sent.retransmits ?? 0 };
}

async function rrRun(bin: string, crr: boolean): Promise<Latency> {
  const a = crr ? ['-C', ipOf('rr'), String(SERVER_PORT), String(CRR)] : ['-c', ipOf('rr'), String(SERVER_PORT), String(RR), '1'];
  const out = await sh('ip', ['netns', 'exec', POD_NS('client'), bin, ...a], { timeoutMs: 120_000 });
  return JSON.parse(out.trim()) as Latency;
}

/** Packets of the allowing policies' flows (egress: the client's app; ingress: the servers' app) and the servers' ingress drops. */
async function policyPackets(client: OvsClient, driver: PolicyOvsDriver): Promise<{ egress: number; ingress: number; denied: number }> {
  // The datapath's flows carry the packets; their counts reach the OpenFlow flows when the
  // revalidators next run.
  await client.appctl(['revalidator/wait']);
  const problems = await driver.check();
  if (problems.length) throw new BenchError(`policy flows differ from the model during the traffic part: ${problems.slice(0, 3).join('; ')}`);
  const c = driver.counts()!;
  const selects = (name: string, idx: number) => Number(name.slice(2)) % 100 === appOfPod(idx);
  const egress = c.allowed.filter((a) => a.direction === 'egress' && selects(a.policy, TRAFFIC.client.index)).reduce((s, a) => s + a.packets, 0);
  const ingress = c.allowed.filter((a) => a.direction === 'ingress' && selects(a.policy, TRAFFIC.iperf.index)).reduce((s, a) => s + a.packets, 0);
  const servers = new Set([`p${TRAFFIC.iperf.index}`, `p${TRAFFIC.rr.index}`]);
  const denied = c.denied.filter((d) => d.direction === 'ingress' && servers.has(d.pod)).reduce((s, d) => s + d.packets, 0);
  return { egress, ingress, denied };
}

async function traffic(client: OvsClient, section: PolicyFlowSection, driver: PolicyOvsDriver, rrBin: string): Promise<TrafficResult> {
  // The section's flows, as the backend's full pass takes them (what the driver has written).
  const driverFlows = section.flows(ROUND) ?? [];
  if (driverFlows.length === 0) throw new BenchError('the policy section has no flows');
  startChild('ip', ['netns', 'exec', POD_NS('iperf'), 'iperf3', '-s', '-p', String(SERVER_PORT)]);
  startChild('ip', ['netns', 'exec', POD_NS('rr'), rrBin, '-s', String(SERVER_PORT)]);
  await setMode(client, 'none', driverFlows);
  const t0 = mono();
  while ((await probe(SERVER_PORT)) !== 'open') {
    if (mono() - t0 > 10_000) throw new BenchError('iperf3 server not reachable within 10 s (pods wired wrong?)');
    await new Promise((r) => setTimeout(r, 100));
  }
  const probes = {} as Record<Mode, string>;
  for (const m of MODES) {
    await setMode(client, m, driverFlows);
    probes[m] = `${SERVER_PORT} ${await probe(SERVER_PORT)}, ${BLOCKED_PORT} ${await probe(BLOCKED_PORT)}`;
    process.stderr.write(`  probe ${m}: ${probes[m]}\n`);
  }
  if (!probes.policy.endsWith('dropped') || probes.none.endsWith('dropped')) throw new BenchError(`the policy path is not in effect: probes ${JSON.stringify(probes)}`);
  const runs: TrafficResult['runs'] = { none: [], conntrack: [], policy: [] };
  let allowedEgress = 0;
  let allowedIngress = 0;
  let deniedIngress = 0;
  let connections = 0;
  for (let r = 0; r < ROUNDS; r++) {
    for (let j = 0; j < MODES.length; j++) {
      const m = MODES[(r + j) % MODES.length]!;
      await setMode(client, m, driverFlows);
      const before = m === 'policy' ? await policyPackets(client, driver) : null;
      const tp = await iperfRun();
      const rr = await rrRun(rrBin, false);
      const crr = await rrRun(rrBin, true);
      if (before) {
        const after = await policyPackets(client, driver);
        allowedEgress += after.egress - before.egress;
        allowedIngress += after.ingress - before.ingress;
        deniedIngress += after.denied - before.denied;
        connections += 2 + 1 + CRR; // iperf3: control and data connections; RR: one; CRR: one each
      }
      runs[m].push({ ...tp, rr, crr });
      process.stderr.write(`  round ${r + 1}/${ROUNDS}, ${m}: ${f2(tp.gbps)} Gbit/s, RR p50 ${f0(rr.p50)} µs, CRR p50 ${f0(crr.p50)} µs\n`);
    }
  }
  await setMode(client, 'policy', driverFlows);
  return { runs, probes, allowedEgress, allowedIngress, deniedIngress, connections };
}

// ---------------------------------------------------------------------------------------------
// Printing

const d3 = (d: Dist) => `${f1(d.p50)} / ${f1(d.p99)} / ${f1(d.max)}`;
const verdict = (ok: boolean) => (ok ? 'met' : 'missed');
const pq = (xs: readonly number[]) => {
  const d = dist(xs);
  return `${f1(d.p50)} / ${f1(d.p99)}`;
};

type Prog = Awaited<ReturnType<typeof programming>>;

function report(p: Prog, tp: TrafficResult | null, load: { start: string; beforeTraffic: string; end: string }): Record<string, unknown> {
  const c = p.counts;
  console.log(`\n## Flows (node n1: ${PER_NODE} local pods, ${PODS - PER_NODE} remote, ${POLICIES} policies → ${p.driver.programmed.rules.size} engine rules, ${c.conjunctions} conjunctions)\n`);
  printTable(['table: kind', 'flows'], [...c.kinds.map(([k, n]) => [k, String(n)]), ['**policy flows (cookie category 4)**', `**${c.policy}**`]]);
  console.log(
    `\n${c.conjunctionActions} conjunction actions in all; the full bundle is ${(c.bundleBytes / 1e6).toFixed(2)} MB. ` +
      `Whole table of ${BRIDGE}: ${c.table} flows (frame with policy tables ${c.frame} — ${c.frameNoPolicy} without —, ${c.pods} for the ${ROLES.length} traffic pods, ${c.policy} policy)`,
  );

  const fr = p.full;
  const m = (f: (x: FullRun) => number) => median(fr.map(f));
  console.log(`\n## Full programming from no policy flow (${fr.length} runs, medians, ms)\n`);
  printTable(
    ['what', 'ms', 'split', 'runs'],
    [
      ['engine build: 20 namespaces, 2 200 pods, 500 policies', f0(p.buildMs), '–', '–'],
      ['engine snapshot()', f0(m((x) => x.snapshotMs)), '–', fr.map((x) => f0(x.snapshotMs)).join(', ')],
      ['**driver.sync(snapshot)**', `**${f0(m((x) => x.totalMs))}**`, `JS ${f0(m((x) => x.jsMs))} (its CPU ${f0(m((x) => x.jsCpuMs))}), dump-flows ${f0(m((x) => x.dumpMs))}, bundle ${f0(m((x) => x.bundleMs))}`, fr.map((x) => f0(x.totalMs)).join(', ')],
      ['reference: `ovs-ofctl --bundle add-flows` of the same flow file (br-ref)', f0(m((x) => x.refMs)), '–', fr.map((x) => f0(x.refMs)).join(', ')],
      ['ratio driver.sync ÷ reference', f2(m((x) => x.totalMs) / m((x) => x.refMs)), `bundle alone ÷ reference ${f2(m((x) => x.bundleMs) / m((x) => x.refMs))}`, '–'],
    ],
  );

  const row = (name: string, xs: Change[]) => {
    const ratio = dist(xs.map((x) => x.totalMs)).p99 / dist(xs.map((x) => x.refMs)).p99;
    return [name, String(xs.length), `**${d3(dist(xs.map((x) => x.totalMs)))}**`, pq(xs.map((x) => x.engineMs)), pq(xs.map((x) => x.jsMs)), pq(xs.map((x) => x.bundleMs)), `${pq(xs.map((x) => x.gcMs))} (reference's: ${pq(xs.map((x) => x.refGcMs))})`, `**${d3(dist(xs.map((x) => x.refMs)))}**`, `**${f2(ratio)}** (p50 ${f2(dist(xs.map((x) => x.totalMs)).p50 / dist(xs.map((x) => x.refMs)).p50)})`, `${f0(median(xs.map((x) => x.mods)))} / ${f0(median(xs.map((x) => x.bytes)))}`];
  };
  console.log('\n## One change: engine call → driver.applyAll([delta]) resolved, next to the bundle of its own flow mods, ms\n');
  printTable(
    ['change', 'n', 'total p50 / p99 / max', 'engine p50 / p99', 'driver JS p50 / p99', 'its bundle p50 / p99', 'GC pauses in it p50 / p99', 'reference: same mods, `ovs-ofctl --bundle add-flows` on br-ref, p50 / p99 / max', 'p99 ratio', 'median flow mods / bytes'],
    [row('pod label (app a ↔ a + 20)', p.label), row('policy (ingress port 80 ↔ 81)', p.policy)],
  );
  console.log(
    `\nCPU per bundle (driver's and reference's, averaged): pod label change ovs-vswitchd ${f1(p.labelCpu.vswitchd)} ms + the ovs-ofctl process ${f1(p.labelCpu.ofctl)} ms; ` +
      `policy change ovs-vswitchd ${f1(p.policyCpu.vswitchd)} ms + ovs-ofctl ${f1(p.policyCpu.ofctl)} ms`,
  );
  console.log(
    PURGE
      ? `datapath purge after each bundle (revalidator/purge on ovs-vswitchd's control socket, as weftd does; in the totals, not in "its bundle"): p50 ${f1(dist(purgeTimes).p50)} / p99 ${f1(dist(purgeTimes).p99)} ms`
      : 'datapath purge after each bundle: off (--no-purge); weftd purges',
  );
  console.log(`floor: a one-flow bundle (add / delete_strict in an unused table of br-ref, same OvsClient call), 20 samples: p50 ${f1(dist(p.floor).p50)} / p99 ${f1(dist(p.floor).p99)} ms`);
  console.log(`read-back compare (driver.check) after the changes: ${f0(p.checkMs)} ms, ${p.checkProblems.length} problems${p.checkProblems.length ? `: ${p.checkProblems.slice(0, 3).join('; ')}` : ''}; ${BRIDGE}'s policy flows ${p.sameAsRef ? 'equal' : 'DIFFER FROM'} ${REF_BRIDGE}'s`);

  const ratioOf = (xs: Change[]) => dist(xs.map((x) => x.totalMs)).p99 / dist(xs.map((x) => x.refMs)).p99;
  const rows: string[][] = [
    ['pod label change p99 ÷ reference p99', `${f2(ratioOf(p.label))} (${f1(dist(p.label.map((x) => x.totalMs)).p99)} vs ${f1(dist(p.label.map((x) => x.refMs)).p99)} ms)`, `≤ ${TARGET.changeRatio}`, verdict(ratioOf(p.label) <= TARGET.changeRatio)],
    ['policy change p99 ÷ reference p99', `${f2(ratioOf(p.policy))} (${f1(dist(p.policy.map((x) => x.totalMs)).p99)} vs ${f1(dist(p.policy.map((x) => x.refMs)).p99)} ms)`, `≤ ${TARGET.changeRatio}`, verdict(ratioOf(p.policy) <= TARGET.changeRatio)],
  ];
  let tpOut: Record<string, unknown> | null = null;
  if (tp) {
    const med = (mode: Mode, f: (x: TrafficRun) => number) => median(tp.runs[mode].map(f));
    const gb = (mode: Mode) => med(mode, (x) => x.gbps);
    const rr = (mode: Mode) => med(mode, (x) => x.rr.p50);
    const crr = (mode: Mode) => med(mode, (x) => x.crr.p50);
    console.log(`\n## Traffic on ${BRIDGE} (netdev datapath): pod ${TRAFFIC.client.index} (${ipOf('client')}) → pods ${TRAFFIC.iperf.index} (${ipOf('iperf')}, iperf3) and ${TRAFFIC.rr.index} (${ipOf('rr')}, tcp-rr), TCP ${SERVER_PORT}; ${ROUNDS} rounds, medians\n`);
    printTable(
      ['mode', `iperf3 ${IPERF_SECONDS} s, Gbit/s (runs)`, 'median', 'ratio to none', 'retransmits', `TCP_RR ${RR} × 1 B, p50 / p99 µs`, 'RR p50 ratio none ÷ mode', `TCP_CRR ${CRR}, p50 / p99 µs`, 'CRR p50 ratio none ÷ mode', `probe (port ${SERVER_PORT} / ${BLOCKED_PORT})`],
      MODES.map((mode) => [
        MODE_NAME[mode],
        tp.runs[mode].map((x) => f2(x.gbps)).join(', '),
        `**${f2(gb(mode))}**`,
        f2(gb(mode) / gb('none')),
        tp.runs[mode].map((x) => String(x.retransmits)).join(', '),
        `${f0(rr(mode))} / ${f0(med(mode, (x) => x.rr.p99))}`,
        f2(rr('none') / rr(mode)),
        `${f0(crr(mode))} / ${f0(med(mode, (x) => x.crr.p99))}`,
        f2(crr('none') / crr(mode)),
        tp.probes[mode],
      ]),
    );
    console.log(
      `\npolicy path during the policy runs (${tp.connections} connections): the client's allowing egress policies counted ${tp.allowedEgress} packets, ` +
        `the servers' allowing ingress policies ${tp.allowedIngress}, the servers' ingress drops ${tp.deniedIngress} (a connection's first packet only; the rest are +est)`,
    );
    rows.push(
      ['iperf3 throughput with the 500 policies ÷ without', `${f2(gb('policy') / gb('none'))} (÷ conntrack only: ${f2(gb('policy') / gb('conntrack'))})`, `≥ ${TARGET.traffic}`, verdict(gb('policy') / gb('none') >= TARGET.traffic)],
      ['TCP_RR latency without ÷ with (p50)', `${f2(rr('none') / rr('policy'))} (${f0(rr('none'))} vs ${f0(rr('policy'))} µs; conntrack only ÷ with ${f2(rr('conntrack') / rr('policy'))})`, `≥ ${TARGET.traffic}`, verdict(rr('none') / rr('policy') >= TARGET.traffic)],
      ['TCP_CRR latency without ÷ with (p50)', `${f2(crr('none') / crr('policy'))} (${f0(crr('none'))} vs ${f0(crr('policy'))} µs; conntrack only ÷ with ${f2(crr('conntrack') / crr('policy'))})`, `(≥ ${TARGET.traffic})`, verdict(crr('none') / crr('policy') >= TARGET.traffic)],
    );
    tpOut = { ...tp, medianGbps: { none: gb('none'), conntrack: gb('conntrack'), policy: gb('policy') }, rrP50: { none: rr('none'), conntrack: rr('conntrack'), policy: rr('policy') }, crrP50: { none: crr('none'), conntrack: crr('conntrack'), policy: crr('policy') } };
  }
  console.log('\n## Against the targets\n');
  printTable(['measure', 'figure', 'target', 'verdict'], rows);
  console.log(`\nload average: at start ${load.start}; before traffic ${load.beforeTraffic}; at end ${load.end}`);
  const strip = (xs: Change[]) => xs.map(({ windows: _w, ...x }) => x);
  return { changes: CHANGES, counts: c, full: p.full, label: strip(p.label), policy: strip(p.policy), labelCpu: p.labelCpu, policyCpu: p.policyCpu, floor: p.floor, buildMs: p.buildMs, checkMs: p.checkMs, checkProblems: p.checkProblems, traffic: tpOut, load };
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces, Open vSwitch)');
  const load = { start: loadavg(), beforeTraffic: '', end: '' };
  const ovsv = (await sh('ovs-vswitchd', ['--version'])).split('\n')[0]!.trim();
  const iperfv = args['no-traffic'] ? 'not used' : await ensureIperf();
  const kernel = (await sh('uname', ['-r'])).trim();
  const others = existsSync('/var/run/netns') ? readdirSync('/var/run/netns').filter((n) => !n.startsWith(P)).length : 0;
  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, kernel ${kernel}; ${ovsv}, userspace (netdev) datapath; ${iperfv}; node ${process.version}`);
  console.log(`load average at start: ${load.start}; other network namespaces present (other tests running?): ${others}`);
  console.log(`workload: ${PODS} pods (${PER_NODE} per node, node n1 ours), ${POLICIES} policies, matching peers; ${CHANGES} changes of each kind, ${FULL_RUNS} full programmings`);

  let stopping = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    console.error(`${sig}: cleaning up`);
    void cleanup().finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, onSignal);
  try {
    const client = await setUp();
    const rrBin = args['no-traffic'] ? '' : await buildTcpRr();
    const p = await programming(client);
    load.beforeTraffic = loadavg();
    const tp = args['no-traffic'] ? null : await traffic(client, p.section, p.driver, rrBin);
    load.end = loadavg();
    const out = report(p, tp, load);
    if (args.json) writeFileSync(args.json, JSON.stringify(out, null, 2));
  } finally {
    await cleanup();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
