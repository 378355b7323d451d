// Three hosts on one L2 underlay running weftd with the host-gw backend: a route per peer via
// the peer's underlay address, pods reaching each other, drift repair, and the NAT refusal.
import assert from 'node:assert/strict';
import { Cluster, type Host } from '../helpers/cluster.js';
import { ipn, lines } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

async function weftRoutes(h: Host): Promise<string[]> {
  // Routes go through nexthop objects where the kernel has them; compare the forwarding part.
  return lines(await ipn(h.ns, 'route')).filter((l) => l.includes(' proto 88')).map((l) => l.replace(/nhid \d+ /, '')).sort();
}

function expected(c: Cluster, h: Host): string[] {
  return c.hosts
    .filter((p) => p !== h)
    .map((p) => `${p.subnetEnv().FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24')} via ${p.underlayIP} dev eth0 proto 88`)
    .sort();
}

async function converged(c: Cluster): Promise<boolean> {
  for (const h of c.hosts) if (JSON.stringify(await weftRoutes(h)) !== JSON.stringify(expected(c, h))) return false;
  return true;
}

describe('host-gw backend: three hosts in namespaces', function () {
  this.timeout(240_000);
  let c: Cluster;

  before(async () => {
    c = await Cluster.create({ hosts: 3, tag: 'hg', config: { Network: '10.6.0.0/16', SubnetMax: '10.6.99.0', Backend: { Type: 'host-gw' } } });
    await c.startAll();
  });
  after(async () => {
    await c?.destroy();
  });

  it('programs one route per peer via its public IP, and pods reach each other', async () => {
    await waitFor(() => converged(c), { timeoutMs: 30_000, what: 'routes on every host' });
    for (const h of c.hosts) assert.equal(h.subnetEnv().FLANNEL_MTU, '1500');
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'every pod to ping every other pod' });
  });

  it('re-adds a deleted route, fixes a changed one and removes a stale one', async () => {
    const h = c.hosts[0]!;
    const [first, second] = expected(c, h);
    await ipn(h.ns, 'route', 'del', first!.split(' ')[0]!);
    await ipn(h.ns, 'route', 'replace', second!.split(' ')[0]!, 'via', '10.250.0.99', 'dev', 'eth0', 'proto', '88');
    // A stale route to a subnet no host can hold (SubnetMax keeps leases below it).
    await ipn(h.ns, 'route', 'add', '10.6.250.0/24', 'via', '10.250.0.77', 'dev', 'eth0', 'proto', '88');
    await waitFor(() => converged(c), { timeoutMs: 10_000, what: 'routes repaired' });
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 10_000, what: 'pings after the repair' });
  });

  it('refuses to start behind NAT (public IP not on the interface)', async () => {
    const h = c.hosts[2]!;
    await h.weftd!.stop();
    await h.startWeftd(['--public-ip', '192.0.2.50']).then(
      () => assert.fail('weftd should not start'),
      () => undefined,
    );
    const code = (await h.weftd!.exited).code;
    assert.equal(code, 1);
    assert.match(h.weftd!.output, /host-gw: the public IPv4 address 192\.0\.2\.50 is not the interface address 10\.250\.0\.3/);
    await h.startWeftd();
    await waitFor(() => converged(c), { timeoutMs: 15_000, what: 'back to normal' });
  });
});
