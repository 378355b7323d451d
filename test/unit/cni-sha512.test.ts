import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';

import { randomBytesSync } from '../../cni-plugins/skel/random.js';
import { sha512, sha512Hex } from '../../cni-plugins/skel/sha512.js';

const reference = (data: string | Uint8Array): string => createHash('sha512').update(data).digest('hex');

describe('CNI skel: SHA-512 without node:crypto', () => {
  it('gives the FIPS 180-4 test vectors', () => {
    assert.equal(
      sha512Hex('abc'),
      'ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f',
    );
    assert.equal(
      sha512Hex(''),
      'cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e',
    );
  });

  it('matches node:crypto for every length around the block and padding boundaries', () => {
    // Deterministic bytes: lengths 0–300 cover 0, 1 and 2 extra blocks and the 111/112-byte padding edge.
    for (let len = 0; len <= 300; len++) {
      const data = Uint8Array.from({ length: len }, (_, i) => (i * 131 + len * 7) & 0xff);
      assert.equal(sha512Hex(data), reference(data), `length ${len}`);
    }
  });

  it('hashes strings as UTF-8, as the reference chain names need', () => {
    for (const s of ['wt-bcnic1', 'cniref-netctr00', 'ünïcødé 🎉 net', 'x'.repeat(1000)]) assert.equal(sha512Hex(s), reference(s), s);
    assert.equal(sha512('abc').length, 64);
  });
});

describe('CNI skel: random bytes without node:crypto', () => {
  it('returns the requested number of bytes, different each time', () => {
    const a = randomBytesSync(16);
    const b = randomBytesSync(16);
    assert.equal(a.length, 16);
    assert.equal(randomBytesSync(4).length, 4);
    assert.equal(randomBytesSync(0).length, 0);
    assert.notDeepEqual(a, b);
  });
});
