// The truth tables of Kubernetes' e2e netpol suite (test/e2e/network/netpol/reachability.go) in
// its own vocabulary: a Reach is every (from → to) pair of pods, all allowed (or all denied), then
// exceptions applied in order (expectPeer, expectAllIngress, …). Pods are "namespace/name". Used by
// the engine's truth tables (test/unit/policy-semantics.test.ts) and by the conformance matrix
// over real packets (test/integration/netpol-matrix.test.ts), which expects one Reach per probed
// protocol and port (a `ReachMatrix`) and reports every cell that differs.
import type { JsonObject } from './fake-kube/json.js';

/** A set of pods: those in `ns` (any when unset) named `pod` (any when unset). */
export interface Peer {
  ns?: string;
  pod?: string;
}

/** The suite's Reachability: everything allowed, then exceptions, applied in order. */
export class Reach {
  readonly m = new Map<string, boolean>();
  constructor(readonly pods: readonly string[], initial = true) {
    for (const a of pods) for (const b of pods) this.m.set(`${a}>${b}`, initial);
  }
  private static is(key: string, p: Peer): boolean {
    const [ns, pod] = key.split('/');
    return (p.ns === undefined || p.ns === ns) && (p.pod === undefined || p.pod === pod);
  }
  expectPeer(from: Peer, to: Peer, v: boolean): this {
    for (const a of this.pods) for (const b of this.pods) if (Reach.is(a, from) && Reach.is(b, to)) this.m.set(`${a}>${b}`, v);
    return this;
  }
  expect(from: string, to: string, v: boolean): this {
    this.m.set(`${from}>${to}`, v);
    return this;
  }
  expectAllIngress(to: string, v: boolean): this {
    for (const a of this.pods) this.m.set(`${a}>${to}`, v);
    return this;
  }
  expectAllEgress(from: string, v: boolean): this {
    for (const b of this.pods) this.m.set(`${from}>${b}`, v);
    return this;
  }
}

// ---- one Reach per probed protocol and port ----

export type ProbeProtocol = 'TCP' | 'UDP';

export interface ProbePort {
  readonly protocol: ProbeProtocol;
  readonly port: number;
}

/** "TCP/80" */
export const portKey = (p: ProbePort): string => `${p.protocol}/${p.port}`;

/** What is allowed, per probed protocol/port (keyed by `portKey`). */
export type ReachMatrix = ReadonlyMap<string, Reach>;

/**
 * The expected matrix: `f` builds the Reach of each protocol/port (from a fresh all-allowed Reach),
 * e.g. `expectMatrix(PODS, PORTS, (r, p) => p.protocol === 'TCP' ? r : r.expectAllIngress('x/a', false))`.
 */
export function expectMatrix(pods: readonly string[], ports: readonly ProbePort[], f: (r: Reach, p: ProbePort) => Reach = (r) => r): ReachMatrix {
  return new Map(ports.map((p) => [portKey(p), f(new Reach(pods), p)]));
}

/** What a probe round saw: per protocol/port, per "from>to", allowed or not (and why, for messages). */
export type Observed = ReadonlyMap<string, ReadonlyMap<string, { readonly ok: boolean; readonly detail: string }>>;

/** An observation as sorted lines `<port> <from>><to> allow|deny`: two backends' rounds compare as arrays. */
export function observedCells(got: Observed): string[] {
  const out: string[] = [];
  for (const [port, cells] of got) for (const [pair, r] of cells) out.push(`${port} ${pair} ${r.ok ? 'allow' : 'deny'}`);
  return out.sort();
}

/** Every cell (self excluded) where the observation differs from the expectation, one line each. */
export function wrongCells(want: ReachMatrix, got: Observed): string[] {
  const wrong: string[] = [];
  for (const [port, reach] of want) {
    for (const [pair, allowed] of reach.m) {
      const [from, to] = pair.split('>') as [string, string];
      if (from === to) continue;
      const seen = got.get(port)?.get(pair);
      if (!seen) {
        wrong.push(`${port} ${from} -> ${to}: not probed`);
      } else if (seen.ok !== allowed) {
        wrong.push(`${port} ${from} -> ${to}: expected ${allowed ? 'allow' : 'deny'}, got ${seen.ok ? 'allow' : 'deny'} (${seen.detail})`);
      }
    }
  }
  return wrong;
}

/**
 * The suite's printed table for one protocol/port: a row per source, a column per destination,
 * `.` allowed, `X` denied, `*` a wrong cell (with the observation), `-` self.
 */
export function renderTable(pods: readonly string[], port: string, want: Reach, got?: ReadonlyMap<string, { readonly ok: boolean }>): string {
  const w = Math.max(...pods.map((p) => p.length)) + 1;
  const head = `${port.padEnd(w)}${pods.map((p) => p.padEnd(w)).join('')}`;
  const rows = pods.map((from) => {
    const cells = pods.map((to) => {
      if (from === to) return '-'.padEnd(w);
      const k = `${from}>${to}`;
      const expected = want.m.get(k) ?? true;
      const seen = got?.get(k);
      const c = seen && seen.ok !== expected ? `*${seen.ok ? '.' : 'X'}` : expected ? '.' : 'X';
      return c.padEnd(w);
    });
    return `${from.padEnd(w)}${cells.join('')}`;
  });
  return [head, ...rows].join('\n');
}

// ---- the suite's policy builders, as raw API objects ----

export type Sel = { matchLabels?: Record<string, string>; matchExpressions?: Array<{ key: string; operator: string; values?: string[] }> };
export type RawPeer = { podSelector?: Sel; namespaceSelector?: Sel; ipBlock?: { cidr: string; except?: string[] } };
export type RawPort = { protocol?: 'TCP' | 'UDP' | 'SCTP'; port?: number | string; endPort?: number };
export interface RawRule {
  peers?: RawPeer[];
  ports?: RawPort[];
}

/** A NetworkPolicy as the API server sends it; policyTypes from the rules given unless `types`. */
export function np(ns: string, name: string, podSelector: Sel, opts: { ingress?: RawRule[]; egress?: RawRule[]; types?: string[] }): JsonObject {
  const types = opts.types ?? [...(opts.ingress ? ['Ingress'] : []), ...(opts.egress ? ['Egress'] : [])];
  const rule = (r: RawRule, peers: 'from' | 'to') => ({ ...(r.peers ? { [peers]: r.peers } : {}), ...(r.ports ? { ports: r.ports } : {}) });
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { namespace: ns, name },
    spec: {
      podSelector: podSelector as JsonObject,
      policyTypes: types,
      ...(opts.ingress ? { ingress: opts.ingress.map((r) => rule(r, 'from') as JsonObject) } : {}),
      ...(opts.egress ? { egress: opts.egress.map((r) => rule(r, 'to') as JsonObject) } : {}),
    },
  };
}
