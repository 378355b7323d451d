// The NetworkPolicy enforcer's choice of dataplane. On an ovs node pod traffic stays in Open
// vSwitch and never crosses the nftables hooks, so the rules go into the OVS pipeline's policy
// tables: no nft, no br_netfilter sysctl; the driver waits for the ovs backend to attach to the
// enforcer's flow section (weftd hands the section to the backend), then writes the whole rule
// set in one bundle, and an event's flows in the next. On a bridge node (vxlan) the same lists go
// to nftables with the sysctls on. The API is a fake client that serves the three lists and holds
// the watches open (events pushed by the test); the bridge is a fake section host.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { PolicyFlowHost } from '../../src/backend/ovs/policy-section.js';
import { BRIDGE_NF_SYSCTLS, PolicyEnforcer } from '../../src/policy/enforcer.js';
import type { JsonObject, KubeClient, RawWatchEvent, WatchEnd } from '../../src/subnet/kube/client.js';
import { IPAddr } from '../../src/util/ip.js';
import type { Logger } from '../../src/util/log.js';
import { waitFor } from '../helpers/wait.js';

const silent: Logger = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {}, child: () => silent };

const PATHS = { namespaces: '/api/v1/namespaces', pods: '/api/v1/pods', networkpolicies: '/apis/networking.k8s.io/v1/networkpolicies' } as const;

const pod = (name: string, app: string, ip: string, node = 'n1'): JsonObject => ({
  metadata: { namespace: 'x', name, uid: `u-${name}`, labels: { app } },
  spec: { nodeName: node, containers: [{ name: 'c' }] },
  status: { phase: 'Running', podIP: ip, podIPs: [{ ip }] },
});

/** A KubeClient that lists `lists` and keeps every watch open until aborted; `emit` sends a watch event. */
function fakeClient(lists: Record<string, JsonObject[]>, calls: string[]) {
  const watchers = new Map<string, (ev: RawWatchEvent) => void>();
  const client = {
    listRaw: (_op: string, path: string) => {
      calls.push(`list ${path}`);
      return Promise.resolve({ items: lists[path] ?? [], resourceVersion: '1' });
    },
    watchRaw: (_op: string, path: string, _rv: string, onEvent: (ev: RawWatchEvent) => void, signal: AbortSignal, onOpen?: () => void): Promise<WatchEnd> => {
      calls.push(`watch ${path}`);
      watchers.set(path, onEvent);
      onOpen?.();
      return new Promise((resolve) => signal.addEventListener('abort', () => resolve('closed'), { once: true }));
    },
  };
  const emit = (path: string, ev: RawWatchEvent) => {
    const w = watchers.get(path);
    assert.ok(w, `no watch open on ${path}`);
    w(ev);
  };
  return { client: new Proxy(client, { get: (t, p) => (p in t ? t[p as keyof typeof t] : () => assert.fail(`the enforcer called client.${String(p)}`)) }) as unknown as KubeClient, emit, watching: (path: string) => watchers.has(path) };
}

describe('policy enforcer: the dataplane by backend', function () {
  this.timeout(20_000);
  let dir = '';
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'weft-enforcer-'));
    for (const name of BRIDGE_NF_SYSCTLS) writeFileSync(join(dir, name), '0\n');
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  const sysctls = () => BRIDGE_NF_SYSCTLS.map((name) => readFileSync(join(dir, name), 'utf8').trim());

  const lists = (): Record<string, JsonObject[]> => ({
    [PATHS.namespaces]: [{ metadata: { name: 'x' } }],
    [PATHS.pods]: [pod('a', 'a', '10.9.0.2'), pod('b', 'b', '10.9.0.3')],
    [PATHS.networkpolicies]: [
      {
        metadata: { namespace: 'x', name: 'allow-a' },
        spec: { podSelector: { matchLabels: { app: 'b' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }] }] },
      },
    ],
  });

  it('on an ovs node: no nft and no bridge sysctl; waits for the flow section host, then bundles the rule flows, then an event’s flows', async () => {
    const calls: string[] = [];
    const nft: string[] = [];
    const { client, emit, watching } = fakeClient(lists(), calls);
    const enforcer = new PolicyEnforcer({
      client,
      nodeName: 'n1',
      logger: silent,
      resyncSeconds: 3600,
      networkConfig: () => Promise.resolve({ enableIPv4: true, enableIPv6: false, backend: { type: 'ovs', options: { Type: 'ovs' } } }),
      run: (args) => {
        nft.push(args.join(' '));
        return Promise.resolve('');
      },
      bridgeSysctlDir: dir,
    });
    const stop = new AbortController();
    const running = enforcer.run(stop.signal);
    try {
      // The lists are read and the watches open, but nothing is written before the backend attaches.
      await waitFor(() => Object.values(PATHS).every(watching), { what: 'the three watches' });
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(enforcer.ready, false, 'ready before the bridge took the rules');
      assert.equal(enforcer.flowSection.flows(3), null, 'the section has flows before the enforcer programmed it');

      const bundles: string[] = [];
      const host: PolicyFlowHost = {
        round: 3,
        bundle: (mods) => {
          bundles.push(mods);
          return Promise.resolve();
        },
        dumpPolicyFlows: () => Promise.resolve([]),
      };
      enforcer.flowSection.attach(host);
      await waitFor(() => enforcer.ready, { what: 'the first write' });
      assert.equal(bundles.length, 1);
      const first = bundles[0]!.trim().split('\n');
      assert.ok(first.every((l) => l.startsWith('add cookie=0x3040')), `every line adds a Policy flow of round 3:\n${bundles[0]}`);
      const has = (re: RegExp, lines: readonly string[]) => assert.ok(lines.some((l) => re.test(l)), `no line matches ${re.source}:\n${lines.join('\n')}`);
      // b is ingress-isolated: its drop, and the rule (pod b, peer a, TCP 80) as a conjunction.
      has(/^add cookie=0x3040000000000,table=55,priority=200,ip,nw_dst=10\.9\.0\.3,actions=drop$/, first);
      has(/table=54,priority=200,ip,nw_dst=10\.9\.0\.3,actions=conjunction\(\d+,1\/3\)$/, first);
      has(/table=54,priority=200,ip,nw_src=10\.9\.0\.2,actions=conjunction\(\d+,2\/3\)$/, first);
      has(/table=54,priority=200,tcp,tp_dst=80,actions=conjunction\(\d+,3\/3\)$/, first);
      has(/table=54,priority=200,conj_id=\d+,ip,actions=set_field:0x[0-9a-f]+->reg3,goto_table:56$/, first);
      assert.equal(first.length, 5);
      // Full passes of the backend now include the rule flows.
      assert.equal(enforcer.flowSection.flows(3)?.length, 5);

      // A new peer pod: one bundle with its one peer flow.
      emit(PATHS.pods, { type: 'ADDED', object: pod('a2', 'a', '10.9.0.4', 'n2'), resourceVersion: '2' });
      await waitFor(() => bundles.length === 2, { what: 'the event’s bundle' });
      assert.match(bundles[1]!, /^add cookie=0x304[0-9a-f]+,table=54,priority=200,ip,nw_src=10\.9\.0\.4,actions=conjunction\(\d+,2\/3\)\n$/);
      assert.equal(enforcer.flowSection.flows(3)?.length, 6);
      // The decision as programmed (weft trace).
      const answer = enforcer.explain(IPAddr.parse('10.9.0.4'), IPAddr.parse('10.9.0.3'), 'TCP', 80);
      assert.equal(answer.programmed, true);
      assert.deepEqual(
        answer.decisions.map(({ direction, pod, allowed, by }) => ({ direction, pod, allowed, by })),
        [{ direction: 'ingress', pod: 'x/b', allowed: true, by: { namespace: 'x', policy: 'allow-a', rule: 0 } }],
      );
    } finally {
      stop.abort();
      await running;
    }
    assert.deepEqual(nft, [], 'nft was run on an ovs node');
    assert.deepEqual(sysctls(), ['0', '0'], 'the bridge sysctls were written on an ovs node');
    assert.ok(calls.includes(`list ${PATHS.pods}`));
  });

  it('on an ovs node whose backend never attaches: not ready, nothing written, and run() ends when aborted', async () => {
    const { client, watching } = fakeClient(lists(), []);
    const nft: string[] = [];
    const enforcer = new PolicyEnforcer({
      client,
      nodeName: 'n1',
      logger: silent,
      resyncSeconds: 3600,
      networkConfig: () => Promise.resolve({ enableIPv4: true, enableIPv6: false, backend: { type: 'ovs', options: {} } }),
      run: (args) => {
        nft.push(args.join(' '));
        return Promise.resolve('');
      },
      bridgeSysctlDir: dir,
    });
    const stop = new AbortController();
    const running = enforcer.run(stop.signal);
    await waitFor(() => Object.values(PATHS).every(watching), { what: 'the three watches' });
    stop.abort();
    await running;
    assert.equal(enforcer.ready, false);
    assert.deepEqual(nft, []);
    assert.deepEqual(sysctls(), ['0', '0']);
  });

  it('on a vxlan node: the bridge sysctls on, the lists written to nftables in one transaction', async () => {
    const { client } = fakeClient(lists(), []);
    const scripts: string[] = [];
    const enforcer = new PolicyEnforcer({
      client,
      nodeName: 'n1',
      logger: silent,
      resyncSeconds: 3600,
      networkConfig: () => Promise.resolve({ enableIPv4: true, enableIPv6: false, backend: { type: 'vxlan', options: {} } }),
      run: (args, input) => {
        if (args[0] === '-f') scripts.push(input ?? '');
        return Promise.resolve(args[0] === '-f' ? '' : '{"nftables": []}');
      },
      bridgeSysctlDir: dir,
    });
    const stop = new AbortController();
    const running = enforcer.run(stop.signal);
    try {
      await waitFor(() => enforcer.ready, { what: 'the first write' });
      assert.equal(scripts.length, 1);
      assert.match(scripts[0]!, /^add table inet weft_policy/);
      assert.match(scripts[0]!, /10\.9\.0\.3/);
      assert.deepEqual(sysctls(), ['1', '1']);
      assert.equal(enforcer.flowSection.flows(1), null, 'a vxlan node programs no flow section');
    } finally {
      stop.abort();
      await running;
    }
  });
});
