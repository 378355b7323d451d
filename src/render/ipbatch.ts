// The one renderer of `ip -batch` and `bridge -batch` lines. Both read their input with iproute2's
// getcmdline/makeargs (lib/utils.c): a line ends at LF; everything from a `#` on is cut off; a
// backslash before the newline joins the next line; words are split on space, tab, CR and LF, and
// a word starting with `'` or `"` runs to the next such quote. A value spliced into a line could
// therefore add a command, cut the rest of its line, or glue the next one on.
//
// A line is made only here, from typed words, and every word passes checkWord with the characters
// that syntax treats specially, so whatever a validation at the boundary missed can at worst make
// one word ip does not like, never a second command. IpLine is branded: the batch runners
// (cni-plugins/lib/ipbatch.ts) take nothing else, so a template string cannot reach `ip`.
import { checkWord, LINE_SPECIAL, UnsafeValueError } from './word.js';

declare const ipLineBrand: unique symbol;

/** One line of an `ip -batch` / `bridge -batch` input, made by ipLine(). */
export type IpLine = string & { readonly [ipLineBrand]: true };

/** A word with the name it has in errors (e.g. "CNI_IFNAME", "bridge"). */
export interface NamedWord {
  readonly field: string;
  readonly value: string | number;
}

/**
 * A word of a line: a keyword or value (named in errors after the word before it, e.g. `dev`),
 * a finite number, or a NamedWord.
 */
export type IpWord = string | number | NamedWord;

/** The protocol name in UnsafeValueError (`bridge -batch` reads lines the same way). */
export const IP_BATCH = 'ip -batch';

/**
 * Words per line that every iproute2 reads: makeargs() exits on more than its argv holds (older
 * releases 100 slots, current ones 512; the last is NULL), ending the whole batch.
 */
export const MAX_LINE_WORDS = 99;

// Lone UTF-16 surrogates cannot be written as UTF-8: Node would send U+FFFD, another name.
const LONE_SURROGATE = /\p{Cs}/u;

/** `value` as a word named `field` in errors. */
export function named(field: string, value: string | number): NamedWord {
  return { field, value };
}

function fieldOf(w: IpWord, prev: IpWord | undefined, index: number): { field: string; value: string | number } {
  if (typeof w === 'object') return w;
  const after = typeof prev === 'string' ? prev : typeof prev === 'object' ? prev.field : null;
  return { field: after !== null ? after : `word ${index + 1}`, value: w };
}

function renderWord(w: IpWord, prev: IpWord | undefined, index: number): string {
  const { field, value } = fieldOf(w, prev, index);
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new UnsafeValueError(IP_BATCH, field, String(value), 'is not a finite number');
    return String(value);
  }
  if (LONE_SURROGATE.test(value)) throw new UnsafeValueError(IP_BATCH, field, value, 'contains a lone UTF-16 surrogate');
  return checkWord(IP_BATCH, field, value, LINE_SPECIAL);
}

/** One batch line from its words. Throws UnsafeValueError for a word that is not one safe word. */
export function ipLine(...words: readonly IpWord[]): IpLine {
  return ipLineOf(words);
}

/** ipLine over an array (for lines assembled piece by piece). */
export function ipLineOf(words: readonly IpWord[]): IpLine {
  if (words.length === 0) throw new UnsafeValueError(IP_BATCH, 'line', '', 'has no words');
  if (words.length > MAX_LINE_WORDS) {
    const text = words.map((w) => String(typeof w === 'object' ? w.value : w)).join(' ');
    throw new UnsafeValueError(IP_BATCH, 'line', text.slice(0, 200), `has ${words.length} words; ip reads at most ${MAX_LINE_WORDS}`);
  }
  return words.map((w, i) => renderWord(w, words[i - 1], i)).join(' ') as IpLine;
}

/** The text fed to `ip -batch -` / `bridge -batch -`: one line each, newline-terminated. */
export function batchText(lines: readonly IpLine[]): string {
  return lines.length === 0 ? '' : lines.join('\n') + '\n';
}
