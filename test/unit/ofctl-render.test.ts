// src/render/ofctl.ts: every value of a flow is refused with UnsafeValueError or comes back from a
// real `ovs-ofctl -O OpenFlow15 parse-flows` (offline: no switch needed) as exactly the flow that
// was meant. The property test puts random words — every C0 and C1 control, DEL, Unicode spaces,
// bidi controls, ovs-ofctl's specials, injections and near-valid values — and random numbers into
// each value position, and compares what ovs-ofctl parsed with an expectation built from the
// intended flow alone (not from the rendered text). The seed is printed; WEFT_FUZZ_SEED=<n> repeats a run.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { macFromIP, pipelineFlows, podFlows, renderFlows as renderPipeline } from '../../src/backend/ovs/pipeline.js';
import { OFCTL_SPECIAL, renderCookieMatch, renderFlow, renderFlows, type OfAction, type OfFlow, type OfMatch } from '../../src/render/ofctl.js';
import { UnsafeValueError } from '../../src/render/word.js';
import { IPAddr } from '../../src/util/ip.js';
import { C0, C1, DEL, FuzzGen, fuzzSeed, UNICODE_SPACES } from '../helpers/render-fuzz.js';

const execFileP = promisify(execFile);

// ---------------------------------------------------------------------------------------------
// Inputs

const BIDI = ['\u202a', '\u202b', '\u202c', '\u202d', '\u202e', '\u2066', '\u2067', '\u2068', '\u2069', '\u200e', '\u200f', '\u061c'];
const SPECIALS = [...OFCTL_SPECIAL, ' ', '\t', '.', '@', '$', '%', '&', '|', '`', '~', '?', '+', '^'];
const SHAPE_CHARS = [...'0123456789abcdefABCDEFx.:/'];
const LETTERS = [...'ghijklmnopqrstuvwyzGHIJKLMNOPQRSTUVWYZ_é東🙂'];
const INJECTIONS = [
  ',actions=drop',
  ',priority=65535',
  ',in_port=1',
  ' actions=NORMAL',
  '\nadd table=0,priority=65535,actions=NORMAL',
  '\r\ntable=0,actions=drop',
  '->reg1',
  '/0',
  '/32',
  '#comment',
  '(1)',
  '[]',
  '=1',
  ':1',
  '\\',
  '"',
  '0x',
  '-1',
];

type Kind = 'mac' | 'ipv4' | 'ipv4-or-net' | 'number';
type InputClass = 'valid' | 'unsafe or masked-out integer' | 'C0' | 'DEL' | 'C1' | 'unicode space' | 'bidi/format' | 'ofctl special' | 'injection' | 'near-valid' | 'random word' | 'number' | 'number-like string';

interface Input {
  cls: InputClass;
  readonly value: string | number | bigint;
}

/** Values in the shapes of flow fields, and mutations of them (FuzzGen's seeded int and pick underneath). */
class Gen extends FuzzGen {
  /** A uniform-enough bigint in min..max (64 random bits reduced). */
  between(min: bigint, max: bigint): bigint {
    const bits = (BigInt(this.int(2 ** 32)) << 32n) | BigInt(this.int(2 ** 32));
    return min + (bits % (max - min + 1n));
  }
  hex2(): string {
    return this.int(256).toString(16).padStart(2, '0');
  }
  mac(): string {
    return Array.from({ length: 6 }, () => this.hex2()).join(':');
  }
  ipv4(): string {
    return Array.from({ length: 4 }, () => String(this.pick([0, 1, 9, 10, 99, 100, 199, 200, 249, 250, 255, this.int(256)]))).join('.');
  }
  net(): string {
    const len = 1 + this.int(32);
    const ip = IPAddr.parse(this.ipv4());
    const mask = ((1n << BigInt(len)) - 1n) << BigInt(32 - len);
    return `${IPAddr.of(4, ip.value & mask).toString()}/${len}`;
  }
  valid(kind: Exclude<Kind, 'number'>): string {
    if (kind === 'mac') return this.mac();
    if (kind === 'ipv4') return this.ipv4();
    return this.int(2) === 0 ? this.ipv4() : this.net();
  }
  /** A valid value with one character inserted, replaced or appended from `pool`. */
  mutate(base: string, pool: readonly string[]): string {
    const at = this.int(base.length + 1);
    const c = this.pick(pool);
    switch (this.int(3)) {
      case 0:
        return base.slice(0, at) + c + base.slice(at);
      case 1:
        return base.slice(0, at) + c + base.slice(at + 1);
      default:
        return base + c;
    }
  }
  word(pools: ReadonlyArray<readonly string[]>, max = 24): string {
    return Array.from({ length: this.int(max + 1) }, () => this.pick(this.pick(pools))).join('');
  }
  /** One input for a string position of `kind`. */
  text(kind: Exclude<Kind, 'number'>): Input {
    const base = this.valid(kind);
    const all = [C0, [DEL], C1, UNICODE_SPACES, BIDI, SPECIALS, SHAPE_CHARS, LETTERS];
    switch (this.int(11)) {
      case 0:
      case 1:
        return { cls: 'valid', value: base };
      case 2:
        return { cls: 'C0', value: this.mutate(base, C0) };
      case 3:
        return { cls: 'DEL', value: this.mutate(base, [DEL]) };
      case 4:
        return { cls: 'C1', value: this.mutate(base, C1) };
      case 5:
        return { cls: 'unicode space', value: this.mutate(base, UNICODE_SPACES) };
      case 6:
        return { cls: 'bidi/format', value: this.mutate(base, BIDI) };
      case 7:
        return { cls: 'ofctl special', value: this.mutate(base, SPECIALS) };
      case 8:
        return { cls: 'injection', value: base + this.pick(INJECTIONS) + (this.int(2) ? this.valid(kind) : '') };
      case 9:
        return { cls: 'near-valid', value: this.mutate(base, SHAPE_CHARS) };
      default:
        return { cls: 'random word', value: this.word(all) };
    }
  }
  /** One input for a number position whose valid range is min..max. */
  number(min: bigint, max: bigint): Input {
    const inRange = (): bigint => this.between(min, max);
    switch (this.int(8)) {
      case 0:
      case 1:
        return { cls: 'valid', value: Number(inRange()) };
      case 2:
        return { cls: 'valid', value: this.pick([min, max]) };
      case 3:
        return { cls: 'number', value: this.pick([min - 1n, max + 1n, -1n, 1n << 64n, -(1n << 63n)]) };
      case 4:
        return { cls: 'number', value: this.pick([NaN, Infinity, -Infinity, 0.5, 1.5, -0.1, 2 ** 53, Number(max) + 0.5, -1]) };
      case 5:
        return { cls: 'number-like string', value: this.pick([String(inRange()), `0x${inRange().toString(16)}`, ' 1', '1,actions=drop', '1\n', '', '1e3', '٣']) };
      case 6:
        return { cls: 'random word', value: this.word([C0, C1, SPECIALS, SHAPE_CHARS, LETTERS, UNICODE_SPACES, BIDI], 12) };
      default:
        return { cls: 'valid', value: inRange() };
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The oracle: what `ovs-ofctl parse-flows` prints for an intended flow, built from its fields.

interface Expected {
  readonly table: string | null;
  readonly cookie: string | null;
  readonly match: readonly string[];
  readonly actions: string;
}

const U32 = 0xffff_ffffn;
const hexOut = (n: bigint) => (n === 0n ? '0' : `0x${n.toString(16)}`);
const big = (v: string | number | bigint) => BigInt(v);

/** ovs prints an exact /32 as the bare address. */
const ipOut = (v: string) => v.replace(/\/32$/, '');

type Field = { name: string; out: (v: string | number | bigint) => string };
const DEC = (name: string): Field => ({ name, out: (v) => big(v).toString() });
const HEX = (name: string): Field => ({ name, out: (v) => hexOut(big(v)) });
const TXT = (name: string): Field => ({ name, out: (v) => String(v) });
const IPF = (name: string): Field => ({ name, out: (v) => ipOut(String(v)) });

function maskedOut(v: bigint, mask: bigint, full: bigint): string {
  return mask === full ? hexOut(v) : `${hexOut(v)}/0x${mask.toString(16)}`;
}

function parseOutput(line: string): Expected {
  const body = line.replace(/^OFPT_FLOW_MOD \(OF1\.5\) \(xid=0x[0-9a-f]+\): ADD /, '');
  assert.notEqual(body, line, `not a flow_mod line: ${line}`);
  let table: string | null = null;
  let cookie: string | null = null;
  let match: string[] = [];
  let actions = '';
  for (const token of body.split(' ')) {
    if (token.startsWith('table:')) table = token.slice(6);
    else if (token.startsWith('cookie:')) cookie = token.slice(7);
    else if (token.startsWith('actions=')) actions = token.slice(8);
    else match = token.split(',');
  }
  return { table, cookie, match: match.sort(), actions };
}

function expectedOf(head: { table: number; priority: number; cookie: bigint }, match: readonly string[], actions: readonly string[]): Expected {
  return {
    table: head.table === 0 ? null : String(head.table),
    cookie: head.cookie === 0n ? null : `0x${head.cookie.toString(16)}`,
    match: [...(head.priority === 32768 ? [] : [`priority=${head.priority}`]), ...match].sort(),
    actions: actions.join(','),
  };
}

// ---------------------------------------------------------------------------------------------
// Value positions: a flow with the input in one place, and the flow ovs must read back.

interface Position {
  readonly name: string;
  readonly kind: Kind;
  /** For number positions: the valid range. */
  readonly min?: bigint;
  readonly max?: bigint;
  /** Beyond the range: what else a value must satisfy to be accepted (a masked value lies inside its mask). */
  readonly valid?: (v: bigint) => boolean;
  readonly build: (v: Input['value']) => OfFlow;
  readonly expected: (v: Input['value']) => Expected;
}

const HEAD = { cookie: 0x1234n, table: 10, priority: 100 };
const flow = (match: OfMatch[], actions: OfAction[], head: Partial<typeof HEAD> = {}): OfFlow => ({ ...HEAD, ...head, match, actions });
const DROP: OfAction = { type: 'drop' };

function matchPosition(kind: Kind, f: Field, prereq: 'ip' | 'arp' | 'tcp' | null, range?: [bigint, bigint]): Position {
  const pre: OfMatch[] = prereq ? [{ field: prereq }] : [];
  return {
    name: `match ${f.name}`,
    kind,
    ...(range ? { min: range[0], max: range[1] } : {}),
    build: (v) => flow([...pre, { field: f.name, value: v } as OfMatch], [DROP]),
    expected: (v) => expectedOf(HEAD, [...(prereq ? [prereq] : []), `${f.name}=${f.out(v)}`], ['drop']),
  };
}

function setPosition(kind: Kind, f: Field, prereq: 'ip' | 'arp' | null, range?: [bigint, bigint]): Position {
  const pre: OfMatch[] = prereq ? [{ field: prereq }] : [];
  return {
    name: `set_field ${f.name}`,
    kind,
    ...(range ? { min: range[0], max: range[1] } : {}),
    build: (v) => flow(pre, [{ type: 'set_field', field: f.name, value: v } as OfAction, { type: 'goto_table', table: 20 }]),
    expected: (v) => expectedOf(HEAD, prereq ? [prereq] : [], [`set_field:${f.out(v)}->${f.name}`, 'goto_table:20']),
  };
}

/** A position holding an integer of min..max (`valid`: what else it must satisfy). */
function numeric(name: string, min: bigint, max: bigint, build: Position['build'], expected: Position['expected'], valid?: Position['valid']): Position {
  return { name, kind: 'number', min, max, build, expected, ...(valid ? { valid } : {}) };
}

const POSITIONS: Position[] = [
  matchPosition('number', DEC('in_port'), null, [1n, 0xfeffn]),
  matchPosition('number', HEX('tun_id'), null, [0n, 0xffff_ffff_ffff_ffffn]),
  matchPosition('number', HEX('reg1'), null, [0n, U32]),
  numeric(
    'match reg0 value under mask 0xff00', 0n, 0xff00n,
    (v) => flow([{ field: 'reg0', value: v, mask: 0xff00 }], [DROP]),
    (v) => expectedOf(HEAD, [`reg0=${maskedOut(big(v), 0xff00n, U32)}`], ['drop']),
    (v) => (v & ~0xff00n) === 0n,
  ),
  numeric(
    'match reg0 mask over value 0x100', 1n, U32,
    (v) => flow([{ field: 'reg0', value: 0x100, mask: v }], [DROP]),
    (v) => expectedOf(HEAD, [`reg0=${maskedOut(0x100n, big(v), U32)}`], ['drop']),
    (m) => (0x100n & ~m) === 0n,
  ),
  matchPosition('mac', TXT('dl_src'), null),
  matchPosition('mac', TXT('dl_dst'), null),
  matchPosition('ipv4-or-net', IPF('nw_src'), 'ip'),
  matchPosition('ipv4-or-net', IPF('nw_dst'), 'ip'),
  matchPosition('ipv4-or-net', IPF('arp_spa'), 'arp'),
  matchPosition('ipv4-or-net', IPF('arp_tpa'), 'arp'),
  matchPosition('mac', TXT('arp_sha'), 'arp'),
  matchPosition('mac', TXT('arp_tha'), 'arp'),
  matchPosition('number', DEC('arp_op'), 'arp', [0n, 255n]),
  setPosition('mac', TXT('eth_src'), null),
  setPosition('mac', TXT('eth_dst'), null),
  setPosition('mac', TXT('arp_sha'), 'arp'),
  setPosition('mac', TXT('arp_tha'), 'arp'),
  setPosition('ipv4', TXT('arp_spa'), 'arp'),
  setPosition('ipv4', TXT('arp_tpa'), 'arp'),
  setPosition('number', DEC('arp_op'), 'arp', [0n, 255n]),
  setPosition('ipv4', TXT('tun_dst'), null),
  setPosition('number', HEX('tun_id'), null, [0n, 0xffff_ffff_ffff_ffffn]),
  setPosition('number', HEX('reg1'), null, [0n, U32]),
  numeric(
    'set_field reg0 value under mask 0xf', 0n, 0xfn,
    (v) => flow([], [{ type: 'set_field', field: 'reg0', value: v, mask: 0xf }, { type: 'goto_table', table: 20 }]),
    (v) => expectedOf(HEAD, [], [`set_field:${maskedOut(big(v), 0xfn, U32)}->reg0`, 'goto_table:20']),
  ),
  // The policy tables' fields and actions.
  matchPosition('number', DEC('conj_id'), null, [0n, U32]),
  matchPosition('number', HEX('reg2'), null, [0n, U32]),
  matchPosition('number', HEX('reg3'), null, [0n, U32]),
  matchPosition('number', DEC('tp_dst'), 'tcp', [0n, 0xffffn]),
  numeric(
    'match tp_dst value under mask 0xfff0', 0n, 0xfff0n,
    (v) => flow([{ field: 'tcp' }, { field: 'tp_dst', value: v, mask: 0xfff0 }], [DROP]),
    (v) => expectedOf(HEAD, ['tcp', `tp_dst=0x${big(v).toString(16)}/0xfff0`], ['drop']), // a masked port prints in hex, 0 as 0x0
    (v) => (v & ~0xfff0n) === 0n,
  ),
  setPosition('number', HEX('reg2'), null, [0n, U32]),
  setPosition('number', HEX('reg3'), null, [0n, U32]),
  numeric(
    'conjunction id', 0n, U32,
    (v) => flow([{ field: 'ip' }], [{ type: 'conjunction', id: v as number, clause: 1, clauses: 2 }]),
    (v) => expectedOf(HEAD, ['ip'], [`conjunction(${big(v)},1/2)`]),
  ),
  numeric(
    'conjunction clauses', 2n, 64n,
    (v) => flow([{ field: 'ip' }], [{ type: 'conjunction', id: 9, clause: 2, clauses: v as number }]),
    (v) => expectedOf(HEAD, ['ip'], [`conjunction(9,2/${big(v)})`]),
  ),
  numeric(
    'ct table from table 10', 11n, 254n,
    (v) => flow([{ field: 'ip' }], [{ type: 'ct', zone: 65520, table: v as number }]),
    (v) => expectedOf(HEAD, ['ip'], [`ct(table=${big(v)},zone=65520)`]),
  ),
  numeric('goto_table from table 10', 11n, 254n, (v) => flow([], [{ type: 'goto_table', table: v as number }]), (v) => expectedOf(HEAD, [], [`goto_table:${big(v)}`])),
  numeric('output port', 1n, 0xfeffn, (v) => flow([], [{ type: 'output', port: v as number }]), (v) => expectedOf(HEAD, [], [`output:${big(v)}`])),
  numeric('cookie', 0n, 0xffff_ffff_ffff_fffen, (v) => flow([{ field: 'ip' }], [DROP], { cookie: v as bigint }), (v) => expectedOf({ ...HEAD, cookie: big(v) }, ['ip'], ['drop'])),
  numeric('table', 0n, 254n, (v) => flow([{ field: 'ip' }], [DROP], { table: v as number }), (v) => expectedOf({ ...HEAD, table: Number(v) }, ['ip'], ['drop'])),
  numeric('priority', 0n, 65535n, (v) => flow([{ field: 'ip' }], [DROP], { priority: v as number }), (v) => expectedOf({ ...HEAD, priority: Number(v) }, ['ip'], ['drop'])),
];

/** Whether a number-position input is what the renderer must accept: an integer (number or bigint) in range. */
function validNumber(v: Input['value'], min: bigint, max: bigint): boolean {
  if (typeof v === 'bigint') return v >= min && v <= max;
  if (typeof v === 'number') return Number.isSafeInteger(v) && BigInt(v) >= min && BigInt(v) <= max;
  return false;
}

/** Whether a string-position input has the field's canonical shape (what the renderer must accept). */
function validText(kind: Exclude<Kind, 'number'>, v: Input['value']): boolean {
  if (typeof v !== 'string') return false;
  const octet = '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])';
  const ip = `${octet}(\\.${octet}){3}`;
  if (kind === 'mac') return /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/.test(v);
  if (kind === 'ipv4') return new RegExp(`^${ip}$`).test(v);
  const m = new RegExp(`^(?<addr>${ip})(/(?<len>[1-9]|[12][0-9]|3[0-2]))?$`).exec(v);
  if (!m?.groups) return false;
  if (m.groups.len === undefined) return true;
  const len = Number(m.groups.len);
  const value = IPAddr.parse(m.groups.addr!).value;
  return (value & ((1n << BigInt(32 - len)) - 1n)) === 0n;
}

/** ovs-ofctl's reading of `text`; when it refuses a line, the error quotes that line. */
async function parseFlows(dir: string, text: string): Promise<string[]> {
  const file = join(dir, `flows-${Math.random().toString(36).slice(2)}.txt`);
  writeFileSync(file, text);
  try {
    const { stdout } = await execFileP('ovs-ofctl', ['-O', 'OpenFlow15', 'parse-flows', file], { maxBuffer: 256 << 20 });
    return stdout.split('\n').filter((l) => l.startsWith('OFPT_FLOW_MOD'));
  } catch (e) {
    const stderr = String((e as { stderr?: unknown }).stderr ?? e);
    const at = Number(/:(\d+): /.exec(stderr)?.[1] ?? 0);
    throw new Error(`ovs-ofctl refused a rendered flow: ${stderr.trim()}\n  line ${at}: ${text.split('\n')[at - 1] ?? '?'}`);
  }
}

const SEED = fuzzSeed();
const PER_POSITION = 400;

describe('ovs-ofctl flow renderer (src/render/ofctl.ts)', function () {
  this.timeout(120_000);
  let dir = '';
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'weft-ofctl-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('renders typed flows in the text dump-flows prints back', () => {
    assert.equal(
      renderFlow({
        cookie: 0x2030000000003n,
        table: 10,
        priority: 200,
        match: [{ field: 'ip' }, { field: 'in_port', value: 3 }, { field: 'dl_src', value: '0a:58:0a:f4:01:02' }, { field: 'nw_src', value: '10.244.1.2' }],
        actions: [{ type: 'set_field', field: 'reg0', value: 3, mask: 0xf }, { type: 'goto_table', table: 30 }],
      }),
      'cookie=0x2030000000003,table=10,priority=200,ip,in_port=3,dl_src=0a:58:0a:f4:01:02,nw_src=10.244.1.2,actions=set_field:0x3/0xf->reg0,goto_table:30',
    );
    assert.equal(renderFlows([flow([], [DROP])]), 'cookie=0x1234,table=10,priority=100,actions=drop\n');
    assert.equal(renderCookieMatch(0x30000000003n, (1n << 48n) - 1n), 'cookie=0x30000000003/0xffffffffffff');
  });

  it('refuses a bad value with UnsafeValueError naming the field, the value and why', () => {
    const refused = (f: OfFlow, field: string, reason: RegExp) =>
      assert.throws(
        () => renderFlow(f),
        (e: unknown) => {
          assert.ok(e instanceof UnsafeValueError, String(e));
          assert.equal(e.protocol, 'ovs-ofctl');
          assert.equal(e.field, field);
          assert.match(e.reason, reason);
          assert.ok(e.message.startsWith(`ovs-ofctl: refusing ${field} `), e.message);
          return true;
        },
      );
    refused(flow([{ field: 'dl_src', value: '0a:58:0a:f4:01:02,actions=NORMAL' }], [DROP]), 'dl_src', /contains ","/);
    refused(flow([{ field: 'dl_src', value: '0a:58:0a:f4:01:02\nadd actions=NORMAL' }], [DROP]), 'dl_src', /control character/);
    refused(flow([{ field: 'dl_src', value: '0A:58:0A:F4:01:02' }], [DROP]), 'dl_src', /not a MAC address/);
    refused(flow([{ field: 'ip' }, { field: 'nw_dst', value: '10.244.0.0/0' }], [DROP]), 'nw_dst', /prefix length 1\.\.32/);
    refused(flow([{ field: 'ip' }, { field: 'nw_dst', value: '10.244.1.5/24' }], [DROP]), 'nw_dst', /host bits/);
    refused(flow([{ field: 'ip' }, { field: 'nw_src', value: '010.1.1.1' }], [DROP]), 'nw_src', /not an IPv4 address/);
    refused(flow([{ field: 'in_port', value: 0xffffff00 }], [DROP]), 'in_port', /out of range 1\.\.65279/);
    refused(flow([{ field: 'in_port', value: '1,actions=drop' as unknown as number }], [DROP]), 'in_port', /not an integer/);
    refused(flow([{ field: 'arp' }, { field: 'arp_op', value: 256 }], [DROP]), 'arp_op', /out of range/);
    refused(flow([], [DROP], { table: 255 }), 'table', /out of range 0\.\.254/);
    refused(flow([], [DROP], { cookie: (1n << 64n) - 1n }), 'cookie', /out of range/);
    refused(flow([], [{ type: 'goto_table', table: 10 }]), 'goto_table', /does not go past the flow's table 10/);
    refused(flow([{ field: 'reg0', value: 0x10, mask: 0xf }], [DROP]), 'reg0', /bits outside its mask/);
    refused(flow([{ field: 'reg0', value: 0, mask: 0 }], [DROP]), 'reg0 mask', /out of range/);
    refused(flow([{ field: 'dl_src', value: '0a:58:0a:f4:01:02', mask: 1 }], [DROP]), 'dl_src', /takes no mask/);
    refused(flow([{ field: 'nw_dst,actions=drop', value: '1.2.3.4' } as unknown as OfMatch], [DROP]), 'match field', /not a match field weft writes/);
    refused(flow([], [{ type: 'move', src: 'NXM_OF_ETH_SRC', dst: 'NXM_NX_REG1[0..3],NORMAL' } as unknown as OfAction]), 'NXM field', /not an NXM field/);
    refused(flow([], []), 'actions', /at least one action/);
    refused(flow([], [{ type: 'dec_ttl' }, DROP]), 'actions', /drop must be the only action/);
    assert.throws(() => renderCookieMatch(0x10n, 0xfn), UnsafeValueError);
  });

  it('renders the policy fields and actions (tcp/udp/sctp, ct_state, conj_id, reg2/reg3, masked tp_dst, conjunction, ct) as dump-flows prints them', async () => {
    const P = { cookie: 0x4000000000007n, table: 52, priority: 200 };
    const cases: Array<[OfFlow, string]> = [
      [flow([{ field: 'tcp' }, { field: 'tp_dst', value: 0x50, mask: 0xfff0 }], [{ type: 'conjunction', id: 7, clause: 1, clauses: 3 }], P), 'cookie=0x4000000000007,table=52,priority=200,tcp,tp_dst=0x50/0xfff0,actions=conjunction(7,1/3)'],
      [flow([{ field: 'udp' }, { field: 'tp_dst', value: 8010 }], [{ type: 'conjunction', id: 7, clause: 3, clauses: 3 }, { type: 'conjunction', id: 4294967295, clause: 2, clauses: 2 }], P), 'cookie=0x4000000000007,table=52,priority=200,udp,tp_dst=8010,actions=conjunction(7,3/3),conjunction(4294967295,2/2)'],
      [flow([{ field: 'sctp' }, { field: 'tp_dst', value: 0x8000, mask: 0x8000 }], [{ type: 'conjunction', id: 1, clause: 64, clauses: 64 }], P), 'cookie=0x4000000000007,table=52,priority=200,sctp,tp_dst=0x8000/0x8000,actions=conjunction(1,64/64)'],
      [flow([{ field: 'conj_id', value: 7 }, { field: 'ip' }], [{ type: 'set_field', field: 'reg2', value: 7 }, { type: 'goto_table', table: 54 }], P), 'cookie=0x4000000000007,table=52,priority=200,conj_id=7,ip,actions=set_field:0x7->reg2,goto_table:54'],
      [flow([{ field: 'conj_id', value: 4294967295 }, { field: 'ip' }], [{ type: 'set_field', field: 'reg3', value: 4294967295 }, { type: 'goto_table', table: 56 }], { ...P, table: 54 }), 'cookie=0x4000000000007,table=54,priority=200,conj_id=4294967295,ip,actions=set_field:0xffffffff->reg3,goto_table:56'],
      [flow([{ field: 'ct_state', value: '+inv+trk' }, { field: 'ip' }], [DROP], { ...P, table: 51, priority: 210 }), 'cookie=0x4000000000007,table=51,priority=210,ct_state=+inv+trk,ip,actions=drop'],
      [flow([{ field: 'ct_state', value: '-new+trk' }, { field: 'ip' }], [{ type: 'goto_table', table: 60 }], { ...P, table: 51 }), 'cookie=0x4000000000007,table=51,priority=200,ct_state=-new+trk,ip,actions=goto_table:60'],
      [flow([{ field: 'ip' }, { field: 'reg0', value: 0x100, mask: 0x100 }], [{ type: 'ct', zone: 65520, table: 51 }], { ...P, table: 50 }), 'cookie=0x4000000000007,table=50,priority=200,ip,reg0=0x100/0x100,actions=ct(table=51,zone=65520)'],
      [
        flow(
          [{ field: 'ct_state', value: '+new+trk' }, { field: 'ip' }],
          [{ type: 'ct', zone: 65520, commit: true, labels: [{ src: 'NXM_NX_REG2', low: 0 }, { src: 'NXM_NX_REG3', low: 32 }] }, { type: 'goto_table', table: 60 }],
          { ...P, table: 56 },
        ),
        'cookie=0x4000000000007,table=56,priority=200,ct_state=+new+trk,ip,actions=ct(commit,zone=65520,exec(move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31],move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63])),goto_table:60',
      ],
      [flow([{ field: 'ip' }], [{ type: 'ct', zone: 1, commit: true, labels: [{ src: 'NXM_NX_REG2', low: 96 }] }], { ...P, table: 56 }), 'cookie=0x4000000000007,table=56,priority=200,ip,actions=ct(commit,zone=1,exec(move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[96..127]))'],
      [flow([{ field: 'ip' }, { field: 'reg2', value: 5 }, { field: 'reg3', value: 6, mask: 0xff }], [DROP], P), 'cookie=0x4000000000007,table=52,priority=200,ip,reg2=0x5,reg3=0x6/0xff,actions=drop'],
    ];
    for (const [f, text] of cases) assert.equal(renderFlow(f), text);
    // ovs-ofctl reads each back as the same flow, its match printed in the same order.
    const parsed = await parseFlows(dir, cases.map(([, text]) => `${text}\n`).join(''));
    assert.equal(parsed.length, cases.length);
    cases.forEach(([f, text], i) => {
      const body = parsed[i]!.replace(/^OFPT_FLOW_MOD \(OF1\.5\) \(xid=0x[0-9a-f]+\): ADD /, '');
      const match = text.slice(text.indexOf('priority='), text.indexOf(',actions='));
      assert.equal(body, `table:${f.table} ${match} cookie:0x${f.cookie.toString(16)} actions=${text.slice(text.indexOf(',actions=') + 9)}`, text);
    });
  });

  it('refuses bad policy values: ct_state garbage, conjunction clause/clauses, ct labels and tables, conjunction mixed with other actions', () => {
    const refused = (f: OfFlow, field: string, reason: RegExp) =>
      assert.throws(
        () => renderFlow(f),
        (e: unknown) => {
          assert.ok(e instanceof UnsafeValueError, String(e));
          assert.equal(e.field, field);
          assert.match(e.reason, reason);
          return true;
        },
        `${field} ${reason.source}`,
      );
    const conj = (id: unknown, clause: unknown, clauses: unknown) => ({ type: 'conjunction', id, clause, clauses }) as unknown as OfAction;
    for (const bad of ['', 'est', '+est,actions=drop', '+bogus', '+est+', '++est', '+EST', '+est -new', '+est\n', 'new+trk', '+est/0x2', '+snat']) {
      refused(flow([{ field: 'ct_state', value: bad }, { field: 'ip' }], [DROP]), 'ct_state', /empty|contains|control|not ct_state flags/);
    }
    refused(flow([{ field: 'ct_state', value: 2 }, { field: 'ip' }], [DROP]), 'ct_state', /not a text ct_state value/);
    refused(flow([{ field: 'ct_state', value: '+est', mask: 2 }, { field: 'ip' }], [DROP]), 'ct_state', /takes no mask/);
    refused(flow([{ field: 'ip' }], [conj(7, 0, 2)]), 'conjunction clause', /out of range 1\.\.2/);
    refused(flow([{ field: 'ip' }], [conj(7, 3, 2)]), 'conjunction clause', /out of range 1\.\.2/);
    refused(flow([{ field: 'ip' }], [conj(7, 1, 1)]), 'conjunction clauses', /out of range 2\.\.64/);
    refused(flow([{ field: 'ip' }], [conj(7, 1, 65)]), 'conjunction clauses', /out of range 2\.\.64/);
    refused(flow([{ field: 'ip' }], [conj(7, 1.5, 2)]), 'conjunction clause', /not an integer/);
    refused(flow([{ field: 'ip' }], [conj(-1, 1, 2)]), 'conjunction id', /out of range/);
    refused(flow([{ field: 'ip' }], [conj(2 ** 32, 1, 2)]), 'conjunction id', /out of range/);
    refused(flow([{ field: 'ip' }], [conj('7),drop', 1, 2)]), 'conjunction id', /not an integer/);
    refused(flow([{ field: 'ip' }], [conj(7, 1, 2), { type: 'goto_table', table: 20 }]), 'actions', /only conjunction actions/);
    refused(flow([{ field: 'ip' }], [{ type: 'set_field', field: 'reg2', value: 7 }, conj(7, 1, 2)]), 'actions', /only conjunction actions/);
    refused(flow([{ field: 'ip' }], [conj(7, 1, 2), DROP]), 'actions', /drop must be the only action/);
    const ct = (a: Record<string, unknown>) => ({ type: 'ct', zone: 65520, ...a }) as unknown as OfAction;
    refused(flow([{ field: 'ip' }], [ct({ commit: true, labels: [{ src: 'NXM_NX_REG2', low: 16 }] })]), 'ct label bit', /not 0, 32, 64 or 96/);
    refused(flow([{ field: 'ip' }], [ct({ commit: true, labels: [{ src: 'NXM_NX_REG2', low: 128 }] })]), 'ct label bit', /not 0, 32, 64 or 96/);
    refused(flow([{ field: 'ip' }], [ct({ commit: true, labels: [{ src: 'NXM_NX_CT_LABEL', low: 0 }] })]), 'NXM field', /not an NXM field/);
    refused(flow([{ field: 'ip' }], [ct({ labels: [{ src: 'NXM_NX_REG2', low: 0 }] })]), 'ct labels', /only with commit/);
    refused(flow([{ field: 'ip' }], [ct({ table: 10 })]), 'ct table', /does not go past the flow's table 10/);
    refused(flow([{ field: 'ip' }], [ct({ table: 5 })]), 'ct table', /does not go past the flow's table 10/);
    refused(flow([{ field: 'ip' }], [ct({ table: 255 })]), 'ct table', /out of range 0\.\.254/);
    refused(flow([{ field: 'ip' }], [ct({ zone: 65536, table: 51 })]), 'ct zone', /out of range 1\.\.65535/);
    refused(flow([{ field: 'ip' }], [ct({ zone: '1,commit', table: 51 })]), 'ct zone', /not an integer/);
    refused(flow([{ field: 'tcp' }, { field: 'tp_dst', value: 65536 }], [DROP]), 'tp_dst', /out of range 0\.\.65535/);
    refused(flow([{ field: 'tcp' }, { field: 'tp_dst', value: 0x51, mask: 0xfff0 }], [DROP]), 'tp_dst', /bits outside its mask/);
    refused(flow([{ field: 'tcp' }, { field: 'tp_dst', value: 0, mask: 0x10000 }], [DROP]), 'tp_dst mask', /out of range/);
    refused(flow([{ field: 'conj_id', value: 2 ** 32 }], [DROP]), 'conj_id', /out of range/);
    refused(flow([{ field: 'conj_id', value: 7, mask: 0xff }], [DROP]), 'conj_id', /takes no mask/);
    refused(flow([{ field: 'tcp', value: 6 } as unknown as OfMatch], [DROP]), 'tcp', /protocol keyword/);
  });

  // FAILING (src/render/ofctl.ts): ovs-ofctl refuses a ct_state naming a flag twice ("Each ct_state
  // flag can be specified only once": the whole bundle fails), prints ct_state flags in its own
  // order (+inv+trk for +trk+inv) and prints ct zone 0 as no zone at all (ct(commit), not
  // ct(commit,zone=0)); the renderer accepts all three as they are.
  it('renders a ct value only when ovs-ofctl takes it and prints it back the same (duplicate ct_state flags, flag order, zone 0)', async () => {
    const problems: string[] = [];
    for (const bad of ['+new-new', '+trk+trk', '-est+est']) {
      try {
        problems.push(`ct_state=${bad} rendered (${renderFlow(flow([{ field: 'ct_state', value: bad }, { field: 'ip' }], [DROP]))}); ovs-ofctl refuses it`);
      } catch (e) {
        assert.ok(e instanceof UnsafeValueError, String(e));
      }
    }
    const printedBack: OfFlow[] = [flow([{ field: 'ct_state', value: '+trk+inv' }, { field: 'ip' }], [DROP]), flow([{ field: 'ip' }], [{ type: 'ct', zone: 0, table: 51 }])];
    for (const f of printedBack) {
      let text: string;
      try {
        text = renderFlow(f);
      } catch (e) {
        assert.ok(e instanceof UnsafeValueError, String(e));
        continue; // refusing is fine too
      }
      const [line] = await parseFlows(dir, `${text}\n`);
      const body = line!.replace(/^OFPT_FLOW_MOD \(OF1\.5\) \(xid=0x[0-9a-f]+\): ADD table:\d+ /, '');
      const want = `${text.slice(text.indexOf('priority='), text.indexOf(',actions='))} cookie:0x1234 actions=${text.slice(text.indexOf(',actions=') + 9)}`;
      if (body !== want) problems.push(`${text} prints back as ${body}`);
    }
    assert.deepEqual(problems, []);
  });

  it(`property: every value in every position is refused or parsed back by ovs-ofctl as the intended flow (seed ${SEED})`, async () => {
    console.log(`      ofctl fuzz seed ${SEED} (repeat with WEFT_FUZZ_SEED=${SEED})`);
    const g = new Gen(SEED);
    const accepted: Array<{ position: string; value: Input['value']; line: string; expected: Expected }> = [];
    const counts = new Map<string, { refused: number; accepted: number }>();
    const count = (cls: string, ok: boolean) => {
      const c = counts.get(cls) ?? { refused: 0, accepted: 0 };
      if (ok) c.accepted++;
      else c.refused++;
      counts.set(cls, c);
    };
    // Every character of every class, in every position: in the middle of a valid value and at its end.
    const sweep = (p: Position): Input[] => {
      const base = p.kind === 'number' ? String(p.min) : g.valid(p.kind);
      const classes: Array<[InputClass, readonly string[]]> = [['C0', C0], ['DEL', [DEL]], ['C1', C1], ['unicode space', UNICODE_SPACES], ['bidi/format', BIDI], ['ofctl special', SPECIALS]];
      return classes.flatMap(([cls, chars]) => chars.flatMap((c) => [base.slice(0, 3) + c + base.slice(3), base + c].map((value) => ({ cls, value }))));
    };
    for (const p of POSITIONS) {
      const inputs = [...sweep(p), ...Array.from({ length: PER_POSITION }, () => (p.kind === 'number' ? g.number(p.min!, p.max!) : g.text(p.kind)))];
      for (const input of inputs) {
        const mustAccept =
          p.kind === 'number'
            ? validNumber(input.value, p.min!, p.max!) && (p.valid?.(BigInt(input.value)) ?? true)
            : validText(p.kind, input.value);
        if (input.cls === 'valid' && !mustAccept) input.cls = 'unsafe or masked-out integer';
        const what = `${p.name} ${typeof input.value === 'string' ? JSON.stringify(input.value) : String(input.value)} (${input.cls})`;
        let line: string;
        try {
          line = renderFlow(p.build(input.value));
        } catch (e) {
          if (!(e instanceof UnsafeValueError)) throw new Error(`${what}: threw ${String(e)} instead of UnsafeValueError`);
          assert.ok(!mustAccept, `${what}: a valid value was refused: ${e.message}`);
          count(input.cls, false);
          continue;
        }
        assert.ok(mustAccept, `${what}: rendered although it is not a valid value: ${line}`);
        assert.ok(!/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\s]/u.test(line), `${what}: the line holds a control or space: ${JSON.stringify(line)}`);
        accepted.push({ position: p.name, value: input.value, line, expected: p.expected(input.value) });
        count(input.cls, true);
      }
    }
    const parsed = await parseFlows(dir, accepted.map((a) => `${a.line}\n`).join(''));
    assert.equal(parsed.length, accepted.length, 'ovs-ofctl read as many flows as there are lines');
    accepted.forEach((a, i) => {
      assert.deepEqual(parseOutput(parsed[i]!), a.expected, `${a.position} ${String(a.value)}: ${a.line}\n  ovs-ofctl: ${parsed[i]}`);
    });
    const table = [...counts.entries()].sort().map(([cls, c]) => `${cls}: ${c.refused} refused, ${c.accepted} accepted`);
    const total = [...counts.values()].reduce((n, c) => n + c.refused + c.accepted, 0);
    console.log(`      ${POSITIONS.length} positions, ${total} inputs; ${accepted.length} flows parsed back by ovs-ofctl\n      ${table.join('\n      ')}`);
    // Every class that carries a character outside every field's shape was refused whole (an
    // injection may be valid: a bare address with "/32" appended is a prefix).
    for (const cls of ['C0', 'DEL', 'C1', 'unicode space', 'bidi/format'] as const) {
      assert.equal(counts.get(cls)?.accepted ?? 0, 0, `${cls} inputs accepted`);
      assert.ok((counts.get(cls)?.refused ?? 0) > 0, `no ${cls} input was tried`);
    }
    assert.ok((counts.get('valid')?.accepted ?? 0) > POSITIONS.length * 50, 'too few valid inputs to test acceptance');
  });

  it('property: the pipeline renders a pod or gateway MAC only when ovs-ofctl reads back the same flows with it', async () => {
    const g = new Gen(SEED ^ 0x5eed);
    const REF = '02:00:00:00:00:01';
    const node = { vni: 7, tunnelPort: 32768, gatewayPort: 32769, gatewayIP: IPAddr.parse('10.244.1.1'), gatewayMAC: macFromIP(IPAddr.parse('10.244.1.1')) };
    const pod = { ofport: 3, ip: IPAddr.parse('10.244.1.2'), mac: REF };
    const cases = [
      { name: 'pod MAC', text: (mac: string) => renderPipeline(podFlows(2, node, { ...pod, mac })) },
      { name: 'gateway MAC', text: (mac: string) => renderPipeline(pipelineFlows(2, { ...node, gatewayMAC: mac })) },
    ];
    for (const c of cases) {
      const reference = (await parseFlows(dir, c.text(REF))).map((l) => l.replace(/\(xid=0x[0-9a-f]+\)/, ''));
      let accepted = 0;
      for (let i = 0; i < 300; i++) {
        const { value } = g.text('mac');
        const mac = String(value);
        let text: string;
        try {
          text = c.text(mac);
        } catch (e) {
          assert.ok(e instanceof UnsafeValueError, String(e));
          assert.ok(!validText('mac', mac), `${c.name} ${JSON.stringify(mac)} refused: ${e.message}`);
          continue;
        }
        assert.ok(validText('mac', mac), `${c.name} ${JSON.stringify(mac)} rendered: ${text}`);
        const got = (await parseFlows(dir, text)).map((l) => l.replace(/\(xid=0x[0-9a-f]+\)/, ''));
        assert.deepEqual(got, reference.map((l) => l.split(REF).join(mac)), `${c.name} ${mac}`);
        accepted++;
      }
      assert.ok(accepted > 20, `${c.name}: only ${accepted} valid MACs tried`);
    }
  });
});
