import assert from 'node:assert/strict';
import { ConfigError, parseNetworkConfig, subnetRange, type NetworkConfig, type ParseOptions } from '../../src/subnet/config.js';

const KNOWN: ParseOptions = { knownBackends: ['vxlan', 'host-gw', 'alloc'] };
const KUBE: ParseOptions = { ...KNOWN, checkSubnets: false };

function parse(doc: unknown, opts: ParseOptions = KNOWN): NetworkConfig {
  return parseNetworkConfig(typeof doc === 'string' ? doc : JSON.stringify(doc), opts);
}

/** Asserts a ConfigError with exactly this message and key. */
function rejects(doc: unknown, message: string, key: string | null, opts: ParseOptions = KNOWN): void {
  assert.throws(
    () => parse(doc, opts),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError, `expected ConfigError, got ${String(e)}`);
      assert.equal(e.message, message);
      assert.equal(e.key, key);
      assert.equal(e.name, 'ConfigError');
      return true;
    },
  );
}

/** The IPv4 or IPv6 fields as strings, for one-line comparisons. */
function v4(cfg: NetworkConfig): [string | null, number, string | null, string | null] {
  return [cfg.network?.toString() ?? null, cfg.subnetLen, cfg.subnetMin?.toString() ?? null, cfg.subnetMax?.toString() ?? null];
}
function v6(cfg: NetworkConfig): [string | null, number, string | null, string | null] {
  return [
    cfg.ipv6Network?.toString() ?? null,
    cfg.ipv6SubnetLen,
    cfg.ipv6SubnetMin?.toString() ?? null,
    cfg.ipv6SubnetMax?.toString() ?? null,
  ];
}

describe('parseNetworkConfig', () => {
  describe("flannel's own test cases (pkg/subnet/config_test.go)", () => {
    it('TestConfigDefaults', () => {
      const cfg = parse('{ "network": "10.3.0.0/16" }');
      assert.deepEqual(v4(cfg), ['10.3.0.0/16', 24, '10.3.1.0', '10.3.255.0']);
      assert.equal(cfg.enableIPv4, true);
      assert.equal(cfg.enableIPv6, false);
      assert.equal(cfg.enableNFTables, false);
      assert.deepEqual(v6(cfg), [null, 0, null, null]);
      assert.deepEqual(cfg.backend, { type: 'vxlan', options: {} });
      assert.deepEqual(cfg.warnings, []);
    });

    it('TestIPv6ConfigDefaults', () => {
      const cfg = parse('{ "enableIPv6": true, "ipv6Network": "fc00::/48", "enableIPv4": false }');
      assert.deepEqual(v6(cfg), ['fc00::/48', 64, 'fc00:0:0:1::', 'fc00:0:0:ffff::']);
      assert.equal(cfg.enableIPv4, false);
      assert.deepEqual(v4(cfg), [null, 0, null, null]);
    });

    it('TestConfigOverrides', () => {
      const cfg = parse('{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.5.0", "SubnetMax": "10.3.8.0", "SubnetLen": 28 }');
      assert.deepEqual(v4(cfg), ['10.3.0.0/16', 28, '10.3.5.0', '10.3.8.0']);
    });

    it('TestIPv6ConfigOverrides', () => {
      const cfg = parse(
        '{ "EnableIPv6": true, "IPv6Network": "fc00::/48", "IPv6SubnetMin": "fc00:0:0:1::", ' +
          '"IPv6SubnetMax": "fc00:0:0:f::", "IPv6SubnetLen": 124, "enableIPv4": false }',
      );
      assert.deepEqual(v6(cfg), ['fc00::/48', 124, 'fc00:0:0:1::', 'fc00:0:0:f::']);
    });
  });

  describe('document shape', () => {
    it('rejects text that is not JSON, quoting the parser', () => {
      const text = '{"Network": "10.0.0.0/8",}';
      let parserMessage = '';
      try {
        JSON.parse(text);
      } catch (e) {
        parserMessage = (e as Error).message;
      }
      assert.notEqual(parserMessage, '');
      rejects(text, `network config is not valid JSON: ${parserMessage}`, null);
      rejects('', 'network config is not valid JSON: Unexpected end of JSON input', null);
    });

    for (const doc of ['[]', '"10.0.0.0/8"', '42', 'null', 'true']) {
      it(`rejects the non-object ${doc}`, () => {
        rejects(doc, 'network config must be a JSON object', null);
      });
    }

    it('matches keys case-insensitively, like Go encoding/json', () => {
      const cfg = parse('{"nEtWoRk":"10.5.0.0/16","SUBNETLEN":20,"subnetmin":"10.5.16.0","ENABLEnftables":true}');
      assert.deepEqual(v4(cfg), ['10.5.0.0/16', 20, '10.5.16.0', '10.5.240.0']);
      assert.equal(cfg.enableNFTables, true);
      assert.deepEqual(cfg.warnings, []);
    });

    it("folds like Go: the long s and the Kelvin sign match 's' and 'k'", () => {
      const cfg = parse('{"Network":"10.0.0.0/8","\u017Fubnetlen":16,"bac\u212Aend":{"Type":"alloc"}}');
      assert.equal(cfg.subnetLen, 16);
      assert.equal(cfg.backend.type, 'alloc');
    });

    it('uses the last of repeated keys, in document order, and warns', () => {
      // JSON.parse alone would keep "Network" (first position) and yield 10.2.0.0/16.
      const cfg = parse('{"Network":"10.1.0.0/16","network":"10.2.0.0/16","Network":"10.3.0.0/16"}');
      assert.equal(cfg.network?.toString(), '10.3.0.0/16');
      assert.deepEqual(cfg.warnings, [
        'key "network" repeats "Network"; the last value is used',
        'key "Network" repeats "network"; the last value is used',
      ]);
    });

    it('ignores unknown keys with one warning each', () => {
      const cfg = parse({ Network: '10.0.0.0/8', Foo: 1, Networks: ['10.1.0.0/16'], backend_type: 'vxlan' });
      assert.equal(cfg.network?.toString(), '10.0.0.0/8');
      assert.deepEqual(cfg.warnings, [
        'unknown key "Foo" ignored',
        'unknown key "Networks" ignored',
        'unknown key "backend_type" ignored',
      ]);
    });

    it('treats null as absent, as Go does for plain fields', () => {
      const cfg = parse({ Network: '10.0.0.0/16', EnableIPv4: null, SubnetLen: null, SubnetMin: null, Backend: null });
      assert.equal(cfg.enableIPv4, true);
      assert.deepEqual(v4(cfg), ['10.0.0.0/16', 24, '10.0.1.0', '10.0.255.0']);
      assert.deepEqual(cfg.backend, { type: 'vxlan', options: {} });
    });

    it('reads keys across whitespace, nested values and escaped quotes', () => {
      const text = ' \n{ "Backend" :\t{"Type":"vxlan","Name":"a\\"}b","List":[{"x":"]"},[1,2]]} ,\r\n "Network" : "10.0.0.0/8" , "X" : -1.5e3 }\n';
      const cfg = parse(text);
      assert.equal(cfg.network?.toString(), '10.0.0.0/8');
      assert.deepEqual(cfg.backend.options, { Type: 'vxlan', Name: 'a"}b', List: [{ x: ']' }, [1, 2]] });
      assert.deepEqual(cfg.warnings, ['unknown key "X" ignored']);
    });
  });

  describe('field types', () => {
    const cases: Array<[string, unknown, string]> = [
      ['SubnetLen', '24', 'SubnetLen "24": must be an integer'],
      ['SubnetLen', 24.5, 'SubnetLen 24.5: must be an integer'],
      ['SubnetLen', -1, 'SubnetLen -1: must not be negative'],
      ['IPv6SubnetLen', true, 'IPv6SubnetLen true: must be an integer'],
      ['EnableIPv6', 'yes', 'EnableIPv6 "yes": must be true or false'],
      ['EnableIPv4', 1, 'EnableIPv4 1: must be true or false'],
      ['EnableNFTables', 'false', 'EnableNFTables "false": must be true or false'],
      ['Network', '10.0.0.0', 'Network "10.0.0.0": invalid CIDR: missing "/prefix-length"'],
      ['Network', '10.0.0.0/33', 'Network "10.0.0.0/33": invalid CIDR: prefix length must be 0..32'],
      ['Network', '10.0.0.256/8', 'Network "10.0.0.256/8": invalid CIDR: bad octet "256"'],
      ['Network', 'fd00::/48', 'Network "fd00::/48": must be an IPv4 CIDR'],
      ['Network', 167772160, 'Network 167772160: must be a CIDR string'],
      ['IPv6Network', '10.0.0.0/8', 'IPv6Network "10.0.0.0/8": must be an IPv6 CIDR'],
      ['SubnetMin', 'fd00::', 'SubnetMin "fd00::": must be an IPv4 address'],
      ['SubnetMax', '10.1', 'SubnetMax "10.1": invalid IP address: expected four dotted decimal octets'],
      ['SubnetMax', ['10.1.0.0'], 'SubnetMax ["10.1.0.0"]: must be an IPv4 address string'],
      ['IPv6SubnetMin', '10.1.0.0', 'IPv6SubnetMin "10.1.0.0": must be an IPv6 address'],
      ['IPv6SubnetMax', 'fd00::1::2', 'IPv6SubnetMax "fd00::1::2": invalid IP address: more than one "::"'],
      ['Backend', 'vxlan', 'Backend "vxlan": must be an object with a "Type"'],
      ['Backend', [{ Type: 'vxlan' }], 'Backend [{"Type":"vxlan"}]: must be an object with a "Type"'],
    ];
    for (const [key, value, message] of cases) {
      it(`rejects ${key} ${JSON.stringify(value)}`, () => {
        rejects({ Network: '10.0.0.0/16', [key]: value }, message, key);
      });
    }

    it('shortens long values in messages', () => {
      rejects({ Network: 'x'.repeat(100) }, `Network "${'x'.repeat(56)}...: invalid CIDR: missing "/prefix-length"`, 'Network');
    });

    it('type-checks the fields of a disabled family too', () => {
      rejects({ Network: '10.0.0.0/16', IPv6Network: 'fd00::' }, 'IPv6Network "fd00::": invalid CIDR: missing "/prefix-length"', 'IPv6Network');
    });
  });

  describe('Network', () => {
    it('clears host bits with a warning, as Go net.ParseCIDR does silently', () => {
      const cfg = parse({ Network: '10.244.1.0/16' });
      assert.equal(cfg.network?.toString(), '10.244.0.0/16');
      assert.equal(cfg.subnetMin?.toString(), '10.244.1.0');
      assert.deepEqual(cfg.warnings, ['Network 10.244.1.0/16 has host bits set; using 10.244.0.0/16']);
    });

    it('clears host bits of IPv6Network with a warning', () => {
      const cfg = parse({ EnableIPv4: false, EnableIPv6: true, IPv6Network: 'fd00:1:2:3::/48' });
      assert.equal(cfg.ipv6Network?.toString(), 'fd00:1:2::/48');
      assert.deepEqual(cfg.warnings, ['IPv6Network fd00:1:2:3::/48 has host bits set; using fd00:1:2::/48']);
    });

    it('requires at least one family', () => {
      rejects(
        { EnableIPv4: false, Network: '10.0.0.0/8' },
        'EnableIPv4 and EnableIPv6 are both false: at least one family must be enabled',
        'EnableIPv4',
      );
    });

    it('requires Network when EnableIPv4 is true (the default)', () => {
      rejects({}, 'Network: required when EnableIPv4 is true', 'Network');
      rejects({ Backend: { Type: 'vxlan' } }, 'Network: required when EnableIPv4 is true', 'Network', KUBE);
    });

    it('requires IPv6Network when EnableIPv6 is true', () => {
      rejects({ Network: '10.0.0.0/8', EnableIPv6: true }, 'IPv6Network: required when EnableIPv6 is true', 'IPv6Network');
      rejects({ EnableIPv4: false, EnableIPv6: true }, 'IPv6Network: required when EnableIPv6 is true', 'IPv6Network', KUBE);
    });

    it('rejects a /0 Network in etcd mode (flannel reads it as "not configured")', () => {
      rejects({ Network: '0.0.0.0/0', SubnetLen: 24 }, 'Network 0.0.0.0/0: must not be the whole address space', 'Network');
    });
  });

  describe('SubnetLen (etcd mode)', () => {
    it('accepts 30 and rejects 31', () => {
      assert.equal(parse({ Network: '10.0.0.0/16', SubnetLen: 30 }).subnetLen, 30);
      rejects({ Network: '10.0.0.0/16', SubnetLen: 31 }, 'SubnetLen 31: must be at most 30', 'SubnetLen');
      rejects({ Network: '10.0.0.0/16', SubnetLen: 40 }, 'SubnetLen 40: must be at most 30', 'SubnetLen');
    });

    it('requires room for four subnets', () => {
      assert.deepEqual(v4(parse({ Network: '10.1.0.0/16', SubnetLen: 18 })), ['10.1.0.0/16', 18, '10.1.64.0', '10.1.192.0']);
      rejects(
        { Network: '10.1.0.0/16', SubnetLen: 17 },
        'SubnetLen 17: must be at least 18 (Network /16 must hold at least four subnets)',
        'SubnetLen',
      );
      rejects(
        { Network: '10.1.0.0/16', SubnetLen: 8 },
        'SubnetLen 8: must be at least 18 (Network /16 must hold at least four subnets)',
        'SubnetLen',
      );
    });

    it('treats SubnetLen 0 as unset, like flannel', () => {
      assert.equal(parse({ Network: '10.1.0.0/16', SubnetLen: 0 }).subnetLen, 24);
    });

    const defaults: Array<[string, number, string, string]> = [
      ['10.0.0.0/8', 24, '10.0.1.0', '10.255.255.0'],
      ['10.0.0.0/22', 24, '10.0.1.0', '10.0.3.0'],
      ['10.0.0.0/23', 25, '10.0.0.128', '10.0.1.128'],
      ['10.0.0.0/28', 30, '10.0.0.4', '10.0.0.12'],
    ];
    for (const [net, len, min, max] of defaults) {
      it(`defaults ${net} to /${len} subnets ${min}..${max}`, () => {
        assert.deepEqual(v4(parse({ Network: net })), [net, len, min, max]);
      });
    }

    it('rejects a network smaller than /28 without SubnetLen', () => {
      rejects({ Network: '10.0.0.0/29' }, 'Network 10.0.0.0/29: network is too small; the minimum useful prefix is /28', 'Network');
    });
  });

  describe('SubnetMin / SubnetMax (etcd mode)', () => {
    const base = { Network: '10.1.0.0/16' };

    it('keeps given bounds and defaults the other', () => {
      assert.deepEqual(v4(parse({ ...base, SubnetMin: '10.1.10.0' })), ['10.1.0.0/16', 24, '10.1.10.0', '10.1.255.0']);
      assert.deepEqual(v4(parse({ ...base, SubnetMax: '10.1.20.0' })), ['10.1.0.0/16', 24, '10.1.1.0', '10.1.20.0']);
      assert.deepEqual(v4(parse({ ...base, SubnetMin: '10.1.0.0', SubnetMax: '10.1.0.0' })), [
        '10.1.0.0/16',
        24,
        '10.1.0.0',
        '10.1.0.0',
      ]);
    });

    it('treats the zero address as unset, as flannel does', () => {
      assert.deepEqual(v4(parse({ ...base, SubnetMin: '0.0.0.0', SubnetMax: '0.0.0.0' })), [
        '10.1.0.0/16',
        24,
        '10.1.1.0',
        '10.1.255.0',
      ]);
    });

    it('requires bounds inside Network', () => {
      rejects({ ...base, SubnetMin: '10.0.255.0' }, 'SubnetMin 10.0.255.0: outside Network 10.1.0.0/16', 'SubnetMin');
      rejects({ ...base, SubnetMax: '10.2.0.0' }, 'SubnetMax 10.2.0.0: outside Network 10.1.0.0/16', 'SubnetMax');
    });

    it('requires bounds on a SubnetLen boundary', () => {
      rejects({ ...base, SubnetMin: '10.1.0.5' }, 'SubnetMin 10.1.0.5: not on a /24 boundary', 'SubnetMin');
      rejects({ ...base, SubnetLen: 20, SubnetMax: '10.1.8.0' }, 'SubnetMax 10.1.8.0: not on a /20 boundary', 'SubnetMax');
    });

    it('requires SubnetMin <= SubnetMax (weft addition)', () => {
      rejects(
        { ...base, SubnetMin: '10.1.9.0', SubnetMax: '10.1.2.0' },
        'SubnetMin 10.1.9.0 is above SubnetMax 10.1.2.0',
        'SubnetMin',
      );
      // A given max below the defaulted min.
      rejects({ ...base, SubnetMax: '10.1.0.0' }, 'SubnetMin 10.1.1.0 is above SubnetMax 10.1.0.0', 'SubnetMin');
    });
  });

  describe('IPv6', () => {
    const only6 = { EnableIPv4: false, EnableIPv6: true };

    it('parses an IPv6-only config', () => {
      const cfg = parse({ ...only6, IPv6Network: 'fd00:10::/56', Backend: { Type: 'host-gw' } });
      assert.equal(cfg.enableIPv4, false);
      assert.equal(cfg.enableIPv6, true);
      assert.deepEqual(v4(cfg), [null, 0, null, null]);
      assert.deepEqual(v6(cfg), ['fd00:10::/56', 64, 'fd00:10:0:1::', 'fd00:10:0:ff::']);
      assert.equal(cfg.backend.type, 'host-gw');
    });

    const defaults: Array<[string, number, string, string]> = [
      ['fd00::/62', 64, 'fd00:0:0:1::', 'fd00:0:0:3::'],
      ['fd00::/63', 65, 'fd00::8000:0:0:0', 'fd00:0:0:1:8000::'],
      ['fd00::/124', 126, 'fd00::4', 'fd00::c'],
    ];
    for (const [net, len, min, max] of defaults) {
      it(`defaults ${net} to /${len} subnets ${min}..${max}`, () => {
        assert.deepEqual(v6(parse({ ...only6, IPv6Network: net })), [net, len, min, max]);
      });
    }

    it('applies the IPv6 limits', () => {
      rejects(
        { ...only6, IPv6Network: 'fd00::/125' },
        'IPv6Network fd00::/125: network is too small; the minimum useful prefix is /124',
        'IPv6Network',
      );
      rejects({ ...only6, IPv6Network: 'fd00::/48', IPv6SubnetLen: 127 }, 'IPv6SubnetLen 127: must be at most 126', 'IPv6SubnetLen');
      rejects(
        { ...only6, IPv6Network: 'fd00::/48', IPv6SubnetLen: 49 },
        'IPv6SubnetLen 49: must be at least 50 (IPv6Network /48 must hold at least four subnets)',
        'IPv6SubnetLen',
      );
      rejects(
        { ...only6, IPv6Network: 'fd00::/48', IPv6SubnetMin: 'fd00:1::' },
        'IPv6SubnetMin fd00:1::: outside IPv6Network fd00::/48',
        'IPv6SubnetMin',
      );
      rejects(
        { ...only6, IPv6Network: 'fd00::/48', IPv6SubnetMax: 'fd00:0:0:5::1' },
        'IPv6SubnetMax fd00:0:0:5::1: not on a /64 boundary',
        'IPv6SubnetMax',
      );
      rejects(
        { ...only6, IPv6Network: 'fd00::/48', IPv6SubnetMin: 'fd00:0:0:9::', IPv6SubnetMax: 'fd00:0:0:2::' },
        'IPv6SubnetMin fd00:0:0:9:: is above IPv6SubnetMax fd00:0:0:2::',
        'IPv6SubnetMin',
      );
    });

    it('parses a dual-stack config', () => {
      const cfg = parse({
        Network: '10.42.0.0/16',
        EnableIPv6: true,
        IPv6Network: 'fd42::/48',
        IPv6SubnetLen: 56,
        Backend: { Type: 'vxlan' },
      });
      assert.equal(cfg.enableIPv4, true);
      assert.equal(cfg.enableIPv6, true);
      assert.deepEqual(v4(cfg), ['10.42.0.0/16', 24, '10.42.1.0', '10.42.255.0']);
      assert.deepEqual(v6(cfg), ['fd42::/48', 56, 'fd42:0:0:100::', 'fd42:0:0:ff00::']);
      assert.deepEqual(cfg.warnings, []);
    });

    it('drops the fields of a disabled family, with a warning', () => {
      const cfg = parse({ Network: '10.0.0.0/16', IPv6Network: 'fd00::/48', IPv6SubnetLen: 64 });
      assert.deepEqual(v6(cfg), [null, 0, null, null]);
      assert.deepEqual(cfg.warnings, ['IPv6Network, IPv6SubnetLen ignored because EnableIPv6 is false']);
      const cfg4 = parse({ EnableIPv4: false, EnableIPv6: true, IPv6Network: 'fd00::/48', Network: '10.0.0.0/16' });
      assert.deepEqual(v4(cfg4), [null, 0, null, null]);
      assert.deepEqual(cfg4.warnings, ['Network ignored because EnableIPv4 is false']);
    });
  });

  describe('kube mode (checkSubnets: false)', () => {
    it('applies no defaults', () => {
      const cfg = parse({ Network: '10.244.0.0/16', EnableNFTables: false, Backend: { Type: 'vxlan' } }, KUBE);
      assert.deepEqual(v4(cfg), ['10.244.0.0/16', 0, null, null]);
      assert.equal(subnetRange(cfg, 4), null);
    });

    it('keeps given values without range checks', () => {
      // Each of these fails in etcd mode.
      const cfg = parse({ Network: '10.0.0.0/29', SubnetLen: 31, SubnetMin: '10.9.0.5', SubnetMax: '10.0.0.0' }, KUBE);
      assert.deepEqual(v4(cfg), ['10.0.0.0/29', 31, '10.9.0.5', '10.0.0.0']);
      rejects({ Network: '10.0.0.0/29' }, 'Network 10.0.0.0/29: network is too small; the minimum useful prefix is /28', 'Network');
    });

    it('still rejects a SubnetLen wider than the address family', () => {
      rejects({ Network: '10.0.0.0/8', SubnetLen: 33 }, 'SubnetLen 33: must be at most 32', 'SubnetLen', KUBE);
      rejects(
        { EnableIPv6: true, Network: '10.0.0.0/8', IPv6Network: 'fd00::/48', IPv6SubnetLen: 129 },
        'IPv6SubnetLen 129: must be at most 128',
        'IPv6SubnetLen',
        KUBE,
      );
    });

    it('still checks types and the unknown backend', () => {
      rejects({ Network: '10.0.0.0/8', SubnetLen: '24' }, 'SubnetLen "24": must be an integer', 'SubnetLen', KUBE);
      rejects(
        { Network: '10.0.0.0/8', Backend: { Type: 'udp' } },
        'Backend.Type "udp": unknown backend type (known types: alloc, host-gw, vxlan)',
        'Backend.Type',
        KUBE,
      );
    });
  });

  describe('EnableNFTables', () => {
    it('defaults to false and reads true', () => {
      assert.equal(parse({ Network: '10.0.0.0/8' }).enableNFTables, false);
      assert.equal(parse({ Network: '10.0.0.0/8', EnableNFTables: true }).enableNFTables, true);
      assert.equal(parse({ Network: '10.0.0.0/8', enablenftables: false }).enableNFTables, false);
    });
  });

  describe('Backend', () => {
    it('defaults to vxlan when absent (flannel docs; flannel code says udp)', () => {
      assert.deepEqual(parse({ Network: '10.0.0.0/8' }).backend, { type: 'vxlan', options: {} });
    });

    it('fails when absent and vxlan is not available', () => {
      rejects(
        { Network: '10.0.0.0/8' },
        'Backend: not given, and the default type "vxlan" is not available (known types: alloc)',
        'Backend',
        { knownBackends: ['alloc'] },
      );
    });

    it('preserves the whole object as options', () => {
      const backend = { Type: 'vxlan', VNI: 4096, Port: 4789, GBP: false, DirectRouting: true, MacPrefix: '0E-2A', Extra: { a: [1, null] } };
      const cfg = parse({ Network: '10.0.0.0/8', Backend: backend });
      assert.equal(cfg.backend.type, 'vxlan');
      assert.deepEqual(cfg.backend.options, backend);
    });

    it('reads Type case-insensitively, the last one winning', () => {
      const cfg = parse('{"Network":"10.0.0.0/8","Backend":{"TYPE":"vxlan","type":"host-gw","Port":1}}');
      assert.equal(cfg.backend.type, 'host-gw');
      assert.deepEqual(cfg.backend.options, { TYPE: 'vxlan', type: 'host-gw', Port: 1 });
      const cfg2 = parse('{"Network":"10.0.0.0/8","Backend":{"Type":"vxlan","tYpe":"alloc","Type":"host-gw"}}');
      assert.equal(cfg2.backend.type, 'host-gw');
    });

    it('requires Type', () => {
      for (const backend of [{}, { VNI: 1 }, { Type: '' }, { Type: null }]) {
        rejects({ Network: '10.0.0.0/8', Backend: backend }, 'Backend.Type: required (known types: alloc, host-gw, vxlan)', 'Backend.Type');
      }
    });

    it('requires Type to be a string', () => {
      rejects({ Network: '10.0.0.0/8', Backend: { Type: 1 } }, 'Backend.Type 1: must be a string', 'Backend.Type');
    });

    it('rejects unknown types, listing the known ones sorted', () => {
      rejects(
        { Network: '10.0.0.0/8', Backend: { Type: 'foo' } },
        'Backend.Type "foo": unknown backend type (known types: alloc, host-gw, vxlan)',
        'Backend.Type',
      );
      // Registry names are exact, as in flannel.
      rejects(
        { Network: '10.0.0.0/8', Backend: { Type: 'VXLAN' } },
        'Backend.Type "VXLAN": unknown backend type (known types: alloc, host-gw, vxlan)',
        'Backend.Type',
      );
    });

    it("parses flannel's documented udp example when udp is known", () => {
      const cfg = parse(
        '{"Network":"10.0.0.0/8","SubnetLen":20,"SubnetMin":"10.10.0.0","SubnetMax":"10.99.0.0","Backend":{"Type":"udp","Port":7890}}',
        { knownBackends: ['udp', 'vxlan'] },
      );
      assert.deepEqual(v4(cfg), ['10.0.0.0/8', 20, '10.10.0.0', '10.99.0.0']);
      assert.deepEqual(cfg.backend, { type: 'udp', options: { Type: 'udp', Port: 7890 } });
    });
  });
});

describe('subnetRange', () => {
  it('returns the first and last allocatable subnets per family', () => {
    const cfg = parse({ Network: '10.3.0.0/16', EnableIPv6: true, IPv6Network: 'fc00::/48' });
    const r4 = subnetRange(cfg, 4);
    const r6 = subnetRange(cfg, 6);
    assert.equal(r4?.min.toString(), '10.3.1.0/24');
    assert.equal(r4?.max.toString(), '10.3.255.0/24');
    assert.equal(r6?.min.toString(), 'fc00:0:0:1::/64');
    assert.equal(r6?.max.toString(), 'fc00:0:0:ffff::/64');
  });

  it('returns null for a disabled family', () => {
    const cfg = parse({ Network: '10.3.0.0/16' });
    assert.equal(subnetRange(cfg, 6), null);
    const cfg6 = parse({ EnableIPv4: false, EnableIPv6: true, IPv6Network: 'fc00::/48' });
    assert.equal(subnetRange(cfg6, 4), null);
  });

  it('uses given bounds in kube mode when all are set', () => {
    const cfg = parse({ Network: '10.3.0.0/16', SubnetLen: 26, SubnetMin: '10.3.0.64', SubnetMax: '10.3.1.0' }, KUBE);
    assert.equal(subnetRange(cfg, 4)?.min.toString(), '10.3.0.64/26');
    assert.equal(subnetRange(cfg, 4)?.max.toString(), '10.3.1.0/26');
  });
});
