// The NetworkPolicy enforcer's start on a node it cannot serve: an ovs node's pod traffic stays in
// Open vSwitch and never crosses the nftables hooks, so --network-policy there is refused (weftd
// ends with the message) before anything is touched — no sysctl, no API watch, no nft.
import assert from 'node:assert/strict';

import { FatalError } from '../../src/daemon/daemon.js';
import { PolicyEnforcer } from '../../src/policy/enforcer.js';
import type { KubeClient } from '../../src/subnet/kube/client.js';
import type { Logger } from '../../src/util/log.js';

const silent: Logger = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {}, child: () => silent };

describe('policy enforcer on an ovs node', () => {
  it('refuses with a FatalError naming the backend, touching nothing', async () => {
    const touched: string[] = [];
    const client = new Proxy({}, { get: (_t, p) => () => void touched.push(`client.${String(p)}`) }) as unknown as KubeClient;
    const enforcer = new PolicyEnforcer({
      client,
      nodeName: 'n1',
      logger: silent,
      resyncSeconds: 1,
      networkConfig: () => Promise.resolve({ enableIPv4: true, enableIPv6: false, backend: { type: 'ovs', options: { Type: 'ovs' } } }),
      run: (args) => {
        touched.push(`nft ${args.join(' ')}`);
        return Promise.resolve('');
      },
      bridgeSysctlDir: '/nonexistent-weft-test',
    });
    await assert.rejects(enforcer.run(new AbortController().signal), (e: unknown) => e instanceof FatalError && /ovs backend/.test(e.message));
    assert.deepEqual(touched, []);
    assert.equal(enforcer.ready, false);
  });
});
