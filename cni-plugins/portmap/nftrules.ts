// The nftables rule model of portmap, pure: table `ip cni_hostport` / `ip6 cni_hostport` laid out
// as upstream v1.9 does (dnat from the prerouting and output hooks through `hostports_all`,
// `hostip_hostports` kept empty for upgrades, one rule per mapping in `hostports` and the hairpin
// and localhost masquerade rules in `masquerading`, each commented with the container ID). Rules
// are rendered the way `nft list` prints them, so CHECK compares text.
import type { Family, IPAddr } from '../../src/util/ip.js';
import {
  nft,
  nftComment,
  nftJoin,
  nftName,
  nftRule,
  nftRuleBody,
  nftScript,
  nftWords,
  type NftPart,
  type NftRuleText,
  type NftScript,
} from '../../src/render/nft.js';
import type { ContainerAddr, PortMapConfig } from './config.js';
import { conditionsOf } from './config.js';

export const NFT_TABLE = 'cni_hostport';
export const NFT_TABLE_COMMENT = 'CNI portmap plugin';
export const HOSTPORTS_ALL = 'hostports_all';
export const HOSTIP_HOSTPORTS = 'hostip_hostports';
export const HOSTPORTS = 'hostports';
export const MASQUERADING = 'masquerading';
/** The chains that hold per-container rules (commented with the container ID). */
export const CONTAINER_RULE_CHAINS = [HOSTPORTS, HOSTIP_HOSTPORTS, MASQUERADING] as const;

export type NftFamily = 'ip' | 'ip6';
export const nftFamily = (f: Family): NftFamily => (f === 4 ? 'ip' : 'ip6');

const ipPort = (ip: IPAddr, port: number): NftPart => (ip.family === 6 ? nft`[${ip}]:${port}` : nft`${ip}:${port}`);

export interface NftDesired {
  readonly family: Family;
  readonly containerId: string;
  readonly conditions: readonly string[];
  /** `hostports` rules, as nft lists them (comment included). */
  readonly hostports: readonly NftRuleText[];
  /** `masquerading` rules; empty without snat. */
  readonly masquerading: readonly NftRuleText[];
  readonly snat: boolean;
}

export function desiredNft(conf: PortMapConfig, containerId: string, family: Family, addr: ContainerAddr): NftDesired {
  const ipX = nftFamily(family);
  const comment = nftComment('container ID', containerId);
  const hostports: NftRuleText[] = [];
  for (const pm of conf.portMappings) {
    let dst = nft``;
    if (pm.hostIP) {
      if (pm.hostIP.family !== family) continue;
      if (!pm.hostIP.isUnspecified()) dst = nft`${ipX} daddr ${pm.hostIP} `;
    }
    hostports.push(nftRule`${dst}${pm.protocol} dport ${pm.hostPort} dnat to ${ipPort(addr.ip, pm.containerPort)} comment ${comment}`);
  }
  const masquerading: NftRuleText[] = [];
  if (conf.snat) {
    const ip = addr.ip;
    // The hairpin source is the container itself; masqAll widens it to every source.
    const src = conf.masqAll ? (family === 4 ? '0.0.0.0/0' : '::/0') : ip;
    masquerading.push(nftRule`${ipX} saddr ${src} ${ipX} daddr ${ip} masquerade comment ${comment}`);
    if (family === 4 && !conf.masqAll) masquerading.push(nftRule`ip saddr 127.0.0.1 ip daddr ${ip} masquerade comment ${comment}`);
  }
  return { family, containerId, conditions: conditionsOf(conf, family), hostports, masquerading, snat: conf.snat };
}

/** One rule of a listed table: the text nft prints (without the handle) and its handle. */
export interface NftRule {
  readonly text: string;
  readonly handle: number;
  readonly comment: string | null;
}

export interface NftTable {
  readonly family: NftFamily;
  /** chain → rules, in order. A chain present with no rules maps to []. */
  readonly chains: ReadonlyMap<string, readonly NftRule[]>;
}

/**
 * Parses `nft -a list table <family> cni_hostport`. Chain header lines (`type nat hook …;`) are
 * not rules; every other line inside a chain is one, ending in `# handle N`.
 */
export function parseNftTable(family: NftFamily, text: string): NftTable {
  const chains = new Map<string, NftRule[]>();
  let current: NftRule[] | null = null;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const head = /^chain (\S+) \{/.exec(line);
    if (head) {
      current = [];
      chains.set(head[1]!, current);
      continue;
    }
    if (line === '}') {
      current = null;
      continue;
    }
    if (!current || line === '' || /^type \S+ hook /.test(line) || line.startsWith('policy ')) continue;
    const h = /^(.*?)\s*# handle (\d+)$/.exec(line);
    if (!h) continue;
    const ruleText = h[1]!;
    const c = /comment "([^"]*)"$/.exec(ruleText);
    current.push({ text: ruleText, handle: Number(h[2]), comment: c ? c[1]! : null });
  }
  return { family, chains };
}

/** The rules of `containerId` in the per-container chains. */
export function rulesOfContainer(table: NftTable, containerId: string): { chain: string; rule: NftRule }[] {
  const out: { chain: string; rule: NftRule }[] = [];
  for (const chain of CONTAINER_RULE_CHAINS) {
    for (const rule of table.chains.get(chain) ?? []) if (rule.comment === containerId) out.push({ chain, rule });
  }
  return out;
}

const TABLE = nftName('table', NFT_TABLE);

const deleteLines = (family: NftFamily, refs: readonly { chain: string; rule: NftRule }[]): NftPart[] =>
  refs.map(({ chain, rule }) => nft`delete rule ${family} ${TABLE} ${nftName('chain', chain)} handle ${rule.handle}`);

/**
 * One `nft -f` script for the families in `want`: the table and its chains made if missing, the
 * hook chains and `hostports_all` rewritten (with this config's conditions), the container's
 * previous rules (`stale`, from an earlier ADD) deleted and its rules added.
 */
export function renderNftAdd(want: readonly NftDesired[], stale: ReadonlyMap<NftFamily, readonly { chain: string; rule: NftRule }[]>): NftScript {
  const out: NftPart[] = [];
  const [hostports, hostipHostports, hostportsAll, masquerading] = [HOSTPORTS, HOSTIP_HOSTPORTS, HOSTPORTS_ALL, MASQUERADING].map((c) => nftName('chain', c)) as [
    NftPart,
    NftPart,
    NftPart,
    NftPart,
  ];
  for (const w of want) {
    const f = nftFamily(w.family);
    const t = nft`${f} ${TABLE}`;
    const cond = nftWords(w.family === 4 ? 'conditionsV4' : 'conditionsV6', w.conditions);
    const hookRule = (hook: string): NftPart =>
      nftJoin([nft`add rule ${t} ${nftName('chain', hook)}`, cond, nft`fib daddr type local jump ${hostportsAll}`]);
    out.push(
      nft`add table ${t} { comment ${nftComment('table comment', NFT_TABLE_COMMENT)} ; }`,
      nft`add chain ${t} ${hostports}`,
      nft`add chain ${t} ${hostipHostports}`,
      nft`add chain ${t} ${hostportsAll}`,
      nft`flush chain ${t} ${hostportsAll}`,
      nft`add rule ${t} ${hostportsAll} jump ${hostipHostports}`,
      nft`add rule ${t} ${hostportsAll} jump ${hostports}`,
      nft`add chain ${t} prerouting { type nat hook prerouting priority dstnat ; }`,
      nft`flush chain ${t} prerouting`,
      hookRule('prerouting'),
      // nft accepts the "dstnat" name only on prerouting; -100 is the same priority.
      nft`add chain ${t} output { type nat hook output priority -100 ; }`,
      nft`flush chain ${t} output`,
      hookRule('output'),
    );
    if (w.snat) out.push(nft`add chain ${t} ${masquerading} { type nat hook postrouting priority srcnat ; }`);
    out.push(...deleteLines(f, stale.get(f) ?? []));
    for (const r of w.hostports) out.push(nft`add rule ${t} ${hostports} ${nftRuleBody('rule', r)}`);
    for (const r of w.masquerading) out.push(nft`add rule ${t} ${masquerading} ${nftRuleBody('rule', r)}`);
  }
  return nftScript(out);
}

/** The `nft -f` script deleting the given rules; null when there are none. */
export function renderNftDelete(refs: ReadonlyMap<NftFamily, readonly { chain: string; rule: NftRule }[]>): NftScript | null {
  const out: NftPart[] = [];
  for (const [f, list] of refs) out.push(...deleteLines(f, list));
  return out.length === 0 ? null : nftScript(out);
}

/** What is missing for `want` in the listed table (null: the table does not exist). */
export function checkNft(want: NftDesired, table: NftTable | null): string[] {
  const f = nftFamily(want.family);
  if (!table) return [`table ${f} ${NFT_TABLE} not found`];
  const problems: string[] = [];
  const has = (chain: string, text: string): boolean => (table.chains.get(chain) ?? []).some((r) => r.text === text);
  for (const r of want.hostports) if (!has(HOSTPORTS, r)) problems.push(`rule "${r}" not found in chain ${f} ${NFT_TABLE} ${HOSTPORTS}`);
  for (const r of want.masquerading) if (!has(MASQUERADING, r)) problems.push(`rule "${r}" not found in chain ${f} ${NFT_TABLE} ${MASQUERADING}`);
  for (const r of [`jump ${HOSTIP_HOSTPORTS}`, `jump ${HOSTPORTS}`]) {
    if (!has(HOSTPORTS_ALL, r)) problems.push(`rule "${r}" not found in chain ${f} ${NFT_TABLE} ${HOSTPORTS_ALL}`);
  }
  // nft may print user conditions differently from how they were written: only the jump is compared.
  for (const hook of ['prerouting', 'output']) {
    if (!(table.chains.get(hook) ?? []).some((r) => r.text.endsWith(`jump ${HOSTPORTS_ALL}`))) {
      problems.push(`no jump to ${HOSTPORTS_ALL} in chain ${f} ${NFT_TABLE} ${hook}`);
    }
  }
  return problems;
}
