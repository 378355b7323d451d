// The sriov plugin's DEL (with and without a state file, as plugin.ts's header says), and where
// the state lives for a config that may not pass ADD's validation.
import { errorMessage } from '../../src/util/errors.js';
import { NetnsHandle } from '../lib/netns.js';
import { internalError, tryStep } from '../lib/rollback.js';
import type { CniRequest, NetConf } from '../skel/types.js';
import { DATA_DIR_ENV, DEFAULT_DATA_DIR, DEFAULT_SYSFS_ROOT, loadSriovConf, SYSFS_ENV, type SriovConf } from './config.js';
import type { SriovDeps } from './deps.js';
import { fallbackHostName, hostLink, podLink, podLinkParentDev, releaseVf, restoreHostVf, type HostIdentity } from './link.js';
import { changesToNeutral, changesToReset, resetVf } from './pf-settings.js';
import { appliedFrom, decodeState, lockVf, netnsAlive, pciAllocFile, readAllocation, readStateText, removeFile, stateFile, StateFileError, type SriovState } from './state.js';
import { checkStateNames } from './state-names.js';
import { Sysfs } from './sysfs.js';

/** Where the state lives, from a config that may not pass ADD's validation. */
function pathsOf(config: NetConf, env: CniRequest['env']): { dataDir: string; sysfsRoot: string } {
  const c = config as Record<string, unknown>;
  const pick = (key: string, envKey: string, dflt: string): string => {
    const v = c[key];
    return typeof v === 'string' && v.startsWith('/') ? v : env[envKey]?.startsWith('/') ? env[envKey] : dflt;
  };
  return { dataDir: pick('dataDir', DATA_DIR_ENV, DEFAULT_DATA_DIR), sysfsRoot: pick('sysfsRoot', SYSFS_ENV, DEFAULT_SYSFS_ROOT) };
}

export function ipamTypeOf(config: NetConf): string {
  const t = config.ipam?.type;
  return typeof t === 'string' ? t : '';
}

export async function del(deps: SriovDeps, req: CniRequest): Promise<void> {
  const { dataDir, sysfsRoot } = pathsOf(req.config, req.env);
  const file = stateFile(dataDir, req.containerId, req.ifname);
  const text = readStateText(file);
  let state: SriovState | null = null;
  if (text !== null) {
    try {
      state = checkStateNames(file, decodeState(file, text));
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
  if (s.offload !== null) {
    const hooks = deps.offload;
    if (hooks) await tryStep(errors, 'offload detach', () => hooks.detach({ req, deviceID: s.deviceID, state: s.offload }));
    else errors.push('offload detach: the state has offload data but this plugin has no offload mode');
  }
  const ipamType = ipamTypeOf(req.config);
  // The IP goes first and always: it never needs the netns (plugins#1196).
  if (ipamType !== '') await tryStep(errors, `${ipamType} DEL`, () => deps.ipam.del(req, ipamType, req.stdin));
  const netns = s.netns ?? (req.netns || null);
  if (ownsVf(dataDir, s.deviceID, netns)) {
    // Reset before the move: some drivers refuse the netdev MAC change with trust off (sriov-cni).
    await tryStep(errors, 'reset VF', async () => {
      if (s.vfIndex >= sysfs.numVfs(s.pf)) throw new Error(`VF ${s.vfIndex} of ${s.pf} no longer exists`);
      await resetVf(deps.vf, s.pf, s.vfIndex, changesToReset(s.applied, s.orig.pf));
    });
    if (!s.dpdk) {
      const to: HostIdentity = { name: s.orig.hostIfName || fallbackHostName(s.pf, s.vfIndex), mac: s.orig.effectiveMac, mtu: s.orig.mtu };
      await tryStep(errors, 'release VF', async () => {
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
  if (errors.length > 0) throw internalError(errors.join('; '));
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
        errors.push(`release VF: ${errorMessage(e)}`);
      }
    }
    try {
      await resetVf(deps.vf, pf, vfIndex, changesToNeutral(appliedFrom(conf), vfIndex));
    } catch (e) {
      errors.push(`reset VF: ${errorMessage(e)}`);
    }
    if (errors.length > 0) throw internalError(errors.join('; '));
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
