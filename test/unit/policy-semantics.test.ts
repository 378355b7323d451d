// NetworkPolicy semantics through the engine: the cases of Kubernetes' e2e netpol suite
// (test/e2e/network/netpol/network_policy.go) as truth tables. Namespaces x, y, z with pods a, b,
// c (dual-stack, spread over three nodes, one engine per node as on a real cluster), servers on
// 80 and 81 over TCP, UDP and SCTP with the suite's port names (serve-80-tcp, …). A connection is
// allowed when egress at the source and ingress at the destination both allow it, read from the
// engines' output with `decide`; the expectation is written independently, in the suite's own
// vocabulary (expectPeer, expectAllIngress, …). Loopback is not checked (kubernetes #95879).
import assert from 'node:assert/strict';

import { PolicyEngine } from '../../src/policy/engine.js';
import { applyDelta, emptySnapshot, type MutableSnapshot, type PolicyDelta } from '../../src/policy/model.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import type { Protocol } from '../../src/policy/ports.js';
import { decide } from '../../src/policy/verdict.js';
import { np, Reach, type Sel } from '../helpers/netpol-reach.js';

const NAMESPACES = ['x', 'y', 'z'] as const;
const PODS = ['a', 'b', 'c'] as const;
const NODES = ['node-1', 'node-2', 'node-3'];
type Family = 4 | 6;

interface PodInfo {
  ns: string;
  name: string;
  node: string;
  v4: string;
  v6: string;
  labels: Record<string, string>;
  ports: Array<{ name: string; containerPort: number; protocol: Protocol }>;
  hostNetwork?: boolean;
  phase?: string;
}

const suitePorts = () =>
  [80, 81].flatMap((port) => (['TCP', 'UDP', 'SCTP'] as const).map((protocol) => ({ name: `serve-${port}-${protocol.toLowerCase()}`, containerPort: port, protocol })));

/** The cluster as the API server would send it, and one engine per node fed every event. */
class World {
  readonly engines = new Map<string, PolicyEngine>();
  readonly applied = new Map<string, MutableSnapshot>();
  readonly pods = new Map<string, PodInfo>();
  private readonly nsLabels = new Map<string, Record<string, string>>();

  constructor() {
    for (const n of NODES) {
      this.engines.set(n, new PolicyEngine(n));
      this.applied.set(n, emptySnapshot());
    }
    NAMESPACES.forEach((ns) => this.setNamespace(ns, { ns }));
    NAMESPACES.forEach((ns, i) =>
      PODS.forEach((p, j) =>
        this.setPod({
          ns,
          name: p,
          node: NODES[(i + j) % NODES.length]!,
          v4: `10.244.${i}.${j + 10}`,
          v6: `fd00:10:244:${i}::${j + 10}`,
          labels: { pod: p },
          ports: suitePorts(),
        }),
      ),
    );
  }

  private each(f: (e: PolicyEngine) => PolicyDelta): void {
    for (const [n, e] of this.engines) applyDelta(this.applied.get(n)!, f(e));
  }

  setNamespace(name: string, labels: Record<string, string>): void {
    this.nsLabels.set(name, labels);
    const ns = parseNamespace({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } });
    this.each((e) => e.upsertNamespace(ns));
  }

  addNamespaceLabel(name: string, k: string, v: string): void {
    this.setNamespace(name, { ...this.nsLabels.get(name), [k]: v });
  }

  setPod(p: PodInfo): void {
    this.pods.set(`${p.ns}/${p.name}`, p);
    const pod = parsePod({
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { namespace: p.ns, name: p.name, uid: `uid-${p.ns}-${p.name}`, labels: p.labels },
      spec: { nodeName: p.node, hostNetwork: p.hostNetwork ?? false, containers: [{ name: 'c', ports: p.ports }] },
      status: { phase: p.phase ?? 'Running', podIP: p.v4, podIPs: [{ ip: p.v4 }, { ip: p.v6 }] },
    });
    this.each((e) => e.upsertPod(pod));
  }

  addPodLabels(key: string, labels: Record<string, string>): void {
    const p = this.pods.get(key)!;
    this.setPod({ ...p, labels: { ...p.labels, ...labels } });
  }

  deletePod(key: string): void {
    const p = this.pods.get(key)!;
    this.pods.delete(key);
    this.each((e) => e.deletePod(p.ns, p.name));
  }

  policy(raw: unknown): void {
    const np = parseNetworkPolicy(raw);
    this.each((e) => e.upsertPolicy(np));
  }

  deletePolicy(ns: string, name: string): void {
    this.each((e) => e.deletePolicy(ns, name));
  }

  ip(key: string, family: Family): string {
    const p = this.pods.get(key)!;
    return family === 4 ? p.v4 : p.v6;
  }

  /** Is (from → to, protocol, port) allowed, read from the engines' output (both as snapshots and as applied deltas). */
  allowed(from: string, to: string, protocol: Protocol, port: number, family: Family): boolean {
    const src = this.pods.get(from)!;
    const dst = this.pods.get(to)!;
    const verdicts = [true, false].map((useSnapshot) => {
      const state = (node: string) => (useSnapshot ? this.engines.get(node)!.snapshot() : this.applied.get(node)!);
      const s = state(src.node);
      const d = state(dst.node);
      const out = s.pods.get(from);
      const inn = d.pods.get(to);
      const egress = out ? decide(s, out.egress, this.ip(to, family), protocol, port).allowed : true;
      const ingress = inn ? decide(d, inn.ingress, this.ip(from, family), protocol, port).allowed : true;
      return egress && ingress;
    });
    assert.equal(verdicts[0], verdicts[1], `snapshot and applied deltas disagree on ${from} -> ${to}`);
    return verdicts[0]!;
  }
}

/** Compares every non-loopback pair; the failure message lists each wrong cell. */
function validate(w: World, protocol: Protocol, port: number, r: Reach, families: readonly Family[] = [4, 6]): void {
  const wrong: string[] = [];
  for (const family of families) {
    for (const [k, want] of r.m) {
      const [from, to] = k.split('>') as [string, string];
      if (from === to) continue;
      const got = w.allowed(from, to, protocol, port, family);
      if (got !== want) wrong.push(`IPv${family} ${protocol}/${port} ${from} -> ${to}: expected ${want ? 'allow' : 'deny'}, got ${got ? 'allow' : 'deny'}`);
    }
  }
  assert.deepEqual(wrong, []);
}

const ALL = (w: World) => [...w.pods.keys()];
const NSL = 'kubernetes.io/metadata.name';
const podIs = (p: string): Sel => ({ matchLabels: { pod: p } });

describe('policy engine: the e2e netpol suite as truth tables', () => {
  let w: World;
  beforeEach(() => {
    w = new World();
  });

  it("supports a 'default-deny-ingress' policy (TCP, UDP, SCTP)", () => {
    w.policy(np('x', 'deny-ingress', {}, { ingress: [] }));
    for (const proto of ['TCP', 'UDP', 'SCTP'] as const) validate(w, proto, 80, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false));
  });

  it("supports a 'default-deny-all' policy", () => {
    w.policy(np('x', 'deny-all', {}, { ingress: [], egress: [] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false).expectPeer({ ns: 'x' }, {}, false));
  });

  it('allows traffic from pods within the server namespace based on PodSelector', () => {
    w.policy(np('x', 'x-a-allows-x-b', podIs('a'), { ingress: [{ peers: [{ podSelector: podIs('b') }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('x/b', 'x/a', true));
  });

  it('allows ingress traffic for a target (deny-all plus allow-all-to-a)', () => {
    w.policy(np('x', 'deny-all', {}, { ingress: [] }));
    w.policy(np('x', 'allow-all-to-a', podIs('a'), { ingress: [{ peers: [{ podSelector: {}, namespaceSelector: {} }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', true).expectAllIngress('x/b', false).expectAllIngress('x/c', false));
  });

  it('allows ingress traffic from pods in all namespaces (namespaceSelector {})', () => {
    w.policy(np('x', 'allow-from-another-ns', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: {} } }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
  });

  it('allows traffic only from a different namespace, based on NamespaceSelector (matchLabels and matchExpressions)', () => {
    w.policy(np('x', 'via-labels', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: { [NSL]: 'y' } } }] }] }));
    const r = () => new Reach(ALL(w)).expectPeer({ ns: 'x' }, { ns: 'x', pod: 'a' }, false).expectPeer({ ns: 'z' }, { ns: 'x', pod: 'a' }, false);
    validate(w, 'TCP', 80, r());
    w.deletePolicy('x', 'via-labels');
    w.policy(np('x', 'via-expr', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'In', values: ['y'] }] } }] }] }));
    validate(w, 'TCP', 80, r());
  });

  it('enforces a PodSelector with MatchExpressions', () => {
    w.policy(np('x', 'x-a-allows-x-b', podIs('a'), { ingress: [{ peers: [{ podSelector: { matchExpressions: [{ key: 'pod', operator: 'In', values: ['b'] }] } }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('x/b', 'x/a', true));
  });

  it('enforces PodSelector OR NamespaceSelector (two peers)', () => {
    w.policy(
      np('x', 'or', podIs('a'), {
        ingress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'NotIn', values: ['x'] }] } }, { podSelector: podIs('b') }] }],
      }),
    );
    validate(w, 'TCP', 80, new Reach(ALL(w)).expect('x/a', 'x/a', false).expect('x/c', 'x/a', false));
  });

  it('enforces PodSelector AND NamespaceSelector (one peer)', () => {
    w.policy(
      np('x', 'and', podIs('a'), {
        ingress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'NotIn', values: ['x'] }] }, podSelector: podIs('b') }] }],
      }),
    );
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('y/b', 'x/a', true).expect('z/b', 'x/a', true));
  });

  it('enforces multiple PodSelectors and NamespaceSelectors', () => {
    w.policy(
      np('x', 'multi', podIs('a'), {
        ingress: [
          {
            peers: [
              {
                namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'NotIn', values: ['x'] }] },
                podSelector: { matchExpressions: [{ key: 'pod', operator: 'In', values: ['b', 'c'] }] },
              },
            ],
          },
        ],
      }),
    );
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({ ns: 'x' }, { ns: 'x', pod: 'a' }, false).expect('y/a', 'x/a', false).expect('z/a', 'x/a', false));
  });

  it('enforces any PodSelectors (pod=b OR pod=c)', () => {
    w.policy(np('x', 'any', podIs('a'), { ingress: [{ peers: [{ podSelector: podIs('b') }, { podSelector: podIs('c') }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('x/b', 'x/a', true).expect('x/c', 'x/a', true));
  });

  it('allows traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector (TCP, UDP, SCTP)', () => {
    w.policy(np('x', 'ya', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: { [NSL]: 'y' } }, podSelector: podIs('a') }] }] }));
    for (const proto of ['TCP', 'UDP', 'SCTP'] as const) validate(w, proto, 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('y/a', 'x/a', true));
  });

  it('enforces policy based on Ports (TCP, UDP, SCTP each allowing only its own protocol)', () => {
    for (const proto of ['TCP', 'UDP', 'SCTP'] as const) {
      w.policy(np('x', 'port-81', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: { [NSL]: 'y' } } }], ports: [{ port: 81, protocol: proto }] }] }));
      const allow = new Reach(ALL(w)).expectPeer({ ns: 'x' }, { ns: 'x', pod: 'a' }, false).expectPeer({ ns: 'z' }, { ns: 'x', pod: 'a' }, false);
      validate(w, proto, 81, allow);
      validate(w, proto, 80, new Reach(ALL(w)).expectAllIngress('x/a', false));
      for (const other of ['TCP', 'UDP', 'SCTP'] as const) if (other !== proto) validate(w, other, 81, new Reach(ALL(w)).expectAllIngress('x/a', false));
    }
  });

  it('enforces multiple, stacked policies with overlapping podSelectors', () => {
    const yOnly = { namespaceSelector: { matchLabels: { [NSL]: 'y' } } };
    w.policy(np('x', 'allow-81', podIs('a'), { ingress: [{ peers: [yOnly], ports: [{ port: 81, protocol: 'TCP' }] }] }));
    const allow = () => new Reach(ALL(w)).expectPeer({ ns: 'x' }, { ns: 'x', pod: 'a' }, false).expectPeer({ ns: 'y' }, { ns: 'x', pod: 'a' }, true).expectPeer({ ns: 'z' }, { ns: 'x', pod: 'a' }, false);
    validate(w, 'TCP', 81, allow());
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false));
    w.policy(np('x', 'allow-80', podIs('a'), { ingress: [{ peers: [yOnly], ports: [{ port: 80, protocol: 'TCP' }] }] }));
    validate(w, 'TCP', 80, allow());
  });

  it('supports an allow-all policy', () => {
    w.policy(np('x', 'allow-all', {}, { ingress: [{}] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    validate(w, 'TCP', 81, new Reach(ALL(w)));
  });

  it('allows ingress access on one named port', () => {
    w.policy(np('x', 'allow-all', {}, { ingress: [{ ports: [{ port: 'serve-81-tcp' }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false));
  });

  it('allows ingress access from namespace on one named port', () => {
    w.policy(np('x', 'named-80', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: { [NSL]: 'y' } } }], ports: [{ port: 'serve-80-tcp', protocol: 'TCP' }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({ ns: 'x' }, { ns: 'x', pod: 'a' }, false).expectPeer({ ns: 'z' }, { ns: 'x', pod: 'a' }, false));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false));
  });

  it('allows egress access on one named port', () => {
    w.policy(np('x', 'allow-egress', {}, { egress: [{ ports: [{ port: 'serve-80-tcp' }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectPeer({ ns: 'x' }, {}, false));
  });

  it('enforces an updated policy (allow-all mutated to deny-all)', () => {
    const raw = np('x', 'mutate', {}, { ingress: [{}] });
    w.policy(raw);
    validate(w, 'TCP', 81, new Reach(ALL(w)));
    w.policy(np('x', 'mutate', {}, { ingress: [] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false));
  });

  it('allows ingress access from an updated namespace', () => {
    w.policy(np('x', 'ns2', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: { ns2: 'updated' } } }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false));
    w.addNamespaceLabel('y', 'ns2', 'updated');
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expectPeer({ ns: 'y' }, {}, true));
  });

  it('allows ingress access from an updated pod', () => {
    w.policy(np('x', 'pod2', podIs('a'), { ingress: [{ peers: [{ podSelector: { matchLabels: { pod: 'b', pod2: 'updated' } } }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false));
    w.addPodLabels('x/b', { pod2: 'updated' });
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('x/b', 'x/a', true));
  });

  it('denies ingress from pods in other namespaces (podSelector {} alone is the own namespace)', () => {
    w.policy(np('x', 'deny-empty', {}, { ingress: [{ peers: [{ podSelector: { matchLabels: {} } }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({ ns: 'y' }, { ns: 'x' }, false).expectPeer({ ns: 'z' }, { ns: 'x' }, false));
  });

  it('denies ingress access to an updated pod', () => {
    w.policy(np('x', 'deny-label', { matchLabels: { target: 'isolated' } }, { ingress: [] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    w.addPodLabels('x/a', { target: 'isolated' });
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false));
  });

  it('denies egress from pods based on PodSelector, and from all pods in a namespace', () => {
    w.policy(np('x', 'deny-egress-a', podIs('a'), { egress: [] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllEgress('x/a', false));
    w.deletePolicy('x', 'deny-egress-a');
    w.policy(np('x', 'deny-egress-ns', {}, { egress: [] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({ ns: 'x' }, {}, false));
  });

  it('works with Ingress and Egress specified together', () => {
    w.policy(np('x', 'both', podIs('a'), { ingress: [{ peers: [{ podSelector: podIs('b') }] }], egress: [{ ports: [{ port: 80 }] }], types: ['Egress', 'Ingress'] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expect('x/b', 'x/a', true));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false).expectAllEgress('x/a', false).expect('x/b', 'x/a', true));
  });

  it('denies egress on the client side even if the server allows the traffic', () => {
    w.policy(np('x', 'to-ya', podIs('a'), { egress: [{ peers: [{ namespaceSelector: { matchLabels: { [NSL]: 'y' } }, podSelector: podIs('a') }] }] }));
    const fromXA = [{ namespaceSelector: { matchLabels: { [NSL]: 'x' } }, podSelector: podIs('a') }];
    w.policy(np('y', 'ya', podIs('a'), { ingress: [{ peers: fromXA }] }));
    w.policy(np('y', 'yb', podIs('b'), { ingress: [{ peers: fromXA }] }));
    validate(
      w,
      'TCP',
      80,
      new Reach(ALL(w))
        .expectPeer({ ns: 'x', pod: 'a' }, {}, false)
        .expectPeer({}, { ns: 'y', pod: 'a' }, false)
        .expectPeer({ ns: 'x', pod: 'a' }, { ns: 'y', pod: 'a' }, true)
        .expectPeer({}, { ns: 'y', pod: 'b' }, false),
    );
  });

  it('allows egress to a server in a different namespace based on PodSelector and NamespaceSelector', () => {
    w.policy(np('x', 'to-ya', podIs('a'), { egress: [{ peers: [{ namespaceSelector: { matchLabels: { [NSL]: 'y' } }, podSelector: podIs('a') }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllEgress('x/a', false).expect('x/a', 'y/a', true));
  });

  it('allows any port on a specific protocol (ports: [{protocol: TCP}])', () => {
    w.policy(np('x', 'by-proto', podIs('a'), { ingress: [{ ports: [{ protocol: 'TCP' }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    validate(w, 'UDP', 80, new Reach(ALL(w)).expectPeer({}, { ns: 'x', pod: 'a' }, false));
  });

  it('lets an ingress allow-all policy take precedence over a narrower one, and the same for egress', () => {
    w.policy(np('x', 'in-80', {}, { ingress: [{ ports: [{ port: 80 }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false));
    w.policy(np('x', 'in-all', {}, { ingress: [{}] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)));
    w.deletePolicy('x', 'in-80');
    w.deletePolicy('x', 'in-all');
    w.policy(np('x', 'out-80', {}, { egress: [{ ports: [{ port: 80 }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectPeer({ ns: 'x' }, {}, false));
    w.policy(np('x', 'out-all', {}, { egress: [{}] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)));
  });

  it('stops enforcing policies after they are deleted', () => {
    w.policy(np('x', 'deny-all', {}, { ingress: [], egress: [] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({ ns: 'x' }, {}, false).expectPeer({}, { ns: 'x' }, false));
    w.deletePolicy('x', 'deny-all');
    validate(w, 'TCP', 80, new Reach(ALL(w)));
  });

  for (const family of [4, 6] as const) {
    const host = family === 4 ? 32 : 128;
    // The suite's makeLargeCIDRForIP: the /4 (here /8 for IPv6) around the pod.
    const large = (_ip: string) => (family === 4 ? '0.0.0.0/4' : 'fd00::/8');

    it(`allows egress to a server in a CIDR block (IPv${family})`, () => {
      w.policy(np('x', 'cidr', podIs('a'), { egress: [{ peers: [{ ipBlock: { cidr: `${w.ip('y/b', family)}/${host}` } }] }] }));
      validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllEgress('x/a', false).expect('x/a', 'y/b', true), [family]);
    });

    it(`enforces the except clause in a CIDR block, and an IP in both CIDR and except allowed by another policy (IPv${family})`, () => {
      w.policy(np('x', 'cidr-except', podIs('a'), { egress: [{ peers: [{ ipBlock: { cidr: large(w.ip('x/b', family)), except: [`${w.ip('x/b', family)}/${host}`] } }] }] }));
      validate(w, 'TCP', 80, new Reach(ALL(w)).expect('x/a', 'x/b', false), [family]);
      // The suite replaces the policy with one allowing just x/b (UpdatePolicy of the same name).
      w.policy(np('x', 'cidr-except', podIs('a'), { egress: [{ peers: [{ ipBlock: { cidr: `${w.ip('x/b', family)}/${host}` } }] }] }));
      validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllEgress('x/a', false).expect('x/a', 'x/b', true), [family]);
      // And as a second policy: the union allows x/b and everything in the block but x/b.
      w.policy(np('x', 'cidr-except-2', podIs('a'), { egress: [{ peers: [{ ipBlock: { cidr: large(w.ip('x/b', family)), except: [`${w.ip('x/b', family)}/${host}`] } }] }] }));
      validate(w, 'TCP', 80, new Reach(ALL(w)), [family]);
    });
  }

  it('controls ingress and egress independently', () => {
    w.policy(np('x', 'allow-egress', podIs('a'), { egress: [{}] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    w.policy(np('x', 'deny-ingress', podIs('a'), { ingress: [] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false));
  });

  it("does not treat 'protocol: SCTP' or UDP as TCP, and isolates a pod selected by an SCTP-only policy", () => {
    w.policy(np('x', 'deny-ingress', {}, { ingress: [] }));
    w.policy(np('x', 'sctp-81', podIs('a'), { ingress: [{ ports: [{ port: 81, protocol: 'SCTP' }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false));
    validate(w, 'SCTP', 81, new Reach(ALL(w)).expectPeer({}, { ns: 'x' }, false).expectAllIngress('x/a', true));
    w.deletePolicy('x', 'deny-ingress');
    w.deletePolicy('x', 'sctp-81');
    w.policy(np('x', 'sctp-80', podIs('a'), { ingress: [{ ports: [{ port: 80, protocol: 'SCTP' }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false));
    w.deletePolicy('x', 'sctp-80');
    w.policy(np('x', 'udp-81', podIs('a'), { ingress: [{ ports: [{ port: 81, protocol: 'UDP' }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false));
    validate(w, 'UDP', 81, new Reach(ALL(w)));
  });

  it('enforces a NamespaceSelector with MatchExpressions on the default namespace label (egress, NotIn)', () => {
    w.policy(np('x', 'not-y', podIs('a'), { egress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'NotIn', values: ['y'] }] } }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)).expectPeer({ ns: 'x', pod: 'a' }, { ns: 'y' }, false));
  });

  it('allows port ranges with endPort (ingress and egress)', () => {
    w.policy(np('x', 'range', podIs('a'), { ingress: [{ ports: [{ port: 79, endPort: 80 }] }] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false));
    w.policy(np('x', 'range', podIs('a'), { ingress: [{ ports: [{ port: 80, endPort: 81 }] }] }));
    validate(w, 'TCP', 81, new Reach(ALL(w)));
    w.policy(np('y', 'range-out', {}, { egress: [{ ports: [{ port: 81, endPort: 90, protocol: 'UDP' }] }] }));
    // x/a still admits only TCP 80-81.
    validate(w, 'UDP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false));
    validate(w, 'UDP', 80, new Reach(ALL(w)).expectAllIngress('x/a', false).expectPeer({ ns: 'y' }, {}, false));
  });
});

describe('policy engine: choices beyond the suite', () => {
  let w: World;
  beforeEach(() => {
    w = new World();
  });

  it('resolves an egress named port per destination pod', () => {
    // x/a serves "web" on 80, y/a on 81: an egress rule to "web" allows each pod only on its own port.
    w.setPod({ ...w.pods.get('x/a')!, ports: [{ name: 'web', containerPort: 80, protocol: 'TCP' }] });
    w.setPod({ ...w.pods.get('y/a')!, ports: [{ name: 'web', containerPort: 81, protocol: 'TCP' }] });
    w.policy(np('z', 'web', podIs('c'), { egress: [{ peers: [{ namespaceSelector: {} }], ports: [{ port: 'web' }] }] }));
    assert.equal(w.allowed('z/c', 'x/a', 'TCP', 80, 4), true);
    assert.equal(w.allowed('z/c', 'x/a', 'TCP', 81, 4), false);
    assert.equal(w.allowed('z/c', 'y/a', 'TCP', 81, 6), true);
    assert.equal(w.allowed('z/c', 'y/a', 'TCP', 80, 6), false);
    assert.equal(w.allowed('z/c', 'x/b', 'TCP', 80, 4), false, 'x/b has no port named web');
    // The name must match with the protocol too.
    assert.equal(w.allowed('z/c', 'x/a', 'UDP', 80, 4), false);
    // A pod that gains the name later (recreated) joins; one that leaves drops out.
    w.setPod({ ...w.pods.get('x/b')!, ports: [{ name: 'web', containerPort: 8080, protocol: 'TCP' }] });
    assert.equal(w.allowed('z/c', 'x/b', 'TCP', 8080, 4), true);
    w.deletePod('x/a');
    w.setPod({ ns: 'x', name: 'a2', node: 'node-1', v4: '10.244.9.9', v6: 'fd00::9:9', labels: { pod: 'a' }, ports: [] });
    assert.equal(w.allowed('z/c', 'x/a2', 'TCP', 80, 4), false);
  });

  it('matches egress named ports in an ipBlock only for pods inside the block, and with `to` empty for any pod', () => {
    w.policy(np('z', 'named-block', podIs('c'), { egress: [{ peers: [{ ipBlock: { cidr: '10.244.1.0/24' } }], ports: [{ port: 'serve-81-udp', protocol: 'UDP' }] }] }));
    assert.equal(w.allowed('z/c', 'y/a', 'UDP', 81, 4), true);
    assert.equal(w.allowed('z/c', 'x/a', 'UDP', 81, 4), false, 'x/a is outside the block');
    assert.equal(w.allowed('z/c', 'y/a', 'UDP', 81, 6), false, 'the block is IPv4 only');
    w.policy(np('z', 'named-any', podIs('c'), { egress: [{ ports: [{ port: 'serve-80-sctp', protocol: 'SCTP' }] }] }));
    assert.equal(w.allowed('z/c', 'x/a', 'SCTP', 80, 6), true);
    assert.equal(w.allowed('z/c', 'x/a', 'SCTP', 81, 6), false);
  });

  it('neither selects nor matches host-network pods by selectors; an ipBlock matches their address', () => {
    w.setPod({ ns: 'x', name: 'h', node: 'node-1', v4: '192.168.0.1', v6: 'fd00:ff::1', labels: { pod: 'a' }, ports: suitePorts(), hostNetwork: true });
    w.policy(np('x', 'deny-all', {}, { ingress: [], egress: [] }));
    const snap = w.engines.get('node-1')!.snapshot();
    assert.equal(snap.pods.has('x/h'), false, 'a host-network pod is not enforced');
    w.policy(np('y', 'from-a', {}, { ingress: [{ peers: [{ namespaceSelector: {}, podSelector: podIs('a') }] }] }));
    assert.equal(w.allowed('x/h', 'y/b', 'TCP', 80, 4), false, 'not a peer by selector');
    w.policy(np('y', 'from-node', {}, { ingress: [{ peers: [{ ipBlock: { cidr: '192.168.0.0/24' } }] }] }));
    assert.equal(w.allowed('x/h', 'y/b', 'TCP', 80, 4), true);
  });

  it('drops finished pods from peer sets and from enforcement', () => {
    w.policy(np('x', 'from-b', podIs('a'), { ingress: [{ peers: [{ podSelector: podIs('b') }] }] }));
    assert.equal(w.allowed('x/b', 'x/a', 'TCP', 80, 4), true);
    w.setPod({ ...w.pods.get('x/b')!, phase: 'Succeeded' });
    assert.equal(w.allowed('x/b', 'x/a', 'TCP', 80, 4), false);
    w.setPod({ ...w.pods.get('x/a')!, phase: 'Failed' });
    const a = w.pods.get('x/a')!;
    assert.equal(w.engines.get(a.node)!.snapshot().pods.has('x/a'), false);
  });

  it('ignores ingress rules of a policy whose policyTypes is only Egress, and defaults policyTypes from the rules', () => {
    w.policy(np('x', 'egress-only', podIs('a'), { ingress: [{ peers: [{ podSelector: podIs('b') }] }], egress: [{}], types: ['Egress'] }));
    validate(w, 'TCP', 80, new Reach(ALL(w)));
    // No policyTypes, egress rules present: both directions apply.
    w.deletePolicy('x', 'egress-only');
    w.policy({ metadata: { namespace: 'x', name: 'defaults' }, spec: { podSelector: podIs('a'), egress: [{ ports: [{ port: 80 }] }] } });
    validate(w, 'TCP', 81, new Reach(ALL(w)).expectAllIngress('x/a', false).expectAllEgress('x/a', false));
  });

  it('keeps a pod seen before its namespace matchable by the name label, and re-evaluates when labels arrive', () => {
    w.policy(np('x', 'from-team', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchLabels: { team: 'blue' } } }, { namespaceSelector: { matchLabels: { [NSL]: 'late' } } }] }] }));
    w.setPod({ ns: 'late', name: 'p', node: 'node-2', v4: '10.244.7.7', v6: 'fd00::7:7', labels: {}, ports: [] });
    assert.equal(w.allowed('late/p', 'x/a', 'TCP', 80, 4), true);
    w.setNamespace('y', { team: 'blue' });
    assert.equal(w.allowed('y/a', 'x/a', 'TCP', 80, 4), true);
    w.setNamespace('y', {});
    assert.equal(w.allowed('y/a', 'x/a', 'TCP', 80, 4), false);
  });
});
