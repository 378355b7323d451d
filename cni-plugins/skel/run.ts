// The plugin entry point: env + stdin → request → the plugin's verb handler → stdout and exit
// status, with the reference skel's checks, order and messages (containernetworking/cni pkg/skel):
//
//  1. CNI_* env (env.ts): missing → code 4; bad CNI_CONTAINERID / CNI_IFNAME → 3/4.
//     No CNI_COMMAND at all → an "about" text on stderr and exit 0, as the reference.
//  2. VERSION: prints `{"cniVersion":"1.1.0","supportedVersions":[…]}` + "\n"; stdin is not read.
//  3. stdin: bad JSON → 6; no `name` → 7; a name with bad characters → 7.
//  4. unknown CNI_COMMAND → 4 (after the stdin checks, as the reference).
//  5. version gates: ADD/DEL need the config version among the plugin's (exact string) → else 1
//     "incompatible CNI versions"; CHECK needs ≥ 0.4.0, GC/STATUS ≥ 1.1.0 → else 1
//     "config version does not allow X". A config without cniVersion is 0.1.0, and weft does not
//     support 0.1.0/0.2.0 (the old ip4/ip6 result), so those get code 1.
//  6. ADD/DEL refuse a CNI_NETNS that is the plugin's own netns (code 8) unless
//     CNI_NETNS_OVERRIDE is 1/true. The reference checks this after running the verb; weft checks
//     before, so nothing is done to the host's netns.
//  7. prevResult (any supported version) → 1.1.0 shape; unparsable → 999 "could not parse
//     prevResult: …" (what the reference plugins return). CNI_ARGS parsed; bad pair → 999.
//  8. handler: a CniError is printed as is, any other error as code 999 with its message.
//     ADD prints its result converted to the config's cniVersion; other verbs print nothing.
//     A plugin without gc/status handlers succeeds for GC/STATUS (reference skel behaviour).
// Errors are `{code,msg,details?}` (no cniVersion, as the reference) on stdout, exit status 1.
import { readFileSync, statSync } from 'node:fs';
import { CniResultError, goJSON, formatResult, parseResult } from './convert.js';
import { netnsOverridden, parseCniArgs, readCniEnv, splitCniPath, validateNetworkName, type CniEnv, type Env } from './env.js';
import {
  CURRENT_VERSION,
  CniError,
  ErrorCode,
  SUPPORTED_VERSIONS,
  type CniCommand,
  type CniPlugin,
  type CniRequest,
  type CniResult,
  type NetConf,
} from './types.js';
import { checkSupported, versionAtLeast } from './version.js';
import { errnoCode, errorMessage } from '../../src/util/errors.js';

// Replaced by the bundler (cni-plugins/build.ts) with package.json's version.
declare const __WEFT_VERSION__: string | undefined;
const WEFT_VERSION = typeof __WEFT_VERSION__ === 'string' ? __WEFT_VERSION__ : 'dev';

const VERBS: readonly CniCommand[] = ['ADD', 'DEL', 'CHECK', 'GC', 'STATUS'];
/** The lowest config version each gated verb exists in. */
const VERB_FLOOR: Partial<Record<CniCommand, string>> = { CHECK: '0.4.0', GC: '1.1.0', STATUS: '1.1.0' };

function supportedOf(plugin: CniPlugin): readonly string[] {
  return plugin.supportedVersions ?? SUPPORTED_VERSIONS;
}

/** Decodes stdin like the reference validateConfig: an object with a valid `name`. */
function parseConfigObject(stdin: string): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = JSON.parse(stdin);
  } catch (e) {
    throw new CniError(ErrorCode.DecodeFailure, `error unmarshall network config: ${errorMessage(e)}`);
  }
  // Go decodes `null` into an empty struct (→ missing name); any other non-object is an error.
  if (raw === null) raw = {};
  if (typeof raw !== 'object' || Array.isArray(raw)) {
    const kind = Array.isArray(raw) ? 'array' : typeof raw;
    throw new CniError(ErrorCode.DecodeFailure, `error unmarshall network config: cannot unmarshal ${kind} into a network config object`);
  }
  const conf = raw as Record<string, unknown>;
  const name = conf.name ?? '';
  if (typeof name !== 'string') {
    throw new CniError(ErrorCode.DecodeFailure, `error unmarshall network config: "name" must be a string, got ${JSON.stringify(name)}`);
  }
  validateNetworkName(name);
  return conf;
}

/** The config's cniVersion as the reference ConfigDecoder reads it ("" → "0.1.0"). */
function configVersion(conf: Record<string, unknown>): string {
  const v = conf.cniVersion ?? '';
  if (typeof v !== 'string') {
    throw new CniError(ErrorCode.DecodeFailure, `decoding version from network config: "cniVersion" must be a string, got ${JSON.stringify(v)}`);
  }
  return v === '' ? '0.1.0' : v;
}

function gateVersion(command: CniCommand, version: string, supported: readonly string[]): void {
  const floor = VERB_FLOOR[command];
  if (floor !== undefined) {
    if (!versionAtLeast(version, floor)) throw new CniError(ErrorCode.IncompatibleVersion, `config version does not allow ${command}`);
    if (!supported.some((p) => versionAtLeast(p, version))) {
      throw new CniError(ErrorCode.IncompatibleVersion, `plugin version does not allow ${command}`);
    }
  }
  checkSupported(version, supported);
}

function buildRequest(e: CniEnv, env: Env, stdin: string, supported: readonly string[]): CniRequest {
  if (e.command === 'VERSION') {
    // VERSION has no config (stdin is ignored); a placeholder keeps CniRequest total.
    const config: NetConf = { cniVersion: CURRENT_VERSION, name: '', type: '' };
    return { command: 'VERSION', containerId: '', netns: '', ifname: '', args: new Map(), path: [], stdin: '', config, env };
  }
  const conf = parseConfigObject(stdin);
  if (!(VERBS as readonly string[]).includes(e.command)) {
    throw new CniError(ErrorCode.InvalidEnvironment, `unknown CNI_COMMAND: ${e.command}`);
  }
  const command = e.command as CniCommand;
  const version = configVersion(conf);
  gateVersion(command, version, supported);

  if (conf.type !== undefined && typeof conf.type !== 'string') {
    throw new CniError(ErrorCode.DecodeFailure, `error unmarshall network config: "type" must be a string, got ${JSON.stringify(conf.type)}`);
  }
  const config = { ...conf, cniVersion: version, type: conf.type ?? '' } as NetConf;
  if (conf.prevResult === undefined || conf.prevResult === null) {
    delete config.prevResult;
  } else {
    try {
      config.prevResult = parseResult(conf.prevResult, version);
    } catch (err) {
      if (!(err instanceof CniResultError)) throw err;
      throw new CniError(ErrorCode.Internal, `could not parse prevResult: ${err.message}`);
    }
  }
  // CNI_ARGS only means something to ADD/DEL/CHECK (the reference ignores it for GC/STATUS).
  const takesArgs = command === 'ADD' || command === 'DEL' || command === 'CHECK';
  return {
    command,
    containerId: e.containerId,
    netns: e.netns,
    ifname: e.ifname,
    args: takesArgs ? parseCniArgs(e.args) : new Map(),
    path: splitCniPath(e.path),
    stdin,
    config,
    env,
  };
}

/**
 * Validates env + stdin into a request, including the version gates against `supportedVersions`
 * (default: all of weft's). Throws CniError with the reference code and message.
 * For VERSION the returned request has a placeholder config and empty stdin.
 */
export function parseRequest(env: Env, stdin: string, supportedVersions: readonly string[] = SUPPORTED_VERSIONS): CniRequest {
  return buildRequest(readCniEnv(env), env, stdin, supportedVersions);
}

/** Refuses to run ADD/DEL against the plugin's own netns (the reference's ErrInvalidNetNS). */
function checkNotOwnNetns(e: CniEnv): void {
  if (e.netns === '' || netnsOverridden(e)) return;
  let target;
  let own;
  try {
    target = statSync(e.netns);
    own = statSync('/proc/self/ns/net');
  } catch {
    return; // a netns that cannot be opened is the plugin's to report (or fine on DEL)
  }
  if (target.dev === own.dev && target.ino === own.ino) {
    throw new CniError(ErrorCode.InvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same");
  }
}

/** What a verb produced, before printing. */
export type Outcome =
  | { readonly command: 'VERSION'; readonly text: string }
  | { readonly command: 'ADD'; readonly result: CniResult; readonly version: string }
  | { readonly command: 'DEL' | 'CHECK' | 'GC' | 'STATUS' };

export function versionText(plugin: CniPlugin): string {
  return `${goJSON({ cniVersion: CURRENT_VERSION, supportedVersions: [...supportedOf(plugin)] }, 0)}\n`;
}

/**
 * Runs one verb of `plugin` for env + stdin and returns what it produced; throws what the
 * reference would print as an error (CniError or any Error). Shared by the process entry and
 * in-process delegation so both apply the same checks.
 */
export async function execute(plugin: CniPlugin, env: Env, stdin: string): Promise<Outcome> {
  const e = readCniEnv(env);
  if (e.command === 'VERSION') return { command: 'VERSION', text: versionText(plugin) };
  const req = buildRequest(e, env, stdin, supportedOf(plugin));
  switch (req.command) {
    case 'ADD': {
      checkNotOwnNetns(e);
      const result = await plugin.add(req);
      return { command: 'ADD', result, version: req.config.cniVersion };
    }
    case 'DEL':
      checkNotOwnNetns(e);
      await plugin.del(req);
      return { command: 'DEL' };
    case 'CHECK':
      await plugin.check(req);
      return { command: 'CHECK' };
    case 'GC':
      if (plugin.gc) await plugin.gc(req);
      return { command: 'GC' };
    case 'STATUS':
      if (plugin.status) await plugin.status(req);
      return { command: 'STATUS' };
    default:
      throw new CniError(ErrorCode.InvalidEnvironment, `unknown CNI_COMMAND: ${req.command}`);
  }
}

/** Any thrown value as the error the runtime sees: a CniError as is, anything else as 999. */
export function toCniError(err: unknown): CniError {
  if (err instanceof CniError) return err;
  if (err instanceof Error) {
    // A CniError from another copy of this module (e.g. a second bundle in one process).
    const code = (err as { code?: unknown }).code;
    if (err.name === 'CniError' && typeof code === 'number') {
      const details = (err as { details?: unknown }).details;
      return new CniError(code, err.message, typeof details === 'string' ? details : '');
    }
    return new CniError(ErrorCode.Internal, err.message);
  }
  return new CniError(ErrorCode.Internal, String(err));
}

export interface InvokeOutput {
  readonly exitCode: number;
  readonly stdout: string;
  /** Only the "about" text (no CNI_COMMAND); plugins themselves never print. */
  readonly stderr: string;
}

function aboutText(plugin: CniPlugin): string {
  return `CNI ${plugin.name} plugin (weft ${WEFT_VERSION})\nCNI protocol versions supported: ${supportedOf(plugin).join(', ')}\n`;
}

/** The whole plugin run in-process: what it would print and its exit status. Never throws. */
export async function invoke(plugin: CniPlugin, env: Env, stdin: string): Promise<InvokeOutput> {
  if ((env.CNI_COMMAND ?? '') === '') return { exitCode: 0, stdout: '', stderr: aboutText(plugin) };
  try {
    const out = await execute(plugin, env, stdin);
    if (out.command === 'VERSION') return { exitCode: 0, stdout: out.text, stderr: '' };
    if (out.command === 'ADD') return { exitCode: 0, stdout: formatResult(out.result, out.version), stderr: '' };
    return { exitCode: 0, stdout: '', stderr: '' };
  } catch (err) {
    return { exitCode: 1, stdout: goJSON(toCniError(err).toJSON()), stderr: '' };
  }
}

/** Whether the reference would read stdin for this env (not for VERSION or an env error). */
function wantsStdin(env: Env): boolean {
  try {
    return readCniEnv(env).command !== 'VERSION';
  } catch {
    return false;
  }
}

async function readStdin(): Promise<string> {
  try {
    // One read(2) loop, no stream set-up: the cheapest way on a pipe or file.
    return readFileSync(0, 'utf8');
  } catch (err) {
    if (errnoCode(err) !== 'EAGAIN') throw err;
  }
  // A non-blocking stdin (inherited from some parents): fall back to the stream.
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/**
 * The process entry of a plugin bundle: reads process.env and stdin, runs the verb, writes the
 * result or error to stdout and sets process.exitCode. Never throws.
 */
export async function runPlugin(plugin: CniPlugin): Promise<void> {
  let out: InvokeOutput;
  try {
    const stdin = wantsStdin(process.env) ? await readStdin() : '';
    out = await invoke(plugin, process.env, stdin);
  } catch (err) {
    out = { exitCode: 1, stdout: goJSON(new CniError(ErrorCode.IOFailure, `error reading from stdin: ${errorMessage(err)}`).toJSON()), stderr: '' };
  }
  if (out.stderr) process.stderr.write(out.stderr);
  if (out.stdout) process.stdout.write(out.stdout);
  process.exitCode = out.exitCode;
}
