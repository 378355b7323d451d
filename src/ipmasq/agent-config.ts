// The ip-masq-agent config file (`--ip-masq-config`): YAML or JSON with ip-masq-agent's keys
// (kubernetes-sigs/ip-masq-agent cmd/ip-masq-agent/ip-masq-agent.go, MasqConfig). Parsing is pure
// and strict: every bad value is named with its key and position, and nothing half-parsed is used.
import { readFile } from 'node:fs/promises';
import yaml from 'js-yaml';
import { IPNet, InvalidPrefixError } from '../util/ip.js';
import type { AgentMasq } from './agent-rules.js';
import { errnoCode, errorMessage } from '../util/errors.js';

/**
 * ip-masq-agent's list with --nomasq-all-reserved-ranges (GKE's setting): RFC 1918 and the other
 * ranges RFCs reserve. Without that flag ip-masq-agent only has the first three.
 */
export const DEFAULT_NON_MASQUERADE_CIDRS: readonly string[] = [
  '10.0.0.0/8', // RFC 1918
  '172.16.0.0/12', // RFC 1918
  '192.168.0.0/16', // RFC 1918
  '100.64.0.0/10', // RFC 6598
  '192.0.0.0/24', // RFC 6890
  '192.0.2.0/24', // RFC 5737
  '192.88.99.0/24', // RFC 7526
  '198.18.0.0/15', // RFC 6815
  '198.51.100.0/24', // RFC 5737
  '203.0.113.0/24', // RFC 5737
  '240.0.0.0/4', // RFC 5735
];

export const DEFAULT_RESYNC_INTERVAL_MS = 60_000;
/** ip-masq-agent's guard against "really bad mistakes"; the file may raise it with `cidrLimit`. */
export const DEFAULT_CIDR_LIMIT = 64;
/** setTimeout cannot wait longer than 2^31-1 ms; a day is plenty for a re-read safety net. */
const MAX_RESYNC_INTERVAL_MS = 24 * 3600 * 1000;

export interface AgentConfig extends AgentMasq {
  /** How often the file is re-read even without a change notice (ip-masq-agent's only reload). */
  readonly resyncIntervalMs: number;
  readonly cidrLimit: number;
}

export interface ParsedAgentConfig {
  readonly config: AgentConfig;
  /** Keys ip-masq-agent knows that weft does not implement (ignored); one line each. */
  readonly warnings: string[];
}

export class AgentConfigError extends Error {
  constructor(
    /** The file (or "config") the text came from. */
    readonly source: string,
    readonly detail: string,
  ) {
    super(`${source}: ${detail}`);
    this.name = 'AgentConfigError';
  }
}

/** ip-masq-agent keys weft reads. */
const KEYS = new Set(['nonMasqueradeCIDRs', 'masqLinkLocal', 'masqLinkLocalIPv6', 'resyncInterval', 'cidrLimit']);
/** ip-masq-agent keys (of its versions and forks) weft accepts but does not implement. */
const IGNORED_KEYS: Record<string, string> = {
  snatTarget: 'weft masquerades; SNAT to a fixed address is not supported',
  outputInterface: 'weft masquerades on every interface',
  outputAddress: 'SNAT to a fixed address is not supported',
  outputAddressIPv6: 'SNAT to a fixed address is not supported',
  masqChain: `weft's chain name is fixed`,
  masqRandomFully: 'weft uses --random-fully whenever iptables has it (--ip-masq-fully-random-disable turns it off)',
  masqAllReservedRanges: `weft's defaults already include every reserved range`,
  enableIPv6: 'IPv6 rules follow the network config (EnableIPv6)',
};

export function defaultAgentConfig(): AgentConfig {
  return {
    nonMasqueradeCIDRs: DEFAULT_NON_MASQUERADE_CIDRS.map((c) => IPNet.parse(c)),
    masqLinkLocal: false,
    masqLinkLocalIPv6: false,
    resyncIntervalMs: DEFAULT_RESYNC_INTERVAL_MS,
    cidrLimit: DEFAULT_CIDR_LIMIT,
  };
}

const UNIT_NS: Record<string, number> = { ns: 1, us: 1e3, 'µs': 1e3, 'μs': 1e3, ms: 1e6, s: 1e9, m: 60e9, h: 3600e9 };

/** Go's time.ParseDuration ("60s", "1m30s", "1.5h", "300ms", "0"), in milliseconds; null when not one. */
export function parseGoDuration(text: string): number | null {
  const m = /^([-+]?)(.*)$/s.exec(text);
  let rest = m?.[2] ?? '';
  const sign = m?.[1] === '-' ? -1 : 1;
  if (rest === '0') return 0;
  if (rest === '') return null;
  let ns = 0;
  while (rest !== '') {
    const part = /^(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)/.exec(rest);
    if (!part) return null;
    ns += Number(part[1]) * UNIT_NS[part[2]!]!;
    rest = rest.slice(part[0].length);
  }
  return (sign * ns) / 1e6;
}

const describeValue = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'a list' : `${typeof v} ${JSON.stringify(v)}`);

/** One nonMasqueradeCIDRs entry; Go's net.ParseCIDR plus ip-masq-agent's alignment check. */
function parseCidr(entry: unknown, where: string): IPNet {
  if (typeof entry !== 'string') throw new Error(`${where} must be a string in CIDR notation, got ${describeValue(entry)}`);
  let parsed: ReturnType<typeof IPNet.parseWithHost>;
  try {
    parsed = IPNet.parseWithHost(entry.trim());
  } catch (e) {
    const reason = e instanceof InvalidPrefixError ? e.reason : errorMessage(e);
    throw new Error(`${where} ${JSON.stringify(entry)} is not a CIDR: ${reason}`);
  }
  if (parsed.hostBitsSet) {
    throw new Error(`${where} ${JSON.stringify(entry)} is not aligned to a CIDR block (the network is ${parsed.net.toString()})`);
  }
  return parsed.net;
}

/**
 * Parses the file's text (YAML; JSON is YAML too). An empty file means the defaults, as in
 * ip-masq-agent; a key that is absent or null keeps its default. Throws AgentConfigError.
 */
export function parseAgentConfig(text: string, source = 'ip-masq config'): ParsedAgentConfig {
  let doc: unknown;
  try {
    // CORE_SCHEMA: no timestamps or other YAML 1.1 surprises; duplicate keys are errors.
    doc = yaml.load(text, { schema: yaml.CORE_SCHEMA, filename: source });
  } catch (e) {
    const msg = e instanceof yaml.YAMLException ? e.message.split('\n')[0]! : errorMessage(e);
    throw new AgentConfigError(source, `not valid YAML or JSON: ${msg}`);
  }
  const config: { -readonly [K in keyof AgentConfig]: AgentConfig[K] } = defaultAgentConfig();
  const warnings: string[] = [];
  if (doc === undefined || doc === null) return { config, warnings };
  if (typeof doc !== 'object' || Array.isArray(doc)) {
    throw new AgentConfigError(source, `must be a mapping of ip-masq-agent keys (nonMasqueradeCIDRs, masqLinkLocal, ...), got ${describeValue(doc)}`);
  }
  const o = doc as Record<string, unknown>;
  try {
    for (const key of Object.keys(o)) {
      if (KEYS.has(key)) continue;
      const why = IGNORED_KEYS[key];
      // An unknown key is most likely a typo of a known one: silently using the defaults instead would hide it.
      if (why === undefined) throw new Error(`unknown key "${key}" (known: ${[...KEYS].join(', ')})`);
      warnings.push(`${key} is ignored: ${why}`);
    }
    const bool = (key: 'masqLinkLocal' | 'masqLinkLocalIPv6'): void => {
      const v = o[key];
      if (v === undefined || v === null) return;
      if (typeof v !== 'boolean') throw new Error(`${key} must be true or false, got ${describeValue(v)}`);
      config[key] = v;
    };
    bool('masqLinkLocal');
    bool('masqLinkLocalIPv6');
    const limit = o.cidrLimit;
    if (limit !== undefined && limit !== null) {
      if (typeof limit !== 'number' || !Number.isInteger(limit) || limit <= 0) throw new Error(`cidrLimit must be a positive integer, got ${describeValue(limit)}`);
      config.cidrLimit = limit;
    }
    const list = o.nonMasqueradeCIDRs;
    if (list !== undefined && list !== null) {
      if (!Array.isArray(list)) throw new Error(`nonMasqueradeCIDRs must be a list of CIDRs, got ${describeValue(list)}`);
      if (list.length > config.cidrLimit) {
        throw new Error(`nonMasqueradeCIDRs has ${list.length} entries; at most ${config.cidrLimit} are accepted (raise cidrLimit if this is intended)`);
      }
      config.nonMasqueradeCIDRs = list.map((entry, i) => parseCidr(entry, `nonMasqueradeCIDRs[${i}]`));
    }
    const interval = o.resyncInterval;
    if (interval !== undefined && interval !== null) {
      // ip-masq-agent refuses a bare number too: "60" would be nanoseconds in Go.
      if (typeof interval !== 'string') throw new Error(`resyncInterval must be a Go duration string such as "60s", got ${describeValue(interval)}`);
      const ms = parseGoDuration(interval.trim());
      if (ms === null) throw new Error(`resyncInterval ${JSON.stringify(interval)} is not a Go duration (e.g. "60s", "1m30s", "500ms")`);
      if (ms < 0) throw new Error(`resyncInterval ${JSON.stringify(interval)} must not be negative`);
      if (ms > MAX_RESYNC_INTERVAL_MS) throw new Error(`resyncInterval ${JSON.stringify(interval)} is longer than 24h`);
      // Zero means the default, as in ip-masq-agent.
      config.resyncIntervalMs = ms === 0 ? DEFAULT_RESYNC_INTERVAL_MS : ms;
    }
  } catch (e) {
    throw new AgentConfigError(source, errorMessage(e));
  }
  return { config, warnings };
}

export interface LoadedAgentConfig extends ParsedAgentConfig {
  /** The file's text; null when there is no file (the defaults apply, as in ip-masq-agent). */
  readonly text: string | null;
}

/** Reads and parses the file; a missing file gives the defaults. Throws AgentConfigError. */
export async function loadAgentConfig(path: string): Promise<LoadedAgentConfig> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return { config: defaultAgentConfig(), warnings: [], text: null };
    throw new AgentConfigError(path, `cannot read: ${errorMessage(e)}`);
  }
  return { ...parseAgentConfig(text, path), text };
}

/** What changed between two configs, one line each, for the reload log ([] when nothing did). */
export function describeAgentChange(before: AgentConfig, after: AgentConfig): string[] {
  const out: string[] = [];
  const a = before.nonMasqueradeCIDRs.map(String);
  const b = after.nonMasqueradeCIDRs.map(String);
  const added = b.filter((c) => !a.includes(c));
  const removed = a.filter((c) => !b.includes(c));
  if (added.length > 0) out.push(`nonMasqueradeCIDRs added: ${added.join(', ')}`);
  if (removed.length > 0) out.push(`nonMasqueradeCIDRs removed: ${removed.join(', ')}`);
  if (added.length === 0 && removed.length === 0 && a.join() !== b.join()) out.push('nonMasqueradeCIDRs reordered');
  if (before.masqLinkLocal !== after.masqLinkLocal) out.push(`masqLinkLocal: ${before.masqLinkLocal} -> ${after.masqLinkLocal}`);
  if (before.masqLinkLocalIPv6 !== after.masqLinkLocalIPv6) out.push(`masqLinkLocalIPv6: ${before.masqLinkLocalIPv6} -> ${after.masqLinkLocalIPv6}`);
  if (before.resyncIntervalMs !== after.resyncIntervalMs) out.push(`resyncInterval: ${before.resyncIntervalMs}ms -> ${after.resyncIntervalMs}ms`);
  if (before.cidrLimit !== after.cidrLimit) out.push(`cidrLimit: ${before.cidrLimit} -> ${after.cidrLimit}`);
  return out;
}

/** Reload outcomes, for metrics: a new config applied, or a bad/unreadable file (previous rules kept). */
export type ConfigReloadResult = 'applied' | 'error';

export interface AgentConfigMetrics {
  recordConfigReload(result: ConfigReloadResult): void;
}
