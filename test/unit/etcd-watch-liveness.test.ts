// The decisions of the etcd watch watchdog (src/subnet/etcd/watch-liveness.ts) on an injected
// clock: when a quiet stream is probed, when an unanswered probe means a dead member, and which
// endpoint a re-established watch goes to.
import assert from 'node:assert/strict';
import { DEFAULT_LIVENESS, EndpointRotation, WatchLiveness, type LivenessVerdict } from '../../src/subnet/etcd/watch-liveness.js';

const T = { probeAfterMs: 2000, deadlineMs: 2500, tickMs: 500 };
const kind = (v: LivenessVerdict) => v.kind;

describe('WatchLiveness', () => {
  it('waits while the stream is heard from, probes after probeAfterMs of silence', () => {
    const l = new WatchLiveness(T, 0);
    assert.equal(kind(l.check(0)), 'wait');
    assert.equal(kind(l.check(1999)), 'wait');
    l.heard(1500); // an event
    assert.equal(kind(l.check(3000)), 'wait', 'silence is counted from the last message');
    assert.equal(kind(l.check(3500)), 'probe');
  });

  it('keeps one probe outstanding and declares the member dead when it goes unanswered for deadlineMs', () => {
    const l = new WatchLiveness(T, 0);
    assert.equal(kind(l.check(2000)), 'probe');
    assert.equal(kind(l.check(2500)), 'wait', 'no second probe while one is outstanding');
    assert.equal(kind(l.check(4499)), 'wait');
    assert.deepEqual(l.check(4500), { kind: 'dead', silentMs: 4500 });
    assert.deepEqual(l.check(5000), { kind: 'dead', silentMs: 5000 }, 'stays dead until heard from');
  });

  it('an answer to the probe (or any message) clears it', () => {
    const l = new WatchLiveness(T, 0);
    assert.equal(kind(l.check(2000)), 'probe');
    l.heard(2100);
    assert.equal(kind(l.check(4000)), 'wait', 'not dead: the probe was answered');
    assert.equal(kind(l.check(4100)), 'probe', 'the next probe after another quiet period');
    assert.equal(kind(l.check(6599)), 'wait');
    assert.equal(kind(l.check(6600)), 'dead');
  });

  it('a stream that keeps delivering is never probed', () => {
    const l = new WatchLiveness(T, 0);
    for (let t = 0; t <= 60_000; t += 500) {
      l.heard(t);
      assert.equal(kind(l.check(t + 250)), 'wait', `at ${t}`);
    }
  });

  it('a late-ordered message does not move the clock back', () => {
    const l = new WatchLiveness(T, 1000);
    l.heard(500);
    assert.equal(kind(l.check(2999)), 'wait');
    assert.equal(kind(l.check(3000)), 'probe');
  });

  it('detects a silent member within probeAfterMs + deadlineMs + two ticks when checked every tick', () => {
    const l = new WatchLiveness(DEFAULT_LIVENESS, 0);
    const lastHeard = 137; // anywhere between two ticks
    l.heard(lastHeard);
    let deadAt: number | null = null;
    for (let t = 0; deadAt === null && t < 60_000; t += DEFAULT_LIVENESS.tickMs) {
      if (l.check(t).kind === 'dead') deadAt = t;
    }
    assert.ok(deadAt !== null);
    const bound = DEFAULT_LIVENESS.probeAfterMs + DEFAULT_LIVENESS.deadlineMs + 2 * DEFAULT_LIVENESS.tickMs;
    assert.ok(deadAt - lastHeard <= bound, `dead ${deadAt - lastHeard} ms after the last message, bound ${bound}`);
    assert.ok(deadAt - lastHeard >= DEFAULT_LIVENESS.probeAfterMs + DEFAULT_LIVENESS.deadlineMs);
  });

  it('rejects timings that are not positive', () => {
    assert.throws(() => new WatchLiveness({ ...T, deadlineMs: 0 }, 0), RangeError);
    assert.throws(() => new WatchLiveness({ ...T, probeAfterMs: -1 }, 0), RangeError);
    assert.throws(() => new WatchLiveness({ ...T, tickMs: Number.NaN }, 0), RangeError);
  });
});

describe('EndpointRotation', () => {
  const eps = ['http://a:2379', 'http://b:2379', 'http://c:2379'];

  it('takes the endpoints in turn from the start index', () => {
    const r = new EndpointRotation(eps, 1);
    assert.deepEqual([r.pick(0), r.pick(0), r.pick(0), r.pick(0)], [eps[1], eps[2], eps[0], eps[1]]);
    assert.equal(new EndpointRotation(eps, 7).pick(0), eps[1], 'the start wraps around');
  });

  it('skips an endpoint that failed until its suspicion expires', () => {
    const r = new EndpointRotation(eps, 0, 30_000);
    r.suspect(eps[0]!, 1000);
    assert.equal(r.isSuspect(eps[0]!, 1000), true);
    assert.deepEqual([r.pick(1000), r.pick(1000), r.pick(1000)], [eps[1], eps[2], eps[1]]);
    assert.equal(r.isSuspect(eps[0]!, 31_000), false);
    assert.equal(r.pick(31_000), eps[2]);
    assert.equal(r.pick(31_000), eps[0], 'back in turn after the suspicion');
  });

  it('when every endpoint failed, takes the one that failed longest ago', () => {
    const r = new EndpointRotation(eps, 0, 30_000);
    r.suspect(eps[1]!, 100);
    r.suspect(eps[2]!, 200);
    r.suspect(eps[0]!, 300);
    assert.equal(r.pick(400), eps[1]);
    r.suspect(eps[1]!, 500);
    assert.equal(r.pick(600), eps[2]);
  });

  it('trust() clears a suspicion at once', () => {
    const r = new EndpointRotation(eps, 0, 30_000);
    r.suspect(eps[1]!, 0);
    r.trust(eps[1]!);
    assert.deepEqual([r.pick(1), r.pick(1)], [eps[0], eps[1]]);
  });

  it('a single endpoint is always the one, suspect or not', () => {
    const r = new EndpointRotation([eps[0]!], 0);
    r.suspect(eps[0]!, 0);
    assert.equal(r.pick(1), eps[0]);
  });

  it('needs at least one endpoint', () => {
    assert.throws(() => new EndpointRotation([]), RangeError);
  });
});
