// The bridge plugin bundle against real kernels objects, in namespaces created here: a "host"
// netns per case (the plugin runs inside it via `ip netns exec`, so links, sysctls and iptables
// land there) and pod netns. Differential cases run the same config through Debian's reference
// bridge + host-local (v1.1.1) in twin namespaces and compare results and kernel state.
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { masqChainName } from '../../cni-plugins/bridge/ipmasq.js';
import { cniBinDir, REFERENCE_CNI_DIR, runCni, type CniRun } from '../helpers/cni.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

const PREFIX = nsPrefix('br');
let seq = 0;
const namespaces: string[] = [];
let tmp = '';
let binDir = '';

type Json = Record<string, unknown>;

interface Site {
  readonly host: string;
  readonly pod: string;
  readonly dataDir: string;
}

async function netns(tag: string): Promise<string> {
  const name = `${PREFIX}-${tag}${seq++}`;
  namespaces.push(name);
  await addNetns(name);
  return name;
}

async function site(tag: string): Promise<Site> {
  const host = await netns(`${tag}h`);
  const pod = await netns(`${tag}p`);
  return { host, pod, dataDir: join(tmp, host) };
}

function conf(s: Site, extra: Json = {}, ipam: Json | null = { ranges: [[{ subnet: '10.88.0.0/24' }]] }): Json {
  const c: Json = { cniVersion: '1.0.0', name: 'wtnet', type: 'bridge', bridge: 'wtbr0', ...extra };
  if (ipam) c.ipam = { type: 'host-local', dataDir: s.dataDir, ...ipam };
  return c;
}

interface RunOpts {
  readonly containerId?: string;
  readonly ifname?: string;
  /** CNI_NETNS; default the site's pod; null leaves it unset. */
  readonly netns?: string | null;
  readonly args?: string;
  readonly env?: Record<string, string>;
  readonly rawStdin?: string;
}

function run(dir: string, s: Site, command: string, stdin: Json, o: RunOpts = {}): Promise<CniRun> {
  const netnsPath = o.netns === null ? undefined : (o.netns ?? `/run/netns/${s.pod}`);
  return runCni(
    {
      bin: join(dir, 'bridge'),
      path: dir,
      command,
      hostNs: s.host,
      ...(o.containerId !== undefined ? { containerId: o.containerId } : {}),
      ...(o.ifname !== undefined ? { ifname: o.ifname } : {}),
      ...(netnsPath !== undefined ? { netns: netnsPath } : {}),
      ...(o.args !== undefined ? { args: o.args } : {}),
      ...(o.env !== undefined ? { env: o.env } : {}),
    },
    o.rawStdin ?? JSON.stringify(stdin),
  );
}

const ours = (s: Site, command: string, stdin: Json, o: RunOpts = {}) => run(binDir, s, command, stdin, o);
const ref = (s: Site, command: string, stdin: Json, o: RunOpts = {}) => run(REFERENCE_CNI_DIR, s, command, stdin, o);

function ok(r: CniRun): Json {
  assert.equal(r.exitCode, 0, `plugin failed: ${r.stdout}${r.stderr}`);
  return r.json as Json;
}

function err(r: CniRun): { code: number; msg: string } {
  assert.equal(r.exitCode, 1, `expected a failure, got: ${r.stdout}`);
  const j = r.json as { code: number; msg: string };
  return { code: j.code, msg: j.msg };
}

function withPrev(c: Json, result: Json): Json {
  return { ...c, prevResult: result };
}

interface Iface {
  name: string;
  mac?: string;
  sandbox?: string;
}

function hostVeth(result: Json): string {
  return (result.interfaces as Iface[])[1]!.name;
}

/** A result with MACs, the random veth name and the sandbox path made comparable. */
function normResult(result: Json): Json {
  const r = JSON.parse(JSON.stringify(result)) as Json;
  const veth = hostVeth(result);
  for (const i of r.interfaces as Iface[]) {
    if (i.mac !== undefined) i.mac = 'MAC';
    if (i.name === veth) i.name = 'VETH';
    if (i.sandbox !== undefined) i.sandbox = 'SANDBOX';
  }
  // Debian 1.1.1 prints an empty "dns": {}; weft's skel leaves it out, as current libcni does.
  if (r.dns !== undefined && Object.keys(r.dns as Json).length === 0) delete r.dns;
  return r;
}

interface LinkJson {
  ifname: string;
  flags: string[];
  mtu: number;
  txqlen?: number;
  master?: string;
  operstate: string;
  address: string;
  promiscuity?: number;
  linkinfo?: { info_kind?: string; info_slave_data?: { hairpin?: boolean; isolated?: boolean } };
}

async function linksIn(ns: string): Promise<LinkJson[]> {
  return JSON.parse(await ipn(ns, '-j', '-d', 'link', 'show')) as LinkJson[];
}

async function sysctl(ns: string, key: string): Promise<string> {
  return (await nsExec(ns, 'sysctl', '-n', key)).trim();
}

async function natRules(ns: string): Promise<string[]> {
  const text = await nsExec(ns, 'iptables-save', '-t', 'nat');
  return text.split('\n').filter((l) => l.startsWith('-A ') || (l.startsWith(':') && l.includes('CNI-')));
}

/** Host side, normalised: links (veth → VETH, MACs dropped), bridge addresses, routes, sysctls, nat. */
/**
 * The links once each bridge's carrier agrees with its ports: the kernel updates a bridge's
 * carrier asynchronously (linkwatch), so a snapshot taken right after ADD or DEL may catch
 * either state. A bridge that never settles is returned as it is, and the comparison fails.
 */
async function settledLinks(ns: string): Promise<LinkJson[]> {
  let links: LinkJson[] = [];
  const settled = (all: LinkJson[]) =>
    all
      .filter((b) => b.linkinfo?.info_kind === 'bridge' && b.flags.includes('UP'))
      .every((b) => {
        const portUp = all.some((p) => p.master === b.ifname && p.operstate === 'UP');
        return portUp ? b.operstate === 'UP' && !b.flags.includes('NO-CARRIER') : b.flags.includes('NO-CARRIER');
      });
  await waitFor(async () => settled((links = await linksIn(ns))), { timeoutMs: 5000, intervalMs: 50, what: 'bridge carrier to settle' }).catch(() => undefined);
  return links;
}

async function hostState(s: Site, veth: string | null, bridge = 'wtbr0'): Promise<Json> {
  const links = (await settledLinks(s.host)).map((l) => ({
    name: l.ifname === veth ? 'VETH' : l.ifname,
    kind: l.linkinfo?.info_kind ?? null,
    flags: l.flags,
    mtu: l.mtu,
    txqlen: l.txqlen ?? 0,
    master: l.master ?? null,
    operstate: l.operstate,
    hairpin: l.linkinfo?.info_slave_data?.hairpin ?? null,
    isolated: l.linkinfo?.info_slave_data?.isolated ?? null,
  }));
  const addrs = JSON.parse(await ipn(s.host, '-j', 'address', 'show', 'dev', bridge)) as Array<{
    addr_info: Array<{ family: string; local: string; prefixlen: number; broadcast?: string; scope: string }>;
  }>;
  const bridgeAddrs = addrs[0]!.addr_info.filter((a) => a.scope === 'global').map((a) => `${a.local}/${a.prefixlen} brd ${a.broadcast ?? '-'}`);
  const sys: Json = {
    ip_forward: await sysctl(s.host, 'net.ipv4.ip_forward'),
    v6_forwarding: await sysctl(s.host, 'net.ipv6.conf.all.forwarding'),
    bridge_accept_ra: await sysctl(s.host, `net.ipv6.conf.${bridge}.accept_ra`),
    bridge_addr_assign_type: (await nsExec(s.host, 'cat', `/sys/class/net/${bridge}/addr_assign_type`)).trim(),
  };
  if (veth) sys.veth_accept_ra = await sysctl(s.host, `net.ipv6.conf.${veth}.accept_ra`);
  return {
    links,
    bridgeAddrs,
    routes: (await ipn(s.host, 'route', 'show')).split('\n').map((l) => l.trim()).filter((l) => l !== ''),
    routes6: (await ipn(s.host, '-6', 'route', 'show'))
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l !== '' && !l.startsWith('fe80')),
    sys,
    nat: await natRules(s.host),
  };
}

/** Pod side, normalised. */
async function podState(s: Site, ifname = 'eth0'): Promise<Json> {
  const links = (await linksIn(s.pod)).map((l) => ({
    name: l.ifname,
    kind: l.linkinfo?.info_kind ?? null,
    flags: l.flags,
    mtu: l.mtu,
    txqlen: l.txqlen ?? 0,
    operstate: l.operstate,
  }));
  const state: Json = { links };
  if (links.some((l) => l.name === ifname)) {
    state.addrs = (await ipn(s.pod, '-br', 'address', 'show', 'dev', ifname)).trim().replace(/\s+/g, ' ').replace(/fe80::\S+/, 'LINKLOCAL');
    state.routes = (await ipn(s.pod, 'route', 'show')).split('\n').map((l) => l.trim()).filter((l) => l !== '');
    state.routes6 = (await ipn(s.pod, '-6', 'route', 'show')).split('\n').map((l) => l.trim()).filter((l) => l !== '');
    state.sys = {
      arp_notify: await sysctl(s.pod, `net.ipv4.conf.${ifname}.arp_notify`),
      accept_dad: await sysctl(s.pod, `net.ipv6.conf.${ifname}.accept_dad`),
      enhanced_dad: await sysctl(s.pod, `net.ipv6.conf.${ifname}.enhanced_dad`),
      disable_ipv6: await sysctl(s.pod, `net.ipv6.conf.${ifname}.disable_ipv6`),
    };
  }
  return state;
}

function ipFiles(s: Site, network = 'wtnet'): string[] {
  const dir = join(s.dataDir, network);
  if (!existsSync(dir)) return [];
  return readdirSync(dir).filter((f) => f !== 'lock' && !f.startsWith('last_reserved_ip'));
}

async function hostLinkNames(s: Site): Promise<string[]> {
  return (await linksIn(s.host)).map((l) => l.ifname).sort();
}

async function podHasLink(s: Site, name: string): Promise<boolean> {
  return (await linksIn(s.pod)).some((l) => l.ifname === name);
}

describe('bridge plugin (integration)', function () {
  this.timeout(180_000);
  let vlanFiltering = false;

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'wt-bridge-'));
    binDir = await cniBinDir();
    assert.ok(existsSync(join(binDir, 'bridge')), 'the bridge bundle was not built');
    // Does this kernel have bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)?
    const probe = await netns('probe');
    vlanFiltering = await ipn(probe, 'link', 'add', 'name', 'vf0', 'type', 'bridge', 'vlan_filtering', '1').then(
      () => true,
      () => false,
    );
  });

  after(async () => {
    for (const n of namespaces) await delNetns(n);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  describe('differential against the reference (Debian 1.1.1)', () => {
    it('gateway, default route, ipMasq, hairpin, MTU: same result, kernel state and rules; CHECK and DEL too', async () => {
      const a = await site('a');
      const b = await site('b');
      const extra = { isGateway: true, isDefaultGateway: true, ipMasq: true, hairpinMode: true, mtu: 1400 };
      const ca = conf(a, extra);
      const cb = conf(b, extra);
      const ra = ok(await ours(a, 'ADD', ca));
      const rb = ok(await ref(b, 'ADD', cb));
      assert.deepEqual(normResult(ra), normResult(rb));
      assert.deepEqual(normResult(ra), {
        cniVersion: '1.0.0',
        interfaces: [{ name: 'wtbr0', mac: 'MAC' }, { name: 'VETH', mac: 'MAC' }, { name: 'eth0', mac: 'MAC', sandbox: 'SANDBOX' }],
        ips: [{ interface: 2, address: '10.88.0.2/24', gateway: '10.88.0.1' }],
        routes: [{ dst: '0.0.0.0/0', gw: '10.88.0.1' }],
      });
      assert.match(hostVeth(ra), /^veth[0-9a-f]{8}$/);
      const ha = await hostState(a, hostVeth(ra));
      assert.deepEqual(ha, await hostState(b, hostVeth(rb)));
      assert.deepEqual(await podState(a), await podState(b));
      // The reference's measured state, spelled out.
      assert.deepEqual((ha.sys as Json).ip_forward, '1');
      assert.deepEqual(ha.bridgeAddrs, ['10.88.0.1/24 brd 10.88.0.255']);
      assert.equal((ha.sys as Json).bridge_addr_assign_type, '3'); // pinned (NET_ADDR_SET)
      const chain = masqChainName('wtnet', 'wt-ctr');
      const comment = '-m comment --comment "name: \\"wtnet\\" id: \\"wt-ctr\\""';
      assert.deepEqual(ha.nat, [
        `:${chain} - [0:0]`,
        `-A POSTROUTING -s 10.88.0.2/32 ${comment} -j ${chain}`,
        `-A ${chain} -d 10.88.0.0/24 ${comment} -j ACCEPT`,
        `-A ${chain} ! -d 224.0.0.0/4 ${comment} -j MASQUERADE`,
      ]);
      const eth0 = (await linksIn(a.pod)).find((l) => l.ifname === 'eth0')!;
      assert.equal(eth0.address, (ra.interfaces as Iface[])[2]!.mac);
      assert.equal(eth0.mtu, 1400);
      assert.equal(eth0.txqlen ?? 0, 0);

      assert.equal(ok(await ours(a, 'CHECK', withPrev(ca, ra))), undefined);
      assert.equal(ok(await ref(b, 'CHECK', withPrev(cb, rb))), undefined);

      ok(await ours(a, 'DEL', withPrev(ca, ra)));
      ok(await ref(b, 'DEL', withPrev(cb, rb)));
      const da = await hostState(a, null);
      assert.deepEqual(da, await hostState(b, null));
      assert.deepEqual(da.nat, []);
      assert.deepEqual(await hostLinkNames(a), ['lo', 'wtbr0']);
      assert.deepEqual(ipFiles(a), []);
      assert.equal(await podHasLink(a, 'eth0'), false);
    });

    it('dual stack: IPv4 + IPv6 addresses, gateways, default routes and forwarding match', async () => {
      const a = await site('a');
      const b = await site('b');
      const extra = { isDefaultGateway: true, ipMasq: true };
      const ipam = { ranges: [[{ subnet: '10.89.0.0/24' }], [{ subnet: 'fd89::/64' }]] };
      const ra = ok(await ours(a, 'ADD', conf(a, extra, ipam)));
      const rb = ok(await ref(b, 'ADD', conf(b, extra, ipam)));
      assert.deepEqual(normResult(ra), normResult(rb));
      assert.deepEqual(ra.ips, [
        { interface: 2, address: '10.89.0.2/24', gateway: '10.89.0.1' },
        { interface: 2, address: 'fd89::2/64', gateway: 'fd89::1' },
      ]);
      assert.deepEqual(ra.routes, [
        { dst: '0.0.0.0/0', gw: '10.89.0.1' },
        { dst: '::/0', gw: 'fd89::1' },
      ]);
      const ha = await hostState(a, hostVeth(ra));
      assert.deepEqual(ha, await hostState(b, hostVeth(rb)));
      assert.equal((ha.sys as Json).v6_forwarding, '1');
      assert.deepEqual(ha.bridgeAddrs, ['10.89.0.1/24 brd 10.89.0.255', 'fd89::1/64 brd -']);
      assert.deepEqual(await podState(a), await podState(b));
      assert.ok((ha.nat as string[]).some((l) => l.startsWith('-A POSTROUTING -s 10.89.0.2/32 ')));
      const nat6 = await nsExec(a.host, 'ip6tables-save', '-t', 'nat');
      assert.match(nat6, /^-A POSTROUTING -s fd89::2\/128 -m comment --comment "name: \\"wtnet\\" id: \\"wt-ctr\\"" -j CNI-[0-9a-f]{24}$/m);
      assert.match(nat6, /! -d ff00::\/8 -m comment .* -j MASQUERADE/);
      // weft also sets keep_addr_on_down for IPv6 (upstream ConfigureIface does since v1.2).
      assert.equal(await sysctl(a.pod, 'net.ipv6.conf.eth0.keep_addr_on_down'), '1');

      ok(await ours(a, 'DEL', withPrev(conf(a, extra, ipam), ra)));
      assert.doesNotMatch(await nsExec(a.host, 'ip6tables-save', '-t', 'nat'), /CNI-/);
      assert.deepEqual(await natRules(a.host), []);
      assert.deepEqual(ipFiles(a), []);
    });

    it('layer 2 only (ipam {}) with promiscMode: same result and state', async () => {
      const a = await site('a');
      const b = await site('b');
      const c = { cniVersion: '1.0.0', name: 'wtnet', type: 'bridge', bridge: 'wtbr0', promiscMode: true, ipam: {} };
      const ra = ok(await ours(a, 'ADD', c));
      const rb = ok(await ref(b, 'ADD', c));
      assert.deepEqual(normResult(ra), normResult(rb));
      assert.equal(ra.ips, undefined);
      const ha = await hostState(a, hostVeth(ra));
      assert.deepEqual(ha, await hostState(b, hostVeth(rb)));
      const br = (ha.links as Array<{ name: string; flags: string[] }>).find((l) => l.name === 'wtbr0')!;
      assert.ok(br.flags.includes('PROMISC'), `bridge flags ${br.flags.join(',')}`);
      assert.deepEqual(await podState(a), await podState(b));
      assert.equal(ok(await ours(a, 'CHECK', withPrev(c, ra))), undefined);
      ok(await ours(a, 'DEL', c));
      assert.deepEqual(await hostLinkNames(a), ['lo', 'wtbr0']);
    });

    it('cniVersion 0.3.1 result and IPAM routes + dns pass through as the reference', async () => {
      const a = await site('a');
      const b = await site('b');
      const ipam = { ranges: [[{ subnet: '10.90.0.0/24', gateway: '10.90.0.254' }]], routes: [{ dst: '10.91.0.0/16' }, { dst: '10.92.0.0/16', gw: '10.90.0.7' }] };
      const extra = { cniVersion: '0.3.1', isGateway: true, dns: { nameservers: ['10.90.0.53'], search: ['svc.local'] } };
      const ra = ok(await ours(a, 'ADD', conf(a, extra, ipam)));
      const rb = ok(await ref(b, 'ADD', conf(b, extra, ipam)));
      assert.deepEqual(normResult(ra), normResult(rb));
      // host-local hands out .1 when the gateway is elsewhere, as the reference.
      assert.deepEqual(ra.ips, [{ version: '4', interface: 2, address: '10.90.0.1/24', gateway: '10.90.0.254' }]);
      assert.deepEqual(ra.dns, { nameservers: ['10.90.0.53'], search: ['svc.local'] });
      assert.deepEqual(await podState(a), await podState(b));
      assert.deepEqual((await podState(a)).routes, [
        '10.90.0.0/24 dev eth0 proto kernel scope link src 10.90.0.1',
        '10.91.0.0/16 via 10.90.0.254 dev eth0',
        '10.92.0.0/16 via 10.90.0.7 dev eth0',
      ]);
      assert.deepEqual((await hostState(a, hostVeth(ra))).bridgeAddrs, ['10.90.0.254/24 brd 10.90.0.255']);
    });

    it('an existing different bridge address: same error without forceAddress, same replacement with it', async () => {
      const a = await site('a');
      const b = await site('b');
      for (const s of [a, b]) {
        await ipn(s.host, 'link', 'add', 'name', 'wtbr0', 'type', 'bridge');
        await ipn(s.host, 'address', 'add', '10.99.0.1/16', 'dev', 'wtbr0');
      }
      const ea = err(await ours(a, 'ADD', conf(a, { isGateway: true })));
      const eb = err(await ref(b, 'ADD', conf(b, { isGateway: true })));
      assert.deepEqual(ea, { code: 999, msg: 'failed to set bridge addr: "wtbr0" already has an IP address different from 10.88.0.1/24' });
      assert.equal(eb.msg, ea.msg);
      // weft rolled back what it made (the reference leaves its veth for the runtime's DEL).
      assert.deepEqual(await hostLinkNames(a), ['lo', 'wtbr0']);
      assert.equal(await podHasLink(a, 'eth0'), false);
      assert.deepEqual(ipFiles(a), []);

      // New pods on the same hosts, now with forceAddress.
      const ra = ok(await ours({ ...a, pod: await netns('ap') }, 'ADD', conf(a, { isGateway: true, forceAddress: true })));
      const rb = ok(await ref({ ...b, pod: await netns('bp') }, 'ADD', conf(b, { isGateway: true, forceAddress: true })));
      assert.deepEqual(normResult(ra), normResult(rb));
      const ha = await hostState(a, hostVeth(ra));
      assert.deepEqual(ha.bridgeAddrs, ['10.88.0.1/24 brd 10.88.0.255']);
      assert.deepEqual(ha.bridgeAddrs, (await hostState(b, hostVeth(rb))).bridgeAddrs);
    });

    it('macspoofchk: the same nftables bridge rules, removed by DEL', async () => {
      const a = await site('a');
      const b = await site('b');
      const ra = ok(await ours(a, 'ADD', conf(a, { macspoofchk: true })));
      const rb = ok(await ref(b, 'ADD', conf(b, { macspoofchk: true })));
      const table = async (s: Site, r: Json): Promise<string> =>
        (await nsExec(s.host, 'nft', 'list', 'table', 'bridge', 'nat'))
          .replaceAll(hostVeth(r), 'VETH')
          .replaceAll((r.interfaces as Iface[])[2]!.mac!, 'MAC');
      const ta = await table(a, ra);
      assert.equal(ta, await table(b, rb));
      assert.match(ta, /iifname "VETH" jump cni-br-iface-wt-ctr-eth0 comment "macspoofchk-wt-ctr-eth0"/);
      assert.match(ta, /ether saddr MAC return comment "macspoofchk-wt-ctr-eth0"/);
      assert.match(ta, /drop comment "macspoofchk-wt-ctr-eth0"/);
      ok(await ours(a, 'DEL', withPrev(conf(a, { macspoofchk: true }), ra)));
      ok(await ref(b, 'DEL', withPrev(conf(b, { macspoofchk: true }), rb)));
      const after = await nsExec(a.host, 'nft', 'list', 'table', 'bridge', 'nat');
      assert.equal(after, await nsExec(b.host, 'nft', 'list', 'table', 'bridge', 'nat'));
      assert.doesNotMatch(after, /cni-br-iface/);
    });

    it('CHECK reports a flushed address with the reference message', async () => {
      const a = await site('a');
      const b = await site('b');
      const ra = ok(await ours(a, 'ADD', conf(a, { isGateway: true })));
      const rb = ok(await ref(b, 'ADD', conf(b, { isGateway: true })));
      for (const s of [a, b]) await ipn(s.pod, 'address', 'flush', 'dev', 'eth0');
      const ea = err(await ours(a, 'CHECK', withPrev(conf(a, { isGateway: true }), ra)));
      assert.deepEqual(ea, { code: 999, msg: 'Failed to match addr 10.88.0.2/24 on interface eth0' });
      assert.deepEqual(err(await ref(b, 'CHECK', withPrev(conf(b, { isGateway: true }), rb))), ea);
    });
  });

  describe('keys with an effect', () => {
    it('defaults the bridge to cni0 and leaves forwarding alone without isGateway', async () => {
      const s = await site('k');
      const c = conf(s, { ipMasq: true });
      delete c.bridge;
      const r = ok(await ours(s, 'ADD', c));
      assert.equal((r.interfaces as Iface[])[0]!.name, 'cni0');
      assert.deepEqual(r.ips, [{ interface: 2, address: '10.88.0.2/24', gateway: '10.88.0.1' }]); // host-local's gateway, not put on the bridge
      assert.equal(await sysctl(s.host, 'net.ipv4.ip_forward'), '0');
      assert.equal((await ipn(s.host, '-br', 'address', 'show', 'dev', 'cni0')).includes('10.88.0.1'), false);
      assert.equal((await natRules(s.host)).filter((l) => l.includes('wt-ctr')).length, 3);
      assert.deepEqual((await podState(s)).routes, ['10.88.0.0/24 dev eth0 proto kernel scope link src 10.88.0.2']);
    });

    it('sets the MTU on the new bridge and both veth ends', async () => {
      const s = await site('k');
      const r = ok(await ours(s, 'ADD', conf(s, { mtu: 1280 })));
      const host = await linksIn(s.host);
      assert.equal(host.find((l) => l.ifname === 'wtbr0')!.mtu, 1280);
      assert.equal(host.find((l) => l.ifname === hostVeth(r))!.mtu, 1280);
      assert.equal((await linksIn(s.pod)).find((l) => l.ifname === 'eth0')!.mtu, 1280);
    });

    it('hairpinMode and portIsolation set the port flags; promiscMode with hairpin is refused', async () => {
      const s = await site('k');
      const r = ok(await ours(s, 'ADD', conf(s, { hairpinMode: true, portIsolation: true })));
      const port = (await linksIn(s.host)).find((l) => l.ifname === hostVeth(r))!;
      assert.equal(port.master, 'wtbr0');
      assert.deepEqual([port.linkinfo?.info_slave_data?.hairpin, port.linkinfo?.info_slave_data?.isolated], [true, true]);
      const plain = ok(await ours({ ...s, pod: await netns('kp') }, 'ADD', conf(s), { containerId: 'c2' }));
      const port2 = (await linksIn(s.host)).find((l) => l.ifname === hostVeth(plain))!;
      assert.deepEqual([port2.linkinfo?.info_slave_data?.hairpin, port2.linkinfo?.info_slave_data?.isolated], [false, false]);
      assert.deepEqual(err(await ours(s, 'ADD', conf(s, { hairpinMode: true, promiscMode: true }), { containerId: 'c3' })), {
        code: 7,
        msg: 'cannot set hairpin mode and promiscuous mode at the same time',
      });
    });

    it('takes the container MAC from runtimeConfig over args.cni.mac over CNI_ARGS', async () => {
      const s = await site('k');
      const args = 'IgnoreUnknown=1;MAC=02:aa:00:00:00:01;K8S_POD_NAME=web';
      const r1 = ok(await ours(s, 'ADD', conf(s), { args }));
      assert.equal((r1.interfaces as Iface[])[2]!.mac, '02:aa:00:00:00:01');
      const p2: Site = { ...s, pod: await netns('kp') };
      const r2 = ok(await ours(p2, 'ADD', conf(s, { args: { cni: { mac: '02:aa:00:00:00:02' } } }), { args, containerId: 'c2' }));
      assert.equal((r2.interfaces as Iface[])[2]!.mac, '02:aa:00:00:00:02');
      const p3: Site = { ...s, pod: await netns('kp') };
      const c3 = conf(s, { args: { cni: { mac: '02:aa:00:00:00:02' } }, runtimeConfig: { mac: '02:aa:00:00:00:03' } });
      const r3 = ok(await ours(p3, 'ADD', c3, { args, containerId: 'c3' }));
      assert.equal((r3.interfaces as Iface[])[2]!.mac, '02:aa:00:00:00:03');
      assert.equal((await linksIn(p3.pod)).find((l) => l.ifname === 'eth0')!.address, '02:aa:00:00:00:03');
      assert.deepEqual(err(await ours({ ...s, pod: await netns('kp') }, 'ADD', conf(s), { args: 'K8S_POD_NAME=web', containerId: 'c4' })), {
        code: 7,
        msg: 'ARGS: unknown args ["K8S_POD_NAME=web"]',
      });
    });

    it('enabledad: DAD on in the pod, and ADD returns once the IPv6 address has settled', async () => {
      const s = await site('k');
      const ipam = { ranges: [[{ subnet: 'fd77::/64' }]] };
      const r = ok(await ours(s, 'ADD', conf(s, { enabledad: true, isDefaultGateway: true }, ipam)));
      assert.deepEqual(r.ips, [{ interface: 2, address: 'fd77::2/64', gateway: 'fd77::1' }]);
      assert.equal(await sysctl(s.pod, 'net.ipv6.conf.eth0.accept_dad'), '1');
      assert.equal(await sysctl(s.pod, 'net.ipv6.conf.eth0.enhanced_dad'), '1');
      const addrs = JSON.parse(await ipn(s.pod, '-j', '-6', 'address', 'show', 'dev', 'eth0')) as Array<{ addr_info: Array<{ local: string; tentative?: boolean }> }>;
      const global = addrs[0]!.addr_info.find((x) => x.local === 'fd77::2')!;
      assert.equal(global.tentative ?? false, false);
      assert.match(await ipn(s.pod, '-6', 'route', 'show', 'default'), /^default via fd77::1 dev eth0/);
    });

    it('disableContainerInterface leaves the pod end down; with IPAM it is refused', async () => {
      const s = await site('k');
      const c = { cniVersion: '1.0.0', name: 'wtnet', type: 'bridge', bridge: 'wtbr0', disableContainerInterface: true };
      const r = ok(await ours(s, 'ADD', c));
      const eth0 = (await linksIn(s.pod)).find((l) => l.ifname === 'eth0')!;
      assert.equal(eth0.flags.includes('UP'), false);
      assert.equal(r.ips, undefined);
      assert.deepEqual(err(await ours({ ...s, pod: await netns('kp') }, 'ADD', { ...c, ipam: { type: 'host-local', subnet: '10.1.0.0/24' } }, { containerId: 'c2' })), {
        code: 7,
        msg: 'cannot use IPAM when DisableContainerInterface flag is set',
      });
    });

    it('vlan: the port gets its PVID (or, without kernel support, the ADD fails and leaves nothing)', async () => {
      const s = await site('k');
      const c = conf(s, { vlan: 100, preserveDefaultVlan: false });
      const r = await ours(s, 'ADD', c);
      if (vlanFiltering) {
        const res = ok(r);
        const vlans = JSON.parse(await nsExec(s.host, 'bridge', '-j', 'vlan', 'show', 'dev', hostVeth(res))) as Array<{ vlans: Array<{ vlan: number; flags?: string[] }> }>;
        assert.deepEqual(vlans[0]!.vlans, [{ vlan: 100, flags: ['PVID', 'Egress Untagged'] }]);
      } else {
        const e = err(r);
        assert.equal(e.code, 999);
        assert.match(e.msg, /^failed to create bridge "wtbr0": could not add "wtbr0": .*Operation not supported/);
        assert.deepEqual(await hostLinkNames(s), ['lo']);
        assert.equal(await podHasLink(s, 'eth0'), false);
        assert.deepEqual(ipFiles(s), []);
      }
    });

    it('ipMasqBackend nftables: one rule per IP in inet cni_plugins_masquerade, gone after DEL', async () => {
      const s = await site('k');
      const c = conf(s, { ipMasq: true, ipMasqBackend: 'nftables' });
      const r = ok(await ours(s, 'ADD', c));
      const table = await nsExec(s.host, 'nft', 'list', 'table', 'inet', 'cni_plugins_masquerade');
      assert.match(table, /type nat hook postrouting priority srcnat; policy accept;/);
      assert.match(table, /ip daddr 224\.0\.0\.0\/4 return/);
      assert.match(table, /goto masq_checks/);
      assert.match(table, /ip saddr 10\.88\.0\.2 ip daddr != 10\.88\.0\.0\/24 masquerade comment "[0-9a-f]{16}-[0-9a-f]{16}, net: wtnet, if: eth0, id: wt-ctr"/);
      assert.deepEqual(await natRules(s.host), []);
      ok(await ours(s, 'DEL', withPrev(c, r)));
      assert.doesNotMatch(await nsExec(s.host, 'nft', 'list', 'table', 'inet', 'cni_plugins_masquerade'), /masquerade comment/);
      assert.deepEqual(err(await ours(s, 'ADD', conf(s, { ipMasq: true, ipMasqBackend: 'ebtables' }))), { code: 7, msg: 'unknown ipmasq backend "ebtables"' });
    });

    it('isGateway with an IPAM gateway outside the default: the bridge gets it, pods route via it', async () => {
      const s = await site('k');
      const ipam = { ranges: [[{ subnet: '10.93.0.0/24', gateway: '10.93.0.100' }]] };
      const r = ok(await ours(s, 'ADD', conf(s, { isDefaultGateway: true }, ipam)));
      assert.deepEqual(r.routes, [{ dst: '0.0.0.0/0', gw: '10.93.0.100' }]);
      assert.match(await ipn(s.host, '-br', 'address', 'show', 'dev', 'wtbr0'), /10\.93\.0\.100\/24/);
      assert.deepEqual((await podState(s)).routes, ['default via 10.93.0.100 dev eth0', '10.93.0.0/24 dev eth0 proto kernel scope link src 10.93.0.1']);
    });
  });

  describe('concurrency', () => {
    it('12 ADDs at once on a new bridge: all succeed with distinct IPs, one gateway, then 12 DELs clean up', async () => {
      const s = await site('c');
      const c = conf(s, { isDefaultGateway: true, ipMasq: true });
      const pods = await Promise.all(Array.from({ length: 12 }, () => netns('cp')));
      const results = await Promise.all(pods.map((pod, i) => ours({ ...s, pod }, 'ADD', c, { containerId: `ctr${i}` })));
      const ips = results.map((r) => ((ok(r).ips as Array<{ address: string }>)[0]!.address));
      assert.equal(new Set(ips).size, 12);
      assert.deepEqual((await hostState(s, null)).bridgeAddrs, ['10.88.0.1/24 brd 10.88.0.255']);
      assert.equal((await linksIn(s.host)).filter((l) => l.master === 'wtbr0').length, 12);
      assert.equal((await natRules(s.host)).filter((l) => l.startsWith(':CNI-')).length, 12);
      const dels = await Promise.all(pods.map((pod, i) => ours({ ...s, pod }, 'DEL', withPrev(c, results[i]!.json as Json), { containerId: `ctr${i}` })));
      for (const d of dels) ok(d);
      assert.deepEqual(await hostLinkNames(s), ['lo', 'wtbr0']);
      assert.deepEqual(await natRules(s.host), []);
      assert.deepEqual(ipFiles(s), []);
    });
  });

  describe('failures leave nothing behind', () => {
    it('bad stdin is code 6, a missing CNI_NETNS code 4', async () => {
      const s = await site('f');
      const bad = err(await ours(s, 'ADD', {}, { rawStdin: '{"cniVersion":' }));
      assert.equal(bad.code, 6);
      assert.deepEqual(err(await ours(s, 'ADD', conf(s), { netns: null })), { code: 4, msg: 'required env variables [CNI_NETNS] missing' });
      assert.deepEqual(await hostLinkNames(s), ['lo']);
    });

    it('a netns that does not exist: error, no bridge, no IP reserved', async () => {
      const s = await site('f');
      const missing = `/run/netns/${PREFIX}-nonexistent`;
      const e = err(await ours(s, 'ADD', conf(s, { ipMasq: true }), { netns: missing }));
      assert.deepEqual(e, { code: 999, msg: `failed to open netns "${missing}": failed to Statfs "${missing}": no such file or directory` });
      assert.deepEqual(await hostLinkNames(s), ['lo']);
      assert.deepEqual(ipFiles(s), []);
      assert.deepEqual(await natRules(s.host), []);
      const notNs = join(tmp, 'not-a-netns');
      writeFileSync(notNs, '');
      assert.match(err(await ours(s, 'ADD', conf(s), { netns: notNs })).msg, /^failed to open netns ".*": unknown FS magic on ".*": [0-9a-f]+$/);
    });

    it('a netns deleted during ADD: error, and no veth, IP file or rule is left', async () => {
      const s = await site('f');
      // An IPAM plugin that deletes the pod's netns, then lets the reference host-local allocate.
      const ipamDir = join(tmp, 'vanish-bin');
      rmSync(ipamDir, { recursive: true, force: true });
      await sh('mkdir', ['-p', ipamDir]);
      // weft's `bridge` is the native client; without a CNI server it runs `bridge.cjs` next to it.
      await sh('cp', [join(binDir, 'bridge'), join(binDir, 'bridge.cjs'), ipamDir]);
      const script = join(ipamDir, 'wt-vanish');
      writeFileSync(
        script,
        [
          '#!/usr/bin/env node',
          "const { execFileSync, spawnSync } = require('node:child_process');",
          "const { readFileSync } = require('node:fs');",
          'const input = readFileSync(0);',
          "if (process.env.CNI_COMMAND === 'ADD') execFileSync('ip', ['netns', 'del', process.env.CNI_NETNS.split('/').pop()]);",
          "const conf = JSON.parse(input); conf.ipam.type = 'host-local';",
          `const r = spawnSync('${REFERENCE_CNI_DIR}/host-local', [], { input: JSON.stringify(conf), env: process.env });`,
          'process.stdout.write(r.stdout); process.exitCode = r.status;',
          '',
        ].join('\n'),
      );
      chmodSync(script, 0o755);
      const c = conf(s, { isGateway: true, ipMasq: true });
      (c.ipam as Json).type = 'wt-vanish';
      const r = await run(ipamDir, s, 'ADD', c);
      const e = err(r);
      assert.deepEqual(e, { code: 999, msg: `failed to open netns "/run/netns/${s.pod}": the netns was deleted during ADD` });
      assert.equal(existsSync(`/run/netns/${s.pod}`), false);
      assert.deepEqual(await hostLinkNames(s), ['lo', 'wtbr0']);
      assert.deepEqual(ipFiles(s), []);
      assert.deepEqual(await natRules(s.host), []);
    });

    it('an exhausted range: the second ADD fails and leaves no veth, file or rule', async () => {
      const s = await site('f');
      const ipam = { ranges: [[{ subnet: '10.77.0.0/24', rangeStart: '10.77.0.10', rangeEnd: '10.77.0.10' }]] };
      const c = conf(s, { isGateway: true, ipMasq: true }, ipam);
      ok(await ours(s, 'ADD', c, { containerId: 'c1' }));
      const before = await hostLinkNames(s);
      const p2: Site = { ...s, pod: await netns('fp') };
      const e = err(await ours(p2, 'ADD', c, { containerId: 'c2' }));
      assert.equal(e.code, 999);
      assert.match(e.msg, /no IP addresses available in range set: 10\.77\.0\.10-10\.77\.0\.10/);
      assert.deepEqual(await hostLinkNames(s), before);
      assert.equal(await podHasLink(p2, 'eth0'), false);
      assert.deepEqual(ipFiles(s), ['10.77.0.10']);
      assert.equal((await natRules(s.host)).some((l) => l.includes('id: \\"c2\\"')), false);
    });

    it('a failure after IPAM (unreachable route gateway) rolls back the veth, the IP and the rules', async () => {
      const s = await site('f');
      const ipam = { ranges: [[{ subnet: '10.78.0.0/24' }]], routes: [{ dst: '10.79.0.0/16', gw: '192.0.2.1' }] };
      const e = err(await ours(s, 'ADD', conf(s, { isGateway: true, ipMasq: true }, ipam)));
      assert.equal(e.code, 999);
      assert.match(e.msg, /^failed to add route '10\.79\.0\.0\/16 via 192\.0\.2\.1 dev eth0': /);
      assert.deepEqual(await hostLinkNames(s), ['lo', 'wtbr0']);
      assert.equal(await podHasLink(s, 'eth0'), false);
      assert.deepEqual(ipFiles(s), []);
      assert.deepEqual(await natRules(s.host), []);
    });

    it('a second ADD of the same attachment fails as the reference and keeps the first intact', async () => {
      const s = await site('f');
      const c = conf(s, { isGateway: true, ipMasq: true });
      const r = ok(await ours(s, 'ADD', c));
      assert.deepEqual(err(await ours(s, 'ADD', c)), { code: 999, msg: 'container veth name provided (eth0) already exists' });
      assert.deepEqual(ipFiles(s), ['10.88.0.2']);
      assert.equal(ok(await ours(s, 'CHECK', withPrev(c, r))), undefined);
      assert.equal((await natRules(s.host)).filter((l) => l.includes('wt-ctr')).length, 3);
    });

    it('a non-bridge link with the bridge name is refused and nothing is left', async () => {
      const s = await site('f');
      await ipn(s.host, 'link', 'add', 'name', 'wtbr0', 'type', 'veth', 'peer', 'name', 'wtbr0p');
      const e = err(await ours(s, 'ADD', conf(s, { ipMasq: true })));
      assert.deepEqual(e, { code: 999, msg: 'failed to create bridge "wtbr0": "wtbr0" already exists but is not a bridge' });
      assert.deepEqual(await hostLinkNames(s), ['lo', 'wtbr0', 'wtbr0p']);
      assert.equal(await podHasLink(s, 'eth0'), false);
      assert.deepEqual(ipFiles(s), []);
      assert.deepEqual(await natRules(s.host), []);
    });
  });

  describe('DEL is idempotent and never leaks rules (reference bug #810)', () => {
    it('DEL twice, and DEL without netns or prevResult, all succeed', async () => {
      const s = await site('d');
      const c = conf(s, { isGateway: true, ipMasq: true });
      const r = ok(await ours(s, 'ADD', c));
      ok(await ours(s, 'DEL', withPrev(c, r)));
      ok(await ours(s, 'DEL', withPrev(c, r)));
      ok(await ours(s, 'DEL', c, { netns: null }));
      ok(await ours(s, 'DEL', c));
      assert.deepEqual(await natRules(s.host), []);
      assert.deepEqual(ipFiles(s), []);
    });

    it('after the netns is gone, with or without CNI_NETNS and prevResult, the rules go (the reference leaks them)', async () => {
      const cases: Array<{ label: string; netns: 'gone' | 'unset'; prev: boolean }> = [
        { label: 'netns gone, prevResult', netns: 'gone', prev: true },
        { label: 'netns gone, no prevResult', netns: 'gone', prev: false },
        { label: 'CNI_NETNS empty, prevResult', netns: 'unset', prev: true },
        { label: 'CNI_NETNS empty, no prevResult', netns: 'unset', prev: false },
      ];
      for (const k of cases) {
        const a = await site('d');
        const b = await site('d');
        const ca = conf(a, { isGateway: true, ipMasq: true });
        const cb = conf(b, { isGateway: true, ipMasq: true });
        const ra = ok(await ours(a, 'ADD', ca));
        const rb = ok(await ref(b, 'ADD', cb));
        await delNetns(a.pod);
        await delNetns(b.pod);
        const o: RunOpts = k.netns === 'unset' ? { netns: null } : {};
        ok(await ours(a, 'DEL', k.prev ? withPrev(ca, ra) : ca, o));
        ok(await ref(b, 'DEL', k.prev ? withPrev(cb, rb) : cb, o));
        assert.deepEqual(await natRules(a.host), [], k.label);
        assert.deepEqual(ipFiles(a), [], k.label);
        assert.deepEqual(ipFiles(b), [], k.label);
        assert.equal((await natRules(b.host)).length, 4, `${k.label}: the reference leaks its chain`);
      }
    });
  });

  describe('GC and STATUS', () => {
    it('GC frees the IPs and ipMasq chains of attachments not in valid-attachments', async () => {
      const s = await site('g');
      const c = { ...conf(s, { isGateway: true, ipMasq: true }), cniVersion: '1.1.0' };
      ok(await ours(s, 'ADD', c, { containerId: 'keep' }));
      ok(await ours({ ...s, pod: await netns('gp') }, 'ADD', c, { containerId: 'stale' }));
      assert.deepEqual(ipFiles(s).sort(), ['10.88.0.2', '10.88.0.3']);
      const gc = { ...c, 'cni.dev/valid-attachments': [{ containerID: 'keep', ifname: 'eth0' }] };
      ok(await ours(s, 'GC', gc, { containerId: '', ifname: '', netns: null }));
      assert.deepEqual(ipFiles(s), ['10.88.0.2']);
      const nat = await natRules(s.host);
      assert.equal(nat.filter((l) => l.includes('id: \\"keep\\"')).length, 3);
      assert.equal(nat.filter((l) => l.includes('stale')).length, 0);
      assert.equal(nat.filter((l) => l.startsWith(':CNI-')).length, 1);
    });

    it('STATUS asks IPAM and succeeds for a valid config', async () => {
      const s = await site('g');
      const r = await ours(s, 'STATUS', { ...conf(s), cniVersion: '1.1.0' }, { containerId: '', ifname: '', netns: null });
      assert.equal(r.exitCode, 0, r.stdout);
      assert.equal(r.stdout, '');
      const bad = await ours(s, 'STATUS', { ...conf(s, {}, { ranges: 'nope' }), cniVersion: '1.1.0' }, { containerId: '', ifname: '', netns: null });
      assert.equal(bad.exitCode, 1);
    });
  });
});
