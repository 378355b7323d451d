// The kernel model against a simulated kernel: after any sequence of peer changes, refused
// operations, full passes and hand-made drift, sending the model's deltas leaves the kernel holding
// exactly what the peers want — and a delta only ever touches the changed peers' entries.
import assert from 'node:assert/strict';

import { diffState, type DesiredState, type KernelOp, type NexthopSpec, type RouteSpec } from '../../src/backend/kernel/diff.js';
import { fdbKey, KernelModel, neighKey, routeKey, type PeerEntries } from '../../src/backend/kernel/model.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const VX = 7; // the vxlan device's ifindex: its gateway routes go through nexthops
const ETH = 2;

/** A kernel as a map per kind, fed the same operations netlink would get. */
class FakeKernel {
  routes = new Map<string, RouteSpec>();
  neighbours = new Map<string, { ifindex: number; ip: IPAddr; mac: string }>();
  fdb = new Map<string, { ifindex: number; mac: string; dst: IPAddr }>();
  nexthops = new Map<number, NexthopSpec>();
  /** Ids other tools hold. */
  foreign = new Set<number>([0x57000001]);

  apply(ops: readonly KernelOp[], refuse: (op: KernelOp) => boolean = () => false): Set<KernelOp> {
    const refused = new Set<KernelOp>();
    for (const op of ops) {
      if (refuse(op)) {
        refused.add(op);
        continue;
      }
      switch (op.kind) {
        case 'route-replace':
          if (op.route.nhid && !this.nexthops.has(op.route.nhid)) throw new Error(`route ${op.route.dst.toString()} through missing nexthop ${op.route.nhid}`);
          this.routes.set(routeKey(op.route), op.route);
          break;
        case 'route-delete':
          this.routes.delete(routeKey(op.route));
          break;
        case 'neigh-replace':
          this.neighbours.set(neighKey(op.neigh), op.neigh);
          break;
        case 'neigh-delete':
          this.neighbours.delete(neighKey(op.neigh));
          break;
        case 'fdb-replace':
          this.fdb.set(fdbKey(op.fdb), op.fdb);
          break;
        case 'fdb-delete':
          this.fdb.delete(fdbKey(op.fdb));
          break;
        case 'nexthop-replace':
          if (this.foreign.has(op.nexthop.id)) throw new Error(`took a foreign nexthop id ${op.nexthop.id}`);
          this.nexthops.set(op.nexthop.id, op.nexthop);
          break;
        case 'nexthop-delete':
          this.nexthops.delete(op.nexthop.id);
          // The kernel takes the routes through a deleted nexthop along.
          for (const [k, r] of this.routes) if (r.nhid === op.nexthop.id) this.routes.delete(k);
          break;
      }
    }
    return refused;
  }

  /** What the forwarding looks like, nexthop ids resolved: comparable with what the peers want. */
  forwarding(): string[] {
    const routes = [...this.routes.values()].map((r) => {
      const nh = r.nhid ? this.nexthops.get(r.nhid) : undefined;
      const via = nh ? nh.gateway.toString() : (r.gateway?.toString() ?? '-');
      return `route ${r.dst.toString()} via ${via} dev ${nh ? nh.oif : r.oif}`;
    });
    return [...routes, ...[...this.neighbours.keys()].map((k) => `neigh ${k} ${this.neighbours.get(k)!.mac}`), ...[...this.fdb.keys()].map((k) => `fdb ${k}`)].sort();
  }
}

function wantedForwarding(peers: ReadonlyMap<string, PeerEntries>): string[] {
  const routes = new Map<string, string>();
  const neigh = new Map<string, string>();
  const fdb = new Set<string>();
  for (const e of peers.values()) {
    for (const r of e.routes) routes.set(routeKey(r), `route ${r.dst.toString()} via ${r.gateway?.toString() ?? '-'} dev ${r.oif}`);
    for (const n of e.neighbours) neigh.set(neighKey(n), `neigh ${neighKey(n)} ${n.mac}`);
    for (const f of e.fdb) fdb.add(`fdb ${fdbKey(f)}`);
  }
  return [...routes.values(), ...neigh.values(), ...fdb].sort();
}

/** A seeded PRNG (mulberry32): a failure names its seed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A vxlan-style peer: neighbour + FDB + onlink route through the device; some peers share a VTEP. */
function vxlanEntries(i: number, rnd: () => number): PeerEntries {
  const subnet = IPNet.parse(`10.1.${i}.0/24`);
  const vtep = Math.floor(rnd() * 40);
  const mac = `0e:00:00:00:00:${vtep.toString(16).padStart(2, '0')}`;
  const publicIP = IPAddr.parse(`172.16.0.${vtep + 2}`);
  if (rnd() < 0.15) return { routes: [{ dst: subnet, gateway: publicIP, oif: ETH, onlink: false }], neighbours: [], fdb: [] }; // DirectRouting
  return {
    routes: [{ dst: subnet, gateway: subnet.ip, oif: VX, onlink: true }],
    neighbours: [{ ifindex: VX, ip: subnet.ip, mac }],
    fdb: [{ ifindex: VX, mac, dst: publicIP }],
  };
}

/** A full pass as the dataplane runs it: diff against the kernel, then the model takes what it left. */
function fullPass(model: KernelModel, kernel: FakeKernel, peers: ReadonlyMap<string, PeerEntries>): void {
  // The model's own desired form (nexthop ids kept) is what a full pass adopts.
  const desired: DesiredState = {
    routes: [...new Map([...peers.values()].flatMap((e) => e.routes.map((r) => [routeKey(r), r] as const))).values()],
    neighbours: [...new Map([...peers.values()].flatMap((e) => e.neighbours.map((n) => [neighKey(n), n] as const))).values()],
    fdb: [...new Map([...peers.values()].flatMap((e) => e.fdb.map((f) => [fdbKey(f), f] as const))).values()],
  };
  // Nexthops: adopt the kernel's ones with the same next hop, else take free ids.
  const taken = new Set([...kernel.nexthops.keys(), ...kernel.foreign]);
  const byHop = new Map([...kernel.nexthops.values()].map((n) => [`${n.gateway.toString()} ${n.oif}`, n]));
  let next = 0x57000000;
  const nexthops = new Map<string, NexthopSpec>();
  const routes = desired.routes.map((r) => {
    if (r.oif !== VX || !r.gateway) return r;
    const k = `${r.gateway.toString()} ${r.oif}`;
    let nh = nexthops.get(k) ?? byHop.get(k);
    if (!nh) {
      while (taken.has(next)) next++;
      taken.add(next);
      nh = { id: next, gateway: r.gateway, oif: r.oif, onlink: r.onlink };
    }
    nexthops.set(k, nh);
    return { ...r, nhid: nh.id };
  });
  const want = { ...desired, routes, nexthops: [...nexthops.values()] };
  const actual = { routes: [...kernel.routes.values()], neighbours: [...kernel.neighbours.values()], fdb: [...kernel.fdb.values()], nexthops: [...kernel.nexthops.values()] };
  kernel.apply(diffState(want, actual).ops);
  model.reset({ nexthopDevices: new Set([VX]) }, peers, want, taken);
}

describe('kernel model: deltas against a simulated kernel', () => {
  for (const seed of [1, 42, 1234, 98765]) {
    it(`keeps kernel = what the peers want over 2 000 random steps (seed ${seed})`, () => {
      const rnd = prng(seed);
      const kernel = new FakeKernel();
      const model = new KernelModel({ nexthopDevices: new Set([VX]) });
      const peers = new Map<string, PeerEntries>();
      fullPass(model, kernel, peers);
      for (let step = 0; step < 2000; step++) {
        const roll = rnd();
        if (roll < 0.03) {
          // Hand-made drift: someone deletes or rewrites an entry; the full pass repairs it.
          const routes = [...kernel.routes.keys()];
          if (routes.length > 0) kernel.routes.delete(routes[Math.floor(rnd() * routes.length)]!);
          const neigh = [...kernel.neighbours.keys()];
          if (neigh.length > 0) kernel.neighbours.delete(neigh[Math.floor(rnd() * neigh.length)]!);
          fullPass(model, kernel, peers);
        } else if (roll < 0.05) {
          // A restart: a new model adopts the kernel as it is.
          const fresh = new KernelModel({ nexthopDevices: new Set([VX]) });
          fullPass(fresh, kernel, peers);
          Object.assign(model, fresh);
        } else {
          // A batch of 1–5 changes: new, changed or gone peers.
          const changes: Array<{ id: string; entries: PeerEntries | null }> = [];
          const n = 1 + Math.floor(rnd() * 5);
          for (let k = 0; k < n; k++) {
            const i = Math.floor(rnd() * 60);
            const id = `p${i}`;
            const entries = rnd() < 0.3 ? null : vxlanEntries(i, rnd);
            if (entries) peers.set(id, entries);
            else peers.delete(id);
            changes.push({ id, entries });
          }
          const { ops, commit } = model.delta(changes);
          // Now and then the kernel refuses an operation: the model says so, and a full pass follows.
          const refuse = rnd() < 0.05 ? (op: KernelOp) => op === ops[0] : () => false;
          const refused = kernel.apply(ops, refuse);
          commit(refused);
          if (refused.size > 0) {
            assert.equal(model.uncertain, true, 'a refused operation leaves the model uncertain');
            fullPass(model, kernel, peers);
          }
          // A delta touches only the changed peers' entries.
          const touched = new Set(changes.flatMap(({ id }) => [id]));
          for (const op of ops) {
            const subject = 'route' in op ? op.route.dst.toString() : 'neigh' in op ? op.neigh.ip.toString() : 'fdb' in op ? op.fdb.dst.toString() : null;
            if (subject && subject.startsWith('10.1.')) assert.ok(touched.has(`p${subject.split('.')[2]}`), `op ${op.kind} ${subject} outside the batch`);
          }
        }
        assert.deepEqual(kernel.forwarding(), wantedForwarding(peers), `step ${step}`);
        // No nexthop is left without a route, none was taken from another tool.
        const used = new Set([...kernel.routes.values()].map((r) => r.nhid).filter((x) => x));
        assert.deepEqual([...kernel.nexthops.keys()].filter((id) => !used.has(id)), [], `orphan nexthops at step ${step}`);
      }
    });
  }

  it('an unchanged re-announcement costs nothing; two peers behind one VTEP share its FDB entry', () => {
    const model = new KernelModel({ nexthopDevices: new Set([VX]) });
    const kernel = new FakeKernel();
    fullPass(model, kernel, new Map());
    const a = vxlanEntries(1, () => 0.5);
    const b = vxlanEntries(2, () => 0.5);
    let d = model.delta([{ id: 'a', entries: a }, { id: 'b', entries: b }]);
    kernel.apply(d.ops);
    d.commit(new Set());
    assert.equal(d.ops.filter((o) => o.kind === 'fdb-replace').length, 1);
    d = model.delta([{ id: 'a', entries: a }]);
    assert.deepEqual(d.ops, []);
    d = model.delta([{ id: 'a', entries: null }]);
    assert.deepEqual(d.ops.map((o) => o.kind).sort(), ['neigh-delete', 'nexthop-delete', 'route-delete']);
  });
});
