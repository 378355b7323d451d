// The soak: three vxlan weft hosts against a real 3-member etcd, with everything happening at once
// for minutes — fake peer leases churning, pods added and deleted on every host through the flannel
// CNI plugin, the etcd leader SIGKILLed every minute, one weftd SIGKILLed and restarted, entries
// deleted by hand behind weftd's back — while invariants are checked continuously:
//   - no two leases in etcd overlap;
//   - every host's weft entries (routes, neighbours, FDB) equal the leases in etcd: an entry may be
//     missing or extra only transiently, never for longer than the bound (5 s) after it was first
//     seen to differ (or after its weftd came back);
//   - every pair of live pods pings (a failed ping is retried until the bound);
//   - nothing is left behind by a CNI DEL: no veth, no host-local IP file, no flannel state file,
//     no masquerade rule, no policy rule, and no conntrack flow of the pod once the kernel's own
//     timeouts have run;
//   - weftd's RSS and open file descriptors stay flat (start/end/max reported);
//   - every CNI ADD and DEL succeeds, every weftd keeps running and keeps its lease.
// runSoak() returns the violations and one summary line; bench/soak.ts runs it for 10 minutes,
// test/integration/soak-short.test.ts for 60 seconds. Everything it made is removed at the end,
// whatever happened (and at process exit as a last resort, by the helpers it uses).
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { masqChainName } from '../../cni-plugins/bridge/ipmasq.js';
import { cniBinDir, REFERENCE_CNI_DIR, runCni } from './cni.js';
import { Cluster, type Host } from './cluster.js';
import {
  type EtcdCluster,
  type EntryKind,
  expectedEntries,
  kernelEntries,
  KernelMonitor,
  LeaseWriter,
  percentile,
  storedLeases,
  type StoredPeer,
} from './etcd-cluster.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from './netns.js';
import { prng } from './prng.js';
import { waitFor } from './wait.js';

export interface SoakOptions {
  readonly durationMs: number;
  /** Namespace tag (short). */
  readonly tag?: string;
  readonly seed?: number;
  /** Progress lines (and the setup steps); default: nothing. */
  readonly log?: (line: string) => void;
  /** Aborting ends the soak early: no final checks, everything removed. */
  readonly signal?: AbortSignal;
  /** The reconcile bound every divergence, repair and ping is held to (default 5000 ms). */
  readonly boundMs?: number;
  /** Leader kills: the first at this offset (default 20 s), then every `leaderKillEveryMs` (60 s). */
  readonly firstLeaderKillMs?: number;
  readonly leaderKillEveryMs?: number;
  /** When the one weftd is SIGKILLed (default 55 % into the run). */
  readonly weftdKillAtMs?: number;
  /** Hand-made drift, every … ms (default 12 s), from 8 s on. */
  readonly driftEveryMs?: number;
  /** Pause before each lease change (default 300 ms) and between CNI operations (default 700 ms). */
  readonly leasePaceMs?: number;
  readonly cniPaceMs?: number;
  readonly progressEveryMs?: number;
}

interface Pod {
  readonly n: number;
  readonly id: string;
  readonly ns: string;
  readonly host: Host;
  readonly ip: string;
  readonly hostVeth: string;
  deleting: boolean;
}

interface ProcSample {
  readonly t: number;
  readonly rssKb: number;
  readonly fds: number;
}

interface ProcRecord {
  readonly host: Host;
  readonly pid: number;
  readonly startedAt: number;
  readonly restarted: boolean;
  readonly samples: ProcSample[];
}

export interface ResourceFigures {
  readonly host: string;
  readonly restarted: boolean;
  readonly rssMb: { start: number; end: number; max: number };
  readonly fds: { start: number; end: number; max: number };
}

export interface SoakResult {
  readonly violations: string[];
  readonly summary: string;
  readonly interrupted: boolean;
  readonly resources: ResourceFigures[];
}

const NETWORK = 'wtsoak';
const CONNTRACK_GRACE_MS = 40_000; // the kernel's ICMP timeout (30 s) and a margin

const sleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal.aborted || ms <= 0) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });

/** IPv4 CIDR → [first, last] as numbers. */
function range(cidr: string): [number, number] {
  const [ip, len] = cidr.split('/') as [string, string];
  const n = ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);
  const size = 2 ** (32 - Number(len));
  const first = n - (n % size);
  return [first, first + size - 1];
}

/** Pairs of leases whose subnets overlap (equal included). */
export function overlaps(leases: readonly StoredPeer[]): string[] {
  const out: string[] = [];
  const r = leases.map((l) => ({ l, r: range(l.subnet) })).sort((a, b) => a.r[0] - b.r[0]);
  for (let i = 1; i < r.length; i++) {
    for (let j = i - 1; j >= 0 && r[j]!.r[1] >= r[i]!.r[0]; j--) out.push(`${r[j]!.l.key} overlaps ${r[i]!.l.key}`);
  }
  return out;
}

const stats = (xs: readonly number[]): string =>
  xs.length === 0 ? '-' : `${percentile(xs, 50)}/${percentile(xs, 99)}/${Math.max(...xs)}`;

export async function runSoak(opts: SoakOptions): Promise<SoakResult> {
  const log = opts.log ?? (() => undefined);
  const bound = opts.boundMs ?? 5000;
  const duration = opts.durationMs;
  const tag = opts.tag ?? 'soak';
  const random = prng(opts.seed ?? 1616);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  const violations: string[] = [];
  const seenViolations = new Set<string>();
  const violate = (v: string): void => {
    // After an interrupt (Ctrl-C reaches weftd and etcd too) what breaks is the interrupt's doing.
    if (seenViolations.has(v) || opts.signal?.aborted) return;
    seenViolations.add(v);
    violations.push(v);
    log(`  VIOLATION ${v}`);
  };
  // `stop` ends the loops: the run's time is up, the caller aborted, or setup failed.
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  const interrupted = () => opts.signal?.aborted ?? false;

  let c: Cluster | null = null;
  const pods = new Map<number, Pod>();
  const podNamespaces = new Set<string>();
  const t0 = { at: 0 };
  const rel = () => ((Date.now() - t0.at) / 1000).toFixed(1);

  // Figures.
  const f = {
    cniAdd: 0,
    cniDel: 0,
    cniFailed: 0,
    pingsOk: 0,
    pingsRetried: 0,
    pingRounds: 0,
    kernelChecks: 0,
    kernelSkipped: 0,
    divergedMs: [] as number[],
    divergences: 0,
    overlapChecks: 0,
    leaderKills: 0,
    electionMs: [] as number[],
    rejoinMs: [] as number[],
    weftdKills: 0,
    weftdRestartMs: NaN,
    drifts: 0,
    driftMissed: 0,
    pingRetryMs: [] as number[],
    pingsSkipped: 0,
    driftRepairMs: [] as number[],
    leakChecks: 0,
    kernelEvents: 0,
    liveDeleted: 0,
    flowChecks: 0,
    maxPods: 0,
  };
  const procs: ProcRecord[] = [];
  /** Hosts whose weftd is down on purpose, and when each came back. */
  const down = new Set<Host>();
  const backAt = new Map<Host, number>();
  const pendingFlows: Array<{ host: Host; ip: string; at: number }> = [];
  let writer: LeaseWriter | null = null;
  const monitors: KernelMonitor[] = [];
  /** The writer's etcdctl runs in flight. */
  const writes = new Set<Promise<string>>();

  try {
    log('soak: 3 vxlan hosts, 3-member etcd');
    c = await Cluster.create({
      hosts: 3,
      tag,
      etcdMembers: 3,
      // Real nodes take 10.64.1-99.0/24; the writer's fakes are 10.65.0.0/24 upwards.
      config: { Network: '10.64.0.0/10', SubnetMax: '10.64.99.0', Backend: { Type: 'vxlan' } },
    });
    const cluster = c;
    const etcd: EtcdCluster = c.etcd!;
    const etcdctl = (...a: string[]) => cluster.etcdctl(...a);
    const binDir = await cniBinDir();
    const flannelBin = join(binDir, 'flannel');
    if (!existsSync(flannelBin)) throw new Error(`the flannel CNI bundle did not build (${binDir})`);
    const weftChain = existsSync(join(binDir, 'bridge')) && existsSync(join(binDir, 'host-local'));
    const cniPath = weftChain ? binDir : REFERENCE_CNI_DIR;
    for (const h of c.hosts) await h.startWeftd();
    const hosts = c.hosts;

    const cniDirs = new Map<Host, { conf: string; dataDir: string; ipamDir: string }>();
    for (const h of hosts) {
      const dir = join(c.dir, `cni-h${h.i}`);
      mkdirSync(dir, { recursive: true });
      const dataDir = join(dir, 'flannel');
      const ipamDir = join(dir, 'ipam');
      const conf = JSON.stringify({
        cniVersion: '1.0.0',
        name: NETWORK,
        type: 'flannel',
        subnetFile: h.subnetFile,
        dataDir,
        delegate: { hairpinMode: true, isDefaultGateway: true },
        ipam: { dataDir: ipamDir },
      });
      cniDirs.set(h, { conf, dataDir, ipamDir });
    }
    const ipRules = new Map<Host, string>();
    for (const h of hosts) ipRules.set(h, await ipn(h.ns, 'rule', 'show'));
    const ownLease = new Map<Host, StoredPeer>();
    for (const l of await storedLeases(etcdctl)) {
      const h = hosts.find((x) => x.underlayIP === l.publicIP);
      if (h) {
        if (ownLease.has(h)) violate(`${h.ns} holds two leases at the start: ${ownLease.get(h)!.key} and ${l.key}`);
        ownLease.set(h, l);
      }
    }
    const subnetEnv = new Map(hosts.map((h) => [h, h.subnetEnv().FLANNEL_SUBNET]));

    // Lease churn through a paced etcdctl (the pause comes before the change is sent, so the
    // writer's ack times stay exact).
    const paced = async (...a: string[]): Promise<string> => {
      await sleep(opts.leasePaceMs ?? 300, stop.signal);
      // Interrupted: refuse (the writer retries until it gives up), so no etcdctl outlives the run.
      if (interrupted()) throw new Error('interrupted');
      const p = etcdctl(...a);
      writes.add(p);
      return p.finally(() => writes.delete(p));
    };
    writer = new LeaseWriter(paced, { seed: opts.seed ?? 1616, min: 4, max: 16, settleMs: 6000 });
    for (let i = 0; i < 4; i++) await writer.put();
    const exact = async (): Promise<boolean> => {
      const all = await storedLeases(etcdctl);
      for (const h of hosts) {
        const got = await kernelEntries(h);
        const want = expectedEntries(h, all);
        for (const k of ['routes', 'neigh', 'fdb'] as const) if (got[k].join('\n') !== want[k].join('\n')) return false;
      }
      return true;
    };
    await waitFor(exact, { timeoutMs: 30_000, what: 'every host programmed before the soak' });
    await etcd.waitHealthy();

    // Every add and delete of a weft entry on every host, timestamped (ip monitor, bridge monitor):
    // no entry of a live peer may be deleted, except the ones deleted here by hand.
    const realPeers = new Map<string, string>();
    for (const [h, l] of ownLease) {
      realPeers.set(l.subnet, h.ns);
      if (l.mac) realPeers.set(l.mac, h.ns);
    }
    for (const h of hosts) monitors.push(await KernelMonitor.start(h));
    const handMade: Array<{ ns: string; kind: EntryKind; subject: string; at: number }> = [];
    const eventsDone = monitors.map(() => 0);
    const liveDeletions = (): void => {
      for (const [i, mon] of monitors.entries()) {
        const evs = mon.events;
        for (; eventsDone[i]! < evs.length; eventsDone[i]!++) {
          const e = evs[eventsDone[i]!]!;
          f.kernelEvents++;
          if (!e.deleted) continue;
          const kind = e.kind === 'nexthop' ? 'route' : e.kind;
          if (handMade.some((d) => d.ns === mon.host.ns && d.kind === kind && d.subject === e.subject && e.t >= d.at && e.t <= d.at + bound)) continue;
          const real = realPeers.get(e.subject);
          if (real) {
            f.liveDeleted++;
            violate(`${mon.host.ns}: ${e.kind} of ${real} deleted at t=${((e.t - t0.at) / 1000).toFixed(1)} s: ${e.text}`);
            continue;
          }
          const fake = e.kind === 'fdb' ? writer!.byMac.get(e.subject) : writer!.bySubnet.get(e.subject);
          const del = fake ? writer!.delOf.get(fake.subnet) : undefined;
          if (!del || del.sent > e.t) {
            f.liveDeleted++;
            violate(`${mon.host.ns}: ${e.kind} deleted while its lease was in etcd, at t=${((e.t - t0.at) / 1000).toFixed(1)} s: ${e.text}`);
          }
        }
      }
    };

    // ---- resources ----
    const track = (h: Host, restarted: boolean): void => {
      const pid = h.weftd!.proc.pid!;
      procs.push({ host: h, pid, startedAt: Date.now(), restarted, samples: [] });
    };
    for (const h of hosts) track(h, false);
    const sample = (): void => {
      for (const r of procs) {
        if (!r.host.weftd || r.host.weftd.proc.pid !== r.pid || !r.host.weftd.running) continue;
        try {
          const status = readFileSync(`/proc/${r.pid}/status`, 'utf8');
          const rssKb = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? NaN);
          const fds = readdirSync(`/proc/${r.pid}/fd`).length;
          r.samples.push({ t: Date.now(), rssKb, fds });
        } catch {
          // gone between the check and the read
        }
      }
    };

    // ---- the loops ----
    t0.at = Date.now();
    const timer = setTimeout(() => stop.abort(), duration);
    const running = () => !stop.signal.aborted;
    sample();

    const weftdWatch = async (): Promise<void> => {
      while (running()) {
        sample();
        for (const h of hosts) {
          if (!down.has(h) && h.weftd && !h.weftd.running) {
            violate(`weftd on ${h.ns} exited on its own: ${h.weftd.output.split('\n').slice(-5).join(' | ')}`);
          }
        }
        await sleep(2000, stop.signal);
      }
    };

    writer.start();

    const podLive = (p: Pod) => !p.deleting && pods.get(p.n) === p;
    let podSeq = 0;
    const prefix = nsPrefix(tag);
    const veths = async (h: Host): Promise<string[]> =>
      // The pods' host ends (the host's own eth0 is a veth too).
      (JSON.parse(await ipn(h.ns, '-j', 'link', 'show', 'type', 'veth')) as Array<{ ifname: string }>).map((l) => l.ifname).filter((n) => n.startsWith('veth'));
    const ipFiles = (h: Host): string[] => {
      const d = join(cniDirs.get(h)!.ipamDir, NETWORK);
      return existsSync(d) ? readdirSync(d).filter((n) => /^\d+\.\d+\.\d+\.\d+$/.test(n)).sort() : [];
    };
    const stateFiles = (h: Host): string[] => {
      const d = cniDirs.get(h)!.dataDir;
      return existsSync(d) ? readdirSync(d).sort() : [];
    };

    /** After a DEL (or at the end): the host holds exactly what its live pods need. */
    const leakCheck = async (h: Host, gone: Pod | null): Promise<void> => {
      f.leakChecks++;
      const live = [...pods.values()].filter((p) => p.host === h);
      const v = await veths(h);
      if (gone && v.includes(gone.hostVeth)) violate(`${h.ns}: veth ${gone.hostVeth} of ${gone.id} left after DEL`);
      if (v.length !== live.length) violate(`${h.ns}: ${v.length} veths for ${live.length} pods after DEL: ${v.join(' ')}`);
      const ips = ipFiles(h);
      const wantIps = live.map((p) => p.ip).sort();
      if (ips.join(' ') !== wantIps.join(' ')) violate(`${h.ns}: host-local holds ${ips.join(' ') || 'none'}, live pods ${wantIps.join(' ') || 'none'}`);
      const st = stateFiles(h);
      const wantSt = live.map((p) => p.id).sort();
      if (st.join(' ') !== wantSt.join(' ')) violate(`${h.ns}: flannel state ${st.join(' ') || 'none'}, live pods ${wantSt.join(' ') || 'none'}`);
      const xt = (await nsExec(h.ns, 'iptables-save')) + (await nsExec(h.ns, 'ip6tables-save').catch(() => ''));
      const nft = await nsExec(h.ns, 'nft', 'list', 'ruleset');
      const chains = new Set([...xt.matchAll(/^:(CNI-[0-9a-f]+) /gm)].map((m) => m[1]!));
      const wantChains = new Set(live.map((p) => masqChainName(NETWORK, p.id)));
      const extraChains = [...chains].filter((x) => !wantChains.has(x));
      if (extraChains.length) violate(`${h.ns}: masquerade chains left: ${extraChains.join(' ')}`);
      if (gone) {
        // As a whole word: soak-2 must not be found in the rules of a live soak-20.
        if (new RegExp(`\\b${gone.id}\\b`).test(xt)) violate(`${h.ns}: an iptables rule still names ${gone.id} after DEL`);
        if (new RegExp(`\\b${gone.ip.replaceAll('.', '\\.')}\\b`).test(nft)) violate(`${h.ns}: an nftables rule still names ${gone.ip} (${gone.id}) after DEL`);
      }
      const rules = await ipn(h.ns, 'rule', 'show');
      if (rules !== ipRules.get(h)) violate(`${h.ns}: policy rules changed: ${rules.trim().replaceAll('\n', ' | ')}`);
    };

    const addPod = async (h: Host): Promise<void> => {
      const n = podSeq++;
      const id = `soak-${n}`;
      const ns = await addNetns(`${prefix}-q${n}`);
      podNamespaces.add(ns);
      const r = await runCni({ bin: flannelBin, command: 'ADD', containerId: id, netns: `/run/netns/${ns}`, hostNs: h.ns, path: cniPath }, cniDirs.get(h)!.conf);
      const res = r.json as { ips?: Array<{ address: string }>; interfaces?: Array<{ name: string; sandbox?: string }> } | undefined;
      const ip = res?.ips?.[0]?.address.split('/')[0];
      const hostVeth = res?.interfaces?.find((i) => i.name.startsWith('veth') && !i.sandbox)?.name;
      if (r.exitCode !== 0 || !ip || !hostVeth) {
        f.cniFailed++;
        violate(`CNI ADD ${id} on ${h.ns} failed (exit ${r.exitCode}): ${(r.stdout + r.stderr).trim().slice(0, 300)}`);
        await delNetns(ns);
        podNamespaces.delete(ns);
        return;
      }
      f.cniAdd++;
      pods.set(n, { n, id, ns, host: h, ip, hostVeth, deleting: false });
      f.maxPods = Math.max(f.maxPods, pods.size);
    };

    const delPod = async (p: Pod): Promise<void> => {
      p.deleting = true;
      const h = p.host;
      const r = await runCni({ bin: flannelBin, command: 'DEL', containerId: p.id, netns: `/run/netns/${p.ns}`, hostNs: h.ns, path: cniPath }, cniDirs.get(h)!.conf);
      pods.delete(p.n);
      if (r.exitCode !== 0) {
        f.cniFailed++;
        violate(`CNI DEL ${p.id} on ${h.ns} failed (exit ${r.exitCode}): ${(r.stdout + r.stderr).trim().slice(0, 300)}`);
      } else {
        f.cniDel++;
      }
      // The host's end of the pair must be gone before the pod's namespace is (deleting the
      // namespace would take the pair with it and hide a leak).
      await leakCheck(h, p);
      await delNetns(p.ns);
      podNamespaces.delete(p.ns);
      pendingFlows.push({ host: h, ip: p.ip, at: Date.now() });
    };

    const cniChurn = async (): Promise<void> => {
      while (running()) {
        const h = pick(hosts);
        const mine = [...pods.values()].filter((p) => p.host === h && !p.deleting);
        if (mine.length < 1 || (mine.length < 3 && random() < 0.55)) await addPod(h);
        else await delPod(pick(mine));
        await sleep(opts.cniPaceMs ?? 700, stop.signal);
      }
    };

    /** One ping from `a` to `b`, retried until the bound while both live. */
    const pingPair = async (a: Pod, b: Pod): Promise<void> => {
      const once = () => nsExec(a.ns, 'ping', '-c', '1', '-W', '1', b.ip).then(() => true, () => false);
      if (await once()) {
        f.pingsOk++;
        return;
      }
      // A pod whose DEL began after the round's snapshot: nothing to check.
      if (!podLive(a) || !podLive(b)) {
        f.pingsSkipped++;
        return;
      }
      f.pingsRetried++;
      const first = Date.now();
      const ok = await waitFor(async () => !podLive(a) || !podLive(b) || (await once()), { timeoutMs: bound, what: 'ping' }).then(() => true, () => false);
      if (ok) {
        if (!podLive(a) || !podLive(b)) f.pingsSkipped++;
        else {
          f.pingsOk++;
          f.pingRetryMs.push(Date.now() - first);
          if (f.pingRetryMs.length <= 10) {
            log(`  t=${rel()} s: ping ${a.id}@${a.host.ns.replace(/.*-/, '')} → ${b.id}@${b.host.ns.replace(/.*-/, '')} (${b.ip}) answered on a retry ${Date.now() - first} ms later`);
          }
        }
        return;
      }
      if (podLive(a) && podLive(b)) {
        violate(`pod ${a.id} (${a.ip} on ${a.host.ns}) did not reach ${b.id} (${b.ip} on ${b.host.ns}) for ${Date.now() - first} ms (at t=${rel()} s)`);
      }
    };

    const pinger = async (): Promise<void> => {
      while (running()) {
        const live = [...pods.values()].filter(podLive);
        const pairs: Array<[Pod, Pod]> = [];
        for (const a of live) for (const b of live) if (a !== b) pairs.push([a, b]);
        // Three at a time.
        for (let i = 0; i < pairs.length && running(); i += 3) await Promise.all(pairs.slice(i, i + 3).map(([a, b]) => pingPair(a, b)));
        f.pingRounds++;
        await sleep(2000, stop.signal);
      }
    };

    /** Divergent entries, each with when it was first seen to differ. */
    const diverged = new Map<string, { since: number; last: number }>();
    const kernelCheck = async (): Promise<void> => {
      let all: StoredPeer[];
      try {
        all = await storedLeases(etcdctl);
      } catch {
        f.kernelSkipped++; // no leader at the moment: nothing changes either
        return;
      }
      f.overlapChecks++;
      for (const o of overlaps(all)) violate(`leases overlap: ${o}`);
      for (const h of hosts) {
        const mine = all.filter((l) => l.publicIP === h.underlayIP);
        if (mine.length !== 1) violate(`${h.ns} holds ${mine.length} leases: ${mine.map((l) => l.key).join(' ')}`);
        else if (ownLease.has(h) && mine[0]!.key !== ownLease.get(h)!.key) violate(`${h.ns} lease changed: ${ownLease.get(h)!.key} → ${mine[0]!.key}`);
      }
      const now = Date.now();
      const seen = new Set<string>();
      for (const h of hosts) {
        if (down.has(h)) continue;
        const got = await kernelEntries(h);
        const want = expectedEntries(h, all);
        const from = backAt.get(h) ?? 0;
        for (const k of ['routes', 'neigh', 'fdb'] as const) {
          const items = [
            ...want[k].filter((x) => !got[k].includes(x)).map((x) => `${h.ns} ${k} missing: ${x}`),
            ...got[k].filter((x) => !want[k].includes(x)).map((x) => `${h.ns} ${k} extra: ${x}`),
          ];
          for (const it of items) {
            seen.add(it);
            const since = Math.max(diverged.get(it)?.since ?? now, from);
            diverged.set(it, { since, last: now });
            if (now - since > bound) violate(`${it} for more than ${bound} ms (since t=${((since - t0.at) / 1000).toFixed(1)} s)`);
          }
        }
      }
      for (const [it, d] of diverged) {
        if (!seen.has(it)) {
          f.divergences++;
          f.divergedMs.push(d.last - d.since);
          diverged.delete(it);
        }
      }
      f.kernelChecks++;
      liveDeletions();
    };

    const flowCheck = async (): Promise<void> => {
      const now = Date.now();
      for (let i = 0; i < pendingFlows.length; ) {
        const p = pendingFlows[i]!;
        if (now < p.at + CONNTRACK_GRACE_MS) {
          i++;
          continue;
        }
        pendingFlows.splice(i, 1);
        // A later pod may have been given the same address.
        if ([...pods.values()].some((q) => q.host === p.host && q.ip === p.ip)) continue;
        f.flowChecks++;
        const out = (await nsExec(p.host.ns, 'conntrack', '-L', '-s', p.ip).catch(() => '')) + (await nsExec(p.host.ns, 'conntrack', '-L', '-d', p.ip).catch(() => ''));
        if (out.trim() !== '') violate(`${p.host.ns}: conntrack flows of deleted pod ${p.ip} ${CONNTRACK_GRACE_MS} ms after DEL: ${out.trim().split('\n')[0]}`);
      }
    };

    const checker = async (): Promise<void> => {
      while (running()) {
        await kernelCheck();
        await flowCheck();
        await sleep(1500, stop.signal);
      }
    };

    const leaderKill = async (): Promise<void> => {
      const old = await waitFor(() => etcd.leader(), { timeoutMs: 15_000, what: 'an etcd leader' });
      const killedAt = Date.now();
      await etcd.kill(old);
      const next = await waitFor(async () => {
        const l = await etcd.leader();
        return l !== null && l !== old ? l : null;
      }, { timeoutMs: 15_000, what: 'a new etcd leader' });
      f.electionMs.push(Date.now() - killedAt);
      const t = Date.now();
      await etcd.restart(old);
      f.rejoinMs.push(Date.now() - t);
      f.leaderKills++;
      log(`  t=${rel()} s: etcd leader e${old + 1} SIGKILLed, e${next + 1} leader after ${f.electionMs.at(-1)} ms, e${old + 1} back after ${f.rejoinMs.at(-1)} ms`);
    };

    const weftdKill = async (h: Host): Promise<void> => {
      down.add(h);
      const before = h.weftd!;
      before.kill();
      await before.exited;
      const t = Date.now();
      await h.startWeftd();
      f.weftdRestartMs = Date.now() - t;
      f.weftdKills++;
      backAt.set(h, Date.now());
      down.delete(h);
      track(h, true);
      const sub = h.subnetEnv().FLANNEL_SUBNET;
      if (sub !== subnetEnv.get(h)) violate(`${h.ns}: subnet changed across the weftd restart: ${subnetEnv.get(h)} → ${sub}`);
      log(`  t=${rel()} s: weftd on ${h.ns} SIGKILLed, back with its lease after ${f.weftdRestartMs} ms`);
    };

    const drift = async (): Promise<void> => {
      const h = pick(hosts.filter((x) => !down.has(x)));
      const all = (await storedLeases(etcdctl)).filter((l) => l.publicIP !== h.underlayIP);
      const reals = all.filter((l) => hosts.some((x) => x.underlayIP === l.publicIP));
      const fakes = all.filter((l) => !reals.includes(l));
      // A fake among the newest: not about to be deleted by the writer.
      const recent = new Set([...(writer?.live.keys() ?? [])].slice(-4));
      const young = fakes.filter((x) => recent.has(x.subnet));
      const l = random() < 0.5 || young.length === 0 ? pick(reals) : pick(young);
      const kind = pick(['routes', 'neigh', 'fdb'] as const);
      const gw = l.subnet.split('/')[0]!;
      const mk: EntryKind = kind === 'routes' ? 'route' : kind;
      handMade.push({ ns: h.ns, kind: mk, subject: kind === 'fdb' ? l.mac! : l.subnet, at: Date.now() });
      try {
        if (kind === 'routes') await ipn(h.ns, 'route', 'del', l.subnet, 'proto', '88');
        else if (kind === 'neigh') await ipn(h.ns, 'neigh', 'del', gw, 'dev', 'flannel.1');
        else await sh('bridge', ['-n', h.ns, 'fdb', 'del', l.mac!, 'dev', 'flannel.1', 'dst', l.publicIP, 'self']);
      } catch (e) {
        // The entry went away on its own (its lease was deleted) or is being re-made.
        f.driftMissed++;
        log(`  t=${rel()} s: drift on ${h.ns}: ${kind} of ${l.subnet} not deleted: ${(e as Error).message.split('\n')[0]}`);
        return;
      }
      log(`  t=${rel()} s: drift on ${h.ns}: ${kind} entry of ${reals.includes(l) ? 'host' : 'fake'} ${l.subnet} deleted by hand`);
      const at = Date.now();
      f.drifts++;
      const want = expectedEntries(h, [l])[kind][0]!;
      const gone = () => writer !== null && !writer.live.has(l.subnet) && !reals.includes(l);
      const back = await waitFor(async () => gone() || (await kernelEntries(h))[kind].includes(want), { timeoutMs: bound, intervalMs: 100, what: 'repair' }).then(
        () => true,
        () => false,
      );
      if (back) f.driftRepairMs.push(Date.now() - at);
      else if (!down.has(h)) violate(`${h.ns}: ${kind} entry "${want}" deleted by hand not restored within ${bound} ms`);
    };

    const faults = async (): Promise<void> => {
      const first = opts.firstLeaderKillMs ?? 20_000;
      const every = opts.leaderKillEveryMs ?? 60_000;
      const events: Array<{ at: number; what: () => Promise<void> }> = [];
      for (let at = first; at < duration - 10_000; at += every) events.push({ at, what: leaderKill });
      const victim = hosts[1]!;
      events.push({ at: opts.weftdKillAtMs ?? Math.round(duration * 0.55), what: () => weftdKill(victim) });
      for (let at = 8000; at < duration - bound; at += opts.driftEveryMs ?? 12_000) events.push({ at, what: drift });
      events.sort((a, b) => a.at - b.at);
      for (const e of events) {
        await sleep(t0.at + e.at - Date.now(), stop.signal);
        if (!running()) return;
        try {
          await e.what();
        } catch (err) {
          violate(`fault at t=${rel()} s failed: ${(err as Error).message}`);
        }
      }
    };

    const progress = async (): Promise<void> => {
      const every = opts.progressEveryMs ?? (duration <= 120_000 ? 15_000 : 30_000);
      while (running()) {
        await sleep(every, stop.signal);
        if (!running()) return;
        const w = writer!;
        log(
          `  t=${rel()} s: leases ${w.acked.length} changes (${w.live.size} fakes live, ${w.failedAttempts} refused) | pods ${pods.size} live, ADD ${f.cniAdd} DEL ${f.cniDel} | ` +
            `pings ${f.pingsOk} ok (${f.pingsRetried} retried) | kernel checks ${f.kernelChecks} | leader kills ${f.leaderKills} | drift ${f.drifts} | violations ${violations.length}`,
        );
      }
    };

    const loops = [weftdWatch(), cniChurn(), pinger(), checker(), faults(), progress()].map((p) =>
      p.catch((err: unknown) => {
        violate(`a soak loop failed at t=${rel()} s: ${(err as Error).stack ?? String(err)}`);
        stop.abort();
      }),
    );
    await Promise.all(loops);
    clearTimeout(timer);
    const ranMs = Date.now() - t0.at;
    await writer.stopWithin(interrupted() ? 3000 : 30_000);

    // ---- the end: everything settled, every pod deleted, nothing left behind ----
    if (!interrupted()) {
      log(`soak: ${(ranMs / 1000).toFixed(0)} s done; final checks`);
      for (const m of [0, 1, 2]) if (etcd.member(m).pid === null) await etcd.restart(m).catch((e: Error) => violate(`etcd e${m + 1} did not come back: ${e.message}`));
      await etcd.waitHealthy().catch((e: Error) => violate(e.message));
      const settled = await waitFor(exact, { timeoutMs: 15_000, what: 'kernel equal to etcd at the end' }).then(() => true, () => false);
      if (!settled) violate('the kernel entries of some host differ from etcd 15 s after the last change');
      await kernelCheck();
      const fakes = (await storedLeases(etcdctl)).filter((l) => !hosts.some((h) => h.underlayIP === l.publicIP)).map((l) => l.subnet).sort();
      if (fakes.join(' ') !== [...writer.live.keys()].sort().join(' ')) violate('etcd does not hold exactly the fake leases the writer left');
      // A last ping round over every pair, then every pod deleted.
      const live = [...pods.values()];
      for (const a of live) for (const b of live) if (a !== b) await pingPair(a, b);
      for (const p of [...pods.values()]) await delPod(p);
      for (const h of hosts) await leakCheck(h, null);
      sample();
      for (const h of hosts) if (!h.weftd?.running) violate(`weftd on ${h.ns} is not running at the end`);
      // The pods' deletions are done: the last kernel events (the writer stopped long ago).
      liveDeletions();
    }

    // ---- figures ----
    const resources: ResourceFigures[] = [];
    for (const r of procs) {
      // The start: the first sample 10 s or more after the process started (its warm-up done), else its first.
      const s = r.samples.find((x) => x.t >= r.startedAt + 10_000) ?? r.samples[0];
      const e = r.samples.at(-1);
      if (!s || !e) continue;
      const mb = (kb: number) => Math.round(kb / 102.4) / 10;
      const fig: ResourceFigures = {
        host: r.host.ns.replace(/.*-/, ''),
        restarted: r.restarted,
        rssMb: { start: mb(s.rssKb), end: mb(e.rssKb), max: mb(Math.max(...r.samples.map((x) => x.rssKb))) },
        fds: { start: s.fds, end: e.fds, max: Math.max(...r.samples.map((x) => x.fds)) },
      };
      resources.push(fig);
      if (interrupted()) continue;
      const grow = e.rssKb - s.rssKb;
      if (grow > Math.max(40 * 1024, s.rssKb * 0.5)) violate(`weftd on ${fig.host}${r.restarted ? ' (restarted)' : ''}: RSS grew ${fig.rssMb.start} → ${fig.rssMb.end} MB`);
      if (e.fds - s.fds > 16) violate(`weftd on ${fig.host}${r.restarted ? ' (restarted)' : ''}: open fds grew ${s.fds} → ${e.fds}`);
    }
    const w = writer;
    const puts = w.acked.filter((o) => o.kind === 'put').length;
    const dels = w.acked.length - puts;
    const res = (k: 'rssMb' | 'fds') =>
      resources.map((r) => `${r.host}${r.restarted ? '*' : ''} ${r[k].start}/${r[k].end}/${r[k].max}`).join(', ');
    const summary =
      `soak ${(ranMs / 1000).toFixed(0)} s${interrupted() ? ' (INTERRUPTED)' : ''}: ` +
      `leases ${w.acked.length} changes (${puts} put, ${dels} del, ${w.failedAttempts} refused and retried), ${f.overlapChecks} overlap checks | ` +
      `etcd leader kills ${f.leaderKills} (new leader after p50/p99/max ${stats(f.electionMs)} ms, member back ${stats(f.rejoinMs)} ms) | ` +
      `weftd kill -9 ${f.weftdKills}${f.weftdKills ? ` (back with its lease after ${f.weftdRestartMs} ms)` : ''} | drift ${f.drifts}${f.driftMissed ? ` (+${f.driftMissed} entries already gone)` : ''} (repaired p50/p99/max ${stats(f.driftRepairMs)} ms) | ` +
      `kernel events ${f.kernelEvents}, entries of live peers deleted ${f.liveDeleted} | kernel checks ${f.kernelChecks} (${f.kernelSkipped} skipped without a leader), transient divergences ${f.divergences} (entry seen differing for p50/p99/max ${stats(f.divergedMs)} ms between first and last sight, checks every ~2 s) | ` +
      `CNI ADD ${f.cniAdd} DEL ${f.cniDel} failed ${f.cniFailed}, max ${f.maxPods} pods, ${f.leakChecks} leak checks, ${f.flowChecks} flow checks | ` +
      `pings ${f.pingsOk} ok in ${f.pingRounds} rounds (${f.pingsRetried} needed a retry, answered after p50/p99/max ${stats(f.pingRetryMs)} ms; ${f.pingsSkipped} skipped: a pod of the pair was being deleted) | ` +
      `weftd RSS MB start/end/max ${res('rssMb')} | fds start/end/max ${res('fds')} (* restarted) | ` +
      `violations ${violations.length}`;
    return { violations, summary, interrupted: interrupted(), resources };
  } catch (e) {
    violate(`soak failed: ${(e as Error).stack ?? String(e)}`);
    return { violations, summary: `soak FAILED: ${(e as Error).message.split('\n')[0]} | violations ${violations.length}`, interrupted: interrupted(), resources: [] };
  } finally {
    stop.abort();
    opts.signal?.removeEventListener('abort', onAbort);
    for (const m of monitors) m.stop();
    await writer?.stopWithin(interrupted() ? 3000 : 10_000);
    // An etcdctl given up on ends within its own deadline (sh's 15 s at most).
    const bounded = new AbortController();
    await Promise.race([Promise.allSettled([...writes]).then(() => bounded.abort()), sleep(16_000, bounded.signal)]);
    for (const ns of podNamespaces) await delNetns(ns);
    if (c) {
      log('soak: removing the cluster');
      await c.destroy().catch((e: Error) => log(`soak: cleanup: ${e.message.split('\n')[0]}`));
    }
  }
}
