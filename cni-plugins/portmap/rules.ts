// The iptables rule model of portmap (nat table), pure. Every rule is rendered exactly as
// `iptables-save` prints it (addresses, then interfaces, then -p, then matches in order, implicit
// `-m tcp` spelled out), so the same text is the iptables-restore payload, the read-back
// comparison for CHECK, and the `-D` spec for teardown. Chain names, comments, rule order and
// mark values are the reference plugin's (containernetworking/plugins meta/portmap, v1.1.1).

import { IPAddr, IPNet, type Family } from '../../src/util/ip.js';
import {
  iptablesPayload,
  xt,
  xtAppend,
  xtChain,
  xtCheck,
  xtDeclare,
  xtDelete,
  xtDeleteChain,
  xtInsert,
  xtJoin,
  xtNewChain,
  xtQuote,
  xtSavedSpec,
  xtWord,
  type IptablesPayload,
  type XtLine,
  type XtSpec,
} from '../../src/render/iptables.js';
import type { ContainerAddr, PortMapConfig } from './config.js';
import { conditionsOf } from './config.js';
import { sha512Hex } from '../skel/sha512.js';

export const TOP_DNAT_CHAIN = 'CNI-HOSTPORT-DNAT';
export const SETMARK_CHAIN = 'CNI-HOSTPORT-SETMARK';
export const MASQ_CHAIN = 'CNI-HOSTPORT-MASQ';
/** Entry chain of the per-container SNAT chains of plugin versions before 0.7; torn down on DEL. */
export const OLD_TOP_SNAT_CHAIN = 'CNI-HOSTPORT-SNAT';

const MAX_CHAIN_LEN = 28;
/** iptables' comment match holds 255 characters plus NUL. */
const MAX_COMMENT_LEN = 255;
/** multiport accepts at most 15 ports per rule. */
const MULTIPORT_MAX = 15;

/** The per-container chain name: `CNI-<prefix><sha512(name + id) in hex>`, cut to 28 characters. */
export function formatChainName(name: string, id: string, prefix: string): string {
  const head = `CNI-${prefix}`;
  if (head.length >= MAX_CHAIN_LEN) throw new RangeError(`chain prefix ${prefix} too long`);
  const hex = sha512Hex(name + id);
  return head + hex.slice(0, MAX_CHAIN_LEN - head.length);
}

export const dnatChainName = (name: string, id: string): string => formatChainName(name, id, 'DN-');
export const oldSnatChainName = (name: string, id: string): string => formatChainName(name, id, 'SN-');

/**
 * Cuts a comment to what iptables accepts. (Upstream keeps 253 characters plus "...", 256 in all,
 * which iptables refuses; we keep 252 so the rule can be made.)
 */
export function trimComment(c: string): string {
  return c.length <= MAX_COMMENT_LEN ? c : `${c.slice(0, MAX_COMMENT_LEN - 3)}...`;
}

export const dnatComment = (name: string, id: string): string => trimComment(`dnat name: "${name}" id: "${id}"`);

/** Quotes a string the way iptables-save does (xtables_save_string): only when it has other characters. */
export function quoteToken(t: string): string {
  return xtQuote('comment', t).text;
}

/** Port lists for multiport, at most 15 per rule, in mapping order. */
export function splitPortList(ports: readonly number[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < ports.length; i += MULTIPORT_MAX) out.push(ports.slice(i, i + MULTIPORT_MAX).join(','));
  return out;
}

export function markDef(bit: number): string {
  const v = `0x${(2 ** bit).toString(16)}`;
  return `${v}/${v}`;
}

/** `-d 10.0.0.1` as iptables-save prints it: `/32` (or `/128`) added, host bits cleared. */
function addrArg(ip: IPAddr): string {
  return `${ip.toString()}/${ip.bits}`;
}

function ipPort(ip: IPAddr, port: number): XtSpec {
  return ip.family === 6 ? xt`[${ip}]:${port}` : xt`${ip}:${port}`;
}

const chain = (name: string): string => xtChain('chain', name).text;

// ---- the rules each piece needs, as specs (the line without `-A CHAIN`) ----

export const TOP_JUMP_SPEC = xt`-m addrtype --dst-type LOCAL -j ${chain(TOP_DNAT_CHAIN)}`;
export const TOP_JUMP_CHAINS = ['PREROUTING', 'OUTPUT'] as const;
export const MASQ_JUMP_SPEC = xt`-m comment --comment ${xtQuote('comment', 'CNI portfwd requiring masquerade')} -j ${chain(MASQ_CHAIN)}`;
export const setMarkSpec = (bit: number): XtSpec =>
  xt`-m comment --comment ${xtQuote('comment', 'CNI portfwd masquerade mark')} -j MARK --set-xmark ${markDef(bit)}`;
export const masqSpec = (bit: number): XtSpec => xt`-m mark --mark ${markDef(bit)} -j MASQUERADE`;

/** What one family of one container needs in the nat table. */
export interface XtDesired {
  readonly family: Family;
  readonly dnatChain: string;
  /** The container chain's rules, in order, each once. */
  readonly chainRules: readonly XtSpec[];
  /** The rules in CNI-HOSTPORT-DNAT that jump to the container chain, in order. */
  readonly entryRules: readonly XtSpec[];
  /** SETMARK and MASQ rule specs when this plugin owns the masquerade chains (snat, no external chain). */
  readonly mark: { readonly setMark: XtSpec; readonly masq: XtSpec } | null;
  /** The entry conditions could not all be put in iptables-save order (CHECK then compares the rest loosely). */
  readonly conditionsOpaque: boolean;
}

const GENERIC_OPTS: Readonly<Record<string, 's' | 'd' | 'i' | 'o'>> = {
  '-s': 's',
  '--source': 's',
  '--src': 's',
  '-d': 'd',
  '--destination': 'd',
  '--dst': 'd',
  '-i': 'i',
  '--in-interface': 'i',
  '-o': 'o',
  '--out-interface': 'o',
};
const GENERIC_FLAG = { s: '-s', d: '-d', i: '-i', o: '-o' } as const;

function normaliseAddrArg(v: string, family: Family): string | null {
  if (v.includes('/')) {
    const net = IPNet.tryParse(v);
    return net && net.family === family ? net.toString() : null;
  }
  const ip = IPAddr.tryParse(v);
  return ip && ip.family === family ? addrArg(ip) : null;
}

/**
 * Splits user conditions into the generic options iptables-save prints first (`[!] -s/-d/-i/-o`)
 * and the rest, which it prints after the rule's own matches in the given order. `opaque` is set
 * when a value could not be normalised (a hostname, a list, a dotted mask). Every token is one
 * plain argument (the config's grammar already made sure; the renderer checks again).
 */
export function splitConditions(conds: readonly string[], family: Family): { generic: XtSpec[]; rest: XtSpec[]; opaque: boolean } {
  const found: Partial<Record<'s' | 'd' | 'i' | 'o', XtSpec>> = {};
  const rest: XtSpec[] = [];
  let opaque = false;
  const field = family === 4 ? 'conditionsV4' : 'conditionsV6';
  for (let i = 0; i < conds.length; i++) {
    const t = conds[i]!;
    const negated = t === '!' && GENERIC_OPTS[conds[i + 1] ?? ''] !== undefined;
    const opt = negated ? conds[i + 1]! : t;
    const kind = GENERIC_OPTS[opt];
    const valueAt = negated ? i + 2 : i + 1;
    if (kind !== undefined && valueAt < conds.length && found[kind] === undefined) {
      let value = conds[valueAt]!;
      if (kind === 's' || kind === 'd') {
        const n = normaliseAddrArg(value, family);
        if (n === null) opaque = true;
        else value = n;
      }
      const arg = xtWord(field, value);
      found[kind] = negated ? xt`! ${GENERIC_FLAG[kind]} ${arg}` : xt`${GENERIC_FLAG[kind]} ${arg}`;
      i = valueAt;
      continue;
    }
    rest.push(xtWord(field, t).text as XtSpec);
  }
  const generic = (['s', 'd', 'i', 'o'] as const).flatMap((k) => (found[k] === undefined ? [] : [found[k]]));
  return { generic, rest, opaque };
}

/**
 * The container chain's name and the rules in CNI-HOSTPORT-DNAT that jump to it, for one family:
 * ports grouped per protocol, protocols sorted, 15 ports per rule. They do not depend on the
 * container's address, so DEL can compute them without prevResult.
 */
export function dnatEntryRules(
  conf: PortMapConfig,
  containerId: string,
  family: Family,
): { dnatChain: string; entryRules: XtSpec[]; conditionsOpaque: boolean } {
  const dnatChain = dnatChainName(conf.name, containerId);
  const comment = xtQuote('comment', dnatComment(conf.name, containerId));
  const { generic, rest, opaque } = splitConditions(conditionsOf(conf, family), family);
  const byProto = new Map<string, number[]>();
  for (const pm of conf.portMappings) {
    const list = byProto.get(pm.protocol) ?? [];
    list.push(pm.hostPort);
    byProto.set(pm.protocol, list);
  }
  const entryRules: XtSpec[] = [];
  for (const proto of [...byProto.keys()].sort()) {
    for (const ports of splitPortList(byProto.get(proto)!)) {
      entryRules.push(
        xtJoin([...generic, xt`-p ${proto} -m comment --comment ${comment} -m multiport --dports ${ports}`, ...rest, xt`-j ${chain(dnatChain)}`]),
      );
    }
  }
  return { dnatChain, entryRules, conditionsOpaque: opaque };
}

/**
 * The rules for one family of one container. Mappings whose hostIP is of the other family are
 * left out of the container chain (but, as in the reference, their ports stay in the multiport
 * entry rules, where they match nothing extra that the chain would act on).
 */
export function desiredIptables(conf: PortMapConfig, containerId: string, family: Family, addr: ContainerAddr): XtDesired {
  const { dnatChain, entryRules, conditionsOpaque } = dnatEntryRules(conf, containerId, family);
  const setMarkChain = conf.externalSetMarkChain ?? SETMARK_CHAIN;

  // Per mapping: hairpin mark, localhost mark (v4), DNAT — the marks must come first.
  const rules: XtSpec[] = [];
  const mark = chain(setMarkChain);
  for (const pm of conf.portMappings) {
    let dst: XtSpec | null = null;
    if (pm.hostIP) {
      if (pm.hostIP.family !== family) continue;
      if (!pm.hostIP.isUnspecified()) dst = xt`-d ${addrArg(pm.hostIP)}`;
    }
    const base = xtJoin([...(dst ? [dst] : []), xt`-p ${pm.protocol} -m ${pm.protocol} --dport ${pm.hostPort}`]);
    if (conf.snat) {
      // `-s 0.0.0.0/0` is no match at all; iptables-save leaves it out.
      rules.push(conf.masqAll ? xtJoin([base, xt`-j ${mark}`]) : xtJoin([xt`-s ${addr.net}`, base, xt`-j ${mark}`]));
      if (family === 4 && !conf.masqAll) rules.push(xtJoin([xt`-s 127.0.0.1/32`, base, xt`-j ${mark}`]));
    }
    rules.push(xtJoin([base, xt`-j DNAT --to-destination ${ipPort(addr.ip, pm.containerPort)}`]));
  }
  // The reference adds each rule only if it is not there yet: duplicates collapse.
  const chainRules = [...new Set(rules)];

  const ownsMark = conf.snat && conf.externalSetMarkChain === null;
  return {
    family,
    dnatChain,
    chainRules,
    entryRules,
    mark: ownsMark ? { setMark: setMarkSpec(conf.markMasqBit), masq: masqSpec(conf.markMasqBit) } : null,
    conditionsOpaque,
  };
}

// ---- reading iptables-save ----

export interface SavedNat {
  readonly chains: ReadonlySet<string>;
  /** chain → rule specs (the `-A CHAIN` prefix removed), in order, as read (checked when written back). */
  readonly rules: ReadonlyMap<string, readonly string[]>;
}

/** Parses `iptables-save -t nat` output (only the nat table's chains and `-A` lines). */
export function parseSave(text: string): SavedNat {
  const chains = new Set<string>();
  const rules = new Map<string, string[]>();
  let inNat = false;
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (line.startsWith('*')) inNat = line === '*nat';
    else if (!inNat) continue;
    else if (line.startsWith(':')) chains.add(line.slice(1).split(' ')[0]!);
    else if (line.startsWith('-A ')) {
      const sp = line.indexOf(' ', 3);
      const chain = sp < 0 ? line.slice(3) : line.slice(3, sp);
      const spec = sp < 0 ? '' : line.slice(sp + 1);
      const list = rules.get(chain) ?? [];
      list.push(spec);
      rules.set(chain, list);
    }
  }
  return { chains, rules };
}

const rulesOf = (saved: SavedNat, chain: string): readonly string[] => saved.rules.get(chain) ?? [];
const jumpsTo = (spec: string, chain: string): boolean => spec.endsWith(` -j ${chain}`) || spec === `-j ${chain}`;

const wrap = (lines: readonly XtLine[]): IptablesPayload => iptablesPayload('nat', lines);

/**
 * The iptables-restore --noflush payload that brings one family to `want`: shared chains and
 * their jumps created only when missing (declaring an existing chain would flush it), the
 * container chain declared (created, or emptied) and written whole, its entry rules replaced
 * unless already exactly right. `-N` and `-D` make the transaction fail, instead of doing harm,
 * when another process changed the table since `saved` was read; the caller then re-reads.
 */
export function planAdd(want: XtDesired, saved: SavedNat): IptablesPayload {
  const decl = [xtDeclare(want.dnatChain)];
  const body: XtLine[] = [];
  const ensureChain = (name: string): void => {
    if (!saved.chains.has(name)) decl.push(xtNewChain(name));
  };
  const ensureRule = (name: string, spec: XtSpec, insertFirst = false): void => {
    if (rulesOf(saved, name).includes(spec)) return;
    body.push(insertFirst ? xtInsert(name, 1, spec) : xtAppend(name, spec));
  };

  if (want.mark) {
    ensureChain(SETMARK_CHAIN);
    ensureChain(MASQ_CHAIN);
    ensureRule(SETMARK_CHAIN, want.mark.setMark);
    ensureRule(MASQ_CHAIN, want.mark.masq);
    // First in POSTROUTING: the bridge/ptp masquerade rules would otherwise act before it.
    ensureRule('POSTROUTING', MASQ_JUMP_SPEC, true);
  }
  ensureChain(TOP_DNAT_CHAIN);
  for (const c of TOP_JUMP_CHAINS) ensureRule(c, TOP_JUMP_SPEC);

  for (const spec of want.chainRules) body.push(xtAppend(want.dnatChain, spec));

  const current = rulesOf(saved, TOP_DNAT_CHAIN).filter((s) => jumpsTo(s, want.dnatChain));
  const same = current.length === want.entryRules.length && current.every((s, i) => s === want.entryRules[i]);
  if (!same) {
    for (const s of current) body.push(xtDelete(TOP_DNAT_CHAIN, xtSavedSpec(s)));
    for (const s of want.entryRules) body.push(xtAppend(TOP_DNAT_CHAIN, s));
  }
  return wrap([...decl, ...body]);
}

/**
 * The ADD payload written without reading the table, for the common case: a new container chain
 * and shared chains and jumps already in place (every pod after the first on a node). Its `-N`
 * fails when the container chain exists (then jumps to it may exist too, which only a read can
 * tell) and its `-C` lines fail when a shared chain, jump or masquerade rule is missing (e.g.
 * after something flushed PREROUTING, OUTPUT or POSTROUTING); a failure rolls back the whole
 * transaction and the caller falls back to reading the table and `planAdd`, which restores the
 * missing pieces. When it succeeds it has done exactly what `planAdd` would have done, which in
 * that state is: create the chain, fill it, append its entry rules.
 */
export function planAddBlind(want: XtDesired): IptablesPayload {
  const lines = [xtNewChain(want.dnatChain)];
  for (const c of TOP_JUMP_CHAINS) lines.push(xtCheck(c, TOP_JUMP_SPEC));
  if (want.mark) {
    lines.push(xtCheck(SETMARK_CHAIN, want.mark.setMark), xtCheck(MASQ_CHAIN, want.mark.masq), xtCheck('POSTROUTING', MASQ_JUMP_SPEC));
  }
  for (const spec of want.chainRules) lines.push(xtAppend(want.dnatChain, spec));
  for (const spec of want.entryRules) lines.push(xtAppend(TOP_DNAT_CHAIN, spec));
  return wrap(lines);
}

/** A per-container chain and the shared chain that jumps to it. */
export interface OwnedChain {
  readonly chain: string;
  readonly entryChain: string;
}

export const ownedChains = (name: string, containerId: string): OwnedChain[] => [
  { chain: dnatChainName(name, containerId), entryChain: TOP_DNAT_CHAIN },
  { chain: oldSnatChainName(name, containerId), entryChain: OLD_TOP_SNAT_CHAIN },
];

/** Deletes the jumps to each chain, then the chain. null when none of it exists. */
export function planTeardown(chains: readonly OwnedChain[], saved: SavedNat): IptablesPayload | null {
  const lines: XtLine[] = [];
  for (const { chain: name, entryChain } of chains) {
    for (const s of rulesOf(saved, entryChain)) if (jumpsTo(s, name)) lines.push(xtDelete(entryChain, xtSavedSpec(s)));
    if (saved.chains.has(name)) lines.push(xtDeclare(name), xtDeleteChain(name));
  }
  return lines.length === 0 ? null : wrap(lines);
}

/**
 * The DEL payload written without reading the table: deletes the container chain's entry rules
 * as ADD wrote them (`entryRules`), then the container chain and the pre-0.7 SNAT chain (each
 * declared first, so one that does not exist is created and removed again). It fails as a whole,
 * and the caller falls back to reading the table and `planTeardown`, whenever anything else
 * still refers to either chain or an entry rule is not there (already deleted, or written with
 * other mappings or conditions). When it succeeds it has done what `planTeardown` would have.
 */
export function planTeardownBlind(dnatChain: string, entryRules: readonly XtSpec[], oldSnatChain: string): IptablesPayload {
  const lines = entryRules.map((spec) => xtDelete(TOP_DNAT_CHAIN, spec));
  for (const name of [dnatChain, oldSnatChain]) lines.push(xtDeclare(name), xtDeleteChain(name));
  return wrap(lines);
}

/** Extracts the fields CHECK compares loosely when the conditions are opaque. */
function entryKey(spec: string): string | null {
  const m = /(?:^| )-p (\S+) .*-m comment --comment ("(?:[^"\\]|\\.)*"|\S+) .*-m multiport --dports (\S+) .*-j (\S+)$/.exec(spec);
  return m ? `${m[1]} ${m[2]} ${m[3]} ${m[4]}` : null;
}

/**
 * What is missing for `want` in `saved`, one message each (empty when all is in place). Checks
 * what the reference checks (the container chain, its rules, its entry rules) and also the shared
 * jumps and masquerade rules, without which the mapping does nothing.
 */
export function checkIptables(want: XtDesired, saved: SavedNat): string[] {
  const problems: string[] = [];
  if (!saved.chains.has(want.dnatChain)) return [`chain ${want.dnatChain} not found in iptables table nat`];
  const chainRules = rulesOf(saved, want.dnatChain);
  for (const spec of want.chainRules) {
    if (!chainRules.includes(spec)) problems.push(`rule "${spec}" in chain ${want.dnatChain} not found in table nat`);
  }
  const entries = rulesOf(saved, TOP_DNAT_CHAIN);
  for (const spec of want.entryRules) {
    if (entries.includes(spec)) continue;
    const key = want.conditionsOpaque ? entryKey(spec) : null;
    if (key !== null && entries.some((s) => entryKey(s) === key)) continue;
    problems.push(`rule "${spec}" in chain ${TOP_DNAT_CHAIN} not found in table nat`);
  }
  for (const c of TOP_JUMP_CHAINS) {
    if (!rulesOf(saved, c).includes(TOP_JUMP_SPEC)) problems.push(`rule "${TOP_JUMP_SPEC}" in chain ${c} not found in table nat`);
  }
  if (want.mark) {
    const need: [string, string][] = [
      [SETMARK_CHAIN, want.mark.setMark],
      [MASQ_CHAIN, want.mark.masq],
      ['POSTROUTING', MASQ_JUMP_SPEC],
    ];
    for (const [chain, spec] of need) {
      if (!rulesOf(saved, chain).includes(spec)) problems.push(`rule "${spec}" in chain ${chain} not found in table nat`);
    }
  }
  return problems;
}

const ENTRY_COMMENT = /--comment "dnat name: \\"([^"\\]*)\\" id: \\"([^"\\]*)\\""/;

/**
 * GC: the container chains of network `name` whose container is not valid any more. A chain is
 * recognised by its entry rule's comment (network name and container ID) and only taken when its
 * name is the hash of exactly those, so chains of other networks and truncated comments are left
 * alone.
 */
export function staleChains(name: string, isValid: (containerId: string) => boolean, saved: SavedNat): OwnedChain[] {
  const out = new Map<string, OwnedChain>();
  for (const spec of rulesOf(saved, TOP_DNAT_CHAIN)) {
    const m = ENTRY_COMMENT.exec(spec);
    if (!m || m[1] !== name) continue;
    const id = m[2]!;
    const chain = dnatChainName(name, id);
    if (!jumpsTo(spec, chain) || isValid(id)) continue;
    out.set(chain, { chain, entryChain: TOP_DNAT_CHAIN });
  }
  return [...out.values()];
}
