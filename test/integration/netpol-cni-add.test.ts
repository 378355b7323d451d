// weftd --network-policy with its CNI server: a Kubernetes pod's CNI ADD is answered only once the
// pod's NetworkPolicy is in the table `inet weft_policy`, programmed from the addresses of the ADD's
// own result (the API's pod status has no IP yet at that point; kubelet writes it after the ADD).
// One weftd (vxlan, Kubernetes mode) in a host namespace against the fake API server; the real
// plugin chain (the native client `flannel` → weftd's server → flannel → bridge → host-local),
// exec'd in the host namespace as a runtime does, CNI_ARGS naming the pod.
//  - a pod selected by a default-deny-ingress policy, no IP in its API status: ADD succeeds, and
//    right when it returns (no wait) ingress_v4 maps the result's address to the pod's chain,
//    which ends in a drop;
//  - its DEL: the map entry goes;
//  - a pod the API does not have: ADD fails with code 11 after the 10 s bound, naming the pod;
//    the runtime's DEL then succeeds;
//  - a pod no policy selects: ADD succeeds at once, nothing in the maps;
//  - a repeated DEL of a pod's old sandbox does not take the running sandbox's map entry away.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { podChainName } from '../../src/policy/nft/layout.js';
import { execProgram, type ExecResult } from '../../src/util/exec.js';
import { hostLocalReservations } from '../helpers/cni-client.js';
import { cniBinDir, cniEnv, flannelNetConf } from '../helpers/cni.js';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { addNetns, delNetns, nsExec, nsPrefix } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { waitFor } from '../helpers/wait.js';

const NETWORK = 'weft';
const NS = 'x';
const POD_CIDR = '10.14.1.0/24';
/** The client's bound on a reply: well above the server's 10 s wait for an unknown pod. */
const CLIENT_TIMEOUT_MS = 30_000;

interface NftMapElem {
  readonly key: string;
  readonly chain: string;
}

describe('weftd --network-policy: a CNI ADD is answered once the pod\'s policy is in nftables', function () {
  this.timeout(120_000);
  let c: Cluster;
  let fake: FakeKube;
  let fwd: NetnsForward;
  let h: Host;
  let tmp = '';
  let bin = '';
  // Not the cluster's prefix: its pod namespace is `<prefix>-p1`.
  const prefix = nsPrefix('npc');
  const podNetns = new Map<string, string>();

  const conf = () => flannelNetConf(NETWORK, h.subnetFile, tmp);

  /** The network namespace of a pod sandbox (container), made on first use. */
  async function netnsOf(ctr: string): Promise<string> {
    let ns = podNetns.get(ctr);
    if (!ns) {
      ns = `${prefix}-${ctr}`;
      await delNetns(ns); // left by an earlier process with the same pid
      podNetns.set(ctr, await addNetns(ns));
    }
    return ns;
  }

  /**
   * The native client as a runtime runs it: in the host namespace, only PATH, CNI_* and the socket.
   * `ctr` is the sandbox (CNI_CONTAINERID, and its netns).
   */
  async function flannel(command: 'ADD' | 'DEL', pod: string, ctr = pod): Promise<ExecResult & { ms: number }> {
    const env = cniEnv(
      {
        bin: join(bin, 'flannel'),
        command,
        containerId: `ctr-${ctr}`,
        netns: `/run/netns/${await netnsOf(ctr)}`,
        args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=${NS};K8S_POD_NAME=${pod};K8S_POD_INFRA_CONTAINER_ID=ctr-${ctr}`,
        env: { WEFT_CNI_TIMEOUT_MS: String(CLIENT_TIMEOUT_MS) },
      },
      h.cniSocket,
    );
    const t0 = performance.now();
    const r = await execProgram('ip', ['netns', 'exec', h.ns, join(bin, 'flannel')], { env, input: conf(), timeoutMs: CLIENT_TIMEOUT_MS + 30_000 });
    return { ...r, ms: Math.round(performance.now() - t0) };
  }

  /** The one IPv4 address of an ADD result. */
  const addressOf = (r: ExecResult): string => {
    assert.equal(r.code, 0, `ADD failed: ${r.stdout} ${r.stderr}`);
    const ips = (JSON.parse(r.stdout) as { ips?: { address: string }[] }).ips ?? [];
    assert.equal(ips.length, 1, r.stdout);
    return ips[0]!.address.split('/')[0]!;
  };

  /** The elements of the verdict map `inet weft_policy <name>` on the host: address → jump target. */
  async function mapElems(name: string): Promise<NftMapElem[]> {
    const doc = JSON.parse(await nsExec(h.ns, 'nft', '-j', 'list', 'map', 'inet', 'weft_policy', name)) as { nftables: Record<string, unknown>[] };
    const map = doc.nftables.find((o) => 'map' in o)?.map as { elem?: unknown[] } | undefined;
    assert.ok(map, `no map ${name} in the listing`);
    return (map.elem ?? []).map((e) => {
      const [key, verdict] = e as [unknown, { jump?: { target?: string } }];
      assert.equal(typeof key, 'string', `map element ${JSON.stringify(e)}`);
      return { key: key as string, chain: verdict.jump?.target ?? JSON.stringify(verdict) };
    });
  }

  /** The rules of chain `inet weft_policy <chain>`, as their expression lists. */
  async function chainRules(chain: string): Promise<Record<string, unknown>[][]> {
    const doc = JSON.parse(await nsExec(h.ns, 'nft', '-j', 'list', 'chain', 'inet', 'weft_policy', chain)) as { nftables: Record<string, unknown>[] };
    return doc.nftables.filter((o) => 'rule' in o).map((o) => (o.rule as { expr: Record<string, unknown>[] }).expr);
  }

  const served = (verb: string, result: string) => h.metric(`weft_cni_requests_total{plugin="flannel",verb="${verb}",result="${result}"}`, 0);

  const apiPod = (name: string, app: string): JsonObject => ({
    metadata: { namespace: NS, name, uid: `uid-${name}`, labels: { app } },
    spec: { nodeName: `h${h.i}`, containers: [{ name: 'c' }] },
    status: { phase: 'Pending' }, // no podIP: kubelet writes it only after the ADD
  });

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'wt-netpol-cni-'));
    bin = await cniBinDir();
    fake = await FakeKube.start();
    c = await Cluster.create({ hosts: 1, tag: 'npa', config: {}, weftdArgs: ['--log-level', 'debug'] });
    h = c.hosts[0]!;
    fwd = await NetnsForward.start(c.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
    const netConf = join(c.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: '10.14.0.0/16', Backend: { Type: 'vxlan' } }));
    fake.nodes.create(`h${h.i}`, { spec: { podCIDR: POD_CIDR, podCIDRs: [POD_CIDR] } });
    fake.namespaces.put({ metadata: { name: NS } });
    fake.networkPolicies.put({
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      metadata: { namespace: NS, name: 'b-deny-ingress' },
      spec: { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress'] },
    });
    fake.pods.put(apiPod('p1', 'b'));
    fake.pods.put(apiPod('p2', 'c'));
    await h.startWeftd(
      ['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf, '--network-policy', '--iptables-resync', '1'],
      { NODE_NAME: `h${h.i}` },
    );
    await waitFor(() => /NetworkPolicy programmed/.test(h.weftd!.output), { timeoutMs: 30_000, what: 'the NetworkPolicy table programmed' });
    await waitFor(async () => (await h.cniServerStatus()).phase === 'serving', { timeoutMs: 30_000, what: 'the CNI server to serve' });
  });

  after(async () => {
    // Each step runs whatever the others did.
    try {
      await Promise.allSettled([...podNetns.values()].map((ns) => delNetns(ns)));
      await c?.destroy();
    } finally {
      await fwd?.stop();
      await fake?.stop();
      if (tmp) rmSync(tmp, { recursive: true, force: true });
    }
  });

  let p1IP = '';

  it('ADD of a pod under default deny: when it returns, ingress_v4 maps its address to its chain, which drops', async () => {
    const before = await served('ADD', 'ok');
    const add = await flannel('ADD', 'p1');
    // Checked before anything else: the point is that no wait is needed.
    const elems = await mapElems('ingress_v4');
    p1IP = addressOf(add);
    console.log(`      ADD x/p1 → ${p1IP} in ${add.ms} ms`);
    assert.match(p1IP, /^10\.14\.1\./);
    const chain = podChainName(`${NS}/p1`, 'ingress');
    assert.deepEqual(elems, [{ key: p1IP, chain }], `ingress_v4 right after the ADD returned:\n${await nsExec(h.ns, 'nft', 'list', 'table', 'inet', 'weft_policy')}`);
    assert.match(chain, /^pod_[0-9a-f]+_in$/);
    const rules = await chainRules(chain);
    assert.ok(rules.length > 0, `chain ${chain} has no rules`);
    assert.ok(rules.at(-1)!.some((x) => 'drop' in x), `the last rule of ${chain} is no drop: ${JSON.stringify(rules.at(-1))}`);
    // Not isolated for egress: no egress entry.
    assert.deepEqual(await mapElems('egress_v4'), []);
    // Served by weftd (not the client's fallback to its bundle).
    assert.equal(await served('ADD', 'ok'), before + 1);
  });

  it('DEL of that pod: its map entry goes', async () => {
    assert.ok(p1IP, 'the ADD test ran');
    const before = await served('DEL', 'ok');
    const del = await flannel('DEL', 'p1');
    assert.equal(del.code, 0, `${del.stdout} ${del.stderr}`);
    const right = await mapElems('ingress_v4');
    console.log(`      DEL x/p1 in ${del.ms} ms; ingress_v4 right after it returned: ${right.length === 0 ? 'empty' : JSON.stringify(right)}`);
    await waitFor(async () => (await mapElems('ingress_v4')).length === 0, { timeoutMs: 10_000, what: 'the ingress_v4 entry of x/p1 to go' });
    assert.equal(await served('DEL', 'ok'), before + 1);
    assert.deepEqual(hostLocalReservations(join(tmp, 'ipam'), NETWORK), []);
  });

  it('ADD of a pod the API does not have: code 11 after the 10 s bound, naming the pod; then DEL succeeds', async () => {
    const before = await served('ADD', 'error');
    const add = await flannel('ADD', 'ghost');
    console.log(`      ADD x/ghost answered after ${add.ms} ms: ${add.stdout.trim()}`);
    assert.notEqual(add.code, 0, add.stdout);
    const err = JSON.parse(add.stdout) as { code: number; msg: string };
    assert.equal(err.code, 11, add.stdout);
    assert.match(err.msg, /NetworkPolicy/);
    assert.match(err.msg, /x\/ghost/);
    assert.ok(add.ms >= 9_500 && add.ms < 20_000, `answered after ${add.ms} ms`);
    assert.equal(await served('ADD', 'error'), before + 1);
    const ghostChain = podChainName(`${NS}/ghost`, 'ingress');
    assert.deepEqual((await mapElems('ingress_v4')).filter((e) => e.chain === ghostChain), []);
    // The runtime DELs a failed ADD: it cleans up what the plugins had made.
    const del = await flannel('DEL', 'ghost');
    assert.equal(del.code, 0, `${del.stdout} ${del.stderr}`);
    assert.deepEqual(hostLocalReservations(join(tmp, 'ipam'), NETWORK), []);
  });

  it('ADD of a pod no policy selects: succeeds at once, nothing in the maps', async () => {
    const before = await served('ADD', 'ok');
    const add = await flannel('ADD', 'p2');
    const ip = addressOf(add);
    console.log(`      ADD x/p2 → ${ip} in ${add.ms} ms`);
    assert.ok(add.ms < 5_000, `answered after ${add.ms} ms`);
    for (const m of ['ingress_v4', 'egress_v4']) assert.deepEqual((await mapElems(m)).filter((e) => e.key === ip), [], `${m} has ${ip}`);
    assert.equal(await served('ADD', 'ok'), before + 1);
    const del = await flannel('DEL', 'p2');
    assert.equal(del.code, 0, `${del.stdout} ${del.stderr}`);
  });

  // A DEL only takes away the addresses its own sandbox's ADD gave: a repeated DEL of an old
  // sandbox (the CNI spec allows any number) or one overtaken by the new sandbox's ADD must not
  // leave the running pod isolated but in no verdict map (fail open).
  it('a repeated DEL of a pod\'s old sandbox leaves the running sandbox\'s map entry in place', async () => {
    fake.pods.put(apiPod('p3', 'b'));
    const chain = podChainName(`${NS}/p3`, 'ingress');
    // Sandbox a, torn down; then sandbox b (a restarted pod sandbox: same pod, new container id).
    const ipA = addressOf(await flannel('ADD', 'p3', 'p3a'));
    assert.deepEqual(await mapElems('ingress_v4'), [{ key: ipA, chain }]);
    assert.equal((await flannel('DEL', 'p3', 'p3a')).code, 0);
    const ipB = addressOf(await flannel('ADD', 'p3', 'p3b'));
    assert.deepEqual(await mapElems('ingress_v4'), [{ key: ipB, chain }]);
    // kubelet writes the running sandbox's address to the status.
    fake.pods.put({ ...apiPod('p3', 'b'), status: { phase: 'Running', podIP: ipB, podIPs: [{ ip: ipB }] } });
    // The runtime repeats the old sandbox's DEL (the CNI spec allows any number of them).
    const again = await flannel('DEL', 'p3', 'p3a');
    assert.equal(again.code, 0, `${again.stdout} ${again.stderr}`);
    // A later ADD through the server is answered after the deltas queued before it are applied.
    addressOf(await flannel('ADD', 'p2', 'p2b'));
    const elems = await mapElems('ingress_v4');
    assert.deepEqual(elems, [{ key: ipB, chain }], `ingress_v4 after the old sandbox's DEL:\n${await nsExec(h.ns, 'nft', 'list', 'table', 'inet', 'weft_policy')}`);
  });
});
