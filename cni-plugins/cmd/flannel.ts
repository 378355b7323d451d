// Entry point of the `flannel` bundle. The bridge, weft-ovs and host-local plugins are registered
// so that, when CNI_PATH leads to weft's own bundles, the delegation runs in this process (no
// extra exec): bridge on the vxlan/host-gw backends, weft-ovs on the ovs backend.
import { bridgePlugin } from '../bridge/plugin.js';
import { flannelPlugin } from '../flannel/plugin.js';
import { hostLocalPlugin } from '../host-local/plugin.js';
import { ovsPlugin } from '../ovs/plugin.js';
import { registerInProcess } from '../skel/delegate.js';
import { runPlugin } from '../skel/run.js';

registerInProcess(bridgePlugin);
registerInProcess(ovsPlugin);
registerInProcess(hostLocalPlugin);
await runPlugin(flannelPlugin);
