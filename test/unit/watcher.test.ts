import assert from 'node:assert/strict';
import type { Lease, LeaseEvent } from '../../src/subnet/lease.js';
import { LeaseWatcher } from '../../src/subnet/watcher.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

/** A vxlan lease for `subnet` (and optionally `v6`), its attrs derived from `mac`. */
function lease(subnet: string | null, opts: { v6?: string; mac?: string; ip?: string; reservation?: boolean; exp?: number } = {}): Lease {
  return {
    subnet: subnet ? IPNet.parse(subnet) : null,
    ipv6Subnet: opts.v6 ? IPNet.parse(opts.v6) : null,
    attrs: {
      publicIP: IPAddr.parse(opts.ip ?? '192.168.0.1'),
      publicIPv6: null,
      backendType: 'vxlan',
      backendData: { VNI: 1, VtepMAC: opts.mac ?? 'aa:aa:aa:aa:aa:01' },
    },
    reservation: opts.reservation ?? false,
    expiration: opts.exp === undefined ? null : new Date(opts.exp),
  };
}

/** Key-only lease, as an etcd DELETE event reports it. */
function keyOnly(subnet: string | null, v6?: string): Pick<Lease, 'subnet' | 'ipv6Subnet'> {
  return { subnet: subnet ? IPNet.parse(subnet) : null, ipv6Subnet: v6 ? IPNet.parse(v6) : null };
}

/** One line per event, e.g. "added 10.5.1.0/24 aa:..:01", to compare batches exactly. */
function show(batch: readonly LeaseEvent[]): string[] {
  return batch.map((e) => {
    const data = e.lease.attrs.backendData;
    const mac = data !== null && typeof data === 'object' && !Array.isArray(data) && typeof data.VtepMAC === 'string' ? data.VtepMAC : '-';
    const nets = [e.lease.subnet?.toString(), e.lease.ipv6Subnet?.toString()].filter(Boolean).join('&');
    return `${e.type} ${nets} ${mac}`;
  });
}

function peers(w: LeaseWatcher): string[] {
  return w.peers.map((l) => [l.subnet?.toString(), l.ipv6Subnet?.toString()].filter(Boolean).join('&')).sort();
}

const OWN = lease('10.5.9.0/24', { mac: 'ee:ee:ee:ee:ee:ee' });
const A = lease('10.5.1.0/24', { mac: 'aa:aa:aa:aa:aa:01' });
const B = lease('10.5.2.0/24', { mac: 'aa:aa:aa:aa:aa:02' });
const C = lease('10.5.3.0/24', { mac: 'aa:aa:aa:aa:aa:03' });

describe('LeaseWatcher', () => {
  describe('reset', () => {
    it('emits Added for every lease of the first snapshot, skipping our own', () => {
      const w = new LeaseWatcher(() => OWN);
      assert.deepEqual(show(w.reset([A, OWN, B])), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:01', 'added 10.5.2.0/24 aa:aa:aa:aa:aa:02']);
      assert.deepEqual(peers(w), ['10.5.1.0/24', '10.5.2.0/24']);
    });

    it('emits Added for new leases and Removed (with the stored attrs) for vanished ones', () => {
      const w = new LeaseWatcher(() => OWN);
      w.reset([A, B]);
      const batch = w.reset([B, C, OWN]);
      assert.deepEqual(show(batch), ['added 10.5.3.0/24 aa:aa:aa:aa:aa:03', 'removed 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
      assert.equal(batch[1]!.lease, A, 'the removal carries the lease as it was stored');
      assert.deepEqual(peers(w), ['10.5.2.0/24', '10.5.3.0/24']);
    });

    it('emits nothing for an identical snapshot, or one that differs only in expiration', () => {
      const w = new LeaseWatcher(() => OWN);
      w.reset([A, B]);
      assert.deepEqual(w.reset([A, B]), []);
      const renewed = lease('10.5.1.0/24', { mac: 'aa:aa:aa:aa:aa:01', exp: 1_800_000_000_000 });
      assert.deepEqual(w.reset([B, renewed]), []);
      assert.equal(w.peers.find((l) => l.subnet?.toString() === '10.5.1.0/24')?.expiration?.getTime(), 1_800_000_000_000);
    });

    it('emits Added for a lease whose attributes changed while not watching (weft improvement)', () => {
      const w = new LeaseWatcher(() => OWN);
      w.reset([A, B]);
      const newMac = lease('10.5.1.0/24', { mac: 'aa:aa:aa:aa:aa:99' });
      const newIp = lease('10.5.2.0/24', { mac: 'aa:aa:aa:aa:aa:02', ip: '192.168.0.2' });
      assert.deepEqual(show(w.reset([newMac, newIp])), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:99', 'added 10.5.2.0/24 aa:aa:aa:aa:aa:02']);
      const becameReservation = lease('10.5.1.0/24', { mac: 'aa:aa:aa:aa:aa:99', reservation: true });
      assert.deepEqual(show(w.reset([becameReservation, newIp])), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:99']);
    });

    it('an empty snapshot removes every peer', () => {
      const w = new LeaseWatcher(() => OWN);
      w.reset([A, B]);
      assert.deepEqual(show(w.reset([])), ['removed 10.5.1.0/24 aa:aa:aa:aa:aa:01', 'removed 10.5.2.0/24 aa:aa:aa:aa:aa:02']);
      assert.deepEqual(w.peers, []);
    });

    it('keys dual-stack leases on both subnets', () => {
      const w = new LeaseWatcher(() => null);
      const d1 = lease('10.5.1.0/24', { v6: 'fd00:5:0:1::/64' });
      const d2 = lease('10.5.1.0/24', { v6: 'fd00:5:0:2::/64' });
      w.reset([d1]);
      assert.deepEqual(show(w.reset([d2])), [
        'added 10.5.1.0/24&fd00:5:0:2::/64 aa:aa:aa:aa:aa:01',
        'removed 10.5.1.0/24&fd00:5:0:1::/64 aa:aa:aa:aa:aa:01',
      ]);
      const v6only = lease(null, { v6: 'fd00:5:0:3::/64' });
      assert.deepEqual(show(w.reset([d2, v6only])), ['added fd00:5:0:3::/64 aa:aa:aa:aa:aa:01']);
    });
  });

  describe('update', () => {
    it('added, then an unchanged re-add (renewal), emits nothing the second time', () => {
      const w = new LeaseWatcher(() => OWN);
      assert.deepEqual(show(w.update([{ type: 'added', lease: A }])), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
      const renewed = lease('10.5.1.0/24', { mac: 'aa:aa:aa:aa:aa:01', exp: 1_900_000_000_000 });
      assert.deepEqual(w.update([{ type: 'added', lease: renewed }]), []);
      assert.equal(w.peers[0]!.expiration?.getTime(), 1_900_000_000_000, 'the stored lease is refreshed');
    });

    it('a re-add with changed attributes emits Added with the new attributes', () => {
      const w = new LeaseWatcher(() => OWN);
      w.update([{ type: 'added', lease: A }]);
      const moved = lease('10.5.1.0/24', { mac: 'aa:aa:aa:aa:aa:77' });
      assert.deepEqual(show(w.update([{ type: 'added', lease: moved }])), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:77']);
      assert.equal(w.peers[0], moved);
    });

    it('a removal carries the stored attrs although the event has only the key', () => {
      const w = new LeaseWatcher(() => OWN);
      w.update([{ type: 'added', lease: A }, { type: 'added', lease: B }]);
      const batch = w.update([{ type: 'removed', lease: keyOnly('10.5.1.0/24') }]);
      assert.deepEqual(show(batch), ['removed 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
      assert.equal(batch[0]!.lease, A);
      assert.deepEqual(peers(w), ['10.5.2.0/24']);
    });

    it('removal of an unknown lease emits nothing', () => {
      const w = new LeaseWatcher(() => OWN);
      w.update([{ type: 'added', lease: A }]);
      assert.deepEqual(w.update([{ type: 'removed', lease: keyOnly('10.5.4.0/24') }]), []);
      assert.deepEqual(w.update([{ type: 'removed', lease: keyOnly('10.5.1.0/24', 'fd00::/64') }]), [], 'different identity');
      assert.deepEqual(peers(w), ['10.5.1.0/24']);
      w.update([{ type: 'removed', lease: keyOnly('10.5.1.0/24') }]);
      assert.deepEqual(w.update([{ type: 'removed', lease: keyOnly('10.5.1.0/24') }]), [], 'second removal');
    });

    it('gives the net effect per lease, in the order the leases were first seen', () => {
      const w = new LeaseWatcher(() => OWN);
      const batch = w.update([
        { type: 'added', lease: B },
        { type: 'added', lease: A },
        { type: 'removed', lease: keyOnly('10.5.2.0/24') },
        { type: 'added', lease: C },
        { type: 'added', lease: B },
      ]);
      assert.deepEqual(show(batch), [
        'added 10.5.2.0/24 aa:aa:aa:aa:aa:02',
        'added 10.5.1.0/24 aa:aa:aa:aa:aa:01',
        'added 10.5.3.0/24 aa:aa:aa:aa:aa:03',
      ]);
      assert.deepEqual(peers(w), ['10.5.1.0/24', '10.5.2.0/24', '10.5.3.0/24']);
    });

    it('drops events for our own lease', () => {
      const w = new LeaseWatcher(() => OWN);
      const ownRenewed = lease('10.5.9.0/24', { mac: 'ee:ee:ee:ee:ee:ee', exp: 1 });
      assert.deepEqual(w.update([{ type: 'added', lease: OWN }, { type: 'added', lease: ownRenewed }]), []);
      assert.deepEqual(w.update([{ type: 'removed', lease: keyOnly('10.5.9.0/24') }]), []);
      assert.deepEqual(w.peers, []);
    });

    it('apply dispatches snapshots to reset and event lists to update', () => {
      const w = new LeaseWatcher(() => OWN);
      assert.deepEqual(show(w.apply({ kind: 'snapshot', leases: [A, OWN] })), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
      assert.deepEqual(show(w.apply({ kind: 'events', events: [{ type: 'added', lease: B }] })), ['added 10.5.2.0/24 aa:aa:aa:aa:aa:02']);
      assert.deepEqual(show(w.apply({ kind: 'snapshot', leases: [B] })), ['removed 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
    });
  });

  describe('own lease', () => {
    it('matches our lease by the families both carry (flannel sameSubnet)', () => {
      const ownDual = lease('10.5.9.0/24', { v6: 'fd00:5:0:9::/64' });
      const w = new LeaseWatcher(() => ownDual);
      // Same v4 subnet, no v6 on the event: ours.
      assert.deepEqual(w.update([{ type: 'added', lease: lease('10.5.9.0/24') }]), []);
      // Same v6 subnet, no v4 on the event: ours.
      assert.deepEqual(w.update([{ type: 'added', lease: lease(null, { v6: 'fd00:5:0:9::/64' }) }]), []);
      // Same v4 but a different v6: not ours.
      assert.deepEqual(show(w.update([{ type: 'added', lease: lease('10.5.9.0/24', { v6: 'fd00:5:0:8::/64' }) }])), [
        'added 10.5.9.0/24&fd00:5:0:8::/64 aa:aa:aa:aa:aa:01',
      ]);
      assert.deepEqual(new LeaseWatcher(() => ownDual).reset([ownDual, lease('10.5.9.0/24')]), []);
    });

    it('with no own lease (null) every lease is a peer', () => {
      const w = new LeaseWatcher(() => null);
      assert.deepEqual(show(w.reset([OWN])), ['added 10.5.9.0/24 ee:ee:ee:ee:ee:ee']);
    });

    it('is asked each time: a later change of our lease is honoured by reset and update', () => {
      let own: Lease | null = OWN;
      const w = new LeaseWatcher(() => own);
      w.reset([A, OWN]);
      assert.deepEqual(peers(w), ['10.5.1.0/24']);

      // We re-acquired 10.5.4.0/24: the old subnet belongs to someone else now.
      const NEW_OWN = lease('10.5.4.0/24', { mac: 'ee:ee:ee:ee:ee:ee' });
      own = NEW_OWN;
      assert.deepEqual(show(w.update([{ type: 'added', lease: OWN }])), ['added 10.5.9.0/24 ee:ee:ee:ee:ee:ee']);
      assert.deepEqual(w.update([{ type: 'added', lease: NEW_OWN }]), []);
      assert.deepEqual(peers(w), ['10.5.1.0/24', '10.5.9.0/24']);
      assert.deepEqual(show(w.reset([A, OWN, NEW_OWN])), []);

      own = null;
      assert.deepEqual(show(w.reset([A, OWN, NEW_OWN])), ['added 10.5.4.0/24 ee:ee:ee:ee:ee:ee']);
    });

    it('a peer whose subnet becomes ours leaves the peer set (reset)', () => {
      let own: Lease | null = OWN;
      const w = new LeaseWatcher(() => own);
      w.reset([A, B]);
      own = A;
      assert.deepEqual(show(w.reset([A, B])), ['removed 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
      assert.deepEqual(peers(w), ['10.5.2.0/24']);
    });

    it('a lease that was ours becomes a peer when our lease moves to another subnet', () => {
      let own: Lease | null = OWN;
      const w = new LeaseWatcher(() => own);
      // Someone else wrote a lease on our subnet (our key overwritten): dropped while it is ours.
      const squatter = lease('10.5.9.0/24', { mac: 'cc:cc:cc:cc:cc:09' });
      assert.deepEqual(w.update([{ type: 'added', lease: squatter }]), []);
      own = lease('10.5.7.0/24', { mac: 'ee:ee:ee:ee:ee:07' });
      // An empty change set re-checks the own lease: the squatter is now a peer.
      assert.deepEqual(show(w.update([])), ['added 10.5.9.0/24 cc:cc:cc:cc:cc:09']);
      assert.deepEqual(peers(w), ['10.5.9.0/24']);
    });

    it('a peer whose subnet becomes ours leaves the peer set (update)', () => {
      let own: Lease | null = OWN;
      const w = new LeaseWatcher(() => own);
      w.update([{ type: 'added', lease: A }, { type: 'added', lease: B }]);
      // We now hold 10.5.1.0/24 and the store reports our put of it.
      own = lease('10.5.1.0/24', { mac: 'ee:ee:ee:ee:ee:ee' });
      const batch = w.update([{ type: 'added', lease: own }]);
      assert.deepEqual(peers(w), ['10.5.2.0/24'], 'our own subnet must never be listed as a peer');
      // Same outcome as the reset path above: the stale peer is removed, with its stored attrs.
      assert.deepEqual(show(batch), ['removed 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
    });
  });
});
