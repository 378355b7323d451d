// The one check under every text protocol weft writes (`ip -batch`, `nft -f`, iptables-restore,
// ovs-ofctl flows): a value spliced into a line must come back from the tool's parser as exactly
// itself, one word, on that line. Each protocol's renderer adds the characters its own syntax
// treats specially; nothing reaches a line without passing here, so a value that a validation at
// the boundary missed still cannot become a second command.

/** A value a renderer refused: which protocol, which field, the value, and why. */
export class UnsafeValueError extends Error {
  constructor(
    readonly protocol: string,
    readonly field: string,
    readonly value: string,
    readonly reason: string,
  ) {
    super(`${protocol}: refusing ${field} ${JSON.stringify(value)}: ${reason}`);
    this.name = 'UnsafeValueError';
  }
}

const CONTROL = /\p{Cc}/u;
// Unicode spaces too: a tool may split on them, a terminal shows them as nothing.
const SPACE = /[\s\u00a0\u1680\u180e\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]/u;

/** Why `value` cannot be one word of a line in a syntax where `special` characters mean something, or null. */
export function wordProblem(value: string, special: string): string | null {
  if (value === '') return 'is empty';
  if (CONTROL.test(value)) return 'contains a control character';
  if (SPACE.test(value)) return 'contains white space';
  for (const ch of special) if (value.includes(ch)) return `contains ${JSON.stringify(ch)}`;
  return null;
}

/** `value` when it is one safe word of `protocol`'s syntax; throws UnsafeValueError otherwise. */
export function checkWord(protocol: string, field: string, value: string, special: string): string {
  const problem = wordProblem(value, special);
  if (problem !== null) throw new UnsafeValueError(protocol, field, value, problem);
  return value;
}

/** The characters that end, quote, escape or comment out a word in a line-based syntax. */
export const LINE_SPECIAL = '#"\'\\';
