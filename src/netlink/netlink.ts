// weft's one door to rtnetlink, over npm `netlink@0.3.0`. Netlink is a facade: each
// method hands its NetlinkConnection to a plain function of the module for its subject.
// - connection.ts: the sockets, their buffers and bounds, the request and dump plumbing, socket
//   failure and close: the state every module shares.
// - links.ts (links, vxlan devices), addresses-routes.ts (addresses; routes and nexthop objects
//   read back), neighbours.ts (neighbours, FDB), events.ts (link notifications): one subject each,
//   using only the connection; codec.ts converts between the library's structs and weft's types.
// - this module: opening the handle, and apply(). apply() has a raw socket of its own (batch.ts,
//   with the ops encoded by ops.ts) and packs many requests into each sendmsg; it is not ordered
//   against link/address calls made concurrently on the other sockets — await those first.
import type { RtNetlinkSocket } from 'netlink';

import type { IPAddr } from '../util/ip.js';
import {
  addAddress,
  deleteAddress,
  listAddresses,
  listNexthops,
  listRoutes,
  supportsNexthops,
  type NexthopFilter,
  type RouteFilter,
} from './addresses-routes.js';
import { BatchSocket } from './batch.js';
import {
  DEFAULT_MAX_IN_FLIGHT,
  DEFAULT_PACK_SIZE,
  DEFAULT_REQUEST_TIMEOUT_MS,
  NetlinkConnection,
  openSocket,
  SOCKET_BUFFER_BYTES,
  type NetlinkOptions,
} from './connection.js';
import { watchLinks } from './events.js';
import { Limiter, Mutex } from './limiter.js';
import { createVxlan, deleteLink, getLink, getLinkByIndex, listLinks, setLink, type LinkChange } from './links.js';
import { listFdb, listNeighbours } from './neighbours.js';
import { GONE_ERRNOS, isDeleteOp } from './ops.js';
import type {
  AddrEntry,
  ApplyResult,
  FdbEntry,
  LinkEvent,
  LinkInfo,
  NeighEntry,
  NetlinkError,
  NetlinkOp,
  NexthopEntry,
  RouteEntry,
  VxlanSpec,
  Watch,
} from './types.js';

export class Netlink {
  private constructor(private readonly conn: NetlinkConnection) {}

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
      const makeBatch = (onFatal: (err: NetlinkError) => void): BatchSocket => new BatchSocket(batchOpts, onFatal);
      return new Netlink(new NetlinkConnection(ctl, dumper, limiter, new Mutex(), timeoutMs, makeBatch));
    } catch (e) {
      for (const s of opened) s.socket.close();
      throw e;
    }
  }

  /** apply()'s effective bounds: maxInFlight after the receive-buffer cap, and requests per sendmsg. */
  get applyLimits(): { maxInFlight: number; packSize: number } {
    return { maxInFlight: this.conn.batch.effectiveMaxInFlight, packSize: this.conn.batch.effectivePackSize };
  }

  // -------------------------------------------------------------------------------------------
  // Links (links.ts)

  links(): Promise<LinkInfo[]> {
    return listLinks(this.conn);
  }

  link(name: string): Promise<LinkInfo | null> {
    return getLink(this.conn, name);
  }

  linkByIndex(index: number): Promise<LinkInfo | null> {
    return getLinkByIndex(this.conn, index);
  }

  createVxlan(spec: VxlanSpec): Promise<LinkInfo> {
    return createVxlan(this.conn, spec);
  }

  deleteLink(index: number): Promise<void> {
    return deleteLink(this.conn, index);
  }

  setLink(index: number, change: LinkChange): Promise<void> {
    return setLink(this.conn, index, change);
  }

  // -------------------------------------------------------------------------------------------
  // Addresses, routes and nexthops (addresses-routes.ts)

  addresses(index?: number): Promise<AddrEntry[]> {
    return listAddresses(this.conn, index);
  }

  addAddress(index: number, ip: IPAddr, prefix: number): Promise<void> {
    return addAddress(this.conn, index, ip, prefix);
  }

  deleteAddress(index: number, ip: IPAddr, prefix: number): Promise<void> {
    return deleteAddress(this.conn, index, ip, prefix);
  }

  routes(filter: RouteFilter): Promise<RouteEntry[]> {
    return listRoutes(this.conn, filter);
  }

  nexthops(filter: NexthopFilter = {}): Promise<NexthopEntry[]> {
    return listNexthops(this.conn, filter);
  }

  supportsNexthops(): Promise<boolean> {
    return supportsNexthops(this.conn);
  }

  // -------------------------------------------------------------------------------------------
  // Neighbours and FDB (neighbours.ts)

  neighbours(ifindex: number, family: 4 | 6): Promise<NeighEntry[]> {
    return listNeighbours(this.conn, ifindex, family);
  }

  fdb(ifindex: number): Promise<FdbEntry[]> {
    return listFdb(this.conn, ifindex);
  }

  // -------------------------------------------------------------------------------------------
  // Events (events.ts)

  watchLinks(onEvent: (ev: LinkEvent) => void, onError?: (err: NetlinkError) => void): Watch {
    return watchLinks(this.conn, onEvent, onError);
  }

  /** Closes the sockets and every watch; requests still outstanding fail with ECANCELED. */
  close(): void {
    this.conn.close();
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
      this.conn.batch.submit({
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
}
