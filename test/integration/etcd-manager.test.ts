// The etcd lease manager against a real etcd: allocation, races, reuse, reservations, renewal,
// loss, outages, compaction and foreign values.
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { Etcd3 } from 'etcd3';
import { EtcdSubnetManager, type EtcdManagerOptions } from '../../src/subnet/etcd/manager.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { createLogger } from '../../src/util/log.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../../src/subnet/lease.js';
import { LeaseWatcher } from '../../src/subnet/watcher.js';
import { EtcdServer } from '../helpers/etcd.js';
import { TcpProxy } from '../helpers/proxy.js';
import { waitFor } from '../helpers/wait.js';

const FLANNEL_KEY_RE = /(\d+\.\d+.\d+.\d+)-(\d+)(?:&([a-f\d:]+)-(\d+))?$/;

describe('etcd subnet manager (real etcd)', function () {
  this.timeout(120_000);
  let etcd: EtcdServer;
  let client: Etcd3;
  let n = 0;
  const managers: EtcdSubnetManager[] = [];
  let prefix = '';
  const logText = new PassThrough();
  let logged = '';
  logText.on('data', (d: Buffer) => {
    logged += d.toString();
    if (process.env.WEFT_TEST_DEBUG) process.stderr.write(d);
  });

  before(async () => {
    etcd = await EtcdServer.start();
    client = new Etcd3({ hosts: etcd.endpoint });
  });
  after(async () => {
    await Promise.all(managers.map((m) => m.close()));
    client.close();
    await etcd.destroy();
  });
  beforeEach(async () => {
    prefix = `/test${++n}/coreos.com/network`;
    await client.put(`${prefix}/config`).value(JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'alloc' } }));
  });

  function manager(opts: Partial<EtcdManagerOptions> = {}, endpoint = etcd.endpoint): EtcdSubnetManager {
    const m = EtcdSubnetManager.connect({
      endpoints: [endpoint],
      prefix,
      knownBackends: ['alloc', 'vxlan'],
      logger: createLogger({ level: 'debug', stream: logText }),
      ...opts,
    });
    managers.push(m);
    return m;
  }
  const attrs = (ip: string, extra: Partial<LeaseAttrs> = {}): LeaseAttrs => ({
    publicIP: IPAddr.parse(ip),
    publicIPv6: null,
    ...extra,
  });
  async function raw(key: string) {
    const res = await client.get(`${prefix}/subnets/${key}`).exec();
    return res.kvs[0] ?? null;
  }

  /** Runs watchLeases through a LeaseWatcher and records every batch. */
  function watch(m: EtcdSubnetManager, own: () => Lease | null = () => null) {
    const ctl = new AbortController();
    const watcher = new LeaseWatcher(own);
    const batches: LeaseEvent[][] = [];
    const done = (async () => {
      for await (const r of m.watchLeases(ctl.signal)) {
        const b = watcher.apply(r);
        if (b.length > 0) batches.push(b);
      }
    })();
    return {
      watcher,
      batches,
      events: () => batches.flat().map((e) => `${e.type} ${e.lease.subnet} ${e.lease.attrs.publicIP}`),
      stop: async () => {
        ctl.abort();
        await done;
      },
    };
  }

  it('ends a lease watch at once when its signal was aborted before the call (stop during start-up)', async () => {
    const m = manager();
    const ctl = new AbortController();
    ctl.abort();
    const results: unknown[] = [];
    for await (const r of m.watchLeases(ctl.signal)) results.push(r);
    assert.deepEqual(results, []);
  });

  it('gives 100 managers acquiring at once 100 distinct subnets', async () => {
    const ms = Array.from({ length: 100 }, () => manager());
    const got = await Promise.all(ms.map((m, i) => m.acquireLease(attrs(`10.99.${i >> 8}.${i & 255}`))));
    const subnets = new Set(got.map((g) => String(g.lease.subnet)));
    assert.equal(subnets.size, 100);
    const all = await client.getAll().prefix(`${prefix}/subnets/`).strings();
    assert.equal(Object.keys(all).length, 100);
    for (const g of got) {
      assert.ok(IPNet.parse('10.5.0.0/16').containsNet(g.lease.subnet!));
      assert.equal(g.lease.subnet!.prefix, 24);
      assert.notEqual(String(g.lease.subnet), '10.5.0.0/24', 'the first subnet is skipped');
    }
    await Promise.all(ms.map((m) => m.close()));
  });

  it('writes keys and values that flannel parses, bound to a 24 h etcd lease', async () => {
    const m = manager();
    const { lease } = await m.acquireLease(
      attrs('192.168.64.3', { backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: 'c6:d2:32:6f:8f:44' } }),
    );
    const key = `${lease.subnet!.ip}-24`;
    const kv = await raw(key);
    assert.ok(kv);
    assert.match(kv.key.toString(), FLANNEL_KEY_RE);
    assert.equal(
      kv.value.toString(),
      '{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}',
    );
    const ttl = await client.leaseClient.leaseTimeToLive({ ID: kv.lease });
    assert.equal(Number(ttl.grantedTTL), 86400);
  });

  it('keeps the subnet of a restarted manager without rewriting an unchanged value', async () => {
    const first = await manager().acquireLease(attrs('10.99.1.1'));
    const before = await raw(`${first.lease.subnet!.ip}-24`);
    const second = await manager().acquireLease(attrs('10.99.1.1'));
    assert.equal(second.how, 'reuse');
    assert.equal(String(second.lease.subnet), String(first.lease.subnet));
    const afterKv = await raw(`${first.lease.subnet!.ip}-24`);
    assert.equal(afterKv!.mod_revision, before!.mod_revision);
    // A changed attribute is written with a compare-and-swap, on the same key and etcd lease.
    const third = await manager().acquireLease(attrs('10.99.1.1', { backendType: 'vxlan', backendData: { VNI: 1 } }));
    assert.equal(String(third.lease.subnet), String(first.lease.subnet));
    const rewritten = await raw(`${first.lease.subnet!.ip}-24`);
    assert.equal(rewritten!.lease, before!.lease);
    assert.match(rewritten!.value.toString(), /"BackendType":"vxlan"/);
  });

  it('takes the previous subnet from subnet.env when it is free, and another when it is not', async () => {
    const prev = { subnet: IPNet.parse('10.5.77.0/24'), ipv6Subnet: null };
    const a = await manager({ previous: prev }).acquireLease(attrs('10.99.2.1'));
    assert.equal(a.how, 'previous');
    assert.equal(String(a.lease.subnet), '10.5.77.0/24');
    const b = await manager({ previous: prev }).acquireLease(attrs('10.99.2.2'));
    assert.equal(b.how, 'new');
    assert.notEqual(String(b.lease.subnet), '10.5.77.0/24');
  });

  it('lets one of two racing managers win a subnet and moves the other on', async () => {
    const prev = { subnet: IPNet.parse('10.5.88.0/24'), ipv6Subnet: null };
    const got = await Promise.all(
      Array.from({ length: 8 }, (_, i) => manager({ previous: prev }).acquireLease(attrs(`10.99.3.${i + 1}`))),
    );
    assert.equal(got.filter((g) => String(g.lease.subnet) === '10.5.88.0/24').length, 1);
    assert.equal(new Set(got.map((g) => String(g.lease.subnet))).size, 8);
    assert.ok(got.some((g) => g.retries > 0), 'someone lost a race and retried');
  });

  it('honours reservations: only the named node takes one, and it stays a reservation', async () => {
    const value = '{"PublicIP":"10.99.4.1","PublicIPv6":null}';
    await client.put(`${prefix}/subnets/10.5.4.0-24`).value(value);
    // Leave exactly one other free subnet, so a node that ignored the reservation would be seen.
    await client.put(`${prefix}/config`).value(
      JSON.stringify({ Network: '10.5.0.0/16', SubnetMin: '10.5.4.0', SubnetMax: '10.5.5.0', Backend: { Type: 'alloc' } }),
    );
    const other = await manager().acquireLease(attrs('10.99.4.2'));
    assert.equal(String(other.lease.subnet), '10.5.5.0/24');
    await assert.rejects(manager().acquireLease(attrs('10.99.4.3')), /out of subnets/);
    const owner = manager();
    const mine = await owner.acquireLease(attrs('10.99.4.1', { backendType: 'alloc' }));
    assert.equal(String(mine.lease.subnet), '10.5.4.0/24');
    assert.equal(mine.lease.reservation, true);
    const kv = await raw('10.5.4.0-24');
    assert.equal(kv!.lease, '0', 'still no etcd lease');
    assert.match(kv!.value.toString(), /"BackendType":"alloc"/);
    const renewed = await owner.renewLease(mine.lease);
    assert.equal(renewed.reservation, true);
    assert.equal((await raw('10.5.4.0-24'))!.lease, '0');
  });

  it('renews before expiry so the key outlives its TTL', async () => {
    const m = manager({ leaseTTLSeconds: 4, renewMarginSeconds: 2 });
    const { lease } = await m.acquireLease(attrs('10.99.5.1'));
    const ctl = new AbortController();
    const changes: string[] = [];
    const kept = m.keepLease(lease, (_l, how) => changes.push(how), ctl.signal);
    const start = Date.now();
    // Past twice the TTL, the key must still be there, bound to the same etcd lease.
    await waitFor(() => Date.now() - start > 8500 && changes.filter((c) => c === 'renew').length >= 2, {
      timeoutMs: 20_000,
      what: 'two renewals after 8.5 s',
    });
    const kv = await raw(`${lease.subnet!.ip}-24`);
    assert.ok(kv, 'key still present');
    const ttl = Number((await client.leaseClient.leaseTimeToLive({ ID: kv.lease })).TTL);
    assert.ok(ttl > 0 && ttl <= 4);
    assert.ok(!changes.includes('reacquire'));
    ctl.abort();
    await kept;
  });

  it('acquires the same subnet again when an operator deletes the key', async () => {
    const m = manager();
    const { lease } = await m.acquireLease(attrs('10.99.6.1'));
    const ctl = new AbortController();
    const seen: Array<[string, string]> = [];
    const kept = m.keepLease(lease, (l, how) => seen.push([how, String(l.subnet)]), ctl.signal);
    await client.delete().key(`${prefix}/subnets/${lease.subnet!.ip}-24`);
    await waitFor(() => seen.find(([how]) => how === 'reacquire'), { what: 're-acquisition' });
    assert.deepEqual(seen.find(([how]) => how === 'reacquire'), ['reacquire', String(lease.subnet)]);
    assert.ok(await raw(`${lease.subnet!.ip}-24`));
    ctl.abort();
    await kept;
  });

  it('skips a malformed value under subnets/ and keeps every peer', async () => {
    await manager().acquireLease(attrs('10.99.7.1'));
    await manager().acquireLease(attrs('10.99.7.2'));
    await client.put(`${prefix}/subnets/10.5.250.0-24`).value('{"PublicIP":""}'); // present before the listing
    const w = watch(manager());
    await waitFor(() => w.watcher.peers.length === 2, { what: 'two peers listed' });
    await client.put(`${prefix}/subnets/10.5.251.0-24`).value('not json');
    await client.put(`${prefix}/subnets/garbage`).value('{"PublicIP":"10.99.7.9"}');
    await client.put(`${prefix}/subnets/10.5.252.0-24`).value('{"PublicIP":"10.99.7.3","PublicIPv6":null}');
    await waitFor(() => w.watcher.peers.length === 3, { what: 'the good third peer' });
    assert.deepEqual(
      w.batches.flat().filter((e) => e.type === 'removed'),
      [],
      'no peer removed',
    );
    assert.match(logged, /skipping unparsable lease entry.*10\.5\.250\.0-24/);
    assert.match(logged, /skipping unparsable lease entry.*10\.5\.251\.0-24/);
    assert.match(logged, /skipping unparsable lease entry.*subnets\/garbage/);
    await w.stop();
  });

  it('re-lists after compaction while disconnected and yields exactly the difference', async () => {
    const a = await manager().acquireLease(attrs('10.99.8.1'));
    const b = await manager().acquireLease(attrs('10.99.8.2'));
    const proxy = await TcpProxy.start(etcd.clientPort);
    try {
      const w = watch(manager({}, proxy.endpoint));
      await waitFor(() => w.watcher.peers.length === 2, { what: 'initial listing' });
      proxy.pause(); // the watcher is cut off; the store moves on without it
      await client.delete().key(`${prefix}/subnets/${a.lease.subnet!.ip}-24`);
      const c = await manager().acquireLease(attrs('10.99.8.3'));
      for (let i = 0; i < 5; i++) await client.put(`/noise/${i}`).value(String(i));
      const rev = (await client.get('/noise/0').exec()).header.revision;
      await client.kv.compact({ revision: rev, physical: true });
      w.batches.length = 0;
      proxy.resume();
      await waitFor(() => w.watcher.peers.length === 2 && w.events().length >= 2, {
        timeoutMs: 30_000,
        what: 'the difference after compaction',
      });
      assert.deepEqual(w.events().sort(), [`added ${c.lease.subnet} 10.99.8.3`, `removed ${a.lease.subnet} 10.99.8.1`].sort());
      assert.deepEqual(w.watcher.peers.map((p) => String(p.subnet)).sort(), [String(b.lease.subnet), String(c.lease.subnet)].sort());
      await w.stop();
    } finally {
      await proxy.close();
    }
  });

  it('resumes the watch after etcd is down for a while, losing no event and keeping the lease', async function () {
    const outage = Number(process.env.WEFT_TEST_OUTAGE_SECONDS ?? 30);
    this.timeout(outage * 1000 + 90_000);
    const m = manager();
    const own = await m.acquireLease(attrs('10.99.9.1'));
    const peer = await manager().acquireLease(attrs('10.99.9.2'));
    const ctl = new AbortController();
    const changes: string[] = [];
    const kept = m.keepLease(own.lease, (_l, how) => changes.push(how), ctl.signal);
    const w = watch(m, () => own.lease);
    await waitFor(() => w.watcher.peers.length === 1, { what: 'peer listed' });
    await etcd.stop();
    const downSince = Date.now();
    await waitFor(() => Date.now() - downSince >= outage * 1000, { timeoutMs: outage * 1000 + 5000, what: 'the outage' });
    await etcd.restart();
    // Writes right after the restart must reach the watcher.
    await client.delete().key(`${prefix}/subnets/${peer.lease.subnet!.ip}-24`);
    const fresh = await manager().acquireLease(attrs('10.99.9.3'));
    await waitFor(() => w.events().length >= 3, { timeoutMs: 30_000, what: 'events after the restart' });
    // The two writes after the restart may arrive in one batch (net effect per lease, any order).
    assert.deepEqual(w.events().sort(), [
      `added ${peer.lease.subnet} 10.99.9.2`,
      `removed ${peer.lease.subnet} 10.99.9.2`,
      `added ${fresh.lease.subnet} 10.99.9.3`,
    ].sort());
    const kv = await raw(`${own.lease.subnet!.ip}-24`);
    assert.ok(kv, 'our lease survived');
    assert.ok(!changes.includes('reacquire'));
    ctl.abort();
    await Promise.all([kept, w.stop()]);
  });
});
