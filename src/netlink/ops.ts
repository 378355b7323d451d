// apply()'s operations: how each is described in errors, the checks its arguments must pass, and
// its request written straight into a raw rtnetlink message (MessageWriter, wire.ts) for batch.ts.
import { IPAddr, type Family } from '../util/ip.js';
import {
  AF_BRIDGE,
  AF_UNSPEC,
  afOf,
  RT_SCOPE_LINK,
  RT_SCOPE_NOWHERE,
  RT_SCOPE_UNIVERSE,
  RTN_UNICAST,
  RTNH_F_ONLINK,
} from './codec.js';
import { MAIN_TABLE, NUD, WEFT_ROUTE_PROTOCOL, type NetlinkOp } from './types.js';
import {
  type MessageWriter,
  NDA_DST,
  NDA_LLADDR,
  NDMSG_LEN,
  NHA_GATEWAY,
  NHA_ID,
  NHA_OIF,
  NHMSG_LEN,
  NLM_F_ACK,
  NLM_F_CREATE,
  NLM_F_REPLACE,
  NLM_F_REQUEST,
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

/** ndm_flags: the entry belongs to the device itself (vxlan's FDB), not to a bridge master. */
const NTF_SELF = 0x02;
/** rtm_table is a u8; larger table ids travel only in RTA_TABLE. */
const RT_TABLE_UNSPEC = 0;

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
