// Issue 16 in kube mode: three weftd (vxlan, --kube-subnet-mgr) in host namespaces against the fake
// API server, through three faults of the server — a restart, a burst of 410s, a slow server — with
// the invariants of the etcd fault scenarios, measured and printed (one line per scenario):
// - no lease lost or duplicated: each weftd keeps its subnet (subnet.env and its Node's annotations
//   unchanged, one "acquired lease" in its log); no two Nodes share a podCIDR; each node's peer
//   set is exact (below);
// - every weftd stays ready: /readyz, polled every 200 ms inside each host namespace, never answers
//   anything but 200 (the slowest answer is printed), and the process runs on;
// - lease changes — Nodes with a podCIDR and flannel's annotations created or deleted — are
//   programmed on every node (its route, neighbour and FDB entry all in place, or all gone):
//   those made during the fault within 5 s of the fault ending (the server listening again, the
//   410s over, the latency off), those made after it within 5 s of being made. The times are the
//   kernel's: `ip -o monitor route neigh nexthop` and `bridge monitor fdb` in every host namespace,
//   stamped on arrival;
// - no entry (route, nexthop, neighbour, FDB) of a live peer is removed at any time: the same
//   notifications, from before the first fault to the end;
// - no busy loop: weftd's CPU over the fault (utime+stime from /proc/<pid>/stat) stays under 10%
//   of one core;
// - exact catch-up: afterwards each node's routes, neighbours and FDB entries on flannel.1 are
//   exactly the live peers'.
// Each host reaches the server through its own forwarder port, so the server's request log (Host
// header) tells the nodes' lists and watches apart. First, the fake's three faults as a client
// sees them (no namespaces).
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { join } from 'node:path';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { FakeKube, type JsonObject, type RequestRecord } from '../helpers/fake-kube.js';
import { ipn, lines, sh } from '../helpers/netns.js';
import { NetnsForward } from '../helpers/netns-forward.js';
import { waitFor } from '../helpers/wait.js';

const A = 'flannel.alpha.coreos.com/';
const BOUND_MS = 5000;
const CPU_LIMIT = 0.1;
const apiPort = (h: Host) => 6440 + h.i;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Peer {
  readonly name: string;
  readonly subnet: string;
  readonly gw: string;
  readonly mac: string;
  readonly publicIP: string;
  /** The host behind it, for the three weftd nodes. */
  readonly host?: number;
  deletedAt?: number;
}

interface Change {
  readonly peer: Peer;
  readonly kind: 'add' | 'del';
  readonly at: number;
  /** Made while the fault lasted: the bound runs from the fault's end. */
  readonly during: boolean;
}

type EntryKind = 'route' | 'nexthop' | 'neigh' | 'fdb';

interface Notification {
  readonly at: number;
  readonly kind: EntryKind;
  readonly deleted: boolean;
  /**
   * The peer's gateway address (route, nexthop, neighbour) or VTEP MAC (FDB). `ip monitor neigh`
   * also reports the vxlan FDB (AF_BRIDGE) entries, as "<public IP> dev flannel.1 lladdr <MAC>".
   */
  readonly key: string;
  readonly text: string;
}

/** Parses one monitor line about flannel.1; null for anything else. */
function parseNotification(at: number, raw: string): Notification | null {
  const text = raw.replace(/^\[[A-Z]+\]\s*/, '').trim();
  const deleted = text.startsWith('Deleted ');
  const body = deleted ? text.slice('Deleted '.length) : text;
  if (!/\bdev flannel\.1\b/.test(body)) return null;
  let m = /^(\d+\.\d+\.\d+\.\d+)\/\d+ .*\bproto 88\b/.exec(body);
  if (m) return { at, kind: 'route', deleted, key: m[1]!, text };
  m = /^id \d+ via (\d+\.\d+\.\d+\.\d+) dev flannel\.1/.exec(body);
  if (m) return { at, kind: 'nexthop', deleted, key: m[1]!, text };
  // A deleted neighbour is reported without its lladdr.
  m = /^(\d+\.\d+\.\d+\.\d+) dev flannel\.1\b/.exec(body);
  if (m) return { at, kind: 'neigh', deleted, key: m[1]!, text };
  m = /^([0-9a-f]{2}(?::[0-9a-f]{2}){5}) dev flannel\.1 dst /.exec(body);
  if (m) return { at, kind: 'fdb', deleted, key: m[1]!, text };
  return null;
}

/** Line-wise output of a child process, each line stamped when it arrived. */
function follow(proc: ChildProcess, onLine: (at: number, line: string) => void): void {
  let buf = '';
  proc.stdout?.on('data', (d: Buffer) => {
    const at = Date.now();
    buf += d.toString();
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      onLine(at, buf.slice(0, nl));
      buf = buf.slice(nl + 1);
    }
  });
}

/** The kernel's notifications of one host namespace, from a known point on. */
class Observer {
  readonly notes: Notification[] = [];
  private readonly raw: string[] = [];
  private readonly procs: ChildProcess[];

  private constructor(readonly host: Host) {
    const ip = spawn('ip', ['-n', host.ns, '-o', 'monitor', 'route', 'neigh', 'nexthop'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const fdb = spawn('bridge', ['-n', host.ns, 'monitor', 'fdb'], { stdio: ['ignore', 'pipe', 'ignore'] });
    this.procs = [ip, fdb];
    for (const p of this.procs) {
      follow(p, (at, line) => {
        this.raw.push(line);
        const n = parseNotification(at, line);
        if (n) this.notes.push(n);
      });
    }
  }

  /** Subscribed for sure once a marker change made after the spawn is reported by both monitors. */
  static async start(host: Host): Promise<Observer> {
    await ipn(host.ns, 'link', 'add', 'wfmon0', 'type', 'bridge');
    const o = new Observer(host);
    let n = 0;
    await waitFor(async () => {
      if (o.raw.some((l) => l.includes('192.0.2.99')) && o.raw.some((l) => l.includes('02:00:5e:00:53:01'))) return true;
      await ipn(host.ns, 'route', 'replace', '192.0.2.99/32', 'dev', 'lo', 'metric', String(++n));
      await sh('bridge', ['-n', host.ns, 'fdb', 'replace', '02:00:5e:00:53:01', 'dev', 'wfmon0', 'self', 'permanent']);
      return false;
    }, { intervalMs: 100, what: `the monitors of ${host.ns} subscribed` });
    return o;
  }

  stop(): void {
    for (const p of this.procs) p.kill();
  }
}

/**
 * /readyz polled every 200 ms from inside the host namespace; every answer but a 200 is kept, and
 * the slowest answer. A late answer is not a failure: on a machine shared with other tests, a
 * namespace being torn down elsewhere holds the kernel's rtnl lock for seconds, and weftd's
 * netlink requests (sent from its main thread, like any `ip` command) wait for it.
 */
class ReadyProbe {
  readonly failures: string[] = [];
  answered = 0;
  slowestMs = 0;
  private readonly proc: ChildProcess;

  constructor(host: Host) {
    const script = `
      let ok = 0, slowest = 0;
      setInterval(async () => {
        const t = Date.now();
        try {
          const r = await fetch('http://127.0.0.1:8081/readyz', { signal: AbortSignal.timeout(30000) });
          await r.text();
          slowest = Math.max(slowest, Date.now() - t);
          if (r.status === 200) ok++; else console.log('bad ' + r.status);
        } catch (e) { console.log('bad ' + e.message); }
      }, 200);
      setInterval(() => console.log('ok ' + ok + ' ' + slowest), 500);`;
    this.proc = spawn('ip', ['netns', 'exec', host.ns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
    follow(this.proc, (at, line) => {
      const m = /^ok (\d+) (\d+)$/.exec(line);
      if (m) [this.answered, this.slowestMs] = [Number(m[1]), Number(m[2])];
      else this.failures.push(`${new Date(at).toISOString()} ${line}`);
    });
  }

  stop(): void {
    this.proc.kill();
  }
}

let clockTicks = 100;
/** CPU time (user + system) of a process so far, in ms. */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // After "pid (comm) ": state is field 3; utime and stime are fields 14 and 15.
  return ((Number(f[11]) + Number(f[12])) * 1000) / clockTicks;
}

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;

/** A watch read with node:http (as weft's client does): events with their arrival time, and how it ended. */
function rawWatch(fake: FakeKube, query: string): Promise<{ head: number; events: { at: number; text: string }[]; end: Promise<'end' | 'broken'> }> {
  const t0 = Date.now();
  return new Promise((resolve, reject) => {
    const req = get(`${fake.url}/api/v1/nodes?watch=true&${query}`, { agent: false }, (res) => {
      const events: { at: number; text: string }[] = [];
      let buf = '';
      const end = new Promise<'end' | 'broken'>((done) => {
        res.on('end', () => done('end'));
        res.on('close', () => done('broken'));
      });
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        buf += d;
        let nl: number;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const ev = JSON.parse(buf.slice(0, nl)) as { type: string; object: JsonObject };
          const meta = (ev.object.metadata ?? {}) as Record<string, string | undefined>;
          events.push({ at: Date.now() - t0, text: `${ev.type} ${meta.name ?? (ev.object.message as string)}` });
          buf = buf.slice(nl + 1);
        }
      });
      resolve({ head: Date.now() - t0, events, end });
    });
    req.on('error', reject);
  });
}

describe('fake API server faults, as a client sees them', function () {
  this.timeout(20_000);
  let fake: FakeKube;
  beforeEach(async () => {
    fake = await FakeKube.start();
    fake.nodes.create('a');
  });
  afterEach(() => fake.stop());

  it('restart: a graceful stop ends watches cleanly; back with a fresh watch cache, older resourceVersions are 410', async () => {
    const before = fake.resourceVersion();
    const w = await rawWatch(fake, `resourceVersion=${before}`);
    await fake.pause({ graceful: true });
    assert.equal(await w.end, 'end');
    fake.nodes.create('b');
    await fake.resume({ freshWatchCache: true });
    const old = await rawWatch(fake, `resourceVersion=${before}`);
    assert.equal(await old.end, 'end');
    assert.deepEqual(old.events.map((e) => e.text), [`ERROR too old resource version: ${before} (${fake.resourceVersion()})`]);
    const list = (await (await fetch(`${fake.url}/api/v1/nodes`)).json()) as JsonObject;
    assert.deepEqual((list.items as JsonObject[]).map((n) => (n.metadata as JsonObject).name), ['a', 'b'], 'same objects');
    const fresh = await rawWatch(fake, `resourceVersion=${fake.resourceVersion()}`);
    fake.nodes.create('c');
    await waitFor(() => fresh.events.length === 1, { what: 'an event on the new server' });
    await fake.pause();
    assert.equal(await fresh.end, 'broken', 'a crash cuts the stream');
    assert.deepEqual(fake.requests.filter((r) => r.watch).map((r) => r.watchError ?? 0), [0, 410, 0]);
  });

  it('compaction repeated: watches end, and every watch or list resuming from a resourceVersion is 410 until it stops', async () => {
    const w = await rawWatch(fake, `resourceVersion=${fake.resourceVersion()}`);
    fake.compactContinuously(true);
    assert.equal(await w.end, 'end');
    const again = await rawWatch(fake, `resourceVersion=${fake.resourceVersion()}`);
    assert.equal(await again.end, 'end');
    assert.match(again.events.map((e) => e.text).join(), /^ERROR too old resource version/);
    assert.equal((await fetch(`${fake.url}/api/v1/nodes`)).status, 200, 'a plain list is served');
    assert.equal((await fetch(`${fake.url}/api/v1/nodes?resourceVersion=${fake.resourceVersion()}&resourceVersionMatch=Exact`)).status, 410);
    const paged = (await (await fetch(`${fake.url}/api/v1/nodes`)).json()) as JsonObject;
    fake.nodes.create('b');
    const first = (await (await fetch(`${fake.url}/api/v1/nodes?limit=1`)).json()) as JsonObject;
    const cont = (first.metadata as Record<string, string>).continue!;
    assert.equal((await fetch(`${fake.url}/api/v1/nodes?limit=1&continue=${encodeURIComponent(cont)}`)).status, 410);
    fake.compactContinuously(false);
    const ok = await rawWatch(fake, `resourceVersion=${(paged.metadata as Record<string, string>).resourceVersion!}`);
    await waitFor(() => ok.events.length === 1, { what: 'the replay after the burst' });
    assert.deepEqual(ok.events.map((e) => e.text), ['ADDED b']);
  });

  it('slow: responses and watch events come late, in order, and an end waits behind the events', async () => {
    fake.setLatency(300);
    const w = await rawWatch(fake, `resourceVersion=${fake.resourceVersion()}`);
    assert.ok(w.head >= 290, `head after ${w.head} ms`);
    const t = Date.now();
    fake.nodes.create('b');
    fake.setLatency(0);
    fake.nodes.create('c'); // not before b
    fake.endWatches();
    assert.equal(await w.end, 'end');
    assert.deepEqual(w.events.map((e) => e.text), ['ADDED b', 'ADDED c']);
    assert.ok(Date.now() - t >= 290, 'the end came behind the held events');
  });
});

describe('weftd --kube-subnet-mgr through API server faults: restart, a burst of 410s, a slow server', function () {
  this.timeout(120_000);
  let c: Cluster;
  let fake: FakeKube;
  const forwards: NetnsForward[] = [];
  const observers: Observer[] = [];
  const probes: ReadyProbe[] = [];
  const peers = new Map<string, Peer>();
  const changes: Change[] = [];
  let hosts: Host[] = [];
  /** Per host: subnet.env text and its Node's annotations right after start-up. */
  const initial = new Map<number, { env: string; annotations: Record<string, string> }>();

  const annotationsOf = (name: string) => ({ ...(((fake.nodes.get(name)!.metadata as JsonObject).annotations ?? {}) as Record<string, string>) });

  function createPeer(k: number): Peer {
    const hex = k.toString(16).padStart(2, '0');
    const p: Peer = { name: `peer-${k}`, subnet: `10.13.${k}.0/24`, gw: `10.13.${k}.0`, mac: `0e:cf:00:00:00:${hex}`, publicIP: `10.250.1.${k}` };
    fake.nodes.create(p.name, {
      annotations: {
        [`${A}kube-subnet-manager`]: 'true',
        [`${A}backend-type`]: 'vxlan',
        [`${A}backend-data`]: `{"VNI":1,"VtepMAC":"${p.mac}"}`,
        [`${A}public-ip`]: p.publicIP,
      },
      spec: { podCIDR: p.subnet, podCIDRs: [p.subnet] },
    });
    peers.set(p.name, p);
    return p;
  }

  /** A lease change, timed: before the store write, so the measured lag is never too short. */
  function change(kind: 'add' | 'del', what: number | string, during: boolean): void {
    const at = Date.now();
    let peer: Peer;
    if (kind === 'add') {
      peer = createPeer(what as number);
    } else {
      peer = peers.get(what as string)!;
      peer.deletedAt = at;
      fake.nodes.delete(peer.name);
    }
    changes.push({ peer, kind, at, during });
  }

  /** When each fault began and ended, for failure messages. */
  const timeline: string[] = [];
  const mark = (what: string) => timeline.push(`${new Date().toISOString().slice(11, 23)} ${what}`);

  const live = () => [...peers.values()].filter((p) => p.deletedAt === undefined);

  /** When `c` was fully programmed on `h` (all three entries added, or all three removed), or null. */
  function programmedAt(h: Host, ch: Change): number | null {
    const o = observers[h.i - 1]!;
    const del = ch.kind === 'del';
    let worst = 0;
    for (const [kind, key] of [['route', ch.peer.gw], ['neigh', ch.peer.gw], ['fdb', ch.peer.mac]] as const) {
      // Deleting a nexthop object takes its routes with it, and the kernel does not report those.
      const n = o.notes.find(
        (x) => (x.kind === kind || (del && kind === 'route' && x.kind === 'nexthop')) && x.key === key && x.deleted === del && x.at >= ch.at,
      );
      if (!n) return null;
      worst = Math.max(worst, n.at);
    }
    return worst;
  }

  /** Waits until every change of the scenario is programmed everywhere; the lags against the bound. */
  async function lags(scenario: Change[], faultEnd: number): Promise<{ during: number[]; after: number[] }> {
    await waitFor(() => scenario.every((ch) => hosts.every((h) => programmedAt(h, ch) !== null)), {
      timeoutMs: 20_000,
      what: 'every lease change programmed on every node',
    }).catch((e: Error) => {
      const missing = scenario.flatMap((ch) =>
        hosts
          .filter((h) => programmedAt(h, ch) === null)
          .map((h) => {
            const seen = observers[h.i - 1]!.notes.filter((n) => n.key === ch.peer.gw || n.key === ch.peer.mac).map((n) => `${n.at - ch.at} ms ${n.text}`);
            return `${ch.kind} ${ch.peer.name} on h${h.i} (seen: ${seen.join('; ') || 'nothing'})`;
          }),
      );
      throw new Error(`${e.message}: ${missing.join(' | ')}`);
    });
    const during: number[] = [];
    const after: number[] = [];
    for (const ch of scenario) {
      for (const h of hosts) {
        const t = programmedAt(h, ch)!;
        if (ch.during) during.push(t - faultEnd);
        else after.push(t - ch.at);
      }
    }
    return { during, after };
  }

  /** Removals of entries whose peer was live at that moment (or that belong to no peer at all). */
  function liveRemovals(): string[] {
    const out: string[] = [];
    for (const o of observers) {
      for (const n of o.notes) {
        if (!n.deleted) continue;
        const p = [...peers.values()].find((x) => (n.kind === 'fdb' ? x.mac === n.key : x.gw === n.key || x.publicIP === n.key));
        if (!p || p.deletedAt === undefined || n.at < p.deletedAt) out.push(`h${o.host.i}: ${n.text}`);
      }
    }
    return out;
  }

  async function entries(h: Host): Promise<{ routes: string[]; neigh: string[]; fdb: string[] }> {
    const routes = lines(await ipn(h.ns, 'route'))
      .filter((l) => l.includes(' proto 88') && l.includes(' dev flannel.1 '))
      .map((l) => l.replace(/nhid \d+ /, ''))
      .sort();
    const neigh = lines(await ipn(h.ns, 'neigh', 'show', 'dev', 'flannel.1')).sort();
    const fdb = lines(await sh('bridge', ['-n', h.ns, 'fdb', 'show', 'dev', 'flannel.1'])).filter((l) => l.includes(' dst ')).sort();
    return { routes, neigh, fdb };
  }

  function expected(h: Host): { routes: string[]; neigh: string[]; fdb: string[] } {
    const others = live().filter((p) => p.host !== h.i);
    return {
      routes: others.map((p) => `${p.subnet} via ${p.gw} dev flannel.1 proto 88 onlink`).sort(),
      neigh: others.map((p) => `${p.gw} lladdr ${p.mac} PERMANENT`).sort(),
      fdb: others.map((p) => `${p.mac} dst ${p.publicIP} self permanent`).sort(),
    };
  }

  /** Exact catch-up, the leases kept, readiness and no live entry removed: the checks after every fault. */
  async function checkInvariants(): Promise<void> {
    await waitFor(async () => {
      for (const h of hosts) if (JSON.stringify(await entries(h)) !== JSON.stringify(expected(h))) return false;
      return true;
    }, { timeoutMs: BOUND_MS, what: 'every node holding exactly the live peers' }).catch(async (e: Error) => {
      const diff = await Promise.all(
        hosts.map(async (h) => {
          const [got, want] = [await entries(h), expected(h)];
          const d = (k: 'routes' | 'neigh' | 'fdb') => [
            ...got[k].filter((x) => !want[k].includes(x)).map((x) => `+${x}`),
            ...want[k].filter((x) => !got[k].includes(x)).map((x) => `-${x}`),
          ];
          return `h${h.i}: ${[...d('routes'), ...d('neigh'), ...d('fdb')].join(', ') || 'same'}`;
        }),
      );
      throw new Error(`${e.message} (+ unexpected, - missing): ${diff.join(' | ')}`);
    });
    assert.deepEqual(liveRemovals(), [], 'no entry of a live peer removed');
    for (const h of hosts) {
      assert.ok(h.weftd!.running, `weftd on h${h.i} running`);
      const was = initial.get(h.i)!;
      assert.equal(readFileSync(h.subnetFile, 'utf8'), was.env, `h${h.i} subnet.env unchanged`);
      assert.deepEqual(annotationsOf(`h${h.i}`), was.annotations, `h${h.i} Node annotations unchanged`);
      assert.equal(h.weftd!.output.split('\n').filter((l) => l.includes('acquired lease')).length, 1, `h${h.i} acquired its lease once`);
      const probe = probes[h.i - 1]!;
      assert.deepEqual(probe.failures, [], `h${h.i} ready throughout (timeline: ${timeline.join(', ')}); its log:\n${h.weftd!.output.split('\n').slice(-40).join('\n')}`);
    }
    const cidrs = fake.nodes.list().map((n) => (n.spec as JsonObject).podCIDR).filter((x) => typeof x === 'string');
    assert.equal(new Set(cidrs).size, cidrs.length, 'no two Nodes share a podCIDR');
  }

  const cpuNow = () => hosts.map((h) => cpuMs(h.weftd!.proc.pid!));
  /** Per host, the list/watch attempts that failed so far (the server's log cannot see refused ones). */
  const watchFailures = () => Promise.all(hosts.map((h) => h.metric('weft_store_errors_total{op="watch"}')));

  /** CPU share of one core per weftd between two readings over `ms`. */
  const cpuShare = (before: number[], after: number[], ms: number) => after.map((a, i) => (a - before[i]!) / ms);

  function requestsOf(h: Host, from: number, to: number): RequestRecord[] {
    return fake.requests.filter((r) => r.headers.host === `${ETCD_IP}:${apiPort(h)}` && r.at >= from && r.at <= to);
  }

  const lists = (rs: RequestRecord[]) => rs.filter((r) => r.method === 'GET' && r.path === '/api/v1/nodes' && !r.watch).length;
  const watches = (rs: RequestRecord[]) => rs.filter((r) => r.watch).length;
  const expired = (rs: RequestRecord[]) => rs.filter((r) => r.watchError === 410 || r.status === 410).length;
  const perHost = (from: number, to: number, f: (rs: RequestRecord[]) => number) => hosts.map((h) => f(requestsOf(h, from, to))).join('/');
  const readiness = () => `/readyz ${probes.reduce((n, p) => n + p.answered, 0)} × 200 (slowest ${Math.max(...probes.map((p) => p.slowestMs))} ms)`;
  const worst = (xs: number[]) => (xs.length === 0 ? NaN : Math.max(...xs));
  const fmt = (ms: number) => `${Math.round(ms)} ms`;

  function assertBounds(name: string, l: { during: number[]; after: number[] }, cpu: number[]): void {
    assert.ok(worst(l.during) <= BOUND_MS, `${name}: a change made during the fault programmed ${fmt(worst(l.during))} after it ended`);
    assert.ok(worst(l.after) <= BOUND_MS, `${name}: a change made after the fault programmed ${fmt(worst(l.after))} after it was made`);
    for (const [i, share] of cpu.entries()) assert.ok(share < CPU_LIMIT, `${name}: weftd on h${i + 1} used ${pct(share)} of a core during the fault`);
  }

  before(async () => {
    clockTicks = Number((await sh('getconf', ['CLK_TCK'])).trim()) || 100;
    fake = await FakeKube.start();
    c = await Cluster.create({ hosts: 3, tag: 'kf', config: {} });
    hosts = c.hosts;
    for (const h of hosts) {
      forwards.push(await NetnsForward.start(c.underlay, { host: ETCD_IP, port: apiPort(h) }, { host: '127.0.0.1', port: fake.port }));
    }
    const netConf = join(c.dir, 'net-conf.json');
    writeFileSync(netConf, JSON.stringify({ Network: '10.12.0.0/14', Backend: { Type: 'vxlan' } }));
    for (const h of hosts) fake.nodes.create(`h${h.i}`, { spec: { podCIDR: `10.12.${h.i}.0/24`, podCIDRs: [`10.12.${h.i}.0/24`] } });
    for (let k = 1; k <= 6; k++) createPeer(k);
    for (const h of hosts) {
      await h.startWeftd(['--kube-subnet-mgr', '--kube-api-url', `http://${ETCD_IP}:${apiPort(h)}`, '--net-config-path', netConf], { NODE_NAME: `h${h.i}` });
    }
    for (const h of hosts) {
      const annotations = annotationsOf(`h${h.i}`);
      const mac = /"VtepMAC":"([0-9a-f:]+)"/.exec(annotations[`${A}backend-data`] ?? '')![1]!;
      peers.set(`h${h.i}`, { name: `h${h.i}`, subnet: `10.12.${h.i}.0/24`, gw: `10.12.${h.i}.0`, mac, publicIP: h.underlayIP, host: h.i });
      initial.set(h.i, { env: readFileSync(h.subnetFile, 'utf8'), annotations });
    }
    for (const h of hosts) await h.attachPod();
    for (const h of hosts) probes.push(new ReadyProbe(h));
    for (const h of hosts) observers.push(await Observer.start(h));
    // The starting point every fault is measured from: all peers programmed, everyone ready.
    mark('monitors and probes started');
    await checkInvariants();
    await waitFor(() => probes.every((p) => p.answered > 0), { what: 'the readiness probes answered' });
  });

  after(async () => {
    for (const o of observers) o.stop();
    for (const p of probes) p.stop();
    await c?.destroy();
    for (const f of forwards) await f.stop();
    await fake?.stop();
  });

  it('server restart: a graceful stop, 6 s down, back with a fresh watch cache; then an instant restart', async () => {
    const first = changes.length;
    // Stopped the way SIGTERM stops an API server: its watches end cleanly, then it stops listening.
    const failed0 = await watchFailures();
    const cpu0 = cpuNow();
    const down = Date.now();
    mark('restart: stopping');
    await fake.pause({ graceful: true });
    mark('restart: down');
    // Written meanwhile through another API server of the control plane: the store moves on.
    await sleep(1000);
    change('add', 11, true);
    change('del', 'peer-1', true);
    await sleep(2500);
    change('add', 12, true);
    await sleep(2500);
    // A new process: its watch cache starts now, so any watch from before answers 410.
    await fake.resume({ freshWatchCache: true });
    const up = Date.now();
    mark('restart: up');
    const cpu = cpuShare(cpu0, cpuNow(), up - down);
    await sleep(200);
    change('add', 13, false);
    await sleep(1800);
    // Removals after the fault are of peers every node has: a Node created during the fault and
    // deleted before a node caught up is rightly never programmed there.
    change('del', 'peer-5', false);
    const l = await lags(changes.slice(first), up);
    const failed = (await watchFailures()).map((n, i) => n - failed0[i]!).join('/');

    // An instant restart: watches end cleanly and resume from their resourceVersion against a
    // fresh watch cache (410 → list again) — or meet the closed port and list again after it.
    const second = changes.length;
    const t0 = Date.now();
    mark('instant restart');
    await fake.pause({ graceful: true });
    change('del', 'peer-2', true);
    await fake.resume({ freshWatchCache: true });
    const back = Date.now();
    change('add', 14, false);
    const l2 = await lags(changes.slice(second), back);
    const t1 = Date.now();

    await checkInvariants();
    console.log(
      `      kube restart: down ${((up - down) / 1000).toFixed(1)} s (failed list/watch attempts per node ${failed}, weftd CPU ${cpu.map(pct).join('/')}) → ` +
        `changes made while down programmed everywhere ≤ ${fmt(worst(l.during))} after the server was back, changes after ≤ ${fmt(worst(l.after))} after being made | ` +
        `instant restart: 410s ${perHost(t0, t1, expired)}, lists ${perHost(t0, t1, lists)} per node, programmed ≤ ${fmt(worst(l2.during))} after it was back / ≤ ${fmt(worst(l2.after))} after being made | ` +
        `live entries removed: 0, ${readiness()}, lease kept: 3/3, exact: yes`,
    );
    assertBounds('restart', l, cpu);
    // No CPU figure here: the fault has no duration, and the catch-up is all the work there is.
    assertBounds('instant restart', l2, []);
  });

  it('a burst of 410s for 8 s: every watch and every list from a resourceVersion expired', async () => {
    const first = changes.length;
    const cpu0 = cpuNow();
    const start = Date.now();
    fake.compactContinuously(true);
    mark('410 burst on');
    await sleep(1000);
    change('add', 21, true);
    change('del', 'peer-3', true);
    await sleep(3000);
    change('add', 22, true);
    await sleep(2500);
    change('del', 'peer-12', true);
    await sleep(1500);
    fake.compactContinuously(false);
    mark('410 burst off');
    const end = Date.now();
    const cpu = cpuShare(cpu0, cpuNow(), end - start);
    await sleep(200);
    change('add', 23, false);
    await sleep(1800);
    change('del', 'peer-6', false);
    const l = await lags(changes.slice(first), end);
    await checkInvariants();
    console.log(
      `      kube 410 burst: ${((end - start) / 1000).toFixed(1)} s, per node lists ${perHost(start, end, lists)}, watches ${perHost(start, end, watches)}, 410s ${perHost(start, end, expired)}, ` +
        `weftd CPU ${cpu.map(pct).join('/')} → changes made during it programmed everywhere ≤ ${fmt(worst(l.during))} after it ended (min ${fmt(Math.min(...l.during))}), ` +
        `changes after ≤ ${fmt(worst(l.after))} after being made | live entries removed: 0, ${readiness()}, lease kept: 3/3, exact: yes`,
    );
    assertBounds('410 burst', l, cpu);
  });

  it('a slow server for 10 s: 3 s per response and per watch event, its watches broken at the start', async () => {
    const first = changes.length;
    const latency = 3000;
    const cpu0 = cpuNow();
    const start = Date.now();
    fake.setLatency(latency);
    mark('slow on');
    // Connections dropped (as an overloaded server's do): every node lists and watches again through the slowness.
    fake.breakWatches();
    await sleep(1000);
    change('add', 31, true);
    change('del', 'peer-4', true);
    await sleep(4000);
    change('add', 32, true);
    await sleep(3000);
    change('del', 'peer-13', true);
    await sleep(2000);
    fake.setLatency(0);
    mark('slow off');
    const end = Date.now();
    const cpu = cpuShare(cpu0, cpuNow(), end - start);
    await sleep(200);
    change('add', 33, false);
    await sleep(1800);
    change('del', 'peer-11', false);
    const l = await lags(changes.slice(first), end);
    const fromMade = changes.slice(first).filter((ch) => ch.during).flatMap((ch) => hosts.map((h) => programmedAt(h, ch)! - ch.at));
    await checkInvariants();
    console.log(
      `      kube slow server: ${latency / 1000} s per response for ${((end - start) / 1000).toFixed(1)} s, per node lists ${perHost(start, end + latency, lists)}, watches ${perHost(start, end + latency, watches)}, ` +
        `weftd CPU ${cpu.map(pct).join('/')} → changes made during it programmed everywhere ${fmt(Math.min(...fromMade))}–${fmt(worst(fromMade))} after being made, ≤ ${fmt(worst(l.during))} after it ended; ` +
        `changes after ≤ ${fmt(worst(l.after))} after being made | live entries removed: 0, ${readiness()}, lease kept: 3/3, exact: yes`,
    );
    assertBounds('slow server', l, cpu);
    // And the dataplane works end to end after all three.
    await waitFor(() => c.allPodsReachable(), { timeoutMs: 15_000, what: 'pods reaching each other' });
  });
});
