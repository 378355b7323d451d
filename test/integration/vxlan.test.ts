// Three hosts in network namespaces running weftd with the vxlan backend against one etcd:
// pod-to-pod reachability, exact kernel entries, drift repair, restarts, churn and bad peers.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { Cluster, type Host } from '../helpers/cluster.js';
import { ipn, lines, nsExec, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

interface StoredLease {
  subnet: string; // 10.5.3.0/24
  publicIP: string;
  mac: string | null;
}

/** Leases as etcd has them, read with etcdctl inside the underlay namespace. */
async function leases(c: Cluster): Promise<Map<string, StoredLease>> {
  const out = await c.etcdctl('get', '--prefix', '/coreos.com/network/subnets/');
  const lines = out.split('\n').filter((l) => l !== '');
  const m = new Map<string, StoredLease>();
  for (let i = 0; i + 1 < lines.length; i += 2) {
    const key = lines[i]!.slice(lines[i]!.lastIndexOf('/') + 1);
    const v = JSON.parse(lines[i + 1]!) as { PublicIP: string; BackendData?: { VtepMAC?: string } };
    const subnet = key.replace(/-(\d+)$/, '/$1');
    m.set(v.PublicIP, { subnet, publicIP: v.PublicIP, mac: v.BackendData?.VtepMAC ?? null });
  }
  return m;
}

/** The kernel entries weft owns on a host, as sorted text lines. */
async function entries(h: Host): Promise<{ neigh: string[]; fdb: string[]; routes: string[] }> {
  const neigh = lines(await ipn(h.ns, 'neigh', 'show', 'dev', 'flannel.1')).sort();
  const fdb = lines(await sh('bridge', ['-n', h.ns, 'fdb', 'show', 'dev', 'flannel.1']))
    .filter((l) => l.includes(' dst '))
    .sort();
  // Routes go through nexthop objects where the kernel has them; compare the forwarding part.
  const routes = lines(await ipn(h.ns, 'route'))
    .filter((l) => l.includes(' proto 88') && l.startsWith('10.5.'))
    .map((l) => l.replace(/nhid \d+ /, ''))
    .sort();
  return { neigh, fdb, routes };
}

function expectedEntries(h: Host, all: Map<string, StoredLease>) {
  const peers = [...all.values()].filter((l) => l.publicIP !== h.underlayIP);
  return {
    neigh: peers.map((p) => `${p.subnet.split('/')[0]} lladdr ${p.mac} PERMANENT`).sort(),
    fdb: peers.map((p) => `${p.mac} dst ${p.publicIP} self permanent`).sort(),
    routes: peers.map((p) => `${p.subnet} via ${p.subnet.split('/')[0]} dev flannel.1 proto 88 onlink`).sort(),
  };
}

async function converged(c: Cluster): Promise<boolean> {
  const all = await leases(c);
  for (const h of c.hosts) {
    const got = await entries(h);
    const want = expectedEntries(h, all);
    if (JSON.stringify(got) !== JSON.stringify(want)) return false;
  }
  return true;
}

describe('vxlan backend: three hosts in namespaces', function () {
  this.timeout(240_000);
  let c: Cluster;

  before(async () => {
    c = await Cluster.create({
      hosts: 3,
      tag: 'vx',
      // Real nodes stay below 10.5.100.0, so the fake peers written later never collide with them.
      config: { Network: '10.5.0.0/16', SubnetMax: '10.5.99.0', Backend: { Type: 'vxlan' } },
    });
    await c.startAll();
  });
  after(async () => {
    await c?.destroy();
  });

  it('programs exactly one neighbour, FDB entry and route per peer, and pods reach each other', async () => {
    await waitFor(() => converged(c), { timeoutMs: 30_000, what: 'kernel entries on every host' });
    const all = await leases(c);
    assert.equal(all.size, 3);
    for (const h of c.hosts) {
      const own = all.get(h.underlayIP)!;
      assert.match(own.mac ?? '', /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/);
      const link = JSON.parse(await ipn(h.ns, '-d', '-j', 'link', 'show', 'flannel.1')) as Array<{
        address: string;
        mtu: number;
        linkinfo: { info_kind: string; info_data: { id: number; local: string; port: number; learning: boolean } };
      }>;
      assert.equal(link[0]!.address, own.mac, 'the published VTEP MAC is the device MAC');
      assert.equal(link[0]!.mtu, 1450);
      assert.deepEqual(
        [link[0]!.linkinfo.info_kind, link[0]!.linkinfo.info_data.id, link[0]!.linkinfo.info_data.local, link[0]!.linkinfo.info_data.port, link[0]!.linkinfo.info_data.learning],
        ['vxlan', 1, h.underlayIP, 8472, false],
      );
      assert.match(await ipn(h.ns, 'addr', 'show', 'dev', 'flannel.1'), new RegExp(`inet ${own.subnet.split('/')[0]}/32 `));
      assert.equal(h.subnetEnv().FLANNEL_MTU, '1450');
      // Offload stays as the kernel made it unless DisableTxChecksumOffload asks otherwise.
      assert.match(await nsExec(h.ns, 'ethtool', '-k', 'flannel.1'), /^\s*tx-checksum-ip-generic: on$/m);
    }
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'every pod to ping every other pod' });
  });

  it('repairs a deleted route, neighbour and FDB entry, and removes a stale weft route', async () => {
    const h = c.hosts[0]!;
    const all = await leases(c);
    const peer = all.get(c.hosts[1]!.underlayIP)!;
    const addr = peer.subnet.split('/')[0]!;
    await ipn(h.ns, 'route', 'del', peer.subnet);
    await ipn(h.ns, 'neigh', 'del', addr, 'dev', 'flannel.1');
    await sh('bridge', ['-n', h.ns, 'fdb', 'del', peer.mac!, 'dev', 'flannel.1', 'dst', peer.publicIP]);
    await ipn(h.ns, 'route', 'add', '10.5.254.0/24', 'via', '10.5.254.0', 'dev', 'flannel.1', 'onlink', 'proto', '88');
    // Not weft's: a route of another protocol inside the network, and one outside it.
    await ipn(h.ns, 'route', 'add', '10.5.253.0/24', 'via', '10.5.253.0', 'dev', 'flannel.1', 'onlink', 'proto', 'static');
    await ipn(h.ns, 'route', 'add', '10.99.0.0/24', 'via', '10.99.0.0', 'dev', 'flannel.1', 'onlink', 'proto', '88');
    await waitFor(() => converged(c), { timeoutMs: 10_000, what: 'repair within a few reconcile periods' });
    const routes = await ipn(h.ns, 'route');
    assert.match(routes, /10\.5\.253\.0\/24 via 10\.5\.253\.0 dev flannel\.1 proto static onlink/);
    assert.match(routes, /10\.99\.0\.0\/24 via 10\.99\.0\.0 dev flannel\.1 proto 88 onlink/);
    await ipn(h.ns, 'route', 'del', '10.5.253.0/24');
    await ipn(h.ns, 'route', 'del', '10.99.0.0/24');
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 10_000, what: 'pings after the repair' });
    const metrics = await h.metrics();
    assert.match(metrics, /^weft_reconcile_repairs_total\{kind="added"\} [1-9]/m);
    assert.match(metrics, /^weft_reconcile_repairs_total\{kind="removed"\} [1-9]/m);
    assert.match(metrics, /^weft_peers_programmed 2$/m);
  });

  it('rebuilds a deleted vxlan device with the same MAC and replays every peer', async () => {
    const h = c.hosts[1]!;
    const before = (await leases(c)).get(h.underlayIP)!;
    await ipn(h.ns, 'link', 'del', 'flannel.1');
    await waitFor(() => converged(c), { timeoutMs: 10_000, what: 'device rebuilt and peers replayed' });
    const link = JSON.parse(await ipn(h.ns, '-j', 'link', 'show', 'flannel.1')) as Array<{ address: string }>;
    assert.equal(link[0]!.address, before.mac);
    await ipn(h.ns, 'link', 'set', 'flannel.1', 'down');
    await waitFor(async () => /[<,]UP[,>]/.test(await ipn(h.ns, 'link', 'show', 'flannel.1')), { timeoutMs: 10_000, what: 'device up again' });
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 15_000, what: 'pings after the rebuild' });
  });

  it('removes the entries of a peer whose lease is gone and brings them back when it returns', async () => {
    const gone = c.hosts[2]!;
    const all = await leases(c);
    const lease = all.get(gone.underlayIP)!;
    const key = `/coreos.com/network/subnets/${lease.subnet.replace('/', '-')}`;
    const value = (await c.etcdctl('get', '--print-value-only', key)).trim();
    await gone.weftd!.stop();
    await c.etcdctl('del', key);
    await waitFor(async () => {
      for (const h of c.hosts.slice(0, 2)) {
        const e = await entries(h);
        if (e.routes.some((r) => r.startsWith(lease.subnet)) || e.fdb.some((f) => f.includes(lease.publicIP))) return false;
      }
      return true;
    }, { timeoutMs: 10_000, what: 'entries of the removed peer gone' });
    await c.etcdctl('put', key, value);
    await waitFor(() => converged(c), { timeoutMs: 10_000, what: 'entries back' });
    await gone.startWeftd();
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 15_000, what: 'pings with the peer back' });
  });

  it('keeps every peer entry in place across kill -9 and a restart with 100 more peers', async () => {
    // 100 fake peers, written before the restart.
    const fakes: string[] = [];
    for (let i = 0; i < 100; i++) {
      const subnet = `10.5.${100 + i}.0`;
      const mac = `0e:aa:00:00:00:${i.toString(16).padStart(2, '0')}`;
      fakes.push(subnet);
      await c.etcdctl(
        'put',
        `/coreos.com/network/subnets/${subnet}-24`,
        JSON.stringify({ PublicIP: `10.250.1.${i + 1}`, PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: mac } }),
      );
    }
    const h = c.hosts[0]!;
    await waitFor(async () => (await entries(h)).routes.length === 102, { timeoutMs: 15_000, what: '102 peers programmed' });
    const own = (await leases(c)).get(h.underlayIP)!;
    // Watch for deletions while the daemon dies and comes back.
    const monitor = spawn('ip', ['-n', h.ns, 'monitor', 'route', 'neigh']);
    let events = '';
    monitor.stdout.on('data', (d: Buffer) => (events += d.toString()));
    // A marker route proves the monitor is subscribed before the daemon dies. It is re-added on every
    // poll: an add that happens before the monitor subscribes is never reported.
    await waitFor(async () => {
      if (events.includes('192.0.2.1')) return true;
      await ipn(h.ns, 'route', 'replace', '192.0.2.1/32', 'dev', 'lo', 'metric', String(Date.now() % 100000));
      return false;
    }, { what: 'ip monitor subscribed' });
    h.weftd!.kill();
    await h.weftd!.exited;
    await h.startWeftd();
    await waitFor(async () => /^weft_lease_batches_applied_total [1-9]/m.test(await h.metrics()), { timeoutMs: 30_000, what: 'the first batch applied after restart' });
    monitor.kill();
    await ipn(h.ns, 'route', 'flush', '192.0.2.1/32');
    // The kernel's own multicast neighbours (NOARP ff02::…, seen when it garbage-collects them
    // under load) are not weft's and come and go by themselves.
    const kernelMulticast = /^Deleted (ff[0-9a-f]{2}:\S*|2(2[4-9]|3[0-9])\.\S*) dev \S+ lladdr \S+ NOARP/;
    const deletions = events.split('\n').filter((l) => l.startsWith('Deleted') && !l.includes('192.0.2.1') && !kernelMulticast.test(l));
    assert.deepEqual(deletions, [], 'no entry removed during the restart');
    const after = (await leases(c)).get(h.underlayIP)!;
    assert.deepEqual(after, own, 'same subnet and VTEP MAC');
    assert.equal((await entries(h)).routes.length, 102);
    assert.ok(await c.allPodsReachable());
    for (const s of fakes) await c.etcdctl('del', `/coreos.com/network/subnets/${s}-24`);
    await waitFor(() => converged(c), { timeoutMs: 15_000, what: 'fakes removed everywhere' });
  });

  it('skips peers with a malformed VTEP MAC or a bad public IP, with one warning each', async () => {
    await c.etcdctl(
      'put',
      '/coreos.com/network/subnets/10.5.240.0-24',
      JSON.stringify({ PublicIP: '10.250.2.1', PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: 'zz:00' } }),
    );
    await c.etcdctl(
      'put',
      '/coreos.com/network/subnets/10.5.241.0-24',
      JSON.stringify({ PublicIP: 'fd00::1', PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: '0e:bb:00:00:00:01' } }),
    );
    const h = c.hosts[1]!;
    await waitFor(() => /rejected a peer lease.*10\.5\.240\.0-24.*VtepMAC/.test(h.weftd!.output), { timeoutMs: 10_000, what: 'the VtepMAC warning' });
    await waitFor(() => /skipping unparsable lease entry.*10\.5\.241\.0-24/.test(h.weftd!.output), { timeoutMs: 10_000, what: 'the public IP warning' });
    // Two more reconcile passes later: still one warning each, and the good peers untouched.
    const passes = async () => Number(/^weft_backend_reconcile_duration_seconds_count (\d+)$/m.exec(await h.metrics())?.[1] ?? 0);
    const start = await passes();
    await waitFor(async () => (await passes()) >= start + 2, { timeoutMs: 10_000, what: 'two reconcile passes' });
    assert.equal(h.weftd!.output.split('\n').filter((l) => l.includes('10.5.240.0-24')).length, 1);
    assert.equal(h.weftd!.output.split('\n').filter((l) => l.includes('10.5.241.0-24')).length, 1);
    assert.ok(!(await entries(h)).routes.some((r) => r.startsWith('10.5.240.0') || r.startsWith('10.5.241.0')));
    assert.ok(await c.allPodsReachable());
    await c.etcdctl('del', '/coreos.com/network/subnets/10.5.240.0-24');
    await c.etcdctl('del', '/coreos.com/network/subnets/10.5.241.0-24');
  });
});
