// What the line renderers of src/render share: pieces only the renderer can make (a look-alike
// object is refused at run time too), template tags whose literal text is the source code's and
// whose values are each checked for their place, and a scanner that re-checks text kept as a
// string (a rule read back, a rule body compared with a listing) before it is written again.
import { IPAddr, IPNet } from '../util/ip.js';
import { UnsafeValueError } from './word.js';

const CONTROL = /\p{Cc}/u;

export const hasControl = (text: string): boolean => CONTROL.test(text);

/** A value a template takes: a string (checked as one word), an integer, an address or prefix, or a piece. */
export type TemplateValue<P> = string | number | IPAddr | IPNet | P;

export interface Pieces<P extends { readonly text: string }> {
  /** A piece with this text (the caller has checked it). */
  readonly make: (text: string) => P;
  readonly isPiece: (v: unknown) => v is P;
  readonly fail: (field: string, value: string, reason: string) => never;
  /** The text of a template: literals as written (never a control character), each value checked. */
  readonly render: (strings: TemplateStringsArray, values: readonly TemplateValue<P>[], word: (field: string, value: string) => string) => string;
  /** The text of a value on its own (`field` names it in an error). */
  readonly valueText: (v: TemplateValue<P>, field: string, word: (field: string, value: string) => string) => string;
}

/** The piece factory and template renderer of one protocol. */
export function pieces<P extends { readonly text: string }>(protocol: string): Pieces<P> {
  const made = new WeakSet<object>();
  const fail = (field: string, value: string, reason: string): never => {
    throw new UnsafeValueError(protocol, field, value, reason);
  };
  const isPiece = (v: unknown): v is P => typeof v === 'object' && v !== null && made.has(v);
  const valueText = (v: TemplateValue<P>, field: string, word: (field: string, value: string) => string): string => {
    if (typeof v === 'string') return word(field, v);
    if (typeof v === 'number') return Number.isSafeInteger(v) ? String(v) : fail(field, String(v), 'is not an integer');
    if (v instanceof IPAddr || v instanceof IPNet) return v.toString();
    if (isPiece(v)) return v.text;
    return fail(field, String(v), 'is not a value the renderer knows');
  };
  const literal = (s: string): string => {
    if (hasControl(s)) throw new Error(`${protocol} renderer: template text ${JSON.stringify(s)} has a control character`);
    return s;
  };
  return {
    make: (text) => {
      const p = Object.freeze({ text }) as unknown as P;
      made.add(p);
      return p;
    },
    isPiece,
    fail,
    valueText,
    render: (strings, values, word) => {
      let out = literal(strings[0] ?? '');
      values.forEach((v, i) => {
        // The option or keyword the value follows names it in an error ("argument of -j").
        const before = (strings[i] ?? '').trim().split(' ');
        const field = before[before.length - 1] ? `value after ${before[before.length - 1]}` : 'value';
        out += valueText(v, field, word) + literal(strings[i + 1] ?? '');
      });
      return out;
    },
  };
}

export interface ScanRules {
  /** Why a bare word is refused, or null. */
  readonly word: (w: string) => string | null;
  /** Why the content of a "…" string is refused, or null. */
  readonly quoted: (q: string) => string | null;
  /** `\` escapes the next character inside quotes (iptables-restore); nft knows no escapes. */
  readonly escapes: boolean;
}

/**
 * Why `text` is not one line of words and "…" strings, each passing `rules`, or null. A quoted
 * string starts and ends a word (no `a"b c"`), and is closed.
 */
export function scanProblem(text: string, rules: ScanRules): string | null {
  if (hasControl(text)) return 'contains a control character';
  let i = 0;
  while (i < text.length) {
    if (text[i] === ' ') {
      i++;
      continue;
    }
    if (text[i] === '"') {
      let value = '';
      let closed = false;
      for (i++; i < text.length; i++) {
        const c = text[i]!;
        if (rules.escapes && c === '\\') {
          if (i + 1 >= text.length) break;
          value += text[++i]!;
        } else if (c === '"') {
          closed = true;
          i++;
          break;
        } else value += c;
      }
      if (!closed) return 'has an unclosed quote';
      if (i < text.length && text[i] !== ' ') return 'has a quote inside a word';
      const p = rules.quoted(value);
      if (p !== null) return `has a quoted string that ${p}`;
      continue;
    }
    let end = text.indexOf(' ', i);
    if (end < 0) end = text.length;
    const word = text.slice(i, end);
    const p = rules.word(word);
    if (p !== null) return `has a word ${JSON.stringify(word)} that ${p}`;
    i = end;
  }
  return null;
}
