import assert from 'node:assert/strict';

import { parseFdbMonitorLine, parseIpMonitorLine } from '../../src/backend/kernel/drift.js';
import { KernelModel, type RepairScope } from '../../src/backend/kernel/model.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const DEVS: Record<string, number> = { 'flannel.1': 7, eth0: 2 };
const devIndex = (d: string): number | null => DEVS[d] ?? null;

describe('drift: reading ip monitor and bridge monitor lines', () => {
  it('reads routes (with a nexthop or a gateway), their deletion, table and protocol', () => {
    const r = parseIpMonitorLine('10.1.2.0/24 nhid 1459617792 via 10.1.2.0 dev flannel.1 proto 88 onlink ', devIndex);
    assert.deepEqual(r && r.kind === 'route' ? [r.key, r.present, r.nhid, r.gateway?.toString(), r.dev, r.proto, r.mainTable] : null, ['10.1.2.0/24', true, 1459617792, '10.1.2.0', 'flannel.1', '88', true]);
    const d = parseIpMonitorLine('Deleted 10.1.2.0/24 via 172.16.0.9 dev eth0 proto 88 ', devIndex);
    assert.deepEqual(d && d.kind === 'route' ? [d.present, d.nhid, d.gateway?.toString()] : null, [false, null, '172.16.0.9']);
    const local = parseIpMonitorLine('10.9.0.0/24 dev d0 table 100 proto 88 scope link ', devIndex);
    assert.equal(local?.kind === 'route' && local.mainTable, false);
    for (const other of ['local fe80::1 dev eth0 table local proto kernel metric 0 pref medium', 'multicast ff00::/8 dev d0 table local proto kernel metric 256 pref medium', 'default via 10.0.0.1 dev eth0', '']) {
      assert.equal(parseIpMonitorLine(other, devIndex), null, other);
    }
  });

  it('reads neighbours on known devices, nexthops, and FDB entries', () => {
    const n = parseIpMonitorLine('10.1.2.0 dev flannel.1 lladdr 0e:00:00:00:00:02 PERMANENT ', devIndex);
    assert.deepEqual(n && n.kind === 'neigh' ? [n.key, n.present, n.mac, n.permanent] : null, ['7 10.1.2.0', true, '0e:00:00:00:00:02', true]);
    const gone = parseIpMonitorLine('Deleted 10.1.2.0 dev flannel.1 FAILED ', devIndex);
    assert.deepEqual(gone && gone.kind === 'neigh' ? [gone.present, gone.mac] : null, [false, null]);
    assert.equal(parseIpMonitorLine('10.1.2.0 dev cni0 lladdr 0e:00:00:00:00:02 REACHABLE', devIndex), null, 'a device that is not weft\'s');
    const nh = parseIpMonitorLine('Deleted id 1459617792 via 10.1.2.0 dev flannel.1 scope link proto 88 onlink ', devIndex);
    assert.deepEqual(nh && nh.kind === 'nexthop' ? [nh.id, nh.present, nh.proto] : null, [1459617792, false, '88']);
    const f = parseFdbMonitorLine('Deleted 0e:00:00:00:00:02 dev flannel.1 dst 172.16.1.2 self permanent', devIndex);
    assert.deepEqual(f && f.kind === 'fdb' ? [f.key, f.present, f.permanent] : null, ['7 0e:00:00:00:00:02 172.16.1.2', false, true]);
    assert.equal(parseFdbMonitorLine('33:33:00:00:00:01 dev eth0 self permanent', devIndex), null);
  });
});

describe('drift: the model puts entries back as it has them', () => {
  const subnet = IPNet.parse('10.1.2.0/24');
  const mac = '0e:00:00:00:00:02';
  const entries = {
    routes: [{ dst: subnet, gateway: subnet.ip, oif: 7, onlink: true }],
    neighbours: [{ ifindex: 7, ip: subnet.ip, mac }],
    fdb: [{ ifindex: 7, mac, dst: IPAddr.parse('172.16.1.2') }],
  };
  const model = (): KernelModel => {
    const m = new KernelModel({ nexthopDevices: new Set([7]) });
    m.reset({ nexthopDevices: new Set([7]) }, new Map([['p', entries]]), { routes: [{ ...entries.routes[0]!, nhid: 5 }], nexthops: [{ id: 5, gateway: subnet.ip, oif: 7, onlink: true }] }, [5]);
    return m;
  };
  const scope = (allowed = true): RepairScope => ({ networks: [IPNet.parse('10.1.0.0/16')], l2Devices: new Set([7]), devIndex, allow: () => allowed });
  const obs = (line: string) => (line.includes(' dst ') && !line.includes('/') ? parseFdbMonitorLine(line, devIndex) : parseIpMonitorLine(line, devIndex))!;

  it('ignores the echo of its own entries and re-adds deleted or changed ones', () => {
    const m = model();
    assert.deepEqual(m.repair([obs('10.1.2.0/24 nhid 5 via 10.1.2.0 dev flannel.1 proto 88 onlink'), obs('10.1.2.0 dev flannel.1 lladdr 0e:00:00:00:00:02 PERMANENT')], scope()).ops, []);
    const r = m.repair(
      [obs('Deleted 10.1.2.0/24 nhid 5 via 10.1.2.0 dev flannel.1 proto 88 onlink'), obs('10.1.2.0 dev flannel.1 lladdr 0e:ee:ee:ee:ee:ee PERMANENT'), obs('Deleted 0e:00:00:00:00:02 dev flannel.1 dst 172.16.1.2 self permanent')],
      scope(),
    );
    assert.deepEqual(r.ops.map((o) => `${o.kind} ${o.repair}`), ['route-replace added', 'neigh-replace changed', 'fdb-replace added']);
    assert.equal(r.full, false);
  });

  it('removes weft-protocol routes it does not have inside the network, and nothing else', () => {
    const m = model();
    const r = m.repair([obs('10.1.9.0/24 via 10.1.9.0 dev flannel.1 proto 88 onlink'), obs('10.1.8.0/24 via 10.1.8.0 dev flannel.1 proto static onlink'), obs('10.99.0.0/24 via 10.99.0.1 dev eth0 proto 88')], scope());
    assert.deepEqual(r.ops.map((o) => (o.kind === 'route-delete' ? o.route.dst.toString() : o.kind)), ['10.1.9.0/24']);
  });

  it('asks for a full pass when one of its nexthops is deleted, and respects the rate limit', () => {
    const m = model();
    assert.equal(m.repair([obs('Deleted id 5 via 10.1.2.0 dev flannel.1 scope link proto 88 onlink')], scope()).full, true);
    assert.deepEqual(m.repair([obs('Deleted 10.1.2.0/24 nhid 5 via 10.1.2.0 dev flannel.1 proto 88 onlink')], scope(false)).ops, []);
  });
});
