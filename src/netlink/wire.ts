// Netlink messages written and read by hand, for the hot path (apply()) and for what the library
// does not know (nexthop objects). The library's encoders build a small Buffer per field and
// concatenate them, which costs more per op than the kernel spends on a neighbour; here a message
// is written straight into the pack it is sent in. Everything is in host byte order except where
// the kernel says otherwise (IP addresses, the VXLAN port).
import { endianness } from 'node:os';

export const NLMSG_HDRLEN = 16;
export const NLMSG_ERROR = 2;
export const NLMSG_DONE = 3;

export const NLM_F_REQUEST = 0x01;
export const NLM_F_ACK = 0x04;
export const NLM_F_REPLACE = 0x100;
export const NLM_F_EXCL = 0x200;
export const NLM_F_CREATE = 0x400;

export const RTM_NEWROUTE = 24;
export const RTM_DELROUTE = 25;
export const RTM_NEWNEIGH = 28;
export const RTM_DELNEIGH = 29;
export const RTM_NEWNEXTHOP = 104;
export const RTM_DELNEXTHOP = 105;
export const RTM_GETNEXTHOP = 106;

export const RTA_DST = 1;
export const RTA_OIF = 4;
export const RTA_GATEWAY = 5;
export const RTA_TABLE = 15;
export const RTA_NH_ID = 30;

export const NDA_DST = 1;
export const NDA_LLADDR = 2;

/** include/uapi/linux/nexthop.h */
export const NHA_ID = 1;
export const NHA_GROUP = 2;
export const NHA_BLACKHOLE = 4;
export const NHA_OIF = 5;
export const NHA_GATEWAY = 6;

/** sizeof(struct rtmsg), sizeof(struct ndmsg), sizeof(struct nhmsg). */
export const RTMSG_LEN = 12;
export const NDMSG_LEN = 12;
export const NHMSG_LEN = 8;

const LE = endianness() === 'LE';

export const align4 = (n: number): number => (n + 3) & ~3;

export function readU16(b: Buffer, off: number): number {
  return LE ? b.readUInt16LE(off) : b.readUInt16BE(off);
}
export function readU32(b: Buffer, off: number): number {
  return LE ? b.readUInt32LE(off) : b.readUInt32BE(off);
}
export function readS32(b: Buffer, off: number): number {
  return LE ? b.readInt32LE(off) : b.readInt32BE(off);
}

// Host-order integer stores as plain byte writes: this runs a dozen times per op, and the
// Buffer.write* methods' range checks and dispatch cost more than the writes themselves.
type Put = (b: Buffer, o: number, v: number) => void;
const put16: Put = LE
  ? (b, o, v) => {
      b[o] = v & 0xff;
      b[o + 1] = (v >>> 8) & 0xff;
    }
  : (b, o, v) => {
      b[o] = (v >>> 8) & 0xff;
      b[o + 1] = v & 0xff;
    };
const put32: Put = LE
  ? (b, o, v) => {
      b[o] = v & 0xff;
      b[o + 1] = (v >>> 8) & 0xff;
      b[o + 2] = (v >>> 16) & 0xff;
      b[o + 3] = (v >>> 24) & 0xff;
    }
  : (b, o, v) => {
      b[o] = (v >>> 24) & 0xff;
      b[o + 1] = (v >>> 16) & 0xff;
      b[o + 2] = (v >>> 8) & 0xff;
      b[o + 3] = v & 0xff;
    };

/** Hex digit value of a char code, or -1. */
function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48; // 0-9
  if (c >= 97 && c <= 102) return c - 87; // a-f
  if (c >= 65 && c <= 70) return c - 55; // A-F
  return -1;
}

/**
 * Writes netlink messages back to back into one growing buffer: a pack that goes out in one
 * sendmsg. The buffer handed to the socket must not be touched until the send completes, so a
 * writer is used for one pack only. Everything past the write position is kept zero (fresh
 * allocations are zeroed, abort() re-zeroes), so padding and reserved fields need no writes.
 */
export class MessageWriter {
  private buf: Buffer;
  private off = 0;
  private start = -1;

  constructor(capacity = 4096) {
    this.buf = Buffer.alloc(capacity);
  }

  get length(): number {
    return this.off;
  }

  /** The messages written so far (a view, not a copy). */
  bytes(): Buffer {
    return this.buf.subarray(0, this.off);
  }

  /** Starts a message; its length is filled in by end(). Returns the message's offset. */
  begin(type: number, flags: number, seq: number, port: number): number {
    this.ensure(NLMSG_HDRLEN);
    const o = this.off;
    this.start = o;
    put16(this.buf, o + 4, type);
    put16(this.buf, o + 6, flags);
    put32(this.buf, o + 8, seq);
    put32(this.buf, o + 12, port);
    this.off += NLMSG_HDRLEN;
    return o;
  }

  end(): void {
    put32(this.buf, this.start, this.off - this.start);
    this.start = -1;
  }

  /** ORs flags into the header of the message at offset o (e.g. NLM_F_ACK on a pack's last). */
  orFlags(o: number, flags: number): void {
    put16(this.buf, o + 6, readU16(this.buf, o + 6) | flags);
  }

  /** Drops the message begun last (its arguments turned out to be invalid). */
  abort(): void {
    if (this.start >= 0) {
      this.buf.fill(0, this.start, this.off);
      this.off = this.start;
      this.start = -1;
    }
  }

  /** Reserves `len` zero bytes of fixed header (rtmsg, ndmsg, ...) and returns its offset. */
  struct(len: number): number {
    this.ensure(align4(len));
    const o = this.off;
    this.off += align4(len);
    return o;
  }

  u8At(o: number, v: number): void {
    this.buf[o] = v & 0xff;
  }
  u16At(o: number, v: number): void {
    put16(this.buf, o, v);
  }
  u32At(o: number, v: number): void {
    put32(this.buf, o, v >>> 0);
  }
  s32At(o: number, v: number): void {
    put32(this.buf, o, v | 0);
  }

  attr(type: number, data: Uint8Array): void {
    const len = 4 + data.length;
    this.ensure(align4(len));
    const o = this.off;
    put16(this.buf, o, len);
    put16(this.buf, o + 2, type);
    this.buf.set(data, o + 4);
    this.off += align4(len);
  }

  attrU32(type: number, v: number): void {
    this.ensure(8);
    const o = this.off;
    put16(this.buf, o, 8);
    put16(this.buf, o + 2, type);
    put32(this.buf, o + 4, v >>> 0);
    this.off += 8;
  }

  attrFlag(type: number): void {
    this.ensure(4);
    put16(this.buf, this.off, 4);
    put16(this.buf, this.off + 2, type);
    this.off += 4;
  }

  /** An IP address attribute: 4 or 16 bytes, network byte order. */
  attrIp(type: number, family: 4 | 6, value: bigint): void {
    const n = family === 4 ? 4 : 16;
    this.ensure(4 + n);
    const o = this.off;
    put16(this.buf, o, 4 + n);
    put16(this.buf, o + 2, type);
    if (family === 4) {
      const v = Number(value);
      this.buf[o + 4] = (v >>> 24) & 0xff;
      this.buf[o + 5] = (v >>> 16) & 0xff;
      this.buf[o + 6] = (v >>> 8) & 0xff;
      this.buf[o + 7] = v & 0xff;
    } else {
      this.buf.writeBigUInt64BE(value >> 64n, o + 4);
      this.buf.writeBigUInt64BE(value & 0xffff_ffff_ffff_ffffn, o + 12);
    }
    this.off += 4 + n;
  }

  /**
   * A 6-byte MAC attribute from text in the form isValidMac() accepts (six two-digit hex
   * octets, one separator kind, ':' or '-'). Returns false, writing nothing, for anything else.
   */
  attrMac(type: number, text: string): boolean {
    if (typeof text !== 'string' || text.length !== 17) return false;
    const sep = text.charCodeAt(2);
    if (sep !== 58 /* : */ && sep !== 45 /* - */) return false;
    this.ensure(12);
    const o = this.off;
    for (let i = 0; i < 6; i++) {
      const hi = hexValue(text.charCodeAt(i * 3));
      const lo = hexValue(text.charCodeAt(i * 3 + 1));
      if (hi < 0 || lo < 0 || (i < 5 && text.charCodeAt(i * 3 + 2) !== sep)) {
        this.buf.fill(0, o, o + 12);
        return false;
      }
      this.buf[o + 4 + i] = (hi << 4) | lo;
    }
    put16(this.buf, o, 10);
    put16(this.buf, o + 2, type);
    this.off += 12;
    return true;
  }

  private ensure(n: number): void {
    if (this.off + n <= this.buf.length) return;
    const next = Buffer.alloc(Math.max(this.buf.length * 2, this.off + n));
    this.buf.copy(next, 0, 0, this.off);
    this.buf = next;
  }
}

export interface ReplyHeader {
  type: number;
  flags: number;
  seq: number;
  /** For NLMSG_ERROR: the positive errno (0 = ACK); else 0. */
  errno: number;
}

/** Calls fn for each message in a datagram; stops at a malformed length. */
export function forEachMessage(b: Buffer, fn: (h: ReplyHeader, payload: Buffer) => void): void {
  let off = 0;
  while (off + NLMSG_HDRLEN <= b.length) {
    const len = readU32(b, off);
    if (len < NLMSG_HDRLEN || off + len > b.length) return;
    const type = readU16(b, off + 4);
    const errno = type === NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 ? -readS32(b, off + NLMSG_HDRLEN) : 0;
    fn({ type, flags: readU16(b, off + 6), seq: readU32(b, off + 8), errno }, b.subarray(off + NLMSG_HDRLEN, off + len));
    off += align4(len);
  }
}

/** Calls fn(type, payload) for each attribute of a TLV stream; stops at a malformed length. */
export function forEachAttr(b: Buffer, fn: (type: number, payload: Buffer) => void): void {
  let off = 0;
  while (off + 4 <= b.length) {
    const len = readU16(b, off);
    if (len < 4 || off + len > b.length) return;
    // The top two bits are NLA_F_NESTED / NLA_F_NET_BYTEORDER.
    fn(readU16(b, off + 2) & 0x3fff, b.subarray(off + 4, off + len));
    off += align4(len);
  }
}
