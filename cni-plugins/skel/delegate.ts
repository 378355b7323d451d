// Delegation to another plugin (IPAM, or the flannel → bridge chain), as the reference
// pkg/invoke does it: the delegate is the first regular executable named `type` in CNI_PATH; it
// gets the caller's env with CNI_COMMAND set to the verb and the given config on stdin; its error
// JSON comes back as a CniError with the delegate's own code, msg and details.
//
// When the file found is one of weft's bundles (marker line written by cni-plugins/build.ts) or
// weft's native client (cni-plugins/native/weft-cni.c, recognized by the NUL-terminated
// `weft-cni-client: v1` in its first 4 KiB; it stands for the plugin named like the file) and a
// plugin of that name was registered with registerInProcess, it is run in this process through
// the same code path as the process entry (env checks, version gates, result conversion), so the
// outcome is the same as spawning it, minus a second process (and a Node.js start, or a round trip
// to weftd). WEFT_CNI_NO_INPROCESS=1 in the request's env forces spawning.
import { accessSync, closeSync, constants as fsc, openSync, readSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { delay } from '../../src/util/backoff.js';
import { errorMessage } from '../../src/util/errors.js';
import { CommandError, execProgram } from '../../src/util/exec.js';
import { CniResultError, convertResult, parseResult } from './convert.js';
import { execute, toCniError } from './run.js';
import { pluginStderr } from './stderr.js';
import { CniError, ErrorCode, type CniPlugin, type CniRequest, type CniResult, type Delegates } from './types.js';

/** The second line of every weft plugin bundle: `// weft-cni-plugin: <name>`. */
export const BUNDLE_MARKER_PREFIX = '// weft-cni-plugin: ';
/** The Node.js bundle of plugin `<name>` is `<name>` + this when the native client is `<name>`. */
export const BUNDLE_SUFFIX = '.cjs';
/** In the native client's first 4 KiB (an ELF note), followed by a NUL. */
export const CLIENT_MARKER = 'weft-cni-client: v1';
const MARKER_READ_BYTES = 4096;
const ELF_MAGIC = Buffer.from([0x7f, 0x45, 0x4c, 0x46]);
const CLIENT_MARKER_BYTES = Buffer.from(`${CLIENT_MARKER}\0`, 'latin1');

type Verb = 'ADD' | 'DEL' | 'CHECK' | 'GC' | 'STATUS';

const registry = new Map<string, CniPlugin>();

// File checks are synchronous: a handful of stats and one 512-byte read, where loading
// node:fs/promises alone costs a plugin process ~1.5 ms.

/** Makes `plugin` callable in-process when a weft bundle named `plugin.name` is the delegate. */
export function registerInProcess(plugin: CniPlugin): void {
  registry.set(plugin.name, plugin);
}

/** A delegate `type` that cannot be used or found. Plain error: the runtime sees code 999. */
export class DelegateLookupError extends Error {
  constructor(
    readonly type: string,
    readonly path: readonly string[],
    message: string,
  ) {
    super(message);
    this.name = 'DelegateLookupError';
  }
}

/** A delegate whose output is not a valid result. Plain error: the runtime sees code 999. */
export class DelegateOutputError extends Error {
  constructor(
    readonly type: string,
    readonly file: string,
    readonly stdout: string,
    reason: string,
  ) {
    super(`delegate ${type} (${file}) printed an invalid result: ${reason}`);
    this.name = 'DelegateOutputError';
  }
}

/** The first regular executable file `<dir>/<type>` along `path` (reference invoke.FindInPath). */
export function findInPath(type: string, path: readonly string[]): string {
  if (type === '') throw new DelegateLookupError(type, path, 'no plugin name provided');
  if (type.includes('/') || type === '.' || type === '..' || type.includes('\0')) {
    throw new DelegateLookupError(type, path, `invalid plugin name: ${type}`);
  }
  if (path.length === 0) throw new DelegateLookupError(type, path, 'no paths provided');
  for (const dir of path) {
    const file = join(dir, type);
    try {
      if (statSync(file).isFile()) {
        accessSync(file, fsc.X_OK);
        return file;
      }
    } catch {
      // not here (or not executable): keep looking
    }
  }
  throw new DelegateLookupError(type, path, `failed to find plugin ${JSON.stringify(type)} in path [${path.join(' ')}]`);
}

/**
 * The plugin a weft file stands for: a bundle's name from its marker line, or for weft's native
 * client the file's own name; null for any other file.
 */
export function readBundleMarker(file: string): string | null {
  let fd: number | undefined;
  try {
    fd = openSync(file, 'r');
    const buf = Buffer.alloc(MARKER_READ_BYTES);
    const bytesRead = readSync(fd, buf, 0, MARKER_READ_BYTES, 0);
    const raw = buf.subarray(0, bytesRead);
    if (raw.subarray(0, 4).equals(ELF_MAGIC)) return raw.includes(CLIENT_MARKER_BYTES) ? basename(file) || null : null;
    const head = raw.toString('utf8');
    for (const line of head.split('\n').slice(0, 3)) {
      if (line.startsWith(BUNDLE_MARKER_PREFIX)) return line.slice(BUNDLE_MARKER_PREFIX.length).trim() || null;
    }
    return null;
  } catch {
    return null;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** The config version a delegate's result defaults to when it prints none (reference fixup). */
function stdinVersion(stdin: string): string {
  try {
    const v = (JSON.parse(stdin) as { cniVersion?: unknown }).cniVersion;
    return typeof v === 'string' && v !== '' ? v : '0.1.0';
  } catch {
    return '0.1.0';
  }
}

interface ExecOutput {
  readonly status: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** One run of the delegate, with no deadline (as the reference's); a signal ends it like an exit status. */
async function spawnOnce(file: string, env: Record<string, string>, stdin: string): Promise<ExecOutput> {
  try {
    const r = await execProgram(file, [], { env, input: stdin, timeoutMs: 0 });
    return { status: r.code, signal: null, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    if (!(err instanceof CommandError) || err.signal === null) throw err;
    return { status: null, signal: err.signal, stdout: err.stdout ?? '', stderr: err.stderr };
  }
}

async function spawnDelegate(file: string, env: Record<string, string>, stdin: string): Promise<ExecOutput> {
  // The reference retries "text file busy" (the binary is being replaced) up to 5 times, 1 s apart.
  for (let attempt = 0; ; attempt++) {
    try {
      return await spawnOnce(file, env, stdin);
    } catch (err) {
      const busy = err instanceof CommandError && err.exitCode === null && /ETXTBSY/.test(err.message);
      if (!busy || attempt >= 5) throw err;
      await delay(1000);
    }
  }
}

/** A failed delegate's error, from its stdout JSON (reference RawExec.pluginErr). */
function delegateError(run: ExecOutput): CniError {
  const why = run.signal ? `signal: ${run.signal}` : `exit status ${run.status}`;
  if (run.stdout.trim() === '') {
    const msg = run.stderr === '' ? `netplugin failed with no error message: ${why}` : `netplugin failed: ${JSON.stringify(run.stderr)}`;
    return new CniError(ErrorCode.Internal, msg);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(run.stdout);
  } catch (e) {
    return new CniError(
      ErrorCode.Internal,
      `netplugin failed but error parsing its diagnostic message ${JSON.stringify(run.stdout)}: ${errorMessage(e)}`,
    );
  }
  const o = (typeof parsed === 'object' && parsed !== null ? parsed : {}) as { code?: unknown; msg?: unknown; details?: unknown };
  // The reference keeps code 0 when the delegate printed none; 999 says "failed" more honestly.
  const code = typeof o.code === 'number' && Number.isInteger(o.code) && o.code > 0 ? o.code : ErrorCode.Internal;
  return new CniError(code, typeof o.msg === 'string' ? o.msg : '', typeof o.details === 'string' ? o.details : '');
}

function delegateEnv(req: CniRequest, verb: Verb): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(req.env)) if (v !== undefined) env[k] = v;
  env.CNI_COMMAND = verb;
  return env;
}

function inProcessPlugin(req: CniRequest, name: string | null): CniPlugin | undefined {
  if (name === null || req.env.WEFT_CNI_NO_INPROCESS === '1') return undefined;
  return registry.get(name);
}

/** Runs `verb` of delegate `type`; for ADD returns its result in the 1.1.0 shape. */
async function delegate(req: CniRequest, type: string, stdin: string, verb: Verb): Promise<CniResult | undefined> {
  const file = findInPath(type, req.path);
  const env = delegateEnv(req, verb);
  const plugin = registry.size > 0 ? inProcessPlugin(req, readBundleMarker(file)) : undefined;

  if (plugin) {
    let outcome;
    try {
      outcome = await execute(plugin, env, stdin);
    } catch (err) {
      // What the spawned bundle would have printed and we would have parsed back.
      throw toCniError(err);
    }
    if (outcome.command !== 'ADD') return undefined;
    // Round-trip through the config's version, exactly as the printed result would be.
    try {
      return parseResult(convertResult(outcome.result, outcome.version), outcome.version);
    } catch (err) {
      throw toCniError(err);
    }
  }

  const run = await spawnDelegate(file, env, stdin);
  // The delegate's diagnostics go where ours go (in weftd's plugin process: the request's reply).
  if (run.stderr !== '') pluginStderr(run.stderr);
  if (run.status !== 0) throw delegateError(run);
  if (verb !== 'ADD') return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(run.stdout);
  } catch (e) {
    throw new DelegateOutputError(type, file, run.stdout, errorMessage(e));
  }
  try {
    return parseResult(raw, stdinVersion(stdin));
  } catch (e) {
    if (e instanceof CniResultError) throw new DelegateOutputError(type, file, run.stdout, e.message);
    throw e;
  }
}

/** ADD through delegate `type` with config `stdin` (for IPAM: `req.stdin` unchanged). */
export async function delegateAdd(req: CniRequest, type: string, stdin: string): Promise<CniResult> {
  const result = await delegate(req, type, stdin, 'ADD');
  if (!result) throw new CniError(ErrorCode.Internal, `delegate ${type} returned no result`);
  return result;
}

export async function delegateDel(req: CniRequest, type: string, stdin: string): Promise<void> {
  await delegate(req, type, stdin, 'DEL');
}

export async function delegateCheck(req: CniRequest, type: string, stdin: string): Promise<void> {
  await delegate(req, type, stdin, 'CHECK');
}

export async function delegateGC(req: CniRequest, type: string, stdin: string): Promise<void> {
  await delegate(req, type, stdin, 'GC');
}

export async function delegateStatus(req: CniRequest, type: string, stdin: string): Promise<void> {
  await delegate(req, type, stdin, 'STATUS');
}

/** The delegates a main plugin uses for its IPAM: found through CNI_PATH (in-process when registered). */
export const cniPathDelegates: Delegates = {
  add: delegateAdd,
  del: delegateDel,
  check: delegateCheck,
  gc: delegateGC,
  status: delegateStatus,
};
