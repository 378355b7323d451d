import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { EventBatcher } from '../../src/daemon/batcher.js';
import type { Lease, LeaseEvent, LeaseEventType } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

function lease(subnet: string, mac = 'aa:aa:aa:aa:aa:01', v6?: string): Lease {
  return {
    subnet: IPNet.parse(subnet),
    ipv6Subnet: v6 ? IPNet.parse(v6) : null,
    attrs: { publicIP: IPAddr.parse('192.168.0.1'), publicIPv6: null, backendType: 'vxlan', backendData: { VtepMAC: mac } },
    reservation: false,
    expiration: null,
  };
}

function ev(type: LeaseEventType, subnet: string, mac?: string, v6?: string): LeaseEvent {
  return { type, lease: lease(subnet, mac, v6) };
}

function show(batch: readonly LeaseEvent[] | null): string[] | null {
  if (batch === null) return null;
  return batch.map((e) => {
    const data = e.lease.attrs.backendData;
    const mac = data !== null && typeof data === 'object' && !Array.isArray(data) && typeof data.VtepMAC === 'string' ? data.VtepMAC : '-';
    const v6 = e.lease.ipv6Subnet ? `&${e.lease.ipv6Subnet.toString()}` : '';
    return `${e.type} ${e.lease.subnet?.toString()}${v6} ${mac}`;
  });
}

/** Whether `p` has settled once every pending callback and immediate has run (no timers involved). */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  p.then(
    () => (done = true),
    () => (done = true),
  );
  await new Promise<void>((r) => setImmediate(r));
  return done;
}

describe('EventBatcher', () => {
  it('push then next returns the batch, and the batcher is empty afterwards', async () => {
    const b = new EventBatcher();
    const ac = new AbortController();
    b.push([ev('added', '10.5.1.0/24'), ev('added', '10.5.2.0/24')]);
    assert.equal(b.size, 2);
    assert.deepEqual(show(await b.next(ac.signal)), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:01', 'added 10.5.2.0/24 aa:aa:aa:aa:aa:01']);
    assert.equal(b.size, 0);
    const again = b.next(ac.signal);
    assert.equal(await settled(again), false, 'nothing left to hand out');
    ac.abort();
    assert.equal(await again, null);
  });

  it('merges pushes made while no one waits into one batch, latest event per lease', async () => {
    const b = new EventBatcher();
    const ac = new AbortController();
    b.push([ev('added', '10.5.1.0/24')]);
    b.push([ev('added', '10.5.2.0/24')]);
    b.push([ev('removed', '10.5.1.0/24')]); // added then removed -> removed
    b.push([ev('removed', '10.5.3.0/24'), ev('added', '10.5.3.0/24', 'aa:aa:aa:aa:aa:03')]); // removed then added -> added
    b.push([ev('added', '10.5.2.0/24', 'aa:aa:aa:aa:aa:22')]); // newer attrs win
    b.push([]);
    assert.equal(b.size, 3);
    // Arrival order of each lease's latest event.
    assert.deepEqual(show(await b.next(ac.signal)), [
      'removed 10.5.1.0/24 aa:aa:aa:aa:aa:01',
      'added 10.5.3.0/24 aa:aa:aa:aa:aa:03',
      'added 10.5.2.0/24 aa:aa:aa:aa:aa:22',
    ]);
    assert.equal(b.size, 0);
  });

  it('tells leases apart by both subnets', async () => {
    const b = new EventBatcher();
    b.push([
      ev('added', '10.5.1.0/24', 'aa:aa:aa:aa:aa:01', 'fd00:5:0:1::/64'),
      ev('added', '10.5.1.0/24', 'aa:aa:aa:aa:aa:02'),
      ev('removed', '10.5.1.0/24', 'aa:aa:aa:aa:aa:03', 'fd00:5:0:1::/64'),
    ]);
    assert.deepEqual(show(await b.next(new AbortController().signal)), [
      'added 10.5.1.0/24 aa:aa:aa:aa:aa:02',
      'removed 10.5.1.0/24&fd00:5:0:1::/64 aa:aa:aa:aa:aa:03',
    ]);
  });

  it('next() waits for a push, and a push of nothing does not wake it', async () => {
    const b = new EventBatcher();
    const ac = new AbortController();
    const p = b.next(ac.signal);
    assert.equal(await settled(p), false);
    b.push([]);
    assert.equal(await settled(p), false);
    b.push([ev('removed', '10.5.7.0/24')]);
    assert.deepEqual(show(await p), ['removed 10.5.7.0/24 aa:aa:aa:aa:aa:01']);
  });

  it('events pushed in several calls before the waiter runs arrive in one batch', async () => {
    const b = new EventBatcher();
    const ac = new AbortController();
    const p = b.next(ac.signal);
    assert.equal(await settled(p), false);
    b.push([ev('added', '10.5.1.0/24')]);
    b.push([ev('added', '10.5.2.0/24')]);
    b.push([ev('removed', '10.5.1.0/24')]);
    assert.deepEqual(show(await p), ['added 10.5.2.0/24 aa:aa:aa:aa:aa:01', 'removed 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
  });

  it('next() returns null when the signal aborts while waiting, or was aborted already', async () => {
    const b = new EventBatcher();
    const ac = new AbortController();
    const p = b.next(ac.signal);
    assert.equal(await settled(p), false);
    ac.abort();
    assert.equal(await p, null);
    assert.equal(await b.next(ac.signal), null, 'already aborted, nothing pending');
    // Events pushed after the abort are still there for a later consumer.
    b.push([ev('added', '10.5.1.0/24')]);
    assert.deepEqual(show(await b.next(new AbortController().signal)), ['added 10.5.1.0/24 aa:aa:aa:aa:aa:01']);
  });

  it('a consumer loop sees every lease in its final state, however pushes and takes interleave', async () => {
    const b = new EventBatcher();
    const ac = new AbortController();
    const final = new Map<string, string>();
    const consumer = (async () => {
      for (;;) {
        const batch = await b.next(ac.signal);
        if (batch === null) return;
        for (const e of batch) final.set(e.lease.subnet!.toString(), `${e.type}`);
      }
    })();
    const want = new Map<string, string>();
    for (let i = 0; i < 200; i++) {
      const subnet = `10.5.${i % 17}.0/24`;
      const type: LeaseEventType = i % 3 === 0 ? 'removed' : 'added';
      b.push([ev(type, subnet)]);
      want.set(subnet, type);
      if (i % 7 === 0) await new Promise<void>((r) => setImmediate(r)); // let the consumer take a batch
    }
    while (b.size > 0) await new Promise<void>((r) => setImmediate(r));
    ac.abort();
    await consumer;
    assert.deepEqual([...final.entries()].sort(), [...want.entries()].sort());
  });

  it('does not accumulate abort listeners on a long-lived signal', async () => {
    // The daemon passes one signal for its whole life; each wait must not leave a listener behind
    // (Node warns about a possible EventTarget leak past 10 listeners, and memory grows per batch).
    const b = new EventBatcher();
    const ac = new AbortController();
    for (let i = 0; i < 25; i++) {
      const p = b.next(ac.signal);
      assert.equal(await settled(p), false);
      b.push([ev('added', `10.5.${i}.0/24`)]);
      assert.equal((await p)?.length, 1);
    }
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
  });
});
