// The flannel meta plugin's verbs: read subnet.env, build a bridge + host-local config from it
// (delegate-config.ts), keep that config per container (state.ts) and hand every verb to the
// delegate. The delegate functions are injected (plugin.ts passes the real ones), so this logic
// is unit-tested without spawning anything. Differences from flannel's plugin are deliberate and
// noted where they happen.
import type { JsonValue } from '../../src/subnet/lease.js';
import { toCniError } from '../skel/run.js';
import { CniError, ErrorCode, type CniPlugin, type CniRequest, type CniResult, type Delegates as SkelDelegates } from '../skel/types.js';
import {
  buildDelegateConfig,
  delegateType,
  FlannelConfigError,
  goJson,
  isJsonObject,
  parseDataDir,
  parseFlannelNetConf,
  renderDelegateConfig,
  type FlannelNetConf,
  type GoObject,
  type JsonObject,
} from './delegate-config.js';
import { collectGarbage, readState, removeState, StateFileError, writeState } from './state.js';
import { leftAloneLine, warnOnStderr } from '../lib/owned-files.js';
import { SubnetEnvError } from '../../src/subnetenv/format.js';
import { loadSubnetEnv } from '../../src/subnetenv/read.js';
import { errorMessage } from '../../src/util/errors.js';

export type Delegates = SkelDelegates;

/** The request config exactly as sent (req.config has prevResult already converted). */
function rawConfig(req: CniRequest): JsonObject {
  let raw: unknown;
  try {
    raw = JSON.parse(req.stdin);
  } catch (e) {
    throw new CniError(ErrorCode.DecodeFailure, `failed to parse network config: ${errorMessage(e)}`);
  }
  if (!isJsonObject(raw)) throw new CniError(ErrorCode.DecodeFailure, 'network config must be a JSON object');
  return raw;
}

function asCniError(e: unknown): CniError {
  if (e instanceof CniError) return e;
  if (e instanceof FlannelConfigError) return new CniError(ErrorCode.InvalidNetworkConfig, e.message);
  if (e instanceof StateFileError) return new CniError(ErrorCode.IOFailure, e.message);
  if (e instanceof SubnetEnvError) return subnetEnvCniError(e);
  // Also recognises a CniError thrown by another copy of the skel module (in-process delegate).
  return toCniError(e);
}

/**
 * A missing subnet.env means weftd has no lease yet: code 11 ("try again later") tells the
 * runtime to retry, where flannel's plugin reports a plain error (999). Unreadable → 5, bad
 * content → 999 (nothing the runtime can fix by itself).
 */
function subnetEnvCniError(e: SubnetEnvError): CniError {
  switch (e.problem) {
    case 'missing':
      return new CniError(ErrorCode.TryAgainLater, e.message);
    case 'unreadable':
      return new CniError(ErrorCode.IOFailure, e.message);
    default:
      return new CniError(ErrorCode.Internal, e.message, e.variables.length > 0 ? `variables: ${e.variables.join(', ')}` : '');
  }
}

function delegateError(verb: string, type: string, e: unknown): CniError {
  const inner = asCniError(e);
  return new CniError(inner.code, `failed to delegate ${verb} to ${type}: ${inner.message}`, inner.details);
}

/** Runs `fn` (synchronous or not) with its failure, thrown or rejected, as a CniError rejection. */
async function guard<T>(fn: () => T | Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw asCniError(e);
  }
}

async function delegateConfigFor(c: FlannelNetConf): Promise<GoObject> {
  return buildDelegateConfig(c, await loadSubnetEnv(c.subnetFile));
}

interface StoredConfig {
  readonly text: string;
  readonly object: JsonObject;
  readonly type: string;
}

/** The stored delegate config, or null when it is not a JSON object with a string `type`. */
function parseStored(text: string): StoredConfig | null {
  try {
    const object: unknown = JSON.parse(text);
    if (!isJsonObject(object) || typeof object.type !== 'string' || object.type === '') return null;
    return { text, object, type: object.type };
  } catch {
    return null;
  }
}

/**
 * The stored bytes for a replay, with the runtime's `prevResult` added when the request carries
 * one at the same cniVersion. CHECK needs it (the bridge rejects CHECK without it) and DEL may use
 * it (spec: DEL gets the ADD result); flannel replays DEL without it and does not CHECK at all.
 */
function replayConfig(stored: StoredConfig, raw: JsonObject): string {
  const prev: JsonValue | undefined = raw.prevResult;
  if (!isJsonObject(prev) || raw.cniVersion !== stored.object.cniVersion) return stored.text;
  return goJson({ ...stored.object, prevResult: prev });
}

/**
 * The container IDs in a GC request's `cni.dev/valid-attachments` (or the legacy key); null when
 * the request has neither, so nothing is known to be garbage (host-local does the same).
 */
function validContainerIds(raw: JsonObject): Set<string> | null {
  const key = raw['cni.dev/valid-attachments'] !== undefined ? 'cni.dev/valid-attachments' : 'cni.dev/attachments';
  const list = raw[key];
  if (list === undefined || list === null) return null;
  const bad = (what: string): never => {
    throw new CniError(ErrorCode.InvalidNetworkConfig, `${key} must be a list of {"containerID": string, "ifname": string}, got ${what}`);
  };
  if (!Array.isArray(list)) return bad(JSON.stringify(list));
  const ids = new Set<string>();
  for (const a of list) {
    if (!isJsonObject(a) || typeof a.containerID !== 'string') return bad(JSON.stringify(a));
    ids.add(a.containerID);
  }
  return ids;
}

async function add(d: Delegates, req: CniRequest): Promise<CniResult> {
  const raw = rawConfig(req);
  const { dataDir, type, bytes } = await guard(async () => {
    const c = parseFlannelNetConf(raw);
    const config = await delegateConfigFor(c);
    return { dataDir: c.dataDir, type: delegateType(config), bytes: renderDelegateConfig(config) };
  });
  // Written before the delegate runs (as flannel does) so that whatever the delegate manages to
  // create before failing, or if this process is killed mid-ADD, a DEL can replay the config.
  await guard(() => writeState(dataDir, req.containerId, bytes));
  try {
    return await d.add(req, type, bytes);
  } catch (e) {
    // Roll back now rather than leave it all to the runtime's DEL (plugins#426 left the file);
    // if the rollback fails the state stays, so the runtime's DEL can still replay it.
    try {
      await d.del(req, type, bytes);
      removeState(dataDir, req.containerId);
    } catch {
      // keep the state for the runtime's DEL
    }
    throw delegateError('add', type, e);
  }
}

async function del(d: Delegates, req: CniRequest): Promise<void> {
  const raw = rawConfig(req);
  // DEL only needs dataDir: a config that no longer validates must not block pod deletion.
  const dataDir = await guard(() => parseDataDir(raw));
  const text = await guard(() => readState(dataDir, req.containerId));
  if (text === null) return; // never added, or already deleted
  const stored = parseStored(text);
  if (stored === null) {
    // Empty or corrupt (flannel#1662): nothing can be replayed; drop it so it cannot linger.
    await guard(() => removeState(dataDir, req.containerId));
    return;
  }
  try {
    await d.del(req, stored.type, replayConfig(stored, raw));
  } catch (e) {
    // Keep the state so the runtime's retry replays it (flannel removes it regardless).
    throw delegateError('del', stored.type, e);
  }
  await guard(() => removeState(dataDir, req.containerId));
}

async function check(d: Delegates, req: CniRequest): Promise<void> {
  const raw = rawConfig(req);
  const dataDir = await guard(() => parseDataDir(raw));
  const text = await guard(() => readState(dataDir, req.containerId));
  if (text === null) {
    throw new CniError(
      ErrorCode.UnknownContainer,
      `no flannel state for container ${req.containerId} in ${dataDir}: it was never added or already deleted`,
    );
  }
  const stored = parseStored(text);
  if (stored === null) {
    throw new CniError(ErrorCode.Internal, `flannel state for container ${req.containerId} in ${dataDir} is corrupt`);
  }
  try {
    await d.check(req, stored.type, replayConfig(stored, raw));
  } catch (e) {
    throw delegateError('check', stored.type, e);
  }
}

async function gc(d: Delegates, warn: (line: string) => void, req: CniRequest): Promise<void> {
  const raw = rawConfig(req);
  const valid = validContainerIds(raw);
  if (valid === null) return;
  // State of attachments the runtime no longer knows is dead weight: drop it, and the temp files
  // of their interrupted writes. Only files that are flannel state by name and by content: a
  // dataDir shared with anything else (host-local's store, a mistyped path) keeps all the rest,
  // with one warning naming what looked like ours. Needs only dataDir.
  await guard(() => {
    const dataDir = parseDataDir(raw);
    const { leftAlone } = collectGarbage(dataDir, valid);
    const line = leftAloneLine('flannel', dataDir, 'flannel state (a container ID)', leftAlone);
    if (line !== '') warn(line);
  });
  // The delegate (host-local) frees what belongs to the invalid attachments.
  const { type, bytes } = await guard(async () => {
    const config = await delegateConfigFor(parseFlannelNetConf(raw));
    for (const key of ['cni.dev/valid-attachments', 'cni.dev/attachments']) {
      const v = raw[key];
      if (v !== undefined) config[key] = v;
    }
    return { type: delegateType(config), bytes: renderDelegateConfig(config) };
  });
  try {
    await d.gc(req, type, bytes);
  } catch (e) {
    throw delegateError('gc', type, e);
  }
}

async function status(d: Delegates, req: CniRequest): Promise<void> {
  const raw = rawConfig(req);
  const c = await guard(() => parseFlannelNetConf(raw));
  let config: GoObject;
  try {
    config = await delegateConfigFor(c);
  } catch (e) {
    // No usable subnet.env: weftd/flanneld is not ready, so ADD cannot be serviced.
    if (e instanceof SubnetEnvError) throw new CniError(ErrorCode.PluginNotAvailable, e.message);
    throw asCniError(e);
  }
  const type = delegateType(config);
  try {
    await d.status(req, type, renderDelegateConfig(config));
  } catch (e) {
    throw delegateError('status', type, e);
  }
}

export interface FlannelPluginOptions {
  /** Where GC's one line about files it left alone goes (default: stderr). */
  readonly warn?: (line: string) => void;
}

/** Builds the plugin over a set of delegate functions (the real ones, or fakes in unit tests). */
export function createFlannelPlugin(d: Delegates, opts: FlannelPluginOptions = {}): CniPlugin {
  const warn = opts.warn ?? warnOnStderr;
  return {
    name: 'flannel',
    add: (req) => add(d, req),
    del: (req) => del(d, req),
    check: (req) => check(d, req),
    gc: (req) => gc(d, warn, req),
    status: (req) => status(d, req),
  };
}
