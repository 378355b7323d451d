// The sriov plugin's network config: sriov-cni's keys (k8snetworkplumbingwg/sriov-cni
// pkg/types, pkg/config LoadConf) with its validation rules and messages, plus weft's keys
// (`ovs` for the hardware-offload mode, `sysfsRoot` and `dataDir`). Pure: no I/O.
//
// Errors are code 7 (invalid network config) with sriov-cni's message text; sriov-cni itself
// reports every failure as a plain error (999).
import { isAbsolute } from 'node:path';
import { InvalidMacError, parseMac } from '../../src/util/mac.js';
import type { VfLinkState, VlanProto } from '../../src/netlink/vf.js';
import { ifNameProblem, isPciAddress as isLowerPciAddress } from '../../src/util/names.js';
import { podIdentity } from '../lib/podargs.js';
import { CniError, ErrorCode, type NetConf } from '../skel/types.js';

export const DEFAULT_SYSFS_ROOT = '/sys';
/** sriov-cni's DefaultCNIDir: the state cache, PCI allocations and locks live under it. */
export const DEFAULT_DATA_DIR = '/var/lib/cni/sriov';
/** Environment overrides (below the config keys, above the defaults). */
export const SYSFS_ENV = 'WEFT_SRIOV_SYSFS';
export const DATA_DIR_ENV = 'WEFT_SRIOV_DATA_DIR';

/** The prefix sriov-cni puts before every LoadConf error. */
const LOAD = 'SRIOV-CNI failed to load netconf: LoadConf():';

export type OnOff = 'on' | 'off';

/** Offload-mode defaults: the ovs backend's bridge and Open vSwitch's own run directory. */
export const DEFAULT_OFFLOAD_BRIDGE = 'br-int';
export const DEFAULT_OFFLOAD_OVS_RUNDIR = '/var/run/openvswitch';

export type OffloadDatapathType = 'system' | 'netdev';

/**
 * The `ovs` key. ovsRunDir and datapathType are present only when configured (consumers apply
 * the defaults above), so a config that names only the bridge reads back as `{bridge}`.
 */
export interface OvsOffloadConf {
  /** The OVS bridge the VF representor joins (default "br-int"). */
  readonly bridge: string;
  /** Where Open vSwitch keeps db.sock and <bridge>.mgmt (default /var/run/openvswitch). */
  readonly ovsRunDir?: string;
  /** netdev (userspace datapath): `arp off` on the representor, TX checksum offload off on the VF (default system). */
  readonly datapathType?: OffloadDatapathType;
}

export interface SriovConf {
  readonly name: string;
  readonly cniVersion: string;
  /** VF PCI address, lower case, e.g. "0000:af:06.0". */
  readonly deviceID: string;
  /** null: not configured (ADD still sets VLAN 0, as sriov-cni). */
  readonly vlan: number | null;
  readonly vlanQoS: number;
  readonly vlanProto: VlanProto;
  /** Lower-case colon MAC for the VF (config < CNI_ARGS MAC < runtimeConfig.mac), or null. */
  readonly mac: string | null;
  readonly spoofchk: OnOff | null;
  readonly trust: OnOff | null;
  readonly linkState: VfLinkState | null;
  /** Mbps; null = not configured. */
  readonly minTxRate: number | null;
  readonly maxTxRate: number | null;
  /** IPAM plugin type; '' = none. */
  readonly ipamType: string;
  /** Set: the OVS hardware-offload mode. */
  readonly ovs: OvsOffloadConf | null;
  readonly sysfsRoot: string;
  readonly dataDir: string;
}

/** A config sriov-cni (or weft) refuses: code 7. */
export class SriovConfigError extends CniError {
  constructor(msg: string, details = '') {
    super(ErrorCode.InvalidNetworkConfig, msg, details);
    this.name = 'SriovConfigError';
  }
}

type Obj = Record<string, unknown>;

function kind(v: unknown): string {
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return `number ${String(v)}`;
  return typeof v;
}

function typeError(key: string, v: unknown, want: string): SriovConfigError {
  return new SriovConfigError(`${LOAD} failed to load netconf: json: cannot unmarshal ${kind(v)} into Go struct field NetConf.${key} of type ${want}`);
}

function str(o: Obj, key: string, label = key): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw typeError(label, v, 'string');
  return v;
}

function int(o: Obj, key: string): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw typeError(key, v, 'int');
  return v;
}

function obj(o: Obj, key: string, label = key): Obj | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) throw typeError(label, v, 'struct');
  return v as Obj;
}

/** A PCI address as sysfs names devices (domain:bus:device.function), in either case; also keeps paths safe. */
export function isPciAddress(s: string): boolean {
  return isLowerPciAddress(s.toLowerCase());
}

/** Go's UnmarshallableBool for CNI_ARGS IgnoreUnknown. */
function argsBool(key: string, v: string): boolean {
  if (v === '1' || v.toLowerCase() === 'true') return true;
  if (v === '0' || v.toLowerCase() === 'false') return false;
  throw new SriovConfigError(`SRIOV-CNI failed to parse args: ARGS: error parsing value of pair "${key}=${v}": boolean unmarshal error: invalid input ${v}`);
}

/** CNI_ARGS as sriov-cni's envArgs (CommonArgs + MAC): other keys are errors unless IgnoreUnknown. */
function macFromCniArgs(args: ReadonlyMap<string, string>): string {
  const ig = args.get('IgnoreUnknown');
  const ignoreUnknown = ig !== undefined && argsBool('IgnoreUnknown', ig);
  const unknown = [...args].filter(([k]) => k !== 'IgnoreUnknown' && k !== 'MAC').map(([k, v]) => `${k}=${v}`);
  if (unknown.length > 0 && !ignoreUnknown) {
    throw new SriovConfigError(`SRIOV-CNI failed to parse args: ARGS: unknown args [${unknown.map((p) => JSON.stringify(p)).join(' ')}]`);
  }
  return args.get('MAC') ?? '';
}

function onOff(o: Obj, key: string): OnOff | null {
  const v = str(o, key);
  if (v === undefined || v === '') return null;
  // sriov-cni treats anything but "on" as off; a typo ("true") silently disabling a security
  // setting is worse than an error.
  if (v !== 'on' && v !== 'off') throw new SriovConfigError(`${LOAD} invalid ${key} value: ${v} (must be "on" or "off")`);
  return v;
}

function absPath(key: string, v: string): string {
  if (!isAbsolute(v)) throw new SriovConfigError(`invalid ${key} ${JSON.stringify(v)}: must be an absolute path`);
  return v.length > 1 ? v.replace(/\/+$/, '') : v;
}

function loadOvs(c: Obj): OvsOffloadConf | null {
  const o = obj(c, 'ovs');
  if (o === undefined) return null;
  const bridge = str(o, 'bridge', 'ovs.bridge') ?? DEFAULT_OFFLOAD_BRIDGE;
  const bridgeProblem = ifNameProblem(bridge);
  if (bridgeProblem !== null) {
    throw new SriovConfigError(`invalid "ovs" config: "bridge" must be an interface name, got ${JSON.stringify(o.bridge ?? null)}`, `ovs.bridge ${JSON.stringify(bridge)}: ${bridgeProblem}`);
  }
  const out: { bridge: string; ovsRunDir?: string; datapathType?: OffloadDatapathType } = { bridge };
  const runDir = str(o, 'ovsRunDir', 'ovs.ovsRunDir');
  if (runDir !== undefined && runDir !== '') {
    if (!isAbsolute(runDir) || runDir.includes('\0')) {
      throw new SriovConfigError(`invalid "ovs" config: "ovsRunDir" must be an absolute path, got ${JSON.stringify(runDir)}`);
    }
    out.ovsRunDir = runDir.length > 1 ? runDir.replace(/\/+$/, '') : runDir;
  }
  const dp = str(o, 'datapathType', 'ovs.datapathType');
  if (dp !== undefined && dp !== '') {
    if (dp !== 'system' && dp !== 'netdev') {
      throw new SriovConfigError(`invalid "ovs" config: "datapathType" must be "system" or "netdev", got ${JSON.stringify(dp)}`);
    }
    out.datapathType = dp;
  }
  return out;
}

/** The VF PCI address: runtimeConfig.deviceID (the CNI `deviceID` capability) wins over the key. */
function deviceIdOf(c: Obj): string {
  const rc = obj(c, 'runtimeConfig');
  const fromRc = rc === undefined ? undefined : str(rc, 'deviceID', 'runtimeConfig.deviceID');
  const id = fromRc || str(c, 'deviceID') || '';
  if (id === '') throw new SriovConfigError(`${LOAD} VF pci addr is required`);
  if (!isPciAddress(id)) throw new SriovConfigError(`${LOAD} invalid PCI address ${JSON.stringify(id)}: expected domain:bus:device.function, e.g. 0000:af:06.0`);
  return id.toLowerCase();
}

/**
 * Decodes and validates the config as sriov-cni's LoadConf (plus weft's keys). `env` supplies
 * WEFT_SRIOV_SYSFS / WEFT_SRIOV_DATA_DIR when the config has no sysfsRoot / dataDir.
 */
export function loadSriovConf(config: NetConf, cniArgs: ReadonlyMap<string, string>, env: Readonly<Record<string, string | undefined>> = {}): SriovConf {
  const c = config as Obj;
  const deviceID = deviceIdOf(c);
  const vlan = int(c, 'vlan') ?? null;
  const qosRaw = int(c, 'vlanQoS');
  const protoRaw = str(c, 'vlanProto');
  let vlanQoS = 0;
  let vlanProto: VlanProto = '802.1q';
  if (vlan === null) {
    if (qosRaw !== undefined) throw new SriovConfigError(`${LOAD} vlan id must be configured to set vlan QoS to a non-nil value`);
    if (protoRaw !== undefined) throw new SriovConfigError(`${LOAD} vlan id must be configured to set vlan proto to a non-nil value`);
  } else {
    if (vlan < 0 || vlan > 4094) throw new SriovConfigError(`${LOAD} vlan id ${vlan} invalid: value must be in the range 0-4094`);
    vlanQoS = qosRaw ?? 0;
    if (vlanQoS < 0 || vlanQoS > 7) throw new SriovConfigError(`${LOAD} vlan QoS PCP ${vlanQoS} invalid: value must be in the range 0-7`);
    if (vlanQoS !== 0 && vlan === 0) throw new SriovConfigError(`${LOAD} non-zero vlan id must be configured to set vlan QoS to a non-zero value`);
    const proto = (protoRaw ?? '802.1q').toLowerCase();
    if (proto !== '802.1q' && proto !== '802.1ad') {
      throw new SriovConfigError(`${LOAD} vlan Proto ${proto} invalid: value must be '802.1Q' or '802.1ad'`);
    }
    if (proto === '802.1ad' && vlan === 0) throw new SriovConfigError(`${LOAD} non-zero vlan id must be configured to set vlan proto 802.1ad`);
    vlanProto = proto;
  }
  const ls = str(c, 'link_state') ?? '';
  if (ls !== '' && ls !== 'auto' && ls !== 'enable' && ls !== 'disable') throw new SriovConfigError(`${LOAD} invalid link_state value: ${ls}`);
  const minTxRate = int(c, 'min_tx_rate') ?? null;
  const maxTxRate = int(c, 'max_tx_rate') ?? null;
  for (const [k, v] of [['min_tx_rate', minTxRate], ['max_tx_rate', maxTxRate]] as const) {
    if (v !== null && (v < 0 || v > 0xffffffff)) throw new SriovConfigError(`${LOAD} invalid ${k} ${v}: must be between 0 and 4294967295 Mbps`);
  }
  const spoofchk = onOff(c, 'spoofchk');
  const trust = onOff(c, 'trust');

  // Last one wins: the config's mac, then CNI_ARGS MAC, then runtimeConfig.mac (sriov-cni's order).
  let macText = str(c, 'mac') ?? '';
  const argsMac = macFromCniArgs(cniArgs);
  if (argsMac !== '') macText = argsMac;
  const rc = obj(c, 'runtimeConfig');
  const rcMac = rc === undefined ? undefined : str(rc, 'mac', 'runtimeConfig.mac');
  if (rcMac) macText = rcMac;
  let mac: string | null = null;
  if (macText !== '') {
    try {
      mac = parseMac(macText);
    } catch (e) {
      if (e instanceof InvalidMacError) throw new SriovConfigError(`failed to parse MAC address ${macText}: address ${macText}: invalid MAC address`);
      throw e;
    }
  }

  const ipam = obj(c, 'ipam');
  const ipamType = ipam === undefined ? '' : (str(ipam, 'type', 'ipam.type') ?? '');
  const ovs = loadOvs(c);
  // Offload mode names the representor after the pod and records the pod on the OVS port.
  if (ovs !== null) podIdentity(cniArgs);
  const sysfsRoot = absPath('sysfsRoot', str(c, 'sysfsRoot') || env[SYSFS_ENV] || DEFAULT_SYSFS_ROOT);
  const dataDir = absPath('dataDir', str(c, 'dataDir') || env[DATA_DIR_ENV] || DEFAULT_DATA_DIR);
  return {
    name: typeof c.name === 'string' ? c.name : '',
    cniVersion: typeof c.cniVersion === 'string' ? c.cniVersion : '',
    deviceID,
    vlan,
    vlanQoS,
    vlanProto,
    mac,
    spoofchk,
    trust,
    linkState: ls === '' ? null : ls,
    minTxRate,
    maxTxRate,
    ipamType,
    ovs,
    sysfsRoot,
    dataDir,
  };
}
