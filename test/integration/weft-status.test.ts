// `weft status` against a running weftd in a two-node vxlan cluster (namespaces, real etcd, --ip-masq):
// the lease matches etcd (subnet, public IP, VTEP MAC, expiry against the etcd lease TTL), every
// count matches /metrics, repairs of routes and rules show up with their times, and an endpoint
// where nothing listens exits 1 with a clear message.
import assert from 'node:assert/strict';
import type { StatusSnapshot } from '../../src/daemon/status.js';
import { Cluster, type Host } from '../helpers/cluster.js';
import { ipn, nsExec } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';
import { runWeft } from '../helpers/weft-cli.js';


const weft = runWeft;

/** /status, /metrics and /status again, fetched back to back by one process inside the namespace. */
async function readTogether(h: Host): Promise<{ before: StatusSnapshot; metrics: string; after: StatusSnapshot }> {
  const script =
    "const g=(p)=>fetch('http://127.0.0.1:8081'+p).then(r=>r.text());" +
    "(async()=>{const a=await g('/status');const m=await g('/metrics');const b=await g('/status');" +
    'process.stdout.write(JSON.stringify({before:JSON.parse(a),metrics:m,after:JSON.parse(b)}))})()';
  return JSON.parse(await nsExec(h.ns, process.execPath, '-e', script)) as { before: StatusSnapshot; metrics: string; after: StatusSnapshot };
}

/** The counters of a snapshot; two reads with equal counters bracket a consistent /metrics read. */
function counters(s: StatusSnapshot): string {
  return JSON.stringify([s.ready, s.lease?.expiration, s.backend?.peersKnown, s.backend?.peersProgrammed, s.backend?.repairs, s.ipmasq.checks, s.ipmasq.repairs, s.ipmasq.errors]);
}

function metric(text: string, name: string): number {
  const values = text
    .split('\n')
    .filter((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`))
    .map((l) => Number(l.slice(l.lastIndexOf(' ') + 1)));
  assert.ok(values.length > 0, `metric ${name} not exported`);
  return values.reduce((a, b) => a + b, 0);
}

const metricOf = (text: string, name: string, label: string): number => {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${label}}`));
  assert.ok(line, `no ${name}{${label}}`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
};

/** A snapshot and the metrics read while it did not change. */
function consistent(h: Host): Promise<{ s: StatusSnapshot; metrics: string }> {
  return waitFor(
    async () => {
      const r = await readTogether(h);
      return counters(r.before) === counters(r.after) ? { s: r.after, metrics: r.metrics } : null;
    },
    { timeoutMs: 20_000, what: 'a status read not interleaved with a counter change' },
  );
}

describe('weft status against a running weftd', function () {
  this.timeout(180_000);
  let c: Cluster;
  let h1: Host;
  let h2: Host;

  before(async () => {
    c = await Cluster.create({ hosts: 2, tag: 'wst', config: { Network: '10.9.0.0/16', Backend: { Type: 'vxlan' } }, weftdArgs: ['--ip-masq', '--iptables-resync', '1'] });
    await c.startAll();
    [h1, h2] = [c.hosts[0]!, c.hosts[1]!];
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 30_000, what: 'pods to reach each other' });
  });
  after(async () => {
    await c?.destroy();
  });

  it('reports the lease as etcd has it and every count as /metrics has it', async () => {
    const run = await weft(h1.ns, 'status', '-o', 'json');
    assert.equal(run.code, 0, run.stderr);
    const cli = JSON.parse(run.stdout) as StatusSnapshot;

    // The lease, against etcd.
    const env = h1.subnetEnv();
    const subnet = env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
    const key = `/coreos.com/network/subnets/${subnet.replace('/', '-')}`;
    const raw = await c.etcdctl('get', key, '-w', 'json');
    const kv = JSON.parse(raw) as { kvs: Array<{ value: string }> };
    const stored = JSON.parse(Buffer.from(kv.kvs[0]!.value, 'base64').toString()) as { PublicIP: string; BackendType: string; BackendData: { VtepMAC: string } };
    // The etcd lease ID is an int64: read it from the text, JSON.parse would round it.
    const leaseId = /"lease":(\d+)/.exec(raw)?.[1];
    assert.ok(leaseId, `no etcd lease on ${key}: ${raw}`);
    assert.deepEqual(
      [cli.lease?.subnet, cli.lease?.publicIP, cli.lease?.backendType, cli.lease?.vtepMAC, cli.lease?.reservation],
      [subnet, stored.PublicIP, stored.BackendType, stored.BackendData.VtepMAC, false],
    );
    const ttl = await c.etcdctl('lease', 'timetolive', BigInt(leaseId).toString(16));
    const remaining = Number(/remaining\((\d+)s\)/.exec(ttl)?.[1]);
    assert.ok(remaining > 0, ttl);
    const expiresIn = (Date.parse(cli.lease!.expiration!) - Date.now()) / 1000;
    assert.ok(Math.abs(expiresIn - remaining) < 10, `status expiry in ${expiresIn}s, etcd lease remaining ${remaining}s`);
    assert.deepEqual([cli.ready, cli.subnetFile, cli.network?.network, cli.network?.backendType, cli.backend?.type], [true, h1.subnetFile, '10.9.0.0/16', 'vxlan', 'vxlan']);
    assert.deepEqual([cli.ipmasq.masquerade, cli.ipmasq.forwardRules, cli.ipmasq.mode, cli.ipmasq.resyncSeconds], [true, true, 'iptables', 1]);

    // Every count, against /metrics read in the same breath.
    const { s, metrics } = await consistent(h1);
    assert.equal(s.lease?.expiration, new Date(metric(metrics, 'weft_lease_expiration_timestamp_seconds') * 1000).toISOString());
    assert.equal(s.ready ? 1 : 0, metric(metrics, 'weft_ready'));
    assert.equal(s.backend?.peersKnown, metric(metrics, 'weft_peers'));
    assert.equal(s.backend?.peersProgrammed, metric(metrics, 'weft_peers_programmed'));
    assert.equal(s.backend?.peersKnown, 1);
    for (const kind of ['added', 'changed', 'removed', 'device'] as const) {
      assert.equal(s.backend?.repairs[kind], metricOf(metrics, 'weft_reconcile_repairs_total', `kind="${kind}"`), kind);
    }
    assert.equal(s.ipmasq.checks, metric(metrics, 'weft_ipmasq_checks_total'));
    assert.equal(s.ipmasq.repairs, metric(metrics, 'weft_ipmasq_repairs_total'));
    assert.equal(s.ipmasq.errors, metric(metrics, 'weft_ipmasq_errors_total'));
    assert.ok(s.ipmasq.checks >= 1);
    assert.ok(s.backend?.lastApply && Date.parse(s.backend.lastApply) <= Date.parse(s.time));
  });

  it('prints one labelled line per aspect by default', async () => {
    const run = await weft(h1.ns, 'status');
    assert.equal(run.code, 0, run.stderr);
    const lines = run.stdout.trimEnd().split('\n');
    const subnet = h1.subnetEnv().FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
    assert.match(lines[0]!, /^weftd {7}\S+, ready$/);
    assert.match(lines[1]!, new RegExp(`^lease {7}${subnet.replace(/\./g, '\\.')}, public IP ${h1.underlayIP.replace(/\./g, '\\.')}, expires \\S+Z \\(in 23h5\\dm\\)$`));
    assert.equal(lines[2], 'network     10.9.0.0/16, backend vxlan');
    assert.equal(lines[3], 'backend     vxlan: 1 peers known, 1 programmed, 0 rejected');
    assert.match(lines[4]!, /^reconcile {3}last apply \S+ ago, last reconcile \S+ ago \(every 1s\)$/);
    assert.match(lines[5]!, /^repairs {5}added \d+, changed \d+, removed \d+, devices rebuilt \d+; 0 operations refused$/);
    assert.equal(lines[6], 'ipmasq      masquerade on, forward rules on, iptables');
    assert.equal(lines.at(-1), `subnet file ${h1.subnetFile}`);
  });

  it('shows route and rule repairs with their times', async () => {
    const { s: before } = await consistent(h1);
    const peerSubnet = h2.subnetEnv().FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
    await ipn(h1.ns, 'route', 'del', peerSubnet);
    await nsExec(h1.ns, 'iptables', '-t', 'nat', '-D', 'FLANNEL-POSTRTG', '5');
    const { s, metrics } = await waitFor(
      async () => {
        const r = await consistent(h1);
        return r.s.backend!.repairs.added > before.backend!.repairs.added && r.s.ipmasq.repairs > before.ipmasq.repairs ? r : null;
      },
      { timeoutMs: 20_000, what: 'the route and the rule repaired' },
    );
    assert.equal(s.backend?.repairs.added, metricOf(metrics, 'weft_reconcile_repairs_total', 'kind="added"'));
    assert.equal(s.ipmasq.repairs, metricOf(metrics, 'weft_ipmasq_repairs_total', 'mode="iptables"'));
    assert.ok(s.ipmasq.lastRepair !== null && Date.parse(s.ipmasq.lastRepair) > Date.parse(before.time) - 1000);
    assert.ok(
      s.ipmasq.lastRepairProblems.some((p) => p.startsWith('ipv4 nat: FLANNEL-POSTRTG: missing rule: -A FLANNEL-POSTRTG -s 10.9.0.0/16 ! -d 224.0.0.0/4')),
      s.ipmasq.lastRepairProblems.join('\n'),
    );
    assert.ok(s.backend?.lastReconcile !== null && Date.parse(s.backend.lastReconcile) > Date.parse(before.time) - 1000);
    assert.match(await ipn(h1.ns, 'route', 'show', peerSubnet), /proto 88/);
  });

  it('exits 1 with a clear message when no daemon answers', async () => {
    // weftd listens on 8081 in this namespace; nothing on 8082.
    const run = await weft(h1.ns, 'status', '--endpoint', 'http://127.0.0.1:8082');
    assert.equal(run.code, 1);
    assert.equal(run.stdout, '');
    assert.equal(run.stderr, 'weft status: cannot reach weftd at http://127.0.0.1:8082/status: ECONNREFUSED (is weftd running here, with --healthz-port matching --endpoint?)\n');
  });
});
