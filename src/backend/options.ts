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
}
