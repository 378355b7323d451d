// Drift seen at once: the kernel's own notifications of routes, nexthops, neighbours and FDB
// entries, read through `ip monitor` and `bridge monitor fdb` (one line per event). The monitors
// run as child processes on purpose: a netlink subscriber socket that falls behind overflows, and
// the `netlink` library aborts the whole process on that (ENOBUFS); iproute2 reports it and goes
// on, and a lost notification only means "run a full pass".
//
// Each notification becomes an observation of one entry (present or deleted, with what the
// comparison needs); the latest observation per entry is handed over after a short quiet time, and
// the backend compares it with its model in its own queue, after any batch in flight — so the echo
// of weft's own operations compares equal and costs nothing.
import { streamLines, type LineStream } from '../../util/exec.js';
import { IPAddr, IPNet } from '../../util/ip.js';
import type { Logger } from '../../util/log.js';

export type Observation =
  | {
      readonly kind: 'route';
      readonly key: string;
      readonly present: boolean;
      readonly dst: IPNet;
      readonly nhid: number | null;
      readonly gateway: IPAddr | null;
      readonly dev: string | null;
      readonly proto: string | null;
      readonly mainTable: boolean;
    }
  | { readonly kind: 'neigh'; readonly key: string; readonly present: boolean; readonly ip: IPAddr; readonly dev: string; readonly mac: string | null; readonly permanent: boolean }
  | { readonly kind: 'fdb'; readonly key: string; readonly present: boolean; readonly mac: string; readonly dev: string; readonly dst: IPAddr; readonly permanent: boolean }
  | { readonly kind: 'nexthop'; readonly key: string; readonly present: boolean; readonly id: number; readonly proto: string | null };

const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;

function words(line: string): { deleted: boolean; w: string[] } {
  const w = line.trim().split(/\s+/);
  const deleted = w[0] === 'Deleted';
  return { deleted, w: deleted ? w.slice(1) : w };
}

function after(w: readonly string[], key: string): string | null {
  const i = w.indexOf(key);
  return i >= 0 && i + 1 < w.length ? w[i + 1]! : null;
}

/**
 * One line of `ip -o monitor route nexthop neigh` (families filtered by the caller's -4/-6), or
 * null for a line that is none of weft's kinds (other families' entries, multicast routes, …).
 * `devIndex` maps device names to the ifindex the model keys neighbours by.
 */
export function parseIpMonitorLine(line: string, devIndex: (dev: string) => number | null): Observation | null {
  const { deleted, w } = words(line);
  if (w.length === 0 || w[0] === '') return null;
  if (w[0] === 'id') {
    const id = Number(w[1]);
    if (!Number.isSafeInteger(id)) return null;
    return { kind: 'nexthop', key: String(id), present: !deleted, id, proto: after(w, 'proto') };
  }
  // Routes start with their destination: a prefix, `default`, or a route type (local, broadcast, …).
  const dst = IPNet.tryParse(w[0]!.includes('/') ? w[0]! : `${w[0]!}/${w[0]!.includes(':') ? 128 : 32}`);
  if (!dst) return null;
  if (w.includes('lladdr') || w.includes('FAILED') || w.includes('INCOMPLETE') || /^[A-Z]+$/.test(w[w.length - 1] ?? '')) {
    // A neighbour: `IP dev DEV [lladdr MAC] STATE…`.
    const dev = after(w, 'dev');
    if (!dev || w[0]!.includes('/')) return null;
    const ifindex = devIndex(dev);
    if (ifindex === null) return null;
    const mac = after(w, 'lladdr');
    return { kind: 'neigh', key: `${ifindex} ${dst.ip.toString()}`, present: !deleted, ip: dst.ip, dev, mac: mac && MAC.test(mac) ? mac : null, permanent: w.includes('PERMANENT') };
  }
  const nh = after(w, 'nhid');
  const via = after(w, 'via');
  const table = after(w, 'table');
  return {
    kind: 'route',
    key: dst.toString(),
    present: !deleted,
    dst,
    nhid: nh !== null && Number.isSafeInteger(Number(nh)) ? Number(nh) : null,
    gateway: via ? IPAddr.tryParse(via) : null,
    dev: after(w, 'dev'),
    proto: after(w, 'proto'),
    mainTable: table === null || table === 'main',
  };
}

/** One line of `bridge monitor fdb`: `[Deleted] MAC dev DEV dst IP self permanent`, or null. */
export function parseFdbMonitorLine(line: string, devIndex: (dev: string) => number | null): Observation | null {
  const { deleted, w } = words(line);
  const mac = w[0];
  const dev = after(w, 'dev');
  const dstText = after(w, 'dst');
  if (!mac || !MAC.test(mac) || !dev || !dstText) return null;
  const ifindex = devIndex(dev);
  const dst = IPAddr.tryParse(dstText);
  if (ifindex === null || !dst) return null;
  return { kind: 'fdb', key: `${ifindex} ${mac} ${dst.toString()}`, present: !deleted, mac, dev, dst, permanent: w.includes('permanent') };
}

export interface DriftWatchOptions {
  /** Which families' neighbours to watch. */
  readonly families: ReadonlyArray<4 | 6>;
  /** Whether to watch FDB entries (vxlan). */
  readonly fdb: boolean;
  readonly devIndex: (dev: string) => number | null;
  /** Observations, the latest per entry, after a quiet time. */
  readonly onDrift: (observations: Observation[]) => void;
  /** Notifications were lost (overflow) or a monitor died: only a full pass can tell what changed. */
  readonly onLost: (why: string) => void;
  readonly logger: Logger;
  /** Quiet time before observations are handed over; default 20 ms. */
  readonly settleMs?: number;
  /**
   * True while a full pass is due or running: its own read of the kernel covers what happened,
   * so notifications are dropped unread (a cold start echoes 30 000 of weft's own entries).
   */
  readonly ignoring?: () => boolean;
}

/** Repairs per entry within a window after which weft stops fighting for it until the timer. */
const FIGHT_LIMIT = 5;
const FIGHT_WINDOW_MS = 10_000;

export class DriftWatch {
  private readonly monitors: LineStream[] = [];
  private pending = new Map<string, Observation>();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private readonly repairs = new Map<string, number[]>();
  private readonly givenUp = new Set<string>();

  constructor(private readonly opts: DriftWatchOptions) {}

  start(): void {
    const { devIndex } = this.opts;
    const ip = (args: string[]) => this.monitor('ip', ['-o', ...args], (line) => parseIpMonitorLine(line, devIndex));
    ip(['monitor', 'route', 'nexthop']);
    for (const f of this.opts.families) ip([`-${f}`, 'monitor', 'neigh']);
    if (this.opts.fdb) this.monitor('bridge', ['monitor', 'fdb'], (line) => parseFdbMonitorLine(line, devIndex));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await Promise.all(this.monitors.map((m) => m.stop()));
  }

  /**
   * The backend repaired this entry: after FIGHT_LIMIT repairs within FIGHT_WINDOW_MS another tool
   * is fighting weft over it, and it is left to the periodic full pass. Returns false then.
   */
  allowRepair(kind: string, key: string, now = Date.now()): boolean {
    const id = `${kind} ${key}`;
    if (this.givenUp.has(id)) return false;
    const times = (this.repairs.get(id) ?? []).filter((t) => now - t < FIGHT_WINDOW_MS);
    times.push(now);
    this.repairs.set(id, times);
    if (times.length <= FIGHT_LIMIT) return true;
    this.givenUp.add(id);
    this.opts.logger.warn('another tool keeps changing an entry weft owns; leaving it to the periodic reconcile', { kind, key, repairs: times.length });
    return false;
  }

  /** The periodic full pass forgives: entries given up on are watched again. */
  forgive(): void {
    this.givenUp.clear();
    this.repairs.clear();
  }

  private monitor(command: string, args: string[], parse: (line: string) => Observation | null): void {
    const stream = streamLines(command, args, {
      onLine: (line) => {
        if (this.opts.ignoring?.()) return;
        const obs = parse(line);
        if (obs) this.observe(obs);
      },
      onErrorLine: (line) => {
        // iproute2 says so when the kernel dropped notifications (ENOBUFS) and goes on.
        if (/receive error|No buffer space/i.test(line)) this.opts.onLost(`${command} monitor: ${line.trim()}`);
      },
    });
    this.monitors.push(stream);
    void stream.exited.then((code) => {
      if (this.stopped) return;
      this.opts.logger.warn('a kernel monitor ended; restarting it', { command: `${command} ${args.join(' ')}`, code });
      this.monitors.splice(this.monitors.indexOf(stream), 1);
      this.opts.onLost(`${command} monitor ended`);
      setTimeout(() => {
        if (!this.stopped) this.monitor(command, args, parse);
      }, 1000).unref();
    });
  }

  private observe(obs: Observation): void {
    this.pending.set(`${obs.kind} ${obs.key}`, obs);
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      const batch = [...this.pending.values()];
      this.pending = new Map();
      if (!this.stopped && batch.length > 0) this.opts.onDrift(batch);
    }, this.opts.settleMs ?? 20);
  }
}
