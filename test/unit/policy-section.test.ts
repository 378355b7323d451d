// src/backend/ovs/policy-section.ts: the part of the ovs backend's table the policy enforcer owns.
// host() waits for the backend to attach (and gives up when its signal aborts), exclusive() runs
// the backend's full passes and the enforcer's bundles one at a time, and flows() is null — keep
// the bridge's policy flows — until the enforcer has provided its own.
import assert from 'node:assert/strict';

import { cookieOf, Category, type Flow } from '../../src/backend/ovs/pipeline.js';
import { PolicyFlowSection, type PolicyFlowHost } from '../../src/backend/ovs/policy-section.js';

const host = (round: number): PolicyFlowHost => ({ round, bundle: () => Promise.resolve(), dumpPolicyFlows: () => Promise.resolve([]) });
const tick = () => new Promise((r) => setImmediate(r));
/** Whether `p` has settled after the pending callbacks ran. */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  p.then(
    () => (done = true),
    () => (done = true),
  );
  await tick();
  return done;
}

describe('ovs policy flow section (src/backend/ovs/policy-section.ts)', () => {
  it('host() waits for attach; every waiter gets the host; later calls get it at once', async () => {
    const s = new PolicyFlowSection();
    const ctl = new AbortController();
    const a = s.host(ctl.signal);
    const b = s.host(ctl.signal);
    assert.equal(await settled(a), false);
    const h = host(4);
    s.attach(h);
    assert.equal(await a, h);
    assert.equal(await b, h);
    assert.equal(await s.host(ctl.signal), h);
    // An abort after the host came changes nothing.
    ctl.abort();
    assert.equal(await s.host(ctl.signal), h);
  });

  it('host() rejects when its signal aborts, and only that waiter leaves the queue', async () => {
    const s = new PolicyFlowSection();
    const gone = new AbortController();
    const stays = new AbortController();
    const a = s.host(gone.signal);
    const b = s.host(stays.signal);
    gone.abort(new Error('enforcer stopped'));
    await assert.rejects(a, /enforcer stopped/);
    assert.equal(await settled(b), false);
    const h = host(2);
    s.attach(h);
    assert.equal(await b, h);
    // A plain abort() rejects with an Error too.
    const s2 = new PolicyFlowSection();
    const c = new AbortController();
    const p = s2.host(c.signal);
    c.abort();
    await assert.rejects(p, (e: unknown) => e instanceof Error);
  });

  // FAILING (src/backend/ovs/policy-section.ts): host() adds an 'abort' listener to a signal that
  // has already aborted, which never fires: the promise stays pending until a backend attaches
  // (forever, at shutdown) — PolicyOvsDriver's applyAll/check hang on it instead of failing.
  it('host() with a signal that has already aborted rejects (does not wait for an attach)', async () => {
    const s = new PolicyFlowSection();
    const ctl = new AbortController();
    ctl.abort(new Error('already stopped'));
    const p = s.host(ctl.signal);
    assert.equal(await settled(p), true, 'host() with an aborted signal is still pending');
    await assert.rejects(p, /already stopped/);
  });

  it('exclusive() runs one job at a time, in order, and a failed job does not stop the next', async () => {
    const s = new PolicyFlowSection();
    const log: string[] = [];
    let release = () => {};
    const first = s.exclusive(async () => {
      log.push('first start');
      await new Promise<void>((r) => (release = r));
      log.push('first end');
      return 1;
    });
    const second = s.exclusive(() => {
      log.push('second');
      return Promise.reject(new Error('bundle refused'));
    });
    const third = s.exclusive(() => {
      log.push('third');
      return Promise.resolve(3);
    });
    await tick();
    assert.deepEqual(log, ['first start']);
    release();
    assert.equal(await first, 1);
    await assert.rejects(second, /bundle refused/);
    assert.equal(await third, 3);
    assert.deepEqual(log, ['first start', 'first end', 'second', 'third']);
  });

  it('flows() is null until provide(), then the provider’s flows for the asked round', () => {
    const s = new PolicyFlowSection();
    assert.equal(s.flows(1), null);
    s.attach(host(1));
    assert.equal(s.flows(1), null, 'attaching the backend is not programming the section');
    const rounds: number[] = [];
    const made = (round: number): Flow[] => {
      rounds.push(round);
      return [{ table: 'ingressDefaultRule', priority: 200, match: [{ field: 'ip' }, { field: 'nw_dst', value: '10.9.0.3' }], actions: [{ type: 'drop' }], cookie: cookieOf(round, Category.Policy, 0) }];
    };
    s.provide(made);
    assert.deepEqual(s.flows(7), made(7));
    assert.deepEqual(rounds, [7, 7]);
    // An empty rule set is flows too (the bridge's stale policy flows go), not "keep the bridge's".
    s.provide(() => []);
    assert.deepEqual(s.flows(7), []);
  });
});
