// ovs-ofctl flow text, the one way weft writes it. A flow is data (cookie, table, priority, typed
// matches, typed actions); this renderer turns it into the OpenFlow 1.5 text `ovs-ofctl
// dump-flows` prints back, and checks every value word on the way: first with checkWord and the
// flow syntax's specials, then against the shape of its field (a MAC is six lowercase hex pairs,
// an address a canonical dotted quad, a number an integer the field can hold). A value that fails
// is refused with UnsafeValueError; it never becomes another match, another action or another line.
//
// Why the shapes are strict: ovs-ofctl quietly rewrites what does not fit (in_port=4294967040
// becomes 65280, arp_op=256 becomes 0, nw_src=010.1.1.1 is 10.1.1.1, a /0 match disappears,
// table=255 means "no table"), so a value that parses may still not be the flow that was meant.
import { checkWord, LINE_SPECIAL, UnsafeValueError } from './word.js';

export const OFCTL = 'ovs-ofctl';

/**
 * What the flow syntax reads specially: `,` and white space separate fields, `=`, `:` and `(`
 * end a key, `)` ends a nested value, `[` `]` slice a field, `/` starts a mask, `-` `>` make the
 * arrow of set_field/move, and a flow file treats `#` as a comment (LINE_SPECIAL adds quotes and
 * backslash). White space and control characters are refused by checkWord itself.
 */
export const OFCTL_SPECIAL = `,=:()[]{}/<>-!*;${LINE_SPECIAL}`;
const without = (chars: string) => [...OFCTL_SPECIAL].filter((c) => !chars.includes(c)).join('');

/** A raw value: what the field's shape says it must be is checked when the flow is rendered. */
export type OfValue = string | number | bigint;

type Shape =
  | { readonly kind: 'uint'; readonly max: bigint; readonly min?: bigint; readonly hex: boolean; readonly maskable?: boolean }
  | { readonly kind: 'mac' }
  | { readonly kind: 'ipv4' }
  /** An address, or an address with a prefix length 1..32 and no host bits. */
  | { readonly kind: 'ipv4-or-net' }
  /** Connection tracking state flags, each `+` or `-` (`+trk+est`, `-new+trk`). */
  | { readonly kind: 'ct-state' };

const U8 = { kind: 'uint', max: 0xffn, hex: false } as const;
/** A transport port; ovs-ofctl prints it decimal, and hex when masked. */
const U16_PORT = { kind: 'uint', max: 0xffffn, hex: false, maskable: true } as const;
/** A conjunction id, decimal as ovs-ofctl prints it. */
const U32_DEC = { kind: 'uint', max: 0xffff_ffffn, hex: false } as const;
const U32_HEX = { kind: 'uint', max: 0xffff_ffffn, hex: true, maskable: true } as const;
const U64_HEX = { kind: 'uint', max: 0xffff_ffff_ffff_ffffn, hex: true } as const;
/** A switch port: 1 .. OFPP_MAX-1 (0xff00 and up are OpenFlow's reserved ports). */
const OFPORT = { kind: 'uint', min: 1n, max: 0xfeffn, hex: false } as const;
const MAC = { kind: 'mac' } as const;
const IPV4 = { kind: 'ipv4' } as const;
const IPV4_OR_NET = { kind: 'ipv4-or-net' } as const;

/** Match fields weft writes, and the shape of their values (null: a protocol keyword without a value). */
const MATCH_FIELDS = {
  ip: null,
  arp: null,
  tcp: null,
  udp: null,
  sctp: null,
  ct_state: { kind: 'ct-state' },
  conj_id: U32_DEC,
  in_port: OFPORT,
  tun_id: U64_HEX,
  reg0: U32_HEX,
  reg1: U32_HEX,
  reg2: U32_HEX,
  reg3: U32_HEX,
  dl_src: MAC,
  dl_dst: MAC,
  nw_src: IPV4_OR_NET,
  nw_dst: IPV4_OR_NET,
  arp_op: U8,
  arp_spa: IPV4_OR_NET,
  arp_tpa: IPV4_OR_NET,
  arp_sha: MAC,
  arp_tha: MAC,
  tp_dst: U16_PORT,
} as const satisfies Record<string, Shape | null>;

/** Fields set_field writes, and the shape of the value written. */
const SET_FIELDS = {
  eth_src: MAC,
  eth_dst: MAC,
  arp_op: U8,
  arp_spa: IPV4,
  arp_tpa: IPV4,
  arp_sha: MAC,
  arp_tha: MAC,
  tun_dst: IPV4,
  tun_id: U64_HEX,
  reg0: U32_HEX,
  reg1: U32_HEX,
  reg2: U32_HEX,
  reg3: U32_HEX,
} as const satisfies Record<string, Shape>;

/** NXM field names for move and output (always whole: `NAME[]`). */
const NXM_FIELDS = [
  'NXM_OF_ETH_SRC',
  'NXM_OF_ETH_DST',
  'NXM_NX_ARP_SHA',
  'NXM_NX_ARP_THA',
  'NXM_OF_ARP_SPA',
  'NXM_OF_ARP_TPA',
  'NXM_NX_REG0',
  'NXM_NX_REG1',
  'NXM_NX_REG2',
  'NXM_NX_REG3',
] as const;

type Fields = typeof MATCH_FIELDS;
export type ProtocolField = { [K in keyof Fields]: Fields[K] extends null ? K : never }[keyof Fields];
export type MatchField = Exclude<keyof Fields, ProtocolField>;
export type SetField = keyof typeof SET_FIELDS;
export type NxmField = (typeof NXM_FIELDS)[number];

export type OfMatch =
  | { readonly field: ProtocolField }
  | { readonly field: MatchField; readonly value: OfValue; readonly mask?: OfValue };

export type OfAction =
  | { readonly type: 'goto_table'; readonly table: number }
  | { readonly type: 'set_field'; readonly field: SetField; readonly value: OfValue; readonly mask?: OfValue }
  | { readonly type: 'move'; readonly src: NxmField; readonly dst: NxmField }
  | { readonly type: 'output'; readonly port: number }
  | { readonly type: 'output_field'; readonly field: NxmField }
  /** Clause `clause` of `clauses` of conjunction `id` (the flow's only kind of action). */
  | { readonly type: 'conjunction'; readonly id: number; readonly clause: number; readonly clauses: number }
  /**
   * Connection tracking in `zone`: without `commit`, look the packet up and continue in `table`
   * (recirculated with its ct_state); with `commit`, record the connection, copying each
   * `labels` register into 32 bits of its ct_label from bit `low`.
   */
  | { readonly type: 'ct'; readonly zone: number; readonly table?: number; readonly commit?: boolean; readonly labels?: ReadonlyArray<{ readonly src: NxmField; readonly low: 0 | 32 | 64 | 96 }> }
  | { readonly type: 'dec_ttl' | 'normal' | 'drop' | 'in_port' };

export interface OfFlow {
  readonly cookie: bigint;
  readonly table: number;
  readonly priority: number;
  readonly match: readonly OfMatch[];
  readonly actions: readonly OfAction[];
}

const COOKIE = { kind: 'uint', max: 0xffff_ffff_ffff_fffen, hex: true } as const; // all ones means "any cookie"
const COOKIE_MASK = { kind: 'uint', min: 1n, max: 0xffff_ffff_ffff_ffffn, hex: true } as const;
/** 255 is OFPTT_ALL: `table=255` quietly means "no table given". */
const TABLE = { kind: 'uint', max: 254n, hex: false } as const;
const PRIORITY = { kind: 'uint', max: 0xffffn, hex: false } as const;
/** A conjunction has 2..64 clauses (OpenFlow's conjunction action). */
const CONJ_CLAUSES = { kind: 'uint', min: 2n, max: 64n, hex: false } as const;
/** Zone 0 is the default one, which ovs-ofctl does not print back: weft names its zone. */
const CT_ZONE = { kind: 'uint', min: 1n, max: 0xffffn, hex: false } as const;

const refuse = (field: string, value: unknown, reason: string): never => {
  throw new UnsafeValueError(OFCTL, field, typeof value === 'string' ? value : String(value), reason);
};

const CT_FLAGS = ['new', 'est', 'rel', 'rpl', 'inv', 'trk'];
const CT_STATE_SHAPE = /^([+-](new|est|rel|rpl|inv|trk))+$/;
const MAC_SHAPE = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const OCTET = '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])';
const IPV4_SHAPE = new RegExp(`^${OCTET}(\\.${OCTET}){3}$`);

function ipv4Value(text: string): number {
  return text.split('.').reduce((v, o) => v * 256 + Number(o), 0);
}

function uintOf(field: string, value: unknown, shape: Extract<Shape, { kind: 'uint' }>): bigint {
  let n: bigint;
  if (typeof value === 'bigint') n = value;
  else if (typeof value === 'number' && Number.isSafeInteger(value)) n = BigInt(value);
  else return refuse(field, value, 'is not an integer');
  const min = shape.min ?? 0n;
  if (n < min || n > shape.max) return refuse(field, value, `is out of range ${min}..${shape.hex ? `0x${shape.max.toString(16)}` : shape.max}`);
  return n;
}

function uintText(n: bigint, hex: boolean): string {
  return hex ? `0x${n.toString(16)}` : n.toString();
}

/** The text of one value of `field`, after checking it as a word and against the field's shape. */
function valueText(field: string, value: unknown, shape: Shape): string {
  if (shape.kind === 'uint') {
    return checkWord(OFCTL, field, uintText(uintOf(field, value, shape), shape.hex), OFCTL_SPECIAL);
  }
  if (typeof value !== 'string') return refuse(field, value, `is not a text ${shape.kind === 'mac' ? 'MAC' : shape.kind === 'ct-state' ? 'ct_state' : 'IPv4'} value`);
  switch (shape.kind) {
    case 'ct-state':
      checkWord(OFCTL, field, value, without('-'));
      if (!CT_STATE_SHAPE.test(value)) refuse(field, value, 'is not ct_state flags (+/- new, est, rel, rpl, inv, trk)');
      {
        // ovs-ofctl refuses a flag given twice and prints them in bit order: write them that way.
        const order = value.match(/[a-z]+/g)!.map((f) => CT_FLAGS.indexOf(f));
        if (order.some((o, i) => i > 0 && o <= order[i - 1]!)) refuse(field, value, `must name each flag once, in the order ${CT_FLAGS.join(', ')}`);
      }
      return value;
    case 'mac':
      checkWord(OFCTL, field, value, without(':'));
      if (!MAC_SHAPE.test(value)) refuse(field, value, 'is not a MAC address (six lowercase hex pairs separated by ":")');
      return value;
    case 'ipv4':
      checkWord(OFCTL, field, value, OFCTL_SPECIAL);
      if (!IPV4_SHAPE.test(value)) refuse(field, value, 'is not an IPv4 address in dotted-quad form');
      return value;
    case 'ipv4-or-net': {
      checkWord(OFCTL, field, value, without('/'));
      const [addr = '', len, ...rest] = value.split('/');
      if (!IPV4_SHAPE.test(addr) || rest.length > 0) refuse(field, value, 'is not an IPv4 address or prefix');
      if (len === undefined) return value;
      if (!/^([1-9]|[12][0-9]|3[0-2])$/.test(len)) refuse(field, value, 'has no prefix length 1..32');
      const hostBits = 32 - Number(len);
      if (hostBits > 0 && ipv4Value(addr) % 2 ** hostBits !== 0) refuse(field, value, 'has host bits set');
      return value;
    }
  }
}

/** `value` or `value/mask` for a maskable unsigned field; the value must lie inside a non-zero mask. */
function maskedText(field: string, value: unknown, mask: unknown, shape: Shape): string {
  if (mask === undefined) return valueText(field, value, shape);
  if (shape.kind !== 'uint' || !shape.maskable) return refuse(field, mask, 'takes no mask here');
  const v = uintOf(field, value, shape);
  const m = uintOf(`${field} mask`, mask, { ...shape, min: 1n });
  if ((v & ~m) !== 0n) refuse(field, value, `has bits outside its mask 0x${m.toString(16)}`);
  // A masked value prints in hex whatever the field's plain form (tp_dst=0x50/0xfff0).
  const hex = { ...shape, hex: true };
  return `${valueText(field, v, hex)}/${valueText(`${field} mask`, m, hex)}`;
}

function lookup<T>(table: Readonly<Record<string, T>>, kind: string, name: unknown): T {
  if (typeof name !== 'string' || !Object.hasOwn(table, name)) return refuse(kind, name, `is not a ${kind} weft writes`);
  return table[name]!;
}

function nxm(name: unknown): string {
  if (typeof name !== 'string' || !(NXM_FIELDS as readonly string[]).includes(name)) return refuse('NXM field', name, 'is not an NXM field weft writes');
  return `${name}[]`;
}

export function renderMatch(m: OfMatch): string {
  const shape = lookup<Shape | null>(MATCH_FIELDS, 'match field', m.field);
  if (shape === null) {
    if ('value' in m) refuse(m.field, (m as { value: unknown }).value, 'is a protocol keyword and takes no value');
    return m.field;
  }
  if (!('value' in m)) return refuse(m.field, '', 'needs a value');
  return `${m.field}=${maskedText(m.field, m.value, m.mask, shape)}`;
}

export function renderAction(a: OfAction): string {
  switch (a.type) {
    case 'goto_table':
      return `goto_table:${valueText('goto_table', a.table, TABLE)}`;
    case 'set_field': {
      const shape = lookup<Shape>(SET_FIELDS, 'set_field field', a.field);
      return `set_field:${maskedText(`set_field ${a.field}`, a.value, a.mask, shape)}->${a.field}`;
    }
    case 'move':
      return `move:${nxm(a.src)}->${nxm(a.dst)}`;
    case 'output':
      return `output:${valueText('output', a.port, OFPORT)}`;
    case 'output_field':
      return `output:${nxm(a.field)}`;
    case 'conjunction': {
      const clauses = uintOf('conjunction clauses', a.clauses, CONJ_CLAUSES);
      const clause = uintOf('conjunction clause', a.clause, { ...CONJ_CLAUSES, min: 1n, max: clauses });
      return `conjunction(${valueText('conjunction id', a.id, U32_DEC)},${clause}/${clauses})`;
    }
    case 'ct': {
      const parts = [...(a.commit ? ['commit'] : []), ...(a.table === undefined ? [] : [`table=${valueText('ct table', a.table, TABLE)}`]), `zone=${valueText('ct zone', a.zone, CT_ZONE)}`];
      const labels = (a.labels ?? []).map((l) => {
        if (![0, 32, 64, 96].includes(l.low)) refuse('ct label bit', l.low, 'is not 0, 32, 64 or 96');
        return `move:${nxm(l.src)}->NXM_NX_CT_LABEL[${l.low}..${l.low + 31}]`;
      });
      if (labels.length > 0 && !a.commit) refuse('ct labels', labels.join(' '), 'are written only with commit');
      return `ct(${[...parts, ...(labels.length ? [`exec(${labels.join(',')})`] : [])].join(',')})`;
    }
    case 'dec_ttl':
      return 'dec_ttl';
    case 'normal':
      return 'NORMAL';
    case 'drop':
      return 'drop';
    case 'in_port':
      return 'IN_PORT';
    default:
      return refuse('action', (a as { type: unknown }).type, 'is not an action weft writes');
  }
}

/** One flow as `add-flows`/`replace-flows`/`diff-flows` read it, without the newline. */
export function renderFlow(f: OfFlow): string {
  if (f.actions.length === 0) refuse('actions', '', 'a flow needs at least one action (use drop)');
  if (f.actions.length > 1 && f.actions.some((a) => a.type === 'drop')) refuse('actions', 'drop', 'drop must be the only action');
  if (f.actions.some((a) => a.type === 'conjunction') && f.actions.some((a) => a.type !== 'conjunction')) refuse('actions', 'conjunction', 'a conjunction flow has only conjunction actions');
  const table = uintOf('table', f.table, TABLE);
  for (const a of f.actions) {
    // OpenFlow only goes forward; ovs-ofctl would refuse the whole file.
    if (a.type === 'goto_table' && uintOf('goto_table', a.table, TABLE) <= table) refuse('goto_table', a.table, `does not go past the flow's table ${table}`);
    if (a.type === 'ct' && a.table !== undefined && uintOf('ct table', a.table, TABLE) <= table) refuse('ct table', a.table, `does not go past the flow's table ${table}`);
  }
  const head = [
    `cookie=${valueText('cookie', f.cookie, COOKIE)}`,
    `table=${valueText('table', f.table, TABLE)}`,
    `priority=${valueText('priority', f.priority, PRIORITY)}`,
  ];
  return `${[...head, ...f.match.map(renderMatch)].join(',')},actions=${f.actions.map(renderAction).join(',')}`;
}

/** The `table=…,priority=…,<match>` that `delete_strict` takes: exactly one flow, whatever its cookie and actions. */
export function renderStrictSelector(f: Pick<OfFlow, 'table' | 'priority' | 'match'>): string {
  return [`table=${valueText('table', f.table, TABLE)}`, `priority=${valueText('priority', f.priority, PRIORITY)}`, ...f.match.map(renderMatch)].join(',');
}

/** Flows one per line, in the order given. */
export function renderFlows(flows: readonly OfFlow[]): string {
  return flows.map((f) => `${renderFlow(f)}\n`).join('');
}

/** The `cookie=VALUE/MASK` selector of del-flows and dump-flows (the value inside a non-zero mask). */
export function renderCookieMatch(cookie: bigint, mask: bigint): string {
  const m = uintOf('cookie mask', mask, COOKIE_MASK);
  const v = uintOf('cookie', cookie, { ...COOKIE_MASK, min: 0n });
  if ((v & ~m) !== 0n) refuse('cookie', cookie, `has bits outside its mask 0x${m.toString(16)}`);
  return `cookie=${uintText(v, true)}/${uintText(m, true)}`;
}
