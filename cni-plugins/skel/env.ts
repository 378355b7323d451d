// The CNI_* environment, read and validated in the reference skel's order (pkg/skel
// getCmdArgsFromEnv): variables are visited in a fixed order; a required one that is set is
// validated on the spot (so a bad CNI_CONTAINERID wins over a missing CNI_IFNAME), the missing
// ones are reported together at the end with code 4.
//
// Beyond the reference: CNI_IFNAME must also be one word of every text protocol weft writes and
// name exactly one device (no control characters, `#`, quotes, backslash, `;`, `%`: src/util/
// names.ts ifNameProblem), and a set CNI_NETNS must be an absolute path without control
// characters (netnsPathProblem) — both code 4, naming the value.
import { Buffer } from 'node:buffer';
import { CNI_NAME, ifNameProblem, netnsPathProblem } from '../../src/util/names.js';
import { CniError, ErrorCode } from './types.js';

export type Env = Readonly<Record<string, string | undefined>>;

/** Names of containers and networks (reference utils.ValidateContainerID / ValidateNetworkName). */
export const CNI_NAME_RE = CNI_NAME;

/** The kernel's IFNAMSIZ - 1. */
export const MAX_IFNAME_BYTES = 15;

// Go's unicode.IsSpace: ASCII blanks, NEL, NBSP and the Unicode White_Space category
// (JS's \s differs: it has U+FEFF and lacks U+0085).
const GO_SPACE = /[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]/u;

export function validateContainerId(id: string): void {
  if (id === '') throw new CniError(ErrorCode.UnknownContainer, 'missing containerID');
  if (!CNI_NAME_RE.test(id)) throw new CniError(ErrorCode.InvalidEnvironment, 'invalid characters in containerID', id);
}

export function validateInterfaceName(name: string): void {
  if (name.length === 0) throw new CniError(ErrorCode.InvalidEnvironment, 'interface name is empty');
  if (Buffer.byteLength(name, 'utf8') > MAX_IFNAME_BYTES) {
    throw new CniError(
      ErrorCode.InvalidEnvironment,
      'interface name is too long',
      `interface name should be less than ${MAX_IFNAME_BYTES + 1} characters`,
    );
  }
  if (name === '.' || name === '..') throw new CniError(ErrorCode.InvalidEnvironment, 'interface name is . or ..');
  if (name.includes('/') || name.includes(':') || GO_SPACE.test(name)) {
    throw new CniError(ErrorCode.InvalidEnvironment, 'interface name contains / or : or whitespace characters');
  }
  // What the reference lets through but a batch line (or a terminal) would read specially.
  const problem = ifNameProblem(name);
  if (problem !== null) throw new CniError(ErrorCode.InvalidEnvironment, `invalid interface name ${JSON.stringify(name)}: ${problem}`);
}

/** A set CNI_NETNS (reference: not checked until the plugin opens it). */
export function validateNetnsPath(path: string): void {
  const problem = netnsPathProblem(path);
  if (problem !== null) throw new CniError(ErrorCode.InvalidEnvironment, `invalid CNI_NETNS ${JSON.stringify(path)}: ${problem}`);
}

export function validateNetworkName(name: string): void {
  if (name === '') throw new CniError(ErrorCode.InvalidNetworkConfig, 'missing network name');
  if (!CNI_NAME_RE.test(name)) throw new CniError(ErrorCode.InvalidNetworkConfig, 'invalid characters found in network name', name);
}

/**
 * CNI_ARGS "K=V;K2=V2" as the reference types.LoadArgs splits it: every pair must have exactly one
 * "="; a later duplicate key wins. Unknown keys are the plugin's business (IgnoreUnknown), so all
 * pairs are kept. A malformed pair is the reference's plain error, i.e. code 999.
 */
export function parseCniArgs(text: string): Map<string, string> {
  const out = new Map<string, string>();
  if (text === '') return out;
  for (const pair of text.split(';')) {
    const kv = pair.split('=');
    if (kv.length !== 2) throw new CniError(ErrorCode.Internal, `ARGS: invalid pair ${JSON.stringify(pair)}`);
    out.set(kv[0]!, kv[1]!);
  }
  return out;
}

/** CNI_PATH split on ':'; empty entries are dropped (Go would look them up relative to the cwd). */
export function splitCniPath(text: string): string[] {
  return text.split(':').filter((p) => p !== '');
}

/** The raw CNI_* values after the reference skel's presence and format checks. */
export interface CniEnv {
  /** As given; not yet checked against the known verbs (the reference does that after stdin). */
  readonly command: string;
  readonly containerId: string;
  readonly netns: string;
  readonly ifname: string;
  readonly args: string;
  readonly path: string;
  readonly netnsOverride: string;
}

type Var = keyof CniEnv;

const ATTACH = new Set(['ADD', 'CHECK', 'DEL']);

// Which verbs require each variable; a validated one is checked when set for the verbs in
// `checked` (default: those that require it): CONTAINERID and IFNAME as the reference, NETNS also
// for a DEL that gives one.
const VARS: ReadonlyArray<{ name: string; key: Var; required: ReadonlySet<string>; validate?: (v: string) => void; checked?: ReadonlySet<string> }> = [
  { name: 'CNI_COMMAND', key: 'command', required: new Set(['ADD', 'CHECK', 'DEL', 'GC', 'STATUS']) },
  { name: 'CNI_CONTAINERID', key: 'containerId', required: ATTACH, validate: validateContainerId },
  { name: 'CNI_NETNS', key: 'netns', required: new Set(['ADD', 'CHECK']), validate: validateNetnsPath, checked: ATTACH },
  { name: 'CNI_IFNAME', key: 'ifname', required: ATTACH, validate: validateInterfaceName },
  { name: 'CNI_ARGS', key: 'args', required: new Set() },
  { name: 'CNI_PATH', key: 'path', required: new Set(['ADD', 'CHECK', 'DEL', 'GC', 'STATUS']) },
  { name: 'CNI_NETNS_OVERRIDE', key: 'netnsOverride', required: new Set() },
];

/** Reads the CNI_* variables; throws CniError 3/4 exactly as the reference skel does. */
export function readCniEnv(env: Env): CniEnv {
  const command = env.CNI_COMMAND ?? '';
  const values: Record<Var, string> = { command, containerId: '', netns: '', ifname: '', args: '', path: '', netnsOverride: '' };
  const missing: string[] = [];
  for (const v of VARS) {
    const value = env[v.name] ?? '';
    values[v.key] = value;
    const required = v.required.has(command);
    if (value === '') {
      if (required || v.name === 'CNI_COMMAND') missing.push(v.name);
    } else if (v.validate && (v.checked ?? v.required).has(command)) {
      v.validate(value);
    }
  }
  if (missing.length > 0) {
    throw new CniError(ErrorCode.InvalidEnvironment, `required env variables [${missing.join(',')}] missing`);
  }
  return values;
}

/** CNI_NETNS_OVERRIDE "1"/"true" (any case) turns off the "CNI_NETNS is our own netns" check. */
export function netnsOverridden(e: CniEnv): boolean {
  return e.netnsOverride === '1' || e.netnsOverride.toUpperCase() === 'TRUE';
}
