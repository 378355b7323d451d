// A worker thread of the dataplane bench's helper (inside the node's namespace) that watches the
// kernel: rtnetlink notifications on a raw socket of its own (routes, neighbours/FDB, nexthops),
// each stamped with CLOCK_MONOTONIC when it is read, keyed by what it is about; plus the counting
// poller and the exact checks of kernel-counter.ts. A thread of its own so that nothing else the
// helper does (etcd writes, the fake API server) delays a stamp.
import { parentPort } from 'node:worker_threads';

import { Protocol, RawNetlinkSocket } from 'netlink';

import { WEFT_ROUTE_PROTOCOL } from '../../src/netlink/index.js';
import {
  align4,
  NDA_DST,
  NDA_LLADDR,
  NDMSG_LEN,
  NHA_ID,
  NHMSG_LEN,
  NLMSG_HDRLEN,
  readU16,
  readU32,
  RTA_DST,
  RTA_NH_ID,
  RTA_TABLE,
  RTM_DELNEIGH,
  RTM_DELNEXTHOP,
  RTM_DELROUTE,
  RTM_NEWNEIGH,
  RTM_NEWROUTE,
  RTMSG_LEN,
} from '../../src/netlink/wire.js';
import { mono } from './common.js';
import { EventLog, type ExpectResult } from './event-log.js';
import { AF_BRIDGE, AF_INET, KernelCounter, MAIN_TABLE, NUD_PERMANENT, pollConverged, type ConvergeRequest, type Counts, type PollResult, type Verdict } from './kernel-counter.js';
import { serve } from './rpc.js';

/** rtnetlink multicast groups (RTNLGRP_*). */
const GROUPS = { neigh: 3, route: 7, nexthop: 32 } as const;
export type Group = keyof typeof GROUPS;

export interface KernelEvents {
  readonly log: Array<[string, number[]]>;
  readonly events: number;
  /** Receive-buffer overruns (ENOBUFS): notifications were lost, the log is incomplete. */
  readonly overflows: number;
}

export type KernelOps = {
  subscribe: { req: { groups: Group[] }; res: { rcvbufBytes: number } };
  unsubscribe: { req: Record<string, never>; res: KernelEvents };
  expect: { req: { keys: string[]; timeoutMs: number }; res: ExpectResult };
  take: { req: Record<string, never>; res: KernelEvents };
  converge: { req: ConvergeRequest; res: PollResult };
  counts: { req: Record<string, never>; res: Counts };
  verifyVxlan: { req: { slots: number[] }; res: Verdict };
  verifyHostGw: { req: { slots: number[]; dev: string }; res: Verdict };
};

/** Keys of the log: r+/r- route dst, n+/n- neighbour IP, f+/f- FDB MAC, h- nexthop id. */
export const key = {
  routeAdd: (dst: string) => `r+${dst}`,
  routeDel: (dst: string) => `r-${dst}`,
  neighAdd: (ip: string) => `n+${ip}`,
  neighDel: (ip: string) => `n-${ip}`,
  fdbAdd: (mac: string) => `f+${mac}`,
  fdbDel: (mac: string) => `f-${mac}`,
};

function attrs(b: Buffer, start: number, end: number): Map<number, [number, number]> {
  const out = new Map<number, [number, number]>();
  for (let off = start; off + 4 <= end; ) {
    const len = readU16(b, off);
    if (len < 4 || off + len > end) break;
    out.set(readU16(b, off + 2) & 0x3fff, [off + 4, off + len]);
    off += align4(len);
  }
  return out;
}

const ipv4 = (b: Buffer, o: number): string => `${b[o]}.${b[o + 1]}.${b[o + 2]}.${b[o + 3]}`;
const mac = (b: Buffer, o: number): string =>
  Array.from(b.subarray(o, o + 6), (x) => x.toString(16).padStart(2, '0')).join(':');

class Listener {
  private raw: RawNetlinkSocket | null = null;
  readonly log = new EventLog();
  overflows = 0;
  /** Route dst → its nexthop id, and back: deleting a nexthop removes its routes without RTM_DELROUTE. */
  private readonly nhOf = new Map<string, number>();
  private readonly dstsOf = new Map<number, Set<string>>();

  async subscribe(groups: Group[], counter: KernelCounter): Promise<number> {
    this.close();
    this.log.reset();
    this.overflows = 0;
    this.nhOf.clear();
    this.dstsOf.clear();
    // SO_RCVBUF is capped by net.core.rmem_max (the kernel doubles what it grants).
    const raw = new RawNetlinkSocket(Protocol.ROUTE, { recvBufferSize: 32 << 20, sendBufferSize: 1 << 16 });
    raw.on('message', (b: Buffer) => this.receive(b, mono()));
    raw.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOBUFS') this.overflows++;
      else process.stderr.write(`kernel listener: ${e.message}\n`);
    });
    for (const g of groups) raw.addMembership(GROUPS[g]);
    this.raw = raw;
    if (groups.includes('nexthop')) {
      // The routes already there, with their nexthop ids (after joining: nothing is missed).
      for (const r of await counter.nl.routes({ family: 4, table: MAIN_TABLE, protocol: WEFT_ROUTE_PROTOCOL })) {
        if (r.nhid !== null) this.bind(r.dst.toString(), r.nhid);
      }
    }
    return raw.getRecvBufferSize();
  }

  private bind(dst: string, nh: number | null): void {
    const old = this.nhOf.get(dst);
    if (old !== undefined) this.dstsOf.get(old)?.delete(dst);
    if (nh === null) {
      this.nhOf.delete(dst);
      return;
    }
    this.nhOf.set(dst, nh);
    let s = this.dstsOf.get(nh);
    if (!s) this.dstsOf.set(nh, (s = new Set()));
    s.add(dst);
  }

  private receive(b: Buffer, t: number): void {
    for (let off = 0; off + NLMSG_HDRLEN <= b.length; ) {
      const len = readU32(b, off);
      if (len < NLMSG_HDRLEN || off + len > b.length) break;
      const type = readU16(b, off + 4);
      const p = off + NLMSG_HDRLEN;
      const end = off + len;
      if (type === RTM_NEWROUTE || type === RTM_DELROUTE) this.route(type, b, p, end, t);
      else if (type === RTM_NEWNEIGH || type === RTM_DELNEIGH) this.neigh(type, b, p, end, t);
      else if (type === RTM_DELNEXTHOP) this.nexthopGone(b, p, end, t);
      off += align4(len);
    }
  }

  private route(type: number, b: Buffer, p: number, end: number, t: number): void {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags u32
    if (b[p] !== AF_INET || b[p + 5] !== WEFT_ROUTE_PROTOCOL) return;
    const a = attrs(b, p + RTMSG_LEN, end);
    const table = a.get(RTA_TABLE);
    if ((table ? readU32(b, table[0]) : b[p + 4]) !== MAIN_TABLE) return;
    const d = a.get(RTA_DST);
    const dst = `${d ? ipv4(b, d[0]) : '0.0.0.0'}/${b[p + 1]}`;
    if (type === RTM_NEWROUTE) {
      const nh = a.get(RTA_NH_ID);
      this.bind(dst, nh ? readU32(b, nh[0]) : null);
      this.log.record(key.routeAdd(dst), t);
    } else {
      this.bind(dst, null);
      this.log.record(key.routeDel(dst), t);
    }
  }

  private neigh(type: number, b: Buffer, p: number, end: number, t: number): void {
    // struct ndmsg: family u8, pad u8, pad u16, ifindex s32, state u16, flags u8, type u8
    const family = b[p];
    const add = type === RTM_NEWNEIGH;
    // An entry is there once announced permanent; `ip neigh del` announces the deletion with the
    // state it left the entry in (NUD_FAILED), so any deletion counts.
    if (add && (readU16(b, p + 8) & NUD_PERMANENT) === 0) return;
    const a = attrs(b, p + NDMSG_LEN, end);
    if (family === AF_INET) {
      const d = a.get(NDA_DST);
      if (d && d[1] - d[0] >= 4) this.log.record(add ? key.neighAdd(ipv4(b, d[0])) : key.neighDel(ipv4(b, d[0])), t);
    } else if (family === AF_BRIDGE) {
      const l = a.get(NDA_LLADDR);
      if (l && l[1] - l[0] >= 6 && a.has(NDA_DST)) this.log.record(add ? key.fdbAdd(mac(b, l[0])) : key.fdbDel(mac(b, l[0])), t);
    }
  }

  /** The kernel removes a deleted nexthop's routes silently: each counts as deleted now. */
  private nexthopGone(b: Buffer, p: number, end: number, t: number): void {
    const id = attrs(b, p + NHMSG_LEN, end).get(NHA_ID);
    if (!id) return;
    const nh = readU32(b, id[0]);
    this.log.record(`h-${nh}`, t);
    for (const dst of [...(this.dstsOf.get(nh) ?? [])]) {
      this.bind(dst, null);
      this.log.record(key.routeDel(dst), t);
    }
    this.dstsOf.delete(nh);
  }

  events(): KernelEvents {
    return { log: this.log.snapshot(), events: this.log.events, overflows: this.overflows };
  }

  close(): void {
    this.raw?.close();
    this.raw = null;
  }
}

function main(): void {
  const counter = new KernelCounter();
  const listener = new Listener();
  serve<KernelOps>(
    {
      subscribe: async ({ groups }) => ({ rcvbufBytes: await listener.subscribe(groups, counter) }),
      unsubscribe: async () => {
        listener.close();
        return listener.events();
      },
      expect: ({ keys, timeoutMs }) => listener.log.expect(keys, timeoutMs),
      take: async () => listener.events(),
      converge: (req) => pollConverged(counter, req),
      counts: () => counter.counts(),
      verifyVxlan: ({ slots }) => counter.verifyVxlan(slots),
      verifyHostGw: ({ slots, dev }) => counter.verifyHostGw(slots, dev),
    },
    parentPort,
  );
}

if (parentPort) main();
