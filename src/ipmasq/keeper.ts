// Keeps the node's masquerade and forward rules exactly as the model says, in iptables or in
// nftables: read back, compare as ordered lists, and write one transaction per table only when
// something is missing, extra, duplicated or out of order. The other implementation's chains and
// tables are removed (jumps first), so switching EnableNFTables leaves nothing behind. The same
// holds for the two masquerade modes: flannel's (--ip-masq) and ip-masq-agent's (--ip-masq-config).
import type { Family } from '../util/ip.js';
import type { Logger } from '../util/log.js';
import { CommandError, runCommand } from '../util/exec.js';
import type { IptablesPayload } from '../render/iptables.js';
import { nft, nftName, nftScript, type NftScript } from '../render/nft.js';
import { FOREIGN_AGENT_CHAIN, type AgentMasq } from './agent-rules.js';
import { parseSaveTables, planTable, xtablesCommands, type SavedTable, type XtTable } from './iptables.js';
import { CHAIN_NAMES, desiredChains, type ChainKind, type ChainSpec, type FamilyInput } from './model.js';
import { compareTable, nftTable, parseListTable, renderDeleteTable, renderTable, type ListedTable } from './nftables.js';
import { errorMessage } from '../util/errors.js';

export type RulesMode = 'iptables' | 'nftables';

/**
 * Runs a program with an argument array; resolves with stdout. Injected for tests. Standard input
 * is only ever a rendered script or payload: no raw text reaches `nft -f` or iptables-restore.
 */
export type Runner = (command: string, args: readonly string[], stdin?: NftScript | IptablesPayload) => Promise<string>;

export interface IpMasqMetrics {
  /** A transaction written (iptables-restore or nft -f). */
  recordRuleWrite(mode: RulesMode): void;
  /** A reconcile pass after the first one found the rules changed behind our back. */
  recordRuleRepair(mode: RulesMode): void;
  recordRuleError(): void;
}

export interface RuleKeeperOptions {
  readonly mode: RulesMode;
  /** flannel's masquerade rules (--ip-masq); exclusive with `agent`. */
  readonly masq: boolean;
  /** ip-masq-agent mode (--ip-masq-config) with its first config; `setAgent` replaces it. */
  readonly agent?: AgentMasq | null;
  readonly forward: boolean;
  /** `--ip-masq-fully-random-disable`. */
  readonly fullyRandomDisable: boolean;
  readonly logger: Logger;
  readonly metrics?: IpMasqMetrics;
  readonly runner?: Runner;
}

export interface PassResult {
  readonly problems: string[];
  readonly writes: number;
}

const TABLES: readonly XtTable[] = ['nat', 'filter'];
const KINDS: readonly ChainKind[] = ['masq', 'forward', 'agent'];
const FAMILIES: readonly Family[] = [4, 6];

const defaultRunner: Runner = (command, args, stdin) => runCommand(command, args, stdin === undefined ? {} : { input: stdin });

export class ConflictingMasqModesError extends Error {
  constructor() {
    super('flannel masquerade (--ip-masq) and ip-masq-agent mode (--ip-masq-config) are exclusive');
    this.name = 'ConflictingMasqModesError';
  }
}

export class RuleKeeper {
  private families: readonly FamilyInput[] = [];
  private agent: AgentMasq | null;
  private fullyRandom: boolean | null = null;
  private passes = 0;
  /** Set by setInput/setAgent: the next pass that writes is an update, not a repair of drift. */
  private inputChanged = false;
  private foreignAgentWarned = false;
  /** Passes run one at a time (the resync loop, a lease change and a config reload may ask at once). */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly run: Runner;

  constructor(private readonly opts: RuleKeeperOptions) {
    if (opts.masq && opts.agent) throw new ConflictingMasqModesError();
    this.agent = opts.agent ?? null;
    this.run = opts.runner ?? defaultRunner;
  }

  /** The inputs changed (first lease, or a new lease): the next pass rewrites what differs. */
  setInput(families: readonly FamilyInput[]): void {
    this.families = families;
    this.inputChanged = true;
  }

  /** A new ip-masq-agent config (live reload): the next pass rewrites what differs. */
  setAgent(agent: AgentMasq): void {
    if (this.opts.masq) throw new ConflictingMasqModesError();
    this.agent = agent;
    this.inputChanged = true;
  }

  /** One reconcile pass over both implementations. Throws on a failing command (nothing half-written: one transaction per table). */
  reconcile(): Promise<PassResult> {
    const pass = this.queue.then(() => this.pass());
    this.queue = pass.catch(() => undefined);
    return pass;
  }

  private async pass(): Promise<PassResult> {
    const { mode, logger: log, metrics } = this.opts;
    const changed = this.inputChanged;
    this.inputChanged = false;
    try {
      if (this.fullyRandom === null) this.fullyRandom = !this.opts.fullyRandomDisable && (await this.probeFullyRandom());
      const want = desiredChains({ families: this.families, masq: this.opts.masq, forward: this.opts.forward, fullyRandom: this.fullyRandom, agent: this.agent });
      const problems: string[] = [];
      let writes = 0;
      for (const family of FAMILIES) {
        const mine = want.filter((c) => c.family === family);
        const r = mode === 'iptables' ? await this.syncIptables(family, mine) : await this.syncNftables(family, mine);
        problems.push(...r.problems);
        writes += r.writes;
        // The other implementation is cleaned once, at start (as flannel does): nothing recreates it.
        if (this.passes === 0) {
          const other = mode === 'iptables' ? await this.syncNftables(family, []) : await this.syncIptables(family, []);
          problems.push(...other.problems);
          writes += other.writes;
        }
      }
      if (problems.length > 0) {
        const first = this.passes === 0;
        if (first) log.info('installed masquerade/forward rules', { mode, problems });
        else if (changed) log.info('updated masquerade/forward rules', { mode, problems });
        else {
          metrics?.recordRuleRepair(mode);
          log.warn('repaired masquerade/forward rules', { mode, problems });
        }
      }
      this.passes++;
      return { problems, writes };
    } catch (e) {
      // Not applied: the retry is still an update.
      this.inputChanged ||= changed;
      throw e;
    }
  }

  private async syncIptables(family: Family, want: readonly ChainSpec[]): Promise<PassResult> {
    const cmd = xtablesCommands(family);
    const wantKinds = new Set(want.map((c) => c.kind));
    const unwanted = KINDS.filter((k) => !wantKinds.has(k));
    const problems: string[] = [];
    let writes = 0;
    // One read of every table per family and pass.
    let saved: (table: XtTable) => SavedTable;
    try {
      saved = parseSaveTables(await this.run(cmd.save, []));
    } catch (e) {
      // Without ip6tables there is nothing of ours to remove; wanting rules there is an error.
      if (want.length === 0) return { problems, writes };
      throw e;
    }
    if (wantKinds.has('agent') && !this.foreignAgentWarned && saved('nat').chains.has(FOREIGN_AGENT_CHAIN)) {
      this.foreignAgentWarned = true;
      this.opts.logger.warn(`a ${FOREIGN_AGENT_CHAIN} chain exists: a real ip-masq-agent seems to run on this node too; its rules masquerade what weft's leave alone, so stop it`, {
        family: `ipv${family}`,
      });
    }
    for (const table of TABLES) {
      const inTable = want.filter((c) => CHAIN_NAMES[c.kind].table === table);
      const plan = planTable(table, inTable, unwanted, saved(table));
      if (!plan.payload) continue;
      await this.run(cmd.restore, ['--noflush', '-w'], plan.payload);
      this.opts.metrics?.recordRuleWrite('iptables');
      writes++;
      problems.push(...plan.problems.map((p) => `ipv${family} ${table}: ${p}`));
    }
    return { problems, writes };
  }

  private async syncNftables(family: Family, want: readonly ChainSpec[]): Promise<PassResult> {
    const t = nftTable(family);
    let listed: ListedTable | null;
    try {
      listed = parseListTable(await this.run('nft', ['-j', 'list', 'table', t.family, t.name]));
    } catch (e) {
      if (e instanceof CommandError && /No such file or directory/.test(e.stderr)) listed = null;
      // nft missing or unusable: nothing of ours can be there, which is fine when we want nothing.
      else if (want.length === 0) return { problems: [], writes: 0 };
      else throw e;
    }
    const problems = compareTable(family, want, listed);
    if (problems.length === 0) return { problems, writes: 0 };
    const script = want.length === 0 ? renderDeleteTable(family) : renderTable(family, want, listed !== null);
    await this.run('nft', ['-f', '-'], script);
    this.opts.metrics?.recordRuleWrite('nftables');
    return { problems: problems.map((p) => `ipv${family} nft: ${p}`), writes: 1 };
  }

  /** `--random-fully` needs iptables ≥ 1.6.2 (and a kernel that has it); nft is asked with a dry run. */
  private async probeFullyRandom(): Promise<boolean> {
    try {
      if (this.opts.mode === 'iptables') {
        const help = await this.run('iptables', ['-j', 'MASQUERADE', '-h']);
        return help.includes('--random-fully');
      }
      const t = nftName('table', 'weft-probe');
      const probe = nftScript([
        nft`add table ip ${t}`,
        nft`add chain ip ${t} c { type nat hook postrouting priority srcnat ; }`,
        nft`add rule ip ${t} c masquerade fully-random`,
      ]);
      await this.run('nft', ['-c', '-f', '-'], probe);
      return true;
    } catch (e) {
      this.opts.logger.warn('fully-random masquerade not supported; masquerading without it', { error: errorMessage(e) });
      return false;
    }
  }
}
