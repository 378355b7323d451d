// The fake kube-apiserver driven over real HTTP: with plain fetch for the protocol details, and with
// @kubernetes/client-node (the client weft uses) for an informer that must survive a 410.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { makeTestPki } from '../helpers/certs.js';
import { FakeKube, type FakeKubeOptions, type Json, type JsonObject } from '../helpers/fake-kube.js';
import { waitFor } from '../helpers/wait.js';

interface WatchEvent {
  readonly type: string;
  readonly object: JsonObject;
}

/** Reads a watch stream into `events`; `done` settles with null on a clean end, the error on a broken one. */
class WatchReader {
  readonly events: WatchEvent[] = [];
  readonly done: Promise<Error | null>;
  private readonly ctl = new AbortController();
  status = 0;

  constructor(url: string, headers: Record<string, string> = {}) {
    this.done = this.run(url, headers);
  }

  private async run(url: string, headers: Record<string, string>): Promise<Error | null> {
    try {
      const res = await fetch(url, { headers, signal: this.ctl.signal });
      this.status = res.status;
      if (!res.body) return new Error('no body');
      const dec = new TextDecoder();
      let buf = '';
      for await (const chunk of res.body) {
        buf += dec.decode(chunk as Uint8Array, { stream: true });
        let nl: number;
        while ((nl = buf.indexOf('\n')) >= 0) {
          this.events.push(JSON.parse(buf.slice(0, nl)) as WatchEvent);
          buf = buf.slice(nl + 1);
        }
      }
      return null;
    } catch (e) {
      return e instanceof Error ? e : new Error(String(e));
    }
  }

  close(): void {
    this.ctl.abort();
  }

  summary(): string[] {
    return this.events.map((e) => `${e.type} ${name(e.object)} ${rv(e.object)}`);
  }
}

function meta(o: Json | undefined): JsonObject {
  return typeof o === 'object' && o !== null && !Array.isArray(o) && typeof o.metadata === 'object' && o.metadata !== null && !Array.isArray(o.metadata) ? o.metadata : {};
}
const text = (v: Json | undefined): string => (typeof v === 'string' ? v : JSON.stringify(v ?? ''));
const name = (o: Json | undefined): string => text(meta(o).name);
const rv = (o: Json | undefined): string => text(meta(o).resourceVersion);

async function call(
  url: string,
  method: string,
  body?: Json,
  contentType = 'application/json',
  headers: Record<string, string> = {},
): Promise<{ status: number; json: JsonObject }> {
  const init: RequestInit = { method, headers: { ...headers, 'content-type': contentType } };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(url, init);
  return { status: res.status, json: (await res.json()) as JsonObject };
}

describe('fake kube-apiserver', function () {
  this.timeout(20_000);
  let fake: FakeKube;
  const readers: WatchReader[] = [];

  async function startFake(opts: FakeKubeOptions = {}): Promise<FakeKube> {
    fake = await FakeKube.start(opts);
    fake.nodes.create('node-a', { labels: { role: 'worker' }, spec: { podCIDR: '10.244.0.0/24', podCIDRs: ['10.244.0.0/24'] } });
    fake.nodes.create('node-b', { labels: { role: 'control' }, spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24'] } });
    return fake;
  }
  function watch(query: string): WatchReader {
    const r = new WatchReader(`${fake.url}/api/v1/nodes?watch=true&${query}`);
    readers.push(r);
    return r;
  }

  afterEach(async () => {
    for (const r of readers.splice(0)) r.close();
    await fake.stop();
  });

  describe('list and get', () => {
    beforeEach(() => startFake({ initialResourceVersion: 500 }));

    it('lists nodes sorted by name with the current resourceVersion', async () => {
      const { status, json } = await call(`${fake.url}/api/v1/nodes`, 'GET');
      assert.equal(status, 200);
      assert.equal(json.kind, 'NodeList');
      assert.equal(json.apiVersion, 'v1');
      assert.deepEqual(json.metadata, { resourceVersion: '502' });
      assert.ok(Array.isArray(json.items));
      assert.deepEqual(json.items.map(name), ['node-a', 'node-b']);
      assert.deepEqual(json.items.map(rv), ['501', '502']);
      const a = json.items[0] as JsonObject;
      assert.equal(a.kind, undefined); // as on a real server: only the list has kind/apiVersion
      assert.deepEqual(a.spec, { podCIDR: '10.244.0.0/24', podCIDRs: ['10.244.0.0/24'] });
      assert.match(text(meta(a).uid), /^[0-9a-f-]{36}$/);
      assert.match(text(meta(a).creationTimestamp), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    });

    it('filters by labelSelector and fieldSelector', async () => {
      const byLabel = await call(`${fake.url}/api/v1/nodes?labelSelector=${encodeURIComponent('role in (worker,x)')}`, 'GET');
      assert.deepEqual((byLabel.json.items as Json[]).map(name), ['node-a']);
      const notLabel = await call(`${fake.url}/api/v1/nodes?labelSelector=role!%3Dworker`, 'GET');
      assert.deepEqual((notLabel.json.items as Json[]).map(name), ['node-b']);
      const byField = await call(`${fake.url}/api/v1/nodes?fieldSelector=metadata.name%3Dnode-b`, 'GET');
      assert.deepEqual((byField.json.items as Json[]).map(name), ['node-b']);
      const bad = await call(`${fake.url}/api/v1/nodes?fieldSelector=spec.podCIDR%3Dx`, 'GET');
      assert.equal(bad.status, 400);
      assert.deepEqual(bad.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message: 'field label not supported: spec.podCIDR',
        reason: 'BadRequest',
        code: 400,
      });
    });

    it('paginates with limit/continue at one resourceVersion', async () => {
      fake.nodes.create('node-c');
      const p1 = await call(`${fake.url}/api/v1/nodes?limit=2`, 'GET');
      assert.deepEqual((p1.json.items as Json[]).map(name), ['node-a', 'node-b']);
      const m = meta(p1.json);
      assert.equal(m.resourceVersion, '503');
      assert.equal(m.remainingItemCount, 1);
      fake.nodes.delete('node-c'); // the continuation still sees the snapshot at 503
      const p2 = await call(`${fake.url}/api/v1/nodes?limit=2&continue=${encodeURIComponent(text(m.continue))}`, 'GET');
      assert.deepEqual((p2.json.items as Json[]).map(name), ['node-c']);
      assert.deepEqual(p2.json.metadata, { resourceVersion: '503' });
    });

    it('gets one node, and a Status 404 for a missing one', async () => {
      const ok = await call(`${fake.url}/api/v1/nodes/node-b`, 'GET');
      assert.equal(ok.status, 200);
      assert.equal(name(ok.json), 'node-b');
      const missing = await call(`${fake.url}/api/v1/nodes/nope`, 'GET');
      assert.equal(missing.status, 404);
      assert.deepEqual(missing.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message: 'nodes "nope" not found',
        reason: 'NotFound',
        details: { name: 'nope', kind: 'nodes' },
        code: 404,
      });
    });

    it('creates with POST (409 AlreadyExists on repeat) and deletes with a Success Status', async () => {
      const w = watch(`resourceVersion=${fake.resourceVersion()}`);
      const body = { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-c', labels: { a: 'b' } } };
      const created = await call(`${fake.url}/api/v1/nodes`, 'POST', body);
      assert.equal(created.status, 201);
      assert.equal(rv(created.json), '503');
      const again = await call(`${fake.url}/api/v1/nodes`, 'POST', body);
      assert.equal(again.status, 409);
      assert.equal(again.json.reason, 'AlreadyExists');
      assert.equal(again.json.message, 'nodes "node-c" already exists');
      const del = await call(`${fake.url}/api/v1/nodes/node-c`, 'DELETE');
      assert.equal(del.status, 200);
      assert.deepEqual(del.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Success',
        details: { name: 'node-c', kind: 'nodes', uid: meta(created.json).uid ?? '' },
      });
      await waitFor(() => w.events.length >= 2, { what: 'create/delete events' });
      assert.deepEqual(w.summary(), ['ADDED node-c 503', 'DELETED node-c 504']);
    });

    it('serves a pod by namespace and name (for POD_NAME/POD_NAMESPACE)', async () => {
      fake.pods.create('kube-flannel', 'weft-xyz', 'node-b');
      const ok = await call(`${fake.url}/api/v1/namespaces/kube-flannel/pods/weft-xyz`, 'GET');
      assert.equal(ok.status, 200);
      assert.equal(ok.json.kind, 'Pod');
      assert.deepEqual(meta(ok.json).namespace, 'kube-flannel');
      assert.equal((ok.json.spec as JsonObject).nodeName, 'node-b');
      const missing = await call(`${fake.url}/api/v1/namespaces/other/pods/weft-xyz`, 'GET');
      assert.equal(missing.status, 404);
      assert.equal(missing.json.message, 'pods "weft-xyz" not found');
    });
  });

  describe('watch', () => {
    beforeEach(() => startFake({ initialResourceVersion: 100, bookmarkIntervalMs: 100 }));

    it('replays ADDED/MODIFIED/DELETED after a resourceVersion, in order, then streams live', async () => {
      const from = fake.resourceVersion(); // 102
      fake.nodes.create('node-c');
      fake.nodes.update('node-a', (n) => {
        (n.metadata as JsonObject).annotations = { x: '1' };
      });
      fake.nodes.delete('node-b');
      const w = watch(`resourceVersion=${from}`);
      await waitFor(() => w.events.length >= 3, { what: 'replayed events' });
      fake.nodes.create('node-d');
      await waitFor(() => w.events.length >= 4, { what: 'live event' });
      assert.deepEqual(w.summary(), ['ADDED node-c 103', 'MODIFIED node-a 104', 'DELETED node-b 105', 'ADDED node-d 106']);
      assert.deepEqual(meta(w.events[1]?.object).annotations, { x: '1' });
      assert.equal(w.status, 200);
      assert.equal(fake.openWatches(), 1);
    });

    it('starts with synthetic ADDED events when no resourceVersion is given', async () => {
      const w = watch('resourceVersion=0');
      await waitFor(() => w.events.length >= 2, { what: 'initial events' });
      assert.deepEqual(w.summary(), ['ADDED node-a 101', 'ADDED node-b 102']);
    });

    it('turns selector transitions into ADDED/DELETED', async () => {
      const w = watch(`resourceVersion=${fake.resourceVersion()}&labelSelector=role%3Dworker`);
      await waitFor(() => fake.openWatches() === 1, { what: 'watch registered' });
      fake.nodes.update('node-a', (n) => {
        (n.metadata as JsonObject).labels = { role: 'spare' };
      });
      fake.nodes.update('node-b', (n) => {
        (n.metadata as JsonObject).labels = { role: 'worker' };
      });
      await waitFor(() => w.events.length >= 2, { what: 'transition events' });
      assert.deepEqual(w.summary(), ['DELETED node-a 103', 'ADDED node-b 104']);
      // The DELETED carries the last state that matched.
      assert.deepEqual(meta(w.events[0]?.object).labels, { role: 'worker' });
    });

    it('sends BOOKMARK events only when asked', async () => {
      const plain = watch(`resourceVersion=${fake.resourceVersion()}`);
      const w = watch(`resourceVersion=${fake.resourceVersion()}&allowWatchBookmarks=true`);
      await waitFor(() => w.events.length >= 2, { what: 'two bookmarks' });
      const b = w.events[0];
      assert.equal(b?.type, 'BOOKMARK');
      assert.equal(b.object.kind, 'Node');
      assert.deepEqual(b.object.metadata, { resourceVersion: '102', creationTimestamp: null });
      fake.bookmarkNow();
      fake.nodes.create('node-c');
      await waitFor(() => plain.events.length >= 1, { what: 'event on plain watch' });
      assert.deepEqual(plain.summary(), ['ADDED node-c 103']);
    });

    it('ends the stream cleanly at timeoutSeconds', async () => {
      const started = Date.now();
      const w = watch(`resourceVersion=${fake.resourceVersion()}&timeoutSeconds=1`);
      assert.equal(await w.done, null);
      const took = Date.now() - started;
      assert.ok(took >= 900 && took < 5000, `stream lasted ${took} ms`);
      assert.equal(fake.openWatches(), 0);
    });

    it('answers a compacted resourceVersion with one ERROR 410 Expired event', async () => {
      const old = fake.resourceVersion(); // 102
      fake.nodes.create('node-c'); // 103
      fake.compactBefore(103);
      const w = watch(`resourceVersion=${old}`);
      assert.equal(await w.done, null);
      assert.equal(w.status, 200);
      assert.deepEqual(w.events, [
        {
          type: 'ERROR',
          object: {
            kind: 'Status',
            apiVersion: 'v1',
            metadata: {},
            status: 'Failure',
            message: 'too old resource version: 102 (103)',
            reason: 'Expired',
            code: 410,
          },
        },
      ]);
      // From the compaction point on, history is still there.
      const ok = watch('resourceVersion=103');
      fake.nodes.delete('node-c');
      await waitFor(() => ok.events.length >= 1, { what: 'event after compaction point' });
      assert.deepEqual(ok.summary(), ['DELETED node-c 104']);
      // An exact list follows the same floor, and serves history above it.
      const gone = await call(`${fake.url}/api/v1/nodes?resourceVersion=102&resourceVersionMatch=Exact`, 'GET');
      assert.equal(gone.status, 410);
      assert.equal(gone.json.reason, 'Expired');
      assert.equal(gone.json.message, 'The resourceVersion for the provided list is too old.');
      const exact = await call(`${fake.url}/api/v1/nodes?resourceVersion=103&resourceVersionMatch=Exact`, 'GET');
      assert.deepEqual((exact.json.items as Json[]).map(name), ['node-a', 'node-b', 'node-c']);
      assert.deepEqual(exact.json.metadata, { resourceVersion: '103' });
    });

    it('breakWatches drops open streams without a clean end', async () => {
      const w1 = watch(`resourceVersion=${fake.resourceVersion()}`);
      const w2 = watch('resourceVersion=0');
      await waitFor(() => fake.openWatches() === 2, { what: 'two watches' });
      assert.equal(fake.breakWatches(), 2);
      const [e1, e2] = await Promise.all([w1.done, w2.done]);
      assert.ok(e1 instanceof Error, 'first watch should fail, not end');
      assert.ok(e2 instanceof Error, 'second watch should fail, not end');
      assert.equal(fake.openWatches(), 0);
      // endWatches is the clean variant.
      const w3 = watch(`resourceVersion=${fake.resourceVersion()}`);
      await waitFor(() => fake.openWatches() === 1, { what: 'third watch' });
      assert.equal(fake.endWatches(), 1);
      assert.equal(await w3.done, null);
    });
  });

  describe('patch and update', () => {
    beforeEach(async () => {
      await startFake({ initialResourceVersion: 10 });
      fake.nodes.update('node-a', (n) => {
        n.status = {
          conditions: [
            { type: 'Ready', status: 'True', reason: 'KubeletReady' },
            { type: 'NetworkUnavailable', status: 'True', reason: 'NoRouteCreated' },
          ],
        };
      });
    });
    const nodeUrl = (sub = ''): string => `${fake.url}/api/v1/nodes/node-a${sub}`;

    it('merge-patches annotations through nodes/status, ignoring spec there', async () => {
      const body = {
        metadata: { annotations: { 'flannel.alpha.coreos.com/public-ip': '10.0.0.1' } },
        spec: { unschedulable: true },
      };
      const { status, json } = await call(nodeUrl('/status'), 'PATCH', body, 'application/merge-patch+json');
      assert.equal(status, 200);
      assert.deepEqual(meta(json).annotations, { 'flannel.alpha.coreos.com/public-ip': '10.0.0.1' });
      assert.deepEqual(json.spec, { podCIDR: '10.244.0.0/24', podCIDRs: ['10.244.0.0/24'] });
      assert.equal(rv(json), '14');
      assert.deepEqual(fake.nodes.get('node-a'), json);
    });

    it('ignores status in a patch of the main resource', async () => {
      const body = { metadata: { labels: { a: 'b' } }, status: { conditions: [] } };
      const { json } = await call(nodeUrl(), 'PATCH', body, 'application/merge-patch+json');
      assert.deepEqual(meta(json).labels, { role: 'worker', a: 'b' });
      assert.equal(((json.status as JsonObject).conditions as Json[]).length, 2);
    });

    it('strategic-merges status.conditions by type', async () => {
      const body = {
        status: { conditions: [{ type: 'NetworkUnavailable', status: 'False', reason: 'FlannelIsUp', message: 'Flannel is running on this node' }] },
      };
      const { status, json } = await call(nodeUrl('/status'), 'PATCH', body, 'application/strategic-merge-patch+json');
      assert.equal(status, 200);
      assert.deepEqual((json.status as JsonObject).conditions, [
        { type: 'Ready', status: 'True', reason: 'KubeletReady' },
        { type: 'NetworkUnavailable', status: 'False', reason: 'FlannelIsUp', message: 'Flannel is running on this node' },
      ]);
      // The same body as a merge patch replaces the list.
      const merged = await call(nodeUrl('/status'), 'PATCH', body, 'application/merge-patch+json');
      assert.deepEqual(((merged.json.status as JsonObject).conditions as Json[]).length, 1);
    });

    it('strategic merge handles $patch delete, null and primitive merge lists', async () => {
      await call(nodeUrl('/status'), 'PATCH', { metadata: { annotations: { keep: '1', drop: '2' } } }, 'application/strategic-merge-patch+json');
      const body = {
        metadata: { annotations: { drop: null }, finalizers: ['x'] },
        status: { conditions: [{ type: 'Ready', $patch: 'delete' }] },
      };
      const { json } = await call(nodeUrl('/status'), 'PATCH', body, 'application/strategic-merge-patch+json');
      assert.deepEqual(meta(json).annotations, { keep: '1' });
      assert.deepEqual(meta(json).finalizers, ['x']);
      assert.deepEqual((json.status as JsonObject).conditions, [{ type: 'NetworkUnavailable', status: 'True', reason: 'NoRouteCreated' }]);
    });

    it('applies RFC 6902 JSON patches, and a failed test is 422', async () => {
      const ops: Json = [
        { op: 'test', path: '/metadata/name', value: 'node-a' },
        { op: 'add', path: '/metadata/annotations', value: { 'a/b': '1' } },
        { op: 'replace', path: '/metadata/annotations/a~1b', value: '2' },
        { op: 'add', path: '/status/conditions/-', value: { type: 'X', status: 'True' } },
        { op: 'remove', path: '/status/conditions/0' },
      ];
      const { status, json } = await call(nodeUrl('/status'), 'PATCH', ops, 'application/json-patch+json');
      assert.equal(status, 200);
      assert.deepEqual(meta(json).annotations, { 'a/b': '2' });
      assert.deepEqual(((json.status as JsonObject).conditions as JsonObject[]).map((c) => c.type), ['NetworkUnavailable', 'X']);
      const failed = await call(nodeUrl(), 'PATCH', [{ op: 'test', path: '/metadata/name', value: 'other' }], 'application/json-patch+json');
      assert.equal(failed.status, 422);
      assert.deepEqual(failed.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message: 'the server rejected our request due to an error in our request',
        reason: 'Invalid',
        details: {},
        code: 422,
      });
      assert.equal(rv(fake.nodes.get('node-a')), rv(json));
    });

    it('409 Conflict for a stale resourceVersion in a patch; the current one passes', async () => {
      const current = rv(fake.nodes.get('node-a'));
      const stale = await call(nodeUrl('/status'), 'PATCH', { metadata: { resourceVersion: '11', labels: { z: '1' } } }, 'application/merge-patch+json');
      assert.equal(stale.status, 409);
      assert.deepEqual(stale.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message: 'Operation cannot be fulfilled on nodes "node-a": the object has been modified; please apply your changes to the latest version and try again',
        reason: 'Conflict',
        details: { name: 'node-a', kind: 'nodes' },
        code: 409,
      });
      const ok = await call(nodeUrl('/status'), 'PATCH', { metadata: { resourceVersion: current, labels: { z: '1' } } }, 'application/merge-patch+json');
      assert.equal(ok.status, 200);
      assert.equal(rv(ok.json), String(Number(current) + 1));
    });

    it('PUT nodes/status: 409 on mismatch, applies status on match', async () => {
      const node = fake.nodes.get('node-a');
      assert.ok(node);
      (node.status as JsonObject).conditions = [];
      (meta(node)).resourceVersion = '1';
      const stale = await call(nodeUrl('/status'), 'PUT', node);
      assert.equal(stale.status, 409);
      assert.equal(stale.json.reason, 'Conflict');
      meta(node).resourceVersion = rv(fake.nodes.get('node-a'));
      const ok = await call(nodeUrl('/status'), 'PUT', node);
      assert.equal(ok.status, 200);
      assert.deepEqual((ok.json.status as JsonObject).conditions, []);
    });

    it('a no-op patch keeps the resourceVersion and emits no event', async () => {
      const before = rv(fake.nodes.get('node-a'));
      const w = watch(`resourceVersion=${before}`);
      await waitFor(() => fake.openWatches() === 1, { what: 'watch' });
      const same = await call(nodeUrl('/status'), 'PATCH', { metadata: { labels: { role: 'worker' } } }, 'application/merge-patch+json');
      assert.equal(rv(same.json), before);
      const changed = await call(nodeUrl('/status'), 'PATCH', { metadata: { labels: { role: 'x' } } }, 'application/merge-patch+json');
      await waitFor(() => w.events.length >= 1, { what: 'event' });
      assert.deepEqual(w.summary(), [`MODIFIED node-a ${rv(changed.json)}`]);
      assert.equal(Number(rv(changed.json)), Number(before) + 1);
    });

    it('rejects podCIDR changes, bad maps, renames and unknown content types', async () => {
      const cidr = await call(nodeUrl(), 'PATCH', { spec: { podCIDR: '10.9.0.0/24', podCIDRs: ['10.9.0.0/24'] } }, 'application/merge-patch+json');
      assert.equal(cidr.status, 422);
      assert.equal(cidr.json.message, 'Node "node-a" is invalid: spec.podCIDRs: Forbidden: node updates may not change podCIDR except from "" to valid');
      const num = await call(nodeUrl(), 'PATCH', { metadata: { annotations: { a: 1 } } }, 'application/merge-patch+json');
      assert.equal(num.status, 400);
      const rename = await call(nodeUrl(), 'PATCH', { metadata: { name: 'node-z' } }, 'application/merge-patch+json');
      assert.equal(rename.status, 400);
      assert.equal(rename.json.message, 'the name of the object (node-z) does not match the name on the URL (node-a)');
      const bad = await call(nodeUrl(), 'PATCH', { metadata: {} }, 'application/json');
      assert.equal(bad.status, 415);
      assert.deepEqual(bad.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message:
          'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml',
        reason: 'UnsupportedMediaType',
        code: 415,
      });
      const missing = await call(`${fake.url}/api/v1/nodes/nope/status`, 'PATCH', {}, 'application/merge-patch+json');
      assert.equal(missing.status, 404);
    });
  });

  describe('auth and failure injection', () => {
    it('401 without or with a wrong bearer token, 200 with the right one', async () => {
      await startFake({ token: 's3cret' });
      const none = await call(`${fake.url}/api/v1/nodes`, 'GET');
      assert.equal(none.status, 401);
      assert.deepEqual(none.json, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message: 'Unauthorized',
        reason: 'Unauthorized',
        code: 401,
      });
      const wrong = await call(`${fake.url}/api/v1/nodes`, 'GET', undefined, 'application/json', { authorization: 'Bearer nope' });
      assert.equal(wrong.status, 401);
      const watchNoAuth = await fetch(`${fake.url}/api/v1/nodes?watch=true`);
      assert.equal(watchNoAuth.status, 401);
      await watchNoAuth.body?.cancel();
      const ok = await call(`${fake.url}/api/v1/nodes`, 'GET', undefined, 'application/json', { authorization: 'Bearer s3cret' });
      assert.equal(ok.status, 200);
      assert.deepEqual(
        fake.requests.map((r) => r.status),
        [401, 401, 401, 200],
      );
    });

    it('with anonymousAuth, a request without credentials is 403 for system:anonymous', async () => {
      await startFake({ token: 's3cret', anonymousAuth: true });
      const none = await call(`${fake.url}/api/v1/nodes`, 'GET');
      assert.equal(none.status, 403);
      assert.equal(none.json.message, 'nodes is forbidden: User "system:anonymous" cannot list resource "nodes" in API group "" at the cluster scope');
      const wrong = await call(`${fake.url}/api/v1/nodes`, 'GET', undefined, 'application/json', { authorization: 'Bearer x' });
      assert.equal(wrong.status, 401);
    });

    it('failNext fails exactly n matching requests with a Status body', async () => {
      await startFake();
      fake.failNext(2, 500, (r) => r.method === 'GET' && !r.watch);
      const codes: number[] = [];
      for (let i = 0; i < 3; i++) codes.push((await call(`${fake.url}/api/v1/nodes`, 'GET')).status);
      assert.deepEqual(codes, [500, 500, 200]);
      fake.failNext(1, 429);
      const limited = await fetch(`${fake.url}/api/v1/nodes`);
      assert.equal(limited.status, 429);
      assert.equal(limited.headers.get('retry-after'), '1');
      assert.equal(((await limited.json()) as JsonObject).reason, 'TooManyRequests');
    });

    it('pause/resume: connection refused while paused, same state after', async () => {
      await startFake();
      const url = fake.url;
      await fake.pause();
      await assert.rejects(fetch(`${url}/api/v1/nodes`));
      fake.nodes.create('node-c');
      await fake.resume();
      assert.equal(fake.url, url);
      const { json } = await call(`${url}/api/v1/nodes`, 'GET');
      assert.deepEqual((json.items as Json[]).map(name), ['node-a', 'node-b', 'node-c']);
    });
  });

  const clientNode = existsSync('node_modules/@kubernetes/client-node/package.json');
  (clientNode ? describe : describe.skip)('with @kubernetes/client-node', () => {
    it('an informer sees add/update/delete and relists after 410', async () => {
      const k8s = await import('@kubernetes/client-node');
      await startFake({ token: 'tok' });
      const kc = new k8s.KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'fake', server: fake.url, skipTLSVerify: true }],
        users: [{ name: 'u', token: 'tok' }],
        contexts: [{ name: 'c', cluster: 'fake', user: 'u' }],
        currentContext: 'c',
      });
      const api = kc.makeApiClient(k8s.CoreV1Api);
      const informer = k8s.makeInformer(kc, '/api/v1/nodes', () => api.listNode());
      const log: string[] = [];
      const errors: unknown[] = [];
      informer.on('add', (n) => log.push(`add ${n.metadata?.name ?? ''}`));
      informer.on('update', (n) => log.push(`update ${n.metadata?.name ?? ''} ${n.metadata?.annotations?.k ?? ''}`));
      informer.on('delete', (n) => log.push(`delete ${n.metadata?.name ?? ''}`));
      informer.on('error', (e) => errors.push(e));
      await informer.start();
      try {
        await waitFor(() => fake.openWatches() === 1, { what: 'informer watch' });
        assert.deepEqual(log.splice(0), ['add node-a', 'add node-b']);

        fake.nodes.create('node-c');
        await api.patchNodeStatus(
          { name: 'node-a', body: { metadata: { annotations: { k: 'v1' } } } },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
        );
        fake.nodes.delete('node-b');
        await waitFor(() => log.length >= 3, { what: 'informer events' });
        assert.deepEqual(log.splice(0), ['add node-c', 'update node-a v1', 'delete node-b']);

        // Changes the informer misses: its re-watch is from a compacted rv → ERROR 410 → relist.
        const listsBefore = fake.requests.filter((r) => r.path === '/api/v1/nodes' && !r.watch).length;
        fake.endWatches();
        fake.nodes.delete('node-c');
        fake.nodes.create('node-d');
        fake.nodes.update('node-a', (n) => {
          (n.metadata as JsonObject).annotations = { k: 'v2' };
        });
        fake.compactBefore(fake.resourceVersion());
        await waitFor(() => log.length >= 3, { what: 'events after relist' });
        assert.deepEqual([...log].sort(), ['add node-d', 'delete node-c', 'update node-a v2']);
        assert.equal(fake.requests.filter((r) => r.path === '/api/v1/nodes' && !r.watch).length, listsBefore + 1);
        assert.deepEqual(informer.list().map((n) => n.metadata?.name).sort(), ['node-a', 'node-d']);
        await waitFor(() => fake.openWatches() === 1, { what: 'informer re-watch' });
        const lastWatch = fake.requests.filter((r) => r.watch).at(-1);
        assert.equal(lastWatch?.query.resourceVersion, fake.resourceVersion());
        assert.equal(lastWatch?.headers.authorization, 'Bearer tok');
        const patchReq = fake.requests.find((r) => r.method === 'PATCH');
        assert.equal(patchReq?.headers['content-type'], 'application/strategic-merge-patch+json');
        assert.deepEqual(errors, []);
      } finally {
        await informer.stop();
      }
    });

    it('works over HTTPS with the cluster CA', async () => {
      const k8s = await import('@kubernetes/client-node');
      const pki = await makeTestPki();
      try {
        await startFake({ token: 'tok', tls: { cert: readFileSync(pki.serverCertFile), key: readFileSync(pki.serverKeyFile) } });
        assert.match(fake.url, /^https:\/\/127\.0\.0\.1:\d+$/);
        const kc = new k8s.KubeConfig();
        kc.loadFromOptions({
          clusters: [{ name: 'fake', server: fake.url, caFile: pki.caFile, skipTLSVerify: false }],
          users: [{ name: 'u', token: 'tok' }],
          contexts: [{ name: 'c', cluster: 'fake', user: 'u' }],
          currentContext: 'c',
        });
        const api = kc.makeApiClient(k8s.CoreV1Api);
        fake.pods.create('kube-flannel', 'weft-1', 'node-a');
        const pod = await api.readNamespacedPod({ name: 'weft-1', namespace: 'kube-flannel' });
        assert.equal(pod.spec?.nodeName, 'node-a');
        const nodes = await api.listNode();
        assert.deepEqual(nodes.items.map((n) => n.metadata?.name), ['node-a', 'node-b']);
        assert.equal(nodes.metadata?.resourceVersion, fake.resourceVersion());
      } finally {
        pki.cleanup();
      }
    });
  });
});
