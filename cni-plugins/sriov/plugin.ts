// The sriov plugin: a Virtual Function instead of a veth, as k8snetworkplumbingwg/sriov-cni does
// it (same config keys, state files, messages), in three modes:
//
//   plain    the VF netdev moves into the pod (through a temporary netns), renamed to CNI_IFNAME;
//            its MAC, VLAN, spoof check, trust, link state and rates are set through the PF.
//   DPDK     the VF is bound to vfio-pci / uio_pci_generic / igb_uio (no netdev): PF settings
//            and IPAM only, nothing moves.
//   offload  (`ovs: {bridge, ovsRunDir, datapathType}`) as plain, plus the VF representor on the
//            OVS bridge with the pod's flows. The step is a hook (SriovDeps.offload, OffloadHooks;
//            the real one is offload.ts, wired in cmd/sriov.ts); without one, ADD refuses the key.
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
//
// Each verb has its file: add.ts, del.ts, check.ts; the PF's VF settings are pf-settings.ts's,
// the VF netdev's moves link.ts's, the state files state.ts's.
import type { CniPlugin, CniRequest } from '../skel/types.js';
import { add } from './add.js';
import { check } from './check.js';
import { del, ipamTypeOf } from './del.js';
import type { SriovDeps } from './deps.js';

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
