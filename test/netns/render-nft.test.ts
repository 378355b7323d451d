// src/render/nft.ts against the real nft, inside the private network namespace that
// test/netns/setup.ts insists on. Property, per boundary: every value is either refused with
// UnsafeValueError naming the field and the value, or rendered into a script that nft reads back
// as exactly the intended object —
//   names:    `add chain ip wfz <name>` → `nft -j list table` has exactly those chains;
//   comments: `add rule … counter comment <quoted>` → each rule's comment is the input;
//   words:    `add rule ip wfz c iifname <word> counter` → nft applies the command or refuses the
//             transaction, and nothing else in the ruleset changes (a canary table survives).
// Inputs: every C0/C1 control and DEL, Unicode spaces, each of nft's special characters, keywords
// and limit lengths, plus random words. The seed is printed; WEFT_FUZZ_SEED=<n> repeats a run.
import assert from 'node:assert/strict';

import { NFT_SPECIAL, nft, nftComment, nftName, nftScript, nftWord, type NftPart, type NftScript } from '../../src/render/nft.js';
import { execProgram } from '../../src/util/exec.js';
import { attempt, FuzzGen, fuzzSeed, Tally, type FuzzInput } from '../helpers/render-fuzz.js';
import { assertPrivateNetns } from './setup.js';

const SEED = fuzzSeed();
const TABLE = 'wfz';
const CANARY = 'wfzcanary';

async function run(script: NftScript): Promise<{ code: number; stderr: string }> {
  const r = await execProgram('nft', ['-f', '-'], { input: script });
  return { code: r.code, stderr: r.stderr };
}

async function listJson(...what: string[]): Promise<Record<string, unknown>[]> {
  const r = await execProgram('nft', ['-j', 'list', ...what]);
  assert.equal(r.code, 0, `nft -j list ${what.join(' ')}: ${r.stderr}`);
  return (JSON.parse(r.stdout) as { nftables: Record<string, unknown>[] }).nftables;
}

/** The canary table (made in `before`) is still there with its one rule: no injected command removed it. */
async function assertCanary(): Promise<void> {
  const rules = (await listJson('table', 'inet', CANARY)).filter((o) => o['rule']);
  assert.deepEqual(
    rules.map((o) => (o['rule'] as { comment?: string }).comment),
    ['canary'],
  );
}

/** The accepted values nft refused one by one: the culprits of a failed batch. */
async function culprits(values: readonly string[], script: (v: string) => NftScript): Promise<string[]> {
  const bad: string[] = [];
  for (const v of values) if ((await run(script(v))).code !== 0) bad.push(v);
  return bad;
}

const fresh = [nft`add table ip ${TABLE}`, nft`delete table ip ${TABLE}`, nft`add table ip ${TABLE}`];

describe(`nft renderer against nft (seed ${SEED})`, function () {
  this.timeout(300_000);
  const gen = new FuzzGen(SEED);
  const specials = [...NFT_SPECIAL];
  const tallies: [string, Tally][] = [];

  before(async () => {
    assertPrivateNetns();
    console.log(`      nft render fuzz seed ${SEED} (repeat with WEFT_FUZZ_SEED=${SEED})`);
    const canary = nftScript([
      nft`add table inet ${CANARY}`,
      nft`add chain inet ${CANARY} k`,
      nft`add rule inet ${CANARY} k counter comment ${nftComment('c', 'canary')}`,
    ]);
    assert.equal((await run(canary)).code, 0);
  });

  after(async () => {
    console.log(`      nft render fuzz (seed ${SEED}): ${tallies.map(([b, t]) => `${b} ${t.total()} [${t.toString()}]`).join(' | ')}`);
    await execProgram('nft', ['delete', 'table', 'ip', TABLE]);
    await execProgram('nft', ['delete', 'table', 'inet', CANARY]);
  });

  it('names: refused, or a chain of exactly that name', async () => {
    const tally = new Tally();
    tallies.push(['names', tally]);
    const curated = [
      'meta',
      'ip',
      'table',
      'counter',
      'accept',
      'flush',
      'ruleset',
      'saddr',
      '.',
      '..',
      '_',
      'a/b',
      'x'.repeat(255),
      'x'.repeat(256),
      '-x',
      '1abc',
      'postrtg',
      'forward',
      'ACCEPT',
      '',
      // Well-formed injections: each would be a valid second command if it got through.
      `x;delete table inet ${CANARY};add chain ip ${TABLE} y`,
      `x\ndelete table inet ${CANARY}\nadd chain ip ${TABLE} y`,
      `x # comment`,
    ];
    const accepted = new Set<string>();
    for (const input of gen.inputs(specials, curated, 400)) {
      const r = attempt('nft', 'chain', input.value, () => nftName('chain', input.value));
      tally.add(input.cls, r ? 'accepted' : 'refused');
      if (r) accepted.add(input.value);
    }
    const script = (names: readonly string[]): NftScript => nftScript([...fresh, ...names.map((n) => nft`add chain ip ${TABLE} ${nftName('chain', n)}`)]);
    const r = await run(script([...accepted]));
    if (r.code !== 0) assert.fail(`nft refused accepted names ${JSON.stringify(await culprits([...accepted], (v) => script([v])))}: ${r.stderr}`);
    const listed = (await listJson('table', 'ip', TABLE)).flatMap((o) => (o['chain'] ? [(o['chain'] as { name: string }).name] : []));
    assert.deepEqual(new Set(listed), accepted);
    await assertCanary();
    assert.ok(accepted.size > 50 && tally.total('refused') > 100, tally.toString());
  });

  it('comments: refused, or read back verbatim', async () => {
    const tally = new Tally();
    tallies.push(['comments', tally]);
    const curated = [
      '',
      'x'.repeat(128),
      'x'.repeat(129),
      'é'.repeat(64),
      'é'.repeat(65),
      '"',
      'a "b" c',
      '\\',
      'trailing\\',
      ' leading and trailing ',
      'two  blanks',
      '#x',
      '; flush ruleset',
      '" ; flush ruleset ; "',
      '} ; delete table inet wfzcanary ; {',
      "it's $x @s {1}",
      `x" ; delete table inet ${CANARY} ; add rule ip ${TABLE} c counter comment "y`,
      `x"\ndelete table inet ${CANARY}\nadd rule ip ${TABLE} c counter comment "y`,
    ];
    const accepted: FuzzInput[] = [];
    for (const input of gen.inputs([...specials, ' '], curated, 400)) {
      const r = attempt('nft', 'comment', input.value, () => nftComment('comment', input.value));
      tally.add(input.cls, r ? 'accepted' : 'refused');
      if (r) accepted.push(input);
    }
    const ruleOf = (c: string): NftPart => nft`add rule ip ${TABLE} c counter comment ${nftComment('comment', c)}`;
    const script = (cs: readonly string[]): NftScript => nftScript([...fresh, nft`add chain ip ${TABLE} c`, ...cs.map(ruleOf)]);
    const values = accepted.map((a) => a.value);
    const r = await run(script(values));
    if (r.code !== 0) assert.fail(`nft refused accepted comments ${JSON.stringify(await culprits(values, (v) => script([v])))}: ${r.stderr}`);
    const comments = (await listJson('chain', 'ip', TABLE, 'c')).flatMap((o) => (o['rule'] ? [(o['rule'] as { comment?: string }).comment] : []));
    assert.deepEqual(comments, values);
    await assertCanary();
    assert.ok(values.length > 100 && tally.total('refused') > 50, tally.toString());
  });

  it('words: refused, or one command that nft applies or refuses whole; nothing else changes', async () => {
    const tally = new Tally();
    tallies.push(['words', tally]);
    const curated = [
      'eth0',
      'eth*',
      'x }',
      '{',
      '$v',
      '@set',
      '#',
      '"q"',
      "'q'",
      '\\',
      'accept',
      '!=',
      '1.2.3.4',
      '',
      // Well-formed injections: the rest of the line (" counter") completes the second command.
      `x;delete table inet ${CANARY};add rule ip ${TABLE} c`,
      `x\ndelete table inet ${CANARY}\nadd rule ip ${TABLE} c`,
      `x counter;delete table inet ${CANARY};add rule ip ${TABLE} c`,
      `x;flush ruleset #`,
    ];
    assert.equal((await run(nftScript([...fresh, nft`add chain ip ${TABLE} c`]))).code, 0);
    const others = async (): Promise<string> =>
      JSON.stringify((await listJson('ruleset')).filter((o) => !o['metainfo'] && !(o['rule'] && (o['rule'] as { table: string }).table === TABLE)));
    const before = await others();
    let rulesInC = 0;
    for (const input of gen.inputs(specials, curated, 300)) {
      const w = attempt('nft', 'word', input.value, () => nftWord('word', input.value));
      if (!w) {
        tally.add(input.cls, 'refused');
        continue;
      }
      const r = await run(nftScript([nft`flush chain ip ${TABLE} c`, nft`add rule ip ${TABLE} c iifname ${w} counter`]));
      if (r.code === 0) rulesInC = 1;
      tally.add(input.cls, r.code === 0 ? 'applied' : 'nft refused the transaction');
      const rules = (await listJson('chain', 'ip', TABLE, 'c')).filter((o) => o['rule']);
      assert.equal(rules.length, rulesInC, `after ${JSON.stringify(input.value)}`);
      assert.equal(await others(), before, `the ruleset outside ip ${TABLE} c changed after ${JSON.stringify(input.value)}`);
    }
    await assertCanary();
    assert.ok(tally.total('applied') > 30 && tally.total('refused') > 50, tally.toString());
  });
});
