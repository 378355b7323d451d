// Entry point of the `bridge` bundle. host-local is registered so that, when CNI_PATH leads to
// weft's own host-local bundle, the IPAM delegation runs in this process (no second Node start).
import { bridgePlugin } from '../bridge/plugin.js';
import { hostLocalPlugin } from '../host-local/plugin.js';
import { registerInProcess } from '../skel/delegate.js';
import { runPlugin } from '../skel/run.js';

registerInProcess(hostLocalPlugin);
await runPlugin(bridgePlugin);
