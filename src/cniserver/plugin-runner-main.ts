// The entry of weftd's CNI plugin process (started by plugin-process.ts): weft's plugins.
import { runPluginProcess } from './plugin-runner.js';

runPluginProcess(async () => (await import('./plugins.js')).servedPlugins());
