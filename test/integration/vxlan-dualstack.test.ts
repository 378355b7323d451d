// vxlan dual-stack: IPv4 and IPv6 devices per host, pods reaching each other over both families.
import assert from 'node:assert/strict';
import { Cluster } from '../helpers/cluster.js';
import { ipn, lines, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

describe('vxlan backend: dual-stack hosts in namespaces', function () {
  this.timeout(240_000);
  let c: Cluster;

  before(async () => {
    c = await Cluster.create({
      hosts: 3,
      tag: 'v6',
      ipv6: true,
      config: { Network: '10.7.0.0/16', EnableIPv6: true, IPv6Network: 'fd07::/48', Backend: { Type: 'vxlan' } },
    });
    await c.startAll();
  });
  after(async () => {
    await c?.destroy();
  });

  it('programs both families and every pod reaches every other over IPv4 and IPv6', async () => {
    for (const h of c.hosts) {
      const env = h.subnetEnv();
      assert.equal(env.FLANNEL_IPV6_NETWORK, 'fd07::/48');
      assert.match(env.FLANNEL_IPV6_SUBNET ?? '', /^fd07:0:0:[0-9a-f]+::1\/64$/);
      assert.equal(env.FLANNEL_MTU, '1430', 'the IPv6 underlay costs 70 bytes');
    }
    await waitFor(
      async () => {
        for (const h of c.hosts) {
          const v6routes = lines(await ipn(h.ns, '-6', 'route')).filter((l) => l.includes(' proto 88'));
          const v6fdb = (await sh('bridge', ['-n', h.ns, 'fdb', 'show', 'dev', 'flannel-v6.1'])).split('\n').filter((l) => l.includes(' dst '));
          const v6neigh = (await ipn(h.ns, '-6', 'neigh', 'show', 'dev', 'flannel-v6.1')).split('\n').filter((l) => l.includes('PERMANENT'));
          if (v6routes.length !== 2 || v6fdb.length !== 2 || v6neigh.length !== 2) return false;
          if (!v6routes.every((r) => / dev flannel-v6\.1 proto 88 .*onlink/.test(r))) return false;
          if (!v6fdb.every((f) => / dst fd50::[123] self permanent/.test(f))) return false;
        }
        return true;
      },
      { timeoutMs: 30_000, what: 'IPv6 entries on every host' },
    );
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'pods over both families' });
    assert.ok(c.hosts.every((h) => h.podIPv6 !== null));
  });
});
