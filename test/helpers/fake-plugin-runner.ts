// A CNI plugin process (src/cniserver/plugin-runner.ts) with one fake plugin, `bridge`, whose ADD
// misbehaves on request (by container ID): `exit` ends the process, `hang` spins forever on the
// event loop, `throw` throws from a timer callback, `slow` takes 300 ms; any other ID succeeds.
// Started by test/unit/cniserver-plugin-process.test.ts through PluginProcess's modulePath.
import { runPluginProcess } from '../../src/cniserver/plugin-runner.js';
import { pluginStderr } from '../../cni-plugins/skel/stderr.js';
import type { CniPlugin, CniRequest, CniResult } from '../../cni-plugins/skel/types.js';

const behave = async (req: CniRequest): Promise<void> => {
  switch (req.containerId) {
    case 'exit':
      process.exit(3);
      break;
    case 'hang':
      for (;;);
    case 'throw':
      await new Promise(() => {
        setTimeout(() => {
          throw new Error('exploded in a callback');
        }, 10);
      });
      break;
    case 'slow':
      await new Promise((r) => setTimeout(r, 300));
      break;
  }
};

const plugin: CniPlugin = {
  name: 'bridge',
  add: async (req): Promise<CniResult> => {
    await behave(req);
    pluginStderr(`added ${req.containerId} in ${process.pid}\n`);
    return { cniVersion: '1.0.0', ips: [{ address: '10.0.0.2/24' }] };
  },
  del: async () => {},
  check: async () => {},
};

runPluginProcess(() => new Map([['bridge', plugin]]));
