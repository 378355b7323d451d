import assert from 'node:assert/strict';
import {
  decodeLeaseAttrs,
  encodeLeaseAttrs,
  goJson,
  LeaseKeyError,
  LeaseValueError,
  makeSubnetKey,
  parseSubnetKey,
} from '../../src/subnet/codec.js';
import type { JsonValue, LeaseAttrs } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { prng } from '../helpers/prng.js';

/** flannel's pkg/subnet subnetRegex, verbatim (not anchored at the start, unescaped dots). */
const FLANNEL_KEY_RE = /(\d+\.\d+.\d+.\d+)-(\d+)(?:&([a-f\d:]+)-(\d+))?$/;

function rejectsKey(key: string, reason?: RegExp): void {
  assert.throws(
    () => parseSubnetKey(key),
    (e: unknown) => {
      assert.ok(e instanceof LeaseKeyError, `expected LeaseKeyError for ${JSON.stringify(key)}, got ${String(e)}`);
      assert.equal(e.key, key);
      assert.equal(e.name, 'LeaseKeyError');
      assert.ok(e.message.startsWith(`lease key "${key}": `), e.message);
      if (reason) assert.match(e.message, reason);
      return true;
    },
  );
}

function rejectsValue(text: string, reason: RegExp): void {
  assert.throws(
    () => decodeLeaseAttrs(text),
    (e: unknown) => {
      assert.ok(e instanceof LeaseValueError, `expected LeaseValueError for ${text}, got ${String(e)}`);
      assert.equal(e.value, text);
      assert.equal(e.name, 'LeaseValueError');
      assert.match(e.reason, reason);
      assert.ok(e.message.includes(e.reason), e.message);
      return true;
    },
  );
}

function attrs(publicIP: string, rest: Omit<LeaseAttrs, 'publicIP' | 'publicIPv6'> & { publicIPv6?: string | null } = {}): LeaseAttrs {
  const { publicIPv6, ...others } = rest;
  return { publicIP: IPAddr.parse(publicIP), publicIPv6: publicIPv6 ? IPAddr.parse(publicIPv6) : null, ...others };
}

describe('subnet keys', () => {
  it("TestSubnetNodev4: 10.12.13.0-24 is IPv4 only and round-trips", () => {
    const key = '10.12.13.0-24';
    const { subnet, ipv6Subnet } = parseSubnetKey(key);
    assert.equal(subnet.toString(), '10.12.13.0/24');
    assert.equal(ipv6Subnet, null);
    assert.equal(makeSubnetKey(subnet, null), key);
  });

  it("TestSubnetNodev6: 10.12.13.0-24&fd00:12:13::-56 is dual-stack and round-trips", () => {
    const key = '10.12.13.0-24&fd00:12:13::-56';
    const { subnet, ipv6Subnet } = parseSubnetKey(key);
    assert.equal(subnet.toString(), '10.12.13.0/24');
    assert.equal(ipv6Subnet?.toString(), 'fd00:12:13::/56');
    assert.equal(makeSubnetKey(subnet, ipv6Subnet), key);
  });

  it('makeSubnetKey writes Go-formatted addresses', () => {
    assert.equal(makeSubnetKey(IPNet.parse('10.5.52.0/24'), IPNet.parse('fd00:0005:0000::/64')), '10.5.52.0-24&fd00:5::-64');
    assert.equal(makeSubnetKey(IPNet.parse('10.0.0.0/8'), null), '10.0.0.0-8');
    assert.equal(makeSubnetKey(IPNet.parse('0.0.0.0/0'), IPNet.parse('::/0')), '0.0.0.0-0&::-0');
  });

  it('rejects keys that do not match the pattern', () => {
    for (const key of [
      'foo',
      '',
      '10.12.13.0-24&',
      '10.12.13.0-24&10.0.0.0-8',
      // flannel's TestSubnetNodeInvalid
      '10',
      '10.12.13.0',
      '10.12.13-24',
      '10.12.13.0-24hi',
      '&2001::-56',
      '10.12.13.0-24&2001::',
      '10.12.13.0-24&2001::-56hi',
      // flannel's regex is not anchored at the start; ours is
      'x10.12.13.0-24',
      '/coreos.com/network/subnets/10.12.13.0-24',
      '10.12.13.0-24&FD00::-56', // flannel's pattern is lower-case only
      '10x12x13x0-24',
    ]) {
      rejectsKey(key, /does not match/);
    }
  });

  it('rejects keys that match the pattern but hold bad addresses or lengths', () => {
    rejectsKey('10.12.13.1-24', /10\.12\.13\.1 is not the network address of \/24/);
    rejectsKey('10.12.13.0-33', /prefix length 33 out of range/);
    rejectsKey('10.12.13.300-24', /bad octet "300"/);
    rejectsKey('010.12.13.0-24', /bad octet "010"/);
    rejectsKey('10.12.13.0-24&:12:13:-56');
    rejectsKey('10.12.13.0-24&20011::-56');
    rejectsKey('10.12.13.0-24&2001-56');
    rejectsKey('10.12.13.0-24&fd00::-129', /prefix length 129 out of range/);
    rejectsKey('10.12.13.0-24&fd00::1-64', /fd00::1 is not the network address of \/64/);
    rejectsKey('10.12.13.0-99999999999999999999', /out of range/);
  });
});

describe('lease values', () => {
  // Documentation/reservations.md
  const RESERVATION = '{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}';

  it("decodes flannel's documented vxlan value and re-encodes it byte for byte", () => {
    const a = decodeLeaseAttrs(RESERVATION);
    assert.equal(a.publicIP.toString(), '192.168.64.3');
    assert.equal(a.publicIP.family, 4);
    assert.equal(a.publicIPv6, null);
    assert.equal(a.backendType, 'vxlan');
    assert.deepEqual(a.backendData, { VNI: 1, VtepMAC: 'c6:d2:32:6f:8f:44' });
    assert.equal('backendV6Data' in a, false);
    assert.equal(encodeLeaseAttrs(a), RESERVATION);
  });

  it('round-trips a dual-stack vxlan value', () => {
    const text =
      '{"PublicIP":"10.0.0.1","PublicIPv6":"fd00::1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"},"BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:fe"}}';
    const a = decodeLeaseAttrs(text);
    assert.equal(a.publicIPv6?.toString(), 'fd00::1');
    assert.deepEqual(a.backendV6Data, { VNI: 1, VtepMAC: 'aa:bb:cc:dd:ee:fe' });
    assert.equal(encodeLeaseAttrs(a), text);
  });

  it('encodes fields in flannel order with its omission rules', () => {
    assert.equal(encodeLeaseAttrs(attrs('10.0.0.1')), '{"PublicIP":"10.0.0.1","PublicIPv6":null}');
    assert.equal(encodeLeaseAttrs(attrs('10.0.0.1', { backendType: '' })), '{"PublicIP":"10.0.0.1","PublicIPv6":null}');
    assert.equal(
      encodeLeaseAttrs(attrs('10.0.0.1', { backendType: 'host-gw' })),
      '{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"host-gw"}',
    );
    assert.equal(
      encodeLeaseAttrs(attrs('10.0.0.1', { backendType: 'host-gw', backendData: null })),
      '{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"host-gw","BackendData":null}',
    );
    assert.equal(
      encodeLeaseAttrs(attrs('10.0.0.1', { publicIPv6: '2001:DB8:0::1', backendData: null, backendV6Data: null })),
      '{"PublicIP":"10.0.0.1","PublicIPv6":"2001:db8::1","BackendData":null,"BackendV6Data":null}',
    );
    assert.equal(
      encodeLeaseAttrs(attrs('0.0.0.0', { publicIPv6: 'fd00::5', backendType: 'vxlan', backendV6Data: { VNI: 2 } })),
      '{"PublicIP":"0.0.0.0","PublicIPv6":"fd00::5","BackendType":"vxlan","BackendV6Data":{"VNI":2}}',
    );
    // Property insertion order of the input object does not matter.
    const shuffled: LeaseAttrs = {
      backendV6Data: 2,
      backendData: 1,
      backendType: 't',
      publicIPv6: IPAddr.parse('::2'),
      publicIP: IPAddr.parse('1.1.1.1'),
    };
    assert.equal(
      encodeLeaseAttrs(shuffled),
      '{"PublicIP":"1.1.1.1","PublicIPv6":"::2","BackendType":"t","BackendData":1,"BackendV6Data":2}',
    );
  });

  it('refuses to encode addresses of the wrong family', () => {
    assert.throws(() => encodeLeaseAttrs({ publicIP: IPAddr.parse('::1'), publicIPv6: null }), TypeError);
    assert.throws(() => encodeLeaseAttrs({ publicIP: IPAddr.parse('1.2.3.4'), publicIPv6: IPAddr.parse('1.2.3.4') }), TypeError);
  });

  it('decodes keys case-insensitively, the last duplicate winning like encoding/json', () => {
    const a = decodeLeaseAttrs('{"publicip":"1.2.3.4"}');
    assert.equal(a.publicIP.toString(), '1.2.3.4');
    assert.equal(a.publicIPv6, null);
    assert.equal(a.backendType, undefined);
    assert.equal(a.backendData, undefined);
    assert.equal(encodeLeaseAttrs(a), '{"PublicIP":"1.2.3.4","PublicIPv6":null}');

    const b = decodeLeaseAttrs('{"PUBLICIP":"1.2.3.4","publicIPV6":"FD00::1","backendtype":"vxlan","backenddata":{"VNI":7},"BACKENDV6DATA":null}');
    assert.equal(
      encodeLeaseAttrs(b),
      '{"PublicIP":"1.2.3.4","PublicIPv6":"fd00::1","BackendType":"vxlan","BackendData":{"VNI":7},"BackendV6Data":null}',
    );

    assert.equal(decodeLeaseAttrs('{"PublicIP":"1.2.3.4","publicip":"5.6.7.8"}').publicIP.toString(), '5.6.7.8');
  });

  it('ignores unknown fields and treats an empty or null BackendType as absent', () => {
    const a = decodeLeaseAttrs('{"PublicIP":"1.2.3.4","PublicIPv6":null,"Extra":[1,2],"BackendType":""}');
    assert.equal(a.backendType, undefined);
    assert.equal(encodeLeaseAttrs(a), '{"PublicIP":"1.2.3.4","PublicIPv6":null}');
    assert.equal(decodeLeaseAttrs('{"PublicIP":"1.2.3.4","BackendType":null}').backendType, undefined);
  });

  it('writes BackendData compactly however the input was spaced', () => {
    const a = decodeLeaseAttrs('{ "PublicIP" : "1.2.3.4" ,\n "BackendData" : { "VNI" : 1 , "VtepMAC" : "c6:d2:32:6f:8f:44" } }');
    assert.equal(encodeLeaseAttrs(a), '{"PublicIP":"1.2.3.4","PublicIPv6":null,"BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}');
  });

  it('rejects bad PublicIP values, naming the field', () => {
    rejectsValue('{"PublicIP":""}', /^PublicIP "" is not an IPv4 address$/);
    rejectsValue('{"PublicIP":null}', /^PublicIP must be an IPv4 address string$/);
    rejectsValue('{"PublicIP":"::1"}', /^PublicIP "::1" is not an IPv4 address$/);
    rejectsValue('{"PublicIP":"1.2.3"}', /^PublicIP "1.2.3" is not an IPv4 address$/);
    rejectsValue('{"PublicIP":16909060}', /^PublicIP must be an IPv4 address string$/);
    rejectsValue('{}', /^PublicIP must be an IPv4 address string$/);
    rejectsValue('{"PublicIPv6":"fd00::1"}', /^PublicIP must be an IPv4 address string$/);
  });

  it('rejects bad PublicIPv6 values, naming the field', () => {
    rejectsValue('{"PublicIP":"1.2.3.4","PublicIPv6":"1.2.3.4"}', /^PublicIPv6 "1.2.3.4" is not an IPv6 address$/);
    rejectsValue('{"PublicIP":"1.2.3.4","PublicIPv6":""}', /^PublicIPv6 "" is not an IPv6 address$/);
    rejectsValue('{"PublicIP":"1.2.3.4","PublicIPv6":"fd00::g"}', /^PublicIPv6 "fd00::g" is not an IPv6 address$/);
    rejectsValue('{"PublicIP":"1.2.3.4","PublicIPv6":1}', /^PublicIPv6 must be null or an IPv6 address string$/);
  });

  it('rejects a non-string BackendType', () => {
    rejectsValue('{"PublicIP":"1.2.3.4","BackendType":1}', /^BackendType must be a string$/);
  });

  it('rejects values that are not JSON objects', () => {
    rejectsValue('null', /^not a JSON object$/);
    rejectsValue('[]', /^not a JSON object$/);
    rejectsValue('[{"PublicIP":"1.2.3.4"}]', /^not a JSON object$/);
    rejectsValue('"1.2.3.4"', /^not a JSON object$/);
    rejectsValue('42', /^not a JSON object$/);
    rejectsValue('true', /^not a JSON object$/);
  });

  it('rejects invalid JSON', () => {
    rejectsValue('', /^not valid JSON \(/);
    rejectsValue('{', /^not valid JSON \(/);
    rejectsValue('{"PublicIP":"1.2.3.4",}', /^not valid JSON \(/);
    rejectsValue("{'PublicIP':'1.2.3.4'}", /^not valid JSON \(/);
  });

  it('quotes the value in the error message and truncates long ones', () => {
    try {
      decodeLeaseAttrs('{"PublicIP":""}');
      assert.fail('expected a LeaseValueError');
    } catch (e) {
      assert.ok(e instanceof LeaseValueError);
      assert.equal(e.message, 'lease value "{\\"PublicIP\\":\\"\\"}": PublicIP "" is not an IPv4 address');
    }
    const long = `{"PublicIP":"x","Pad":"${'a'.repeat(300)}"}`;
    try {
      decodeLeaseAttrs(long);
      assert.fail('expected a LeaseValueError');
    } catch (e) {
      assert.ok(e instanceof LeaseValueError);
      assert.equal(e.value, long, 'the full value stays available');
      assert.ok(e.message.length < 200, `message is ${e.message.length} characters`);
      assert.ok(e.message.endsWith('...": PublicIP "x" is not an IPv4 address'), e.message);
    }
  });
});

describe('goJson', () => {
  it('escapes HTML characters and line separators like encoding/json', () => {
    assert.equal(goJson('<a&b>'), '"\\u003ca\\u0026b\\u003e"');
    assert.equal(goJson('\u2028\u2029'), '"\\u2028\\u2029"');
    assert.equal(goJson({ k: ['<', 1, null, true] }), '{"k":["\\u003c",1,null,true]}');
    // Go 1.22+ writes \b and \f short forms, other controls as lower-case \u00xx, like JSON.stringify.
    assert.equal(goJson('\b\f\n\r\t\u0001\u001f"\\'), '"\\b\\f\\n\\r\\t\\u0001\\u001f\\"\\\\"');
    assert.equal(goJson('é✓'), '"é✓"');
  });

  it('applies to every string field of an encoded lease', () => {
    const a = attrs('1.2.3.4', { backendType: 'a<b', backendData: { '<k>': 'x&y' }, backendV6Data: ['>'] });
    const text = encodeLeaseAttrs(a);
    assert.equal(
      text,
      '{"PublicIP":"1.2.3.4","PublicIPv6":null,"BackendType":"a\\u003cb","BackendData":{"\\u003ck\\u003e":"x\\u0026y"},"BackendV6Data":["\\u003e"]}',
    );
    const back = decodeLeaseAttrs(text);
    assert.equal(back.backendType, 'a<b');
    assert.deepEqual(back.backendData, { '<k>': 'x&y' });
    assert.equal(encodeLeaseAttrs(back), text);
  });
});


describe('property: everything we write is readable by flannel', () => {
  const rnd = prng(0x5eed);
  const int = (n: number) => Math.floor(rnd() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)]!;
  const bigRand = (bits: number): bigint => {
    let v = 0n;
    for (let i = 0; i < bits; i += 16) v = (v << 16n) | BigInt(int(0x10000));
    return v & ((1n << BigInt(bits)) - 1n);
  };
  /** Addresses biased towards zero groups, so "::" compression is exercised. */
  const v6Value = (): bigint => {
    let v = 0n;
    for (let i = 0; i < 8; i++) v = (v << 16n) | (rnd() < 0.5 ? 0n : BigInt(pick([1, 0xfd00, 0xffff, int(0x10000)])));
    return v;
  };
  const STRINGS = ['', 'vxlan', 'host-gw', 'x<y&z>', 'line\u2028sep', 'quote"back\\slash', 'ctl\u0001\n', 'é✓'];
  const json = (depth: number): JsonValue => {
    switch (int(depth > 2 ? 4 : 6)) {
      case 0:
        return null;
      case 1:
        return rnd() < 0.5;
      case 2:
        return int(1 << 24) - (1 << 23);
      case 3:
        return pick(STRINGS);
      case 4:
        return Array.from({ length: int(4) }, () => json(depth + 1));
      default: {
        const o: { [k: string]: JsonValue } = {};
        for (let i = int(4); i > 0; i--) o[pick(['VNI', 'VtepMAC', 'k<', 'a&b', 'z'])] = json(depth + 1);
        return o;
      }
    }
  };

  it('keys match flannel\'s subnetRegex and values match its LeaseAttrs shape (2000 random leases)', () => {
    const ORDER = ['PublicIP', 'PublicIPv6', 'BackendType', 'BackendData', 'BackendV6Data'];
    for (let i = 0; i < 2000; i++) {
      const subnet = IPNet.of(IPAddr.of(4, bigRand(32)), int(33));
      const ipv6Subnet = rnd() < 0.5 ? IPNet.of(IPAddr.of(6, v6Value()), int(129)) : null;
      const key = makeSubnetKey(subnet, ipv6Subnet);
      const m = FLANNEL_KEY_RE.exec(key);
      assert.ok(m, `flannel's regex rejects ${key}`);
      assert.equal(m.index, 0, key);
      assert.equal(m[1], subnet.ip.toString(), key);
      assert.equal(Number(m[2]), subnet.prefix, key);
      if (ipv6Subnet) {
        assert.equal(m[3], ipv6Subnet.ip.toString(), key);
        assert.equal(Number(m[4]), ipv6Subnet.prefix, key);
      } else {
        assert.equal(m[3], undefined, key);
      }
      const parsed = parseSubnetKey(key);
      assert.ok(parsed.subnet.equals(subnet), key);
      assert.equal(parsed.ipv6Subnet?.toString() ?? null, ipv6Subnet?.toString() ?? null, key);

      const a: { -readonly [K in keyof LeaseAttrs]: LeaseAttrs[K] } = {
        publicIP: IPAddr.of(4, rnd() < 0.1 ? 0n : bigRand(32)),
        publicIPv6: rnd() < 0.5 ? IPAddr.of(6, v6Value()) : null,
      };
      if (rnd() < 0.8) a.backendType = pick(STRINGS);
      if (rnd() < 0.7) a.backendData = json(0);
      if (rnd() < 0.3) a.backendV6Data = json(0);
      const text = encodeLeaseAttrs(a);

      assert.doesNotMatch(text, /[<>&\u2028\u2029]/, text);
      const obj: unknown = JSON.parse(text);
      assert.ok(obj !== null && typeof obj === 'object' && !Array.isArray(obj), text);
      const rec = obj as Record<string, unknown>;
      const keys = Object.keys(rec);
      assert.deepEqual(keys, ORDER.filter((k) => keys.includes(k)), `field order in ${text}`);
      assert.deepEqual(keys.slice(0, 2), ['PublicIP', 'PublicIPv6'], text);
      // ip.IP4.UnmarshalJSON: a dotted quad Go's net.ParseIP accepts (no leading zeros).
      assert.equal(typeof rec.PublicIP, 'string', text);
      assert.match(rec.PublicIP as string, /^(0|[1-9]\d{0,2})(\.(0|[1-9]\d{0,2})){3}$/, text);
      assert.ok((rec.PublicIP as string).split('.').every((o) => Number(o) <= 255), text);
      assert.equal(rec.PublicIP, a.publicIP.toString());
      // *ip.IP6: null, or an IPv6 string without an embedded dotted quad.
      if (a.publicIPv6) {
        assert.equal(typeof rec.PublicIPv6, 'string', text);
        assert.match(rec.PublicIPv6 as string, /^[0-9a-f:]+$/, text);
        assert.equal(IPAddr.parseFamily(rec.PublicIPv6 as string, 6).value, a.publicIPv6.value, text);
      } else {
        assert.equal(rec.PublicIPv6, null, text);
      }
      if (a.backendType) assert.equal(rec.BackendType, a.backendType, text);
      else assert.equal('BackendType' in rec, false, text);
      if (a.backendData !== undefined) assert.deepEqual(rec.BackendData, a.backendData, text);
      else assert.equal('BackendData' in rec, false, text);
      if (a.backendV6Data !== undefined) assert.deepEqual(rec.BackendV6Data, a.backendV6Data, text);
      else assert.equal('BackendV6Data' in rec, false, text);

      const back = decodeLeaseAttrs(text);
      assert.ok(back.publicIP.equals(a.publicIP), text);
      assert.equal(back.publicIPv6?.value ?? null, a.publicIPv6?.value ?? null, text);
      assert.equal(encodeLeaseAttrs(back), text, 'decode then encode is byte-exact');
    }
  });
});
