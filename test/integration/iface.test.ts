import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

import {
  InterfaceSelectionError,
  ipCommandView,
  selectExternalInterface,
  type IfaceOptions,
  type LinkInfo,
  type SystemView,
} from '../../src/daemon/iface.js';
import type { ExternalInterface } from '../../src/backend/backend.js';
import { IPAddr } from '../../src/util/ip.js';

const run = promisify(execFile);

/** Comparable form of an ExternalInterface (addresses as strings). */
function show(e: ExternalInterface): Record<string, string | number | null> {
  return {
    name: e.name,
    index: e.index,
    mtu: e.mtu,
    ifaceAddr: e.ifaceAddr?.toString() ?? null,
    ifaceV6Addr: e.ifaceV6Addr?.toString() ?? null,
    extAddr: e.extAddr?.toString() ?? null,
    extV6Addr: e.extV6Addr?.toString() ?? null,
  };
}

function opts(o: Partial<IfaceOptions>): IfaceOptions {
  return { iface: [], ifaceRegex: [], enableIPv4: true, enableIPv6: false, ...o };
}

async function rejectsWith(p: Promise<unknown>, message: string): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof InterfaceSelectionError, `not an InterfaceSelectionError: ${String(e)}`);
    assert.equal(e.message, message);
    return true;
  });
}

describe('iface: selection in a network namespace', () => {
  const NS = `wt-iface-${process.pid}`; // the node
  const PEER = `wt-ifpeer-${process.pid}`; // its neighbours; has no default route
  const MP = `wt-ifmp-${process.pid}`; // a multipath default route
  const created: string[] = [];
  let view: SystemView;
  const index: Record<string, number> = {};

  const ip = async (...args: string[]): Promise<void> => {
    await run('ip', args);
  };

  before(async () => {
    for (const ns of [NS, PEER, MP]) {
      await ip('netns', 'add', ns);
      created.push(ns);
      await ip('-n', ns, 'link', 'set', 'lo', 'up');
    }
    // wt-a: the default-route interface, dual-stack, MTU 1400. wt-d: IPv4 only, MTU 1500.
    await ip('-n', NS, 'link', 'add', 'wt-a', 'mtu', '1400', 'type', 'veth', 'peer', 'name', 'wt-pa', 'netns', PEER);
    await ip('-n', NS, 'link', 'add', 'wt-d', 'type', 'veth', 'peer', 'name', 'wt-pd', 'netns', PEER);
    await ip('-n', PEER, 'link', 'set', 'wt-pa', 'mtu', '1400');
    for (const [ns, dev] of [
      [NS, 'wt-a'],
      [NS, 'wt-d'],
      [PEER, 'wt-pa'],
      [PEER, 'wt-pd'],
    ] as const) {
      await ip('-n', ns, 'link', 'set', dev, 'up');
    }
    await ip('-n', NS, 'addr', 'add', '10.77.0.1/24', 'dev', 'wt-a');
    await ip('-n', NS, 'addr', 'add', '10.77.1.1/24', 'dev', 'wt-a');
    await ip('-n', NS, 'addr', 'add', 'fd77::1/64', 'dev', 'wt-a', 'nodad');
    // Deprecated, and listed before fd77::1 (newest first): must never be chosen.
    await ip('-n', NS, 'addr', 'add', 'fd77::99/64', 'dev', 'wt-a', 'nodad', 'preferred_lft', '0');
    await ip('-n', NS, 'addr', 'add', '10.88.0.1/24', 'dev', 'wt-d');
    await ip('-n', PEER, 'addr', 'add', '10.77.0.2/24', 'dev', 'wt-pa');
    await ip('-n', PEER, 'addr', 'add', 'fd77::2/64', 'dev', 'wt-pa', 'nodad');
    await ip('-n', PEER, 'addr', 'add', '10.88.0.2/24', 'dev', 'wt-pd');
    await ip('-n', NS, 'route', 'add', 'default', 'via', '10.77.0.2', 'dev', 'wt-a');
    await ip('-n', NS, '-6', 'route', 'add', 'default', 'via', 'fd77::2', 'dev', 'wt-a');

    await ip('-n', MP, 'link', 'add', 'wt-m0', 'type', 'veth', 'peer', 'name', 'wt-m1');
    await ip('-n', MP, 'link', 'set', 'wt-m0', 'up');
    await ip('-n', MP, 'link', 'set', 'wt-m1', 'up');
    await ip('-n', MP, 'addr', 'add', '10.99.0.1/24', 'dev', 'wt-m0');
    await ip('-n', MP, 'route', 'add', 'default', 'nexthop', 'via', '10.99.0.2', 'dev', 'wt-m0', 'nexthop', 'via',
      '10.99.0.3', 'dev', 'wt-m0');

    for (const dev of ['wt-a', 'wt-d']) {
      const { stdout } = await run('ip', ['-n', NS, '-j', 'link', 'show', dev]);
      const [first] = JSON.parse(stdout) as { ifindex: number }[];
      assert.ok(first);
      index[dev] = first.ifindex;
    }
    view = ipCommandView(NS);
  });

  after(async () => {
    for (const ns of created.reverse()) {
      await run('ip', ['netns', 'del', ns]).catch(() => undefined);
    }
  });

  const wtA = (): Record<string, string | number | null> => ({
    name: 'wt-a',
    index: index['wt-a'] ?? -1,
    mtu: 1400,
    ifaceAddr: '10.77.0.1',
    ifaceV6Addr: null,
    extAddr: '10.77.0.1',
    extV6Addr: null,
  });
  const wtD = (): Record<string, string | number | null> => ({
    name: 'wt-d',
    index: index['wt-d'] ?? -1,
    mtu: 1500,
    ifaceAddr: '10.88.0.1',
    ifaceV6Addr: null,
    extAddr: '10.88.0.1',
    extV6Addr: null,
  });

  it('lists links with MTU, flags and addresses', async () => {
    const links = await view.links();
    const a = links.find((l) => l.name === 'wt-a');
    assert.ok(a);
    assert.equal(a.mtu, 1400);
    assert.equal(a.up, true);
    assert.equal(a.loopback, false);
    assert.deepEqual(
      a.addrs.filter((x) => x.scope === 'global').map((x) => `${x.ip.toString()}/${x.prefix}`),
      ['10.77.0.1/24', '10.77.1.1/24', 'fd77::99/64', 'fd77::1/64'],
    );
    assert.deepEqual(
      a.addrs.filter((x) => x.deprecated === true).map((x) => x.ip.toString()),
      ['fd77::99'],
    );
    assert.equal(links.find((l) => l.name === 'lo')?.loopback, true);
  });

  it('selects by name', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ iface: ['wt-a'] }), view)), wtA());
    assert.deepEqual(show(await selectExternalInterface(opts({ iface: ['wt-d'] }), view)), wtD());
  });

  it('selects by name, dual-stack: the global IPv6 address, not the link-local one', async () => {
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['wt-a'], enableIPv6: true }), view)),
      { ...wtA(), ifaceV6Addr: 'fd77::1', extV6Addr: 'fd77::1' },
    );
  });

  it('selects by IP, using the address given', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ iface: ['10.88.0.1'] }), view)), wtD());
    assert.deepEqual(show(await selectExternalInterface(opts({ iface: ['10.77.1.1'] }), view)), {
      ...wtA(),
      ifaceAddr: '10.77.1.1',
      extAddr: '10.77.1.1',
    });
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['fd77::1'], enableIPv4: false, enableIPv6: true }), view)),
      { ...wtA(), ifaceAddr: null, extAddr: null, ifaceV6Addr: 'fd77::1', extV6Addr: 'fd77::1' },
    );
  });

  it('selects by regex on an IP (the matching address is used)', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ ifaceRegex: ['^10\\.77\\.1\\.'] }), view)), {
      ...wtA(),
      ifaceAddr: '10.77.1.1',
      extAddr: '10.77.1.1',
    });
  });

  it('selects by regex on a name', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ ifaceRegex: ['^wt-d$'] }), view)), wtD());
  });

  it('a regex is matched against all IPs before any name', async () => {
    // wt-a is listed first and matches by name, but wt-d matches by address.
    assert.deepEqual(show(await selectExternalInterface(opts({ ifaceRegex: ['wt-a|^10\\.88\\.'] }), view)), wtD());
  });

  it('first match wins, in order: --iface entries, then regexes', async () => {
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['wt-nope', '10.9.9.9', 'wt-d', 'wt-a'] }), view)),
      wtD(),
    );
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['wt-d'], ifaceRegex: ['^wt-a$'] }), view)),
      wtD(),
    );
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['wt-nope'], ifaceRegex: ['^nothing$', '^wt-a$'] }), view)),
      wtA(),
    );
    // An entry whose interface lacks a needed address is passed over like a non-match.
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['wt-d', 'wt-a'], enableIPv6: true }), view)),
      { ...wtA(), ifaceV6Addr: 'fd77::1', extV6Addr: 'fd77::1' },
    );
  });

  it('--iface-can-reach picks the device of `ip route get`', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ ifaceCanReach: '10.88.0.7' }), view)), wtD());
    assert.deepEqual(show(await selectExternalInterface(opts({ ifaceCanReach: '192.0.2.9' }), view)), wtA());
    // The address on the destination's subnet is preferred.
    assert.deepEqual(show(await selectExternalInterface(opts({ ifaceCanReach: '10.77.1.20' }), view)), {
      ...wtA(),
      ifaceAddr: '10.77.1.1',
      extAddr: '10.77.1.1',
    });
    assert.deepEqual(
      show(await selectExternalInterface(opts({ ifaceCanReach: 'fd77::9', enableIPv6: true }), view)),
      { ...wtA(), ifaceV6Addr: 'fd77::1', extV6Addr: 'fd77::1' },
    );
    // Options are tried in order: a failing --iface falls through to --iface-can-reach.
    assert.deepEqual(
      show(await selectExternalInterface(opts({ iface: ['wt-nope'], ifaceCanReach: '10.88.0.7' }), view)),
      wtD(),
    );
  });

  it('--iface-can-reach without a route', async () => {
    await rejectsWith(
      selectExternalInterface(opts({ ifaceCanReach: '192.0.2.9' }), ipCommandView(PEER)),
      'no interface matches --iface-can-reach 192.0.2.9',
    );
  });

  it('without options: the default route interface (IPv4, and IPv6 when IPv4 is off)', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({}), view)), wtA());
    assert.deepEqual(
      show(await selectExternalInterface(opts({ enableIPv4: false, enableIPv6: true }), view)),
      { ...wtA(), ifaceAddr: null, extAddr: null, ifaceV6Addr: 'fd77::1', extV6Addr: 'fd77::1' },
    );
  });

  it('follows a multipath default route to its first next hop', async () => {
    const got = await selectExternalInterface(opts({}), ipCommandView(MP));
    assert.equal(got.name, 'wt-m0');
    assert.equal(got.ifaceAddr?.toString(), '10.99.0.1');
  });

  it('--public-ip / --public-ipv6 override the external address', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ publicIP: '203.0.113.5' }), view)), {
      ...wtA(),
      extAddr: '203.0.113.5',
    });
    assert.deepEqual(
      show(
        await selectExternalInterface(
          opts({ iface: ['wt-a'], enableIPv6: true, publicIP: '203.0.113.5', publicIPv6: '2001:db8::5' }),
          view,
        ),
      ),
      { ...wtA(), extAddr: '203.0.113.5', ifaceV6Addr: 'fd77::1', extV6Addr: '2001:db8::5' },
    );
  });

  it('without interface options, --public-ip selects the interface that has it', async () => {
    assert.deepEqual(show(await selectExternalInterface(opts({ publicIP: '10.88.0.1' }), view)), wtD());
    assert.deepEqual(show(await selectExternalInterface(opts({ publicIP: '10.77.1.1' }), view)), {
      ...wtA(),
      ifaceAddr: '10.77.1.1',
      extAddr: '10.77.1.1',
    });
  });

  it('rejects public addresses of the wrong family', async () => {
    await rejectsWith(
      selectExternalInterface(opts({ publicIP: 'fd77::1' }), view),
      'invalid --public-ip "fd77::1": not an IPv4 address',
    );
    await rejectsWith(
      selectExternalInterface(opts({ publicIPv6: '10.0.0.1', enableIPv6: true }), view),
      'invalid --public-ipv6 "10.0.0.1": not an IPv6 address',
    );
    await rejectsWith(
      selectExternalInterface(opts({ publicIP: 'example.com' }), view),
      'invalid --public-ip "example.com": not an IPv4 address',
    );
  });

  it('says which address is missing', async () => {
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['wt-d'], enableIPv6: true }), view),
      'no usable interface: --iface wt-d: interface wt-d has no global IPv6 address',
    );
    // Named explicitly, lo's 127.0.0.1 is acceptable (as in flannel); ::1 is never a global address.
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['lo'], enableIPv6: true }), view),
      'no usable interface: --iface lo: interface lo has no global IPv6 address',
    );
    const lo = await selectExternalInterface(opts({ iface: ['lo'] }), view);
    assert.equal(String(lo.ifaceAddr), '127.0.0.1');
    await rejectsWith(
      selectExternalInterface(opts({ ifaceRegex: ['^lo$'] }), view),
      'no usable interface: --iface-regex ^lo$: interface lo has no IPv4 address',
    );
    await rejectsWith(
      selectExternalInterface(opts({ publicIP: '10.88.0.1', enableIPv6: true }), view),
      'no usable interface: --public-ip 10.88.0.1: interface wt-d has no global IPv6 address',
    );
  });

  it('says what was tried when nothing matches', async () => {
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['eth9', '10.9.9.9'] }), view),
      'no interface matches --iface eth9, 10.9.9.9',
    );
    await assert.rejects(
      selectExternalInterface(opts({ iface: ['eth9'], ifaceRegex: ['^zz', '^yy'] }), view),
      (e: unknown) => {
        assert.ok(e instanceof InterfaceSelectionError);
        assert.equal(e.message, 'no interface matches --iface eth9; --iface-regex ^zz, ^yy');
        assert.deepEqual(e.attempts, [
          '--iface eth9: no such interface',
          '--iface-regex ^zz: matches no interface address or name',
          '--iface-regex ^yy: matches no interface address or name',
        ]);
        return true;
      },
    );
  });

  it('rejects bad interface names and regexes before running anything', async () => {
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['a/b'] }), view),
      'invalid --iface "a/b": neither an IP address nor a valid interface name (contains "/", ":" or whitespace)',
    );
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['wt-a', 'has space'] }), view),
      'invalid --iface "has space": neither an IP address nor a valid interface name (contains "/", ":" or whitespace)',
    );
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['averyveryverylongname'] }), view),
      'invalid --iface "averyveryverylongname": neither an IP address nor a valid interface name (longer than 15 bytes)',
    );
    await rejectsWith(
      selectExternalInterface(opts({ iface: [''] }), view),
      'invalid --iface "": neither an IP address nor a valid interface name (empty)',
    );
    await rejectsWith(
      selectExternalInterface(opts({ ifaceRegex: ['(['] }), view),
      'invalid --iface-regex "([": Invalid regular expression: /([/: Unterminated character class',
    );
    await rejectsWith(
      selectExternalInterface(opts({ ifaceCanReach: 'nowhere' }), view),
      'invalid --iface-can-reach "nowhere": not an IP address',
    );
    assert.throws(() => ipCommandView('../etc'), {
      name: 'InterfaceSelectionError',
      message: 'invalid network namespace name "../etc"',
    });
  });

  it('no default route is an error that says what to pass', async () => {
    await rejectsWith(
      selectExternalInterface(opts({}), ipCommandView(PEER)),
      'no default route (IPv4); pass --iface, --iface-regex or --iface-can-reach',
    );
    await rejectsWith(
      selectExternalInterface(opts({ enableIPv4: false, enableIPv6: true }), ipCommandView(PEER)),
      'no default route (IPv6); pass --iface, --iface-regex or --iface-can-reach',
    );
  });
});

describe('iface: selection logic with a fake system', () => {
  const addr = (ip: string, prefix: number, scope = 'global', deprecated = false): LinkInfo['addrs'][number] =>
    deprecated ? { ip: IPAddr.parse(ip), prefix, scope, deprecated } : { ip: IPAddr.parse(ip), prefix, scope };

  class FakeView implements SystemView {
    readonly calls: string[] = [];
    constructor(
      private readonly all: LinkInfo[],
      private readonly defaults: Partial<Record<4 | 6, string>> = {},
    ) {}
    links(): Promise<LinkInfo[]> {
      this.calls.push('links');
      return Promise.resolve(this.all);
    }
    defaultRouteLink(family: 4 | 6): Promise<string | null> {
      this.calls.push(`default${family}`);
      return Promise.resolve(this.defaults[family] ?? null);
    }
    routeGetLink(dst: IPAddr): Promise<string | null> {
      this.calls.push(`get ${dst.toString()}`);
      return Promise.resolve(null);
    }
  }

  const link = (name: string, index: number, addrs: LinkInfo['addrs'], mtu = 1500): LinkInfo => ({
    name,
    index,
    mtu,
    up: true,
    loopback: false,
    addrs,
  });

  it('prefers a non-link-local IPv4 address, falls back to link-local', async () => {
    const view = new FakeView(
      [
        link('eth0', 2, [addr('169.254.1.1', 16), addr('192.168.1.5', 24)]),
        link('eth1', 3, [addr('169.254.7.7', 16)]),
      ],
      { 4: 'eth0' },
    );
    assert.equal((await selectExternalInterface(opts({}), view)).ifaceAddr?.toString(), '192.168.1.5');
    assert.equal(
      (await selectExternalInterface(opts({ iface: ['eth1'] }), view)).ifaceAddr?.toString(),
      '169.254.7.7',
    );
    assert.deepEqual(view.calls, ['links', 'default4', 'links']);
  });

  it('skips deprecated and link-local IPv6 addresses', async () => {
    const view = new FakeView([
      link('eth0', 2, [
        addr('10.0.0.2', 24),
        addr('fe80::1', 64, 'link'),
        addr('2001:db8::1', 64, 'global', true),
        addr('2001:db8::2', 64),
      ]),
    ]);
    const got = await selectExternalInterface(opts({ iface: ['eth0'], enableIPv6: true }), view);
    assert.equal(got.ifaceV6Addr?.toString(), '2001:db8::2');
  });

  it('a v6 --iface address that is link-local identifies the link but is not used', async () => {
    const view = new FakeView([link('eth0', 2, [addr('fe80::1', 64, 'link'), addr('2001:db8::2', 64)])]);
    const got = await selectExternalInterface(opts({ iface: ['fe80::1'], enableIPv4: false, enableIPv6: true }), view);
    assert.deepEqual(show(got), {
      name: 'eth0',
      index: 2,
      mtu: 1500,
      ifaceAddr: null,
      ifaceV6Addr: '2001:db8::2',
      extAddr: null,
      extV6Addr: '2001:db8::2',
    });
  });

  it('a link without an MTU is unusable', async () => {
    const view = new FakeView([link('eth0', 2, [addr('10.0.0.2', 24)], 0)]);
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['eth0'] }), view),
      'no usable interface: --iface eth0: cannot determine the MTU of interface eth0',
    );
  });

  it('mixes unmatched and unusable entries in one message', async () => {
    const view = new FakeView([link('eth0', 2, [addr('10.0.0.2', 24)]), link('eth1', 3, [])]);
    await rejectsWith(
      selectExternalInterface(opts({ iface: ['eth7', 'eth1'], ifaceCanReach: '192.0.2.1' }), view),
      'no usable interface: --iface eth7: no such interface; --iface eth1: interface eth1 has no IPv4 address; ' +
        '--iface-can-reach 192.0.2.1: no route',
    );
    assert.deepEqual(view.calls, ['links', 'get 192.0.2.1']);
  });

  it('does not consult routes when --iface matches, and refuses when no family is enabled', async () => {
    const view = new FakeView([link('eth0', 2, [addr('10.0.0.2', 24)])]);
    await selectExternalInterface(opts({ iface: ['eth0'], ifaceCanReach: '192.0.2.1' }), view);
    assert.deepEqual(view.calls, ['links']);
    await rejectsWith(
      selectExternalInterface(opts({ enableIPv4: false, enableIPv6: false }), view),
      'neither IPv4 nor IPv6 is enabled',
    );
  });

  it('a public IP that is not local falls back to the default route', async () => {
    const view = new FakeView([link('eth0', 2, [addr('10.0.0.2', 24)])], { 4: 'eth0' });
    const got = await selectExternalInterface(opts({ publicIP: '198.51.100.1' }), view);
    assert.equal(got.name, 'eth0');
    assert.equal(got.ifaceAddr?.toString(), '10.0.0.2');
    assert.equal(got.extAddr?.toString(), '198.51.100.1');
  });
});
