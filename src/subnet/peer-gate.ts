// A peer's lease is only a claim. The gate stands between the lease watcher and the backend: a
// lease reaches the dataplane only when it is inside the cluster network with the configured
// subnet size, does not overlap our own subnet or another accepted lease, names a unicast public
// address that is not one of ours, and satisfies the backend (type, VNI, VTEP MAC). Etcd and
// Kubernetes leases pass the same gate.
//
// Of two leases whose subnets overlap the older claim wins (the store's creation order: etcd's
// create revision, the Node's creation time), ties broken by the lease id — so every node decides
// the same way, and a newcomer cannot take a subnet that is in use: a lease is accepted when no
// older valid lease overlaps it. When the winner goes away, the other is programmed.
//
// Cost: an event touches the leases it names and the claimants of their subnets, never the whole
// set; `recheckAll` (our lease moved, our addresses changed) is the full pass.
import { IPNet, unicastProblem, type IPAddr } from '../util/ip.js';
import { leaseId, type Lease, type LeaseEvent } from './lease.js';

export type RejectReason = 'outside-network' | 'subnet-size' | 'overlaps-own' | 'overlaps-peer' | 'public-ip' | 'backend-type' | 'backend-data';

export const REJECT_REASONS: readonly RejectReason[] = ['outside-network', 'subnet-size', 'overlaps-own', 'overlaps-peer', 'public-ip', 'backend-type', 'backend-data'];

export interface PeerProblem {
  readonly reason: RejectReason;
  /** One line for the log and `weft status`. */
  readonly detail: string;
}

export interface Rejection extends PeerProblem {
  readonly lease: Lease;
  /** When this lease was first rejected for this reason. */
  readonly since: Date;
}

export interface PeerPolicy {
  /**
   * The cluster networks and subnet sizes of the enabled families (null: family disabled). A size
   * of 0 (Kubernetes mode without SubnetLen: kube-controller-manager sizes the podCIDRs) is not
   * checked; overlaps still are.
   */
  readonly network: IPNet | null;
  readonly subnetLen: number;
  readonly ipv6Network: IPNet | null;
  readonly ipv6SubnetLen: number;
  /** Our lease, asked on each check (it can move). */
  readonly ownLease: () => Lease | null;
  /** This node's addresses: a peer publishing one of them would point its traffic at us. */
  readonly localAddresses: () => readonly IPAddr[];
  /** The backend's own requirements (type, VNI, VTEP MAC), or null when it takes the lease. */
  readonly backendProblem: (lease: Lease) => PeerProblem | null;
}

export interface GateObserver {
  /** A lease was rejected, or rejected for another reason than before. */
  onReject(r: Rejection): void;
  /** A rejected lease became valid or went away. */
  onClear?(lease: Lease): void;
}

interface FamilyView {
  readonly family: 4 | 6;
  readonly subnet: IPNet | null;
  readonly publicIP: IPAddr | null;
}

function families(l: Lease): FamilyView[] {
  return [
    { family: 4, subnet: l.subnet, publicIP: l.attrs.publicIP },
    { family: 6, subnet: l.ipv6Subnet, publicIP: l.attrs.publicIPv6 },
  ];
}

/** The checks that depend on this lease alone (and our lease), in order of importance. */
export function checkPeer(l: Lease, policy: PeerPolicy): PeerProblem | null {
  const own = policy.ownLease();
  const local = policy.localAddresses();
  let any = false;
  for (const f of families(l)) {
    if (!f.subnet) continue;
    const network = f.family === 4 ? policy.network : policy.ipv6Network;
    // A family this node does not run is ignored, as the backend ignores it.
    if (!network) continue;
    any = true;
    const ownSubnet = own ? (f.family === 4 ? own.subnet : own.ipv6Subnet) : null;
    const size = f.family === 4 ? policy.subnetLen : policy.ipv6SubnetLen;
    if (!network.containsNet(f.subnet)) return { reason: 'outside-network', detail: `subnet ${f.subnet.toString()} is outside the cluster network ${network.toString()}` };
    if (size > 0 && f.subnet.prefix !== size) return { reason: 'subnet-size', detail: `subnet ${f.subnet.toString()} is not a /${size}` };
    if (ownSubnet && ownSubnet.overlaps(f.subnet)) return { reason: 'overlaps-own', detail: `subnet ${f.subnet.toString()} overlaps our own ${ownSubnet.toString()}` };
    const ip = f.publicIP;
    if (!ip || ip.family !== f.family) return { reason: 'public-ip', detail: `no IPv${f.family} public address` };
    const bad = unicastProblem(ip);
    if (bad) return { reason: 'public-ip', detail: `public address ${ip.toString()} is ${bad}` };
    if (local.some((a) => a.equals(ip))) return { reason: 'public-ip', detail: `public address ${ip.toString()} is one of this node's own` };
  }
  if (!any) return { reason: 'outside-network', detail: 'no subnet of a family this node runs' };
  return policy.backendProblem(l);
}

/** Which of two claims on a subnet came first: older claim, then lease id. */
function older(a: Lease, b: Lease): boolean {
  const ca = a.claimedAt;
  const cb = b.claimedAt;
  if (ca !== undefined && cb !== undefined && ca !== cb) return ca < cb;
  if (ca !== undefined && cb === undefined) return true;
  if (ca === undefined && cb !== undefined) return false;
  return leaseId(a) < leaseId(b);
}

function subnetsOf(l: Lease): IPNet[] {
  return families(l).flatMap((f) => (f.subnet ? [f.subnet] : []));
}

/**
 * Which claims overlap a prefix, without looking at every claim: each claim is filed under its own
 * prefix, and under every shorter prefix down to the cluster network's ("below"). A prefix then
 * overlaps the claims filed at itself or at one of its ancestors, and the claims below it: at most
 * a few dozen map lookups whatever the number of peers. Where every claim has one size (SubnetLen
 * is configured: the gate refuses any other), two claims overlap only when equal, and only the
 * claims' own prefixes are filed.
 */
class OverlapIndex {
  private readonly at = new Map<string, Set<string>>();
  private readonly below = new Map<string, Set<string>>();

  constructor(
    /** The cluster network's prefix length of the family: nothing valid is filed above it. */
    private readonly floor: (net: IPNet) => number,
    /** Whether all valid claims of the family have one size. */
    private readonly fixedSize: (net: IPNet) => boolean,
  ) {}

  private ancestors(net: IPNet): number {
    return this.fixedSize(net) ? net.prefix : this.floor(net);
  }

  add(id: string, net: IPNet): void {
    file(this.at, net.toString(), id);
    for (let len = this.ancestors(net); len < net.prefix; len++) file(this.below, IPNet.of(net.ip, len).toString(), id);
  }

  remove(id: string, net: IPNet): void {
    unfile(this.at, net.toString(), id);
    for (let len = this.ancestors(net); len < net.prefix; len++) unfile(this.below, IPNet.of(net.ip, len).toString(), id);
  }

  /** The ids of claims overlapping `net` (its own id included when filed). */
  overlapping(net: IPNet): Set<string> {
    const out = new Set<string>(this.below.get(net.toString()) ?? []);
    for (let len = this.ancestors(net); len <= net.prefix; len++) for (const id of this.at.get(IPNet.of(net.ip, len).toString()) ?? []) out.add(id);
    return out;
  }
}

function file(map: Map<string, Set<string>>, key: string, id: string): void {
  let set = map.get(key);
  if (!set) map.set(key, (set = new Set()));
  set.add(id);
}

function unfile(map: Map<string, Set<string>>, key: string, id: string): void {
  const set = map.get(key);
  set?.delete(id);
  if (set?.size === 0) map.delete(key);
}

export class PeerGate {
  /** Every peer lease the watcher knows. */
  private readonly known = new Map<string, Lease>();
  /** Its own verdict, without overlaps with other peers. */
  private readonly problems = new Map<string, PeerProblem | null>();
  /** The subnets of individually valid leases. */
  private readonly claims: OverlapIndex;
  private readonly accepted = new Map<string, Lease>();
  private readonly rejected = new Map<string, Rejection>();

  constructor(
    private readonly policy: PeerPolicy,
    private readonly observer: GateObserver,
  ) {
    // Valid claims lie inside the cluster network: nothing is filed above its prefix.
    this.claims = new OverlapIndex(
      (net) => (net.family === 4 ? policy.network : policy.ipv6Network)?.prefix ?? 0,
      (net) => (net.family === 4 ? policy.subnetLen : policy.ipv6SubnetLen) > 0,
    );
  }

  /** The leases the backend may program. */
  get peers(): Lease[] {
    return [...this.accepted.values()];
  }

  get rejections(): Rejection[] {
    return [...this.rejected.values()];
  }

  /** Peer leases known, accepted or not. */
  get knownCount(): number {
    return this.known.size;
  }

  get rejectedCount(): number {
    return this.rejected.size;
  }

  /** The watcher's events in, the backend's events out: only accepted leases, in the same order kinds (added, then removed). */
  apply(events: readonly LeaseEvent[]): LeaseEvent[] {
    const touched = new Set<string>();
    for (const ev of events) {
      const id = leaseId(ev.lease);
      this.forget(id, touched);
      if (ev.type === 'added') this.learn(ev.lease, touched);
    }
    return this.settle(touched);
  }

  /** Everything again: our lease or our addresses changed. */
  recheckAll(): LeaseEvent[] {
    const touched = new Set<string>();
    for (const l of [...this.known.values()]) {
      this.forget(leaseId(l), touched);
      this.learn(l, touched);
    }
    return this.settle(touched);
  }

  private learn(l: Lease, touched: Set<string>): void {
    const id = leaseId(l);
    this.known.set(id, l);
    const problem = checkPeer(l, this.policy);
    this.problems.set(id, problem);
    touched.add(id);
    if (problem) return;
    for (const net of subnetsOf(l)) {
      this.claims.add(id, net);
      for (const other of this.claims.overlapping(net)) touched.add(other);
    }
  }

  private forget(id: string, touched: Set<string>): void {
    const l = this.known.get(id);
    if (!l) return;
    touched.add(id);
    if (this.problems.get(id) === null) {
      for (const net of subnetsOf(l)) {
        this.claims.remove(id, net);
        for (const other of this.claims.overlapping(net)) touched.add(other);
      }
    }
    this.known.delete(id);
    this.problems.delete(id);
  }

  /** The first valid claim overlapping one of `l`'s subnets that is older than `l`, if any. */
  private olderClaimant(l: Lease): Lease | null {
    const id = leaseId(l);
    for (const net of subnetsOf(l)) {
      for (const other of this.claims.overlapping(net)) {
        if (other === id) continue;
        const o = this.known.get(other);
        if (o && older(o, l)) return o;
      }
    }
    return null;
  }

  private settle(touched: ReadonlySet<string>): LeaseEvent[] {
    const added: LeaseEvent[] = [];
    const removed: LeaseEvent[] = [];
    for (const id of touched) {
      const l = this.known.get(id) ?? null;
      let problem: PeerProblem | null = l ? (this.problems.get(id) ?? null) : null;
      if (l && !problem) {
        const winner = this.olderClaimant(l);
        if (winner) problem = { reason: 'overlaps-peer', detail: `a subnet is claimed by the older lease ${leaseId(winner)}` };
      }
      const was = this.accepted.get(id);
      if (l && !problem) {
        this.accepted.set(id, l);
        if (was !== l) added.push({ type: 'added', lease: l });
      } else {
        this.accepted.delete(id);
        if (was) removed.push({ type: 'removed', lease: was });
      }
      this.record(id, l, problem);
    }
    return [...added, ...removed];
  }

  private record(id: string, l: Lease | null, problem: PeerProblem | null): void {
    const before = this.rejected.get(id);
    if (l && problem) {
      if (before && before.reason === problem.reason && before.detail === problem.detail && before.lease === l) return;
      const r: Rejection = { ...problem, lease: l, since: before && before.reason === problem.reason ? before.since : new Date() };
      this.rejected.set(id, r);
      this.observer.onReject(r);
    } else if (before) {
      this.rejected.delete(id);
      this.observer.onClear?.(before.lease);
    }
  }
}
