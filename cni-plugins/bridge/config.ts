// The bridge plugin's network config: every key of the reference plugin
// (containernetworking/plugins plugins/main/bridge), decoded with Go's encoding/json rules (a
// wrong JSON type is an error, null keeps the default, unknown keys are ignored) and validated
// with the reference's messages. Pure: no I/O.
import { InvalidMacError, parseMac } from '../../src/util/mac.js';
import { ifNameProblem } from '../../src/util/names.js';
import { CniError, ErrorCode, type CniDNS, type NetConf } from '../skel/types.js';

export const DEFAULT_BRIDGE = 'cni0';

export type IpMasqBackend = 'iptables' | 'nftables';

export interface BridgeConf {
  /** Network name (iptables chain and comment names derive from it). */
  readonly name: string;
  readonly cniVersion: string;
  readonly bridge: string;
  /** isGateway, or implied by isDefaultGateway. */
  readonly isGateway: boolean;
  readonly isDefaultGateway: boolean;
  readonly forceAddress: boolean;
  readonly ipMasq: boolean;
  /** null: "auto" (iptables unless only nftables is usable). */
  readonly ipMasqBackend: IpMasqBackend | null;
  /** 0: kernel default. */
  readonly mtu: number;
  readonly hairpinMode: boolean;
  readonly promiscMode: boolean;
  /** Access VLAN (PVID, untagged) of the host veth; 0 = none. */
  readonly vlan: number;
  /** Tagged VLANs of the host veth, sorted and de-duplicated (vlanTrunk). */
  readonly vlanTrunk: readonly number[];
  readonly preserveDefaultVlan: boolean;
  readonly macspoofchk: boolean;
  readonly enabledad: boolean;
  readonly disableContainerInterface: boolean;
  readonly portIsolation: boolean;
  /** Container veth MAC (CNI_ARGS MAC < args.cni.mac < runtimeConfig.mac), as given; see containerMac(). */
  readonly mac: string;
  /** IPAM plugin type; '' = layer 2 only. */
  readonly ipamType: string;
  /** The config's own `dns`, when set: it replaces what IPAM returned. */
  readonly dns: CniDNS | null;
}

/** A config the reference would refuse: code 7 with the reference's message. */
export class BridgeConfigError extends CniError {
  constructor(msg: string, details = '') {
    super(ErrorCode.InvalidNetworkConfig, msg, details);
    this.name = 'BridgeConfigError';
  }
}

type GoType = 'bool' | 'int' | 'string' | '[]string' | 'object' | 'array';

function jsonKind(v: unknown): string {
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return 'number';
  return typeof v;
}

/** Go's message for a value of the wrong JSON type. */
function typeError(field: string, v: unknown, want: string): BridgeConfigError {
  const what = typeof v === 'number' ? `number ${String(v)}` : jsonKind(v);
  return new BridgeConfigError(`failed to load netconf: json: cannot unmarshal ${what} into Go struct field ${field} of type ${want}`);
}

function decode(obj: Record<string, unknown>, key: string, type: 'bool', field?: string): boolean | undefined;
function decode(obj: Record<string, unknown>, key: string, type: 'int', field?: string): number | undefined;
function decode(obj: Record<string, unknown>, key: string, type: 'string', field?: string): string | undefined;
function decode(obj: Record<string, unknown>, key: string, type: '[]string', field?: string): string[] | undefined;
function decode(obj: Record<string, unknown>, key: string, type: 'object', field?: string): Record<string, unknown> | undefined;
function decode(obj: Record<string, unknown>, key: string, type: 'array', field?: string): unknown[] | undefined;
function decode(obj: Record<string, unknown>, key: string, type: GoType, field = `NetConf.${key}`): unknown {
  const v = obj[key];
  if (v === undefined || v === null) return undefined; // Go leaves the default for null
  switch (type) {
    case 'bool':
      if (typeof v !== 'boolean') throw typeError(field, v, 'bool');
      return v;
    case 'int':
      // Go's int is 64-bit; beyond 2^53 we cannot tell, and no bridge key needs it.
      if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw typeError(field, v, 'int');
      return v;
    case 'string':
      if (typeof v !== 'string') throw typeError(field, v, 'string');
      return v;
    case '[]string':
      if (!Array.isArray(v)) throw typeError(field, v, '[]string');
      for (const s of v) if (typeof s !== 'string') throw typeError(field, s, 'string');
      return v as string[];
    case 'object':
      if (typeof v !== 'object' || Array.isArray(v)) throw typeError(field, v, 'struct');
      return v;
    case 'array':
      if (!Array.isArray(v)) throw typeError(field, v, 'slice');
      return v as unknown[];
  }
}

/** The reference collectVlanTrunk (copied by upstream from ovs-cni): sorted unique VLAN IDs. */
export function collectVlanTrunk(raw: readonly unknown[] | undefined): number[] {
  if (raw === undefined) return [];
  const ids = new Set<number>();
  for (const item of raw) {
    if (item === null) continue; // a null *VlanTrunk: nothing configured
    if (typeof item !== 'object' || Array.isArray(item)) throw typeError('NetConf.vlanTrunk', item, 'main.VlanTrunk');
    const o = item as Record<string, unknown>;
    const minID = decode(o, 'minID', 'int', 'VlanTrunk.vlanTrunk.minID');
    const maxID = decode(o, 'maxID', 'int', 'VlanTrunk.vlanTrunk.maxID');
    const id = decode(o, 'id', 'int', 'VlanTrunk.vlanTrunk.id');
    if (minID !== undefined && maxID !== undefined) {
      if (minID <= 0 || minID > 4094) throw new BridgeConfigError('incorrect trunk minID parameter');
      if (maxID <= 0 || maxID > 4094) throw new BridgeConfigError('incorrect trunk maxID parameter');
      if (maxID < minID) throw new BridgeConfigError('minID is greater than maxID in trunk parameter');
      for (let v = minID; v <= maxID; v++) ids.add(v);
    } else if (minID === undefined && maxID !== undefined) {
      throw new BridgeConfigError('minID and maxID should be configured simultaneously, minID is missing');
    } else if (minID !== undefined && maxID === undefined) {
      throw new BridgeConfigError('minID and maxID should be configured simultaneously, maxID is missing');
    }
    if (id !== undefined) {
      if (id <= 0 || id > 4094) throw new BridgeConfigError('incorrect trunk id parameter');
      ids.add(id);
    }
  }
  return [...ids].sort((a, b) => a - b);
}

/** Go's UnmarshallableBool (CNI_ARGS IgnoreUnknown). */
function argsBool(key: string, v: string): boolean {
  if (v === '1' || v.toLowerCase() === 'true') return true;
  if (v === '0' || v.toLowerCase() === 'false') return false;
  throw new BridgeConfigError(`ARGS: error parsing value of pair "${key}=${v}": boolean unmarshal error: invalid input ${v}`);
}

/**
 * The MAC from CNI_ARGS, as the reference types.LoadArgs into MacEnvArgs: known keys are
 * IgnoreUnknown and MAC; any other key is an error unless IgnoreUnknown is true.
 */
function macFromCniArgs(args: ReadonlyMap<string, string>): string {
  let ignoreUnknown = false;
  const ig = args.get('IgnoreUnknown');
  if (ig !== undefined) ignoreUnknown = argsBool('IgnoreUnknown', ig);
  const unknown = [...args].filter(([k]) => k !== 'IgnoreUnknown' && k !== 'MAC').map(([k, v]) => `${k}=${v}`);
  if (unknown.length > 0 && !ignoreUnknown) {
    throw new BridgeConfigError(`ARGS: unknown args [${unknown.map((p) => JSON.stringify(p)).join(' ')}]`);
  }
  return args.get('MAC') ?? '';
}

function decodeDNS(conf: Record<string, unknown>): CniDNS | null {
  const raw = decode(conf, 'dns', 'object');
  if (raw === undefined) return null;
  const nameservers = decode(raw, 'nameservers', '[]string', 'DNS.dns.nameservers');
  const domain = decode(raw, 'domain', 'string', 'DNS.dns.domain');
  const search = decode(raw, 'search', '[]string', 'DNS.dns.search');
  const options = decode(raw, 'options', '[]string', 'DNS.dns.options');
  // The reference dnsConfSet: only a config with something in it replaces the IPAM DNS.
  if (nameservers === undefined && search === undefined && options === undefined && (domain ?? '') === '') return null;
  const dns: CniDNS = {};
  if (nameservers !== undefined) dns.nameservers = nameservers;
  if (domain !== undefined && domain !== '') dns.domain = domain;
  if (search !== undefined) dns.search = search;
  if (options !== undefined) dns.options = options;
  return dns;
}

/**
 * Decodes and validates the config as the reference loadNetConf does (the checks every verb runs).
 * ADD additionally runs validateForAdd.
 */
export function loadBridgeConf(config: NetConf, cniArgs: ReadonlyMap<string, string>): BridgeConf {
  const c = config as Record<string, unknown>;
  const bridge = decode(c, 'bridge', 'string') ?? DEFAULT_BRIDGE;
  const isDefaultGateway = decode(c, 'isDefaultGateway', 'bool') ?? false;
  const isGateway = (decode(c, 'isGateway', 'bool') ?? false) || isDefaultGateway;
  const forceAddress = decode(c, 'forceAddress', 'bool') ?? false;
  const ipMasq = decode(c, 'ipMasq', 'bool') ?? false;
  const backendRaw = decode(c, 'ipMasqBackend', 'string');
  const mtu = decode(c, 'mtu', 'int') ?? 0;
  const hairpinMode = decode(c, 'hairpinMode', 'bool') ?? false;
  const promiscMode = decode(c, 'promiscMode', 'bool') ?? false;
  const vlan = decode(c, 'vlan', 'int') ?? 0;
  const trunkRaw = decode(c, 'vlanTrunk', 'array');
  // Upstream defaults this to true "to maintain existing behavior" (VLAN 1 stays on the port).
  const preserveDefaultVlan = decode(c, 'preserveDefaultVlan', 'bool') ?? true;
  const macspoofchk = decode(c, 'macspoofchk', 'bool') ?? false;
  const enabledad = decode(c, 'enabledad', 'bool') ?? false;
  const disableContainerInterface = decode(c, 'disableContainerInterface', 'bool') ?? false;
  const portIsolation = decode(c, 'portIsolation', 'bool') ?? false;
  const ipam = decode(c, 'ipam', 'object');
  const ipamType = ipam === undefined ? '' : (decode(ipam, 'type', 'string', 'IPAM.ipam.type') ?? '');
  const args = decode(c, 'args', 'object');
  const argsCni = args === undefined ? undefined : decode(args, 'cni', 'object', 'NetConf.args.cni');
  const argsMac = argsCni === undefined ? undefined : decode(argsCni, 'mac', 'string', 'BridgeArgs.args.cni.mac');
  const rc = decode(c, 'runtimeConfig', 'object');
  const rcMac = rc === undefined ? undefined : decode(rc, 'mac', 'string', 'NetConf.runtimeConfig.mac');
  const dns = decodeDNS(c);

  if (vlan < 0 || vlan > 4094) throw new BridgeConfigError(`invalid VLAN ID ${vlan} (must be between 0 and 4094)`);
  const vlanTrunk = collectVlanTrunk(trunkRaw);

  // Last one wins: CNI_ARGS, then args.cni.mac, then runtimeConfig.mac.
  let mac = macFromCniArgs(cniArgs);
  if (argsMac) mac = argsMac;
  if (rcMac) mac = rcMac;

  return {
    name: typeof c.name === 'string' ? c.name : '',
    cniVersion: typeof c.cniVersion === 'string' ? c.cniVersion : '',
    bridge,
    isGateway,
    isDefaultGateway,
    forceAddress,
    ipMasq,
    ipMasqBackend: (backendRaw ?? null) as IpMasqBackend | null, // checked in validateForAdd, as the reference
    mtu,
    hairpinMode,
    promiscMode,
    vlan,
    vlanTrunk,
    preserveDefaultVlan,
    macspoofchk,
    enabledad,
    disableContainerInterface,
    portIsolation,
    mac,
    ipamType,
    dns,
  };
}

/**
 * The checks the reference makes during ADD (before it touches anything, or where a later failure
 * would only undo work): conflicting modes, IPAM with a disabled interface, a bad MAC, an unknown
 * masquerade backend, and names/values the kernel would refuse.
 */
export function validateForAdd(conf: BridgeConf): void {
  if (conf.hairpinMode && conf.promiscMode) {
    throw new BridgeConfigError('cannot set hairpin mode and promiscuous mode at the same time');
  }
  if (conf.disableContainerInterface && conf.ipamType !== '') {
    throw new BridgeConfigError('cannot use IPAM when DisableContainerInterface flag is set');
  }
  const bridgeProblem = ifNameProblem(conf.bridge);
  if (bridgeProblem !== null) {
    throw new BridgeConfigError(`failed to create bridge ${JSON.stringify(conf.bridge)}: invalid interface name`, `bridge ${JSON.stringify(conf.bridge)}: ${bridgeProblem}`);
  }
  if (conf.mtu < 0 || conf.mtu > 65535) {
    throw new BridgeConfigError(`invalid MTU ${conf.mtu} (must be between 0 and 65535)`);
  }
  const vlanGw = `${conf.bridge}.${conf.vlan}`;
  const vlanGwProblem = conf.vlan !== 0 && conf.isGateway ? ifNameProblem(vlanGw) : null;
  if (vlanGwProblem !== null) {
    throw new BridgeConfigError(`failed to create vlan interface: name ${JSON.stringify(vlanGw)} is not a valid interface name`, vlanGwProblem);
  }
  containerMac(conf);
  if (conf.ipMasqBackend !== null && conf.ipMasqBackend !== 'iptables' && conf.ipMasqBackend !== 'nftables') {
    throw new BridgeConfigError(`unknown ipmasq backend ${JSON.stringify(conf.ipMasqBackend)}`);
  }
}

/**
 * CHECK reads the bridge by name: the `bridge` key must be an interface name (ADD's
 * validateForAdd says so in the reference's words).
 */
export function validateForCheck(conf: Pick<BridgeConf, 'bridge'>): void {
  const problem = ifNameProblem(conf.bridge);
  if (problem !== null) throw new BridgeConfigError(`invalid bridge name ${JSON.stringify(conf.bridge)}: ${problem}`);
}

/** The container veth MAC in lower-case colon form, or null for a kernel-chosen one. */
export function containerMac(conf: BridgeConf): string | null {
  if (conf.mac === '') return null;
  try {
    return parseMac(conf.mac);
  } catch (e) {
    if (e instanceof InvalidMacError) throw new BridgeConfigError(`address ${conf.mac}: invalid MAC address`);
    throw e;
  }
}
