// Pod ports whose OVSDB values are hostile, written with ovs-vsctl into the private Open vSwitch of
// an ovs-backend node (namespaces, etcd, weftd, a real pod attached through the CNI plugin): no
// such port gets a flow — an address carrying ",actions=NORMAL", a MAC carrying a second flow
// line, a multicast MAC, another pod's IP, a name a flow file or ovs-vsctl would misread — each
// is reported once with the reason, and the pod next to them keeps exactly its flows.
import assert from 'node:assert/strict';

import { PodPortFilter, scanPodInterfaces } from '../../src/backend/ovs/bridge.js';
import { OvsClient } from '../../src/ovs/cli.js';
import type { LogFields, Logger } from '../../src/util/log.js';
import { Cluster } from '../helpers/cluster.js';
import { startHostOvs, startOvsWeftd, subnetOf, type OvsHost } from '../helpers/ovs-cluster.js';
import { attachOvsPod } from '../helpers/ovs-pod.js';
import { waitFor } from '../helpers/wait.js';

const CONFIG = { Network: '10.244.0.0/16', SubnetLen: 24, Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 } };

interface Hostile {
  readonly name: string;
  readonly ids: Record<string, string>;
  /** What the reason must say. */
  readonly reason: RegExp;
}

describe('ovs backend: pod ports with hostile external_ids (integration)', function () {
  this.timeout(120_000);
  let cluster: Cluster;
  let n: OvsHost;
  let client: OvsClient;
  let hostile: Hostile[] = [];
  const ofports = new Map<string, number>();
  /** The flow table before the hostile ports came. */
  let table: string[] = [];

  /** A pod port as the plugin would make it, with `ids` (values as ovs-vsctl should store them) instead. */
  async function addPort(name: string, ids: Record<string, string>): Promise<number> {
    await n.ovs.vsctl(
      'add-port', 'br-int', name, '--', 'set', 'interface', name, 'type=internal',
      ...Object.entries(ids).map(([k, v]) => `external_ids:${k}=${JSON.stringify(v)}`),
    );
    return waitFor(
      async () => {
        const ofport = Number((await n.ovs.vsctl('get', 'interface', name, 'ofport')).trim());
        return ofport > 0 ? ofport : null;
      },
      { timeoutMs: 10_000, what: `an ofport for ${name}` },
    );
  }

  /** The count of reconcile passes weftd has made. */
  async function passes(): Promise<number> {
    return Number(/^weft_backend_reconcile_duration_seconds_count (\d+)/m.exec(await n.host.metrics())?.[1] ?? 0);
  }

  before(async function () {
    cluster = await Cluster.create({ hosts: 1, tag: 'ovsbad', config: CONFIG });
    const host = cluster.hosts[0]!;
    n = { host, ovs: await startHostOvs(cluster, host), pod: null };
    await startOvsWeftd(n);
    n.pod = await attachOvsPod(n.host, n.ovs, 'pod-a');
    client = new OvsClient({ runDir: n.ovs.runDir });
    const subnet = subnetOf(n.host);
    const ip = (i: bigint) => subnet.nth(i).toString();
    const ids = (i: bigint, extra: Record<string, string> = {}) => ({
      'weft-container-id': `ctr-bad${i}`,
      'weft-ifname': 'eth0',
      'weft-ip': ip(i),
      'attached-mac': `0a:58:0a:f4:00:${i.toString(16).padStart(2, '0')}`,
      ...extra,
    });
    hostile = [
      { name: 'wtbad1', ids: ids(41n, { 'weft-ip': `${ip(41n)},actions=NORMAL` }), reason: /^weft-ip ".*,actions=NORMAL" is not an IPv4 address/ },
      { name: 'wtbad2', ids: ids(42n, { 'attached-mac': '0a:58:0a:f4:00:2a\nadd table=0,priority=65535,actions=NORMAL' }), reason: /^attached-mac .* is not a MAC address/ },
      { name: 'wtbad3', ids: ids(43n, { 'attached-mac': 'ff:ff:ff:ff:ff:ff' }), reason: /is a multicast MAC address/ },
      { name: 'wtbad4', ids: ids(44n, { 'weft-container-id': 'ctr\u001b[2J' }), reason: /^weft-container-id .* is not a container ID/ },
      { name: 'wtbad5', ids: ids(45n, { 'weft-ip': n.pod.ip }), reason: new RegExp(`^claims the IP ${n.pod.ip.replace(/\./g, '\\.')} of port \\S+ \\(ofport ${n.pod.ofport}\\)$`) },
      { name: 'wtbad6', ids: ids(46n, { 'weft-pod-name': 'pod\u202eevil' }), reason: /^weft-pod-name .* contains a format character/ },
      { name: 'wt#bad7', ids: ids(47n), reason: /^interface name contains "#"/ },
      { name: 'wtbad8', ids: ids(48n, { 'weft-ip': '224.0.0.251' }), reason: /is not a unicast address/ },
    ];
  });

  after(async () => {
    await Promise.allSettled(cluster?.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve()) ?? []);
    await n?.ovs.stop().catch(() => undefined);
    await cluster?.destroy();
  });

  it('ovs-vsctl stored the hostile values as written', async () => {
    table = await n.ovs.dumpFlows('br-int');
    assert.equal(table.filter((l) => l.includes(`in_port=${n.pod!.ofport}`)).length, 3, 'the pod has its flows');
    for (const h of hostile) ofports.set(h.name, await addPort(h.name, h.ids));
    // Read back raw: the values reached OVSDB byte for byte (the test is about what weft does with them).
    for (const h of hostile) {
      const stored = JSON.parse(await n.ovs.vsctl('--format=json', '--columns=external_ids', 'list', 'interface', h.name)) as { data: [[['map', [string, string][]]]] };
      assert.deepEqual(Object.fromEntries(stored.data[0][0][1]), h.ids, h.name);
    }
  });

  it('skips each hostile port with its reason and keeps the pod', async () => {
    const warnings: LogFields[] = [];
    const logger: Logger = { error: () => undefined, warn: (_m, f) => warnings.push(f ?? {}), info: () => undefined, debug: () => undefined, child: () => logger };
    const filter = new PodPortFilter(logger);
    const { pods, skipped } = await scanPodInterfaces(client, 'br-int');
    assert.deepEqual(pods.map((p) => [p.ofport, p.ip.toString(), p.mac]), [[n.pod!.ofport, n.pod!.ip, n.pod!.mac]]);
    assert.deepEqual(skipped.map((s) => s.name).sort(), hostile.map((h) => h.name).sort());
    for (const h of hostile) {
      const s = skipped.find((x) => x.name === h.name)!;
      assert.equal(s.ofport, ofports.get(h.name));
      assert.match(s.reason, h.reason, h.name);
    }
    for (let i = 0; i < 3; i++) filter.report((await scanPodInterfaces(client, 'br-int')).skipped);
    assert.equal(warnings.length, hostile.length, 'one warning per port over three reads');
  });

  it('weftd writes no flow for them: over two reconcile passes the table stays the pod\'s and the node\'s', async () => {
    const start = await passes();
    await waitFor(async () => (await passes()) >= start + 2, { timeoutMs: 15_000, what: 'two reconcile passes' });
    assert.deepEqual(await n.ovs.dumpFlows('br-int'), table);
    assert.equal(weftd().running, true);
  });

  it('weftd reports each hostile port once in its log, whatever the number of passes', async () => {
    const start = await passes();
    await waitFor(async () => (await passes()) >= start + 2, { timeoutMs: 15_000, what: 'two more reconcile passes' });
    const lines = weftd().output.split('\n').filter((l) => l.includes('skipping pod port'));
    for (const h of hostile) {
      const mine = lines.filter((l) => l.includes(`port=${h.name}`) || l.includes(`port=${JSON.stringify(h.name)}`));
      assert.equal(mine.length, 1, `${h.name}: ${mine.length} warnings (needs OvsBackend to pass a PodPortFilter to listPodInterfaces)\n${lines.join('\n')}`);
    }
    assert.equal(lines.length, hostile.length);
  });

  function weftd() {
    const d = n.host.weftd;
    assert.ok(d);
    return d;
  }
});
