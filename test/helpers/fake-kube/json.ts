// JSON value types for the fake API server: objects are kept as plain JSON (what goes over the wire),
// never as client-library classes, so the fake cannot accidentally depend on one client's model.
export type Json = null | boolean | number | string | Json[] | JsonObject;
export interface JsonObject {
  [key: string]: Json;
}

export function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function clone<T extends Json>(v: T): T {
  return structuredClone(v);
}

export function deepEqual(a: Json | undefined, b: Json | undefined): boolean {
  if (a === b) return true;
  if (Array.isArray(a)) {
    return Array.isArray(b) && a.length === b.length && a.every((x, i) => deepEqual(x, b[i]));
  }
  if (isObject(a) && isObject(b)) {
    const ka = Object.keys(a);
    if (ka.length !== Object.keys(b).length) return false;
    return ka.every((k) => Object.hasOwn(b, k) && deepEqual(a[k], b[k]));
  }
  return false;
}

/** The object at `obj[key]`, created empty when missing or not an object. */
export function child(obj: JsonObject, key: string): JsonObject {
  const v = obj[key];
  if (isObject(v)) return v;
  const fresh: JsonObject = {};
  obj[key] = fresh;
  return fresh;
}

export function str(v: Json | undefined): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

/** Reads a dotted path (`metadata.name`) of objects; undefined when any step is missing. */
export function getPath(obj: JsonObject, path: readonly string[]): Json | undefined {
  let cur: Json | undefined = obj;
  for (const p of path) {
    if (!isObject(cur)) return undefined;
    cur = cur[p];
  }
  return cur;
}

/** A string→string map (labels, annotations), ignoring non-string values. */
export function stringMap(v: Json | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (!isObject(v)) return out;
  for (const [k, x] of Object.entries(v)) if (typeof x === 'string') out[k] = x;
  return out;
}
