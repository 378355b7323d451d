// Pure conversions between weft's value types and the `netlink` library's parsed structs, plus the
// typed helpers that paper over the library's typing gaps (libs.md §1). No sockets here.
import { constants as osConstants, endianness } from 'node:os';
import { getSystemErrorName } from 'node:util';

import { AttrStream, ifla, rt, type StreamData } from 'netlink';

import { IPAddr, IPNet, type Family } from '../util/ip.js';
import { macFromBuffer } from '../util/mac.js';
import {
  forEachAttr,
  MessageWriter,
  NDA_DST,
  NDA_LLADDR,
  NDMSG_LEN,
  NHA_BLACKHOLE,
  NHA_GATEWAY,
  NHA_GROUP,
  NHA_ID,
  NHA_OIF,
  NHMSG_LEN,
  NLM_F_ACK,
  NLM_F_CREATE,
  NLM_F_REPLACE,
  NLM_F_REQUEST,
  readU32,
  RTA_DST,
  RTA_GATEWAY,
  RTA_NH_ID,
  RTA_OIF,
  RTA_TABLE,
  RTM_DELNEIGH,
  RTM_DELNEXTHOP,
  RTM_DELROUTE,
  RTM_NEWNEIGH,
  RTM_NEWNEXTHOP,
  RTM_NEWROUTE,
  RTMSG_LEN,
} from './wire.js';
import {
  MAIN_TABLE,
  NetlinkError,
  NUD,
  WEFT_ROUTE_PROTOCOL,
  type AddrEntry,
  type FdbEntry,
  type LinkInfo,
  type NeighEntry,
  type NetlinkOp,
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
/** ndm_flags: the entry belongs to the device itself (vxlan's FDB), not to a bridge master. */
const NTF_SELF = 0x02;
/** rtm_table is a u8; larger table ids travel only in RTA_TABLE. */
const RT_TABLE_UNSPEC = 0;
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
 * `Info.data` are typed Buffer (libs.md typing bug 2): flatten the stream into one Buffer.
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
    const code: unknown = (e as { code?: unknown }).code; // ErrnoException from a failed send
    if (typeof code === 'string' && /^E[A-Z0-9]+$/.test(code)) return code;
  }
  return 'EUNKNOWN';
}

export function toNetlinkError(e: unknown, op: string): NetlinkError {
  if (e instanceof NetlinkError) return e.op === op ? e : new NetlinkError(e.errno, op, e.detail);
  const detail = e instanceof Error ? e.message : String(e);
  return new NetlinkError(errnoOf(e), op, detail);
}

// ---------------------------------------------------------------------------------------------
// Operations

export function describeOp(op: NetlinkOp): string {
  switch (op.kind) {
    case 'route-replace':
    case 'route-delete': {
      const r = op.route;
      let s = `${op.kind} ${String(r.dst)}`;
      // A route through a nexthop object sends only the id (replace) or names it (delete).
      const viaNexthop = op.kind === 'route-replace' && op.route.nhid !== undefined;
      if (!viaNexthop) {
        if (r.gateway) s += ` via ${String(r.gateway)}`;
        if (r.oif !== null && r.oif !== undefined) s += ` dev ${r.oif}`;
        if (op.kind === 'route-replace' && op.route.onlink) s += ' onlink';
      }
      if (r.nhid !== undefined) s += ` nhid ${r.nhid}`;
      const proto = r.protocol ?? WEFT_ROUTE_PROTOCOL;
      if (proto !== WEFT_ROUTE_PROTOCOL) s += ` proto ${proto}`;
      const table = r.table ?? MAIN_TABLE;
      if (table !== MAIN_TABLE) s += ` table ${table}`;
      return s;
    }
    case 'neigh-replace':
      return `neigh-replace ${String(op.neigh.ip)} lladdr ${op.neigh.mac} dev ${op.neigh.ifindex}`;
    case 'neigh-delete':
      return `neigh-delete ${String(op.neigh.ip)} dev ${op.neigh.ifindex}`;
    case 'fdb-replace':
      return `fdb-replace ${op.fdb.mac} dev ${op.fdb.ifindex} dst ${String(op.fdb.dst)}`;
    case 'fdb-delete':
      return `fdb-delete ${op.fdb.mac} dev ${op.fdb.ifindex}${op.fdb.dst ? ` dst ${String(op.fdb.dst)}` : ''}`;
    case 'nexthop-replace': {
      const n = op.nexthop;
      let s = `nexthop-replace id ${n.id} via ${String(n.gateway)} dev ${n.oif}`;
      if (n.onlink) s += ' onlink';
      const proto = n.protocol ?? WEFT_ROUTE_PROTOCOL;
      if (proto !== WEFT_ROUTE_PROTOCOL) s += ` proto ${proto}`;
      return s;
    }
    case 'nexthop-delete':
      return `nexthop-delete id ${op.nexthop.id}`;
  }
}

export const isDeleteOp = (op: NetlinkOp): boolean =>
  op.kind === 'route-delete' || op.kind === 'neigh-delete' || op.kind === 'fdb-delete' || op.kind === 'nexthop-delete';

/**
 * Answers to a delete that mean the entry is not there (route: ESRCH, neigh/FDB/nexthop: ENOENT) or
 * cannot be, because its device is gone (ENODEV).
 */
export const GONE_ERRNOS: ReadonlySet<string> = new Set(['ESRCH', 'ENOENT', 'ENODEV']);

export class InvalidOpError extends Error {
  constructor(readonly reason: string) {
    super(`invalid argument: ${reason}`);
    this.name = 'InvalidOpError';
  }
}

function checkIfindex(n: unknown, what: string): number {
  if (typeof n !== 'number' || !Number.isInteger(n) || n <= 0 || n > 0x7fffffff) {
    throw new InvalidOpError(`${what} must be a positive ifindex, got ${String(n)}`);
  }
  return n;
}

function checkU8(n: number, what: string): number {
  if (!Number.isInteger(n) || n < 0 || n > 255) throw new InvalidOpError(`${what} must be 0..255, got ${n}`);
  return n;
}

function checkTable(n: number): number {
  if (!Number.isInteger(n) || n <= 0 || n > 0xffffffff) throw new InvalidOpError(`table must be 1..2^32-1, got ${n}`);
  return n;
}

function checkNexthopId(n: unknown): number {
  if (typeof n !== 'number' || !Number.isInteger(n) || n <= 0 || n > 0xffffffff) {
    throw new InvalidOpError(`nexthop id must be 1..2^32-1, got ${String(n)}`);
  }
  return n;
}

/** MessageWriter.attrMac accepts exactly what isValidMac does. */
function badMac(mac: unknown): InvalidOpError {
  return new InvalidOpError(`bad MAC address "${String(mac)}"`);
}

/**
 * Writes the request for an op into w as one message with this seq and port; throws
 * InvalidOpError (leaving w as it was) for arguments the kernel must not see.
 */
export function writeOp(w: MessageWriter, op: NetlinkOp, seq: number, port: number, ack: boolean): void {
  const base = NLM_F_REQUEST | (ack ? NLM_F_ACK : 0);
  const replace = base | NLM_F_CREATE | NLM_F_REPLACE;
  switch (op.kind) {
    case 'route-replace': {
      const r = op.route;
      const family = r.dst.family;
      const table = checkTable(r.table ?? MAIN_TABLE);
      const protocol = checkU8(r.protocol ?? WEFT_ROUTE_PROTOCOL, 'protocol');
      if (r.nhid !== undefined) {
        const nhid = checkNexthopId(r.nhid);
        w.begin(RTM_NEWROUTE, replace, seq, port);
        rtmsg(w, family, r.dst.prefix, table, protocol, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0);
        routeKeyAttrs(w, r.dst.ip, r.dst.prefix, table);
        w.attrU32(RTA_NH_ID, nhid);
        w.end();
        return;
      }
      if (r.gateway && r.gateway.family !== family) {
        throw new InvalidOpError(`gateway ${String(r.gateway)} is not IPv${family} like ${String(r.dst)}`);
      }
      if (r.oif === null && !r.gateway) throw new InvalidOpError('a route needs a gateway or a device');
      if (r.onlink && (r.oif === null || !r.gateway)) throw new InvalidOpError('onlink needs both a gateway and a device');
      const oif = r.oif === null ? null : checkIfindex(r.oif, 'oif');
      w.begin(RTM_NEWROUTE, replace, seq, port);
      // Like `ip route`: a device route without a gateway is link scope.
      const scope = r.gateway ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
      rtmsg(w, family, r.dst.prefix, table, protocol, scope, RTN_UNICAST, r.onlink ? RTNH_F_ONLINK : 0);
      routeKeyAttrs(w, r.dst.ip, r.dst.prefix, table);
      if (r.gateway) w.attrIp(RTA_GATEWAY, r.gateway.family, r.gateway.value);
      if (oif !== null) w.attrU32(RTA_OIF, oif);
      w.end();
      return;
    }
    case 'route-delete': {
      const r = op.route;
      const family = r.dst.family;
      if (r.gateway && r.gateway.family !== family) {
        throw new InvalidOpError(`gateway ${String(r.gateway)} is not IPv${family} like ${String(r.dst)}`);
      }
      const table = checkTable(r.table ?? MAIN_TABLE);
      // 0 = any protocol to the kernel.
      const protocol = checkU8(r.protocol ?? WEFT_ROUTE_PROTOCOL, 'protocol');
      const oif = r.oif !== null && r.oif !== undefined ? checkIfindex(r.oif, 'oif') : null;
      const nhid = r.nhid !== undefined ? checkNexthopId(r.nhid) : null;
      w.begin(RTM_DELROUTE, base, seq, port);
      rtmsg(w, family, r.dst.prefix, table, protocol, RT_SCOPE_NOWHERE /* any scope */, 0, 0);
      routeKeyAttrs(w, r.dst.ip, r.dst.prefix, table);
      if (r.gateway) w.attrIp(RTA_GATEWAY, r.gateway.family, r.gateway.value);
      if (oif !== null) w.attrU32(RTA_OIF, oif);
      if (nhid !== null) w.attrU32(RTA_NH_ID, nhid);
      w.end();
      return;
    }
    case 'neigh-replace': {
      const ifindex = checkIfindex(op.neigh.ifindex, 'ifindex');
      w.begin(RTM_NEWNEIGH, replace, seq, port);
      ndmsg(w, afOf(op.neigh.ip.family), ifindex, NUD.PERMANENT, 0, RTN_UNICAST);
      w.attrIp(NDA_DST, op.neigh.ip.family, op.neigh.ip.value);
      if (!w.attrMac(NDA_LLADDR, op.neigh.mac)) throw badMac(op.neigh.mac);
      w.end();
      return;
    }
    case 'neigh-delete': {
      const ifindex = checkIfindex(op.neigh.ifindex, 'ifindex');
      w.begin(RTM_DELNEIGH, base, seq, port);
      ndmsg(w, afOf(op.neigh.ip.family), ifindex, 0, 0, 0);
      w.attrIp(NDA_DST, op.neigh.ip.family, op.neigh.ip.value);
      w.end();
      return;
    }
    case 'fdb-replace': {
      const ifindex = checkIfindex(op.fdb.ifindex, 'ifindex');
      w.begin(RTM_NEWNEIGH, replace, seq, port);
      ndmsg(w, AF_BRIDGE, ifindex, NUD.PERMANENT, NTF_SELF, 0);
      if (!w.attrMac(NDA_LLADDR, op.fdb.mac)) throw badMac(op.fdb.mac);
      w.attrIp(NDA_DST, op.fdb.dst.family, op.fdb.dst.value);
      w.end();
      return;
    }
    case 'fdb-delete': {
      const ifindex = checkIfindex(op.fdb.ifindex, 'ifindex');
      w.begin(RTM_DELNEIGH, base, seq, port);
      ndmsg(w, AF_BRIDGE, ifindex, 0, NTF_SELF, 0);
      if (!w.attrMac(NDA_LLADDR, op.fdb.mac)) throw badMac(op.fdb.mac);
      if (op.fdb.dst) w.attrIp(NDA_DST, op.fdb.dst.family, op.fdb.dst.value);
      w.end();
      return;
    }
    case 'nexthop-replace': {
      const n = op.nexthop;
      const id = checkNexthopId(n.id);
      const oif = checkIfindex(n.oif, 'oif');
      const protocol = checkU8(n.protocol ?? WEFT_ROUTE_PROTOCOL, 'protocol');
      if (!(n.gateway instanceof IPAddr)) throw new InvalidOpError('a nexthop needs a gateway');
      w.begin(RTM_NEWNEXTHOP, replace, seq, port);
      nhmsg(w, afOf(n.gateway.family), protocol, n.onlink ? RTNH_F_ONLINK : 0);
      w.attrU32(NHA_ID, id);
      w.attrU32(NHA_OIF, oif);
      w.attrIp(NHA_GATEWAY, n.gateway.family, n.gateway.value);
      w.end();
      return;
    }
    case 'nexthop-delete': {
      const id = checkNexthopId(op.nexthop.id);
      w.begin(RTM_DELNEXTHOP, base, seq, port);
      nhmsg(w, AF_UNSPEC, 0, 0);
      w.attrU32(NHA_ID, id);
      w.end();
      return;
    }
  }
}

function rtmsg(w: MessageWriter, family: Family, dstLen: number, table: number, protocol: number, scope: number, type: number, flags: number): void {
  const o = w.struct(RTMSG_LEN);
  w.u8At(o, afOf(family));
  w.u8At(o + 1, dstLen);
  // rtm_table is a u8; larger table ids travel only in RTA_TABLE.
  w.u8At(o + 4, table < 256 ? table : RT_TABLE_UNSPEC);
  w.u8At(o + 5, protocol);
  w.u8At(o + 6, scope);
  w.u8At(o + 7, type);
  w.u32At(o + 8, flags);
}

function routeKeyAttrs(w: MessageWriter, dst: IPAddr, prefix: number, table: number): void {
  w.attrU32(RTA_TABLE, table);
  if (prefix > 0) w.attrIp(RTA_DST, dst.family, dst.value);
}

function ndmsg(w: MessageWriter, family: number, ifindex: number, state: number, flags: number, type: number): void {
  const o = w.struct(NDMSG_LEN);
  w.u8At(o, family);
  w.s32At(o + 4, ifindex);
  w.u16At(o + 8, state);
  w.u8At(o + 10, flags);
  w.u8At(o + 11, type);
}

function nhmsg(w: MessageWriter, family: number, protocol: number, flags: number): void {
  const o = w.struct(NHMSG_LEN);
  w.u8At(o, family);
  w.u8At(o + 2, protocol);
  w.u32At(o + 4, flags);
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
