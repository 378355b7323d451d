// The portmap executable: the skeleton reads the request, dispatches to the plugin and prints.
import { portmapPlugin } from '../portmap/plugin.js';
import { runPlugin } from '../skel/run.js';

await runPlugin(portmapPlugin);
