// src/render/iptables.ts against the real iptables-restore / iptables-save, inside the private
// network namespace that test/netns/setup.ts insists on. Property, per boundary: every value is
// either refused with UnsafeValueError naming the field and the value, or rendered into a payload
// that iptables reads back as exactly the intended object —
//   chains:   `:NAME - [0:0]` → iptables-save lists exactly those user chains;
//   comments: `-A wfzc -m comment --comment <quoted> -j RETURN` → iptables-save prints the very
//             line that was rendered, and its comment argument is the input;
//   words:    `--comment <word>` unquoted → the comment read back is the word;
//   read-back specs: every line iptables-save printed above passes xtSavedSpec and `-D` with it
//             deletes exactly that rule.
// Inputs: every C0/C1 control and DEL, Unicode spaces, iptables-restore's special characters,
// verdict and target names and limit lengths, plus random words. The seed is printed;
// WEFT_FUZZ_SEED=<n> repeats a run.
import assert from 'node:assert/strict';

import {
  iptablesPayload,
  xt,
  xtAppend,
  xtChain,
  xtDeclare,
  xtDelete,
  xtQuote,
  xtSavedSpec,
  xtWord,
  type IptablesPayload,
  type XtLine,
} from '../../src/render/iptables.js';
import { LINE_SPECIAL } from '../../src/render/word.js';
import { execProgram } from '../../src/util/exec.js';
import { splitRuleArgs } from '../../src/util/rule-args.js';
import { attempt, FuzzGen, fuzzSeed, Tally } from '../helpers/render-fuzz.js';
import { assertPrivateNetns } from './setup.js';

const SEED = fuzzSeed();
const BUILTIN = new Set(['INPUT', 'FORWARD', 'OUTPUT']);

async function restore(payload: IptablesPayload): Promise<{ code: number; stderr: string }> {
  const r = await execProgram('iptables-restore', ['--noflush', '-w'], { input: payload });
  return { code: r.code, stderr: r.stderr };
}

async function save(): Promise<string[]> {
  const r = await execProgram('iptables-save', ['-t', 'filter']);
  assert.equal(r.code, 0, r.stderr);
  return r.stdout.split('\n');
}

async function reset(): Promise<void> {
  for (const args of [['-F'], ['-X']]) {
    const r = await execProgram('iptables', ['-w', '-t', 'filter', ...args]);
    assert.equal(r.code, 0, r.stderr);
  }
}

async function culprits(values: readonly string[], payload: (v: string) => IptablesPayload): Promise<string[]> {
  const bad: string[] = [];
  for (const v of values) {
    await reset();
    if ((await restore(payload(v))).code !== 0) bad.push(v);
  }
  return bad;
}

const commentOf = (line: string): string | null => {
  const args = splitRuleArgs(line);
  const i = args.indexOf('--comment');
  return i >= 0 && i + 1 < args.length ? args[i + 1]! : null;
};

describe(`iptables renderer against iptables-restore and iptables-save (seed ${SEED})`, function () {
  this.timeout(300_000);
  const gen = new FuzzGen(SEED);
  const specials = [...LINE_SPECIAL, '-', '!', ':', '*', '[', ']'];
  const tallies: [string, Tally][] = [];
  /** Every rule line iptables-save printed for the comment and word boundaries, for the read-back check. */
  const savedLines: string[] = [];

  before(async () => {
    assertPrivateNetns();
    console.log(`      iptables render fuzz seed ${SEED} (repeat with WEFT_FUZZ_SEED=${SEED})`);
    await reset();
  });

  after(async () => {
    console.log(`      iptables render fuzz (seed ${SEED}): ${tallies.map(([b, t]) => `${b} ${t.total()} [${t.toString()}]`).join(' | ')}`);
    await reset();
  });

  it('chain names: refused, or a chain of exactly that name', async () => {
    const tally = new Tally();
    tallies.push(['chains', tally]);
    const curated = [
      'ACCEPT',
      'DROP',
      'RETURN',
      'QUEUE',
      'MARK',
      'DNAT',
      'MASQUERADE',
      '-x',
      '!x',
      'x'.repeat(28),
      'x'.repeat(29),
      'é'.repeat(14),
      'é'.repeat(15),
      'FLANNEL-POSTRTG',
      'a;b',
      'COMMIT',
      '*nat',
      ':x',
      '[0:0]',
      '',
      // Well-formed injections: a second line that iptables-restore would run.
      'x - [0:0]\n-A INPUT -j DROP\n:y',
      'x - [0:0]\rCOMMIT',
    ];
    const accepted = new Set<string>();
    for (const input of gen.inputs(specials, curated, 400)) {
      const r = attempt('iptables-restore', 'chain', input.value, () => xtChain('chain', input.value));
      tally.add(input.cls, r ? 'accepted' : 'refused');
      if (r) accepted.add(input.value);
    }
    const payload = (names: readonly string[]): IptablesPayload => iptablesPayload('filter', names.map(xtDeclare));
    const r = await restore(payload([...accepted]));
    if (r.code !== 0) assert.fail(`iptables-restore refused accepted chain names ${JSON.stringify(await culprits([...accepted], (v) => payload([v])))}: ${r.stderr}`);
    const listed = (await save()).filter((l) => l.startsWith(':')).map((l) => l.slice(1).split(' ')[0]!);
    assert.deepEqual(new Set(listed.filter((c) => !BUILTIN.has(c))), accepted);
    assert.ok(accepted.size > 50 && tally.total('refused') > 100, tally.toString());
    await reset();
  });

  it('comments: refused, or iptables-save prints the rendered line and the comment is the input', async () => {
    const tally = new Tally();
    tallies.push(['comments', tally]);
    const curated = [
      '',
      'x'.repeat(255),
      'x'.repeat(256),
      'é'.repeat(127),
      'é'.repeat(128),
      '"',
      "'",
      '\\',
      'a "b" \\c',
      '-j ACCEPT',
      '" -j ACCEPT "',
      'COMMIT',
      '# x',
      'flanneld masq',
      'x" -j DROP -m comment --comment "y',
      'x -j RETURN\n-A INPUT -j DROP\n-A wfzc -m comment --comment y',
    ];
    const accepted: string[] = [];
    for (const input of gen.inputs([...specials, ' '], curated, 400)) {
      const r = attempt('iptables-restore', 'comment', input.value, () => xtQuote('comment', input.value));
      tally.add(input.cls, r ? 'accepted' : 'refused');
      if (r) accepted.push(input.value);
    }
    const line = (c: string): XtLine => xtAppend('wfzc', xt`-m comment --comment ${xtQuote('comment', c)} -j RETURN`);
    const payload = (cs: readonly string[]): IptablesPayload => iptablesPayload('filter', [xtDeclare('wfzc'), ...cs.map(line)]);
    const r = await restore(payload(accepted));
    if (r.code !== 0) assert.fail(`iptables-restore refused accepted comments ${JSON.stringify(await culprits(accepted, (v) => payload([v])))}: ${r.stderr}`);
    const printed = (await save()).filter((l) => l.startsWith('-A wfzc '));
    assert.deepEqual(printed, accepted.map((c) => line(c).line));
    assert.deepEqual(printed.map(commentOf), accepted);
    savedLines.push(...printed);
    assert.ok(accepted.length > 100 && tally.total('refused') > 50, tally.toString());
  });

  it('words: refused, or one argument (as an unquoted comment, read back as the word)', async () => {
    const tally = new Tally();
    tallies.push(['words', tally]);
    const curated = [
      'eth0',
      'eth+',
      '!',
      '-j',
      '--comment',
      'COMMIT',
      '*nat',
      ':x',
      '0x4000/0x4000',
      '10.0.0.0/8',
      '[fd00::1]:80',
      'a;b',
      '#',
      '"',
      "'",
      '\\',
      '',
      'x -j DROP -m comment --comment y',
      'x"y" -j DROP "',
      'x\n-A INPUT -j DROP\n-A wfzw -m comment --comment y',
    ];
    const accepted: string[] = [];
    for (const input of gen.inputs(specials, curated, 400)) {
      const r = attempt('iptables-restore', 'word', input.value, () => xtWord('word', input.value));
      tally.add(input.cls, r ? 'accepted' : 'refused');
      if (r) accepted.push(input.value);
    }
    const line = (w: string): XtLine => xtAppend('wfzw', xt`-m comment --comment ${xtWord('word', w)} -j RETURN`);
    const payload = (ws: readonly string[]): IptablesPayload => iptablesPayload('filter', [xtDeclare('wfzw'), ...ws.map(line)]);
    const r = await restore(payload(accepted));
    if (r.code !== 0) assert.fail(`iptables-restore refused accepted words ${JSON.stringify(await culprits(accepted, (v) => payload([v])))}: ${r.stderr}`);
    const printed = (await save()).filter((l) => l.startsWith('-A wfzw '));
    assert.deepEqual(printed.map(commentOf), accepted);
    savedLines.push(...printed);
    assert.ok(accepted.length > 100 && tally.total('refused') > 50, tally.toString());
  });

  it('read-back specs: every line iptables-save printed passes, and -D with it deletes exactly that rule', async () => {
    const tally = new Tally();
    tallies.push(['read-back specs', tally]);
    assert.ok(savedLines.length > 200, `only ${savedLines.length} lines to read back`);
    const dels = savedLines.map((l) => {
      const m = /^-A (\S+) (.*)$/.exec(l)!;
      tally.add('iptables-save line', 'accepted');
      return xtDelete(m[1]!, xtSavedSpec(m[2]!));
    });
    const r = await restore(iptablesPayload('filter', dels));
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      (await save()).filter((l) => l.startsWith('-A ')),
      [],
    );
  });
});
