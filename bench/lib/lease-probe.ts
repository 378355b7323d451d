// Lease-event latency probe for bench/cni.ts: a helper process started inside the namespace where
// weftd and etcd run (`ip netns exec <ns> node --import tsx bench/lib/lease-probe.ts`, driven over
// the IPC channel with bench/lib/rpc.ts). It writes peer leases to etcd at a steady rate and
// stamps, on CLOCK_MONOTONIC (the one clock every process of the machine shares, so the bench can
// relate the stamps to its own), when etcd acknowledged each write and when the kernel announced
// that peer's route and FDB entry (kernel-worker.ts: rtnetlink notifications read in a thread of
// their own). Latency of one lease = the later of the two announcements − the acknowledgement, as
// bench/dataplane.ts measures its churn.
//
// Each write is one transaction putting one new lease (slot i of common.ts's peer model: subnet
// 10.1.0.0/24 + i, VTEP MAC 0e:00:00:…, public IP 172.16.1.0 + i) bound to one etcd lease, written
// as flannel writes it. Writes are open-loop: write k is sent at start + k / rate whatever the
// answers. `clear` deletes every lease written so far in one transaction and waits for the routes
// to go, so each measurement starts from the same peer count.
import { monitorEventLoopDelay } from 'node:perf_hooks';

import { Etcd3 } from 'etcd3';

import { encodeLeaseAttrs, makeSubnetKey } from '../../src/subnet/codec.js';
import { waitFor } from '../../test/helpers/wait.js';
import { BenchError, cachedPeer, MAX_SLOTS, metricValue, mono } from './common.js';
import { deleteOp, putOp, RawTxnWriter, txnFrame } from './etcd-txn.js';
import { key, type Group, type KernelOps } from './kernel-worker.js';
import { RpcClient, serve, startTsWorker } from './rpc.js';

const SUBNETS = '/coreos.com/network/subnets/';
const CONFIG_KEY = '/coreos.com/network/config';

/** One write: sent, acknowledged (NaN: failed), route and FDB entry announced (NaN: not seen). */
export type ProbeSample = [sendAt: number, ackAt: number, routeAt: number, fdbAt: number];

export interface ProbeRun {
  readonly samples: ProbeSample[];
  readonly writeErrors: number;
  readonly firstWriteError: string;
  /** Kernel notifications lost to a full receive buffer (then some samples may show NaN). */
  readonly overflows: number;
  /** The writer's event-loop delay while it ran: how late a send or an acknowledgement may be stamped. */
  readonly writerLoopDelayMs: { readonly p99: number; readonly max: number };
}

export type ProbeOps = {
  clock: { req: Record<string, never>; res: { mono: number } };
  setup: { req: { etcdUrl: string; config: string }; res: Record<string, never> };
  /** GET http://127.0.0.1:<port><path> inside the namespace (weftd's health server). */
  http: { req: { port: number; path: string }; res: { status: number; text: string } };
  start: { req: { rate: number }; res: { startAt: number } };
  stop: { req: { drainTimeoutMs: number }; res: ProbeRun };
  clear: { req: { timeoutMs: number }; res: { cleared: number; missing: number } };
  /** Peers weftd has programmed (weft_peers_programmed), via its /metrics. */
  peers: { req: { port: number }; res: { peers: number } };
};

const subnetKey = (slot: number): string => SUBNETS + makeSubnetKey(cachedPeer(slot).subnet, null);
const dstOf = (slot: number): string => cachedPeer(slot).subnet.toString();

class Probe {
  private etcd: Etcd3 | null = null;
  private writer: RawTxnWriter | null = null;
  private readonly worker = startTsWorker(new URL('./kernel-worker.ts', import.meta.url));
  private readonly kernel = RpcClient.forWorker<KernelOps>('kernel thread', this.worker);
  private leaseId = '0';
  private nextSlot = 0;
  /** Slots written and not cleared yet. */
  private readonly live: number[] = [];
  private run: {
    readonly slots: number[];
    readonly sendAt: number[];
    readonly ackAt: number[];
    errors: number;
    firstError: string;
    pending: number;
    stopped: boolean;
    timer: NodeJS.Timeout | null;
    readonly eld: ReturnType<typeof monitorEventLoopDelay>;
    settled: (() => void) | null;
  } | null = null;

  readonly handlers = {
    clock: async () => ({ mono: mono() }),
    setup: async ({ etcdUrl, config }: ProbeOps['setup']['req']) => {
      this.etcd = new Etcd3({ hosts: etcdUrl, dialTimeout: 3000 });
      const etcd = this.etcd;
      await waitFor(() => etcd.get(CONFIG_KEY).string().then(() => true, () => false), { timeoutMs: 30_000, intervalMs: 100, what: `etcd at ${etcdUrl}` });
      await etcd.put(CONFIG_KEY).value(config);
      // Every peer lease is bound to one etcd lease, as real leases are; it outlives the bench.
      this.leaseId = (await etcd.leaseClient.leaseGrant({ TTL: 24 * 3600, ID: 0 })).ID;
      this.writer = new RawTxnWriter(etcdUrl);
      // Routes (and nexthop deletions, which remove routes silently) and neighbours (FDB entries).
      await this.kernel.call('subscribe', { groups: ['route', 'neigh', 'nexthop'] satisfies Group[] });
      return {};
    },
    http: async ({ port, path }: ProbeOps['http']['req']) => {
      const res = await fetch(`http://127.0.0.1:${port}${path}`, { signal: AbortSignal.timeout(5000) }).catch((e: unknown) => {
        throw new BenchError(`GET ${path}: ${e instanceof Error ? e.message : String(e)}`);
      });
      return { status: res.status, text: await res.text() };
    },
    peers: async ({ port }: ProbeOps['peers']['req']) => {
      const text = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(5000) }).then((r) => r.text());
      return { peers: metricValue(text, 'weft_peers_programmed') ?? -1 };
    },
    start: async ({ rate }: ProbeOps['start']['req']) => this.start(rate),
    stop: ({ drainTimeoutMs }: ProbeOps['stop']['req']) => this.stop(drainTimeoutMs),
    clear: ({ timeoutMs }: ProbeOps['clear']['req']) => this.clear(timeoutMs),
  } satisfies { [K in keyof ProbeOps]: (req: ProbeOps[K]['req']) => Promise<ProbeOps[K]['res']> };

  private takeSlot(): number {
    if (this.nextSlot >= MAX_SLOTS) throw new BenchError('no free peer slot');
    return this.nextSlot++;
  }

  private frame(slot: number): Buffer {
    const p = cachedPeer(slot);
    const value = encodeLeaseAttrs({ publicIP: p.pub, publicIPv6: null, backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: p.mac } });
    return txnFrame([putOp(subnetKey(slot), value, this.leaseId)]);
  }

  private start(rate: number): { startAt: number } {
    const writer = this.writer;
    if (!writer) throw new BenchError('probe not set up');
    if (this.run) throw new BenchError('probe already running');
    if (!(rate > 0)) throw new BenchError(`rate must be positive, got ${rate}`);
    const eld = monitorEventLoopDelay({ resolution: 1 });
    eld.enable();
    const run = (this.run = { slots: [] as number[], sendAt: [] as number[], ackAt: [] as number[], errors: 0, firstError: '', pending: 0, stopped: false, timer: null as NodeJS.Timeout | null, eld, settled: null as (() => void) | null });
    const startAt = mono();
    let k = 0;
    const tick = (): void => {
      run.timer = null;
      if (run.stopped) return;
      const due = Math.floor(((mono() - startAt) * rate) / 1000) + 1;
      while (k < due) {
        const i = k++;
        const slot = this.takeSlot();
        const frame = this.frame(slot);
        run.slots.push(slot);
        this.live.push(slot);
        run.ackAt.push(NaN);
        run.pending++;
        run.sendAt.push(mono());
        writer.txn(frame).then(
          () => {
            run.ackAt[i] = mono();
          },
          (e: unknown) => {
            run.errors++;
            run.firstError ||= e instanceof Error ? e.message : String(e);
          },
        ).finally(() => {
          if (--run.pending === 0) run.settled?.();
        });
      }
      run.timer = setTimeout(tick, Math.max(0, startAt + (k * 1000) / rate - mono()));
    };
    tick();
    return { startAt };
  }

  private async stop(drainTimeoutMs: number): Promise<ProbeRun> {
    const run = this.run;
    if (!run) throw new BenchError('probe not running');
    run.stopped = true;
    if (run.timer) clearTimeout(run.timer);
    if (run.pending > 0) await new Promise<void>((resolve) => (run.settled = resolve));
    run.eld.disable();
    this.run = null;
    const keys: string[] = [];
    run.slots.forEach((s, i) => {
      if (!Number.isNaN(run.ackAt[i]!)) keys.push(key.routeAdd(dstOf(s)), key.fdbAdd(cachedPeer(s).mac));
    });
    await this.kernel.call('expect', { keys, timeoutMs: drainTimeoutMs });
    const { log, overflows } = await this.kernel.call('take', {});
    const first = new Map(log.map(([k, ts]) => [k, ts[0] ?? NaN]));
    const samples: ProbeSample[] = run.slots.map((s, i) => [
      run.sendAt[i]!,
      run.ackAt[i]!,
      first.get(key.routeAdd(dstOf(s))) ?? NaN,
      first.get(key.fdbAdd(cachedPeer(s).mac)) ?? NaN,
    ]);
    const ms = (ns: number) => ns / 1e6;
    return {
      samples,
      writeErrors: run.errors,
      firstWriteError: run.firstError,
      overflows,
      writerLoopDelayMs: { p99: ms(run.eld.percentile(99)), max: ms(run.eld.max) },
    };
  }

  private async clear(timeoutMs: number): Promise<{ cleared: number; missing: number }> {
    if (this.run) throw new BenchError('probe still running');
    const writer = this.writer;
    if (!writer) throw new BenchError('probe not set up');
    const slots = this.live.splice(0);
    if (slots.length === 0) return { cleared: 0, missing: 0 };
    await writer.txn(txnFrame(slots.map((s) => deleteOp(subnetKey(s)))));
    const r = await this.kernel.call('expect', { keys: slots.map((s) => key.routeDel(dstOf(s))), timeoutMs });
    return { cleared: slots.length, missing: r.missingCount };
  }

  close(): void {
    this.writer?.close();
    this.etcd?.close();
    void this.worker.terminate();
  }
}

if (process.send) {
  const probe = new Probe();
  serve<ProbeOps>(probe.handlers);
  // The bench closes the channel (or dies): nothing is left running.
  process.on('disconnect', () => {
    probe.close();
    process.exit(0);
  });
}
