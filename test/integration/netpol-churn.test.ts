// weftd --network-policy under churn: one vxlan node in Kubernetes mode against the fake API
// server, 60 pods of this node (in the API only: the table is programmed for a node's pods
// whatever carries their packets) and 12 NetworkPolicies selecting by the label `app`. For 30 s the
// test changes a pod's label every 10 ms (100 changes/s). Exact means: every resync pass (every
// second, reading the table back and comparing it with the engine's whole output) finds nothing
// to repair, no transaction fails, and at the end the verdict maps hold exactly the pods an
// independent reading of the policies selects — within a second of the last change (printed).
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { nsExec } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { prng } from '../helpers/prng.js';
import { waitFor } from '../helpers/wait.js';

const NS = 'churn';
const PODS = 60;
const APPS = ['a', 'b', 'c', 'd', 'e', 'f'];
/** Policies select apps a–c for ingress and d for egress; e and f are selected by none. */
const INGRESS_APPS = ['a', 'b', 'c'];
const EGRESS_APPS = ['d'];

describe('weftd --network-policy: 100 pod label changes per second for 30 s keep the table exact', function () {
  this.timeout(240_000);
  let c: Cluster;
  let fake: FakeKube;
  let fwd: NetnsForward;
  let h: Host;
  const labels = new Map<string, string>();
  const ipOf = (i: number) => `10.15.1.${10 + i}`;

  const pod = (i: number, app: string): JsonObject => ({
    metadata: { namespace: NS, name: `p${i}`, labels: { app } },
    spec: { nodeName: 'h1', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
    status: { phase: 'Running', podIP: ipOf(i), podIPs: [{ ip: ipOf(i) }] },
  });

  /** The addresses in one of the verdict maps. */
  const mapKeys = async (map: string): Promise<string[]> => {
    const doc = JSON.parse(await nsExec(h.ns, 'nft', '-j', 'list', 'map', 'inet', 'weft_policy', map)) as { nftables: Array<{ map?: { elem?: Array<[string, unknown]> } }> };
    const m = doc.nftables.find((x) => x.map)?.map;
    return (m?.elem ?? []).map(([k]) => k).sort();
  };
  const expected = (apps: readonly string[]) => [...labels].filter(([, app]) => apps.includes(app)).map(([name]) => ipOf(Number(name.slice(1)))).sort();

  before(async () => {
    fake = await FakeKube.start();
    c = await Cluster.create({ hosts: 1, tag: 'npch', config: {} });
    h = c.hosts[0]!;
    fwd = await NetnsForward.start(c.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
    const netConf = join(c.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: '10.15.0.0/16', Backend: { Type: 'vxlan' } }));
    fake.nodes.create('h1', { spec: { podCIDR: '10.15.1.0/24', podCIDRs: ['10.15.1.0/24'] } });
    fake.namespaces.put({ metadata: { name: NS } });
    for (let i = 0; i < PODS; i++) {
      const app = APPS[i % APPS.length]!;
      labels.set(`p${i}`, app);
      fake.pods.put(pod(i, app));
    }
    for (const [k, app] of INGRESS_APPS.entries()) {
      // Two policies per app, one allowing from each of two other apps: unions and shared peers.
      for (const j of [1, 2]) {
        fake.networkPolicies.put({
          metadata: { namespace: NS, name: `in-${app}-${j}` },
          spec: { podSelector: { matchLabels: { app } }, policyTypes: ['Ingress'], ingress: [{ from: [{ podSelector: { matchLabels: { app: APPS[(k + j) % APPS.length]! } } }], ports: [{ port: 'http' }] }] },
        });
      }
    }
    for (const app of EGRESS_APPS) {
      fake.networkPolicies.put({
        metadata: { namespace: NS, name: `eg-${app}` },
        spec: { podSelector: { matchLabels: { app } }, policyTypes: ['Egress'], egress: [{ to: [{ podSelector: { matchLabels: { app: 'a' } } }, { ipBlock: { cidr: '10.0.0.0/8', except: ['10.15.1.0/24'] } }] }] },
      });
    }
    for (let k = 0; k < 6; k++) {
      // Policies that select nobody here but name the churned apps as peers.
      fake.networkPolicies.put({ metadata: { namespace: NS, name: `peers-${k}` }, spec: { podSelector: { matchLabels: { app: 'none' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: APPS[k]! } } }] }] } });
    }
    await h.startWeftd(['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf, '--network-policy', '--iptables-resync', '1'], { NODE_NAME: 'h1' });
    await waitFor(async () => (await mapKeys('ingress_v4')).join() === expected(INGRESS_APPS).join(), { timeoutMs: 20_000, what: 'the initial table' });
  });
  after(async () => {
    await c?.destroy();
    await fwd?.stop();
    await fake?.stop();
  });

  it('finds nothing to repair while and after the labels churn, and the maps match the policies', async () => {
    const metric = (name: string) => h.metric(name, 0);
    const repairs0 = await metric('weft_network_policy_repairs_total');
    const failures0 = await metric('weft_network_policy_failures_total');
    const rand = prng(0x5eed);
    let changes = 0;
    const end = performance.now() + 30_000;
    let next = performance.now();
    while (performance.now() < end) {
      const i = Math.floor(rand() * PODS);
      const app = APPS[Math.floor(rand() * APPS.length)]!;
      labels.set(`p${i}`, app);
      fake.pods.put(pod(i, app));
      changes++;
      next += 10;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
    const tLast = performance.now();
    await waitFor(
      async () => (await mapKeys('ingress_v4')).join() === expected(INGRESS_APPS).join() && (await mapKeys('egress_v4')).join() === expected(EGRESS_APPS).join(),
      { timeoutMs: 10_000, what: 'the maps to hold exactly the selected pods' },
    );
    const settled = performance.now() - tLast;
    // Two more resync passes over the final state: the read-back still finds nothing to repair.
    const checks = await metric('weft_network_policy_checks_total');
    // Passes are spaced by at least ten times the last read-back (enforcer.ts), which under the
    // suite's load can take over half a second: the deadline follows that spacing, not the 1 s flag.
    await waitFor(async () => (await metric('weft_network_policy_checks_total')) >= checks + 2, { timeoutMs: 30_000, what: 'two resync passes' });
    const repairs = (await metric('weft_network_policy_repairs_total')) - repairs0;
    const failures = (await metric('weft_network_policy_failures_total')) - failures0;
    console.log(`      churn: ${changes} label changes in 30 s (${(changes / 30).toFixed(0)}/s); maps exact ${settled.toFixed(0)} ms after the last change; repairs ${repairs}, failed transactions ${failures}`);
    assert.equal(failures, 0, 'no transaction failed');
    assert.equal(repairs, 0, `no resync pass found drift:\n${h.weftd!.output.split('\n').filter((l) => /differed/.test(l)).slice(0, 3).join('\n')}`);
  });
});
