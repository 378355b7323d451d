// The plugins' runner for iproute2: many changes in one process with `ip -batch` (and `bridge
// -batch`) on the host side, `nsenter --net=<netns> ip -batch` inside the pod, with the failing
// lines and ip's messages picked out of stderr; the pod-side `ip -batch` and `sysctl -p-` that
// are started before their input is known (their start-up overlaps the caller's other work).
// Lines are IpLine only (src/render/ipbatch.ts): nothing else can be fed to ip or bridge.
import { batchText, type IpLine } from '../../src/render/ipbatch.js';
import { execProgram, startProgram, type ExecResult, type StartedProgram } from '../../src/util/exec.js';
import { NetnsHandle } from './netns.js';

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

async function runBatch(program: 'ip' | 'bridge', lines: readonly IpLine[], opts: IpBatchOptions): Promise<IpBatchResult> {
  const flags = batchFlags(opts);
  let r: ExecResult;
  const input = batchText(lines);
  if (opts.netns) {
    r = await execProgram('nsenter', [`--net=${NetnsHandle.CHILD_PATH}`, program, ...flags], { input, nsFds: [opts.netns.fd] });
  } else {
    r = await execProgram(program, flags, { input, nsFds: opts.passNetns ? [opts.passNetns.fd] : [] });
  }
  return batchResult(r, opts);
}

export function ipBatch(lines: readonly IpLine[], opts: IpBatchOptions = {}): Promise<IpBatchResult> {
  return runBatch('ip', lines, opts);
}

export function bridgeBatch(lines: readonly IpLine[], opts: IpBatchOptions = {}): Promise<IpBatchResult> {
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

  async run(lines: readonly IpLine[]): Promise<IpBatchResult> {
    this.started.feed(batchText(lines));
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
  const started = startProgram('nsenter', [`--net=${NetnsHandle.CHILD_PATH}`, 'ip', ...batchFlags(o)], { nsFds: [netns.fd] });
  return new PendingPodBatch(started, o);
}

/** Runs `sysctl -w` inside the pod netns; keys use '/' so interface names may contain dots. */
export async function podSysctls(netns: NetnsHandle, settings: ReadonlyArray<readonly [string, string]>): Promise<ExecResult> {
  const args = [`--net=${NetnsHandle.CHILD_PATH}`, 'sysctl', '-q', '-e', '-w', ...settings.map(([k, v]) => `${k}=${v}`)];
  return execProgram('nsenter', args, { nsFds: [netns.fd] });
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
  return new PendingPodSysctls(startProgram('nsenter', args, { nsFds: [netns.fd] }));
}

/** Why a batch failed: the failing line's context (in the reference's words) and ip's message. */
export function batchFailure(r: IpBatchResult, lines: ReadonlyArray<{ readonly what: string }>): string {
  const n = r.failedLines[0] ?? 0;
  const what = n > 0 ? lines[n - 1]?.what : undefined;
  return what ? `${what}: ${r.message}` : r.message || `ip exited with status ${r.code}`;
}
