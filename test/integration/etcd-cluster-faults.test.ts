// Three vxlan weftd hosts against a real 3-member etcd (every member in a namespace of its own on
// the underlay), with faults injected while fake peer leases churn: the leader SIGKILLed, the member
// a weftd's watch is connected to partitioned away, quorum lost. Asserted on every node: every change
// etcd acknowledged is programmed within 5 s, no entry of a live peer is ever deleted (ip monitor /
// bridge monitor), every weftd stays ready, leases are neither lost nor duplicated, and the kernel
// ends up exactly equal to etcd. Each scenario prints its figures on one line.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import type { Host } from '../helpers/cluster.js';
import {
  type EtcdCluster,
  type LeaseWriter,
  Scenario,
  assertLeasesKept,
  assertReport,
  divergence,
  heldLeases,
  latencySummary,
} from '../helpers/etcd-cluster.js';
import { nsExec } from '../helpers/netns.js';
import { etcdFaultSuite } from '../helpers/etcd-fault-suite.js';
import { waitFor } from '../helpers/wait.js';

const BOUND_MS = 5000;

/** Established TCP connections of `pid` to port 2379, with the bytes received on each, by remote IP. */
async function bytesFromEtcd(h: Host, pid: number): Promise<Map<string, number>> {
  const out = await nsExec(h.ns, 'ss', '-tniHp', 'state', 'established', '(', 'dport', '=', ':2379', ')');
  const byIp = new Map<string, number>();
  // Each connection: a line with the addresses and users:(...), then indented TCP info.
  const conns = out.split(/\n(?=\S)/);
  for (const c of conns) {
    if (!c.includes(`pid=${pid},`)) continue;
    const remote = /\s(\d+\.\d+\.\d+\.\d+):2379\s/.exec(c)?.[1];
    const rx = Number(/bytes_received:(\d+)/.exec(c)?.[1] ?? 0);
    if (remote) byIp.set(remote, (byIp.get(remote) ?? 0) + rx);
  }
  return byIp;
}

/**
 * The member a weftd's lease watch is connected to: the one connection whose received bytes grow
 * when leases change (watch events), clearly more than any other (keepalive pings are tiny). Null
 * when no connection carries the changes within 5 s (the watch is stuck).
 */
async function watchMember(h: Host, etcd: EtcdCluster, writer: LeaseWriter): Promise<number | null> {
  const pid = h.weftd!.proc.pid!;
  for (let attempt = 0; attempt < 5; attempt++) {
    const before = await bytesFromEtcd(h, pid);
    for (let i = 0; i < 3; i++) await writer.put();
    let grown: Array<[string, number]> = [];
    const found = await waitFor(
      async () => {
        const after = await bytesFromEtcd(h, pid);
        grown = [...after].map(([ip, rx]): [string, number] => [ip, rx - (before.get(ip) ?? 0)]).sort((a, b) => b[1] - a[1]);
        const [top, next] = [grown[0], grown[1]];
        return top && top[1] >= 300 && (!next || top[1] >= 2 * next[1]) ? top[0] : null;
      },
      { timeoutMs: 5000, what: 'the watch connection' },
    ).catch(() => null);
    if (found) return etcd.indexOf(found);
    if (grown.every(([, d]) => d < 300)) return null;
  }
  return null;
}

describe('weftd against a 3-member etcd: leader kill, partition, quorum loss', function () {
  this.timeout(300_000);
  const s = etcdFaultSuite({ tag: 'ecf', seed: 1604 });
  const { etcdctl } = s;

  it('keeps every lease, entry and readiness when the leader is SIGKILLed while leases churn', async () => {
    const held = await heldLeases(s.c.hosts, etcdctl);
    const scenario = (s.scenario = await Scenario.start(s.c.hosts, s.writer, etcdctl, '/readyz', s.etcd));
    s.writer.phase = 'before';
    s.writer.start();
    await s.writer.waitAcked(15, (o) => o.phase === 'before');
    const old = (await s.etcd.leader())!;
    assert.notEqual(old, null);
    s.writer.phase = 'election';
    const killedAt = Date.now();
    await s.etcd.kill(old);
    const next = await waitFor(async () => {
      const l = await s.etcd.leader();
      return l !== null && l !== old ? l : null;
    }, { timeoutMs: 15_000, what: 'a new leader' });
    const electedAt = Date.now();
    const electedMs = electedAt - killedAt;
    s.writer.phase = 'after';
    await s.writer.waitAcked(20, (o) => o.phase === 'after');
    await s.etcd.restart(old);
    s.writer.phase = 'rejoined';
    await s.writer.waitAcked(10, (o) => o.phase === 'rejoined');
    await s.writer.stop();
    const r = await scenario.finish(BOUND_MS);
    const byPhase = (p: string) => r.ops.filter((o) => o.phase === p).length;
    const failed = r.ops.reduce((n, o) => n + o.attempts - 1, 0);
    // Changes in flight while there was no leader: sent before the new one was known, acknowledged after the kill.
    const inElection = r.ops.filter((o) => o.sent < electedAt && o.acked > killedAt);
    console.log(
      `      leader kill: e${old + 1} SIGKILLed, e${next + 1} leader after ${electedMs} ms | ${latencySummary(r)} ` +
        `(before/election/after/rejoined ${byPhase('before')}/${byPhase('election')}/${byPhase('after')}/${byPhase('rejoined')}, ${inElection.length} in flight during the election, ${failed} refused and retried) | ` +
        `late ${r.programming.late.length} | live entries deleted ${r.liveDeletions.length} | ready probes ${r.probeSamples - r.probeFailures.length}/${r.probeSamples} | exact ${r.divergence.length === 0 ? `yes, ${r.exactAfterMs} ms after the last ack` : 'NO'}`,
    );
    assertReport(r, BOUND_MS);
    assert.ok(inElection.length > 0, 'a change was in flight during the election');
    await assertLeasesKept(s.c.hosts, etcdctl, held, s.writer);
  });

  it('moves the watch off a partitioned member within seconds and programs every change within 5 s', async () => {
    const h = s.c.hosts[0]!;
    const held = await heldLeases(s.c.hosts, etcdctl);
    const member = await watchMember(h, s.etcd, s.writer);
    assert.notEqual(member, null, `found no etcd connection of ${h.ns}'s weftd carrying its watch`);
    const m = member!;
    const wasLeader = (await s.etcd.leader()) === m;
    await waitFor(async () => (await divergence(s.c.hosts, etcdctl)).length === 0, { timeoutMs: 15_000, what: 'converged after the probe changes' });
    const scenario = (s.scenario = await Scenario.start(s.c.hosts, s.writer, etcdctl, '/readyz', s.etcd));
    s.writer.phase = 'before';
    s.writer.start();
    await s.writer.waitAcked(5, (o) => o.phase === 'before');
    const logMark = h.weftd!.output.length;
    const seen: { ms: number | null; line: string } = { ms: null, line: '' };
    const partitionedAt = Date.now();
    await s.etcd.partition(m, 'link');
    s.writer.phase = 'partitioned';
    // The weftd's first log line about etcd after the cut: it noticed.
    const notice = setInterval(() => {
      const line = h.weftd!.output.slice(logMark).split('\n').find((l) => /etcd|watch/i.test(l));
      if (seen.ms === null && line !== undefined) {
        seen.ms = Date.now() - partitionedAt;
        seen.line = line;
      }
    }, 50);
    try {
      // The partition lasts until changes have been acknowledged for 12 s past the cut.
      await s.writer.waitAcked(1, (o) => o.phase === 'partitioned' && o.acked >= partitionedAt + 12_000, 60_000);
      s.writer.phase = 'moved';
      // Still partitioned: which member carries the watch now?
      await s.writer.stop();
      const now = await watchMember(h, s.etcd, s.writer);
      s.writer.phase = 'healed';
      await s.etcd.heal(m);
      await s.etcd.waitHealthy();
      s.writer.start();
      await s.writer.waitAcked(5, (o) => o.phase === 'healed');
      await s.writer.stop();
      const r = await scenario.finish(BOUND_MS);
      const noticedMs = seen.ms;
      const during = r.ops.filter((o) => o.phase === 'partitioned' || o.phase === 'moved');
      const onH = scenario.monitors[0]!;
      const lateOnH = r.programming.late.filter((l) => l.startsWith(`${h.ns}:`)).length;
      console.log(
        `      partition: ${h.ns.replace(/.*-/, '')}'s watch on e${m + 1}${wasLeader ? ' (the leader)' : ''}, link down | weftd noticed ${noticedMs === null ? 'never (no log line)' : `after ${noticedMs} ms ("${seen.line.slice(0, 140)}")`} | ` +
          `watch then on ${now === null ? 'no member (stuck)' : `e${now + 1}`} | ${during.length} changes while cut off, ${lateOnH} late on ${h.ns.replace(/.*-/, '')} | ${latencySummary(r)} | ` +
          `late ${r.programming.late.length}${r.programming.late.length ? ` (first: ${r.programming.late[0]})` : ''} | live entries deleted ${r.liveDeletions.length} | exact ${r.divergence.length === 0 ? 'yes' : 'NO'} | kernel events on h1 ${onH.events.length}`,
      );
      assert.ok(noticedMs !== null && noticedMs <= BOUND_MS, `weftd logged nothing about etcd within ${BOUND_MS} ms of the cut (noticed: ${noticedMs})`);
      assert.ok(now !== null && now !== m, `the watch moved to another member while e${m + 1} was cut off (now: ${now === null ? 'none' : `e${now + 1}`})`);
      assertReport(r, BOUND_MS);
      await assertLeasesKept(s.c.hosts, etcdctl, held, s.writer);
    } finally {
      clearInterval(notice);
    }
  });

  it('keeps the dataplane and every lease while quorum is lost, and is normal when it is back', async () => {
    const held = await heldLeases(s.c.hosts, etcdctl);
    const scenario = (s.scenario = await Scenario.start(s.c.hosts, s.writer, etcdctl, '/readyz', s.etcd));
    s.writer.phase = 'before';
    s.writer.start();
    await s.writer.waitAcked(5, (o) => o.phase === 'before');
    await s.writer.stop();
    await waitFor(async () => (await divergence(s.c.hosts, etcdctl)).length === 0, { timeoutMs: 10_000, what: 'converged before the loss' });
    const routes = await Promise.all(s.c.hosts.map((h) => nsExec(h.ns, 'ip', 'route', 'show', 'proto', '88')));
    const leader = (await s.etcd.leader())!;
    const down = [leader, (leader + 1) % 3];
    const lostAt = Date.now();
    for (const i of down) await s.etcd.kill(i);
    s.writer.phase = 'no quorum';
    const refusedBefore = s.writer.failedAttempts;
    s.writer.start();
    // Quorum is lost for as long as it takes the survivor to refuse three changes.
    await waitFor(() => s.writer.failedAttempts >= refusedBefore + 3, { timeoutMs: 60_000, what: 'three changes refused without quorum' });
    const lostMs = Date.now() - lostAt;
    const during = await Promise.all(s.c.hosts.map((h) => nsExec(h.ns, 'ip', 'route', 'show', 'proto', '88')));
    const duringLeases = s.c.hosts.map((h) => readFileSync(h.subnetFile, 'utf8'));
    const survivor = [0, 1, 2].find((i) => !down.includes(i))!;
    const backAt = Date.now();
    for (const i of down) await s.etcd.restart(i, 'running');
    await s.etcd.waitHealthy();
    const quorumMs = Date.now() - backAt;
    await s.writer.stop();
    // Back to normal: once every node has seen a change made after the recovery (how long that
    // took is reported, not bounded), every change is held to the 5 s bound again.
    s.writer.phase = 'catch-up';
    const catchUpMs = await scenario.catchUp();
    s.writer.phase = 'quorum back';
    s.writer.start();
    await s.writer.waitAcked(10, (o) => o.phase === 'quorum back');
    await s.writer.stop();
    // Changes acknowledged while the members were still recovering are only required to arrive
    // exactly; those made once every node caught up are held to the 5 s bound.
    const r = await scenario.finish(BOUND_MS, (o) => o.phase === 'quorum back');
    const recovering = r.ops.filter((o) => o.phase === 'no quorum');
    const lag = recovering.map((o) => (scenario.memberWatches!.delivered(survivor, o.revision) ?? NaN) - o.acked);
    const u = r.untimed.latencies;
    console.log(
      `      quorum loss: e${down[0]! + 1}+e${down[1]! + 1} SIGKILLed for ${lostMs} ms (${s.writer.failedAttempts - refusedBefore} changes refused), all healthy again ${quorumMs} ms after the restart, every node caught up ${catchUpMs} ms after the next change | ` +
        `routes unchanged while lost: ${during.every((d, i) => d === routes[i]) ? 'yes' : 'NO'} | once healthy: ${latencySummary(r)}, late ${r.programming.late.length} | ` +
        `${recovering.length} acked during the recovery: programmed max ${u.length ? Math.max(...u) : NaN} ms after the ack, survivor e${survivor + 1} delivered them to a bare watch max ${lag.length ? Math.max(...lag) : NaN} ms after the ack | ` +
        `live entries deleted ${r.liveDeletions.length} | ready probes ${r.probeSamples - r.probeFailures.length}/${r.probeSamples}${r.probeFailures.length ? ` (${r.probeFailures[0]})` : ''} | exact ${r.divergence.length === 0 ? 'yes' : 'NO'}`,
    );
    assert.deepEqual(during, routes, 'the dataplane did not change while quorum was lost');
    assert.deepEqual(duringLeases, s.c.hosts.map((h) => held.get(h.ns)!.env), 'subnet.env unchanged while quorum was lost');
    assertReport(r, BOUND_MS);
    await assertLeasesKept(s.c.hosts, etcdctl, held, s.writer);
  });
});
