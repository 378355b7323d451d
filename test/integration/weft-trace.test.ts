// `weft trace` on a node of a two-node vxlan cluster (network namespaces, real etcd, weftd with
// --ip-masq): a remote pod's route, neighbour, FDB entry and public IP; an FDB entry deleted by hand
// while weftd is paused (then put back by weftd once it runs again); masquerade towards an outside
// address; a foreign rule that would hide pod IPs; an MTU mismatch; leases from the daemon
// when etcd is out of reach. The JSON output is validated against test/fixtures/trace/schema.json.
import assert from 'node:assert/strict';
import type { Hop, HopKind, TraceReport } from '../../src/cli/trace/types.js';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { ipn, nsExec, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';
import { runWeft, type WeftRun } from '../helpers/weft-cli.js';
import { validate } from '../fixtures/trace/validate.js';

const NETWORK = '10.7.0.0/16';

const weft = runWeft;
type Run = WeftRun;

interface StoredLease {
  subnet: string;
  publicIP: string;
  mac: string;
}

async function leaseOf(c: Cluster, h: Host): Promise<StoredLease> {
  const out = await c.etcdctl('get', '--prefix', '/coreos.com/network/subnets/');
  const lines = out.split('\n').filter((l) => l !== '');
  for (let i = 0; i + 1 < lines.length; i += 2) {
    const v = JSON.parse(lines[i + 1]!) as { PublicIP: string; BackendData: { VtepMAC: string } };
    if (v.PublicIP !== h.underlayIP) continue;
    const key = lines[i]!.slice(lines[i]!.lastIndexOf('/') + 1);
    return { subnet: key.replace(/-(\d+)$/, '/$1'), publicIP: v.PublicIP, mac: v.BackendData.VtepMAC };
  }
  throw new Error(`no lease in etcd for ${h.underlayIP}`);
}

function hop<K extends HopKind>(r: TraceReport, kind: K): Extract<Hop, { kind: K }> {
  const h = r.hops.find((x) => x.kind === kind);
  assert.ok(h, `no ${kind} hop in: ${r.hops.map((x) => `${x.kind}:${x.status}`).join(', ')}`);
  return h as Extract<Hop, { kind: K }>;
}

describe('weft trace: two vxlan nodes in namespaces', function () {
  this.timeout(180_000);
  let c: Cluster;
  let h1: Host;
  let h2: Host;
  let peer: StoredLease;

  /** Trace on node 1 as JSON; the output must validate against the schema. */
  async function trace(src: string, dst: string, ...extra: string[]): Promise<{ run: Run; report: TraceReport }> {
    const run = await weft(h1.ns, 'trace', src, dst, '--subnet-file', h1.subnetFile, '--etcd-endpoints', `http://${ETCD_IP}:2379`, '-o', 'json', ...extra);
    assert.ok(run.stdout.startsWith('{'), `weft trace printed no JSON (exit ${run.code}): ${run.stderr}`);
    const report = JSON.parse(run.stdout) as TraceReport;
    assert.deepEqual(validate(report), [], 'trace JSON validates against the schema');
    return { run, report };
  }

  before(async () => {
    c = await Cluster.create({
      hosts: 2,
      tag: 'wtr',
      config: { Network: NETWORK, Backend: { Type: 'vxlan' } },
      // No periodic pass: the rule and MTU faults planted below stay until the test undoes them.
      weftdArgs: ['--ip-masq', '--reconcile-interval', '0'],
    });
    await c.startAll();
    [h1, h2] = [c.hosts[0]!, c.hosts[1]!];
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'pods to reach each other' });
    peer = await leaseOf(c, h2);
  });
  after(async () => {
    await c?.destroy();
  });

  it('names the route, neighbour, FDB entry and public IP for a remote pod', async () => {
    const { run, report } = await trace(h1.podIP!, h2.podIP!);
    assert.equal(run.code, 0, run.stdout);
    assert.equal(report.verdict, 'ok');
    assert.deepEqual(report.node.leaseSource, 'etcd');
    assert.equal(report.node.publicIP, h1.underlayIP);
    assert.equal(report.node.backend, 'vxlan');
    assert.deepEqual(
      report.hops.map((h) => `${h.kind}:${h.status}`),
      ['source:ok', 'route:ok', 'neighbour:ok', 'fdb:ok', 'underlay:ok', 'mtu:ok', 'masquerade:ok', 'forward:ok'],
    );
    const route = hop(report, 'route').evidence;
    assert.deepEqual(
      [route.prefix, route.gateway, route.device, route.protocol, route.onlink, route.lease, route.leasePublicIP],
      [peer.subnet, peer.subnet.split('/')[0], 'flannel.1', '88', true, peer.subnet, h2.underlayIP],
    );
    assert.deepEqual(hop(report, 'neighbour').evidence, {
      device: 'flannel.1',
      address: peer.subnet.split('/')[0],
      mac: peer.mac,
      state: 'PERMANENT',
      expectedMac: peer.mac,
    });
    assert.deepEqual(hop(report, 'fdb').evidence, {
      device: 'flannel.1',
      mac: peer.mac,
      remoteIP: h2.underlayIP,
      vni: 1,
      port: 8472,
      lease: peer.subnet,
      expectedRemoteIP: h2.underlayIP,
    });
    assert.equal(hop(report, 'fdb').summary, `${peer.mac} dst ${h2.underlayIP} on flannel.1 (vni 1, port 8472): public IP of lease ${peer.subnet}`);
    assert.deepEqual([hop(report, 'underlay').evidence.device, hop(report, 'underlay').evidence.source], ['eth0', h1.underlayIP]);
    const masq = hop(report, 'masquerade').evidence;
    assert.deepEqual([masq.verdict, masq.rule, masq.live, masq.liveVerdict, masq.liveChain], ['RETURN', 2, 'present', 'RETURN', 'FLANNEL-POSTRTG']);

    // The text form: one line per hop.
    const text = await weft(h1.ns, 'trace', h1.podIP!, h2.podIP!, '--subnet-file', h1.subnetFile, '--etcd-endpoints', `http://${ETCD_IP}:2379`);
    assert.equal(text.code, 0);
    const lines = text.stdout.trimEnd().split('\n');
    assert.equal(lines[0], `trace ${h1.podIP} -> ${h2.podIP} icmp on node ${h1.underlayIP} (lease ${report.node.subnet}, network ${NETWORK}, backend vxlan, leases from etcd)`);
    assert.equal(lines.length, 1 + 8 + 1);
    assert.match(lines[4]!, new RegExp(`^  ok +fdb +${peer.mac} dst ${h2.underlayIP.replace(/\./g, '\\.')} on flannel\\.1 \\(vni 1, port 8472\\)`));
    assert.equal(lines.at(-1), 'result: ok');
  });

  it('reports the FDB hop broken after the entry is deleted by hand', async () => {
    // weftd puts a deleted entry back as soon as it sees the notification: paused, it cannot.
    h1.weftd!.pause();
    try {
      await sh('bridge', ['-n', h1.ns, 'fdb', 'del', peer.mac, 'dev', 'flannel.1', 'dst', peer.publicIP]);
      const { run, report } = await trace(h1.podIP!, h2.podIP!);
      assert.equal(run.code, 1);
      assert.equal(report.verdict, 'broken');
      const fdb = hop(report, 'fdb');
      assert.equal(fdb.status, 'broken');
      assert.equal(
        fdb.summary,
        `no FDB entry for ${peer.mac} on flannel.1 (vni 1, port 8472): the kernel does not know which node to send the VXLAN packet to (lease ${peer.subnet} is at ${h2.underlayIP})`,
      );
      assert.deepEqual(report.problems, [`fdb: ${fdb.summary}`]);
      // The hops before it are still fine.
      assert.deepEqual([hop(report, 'route').status, hop(report, 'neighbour').status], ['ok', 'ok']);
    } finally {
      h1.weftd!.resume();
    }
    await waitFor(async () => (await trace(h1.podIP!, h2.podIP!)).run.code === 0, {
      timeoutMs: 10_000,
      what: 'weftd to put the deleted FDB entry back',
    });
  });

  it('reports masquerade and the rule for an outside address', async () => {
    const { run, report } = await trace(h1.podIP!, '203.0.113.10', '--proto', 'tcp', '--dport', '443');
    assert.equal(run.code, 0, run.stdout);
    assert.deepEqual(report.packet, { src: h1.podIP, dst: '203.0.113.10', proto: 'tcp', dport: 443 });
    const route = hop(report, 'route').evidence;
    assert.deepEqual([route.prefix, route.gateway, route.device, route.destinationClass], ['0.0.0.0/0', ETCD_IP, 'eth0', 'external']);
    const masq = hop(report, 'masquerade');
    const rule = `-A FLANNEL-POSTRTG -s ${NETWORK} ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully`;
    assert.equal(masq.status, 'ok');
    assert.equal(masq.summary, `masqueraded to ${h1.underlayIP} by rule 5 of FLANNEL-POSTRTG: ${rule} (live: present)`);
    assert.deepEqual(
      [masq.evidence.verdict, masq.evidence.rule, masq.evidence.ruleText, masq.evidence.live, masq.evidence.liveVerdict, masq.evidence.liveChain, masq.evidence.liveRule, masq.evidence.liveRuleText],
      ['MASQUERADE', 5, rule, 'present', 'MASQUERADE', 'FLANNEL-POSTRTG', 5, rule],
    );
    // The live rule is exactly what iptables-save shows on the node.
    assert.ok((await nsExec(h1.ns, 'iptables-save', '-t', 'nat')).split('\n').includes(rule));
  });

  it('flags a foreign rule that would masquerade pod-to-pod traffic', async () => {
    const spec = ['-s', NETWORK, '-o', 'flannel.1', '-j', 'MASQUERADE'];
    await nsExec(h1.ns, 'iptables', '-t', 'nat', '-I', 'POSTROUTING', '1', ...spec);
    try {
      const { run, report } = await trace(h1.podIP!, h2.podIP!);
      assert.equal(run.code, 1);
      const masq = hop(report, 'masquerade');
      assert.equal(masq.status, 'broken');
      assert.match(masq.summary, new RegExp(`masquerade would hide pod IP ${h1.podIP!.replace(/\./g, '\\.')} from ${h2.podIP!.replace(/\./g, '\\.')} inside the cluster \\(rule 1 of POSTROUTING: -A POSTROUTING -s 10\\.7\\.0\\.0/16 -o flannel\\.1 -j MASQUERADE\\)`));
      assert.deepEqual([masq.evidence.liveVerdict, masq.evidence.liveChain, masq.evidence.liveRule], ['MASQUERADE', 'POSTROUTING', 1]);
    } finally {
      await nsExec(h1.ns, 'iptables', '-t', 'nat', '-D', 'POSTROUTING', ...spec);
    }
  });

  it('reports an MTU mismatch between cni0 and flannel.1', async () => {
    await ipn(h1.ns, 'link', 'set', 'cni0', 'mtu', '1500');
    try {
      const { run, report } = await trace(h1.podIP!, h2.podIP!);
      assert.equal(run.code, 1);
      const mtu = hop(report, 'mtu');
      assert.equal(mtu.summary, 'MTU mismatch: cni0 MTU 1500 > flannel.1 MTU 1450; pods send packets flannel.1 cannot carry');
      assert.deepEqual([mtu.evidence.bridgeMtu, mtu.evidence.deviceMtu, mtu.evidence.underlayMtu, mtu.evidence.subnetEnvMtu], [1500, 1450, 1500, 1450]);
    } finally {
      await ipn(h1.ns, 'link', 'set', 'cni0', 'mtu', '1450');
    }
  });

  it('takes the leases from the daemon when etcd is out of reach', async () => {
    const run = await weft(h1.ns, 'trace', h1.podIP!, h2.podIP!, '--subnet-file', h1.subnetFile, '--etcd-endpoints', 'http://127.0.0.1:1', '--etcd-timeout', '2', '-o', 'json');
    assert.equal(run.code, 0, run.stdout);
    const report = JSON.parse(run.stdout) as TraceReport;
    assert.deepEqual(validate(report), []);
    assert.equal(report.node.leaseSource, 'daemon');
    assert.ok(report.notes.includes('leases as the daemon knows them (etcd not reachable)'));
    assert.deepEqual([hop(report, 'fdb').evidence.lease, hop(report, 'route').evidence.lease], [peer.subnet, peer.subnet]);
  });
});
