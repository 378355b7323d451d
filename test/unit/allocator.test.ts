import assert from 'node:assert/strict';
import {
  allocateSubnet,
  candidateCount,
  cryptoRandomBelow,
  freeCount,
  inRange,
  type AllocationRange,
  type RandomBelow,
} from '../../src/subnet/allocator.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { prng } from '../helpers/prng.js';

function range(min: string, max: string): AllocationRange {
  return { min: IPNet.parse(min), max: IPNet.parse(max) };
}
const nets = (...xs: string[]): IPNet[] => xs.map((x) => IPNet.parse(x));

const FIRST: RandomBelow = () => 0n;
const LAST: RandomBelow = (n) => n - 1n;

/** A random that always answers `r` and records every bound it was asked for. */
function fixed(r: bigint): RandomBelow & { asked: bigint[] } {
  const asked: bigint[] = [];
  const f = (n: bigint): bigint => {
    asked.push(n);
    assert.ok(r < n, `test asked for index ${r} of ${n}`);
    return r;
  };
  return Object.assign(f, { asked });
}

function alloc(r: AllocationRange, taken: IPNet[], random: RandomBelow): string | null {
  return allocateSubnet(r, taken, random)?.toString() ?? null;
}

/** Every candidate of a (small) range, by brute force. */
function candidates(r: AllocationRange): IPNet[] {
  const out: IPNet[] = [];
  for (let v = r.min.first; v <= r.max.first; v += r.min.size) out.push(IPNet.of(IPAddr.of(r.min.family, v), r.min.prefix));
  return out;
}


// flannel's defaults for Network 10.5.0.0/16, SubnetLen 24: SubnetMin 10.5.1.0, SubnetMax 10.5.255.0.
const R24 = range('10.5.1.0/24', '10.5.255.0/24');

describe('allocateSubnet', () => {
  it('with nothing taken, maps the random index onto the candidates in address order', () => {
    assert.equal(candidateCount(R24), 255n);
    assert.equal(freeCount(R24, []), 255n);
    assert.equal(alloc(R24, [], FIRST), '10.5.1.0/24');
    assert.equal(alloc(R24, [], LAST), '10.5.255.0/24');
    const r = fixed(99n);
    assert.equal(alloc(R24, [], r), '10.5.100.0/24');
    assert.deepEqual(r.asked, [255n], 'random is asked for an index below the free count, once');
  });

  it('returns null when every candidate is taken, without asking for a random number', () => {
    const taken = candidates(R24);
    assert.equal(freeCount(R24, taken), 0n);
    const r = fixed(0n);
    assert.equal(allocateSubnet(R24, taken, r), null);
    assert.deepEqual(r.asked, []);
    assert.equal(allocateSubnet(R24, nets('10.5.0.0/16'), r), null, 'one covering prefix');
    assert.equal(allocateSubnet(R24, nets('0.0.0.0/0'), r), null, 'the whole address space');
    assert.deepEqual(r.asked, []);
  });

  it('SubnetMin = SubnetMax: one candidate, free or taken', () => {
    const one = range('10.5.7.0/24', '10.5.7.0/24');
    assert.equal(candidateCount(one), 1n);
    const r = fixed(0n);
    assert.equal(alloc(one, [], r), '10.5.7.0/24');
    assert.deepEqual(r.asked, [1n]);
    assert.equal(alloc(one, nets('10.5.6.0/24', '10.5.8.0/24'), FIRST), '10.5.7.0/24');
    assert.equal(alloc(one, nets('10.5.7.0/24'), FIRST), null);
    assert.equal(alloc(one, nets('10.5.7.128/25'), FIRST), null);
    assert.equal(freeCount(one, nets('10.5.7.0/24')), 0n);
  });

  it('an empty range (max below min) has no candidates', () => {
    const empty = range('10.5.9.0/24', '10.5.8.0/24');
    assert.equal(candidateCount(empty), 0n);
    assert.equal(freeCount(empty, []), 0n);
    assert.equal(alloc(empty, [], FIRST), null);
  });

  it('a taken prefix shorter than the subnet length takes every candidate it covers', () => {
    const r = range('10.5.0.0/24', '10.5.255.0/24');
    const taken = nets('10.5.0.0/20'); // 10.5.0.0 .. 10.5.15.0
    assert.equal(freeCount(r, taken), 256n - 16n);
    assert.equal(alloc(r, taken, FIRST), '10.5.16.0/24');
    assert.equal(alloc(r, taken, LAST), '10.5.255.0/24');
    assert.equal(alloc(range('10.5.0.0/24', '10.5.15.0/24'), taken, FIRST), null);
    // In the middle: indexes 0..31 free, 32..47 taken.
    const mid = nets('10.5.32.0/20');
    assert.equal(alloc(r, mid, fixed(31n)), '10.5.31.0/24');
    assert.equal(alloc(r, mid, fixed(32n)), '10.5.48.0/24');
  });

  it('a taken prefix longer than the subnet length takes the candidate that contains it', () => {
    const r = range('10.5.0.0/24', '10.5.3.0/24');
    assert.equal(freeCount(r, nets('10.5.0.64/26')), 3n);
    assert.equal(alloc(r, nets('10.5.0.64/26'), FIRST), '10.5.1.0/24');
    assert.equal(alloc(r, nets('10.5.3.255/32'), LAST), '10.5.2.0/24');
    assert.equal(alloc(r, nets('10.5.0.0/32', '10.5.1.128/25', '10.5.2.4/30', '10.5.3.0/26'), FIRST), null);
  });

  it('taken prefixes that straddle the ends of the range take only the candidates they overlap', () => {
    // 10.5.0.0/23 covers 10.5.0.0 (outside) and 10.5.1.0 (the first candidate).
    assert.equal(freeCount(R24, nets('10.5.0.0/23')), 254n);
    assert.equal(alloc(R24, nets('10.5.0.0/23'), FIRST), '10.5.2.0/24');
    // 10.5.254.0/23 covers the last two candidates; 10.4.0.0/15 covers 10.4.0.0 .. 10.5.255.255.
    assert.equal(alloc(R24, nets('10.5.254.0/23'), LAST), '10.5.253.0/24');
    const small = range('10.5.1.0/24', '10.5.2.0/24');
    assert.equal(alloc(small, nets('10.4.0.0/15'), FIRST), null);
    assert.equal(alloc(small, nets('10.5.2.0/23'), FIRST), '10.5.1.0/24');
  });

  it('ignores taken prefixes outside the range and of the other family', () => {
    const outside = nets('10.4.255.0/24', '10.5.0.0/24', '10.6.0.0/24', '10.6.0.0/16', '192.168.0.0/16', '10.5.0.255/32');
    assert.equal(freeCount(R24, outside), 255n);
    assert.equal(alloc(R24, outside, FIRST), '10.5.1.0/24');
    assert.equal(alloc(R24, outside, LAST), '10.5.255.0/24');
    // ::a05:100/120 has the numeric value of 10.5.1.0/24 but is IPv6; ::/0 covers all of IPv6.
    const otherFamily = nets('::a05:100/120', '::/0');
    assert.equal(freeCount(R24, otherFamily), 255n);
    assert.equal(alloc(R24, otherFamily, FIRST), '10.5.1.0/24');
    const r6 = range('fd00::/64', 'fd00:0:0:ff::/64');
    assert.equal(freeCount(r6, nets('0.0.0.0/0')), 256n);
  });

  it('merges overlapping, duplicate and adjacent taken prefixes', () => {
    const taken = nets('10.5.1.0/24', '10.5.1.0/24', '10.5.2.0/23', '10.5.2.0/24', '10.5.4.0/24', '10.5.1.128/25', '10.5.5.0/24');
    assert.equal(freeCount(R24, taken), 255n - 5n);
    assert.equal(alloc(R24, taken, FIRST), '10.5.6.0/24');
    // Order of the taken list does not matter.
    assert.equal(alloc(R24, [...taken].reverse(), FIRST), '10.5.6.0/24');
  });

  it('IPv6: a /64 out of a /48 has 65536 candidates', () => {
    const r6 = range('fd00:5::/64', 'fd00:5:0:ffff::/64');
    assert.equal(candidateCount(r6), 65536n);
    assert.equal(alloc(r6, [], FIRST), 'fd00:5::/64');
    assert.equal(alloc(r6, [], LAST), 'fd00:5:0:ffff::/64');
    assert.equal(alloc(r6, [], fixed(0x1234n)), 'fd00:5:0:1234::/64');
    const half = nets('fd00:5::/49');
    assert.equal(freeCount(r6, half), 32768n);
    assert.equal(alloc(r6, half, FIRST), 'fd00:5:0:8000::/64');
    assert.equal(alloc(r6, nets('fd00:5:0:1::1/128'), fixed(1n)), 'fd00:5:0:2::/64');
    assert.equal(alloc(r6, nets('fd00::/16'), FIRST), null);
  });

  it('IPv6: a /64 out of a /32 (2^32 candidates) costs nothing extra', () => {
    const r6 = range('fd00:5::/64', 'fd00:5:ffff:ffff::/64');
    assert.equal(candidateCount(r6), 1n << 32n);
    assert.equal(freeCount(r6, nets('fd00:5::/33')), 1n << 31n);
    assert.equal(alloc(r6, nets('fd00:5::/33'), FIRST), 'fd00:5:8000::/64');
    assert.equal(alloc(r6, [], LAST), 'fd00:5:ffff:ffff::/64');
  });

  it('is uniform: enumerating every random index yields every free subnet exactly once (random layouts)', () => {
    const rnd = prng(42);
    for (let round = 0; round < 40; round++) {
      // 64 candidate /26s in 10.9.0.0/20, with 0..30 taken prefixes of mixed lengths, some outside.
      const r = range('10.9.0.0/26', '10.9.15.192/26');
      const taken: IPNet[] = [];
      for (let i = Math.floor(rnd() * 31); i > 0; i--) {
        const len = 18 + Math.floor(rnd() * 15); // /18 .. /32
        const addr = 0x0a08f000n + BigInt(Math.floor(rnd() * 0x2000)); // 10.8.240.0 .. 10.9.15.255 + some
        taken.push(IPNet.of(IPAddr.of(4, addr), len));
      }
      const all = candidates(r);
      assert.equal(all.length, 64);
      const free = all.filter((c) => !taken.some((t) => t.overlaps(c))).map(String);
      assert.equal(freeCount(r, taken), BigInt(free.length), `round ${round}`);
      const got: string[] = [];
      for (let i = 0n; i < BigInt(free.length); i++) {
        const s = allocateSubnet(r, taken, fixed(i));
        assert.ok(s, `round ${round}: index ${i} gave null`);
        assert.ok(inRange(r, s), `round ${round}: ${s} not in range`);
        assert.ok(!taken.some((t) => t.overlaps(s)), `round ${round}: ${s} overlaps a taken prefix`);
        got.push(s.toString());
      }
      assert.deepEqual(got, free, `round ${round}: index i gives the i-th free subnet`);
      if (free.length === 0) assert.equal(allocateSubnet(r, taken, FIRST), null);
    }
  });

  it('performance smoke: 65536 candidates with 5000 taken', () => {
    const rnd = prng(7);
    const r = range('fd00:5::/64', 'fd00:5:0:ffff::/64');
    const taken: IPNet[] = [];
    const takenIdx = new Set<number>();
    while (taken.length < 5000) {
      const idx = Math.floor(rnd() * 65536);
      if (takenIdx.has(idx)) continue;
      takenIdx.add(idx);
      taken.push(IPNet.of(IPAddr.of(6, r.min.first + BigInt(idx) * r.min.size), 64));
    }
    assert.equal(freeCount(r, taken), 65536n - 5000n);
    for (const pickIdx of [0n, 1000n, 60535n]) {
      const s = allocateSubnet(r, taken, fixed(pickIdx));
      assert.ok(s);
      assert.ok(inRange(r, s));
      const idx = Number((s.first - r.min.first) / r.min.size);
      assert.ok(!takenIdx.has(idx), `${s} is taken`);
    }
    const s = allocateSubnet(r, taken);
    assert.ok(s && inRange(r, s) && !takenIdx.has(Number((s.first - r.min.first) / r.min.size)), String(s));
  });

  it('with the default crypto random, returns a free candidate', () => {
    const taken = candidates(R24).filter((_, i) => i !== 77);
    for (let i = 0; i < 5; i++) assert.equal(allocateSubnet(R24, taken)?.toString(), '10.5.78.0/24');
  });
});

describe('inRange', () => {
  it('accepts exactly the aligned candidates of the right length between min and max', () => {
    assert.ok(inRange(R24, IPNet.parse('10.5.1.0/24')));
    assert.ok(inRange(R24, IPNet.parse('10.5.255.0/24')));
    assert.ok(inRange(R24, IPNet.parse('10.5.100.0/24')));
    assert.ok(!inRange(R24, IPNet.parse('10.5.0.0/24')), 'below SubnetMin');
    assert.ok(!inRange(R24, IPNet.parse('10.6.0.0/24')), 'above SubnetMax');
    assert.ok(!inRange(R24, IPNet.parse('10.5.100.0/25')), 'wrong length');
    assert.ok(!inRange(R24, IPNet.parse('10.5.0.0/16')), 'wrong length');
    assert.ok(!inRange(R24, IPNet.parse('::a05:6400/120')), 'wrong family');
    const r6 = range('fd00:5::/64', 'fd00:5:0:ffff::/64');
    assert.ok(inRange(r6, IPNet.parse('fd00:5:0:ffff::/64')));
    assert.ok(!inRange(r6, IPNet.parse('fd00:5:1::/64')));
  });
});

describe('cryptoRandomBelow', () => {
  it('returns values in [0, n) and covers small ranges', () => {
    const seen = new Set<bigint>();
    for (let i = 0; i < 300; i++) {
      const v = cryptoRandomBelow(3n);
      assert.ok(v >= 0n && v < 3n, String(v));
      seen.add(v);
    }
    assert.deepEqual([...seen].sort(), [0n, 1n, 2n]);
    assert.equal(cryptoRandomBelow(1n), 0n);
    const big = 1n << 100n;
    for (let i = 0; i < 50; i++) {
      const v = cryptoRandomBelow(big);
      assert.ok(v >= 0n && v < big);
    }
  });

  it('rejects a non-positive bound', () => {
    assert.throws(() => cryptoRandomBelow(0n), RangeError);
    assert.throws(() => cryptoRandomBelow(-1n), RangeError);
  });
});
