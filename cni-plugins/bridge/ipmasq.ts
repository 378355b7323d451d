// ipMasq: per-container SNAT rules with the reference's names, so weft and the reference plugins
// can set up and tear down each other's rules.
//
// iptables backend (pkg/ip/ipmasq_iptables_linux.go): nat chain CNI-<sha512(net+cid)>[:24], comment
// `name: "<net>" id: "<cid>"`, a POSTROUTING jump per pod IP; applied as one
// `iptables-restore -w --noflush` transaction per family. Teardown finds the POSTROUTING jumps to
// the chain by its name (so it needs neither the netns nor the pod's IPs — reference bug #810)
// and deletes them and the chain in one transaction.
//
// nftables backend (pkg/ip/ipmasq_nftables_linux.go): table inet cni_plugins_masquerade, one rule
// per IP in masq_checks with a comment that starts with hash16(net)-hash16(ifname:cid).
import { accessSync, constants } from 'node:fs';
import { errorMessage } from '../../src/util/errors.js';
import { CommandError, execChecked, execProgram } from '../../src/util/exec.js';
import { IPNet, MULTICAST, type Family } from '../../src/util/ip.js';
import { sha512Hex } from '../skel/sha512.js';
import { splitRuleArgs } from '../../src/util/rule-args.js';
import {
  iptablesPayload,
  xt,
  xtAppend,
  xtChain,
  xtDeclare,
  xtDelete,
  xtDeleteChain,
  xtJoin,
  xtQuote,
  xtSavedSpec,
  type IptablesPayload,
  type XtLine,
  type XtSpec,
} from '../../src/render/iptables.js';
import { nftJson, type NftJson } from '../../src/render/nft.js';

// ---- names ----

/** The reference utils.FormatChainName: "CNI-" + sha512 hex, 28 characters in all. */
export function masqChainName(network: string, containerId: string): string {
  return `CNI-${sha512Hex(network + containerId)}`.slice(0, 28);
}

/** Go's %q for the plain strings CNI allows (escapes backslash and double quote). */
function goQuote(s: string): string {
  return `"${s.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;
}

/** The reference utils.FormatComment. */
export function masqComment(network: string, containerId: string): string {
  return `name: ${goQuote(network)} id: ${goQuote(containerId)}`;
}

/** A pod address: the IP and its network (what the ACCEPT rule exempts). */
export interface MasqAddr {
  readonly ip: string;
  readonly net: IPNet;
  readonly family: Family;
}

export function masqAddr(cidr: string): MasqAddr {
  const { ip, net } = IPNet.parseWithHost(cidr);
  return { ip: ip.toString(), net, family: ip.family };
}


const commentMatch = (comment: string): XtSpec => xt`-m comment --comment ${xtQuote('comment', comment)}`;

/**
 * The restore text for one family: the chain (declared, i.e. created or flushed), per IP the
 * ACCEPT for its network and the MASQUERADE (each rule once, in the reference's append order),
 * then the POSTROUTING jumps.
 */
export function renderMasqSetup(addrs: readonly MasqAddr[], chain: string, comment: string): IptablesPayload {
  const c = commentMatch(comment);
  const chainRules: XtSpec[] = [];
  const jumps: XtSpec[] = [];
  for (const a of addrs) {
    const accept = xtJoin([xt`-d ${a.net}`, c, xt`-j ACCEPT`]);
    const masq = xtJoin([xt`! -d ${MULTICAST[a.family]}`, c, xt`-j MASQUERADE`]);
    const jump = xtJoin([xt`-s ${a.ip}/${a.family === 4 ? 32 : 128}`, c, xt`-j ${xtChain('chain', chain)}`]);
    for (const [list, rule] of [
      [chainRules, accept],
      [chainRules, masq],
      [jumps, jump],
    ] as const) {
      if (!list.includes(rule)) list.push(rule);
    }
  }
  return iptablesPayload('nat', [xtDeclare(chain), ...chainRules.map((r) => xtAppend(chain, r)), ...jumps.map((j) => xtAppend('POSTROUTING', j))]);
}

function argAfter(args: readonly string[], flag: string): string | null {
  const i = args.indexOf(flag);
  return i >= 0 && i + 1 < args.length ? args[i + 1]! : null;
}

/** The POSTROUTING rules (as `-A …` lines) that jump to `chain`. */
export function jumpsTo(ruleLines: readonly string[], chain: string): string[] {
  return ruleLines.filter((l) => {
    if (!l.startsWith('-A POSTROUTING ')) return false;
    return argAfter(splitRuleArgs(l), '-j') === chain;
  });
}

/** `-A CHAIN spec` (a line as `iptables -S` or iptables-save prints it) as the `-D` line that deletes that rule. */
function deleteLine(ruleLine: string): XtLine {
  const m = /^-A (\S+) (.*)$/.exec(ruleLine);
  if (!m) throw new IpMasqError('iptables', `not a rule line: ${JSON.stringify(ruleLine)}`);
  return xtDelete(m[1]!, xtSavedSpec(m[2]!));
}

/** Deletes the jumps and the chain; declaring the chain first makes -X safe when it is gone. */
export function renderMasqTeardown(jumpLines: readonly string[], chains: readonly string[]): IptablesPayload {
  return iptablesPayload('nat', [...chains.map(xtDeclare), ...jumpLines.map(deleteLine), ...chains.map(xtDeleteChain)]);
}

/**
 * For GC: the containers with ipMasq state of `network` in a `iptables-save -t nat` dump, each with
 * its chain (verified to be the name the reference derives, so nothing foreign is touched).
 */
export function masqStateByContainer(saveText: string, network: string): Map<string, string> {
  const found = new Map<string, string>();
  for (const line of saveText.split('\n')) {
    if (!line.startsWith('-A ')) continue;
    const args = splitRuleArgs(line);
    const comment = argAfter(args, '--comment');
    if (comment === null) continue;
    const m = /^name: "((?:[^"\\]|\\.)*)" id: "((?:[^"\\]|\\.)*)"$/.exec(comment);
    if (!m) continue;
    const net = m[1]!.replace(/\\(.)/g, '$1');
    const cid = m[2]!.replace(/\\(.)/g, '$1');
    if (net !== network) continue;
    const chain = masqChainName(net, cid);
    const own = args[1] === chain || argAfter(args, '-j') === chain;
    if (own) found.set(cid, chain);
  }
  return found;
}

// ---- iptables driver ----

const RESTORE: Record<Family, string> = { 4: 'iptables-restore', 6: 'ip6tables-restore' };
const LIST: Record<Family, string> = { 4: 'iptables', 6: 'ip6tables' };
const SAVE: Record<Family, string> = { 4: 'iptables-save', 6: 'ip6tables-save' };

/** Why a masquerade change failed, with the family and the tool's own message. */
export class IpMasqError extends Error {
  constructor(
    readonly backend: 'iptables' | 'nftables',
    msg: string,
  ) {
    super(msg);
    this.name = 'IpMasqError';
  }
}

async function restore(family: Family, text: IptablesPayload): Promise<void> {
  try {
    await execChecked(RESTORE[family], ['-w', '--noflush'], { input: text });
  } catch (e) {
    throw new IpMasqError('iptables', `${RESTORE[family]}: ${errText(e)}`);
  }
}

function errText(e: unknown): string {
  if (e instanceof CommandError && e.exitCode !== null) return e.stderr.trim() || `exit status ${e.exitCode}`;
  return errorMessage(e);
}

export async function setupIptablesMasq(addrs: readonly MasqAddr[], network: string, containerId: string): Promise<void> {
  const chain = masqChainName(network, containerId);
  const comment = masqComment(network, containerId);
  await Promise.all(
    ([4, 6] as const).map(async (f) => {
      const mine = addrs.filter((a) => a.family === f);
      if (mine.length > 0) await restore(f, renderMasqSetup(mine, chain, comment));
    }),
  );
}

/**
 * Removes the chain of (network, containerId) and every POSTROUTING jump to it, in one family.
 * With the pod's IPs from the stored result the jumps are known and one transaction does it; if
 * that does not apply exactly (already gone, or jumps of another form), the jumps are listed
 * and removed by what is really there.
 */
export async function teardownIptablesMasq(family: Family, network: string, containerId: string, knownIps: readonly string[] = []): Promise<void> {
  const chain = masqChainName(network, containerId);
  if (knownIps.length > 0) {
    const c = commentMatch(masqComment(network, containerId));
    const jumps = knownIps.map((ip) => `-A POSTROUTING ${xtJoin([xt`-s ${ip}/${family === 4 ? 32 : 128}`, c, xt`-j ${xtChain('chain', chain)}`])}`);
    const r = await execProgram(RESTORE[family], ['-w', '--noflush'], { input: renderMasqTeardown(jumps, [chain]) });
    if (r.code === 0) return;
  }
  let listing: string;
  try {
    listing = (await execChecked(LIST[family], ['-w', '-t', 'nat', '-S', 'POSTROUTING'])).stdout;
  } catch (e) {
    throw new IpMasqError('iptables', `${LIST[family]} -t nat -S POSTROUTING: ${errText(e)}`);
  }
  const jumps = jumpsTo(listing.split('\n'), chain);
  await restore(family, renderMasqTeardown(jumps, [chain]));
}

/** GC: removes this network's chains whose container is not in `keep`. */
export async function gcIptablesMasq(family: Family, network: string, keep: ReadonlySet<string>): Promise<string[]> {
  let save: string;
  try {
    save = (await execChecked(SAVE[family], ['-t', 'nat'])).stdout;
  } catch (e) {
    throw new IpMasqError('iptables', `${SAVE[family]} -t nat: ${errText(e)}`);
  }
  const stale = [...masqStateByContainer(save, network)].filter(([cid]) => !keep.has(cid)).map(([, chain]) => chain);
  if (stale.length === 0) return [];
  const lines = save.split('\n');
  const jumps = stale.flatMap((chain) => jumpsTo(lines, chain));
  await restore(family, renderMasqTeardown(jumps, stale));
  return stale;
}

// ---- nftables driver ----

export const NFT_MASQ_TABLE = 'cni_plugins_masquerade';
export const NFT_MASQ_CHAIN = 'masq_checks';
/** knftables.CommentLengthMax */
const NFT_COMMENT_MAX = 128;

function hash16(s: string): string {
  return sha512Hex(s).slice(0, 16);
}

export function nftNetworkHash(network: string): string {
  return hash16(network);
}

export function nftInstanceHash(network: string, ifname: string, containerId: string): string {
  return `${hash16(network)}-${hash16(`${ifname}:${containerId}`)}`;
}

export function nftMasqComment(network: string, ifname: string, containerId: string): string {
  const strip = (s: string) => s.replaceAll('"', '');
  const c = `${nftInstanceHash(network, ifname, containerId)}, net: ${strip(network)}, if: ${strip(ifname)}, id: ${strip(containerId)}`;
  return c.slice(0, NFT_COMMENT_MAX);
}

type Json = NftJson;

const T = { family: 'inet', table: NFT_MASQ_TABLE } as const;

function payloadMatch(proto: 'ip' | 'ip6', field: 'saddr' | 'daddr', op: '==' | '!=', right: Json): Json {
  return { match: { op, left: { payload: { protocol: proto, field } }, right } };
}

function prefix(net: IPNet): Json {
  return { prefix: { addr: net.ip.toString(), len: net.prefix } };
}

/** The nft JSON transaction of the upstream setupIPMasqNFTables for all addresses at once. */
export function renderNftMasqSetup(addrs: readonly MasqAddr[], comment: string, staleHandles: readonly number[]): Json {
  const cmds: Json[] = [
    { add: { table: { family: 'inet', name: NFT_MASQ_TABLE } } },
    { add: { chain: { ...T, name: NFT_MASQ_CHAIN } } },
    { add: { chain: { ...T, name: 'postrouting', type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } } },
    { flush: { chain: { ...T, name: 'postrouting' } } },
    { add: { rule: { ...T, chain: 'postrouting', expr: [payloadMatch('ip', 'daddr', '==', prefix(IPNet.parse(MULTICAST[4]))), { return: null }] } } },
    { add: { rule: { ...T, chain: 'postrouting', expr: [payloadMatch('ip6', 'daddr', '==', prefix(IPNet.parse(MULTICAST[6]))), { return: null }] } } },
    { add: { rule: { ...T, chain: 'postrouting', expr: [{ goto: { target: NFT_MASQ_CHAIN } }] } } },
  ];
  for (const h of staleHandles) cmds.push({ delete: { rule: { ...T, chain: NFT_MASQ_CHAIN, handle: h } } });
  for (const a of addrs) {
    const proto = a.family === 4 ? 'ip' : 'ip6';
    cmds.push({
      add: {
        rule: {
          ...T,
          chain: NFT_MASQ_CHAIN,
          comment,
          expr: [payloadMatch(proto, 'saddr', '==', a.ip), payloadMatch(proto, 'daddr', '!=', prefix(a.net)), { masquerade: null }],
        },
      },
    });
  }
  return { nftables: cmds };
}

export interface NftRuleRef {
  readonly handle: number;
  readonly comment: string;
}

/** Rules of one chain from `nft -j list chain …` output. */
export function nftRulesOf(listing: unknown): NftRuleRef[] {
  const out: NftRuleRef[] = [];
  if (typeof listing !== 'object' || listing === null) return out;
  const items = (listing as { nftables?: unknown }).nftables;
  if (!Array.isArray(items)) return out;
  for (const item of items) {
    if (typeof item !== 'object' || item === null) continue;
    const rule = (item as { rule?: unknown }).rule;
    if (typeof rule !== 'object' || rule === null) continue;
    const r = rule as { handle?: unknown; comment?: unknown };
    if (typeof r.handle === 'number') out.push({ handle: r.handle, comment: typeof r.comment === 'string' ? r.comment : '' });
  }
  return out;
}

/** Lists masq_checks; a missing table/chain is an empty list (nothing was ever set up). */
async function listMasqRules(): Promise<NftRuleRef[]> {
  const r = await execProgram('nft', ['-j', 'list', 'chain', 'inet', NFT_MASQ_TABLE, NFT_MASQ_CHAIN]);
  if (r.code !== 0) {
    if (/No such file or directory/.test(r.stderr)) return [];
    throw new IpMasqError('nftables', `nft list chain inet ${NFT_MASQ_TABLE} ${NFT_MASQ_CHAIN}: ${r.stderr.trim()}`);
  }
  return nftRulesOf(JSON.parse(r.stdout));
}

async function nftApply(doc: Json): Promise<void> {
  try {
    await execChecked('nft', ['-j', nftJson(doc)]);
  } catch (e) {
    throw new IpMasqError('nftables', `nft: ${errText(e)}`);
  }
}

export async function setupNftMasq(addrs: readonly MasqAddr[], network: string, ifname: string, containerId: string): Promise<void> {
  const prefixHash = nftInstanceHash(network, ifname, containerId);
  const stale = (await listMasqRules()).filter((r) => r.comment.startsWith(prefixHash)).map((r) => r.handle);
  await nftApply(renderNftMasqSetup(addrs, nftMasqComment(network, ifname, containerId), stale));
}

function deleteRules(handles: readonly number[]): Json {
  return { nftables: handles.map((h) => ({ delete: { rule: { ...T, chain: NFT_MASQ_CHAIN, handle: h } } })) };
}

export async function teardownNftMasq(network: string, ifname: string, containerId: string): Promise<void> {
  const prefixHash = nftInstanceHash(network, ifname, containerId);
  const rules = (await listMasqRules()).filter((r) => r.comment.startsWith(prefixHash));
  if (rules.length > 0) await nftApply(deleteRules(rules.map((r) => r.handle)));
}

export async function gcNftMasq(network: string, keep: ReadonlyArray<{ containerId: string; ifname: string }>): Promise<number> {
  const valid = new Set(keep.map((a) => nftMasqComment(network, a.ifname, a.containerId)));
  const rules = (await listMasqRules()).filter((r) => r.comment.startsWith(nftNetworkHash(network)) && !valid.has(r.comment));
  if (rules.length > 0) await nftApply(deleteRules(rules.map((r) => r.handle)));
  return rules.length;
}

// ---- backend choice ----

/** Whether a program is on PATH (no process spawned). */
export function onPath(program: string): boolean {
  for (const dir of (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':')) {
    if (dir === '') continue;
    try {
      accessSync(`${dir}/${program}`, constants.X_OK);
      return true;
    } catch {
      // next
    }
  }
  return false;
}

/** The upstream default: iptables, unless only nftables is available. */
export function resolveMasqBackend(configured: 'iptables' | 'nftables' | null): 'iptables' | 'nftables' {
  if (configured) return configured;
  if (!onPath('iptables-restore') && onPath('nft')) return 'nftables';
  return 'iptables';
}
