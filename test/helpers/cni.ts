// Running CNI plugins from tests: weft's bundles (built once per test process into a temp dir)
// and Debian's reference plugins, as real processes with the CNI env, optionally inside a "host"
// netns the test created (`ip netns exec`), so links, sysctls and iptables land there.
//
// weft's `<name>` is the native client (issue 17): it forwards the call to a CNI server on
// $WEFT_CNI_SOCKET, or runs the bundle `<name>.cjs` itself. Every suite runs both ways:
//  - fallback (default): WEFT_CNI_SOCKET is empty, the client goes straight to the bundle.
//  - server (WEFT_TEST_CNI_VIA=server, `npm run test:cni-server`): calls of a plugin weftd serves
//    go through a CNI server (cni-server-standalone.ts) started here on first use, one per network
//    namespace the plugin is called in (the server runs plugin work in its own namespace, so one
//    in the machine's namespace must never serve a call meant for a test's "host" namespace).
//    Only CNI_* variables cross the socket, so a call with any other variable in `env` stays on
//    the fallback (counted, see cniServerSummary), except PATH: that is the server's own PATH
//    (where the plugins find their tools), so such calls get a server started with that PATH.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync, readSync, rmSync, statSync } from 'node:fs';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { constants as osConstants, tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { transform } from 'esbuild';
import { BUNDLE_SUFFIX, buildCniBundlesReport, CLIENT_MARKER, findPluginEntries } from '../../cni-plugins/build.js';
import { CNI_SERVER_PLUGINS } from '../../src/cniserver/types.js';

/** Debian's containernetworking-plugins 1.1.1: the oracle for differential tests. */
export const REFERENCE_CNI_DIR = '/usr/lib/cni';

let built: Promise<string> | undefined;

let signalsHooked = false;
/**
 * Makes SIGINT, SIGTERM and SIGHUP (Ctrl-C, `timeout`, a cancelled CI job) end this process through
 * process.exit, so its 'exit' handlers run: netns.ts deletes the test's namespaces, weftd.ts kills
 * its weftd, this file its CNI servers. Node's default action for them skips those handlers: a
 * cni-server run killed while hung once left 54 namespaces behind. Signals someone else already
 * handles (mocha's parallel runner, in its main process) are left alone. Called by cniBinDir and
 * runCni, so every CNI suite's test process has it.
 */
export function cleanupOnSignals(): void {
  if (signalsHooked) return;
  signalsHooked = true;
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    if (process.listenerCount(sig) === 0) process.once(sig, () => process.exit(128 + osConstants.signals[sig]));
  }
}

/**
 * A directory with every weft plugin (`bridge`, `host-local`, …: the native client `<name>` and the
 * bundle `<name>.cjs`, as build.ts lays out dist/cni/bin), built on first call into
 * `<tmpdir>/weft-cni-<pid>` and removed when the process exits. A plugin that does not build is
 * reported on stderr and left out (the others are still usable); a test that runs it then fails
 * with ENOENT after that message.
 */
export function cniBinDir(): Promise<string> {
  cleanupOnSignals();
  built ??= (async () => {
    const dir = join(tmpdir(), `weft-cni-${process.pid}`);
    await rm(dir, { recursive: true, force: true });
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    const { failures } = await buildCniBundlesReport(dir, findPluginEntries());
    for (const f of failures) process.stderr.write(`cniBinDir: ${f.message}\n`);
    return dir;
  })().catch((err: unknown) => {
    built = undefined; // let a later call try again
    throw err;
  });
  return built;
}

/** A flannel network config against a weftd's subnet.env, its state and host-local's under `dir`. */
export function flannelNetConf(network: string, subnetFile: string, dir: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    cniVersion: '1.0.0',
    name: network,
    type: 'flannel',
    subnetFile,
    dataDir: join(dir, 'flannel'),
    ...extra,
    ipam: { dataDir: join(dir, 'ipam') },
  });
}

export interface RunCniOptions {
  /** Full path of the plugin executable. */
  readonly bin: string;
  readonly command: string;
  /** Defaults to "wt-ctr" for ADD/DEL/CHECK. '' leaves CNI_CONTAINERID unset (same for the others). */
  readonly containerId?: string;
  /** CNI_NETNS; unset unless given. */
  readonly netns?: string;
  /** Defaults to "eth0" for ADD/DEL/CHECK. */
  readonly ifname?: string;
  /** CNI_ARGS; unset unless given. */
  readonly args?: string;
  /** CNI_PATH; defaults to the directory of `bin`. */
  readonly path?: string;
  /** Run inside `ip netns exec <hostNs>`. */
  readonly hostNs?: string;
  /** Extra environment (wins over everything above). The base env is only PATH. */
  readonly env?: Readonly<Record<string, string>>;
  /** Kill the plugin (by its pid) after this long; default 60 s. */
  readonly timeoutMs?: number;
}

export interface CniRun {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  /** stdout parsed as JSON; undefined when empty or not JSON. */
  readonly json: unknown;
}

export class CniRunTimeout extends Error {
  constructor(
    readonly opts: RunCniOptions,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(`${opts.bin} ${opts.command} did not finish within ${opts.timeoutMs ?? 60_000} ms; stderr: ${stderr.trim()}`);
    this.name = 'CniRunTimeout';
  }
}

const VERBS_WITH_ATTACHMENT = new Set(['ADD', 'DEL', 'CHECK']);
const DEFAULT_PATH = '/usr/sbin:/usr/bin:/sbin:/bin';

/**
 * The env a runtime would pass; PATH only otherwise (no NODE_OPTIONS from the test runner).
 * `socket` is WEFT_CNI_SOCKET: empty (the default) sends weft's client straight to its bundle.
 */
export function cniEnv(opts: RunCniOptions, socket = ''): Record<string, string> {
  const env: Record<string, string> = { PATH: process.env.PATH ?? DEFAULT_PATH, CNI_COMMAND: opts.command, WEFT_CNI_SOCKET: socket };
  const attach = VERBS_WITH_ATTACHMENT.has(opts.command);
  const set = (key: string, value: string | undefined): void => {
    if (value !== undefined && value !== '') env[key] = value;
  };
  set('CNI_CONTAINERID', opts.containerId ?? (attach ? 'wt-ctr' : undefined));
  set('CNI_NETNS', opts.netns);
  set('CNI_IFNAME', opts.ifname ?? (attach ? 'eth0' : undefined));
  set('CNI_ARGS', opts.args);
  set('CNI_PATH', opts.path ?? dirname(opts.bin));
  return { ...env, ...opts.env };
}

/** Runs one plugin invocation with `stdin` as its config. Resolves whatever the exit status. */
export async function runCni(opts: RunCniOptions, stdin: string): Promise<CniRun> {
  cleanupOnSignals();
  const server = await cniServerFor(opts);
  const [cmd, args] = opts.hostNs ? ['ip', ['netns', 'exec', opts.hostNs, opts.bin]] : [opts.bin, []];
  if (server) {
    server.inFlight++;
    server.routed++;
  }
  try {
    return await new Promise<CniRun>((resolve, reject) => {
      const child = spawn(cmd, args, { env: cniEnv(opts, server?.socket ?? ''), stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
      child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new CniRunTimeout(opts, stdout, stderr));
      }, opts.timeoutMs ?? 60_000);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        let json: unknown;
        if (stdout.trim() !== '') {
          try {
            json = JSON.parse(stdout);
          } catch {
            json = undefined;
          }
        }
        resolve({ exitCode: code ?? (signal ? 128 : -1), stdout, stderr, json });
      });
      child.stdin.on('error', () => {});
      child.stdin.end(stdin);
    });
  } finally {
    if (server) {
      server.inFlight--;
      server.lastUsed = Date.now();
    }
  }
}

// ---- server mode ----

/** How this test run calls weft's plugins (WEFT_TEST_CNI_VIA): through the bundle, or a CNI server. */
export type CniVia = 'fallback' | 'server';

function cniVia(): CniVia {
  const v = process.env.WEFT_TEST_CNI_VIA ?? '';
  if (v === '' || v === 'fallback') return 'fallback';
  if (v === 'server') return 'server';
  throw new Error(`WEFT_TEST_CNI_VIA=${v}: expected "server" or "fallback"`);
}

export const CNI_VIA: CniVia = cniVia();

const SERVED = new Set<string>(CNI_SERVER_PLUGINS);
const STANDALONE = fileURLToPath(new URL('./cni-server-standalone.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** Servers alive at once; beyond that the least recently used idle one is stopped (each is a Node process). */
const MAX_SERVERS = 12;
const START_TIMEOUT_MS = 30_000;

interface CniTestServer {
  readonly key: string;
  /** The host namespace ('' = the test process's own). */
  readonly ns: string;
  readonly socket: string;
  readonly proc: ChildProcess;
  /** The inode of the namespace it serves (it exits when /run/netns/<ns> goes away or changes). */
  netnsIno: number;
  /** Requests it served (nested delegate requests included; refused ones not). */
  requests: number;
  /** runCni calls sent its way. */
  routed: number;
  inFlight: number;
  lastUsed: number;
  /** Set when it has exited: why (its own word, or how it ended). */
  exited: string | null;
  /** We asked it to stop (or its namespace went away): its exit is expected. */
  expectedExit: boolean;
  /** Its stderr, the last few KiB. */
  log: string;
  readonly gone: Promise<void>;
}

const servers = new Map<string, Promise<CniTestServer>>();
const live = new Set<CniTestServer>();
let socketDir = '';
let serverSeq = 0;
/** Counters since the last resetCniServerSummary(). */
let tally = { started: 0, routed: 0, requests: 0, fallback: new Map<string, number>(), problems: [] as string[], refused: [] as string[] };

export interface CniServerSummary {
  readonly via: CniVia;
  /** Servers started. */
  readonly started: number;
  /** Plugin calls sent to a server. */
  readonly routed: number;
  /** Requests the servers answered (counted by the servers). */
  readonly requests: number;
  /** Calls of weft's client kept on the fallback in server mode, by reason. */
  readonly fallback: Readonly<Record<string, number>>;
  /** Servers that failed to start or ended on their own (crash), with their log. */
  readonly problems: readonly string[];
  /** Requests a server answered `serving:false` (the client then ran the bundle). */
  readonly refused: readonly string[];
}

/** What the server mode did so far (stopped servers and live ones). */
export function cniServerSummary(): CniServerSummary {
  let routed = tally.routed;
  let requests = tally.requests;
  for (const h of live) {
    routed += h.routed;
    requests += h.requests;
  }
  return { via: CNI_VIA, started: tally.started, routed, requests, fallback: Object.fromEntries(tally.fallback), problems: [...tally.problems], refused: [...tally.refused] };
}

export function resetCniServerSummary(): void {
  tally = { started: 0, routed: 0, requests: 0, fallback: new Map(), problems: [], refused: [] };
  for (const h of live) {
    h.routed = 0;
    h.requests = 0;
  }
}

const clientCache = new Map<string, boolean>();
/** Whether `bin` is weft's native client (its marker in the first 4 KiB, as delegation checks). */
function isWeftClient(bin: string): boolean {
  let known = clientCache.get(bin);
  if (known === undefined) {
    known = false;
    try {
      const fd = openSync(bin, 'r');
      try {
        const buf = Buffer.alloc(4096);
        known = buf.subarray(0, readSync(fd, buf, 0, buf.length, 0)).includes(`${CLIENT_MARKER}\0`);
      } finally {
        closeSync(fd);
      }
    } catch {
      // missing or unreadable: the call fails on its own
    }
    clientCache.set(bin, known);
  }
  return known;
}

const bundleCache = new Map<string, Promise<boolean>>();
/** Whether `<bin>.cjs` is byte for byte weft's bundle of plugin `name` (as cniBinDir builds it). */
function sameAsWeftBundle(bin: string, name: string): Promise<boolean> {
  let same = bundleCache.get(bin);
  if (!same) {
    same = (async () => {
      const ref = join(await cniBinDir(), name + BUNDLE_SUFFIX);
      if (dirname(ref) === dirname(bin)) return true;
      const [a, b] = await Promise.all([readFile(bin + BUNDLE_SUFFIX), readFile(ref)]);
      return a.equals(b);
    })().catch(() => false);
    bundleCache.set(bin, same);
  }
  return same;
}

/** The namespace a call's plugin runs in: the host netns's inode, or this process's. null when it does not exist. */
function netnsInode(ns: string): number | null {
  return statSync(ns ? `/run/netns/${ns}` : '/proc/self/ns/net', { throwIfNoEntry: false })?.ino ?? null;
}

function noteFallback(reason: string): void {
  tally.fallback.set(reason, (tally.fallback.get(reason) ?? 0) + 1);
}

/** The server a call goes through in server mode (started on first use); null: the fallback. */
async function cniServerFor(opts: RunCniOptions): Promise<CniTestServer | null> {
  if (CNI_VIA !== 'server' || opts.env?.WEFT_CNI_SOCKET !== undefined) return null;
  // Debian's plugins, the bundles themselves and other executables: not weft's client.
  if (!isWeftClient(opts.bin)) return null;
  const name = basename(opts.bin);
  if (!SERVED.has(name)) {
    noteFallback(`${name}: not a plugin weftd serves`);
    return null;
  }
  // A test's own bundle under a served name (a fixture built as `sriov`) is not what the server runs.
  if (!(await sameAsWeftBundle(opts.bin, name))) {
    noteFallback(`${name}: a test's own build, not weft's plugin`);
    return null;
  }
  // Only CNI_* crosses the socket; PATH is the server's own (see the header).
  const stays = Object.keys(opts.env ?? {}).filter((k) => !k.startsWith('CNI_') && k !== 'PATH');
  if (stays.length > 0) {
    noteFallback(`env ${stays.sort().join(',')} does not cross the socket`);
    return null;
  }
  const ns = opts.hostNs ?? '';
  const ino = netnsInode(ns);
  if (ino === null) return null; // `ip netns exec` fails as it would
  const path = opts.env?.PATH ?? process.env.PATH ?? DEFAULT_PATH;
  const key = `${ns}\n${path}`;
  const existing = servers.get(key);
  if (existing) {
    const h = await existing.catch(() => null);
    // A namespace deleted and made again under the same name needs a server of its own.
    if (h && h.exited === null && h.netnsIno === ino) {
      h.lastUsed = Date.now(); // not evicted before runCni counts it in flight
      return h;
    }
    if (servers.get(key) === existing) servers.delete(key);
    if (h) await stopServer(h);
    const again = servers.get(key); // a concurrent call may have started the new one meanwhile
    if (again) return again;
  }
  const started = startServer(key, ns, path);
  servers.set(key, started);
  started.catch(() => {
    if (servers.get(key) === started) servers.delete(key);
  });
  return started;
}

interface StandaloneEntry {
  readonly argv: string[];
  readonly env: Record<string, string>;
}
let entryPromise: Promise<StandaloneEntry> | undefined;
/**
 * How to run cni-server-standalone.ts. Under `make test` (WEFT_TEST_BUILT=1): as plain JavaScript
 * (types stripped by esbuild into the socket directory) against dist/'s server, so neither the
 * server nor the plugin process it forks loads tsx. Otherwise from source, through tsx.
 */
function standaloneEntry(): Promise<StandaloneEntry> {
  entryPromise ??= (async (): Promise<StandaloneEntry> => {
    if (process.env.WEFT_TEST_BUILT !== '1') return { argv: ['--import=tsx', STANDALONE], env: {} };
    const js = join(ensureSocketDir(), 'cni-server-standalone.mjs');
    const { code } = await transform(await readFile(STANDALONE, 'utf8'), { loader: 'ts', format: 'esm', target: 'node20' });
    await writeFile(js, code);
    return { argv: [js], env: { WEFT_TEST_CNI_SERVER_MODULE: pathToFileURL(join(ROOT, 'dist/src/cniserver/server.js')).href } };
  })();
  return entryPromise;
}

function ensureSocketDir(): string {
  if (!socketDir) {
    socketDir = join(tmpdir(), `weft-cni-srv-${process.pid}`);
    rmSync(socketDir, { recursive: true, force: true });
    mkdirSync(socketDir, { mode: 0o700 });
    process.once('exit', () => {
      for (const h of live) h.proc.kill('SIGKILL');
      rmSync(socketDir, { recursive: true, force: true });
    });
  }
  return socketDir;
}

async function startServer(key: string, ns: string, path: string): Promise<CniTestServer> {
  // Stay within MAX_SERVERS: stop the least recently used idle one (not one just handed to a call).
  const idle = [...live].filter((h) => h.inFlight === 0 && h.exited === null && Date.now() - h.lastUsed > 5000).sort((a, b) => a.lastUsed - b.lastUsed);
  while (live.size >= MAX_SERVERS && idle.length > 0) await stopServer(idle.shift()!);

  const socket = join(ensureSocketDir(), `s${++serverSeq}.sock`);
  const { argv: entry, env: entryEnv } = await standaloneEntry();
  const node = [process.execPath, ...entry, socket, ...(ns ? [ns] : [])];
  const [cmd, args] = ns ? ['ip', ['netns', 'exec', ns, ...node]] : [node[0]!, node.slice(1)];
  // `ip netns exec` execs node itself: signals and the pid are the server's.
  const proc = spawn(cmd, args, { cwd: ROOT, env: { ...process.env, ...entryEnv, PATH: path }, stdio: ['pipe', 'pipe', 'pipe'] });
  tally.started++;
  let resolveGone = () => {};
  const h: CniTestServer = {
    key, ns, socket, proc, netnsIno: -1, requests: 0, routed: 0, inFlight: 0, lastUsed: Date.now(), exited: null, expectedExit: false, log: '',
    gone: new Promise<void>((r) => (resolveGone = r)),
  };
  live.add(h);
  let ready: (ok: boolean, why?: string) => void = () => {};
  const serving = new Promise<void>((resolve, reject) => {
    ready = (ok, why) => (ok ? resolve() : reject(new Error(`CNI test server for ${ns ? `netns ${ns}` : 'this process\'s netns'}: ${why}; its log:\n${h.log}`)));
  });
  let pending = '';
  proc.stdout.setEncoding('utf8').on('data', (d: string) => {
    pending += d;
    let nl: number;
    while ((nl = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      let ev: { event?: string; netns?: number; reason?: string; why?: string; result?: string; plugin?: string; verb?: string };
      try {
        ev = JSON.parse(line) as typeof ev;
      } catch {
        continue;
      }
      if (ev.event === 'serving') {
        h.netnsIno = ev.netns ?? -1;
        ready(true);
      } else if (ev.event === 'request') {
        if (ev.result !== 'not_serving') h.requests++;
        // Refused: the client ran the bundle itself. A caller in another namespace than the server's
        // would be a bug of this harness (and the call was not served): reported by the root hook.
        else tally.refused.push(`${ev.plugin} ${ev.verb} refused by the server for ${ns || "this process's netns"}`);
      } else if (ev.event === 'failed') {
        ready(false, `did not start: ${ev.reason}`);
      } else if (ev.event === 'exit') {
        if (/^netns .* is gone$|^SIG|^stdin/.test(ev.why ?? '')) h.expectedExit = true;
        h.exited = ev.why ?? 'exit';
      }
    }
  });
  proc.stderr.setEncoding('utf8').on('data', (d: string) => (h.log = (h.log + d).slice(-4000)));
  proc.on('error', (e) => ready(false, e.message));
  proc.on('close', (code, signal) => {
    h.exited ??= `exit status ${code ?? signal}`;
    live.delete(h);
    if (servers.get(key) !== undefined) void servers.get(key)!.then((x) => x === h && servers.get(key) && servers.delete(key), () => undefined);
    tally.routed += h.routed;
    tally.requests += h.requests;
    if (!h.expectedExit) tally.problems.push(`CNI test server for ${ns || 'this process\'s netns'} ended on its own (${h.exited}); its log:\n${h.log}`);
    ready(false, `exited before serving (${h.exited})`);
    resolveGone();
  });
  const timer = setTimeout(() => ready(false, `not serving within ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS);
  try {
    await serving;
  } catch (e) {
    h.expectedExit = true; // reported through the test that needed it
    proc.kill('SIGKILL');
    throw e;
  } finally {
    clearTimeout(timer);
  }
  // Never keep the test process alive (mocha runs without --exit); its 'exit' handler kills them.
  proc.unref();
  for (const s of [proc.stdin, proc.stdout, proc.stderr]) (s as unknown as { unref?: () => void }).unref?.();
  return h;
}

/** SIGTERM (the server removes its socket), then SIGKILL after 5 s. */
async function stopServer(h: CniTestServer): Promise<void> {
  h.expectedExit = true;
  if (servers.get(h.key)) {
    const p = servers.get(h.key)!;
    if ((await p.catch(() => null)) === h && servers.get(h.key) === p) servers.delete(h.key);
  }
  if (h.exited === null) h.proc.kill('SIGTERM');
  const timer = setTimeout(() => h.proc.kill('SIGKILL'), 5000);
  await h.gone;
  clearTimeout(timer);
}

/** Stops every CNI test server (server mode's root hook runs it after each file). */
export async function stopCniServers(): Promise<void> {
  await Promise.all([...live].map((h) => stopServer(h)));
}
