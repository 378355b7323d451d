// macspoofchk (pkg/link/spoofcheck.go): in nftables table `bridge nat`, a PREROUTING base chain
// (filter hook, priority -300) jumps frames from the host veth to cni-br-iface-<cid>-<ifname>,
// which jumps to …-mac: the container's MAC returns, everything else is dropped. Every rule carries
// the comment macspoofchk-<cid>-<ifname>. Written as nft JSON, every name and value checked by the
// nft renderer (src/render/nft.ts) as it would be in a script.
import { errorMessage } from '../../src/util/errors.js';
import { CommandError, execChecked, execProgram } from '../../src/util/exec.js';
import { nftJson, type NftJson } from '../../src/render/nft.js';

export const SPOOF_TABLE = 'nat';
export const SPOOF_BASE_CHAIN = 'PREROUTING';

type Json = NftJson;

export function spoofRefId(containerId: string, ifname: string): string {
  return `${containerId}-${ifname}`;
}

export function spoofChains(refId: string): { iface: string; mac: string; comment: string } {
  const iface = `cni-br-iface-${refId}`;
  return { iface, mac: `${iface}-mac`, comment: `macspoofchk-${refId}` };
}

const B = { family: 'bridge', table: SPOOF_TABLE } as const;

export function renderSpoofSetup(hostVeth: string, mac: string, refId: string): Json {
  const { iface, mac: macChain, comment } = spoofChains(refId);
  return {
    nftables: [
      { add: { table: { family: 'bridge', name: SPOOF_TABLE } } },
      { add: { chain: { ...B, name: SPOOF_BASE_CHAIN, type: 'filter', hook: 'prerouting', prio: -300, policy: 'accept' } } },
      { add: { chain: { ...B, name: iface } } },
      { add: { chain: { ...B, name: macChain } } },
      { flush: { chain: { ...B, name: iface } } },
      { flush: { chain: { ...B, name: macChain } } },
      {
        add: {
          rule: {
            ...B,
            chain: SPOOF_BASE_CHAIN,
            comment,
            expr: [{ match: { op: '==', left: { meta: { key: 'iifname' } }, right: hostVeth } }, { jump: { target: iface } }],
          },
        },
      },
      { add: { rule: { ...B, chain: iface, comment, expr: [{ jump: { target: macChain } }] } } },
      {
        add: {
          rule: {
            ...B,
            chain: macChain,
            comment,
            expr: [{ match: { op: '==', left: { payload: { protocol: 'ether', field: 'saddr' } }, right: mac } }, { return: null }],
          },
        },
      },
      { add: { rule: { ...B, chain: macChain, comment, expr: [{ drop: null }] } } },
    ],
  };
}

/** The deletions for one attachment, from a `nft -j list table bridge nat` listing. */
export function renderSpoofTeardown(listing: unknown, refId: string): Json | null {
  const { iface, mac, comment } = spoofChains(refId);
  const cmds: Json[] = [];
  const chains = new Set<string>();
  const items = typeof listing === 'object' && listing !== null ? (listing as { nftables?: unknown }).nftables : undefined;
  for (const item of Array.isArray(items) ? items : []) {
    if (typeof item !== 'object' || item === null) continue;
    const chain = (item as { chain?: { name?: unknown } }).chain;
    if (chain && typeof chain.name === 'string') chains.add(chain.name);
    const rule = (item as { rule?: { chain?: unknown; handle?: unknown; comment?: unknown } }).rule;
    if (rule && rule.chain === SPOOF_BASE_CHAIN && rule.comment === comment && typeof rule.handle === 'number') {
      cmds.push({ delete: { rule: { ...B, chain: SPOOF_BASE_CHAIN, handle: rule.handle } } });
    }
  }
  // The -mac chain is referenced by the iface chain: delete the referrer first.
  if (chains.has(iface)) cmds.push({ flush: { chain: { ...B, name: iface } } }, { delete: { chain: { ...B, name: iface } } });
  if (chains.has(mac)) cmds.push({ flush: { chain: { ...B, name: mac } } }, { delete: { chain: { ...B, name: mac } } });
  return cmds.length > 0 ? { nftables: cmds } : null;
}

/** A spoof-check change that nft refused. */
export class SpoofCheckError extends Error {
  constructor(msg: string) {
    super(msg);
    this.name = 'SpoofCheckError';
  }
}

export async function setupSpoofCheck(hostVeth: string, mac: string, refId: string): Promise<void> {
  try {
    await execChecked('nft', ['-j', nftJson(renderSpoofSetup(hostVeth, mac, refId))]);
  } catch (e) {
    const why = e instanceof CommandError && e.exitCode !== null ? e.stderr.trim() : errorMessage(e);
    throw new SpoofCheckError(`failed to setup spoof-check: ${why}`);
  }
}

export async function teardownSpoofCheck(refId: string): Promise<void> {
  const r = await execProgram('nft', ['-j', 'list', 'table', 'bridge', SPOOF_TABLE]);
  if (r.code !== 0) {
    if (/No such file or directory/.test(r.stderr)) return;
    throw new SpoofCheckError(`failed to teardown spoof-check: ${r.stderr.trim()}`);
  }
  const doc = renderSpoofTeardown(JSON.parse(r.stdout), refId);
  if (!doc) return;
  try {
    await execChecked('nft', ['-j', nftJson(doc)]);
  } catch (e) {
    const why = e instanceof CommandError && e.exitCode !== null ? e.stderr.trim() : errorMessage(e);
    throw new SpoofCheckError(`failed to teardown spoof-check: ${why}`);
  }
}
