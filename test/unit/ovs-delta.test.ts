// The ovs backend's event path, pure: a batch's net changes → which peers' flows go and come, the
// bundle's flow mods in order, and the route ops.
import assert from 'node:assert/strict';

import { PeerSet } from '../../src/backend/peer-set.js';
import { applyDelta, deltaFlowMods, deltaRouteOps, isEmptyDelta, peerKey, planPeerDelta } from '../../src/backend/ovs/delta.js';
import { peerCookie, renderFlowMods, type PeerNode } from '../../src/backend/ovs/pipeline.js';
import type { Lease, LeaseEvent } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const node = { vni: 1, gatewayMAC: '0a:58:0a:f4:01:01' };

function lease(subnet: string, publicIP: string, extra: Partial<Lease> = {}): Lease {
  return {
    subnet: IPNet.parse(subnet),
    ipv6Subnet: null,
    attrs: { publicIP: IPAddr.parse(publicIP), publicIPv6: null, backendType: 'ovs', backendData: { VNI: 1 } },
    reservation: false,
    expiration: null,
    ...extra,
  };
}

const usable = (l: Lease): PeerNode | null => (l.attrs.backendType === 'ovs' && l.subnet ? { subnet: l.subnet, publicIP: l.attrs.publicIP } : null);
const names = (ps: readonly PeerNode[]) => ps.map((p) => `${p.subnet.toString()}@${p.publicIP.toString()}`);

/** A backend's state: the daemon's set and the model, both at `leases`. */
function state(leases: readonly Lease[]): { set: PeerSet; model: Map<string, PeerNode> } {
  const set = new PeerSet();
  set.reset(leases);
  const model = new Map<string, PeerNode>();
  for (const l of leases) {
    const p = usable(l);
    if (p) model.set(peerKey(p), p);
  }
  return { set, model };
}

describe('ovs backend: lease events as deltas (pure)', () => {
  const a = lease('10.244.2.0/24', '192.168.0.2');
  const b = lease('10.244.3.0/24', '192.168.0.3');

  it('adds a new peer, removes a gone one, rewrites a changed one, and leaves the rest alone', () => {
    const { set, model } = state([a, b]);
    const c = lease('10.244.4.0/24', '192.168.0.4');
    const b2 = lease('10.244.3.0/24', '192.168.0.33');
    const batch: LeaseEvent[] = [
      { type: 'added', lease: c },
      { type: 'removed', lease: a },
      { type: 'added', lease: b2 },
    ];
    const d = planPeerDelta(model, set.apply(batch), usable);
    assert.deepEqual(names(d.remove).sort(), ['10.244.2.0/24@192.168.0.2', '10.244.3.0/24@192.168.0.3']);
    assert.deepEqual(names(d.add).sort(), ['10.244.3.0/24@192.168.0.33', '10.244.4.0/24@192.168.0.4']);
    applyDelta(model, d);
    assert.deepEqual(names([...model.values()]).sort(), ['10.244.3.0/24@192.168.0.33', '10.244.4.0/24@192.168.0.4']);
  });

  it('a peer that ends as programmed, or a lease the backend cannot use, is no change', () => {
    const { set, model } = state([a]);
    const vxlan = lease('10.244.9.0/24', '192.168.0.9', { attrs: { ...a.attrs, backendType: 'vxlan' } });
    const batch: LeaseEvent[] = [
      { type: 'removed', lease: a },
      { type: 'added', lease: a },
      { type: 'added', lease: vxlan },
    ];
    assert.equal(isEmptyDelta(planPeerDelta(model, set.apply(batch), usable)), true);
  });

  it('a lease replaced by another for the same subnet is one rewrite of that subnet, deletes first', () => {
    const { set, model } = state([a]);
    // Same IPv4 subnet, another lease id (an IPv6 subnet appeared): the old id goes, the new one comes.
    const a6 = lease('10.244.2.0/24', '192.168.0.22', { ipv6Subnet: IPNet.parse('fd00:2::/64') });
    const d = planPeerDelta(model, set.apply([{ type: 'added', lease: a6 }, { type: 'removed', lease: a }]), usable);
    assert.deepEqual(names(d.remove), ['10.244.2.0/24@192.168.0.2']);
    assert.deepEqual(names(d.add), ['10.244.2.0/24@192.168.0.22']);
    // The route is replaced, not deleted after being replaced.
    assert.deepEqual(
      deltaRouteOps(d, 9).map((o) => o.kind),
      ['route-replace'],
    );
    const mods = renderFlowMods(deltaFlowMods(d, 3, node)).trim().split('\n');
    assert.equal(mods[0], `delete cookie=0x${peerCookie(3, a.subnet!).toString(16)}/0xffffffffffffffff`);
    assert.equal(mods.length, 4);
    assert.ok(mods.slice(1).every((l) => l.startsWith(`add cookie=0x${peerCookie(3, a.subnet!).toString(16)},`)), mods.join('\n'));
    assert.match(mods.join('\n'), /192\.168\.0\.22->tun_dst/);
  });

  it('routes: replace for an added peer via its gateway on the gateway port, delete by destination for a removed one', () => {
    const { set, model } = state([a]);
    const c = lease('10.244.4.0/24', '192.168.0.4');
    const d = planPeerDelta(model, set.apply([{ type: 'removed', lease: a }, { type: 'added', lease: c }]), usable);
    assert.deepEqual(deltaRouteOps(d, 7), [
      { kind: 'route-delete', route: { dst: a.subnet } },
      { kind: 'route-replace', route: { dst: c.subnet, gateway: IPAddr.parse('10.244.4.1'), oif: 7, onlink: true } },
    ]);
  });

  it('removing a peer the backend never programmed deletes nothing', () => {
    const { set, model } = state([]);
    set.reset([a]); // the daemon knew it, the backend had not programmed it (a refused pass)
    assert.equal(isEmptyDelta(planPeerDelta(model, set.apply([{ type: 'removed', lease: a }]), usable)), true);
  });
});
