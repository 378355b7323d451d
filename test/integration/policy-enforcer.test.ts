// The NetworkPolicy enforcer's queue against the fake API server (over loopback) and a recording
// nft that fails on demand, no kernel: the first full write, deltas gathered while a transaction
// runs going out together, a failed transaction rewritten from the engine at once (not at the
// next resync tick), and a CNI ADD that waits for its pod to be shown on this node and
// resolves only once the transaction holding its address has been written.
import assert from 'node:assert/strict';

import { PolicyEnforcer } from '../../src/policy/enforcer.js';
import { KubeClient, loadKubeConfig } from '../../src/subnet/kube/client.js';
import { AbortedError } from '../../src/util/backoff.js';
import { IPAddr } from '../../src/util/ip.js';
import type { Logger } from '../../src/util/log.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { waitFor } from '../helpers/wait.js';

const silent: Logger = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {}, child: () => silent };

describe('policy enforcer: the transaction queue (fake API, recording nft)', function () {
  this.timeout(60_000);
  let fake: FakeKube;
  let stop: AbortController;
  let running: Promise<void>;
  const scripts: string[] = [];
  let failNext = 0;
  let hold: Promise<void> | null = null;
  let enforcer: PolicyEnforcer;

  const pod = (name: string, app: string, ip: string | null, node = 'n1'): JsonObject => ({
    metadata: { namespace: 'x', name, uid: `u-${name}`, labels: { app } },
    spec: { nodeName: node, containers: [{ name: 'c' }] },
    status: { phase: ip ? 'Running' : 'Pending', ...(ip ? { podIP: ip, podIPs: [{ ip }] } : {}) },
  });
  const writes = () => scripts.length;

  before(async () => {
    fake = await FakeKube.start();
    fake.namespaces.put({ metadata: { name: 'x' } });
    fake.pods.put(pod('a', 'a', '10.9.0.2'));
    fake.networkPolicies.put({ metadata: { namespace: 'x', name: 'deny-b' }, spec: { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress'] } });
    stop = new AbortController();
    enforcer = new PolicyEnforcer({
      client: new KubeClient(loadKubeConfig({ apiUrl: fake.url }), { requestTimeoutMs: 5000 }),
      nodeName: 'n1',
      logger: silent,
      resyncSeconds: 3600, // the timer's tick never comes: only a failure wakes it
      networkConfig: () => Promise.resolve({ enableIPv4: true, enableIPv6: false, backend: { type: 'vxlan', options: {} } }),
      run: async (args, input) => {
        if (args[0] !== '-f') return '{"nftables": []}';
        if (hold) await hold;
        scripts.push(input ?? '');
        if (failNext > 0) {
          failNext--;
          throw new Error('nft: injected failure');
        }
        return '';
      },
      bridgeSysctlDir: '/nonexistent-weft-test',
    });
    running = enforcer.run(stop.signal);
    await waitFor(() => enforcer.ready, { what: 'the first full write' });
  });
  after(async () => {
    stop?.abort();
    await running?.catch(() => {});
    await fake?.stop();
  });

  it('writes the whole table once, then gathers what arrives during a transaction into the next one', async () => {
    assert.equal(writes(), 1);
    assert.match(scripts[0]!, /^add table inet weft_policy/);
    let release = () => {};
    hold = new Promise<void>((r) => (release = r));
    fake.pods.put(pod('b1', 'b', '10.9.0.11'));
    await waitFor(() => enforcer.failures === 0 && scripts.length === 1 && hold !== null, { what: 'the first delta to be held' });
    // While that transaction is held, nine more pods arrive.
    for (let i = 2; i <= 10; i++) fake.pods.put(pod(`b${i}`, 'b', `10.9.0.${10 + i}`));
    await new Promise((r) => setImmediate(r));
    hold = null;
    release();
    await waitFor(() => /10\.9\.0\.20/.test(scripts.join('')), { what: 'the last pod written' });
    assert.ok(writes() <= 3, `ten pods in ${writes() - 1} transactions`);
  });

  it('rewrites the table from the engine right after a failed transaction', async () => {
    const n = writes();
    failNext = 1;
    fake.pods.put(pod('b11', 'b', '10.9.0.21'));
    await waitFor(() => enforcer.failures === 1, { what: 'the injected failure' });
    const t0 = performance.now();
    await waitFor(() => enforcer.repairs === 1, { timeoutMs: 5000, what: 'the rewrite' });
    const last = scripts[scripts.length - 1]!;
    assert.match(last, /^add table inet weft_policy/, 'a whole-table rewrite');
    assert.match(last, /10\.9\.0\.21 : jump/, 'with the pod of the failed delta');
    assert.ok(writes() >= n + 2);
    assert.ok(performance.now() - t0 < 4000, 'well before the 3600 s tick');
  });

  it('answers a CNI ADD once its pod is shown on this node and its address written; gives up with the signal otherwise', async () => {
    fake.pods.put(pod('late', 'b', null));
    const cni = { namespace: 'x', name: 'late', uid: 'u-late', sandbox: 'sb1' };
    await enforcer.podAdded(cni, [IPAddr.parse('10.9.0.30')], AbortSignal.timeout(5000));
    assert.match(scripts[scripts.length - 1]!, /add element inet weft_policy ingress_v4 \{ 10\.9\.0\.30 : jump pod_[0-9a-f]+_in \}/);
    // A pod the API shows on another node, or under another UID: waits until the signal ends it.
    fake.pods.put(pod('elsewhere', 'b', null, 'n2'));
    await assert.rejects(enforcer.podAdded({ ...cni, name: 'elsewhere', uid: 'u-elsewhere' }, [IPAddr.parse('10.9.0.31')], AbortSignal.timeout(300)), AbortedError);
    await assert.rejects(enforcer.podAdded({ ...cni, uid: 'someone-else' }, [IPAddr.parse('10.9.0.32')], AbortSignal.timeout(300)), AbortedError);
  });
});
