// The netlink layer against the real kernel, inside the private network namespace that
// test/netns/setup.ts insists on (`unshare --net`). Every assertion compares with what iproute2
// (`ip -j`, `bridge -j`) reads back, so the library is not checked against itself.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { promisify } from 'node:util';

import {
  isValidMac,
  MAIN_TABLE,
  Netlink,
  NetlinkError,
  NUD,
  parseMac,
  WEFT_ROUTE_PROTOCOL,
  type ApplyResult,
  type LinkEvent,
  type NetlinkOp,
  type VxlanSpec,
} from '../../src/netlink/index.js';
import { MessageWriter } from '../../src/netlink/wire.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { waitFor } from '../helpers/wait.js';
import { assertPrivateNetns } from './setup.js';

const run = promisify(execFile);

async function cmd(file: string, ...args: string[]): Promise<string> {
  const { stdout } = await run(file, args, { maxBuffer: 64 << 20 });
  return stdout;
}

const ip = (...args: string[]): Promise<string> => cmd('ip', ...args);

/** Parses `ip -j`/`bridge -j` output; the shapes below name only the fields the tests read. */
async function json<T>(file: string, ...args: string[]): Promise<T[]> {
  const out = (await cmd(file, ...args)).trim();
  return out === '' ? [] : (JSON.parse(out) as T[]);
}

interface IpLink {
  ifindex: number;
  ifname: string;
  flags: string[];
  mtu: number;
  address: string;
  linkinfo?: { info_kind: string; info_data?: Record<string, unknown> };
}
interface IpAddrInfo {
  ifname: string;
  addr_info: Array<{ family: string; local: string; prefixlen: number }>;
}
interface IpRoute {
  dst: string;
  nhid?: number;
  gateway?: string;
  dev: string;
  protocol: string;
  flags: string[];
  table?: string;
}
interface IpNexthop {
  id: number;
  gateway?: string;
  dev?: string;
  protocol: string;
  flags: string[];
}
interface IpNeigh {
  dst: string;
  lladdr?: string;
  state: string[];
}
interface BridgeFdb {
  mac: string;
  dst?: string;
  flags: string[];
  state: string;
}

const A = (s: string): IPAddr => IPAddr.parse(s);
const N = (s: string): IPNet => IPNet.parse(s);

/** Comparable form of a link's VxlanAttrs. */
function vxText(v: { vni: number; local: IPAddr | null; link: number | null; port: number; learning: boolean; gbp: boolean } | null) {
  return v && { ...v, local: v.local?.toString() ?? null };
}

describe('netlink: mac helpers', () => {
  it('parseMac normalises case and separators, rejects anything else', () => {
    assert.equal(parseMac('0E:2A:00:11:22:33'), '0e:2a:00:11:22:33');
    assert.equal(parseMac('0e-2a-00-11-22-33'), '0e:2a:00:11:22:33');
    for (const bad of ['', '0e:2a:00:11:22', '0e:2a:00:11:22:33:44', '0e:2a-00:11:22:33', 'g0:2a:00:11:22:33', '0e:2a:0:11:22:33']) {
      assert.equal(isValidMac(bad), false, bad);
      assert.throws(() => parseMac(bad), { name: 'InvalidMacError' });
    }
  });

  it("apply()'s MAC encoder accepts exactly what isValidMac accepts, and writes the same bytes", () => {
    const inputs = [
      '0e:2a:00:11:22:33', '0E-2A-00-11-22-33', 'ff:ff:ff:ff:ff:ff', '00:00:00:00:00:00', 'aB:cD:eF:01:23:45',
      '', '0e:2a:00:11:22', '0e:2a:00:11:22:33:44', '0e:2a-00:11:22:33', 'g0:2a:00:11:22:33', '0e:2a:0:11:22:33',
      '0e:2a:00:11:22:3', '0e.2a.00.11.22.33', '0e:2a:00:11:22:3g', ' e:2a:00:11:22:33', '0e:2a:00:11:22:33 ',
    ];
    for (const text of inputs) {
      const w = new MessageWriter(4);
      const ok = w.attrMac(2, text);
      assert.equal(ok, isValidMac(text), text);
      if (ok) {
        assert.deepEqual([...w.bytes()], [10, 0, 2, 0, ...parseMac(text).split(':').map((h) => parseInt(h, 16)), 0, 0], text);
      } else {
        assert.equal(w.length, 0, text);
        assert.deepEqual([...w.bytes()], [], text);
      }
    }
  });
});

describe('netlink: kernel programming in a private namespace', function () {
  this.timeout(120_000);
  let nl: Netlink;
  let u0: number; // underlay veth, 10.99.0.1/24 and fd99::1/64
  const made: string[] = [];

  const baseSpec = (over: Partial<VxlanSpec>): VxlanSpec => ({
    name: 'wt-vx1',
    vni: 42,
    local: A('10.99.0.1'),
    link: u0,
    port: 8472,
    learning: false,
    gbp: false,
    ...over,
  });

  async function vxlan(over: Partial<VxlanSpec>): Promise<number> {
    const l = await nl.createVxlan(baseSpec(over));
    made.push(l.name);
    await nl.setLink(l.index, { up: true });
    return l.index;
  }

  async function delLink(name: string): Promise<void> {
    await run('ip', ['link', 'del', name]).catch(() => undefined);
  }

  before(async () => {
    // Also here, not only in the root hook: run without `--require test/netns/setup.ts`, this
    // file must still never touch the machine's own namespace.
    assertPrivateNetns();
    await ip('link', 'add', 'wt-u0', 'type', 'veth', 'peer', 'name', 'wt-u1');
    made.push('wt-u0');
    await ip('addr', 'add', '10.99.0.1/24', 'dev', 'wt-u0');
    await ip('addr', 'add', 'fd99::1/64', 'dev', 'wt-u0', 'nodad');
    await ip('link', 'set', 'wt-u0', 'up');
    await ip('link', 'set', 'wt-u1', 'up');
    nl = Netlink.open();
    const l = await nl.link('wt-u0');
    assert.ok(l);
    u0 = l.index;
  });

  after(async () => {
    nl?.close();
    for (const name of made.reverse()) await delLink(name);
  });

  describe('links', () => {
    afterEach(async () => {
      for (const n of ['wt-vx1', 'wt-vx2', 'wt-vx6']) await delLink(n);
    });

    it('creates a vxlan device that iproute2 reads back exactly, and link() decodes it', async () => {
      const created = await nl.createVxlan(baseSpec({ mtu: 1400, mac: '0e:2a:00:11:22:33' }));
      assert.equal(created.name, 'wt-vx1');
      assert.equal(created.adminUp, false);
      await nl.setLink(created.index, { up: true });

      const [shown] = await json<IpLink>('ip', '-d', '-j', 'link', 'show', 'wt-vx1');
      assert.ok(shown);
      assert.equal(shown.ifindex, created.index);
      assert.equal(shown.mtu, 1400);
      assert.equal(shown.address, '0e:2a:00:11:22:33');
      assert.ok(shown.flags.includes('UP'), JSON.stringify(shown.flags));
      assert.equal(shown.linkinfo?.info_kind, 'vxlan');
      const d = shown.linkinfo?.info_data ?? {};
      assert.deepEqual(
        { id: d.id, local: d.local, link: d.link, port: d.port, learning: d.learning, gbp: d.gbp },
        { id: 42, local: '10.99.0.1', link: 'wt-u0', port: 8472, learning: false, gbp: undefined },
      );

      const back = await nl.link('wt-vx1');
      assert.ok(back);
      assert.deepEqual(
        { ...back, vxlan: vxText(back.vxlan) },
        {
          index: created.index,
          name: 'wt-vx1',
          mtu: 1400,
          mac: '0e:2a:00:11:22:33',
          adminUp: true,
          operState: 'UNKNOWN', // vxlan has no carrier notion of its own
          kind: 'vxlan',
          vxlan: { vni: 42, local: '10.99.0.1', link: u0, port: 8472, learning: false, gbp: false },
        },
      );
      assert.deepEqual(await nl.linkByIndex(created.index), back);
    });

    it('encodes learning, GBP, another port and an IPv6 underlay', async () => {
      const v4 = await nl.createVxlan(baseSpec({ name: 'wt-vx2', vni: 7, port: 4789, learning: true, gbp: true }));
      const v6 = await nl.createVxlan(baseSpec({ name: 'wt-vx6', vni: 8, local: A('fd99::1') }));
      const [s4] = await json<IpLink>('ip', '-d', '-j', 'link', 'show', 'wt-vx2');
      const [s6] = await json<IpLink>('ip', '-d', '-j', 'link', 'show', 'wt-vx6');
      const d4 = s4?.linkinfo?.info_data ?? {};
      const d6 = s6?.linkinfo?.info_data ?? {};
      assert.deepEqual([d4.id, d4.port, d4.learning, d4.gbp], [7, 4789, true, true]);
      assert.deepEqual([d6.id, d6.local6, d6.link, d6.port], [8, 'fd99::1', 'wt-u0', 8472]);
      assert.deepEqual(vxText(v4.vxlan), { vni: 7, local: '10.99.0.1', link: u0, port: 4789, learning: true, gbp: true });
      assert.deepEqual(vxText(v6.vxlan), { vni: 8, local: 'fd99::1', link: u0, port: 8472, learning: false, gbp: false });
    });

    it('port 0 leaves the kernel default 8472', async () => {
      const l = await nl.createVxlan(baseSpec({ port: 0 }));
      assert.equal(l.vxlan?.port, 8472);
    });

    it('fails a duplicate create with EEXIST and names the attempt', async () => {
      await nl.createVxlan(baseSpec({}));
      await assert.rejects(nl.createVxlan(baseSpec({})), (e: unknown) => {
        assert.ok(e instanceof NetlinkError);
        assert.equal(e.errno, 'EEXIST');
        assert.equal(e.op, `vxlan-create wt-vx1 id 42 local 10.99.0.1 dev ${u0} dstport 8472`);
        assert.equal(e.message, `vxlan-create wt-vx1 id 42 local 10.99.0.1 dev ${u0} dstport 8472: Request rejected: EEXIST`);
        return true;
      });
    });

    it('rejects bad specs before the kernel sees them', async () => {
      for (const [over, reason] of [
        [{ name: 'a-name-longer-than-15' }, 'bad interface name "a-name-longer-than-15"'],
        [{ vni: 1 << 24 }, 'VNI must be 0..16777215'],
        [{ mac: '0e:2a' }, 'bad MAC "0e:2a"'],
      ] as const) {
        await assert.rejects(nl.createVxlan(baseSpec(over)), (e: unknown) => {
          assert.ok(e instanceof NetlinkError);
          assert.equal(e.errno, 'EINVAL');
          assert.equal(e.detail, `invalid argument: ${reason}`);
          return true;
        });
      }
      assert.deepEqual(await json<IpLink>('ip', '-j', 'link', 'show', 'type', 'vxlan'), []);
    });

    it('setLink changes admin state, MTU and MAC', async () => {
      const l = await nl.createVxlan(baseSpec({}));
      await nl.setLink(l.index, { up: true, mtu: 1350, mac: '0e:00:00:00:00:01' });
      let [s] = await json<IpLink>('ip', '-j', 'link', 'show', 'wt-vx1');
      assert.deepEqual([s?.mtu, s?.address, s?.flags.includes('UP')], [1350, '0e:00:00:00:00:01', true]);
      await nl.setLink(l.index, { up: false });
      [s] = await json<IpLink>('ip', '-j', 'link', 'show', 'wt-vx1');
      assert.deepEqual([s?.mtu, s?.address, s?.flags.includes('UP')], [1350, '0e:00:00:00:00:01', false]);
      const back = await nl.linkByIndex(l.index);
      assert.deepEqual([back?.mtu, back?.mac, back?.adminUp, back?.operState], [1350, '0e:00:00:00:00:01', false, 'DOWN']);
    });

    it('deletes a link; lookups of missing links return null, deleting one fails with ENODEV', async () => {
      const l = await nl.createVxlan(baseSpec({}));
      await nl.deleteLink(l.index);
      assert.deepEqual(await json<IpLink>('ip', '-j', 'link', 'show', 'type', 'vxlan'), []);
      assert.equal(await nl.link('wt-vx1'), null);
      assert.equal(await nl.linkByIndex(l.index), null);
      await assert.rejects(nl.deleteLink(l.index), (e: unknown) => e instanceof NetlinkError && e.errno === 'ENODEV');
    });

    it('links() lists every link with its kind', async () => {
      await nl.createVxlan(baseSpec({}));
      const all = await nl.links();
      const byName = new Map(all.map((l) => [l.name, l.kind]));
      assert.deepEqual(
        ['lo', 'wt-u0', 'wt-u1', 'wt-vx1'].map((n) => byName.get(n)),
        [null, 'veth', 'veth', 'vxlan'],
      );
    });
  });

  describe('addresses', () => {
    let vx: number;
    before(async () => {
      vx = await vxlan({ name: 'wt-vxa', vni: 50 });
    });

    const shown = async (): Promise<string[]> => {
      const [a] = await json<IpAddrInfo>('ip', '-j', 'addr', 'show', 'dev', 'wt-vxa');
      return (a?.addr_info ?? []).filter((x) => !x.local.startsWith('fe80')).map((x) => `${x.local}/${x.prefixlen}`);
    };

    it('adds idempotently, lists and deletes IPv4 and IPv6 addresses', async () => {
      await nl.addAddress(vx, A('10.5.1.0'), 32);
      await nl.addAddress(vx, A('10.5.1.0'), 32); // EEXIST is success
      await nl.addAddress(vx, A('fd05:1::'), 128);
      assert.deepEqual((await shown()).sort(), ['10.5.1.0/32', 'fd05:1::/128']);
      const listed = (await nl.addresses(vx)).map((a) => `${String(a.ip)}/${a.prefix}`).filter((s) => !s.startsWith('fe80'));
      assert.deepEqual(listed.sort(), ['10.5.1.0/32', 'fd05:1::/128']);
      const all = await nl.addresses();
      assert.ok(all.some((a) => a.index === u0 && String(a.ip) === '10.99.0.1' && a.prefix === 24));

      await nl.deleteAddress(vx, A('10.5.1.0'), 32);
      await nl.deleteAddress(vx, A('fd05:1::'), 128);
      await nl.deleteAddress(vx, A('10.5.1.0'), 32); // already gone: success
      assert.deepEqual(await shown(), []);
    });
  });

  describe('routes', () => {
    let vx: number;
    before(async () => {
      vx = await vxlan({ name: 'wt-vxr', vni: 60 });
    });
    afterEach(async () => {
      await ip('route', 'flush', 'proto', '88').catch(() => undefined);
      await ip('-6', 'route', 'flush', 'proto', '88').catch(() => undefined);
      await ip('route', 'flush', 'table', '1000').catch(() => undefined);
    });

    const shown4 = (...sel: string[]): Promise<IpRoute[]> => json<IpRoute>('ip', '-j', 'route', 'show', ...sel);

    it('replaces an onlink route via the vxlan device and a gateway route via the underlay', async () => {
      const res = await nl.apply([
        { kind: 'route-replace', route: { dst: N('10.5.2.0/24'), gateway: A('10.5.2.0'), oif: vx, onlink: true } },
        { kind: 'route-replace', route: { dst: N('10.6.0.0/16'), gateway: A('10.99.0.2'), oif: null, onlink: false } },
        { kind: 'route-replace', route: { dst: N('fd05:2::/64'), gateway: A('fd05:2::'), oif: vx, onlink: true } },
      ]);
      assert.deepEqual(res, { applied: 3, failures: [] });
      // Unfiltered, so `ip` prints the protocol (it omits what a filter already fixed).
      assert.deepEqual((await shown4()).filter((r) => r.protocol !== 'kernel'), [
        { dst: '10.5.2.0/24', gateway: '10.5.2.0', dev: 'wt-vxr', protocol: '88', flags: ['onlink'] },
        { dst: '10.6.0.0/16', gateway: '10.99.0.2', dev: 'wt-u0', protocol: '88', flags: [] },
      ]);
      const [v6] = (await json<IpRoute>('ip', '-j', '-6', 'route', 'show')).filter((r) => r.protocol === '88');
      assert.deepEqual([v6?.dst, v6?.gateway, v6?.dev, v6?.protocol, v6?.flags], ['fd05:2::/64', 'fd05:2::', 'wt-vxr', '88', ['onlink']]);

      const text = (r: { dst: IPNet; gateway: IPAddr | null; oif: number | null; onlink: boolean; protocol: number; table: number; type: string; scope: number }) =>
        `${String(r.dst)} ${String(r.gateway)} ${r.oif} ${r.onlink} ${r.protocol} ${r.table} ${r.type} ${r.scope}`;
      assert.deepEqual((await nl.routes({ family: 4, protocol: WEFT_ROUTE_PROTOCOL })).map(text), [
        `10.5.2.0/24 10.5.2.0 ${vx} true 88 254 unicast 0`,
        `10.6.0.0/16 10.99.0.2 ${u0} false 88 254 unicast 0`,
      ]);
      assert.deepEqual((await nl.routes({ family: 6, protocol: WEFT_ROUTE_PROTOCOL, table: MAIN_TABLE })).map(text), [
        `fd05:2::/64 fd05:2:: ${vx} true 88 254 unicast 0`,
      ]);
      assert.deepEqual((await nl.routes({ family: 4, oif: vx })).map(text), [`10.5.2.0/24 10.5.2.0 ${vx} true 88 254 unicast 0`]);
      // The kernel's own connected route, and the local table, are visible unfiltered.
      const all = (await nl.routes({ family: 4 })).map(text);
      assert.ok(all.includes(`10.99.0.0/24 null ${u0} false 2 254 unicast 253`), all.join('\n'));
      assert.ok(all.includes(`10.99.0.1/32 null ${u0} false 2 255 local 254`), all.join('\n'));
    });

    it('replace moves a route to a new gateway; a device route is link scope; tables above 255 work', async () => {
      await nl.apply([{ kind: 'route-replace', route: { dst: N('10.6.0.0/16'), gateway: A('10.99.0.2'), oif: u0, onlink: false } }]);
      await nl.apply([{ kind: 'route-replace', route: { dst: N('10.6.0.0/16'), gateway: A('10.99.0.3'), oif: u0, onlink: false } }]);
      await nl.apply([
        { kind: 'route-replace', route: { dst: N('10.8.0.0/16'), gateway: null, oif: vx, onlink: false } },
        { kind: 'route-replace', route: { dst: N('10.9.0.0/16'), gateway: A('10.99.0.2'), oif: null, onlink: false, table: 1000, protocol: 4 } },
      ]);
      assert.deepEqual(await shown4('10.6.0.0/16'), [{ dst: '10.6.0.0/16', gateway: '10.99.0.3', dev: 'wt-u0', protocol: '88', flags: [] }]);
      assert.deepEqual(await json<{ dst: string; dev: string; scope: string }>('ip', '-j', 'route', 'show', '10.8.0.0/16'), [
        { dst: '10.8.0.0/16', dev: 'wt-vxr', protocol: '88', scope: 'link', flags: [] },
      ]);
      assert.deepEqual(await shown4('table', '1000'), [{ dst: '10.9.0.0/16', gateway: '10.99.0.2', dev: 'wt-u0', protocol: 'static', flags: [] }]);
      const t1000 = await nl.routes({ family: 4, table: 1000 });
      assert.deepEqual(
        t1000.map((r) => [String(r.dst), r.table, r.protocol]),
        [['10.9.0.0/16', 1000, 4]],
      );
    });

    it('deletes; a missing route counts as applied; by default only proto 88 routes are touched', async () => {
      await nl.apply([
        { kind: 'route-replace', route: { dst: N('10.5.2.0/24'), gateway: A('10.5.2.0'), oif: vx, onlink: true } },
        { kind: 'route-replace', route: { dst: N('fd05:2::/64'), gateway: A('fd05:2::'), oif: vx, onlink: true } },
      ]);
      const res = await nl.apply([
        { kind: 'route-delete', route: { dst: N('10.5.2.0/24'), gateway: A('10.5.2.0'), oif: vx } },
        { kind: 'route-delete', route: { dst: N('fd05:2::/64'), gateway: A('fd05:2::'), oif: vx } },
        { kind: 'route-delete', route: { dst: N('10.5.3.0/24') } }, // never existed: ESRCH
        { kind: 'route-delete', route: { dst: N('10.99.0.0/24') } }, // the kernel's (proto kernel) route
        { kind: 'route-delete', route: { dst: N('fd05:9::/64') } },
      ]);
      assert.deepEqual(res, { applied: 5, failures: [] });
      assert.deepEqual(await shown4('proto', '88'), []);
      assert.deepEqual(await json<IpRoute>('ip', '-j', '-6', 'route', 'show', 'proto', '88'), []);
      assert.deepEqual((await shown4('10.99.0.0/24')).map((r) => [r.dst, r.protocol]), [['10.99.0.0/24', 'kernel']]);
    });
  });

  describe('nexthops', () => {
    let vx: number;
    before(async () => {
      vx = await vxlan({ name: 'wt-vxh', vni: 65 });
    });
    afterEach(async () => {
      await ip('route', 'flush', 'proto', '88').catch(() => undefined);
      await ip('-6', 'route', 'flush', 'proto', '88').catch(() => undefined);
      await ip('nexthop', 'flush').catch(() => undefined);
    });

    const nexthopsShown = async (): Promise<Array<[number, string | undefined, string | undefined, string, string[]]>> =>
      (await json<IpNexthop>('ip', '-j', 'nexthop', 'show')).map((n) => [n.id, n.gateway, n.dev, n.protocol, n.flags]);
    const nhOp = (id: number, gw: string, oif: number, onlink = true, protocol?: number): NetlinkOp => ({
      kind: 'nexthop-replace',
      nexthop: { id, gateway: A(gw), oif, onlink, ...(protocol === undefined ? {} : { protocol }) },
    });
    const nhRoute = (dst: string, nhid: number): NetlinkOp => ({ kind: 'route-replace', route: { dst: N(dst), gateway: null, oif: null, onlink: false, nhid } });
    const routeText = async (...sel: string[]): Promise<string> => (await ip('route', 'show', ...sel)).trim();

    it('supportsNexthops() is true on this kernel and probes only once', async () => {
      const first = nl.supportsNexthops();
      assert.equal(nl.supportsNexthops(), first);
      assert.equal(await first, true);
    });

    it('creates, replaces (new gateway), lists and deletes nexthop objects, proto 88 by default', async () => {
      const res = await nl.apply([
        nhOp(101, '10.5.2.0', vx),
        nhOp(102, 'fd05:2::', vx),
        nhOp(103, '10.99.0.2', u0, false, 200),
      ]);
      assert.deepEqual(res, { applied: 3, failures: [] });
      assert.deepEqual(await nexthopsShown(), [
        [101, '10.5.2.0', 'wt-vxh', '88', ['onlink']],
        [102, 'fd05:2::', 'wt-vxh', '88', ['onlink']],
        [103, '10.99.0.2', 'wt-u0', '200', []],
      ]);
      const listed = (await nl.nexthops()).map((n) => [n.id, n.family, String(n.gateway), n.oif, n.onlink, n.protocol, n.blackhole, n.group]);
      assert.deepEqual(listed, [
        [101, 4, '10.5.2.0', vx, true, 88, false, null],
        [102, 6, 'fd05:2::', vx, true, 88, false, null],
        [103, 4, '10.99.0.2', u0, false, 200, false, null],
      ]);
      assert.deepEqual((await nl.nexthops({ protocol: WEFT_ROUTE_PROTOCOL })).map((n) => n.id), [101, 102]);

      assert.deepEqual(await nl.apply([nhOp(101, '10.5.9.0', vx)]), { applied: 1, failures: [] });
      assert.deepEqual((await nexthopsShown())[0], [101, '10.5.9.0', 'wt-vxh', '88', ['onlink']]);

      const del = await nl.apply([
        { kind: 'nexthop-delete', nexthop: { id: 101 } },
        { kind: 'nexthop-delete', nexthop: { id: 102 } },
        { kind: 'nexthop-delete', nexthop: { id: 103 } },
        { kind: 'nexthop-delete', nexthop: { id: 104 } }, // never existed: ENOENT counts as applied
      ]);
      assert.deepEqual(del, { applied: 4, failures: [] });
      assert.deepEqual(await nexthopsShown(), []);
      assert.deepEqual(await nl.nexthops(), []);
    });

    it('a route with nhid reads "via … dev … onlink" in ip route and in routes(), with its nhid', async () => {
      const res = await nl.apply([nhOp(201, '10.5.2.0', vx), nhRoute('10.5.2.0/24', 201), nhOp(202, 'fd05:2::', vx), nhRoute('fd05:2::/64', 202)]);
      assert.deepEqual(res, { applied: 4, failures: [] });
      assert.equal(await routeText('10.5.2.0/24'), '10.5.2.0/24 nhid 201 via 10.5.2.0 dev wt-vxh proto 88 onlink');
      const [shown] = (await json<IpRoute>('ip', '-j', 'route', 'show')).filter((r) => r.protocol === '88');
      assert.deepEqual(shown, { dst: '10.5.2.0/24', nhid: 201, gateway: '10.5.2.0', dev: 'wt-vxh', protocol: '88', flags: ['onlink'] });
      assert.equal(
        (await ip('-6', 'route', 'show', 'fd05:2::/64')).trim(),
        'fd05:2::/64 nhid 202 via fd05:2:: dev wt-vxh proto 88 metric 1024 onlink pref medium',
      );

      const view = (r: { dst: IPNet; gateway: IPAddr | null; oif: number | null; onlink: boolean; nhid: number | null; protocol: number; table: number; type: string }) =>
        [String(r.dst), String(r.gateway), r.oif, r.onlink, r.nhid, r.protocol, r.table, r.type];
      assert.deepEqual((await nl.routes({ family: 4, protocol: 88 })).map(view), [['10.5.2.0/24', '10.5.2.0', vx, true, 201, 88, MAIN_TABLE, 'unicast']]);
      assert.deepEqual((await nl.routes({ family: 6, protocol: 88 })).map(view), [['fd05:2::/64', 'fd05:2::', vx, true, 202, 88, MAIN_TABLE, 'unicast']]);
      assert.deepEqual((await nl.routes({ family: 4, oif: vx })).map((r) => String(r.dst)), ['10.5.2.0/24']);

      // Replacing the nexthop moves every route that uses it.
      await nl.apply([nhOp(201, '10.5.9.0', vx)]);
      assert.equal(await routeText('10.5.2.0/24'), '10.5.2.0/24 nhid 201 via 10.5.9.0 dev wt-vxh proto 88 onlink');
      assert.deepEqual((await nl.routes({ family: 4, protocol: 88 })).map(view), [['10.5.2.0/24', '10.5.9.0', vx, true, 201, 88, MAIN_TABLE, 'unicast']]);

      // And back to the plain form (the fallback without nexthops): the route loses its nhid.
      await nl.apply([{ kind: 'route-replace', route: { dst: N('10.5.2.0/24'), gateway: A('10.5.2.0'), oif: vx, onlink: true } }]);
      assert.equal(await routeText('10.5.2.0/24'), '10.5.2.0/24 via 10.5.2.0 dev wt-vxh proto 88 onlink');
      assert.deepEqual((await nl.routes({ family: 4, protocol: 88 })).map(view), [['10.5.2.0/24', '10.5.2.0', vx, true, null, 88, MAIN_TABLE, 'unicast']]);
    });

    it('with nexthop_compat_mode=0 the kernel omits via/dev; routes() fills them from the nexthop', async () => {
      const sysctl = '/proc/sys/net/ipv4/nexthop_compat_mode';
      assertPrivateNetns(); // the sysctl is per network namespace: only ours changes
      const before = readFileSync(sysctl, 'utf8').trim();
      await nl.apply([nhOp(251, '10.5.2.0', vx), nhRoute('10.5.2.0/24', 251), nhOp(252, 'fd05:2::', vx), nhRoute('fd05:2::/64', 252)]);
      writeFileSync(sysctl, '0');
      try {
        const [raw] = await json<IpRoute>('ip', '-j', 'route', 'show', '10.5.2.0/24');
        assert.deepEqual([raw?.nhid, raw?.gateway, raw?.dev], [251, undefined, undefined]);
        const r4 = await nl.routes({ family: 4, protocol: 88, oif: vx });
        assert.deepEqual(r4.map((r) => [String(r.dst), String(r.gateway), r.oif, r.onlink, r.nhid]), [['10.5.2.0/24', '10.5.2.0', vx, true, 251]]);
        const r6 = await nl.routes({ family: 6, protocol: 88 });
        assert.deepEqual(r6.map((r) => [String(r.dst), String(r.gateway), r.oif, r.onlink, r.nhid]), [['fd05:2::/64', 'fd05:2::', vx, true, 252]]);
      } finally {
        writeFileSync(sysctl, before);
      }
    });

    it('deleting a nexthop route: IPv4 needs dst alone or nhid (with via/dev it is "gone" but stays); IPv6 ignores via/dev', async () => {
      await nl.apply([nhOp(301, '10.5.3.0', vx), nhRoute('10.5.3.0/24', 301), nhOp(302, 'fd05:3::', vx), nhRoute('fd05:3::/64', 302)]);
      // The kernel's fib_nh_match never matches a gateway/device against a nexthop object: ESRCH,
      // which apply() counts as "already gone". The route stays. This is the trap the type docs name.
      const byVia = await nl.apply([{ kind: 'route-delete', route: { dst: N('10.5.3.0/24'), gateway: A('10.5.3.0'), oif: vx } }]);
      assert.deepEqual(byVia, { applied: 1, failures: [] });
      assert.equal(await routeText('10.5.3.0/24'), '10.5.3.0/24 nhid 301 via 10.5.3.0 dev wt-vxh proto 88 onlink');
      // A delete naming a nexthop that does not exist is invalid to the kernel, not "gone".
      const wrongId = await nl.apply([{ kind: 'route-delete', route: { dst: N('10.5.3.0/24'), nhid: 999 } }]);
      assert.deepEqual(wrongId.failures.map((f) => [f.error.errno, f.error.op]), [['EINVAL', 'route-delete 10.5.3.0/24 nhid 999']]);
      assert.notEqual(await routeText('10.5.3.0/24'), '');
      assert.deepEqual(await nl.apply([{ kind: 'route-delete', route: { dst: N('10.5.3.0/24'), nhid: 301 } }]), { applied: 1, failures: [] });
      assert.equal(await routeText('10.5.3.0/24'), '');

      const v6 = await nl.apply([{ kind: 'route-delete', route: { dst: N('fd05:3::/64'), gateway: A('fd05:3::'), oif: vx } }]);
      assert.deepEqual(v6, { applied: 1, failures: [] });
      assert.deepEqual(await json<IpRoute>('ip', '-j', '-6', 'route', 'show', 'proto', '88'), []);
      // The nexthops outlive their routes.
      assert.deepEqual((await nl.nexthops()).map((n) => n.id), [301, 302]);
    });

    it('deleting a nexthop that routes still use makes the kernel delete those routes too', async () => {
      await nl.apply([
        nhOp(401, '10.5.4.0', vx),
        nhRoute('10.5.4.0/24', 401),
        nhRoute('10.5.5.0/24', 401),
        nhOp(402, '10.5.6.0', vx),
        nhRoute('10.5.6.0/24', 402),
      ]);
      assert.equal((await nl.routes({ family: 4, protocol: 88 })).length, 3);
      assert.deepEqual(await nl.apply([{ kind: 'nexthop-delete', nexthop: { id: 401 } }]), { applied: 1, failures: [] });
      assert.equal(await routeText('proto', '88'), '10.5.6.0/24 nhid 402 via 10.5.6.0 dev wt-vxh onlink');
      assert.deepEqual((await nl.routes({ family: 4, protocol: 88 })).map((r) => [String(r.dst), r.nhid]), [['10.5.6.0/24', 402]]);
      assert.deepEqual((await nl.nexthops()).map((n) => n.id), [402]);
      // Again: already gone counts as applied.
      assert.deepEqual(await nl.apply([{ kind: 'nexthop-delete', nexthop: { id: 401 } }]), { applied: 1, failures: [] });
    });

    it('reports what the kernel rejects (missing nexthop, missing device) and what never reaches it', async () => {
      const missingNh = nhRoute('10.5.7.0/24', 999);
      const zeroId = nhOp(0, '10.5.7.0', vx);
      const noDev = nhOp(501, '10.5.7.0', 99999);
      const ok = nhOp(502, '10.5.7.0', vx);
      const badRouteId = nhRoute('10.5.8.0/24', 2 ** 32);
      const res = await nl.apply([missingNh, zeroId, noDev, ok, badRouteId]);
      assert.equal(res.applied, 1);
      assert.deepEqual(
        res.failures.map((f) => [f.op, f.error.errno, f.error.op, f.error.detail]),
        [
          [missingNh, 'EINVAL', 'route-replace 10.5.7.0/24 nhid 999', 'Request rejected: EINVAL'],
          [zeroId, 'EINVAL', `nexthop-replace id 0 via 10.5.7.0 dev ${vx} onlink`, 'invalid argument: nexthop id must be 1..2^32-1, got 0'],
          [noDev, 'EINVAL', 'nexthop-replace id 501 via 10.5.7.0 dev 99999 onlink', 'Request rejected: EINVAL'],
          [badRouteId, 'EINVAL', 'route-replace 10.5.8.0/24 nhid 4294967296', 'invalid argument: nexthop id must be 1..2^32-1, got 4294967296'],
        ],
      );
      assert.deepEqual(await nexthopsShown(), [[502, '10.5.7.0', 'wt-vxh', '88', ['onlink']]]);
    });
  });

  describe('neighbours and FDB', () => {
    let vx: number;
    let vx6: number;
    before(async () => {
      vx = await vxlan({ name: 'wt-vxn', vni: 70 });
      vx6 = await vxlan({ name: 'wt-vxn6', vni: 71, local: A('fd99::1') });
    });

    const permanent = async (dev: string, family: '-4' | '-6'): Promise<string[]> =>
      (await json<IpNeigh>('ip', '-j', family, 'neigh', 'show', 'dev', dev, 'nud', 'permanent')).map((n) => `${n.dst} ${n.lladdr}`);

    it('replaces, lists and deletes IPv4 and IPv6 neighbours (PERMANENT)', async () => {
      const res = await nl.apply([
        { kind: 'neigh-replace', neigh: { ifindex: vx, ip: A('10.5.2.0'), mac: 'aa:bb:cc:dd:ee:01' } },
        { kind: 'neigh-replace', neigh: { ifindex: vx, ip: A('10.5.2.0'), mac: 'AA:BB:CC:DD:EE:02' } },
        { kind: 'neigh-replace', neigh: { ifindex: vx6, ip: A('fd05:2::'), mac: 'aa:bb:cc:dd:ee:03' } },
      ]);
      assert.deepEqual(res, { applied: 3, failures: [] });
      assert.deepEqual(await permanent('wt-vxn', '-4'), ['10.5.2.0 aa:bb:cc:dd:ee:02']);
      assert.deepEqual(await permanent('wt-vxn6', '-6'), ['fd05:2:: aa:bb:cc:dd:ee:03']);

      const n4 = await nl.neighbours(vx, 4);
      assert.deepEqual(
        n4.map((n) => [String(n.ip), n.mac, n.state, n.permanent, n.ifindex]),
        [['10.5.2.0', 'aa:bb:cc:dd:ee:02', NUD.PERMANENT, true, vx]],
      );
      const n6 = (await nl.neighbours(vx6, 6)).filter((n) => n.permanent);
      assert.deepEqual(
        n6.map((n) => [String(n.ip), n.mac, n.state]),
        [['fd05:2::', 'aa:bb:cc:dd:ee:03', NUD.PERMANENT]],
      );

      const del = await nl.apply([
        { kind: 'neigh-delete', neigh: { ifindex: vx, ip: A('10.5.2.0') } },
        { kind: 'neigh-delete', neigh: { ifindex: vx6, ip: A('fd05:2::') } },
        { kind: 'neigh-delete', neigh: { ifindex: vx, ip: A('10.5.2.0') } }, // gone: ENOENT counts as applied
      ]);
      assert.deepEqual(del, { applied: 3, failures: [] });
      assert.deepEqual(await permanent('wt-vxn', '-4'), []);
      assert.deepEqual(await permanent('wt-vxn6', '-6'), []);
    });

    it('replaces, lists and deletes FDB entries with IPv4 and IPv6 destinations', async () => {
      const fdbShown = async (dev: string): Promise<string[]> =>
        (await json<BridgeFdb>('bridge', '-j', 'fdb', 'show', 'dev', dev))
          .filter((f) => f.dst !== undefined)
          .map((f) => `${f.mac} ${f.dst} ${f.flags.join(',')} ${f.state}`);
      const res = await nl.apply([
        { kind: 'fdb-replace', fdb: { ifindex: vx, mac: 'aa:bb:cc:dd:ee:01', dst: A('10.99.0.2') } },
        { kind: 'fdb-replace', fdb: { ifindex: vx, mac: 'aa:bb:cc:dd:ee:01', dst: A('10.99.0.3') } }, // moves it
        { kind: 'fdb-replace', fdb: { ifindex: vx, mac: 'aa:bb:cc:dd:ee:02', dst: A('10.99.0.4') } },
        { kind: 'fdb-replace', fdb: { ifindex: vx6, mac: 'aa:bb:cc:dd:ee:03', dst: A('fd99::2') } },
      ]);
      assert.deepEqual(res, { applied: 4, failures: [] });
      assert.deepEqual((await fdbShown('wt-vxn')).sort(), [
        'aa:bb:cc:dd:ee:01 10.99.0.3 self permanent',
        'aa:bb:cc:dd:ee:02 10.99.0.4 self permanent',
      ]);
      assert.deepEqual(await fdbShown('wt-vxn6'), ['aa:bb:cc:dd:ee:03 fd99::2 self permanent']);

      const listed = (await nl.fdb(vx)).map((f) => `${f.mac} ${String(f.dst)} ${f.self} ${f.permanent} ${f.ifindex}`);
      assert.deepEqual(listed.sort(), [`aa:bb:cc:dd:ee:01 10.99.0.3 true true ${vx}`, `aa:bb:cc:dd:ee:02 10.99.0.4 true true ${vx}`]);
      assert.deepEqual(
        (await nl.fdb(vx6)).map((f) => `${f.mac} ${String(f.dst)}`),
        ['aa:bb:cc:dd:ee:03 fd99::2'],
      );

      const del = await nl.apply([
        { kind: 'fdb-delete', fdb: { ifindex: vx, mac: 'aa:bb:cc:dd:ee:01', dst: A('10.99.0.3') } },
        { kind: 'fdb-delete', fdb: { ifindex: vx, mac: 'aa:bb:cc:dd:ee:02', dst: null } },
        { kind: 'fdb-delete', fdb: { ifindex: vx6, mac: 'aa:bb:cc:dd:ee:03', dst: A('fd99::2') } },
        { kind: 'fdb-delete', fdb: { ifindex: vx6, mac: 'aa:bb:cc:dd:ee:03', dst: null } }, // gone
      ]);
      assert.deepEqual(del, { applied: 4, failures: [] });
      assert.deepEqual(await fdbShown('wt-vxn'), []);
      assert.deepEqual(await fdbShown('wt-vxn6'), []);
    });
  });

  describe('apply', () => {
    let vx: number;
    beforeEach(async () => {
      vx = await vxlan({ name: 'wt-vxb', vni: 80 });
    });
    afterEach(async () => {
      await delLink('wt-vxb'); // takes its neighbours, FDB entries and routes with it
      await ip('route', 'flush', 'proto', '88').catch(() => undefined);
    });

    /** Peer i of a flannel-style vxlan network: subnet 10.128+.x.0/24, VTEP MAC, public IP. */
    const peer = (i: number) => {
      const subnet = IPNet.of(IPAddr.of(4, A('10.128.0.0').value + BigInt(i) * 256n), 24);
      const mac = `0e:00:00:00:${((i >> 8) & 255).toString(16).padStart(2, '0')}:${(i & 255).toString(16).padStart(2, '0')}`;
      const pub = IPAddr.of(4, A('10.99.1.0').value + BigInt(i));
      return { subnet, mac, pub };
    };
    const peerOps = (i: number): NetlinkOp[] => {
      const p = peer(i);
      return [
        { kind: 'neigh-replace', neigh: { ifindex: vx, ip: p.subnet.ip, mac: p.mac } },
        { kind: 'fdb-replace', fdb: { ifindex: vx, mac: p.mac, dst: p.pub } },
        { kind: 'route-replace', route: { dst: p.subnet, gateway: p.subnet.ip, oif: vx, onlink: true } },
      ];
    };

    it('applies 2 000 mixed operations in one call, all present afterwards', async () => {
      const ops: NetlinkOp[] = [];
      for (let i = 0; i < 500; i++) ops.push(...peerOps(i));
      for (let i = 0; i < 500; i++) {
        ops.push({ kind: 'route-replace', route: { dst: IPNet.of(IPAddr.of(6, A('fd10::').value + (BigInt(i) << 64n)), 64), gateway: A('fd99::2'), oif: u0, onlink: false } });
      }
      assert.equal(ops.length, 2000);
      assert.deepEqual(await nl.apply(ops), { applied: 2000, failures: [] });

      const neigh = await json<IpNeigh>('ip', '-j', '-4', 'neigh', 'show', 'dev', 'wt-vxb', 'nud', 'permanent');
      const fdb = (await json<BridgeFdb>('bridge', '-j', 'fdb', 'show', 'dev', 'wt-vxb')).filter((f) => f.dst);
      const r4 = await json<IpRoute>('ip', '-j', 'route', 'show', 'dev', 'wt-vxb', 'proto', '88');
      const r6 = await json<IpRoute>('ip', '-j', '-6', 'route', 'show', 'proto', '88');
      assert.deepEqual([neigh.length, fdb.length, r4.length, r6.length], [500, 500, 500, 500]);
      const p = peer(321);
      assert.ok(neigh.some((n) => n.dst === p.subnet.ip.toString() && n.lladdr === p.mac));
      assert.ok(fdb.some((f) => f.mac === p.mac && f.dst === p.pub.toString()));
      assert.ok(r4.some((r) => r.dst === p.subnet.toString() && r.gateway === p.subnet.ip.toString() && r.flags.includes('onlink')));
      await ip('-6', 'route', 'flush', 'proto', '88');
    });

    it('reports a failing op with its errno and applies the others', async () => {
      const ops: NetlinkOp[] = [...peerOps(1), ...peerOps(2)];
      const bad: NetlinkOp = { kind: 'neigh-replace', neigh: { ifindex: 99999, ip: A('10.128.9.0'), mac: '0e:00:00:00:00:09' } };
      const badRoute: NetlinkOp = { kind: 'route-replace', route: { dst: N('10.128.8.0/24'), gateway: A('10.128.8.0'), oif: 99999, onlink: true } };
      const invalid: NetlinkOp = { kind: 'fdb-replace', fdb: { ifindex: vx, mac: 'not-a-mac', dst: A('10.99.0.9') } };
      ops.splice(2, 0, bad);
      ops.splice(5, 0, badRoute, invalid);
      const res = await nl.apply(ops);
      assert.equal(res.applied, 6);
      assert.deepEqual(
        res.failures.map((f) => [f.op, f.error.errno, f.error.op]),
        [
          [bad, 'ENODEV', 'neigh-replace 10.128.9.0 lladdr 0e:00:00:00:00:09 dev 99999'],
          [badRoute, 'ENODEV', 'route-replace 10.128.8.0/24 via 10.128.8.0 dev 99999 onlink'],
          [invalid, 'EINVAL', `fdb-replace not-a-mac dev ${vx} dst 10.99.0.9`],
        ],
      );
      assert.ok(res.failures.every((f) => f.error instanceof NetlinkError));
      assert.equal(res.failures[2]?.error.detail, 'invalid argument: bad MAC address "not-a-mac"');
      const r4 = await json<IpRoute>('ip', '-j', 'route', 'show', 'proto', '88');
      assert.deepEqual(r4.map((r) => r.dst), ['10.128.1.0/24', '10.128.2.0/24']);
      const neigh = await json<IpNeigh>('ip', '-j', '-4', 'neigh', 'show', 'dev', 'wt-vxb', 'nud', 'permanent');
      assert.deepEqual(neigh.map((n) => n.dst).sort(), ['10.128.1.0', '10.128.2.0']);
    });

    it('dumps 10 000 routes and 10 000 neighbours', async () => {
      const ops: NetlinkOp[] = [];
      for (let i = 0; i < 10_000; i++) {
        const p = peer(i);
        // The same gateway for all: one kernel nexthop, so the insert is fast (see the bench).
        ops.push({ kind: 'route-replace', route: { dst: p.subnet, gateway: A('10.99.0.2'), oif: null, onlink: false, table: 1000 } });
        ops.push({ kind: 'neigh-replace', neigh: { ifindex: vx, ip: p.subnet.ip, mac: p.mac } });
      }
      assert.deepEqual(await nl.apply(ops), { applied: 20_000, failures: [] });
      const t0 = performance.now();
      const routes = await nl.routes({ family: 4, table: 1000 });
      const t1 = performance.now();
      const neigh = await nl.neighbours(vx, 4);
      const t2 = performance.now();
      assert.equal(routes.length, 10_000);
      assert.equal(neigh.length, 10_000);
      assert.equal(routes.filter((r) => r.protocol === WEFT_ROUTE_PROTOCOL && String(r.gateway) === '10.99.0.2').length, 10_000);
      assert.equal(new Set(routes.map((r) => String(r.dst))).size, 10_000);
      assert.equal(neigh.filter((n) => n.permanent).length, 10_000);
      // Informational: the dump cost at this scale.
      console.log(`      dump: 10000 routes in ${(t1 - t0).toFixed(0)} ms, 10000 neighbours in ${(t2 - t1).toFixed(0)} ms`);
      await ip('route', 'flush', 'table', '1000');
    });

    it('concurrent dumps and applies on one handle do not interfere', async () => {
      const [r, n, f, res, links] = await Promise.all([
        nl.routes({ family: 4 }),
        nl.neighbours(vx, 4),
        nl.fdb(vx),
        nl.apply([...peerOps(1), ...peerOps(2)]),
        nl.links(),
      ]);
      assert.ok(r.some((x) => String(x.dst) === '10.99.0.0/24' && x.protocol === 2), 'kernel route in the dump');
      // Each dump saw the device either before or after the batch, never a torn reply.
      assert.ok([0, 1, 2].includes(n.filter((x) => x.permanent).length), `neighbours: ${n.length}`);
      assert.ok([0, 1, 2].includes(f.filter((x) => x.dst !== null).length), `fdb: ${f.length}`);
      assert.deepEqual(res, { applied: 6, failures: [] });
      assert.ok(links.some((l) => l.name === 'wt-vxb' && l.index === vx));
      assert.deepEqual(
        (await nl.neighbours(vx, 4)).map((x) => `${String(x.ip)} ${x.mac}`).sort(), // hash order
        [`10.128.1.0 ${peer(1).mac}`, `10.128.2.0 ${peer(2).mac}`],
      );
    });
  });

  describe('apply packing', () => {
    const DEV = 'wt-vxp';
    let vx: number;
    beforeEach(async () => {
      vx = await vxlan({ name: DEV, vni: 90 });
    });
    afterEach(async () => {
      await delLink(DEV); // takes its neighbours, FDB entries, nexthops and their routes with it
      await ip('route', 'flush', 'proto', '88').catch(() => undefined);
      await ip('nexthop', 'flush').catch(() => undefined);
    });

    /**
     * `count` ops cycling through neigh/fdb/nexthop/route-via-that-nexthop/plain route, with
     * failures sprinkled in at fixed strides and at the edges of 64-op packs. A small model
     * tracks what the kernel must answer for each and what it must hold afterwards.
     */
    function sprinkled(count: number, dev: number) {
      const ops: NetlinkOp[] = [];
      const expected: Array<[number, string]> = [];
      const nexthops = new Set<number>();
      const neighs = new Set<string>();
      const fdbs = new Set<string>();
      const routes = new Set<string>();
      const subnet = (i: number): IPNet => IPNet.of(IPAddr.of(4, A('10.128.0.0').value + BigInt(i) * 256n), 24);
      const mac = (i: number): string => `0e:00:00:${((i >> 16) & 255).toString(16).padStart(2, '0')}:${((i >> 8) & 255).toString(16).padStart(2, '0')}:${(i & 255).toString(16).padStart(2, '0')}`;
      const fail = new Set([0, 62, 63, 64, 127, 128, count - 1]);
      for (let i = 0; i < count; i++) {
        const s = subnet(i);
        if (fail.has(i) || i % 97 === 5) {
          ops.push({ kind: 'route-replace', route: { dst: s, gateway: s.ip, oif: 99999, onlink: true } });
          expected.push([i, 'ENODEV']);
        } else if (i % 101 === 7) {
          ops.push({ kind: 'neigh-replace', neigh: { ifindex: dev, ip: s.ip, mac: 'zz:00:00:00:00:00' } });
          expected.push([i, 'EINVAL']); // never sent
        } else if (i % 103 === 9) {
          ops.push({ kind: 'route-replace', route: { dst: s, gateway: null, oif: null, onlink: false, nhid: 9_999_999 } });
          expected.push([i, 'EINVAL']);
        } else if (i % 107 === 11) {
          ops.push({ kind: 'neigh-delete', neigh: { ifindex: dev, ip: A('10.200.0.1') } }); // gone: applied
        } else if (i % 109 === 13) {
          ops.push({ kind: 'neigh-replace', neigh: { ifindex: 99999, ip: s.ip, mac: mac(i) } });
          expected.push([i, 'ENODEV']);
        } else if (i % 113 === 15) {
          ops.push({ kind: 'nexthop-delete', nexthop: { id: 8_888_888 } }); // gone: applied
        } else {
          switch (i % 5) {
            case 0:
              ops.push({ kind: 'neigh-replace', neigh: { ifindex: dev, ip: s.ip, mac: mac(i) } });
              neighs.add(String(s.ip));
              break;
            case 1:
              ops.push({ kind: 'fdb-replace', fdb: { ifindex: dev, mac: mac(i), dst: IPAddr.of(4, A('10.99.1.0').value + BigInt(i)) } });
              fdbs.add(mac(i));
              break;
            case 2:
              ops.push({ kind: 'nexthop-replace', nexthop: { id: 1000 + i, gateway: s.ip, oif: dev, onlink: true } });
              nexthops.add(1000 + i);
              break;
            case 3:
              // Uses the nexthop of the op before it, which may itself have been replaced by a failure.
              ops.push({ kind: 'route-replace', route: { dst: s, gateway: null, oif: null, onlink: false, nhid: 1000 + i - 1 } });
              if (nexthops.has(1000 + i - 1)) routes.add(String(s));
              else expected.push([i, 'EINVAL']);
              break;
            default:
              ops.push({ kind: 'route-replace', route: { dst: s, gateway: s.ip, oif: dev, onlink: true } });
              routes.add(String(s));
          }
        }
      }
      return { ops, expected, want: { neighs: neighs.size, fdbs: fdbs.size, nexthops: nexthops.size, routes: [...routes].sort() } };
    }

    async function checkSprinkled(h: Netlink, count: number): Promise<void> {
      const { ops, expected, want } = sprinkled(count, vx);
      const res = await h.apply(ops);
      assert.deepEqual(
        res.failures.map((f) => [ops.indexOf(f.op), f.error.errno]),
        expected,
      );
      assert.equal(res.applied, count - expected.length);
      assert.ok(res.failures.every((f) => f.error instanceof NetlinkError));
      const neigh = await json<IpNeigh>('ip', '-j', '-4', 'neigh', 'show', 'dev', DEV, 'nud', 'permanent');
      const fdb = (await json<BridgeFdb>('bridge', '-j', 'fdb', 'show', 'dev', DEV)).filter((f) => f.dst);
      const nh = await json<IpNexthop>('ip', '-j', 'nexthop', 'show', 'dev', DEV);
      const routes = (await json<IpRoute>('ip', '-j', 'route', 'show', 'dev', DEV, 'proto', '88')).map((r) => r.dst).sort();
      assert.deepEqual([neigh.length, fdb.length, nh.length], [want.neighs, want.fdbs, want.nexthops]);
      assert.deepEqual(routes, want.routes);
    }

    it('5 000 mixed ops with failures sprinkled in: exact per-op failures in op order (default packing)', async () => {
      assert.deepEqual(nl.applyLimits, { maxInFlight: 128, packSize: 64 });
      await checkSprinkled(nl, 5000);
    });

    it('the same with uneven packs (maxInFlight 7, 3 per sendmsg)', async () => {
      const h = Netlink.open({ maxInFlight: 7, packSize: 3 });
      try {
        assert.deepEqual(h.applyLimits, { maxInFlight: 7, packSize: 3 });
        await checkSprinkled(h, 5000);
      } finally {
        h.close();
      }
    });

    it('the same with an ACK requested for every message, and with one message per sendmsg', async () => {
      const each = Netlink.open({ ackEach: true, packSize: 50 });
      const single = Netlink.open({ packSize: 1 });
      try {
        await checkSprinkled(each, 5000);
        await delLink(DEV);
        await ip('route', 'flush', 'proto', '88');
        vx = await vxlan({ name: DEV, vni: 90 });
        await checkSprinkled(single, 2000);
      } finally {
        each.close();
        single.close();
      }
    });

    it('packSize is capped by maxInFlight, maxInFlight by the receive buffer; bad packSize throws', () => {
      const h = Netlink.open({ maxInFlight: 5 });
      const big = Netlink.open({ maxInFlight: 1_000_000 });
      try {
        assert.deepEqual(h.applyLimits, { maxInFlight: 5, packSize: 5 });
        // 4 MiB asked for: at most 8 MiB of accounting (SO_RCVBUF is doubled) at 2 KiB per answer.
        assert.ok(big.applyLimits.maxInFlight <= 4096 && big.applyLimits.maxInFlight >= 128, String(big.applyLimits.maxInFlight));
      } finally {
        h.close();
        big.close();
      }
      assert.throws(() => Netlink.open({ packSize: 0 }), RangeError);
    });

    it('concurrent apply() calls are sent in call order, ops in op order', async () => {
      const h = Netlink.open({ maxInFlight: 4, packSize: 2 });
      try {
        const r = N('10.5.10.0/24');
        const r2 = N('10.5.11.0/24');
        const neigh = (mac: string): NetlinkOp => ({ kind: 'neigh-replace', neigh: { ifindex: vx, ip: A('10.5.10.0'), mac } });
        const add = (dst: IPNet): NetlinkOp => ({ kind: 'route-replace', route: { dst, gateway: dst.ip, oif: vx, onlink: true } });
        const del = (dst: IPNet): NetlinkOp => ({ kind: 'route-delete', route: { dst } });
        const results = await Promise.all([
          h.apply([neigh('0e:00:00:00:00:01'), add(r), neigh('0e:00:00:00:00:02')]),
          h.apply([neigh('0e:00:00:00:00:03'), del(r), del(r2), add(r2)]),
          h.apply([neigh('0e:00:00:00:00:04')]),
        ]);
        assert.deepEqual(
          results.map((x: ApplyResult) => [x.applied, x.failures.length]),
          [[3, 0], [4, 0], [1, 0]],
        );
        const shown = await json<IpNeigh>('ip', '-j', '-4', 'neigh', 'show', 'dev', DEV, 'nud', 'permanent');
        assert.deepEqual(shown.map((n) => `${n.dst} ${n.lladdr}`), ['10.5.10.0 0e:00:00:00:00:04']);
        assert.deepEqual((await json<IpRoute>('ip', '-j', 'route', 'show', 'dev', DEV, 'proto', '88')).map((x) => x.dst), ['10.5.11.0/24']);
      } finally {
        h.close();
      }
    });

    it('close() during a large apply() settles every op: unanswered ones fail with ECANCELED, in order', async () => {
      const h = Netlink.open({ maxInFlight: 8, packSize: 4 });
      const ops: NetlinkOp[] = [];
      for (let i = 0; i < 3000; i++) {
        ops.push({ kind: 'neigh-replace', neigh: { ifindex: vx, ip: IPAddr.of(4, A('10.130.0.0').value + BigInt(i)), mac: '0e:00:00:00:00:01' } });
      }
      const pending = h.apply(ops);
      h.close(); // the first packs went out inside apply(); their answers are never read
      const res = await pending;
      assert.equal(res.applied, 0);
      assert.equal(res.failures.length, 3000);
      assert.ok(res.failures.every((f, i) => f.op === ops[i] && f.error.errno === 'ECANCELED'));
      assert.equal(res.failures[0]?.error.op, `neigh-replace 10.130.0.0 lladdr 0e:00:00:00:00:01 dev ${vx}`);
    });
  });

  describe('watchLinks', () => {
    it('sees a new veth and its deletion', async () => {
      const events: LinkEvent[] = [];
      const watch = nl.watchLinks((ev) => events.push(ev));
      try {
        await ip('link', 'add', 'wt-w0', 'type', 'veth', 'peer', 'name', 'wt-w1');
        made.push('wt-w0');
        const added = await waitFor(() => events.find((e) => e.type === 'new' && e.link.name === 'wt-w0'), {
          what: 'RTM_NEWLINK for wt-w0',
        });
        assert.equal(added.link.kind, 'veth');
        const [shown] = await json<IpLink>('ip', '-j', 'link', 'show', 'wt-w0');
        assert.equal(added.link.index, shown?.ifindex);
        await ip('link', 'del', 'wt-w0');
        const removed = await waitFor(() => events.find((e) => e.type === 'del' && e.link.name === 'wt-w0'), {
          what: 'RTM_DELLINK for wt-w0',
        });
        assert.equal(removed.link.index, added.link.index);
        assert.ok(events.some((e) => e.type === 'del' && e.link.name === 'wt-w1'));
      } finally {
        watch.close();
      }
    });

    it('a callback that throws does not abort the process: it surfaces as an ordinary uncaught exception', async () => {
      const seen: string[] = [];
      // Mocha reports uncaught exceptions as test failures; take them over for this test.
      const mochaHandlers = process.listeners('uncaughtException');
      process.removeAllListeners('uncaughtException');
      const onUncaught = (e: Error): void => {
        seen.push(e.message);
      };
      process.on('uncaughtException', onUncaught);
      const watch = nl.watchLinks((ev) => {
        if (ev.link.name === 'wt-t0') throw new Error(`boom ${ev.type}`);
      });
      try {
        await ip('link', 'add', 'wt-t0', 'type', 'veth', 'peer', 'name', 'wt-t1');
        await waitFor(() => seen.includes('boom new'), { what: 'the rethrown callback error' });
      } finally {
        watch.close();
        process.off('uncaughtException', onUncaught);
        for (const h of mochaHandlers) process.on('uncaughtException', h);
        await delLink('wt-t0');
      }
    });
  });

  describe('lifecycle', () => {
    it('a closed handle rejects with ECANCELED', async () => {
      const h = Netlink.open({ maxInFlight: 4 });
      assert.equal((await h.link('wt-u0'))?.index, u0);
      h.close();
      await assert.rejects(h.link('wt-u0'), (e: unknown) => e instanceof NetlinkError && e.errno === 'ECANCELED' && e.op === 'link-get wt-u0');
      const res = await h.apply([{ kind: 'neigh-delete', neigh: { ifindex: u0, ip: A('10.99.0.7') } }]);
      assert.deepEqual(
        res.failures.map((f) => [f.error.errno, f.error.op]),
        [['ECANCELED', `neigh-delete 10.99.0.7 dev ${u0}`]],
      );
    });
  });
});
