// Three vxlan weftd hosts against a real 3-member etcd (every member in a namespace of its own on
// the underlay): a rolling restart of every member and a compaction + defragmentation while leases
// churn and watches are open, then the whole etcd cluster down for 60 s. Asserted on every node:
// every change etcd acknowledged is programmed within 5 s, no entry of a live peer is ever deleted
// (ip monitor / bridge monitor), the dataplane does not change while etcd is away, weftd does not
// spin while it is (CPU ms per second, from /proc), leases are kept, and the kernel ends up exactly
// equal to etcd. Each scenario prints its figures on one line.
import assert from 'node:assert/strict';
import {
  Scenario,
  assertLeasesKept,
  assertReport,
  cpuMs,
  heldLeases,
  kernelEntries,
  latencySummary,
} from '../helpers/etcd-cluster.js';
import { etcdFaultSuite } from '../helpers/etcd-fault-suite.js';

const BOUND_MS = 5000;
/** The issue's outage length. */
const OUTAGE_MS = 60_000;
/**
 * "Low" CPU while etcd is down, per weftd: 5% of one core (a reconnect loop without backoff costs
 * most of one). The same daemon idling with etcd up is measured for comparison.
 */
const IDLE_CPU_MS_PER_S = 50;
/** The window of that comparison. */
const BASELINE_MS = 10_000;

describe('weftd against a 3-member etcd: rolling restart, compaction, whole cluster down', function () {
  this.timeout(300_000);
  // The timer pass would dominate an idle daemon's CPU time; changes arrive through the watch.
  const s = etcdFaultSuite({ tag: 'eco', seed: 1605, weftdArgs: ['--reconcile-interval', '10'] });
  const { etcdctl } = s;

  it('rolls a restart through every member without losing or deleting anything', async () => {
    const held = await heldLeases(s.c.hosts, etcdctl);
    const scenario = (s.scenario = await Scenario.start(s.c.hosts, s.writer, etcdctl, '/readyz', s.etcd));
    s.writer.phase = 'before';
    s.writer.start();
    await s.writer.waitAcked(5, (o) => o.phase === 'before');
    const took: string[] = [];
    for (const i of [0, 1, 2]) {
      const wasLeader = (await s.etcd.leader()) === i;
      const t = Date.now();
      await s.etcd.stopMember(i);
      s.writer.phase = `e${i + 1} down`;
      await s.etcd.restart(i);
      await s.etcd.waitHealthy();
      took.push(`e${i + 1}${wasLeader ? '(leader)' : ''} ${Date.now() - t} ms`);
      s.writer.phase = `e${i + 1} back`;
      await s.writer.waitAcked(5, (o) => o.phase === `e${i + 1} back`);
    }
    await s.writer.stop();
    const r = await scenario.finish(BOUND_MS);
    const retried = r.ops.reduce((n, o) => n + o.attempts - 1, 0);
    console.log(
      `      rolling restart: ${took.join(', ')} (SIGTERM to healthy) | ${latencySummary(r)}, ${retried} refused and retried | late ${r.programming.late.length} | ` +
        `live entries deleted ${r.liveDeletions.length} | ready probes ${r.probeSamples - r.probeFailures.length}/${r.probeSamples} | exact ${r.divergence.length === 0 ? `yes, ${r.exactAfterMs} ms after the last ack` : 'NO'}`,
    );
    assertReport(r, BOUND_MS);
    await assertLeasesKept(s.c.hosts, etcdctl, held, s.writer);
  });

  it('compacts and defragments every member while watches are open, without a missed change', async () => {
    const held = await heldLeases(s.c.hosts, etcdctl);
    const cancelledBefore = s.c.hosts.map((h) => (h.weftd!.output.match(/watch cancelled/g) ?? []).length);
    const scenario = (s.scenario = await Scenario.start(s.c.hosts, s.writer, etcdctl, '/readyz', s.etcd));
    s.writer.phase = 'before';
    s.writer.start();
    await s.writer.waitAcked(10, (o) => o.phase === 'before');
    const rev = await s.etcd.compact();
    s.writer.phase = 'compacted';
    await s.writer.waitAcked(5, (o) => o.phase === 'compacted');
    const defrag = await s.etcd.defrag();
    s.writer.phase = 'defragmented';
    await s.writer.waitAcked(10, (o) => o.phase === 'defragmented');
    await s.writer.stop();
    const r = await scenario.finish(BOUND_MS);
    const cancelled = s.c.hosts.map((h, i) => (h.weftd!.output.match(/watch cancelled/g) ?? []).length - cancelledBefore[i]!);
    console.log(
      `      compaction: revision ${rev} compacted, defrag ${defrag.join('/')} ms | ${latencySummary(r)} | late ${r.programming.late.length} | ` +
        `watches cancelled and relisted ${cancelled.join('/')} | live entries deleted ${r.liveDeletions.length} | exact ${r.divergence.length === 0 ? 'yes' : 'NO'}`,
    );
    assertReport(r, BOUND_MS);
    await assertLeasesKept(s.c.hosts, etcdctl, held, s.writer);
  });

  it('keeps the dataplane through 60 s without any etcd member, idles meanwhile, and catches up exactly', async () => {
    const held = await heldLeases(s.c.hosts, etcdctl);
    const entries = await Promise.all(s.c.hosts.map((h) => kernelEntries(h)));
    // /healthz: the daemon answers while etcd is away (readiness is about its own start-up).
    const scenario = (s.scenario = await Scenario.start(s.c.hosts, s.writer, etcdctl, '/healthz', s.etcd));
    const pids = s.c.hosts.map((h) => h.weftd!.proc.pid!);
    // Idle with etcd up, probes running: a measurement window, not a wait for state.
    const base0 = await Promise.all(pids.map((p) => cpuMs(p)));
    const baseAt = Date.now();
    await new Promise((r) => setTimeout(r, BASELINE_MS));
    const base1 = await Promise.all(pids.map((p) => cpuMs(p)));
    const baseMs = Date.now() - baseAt;
    const idle = base1.map((v, i) => Math.round(((v - base0[i]!) / baseMs) * 1000 * 10) / 10);
    for (const i of [0, 1, 2]) await s.etcd.kill(i);
    const downAt = Date.now();
    const cpu0 = await Promise.all(pids.map((p) => cpuMs(p)));
    // The outage: a scenario length set by the issue, not a wait for a condition.
    await new Promise((r) => setTimeout(r, OUTAGE_MS));
    const cpu1 = await Promise.all(pids.map((p) => cpuMs(p)));
    const downMs = Date.now() - downAt;
    const perSecond = cpu1.map((v, i) => Math.round(((v - cpu0[i]!) / downMs) * 1000 * 10) / 10);
    const during = await Promise.all(s.c.hosts.map((h) => kernelEntries(h)));
    const upAt = Date.now();
    for (const i of [0, 1, 2]) await s.etcd.restart(i, 'running');
    await s.etcd.waitHealthy();
    const upMs = Date.now() - upAt;
    scenario.memberWatches?.kick();
    // The first change after the return shows how long the nodes took to catch up (reported; the
    // issue bounds it by "exact", not by time); every change after that is held to the 5 s bound.
    s.writer.phase = 'catch-up';
    const catchUpMs = await scenario.catchUp();
    s.writer.phase = 'back';
    s.writer.start();
    await s.writer.waitAcked(15, (o) => o.phase === 'back');
    await s.writer.stop();
    const r = await scenario.finish(BOUND_MS, (o) => o.phase === 'back');
    const logged = s.c.hosts.map((h) => h.weftd!.output.split('\n').filter((l) => /etcd/i.test(l)).length);
    console.log(
      `      cluster down: all 3 members SIGKILLed for ${downMs} ms | weftd CPU while down ${perSecond.join('/')} ms/s (idle with etcd up ${idle.join('/')} ms/s) | dataplane unchanged: ${JSON.stringify(during) === JSON.stringify(entries) ? 'yes' : 'NO'} | ` +
        `back healthy after ${upMs} ms, every node caught up ${catchUpMs} ms after the next change's ack | then ${latencySummary(r)} | late ${r.programming.late.length} | live entries deleted ${r.liveDeletions.length} | ` +
        `healthz probes ${r.probeSamples - r.probeFailures.length}/${r.probeSamples} | etcd log lines ${logged.join('/')} | exact ${r.divergence.length === 0 ? 'yes' : 'NO'}`,
    );
    assert.deepEqual(during, entries, 'the dataplane did not change while etcd was down');
    for (const [i, v] of perSecond.entries()) assert.ok(v <= IDLE_CPU_MS_PER_S, `weftd on ${s.c.hosts[i]!.ns} used ${v} ms of CPU per second while etcd was down`);
    assertReport(r, BOUND_MS);
    await assertLeasesKept(s.c.hosts, etcdctl, held, s.writer);
  });
});
