// Reading the node's kernel state for the namespace benchmarks: cheap counting dumps for polling
// (only each message's fixed header is looked at) and exact, decoded checks of every peer's
// entries (untimed).
import { endianness } from 'node:os';

import { Protocol, RawNetlinkSocket } from 'netlink';

import { Netlink, WEFT_ROUTE_PROTOCOL } from '../../src/netlink/index.js';
import { align4, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, readS32, readU16, readU32 } from '../../src/netlink/wire.js';
import { BenchError, cachedPeer, mono } from './common.js';

export const VXLAN = 'flannel.1';
export const NUD_PERMANENT = 0x80;
const NLM_F_DUMP = 0x300;
const NLM_F_DUMP_INTR = 0x10;
const RTM_GETROUTE = 26;
const RTM_GETNEIGH = 30;
export const RTN_UNICAST = 1;
export const AF_INET = 2;
export const AF_BRIDGE = 7;
export const MAIN_TABLE = 254;

export interface Counts {
  readonly routes: number;
  readonly neighbours: number;
  readonly fdb: number;
}

export interface Verdict {
  /** The first few problems. */
  readonly problems: string[];
  /** How many problems in all (0: exact). */
  readonly total: number;
}

interface Dumping {
  readonly seq: number;
  readonly match: (b: Buffer, payload: number) => boolean;
  count: number;
  interrupted: boolean;
  resolve(v: number | null): void;
  reject(e: Error): void;
}

/**
 * Counts kernel entries from dumps on a raw rtnetlink socket, looking only at the fixed header of
 * each message (no attribute decoding, no object per message): cheap enough to poll while weftd
 * works on the other core.
 */
export class KernelCounter {
  private readonly raw = new RawNetlinkSocket(Protocol.ROUTE, { recvBufferSize: 4 << 20, sendBufferSize: 1 << 20 });
  readonly nl = Netlink.open();
  private seq = 1;
  private current: Dumping | null = null;

  constructor() {
    this.raw.on('message', (b: Buffer) => this.receive(b));
    this.raw.on('error', (e: Error) => this.current?.reject(e));
  }

  private receive(b: Buffer): void {
    const cur = this.current;
    for (let off = 0; cur && off + NLMSG_HDRLEN <= b.length; ) {
      const len = readU32(b, off);
      if (len < NLMSG_HDRLEN || off + len > b.length) break;
      if (readU32(b, off + 8) === cur.seq) {
        const type = readU16(b, off + 4);
        if ((readU16(b, off + 6) & NLM_F_DUMP_INTR) !== 0) cur.interrupted = true;
        if (type === NLMSG_DONE) {
          this.current = null;
          cur.resolve(cur.interrupted ? null : cur.count);
          return;
        }
        if (type === NLMSG_ERROR) {
          this.current = null;
          cur.reject(new BenchError(`netlink dump failed: errno ${-readS32(b, off + NLMSG_HDRLEN)}`));
          return;
        }
        if (cur.match(b, off + NLMSG_HDRLEN)) cur.count++;
      }
      off += align4(len);
    }
  }

  /** Entries of a dump that `match` accepts; null when the kernel marked it inconsistent. */
  private dump(type: number, family: number, match: (b: Buffer, payload: number) => boolean): Promise<number | null> {
    if (this.current) return Promise.reject(new BenchError('one dump at a time'));
    const seq = this.seq++;
    // nlmsghdr + a zeroed rtmsg/ndmsg (12 bytes each) carrying only the family.
    const req = Buffer.alloc(NLMSG_HDRLEN + 12);
    const le = endianness() === 'LE';
    const u32 = (v: number, o: number) => (le ? req.writeUInt32LE(v, o) : req.writeUInt32BE(v, o));
    const u16 = (v: number, o: number) => (le ? req.writeUInt16LE(v, o) : req.writeUInt16BE(v, o));
    u32(req.length, 0);
    u16(type, 4);
    u16(NLM_F_REQUEST | NLM_F_DUMP, 6);
    u32(seq, 8);
    req[NLMSG_HDRLEN] = family;
    return new Promise((resolve, reject) => {
      this.current = { seq, match, count: 0, interrupted: false, resolve, reject };
      this.raw.send(req, {}, (err) => {
        if (err && this.current?.seq === seq) {
          this.current = null;
          reject(err);
        }
      });
    });
  }

  /** IPv4 /24 unicast routes in the main table with weft's protocol number. */
  routes(): Promise<number | null> {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type
    return this.dump(RTM_GETROUTE, AF_INET, (b, p) => b[p] === AF_INET && b[p + 1] === 24 && b[p + 4] === MAIN_TABLE && b[p + 5] === WEFT_ROUTE_PROTOCOL && b[p + 7] === RTN_UNICAST);
  }

  /** Permanent entries of one device in an ARP (AF_INET) or FDB (AF_BRIDGE) dump. */
  permanentNeigh(family: number, ifindex: number): Promise<number | null> {
    // struct ndmsg: family u8, pad u8, pad u16, ifindex s32, state u16, flags u8, type u8
    return this.dump(RTM_GETNEIGH, family, (b, p) => b[p] === family && readS32(b, p + 4) === ifindex && (readU16(b, p + 8) & NUD_PERMANENT) !== 0);
  }

  async vxlanIndex(): Promise<number | null> {
    return (await this.nl.link(VXLAN))?.index ?? null;
  }

  async counts(): Promise<Counts> {
    const vx = await this.vxlanIndex();
    const routes = (await this.routes()) ?? -1;
    if (vx === null) return { routes, neighbours: 0, fdb: 0 };
    return {
      routes,
      neighbours: (await this.permanentNeigh(AF_INET, vx)) ?? -1,
      fdb: (await this.permanentNeigh(AF_BRIDGE, vx)) ?? -1,
    };
  }

  /**
   * Exactly the vxlan entries of these peer slots and nothing else weft owns: a permanent
   * neighbour (subnet address → VTEP MAC), an FDB entry (MAC → public IP) and a route via the
   * subnet address, onlink, through a nexthop object; and no weft nexthop object that no route
   * uses (decoded, not timed).
   */
  async verifyVxlan(slots: readonly number[]): Promise<Verdict> {
    const problems: string[] = [];
    const n = slots.length;
    const vx = await this.vxlanIndex();
    if (vx === null) return { problems: [`no ${VXLAN}`], total: 1 };
    const neigh = new Map((await this.nl.neighbours(vx, 4)).filter((e) => e.permanent).map((e) => [e.ip.toString(), e.mac]));
    const fdb = new Map((await this.nl.fdb(vx)).filter((e) => e.permanent && e.self).map((e) => [e.mac, e.dst?.toString() ?? null]));
    const routes = new Map(
      (await this.nl.routes({ family: 4, table: MAIN_TABLE, protocol: WEFT_ROUTE_PROTOCOL })).map((r) => [r.dst.toString(), r]),
    );
    if (neigh.size !== n) problems.push(`${neigh.size} permanent neighbours, expected ${n}`);
    if (fdb.size !== n) problems.push(`${fdb.size} FDB entries, expected ${n}`);
    if (routes.size !== n) problems.push(`${routes.size} proto ${WEFT_ROUTE_PROTOCOL} routes, expected ${n}`);
    await this.unusedNexthops(routes, problems);
    for (const i of slots) {
      const p = cachedPeer(i);
      const gw = p.subnet.ip.toString();
      if (neigh.get(gw) !== p.mac) problems.push(`neighbour ${gw}: ${neigh.get(gw) ?? 'missing'}, expected ${p.mac}`);
      if (fdb.get(p.mac) !== p.pub.toString()) problems.push(`fdb ${p.mac}: ${fdb.get(p.mac) ?? 'missing'}, expected dst ${p.pub.toString()}`);
      const r = routes.get(p.subnet.toString());
      const form = r ? `via ${r.gateway?.toString() ?? '-'} oif ${r.oif ?? '-'}${r.onlink ? ' onlink' : ''} nhid ${r.nhid ?? '-'}` : 'missing';
      if (!r || r.gateway?.toString() !== gw || r.oif !== vx || !r.onlink || r.nhid === null) {
        problems.push(`route ${p.subnet.toString()}: ${form}, expected via ${gw} dev ${VXLAN} onlink through a nexthop object`);
      }
    }
    return { problems: problems.slice(0, 5), total: problems.length };
  }

  /** Exactly the host-gw routes of these slots (via the peer's public IP on `dev`) and no other weft route. */
  async verifyHostGw(slots: readonly number[], dev: string): Promise<Verdict> {
    const problems: string[] = [];
    const oif = (await this.nl.link(dev))?.index;
    if (oif === undefined) return { problems: [`no ${dev}`], total: 1 };
    const routes = new Map(
      (await this.nl.routes({ family: 4, table: MAIN_TABLE, protocol: WEFT_ROUTE_PROTOCOL })).map((r) => [r.dst.toString(), r]),
    );
    if (routes.size !== slots.length) problems.push(`${routes.size} proto ${WEFT_ROUTE_PROTOCOL} routes, expected ${slots.length}`);
    await this.unusedNexthops(routes, problems);
    for (const i of slots) {
      const p = cachedPeer(i);
      const r = routes.get(p.subnet.toString());
      if (!r || r.gateway?.toString() !== p.pub.toString() || r.oif !== oif) {
        const form = r ? `via ${r.gateway?.toString() ?? '-'} oif ${r.oif ?? '-'}` : 'missing';
        problems.push(`route ${p.subnet.toString()}: ${form}, expected via ${p.pub.toString()} dev ${dev}`);
      }
    }
    return { problems: problems.slice(0, 5), total: problems.length };
  }

  /** weft's nexthop objects (protocol 88) that no route uses: left over from deleted peers. */
  private async unusedNexthops(routes: ReadonlyMap<string, { nhid: number | null }>, problems: string[]): Promise<void> {
    const used = new Set([...routes.values()].map((r) => r.nhid));
    const unused = (await this.nl.nexthops()).filter((h) => h.protocol === WEFT_ROUTE_PROTOCOL && !used.has(h.id));
    if (unused.length > 0) problems.push(`${unused.length} weft nexthop objects no route uses (ids ${unused.slice(0, 3).map((h) => h.id).join(', ')} …)`);
  }

  close(): void {
    this.raw.close();
    this.nl.close();
  }
}

export interface ConvergeRequest {
  /** Routes to wait for, and (vxlan) as many neighbours and FDB entries. */
  readonly n: number;
  /** host-gw: routes only. */
  readonly routesOnly: boolean;
  readonly pollMs: number;
  readonly timeoutMs: number;
  /** Each poll to stderr. */
  readonly trace: boolean;
}

export interface PollResult {
  readonly startAt: number;
  /** End of the poll that found everything present: an upper bound of the convergence instant. */
  readonly doneAt: number;
  /** End of the dump that first showed all routes. */
  readonly routesAt: number;
  /** Start of the previous poll, which did not: a lower bound. */
  readonly lastMissAt: number | null;
  readonly polls: number;
  readonly pollMedianMs: number;
  readonly pollMaxMs: number;
}

/**
 * Polls until every entry is present: the route count first (cheap, and weft sends routes after
 * the neighbours, FDB entries and nexthops), then the neighbour and FDB counts of flannel.1. A kind
 * found complete is not dumped again: entries are only added here. Times are `clock()` stamps.
 */
export async function pollConverged(kernel: KernelCounter, req: ConvergeRequest, clock: () => number = mono): Promise<PollResult> {
  const startAt = clock();
  const deadline = startAt + req.timeoutMs;
  const cycles: number[] = [];
  let lastMissAt: number | null = null;
  let routesAt: number | null = null;
  let neighOk = req.routesOnly;
  let fdbOk = req.routesOnly;
  const last = { routes: 0, neighbours: 0, fdb: 0 };
  while (true) {
    const t0 = clock();
    if (routesAt === null) {
      last.routes = (await kernel.routes()) ?? -1;
      if (last.routes >= req.n) routesAt = clock();
    }
    const vx = routesAt !== null && !req.routesOnly ? await kernel.vxlanIndex() : null;
    if (vx !== null && !neighOk) {
      last.neighbours = (await kernel.permanentNeigh(AF_INET, vx)) ?? -1;
      neighOk = last.neighbours >= req.n;
    }
    if (vx !== null && neighOk && !fdbOk) {
      last.fdb = (await kernel.permanentNeigh(AF_BRIDGE, vx)) ?? -1;
      fdbOk = last.fdb >= req.n;
    }
    const t1 = clock();
    cycles.push(t1 - t0);
    if (req.trace) process.stderr.write(`poll +${(t0 - startAt).toFixed(1)} ms took ${(t1 - t0).toFixed(1)} ms: ${JSON.stringify(last)}\n`);
    if (routesAt !== null && neighOk && fdbOk) {
      const sorted = [...cycles].sort((x, y) => x - y);
      return {
        startAt,
        doneAt: t1,
        routesAt,
        lastMissAt,
        polls: cycles.length,
        pollMedianMs: sorted[Math.floor(sorted.length / 2)]!,
        pollMaxMs: sorted[sorted.length - 1]!,
      };
    }
    lastMissAt = t0;
    if (t1 > deadline) throw new BenchError(`not converged after ${req.timeoutMs} ms: ${JSON.stringify(last)} of ${req.n}`);
    await new Promise((r) => setTimeout(r, req.pollMs));
  }
}
