import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { NO_WEFT_LINES, parseSubnetEnv, renderSubnetEnv, requireSubnetEnv, SubnetEnvError, type SubnetEnv } from '../../src/subnetenv/format.js';
import { loadSubnetEnv as loadFlannelSubnetEnv } from '../../src/subnetenv/read.js';
import { IPNet } from '../../src/util/ip.js';

const FILE = '/run/flannel/subnet.env';

/** The CNI plugin's reading (flannel.go loadFlannelSubnetEnv). */
const parseFlannelSubnetEnv = (text: string, file: string): SubnetEnv => requireSubnetEnv(parseSubnetEnv(text), file);

/** The parsed env in plain strings, for exact comparisons. */
function plain(env: SubnetEnv): Record<string, unknown> {
  return {
    networks: env.networks.map(String),
    subnet: env.subnet?.toString() ?? null,
    ipv6Networks: env.ipv6Networks.map(String),
    ipv6Subnet: env.ipv6Subnet?.toString() ?? null,
    mtu: env.mtu,
    ipMasq: env.ipMasq,
  };
}

function parseError(text: string): SubnetEnvError {
  try {
    parseFlannelSubnetEnv(text, FILE);
  } catch (e) {
    assert.ok(e instanceof SubnetEnvError, `expected SubnetEnvError, got ${String(e)}`);
    return e;
  }
  assert.fail('expected parseFlannelSubnetEnv to throw');
}

describe('subnet.env: the CNI plugin\'s reading', () => {
  it('parses an IPv4 file (flannel test fixture); the subnet becomes its network', () => {
    const env = parseFlannelSubnetEnv(
      '\nFLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
      FILE,
    );
    assert.deepEqual(plain(env), {
      networks: ['10.1.0.0/16'],
      subnet: '10.1.17.0/24',
      ipv6Networks: [],
      ipv6Subnet: null,
      mtu: 1472,
      ipMasq: true,
    });
  });

  it('parses an IPv6-only file', () => {
    const env = parseFlannelSubnetEnv(
      'FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n',
      FILE,
    );
    assert.deepEqual(plain(env), {
      networks: [],
      subnet: null,
      ipv6Networks: ['fc00::/48'],
      ipv6Subnet: 'fc00::/64',
      mtu: 1472,
      ipMasq: false,
    });
  });

  it('parses a dual-stack file written by weftd (renderSubnetEnv round trip)', () => {
    const text = renderSubnetEnv({
      networks: [IPNet.parse('10.42.0.0/16')],
      subnet: IPNet.parse('10.42.7.0/24'),
      ipv6Networks: [IPNet.parse('2001:cafe:42::/56')],
      ipv6Subnet: IPNet.parse('2001:cafe:42:7::/64'),
      mtu: 1450,
      ipMasq: true,
      weft: NO_WEFT_LINES,
    });
    assert.deepEqual(plain(parseFlannelSubnetEnv(text, FILE)), {
      networks: ['10.42.0.0/16'],
      subnet: '10.42.7.0/24',
      ipv6Networks: ['2001:cafe:42::/56'],
      ipv6Subnet: '2001:cafe:42:7::/64',
      mtu: 1450,
      ipMasq: true,
    });
  });

  it('splits FLANNEL_NETWORK on commas and drops duplicates, keeping file order', () => {
    const env = parseFlannelSubnetEnv(
      'FLANNEL_NETWORK=10.1.0.0/16,192.168.0.0/16,10.1.0.5/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
      FILE,
    );
    assert.deepEqual(env.networks.map(String), ['10.1.0.0/16', '192.168.0.0/16']);
  });

  it('takes the last of repeated keys, ignores unknown lines and CRLF endings', () => {
    const env = parseFlannelSubnetEnv(
      '# comment\r\nFOO=bar\r\nFLANNEL_MTU=1500\r\nFLANNEL_NETWORK=10.1.0.0/16\r\nFLANNEL_SUBNET=10.1.17.1/24\r\n' +
        'FLANNEL_MTU=1400\r\nFLANNEL_IPMASQ=TRUE\r\n',
      FILE,
    );
    assert.equal(env.mtu, 1400);
    // flannel compares with == "true": anything else is false.
    assert.equal(env.ipMasq, false);
  });

  it('names every missing variable in flannel\'s wording', () => {
    const e = parseError('FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPMASQ=true\n');
    assert.equal(e.message, `${FILE} is missing FLANNEL_MTU`);
    assert.deepEqual(e.variables, ['FLANNEL_MTU']);
    assert.equal(e.problem, 'invalid');
    assert.equal(e.file, FILE);

    const empty = parseError('');
    assert.equal(
      empty.message,
      `${FILE} is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ`,
    );
  });

  it('rejects a bad CIDR naming the variable and the value', () => {
    const e = parseError('FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/33\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n');
    assert.equal(e.message, `${FILE}: FLANNEL_SUBNET has an invalid CIDR "10.1.17.1/33"`);
    assert.deepEqual(e.variables, ['FLANNEL_SUBNET']);

    const list = parseError('FLANNEL_NETWORK=10.1.0.0/16,nonsense\n');
    assert.equal(list.message, `${FILE}: FLANNEL_NETWORK has an invalid CIDR "nonsense"`);

    const emptyValue = parseError('FLANNEL_IPV6_SUBNET=\n');
    assert.equal(emptyValue.message, `${FILE}: FLANNEL_IPV6_SUBNET has an invalid CIDR ""`);
  });

  it('rejects a prefix of the wrong family', () => {
    const e = parseError('FLANNEL_IPV6_NETWORK=10.1.0.0/16\n');
    assert.equal(e.message, `${FILE}: FLANNEL_IPV6_NETWORK must be an IPv6 CIDR, got "10.1.0.0/16"`);
    const v4 = parseError('FLANNEL_SUBNET=fc00::1/64\n');
    assert.equal(v4.message, `${FILE}: FLANNEL_SUBNET must be an IPv4 CIDR, got "fc00::1/64"`);
  });

  it('rejects an MTU that is not an unsigned 32-bit integer', () => {
    for (const bad of ['-1', '1450.5', 'abc', '', '4294967296']) {
      const e = parseError(`FLANNEL_MTU=${bad}\n`);
      assert.equal(e.message, `${FILE}: FLANNEL_MTU must be an unsigned integer, got "${bad}"`);
      assert.deepEqual(e.variables, ['FLANNEL_MTU']);
    }
  });
});

describe('subnet.env: the CNI plugin\'s load from disk', () => {
  let dir = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'wt-flannel-env-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads a file from disk', async () => {
    const file = join(dir, 'subnet.env');
    await writeFile(file, 'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n');
    const env = await loadFlannelSubnetEnv(file);
    assert.equal(env.subnet?.toString(), '10.1.17.0/24');
    assert.equal(env.mtu, 1450);
  });

  it('a missing file says weftd/flanneld is not ready', async () => {
    const file = join(dir, 'nope', 'subnet.env');
    await assert.rejects(loadFlannelSubnetEnv(file), (e: unknown) => {
      assert.ok(e instanceof SubnetEnvError);
      assert.equal(e.problem, 'missing');
      assert.equal(e.file, file);
      assert.equal(
        e.message,
        `subnet file ${file} does not exist: weftd (flanneld) has not started or has not acquired a subnet lease ` +
          'on this node yet; check the weftd/flannel log for this node',
      );
      return true;
    });
  });

  it('an unreadable path (a directory) is an I/O problem, not "missing"', async () => {
    await assert.rejects(loadFlannelSubnetEnv(dir), (e: unknown) => {
      assert.ok(e instanceof SubnetEnvError);
      assert.equal(e.problem, 'unreadable');
      assert.match(e.message, new RegExp(`^cannot read subnet file ${dir}: EISDIR`));
      return true;
    });
  });
});

describe('flannel CNI: subnet.env WEFT_* keys (weftd ovs backend)', () => {
  const BASE = 'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n';

  it('reads the ovs keys weftd writes after flannel’s lines (renderSubnetEnv round trip)', () => {
    const text = renderSubnetEnv({
      networks: [IPNet.parse('10.244.0.0/16')],
      subnet: IPNet.parse('10.244.1.0/24'),
      ipv6Networks: [],
      ipv6Subnet: null,
      mtu: 1450,
      ipMasq: true,
      weft: { backend: 'ovs', ovsBridge: 'br-int', ovsRunDir: '/var/run/openvswitch', ovsDatapath: 'netdev', ipMasqMode: null },
    });
    const env = parseFlannelSubnetEnv(text, FILE);
    assert.deepEqual(env.weft, { backend: 'ovs', ovsBridge: 'br-int', ovsRunDir: '/var/run/openvswitch', ovsDatapath: 'netdev', ipMasqMode: null });
    assert.equal(env.mtu, 1450);
    assert.equal(env.subnet?.toString(), '10.244.1.0/24');
  });

  it('a flanneld file has none; empty values count as absent; other WEFT_* keys are ignored', () => {
    assert.deepEqual(parseFlannelSubnetEnv(BASE, FILE).weft, { backend: null, ovsBridge: null, ovsRunDir: null, ovsDatapath: null, ipMasqMode: null });
    const env = parseFlannelSubnetEnv(`${BASE}WEFT_BACKEND=ovs\nWEFT_OVS_BRIDGE=\nWEFT_FUTURE=1\nWEFT_OVS_DATAPATH= system \n`, FILE);
    assert.deepEqual(env.weft, { backend: 'ovs', ovsBridge: null, ovsRunDir: null, ovsDatapath: 'system', ipMasqMode: null });
  });
});
