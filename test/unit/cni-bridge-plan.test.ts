// bridge ADD planning: gateways and default routes (calcGateways), the bridge address rules
// (ensureAddr), and the exact ip / bridge / sysctl lines for the host and the pod.
import assert from 'node:assert/strict';
import type { IpAddrInfo } from '../../cni-plugins/lib/ipjson.js';
import {
  calcGateways,
  GatewayConflictError,
  hostBatch,
  planGatewayAddrs,
  podSysctlSettings,
  portVlanLines,
  randomVethName,
  vlanGatewayLines,
  vlanRanges,
} from '../../cni-plugins/bridge/plan.js';
import { podAddressLines, podIPv6Sysctls, podRouteLines } from '../../cni-plugins/lib/lines.js';
import { IPAddr } from '../../src/util/ip.js';

function addr(local: string, prefixlen: number): IpAddrInfo {
  return { family: local.includes(':') ? 'inet6' : 'inet', local, prefixlen, scope: 'global', tentative: false, dadfailed: false };
}

const GW = { isGateway: true, isDefaultGateway: false };
const DEFAULT_GW = { isGateway: true, isDefaultGateway: true };

describe('bridge plan: calcGateways', () => {
  it('puts every IP on interface 2 and computes network+1 as the gateway', () => {
    const g = calcGateways({ cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/24' }] }, GW);
    assert.deepEqual(g.ips, [{ address: '10.1.0.5/24', gateway: '10.1.0.1', interface: 2 }]);
    assert.deepEqual(g.routes, []);
    assert.deepEqual(
      g.v4.map((x) => `${x.ip.toString()}/${x.prefix}`),
      ['10.1.0.1/24'],
    );
    assert.deepEqual(g.v6, []);
  });

  it('leaves the gateway out when the bridge is not a gateway', () => {
    const g = calcGateways({ cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/24' }] }, { isGateway: false, isDefaultGateway: false });
    assert.deepEqual(g.ips, [{ address: '10.1.0.5/24', interface: 2 }]);
    assert.deepEqual(g.v4, []);
  });

  it('keeps an IPAM gateway and adds one default route per family', () => {
    const g = calcGateways(
      {
        cniVersion: '1.1.0',
        ips: [{ address: '10.1.0.5/24', gateway: '10.1.0.254' }, { address: 'fd00::5/64' }, { address: '10.2.0.5/24' }],
        routes: [{ dst: '10.9.0.0/16' }],
      },
      DEFAULT_GW,
    );
    assert.deepEqual(g.routes, [{ dst: '10.9.0.0/16' }, { dst: '0.0.0.0/0', gw: '10.1.0.254' }, { dst: '::/0', gw: 'fd00::1' }]);
    assert.deepEqual(
      [...g.v4, ...g.v6].map((x) => `${x.ip.toString()}/${x.prefix}`),
      ['10.1.0.254/24', '10.2.0.1/24', 'fd00::1/64'],
    );
  });

  it('does not add a default route when IPAM returned one with a gateway', () => {
    const g = calcGateways({ cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/24' }], routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.9' }] }, DEFAULT_GW);
    assert.deepEqual(g.routes, [{ dst: '0.0.0.0/0', gw: '10.1.0.9' }]);
  });

  it('adds one when the IPAM default route has no gateway, as the reference', () => {
    const g = calcGateways({ cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/24' }], routes: [{ dst: '0.0.0.0/0' }] }, DEFAULT_GW);
    assert.deepEqual(g.routes, [{ dst: '0.0.0.0/0' }, { dst: '0.0.0.0/0', gw: '10.1.0.1' }]);
  });
});

describe('bridge plan: gateway addresses (ensureAddr)', () => {
  const gw = (text: string) => {
    const [ip, len] = text.split('/');
    return { ip: IPAddr.parse(ip!), prefix: Number(len) };
  };

  it('adds a missing gateway and pins the MAC', () => {
    assert.deepEqual(planGatewayAddrs('cni0', [], [gw('10.1.0.1/24')], false, 'failed to set bridge addr'), {
      del: [],
      add: ['10.1.0.1/24'],
      pin: true,
    });
  });

  it('keeps an equal address and does not pin', () => {
    assert.deepEqual(planGatewayAddrs('cni0', [addr('10.1.0.1', 24)], [gw('10.1.0.1/24')], false, 'x'), { del: [], add: [], pin: false });
  });

  it('refuses any other IPv4 address without forceAddress', () => {
    assert.throws(
      () => planGatewayAddrs('cni0', [addr('10.9.0.1', 16)], [gw('10.1.0.1/24')], false, 'failed to set bridge addr'),
      (e: unknown) =>
        e instanceof GatewayConflictError && e.code === 999 && e.message === 'failed to set bridge addr: "cni0" already has an IP address different from 10.1.0.1/24',
    );
  });

  it('replaces it with forceAddress', () => {
    assert.deepEqual(planGatewayAddrs('cni0', [addr('10.9.0.1', 16), addr('fe80::1', 64)], [gw('10.1.0.1/24')], true, 'x'), {
      del: ['10.9.0.1/16'],
      add: ['10.1.0.1/24'],
      pin: true,
    });
  });

  it('lets non-overlapping IPv6 prefixes coexist and refuses overlapping ones', () => {
    assert.deepEqual(planGatewayAddrs('cni0', [addr('fe80::1', 64), addr('fd01::1', 64)], [gw('fd00::1/64')], false, 'x'), {
      del: [],
      add: ['fd00::1/64'],
      pin: true,
    });
    assert.throws(
      () => planGatewayAddrs('cni0', [addr('fd00::9', 48)], [gw('fd00::1/64')], false, 'p'),
      /p: "cni0" already has an IP address different from fd00::1\/64/,
    );
  });

  it('sees its own earlier gateway when there are two IPv4 gateways, as the reference', () => {
    assert.throws(() => planGatewayAddrs('cni0', [], [gw('10.1.0.1/24'), gw('10.2.0.1/24')], false, 'p'), /different from 10\.2\.0\.1\/24/);
    // With forceAddress the second replaces the first: the net change is just the second.
    assert.deepEqual(planGatewayAddrs('cni0', [addr('10.7.0.1', 24)], [gw('10.1.0.1/24'), gw('10.2.0.1/24')], true, 'p'), {
      del: ['10.7.0.1/24'],
      add: ['10.2.0.1/24'],
      pin: true,
    });
  });
});

describe('bridge plan: batch lines', () => {
  it('renders the host batch with the bridge read before the port joins', () => {
    const b = hostBatch({
      bridge: 'cni0',
      mtu: 1400,
      vlanFiltering: false,
      vlanGw: null,
      hostVeth: 'veth0a0b0c0d',
      ifname: 'eth0',
      mac: '02:00:00:00:00:01',
      hairpin: true,
      isolated: true,
      promisc: false,
      peerNetns: '/proc/self/fd/3',
    });
    assert.deepEqual(
      b.lines.map((l) => l.line),
      [
        'link add name cni0 mtu 1400 type bridge',
        'address show dev cni0',
        'link set dev cni0 up',
        'link add name veth0a0b0c0d mtu 1400 txqueuelen 0 type veth peer name eth0 mtu 1400 txqueuelen 0 address 02:00:00:00:00:01 netns /proc/self/fd/3',
        'link set dev veth0a0b0c0d master cni0',
        'link set dev veth0a0b0c0d type bridge_slave hairpin on isolated on',
        'link set dev veth0a0b0c0d up',
        'link show dev veth0a0b0c0d',
        'link show dev cni0',
      ],
    );
    assert.deepEqual([b.bridgeAdd, b.bridgeRead, b.vlanGwRead, b.vethAdd], [1, 2, null, 4]);
  });

  it('adds promisc, vlan_filtering and the VLAN gateway read when asked', () => {
    const b = hostBatch({
      bridge: 'br1',
      mtu: 0,
      vlanFiltering: true,
      vlanGw: 'br1.7',
      hostVeth: 'vethffffffff',
      ifname: 'net1',
      mac: null,
      hairpin: false,
      isolated: false,
      promisc: true,
      peerNetns: '/proc/self/fd/3',
    });
    assert.deepEqual(
      b.lines.slice(0, 6).map((l) => l.line),
      [
        'link add name br1 type bridge vlan_filtering 1',
        'address show dev br1',
        'address show dev br1.7',
        'link set dev br1 promisc on',
        'link set dev br1 up',
        'link add name vethffffffff txqueuelen 0 type veth peer name net1 txqueuelen 0 netns /proc/self/fd/3',
      ],
    );
    assert.equal(b.vlanGwRead, 3);
    assert.equal(b.vethAdd, 6);
    assert.ok(!b.lines.some((l) => l.line.includes('bridge_slave')));
  });

  it('renders the VLAN gateway port and the port VLAN commands', () => {
    assert.deepEqual(
      vlanGatewayLines('br1', 'br1.7', 'veth00000001', 1500).map((l) => l.line),
      [
        'link add name br1.7 mtu 1500 txqueuelen 0 type veth peer name veth00000001 mtu 1500 txqueuelen 0',
        'link set dev veth00000001 master br1',
        'link set dev veth00000001 up',
        'link set dev br1.7 up',
      ],
    );
    assert.deepEqual(portVlanLines('vethA', 0, [], false, 1), []);
    assert.deepEqual(portVlanLines('vethA', 100, [], true, 1), ['vlan add dev vethA vid 100 pvid untagged master']);
    assert.deepEqual(portVlanLines('vethA', 100, [], false, 1), ['vlan del dev vethA vid 1 master', 'vlan add dev vethA vid 100 pvid untagged master']);
    assert.deepEqual(portVlanLines('vethA', 0, [5, 6, 7, 20], true, 1), [
      'vlan add dev vethA vid 1 pvid untagged master',
      'vlan add dev vethA vid 5-7 master',
      'vlan add dev vethA vid 20 master',
    ]);
    assert.deepEqual(vlanRanges([9, 1, 2, 3, 7]), [
      [1, 3],
      [7, 7],
      [9, 9],
    ]);
  });

  it('renders the pod addresses (brd for IPv4) and the link up', () => {
    assert.deepEqual(
      podAddressLines('eth0', [{ address: '10.1.0.5/24' }, { address: '10.3.0.5/31' }, { address: 'fd00::5/64' }], true).map((l) => l.line),
      ['address add 10.1.0.5/24 brd + dev eth0', 'address add 10.3.0.5/31 dev eth0', 'address add fd00::5/64 dev eth0', 'link set dev eth0 up'],
    );
    assert.deepEqual(
      podAddressLines('eth0', [{ address: '10.1.0.5/24' }], false).map((l) => l.line),
      ['address add 10.1.0.5/24 brd + dev eth0'],
    );
  });

  it('renders routes with the family gateway, universe scope for device routes, first one wins', () => {
    const ips = [
      { address: '10.1.0.5/24', gateway: '10.1.0.1' },
      { address: 'fd00::5/64', gateway: 'fd00::1' },
    ];
    const lines = podRouteLines('eth0', ips, [
      { dst: '0.0.0.0/0', gw: '10.1.0.1' },
      { dst: '10.9.0.0/16' },
      { dst: '10.9.0.0/16', gw: '10.1.0.7' },
      { dst: '::/0' },
      { dst: '192.168.0.0/16', priority: 50, table: 100, mtu: 1400, advmss: 1360 },
    ]);
    assert.deepEqual(
      lines.map((l) => l.line),
      [
        'route add 0.0.0.0/0 via 10.1.0.1 dev eth0',
        'route add 10.9.0.0/16 via 10.1.0.1 dev eth0',
        'route add ::/0 via fd00::1 dev eth0',
        'route add 192.168.0.0/16 via 10.1.0.1 dev eth0 metric 50 table 100 mtu 1400 advmss 1360',
      ],
    );
    assert.deepEqual(
      podRouteLines('eth0', [{ address: '10.1.0.5/24' }], [{ dst: '10.8.0.0/16' }]).map((l) => l.line),
      ['route add 10.8.0.0/16 dev eth0 scope global'],
    );
  });

  it('sets the container sysctls the reference sets', () => {
    assert.deepEqual(podSysctlSettings('eth0', false), [
      ['net/ipv6/conf/eth0/accept_dad', '0'],
      ['net/ipv4/conf/eth0/arp_notify', '1'],
    ]);
    assert.deepEqual(podSysctlSettings('eth0.5', true), [
      ['net/ipv6/conf/eth0.5/enhanced_dad', '1'],
      ['net/ipv6/conf/eth0.5/accept_dad', '1'],
      ['net/ipv4/conf/eth0.5/arp_notify', '1'],
    ]);
    assert.deepEqual(podIPv6Sysctls('eth0'), [
      ['net/ipv6/conf/lo/disable_ipv6', '0'],
      ['net/ipv6/conf/eth0/disable_ipv6', '0'],
      ['net/ipv6/conf/eth0/keep_addr_on_down', '1'],
    ]);
  });

  it('names host veths veth + 8 hex digits', () => {
    assert.equal(randomVethName(Uint8Array.from([0xde, 0xad, 0x00, 0x0f, 0x99])), 'vethdead000f');
  });
});
