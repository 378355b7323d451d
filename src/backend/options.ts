// Typed reading of a backend's options from the network config's `Backend` object, with Go's
// case-insensitive key matching and an error that names the key and the rule.
import { ConfigError } from '../subnet/config.js';
import type { JsonValue } from '../subnet/lease.js';

export class BackendOptions {
  private readonly byLower = new Map<string, { key: string; value: JsonValue }>();

  constructor(
    readonly backendType: string,
    options: Readonly<Record<string, JsonValue>>,
  ) {
    for (const [key, value] of Object.entries(options)) this.byLower.set(key.toLowerCase(), { key, value });
  }

  private get(key: string): JsonValue | undefined {
    const v = this.byLower.get(key.toLowerCase())?.value;
    return v === null ? undefined : v;
  }

  private fail(key: string, value: JsonValue, rule: string): never {
    throw new ConfigError(`Backend.${key}`, `Backend.${key} ${JSON.stringify(value)}: ${rule}`);
  }

  integer(key: string, dflt: number, min: number, max: number): number {
    const v = this.get(key);
    if (v === undefined) return dflt;
    if (typeof v !== 'number' || !Number.isInteger(v)) this.fail(key, v, 'must be an integer');
    if (v < min || v > max) this.fail(key, v, `must be from ${min} to ${max}`);
    return v;
  }

  boolean(key: string, dflt: boolean): boolean {
    const v = this.get(key);
    if (v === undefined) return dflt;
    if (typeof v !== 'boolean') this.fail(key, v, 'must be true or false');
    return v;
  }

  /** A string from `allowed`, or matching `pattern` (with `rule` saying what it must look like). */
  string(key: string, dflt: string, check: { allowed: readonly string[] } | { pattern: RegExp; rule: string }): string {
    const v = this.get(key);
    if (v === undefined) return dflt;
    if (typeof v !== 'string') this.fail(key, v, 'must be a string');
    if ('allowed' in check && !check.allowed.includes(v)) this.fail(key, v, `must be one of ${check.allowed.join(', ')}`);
    if ('pattern' in check && !check.pattern.test(v)) this.fail(key, v, check.rule);
    return v;
  }
}
