// What the demo proves, and how it shows it: tiny TCP servers and clients (plain `node -e`, no
// extra packages), pings between pods, weftd's readiness read from its own HTTP endpoint, and
// the reachability grid.
import { readFile } from 'node:fs/promises';
import { waitFor, WaitAbort } from '../test/helpers/wait.js';
import type { Attached } from './runtime.js';
import { alive, mapLimit, nsRun, spawnInNs } from './sys.js';

/** A TCP server answering every connection with "<label> saw <peer address>" and closing. */
const SERVER = `
const net = require('net');
const [label, host, port] = process.argv.slice(1);
net.createServer((s) => { s.on('error', () => {}); s.end(label + ' saw ' + s.remoteAddress + '\\n'); })
  .listen(Number(port), host, () => console.log('listening on ' + host + ':' + port));
`;

/** Connects, prints what the server said; "ERR <why>" when there is no answer. Always exits 0. */
const CLIENT = `
const net = require('net');
const [host, port] = process.argv.slice(1);
const done = (text) => { process.stdout.write(text.trim() + '\\n'); process.exit(0); };
setTimeout(() => done('ERR no answer within 3 s'), 3000);
const s = net.connect(Number(port), host);
let d = '';
s.on('data', (c) => (d += c));
s.on('end', () => done(d === '' ? 'ERR connection closed without an answer' : d));
s.on('error', (e) => done('ERR ' + (e.code || e.message)));
`;

/** weftd's /readyz status and its weft_peers_programmed gauge, fetched inside the node's namespace. */
const READINESS = `
const get = (p) => fetch('http://127.0.0.1:' + process.argv[1] + p).then(async (r) => [r.status, await r.text()]);
Promise.all([get('/readyz'), get('/metrics')]).then(
  ([[status], [, metrics]]) => {
    const m = /^weft_peers_programmed (\\S+)$/m.exec(metrics);
    console.log(JSON.stringify({ ready: status === 200, peers: m ? Number(m[1]) : -1 }));
  },
  (e) => console.log(JSON.stringify({ ready: false, peers: -1, error: String((e.cause && e.cause.code) || e) })),
);
`;

/** weftd's weft_cni_requests_total samples as [plugin, verb, result, value], fetched inside the node's namespace. */
const CNI_REQUESTS = `
fetch('http://127.0.0.1:' + process.argv[1] + '/metrics').then((r) => r.text()).then(
  (metrics) => {
    const rows = [];
    const re = /^weft_cni_requests_total\\{([^}]*)\\} (\\S+)$/gm;
    for (let m; (m = re.exec(metrics)); ) {
      const l = Object.fromEntries([...m[1].matchAll(/(\\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
      rows.push([l.plugin, l.verb, l.result, Number(m[2])]);
    }
    console.log(JSON.stringify({ rows }));
  },
  (e) => console.log(JSON.stringify({ error: String((e.cause && e.cause.code) || e) })),
);
`;

/** One sample of weft_cni_requests_total. */
export interface CniRequestCount {
  readonly plugin: string;
  readonly verb: string;
  readonly result: string;
  readonly value: number;
}

/** The CNI server's request counters of the weftd in `ns` (its health server on 127.0.0.1:port). */
export async function cniRequests(ns: string, port: number): Promise<CniRequestCount[]> {
  const r = JSON.parse(await nsRun(ns, process.execPath, ['-e', CNI_REQUESTS, String(port)])) as {
    rows?: [string, string, string, number][];
    error?: string;
  };
  if (r.error !== undefined || !r.rows) throw new Error(`GET /metrics from weftd in ${ns}: ${r.error ?? 'no answer'}`);
  return r.rows.map(([plugin, verb, result, value]) => ({ plugin, verb, result, value }));
}

export interface Readiness {
  readonly ready: boolean;
  readonly peers: number;
  readonly error?: string;
}

export async function readiness(ns: string, port: number): Promise<Readiness> {
  return JSON.parse(await nsRun(ns, process.execPath, ['-e', READINESS, String(port)])) as Readiness;
}

/** Starts a reply server inside `ns` and waits until it listens; returns its PID. */
export async function startServer(ns: string, label: string, host: string, port: number, logFile: string): Promise<number> {
  const pid = spawnInNs(ns, [process.execPath, '-e', SERVER, label, host, String(port)], logFile);
  await waitFor(
    async () => {
      const log = await readFile(logFile, 'utf8').catch(() => '');
      if (log.includes(`listening on ${host}:${port}`)) return true;
      if (!alive(pid)) throw new WaitAbort(`the server in ${ns} exited: ${log.trim() || 'no output'}`);
      return false;
    },
    { timeoutMs: 15_000, intervalMs: 50, what: `the TCP server in ${ns} to listen on ${host}:${port}` },
  );
  return pid;
}

/** What a TCP client inside `ns` gets from host:port: the server's line, or "ERR …". */
export async function connect(ns: string, host: string, port: number): Promise<string> {
  return (await nsRun(ns, process.execPath, ['-e', CLIENT, host, String(port)])).trim();
}

/** One echo request, up to `tries` times (a first packet may race an ARP or conntrack entry). */
export async function ping(ns: string, ip: string, tries = 3): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    const ok = await nsRun(ns, 'ping', ['-n', '-q', '-c', '1', '-W', '1', ip]).then(
      () => true,
      () => false,
    );
    if (ok) return true;
  }
  return false;
}

/** cells[i][j]: whether pod i reaches pod j; null on the diagonal. */
export type Matrix = (boolean | null)[][];

export async function reachability(pods: readonly Attached[]): Promise<Matrix> {
  const pairs = pods.flatMap((from, i) => pods.map((to, j) => ({ from, to, i, j }))).filter((p) => p.i !== p.j);
  const results = await mapLimit(pairs, 6, (p) => ping(p.from.pod.ns, p.to.ip));
  const cells: Matrix = pods.map((_p, i) => pods.map((_q, j) => (i === j ? null : false)));
  pairs.forEach((p, k) => (cells[p.i]![p.j] = results[k]!));
  return cells;
}

export const OK = '✔';
export const FAIL = '✘';
export const SELF = '·';

/**
 * The grid: one row per pinging pod (name, address), one column per pinged pod.
 *
 *   from \ to         n1-a  n1-b  n2-a
 *   n1-a 10.244.9.2    ·     ✔     ✔
 */
export function renderMatrix(pods: readonly { name: string; ip: string }[], cells: Matrix): string[] {
  const rowHead = pods.map((p) => `${p.name} ${p.ip}`);
  const first = Math.max('from \\ to'.length, ...rowHead.map((h) => h.length));
  const width = Math.max(...pods.map((p) => p.name.length));
  const col = (s: string) => s.padStart(Math.ceil((width + s.length) / 2)).padEnd(width);
  const lines = [`${'from \\ to'.padEnd(first)}  ${pods.map((p) => p.name.padEnd(width)).join('  ')}`.trimEnd()];
  pods.forEach((_p, i) => {
    const row = cells[i] ?? [];
    const marks = pods.map((_q, j) => col(row[j] === null ? SELF : row[j] ? OK : FAIL));
    lines.push(`${rowHead[i]!.padEnd(first)}  ${marks.join('  ')}`.trimEnd());
  });
  return lines;
}

/** "n1-a → n2-b" for every failed cell. */
export function failedPairs(pods: readonly { name: string }[], cells: Matrix): string[] {
  const out: string[] = [];
  cells.forEach((row, i) => row.forEach((c, j) => c === false && out.push(`${pods[i]!.name} → ${pods[j]!.name}`)));
  return out;
}
