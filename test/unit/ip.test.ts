import assert from 'node:assert/strict';
import { InvalidAddressError, InvalidPrefixError, IPAddr, IPNet } from '../../src/util/ip.js';

/** Asserts that IPAddr.parse rejects `text` with an InvalidAddressError about that input. */
function rejectsAddr(text: string): void {
  assert.throws(
    () => IPAddr.parse(text),
    (e: unknown) => {
      assert.ok(e instanceof InvalidAddressError, `expected InvalidAddressError for ${JSON.stringify(text)}, got ${String(e)}`);
      assert.equal(e.input, text);
      assert.equal(e.name, 'InvalidAddressError');
      assert.ok(e.message.startsWith(`invalid IP address "${text}": `), e.message);
      return true;
    },
  );
  assert.equal(IPAddr.tryParse(text), null);
}

function rejectsNet(text: string): void {
  assert.throws(
    () => IPNet.parse(text),
    (e: unknown) => {
      assert.ok(e instanceof InvalidPrefixError, `expected InvalidPrefixError for ${JSON.stringify(text)}, got ${String(e)}`);
      assert.equal(e.input, text);
      assert.ok(e.message.startsWith(`invalid CIDR "${text}": `), e.message);
      return true;
    },
  );
  assert.equal(IPNet.tryParse(text), null);
}

/** Formats a v6 value given as eight groups, to test the formatter independently of the parser. */
function v6(...groups: number[]): IPAddr {
  assert.equal(groups.length, 8);
  let v = 0n;
  for (const g of groups) v = (v << 16n) | BigInt(g);
  return IPAddr.of(6, v);
}

describe('IPAddr', () => {
  describe('IPv4', () => {
    it('parses dotted quads to their 32-bit value and family 4', () => {
      const cases: Array<[string, bigint]> = [
        ['0.0.0.0', 0n],
        ['1.2.3.4', 0x01020304n],
        ['10.5.52.1', 0x0a053401n],
        ['192.168.64.3', 0xc0a84003n],
        ['255.255.255.255', 0xffffffffn],
      ];
      for (const [text, value] of cases) {
        const ip = IPAddr.parse(text);
        assert.equal(ip.family, 4, text);
        assert.equal(ip.bits, 32, text);
        assert.equal(ip.value, value, text);
        assert.equal(ip.toString(), text);
        assert.equal(JSON.stringify({ ip }), `{"ip":"${text}"}`);
      }
    });

    it('formats values as dotted decimal without padding', () => {
      assert.equal(IPAddr.of(4, 0x0a000001n).toString(), '10.0.0.1');
      assert.equal(IPAddr.of(4, 0x7f000001n).toString(), '127.0.0.1');
      assert.equal(IPAddr.of(4, 0x00000000n).toString(), '0.0.0.0');
    });

    it('rejects leading zeros, out-of-range octets, wrong octet counts, empty input and spaces', () => {
      for (const text of [
        '010.0.0.1', // Go >= 1.17 rejects leading zeros (ambiguous octal)
        '10.00.0.1',
        '10.0.0.01',
        '256.0.0.1',
        '1.2.3.256',
        '1.2.3.999',
        '1.2.3.1000',
        '1.2.3',
        '1.2.3.4.5',
        '1',
        '',
        ' 1.2.3.4',
        '1.2.3.4 ',
        '1.2. 3.4',
        '1.2.3.-4',
        '1.2.3.+4',
        '1.2.3.',
        '.1.2.3',
        '1..2.3',
        '0x1.2.3.4',
        'a.b.c.d',
        '1.2.3.4/24',
      ]) {
        rejectsAddr(text);
      }
    });

    it('names the bad octet in the error', () => {
      assert.throws(() => IPAddr.parse('1.2.256.4'), { message: 'invalid IP address "1.2.256.4": bad octet "256"' });
      assert.throws(() => IPAddr.parse('1.2.3'), {
        message: 'invalid IP address "1.2.3": expected four dotted decimal octets',
      });
    });

    it('parseFamily requires the family', () => {
      assert.equal(IPAddr.parseFamily('1.2.3.4', 4).value, 0x01020304n);
      assert.throws(() => IPAddr.parseFamily('1.2.3.4', 6), {
        name: 'InvalidAddressError',
        message: 'invalid IP address "1.2.3.4": not an IPv6 address',
      });
      assert.throws(() => IPAddr.parseFamily('::1', 4), {
        name: 'InvalidAddressError',
        message: 'invalid IP address "::1": not an IPv4 address',
      });
    });

    it('of() rejects values outside the family range', () => {
      assert.throws(() => IPAddr.of(4, 1n << 32n), RangeError);
      assert.throws(() => IPAddr.of(4, -1n), RangeError);
      assert.equal(IPAddr.of(4, (1n << 32n) - 1n).toString(), '255.255.255.255');
      assert.throws(() => IPAddr.of(6, 1n << 128n), RangeError);
    });

    it('add, equals and isUnspecified', () => {
      const ip = IPAddr.parse('10.0.0.255');
      assert.equal(ip.add(1n).toString(), '10.0.1.0');
      assert.ok(ip.add(1n).equals(IPAddr.parse('10.0.1.0')));
      assert.ok(!ip.equals(IPAddr.parse('10.0.1.0')));
      assert.throws(() => IPAddr.parse('255.255.255.255').add(1n), RangeError);
      assert.ok(IPAddr.parse('0.0.0.0').isUnspecified());
      assert.ok(IPAddr.parse('::').isUnspecified());
      assert.ok(!IPAddr.parse('0.0.0.1').isUnspecified());
      // Same value, different family: not equal (0.0.0.1 vs ::1).
      assert.ok(!IPAddr.parse('0.0.0.1').equals(IPAddr.parse('::1')));
    });
  });

  describe('IPv6', () => {
    it('formats like Go net.IP.String (RFC 5952)', () => {
      const cases: Array<[string, string]> = [
        ['fd00:5::', 'fd00:5::'],
        ['fd00:5:0:0:0:0:0:0', 'fd00:5::'],
        ['2001:db8::1', '2001:db8::1'],
        ['2001:0db8:0000:0000:0000:0000:0000:0001', '2001:db8::1'],
        ['::', '::'],
        ['0:0:0:0:0:0:0:0', '::'],
        ['::1', '::1'],
        ['0:0:0:0:0:0:0:1', '::1'],
        ['1::', '1::'],
        ['1:0:0:1::1', '1:0:0:1::1'],
        // longest run wins
        ['1:0:0:0:1:0:0:1', '1::1:0:0:1'],
        ['1:0:0:1:0:0:0:1', '1:0:0:1::1'],
        // first run wins on a tie
        ['1:0:0:1:1:0:0:1', '1::1:1:0:0:1'],
        ['0:0:1:1:1:1:0:0', '::1:1:1:1:0:0'],
        // a single zero group is never compressed
        ['1:0:1:1:1:1:1:1', '1:0:1:1:1:1:1:1'],
        ['0:1:1:1:1:1:1:1', '0:1:1:1:1:1:1:1'],
        ['1:1:1:1:1:1:1:0', '1:1:1:1:1:1:1:0'],
        // seven zero groups
        ['1:0:0:0:0:0:0:0', '1::'],
        ['0:0:0:0:0:0:0:1', '::1'],
        // no leading zeros in groups, lower case
        ['2001:DB8:ABCD:0012:0000:0000:0000:00FF', '2001:db8:abcd:12::ff'],
        ['FD00:12:13::', 'fd00:12:13::'],
        ['fe80::1:2:3:4', 'fe80::1:2:3:4'],
        ['ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'],
        ['1:2:3:4:5:6:7::', '1:2:3:4:5:6:7:0'],
        ['::2:3:4:5:6:7:8', '0:2:3:4:5:6:7:8'],
      ];
      for (const [input, want] of cases) {
        const ip = IPAddr.parse(input);
        assert.equal(ip.family, 6, input);
        assert.equal(ip.bits, 128, input);
        assert.equal(ip.toString(), want, `${input} formats as ${want}`);
        assert.ok(IPAddr.parse(want).equals(ip), `${want} parses back to ${input}`);
      }
    });

    it('formats values built from groups', () => {
      assert.equal(v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).toString(), '2001:db8::1');
      assert.equal(v6(0, 0, 0, 0, 0, 0, 0, 0).toString(), '::');
      assert.equal(v6(0xfd00, 5, 0, 0, 0, 0, 0, 0).toString(), 'fd00:5::');
      assert.equal(v6(1, 0, 0, 1, 0, 0, 0, 1).toString(), '1:0:0:1::1');
      assert.equal(v6(0xabcd, 0, 0, 0, 0xef, 0, 0, 0).toString(), 'abcd::ef:0:0:0');
    });

    it('parses values exactly', () => {
      assert.equal(IPAddr.parse('::1').value, 1n);
      assert.equal(IPAddr.parse('::').value, 0n);
      assert.equal(IPAddr.parse('fd00:5::').value, 0xfd000005n << 96n);
      assert.equal(IPAddr.parse('2001:db8::1').value, (0x20010db8n << 96n) | 1n);
      assert.equal(IPAddr.parse('ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff').value, (1n << 128n) - 1n);
    });

    it('parses an embedded IPv4 tail', () => {
      const mapped = IPAddr.parse('::ffff:1.2.3.4');
      assert.equal(mapped.family, 6);
      assert.equal(mapped.value, 0xffff01020304n);
      assert.ok(mapped.equals(IPAddr.parse('::ffff:102:304')));
      assert.ok(IPAddr.parse(mapped.toString()).equals(mapped), 'the printed form parses back to the same address');

      assert.equal(IPAddr.parse('64:ff9b::192.0.2.33').value, (0x64ff9bn << 96n) | 0xc0000221n);
      assert.equal(IPAddr.parse('64:ff9b::192.0.2.33').toString(), '64:ff9b::c000:221');
      assert.equal(IPAddr.parse('1:2:3:4:5:6:1.2.3.4').value, IPAddr.parse('1:2:3:4:5:6:102:304').value);
      assert.equal(IPAddr.parse('::1.2.3.4').value, 0x01020304n);
    });

    it('rejects malformed addresses', () => {
      for (const text of [
        ':',
        ':::',
        '1:::2',
        '1::2::3',
        '::1::',
        '1:2:3:4:5:6:7:8:9',
        '1:2:3:4:5:6:7',
        '::1:2:3:4:5:6:7:8', // "::" must stand for at least one group
        '1:2:3:4:5:6:7:8::',
        '12345::',
        '2001:db8::g',
        ':1::',
        '1::2:',
        '1:2:3:4:5:6:7:8:',
        ' ::1',
        '::1 ',
        'fe80::1%eth0',
        '::ffff:1.2.3',
        '::ffff:1.2.3.256',
        '::ffff:01.2.3.4',
        '1:2:3:4:5:6:7:1.2.3.4', // the v4 tail plus seven groups is nine groups
        '1.2.3.4::',
        '::1.2.3.4:1',
        '20011::',
      ]) {
        rejectsAddr(text);
      }
    });
  });
});

describe('IPNet', () => {
  it('parses v4 and v6 CIDRs in Go format', () => {
    const cases: Array<[string, string, number, bigint]> = [
      ['10.5.0.0/16', '10.5.0.0/16', 16, 65536n],
      ['10.12.13.0/24', '10.12.13.0/24', 24, 256n],
      ['0.0.0.0/0', '0.0.0.0/0', 0, 1n << 32n],
      ['1.2.3.4/32', '1.2.3.4/32', 32, 1n],
      ['fd00:12:13::/56', 'fd00:12:13::/56', 56, 1n << 72n],
      ['FD00:0012:0013:0000::/56', 'fd00:12:13::/56', 56, 1n << 72n],
      ['::/0', '::/0', 0, 1n << 128n],
      ['::1/128', '::1/128', 128, 1n],
    ];
    for (const [text, want, prefix, size] of cases) {
      const net = IPNet.parse(text);
      assert.equal(net.toString(), want, text);
      assert.equal(net.prefix, prefix, text);
      assert.equal(net.size, size, text);
      assert.equal(JSON.stringify([net]), `["${want}"]`);
    }
  });

  it('clears host bits like net.ParseCIDR, and parseWithHost reports them', () => {
    assert.equal(IPNet.parse('10.5.52.7/24').toString(), '10.5.52.0/24');
    assert.equal(IPNet.parse('10.255.255.255/9').toString(), '10.128.0.0/9');
    assert.equal(IPNet.parse('fd00:5::1/64').toString(), 'fd00:5::/64');
    assert.equal(IPNet.parse('fd00:5:ffff::/33').toString(), 'fd00:5:8000::/33');

    const withHost = IPNet.parseWithHost('10.5.52.1/24');
    assert.equal(withHost.net.toString(), '10.5.52.0/24');
    assert.equal(withHost.ip.toString(), '10.5.52.1');
    assert.equal(withHost.hostBitsSet, true);

    const clean = IPNet.parseWithHost('10.5.52.0/24');
    assert.equal(clean.net.toString(), '10.5.52.0/24');
    assert.equal(clean.ip.toString(), '10.5.52.0');
    assert.equal(clean.hostBitsSet, false);

    assert.equal(IPNet.parseWithHost('fd00::1/64').hostBitsSet, true);
    assert.equal(IPNet.parseWithHost('fd00::/64').hostBitsSet, false);
    assert.equal(IPNet.parseWithHost('0.0.0.1/0').hostBitsSet, true);
    assert.equal(IPNet.parseWithHost('0.0.0.1/0').net.toString(), '0.0.0.0/0');
  });

  it('enforces prefix length bounds per family', () => {
    assert.equal(IPNet.parse('10.0.0.0/32').prefix, 32);
    assert.equal(IPNet.parse('::/128').prefix, 128);
    for (const text of [
      '10.0.0.0/33',
      '10.0.0.0/128',
      '::/129',
      '10.0.0.0/-1',
      '10.0.0.0/',
      '10.0.0.0',
      '10.0.0.0/ 8',
      '10.0.0.0/8 ',
      '10.0.0.0/8/8',
      '10.0.0.0/0x8',
      '10.0.0.0/1000',
      '/8',
      '',
      '256.0.0.0/8',
      'fd00::g/64',
    ]) {
      rejectsNet(text);
    }
    assert.throws(() => IPNet.parse('10.0.0.0/33'), { message: 'invalid CIDR "10.0.0.0/33": prefix length must be 0..32' });
    assert.throws(() => IPNet.parse('::/129'), { message: 'invalid CIDR "::/129": prefix length must be 0..128' });
    assert.throws(() => IPNet.parse('10.0.0.0'), { message: 'invalid CIDR "10.0.0.0": missing "/prefix-length"' });
    assert.throws(() => IPNet.of(IPAddr.parse('10.0.0.0'), 33), RangeError);
    assert.throws(() => IPNet.of(IPAddr.parse('10.0.0.0'), -1), RangeError);
    assert.throws(() => IPNet.of(IPAddr.parse('10.0.0.0'), 8.5), RangeError);
    assert.throws(() => IPNet.of(IPAddr.parse('::'), 129), RangeError);
    assert.equal(IPNet.of(IPAddr.parse('10.1.2.3'), 8).toString(), '10.0.0.0/8');
  });

  it('first, last, size and nth', () => {
    const net = IPNet.parse('10.5.52.0/24');
    assert.equal(net.family, 4);
    assert.equal(net.bits, 32);
    assert.equal(net.first, 0x0a053400n);
    assert.equal(net.last, 0x0a0534ffn);
    assert.equal(net.size, 256n);
    assert.equal(net.nth(0n).toString(), '10.5.52.0');
    assert.equal(net.nth(1n).toString(), '10.5.52.1');
    assert.equal(net.nth(255n).toString(), '10.5.52.255');

    const net6 = IPNet.parse('fd00:5::/64');
    assert.equal(net6.family, 6);
    assert.equal(net6.bits, 128);
    assert.equal(net6.size, 1n << 64n);
    assert.equal(net6.first, 0xfd000005n << 96n);
    assert.equal(net6.last, (0xfd000005n << 96n) | ((1n << 64n) - 1n));
    assert.equal(net6.nth(1n).toString(), 'fd00:5::1');
    assert.equal(IPAddr.of(6, net6.last).toString(), 'fd00:5::ffff:ffff:ffff:ffff');

    const all = IPNet.parse('0.0.0.0/0');
    assert.equal(all.first, 0n);
    assert.equal(all.last, 0xffffffffn);
    const host = IPNet.parse('1.2.3.4/32');
    assert.equal(host.first, host.last);
    assert.throws(() => IPNet.parse('255.255.255.255/32').nth(1n), RangeError);
  });

  it('contains: address inside the prefix and of the same family', () => {
    const net = IPNet.parse('10.5.0.0/16');
    assert.ok(net.contains(IPAddr.parse('10.5.0.0')));
    assert.ok(net.contains(IPAddr.parse('10.5.255.255')));
    assert.ok(net.contains(IPAddr.parse('10.5.52.1')));
    assert.ok(!net.contains(IPAddr.parse('10.4.255.255')));
    assert.ok(!net.contains(IPAddr.parse('10.6.0.0')));
    // ::a05:3401 has the same numeric value as 10.5.52.1 but is IPv6.
    assert.ok(!net.contains(IPAddr.parse('::a05:3401')));
    assert.ok(IPNet.parse('::/0').contains(IPAddr.parse('fd00::1')));
    assert.ok(!IPNet.parse('::/0').contains(IPAddr.parse('1.2.3.4')));
    assert.ok(IPNet.parse('0.0.0.0/0').contains(IPAddr.parse('255.255.255.255')));
  });

  it('containsNet: the other prefix lies entirely inside', () => {
    const net = IPNet.parse('10.5.0.0/16');
    assert.ok(net.containsNet(IPNet.parse('10.5.0.0/16')));
    assert.ok(net.containsNet(IPNet.parse('10.5.52.0/24')));
    assert.ok(net.containsNet(IPNet.parse('10.5.255.255/32')));
    assert.ok(!net.containsNet(IPNet.parse('10.4.0.0/15')), 'a larger prefix that covers it is not inside');
    assert.ok(!net.containsNet(IPNet.parse('10.0.0.0/8')));
    assert.ok(!net.containsNet(IPNet.parse('10.6.0.0/24')));
    assert.ok(!net.containsNet(IPNet.parse('::a05:0/112')));
    assert.ok(IPNet.parse('fd00::/48').containsNet(IPNet.parse('fd00:0:0:ff::/64')));
    assert.ok(!IPNet.parse('fd00::/48').containsNet(IPNet.parse('fd00:0:1::/64')));
  });

  it('overlaps: symmetric, same family only', () => {
    const pairs: Array<[string, string, boolean]> = [
      ['10.5.0.0/16', '10.5.52.0/24', true],
      ['10.5.0.0/16', '10.0.0.0/8', true],
      ['10.5.0.0/16', '10.5.0.0/16', true],
      ['10.5.0.0/16', '10.4.0.0/16', false],
      ['10.5.0.0/16', '10.6.0.0/16', false],
      ['10.5.0.0/16', '10.4.255.255/32', false],
      ['10.5.0.0/16', '10.5.255.255/32', true],
      ['fd00::/48', 'fd00:0:0:1::/64', true],
      ['fd00::/48', 'fd00:1::/48', false],
      ['0.0.0.0/0', '::/0', false],
      ['10.5.0.0/16', '::a05:0/112', false],
    ];
    for (const [a, b, want] of pairs) {
      assert.equal(IPNet.parse(a).overlaps(IPNet.parse(b)), want, `${a} overlaps ${b}`);
      assert.equal(IPNet.parse(b).overlaps(IPNet.parse(a)), want, `${b} overlaps ${a}`);
    }
  });

  it('equals compares address and length', () => {
    assert.ok(IPNet.parse('10.5.52.0/24').equals(IPNet.parse('10.5.52.9/24')));
    assert.ok(!IPNet.parse('10.5.52.0/24').equals(IPNet.parse('10.5.52.0/25')));
    assert.ok(!IPNet.parse('10.5.52.0/24').equals(IPNet.parse('10.5.53.0/24')));
    assert.ok(!IPNet.parse('0.0.0.0/0').equals(IPNet.parse('::/0')));
  });
});
