// Issue 18, NetworkPolicy on nftables at scale: one node with 10 000 pods in the API (100 of them
// local) and 1 000 policies (bench/lib/netpol-workload.ts). Every figure is printed next to its
// reference from the same run and the issue's target:
//
//   build        the engine fed 20 namespaces, 10 000 pods and 1 000 policies; snapshot().
//   full         PolicyNftDriver.sync(snapshot) into a node namespace without the table (start-up:
//                one `nft -f`), split into JavaScript (snapshot render) and the nft process; the
//                table's size (sets, elements, verdict-map entries, chains, rules); the read-back
//                compare (driver.check()) after the incremental part.
//   incremental  --changes pod label changes (local pods, app a ↔ app a + 20 in the same namespace:
//                the pod leaves 40 peer sets and joins 40 others, and ten other policies select it,
//                so its two chains are rewritten) and --changes policy changes (policy k's ingress
//                port 80 ↔ 81: a new rule, a new 200-address set, the old ones deleted, the selected
//                local pod's ingress chain rewritten), each timed from the engine call to
//                driver.apply() resolved; split engine / render / nft process.
//   reference    what kube-router's full sync does: the same rule set rewritten whole,
//                driver.sync(engine.snapshot()) (one `nft -f` replacing the table), --rewrites
//                times (default changes / 5). Ratio: rewrite p50 / incremental p99.
//   floors       nft's own cost at this table size: a one-command transaction on a tiny table of its
//                own, and one element added to (then deleted from) a set of the loaded table.
//   throughput   two node namespaces joined by a veth "underlay", each with bridge cni0 and one pod
//                namespace behind it, host-gw routes between the podCIDRs; iperf3 (TCP, one stream)
//                from pod 64 on n1 to pod 144 on n2 — both workload pods — with (a) no policy hook,
//                (b) only a conntrack `ct state established,related accept` chain (what any node
//                with kube-proxy or masquerade already pays), (c) the 1 000-policy table of each node
//                (n1's after the incremental part, n2's built the same way). Runs alternate between
//                the three; medians; ratio (c)/(a) (target) and (c)/(b).
//
// How the policy path is exercised: both iperf pods are isolated in both directions. On n1 the
// client's packets hit `ip saddr vmap @egress_v4` → its egress chain (ten policies; allowed by an
// ipBlock rule); on n2 `ip daddr vmap @ingress_v4` → the server's ingress chain (allowed by
// `ip saddr @<set> tcp dport 80`, the set holding app64's 100 addresses and app49's 100). Only a
// connection's first packet walks the vmap and the pod chain: every later packet (and every reply)
// is accepted by the base chain's first rule, `ct state established,related accept`. So the
// throughput figure is the per-packet cost of the hook plus conntrack, with the policy path proven
// per run: the rules' counters in both pod chains count iperf's connections, and a connection to
// port 81 (not allowed) times out with the policy and is refused (reaches the pod) without it.
//
//   node --import=tsx bench/netpol-nft.ts [--changes 50] [--rewrites 10] [--peers matching|empty]
//       [--iperf-seconds 5] [--iperf-runs 3] [--no-throughput] [--no-check] [--json FILE]
//   (npm run bench:netpol; each option also as BENCH_CHANGES, BENCH_REWRITES, BENCH_PEERS,
//   BENCH_IPERF_SECONDS, BENCH_IPERF_RUNS)
//
// Run as root; needs nft and iperf3 (installed with apt-get when missing and throughput is on).
// The machine's own network namespace is never touched: the measuring part runs in a child of
// this file (--agent) started with `ip netns exec` inside each node namespace, so nft runs there
// as weftd's would (no `ip netns exec` per call). Namespaces (`wt-np-<pid>-*`), the children and
// iperf3 are removed in `finally` and on SIGINT/SIGTERM/SIGHUP.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { PolicyEngine } from '../src/policy/engine.js';
import { type NftRun, PolicyNftDriver, runNft } from '../src/policy/nft/driver.js';
import { podChainName, TABLE_FAMILY, TABLE_NAME } from '../src/policy/nft/layout.js';
import { renderFull, type RenderOptions } from '../src/policy/nft/render.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from '../test/helpers/netns.js';
import { BenchError, dist, type Dist, f0, f1, f2, loadavg, median, mono, printTable, ROOT } from './lib/common.js';
import {
  appOfPod,
  INGRESS_PORT,
  IPERF,
  namespaces,
  nodeCidr,
  nodeGateway,
  type PeerMode,
  pod,
  podIP,
  podKeyOf,
  PODS,
  podsOfNode,
  policy,
  POLICIES,
  toggledApp,
} from './lib/netpol-workload.js';

const SELF = fileURLToPath(import.meta.url);
const env = process.env;

const { values: args } = parseArgs({
  options: {
    changes: { type: 'string', default: env['BENCH_CHANGES'] ?? '50' },
    rewrites: { type: 'string', default: env['BENCH_REWRITES'] ?? '' },
    peers: { type: 'string', default: env['BENCH_PEERS'] ?? 'matching' },
    'iperf-seconds': { type: 'string', default: env['BENCH_IPERF_SECONDS'] ?? '5' },
    'iperf-runs': { type: 'string', default: env['BENCH_IPERF_RUNS'] ?? '3' },
    'no-throughput': { type: 'boolean', default: false },
    'no-check': { type: 'boolean', default: false },
    json: { type: 'string' },
    // internal: the measuring child inside node namespace n<agent>
    agent: { type: 'string' },
    measure: { type: 'boolean', default: false },
  },
});

const CHANGES = Number(args.changes);
const REWRITES = args.rewrites ? Number(args.rewrites) : Math.max(1, Math.round(CHANGES / 5));
const PEERS = args.peers as PeerMode;
const IPERF_SECONDS = Number(args['iperf-seconds']);
const IPERF_RUNS = Number(args['iperf-runs']);
if (!['matching', 'empty'].includes(PEERS)) throw new BenchError(`--peers must be matching or empty, not ${PEERS}`);
if (!(CHANGES >= 1 && REWRITES >= 1 && IPERF_SECONDS >= 1 && IPERF_RUNS >= 1)) throw new BenchError('--changes, --rewrites, --iperf-seconds and --iperf-runs must be ≥ 1');

/** weftd programs only the cluster's families: an IPv4 cluster. */
const OPTS: RenderOptions = { families: [4] };
const TARGET = { fullMs: 2000, incrP99Ms: 20, speedup: 10, throughput: 0.9 } as const;
const SERVER_PORT = IPERF.port;
const BLOCKED_PORT = INGRESS_PORT + 1;

// ---------------------------------------------------------------------------------------------
// The agent: inside one node namespace, the engine and the driver as weftd runs them.

interface Timed {
  readonly totalMs: number;
  readonly engineMs: number;
  /** The driver's JavaScript: rendering the transaction and updating its state (apply minus nft). */
  readonly renderMs: number;
  /** The nft process: spawn → exit. */
  readonly nftMs: number;
  readonly elements: number;
  readonly bytes: number;
}

interface TableSize {
  readonly sets: number;
  readonly setElements: number;
  readonly mapEntries: number;
  readonly chains: number;
  readonly rules: number;
  readonly scriptBytes: number;
  readonly scriptLines: number;
}

interface AgentResult {
  readonly node: number;
  readonly localPods: number;
  readonly engineRules: number;
  readonly buildMs: number;
  readonly snapshotMs: number;
  /** jsCpuMs: this process's CPU during it (rendering; nft is a child): wall above it is waiting for a core. */
  readonly full: { totalMs: number; jsMs: number; nftMs: number; jsCpuMs: number };
  readonly size: TableSize;
  readonly label?: Timed[];
  readonly policy?: Timed[];
  readonly rewrite?: Array<{ totalMs: number; snapshotMs: number; renderMs: number; nftMs: number }>;
  readonly floorTable?: number[];
  readonly floorElement?: number[];
  readonly checkMs?: number;
  readonly checkProblems?: string[];
  /** The transaction that puts the two base chains back (the throughput part toggles them). */
  readonly baseChains: string;
}

async function agent(node: number, measure: boolean): Promise<AgentResult> {
  const log = (s: string) => process.stderr.write(`  [n${node}] ${s}\n`);
  let lastRun: { start: number; end: number; bytes: number } | null = null;
  const run: NftRun = async (a, input) => {
    const start = mono();
    try {
      return await runNft(a, input);
    } finally {
      lastRun = { start, end: mono(), bytes: input?.length ?? 0 };
    }
  };
  const nftOf = () => (lastRun ? lastRun.end - lastRun.start : 0);
  const driver = new PolicyNftDriver(run, OPTS);
  const engine = new PolicyEngine(`n${node}`);

  let t = mono();
  for (const ns of namespaces()) engine.upsertNamespace(ns);
  for (let i = 0; i < PODS; i++) engine.upsertPod(pod(i));
  for (let k = 0; k < POLICIES; k++) engine.upsertPolicy(policy(k, PEERS));
  const buildMs = mono() - t;
  t = mono();
  const snap = engine.snapshot();
  const snapshotMs = mono() - t;
  log(`engine built in ${f0(buildMs)} ms, snapshot ${f0(snapshotMs)} ms; programming the table`);

  lastRun = null;
  t = mono();
  const cpu0 = process.cpuUsage();
  await driver.sync(snap);
  const fullTotal = mono() - t;
  const cpu = process.cpuUsage(cpu0);
  const full = { totalMs: fullTotal, nftMs: nftOf(), jsMs: fullTotal - nftOf(), jsCpuMs: (cpu.user + cpu.system) / 1000 };
  const { script, desired } = renderFull(snap, OPTS, true);
  const size: TableSize = {
    sets: desired.sets.size,
    setElements: [...desired.sets.values()].reduce((n, s) => n + s.keys.size, 0),
    mapEntries: [...desired.maps.values()].reduce((n, m) => n + m.size, 0),
    chains: desired.chains.size,
    rules: [...desired.chains.values()].reduce((n, c) => n + c.length, 0),
    scriptBytes: script.length,
    scriptLines: script.split('\n').length,
  };
  log(`full programming ${f0(full.totalMs)} ms (nft ${f0(full.nftMs)} ms)`);
  const base: AgentResult = {
    node,
    localPods: snap.pods.size,
    engineRules: snap.rules.size,
    buildMs,
    snapshotMs,
    full,
    size,
    baseChains: '',
  };
  if (!measure) return { ...base, baseChains: baseChainScript(engine) };

  // Floors: nft's own cost, next to the loaded table.
  const floorTable: number[] = [];
  for (let j = 0; j < 20; j++) {
    const s = mono();
    await runNft(['-f', '-'], 'add table inet weft_bench_floor\n');
    floorTable.push(mono() - s);
  }
  await runNft(['-f', '-'], 'delete table inet weft_bench_floor\n');
  const someSet = [...desired.sets.entries()].find(([, s]) => s.kind === 'addresses')?.[0];
  const floorElement: number[] = [];
  if (someSet) {
    for (let j = 0; j < 20; j++) {
      const s = mono();
      await runNft(['-f', '-'], `${j % 2 ? 'delete' : 'add'} element ${TABLE_FAMILY} ${TABLE_NAME} ${someSet} { 10.255.255.1 }\n`);
      floorElement.push(mono() - s);
    }
  }
  log(`floors: tiny table ${f1(median(floorTable))} ms, one element ${f1(median(floorElement))} ms`);

  const timed = async (change: () => ReturnType<PolicyEngine['upsertPod']>): Promise<Timed> => {
    const before = driver.transactions;
    lastRun = null;
    const t0 = mono();
    const delta = change();
    const t1 = mono();
    await driver.apply(delta);
    const t2 = mono();
    if (driver.transactions !== before + 1) throw new BenchError(`a change wrote ${driver.transactions - before} transactions, not 1`);
    const elements = delta.setChanges.reduce((n, c) => n + c.add.length + c.remove.length, 0) + delta.setsCreated.length + delta.setsDeleted.length;
    return { totalMs: t2 - t0, engineMs: t1 - t0, nftMs: nftOf(), renderMs: t2 - t1 - nftOf(), elements, bytes: lastRun ? (lastRun as { bytes: number }).bytes : 0 };
  };

  // Label changes: local pods other than the iperf client, app a ↔ a + 20.
  const locals = podsOfNode(node).filter((i) => i !== IPERF.client);
  const apps = new Map<number, number>();
  const label: Timed[] = [];
  for (let j = 0; j < CHANGES; j++) {
    const i = locals[j % locals.length]!;
    const app = toggledApp(i, apps.get(i) ?? appOfPod(i));
    apps.set(i, app);
    label.push(await timed(() => engine.upsertPod(pod(i, app))));
  }
  log(`label changes: p50 ${f1(dist(label.map((x) => x.totalMs)).p50)} ms`);

  // Policy changes: port 80 ↔ 81 of policies that select neither iperf pod's app.
  const ks = Array.from({ length: POLICIES }, (_, k) => k).filter((k) => ![appOfPod(IPERF.client), appOfPod(IPERF.server)].includes(k % 100));
  const ports = new Map<number, number>();
  const pol: Timed[] = [];
  for (let j = 0; j < CHANGES; j++) {
    const k = ks[j % ks.length]!;
    const port = (ports.get(k) ?? INGRESS_PORT) === INGRESS_PORT ? INGRESS_PORT + 1 : INGRESS_PORT;
    ports.set(k, port);
    pol.push(await timed(() => engine.upsertPolicy(policy(k, PEERS, port))));
  }
  log(`policy changes: p50 ${f1(dist(pol.map((x) => x.totalMs)).p50)} ms`);

  let checkMs: number | undefined;
  let checkProblems: string[] | undefined;
  if (!args['no-check']) {
    t = mono();
    checkProblems = await driver.check();
    checkMs = mono() - t;
    log(`read-back compare ${f0(checkMs)} ms, ${checkProblems.length} problem(s)`);
  }

  // The reference: the same rule set rewritten whole, as a full sync does.
  const rewrite: NonNullable<AgentResult['rewrite']> = [];
  for (let r = 0; r < REWRITES; r++) {
    lastRun = null;
    const t0 = mono();
    const s = engine.snapshot();
    const t1 = mono();
    await driver.sync(s);
    const t2 = mono();
    rewrite.push({ totalMs: t2 - t0, snapshotMs: t1 - t0, renderMs: t2 - t1 - nftOf(), nftMs: nftOf() });
    log(`full rewrite ${r + 1}/${REWRITES}: ${f0(t2 - t0)} ms`);
  }
  return { ...base, label, policy: pol, rewrite, floorTable, floorElement, checkMs, checkProblems, baseChains: baseChainScript(engine) };
}

/** The commands of the full script that create the two base chains and their rules. */
function baseChainScript(engine: PolicyEngine): string {
  const { script } = renderFull(engine.snapshot(), OPTS);
  const lines = script.split('\n').filter((l) => /^add (chain|rule) inet weft_policy (pod_forward|pod_input)\b/.test(l));
  if (lines.length < 4) throw new BenchError(`base chains not found in the script (${lines.length} lines)`);
  return `${lines.join('\n')}\n`;
}

// ---------------------------------------------------------------------------------------------
// The bench: namespaces, the agents, iperf3.

const P = nsPrefix('np');
const NODE_NS = (n: number) => `${P}-n${n}`;
const POD_NS = (n: number) => `${P}-p${n}`;
const UNDERLAY = (n: number) => `172.16.0.${n}`;
const children = new Set<ChildProcess>();
const namespacesMade: string[] = [];

async function makeNamespaces(): Promise<void> {
  for (const n of [1, 2]) {
    namespacesMade.push(await addNetns(NODE_NS(n)));
    namespacesMade.push(await addNetns(POD_NS(n)));
  }
  await ipn(NODE_NS(1), 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', NODE_NS(2));
  const iperfPod = (n: number) => (n === 1 ? IPERF.client : IPERF.server);
  for (const n of [1, 2]) {
    const node = NODE_NS(n);
    const other = 3 - n;
    await ipn(node, 'addr', 'add', `${UNDERLAY(n)}/24`, 'dev', 'eth0');
    await ipn(node, 'link', 'set', 'eth0', 'up');
    await nsExec(node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1');
    await ipn(node, 'link', 'add', 'cni0', 'type', 'bridge');
    await ipn(node, 'addr', 'add', `${nodeGateway(n)}/24`, 'dev', 'cni0');
    await ipn(node, 'link', 'set', 'cni0', 'up');
    await ipn(node, 'link', 'add', 'vethpod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', POD_NS(n));
    await ipn(node, 'link', 'set', 'vethpod', 'master', 'cni0', 'up');
    await ipn(POD_NS(n), 'addr', 'add', `${podIP(iperfPod(n))}/24`, 'dev', 'eth0');
    await ipn(POD_NS(n), 'link', 'set', 'eth0', 'up');
    await ipn(POD_NS(n), 'route', 'add', 'default', 'via', nodeGateway(n));
    await ipn(node, 'route', 'add', nodeCidr(other), 'via', UNDERLAY(other));
  }
}

function runAgent(n: number, measure: boolean): Promise<AgentResult> {
  const a = [process.execPath, '--import=tsx', SELF, '--agent', String(n), '--changes', String(CHANGES), '--rewrites', String(REWRITES), '--peers', PEERS];
  if (measure) a.push('--measure');
  if (args['no-check']) a.push('--no-check');
  const child = spawn('ip', ['netns', 'exec', NODE_NS(n), ...a], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
  children.add(child);
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code, sig) => {
      children.delete(child);
      const last = out.trim().split('\n').pop() ?? '';
      if (code !== 0) return reject(new BenchError(`agent n${n} exited ${code ?? sig}`));
      try {
        resolve(JSON.parse(last) as AgentResult);
      } catch {
        reject(new BenchError(`agent n${n} printed no result: ${out.slice(-500)}`));
      }
    });
  });
}

function nftIn(n: number, script: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = spawn('ip', ['netns', 'exec', NODE_NS(n), 'nft', '-f', '-'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let err = '';
    c.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
    c.once('error', reject);
    c.once('exit', (code) => (code === 0 ? resolve('') : reject(new BenchError(`nft -f in n${n}: exit ${code}: ${err.trim()}`))));
    c.stdin.end(script);
  });
}

type Mode = 'none' | 'conntrack' | 'policy';
const MODES: readonly Mode[] = ['none', 'conntrack', 'policy'];
const CT_TABLE = 'weft_bench_ct';
const CT_SCRIPT = `add table inet ${CT_TABLE}\nadd chain inet ${CT_TABLE} ct_forward { type filter hook forward priority filter - 10 ; policy accept ; }\nadd rule inet ${CT_TABLE} ct_forward ct state established,related accept\n`;

async function tableExists(n: number, name: string): Promise<boolean> {
  const out = await nsExec(NODE_NS(n), 'nft', 'list', 'tables');
  return out.split('\n').some((l) => l.trim() === `table inet ${name}`);
}

async function hasBaseChains(n: number): Promise<boolean> {
  const out = await nsExec(NODE_NS(n), 'nft', 'list', 'chains', 'inet');
  return /chain pod_forward\b/.test(out);
}

/** Puts both nodes in `mode`: base chains of weft_policy present or not, the conntrack-only table present or not. */
async function setMode(mode: Mode, baseChains: Map<number, string>): Promise<void> {
  for (const n of [1, 2]) {
    const wantBase = mode === 'policy';
    const hasBase = await hasBaseChains(n);
    if (hasBase && !wantBase) {
      await nftIn(n, ['pod_forward', 'pod_input'].map((c) => `flush chain inet weft_policy ${c}\ndelete chain inet weft_policy ${c}\n`).join(''));
    } else if (!hasBase && wantBase) {
      await nftIn(n, baseChains.get(n)!);
    }
    const hasCt = await tableExists(n, CT_TABLE);
    if (mode === 'conntrack' && !hasCt) await nftIn(n, CT_SCRIPT);
    if (mode !== 'conntrack' && hasCt) await nftIn(n, `delete table inet ${CT_TABLE}\n`);
  }
}

/** Whether a TCP connection from the client pod to the server on `port` is refused, established, or dropped (1 s). */
async function probe(port: number): Promise<'open' | 'refused' | 'dropped'> {
  const c = spawn('ip', ['netns', 'exec', POD_NS(1), 'timeout', '1', 'bash', '-c', `exec 3<>/dev/tcp/${podIP(IPERF.server)}/${port}`], { stdio: 'ignore' });
  const code = await new Promise<number | null>((resolve) => c.once('exit', (x) => resolve(x)));
  return code === 0 ? 'open' : code === 124 ? 'dropped' : 'refused';
}

interface Counters {
  readonly allowPackets: number;
  readonly dropPackets: number;
}

/** Packets counted by a pod chain's allow rules and by its default-deny rule. */
async function chainCounters(n: number, chain: string): Promise<Counters> {
  const doc = JSON.parse(await nsExec(NODE_NS(n), 'nft', '-j', 'list', 'chain', 'inet', 'weft_policy', chain)) as { nftables: Array<{ rule?: { comment?: string; expr: Array<{ counter?: { packets: number } }> } }> };
  let allowPackets = 0;
  let dropPackets = 0;
  for (const item of doc.nftables) {
    if (!item.rule) continue;
    const packets = item.rule.expr.reduce((s, e) => s + (e.counter?.packets ?? 0), 0);
    if (item.rule.comment?.startsWith('default-deny')) dropPackets += packets;
    else allowPackets += packets;
  }
  return { allowPackets, dropPackets };
}

async function iperfRun(): Promise<{ gbps: number; retransmits: number }> {
  const out = await sh('ip', ['netns', 'exec', POD_NS(1), 'iperf3', '-c', podIP(IPERF.server), '-p', String(SERVER_PORT), '-t', String(IPERF_SECONDS), '-J'], { timeoutMs: (IPERF_SECONDS + 30) * 1000 });
  const j = JSON.parse(out) as { end: { sum_received: { bits_per_second: number }; sum_sent: { retransmits?: number } } };
  return { gbps: j.end.sum_received.bits_per_second / 1e9, retransmits: j.end.sum_sent.retransmits ?? 0 };
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

interface ThroughputResult {
  readonly runs: Record<Mode, Array<{ gbps: number; retransmits: number }>>;
  readonly probes: Record<Mode, string>;
  readonly clientEgress: Counters;
  readonly serverIngress: Counters;
  readonly connections: number;
}

async function throughput(baseChains: Map<number, string>): Promise<ThroughputResult> {
  const server = spawn('ip', ['netns', 'exec', POD_NS(2), 'iperf3', '-s', '-p', String(SERVER_PORT)], { stdio: 'ignore' });
  children.add(server);
  server.once('exit', () => children.delete(server));
  const t0 = mono();
  await setMode('none', baseChains);
  while ((await probe(SERVER_PORT)) !== 'open') {
    if (mono() - t0 > 10_000) throw new BenchError('iperf3 server did not start listening within 10 s');
    await new Promise((r) => setTimeout(r, 100));
  }
  const probes = {} as Record<Mode, string>;
  for (const m of MODES) {
    await setMode(m, baseChains);
    probes[m] = `port ${SERVER_PORT} ${await probe(SERVER_PORT)}, port ${BLOCKED_PORT} ${await probe(BLOCKED_PORT)}`;
  }
  const clientChain = podChainName(podKeyOf(IPERF.client), 'egress');
  const serverChain = podChainName(podKeyOf(IPERF.server), 'ingress');
  const c0 = await chainCounters(1, clientChain);
  const s0 = await chainCounters(2, serverChain);
  const runs: ThroughputResult['runs'] = { none: [], conntrack: [], policy: [] };
  let connections = 0;
  for (let r = 0; r < IPERF_RUNS; r++) {
    for (let j = 0; j < MODES.length; j++) {
      const m = MODES[(r + j) % MODES.length]!;
      await setMode(m, baseChains);
      const res = await iperfRun();
      if (m === 'policy') connections += 2; // iperf3: a control and a data connection
      runs[m].push(res);
      process.stderr.write(`  iperf3 run ${r + 1}/${IPERF_RUNS}, ${m}: ${f2(res.gbps)} Gbit/s\n`);
    }
  }
  await setMode('policy', baseChains);
  const c1 = await chainCounters(1, clientChain);
  const s1 = await chainCounters(2, serverChain);
  const diff = (a: Counters, b: Counters): Counters => ({ allowPackets: b.allowPackets - a.allowPackets, dropPackets: b.dropPackets - a.dropPackets });
  return { runs, probes, clientEgress: diff(c0, c1), serverIngress: diff(s0, s1), connections };
}

// ---------------------------------------------------------------------------------------------
// Printing

const d3 = (d: Dist) => `${f1(d.p50)} / ${f1(d.p99)} / ${f1(d.max)}`;
const verdict = (ok: boolean) => (ok ? 'met' : 'missed');

function report(r1: AgentResult, r2: AgentResult, tp: ThroughputResult | null, load: { start: string; beforeThroughput: string; end: string }): Record<string, unknown> {
  const s = r1.size;
  console.log(`\n## Programming (node n1: ${r1.localPods} local pods, ${r1.engineRules} engine rules; peers: ${PEERS})\n`);
  printTable(
    ['what', 'ms', 'of which nft process', 'note'],
    [
      ['engine build: 20 namespaces, 10 000 pods, 1 000 policies', f0(r1.buildMs), '–', `n2: ${f0(r2.buildMs)}`],
      ['engine snapshot()', f0(r1.snapshotMs), '–', `n2: ${f0(r2.snapshotMs)}`],
      ['**full programming from start** (driver.sync, one `nft -f`)', f0(r1.full.totalMs), f0(r1.full.nftMs), `render ${f0(r1.full.jsMs)} (its CPU ${f0(r1.full.jsCpuMs)}); n2: ${f0(r2.full.totalMs)} (nft ${f0(r2.full.nftMs)})`],
      ['read-back compare (driver.check) after the changes', r1.checkMs === undefined ? 'skipped' : f0(r1.checkMs), '–', r1.checkProblems ? `${r1.checkProblems.length} problems${r1.checkProblems.length ? `: ${r1.checkProblems.slice(0, 3).join('; ')}` : ''}` : ''],
    ],
  );
  console.log(
    `\ntable inet weft_policy on n1: ${s.sets} sets with ${s.setElements} elements, ${s.mapEntries} verdict-map entries, ${s.chains} chains, ${s.rules} rules; ` +
      `the full script is ${(s.scriptBytes / 1e6).toFixed(2)} MB in ${s.scriptLines} lines (n2: ${r2.size.setElements} elements, ${r2.size.rules} rules)`,
  );

  const lab = r1.label!;
  const pol = r1.policy!;
  const rw = r1.rewrite!;
  const row = (name: string, xs: Timed[]) => {
    const m = (f: (x: Timed) => number) => dist(xs.map(f));
    return [name, String(xs.length), `**${d3(m((x) => x.totalMs))}**`, `${f1(m((x) => x.engineMs).p50)} / ${f1(m((x) => x.engineMs).p99)}`, `${f1(m((x) => x.renderMs).p50)} / ${f1(m((x) => x.renderMs).p99)}`, `${f1(m((x) => x.nftMs).p50)} / ${f1(m((x) => x.nftMs).p99)}`, `${f0(median(xs.map((x) => x.elements)))} / ${f0(median(xs.map((x) => x.bytes)))}`];
  };
  console.log('\n## Incremental changes: engine call → driver.apply() resolved, ms\n');
  printTable(['change', 'n', 'total p50 / p99 / max', 'engine p50 / p99', 'driver JS p50 / p99', 'nft process p50 / p99', 'median set elements touched / script bytes'], [row('pod label (app a ↔ a + 20)', lab), row('policy (ingress port 80 ↔ 81)', pol)]);
  const ft = dist(r1.floorTable!);
  const fe = dist(r1.floorElement!);
  console.log(`\nnft floors in the same namespace (20 each): a one-command transaction on a tiny table of its own p50 ${f1(ft.p50)} / p99 ${f1(ft.p99)} ms; one element added to / deleted from a set of the loaded table p50 ${f1(fe.p50)} / p99 ${f1(fe.p99)} ms`);

  const rwTotal = dist(rw.map((x) => x.totalMs));
  const rwNft = dist(rw.map((x) => x.nftMs));
  console.log('\n## Reference: the same rule set rewritten whole (driver.sync(engine.snapshot()): what a full sync does)\n');
  printTable(
    ['what', 'n', 'p50', 'p99', 'split p50 (snapshot / render / nft)'],
    [['full rewrite', String(rw.length), f0(rwTotal.p50), f0(rwTotal.p99), `${f0(median(rw.map((x) => x.snapshotMs)))} / ${f0(median(rw.map((x) => x.renderMs)))} / ${f0(rwNft.p50)}`]],
  );
  const labP99 = dist(lab.map((x) => x.totalMs)).p99;
  const polP99 = dist(pol.map((x) => x.totalMs)).p99;
  const incP99 = dist([...lab, ...pol].map((x) => x.totalMs)).p99;
  const speedup = rwTotal.p50 / incP99;
  const speedupNft = rwNft.p50 / incP99;

  const rows: string[][] = [
    ['full programming from start', `${f0(r1.full.totalMs)} ms (n2 ${f0(r2.full.totalMs)})`, `≤ ${TARGET.fullMs} ms`, verdict(Math.max(r1.full.totalMs, r2.full.totalMs) <= TARGET.fullMs)],
    ['incremental p99: pod label / policy / both', `${f1(labP99)} / ${f1(polP99)} / ${f1(incP99)} ms`, `≤ ${TARGET.incrP99Ms} ms`, verdict(incP99 <= TARGET.incrP99Ms)],
    ['full rewrite p50 / incremental p99', `${f1(speedup)}× (nft process alone: ${f1(speedupNft)}×)`, `≥ ${TARGET.speedup}×`, verdict(speedup >= TARGET.speedup)],
  ];
  let tpOut: Record<string, unknown> | null = null;
  if (tp) {
    const med = (m: Mode) => median(tp.runs[m].map((x) => x.gbps));
    const ratio = med('policy') / med('none');
    const ratioCt = med('policy') / med('conntrack');
    console.log(`\n## Throughput: iperf3 TCP, 1 stream, ${IPERF_SECONDS} s, pod ${IPERF.client} on n1 (${podIP(IPERF.client)}) → pod ${IPERF.server} on n2 (${podIP(IPERF.server)}:${SERVER_PORT}), Gbit/s\n`);
    printTable(
      ['forward hook in both nodes', 'runs', 'median', 'ratio to none', 'retransmits', `probe (port ${SERVER_PORT} / ${BLOCKED_PORT})`],
      MODES.map((m) => [m === 'none' ? 'none (no policy)' : m === 'conntrack' ? 'conntrack only (`ct state established,related accept`)' : '1 000-policy table', tp.runs[m].map((x) => f2(x.gbps)).join(', '), `**${f2(med(m))}**`, f2(med(m) / med('none')), tp.runs[m].map((x) => String(x.retransmits)).join(', '), tp.probes[m]]),
    );
    console.log(
      `\npolicy path during the policy runs (${tp.connections} connections): client's egress chain on n1 allowed ${tp.clientEgress.allowPackets} packets (dropped ${tp.clientEgress.dropPackets}); ` +
        `server's ingress chain on n2 allowed ${tp.serverIngress.allowPackets} (dropped ${tp.serverIngress.dropPackets}): one packet per connection, the rest are established`,
    );
    rows.push(['throughput with the 1 000 policies / without', `${f2(ratio)} (vs conntrack only: ${f2(ratioCt)})`, `≥ ${TARGET.throughput}`, verdict(ratio >= TARGET.throughput)]);
    tpOut = { ...tp, medianGbps: { none: med('none'), conntrack: med('conntrack'), policy: med('policy') }, ratio, ratioCt };
  }
  console.log('\n## Against the targets\n');
  printTable(['measure', 'figure', 'target', 'verdict'], rows);
  console.log(`\nload average: at start ${load.start}; before throughput ${load.beforeThroughput}; at end ${load.end}`);
  return { peers: PEERS, changes: CHANGES, rewrites: REWRITES, n1: { ...r1, baseChains: undefined }, n2: { ...r2, baseChains: undefined }, throughput: tpOut, speedup, incP99, load };
}

// ---------------------------------------------------------------------------------------------

async function cleanup(): Promise<void> {
  for (const c of children) if (c.pid !== undefined && c.exitCode === null) c.kill('SIGTERM');
  for (const ns of namespacesMade.splice(0)) await delNetns(ns);
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces, nft)');
  const load = { start: loadavg(), beforeThroughput: '', end: '' };
  const nftv = (await sh('nft', ['--version'])).trim();
  const iperfv = args['no-throughput'] ? 'not used' : await ensureIperf();
  const kernel = (await sh('uname', ['-r'])).trim();
  const others = existsSync('/var/run/netns') ? readdirSync('/var/run/netns').filter((n) => !n.startsWith(P)).length : 0;
  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, kernel ${kernel}; ${nftv}; ${iperfv}; node ${process.version}`);
  console.log(`load average at start: ${load.start}; other network namespaces present (other tests running?): ${others}`);
  console.log(`workload: ${PODS} pods (100 per node), ${POLICIES} policies, peers ${PEERS}; ${CHANGES} changes of each kind, ${REWRITES} full rewrites; IPv4 table (families [4])`);

  let stopping = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    console.error(`${sig}: cleaning up`);
    void cleanup().finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, onSignal);
  try {
    await makeNamespaces();
    const brnf = (await nsExec(NODE_NS(1), 'cat', '/proc/sys/net/bridge/bridge-nf-call-iptables')).trim();
    console.log(`node namespaces: net.bridge.bridge-nf-call-iptables = ${brnf} (per namespace), net.ipv4.ip_forward = 1, host-gw routes between ${nodeCidr(1)} and ${nodeCidr(2)}\n`);
    const r1 = await runAgent(1, true);
    const r2 = await runAgent(2, false);
    load.beforeThroughput = loadavg();
    let tp: ThroughputResult | null = null;
    if (!args['no-throughput']) {
      if (PEERS !== 'matching') console.log('\n(throughput skipped: with --peers empty no policy allows the iperf pods)');
      else tp = await throughput(new Map([[1, r1.baseChains], [2, r2.baseChains]]));
    }
    load.end = loadavg();
    const out = report(r1, r2, tp, load);
    if (args.json) writeFileSync(args.json, JSON.stringify(out, null, 2));
  } finally {
    await cleanup();
  }
}

if (args.agent !== undefined) {
  agent(Number(args.agent), args.measure)
    .then((r) => process.stdout.write(`${JSON.stringify(r)}\n`))
    .catch((e: unknown) => {
      console.error(e);
      process.exitCode = 1;
    });
} else {
  main().catch((e: unknown) => {
    console.error(e);
    process.exitCode = 1;
  });
}
