// The sriov plugin's ADD (its steps are in plugin.ts's header), and the hook point of the offload
// step's attach.
import type { VfConfig } from '../../src/netlink/vf.js';
import { errorMessage } from '../../src/util/errors.js';
import { NetnsHandle } from '../lib/netns.js';
import { internalError, Undo, withCleanup } from '../lib/rollback.js';
import type { CniIPConfig, CniRequest, CniResult } from '../skel/types.js';
import { loadSriovConf, type SriovConf } from './config.js';
import { OffloadUnavailableError, type OffloadAttachContext, type SriovDeps } from './deps.js';
import { announce, configurePodAddresses, fallbackHostName, hostLink, moveVfIntoPod, releaseVf, setupPodLink, type HostIdentity } from './link.js';
import { changesToApply, changesToReset, resetVf, waitAdminMac } from './pf-settings.js';
import { appliedFrom, encodeState, liveAllocation, lockVf, pciAllocFile, removeFile, saveAllocation, stateFile, writeFileAtomic, type SriovState } from './state.js';
import { discoverRepresentor, Sysfs, SriovDiscoveryError, type OffloadPorts } from './sysfs.js';
import { PfReadError, VfChangeError } from './vfcontrol.js';

interface Located {
  readonly sysfs: Sysfs;
  readonly pf: string;
  readonly vfIndex: number;
}

export async function add(deps: SriovDeps, req: CniRequest): Promise<CniResult> {
  const conf = loadSriovConf(req.config, req.args, req.env);
  if (conf.ovs && !deps.offload) throw new OffloadUnavailableError(conf.ovs);
  const sysfs = new Sysfs(conf.sysfsRoot);
  const { pf, vfIndex } = sysfs.locate(conf.deviceID);
  // Its sysfs names are checked before anything is made (the lock file too); read again under the lock.
  sysfs.vfNetdev(conf.deviceID);
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
  if (liveAllocation(conf.dataDir, id) !== null) throw internalError(`SRIOV-CNI failed to load netconf: pci address ${id} is already allocated`);
  const netdev = sysfs.vfNetdev(id);
  const dpdk = netdev === null && sysfs.isDpdkDriver(id);
  if (netdev === null && !dpdk) throw new SriovDiscoveryError(`SRIOV-CNI failed to load netconf: LoadConf(): the VF ${id} does not have a interface name or a dpdk driver`, id);
  const ports = conf.ovs ? await discoverRepresentor(sysfs, id, deps.devlink ?? null) : null;

  const vfHost = netdev === null ? null : await hostLink(netdev);
  if (netdev !== null && vfHost === null) {
    throw internalError(`failed to set up pod interface "${req.ifname}" from the device "${pf}": error getting VF netdevice with name ${netdev}`);
  }
  let origPf: VfConfig | null;
  try {
    origPf = await deps.vf.read(pf, vfIndex);
  } catch (e) {
    if (e instanceof PfReadError) throw internalError(`failed to get original vf information: ${e.message}`);
    throw e;
  }
  if (origPf === null) throw internalError(`failed to get original vf information: failed to find vf ${vfIndex}`);
  const applied = appliedFrom(conf);

  const undo = new Undo();
  try {
    undo.push('reset VF through the PF', () => resetVf(deps.vf, pf, vfIndex, changesToReset(applied, origPf)));
    try {
      await deps.vf.apply(pf, vfIndex, changesToApply(applied));
    } catch (e) {
      if (e instanceof VfChangeError) throw internalError(`SRIOV-CNI failed to configure VF ${JSON.stringify(e.message)}`);
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
        throw internalError(`failed to set up pod interface "${req.ifname}" from the device "${pf}": ${errorMessage(e)}`);
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
      if ((r.ips ?? []).length === 0) throw internalError('IPAM plugin returned missing IP config');
      ips = r.ips!.map((i) => ({ ...i, interface: 0 }));
      result.ips = ips;
      if (r.routes?.length) result.routes = r.routes;
      if (r.dns) result.dns = r.dns;
      if (vfHost !== null) {
        try {
          await configurePodAddresses(ns, req.ifname, ips, r.routes ?? []);
        } catch (e) {
          throw internalError(errorMessage(e));
        }
      }
    }

    const offloadState = await runOffloadAttach(deps, req, conf, ports, { name: req.ifname, mac: podMac, mtu, sandbox: req.netns }, ips, result, undo);

    // The netns is held open throughout; a path deleted meanwhile means the pod is gone.
    if (!ns.stillMounted()) throw internalError(`failed to open netns "${req.netns}": the netns was deleted during ADD`);

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
    undo.push('remove the state file', () => removeFile(file));
    try {
      writeFileAtomic(file, encodeState(state, req.config));
    } catch (e) {
      throw internalError(`error saving NetConf "${errorMessage(e)}"`);
    }
    undo.push('remove the PCI allocation', () => removeFile(pciAllocFile(conf.dataDir, id)));
    try {
      saveAllocation(conf.dataDir, id, req.netns);
    } catch (e) {
      throw internalError(`error saving the pci allocation for vf pci address ${id}: ${errorMessage(e)}`);
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
