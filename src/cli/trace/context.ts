// What the analysis knows about this node for the packet's family: the cluster network, this node's
// subnet and lease, the backend, its addresses and links, and which lease an address belongs to.
// Shared by every hop of the trace.
import type { LinkInfo } from '../../netlink/index.js';
import type { Lease } from '../../subnet/lease.js';
import { IPNet, type Family, type IPAddr } from '../../util/ip.js';
import type { AddressClass, RouteLookup, TraceFacts } from './types.js';

export const subnetOf = (l: Lease, f: Family): IPNet | null => (f === 4 ? l.subnet : l.ipv6Subnet);
export const publicOf = (l: Lease, f: Family): IPAddr | null => (f === 4 ? l.attrs.publicIP : l.attrs.publicIPv6);

export class Context {
  readonly family: Family;
  readonly network: IPNet | null;
  readonly subnet: IPNet | null;
  readonly ownLease: Lease | null;
  readonly backend: string | null;
  /** Without leases, "no lease has it" would be a guess: ownership is then not judged. */
  readonly leasesKnown: boolean;
  private readonly local: ReadonlySet<string>;

  constructor(readonly f: TraceFacts) {
    this.family = f.packet.dst.family;
    const env = f.env;
    this.network = (this.family === 4 ? (env?.network ?? f.config?.network) : (env?.ipv6Network ?? f.config?.ipv6Network)) ?? null;
    this.local = new Set(f.addresses.map((a) => a.ip.toString()));
    const envSubnet = (this.family === 4 ? env?.subnet : env?.ipv6Subnet) ?? null;
    this.ownLease =
      (envSubnet ? f.leases.find((l) => subnetOf(l, this.family)?.equals(envSubnet)) : undefined) ??
      f.leases.find((l) => {
        const p = publicOf(l, this.family);
        return p !== null && this.local.has(p.toString());
      }) ??
      null;
    this.subnet = envSubnet ?? (this.ownLease ? subnetOf(this.ownLease, this.family) : null);
    // The same order as collect's (which decided whether to read OVS).
    this.backend = this.ownLease?.attrs.backendType ?? f.env?.backend ?? f.daemonBackend ?? f.config?.backendType ?? null;
    this.leasesKnown = f.leaseSource !== 'none';
  }

  isLocal(ip: IPAddr): boolean {
    return this.local.has(ip.toString());
  }

  leaseContaining(ip: IPAddr): Lease | null {
    return this.f.leases.find((l) => subnetOf(l, this.family)?.contains(ip)) ?? null;
  }

  leaseByPublicIP(ip: IPAddr): Lease | null {
    return this.f.leases.find((l) => publicOf(l, ip.family)?.equals(ip)) ?? null;
  }

  classify(ip: IPAddr): { cls: AddressClass; lease: Lease | null } {
    if (this.isLocal(ip)) return { cls: 'node', lease: null };
    if (this.subnet?.contains(ip)) return { cls: 'local-pod', lease: this.ownLease };
    const lease = this.leaseContaining(ip);
    if (lease) return { cls: 'remote-pod', lease };
    if (this.network?.contains(ip)) return { cls: 'cluster', lease: null };
    return { cls: 'external', lease: null };
  }

  link(name: string | null): LinkInfo | null {
    return name === null ? null : (this.f.links.find((l) => l.name === name) ?? null);
  }

  /** The first address of a device in the packet's family (what MASQUERADE picks, roughly). */
  firstAddress(device: string | null): IPAddr | null {
    const link = this.link(device);
    if (!link) return null;
    const linkLocal = IPNet.parse('fe80::/10');
    return this.f.addresses.find((a) => a.ifindex === link.index && a.ip.family === this.family && !linkLocal.contains(a.ip))?.ip ?? null;
  }

  leaseName(l: Lease | null): string | null {
    const s = l ? subnetOf(l, this.family) : null;
    return s ? s.toString() : null;
  }

  /** The lease an address belongs to: this node's subnet counts even when the lease list is unknown. */
  leaseNameOf(x: { cls: AddressClass; lease: Lease | null }): string | null {
    return x.cls === 'local-pod' && this.subnet ? this.subnet.toString() : this.leaseName(x.lease);
  }
}

export type Classified = { cls: AddressClass; lease: Lease | null };
export type OkRoute = Extract<RouteLookup, { ok: true }>;
