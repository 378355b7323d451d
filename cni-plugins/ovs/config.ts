// The weft-ovs plugin's network config: which Open vSwitch bridge (and which OVS run directory)
// the pod joins, the datapath type (netdev needs extra steps on the veth), the pod MTU, whether the
// pod gets a default route, and the IPAM plugin (required: the pod flows need the pod's address).
// Decoded with the bridge plugin's rules (a wrong JSON type is an error, null keeps the default,
// unknown keys are ignored, so a flannel delegate's hairpinMode or ipMasq does no harm). Pure.
import { isAbsolute } from 'node:path';
import { ifNameProblem } from '../../src/util/names.js';
import { CniError, ErrorCode, type CniDNS, type NetConf } from '../skel/types.js';

/** The CNI `type` (and bundle name); `ovs` belongs to k8snetworkplumbingwg/ovs-cni. */
export const OVS_PLUGIN_TYPE = 'weft-ovs';
export const DEFAULT_OVS_BRIDGE = 'br-int';
/** Where Open vSwitch keeps db.sock and <bridge>.mgmt (src/ovs/cli.ts uses the same default). */
export const DEFAULT_OVS_RUNDIR = '/var/run/openvswitch';

export type DatapathType = 'system' | 'netdev';

export interface OvsConf {
  readonly name: string;
  readonly cniVersion: string;
  readonly bridge: string;
  readonly ovsRunDir: string;
  /** netdev (userspace datapath): `arp off` on the host veth and TX checksum offload off in the pod. */
  readonly datapathType: DatapathType;
  /** 0: kernel default. */
  readonly mtu: number;
  /** Add a default route via the gateway (unless IPAM returned one with a gateway). */
  readonly isDefaultGateway: boolean;
  readonly ipamType: string;
  /** The config's own `dns`, when set: it replaces what IPAM returned. */
  readonly dns: CniDNS | null;
}

/** A config weft-ovs refuses: code 7, naming the key. */
export class OvsPluginConfigError extends CniError {
  constructor(
    readonly key: string,
    msg: string,
    details = '',
  ) {
    super(ErrorCode.InvalidNetworkConfig, msg, details);
    this.name = 'OvsPluginConfigError';
  }
}

type Obj = Record<string, unknown>;

function kind(v: unknown): string {
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'object') return 'an object';
  return `${typeof v} ${JSON.stringify(v)}`;
}

function wrongType(key: string, v: unknown, want: string): OvsPluginConfigError {
  return new OvsPluginConfigError(key, `${OVS_PLUGIN_TYPE}: '${key}' must be ${want}, got ${kind(v)}`);
}

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(o: Obj, key: string, path = key): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw wrongType(path, v, 'a string');
  return v;
}

function bool(o: Obj, key: string): boolean | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw wrongType(key, v, 'a boolean');
  return v;
}

function int(o: Obj, key: string): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw wrongType(key, v, 'an integer');
  return v;
}

function strList(o: Obj, key: string, path: string): string[] | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.some((s) => typeof s !== 'string')) throw wrongType(path, v, 'a list of strings');
  return v as string[];
}

function decodeDNS(c: Obj): CniDNS | null {
  const raw = c.dns;
  if (raw === undefined || raw === null) return null;
  if (!isObj(raw)) throw wrongType('dns', raw, 'an object');
  const nameservers = strList(raw, 'nameservers', 'dns.nameservers');
  const domain = str(raw, 'domain', 'dns.domain');
  const search = strList(raw, 'search', 'dns.search');
  const options = strList(raw, 'options', 'dns.options');
  // As the bridge plugin: only a config with something in it replaces the IPAM DNS.
  if (nameservers === undefined && search === undefined && options === undefined && (domain ?? '') === '') return null;
  const dns: CniDNS = {};
  if (nameservers !== undefined) dns.nameservers = nameservers;
  if (domain !== undefined && domain !== '') dns.domain = domain;
  if (search !== undefined) dns.search = search;
  if (options !== undefined) dns.options = options;
  return dns;
}

/** Decodes and validates the config (every verb: DEL needs the same bridge, run dir and IPAM). */
export function loadOvsConf(config: NetConf): OvsConf {
  const c = config as Obj;
  const bridge = str(c, 'bridge') ?? DEFAULT_OVS_BRIDGE;
  const bridgeProblem = ifNameProblem(bridge);
  if (bridgeProblem !== null) {
    throw new OvsPluginConfigError(
      'bridge',
      `${OVS_PLUGIN_TYPE}: 'bridge' must be an interface name of 1 to 15 characters without spaces, '/' or ':', got ${JSON.stringify(bridge)}`,
      `bridge ${JSON.stringify(bridge)}: ${bridgeProblem}`,
    );
  }
  const ovsRunDir = str(c, 'ovsRunDir') || DEFAULT_OVS_RUNDIR;
  if (!isAbsolute(ovsRunDir) || ovsRunDir.includes('\0')) {
    throw new OvsPluginConfigError('ovsRunDir', `${OVS_PLUGIN_TYPE}: 'ovsRunDir' must be an absolute path, got ${JSON.stringify(ovsRunDir)}`);
  }
  const datapath = str(c, 'datapathType') || 'system';
  if (datapath !== 'system' && datapath !== 'netdev') {
    throw new OvsPluginConfigError('datapathType', `${OVS_PLUGIN_TYPE}: 'datapathType' must be "system" or "netdev", got ${JSON.stringify(datapath)}`);
  }
  const mtu = int(c, 'mtu') ?? 0;
  // 68: the IPv4 minimum (RFC 791); 0 leaves the kernel's default.
  if (mtu !== 0 && (mtu < 68 || mtu > 65535)) {
    throw new OvsPluginConfigError('mtu', `${OVS_PLUGIN_TYPE}: 'mtu' must be 0 (kernel default) or between 68 and 65535, got ${mtu}`);
  }
  const isDefaultGateway = bool(c, 'isDefaultGateway') ?? false;
  const ipam = c.ipam;
  if (ipam === undefined || ipam === null) {
    throw new OvsPluginConfigError('ipam', `${OVS_PLUGIN_TYPE}: an 'ipam' section is required (the pod's flows need its address)`);
  }
  if (!isObj(ipam)) throw wrongType('ipam', ipam, 'an object');
  const ipamType = str(ipam, 'type', 'ipam.type') ?? '';
  if (ipamType === '') throw new OvsPluginConfigError('ipam.type', `${OVS_PLUGIN_TYPE}: 'ipam.type' must name the IPAM plugin (e.g. "host-local")`);
  return {
    name: typeof c.name === 'string' ? c.name : '',
    cniVersion: typeof c.cniVersion === 'string' ? c.cniVersion : '',
    bridge,
    ovsRunDir,
    datapathType: datapath,
    mtu,
    isDefaultGateway,
    ipamType,
    dns: decodeDNS(c),
  };
}
