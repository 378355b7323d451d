// The portmap executable: the skeleton reads the request, dispatches to the plugin and prints.
import { runPlugin } from '../skel/run.js';
import { portmapPlugin } from './plugin.js';

await runPlugin(portmapPlugin);
