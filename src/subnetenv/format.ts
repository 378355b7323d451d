// subnet.env: the contract between weftd (which writes it) and the CNI plugins, `weft trace` and
// flannel's tools (which read it). The flannel variables come first, in the order and form of
// flannel's WriteSubnetFile; weft's own `WEFT_*` lines follow (flannel's readers skip keys they do
// not know, so they never break a flannel plugin).
//
// One renderer and one parser. The parser never throws: it reads every line (godotenv's syntax,
// as flanneld reads the file back: `export`, quotes, comments; the last assignment of a key wins)
// and records each value that does not parse. Its readers then ask their own question of it:
//   - `requireSubnetEnv` — the CNI plugin's: every variable present and valid, else a
//     SubnetEnvError in flannel's wording (flannel.go loadFlannelSubnetEnv);
//   - `previousSubnets` — weftd's at start: which subnets did this node have? (flannel main.go
//     ReadCIDRFromSubnetFile: list entries that are not a CIDR of the family are skipped, and
//     anything but exactly one valid entry means none).
import { IPNet, type Family } from '../util/ip.js';

/** The backend/mode lines weftd appends after flannel's; null when absent or empty. */
export interface WeftSubnetEnv {
  /** WEFT_BACKEND: the backend type when the CNI plugin must know it, e.g. "ovs". */
  readonly backend: string | null;
  /** WEFT_OVS_BRIDGE: the integration bridge the weft-ovs plugin attaches pods to. */
  readonly ovsBridge: string | null;
  /** WEFT_OVS_RUNDIR: the OVS run directory (db.sock, <bridge>.mgmt). */
  readonly ovsRunDir: string | null;
  /** WEFT_OVS_DATAPATH: "system" or "netdev". */
  readonly ovsDatapath: string | null;
  /** WEFT_IPMASQ: "agent" when weftd masquerades in ip-masq-agent mode (--ip-masq-config). */
  readonly ipMasqMode: 'agent' | null;
}

export const NO_WEFT_LINES: WeftSubnetEnv = { backend: null, ovsBridge: null, ovsRunDir: null, ovsDatapath: null, ipMasqMode: null };

export interface SubnetEnv {
  /** FLANNEL_NETWORK: a comma list in the file; networks (host bits cleared), deduplicated, in order. */
  readonly networks: readonly IPNet[];
  /** The lease subnet; written as its first address (the bridge gateway) with the prefix length. */
  readonly subnet: IPNet | null;
  readonly ipv6Networks: readonly IPNet[];
  readonly ipv6Subnet: IPNet | null;
  readonly mtu: number;
  /** True only for the exact text `true`, as flannel compares it. */
  readonly ipMasq: boolean;
  readonly weft: WeftSubnetEnv;
}

/** Why subnet.env could not be used: `missing` (no lease yet), `unreadable` (I/O), `invalid` (content). */
export type SubnetEnvProblem = 'missing' | 'unreadable' | 'invalid';

export class SubnetEnvError extends Error {
  constructor(
    readonly file: string,
    readonly problem: SubnetEnvProblem,
    /** The offending variables (for `invalid`). */
    readonly variables: readonly string[],
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'SubnetEnvError';
  }
}

const WEFT_KEYS: ReadonlyArray<readonly [keyof WeftSubnetEnv, string]> = [
  ['backend', 'WEFT_BACKEND'],
  ['ovsBridge', 'WEFT_OVS_BRIDGE'],
  ['ovsRunDir', 'WEFT_OVS_RUNDIR'],
  ['ovsDatapath', 'WEFT_OVS_DATAPATH'],
  ['ipMasqMode', 'WEFT_IPMASQ'],
];

const MAX_UINT32 = 4294967295;

function checkFamily(name: string, net: IPNet | null, family: Family): void {
  if (net !== null && net.family !== family) throw new RangeError(`${name} must be an IPv${family} prefix, got ${net.toString()}`);
}

/** A value the reader gives back unchanged: no line breaks, no quotes or `#` a reader would strip, no edge blanks. */
function checkWeftValue(key: string, value: string): void {
  if (!/^[A-Za-z0-9_./:@+-]+$/.test(value)) throw new RangeError(`bad subnet.env value ${key}=${JSON.stringify(value)}`);
}

/** The exact file content; only the families and `WEFT_*` values present in `env` appear. */
export function renderSubnetEnv(env: SubnetEnv): string {
  for (const n of env.networks) checkFamily('network', n, 4);
  checkFamily('subnet', env.subnet, 4);
  for (const n of env.ipv6Networks) checkFamily('ipv6Network', n, 6);
  checkFamily('ipv6Subnet', env.ipv6Subnet, 6);
  if (!Number.isInteger(env.mtu) || env.mtu <= 0) throw new RangeError(`mtu must be a positive integer, got ${env.mtu}`);
  const gateway = (n: IPNet): string => `${n.nth(1n).toString()}/${n.prefix}`;
  const lines: string[] = [];
  if (env.networks.length > 0) lines.push(`FLANNEL_NETWORK=${env.networks.map(String).join(',')}`);
  if (env.subnet) lines.push(`FLANNEL_SUBNET=${gateway(env.subnet)}`);
  if (env.ipv6Networks.length > 0) lines.push(`FLANNEL_IPV6_NETWORK=${env.ipv6Networks.map(String).join(',')}`);
  if (env.ipv6Subnet) lines.push(`FLANNEL_IPV6_SUBNET=${gateway(env.ipv6Subnet)}`);
  lines.push(`FLANNEL_MTU=${env.mtu}`);
  lines.push(`FLANNEL_IPMASQ=${env.ipMasq ? 'true' : 'false'}`);
  for (const [field, key] of WEFT_KEYS) {
    const value = env.weft[field];
    if (value === null) continue;
    checkWeftValue(key, value);
    lines.push(`${key}=${value}`);
  }
  return lines.map((l) => `${l}\n`).join('');
}

/** One entry of a CIDR list as read: a network of the key's family, or why not. */
type CidrEntry = { readonly net: IPNet } | { readonly text: string; readonly wrongFamily: boolean };

/** A value that did not parse, in the reader's words. */
export interface InvalidValue {
  readonly key: string;
  readonly reason: string;
}

export interface ParsedSubnetEnv {
  /** The value of every key as of its last assignment (unquoted). */
  readonly values: ReadonlyMap<string, string>;
  /** Every CIDR key's list entries, as of its last assignment. */
  readonly cidrs: ReadonlyMap<CidrKey, readonly CidrEntry[]>;
  /** The MTU of the last assignment; null when absent or not an unsigned 32-bit integer. */
  readonly mtu: number | null;
  /** null when absent. */
  readonly ipMasq: boolean | null;
  readonly weft: WeftSubnetEnv;
  /** Every value that did not parse, in file order (also ones a later line replaced, as flannel's reader stops at the first). */
  readonly invalid: readonly InvalidValue[];
}

const CIDR_KEYS = {
  FLANNEL_NETWORK: { family: 4, list: true },
  FLANNEL_SUBNET: { family: 4, list: false },
  FLANNEL_IPV6_NETWORK: { family: 6, list: true },
  FLANNEL_IPV6_SUBNET: { family: 6, list: false },
} as const satisfies Record<string, { family: Family; list: boolean }>;
type CidrKey = keyof typeof CIDR_KEYS;

const isCidrKey = (key: string): key is CidrKey => Object.hasOwn(CIDR_KEYS, key);

/** Unquoted values may carry a trailing ` # comment` (godotenv behaviour). */
function unquote(raw: string): string {
  const v = raw.trim();
  const q = v[0];
  if ((q === '"' || q === "'") && v.length >= 2) {
    const end = v.indexOf(q, 1);
    if (end > 0) return v.slice(1, end);
  }
  const hash = v.search(/\s#/);
  return (hash >= 0 ? v.slice(0, hash) : v).trim();
}

/** KEY=VALUE lines in file order; blanks, comments and lines that are not an assignment are skipped. */
function assignments(text: string): Array<readonly [string, string]> {
  const out: Array<readonly [string, string]> = [];
  for (const rawLine of text.split(/\r?\n/)) {
    let line = rawLine.trim();
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith('export ')) line = line.slice('export '.length).trimStart();
    const eq = line.indexOf('=');
    if (eq <= 0) continue;
    const key = line.slice(0, eq).trim();
    if (!/^[A-Za-z_][A-Za-z0-9_.]*$/.test(key)) continue;
    out.push([key, unquote(line.slice(eq + 1))]);
  }
  return out;
}

function cidrEntry(text: string, family: Family): CidrEntry {
  const net = IPNet.tryParse(text);
  if (net !== null && net.family === family) return { net };
  return { text, wrongFamily: net !== null };
}

function cidrProblem(key: CidrKey, e: CidrEntry): string | null {
  if ('net' in e) return null;
  return e.wrongFamily ? `${key} must be an IPv${CIDR_KEYS[key].family} CIDR, got "${e.text}"` : `${key} has an invalid CIDR "${e.text}"`;
}

/** Reads every line; never throws (a damaged file reads as what could be read, plus `invalid`). */
export function parseSubnetEnv(text: string): ParsedSubnetEnv {
  const values = new Map<string, string>();
  const cidrs = new Map<CidrKey, readonly CidrEntry[]>();
  const invalid: InvalidValue[] = [];
  let mtu: number | null = null;
  let ipMasq: boolean | null = null;
  const weft: { -readonly [K in keyof WeftSubnetEnv]: string | null } = { ...NO_WEFT_LINES };
  for (const [key, value] of assignments(typeof text === 'string' ? text : '')) {
    values.set(key, value);
    if (isCidrKey(key)) {
      const { family, list } = CIDR_KEYS[key];
      // A single-CIDR key is one entry even with commas in it (the plugin's reading); weftd's
      // reading of its previous subnets splits it (lenientCidr).
      const entries = (list ? value.split(',') : [value]).map((t) => cidrEntry(t.trim(), family));
      cidrs.set(key, entries);
      const bad = entries.map((e) => cidrProblem(key, e)).find((p) => p !== null);
      if (bad) invalid.push({ key, reason: bad });
    } else if (key === 'FLANNEL_MTU') {
      // strconv.ParseUint(v, 10, 32): decimal digits only.
      const n = /^\d{1,10}$/.test(value) ? Number(value) : NaN;
      mtu = n <= MAX_UINT32 ? n : null;
      if (mtu === null) invalid.push({ key, reason: `${key} must be an unsigned integer, got "${value}"` });
    } else if (key === 'FLANNEL_IPMASQ') {
      ipMasq = value === 'true';
    } else {
      const field = WEFT_KEYS.find(([, k]) => k === key)?.[0];
      if (field) weft[field] = value || null;
    }
  }
  const ipMasqMode = weft.ipMasqMode === 'agent' ? 'agent' : null;
  return { values, cidrs, mtu, ipMasq, weft: { ...weft, ipMasqMode }, invalid };
}

/** The valid networks of a CIDR key (deduplicated, in order); empty when absent or any entry is bad. */
function strictList(p: ParsedSubnetEnv, key: CidrKey): IPNet[] {
  const out: IPNet[] = [];
  for (const e of p.cidrs.get(key) ?? []) {
    if (!('net' in e)) return [];
    if (!out.some((n) => n.equals(e.net))) out.push(e.net);
  }
  return out;
}

/** flannel's ReadCIDRFromSubnetFile: the one valid entry of the key's family in its comma list, or null. */
function lenientCidr(p: ParsedSubnetEnv, key: CidrKey): IPNet | null {
  const value = p.values.get(key);
  if (value === undefined) return null;
  const valid = value.split(',').flatMap((t) => {
    const e = cidrEntry(t.trim(), CIDR_KEYS[key].family);
    return 'net' in e ? [e.net] : [];
  });
  return valid.length === 1 ? (valid[0] ?? null) : null;
}

/**
 * The CNI plugin's reading: every variable present and valid, else a SubnetEnvError naming the
 * first invalid value or every missing variable in flannel's wording (subnetEnv.missing()).
 */
export function requireSubnetEnv(p: ParsedSubnetEnv, file: string): SubnetEnv {
  const first = p.invalid[0];
  if (first) throw new SubnetEnvError(file, 'invalid', [first.key], `${file}: ${first.reason}`);
  const networks = strictList(p, 'FLANNEL_NETWORK');
  const ipv6Networks = strictList(p, 'FLANNEL_IPV6_NETWORK');
  const subnet = strictList(p, 'FLANNEL_SUBNET')[0] ?? null;
  const ipv6Subnet = strictList(p, 'FLANNEL_IPV6_SUBNET')[0] ?? null;
  const missing: string[] = [];
  if (networks.length === 0 && ipv6Networks.length === 0) missing.push('FLANNEL_NETWORK', 'FLANNEL_IPV6_NETWORK');
  if (subnet === null && ipv6Subnet === null) missing.push('FLANNEL_SUBNET', 'FLANNEL_IPV6_SUBNET');
  if (p.mtu === null) missing.push('FLANNEL_MTU');
  if (p.ipMasq === null) missing.push('FLANNEL_IPMASQ');
  if (p.mtu === null || p.ipMasq === null || missing.length > 0) {
    throw new SubnetEnvError(file, 'invalid', missing, `${file} is missing ${missing.join(', ')}`);
  }
  return { networks, subnet, ipv6Networks, ipv6Subnet, mtu: p.mtu, ipMasq: p.ipMasq, weft: p.weft };
}

/** What weftd reads back at start: the networks and subnets this node had, each or null. */
export interface PreviousSubnets {
  readonly network: IPNet | null;
  readonly subnet: IPNet | null;
  readonly ipv6Network: IPNet | null;
  readonly ipv6Subnet: IPNet | null;
}

export const NO_PREVIOUS_SUBNETS: PreviousSubnets = { network: null, subnet: null, ipv6Network: null, ipv6Subnet: null };

/** weftd's reading at start (flannel main.go); never throws: a damaged file means "no previous subnets". */
export function previousSubnets(p: ParsedSubnetEnv): PreviousSubnets {
  return {
    network: lenientCidr(p, 'FLANNEL_NETWORK'),
    subnet: lenientCidr(p, 'FLANNEL_SUBNET'),
    ipv6Network: lenientCidr(p, 'FLANNEL_IPV6_NETWORK'),
    ipv6Subnet: lenientCidr(p, 'FLANNEL_IPV6_SUBNET'),
  };
}
