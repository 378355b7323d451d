// src/policy/ovs/matches.ts: OpenFlow has no ranges, so an interval becomes aligned prefixes and a
// port range masked tp_dst values. rangeToPrefixes must cover [first, last] exactly (every value
// once, nothing outside) with the fewest aligned blocks — checked exhaustively for small widths
// against a brute-force count, and on random ranges of 16 and 32 bits. The seed is printed;
// WEFT_FUZZ_SEED=<n> repeats a run.
import assert from 'node:assert/strict';

import { intervalPrefixes, isV4, peerMatch, peerPortMatch, podMatch, portMatches, rangeToPrefixes } from '../../src/policy/ovs/matches.js';
import { renderMatch } from '../../src/render/ofctl.js';
import { IPAddr } from '../../src/util/ip.js';
import { prng } from '../helpers/prng.js';

const SEED = Number(process.env['WEFT_FUZZ_SEED'] ?? Date.now() % 0x100000000);

/** Checks that `blocks` are aligned, ascending, disjoint and cover exactly [first, last]. */
function assertExactCover(blocks: ReadonlyArray<{ value: bigint; hostBits: number }>, first: bigint, last: bigint, bits: number, what: string): void {
  let next = first;
  for (const b of blocks) {
    assert.ok(b.hostBits >= 0 && b.hostBits <= bits, `${what}: hostBits ${b.hostBits}`);
    const size = 1n << BigInt(b.hostBits);
    assert.equal(b.value % size, 0n, `${what}: block ${b.value}/${b.hostBits} is not aligned`);
    assert.equal(b.value, next, `${what}: block starts at ${b.value}, expected ${next} (gap or overlap)`);
    next = b.value + size;
  }
  assert.equal(next, last + 1n, `${what}: cover ends at ${next - 1n}, expected ${last}`);
}

/** The fewest aligned blocks for [first, last], by the greedy-is-optimal argument checked by brute force (small widths). */
function fewestBlocks(first: number, last: number, bits: number): number {
  // Dynamic programming over the range: best[i] = fewest blocks covering [first, first + i).
  const n = last - first + 1;
  const best = new Array<number>(n + 1).fill(Infinity);
  best[0] = 0;
  for (let i = 0; i < n; i++) {
    if (best[i] === Infinity) continue;
    const at = first + i;
    for (let h = 0; h <= bits; h++) {
      const size = 1 << h;
      if (at % size !== 0 || i + size > n) break;
      best[i + size] = Math.min(best[i + size]!, best[i]! + 1);
    }
  }
  return best[n]!;
}

describe('NetworkPolicy OVS matches (src/policy/ovs/matches.ts)', () => {
  it('rangeToPrefixes: every range of 1..6-bit spaces, exactly and with the fewest blocks', () => {
    for (let bits = 1; bits <= 6; bits++) {
      const top = (1 << bits) - 1;
      for (let first = 0; first <= top; first++) {
        for (let last = first; last <= top; last++) {
          const what = `[${first}, ${last}] of ${bits} bits`;
          const blocks = rangeToPrefixes(BigInt(first), BigInt(last), bits);
          assertExactCover(blocks, BigInt(first), BigInt(last), bits, what);
          assert.equal(blocks.length, fewestBlocks(first, last, bits), `${what}: ${blocks.length} blocks`);
        }
      }
    }
  });

  it(`rangeToPrefixes: random 16- and 32-bit ranges are covered exactly, in at most 2·bits−2 blocks (seed ${SEED})`, () => {
    const r = prng(SEED);
    const rand = (bits: number) => BigInt(Math.floor(r() * 2 ** bits));
    for (const bits of [16, 32]) {
      const top = (1n << BigInt(bits)) - 1n;
      const edges = [0n, 1n, top - 1n, top, 1n << BigInt(bits - 1), (1n << BigInt(bits - 1)) - 1n];
      for (let i = 0; i < 2000; i++) {
        let a = i < edges.length ** 2 ? edges[i % edges.length]! : rand(bits);
        let b = i < edges.length ** 2 ? edges[Math.floor(i / edges.length)]! : r() < 0.3 ? a + rand(8) : rand(bits);
        if (b > top) b = top;
        if (a > b) [a, b] = [b, a];
        const blocks = rangeToPrefixes(a, b, bits);
        const what = `[${a}, ${b}] of ${bits} bits (seed ${SEED})`;
        assertExactCover(blocks, a, b, bits, what);
        assert.ok(blocks.length <= Math.max(1, 2 * bits - 2), `${what}: ${blocks.length} blocks`);
      }
      assert.deepEqual(rangeToPrefixes(0n, top, bits), [{ value: 0n, hostBits: bits }]);
    }
  });

  it('portMatches: a single port, an aligned range, a ragged range, and the whole range of a protocol', () => {
    const text = (ms: ReturnType<typeof portMatches>) => ms.map((m) => m.map(renderMatch).join(','));
    assert.deepEqual(text(portMatches({ protocol: 'TCP', first: 80, last: 80 })), ['tcp,tp_dst=80']);
    assert.deepEqual(text(portMatches({ protocol: 'UDP', first: 0x50, last: 0x5f })), ['udp,tp_dst=0x50/0xfff0']);
    assert.deepEqual(text(portMatches({ protocol: 'UDP', first: 8000, last: 8010 })), ['udp,tp_dst=0x1f40/0xfff8', 'udp,tp_dst=0x1f48/0xfffe', 'udp,tp_dst=8010']);
    assert.deepEqual(text(portMatches({ protocol: 'SCTP', first: 0, last: 65535 })), ['sctp']);
    assert.deepEqual(text(portMatches({ protocol: 'TCP', first: 1, last: 65535 })), [
      'tcp,tp_dst=1',
      'tcp,tp_dst=0x2/0xfffe',
      'tcp,tp_dst=0x4/0xfffc',
      'tcp,tp_dst=0x8/0xfff8',
      'tcp,tp_dst=0x10/0xfff0',
      'tcp,tp_dst=0x20/0xffe0',
      'tcp,tp_dst=0x40/0xffc0',
      'tcp,tp_dst=0x80/0xff80',
      'tcp,tp_dst=0x100/0xff00',
      'tcp,tp_dst=0x200/0xfe00',
      'tcp,tp_dst=0x400/0xfc00',
      'tcp,tp_dst=0x800/0xf800',
      'tcp,tp_dst=0x1000/0xf000',
      'tcp,tp_dst=0x2000/0xe000',
      'tcp,tp_dst=0x4000/0xc000',
      'tcp,tp_dst=0x8000/0x8000',
    ]);
    // The matches of a range accept exactly its ports.
    for (const [first, last] of [[8000, 8010], [1, 1023], [1024, 65535], [53, 53], [0, 0], [65535, 65535], [32767, 32768]] as const) {
      const ms = portMatches({ protocol: 'TCP', first, last });
      for (let port = 0; port <= 65535; port++) {
        const hit = ms.some((m) => m.every((x) => x.field === 'tcp' || (x.field === 'tp_dst' && 'value' in x && (port & Number(x.mask ?? 0xffff)) === Number(x.value))));
        if (hit !== (port >= first && port <= last)) assert.fail(`[${first}, ${last}]: port ${port} ${hit ? 'matched' : 'missed'}`);
      }
    }
  });

  it("intervalPrefixes: 0.0.0.0/0 is '' (no address field), /32 a plain address, IPv6 nothing", () => {
    const iv = (a: string, b: string) => ({ family: 4 as const, first: IPAddr.parse(a).value, last: IPAddr.parse(b).value });
    assert.deepEqual(intervalPrefixes(iv('0.0.0.0', '255.255.255.255')), ['']);
    assert.deepEqual(intervalPrefixes(iv('10.1.2.3', '10.1.2.3')), ['10.1.2.3']);
    assert.deepEqual(intervalPrefixes(iv('10.0.0.0', '10.255.255.255')), ['10.0.0.0/8']);
    // 10.0.0.0/8 except 10.88.0.4/32: everything around the hole.
    const holed = [...intervalPrefixes(iv('10.0.0.0', '10.88.0.3')), ...intervalPrefixes(iv('10.88.0.5', '10.255.255.255'))];
    assert.ok(holed.includes('10.88.0.5') && holed.includes('10.88.0.0/30') && holed.includes('10.128.0.0/9'), holed.join(' '));
    // 0.0.0.0/0 except 10.0.0.0/8, as the two intervals carve() makes of it.
    const outside = [...intervalPrefixes(iv('0.0.0.0', '9.255.255.255')), ...intervalPrefixes(iv('11.0.0.0', '255.255.255.255'))];
    assert.deepEqual(outside, ['0.0.0.0/5', '8.0.0.0/7', '11.0.0.0/8', '12.0.0.0/6', '16.0.0.0/4', '32.0.0.0/3', '64.0.0.0/2', '128.0.0.0/1']);
    // Every prefix renders as an nw_src/nw_dst value ovs-ofctl takes as it is.
    for (const p of [...holed, ...outside]) assert.equal(renderMatch({ field: 'nw_src', value: p }), `nw_src=${p}`);
    assert.deepEqual(intervalPrefixes({ family: 6, first: 0n, last: (1n << 128n) - 1n }), []);
  });

  it('pod, peer and named-port matches by direction', () => {
    const text = (ms: ReturnType<typeof podMatch>) => ms.map(renderMatch).join(',');
    assert.equal(text(podMatch('egress', '10.88.0.2')), 'ip,nw_src=10.88.0.2');
    assert.equal(text(podMatch('ingress', '10.88.0.2')), 'ip,nw_dst=10.88.0.2');
    assert.equal(text(peerMatch('egress', '10.0.0.0/8')), 'ip,nw_dst=10.0.0.0/8');
    assert.equal(text(peerMatch('ingress', '10.88.0.3')), 'ip,nw_src=10.88.0.3');
    assert.equal(text(peerMatch('ingress', '')), 'ip');
    assert.equal(text(peerPortMatch({ ip: '10.88.0.3', protocol: 'UDP', port: 53 })), 'udp,nw_dst=10.88.0.3,tp_dst=53');
    assert.deepEqual(['10.1.2.3', 'fd00::1', '10.1.2', '::ffff:10.1.2.3'].map(isV4), [true, false, false, false]);
  });
});
