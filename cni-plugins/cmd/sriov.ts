// Entry point of the `sriov` bundle: the PF's VF settings through iproute2, representors found
// through devlink then sysfs, and the OVS hardware-offload step (an `ovs` key in the config turns
// it on). host-local is registered so that, when CNI_PATH leads to weft's own host-local bundle,
// the IPAM delegation runs in this process (no second Node start).
import { hostLocalPlugin } from '../host-local/plugin.js';
import { cniPathDelegates, registerInProcess } from '../skel/delegate.js';
import { runPlugin } from '../skel/run.js';
import { devlinkPortLookup } from '../sriov/devlink.js';
import { ovsOffload } from '../sriov/offload.js';
import { createSriovPlugin } from '../sriov/plugin.js';
import { IpPfVfControl } from '../sriov/vfcontrol.js';

registerInProcess(hostLocalPlugin);
await runPlugin(
  createSriovPlugin({
    ipam: cniPathDelegates,
    vf: new IpPfVfControl(),
    devlink: devlinkPortLookup,
    offload: ovsOffload,
  }),
);
