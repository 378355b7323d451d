// `weft status`: this node's lease, backend, repairs and rule keeper, read from the running weftd's
// /status endpoint (served with --healthz-port) and shown as text or JSON.
import { STATUS_KIND, STATUS_VERSION, type CniServerStatus, type StatusSnapshot, type TimedError } from '../daemon/status.js';
import { terminalJson, terminalText } from '../render/terminal.js';
import { errorMessage } from '../util/errors.js';

export const DEFAULT_STATUS_ENDPOINT = 'http://127.0.0.1:8081';
const TIMEOUT_MS = 5000;

/** Nothing answered at the endpoint (refused, timed out, bad address). */
export class DaemonUnreachableError extends Error {
  constructor(
    readonly url: string,
    readonly reason: string,
  ) {
    super(`cannot reach weftd at ${url}: ${reason} (is weftd running here, with --healthz-port matching --endpoint?)`);
    this.name = 'DaemonUnreachableError';
  }
}

/** Something answered, but not with a status snapshot this weft understands. */
export class StatusResponseError extends Error {
  constructor(
    readonly url: string,
    reason: string,
  ) {
    super(`${url}: ${reason}`);
    this.name = 'StatusResponseError';
  }
}

export function statusUrl(endpoint: string, peers: boolean): string {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new DaemonUnreachableError(endpoint, 'not a URL (expected e.g. http://127.0.0.1:8081)');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new DaemonUnreachableError(endpoint, `unsupported scheme ${url.protocol}`);
  url.pathname = `${url.pathname.replace(/\/+$/, '')}/status`;
  if (peers) url.searchParams.set('peers', 'true');
  return url.toString();
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Checks the parts of the snapshot the renderer and `weft trace` rely on. */
export function parseStatus(doc: unknown, url: string): StatusSnapshot {
  if (!isRecord(doc) || doc.kind !== STATUS_KIND) throw new StatusResponseError(url, `not a ${STATUS_KIND} document`);
  if (doc.version !== STATUS_VERSION) {
    throw new StatusResponseError(url, `status version ${String(doc.version)}; this weft reads version ${STATUS_VERSION}`);
  }
  if (typeof doc.ready !== 'boolean' || typeof doc.time !== 'string' || !isRecord(doc.ipmasq)) {
    throw new StatusResponseError(url, 'status document lacks ready, time or ipmasq');
  }
  for (const key of ['lease', 'backend', 'network'] as const) {
    if (doc[key] !== null && !isRecord(doc[key])) throw new StatusResponseError(url, `status field ${key} is neither an object nor null`);
  }
  if (doc.peers !== undefined && !Array.isArray(doc.peers)) throw new StatusResponseError(url, 'status field peers is not a list');
  if (doc.cniServer !== undefined) {
    const c = doc.cniServer;
    if (!isRecord(c) || typeof c.phase !== 'string' || typeof c.socket !== 'string' || !isRecord(c.results) || !Array.isArray(c.lastErrors)) {
      throw new StatusResponseError(url, 'status field cniServer is not a CNI server status');
    }
  }
  return doc as unknown as StatusSnapshot;
}

export async function fetchStatus(endpoint: string, opts: { peers?: boolean; timeoutMs?: number } = {}): Promise<StatusSnapshot> {
  const url = statusUrl(endpoint, opts.peers ?? false);
  let res: Response;
  try {
    res = await fetch(url, { signal: AbortSignal.timeout(opts.timeoutMs ?? TIMEOUT_MS) });
  } catch (e) {
    const err = e as Error & { cause?: { code?: string; message?: string } };
    const reason = err.name === 'TimeoutError' ? `no answer within ${opts.timeoutMs ?? TIMEOUT_MS} ms` : (err.cause?.code ?? err.cause?.message ?? err.message);
    throw new DaemonUnreachableError(url, reason);
  }
  const body = await res.text();
  if (res.status === 404) throw new StatusResponseError(url, 'weftd answered 404: this weftd does not serve /status (too old?)');
  if (res.status !== 200) throw new StatusResponseError(url, `HTTP ${res.status}: ${body.trim().slice(0, 200)}`);
  let doc: unknown;
  try {
    doc = JSON.parse(body);
  } catch (e) {
    throw new StatusResponseError(url, `invalid JSON: ${errorMessage(e)}`);
  }
  return parseStatus(doc, url);
}

/** "3s", "2m05s", "4h07m", "2d03h". */
export function formatDuration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 3600) return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h${pad(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86_400)}d${pad(Math.floor((s % 86_400) / 3600))}h`;
}

function ago(iso: string | null, now: Date): string {
  if (!iso) return 'never';
  return `${formatDuration(now.getTime() - Date.parse(iso))} ago`;
}

function describeError(e: TimedError, now: Date): string {
  return `${e.message} (${ago(e.time, now)})`;
}

/**
 * The text form: one labelled line per aspect. `now` is the snapshot's own time, so output is
 * stable. Every line is escaped for the terminal: the labels are weft's, the values are the
 * daemon's and, through it, the store's and other nodes' (errors, backend type, addresses).
 */
export function renderStatus(s: StatusSnapshot): string {
  const now = new Date(s.time);
  const rows: Array<[string, string]> = [];
  rows.push(['weftd', `${s.weftVersion}, ${s.ready ? 'ready' : 'NOT READY'}`]);
  if (s.lease) {
    const subnets = [s.lease.subnet, s.lease.ipv6Subnet].filter((x): x is string => x !== null).join(' + ');
    const publicIPs = [s.lease.publicIP, s.lease.publicIPv6].filter((x): x is string => x !== null).join(', ');
    const expiry = s.lease.reservation
      ? 'reserved (no expiry)'
      : s.lease.expiration
        ? `expires ${s.lease.expiration} (in ${formatDuration(Date.parse(s.lease.expiration) - now.getTime())})`
        : 'expiry unknown';
    rows.push(['lease', `${subnets}, public IP ${publicIPs}, ${expiry}`]);
  } else {
    rows.push(['lease', 'none yet']);
  }
  if (s.network) {
    const nets = [s.network.network, s.network.ipv6Network].filter((x): x is string => x !== null).join(' + ');
    rows.push(['network', `${nets}, backend ${s.network.backendType}`]);
  }
  if (s.backend) {
    const b = s.backend;
    const every = b.reconcileInterval > 0 ? `every ${b.reconcileInterval}s` : 'periodic repair disabled';
    rows.push(['backend', `${b.type}: ${b.peersKnown} peers known, ${b.peersProgrammed} programmed, ${b.peersRejected} rejected`]);
    for (const r of b.rejectedPeers) rows.push(['  rejected', `${[r.subnet, r.ipv6Subnet].filter((x) => x !== null).join(' + ')} (public IP ${r.publicIP}): ${r.reason}: ${r.detail}, since ${ago(r.since, now)}`]);
    rows.push(['reconcile', `last apply ${ago(b.lastApply, now)}, last reconcile ${ago(b.lastReconcile, now)} (${every})`]);
    rows.push(['repairs', `added ${b.repairs.added}, changed ${b.repairs.changed}, removed ${b.repairs.removed}, devices rebuilt ${b.repairs.device}; ${b.failures} operations refused`]);
    if (b.lastError) rows.push(['backend err', describeError(b.lastError, now)]);
  } else {
    rows.push(['backend', 'not started yet']);
  }
  const m = s.ipmasq;
  const parts = [`masquerade ${m.masquerade ? 'on' : 'off'}`, `forward rules ${m.forwardRules ? 'on' : 'off'}`];
  if (m.mode) parts.push(m.mode);
  rows.push(['ipmasq', parts.join(', ')]);
  const resync = m.resyncSeconds > 0 ? `every ${m.resyncSeconds}s` : 'resync disabled';
  rows.push(['rules', `last check ${ago(m.lastCheck, now)} (${resync}), last repair ${ago(m.lastRepair, now)}; ${m.checks} checks, ${m.repairs} repairs, ${m.errors} errors`]);
  for (const p of m.lastRepairProblems) rows.push(['  repaired', p]);
  if (m.lastError) rows.push(['rules err', describeError(m.lastError, now)]);
  if (s.cniServer) rows.push(...cniServerRows(s.cniServer, now));
  rows.push(['subnet file', s.subnetFile]);
  return rows.map(([k, v]) => `${k.padEnd(12)}${terminalText(v)}\n`).join('');
}

/** How many of the CNI server's recent errors the text form shows. */
const CNI_ERRORS_SHOWN = 3;

function cniServerRows(c: CniServerStatus, now: Date): Array<[string, string]> {
  const rows: Array<[string, string]> = [];
  const where = c.socket === '' ? '' : ` on ${c.socket}`;
  const state = c.phase === 'off' ? 'off (--cni-socket is empty; the plugins run on their own)' : `${c.phase}${where}${c.reason ? `: ${c.reason}` : ''}`;
  rows.push(['cni server', state]);
  if (c.phase !== 'off' || c.requests > 0) {
    const byResult = Object.entries(c.results)
      .filter(([, n]) => n > 0)
      .map(([r, n]) => `${r} ${n}`)
      .join(', ');
    const abandoned = c.abandoned > 0 ? `, ${c.abandoned} abandoned still running` : '';
    rows.push(['cni reqs', `${c.requests}${byResult ? ` (${byResult})` : ''}, ${c.inFlight} in flight${abandoned}`]);
  }
  for (const e of c.lastErrors.slice(0, CNI_ERRORS_SHOWN)) {
    const who = [e.plugin, e.verb, e.containerId].filter((x) => x !== '').join(' ');
    rows.push(['cni err', `${who}: ${e.code ? `code ${e.code}: ` : ''}${e.message} (${ago(e.time, now)})`]);
  }
  return rows;
}

export interface StatusCommandArgs {
  readonly endpoint: string;
  readonly output: 'text' | 'json';
}

/** Exit 0 with the status printed; 1 when the daemon cannot be asked (message on stderr). */
export async function statusCommand(args: StatusCommandArgs, out: NodeJS.WritableStream = process.stdout, err: NodeJS.WritableStream = process.stderr): Promise<number> {
  let s: StatusSnapshot;
  try {
    s = await fetchStatus(args.endpoint);
  } catch (e) {
    err.write(`weft status: ${terminalText(errorMessage(e))}\n`);
    return 1;
  }
  out.write(args.output === 'json' ? `${terminalJson(s)}\n` : renderStatus(s));
  return 0;
}
