// bridge CHECK over parsed kernel state (every reference message), and the `ip -j -batch` output
// parsing it relies on.
import assert from 'node:assert/strict';
import { checkAttachment, type CheckState } from '../../cni-plugins/bridge/check.js';
import { parseBatchStderr, splitJsonDocs } from '../../cni-plugins/lib/ipbatch.js';
import { linksOf, parseLink, parseRoute, routesOf, type IpLink } from '../../cni-plugins/lib/ipjson.js';
import { CniError, type CniResult } from '../../cni-plugins/skel/types.js';

function link(over: Partial<IpLink> & Pick<IpLink, 'ifname' | 'ifindex'>): IpLink {
  return {
    flags: ['BROADCAST', 'MULTICAST', 'UP', 'LOWER_UP'],
    mtu: 1500,
    operstate: 'UP',
    address: '',
    master: null,
    linkIndex: null,
    kind: null,
    infoData: {},
    slaveData: {},
    addrs: [],
    ...over,
  };
}

const PREV: CniResult = {
  cniVersion: '1.0.0',
  interfaces: [
    { name: 'cni0', mac: '02:00:00:00:00:01' },
    { name: 'veth01020304', mac: '02:00:00:00:00:02' },
    { name: 'eth0', mac: '02:00:00:00:00:03', sandbox: '/run/netns/p1' },
  ],
  ips: [{ interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' }],
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
};

function state(over: Partial<CheckState> = {}): CheckState {
  const bridge = link({ ifname: 'cni0', ifindex: 2, kind: 'bridge', address: '02:00:00:00:00:01' });
  const veth = link({ ifname: 'veth01020304', ifindex: 7, kind: 'veth', address: '02:00:00:00:00:02', master: 'cni0', linkIndex: 3 });
  return {
    conf: { bridge: 'cni0', promiscMode: false },
    ifname: 'eth0',
    netns: '/run/netns/p1',
    prev: PREV,
    hostLinks: new Map([
      ['cni0', bridge],
      ['veth01020304', veth],
    ]),
    podLink: link({
      ifname: 'eth0',
      ifindex: 3,
      kind: 'veth',
      address: '02:00:00:00:00:03',
      linkIndex: 7,
      addrs: [{ family: 'inet', local: '10.1.0.5', prefixlen: 24, scope: 'global', tentative: false, dadfailed: false }],
    }),
    podRoutes: [
      { dst: 'default', gateway: '10.1.0.1', dev: 'eth0', table: 'main', family: 4, scope: null, protocol: null },
      { dst: '10.1.0.0/24', gateway: null, dev: 'eth0', table: 'main', family: 4, scope: 'link', protocol: 'kernel' },
    ],
    ...over,
  };
}

function fails(s: CheckState, msg: string): void {
  assert.throws(
    () => checkAttachment(s),
    (e: unknown) => e instanceof CniError && e.code === 999 && e.message === msg,
  );
}

describe('bridge CHECK', () => {
  it('accepts the attachment as ADD left it', () => {
    assert.equal(checkAttachment(state()), undefined);
  });

  it('checks the bridge: presence, type, MAC, promiscuous mode', () => {
    const s = state();
    fails({ ...s, hostLinks: new Map() }, 'Interface name cni0 not found');
    fails({ ...s, hostLinks: new Map([['cni0', link({ ifname: 'cni0', ifindex: 2, kind: 'dummy' })]]) }, 'Interface cni0 does not have link type of bridge');
    fails(
      { ...s, hostLinks: new Map([['cni0', link({ ifname: 'cni0', ifindex: 2, kind: 'bridge', address: '02:ff:00:00:00:01' })]]) },
      "Bridge interface cni0 Mac doesn't match: 02:00:00:00:00:01",
    );
    fails({ ...s, conf: { bridge: 'cni0', promiscMode: true } }, "Bridge interface cni0 configured Promisc Mode true doesn't match current state: false ");
    fails({ ...s, prev: { ...PREV, interfaces: PREV.interfaces!.slice(1) } }, 'Interface name missing ');
  });

  it('checks the sandbox and the container interface', () => {
    const s = state();
    fails({ ...s, netns: '/run/netns/other' }, "Sandbox in prevResult  doesn't match configured netns: /run/netns/other");
    fails({ ...s, podLink: null }, 'Interface name eth0 not found');
    fails({ ...s, podLink: { ...s.podLink!, kind: 'macvlan' } }, 'Error: Container interface eth0 not of type veth');
    fails({ ...s, podLink: { ...s.podLink!, address: '02:00:00:00:00:33' } }, "Interface eth0 Mac 02:00:00:00:00:03 doesn't match container Mac: 02:00:00:00:00:33");
  });

  it('looks for the host veth that is the peer and on the bridge', () => {
    const s = state();
    const veth = s.hostLinks.get('veth01020304')!;
    const without = (v: IpLink) => new Map([...s.hostLinks].map(([k, l]) => [k, k === v.ifname ? v : l]));
    fails({ ...s, hostLinks: without({ ...veth, master: 'other0' }) }, 'CNI veth created for bridge cni0 was not found');
    fails({ ...s, hostLinks: without({ ...veth, linkIndex: 99 }) }, 'CNI veth created for bridge cni0 was not found');
    fails({ ...s, hostLinks: without({ ...veth, address: '02:00:00:00:00:22' }) }, "Interface veth01020304 Mac doesn't match: 02:00:00:00:00:02 not found");
    fails({ ...s, hostLinks: new Map([['cni0', s.hostLinks.get('cni0')!]]) }, 'Interface name veth01020304 not found');
  });

  it('checks addresses and their prefix routes', () => {
    const s = state();
    fails({ ...s, podLink: { ...s.podLink!, addrs: [] } }, 'Failed to match addr 10.1.0.5/24 on interface eth0');
    fails({ ...s, podRoutes: s.podRoutes.filter((r) => r.dst !== '10.1.0.0/24') }, 'Failed to find Gateway 10.1.0.1 for interface eth0');
  });

  it('checks routes: a default route needs only to exist, others need dst and gw', () => {
    const s = state();
    fails({ ...s, podRoutes: s.podRoutes.filter((r) => r.dst !== 'default') }, 'Expected Route {Dst:{IP:0.0.0.0 Mask:00000000} GW:10.1.0.1} not found in routing table');
    const other = { ...s.podRoutes[0]!, gateway: '10.1.0.77' };
    assert.equal(checkAttachment({ ...s, podRoutes: [other, s.podRoutes[1]!] }), undefined);
    const prev = { ...PREV, routes: [{ dst: '10.9.0.0/16', gw: '10.1.0.1' }] };
    const wrongGw = { dst: '10.9.0.0/16', gateway: '10.1.0.2', dev: 'eth0', table: 'main', family: 4 as const, scope: null, protocol: null };
    fails({ ...s, prev, podRoutes: [...s.podRoutes, wrongGw] }, 'Expected Route {Dst:{IP:10.9.0.0 Mask:ffff0000} GW:10.1.0.1} not found in routing table');
    const inOtherTable = { ...wrongGw, gateway: '10.1.0.1', table: '100' };
    fails({ ...s, prev, podRoutes: [...s.podRoutes, inOtherTable] }, 'Expected Route {Dst:{IP:10.9.0.0 Mask:ffff0000} GW:10.1.0.1} not found in routing table');
    assert.equal(checkAttachment({ ...s, prev, podRoutes: [...s.podRoutes, { ...inOtherTable, table: 'main' }] }), undefined);
  });
});

describe('bridge ip output parsing', () => {
  it('splits the JSON documents of a batch', () => {
    assert.deepEqual(splitJsonDocs('[{"a":"]"}]\n[]\n[{"b":"x\\"[y"}]\n'), [[{ a: ']' }], [], [{ b: 'x"[y' }]]);
  });

  it('maps stderr messages to failed batch lines', () => {
    const p = parseBatchStderr('RTNETLINK answers: File exists\nCommand failed -:1\nDevice "x" does not exist.\nCommand failed -:3\n');
    assert.deepEqual(p.failedLines, [1, 3]);
    assert.equal(p.byLine.get(1), 'RTNETLINK answers: File exists');
    assert.equal(p.byLine.get(3), 'Device "x" does not exist.');
    assert.equal(p.message, 'RTNETLINK answers: File exists; Device "x" does not exist.');
  });

  it('reads links with kind, master, peer and addresses', () => {
    const l = parseLink({
      ifindex: 3,
      link_index: 2,
      ifname: 'veth1',
      flags: ['UP'],
      mtu: 1400,
      master: 'cni0',
      operstate: 'UP',
      address: '02:00:00:00:00:02',
      linkinfo: { info_kind: 'veth', info_slave_kind: 'bridge', info_slave_data: { hairpin: true } },
      addr_info: [{ family: 'inet6', local: 'fd00::1', prefixlen: 64, scope: 'global', tentative: true }],
    });
    assert.deepEqual(l, {
      ifindex: 3,
      ifname: 'veth1',
      flags: ['UP'],
      mtu: 1400,
      operstate: 'UP',
      address: '02:00:00:00:00:02',
      master: 'cni0',
      linkIndex: 2,
      kind: 'veth',
      infoData: {},
      slaveData: { hairpin: true },
      addrs: [{ family: 'inet6', local: 'fd00::1', prefixlen: 64, scope: 'global', tentative: true, dadfailed: false }],
    });
    assert.equal(linksOf([[{ dst: 'default' }], [{ ifindex: 1, ifname: 'lo' }]]).length, 1);
  });

  it('tells route families apart and defaults the table to main', () => {
    assert.equal(parseRoute({ dst: 'default', gateway: '10.0.0.1' })!.family, 4);
    assert.equal(parseRoute({ dst: 'default', dev: 'eth0', metric: 1024, pref: 'medium' })!.family, 6);
    assert.equal(parseRoute({ dst: 'fd00::/64' })!.family, 6);
    assert.equal(parseRoute({ dst: '10.0.0.2', table: 'local' })!.table, 'local');
    assert.equal(parseRoute({ dst: '10.0.0.0/24' })!.table, 'main');
    assert.equal(routesOf([{ ifindex: 1, ifname: 'lo' }, { dst: '10.0.0.0/24' }]).length, 1);
  });
});
