// The one nftables renderer. An `nft -f` script is one command a line, and only `nftScript` builds
// one, from commands made by the `nft` template tag: their literal text (keywords, blocks such as
// `{ type nat hook postrouting priority srcnat ; }`) is the source code's, and every value put in
// is checked for its place — a name (table, chain, set) must be one nft reads as a plain name, a
// comment is quoted with what nft reads back verbatim, any other value must be one word without
// the characters that end a command (`;`, newline), open or close a block (`{`, `}`), start a
// comment (`#`), quote, escape, or name a variable or set (`$`, `@`). A value that cannot be is
// refused with UnsafeValueError naming the field and the value.
//
// Rule bodies kept as text (to compare with what `nft list` prints) are re-scanned when they are
// put back into a command. The JSON form (`nft -j`) is checked by `nftJson` with the same rules.
import { Buffer } from 'node:buffer';

import { hasControl, pieces, scanProblem, type TemplateValue } from './template.js';
import { wordProblem } from './word.js';

export const NFT_PROTOCOL = 'nft';

/** What a word of a command must not contain. */
export const NFT_SPECIAL = ';{}#"\'\\$@';

/** nft's limits (NFT_NAME_MAXLEN 256 with the NUL; NFTNL_UDATA_COMMENT_MAXLEN). */
export const NFT_NAME_MAX = 255;
export const NFT_COMMENT_MAX = 128;

declare const brand: unique symbol;

/** A whole `nft -f` script; only `nftScript` makes one. */
export type NftScript = string & { readonly [brand]: 'NftScript' };
/** A rule body as nft lists it (matches, statements, a quoted comment); made by the `nftRule` tag. */
export type NftRuleText = string & { readonly [brand]: 'NftRuleText' };
/** A `nft -j` document; only `nftJson` makes one. */
export type NftJsonText = string & { readonly [brand]: 'NftJsonText' };

/** A checked piece of a command, or a whole command; only this module makes them. */
export interface NftPart {
  readonly text: string;
  readonly [brand]: 'NftPart';
}

const P = pieces<NftPart>(NFT_PROTOCOL);
const part = P.make;
const fail = P.fail;

/** nft's unquoted string (scanner.l `string`): what a table, chain or set name must be on a command line. */
const NAME = /^[A-Za-z_.][A-Za-z0-9/_.-]*$/;

/**
 * The words nft 1.0.x's scanner reads as keywords (the parser's token names, and the scanner's
 * spellings of the same tokens): a name spelled like one is not read as a name.
 */
const KEYWORDS: ReadonlySet<string> = new Set(
  `vmap include define redefine undefine fib socket transparent wildcard cgroupv2 tproxy osf synproxy mss wscale
  typeof hook hooks device devices table tables chain chains rule rules sets set element map maps flowtable
  handle ruleset trace inet netdev add update replace create insert delete get list reset flush rename describe
  import export monitor all accept drop continue jump goto return to constant interval dynamic auto-merge
  timeout gc-interval elements expires policy memory performance size flow offload meter meters flowtables ll
  nh th bridge ether saddr daddr type vlan id cfi dei pcp arp htype ptype hlen plen operation ip version
  hdrlength dscp ecn length frag-off ttl protocol checksum ptr value lsrr rr ssrr ra icmp code seq gateway mtu
  igmp mrt options ip6 priority flowlabel nexthdr hoplimit icmpv6 param-problem max-delay ah reserved spi esp
  comp flags cpi port udp sport dport udplite csumcov tcp ackseq doff window urgptr option echo eol mptcp nop
  sack sack0 sack1 sack2 sack3 sack-permitted fastopen md5sig timestamp count left right tsval tsecr subtype
  dccp sctp chunk data init init-ack heartbeat heartbeat-ack abort shutdown shutdown-ack error cookie-echo
  cookie-ack ecne cwr shutdown-complete asconf-ack forward-tsn asconf tsn stream ssn ppid init-tag a-rwnd
  num-outbound-streams num-inbound-streams initial-tsn cum-tsn-ack num-gap-ack-blocks num-dup-tsns lowest-tsn
  seqno new-cum-tsn vtag rt rt0 rt2 srh seg-left addr last-entry tag sid hbh frag reserved2 more-fragments dst
  mh meta mark iif iifname iiftype oif oifname oiftype skuid skgid nftrace rtclassid ibriport obriport ibrname
  obrname pkttype cpu iifgroup oifgroup cgroup time classid nexthop ct l3proto proto-src proto-dst zone
  direction event expectation expiration helper label state status original reply counter name packets bytes
  avgpkt counters quotas limits synproxys helpers log prefix group snaplen queue-threshold level limit rate
  burst over until quota used secmark secmarks second minute hour day week reject with icmpx snat dnat
  masquerade redirect random fully-random persistent queue num bypass fanout dup fwd numgen inc mod offset
  jhash symhash seed position index comment xml json vm notrack exists missing exthdr ipsec reqid spnum in out
  xt eq ne le lt ge gt lshift rshift xor and or not maxseg noop sack-perm last never tunnel tunnels destroy`
    .split(/\s+/)
    .filter((w) => w !== ''),
);

/** Why `value` cannot be one word of a command, or null. */
export function nftWordProblem(value: string): string | null {
  return wordProblem(value, NFT_SPECIAL);
}

/** Why `name` cannot be a table, chain or set name, or null. */
export function nftNameProblem(name: string): string | null {
  const p = wordProblem(name, NFT_SPECIAL);
  if (p !== null) return p;
  if (Buffer.byteLength(name, 'utf8') > NFT_NAME_MAX) return `is longer than ${NFT_NAME_MAX} bytes`;
  if (!NAME.test(name) || name === '.') return 'is not a plain nft name (a letter, "_" or "." first, then letters, digits, "/", "_", "." or "-")';
  if (KEYWORDS.has(name)) return 'is an nft keyword';
  return null;
}

/** Why `text` cannot be a quoted string (a comment) that nft reads back as itself, or null. */
export function nftCommentProblem(text: string): string | null {
  if (text === '') return 'is empty';
  // nft's quoted string ends at the next `"` and knows no escapes; blanks are what the quotes are for.
  const p = wordProblem(text.replaceAll(' ', '_'), '"');
  if (p !== null) return p;
  if (Buffer.byteLength(text, 'utf8') > NFT_COMMENT_MAX) return `is longer than ${NFT_COMMENT_MAX} bytes`;
  return null;
}

/** A table, chain or set name. */
export function nftName(field: string, name: string): NftPart {
  const p = nftNameProblem(name);
  if (p !== null) fail(field, name, p);
  return part(name);
}

/** A comment (or any string nft keeps verbatim), in quotes. */
export function nftComment(field: string, text: string): NftPart {
  const p = nftCommentProblem(text);
  if (p !== null) fail(field, text, p);
  return part(`"${text}"`);
}

/** One word of an expression. */
export function nftWord(field: string, value: string): NftPart {
  const p = nftWordProblem(value);
  if (p !== null) fail(field, value, p);
  return part(value);
}

/** Words of an expression, one each, separated by blanks. */
export function nftWords(field: string, values: readonly string[]): NftPart {
  return part(values.map((v) => nftWord(field, v).text).join(' '));
}

/** Why `text` is not a rule body of words and quoted strings only, or null. */
export function nftRuleProblem(text: string): string | null {
  return scanProblem(text, { word: nftWordProblem, quoted: nftCommentProblem, escapes: false });
}

/** A rule body kept as text (NftRuleText, or read back), checked again before it goes into a command. */
export function nftRuleBody(field: string, text: string): NftPart {
  const p = nftRuleProblem(text);
  if (p !== null) fail(field, text, p);
  return part(text);
}

export type NftValue = TemplateValue<NftPart>;

const word = (field: string, value: string): string => nftWord(field, value).text;

function render(strings: TemplateStringsArray, values: readonly NftValue[]): string {
  return P.render(strings, values, word);
}

/**
 * A command, or a piece of one: the template's text with each value in its place (a string as one
 * word, a number as an integer, an address or prefix as printed, an NftPart as made).
 */
export function nft(strings: TemplateStringsArray, ...values: readonly NftValue[]): NftPart {
  return part(render(strings, values));
}

/** A rule body as text; like `nft`, and it must read as words and quoted strings only. */
export function nftRule(strings: TemplateStringsArray, ...values: readonly NftValue[]): NftRuleText {
  return nftRuleBody('rule', render(strings, values)).text as NftRuleText;
}

/** Pieces joined by one blank, empty ones left out. */
export function nftJoin(pieces: readonly NftPart[]): NftPart {
  return part(
    pieces
      .map((p) => P.valueText(p, 'piece', word))
      .filter((t) => t !== '')
      .join(' '),
  );
}

/** The script: one command a line. */
export function nftScript(commands: readonly NftPart[]): NftScript {
  const out: string[] = [];
  for (const c of commands) {
    if (!P.isPiece(c) || hasControl(c.text)) throw new TypeError(`${NFT_PROTOCOL} renderer: a command must come from the renderer`);
    out.push(c.text);
  }
  return `${out.join('\n')}\n` as NftScript;
}

// ---- nft -j ----

export type NftJson = null | boolean | number | string | NftJson[] | { [k: string]: NftJson };

/** Keys whose string is a table, chain or set name; a comment; the rest are words. */
const NAME_KEYS: ReadonlySet<string> = new Set(['name', 'table', 'chain', 'target', 'set']);

function checkJson(v: NftJson, key: string, path: string): void {
  if (typeof v === 'string') {
    const p = NAME_KEYS.has(key) ? nftNameProblem(v) : key === 'comment' ? nftCommentProblem(v) : nftWordProblem(v);
    if (p !== null) fail(path, v, p);
  } else if (typeof v === 'number') {
    if (!Number.isFinite(v)) fail(path, String(v), 'is not a number');
  } else if (Array.isArray(v)) {
    v.forEach((x, i) => checkJson(x, key, `${path}[${i}]`));
  } else if (v !== null && typeof v === 'object') {
    for (const [k, x] of Object.entries(v)) checkJson(x, k, path === '' ? k : `${path}.${k}`);
  }
}

/**
 * A `nft -j` document as text, after every string in it passed the check of its place (so no
 * name, comment or value means more in JSON than it would in a script: no `@set`, no `$var`).
 */
export function nftJson(doc: NftJson): NftJsonText {
  checkJson(doc, '', '');
  return JSON.stringify(doc) as NftJsonText;
}
