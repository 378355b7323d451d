// The plugins the CNI server runs, by the name a client is installed under: the same plugin objects
// the bundles' entry points (cni-plugins/cmd/*.ts) run, and the same in-process delegation the
// flannel bundle registers (flannel → bridge / weft-ovs → host-local; sriov → host-local), so a
// chain runs entirely inside weftd's plugin process (plugin-runner.ts, which imports this module)
// when CNI_PATH leads to weft's plugins.
import { bridgePlugin } from '../../cni-plugins/bridge/plugin.js';
import { flannelPlugin } from '../../cni-plugins/flannel/plugin.js';
import { hostLocalPlugin } from '../../cni-plugins/host-local/plugin.js';
import { ovsPlugin } from '../../cni-plugins/ovs/plugin.js';
import { portmapPlugin } from '../../cni-plugins/portmap/plugin.js';
import { cniPathDelegates, registerInProcess } from '../../cni-plugins/skel/delegate.js';
import type { CniPlugin } from '../../cni-plugins/skel/types.js';
import { devlinkPortLookup } from '../../cni-plugins/sriov/devlink.js';
import { ovsOffload } from '../../cni-plugins/sriov/offload.js';
import { createSriovPlugin } from '../../cni-plugins/sriov/plugin.js';
import { IpPfVfControl } from '../../cni-plugins/sriov/vfcontrol.js';
import type { PluginRegistry } from './executor.js';
import type { CNI_SERVER_PLUGINS } from './types.js';


/** Every served plugin by name; registers the delegates for in-process delegation (idempotent). */
export function servedPlugins(): PluginRegistry {
  registerInProcess(bridgePlugin);
  registerInProcess(ovsPlugin);
  registerInProcess(hostLocalPlugin);
  const sriov = createSriovPlugin({ ipam: cniPathDelegates, vf: new IpPfVfControl(), devlink: devlinkPortLookup, offload: ovsOffload });
  // Keyed by the executable's name (the ovs plugin's bundle is `weft-ovs`), every name of CNI_SERVER_PLUGINS.
  const byName: Record<(typeof CNI_SERVER_PLUGINS)[number], CniPlugin> = {
    flannel: flannelPlugin,
    bridge: bridgePlugin,
    'host-local': hostLocalPlugin,
    portmap: portmapPlugin,
    'weft-ovs': ovsPlugin,
    sriov,
  };
  return new Map(Object.entries(byName));
}
