// weftd --network-policy end to end: two weftd (vxlan, Kubernetes mode) in host namespaces against
// the fake API server, one pod per node (attached to cni0 by the cluster helper), the pods and
// their namespace published in the API, NetworkPolicies written there; the proof is traffic
// between the pods (ping: a rule without ports allows every protocol, default deny drops it).
//  - no policy: the pods reach each other;
//  - default deny ingress on b: a → b dropped (and counted per pod), b → a still answered (replies
//    pass: conntrack);
//  - the policy changed to allow from app=a: a → b answers again (counted per policy); deleted: likewise;
//  - `weft trace` on b's node names the default deny, then the allowing policy;
//  - the weft_policy table flushed by hand, or one map element deleted: the timer's compare finds
//    it and rewrites the table.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { nsExec } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { waitFor } from '../helpers/wait.js';
import { runWeft } from '../helpers/weft-cli.js';
import type { TraceReport } from '../../src/cli/trace/types.js';

const podCIDR = (i: number) => `10.13.${i}.0/24`;
const NS = 'x';

describe('weftd --network-policy: two nodes, pods in the fake API server, nftables enforcement', function () {
  this.timeout(240_000);
  let c: Cluster;
  let fake: FakeKube;
  let fwd: NetnsForward;
  let a: Host;
  let b: Host;

  const pod = (name: string, h: Host, app: string): JsonObject => ({
    metadata: { namespace: NS, name, labels: { app } },
    spec: { nodeName: `h${h.i}`, containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
    status: { phase: 'Running', podIP: h.podIP, podIPs: [{ ip: h.podIP }] },
  });

  const policy = (from: JsonObject[] | null): JsonObject => ({
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { namespace: NS, name: 'b-ingress' },
    spec: { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress'], ...(from ? { ingress: [{ from }] } : {}) },
  });

  /** One ping from `from`'s pod to `to`'s pod (1 s deadline). */
  const reaches = (from: Host, to: Host): Promise<boolean> => from.ping(to.podIP!);
  const eventually = (what: string, check: () => Promise<boolean>) => waitFor(check, { timeoutMs: 20_000, what });
  /** `weft trace` of a ping from a's pod to b's pod, on b's node: its policy hops, as status + summary. */
  const tracePolicy = async (): Promise<string[]> => {
    const run = await runWeft(b.ns, 'trace', a.podIP!, b.podIP!, '-o', 'json', '--subnet-file', b.subnetFile, '--etcd-timeout', '1');
    const report = JSON.parse(run.stdout) as TraceReport;
    return report.hops.filter((h) => h.kind === 'policy').map((h) => `${h.status}: ${h.summary}`);
  };

  before(async () => {
    fake = await FakeKube.start();
    c = await Cluster.create({ hosts: 2, tag: 'np', config: {} });
    [a, b] = [c.hosts[0]!, c.hosts[1]!];
    fwd = await NetnsForward.start(c.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
    const netConf = join(c.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: '10.13.0.0/16', Backend: { Type: 'vxlan' } }));
    for (const h of c.hosts) fake.nodes.create(`h${h.i}`, { spec: { podCIDR: podCIDR(h.i), podCIDRs: [podCIDR(h.i)] } });
    fake.namespaces.put({ metadata: { name: NS } });
    for (const h of c.hosts) {
      await h.startWeftd(
        ['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf, '--network-policy', '--iptables-resync', '1'],
        { NODE_NAME: `h${h.i}` },
      );
    }
    for (const h of c.hosts) await h.attachPod();
    fake.pods.put(pod('a', a, 'a'));
    fake.pods.put(pod('b', b, 'b'));
  });
  after(async () => {
    await c?.destroy();
    await fwd?.stop();
    await fake?.stop();
  });

  it('programs its table and lets pods reach each other while no policy selects them', async () => {
    for (const h of c.hosts) {
      const table = await nsExec(h.ns, 'nft', 'list', 'table', 'inet', 'weft_policy');
      assert.match(table, /hook forward/);
      assert.equal((await nsExec(h.ns, 'cat', '/proc/sys/net/bridge/bridge-nf-call-iptables')).trim(), '1');
    }
    await eventually('a → b', () => reaches(a, b));
    assert.ok(await reaches(b, a), 'b → a');
  });

  it('default deny ingress on b drops a → b; b → a and its replies pass', async () => {
    fake.networkPolicies.put(policy(null));
    await eventually('a → b dropped', async () => !(await reaches(a, b)));
    assert.ok(await reaches(b, a), 'b → a (b\'s egress is not restricted; the reply is established)');
    // The drops are counted at b's default deny, read from the rule counters on the next resync.
    await eventually('the drops in weft_network_policy_denied_packets', async () => (await b.metric('weft_network_policy_denied_packets{namespace="x",pod="b",direction="ingress"}', 0)) > 0);
    assert.deepEqual(await tracePolicy(), ['broken: ingress at pod x/b: dropped by the default deny (NetworkPolicies select it for ingress and none of their rules allows this packet)']);
  });

  it('the policy allowing from app=a lets a → b through again; deleting it too', async () => {
    fake.networkPolicies.put(policy([{ podSelector: { matchLabels: { app: 'a' } } }]));
    await eventually('a → b allowed by the rule', () => reaches(a, b));
    await eventually('a → b in weft_network_policy_allowed_packets', async () => (await b.metric('weft_network_policy_allowed_packets{namespace="x",policy="b-ingress",direction="ingress"}', 0)) > 0);
    assert.deepEqual(await tracePolicy(), ['ok: ingress at pod x/b: allowed by NetworkPolicy x/b-ingress (ingress[0])']);
    fake.networkPolicies.put(policy(null));
    await eventually('a → b dropped again', async () => !(await reaches(a, b)));
    fake.networkPolicies.delete(`${NS}/b-ingress`);
    await eventually('a → b with the policy gone', () => reaches(a, b));
  });

  it('a flushed table, or one element deleted from it, is found by the timer\'s compare and rewritten', async () => {
    fake.networkPolicies.put(policy(null));
    await eventually('a → b dropped', async () => !(await reaches(a, b)));
    await nsExec(b.ns, 'nft', 'flush', 'table', 'inet', 'weft_policy');
    await eventually('the table rewritten: a → b dropped again', async () => !(await reaches(a, b)) && /hook forward/.test(await nsExec(b.ns, 'nft', 'list', 'table', 'inet', 'weft_policy')));
    assert.match(b.weftd!.output, /NetworkPolicy table differed from the desired state; rewritten/);
    // One element deleted by hand (b's entry in the ingress map: b would be unrestricted) is found too.
    await nsExec(b.ns, 'nft', 'delete', 'element', 'inet', 'weft_policy', 'ingress_v4', `{ ${b.podIP} }`);
    await eventually('the element put back', async () => (await nsExec(b.ns, 'nft', 'list', 'map', 'inet', 'weft_policy', 'ingress_v4')).includes(b.podIP!));
    assert.ok(!(await reaches(a, b)), 'a → b dropped again');
  });
});
