// Netlink throughput: weft's Netlink.apply() next to iproute2's batch mode (`ip -batch`,
// `bridge -batch`: one process, one netlink socket, the fastest tool there is) doing the same
// work in the same run. Kernel state only: no packets are sent.
//
// Two sections:
//   kinds  N peers of a flannel-style vxlan network, one kind per apply() (ARP neighbours, FDB
//          entries, onlink routes with a gateway per peer), then all in one call, deletes,
//          host-gw-shaped routes (one gateway for all) and dump times.
//   peers  the full vxlan peer set for each size in --peers: per peer a permanent neighbour, an
//          FDB entry and a route, programmed
//            - by weft with nexthop objects (neigh + fdb + `nexthop id N via X dev D onlink` +
//              route `nhid N`), in one apply() call;
//            - by `ip -batch` (neigh + route in flannel's plain form `route add … via … dev D
//              onlink`) + `bridge -batch` (fdb): the reference;
//            - by `ip -batch` with nexthops + `bridge -batch`, and by weft in the plain form, for
//              completeness.
//          Each on a fresh vxlan device; each checked afterwards (counts and one route's form).
//
//   unshare --net -- node --import tsx bench/netlink-apply.ts [--sections kinds,peers] [--n 10000]
//       [--peers 1000,10000] [--runs 3] [--max-in-flight 128] [--pack-size 64] [--ack-each]
//
// It refuses to run in the machine's own network namespace.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';

import { Netlink, type NetlinkOp } from '../src/netlink/index.js';
import { IPAddr, IPNet } from '../src/util/ip.js';
import { assertPrivateNetns } from '../test/netns/setup.js';

const run = promisify(execFile);
const { values: args } = parseArgs({
  options: {
    sections: { type: 'string', default: 'kinds,peers' },
    n: { type: 'string', default: '10000' },
    peers: { type: 'string', default: '1000,10000' },
    runs: { type: 'string', default: '3' },
    'max-in-flight': { type: 'string', default: '128' },
    'pack-size': { type: 'string', default: '64' },
    'ack-each': { type: 'boolean', default: false },
  },
});
const SECTIONS = new Set(args.sections.split(','));
const N = Number(args.n);
const PEER_SIZES = args.peers.split(',').map(Number);
const RUNS = Number(args.runs);
const MAX_IN_FLIGHT = Number(args['max-in-flight']);
const PACK_SIZE = Number(args['pack-size']);
const ACK_EACH = args['ack-each'];

const VX = 'wt-bvx';
const UNDERLAY_GW = '10.99.0.2';

interface Peer {
  subnet: IPNet;
  mac: string;
  pub: IPAddr;
}
function peer(i: number): Peer {
  const subnet = IPNet.of(IPAddr.of(4, IPAddr.parse('10.128.0.0').value + BigInt(i) * 256n), 24);
  const mac = `0e:00:00:${((i >> 16) & 255).toString(16).padStart(2, '0')}:${((i >> 8) & 255).toString(16).padStart(2, '0')}:${(i & 255).toString(16).padStart(2, '0')}`;
  const pub = IPAddr.of(4, IPAddr.parse('10.99.1.0').value + BigInt(i));
  return { subnet, mac, pub };
}
const makePeers = (n: number): Peer[] => Array.from({ length: n }, (_, i) => peer(i));

async function ip(...a: string[]): Promise<void> {
  await run('ip', a);
}
async function batch(tool: 'ip' | 'bridge', file: string): Promise<void> {
  await run(tool, ['-batch', file]);
}

/** A fresh vxlan device: deleting the old one drops its neighbours, FDB entries, nexthops and routes. */
async function freshVxlan(nl: Netlink, u0: number): Promise<number> {
  const old = await nl.link(VX);
  if (old) await nl.deleteLink(old.index);
  await ip('route', 'flush', 'table', 'main', 'proto', '88');
  const l = await nl.createVxlan({ name: VX, vni: 1, local: IPAddr.parse('10.99.0.1'), link: u0, port: 8472, learning: false, gbp: false });
  await nl.setLink(l.index, { up: true });
  return l.index;
}

interface Row {
  what: string;
  ops: number;
  ms: number[];
}
class Table {
  readonly rows = new Map<string, Row>();
  record(what: string, ops: number, ms: number): void {
    const r = this.rows.get(what) ?? { what, ops, ms: [] };
    r.ms.push(ms);
    this.rows.set(what, r);
  }
  async timed(what: string, ops: number, fn: () => Promise<void>): Promise<number> {
    const t = performance.now();
    await fn();
    const ms = performance.now() - t;
    this.record(what, ops, ms);
    return ms;
  }
  print(): void {
    const runs = Math.max(...[...this.rows.values()].map((r) => r.ms.length));
    console.log('| what | ops | ' + Array.from({ length: runs }, (_, i) => `run ${i + 1}`).join(' | ') + ' |');
    console.log('|---|---|' + '---|'.repeat(runs));
    for (const r of this.rows.values()) {
      const cells = r.ms.map((ms) => (r.ops > 1 ? `${ms.toFixed(0)} ms (${Math.round((r.ops / ms) * 1000)}/s)` : `${ms.toFixed(0)} ms`));
      console.log(`| ${r.what} | ${r.ops} | ${cells.join(' | ')} |`);
    }
  }
}

class BenchCheckError extends Error {
  constructor(what: string, got: unknown, want: unknown) {
    super(`${what}: got ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
    this.name = 'BenchCheckError';
  }
}

interface Want {
  neigh: number;
  fdb: number;
  routes: number;
  nexthops?: number;
}

async function check(nl: Netlink, vx: number, want: Want): Promise<void> {
  const neigh = (await nl.neighbours(vx, 4)).filter((n) => n.permanent).length;
  const fdb = (await nl.fdb(vx)).filter((f) => f.dst !== null).length;
  // By device, not protocol: iproute2's plain form carries no "proto 88".
  const routes = (await nl.routes({ family: 4, table: 254, oif: vx })).length;
  if (neigh !== want.neigh) throw new BenchCheckError('neighbours', neigh, want.neigh);
  if (fdb !== want.fdb) throw new BenchCheckError('fdb entries', fdb, want.fdb);
  if (routes !== want.routes) throw new BenchCheckError('routes', routes, want.routes);
  if (want.nexthops !== undefined) {
    const nh = (await nl.nexthops()).filter((n) => n.oif === vx).length;
    if (nh !== want.nexthops) throw new BenchCheckError('nexthops', nh, want.nexthops);
  }
}

interface IpRoute {
  dst: string;
  nhid?: number;
  gateway?: string;
  dev: string;
  flags: string[];
}

/** The route of one peer reads `via X dev D onlink` in `ip -j route`, through nhid when expected. */
async function checkRouteForm(p: Peer, viaNexthop: boolean): Promise<void> {
  const { stdout } = await run('ip', ['-j', 'route', 'show', String(p.subnet)]);
  const [r] = JSON.parse(stdout) as IpRoute[];
  const got = { gateway: r?.gateway, dev: r?.dev, onlink: r?.flags.includes('onlink'), nhid: r?.nhid !== undefined };
  const want = { gateway: String(p.subnet.ip), dev: VX, onlink: true, nhid: viaNexthop };
  if (JSON.stringify(got) !== JSON.stringify(want)) throw new BenchCheckError(`ip route show ${String(p.subnet)}`, got, want);
}

async function applyAll(nl: Netlink, ops: NetlinkOp[]): Promise<void> {
  const res = await nl.apply(ops);
  if (res.failures.length > 0) throw res.failures[0]!.error;
}

// ---------------------------------------------------------------------------------------------

async function kindsSection(nl: Netlink, u0: number, dir: string, table: Table): Promise<void> {
  const peers = makePeers(N);
  const neighFile = join(dir, 'neigh.batch');
  const fdbFile = join(dir, 'fdb.batch');
  const routeFile = join(dir, 'route.batch');
  const hostgwFile = join(dir, 'hostgw.batch');
  writeFileSync(neighFile, peers.map((p) => `neigh replace ${String(p.subnet.ip)} lladdr ${p.mac} dev ${VX} nud permanent\n`).join(''));
  writeFileSync(fdbFile, peers.map((p) => `fdb replace ${p.mac} dev ${VX} dst ${String(p.pub)} self permanent\n`).join(''));
  writeFileSync(routeFile, peers.map((p) => `route replace ${String(p.subnet)} via ${String(p.subnet.ip)} dev ${VX} onlink proto 88\n`).join(''));
  writeFileSync(hostgwFile, peers.map((p) => `route replace ${String(p.subnet)} via ${UNDERLAY_GW} proto 88\n`).join(''));

  for (let r = 0; r < RUNS; r++) {
    // weft, one apply() per kind.
    let vx = await freshVxlan(nl, u0);
    const neighOps: NetlinkOp[] = peers.map((p) => ({ kind: 'neigh-replace', neigh: { ifindex: vx, ip: p.subnet.ip, mac: p.mac } }));
    const fdbOps: NetlinkOp[] = peers.map((p) => ({ kind: 'fdb-replace', fdb: { ifindex: vx, mac: p.mac, dst: p.pub } }));
    const routeOps: NetlinkOp[] = peers.map((p) => ({ kind: 'route-replace', route: { dst: p.subnet, gateway: p.subnet.ip, oif: vx, onlink: true } }));
    await table.timed('weft apply: neigh', N, () => applyAll(nl, neighOps));
    await table.timed('weft apply: fdb', N, () => applyAll(nl, fdbOps));
    await table.timed('weft apply: vxlan routes (onlink, gateway per peer)', N, () => applyAll(nl, routeOps));
    await check(nl, vx, { neigh: N, fdb: N, routes: N });
    await table.timed('weft dump: routes (all IPv4)', 1, async () => void (await nl.routes({ family: 4 })));
    await table.timed('weft dump: neighbours of the device', 1, async () => void (await nl.neighbours(vx, 4)));
    await table.timed('weft dump: fdb', 1, async () => void (await nl.fdb(vx)));

    // weft, everything in one apply() call, interleaved per peer.
    vx = await freshVxlan(nl, u0);
    const mixed: NetlinkOp[] = [];
    for (const p of peers) {
      mixed.push({ kind: 'neigh-replace', neigh: { ifindex: vx, ip: p.subnet.ip, mac: p.mac } });
      mixed.push({ kind: 'fdb-replace', fdb: { ifindex: vx, mac: p.mac, dst: p.pub } });
      mixed.push({ kind: 'route-replace', route: { dst: p.subnet, gateway: p.subnet.ip, oif: vx, onlink: true } });
    }
    await table.timed('weft apply: all three kinds in one call', 3 * N, () => applyAll(nl, mixed));
    await check(nl, vx, { neigh: N, fdb: N, routes: N });
    const deletes: NetlinkOp[] = mixed.map((op): NetlinkOp => {
      switch (op.kind) {
        case 'neigh-replace':
          return { kind: 'neigh-delete', neigh: op.neigh };
        case 'fdb-replace':
          return { kind: 'fdb-delete', fdb: op.fdb };
        case 'route-replace':
          return { kind: 'route-delete', route: op.route };
        default:
          return op;
      }
    });
    await table.timed('weft apply: delete all three kinds', 3 * N, () => applyAll(nl, deletes));
    await check(nl, vx, { neigh: 0, fdb: 0, routes: 0 });

    // iproute2 batch mode, the same entries.
    vx = await freshVxlan(nl, u0);
    await table.timed('ip -batch: neigh', N, () => batch('ip', neighFile));
    await table.timed('bridge -batch: fdb', N, () => batch('bridge', fdbFile));
    await table.timed('ip -batch: vxlan routes (onlink, gateway per peer)', N, () => batch('ip', routeFile));
    await check(nl, vx, { neigh: N, fdb: N, routes: N });

    // host-gw shape: every route through one gateway on the underlay.
    await ip('route', 'flush', 'table', 'main', 'proto', '88');
    const hostgw: NetlinkOp[] = peers.map((p) => ({ kind: 'route-replace', route: { dst: p.subnet, gateway: IPAddr.parse(UNDERLAY_GW), oif: null, onlink: false } }));
    await table.timed('weft apply: host-gw routes (one gateway)', N, () => applyAll(nl, hostgw));
    await ip('route', 'flush', 'table', 'main', 'proto', '88');
    await table.timed('ip -batch: host-gw routes (one gateway)', N, () => batch('ip', hostgwFile));
    await ip('route', 'flush', 'table', 'main', 'proto', '88');
  }
}

// ---------------------------------------------------------------------------------------------

const W_NH = 'weft apply: neigh + fdb + nexthop + route nhid (one call)';
const IP_PLAIN = 'ip -batch neigh+route (plain) + bridge -batch fdb';
const IP_NH = 'ip -batch neigh+nexthop+route nhid + bridge -batch fdb';
const W_PLAIN = 'weft apply: neigh + fdb + route (plain, one call)';

function peerOps(peers: Peer[], vx: number, viaNexthop: boolean): NetlinkOp[] {
  // Grouped by kind, in the order a reconcile sends them: L2 entries, nexthops, then routes.
  const ops: NetlinkOp[] = [];
  for (const p of peers) ops.push({ kind: 'neigh-replace', neigh: { ifindex: vx, ip: p.subnet.ip, mac: p.mac } });
  for (const p of peers) ops.push({ kind: 'fdb-replace', fdb: { ifindex: vx, mac: p.mac, dst: p.pub } });
  if (viaNexthop) {
    peers.forEach((p, i) => ops.push({ kind: 'nexthop-replace', nexthop: { id: i + 1, gateway: p.subnet.ip, oif: vx, onlink: true } }));
    peers.forEach((p, i) =>
      ops.push({ kind: 'route-replace', route: { dst: p.subnet, gateway: null, oif: null, onlink: false, nhid: i + 1 } }),
    );
  } else {
    for (const p of peers) ops.push({ kind: 'route-replace', route: { dst: p.subnet, gateway: p.subnet.ip, oif: vx, onlink: true } });
  }
  return ops;
}

async function peersSection(nl: Netlink, u0: number, dir: string, n: number, table: Table): Promise<void> {
  const peers = makePeers(n);
  const ipPlain = join(dir, `peers-${n}-plain.batch`);
  const ipNh = join(dir, `peers-${n}-nh.batch`);
  const fdbFile = join(dir, `peers-${n}-fdb.batch`);
  const neighLines = peers.map((p) => `neigh replace ${String(p.subnet.ip)} lladdr ${p.mac} dev ${VX} nud permanent\n`).join('');
  writeFileSync(ipPlain, neighLines + peers.map((p) => `route add ${String(p.subnet)} via ${String(p.subnet.ip)} dev ${VX} onlink\n`).join(''));
  writeFileSync(
    ipNh,
    neighLines +
      peers.map((p, i) => `nexthop add id ${i + 1} via ${String(p.subnet.ip)} dev ${VX} onlink\n`).join('') +
      peers.map((p, i) => `route add ${String(p.subnet)} nhid ${i + 1}\n`).join(''),
  );
  writeFileSync(fdbFile, peers.map((p) => `fdb replace ${p.mac} dev ${VX} dst ${String(p.pub)} self permanent\n`).join(''));
  const sample = peers[Math.floor(n / 2)]!;
  const want: Want = { neigh: n, fdb: n, routes: n };

  for (let r = 0; r < RUNS; r++) {
    let vx = await freshVxlan(nl, u0);
    let ops = peerOps(peers, vx, true);
    const wNh = await table.timed(W_NH, ops.length, () => applyAll(nl, ops));
    await check(nl, vx, { ...want, nexthops: n });
    await checkRouteForm(sample, true);

    vx = await freshVxlan(nl, u0);
    const ipPlainMs = await table.timed(IP_PLAIN, 3 * n, async () => {
      await batch('ip', ipPlain);
      await batch('bridge', fdbFile);
    });
    await check(nl, vx, want);
    await checkRouteForm(sample, false);

    vx = await freshVxlan(nl, u0);
    const ipNhMs = await table.timed(IP_NH, 4 * n, async () => {
      await batch('ip', ipNh);
      await batch('bridge', fdbFile);
    });
    await check(nl, vx, { ...want, nexthops: n });
    await checkRouteForm(sample, true);

    vx = await freshVxlan(nl, u0);
    ops = peerOps(peers, vx, false);
    const wPlain = await table.timed(W_PLAIN, ops.length, () => applyAll(nl, ops));
    await check(nl, vx, want);
    await checkRouteForm(sample, false);

    console.log(
      `  N=${n} run ${r + 1}: weft+nexthops ${wNh.toFixed(0)} ms, ip/bridge -batch plain ${ipPlainMs.toFixed(0)} ms → ratio weft/iproute2 ${(wNh / ipPlainMs).toFixed(3)}` +
        ` | ip/bridge -batch with nexthops ${ipNhMs.toFixed(0)} ms → ratio ${(wNh / ipNhMs).toFixed(3)}` +
        ` | weft plain ${wPlain.toFixed(0)} ms → ratio vs ip plain ${(wPlain / ipPlainMs).toFixed(3)}`,
    );
  }
}

async function main(): Promise<void> {
  assertPrivateNetns();
  await ip('link', 'set', 'lo', 'up');
  await ip('link', 'add', 'wt-bu0', 'type', 'veth', 'peer', 'name', 'wt-bu1');
  await ip('addr', 'add', '10.99.0.1/24', 'dev', 'wt-bu0');
  await ip('link', 'set', 'wt-bu0', 'up');
  await ip('link', 'set', 'wt-bu1', 'up');
  const dir = mkdtempSync(join(tmpdir(), 'weft-nlbench-'));
  const nl = Netlink.open({ maxInFlight: MAX_IN_FLIGHT, packSize: PACK_SIZE, ackEach: ACK_EACH });
  const limits = nl.applyLimits;
  console.log(
    `apply(): maxInFlight ${limits.maxInFlight}, ${limits.packSize} requests per sendmsg, ${ACK_EACH ? 'ACK on every request' : "ACK on each pack's last request"}; ${RUNS} run(s)\n`,
  );
  const kinds = new Table();
  const peerTables = new Map<number, Table>();
  try {
    const u0 = (await nl.link('wt-bu0'))!.index;
    if (SECTIONS.has('peers')) {
      if (!(await nl.supportsNexthops())) throw new Error('this kernel has no nexthop objects (Linux < 5.3)');
      for (const n of PEER_SIZES) {
        const t = new Table();
        peerTables.set(n, t);
        await peersSection(nl, u0, dir, n, t);
      }
    }
    if (SECTIONS.has('kinds')) await kindsSection(nl, u0, dir, kinds);
  } finally {
    const vx = await nl.link(VX).catch(() => null);
    if (vx) await nl.deleteLink(vx.index).catch(() => undefined);
    nl.close();
    await ip('link', 'del', 'wt-bu0').catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  }

  for (const [n, t] of peerTables) {
    console.log(`\nvxlan peer set, N = ${n} peers (ops = kernel requests):\n`);
    t.print();
    const w = t.rows.get(W_NH)!.ms;
    const plain = t.rows.get(IP_PLAIN)!.ms;
    const nh = t.rows.get(IP_NH)!.ms;
    console.log(`\nratio weft(nexthops) / iproute2(plain):     ${w.map((x, i) => (x / plain[i]!).toFixed(3)).join('  ')}`);
    console.log(`ratio weft(nexthops) / iproute2(nexthops):  ${w.map((x, i) => (x / nh[i]!).toFixed(3)).join('  ')}`);
  }
  if (kinds.rows.size > 0) {
    console.log(`\nper kind, N = ${N} peers; per run: ms (ops/s)\n`);
    kinds.print();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
