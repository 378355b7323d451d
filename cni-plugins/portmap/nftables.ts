// The nftables driver: `nft -a list table <family> cni_hostport` to read (both families in
// parallel) and one `nft -f -` transaction, for both families at once, to change.
import { CommandError } from '../../src/util/exec.js';
import type { NftScript } from '../../src/render/nft.js';
import { NFT_TABLE, parseNftTable, type NftFamily, type NftTable } from './nftrules.js';
import { runTool, ToolMissingError } from './sys.js';

export class NftError extends Error {
  constructor(
    readonly op: string,
    override readonly cause: Error,
    readonly script = '',
  ) {
    super(`${op}: ${cause.message}`);
    this.name = 'NftError';
  }
}

/** The listed table, or null when it does not exist (or nft is not installed, so nothing can exist). */
export async function listNftTable(family: NftFamily): Promise<NftTable | null> {
  try {
    return parseNftTable(family, await runTool('nft', ['-a', 'list', 'table', family, NFT_TABLE]));
  } catch (e) {
    if (e instanceof ToolMissingError) return null;
    if (e instanceof CommandError && /No such file or directory/.test(e.stderr)) return null;
    throw new NftError(`could not list table ${family} ${NFT_TABLE}`, e as Error);
  }
}

export async function runNftScript(op: string, script: NftScript): Promise<void> {
  try {
    await runTool('nft', ['-f', '-'], script);
  } catch (e) {
    throw new NftError(op, e as Error, script);
  }
}
