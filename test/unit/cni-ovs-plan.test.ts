// weft-ovs planning: host veth names, the pod's addressing from IPAM results (IPv4 only), the
// host and pod `ip` batches, the ADD result, and CHECK's verdicts.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import type { IpLink } from '../../cni-plugins/lib/ipjson.js';
import {
  buildResult,
  checkOvsAttachment,
  hostBatch,
  hostVethName,
  OvsCheckError,
  planAddressing,
  podBatch,
  type OvsCheckState,
} from '../../cni-plugins/ovs/plan.js';
import type { CniResult } from '../../cni-plugins/skel/types.js';
import type { PodInterface } from '../../src/backend/ovs/bridge.js';
import { IPAddr } from '../../src/util/ip.js';
import { assertCniError } from '../helpers/cni-assert.js';

const IPAM: CniResult = {
  cniVersion: '1.1.0',
  ips: [{ address: '10.244.1.2/24', gateway: '10.244.1.1' }],
  routes: [{ dst: '10.244.0.0/16' }],
};

describe('weft-ovs plan', () => {
  describe('hostVethName', () => {
    it('is "weft" + 11 hex chars of sha512(containerID:ifname), 15 characters', () => {
      const want = `weft${createHash('sha512').update('abc123:eth0').digest('hex').slice(0, 11)}`;
      assert.equal(hostVethName('abc123', 'eth0'), want);
      assert.equal(want.length, 15);
      assert.notEqual(hostVethName('abc123', 'eth1'), want);
      assert.notEqual(hostVethName('abc12', '3eth0'), hostVethName('abc123', 'eth0'));
    });
  });

  describe('planAddressing', () => {
    it('takes the IPv4 address, the IPAM gateway, macFromIP and IPAM routes (interface index 1)', () => {
      const a = planAddressing(IPAM, { isDefaultGateway: false });
      assert.equal(a.ip.toString(), '10.244.1.2');
      assert.equal(a.net.toString(), '10.244.1.0/24');
      assert.equal(a.gateway.toString(), '10.244.1.1');
      assert.equal(a.mac, '0a:58:0a:f4:01:02');
      assert.deepEqual(a.ips, [{ address: '10.244.1.2/24', gateway: '10.244.1.1', interface: 1 }]);
      assert.deepEqual(a.routes, [{ dst: '10.244.0.0/16' }]);
    });

    it('adds a default route via the gateway with isDefaultGateway, unless IPAM returned one with a gateway', () => {
      assert.deepEqual(planAddressing(IPAM, { isDefaultGateway: true }).routes, [{ dst: '10.244.0.0/16' }, { dst: '0.0.0.0/0', gw: '10.244.1.1' }]);
      const withDefault: CniResult = { ...IPAM, routes: [{ dst: '0.0.0.0/0', gw: '10.244.1.254' }] };
      assert.deepEqual(planAddressing(withDefault, { isDefaultGateway: true }).routes, [{ dst: '0.0.0.0/0', gw: '10.244.1.254' }]);
      // A default route without a gateway does not count (the bridge plugin's rule).
      const noGw: CniResult = { ...IPAM, routes: [{ dst: '0.0.0.0/0' }] };
      assert.deepEqual(planAddressing(noGw, { isDefaultGateway: true }).routes, [{ dst: '0.0.0.0/0' }, { dst: '0.0.0.0/0', gw: '10.244.1.1' }]);
    });

    it('uses the subnet’s first address when IPAM gave no gateway', () => {
      const a = planAddressing({ cniVersion: '1.1.0', ips: [{ address: '10.244.7.9/24' }] }, { isDefaultGateway: true });
      assert.equal(a.gateway.toString(), '10.244.7.1');
      assert.deepEqual(a.ips, [{ address: '10.244.7.9/24', gateway: '10.244.7.1', interface: 1 }]);
      assert.deepEqual(a.routes, [{ dst: '0.0.0.0/0', gw: '10.244.7.1' }]);
    });

    it('refuses IPv6 (the backend is IPv4-only), several addresses and no address', () => {
      assertCniError(
        () => planAddressing({ cniVersion: '1.1.0', ips: [{ address: 'fd00::5/64', gateway: 'fd00::1' }] }, { isDefaultGateway: false }),
        'weft-ovs supports IPv4 only (the ovs backend is IPv4-only), but IPAM returned fd00::5/64; configure only IPv4 ranges',
        7,
      );
      assertCniError(
        () => planAddressing({ cniVersion: '1.1.0', ips: [{ address: '10.244.1.2/24' }, { address: 'fd00::5/64' }] }, { isDefaultGateway: false }),
        'weft-ovs supports IPv4 only (the ovs backend is IPv4-only), but IPAM returned fd00::5/64; configure only IPv4 ranges',
        7,
      );
      assertCniError(
        () => planAddressing({ cniVersion: '1.1.0', ips: [{ address: '10.244.1.2/24' }, { address: '10.245.1.2/24' }] }, { isDefaultGateway: false }),
        'weft-ovs attaches one IPv4 address per interface, but IPAM returned 10.244.1.2/24, 10.245.1.2/24',
        7,
      );
      assertCniError(
        () => planAddressing({ ...IPAM, routes: [{ dst: 'fd00::/8' }] }, { isDefaultGateway: false }),
        'weft-ovs supports IPv4 only, but IPAM returned the route(s) fd00::/8',
        7,
      );
      assertCniError(() => planAddressing({ cniVersion: '1.1.0' }, { isDefaultGateway: false }), 'IPAM plugin returned missing IP config', 999);
      assertCniError(
        () => planAddressing({ cniVersion: '1.1.0', ips: [{ address: '10.244.1.2/24', gateway: 'fd00::1' }] }, { isDefaultGateway: false }),
        'IPAM returned an invalid IPv4 gateway "fd00::1"',
        999,
      );
    });
  });

  describe('batches', () => {
    it('host: veth with the pod end in the netns, arp off only for netdev, up, read back', () => {
      const spec = { hostVeth: 'weft0123456789a', ifname: 'eth0', mtu: 1450, arpOff: true, peerNetns: '/proc/self/fd/3' };
      assert.deepEqual(
        hostBatch(spec).lines.map((l) => l.line),
        [
          'link add name weft0123456789a mtu 1450 txqueuelen 0 type veth peer name eth0 mtu 1450 txqueuelen 0 netns /proc/self/fd/3',
          'link set dev weft0123456789a arp off',
          'link set dev weft0123456789a up',
          'link show dev weft0123456789a',
        ],
      );
      assert.deepEqual(
        hostBatch({ ...spec, mtu: 0, arpOff: false }).lines.map((l) => l.line),
        [
          'link add name weft0123456789a txqueuelen 0 type veth peer name eth0 txqueuelen 0 netns /proc/self/fd/3',
          'link set dev weft0123456789a up',
          'link show dev weft0123456789a',
        ],
      );
      assert.equal(hostBatch(spec).vethAdd, 1);
    });

    it('pod: MAC, address, up, routes via the gateway, read back', () => {
      const a = planAddressing(IPAM, { isDefaultGateway: true });
      assert.deepEqual(
        podBatch('eth0', a).map((l) => l.line),
        [
          'link set dev eth0 address 0a:58:0a:f4:01:02',
          'address add 10.244.1.2/24 brd + dev eth0',
          'link set dev eth0 up',
          'route add 10.244.0.0/16 via 10.244.1.1 dev eth0',
          'route add 0.0.0.0/0 via 10.244.1.1 dev eth0',
          'link show dev eth0',
        ],
      );
    });
  });

  it('buildResult: host veth then the pod interface in its sandbox; ips point at index 1', () => {
    const a = planAddressing(IPAM, { isDefaultGateway: true });
    const r = buildResult({ name: 'weftabc', mac: '8a:00:00:00:00:01' }, { name: 'eth0', mac: a.mac, sandbox: '/run/netns/p' }, a, { nameservers: ['10.96.0.10'] });
    assert.deepEqual(r, {
      cniVersion: '1.1.0',
      interfaces: [
        { name: 'weftabc', mac: '8a:00:00:00:00:01' },
        { name: 'eth0', mac: '0a:58:0a:f4:01:02', sandbox: '/run/netns/p' },
      ],
      ips: [{ address: '10.244.1.2/24', gateway: '10.244.1.1', interface: 1 }],
      routes: [{ dst: '10.244.0.0/16' }, { dst: '0.0.0.0/0', gw: '10.244.1.1' }],
      dns: { nameservers: ['10.96.0.10'] },
    });
    const bare = buildResult({ name: 'h', mac: 'm' }, { name: 'eth0', mac: 'p', sandbox: 's' }, planAddressing({ cniVersion: '1.1.0', ips: [{ address: '10.1.0.2/24' }] }, { isDefaultGateway: false }), null);
    assert.equal('routes' in bare, false);
    assert.equal('dns' in bare, false);
  });

  describe('checkOvsAttachment', () => {
    const prev: CniResult = {
      cniVersion: '1.1.0',
      interfaces: [
        { name: 'weftabc', mac: '8a:00:00:00:00:01' },
        { name: 'eth0', mac: '0a:58:0a:f4:01:02', sandbox: '/run/netns/p' },
      ],
      ips: [{ address: '10.244.1.2/24', gateway: '10.244.1.1', interface: 1 }],
    };
    const port: PodInterface = { name: 'weftabc', ofport: 3, ip: IPAddr.parse('10.244.1.2'), mac: '0a:58:0a:f4:01:02', containerId: 'c1', ifName: 'eth0' };
    const link = (over: Partial<IpLink> = {}): IpLink => ({
      ifindex: 2,
      ifname: 'eth0',
      flags: ['UP'],
      mtu: 1450,
      operstate: 'UP',
      address: '0a:58:0a:f4:01:02',
      master: null,
      linkIndex: 9,
      kind: null,
      infoData: {},
      slaveData: {},
      addrs: [{ family: 'inet', local: '10.244.1.2', prefixlen: 24, scope: 'global', tentative: false, dadfailed: false }],
      ...over,
    });
    const state = (over: Partial<OvsCheckState> = {}): OvsCheckState => ({
      bridge: 'br-int',
      containerId: 'c1',
      ifname: 'eth0',
      netns: '/run/netns/p',
      prev,
      port,
      podLink: link(),
      ...over,
    });
    const fails = (s: OvsCheckState, msg: string) =>
      assert.throws(
        () => checkOvsAttachment(s),
        (e: unknown) => e instanceof OvsCheckError && e.code === 999 && e.message === msg,
      );

    it('passes when the port and the pod interface match the prevResult', () => {
      checkOvsAttachment(state());
      // A MAC in upper case in prevResult is the same MAC.
      checkOvsAttachment(state({ prev: { ...prev, interfaces: [prev.interfaces![0]!, { ...prev.interfaces![1]!, mac: '0A:58:0A:F4:01:02' }] } }));
    });

    it('names what differs', () => {
      fails(state({ netns: '/run/netns/q' }), 'prevResult has no interface eth0 in sandbox /run/netns/q');
      fails(state({ prev: { ...prev, ips: [] } }), 'prevResult has no IPv4 address for eth0');
      fails(state({ port: null }), 'no Open vSwitch port on bridge br-int for container c1 interface eth0');
      fails(state({ port: { ...port, name: 'weftother' } }), 'Open vSwitch port of eth0 is weftother, but prevResult names weftabc');
      fails(state({ port: { ...port, ip: IPAddr.parse('10.244.1.3') } }), 'Open vSwitch port weftabc carries IP 10.244.1.3, but prevResult has 10.244.1.2');
      fails(state({ port: { ...port, mac: '0a:58:0a:f4:01:03' } }), 'Open vSwitch port weftabc carries MAC 0a:58:0a:f4:01:03, but prevResult has 0a:58:0a:f4:01:02');
      fails(state({ podLink: null }), 'Interface name eth0 not found');
      fails(state({ podLink: link({ address: '02:00:00:00:00:01' }) }), "Interface eth0 Mac 0a:58:0a:f4:01:02 doesn't match container Mac: 02:00:00:00:00:01");
      fails(state({ podLink: link({ addrs: [] }) }), 'Failed to match addr 10.244.1.2/24 on interface eth0');
    });
  });
});
