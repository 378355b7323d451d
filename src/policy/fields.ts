// Reading Kubernetes objects as the API server sends them (`unknown` JSON, trusted for nothing),
// and the name rules of apimachinery's validation (pkg/util/validation) that the policy engine
// relies on. Every failure names the object and the field path, like a field.ErrorList entry.

export class PolicyInputError extends Error {
  constructor(
    readonly object: string,
    readonly field: string,
    readonly reason: string,
  ) {
    super(`${object}: ${field}: ${reason}`);
    this.name = 'PolicyInputError';
  }
}

/** A hostile string shown in an error: quoted, control characters escaped, long ones cut. */
export function quote(value: unknown): string {
  if (typeof value !== 'string') {
    const t = value === undefined ? 'undefined' : (JSON.stringify(value) ?? typeof value);
    return t.length > 80 ? `${t.slice(0, 80)}…` : t;
  }
  const cut = value.length > 80 ? `${value.slice(0, 80)}…` : value;
  return JSON.stringify(cut);
}

/** Typed access to one object's JSON; `fail` throws a PolicyInputError about that object. */
export class Fields {
  constructor(public object: string) {}

  fail(path: string, reason: string): never {
    throw new PolicyInputError(this.object, path, reason);
  }

  /** A JSON object (not null, not an array). */
  record(v: unknown, path: string): Record<string, unknown> {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) this.fail(path, `must be an object, got ${kind(v)}`);
    return v as Record<string, unknown>;
  }

  /** An object, or undefined when absent or null (Go decodes null into a nil pointer). */
  optRecord(v: unknown, path: string): Record<string, unknown> | undefined {
    return v === undefined || v === null ? undefined : this.record(v, path);
  }

  string(v: unknown, path: string): string {
    if (typeof v !== 'string') this.fail(path, `must be a string, got ${kind(v)}`);
    return v;
  }

  optString(v: unknown, path: string): string | undefined {
    return v === undefined || v === null ? undefined : this.string(v, path);
  }

  /** An array; absent or null is the empty list (Go's nil slice). */
  array(v: unknown, path: string): unknown[] {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) this.fail(path, `must be a list, got ${kind(v)}`);
    return v as unknown[];
  }

  /** An array that distinguishes absent/null (undefined) from a present, possibly empty, list. */
  optArray(v: unknown, path: string): unknown[] | undefined {
    if (v === undefined || v === null) return undefined;
    return this.array(v, path);
  }

  bool(v: unknown, path: string): boolean {
    if (v === undefined || v === null) return false;
    if (typeof v !== 'boolean') this.fail(path, `must be a boolean, got ${kind(v)}`);
    return v;
  }

  /** An integer in [min, max] (Go decodes JSON numbers into int32: fractions are an error). */
  int(v: unknown, path: string, min: number, max: number): number {
    if (typeof v !== 'number' || !Number.isInteger(v)) this.fail(path, `must be an integer, got ${kind(v)}`);
    if (v < min || v > max) this.fail(path, `must be between ${min} and ${max}, inclusive (got ${v})`);
    return v;
  }

  /** A label map, validated per Kubernetes rules; a Map, so "__proto__" is just a key. */
  labels(v: unknown, path: string): Map<string, string> {
    const out = new Map<string, string>();
    const rec = this.optRecord(v, path);
    if (!rec) return out;
    for (const [key, value] of Object.entries(rec)) {
      const p = `${path}[${quote(key)}]`;
      checkOrFail(this, p, labelKeyProblem(key));
      const s = this.string(value, p);
      checkOrFail(this, p, labelValueProblem(s));
      out.set(key, s);
    }
    return out;
  }
}

function kind(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  return typeof v;
}

export function checkOrFail(f: Fields, path: string, problem: string | null): void {
  if (problem !== null) f.fail(path, problem);
}

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const QUALIFIED_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const PORT_NAME = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;

// Lengths are checked before the patterns, so a hostile megabyte string never reaches a regex.

/** Namespace names (apimachinery NameIsDNSLabel). */
export function dnsLabelProblem(s: string): string | null {
  if (s.length === 0) return 'must not be empty';
  if (s.length > 63) return 'must be no more than 63 characters';
  return DNS1123_LABEL.test(s) ? null : 'must be a lowercase RFC 1123 label';
}

/** Pod and NetworkPolicy names (NameIsDNSSubdomain). */
export function dnsSubdomainProblem(s: string): string | null {
  if (s.length === 0) return 'must not be empty';
  if (s.length > 253) return 'must be no more than 253 characters';
  return DNS1123_SUBDOMAIN.test(s) ? null : 'must be a lowercase RFC 1123 subdomain';
}

/** Label keys and selector keys (IsQualifiedName): [prefix/]name. */
export function labelKeyProblem(key: string): string | null {
  if (key.length > 317) return 'must be a qualified name ([prefix/]name) of at most 253+1+63 characters';
  const parts = key.split('/');
  let name = key;
  if (parts.length === 2) {
    const prefix = parts[0]!;
    name = parts[1]!;
    if (prefix.length === 0) return 'prefix part must not be empty';
    const p = dnsSubdomainProblem(prefix);
    if (p !== null) return `prefix part ${p}`;
  } else if (parts.length > 2) {
    return 'a qualified name must consist of alphanumeric characters, "-", "_" or "." with an optional DNS subdomain prefix and "/"';
  }
  if (name.length === 0) return 'name part must not be empty';
  if (name.length > 63) return 'name part must be no more than 63 characters';
  if (!QUALIFIED_NAME.test(name)) return 'name part must consist of alphanumeric characters, "-", "_" or ".", and must start and end with an alphanumeric character';
  return null;
}

/** Label values (IsValidLabelValue): empty, or at most 63 characters of the qualified-name alphabet. */
export function labelValueProblem(value: string): string | null {
  if (value.length === 0) return null;
  if (value.length > 63) return 'a label value must be no more than 63 characters';
  if (!QUALIFIED_NAME.test(value)) return 'a label value must be empty or consist of alphanumeric characters, "-", "_" or ".", and must start and end with an alphanumeric character';
  return null;
}

/** Port names (IsValidPortName, an IANA_SVC_NAME). */
export function portNameProblem(name: string): string | null {
  if (name.length === 0 || name.length > 15) return 'a port name must be 1 to 15 characters';
  if (!PORT_NAME.test(name)) return 'a port name must contain only lowercase alphanumerics and "-", and start and end with an alphanumeric';
  if (name.includes('--')) return 'a port name must not contain consecutive hyphens';
  if (!/[a-z]/.test(name)) return 'a port name must contain at least one letter';
  return null;
}
