// weft's one door to rtnetlink, over npm `netlink@0.3.0` (libs.md §1). Every socket gets 4 MiB
// buffers and requests in flight are bounded, because a receive-buffer overflow aborts the whole
// process inside that library. Dumps run one at a time on their own socket: the library cannot
// tell a dump's parts from other replies interleaved with them, and the kernel allows one dump
// per socket at a time. apply() has a raw socket of its own (batch.ts) and packs many requests
// into each sendmsg; it is not ordered against link/address calls made concurrently on the
// other sockets — await those first.
import { AttrStream, createRtNetlink, Flags, FlagsGet, FlagsNew, ifla, rt, type RtNetlinkSocket } from 'netlink';

import type { IPAddr } from '../util/ip.js';
import { BatchSocket } from './batch.js';
import {
  addrFromMessage,
  afOf,
  AF_BRIDGE,
  fdbFromMessage,
  GONE_ERRNOS,
  ipToBuffer,
  isDeleteOp,
  linkFromMessage,
  neighFromMessage,
  nexthopFromMessage,
  routeFromMessage,
  SKIP_STATS_MASK,
  streamToBuffer,
  toNetlinkError,
  u16be,
  u32ne,
} from './codec.js';
import { Limiter, Mutex } from './limiter.js';
import { isValidMac, macToBuffer } from '../util/mac.js';
import { NHMSG_LEN, RTM_GETNEXTHOP } from './wire.js';
import {
  NetlinkError,
  type AddrEntry,
  type ApplyResult,
  type FdbEntry,
  type LinkEvent,
  type LinkInfo,
  type Mac,
  type NeighEntry,
  type NetlinkOp,
  type NexthopEntry,
  type RouteEntry,
  type VxlanSpec,
  type Watch,
} from './types.js';

/** SO_RCVBUF/SO_SNDBUF for every socket; the kernel caps it at net.core.rmem_max/wmem_max. */
export const SOCKET_BUFFER_BYTES = 4 << 20;
export const DEFAULT_MAX_IN_FLIGHT = 128;
/** apply() sends this many requests per sendmsg (bounded by maxInFlight). */
export const DEFAULT_PACK_SIZE = 64;
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/** A dump the kernel marks inconsistent (NLM_F_DUMP_INTR) is retried this many times, then fails with EINTR. */
export const DUMP_ATTEMPTS = 4;

const RTM_NEWLINK = 16;
const RTM_DELLINK = 17;
const { CREATE, EXCL } = FlagsNew;

export interface NetlinkOptions {
  /**
   * Requests outstanding at once on the request socket, and apply()'s requests sent and not yet
   * answered on its own socket (default 128; apply() also caps it by that socket's receive
   * buffer: ~2 KiB per answer).
   */
  maxInFlight?: number;
  /** A request (for apply(): a pack) without an answer after this long fails with ETIMEDOUT (default 30 s). */
  requestTimeoutMs?: number;
  /** apply() requests per sendmsg (default 64, at most maxInFlight). 1 = one request per send. */
  packSize?: number;
  /**
   * apply() asks every request for an ACK instead of only each pack's last one (the others
   * answer only when they fail). Same results, more work for the kernel and for us; for
   * comparison. Default false.
   */
  ackEach?: boolean;
}

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

type Describe = () => string;
/** Options every request carries: the timeout, and the socket's port so the library does not ask the kernel for it (getsockname) on every send. */
interface ReqOpts {
  timeout: number;
  localPort: number;
}
type SocketCall<T> = (s: RtNetlinkSocket, o: ReqOpts) => Promise<T>;

function openSocket(ref: boolean): RtNetlinkSocket {
  return createRtNetlink({ ref, recvBufferSize: SOCKET_BUFFER_BYTES, sendBufferSize: SOCKET_BUFFER_BYTES });
}

/** dev_valid_name() in net/core/dev.c. */
export function isValidIfName(name: unknown): name is string {
  return (
    typeof name === 'string' &&
    name.length > 0 &&
    Buffer.byteLength(name) < 16 &&
    name !== '.' &&
    name !== '..' &&
    !/[/:\s]/.test(name)
  );
}

/** Answers to a nexthop dump from a kernel without nexthop objects (< 5.3). */
const NO_NEXTHOP_ERRNOS: ReadonlySet<string> = new Set(['EOPNOTSUPP', 'ENOTSUP', 'EINVAL', 'EAFNOSUPPORT']);

function invalid(op: string, reason: string): NetlinkError {
  return new NetlinkError('EINVAL', op, `invalid argument: ${reason}`);
}

export class Netlink {
  private closed = false;
  /** Set when a socket reported an error; the handle is unusable and the owner must reopen. */
  private failure: NetlinkError | null = null;
  private readonly aborts = new Set<(e: NetlinkError) => void>();
  private readonly watches = new Set<Watch>();
  private readonly ctlOpts: ReqOpts;
  private readonly dumpOpts: ReqOpts;

  private nexthopProbe: Promise<boolean> | null = null;
  private readonly batch: BatchSocket;

  private constructor(
    private readonly ctl: RtNetlinkSocket,
    private readonly dumper: RtNetlinkSocket,
    private readonly limiter: Limiter,
    private readonly dumpLock: Mutex,
    private readonly timeoutMs: number,
    makeBatch: (onFatal: (err: NetlinkError) => void) => BatchSocket,
  ) {
    this.batch = makeBatch((err) => this.fail(err));
    this.ctlOpts = { timeout: timeoutMs, localPort: ctl.socket.address().port };
    this.dumpOpts = { timeout: timeoutMs, localPort: dumper.socket.address().port };
    for (const s of [ctl, dumper]) {
      s.socket.on('error', (e) => this.fail(new NetlinkError(e.code || 'EIO', 'netlink socket', e.message)));
    }
  }

  /** Opens the request and dump sockets (rtnetlink, 4 MiB send and receive buffers). */
  static open(opts: NetlinkOptions = {}): Netlink {
    const maxInFlight = opts.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT;
    const packSize = opts.packSize ?? DEFAULT_PACK_SIZE;
    if (!Number.isInteger(packSize) || packSize < 1) throw new RangeError(`packSize must be a positive integer, got ${packSize}`);
    const limiter = new Limiter(maxInFlight);
    const timeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    const opened: RtNetlinkSocket[] = [];
    try {
      const ctl = openSocket(false);
      opened.push(ctl);
      const dumper = openSocket(false);
      opened.push(dumper);
      const batchOpts = {
        maxInFlight,
        packSize,
        timeoutMs,
        ackEach: opts.ackEach === true,
        recvBufferSize: SOCKET_BUFFER_BYTES,
        sendBufferSize: SOCKET_BUFFER_BYTES,
      };
      return new Netlink(ctl, dumper, limiter, new Mutex(), timeoutMs, (onFatal) => new BatchSocket(batchOpts, onFatal));
    } catch (e) {
      for (const s of opened) s.socket.close();
      throw e;
    }
  }

  /** apply()'s effective bounds: maxInFlight after the receive-buffer cap, and requests per sendmsg. */
  get applyLimits(): { maxInFlight: number; packSize: number } {
    return { maxInFlight: this.batch.effectiveMaxInFlight, packSize: this.batch.effectivePackSize };
  }

  // -------------------------------------------------------------------------------------------
  // Links

  async links(): Promise<LinkInfo[]> {
    const msgs = await this.dump(
      () => 'link dump',
      rt.MessageType.GETLINK,
      (out) => rt.formatLinkMessage({ kind: 'link', data: {}, attrs: { extMask: SKIP_STATS_MASK } }, out),
      rt.parseLinkMessage,
    );
    return msgs.map(linkFromMessage);
  }

  /** The link with this name, or null when there is none. */
  async link(name: string): Promise<LinkInfo | null> {
    const op = `link-get ${name}`;
    if (!isValidIfName(name)) throw invalid(op, `bad interface name ${JSON.stringify(name)}`);
    return this.getOne(op, (s, o) => s.getLink({}, { ifname: name, extMask: SKIP_STATS_MASK }, o));
  }

  async linkByIndex(index: number): Promise<LinkInfo | null> {
    const op = `link-get index ${index}`;
    if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
    return this.getOne(op, (s, o) => s.getLink({ index }, { extMask: SKIP_STATS_MASK }, o));
  }

  private async getOne(op: string, fn: SocketCall<rt.LinkMessage[]>): Promise<LinkInfo | null> {
    try {
      const [m] = await this.request(() => op, fn);
      return m ? linkFromMessage(m) : null;
    } catch (e) {
      if (e instanceof NetlinkError && e.errno === 'ENODEV') return null;
      throw e;
    }
  }

  /** Creates a VXLAN device (CREATE|EXCL: an existing name fails with EEXIST). It is left down. */
  async createVxlan(spec: VxlanSpec): Promise<LinkInfo> {
    const op = `vxlan-create ${spec.name} id ${spec.vni} local ${String(spec.local)} dev ${spec.link} dstport ${spec.port}`;
    if (!isValidIfName(spec.name)) throw invalid(op, `bad interface name ${JSON.stringify(spec.name)}`);
    if (!Number.isInteger(spec.vni) || spec.vni < 0 || spec.vni >= 1 << 24) throw invalid(op, `VNI must be 0..16777215`);
    if (!Number.isInteger(spec.port) || spec.port < 0 || spec.port > 65535) throw invalid(op, `port must be 0..65535`);
    if (!Number.isInteger(spec.link) || spec.link <= 0) throw invalid(op, `bad underlay ifindex ${spec.link}`);
    if (spec.mtu !== undefined && (!Number.isInteger(spec.mtu) || spec.mtu < 68)) throw invalid(op, `bad MTU ${spec.mtu}`);
    if (spec.mac !== undefined && !isValidMac(spec.mac)) throw invalid(op, `bad MAC ${JSON.stringify(spec.mac)}`);

    const vx: ifla.Vxlan = { id: spec.vni, link: spec.link, learning: spec.learning ? 1 : 0 };
    if (spec.local.family === 4) vx.local = ipToBuffer(spec.local);
    else vx.local6 = ipToBuffer(spec.local);
    if (spec.port !== 0) vx.port = u16be(spec.port); // 0: the kernel's default (8472)
    if (spec.gbp) vx.gbp = true;
    const attrs: ifla.LinkAttrs = {
      ifname: spec.name,
      linkinfo: streamToBuffer(ifla.formatInfo({ kind: 'vxlan', data: streamToBuffer(ifla.formatVxlan(vx)) })),
    };
    if (spec.mtu !== undefined) attrs.mtu = spec.mtu;
    if (spec.mac !== undefined) attrs.address = macToBuffer(spec.mac);
    await this.request(
      () => op,
      (s, o) => s.newLink({}, attrs, { ...o, flags: CREATE | EXCL }),
    );
    const link = await this.link(spec.name);
    if (!link) throw new NetlinkError('ENODEV', op, 'created, but gone before it could be read back');
    return link;
  }

  async deleteLink(index: number): Promise<void> {
    const op = `link-delete index ${index}`;
    if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
    await this.request(
      () => op,
      (s, o) => s.delLink({ index }, {}, o),
    );
  }

  /** Changes admin state, MTU and/or MAC in one request (the kernel sets the MAC before the flags). */
  async setLink(index: number, change: { up?: boolean; mtu?: number; mac?: Mac }): Promise<void> {
    const parts = [`link-set index ${index}`];
    if (change.up !== undefined) parts.push(change.up ? 'up' : 'down');
    if (change.mtu !== undefined) parts.push(`mtu ${change.mtu}`);
    if (change.mac !== undefined) parts.push(`address ${change.mac}`);
    const op = parts.join(' ');
    if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
    if (change.mtu !== undefined && (!Number.isInteger(change.mtu) || change.mtu < 68)) throw invalid(op, `bad MTU ${change.mtu}`);
    if (change.mac !== undefined && !isValidMac(change.mac)) throw invalid(op, `bad MAC ${JSON.stringify(change.mac)}`);
    const data: rt.Link = { index };
    if (change.up !== undefined) {
      data.change = { up: true };
      data.flags = change.up ? { up: true } : {};
    }
    const attrs: ifla.LinkAttrs = {};
    if (change.mtu !== undefined) attrs.mtu = change.mtu;
    if (change.mac !== undefined) attrs.address = macToBuffer(change.mac);
    if (data.change === undefined && Object.keys(attrs).length === 0) return;
    await this.request(
      () => op,
      (s, o) => s.setLink(data, attrs, o),
    );
  }

  // -------------------------------------------------------------------------------------------
  // Addresses

  /** IPv4 and IPv6 addresses, of one link or of all. */
  async addresses(index?: number): Promise<AddrEntry[]> {
    const msgs = await this.dump(
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
  async addAddress(index: number, ip: IPAddr, prefix: number): Promise<void> {
    const op = `address-add ${String(ip)}/${prefix} dev ${index}`;
    this.checkAddr(op, index, ip, prefix);
    const buf = ipToBuffer(ip);
    try {
      await this.request(
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
  async deleteAddress(index: number, ip: IPAddr, prefix: number): Promise<void> {
    const op = `address-delete ${String(ip)}/${prefix} dev ${index}`;
    this.checkAddr(op, index, ip, prefix);
    const buf = ipToBuffer(ip);
    try {
      await this.request(
        () => op,
        (s, o) =>
          s.delAddress({ family: afOf(ip.family), prefixlen: prefix, index }, { local: buf, address: buf }, o),
      );
    } catch (e) {
      if (e instanceof NetlinkError && e.errno === 'EADDRNOTAVAIL') return;
      throw e;
    }
  }

  private checkAddr(op: string, index: number, ip: IPAddr, prefix: number): void {
    if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
    if (!Number.isInteger(prefix) || prefix < 0 || prefix > ip.bits) throw invalid(op, `bad prefix length ${prefix}`);
  }

  // -------------------------------------------------------------------------------------------
  // Dumps

  /**
   * All routes of a family (every table unless `table` is given), filtered here, not in the
   * kernel. A route through a nexthop object has `nhid` set and gateway/oif/onlink of that
   * nexthop, like `ip route` shows it.
   */
  async routes(filter: RouteFilter): Promise<RouteEntry[]> {
    const msgs = await this.dump(
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
      const byId = new Map((await this.nexthops()).map((n) => [n.id, n]));
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
  async nexthops(filter: NexthopFilter = {}): Promise<NexthopEntry[]> {
    const msgs = await this.dump(
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
  supportsNexthops(): Promise<boolean> {
    this.nexthopProbe ??= this.nexthops().then(
      () => true,
      (e: unknown) => {
        if (e instanceof NetlinkError && NO_NEXTHOP_ERRNOS.has(e.errno)) return false;
        this.nexthopProbe = null;
        throw e;
      },
    );
    return this.nexthopProbe;
  }

  /** ARP (4) or NDP (6) entries of one device, in every state. */
  async neighbours(ifindex: number, family: 4 | 6): Promise<NeighEntry[]> {
    const af = afOf(family);
    const msgs = await this.dump(
      () => `neigh dump ipv${family} dev ${ifindex}`,
      rt.MessageType.GETNEIGH,
      // NDA_IFINDEX lets the kernel filter; we filter again in case it did not.
      (out) => rt.formatNeighborMessage({ kind: 'neighbor', data: { family: af }, attrs: { ifindex: u32ne(ifindex) } }, out),
      rt.parseNeighborMessage,
    );
    const out: NeighEntry[] = [];
    for (const m of msgs) {
      if (m.data.ifindex !== ifindex || m.data.family !== af) continue;
      const n = neighFromMessage(m);
      if (n) out.push(n);
    }
    return out;
  }

  /** Bridge forwarding entries (AF_BRIDGE) of one device; for vxlan, one entry per remote. */
  async fdb(ifindex: number): Promise<FdbEntry[]> {
    const msgs = await this.dump(
      () => `fdb dump dev ${ifindex}`,
      rt.MessageType.GETNEIGH,
      (out) => rt.formatNeighborMessage({ kind: 'neighbor', data: { family: AF_BRIDGE }, attrs: {} }, out),
      rt.parseNeighborMessage,
    );
    const out: FdbEntry[] = [];
    for (const m of msgs) {
      if (m.data.ifindex !== ifindex || m.data.family !== AF_BRIDGE) continue;
      const f = fdbFromMessage(m);
      if (f) out.push(f);
    }
    return out;
  }

  // -------------------------------------------------------------------------------------------
  // Batches

  /**
   * Sends every op in the given order, many per sendmsg (packSize), with at most maxInFlight
   * sent and not yet answered. Never rejects because of one op: failures are collected, each with
   * the kernel's errno for exactly that op. A delete of something already gone (ESRCH, ENOENT,
   * ENODEV) counts as applied. Concurrent calls are sent one after the other, in call order.
   */
  apply(ops: readonly NetlinkOp[]): Promise<ApplyResult> {
    // A copy: ops are encoded as room frees up, after the caller may have reused its array.
    const list = ops.slice();
    if (list.length === 0) return Promise.resolve({ applied: 0, failures: [] });
    return new Promise((resolve) => {
      let applied = 0;
      let pending = list.length;
      const failures: Array<{ index: number; op: NetlinkOp; error: NetlinkError }> = [];
      this.batch.submit({
        ops: list,
        settle: (index, error) => {
          const op = list[index]!;
          if (error === null || (isDeleteOp(op) && GONE_ERRNOS.has(error.errno))) applied++;
          else failures.push({ index, op, error });
          if (--pending > 0) return;
          failures.sort((a, b) => a.index - b.index);
          resolve({ applied, failures: failures.map(({ op, error }) => ({ op, error })) });
        },
      });
    });
  }

  // -------------------------------------------------------------------------------------------
  // Events

  /**
   * Link notifications (RTMGRP_LINK) on a socket of their own. 'new' covers creation and every
   * change. onError gets socket failures (after which the watch is closed: reopen it and resync)
   * and notifications that could not be decoded; without it they become process warnings.
   *
   * The callbacks run outside the library's native callback: an exception thrown inside that
   * would abort the process (C++ terminate), so one thrown by onEvent/onError is rethrown from
   * setImmediate, where it is an ordinary uncaught exception.
   */
  watchLinks(onEvent: (ev: LinkEvent) => void, onError?: (err: NetlinkError) => void): Watch {
    if (this.closed) throw new NetlinkError('ECANCELED', 'link watch', 'netlink handle is closed');
    const rethrow = (e: unknown): void => {
      setImmediate(() => {
        throw e;
      });
    };
    const report = (err: NetlinkError): void => {
      try {
        if (onError) onError(err);
        else process.emitWarning(err.message, 'NetlinkWarning');
      } catch (e) {
        rethrow(e);
      }
    };
    const s = openSocket(true);
    let open = true;
    const watch: Watch = {
      close: () => {
        if (!open) return;
        open = false;
        this.watches.delete(watch);
        s.socket.close();
      },
    };
    // The parsed 'message' event drops nlmsg_type, so NEW and DEL look the same (libs.md (f)).
    s.socket.on('message', (msgs) => {
      for (const m of msgs) {
        if (!open) return;
        if (m.type !== RTM_NEWLINK && m.type !== RTM_DELLINK) continue;
        let link: LinkInfo;
        try {
          link = linkFromMessage(rt.parseLinkMessage(m.data));
        } catch (e) {
          report(toNetlinkError(e, 'link watch: decode notification'));
          continue;
        }
        try {
          onEvent({ type: m.type === RTM_NEWLINK ? 'new' : 'del', link });
        } catch (e) {
          rethrow(e);
        }
      }
    });
    s.socket.on('error', (e) => {
      watch.close();
      report(new NetlinkError(e.code || 'EIO', 'link watch', e.message));
    });
    try {
      s.addMembership('LINK');
    } catch (e) {
      s.socket.close();
      throw toNetlinkError(e, 'link watch: join RTMGRP_LINK');
    }
    this.watches.add(watch);
    return watch;
  }

  /** Closes the sockets and every watch; requests still outstanding fail with ECANCELED. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const w of [...this.watches]) w.close();
    const closed = new NetlinkError('ECANCELED', 'netlink', 'netlink handle closed');
    this.abortAll(closed);
    this.batch.close(closed);
    this.ctl.socket.close();
    this.dumper.socket.close();
  }

  // -------------------------------------------------------------------------------------------
  // Plumbing

  private fail(err: NetlinkError): void {
    if (this.failure || this.closed) return;
    this.failure = err;
    this.abortAll(err);
    this.batch.abort(new NetlinkError(err.errno, err.op, `netlink socket failed: ${err.detail}`));
  }

  private abortAll(err: NetlinkError): void {
    for (const abort of [...this.aborts]) abort(err);
    this.aborts.clear();
  }

  /** A request on the control socket, holding one in-flight slot. */
  private request<T>(describe: Describe, fn: SocketCall<T>): Promise<T> {
    return this.guard(describe, () => this.limiter.run(() => this.guardOpen(describe, () => fn(this.ctl, this.ctlOpts))));
  }

  /**
   * A dump on the dump socket, one at a time. It goes through the untyped request so the
   * message flags survive: a dump that raced with changes (NLM_F_DUMP_INTR) is repeated.
   */
  private dump<T>(describe: Describe, type: number, format: (out: AttrStream) => void, parse: (data: Buffer) => T): Promise<T[]> {
    const once = async (): Promise<{ items: T[]; interrupted: boolean }> => {
      const out = new AttrStream();
      format(out);
      const [msgs] = await this.dumper.socket.request(type, out.bufs, { ...this.dumpOpts, flags: FlagsGet.DUMP });
      let interrupted = false;
      const items: T[] = [];
      for (const m of msgs) {
        if (m.flags & Flags.DUMP_INTR) interrupted = true;
        items.push(parse(m.data));
      }
      return { items, interrupted };
    };
    return this.guard(describe, () =>
      this.dumpLock.run(() =>
        this.guardOpen(describe, async () => {
          for (let attempt = 1; ; attempt++) {
            const { items, interrupted } = await once();
            if (!interrupted) return items;
            if (attempt >= DUMP_ATTEMPTS) {
              throw new NetlinkError('EINTR', describe(), `dump interrupted by concurrent changes ${attempt} times in a row`);
            }
          }
        }),
      ),
    );
  }

  /** Re-checks after waiting for a slot: the handle may have been closed meanwhile. */
  private guardOpen<T>(describe: Describe, fn: () => Promise<T>): Promise<T> {
    const dead = this.deadError(describe);
    return dead ? Promise.reject(dead) : fn();
  }

  private deadError(describe: Describe): NetlinkError | null {
    if (this.closed) return new NetlinkError('ECANCELED', describe(), 'netlink handle is closed');
    if (this.failure) return new NetlinkError(this.failure.errno, describe(), `netlink socket failed: ${this.failure.detail}`);
    return null;
  }

  /** Maps every rejection to a NetlinkError, and lets close()/socket failure end the wait. */
  private guard<T>(describe: Describe, fn: () => Promise<T>): Promise<T> {
    const dead = this.deadError(describe);
    if (dead) return Promise.reject(dead);
    return new Promise<T>((resolve, reject) => {
      const abort = (e: NetlinkError): void => reject(new NetlinkError(e.errno, describe(), e.detail));
      this.aborts.add(abort);
      fn().then(
        (v) => {
          this.aborts.delete(abort);
          resolve(v);
        },
        (e: unknown) => {
          this.aborts.delete(abort);
          reject(toNetlinkError(e, describe()));
        },
      );
    });
  }
}
