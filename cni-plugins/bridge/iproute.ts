// The plugin's link to the kernel: `ip -batch` (many changes in one process) on the host side,
// `nsenter --net=<netns> ip -batch` inside the pod, the pod netns held open as a file descriptor
// (so it cannot vanish or be swapped between the checks and the changes), typed views of
// `ip -j` output, and direct /proc/sys writes for host sysctls.
import { closeSync, fstatSync, openSync, readFileSync, statfsSync, statSync, writeFileSync } from 'node:fs';
import { execProgram, startProgram, type ExecResult, type StartedProgram } from './exec.js';
import { netnsError } from '../skel/rollback.js';

/** statfs f_type of nsfs (and of procfs, for /proc/<pid>/ns/net on old kernels). */
const NSFS_MAGIC = 0x6e736673;
const PROC_SUPER_MAGIC = 0x9fa0;

/** CNI_NETNS does not exist (a DEL may ignore this; ADD and CHECK fail). */
export class NetnsNotFoundError extends Error {
  constructor(readonly path: string) {
    super(`failed to Statfs "${path}": no such file or directory`);
    this.name = 'NetnsNotFoundError';
  }
}

/** CNI_NETNS exists but is not a network namespace file (e.g. a stale bind-mount target). */
export class NetnsInvalidError extends Error {
  constructor(
    readonly path: string,
    readonly why: string,
  ) {
    super(why);
    this.name = 'NetnsInvalidError';
  }
}

/** An open handle on the pod's netns; children see it as /proc/self/fd/3. */
export class NetnsHandle {
  private closed = false;
  private constructor(
    readonly path: string,
    readonly fd: number,
  ) {}

  /** Validates and opens a netns path as the reference ns.GetNS does (Statfs magic check). */
  static open(path: string): NetnsHandle {
    let type: number;
    try {
      type = statfsSync(path).type;
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === 'ENOENT') throw new NetnsNotFoundError(path);
      throw new NetnsInvalidError(path, `failed to Statfs "${path}": ${err.message}`);
    }
    if (type !== NSFS_MAGIC && type !== PROC_SUPER_MAGIC) {
      throw new NetnsInvalidError(path, `unknown FS magic on "${path}": ${type.toString(16)}`);
    }
    let fd: number;
    try {
      fd = openSync(path, 'r');
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === 'ENOENT') throw new NetnsNotFoundError(path);
      throw new NetnsInvalidError(path, `failed to open "${path}": ${err.message}`);
    }
    return new NetnsHandle(path, fd);
  }

  /** For ADD and CHECK: the netns, or the spec's error for a CNI_NETNS that cannot be used. */
  static openForPod(path: string): NetnsHandle {
    try {
      return NetnsHandle.open(path);
    } catch (e) {
      throw netnsError(path, e);
    }
  }

  /**
   * For DEL: the netns, or null when `path` is empty, gone or not a netns (nothing of ours can be
   * in it then; the host side still has to be cleaned).
   */
  static openIfPresent(path: string): NetnsHandle | null {
    if (path === '') return null;
    try {
      return NetnsHandle.open(path);
    } catch (e) {
      if (e instanceof NetnsNotFoundError || e instanceof NetnsInvalidError) return null;
      throw e;
    }
  }

  /** The path a child process with this handle as fd 3 uses. */
  static readonly CHILD_PATH = '/proc/self/fd/3';

  /** True while `path` still names the netns we hold open (it was not deleted or replaced). */
  stillMounted(): boolean {
    try {
      const a = statSync(this.path);
      const b = fstatSync(this.fd);
      return a.dev === b.dev && a.ino === b.ino;
    } catch {
      return false;
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      closeSync(this.fd);
    } catch {
      // already closed
    }
  }
}

export interface IpBatchOptions {
  /** Run inside this netns (nsenter); otherwise in the plugin's own (host) netns. */
  readonly netns?: NetnsHandle;
  /** Hand the netns to a host-side `ip` as fd 3 (for `netns /proc/self/fd/3`). */
  readonly passNetns?: NetnsHandle;
  readonly json?: boolean;
  readonly details?: boolean;
  /** Keep going after a failing command (`-force`); failures are still reported. */
  readonly force?: boolean;
}

export interface IpBatchResult {
  readonly code: number;
  /** Parsed JSON documents, one per command that printed one, in order. */
  readonly docs: unknown[];
  readonly stderr: string;
  /** 1-based numbers of the batch lines that failed. */
  readonly failedLines: number[];
  /** stderr without the "Command failed -:N" markers. */
  readonly message: string;
  /** What ip printed for each failed line. */
  readonly byLine: ReadonlyMap<number, string>;
}

/** Splits concatenated JSON values (what `ip -j -batch` prints: one array per show command). */
export function splitJsonDocs(text: string): unknown[] {
  const docs: unknown[] = [];
  let depth = 0;
  let inString = false;
  let escaped = false;
  let start = -1;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (inString) {
      if (escaped) escaped = false;
      else if (ch === '\\') escaped = true;
      else if (ch === '"') inString = false;
      continue;
    }
    if (ch === '"') {
      inString = true;
    } else if (ch === '[' || ch === '{') {
      if (depth === 0) start = i;
      depth++;
    } else if (ch === ']' || ch === '}') {
      depth--;
      if (depth === 0 && start >= 0) {
        docs.push(JSON.parse(text.slice(start, i + 1)));
        start = -1;
      }
    }
  }
  return docs;
}

export function parseBatchStderr(stderr: string): { failedLines: number[]; message: string; byLine: Map<number, string> } {
  const failedLines: number[] = [];
  const byLine = new Map<number, string>();
  const all: string[] = [];
  let pending: string[] = [];
  for (const raw of stderr.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    const m = /^Command failed (?:-|\S+):(\d+)$/.exec(line);
    if (m) {
      const n = Number(m[1]);
      failedLines.push(n);
      byLine.set(n, pending.join('; '));
      pending = [];
    } else {
      pending.push(line);
      all.push(line);
    }
  }
  return { failedLines, message: all.join('; '), byLine };
}

function batchFlags(opts: IpBatchOptions): string[] {
  const flags: string[] = [];
  if (opts.json) flags.push('-j');
  if (opts.details) flags.push('-d');
  if (opts.force) flags.push('-force');
  flags.push('-batch', '-');
  return flags;
}

function batchResult(r: ExecResult, opts: IpBatchOptions): IpBatchResult {
  const { failedLines, message, byLine } = parseBatchStderr(r.stderr);
  let docs: unknown[] = [];
  if (opts.json) docs = splitJsonDocs(r.stdout);
  // nsenter's own failure (e.g. the netns went away) has no "Command failed" line.
  if (r.code !== 0 && failedLines.length === 0 && !opts.force) failedLines.push(0);
  return { code: r.code, docs, stderr: r.stderr, failedLines, message, byLine };
}

const batchInput = (lines: readonly string[]): string => lines.join('\n') + '\n';

async function runBatch(program: 'ip' | 'bridge', lines: readonly string[], opts: IpBatchOptions): Promise<IpBatchResult> {
  const flags = batchFlags(opts);
  let r: ExecResult;
  const input = batchInput(lines);
  if (opts.netns) {
    r = await execProgram('nsenter', [`--net=${NetnsHandle.CHILD_PATH}`, program, ...flags], { input, extraFds: [opts.netns.fd] });
  } else {
    r = await execProgram(program, flags, { input, extraFds: opts.passNetns ? [opts.passNetns.fd] : [] });
  }
  return batchResult(r, opts);
}

export function ipBatch(lines: readonly string[], opts: IpBatchOptions = {}): Promise<IpBatchResult> {
  return runBatch('ip', lines, opts);
}

export function bridgeBatch(lines: readonly string[], opts: IpBatchOptions = {}): Promise<IpBatchResult> {
  return runBatch('bridge', lines, opts);
}

/**
 * An `ip -batch` inside a pod netns, started before its commands are known (see startPodIpBatch):
 * `run` sends them, `cancel` lets it exit doing nothing. Only the first of the two counts.
 */
export class PendingPodBatch {
  constructor(
    private readonly started: StartedProgram,
    private readonly opts: IpBatchOptions,
  ) {}

  async run(lines: readonly string[]): Promise<IpBatchResult> {
    this.started.feed(batchInput(lines));
    return batchResult(await this.started.result, this.opts);
  }

  cancel(): void {
    this.started.feed('');
  }

  /** Settles once the program has exited, whatever its outcome. */
  async done(): Promise<void> {
    await this.started.result.catch(() => undefined);
  }
}

/**
 * Starts `nsenter --net=<pod> ip -batch -` now: the process start-up overlaps the host-side work,
 * and the commands go in when they are known. Must be run or cancelled.
 */
export function startPodIpBatch(netns: NetnsHandle, opts: Omit<IpBatchOptions, 'netns' | 'passNetns'> = {}): PendingPodBatch {
  const o: IpBatchOptions = { ...opts, netns };
  const started = startProgram('nsenter', [`--net=${NetnsHandle.CHILD_PATH}`, 'ip', ...batchFlags(o)], { extraFds: [netns.fd] });
  return new PendingPodBatch(started, o);
}

/** Runs `sysctl -w` inside the pod netns; keys use '/' so interface names may contain dots. */
export async function podSysctls(netns: NetnsHandle, settings: ReadonlyArray<readonly [string, string]>): Promise<ExecResult> {
  const args = [`--net=${NetnsHandle.CHILD_PATH}`, 'sysctl', '-q', '-e', '-w', ...settings.map(([k, v]) => `${k}=${v}`)];
  return execProgram('nsenter', args, { extraFds: [netns.fd] });
}

/** `sysctl -p-` inside a pod netns, started before the settings can be applied (see startPodSysctls). */
export class PendingPodSysctls {
  constructor(private readonly started: StartedProgram) {}

  /** Sends the settings (one `key=value` line each, as `sysctl -w` takes them) and waits for sysctl. */
  run(settings: ReadonlyArray<readonly [string, string]>): Promise<ExecResult> {
    this.started.feed(settings.map(([k, v]) => `${k}=${v}\n`).join(''));
    return this.started.result;
  }

  cancel(): void {
    this.started.feed('');
  }

  async done(): Promise<void> {
    await this.started.result.catch(() => undefined);
  }
}

/**
 * Starts `nsenter --net=<pod> sysctl -q -e -p-` now (settings read from stdin, applied like
 * `sysctl -q -e -w`), so its start-up overlaps the host-side work. Must be run or cancelled.
 */
export function startPodSysctls(netns: NetnsHandle): PendingPodSysctls {
  const args = [`--net=${NetnsHandle.CHILD_PATH}`, 'sysctl', '-q', '-e', '-p-'];
  return new PendingPodSysctls(startProgram('nsenter', args, { extraFds: [netns.fd] }));
}

/** Writes a host sysctl (the plugin runs in the host netns); path relative to /proc/sys. */
export function writeHostSysctl(key: string, value: string): void {
  writeFileSync(`/proc/sys/${key}`, value);
}

export function readHostSysctl(key: string): string {
  return readFileSync(`/proc/sys/${key}`, 'utf8').trim();
}

/** Sets a host sysctl unless it already has the value (as the reference's echo1). */
export function ensureHostSysctl(key: string, value: string): void {
  if (readHostSysctl(key) !== value) writeHostSysctl(key, value);
}

/** Names of the links in the plugin's own netns (/proc/net/dev is per netns of the reader). */
export function hostLinkNames(): Set<string> {
  const names = new Set<string>();
  for (const line of readFileSync('/proc/net/dev', 'utf8').split('\n').slice(2)) {
    const colon = line.indexOf(':');
    if (colon > 0) names.add(line.slice(0, colon).trim());
  }
  return names;
}

// ---- typed views of `ip -j` output ----

export interface IpAddrInfo {
  readonly family: 'inet' | 'inet6';
  readonly local: string;
  readonly prefixlen: number;
  readonly scope: string;
  readonly tentative: boolean;
  readonly dadfailed: boolean;
}

export interface IpLink {
  readonly ifindex: number;
  readonly ifname: string;
  readonly flags: readonly string[];
  readonly mtu: number;
  readonly operstate: string;
  readonly address: string;
  readonly master: string | null;
  /** The veth peer's ifindex (in the peer's netns). */
  readonly linkIndex: number | null;
  readonly kind: string | null;
  readonly infoData: Readonly<Record<string, unknown>>;
  readonly slaveData: Readonly<Record<string, unknown>>;
  readonly addrs: readonly IpAddrInfo[];
}

export interface IpRoute {
  readonly dst: string;
  readonly gateway: string | null;
  readonly dev: string | null;
  readonly table: string;
  readonly family: 4 | 6;
  readonly scope: string | null;
  readonly protocol: string | null;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' ? v : null;
}

function parseAddrInfo(v: unknown): IpAddrInfo | null {
  if (!isRecord(v)) return null;
  const family = v.family;
  const local = str(v.local);
  const prefixlen = num(v.prefixlen);
  if ((family !== 'inet' && family !== 'inet6') || local === null || prefixlen === null) return null;
  return { family, local, prefixlen, scope: str(v.scope) ?? '', tentative: v.tentative === true, dadfailed: v.dadfailed === true };
}

export function parseLink(v: unknown): IpLink | null {
  if (!isRecord(v)) return null;
  const ifindex = num(v.ifindex);
  const ifname = str(v.ifname);
  if (ifindex === null || ifname === null) return null;
  const info = isRecord(v.linkinfo) ? v.linkinfo : {};
  const addrs = Array.isArray(v.addr_info) ? v.addr_info.map(parseAddrInfo).filter((a): a is IpAddrInfo => a !== null) : [];
  return {
    ifindex,
    ifname,
    flags: Array.isArray(v.flags) ? v.flags.filter((f): f is string => typeof f === 'string') : [],
    mtu: num(v.mtu) ?? 0,
    operstate: str(v.operstate) ?? 'UNKNOWN',
    address: str(v.address) ?? '',
    master: str(v.master),
    linkIndex: num(v.link_index),
    kind: str(info.info_kind),
    infoData: isRecord(info.info_data) ? info.info_data : {},
    slaveData: isRecord(info.info_slave_data) ? info.info_slave_data : {},
    addrs,
  };
}

/** All links found in a batch's documents (each `link show` / `addr show` prints an array). */
export function linksOf(docs: readonly unknown[]): IpLink[] {
  const out: IpLink[] = [];
  for (const d of docs) {
    if (!Array.isArray(d)) continue;
    for (const item of d) {
      const l = parseLink(item);
      if (l) out.push(l);
    }
  }
  return out;
}

export function parseRoute(v: unknown): IpRoute | null {
  if (!isRecord(v)) return null;
  const dst = str(v.dst);
  if (dst === null) return null;
  const gateway = str(v.gateway);
  // `ip -j route` carries no family; IPv6 routes always have a preference attribute.
  const family: 4 | 6 = dst.includes(':') || (gateway !== null && gateway.includes(':')) || 'pref' in v ? 6 : 4;
  return {
    dst,
    gateway,
    dev: str(v.dev),
    table: str(v.table) ?? (typeof v.table === 'number' ? String(v.table) : 'main'),
    family,
    scope: str(v.scope),
    protocol: str(v.protocol),
  };
}

/** Routes from a `route show` document, recognised by having `dst` and no `ifindex`. */
export function routesOf(doc: unknown): IpRoute[] {
  if (!Array.isArray(doc)) return [];
  return doc.map(parseRoute).filter((r): r is IpRoute => r !== null);
}

export function hasFlag(link: IpLink, flag: string): boolean {
  return link.flags.includes(flag);
}

/** Why a batch failed: the failing line's context (in the reference's words) and ip's message. */
export function batchFailure(r: IpBatchResult, lines: ReadonlyArray<{ readonly what: string }>): string {
  const n = r.failedLines[0] ?? 0;
  const what = n > 0 ? lines[n - 1]?.what : undefined;
  return what ? `${what}: ${r.message}` : r.message || `ip exited with status ${r.code}`;
}
