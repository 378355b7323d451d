// The grammar of portmap's conditionsV4/conditionsV6: the tokens of exactly one rule-match
// fragment, which the plugin splices into the rules that send traffic to the host ports, and
// nothing else. Checked when the config is read, so a config that could change a verdict, start
// another command or touch another table is refused before anything runs.
//
// iptables: a sequence of options, each `[!] -x|--xx [!] argument…`, where -x is one of the
// generic matches (-s -d -i -o -p -m -f) and --xx any long option that getopt could not take for
// a command, a table, a jump or a goto (also as an abbreviation: iptables accepts `--ju` for
// `--jump`); arguments are plain words. No attached arguments (`-jACCEPT`), no `--opt=value`.
//
// nftables: words of match expressions only: none of nft's special characters (`;` ends a
// command, `{ }` open a block or a set, `#` a comment, quotes, `\`, `$` variables, `@` sets) and
// no keyword of a verdict, a statement or a command.
import { nftWordProblem } from '../../src/render/nft.js';
import { xtWordProblem } from '../../src/render/iptables.js';

const XT_SHORT: ReadonlySet<string> = new Set(['-s', '-d', '-i', '-o', '-p', '-m', '-f']);

/** Long options that act on tables, chains, verdicts or the program; a user option may not be one or a prefix of one. */
const XT_FORBIDDEN_LONG = [
  'jump',
  'goto',
  'append',
  'check',
  'delete',
  'delete-chain',
  'insert',
  'replace',
  'list',
  'list-rules',
  'flush',
  'zero',
  'new-chain',
  'policy',
  'rename-chain',
  'table',
  'help',
  'version',
  'set-counters',
  'wait',
  'wait-interval',
  'line-numbers',
  'numeric',
  'verbose',
  'exact',
  'modprobe',
  'ipv4',
  'ipv6',
];

const XT_LONG = /^--[A-Za-z0-9][A-Za-z0-9-]*$/;

/** Why one iptables condition token list is not a match fragment: [index, reason], or null. */
export function iptablesConditionsProblem(tokens: readonly string[]): [number, string] | null {
  let expectOption = true; // nothing yet, or `!` before an option
  let negated = false;
  for (const [i, t] of tokens.entries()) {
    if (t === '!') {
      if (negated) return [i, 'is a second "!" in a row'];
      negated = true;
      continue;
    }
    if (t.startsWith('-')) {
      if (/^-[A-Za-z0-9]$/.test(t)) {
        if (!XT_SHORT.has(t)) return [i, `is not a match option (only ${[...XT_SHORT].join(' ')} and long match options; no -j/-g, commands or tables)`];
      } else if (XT_LONG.test(t)) {
        const name = t.slice(2);
        const hit = XT_FORBIDDEN_LONG.find((f) => f.startsWith(name));
        if (hit !== undefined) return [i, `is not a match option (iptables takes it as --${hit})`];
      } else {
        return [i, 'is not an option: -x or --name, with the argument as the next token'];
      }
      expectOption = false;
      negated = false;
      continue;
    }
    if (expectOption) return [i, 'must follow an option'];
    const p = xtWordProblem(t);
    if (p !== null) return [i, p];
    negated = false;
  }
  if (negated) return [tokens.length - 1, 'ends the conditions without an option or argument'];
  return null;
}

/** nft keywords that are not part of a match: verdicts, statements, commands, objects. */
const NFT_FORBIDDEN: ReadonlySet<string> = new Set(
  `accept drop continue jump goto return queue reject vmap map set counter counters log limit quota meter flow offload
  snat dnat masquerade redirect notrack dup fwd tproxy synproxy xt last secmark comment typeof
  add update replace create insert delete get list reset flush rename describe import export monitor destroy
  table tables chain chains rule rules ruleset element elements flowtable flowtables handle position index
  include define redefine undefine hook policy device devices`
    .split(/\s+/)
    .filter((w) => w !== ''),
);

/** Why one nft condition token list is not a match fragment: [index, reason], or null. */
export function nftConditionsProblem(tokens: readonly string[]): [number, string] | null {
  for (const [i, t] of tokens.entries()) {
    const p = nftWordProblem(t);
    if (p !== null) return [i, p];
    if (NFT_FORBIDDEN.has(t.toLowerCase())) return [i, 'is not part of a match (no verdict, statement or command)'];
  }
  return null;
}
