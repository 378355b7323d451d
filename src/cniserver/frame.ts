// The CNI server's wire protocol, shared with the native client (cni-plugins/native): one request
// and one reply per unix stream connection, each a frame:
//
//   4-byte big-endian unsigned length N, then N bytes of UTF-8 JSON.
//
// Request (N ≤ MAX_FRAME_BYTES, stdin ≤ MAX_STDIN_BYTES):
//   {"v":1,"plugin":"<name>","env":{"CNI_COMMAND":"ADD",...only keys starting with CNI_},"stdin":"<config>",
//    "netns":"net:[4026531840]"}
// `netns` (optional) is the client's network namespace as /proc/self/ns/net reads: a server in
// another one answers serving:false, since the plugins would act on the server's namespace.
// Reply:
//   {"v":1,"status":<exit status>,"stdout":"...","stderr":"..."}   what the plugin process would have done
//   {"v":1,"serving":false}                                         not served here (weftd stopping, busy, or
//                                                                   another netns): run the bundle
//
// A request the server refuses (bad frame, bad JSON, unknown version, unknown plugin, oversized)
// still gets a status reply: exit status 1 and a CNI error on stdout,
//   {"cniVersion":"1.0.0","code":<code>,"msg":"...","details":"..."}
// with these codes: 1 unsupported protocol version; 4 bad env or unknown plugin; 5 frame or stdin
// too large; 6 not a frame of JSON of the request's shape.
// Everything here is pure: the server (server.ts) owns the sockets.
import { goJSON } from '../../cni-plugins/skel/convert.js';
import { type CniError, ErrorCode } from '../../cni-plugins/skel/types.js';

export const PROTOCOL_VERSION = 1;
export const HEADER_BYTES = 4;
/** The largest config (stdin) a request may carry, in UTF-8 bytes. */
export const MAX_STDIN_BYTES = 1024 * 1024;
/** The largest request body: stdin plus room for the env and JSON escaping of ordinary configs. */
export const MAX_FRAME_BYTES = MAX_STDIN_BYTES + 64 * 1024;
/** The largest reply body the server sends (the client refuses larger ones). */
export const MAX_REPLY_BYTES = MAX_FRAME_BYTES;
/** Env variables a request may carry (the CNI spec defines 7). */
export const MAX_ENV_ENTRIES = 64;

/** Plugin names the server could serve: what a CNI type looks like, no path characters. */
const PLUGIN_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
/**
 * Env keys: CNI_ and anything an environment variable name can hold (the client forwards every
 * CNI_* variable of the runtime's environment; the plugins read only the spec's). Nothing else is
 * passed to a plugin.
 */
const ENV_KEY = /^CNI_[^=]{0,252}$/;

/** The CNI error version of the server's own errors (the plugins' errors keep the reference's shape). */
export const SERVER_ERROR_CNI_VERSION = '1.0.0';

/** A request the server refuses; `code` is the CNI error code of the reply. */
export class ProtocolError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly details = '',
  ) {
    super(message);
    this.name = 'ProtocolError';
  }
}

export interface ServerRequest {
  readonly plugin: string;
  /** Only CNI_* keys, string values without NUL. */
  readonly env: Readonly<Record<string, string>>;
  readonly stdin: string;
  /** The client's network namespace (`net:[inode]`), when it sent one. */
  readonly netns?: string;
}

const NETNS = /^net:\[[0-9]{1,20}\]$/;

export type Reply =
  | { readonly v: typeof PROTOCOL_VERSION; readonly status: number; readonly stdout: string; readonly stderr: string }
  | { readonly v: typeof PROTOCOL_VERSION; readonly serving: false };

/** What the bytes received so far hold. */
export type FrameState =
  | { readonly kind: 'incomplete' }
  /** The header announces more than the limit: refuse without reading the body. */
  | { readonly kind: 'oversize'; readonly length: number }
  | { readonly kind: 'complete'; readonly body: Buffer };

/** Reads one frame from the start of `buf` (everything received so far on a connection). */
export function readFrame(buf: Buffer, maxBytes = MAX_FRAME_BYTES): FrameState {
  if (buf.length < HEADER_BYTES) return { kind: 'incomplete' };
  const length = buf.readUInt32BE(0);
  if (length > maxBytes) return { kind: 'oversize', length };
  if (buf.length < HEADER_BYTES + length) return { kind: 'incomplete' };
  return { kind: 'complete', body: buf.subarray(HEADER_BYTES, HEADER_BYTES + length) };
}

/** A frame of `value` as JSON. Throws RangeError when the body would exceed `maxBytes`. */
export function encodeFrame(value: unknown, maxBytes = MAX_REPLY_BYTES): Buffer {
  const body = Buffer.from(JSON.stringify(value), 'utf8');
  if (body.length > maxBytes) throw new RangeError(`frame body of ${body.length} bytes exceeds ${maxBytes}`);
  const header = Buffer.alloc(HEADER_BYTES);
  header.writeUInt32BE(body.length, 0);
  return Buffer.concat([header, body]);
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A value for a message: JSON, cut short. */
function shown(v: unknown): string {
  let s: string;
  try {
    s = JSON.stringify(v) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

/** Decodes and validates a request body. Throws ProtocolError. */
export function parseRequestBody(body: Uint8Array): ServerRequest {
  let text: string;
  try {
    text = utf8.decode(body);
  } catch {
    throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: not UTF-8');
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: not JSON', e instanceof Error ? e.message : '');
  }
  if (!isRecord(doc)) throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: not a JSON object');
  if (doc.v === undefined) throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: no protocol version "v"');
  if (doc.v !== PROTOCOL_VERSION) {
    throw new ProtocolError(ErrorCode.IncompatibleVersion, `unsupported CNI server protocol version ${shown(doc.v)}`, `this weftd speaks version ${PROTOCOL_VERSION}`);
  }
  const { plugin, env, stdin, netns } = doc;
  if (typeof plugin !== 'string') throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: "plugin" must be a string');
  if (!PLUGIN_NAME.test(plugin)) throw new ProtocolError(ErrorCode.InvalidEnvironment, `invalid plugin name ${shown(plugin)}`);
  if (!isRecord(env)) throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: "env" must be an object');
  if (typeof stdin !== 'string') throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid request: "stdin" must be a string');
  if (netns !== undefined && (typeof netns !== 'string' || !NETNS.test(netns))) {
    throw new ProtocolError(ErrorCode.DecodeFailure, `invalid request: "netns" must look like net:[inode], got ${shown(netns)}`);
  }
  const stdinBytes = Buffer.byteLength(stdin, 'utf8');
  if (stdinBytes > MAX_STDIN_BYTES) {
    throw new ProtocolError(ErrorCode.IOFailure, `network config too large: ${stdinBytes} bytes`, `at most ${MAX_STDIN_BYTES} bytes`);
  }
  const keys = Object.keys(env);
  if (keys.length > MAX_ENV_ENTRIES) throw new ProtocolError(ErrorCode.InvalidEnvironment, `too many env variables: ${keys.length}`, `at most ${MAX_ENV_ENTRIES}`);
  const out: Record<string, string> = Object.create(null) as Record<string, string>;
  for (const key of keys) {
    if (!ENV_KEY.test(key) || key.includes('\0')) throw new ProtocolError(ErrorCode.InvalidEnvironment, `invalid env variable ${shown(key)}: only CNI_* variables are forwarded`);
    const value = env[key];
    if (typeof value !== 'string') throw new ProtocolError(ErrorCode.InvalidEnvironment, `env variable ${key} must be a string`);
    if (value.includes('\0')) throw new ProtocolError(ErrorCode.InvalidEnvironment, `env variable ${key} contains a NUL character`);
    out[key] = value;
  }
  return { plugin, env: { ...out }, stdin, ...(netns !== undefined ? { netns } : {}) };
}

/** The CNI error JSON of a refused request (the reply's stdout). */
export function serverErrorText(code: number, msg: string, details = ''): string {
  return goJSON({ cniVersion: SERVER_ERROR_CNI_VERSION, code, msg, ...(details ? { details } : {}) });
}

export function statusReply(status: number, stdout: string, stderr = ''): Reply {
  return { v: PROTOCOL_VERSION, status, stdout, stderr };
}

/** Exit status 1 with the server's CNI error on stdout. */
export function errorReply(e: ProtocolError | CniError): Reply {
  return statusReply(1, serverErrorText(e.code, e.message, e.details));
}

export const NOT_SERVING: Reply = { v: PROTOCOL_VERSION, serving: false };

/** Decodes a reply body (for clients: tests, `weft`); throws ProtocolError when it is not one. */
export function parseReplyBody(body: Uint8Array): Reply {
  let doc: unknown;
  try {
    doc = JSON.parse(utf8.decode(body));
  } catch {
    throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid reply: not UTF-8 JSON');
  }
  if (!isRecord(doc) || doc.v !== PROTOCOL_VERSION) throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid reply: not a version 1 object');
  if (doc.serving === false) return NOT_SERVING;
  const { status, stdout, stderr } = doc;
  if (typeof status !== 'number' || !Number.isInteger(status) || status < 0 || status > 255) {
    throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid reply: "status" must be an integer 0..255');
  }
  if (typeof stdout !== 'string' || typeof stderr !== 'string') throw new ProtocolError(ErrorCode.DecodeFailure, 'invalid reply: "stdout" and "stderr" must be strings');
  return statusReply(status, stdout, stderr);
}
