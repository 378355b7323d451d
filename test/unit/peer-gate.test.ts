import assert from 'node:assert/strict';

import { checkPeer, PeerGate, type PeerPolicy, type PeerProblem, type Rejection } from '../../src/subnet/peer-gate.js';
import { leaseId, type Lease, type LeaseEvent } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const OWN: Lease = lease('10.5.1.0/24', '192.168.100.1');

function lease(subnet: string, publicIP: string, extra: { v6?: string; v6ip?: string; claimedAt?: bigint; type?: string; mac?: string } = {}): Lease {
  return {
    subnet: IPNet.parse(subnet),
    ipv6Subnet: extra.v6 ? IPNet.parse(extra.v6) : null,
    attrs: {
      publicIP: IPAddr.parse(publicIP),
      publicIPv6: extra.v6ip ? IPAddr.parse(extra.v6ip) : null,
      backendType: extra.type ?? 'vxlan',
      backendData: { VNI: 1, VtepMAC: extra.mac ?? '0e:00:00:00:00:02' },
    },
    reservation: false,
    expiration: null,
    ...(extra.claimedAt !== undefined ? { claimedAt: extra.claimedAt } : {}),
  };
}

function policy(over: Partial<PeerPolicy> = {}): PeerPolicy {
  return {
    network: IPNet.parse('10.5.0.0/16'),
    subnetLen: 24,
    ipv6Network: null,
    ipv6SubnetLen: 64,
    ownLease: () => OWN,
    localAddresses: () => [IPAddr.parse('192.168.100.1'), IPAddr.parse('127.0.0.1')],
    backendProblem: (l) => (l.attrs.backendType === 'vxlan' ? null : { reason: 'backend-type', detail: 'not vxlan' }),
    ...over,
  };
}

const reasonOf = (l: Lease, p = policy()): string | null => checkPeer(l, p)?.reason ?? null;
const added = (l: Lease): LeaseEvent => ({ type: 'added', lease: l });
const removed = (l: Lease): LeaseEvent => ({ type: 'removed', lease: l });
const ids = (events: readonly LeaseEvent[]): string[] => events.map((e) => `${e.type} ${leaseId(e.lease)}`);

function gate(p = policy()): { g: PeerGate; rejects: Rejection[]; cleared: string[] } {
  const rejects: Rejection[] = [];
  const cleared: string[] = [];
  const g = new PeerGate(p, { onReject: (r) => rejects.push(r), onClear: (l) => cleared.push(leaseId(l)) });
  return { g, rejects, cleared };
}

describe('peer gate: one lease on its own', () => {
  it('accepts a peer inside the network with the configured size, a unicast public address and the right backend', () => {
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2')), null);
  });

  it('refuses subnets outside the network, of another size, or overlapping ours', () => {
    const table: Array<[string, string]> = [
      ['192.168.100.0/24', 'outside-network'], // the underlay
      ['8.8.8.0/24', 'outside-network'],
      ['10.0.0.0/8', 'outside-network'], // larger than the network
      ['10.5.0.0/16', 'subnet-size'], // the whole network
      ['10.5.2.0/25', 'subnet-size'],
      ['10.5.1.0/24', 'overlaps-own'],
    ];
    for (const [subnet, reason] of table) assert.equal(reasonOf(lease(subnet, '192.168.100.2')), reason, subnet);
    // The upper half of our /24 is caught by its size first; with a /25 network size it overlaps ours.
    assert.equal(reasonOf(lease('10.5.1.128/25', '192.168.100.2'), policy({ subnetLen: 25 })), 'overlaps-own');
  });

  it('refuses public addresses that are not a usable unicast address of another node', () => {
    for (const ip of ['0.0.0.0', '127.0.0.1', '127.5.5.5', '169.254.1.1', '224.0.0.1', '239.1.1.1', '255.255.255.255', '192.168.100.1']) {
      assert.equal(reasonOf(lease('10.5.2.0/24', ip)), 'public-ip', ip);
    }
  });

  it('asks the backend last', () => {
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2', { type: 'host-gw' })), 'backend-type');
    const p: PeerProblem = { reason: 'backend-data', detail: 'bad MAC' };
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2'), policy({ backendProblem: () => p })), 'backend-data');
  });

  it('checks the IPv6 half in dual-stack: network, size and address', () => {
    const dual = policy({ ipv6Network: IPNet.parse('fd00:5::/48') });
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2', { v6: 'fd00:5:0:2::/64', v6ip: 'fd00:100::2' }), dual), null);
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2', { v6: 'fd00:6::/64', v6ip: 'fd00:100::2' }), dual), 'outside-network');
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2', { v6: 'fd00:5:0:2::/64', v6ip: 'fe80::1' }), dual), 'public-ip');
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2', { v6: 'fd00:5:0:2::/64' }), dual), 'public-ip');
  });
});

describe('peer gate: the set', () => {
  it('passes valid leases through as they come and holds back rejected ones, reporting each once', () => {
    const { g, rejects } = gate();
    const a = lease('10.5.2.0/24', '192.168.100.2');
    const bad = lease('8.8.8.0/24', '192.168.100.3');
    assert.deepEqual(ids(g.apply([added(a), added(bad)])), ['added 10.5.2.0-24']);
    assert.deepEqual(rejects.map((r) => [leaseId(r.lease), r.reason]), [['8.8.8.0-24', 'outside-network']]);
    // The same bad lease again (a renewal): no second report, nothing for the backend.
    assert.deepEqual(ids(g.apply([added(bad)])), []);
    assert.equal(rejects.length, 1);
    assert.deepEqual(g.peers.map(leaseId), ['10.5.2.0-24']);
    assert.deepEqual(g.rejections.map((r) => leaseId(r.lease)), ['8.8.8.0-24']);
    assert.deepEqual([g.knownCount, g.rejectedCount], [2, 1]);
  });

  it('programs a lease once it becomes valid, and removes one that turns bad', () => {
    const { g, rejects, cleared } = gate();
    const badMac = lease('10.5.2.0/24', '192.168.100.2', { type: 'udp' });
    const good = lease('10.5.2.0/24', '192.168.100.2');
    assert.deepEqual(ids(g.apply([added(badMac)])), []);
    assert.deepEqual(ids(g.apply([added(good)])), ['added 10.5.2.0-24']);
    assert.deepEqual(cleared, ['10.5.2.0-24']);
    const hijack = lease('10.5.2.0/24', '192.168.100.1'); // now claims our own address
    assert.deepEqual(ids(g.apply([added(hijack)])), ['removed 10.5.2.0-24']);
    assert.deepEqual(rejects.map((r) => r.reason), ['backend-type', 'public-ip']);
    assert.deepEqual(ids(g.apply([removed(hijack)])), []);
    assert.deepEqual(g.rejections, []);
  });

  it('of two claims on one subnet the older wins, and the other takes over when it goes', () => {
    const { g, rejects } = gate(policy({ ipv6Network: IPNet.parse('fd00:5::/48') }));
    const old = lease('10.5.2.0/24', '192.168.100.2', { claimedAt: 5n });
    const newer = lease('10.5.2.0/24', '192.168.100.3', { v6: 'fd00:5:0:9::/64', v6ip: 'fd00:100::3', claimedAt: 9n });
    assert.deepEqual(ids(g.apply([added(newer)])), ['added 10.5.2.0-24&fd00:5:0:9::-64']);
    // The older claim arrives (e.g. after a watch gap): it wins, the newer one is withdrawn.
    assert.deepEqual(ids(g.apply([added(old)])), ['added 10.5.2.0-24', 'removed 10.5.2.0-24&fd00:5:0:9::-64']);
    assert.deepEqual(rejects.map((r) => [leaseId(r.lease), r.reason]), [['10.5.2.0-24&fd00:5:0:9::-64', 'overlaps-peer']]);
    assert.deepEqual(ids(g.apply([removed(old)])), ['added 10.5.2.0-24&fd00:5:0:9::-64', 'removed 10.5.2.0-24']);
  });

  it('decides overlaps the same way whatever the order of arrival (ties: the lease id)', () => {
    const x = lease('10.5.3.0/24', '192.168.100.4');
    const y = lease('10.5.3.0/24', '192.168.100.5', { v6: 'fd00:5:0:3::/64', v6ip: 'fd00:100::5' });
    const p = policy({ ipv6Network: IPNet.parse('fd00:5::/48') });
    const one = gate(p).g;
    one.apply([added(x), added(y)]);
    const two = gate(p).g;
    two.apply([added(y)]);
    two.apply([added(x)]);
    assert.deepEqual(one.peers.map(leaseId), two.peers.map(leaseId));
    assert.equal(one.peers.length, 1);
  });

  it('rechecks everything when our own lease moves onto a peer subnet', () => {
    let own: Lease = OWN;
    const { g } = gate(policy({ ownLease: () => own }));
    const peer = lease('10.5.7.0/24', '192.168.100.7');
    g.apply([added(peer)]);
    own = lease('10.5.7.0/24', '192.168.100.1');
    assert.deepEqual(ids(g.recheckAll()), ['removed 10.5.7.0-24']);
    own = OWN;
    assert.deepEqual(ids(g.recheckAll()), ['added 10.5.7.0-24']);
  });

  it('costs what an event touches: an event does not re-check unrelated leases', () => {
    let checks = 0;
    const { g } = gate(
      policy({
        backendProblem: () => {
          checks++;
          return null;
        },
      }),
    );
    const many = Array.from({ length: 500 }, (_, i) => lease(`10.5.${(i % 250) + 2}.0/24`, `192.168.${100 + Math.floor(i / 250)}.${(i % 250) + 2}`, { claimedAt: BigInt(i) }));
    g.apply(many.map(added));
    checks = 0;
    g.apply([added(lease('10.5.9.0/24', '192.168.100.99', { claimedAt: 999n }))]);
    assert.equal(checks, 1);
  });
});

describe('peer gate: Kubernetes mode (no SubnetLen: podCIDRs are sized by the controller manager)', () => {
  it('takes any size inside the network, but never one that overlaps ours', () => {
    const kube = policy({ subnetLen: 0 });
    assert.equal(reasonOf(lease('10.5.2.0/24', '192.168.100.2'), kube), null);
    assert.equal(reasonOf(lease('10.5.8.0/29', '192.168.100.2'), kube), null);
    assert.equal(reasonOf(lease('10.5.0.0/16', '192.168.100.2'), kube), 'overlaps-own');
    assert.equal(reasonOf(lease('10.5.0.0/23', '192.168.100.2'), kube), 'overlaps-own');
  });

  it('finds overlaps between subnets of different sizes: the older claim wins, in both directions', () => {
    const { g } = gate(policy({ subnetLen: 0 }));
    const small = lease('10.5.40.8/29', '192.168.100.2', { claimedAt: 1n });
    const big = lease('10.5.40.0/22', '192.168.100.3', { claimedAt: 2n });
    const inside = lease('10.5.42.0/24', '192.168.100.4', { claimedAt: 3n });
    assert.deepEqual(ids(g.apply([added(big), added(small), added(inside)])), ['added 10.5.40.8-29']);
    assert.deepEqual(g.rejections.map((r) => [leaseId(r.lease), r.reason]).sort(), [['10.5.40.0-22', 'overlaps-peer'], ['10.5.42.0-24', 'overlaps-peer']]);
    // The small one goes: the big one is the oldest claim left, the one inside it stays out.
    assert.deepEqual(ids(g.apply([removed(small)])), ['added 10.5.40.0-22', 'removed 10.5.40.8-29']);
    assert.deepEqual(ids(g.apply([removed(big)])), ['added 10.5.42.0-24', 'removed 10.5.40.0-22']);
  });
});
