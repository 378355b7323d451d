// What ADD leaves for DEL, at sriov-cni's paths and with its field names, so either plugin can
// clean up after the other:
//
//   <dataDir>/<containerID>-<ifname>        the NetConf with OrigVfState, DPDKMode, Master, VFID, …
//   <dataDir>/pci/<vf PCI address>           the netns path the VF is allocated to
//   <dataDir>/pci/vf_lock/<vf>.lock          flock'ed while a VF is configured or released
//
// weft adds a `weft` object (VLAN protocols, which VF settings the PF reported, the pod netns,
// the offload step's own state); sriov-cni ignores it, and weft reads sriov-cni's files without it.
//
// GC (sweepStateDir) looks only at regular files directly in <dataDir> whose name and content are
// a state file's (or a temp file of writeFileAtomic's); pci/ and anything else there is not ours.
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { VfConfig, VfLinkState, VlanProto } from '../../src/netlink/vf.js';
import { errnoCode, errorMessage } from '../../src/util/errors.js';
import { NetnsHandle } from '../lib/netns.js';
import { readSmallRegularFile, regularFileNames, removeIfSameFile } from '../lib/owned-files.js';
import { internalError } from '../lib/rollback.js';
import { CNI_NAME_RE, validateInterfaceName } from '../skel/env.js';
import { withFileLock } from '../skel/lock.js';
import { randomBytesSync } from '../skel/random.js';
import type { CniRequest, NetConf } from '../skel/types.js';
import { DATA_DIR_ENV, DEFAULT_DATA_DIR, type OnOff, type SriovConf } from './config.js';

export const STATE_VERSION = 1;

/** The VF as ADD found it, to be restored by DEL. */
export interface OriginalVf {
  /** Host netdev name ('' in DPDK mode). */
  readonly hostIfName: string;
  /** The netdev's own MAC before ADD ('' in DPDK mode). */
  readonly effectiveMac: string;
  /** The netdev's MTU before ADD (0 in DPDK mode). */
  readonly mtu: number;
  /** What the PF reported for the VF. */
  readonly pf: VfConfig;
}

/** The VF settings the config asked for (what DEL resets). */
export type AppliedSettings = Pick<SriovConf, 'vlan' | 'vlanQoS' | 'vlanProto' | 'mac' | 'spoofchk' | 'trust' | 'linkState' | 'minTxRate' | 'maxTxRate'>;

export interface SriovState {
  readonly deviceID: string;
  readonly pf: string;
  readonly vfIndex: number;
  readonly dpdk: boolean;
  /** CNI_IFNAME the VF got in the pod. */
  readonly podIfName: string;
  /** The pod netns path (null in files written by sriov-cni). */
  readonly netns: string | null;
  readonly applied: AppliedSettings;
  readonly orig: OriginalVf;
  /** The offload step's own state (null in plain and DPDK mode). */
  readonly offload: Record<string, unknown> | null;
}

/** A state file that is not JSON or lacks what DEL needs. */
export class StateFileError extends Error {
  constructor(
    readonly path: string,
    reason: string,
  ) {
    super(`invalid sriov state file ${path}: ${reason}`);
    this.name = 'StateFileError';
  }
}

export function stateFile(dataDir: string, containerId: string, ifname: string): string {
  return join(dataDir, `${containerId}-${ifname}`);
}

export function pciAllocFile(dataDir: string, pci: string): string {
  return join(dataDir, 'pci', pci);
}

export function pciLockFile(dataDir: string, pci: string): string {
  return join(dataDir, 'pci', 'vf_lock', `${pci}.lock`);
}

/** sriov-cni waits up to 60 s for another ADD/DEL of the same VF. */
const LOCK_TIMEOUT_S = 60;

/** Runs `fn` holding the VF's lock file (sriov-cni's path; created with its directories). */
export async function lockVf<T>(dataDir: string, pci: string, fn: () => Promise<T>): Promise<T> {
  const file = pciLockFile(dataDir, pci);
  try {
    mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  } catch (e) {
    throw internalError(`failed to create the sriov data directory(${JSON.stringify(dirname(file))}): ${errorMessage(e)}`);
  }
  return withFileLock(file, fn, { timeoutSeconds: LOCK_TIMEOUT_S, mode: 0o600 });
}

const LINK_STATE_NUMBER: Record<VfLinkState, number> = { auto: 0, enable: 1, disable: 2 };
const LINK_STATES: readonly VfLinkState[] = ['auto', 'enable', 'disable'];

export function appliedFrom(conf: SriovConf): AppliedSettings {
  return {
    vlan: conf.vlan,
    vlanQoS: conf.vlanQoS,
    vlanProto: conf.vlanProto,
    mac: conf.mac,
    spoofchk: conf.spoofchk,
    trust: conf.trust,
    linkState: conf.linkState,
    minTxRate: conf.minTxRate,
    maxTxRate: conf.maxTxRate,
  };
}

/**
 * The state as JSON: the request config (without prevResult and the lower-case `mac`, which
 * sriov-cni keeps as `MAC`) plus sriov-cni's fields and weft's.
 */
export function encodeState(s: SriovState, config: NetConf): string {
  const base: Record<string, unknown> = { ...config };
  delete base.prevResult;
  delete base.mac;
  const a = s.applied;
  const out: Record<string, unknown> = {
    ...base,
    deviceID: s.deviceID,
    vlan: a.vlan,
    vlanQoS: a.vlan === null ? null : a.vlanQoS,
    vlanProto: a.vlan === null ? null : a.vlanProto,
    min_tx_rate: a.minTxRate,
    max_tx_rate: a.maxTxRate,
    ...(a.spoofchk ? { spoofchk: a.spoofchk } : {}),
    ...(a.trust ? { trust: a.trust } : {}),
    ...(a.linkState ? { link_state: a.linkState } : {}),
    OrigVfState: {
      HostIFName: s.orig.hostIfName,
      SpoofChk: s.orig.pf.spoofchk ?? false,
      Trust: s.orig.pf.trust ?? false,
      AdminMAC: s.orig.pf.mac,
      EffectiveMAC: s.orig.effectiveMac,
      Vlan: s.orig.pf.vlan,
      VlanQoS: s.orig.pf.qos,
      MinTxRate: s.orig.pf.minTxRate,
      MaxTxRate: s.orig.pf.maxTxRate,
      LinkState: s.orig.pf.linkState === null ? 0 : LINK_STATE_NUMBER[s.orig.pf.linkState],
      MTU: s.orig.mtu,
    },
    DPDKMode: s.dpdk,
    Master: s.pf,
    MAC: a.mac ?? '',
    VFID: s.vfIndex,
    ContIFNames: s.podIfName,
    weft: {
      version: STATE_VERSION,
      netns: s.netns,
      vlanProto: a.vlanProto,
      origVlanProto: s.orig.pf.vlanProto,
      origSpoofchkKnown: s.orig.pf.spoofchk !== null,
      origTrustKnown: s.orig.pf.trust !== null,
      origLinkStateKnown: s.orig.pf.linkState !== null,
      offload: s.offload,
    },
  };
  return JSON.stringify(out);
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Reads a state file written by weft or by sriov-cni. */
export function decodeState(path: string, text: string): SriovState {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new StateFileError(path, errorMessage(e));
  }
  if (!isObj(raw)) throw new StateFileError(path, 'not a JSON object');
  const o = isObj(raw.OrigVfState) ? raw.OrigVfState : null;
  if (o === null) throw new StateFileError(path, 'no OrigVfState');
  const w = isObj(raw.weft) ? raw.weft : {};
  const s = (v: unknown): string => (typeof v === 'string' ? v : '');
  const n = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
  const nOrNull = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  const onOff = (v: unknown): OnOff | null => (v === 'on' || v === 'off' ? v : null);
  const proto = (v: unknown): VlanProto => (typeof v === 'string' && v.toLowerCase() === '802.1ad' ? '802.1ad' : '802.1q');
  const deviceID = s(raw.deviceID);
  const pf = s(raw.Master);
  if (deviceID === '' || pf === '' || typeof raw.VFID !== 'number') throw new StateFileError(path, 'deviceID, Master or VFID missing');
  const ls = s(raw.link_state);
  const linkState = ls === 'auto' || ls === 'enable' || ls === 'disable' ? ls : null;
  const mac = s(raw.MAC) || null;
  const known = (key: string): boolean => w[key] !== false;
  return {
    deviceID,
    pf,
    vfIndex: raw.VFID,
    dpdk: raw.DPDKMode === true,
    podIfName: s(raw.ContIFNames),
    netns: typeof w.netns === 'string' ? w.netns : null,
    applied: {
      vlan: nOrNull(raw.vlan),
      vlanQoS: n(raw.vlanQoS),
      vlanProto: proto(w.vlanProto ?? raw.vlanProto),
      mac,
      spoofchk: onOff(raw.spoofchk),
      trust: onOff(raw.trust),
      linkState,
      minTxRate: nOrNull(raw.min_tx_rate),
      maxTxRate: nOrNull(raw.max_tx_rate),
    },
    orig: {
      hostIfName: s(o.HostIFName),
      effectiveMac: s(o.EffectiveMAC),
      mtu: n(o.MTU),
      pf: {
        vf: raw.VFID,
        mac: s(o.AdminMAC) || '00:00:00:00:00:00',
        vlan: n(o.Vlan),
        qos: n(o.VlanQoS),
        vlanProto: proto(w.origVlanProto),
        spoofchk: known('origSpoofchkKnown') ? o.SpoofChk === true : null,
        trust: known('origTrustKnown') ? o.Trust === true : null,
        linkState: known('origLinkStateKnown') ? (LINK_STATES[n(o.LinkState)] ?? 'auto') : null,
        minTxRate: n(o.MinTxRate),
        maxTxRate: n(o.MaxTxRate),
      },
    },
    offload: isObj(w.offload) ? w.offload : null,
  };
}

/** Writes `text` to `path` through a temp file and rename (never half-written), mode 0600. */
export function writeFileAtomic(path: string, text: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.tmp-${randomBytesSync(4).toString('hex')}`;
  writeFileSync(tmp, text, { mode: 0o600 });
  renameSync(tmp, path);
}

/** The state file's content; null when there is none. */
export function readStateText(path: string): string | null {
  try {
    return readFileSync(path, 'utf8');
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return null;
    throw e;
  }
}

export function removeFile(path: string): void {
  rmSync(path, { force: true });
}

/** The netns path recorded for a VF, or null. */
export function readAllocation(dataDir: string, pci: string): string | null {
  try {
    return readFileSync(pciAllocFile(dataDir, pci), 'utf8');
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return null;
    throw e;
  }
}

/** Whether `path` still opens as a network namespace (sriov-cni's liveness test). */
export function netnsAlive(path: string): boolean {
  if (path === '') return false;
  try {
    NetnsHandle.open(path).close();
    return true;
  } catch {
    return false;
  }
}

/**
 * sriov-cni's IsAllocated: the netns path the VF is allocated to while that netns lives; a stale
 * allocation (netns gone) is removed and null returned.
 */
export function liveAllocation(dataDir: string, pci: string): string | null {
  const ns = readAllocation(dataDir, pci);
  if (ns === null) return null;
  if (netnsAlive(ns)) return ns;
  removeFile(pciAllocFile(dataDir, pci));
  return null;
}

export function saveAllocation(dataDir: string, pci: string, netns: string): void {
  writeFileAtomic(pciAllocFile(dataDir, pci), netns);
}

/** The state directory as DEL finds it: the config's absolute `dataDir`, else the env's, else the default. */
export function stateDirOf(config: NetConf, env: CniRequest['env']): string {
  const fromConfig = config.dataDir;
  if (typeof fromConfig === 'string' && fromConfig.startsWith('/')) return fromConfig;
  const fromEnv = env[DATA_DIR_ENV];
  return fromEnv?.startsWith('/') ? fromEnv : DEFAULT_DATA_DIR;
}

/** More than any state file holds (the request config plus sriov-cni's and weft's fields). */
const MAX_STATE_BYTES = 1024 * 1024;
/** A state file's name: CNI_CONTAINERID's grammar, "-", an interface name. */
const STATE_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*-[^\s/:]{1,15}$/;
/** writeFileAtomic's temp file of a state file. */
const TEMP_NAME = /^(.+)\.tmp-[0-9a-f]{8}$/;

/** The attachment a stale state file belongs to. */
export interface StaleAttachment {
  readonly containerId: string;
  readonly ifname: string;
  readonly state: SriovState;
}

/** A further check of a decoded state (what DEL would refuse as foreign); throws to reject. */
export type StateCheck = (name: string, state: SriovState) => unknown;

/**
 * The attachment whose state file `name` with content `text` is: the text must decode as a state
 * (decodeState) that `check` accepts and that names the pod interface (ContIFNames), and the name
 * must be `<containerID>-<that interface>`. null for anything else.
 */
export function stateOwner(name: string, text: string, check: StateCheck = () => true): StaleAttachment | null {
  let state: SriovState;
  try {
    state = decodeState(name, text);
    check(name, state);
  } catch {
    return null;
  }
  const ifname = state.podIfName;
  if (ifname === '' || !name.endsWith(`-${ifname}`)) return null;
  const containerId = name.slice(0, -ifname.length - 1);
  try {
    validateInterfaceName(ifname);
  } catch {
    return null;
  }
  return CNI_NAME_RE.test(containerId) ? { containerId, ifname, state } : null;
}

export interface StateSweep {
  /** State files of attachments not in the valid set, to be released (as DEL does) and removed. */
  readonly stale: readonly StaleAttachment[];
  /** Stale state whose recorded pod netns still exists: left for a DEL that can reach the VF. */
  readonly podAlive: readonly string[];
  /** Temp files of interrupted writes for attachments not in the valid set, removed here. */
  readonly removedTemps: readonly string[];
  /** Files named like state (or its temp files) that do not hold it: left alone. */
  readonly leftAlone: readonly string[];
}

/**
 * GC's look at <dataDir>: regular files directly in it (never through a symlink, never a
 * directory, fifo or device; pci/ is not entered), named `<containerID>-<ifname>` (or that plus
 * `.tmp-<hex>`) for an attachment not in `validNames` ("<containerID>-<ifname>" of the valid
 * attachments), holding a state that `check` accepts (a temp file may also be empty). Removes
 * the stale temp files; returns the stale state files for the caller to release.
 */
export function sweepStateDir(dataDir: string, validNames: ReadonlySet<string>, check?: StateCheck): StateSweep {
  const stale: StaleAttachment[] = [];
  const podAlive: string[] = [];
  const removedTemps: string[] = [];
  const leftAlone: string[] = [];
  for (const name of regularFileNames(dataDir)) {
    if (validNames.has(name)) continue;
    const base = TEMP_NAME.exec(name)?.[1];
    const temp = base !== undefined && STATE_NAME.test(base) ? base : null;
    if (temp === null ? !STATE_NAME.test(name) : validNames.has(temp)) continue;
    const f = readSmallRegularFile(dataDir, name, MAX_STATE_BYTES);
    const owner = f === null ? null : stateOwner(name, f.text, check);
    if (owner !== null) {
      if (owner.state.netns !== null && netnsAlive(owner.state.netns)) podAlive.push(name);
      else stale.push(owner);
    } else if (f !== null && temp !== null && (f.text === '' || stateOwner(temp, f.text, check) !== null) && removeIfSameFile(dataDir, f) !== 'replaced') {
      removedTemps.push(name);
    } else {
      leftAlone.push(name);
    }
  }
  return { stale, podAlive, removedTemps, leftAlone };
}
