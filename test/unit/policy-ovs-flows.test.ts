// src/policy/ovs/flows.ts against the policy engine's reference reading (src/policy/verdict.ts):
// a seeded random sequence of namespace, pod and policy events drives a PolicyEngine; its deltas
// move a PolicyFlowModel, whose flow mods are applied to a simulated bridge (a map of flows, as
// add / delete_strict leave OVS's table). After every batch random IPv4 packets are walked
// through tables 52–55 of that bridge (the pipeline's policy frame plus the model's flows) by an
// OpenFlow simulator written from ovs-fields(7) (test/helpers/openflow-sim.ts), and the verdict
// per direction must equal decide() at the source pod (egress) and destination pod (ingress)
// that run on this node; the rule whose conjunction id the allowing flow loads must be one that
// allows the packet. The same holds for a model reset from the engine's snapshot, and the two
// models' flows are equal. The seed is printed; WEFT_FUZZ_SEED=<n> repeats a run.
import assert from 'node:assert/strict';

import { macFromIP, pipelineFlows, renderFlow, TABLES, type Flow, type FlowMod } from '../../src/backend/ovs/pipeline.js';
import { PolicyEngine } from '../../src/policy/engine.js';
import type { DirectionPolicy, LocalPodPolicy, PolicyDelta, PolicySnapshot } from '../../src/policy/model.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { PolicyFlowModel } from '../../src/policy/ovs/flows.js';
import type { Protocol } from '../../src/policy/ports.js';
import { decide } from '../../src/policy/verdict.js';
import { IPAddr } from '../../src/util/ip.js';
import { FlowTables, type SimPacket, type SimProto } from '../helpers/openflow-sim.js';
import { plainSnapshot } from '../helpers/policy-snapshot.js';
import { SeededRandom as Gen } from '../helpers/prng.js';

const SEED = Number(process.env['WEFT_FUZZ_SEED'] ?? Date.now() % 0x100000000);
const ROUND = 5;
const NODE = 'n1';
const GATEWAY = '10.88.0.1';
const FRAME = pipelineFlows(ROUND, { vni: 1, tunnelPort: 32768, gatewayPort: 32769, gatewayIP: IPAddr.parse(GATEWAY), gatewayMAC: macFromIP(IPAddr.parse(GATEWAY)) }, { policy: true }).filter(
  (f) => TABLES[f.table] >= TABLES.egressRule && TABLES[f.table] <= TABLES.ingressDefaultRule,
);

/** A flow as written: cookie, table, priority, match and actions (renderFlow also checks every value). */
const flowLine = (f: Flow): string => renderFlow(f);
const sortedLines = (flows: Iterable<Flow>): string[] => [...flows].map(flowLine).sort();

/** What add / delete_strict bundles leave on a bridge: one flow per (table, priority, match). */
class FakeBridge {
  readonly flows = new Map<string, Flow>();
  load(flows: readonly Flow[]): void {
    this.flows.clear();
    for (const f of flows) this.flows.set(PolicyFlowModel.keyOf(f), f);
  }
  apply(mods: readonly FlowMod[]): void {
    const seen = new Set<string>();
    for (const m of mods) {
      const k = m.op === 'delete' ? '' : PolicyFlowModel.keyOf(m.flow);
      assert.ok(!seen.has(k), `two mods of one flow in one bundle: ${k}`);
      seen.add(k);
      if (m.op === 'add') this.flows.set(PolicyFlowModel.keyOf(m.flow), m.flow);
      else if (m.op === 'delete-strict') {
        const key = PolicyFlowModel.keyOf(m.flow);
        assert.ok(this.flows.has(key), `delete_strict of a flow the bridge lacks: ${key}`);
        this.flows.delete(key);
      } else assert.fail(`the incremental path sent a cookie delete: ${String(m.cookie)}`);
    }
  }
}

// ---- random engine events ----


const NAMESPACES = ['x', 'y'];
const POD_NAMES = Array.from({ length: 8 }, (_, i) => `p${i}`);
/** Each pod has its own addresses (no two pods claim one): on this node 10.88.0.x, elsewhere 10.89.0.x. */
const podIndex = (ns: string, name: string) => NAMESPACES.indexOf(ns) * POD_NAMES.length + POD_NAMES.indexOf(name);
const podV4 = (ns: string, name: string, node: string) => `${node === NODE ? '10.88.0' : '10.89.0'}.${10 + podIndex(ns, name)}`;
const podV6 = (ns: string, name: string) => `fd88::${(10 + podIndex(ns, name)).toString(16)}`;
const NODE_IP = '192.168.50.1';
const EXTERNAL = [NODE_IP, '192.168.50.2', '10.0.0.1', '10.89.200.9', '10.90.1.1', '192.168.1.7', '192.168.255.255', '8.8.8.8', '172.16.0.1'];
const ALL_V4 = [...NAMESPACES.flatMap((ns) => POD_NAMES.flatMap((n) => [podV4(ns, n, NODE), podV4(ns, n, 'n2')])), ...EXTERNAL];
const PORTS = [0, 1, 52, 53, 54, 79, 80, 81, 443, 7999, 8000, 8001, 8007, 8008, 8010, 8011, 65535];
const PROTOS: readonly SimProto[] = ['tcp', 'udp', 'sctp', 'icmp'];
const PROTOCOL_OF: Record<SimProto, Protocol | null> = { tcp: 'TCP', udp: 'UDP', sctp: 'SCTP', icmp: null };

function randomPod(g: Gen, ns: string, name: string): unknown {
  const node = g.chance(0.65) ? NODE : 'n2';
  // Now and then a host-network pod: the node's address, neither selected nor a pod peer.
  const hostNetwork = g.chance(0.05);
  const ips = hostNetwork ? [{ ip: node === NODE ? NODE_IP : '192.168.50.2' }] : [{ ip: podV4(ns, name, node) }, ...(g.chance(0.2) ? [{ ip: podV6(ns, name) }] : [])];
  const labels: Record<string, string> = { app: g.pick(['a', 'b', 'c']) };
  if (g.chance(0.5)) labels['extra'] = g.pick(['1', '2']);
  return {
    metadata: { namespace: ns, name, labels, ...(g.chance(0.05) ? { deletionTimestamp: '2026-01-01T00:00:00Z' } : {}) },
    spec: {
      nodeName: node,
      hostNetwork,
      containers: [{ name: 'c', ports: [{ name: 'http', containerPort: g.pick([80, 81, 8005]), protocol: 'TCP' }, { name: 'dns', containerPort: 53, protocol: g.pick(['UDP', 'UDP', 'TCP']) }] }],
    },
    status: { phase: g.pick(['Running', 'Running', 'Running', 'Pending', 'Succeeded']), podIPs: ips },
  };
}

function randomPolicy(g: Gen, ns: string, name: string): unknown {
  const sel = () => g.pick([{}, { matchLabels: { app: g.pick(['a', 'b', 'c']) } }, { matchExpressions: [{ key: 'app', operator: 'In', values: ['a', 'b'] }] }, { matchLabels: { extra: '1' } }]);
  const peer = () =>
    g.pick([
      { podSelector: sel() },
      { namespaceSelector: { matchLabels: { team: g.pick(['x', 'y']) } }, podSelector: sel() },
      { namespaceSelector: {} },
      { ipBlock: { cidr: '10.0.0.0/8', except: ['10.88.0.14/32', '10.89.0.0/17'] } },
      { ipBlock: { cidr: '0.0.0.0/0' } },
      { ipBlock: { cidr: '0.0.0.0/0', except: ['10.88.0.0/24'] } },
      { ipBlock: { cidr: '192.168.0.0/16', except: ['192.168.1.0/25'] } },
      { ipBlock: { cidr: '10.88.0.16/28' } },
      { ipBlock: { cidr: 'fd00::/8' } },
    ]);
  const ports = () =>
    g.pick([
      undefined,
      [{ port: 80, protocol: 'TCP' }],
      [{ port: 'http' }],
      [{ port: 8000, endPort: 8010, protocol: 'UDP' }, { port: 'dns', protocol: 'UDP' }],
      [{ protocol: 'UDP' }],
      [{ port: 53, protocol: 'UDP' }, { port: 53, protocol: 'TCP' }],
      [{ port: 1, endPort: 65535, protocol: 'TCP' }],
      [{ port: 'dns', protocol: 'TCP' }, { port: 81 }],
      [{ port: 79, endPort: 81, protocol: 'SCTP' }],
    ]);
  const rule = (peersField: 'from' | 'to') => {
    const r: Record<string, unknown> = {};
    if (g.chance(0.8)) r[peersField] = [peer(), ...(g.chance(0.3) ? [peer()] : [])];
    const p = ports();
    if (p) r['ports'] = p;
    return r;
  };
  const spec: Record<string, unknown> = { podSelector: sel(), policyTypes: g.pick([['Ingress'], ['Egress'], ['Ingress', 'Egress']]) };
  if (g.chance(0.8)) spec['ingress'] = Array.from({ length: g.pick([0, 1, 1, 2]) }, () => rule('from'));
  if (g.chance(0.8)) spec['egress'] = Array.from({ length: g.pick([0, 1, 1, 2]) }, () => rule('to'));
  return JSON.parse(JSON.stringify({ metadata: { namespace: ns, name }, spec })) as unknown;
}

/** One random event on `e`; returns its delta and a description. */
function randomEvent(g: Gen, e: PolicyEngine): { delta: PolicyDelta; what: string } {
  const k = g.r();
  const ns = g.pick(NAMESPACES);
  if (k < 0.5) {
    const name = g.pick(POD_NAMES);
    return { delta: e.upsertPod(parsePod(randomPod(g, ns, name))), what: `pod ${ns}/${name}` };
  }
  if (k < 0.6) {
    const name = g.pick(POD_NAMES);
    return { delta: e.deletePod(ns, name), what: `delete pod ${ns}/${name}` };
  }
  if (k < 0.62) {
    return { delta: e.deleteNamespace(ns), what: `delete namespace ${ns}` };
  }
  if (k < 0.65) {
    return { delta: e.upsertNamespace(parseNamespace({ metadata: { name: ns, labels: { team: g.pick(['x', 'y']) } } })), what: `namespace ${ns}` };
  }
  const name = `np${g.int(4)}`;
  if (k < 0.92) return { delta: e.upsertPolicy(parseNetworkPolicy(randomPolicy(g, ns, name))), what: `policy ${ns}/${name}` };
  return { delta: e.deletePolicy(ns, name), what: `delete policy ${ns}/${name}` };
}

// ---- the oracle ----

function localPodsByIP(snap: PolicySnapshot): Map<string, { key: string; pod: LocalPodPolicy }> {
  const out = new Map<string, { key: string; pod: LocalPodPolicy }>();
  for (const [key, pod] of snap.pods) {
    for (const ip of pod.ips) {
      assert.ok(!out.has(ip), `two local pods hold ${ip}: the generator must not make that`);
      out.set(ip, { key, pod });
    }
  }
  return out;
}

function randomPacket(g: Gen, local: readonly string[]): SimPacket {
  // Mostly packets that meet a local pod at one end or both.
  const end = () => (local.length > 0 && g.chance(0.6) ? g.pick(local) : g.pick(ALL_V4));
  const nwSrc = g.chance(0.08) ? GATEWAY : end();
  const nwDst = end();
  const proto = g.pick(PROTOS);
  const localSet = new Set(local);
  const reg0 = 0x100 | (localSet.has(nwSrc) ? 3 : nwSrc === GATEWAY || !nwSrc.startsWith('10.') ? 2 : 1);
  return { reg0, nwSrc, nwDst, proto, tpDst: proto === 'icmp' ? 0 : g.pick(PORTS) };
}

interface Expect {
  readonly allowed: boolean;
  /** The rule ids that on their own allow the packet (empty: unrestricted, or denied). */
  readonly rules: ReadonlySet<string>;
  readonly unrestricted: boolean;
}

/** decide() at one pod in one direction, and which of its rules alone allow the packet. */
function expectAt(snap: PolicySnapshot, dir: DirectionPolicy, peer: string, proto: Protocol | null, port: number): Expect {
  const v = decide(snap, dir, peer, proto, port);
  if (!dir.isolated) return { allowed: v.allowed, rules: new Set(), unrestricted: true };
  const rules = new Set(dir.rules.filter((ref) => decide(snap, { isolated: true, rules: [ref] }, peer, proto, port).allowed).map((ref) => ref.rule));
  return { allowed: v.allowed, rules, unrestricted: false };
}

/**
 * Walks packets through `flows` (tables 52–55) and compares each direction with decide(). Returns
 * a description of the first disagreement, or null.
 */
function disagreement(flows: Iterable<Flow>, model: PolicyFlowModel, snap: PolicySnapshot, packets: readonly SimPacket[]): string | null {
  const tables = new FlowTables([...FRAME, ...flows]);
  const byIP = localPodsByIP(snap);
  const conj = model.conjunctions();
  for (const pkt of packets) {
    const proto = PROTOCOL_OF[pkt.proto];
    const what = `${pkt.proto} ${pkt.nwSrc} → ${pkt.nwDst}:${pkt.tpDst} (reg0 0x${pkt.reg0.toString(16)})`;
    // Egress at the source pod, if it runs here.
    const src = byIP.get(pkt.nwSrc);
    const wantEgress = src ? expectAt(snap, src.pod.egress, pkt.nwDst, proto, pkt.tpDst) : null;
    // One walk from 52 to the commit table; the ingress half alone only when egress dropped it.
    const all = tables.run(pkt, 'egressRule', 'conntrackCommit');
    const egressAllowed = all.path.includes(TABLES.ingressRule);
    const eg = all;
    if (egressAllowed !== (wantEgress?.allowed ?? true)) return `${what}: egress ${egressAllowed ? 'allowed' : 'dropped'} by the flows, decide() at ${src?.key ?? '(no local pod)'} says ${wantEgress?.allowed ? 'allow' : 'deny'} (path ${eg.path.join('→')})`;
    if (egressAllowed) {
      if (eg.reg2 === 0) {
        if (wantEgress && !wantEgress.unrestricted) return `${what}: egress allowed without a rule id in reg2`;
      } else {
        const rule = conj.get(eg.reg2);
        if (!rule || !wantEgress?.rules.has(rule.id)) return `${what}: egress allowed by conjunction ${eg.reg2} (rule ${rule?.id ?? '?'}), which does not allow it on its own (allowing: ${[...(wantEgress?.rules ?? [])].join(' ') || 'none'})`;
      }
    }
    for (const id of eg.completed.get(TABLES.egressRule) ?? []) {
      const rule = conj.get(id);
      if (!rule || !wantEgress?.rules.has(rule.id)) return `${what}: egress conjunction ${id} (rule ${rule?.id ?? '?'}) completed, but that rule does not allow the packet`;
    }
    // Ingress at the destination pod, if it runs here (the node's own address skips it).
    const dst = byIP.get(pkt.nwDst);
    const bypass = pkt.nwSrc === GATEWAY && (pkt.reg0 & 0xf) === 2;
    const wantIngress = dst && !bypass ? expectAt(snap, dst.pod.ingress, pkt.nwSrc, proto, pkt.tpDst) : null;
    const ig = egressAllowed ? all : tables.run(pkt, 'ingressRule', 'conntrackCommit');
    const ingressAllowed = ig.outcome === 'reached';
    if (ingressAllowed !== (wantIngress?.allowed ?? true)) return `${what}: ingress ${ingressAllowed ? 'allowed' : 'dropped'} by the flows, decide() at ${dst?.key ?? '(no local pod)'}${bypass ? ' (gateway bypass)' : ''} says ${wantIngress?.allowed ?? true ? 'allow' : 'deny'} (path ${ig.path.join('→')})`;
    if (ingressAllowed && ig.reg3 !== 0) {
      const rule = conj.get(ig.reg3);
      if (!rule || !wantIngress?.rules.has(rule.id)) return `${what}: ingress allowed by conjunction ${ig.reg3} (rule ${rule?.id ?? '?'}), which does not allow it on its own`;
    } else if (ingressAllowed && wantIngress && !wantIngress.unrestricted) return `${what}: ingress allowed without a rule id in reg3`;
    for (const id of ig.completed.get(TABLES.ingressRule) ?? []) {
      const rule = conj.get(id);
      if (!rule || !wantIngress?.rules.has(rule.id)) return `${what}: ingress conjunction ${id} (rule ${rule?.id ?? '?'}) completed, but that rule does not allow the packet`;
    }
    if ((all.outcome === 'reached') !== (egressAllowed && ingressAllowed)) return `${what}: the walk through 52–55 ends ${all.outcome} in ${all.table}, egress ${egressAllowed}, ingress ${ingressAllowed}`;
  }
  return null;
}

function newEngine(): PolicyEngine {
  const e = new PolicyEngine(NODE);
  for (const n of NAMESPACES) e.upsertNamespace(parseNamespace({ metadata: { name: n, labels: { team: n } } }));
  return e;
}

describe('NetworkPolicy OVS flows (src/policy/ovs/flows.ts) against decide()', function () {
  this.timeout(30_000);

  it(`the simulator follows ovs-fields(7) on a hand-made table (conjunctions, fall-through, conj_id lookup)`, () => {
    const cookie = 0n;
    const f = (priority: number, match: Flow['match'], actions: Flow['actions']): Flow => ({ table: 'egressRule', priority, match, actions, cookie });
    const conj = (id: number, clause: number, clauses: number) => ({ type: 'conjunction', id, clause, clauses }) as const;
    const tables = new FlowTables([
      f(200, [{ field: 'ip' }, { field: 'nw_src', value: '10.0.0.1' }], [conj(1, 1, 2), conj(2, 1, 2)]),
      f(200, [{ field: 'ip' }, { field: 'nw_dst', value: '10.0.1.0/24' }], [conj(1, 2, 2)]),
      f(200, [{ field: 'tcp' }, { field: 'tp_dst', value: 0x50, mask: 0xfff0 }], [conj(2, 2, 2)]),
      f(200, [{ field: 'conj_id', value: 1 }, { field: 'ip' }], [{ type: 'set_field', field: 'reg2', value: 1 }, { type: 'goto_table', table: 54 }]),
      // conjunction 2 has no conj_id flow: as if it had not matched.
      f(100, [{ field: 'ip' }, { field: 'nw_src', value: '10.0.0.1' }, { field: 'nw_dst', value: '10.0.2.2' }], [{ type: 'drop' }]),
      f(0, [], [{ type: 'goto_table', table: 53 }]),
    ]);
    const pkt = (nwDst: string, proto: SimProto, tpDst: number): SimPacket => ({ reg0: 3, nwSrc: '10.0.0.1', nwDst, proto, tpDst });
    const r1 = tables.run(pkt('10.0.1.9', 'udp', 1), 'egressRule', 'ingressRule');
    assert.deepEqual([r1.outcome, r1.reg2, r1.completed.get(52)], ['reached', 1, [1]]);
    const r2 = tables.run(pkt('10.0.2.2', 'tcp', 0x55), 'egressRule', 'egressDefaultRule');
    assert.deepEqual([r2.outcome, r2.table], ['drop', 52], 'conjunction 2 completes but has no conj_id flow: the hard match stands');
    const r3 = tables.run(pkt('10.0.3.3', 'tcp', 0x60), 'egressRule', 'egressDefaultRule');
    assert.deepEqual([r3.outcome, r3.table], ['reached', 53]);
  });

  it(`property: random events; the delta-kept and the snapshot-built flows decide every packet as decide() does (seed ${SEED})`, () => {
    console.log(`      policy-ovs-flows seed ${SEED} (repeat with WEFT_FUZZ_SEED=${SEED})`);
    const t0 = performance.now();
    const cpu0 = process.cpuUsage();
    const g = new Gen(SEED);
    const e = newEngine();
    const model = new PolicyFlowModel();
    model.reset(e.snapshot());
    const bridge = new FakeBridge();
    bridge.load(model.flows(ROUND));
    model.markAllWritten(ROUND);
    const EVENTS = 400;
    let pending: PolicyDelta[] = [];
    let packets = 0;
    let writes = 0;
    let flowsSeen = 0;
    const history: string[] = [];
    for (let i = 1; i <= EVENTS; i++) {
      const { delta, what } = randomEvent(g, e);
      history.push(what);
      pending.push(delta);
      // Now and then several deltas in one write, as the enforcer batches them.
      if (g.chance(0.3) && i % 25 !== 0 && i !== EVENTS) continue;
      const ctx = () => `event ${i} (${what}; last: ${history.slice(-6).join(', ')}) seed ${SEED}`;
      for (const d of pending) model.apply(d);
      pending = [];
      const { mods, commit } = model.pendingMods(ROUND);
      bridge.apply(mods);
      commit();
      writes++;
      assert.deepEqual(model.pendingMods(ROUND).mods, [], `mods pending after they were written (${ctx()})`);
      flowsSeen = Math.max(flowsSeen, bridge.flows.size);
      const snap = e.snapshot();
      // The semantics: random packets through the flows the bundles left on the bridge.
      const local = [...snap.pods.values()].flatMap((p) => p.ips.filter((ip) => IPAddr.parse(ip).family === 4));
      const batch = Array.from({ length: 30 }, () => randomPacket(g, local));
      packets += batch.length;
      const bad = disagreement(bridge.flows.values(), model, snap, batch);
      if (bad !== null) assert.fail(`bridge after ${ctx()}: ${bad}`);
      // Every third write: the bridge is the model, the model's state the engine's, and a model
      // built afresh from the snapshot has the same flows and decides the same.
      if (writes % 3 !== 0 && i !== EVENTS) continue;
      assert.deepEqual(plainSnapshot(model.state), plainSnapshot(snap), `model state after ${ctx()}`);
      const fresh = new PolicyFlowModel();
      fresh.reset(snap);
      const onBridge = sortedLines(bridge.flows.values());
      assert.deepEqual(onBridge, sortedLines(model.flows(ROUND)), `bridge vs model after ${ctx()}`);
      assert.deepEqual(onBridge, sortedLines(fresh.flows(ROUND)), `delta-kept vs snapshot-built flows after ${ctx()}`);
      const badFresh = disagreement(fresh.flows(ROUND), fresh, snap, batch);
      if (badFresh !== null) assert.fail(`snapshot-built model after ${ctx()}: ${badFresh}`);
    }
    const ms = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);
    console.log(`      ${EVENTS} events in ${writes} writes, ${packets} packets, up to ${flowsSeen} flows: ${ms.toFixed(0)} ms (${((cpu.user + cpu.system) / 1000).toFixed(0)} ms CPU)`);
  });

  it('property: an event that changes nothing writes nothing (the same object again) (seeded)', () => {
    const g = new Gen(SEED ^ 0x51);
    const e = newEngine();
    const model = new PolicyFlowModel();
    model.reset(e.snapshot());
    model.markAllWritten(ROUND);
    const pods = new Map<string, unknown>();
    const policies = new Map<string, unknown>();
    for (let i = 1; i <= 200; i++) {
      const ns = g.pick(NAMESPACES);
      let again: () => PolicyDelta;
      if (g.chance(0.6)) {
        const name = g.pick(POD_NAMES);
        const raw = pods.get(`${ns}/${name}`) && g.chance(0.5) ? pods.get(`${ns}/${name}`) : randomPod(g, ns, name);
        pods.set(`${ns}/${name}`, raw);
        model.apply(e.upsertPod(parsePod(raw)));
        again = () => e.upsertPod(parsePod(raw));
      } else {
        const name = `np${g.int(4)}`;
        const raw = randomPolicy(g, ns, name);
        policies.set(`${ns}/${name}`, raw);
        model.apply(e.upsertPolicy(parseNetworkPolicy(raw)));
        again = () => e.upsertPolicy(parseNetworkPolicy(raw));
      }
      model.pendingMods(ROUND).commit();
      model.apply(again());
      assert.deepEqual(model.pendingMods(ROUND).mods, [], `event ${i} repeated wrote flow mods (seed ${SEED ^ 0x51})`);
    }
  });

  describe('what an event writes', () => {
    const pod = (name: string, ip: string, labels: Record<string, string>, node = NODE) =>
      parsePod({ metadata: { namespace: 'x', name, labels }, spec: { nodeName: node, containers: [] }, status: { phase: 'Running', podIPs: [{ ip }] } });
    const allowFromA = parseNetworkPolicy({
      metadata: { namespace: 'x', name: 'allow-a' },
      spec: { podSelector: { matchLabels: { app: 'b' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }] }] },
    });

    function written(e: PolicyEngine, model: PolicyFlowModel, d: PolicyDelta): FlowMod[] {
      model.apply(d);
      const { mods, commit } = model.pendingMods(ROUND);
      commit();
      // Whatever was written, the model still equals a fresh one.
      const fresh = new PolicyFlowModel();
      fresh.reset(e.snapshot());
      assert.deepEqual(sortedLines(model.flows(ROUND)), sortedLines(fresh.flows(ROUND)));
      return mods;
    }

    function setup(nb: number): { e: PolicyEngine; model: PolicyFlowModel } {
      const e = newEngine();
      for (let i = 0; i < nb; i++) e.upsertPod(pod(`b${i}`, `10.88.1.${i + 2}`, { app: 'b', extra: '1' }));
      e.upsertPod(pod('a0', '10.88.0.2', { app: 'a' }));
      e.upsertPolicy(allowFromA);
      const model = new PolicyFlowModel();
      model.reset(e.snapshot());
      model.markAllWritten(ROUND);
      return { e, model };
    }

    it('a label change that leaves the pod in the same rules writes no flow mod', () => {
      const { e, model } = setup(3);
      assert.deepEqual(written(e, model, e.upsertPod(pod('b1', '10.88.1.3', { app: 'b', extra: '2' }))), []);
      assert.deepEqual(written(e, model, e.upsertPod(pod('a0', '10.88.0.2', { app: 'a', other: 'z' }))), []);
    });

    it('a new peer pod of a rule over N pods is one flow mod (its peer flow), whatever N', () => {
      for (const n of [1, 10, 60]) {
        const { e, model } = setup(n);
        const before = model.flows(ROUND).length;
        const mods = written(e, model, e.upsertPod(pod('a1', '10.89.0.7', { app: 'a' }, 'n2')));
        assert.equal(mods.length, 1, `N=${n}: ${JSON.stringify(mods.map((m) => m.op))}`);
        const m = mods[0]!;
        assert.equal(m.op, 'add');
        assert.ok(m.op === 'add' && m.flow.table === 'ingressRule' && m.flow.match.some((x) => x.field === 'nw_src' && 'value' in x && x.value === '10.89.0.7'), renderFlow((m as { flow: Flow }).flow));
        assert.equal(model.flows(ROUND).length, before + 1);
        // And it goes the same way.
        const gone = written(e, model, e.deletePod('x', 'a1'));
        assert.deepEqual(gone.map((x) => x.op), ['delete-strict'], `N=${n}`);
      }
    });

    it('a new selected pod is O(1) mods too (its pod flow and its default drop)', () => {
      for (const n of [1, 40]) {
        const { e, model } = setup(n);
        const mods = written(e, model, e.upsertPod(pod('bn', '10.88.1.200', { app: 'b' })));
        assert.equal(mods.length, 2, `N=${n}: ${mods.map((m) => (m.op === 'add' ? renderFlow(m.flow) : m.op)).join(' | ')}`);
      }
    });
  });
});
