// vxlan options and restarts on two hosts: DirectRouting on a shared L2 segment, TX checksum
// offload turned off, and the VTEP MAC kept when the device is gone after a restart.
import assert from 'node:assert/strict';
import { Cluster } from '../helpers/cluster.js';
import { ipn, lines, nsExec } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

describe('vxlan backend: DirectRouting, checksum offload, MAC across restarts', function () {
  this.timeout(240_000);
  let c: Cluster;

  before(async () => {
    c = await Cluster.create({
      hosts: 2,
      tag: 'vd',
      config: { Network: '10.8.0.0/16', Backend: { Type: 'vxlan', DirectRouting: true, DisableTxChecksumOffload: true } },
    });
    await c.startAll();
  });
  after(async () => {
    await c?.destroy();
  });

  it('routes a peer on the same segment directly via its public IP, without tunnel entries', async () => {
    const [a, b] = c.hosts as [NonNullable<(typeof c.hosts)[0]>, NonNullable<(typeof c.hosts)[0]>];
    const peerSubnet = b.subnetEnv().FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
    await waitFor(
      async () => lines(await ipn(a.ns, 'route')).includes(`${peerSubnet} via ${b.underlayIP} dev eth0 proto 88`),
      { timeoutMs: 30_000, what: 'the direct route' },
    );
    assert.deepEqual(lines(await ipn(a.ns, 'neigh', 'show', 'dev', 'flannel.1')), []);
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'pods over the direct route' });
  });

  it('turns TX checksum offload off on the device', async () => {
    const out = await nsExec(c.hosts[0]!.ns, 'ethtool', '-k', 'flannel.1');
    assert.match(out, /^\s*tx-checksum-ip-generic: off$/m);
  });

  it('keeps the VTEP MAC published in the lease when the device is gone at restart', async () => {
    const h = c.hosts[1]!;
    const mac = async () => (JSON.parse(await ipn(h.ns, '-j', 'link', 'show', 'flannel.1')) as Array<{ address: string }>)[0]!.address;
    const before = await mac();
    await h.weftd!.stop();
    await ipn(h.ns, 'link', 'del', 'flannel.1');
    await h.startWeftd();
    assert.equal(await mac(), before);
    const stored = await c.etcdctl('get', '--prefix', '--print-value-only', '/coreos.com/network/subnets/');
    assert.ok(stored.includes(`"VtepMAC":"${before}"`));
    assert.match(h.weftd!.output, /how=reuse/);
  });
});
