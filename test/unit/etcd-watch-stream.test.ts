// LivelyWatch (src/subnet/etcd/watch-stream.ts) against an in-memory etcd of several members that
// speaks the Watch stream protocol (create, events, progress requests, compaction): a member that
// goes silent is noticed, the watch moves to another member and resumes exactly after the last
// event delivered. Short liveness timings; every wait is on a condition with a deadline.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { PassThrough } from 'node:stream';
import type { IEvent, IWatchRequest, IWatchResponse } from 'etcd3';
import { EndpointRotation } from '../../src/subnet/etcd/watch-liveness.js';
import { LivelyWatch, WatchCanceledError, type WatchConnection, type WatchStreamLike } from '../../src/subnet/etcd/watch-stream.js';
import { createLogger } from '../../src/util/log.js';
import { waitFor } from '../helpers/wait.js';

const TIMINGS = { probeAfterMs: 30, deadlineMs: 60, tickMs: 10 };
const PREFIX = '/coreos.com/network/subnets/';
type Mode = 'up' | 'silent' | 'refuse' | 'no-create' | 'deny';

/** One Watch stream as a member serves it. */
class FakeStream extends EventEmitter implements WatchStreamLike {
  readonly requests: IWatchRequest[] = [];
  cancelled = false;
  /** The next revision this stream's watcher sends; null until created. */
  next: number | null = null;

  constructor(
    readonly member: FakeMember,
    readonly cluster: FakeCluster,
  ) {
    super();
  }

  write(req: IWatchRequest): void {
    this.requests.push(req);
    if (this.cancelled || this.member.mode === 'silent') return; // a partitioned member: nothing gets through
    if (req.create_request) {
      if (this.member.mode === 'no-create') return;
      if (this.member.mode === 'deny') return this.send({ created: true, canceled: true, cancel_reason: 'etcdserver: permission denied' });
      const from = Number(req.create_request.start_revision);
      if (from < this.cluster.compacted) {
        this.send({ created: true, canceled: false });
        this.send({ canceled: true, compact_revision: String(this.cluster.compacted) });
        return;
      }
      this.send({ created: true });
      this.next = from;
      this.cluster.flush(this);
    } else if (req.progress_request) {
      this.send({ watch_id: '-1' }); // etcd 3.4: not tied to a watcher
    }
  }

  send(res: Partial<IWatchResponse>): void {
    const full = { header: { revision: String(this.cluster.revision) }, watch_id: '0', created: false, canceled: false, compact_revision: '0', cancel_reason: '', events: [], ...res };
    queueMicrotask(() => {
      if (!this.cancelled) this.emit('data', full);
    });
  }

  cancel(): void {
    this.cancelled = true;
  }

  fail(message: string): void {
    queueMicrotask(() => this.emit('error', new Error(message)));
  }
}

class FakeMember {
  mode: Mode = 'up';
  constructor(readonly endpoint: string) {}
}

/** A store with one event log, served by several members. */
class FakeCluster {
  revision = 1;
  compacted = 0;
  readonly log: IEvent[] = [];
  readonly members: FakeMember[];
  readonly streams: FakeStream[] = [];
  closed = 0;

  constructor(n: number) {
    this.members = Array.from({ length: n }, (_, i) => new FakeMember(`http://m${i}:2379`));
  }

  member(endpoint: string): FakeMember {
    return this.members.find((m) => m.endpoint === endpoint)!;
  }

  connect = (endpoint: string): Promise<WatchConnection> => {
    const m = this.member(endpoint);
    if (m.mode === 'refuse') return Promise.reject(new Error(`connect ECONNREFUSED ${endpoint}`));
    const stream = new FakeStream(m, this);
    this.streams.push(stream);
    return Promise.resolve({ stream, close: () => this.closed++ });
  };

  /** A write; every stream of a member that is up gets it. */
  put(name: string, type: 'Put' | 'Delete' = 'Put'): number {
    const rev = ++this.revision;
    const key = Buffer.from(PREFIX + name);
    this.log.push({ type, kv: { key, value: Buffer.from('{}'), create_revision: String(rev), mod_revision: String(rev), version: '1', lease: '0' } } as IEvent);
    for (const s of this.streams) this.flush(s);
    return rev;
  }

  /** Sends a stream every event from its next revision on, one response per revision. */
  flush(s: FakeStream): void {
    if (s.cancelled || s.next === null || s.member.mode !== 'up') return;
    for (const ev of this.log) {
      const rev = Number(ev.kv.mod_revision);
      if (rev < s.next) continue;
      s.send({ events: [ev] });
      s.next = rev + 1;
    }
  }

  live(): FakeStream[] {
    return this.streams.filter((s) => !s.cancelled);
  }
}

describe('LivelyWatch (etcd watch kept alive across members)', () => {
  let cluster: FakeCluster;
  let logged = '';
  let watches: LivelyWatch[] = [];

  beforeEach(() => {
    cluster = new FakeCluster(3);
    logged = '';
    watches = [];
  });
  afterEach(async () => {
    await Promise.all(watches.map((w) => w.cancel()));
  });

  function make(fromRevision: string, start = 0) {
    const stream = new PassThrough();
    stream.on('data', (d: Buffer) => (logged += d.toString()));
    const seen: string[] = [];
    const errors: Error[] = [];
    const w = new LivelyWatch({
      what: 'leases',
      key: Buffer.from(PREFIX),
      rangeEnd: Buffer.from('/coreos.com/network/subnets0'),
      fromRevision,
      connect: cluster.connect,
      rotation: new EndpointRotation(cluster.members.map((m) => m.endpoint), start),
      endpointCount: cluster.members.length,
      logger: createLogger({ level: 'debug', stream }),
      createTimeoutMs: 200,
      timings: TIMINGS,
      onEvents: (events) => {
        for (const ev of events) seen.push(`${ev.type} ${ev.kv.key.toString().slice(PREFIX.length)} @${ev.kv.mod_revision}`);
      },
      onError: (err) => errors.push(err),
    });
    watches.push(w);
    return { w, seen, errors };
  }

  it('creates the watch from the start revision on a stream of its own and delivers what follows', async () => {
    cluster.put('a');
    const { w, seen } = make('3');
    const b = cluster.put('b'); // revision 3: the first one wanted
    await w.start();
    assert.deepEqual(seen, [], 'no callback before start() has returned');
    cluster.put('c', 'Delete');
    await waitFor(() => seen.length === 2, { what: 'two events' });
    assert.deepEqual(seen, [`Put b @${b}`, `Delete c @${b + 1}`]);
    const create = cluster.streams[0]!.requests[0]!.create_request!;
    assert.equal(create.start_revision, '3');
    assert.equal(create.key!.toString(), PREFIX);
    assert.equal(w.endpoint, 'http://m0:2379');
    assert.equal(w.resumeRevision, String(b + 2));
  });

  it('probes a quiet stream with progress requests and stays on a member that answers them', async () => {
    const { w } = make('2');
    await w.start();
    const s = cluster.streams[0]!;
    await waitFor(() => s.requests.filter((r) => r.progress_request).length >= 5, { what: 'five answered probes' });
    assert.equal(cluster.streams.length, 1, 'no second stream while the member answers');
    assert.equal(w.endpoint, 'http://m0:2379');
    assert.doesNotMatch(logged, /stopped answering/);
  });

  it('notices a member that went silent, logs it and resumes on another member exactly after the last event', async () => {
    const { w, seen } = make('2');
    await w.start();
    const r1 = cluster.put('a');
    await waitFor(() => seen.length === 1, { what: 'the first event' });
    cluster.member('http://m0:2379').mode = 'silent'; // partitioned: its links are down
    const r2 = cluster.put('b'); // acknowledged by the rest of the cluster, never sent by m0
    const r3 = cluster.put('c', 'Delete');
    await waitFor(() => seen.length === 3, { what: 'the events written during the partition' });
    assert.deepEqual(seen, [`Put a @${r1}`, `Put b @${r2}`, `Delete c @${r3}`], 'nothing lost, nothing twice');
    assert.equal(w.endpoint, 'http://m1:2379');
    assert.equal(cluster.streams[0]!.cancelled, true, 'the stream to the silent member is dropped');
    assert.ok(cluster.streams[0]!.requests.some((r) => r.progress_request), 'it was probed first');
    assert.equal(cluster.streams[1]!.requests[0]!.create_request!.start_revision, String(r1 + 1));
    assert.match(logged, /etcd member stopped answering the watch; switching to another member.*http:\/\/m0:2379/);
    assert.match(logged, /etcd watch re-established.*http:\/\/m1:2379/);
    // And it keeps working there.
    const r4 = cluster.put('d');
    await waitFor(() => seen.length === 4, { what: 'an event after the switch' });
    assert.equal(seen[3], `Put d @${r4}`);
  });

  it('re-establishes through another member when the stream fails, skipping members that cannot serve it', async () => {
    const { w, seen } = make('2');
    await w.start();
    cluster.member('http://m1:2379').mode = 'refuse';
    cluster.member('http://m0:2379').mode = 'refuse';
    cluster.streams[0]!.fail('14 UNAVAILABLE: etcdserver: no leader');
    const r = cluster.put('a');
    await waitFor(() => seen.length === 1, { what: 'the event through m2' });
    assert.equal(w.endpoint, 'http://m2:2379');
    assert.deepEqual(seen, [`Put a @${r}`]);
    assert.match(logged, /etcd watch interrupted; re-establishing it.*no leader/);
    assert.match(logged, /cannot re-establish the etcd watch; retrying.*m1:2379.*ECONNREFUSED/);
  });

  it('moves on from a member that accepts the stream but never creates the watch', async () => {
    cluster.member('http://m0:2379').mode = 'no-create';
    const { w } = make('2');
    await w.start();
    assert.equal(w.endpoint, 'http://m1:2379');
  });

  it('keeps retrying while every member is down and resumes when one returns', async () => {
    const { w, seen, errors } = make('2');
    await w.start();
    for (const m of cluster.members) m.mode = 'silent';
    const r = cluster.put('a');
    await waitFor(() => cluster.streams.length >= 6, { what: 'attempts on every member' });
    assert.deepEqual(seen, []);
    assert.deepEqual(errors, [], 'an outage is not the end of the watch');
    cluster.member('http://m2:2379').mode = 'up';
    await waitFor(() => seen.length === 1, { what: 'the event once m2 is back', timeoutMs: 15_000 });
    assert.deepEqual(seen, [`Put a @${r}`]);
    assert.equal(w.endpoint, 'http://m2:2379');
  });

  it('ends with one onError when etcd cancels the watch (compaction), without reconnecting', async () => {
    const { w, errors } = make('2');
    await w.start();
    cluster.put('a');
    await waitFor(() => w.resumeRevision === String(cluster.revision + 1), { what: 'the first event' });
    cluster.member('http://m0:2379').mode = 'silent';
    cluster.put('b');
    cluster.put('c');
    cluster.compacted = cluster.revision; // b is gone from the history the watch resumes from
    await waitFor(() => errors.length === 1, { what: 'the compaction reported' });
    assert.ok(errors[0] instanceof WatchCanceledError);
    assert.equal(errors[0].compactRevision, String(cluster.revision));
    const streams = cluster.streams.length;
    cluster.put('b');
    await waitFor(() => cluster.live().length === 0, { what: 'every stream released' });
    assert.equal(cluster.streams.length, streams, 'no new stream after the end');
    assert.equal(w.endpoint, null);
  });

  it('start() fails after trying each member once, or at once when the watch is refused', async () => {
    for (const m of cluster.members) m.mode = 'refuse';
    const { w } = make('2');
    await assert.rejects(w.start(), /ECONNREFUSED/);
    assert.equal(cluster.streams.length, 0);
    for (const m of cluster.members) m.mode = 'deny';
    const second = make('2');
    await assert.rejects(second.w.start(), (e: unknown) => e instanceof WatchCanceledError && /permission denied/.test(e.message));
    assert.equal(cluster.streams.length, 1, 'a refusal is not retried elsewhere');
    assert.equal(second.errors.length, 0, 'a refusal at start is thrown, not reported');
    // A start revision already compacted: etcd 3.4 creates the watch, then cancels it.
    for (const m of cluster.members) m.mode = 'up';
    cluster.put('x');
    cluster.put('y');
    cluster.compacted = cluster.revision;
    const third = make('2');
    await third.w.start();
    await waitFor(() => third.errors.length === 1, { what: 'the compaction reported after start' });
    assert.match(third.errors[0]!.message, /revision compacted \(oldest kept: 3\)/);
  });

  it('cancel() stops everything: no callback, no probe, no reconnect', async () => {
    const { w, seen } = make('2');
    await w.start();
    cluster.put('a');
    await w.cancel();
    cluster.member('http://m0:2379').mode = 'silent';
    cluster.put('b');
    assert.equal(cluster.streams[0]!.cancelled, true);
    assert.equal(cluster.closed, 1);
    assert.equal(w.endpoint, null);
    await new Promise((r) => setImmediate(r)); // pending deliveries run on the next turn: none may
    assert.deepEqual(seen, []);
  });
});
