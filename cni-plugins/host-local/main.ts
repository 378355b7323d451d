// The host-local executable: the reference's IPAM plugin, speaking CNI over env + stdin.
import { runPlugin } from '../skel/run.js';
import { hostLocalPlugin } from './plugin.js';

await runPlugin(hostLocalPlugin);
