// The value types of weft's netlink layer: what the backends read from and write to the kernel.
import type { IPAddr, IPNet } from '../util/ip.js';

/** rtm_protocol weft stamps on the routes it owns ("proto 88" in `ip route`). */
export const WEFT_ROUTE_PROTOCOL = 88;
export const MAIN_TABLE = 254;

/** NUD_* neighbour states (include/uapi/linux/neighbour.h); NeighEntry.state is a mask of these. */
export const NUD = {
  INCOMPLETE: 0x01,
  REACHABLE: 0x02,
  STALE: 0x04,
  DELAY: 0x08,
  PROBE: 0x10,
  FAILED: 0x20,
  NOARP: 0x40,
  PERMANENT: 0x80,
} as const;

/** A MAC address in lower-case colon hex, "0e:2a:00:11:22:33" (Go's net.HardwareAddr.String()). */
export type { Mac } from '../util/mac.js';
import type { Mac } from '../util/mac.js';

export interface VxlanAttrs {
  vni: number;
  /** IFLA_VXLAN_LOCAL or IFLA_VXLAN_LOCAL6; null when the device has no source address. */
  local: IPAddr | null;
  /** ifindex of the underlay device (IFLA_VXLAN_LINK); null when unset. */
  link: number | null;
  /** UDP destination port. */
  port: number;
  learning: boolean;
  gbp: boolean;
}

export interface LinkInfo {
  index: number;
  name: string;
  mtu: number;
  /** null for links whose hardware address is not 6 bytes (ipip, sit, ...) or that have none. */
  mac: Mac | null;
  adminUp: boolean;
  /** RFC 2863 state as `ip link` prints it: "UP", "DOWN", "UNKNOWN", "LOWERLAYERDOWN", ... */
  operState: string;
  /** IFLA_INFO_KIND ("vxlan", "veth", ...); null for links without one (lo, physical NICs). */
  kind: string | null;
  vxlan: VxlanAttrs | null;
}

export interface VxlanSpec {
  name: string;
  vni: number;
  /** Source address; an IPv6 address makes an IPv6-underlay device (IFLA_VXLAN_LOCAL6). */
  local: IPAddr;
  /** ifindex of the underlay device. */
  link: number;
  /** UDP destination port; 0 leaves the kernel default (8472, like flannel). */
  port: number;
  learning: boolean;
  gbp: boolean;
  mtu?: number;
  /** Set at creation so udev/systemd MACAddressPolicy cannot race us (flannel PR #1485). */
  mac?: Mac;
}

export interface AddrEntry {
  index: number;
  ip: IPAddr;
  prefix: number;
}

export interface RouteEntry {
  /** 0.0.0.0/0 or ::/0 for a default route. */
  dst: IPNet;
  gateway: IPAddr | null;
  oif: number | null;
  onlink: boolean;
  protocol: number;
  table: number;
  /** Lower-case RTN_* name ("unicast", "blackhole", "local", ...), or the number as text if unknown. */
  type: string;
  scope: number;
  /**
   * RTA_NH_ID: the nexthop object the route forwards through, or null. For such a route
   * gateway/oif/onlink describe that nexthop (what `ip route` prints as "via X dev Y onlink"):
   * the kernel sends them itself (net.ipv4.nexthop_compat_mode=1, the default), otherwise
   * routes() fills them in from a nexthop dump.
   */
  nhid: number | null;
}

/** A nexthop object (`ip nexthop`, kernel ≥ 5.3). */
export interface NexthopEntry {
  id: number;
  /** Family of the gateway; null for groups and blackholes (AF_UNSPEC). */
  family: 4 | 6 | null;
  gateway: IPAddr | null;
  oif: number | null;
  onlink: boolean;
  protocol: number;
  blackhole: boolean;
  /** Member ids of a nexthop group; null for a single nexthop. */
  group: number[] | null;
}

export interface NexthopReplace {
  /** 1..2^32-1; weft picks it (0 would make the kernel pick one we could not know). */
  id: number;
  gateway: IPAddr;
  oif: number;
  onlink: boolean;
  /** Default WEFT_ROUTE_PROTOCOL. */
  protocol?: number;
}

export interface NeighEntry {
  ifindex: number;
  ip: IPAddr;
  mac: Mac | null;
  /** Mask of NUD_* bits (see NUD). */
  state: number;
  permanent: boolean;
}

export interface FdbEntry {
  ifindex: number;
  mac: Mac;
  /** The VTEP the MAC is reached through; null for entries without NDA_DST. */
  dst: IPAddr | null;
  /** NTF_SELF: the entry lives in the device's own table (vxlan), not a bridge's. */
  self: boolean;
  permanent: boolean;
}

export interface RouteReplace {
  dst: IPNet;
  /** Ignored when nhid is set. */
  gateway: IPAddr | null;
  /** Ignored when nhid is set. */
  oif: number | null;
  /** Ignored when nhid is set. */
  onlink: boolean;
  /**
   * Forward through this nexthop object (RTA_NH_ID) instead of gateway/oif/onlink; the nexthop
   * must exist by the time the kernel handles this op (earlier in the same apply() is fine).
   */
  nhid?: number;
  /** Default WEFT_ROUTE_PROTOCOL. */
  protocol?: number;
  /** Default MAIN_TABLE. */
  table?: number;
}

export interface RouteDelete {
  dst: IPNet;
  /** When given, only a route through this gateway matches. */
  gateway?: IPAddr | null;
  /** When given, only a route through this device matches. */
  oif?: number | null;
  /**
   * When given, only a route through this nexthop object matches. An IPv4 route that uses a
   * nexthop object never matches a delete that names a gateway or device (the kernel's
   * fib_nh_match): delete such routes by dst alone or with nhid. IPv6 ignores gateway/oif for them.
   */
  nhid?: number;
  /**
   * Default WEFT_ROUTE_PROTOCOL, so weft never deletes a route it does not own by accident;
   * pass 0 to match any protocol.
   */
  protocol?: number;
  /** Default MAIN_TABLE. */
  table?: number;
}

export type NetlinkOp =
  | { kind: 'route-replace'; route: RouteReplace }
  | { kind: 'route-delete'; route: RouteDelete }
  /** NUD_PERMANENT, like `ip neigh replace IP lladdr MAC dev X nud permanent`. */
  | { kind: 'neigh-replace'; neigh: { ifindex: number; ip: IPAddr; mac: Mac } }
  | { kind: 'neigh-delete'; neigh: { ifindex: number; ip: IPAddr } }
  /** AF_BRIDGE, NTF_SELF, permanent, like `bridge fdb replace MAC dev X dst IP self permanent`. */
  | { kind: 'fdb-replace'; fdb: { ifindex: number; mac: Mac; dst: IPAddr } }
  /** With dst null every remote of the MAC goes; with a dst only that one. */
  | { kind: 'fdb-delete'; fdb: { ifindex: number; mac: Mac; dst: IPAddr | null } }
  /** `ip nexthop replace id N via GW dev OIF [onlink] proto 88`. */
  | { kind: 'nexthop-replace'; nexthop: NexthopReplace }
  /** The kernel also deletes every route that uses the nexthop. Already gone counts as applied. */
  | { kind: 'nexthop-delete'; nexthop: { id: number } };

/** A rejected netlink request, or one weft refused to send because its arguments are invalid. */
export class NetlinkError extends Error {
  /**
   * @param errno the errno name the kernel answered with ('EEXIST', 'ESRCH', 'ENODEV', ...);
   *   'EINVAL' for arguments rejected before sending, 'ETIMEDOUT' when no answer came,
   *   'ECANCELED' when the handle was closed or its socket failed first.
   * @param op what was attempted, e.g. "route-replace 10.5.2.0/24 via 10.5.2.0 dev 7 onlink".
   * @param detail the underlying message (the library's "Request rejected: EEXIST", or the reason).
   */
  constructor(
    readonly errno: string,
    readonly op: string,
    readonly detail: string,
  ) {
    super(`${op}: ${detail}`);
    this.name = 'NetlinkError';
  }
}

export interface ApplyResult {
  /** Operations that took effect, counting deletes of entries that were already gone. */
  applied: number;
  /** In the order the operations were given. */
  failures: Array<{ op: NetlinkOp; error: NetlinkError }>;
}

export interface LinkEvent {
  /** 'new' is RTM_NEWLINK: a link appeared or changed (flags, MTU, MAC, ...). */
  type: 'new' | 'del';
  link: LinkInfo;
}

export interface Watch {
  close(): void;
}
