// Inputs for the renderers' property tests (test/netns/render-*.test.ts): random words over every
// C0 control, DEL, C1 controls, Unicode spaces, the syntax's special characters, plain letters and
// digits and non-ASCII letters, plus one word per character of those classes (so each is tried
// whatever the seed), keywords and near-limit lengths. Seeded: WEFT_FUZZ_SEED=<n> repeats a run.
import assert from 'node:assert/strict';

import { UnsafeValueError } from '../../src/render/word.js';
import { prng } from './prng.js';

const range = (from: number, to: number): string[] => Array.from({ length: to - from + 1 }, (_, i) => String.fromCharCode(from + i));

export const C0 = range(0x00, 0x1f);
export const DEL = '\u007f';
export const C1 = range(0x80, 0x9f);
export const UNICODE_SPACES = ['\u00a0', '\u1680', '\u180e', ...range(0x2000, 0x200b), '\u2028', '\u2029', '\u202f', '\u205f', '\u3000', '\ufeff'];
const PLAIN = [...'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'];
const NON_ASCII = [...'éßüΩ東'];
const PUNCT = [...'*|&<>=!,()[]:/.-_+%^~`?'];

export type InputClass = 'plain' | 'control' | 'unicode space' | 'special' | 'punctuation' | 'non-ASCII' | 'curated';

export interface FuzzInput {
  readonly cls: InputClass;
  readonly value: string;
}

export const fuzzSeed = (): number => {
  const env = process.env['WEFT_FUZZ_SEED'];
  return env !== undefined && env !== '' ? Number(env) >>> 0 : Math.floor(Math.random() * 2 ** 32);
};

export class FuzzGen {
  private readonly next: () => number;

  constructor(seed: number) {
    this.next = prng(seed);
  }

  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)]!;
  }

  plainWord(max = 12): string {
    return Array.from({ length: 1 + this.int(max) }, () => this.pick(PLAIN)).join('');
  }

  /** `c` somewhere in a plain word (start, middle or end). */
  around(c: string): string {
    switch (this.int(3)) {
      case 0:
        return c + this.plainWord(6);
      case 1:
        return this.plainWord(4) + c + this.plainWord(4);
      default:
        return this.plainWord(6) + c;
    }
  }

  /**
   * `count` random inputs plus, first, one for every character of the classes (each control,
   * Unicode space and `specials` character, and the blank) and the `curated` words.
   */
  inputs(specials: readonly string[], curated: readonly string[], count: number): FuzzInput[] {
    const out: FuzzInput[] = [];
    for (const c of [...C0, DEL, ...C1]) out.push({ cls: 'control', value: this.around(c) });
    for (const c of UNICODE_SPACES) out.push({ cls: 'unicode space', value: this.around(c) });
    for (const c of [...specials, ' ']) out.push({ cls: 'special', value: this.around(c) });
    for (const c of PUNCT) out.push({ cls: 'punctuation', value: this.around(c) });
    for (const w of curated) out.push({ cls: 'curated', value: w });
    const pools: (readonly string[])[] = [PLAIN, [...C0, DEL, ...C1], UNICODE_SPACES, [...specials, ' '], PUNCT, NON_ASCII];
    for (let i = 0; i < count; i++) {
      if (this.int(3) === 0) {
        out.push({ cls: 'plain', value: this.plainWord() });
        continue;
      }
      // A word of mostly plain characters with some from one or two other classes.
      const pool = this.pick(pools);
      const pool2 = this.pick(pools);
      const len = 1 + this.int(16);
      let w = '';
      for (let j = 0; j < len; j++) {
        const r = this.int(10);
        w += r < 6 ? this.pick(PLAIN) : r < 9 ? this.pick(pool) : this.pick(pool2);
      }
      out.push({ cls: classOf(w, specials), value: w });
    }
    return out;
  }
}

/** The class of a random word by what it contains, the most dangerous first. */
function classOf(w: string, specials: readonly string[]): InputClass {
  const has = (pool: readonly string[]): boolean => pool.some((c) => w.includes(c));
  if (has([...C0, DEL, ...C1])) return 'control';
  if (has(UNICODE_SPACES)) return 'unicode space';
  if (has([...specials, ' '])) return 'special';
  if (has(PUNCT)) return 'punctuation';
  if (has(NON_ASCII)) return 'non-ASCII';
  return 'plain';
}

/** Counts per class and outcome, printed as a small table. */
export class Tally {
  private readonly counts = new Map<string, Map<string, number>>();

  add(cls: string, outcome: string): void {
    const row = this.counts.get(cls) ?? new Map<string, number>();
    row.set(outcome, (row.get(outcome) ?? 0) + 1);
    this.counts.set(cls, row);
  }

  total(outcome?: string): number {
    let n = 0;
    for (const row of this.counts.values()) for (const [o, c] of row) if (outcome === undefined || o === outcome) n += c;
    return n;
  }

  toString(): string {
    const lines: string[] = [];
    for (const [cls, row] of [...this.counts].sort()) {
      lines.push(`${cls}: ${[...row].map(([o, c]) => `${o} ${c}`).join(', ')}`);
    }
    return lines.join('; ');
  }
}

/** What `render` made, or null when it refused — and then the refusal names the protocol, the field and the value. */
export function attempt<T>(protocol: string, field: string, value: string, render: () => T): T | null {
  try {
    return render();
  } catch (e) {
    if (!(e instanceof UnsafeValueError)) throw e;
    assert.equal(e.protocol, protocol);
    assert.equal(e.field, field);
    assert.equal(e.value, value);
    assert.ok(e.message.includes(JSON.stringify(value)), e.message);
    return null;
  }
}
