// flannel's network config (etcd `<prefix>/config` or kube's net-conf.json): parsing with Go
// encoding/json key semantics, and flannel's CheckNetworkConfig defaults and range checks.
// Pure: text in, value or ConfigError out.
import { errorMessage } from '../util/errors.js';
import { IPAddr, IPNet, InvalidAddressError, InvalidPrefixError, type Family } from '../util/ip.js';
import type { JsonValue } from './lease.js';

export interface BackendConfig {
  readonly type: string;
  /** the whole Backend object as given, e.g. {Type, VNI, Port} */
  readonly options: Readonly<Record<string, JsonValue>>;
}

export interface NetworkConfig {
  readonly enableIPv4: boolean;
  readonly enableIPv6: boolean;
  readonly enableNFTables: boolean;
  /** IPv4, required when enableIPv4; null when the family is disabled. */
  readonly network: IPNet | null;
  /** 0 when enableIPv4 is false (or when checkSubnets:false and unset). */
  readonly subnetLen: number;
  readonly subnetMin: IPAddr | null;
  readonly subnetMax: IPAddr | null;
  /** required when enableIPv6; null when the family is disabled. */
  readonly ipv6Network: IPNet | null;
  readonly ipv6SubnetLen: number;
  readonly ipv6SubnetMin: IPAddr | null;
  readonly ipv6SubnetMax: IPAddr | null;
  readonly backend: BackendConfig;
  /** Non-fatal remarks, e.g. host bits cleared in Network, unknown keys. */
  readonly warnings: readonly string[];
}

export class ConfigError extends Error {
  /** The config key at fault (canonical spelling, `Backend.Type` for the nested one); null for the document. */
  readonly key: string | null;
  constructor(key: string | null, message: string) {
    super(message);
    this.name = 'ConfigError';
    this.key = key;
  }
}

export interface ParseOptions {
  readonly knownBackends: readonly string[];
  /** etcd mode: apply defaults and check ranges (flannel CheckNetworkConfig). kube mode passes false. Default true. */
  readonly checkSubnets?: boolean;
}

// The Go struct's fields; anything else is ignored with a warning.
const KEYS = [
  'EnableIPv4',
  'EnableIPv6',
  'EnableNFTables',
  'Network',
  'SubnetLen',
  'SubnetMin',
  'SubnetMax',
  'IPv6Network',
  'IPv6SubnetLen',
  'IPv6SubnetMin',
  'IPv6SubnetMax',
  'Backend',
] as const;
type Key = (typeof KEYS)[number];

// The backend used when Backend is absent. flannel's code (parseBackendType) says "udp", its
// documentation (configuration.md) says vxlan; weft follows the documentation.
const DEFAULT_BACKEND = 'vxlan';

interface FamilyKeys {
  readonly family: Family;
  readonly enable: Key;
  readonly network: Key;
  readonly subnetLen: Key;
  readonly subnetMin: Key;
  readonly subnetMax: Key;
  /** Largest SubnetLen flannel allows (room for a tunnel and a bridge address). */
  readonly maxSubnetLen: number;
  /** SubnetLen given to each host when the Network is big enough. */
  readonly defaultSubnetLen: number;
}

const V4: FamilyKeys = {
  family: 4,
  enable: 'EnableIPv4',
  network: 'Network',
  subnetLen: 'SubnetLen',
  subnetMin: 'SubnetMin',
  subnetMax: 'SubnetMax',
  maxSubnetLen: 30,
  defaultSubnetLen: 24,
};

const V6: FamilyKeys = {
  family: 6,
  enable: 'EnableIPv6',
  network: 'IPv6Network',
  subnetLen: 'IPv6SubnetLen',
  subnetMin: 'IPv6SubnetMin',
  subnetMax: 'IPv6SubnetMax',
  maxSubnetLen: 126,
  defaultSubnetLen: 64,
};

interface FamilyConfig {
  readonly network: IPNet | null;
  readonly subnetLen: number;
  readonly subnetMin: IPAddr | null;
  readonly subnetMax: IPAddr | null;
}

const DISABLED: FamilyConfig = { network: null, subnetLen: 0, subnetMin: null, subnetMax: null };

export function parseNetworkConfig(text: string, opts: ParseOptions): NetworkConfig {
  const checkSubnets = opts.checkSubnets ?? true;
  const warnings: string[] = [];

  let doc: JsonValue;
  try {
    doc = JSON.parse(text) as JsonValue;
  } catch (e) {
    throw new ConfigError(null, `network config is not valid JSON: ${errorMessage(e)}`);
  }
  if (!isObject(doc)) throw new ConfigError(null, 'network config must be a JSON object');

  const { values, backendText } = pickKeys(text, warnings);

  const enableIPv4 = parseBool(values, 'EnableIPv4', true);
  const enableIPv6 = parseBool(values, 'EnableIPv6', false);
  const enableNFTables = parseBool(values, 'EnableNFTables', false);
  if (!enableIPv4 && !enableIPv6) {
    throw new ConfigError('EnableIPv4', 'EnableIPv4 and EnableIPv6 are both false: at least one family must be enabled');
  }

  const v4 = parseFamily(values, V4, enableIPv4, checkSubnets, warnings);
  const v6 = parseFamily(values, V6, enableIPv6, checkSubnets, warnings);
  const backend = parseBackend(values.get('Backend'), backendText, opts.knownBackends);

  return {
    enableIPv4,
    enableIPv6,
    enableNFTables,
    network: v4.network,
    subnetLen: v4.subnetLen,
    subnetMin: v4.subnetMin,
    subnetMax: v4.subnetMax,
    ipv6Network: v6.network,
    ipv6SubnetLen: v6.subnetLen,
    ipv6SubnetMin: v6.subnetMin,
    ipv6SubnetMax: v6.subnetMax,
    backend,
    warnings,
  };
}

/** The IPv4 and IPv6 allocation ranges: the subnets [min, max] of length subnetLen. */
export function subnetRange(cfg: NetworkConfig, family: 4 | 6): { min: IPNet; max: IPNet } | null {
  const [enabled, len, min, max] =
    family === 4
      ? [cfg.enableIPv4, cfg.subnetLen, cfg.subnetMin, cfg.subnetMax]
      : [cfg.enableIPv6, cfg.ipv6SubnetLen, cfg.ipv6SubnetMin, cfg.ipv6SubnetMax];
  // Without checkSubnets the bounds may be unset: there is no range to offer then.
  if (!enabled || len === 0 || min === null || max === null) return null;
  return { min: IPNet.of(min, len), max: IPNet.of(max, len) };
}

// ---- top-level keys -------------------------------------------------------------------------

/**
 * Resolves the document's keys to the Go struct's fields as encoding/json does: case-insensitive,
 * the last occurrence wins. JSON.parse cannot tell us that (it keeps the first position of a
 * repeated key), so the entries are read in document order from the text itself.
 */
function pickKeys(text: string, warnings: string[]): { values: Map<Key, JsonValue>; backendText: string } {
  const byFold = new Map<string, Key>(KEYS.map((k) => [fold(k), k]));
  const values = new Map<Key, JsonValue>();
  const seen = new Map<Key, string>();
  let backendText = '';
  for (const [name, value, raw] of objectEntries(text)) {
    const key = byFold.get(fold(name));
    if (key === undefined) {
      warnings.push(`unknown key ${JSON.stringify(name)} ignored`);
      continue;
    }
    const prev = seen.get(key);
    if (prev !== undefined) {
      warnings.push(`key ${JSON.stringify(name)} repeats ${JSON.stringify(prev)}; the last value is used`);
    }
    seen.set(key, name);
    // null leaves a Go field at its default, so it counts as absent.
    if (value === null) values.delete(key);
    else values.set(key, value);
    // Backend's own keys need the same treatment, which only its text allows.
    if (key === 'Backend') backendText = raw;
  }
  return { values, backendText };
}

/** Go's case folding for struct field names (simple folding: "ſ" matches "s", "K" (Kelvin) matches "k"). */
function fold(s: string): string {
  let out = '';
  for (const ch of s) {
    const up = ch.toUpperCase();
    out += up.length === ch.length ? up.toLowerCase() : ch;
  }
  return out;
}

/**
 * The [key, value, value text] triples of the JSON object in `text`, in document order,
 * duplicates kept. `text` must already be known to be valid JSON with an object at the top.
 */
function objectEntries(text: string): Array<[string, JsonValue, string]> {
  const entries: Array<[string, JsonValue, string]> = [];
  let i = skipWs(text, 0);
  i++; // '{'
  for (;;) {
    i = skipWs(text, i);
    if (text[i] === '}') break;
    if (text[i] === ',') i = skipWs(text, i + 1);
    const keyEnd = skipString(text, i);
    const name = JSON.parse(text.slice(i, keyEnd)) as string;
    i = skipWs(text, keyEnd) + 1; // ':'
    const start = skipWs(text, i);
    const end = skipValue(text, start);
    const raw = text.slice(start, end);
    entries.push([name, JSON.parse(raw) as JsonValue, raw]);
    i = end;
  }
  return entries;
}

function skipWs(text: string, i: number): number {
  while (i < text.length && ' \t\n\r'.includes(text[i] ?? '')) i++;
  return i;
}

/** `i` is at an opening quote; returns the index after the closing one. */
function skipString(text: string, i: number): number {
  i++;
  while (i < text.length && text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
  return i + 1;
}

function skipValue(text: string, i: number): number {
  const c = text[i];
  if (c === '"') return skipString(text, i);
  if (c === '{' || c === '[') {
    let depth = 0;
    while (i < text.length) {
      const d = text[i];
      if (d === '"') {
        i = skipString(text, i);
        continue;
      }
      if (d === '{' || d === '[') depth++;
      else if (d === '}' || d === ']') {
        depth--;
        if (depth === 0) return i + 1;
      }
      i++;
    }
    return i;
  }
  // number, true, false, null
  while (i < text.length && !',}] \t\n\r'.includes(text[i] ?? '')) i++;
  return i;
}

// ---- scalar fields --------------------------------------------------------------------------

function isObject(v: JsonValue | undefined): v is { [key: string]: JsonValue } {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The value as it appears in the config, short enough for a log line. */
function show(v: JsonValue): string {
  const s = JSON.stringify(v);
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

function parseBool(values: Map<Key, JsonValue>, key: Key, dflt: boolean): boolean {
  const v = values.get(key);
  if (v === undefined) return dflt;
  if (typeof v !== 'boolean') throw new ConfigError(key, `${key} ${show(v)}: must be true or false`);
  return v;
}

function parseLen(values: Map<Key, JsonValue>, key: Key): number {
  const v = values.get(key);
  if (v === undefined) return 0;
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw new ConfigError(key, `${key} ${show(v)}: must be an integer`);
  if (v < 0) throw new ConfigError(key, `${key} ${v}: must not be negative`);
  return v;
}

function parseCidr(values: Map<Key, JsonValue>, key: Key, family: Family, warnings: string[]): IPNet | null {
  const v = values.get(key);
  if (v === undefined) return null;
  if (typeof v !== 'string') throw new ConfigError(key, `${key} ${show(v)}: must be a CIDR string`);
  let parsed: ReturnType<typeof IPNet.parseWithHost>;
  try {
    parsed = IPNet.parseWithHost(v);
  } catch (e) {
    if (e instanceof InvalidPrefixError) throw new ConfigError(key, `${key} ${show(v)}: invalid CIDR: ${e.reason}`);
    throw e;
  }
  if (parsed.net.family !== family) throw new ConfigError(key, `${key} ${show(v)}: must be an IPv${family} CIDR`);
  // Go's net.ParseCIDR (and so flannel) masks the host bits without a word; we say so.
  if (parsed.hostBitsSet) warnings.push(`${key} ${v} has host bits set; using ${parsed.net.toString()}`);
  return parsed.net;
}

function parseAddr(values: Map<Key, JsonValue>, key: Key, family: Family): IPAddr | null {
  const v = values.get(key);
  if (v === undefined) return null;
  if (typeof v !== 'string') throw new ConfigError(key, `${key} ${show(v)}: must be an IPv${family} address string`);
  let ip: IPAddr;
  try {
    ip = IPAddr.parse(v);
  } catch (e) {
    if (e instanceof InvalidAddressError) throw new ConfigError(key, `${key} ${show(v)}: invalid IP address: ${e.reason}`);
    throw e;
  }
  if (ip.family !== family) throw new ConfigError(key, `${key} ${show(v)}: must be an IPv${family} address`);
  // flannel takes the zero address as "not set" (its Go zero value), so an explicit 0.0.0.0 / :: gets the default.
  return ip.isUnspecified() ? null : ip;
}

// ---- per-family rules -----------------------------------------------------------------------

function parseFamily(
  values: Map<Key, JsonValue>,
  k: FamilyKeys,
  enabled: boolean,
  checkSubnets: boolean,
  warnings: string[],
): FamilyConfig {
  // Types are checked even for a disabled family, as Go's Unmarshal does.
  const network = parseCidr(values, k.network, k.family, warnings);
  const subnetLen = parseLen(values, k.subnetLen);
  const subnetMin = parseAddr(values, k.subnetMin, k.family);
  const subnetMax = parseAddr(values, k.subnetMax, k.family);

  if (!enabled) {
    const given = [k.network, k.subnetLen, k.subnetMin, k.subnetMax].filter((key) => values.has(key));
    if (given.length > 0) warnings.push(`${given.join(', ')} ignored because ${k.enable} is false`);
    return DISABLED;
  }
  if (network === null) throw new ConfigError(k.network, `${k.network}: required when ${k.enable} is true`);

  if (!checkSubnets) {
    // kube mode: flannel keeps what was given. A length past the family's width can never be used.
    if (subnetLen > network.bits) {
      throw new ConfigError(k.subnetLen, `${k.subnetLen} ${subnetLen}: must be at most ${network.bits}`);
    }
    return { network, subnetLen, subnetMin, subnetMax };
  }
  return checkFamily(k, network, subnetLen, subnetMin, subnetMax);
}

/** flannel's CheckNetworkConfig for one family: defaults, then range and alignment checks. */
function checkFamily(
  k: FamilyKeys,
  network: IPNet,
  givenLen: number,
  givenMin: IPAddr | null,
  givenMax: IPAddr | null,
): FamilyConfig {
  const bits = network.bits;
  if (network.prefix === 0) {
    // flannel's Network.Empty(): a /0 at the zero address reads as "not configured".
    throw new ConfigError(k.network, `${k.network} ${network.toString()}: must not be the whole address space`);
  }

  let subnetLen = givenLen;
  if (subnetLen > 0) {
    if (subnetLen > k.maxSubnetLen) {
      throw new ConfigError(k.subnetLen, `${k.subnetLen} ${subnetLen}: must be at most ${k.maxSubnetLen}`);
    }
    // The first subnet is never handed out, so fewer than four would leave one or two usable.
    if (subnetLen < network.prefix + 2) {
      throw new ConfigError(
        k.subnetLen,
        `${k.subnetLen} ${subnetLen}: must be at least ${network.prefix + 2} ` +
          `(${k.network} /${network.prefix} must hold at least four subnets)`,
      );
    }
  } else {
    const minPrefix = k.maxSubnetLen - 2;
    if (network.prefix > minPrefix) {
      throw new ConfigError(
        k.network,
        `${k.network} ${network.toString()}: network is too small; the minimum useful prefix is /${minPrefix}`,
      );
    }
    subnetLen = network.prefix <= k.defaultSubnetLen - 2 ? k.defaultSubnetLen : network.prefix + 2;
  }

  const size = 1n << BigInt(bits - subnetLen);
  // The first subnet is skipped: its address is the Network's own address.
  const subnetMin = givenMin ?? IPAddr.of(k.family, network.first + size);
  const subnetMax = givenMax ?? IPAddr.of(k.family, network.last + 1n - size);

  for (const [key, ip] of [
    [k.subnetMin, subnetMin],
    [k.subnetMax, subnetMax],
  ] as const) {
    if (!network.contains(ip)) {
      throw new ConfigError(key, `${key} ${ip.toString()}: outside ${k.network} ${network.toString()}`);
    }
  }
  for (const [key, ip] of [
    [k.subnetMin, subnetMin],
    [k.subnetMax, subnetMax],
  ] as const) {
    if (ip.value % size !== 0n) throw new ConfigError(key, `${key} ${ip.toString()}: not on a /${subnetLen} boundary`);
  }
  // weft addition: flannel accepts an empty range and then finds no subnet to lease.
  if (subnetMin.value > subnetMax.value) {
    throw new ConfigError(
      k.subnetMin,
      `${k.subnetMin} ${subnetMin.toString()} is above ${k.subnetMax} ${subnetMax.toString()}`,
    );
  }
  return { network, subnetLen, subnetMin, subnetMax };
}

// ---- Backend --------------------------------------------------------------------------------

function parseBackend(v: JsonValue | undefined, text: string, knownBackends: readonly string[]): BackendConfig {
  const known = [...knownBackends].sort().join(', ');
  if (v === undefined) {
    if (!knownBackends.includes(DEFAULT_BACKEND)) {
      throw new ConfigError(
        'Backend',
        `Backend: not given, and the default type "${DEFAULT_BACKEND}" is not available (known types: ${known})`,
      );
    }
    return { type: DEFAULT_BACKEND, options: {} };
  }
  if (!isObject(v)) throw new ConfigError('Backend', `Backend ${show(v)}: must be an object with a "Type"`);

  // `Type` follows the same Go key rules as the top level: any case, last one wins.
  let type: JsonValue = null;
  for (const [name, value] of objectEntries(text)) {
    if (fold(name) === 'type') type = value;
  }
  if (type === null || type === '') {
    throw new ConfigError('Backend.Type', `Backend.Type: required (known types: ${known})`);
  }
  if (typeof type !== 'string') throw new ConfigError('Backend.Type', `Backend.Type ${show(type)}: must be a string`);
  // Backend names are matched exactly, as flannel's backend registry does.
  if (!knownBackends.includes(type)) {
    throw new ConfigError('Backend.Type', `Backend.Type ${show(type)}: unknown backend type (known types: ${known})`);
  }
  return { type, options: v };
}
