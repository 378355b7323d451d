// portmap's request config: the reference keys (snat, markMasqBit, externalSetMarkChain,
// conditionsV4/V6, masqAll, backend, runtimeConfig.portMappings), checked in the reference's order
// and with its messages, plus the container addresses picked from prevResult the way the
// reference picks them. Pure: the backend auto-detection is passed in.
import { CniError, ErrorCode, type CniResult, type NetConf } from '../skel/types.js';
import { IPAddr, IPNet, type Family } from '../../src/util/ip.js';
import { errorMessage } from '../../src/util/errors.js';
import { xtChainProblem } from '../../src/render/iptables.js';
import { iptablesConditionsProblem, nftConditionsProblem } from './conditions.js';

export type Protocol = 'tcp' | 'udp' | 'sctp';
export type Backend = 'iptables' | 'nftables';

export const DEFAULT_MARK_BIT = 13;

export interface PortMapping {
  readonly hostPort: number;
  readonly containerPort: number;
  readonly protocol: Protocol;
  /** null when absent or empty. An unspecified address (0.0.0.0, ::) only restricts the family. */
  readonly hostIP: IPAddr | null;
}

export interface PortMapConfig {
  /** The network name (chain hash and comments). */
  readonly name: string;
  readonly backend: Backend;
  readonly snat: boolean;
  readonly masqAll: boolean;
  readonly markMasqBit: number;
  readonly externalSetMarkChain: string | null;
  readonly conditionsV4: readonly string[];
  readonly conditionsV6: readonly string[];
  readonly portMappings: readonly PortMapping[];
}

/** The address a family's rules forward to, and the prefix it was assigned with (hairpin source). */
export interface ContainerAddr {
  readonly ip: IPAddr;
  /** The assigned prefix, host bits cleared: what iptables keeps of `-s 10.1.0.5/24`. */
  readonly net: IPNet;
}

export interface ContainerAddrs {
  readonly v4: ContainerAddr | null;
  readonly v6: ContainerAddr | null;
}

/**
 * A config the reference rejects too: code 999 (the reference returns plain Go errors) and the
 * reference's message. `parseConfig` callers add the verb's prefix ("failed to parse config: ").
 */
export class PortMapConfigError extends CniError {
  constructor(msg: string, code: number = ErrorCode.Internal) {
    super(code, msg);
    this.name = 'PortMapConfigError';
  }
}

/** A config the reference would only reject later, from iptables/nft: rejected up front, code 7. */
function invalid(msg: string): PortMapConfigError {
  return new PortMapConfigError(msg, ErrorCode.InvalidNetworkConfig);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function optBool(conf: NetConf, key: string): boolean | null {
  const v = conf[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'boolean') throw invalid(`failed to parse network configuration: ${key} must be a boolean`);
  return v;
}

function optInt(conf: NetConf, key: string): number | null {
  const v = conf[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isInteger(v)) throw invalid(`failed to parse network configuration: ${key} must be an integer`);
  return v;
}

function optStringList(conf: NetConf, key: string): string[] | null {
  const v = conf[key];
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v) || !v.every((t): t is string => typeof t === 'string')) {
    throw invalid(`failed to parse network configuration: ${key} must be a list of strings`);
  }
  // Conditions end up on an iptables-restore / nft -f line: a line break would start a new command.
  for (const t of v) {
    if (/[\n\r\0]/.test(t)) throw invalid(`${key}: token ${JSON.stringify(t)} contains a line break or NUL`);
  }
  return v;
}

/**
 * "iptables" when the first condition token is an option ("-d", "--dport", "-m"), or "!" followed
 * by one; "nftables" otherwise; null when there are none. Upstream looks only at the first
 * character, which calls the iptables condition `! -d 192.0.2.0/24` an nftables one.
 */
export function backendOfConditions(conds: readonly string[] | null): Backend | null {
  if (!conds || conds.length === 0 || conds[0] === '') return null;
  const first = conds[0]!;
  if (first.startsWith('-')) return 'iptables';
  if (first === '!' && (conds[1] ?? '').startsWith('-')) return 'iptables';
  return 'nftables';
}

const PROTOCOLS: ReadonlySet<string> = new Set(['tcp', 'udp', 'sctp']);

function parseMappings(rc: unknown): PortMapping[] {
  if (!isRecord(rc)) return [];
  const raw = rc['portMappings'];
  if (raw === undefined || raw === null) return [];
  if (!Array.isArray(raw)) throw invalid('failed to parse network configuration: runtimeConfig.portMappings must be a list');
  const out: PortMapping[] = [];
  for (const [i, e] of raw.entries()) {
    if (!isRecord(e)) throw invalid(`failed to parse network configuration: runtimeConfig.portMappings[${i}] must be an object`);
    // Go's json leaves a missing number at 0, which the port checks below then reject.
    const num = (key: string): number => {
      const v = e[key];
      if (v === undefined || v === null) return 0;
      if (typeof v !== 'number' || !Number.isInteger(v)) {
        throw invalid(`failed to parse network configuration: runtimeConfig.portMappings[${i}].${key} must be an integer`);
      }
      return v;
    };
    const str = (key: string): string => {
      const v = e[key];
      if (v === undefined || v === null) return '';
      if (typeof v !== 'string') throw invalid(`failed to parse network configuration: runtimeConfig.portMappings[${i}].${key} must be a string`);
      return v;
    };
    const hostPort = num('hostPort');
    const containerPort = num('containerPort');
    const protocolText = str('protocol');
    const hostIPText = str('hostIP');
    out.push({ hostPort, containerPort, protocol: protocolText as Protocol, hostIP: hostIPText === '' ? null : hostIPFrom(hostIPText, i) });
  }
  return out;
}

function hostIPFrom(text: string, i: number): IPAddr {
  const ip = IPAddr.tryParse(text);
  if (!ip) throw invalid(`Invalid host IP in runtimeConfig.portMappings[${i}]: ${JSON.stringify(text)}`);
  return ip;
}

export interface ParseOptions {
  /** The backend when the config names none (upstream: iptables unless only nft is usable). */
  readonly defaultBackend: () => Backend;
}

/**
 * Validates the config in the reference's order: markMasqBit/externalSetMarkChain, the mark range,
 * the backend and its options, then the port numbers. Errors carry the reference's message
 * without the verb prefix.
 */
export function parseConfig(conf: NetConf, opts: ParseOptions): PortMapConfig {
  const snat = optBool(conf, 'snat') ?? true;
  const masqAll = optBool(conf, 'masqAll') ?? false;
  const markBitRaw = optInt(conf, 'markMasqBit');
  const extRaw = conf['externalSetMarkChain'];
  if (extRaw !== undefined && extRaw !== null && typeof extRaw !== 'string') {
    throw invalid('failed to parse network configuration: externalSetMarkChain must be a string');
  }
  const externalSetMarkChain = typeof extRaw === 'string' ? extRaw : null;
  if (markBitRaw !== null && externalSetMarkChain !== null) {
    throw new PortMapConfigError('Cannot specify externalSetMarkChain and markMasqBit');
  }
  const markMasqBit = markBitRaw ?? DEFAULT_MARK_BIT;
  if (markMasqBit < 0 || markMasqBit > 31) throw new PortMapConfigError('MasqMarkBit must be between 0 and 31');
  if (externalSetMarkChain !== null && xtChainProblem(externalSetMarkChain) !== null) {
    throw invalid(`externalSetMarkChain ${JSON.stringify(externalSetMarkChain)} is not a valid iptables chain name`);
  }

  const conditionsV4 = optStringList(conf, 'conditionsV4');
  const conditionsV6 = optStringList(conf, 'conditionsV6');

  // Options that belong to one backend, as upstream's validateBackend lists them.
  const optionsOf: Record<Backend, string[]> = { iptables: [], nftables: [] };
  if (externalSetMarkChain !== null) optionsOf.iptables.push('externalSetMarkChain');
  const b4 = backendOfConditions(conditionsV4);
  if (b4) optionsOf[b4].push('conditionsV4');
  const b6 = backendOfConditions(conditionsV6);
  if (b6) optionsOf[b6].push('conditionsV6');

  const backendRaw = conf['backend'];
  let backend: Backend;
  if (backendRaw === undefined || backendRaw === null) backend = opts.defaultBackend();
  else if (backendRaw === 'iptables' || backendRaw === 'nftables') backend = backendRaw;
  else throw new PortMapConfigError(`unrecognized backend ${JSON.stringify(backendRaw)}`);
  const wrong: Backend = backend === 'iptables' ? 'nftables' : 'iptables';
  if (optionsOf[wrong].length > 0) {
    throw new PortMapConfigError(`${backend} backend was requested but configuration contains ${wrong}-specific options [${optionsOf[wrong].join(' ')}]`);
  }
  // The conditions go into the rules that lead to the host ports: exactly one match fragment, nothing else.
  for (const [key, conds] of [
    ['conditionsV4', conditionsV4],
    ['conditionsV6', conditionsV6],
  ] as const) {
    if (conds === null) continue;
    const problem = backend === 'iptables' ? iptablesConditionsProblem(conds) : nftConditionsProblem(conds);
    if (problem !== null) {
      const [i, why] = problem;
      throw invalid(`${key}: token ${JSON.stringify(conds[i])} ${why} (${backend} conditions ${JSON.stringify(conds)} must be one rule match and nothing else)`);
    }
  }

  const portMappings = parseMappings(conf.runtimeConfig);
  for (const pm of portMappings) {
    if (pm.containerPort <= 0) throw new PortMapConfigError(`Invalid container port number: ${pm.containerPort}`);
    if (pm.hostPort <= 0) throw new PortMapConfigError(`Invalid host port number: ${pm.hostPort}`);
  }
  // Checks the reference leaves to iptables (which then fails half-way through its many calls).
  for (const pm of portMappings) {
    if (pm.containerPort > 65535) throw invalid(`Invalid container port number: ${pm.containerPort}`);
    if (pm.hostPort > 65535) throw invalid(`Invalid host port number: ${pm.hostPort}`);
  }
  const normalised = portMappings.map((pm) => {
    const p = String(pm.protocol).toLowerCase();
    if (!PROTOCOLS.has(p)) throw invalid(`Invalid protocol ${JSON.stringify(pm.protocol)} for host port ${pm.hostPort}: must be tcp, udp or sctp`);
    return { ...pm, protocol: p as Protocol };
  });

  return {
    name: conf.name,
    backend,
    snat,
    masqAll,
    markMasqBit,
    externalSetMarkChain,
    conditionsV4: conditionsV4 ?? [],
    conditionsV6: conditionsV6 ?? [],
    portMappings: normalised,
  };
}

/**
 * The first IPv4 and first IPv6 address of prevResult that belong to the sandbox interface
 * `ifname`. Like the reference, an IP without an interface index (or with one out of range) is
 * taken as the container's.
 */
export function containerAddrs(prev: CniResult, ifname: string): ContainerAddrs {
  let v4: ContainerAddr | null = null;
  let v6: ContainerAddr | null = null;
  const ifaces = prev.interfaces ?? [];
  for (const ipc of prev.ips ?? []) {
    let parsed;
    try {
      parsed = IPNet.parseWithHost(ipc.address);
    } catch (e) {
      throw new PortMapConfigError(`could not parse prevResult: invalid address ${JSON.stringify(ipc.address)}: ${errorMessage(e)}`);
    }
    const fam = parsed.ip.family;
    if ((fam === 4 && v4) || (fam === 6 && v6)) continue;
    const idx = ipc.interface;
    if (typeof idx === 'number' && idx >= 0 && idx < ifaces.length) {
      const iface = ifaces[idx]!;
      if (iface.name !== ifname || !iface.sandbox) continue;
    }
    const addr = { ip: parsed.ip, net: parsed.net };
    if (fam === 4) v4 = addr;
    else v6 = addr;
  }
  return { v4, v6 };
}

export function addrOf(addrs: ContainerAddrs, family: Family): ContainerAddr | null {
  return family === 4 ? addrs.v4 : addrs.v6;
}

export function conditionsOf(conf: PortMapConfig, family: Family): readonly string[] {
  return family === 4 ? conf.conditionsV4 : conf.conditionsV6;
}
