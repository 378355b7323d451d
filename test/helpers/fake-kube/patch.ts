// The three patch formats a kube-apiserver accepts for built-in types: JSON merge patch (RFC 7386),
// strategic merge patch (apimachinery's strategicpatch, with the Node schema's list strategies), and
// JSON patch (RFC 6902). Errors carry the HTTP status the real server answers with.
import { clone, deepEqual, isObject, type Json, type JsonObject } from './json.js';

/** A patch that cannot be applied; `status` is the HTTP code the real server uses for this failure. */
export class PatchError extends Error {
  constructor(
    message: string,
    readonly status: 400 | 422 | 500,
  ) {
    super(message);
    this.name = 'PatchError';
  }
}

// ---- RFC 7386 ----

export function mergePatch(target: Json | undefined, patch: Json): Json {
  if (!isObject(patch)) return clone(patch);
  const out: JsonObject = isObject(target) ? clone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

// ---- strategic merge patch ----

/** How a list field merges; fields not listed are replaced wholesale (the default for lists). */
export type ListStrategy = { readonly kind: 'mergeByKey'; readonly key: string } | { readonly kind: 'mergePrimitive' };

/** List strategies by dotted path; `[]` marks "inside an element of the list". */
export type SmpSchema = ReadonlyMap<string, ListStrategy>;

/** patchStrategy/patchMergeKey tags of k8s.io/api core/v1 Node and ObjectMeta that matter for a Node. */
export const NODE_SMP_SCHEMA: SmpSchema = new Map<string, ListStrategy>([
  ['metadata.finalizers', { kind: 'mergePrimitive' }],
  ['metadata.ownerReferences', { kind: 'mergeByKey', key: 'uid' }],
  ['spec.podCIDRs', { kind: 'mergePrimitive' }],
  ['status.conditions', { kind: 'mergeByKey', key: 'type' }],
  ['status.addresses', { kind: 'mergeByKey', key: 'type' }],
]);

const DIRECTIVE = '$patch';
const DELETE_PRIMITIVE = '$deleteFromPrimitiveList/';
const SET_ORDER = '$setElementOrder/';
const RETAIN_KEYS = '$retainKeys';

export function strategicMergePatch(original: JsonObject, patch: Json, schema: SmpSchema): JsonObject {
  if (!isObject(patch)) throw new PatchError('strategic merge patch must be a JSON object', 400);
  return smpMap(original, patch, schema, '');
}

function join(path: string, key: string): string {
  return path === '' ? key : `${path}.${key}`;
}

function smpMap(original: JsonObject, patch: JsonObject, schema: SmpSchema, path: string): JsonObject {
  const directive = patch[DIRECTIVE];
  if (directive === 'replace') {
    const out = clone(patch);
    delete out[DIRECTIVE];
    return out;
  }
  if (directive === 'delete') return {};
  if (directive !== undefined && directive !== 'merge') {
    throw new PatchError(`Unknown patch type: ${JSON.stringify(directive)} in map: ${JSON.stringify(patch)}`, 400);
  }
  const out = clone(original);
  const retain = patch[RETAIN_KEYS];
  if (retain !== undefined) {
    if (!Array.isArray(retain) || !retain.every((k) => typeof k === 'string')) {
      throw new PatchError('invalid patch: $retainKeys must be a list of strings', 400);
    }
    for (const k of Object.keys(out)) if (!retain.includes(k)) delete out[k];
  }
  const orders: [string, Json][] = [];
  for (const [k, v] of Object.entries(patch)) {
    if (k === DIRECTIVE || k === RETAIN_KEYS) continue;
    if (k.startsWith(SET_ORDER)) {
      orders.push([k.slice(SET_ORDER.length), v]);
      continue;
    }
    if (k.startsWith(DELETE_PRIMITIVE)) {
      const field = k.slice(DELETE_PRIMITIVE.length);
      if (!Array.isArray(v)) throw new PatchError(`invalid patch: ${k} must be a list`, 400);
      const cur = out[field];
      if (Array.isArray(cur)) out[field] = cur.filter((x) => !v.some((d) => deepEqual(d, x)));
      continue;
    }
    const fieldPath = join(path, k);
    if (v === null) {
      delete out[k];
    } else if (isObject(v)) {
      const cur = out[k];
      out[k] = smpMap(isObject(cur) ? cur : {}, v, schema, fieldPath);
    } else if (Array.isArray(v)) {
      const cur = out[k];
      out[k] = smpList(Array.isArray(cur) ? cur : [], v, schema, fieldPath);
    } else {
      out[k] = v;
    }
  }
  for (const [field, order] of orders) {
    const cur = out[field];
    if (!Array.isArray(cur)) continue;
    if (!Array.isArray(order)) throw new PatchError(`invalid patch: ${SET_ORDER}${field} must be a list`, 400);
    out[field] = applyOrder(cur, order, schema.get(join(path, field)));
  }
  return out;
}

function smpList(original: Json[], patch: Json[], schema: SmpSchema, path: string): Json[] {
  const strategy = schema.get(path);
  if (strategy === undefined) return clone(patch);
  if (strategy.kind === 'mergePrimitive') {
    const out = clone(original);
    for (const v of patch) if (!out.some((x) => deepEqual(x, v))) out.push(clone(v));
    return out;
  }
  const key = strategy.key;
  // `{"$patch":"replace"}` as an element: the rest of the patch list replaces the list.
  if (patch.some((e) => isObject(e) && e[DIRECTIVE] === 'replace')) {
    return patch.filter((e) => !(isObject(e) && e[DIRECTIVE] === 'replace')).map((e) => clone(e));
  }
  let out = clone(original);
  for (const item of patch) {
    if (!isObject(item)) throw new PatchError(`invalid patch: element of ${path} is not a map`, 400);
    const id = item[key];
    if (id === undefined) {
      // apimachinery wraps mergepatch.ErrNoMergeKey, which the server does not map to a 4xx.
      throw new PatchError(`map: ${JSON.stringify(item)} does not contain declared merge key: ${key}`, 500);
    }
    const idx = out.findIndex((e) => isObject(e) && deepEqual(e[key], id));
    if (item[DIRECTIVE] === 'delete') {
      if (idx >= 0) out = out.filter((_, i) => i !== idx);
      continue;
    }
    const existing = idx >= 0 ? out[idx] : undefined;
    const merged = smpMap(isObject(existing) ? existing : {}, item, schema, `${path}[]`);
    if (idx >= 0) out[idx] = merged;
    else out.push(merged);
  }
  return out;
}

/** `$setElementOrder`: the listed elements first, in that order, then the others in their order. */
function applyOrder(list: Json[], order: Json[], strategy: ListStrategy | undefined): Json[] {
  const keyOf = (e: Json): Json | undefined =>
    strategy?.kind === 'mergeByKey' ? (isObject(e) ? e[strategy.key] : undefined) : e;
  const orderKey = (o: Json): Json | undefined =>
    strategy?.kind === 'mergeByKey' ? (isObject(o) ? o[strategy.key] : undefined) : o;
  const rest = [...list];
  const out: Json[] = [];
  for (const o of order) {
    const want = orderKey(o);
    const idx = rest.findIndex((e) => deepEqual(keyOf(e), want));
    if (idx >= 0) out.push(...rest.splice(idx, 1));
  }
  return [...out, ...rest];
}

// ---- RFC 6902 ----

/** Splits a JSON pointer (RFC 6901) into unescaped tokens. */
function pointer(path: Json | undefined, op: string): string[] {
  if (typeof path !== 'string') throw new PatchError(`${op} operation missing "path"`, 422);
  if (path === '') return [];
  if (!path.startsWith('/')) throw new PatchError(`JSON pointer ${JSON.stringify(path)} must start with "/"`, 422);
  return path
    .slice(1)
    .split('/')
    .map((t) => t.replaceAll('~1', '/').replaceAll('~0', '~'));
}

function arrayIndex(arr: Json[], token: string, forInsert: boolean): number {
  if (forInsert && token === '-') return arr.length;
  if (!/^(0|[1-9][0-9]*)$/.test(token)) throw new PatchError(`invalid array index ${JSON.stringify(token)}`, 422);
  const i = Number(token);
  if (i > arr.length || (!forInsert && i === arr.length)) throw new PatchError(`array index ${i} out of bounds`, 422);
  return i;
}

/** The container of the pointer's last token, and that token. */
function parentOf(doc: Json, tokens: string[], path: string): { parent: Json; last: string } {
  const last = tokens[tokens.length - 1];
  if (last === undefined) throw new PatchError(`path ${JSON.stringify(path)} has no parent`, 422);
  let cur: Json = doc;
  for (const t of tokens.slice(0, -1)) {
    let next: Json | undefined;
    if (Array.isArray(cur)) next = cur[arrayIndex(cur, t, false)];
    else if (isObject(cur)) next = cur[t];
    if (next === undefined) throw new PatchError(`missing value at ${JSON.stringify(path)}`, 422);
    cur = next;
  }
  return { parent: cur, last };
}

function getAt(doc: Json, tokens: string[], path: string): Json {
  if (tokens.length === 0) return doc;
  const { parent, last } = parentOf(doc, tokens, path);
  let v: Json | undefined;
  if (Array.isArray(parent)) v = parent[arrayIndex(parent, last, false)];
  else if (isObject(parent)) v = Object.hasOwn(parent, last) ? parent[last] : undefined;
  if (v === undefined) throw new PatchError(`missing value at ${JSON.stringify(path)}`, 422);
  return v;
}

function removeAt(doc: Json, tokens: string[], path: string): Json {
  const { parent, last } = parentOf(doc, tokens, path);
  if (Array.isArray(parent)) return parent.splice(arrayIndex(parent, last, false), 1)[0] ?? null;
  if (isObject(parent) && Object.hasOwn(parent, last)) {
    const v = parent[last] ?? null;
    delete parent[last];
    return v;
  }
  throw new PatchError(`unable to remove nonexistent key ${JSON.stringify(path)}`, 422);
}

function addAt(doc: Json, tokens: string[], path: string, value: Json, replace: boolean): Json {
  if (tokens.length === 0) return value;
  const { parent, last } = parentOf(doc, tokens, path);
  if (Array.isArray(parent)) {
    const i = arrayIndex(parent, last, !replace);
    parent.splice(i, replace ? 1 : 0, value);
  } else if (isObject(parent)) {
    if (replace && !Object.hasOwn(parent, last)) throw new PatchError(`replace: missing key ${JSON.stringify(path)}`, 422);
    parent[last] = value;
  } else {
    throw new PatchError(`cannot add to a scalar at ${JSON.stringify(path)}`, 422);
  }
  return doc;
}

/** Applies an RFC 6902 patch; decode problems are 400, failures while applying (incl. `test`) 422. */
export function jsonPatch(doc: Json, ops: Json): Json {
  if (!Array.isArray(ops)) throw new PatchError('json: cannot unmarshal object into Go value of type jsonpatch.Patch', 400);
  let out = clone(doc);
  for (const raw of ops) {
    if (!isObject(raw)) throw new PatchError('json: cannot unmarshal into Go value of type jsonpatch.Operation', 400);
    const op = typeof raw.op === 'string' ? raw.op : '';
    const pathText = typeof raw.path === 'string' ? raw.path : '';
    const tokens = pointer(raw.path, op);
    const value = (): Json => {
      if (!Object.hasOwn(raw, 'value')) throw new PatchError(`${op} operation does not apply: missing value`, 422);
      return clone(raw.value ?? null);
    };
    switch (op) {
      case 'add':
        out = addAt(out, tokens, pathText, value(), false);
        break;
      case 'replace':
        if (tokens.length > 0) getAt(out, tokens, pathText);
        out = addAt(out, tokens, pathText, value(), true);
        break;
      case 'remove':
        removeAt(out, tokens, pathText);
        break;
      case 'test':
        if (!deepEqual(getAt(out, tokens, pathText), value())) {
          throw new PatchError(`testing value ${pathText} failed: test failed`, 422);
        }
        break;
      case 'move': {
        const from = pointer(raw.from, op);
        const v = removeAt(out, from, JSON.stringify(raw.from));
        out = addAt(out, tokens, pathText, v, false);
        break;
      }
      case 'copy': {
        const v = clone(getAt(out, pointer(raw.from, op), JSON.stringify(raw.from)));
        out = addAt(out, tokens, pathText, v, false);
        break;
      }
      default:
        throw new PatchError(`Unexpected kind: ${op}`, 422);
    }
  }
  return out;
}
