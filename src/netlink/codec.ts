// Pure conversions between weft's value types and the `netlink` library's parsed structs, plus the
// typed helpers that paper over the `netlink` library's typing gaps. No sockets here.
import { constants as osConstants, endianness } from 'node:os';
import { getSystemErrorName } from 'node:util';

import { AttrStream, ifla, rt, type StreamData } from 'netlink';

import { errnoCode, errorMessage } from '../util/errors.js';
import { IPAddr, IPNet, type Family } from '../util/ip.js';
import { macFromBuffer } from '../util/mac.js';
import { forEachAttr, NHA_BLACKHOLE, NHA_GATEWAY, NHA_GROUP, NHA_ID, NHA_OIF, NHMSG_LEN, readU32 } from './wire.js';
import {
  NetlinkError,
  NUD,
  type AddrEntry,
  type FdbEntry,
  type LinkInfo,
  type NeighEntry,
  type NexthopEntry,
  type RouteEntry,
  type VxlanAttrs,
} from './types.js';

export const AF_UNSPEC = 0;
export const AF_INET = 2;
export const AF_BRIDGE = 7;
export const AF_INET6 = 10;
/** RTNH_F_ONLINK: the library has no named flag for it; it travels in rtm_flags' low bits. */
export const RTNH_F_ONLINK = 4;
export const RT_SCOPE_UNIVERSE = 0;
export const RT_SCOPE_LINK = 253;
/** In a delete, "any scope". */
export const RT_SCOPE_NOWHERE = 255;
export const RTN_UNICAST = 1;
/** IFLA_EXT_MASK RTEXT_FILTER_SKIP_STATS: link dumps without the (large) statistics blocks. */
const RTEXT_FILTER_SKIP_STATS = 1 << 3;

export const afOf = (family: Family): number => (family === 4 ? AF_INET : AF_INET6);

// ---------------------------------------------------------------------------------------------
// Addresses

export function ipToBuffer(ip: IPAddr): Buffer {
  if (ip.family === 4) {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(Number(ip.value));
    return b;
  }
  const b = Buffer.alloc(16);
  b.writeBigUInt64BE(ip.value >> 64n, 0);
  b.writeBigUInt64BE(ip.value & 0xffff_ffff_ffff_ffffn, 8);
  return b;
}

export class MalformedReplyError extends Error {
  constructor(readonly what: string) {
    super(`malformed netlink reply: ${what}`);
    this.name = 'MalformedReplyError';
  }
}

export function ipFromBuffer(buf: Uint8Array): IPAddr {
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  if (b.length === 4) return IPAddr.of(4, BigInt(b.readUInt32BE(0)));
  if (b.length === 16) return IPAddr.of(6, (b.readBigUInt64BE(0) << 64n) | b.readBigUInt64BE(8));
  throw new MalformedReplyError(`address of ${b.length} bytes`);
}

const zeroAddr = (family: Family): IPAddr => IPAddr.of(family, 0n);

export function u16be(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

/** Netlink integers are in host byte order. */
export function u32ne(n: number): Buffer {
  const b = Buffer.alloc(4);
  if (endianness() === 'LE') b.writeUInt32LE(n);
  else b.writeUInt32BE(n);
  return b;
}

export const SKIP_STATS_MASK = u32ne(RTEXT_FILTER_SKIP_STATS);

/**
 * `ifla.formatInfo()` / `formatVxlan()` return StreamData but `LinkAttrs.linkinfo` and
 * `Info.data` are typed Buffer (a typing gap of netlink 0.3.0): flatten the stream into one Buffer.
 */
export function streamToBuffer(data: StreamData): Buffer {
  const st = new AttrStream();
  st.emit(data);
  return Buffer.concat(st.bufs);
}

/** The library decodes enums to their key when it knows the value; we want the number. */
function enumNumber(mapping: Record<string, string | number>, v: string | number | undefined): number {
  if (v === undefined) return 0;
  if (typeof v === 'number') return v;
  const n = mapping[v];
  return typeof n === 'number' ? n : 0;
}

// ---------------------------------------------------------------------------------------------
// Errors

const ERRNO_NAMES = new Map<number, string>(Object.entries(osConstants.errno).map(([name, n]) => [n, name]));

/** The name Node (and so the library) gives a positive errno: 19 → 'ENODEV'. */
export function errnoName(n: number): string {
  const name = getSystemErrorName(-Math.abs(n));
  if (/^E[A-Z0-9]+$/.test(name)) return name;
  return ERRNO_NAMES.get(Math.abs(n)) ?? `E${Math.abs(n)}`;
}

/** The errno name inside whatever the library rejected with. */
export function errnoOf(e: unknown): string {
  if (e instanceof NetlinkError) return e.errno;
  if (e instanceof Error) {
    // The library's own format: Error(`Request rejected: ${util.getSystemErrorName(errno)}`),
    // which falls back to the number when Node does not know the name.
    const m = /Request rejected: (-?\d+|E[A-Z0-9]+)/.exec(e.message);
    if (m) {
      const code = m[1]!;
      if (!/^-?\d+$/.test(code)) return code;
      return ERRNO_NAMES.get(Math.abs(Number(code))) ?? `E${Math.abs(Number(code))}`;
    }
    if (/Timeout has been reached/.test(e.message)) return 'ETIMEDOUT';
    const code = errnoCode(e); // ErrnoException from a failed send
    if (code !== null && /^E[A-Z0-9]+$/.test(code)) return code;
  }
  return 'EUNKNOWN';
}

export function toNetlinkError(e: unknown, op: string): NetlinkError {
  if (e instanceof NetlinkError) return e.op === op ? e : new NetlinkError(e.errno, op, e.detail);
  const detail = errorMessage(e);
  return new NetlinkError(errnoOf(e), op, detail);
}

// ---------------------------------------------------------------------------------------------
// Parsed messages → entries

const OPER_STATES = ['UNKNOWN', 'NOTPRESENT', 'DOWN', 'LOWERLAYERDOWN', 'TESTING', 'DORMANT', 'UP'];

export function vxlanFromInfo(data: Buffer): VxlanAttrs {
  const v = ifla.parseVxlan(data);
  const local = v.local6 ?? v.local;
  const port = v.port && v.port.length === 2 ? v.port.readUInt16BE(0) : 0;
  return {
    vni: v.id ?? 0,
    local: local ? ipFromBuffer(local) : null,
    link: v.link ? v.link : null,
    port,
    learning: v.learning === 1,
    gbp: v.gbp === true,
  };
}

export function linkFromMessage(m: rt.LinkMessage): LinkInfo {
  const a = m.attrs;
  let kind: string | null = null;
  let vxlan: VxlanAttrs | null = null;
  if (a.linkinfo) {
    const info = ifla.parseInfo(a.linkinfo);
    kind = info.kind ?? null;
    if (kind === 'vxlan' && info.data) vxlan = vxlanFromInfo(info.data);
  }
  return {
    index: m.data.index ?? 0,
    name: a.ifname ?? '',
    mtu: a.mtu ?? 0,
    mac: macFromBuffer(a.address),
    adminUp: m.data.flags?.up === true,
    operState: OPER_STATES[a.operstate ?? 0] ?? String(a.operstate),
    kind,
    vxlan,
  };
}

export function addrFromMessage(m: rt.AddressMessage): AddrEntry | null {
  // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on point-to-point links);
  // IPv6 usually sends IFA_ADDRESS only.
  const raw = m.attrs.local ?? m.attrs.address;
  if (!raw || (m.data.family !== AF_INET && m.data.family !== AF_INET6)) return null;
  return { index: m.data.index ?? 0, ip: ipFromBuffer(raw), prefix: m.data.prefixlen ?? 0 };
}

export function routeFromMessage(m: rt.RouteMessage): RouteEntry | null {
  const fam: Family | null = m.data.family === AF_INET ? 4 : m.data.family === AF_INET6 ? 6 : null;
  if (fam === null) return null;
  const a = m.attrs;
  const dst = IPNet.of(a.dst ? ipFromBuffer(a.dst) : zeroAddr(fam), m.data.dstLen ?? 0);
  const typeNum = enumNumber(rt.RouteType, m.data.type);
  const typeName = rt.RouteType[typeNum];
  return {
    dst,
    gateway: a.gateway ? ipFromBuffer(a.gateway) : null,
    oif: a.oif ?? null,
    onlink: (rt.formatRouteFlags(m.data.flags ?? {}) & RTNH_F_ONLINK) !== 0,
    protocol: enumNumber(rt.RouteProtocol, m.data.protocol),
    table: a.table ?? m.data.table ?? 0,
    type: typeName ? typeName.toLowerCase() : String(typeNum),
    scope: enumNumber(rt.RouteScope, m.data.scope),
    // The library keeps RTA_NH_ID as raw bytes.
    nhid: a.nhId && a.nhId.length >= 4 ? readU32(a.nhId, 0) : null,
  };
}

/** struct nhmsg + NHA_* attributes; null for a message too short to be one. */
export function nexthopFromMessage(data: Buffer): NexthopEntry | null {
  if (data.length < NHMSG_LEN) return null;
  const af = data.readUInt8(0);
  const entry: NexthopEntry = {
    id: 0,
    family: af === AF_INET ? 4 : af === AF_INET6 ? 6 : null,
    gateway: null,
    oif: null,
    onlink: (readU32(data, 4) & RTNH_F_ONLINK) !== 0,
    protocol: data.readUInt8(2),
    blackhole: false,
    group: null,
  };
  forEachAttr(data.subarray(NHMSG_LEN), (type, v) => {
    switch (type) {
      case NHA_ID:
        if (v.length >= 4) entry.id = readU32(v, 0);
        break;
      case NHA_OIF:
        if (v.length >= 4) entry.oif = readU32(v, 0);
        break;
      case NHA_GATEWAY:
        entry.gateway = ipFromBuffer(v);
        break;
      case NHA_BLACKHOLE:
        entry.blackhole = true;
        break;
      case NHA_GROUP: {
        // struct nexthop_grp { u32 id; u8 weight; u8 resvd1; u16 resvd2; }
        const ids: number[] = [];
        for (let o = 0; o + 8 <= v.length; o += 8) ids.push(readU32(v, o));
        entry.group = ids;
        break;
      }
    }
  });
  return entry.id > 0 ? entry : null;
}

export function neighFromMessage(m: rt.NeighborMessage): NeighEntry | null {
  if (!m.attrs.dst) return null;
  const state = rt.formatNeighborState(m.data.state ?? {});
  return {
    ifindex: m.data.ifindex ?? 0,
    ip: ipFromBuffer(m.attrs.dst),
    mac: macFromBuffer(m.attrs.lladdr),
    state,
    permanent: (state & NUD.PERMANENT) !== 0,
  };
}

export function fdbFromMessage(m: rt.NeighborMessage): FdbEntry | null {
  const mac = macFromBuffer(m.attrs.lladdr);
  if (!mac) return null;
  const state = rt.formatNeighborState(m.data.state ?? {});
  return {
    ifindex: m.data.ifindex ?? 0,
    mac,
    dst: m.attrs.dst ? ipFromBuffer(m.attrs.dst) : null,
    self: m.data.flags?.self === true,
    permanent: (state & NUD.PERMANENT) !== 0,
  };
}
