// The NetworkPolicy source against the fake API server, with the real policy engine: Namespaces,
// Pods and NetworkPolicies listed (in pages) and watched into the engine; the deltas it emits,
// applied to an empty state, must equal the engine's snapshot, and the engine must equal a fresh
// engine fed the objects the server holds now (the truth) — after events, a burst of 410s with
// deletions only a re-list can see, an API server restart, and invalid updates (which keep the
// last valid version instead).
import assert from 'node:assert/strict';

import { PolicyEngine } from '../../src/policy/engine.js';
import { KubePolicySource } from '../../src/policy/kube-source.js';
import { applyDelta, emptySnapshot, type MutableSnapshot, type PolicyDelta, type PolicySnapshot } from '../../src/policy/model.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { KubeClient, loadKubeConfig } from '../../src/subnet/kube/client.js';
import type { LogFields, Logger } from '../../src/util/log.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { waitFor } from '../helpers/wait.js';
import { plainSnapshot } from '../helpers/policy-snapshot.js';

const NODE = 'n1';

interface Entry {
  readonly level: string;
  readonly msg: string;
  readonly fields: LogFields | undefined;
}

function memoryLogger(entries: Entry[]): Logger {
  const at = (level: string) => (msg: string, fields?: LogFields) => void entries.push({ level, msg, fields });
  const logger: Logger = { error: at('error'), warn: at('warn'), info: at('info'), debug: at('debug'), child: () => logger };
  return logger;
}


function pod(ns: string, name: string, node: string, ip: string, labels: Record<string, string>): JsonObject {
  return {
    metadata: { namespace: ns, name, labels },
    spec: { nodeName: node, containers: [{ name: 'main', image: 'x', ports: [{ name: 'http', containerPort: 80 }] }] },
    status: { phase: 'Running', podIP: ip, podIPs: [{ ip }] },
  };
}

function policy(ns: string, name: string, spec: JsonObject): JsonObject {
  return { metadata: { namespace: ns, name }, spec };
}

const denyIngress = (ns: string, name: string) => policy(ns, name, { podSelector: {}, policyTypes: ['Ingress'] });
const allowFrom = (ns: string, name: string, cidr: string) =>
  policy(ns, name, { podSelector: { matchLabels: { app: 'a' } }, ingress: [{ from: [{ ipBlock: { cidr } }], ports: [{ port: 'http' }] }] });

describe('policy: the Kubernetes source (fake API server, real engine)', function () {
  this.timeout(30_000);
  let fake: FakeKube;
  let source: KubePolicySource | null = null;
  let engine: PolicyEngine;
  let applied: MutableSnapshot;
  let batches: PolicyDelta[][];
  let logs: Entry[];

  beforeEach(async () => {
    fake = await FakeKube.start({ bookmarkIntervalMs: 200 });
    engine = new PolicyEngine(NODE);
    applied = emptySnapshot();
    batches = [];
    logs = [];
    fake.namespaces.put({ metadata: { name: 'x', labels: { team: 'red' } } });
    fake.namespaces.put({ metadata: { name: 'y', labels: { team: 'blue' } } });
    fake.pods.put(pod('x', 'a', NODE, '10.1.0.1', { app: 'a' }));
    fake.pods.put(pod('x', 'b', 'n2', '10.1.1.1', { app: 'b' }));
    fake.pods.put(pod('y', 'c', NODE, '10.1.0.2', { app: 'a' }));
    fake.pods.put(pod('y', 'd', 'n2', '10.1.1.2', { app: 'd' }));
    fake.networkPolicies.put(denyIngress('x', 'deny'));
    fake.networkPolicies.put(
      policy('x', 'from-blue', {
        podSelector: { matchLabels: { app: 'a' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'blue' } } }] }],
      }),
    );
  });

  afterEach(async () => {
    await source?.stop();
    source = null;
    await fake.stop();
  });

  function startSource(): KubePolicySource {
    // Pages of 1 so every list takes several requests at one resourceVersion.
    const client = new KubeClient(loadKubeConfig({ apiUrl: fake.url }), { pageSize: 1, requestTimeoutMs: 5000 });
    source = new KubePolicySource({
      client,
      engine,
      logger: memoryLogger(logs),
      onDeltas: (ds) => {
        batches.push([...ds]);
        for (const d of ds) applyDelta(applied, d);
      },
    });
    source.start();
    return source;
  }

  /** A fresh engine fed what the server holds now, skipping what does not parse. */
  function truth(): PolicyEngine {
    const e = new PolicyEngine(NODE);
    const tryParse = <T>(f: () => T): T | null => {
      try {
        return f();
      } catch {
        return null;
      }
    };
    for (const o of fake.namespaces.list()) {
      const ns = tryParse(() => parseNamespace(o));
      if (ns) e.upsertNamespace(ns);
    }
    for (const o of fake.pods.list()) {
      const p = tryParse(() => parsePod(o));
      if (p) e.upsertPod(p);
    }
    for (const o of fake.networkPolicies.list()) {
      const np = tryParse(() => parseNetworkPolicy(o));
      if (np) e.upsertPolicy(np);
    }
    return e;
  }

  /** Deltas applied so far = engine = truth. */
  async function converged(what: string, expected: () => PolicySnapshot = () => truth().snapshot()): Promise<void> {
    await waitFor(
      () => {
        assert.deepEqual(plainSnapshot(applied), plainSnapshot(engine.snapshot()), 'deltas applied ≠ engine snapshot');
        assert.deepEqual(plainSnapshot(engine.snapshot()), plainSnapshot(expected()), 'engine ≠ expected');
        return true;
      },
      { timeoutMs: 8000, what },
    );
  }

  const ingress = (key: string) => applied.pods.get(key)?.ingress;
  const watches = (path: string) => fake.requests.filter((r) => r.watch && r.path === path);

  it('lists the three resources in pages into the engine and reports synced', async () => {
    const src = startSource();
    await src.synced;
    assert.equal(src.isSynced(), true);
    assert.deepEqual(src.counts(), { namespaces: 2, pods: 4, networkpolicies: 2 });
    await converged('initial sync');
    // Local pods only: x/a is selected by both policies, y/c by none.
    const xa = ingress('x/a');
    assert.ok(xa?.isolated && xa.rules.length === 1, JSON.stringify(xa));
    assert.deepEqual(ingress('y/c'), { isolated: false });
    assert.equal(applied.pods.has('x/b'), false);
    for (const path of ['/api/v1/namespaces', '/api/v1/pods', '/apis/networking.k8s.io/v1/networkpolicies']) {
      const lists = fake.requests.filter((r) => !r.watch && r.path === path);
      assert.ok(lists.some((r) => r.query['continue']), `${path} listed in pages`);
      await waitFor(() => watches(path).some((r) => r.query['allowWatchBookmarks'] === 'true' && r.query['resourceVersion']), { what: `${path} watched from the list` });
    }
  });

  it('turns create, update and delete events into deltas', async () => {
    const src = startSource();
    await src.synced;
    await converged('initial sync');
    const before = batches.length;
    // A new local pod in x: default deny plus the namespace rule.
    fake.pods.put(pod('x', 'e', NODE, '10.1.0.3', { app: 'a' }));
    await converged('pod added');
    assert.ok(ingress('x/e')?.isolated);
    // y changes team: the from-blue rule's peer set loses y's pods.
    fake.namespaces.update('y', (o) => {
      (o.metadata as JsonObject).labels = { team: 'green', 'kubernetes.io/metadata.name': 'y' };
    });
    await converged('namespace relabelled');
    // A pod's label change moves it out of from-blue's selection.
    fake.pods.update('x/a', (o) => {
      (o.metadata as JsonObject).labels = { app: 'z' };
    });
    await converged('pod relabelled');
    fake.networkPolicies.put(allowFrom('x', 'web', '192.168.0.0/16'));
    await converged('policy added');
    fake.networkPolicies.delete('x/deny');
    fake.networkPolicies.delete('x/from-blue');
    await converged('policies deleted');
    assert.deepEqual(ingress('x/a'), { isolated: false });
    fake.pods.delete('x', 'e');
    fake.namespaces.delete('y');
    await converged('pod and namespace deleted');
    assert.equal(applied.pods.has('x/e'), false);
    assert.ok(batches.length > before, 'deltas delivered');
    assert.ok(batches.every((b) => b.length > 0), 'no empty batch');
    assert.deepEqual(src.counts(), { namespaces: 1, pods: 4, networkpolicies: 1 });
  });

  it('re-lists through a burst of 410s, and removes what was deleted while no watch ran', async () => {
    const src = startSource();
    await src.synced;
    await converged('initial sync');
    fake.compactContinuously(true);
    // Only a re-list can see these: every watch from a resourceVersion is 410 now.
    fake.networkPolicies.delete('x/deny');
    fake.pods.delete('y', 'c');
    fake.pods.put(pod('y', 'f', NODE, '10.1.0.9', { app: 'a' }));
    fake.namespaces.delete('y');
    await converged('caught up during the burst');
    assert.equal(applied.pods.has('y/c'), false);
    assert.ok(applied.pods.has('y/f'));
    for (const path of ['/api/v1/pods', '/apis/networking.k8s.io/v1/networkpolicies']) {
      assert.ok(watches(path).some((r) => r.watchError === 410), `${path}: a watch got 410`);
    }
    // Page tokens expire too: the pods (more than a page) were listed again in one piece.
    const podLists = fake.requests.filter((r) => !r.watch && r.path === '/api/v1/pods');
    assert.ok(podLists.some((r) => r.query['continue'] && r.status === 410), 'a page token expired');
    assert.ok(podLists.some((r) => r.query['limit'] === undefined && r.status === 200), 'listed in one piece');
    fake.compactContinuously(false);
    // Watching again: a change arrives as an event.
    fake.networkPolicies.put(denyIngress('x', 'deny-again'));
    await converged('after the burst');
    assert.ok(logs.some((e) => /watch expired \(410\)/.test(e.msg)));
  });

  it('keeps the last valid version of a policy whose update does not parse, and logs it once per version', async () => {
    const src = startSource();
    fake.networkPolicies.put(allowFrom('x', 'web', '192.168.0.0/16'));
    await src.synced;
    await converged('initial sync');
    const good = engine.snapshot();
    const goodPlain = plainSnapshot(good);
    fake.networkPolicies.update('x/web', (o) => {
      (o.spec as JsonObject).ingress = [{ from: [{ ipBlock: { cidr: '192.168.0.0/33' } }] }];
    });
    const invalidLogs = () => logs.filter((e) => /invalid update ignored; keeping the last valid version/.test(e.msg) && e.fields?.['object'] === 'x/web');
    await waitFor(() => invalidLogs().length === 1, { what: 'the invalid update logged' });
    assert.deepEqual(plainSnapshot(engine.snapshot()), goodPlain, 'old version kept');
    // A re-list sees the same bad version: still kept, not logged again.
    const lists = fake.requests.filter((r) => !r.watch && r.path === '/apis/networking.k8s.io/v1/networkpolicies').length;
    fake.breakWatches();
    await waitFor(() => fake.requests.filter((r) => !r.watch && r.path === '/apis/networking.k8s.io/v1/networkpolicies' && r.status === 200).length > lists, { what: 're-list' });
    await converged('re-listed', () => good);
    assert.equal(invalidLogs().length, 1);
    // A brand-new invalid policy is not in the engine at all (nothing to keep), and logged.
    fake.networkPolicies.put(policy('y', 'bad', { podSelector: { matchLabels: { 'bad key!': 'v' } } }));
    await waitFor(() => logs.some((e) => /invalid object ignored/.test(e.msg) && e.fields?.['object'] === 'y/bad'), { what: 'new invalid policy logged' });
    assert.deepEqual(plainSnapshot(engine.snapshot()), goodPlain);
    // A later valid version replaces the kept one; a deletion removes it.
    fake.networkPolicies.update('x/web', (o) => {
      (o.spec as JsonObject).ingress = [{ from: [{ ipBlock: { cidr: '172.16.0.0/12' } }] }];
    });
    await converged('valid again');
    fake.networkPolicies.delete('x/web');
    fake.networkPolicies.delete('y/bad');
    await converged('deleted');
    assert.equal(src.counts().networkpolicies, 2);
  });

  it('resumes after an API server restart, catching up with what changed during it', async () => {
    const src = startSource();
    await src.synced;
    await converged('initial sync');
    await fake.pause();
    // Written to the store (etcd) while the server is down.
    fake.pods.put(pod('x', 'g', NODE, '10.1.0.7', { app: 'a' }));
    fake.pods.delete('x', 'b');
    fake.networkPolicies.delete('x/from-blue');
    await new Promise((r) => setTimeout(r, 300));
    await fake.resume({ freshWatchCache: true });
    await converged('after the restart');
    assert.ok(ingress('x/g')?.isolated);
    await waitFor(() => fake.openWatches() === 3, { what: 'one watch per resource again' });
    fake.networkPolicies.delete('x/deny');
    await converged('watching again');
    assert.deepEqual(ingress('x/g'), { isolated: false });
  });

  it('is synced only once all three lists are done', async () => {
    // The policy list fails a few times: namespaces and pods are listed long before.
    fake.failNext(4, 500, (r) => !r.watch && r.path === '/apis/networking.k8s.io/v1/networkpolicies');
    let resolved = false;
    const src = startSource();
    void src.synced.then(() => (resolved = true));
    await waitFor(() => src.counts().pods === 4 && src.counts().namespaces === 2, { what: 'namespaces and pods listed' });
    assert.equal(src.isSynced(), false);
    assert.equal(resolved, false);
    await src.synced;
    assert.deepEqual(src.counts(), { namespaces: 2, pods: 4, networkpolicies: 2 });
    await converged('synced');
    assert.ok(logs.some((e) => /networkpolicies list\/watch failed/.test(e.msg)));
  });

  it('the fake serves the three collections with kinds, selectors and namespaced keys', async () => {
    const get = async (path: string) => (await (await fetch(fake.url + path)).json()) as JsonObject;
    const pods = await get('/api/v1/pods?fieldSelector=spec.nodeName%3Dn1');
    assert.equal(pods.kind, 'PodList');
    assert.deepEqual((pods.items as JsonObject[]).map((p) => {
      const meta = p.metadata as Record<string, string>;
      return `${meta.namespace}/${meta.name}`;
    }), ['x/a', 'y/c']);
    const nps = await get('/apis/networking.k8s.io/v1/networkpolicies?labelSelector=nope');
    assert.deepEqual([nps.kind, nps.apiVersion, (nps.items as JsonObject[]).length], ['NetworkPolicyList', 'networking.k8s.io/v1', 0]);
    const nss = await get('/api/v1/namespaces');
    assert.deepEqual((nss.items as JsonObject[]).map((n) => (n.metadata as JsonObject).labels), [
      { team: 'red', 'kubernetes.io/metadata.name': 'x' },
      { team: 'blue', 'kubernetes.io/metadata.name': 'y' },
    ]);
    // A Node watch does not see pods, and Node lists are unchanged.
    const nodes = await get('/api/v1/nodes');
    assert.deepEqual([nodes.kind, (nodes.items as JsonObject[]).length], ['NodeList', 0]);
  });

  it('rejects synced when stopped before the first lists', async () => {
    await fake.pause();
    const src = startSource();
    await new Promise((r) => setTimeout(r, 200));
    await src.stop();
    source = null;
    await assert.rejects(src.synced, /aborted/);
    await fake.resume();
  });
});
