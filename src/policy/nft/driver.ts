// Applies the policy table with `nft -f -` (one transaction per snapshot or delta), reads it back
// with `nft -j list table inet weft_policy` and compares it with the desired state; repair
// replaces the whole table in one transaction — the safety net, not the event path.
import { IPAddr } from '../../util/ip.js';
import { errorMessage } from '../../util/errors.js';
import { runCommand } from '../../util/exec.js';
import { countPackets } from '../counters.js';
import type { PolicyDataplane } from '../dataplane.js';
import { applyDelta, copySnapshot, emptySnapshot, type MutableSnapshot, type PolicyDelta, type PolicySnapshot } from '../model.js';
import { BASE_CHAINS, BASE_PRIORITY, TABLE_FAMILY, TABLE_NAME } from './layout.js';
import { type DesiredTable, renderDelta, renderDeleteTable, renderFull, type RenderOptions, type SetKind } from './render.js';

/** Runs nft with `args` (and `input` on stdin); resolves with stdout, rejects on failure. */
export type NftRun = (args: readonly string[], input?: string) => Promise<string>;

export const runNft: NftRun = (args, input) => runCommand('nft', args, input === undefined ? {} : { input });

export class PolicyNftDriver implements PolicyDataplane {
  private state: MutableSnapshot = emptySnapshot();
  /** `nft -f` transactions written. */
  transactions = 0;

  constructor(
    private readonly run: NftRun = runNft,
    private readonly opts: RenderOptions = {},
  ) {}

  /** Programs the whole table as `snap`, replacing what is there in the same transaction. */
  async sync(snap: PolicySnapshot): Promise<void> {
    await this.write(renderFull(snap, this.opts, true).script);
    this.state = copySnapshot(snap);
  }

  /** One delta, one transaction (none when the kernel has nothing to change). */
  async apply(delta: PolicyDelta): Promise<void> {
    await this.applyAll([delta]);
  }

  /**
   * Consecutive deltas, one transaction: each is rendered against the state the ones before it
   * leave. On failure the state is ahead of the kernel: the caller rewrites the table whole.
   */
  async applyAll(deltas: readonly PolicyDelta[]): Promise<void> {
    const scripts: string[] = [];
    for (const d of deltas) {
      const script = renderDelta(this.state, d, this.opts);
      if (script !== null) scripts.push(script);
      applyDelta(this.state, d);
    }
    if (scripts.length > 0) await this.write(scripts.join(''));
  }

  /** What differs between the table and the desired state; [] when they agree. */
  async check(): Promise<string[]> {
    const { desired } = renderFull(this.state, this.opts);
    let json: string;
    try {
      json = await this.run(['-j', 'list', 'table', TABLE_FAMILY, TABLE_NAME]);
    } catch (e) {
      this.lastListing = null;
      return [`table ${TABLE_FAMILY} ${TABLE_NAME} cannot be listed: ${errorMessage(e)}`];
    }
    this.lastListing = null;
    const listed = parseTable(json);
    this.lastListing = listed;
    return compareTable(desired, listed);
  }

  /** The table as the last check() read it (its counters feed the metrics); null before one. */
  lastListing: ListedPolicyTable | null = null;

  /** The rules' and default drops' counters as the last check() listed them. */
  counts(): ReturnType<typeof countPackets> | null {
    return this.lastListing ? countPackets(this.state, this.lastListing) : null;
  }

  /** What is programmed (the engine's output as applied so far). */
  get programmed(): PolicySnapshot {
    return this.state;
  }

  /** Checks and, when anything differs, rewrites the table whole; returns what was wrong. */
  async repair(): Promise<string[]> {
    const problems = await this.check();
    if (problems.length) await this.rewrite();
    return problems;
  }

  /** Writes the whole table again from what is programmed (after check() found it differing). */
  async rewrite(): Promise<void> {
    await this.write(renderFull(this.state, this.opts, true).script);
  }

  async remove(): Promise<void> {
    await this.write(renderDeleteTable());
    this.state = emptySnapshot();
  }

  /** Bumped by every transaction: a read-back overtaken by one is stale. */
  get generation(): number {
    return this.transactions;
  }

  private async write(script: string): Promise<void> {
    this.transactions++;
    await this.run(['-f', '-'], script);
  }
}


// ---- read-back ----

export interface ListedPolicyTable {
  readonly sets: Map<string, { type: unknown; flags: unknown; elements: unknown[] }>;
  readonly maps: Map<string, unknown[]>;
  readonly chains: Map<string, { type?: string; hook?: string; prio?: number; policy?: string }>;
  /** chain → rule comments in order ('' for a rule without one). */
  readonly rules: Map<string, string[]>;
  /** chain → the packets each rule's counter shows, in the same order (0 without a counter). */
  readonly packets: Map<string, number[]>;
}

export function parseTable(json: string): ListedPolicyTable {
  const doc = JSON.parse(json) as { nftables?: unknown };
  if (!Array.isArray(doc.nftables)) throw new Error('nft -j output has no "nftables" array');
  const t: ListedPolicyTable = { sets: new Map(), maps: new Map(), chains: new Map(), rules: new Map(), packets: new Map() };
  for (const item of doc.nftables as Record<string, Record<string, unknown>>[]) {
    if (item['set']) {
      const s = item['set'];
      t.sets.set(String(s['name']), { type: s['type'], flags: s['flags'], elements: Array.isArray(s['elem']) ? s['elem'] : [] });
    } else if (item['map']) {
      t.maps.set(String(item['map']['name']), Array.isArray(item['map']['elem']) ? item['map']['elem'] : []);
    } else if (item['chain']) {
      t.chains.set(String(item['chain']['name']), item['chain']);
    } else if (item['rule']) {
      const r = item['rule'];
      const chain = String(r['chain']);
      const list = t.rules.get(chain) ?? [];
      list.push(typeof r['comment'] === 'string' ? r['comment'] : '');
      t.rules.set(chain, list);
      const counts = t.packets.get(chain) ?? [];
      counts.push(counterPackets(r['expr']));
      t.packets.set(chain, counts);
    }
  }
  return t;
}

/** The packets of a rule's first counter statement (nft -j: `{"counter": {"packets": n, "bytes": m}}`). */
function counterPackets(expr: unknown): number {
  if (!Array.isArray(expr)) return 0;
  for (const e of expr as unknown[]) {
    const c = (e as { counter?: { packets?: unknown } } | null)?.counter;
    if (c && typeof c.packets === 'number') return c.packets;
  }
  return 0;
}

/** An element as nft -j prints it → the key render.ts uses (address, "first-last", "ip proto port"). */
function elementKey(el: unknown, kind: SetKind): string {
  if (el && typeof el === 'object' && 'elem' in el) el = (el as { elem: { val: unknown } }).elem.val;
  if (kind === 'addresses' && typeof el === 'string') return IPAddr.parse(el).toString();
  if (kind === 'peerPorts') {
    const c = (el as { concat?: unknown[] }).concat;
    if (Array.isArray(c) && c.length === 3) return `${IPAddr.parse(String(c[0])).toString()} ${String(c[1]).toLowerCase()} ${Number(c[2])}`;
  }
  return `unreadable ${JSON.stringify(el)}`;
}

function diffKeys(what: string, want: Set<string>, have: Set<string>, out: string[]): void {
  for (const k of want) if (!have.has(k)) out.push(`${what}: ${k} missing`);
  for (const k of have) if (!want.has(k)) out.push(`${what}: unexpected ${k}`);
}

/** Each wanted object missing or differing (`differ` says how), then each listed one not wanted. */
function compareObjects<W, H>(kind: string, want: ReadonlyMap<string, W>, have: ReadonlyMap<string, H>, p: string[], differ: (name: string, w: W, h: H) => void): void {
  for (const [name, w] of want) {
    const h = have.get(name);
    if (h === undefined) p.push(`${kind} ${name} missing`);
    else differ(name, w, h);
  }
  for (const name of have.keys()) if (!want.has(name)) p.push(`unexpected ${kind} ${name}`);
}

/** Problems of the listed table against the desired one, as lines a log can show. */
export function compareTable(want: DesiredTable, have: ListedPolicyTable): string[] {
  const p: string[] = [];
  compareObjects('set', want.sets, have.sets, p, (name, s, h) => diffKeys(`set ${name}`, s.keys, new Set(h.elements.map((e) => elementKey(e, s.kind))), p));
  compareObjects('map', want.maps, have.maps, p, (name, m, h) => {
    const haveKeys = new Set<string>();
    for (const e of h) {
      const [k, v] = e as [string, { jump?: { target?: string } }];
      haveKeys.add(`${IPAddr.tryParse(String(k))?.toString() ?? String(k)} → ${v?.jump?.target ?? JSON.stringify(v)}`);
    }
    diffKeys(`map ${name}`, new Set([...m].map(([k, c]) => `${k} → ${c}`)), haveKeys, p);
  });
  compareObjects('chain', want.chains, have.chains, p, (name, comments, c) => {
    const base = BASE_CHAINS.find((b) => b.name === name);
    if (base && (c.type !== 'filter' || c.hook !== base.hook || c.prio !== BASE_PRIORITY || c.policy !== 'accept')) {
      p.push(`chain ${name} is not a filter ${base.hook} chain at priority ${BASE_PRIORITY} with policy accept`);
    }
    const got = have.rules.get(name) ?? [];
    if (got.length !== comments.length || got.some((g, i) => g !== comments[i])) p.push(`chain ${name}: rules differ (${got.length} listed, ${comments.length} wanted)`);
  });
  return p;
}
