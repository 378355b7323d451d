import assert from 'node:assert/strict';
import { diffState, type DesiredState } from '../../src/backend/kernel/diff.js';
import { parseVxlanOptions } from '../../src/backend/vxlan/vxlan.js';
import { vtepMacOfData as vtepMacOf } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const ip = (s: string) => IPAddr.parse(s);
const net = (s: string) => IPNet.parse(s);
const peer = (n: number, mac = `0e:00:00:00:00:0${n}`) => ({
  route: { dst: net(`10.5.${n}.0/24`), gateway: ip(`10.5.${n}.0`), oif: 7, onlink: true },
  neigh: { ifindex: 7, ip: ip(`10.5.${n}.0`), mac },
  fdb: { ifindex: 7, mac, dst: ip(`192.168.0.${n}`) },
});
const state = (...ps: ReturnType<typeof peer>[]): DesiredState => ({
  routes: ps.map((p) => p.route),
  neighbours: ps.map((p) => p.neigh),
  fdb: ps.map((p) => p.fdb),
});
const describeOps = (ops: ReturnType<typeof diffState>['ops']) =>
  ops.map((o) => {
    switch (o.kind) {
      case 'route-replace':
      case 'route-delete':
        return `${o.kind} ${o.route.dst} via ${o.route.gateway} dev ${o.route.oif}${o.route.onlink ? ' onlink' : ''}`;
      case 'neigh-replace':
      case 'neigh-delete':
        return `${o.kind} ${o.neigh.ip} ${o.neigh.mac}`;
      case 'fdb-replace':
      case 'fdb-delete':
        return `${o.kind} ${o.fdb.mac} dst ${o.fdb.dst}`;
      default:
        return `${o.kind} ${o.nexthop.id} via ${o.nexthop.gateway} dev ${o.nexthop.oif}`;
    }
  });

describe('kernel state diff', () => {
  it('does nothing when the kernel matches', () => {
    const s = state(peer(1), peer(2));
    const { ops, repairs } = diffState(s, state(peer(2), peer(1)));
    assert.deepEqual(ops, []);
    assert.deepEqual(repairs, { added: 0, changed: 0, removed: 0 });
  });

  it('adds what is missing: neighbours and FDB before routes', () => {
    const { ops, repairs } = diffState(state(peer(1)), state());
    assert.deepEqual(describeOps(ops), [
      'neigh-replace 10.5.1.0 0e:00:00:00:00:01',
      'fdb-replace 0e:00:00:00:00:01 dst 192.168.0.1',
      'route-replace 10.5.1.0/24 via 10.5.1.0 dev 7 onlink',
    ]);
    assert.deepEqual(repairs, { added: 3, changed: 0, removed: 0 });
  });

  it('removes entries of peers that are gone first, routes before their next hops', () => {
    const { ops, repairs } = diffState(state(peer(1)), state(peer(1), peer(2)));
    assert.deepEqual(describeOps(ops), [
      'route-delete 10.5.2.0/24 via 10.5.2.0 dev 7 onlink',
      'neigh-delete 10.5.2.0 0e:00:00:00:00:02',
      'fdb-delete 0e:00:00:00:00:02 dst 192.168.0.2',
    ]);
    assert.deepEqual(repairs, { added: 0, changed: 0, removed: 3 });
  });

  it('rewrites entries that differ (a new VTEP MAC, a moved route)', () => {
    const moved = { ...peer(1, '0e:00:00:00:00:aa') };
    const have = state(peer(1));
    const want: DesiredState = { ...state(moved), routes: [{ ...moved.route, gateway: ip('192.168.0.1'), oif: 2, onlink: false }] };
    const { ops, repairs } = diffState(want, have);
    assert.deepEqual(describeOps(ops), [
      'fdb-delete 0e:00:00:00:00:01 dst 192.168.0.1',
      'neigh-replace 10.5.1.0 0e:00:00:00:00:aa',
      'fdb-replace 0e:00:00:00:00:aa dst 192.168.0.1',
      'route-replace 10.5.1.0/24 via 192.168.0.1 dev 2',
    ]);
    assert.deepEqual(repairs, { added: 1, changed: 2, removed: 1 });
  });
});

describe('kernel state diff with nexthop objects', () => {
  const nh = (id: number, gw: string) => ({ id, gateway: ip(gw), oif: 7, onlink: true });
  const viaNh = (n: number, id: number) => ({ ...peer(n).route, nhid: id });

  it('creates the nexthop before the route that uses it', () => {
    const want: DesiredState = { ...state(peer(1)), routes: [viaNh(1, 100)], nexthops: [nh(100, '10.5.1.0')] };
    assert.deepEqual(describeOps(diffState(want, state()).ops), [
      'neigh-replace 10.5.1.0 0e:00:00:00:00:01',
      'fdb-replace 0e:00:00:00:00:01 dst 192.168.0.1',
      'nexthop-replace 100 via 10.5.1.0 dev 7',
      'route-replace 10.5.1.0/24 via 10.5.1.0 dev 7 onlink',
    ]);
  });

  it('moves a plain route onto its nexthop, and deletes stale nexthops after their routes', () => {
    const want: DesiredState = { ...state(peer(1)), routes: [viaNh(1, 100)], nexthops: [nh(100, '10.5.1.0')] };
    const have: DesiredState = { ...state(peer(1), peer(2)), routes: [peer(1).route, viaNh(2, 101)], nexthops: [nh(101, '10.5.2.0')] };
    const { ops, repairs } = diffState(want, have);
    assert.deepEqual(describeOps(ops), [
      'route-delete 10.5.2.0/24 via 10.5.2.0 dev 7 onlink',
      'neigh-delete 10.5.2.0 0e:00:00:00:00:02',
      'fdb-delete 0e:00:00:00:00:02 dst 192.168.0.2',
      'nexthop-delete 101 via 10.5.2.0 dev 7',
      'nexthop-replace 100 via 10.5.1.0 dev 7',
      'route-replace 10.5.1.0/24 via 10.5.1.0 dev 7 onlink',
    ]);
    assert.deepEqual(repairs, { added: 1, changed: 1, removed: 4 });
  });

  it('leaves a route alone when it already uses the wanted nexthop', () => {
    const want: DesiredState = { ...state(peer(1)), routes: [viaNh(1, 100)], nexthops: [nh(100, '10.5.1.0')] };
    assert.deepEqual(diffState(want, want).ops, []);
  });
});

describe('vxlan options', () => {
  it("uses flannel's defaults", () => {
    assert.deepEqual(parseVxlanOptions({ Type: 'vxlan' }), {
      vni: 1,
      port: 8472,
      gbp: false,
      learning: false,
      directRouting: false,
      mtu: null,
      disableTxChecksumOffload: false,
    });
  });

  it('reads options case-insensitively and validates them', () => {
    const o = parseVxlanOptions({ Type: 'vxlan', vni: 42, PORT: 4789, DirectRouting: true, MTU: 9000 });
    assert.equal(o.vni, 42);
    assert.equal(o.port, 4789);
    assert.equal(o.directRouting, true);
    assert.equal(o.mtu, 9000);
    assert.throws(() => parseVxlanOptions({ VNI: 'one' }), /^ConfigError: Backend\.VNI "one": must be an integer$/);
    assert.throws(() => parseVxlanOptions({ VNI: 16777216 }), /Backend\.VNI 16777216: must be from 0 to 16777215/);
    assert.throws(() => parseVxlanOptions({ Port: 70000 }), /Backend\.Port 70000: must be from 0 to 65535/);
    assert.throws(() => parseVxlanOptions({ GBP: 'yes' }), /Backend\.GBP "yes": must be true or false/);
  });

  it('reads a VTEP MAC only from well-formed backend data', () => {
    assert.equal(vtepMacOf({ VNI: 1, VtepMAC: 'C6:D2:32:6F:8F:44' }), 'c6:d2:32:6f:8f:44');
    assert.equal(vtepMacOf({ VNI: 1, VtepMAC: 'c6:d2:32:6f:8f' }), null);
    assert.equal(vtepMacOf({ VNI: 1, VtepMAC: 7 }), null);
    assert.equal(vtepMacOf(null), null);
    assert.equal(vtepMacOf(undefined), null);
    assert.equal(vtepMacOf('{"VtepMAC":"c6:d2:32:6f:8f:44"}'), null);
  });
});
