// The one iptables-restore renderer. A payload is `*table`, one line per command (`:CHAIN - [0:0]`,
// `-N`, `-X`, `-A/-I/-D/-C CHAIN spec`) and `COMMIT`, and only `iptablesPayload` builds one. A rule
// spec comes from the `xt` template tag: its literal text is the source code's, and every value
// put into it becomes exactly one argument as iptables-restore splits the line (blanks separate,
// "…" quotes with \ escapes), printed the way iptables-save prints it, so the same text is what
// is written and what is read back. A value that could not be one such argument is refused with
// UnsafeValueError naming the field and the value; no value can end the line.
import { Buffer } from 'node:buffer';

import { hasControl, pieces, scanProblem, type TemplateValue } from './template.js';
import { LINE_SPECIAL, wordProblem } from './word.js';

export const XT_PROTOCOL = 'iptables-restore';

declare const brand: unique symbol;

/** A whole iptables-restore payload; only `iptablesPayload` makes one. */
export type IptablesPayload = string & { readonly [brand]: 'IptablesPayload' };

/**
 * A rule spec (what follows `-A CHAIN`), or a run of arguments of one, as iptables-save prints it.
 * Made by the `xt` tag or `xtSavedSpec`; a string at run time, so it compares with read-back text.
 */
export type XtSpec = string & { readonly [brand]: 'XtSpec' };

export type XtTableName = 'nat' | 'filter' | 'mangle' | 'raw' | 'security';

/** iptables' limit: 28 characters plus NUL. */
export const XT_CHAIN_MAX = 28;
/** The comment match keeps 255 bytes plus NUL. */
export const XT_COMMENT_MAX = 255;

/** A checked piece of a line: only this module makes them (a look-alike object is refused). */
export interface XtPart {
  readonly text: string;
  readonly [brand]: 'XtPart';
}

const P = pieces<XtPart>(XT_PROTOCOL);
const part = P.make;
const fail = P.fail;

/** A word iptables-save prints without quotes (xtables_save_string). */
const BARE = /^[A-Za-z0-9_-]+$/;
/** Names iptables-restore refuses for a chain: the standard verdicts. */
const VERDICTS: ReadonlySet<string> = new Set(['ACCEPT', 'DROP', 'QUEUE', 'RETURN']);

/** Why `value` cannot be one plain argument of a rule line, or null. */
export function xtWordProblem(value: string): string | null {
  return wordProblem(value, LINE_SPECIAL);
}

/** Why `name` cannot be a chain name (on a `:CHAIN` line, after -A/-I/-D/-C/-N/-X, or as a -j/-g target), or null. */
export function xtChainProblem(name: string): string | null {
  const p = wordProblem(name, LINE_SPECIAL);
  if (p !== null) return p;
  if (name.startsWith('-') || name.startsWith('!')) return 'starts with "-" or "!"';
  if (Buffer.byteLength(name, 'utf8') > XT_CHAIN_MAX) return `is longer than ${XT_CHAIN_MAX} bytes`;
  if (VERDICTS.has(name)) return 'is a built-in verdict';
  return null;
}

/** Why `text` cannot be a quoted string (a comment) that iptables-save prints back as itself, or null. */
export function xtCommentProblem(text: string): string | null {
  // Blanks are what the quotes are for; any other white space or control character is refused.
  if (text !== '') {
    const p = wordProblem(text.replaceAll(' ', '_'), '');
    if (p !== null) return p;
  }
  if (Buffer.byteLength(text, 'utf8') > XT_COMMENT_MAX) return `is longer than ${XT_COMMENT_MAX} bytes`;
  return null;
}

/** One plain argument (an interface, a match name, a port list …). */
export function xtWord(field: string, value: string): XtPart {
  const p = xtWordProblem(value);
  if (p !== null) fail(field, value, p);
  return part(value);
}

/** Plain arguments, one each, separated by blanks. */
export function xtWords(field: string, values: readonly string[]): XtPart {
  return part(values.map((v) => xtWord(field, v).text).join(' '));
}

/** A chain name. */
export function xtChain(field: string, name: string): XtPart {
  const p = xtChainProblem(name);
  if (p !== null) fail(field, name, p);
  return part(name);
}

/** `text` as iptables-save prints a string: bare when it is [A-Za-z0-9_-]+, else in "…" with " ' \ escaped. */
export function xtQuote(field: string, text: string): XtPart {
  const p = xtCommentProblem(text);
  if (p !== null) fail(field, text, p);
  return part(BARE.test(text) ? text : `"${text.replace(/["'\\]/g, (c) => `\\${c}`)}"`);
}

export type XtValue = TemplateValue<XtPart>;

const word = (field: string, value: string): string => xtWord(field, value).text;

/**
 * A rule spec: the template's text with each value in its place, a string as one plain argument
 * (no blanks, quotes, backslash or `#`), a number as an integer, an address or prefix as printed,
 * an XtPart as made.
 */
export function xt(strings: TemplateStringsArray, ...values: readonly XtValue[]): XtSpec {
  return P.render(strings, values, word) as XtSpec;
}

/** Spec pieces joined by one blank, empty ones left out. */
export function xtJoin(specs: readonly (XtSpec | XtPart)[]): XtSpec {
  return specs
    .map((s) => (typeof s === 'string' ? xtSpecPart(s).text : P.valueText(s, 'rule spec', word)))
    .filter((t) => t !== '')
    .join(' ') as XtSpec;
}

/**
 * Splits a spec the way iptables-restore does and checks every argument: a bare one is a plain
 * word, a quoted one ("…" with \ escapes, as iptables-save quotes) closes before a blank or the end.
 * Why it is not one line of clean arguments, or null.
 */
export function xtSpecProblem(text: string): string | null {
  return scanProblem(text, { word: xtWordProblem, quoted: xtCommentProblem, escapes: true });
}

function xtSpecPart(text: string, field = 'rule spec'): XtPart {
  const p = xtSpecProblem(text);
  if (p !== null) fail(field, text, p);
  return part(text);
}

/** A spec as iptables-save or `iptables -S` printed it (after `-A CHAIN `), checked before it is written back. */
export function xtSavedSpec(text: string): XtSpec {
  return xtSpecPart(text, 'rule read back').text as XtSpec;
}

// ---- lines ----

/** One line of a payload; only the functions below make them. */
export interface XtLine {
  readonly line: string;
  readonly [brand]: 'XtLine';
}

const lines = new WeakSet<object>();

function line(text: string): XtLine {
  const l = Object.freeze({ line: text }) as XtLine;
  lines.add(l);
  return l;
}

const chainText = (field: string, name: string): string => xtChain(field, name).text;

/** `:CHAIN - [0:0]`: creates the chain, or (under --noflush) empties it. */
export function xtDeclare(chain: string): XtLine {
  return line(`:${chainText('chain', chain)} - [0:0]`);
}

/** `-N CHAIN`: fails the transaction when the chain exists. */
export function xtNewChain(chain: string): XtLine {
  return line(`-N ${chainText('chain', chain)}`);
}

/** `-X CHAIN`. */
export function xtDeleteChain(chain: string): XtLine {
  return line(`-X ${chainText('chain', chain)}`);
}

const ruleLine = (op: string, chain: string, spec: XtSpec): XtLine => line(`${op} ${chainText('chain', chain)} ${xtSpecPart(spec).text}`);

export const xtAppend = (chain: string, spec: XtSpec): XtLine => ruleLine('-A', chain, spec);
export const xtDelete = (chain: string, spec: XtSpec): XtLine => ruleLine('-D', chain, spec);
/** `-C`: fails the transaction when the rule is not there. */
export const xtCheck = (chain: string, spec: XtSpec): XtLine => ruleLine('-C', chain, spec);

export function xtInsert(chain: string, position: number, spec: XtSpec): XtLine {
  if (!Number.isSafeInteger(position) || position < 1) fail('position', String(position), 'is not a rule number');
  return line(`-I ${chainText('chain', chain)} ${position} ${xtSpecPart(spec).text}`);
}

const TABLES: ReadonlySet<string> = new Set(['nat', 'filter', 'mangle', 'raw', 'security']);

/** The payload for one table: `*table`, the lines, `COMMIT`. */
export function iptablesPayload(table: XtTableName, body: readonly XtLine[]): IptablesPayload {
  if (!TABLES.has(table)) fail('table', table, 'is not an iptables table');
  const out = [`*${table}`];
  for (const l of body) {
    if (!lines.has(l) || hasControl(l.line)) throw new TypeError(`${XT_PROTOCOL} renderer: a payload line must come from the renderer`);
    out.push(l.line);
  }
  out.push('COMMIT', '');
  return out.join('\n') as IptablesPayload;
}
