// --ip-blackhole-route: a blackhole route for the node's own subnet, put back when deleted, moved
// with the lease, and never in the way of the pods behind cni0.
import assert from 'node:assert/strict';
import { Cluster, type Host } from '../helpers/cluster.js';
import { ipn, lines } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

const blackholes = async (h: Host): Promise<string[]> => lines(await ipn(h.ns, 'route', 'show', 'type', 'blackhole'));
const subnetOf = (h: Host): string => h.subnetEnv().FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');

describe('--ip-blackhole-route', function () {
  this.timeout(120_000);
  let c: Cluster;

  before(async () => {
    c = await Cluster.create({
      hosts: 2,
      tag: 'bh',
      config: { Network: '10.9.0.0/16', Backend: { Type: 'vxlan' } },
      weftdArgs: ['--ip-blackhole-route', '--iptables-resync', '1'],
    });
    await c.startAll();
  });
  after(async () => {
    await c?.destroy();
  });

  it('adds one blackhole route for the own subnet at the highest metric, and pods still answer', async () => {
    const h = c.hosts[0]!;
    await waitFor(async () => (await blackholes(h)).length === 1, { what: 'the blackhole route' });
    assert.deepEqual(await blackholes(h), [`blackhole ${subnetOf(h)} metric 4294967295`]);
    assert.ok(await c.allPodsReachable());
  });

  it('puts it back within a resync after it is deleted', async () => {
    const h = c.hosts[0]!;
    await ipn(h.ns, 'route', 'del', 'blackhole', subnetOf(h), 'metric', '4294967295');
    await waitFor(async () => (await blackholes(h)).length === 1, { timeoutMs: 5_000, what: 'the route back' });
    assert.deepEqual(await blackholes(h), [`blackhole ${subnetOf(h)} metric 4294967295`]);
  });

  it('moves with the lease: the old subnet\'s route is removed', async () => {
    const h = c.hosts[1]!;
    const old = subnetOf(h);
    const key = `/coreos.com/network/subnets/${old.replace('/', '-')}`;
    const other = JSON.stringify({ PublicIP: '10.250.0.99', PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: '0e:aa:00:00:00:99' } });
    await c.etcdctl('del', key);
    await c.etcdctl('put', key, other);
    await waitFor(() => subnetOf(h) !== old, { timeoutMs: 30_000, what: 'a new subnet' });
    await waitFor(async () => (await blackholes(h)).join('\n') === `blackhole ${subnetOf(h)} metric 4294967295`, { timeoutMs: 10_000, what: 'only the new subnet blackholed' });
    await c.etcdctl('del', key);
  });
});
