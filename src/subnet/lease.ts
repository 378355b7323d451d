// The lease model shared by every lease manager and backend. Field names follow flannel's
// lease.LeaseAttrs / lease.Lease; the JSON shape lives in codec.ts.
import { checkUnicastMac } from '../util/mac.js';
import type { IPAddr, IPNet } from '../util/ip.js';

/** A JSON value as found in BackendData: kept parsed, re-encoded compactly. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

export interface LeaseAttrs {
  /** IPv4 address peers use to reach the node; 0.0.0.0 when the node has none. */
  readonly publicIP: IPAddr;
  readonly publicIPv6: IPAddr | null;
  /** Omitted from the JSON when empty (alloc, udp). */
  readonly backendType?: string;
  readonly backendData?: JsonValue;
  readonly backendV6Data?: JsonValue;
}

export interface Lease {
  /** IPv4 subnet; null only for an IPv6-only lease (kube mode). */
  readonly subnet: IPNet | null;
  readonly ipv6Subnet: IPNet | null;
  readonly attrs: LeaseAttrs;
  /** A reservation is a key the store never expires (etcd: a key without an etcd lease). */
  readonly reservation: boolean;
  /** When the store drops the lease; null for a reservation or when not looked up. */
  readonly expiration: Date | null;
  /**
   * When the store first recorded this claim, as an order (etcd: the key's create revision;
   * Kubernetes: the Node's creation time in ms). Of two leases claiming one subnet the older wins.
   */
  readonly claimedAt?: bigint;
}

export type LeaseEventType = 'added' | 'removed';

export interface LeaseEvent {
  readonly type: LeaseEventType;
  /** For 'removed', the peer's last known attributes. */
  readonly lease: Lease;
}

/** The identity of a lease: its subnets, in flannel's key form (`10.5.52.0-24&fd00:5::-64`). */
export function leaseId(lease: Pick<Lease, 'subnet' | 'ipv6Subnet'>): string {
  const parts: string[] = [];
  if (lease.subnet) parts.push(`${lease.subnet.ip.toString()}-${lease.subnet.prefix}`);
  if (lease.ipv6Subnet) parts.push(`${lease.ipv6Subnet.ip.toString()}-${lease.ipv6Subnet.prefix}`);
  return parts.join('&');
}

/**
 * flannel's sameSubnet: two leases are the same when the subnets of the families they both
 * carry are equal.
 */
export type LeaseSubnets = Pick<Lease, 'subnet' | 'ipv6Subnet'>;

export function sameSubnet(a: LeaseSubnets, b: LeaseSubnets): boolean {
  const v4 = a.subnet && b.subnet ? a.subnet.equals(b.subnet) : null;
  const v6 = a.ipv6Subnet && b.ipv6Subnet ? a.ipv6Subnet.equals(b.ipv6Subnet) : null;
  if (v4 === null && v6 === null) return false;
  return v4 !== false && v6 !== false;
}


/**
 * The VtepMAC a lease publishes for `family` (backendData / backendV6Data), validated: null when
 * absent, not a MAC, multicast or all zeros. The one reader for backends, status and trace.
 */
export function vtepMacOf(lease: Pick<Lease, 'attrs'>, family: 4 | 6): string | null {
  return vtepMacOfData(family === 4 ? lease.attrs.backendData : lease.attrs.backendV6Data);
}

/** The same, from the backend data itself. */
export function vtepMacOfData(data: JsonValue | undefined): string | null {
  if (!data || typeof data !== 'object' || Array.isArray(data)) return null;
  const r = checkUnicastMac(data.VtepMAC);
  return 'mac' in r ? r.mac : null;
}
