// Text for an operator's terminal. What `weft leases`, `weft status` and `weft trace` print comes
// in part from the store and from other nodes (subnet keys, PublicIP, backend type, VtepMAC, error
// messages): a value holding ESC, CSI or a newline would move the cursor, recolour or rewrite the
// lines around it, and a bidi override (U+202E) would show the text in another order than it is.
// Such characters are printed as visible escapes instead; everything else is left as it is.

/**
 * C0 controls and DEL, C1 controls (U+0080..U+009F, which some terminals obey as CSI, OSC, ...),
 * format characters (bidi embeddings, overrides, isolates and marks, zero-width characters, the
 * BOM, soft hyphen, tags), the line and paragraph separators, and lone surrogates.
 */
const UNSAFE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/gu;

const SHORT: Readonly<Record<string, string>> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

function escapeChar(c: string): string {
  const short = SHORT[c];
  if (short !== undefined) return short;
  const cp = c.codePointAt(0)!;
  if (cp <= 0xff) return `\\x${cp.toString(16).padStart(2, '0')}`;
  if (cp <= 0xffff) return `\\u${cp.toString(16).padStart(4, '0')}`;
  return `\\u{${cp.toString(16)}}`;
}

/** `text` with every character a terminal would obey or hide written as an escape (`\x1b`, `\n`, `\u202e`). */
export function terminalText(text: string): string {
  return text.replace(UNSAFE, escapeChar);
}

/** What JSON.stringify leaves raw inside strings although a terminal obeys or hides it (C0 it escapes itself). */
const UNSAFE_IN_JSON = /[\u007f-\u009f\p{Cf}\p{Zl}\p{Zp}]/gu;

const jsonEscape = (c: string): string =>
  Array.from({ length: c.length }, (_, i) => `\\u${c.charCodeAt(i).toString(16).padStart(4, '0')}`).join('');

/**
 * JSON for a terminal: JSON.stringify escapes C0 controls, quotes, backslashes and lone
 * surrogates, but leaves DEL, C1 controls and format characters raw inside strings; those are
 * written as `\uXXXX` escapes (both halves of a surrogate pair), which parse back to the same value.
 */
export function terminalJson(value: unknown, indent = 2): string {
  return JSON.stringify(value, null, indent).replace(UNSAFE_IN_JSON, jsonEscape);
}
