// host-local IPAM: hands out one IP per range set from a directory shared by every plugin process
// on the node (see store.ts), in the reference's order, under the reference's flock. The verbs
// follow plugins/ipam/host-local/main.go; GC (spec 1.1, not in the reference 1.1.1) frees the IPs
// of attachments the runtime no longer lists, and touches nothing but reservation files.
import { IPNet, type IPAddr } from '../../src/util/ip.js';
import { CniError, CURRENT_VERSION, ErrorCode, type CniIPConfig, type CniPlugin, type CniRequest, type CniResult, type NetConf } from '../skel/types.js';
import { candidates } from './allocator.js';
import { DEFAULT_DATA_DIR, HostLocalConfigError, isStoreName, loadConfig, rangeFor, rangeSetString, type HostLocalConfig, type RangeSet } from './config.js';
import { readResolvConf } from './dns.js';
import { DiskStore, heldBy, isReservationFile, ownedBy, selectGarbage, type Attachment } from './store.js';
import { leftAloneLine, warnOnStderr } from '../lib/owned-files.js';
import { fromSync } from '../lib/promise.js';
import { errorMessage } from '../../src/util/errors.js';

/** An allocation that cannot be satisfied (taken, exhausted, duplicate). Code 999, as the reference. */
export class AllocationError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'AllocationError';
  }
}

/** The runtime's CNI_ARGS, verbatim when we have it (the reference's parser is strict about it). */
function cniArgsOf(req: CniRequest): string {
  const raw = req.env['CNI_ARGS'];
  if (typeof raw === 'string') return raw;
  return [...req.args].map(([k, v]) => `${k}=${v}`).join(';');
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Where the store lives, without validating the ranges: DEL and GC must free addresses even when
 * the ranges of the config they are given no longer validate.
 */
export function storeLocation(conf: NetConf): { name: string; dataDir: string } {
  try {
    const full = loadConfig(conf, { ignoreArgs: true });
    return { name: full.name, dataDir: full.dataDir };
  } catch (e) {
    const ipam = conf.ipam;
    const name = conf.name;
    if (!(e instanceof HostLocalConfigError) || !isObject(ipam)) throw e;
    if (!isStoreName(name)) throw e;
    const dataDir = ipam['dataDir'];
    if (dataDir !== undefined && dataDir !== null && typeof dataDir !== 'string') throw e;
    return { name, dataDir: dataDir || DEFAULT_DATA_DIR };
  }
}

function addressOf(ip: IPAddr, subnet: IPNet): string {
  return `${ip.toString()}/${subnet.prefix}`;
}

/**
 * Reserves one IP per range set for (containerId, ifname). The caller holds the store lock. On
 * any failure every IP reserved here is released again (last_reserved_ip.* keeps its new value,
 * as upstream).
 */
export function allocate(store: DiskStore, conf: HostLocalConfig, containerId: string, ifname: string): CniIPConfig[] {
  const existing = store.list();
  const taken = new Set(existing.map((r) => r.ip.toString()));
  const held = heldBy(existing, containerId, ifname);
  const pending = [...conf.requestedIPs];
  const reservedHere: string[] = [];

  const reserve = (ip: IPAddr, idx: number): boolean => {
    const ok = store.reserve(ip, containerId, ifname, idx);
    taken.add(ip.toString());
    if (ok) reservedHere.push(ip.toString());
    return ok;
  };

  const fromSet = (set: RangeSet, idx: number): CniIPConfig => {
    const want = pending.findIndex((ip) => rangeFor(set, ip) !== undefined);
    if (want >= 0) {
      const ip = pending.splice(want, 1)[0]!;
      const r = rangeFor(set, ip)!;
      if (ip.equals(r.gateway)) throw new AllocationError(`requested ip ${ip.toString()} is subnet's gateway`);
      if (!reserve(ip, idx)) {
        throw new AllocationError(`requested IP address ${ip.toString()} is not available in range set ${rangeSetString(set)}`);
      }
      return { address: addressOf(ip, r.subnet), gateway: r.gateway.toString() };
    }
    // Spec: a second ADD for the same attachment is an error, not a second address.
    const dup = held.find((r) => rangeFor(set, r.ip) !== undefined);
    if (dup) {
      throw new AllocationError(`${dup.ip.toString()} has been allocated to ${containerId}, duplicate allocation is not allowed`);
    }
    for (const { ip, range } of candidates(set, store.lastReservedIP(idx))) {
      if (taken.has(ip.toString())) continue;
      if (reserve(ip, idx)) return { address: addressOf(ip, range.subnet), gateway: range.gateway.toString() };
    }
    throw new AllocationError(`no IP addresses available in range set: ${rangeSetString(set)}`);
  };

  try {
    const ips: CniIPConfig[] = [];
    for (const [idx, set] of conf.rangeSets.entries()) {
      try {
        ips.push(fromSet(set, idx));
      } catch (e) {
        const code = e instanceof CniError ? e.code : ErrorCode.Internal;
        throw new CniError(code, `failed to allocate for range ${idx}: ${errorMessage(e)}`);
      }
    }
    if (pending.length > 0) {
      throw new AllocationError(`failed to allocate all requested IPs: ${pending.map((ip) => ip.toString()).join(' ')}`);
    }
    return ips;
  } catch (e) {
    for (const file of reservedHere) {
      try {
        store.release(file);
      } catch {
        // best effort: the original error is the one to report
      }
    }
    throw e;
  }
}

/** GC's list of live attachments; null when the runtime sent none (then nothing is known to be garbage). */
export function validAttachments(conf: NetConf): Attachment[] | null {
  const key = conf['cni.dev/valid-attachments'] !== undefined ? 'cni.dev/valid-attachments' : 'cni.dev/attachments';
  const v = conf[key];
  if (v === undefined || v === null) return null;
  const bad = (): never => {
    throw new HostLocalConfigError(`${key} must be a list of {"containerID": string, "ifname": string}`);
  };
  if (!Array.isArray(v)) return bad();
  return v.map((a: unknown) => {
    if (!isObject(a) || typeof a['containerID'] !== 'string' || typeof a['ifname'] !== 'string') return bad();
    return { containerId: a['containerID'], ifname: a['ifname'] };
  });
}

export interface HostLocalPluginOptions {
  /** Where GC's one line about files it left alone goes (default: stderr). */
  readonly warn?: (line: string) => void;
}

/**
 * GC under the store lock: frees the reservations no valid attachment owns. Only reservation
 * files (isReservationFile) are candidates: lock, last_reserved_ip.*, any other name, symlinks,
 * directories and other file types, and IP-named files holding something else are left as they
 * are, the last ones named in one warning.
 */
async function collectGarbage(req: CniRequest, warn: (line: string) => void): Promise<void> {
  const valid = validAttachments(req.config);
  const { name, dataDir } = storeLocation(req.config);
  if (valid === null) return;
  const store = new DiskStore(dataDir, name);
  const foreign = await store.withLock(() => {
    const list = store.list();
    for (const r of selectGarbage(list, valid)) store.releaseListed(r);
    return list.filter((r) => !isReservationFile(r)).map((r) => r.file);
  });
  const line = leftAloneLine('host-local', store.dir, 'a reservation (an IP address)', foreign);
  if (line !== '') warn(line);
}

export const hostLocalPlugin: CniPlugin = {
  name: 'host-local',

  async add(req: CniRequest): Promise<CniResult> {
    const conf = loadConfig(req.config, { cniArgs: cniArgsOf(req) });
    const dns = conf.resolvConf !== null ? readResolvConf(conf.resolvConf) : undefined;
    const store = new DiskStore(conf.dataDir, conf.name);
    const ips = await store.withLock(() => allocate(store, conf, req.containerId, req.ifname));
    const result: CniResult = { cniVersion: CURRENT_VERSION, ips };
    if (conf.routes.length > 0) result.routes = conf.routes.map((r) => ({ ...r }));
    if (dns) result.dns = dns;
    return result;
  },

  async del(req: CniRequest): Promise<void> {
    const { name, dataDir } = storeLocation(req.config);
    const store = new DiskStore(dataDir, name);
    await store.withLock(() => {
      for (const r of ownedBy(store.list(), req.containerId, req.ifname)) store.releaseListed(r);
    });
  },

  async check(req: CniRequest): Promise<void> {
    const conf = loadConfig(req.config, { cniArgs: cniArgsOf(req) });
    const store = new DiskStore(conf.dataDir, conf.name);
    const held = await store.withLock(() => heldBy(store.list(), req.containerId, req.ifname));
    if (held.length === 0) {
      throw new CniError(ErrorCode.Internal, `host-local: Failed to find address added by container ${req.containerId}`);
    }
    // Stricter than upstream: every address of the final result that lies in our ranges must
    // still be reserved for this attachment.
    const heldIPs = new Set(held.map((r) => r.ip.toString()));
    for (const ipc of req.config.prevResult?.ips ?? []) {
      let ip: IPAddr;
      try {
        ip = IPNet.parseWithHost(ipc.address).ip;
      } catch {
        continue;
      }
      if ( !conf.rangeSets.some((set) => rangeFor(set, ip) !== undefined)) continue;
      if (!heldIPs.has(ip.toString())) {
        throw new CniError(
          ErrorCode.Internal,
          `host-local: address ${ip.toString()} of container ${req.containerId} (${req.ifname}) is not reserved for it`,
        );
      }
    }
  },

  gc(req: CniRequest): Promise<void> {
    return collectGarbage(req, warnOnStderr);
  },

  status(req: CniRequest): Promise<void> {
    return fromSync(() => {
      loadConfig(req.config, { ignoreArgs: true });
    });
  },
};

/** host-local with GC's warning sent elsewhere (tests). */
export function createHostLocalPlugin(opts: HostLocalPluginOptions = {}): CniPlugin {
  const warn = opts.warn ?? warnOnStderr;
  return { ...hostLocalPlugin, gc: (req) => collectGarbage(req, warn) };
}
