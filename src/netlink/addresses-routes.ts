// Addresses (read, add, delete) and the routing state read back: routes of every table and
// nexthop objects, with the probe for kernels that have none.
import { FlagsNew, rt } from 'netlink';

import type { IPAddr } from '../util/ip.js';
import { addrFromMessage, afOf, ipToBuffer, nexthopFromMessage, routeFromMessage } from './codec.js';
import { invalid, type NetlinkConnection } from './connection.js';
import { NetlinkError, type AddrEntry, type NexthopEntry, type RouteEntry } from './types.js';
import { NHMSG_LEN, RTM_GETNEXTHOP } from './wire.js';

const { CREATE, EXCL } = FlagsNew;

export interface NexthopFilter {
  protocol?: number;
}

export interface RouteFilter {
  family: 4 | 6;
  /** Only this table; all tables when omitted. */
  table?: number;
  protocol?: number;
  oif?: number;
}

/** Answers to a nexthop dump from a kernel without nexthop objects (< 5.3). */
const NO_NEXTHOP_ERRNOS: ReadonlySet<string> = new Set(['EOPNOTSUPP', 'ENOTSUP', 'EINVAL', 'EAFNOSUPPORT']);

/** IPv4 and IPv6 addresses, of one link or of all. */
export async function listAddresses(conn: NetlinkConnection, index?: number): Promise<AddrEntry[]> {
  const msgs = await conn.dump(
    () => 'address dump',
    rt.MessageType.GETADDR,
    (out) => rt.formatAddressMessage({ kind: 'address', data: {}, attrs: {} }, out),
    rt.parseAddressMessage,
  );
  const out: AddrEntry[] = [];
  for (const m of msgs) {
    if (index !== undefined && m.data.index !== index) continue;
    const a = addrFromMessage(m);
    if (a) out.push(a);
  }
  return out;
}

/** Idempotent: an address that is already there counts as success. */
export async function addAddress(conn: NetlinkConnection, index: number, ip: IPAddr, prefix: number): Promise<void> {
  const op = `address-add ${String(ip)}/${prefix} dev ${index}`;
  checkAddr(op, index, ip, prefix);
  const buf = ipToBuffer(ip);
  try {
    await conn.request(
      () => op,
      (s, o) =>
        s.newAddress(
          { family: afOf(ip.family), prefixlen: prefix, index },
          { local: buf, address: buf },
          { ...o, flags: CREATE | EXCL },
        ),
    );
  } catch (e) {
    if (e instanceof NetlinkError && e.errno === 'EEXIST') return;
    throw e;
  }
}

/** Idempotent: an address that is not there (EADDRNOTAVAIL) counts as success. */
export async function deleteAddress(conn: NetlinkConnection, index: number, ip: IPAddr, prefix: number): Promise<void> {
  const op = `address-delete ${String(ip)}/${prefix} dev ${index}`;
  checkAddr(op, index, ip, prefix);
  const buf = ipToBuffer(ip);
  try {
    await conn.request(
      () => op,
      (s, o) =>
        s.delAddress({ family: afOf(ip.family), prefixlen: prefix, index }, { local: buf, address: buf }, o),
    );
  } catch (e) {
    if (e instanceof NetlinkError && e.errno === 'EADDRNOTAVAIL') return;
    throw e;
  }
}

function checkAddr(op: string, index: number, ip: IPAddr, prefix: number): void {
  if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > ip.bits) throw invalid(op, `bad prefix length ${prefix}`);
}

// -------------------------------------------------------------------------------------------
// Routes and nexthops

/**
 * All routes of a family (every table unless `table` is given), filtered here, not in the
 * kernel. A route through a nexthop object has `nhid` set and gateway/oif/onlink of that
 * nexthop, like `ip route` shows it.
 */
export async function listRoutes(conn: NetlinkConnection, filter: RouteFilter): Promise<RouteEntry[]> {
  const msgs = await conn.dump(
    () => `route dump ipv${filter.family}`,
    rt.MessageType.GETROUTE,
    (out) => rt.formatRouteMessage({ kind: 'route', data: { family: afOf(filter.family) }, attrs: {} }, out),
    rt.parseRouteMessage,
  );
  const found: RouteEntry[] = [];
  for (const m of msgs) {
    const r = routeFromMessage(m);
    if (!r) continue;
    if (filter.table !== undefined && r.table !== filter.table) continue;
    if (filter.protocol !== undefined && r.protocol !== filter.protocol) continue;
    found.push(r);
  }
  // With net.ipv4.nexthop_compat_mode=0 the kernel sends only RTA_NH_ID: look the nexthops up.
  if (found.some((r) => r.nhid !== null && r.oif === null && r.gateway === null)) {
    const byId = new Map((await listNexthops(conn)).map((n) => [n.id, n]));
    for (const r of found) {
      if (r.nhid === null || r.oif !== null || r.gateway !== null) continue;
      const nh = byId.get(r.nhid);
      if (!nh) continue;
      r.gateway = nh.gateway;
      r.oif = nh.oif;
      r.onlink = nh.onlink;
    }
  }
  return filter.oif === undefined ? found : found.filter((r) => r.oif === filter.oif);
}

/** Nexthop objects (`ip nexthop`), optionally only those of one protocol. Kernel ≥ 5.3. */
export async function listNexthops(conn: NetlinkConnection, filter: NexthopFilter = {}): Promise<NexthopEntry[]> {
  const msgs = await conn.dump(
    () => 'nexthop dump',
    RTM_GETNEXTHOP,
    // An all-zero nhmsg: the kernel rejects dump requests with protocol/scope/flags set.
    (out) => out.emit(Buffer.alloc(NHMSG_LEN)),
    nexthopFromMessage,
  );
  const out: NexthopEntry[] = [];
  for (const n of msgs) {
    if (!n) continue;
    if (filter.protocol !== undefined && n.protocol !== filter.protocol) continue;
    out.push(n);
  }
  return out;
}

/**
 * Whether the kernel has nexthop objects (Linux ≥ 5.3), probed once with a nexthop dump.
 * Older kernels answer EOPNOTSUPP (Node's name: ENOTSUP) or EINVAL. Other errors reject, and
 * the next call probes again.
 */
export function supportsNexthops(conn: NetlinkConnection): Promise<boolean> {
  conn.nexthopProbe ??= listNexthops(conn).then(
    () => true,
    (e: unknown) => {
      if (e instanceof NetlinkError && NO_NEXTHOP_ERRNOS.has(e.errno)) return false;
      conn.nexthopProbe = null;
      throw e;
    },
  );
  return conn.nexthopProbe;
}
