// SR-IOV VF configuration as rtnetlink carries it: the PF link's IFLA_VFINFO_LIST (one
// IFLA_VF_INFO nest per VF with IFLA_VF_MAC, IFLA_VF_VLAN / IFLA_VF_VLAN_LIST, IFLA_VF_RATE,
// IFLA_VF_SPOOFCHK, IFLA_VF_TRUST, IFLA_VF_LINK_STATE …), decoded from and encoded to bytes.
// Pure: no socket and no import of the native `netlink` package, so a CNI plugin bundle (which
// cannot load a native addon) may import it too. Layouts: include/uapi/linux/if_link.h.
import { endianness } from 'node:os';
import { macFromBuffer, macToBuffer, parseMac } from '../util/mac.js';

export const IFLA_IFNAME = 3;
export const IFLA_NUM_VF = 21;
export const IFLA_VFINFO_LIST = 22;
export const IFLA_EXT_MASK = 29;
/** RTM_GETLINK ext mask bit that asks the kernel to include the VF list. */
export const RTEXT_FILTER_VF = 1;

export const IFLA_VF_INFO = 1;
export const IFLA_VF_MAC = 1;
export const IFLA_VF_VLAN = 2;
export const IFLA_VF_TX_RATE = 3;
export const IFLA_VF_SPOOFCHK = 4;
export const IFLA_VF_LINK_STATE = 5;
export const IFLA_VF_RATE = 6;
export const IFLA_VF_TRUST = 9;
export const IFLA_VF_VLAN_LIST = 12;
export const IFLA_VF_VLAN_INFO = 1;

export const ETH_P_8021Q = 0x8100;
export const ETH_P_8021AD = 0x88a8;

const NLA_F_NESTED = 0x8000;
const NLA_TYPE_MASK = 0x3fff;
/** struct ifinfomsg: family, pad, type, index, flags, change. */
const IFINFOMSG_LEN = 16;
/** A setting the driver does not report (the kernel fills (u32)-1). */
const UNSUPPORTED = 0xffffffff;

export type VlanProto = '802.1q' | '802.1ad';
export type VfLinkState = 'auto' | 'enable' | 'disable';

const LINK_STATES: readonly VfLinkState[] = ['auto', 'enable', 'disable'];

/** One VF as its PF reports it. */
export interface VfConfig {
  readonly vf: number;
  /** Administrative MAC, lower-case colon form ("00:00:00:00:00:00" when unset). */
  readonly mac: string;
  readonly vlan: number;
  readonly qos: number;
  readonly vlanProto: VlanProto;
  /** null: the driver does not report it. */
  readonly spoofchk: boolean | null;
  readonly trust: boolean | null;
  readonly linkState: VfLinkState | null;
  /** Mbps; 0 = no limit. */
  readonly minTxRate: number;
  readonly maxTxRate: number;
}

/** One change made through the PF (`ip link set <pf> vf N …`). */
export type VfChange =
  | { readonly kind: 'vlan'; readonly vlan: number; readonly qos: number; readonly proto: VlanProto }
  | { readonly kind: 'mac'; readonly mac: string }
  | { readonly kind: 'rate'; readonly minTxRate: number; readonly maxTxRate: number }
  | { readonly kind: 'spoofchk'; readonly on: boolean }
  | { readonly kind: 'trust'; readonly on: boolean }
  | { readonly kind: 'linkState'; readonly state: VfLinkState };

/** Bytes that are not the attribute layout the kernel writes. */
export class VfCodecError extends Error {
  constructor(
    readonly where: string,
    reason: string,
  ) {
    super(`${where}: ${reason}`);
    this.name = 'VfCodecError';
  }
}

const LE = endianness() === 'LE';

function u32(buf: Buffer, off: number): number {
  return LE ? buf.readUInt32LE(off) : buf.readUInt32BE(off);
}

function putU32(buf: Buffer, off: number, v: number): void {
  if (LE) buf.writeUInt32LE(v >>> 0, off);
  else buf.writeUInt32BE(v >>> 0, off);
}

function u16(buf: Buffer, off: number): number {
  return LE ? buf.readUInt16LE(off) : buf.readUInt16BE(off);
}

const align4 = (n: number): number => (n + 3) & ~3;

interface Attr {
  readonly type: number;
  readonly data: Buffer;
}

/** The attributes in `buf` (rtattr: u16 len incl. 4-byte header, u16 type, data, pad to 4). */
export function parseAttrs(buf: Buffer, where: string): Attr[] {
  const out: Attr[] = [];
  let off = 0;
  while (off + 4 <= buf.length) {
    const len = u16(buf, off);
    const type = u16(buf, off + 2) & NLA_TYPE_MASK;
    if (len < 4 || off + len > buf.length) throw new VfCodecError(where, `attribute ${type} at offset ${off} has length ${len} (${buf.length - off} bytes left)`);
    out.push({ type, data: buf.subarray(off + 4, off + len) });
    off += align4(len);
  }
  return out;
}

function attr(type: number, data: Buffer, nested = false): Buffer {
  const len = 4 + data.length;
  const out = Buffer.alloc(align4(len));
  if (LE) {
    out.writeUInt16LE(len, 0);
    out.writeUInt16LE(type | (nested ? NLA_F_NESTED : 0), 2);
  } else {
    out.writeUInt16BE(len, 0);
    out.writeUInt16BE(type | (nested ? NLA_F_NESTED : 0), 2);
  }
  data.copy(out, 4);
  return out;
}

function u32s(...values: number[]): Buffer {
  const b = Buffer.alloc(values.length * 4);
  values.forEach((v, i) => putU32(b, i * 4, v));
  return b;
}

function need(data: Buffer, len: number, where: string): void {
  if (data.length < len) throw new VfCodecError(where, `${data.length} bytes, expected at least ${len}`);
}

function flag(v: number): boolean | null {
  return v === UNSUPPORTED ? null : v !== 0;
}

function protoName(p: number, where: string): VlanProto {
  if (p === 0 || p === ETH_P_8021Q) return '802.1q';
  if (p === ETH_P_8021AD) return '802.1ad';
  throw new VfCodecError(where, `unknown VLAN protocol 0x${p.toString(16)}`);
}

/** One IFLA_VF_INFO nest. */
export function decodeVfInfo(data: Buffer): VfConfig {
  let vf: number | null = null;
  let mac = '00:00:00:00:00:00';
  let vlan = 0;
  let qos = 0;
  let vlanProto: VlanProto = '802.1q';
  let spoofchk: boolean | null = null;
  let trust: boolean | null = null;
  let linkState: VfLinkState | null = null;
  let minTxRate = 0;
  let maxTxRate = 0;
  let txRate = 0;
  let sawRate = false;
  let sawVlanList = false;
  for (const a of parseAttrs(data, 'IFLA_VF_INFO')) {
    const d = a.data;
    switch (a.type) {
      case IFLA_VF_MAC: {
        need(d, 4 + 6, 'IFLA_VF_MAC');
        vf = u32(d, 0);
        mac = macFromBuffer(d.subarray(4, 10)) ?? mac;
        break;
      }
      case IFLA_VF_VLAN:
        need(d, 12, 'IFLA_VF_VLAN');
        if (!sawVlanList) {
          vlan = u32(d, 4);
          qos = u32(d, 8);
        }
        break;
      case IFLA_VF_VLAN_LIST: {
        // The first entry is the one `ip link set … vf N vlan` configures (QinQ lists are not used).
        const first = parseAttrs(d, 'IFLA_VF_VLAN_LIST').find((x) => x.type === IFLA_VF_VLAN_INFO);
        if (first) {
          need(first.data, 14, 'IFLA_VF_VLAN_INFO');
          vlan = u32(first.data, 4);
          qos = u32(first.data, 8);
          vlanProto = protoName(first.data.readUInt16BE(12), 'IFLA_VF_VLAN_INFO');
          sawVlanList = true;
        }
        break;
      }
      case IFLA_VF_TX_RATE:
        need(d, 8, 'IFLA_VF_TX_RATE');
        txRate = u32(d, 4);
        break;
      case IFLA_VF_RATE:
        need(d, 12, 'IFLA_VF_RATE');
        minTxRate = u32(d, 4);
        maxTxRate = u32(d, 8);
        sawRate = true;
        break;
      case IFLA_VF_SPOOFCHK:
        need(d, 8, 'IFLA_VF_SPOOFCHK');
        spoofchk = flag(u32(d, 4));
        break;
      case IFLA_VF_TRUST:
        need(d, 8, 'IFLA_VF_TRUST');
        trust = flag(u32(d, 4));
        break;
      case IFLA_VF_LINK_STATE: {
        need(d, 8, 'IFLA_VF_LINK_STATE');
        linkState = LINK_STATES[u32(d, 4)] ?? null;
        break;
      }
      default:
        break; // stats, GUIDs, broadcast, RSS: not configured by weft
    }
  }
  if (vf === null) throw new VfCodecError('IFLA_VF_INFO', 'no IFLA_VF_MAC (the VF number)');
  // Old kernels only report the legacy max rate.
  if (!sawRate) maxTxRate = txRate;
  return { vf, mac, vlan, qos, vlanProto, spoofchk, trust, linkState, minTxRate, maxTxRate };
}

/** The payload of IFLA_VFINFO_LIST: every VF the PF reports, in the kernel's order. */
export function decodeVfInfoList(payload: Buffer): VfConfig[] {
  return parseAttrs(payload, 'IFLA_VFINFO_LIST')
    .filter((a) => a.type === IFLA_VF_INFO)
    .map((a) => decodeVfInfo(a.data));
}

export interface LinkVfInfo {
  readonly ifindex: number;
  readonly ifname: string | null;
  /** IFLA_NUM_VF; null when the device reports none (not a PCI device, or no SR-IOV). */
  readonly numVf: number | null;
  readonly vfs: readonly VfConfig[];
}

/**
 * An RTM_NEWLINK message body (after the 16-byte nlmsghdr: ifinfomsg + attributes), as a dump
 * with IFLA_EXT_MASK = RTEXT_FILTER_VF returns it: the link's name and VF list.
 */
export function decodeLinkVfInfo(body: Buffer): LinkVfInfo {
  need(body, IFINFOMSG_LEN, 'ifinfomsg');
  const ifindex = LE ? body.readInt32LE(4) : body.readInt32BE(4);
  let ifname: string | null = null;
  let numVf: number | null = null;
  let vfs: VfConfig[] = [];
  for (const a of parseAttrs(body.subarray(IFINFOMSG_LEN), 'RTM_NEWLINK')) {
    if (a.type === IFLA_IFNAME) ifname = a.data.toString('utf8').replace(/\0.*$/s, '');
    else if (a.type === IFLA_NUM_VF) {
      need(a.data, 4, 'IFLA_NUM_VF');
      numVf = u32(a.data, 0);
    } else if (a.type === IFLA_VFINFO_LIST) vfs = decodeVfInfoList(a.data);
  }
  return { ifindex, ifname, numVf, vfs };
}

function protoNumber(p: VlanProto): number {
  return p === '802.1ad' ? ETH_P_8021AD : ETH_P_8021Q;
}

/** One change as the IFLA_VF_* attribute the kernel's do_setvfinfo() takes. */
export function encodeVfChange(vf: number, c: VfChange): Buffer {
  switch (c.kind) {
    case 'mac': {
      const data = Buffer.alloc(4 + 32);
      putU32(data, 0, vf);
      macToBuffer(parseMac(c.mac)).copy(data, 4);
      return attr(IFLA_VF_MAC, data);
    }
    case 'vlan': {
      // IFLA_VF_VLAN_LIST carries the protocol; iproute2 uses it whenever a protocol is given.
      const info = Buffer.alloc(14);
      putU32(info, 0, vf);
      putU32(info, 4, c.vlan);
      putU32(info, 8, c.qos);
      info.writeUInt16BE(protoNumber(c.proto), 12);
      return attr(IFLA_VF_VLAN_LIST, attr(IFLA_VF_VLAN_INFO, info), true);
    }
    case 'rate':
      return attr(IFLA_VF_RATE, u32s(vf, c.minTxRate, c.maxTxRate));
    case 'spoofchk':
      return attr(IFLA_VF_SPOOFCHK, u32s(vf, c.on ? 1 : 0));
    case 'trust':
      return attr(IFLA_VF_TRUST, u32s(vf, c.on ? 1 : 0));
    case 'linkState':
      return attr(IFLA_VF_LINK_STATE, u32s(vf, LINK_STATES.indexOf(c.state)));
  }
}

/**
 * The IFLA_VFINFO_LIST attribute of an RTM_SETLINK on the PF that applies `changes` to VF `vf`
 * (one IFLA_VF_INFO nest; the kernel applies its attributes in its own fixed order).
 */
export function encodeVfInfoList(vf: number, changes: readonly VfChange[]): Buffer {
  const info = attr(IFLA_VF_INFO, Buffer.concat(changes.map((c) => encodeVfChange(vf, c))), true);
  return attr(IFLA_VFINFO_LIST, info, true);
}
