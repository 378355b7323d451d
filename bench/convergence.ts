// vxlan convergence: N peer leases in etcd → every neighbour, FDB entry and route of those peers in
// the kernel, timed for weftd running in a network namespace, next to iproute2's batch mode
// (`ip -batch` + `bridge -batch`) programming the same entries in the same run.
//
// Scenarios, for each N in --peers:
//   (a) start  N leases are in etcd when weftd starts: from spawning weftd to "all N neighbours,
//              N FDB entries and N routes present", and from weftd's "acquired lease" log line
//              to the same point;
//   (b) burst  weftd runs idle with 0 peers, then all N leases arrive in one etcd transaction:
//              from sending the transaction to all entries present;
//   reference  a fresh namespace with an identical flannel.1 on its own veth: `ip -batch` (neigh
//              replace … nud permanent + route replace … via … dev flannel.1 onlink) and
//              `bridge -batch` (fdb replace … dst … self permanent), from spawn to exit; also the
//              nexthop-object form weft programs (`nexthop replace` + `route replace … nhid`).
//
// Layout: namespace "node" (eth0 172.16.0.1/16 on a veth whose peer end is in namespace "ul"),
// etcd and weftd inside it on 127.0.0.1; namespace "ref" with its own veth and flannel.1. A helper
// process (this file with --agent) runs inside "node": it writes the leases with etcd3 and polls
// the kernel with netlink route/neighbour dumps that it only counts (see KernelCounter and Agent.converge).
//
//   node --import tsx bench/convergence.ts [--peers 1000,10000] [--runs 3] [--poll-ms 5]
//       [--daemon compiled|source] [--reconcile-interval 10] [--settle-ms 12000] [--no-nexthop-ref]
//       [--cpu-prof DIR] [--keep-logs DIR] [--trace-polls]
//
// Run as root. The machine's own network namespace is never touched; namespaces, etcd, weftd and
// the helper are removed in `finally` and on SIGINT/SIGTERM.
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, endianness, tmpdir, totalmem } from 'node:os';
import { join, relative } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import { Etcd3, type IRequestOp } from 'etcd3';
import { Protocol, RawNetlinkSocket } from 'netlink';

import { Netlink, WEFT_ROUTE_PROTOCOL } from '../src/netlink/index.js';
import { align4, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, readS32, readU16, readU32 } from '../src/netlink/wire.js';
import { encodeLeaseAttrs, makeSubnetKey } from '../src/subnet/codec.js';
import { IPAddr, IPNet } from '../src/util/ip.js';
import { addNetns, delNetns, ipn, nsPrefix, sh } from '../test/helpers/netns.js';
import { WaitAbort, waitFor } from '../test/helpers/wait.js';
import { WeftdProcess } from '../test/helpers/weftd.js';

const run = promisify(execFile);
const SELF = fileURLToPath(import.meta.url);
const ROOT = fileURLToPath(new URL('..', import.meta.url));

const { values: args } = parseArgs({
  options: {
    peers: { type: 'string', default: '1000,10000' },
    runs: { type: 'string', default: '3' },
    'poll-ms': { type: 'string', default: '5' },
    daemon: { type: 'string', default: 'compiled' },
    'reconcile-interval': { type: 'string', default: '10' },
    'no-nexthop-ref': { type: 'boolean', default: false },
    'cpu-prof': { type: 'string' },
    'trace-polls': { type: 'boolean', default: false },
    'settle-ms': { type: 'string', default: '12000' },
    'keep-logs': { type: 'string' },
    agent: { type: 'boolean', default: false },
  },
});

const cpuProfDir = args['cpu-prof'];
const ETCD_URL = 'http://127.0.0.1:2379';
const SUBNETS = '/coreos.com/network/subnets/';
const CONFIG_KEY = '/coreos.com/network/config';
const CONFIG = JSON.stringify({ Network: '10.0.0.0/8', SubnetLen: 24, Backend: { Type: 'vxlan' } });
const HEALTHZ_PORT = 8081;
const NODE_IP = '172.16.0.1';
const VXLAN = 'flannel.1';
/** flannel's device: VNI 1, the kernel's default port, no learning; MTU of eth0 minus 50. */
const VXLAN_ARGS = ['type', 'vxlan', 'id', '1', 'local', NODE_IP, 'dev', 'eth0', 'dstport', '8472', 'nolearning'];
const CONVERGE_TIMEOUT_MS = 120_000;
const NUD_PERMANENT = 0x80;
const NLM_F_DUMP = 0x300;
const NLM_F_DUMP_INTR = 0x10;
const RTM_GETROUTE = 26;
const RTM_GETNEIGH = 30;
const RTN_UNICAST = 1;
const AF_INET = 2;
const AF_BRIDGE = 7;
const MAIN_TABLE = 254;

/** Wall-clock milliseconds with sub-millisecond resolution, comparable across processes. */
const wall = (): number => performance.timeOrigin + performance.now();

class BenchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BenchError';
  }
}

// ---------------------------------------------------------------------------------------------
// Peers: the same N leases for etcd (weft) and for the batch files (iproute2).

interface Peer {
  readonly subnet: IPNet;
  readonly mac: string;
  readonly pub: IPAddr;
}

const hex2 = (v: number): string => (v & 255).toString(16).padStart(2, '0');
const SUBNET_BASE = IPAddr.parse('10.1.0.0').value;
const PUBLIC_BASE = IPAddr.parse('172.16.1.0').value;

function peer(i: number): Peer {
  return {
    subnet: IPNet.of(IPAddr.of(4, SUBNET_BASE + BigInt(i) * 256n), 24),
    mac: `0e:00:00:${hex2(i >> 16)}:${hex2(i >> 8)}:${hex2(i)}`,
    pub: IPAddr.of(4, PUBLIC_BASE + BigInt(i)),
  };
}
const peerCache = new Map<number, Peer[]>();
function peers(n: number): Peer[] {
  let p = peerCache.get(n);
  if (!p) {
    p = Array.from({ length: n }, (_, i) => peer(i));
    peerCache.set(n, p);
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// The helper inside the node namespace, driven over Node's IPC channel.

interface WriteResult {
  /** Just before the transaction was handed to the client; the value has been built before. */
  readonly startAt: number;
  /** When etcd's answer arrived. */
  readonly commitAt: number;
  readonly revision: string;
  /** Keys plus values, bytes. */
  readonly bytes: number;
}

interface Counts {
  readonly routes: number;
  readonly neighbours: number;
  readonly fdb: number;
}

interface ConvergeRequest {
  readonly n: number;
  /** Write the N leases in one transaction first and time from that write. */
  readonly burst: boolean;
  readonly pollMs: number;
  readonly timeoutMs: number;
  /** Each poll to stderr. */
  readonly trace: boolean;
}

interface ConvergeResult {
  readonly startAt: number;
  /** End of the poll that found everything present: an upper bound of the convergence instant. */
  readonly doneAt: number;
  /** End of the dump that first showed all N routes. */
  readonly routesAt: number;
  /** Start of the previous poll, which did not: a lower bound. */
  readonly lastMissAt: number | null;
  readonly polls: number;
  readonly pollMedianMs: number;
  readonly pollMaxMs: number;
  readonly write: WriteResult | null;
}

interface WeftMetrics {
  readonly peers: number;
  readonly peersProgrammed: number;
  readonly programmingSeconds: number;
  readonly programmingCount: number;
  readonly batches: number;
  readonly reconciles: number;
  /** V8 heap used / total and memory outside the heap (Buffers), MB: live data versus what the heap holds. */
  readonly heapUsedMB: number;
  readonly heapTotalMB: number;
  readonly externalMB: number;
}

interface AgentOps {
  clock: { req: Record<string, never>; res: { wall: number } };
  setup: { req: { config: string }; res: { ms: number } };
  clear: { req: Record<string, never>; res: { deleted: number } };
  write: { req: { n: number }; res: WriteResult };
  counts: { req: Record<string, never>; res: Counts };
  converge: { req: ConvergeRequest; res: ConvergeResult };
  watchers: { req: { min: number; max: number; timeoutMs: number }; res: { watchers: number } };
  verify: { req: { n: number }; res: { problems: string[]; total: number } };
  metrics: { req: Record<string, never>; res: WeftMetrics };
}
type AgentOp = keyof AgentOps;

interface AgentRequestMsg {
  readonly id: number;
  readonly op: AgentOp;
  readonly req: unknown;
}
interface AgentReplyMsg {
  readonly id: number;
  readonly ok: boolean;
  readonly res?: unknown;
  readonly error?: string;
}

interface Dumping {
  readonly seq: number;
  readonly match: (b: Buffer, payload: number) => boolean;
  count: number;
  interrupted: boolean;
  resolve(v: number | null): void;
  reject(e: Error): void;
}

/**
 * Counts kernel entries from dumps on a raw rtnetlink socket, looking only at the fixed header of
 * each message (no attribute decoding, no object per message): cheap enough to poll while weftd
 * works on the other core.
 */
class KernelCounter {
  private readonly raw = new RawNetlinkSocket(Protocol.ROUTE, { recvBufferSize: 4 << 20, sendBufferSize: 1 << 20 });
  private readonly nl = Netlink.open();
  private seq = 1;
  private current: Dumping | null = null;

  constructor() {
    this.raw.on('message', (b: Buffer) => this.receive(b));
    this.raw.on('error', (e: Error) => this.current?.reject(e));
  }

  private receive(b: Buffer): void {
    const cur = this.current;
    for (let off = 0; cur && off + NLMSG_HDRLEN <= b.length; ) {
      const len = readU32(b, off);
      if (len < NLMSG_HDRLEN || off + len > b.length) break;
      if (readU32(b, off + 8) === cur.seq) {
        const type = readU16(b, off + 4);
        if ((readU16(b, off + 6) & NLM_F_DUMP_INTR) !== 0) cur.interrupted = true;
        if (type === NLMSG_DONE) {
          this.current = null;
          cur.resolve(cur.interrupted ? null : cur.count);
          return;
        }
        if (type === NLMSG_ERROR) {
          this.current = null;
          cur.reject(new BenchError(`netlink dump failed: errno ${-readS32(b, off + NLMSG_HDRLEN)}`));
          return;
        }
        if (cur.match(b, off + NLMSG_HDRLEN)) cur.count++;
      }
      off += align4(len);
    }
  }

  /** Entries of a dump that `match` accepts; null when the kernel marked it inconsistent. */
  private dump(type: number, family: number, match: (b: Buffer, payload: number) => boolean): Promise<number | null> {
    if (this.current) return Promise.reject(new BenchError('one dump at a time'));
    const seq = this.seq++;
    // nlmsghdr + a zeroed rtmsg/ndmsg (12 bytes each) carrying only the family.
    const req = Buffer.alloc(NLMSG_HDRLEN + 12);
    const le = endianness() === 'LE';
    const u32 = (v: number, o: number) => (le ? req.writeUInt32LE(v, o) : req.writeUInt32BE(v, o));
    const u16 = (v: number, o: number) => (le ? req.writeUInt16LE(v, o) : req.writeUInt16BE(v, o));
    u32(req.length, 0);
    u16(type, 4);
    u16(NLM_F_REQUEST | NLM_F_DUMP, 6);
    u32(seq, 8);
    req[NLMSG_HDRLEN] = family;
    return new Promise((resolve, reject) => {
      this.current = { seq, match, count: 0, interrupted: false, resolve, reject };
      this.raw.send(req, {}, (err) => {
        if (err && this.current?.seq === seq) {
          this.current = null;
          reject(err);
        }
      });
    });
  }

  /** IPv4 /24 unicast routes in the main table with weft's protocol number. */
  routes(): Promise<number | null> {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type
    return this.dump(RTM_GETROUTE, AF_INET, (b, p) => b[p] === AF_INET && b[p + 1] === 24 && b[p + 4] === MAIN_TABLE && b[p + 5] === WEFT_ROUTE_PROTOCOL && b[p + 7] === RTN_UNICAST);
  }

  /** Permanent entries of one device in an ARP (AF_INET) or FDB (AF_BRIDGE) dump. */
  permanentNeigh(family: number, ifindex: number): Promise<number | null> {
    // struct ndmsg: family u8, pad u8, pad u16, ifindex s32, state u16, flags u8, type u8
    return this.dump(RTM_GETNEIGH, family, (b, p) => b[p] === family && readS32(b, p + 4) === ifindex && (readU16(b, p + 8) & NUD_PERMANENT) !== 0);
  }

  async vxlanIndex(): Promise<number | null> {
    return (await this.nl.link(VXLAN))?.index ?? null;
  }

  async counts(): Promise<Counts> {
    const vx = await this.vxlanIndex();
    const routes = (await this.routes()) ?? -1;
    if (vx === null) return { routes, neighbours: 0, fdb: 0 };
    return {
      routes,
      neighbours: (await this.permanentNeigh(AF_INET, vx)) ?? -1,
      fdb: (await this.permanentNeigh(AF_BRIDGE, vx)) ?? -1,
    };
  }

  /** Every peer's entries exactly as weft means them (decoded, not timed). */
  async verify(n: number): Promise<{ problems: string[]; total: number }> {
    const problems: string[] = [];
    const vx = await this.vxlanIndex();
    if (vx === null) return { problems: [`no ${VXLAN}`], total: 1 };
    const neigh = new Map((await this.nl.neighbours(vx, 4)).filter((e) => e.permanent).map((e) => [e.ip.toString(), e.mac]));
    const fdb = new Map((await this.nl.fdb(vx)).filter((e) => e.permanent && e.self).map((e) => [e.mac, e.dst?.toString() ?? null]));
    const routes = new Map(
      (await this.nl.routes({ family: 4, table: MAIN_TABLE, protocol: WEFT_ROUTE_PROTOCOL })).map((r) => [r.dst.toString(), r]),
    );
    if (neigh.size !== n) problems.push(`${neigh.size} permanent neighbours, expected ${n}`);
    if (fdb.size !== n) problems.push(`${fdb.size} FDB entries, expected ${n}`);
    if (routes.size !== n) problems.push(`${routes.size} proto ${WEFT_ROUTE_PROTOCOL} routes, expected ${n}`);
    for (const p of peers(n)) {
      const gw = p.subnet.ip.toString();
      if (neigh.get(gw) !== p.mac) problems.push(`neighbour ${gw}: ${neigh.get(gw) ?? 'missing'}, expected ${p.mac}`);
      if (fdb.get(p.mac) !== p.pub.toString()) problems.push(`fdb ${p.mac}: ${fdb.get(p.mac) ?? 'missing'}, expected dst ${p.pub.toString()}`);
      const r = routes.get(p.subnet.toString());
      const form = r ? `via ${r.gateway?.toString() ?? '-'} oif ${r.oif ?? '-'}${r.onlink ? ' onlink' : ''} nhid ${r.nhid ?? '-'}` : 'missing';
      if (!r || r.gateway?.toString() !== gw || r.oif !== vx || !r.onlink || r.nhid === null) {
        problems.push(`route ${p.subnet.toString()}: ${form}, expected via ${gw} dev ${VXLAN} onlink through a nexthop object`);
      }
    }
    return { problems: problems.slice(0, 5), total: problems.length };
  }

  close(): void {
    this.raw.close();
    this.nl.close();
  }
}

class Agent {
  private readonly etcd = new Etcd3({ hosts: ETCD_URL, dialTimeout: 3000 });
  private readonly kernel = new KernelCounter();

  readonly handlers: { [K in AgentOp]: (req: AgentOps[K]['req']) => Promise<AgentOps[K]['res']> } = {
    clock: async () => ({ wall: wall() }),
    setup: async ({ config }) => {
      const t = wall();
      await waitFor(() => this.etcd.get(CONFIG_KEY).string().then(() => true), { timeoutMs: 30_000, what: 'etcd' });
      await this.etcd.put(CONFIG_KEY).value(config);
      return { ms: wall() - t };
    },
    clear: async () => {
      const res = await this.etcd.delete().prefix(SUBNETS).exec();
      return { deleted: Number(res.deleted) };
    },
    write: async ({ n }) => this.commit(await this.prepareWrite(n)),
    counts: () => this.kernel.counts(),
    converge: (req) => this.converge(req),
    watchers: async ({ min, max, timeoutMs }) => {
      const watchers = await waitFor(
        async () => {
          const v = metricValue(await fetchText(`${ETCD_URL}/metrics`), 'etcd_debugging_mvcc_watcher_total');
          // Boxed: 0 is a valid answer.
          return v !== null && v >= min && v <= max ? { v } : null;
        },
        { timeoutMs, what: `between ${min} and ${max} etcd watchers`, intervalMs: 10 },
      );
      return { watchers: watchers.v };
    },
    verify: ({ n }) => this.kernel.verify(n),
    metrics: async () => {
      const text = await fetchText(`http://127.0.0.1:${HEALTHZ_PORT}/metrics`);
      return {
        peers: metricValue(text, 'weft_peers') ?? -1,
        peersProgrammed: metricValue(text, 'weft_peers_programmed') ?? -1,
        programmingSeconds: metricValue(text, 'weft_backend_programming_duration_seconds_sum') ?? -1,
        programmingCount: metricValue(text, 'weft_backend_programming_duration_seconds_count') ?? -1,
        batches: metricValue(text, 'weft_lease_batches_applied_total') ?? -1,
        reconciles: metricValue(text, 'weft_backend_reconcile_duration_seconds_count') ?? -1,
        heapUsedMB: (metricValue(text, 'weft_nodejs_heap_size_used_bytes') ?? NaN) / 2 ** 20,
        heapTotalMB: (metricValue(text, 'weft_nodejs_heap_size_total_bytes') ?? NaN) / 2 ** 20,
        externalMB: (metricValue(text, 'weft_nodejs_external_memory_bytes') ?? NaN) / 2 ** 20,
      };
    },
  };

  /** The N puts (all bound to one etcd lease, as real leases are), built before any timing starts. */
  private async prepareWrite(n: number): Promise<{ ops: IRequestOp[]; bytes: number }> {
    const { ID } = await this.etcd.leaseClient.leaseGrant({ TTL: 3600, ID: 0 });
    let bytes = 0;
    const ops = peers(n).map((p): IRequestOp => {
      const key = Buffer.from(SUBNETS + makeSubnetKey(p.subnet, null));
      const value = Buffer.from(
        encodeLeaseAttrs({ publicIP: p.pub, publicIPv6: null, backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: p.mac } }),
      );
      bytes += key.length + value.length;
      return { request_put: { key, value, lease: ID } };
    });
    return { ops, bytes };
  }

  /** One transaction with every put (etcd runs with --max-txn-ops above the largest N). */
  private async commit(w: { ops: IRequestOp[]; bytes: number }): Promise<WriteResult> {
    const startAt = wall();
    const res = await this.etcd.kv.txn({ compare: [], success: w.ops, failure: [] });
    return { startAt, commitAt: wall(), revision: res.header.revision, bytes: w.bytes };
  }

  /**
   * Polls until every entry is present: the route count first (cheap, and weft sends routes after
   * the neighbours, FDB entries and nexthops), then the neighbour and FDB counts of flannel.1.
   * A kind found complete is not dumped again: entries are only added here.
   */
  private async converge(req: ConvergeRequest): Promise<ConvergeResult> {
    const prepared = req.burst ? await this.prepareWrite(req.n) : null;
    const writing = prepared ? this.commit(prepared) : null;
    const startAt = wall();
    const deadline = startAt + req.timeoutMs;
    const cycles: number[] = [];
    let lastMissAt: number | null = null;
    let routesAt: number | null = null;
    let neighOk = false;
    let fdbOk = false;
    const last = { routes: 0, neighbours: 0, fdb: 0 };
    while (true) {
      const t0 = wall();
      if (routesAt === null) {
        last.routes = (await this.kernel.routes()) ?? -1;
        if (last.routes >= req.n) routesAt = wall();
      }
      const vx = routesAt !== null ? await this.kernel.vxlanIndex() : null;
      if (vx !== null && !neighOk) {
        last.neighbours = (await this.kernel.permanentNeigh(AF_INET, vx)) ?? -1;
        neighOk = last.neighbours >= req.n;
      }
      if (vx !== null && neighOk && !fdbOk) {
        last.fdb = (await this.kernel.permanentNeigh(AF_BRIDGE, vx)) ?? -1;
        fdbOk = last.fdb >= req.n;
      }
      const t1 = wall();
      cycles.push(t1 - t0);
      if (req.trace) process.stderr.write(`poll +${f1(t0 - startAt)} ms took ${f1(t1 - t0)} ms: ${JSON.stringify(last)}\n`);
      if (routesAt !== null && neighOk && fdbOk) {
        const write = writing ? await writing : null;
        const sorted = [...cycles].sort((x, y) => x - y);
        return {
          startAt: write?.startAt ?? startAt,
          doneAt: t1,
          routesAt,
          lastMissAt,
          polls: cycles.length,
          pollMedianMs: sorted[Math.floor(sorted.length / 2)]!,
          pollMaxMs: sorted[sorted.length - 1]!,
          write,
        };
      }
      lastMissAt = t0;
      if (t1 > deadline) throw new BenchError(`not converged after ${req.timeoutMs} ms: ${JSON.stringify(last)} of ${req.n}`);
      await sleep(req.pollMs);
    }
  }

  close(): void {
    this.kernel.close();
    this.etcd.close();
  }
}

async function fetchText(url: string): Promise<string> {
  const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new BenchError(`GET ${url}: HTTP ${res.status}`);
  return res.text();
}

/** The value of an unlabelled Prometheus sample, or null when absent. */
function metricValue(text: string, name: string): number | null {
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name} `)) return Number(line.slice(name.length + 1));
  }
  return null;
}

function runAgent(): void {
  const agent = new Agent();
  const dispatch = <K extends AgentOp>(op: K, req: unknown): Promise<AgentOps[K]['res']> => {
    const handler = agent.handlers[op] as (r: AgentOps[K]['req']) => Promise<AgentOps[K]['res']>;
    return handler(req as AgentOps[K]['req']);
  };
  process.on('message', (m: AgentRequestMsg) => {
    dispatch(m.op, m.req).then(
      (res) => process.send?.({ id: m.id, ok: true, res } satisfies AgentReplyMsg),
      (e: unknown) => process.send?.({ id: m.id, ok: false, error: e instanceof Error ? e.message : String(e) } satisfies AgentReplyMsg),
    );
  });
  // The bench went away (or closed the channel): nothing left to do.
  process.on('disconnect', () => {
    agent.close();
    process.exit(0);
  });
}

// ---------------------------------------------------------------------------------------------
// The bench process (machine's namespace; everything it changes is inside its own namespaces).

class AgentClient {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; op: string }>();
  readonly exited: Promise<void>;

  constructor(readonly proc: ChildProcess) {
    proc.on('message', (m: AgentReplyMsg) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.ok) p.resolve(m.res);
      else p.reject(new BenchError(`agent ${p.op}: ${m.error ?? 'failed'}`));
    });
    this.exited = new Promise((resolve) =>
      proc.once('exit', (code, signal) => {
        for (const p of this.pending.values()) p.reject(new BenchError(`agent exited (${code ?? signal}) during ${p.op}`));
        this.pending.clear();
        resolve();
      }),
    );
  }

  call<K extends AgentOp>(op: K, req: AgentOps[K]['req']): Promise<AgentOps[K]['res']> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v as AgentOps[K]['res']), reject, op });
      this.proc.send({ id, op, req } satisfies AgentRequestMsg);
    });
  }

  /** agent wall clock − bench wall clock, from the exchange with the shortest round trip. */
  async clockOffset(): Promise<{ offset: number; rtt: number }> {
    let best = { offset: 0, rtt: Infinity };
    for (let i = 0; i < 7; i++) {
      const t0 = wall();
      const { wall: a } = await this.call('clock', {});
      const t1 = wall();
      if (t1 - t0 < best.rtt) best = { offset: a - (t0 + t1) / 2, rtt: t1 - t0 };
    }
    return best;
  }
}

// CPU accounting from /proc, to see what else ran during a measurement (this machine is shared).
let CLK_TCK = 100;
function procTicks(pid: number | 'self'): { own: number; children: number } {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { own: Number(f[11]) + Number(f[12]), children: Number(f[13]) + Number(f[14]) };
  } catch {
    return { own: 0, children: 0 };
  }
}
function machineBusyTicks(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal
  return f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + f[7]!;
}

interface CpuSplit {
  /** CPU milliseconds during the measurement. */
  readonly weftd: number;
  readonly etcd: number;
  readonly agent: number;
  /** ip/bridge children of the bench plus the bench itself. */
  readonly bench: number;
  readonly rest: number;
  readonly wallMs: number;
}

class CpuMeter {
  private readonly t0 = wall();
  private readonly busy0 = machineBusyTicks();
  private readonly start: Map<string, number>;

  constructor(private readonly pids: () => Record<'weftd' | 'etcd' | 'agent', number | undefined>) {
    this.start = this.sample();
  }

  private sample(): Map<string, number> {
    const m = new Map<string, number>();
    for (const [k, pid] of Object.entries(this.pids())) m.set(k, pid ? procTicks(pid).own : 0);
    const self = procTicks('self');
    m.set('bench', self.own + self.children);
    return m;
  }

  stop(): CpuSplit {
    const end = this.sample();
    const ms = (k: string) => ((end.get(k) ?? 0) - (this.start.get(k) ?? 0)) * (1000 / CLK_TCK);
    const busy = (machineBusyTicks() - this.busy0) * (1000 / CLK_TCK);
    const known = ms('weftd') + ms('etcd') + ms('agent') + ms('bench');
    return { weftd: ms('weftd'), etcd: ms('etcd'), agent: ms('agent'), bench: ms('bench'), rest: Math.max(0, busy - known), wallMs: wall() - this.t0 };
  }
}

const heapText = (m: WeftMetrics): string => `${f0(m.heapUsedMB)} / ${f0(m.heapTotalMB)} + ${f0(m.externalMB)}`;

function rssOf(pid: number): { rssMB: number; hwmMB: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rssMB: kb('VmRSS') / 1024, hwmMB: kb('VmHWM') / 1024 };
}

interface LogLine {
  readonly time: string;
  readonly msg: string;
  readonly [field: string]: unknown;
}

function logLines(output: string): LogLine[] {
  const out: LogLine[] = [];
  for (const line of output.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const v = JSON.parse(line) as LogLine;
      if (typeof v.time === 'string' && typeof v.msg === 'string') out.push(v);
    } catch {
      // a partial line: the next read completes it
    }
  }
  return out;
}

function logTime(output: string, match: (l: LogLine) => boolean): number | null {
  const l = logLines(output).find(match);
  return l ? Date.parse(l.time) : null;
}

// ---------------------------------------------------------------------------------------------

interface Settled {
  readonly rssMB: number;
  readonly hwmMB: number;
  readonly reconciles: number;
  readonly heap: string;
}

interface StartResult {
  /** Spawn → all entries in the kernel. */
  readonly totalMs: number;
  /** weftd's "acquired lease" log line → all entries in the kernel. */
  readonly fromLeaseMs: number;
  /** Convergence lies within (doneAt − windowMs, doneAt]. */
  readonly windowMs: number;
  readonly phases: Record<string, number>;
  readonly pollMaxMs: number;
  readonly cpu: CpuSplit;
  readonly rss: { rssMB: number; hwmMB: number };
  /** --settle-ms after convergence (largest N only), with the periodic reconciles run meanwhile. */
  readonly settled: Settled | null;
  /** V8 heap used / total + external, MB, right after convergence. */
  readonly heap: string;
  readonly clockRttMs: number;
}

interface BurstResult {
  readonly totalMs: number;
  readonly windowMs: number;
  readonly phases: Record<string, number>;
  readonly pollMaxMs: number;
  readonly cpu: CpuSplit;
  readonly rss: { rssMB: number; hwmMB: number };
  /** --settle-ms after convergence (largest N only), with the periodic reconciles run meanwhile. */
  readonly settled: Settled | null;
  /** V8 heap used / total + external, MB, right after convergence. */
  readonly heap: string;
  /** Before the burst, with 0 peers. */
  readonly idle: { rssMB: number; hwmMB: number };
  readonly writeBytes: number;
}

interface RefResult {
  readonly ms: number;
  readonly ipMs: number;
  readonly bridgeMs: number;
  readonly cpu: CpuSplit;
}

class Bench {
  readonly dir = mkdtempSync(join(tmpdir(), 'weft-convergence-'));
  readonly prefix = nsPrefix('cv');
  readonly node = `${this.prefix}-node`;
  readonly ul = `${this.prefix}-ul`;
  readonly ref = `${this.prefix}-ref`;
  private readonly namespaces: string[] = [];
  private etcd: ChildProcess | null = null;
  agent: AgentClient | null = null;
  weftd: WeftdProcess | null = null;
  private weftdSeq = 0;
  private weftdName = '';
  private destroyed = false;

  constructor(
    private readonly daemonEnv: NodeJS.ProcessEnv,
    private readonly reconcileInterval: string,
    private readonly settleMs: number,
    private readonly largest: number,
  ) {}

  get subnetFile(): string {
    return join(this.dir, 'run', 'subnet.env');
  }

  async setup(): Promise<void> {
    for (const ns of [this.node, this.ul, this.ref]) this.namespaces.push(await addNetns(ns));
    // One underlay per host namespace, each on a veth whose other end is in "ul".
    for (const [ns, end] of [[this.node, 'n0'], [this.ref, 'r0']] as const) {
      await ipn(this.ul, 'link', 'add', end, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
      await ipn(this.ul, 'link', 'set', end, 'up');
      await ipn(ns, 'addr', 'add', `${NODE_IP}/16`, 'dev', 'eth0');
      await ipn(ns, 'link', 'set', 'eth0', 'up');
    }
    const log = openSync(join(this.dir, 'etcd.log'), 'a');
    const peerUrl = 'http://127.0.0.1:2380';
    this.etcd = spawn(
      'ip',
      ['netns', 'exec', this.node, 'etcd', '--name', 'node', '--data-dir', join(this.dir, 'etcd'),
        '--listen-client-urls', ETCD_URL, '--advertise-client-urls', ETCD_URL,
        '--listen-peer-urls', peerUrl, '--initial-advertise-peer-urls', peerUrl, '--initial-cluster', `node=${peerUrl}`,
        // One transaction of 10 000 puts (~2 MB): above the default 128 ops and 1.5 MiB.
        '--max-txn-ops', '20000', '--max-request-bytes', String(32 << 20),
        '--quota-backend-bytes', String(8 * 1024 ** 3), '--log-level', 'warn'],
      { stdio: ['ignore', log, log] },
    );
    closeSync(log);
    this.agent = new AgentClient(
      spawn('ip', ['netns', 'exec', this.node, process.execPath, '--import', 'tsx', SELF, '--agent'], {
        cwd: ROOT,
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      }),
    );
    const etcd = this.etcd;
    const etcdDied = new Promise<never>((_, reject) =>
      etcd.once('exit', (code) =>
        reject(new BenchError(`etcd exited (${code}): ${readFileSync(join(this.dir, 'etcd.log'), 'utf8').slice(-2000)}`)),
      ),
    );
    etcdDied.catch(() => undefined); // only awaited during setup
    await Promise.race([this.agent.call('setup', { config: CONFIG }), etcdDied]);
  }

  get pids(): Record<'weftd' | 'etcd' | 'agent', number | undefined> {
    return { weftd: this.weftd?.proc.pid, etcd: this.etcd?.pid, agent: this.agent?.proc.pid };
  }

  private get a(): AgentClient {
    if (!this.agent) throw new BenchError('agent not started');
    return this.agent;
  }

  startWeftd(tag: string): WeftdProcess {
    const args = [
      '--etcd-endpoints', ETCD_URL, '--iface', 'eth0', '--subnet-file', this.subnetFile,
      '--healthz-ip', '127.0.0.1', '--healthz-port', String(HEALTHZ_PORT),
      '--reconcile-interval', this.reconcileInterval, '--log-format', 'json', '--log-level', 'debug',
    ];
    this.weftdSeq++;
    this.weftdName = `weftd-${this.weftdSeq}-${tag}`;
    // --cpu-prof writes the profile when weftd exits after SIGTERM.
    const prof = cpuProfDir ? ['--cpu-prof', `--cpu-prof-dir=${cpuProfDir}`, `--cpu-prof-name=${this.weftdName}.cpuprofile`] : [];
    this.weftd = WeftdProcess.start(args, this.daemonEnv, this.node, prof);
    return this.weftd;
  }

  async stopWeftd(): Promise<void> {
    const w = this.weftd;
    if (!w) return;
    this.weftd = null;
    const timer = setTimeout(() => w.kill(), 15_000);
    await w.stop();
    clearTimeout(timer);
    if (args['keep-logs']) {
      mkdirSync(args['keep-logs'], { recursive: true });
      writeFileSync(join(args['keep-logs'], `${this.weftdName}.log`), w.output);
    }
  }

  /** No leases, no flannel.1 (its neighbours, FDB entries, nexthops and routes go with it), no subnet.env. */
  private async resetNode(): Promise<void> {
    await this.a.call('clear', {});
    await ipn(this.node, 'link', 'del', VXLAN).catch(() => undefined);
    rmSync(this.subnetFile, { force: true });
    const c = await this.a.call('counts', {});
    if (c.routes !== 0 || c.neighbours !== 0 || c.fdb !== 0) throw new BenchError(`node namespace not clean: ${JSON.stringify(c)}`);
  }

  private async afterConvergence(w: WeftdProcess, n: number, tag: string): Promise<{ metrics: WeftMetrics; applied: number }> {
    // weftd logs the batch after apply() returns; the poller may have seen the kernel first.
    const applied = await waitFor(
      () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return logTime(w.output, (l) => l.msg === 'applied lease events' && l.peers === n);
      },
      { timeoutMs: 30_000, what: `weftd to log the applied batch (${tag})` },
    );
    const v = await this.a.call('verify', { n });
    if (v.total > 0) throw new BenchError(`${tag}: kernel state wrong (${v.total} problems): ${v.problems.join('; ')}`);
    return { metrics: await this.a.call('metrics', {}), applied };
  }

  /** Memory once weftd has sat at N peers for a while (a periodic reconcile included by default). */
  private async settle(w: WeftdProcess, n: number): Promise<Settled | null> {
    if (this.settleMs <= 0 || n !== this.largest) return null;
    const before = await this.a.call('metrics', {});
    await sleep(this.settleMs);
    if (!w.running) throw new BenchError(`weftd exited while settling:\n${w.output.slice(-4000)}`);
    const after = await this.a.call('metrics', {});
    return { ...rssOf(w.proc.pid!), reconciles: after.reconciles - before.reconciles, heap: heapText(after) };
  }

  /** Waits for the agent's convergence answer, failing at once when weftd dies. */
  private async whileRunning<T>(w: WeftdProcess, p: Promise<T>): Promise<T> {
    return Promise.race([
      p,
      w.exited.then((e) => {
        throw new BenchError(`weftd exited (${e.code ?? e.signal}) before convergence:\n${w.output.slice(-4000)}`);
      }),
    ]);
  }

  /** (a): N leases in etcd, then weftd starts. */
  async scenarioStart(n: number, pollMs: number): Promise<StartResult> {
    await this.stopWeftd();
    await this.resetNode();
    await this.a.call('write', { n });
    const clock = await this.a.clockOffset();
    const cpu = new CpuMeter(() => this.pids);
    const converged = this.a.call('converge', { n, burst: false, pollMs, timeoutMs: CONVERGE_TIMEOUT_MS, trace: args['trace-polls'] });
    const t0 = wall();
    const w = this.startWeftd(`start-${n}`);
    const res = await this.whileRunning(w, converged);
    const usage = cpu.stop();
    const rss = rssOf(w.proc.pid!);
    const { metrics, applied } = await this.afterConvergence(w, n, `start N=${n}`);
    const settled = await this.settle(w, n);
    const done = res.doneAt - clock.offset;
    const at = (msg: string) => logTime(w.output, (l) => l.msg === msg);
    const acquired = at('acquired lease');
    if (acquired === null) throw new BenchError('weftd did not log "acquired lease"');
    const phase = (t: number | null) => (t === null ? NaN : t - t0);
    const progMs = metrics.programmingSeconds * 1000;
    return {
      totalMs: done - t0,
      fromLeaseMs: done - acquired,
      windowMs: res.lastMissAt === null ? done - t0 : res.doneAt - res.lastMissAt,
      phases: {
        'spawn → "starting weftd" (node start, modules, health server)': phase(at('starting weftd')),
        '→ "using interface" (config read, interface)': phase(at('using interface')),
        '→ "acquired lease" (own-lease listing, device, listing + grant + txn)': phase(acquired),
        '→ programming starts (subnet.env, listing for the watch, decode, batch)': phase(applied - progMs),
        '→ programming done ("applied lease events")': phase(applied),
        '→ all N routes seen by the poller': res.routesAt - clock.offset - t0,
        '→ all entries seen in the kernel by the poller': done - t0,
        'programming (backend apply: dump, diff, netlink), ms': progMs,
        'batches applied': metrics.batches,
      },
      pollMaxMs: res.pollMaxMs,
      cpu: usage,
      rss,
      settled,
      heap: heapText(metrics),
      clockRttMs: clock.rtt,
    };
  }

  /** (b): weftd idle with 0 peers, then N leases in one transaction. */
  async scenarioBurst(n: number, pollMs: number): Promise<BurstResult> {
    await this.stopWeftd();
    await this.resetNode();
    // The stopped weftd's watches are gone, so the count below is the new one's.
    await this.a.call('watchers', { min: 0, max: 0, timeoutMs: 30_000 });
    const w = this.startWeftd(`burst-${n}`);
    await waitFor(
      () => {
        if (!w.running) throw new WaitAbort(`weftd exited:\n${w.output.slice(-4000)}`);
        return logTime(w.output, (l) => l.msg === 'acquired lease') !== null && existsSync(this.subnetFile);
      },
      { timeoutMs: 60_000, what: 'weftd to acquire its lease' },
    );
    // Its own-key watch and the lease watch: from here on the burst arrives as watch events.
    await this.a.call('watchers', { min: 2, max: 1e9, timeoutMs: 30_000 });
    const before = await this.a.call('metrics', {});
    const idle = rssOf(w.proc.pid!);
    const cpu = new CpuMeter(() => this.pids);
    const res = await this.whileRunning(w, this.a.call('converge', { n, burst: true, pollMs, timeoutMs: CONVERGE_TIMEOUT_MS, trace: args['trace-polls'] }));
    const usage = cpu.stop();
    const rss = rssOf(w.proc.pid!);
    const { metrics, applied } = await this.afterConvergence(w, n, `burst N=${n}`);
    const settled = await this.settle(w, n);
    const clock = await this.a.clockOffset();
    const t0 = res.startAt;
    const progMs = (metrics.programmingSeconds - before.programmingSeconds) * 1000;
    const appliedAgent = applied + clock.offset;
    return {
      totalMs: res.doneAt - t0,
      windowMs: res.lastMissAt === null ? res.doneAt - t0 : res.doneAt - res.lastMissAt,
      phases: {
        'txn sent → etcd answered': res.write ? res.write.commitAt - t0 : NaN,
        '→ programming starts (watch event, decode, batch)': appliedAgent - progMs - t0,
        '→ programming done ("applied lease events")': appliedAgent - t0,
        '→ all N routes seen by the poller': res.routesAt - t0,
        '→ all entries seen in the kernel by the poller': res.doneAt - t0,
        'programming (backend apply: dump, diff, netlink), ms': progMs,
        'batches applied': metrics.batches - before.batches,
      },
      pollMaxMs: res.pollMaxMs,
      cpu: usage,
      rss,
      settled,
      heap: heapText(metrics),
      idle,
      writeBytes: res.write?.bytes ?? 0,
    };
  }

  private batchFiles(n: number): { plain: string; nexthops: string; fdb: string } {
    const plain = join(this.dir, `ref-${n}-plain.batch`);
    if (existsSync(plain)) return { plain, nexthops: join(this.dir, `ref-${n}-nh.batch`), fdb: join(this.dir, `ref-${n}-fdb.batch`) };
    const ps = peers(n);
    const neigh = ps.map((p) => `neigh replace ${p.subnet.ip.toString()} lladdr ${p.mac} dev ${VXLAN} nud permanent\n`).join('');
    writeFileSync(
      plain,
      neigh + ps.map((p) => `route replace ${p.subnet.toString()} via ${p.subnet.ip.toString()} dev ${VXLAN} onlink proto ${WEFT_ROUTE_PROTOCOL}\n`).join(''),
    );
    const nexthops = join(this.dir, `ref-${n}-nh.batch`);
    writeFileSync(
      nexthops,
      neigh +
        ps.map((p, i) => `nexthop replace id ${i + 1} via ${p.subnet.ip.toString()} dev ${VXLAN} onlink\n`).join('') +
        ps.map((p, i) => `route replace ${p.subnet.toString()} nhid ${i + 1} proto ${WEFT_ROUTE_PROTOCOL}\n`).join(''),
    );
    const fdb = join(this.dir, `ref-${n}-fdb.batch`);
    writeFileSync(fdb, ps.map((p) => `fdb replace ${p.mac} dev ${VXLAN} dst ${p.pub.toString()} self permanent\n`).join(''));
    return { plain, nexthops, fdb };
  }

  /** iproute2 on a fresh flannel.1 in the reference namespace, spawn to exit. */
  async reference(n: number, form: 'plain' | 'nexthops'): Promise<RefResult> {
    const files = this.batchFiles(n);
    await ipn(this.ref, 'link', 'del', VXLAN).catch(() => undefined);
    await ipn(this.ref, 'link', 'add', VXLAN, ...VXLAN_ARGS);
    await ipn(this.ref, 'link', 'set', VXLAN, 'mtu', '1450', 'up');
    const cpu = new CpuMeter(() => this.pids);
    const t0 = wall();
    await run('ip', ['-n', this.ref, '-batch', form === 'plain' ? files.plain : files.nexthops]);
    const t1 = wall();
    await run('bridge', ['-n', this.ref, '-batch', files.fdb]);
    const t2 = wall();
    const usage = cpu.stop();
    await this.checkReference(n, form);
    return { ms: t2 - t0, ipMs: t1 - t0, bridgeMs: t2 - t1, cpu: usage };
  }

  private async checkReference(n: number, form: 'plain' | 'nexthops'): Promise<void> {
    const count = async (...a: string[]) => (JSON.parse(await sh(a[0]!, ['-n', this.ref, '-j', ...a.slice(1)])) as unknown[]).length;
    const routes = await count('ip', 'route', 'show', 'proto', String(WEFT_ROUTE_PROTOCOL));
    const neigh = await count('ip', 'neigh', 'show', 'dev', VXLAN, 'nud', 'permanent');
    const fdb = (JSON.parse(await sh('bridge', ['-n', this.ref, '-j', 'fdb', 'show', 'dev', VXLAN])) as Array<{ dst?: string }>).filter(
      (f) => f.dst !== undefined,
    ).length;
    const nh = form === 'nexthops' ? await count('ip', 'nexthop', 'show', 'dev', VXLAN) : n;
    if (routes !== n || neigh !== n || fdb !== n || nh !== n) {
      throw new BenchError(`reference (${form}) N=${n}: ${routes} routes, ${neigh} neighbours, ${fdb} FDB entries, ${nh} nexthops`);
    }
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    await this.stopWeftd().catch(() => undefined);
    const stop = async (p: ChildProcess | undefined | null) => {
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((resolve) => p.once('exit', resolve));
      p.kill('SIGTERM');
      const timer = setTimeout(() => p.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    };
    await stop(this.agent?.proc);
    await stop(this.etcd);
    for (const ns of this.namespaces) await delNetns(ns);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// Reporting

const median = (xs: readonly number[]): number => {
  const s = [...xs].filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const f0 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(0));
const f1 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(1));
const f2 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(2));
const cpuText = (c: CpuSplit): string =>
  `weftd ${f0(c.weftd)}, etcd ${f0(c.etcd)}, poller/writer ${f0(c.agent)}, bench+ip/bridge ${f0(c.bench)}, rest of machine ${f0(c.rest)} ms CPU in ${f0(c.wallMs)} ms`;

interface SizeResults {
  start: StartResult[];
  burst: BurstResult[];
  ref: RefResult[];
  refNh: RefResult[];
}

function printTable(header: string[], rows: string[][]): void {
  console.log(`| ${header.join(' | ')} |`);
  console.log(`|${header.map(() => '---').join('|')}|`);
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
}

async function machineFacts(daemon: string): Promise<void> {
  const cpu = cpus();
  const tool = async (cmd: string, a: string[]) => (await sh(cmd, a).catch((e: Error) => e.message)).split('\n')[0]!.trim();
  const [ipv, etcdv, kernel] = await Promise.all([tool('ip', ['-V']), tool('etcd', ['--version']), tool('uname', ['-r'])]);
  const others = existsSync('/var/run/netns') ? readdirSync('/var/run/netns').filter((n) => !n.startsWith(nsPrefix('cv'))).length : 0;
  console.log(`machine: ${cpu.length} × ${cpu[0]?.model ?? '?'}, ${(totalmem() / 1024 ** 3).toFixed(1)} GiB, kernel ${kernel}`);
  console.log(`software: node ${process.version}, ${etcdv}, ${ipv}; weftd ${daemon}`);
  console.log(`load average at start: ${loadavg()}; other network namespaces present (other tests running?): ${others}`);
}

const loadavg = (): string => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

/** The compiled daemon must not be older than its sources: the bench would time stale code. */
function checkCompiled(): string {
  const stale: string[] = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts')) {
        const js = join(ROOT, 'dist', relative(ROOT, p).replace(/\.ts$/, '.js'));
        if (!existsSync(js) || statSync(js).mtimeMs < statSync(p).mtimeMs) stale.push(relative(ROOT, p));
      }
    }
  };
  walk(join(ROOT, 'src'));
  if (stale.length > 0) {
    throw new BenchError(`dist/ is missing or older than ${stale.slice(0, 3).join(', ')}${stale.length > 3 ? ` and ${stale.length - 3} more` : ''}: run \`npm run build\`, or pass --daemon source`);
  }
  return `compiled (dist/, built ${statSync(join(ROOT, 'dist/src/cli/weftd.js')).mtime.toISOString()})`;
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchError('run as root (network namespaces)');
  const sizes = args.peers.split(',').map(Number);
  // One transaction holds all N puts (etcd runs with --max-txn-ops 20000), and weftd receives them
  // as one watch response of ~200 bytes per lease, under gRPC's default 4 MiB message limit.
  if (sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 15_000)) throw new BenchError('--peers: sizes between 1 and 15000');
  const runs = Number(args.runs);
  const pollMs = Number(args['poll-ms']);
  if (args.daemon !== 'compiled' && args.daemon !== 'source') throw new BenchError('--daemon: compiled or source');
  const daemon = args.daemon === 'compiled' ? checkCompiled() : 'from source (tsx)';
  const daemonEnv: NodeJS.ProcessEnv = { WEFT_FROM_SOURCE: args.daemon === 'source' ? '1' : '' };
  if (cpuProfDir) mkdirSync(cpuProfDir, { recursive: true });
  CLK_TCK = Number((await sh('getconf', ['CLK_TCK'])).trim()) || 100;
  await machineFacts(daemon);

  const bench = new Bench(daemonEnv, args['reconcile-interval'], Number(args['settle-ms']), Math.max(...sizes));
  const onSignal = (sig: NodeJS.Signals) => {
    interrupted = true;
    console.error(`\n${sig}: cleaning up`);
    void bench.destroy().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);

  const results = new Map<number, SizeResults>(sizes.map((n) => [n, { start: [], burst: [], ref: [], refNh: [] }]));
  const began = wall();
  try {
    await bench.setup();
    console.log(
      `runs ${runs}, peers ${sizes.join(', ')}, poll every ${pollMs} ms + dump time, weftd --reconcile-interval ${args['reconcile-interval']}\n`,
    );
    for (let r = 1; r <= runs; r++) {
      for (const n of sizes) {
        const res = results.get(n)!;
        const ref = await bench.reference(n, 'plain');
        res.ref.push(ref);
        const refNh = args['no-nexthop-ref'] ? null : await bench.reference(n, 'nexthops');
        if (refNh) res.refNh.push(refNh);
        const a = await bench.scenarioStart(n, pollMs);
        res.start.push(a);
        const b = await bench.scenarioBurst(n, pollMs);
        res.burst.push(b);
        console.log(
          `run ${r} N=${n}: iproute2 ${f0(ref.ms)} ms${refNh ? ` (nexthop form ${f0(refNh.ms)} ms)` : ''}` +
            ` | (a) start ${f0(a.totalMs)} ms, from "acquired lease" ${f0(a.fromLeaseMs)} ms → ratios ${f2(a.totalMs / ref.ms)}, ${f2(a.fromLeaseMs / ref.ms)}` +
            ` | (b) burst ${f0(b.totalMs)} ms → ratio ${f2(b.totalMs / ref.ms)}` +
            ` | RSS ${f0(a.rss.rssMB)}/${f0(b.rss.rssMB)} MB (peak ${f0(Math.max(a.rss.hwmMB, b.rss.hwmMB))} MB)`,
        );
      }
    }
    await bench.stopWeftd();
  } finally {
    await bench.destroy();
  }

  console.log(`\nfinished in ${f0((wall() - began) / 1000)} s\n`);
  const runCols = Array.from({ length: runs }, (_, i) => `run ${i + 1}`);
  console.log('## Times (ms) and ratios weft / iproute2 (same run)\n');
  const rows: string[][] = [];
  for (const [n, res] of results) {
    const ref = res.ref.map((x) => x.ms);
    const line = (what: string, xs: number[], fmt = f0) => rows.push([String(n), what, ...xs.map(fmt), fmt(median(xs))]);
    line('iproute2: ip -batch + bridge -batch (plain routes)', ref);
    rows.push([String(n), 'iproute2 split: ip -batch (neigh + routes) / bridge -batch (fdb)', ...res.ref.map((x) => `${f0(x.ipMs)} / ${f0(x.bridgeMs)}`), '']);
    if (res.refNh.length) line('iproute2, nexthop form (as weft programs)', res.refNh.map((x) => x.ms));
    line('weft (a) start: spawn → all in kernel', res.start.map((x) => x.totalMs));
    line('weft (a) start: "acquired lease" → all in kernel', res.start.map((x) => x.fromLeaseMs));
    line('weft (b) burst: txn → all in kernel', res.burst.map((x) => x.totalMs));
    line('ratio (a) spawn / iproute2', res.start.map((x, i) => x.totalMs / ref[i]!), f2);
    line('ratio (a) "acquired lease" / iproute2', res.start.map((x, i) => x.fromLeaseMs / ref[i]!), f2);
    line('ratio (b) burst / iproute2', res.burst.map((x, i) => x.totalMs / ref[i]!), f2);
    if (res.refNh.length) {
      const nh = res.refNh.map((x) => x.ms);
      line('ratio (a) "acquired lease" / iproute2 nexthop form', res.start.map((x, i) => x.fromLeaseMs / nh[i]!), f2);
      line('ratio (b) burst / iproute2 nexthop form', res.burst.map((x, i) => x.totalMs / nh[i]!), f2);
    }
    line('poll window (a): convergence within the last … ms', res.start.map((x) => x.windowMs), f1);
    line('poll window (b)', res.burst.map((x) => x.windowMs), f1);
    line('CPU of the rest of the machine during iproute2 (ms; other work disturbs)', res.ref.map((x) => x.cpu.rest));
    line('… during (a)', res.start.map((x) => x.cpu.rest));
    line('… during (b)', res.burst.map((x) => x.cpu.rest));
    line('longest poll cycle (a)', res.start.map((x) => x.pollMaxMs), f1);
    line('longest poll cycle (b)', res.burst.map((x) => x.pollMaxMs), f1);
  }
  printTable(['N', 'what', ...runCols, 'median'], rows);

  console.log('\n## weftd memory after convergence (MB)\n');
  const mem: string[][] = [];
  for (const [n, res] of results) {
    mem.push([String(n), '(a) VmRSS / VmHWM', ...res.start.map((x) => `${f0(x.rss.rssMB)} / ${f0(x.rss.hwmMB)}`)]);
    mem.push([String(n), '(b) VmRSS / VmHWM', ...res.burst.map((x) => `${f0(x.rss.rssMB)} / ${f0(x.rss.hwmMB)}`)]);
    mem.push([String(n), '(a) V8 heap used / total + external', ...res.start.map((x) => x.heap)]);
    mem.push([String(n), '(b) V8 heap used / total + external', ...res.burst.map((x) => x.heap)]);
    mem.push([String(n), '(b) idle with 0 peers, before the burst: VmRSS', ...res.burst.map((x) => f0(x.idle.rssMB))]);
    const settled = (x: { settled: Settled | null }) => (x.settled ? `${f0(x.settled.rssMB)} / ${f0(x.settled.hwmMB)} (${x.settled.reconciles} reconciles)` : '–');
    if (res.start.some((x) => x.settled)) {
      mem.push([String(n), `(a) ${f0(Number(args['settle-ms']) / 1000)} s later: VmRSS / VmHWM`, ...res.start.map(settled)]);
      mem.push([String(n), `(b) ${f0(Number(args['settle-ms']) / 1000)} s later: VmRSS / VmHWM`, ...res.burst.map(settled)]);
      const heap = (x: { settled: Settled | null }) => x.settled?.heap ?? '–';
      mem.push([String(n), '(a) then: V8 heap used / total + external', ...res.start.map(heap)]);
      mem.push([String(n), '(b) then: V8 heap used / total + external', ...res.burst.map(heap)]);
    }
  }
  printTable(['N', 'what', ...runCols], mem);

  console.log('\n## Where the time goes (ms from the start of the measurement; medians over runs)\n');
  const ph: string[][] = [];
  for (const [n, res] of results) {
    for (const [label, list] of [['(a)', res.start], ['(b)', res.burst]] as const) {
      const keys = Object.keys(list[0]?.phases ?? {});
      for (const k of keys) ph.push([String(n), label, k, f0(median(list.map((x) => x.phases[k]!)))]);
    }
  }
  printTable(['N', 'scenario', 'phase', 'ms'], ph);

  console.log('\n## CPU during each measurement (last run)\n');
  for (const [n, res] of results) {
    const last = (xs: { cpu: CpuSplit }[]) => xs[xs.length - 1]?.cpu;
    const ref = last(res.ref);
    const a = last(res.start);
    const b = last(res.burst);
    if (ref) console.log(`N=${n} iproute2: ${cpuText(ref)}`);
    if (a) console.log(`N=${n} (a):       ${cpuText(a)}`);
    if (b) console.log(`N=${n} (b):       ${cpuText(b)}; lease values ${f0((res.burst.at(-1)?.writeBytes ?? 0) / 1024)} KiB`);
  }
  console.log(`\nload average at end: ${loadavg()}`);
  console.log('targets: ratio ≤ 1.0 (weft no slower than iproute2 batch mode), weftd RSS < 150 MB at 10 000 peers');
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
