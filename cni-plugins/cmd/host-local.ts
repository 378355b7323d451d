// The host-local executable: the reference's IPAM plugin, speaking CNI over env + stdin.
import { hostLocalPlugin } from '../host-local/plugin.js';
import { runPlugin } from '../skel/run.js';

await runPlugin(hostLocalPlugin);
