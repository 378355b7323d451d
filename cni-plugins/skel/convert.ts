// Results between spec versions, as the reference library converts them (pkg/types/040 and 100):
// internally every result is the 1.1.0 shape; it is printed in the request's version.
//
//  - 0.3.0/0.3.1/0.4.0 → 1.x: `ips[].version` dropped.
//  - 1.x → 0.3.x/0.4.0: `ips[].version` added ("4"/"6" from the address); interface `mtu`,
//    `socketPath`, `pciID` dropped. Routes keep `mtu`/`advmss`/`priority`/`table`/`scope`: the
//    reference shares one Route type across versions and does the same.
//  - 1.0.0 ↔ 1.1.0: only the version string changes (one Go type for both).
//  - Empty lists and zero values are left out (Go `omitempty`); `dns` is left out of a 1.x result
//    when empty (current library) but always printed in 0.x, as `{}` if empty (the 0.4 type has no
//    custom marshaller). Debian's 1.1.1 build still prints `"dns": {}` for 1.0.0 too.
//  - 0.1.0/0.2.0 (`ip4`/`ip6`) results are not supported: weft refuses those config versions.
//
// Parsing validates what the Go types validate (CIDRs, IPs, integer fields) and normalises
// addresses to Go's text form, so a result read back from a delegate prints as Go would print it.
// Beyond Go: an interface name must be an interface name (src/util/names.ts; empty is left for
// the plugin's CHECK to report) and a sandbox free of control characters, because plugins hand
// prevResult names to `ip` (a CHECK reads every host interface the result names).
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { ifNameProblem, sandboxProblem } from '../../src/util/names.js';
import {
  CURRENT_VERSION,
  SUPPORTED_VERSIONS,
  type CniDNS,
  type CniIPConfig,
  type CniInterface,
  type CniResult,
  type CniRoute,
} from './types.js';
import { errorMessage } from '../../src/util/errors.js';

const PRE_1_0: readonly string[] = ['0.3.0', '0.3.1', '0.4.0'];

/** A result (a prevResult, or a delegate's output) that does not fit the spec's result types. */
export class CniResultError extends Error {
  constructor(
    /** JSON path of the offending field, e.g. `ips[0].address`; '' for the whole result. */
    readonly field: string,
    readonly reason: string,
  ) {
    super(field ? `${field}: ${reason}` : reason);
    this.name = 'CniResultError';
  }
}

export function isResultVersion(v: string): boolean {
  return (SUPPORTED_VERSIONS as readonly string[]).includes(v);
}

// ---------------------------------------------------------------------------------------------
// Parsing: JSON (any supported version) → 1.1.0 shape.

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

function field(at: string, key: string): string {
  return at ? `${at}.${key}` : key;
}

function str(o: Obj, key: string, at: string): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw new CniResultError(field(at, key), `expected a string, got ${describe(v)}`);
  return v;
}

function int(o: Obj, key: string, at: string): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw new CniResultError(field(at, key), `expected an integer, got ${JSON.stringify(v)}`);
  return v;
}

function strList(o: Obj, key: string, at: string): string[] | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.some((s) => typeof s !== 'string')) throw new CniResultError(field(at, key), 'expected a list of strings');
  return v.length > 0 ? (v as string[]) : undefined;
}

function list(o: Obj, key: string): Obj[] | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw new CniResultError(key, `expected a list, got ${describe(v)}`);
  v.forEach((e, i) => {
    if (!isObj(e)) throw new CniResultError(`${key}[${i}]`, `expected an object, got ${describe(e)}`);
  });
  return v.length > 0 ? (v as Obj[]) : undefined;
}

function cidr(text: string | undefined, at: string): string {
  if (text === undefined) throw new CniResultError(at, 'missing');
  try {
    const { ip, net } = IPNet.parseWithHost(text);
    return `${ip.toString()}/${net.prefix}`;
  } catch (e) {
    throw new CniResultError(at, `invalid CIDR address: ${errorMessage(e)}`);
  }
}

function ip(text: string | undefined, at: string): string | undefined {
  if (text === undefined || text === '') return undefined;
  try {
    return IPAddr.parse(text).toString();
  } catch (e) {
    throw new CniResultError(at, errorMessage(e));
  }
}

/** Sets `key` only when the value is not Go's zero value (mirrors `omitempty`). */
function put<T extends object, K extends keyof T>(target: T, key: K, value: T[K] | undefined | '' | 0): void {
  if (value !== undefined && value !== '' && value !== 0) target[key] = value;
}

/** `o[key]` as a string that `problem` accepts (when not Go's zero value ''). */
function checked(o: Obj, key: string, at: string, what: string, problem: (v: string) => string | null): string | undefined {
  const v = str(o, key, at);
  const why = v === undefined || v === '' ? null : problem(v);
  if (why !== null) throw new CniResultError(field(at, key), `invalid ${what} ${JSON.stringify(v)}: ${why}`);
  return v;
}

function parseInterface(o: Obj, at: string, is1x: boolean): CniInterface {
  const out: CniInterface = { name: checked(o, 'name', at, 'interface name', ifNameProblem) ?? '' };
  put(out, 'mac', str(o, 'mac', at));
  if (is1x) put(out, 'mtu', int(o, 'mtu', at));
  put(out, 'sandbox', checked(o, 'sandbox', at, 'sandbox', sandboxProblem));
  if (is1x) {
    put(out, 'socketPath', str(o, 'socketPath', at));
    put(out, 'pciID', str(o, 'pciID', at));
  }
  return out;
}

function parseIPConfig(o: Obj, at: string): CniIPConfig {
  const out: CniIPConfig = { address: '' };
  const index = int(o, 'interface', at);
  if (index !== undefined) {
    if (index < 0) throw new CniResultError(`${at}.interface`, `negative interface index ${index}`);
    out.interface = index;
  }
  out.address = cidr(str(o, 'address', at), `${at}.address`);
  put(out, 'gateway', ip(str(o, 'gateway', at), `${at}.gateway`));
  // `version` (0.x) is derived from the address on output; the reference ignores it on input.
  str(o, 'version', at);
  return out;
}

function parseRoute(o: Obj, at: string): CniRoute {
  const out: CniRoute = { dst: cidr(str(o, 'dst', at), `${at}.dst`) };
  put(out, 'gw', ip(str(o, 'gw', at), `${at}.gw`));
  put(out, 'mtu', int(o, 'mtu', at));
  put(out, 'advmss', int(o, 'advmss', at));
  put(out, 'priority', int(o, 'priority', at));
  // Pointers in Go: 0 is a real value for table and scope.
  const table = int(o, 'table', at);
  if (table !== undefined) out.table = table;
  const scope = int(o, 'scope', at);
  if (scope !== undefined) out.scope = scope;
  return out;
}

function parseDNS(v: unknown): CniDNS | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isObj(v)) throw new CniResultError('dns', `expected an object, got ${describe(v)}`);
  const out: CniDNS = {};
  put(out, 'nameservers', strList(v, 'nameservers', 'dns'));
  put(out, 'domain', str(v, 'domain', 'dns'));
  put(out, 'search', strList(v, 'search', 'dns'));
  put(out, 'options', strList(v, 'options', 'dns'));
  return isEmptyDNS(out) ? undefined : out;
}

export function isEmptyDNS(d: CniDNS | undefined): boolean {
  return !d || (!d.nameservers?.length && !d.domain && !d.search?.length && !d.options?.length);
}

/**
 * Reads a result of any supported version (0.3.0 … 1.1.0) into the 1.1.0 shape.
 * `defaultVersion` is used when the result has no cniVersion (the reference injects the config's).
 * Throws CniResultError.
 */
export function parseResult(raw: unknown, defaultVersion: string): CniResult {
  if (!isObj(raw)) throw new CniResultError('', `expected a JSON object, got ${describe(raw)}`);
  const given = str(raw, 'cniVersion', '');
  const version = given || defaultVersion;
  if (!isResultVersion(version)) throw new CniResultError('cniVersion', `unsupported CNI result version ${JSON.stringify(version)}`);
  const is1x = !PRE_1_0.includes(version);
  const out: CniResult = { cniVersion: CURRENT_VERSION };
  const ifs = list(raw, 'interfaces');
  if (ifs) out.interfaces = ifs.map((o, i) => parseInterface(o, `interfaces[${i}]`, is1x));
  const ips = list(raw, 'ips');
  if (ips) out.ips = ips.map((o, i) => parseIPConfig(o, `ips[${i}]`));
  const routes = list(raw, 'routes');
  if (routes) out.routes = routes.map((o, i) => parseRoute(o, `routes[${i}]`));
  const dns = parseDNS(raw.dns);
  if (dns) out.dns = dns;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Output: 1.1.0 shape → the JSON object of a given version, keys in the reference's field order.

function ipVersion(address: string, at: string): '4' | '6' {
  try {
    return IPNet.parseWithHost(address).ip.family === 4 ? '4' : '6';
  } catch (e) {
    throw new CniResultError(at, `invalid CIDR address: ${errorMessage(e)}`);
  }
}

function outDNS(d: CniDNS | undefined): Obj {
  const o: Obj = {};
  if (d?.nameservers?.length) o.nameservers = [...d.nameservers];
  if (d?.domain) o.domain = d.domain;
  if (d?.search?.length) o.search = [...d.search];
  if (d?.options?.length) o.options = [...d.options];
  return o;
}

function outRoute(r: CniRoute): Obj {
  const o: Obj = { dst: r.dst };
  if (r.gw) o.gw = r.gw;
  if (r.mtu) o.mtu = r.mtu;
  if (r.advmss) o.advmss = r.advmss;
  if (r.priority) o.priority = r.priority;
  if (r.table !== undefined) o.table = r.table;
  if (r.scope !== undefined) o.scope = r.scope;
  return o;
}

/** The result as the JSON object of `toVersion` (one of SUPPORTED_VERSIONS). Throws CniResultError. */
export function convertResult(result: CniResult, toVersion: string): Obj {
  if (!isResultVersion(toVersion)) throw new CniResultError('cniVersion', `cannot convert a result to unsupported version ${JSON.stringify(toVersion)}`);
  const pre10 = PRE_1_0.includes(toVersion);
  const o: Obj = { cniVersion: toVersion };
  if (result.interfaces?.length) {
    o.interfaces = result.interfaces.map((i) => {
      const x: Obj = { name: i.name };
      if (i.mac) x.mac = i.mac;
      if (!pre10 && i.mtu) x.mtu = i.mtu;
      if (i.sandbox) x.sandbox = i.sandbox;
      if (!pre10 && i.socketPath) x.socketPath = i.socketPath;
      if (!pre10 && i.pciID) x.pciID = i.pciID;
      return x;
    });
  }
  if (result.ips?.length) {
    o.ips = result.ips.map((c, n) => {
      const x: Obj = {};
      if (pre10) x.version = ipVersion(c.address, `ips[${n}].address`);
      if (c.interface !== undefined) x.interface = c.interface;
      x.address = c.address;
      if (c.gateway) x.gateway = c.gateway;
      return x;
    });
  }
  if (result.routes?.length) o.routes = result.routes.map(outRoute);
  if (pre10 || !isEmptyDNS(result.dns)) o.dns = outDNS(result.dns);
  return o;
}

/**
 * JSON as Go's encoding/json writes it: `indent` spaces per level (0 = compact) and HTML-safe
 * escapes for <, >, & and U+2028/U+2029. Those characters only occur inside strings, so a plain
 * replace is exact.
 */
export function goJSON(value: unknown, indent = 4): string {
  return JSON.stringify(value, null, indent || undefined).replace(
    /[<>&\u2028\u2029]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}

/** The result printed as the reference does (`types.PrintResult`): 4-space indent, no newline. */
export function formatResult(result: CniResult, toVersion: string): string {
  return goJSON(convertResult(result, toVersion));
}
