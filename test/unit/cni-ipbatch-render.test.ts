// The ip -batch renderer (src/render/ipbatch.ts): exact lines from typed words, refusals with
// protocol, field and value; then a seeded property test against the real `ip -batch`, run by the
// plugins' own runner (cni-plugins/lib/ipbatch.ts) in namespaces made here: every word is either
// refused, or rendered into `link add name <word> type bridge` which ip reads back as exactly one
// link with exactly that name. The words carry every control character, Unicode spaces, each
// character of the batch syntax and, behind them, a second command that would create a link of
// its own. Rerun a failure with WEFT_FUZZ_SEED=<the seed printed>.
import assert from 'node:assert/strict';
import { UnsafeValueError } from '../../src/render/word.js';
import { batchText, ipLine, ipLineOf, IP_BATCH, MAX_LINE_WORDS, named, type IpLine } from '../../src/render/ipbatch.js';
import { ipBatch } from '../../cni-plugins/lib/ipbatch.js';
import { linksOf } from '../../cni-plugins/lib/ipjson.js';
import { NetnsHandle } from '../../cni-plugins/lib/netns.js';
import { addNetns, delNetns, nsPrefix } from '../helpers/netns.js';
import { prng } from '../helpers/prng.js';

function refused(fn: () => unknown, field: string, value: string, reason: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof UnsafeValueError, `not an UnsafeValueError: ${String(e)}`);
    assert.deepEqual([e.protocol, e.field, e.value], [IP_BATCH, field, value]);
    assert.match(e.reason, reason);
    return true;
  });
}

// ---- the specification the property is checked against (stated here, not imported) ----

/** C0 controls and DEL: what iproute2's reader and the kernel see as bytes 0x00–0x1f, 0x7f. */
const C0 = [...Array.from({ length: 0x20 }, (_, i) => String.fromCharCode(i)), '\x7f'];
const C1 = Array.from({ length: 0x20 }, (_, i) => String.fromCharCode(0x80 + i));
const UNICODE_SPACES = ['\u00a0', '\u1680', '\u180e', ...Array.from({ length: 12 }, (_, i) => String.fromCharCode(0x2000 + i)), '\u2028', '\u2029', '\u202f', '\u205f', '\u3000', '\ufeff'];
/** What makeargs/getcmdline read specially: word separators, quotes at a word's start, `#` anywhere, backslash-newline. */
const BATCH_SYNTAX = [' ', '\t', '\r', '\n', '#', '"', "'", '\\'];
// No "%": the kernel reads a new link's name with one as a template ("net%d" becomes "net0"), so
// ip is given the word but the link gets another name; interface names never carry one
// (src/util/names.ts ifNameProblem refuses it).
const SAFE = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@+=,!?$&*()[]{}<>|~^`;/:';
const NON_ASCII = ['é', 'ß', 'Ж', '中', '😀', '\u200e', 'à', '\ud800', '\udfff'];

/** The renderer must refuse exactly these words. */
function mustRefuse(w: string): boolean {
  if (w === '') return true;
  if (/\p{Cc}|\p{Cs}/u.test(w)) return true;
  if ([...UNICODE_SPACES, ...BATCH_SYNTAX].some((c) => w.includes(c))) return true;
  return false;
}

/** Names the kernel (dev_valid_name) and iproute2 (check_ifname) take for a new link in a fresh netns (which has lo). */
function kernelTakes(w: string): boolean {
  const bytes = Buffer.from(w, 'utf8');
  return bytes.length <= 15 && w !== '.' && w !== '..' && w !== 'lo' && !w.includes('/') && !w.includes(':') && !bytes.includes(0xa0);
}

// ---- unit ----

describe('ip -batch renderer', () => {
  it('renders words, numbers and named words into one line, single-spaced', () => {
    assert.equal(ipLine('link', 'add', 'name', named('bridge', 'cni0'), 'mtu', 1400, 'type', 'bridge'), 'link add name cni0 mtu 1400 type bridge');
    assert.equal(ipLineOf(['vlan', 'add', 'dev', 'veth1', 'vid', '5-7', 'master']), 'vlan add dev veth1 vid 5-7 master');
    assert.equal(ipLine('address', 'add', '10.1.0.5/24', 'brd', '+', 'dev', 'café'), 'address add 10.1.0.5/24 brd + dev café');
    assert.equal(batchText([ipLine('link', 'show'), ipLine('route', 'show')]), 'link show\nroute show\n');
    assert.equal(batchText([]), '');
  });

  it('refuses a word with the field it was in: named, or after the word before it', () => {
    refused(() => ipLine('link', 'set', 'dev', named('CNI_IFNAME', 'eth0\nlink add x type bridge'), 'up'), 'CNI_IFNAME', 'eth0\nlink add x type bridge', /control character/);
    refused(() => ipLine('link', 'show', 'dev', 'eth#0'), 'dev', 'eth#0', /"#"/);
    refused(() => ipLine('eth0 up'), 'word 1', 'eth0 up', /white space/);
    refused(() => ipLine('link', 'set', 'dev', 'x', 'mtu', Number.NaN), 'mtu', 'NaN', /finite/);
    refused(() => ipLine('link', 'set', 'dev', 'x', 'mtu', Infinity), 'mtu', 'Infinity', /finite/);
    refused(() => ipLine('link', 'show', 'dev', ''), 'dev', '', /empty/);
    refused(() => ipLine('link', 'show', 'dev', 'a\ud800'), 'dev', 'a\ud800', /surrogate/);
    refused(() => ipLine(), 'line', '', /no words/);
    refused(() => ipLineOf(Array.from({ length: MAX_LINE_WORDS + 1 }, () => 'x')), 'line', Array.from({ length: MAX_LINE_WORDS + 1 }, () => 'x').join(' '), /at most 99/);
    assert.equal(ipLineOf(Array.from({ length: MAX_LINE_WORDS }, () => 'x')).split(' ').length, MAX_LINE_WORDS);
  });

  it('refuses every control character, Unicode space and batch-syntax character, wherever it stands', () => {
    let n = 0;
    for (const c of [...C0, ...C1, ...UNICODE_SPACES, ...BATCH_SYNTAX]) {
      for (const w of [c, `${c}x`, `x${c}`, `x${c}y`]) {
        assert.throws(() => ipLine('link', 'show', 'dev', w), UnsafeValueError, JSON.stringify(w));
        n++;
      }
    }
    assert.equal(n, (C0.length + C1.length + UNICODE_SPACES.length + BATCH_SYNTAX.length) * 4);
  });
});

// ---- property, against the real ip -batch ----

interface Generated {
  readonly words: string[];
  /** Link names a word would add as a second command if it got through. */
  readonly injected: string[];
}

function generate(seed: number, count: number): Generated {
  const rnd = prng(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const hostile = [...C0, ...C1, ...UNICODE_SPACES, ...BATCH_SYNTAX];
  const words: string[] = [];
  const injected: string[] = [];
  const inject = (sep: string): string => {
    const name = `inj${injected.length}`;
    injected.push(name);
    return `${sep}link add name ${name} type bridge`;
  };
  // Each hostile character alone, leading, trailing, and carrying a second command.
  for (const c of hostile) words.push(c, `${c}a`, `a${c}`, `a${inject(c)}`);
  words.push('a\\\nlink add name inj-joined type bridge', '"a b"', "'a b'", 'a #link add', '');
  injected.push('inj-joined');
  // Random words over every class.
  const safeChars = [...SAFE];
  for (let i = 0; i < count; i++) {
    const len = 1 + Math.floor(rnd() * 10);
    let w = '';
    for (let j = 0; j < len; j++) {
      const r = rnd();
      w += r < 0.8 ? pick(safeChars) : r < 0.9 ? pick(NON_ASCII) : pick(hostile);
    }
    if (rnd() < 0.15) w += inject(pick(hostile));
    words.push(w);
  }
  return { words, injected };
}

function addLine(w: string): IpLine {
  return ipLine('link', 'add', 'name', named('name', w), 'type', 'bridge');
}

async function linkNames(ns: string): Promise<string[]> {
  const h = NetnsHandle.open(`/run/netns/${ns}`);
  try {
    const r = await ipBatch([ipLine('link', 'show')], { netns: h, json: true });
    return linksOf(r.docs).map((l) => l.ifname).sort();
  } finally {
    h.close();
  }
}

async function runIn(ns: string, lines: readonly IpLine[]): Promise<{ code: number; message: string }> {
  const h = NetnsHandle.open(`/run/netns/${ns}`);
  try {
    const r = await ipBatch(lines, { netns: h, force: true });
    return { code: r.code, message: r.message };
  } finally {
    h.close();
  }
}

describe('ip -batch renderer against the real ip (seeded property)', function () {
  this.timeout(120_000);
  const prefix = nsPrefix('ipb');
  const made: string[] = [];
  let seq = 0;
  const seed = Number(process.env.WEFT_FUZZ_SEED ?? Date.now() % 0x100000000);

  async function freshNs(): Promise<string> {
    const name = `${prefix}-${seq++}`;
    made.push(name);
    return addNetns(name);
  }

  before(function () {
    if (process.getuid?.() !== 0) this.skip(); // namespaces need root
    process.stdout.write(`      ipbatch property seed ${seed} (rerun with WEFT_FUZZ_SEED=${seed})\n`);
  });

  after(async () => {
    for (const ns of made) await delNetns(ns);
  });

  it('sees an injection when there is one: a line joined without the renderer adds the hidden link', async () => {
    const ns = await freshNs();
    const naive = ['link', 'add', 'name', 'a\nlink add name inj0 type bridge #', 'type', 'bridge'].join(' ') as IpLine;
    await runIn(ns, [naive]);
    assert.deepEqual(await linkNames(ns), ['inj0', 'lo']);
  });

  it('every word is refused, or read back by ip as exactly one link of exactly that name', async () => {
    const { words, injected } = generate(seed, 1200);
    const tag = `seed ${seed}`;
    const accepted: string[] = [];
    let refusedCount = 0;
    for (const w of words) {
      let line: IpLine | null = null;
      try {
        line = addLine(w);
      } catch (e) {
        assert.ok(e instanceof UnsafeValueError, `${tag}: ${JSON.stringify(w)} threw ${String(e)}`);
        assert.equal(e.value, w);
      }
      assert.equal(line === null, mustRefuse(w), `${tag}: ${JSON.stringify(w)} was ${line === null ? 'refused' : 'accepted'}`);
      if (line === null) refusedCount++;
      else {
        assert.equal(line, `link add name ${w} type bridge`, tag);
        accepted.push(w);
      }
    }
    const valid = [...new Set(accepted.filter(kernelTakes))];
    const invalid = [...new Set(accepted.filter((w) => !kernelTakes(w)))];
    assert.ok(refusedCount > 0 && valid.length > 50 && invalid.length > 0, `${tag}: generator covers all outcomes (${refusedCount}/${valid.length}/${invalid.length})`);

    const seen = new Set<string>();
    // What the kernel takes: one fresh netns per 60 names, each must be exactly there.
    for (let i = 0; i < valid.length; i += 60) {
      const chunk = valid.slice(i, i + 60);
      const ns = await freshNs();
      const r = await runIn(ns, chunk.map(addLine));
      assert.equal(r.code, 0, `${tag}: ip failed on ${JSON.stringify(chunk)}: ${r.message}`);
      const names = await linkNames(ns);
      names.forEach((n) => seen.add(n));
      assert.deepEqual(names, [...chunk, 'lo'].sort(), `${tag}: links for ${JSON.stringify(chunk)}`);
    }
    // What it does not: refused by ip or the kernel, one at a time, and nothing appears.
    const ns = await freshNs();
    for (const w of invalid) {
      const r = await runIn(ns, [addLine(w)]);
      assert.notEqual(r.code, 0, `${tag}: ${JSON.stringify(w)} was taken`);
      assert.deepEqual(await linkNames(ns), ['lo'], `${tag}: after ${JSON.stringify(w)}`);
    }
    // None of the hidden second commands ran.
    assert.deepEqual(injected.filter((n) => seen.has(n)), [], tag);
    process.stdout.write(`      ${words.length} words: ${refusedCount} refused, ${valid.length} created exactly, ${invalid.length} refused by ip/kernel with nothing created\n`);
  });
});
