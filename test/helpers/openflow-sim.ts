// A small OpenFlow table simulator for the policy tables, written from ovs-fields(7) "Conjunctive
// match fields" and ovs-ofctl(8), not from the code under test. It reads typed flows (the ovs
// backend's Flow) and walks one IPv4 packet through them:
//  - per table the matching flow of highest priority wins (a table miss drops);
//  - flows whose actions are all `conjunction(id,k/n)` are "soft": a conjunction id completes
//    when, for every clause 1..n, some soft flow at that priority carrying (id, k/n) for the
//    clause matches the packet; the best non-conjunctive ("hard") match is found first, and soft
//    matches above its priority are tried from the highest priority down: for a completed id the
//    table is searched again (hard flows only) with conj_id=id, and a flow found there is taken;
//    when nothing completes (or the conj_id search fails) the hard match stands;
//  - set_field on reg2/reg3 is recorded, goto_table moves on, drop ends.
// Unknown match fields or actions throw: a new kind of flow must be taught here before it can pass.
import { TABLES, type Flow, type Match, type Table } from '../../src/backend/ovs/pipeline.js';

export type SimProto = 'tcp' | 'udp' | 'sctp' | 'icmp';

export interface SimPacket {
  /** reg0's low 4 bits: where the packet entered (1 tunnel, 2 gateway, 3 pod port); reg0[8] port found. */
  readonly reg0: number;
  readonly nwSrc: string;
  readonly nwDst: string;
  readonly proto: SimProto;
  /** Destination port (ignored for icmp). */
  readonly tpDst: number;
}

export interface SimResult {
  /** Where the walk ended: a table number reached by goto (`stopAt`), or a drop / table miss in `table`. */
  readonly outcome: 'reached' | 'drop' | 'miss';
  readonly table: number;
  readonly reg2: number;
  readonly reg3: number;
  /** Tables visited, in order. */
  readonly path: readonly number[];
  /** Per table visited: every conjunction id that completed at the priority that was taken. */
  readonly completed: ReadonlyMap<number, readonly number[]>;
}

function v4(text: string): number {
  const parts = text.split('.').map(Number);
  if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255)) throw new Error(`simulator: not an IPv4 address: ${text}`);
  return ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0;
}

interface State {
  pkt: SimPacket;
  src: number;
  dst: number;
  conjId: number;
  reg2: number;
  reg3: number;
}

function num(v: unknown): number {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  throw new Error(`simulator: not a number: ${String(v)}`);
}

type Test = (s: State) => boolean;

/** One match as a test on the simulated state (prefixes and masks worked out once). */
function compileMatch(m: Match): Test {
  switch (m.field) {
    case 'ip':
      return () => true; // every simulated packet is IPv4
    case 'tcp':
    case 'udp':
    case 'sctp': {
      const proto = m.field;
      return (s) => s.pkt.proto === proto;
    }
    case 'conj_id': {
      if (!('value' in m)) throw new Error('simulator: conj_id without value');
      const id = num(m.value);
      return (s) => s.conjId === id;
    }
    case 'reg0':
    case 'reg2':
    case 'reg3': {
      if (!('value' in m)) throw new Error('simulator: a register match without value');
      const mask = m.mask === undefined ? 0xffffffff : num(m.mask);
      const want = (num(m.value) & mask) >>> 0;
      const field = m.field;
      return (s) => (((field === 'reg0' ? s.pkt.reg0 : field === 'reg2' ? s.reg2 : s.reg3) & mask) >>> 0) === want;
    }
    case 'nw_src':
    case 'nw_dst': {
      if (!('value' in m) || typeof m.value !== 'string') throw new Error(`simulator: ${m.field} without a text value`);
      const [net, len] = m.value.split('/');
      const bits = len === undefined ? 32 : Number(len);
      if (!Number.isInteger(bits) || bits < 1 || bits > 32) throw new Error(`simulator: ${m.field}=${m.value}: prefix length`);
      const mask = bits === 32 ? 0xffffffff : (0xffffffff << (32 - bits)) >>> 0;
      const want = (v4(net!) & mask) >>> 0;
      return m.field === 'nw_src' ? (s) => ((s.src & mask) >>> 0) === want : (s) => ((s.dst & mask) >>> 0) === want;
    }
    case 'tp_dst': {
      if (!('value' in m)) throw new Error('simulator: tp_dst without value');
      const mask = m.mask === undefined ? 0xffff : num(m.mask);
      const want = num(m.value) & mask;
      // No transport port on icmp: the field is absent.
      return (s) => s.pkt.proto !== 'icmp' && (s.pkt.tpDst & mask) === want;
    }
    default:
      throw new Error(`simulator: match field ${m.field} is not simulated`);
  }
}

interface SimFlow {
  readonly flow: Flow;
  readonly soft: boolean;
  readonly test: Test;
}

function compile(f: Flow): SimFlow {
  const tests = f.match.map(compileMatch);
  return { flow: f, soft: f.actions.length > 0 && f.actions.every((a) => a.type === 'conjunction'), test: (s) => tests.every((t) => t(s)) };
}

/** The flows of each table, highest priority first; builds once per flow list. */
export class FlowTables {
  private readonly byTable = new Map<number, SimFlow[]>();

  constructor(flows: Iterable<Flow>) {
    for (const f of flows) {
      const t = TABLES[f.table];
      let list = this.byTable.get(t);
      if (!list) this.byTable.set(t, (list = []));
      list.push(compile(f));
    }
    for (const list of this.byTable.values()) list.sort((a, b) => b.flow.priority - a.flow.priority);
  }

  /** The flow a lookup in `table` takes, and the conjunction ids that completed for it. */
  lookup(table: number, s: State): { flow: Flow | null; completed: number[] } {
    const flows = this.byTable.get(table) ?? [];
    const hard = flows.find((f) => !f.soft && f.test(s))?.flow ?? null;
    const hardPri = hard ? hard.priority : -1;
    // Soft matches above the hard match, grouped by priority.
    const soft = new Map<number, Flow[]>();
    for (const f of flows) {
      if (f.flow.priority <= hardPri || !f.soft || !f.test(s)) continue;
      let l = soft.get(f.flow.priority);
      if (!l) soft.set(f.flow.priority, (l = []));
      l.push(f.flow);
    }
    for (const pri of [...soft.keys()].sort((a, b) => b - a)) {
      const seen = new Map<number, { n: number; clauses: Set<number> }>();
      for (const f of soft.get(pri)!) {
        for (const a of f.actions) {
          if (a.type !== 'conjunction') continue;
          let c = seen.get(a.id);
          if (!c) seen.set(a.id, (c = { n: a.clauses, clauses: new Set() }));
          if (c.n !== a.clauses) throw new Error(`simulator: conjunction ${a.id} with ${c.n} and ${a.clauses} clauses at priority ${pri}`);
          c.clauses.add(a.clause);
        }
      }
      const completed = [...seen].filter(([, c]) => c.clauses.size === c.n && [...c.clauses].every((k) => k >= 1 && k <= c.n)).map(([id]) => id).sort((a, b) => a - b);
      for (const id of completed) {
        const saved = s.conjId;
        s.conjId = id;
        const hit = flows.find((f) => !f.soft && f.test(s))?.flow ?? null;
        s.conjId = saved;
        if (hit) return { flow: hit, completed };
      }
    }
    return { flow: hard, completed: [] };
  }

  /**
   * Walks `pkt` from table `from` until a goto reaches `stopAt` (or a drop / miss). reg2/reg3
   * start at 0 (the pipeline before table 52 does not set them).
   */
  run(pkt: SimPacket, from: Table, stopAt: Table): SimResult {
    const s: State = { pkt, src: v4(pkt.nwSrc), dst: v4(pkt.nwDst), conjId: 0, reg2: 0, reg3: 0 };
    const path: number[] = [];
    const completed = new Map<number, number[]>();
    const stop = TABLES[stopAt];
    let table: number = TABLES[from];
    for (let hops = 0; hops < 64; hops++) {
      path.push(table);
      const { flow, completed: c } = this.lookup(table, s);
      if (c.length > 0) completed.set(table, c);
      if (!flow) return { outcome: 'miss', table, reg2: s.reg2, reg3: s.reg3, path, completed };
      let next: number | null = null;
      for (const a of flow.actions) {
        switch (a.type) {
          case 'drop':
            return { outcome: 'drop', table, reg2: s.reg2, reg3: s.reg3, path, completed };
          case 'set_field':
            if (a.field === 'reg2') s.reg2 = num(a.value);
            else if (a.field === 'reg3') s.reg3 = num(a.value);
            else throw new Error(`simulator: set_field ${a.field} is not simulated`);
            break;
          case 'goto_table':
            next = a.table;
            break;
          default:
            throw new Error(`simulator: action ${a.type} in table ${table} is not simulated`);
        }
      }
      if (next === null) throw new Error(`simulator: flow in table ${table} neither drops nor goes on`);
      if (next <= table) throw new Error(`simulator: goto_table ${next} from table ${table}`);
      if (next === stop) return { outcome: 'reached', table: next, reg2: s.reg2, reg3: s.reg3, path, completed };
      table = next;
    }
    throw new Error('simulator: too many tables');
  }
}
