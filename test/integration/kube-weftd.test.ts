// Kubernetes mode end to end: three weftd (vxlan) in host namespaces take their subnets from
// their Nodes' podCIDRs on the fake API server, publish flannel's annotations, see each other as
// peers, and their pods ping across. A Node written the way flanneld writes it is a peer too.
import assert from 'node:assert/strict';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { ipn, lines } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { waitFor } from '../helpers/wait.js';
import { WeftdProcess } from '../helpers/weftd.js';

const A = 'flannel.alpha.coreos.com/';
const podCIDR = (i: number) => `10.12.${i}.0/24`;
/** The annotations flanneld writes on its Node (vxlan). */
const flannelAnnotations = (publicIP: string, mac: string): Record<string, string> => ({
  [`${A}kube-subnet-manager`]: 'true',
  [`${A}backend-type`]: 'vxlan',
  [`${A}backend-data`]: `{"VNI":1,"VtepMAC":"${mac}"}`,
  [`${A}public-ip`]: publicIP,
});

describe('weftd --kube-subnet-mgr: three nodes in namespaces against the fake API server', function () {
  this.timeout(240_000);
  let c: Cluster;
  let fake: FakeKube;
  let fwd: NetnsForward;

  before(async () => {
    fake = await FakeKube.start();
    c = await Cluster.create({ hosts: 3, tag: 'kw', config: {} });
    fwd = await NetnsForward.start(c.underlay, { host: ETCD_IP, port: 6443 }, { host: '127.0.0.1', port: fake.port });
    const netConf = join(c.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: '10.12.0.0/14', Backend: { Type: 'vxlan' } }));
    for (const h of c.hosts) fake.nodes.create(`h${h.i}`, { spec: { podCIDR: podCIDR(h.i), podCIDRs: [podCIDR(h.i)] } });
    for (const h of c.hosts) {
      await h.startWeftd(['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', netConf], { NODE_NAME: `h${h.i}` });
    }
    for (const h of c.hosts) await h.attachPod();
  });
  after(async () => {
    await c?.destroy();
    await fwd?.stop();
    await fake?.stop();
  });

  const annotations = (name: string) => ((fake.nodes.get(name)!.metadata as JsonObject).annotations ?? {}) as Record<string, string>;

  it('takes the podCIDR as the subnet and publishes flannel\'s annotations and condition', async () => {
    for (const h of c.hosts) {
      assert.equal(h.subnetEnv().FLANNEL_SUBNET, `10.12.${h.i}.1/24`);
      const mac = /link\/ether (\S+)/.exec(await ipn(h.ns, 'link', 'show', 'flannel.1'))![1];
      const a = annotations(`h${h.i}`);
      assert.equal(a[`${A}kube-subnet-manager`], 'true');
      assert.equal(a[`${A}backend-type`], 'vxlan');
      assert.equal(a[`${A}backend-data`], `{"VNI":1,"VtepMAC":"${mac}"}`);
      assert.equal(a[`${A}public-ip`], h.underlayIP);
      const conds = ((fake.nodes.get(`h${h.i}`)!.status as JsonObject).conditions ?? []) as JsonObject[];
      const nu = conds.find((x) => x.type === 'NetworkUnavailable')!;
      assert.deepEqual([nu.status, nu.reason, nu.message], ['False', 'FlannelIsUp', 'Flannel is running on this node']);
    }
    const patches = fake.requests.filter((r) => r.method === 'PATCH');
    assert.ok(patches.length >= 3 && patches.every((r) => r.path.endsWith('/status') && r.headers['content-type'] === 'application/strategic-merge-patch+json'));
  });

  it('programs the other nodes as peers and pods reach each other', async () => {
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'pod to pod across the three nodes' });
  });

  it('accepts a Node written by flanneld as a peer and skips one with a garbage public-ip, warning once', async () => {
    fake.nodes.create('flanneld-node', {
      annotations: flannelAnnotations('10.250.0.77', '12:c6:65:89:b4:e3'),
      spec: { podCIDR: '10.12.77.0/24', podCIDRs: ['10.12.77.0/24'] },
    });
    fake.nodes.create('bad-node', {
      annotations: flannelAnnotations('not-an-ip', '12:c6:65:89:b4:e4'),
      spec: { podCIDR: '10.12.78.0/24', podCIDRs: ['10.12.78.0/24'] },
    });
    const h: Host = c.hosts[0]!;
    await waitFor(async () => lines(await ipn(h.ns, 'route')).some((l) => l.startsWith('10.12.77.0/24') && l.includes('flannel.1')), { timeoutMs: 15_000, what: 'the flanneld node\'s route' });
    assert.match(await ipn(h.ns, 'neigh', 'show', 'dev', 'flannel.1'), /10\.12\.77\.0 lladdr 12:c6:65:89:b4:e3 PERMANENT/);
    await waitFor(() => h.weftd!.output.includes('bad-node'), { timeoutMs: 10_000, what: 'the warning about bad-node' });
    assert.ok(!lines(await ipn(h.ns, 'route')).some((l) => l.startsWith('10.12.78.0/24')));
    // A later change of the bad node must not warn again; a node created after it is the barrier
    // that proves the change was processed (events are applied in order).
    fake.nodes.update('bad-node', (n) => {
      const meta = n.metadata as JsonObject;
      meta.labels = { ...((meta.labels as JsonObject | undefined) ?? {}), touched: 'yes' };
    });
    fake.nodes.create('barrier', {
      annotations: flannelAnnotations('10.250.0.79', '12:c6:65:89:b4:e5'),
      spec: { podCIDR: '10.12.79.0/24', podCIDRs: ['10.12.79.0/24'] },
    });
    await waitFor(async () => lines(await ipn(h.ns, 'route')).some((l) => l.startsWith('10.12.79.0/24')), { timeoutMs: 15_000, what: 'the barrier node\'s route' });
    assert.equal(h.weftd!.output.split('\n').filter((l) => l.includes('bad-node')).length, 1, 'one warning');
    fake.nodes.delete('flanneld-node');
    await waitFor(async () => !lines(await ipn(h.ns, 'route')).some((l) => l.startsWith('10.12.77.0/24')), { timeoutMs: 15_000, what: 'the deleted node\'s route gone' });
  });

  it('rejects Nodes whose podCIDR is outside the network or whose public-ip is ours, and ignores a newer Node with another\'s podCIDR', async () => {
    const [h1, h2] = c.hosts as [Host, Host];
    const h2Neigh = lines(await ipn(h1.ns, 'neigh', 'show', 'dev', 'flannel.1')).find((l) => l.startsWith('10.12.2.0 '));
    fake.nodes.create('outside', { annotations: flannelAnnotations('10.250.0.80', '12:c6:65:89:b4:f0'), spec: { podCIDR: '8.8.8.0/24', podCIDRs: ['8.8.8.0/24'] } });
    // A newer Node claiming h2's podCIDR: h2's older claim keeps it.
    fake.nodes.create('twin', { annotations: flannelAnnotations('10.250.0.81', '12:c6:65:89:b4:f1'), spec: { podCIDR: podCIDR(2), podCIDRs: [podCIDR(2)] } });
    fake.nodes.create('self-ip', { annotations: flannelAnnotations(h1.underlayIP, '12:c6:65:89:b4:f2'), spec: { podCIDR: '10.12.82.0/24', podCIDRs: ['10.12.82.0/24'] } });
    await waitFor(async () => (await h1.metric('weft_peers_rejected')) === 2, { timeoutMs: 15_000, what: 'two rejections on h1' });
    for (const [reason, n] of [['outside-network', 1], ['public-ip', 1]] as const) {
      assert.equal(await h1.metric(`weft_leases_rejected_total{reason="${reason}"}`), n, reason);
    }
    // The twin never becomes a lease: the Node watch keeps the older Node's claim, and says so once.
    await waitFor(() => /node ignored: another Node claims the same podCIDR.*node=twin/.test(h1.weftd!.output), { timeoutMs: 10_000, what: 'the warning about twin' });
    const routes = lines(await ipn(h1.ns, 'route'));
    assert.ok(!routes.some((l) => l.startsWith('8.8.8.0/24') || l.startsWith('10.12.82.0/24')), routes.join(' | '));
    assert.equal(lines(await ipn(h1.ns, 'neigh', 'show', 'dev', 'flannel.1')).find((l) => l.startsWith('10.12.2.0 ')), h2Neigh, "h2's entry kept its MAC");
    assert.equal(await h2.metric('weft_peers_rejected'), 1, 'h2 rejects the outsider; the twin is not a lease');
    for (const name of ['outside', 'twin', 'self-ip']) fake.nodes.delete(name);
    await waitFor(async () => (await h1.metric('weft_peers_rejected')) === 0, { timeoutMs: 15_000, what: 'no rejections left' });
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 15_000, what: 'pods still reaching each other' });
  });

  it('keeps the VTEP MAC from its backend-data annotation when the device is gone at restart', async () => {
    const h = c.hosts[1]!;
    const before = annotations(`h${h.i}`)[`${A}backend-data`];
    await h.weftd!.stop();
    await ipn(h.ns, 'link', 'del', 'flannel.1');
    await h.startWeftd(['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', join(c.dir, 'net-conf.json')], { NODE_NAME: `h${h.i}` });
    const mac = /link\/ether (\S+)/.exec(await ipn(h.ns, 'link', 'show', 'flannel.1'))![1];
    assert.equal(before, `{"VNI":1,"VtepMAC":"${mac}"}`);
    assert.equal(annotations(`h${h.i}`)[`${A}backend-data`], before);
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'pods after the restart' });
  });

  it('takes its public IP from the node-public-ip annotation when --public-ip is not given', async () => {
    const h = c.hosts[2]!;
    await ipn(h.ns, 'addr', 'add', '10.250.0.103/24', 'dev', 'eth0');
    fake.nodes.update(`h${h.i}`, (n) => {
      const meta = n.metadata as JsonObject;
      meta.annotations = { ...((meta.annotations as JsonObject | undefined) ?? {}), [`${A}node-public-ip`]: '10.250.0.103' };
    });
    await h.weftd!.stop();
    await h.startWeftd(['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', join(c.dir, 'net-conf.json')], { NODE_NAME: `h${h.i}` });
    await waitFor(() => annotations(`h${h.i}`)[`${A}public-ip`] === '10.250.0.103', { timeoutMs: 10_000, what: 'the published public-ip' });
    await waitFor(async () => (await ipn(c.hosts[0]!.ns, 'neigh', 'show', 'dev', 'flannel.1')).length > 0 && (await c.allPodsReachable()), { timeoutMs: 30_000, what: 'pods through the new public IP' });
    assert.match(await ipn(h.ns, '-d', 'link', 'show', 'flannel.1'), /local 10\.250\.0\.103/);
  });

  it('leaves the dataplane alone while the API server is down and catches up after', async () => {
    const h = c.hosts[0]!;
    const routesBefore = lines(await ipn(h.ns, 'route')).filter((l) => l.includes('proto 88')).sort();
    await fake.pause();
    fake.nodes.create('while-down', {
      annotations: flannelAnnotations('10.250.0.80', '12:c6:65:89:b4:e6'),
      spec: { podCIDR: '10.12.80.0/24', podCIDRs: ['10.12.80.0/24'] },
    });
    // Two backend reconcile passes with the API down change nothing.
    const passes = async () => Number(/^weft_backend_reconcile_duration_seconds_count (\d+)$/m.exec(await h.metrics())?.[1] ?? 0);
    const start = await passes();
    await waitFor(async () => (await passes()) >= start + 2, { timeoutMs: 15_000, what: 'two reconcile passes' });
    assert.deepEqual(lines(await ipn(h.ns, 'route')).filter((l) => l.includes('proto 88')).sort(), routesBefore);
    await fake.resume();
    await waitFor(async () => lines(await ipn(h.ns, 'route')).some((l) => l.startsWith('10.12.80.0/24')), { timeoutMs: 30_000, what: 'the node created while the API was down' });
    assert.ok(await c.allPodsReachable());
  });

  it('programs 10 000 nodes created in one burst', async () => {
    const h = c.hosts[0]!;
    const programmed = async () => Number(/^weft_peers_programmed (\d+)/m.exec(await h.metrics())?.[1] ?? NaN);
    const before = await programmed();
    for (let i = 0; i < 10_000; i++) {
      const hex = i.toString(16).padStart(4, '0');
      fake.nodes.create(`burst-${i}`, {
        annotations: flannelAnnotations(`10.251.${i >> 8}.${i & 255}`, `0e:bb:00:00:${hex.slice(0, 2)}:${hex.slice(2)}`),
        // /29s of 10.14.0.0/15, inside the Network (10.12.0.0/14).
        spec: { podCIDR: `10.${14 + (i >> 13)}.${(i >> 5) & 255}.${(i & 31) << 3}/29` },
      });
    }
    await waitFor(async () => (await programmed()) === before + 10_000, { timeoutMs: 120_000, intervalMs: 500, what: '10 000 more peers programmed' });
  });

  it('exits 1 with flannel\'s error when its Node has no podCIDR', async () => {
    fake.nodes.create('nocidr', {});
    // Last test: the host's own daemon is stopped so the two never share the namespace's devices.
    const h = c.hosts[2]!;
    await h.weftd!.stop();
    const p = WeftdProcess.start(
      ['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:6443`, '--net-config-path', join(c.dir, 'net-conf.json'), '--iface', 'eth0', '--subnet-file', join(c.dir, 'nocidr.env')],
      { NODE_NAME: 'nocidr' },
      h.ns,
    );
    const { code } = await p.exited;
    assert.equal(code, 1, p.output);
    assert.match(p.output, /node "nocidr" pod cidr not assigned/);
    assert.ok(!existsSync(join(c.dir, 'nocidr.env')), 'no subnet file written');
  });
});

