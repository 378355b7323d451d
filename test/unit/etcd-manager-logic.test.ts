// The etcd lease manager's allocation, race and renewal logic on an in-memory registry with the
// real one's contract (test/helpers/fake-registry.ts): the interleavings the real-etcd tests
// (test/integration/etcd-*.test.ts) can only hope to hit are forced here, one request at a time.
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { EtcdSubnetManager, type LeaseManagerOptions } from '../../src/subnet/etcd/manager.js';
import { LeaseLostError, OutOfSubnetsError, type AcquireHow } from '../../src/subnet/manager.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../../src/subnet/lease.js';
import { LeaseWatcher } from '../../src/subnet/watcher.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { createLogger } from '../../src/util/log.js';
import { FakeRegistry } from '../helpers/fake-registry.js';
import { waitFor } from '../helpers/wait.js';

const NETWORK = { Network: '10.5.0.0/16', Backend: { Type: 'alloc' } };
const net = (cidr: string) => IPNet.parse(cidr);
const attrs = (ip: string, extra: Partial<LeaseAttrs> = {}): LeaseAttrs => ({
  publicIP: IPAddr.parse(ip),
  publicIPv6: null,
  ...extra,
});
const value = (ip: string) => `{"PublicIP":"${ip}","PublicIPv6":null}`;
/** Always the lowest free candidate, so a test knows which subnet the manager will try. */
const lowest = () => 0n;

describe('etcd subnet manager logic (in-memory registry)', () => {
  let reg: FakeRegistry;
  let logged = '';
  let storeErrors: string[] = [];
  const made: EtcdSubnetManager[] = [];
  /** Running keepLease and watchLeases loops, stopped after each test even when it fails. */
  const running: Array<() => Promise<void>> = [];

  beforeEach(() => {
    reg = new FakeRegistry();
    reg.setConfig(NETWORK);
    logged = '';
    storeErrors = [];
  });
  afterEach(async () => {
    await Promise.all(running.splice(0).map((stop) => stop()));
    await Promise.all(made.splice(0).map((m) => m.close()));
  });

  /** A node's manager; several share `reg` as nodes share one etcd. */
  function manager(opts: Partial<LeaseManagerOptions> = {}): EtcdSubnetManager {
    const stream = new PassThrough();
    stream.on('data', (d: Buffer) => (logged += d.toString()));
    const m = new EtcdSubnetManager(
      {
        knownBackends: ['alloc', 'vxlan'],
        logger: createLogger({ level: 'debug', stream }),
        random: lowest,
        onStoreError: (op) => storeErrors.push(op),
        ...opts,
      },
      reg,
    );
    made.push(m);
    return m;
  }

  /** Runs keepLease and records every change; stop() aborts it and waits for it to return. */
  function keep(m: EtcdSubnetManager, lease: Lease) {
    const ctl = new AbortController();
    const seen: Array<{ how: AcquireHow; lease: Lease }> = [];
    const done = m.keepLease(lease, (l, how) => seen.push({ how, lease: l }), ctl.signal);
    const stop = async () => {
      ctl.abort();
      await done;
    };
    running.push(stop);
    return { seen, count: (how: AcquireHow) => seen.filter((s) => s.how === how).length, stop };
  }

  /** A node that acquired 10.5.1.0/24 and keeps it, with the watch on its key running. */
  async function keptLease() {
    const m = manager();
    const { lease } = await m.acquireLease(attrs('10.99.0.1'));
    const k = keep(m, lease);
    await waitFor(() => reg.runningWatches === 1, { what: 'the watch on our key' });
    return { k, key: reg.keyFor(lease.subnet!) };
  }

  describe('acquireLease', () => {
    it('takes the lowest free /24 on an empty store, skipping the first, bound to a 24 h etcd lease', async () => {
      const got = await manager().acquireLease(attrs('10.99.0.1'));
      assert.equal(got.how, 'new');
      assert.equal(got.retries, 0);
      assert.equal(String(got.lease.subnet), '10.5.1.0/24');
      assert.equal(got.lease.reservation, false);
      const key = reg.keyFor(net('10.5.1.0/24'));
      assert.deepEqual(reg.subnetKeys(), [key]);
      const kv = reg.get(key)!;
      assert.equal(kv.value, value('10.99.0.1'));
      assert.deepEqual([...reg.liveLeases()], [[kv.lease, 86400]]);
      const left = got.lease.expiration!.getTime() - Date.now();
      assert.ok(left > 86_390_000 && left <= 86_400_000, `expiration ${left} ms away`);
      assert.deepEqual([reg.count('list'), reg.count('grant'), reg.count('create')], [1, 1, 1]);
    });

    it('takes the previous subnet from subnet.env when free, and another when a node holds it or it is outside the network', async () => {
      const previous = { subnet: net('10.5.77.0/24'), ipv6Subnet: null };
      const a = await manager({ previous }).acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([a.how, String(a.lease.subnet)], ['previous', '10.5.77.0/24']);
      const b = await manager({ previous }).acquireLease(attrs('10.99.0.2'));
      assert.deepEqual([b.how, String(b.lease.subnet)], ['new', '10.5.1.0/24']);
      const c = await manager({ previous: { subnet: net('10.6.1.0/24'), ipv6Subnet: null } }).acquireLease(attrs('10.99.0.3'));
      assert.deepEqual([c.how, String(c.lease.subnet)], ['new', '10.5.2.0/24']);
    });

    it('reuses its own lease found by public IP without a write, and leaves no spare etcd lease', async () => {
      const first = await manager().acquireLease(attrs('10.99.0.1'));
      const key = reg.keyFor(first.lease.subnet!);
      const before = reg.get(key)!;
      const revision = reg.currentRevision;
      const second = await manager().acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([second.how, String(second.lease.subnet)], ['reuse', '10.5.1.0/24']);
      assert.equal(reg.currentRevision, revision, 'nothing written');
      assert.deepEqual(reg.get(key), before);
      assert.deepEqual([...reg.liveLeases().keys()], [before.lease], 'the etcd lease granted while listing was revoked');
      assert.ok(reg.calls.includes(`keepAlive ${before.lease}`), 'the reused lease was refreshed');
    });

    it('rewrites changed attributes of its own lease on the same key and etcd lease', async () => {
      const first = await manager().acquireLease(attrs('10.99.0.1'));
      const key = reg.keyFor(first.lease.subnet!);
      const before = reg.get(key)!;
      const vxlan = attrs('10.99.0.1', { backendType: 'vxlan', backendData: { VNI: 1 } });
      const second = await manager().acquireLease(vxlan);
      assert.equal(second.how, 'reuse');
      const after = reg.get(key)!;
      assert.equal(after.lease, before.lease);
      assert.equal(after.createRevision, before.createRevision);
      assert.equal(after.value, '{"PublicIP":"10.99.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1}}');
    });

    it('retries its compare-and-swap rewrite when the key changed between listing and writing', async () => {
      await manager().acquireLease(attrs('10.99.0.1'));
      const key = reg.keyFor(net('10.5.1.0/24'));
      const bound = reg.get(key)!.lease;
      reg.before('reuse', () => reg.put(key, '{"PublicIP":"10.99.0.1","PublicIPv6":null,"BackendType":"x"}', bound));
      const got = await manager().acquireLease(attrs('10.99.0.1', { backendType: 'alloc' }));
      assert.deepEqual([got.how, got.retries], ['reuse', 1]);
      assert.equal(reg.get(key)!.value, '{"PublicIP":"10.99.0.1","PublicIPv6":null,"BackendType":"alloc"}');
      assert.equal(reg.count('list'), 3);
    });

    it('loses a create race to another node, lists again and takes the next subnet with the etcd lease it already holds', async () => {
      const other = reg.grantLease(86400);
      reg.before('create', (key) => reg.put(key, value('10.99.0.9'), other));
      const got = await manager().acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([got.how, got.retries, String(got.lease.subnet)], ['new', 1, '10.5.2.0/24']);
      assert.equal(reg.get(reg.keyFor(net('10.5.1.0/24')))!.value, value('10.99.0.9'), 'the winner keeps its key');
      assert.deepEqual([reg.count('list'), reg.count('grant'), reg.count('create')], [2, 1, 2]);
      const ours = reg.get(reg.keyFor(net('10.5.2.0/24')))!.lease;
      assert.deepEqual([...reg.liveLeases().keys()].sort(), [other, ours].sort());
    });

    it('loses the race for its previous subnet and takes another', async () => {
      const previous = { subnet: net('10.5.77.0/24'), ipv6Subnet: null };
      reg.before('create', (key) => reg.put(key, value('10.99.0.9')));
      const got = await manager({ previous }).acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([got.how, got.retries, String(got.lease.subnet)], ['new', 1, '10.5.1.0/24']);
      assert.equal(reg.get(reg.keyFor(net('10.5.77.0/24')))!.value, value('10.99.0.9'));
    });

    it('uses a kept start-up listing once: a stale one costs a lost race, never a duplicate', async () => {
      const m = manager();
      assert.equal(await m.findOwnLease(IPAddr.parse('10.99.0.1')), null);
      reg.putLease(net('10.5.1.0/24'), attrs('10.99.0.9')); // after the listing, before the acquisition
      const got = await m.acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([got.retries, String(got.lease.subnet)], [1, '10.5.2.0/24']);
      assert.equal(reg.count('list'), 2, 'the start-up listing served the first attempt');
      assert.equal(reg.get(reg.keyFor(net('10.5.1.0/24')))!.value, value('10.99.0.9'));
    });

    it('gives up after maxRaceRetries lost races and revokes the etcd lease it granted', async () => {
      const stop = reg.beforeEach('create', (key) => reg.put(key, value('10.99.0.9')));
      await assert.rejects(manager({ maxRaceRetries: 3 }).acquireLease(attrs('10.99.0.1')), /gave up acquiring a lease after 3 lost races/);
      stop();
      assert.equal(reg.count('create'), 4);
      assert.equal(reg.count('grant'), 1);
      assert.equal(reg.liveLeases().size, 0);
    });

    it('fails with OutOfSubnetsError on a full network, leaving no etcd lease; the owner of a reservation still gets it', async () => {
      reg.setConfig({ ...NETWORK, SubnetMin: '10.5.4.0', SubnetMax: '10.5.5.0' });
      reg.putLease(net('10.5.4.0/24'), attrs('10.99.4.1')); // a reservation: no etcd lease
      reg.putLease(net('10.5.5.0/24'), attrs('10.99.4.2'), reg.grantLease(600));
      const err: unknown = await manager().acquireLease(attrs('10.99.4.3')).catch((e: unknown) => e);
      assert.ok(err instanceof OutOfSubnetsError && err.family === 4, String(err));
      assert.equal(reg.liveLeases().size, 1, 'only the other node’s etcd lease');
      const owner = manager();
      const got = await owner.acquireLease(attrs('10.99.4.1', { backendType: 'alloc' }));
      assert.deepEqual([got.how, String(got.lease.subnet), got.lease.reservation], ['reuse', '10.5.4.0/24', true]);
      const kv = reg.get(reg.keyFor(net('10.5.4.0/24')))!;
      assert.equal(kv.lease, '0', 'still a reservation');
      assert.match(kv.value, /"BackendType":"alloc"/);
      const keepAlives = reg.count('keepAlive');
      assert.equal((await owner.renewLease(got.lease)).reservation, true);
      assert.equal(reg.count('keepAlive'), keepAlives, 'a reservation is never kept alive');
    });

    it('moves its own lease that no longer fits the network config in one transaction, and retries when that key changes first', async () => {
      const stale = reg.putLease(net('10.6.1.0/24'), attrs('10.99.0.1'), reg.grantLease(600));
      reg.before('create', () => reg.put(stale, value('10.99.0.1'), reg.get(stale)!.lease));
      const before = reg.currentRevision;
      const got = await manager().acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([got.how, got.retries, String(got.lease.subnet)], ['new', 1, '10.5.1.0/24']);
      assert.equal(reg.get(stale), undefined, 'the old key is gone');
      const created = reg.get(reg.keyFor(net('10.5.1.0/24')))!;
      // The hook's rewrite is one revision, the create-and-delete the next.
      assert.equal(created.modRevision, before + 2n);
      assert.equal(reg.currentRevision, before + 2n);
    });

    it('leaves a reservation for its public IP that does not fit the network alone and takes a new lease', async () => {
      const reserved = reg.putLease(net('10.6.1.0/24'), attrs('10.99.0.1'));
      const got = await manager().acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([got.how, String(got.lease.subnet)], ['new', '10.5.1.0/24']);
      assert.equal(reg.get(reserved)!.value, value('10.99.0.1'));
      assert.match(logged, /reservation for our public IP does not fit the network config; leaving it alone/);
    });

    it('creates a fresh key when its old etcd lease lapses between listing and reuse, on the subnet from subnet.env', async () => {
      const first = await manager().acquireLease(attrs('10.99.0.1'));
      const key = reg.keyFor(first.lease.subnet!);
      const old = reg.get(key)!.lease;
      reg.before('reuse', () => reg.expireLease(old));
      const restarted = manager({ previous: { subnet: first.lease.subnet, ipv6Subnet: null } });
      const got = await restarted.acquireLease(attrs('10.99.0.1'));
      assert.deepEqual([got.how, got.retries, String(got.lease.subnet)], ['previous', 1, '10.5.1.0/24']);
      const now = reg.get(key)!;
      assert.notEqual(now.lease, old);
      assert.deepEqual([...reg.liveLeases().keys()], [now.lease]);
    });
  });

  describe('renewal', () => {
    it('renewLease refreshes the etcd lease to its full TTL; once the lease lapses it is LeaseLostError and forgotten', async () => {
      let t = Date.now();
      reg.now = () => t;
      const m = manager({ leaseTTLSeconds: 60, renewMarginSeconds: 10 });
      const { lease } = await m.acquireLease(attrs('10.99.0.1'));
      const key = reg.keyFor(lease.subnet!);
      const id = reg.get(key)!.lease;
      t += 50_000;
      assert.equal(await reg.timeToLive(id), 10);
      const renewed = await m.renewLease(lease);
      assert.equal(await reg.timeToLive(id), 60);
      const left = renewed.expiration!.getTime() - Date.now();
      assert.ok(left > 59_000 && left <= 60_000, `renewed for ${left} ms`);
      t += 61_000;
      await assert.rejects(m.renewLease(renewed), LeaseLostError);
      assert.equal(reg.get(key), undefined, 'the key went with its etcd lease');
      const asked = reg.count('keepAlive');
      await assert.rejects(m.renewLease(renewed), LeaseLostError);
      assert.equal(reg.count('keepAlive'), asked, 'a lost lease is not asked about again');
    });

    it('keepLease renews before every expiry, on the same key and etcd lease', async () => {
      const m = manager({ leaseTTLSeconds: 2, renewMarginSeconds: 1.85 });
      const { lease } = await m.acquireLease(attrs('10.99.0.1'));
      const key = reg.keyFor(lease.subnet!);
      const id = reg.get(key)!.lease;
      const k = keep(m, lease);
      await waitFor(() => k.count('renew') >= 3, { what: 'three renewals' });
      await k.stop();
      assert.equal(k.count('reacquire'), 0);
      assert.equal(reg.get(key)!.lease, id);
      assert.ok(reg.calls.filter((c) => c === `keepAlive ${id}`).length >= 3);
    });

    it('keepLease rides out a store outage during renewal and keeps the lease', async () => {
      const m = manager({ leaseTTLSeconds: 10, renewMarginSeconds: 9.8 });
      const { lease } = await m.acquireLease(attrs('10.99.0.1'));
      const id = reg.get(reg.keyFor(lease.subnet!))!.lease;
      // The store goes away just as the first renewal is sent.
      reg.before('keepAlive', () => void (reg.down = true));
      const k = keep(m, lease);
      await waitFor(() => storeErrors.includes('renew'), { what: 'a failed renewal' });
      reg.down = false;
      await waitFor(() => k.count('renew') >= 1, { what: 'a renewal after the outage' });
      await k.stop();
      assert.equal(k.count('reacquire'), 0);
      assert.equal(reg.get(reg.keyFor(lease.subnet!))!.lease, id);
      assert.match(logged, /renewing the lease failed; retrying/);
    });

    it('keepLease takes the same subnet again when an operator deletes the key', async () => {
      const { k, key } = await keptLease();
      reg.deleteKey(key);
      await waitFor(() => k.count('reacquire') === 1, { what: 're-acquisition' });
      await k.stop();
      assert.equal(String(k.seen[0]!.lease.subnet), '10.5.1.0/24');
      assert.equal(reg.get(key)!.value, value('10.99.0.1'));
      assert.match(logged, /our lease is no longer in etcd; acquiring it again/);
    });

    it('keepLease moves to another subnet when its lease lapsed and another node took the subnet meanwhile', async () => {
      const { k, key } = await keptLease();
      reg.expireLease(reg.get(key)!.lease);
      reg.putLease(net('10.5.1.0/24'), attrs('10.99.0.9'), reg.grantLease(600));
      await waitFor(() => k.count('reacquire') === 1, { what: 're-acquisition' });
      await k.stop();
      assert.equal(String(k.seen[0]!.lease.subnet), '10.5.2.0/24');
      assert.equal(reg.get(key)!.value, value('10.99.0.9'), 'the other node keeps it');
      assert.equal(reg.get(reg.keyFor(net('10.5.2.0/24')))!.value, value('10.99.0.1'));
    });

    it('keepLease re-checks when its key is rebound: an operator who rewrites it without an etcd lease makes it a reservation', async () => {
      const { k, key } = await keptLease();
      reg.put(key, value('10.99.0.1'));
      await waitFor(() => k.count('reacquire') === 1, { what: 're-check by acquisition' });
      await k.stop();
      assert.deepEqual([String(k.seen[0]!.lease.subnet), k.seen[0]!.lease.reservation], ['10.5.1.0/24', true]);
    });

    it('keepLease takes the lease again when the watch on its key is ended by the server', async () => {
      const { k, key } = await keptLease();
      const before = reg.get(key)!;
      reg.endWatches();
      await waitFor(() => k.count('reacquire') === 1, { what: 're-check by acquisition' });
      await waitFor(() => reg.count('watchKey') === 2 && reg.runningWatches === 1, { what: 'a new watch on our key' });
      await k.stop();
      assert.deepEqual(reg.get(key), before, 'our key was still there: reused, not rewritten');
    });
  });

  describe('watchLeases', () => {
    /** Runs watchLeases through a LeaseWatcher, as the daemon does. */
    function watch(m: EtcdSubnetManager) {
      const ctl = new AbortController();
      const watcher = new LeaseWatcher(() => null);
      const batches: LeaseEvent[][] = [];
      let snapshots = 0;
      const done = (async () => {
        for await (const r of m.watchLeases(ctl.signal)) {
          if (r.kind === 'snapshot') snapshots++;
          const b = watcher.apply(r);
          if (b.length > 0) batches.push(b);
        }
      })();
      const stop = async () => {
        ctl.abort();
        await done;
      };
      running.push(stop);
      return {
        watcher,
        snapshots: () => snapshots,
        events: () => batches.flat().map((e) => `${e.type} ${e.lease.subnet}`),
        peers: () => watcher.peers.map((p) => String(p.subnet)).sort(),
        stop,
      };
    }

    it('reports a snapshot, then changes, skipping values that do not parse', async () => {
      reg.putLease(net('10.5.10.0/24'), attrs('10.99.1.1'), reg.grantLease(600));
      reg.put(`${reg.subnetsPrefix}10.5.12.0-24`, '{"PublicIP":""}');
      const w = watch(manager());
      await waitFor(() => w.snapshots() === 1, { what: 'the snapshot' });
      assert.deepEqual(w.peers(), ['10.5.10.0/24']);
      reg.putLease(net('10.5.11.0/24'), attrs('10.99.1.2'));
      reg.put(`${reg.subnetsPrefix}garbage`, value('10.99.1.3'));
      reg.put(`${reg.subnetsPrefix}10.5.13.0-24`, 'not json');
      reg.deleteKey(reg.keyFor(net('10.5.10.0/24')));
      await waitFor(() => w.events().length === 3, { what: 'the changes' });
      await w.stop();
      assert.deepEqual(w.events(), ['added 10.5.10.0/24', 'added 10.5.11.0/24', 'removed 10.5.10.0/24']);
      assert.deepEqual(w.peers(), ['10.5.11.0/24']);
      assert.deepEqual(
        [...reg.skipped].sort(),
        ['10.5.12.0-24', '10.5.13.0-24', 'garbage'].map((k) => reg.subnetsPrefix + k),
      );
    });

    it('lists again when the server ends the watch and yields exactly what changed', async () => {
      reg.putLease(net('10.5.10.0/24'), attrs('10.99.1.1'));
      reg.putLease(net('10.5.11.0/24'), attrs('10.99.1.2'));
      const w = watch(manager());
      await waitFor(() => w.peers().length === 2, { what: 'the snapshot' });
      reg.endWatches();
      reg.deleteKey(reg.keyFor(net('10.5.10.0/24')));
      reg.putLease(net('10.5.12.0/24'), attrs('10.99.1.3'));
      await waitFor(() => w.snapshots() === 2 && w.peers().length === 2, { what: 'the second snapshot' });
      await w.stop();
      assert.deepEqual(w.peers(), ['10.5.11.0/24', '10.5.12.0/24']);
      assert.deepEqual(w.events().slice(2).sort(), ['added 10.5.12.0/24', 'removed 10.5.10.0/24']);
      assert.deepEqual(storeErrors, ['watch']);
    });

    it('starts from a kept start-up listing; when its revision is compacted it lists again and loses nothing', async () => {
      const m = manager();
      await m.findOwnLease(IPAddr.parse('10.99.0.1'));
      reg.putLease(net('10.5.10.0/24'), attrs('10.99.1.1'));
      reg.compact();
      const w = watch(m);
      await waitFor(() => w.snapshots() === 2, { what: 'the listing after the refused watch' });
      await w.stop();
      assert.deepEqual(w.peers(), ['10.5.10.0/24']);
      assert.equal(reg.count('list'), 2);
      assert.equal(reg.count('watchSubnets'), 2);
    });

    it('retries with backoff while the store is down, then reports the snapshot', async () => {
      reg.putLease(net('10.5.10.0/24'), attrs('10.99.1.1'));
      reg.down = true;
      const w = watch(manager());
      await waitFor(() => storeErrors.length >= 2, { what: 'two failed attempts' });
      assert.equal(w.snapshots(), 0);
      reg.down = false;
      await waitFor(() => w.snapshots() === 1, { what: 'the snapshot after the outage' });
      await w.stop();
      assert.deepEqual(w.peers(), ['10.5.10.0/24']);
      assert.match(logged, /cannot watch leases in etcd; retrying/);
    });
  });

  it('listLeases reports each etcd lease’s remaining TTL, and none for a reservation', async () => {
    let t = Date.now();
    reg.now = () => t;
    reg.putLease(net('10.5.10.0/24'), attrs('10.99.1.1'));
    reg.putLease(net('10.5.11.0/24'), attrs('10.99.1.2'), reg.grantLease(600));
    t += 100_000;
    const all = await manager().listLeases();
    const byNet = new Map(all.map((l) => [String(l.subnet), l]));
    assert.equal(byNet.get('10.5.10.0/24')!.expiration, null);
    const left = byNet.get('10.5.11.0/24')!.expiration!.getTime() - Date.now();
    assert.ok(left > 499_000 && left <= 500_000, `${left} ms left`);
  });
});
