// The Kubernetes lease manager against the fake API server: flannel's annotations and condition on
// acquire, the VTEP MAC read back, and the node list+watch surviving broken streams, 410 and outages.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { KubeClient, resolveNodeName } from '../../src/subnet/kube/client.js';
import { KubeSubnetManager, NodeNotFoundError, type KubeManagerOptions } from '../../src/subnet/kube/manager.js';
import { PodCIDRError } from '../../src/subnet/kube/node.js';
import { leaseId, type Lease, type LeaseAttrs } from '../../src/subnet/lease.js';
import { StoreUnavailableError } from '../../src/subnet/manager.js';
import { LeaseWatcher, type WatchResult } from '../../src/subnet/watcher.js';
import { IPAddr } from '../../src/util/ip.js';
import type { LogFields, Logger } from '../../src/util/log.js';
import { makeTestPki } from '../helpers/certs.js';
import { FakeKube, type JsonObject } from '../helpers/fake-kube.js';
import { waitFor } from '../helpers/wait.js';

const P = 'flannel.alpha.coreos.com/';
const MAC = '12:c6:65:89:b4:e3';

interface LogEntry {
  readonly level: string;
  readonly msg: string;
  readonly fields: LogFields;
}

function memoryLogger(entries: LogEntry[]): Logger {
  const at =
    (level: string) =>
    (msg: string, fields: LogFields = {}) =>
      entries.push({ level, msg, fields });
  const logger: Logger = {
    error: at('error'),
    warn: at('warn'),
    info: at('info'),
    debug: at('debug'),
    child: () => logger,
  };
  return logger;
}

/** The annotations flanneld itself writes for a vxlan node. */
function flannelAnnotations(ip: string, mac: string): Record<string, string> {
  return {
    [`${P}backend-data`]: `{"VNI":1,"VtepMAC":"${mac}"}`,
    [`${P}backend-type`]: 'vxlan',
    [`${P}kube-subnet-manager`]: 'true',
    [`${P}public-ip`]: ip,
  };
}

function vxlanAttrs(ip: string, mac: string): LeaseAttrs {
  return { publicIP: IPAddr.parse(ip), publicIPv6: null, backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: mac } };
}

/** Reads a watchLeases iterable in the background into `results`. */
class Collector {
  readonly results: WatchResult[] = [];
  readonly done: Promise<Error | null>;
  constructor(iterable: AsyncIterable<WatchResult>) {
    this.done = (async () => {
      try {
        for await (const r of iterable) this.results.push(r);
        return null;
      } catch (e) {
        return e as Error;
      }
    })();
  }
  snapshots(): number {
    return this.results.filter((r) => r.kind === 'snapshot').length;
  }
}

const ids = (leases: readonly Pick<Lease, 'subnet' | 'ipv6Subnet'>[]): string[] => leases.map((l) => leaseId(l)).sort();

describe('KubeSubnetManager against the fake API server', function () {
  this.timeout(30_000);
  let fake: FakeKube;
  let dir: string;
  let logs: LogEntry[];
  const managers: KubeSubnetManager[] = [];
  const aborts: AbortController[] = [];

  function kubeConfig(): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'fake', server: fake.url, skipTLSVerify: true }],
      users: [{ name: 'u', token: 'tok' }],
      contexts: [{ name: 'c', cluster: 'fake', user: 'u' }],
      currentContext: 'c',
    });
    return kc;
  }

  function manager(nodeName: string, extra: Partial<KubeManagerOptions> = {}): KubeSubnetManager {
    const m = new KubeSubnetManager({
      kubeConfig: kubeConfig(),
      nodeName,
      netConfigPath: join(dir, 'net-conf.json'),
      annotationPrefix: 'flannel.alpha.coreos.com',
      setNodeNetworkUnavailable: true,
      logger: memoryLogger(logs),
      knownBackends: ['vxlan', 'host-gw', 'alloc'],
      now: () => new Date('2024-05-06T07:08:09.500Z'),
      ...extra,
    });
    managers.push(m);
    return m;
  }

  function watch(m: KubeSubnetManager): Collector {
    const ac = new AbortController();
    aborts.push(ac);
    return new Collector(m.watchLeases(ac.signal));
  }

  function managedNode(name: string, cidr: string, ip: string, mac = MAC): void {
    fake.nodes.create(name, { annotations: flannelAnnotations(ip, mac), spec: { podCIDR: cidr, podCIDRs: [cidr] } });
  }

  function setAnnotation(name: string, key: string, value: string): void {
    fake.nodes.update(name, (n) => {
      const meta = n.metadata as JsonObject;
      meta.annotations = { ...(meta.annotations as Record<string, string>), [key]: value };
    });
  }

  /** The lease ids the fake's managed nodes should give. */
  function expectedIds(): string[] {
    return fake.nodes
      .list()
      .filter((n) => ((n.metadata as JsonObject).annotations as Record<string, string> | undefined)?.[`${P}kube-subnet-manager`] === 'true')
      .map((n) => ((n.spec as JsonObject).podCIDR as string).replace('/', '-'))
      .sort();
  }

  /** Feeds every result into a LeaseWatcher as the daemon does; returns the watcher and the consumed count. */
  function follow(c: Collector): { watcher: LeaseWatcher; sync: () => void; added: string[]; removed: string[] } {
    const watcher = new LeaseWatcher(() => null);
    let applied = 0;
    const added: string[] = [];
    const removed: string[] = [];
    const sync = () => {
      for (; applied < c.results.length; applied++) {
        for (const ev of watcher.apply(c.results[applied]!)) (ev.type === 'added' ? added : removed).push(leaseId(ev.lease));
      }
    };
    return { watcher, sync, added, removed };
  }

  beforeEach(async () => {
    dir = mkdtempSync(join(tmpdir(), 'wt-kubemgr-'));
    writeFileSync(join(dir, 'net-conf.json'), '{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}');
    logs = [];
    fake = await FakeKube.start({ token: 'tok' });
  });

  afterEach(async () => {
    for (const ac of aborts.splice(0)) ac.abort();
    for (const m of managers.splice(0)) await m.close();
    await fake.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  describe('getNetworkConfig', () => {
    it('reads --net-config-path, and a missing file is ConfigNotFoundError', async () => {
      const cfg = await manager('node-a').getNetworkConfig();
      assert.equal(cfg.network?.toString(), '10.244.0.0/16');
      assert.equal(cfg.backend.type, 'vxlan');
      const missing = manager('node-a', { netConfigPath: join(dir, 'nope.json') });
      await assert.rejects(missing.getNetworkConfig(), { name: 'ConfigNotFoundError', message: `network config file ${join(dir, 'nope.json')} not found` });
      writeFileSync(join(dir, 'bad.json'), '{"Network":"10.244.0.0/16","Backend":{"Type":"nonesuch"}}');
      await assert.rejects(manager('node-a', { netConfigPath: join(dir, 'bad.json') }).getNetworkConfig(), { name: 'ConfigError' });
    });
  });

  describe('acquireLease', () => {
    it("publishes exactly flannel's annotations on nodes/NAME/status and sets NetworkUnavailable=False", async () => {
      fake.nodes.create('node-a', { spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24'] } });
      const m = manager('node-a');
      const got = await m.acquireLease(vxlanAttrs('192.168.50.1', MAC));
      assert.equal(got.how, 'new');
      assert.equal(got.retries, 0);
      assert.equal(got.lease.subnet?.toString(), '10.244.1.0/24');
      assert.equal(got.lease.ipv6Subnet, null);
      assert.equal(got.lease.expiration, null);

      const node = fake.nodes.get('node-a')!;
      assert.deepEqual((node.metadata as JsonObject).annotations, flannelAnnotations('192.168.50.1', MAC));
      const patches = fake.requests.filter((r) => r.method === 'PATCH');
      assert.equal(patches.length, 2);
      const [ann, cond] = patches;
      assert.equal(ann!.path, '/api/v1/nodes/node-a/status');
      assert.equal(ann!.headers['content-type'], 'application/strategic-merge-patch+json');
      assert.equal(ann!.headers.authorization, 'Bearer tok');
      assert.equal(ann!.status, 200);
      assert.equal(
        ann!.body,
        `{"metadata":{"annotations":{"${P}backend-data":"{\\"VNI\\":1,\\"VtepMAC\\":\\"${MAC}\\"}","${P}backend-type":"vxlan",` +
          `"${P}kube-subnet-manager":"true","${P}public-ip":"192.168.50.1"},"resourceVersion":"1001"}}`,
      );
      assert.equal(cond!.path, '/api/v1/nodes/node-a/status');
      assert.equal(cond!.headers['content-type'], 'application/strategic-merge-patch+json');
      assert.deepEqual((node.status as JsonObject).conditions, [
        {
          type: 'NetworkUnavailable',
          status: 'False',
          lastHeartbeatTime: '2024-05-06T07:08:09Z',
          lastTransitionTime: '2024-05-06T07:08:09Z',
          reason: 'FlannelIsUp',
          message: 'Flannel is running on this node',
        },
      ]);

      // A restart with the same attributes changes no annotation: only the condition is sent.
      const again = await manager('node-a').acquireLease(vxlanAttrs('192.168.50.1', MAC));
      assert.equal(again.how, 'reuse');
      assert.equal(fake.requests.filter((r) => r.method === 'PATCH').length, 3);
      assert.match(fake.requests.filter((r) => r.method === 'PATCH')[2]!.body, /^\{"status":\{"conditions":\[/);
    });

    it('honours public-ip-overwrite and leaves the condition alone without --set-node-network-unavailable', async () => {
      fake.nodes.create('node-a', {
        annotations: { [`${P}public-ip-overwrite`]: '203.0.113.7' },
        spec: { podCIDR: '10.244.1.0/24' },
      });
      await manager('node-a', { setNodeNetworkUnavailable: false }).acquireLease(vxlanAttrs('192.168.50.1', MAC));
      const ann = (fake.nodes.get('node-a')!.metadata as JsonObject).annotations as Record<string, string>;
      assert.equal(ann[`${P}public-ip`], '203.0.113.7');
      assert.equal(fake.requests.filter((r) => r.method === 'PATCH').length, 1);
      assert.equal((fake.nodes.get('node-a')!.status as JsonObject | undefined)?.conditions, undefined);
    });

    it("fails with flannel's error text when the node has no podCIDR, writing nothing", async () => {
      fake.nodes.create('node-b');
      await assert.rejects(manager('node-b').acquireLease(vxlanAttrs('192.168.50.2', MAC)), (e: Error) => {
        assert.ok(e instanceof PodCIDRError);
        assert.equal(e.message, 'node "node-b" pod cidr not assigned');
        return true;
      });
      assert.equal(fake.requests.filter((r) => r.method === 'PATCH').length, 0);
    });

    it('retries after a 409 caused by a concurrent annotation change, keeping the other writer\'s annotation', async () => {
      fake.nodes.create('node-a', { spec: { podCIDR: '10.244.1.0/24' } });
      let raced = false;
      // Another writer changes the Node just before our first patch is handled: a real precondition failure.
      fake.failNext(1, 500, (req) => {
        if (req.method === 'PATCH' && !raced) {
          raced = true;
          setAnnotation('node-a', 'example.com/other', 'x');
        }
        return false;
      });
      const got = await manager('node-a', { setNodeNetworkUnavailable: false }).acquireLease(vxlanAttrs('192.168.50.1', MAC));
      assert.equal(got.retries, 1);
      const patches = fake.requests.filter((r) => r.method === 'PATCH');
      assert.deepEqual(
        patches.map((r) => r.status),
        [409, 200],
      );
      assert.equal(fake.requests.filter((r) => r.method === 'GET' && r.path === '/api/v1/nodes/node-a').length, 2);
      assert.deepEqual((fake.nodes.get('node-a')!.metadata as JsonObject).annotations, {
        ...flannelAnnotations('192.168.50.1', MAC),
        'example.com/other': 'x',
      });
    });

    it('waits for the own Node to appear, and gives up with NodeNotFoundError', async () => {
      const m = manager('late', { setNodeNetworkUnavailable: false, nodeWaitTimeoutMs: 10_000 });
      const pending = m.acquireLease(vxlanAttrs('192.168.50.3', MAC));
      await waitFor(() => fake.requests.filter((r) => r.path === '/api/v1/nodes/late' && r.status === 404).length >= 2, {
        what: 'two 404s',
      });
      fake.nodes.create('late', { spec: { podCIDR: '10.244.3.0/24' } });
      assert.equal((await pending).lease.subnet?.toString(), '10.244.3.0/24');
      await assert.rejects(manager('never', { nodeWaitTimeoutMs: 300 }).acquireLease(vxlanAttrs('192.168.50.4', MAC)), (e: Error) => {
        assert.ok(e instanceof NodeNotFoundError);
        assert.match(e.message, /^node "never" not found after waiting \d+ s/);
        return true;
      });
    });

    it('reports StoreUnavailableError while the API server is down', async () => {
      fake.nodes.create('node-a', { spec: { podCIDR: '10.244.1.0/24' } });
      const m = manager('node-a');
      await fake.pause();
      await assert.rejects(m.acquireLease(vxlanAttrs('192.168.50.1', MAC)), (e: Error) => {
        assert.ok(e instanceof StoreUnavailableError);
        assert.equal(e.op, 'get own node');
        assert.match(e.message, /ECONNREFUSED/);
        return true;
      });
      fake.failNext(1, 503);
      await fake.resume();
      await assert.rejects(m.acquireLease(vxlanAttrs('192.168.50.1', MAC)), {
        name: 'StoreUnavailableError',
        message: /^get own node: get node node-a: 503 ServiceUnavailable/,
      });
      assert.equal((await m.acquireLease(vxlanAttrs('192.168.50.1', MAC))).lease.subnet?.toString(), '10.244.1.0/24');
    });
  });

  describe('findOwnLease', () => {
    it('returns the VTEP MAC flanneld published before, and null for a node without annotations', async () => {
      managedNode('node-a', '10.244.1.0/24', '192.168.50.1', 'aa:bb:cc:00:11:22');
      fake.nodes.create('node-b', { spec: { podCIDR: '10.244.2.0/24' } });
      const own = await manager('node-a').findOwnLease(IPAddr.parse('192.168.50.1'));
      assert.deepEqual(own?.attrs.backendData, { VNI: 1, VtepMAC: 'aa:bb:cc:00:11:22' });
      assert.equal(own?.subnet?.toString(), '10.244.1.0/24');
      assert.equal(await manager('node-b').findOwnLease(IPAddr.parse('192.168.50.2')), null);
      assert.equal(await manager('node-z').findOwnLease(IPAddr.parse('192.168.50.9')), null);
    });
  });

  describe('watchLeases', () => {
    it('snapshots managed nodes, then turns changes into events; a garbage public-ip warns once', async () => {
      managedNode('n1', '10.244.1.0/24', '192.168.50.1');
      managedNode('n2', '10.244.2.0/24', '192.168.50.2');
      managedNode('n3', '10.244.3.0/24', '192.168.50.3');
      fake.nodes.create('n4', { spec: { podCIDR: '10.244.4.0/24' } }); // not managed by flannel
      const c = watch(manager('n1'));
      await waitFor(() => c.results.length >= 1 && fake.openWatches() === 1, { what: 'snapshot and watch' });
      const snap = c.results[0]!;
      assert.equal(snap.kind, 'snapshot');
      assert.deepEqual(ids(snap.kind === 'snapshot' ? snap.leases : []), ['10.244.1.0-24', '10.244.2.0-24', '10.244.3.0-24']);
      const watchReq = fake.requests.find((r) => r.watch)!;
      assert.equal(watchReq.query.allowWatchBookmarks, 'true');
      assert.equal(watchReq.query.resourceVersion, '1004');

      setAnnotation('n2', `${P}public-ip`, '192.168.60.2');
      await waitFor(() => c.results.length >= 2, { what: 'MODIFIED event' });
      const mod = c.results[1]!;
      assert.equal(mod.kind, 'events');
      assert.equal(mod.kind === 'events' && mod.events.length, 1);
      const ev = mod.kind === 'events' ? mod.events[0]! : null;
      assert.equal(ev?.type, 'added');
      assert.equal(ev && 'attrs' in ev.lease ? ev.lease.attrs.publicIP.toString() : '', '192.168.60.2');

      // Changes nobody acts on: an unrelated annotation, a status change, the unmanaged node.
      setAnnotation('n2', 'example.com/x', '1');
      setAnnotation('n4', 'example.com/x', '1');
      fake.nodes.delete('n3');
      await waitFor(() => c.results.length >= 3, { what: 'DELETED event' });
      assert.deepEqual(c.results.slice(2).flatMap((r) => (r.kind === 'events' ? r.events.map((e) => `${e.type} ${leaseId(e.lease)}`) : ['snapshot'])), [
        'removed 10.244.3.0-24',
      ]);

      setAnnotation('n1', `${P}public-ip`, 'garbage');
      setAnnotation('n1', 'example.com/x', '2');
      setAnnotation('n2', `${P}public-ip`, 'garbage');
      await waitFor(() => logs.filter((l) => l.level === 'warn').length >= 2, { what: 'warnings' });
      // While garbage, n2 keeps its last good lease: a later backend-type change is not applied either.
      setAnnotation('n2', `${P}backend-type`, 'host-gw');
      // A watch event after those proves they were all processed.
      managedNode('n5', '10.244.5.0/24', '192.168.50.5');
      await waitFor(() => c.results.length >= 4, { what: 'n5 event' });
      const warns = logs.filter((l) => l.level === 'warn');
      assert.deepEqual(
        warns.map((w) => [w.msg, w.fields.node, w.fields.reason]),
        [
          ['node annotations unusable; keeping its last good lease', 'n1', `node "n1": annotation ${P}public-ip="garbage": not an IPv4 address`],
          ['node annotations unusable; keeping its last good lease', 'n2', `node "n2": annotation ${P}public-ip="garbage": not an IPv4 address`],
        ],
      );
      const fence = c.results[3]!;
      assert.deepEqual(fence.kind === 'events' ? fence.events.map((e) => `${e.type} ${leaseId(e.lease)}`) : [], ['added 10.244.5.0-24']);
      assert.equal(c.results.length, 4);

      // A node that drops the manager annotation is a removed peer; a podCIDR change is remove + add.
      fake.nodes.update('n1', (n) => {
        const meta = n.metadata as JsonObject;
        const ann = { ...(meta.annotations as Record<string, string>) };
        delete ann[`${P}kube-subnet-manager`];
        meta.annotations = ann;
      });
      await waitFor(() => c.results.length >= 5, { what: 'unmanaged event' });
      const gone = c.results[4]!;
      assert.deepEqual(gone.kind === 'events' ? gone.events.map((e) => `${e.type} ${leaseId(e.lease)}`) : [], ['removed 10.244.1.0-24']);

      fake.nodes.update('n5', (n) => {
        n.spec = { podCIDR: '10.244.15.0/24', podCIDRs: ['10.244.15.0/24'] };
      });
      await waitFor(() => c.results.length >= 6, { what: 'podCIDR event' });
      const moved = c.results[5]!;
      assert.deepEqual(moved.kind === 'events' ? moved.events.map((e) => `${e.type} ${leaseId(e.lease)}`) : [], [
        'removed 10.244.5.0-24',
        'added 10.244.15.0-24',
      ]);

      // Fixed again: the node's current annotations (including the change made while broken) apply.
      setAnnotation('n2', `${P}public-ip`, '192.168.80.2');
      await waitFor(() => c.results.length >= 7, { what: 'repair event' });
      const fixed = c.results[6]!;
      const fixedLease = fixed.kind === 'events' && fixed.events.length === 1 ? (fixed.events[0]!.lease as Lease) : null;
      assert.equal(fixedLease?.attrs.publicIP.toString(), '192.168.80.2');
      assert.equal(fixedLease?.attrs.backendType, 'host-gw');
      assert.equal(logs.filter((l) => l.level === 'warn').length, 2);
    });

    it('re-lists after a broken watch and after 410, losing and duplicating no peer', async () => {
      for (let i = 1; i <= 5; i++) managedNode(`n${i}`, `10.244.${i}.0/24`, `192.168.50.${i}`);
      const c = watch(manager('n1'));
      const f = follow(c);
      await waitFor(() => fake.openWatches() === 1, { what: 'watch' });
      f.sync();
      assert.deepEqual(f.watcher.peers.map(leaseId).sort(), expectedIds());

      // Mid-stream break: changes made while no watch is open arrive through the re-list.
      const lists = () => fake.requests.filter((r) => r.path === '/api/v1/nodes' && !r.watch && r.method === 'GET').length;
      assert.equal(lists(), 1);
      assert.equal(fake.breakWatches(), 1);
      fake.nodes.delete('n2');
      managedNode('n6', '10.244.6.0/24', '192.168.50.6');
      setAnnotation('n3', `${P}public-ip`, '192.168.70.3');
      await waitFor(() => c.snapshots() === 2 && fake.openWatches() === 1, { what: 're-list after break' });
      f.sync();
      assert.deepEqual(f.watcher.peers.map(leaseId).sort(), expectedIds());
      assert.equal(lists(), 2);

      // The server ends the watch, history is compacted while we re-watch: 410 → list again.
      fake.endWatches();
      fake.nodes.delete('n4');
      managedNode('n7', '10.244.7.0/24', '192.168.50.7');
      fake.compactBefore(fake.resourceVersion());
      await waitFor(() => c.snapshots() === 3 && fake.openWatches() === 1, { what: 're-list after 410' });
      f.sync();
      assert.deepEqual(f.watcher.peers.map(leaseId).sort(), expectedIds());
      assert.equal(lists(), 3);

      // Whatever the path, each change reached the watcher exactly once.
      assert.deepEqual(f.added.sort(), [
        '10.244.1.0-24', '10.244.2.0-24', '10.244.3.0-24', '10.244.3.0-24', '10.244.4.0-24', '10.244.5.0-24', '10.244.6.0-24', '10.244.7.0-24',
      ]);
      assert.deepEqual(f.removed.sort(), ['10.244.2.0-24', '10.244.4.0-24']);
      assert.equal(f.watcher.peers.length, new Set(f.watcher.peers.map(leaseId)).size);
    });

    it('re-watches from the last bookmark after a clean server-side end, without listing', async () => {
      managedNode('n1', '10.244.1.0/24', '192.168.50.1');
      const c = watch(manager('n1'));
      await waitFor(() => fake.openWatches() === 1, { what: 'watch' });
      fake.pods.create('default', 'p', 'n1'); // moves the resourceVersion on: only a bookmark tells a node watch
      fake.bookmarkNow();
      const bookmarkRv = fake.resourceVersion();
      // The bookmark and the end travel on the same stream, in that order.
      fake.endWatches();
      await waitFor(() => fake.requests.filter((r) => r.watch).length === 2, { what: 're-watch' });
      const rewatch = fake.requests.filter((r) => r.watch)[1]!;
      assert.equal(bookmarkRv, '1002');
      assert.equal(rewatch.query.resourceVersion, bookmarkRv);
      assert.equal(fake.requests.filter((r) => r.path === '/api/v1/nodes' && !r.watch).length, 1);
      assert.equal(c.snapshots(), 1);
    });

    it('works over HTTPS with the cluster CA from a kubeconfig file', async () => {
      const pki = await makeTestPki();
      try {
        await fake.stop();
        fake = await FakeKube.start({ token: 'tok', tls: { cert: readFileSync(pki.serverCertFile), key: readFileSync(pki.serverKeyFile) } });
        managedNode('n1', '10.244.1.0/24', '192.168.50.1');
        const kubeconfig = join(dir, 'kubeconfig');
        writeFileSync(
          kubeconfig,
          [
            'apiVersion: v1',
            'kind: Config',
            'clusters:',
            `- name: fake\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority: ${pki.caFile}`,
            'users:',
            '- name: u\n  user:\n    token: tok',
            'contexts:',
            '- name: c\n  context:\n    cluster: fake\n    user: u',
            'current-context: c',
            '',
          ].join('\n'),
        );
        // --kube-api-url overrides the kubeconfig's server, keeping its CA and token.
        const m = manager('n1', { kubeConfig: undefined, kubeconfigFile: kubeconfig, apiUrl: fake.url });
        const own = await m.findOwnLease(IPAddr.parse('192.168.50.1'));
        assert.equal(own?.subnet?.toString(), '10.244.1.0/24');
        const c = watch(m);
        await waitFor(() => c.snapshots() === 1 && fake.openWatches() === 1, { what: 'snapshot over https' });
        assert.equal(fake.requests.find((r) => r.watch)?.headers.authorization, 'Bearer tok');
      } finally {
        pki.cleanup();
      }
    });

    it('resumes after an API outage and catches up on what changed', async () => {
      managedNode('n1', '10.244.1.0/24', '192.168.50.1');
      managedNode('n2', '10.244.2.0/24', '192.168.50.2');
      const c = watch(manager('n1'));
      const f = follow(c);
      await waitFor(() => fake.openWatches() === 1, { what: 'watch' });
      await fake.pause();
      managedNode('n3', '10.244.3.0/24', '192.168.50.3');
      fake.nodes.delete('n2');
      await waitFor(() => logs.some((l) => l.msg === 'node list/watch failed; listing again' && /ECONNREFUSED/.test(String(l.fields.error))), {
        what: 'failed re-list',
      });
      await fake.resume();
      await waitFor(() => c.snapshots() === 2, { what: 'snapshot after resume' });
      f.sync();
      assert.deepEqual(f.watcher.peers.map(leaseId).sort(), ['10.244.1.0-24', '10.244.3.0-24']);
      assert.deepEqual(f.removed, ['10.244.2.0-24']);
    });

    it('delivers 2000 nodes created in one burst, coalesced into few batches', async function () {
      this.timeout(60_000);
      const c = watch(manager('n0'));
      const f = follow(c);
      await waitFor(() => fake.openWatches() === 1, { what: 'watch' });
      for (let i = 0; i < 2000; i++) managedNode(`n${i}`, `10.${100 + (i >> 8)}.${i & 255}.0/24`, `192.168.${i >> 8}.${i & 255}`);
      await waitFor(
        () => {
          f.sync();
          return f.watcher.peers.length === 2000;
        },
        { what: '2000 peers', timeoutMs: 30_000 },
      );
      const batches = c.results.filter((r) => r.kind === 'events').length;
      assert.ok(batches < 400, `${batches} batches for 2000 events`);
      assert.equal(f.added.length, 2000);
      assert.equal(c.snapshots(), 1);
    });

    it('ends at once for an already-aborted signal and when the manager is closed', async () => {
      const m = manager('n1');
      const ac = new AbortController();
      ac.abort();
      const c1 = new Collector(m.watchLeases(ac.signal));
      assert.equal(await c1.done, null);
      assert.deepEqual(c1.results, []);
      const c2 = watch(m);
      await waitFor(() => fake.openWatches() === 1, { what: 'watch' });
      await m.close();
      assert.equal(await c2.done, null);
      await waitFor(() => fake.openWatches() === 0, { what: 'watch closed' });
    });
  });

  describe('resolveNodeName', () => {
    it('takes NODE_NAME, else the pod spec.nodeName, with flannel\'s errors', async () => {
      fake.pods.create('kube-flannel', 'weft-abc', 'node-q');
      fake.pods.create('kube-flannel', 'weft-unscheduled', '');
      const client = new KubeClient(kubeConfig());
      const get = (ns: string, name: string) => client.getPodNodeName(ns, name);
      assert.equal(await resolveNodeName({ NODE_NAME: 'node-x', POD_NAME: 'weft-abc', POD_NAMESPACE: 'kube-flannel' }, get), 'node-x');
      assert.equal(await resolveNodeName({ POD_NAME: 'weft-abc', POD_NAMESPACE: 'kube-flannel' }, get), 'node-q');
      await assert.rejects(resolveNodeName({ POD_NAME: 'weft-abc' }, get), {
        name: 'NodeNameError',
        message: 'env variables POD_NAME and POD_NAMESPACE must be set',
      });
      await assert.rejects(resolveNodeName({ POD_NAME: 'nope', POD_NAMESPACE: 'kube-flannel' }, get), {
        name: 'NodeNameError',
        message: /^error retrieving pod spec for 'kube-flannel\/nope': get pod kube-flannel\/nope: 404 NotFound: pods "nope" not found$/,
      });
      await assert.rejects(resolveNodeName({ POD_NAME: 'weft-unscheduled', POD_NAMESPACE: 'kube-flannel' }, get), {
        name: 'NodeNameError',
        message: "node name not present in pod spec 'kube-flannel/weft-unscheduled'",
      });
    });
  });
});
