// The sriov plugin: a Virtual Function instead of a veth, as k8snetworkplumbingwg/sriov-cni does
// it (same config keys, state files, messages), in three modes:
//
//   plain    the VF netdev moves into the pod (through a temporary netns), renamed to CNI_IFNAME;
//            its MAC, VLAN, spoof check, trust, link state and rates are set through the PF.
//   DPDK     the VF is bound to vfio-pci / uio_pci_generic / igb_uio (no netdev): PF settings
//            and IPAM only, nothing moves.
//   offload  (`ovs: {bridge, ovsRunDir, datapathType}`) as plain, plus the VF representor on the
//            OVS bridge with the pod's flows. The step is a hook (SriovDeps.offload, OffloadHooks;
//            the real one is offload.ts, wired in main.ts); without one, ADD refuses the key.
//
// ADD   config → locate the VF in sysfs → lock <dataDir>/pci/vf_lock/<vf>.lock → refuse a VF
//       allocated to a live netns → read the VF through the PF → apply the settings → move the
//       VF into the pod → MAC, sysctls, up → IPAM → addresses → [offload attach] → state files →
//       announce. Any failure undoes what was done, newest first (IPAM release, VF back to the
//       host as it was, PF settings reset), so a failed ADD leaves no state file.
// DEL   idempotent. With the state file: [offload detach], IPAM DEL, PF reset (before the move,
//       as sriov-cni: some drivers refuse a MAC change with trust off), VF back to the host with
//       its name, MAC and MTU. Without it (sriov-cni gives up): IPAM DEL, and the VF found from
//       the config's deviceID and prevResult is still returned and reset.
// CHECK the VF is in the pod with the result's MAC and addresses, and the PF reports the
//       configured settings.
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import type { VfChange, VfConfig } from '../../src/netlink/vf.js';
import { ipBatch, linksOf, NetnsHandle } from '../bridge/iproute.js';
import { withFileLock } from '../skel/lock.js';
import { CniError, ErrorCode, type CniIPConfig, type CniInterface, type CniPlugin, type CniRequest, type CniResult, type Delegates, type NetConf } from '../skel/types.js';
import { Undo, withCleanup } from '../skel/rollback.js';
import { DATA_DIR_ENV, DEFAULT_DATA_DIR, DEFAULT_SYSFS_ROOT, loadSriovConf, SYSFS_ENV, type OvsOffloadConf, type SriovConf } from './config.js';
import {
  announce,
  configurePodAddresses,
  hostLink,
  moveVfIntoPod,
  podLink,
  podLinkParentDev,
  releaseVf,
  restoreHostVf,
  setupPodLink,
  type HostIdentity,
} from './link.js';
import {
  appliedFrom,
  decodeState,
  encodeState,
  liveAllocation,
  netnsAlive,
  pciAllocFile,
  pciLockFile,
  readAllocation,
  readStateText,
  removeFile,
  saveAllocation,
  stateFile,
  StateFileError,
  writeFileAtomic,
  type AppliedSettings,
  type SriovState,
} from './state.js';
import { discoverRepresentor, Sysfs, SriovDiscoveryError, type DevlinkPortLookup, type OffloadPorts } from './sysfs.js';
import { PfReadError, VfChangeError, type PfVfControl } from './vfcontrol.js';

/** sriov-cni waits up to 60 s for another ADD/DEL of the same VF. */
const LOCK_TIMEOUT_S = 60;
const MAC_ATTEMPTS = 20;
const MAC_RETRY_MS = 100;

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

// ---- the offload hook ----

/** What the offload step gets once the VF is in the pod with its addresses. */
export interface OffloadAttachContext {
  readonly req: CniRequest;
  readonly conf: SriovConf;
  readonly ovs: OvsOffloadConf;
  /** Uplink, VF index and representor netdev, found in sysfs before anything was changed. */
  readonly ports: OffloadPorts;
  /** The VF as the pod sees it: CNI_IFNAME, MAC, MTU. */
  readonly podInterface: Required<Pick<CniInterface, 'name' | 'mac' | 'mtu' | 'sandbox'>>;
  /** IPAM's addresses (interface index still 0) and routes. */
  readonly ips: readonly CniIPConfig[];
}

export interface OffloadAttachment {
  /** The host-side interface (the renamed representor): result interface 0, the VF becomes 1. */
  readonly hostInterface: CniInterface;
  /** Saved in the state file and handed back to detach(); JSON only. */
  readonly state: Record<string, unknown>;
}

export interface OffloadDetachContext {
  readonly req: CniRequest;
  readonly deviceID: string;
  /** What attach() returned as `state` (null when DEL runs without a state file). */
  readonly state: Record<string, unknown> | null;
}

/**
 * The OVS hardware-offload step (representor renamed and attached to the bridge, pod flows).
 * attach() runs after the VF is in the pod and IPAM is done; an attach() that throws has undone
 * its own steps. If anything after it fails, or on DEL, detach() undoes it; detach() must
 * tolerate repeated calls and a missing state (null: find what it can from the request).
 */
export interface OffloadHooks {
  attach(ctx: OffloadAttachContext): Promise<OffloadAttachment>;
  detach(ctx: OffloadDetachContext): Promise<void>;
  /** CHECK of the offload side; optional. */
  check?(ctx: OffloadDetachContext): Promise<void>;
}

export interface SriovDeps {
  readonly ipam: Delegates;
  /** The PF's VF-configuration calls. */
  readonly vf: PfVfControl;
  /** devlink port lookup for representors (null: sysfs only). */
  readonly devlink?: DevlinkPortLookup | null;
  /** The offload mode; absent: an `ovs` key is refused. */
  readonly offload?: OffloadHooks;
}

// ---- errors ----

function internal(msg: string, details = ''): CniError {
  return new CniError(ErrorCode.Internal, msg, details);
}

export class OffloadUnavailableError extends CniError {
  constructor(ovs: OvsOffloadConf) {
    super(ErrorCode.UnsupportedField, `offload mode not implemented yet ("ovs": ${JSON.stringify(ovs)})`);
    this.name = 'OffloadUnavailableError';
  }
}



// ---- PF settings ----

/** sriov-cni ApplyVFConfig's changes, in its order: VLAN (always), MAC, rates, spoofchk, trust, link state. */
export function changesToApply(a: AppliedSettings): VfChange[] {
  const out: VfChange[] = [{ kind: 'vlan', vlan: a.vlan ?? 0, qos: a.vlanQoS, proto: a.vlanProto }];
  if (a.mac) out.push({ kind: 'mac', mac: a.mac });
  if (a.minTxRate !== null || a.maxTxRate !== null) out.push({ kind: 'rate', minTxRate: a.minTxRate ?? 0, maxTxRate: a.maxTxRate ?? 0 });
  if (a.spoofchk) out.push({ kind: 'spoofchk', on: a.spoofchk === 'on' });
  if (a.trust) out.push({ kind: 'trust', on: a.trust === 'on' });
  if (a.linkState) out.push({ kind: 'linkState', state: a.linkState });
  return out;
}

/**
 * What restores the VF: the VLAN always (ADD always sets it; sriov-cni only restores a
 * configured one), then spoofchk, admin MAC, trust, rates and link state where ADD changed them,
 * to what the PF reported before ADD.
 */
export function changesToReset(a: AppliedSettings, orig: VfConfig): VfChange[] {
  const out: VfChange[] = [{ kind: 'vlan', vlan: orig.vlan, qos: orig.qos, proto: orig.vlanProto }];
  if (a.spoofchk && orig.spoofchk !== null) out.push({ kind: 'spoofchk', on: orig.spoofchk });
  if (a.mac) out.push({ kind: 'mac', mac: orig.mac });
  if (a.trust) out.push({ kind: 'trust', on: orig.trust ?? false });
  if (a.minTxRate !== null || a.maxTxRate !== null) out.push({ kind: 'rate', minTxRate: orig.minTxRate, maxTxRate: orig.maxTxRate });
  if (a.linkState) out.push({ kind: 'linkState', state: orig.linkState ?? 'auto' });
  return out;
}

/** Without the original state (no state file): the driver defaults for what the config changes. */
export function changesToNeutral(a: AppliedSettings, vf: number): VfChange[] {
  return changesToReset(a, { vf, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: true, trust: false, linkState: 'auto', minTxRate: 0, maxTxRate: 0 });
}

async function resetVf(ctl: PfVfControl, pf: string, vf: number, changes: readonly VfChange[]): Promise<void> {
  try {
    await ctl.apply(pf, vf, changes, { keepGoing: true });
  } catch (e) {
    if (e instanceof VfChangeError) throw internal(`error reseting VF: ${JSON.stringify(e.message)}`);
    throw e;
  }
}

/** Waits until the PF reports the admin MAC just set (some drivers apply it asynchronously). */
async function waitAdminMac(ctl: PfVfControl, pf: string, vf: number, mac: string): Promise<void> {
  let seen = '';
  for (let i = 0; i < MAC_ATTEMPTS; i++) {
    const cfg = await ctl.read(pf, vf);
    seen = cfg?.mac ?? '';
    if (seen === mac) return;
    await sleep(MAC_RETRY_MS);
  }
  throw internal(`SRIOV-CNI failed to configure VF "failed to set MAC address to ${mac}: the PF still reports ${seen || 'nothing'}"`);
}

/** The name a VF gets back in the host when its own is unknown: the systemd style <pf>v<N>. */
export function fallbackHostName(pf: string, vfIndex: number): string {
  const suffix = `v${vfIndex}`;
  return `${pf.slice(0, 15 - suffix.length)}${suffix}`;
}

/** Runs `fn` holding the VF's lock file (sriov-cni's path; created with its directories). */
async function lockVf<T>(dataDir: string, pci: string, fn: () => Promise<T>): Promise<T> {
  const file = pciLockFile(dataDir, pci);
  try {
    mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  } catch (e) {
    throw internal(`failed to create the sriov data directory(${JSON.stringify(dirname(file))}): ${(e as Error).message}`);
  }
  return withFileLock(file, fn, { timeoutSeconds: LOCK_TIMEOUT_S, mode: 0o600 });
}

// ---- ADD ----

interface Located {
  readonly sysfs: Sysfs;
  readonly pf: string;
  readonly vfIndex: number;
}

async function add(deps: SriovDeps, req: CniRequest): Promise<CniResult> {
  const conf = loadSriovConf(req.config, req.args, req.env);
  if (conf.ovs && !deps.offload) throw new OffloadUnavailableError(conf.ovs);
  const sysfs = new Sysfs(conf.sysfsRoot);
  const { pf, vfIndex } = sysfs.locate(conf.deviceID);
  const ns = NetnsHandle.openForPod(req.netns);
  try {
    return await lockVf(conf.dataDir, conf.deviceID, () => addLocked(deps, req, conf, { sysfs, pf, vfIndex }, ns));
  } finally {
    ns.close();
  }
}

async function addLocked(deps: SriovDeps, req: CniRequest, conf: SriovConf, at: Located, ns: NetnsHandle): Promise<CniResult> {
  const { sysfs, pf, vfIndex } = at;
  const id = conf.deviceID;
  // A DEL of the previous pod may still be on its way while the next pod's ADD comes.
  if (liveAllocation(conf.dataDir, id) !== null) throw internal(`SRIOV-CNI failed to load netconf: pci address ${id} is already allocated`);
  const netdev = sysfs.vfNetdev(id);
  const dpdk = netdev === null && sysfs.isDpdkDriver(id);
  if (netdev === null && !dpdk) throw new SriovDiscoveryError(`SRIOV-CNI failed to load netconf: LoadConf(): the VF ${id} does not have a interface name or a dpdk driver`, id);
  const ports = conf.ovs ? await discoverRepresentor(sysfs, id, deps.devlink ?? null) : null;

  const vfHost = netdev === null ? null : await hostLink(netdev);
  if (netdev !== null && vfHost === null) {
    throw internal(`failed to set up pod interface "${req.ifname}" from the device "${pf}": error getting VF netdevice with name ${netdev}`);
  }
  let origPf: VfConfig | null;
  try {
    origPf = await deps.vf.read(pf, vfIndex);
  } catch (e) {
    if (e instanceof PfReadError) throw internal(`failed to get original vf information: ${e.message}`);
    throw e;
  }
  if (origPf === null) throw internal(`failed to get original vf information: failed to find vf ${vfIndex}`);
  const applied = appliedFrom(conf);

  const undo = new Undo();
  try {
    undo.push('reset VF through the PF', () => resetVf(deps.vf, pf, vfIndex, changesToReset(applied, origPf)));
    try {
      await deps.vf.apply(pf, vfIndex, changesToApply(applied));
    } catch (e) {
      if (e instanceof VfChangeError) throw internal(`SRIOV-CNI failed to configure VF ${JSON.stringify(e.message)}`);
      throw e;
    }
    if (conf.mac) await waitAdminMac(deps.vf, pf, vfIndex, conf.mac);

    const result: CniResult = { cniVersion: '1.1.0', interfaces: [{ name: req.ifname, sandbox: req.netns }] };
    const iface = result.interfaces![0]!;
    let podMac = '';
    let mtu = 0;
    if (vfHost !== null) {
      const back: HostIdentity = { name: vfHost.ifname, mac: vfHost.address, mtu: vfHost.mtu };
      undo.push('return the VF to the host', async () => {
        await releaseVf(ns, req.ifname, back, fallbackHostName(pf, vfIndex));
      });
      try {
        await moveVfIntoPod(vfHost.ifname, req.ifname, ns);
        const link = await setupPodLink(ns, req.ifname, conf.mac);
        podMac = link.address;
        mtu = link.mtu;
      } catch (e) {
        throw internal(`failed to set up pod interface "${req.ifname}" from the device "${pf}": ${(e as Error).message}`);
      }
    } else {
      // DPDK: the admin MAC when set (the configured one wins), the PF's MTU.
      podMac = origPf.mac !== '00:00:00:00:00:00' ? origPf.mac : '';
      mtu = (await hostLink(pf))?.mtu ?? 0;
    }
    if (conf.mac) podMac = conf.mac;
    if (podMac) iface.mac = podMac;
    if (mtu > 0) iface.mtu = mtu;

    let ips: CniIPConfig[] = [];
    if (conf.ipamType !== '') {
      const r = await deps.ipam.add(req, conf.ipamType, req.stdin);
      undo.push(`release IP (${conf.ipamType} DEL)`, () => deps.ipam.del(req, conf.ipamType, req.stdin));
      if ((r.ips ?? []).length === 0) throw internal('IPAM plugin returned missing IP config');
      ips = r.ips!.map((i) => ({ ...i, interface: 0 }));
      result.ips = ips;
      if (r.routes?.length) result.routes = r.routes;
      if (r.dns) result.dns = r.dns;
      if (vfHost !== null) {
        try {
          await configurePodAddresses(ns, req.ifname, ips, r.routes ?? []);
        } catch (e) {
          throw internal((e as Error).message);
        }
      }
    }

    const offloadState = await runOffloadAttach(deps, req, conf, ports, { name: req.ifname, mac: podMac, mtu, sandbox: req.netns }, ips, result, undo);

    // The netns is held open throughout; a path deleted meanwhile means the pod is gone.
    if (!ns.stillMounted()) throw internal(`failed to open netns "${req.netns}": the netns was deleted during ADD`);

    const state: SriovState = {
      deviceID: id,
      pf,
      vfIndex,
      dpdk,
      podIfName: req.ifname,
      netns: req.netns,
      applied,
      orig: { hostIfName: vfHost?.ifname ?? '', effectiveMac: vfHost?.address ?? '', mtu: vfHost?.mtu ?? 0, pf: origPf },
      offload: offloadState,
    };
    const file = stateFile(conf.dataDir, req.containerId, req.ifname);
    undo.push('remove the state file', async () => removeFile(file));
    try {
      writeFileAtomic(file, encodeState(state, req.config));
    } catch (e) {
      throw internal(`error saving NetConf "${(e as Error).message}"`);
    }
    undo.push('remove the PCI allocation', async () => removeFile(pciAllocFile(conf.dataDir, id)));
    try {
      saveAllocation(conf.dataDir, id, req.netns);
    } catch (e) {
      throw internal(`error saving the pci allocation for vf pci address ${id}: ${(e as Error).message}`);
    }
    if (vfHost !== null && ips.length > 0 && podMac) await announce(ns, req.ifname, podMac).catch(() => false);
    return result;
  } catch (e) {
    throw withCleanup(e, await undo.run());
  }
}

/**
 * The offload step (hook point): after the VF is in the pod with its addresses. Puts the
 * representor first in the result and renumbers the IPs to the VF (index 1); returns the state
 * the hook wants saved, or null in plain/DPDK mode.
 */
async function runOffloadAttach(
  deps: SriovDeps,
  req: CniRequest,
  conf: SriovConf,
  ports: OffloadPorts | null,
  podInterface: OffloadAttachContext['podInterface'],
  ips: CniIPConfig[],
  result: CniResult,
  undo: Undo,
): Promise<Record<string, unknown> | null> {
  if (!conf.ovs || !ports || !deps.offload) return null;
  const hooks = deps.offload;
  // A failing attach() has undone its own steps (OffloadHooks), so nothing to push before it.
  const att = await hooks.attach({ req, conf, ovs: conf.ovs, ports, podInterface, ips: ips.map((i) => ({ ...i })) });
  undo.push('offload detach', () => hooks.detach({ req, deviceID: conf.deviceID, state: att.state }));
  result.interfaces = [att.hostInterface, ...(result.interfaces ?? [])];
  for (const ip of result.ips ?? []) ip.interface = 1;
  return att.state;
}

// ---- DEL ----

/** Where the state lives, from a config that may not pass ADD's validation. */
function pathsOf(config: NetConf, env: CniRequest['env']): { dataDir: string; sysfsRoot: string } {
  const c = config as Record<string, unknown>;
  const pick = (key: string, envKey: string, dflt: string): string => {
    const v = c[key];
    return typeof v === 'string' && v.startsWith('/') ? v : env[envKey]?.startsWith('/') ? env[envKey]! : dflt;
  };
  return { dataDir: pick('dataDir', DATA_DIR_ENV, DEFAULT_DATA_DIR), sysfsRoot: pick('sysfsRoot', SYSFS_ENV, DEFAULT_SYSFS_ROOT) };
}

function ipamTypeOf(config: NetConf): string {
  const t = config.ipam?.type;
  return typeof t === 'string' ? t : '';
}

async function del(deps: SriovDeps, req: CniRequest): Promise<void> {
  const { dataDir, sysfsRoot } = pathsOf(req.config, req.env);
  const file = stateFile(dataDir, req.containerId, req.ifname);
  const text = readStateText(file);
  let state: SriovState | null = null;
  if (text !== null) {
    try {
      state = decodeState(file, text);
    } catch (e) {
      // A torn or foreign file must not block DEL forever (sriov-cni#447): clean up without it.
      if (!(e instanceof StateFileError)) throw e;
      removeFile(file);
    }
  }
  const ns = NetnsHandle.openIfPresent(req.netns);
  try {
    if (state) {
      const s = state;
      await lockVf(dataDir, s.deviceID, () => delWithState(deps, req, dataDir, new Sysfs(sysfsRoot), s, ns));
      removeFile(file);
    } else {
      await delWithoutState(deps, req, dataDir, new Sysfs(sysfsRoot), ns);
    }
  } finally {
    ns?.close();
  }
}

/** Whether the VF still belongs to this attachment (not re-allocated to another live pod: sriov-cni#313). */
function ownsVf(dataDir: string, pci: string, netns: string | null): boolean {
  const alloc = readAllocation(dataDir, pci);
  if (alloc === null || alloc === netns || alloc === '') return true;
  return !netnsAlive(alloc);
}

async function delWithState(deps: SriovDeps, req: CniRequest, dataDir: string, sysfs: Sysfs, s: SriovState, ns: NetnsHandle | null): Promise<void> {
  const errors: string[] = [];
  const attempt = async (what: string, fn: () => Promise<unknown>): Promise<void> => {
    try {
      await fn();
    } catch (e) {
      errors.push(`${what}: ${(e as Error).message}`);
    }
  };
  if (s.offload !== null) {
    const hooks = deps.offload;
    if (hooks) await attempt('offload detach', () => hooks.detach({ req, deviceID: s.deviceID, state: s.offload }));
    else errors.push('offload detach: the state has offload data but this plugin has no offload mode');
  }
  const ipamType = ipamTypeOf(req.config);
  // The IP goes first and always: it never needs the netns (plugins#1196).
  if (ipamType !== '') await attempt(`${ipamType} DEL`, () => deps.ipam.del(req, ipamType, req.stdin));
  const netns = s.netns ?? (req.netns || null);
  if (ownsVf(dataDir, s.deviceID, netns)) {
    // Reset before the move: some drivers refuse the netdev MAC change with trust off (sriov-cni).
    await attempt('reset VF', async () => {
      if (s.vfIndex >= sysfs.numVfs(s.pf)) throw new Error(`VF ${s.vfIndex} of ${s.pf} no longer exists`);
      await resetVf(deps.vf, s.pf, s.vfIndex, changesToReset(s.applied, s.orig.pf));
    });
    if (!s.dpdk) {
      const to: HostIdentity = { name: s.orig.hostIfName || fallbackHostName(s.pf, s.vfIndex), mac: s.orig.effectiveMac, mtu: s.orig.mtu };
      await attempt('release VF', async () => {
        const released = ns !== null && (await releaseVf(ns, s.podIfName || req.ifname, to, fallbackHostName(s.pf, s.vfIndex)));
        if (!released) {
          // Not in the pod (netns gone, or DEL repeated): a VF the kernel returned to the host
          // comes back with its pod name; give it its own name, MAC and MTU again.
          const current = sysfs.vfNetdev(s.deviceID);
          if (current !== null && (await hostLink(current)) !== null) await restoreHostVf(current, to);
        }
      });
    }
    if (errors.length === 0) removeFile(pciAllocFile(dataDir, s.deviceID));
  }
  if (errors.length > 0) throw internal(errors.join('; '));
}

/**
 * DEL without a state file (ADD failed before writing it, or the file was lost): release the
 * IP; then, when something ties the VF named by the config's deviceID to this attachment (it is
 * CNI_IFNAME in the pod, or its allocation names this netns), return it and reset its PF
 * settings to the driver defaults. A VF nothing ties to us is left alone: it may be free, or
 * another pod's.
 */
async function delWithoutState(deps: SriovDeps, req: CniRequest, dataDir: string, sysfs: Sysfs, ns: NetnsHandle | null): Promise<void> {
  const ipamType = ipamTypeOf(req.config);
  if (ipamType !== '') await deps.ipam.del(req, ipamType, req.stdin);
  let conf: SriovConf;
  try {
    conf = loadSriovConf(req.config, req.args, req.env);
  } catch {
    return; // nothing identifies a VF: the IP was all there was to release
  }
  if (conf.ovs && deps.offload) await deps.offload.detach({ req, deviceID: conf.deviceID, state: null });
  let located: { pf: string; vfIndex: number };
  try {
    located = sysfs.locate(conf.deviceID);
  } catch {
    return; // the VF is gone (PF reset, device removed): nothing to give back
  }
  const { pf, vfIndex } = located;
  await lockVf(dataDir, conf.deviceID, async () => {
    const alloc = readAllocation(dataDir, conf.deviceID);
    const allocatedToUs = alloc !== null && req.netns !== '' && alloc === req.netns;
    if (alloc !== null && !allocatedToUs && netnsAlive(alloc)) return; // another pod's
    const inPod = ns !== null && !sysfs.isDpdkDriver(conf.deviceID) && (await isOurVf(req, ns, conf.deviceID));
    if (!inPod && !allocatedToUs) return;
    const errors: string[] = [];
    if (inPod) {
      try {
        const name = fallbackHostName(pf, vfIndex);
        await releaseVf(ns, req.ifname, { name, mac: '', mtu: 0 }, name);
      } catch (e) {
        errors.push(`release VF: ${(e as Error).message}`);
      }
    }
    try {
      await resetVf(deps.vf, pf, vfIndex, changesToNeutral(appliedFrom(conf), vfIndex));
    } catch (e) {
      errors.push(`reset VF: ${(e as Error).message}`);
    }
    if (errors.length > 0) throw internal(errors.join('; '));
    removeFile(pciAllocFile(dataDir, conf.deviceID));
  });
}

/**
 * Whether CNI_IFNAME in the pod is this VF: the kernel names its PCI device when it can
 * (`ip -d` parentdev); otherwise prevResult must list that interface in this sandbox.
 */
async function isOurVf(req: CniRequest, ns: NetnsHandle, pci: string): Promise<boolean> {
  if ((await podLink(ns, req.ifname)) === null) return false;
  const parent = await podLinkParentDev(ns, req.ifname);
  if (parent !== null) return parent === pci;
  return (req.config.prevResult?.interfaces ?? []).some((i) => i.name === req.ifname && i.sandbox === req.netns);
}

// ---- CHECK ----

async function check(deps: SriovDeps, req: CniRequest): Promise<void> {
  const conf = loadSriovConf(req.config, req.args, req.env);
  const file = stateFile(conf.dataDir, req.containerId, req.ifname);
  const text = readStateText(file);
  if (text === null) throw internal(`no sriov state for container ${req.containerId} interface ${req.ifname} (${file})`);
  const s = decodeState(file, text);
  const prev = req.config.prevResult;
  if (!prev) throw internal('Required prevResult missing');
  if (conf.ipamType !== '') await deps.ipam.check(req, conf.ipamType, req.stdin);
  const cfg = await deps.vf.read(s.pf, s.vfIndex);
  if (cfg === null) throw internal(`VF ${s.vfIndex} of ${s.pf} not found`);
  const want = changesToApply(appliedFrom(conf));
  for (const c of want) {
    const bad = mismatch(cfg, c);
    if (bad) throw internal(`VF ${s.vfIndex} of ${s.pf}: ${bad}`);
  }
  if (!s.dpdk) {
    const ns = NetnsHandle.openForPod(req.netns);
    try {
      const r = await podLink(ns, req.ifname);
      if (!r) throw internal(`Interface name ${req.ifname} not found`);
      const intf = (prev.interfaces ?? []).find((i) => i.name === req.ifname && i.sandbox === req.netns);
      if (!intf) throw internal(`prevResult has no interface ${req.ifname} in sandbox ${req.netns}`);
      if (intf.mac && intf.mac !== r.address) throw internal(`Interface ${req.ifname} Mac ${intf.mac} doesn't match container Mac: ${r.address}`);
      const addrs = await podAddresses(ns, req.ifname);
      for (const ipc of prev.ips ?? []) {
        if (!addrs.includes(ipc.address)) throw internal(`Failed to match addr ${ipc.address} on interface ${req.ifname}`);
      }
    } finally {
      ns.close();
    }
  }
  if (s.offload !== null && deps.offload?.check) await deps.offload.check({ req, deviceID: s.deviceID, state: s.offload });
}

async function podAddresses(ns: NetnsHandle, ifname: string): Promise<string[]> {
  const r = await ipBatch([`address show dev ${ifname}`], { netns: ns, json: true });
  return (linksOf(r.docs)[0]?.addrs ?? []).map((a) => `${a.local}/${a.prefixlen}`);
}

/** What differs between the PF's report and one configured change, or null. */
export function mismatch(cfg: VfConfig, c: VfChange): string | null {
  switch (c.kind) {
    case 'vlan':
      if (cfg.vlan !== c.vlan || cfg.qos !== c.qos || cfg.vlanProto !== c.proto) {
        return `vlan ${cfg.vlan} qos ${cfg.qos} proto ${cfg.vlanProto}, expected vlan ${c.vlan} qos ${c.qos} proto ${c.proto}`;
      }
      return null;
    case 'mac':
      return cfg.mac === c.mac ? null : `MAC ${cfg.mac}, expected ${c.mac}`;
    case 'rate':
      return cfg.minTxRate === c.minTxRate && cfg.maxTxRate === c.maxTxRate ? null : `rates ${cfg.minTxRate}/${cfg.maxTxRate} Mbps, expected ${c.minTxRate}/${c.maxTxRate}`;
    case 'spoofchk':
      return cfg.spoofchk === null || cfg.spoofchk === c.on ? null : `spoofchk ${cfg.spoofchk ? 'on' : 'off'}, expected ${c.on ? 'on' : 'off'}`;
    case 'trust':
      return cfg.trust === null || cfg.trust === c.on ? null : `trust ${cfg.trust ? 'on' : 'off'}, expected ${c.on ? 'on' : 'off'}`;
    case 'linkState':
      return cfg.linkState === null || cfg.linkState === c.state ? null : `link state ${cfg.linkState}, expected ${c.state}`;
  }
}

// ---- GC / STATUS: IPAM's ----

async function gc(deps: SriovDeps, req: CniRequest): Promise<void> {
  const t = ipamTypeOf(req.config);
  if (t !== '') await deps.ipam.gc(req, t, req.stdin);
}

async function status(deps: SriovDeps, req: CniRequest): Promise<void> {
  const t = ipamTypeOf(req.config);
  if (t !== '') await deps.ipam.status(req, t, req.stdin);
}

/** Builds the plugin over its dependencies (the real ones, or recording/fake ones in tests). */
export function createSriovPlugin(deps: SriovDeps): CniPlugin {
  return {
    name: 'sriov',
    add: (req) => add(deps, req),
    del: (req) => del(deps, req),
    check: (req) => check(deps, req),
    gc: (req) => gc(deps, req),
    status: (req) => status(deps, req),
  };
}
