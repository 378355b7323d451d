// host-local config: canonicalisation, the reference's validation messages, requested-IP sources
// and CNI_ARGS strictness, routes, resolv.conf parsing.
import assert from 'node:assert/strict';
import { loadConfig, parseCniArgsIP, rangeSetString, type HostLocalConfig } from '../../cni-plugins/host-local/config.js';
import { parseResolvConf } from '../../cni-plugins/host-local/dns.js';
import type { NetConf } from '../../cni-plugins/skel/types.js';
import { assertCniError } from '../helpers/cni-assert.js';

function conf(ipam: Record<string, unknown>, extra: Record<string, unknown> = {}): NetConf {
  return { cniVersion: '1.0.0', name: 'net1', type: 'bridge', ipam: { type: 'host-local', ...ipam }, ...extra };
}

function load(ipam: Record<string, unknown>, extra: Record<string, unknown> = {}, cniArgs = ''): HostLocalConfig {
  return loadConfig(conf(ipam, extra), { cniArgs });
}

const rejects = assertCniError;

describe('host-local config', () => {
  it('fills the defaults of a legacy single range: .1 gateway, start .1, end broadcast-1', () => {
    const c = load({ subnet: '10.1.2.0/24' });
    assert.equal(c.name, 'net1');
    assert.equal(c.dataDir, '/var/lib/cni/networks');
    assert.equal(c.resolvConf, null);
    assert.equal(c.rangeSets.length, 1);
    const r = c.rangeSets[0]![0]!;
    assert.equal(r.subnet.toString(), '10.1.2.0/24');
    assert.equal(r.gateway.toString(), '10.1.2.1');
    assert.equal(rangeSetString(c.rangeSets[0]!), '10.1.2.1-10.1.2.254');
  });

  it('ends an IPv6 range at the last address', () => {
    const c = load({ ranges: [[{ subnet: 'fd00::/120', gateway: 'fd00::5' }]] });
    assert.equal(rangeSetString(c.rangeSets[0]!), 'fd00::1-fd00::ff');
    assert.equal(c.rangeSets[0]![0]!.gateway.toString(), 'fd00::5');
  });

  it('orders range sets: runtimeConfig.ipRanges, legacy subnet, ranges', () => {
    const c = load(
      { subnet: '10.1.0.0/24', ranges: [[{ subnet: 'fd00::/64' }]], dataDir: '/tmp/x', resolvConf: '/etc/r' },
      { runtimeConfig: { ipRanges: [[{ subnet: '10.5.0.0/24', rangeStart: '10.5.0.10', rangeEnd: '10.5.0.20' }]] } },
    );
    assert.deepEqual(
      c.rangeSets.map((s) => rangeSetString(s)),
      ['10.5.0.10-10.5.0.20', '10.1.0.1-10.1.0.254', 'fd00::1-fd00::ffff:ffff:ffff:ffff'],
    );
    assert.equal(c.dataDir, '/tmp/x');
    assert.equal(c.resolvConf, '/etc/r');
  });

  it('gives the reference messages for invalid ranges', () => {
    rejects(() => load({ subnet: '10.1.2.5/24' }), 'invalid range set 0: Network has host bits set. For a subnet mask of length 24 the network address is 10.1.2.0');
    rejects(() => load({ subnet: '10.1.2.0/31' }), 'invalid range set 0: Network 10.1.2.0/31 too small to allocate from');
    rejects(() => load({ subnet: 'fd00::/127' }), 'invalid range set 0: Network fd00::/127 too small to allocate from');
    rejects(() => load({ subnet: '10.1.2.0/24', rangeStart: '10.9.9.9' }), 'invalid range set 0: RangeStart 10.9.9.9 not in network 10.1.2.0/24');
    rejects(() => load({ subnet: '10.1.2.0/24', rangeEnd: '10.9.9.9' }), 'invalid range set 0: RangeEnd 10.9.9.9 not in network 10.1.2.0/24');
    rejects(
      () => load({ subnet: '10.1.2.0/24', rangeStart: '10.1.2.50', rangeEnd: '10.1.2.40' }),
      'invalid range set 0: RangeStart 10.1.2.50 not in network 10.1.2.0/24',
    );
    rejects(() => load({ subnet: '10.1.2.0/24', gateway: '10.9.9.9' }), 'invalid range set 0: gateway 10.9.9.9 not in network 10.1.2.0/24');
    rejects(() => load({ ranges: [[]] }), 'invalid range set 0: empty range set');
    rejects(() => load({ ranges: [[{ subnet: '10.1.2.0/24' }, { subnet: 'fd00::/64' }]] }), 'invalid range set 0: mixed address families');
    rejects(
      () => load({ ranges: [[{ subnet: '10.1.2.0/24' }, { subnet: '10.1.2.0/25' }]] }),
      'invalid range set 0: subnets 10.1.2.1-10.1.2.254 and 10.1.2.1-10.1.2.126 overlap',
    );
    rejects(() => load({ ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: '10.1.3.0/24' }], [{ subnet: '10.1.2.0/25' }]] }), 'range set 0 overlaps with 2');
    rejects(() => load({ subnet: '10.1.2.0/24', ranges: [[{ subnet: '10.1.2.0/24' }]] }), 'range set 0 overlaps with 1');
    rejects(() => load({}), 'no IP ranges specified');
    rejects(() => loadConfig({ cniVersion: '1.0.0', name: 'n', type: 'bridge' }), "IPAM config missing 'ipam' key");
    rejects(() => load({ subnet: '10.1.2.0' }), 'invalid CIDR address: 10.1.2.0');
    rejects(() => load({ subnet: '10.1.2.0/24', rangeStart: 'x' }), 'invalid IP address: x');
    rejects(() => load({ ranges: [{ subnet: '10.1.2.0/24' }] }), 'ipam.ranges must be a list of range sets (lists of ranges)');
  });

  it('accepts disjoint ranges in one set and sets of different families', () => {
    const c = load({ ranges: [[{ subnet: '10.1.2.0/30' }, { subnet: '10.1.3.0/30' }], [{ subnet: 'fd00::/120', rangeStart: 'fd00::10', rangeEnd: 'fd00::11' }]] });
    assert.deepEqual(c.rangeSets.map((s) => rangeSetString(s)), ['10.1.2.1-10.1.2.2,10.1.3.1-10.1.3.2', 'fd00::10-fd00::11']);
  });

  it('collects requested IPs from CNI_ARGS, args.cni.ips and runtimeConfig.ips, in that order, without duplicates', () => {
    const c = load(
      { subnet: '10.1.2.0/24' },
      { args: { cni: { ips: ['10.1.2.8', '10.1.2.10'] } }, runtimeConfig: { ips: ['10.1.2.9/24', 'FD00::0010'] } },
      'IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.1.2.10',
    );
    assert.deepEqual(c.requestedIPs.map((ip) => ip.toString()), ['10.1.2.10', '10.1.2.8', '10.1.2.9', 'fd00::10']);
    rejects(() => load({ subnet: '10.1.2.0/24' }, { runtimeConfig: { ips: ['10.1.2.300'] } }), 'invalid IP address 10.1.2.300');
    rejects(() => load({ subnet: '10.1.2.0/24' }, { args: { cni: { ips: ['zz'] } } }), 'invalid IP address zz');
  });

  it('parses CNI_ARGS as strictly as the reference', () => {
    assert.equal(parseCniArgsIP(''), null);
    assert.equal(parseCniArgsIP('IP=10.1.2.9/24')?.toString(), '10.1.2.9');
    assert.equal(parseCniArgsIP('IP=10.1.2.19;IP=10.1.2.20')?.toString(), '10.1.2.20');
    assert.equal(parseCniArgsIP('IgnoreUnknown=TRUE;IP=;X=1'), null);
    rejects(() => parseCniArgsIP('FOO=bar;K8S=1'), 'ARGS: unknown args ["FOO=bar" "K8S=1"]', 999);
    rejects(() => parseCniArgsIP('ip=10.1.2.29'), 'ARGS: unknown args ["ip=10.1.2.29"]', 999);
    rejects(() => parseCniArgsIP('IP=xyz'), 'ARGS: error parsing value of pair "IP=xyz": invalid IP address xyz', 999);
    rejects(() => parseCniArgsIP('IP'), 'ARGS: invalid pair "IP"', 999);
    rejects(() => parseCniArgsIP('IgnoreUnknown=1;X=a=b'), 'ARGS: invalid pair "X=a=b"', 999);
    rejects(() => parseCniArgsIP('IgnoreUnknown=yes'), 'ARGS: error parsing value of pair "IgnoreUnknown=yes": boolean unmarshal error: invalid input yes', 999);
    // DEL and GC do not look at CNI_ARGS at all.
    assert.equal(loadConfig(conf({ subnet: '10.1.2.0/24' }), { cniArgs: 'X=1', ignoreArgs: true }).requestedIPs.length, 0);
  });

  it('passes routes through, re-formatted, keeping host bits and 1.1 attributes', () => {
    const c = load({
      subnet: '10.1.2.0/24',
      routes: [{ dst: '0.0.0.0/0' }, { dst: '10.0.0.1/8', gw: '10.1.2.1' }, { dst: 'FD00::/8', mtu: 1400, table: 100 }],
    });
    assert.deepEqual(c.routes, [{ dst: '0.0.0.0/0' }, { dst: '10.0.0.1/8', gw: '10.1.2.1' }, { dst: 'fd00::/8', mtu: 1400, table: 100 }]);
    rejects(() => load({ subnet: '10.1.2.0/24', routes: [{ dst: 'x' }] }), 'invalid CIDR address: x');
    rejects(() => load({ subnet: '10.1.2.0/24', routes: [{ dst: '1.0.0.0/8', gw: 'zz' }] }), 'invalid IP address: zz');
    rejects(() => load({ subnet: '10.1.2.0/24', routes: [{ dst: '1.0.0.0/8', mtu: -1 }] }), 'route 1.0.0.0/8: mtu must be a non-negative integer');
  });

  it('rejects a network name that is not a plain directory name', () => {
    rejects(() => loadConfig({ cniVersion: '1.0.0', name: '../etc', type: 'x', ipam: { subnet: '10.1.2.0/24' } }), 'invalid network name "../etc"');
  });
});

describe('host-local resolvConf', () => {
  it('reads nameserver, domain, search and options like dns.go', () => {
    const text = '# c\nnameserver 1.1.1.1\nnameserver  8.8.8.8 x\r\ndomain a.b\nsearch x y\n;foo\noptions ndots:5 rotate\nsearch z\nnameserver\n';
    assert.deepEqual(parseResolvConf(text), {
      nameservers: ['1.1.1.1', '8.8.8.8'],
      domain: 'a.b',
      search: ['x', 'y', 'z'],
      options: ['ndots:5', 'rotate'],
    });
    assert.deepEqual(parseResolvConf(''), {});
  });
});
