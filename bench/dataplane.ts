// Issue 15, "an event costs what it changes": what one lease change costs weftd at 10 000 peers,
// each figure printed next to a reference measured in the same run and a verdict on its target.
//
//   churn    vxlan, 10 000 peers: sustained churn (each change one etcd transaction: put a new
//            lease, delete the oldest) at 100/s and 1 000/s for 30 s; latency from the write's
//            acknowledgement to the kernel's route notification for that lease, backlog at the
//            end and time to drain, the exact kernel state after; then the same with weftd
//            --reconcile-interval 1 (full passes during the churn). Reference: a bare etcd watch
//            client receiving the same events (the store's floor).
//   burst    1 000 new leases in one transaction onto 10 000: time to all 3 000 entries, next to
//            `ip -batch` + `bridge -batch` of the same entries on a fresh device, and the bare
//            watch client's time to receive the 1 000 events.
//   cold     weftd starting with 10 000 leases: spawn → all 30 000 entries, next to iproute2's batch.
//   hostgw   host-gw with 10 000 peers: cold start (reference `ip -batch` of the routes, plain and
//            nexthop form) and churn at 100/s.
//   kube     --kube-subnet-mgr against the fake API server: 10 000 Nodes created at once, from the
//            last watch event flushed to all entries in the kernel.
//   drift    a route, a neighbour and an FDB entry deleted by hand: time until each is back.
//   (RSS)    weftd's VmRSS every 100 ms through every phase.
//
// Layout (as convergence.ts): namespace "node" (eth0 172.16.0.1/16 on a veth to namespace "ul"),
// etcd and weftd inside it; namespace "ref" with its own eth0 for iproute2. A helper process (this
// file with --agent) inside "node" writes to etcd, hosts the fake API server, and runs two threads:
// one reads the kernel's notifications (bench/lib/kernel-worker.ts), one is the bare watch client
// (bench/lib/watch-worker.ts). All stamps are CLOCK_MONOTONIC; every latency is taken between
// stamps of that one helper process, except cold start (weftd's spawn is stamped by the bench).
//
//   node --import tsx bench/dataplane.ts [--scenarios churn,burst,cold,hostgw,kube,drift]
//       [--peers 10000] [--rates 100,1000] [--seconds 30] [--no-churn-reconcile] [--burst 1000]
//       [--hostgw-rate 100] [--kube-nodes 10000] [--drift-rounds 2] [--drain-timeout 60]
//       [--daemon compiled|source] [--json FILE] [--keep-logs DIR] [--log-level info|debug]
//       [--weftd-cpu-prof DIR] (a V8 CPU profile of every weftd, written when it stops)
//
// Run as root. The machine's own network namespace is never touched; namespaces, etcd, weftd,
// the helper and the temporary directory are removed in `finally` and on SIGINT/SIGTERM.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import { Etcd3, type IRequestOp } from 'etcd3';

import { encodeLeaseAttrs, makeSubnetKey } from '../src/subnet/codec.js';
import { FakeKube } from '../test/helpers/fake-kube.js';
import { addNetns, delNetns, ipn, nsPrefix, sh } from '../test/helpers/netns.js';
import { WaitAbort, waitFor } from '../test/helpers/wait.js';
import { WeftdProcess } from '../test/helpers/weftd.js';
import {
  BenchError,
  cachedPeer,
  checkCompiled,
  CpuMeter,
  dist,
  f0,
  f1,
  f2,
  fetchText,
  initClockTicks,
  loadavg,
  machineFacts,
  MAX_SLOTS,
  metricValue,
  mono,
  printTable,
  ROOT,
  rssOf,
  type CpuSplit,
  type Dist,
  spawnBenchEtcd,
  wireUnderlay,
} from './lib/common.js';
import { deleteOp, putOp, RawTxnWriter, txnFrame } from './lib/etcd-txn.js';
import { VXLAN, type Counts, type PollResult, type Verdict } from './lib/kernel-counter.js';
import { key, type Group, type KernelOps } from './lib/kernel-worker.js';
import { RpcClient, serve, startTsWorker } from './lib/rpc.js';
import { watchKey, type WatchOps } from './lib/watch-worker.js';

const run = promisify(execFile);
const SELF = fileURLToPath(import.meta.url);

const SCENARIOS = ['churn', 'burst', 'cold', 'hostgw', 'kube', 'drift'] as const;
type Scenario = (typeof SCENARIOS)[number];

const { values: args } = parseArgs({
  options: {
    scenarios: { type: 'string', default: SCENARIOS.join(',') },
    peers: { type: 'string', default: '10000' },
    rates: { type: 'string', default: '100,1000' },
    seconds: { type: 'string', default: '30' },
    'no-churn-reconcile': { type: 'boolean', default: false },
    burst: { type: 'string', default: '1000' },
    'hostgw-rate': { type: 'string', default: '100' },
    'kube-nodes': { type: 'string', default: '10000' },
    'drift-rounds': { type: 'string', default: '2' },
    'drain-timeout': { type: 'string', default: '60' },
    'poll-ms': { type: 'string', default: '5' },
    daemon: { type: 'string', default: 'compiled' },
    json: { type: 'string' },
    'keep-logs': { type: 'string' },
    'log-level': { type: 'string', default: 'info' },
    'helper-cpu-prof': { type: 'string' },
    'weftd-cpu-prof': { type: 'string' },
    agent: { type: 'boolean', default: false },
  },
});

const ETCD_URL = 'http://127.0.0.1:2379';
const SUBNETS = '/coreos.com/network/subnets/';
const CONFIG_KEY = '/coreos.com/network/config';
const HEALTHZ_PORT = 8081;
const NODE_IP = '172.16.0.1';
/** flannel's device: VNI 1, the kernel's default port, no learning; MTU of eth0 minus 50. */
const VXLAN_ARGS = ['type', 'vxlan', 'id', '1', 'local', NODE_IP, 'dev', 'eth0', 'dstport', '8472', 'nolearning'];
const CONVERGE_TIMEOUT_MS = 180_000;
const DEFAULT_RECONCILE = '10';
/** The node's own Node object in kube mode, and its podCIDR (outside every peer slot). */
const KUBE_NODE = 'bench-node';
const KUBE_OWN_CIDR = '10.255.255.0/24';
const KUBE_PEER_PREFIX = 'bp-';
const ANN = 'flannel.alpha.coreos.com/';

type BackendType = 'vxlan' | 'host-gw';

/** The node's own lease comes from 10.255.0.0/16, which no peer slot uses (MAX_SLOTS). */
const netConfig = (backend: BackendType): string =>
  JSON.stringify({ Network: '10.0.0.0/8', SubnetLen: 24, SubnetMin: '10.255.0.0', Backend: { Type: backend } });

// ---------------------------------------------------------------------------------------------
// What the helper reports

interface WriteTimes {
  readonly startAt: number;
  readonly ackAt: number;
}

interface ChurnResult {
  readonly rate: number;
  readonly seconds: number;
  readonly changes: number;
  readonly writeErrors: number;
  readonly firstWriteError: string;
  /** Changes per second over the sending, and acknowledgements per second. */
  readonly sentPerSecond: number;
  readonly ackedPerSecond: number;
  /** Transaction sent → acknowledged. */
  readonly writeMs: Dist;
  /** Acknowledgement → both routes changed (the new one present, the old one gone). */
  readonly weft: LatencySet;
  readonly floor: LatencySet;
  /** The writer's event-loop delay while it ran: how late an acknowledgement may have been stamped. */
  readonly writerLoopDelayMs: { readonly p99: number; readonly max: number };
  readonly kernelEvents: number;
  readonly overflows: number;
  readonly weftBatches: number;
  readonly weftReconciles: number;
}

interface LatencySet {
  /** Per change: the later of its two effects. */
  readonly change: Dist;
  readonly add: Dist;
  readonly del: Dist;
  /** Changes with an effect never seen within the drain timeout. */
  readonly neverSeen: number;
  /**
   * Effects that were moot: a lease added and deleted again before weftd programmed it (weftd
   * rightly does nothing for it). Each such lease takes one effect from two changes; a change left
   * with no effect is not in the distributions. Only happens when weftd lags by a lease's lifetime.
   */
  readonly superseded: number;
  /** Changes acknowledged by the end of the writing but not complete at that moment. */
  readonly outstandingAtEnd: number;
  /** Last acknowledgement → every change complete; null when some never completed. */
  readonly drainMs: number | null;
}

interface BurstResult extends WriteTimes {
  readonly count: number;
  /** Every route, neighbour and FDB entry of the burst announced by the kernel; null: timed out. */
  readonly doneAt: number | null;
  readonly routesDoneAt: number | null;
  /** The bare watch client has received all `count` puts. */
  readonly watchDoneAt: number | null;
  readonly missing: string[];
  readonly overflows: number;
}

/** The burst's leases deleted again in one transaction. */
interface Removal extends WriteTimes {
  readonly count: number;
  /** Every entry of theirs gone from the kernel; null: timed out. */
  readonly doneAt: number | null;
  readonly watchDoneAt: number | null;
}

interface DriftRound {
  /** Deleted (kernel notification) → back (kernel notification), ms; NaN: not back in time. */
  readonly routeMs: number;
  readonly neighMs: number;
  readonly fdbMs: number;
  readonly missing: string[];
}

interface KubeBurstResult {
  readonly n: number;
  readonly createStartAt: number;
  readonly createEndAt: number;
  readonly firstFlushAt: number;
  readonly lastFlushAt: number;
  readonly watchStreams: number;
  readonly poll: PollResult;
}

interface WeftMetrics {
  readonly peersProgrammed: number;
  readonly batches: number;
  readonly reconciles: number;
  readonly programmingSeconds: number;
}

type AgentOps = {
  clock: { req: Record<string, never>; res: { mono: number } };
  setup: { req: { config: string }; res: Record<string, never> };
  setConfig: { req: { config: string }; res: Record<string, never> };
  clear: { req: Record<string, never>; res: Record<string, never> };
  fill: { req: { n: number; backend: BackendType }; res: WriteTimes };
  live: { req: Record<string, never>; res: { slots: number[] } };
  counts: { req: Record<string, never>; res: Counts };
  converge: { req: { n: number; routesOnly: boolean; pollMs: number; timeoutMs: number }; res: PollResult };
  verify: { req: { backend: BackendType }; res: Verdict };
  metrics: { req: Record<string, never>; res: WeftMetrics };
  ready: { req: Record<string, never>; res: { ready: boolean } };
  watchers: { req: { min: number; max: number; timeoutMs: number }; res: { watchers: number } };
  churn: { req: { rate: number; seconds: number; drainTimeoutMs: number; backend: BackendType }; res: ChurnResult };
  burst: { req: { count: number; backend: BackendType; timeoutMs: number }; res: BurstResult };
  unburst: { req: { backend: BackendType; timeoutMs: number }; res: Removal };
  drift: { req: { rounds: number; timeoutMs: number }; res: DriftRound[] };
  kubeStart: { req: Record<string, never>; res: { url: string } };
  kubeWatches: { req: Record<string, never>; res: { watches: number } };
  kubeBurst: { req: { n: number; pollMs: number; timeoutMs: number }; res: KubeBurstResult };
  kubeStop: { req: Record<string, never>; res: Record<string, never> };
};

// ---------------------------------------------------------------------------------------------
// The helper inside the node namespace

/** The live peer slots, oldest first (churn deletes from the front, adds at the back). */
class SlotQueue {
  private items: number[] = [];
  private head = 0;
  private readonly members = new Set<number>();

  get size(): number {
    return this.items.length - this.head;
  }

  has(s: number): boolean {
    return this.members.has(s);
  }

  push(s: number): void {
    if (this.members.has(s)) throw new BenchError(`slot ${s} is already live`);
    this.items.push(s);
    this.members.add(s);
  }

  shift(): number {
    if (this.size === 0) throw new BenchError('no live slot left');
    const s = this.items[this.head++]!;
    this.members.delete(s);
    if (this.head > 65_536) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return s;
  }

  /** Removes the newest `n`. */
  pop(n: number): number[] {
    const out = this.items.splice(this.items.length - n, n);
    for (const s of out) this.members.delete(s);
    return out;
  }

  at(i: number): number {
    return this.items[this.head + i]!;
  }

  toArray(): number[] {
    return this.items.slice(this.head);
  }

  clear(): void {
    this.items = [];
    this.head = 0;
    this.members.clear();
  }
}

const subnetKey = (slot: number): string => SUBNETS + makeSubnetKey(cachedPeer(slot).subnet, null);
const dstOf = (slot: number): string => cachedPeer(slot).subnet.toString();

/** The first stamp at or after `t` (the lists are in arrival order); NaN when none. */
function firstAfter(list: readonly number[] | undefined, t: number): number {
  if (list) for (const x of list) if (x >= t) return x;
  return NaN;
}

/** The kube watch events of the burst, stamped when each was handed to the socket. */
interface FlushTracker {
  written: number;
  flushed: number;
  firstFlushAt: number;
  lastFlushAt: number;
  readonly streams: Set<ServerResponse>;
  done: (() => void) | null;
  readonly expected: number;
}
let flushTracker: FlushTracker | null = null;

/**
 * Instruments the fake API server's watch streams (chunked JSON lines written with
 * `res.write(text)`): each ADDED event of a burst Node gets a write callback, which Node calls when
 * the data has been handed to the kernel socket.
 */
function instrumentWatchWrites(): void {
  type Write = (this: ServerResponse, chunk: unknown, ...rest: unknown[]) => boolean;
  const proto = ServerResponse.prototype as unknown as { write: Write };
  const original = proto.write;
  proto.write = function (this: ServerResponse, chunk: unknown, ...rest: unknown[]): boolean {
    const t = flushTracker;
    if (t && rest.length === 0 && typeof chunk === 'string' && chunk.startsWith('{"type":"ADDED"') && chunk.includes(`"name":"${KUBE_PEER_PREFIX}`)) {
      t.written++;
      t.streams.add(this);
      return original.call(this, chunk, 'utf8', () => {
        const now = mono();
        if (t.flushed++ === 0) t.firstFlushAt = now;
        t.lastFlushAt = now;
        if (t.flushed === t.expected * t.streams.size) t.done?.();
      });
    }
    return original.call(this, chunk, ...rest);
  };
}

class Agent {
  private readonly etcd = new Etcd3({ hosts: ETCD_URL, dialTimeout: 3000 });
  /** The churn's writer: prepared gRPC frames on one HTTP/2 connection (bench/lib/etcd-txn.ts). */
  private readonly writer = new RawTxnWriter(ETCD_URL);
  private readonly kernel: RpcClient<KernelOps>;
  private readonly watch: RpcClient<WatchOps>;
  private readonly workers = [
    startTsWorker(new URL('./lib/kernel-worker.ts', import.meta.url)),
    startTsWorker(new URL('./lib/watch-worker.ts', import.meta.url), { endpoint: ETCD_URL }),
  ];
  private leaseId = '0';
  private readonly live = new SlotQueue();
  private nextSlot = 0;
  private lastBurst: number[] = [];
  private fake: FakeKube | null = null;

  constructor() {
    this.kernel = RpcClient.forWorker<KernelOps>('kernel thread', this.workers[0]!);
    this.watch = RpcClient.forWorker<WatchOps>('watch thread', this.workers[1]!);
  }

  readonly handlers: { [K in keyof AgentOps]: (req: AgentOps[K]['req']) => Promise<AgentOps[K]['res']> } = {
    clock: async () => ({ mono: mono() }),
    setup: async ({ config }) => {
      await waitFor(() => this.etcd.get(CONFIG_KEY).string().then(() => true), { timeoutMs: 30_000, what: 'etcd' });
      await this.etcd.put(CONFIG_KEY).value(config);
      // Every lease is bound to one etcd lease, as real leases are; it outlives any run.
      this.leaseId = (await this.etcd.leaseClient.leaseGrant({ TTL: 24 * 3600, ID: 0 })).ID;
      await this.watch.call('start', { prefix: SUBNETS });
      return {};
    },
    setConfig: async ({ config }) => {
      await this.etcd.put(CONFIG_KEY).value(config);
      return {};
    },
    clear: async () => {
      await this.etcd.delete().prefix(SUBNETS).exec();
      this.live.clear();
      return {};
    },
    fill: ({ n, backend }) => this.fill(n, backend),
    live: async () => ({ slots: this.live.toArray() }),
    counts: () => this.kernel.call('counts', {}),
    converge: (req) => this.kernel.call('converge', { ...req, trace: false }),
    verify: ({ backend }) =>
      backend === 'vxlan'
        ? this.kernel.call('verifyVxlan', { slots: this.live.toArray() })
        : this.kernel.call('verifyHostGw', { slots: this.live.toArray(), dev: 'eth0' }),
    metrics: () => this.metrics(),
    ready: async () => {
      const res = await fetch(`http://127.0.0.1:${HEALTHZ_PORT}/readyz`, { signal: AbortSignal.timeout(5000) }).catch(() => null);
      return { ready: res?.status === 200 };
    },
    watchers: async ({ min, max, timeoutMs }) => {
      const w = await waitFor(
        async () => {
          const v = metricValue(await fetchText(`${ETCD_URL}/metrics`), 'etcd_debugging_mvcc_watcher_total');
          return v !== null && v >= min && v <= max ? { v } : null;
        },
        { timeoutMs, what: `between ${min} and ${max} etcd watchers`, intervalMs: 10 },
      );
      return { watchers: w.v };
    },
    churn: (req) => this.churn(req),
    burst: (req) => this.burst(req),
    unburst: (req) => this.unburst(req),
    drift: (req) => this.drift(req),
    kubeStart: async () => {
      instrumentWatchWrites();
      this.fake = await FakeKube.start();
      this.fake.nodes.create(KUBE_NODE, { spec: { podCIDR: KUBE_OWN_CIDR, podCIDRs: [KUBE_OWN_CIDR] } });
      return { url: this.fake.url };
    },
    kubeWatches: async () => ({ watches: this.fake?.openWatches() ?? 0 }),
    kubeBurst: (req) => this.kubeBurst(req),
    kubeStop: async () => {
      await this.fake?.stop();
      this.fake = null;
      return {};
    },
  };

  private async metrics(): Promise<WeftMetrics> {
    const text = await fetchText(`http://127.0.0.1:${HEALTHZ_PORT}/metrics`);
    return {
      peersProgrammed: metricValue(text, 'weft_peers_programmed') ?? -1,
      batches: metricValue(text, 'weft_lease_batches_applied_total') ?? -1,
      reconciles: metricValue(text, 'weft_backend_reconcile_duration_seconds_count') ?? -1,
      programmingSeconds: metricValue(text, 'weft_backend_programming_duration_seconds_sum') ?? -1,
    };
  }

  /**
   * The live slots as etcd has them, in our order: after failed writes (which etcd may or may not
   * have applied) the checks and the next changes must follow the store, not our intentions.
   */
  private async syncLive(): Promise<void> {
    const inStore = new Set<number>();
    for (const k of await this.etcd.getAll().prefix(SUBNETS).keys()) {
      const m = /^10\.(\d+)\.(\d+)\.0-24$/.exec(k.slice(SUBNETS.length));
      if (m && Number(m[1]) >= 1 && Number(m[1]) <= 254) inStore.add((Number(m[1]) - 1) * 256 + Number(m[2]));
    }
    const ordered = this.live.toArray().filter((s) => inStore.has(s));
    const kept = new Set(ordered);
    this.live.clear();
    for (const s of [...ordered, ...[...inStore].filter((s) => !kept.has(s))]) this.live.push(s);
  }

  /** The next unused slot (slots come back round only long after they were deleted). */
  private takeSlot(): number {
    for (let tries = 0; tries < MAX_SLOTS; tries++) {
      const s = this.nextSlot;
      this.nextSlot = (this.nextSlot + 1) % MAX_SLOTS;
      if (!this.live.has(s)) return s;
    }
    throw new BenchError('no free peer slot');
  }

  /** The lease value flannel writes for this slot. */
  private leaseValue(slot: number, backend: BackendType): string {
    const p = cachedPeer(slot);
    return encodeLeaseAttrs({
      publicIP: p.pub,
      publicIPv6: null,
      backendType: backend,
      ...(backend === 'vxlan' ? { backendData: { VNI: 1, VtepMAC: p.mac } } : {}),
    });
  }

  private putOp(slot: number, backend: BackendType): IRequestOp {
    return { request_put: { key: Buffer.from(subnetKey(slot)), value: Buffer.from(this.leaseValue(slot, backend)), lease: this.leaseId } };
  }

  private async txn(ops: IRequestOp[]): Promise<WriteTimes> {
    const startAt = mono();
    await this.etcd.kv.txn({ compare: [], success: ops, failure: [] });
    return { startAt, ackAt: mono() };
  }

  /** n new leases in one transaction (etcd runs with --max-txn-ops above it). */
  private async fill(n: number, backend: BackendType): Promise<WriteTimes> {
    const slots = Array.from({ length: n }, () => this.takeSlot());
    const w = await this.txn(slots.map((s) => this.putOp(s, backend)));
    for (const s of slots) this.live.push(s);
    return w;
  }

  /**
   * Open-loop churn: change k is sent at start + k / rate whatever the answers, each one
   * transaction putting a new lease and deleting the oldest. The kernel thread records every route
   * notification and the watch thread every event; afterwards each change is matched to the first
   * notification of its new route's destination (added) and its old one's (deleted) after it was sent.
   */
  private async churn(req: AgentOps['churn']['req']): Promise<ChurnResult> {
    const total = Math.max(1, Math.round(req.rate * req.seconds));
    const adds = new Int32Array(total);
    const dels = new Int32Array(total);
    const frames: Buffer[] = [];
    for (let k = 0; k < total; k++) {
      const d = this.live.shift();
      const a = this.takeSlot();
      this.live.push(a);
      adds[k] = a;
      dels[k] = d;
      frames.push(txnFrame([putOp(subnetKey(a), this.leaseValue(a, req.backend), this.leaseId), deleteOp(subnetKey(d))]));
    }
    // Routes only: a vxlan peer's neighbour and FDB entry go in the same netlink batch, before its route.
    await this.kernel.call('subscribe', { groups: ['route', 'nexthop'] satisfies Group[] });
    await this.watch.call('reset', {});
    const before = await this.metrics();
    const eld = monitorEventLoopDelay({ resolution: 1 });
    eld.enable();
    const sendAt = new Float64Array(total);
    const ackAt = new Float64Array(total).fill(NaN);
    let errors = 0;
    let firstError = '';
    const startAt = mono();
    await new Promise<void>((resolve) => {
      let k = 0;
      let settled = 0;
      const settle = () => {
        if (++settled === total) resolve();
      };
      const tick = () => {
        const due = Math.min(total, Math.floor(((mono() - startAt) * req.rate) / 1000) + 1);
        while (k < due) {
          const i = k++;
          sendAt[i] = mono();
          this.writer.txn(frames[i]!).then(
            () => {
              ackAt[i] = mono();
              settle();
            },
            (e: unknown) => {
              errors++;
              firstError ||= e instanceof Error ? e.message : String(e);
              settle();
            },
          );
        }
        if (k < total) setTimeout(tick, Math.max(0, startAt + (k * 1000) / req.rate - mono()));
      };
      tick();
    });
    eld.disable();
    const kernelKeys: string[] = [];
    const watchKeys: string[] = [];
    for (let k = 0; k < total; k++) {
      if (Number.isNaN(ackAt[k]!)) continue; // failed: etcd may or may not have applied it
      kernelKeys.push(key.routeAdd(dstOf(adds[k]!)), key.routeDel(dstOf(dels[k]!)));
      watchKeys.push(watchKey.put(subnetKey(adds[k]!)), watchKey.del(subnetKey(dels[k]!)));
    }
    await Promise.all([this.kernel.call('expect', { keys: kernelKeys, timeoutMs: req.drainTimeoutMs }), this.watch.call('expect', { keys: watchKeys, timeoutMs: req.drainTimeoutMs })]);
    const kev = await this.kernel.call('unsubscribe', {});
    const wev = await this.watch.call('take', {});
    const after = await this.metrics();
    if (errors > 0) await this.syncLive();

    const klog = new Map(kev.log);
    const wlog = new Map(wev.log);
    let lastAck = -Infinity;
    for (let k = 0; k < total; k++) if (!Number.isNaN(ackAt[k]!)) lastAck = Math.max(lastAck, ackAt[k]!);
    // A lease added by change k and deleted by change j of this phase, of which the kernel saw
    // neither the route nor its removal, was never programmed: both effects are moot.
    const deletedBy = new Map<number, number>();
    for (let k = 0; k < total; k++) deletedBy.set(dels[k]!, k);
    const mootAdd = new Set<number>();
    const mootDel = new Set<number>();
    for (let k = 0; k < total; k++) {
      const a = adds[k]!;
      const j = deletedBy.get(a);
      if (j === undefined || j <= k) continue;
      if (Number.isNaN(firstAfter(klog.get(key.routeAdd(dstOf(a))), sendAt[k]!)) && Number.isNaN(firstAfter(klog.get(key.routeDel(dstOf(a))), sendAt[k]!))) {
        mootAdd.add(k);
        mootDel.add(j);
      }
    }
    const weft = new LatencyCollector(lastAck);
    const floor = new LatencyCollector(lastAck);
    const writeMs: number[] = [];
    for (let k = 0; k < total; k++) {
      const ack = ackAt[k]!;
      if (Number.isNaN(ack)) continue;
      writeMs.push(ack - sendAt[k]!);
      weft.add(
        ack,
        mootAdd.has(k) ? null : firstAfter(klog.get(key.routeAdd(dstOf(adds[k]!))), sendAt[k]!),
        mootDel.has(k) ? null : firstAfter(klog.get(key.routeDel(dstOf(dels[k]!))), sendAt[k]!),
      );
      floor.add(ack, firstAfter(wlog.get(watchKey.put(subnetKey(adds[k]!))), sendAt[k]!), firstAfter(wlog.get(watchKey.del(subnetKey(dels[k]!))), sendAt[k]!));
    }
    const sendSpan = (sendAt[total - 1]! - sendAt[0]!) / 1000;
    return {
      rate: req.rate,
      seconds: req.seconds,
      changes: total,
      writeErrors: errors,
      firstWriteError: firstError,
      sentPerSecond: sendSpan > 0 ? (total - 1) / sendSpan : NaN,
      ackedPerSecond: (total - errors) / ((lastAck - startAt) / 1000),
      writeMs: dist(writeMs),
      weft: weft.result(),
      floor: floor.result(),
      writerLoopDelayMs: { p99: eld.percentile(99) / 1e6, max: eld.max / 1e6 },
      kernelEvents: kev.events,
      overflows: kev.overflows,
      weftBatches: after.batches - before.batches,
      weftReconciles: after.reconciles - before.reconciles,
    };
  }

  /** `count` new leases in one transaction; every entry of theirs announced by the kernel. */
  private async burst(req: AgentOps['burst']['req']): Promise<BurstResult> {
    const vxlan = req.backend === 'vxlan';
    const slots = Array.from({ length: req.count }, () => this.takeSlot());
    const ops = slots.map((s) => this.putOp(s, req.backend));
    const routeKeys = slots.map((s) => key.routeAdd(dstOf(s)));
    const entryKeys = vxlan ? slots.flatMap((s) => [key.neighAdd(cachedPeer(s).subnet.ip.toString()), key.fdbAdd(cachedPeer(s).mac)]) : [];
    await this.kernel.call('subscribe', { groups: ['route', 'neigh', 'nexthop'] satisfies Group[] });
    await this.watch.call('reset', {});
    const w = await this.txn(ops);
    for (const s of slots) this.live.push(s);
    const [all, routes, watched] = await Promise.all([
      this.kernel.call('expect', { keys: [...routeKeys, ...entryKeys], timeoutMs: req.timeoutMs }),
      this.kernel.call('expect', { keys: routeKeys, timeoutMs: req.timeoutMs }),
      this.watch.call('expect', { keys: slots.map((s) => watchKey.put(subnetKey(s))), timeoutMs: req.timeoutMs }),
    ]);
    this.lastBurst = slots;
    const ev = await this.kernel.call('unsubscribe', {});
    return {
      ...w,
      count: req.count,
      doneAt: all.doneAt,
      routesDoneAt: routes.doneAt,
      watchDoneAt: watched.doneAt,
      missing: all.missing,
      overflows: ev.overflows,
    };
  }

  /** The last burst's leases deleted again in one transaction: every entry of theirs gone (information). */
  private async unburst(req: AgentOps['unburst']['req']): Promise<Removal> {
    const slots = this.lastBurst;
    this.lastBurst = [];
    const vxlan = req.backend === 'vxlan';
    const gone = [
      ...slots.map((s) => key.routeDel(dstOf(s))),
      ...(vxlan ? slots.flatMap((s) => [key.neighDel(cachedPeer(s).subnet.ip.toString()), key.fdbDel(cachedPeer(s).mac)]) : []),
    ];
    await this.kernel.call('subscribe', { groups: ['route', 'neigh', 'nexthop'] satisfies Group[] });
    await this.watch.call('reset', {});
    const w = await this.txn(slots.map((s) => ({ request_delete_range: { key: Buffer.from(subnetKey(s)) } })));
    const removed = this.live.pop(slots.length);
    if (removed.some((s, i) => s !== slots[i])) throw new BenchError('the burst was not the newest leases');
    const [k, wd] = await Promise.all([
      this.kernel.call('expect', { keys: gone, timeoutMs: req.timeoutMs }),
      this.watch.call('expect', { keys: slots.map((s) => watchKey.del(subnetKey(s))), timeoutMs: req.timeoutMs }),
    ]);
    await this.kernel.call('unsubscribe', {});
    return { ...w, count: slots.length, doneAt: k.doneAt, watchDoneAt: wd.doneAt };
  }

  /**
   * Per round, one peer's route, another's neighbour and a third's FDB entry deleted with iproute2;
   * each measured from the kernel's deletion notification to the one that announces it back.
   */
  private async drift(req: AgentOps['drift']['req']): Promise<DriftRound[]> {
    await this.kernel.call('subscribe', { groups: ['route', 'neigh'] satisfies Group[] });
    const rounds: DriftRound[] = [];
    try {
      for (let r = 0; r < req.rounds; r++) {
        const [a, b, c] = [0, 1, 2].map((i) => cachedPeer(this.live.at(3 * r + i))) as [ReturnType<typeof cachedPeer>, ReturnType<typeof cachedPeer>, ReturnType<typeof cachedPeer>];
        const dst = a.subnet.toString();
        const ip = b.subnet.ip.toString();
        await sh('ip', ['route', 'del', dst]);
        await sh('ip', ['neigh', 'del', ip, 'dev', VXLAN]);
        await sh('bridge', ['fdb', 'del', c.mac, 'dev', VXLAN, 'dst', c.pub.toString(), 'self']);
        const pairs: Array<[string, string]> = [
          [key.routeDel(dst), key.routeAdd(dst)],
          [key.neighDel(ip), key.neighAdd(ip)],
          [key.fdbDel(c.mac), key.fdbAdd(c.mac)],
        ];
        const x = await this.kernel.call('expect', { keys: pairs.flat(), timeoutMs: req.timeoutMs });
        const log = new Map((await this.kernel.call('take', {})).log);
        const back = ([del, add]: [string, string]) => {
          const gone = log.get(del)?.[0];
          return gone === undefined ? NaN : firstAfter(log.get(add), gone) - gone;
        };
        rounds.push({ routeMs: back(pairs[0]!), neighMs: back(pairs[1]!), fdbMs: back(pairs[2]!), missing: x.missing });
      }
    } finally {
      await this.kernel.call('unsubscribe', {});
    }
    return rounds;
  }

  /**
   * n Nodes created one after the other, as fast as the fake API server takes them; it writes each
   * ADDED event to every open watch as it stores the Node. From the last of those events flushed
   * to all entries in the kernel (the counting poller of the kernel thread).
   */
  private async kubeBurst(req: AgentOps['kubeBurst']['req']): Promise<KubeBurstResult> {
    const fake = this.fake;
    if (!fake) throw new BenchError('fake API server not started');
    this.live.clear();
    const slots = Array.from({ length: req.n }, (_, i) => i);
    const inits = slots.map((i) => {
      const p = cachedPeer(i);
      return {
        annotations: {
          [`${ANN}kube-subnet-manager`]: 'true',
          [`${ANN}backend-type`]: 'vxlan',
          [`${ANN}backend-data`]: `{"VNI":1,"VtepMAC":"${p.mac}"}`,
          [`${ANN}public-ip`]: p.pub.toString(),
        },
        spec: { podCIDR: p.subnet.toString(), podCIDRs: [p.subnet.toString()] },
      };
    });
    const tracker: FlushTracker = { written: 0, flushed: 0, firstFlushAt: NaN, lastFlushAt: NaN, streams: new Set(), done: null, expected: req.n };
    const flushed = new Promise<void>((resolve) => (tracker.done = resolve));
    flushTracker = tracker;
    const polling = this.kernel.call('converge', { n: req.n, routesOnly: false, pollMs: req.pollMs, timeoutMs: req.timeoutMs, trace: false });
    const createStartAt = mono();
    for (const i of slots) fake.nodes.create(`${KUBE_PEER_PREFIX}${i}`, inits[i]);
    const createEndAt = mono();
    for (const s of slots) this.live.push(s);
    if (tracker.streams.size === 0) throw new BenchError('no watch stream received the burst (is weftd watching?)');
    await flushed;
    flushTracker = null;
    const poll = await polling;
    return {
      n: req.n,
      createStartAt,
      createEndAt,
      firstFlushAt: tracker.firstFlushAt,
      lastFlushAt: tracker.lastFlushAt,
      watchStreams: tracker.streams.size,
      poll,
    };
  }

  async close(): Promise<void> {
    await this.fake?.stop().catch(() => undefined);
    for (const w of this.workers) await w.terminate();
    this.writer.close();
    this.etcd.close();
  }
}

/**
 * Latencies of changes with two effects each, from their acknowledgements. An effect is a stamp,
 * NaN when it never came, or null when it was moot: a lease added and deleted again before weftd
 * programmed it has nothing to add and nothing to remove (weftd sees only its last state).
 */
class LatencyCollector {
  private readonly change: number[] = [];
  private readonly addMs: number[] = [];
  private readonly delMs: number[] = [];
  private neverSeen = 0;
  private superseded = 0;
  private outstanding = 0;
  private lastDone = -Infinity;

  constructor(private readonly endAt: number) {}

  add(ackAt: number, addedAt: number | null, deletedAt: number | null): void {
    if (addedAt === null && deletedAt === null) {
      this.superseded++;
      return;
    }
    const lat = (t: number) => (Number.isNaN(t) ? Infinity : t - ackAt);
    if (addedAt !== null) this.addMs.push(lat(addedAt));
    if (deletedAt !== null) this.delMs.push(lat(deletedAt));
    const effects = [addedAt, deletedAt].filter((t): t is number => t !== null);
    const done = effects.some((t) => Number.isNaN(t)) ? Infinity : Math.max(...effects);
    this.change.push(done - ackAt);
    if (done === Infinity) this.neverSeen++;
    if (done > this.endAt) this.outstanding++;
    this.lastDone = Math.max(this.lastDone, done);
  }

  result(): LatencySet {
    return {
      change: dist(this.change),
      add: dist(this.addMs),
      del: dist(this.delMs),
      neverSeen: this.neverSeen,
      superseded: this.superseded,
      outstandingAtEnd: this.outstanding,
      drainMs: this.neverSeen > 0 ? null : Math.max(0, this.lastDone - this.endAt),
    };
  }
}

function runAgent(): void {
  const agent = new Agent();
  serve<AgentOps>(agent.handlers);
  // The bench went away (or closed the channel), or stops us: nothing left to do (an exit, not a
  // signal death, so that --helper-cpu-prof writes its profile).
  const exit = () => void agent.close().finally(() => process.exit(0));
  process.once('disconnect', exit).once('SIGTERM', exit);
}

// ---------------------------------------------------------------------------------------------
// The bench process (machine's namespace; everything it changes is inside its own namespaces).

/** weftd's VmRSS every 100 ms, attributed to the phase running at the time. */
class RssSampler {
  readonly phases: Array<{ name: string; maxRssMB: number; samples: number; hwmMB: number }> = [];
  private current: (typeof this.phases)[number] | null = null;
  private readonly timer: NodeJS.Timeout;

  constructor(private readonly pid: () => number | undefined) {
    this.timer = setInterval(() => this.sample(), 100);
  }

  private sample(): void {
    const pid = this.pid();
    const cur = this.current;
    if (!pid || !cur) return;
    const { rssMB, hwmMB } = rssOf(pid);
    if (Number.isNaN(rssMB)) return;
    cur.samples++;
    cur.maxRssMB = cur.samples === 1 ? rssMB : Math.max(cur.maxRssMB, rssMB);
    cur.hwmMB = cur.samples === 1 ? hwmMB : Math.max(cur.hwmMB, hwmMB);
  }

  begin(name: string): void {
    this.end();
    this.current = { name, maxRssMB: NaN, samples: 0, hwmMB: NaN };
    this.phases.push(this.current);
    this.sample();
  }

  end(): void {
    this.sample();
    this.current = null;
  }

  stop(): void {
    this.end();
    clearInterval(this.timer);
  }
}

interface RefTimes {
  readonly ms: number;
  readonly ipMs: number;
  readonly bridgeMs: number;
}

interface ColdResult {
  readonly backend: BackendType;
  readonly n: number;
  /** Spawn → all entries in the kernel (upper bound: the end of the poll that saw them). */
  readonly ms: number;
  /** Convergence lies within (ms − windowMs, ms]. */
  readonly windowMs: number;
  readonly routesMs: number;
  readonly ref: RefTimes;
  readonly refNexthop: RefTimes;
  readonly cpu: CpuSplit;
  readonly verify: Verdict;
}

interface Results {
  machine: Record<string, string>;
  clock: { offsetMs: number; rttMs: number } | null;
  cold: ColdResult[];
  burst: (BurstResult & { ref: RefTimes; refNexthop: RefTimes; refOnto: RefTimes; verify: Verdict; removal: Removal; verifyAfter: Verdict }) | null;
  churn: Array<ChurnResult & { backend: BackendType; reconcileInterval: string; verify: Verdict; afterReconcile: Verdict | null; cpu: CpuSplit }>;
  drift: DriftRound[] | null;
  kube: (KubeBurstResult & { verify: Verdict }) | null;
  rss: RssSampler['phases'];
  verdicts: Array<{ target: string; value: string; pass: boolean }>;
  /** Scenarios that could not be measured, and why. */
  errors: Array<{ scenario: string; message: string }>;
  durationS: number;
}

class Bench {
  readonly dir = mkdtempSync(join(tmpdir(), 'weft-dataplane-'));
  /**
   * etcd's data on tmpfs: on this machine's disk its fsyncs cap it near 300 transactions/s, so a
   * 1 000/s churn would measure the disk. The store's floor is still reported (the bare watch client).
   */
  readonly etcdDir = mkdtempSync('/dev/shm/weft-dataplane-etcd-');
  readonly prefix = nsPrefix('dp');
  readonly node = `${this.prefix}-node`;
  readonly ul = `${this.prefix}-ul`;
  readonly ref = `${this.prefix}-ref`;
  private readonly namespaces: string[] = [];
  private etcd: ChildProcess | null = null;
  private agentProc: ChildProcess | null = null;
  private agent: RpcClient<AgentOps> | null = null;
  weftd: WeftdProcess | null = null;
  private weftdSeq = 0;
  private weftdName = '';
  private destroyed = false;
  readonly rss = new RssSampler(() => (this.weftd?.running ? this.weftd.proc.pid : undefined));

  constructor(private readonly daemonEnv: NodeJS.ProcessEnv) {}

  get subnetFile(): string {
    return join(this.dir, 'run', 'subnet.env');
  }

  get a(): RpcClient<AgentOps> {
    if (!this.agent) throw new BenchError('agent not started');
    return this.agent;
  }

  get pids(): Record<'weftd' | 'etcd' | 'agent', number | undefined> {
    return { weftd: this.weftd?.proc.pid, etcd: this.etcd?.pid, agent: this.agentProc?.pid };
  }

  async setup(): Promise<void> {
    for (const ns of [this.node, this.ul, this.ref]) this.namespaces.push(await addNetns(ns));
    // One underlay per host namespace, each on a veth whose other end is in "ul".
    await wireUnderlay(this.ul, [[this.node, 'n0'], [this.ref, 'r0']], NODE_IP);
    const etcd = spawnBenchEtcd(this.node, join(this.etcdDir, 'etcd'), join(this.dir, 'etcd.log'), ETCD_URL);
    this.etcd = etcd;
    const prof = args['helper-cpu-prof'] ? ['--cpu-prof', `--cpu-prof-dir=${args['helper-cpu-prof']}`] : [];
    this.agentProc = spawn('ip', ['netns', 'exec', this.node, process.execPath, ...prof, '--import', 'tsx', SELF, '--agent'], {
      cwd: ROOT,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    this.agent = RpcClient.forProcess<AgentOps>('agent', this.agentProc);
    const etcdDied = new Promise<never>((_, reject) =>
      etcd.once('exit', (code) => reject(new BenchError(`etcd exited (${code}): ${readFileSync(join(this.dir, 'etcd.log'), 'utf8').slice(-2000)}`))),
    );
    etcdDied.catch(() => undefined); // only awaited during setup
    await Promise.race([this.a.call('setup', { config: netConfig('vxlan') }), etcdDied]);
  }

  /** agent CLOCK_MONOTONIC − ours, from the exchange with the shortest round trip: ~0 when they share the clock. */
  async clockCheck(): Promise<{ offsetMs: number; rttMs: number }> {
    let best = { offsetMs: 0, rttMs: Infinity };
    for (let i = 0; i < 7; i++) {
      const t0 = mono();
      const { mono: a } = await this.a.call('clock', {});
      const t1 = mono();
      if (t1 - t0 < best.rttMs) best = { offsetMs: a - (t0 + t1) / 2, rttMs: t1 - t0 };
    }
    return best;
  }

  startWeftd(tag: string, reconcileInterval: string, extra: string[] = [], env: NodeJS.ProcessEnv = {}): WeftdProcess {
    const a = [
      '--iface', 'eth0', '--subnet-file', this.subnetFile,
      '--healthz-ip', '127.0.0.1', '--healthz-port', String(HEALTHZ_PORT),
      '--reconcile-interval', reconcileInterval, '--log-format', 'json', '--log-level', args['log-level'],
      ...(extra.length > 0 ? extra : ['--etcd-endpoints', ETCD_URL]),
    ];
    this.weftdSeq++;
    this.weftdName = `weftd-${this.weftdSeq}-${tag}`;
    const prof = args['weftd-cpu-prof'];
    const nodeArgs = prof ? ['--max-semi-space-size=2', '--cpu-prof', '--cpu-prof-dir', prof, '--cpu-prof-name', `${this.weftdName}.cpuprofile`] : [];
    this.weftd = WeftdProcess.start(a, { ...this.daemonEnv, ...env }, this.node, nodeArgs);
    return this.weftd;
  }

  async stopWeftd(): Promise<void> {
    const w = this.weftd;
    if (!w) return;
    const timer = setTimeout(() => w.kill(), 15_000);
    await w.stop().catch(() => undefined);
    clearTimeout(timer);
    this.weftd = null;
    if (args['keep-logs']) {
      mkdirSync(args['keep-logs'], { recursive: true });
      writeFileSync(join(args['keep-logs'], `${this.weftdName}.log`), w.output);
    }
  }

  /** Fails at once when weftd dies while `p` runs. */
  async whileRunning<T>(p: Promise<T>): Promise<T> {
    const w = this.weftd;
    if (!w) return p;
    return Promise.race([
      p,
      w.exited.then((e) => {
        throw new BenchError(`weftd exited (${e.code ?? e.signal}):\n${w.output.slice(-4000)}`);
      }),
    ]);
  }

  /** No leases, no weft entries in the node (flannel.1 takes its neighbours, FDB entries, nexthops and routes along), no subnet.env. */
  async resetNode(): Promise<void> {
    await this.a.call('clear', {});
    await ipn(this.node, 'link', 'del', VXLAN).catch(() => undefined);
    // Nexthops first: `ip route flush` cannot delete a route through a nexthop object (EINVAL).
    await ipn(this.node, 'nexthop', 'flush').catch(() => undefined);
    await ipn(this.node, 'route', 'flush', 'proto', '88');
    rmSync(this.subnetFile, { force: true });
    const c = await this.a.call('counts', {});
    if (c.routes !== 0 || c.neighbours !== 0 || c.fdb !== 0) throw new BenchError(`node namespace not clean: ${JSON.stringify(c)}`);
  }

  /** weftd answers /readyz and has programmed `n` peers (its first full pass is done). */
  async liveCount(): Promise<number> {
    return (await this.a.call('live', {})).slots.length;
  }

  async waitProgrammed(n: number, what: string): Promise<void> {
    const w = this.weftd!;
    await waitFor(
      async () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        if (!(await this.a.call('ready', {})).ready) return false;
        return (await this.a.call('metrics', {})).peersProgrammed === n;
      },
      { timeoutMs: CONVERGE_TIMEOUT_MS, intervalMs: 50, what },
    );
  }

  async verify(backend: BackendType, what: string): Promise<Verdict> {
    const v = await this.a.call('verify', { backend });
    if (v.total > 0) console.log(`  ${what}: kernel state NOT exact (${v.total} problems): ${v.problems.join('; ')}`);
    return v;
  }

  // ------------------------------------------------------------------------------------------
  // References: iproute2's batch mode in the "ref" namespace, spawn to exit.

  private batchFile(name: string, lines: string[]): string {
    const f = join(this.dir, name);
    writeFileSync(f, lines.join(''));
    return f;
  }

  private async freshRefVxlan(): Promise<void> {
    await ipn(this.ref, 'link', 'del', VXLAN).catch(() => undefined);
    await ipn(this.ref, 'link', 'add', VXLAN, ...VXLAN_ARGS);
    await ipn(this.ref, 'link', 'set', VXLAN, 'mtu', '1450', 'up');
  }

  private async cleanRef(): Promise<void> {
    await ipn(this.ref, 'link', 'del', VXLAN).catch(() => undefined);
    await ipn(this.ref, 'nexthop', 'flush').catch(() => undefined);
    await ipn(this.ref, 'route', 'flush', 'proto', '88');
  }

  private async refCount(...a: string[]): Promise<number> {
    return (JSON.parse((await sh(a[0]!, ['-n', this.ref, '-j', ...a.slice(1)])) || '[]') as unknown[]).length;
  }

  /**
   * flannel's vxlan entries of these slots with iproute2: `ip -batch` (neighbours + routes, plain
   * `via … onlink` or through nexthop objects) then `bridge -batch` (FDB). Onto what flannel.1 in
   * "ref" holds unless `fresh`.
   */
  async refVxlan(slots: readonly number[], form: 'plain' | 'nexthop', fresh: boolean, tag: string): Promise<RefTimes> {
    if (fresh) await this.freshRefVxlan();
    const ps = slots.map((s) => [s, cachedPeer(s)] as const);
    const neigh = ps.map(([, p]) => `neigh replace ${p.subnet.ip.toString()} lladdr ${p.mac} dev ${VXLAN} nud permanent\n`);
    const routes =
      form === 'plain'
        ? ps.map(([, p]) => `route replace ${p.subnet.toString()} via ${p.subnet.ip.toString()} dev ${VXLAN} onlink proto 88\n`)
        : [
            ...ps.map(([s, p]) => `nexthop replace id ${s + 1} via ${p.subnet.ip.toString()} dev ${VXLAN} onlink\n`),
            ...ps.map(([s, p]) => `route replace ${p.subnet.toString()} nhid ${s + 1} proto 88\n`),
          ];
    const ipFile = this.batchFile(`${tag}-ip.batch`, [...neigh, ...routes]);
    const fdbFile = this.batchFile(`${tag}-fdb.batch`, ps.map(([, p]) => `fdb replace ${p.mac} dev ${VXLAN} dst ${p.pub.toString()} self permanent\n`));
    const before = fresh ? 0 : await this.refCount('ip', 'route', 'show', 'proto', '88');
    const t0 = mono();
    await run('ip', ['-n', this.ref, '-batch', ipFile]);
    const t1 = mono();
    await run('bridge', ['-n', this.ref, '-batch', fdbFile]);
    const t2 = mono();
    const routesNow = await this.refCount('ip', 'route', 'show', 'proto', '88');
    const neighNow = await this.refCount('ip', 'neigh', 'show', 'dev', VXLAN, 'nud', 'permanent');
    if (routesNow !== before + slots.length || neighNow !== before + slots.length) {
      throw new BenchError(`reference ${tag}: ${routesNow} routes and ${neighNow} neighbours, expected ${before + slots.length}`);
    }
    return { ms: t2 - t0, ipMs: t1 - t0, bridgeMs: t2 - t1 };
  }

  /** host-gw's routes of these slots with `ip -batch`: plain `via <public IP> dev eth0`, or through nexthop objects. */
  async refHostGw(slots: readonly number[], form: 'plain' | 'nexthop', tag: string): Promise<RefTimes> {
    await this.cleanRef();
    const ps = slots.map((s) => [s, cachedPeer(s)] as const);
    const lines =
      form === 'plain'
        ? ps.map(([, p]) => `route add ${p.subnet.toString()} via ${p.pub.toString()} dev eth0 proto 88\n`)
        : [
            ...ps.map(([s, p]) => `nexthop add id ${s + 1} via ${p.pub.toString()} dev eth0\n`),
            ...ps.map(([s, p]) => `route add ${p.subnet.toString()} nhid ${s + 1} proto 88\n`),
          ];
    const file = this.batchFile(`${tag}-ip.batch`, lines);
    const t0 = mono();
    await run('ip', ['-n', this.ref, '-batch', file]);
    const t1 = mono();
    const n = await this.refCount('ip', 'route', 'show', 'proto', '88');
    await this.cleanRef();
    if (n !== slots.length) throw new BenchError(`reference ${tag}: ${n} routes, expected ${slots.length}`);
    return { ms: t1 - t0, ipMs: t1 - t0, bridgeMs: 0 };
  }

  // ------------------------------------------------------------------------------------------
  // Scenarios

  /**
   * weftd starting with n leases in etcd (no device, no subnet.env): spawn → all entries present,
   * polled by the kernel thread. The references run first, in "ref", and are removed before weftd
   * starts (the kernel's route hash could otherwise be shared).
   */
  async coldStart(backend: BackendType, n: number, reconcileInterval: string): Promise<ColdResult> {
    await this.stopWeftd();
    await this.resetNode();
    const slots = Array.from({ length: n }, (_, i) => i);
    let ref: RefTimes;
    let refNexthop: RefTimes;
    if (backend === 'vxlan') {
      ref = await this.refVxlan(slots, 'plain', true, `cold-${n}-plain`);
      refNexthop = await this.refVxlan(slots, 'nexthop', true, `cold-${n}-nh`);
      await this.cleanRef();
    } else {
      ref = await this.refHostGw(slots, 'plain', `hostgw-${n}-plain`);
      refNexthop = await this.refHostGw(slots, 'nexthop', `hostgw-${n}-nh`);
    }
    await this.a.call('setConfig', { config: netConfig(backend) });
    await this.a.call('fill', { n, backend });
    this.rss.begin(`${backend}: cold start with ${n} leases`);
    const cpu = new CpuMeter(() => this.pids);
    const polling = this.a.call('converge', { n, routesOnly: backend === 'host-gw', pollMs: Number(args['poll-ms']), timeoutMs: CONVERGE_TIMEOUT_MS });
    const t0 = mono();
    this.startWeftd(`${backend}-cold`, reconcileInterval);
    const res = await this.whileRunning(polling);
    const usage = cpu.stop();
    const verify = await this.verify(backend, `${backend} cold start`);
    const r: ColdResult = {
      backend,
      n,
      ms: res.doneAt - t0,
      windowMs: res.doneAt - (res.lastMissAt ?? t0),
      routesMs: res.routesAt - t0,
      ref,
      refNexthop,
      cpu: usage,
      verify,
    };
    console.log(
      `${backend} cold start, ${n} leases: weftd spawn → all entries ${f0(r.ms)} ms (within the last ${f0(r.windowMs)} ms)` +
        ` | ip -batch${backend === 'vxlan' ? ' + bridge -batch' : ''} ${f0(ref.ms)} ms (nexthop form ${f0(refNexthop.ms)} ms) → ratio ${f2(r.ms / ref.ms)}` +
        ` | exact: ${verify.total === 0 ? 'yes' : 'NO'}`,
    );
    return r;
  }

  /** weftd idle at its peers until one more periodic reconcile has run (memory after a full pass). */
  async settle(what: string): Promise<void> {
    this.rss.begin(what);
    const before = (await this.a.call('metrics', {})).reconciles;
    const w = this.weftd!;
    await waitFor(
      async () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return (await this.a.call('metrics', {})).reconciles > before;
      },
      { timeoutMs: 120_000, intervalMs: 100, what: 'a periodic reconcile' },
    );
  }

  async burst(count: number, existing: number): Promise<NonNullable<Results['burst']>> {
    // The references first: a fresh flannel.1 in "ref", and (information) onto the same 10 000
    // entries in flannel's plain form. Their slots are not weft's (only the shape matters).
    const live = (await this.a.call('live', {})).slots;
    const top = live.reduce((m, s) => Math.max(m, s), 0);
    const refSlots = Array.from({ length: count }, (_, i) => (top + 1 + i) % MAX_SLOTS);
    const ref = await this.refVxlan(refSlots, 'plain', true, `burst-${count}-plain`);
    const refNexthop = await this.refVxlan(refSlots, 'nexthop', true, `burst-${count}-nh`);
    await this.refVxlan(live, 'plain', true, `burst-base-${existing}`);
    const refOnto = await this.refVxlan(refSlots, 'plain', false, `burst-${count}-onto`);
    await this.cleanRef();
    this.rss.begin(`vxlan: burst of ${count} onto ${existing}`);
    const r = await this.whileRunning(this.a.call('burst', { count, backend: 'vxlan', timeoutMs: CONVERGE_TIMEOUT_MS }));
    const verify = await this.verify('vxlan', `after the burst (${existing + count} peers)`);
    const removal = await this.whileRunning(this.a.call('unburst', { backend: 'vxlan', timeoutMs: CONVERGE_TIMEOUT_MS }));
    const verifyAfter = await this.verify('vxlan', 'after the burst was removed');
    const weftMs = r.doneAt === null ? Infinity : r.doneAt - r.startAt;
    console.log(
      `burst of ${count} onto ${existing}: txn sent → all ${count * 3} entries ${f0(weftMs)} ms (acknowledged after ${f0(r.ackAt - r.startAt)} ms)` +
        ` | ip -batch + bridge -batch ${f0(ref.ms)} ms → ratio ${f2(weftMs / ref.ms)} | bare watch client: all ${count} events ${f0((r.watchDoneAt ?? NaN) - r.startAt)} ms` +
        ` | exact: ${verify.total === 0 && verifyAfter.total === 0 ? 'yes' : 'NO'}`,
    );
    return { ...r, ref, refNexthop, refOnto, verify, removal, verifyAfter };
  }

  async drift(rounds: number): Promise<DriftRound[]> {
    this.rss.begin('vxlan: drift (periodic reconcile every 10 s)');
    const res = await this.whileRunning(this.a.call('drift', { rounds, timeoutMs: 2 * Number(DEFAULT_RECONCILE) * 1000 + 10_000 }));
    for (const [i, r] of res.entries()) {
      console.log(`drift round ${i + 1}: back after route ${f0(r.routeMs)} ms, neighbour ${f0(r.neighMs)} ms, FDB entry ${f0(r.fdbMs)} ms${r.missing.length ? `; never back: ${r.missing.join(', ')}` : ''}`);
    }
    return res;
  }

  async churn(backend: BackendType, rate: number, reconcileInterval: string): Promise<Results['churn'][number]> {
    const label = `${backend}: churn ${rate}/s, --reconcile-interval ${reconcileInterval}`;
    this.rss.begin(label);
    const cpu = new CpuMeter(() => this.pids);
    const r = await this.whileRunning(
      this.a.call('churn', { rate, seconds: Number(args.seconds), drainTimeoutMs: Number(args['drain-timeout']) * 1000, backend }),
    );
    const usage = cpu.stop();
    const verify = await this.verify(backend, label);
    // Not exact: still catching up, or lost something? The next full pass tells.
    const afterReconcile = verify.total === 0 ? null : await this.afterFullReconcile(backend, label);
    console.log(
      `${label}: ${r.changes} changes (sent ${f0(r.sentPerSecond)}/s, acked ${f0(r.ackedPerSecond)}/s, ${r.writeErrors} failed${r.writeErrors ? `: ${r.firstWriteError}` : ''})` +
        ` | weft p50/p99/max ${f1(r.weft.change.p50)}/${f1(r.weft.change.p99)}/${f1(r.weft.change.max)} ms, outstanding at end ${r.weft.outstandingAtEnd}, drained ${f0(r.weft.drainMs ?? Infinity)} ms after` +
        ` | watch floor p50/p99 ${f1(r.floor.change.p50)}/${f1(r.floor.change.p99)} ms | ${r.weftBatches} batches, ${r.weftReconciles} reconciles | exact: ${verify.total === 0 ? 'yes' : 'NO'}`,
    );
    return { ...r, backend, reconcileInterval, verify, afterReconcile, cpu: usage };
  }

  /** The kernel state once a full reconcile that started after now has completed. */
  async afterFullReconcile(backend: BackendType, what: string): Promise<Verdict> {
    const before = (await this.a.call('metrics', {})).reconciles;
    const w = this.weftd!;
    await waitFor(
      async () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return (await this.a.call('metrics', {})).reconciles >= before + 2;
      },
      { timeoutMs: 120_000, intervalMs: 100, what: 'two more full reconciles' },
    );
    return this.verify(backend, `${what}, after the next full reconcile`);
  }

  async kube(n: number): Promise<NonNullable<Results['kube']>> {
    await this.stopWeftd();
    await this.resetNode();
    const { url } = await this.a.call('kubeStart', {});
    const netConf = join(this.dir, 'net-conf.json');
    writeFileSync(netConf, netConfig('vxlan'));
    this.rss.begin('kube: start with 0 peers');
    this.startWeftd('kube', DEFAULT_RECONCILE, ['--kube-subnet-mgr', '--kube-api-url', url, '--net-config-path', netConf], { NODE_NAME: KUBE_NODE });
    const w = this.weftd!;
    await waitFor(
      async () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return (await this.a.call('ready', {})).ready && (await this.a.call('kubeWatches', {})).watches > 0;
      },
      { timeoutMs: 60_000, what: 'weftd (kube mode) ready and watching Nodes' },
    );
    this.rss.begin(`kube: burst of ${n} Nodes`);
    const r = await this.whileRunning(this.a.call('kubeBurst', { n, pollMs: Number(args['poll-ms']), timeoutMs: CONVERGE_TIMEOUT_MS }));
    const verify = await this.verify('vxlan', 'kube burst');
    await this.stopWeftd();
    await this.a.call('kubeStop', {});
    console.log(
      `kube burst of ${n} Nodes: created in ${f0(r.createEndAt - r.createStartAt)} ms; last watch event flushed → all entries ${f0(r.poll.doneAt - r.lastFlushAt)} ms` +
        ` (first event flushed → all ${f0(r.poll.doneAt - r.firstFlushAt)} ms; ${r.watchStreams} watch stream(s)) | exact: ${verify.total === 0 ? 'yes' : 'NO'}`,
    );
    return { ...r, verify };
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    this.rss.stop();
    await this.stopWeftd().catch(() => undefined);
    const stop = async (p: ChildProcess | undefined | null) => {
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((resolve) => p.once('exit', resolve));
      p.kill('SIGTERM');
      const timer = setTimeout(() => p.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    };
    await stop(this.agentProc);
    await stop(this.etcd);
    for (const ns of this.namespaces) await delNetns(ns);
    rmSync(this.dir, { recursive: true, force: true });
    rmSync(this.etcdDir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// Reporting

const pass = (ok: boolean): string => (ok ? 'PASS' : 'FAIL');
const ms3 = (d: Dist): string => `${f1(d.p50)} / ${f1(d.p99)} / ${f1(d.max)}`;
const exact = (v: Verdict): string => (v.total === 0 ? 'yes' : `NO (${v.total} problems: ${v.problems.slice(0, 2).join('; ')})`);
const since = (t: number | null, t0: number): number => (t === null ? Infinity : t - t0);

function churnTarget(rate: number): number {
  return rate <= 100 ? 50 : 100;
}

function report(res: Results): void {
  const verdict = (target: string, value: string, ok: boolean) => res.verdicts.push({ target, value, pass: ok });

  if (res.churn.length > 0) {
    console.log('\n## 1 (and 4) Churn: one etcd transaction per change (put a new lease, delete the oldest), ms\n');
    const cols = res.churn.map((c) => `${c.backend} ${c.rate}/s, reconcile ${c.reconcileInterval} s`);
    const row = (what: string, f: (c: Results['churn'][number]) => string) => [what, ...res.churn.map(f)];
    printTable(['measure', ...cols], [
      row('changes: sent/s, acked/s, failed', (c) => `${c.changes}: ${f0(c.sentPerSecond)}, ${f0(c.ackedPerSecond)}, ${c.writeErrors}`),
      row('etcd write: sent → acknowledged p50 / p99 / max', (c) => ms3(c.writeMs)),
      row('**weft: ack → both routes changed in the kernel p50 / p99 / max**', (c) => `**${ms3(c.weft.change)}**`),
      row('weft: ack → new route present p50 / p99 / max', (c) => ms3(c.weft.add)),
      row('weft: ack → old route gone p50 / p99 / max', (c) => ms3(c.weft.del)),
      row('**reference: bare etcd watch client, ack → both events p50 / p99 / max**', (c) => `**${ms3(c.floor.change)}**`),
      row('weft: changes outstanding when the last write was acked / drained after (ms)', (c) => `${c.weft.outstandingAtEnd} / ${f0(c.weft.drainMs ?? Infinity)}`),
      row('reference: outstanding at the end / drained after (ms)', (c) => `${c.floor.outstandingAtEnd} / ${f0(c.floor.drainMs ?? Infinity)}`),
      row('weft: changes never seen in the kernel / leases added and deleted before weftd programmed them', (c) => `${c.weft.neverSeen} / ${c.weft.superseded}`),
      row('final kernel state exact (every live lease, nothing of deleted ones)', (c) => exact(c.verify)),
      row('… if not: exact after the next full reconcile', (c) => (c.afterReconcile ? exact(c.afterReconcile) : '')),
      row('weftd batches applied / full reconciles during the phase', (c) => `${c.weftBatches} / ${c.weftReconciles}`),
      row('writer event-loop delay p99 / max (ack stamps may be this late)', (c) => `${f1(c.writerLoopDelayMs.p99)} / ${f1(c.writerLoopDelayMs.max)}`),
      row('kernel notifications read / receive-buffer overruns', (c) => `${c.kernelEvents} / ${c.overflows}`),
      row('CPU ms: weftd / etcd / helper / rest of machine', (c) => `${f0(c.cpu.weftd)} / ${f0(c.cpu.etcd)} / ${f0(c.cpu.agent)} / ${f0(c.cpu.rest)}`),
    ]);
    for (const c of res.churn) {
      const t = churnTarget(c.rate);
      const what = `churn ${c.backend} ${c.rate}/s, reconcile every ${c.reconcileInterval} s`;
      verdict(`${what}: p99 ≤ ${t} ms`, `${f1(c.weft.change.p99)} ms (floor ${f1(c.floor.change.p99)} ms)`, c.weft.change.p99 <= t && c.overflows === 0);
      verdict(`${what}: no backlog (all drained within ${t} ms of the last ack)`, `${c.weft.outstandingAtEnd} outstanding, drained in ${f0(c.weft.drainMs ?? Infinity)} ms`, c.weft.drainMs !== null && c.weft.drainMs <= t);
      verdict(`${what}: final kernel state exact`, exact(c.verify), c.verify.total === 0);
    }
  }

  if (res.burst) {
    const b = res.burst;
    const weftMs = since(b.doneAt, b.startAt);
    console.log(`\n## 2 Burst: ${b.count} new leases in one transaction onto ${b.count > 0 ? 'the existing peers' : ''}, ms\n`);
    printTable(['measure', 'ms', 'ratio to the reference'], [
      [`**weft: txn sent → all ${b.count * 3} entries in the kernel**`, `**${f0(weftMs)}**`, `**${f2(weftMs / b.ref.ms)}**`],
      ['weft: txn acknowledged → all entries', f0(since(b.doneAt, b.ackAt)), ''],
      ['weft: txn sent → all routes', f0(since(b.routesDoneAt, b.startAt)), ''],
      ['etcd: txn sent → acknowledged', f0(b.ackAt - b.startAt), ''],
      [`**reference: ip -batch + bridge -batch of the same ${b.count * 3} entries, fresh flannel.1**`, `**${f0(b.ref.ms)}**`, '1.00'],
      ['reference, nexthop form (as weft programs)', f0(b.refNexthop.ms), f2(weftMs / b.refNexthop.ms)],
      ['reference, plain form, onto a flannel.1 already holding 10 000 peers (information)', f0(b.refOnto.ms), f2(weftMs / b.refOnto.ms)],
      [`store floor: bare watch client, txn sent → all ${b.count} events`, f0(since(b.watchDoneAt, b.startAt)), ''],
      ['exact after the burst / after deleting it again', `${exact(b.verify)} / ${exact(b.verifyAfter)}`, ''],
      [`the same ${b.count} deleted in one transaction: txn sent → all entries gone (information)`, f0(since(b.removal.doneAt, b.removal.startAt)), ''],
    ]);
    verdict(`burst ${b.count} onto 10 000: ≤ 1.0 × ip -batch + bridge -batch`, `${f0(weftMs)} ms vs ${f0(b.ref.ms)} ms = ${f2(weftMs / b.ref.ms)}`, weftMs <= b.ref.ms && b.overflows === 0);
    verdict('burst: kernel state exact', `${exact(b.verify)} / ${exact(b.verifyAfter)}`, b.verify.total === 0 && b.verifyAfter.total === 0);
  }

  if (res.cold.length > 0) {
    console.log('\n## 3 (and 4) Cold start: leases in etcd, weftd spawned → all entries in the kernel, ms\n');
    printTable(['backend', 'N', 'weft spawn → all', 'poll window', 'iproute2 batch (plain)', 'ratio', 'iproute2 nexthop form', 'ratio', 'exact', 'CPU ms weftd / etcd / rest'], res.cold.map((c) => [
      c.backend, String(c.n), `**${f0(c.ms)}**`, f0(c.windowMs), `${f0(c.ref.ms)}${c.backend === 'vxlan' ? ` (ip ${f0(c.ref.ipMs)} + bridge ${f0(c.ref.bridgeMs)})` : ''}`, `**${f2(c.ms / c.ref.ms)}**`,
      f0(c.refNexthop.ms), f2(c.ms / c.refNexthop.ms), exact(c.verify), `${f0(c.cpu.weftd)} / ${f0(c.cpu.etcd)} / ${f0(c.cpu.rest)}`,
    ]));
    for (const c of res.cold) {
      verdict(`cold start ${c.backend} ${c.n}: ≤ 1.0 × iproute2 batch`, `${f0(c.ms)} ms vs ${f0(c.ref.ms)} ms = ${f2(c.ms / c.ref.ms)}`, c.ms <= c.ref.ms);
      verdict(`cold start ${c.backend}: kernel state exact`, exact(c.verify), c.verify.total === 0);
    }
  }

  if (res.kube) {
    const k = res.kube;
    const ms = k.poll.doneAt - k.lastFlushAt;
    console.log(`\n## 5 Kubernetes mode: ${k.n} Nodes created at once on the fake API server, ms\n`);
    printTable(['measure', 'ms'], [
      ['fake API server: first Node created → last created (its watch events written as it goes)', f0(k.createEndAt - k.createStartAt)],
      ['first watch event flushed → last flushed', f0(k.lastFlushAt - k.firstFlushAt)],
      ['**last watch event flushed → all entries in the kernel**', `**${f0(ms)}**`],
      ['first watch event flushed → all entries in the kernel', f0(k.poll.doneAt - k.firstFlushAt)],
      ['poll window (convergence lies within the last …)', f0(k.poll.doneAt - (k.poll.lastMissAt ?? k.createStartAt))],
      ['watch streams that received the burst', String(k.watchStreams)],
      ['kernel state exact', exact(k.verify)],
    ]);
    verdict(`kube burst ${k.n} Nodes: last event flushed → all programmed ≤ 1 500 ms`, `${f0(ms)} ms`, ms <= 1500);
    verdict('kube burst: kernel state exact', exact(k.verify), k.verify.total === 0);
  }

  if (res.drift) {
    console.log('\n## 6 Drift: an entry deleted by hand → back (kernel notifications), ms; weftd --reconcile-interval 10\n');
    printTable(['round', 'route', 'neighbour', 'FDB entry', 'when'], res.drift.map((d, i) => [
      String(i + 1), f0(d.routeMs), f0(d.neighMs), f0(d.fdbMs), i === 0 ? 'at an arbitrary point of the reconcile period' : 'right after the previous round was repaired (for a timer-only repair: just after a pass, the worst case)',
    ]));
    const worst = Math.max(...res.drift.flatMap((d) => [d.routeMs, d.neighMs, d.fdbMs]).map((x) => (Number.isNaN(x) ? Infinity : x)));
    verdict('drift: each entry back ≤ 1 000 ms', `worst ${f0(worst)} ms`, worst <= 1000);
  }

  if (res.rss.length > 0) {
    console.log('\n## 7 weftd memory, MB (VmRSS sampled every 100 ms; VmHWM: the process\'s peak so far)\n');
    printTable(['phase', 'max VmRSS', 'VmHWM', 'samples'], res.rss.map((p) => [p.name, `**${f0(p.maxRssMB)}**`, f0(p.hwmMB), String(p.samples)]));
    const sampled = res.rss.filter((p) => p.samples > 0);
    const peak = sampled.length > 0 ? Math.max(...sampled.map((p) => Math.max(p.maxRssMB, p.hwmMB))) : NaN;
    verdict('RSS < 120 MB at every moment', `peak ${f0(peak)} MB (max of sampled VmRSS and VmHWM over ${sampled.length} phases)`, peak < 120);
  }

  console.log('\n## Verdicts\n');
  for (const v of res.verdicts) console.log(`${pass(v.pass)}  ${v.target}: ${v.value}`);
  for (const e of res.errors) console.log(`NOT MEASURED  ${e.scenario}: ${e.message.split('\n')[0]}`);
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces)');
  const selected = new Set(args.scenarios.split(',').map((s) => s.trim()).filter((s) => s !== ''));
  for (const s of selected) if (!(SCENARIOS as readonly string[]).includes(s)) throw new BenchError(`--scenarios: unknown ${s} (known: ${SCENARIOS.join(', ')})`);
  const has = (s: Scenario) => selected.has(s);
  const n = Number(args.peers);
  const burstN = Number(args.burst);
  if (!Number.isInteger(n) || n < 10 || n + burstN > 15_000) throw new BenchError('--peers: 10 … 15000 (with the burst)');
  const rates = args.rates.split(',').map(Number);
  if (args.daemon !== 'compiled' && args.daemon !== 'source') throw new BenchError('--daemon: compiled or source');
  const daemon = args.daemon === 'compiled' ? checkCompiled() : 'from source (tsx)';
  await initClockTicks();
  await machineFacts(daemon, 'dp');

  const bench = new Bench({ WEFT_FROM_SOURCE: args.daemon === 'source' ? '1' : '' });
  const onSignal = (sig: NodeJS.Signals) => {
    interrupted = true;
    console.error(`\n${sig}: cleaning up`);
    void bench.destroy().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);

  const results: Results = {
    machine: { load: loadavg(), daemon },
    clock: null,
    cold: [],
    burst: null,
    churn: [],
    drift: null,
    kube: null,
    rss: bench.rss.phases,
    verdicts: [],
    errors: [],
    durationS: NaN,
  };
  const began = mono();
  /** A scenario that fails is reported and the next one runs (each starts from a reset node). */
  const attempt = async (what: string, fn: () => Promise<void>): Promise<boolean> => {
    try {
      await fn();
      return true;
    } catch (e) {
      if (interrupted) throw e;
      const message = e instanceof Error ? e.message : String(e);
      console.log(`\n${what} FAILED: ${message}\n`);
      results.errors.push({ scenario: what, message });
      return false;
    }
  };
  try {
    await bench.setup();
    results.clock = await bench.clockCheck();
    console.log(`clock check: helper − bench CLOCK_MONOTONIC ${f2(results.clock.offsetMs)} ms (IPC round trip ${f2(results.clock.rttMs)} ms)\n`);

    if (has('cold') || has('burst') || has('drift') || has('churn')) {
      const ready = await attempt('vxlan cold start', async () => {
        results.cold.push(await bench.coldStart('vxlan', n, DEFAULT_RECONCILE));
        await bench.settle(`vxlan: idle at ${n} peers until a periodic reconcile has run`);
      });
      if (ready && has('burst')) await attempt('burst', async () => void (results.burst = await bench.burst(burstN, n)));
      if (ready && has('drift')) await attempt('drift', async () => void (results.drift = await bench.drift(Number(args['drift-rounds']))));
      if (ready && has('churn')) {
        const ok = await attempt('vxlan churn', async () => {
          for (const rate of rates) results.churn.push(await bench.churn('vxlan', rate, DEFAULT_RECONCILE));
        });
        if (!args['no-churn-reconcile']) {
          await attempt('vxlan churn with --reconcile-interval 1', async () => {
            // Full passes during the churn: the timer fires every second. After a failed churn
            // phase the node starts again from a cold start.
            if (ok) {
              await bench.stopWeftd();
              bench.rss.begin('vxlan: restart with --reconcile-interval 1');
              bench.startWeftd('vxlan-reconcile-1', '1');
              // The leases now in etcd: a churn whose writes failed (etcd refusing under load) may have left more or fewer than n.
              const live = await bench.liveCount();
              await bench.waitProgrammed(live, `weftd --reconcile-interval 1 to program its ${live} peers`);
            } else {
              await bench.coldStart('vxlan', n, '1');
            }
            for (const rate of rates) results.churn.push(await bench.churn('vxlan', rate, '1'));
          });
        }
      }
    }
    if (has('hostgw')) {
      await attempt('host-gw', async () => {
        results.cold.push(await bench.coldStart('host-gw', n, DEFAULT_RECONCILE));
        results.churn.push(await bench.churn('host-gw', Number(args['hostgw-rate']), DEFAULT_RECONCILE));
      });
    }
    if (has('kube')) await attempt('kube', async () => void (results.kube = await bench.kube(Number(args['kube-nodes']))));
    await bench.stopWeftd();
  } finally {
    await bench.destroy();
  }
  results.durationS = (mono() - began) / 1000;
  report(results);
  console.log(`\nfinished in ${f0(results.durationS)} s; load average at end: ${loadavg()}`);
  if (args.json) {
    writeFileSync(args.json, `${JSON.stringify(results, null, 2)}\n`);
    console.log(`JSON: ${args.json} (∞ and not-measured values are null)`);
  }
  if (results.errors.length > 0) process.exitCode = 1;
}

/** Set on SIGINT/SIGTERM: what fails afterwards fails because of the cleanup. */
let interrupted = false;

if (args.agent) {
  runAgent();
} else {
  main().catch((e: unknown) => {
    if (interrupted) return;
    console.error(e instanceof Error ? e.message : e);
    process.exitCode = 1;
  });
}
