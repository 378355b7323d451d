// The engine's incremental path against its own full computation and against an independent
// reading of the spec. A seeded random sequence of namespace, pod and policy events (labels from
// a small alphabet so selectors hit, addresses from a small pool so two pods sometimes claim
// one, named ports, host-network and finished pods, ipBlocks with excepts): after every event
// the deltas applied so far equal snapshot(); every so often a fresh engine fed the surviving
// objects gives the same snapshot, and random probes decided from the output agree with a naive
// evaluator written straight from the NetworkPolicy documentation. The seed is printed;
// WEFT_FUZZ_SEED=<n> repeats a run. A last case measures (never asserts) event costs at 10 000
// pods and 1 000 policies.
import assert from 'node:assert/strict';

import { PolicyEngine } from '../../src/policy/engine.js';
import { applyDelta, emptySnapshot, type PolicyDelta } from '../../src/policy/model.js';
import { type Namespace, type NetworkPolicy, type Pod, parseNamespace, parseNetworkPolicy, parsePod, podActive, type PolicyRule } from '../../src/policy/objects.js';
import { type Protocol, resolveNamed } from '../../src/policy/ports.js';
import { matches } from '../../src/policy/selector.js';
import { decide } from '../../src/policy/verdict.js';
import { IPAddr } from '../../src/util/ip.js';
import { SeededRandom as Gen } from '../helpers/prng.js';
import { plainSnapshot } from '../helpers/policy-snapshot.js';

const SEED = Number(process.env['WEFT_FUZZ_SEED'] ?? Date.now() % 0x100000000);
const NODE = 'n1';


const NSS = ['n0', 'n1', 'n2', 'n3'];
const KEYS = ['app', 'tier', 'env'];
const VALUES = ['a', 'b', 'c'];
const PROTOS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];
const PORT_NAMES = ['http', 'dns', 'metrics'];
const PORTS = [53, 80, 81, 443];

function labels(g: Gen): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of KEYS) if (g.chance(0.5)) out[k] = g.pick(VALUES);
  return out;
}

function ip(g: Gen, family: 4 | 6): string {
  const n = g.int(12);
  return family === 4 ? `10.1.${n >> 2}.${n & 3}` : `fd00::${n >> 2}:${n & 3}`;
}

function rawPod(g: Gen, ns: string, name: string): unknown {
  const ips = g.chance(0.1) ? [] : g.chance(0.7) ? [ip(g, 4), ip(g, 6)] : [ip(g, g.chance(0.5) ? 4 : 6)];
  const ports = Array.from({ length: g.int(3) }, () => ({ name: g.chance(0.8) ? g.pick(PORT_NAMES) : undefined, containerPort: g.pick(PORTS), protocol: g.pick(PROTOS) }));
  return {
    metadata: { namespace: ns, name, labels: labels(g), ...(g.chance(0.05) ? { deletionTimestamp: '2026-01-01T00:00:00Z' } : {}) },
    spec: { nodeName: g.pick([NODE, NODE, 'n2', 'n3']), hostNetwork: g.chance(0.08), containers: [{ name: 'c', ports }] },
    status: { phase: g.pick(['Running', 'Running', 'Running', 'Pending', 'Succeeded', 'Failed']), podIPs: ips.map((i) => ({ ip: i })) },
  };
}

function selector(g: Gen): unknown {
  const out: { matchLabels?: Record<string, string>; matchExpressions?: unknown[] } = {};
  if (g.chance(0.5)) out.matchLabels = Object.fromEntries(Object.entries(labels(g)).slice(0, 1));
  if (g.chance(0.4)) {
    const op = g.pick(['In', 'NotIn', 'Exists', 'DoesNotExist']);
    out.matchExpressions = [{ key: g.pick(KEYS), operator: op, ...(op === 'In' || op === 'NotIn' ? { values: [g.pick(VALUES), g.pick(VALUES)] } : {}) }];
  }
  return out;
}

/** ipBlocks over the address pool, each with excepts that are strict subsets of it. */
const BLOCKS: ReadonlyArray<readonly [string, readonly string[]]> = [
  ['10.1.0.0/16', ['10.1.1.0/30', '10.1.2.2/32', '10.1.0.0/24']],
  ['10.1.1.0/24', ['10.1.1.0/30', '10.1.1.2/31']],
  ['10.1.0.0/23', ['10.1.1.0/24', '10.1.0.1/32']],
  ['0.0.0.0/0', ['10.1.0.0/16', '10.1.2.0/24']],
  ['fd00::/64', ['fd00::1:0/112', 'fd00::2:3/128']],
  ['::/0', ['fd00::/64']],
];

function rawPeer(g: Gen): unknown {
  const k = g.int(4);
  if (k === 0) {
    const [cidr, excepts] = g.pick(BLOCKS);
    return { ipBlock: { cidr, except: excepts.filter(() => g.chance(0.4)) } };
  }
  if (k === 1) return { podSelector: selector(g) };
  if (k === 2) return { namespaceSelector: selector(g) };
  return { namespaceSelector: selector(g), podSelector: selector(g) };
}

function rawPort(g: Gen): unknown {
  const k = g.int(6);
  const protocol = g.chance(0.7) ? g.pick(PROTOS) : undefined;
  if (k === 0) return { protocol };
  if (k === 1 || k === 2) return { protocol, port: g.pick(PORT_NAMES) };
  if (k === 3) return { protocol, port: 80, endPort: g.pick([80, 81, 443]) };
  return { protocol, port: g.pick(PORTS) };
}

function rawRules(g: Gen, peers: 'from' | 'to'): unknown[] {
  return Array.from({ length: g.int(3) }, () => ({
    ...(g.chance(0.75) ? { [peers]: Array.from({ length: 1 + g.int(2) }, () => rawPeer(g)) } : {}),
    ...(g.chance(0.6) ? { ports: Array.from({ length: 1 + g.int(2) }, () => rawPort(g)) } : {}),
  }));
}

function rawPolicy(g: Gen, ns: string, name: string): unknown {
  const types = g.pick([undefined, ['Ingress'], ['Egress'], ['Ingress', 'Egress']]);
  return { metadata: { namespace: ns, name }, spec: { podSelector: selector(g), policyTypes: types, ingress: rawRules(g, 'from'), egress: g.chance(0.7) ? rawRules(g, 'to') : undefined } };
}

/** The cluster's current objects, to rebuild a fresh engine and to feed the oracle. */
interface World {
  namespaces: Map<string, Namespace>;
  pods: Map<string, Pod>;
  policies: Map<string, NetworkPolicy>;
}


function fresh(w: World, g: Gen): PolicyEngine {
  const e = new PolicyEngine(NODE);
  const events: Array<() => unknown> = [
    ...[...w.namespaces.values()].map((n) => () => e.upsertNamespace(n)),
    ...[...w.pods.values()].map((p) => () => e.upsertPod(p)),
    ...[...w.policies.values()].map((p) => () => e.upsertPolicy(p)),
  ];
  // Any order: the result must not depend on it.
  for (let i = events.length - 1; i > 0; i--) {
    const j = g.int(i + 1);
    [events[i], events[j]] = [events[j]!, events[i]!];
  }
  for (const ev of events) ev();
  return e;
}

// ---- the oracle: NetworkPolicy semantics read straight from the objects ----

const eligible = (p: Pod) => podActive(p) && !p.hostNetwork;

function nsLabels(w: World, ns: string): ReadonlyMap<string, string> {
  return w.namespaces.get(ns)?.labels ?? new Map([['kubernetes.io/metadata.name', ns]]);
}

function peerMatches(w: World, np: NetworkPolicy, rule: PolicyRule, other: Pod, otherIP: IPAddr): boolean {
  if (rule.peers === null) return true;
  return rule.peers.some((peer) => {
    if (peer.kind === 'ipBlock') return peer.cidr.contains(otherIP) && !peer.except.some((e) => e.contains(otherIP));
    if (!eligible(other)) return false;
    const nsOK = peer.namespaces === null ? other.namespace === np.namespace : matches(peer.namespaces, nsLabels(w, other.namespace));
    return nsOK && matches(peer.pods, other.labels);
  });
}

function portMatches(rule: PolicyRule, dst: Pod, protocol: Protocol, port: number): boolean {
  if (rule.ports === null) return true;
  return rule.ports.some((p) => {
    if (p.protocol !== protocol) return false;
    if (p.kind === 'range') return port >= p.first && port <= p.last;
    return eligible(dst) && resolveNamed(p.name, p.protocol, dst.ports).includes(port);
  });
}

/** Does `at`'s policy allow this? dir ingress: `other` is the source; egress: the destination. */
function oracle(w: World, at: Pod, dir: 'ingress' | 'egress', other: Pod, otherIP: IPAddr, protocol: Protocol, port: number): boolean {
  const applying = [...w.policies.values()].filter((np) => np.namespace === at.namespace && (dir === 'ingress' ? np.ingress : np.egress) !== null && matches(np.podSelector, at.labels));
  if (!applying.length) return true;
  const dst = dir === 'ingress' ? at : other;
  return applying.some((np) => (dir === 'ingress' ? np.ingress : np.egress)!.some((r) => peerMatches(w, np, r, other, otherIP) && portMatches(r, dst, protocol, port)));
}

describe('policy engine: incremental deltas (seeded property)', function () {
  this.timeout(300_000);

  it(`after every one of 2000 random events the applied deltas equal snapshot(), a fresh engine agrees, and so does the oracle (seed ${SEED})`, () => {
    console.log(`      policy engine fuzz seed ${SEED} (repeat with WEFT_FUZZ_SEED=${SEED})`);
    const g = new Gen(SEED);
    const e = new PolicyEngine(NODE);
    const applied = emptySnapshot();
    const w: World = { namespaces: new Map(), pods: new Map(), policies: new Map() };
    const counts = { events: 0, setChanges: 0, podRewrites: 0, rulesAdded: 0, namedBlockRules: 0, probes: 0, allowed: 0 };
    const step = (what: string, d: PolicyDelta) => {
      counts.events++;
      counts.setChanges += d.setChanges.length;
      counts.podRewrites += d.pods.length;
      counts.rulesAdded += d.rulesAdded.length;
      // Only pods whose rule lists changed are rewritten.
      for (const p of d.pods) assert.notEqual(JSON.stringify(p.policy), JSON.stringify(applied.pods.get(p.key) ?? null), `event ${counts.events} (${what}) rewrites ${p.key} unchanged (seed ${SEED})`);
      try {
        applyDelta(applied, d);
      } catch (err) {
        assert.fail(`event ${counts.events} (${what}): ${String(err)} (seed ${SEED})`);
      }
      assert.deepEqual(plainSnapshot(applied), plainSnapshot(e.snapshot()), `event ${counts.events} (${what}) (seed ${SEED})`);
    };
    for (let i = 0; i < 2000; i++) {
      const k = g.int(100);
      if (k < 8) {
        const name = g.pick(NSS);
        const ns = parseNamespace({ metadata: { name, labels: labels(g) } });
        w.namespaces.set(name, ns);
        step(`namespace ${name}`, e.upsertNamespace(ns));
      } else if (k < 11) {
        const name = g.pick(NSS);
        w.namespaces.delete(name);
        step(`delete namespace ${name}`, e.deleteNamespace(name));
      } else if (k < 60) {
        const ns = g.pick(NSS);
        const name = `p${g.int(12)}`;
        const pod = parsePod(rawPod(g, ns, name));
        w.pods.set(`${ns}/${name}`, pod);
        step(`pod ${ns}/${name}`, e.upsertPod(pod));
      } else if (k < 70) {
        const ns = g.pick(NSS);
        const name = `p${g.int(12)}`;
        w.pods.delete(`${ns}/${name}`);
        step(`delete pod ${ns}/${name}`, e.deletePod(ns, name));
      } else if (k < 92) {
        const ns = g.pick(NSS);
        const name = `np${g.int(4)}`;
        const np = parseNetworkPolicy(rawPolicy(g, ns, name));
        w.policies.set(`${ns}/${name}`, np);
        step(`policy ${ns}/${name}`, e.upsertPolicy(np));
      } else {
        const ns = g.pick(NSS);
        const name = `np${g.int(4)}`;
        w.policies.delete(`${ns}/${name}`);
        step(`delete policy ${ns}/${name}`, e.deletePolicy(ns, name));
      }

      if (i % 50 === 49) assert.deepEqual(plainSnapshot(fresh(w, g).snapshot()), plainSnapshot(e.snapshot()), `fresh engine after event ${i + 1} (seed ${SEED})`);
      if (i % 10 === 9) {
        const snap = e.snapshot();
        for (const r of snap.rules.values()) if (r.namedPeerPorts && r.peers !== 'any' && r.peers.cidrs) counts.namedBlockRules++;
        // Probes between pods whose addresses are unique (a shared address cannot tell its owners apart).
        const holders = new Map<string, number>();
        for (const p of w.pods.values()) if (podActive(p)) for (const a of p.ips) holders.set(a.toString(), (holders.get(a.toString()) ?? 0) + 1);
        const live = [...w.pods.values()].filter((p) => podActive(p));
        const locals = live.filter((p) => eligible(p) && p.nodeName === NODE);
        for (let j = 0; j < 60 && locals.length && live.length; j++) {
          const at = g.pick(locals);
          const other = g.pick(live);
          const otherIP = other.ips.length ? g.pick(other.ips) : null;
          if (!otherIP || holders.get(otherIP.toString()) !== 1 || at === other) continue;
          const view = snap.pods.get(`${at.namespace}/${at.name}`);
          assert.ok(view, `local pod ${at.namespace}/${at.name} has a view`);
          for (const dir of ['ingress', 'egress'] as const) {
            // Half the probes go to a port the destination serves, so named ports resolve.
            const served = (dir === 'ingress' ? at : other).ports;
            const target = served.length && g.chance(0.5) ? g.pick(served) : null;
            const protocol = target ? target.protocol : g.pick(PROTOS);
            const port = target ? target.port : g.pick(PORTS);
            const got: boolean = decide(snap, view[dir], otherIP.toString(), protocol, port).allowed;
            const want: boolean = oracle(w, at, dir, other, otherIP, protocol, port);
            counts.probes++;
            if (got) counts.allowed++;
            assert.equal(got, want, `${dir} at ${at.namespace}/${at.name} ${dir === 'ingress' ? 'from' : 'to'} ${other.namespace}/${other.name} ${otherIP} ${protocol}/${port} after event ${i + 1} (seed ${SEED})`);
          }
        }
      }
    }
    console.log(`      ${JSON.stringify(counts)}`);
    assert.ok(counts.probes > 1000 && counts.allowed > 100 && counts.allowed < counts.probes - 100, 'the probes saw both verdicts');
  });

  it('reports nothing for an event that changes nothing, and exactly the pod for a label change', () => {
    const e = new PolicyEngine(NODE);
    const pod = (lbl: Record<string, string>) => parsePod({ metadata: { namespace: 'x', name: 'a', labels: lbl }, spec: { nodeName: NODE }, status: { phase: 'Running', podIPs: [{ ip: '10.0.0.1' }] } });
    e.upsertPod(pod({ app: 'a' }));
    e.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'p' }, spec: { podSelector: { matchLabels: { app: 'a' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }] }] } }));
    const same = e.upsertPod(pod({ app: 'a' }));
    assert.deepEqual(same, { setsCreated: [], setChanges: [], rulesAdded: [], pods: [], rulesRemoved: [], setsDeleted: [] });
    const d = e.upsertPod(pod({ app: 'b' }));
    assert.equal(d.setChanges.length, 1);
    assert.deepEqual(d.setChanges[0]!.remove, ['10.0.0.1']);
    assert.deepEqual(d.pods.map((p) => [p.key, p.policy?.ingress.isolated]), [['x/a', false]]);
    assert.deepEqual(e.podsWithIP('10.0.0.1'), ['x/a']);
  });

  it('takes a local pod\'s addresses from its CNI ADD ahead of the API, keeps them over the API\'s, and forgets them with the pod', () => {
    const e = new PolicyEngine(NODE);
    const pod = (name: string, ip: string | null, node = NODE, uid = `u-${name}`) =>
      parsePod({ metadata: { namespace: 'x', name, uid, labels: { app: 'a' } }, spec: { nodeName: node }, status: { phase: ip ? 'Running' : 'Pending', ...(ip ? { podIPs: [{ ip }] } : {}) } });
    const cni = (name: string, sandbox: string, uid: string | null = `u-${name}`) => ({ namespace: 'x', name, uid, sandbox });
    const addr = (ip: string) => IPAddr.parse(ip);
    e.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'p' }, spec: { podSelector: { matchLabels: { app: 'a' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }] }] } }));
    // Addresses for a pod the API has not shown yet wait for it.
    assert.equal(e.isLocalPod(cni('early', 's0')), false);
    assert.deepEqual(e.setLocalAddresses(cni('early', 's0'), [addr('10.0.0.9')]).pods, []);
    assert.deepEqual(e.upsertPod(pod('early', null)).pods.map((p) => [p.key, p.policy?.ips]), [['x/early', ['10.0.0.9']]]);
    assert.equal(e.isLocalPod(cni('early', 's0')), true);
    // The API's pod without an address: selected, isolated, but in no map until the ADD says.
    e.upsertPod(pod('a', null));
    assert.deepEqual(e.snapshot().pods.get('x/a')?.ips, []);
    const added = e.setLocalAddresses(cni('a', 's1'), [addr('10.0.0.1')]);
    assert.deepEqual(added.pods.map((p) => [p.key, p.policy?.ips, p.policy?.ingress.isolated]), [['x/a', ['10.0.0.1'], true]]);
    assert.deepEqual(e.podsWithIP('10.0.0.1'), ['x/a']);
    // The API's status agreeing (or lagging with another address) changes nothing.
    assert.deepEqual(e.upsertPod(pod('a', '10.0.0.1')).pods, []);
    assert.deepEqual(e.upsertPod(pod('a', '10.0.0.7')).pods, []);
    // A DEL of another sandbox (an old one's, repeated) changes nothing; the ADD's own sandbox's
    // DEL takes its addresses away, whatever the API still says — but not others the API lists
    // (a later sandbox whose ADD weftd did not see).
    assert.deepEqual(e.releaseLocalAddresses(cni('a', 's0')).pods, []);
    assert.deepEqual(e.podsWithIP('10.0.0.1'), ['x/a']);
    assert.deepEqual(e.releaseLocalAddresses(cni('a', 's1')).pods.map((p) => [p.key, p.policy?.ips]), [['x/a', ['10.0.0.7']]]);
    assert.deepEqual(e.podsWithIP('10.0.0.1'), []);
    assert.deepEqual(e.upsertPod(pod('a', '10.0.0.1')).pods.map((p) => [p.key, p.policy?.ips]), [['x/a', []]]);
    // Deleted from the API: forgotten; the pod coming back takes the API's address again.
    e.deletePod('x', 'a');
    assert.deepEqual(e.upsertPod(pod('a', '10.0.0.7')).pods.map((p) => [p.key, p.policy?.ips]), [['x/a', ['10.0.0.7']]]);
    // Another node's pod never takes this node's CNI addresses.
    e.setLocalAddresses(cni('far', 's2'), [addr('10.0.0.5')]);
    e.upsertPod(pod('far', '10.1.0.5', 'n2'));
    assert.deepEqual(e.podsWithIP('10.0.0.5'), []);
    assert.equal(e.isLocalPod(cni('far', 's2')), false);
  });

  it('keeps a re-created pod\'s CNI addresses (by UID) through the old pod\'s late deletion', () => {
    const e = new PolicyEngine(NODE);
    const pod = (uid: string, ip: string | null) =>
      parsePod({ metadata: { namespace: 'x', name: 'web-0', uid, labels: { app: 'a' } }, spec: { nodeName: NODE }, status: { phase: 'Running', ...(ip ? { podIPs: [{ ip }] } : {}) } });
    e.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'p' }, spec: { podSelector: { matchLabels: { app: 'a' } }, policyTypes: ['Ingress'] } }));
    e.upsertPod(pod('old', '10.0.0.1'));
    const fresh = { namespace: 'x', name: 'web-0', uid: 'new', sandbox: 's-new' };
    // The new pod's ADD while the API still shows the old one: not yet ours (the ADD waits).
    assert.equal(e.isLocalPod(fresh), false);
    e.setLocalAddresses(fresh, [IPAddr.parse('10.0.0.2')]);
    assert.deepEqual(e.podsWithIP('10.0.0.2'), []);
    // The old pod's deletion does not take the new pod's addresses with it.
    e.deletePod('x', 'web-0');
    assert.deepEqual(e.upsertPod(pod('new', null)).pods.map((p) => [p.key, p.policy?.ips]), [['x/web-0', ['10.0.0.2']]]);
    assert.equal(e.isLocalPod(fresh), true);
  });
});

describe('policy engine: cost of one event at 10 000 pods and 1 000 policies (measured, not asserted)', function () {
  this.timeout(300_000);

  it('measures full load, snapshot, a pod label change, a namespace label change and a policy change', () => {
    const g = new Gen(12345);
    const e = new PolicyEngine('node-0');
    const NS = 100;
    const PODS_PER_NS = 100;
    const POLICIES_PER_NS = 10;
    const apps = Array.from({ length: 20 }, (_, i) => `app${i}`);
    const nsObj = (i: number, team: string) => parseNamespace({ metadata: { name: `ns${i}`, labels: { team } } });
    const podObj = (i: number, j: number, app: string) =>
      parsePod({
        metadata: { namespace: `ns${i}`, name: `pod${j}`, labels: { app, tier: j % 3 ? 'web' : 'db' } },
        // 100 pods on this node, the rest spread elsewhere.
        spec: { nodeName: (i * PODS_PER_NS + j) % 100 === 0 ? 'node-0' : `node-${1 + ((i * PODS_PER_NS + j) % 99)}`, containers: [{ ports: [{ name: 'http', containerPort: 8080 }] }] },
        status: { phase: 'Running', podIPs: [{ ip: `10.${i}.${j >> 8}.${j & 255}` }] },
      });
    const policyObj = (i: number, k: number, variant: number, egressApp = 'app1') =>
      parseNetworkPolicy({
        metadata: { namespace: `ns${i}`, name: `np${k}` },
        spec: {
          podSelector: { matchLabels: { app: apps[(k + variant) % apps.length] } },
          policyTypes: ['Ingress', 'Egress'],
          ingress: [
            { from: [{ podSelector: { matchLabels: { app: apps[(k * 7 + variant) % apps.length] } } }], ports: [{ port: 80 }, { port: 'http' }] },
            { from: [{ namespaceSelector: { matchLabels: { team: `t${k % 5}` } }, podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: [apps[k % apps.length], apps[(k + 1) % apps.length]] }] } }] },
          ],
          egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8', except: [`10.${i}.0.0/16`] } }], ports: [{ port: 443 }] }, { to: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: egressApp } } }], ports: [{ port: 'http' }] }],
        },
      });

    const t0 = performance.now();
    for (let i = 0; i < NS; i++) e.upsertNamespace(nsObj(i, `t${i % 5}`));
    for (let i = 0; i < NS; i++) for (let j = 0; j < PODS_PER_NS; j++) e.upsertPod(podObj(i, j, g.pick(apps)));
    const tPods = performance.now();
    for (let i = 0; i < NS; i++) for (let k = 0; k < POLICIES_PER_NS; k++) e.upsertPolicy(policyObj(i, k, 0));
    const tLoad = performance.now();
    const snap = e.snapshot();
    const tSnap = performance.now();
    let elements = 0;
    for (const s of snap.sets.values()) elements += s.kind === 'intervals' ? s.intervals.length : s.elements.size;

    const time = (n: number, f: (k: number) => PolicyDelta) => {
      const ts: number[] = [];
      let changes = 0;
      for (let k = 0; k < n; k++) {
        const a = performance.now();
        const d = f(k);
        ts.push(performance.now() - a);
        changes += d.setChanges.reduce((s, c) => s + c.add.length + c.remove.length, 0) + d.pods.length;
        changes += d.setsCreated.reduce((s, c) => s + (c.content.kind === 'intervals' ? c.content.intervals.length : c.content.elements.size), 0);
      }
      ts.sort((x, y) => x - y);
      const q = (p: number) => ts[Math.min(ts.length - 1, Math.floor(p * ts.length))]!.toFixed(3);
      return `p50 ${q(0.5)} ms, p99 ${q(0.99)} ms (${(changes / n).toFixed(1)} set elements written + pods rewritten per event)`;
    };
    const podChange = time(500, (k) => e.upsertPod(podObj(k % NS, (k * 37) % PODS_PER_NS, apps[k % apps.length]!)));
    const localPodChange = time(100, (k) => e.upsertPod(podObj(0, 0, apps[k % apps.length]!)));
    const nsChange = time(50, (k) => e.upsertNamespace(nsObj(k % NS, `t${(k + 1) % 5}`)));
    const policyChange = time(200, (k) => e.upsertPolicy(policyObj(k % NS, k % POLICIES_PER_NS, 1 + (k % 3))));
    // The egress rule selects app=X in every namespace (~500 pods): rewriting it rebuilds that set.
    const wideChange = time(50, (k) => e.upsertPolicy(policyObj(k % NS, k % POLICIES_PER_NS, 1 + (k % 3), apps[2 + (k % 5)])));
    let seq = 0;
    const podChurn = time(200, (k) => (k % 2 === 0 ? e.upsertPod(podObj(k % NS, PODS_PER_NS + seq++, apps[k % apps.length]!)) : e.deletePod(`ns${(k - 1) % NS}`, `pod${PODS_PER_NS + seq - 1}`)));
    const tAll = performance.now();

    console.log(`      load: ${NS * PODS_PER_NS} pods in ${(tPods - t0).toFixed(0)} ms, then ${NS * POLICIES_PER_NS} policies in ${(tLoad - tPods).toFixed(0)} ms`);
    console.log(`      snapshot: ${snap.rules.size} rules, ${snap.sets.size} sets (${elements} elements), ${snap.pods.size} local pods in ${(tSnap - tLoad).toFixed(0)} ms`);
    console.log(`      pod label change:        ${podChange}`);
    console.log(`      local pod label change:  ${localPodChange}`);
    console.log(`      namespace label change:  ${nsChange}`);
    console.log(`      policy change:           ${policyChange}`);
    console.log(`      wide policy rule change: ${wideChange}`);
    console.log(`      pod create / delete:     ${podChurn}`);
    console.log(`      (all measurements ${(tAll - tSnap).toFixed(0)} ms)`);
    assert.equal(snap.pods.size, 100);
  });
});
