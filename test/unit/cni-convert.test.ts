// Result conversion between CNI spec versions (cni-plugins/skel/convert.ts), checked against the
// shapes the reference library prints (pkg/types/040 and 100).
import assert from 'node:assert/strict';
import { CniResultError, convertResult, formatResult, goJSON, parseResult } from '../../cni-plugins/skel/convert.js';
import { SUPPORTED_VERSIONS, type CniResult } from '../../cni-plugins/skel/types.js';

// One bridge-like result in the 1.1.0 shape, using every field.
const FULL: CniResult = {
  cniVersion: '1.1.0',
  interfaces: [
    { name: 'cni0', mac: '0a:58:0a:f4:00:01', mtu: 1450 },
    { name: 'veth1234', mac: '5e:11:22:33:44:55', socketPath: '/run/vhost.sock' },
    { name: 'eth0', mac: '0a:58:0a:f4:00:05', sandbox: '/run/netns/pod', pciID: '0000:04:00.5' },
  ],
  ips: [
    { interface: 2, address: '10.244.0.5/24', gateway: '10.244.0.1' },
    { interface: 2, address: '2001:db8::5/64', gateway: '2001:db8::1' },
  ],
  routes: [
    { dst: '0.0.0.0/0', gw: '10.244.0.1', mtu: 1400, advmss: 1360, priority: 10, table: 0, scope: 0 },
    { dst: '::/0' },
  ],
  dns: { nameservers: ['10.96.0.10'], domain: 'cluster.local', search: ['svc.cluster.local'], options: ['ndots:5'] },
};

// FULL as a 0.3.x/0.4.0 result: ips[].version added, interface mtu/socketPath/pciID gone.
function as04(version: string): Record<string, unknown> {
  return {
    cniVersion: version,
    interfaces: [
      { name: 'cni0', mac: '0a:58:0a:f4:00:01' },
      { name: 'veth1234', mac: '5e:11:22:33:44:55' },
      { name: 'eth0', mac: '0a:58:0a:f4:00:05', sandbox: '/run/netns/pod' },
    ],
    ips: [
      { version: '4', interface: 2, address: '10.244.0.5/24', gateway: '10.244.0.1' },
      { version: '6', interface: 2, address: '2001:db8::5/64', gateway: '2001:db8::1' },
    ],
    routes: [{ dst: '0.0.0.0/0', gw: '10.244.0.1', mtu: 1400, advmss: 1360, priority: 10, table: 0, scope: 0 }, { dst: '::/0' }],
    dns: { nameservers: ['10.96.0.10'], domain: 'cluster.local', search: ['svc.cluster.local'], options: ['ndots:5'] },
  };
}

function as1x(version: string): Record<string, unknown> {
  return {
    cniVersion: version,
    interfaces: [
      { name: 'cni0', mac: '0a:58:0a:f4:00:01', mtu: 1450 },
      { name: 'veth1234', mac: '5e:11:22:33:44:55', socketPath: '/run/vhost.sock' },
      { name: 'eth0', mac: '0a:58:0a:f4:00:05', sandbox: '/run/netns/pod', pciID: '0000:04:00.5' },
    ],
    ips: [
      { interface: 2, address: '10.244.0.5/24', gateway: '10.244.0.1' },
      { interface: 2, address: '2001:db8::5/64', gateway: '2001:db8::1' },
    ],
    routes: [{ dst: '0.0.0.0/0', gw: '10.244.0.1', mtu: 1400, advmss: 1360, priority: 10, table: 0, scope: 0 }, { dst: '::/0' }],
    dns: { nameservers: ['10.96.0.10'], domain: 'cluster.local', search: ['svc.cluster.local'], options: ['ndots:5'] },
  };
}

const PRE = ['0.3.0', '0.3.1', '0.4.0'];
const shapeOf = (v: string): Record<string, unknown> => (PRE.includes(v) ? as04(v) : as1x(v));

describe('cni convert', () => {
  describe('convertResult from the 1.1.0 shape', () => {
    for (const v of SUPPORTED_VERSIONS) {
      it(`prints ${v} in the reference shape and field order`, () => {
        // JSON.stringify compares key order too.
        assert.equal(JSON.stringify(convertResult(FULL, v)), JSON.stringify(shapeOf(v)));
      });
    }

    it('prints an empty dns as {} for 0.x and leaves it out for 1.x', () => {
      const r: CniResult = { cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/16', gateway: '10.1.0.1' }] };
      assert.deepEqual(convertResult(r, '0.4.0'), {
        cniVersion: '0.4.0',
        ips: [{ version: '4', address: '10.1.0.5/16', gateway: '10.1.0.1' }],
        dns: {},
      });
      assert.deepEqual(convertResult(r, '1.0.0'), { cniVersion: '1.0.0', ips: [{ address: '10.1.0.5/16', gateway: '10.1.0.1' }] });
      assert.deepEqual(convertResult({ ...r, dns: { nameservers: [] } }, '1.1.0'), {
        cniVersion: '1.1.0',
        ips: [{ address: '10.1.0.5/16', gateway: '10.1.0.1' }],
      });
    });

    it('leaves out empty lists and zero values (Go omitempty) but keeps table/scope 0', () => {
      const r: CniResult = {
        cniVersion: '1.1.0',
        interfaces: [],
        ips: [{ address: '10.1.0.5/16' }],
        routes: [{ dst: '10.2.0.0/16', gw: '', mtu: 0, priority: 0, table: 0 }],
      };
      assert.deepEqual(convertResult(r, '1.1.0'), {
        cniVersion: '1.1.0',
        ips: [{ address: '10.1.0.5/16' }],
        routes: [{ dst: '10.2.0.0/16', table: 0 }],
      });
    });

    it('rejects versions it does not speak', () => {
      for (const v of ['0.1.0', '0.2.0', '1.2.0', '']) {
        assert.throws(() => convertResult(FULL, v), (e: unknown) => e instanceof CniResultError && e.field === 'cniVersion');
      }
    });

    it('formats like Go MarshalIndent: 4 spaces, no trailing newline', () => {
      const r: CniResult = { cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/16', gateway: '10.1.0.1' }], routes: [{ dst: '0.0.0.0/0' }] };
      assert.equal(
        formatResult(r, '0.3.1'),
        '{\n    "cniVersion": "0.3.1",\n    "ips": [\n        {\n            "version": "4",\n            "address": "10.1.0.5/16",\n' +
          '            "gateway": "10.1.0.1"\n        }\n    ],\n    "routes": [\n        {\n            "dst": "0.0.0.0/0"\n' +
          '        }\n    ],\n    "dns": {}\n}',
      );
    });

    it('escapes <, >, & and U+2028/2029 as Go does', () => {
      assert.equal(goJSON({ msg: 'a<b>&c\u2028' }, 0), '{"msg":"a\\u003cb\\u003e\\u0026c\\u2028"}');
      assert.equal(goJSON({ a: [1] }), '{\n    "a": [\n        1\n    ]\n}');
    });
  });

  describe('parseResult into the 1.1.0 shape', () => {
    for (const from of SUPPORTED_VERSIONS) {
      for (const to of SUPPORTED_VERSIONS) {
        it(`${from} → ${to}`, () => {
          const parsed = parseResult(shapeOf(from), '1.1.0');
          assert.equal(parsed.cniVersion, '1.1.0');
          const expected = PRE.includes(from) && !PRE.includes(to) ? as1xWithout04Loss(to) : shapeOf(to);
          assert.equal(JSON.stringify(convertResult(parsed, to)), JSON.stringify(expected));
        });
      }
    }

    it('drops interface mtu/socketPath/pciID from 0.x input (the 0.4 type has no such fields)', () => {
      const r = parseResult({ cniVersion: '0.4.0', interfaces: [{ name: 'eth0', mtu: 1400, socketPath: '/s', pciID: 'x' }] }, '0.4.0');
      assert.deepEqual(r, { cniVersion: '1.1.0', interfaces: [{ name: 'eth0' }] });
    });

    it('takes the default version when the result has none (the reference injects the config version)', () => {
      assert.deepEqual(parseResult({ interfaces: [{ name: 'eth0', mtu: 9000 }] }, '1.0.0'), {
        cniVersion: '1.1.0',
        interfaces: [{ name: 'eth0', mtu: 9000 }],
      });
      assert.deepEqual(parseResult({ cniVersion: '', interfaces: [{ name: 'eth0', mtu: 9000 }] }, '0.4.0'), {
        cniVersion: '1.1.0',
        interfaces: [{ name: 'eth0' }],
      });
      assert.deepEqual(parseResult({}, '1.1.0'), { cniVersion: '1.1.0' });
    });

    it('normalises addresses to Go text form and keeps host bits', () => {
      const r = parseResult(
        {
          cniVersion: '1.0.0',
          ips: [{ address: '2001:DB8:0:0::5/64', gateway: '2001:db8:0::1' }],
          routes: [{ dst: '10.1.2.3/8', gw: '10.0.0.1' }],
        },
        '1.0.0',
      );
      assert.deepEqual(r.ips, [{ address: '2001:db8::5/64', gateway: '2001:db8::1' }]);
      assert.deepEqual(r.routes, [{ dst: '10.1.2.3/8', gw: '10.0.0.1' }]);
    });

    it('ignores the 0.x version field (the address decides) and drops zero values', () => {
      const r = parseResult(
        {
          cniVersion: '0.3.1',
          interfaces: [{ name: 'eth0', mac: '' }],
          ips: [{ version: '6', address: '10.0.0.2/8', gateway: '' }],
          dns: { nameservers: [], domain: '' },
        },
        '0.3.1',
      );
      assert.deepEqual(r, { cniVersion: '1.1.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '10.0.0.2/8' }] });
      assert.deepEqual((convertResult(r, '0.4.0').ips as unknown[])[0], { version: '4', address: '10.0.0.2/8' });
    });

    const bad: Array<[string, unknown, string]> = [
      ['not an object', [], 'expected a JSON object, got array'],
      ['null', null, 'expected a JSON object, got null'],
      ['0.2.0 result', { cniVersion: '0.2.0', ip4: { ip: '10.0.0.2/8' } }, 'cniVersion: unsupported CNI result version "0.2.0"'],
      ['unknown version', { cniVersion: '2.0.0' }, 'cniVersion: unsupported CNI result version "2.0.0"'],
      ['numeric version', { cniVersion: 1 }, 'cniVersion: expected a string, got number'],
      ['interfaces not a list', { interfaces: {} }, 'interfaces: expected a list, got object'],
      ['null interface', { interfaces: [null] }, 'interfaces[0]: expected an object, got null'],
      ['address missing', { ips: [{ gateway: '10.0.0.1' }] }, 'ips[0].address: missing'],
      ['address without prefix', { ips: [{ address: '10.0.0.2' }] }, 'ips[0].address: invalid CIDR address: invalid CIDR "10.0.0.2": missing "/prefix-length"'],
      ['bad gateway', { ips: [{ address: '10.0.0.2/8', gateway: '10.0.0.300' }] }, 'ips[0].gateway: invalid IP address "10.0.0.300": bad octet "300"'],
      ['negative index', { ips: [{ interface: -1, address: '10.0.0.2/8' }] }, 'ips[0].interface: negative interface index -1'],
      ['fractional mtu', { interfaces: [{ name: 'eth0', mtu: 1.5 }] }, 'interfaces[0].mtu: expected an integer, got 1.5'],
      ['bad route dst', { routes: [{ dst: 'default' }] }, 'routes[0].dst: invalid CIDR address: invalid CIDR "default": missing "/prefix-length"'],
      ['route table string', { routes: [{ dst: '0.0.0.0/0', table: '5' }] }, 'routes[0].table: expected an integer, got "5"'],
      ['dns not an object', { dns: 'x' }, 'dns: expected an object, got string'],
      ['dns search not strings', { dns: { search: [1] } }, 'dns.search: expected a list of strings'],
    ];
    for (const [label, raw, msg] of bad) {
      it(`rejects ${label}`, () => {
        assert.throws(() => parseResult(raw, '1.1.0'), (e: unknown) => e instanceof CniResultError && e.message === msg);
      });
    }
  });
});

// A 0.x input converted to 1.x: the 0.x type never had the interface mtu/socketPath/pciID.
function as1xWithout04Loss(version: string): Record<string, unknown> {
  const r = as1x(version);
  r.interfaces = [
    { name: 'cni0', mac: '0a:58:0a:f4:00:01' },
    { name: 'veth1234', mac: '5e:11:22:33:44:55' },
    { name: 'eth0', mac: '0a:58:0a:f4:00:05', sandbox: '/run/netns/pod' },
  ];
  return r;
}
