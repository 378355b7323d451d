// The flannel meta plugin's own config and the delegate config it builds from it and subnet.env
// (flannel.go cmdAdd + flannel_linux.go doCmdAdd/getDelegateIPAM). Pure. The delegate config is
// rendered the way Go's encoding/json renders flannel's map[string]interface{} (keys sorted,
// HTML-safe escapes, routes as types.Route structs), so the state file and the bytes the
// delegate receives are the same as flannel's.
import type { JsonValue } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import type { SubnetEnv } from '../../src/subnetenv/format.js';

export type JsonObject = { [key: string]: JsonValue };

export const DEFAULT_SUBNET_FILE = '/run/flannel/subnet.env';
export const DEFAULT_DATA_DIR = '/var/lib/cni/flannel';

/** A bad key in the flannel plugin's config (reported as CNI code 7). */
export class FlannelConfigError extends Error {
  constructor(
    readonly key: string,
    message: string,
  ) {
    super(message);
    this.name = 'FlannelConfigError';
  }
}

/** A Go struct in the output: its fields keep declaration order instead of being sorted. */
export class OrderedFields {
  constructor(readonly entries: readonly (readonly [string, GoJson])[]) {}
}

/** What goJson can render: JSON values plus structs with a fixed field order. */
export type GoJson = null | boolean | number | string | GoJson[] | OrderedFields | { [key: string]: GoJson };
export type GoObject = { [key: string]: GoJson };

/** cni types.Route as the delegate receives it (field order = Go struct order). */
export interface Route {
  readonly dst: string;
  readonly gw?: string;
  readonly mtu?: number;
  readonly advmss?: number;
  readonly priority?: number;
  readonly table?: number;
  readonly scope?: number;
}

export interface FlannelNetConf {
  readonly name: string;
  /** Empty when the request has none (then the delegate gets none either, as in flannel). */
  readonly cniVersion: string;
  readonly subnetFile: string;
  readonly dataDir: string;
  /** The user's `delegate` overrides ({} when absent). */
  readonly delegate: JsonObject;
  /** The user's `ipam` base, null when absent. */
  readonly ipam: JsonObject | null;
  /** `ipam.routes` parsed as flannel's getIPAMRoutes does. */
  readonly ipamRoutes: readonly Route[];
  readonly runtimeConfig: JsonObject | null;
}

export function isJsonObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function optionalObject(raw: JsonObject, key: string): JsonObject | null {
  const v = raw[key];
  if (v === undefined || v === null) return null;
  if (!isJsonObject(v)) throw new FlannelConfigError(key, `'${key}' must be an object, got ${JSON.stringify(v)}`);
  return v;
}

/** `subnetFile` / `dataDir`: a non-empty string, or the default when absent, null or empty. */
function pathKey(raw: JsonObject, key: string, dflt: string): string {
  const v = raw[key];
  if (v === undefined || v === null || v === '') return dflt;
  if (typeof v !== 'string') throw new FlannelConfigError(key, `'${key}' must be a string path, got ${JSON.stringify(v)}`);
  return v;
}

/** Only what DEL and GC need: where the state files are. Other keys are not validated there. */
export function parseDataDir(raw: unknown): string {
  if (!isJsonObject(raw)) throw new FlannelConfigError('', 'network config must be a JSON object');
  return pathKey(raw, 'dataDir', DEFAULT_DATA_DIR);
}

function intField(route: JsonObject, key: string, index: number): number | undefined {
  const v = route[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) {
    throw new FlannelConfigError('ipam.routes', `failed to parse ipam.routes[${index}]: '${key}' must be an integer`);
  }
  return v;
}

function parseRoute(v: JsonValue, index: number): Route {
  if (!isJsonObject(v)) throw new FlannelConfigError('ipam.routes', `failed to parse ipam.routes[${index}]: not an object`);
  const dstText = v.dst;
  // Go keeps the address as written (types.IPNet): "10.96.0.5/12" stays "10.96.0.5/12".
  let dst: string;
  try {
    if (typeof dstText !== 'string') throw new Error('missing');
    const { ip, net } = IPNet.parseWithHost(dstText);
    dst = `${ip.toString()}/${net.prefix}`;
  } catch {
    throw new FlannelConfigError(
      'ipam.routes',
      `failed to parse ipam.routes[${index}]: 'dst' must be a CIDR, got ${JSON.stringify(dstText ?? null)}`,
    );
  }
  let gw: string | undefined;
  if (v.gw !== undefined && v.gw !== null && v.gw !== '') {
    const ip = typeof v.gw === 'string' ? IPAddr.tryParse(v.gw) : null;
    if (ip === null) {
      throw new FlannelConfigError('ipam.routes', `failed to parse ipam.routes[${index}]: invalid 'gw' ${JSON.stringify(v.gw)}`);
    }
    gw = ip.toString();
  }
  const route: { -readonly [K in keyof Route]: Route[K] } = { dst };
  if (gw !== undefined) route.gw = gw;
  // int fields with omitempty: zero is left out; table and scope are *int: zero stays.
  const mtu = intField(v, 'mtu', index);
  if (mtu) route.mtu = mtu;
  const advmss = intField(v, 'advmss', index);
  if (advmss) route.advmss = advmss;
  const priority = intField(v, 'priority', index);
  if (priority) route.priority = priority;
  const table = intField(v, 'table', index);
  if (table !== undefined) route.table = table;
  const scope = intField(v, 'scope', index);
  if (scope !== undefined) route.scope = scope;
  return route;
}

/** Validates the flannel plugin's request config (the parsed stdin) for ADD, CHECK, STATUS and GC. */
export function parseFlannelNetConf(raw: unknown): FlannelNetConf {
  if (!isJsonObject(raw)) throw new FlannelConfigError('', 'network config must be a JSON object');
  const name = raw.name;
  if (typeof name !== 'string' || name === '') throw new FlannelConfigError('name', "'name' must be a non-empty string");
  const cniVersion = raw.cniVersion ?? '';
  if (typeof cniVersion !== 'string') throw new FlannelConfigError('cniVersion', "'cniVersion' must be a string");

  const delegate = optionalObject(raw, 'delegate') ?? {};
  if (Object.hasOwn(delegate, 'type') && typeof delegate.type !== 'string') {
    throw new FlannelConfigError('delegate.type', "'delegate' dictionary, if present, must have (string) 'type' field");
  }
  if (Object.hasOwn(delegate, 'name')) {
    throw new FlannelConfigError('delegate.name', "'delegate' dictionary must not have 'name' field, it'll be set by flannel");
  }
  if (Object.hasOwn(delegate, 'ipam')) {
    throw new FlannelConfigError('delegate.ipam', "'delegate' dictionary must not have 'ipam' field, it'll be set by flannel");
  }

  const ipam = optionalObject(raw, 'ipam');
  if (ipam !== null && Object.hasOwn(ipam, 'type') && typeof ipam.type !== 'string') {
    throw new FlannelConfigError('ipam.type', "'ipam.type' must be a string");
  }
  const routesRaw = ipam?.routes;
  let ipamRoutes: Route[] = [];
  if (routesRaw !== undefined && routesRaw !== null) {
    if (!Array.isArray(routesRaw)) throw new FlannelConfigError('ipam.routes', 'failed to parse ipam.routes: not an array');
    ipamRoutes = routesRaw.map(parseRoute);
  }

  return {
    name,
    cniVersion,
    subnetFile: pathKey(raw, 'subnetFile', DEFAULT_SUBNET_FILE),
    dataDir: pathKey(raw, 'dataDir', DEFAULT_DATA_DIR),
    delegate,
    ipam,
    ipamRoutes,
    runtimeConfig: optionalObject(raw, 'runtimeConfig'),
  };
}

function routeStruct(r: Route): OrderedFields {
  const entries: [string, GoJson][] = [['dst', r.dst]];
  if (r.gw !== undefined) entries.push(['gw', r.gw]);
  if (r.mtu !== undefined) entries.push(['mtu', r.mtu]);
  if (r.advmss !== undefined) entries.push(['advmss', r.advmss]);
  if (r.priority !== undefined) entries.push(['priority', r.priority]);
  if (r.table !== undefined) entries.push(['table', r.table]);
  if (r.scope !== undefined) entries.push(['scope', r.scope]);
  return new OrderedFields(entries);
}

/** flannel_linux.go getDelegateIPAM: the input ipam with type, ranges and routes filled in. */
function delegateIpam(conf: FlannelNetConf, env: SubnetEnv): GoObject {
  const ipam: GoObject = { ...(conf.ipam ?? {}) };
  if (!Object.hasOwn(ipam, 'type')) ipam.type = 'host-local';
  const ranges: GoJson[] = [];
  if (env.subnet !== null) ranges.push([{ subnet: env.subnet.toString() }]);
  if (env.ipv6Subnet !== null) ranges.push([{ subnet: env.ipv6Subnet.toString() }]);
  ipam.ranges = ranges;
  const routes: Route[] = [...conf.ipamRoutes];
  for (const nw of env.networks) routes.push({ dst: nw.toString() });
  for (const nw of env.ipv6Networks) routes.push({ dst: nw.toString() });
  ipam.routes = routes.map(routeStruct);
  return ipam;
}

/** The delegate for a node whose weftd runs the ovs backend (subnet.env WEFT_BACKEND=ovs). */
export const OVS_DELEGATE_TYPE = 'weft-ovs';

/**
 * flannel's doCmdAdd: the user's `delegate` overrides, plus `name`, `type` (bridge), `ipMasq`
 * (!FLANNEL_IPMASQ), `mtu` (FLANNEL_MTU), `isGateway` (bridge only), `cniVersion`, the
 * request's `runtimeConfig` and the host-local `ipam`. Nothing else (no hairpinMode, no
 * isDefaultGateway, no dataDir for host-local, no capabilities, args or dns) is added.
 *
 * weft only: when subnet.env says WEFT_BACKEND=ovs and the user's delegate names no `type`, the
 * delegate is `weft-ovs` with the bridge, OVS run dir and datapath from subnet.env (the user's
 * keys still win, as for every key here) and without `ipMasq`/`isGateway`: the pod joins the OVS
 * bridge, whose gateway port weftd owns, and weftd does the masquerading.
 */
export function buildDelegateConfig(conf: FlannelNetConf, env: SubnetEnv): GoObject {
  const d: GoObject = { ...conf.delegate };
  if (conf.runtimeConfig !== null) d.runtimeConfig = conf.runtimeConfig;
  d.name = conf.name;
  const ovs = env.weft.backend === 'ovs' && !Object.hasOwn(d, 'type');
  if (!Object.hasOwn(d, 'type')) d.type = ovs ? OVS_DELEGATE_TYPE : 'bridge';
  if (ovs) {
    const keys: Array<[string, string | null]> = [
      ['bridge', env.weft.ovsBridge],
      ['ovsRunDir', env.weft.ovsRunDir],
      ['datapathType', env.weft.ovsDatapath],
    ];
    for (const [key, value] of keys) if (value !== null && !Object.hasOwn(d, key)) d[key] = value;
  } else if (!Object.hasOwn(d, 'ipMasq')) {
    d.ipMasq = !env.ipMasq;
  }
  if (!Object.hasOwn(d, 'mtu')) d.mtu = env.mtu;
  if (d.type === 'bridge' && !Object.hasOwn(d, 'isGateway')) d.isGateway = true;
  if (conf.cniVersion !== '') d.cniVersion = conf.cniVersion;
  d.ipam = delegateIpam(conf, env);
  return d;
}

/** The delegate's plugin type (validated to be a string by parseFlannelNetConf). */
export function delegateType(d: GoObject): string {
  const t = d.type;
  if (typeof t !== 'string') throw new FlannelConfigError('delegate.type', "delegate config has no string 'type'");
  return t;
}

/** The bytes flannel writes to `<dataDir>/<containerID>` and hands to the delegate. */
export function renderDelegateConfig(d: GoObject): string {
  return goJson(d);
}

// --- Go encoding/json compatible rendering -------------------------------------------------

const HEX = '0123456789abcdef';

function goString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22) out += '\\"';
    else if (c === 0x5c) out += '\\\\';
    else if (c === 0x0a) out += '\\n';
    else if (c === 0x0d) out += '\\r';
    else if (c === 0x09) out += '\\t';
    else if (c === 0x08) out += '\\b';
    else if (c === 0x0c) out += '\\f';
    else if (c < 0x20 || c === 0x3c || c === 0x3e || c === 0x26 || c === 0x2028 || c === 0x2029) {
      // HTML-safe escaping (Go's default) and the JSONP-unsafe line separators.
      out += `\\u${HEX[(c >> 12) & 15]}${HEX[(c >> 8) & 15]}${HEX[(c >> 4) & 15]}${HEX[c & 15]}`;
    } else if (c >= 0xd800 && c <= 0xdbff) {
      const next = s.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        out += s[i]! + s[i + 1]!;
        i++;
      } else {
        out += '\ufffd'; // Go would have decoded a lone surrogate to U+FFFD
      }
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      out += '\ufffd';
    } else {
      out += s[i]!;
    }
  }
  return `${out}"`;
}

function goNumber(n: number): string {
  if (!Number.isFinite(n)) throw new RangeError(`cannot encode ${n} as JSON`);
  if (Object.is(n, -0)) return '-0';
  // JS and Go (strconv 'f'/'e' with -1 precision, exponent for <1e-6 and >=1e21) agree otherwise.
  return String(n);
}

/** Go sorts map keys by their UTF-8 bytes, i.e. by code point (not UTF-16 unit) order. */
function compareKeys(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

/** Compact JSON exactly as Go's json.Marshal renders the equivalent interface{} value. */
export function goJson(v: GoJson): string {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (typeof v === 'number') return goNumber(v);
  if (typeof v === 'string') return goString(v);
  if (Array.isArray(v)) return `[${v.map(goJson).join(',')}]`;
  if (v instanceof OrderedFields) return `{${v.entries.map(([k, x]) => `${goString(k)}:${goJson(x)}`).join(',')}}`;
  const keys = Object.keys(v).sort(compareKeys);
  return `{${keys.map((k) => `${goString(k)}:${goJson(v[k]!)}`).join(',')}}`;
}
