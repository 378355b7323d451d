// NetworkPolicy conformance matrix over real packets: weftd --network-policy on three nodes in
// Kubernetes mode against the fake API server — nftables on vxlan and host-gw nodes, the OVS
// pipeline's policy tables on ovs nodes — the cases of Kubernetes' e2e netpol suite
// (test/e2e/network/netpol/network_policy.go) checked the way that suite checks them — every pod
// probes every other pod and the whole matrix is compared with a truth table.
//  - namespaces x, y, z (labels `ns: <name>` and `kubernetes.io/metadata.name`), pods a, b, c in
//    each (label `pod: <name>`), 9 pods over 3 nodes (node = (nsIndex + podIndex) % 3: every node
//    holds 3 pods, so same-node (bridged, br_netfilter) and cross-node (routed) pairs are both
//    probed); each pod publishes its ports as serve-80-tcp, serve-80-udp, serve-81-tcp, serve-81-udp;
//  - in every pod an agent (test/helpers/netpol-probe-agent.ts) serves TCP and UDP (echo) on 80
//    and 81 and probes on request, each probe a new socket (a new conntrack entry) with a 1 s
//    timeout; one matrix probe is 9 × 8 × 4 = 288 probes at once;
//  - policies apply asynchronously: after each API change the matrix is probed until it equals the
//    expected one (deadline 10 s; a round starts every 200 ms, up to 5 overlapping, since a round
//    with denied cells lasts the 1 s timeout), then once more to confirm it holds. Printed per
//    step: when the rules were in place, between the start of the round before the first that
//    matched and the start of that one (probes are not resent, so a round sees the rules of its
//    start). The issue asks for "within a second": a figure here, not asserted.
//    Between cases every policy is deleted, labels are restored, and the matrix must be all allowed.
// The truth tables use the suite's Reachability vocabulary (test/helpers/netpol-reach.ts).
// Not covered: SCTP (this kernel has no SCTP module: no sctp in /proc/net/protocols, no modules to
// load), IPv6 (the engine's IPv6 semantics are in test/unit/policy-semantics.test.ts), loopback
// (kubernetes #95879). host-gw runs a subset of the cases (the policy layer is the same table; what
// differs is the path cross-node packets take: routed on the underlay instead of through vxlan).
// ovs runs every vxlan case against ovs nodes (each host its own Open vSwitch, userspace datapath,
// the underlay NIC on br-phy; pods attached to br-int by the flannel CNI bundle delegating to
// weft-ovs): same placement, same truth tables. The matrix each backend saw when a step's match
// was confirmed is recorded, and a last test checks that ovs saw exactly what vxlan (nftables) saw,
// step by step (redundant with both passing the same tables, but it compares the packets' results
// themselves).
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { GLOBAL_VIRTUAL_MAC, macFromIP } from '../../src/backend/ovs/pipeline.js';
import { IPAddr } from '../../src/util/ip.js';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { nsExec, nsPrefix } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import type { OvsInstance } from '../helpers/ovs.js';
import { startHostOvs } from '../helpers/ovs-cluster.js';
import { OvsPodAttacher, PodAttacher, ProbeAgent, probeMatrix, type MatrixPod, type MatrixPodAttacher, tearDownPolicyCluster } from '../helpers/netpol-probe.js';
import { expectMatrix, np, observedCells, renderTable, type Observed, type ProbePort, type Reach, type ReachMatrix, type Sel, wrongCells } from '../helpers/netpol-reach.js';
import { WaitAbort, waitFor } from '../helpers/wait.js';

const NAMESPACES = ['x', 'y', 'z'] as const;
const PODS = ['a', 'b', 'c'] as const;
const KEYS = NAMESPACES.flatMap((ns) => PODS.map((p) => `${ns}/${p}`));
const PORTS: readonly ProbePort[] = [
  { protocol: 'TCP', port: 80 },
  { protocol: 'TCP', port: 81 },
  { protocol: 'UDP', port: 80 },
  { protocol: 'UDP', port: 81 },
];
const NETWORK = '10.13.0.0/16';
const podCIDR = (i: number) => `10.13.${i}.0/24`;
const NSL = 'kubernetes.io/metadata.name';
const CONVERGE_MS = 10_000;
const ROUND_EVERY_MS = 200;
const ROUNDS_IN_FLIGHT = 5;

/** One matrix probe round of `converge`. */
interface Round {
  readonly start: number;
  done: Promise<void>;
  seen?: Observed;
  ok?: boolean;
  error?: Error;
}

const podIs = (p: string): Sel => ({ matchLabels: { pod: p } });
const nsIs = (ns: string): Sel => ({ matchLabels: { ns } });
const onlyTCP80 = (r: Reach, p: ProbePort, to: string) => (p.protocol === 'TCP' && p.port === 80 ? r : r.expectAllIngress(to, false));

interface PodInfo extends MatrixPod {
  readonly ns: string;
  readonly name: string;
  readonly host: Host;
}

type Backend = 'vxlan' | 'host-gw' | 'ovs';

/** Per backend, per step: the confirmed matrix, cell by cell (observedCells). */
const observed = new Map<Backend, Map<string, string[]>>();

/** One time-to-match figure. */
interface Timing {
  readonly backend: Backend;
  readonly step: string;
  /**
   * From the API change to the start of the last probe round before the first that matched (0 when
   * the first matched) and to the start of the first that matched: the rules were in place between
   * the two (a round sends its probes when it starts); `endMs`: when the match was seen.
   */
  readonly beforeMs: number;
  readonly startMs: number;
  readonly endMs: number;
  readonly rounds: number;
}
const timings: Timing[] = [];

function printTimings(): void {
  if (timings.length === 0) return;
  console.log('\n  time from the API change to the matrix matching: rules in place between (round before – first matching round), seen at, rounds');
  for (const t of timings) console.log(`    [${t.backend}] ${t.step}: ${t.beforeMs}–${t.startMs} ms, ${t.endMs} ms, ${t.rounds}`);
}

type Case = (this: Mocha.Context) => Promise<void>;

/** Waits for every promise to settle, then throws the first rejection (nothing left running). */
async function allSettledOrThrow(ps: readonly Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(ps)).find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}

function matrixSuite(backend: Backend, tag: string, only?: readonly string[]): void {
  describe(`weftd --network-policy: the e2e netpol matrix over real packets (${backend}, 3 nodes, 9 pods)`, function () {
    this.timeout(60_000);
    let c: Cluster | undefined;
    let fake: FakeKube | undefined;
    let fwd: NetnsForward | undefined;
    const attacher: MatrixPodAttacher = backend === 'ovs' ? new OvsPodAttacher() : new PodAttacher();
    /** ovs: each host's Open vSwitch. */
    const switches = new Map<Host, OvsInstance>();
    const pods: PodInfo[] = [];
    const seenHere = new Map<string, string[]>();
    observed.set(backend, seenHere);

    const podObject = (p: PodInfo, extraLabels: Record<string, string> = {}): JsonObject => ({
      metadata: { namespace: p.ns, name: p.name, labels: { pod: p.name, ...extraLabels } },
      spec: {
        nodeName: `h${p.host.i}`,
        containers: [
          {
            name: 'c',
            ports: [80, 81].flatMap((port) => (['TCP', 'UDP'] as const).map((protocol) => ({ name: `serve-${port}-${protocol.toLowerCase()}`, containerPort: port, protocol }))),
          },
        ],
      },
      status: { phase: 'Running', podIP: p.ip, podIPs: [{ ip: p.ip }] },
    });
    const nsObject = (ns: string, extraLabels: Record<string, string> = {}): JsonObject => ({ metadata: { name: ns, labels: { ns, [NSL]: ns, ...extraLabels } } });
    const pod = (key: string): PodInfo => pods.find((p) => p.key === key)!;
    const api = () => fake!;

    /** Dumps what the nodes enforce, for a failure: the weft_policy table, or br-int's tables 50–60 with counters. */
    async function rulesets(): Promise<string> {
      const out: string[] = [];
      for (const h of c!.hosts) {
        const ovs = switches.get(h);
        const t = ovs
          ? await ovs.ofctl('-O', 'OpenFlow15', 'dump-flows', 'br-int').then(
              (text) => text.split('\n').filter((l) => /\btable=(5\d|60)\b/.test(l)).join('\n'),
              (e: Error) => e.message,
            )
          : await nsExec(h.ns, 'nft', 'list', 'table', 'inet', 'weft_policy').catch((e: Error) => e.message);
        out.push(`--- h${h.i} (pods ${pods.filter((p) => p.host === h).map((p) => `${p.key}=${p.ip}`).join(' ')}):\n${t}`);
      }
      return out.join('\n');
    }

    /**
     * ovs, for a failure: per wrong cell, what the destination node's OpenFlow tables decide for a
     * new connection (ofproto/trace, conntrack state new) next to the datapath flows that packets
     * of that pair meet (dpctl/dump-flows) — the two differ when the datapath kept stale flows.
     */
    async function ovsDiagnosis(wrong: readonly string[]): Promise<string> {
      const out: string[] = [];
      for (const w of wrong) {
        const m = /^(TCP|UDP)\/(\d+) (\S+) -> (\S+):/.exec(w);
        if (!m) continue;
        const [, proto, port, from, to] = m as unknown as [string, 'TCP' | 'UDP', string, string, string];
        const [src, dst] = [pod(from), pod(to)];
        const o = switches.get(dst.host)!;
        const l4 = proto.toLowerCase();
        const inPort =
          src.host === dst.host
            ? `in_port=${(await o.vsctl('--columns=ofport', '--bare', 'find', 'interface', `external_ids:ip="${src.ip}"`).catch(() => '?')).trim()},dl_src=${macFromIP(IPAddr.parse(src.ip))},dl_dst=${macFromIP(IPAddr.parse(dst.ip))}`
            : `in_port=weft-tun0,tun_id=1,dl_dst=${GLOBAL_VIRTUAL_MAC}`;
        const flow = `${inPort},${l4},nw_src=${src.ip},nw_dst=${dst.ip},nw_ttl=${src.host === dst.host ? 64 : 63},${l4}_dst=${port}`;
        const trace = await o.appctl('ofproto/trace', 'br-int', flow, '--ct-next', 'trk,new').catch((e: Error) => e.message);
        // The datapath flows after conntrack (ct_state in the key) towards the destination: a source
        // may be matched under a mask, so every source is listed.
        const dp = (await o.appctl('dpctl/dump-flows').catch((e: Error) => e.message)).split('\n').filter((l) => l.includes(`,dst=${dst.ip},`) && l.includes('ct_state('));
        out.push(`=== ${w}\n--- h${dst.host.i}: ofproto/trace ${flow} --ct-next trk,new\n${trace}\n--- h${dst.host.i}: datapath flows after conntrack to ${dst.ip} (from ${src.ip}):\n${dp.join('\n')}`);
      }
      return out.join('\n');
    }

    /**
     * Probes the matrix until it equals `want` (deadline 10 s after `since`), records the time to
     * match, and with `confirm` probes once more: the match must hold. A mismatch lists every wrong
     * cell, with the suite's tables of the wrong protocol/ports.
     */
    async function converge(step: string, want: ReachMatrix, since: number, confirm = true): Promise<void> {
      const fail = async (why: string, seen: Observed): Promise<never> => {
        const wrong = wrongCells(want, seen);
        const bad = new Set(wrong.map((w) => w.split(' ')[0]!));
        const tables = [...want].filter(([k]) => bad.has(k)).map(([k, r]) => renderTable(KEYS, k, r, seen.get(k)));
        console.error(`${step}: ${why}; the nodes' rulesets:\n${await rulesets()}`);
        if (switches.size > 0) console.error(`${step}: where ovs differs:\n${await ovsDiagnosis(wrong.slice(0, 2))}`);
        assert.fail(`${step}: ${why}; ${wrong.length} wrong cells:\n  ${wrong.join('\n  ')}\n(* = wrong; . allowed, X denied)\n${tables.join('\n\n')}`);
      };
      // A round with denied cells lasts the probe timeout (1 s); rounds start every ROUND_EVERY_MS
      // (at most ROUNDS_IN_FLIGHT at once) so the time to match is known to that resolution.
      const rounds: Round[] = [];
      const launch = () => {
        const r: Round = { start: Date.now(), done: Promise.resolve() };
        r.done = probeMatrix(pods, PORTS).then(
          (seen) => {
            r.seen = seen;
            r.ok = wrongCells(want, seen).length === 0;
          },
          (e: Error) => {
            r.error = e;
          },
        );
        rounds.push(r);
      };
      const settled = () => Promise.all(rounds.map((r) => r.done));
      try {
        await waitFor(
          () => {
            const broken = rounds.find((r) => r.error);
            if (broken) throw new WaitAbort(broken.error!.message);
            if (rounds.some((r) => r.ok)) return true;
            if (rounds.filter((r) => !r.seen).length < ROUNDS_IN_FLIGHT) launch();
            return false;
          },
          { timeoutMs: Math.max(0, since + CONVERGE_MS - Date.now()), intervalMs: ROUND_EVERY_MS, what: step },
        );
      } catch (e) {
        await settled();
        const last = rounds.filter((r) => r.seen).at(-1)?.seen;
        if (e instanceof WaitAbort || !last) throw e;
        return fail(`no match within ${CONVERGE_MS} ms (${rounds.length} rounds)`, last);
      }
      const detected = Date.now();
      // The confirming round runs while the rounds still in flight end.
      const [again] = await Promise.all([confirm ? probeMatrix(pods, PORTS) : undefined, settled()]);
      const first = rounds.findIndex((r) => r.ok);
      const matchedAt = rounds[first]!.start;
      const missedAt = first > 0 ? rounds[first - 1]!.start : since;
      if (again) {
        if (wrongCells(want, again).length > 0) await fail('matched once, but not on the next round', again);
        seenHere.set(step, observedCells(again));
        const t = { backend, step, beforeMs: missedAt - since, startMs: matchedAt - since, endMs: detected - since, rounds: rounds.length };
        timings.push(t);
        console.log(`      ${step}: in place ${t.beforeMs}–${t.startMs} ms after the change (seen at ${t.endMs} ms; ${t.rounds} rounds)`);
      }
    }

    /** One API change and the matrix it must lead to. */
    async function step(name: string, change: () => void, want: ReachMatrix): Promise<void> {
      const since = Date.now();
      change();
      await converge(name, want, since);
    }

    const all = (f?: (r: Reach, p: ProbePort) => Reach) => expectMatrix(KEYS, PORTS, f);
    const put = (policy: JsonObject) => () => void api().networkPolicies.put(policy);

    before(async function () {
      this.timeout(180_000);
      const t0 = Date.now();
      fake = await FakeKube.start();
      c = await Cluster.create({ hosts: 3, tag, config: {} });
      const tCluster = Date.now();
      const cl = c;
      fwd = await NetnsForward.start(cl.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
      const netConf = join(cl.dir, 'net-conf.json');
      const backendConf = backend === 'ovs' ? { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } : { Type: backend };
      writeFileSync(netConf, JSON.stringify({ Network: NETWORK, Backend: backendConf }));
      for (const h of cl.hosts) fake.nodes.create(`h${h.i}`, { spec: { podCIDR: podCIDR(h.i), podCIDRs: [podCIDR(h.i)] } });
      for (const ns of NAMESPACES) fake.namespaces.put(nsObject(ns));
      // ovs: each host's Open vSwitch, its underlay NIC on br-phy (where the node address then is).
      if (backend === 'ovs') for (const h of cl.hosts) switches.set(h, await startHostOvs(cl, h));
      await Promise.all(
        cl.hosts.map((h) => {
          const ovs = switches.get(h);
          return h.startWeftd(
            [
              ...(ovs ? ['--iface', 'br-phy'] : []),
              '--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf, '--network-policy', '--iptables-resync', '1',
            ],
            { NODE_NAME: `h${h.i}`, ...(ovs ? { OVS_RUNDIR: ovs.runDir } : {}) },
          );
        }),
      );
      // Per node, its pods in order (the first through Host.attachPod, which makes cni0).
      const placed = NAMESPACES.flatMap((ns, i) => PODS.map((name, j) => ({ ns, name, host: cl.hosts[(i + j) % cl.hosts.length]! })));
      const tWeftd = Date.now();
      const attached = new Map<string, { netns: string; ip: string }>();
      await allSettledOrThrow(
        cl.hosts.map(async (h) => {
          for (const p of placed.filter((q) => q.host === h)) attached.set(`${p.ns}/${p.name}`, await attacher.attach(h, `${nsPrefix(tag)}-${p.ns}-${p.name}`));
        }),
      );
      // The agents start together; each is pushed once it runs, and every start has ended before
      // a failure is thrown, so `after` stops every agent there is.
      await allSettledOrThrow(
        placed.map(async (p) => {
          const key = `${p.ns}/${p.name}`;
          const { netns, ip } = attached.get(key)!;
          pods.push({ ...p, key, ip, agent: await ProbeAgent.start(netns, [80, 81]) });
        }),
      );
      pods.sort((p, q) => KEYS.indexOf(p.key) - KEYS.indexOf(q.key));
      for (const p of pods) fake.pods.put(podObject(p));
      const tEnd = Date.now();
      console.log(`      set-up: ${tEnd - t0} ms (namespaces and etcd ${tCluster - t0}, weftd ${tWeftd - tCluster}, 9 pods and agents ${tEnd - tWeftd})`);
    });

    after(async function () {
      this.timeout(120_000);
      await tearDownPolicyCluster({
        agents: pods.map((p) => p.agent),
        attacher,
        hosts: c?.hosts ?? [],
        switches: switches.values(),
        others: [() => c?.destroy() ?? Promise.resolve(), () => fwd?.stop() ?? Promise.resolve(), () => fake?.stop() ?? Promise.resolve()],
      });
    });

    afterEach(async function () {
      this.timeout(60_000);
      if (!fake || pods.length === 0) return;
      const f = fake;
      const since = Date.now();
      for (const p of f.networkPolicies.list()) {
        const m = p.metadata as { namespace: string; name: string };
        f.networkPolicies.delete(`${m.namespace}/${m.name}`);
      }
      for (const ns of NAMESPACES) f.namespaces.put(nsObject(ns));
      for (const p of pods) f.pods.put(podObject(p));
      await converge('reset: policies deleted, labels restored', all(), since, false);
    });

    const cases: Array<[string, Case]> = [
      [
        'no policy: every pod reaches every other pod (TCP and UDP, 80 and 81)',
        async () => {
          // The rules of freshly published pods: the first probes may come before they are in.
          await converge('no policy', all(), Date.now());
        },
      ],
      [
        'default-deny-ingress in x (TCP and UDP)',
        () => step('default-deny ingress in x', put(np('x', 'deny-ingress', {}, { ingress: [] })), all((r) => r.expectPeer({}, { ns: 'x' }, false))),
      ],
      [
        'default-deny-all (ingress and egress) in x',
        () =>
          step(
            'default-deny all in x',
            put(np('x', 'deny-all', {}, { ingress: [], egress: [] })),
            all((r) => r.expectPeer({}, { ns: 'x' }, false).expectPeer({ ns: 'x' }, {}, false)),
          ),
      ],
      [
        'allows traffic from pods within the server namespace based on PodSelector',
        () =>
          step(
            'x/a allows x/b',
            put(np('x', 'x-a-allows-x-b', podIs('a'), { ingress: [{ peers: [{ podSelector: podIs('b') }] }] })),
            all((r) => r.expectAllIngress('x/a', false).expect('x/b', 'x/a', true)),
          ),
      ],
      [
        'allows traffic only from a different namespace, based on NamespaceSelector (matchExpressions)',
        () =>
          step(
            'x/a allows ns In [y]',
            put(np('x', 'via-expr', podIs('a'), { ingress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'In', values: ['y'] }] } }] }] })),
            all((r) => r.expectPeer({ ns: 'x' }, { ns: 'x', pod: 'a' }, false).expectPeer({ ns: 'z' }, { ns: 'x', pod: 'a' }, false)),
          ),
      ],
      [
        'enforces PodSelector AND NamespaceSelector (one peer)',
        () =>
          step(
            'x/a allows pod=b AND ns NotIn [x]',
            put(
              np('x', 'and', podIs('a'), {
                ingress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: 'ns', operator: 'NotIn', values: ['x'] }] }, podSelector: podIs('b') }] }],
              }),
            ),
            all((r) => r.expectAllIngress('x/a', false).expect('y/b', 'x/a', true).expect('z/b', 'x/a', true)),
          ),
      ],
      [
        'enforces PodSelector OR NamespaceSelector (two peers)',
        () =>
          step(
            'x/a allows pod=b OR ns NotIn [x]',
            put(
              np('x', 'or', podIs('a'), {
                ingress: [{ peers: [{ namespaceSelector: { matchExpressions: [{ key: NSL, operator: 'NotIn', values: ['x'] }] } }, { podSelector: podIs('b') }] }],
              }),
            ),
            all((r) => r.expect('x/c', 'x/a', false)),
          ),
      ],
      [
        'enforces policy based on Ports: only TCP 80 allowed, 81 and UDP denied (UDP not treated as TCP)',
        () =>
          step(
            'x/a allows TCP 80',
            put(np('x', 'tcp-80', podIs('a'), { ingress: [{ ports: [{ port: 80, protocol: 'TCP' }] }] })),
            all((r, p) => onlyTCP80(r, p, 'x/a')),
          ),
      ],
      [
        'allows ingress on a named port (serve-80-tcp, then serve-81-udp)',
        async () => {
          await step('x/a allows serve-80-tcp', put(np('x', 'named', podIs('a'), { ingress: [{ ports: [{ port: 'serve-80-tcp' }] }] })), all((r, p) => onlyTCP80(r, p, 'x/a')));
          await step(
            'x/a allows serve-81-udp (policy updated)',
            put(np('x', 'named', podIs('a'), { ingress: [{ ports: [{ port: 'serve-81-udp', protocol: 'UDP' }] }] })),
            all((r, p) => (p.protocol === 'UDP' && p.port === 81 ? r : r.expectAllIngress('x/a', false))),
          );
        },
      ],
      [
        'allows port ranges with endPort (79-80, then 80-81)',
        async () => {
          await step('x/a allows TCP 79-80', put(np('x', 'range', podIs('a'), { ingress: [{ ports: [{ port: 79, endPort: 80, protocol: 'TCP' }] }] })), all((r, p) => onlyTCP80(r, p, 'x/a')));
          await step(
            'x/a allows TCP 80-81 (policy updated)',
            put(np('x', 'range', podIs('a'), { ingress: [{ ports: [{ port: 80, endPort: 81, protocol: 'TCP' }] }] })),
            all((r, p) => (p.protocol === 'TCP' ? r : r.expectAllIngress('x/a', false))),
          );
        },
      ],
      [
        'enforces multiple, stacked policies (the union of their rules)',
        async () => {
          const fromY = { peers: [{ namespaceSelector: nsIs('y') }] };
          const onlyY = (r: Reach) => r.expectAllIngress('x/a', false).expectPeer({ ns: 'y' }, { ns: 'x', pod: 'a' }, true);
          await step(
            'x/a allows TCP 81 from y',
            put(np('x', 'allow-81', podIs('a'), { ingress: [{ ...fromY, ports: [{ port: 81, protocol: 'TCP' }] }] })),
            all((r, p) => (p.protocol === 'TCP' && p.port === 81 ? onlyY(r) : r.expectAllIngress('x/a', false))),
          );
          await step(
            'x/a also allows TCP 80 from y (second policy)',
            put(np('x', 'allow-80', podIs('a'), { ingress: [{ ...fromY, ports: [{ port: 80, protocol: 'TCP' }] }] })),
            all((r, p) => (p.protocol === 'TCP' ? onlyY(r) : r.expectAllIngress('x/a', false))),
          );
        },
      ],
      [
        'denies egress from x/a, then allows egress to y/a by a second policy',
        async () => {
          await step('x/a egress denied', put(np('x', 'deny-egress-a', podIs('a'), { egress: [] })), all((r) => r.expectAllEgress('x/a', false)));
          await step(
            'x/a egress allowed to y/a',
            put(np('x', 'to-ya', podIs('a'), { egress: [{ peers: [{ namespaceSelector: nsIs('y'), podSelector: podIs('a') }] }] })),
            all((r) => r.expectAllEgress('x/a', false).expect('x/a', 'y/a', true)),
          );
        },
      ],
      [
        'enforces the except clause of an ipBlock (egress to the cluster network except x/b)',
        () =>
          step(
            'x/a egress to the cluster network except x/b',
            () => void api().networkPolicies.put(np('x', 'cidr-except', podIs('a'), { egress: [{ peers: [{ ipBlock: { cidr: NETWORK, except: [`${pod('x/b').ip}/32`] } }] }] })),
            all((r) => r.expect('x/a', 'x/b', false)),
          ),
      ],
      [
        'follows pod label updates: a policy starts and stops selecting a pod, and a peer',
        async () => {
          const f = api();
          await step('deny ingress to target=isolated (none yet)', put(np('x', 'deny-label', { matchLabels: { target: 'isolated' } }, { ingress: [] })), all());
          await step('x/a labelled target=isolated', () => void f.pods.put(podObject(pod('x/a'), { target: 'isolated' })), all((r) => r.expectAllIngress('x/a', false)));
          await step(
            'x/a allows pod=b,pod2=updated (none yet)',
            put(np('x', 'deny-label', { matchLabels: { target: 'isolated' } }, { ingress: [{ peers: [{ podSelector: { matchLabels: { pod: 'b', pod2: 'updated' } } }] }] })),
            all((r) => r.expectAllIngress('x/a', false)),
          );
          await step('x/b labelled pod2=updated', () => void f.pods.put(podObject(pod('x/b'), { pod2: 'updated' })), all((r) => r.expectAllIngress('x/a', false).expect('x/b', 'x/a', true)));
          await step('x/a label removed', () => void f.pods.put(podObject(pod('x/a'))), all());
        },
      ],
      [
        'enforces an updated policy (allow-all → deny-all) and stops enforcing it once deleted',
        async () => {
          await step('allow-all ingress in x', put(np('x', 'mutate', {}, { ingress: [{}] })), all());
          await step('updated to deny-all ingress', put(np('x', 'mutate', {}, { ingress: [] })), all((r) => r.expectPeer({}, { ns: 'x' }, false)));
          await step('deleted', () => api().networkPolicies.delete('x/mutate'), all());
        },
      ],
    ];

    for (const [name, fn] of cases) {
      if (only && !only.some((o) => name.startsWith(o))) continue;
      it(name, fn);
    }
  });
}

describe('NetworkPolicy conformance matrix', () => {
  after(printTimings);
  matrixSuite('vxlan', 'nm');
  // host-gw: the same tables, cross-node packets routed over the one L2 underlay; a subset (each
  // backend's set-up is most of the cost).
  matrixSuite('host-gw', 'nmh', ['no policy', 'default-deny-all', 'enforces PodSelector AND', 'enforces policy based on Ports', 'enforces the except clause']);
  // ovs: every case, enforced by the OVS pipeline's policy tables instead of nftables.
  matrixSuite('ovs', 'nmo');

  describe('ovs and nftables (vxlan) agree', () => {
    it('every step both ran saw the same matrix, cell by cell, on ovs as on vxlan', function () {
      const nft = observed.get('vxlan') ?? new Map<string, string[]>();
      const ovs = observed.get('ovs') ?? new Map<string, string[]>();
      const common = [...nft.keys()].filter((step) => ovs.has(step));
      // Only part of the file ran (--grep), or a backend's set-up failed (already reported).
      if (common.length === 0) this.skip();
      const differ = common.filter((step) => JSON.stringify(nft.get(step)) !== JSON.stringify(ovs.get(step)));
      const detail = differ.map((step) => {
        const a = new Set(nft.get(step));
        const b = new Set(ovs.get(step));
        return `${step}: vxlan only [${[...a].filter((x) => !b.has(x)).join(', ')}], ovs only [${[...b].filter((x) => !a.has(x)).join(', ')}]`;
      });
      assert.deepEqual(differ, [], detail.join('\n'));
      const missing = [...nft.keys()].filter((step) => !ovs.has(step));
      console.log(`      ${common.length} steps compared (${nft.get(common[0]!)!.length} cells each)${missing.length ? `; not run on ovs: ${missing.join(', ')}` : ''}`);
    });
  });
});
