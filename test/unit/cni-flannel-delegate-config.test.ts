import assert from 'node:assert/strict';

import {
  buildDelegateConfig,
  DEFAULT_DATA_DIR,
  DEFAULT_SUBNET_FILE,
  FlannelConfigError,
  goJson,
  OrderedFields,
  parseDataDir,
  parseFlannelNetConf,
  renderDelegateConfig,
} from '../../cni-plugins/flannel/delegate-config.js';
import { parseSubnetEnv, requireSubnetEnv, type SubnetEnv } from '../../src/subnetenv/format.js';

const parseFlannelSubnetEnv = (text: string, file: string): SubnetEnv => requireSubnetEnv(parseSubnetEnv(text), file);

const V4_ENV = parseFlannelSubnetEnv(
  'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
  'subnet.env',
);
const V6_ENV = parseFlannelSubnetEnv(
  'FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
  'subnet.env',
);
const DUAL_ENV = parseFlannelSubnetEnv(
  'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\n' +
    'FLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
  'subnet.env',
);

function render(conf: Record<string, unknown>, env: SubnetEnv): string {
  return renderDelegateConfig(buildDelegateConfig(parseFlannelNetConf(conf), env));
}

function configError(conf: unknown): FlannelConfigError {
  try {
    parseFlannelNetConf(conf);
  } catch (e) {
    assert.ok(e instanceof FlannelConfigError, `expected FlannelConfigError, got ${String(e)}`);
    return e;
  }
  assert.fail('expected parseFlannelNetConf to throw');
}

describe('flannel CNI: delegate config', () => {
  // Golden strings: what Go's json.Marshal prints for flannel's map[string]interface{} (sorted
  // keys, compact). The semantic content is flannel_linux_test.go's expected JSON.
  it('IPv4: bridge, isGateway, ipMasq = !FLANNEL_IPMASQ, mtu, host-local range and network route', () => {
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'cni-flannel', type: 'flannel' }, V4_ENV),
      '{"cniVersion":"1.0.0","ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],' +
        '"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},"isGateway":true,"mtu":1472,' +
        '"name":"cni-flannel","type":"bridge"}',
    );
  });

  it("no cniVersion in the request: flannel_linux_test.go's expected config, in Go's compact form", () => {
    const out = render({ name: 'cni-flannel', type: 'flannel', subnetFile: '/x', dataDir: '/y' }, V4_ENV);
    assert.equal(
      out,
      '{"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],"routes":[{"dst":"10.1.0.0/16"}],' +
        '"type":"host-local"},"isGateway":true,"mtu":1472,"name":"cni-flannel","type":"bridge"}',
    );
  });

  it('IPv6 only', () => {
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'cni-flannel', type: 'flannel' }, V6_ENV),
      '{"cniVersion":"1.0.0","ipMasq":false,"ipam":{"ranges":[[{"subnet":"fc00::/64"}]],' +
        '"routes":[{"dst":"fc00::/48"}],"type":"host-local"},"isGateway":true,"mtu":1472,' +
        '"name":"cni-flannel","type":"bridge"}',
    );
  });

  it('dual stack: one range set per family, v4 first; routes for both networks', () => {
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'cni-flannel', type: 'flannel' }, DUAL_ENV),
      '{"cniVersion":"1.0.0","ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}],' +
        '[{"subnet":"fc00::/64"}]],"routes":[{"dst":"10.1.0.0/16"},{"dst":"fc00::/48"}],' +
        '"type":"host-local"},"isGateway":true,"mtu":1472,"name":"cni-flannel","type":"bridge"}',
    );
  });

  it('several FLANNEL_NETWORK entries become several routes', () => {
    const env = parseFlannelSubnetEnv(
      'FLANNEL_NETWORK=10.1.0.0/16,192.168.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
      'f',
    );
    const out = JSON.parse(render({ cniVersion: '1.0.0', name: 'n', type: 'flannel' }, env)) as {
      ipam: { routes: unknown };
    };
    assert.deepEqual(out.ipam.routes, [{ dst: '10.1.0.0/16' }, { dst: '192.168.0.0/16' }]);
  });

  it('the usual k8s conflist: delegate overrides, runtimeConfig and an ipam base are carried over', () => {
    const out = render(
      {
        cniVersion: '1.0.0',
        name: 'cbr0',
        type: 'flannel',
        delegate: { hairpinMode: true, isDefaultGateway: true },
        runtimeConfig: { portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }] },
        ipam: {
          type: 'my-ipam',
          'unknown-param': 'unknown-value',
          ranges: [[{ subnet: '172.16.0.0/24' }]],
          routes: [{ dst: '10.96.0.0/12' }, { dst: '192.168.244.0/24', gw: '10.1.17.20' }],
        },
        // keys flannel does not forward
        capabilities: { portMappings: true },
        args: { cni: { ips: ['10.1.17.9'] } },
        dns: { nameservers: ['10.96.0.10'] },
      },
      V4_ENV,
    );
    assert.equal(
      out,
      '{"cniVersion":"1.0.0","hairpinMode":true,"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],' +
        '"routes":[{"dst":"10.96.0.0/12"},{"dst":"192.168.244.0/24","gw":"10.1.17.20"},{"dst":"10.1.0.0/16"}],' +
        '"type":"my-ipam","unknown-param":"unknown-value"},"isDefaultGateway":true,"isGateway":true,"mtu":1472,' +
        '"name":"cbr0","runtimeConfig":{"portMappings":[{"containerPort":80,"hostPort":8080,"protocol":"tcp"}]},' +
        '"type":"bridge"}',
    );
  });

  it("the delegate's own ipMasq, mtu, isGateway and bridge win over the defaults", () => {
    const out = render(
      {
        cniVersion: '0.3.1',
        name: 'n',
        type: 'flannel',
        delegate: { ipMasq: true, mtu: 1400, isGateway: false, bridge: 'weft0', hairpinMode: false },
      },
      V4_ENV,
    );
    assert.equal(
      out,
      '{"bridge":"weft0","cniVersion":"0.3.1","hairpinMode":false,"ipMasq":true,"ipam":{"ranges":' +
        '[[{"subnet":"10.1.17.0/24"}]],"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},"isGateway":false,' +
        '"mtu":1400,"name":"n","type":"bridge"}',
    );
  });

  it('a non-bridge delegate gets no isGateway; FLANNEL_IPMASQ=false turns ipMasq on', () => {
    const env = parseFlannelSubnetEnv(
      'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n',
      'f',
    );
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'n', type: 'flannel', delegate: { type: 'ipvlan', master: 'eth0' } }, env),
      '{"cniVersion":"1.0.0","ipMasq":true,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],' +
        '"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},"master":"eth0","mtu":1450,"name":"n","type":"ipvlan"}',
    );
  });

  it('runtimeConfig replaces a delegate.runtimeConfig; an empty one is still forwarded', () => {
    const d = buildDelegateConfig(
      parseFlannelNetConf({ cniVersion: '1.0.0', name: 'n', delegate: { runtimeConfig: { a: 1 } }, runtimeConfig: {} }),
      V4_ENV,
    );
    assert.deepEqual(d.runtimeConfig, {});
  });

  it('ipam.routes are re-encoded as cni types.Route: struct field order, host bits kept, zero ints omitted', () => {
    const out = JSON.parse(
      render(
        {
          cniVersion: '1.1.0',
          name: 'n',
          ipam: {
            routes: [
              { scope: 0, table: 100, priority: 0, advmss: 1400, mtu: 1300, gw: '10.1.17.1', dst: '10.96.0.5/12', x: 1 },
              { dst: '2001:DB8:0:0::/64', gw: null },
            ],
          },
        },
        V4_ENV,
      ),
    ) as { ipam: { routes: Record<string, unknown>[] } };
    assert.deepEqual(out.ipam.routes, [
      { dst: '10.96.0.5/12', gw: '10.1.17.1', mtu: 1300, advmss: 1400, table: 100, scope: 0 },
      { dst: '2001:db8::/64' },
      { dst: '10.1.0.0/16' },
    ]);
    assert.deepEqual(Object.keys(out.ipam.routes[0]!), ['dst', 'gw', 'mtu', 'advmss', 'table', 'scope']);
  });

  it('defaults subnetFile and dataDir (also for empty strings)', () => {
    const c = parseFlannelNetConf({ name: 'n', type: 'flannel', subnetFile: '' });
    assert.equal(c.subnetFile, DEFAULT_SUBNET_FILE);
    assert.equal(c.dataDir, DEFAULT_DATA_DIR);
    assert.equal(DEFAULT_SUBNET_FILE, '/run/flannel/subnet.env');
    assert.equal(DEFAULT_DATA_DIR, '/var/lib/cni/flannel');
    assert.equal(parseFlannelNetConf({ name: 'n', subnetFile: '/a', dataDir: '/b' }).dataDir, '/b');
    assert.equal(parseDataDir({ dataDir: '/b', delegate: 'not validated here' }), '/b');
    assert.equal(parseDataDir({}), DEFAULT_DATA_DIR);
  });

  it("rejects delegate keys flannel rejects, with flannel's messages", () => {
    assert.equal(
      configError({ name: 'n', delegate: { name: 'x' } }).message,
      "'delegate' dictionary must not have 'name' field, it'll be set by flannel",
    );
    assert.equal(
      configError({ name: 'n', delegate: { ipam: {} } }).message,
      "'delegate' dictionary must not have 'ipam' field, it'll be set by flannel",
    );
    assert.equal(
      configError({ name: 'n', delegate: { type: 5 } }).message,
      "'delegate' dictionary, if present, must have (string) 'type' field",
    );
  });

  it('rejects wrongly typed keys naming the key', () => {
    assert.equal(configError({ name: 'n', delegate: [] }).key, 'delegate');
    assert.equal(configError({ name: 'n', ipam: 'host-local' }).message, `'ipam' must be an object, got "host-local"`);
    assert.equal(configError({ name: 'n', runtimeConfig: 1 }).key, 'runtimeConfig');
    assert.equal(configError({ name: 'n', dataDir: 7 }).message, "'dataDir' must be a string path, got 7");
    assert.equal(configError({ name: 'n', ipam: { routes: {} } }).message, 'failed to parse ipam.routes: not an array');
    assert.equal(
      configError({ name: 'n', ipam: { routes: [{ dst: '10.0.0.0/8' }, { gw: '10.0.0.1' }] } }).message,
      "failed to parse ipam.routes[1]: 'dst' must be a CIDR, got null",
    );
    assert.equal(
      configError({ name: 'n', ipam: { routes: [{ dst: '10.0.0.0/8', mtu: 1.5 }] } }).message,
      "failed to parse ipam.routes[0]: 'mtu' must be an integer",
    );
    assert.equal(configError({ type: 'flannel' }).key, 'name');
  });
});

describe('flannel CNI: Go-compatible JSON rendering', () => {
  it('sorts object keys by code point and keeps struct field order', () => {
    assert.equal(goJson({ b: 1, a: [true, null], A: { z: 'x', y: 'w' } }), '{"A":{"y":"w","z":"x"},"a":[true,null],"b":1}');
    assert.equal(goJson(new OrderedFields([['z', 1], ['a', 2]])), '{"z":1,"a":2}');
    // U+FFFF sorts before U+10000 in UTF-8 but after it in UTF-16 units.
    assert.equal(goJson({ '\u{10000}': 1, '\uffff': 2 }), '{"\uffff":2,"\u{10000}":1}');
  });

  it("escapes like Go's encoder (HTML-safe, line separators, control characters)", () => {
    assert.equal(goJson('<a&b>'), '"\\u003ca\\u0026b\\u003e"');
    assert.equal(goJson('x\u2028y\u2029'), '"x\\u2028y\\u2029"');
    assert.equal(goJson('"\\\n\r\t\b\f\u0001'), '"\\"\\\\\\n\\r\\t\\b\\f\\u0001"');
    assert.equal(goJson('\ud800x'), '"\ufffdx"');
    assert.equal(goJson('é😀'), '"é😀"');
  });

  it('formats numbers as Go formats float64', () => {
    assert.equal(goJson([1472, 1.5, 1e21, 1e-7, 0.000001, -0, 123456789012]), '[1472,1.5,1e+21,1e-7,0.000001,-0,123456789012]');
  });
});

describe('flannel CNI: delegate config on a weftd ovs node (WEFT_BACKEND=ovs)', () => {
  const OVS_ENV = parseFlannelSubnetEnv(
    'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n' +
      'WEFT_BACKEND=ovs\nWEFT_OVS_BRIDGE=br-int\nWEFT_OVS_RUNDIR=/var/run/openvswitch\nWEFT_OVS_DATAPATH=netdev\n',
    'subnet.env',
  );

  it('weft-ovs with bridge, run dir, datapath and FLANNEL_MTU from subnet.env; no ipMasq, no isGateway', () => {
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'cbr0', type: 'flannel', delegate: { hairpinMode: true, isDefaultGateway: true } }, OVS_ENV),
      '{"bridge":"br-int","cniVersion":"1.0.0","datapathType":"netdev","hairpinMode":true,"ipam":{"ranges":' +
        '[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},' +
        '"isDefaultGateway":true,"mtu":1450,"name":"cbr0","ovsRunDir":"/var/run/openvswitch","type":"weft-ovs"}',
    );
  });

  it("the user's keys win; OVS keys missing from subnet.env are left to the plugin's defaults", () => {
    const env = parseFlannelSubnetEnv(
      'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\nWEFT_BACKEND=ovs\n',
      'subnet.env',
    );
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'n', type: 'flannel', delegate: { mtu: 1400, bridge: 'br-pods' } }, env),
      '{"bridge":"br-pods","cniVersion":"1.0.0","ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],' +
        '"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},"mtu":1400,"name":"n","type":"weft-ovs"}',
    );
  });

  it('a delegate that names its type keeps flannel’s behaviour (bridge gets isGateway and ipMasq)', () => {
    assert.equal(
      render({ cniVersion: '1.0.0', name: 'n', type: 'flannel', delegate: { type: 'bridge' } }, OVS_ENV),
      '{"cniVersion":"1.0.0","ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],' +
        '"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},"isGateway":true,"mtu":1450,"name":"n","type":"bridge"}',
    );
  });

  it('another backend’s WEFT_BACKEND leaves the bridge delegate', () => {
    const env = parseFlannelSubnetEnv(
      'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\nWEFT_BACKEND=vxlan\nWEFT_OVS_BRIDGE=br-int\n',
      'subnet.env',
    );
    const out = JSON.parse(render({ cniVersion: '1.0.0', name: 'n', type: 'flannel' }, env)) as Record<string, unknown>;
    assert.equal(out.type, 'bridge');
    assert.equal(out.bridge, undefined);
    assert.equal(out.isGateway, true);
  });
});
