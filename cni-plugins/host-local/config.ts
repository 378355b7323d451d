// host-local configuration: the `ipam` section of the full network config, the legacy single
// range, runtimeConfig capabilities and the requested-IP sources, canonicalised the way the
// reference (plugins/ipam/host-local/backend/allocator/config.go, range.go) does it. Error texts
// are the reference's where it has one, so logs read the same whichever plugin ran.
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { CniError, ErrorCode, type CniRoute, type NetConf } from '../skel/types.js';
import { errorMessage } from '../../src/util/errors.js';

export const DEFAULT_DATA_DIR = '/var/lib/cni/networks';

/** One range of a range set, with every default filled in. Values are inclusive. */
export interface Range {
  readonly subnet: IPNet;
  readonly rangeStart: IPAddr;
  readonly rangeEnd: IPAddr;
  readonly gateway: IPAddr;
}

/** Disjoint ranges of one family; an ADD takes exactly one IP from each set. */
export type RangeSet = readonly Range[];

export interface HostLocalConfig {
  /** The network name: the store directory under dataDir. */
  readonly name: string;
  readonly dataDir: string;
  readonly resolvConf: string | null;
  readonly routes: readonly CniRoute[];
  readonly rangeSets: readonly RangeSet[];
  /** From CNI_ARGS IP=, then args.cni.ips, then runtimeConfig.ips; duplicates removed. */
  readonly requestedIPs: readonly IPAddr[];
}

/** Invalid configuration: code 7 (the reference returns 999 for everything; the spec says 7). */
export class HostLocalConfigError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.InvalidNetworkConfig, msg);
    this.name = 'HostLocalConfigError';
  }
}

/** Go's canonicalizeIP: an IPv4-mapped IPv6 address is the IPv4 address. */
export function canonicalIP(ip: IPAddr): IPAddr {
  if (ip.family === 6 && ip.value >> 32n === 0xffffn) return IPAddr.of(4, ip.value & 0xffffffffn);
  return ip;
}

export function rangeContains(r: Range, ip: IPAddr): boolean {
  return r.subnet.contains(ip) && ip.value >= r.rangeStart.value && ip.value <= r.rangeEnd.value;
}

export function rangeString(r: Range): string {
  return `${r.rangeStart.toString()}-${r.rangeEnd.toString()}`;
}

export function rangeSetString(set: RangeSet): string {
  return set.map(rangeString).join(',');
}

/** The range of `set` holding `ip`, or undefined. */
export function rangeFor(set: RangeSet, ip: IPAddr): Range | undefined {
  return set.find((r) => rangeContains(r, ip));
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Go's net.IP text unmarshalling (config fields). */
function parseIPField(v: unknown, what: string): IPAddr {
  if (typeof v !== 'string') throw new HostLocalConfigError(`${what} must be a string IP address`);
  const ip = IPAddr.tryParse(v);
  if (!ip) throw new HostLocalConfigError(`invalid IP address: ${v}`);
  return canonicalIP(ip);
}

/** pkg/ip.IP text unmarshalling (requested IPs): a bare address or a CIDR whose mask is ignored. */
function parseRequestedIP(v: unknown): IPAddr {
  if (typeof v !== 'string') throw new HostLocalConfigError(`invalid IP address ${JSON.stringify(v)}`);
  let ip: IPAddr | null = null;
  try {
    ip = v.includes('/') ? IPNet.parseWithHost(v).ip : IPAddr.parse(v);
  } catch {
    throw new HostLocalConfigError(`invalid IP address ${v}`);
  }
  return canonicalIP(ip);
}

/** A range before canonicalisation (the JSON form). */
interface RawRange {
  subnet: IPNet;
  subnetHostBits: boolean;
  rangeStart: IPAddr | null;
  rangeEnd: IPAddr | null;
  gateway: IPAddr | null;
}

function parseRawRange(v: unknown): RawRange {
  if (!isObject(v)) throw new HostLocalConfigError('a range must be an object {subnet, rangeStart?, rangeEnd?, gateway?}');
  const subnetText = v['subnet'];
  if (typeof subnetText !== 'string') throw new HostLocalConfigError(`invalid CIDR address: ${JSON.stringify(subnetText ?? '')}`);
  let parsed;
  try {
    parsed = IPNet.parseWithHost(subnetText);
  } catch {
    throw new HostLocalConfigError(`invalid CIDR address: ${subnetText}`);
  }
  const opt = (key: string): IPAddr | null => (v[key] === undefined || v[key] === null ? null : parseIPField(v[key], key));
  return {
    subnet: parsed.net,
    subnetHostBits: parsed.hostBitsSet,
    rangeStart: opt('rangeStart'),
    rangeEnd: opt('rangeEnd'),
    gateway: opt('gateway'),
  };
}

function parseRawRangeSets(v: unknown, what: string): RawRange[][] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || !v.every((s) => Array.isArray(s))) {
    throw new HostLocalConfigError(`${what} must be a list of range sets (lists of ranges)`);
  }
  return v.map((set: unknown[]) => set.map(parseRawRange));
}

/** range.go Canonicalize: fills the defaults and checks the range is usable. */
function canonicalizeRange(raw: RawRange): Range {
  const { subnet } = raw;
  if (subnet.prefix > subnet.bits - 2) throw new Error(`Network ${subnet.toString()} too small to allocate from`);
  if (raw.subnetHostBits) {
    throw new Error(
      `Network has host bits set. For a subnet mask of length ${subnet.prefix} the network address is ${subnet.ip.toString()}`,
    );
  }
  const familyCheck = (ip: IPAddr, what: string): void => {
    if (ip.family !== subnet.family) throw new Error(`${what} ${ip.toString()} not in network ${subnet.toString()}`);
  };
  // v1.1.1 accepts a gateway outside the subnet and then hands out .1; we refuse it, as older
  // and newer releases do: a pod cannot route via an off-link gateway.
  const gateway = raw.gateway ?? subnet.nth(1n);
  familyCheck(gateway, 'gateway');
  if (!subnet.contains(gateway)) throw new Error(`gateway ${gateway.toString()} not in network ${subnet.toString()}`);

  const end = raw.rangeEnd;
  // RangeStart is checked against the subnet and the (explicit) RangeEnd, as range.go does.
  let rangeStart = subnet.nth(1n);
  if (raw.rangeStart) {
    const s = raw.rangeStart;
    if (s.family !== subnet.family || !subnet.contains(s) || (end && end.family === s.family && s.value > end.value)) {
      throw new Error(`RangeStart ${s.toString()} not in network ${subnet.toString()}`);
    }
    rangeStart = s;
  }
  // The default end is the broadcast minus one for IPv4, the last address for IPv6.
  let rangeEnd = IPAddr.of(subnet.family, subnet.family === 4 ? subnet.last - 1n : subnet.last);
  if (end) {
    if (end.family !== subnet.family || !subnet.contains(end) || end.value < rangeStart.value) {
      throw new Error(`RangeEnd ${end.toString()} not in network ${subnet.toString()}`);
    }
    rangeEnd = end;
  }
  return { subnet, rangeStart, rangeEnd, gateway };
}

function rangesOverlap(a: Range, b: Range): boolean {
  if (a.subnet.family !== b.subnet.family) return false;
  return (
    rangeContains(a, b.rangeStart) || rangeContains(a, b.rangeEnd) || rangeContains(b, a.rangeStart) || rangeContains(b, a.rangeEnd)
  );
}

/** range_set.go Canonicalize. */
function canonicalizeRangeSet(raw: RawRange[]): RangeSet {
  if (raw.length === 0) throw new Error('empty range set');
  const set = raw.map(canonicalizeRange);
  const family = set[0]!.subnet.family;
  if (set.some((r) => r.subnet.family !== family)) throw new Error('mixed address families');
  for (let i = 0; i < set.length - 1; i++) {
    for (let j = i + 1; j < set.length; j++) {
      if (rangesOverlap(set[i]!, set[j]!)) {
        throw new Error(`subnets ${rangeString(set[i]!)} and ${rangeString(set[j]!)} overlap`);
      }
    }
  }
  return set;
}

function setsOverlap(a: RangeSet, b: RangeSet): boolean {
  return a.some((r) => b.some((r1) => rangesOverlap(r, r1)));
}

function parseRoutes(v: unknown): CniRoute[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new HostLocalConfigError('ipam.routes must be a list of {dst, gw?}');
  return v.map((r: unknown): CniRoute => {
    if (!isObject(r)) throw new HostLocalConfigError('ipam.routes must be a list of {dst, gw?}');
    const dst = r['dst'];
    let net;
    try {
      net = typeof dst === 'string' ? IPNet.parseWithHost(dst) : null;
    } catch {
      net = null;
    }
    if (!net) throw new HostLocalConfigError(`invalid CIDR address: ${typeof dst === 'string' ? dst : JSON.stringify(dst ?? '')}`);
    // types.ParseCIDR keeps the host part ("10.0.0.1/8" stays as written), only re-formatted.
    const route: CniRoute = { dst: `${net.ip.toString()}/${net.net.prefix}` };
    if (r['gw'] !== undefined && r['gw'] !== null) route.gw = parseIPField(r['gw'], 'gw').toString();
    // Spec 1.1 route attributes, carried through as given.
    for (const key of ['mtu', 'advmss', 'priority', 'table', 'scope'] as const) {
      const x = r[key];
      if (x === undefined || x === null) continue;
      if (typeof x !== 'number' || !Number.isInteger(x) || x < 0) {
        throw new HostLocalConfigError(`route ${route.dst}: ${key} must be a non-negative integer`);
      }
      route[key] = x;
    }
    return route;
  });
}

/**
 * A CNI_ARGS problem: code 999 like the reference (and like the skeleton's own "invalid pair"
 * check); it is not the network config that is wrong.
 */
export class CniArgsError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'CniArgsError';
  }
}

/** Go's types.UnmarshallableBool. */
function parseArgsBool(pair: string, value: string): boolean {
  const v = value.toLowerCase();
  if (v === '1' || v === 'true') return true;
  if (v === '0' || v === 'false') return false;
  throw new CniArgsError(`ARGS: error parsing value of pair "${pair}": boolean unmarshal error: invalid input ${value}`);
}

/**
 * CNI_ARGS as the reference reads it (types.LoadArgs into {IgnoreUnknown, IP}): unknown keys are
 * an error unless IgnoreUnknown is true; the last IP= wins; an empty IP= requests nothing.
 */
export function parseCniArgsIP(cniArgs: string): IPAddr | null {
  if (cniArgs === '') return null;
  let ip: IPAddr | null = null;
  let ignoreUnknown = false;
  const unknown: string[] = [];
  for (const pair of cniArgs.split(';')) {
    const kv = pair.split('=');
    if (kv.length !== 2) throw new CniArgsError(`ARGS: invalid pair ${JSON.stringify(pair)}`);
    const [key, value] = kv as [string, string];
    if (key === 'IP') {
      if (value === '') {
        ip = null;
        continue;
      }
      try {
        ip = parseRequestedIP(value);
      } catch {
        throw new CniArgsError(`ARGS: error parsing value of pair ${JSON.stringify(pair)}: invalid IP address ${value}`);
      }
    } else if (key === 'IgnoreUnknown') {
      ignoreUnknown = parseArgsBool(pair, value);
    } else {
      unknown.push(pair);
    }
  }
  if (unknown.length > 0 && !ignoreUnknown) {
    throw new CniArgsError(`ARGS: unknown args [${unknown.map((u) => JSON.stringify(u)).join(' ')}]`);
  }
  return ip;
}

function requestedList(v: unknown, what: string): IPAddr[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new HostLocalConfigError(`${what} must be a list of IP addresses`);
  return v.map(parseRequestedIP);
}

/** The network name becomes a directory under dataDir: it must be one plain path component. */
export function isStoreName(name: unknown): name is string {
  return typeof name === 'string' && name !== '' && name !== '.' && name !== '..' && !name.includes('/') && !name.includes('\0');
}

export interface LoadOptions {
  /** CNI_ARGS exactly as set by the runtime. */
  readonly cniArgs?: string;
  /**
   * DEL and GC need no requested IP, so a CNI_ARGS the reference would reject (unknown keys
   * without IgnoreUnknown) must not keep them from releasing addresses.
   */
  readonly ignoreArgs?: boolean;
}

/** config.go LoadIPAMConfig, on an already parsed network config. Throws HostLocalConfigError. */
export function loadConfig(conf: NetConf, opts: LoadOptions = {}): HostLocalConfig {
  const ipam = conf.ipam;
  if (!isObject(ipam)) throw new HostLocalConfigError("IPAM config missing 'ipam' key");
  const name = conf.name;
  if (!isStoreName(name)) throw new HostLocalConfigError(`invalid network name ${JSON.stringify(name)}`);

  const requested: IPAddr[] = [];
  if (!opts.ignoreArgs) {
    const argIP = parseCniArgsIP(opts.cniArgs ?? '');
    if (argIP) requested.push(argIP);
    const args = conf.args;
    if (isObject(args) && isObject(args['cni'])) requested.push(...requestedList(args['cni']['ips'], 'args.cni.ips'));
    const rc = conf.runtimeConfig;
    if (isObject(rc)) requested.push(...requestedList(rc['ips'], 'runtimeConfig.ips'));
  }
  const seen = new Set<string>();
  const requestedIPs = requested.filter((ip) => {
    const k = ip.toString();
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });

  // Order: runtimeConfig.ipRanges, then the legacy top-level range, then ipam.ranges.
  const rawSets: RawRange[][] = [];
  if (isObject(conf.runtimeConfig)) rawSets.push(...parseRawRangeSets(conf.runtimeConfig['ipRanges'], 'runtimeConfig.ipRanges'));
  if (ipam['subnet'] !== undefined && ipam['subnet'] !== null && ipam['subnet'] !== '') {
    rawSets.push([parseRawRange(ipam)]);
  }
  rawSets.push(...parseRawRangeSets(ipam['ranges'], 'ipam.ranges'));
  if (rawSets.length === 0) throw new HostLocalConfigError('no IP ranges specified');

  const rangeSets = rawSets.map((raw, i) => {
    try {
      return canonicalizeRangeSet(raw);
    } catch (e) {
      throw new HostLocalConfigError(`invalid range set ${i}: ${errorMessage(e)}`);
    }
  });
  for (let i = 0; i < rangeSets.length - 1; i++) {
    for (let j = i + 1; j < rangeSets.length; j++) {
      if (setsOverlap(rangeSets[i]!, rangeSets[j]!)) throw new HostLocalConfigError(`range set ${i} overlaps with ${j}`);
    }
  }

  const dataDir = ipam['dataDir'];
  if (dataDir !== undefined && dataDir !== null && typeof dataDir !== 'string') {
    throw new HostLocalConfigError('ipam.dataDir must be a string');
  }
  const resolvConf = ipam['resolvConf'];
  if (resolvConf !== undefined && resolvConf !== null && typeof resolvConf !== 'string') {
    throw new HostLocalConfigError('ipam.resolvConf must be a string');
  }

  return {
    name,
    dataDir: dataDir || DEFAULT_DATA_DIR,
    resolvConf: resolvConf || null,
    routes: parseRoutes(ipam['routes']),
    rangeSets,
    requestedIPs,
  };
}
