// metav1.Status bodies shaped as kube-apiserver serializes them (field order included), so clients
// that parse `reason`/`code`/`details` see what they would see from a real cluster.
import type { JsonObject } from './json.js';

export type StatusReason =
  | 'Unauthorized'
  | 'Forbidden'
  | 'NotFound'
  | 'AlreadyExists'
  | 'Conflict'
  | 'Gone'
  | 'Invalid'
  | 'BadRequest'
  | 'MethodNotAllowed'
  | 'UnsupportedMediaType'
  | 'TooManyRequests'
  | 'InternalError'
  | 'Expired'
  | 'ServiceUnavailable'
  | 'Timeout'
  | 'Unknown';

export interface StatusDetails {
  readonly name?: string;
  readonly group?: string;
  readonly kind?: string;
  readonly causes?: readonly JsonObject[];
  readonly retryAfterSeconds?: number;
}

export function failure(code: number, reason: StatusReason, message: string, details?: StatusDetails): JsonObject {
  const s: JsonObject = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason };
  if (details !== undefined) {
    const d: JsonObject = {};
    if (details.name !== undefined) d.name = details.name;
    if (details.group !== undefined) d.group = details.group;
    if (details.kind !== undefined) d.kind = details.kind;
    if (details.causes !== undefined) d.causes = [...details.causes];
    if (details.retryAfterSeconds !== undefined) d.retryAfterSeconds = details.retryAfterSeconds;
    s.details = d;
  }
  s.code = code;
  return s;
}

export const notFound = (resource: string, name: string): JsonObject =>
  failure(404, 'NotFound', `${resource} "${name}" not found`, { name, kind: resource });

export const conflict = (resource: string, name: string): JsonObject =>
  failure(
    409,
    'Conflict',
    `Operation cannot be fulfilled on ${resource} "${name}": the object has been modified; please apply your changes to the latest version and try again`,
    { name, kind: resource },
  );

export const alreadyExists = (resource: string, name: string): JsonObject =>
  failure(409, 'AlreadyExists', `${resource} "${name}" already exists`, { name, kind: resource });

export const unauthorized = (): JsonObject => failure(401, 'Unauthorized', 'Unauthorized');

export const forbidden = (user: string, verb: string, resource: string): JsonObject =>
  failure(
    403,
    'Forbidden',
    `${resource} is forbidden: User "${user}" cannot ${verb} resource "${resource}" in API group "" at the cluster scope`,
    { kind: resource },
  );

export const badRequest = (message: string): JsonObject => failure(400, 'BadRequest', message);

/** What the watch cache sends (as an ERROR event) for a watch from a compacted resourceVersion. */
export const expired = (message: string): JsonObject => failure(410, 'Expired', message);

/** Patch media types a built-in resource accepts, in the order the server lists them. */
export const PATCH_TYPES = [
  'application/json-patch+json',
  'application/merge-patch+json',
  'application/strategic-merge-patch+json',
  'application/apply-patch+yaml',
] as const;

export const unsupportedMediaType = (): JsonObject =>
  failure(
    415,
    'UnsupportedMediaType',
    `the body of the request was in an unknown format - accepted media types include: ${PATCH_TYPES.join(', ')}`,
  );

/** A generic status for an injected failure code, with the reason the server uses for that code. */
export function forCode(code: number, message?: string): JsonObject {
  const reasons: Record<number, StatusReason> = {
    400: 'BadRequest',
    401: 'Unauthorized',
    403: 'Forbidden',
    404: 'NotFound',
    405: 'MethodNotAllowed',
    409: 'Conflict',
    410: 'Gone',
    415: 'UnsupportedMediaType',
    422: 'Invalid',
    429: 'TooManyRequests',
    500: 'InternalError',
    503: 'ServiceUnavailable',
    504: 'Timeout',
  };
  const reason = reasons[code] ?? 'Unknown';
  const text =
    message ??
    (code === 500
      ? 'Internal error occurred: injected failure'
      : `the server responded with the status code ${code} but did not return more information`);
  const details: StatusDetails | undefined = code === 429 || code === 503 ? { retryAfterSeconds: 1 } : undefined;
  return failure(code, reason, text, details);
}
