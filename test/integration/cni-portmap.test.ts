// portmap against the real kernel, inside namespaces only: a "host" netns (where the plugin runs
// and its iptables/nftables rules land), a pod set up by the reference bridge plugin, and a
// client netns wired to the host. Traffic checks (hostPort from outside, hostIP restriction,
// UDP, localhost, hairpin), a differential run against Debian's portmap 1.1.1 (result, nat
// table after ADD and after DEL, error JSON), CHECK (#819), GC and the nftables backend.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cniBinDir, REFERENCE_CNI_DIR, runCni, type CniRun } from '../helpers/cni.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

const PREFIX = nsPrefix('pm');
const NET = 'wt-pm-net';
const BRIDGE = 'wtpm0';
const REF_PORTMAP = join(REFERENCE_CNI_DIR, 'portmap');

interface Prev {
  cniVersion: string;
  interfaces: { name: string; mac?: string; sandbox?: string }[];
  ips: { address: string; gateway?: string; interface?: number }[];
  [k: string]: unknown;
}

interface Mapping {
  hostPort: number;
  containerPort: number;
  protocol: string;
  hostIP?: string;
}

let tmp = '';
let ours = '';
const namespaces: string[] = [];
const children: ChildProcess[] = [];

async function netns(tag: string): Promise<string> {
  const ns = await addNetns(`${PREFIX}-${tag}`);
  namespaces.push(ns);
  return ns;
}

/** A pod attached by the reference bridge plugin (hairpin on, no ipMasq); returns its netns and result. */
async function makePod(hostNs: string, tag: string, containerId: string, v6 = false): Promise<{ ns: string; prev: Prev }> {
  const ns = await netns(tag);
  const ranges: unknown[] = [[{ subnet: '10.244.77.0/24' }]];
  if (v6) ranges.push([{ subnet: 'fd00:77::/64' }]);
  const conf = {
    cniVersion: '1.0.0',
    name: NET,
    type: 'bridge',
    bridge: BRIDGE,
    isGateway: true,
    isDefaultGateway: true,
    hairpinMode: true,
    ipMasq: false,
    ipam: { type: 'host-local', ranges, dataDir: join(tmp, `ipam-${hostNs}`) },
  };
  const r = await runCni(
    { bin: join(REFERENCE_CNI_DIR, 'bridge'), command: 'ADD', containerId, netns: `/run/netns/${ns}`, hostNs },
    JSON.stringify(conf),
  );
  assert.equal(r.exitCode, 0, `bridge ADD: ${r.stdout}${r.stderr}`);
  return { ns, prev: r.json as Prev };
}

function portmapConf(prev: Prev | null, mappings: Mapping[] | null, extra: Record<string, unknown> = {}, cniVersion = '1.0.0'): string {
  const c: Record<string, unknown> = { cniVersion, name: NET, type: 'portmap', snat: true, ...extra };
  if (mappings) c['runtimeConfig'] = { portMappings: mappings };
  if (prev) c['prevResult'] = prev;
  return JSON.stringify(c);
}

function portmap(bin: string, command: string, hostNs: string, containerId: string, podNs: string | null, stdin: string): Promise<CniRun> {
  return runCni({ bin, command, containerId, hostNs, ...(podNs ? { netns: `/run/netns/${podNs}` } : {}) }, stdin);
}

/** The result as weft prints it: an empty `dns` is left out (Debian 1.1.1 prints `"dns": {}`). */
function withoutEmptyDns(r: unknown): unknown {
  const o = { ...(r as Record<string, unknown>) };
  if (o['dns'] !== undefined && Object.keys(o['dns'] as object).length === 0) delete o['dns'];
  return o;
}

/** iptables-save of one table without comments and counters. */
async function natTable(ns: string, family: 4 | 6): Promise<string> {
  const text = await nsExec(ns, family === 4 ? 'iptables-save' : 'ip6tables-save', '-t', 'nat');
  return text
    .split('\n')
    .filter((l) => !l.startsWith('#') && l !== '')
    .map((l) => l.replace(/\[\d+:\d+\]$/, '[0:0]'))
    .join('\n');
}

const SERVER = `
const net = require('net'), dgram = require('dgram');
let n = 0; const ready = () => { if (++n === 3) console.log('ready'); };
for (const p of [80, 81]) net.createServer((s) => s.end('pod:' + p + ' peer=' + s.remoteAddress + '\\n')).listen(p, '0.0.0.0', ready);
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => u.send('pod:53 peer=' + r.address + '\\n', r.port, r.address));
u.bind(53, '0.0.0.0', ready);
`;

const CLIENT = `
const net = require('net'), dgram = require('dgram');
const [proto, host, port] = process.argv.slice(1);
setTimeout(() => { console.log('ERR TIMEOUT'); process.exit(0); }, 3000);
if (proto === 'tcp') {
  const s = net.connect(+port, host); let d = '';
  s.on('data', (c) => (d += c)); s.on('end', () => { console.log(d.trim()); process.exit(0); });
  s.on('error', (e) => { console.log('ERR ' + e.code); process.exit(0); });
} else {
  const u = dgram.createSocket('udp4');
  u.on('message', (m) => { console.log(String(m).trim()); process.exit(0); });
  u.send('x', +port, host);
}
`;

/** What a TCP/UDP client in `ns` gets from host:port: the server's line or "ERR <code>". */
/** An "outside" client namespace on a veth from the host (192.168.50.2, default route via the host). */
async function connectClient(host: string, client: string, hostAddrs: string[]): Promise<void> {
  await ipn(host, 'link', 'add', 'vcli', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', client);
  for (const a of hostAddrs) await ipn(host, 'addr', 'add', a, 'dev', 'vcli');
  await ipn(host, 'link', 'set', 'vcli', 'up');
  await ipn(client, 'addr', 'add', '192.168.50.2/24', 'dev', 'eth0');
  await ipn(client, 'link', 'set', 'eth0', 'up');
  await ipn(client, 'route', 'add', 'default', 'via', '192.168.50.1');
  await nsExec(host, 'sysctl', '-qw', 'net.ipv4.ip_forward=1');
}

async function connect(ns: string, proto: 'tcp' | 'udp', host: string, port: number): Promise<string> {
  return (await nsExec(ns, 'node', '-e', CLIENT, proto, host, String(port))).trim();
}

async function startServer(ns: string): Promise<void> {
  const child = spawn('ip', ['netns', 'exec', ns, 'node', '-e', SERVER], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
  await waitFor(() => out.includes('ready'), { timeoutMs: 15_000, what: 'the pod server' });
}

describe('CNI portmap plugin', function () {
  before(async function () {
    this.timeout(180_000);
    tmp = await mkdtemp(join(tmpdir(), 'wt-pm-'));
    ours = join(await cniBinDir(), 'portmap');
  });

  after(async function () {
    this.timeout(60_000);
    for (const c of children) if (c.pid !== undefined && c.exitCode === null) process.kill(c.pid, 'SIGKILL');
    for (const ns of namespaces.reverse()) await delNetns(ns);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  describe('portmap (iptables): traffic through the host ports', function () {
    this.timeout(120_000);
    let host = '';
    let pod = { ns: '', prev: null as Prev | null };
    let client = '';
    const MAPPINGS: Mapping[] = [
      { hostPort: 8080, containerPort: 80, protocol: 'tcp' },
      { hostPort: 8081, containerPort: 81, protocol: 'tcp', hostIP: '192.168.50.1' },
      { hostPort: 8053, containerPort: 53, protocol: 'udp' },
    ];

    before(async () => {
      host = await netns('dp-host');
      client = await netns('dp-cli');
      pod = await makePod(host, 'dp-pod', 'ctr-dp');
      await connectClient(host, client, ['192.168.50.1/24', '192.168.50.3/24']);
      await startServer(pod.ns);
      // Before the mapping: the pod answers directly, the host port is closed.
      assert.equal(await connect(host, 'tcp', '10.244.77.2', 80), 'pod:80 peer=10.244.77.1');
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8080), 'ERR ECONNREFUSED');

      // Stale flows to the host ports, from before the mapping: the UDP one must go (#553).
      for (const proto of ['udp', 'tcp']) {
        const state = proto === 'tcp' ? ['--state', 'ESTABLISHED'] : [];
        await nsExec(host, 'conntrack', '-I', '-p', proto, '-s', '192.168.50.2', '-d', '192.168.50.1', '--sport', '40000', '--dport', proto === 'udp' ? '8053' : '8080', '--timeout', '300', ...state);
      }

      const r = await portmap(ours, 'ADD', host, 'ctr-dp', pod.ns, portmapConf(pod.prev, MAPPINGS));
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      assert.deepEqual(r.json, withoutEmptyDns(pod.prev));
    });

    it('flushed the stale UDP conntrack entry of the mapped port, not the TCP one', async () => {
      const flows = (await nsExec(host, 'cat', '/proc/net/nf_conntrack')).split('\n').filter((l) => l.includes('sport=40000'));
      assert.deepEqual(
        flows.map((l) => l.split(/\s+/)[2]),
        ['tcp'],
      );
    });

    it('forwards a hostPort from outside the node, keeping the client address', async () => {
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8080), 'pod:80 peer=192.168.50.2');
      assert.equal(await connect(client, 'tcp', '192.168.50.3', 8080), 'pod:80 peer=192.168.50.2');
    });

    it('forwards a hostIP mapping only on that address', async () => {
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8081), 'pod:81 peer=192.168.50.2');
      assert.equal(await connect(client, 'tcp', '192.168.50.3', 8081), 'ERR ECONNREFUSED');
    });

    it('forwards UDP', async () => {
      assert.equal(await connect(client, 'udp', '192.168.50.1', 8053), 'pod:53 peer=192.168.50.2');
    });

    it('forwards 127.0.0.1:hostPort from the host (route_localnet on the bridge, masquerade)', async () => {
      assert.equal((await nsExec(host, 'cat', `/proc/sys/net/ipv4/conf/${BRIDGE}/route_localnet`)).trim(), '1');
      assert.equal(await connect(host, 'tcp', '127.0.0.1', 8080), 'pod:80 peer=10.244.77.1');
    });

    it('forwards the pod to its own hostPort (hairpin, masqueraded)', async () => {
      assert.equal(await connect(pod.ns, 'tcp', '10.244.77.1', 8080), 'pod:80 peer=10.244.77.1');
    });

    it('passes CHECK for the IPv4-only pod (reference 1.1.1 fails it: #819)', async () => {
      const conf = portmapConf(pod.prev, MAPPINGS);
      const r = await portmap(ours, 'CHECK', host, 'ctr-dp', pod.ns, conf);
      assert.deepEqual([r.exitCode, r.stdout], [0, '']);
      const ref = await portmap(REF_PORTMAP, 'CHECK', host, 'ctr-dp', pod.ns, conf);
      assert.equal(ref.exitCode, 1);
      assert.match((ref.json as { msg: string }).msg, /^could not check ipv6 dnat: chain CNI-DN-\w+ not found in iptables table nat$/);
    });

    it('fails CHECK, naming the rule, when a rule was removed', async () => {
      const chain = (await natTable(host, 4)).split('\n').find((l) => l.startsWith(':CNI-DN-'))!.slice(1).split(' ')[0]!;
      const spec = ['-p', 'udp', '-m', 'udp', '--dport', '8053', '-j', 'DNAT', '--to-destination', '10.244.77.2:53'];
      await nsExec(host, 'iptables', '-t', 'nat', '-D', chain, ...spec);
      const r = await portmap(ours, 'CHECK', host, 'ctr-dp', pod.ns, portmapConf(pod.prev, MAPPINGS));
      assert.equal(r.exitCode, 1);
      assert.deepEqual(r.json, {
        code: 999,
        msg: `could not check ipv4 dnat: rule "${spec.join(' ')}" in chain ${chain} not found in table nat`,
      });
      // A repeated ADD rewrites the container chain whole.
      const again = await portmap(ours, 'ADD', host, 'ctr-dp', pod.ns, portmapConf(pod.prev, MAPPINGS));
      assert.equal(again.exitCode, 0, again.stdout);
      assert.equal((await portmap(ours, 'CHECK', host, 'ctr-dp', pod.ns, portmapConf(pod.prev, MAPPINGS))).exitCode, 0);
    });

    it('DEL closes the ports and removes the container chain; a second DEL, without netns or prevResult, succeeds', async () => {
      const r = await portmap(ours, 'DEL', host, 'ctr-dp', pod.ns, portmapConf(pod.prev, MAPPINGS));
      assert.deepEqual([r.exitCode, r.stdout], [0, '']);
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8080), 'ERR ECONNREFUSED');
      assert.doesNotMatch(await natTable(host, 4), /CNI-DN-/);
      const again = await portmap(ours, 'DEL', host, 'ctr-dp', null, portmapConf(null, MAPPINGS));
      assert.deepEqual([again.exitCode, again.stdout], [0, '']);
    });
  });

  describe('portmap (iptables): the same kernel state as the reference plugin', function () {
    this.timeout(120_000);
    const MAPPINGS: Mapping[] = [
      { hostPort: 8080, containerPort: 80, protocol: 'tcp' },
      { hostPort: 8443, containerPort: 443, protocol: 'tcp', hostIP: '192.168.50.1' },
      { hostPort: 8053, containerPort: 53, protocol: 'udp' },
      { hostPort: 9999, containerPort: 99, protocol: 'sctp', hostIP: 'fd00:50::1' },
    ];
    const EXTRA = { conditionsV4: ['!', '-d', '192.0.2.0/24'], markMasqBit: 12 };
    interface Snapshot {
      result: unknown;
      prev: Prev;
      before: [string, string];
      added: [string, string];
      deleted: [string, string];
    }
    const runs: Record<'ours' | 'ref', Snapshot | null> = { ours: null, ref: null };

    before(async () => {
      for (const impl of ['ours', 'ref'] as const) {
        const host = await netns(`df-${impl}`);
        const pod = await makePod(host, `df-${impl}-pod`, 'ctr-df', true);
        const bin = impl === 'ours' ? ours : REF_PORTMAP;
        const snap = async (): Promise<[string, string]> => [await natTable(host, 4), await natTable(host, 6)];
        const before = await snap();
        const conf = portmapConf(pod.prev, MAPPINGS, EXTRA);
        const add = await portmap(bin, 'ADD', host, 'ctr-df', pod.ns, conf);
        assert.equal(add.exitCode, 0, `${impl} ADD: ${add.stdout}${add.stderr}`);
        const added = await snap();
        const del = await portmap(bin, 'DEL', host, 'ctr-df', pod.ns, conf);
        assert.equal(del.exitCode, 0, `${impl} DEL: ${del.stdout}${del.stderr}`);
        runs[impl] = { result: add.json, prev: pod.prev, before, added, deleted: await snap() };
      }
    });

    it('returns prevResult unchanged, as the reference does', () => {
      assert.deepEqual(runs.ref!.result, runs.ref!.prev);
      assert.deepEqual(runs.ours!.result, withoutEmptyDns(runs.ours!.prev));
    });

    it('writes the same IPv4 and IPv6 nat tables on ADD', () => {
      assert.equal(runs.ours!.added[0], runs.ref!.added[0]);
      assert.equal(runs.ours!.added[1], runs.ref!.added[1]);
      // The mapping really is there, with the conditions and mark bit of the config.
      assert.match(runs.ours!.added[0], /^-A CNI-HOSTPORT-DNAT ! -d 192\.0\.2\.0\/24 -p tcp -m comment --comment "dnat name: \\"wt-pm-net\\" id: \\"ctr-df\\"" -m multiport --dports 8080,8443 -j CNI-DN-\w{21}$/m);
      assert.match(runs.ours!.added[0], /^-A CNI-HOSTPORT-MASQ -m mark --mark 0x1000\/0x1000 -j MASQUERADE$/m);
      assert.match(runs.ours!.added[1], /^-A CNI-DN-\w{21} -d fd00:50::1\/128 -p sctp -m sctp --dport 9999 -j DNAT --to-destination \[fd00:77::2\]:99$/m);
    });

    it('leaves the same tables after DEL: only the shared top-level chains stay', () => {
      assert.equal(runs.ours!.deleted[0], runs.ref!.deleted[0]);
      assert.equal(runs.ours!.deleted[1], runs.ref!.deleted[1]);
      for (const fam of [0, 1] as const) {
        assert.doesNotMatch(runs.ours!.deleted[fam], /CNI-DN-/);
        const extra = runs.ours!.deleted[fam].split('\n').filter((l) => !runs.ours!.before[fam].split('\n').includes(l));
        assert.ok(extra.every((l) => l.includes('CNI-HOSTPORT-')), extra.join('\n'));
      }
    });
  });

  describe('portmap: config errors like the reference', function () {
    this.timeout(60_000);
    let host = '';
    let podNs = '';
    const PREV: Prev = {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: '/run/netns/none' }],
      ips: [{ address: '10.244.77.9/24', interface: 0 }],
    };
    const ONE: Mapping[] = [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }];

    before(async () => {
      host = await netns('err-host');
      podNs = await netns('err-pod');
    });

    const cases: [string, string, string][] = [
      ['ADD', 'no prevResult', portmapConf(null, ONE)],
      ['ADD', 'markMasqBit with externalSetMarkChain', portmapConf(PREV, ONE, { markMasqBit: 3, externalSetMarkChain: 'KUBE-MARK-MASQ' })],
      ['ADD', 'markMasqBit out of range', portmapConf(PREV, ONE, { markMasqBit: 40 })],
      ['ADD', 'host port 0', portmapConf(PREV, [{ hostPort: 0, containerPort: 80, protocol: 'tcp' }])],
      ['DEL', 'container port -1', portmapConf(PREV, [{ hostPort: 80, containerPort: -1, protocol: 'tcp' }])],
      ['CHECK', 'no prevResult', portmapConf(null, ONE)],
    ];
    for (const [verb, what, conf] of cases) {
      it(`${verb} with ${what}`, async () => {
        const mine = await portmap(ours, verb, host, 'ctr-err', podNs, conf);
        const ref = await portmap(REF_PORTMAP, verb, host, 'ctr-err', podNs, conf);
        // Both failed on the config, not on a missing variable.
        assert.notEqual((ref.json as { code: number }).code, 4, ref.stdout);
        assert.equal(mine.exitCode, 1);
        assert.equal(ref.exitCode, 1);
        assert.deepEqual(mine.json, ref.json);
      });
    }

    it('names the options of the other backend, and leaves no rules behind', async () => {
      const r = await portmap(ours, 'ADD', host, 'ctr-err', podNs, portmapConf(PREV, ONE, { backend: 'nftables', externalSetMarkChain: 'KUBE-MARK-MASQ' }));
      assert.equal(r.exitCode, 1);
      assert.deepEqual(r.json, {
        code: 999,
        msg: 'failed to parse config: nftables backend was requested but configuration contains iptables-specific options [externalSetMarkChain]',
      });
      const bad = await portmap(ours, 'ADD', host, 'ctr-err', podNs, portmapConf(PREV, [{ hostPort: 8080, containerPort: 80, protocol: 'icmp' }]));
      assert.deepEqual(bad.json, { code: 7, msg: 'failed to parse config: Invalid protocol "icmp" for host port 8080: must be tcp, udp or sctp' });
      assert.doesNotMatch(await natTable(host, 4), /CNI-/);
    });
  });

  describe('portmap (iptables): GC', function () {
    this.timeout(60_000);

    it('removes the chains of containers that are not valid any more, of this network only', async () => {
      const host = await netns('gc-host');
      const podNs = `/run/netns/${await netns('gc-pod')}`;
      const prev = (ip: string): Prev => ({ cniVersion: '1.1.0', interfaces: [{ name: 'eth0', sandbox: '/x' }], ips: [{ address: `${ip}/24`, interface: 0 }] });
      const one: Mapping[] = [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }];
      for (const [cid, ip] of [
        ['keep', '10.244.77.2'],
        ['stale', '10.244.77.3'],
      ]) {
        const r = await runCni({ bin: ours, command: 'ADD', containerId: cid, netns: podNs, hostNs: host }, portmapConf(prev(ip!), one, {}, '1.1.0'));
        assert.equal(r.exitCode, 0, r.stdout);
      }
      const other = await runCni(
        { bin: ours, command: 'ADD', containerId: 'stale', netns: podNs, hostNs: host },
        JSON.stringify({ cniVersion: '1.1.0', name: 'other-net', type: 'portmap', runtimeConfig: { portMappings: one }, prevResult: prev('10.244.78.3') }),
      );
      assert.equal(other.exitCode, 0, other.stdout);
      const gc = await runCni(
        { bin: ours, command: 'GC', hostNs: host },
        JSON.stringify({ cniVersion: '1.1.0', name: NET, type: 'portmap', 'cni.dev/valid-attachments': [{ containerID: 'keep', ifname: 'eth0' }] }),
      );
      assert.deepEqual([gc.exitCode, gc.stdout], [0, '']);
      const table = await natTable(host, 4);
      assert.match(table, /id: \\"keep\\"/);
      assert.match(table, /name: \\"other-net\\" id: \\"stale\\"/);
      assert.doesNotMatch(table, new RegExp(`name: \\\\"${NET}\\\\" id: \\\\"stale\\\\"`));
      assert.equal(table.split('\n').filter((l) => l.startsWith(':CNI-DN-')).length, 2);

      // Without the attachment list nothing can be told stale: a no-op. STATUS: the tools are there.
      const noList = await runCni({ bin: ours, command: 'GC', hostNs: host }, JSON.stringify({ cniVersion: '1.1.0', name: 'other-net', type: 'portmap' }));
      assert.deepEqual([noList.exitCode, noList.stdout], [0, '']);
      assert.match(await natTable(host, 4), /name: \\"other-net\\" id: \\"stale\\"/);
      const status = await runCni({ bin: ours, command: 'STATUS', hostNs: host }, JSON.stringify({ cniVersion: '1.1.0', name: NET, type: 'portmap' }));
      assert.deepEqual([status.exitCode, status.stdout], [0, '']);
    });
  });

  describe('portmap (iptables): concurrent ADDs on a fresh host', function () {
    this.timeout(60_000);

    it('creates the shared chains and jumps once and every container chain', async () => {
      const host = await netns('cc-host');
      const podNs = `/run/netns/${await netns('cc-pod')}`;
      const ids = ['c0', 'c1', 'c2', 'c3', 'c4', 'c5'];
      const results = await Promise.all(
        ids.map((cid, i) => {
          const prev: Prev = { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: podNs }], ips: [{ address: `10.244.77.${10 + i}/24`, interface: 0 }] };
          return runCni({ bin: ours, command: 'ADD', containerId: cid, netns: podNs, hostNs: host }, portmapConf(prev, [{ hostPort: 7000 + i, containerPort: 80, protocol: 'tcp' }]));
        }),
      );
      for (const r of results) assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      const table = (await natTable(host, 4)).split('\n');
      const count = (line: string): number => table.filter((l) => l === line).length;
      assert.equal(count('-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT'), 1);
      assert.equal(count('-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT'), 1);
      assert.equal(count('-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ'), 1);
      assert.equal(count('-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE'), 1);
      assert.equal(count('-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000'), 1);
      assert.equal(table.filter((l) => l.startsWith(':CNI-DN-')).length, ids.length);
      for (const [i, cid] of ids.entries()) {
        assert.equal(table.filter((l) => l.startsWith('-A CNI-HOSTPORT-DNAT ') && l.includes(`id: \\"${cid}\\"`) && l.includes(`--dports ${7000 + i} `)).length, 1, cid);
      }
    });
  });

  describe('portmap (iptables): writing without reading the table first', function () {
    this.timeout(60_000);

    const prevOf = (podNs: string, addresses: string[]): Prev => ({
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: podNs }],
      ips: addresses.map((address) => ({ address, interface: 0 })),
    });
    const PREROUTING_JUMP = '-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT';
    const OUTPUT_JUMP = '-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT';
    const MASQ_JUMP = '-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ';
    const count = (table: string, pred: (l: string) => boolean): number => table.split('\n').filter(pred).length;
    const entriesOf = (table: string, cid: string): string[] =>
      table.split('\n').filter((l) => l.startsWith('-A CNI-HOSTPORT-DNAT ') && l.includes(`id: \\"${cid}\\"`));

    it('puts back shared jumps that were flushed, once, on the next ADD', async () => {
      const host = await netns('bl-host');
      const podNs = `/run/netns/${await netns('bl-pod')}`;
      const add = (cid: string, i: number) =>
        runCni({ bin: ours, command: 'ADD', containerId: cid, netns: podNs, hostNs: host }, portmapConf(prevOf(podNs, [`10.244.77.${20 + i}/24`]), [{ hostPort: 7100 + i, containerPort: 80, protocol: 'tcp' }]));
      assert.equal((await add('b0', 0)).exitCode, 0);
      // Something (a firewall reload, `iptables -t nat -F PREROUTING`) drops the jumps; the shared chains stay.
      await nsExec(host, 'iptables', '-t', 'nat', '-F', 'PREROUTING');
      await nsExec(host, 'iptables', '-t', 'nat', '-F', 'POSTROUTING');
      const r = await add('b1', 1);
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      const table = await natTable(host, 4);
      assert.equal(count(table, (l) => l === PREROUTING_JUMP), 1);
      assert.equal(count(table, (l) => l === OUTPUT_JUMP), 1);
      assert.equal(count(table, (l) => l === MASQ_JUMP), 1);
      assert.equal(entriesOf(table, 'b0').length, 1);
      assert.equal(entriesOf(table, 'b1').length, 1);
      // With everything in place, a further ADD adds its own chain and entry rule and no shared rule.
      assert.equal((await add('b2', 2)).exitCode, 0);
      const after = await natTable(host, 4);
      assert.equal(count(after, (l) => l === PREROUTING_JUMP || l === OUTPUT_JUMP || l === MASQ_JUMP), 3);
      assert.deepEqual(entriesOf(after, 'b2').map((l) => / --dports (\d+) /.exec(l)?.[1]), ['7102']);
    });

    it('a repeated ADD with other ports replaces the entry rules instead of adding to them', async () => {
      const host = await netns('rp-host');
      const podNs = `/run/netns/${await netns('rp-pod')}`;
      const prev = prevOf(podNs, ['10.244.77.30/24']);
      const add = (port: number) => runCni({ bin: ours, command: 'ADD', containerId: 'rp', netns: podNs, hostNs: host }, portmapConf(prev, [{ hostPort: port, containerPort: 80, protocol: 'tcp' }]));
      assert.equal((await add(7200)).exitCode, 0);
      assert.equal((await add(7201)).exitCode, 0);
      const table = await natTable(host, 4);
      assert.deepEqual(entriesOf(table, 'rp').map((l) => / --dports (\d+) /.exec(l)?.[1]), ['7201']);
      assert.equal(count(table, (l) => l.startsWith(':CNI-DN-')), 1);
      assert.equal(count(table, (l) => l.includes('--dport 7200 ')), 0);
    });

    it('DEL removes every jump to the container chain, also one it did not write', async () => {
      const host = await netns('xj-host');
      const podNs = `/run/netns/${await netns('xj-pod')}`;
      const prev = prevOf(podNs, ['10.244.77.40/24']);
      const conf = portmapConf(prev, [{ hostPort: 7300, containerPort: 80, protocol: 'tcp' }]);
      assert.equal((await runCni({ bin: ours, command: 'ADD', containerId: 'xj', netns: podNs, hostNs: host }, conf)).exitCode, 0);
      const chain = (await natTable(host, 4)).split('\n').find((l) => l.startsWith(':CNI-DN-'))!.slice(1).split(' ')[0]!;
      await nsExec(host, 'iptables', '-t', 'nat', '-A', 'CNI-HOSTPORT-DNAT', '-p', 'tcp', '--dport', '7301', '-j', chain);
      const del = await runCni({ bin: ours, command: 'DEL', containerId: 'xj', netns: podNs, hostNs: host }, conf);
      assert.deepEqual([del.exitCode, del.stdout], [0, '']);
      const table = await natTable(host, 4);
      assert.equal(count(table, (l) => l.includes(chain)), 0);
      assert.equal(count(table, (l) => l === PREROUTING_JUMP), 1);
    });

    it('DEL with a prevResult cleans only the families the container has; without one, both', async () => {
      const host = await netns('fs-host');
      const podNs = `/run/netns/${await netns('fs-pod')}`;
      const mappings = [{ hostPort: 7400, containerPort: 80, protocol: 'tcp' }];
      const dual = prevOf(podNs, ['10.244.77.50/24', 'fd00:77::50/64']);
      const v4only = prevOf(podNs, ['10.244.77.50/24']);
      const run = (command: string, prev: Prev | null) =>
        runCni({ bin: ours, command, containerId: 'fs', netns: podNs, hostNs: host }, portmapConf(prev, mappings));
      // An IPv6 chain of this container that an IPv4-only result does not account for stays.
      assert.equal((await run('ADD', dual)).exitCode, 0);
      assert.equal((await run('DEL', v4only)).exitCode, 0);
      assert.equal(count(await natTable(host, 4), (l) => l.startsWith(':CNI-DN-')), 0);
      assert.equal(count(await natTable(host, 6), (l) => l.startsWith(':CNI-DN-')), 1);
      // DEL without prevResult cannot know the families: it cleans both.
      assert.equal((await run('DEL', null)).exitCode, 0);
      assert.equal(count(await natTable(host, 6), (l) => l.startsWith(':CNI-DN-')), 0);
      // With the dual-stack result both go at once.
      assert.equal((await run('ADD', dual)).exitCode, 0);
      assert.equal((await run('DEL', dual)).exitCode, 0);
      assert.equal(count(await natTable(host, 4), (l) => l.startsWith(':CNI-DN-')), 0);
      assert.equal(count(await natTable(host, 6), (l) => l.startsWith(':CNI-DN-')), 0);
    });
  });

  describe('portmap (nftables backend)', function () {
    this.timeout(120_000);
    let host = '';
    let client = '';
    let pod = { ns: '', prev: null as Prev | null };
    const MAPPINGS: Mapping[] = [
      { hostPort: 8080, containerPort: 80, protocol: 'tcp' },
      { hostPort: 8081, containerPort: 81, protocol: 'tcp', hostIP: '192.168.50.1' },
    ];
    const conf = (): string => portmapConf(pod.prev, MAPPINGS, { backend: 'nftables' });

    before(async () => {
      host = await netns('nft-host');
      client = await netns('nft-cli');
      pod = await makePod(host, 'nft-pod', 'ctr-nft');
      await connectClient(host, client, ['192.168.50.1/24']);
      await startServer(pod.ns);
      const r = await portmap(ours, 'ADD', host, 'ctr-nft', pod.ns, conf());
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      assert.deepEqual(r.json, withoutEmptyDns(pod.prev));
    });

    it('writes table ip cni_hostport as upstream lays it out', async () => {
      assert.equal(pod.prev!.ips[0]!.address, '10.244.77.2/24');
      assert.equal(
        await nsExec(host, 'nft', 'list', 'table', 'ip', 'cni_hostport'),
        [
          'table ip cni_hostport {',
          '\tcomment "CNI portmap plugin"',
          '\tchain hostports {',
          '\t\ttcp dport 8080 dnat to 10.244.77.2:80 comment "ctr-nft"',
          '\t\tip daddr 192.168.50.1 tcp dport 8081 dnat to 10.244.77.2:81 comment "ctr-nft"',
          '\t}',
          '',
          '\tchain hostip_hostports {',
          '\t}',
          '',
          '\tchain hostports_all {',
          '\t\tjump hostip_hostports',
          '\t\tjump hostports',
          '\t}',
          '',
          '\tchain prerouting {',
          '\t\ttype nat hook prerouting priority dstnat; policy accept;',
          '\t\tfib daddr type local jump hostports_all',
          '\t}',
          '',
          '\tchain output {',
          '\t\ttype nat hook output priority -100; policy accept;',
          '\t\tfib daddr type local jump hostports_all',
          '\t}',
          '',
          '\tchain masquerading {',
          '\t\ttype nat hook postrouting priority srcnat; policy accept;',
          '\t\tip saddr 10.244.77.2 ip daddr 10.244.77.2 masquerade comment "ctr-nft"',
          '\t\tip saddr 127.0.0.1 ip daddr 10.244.77.2 masquerade comment "ctr-nft"',
          '\t}',
          '}',
          '',
        ].join('\n'),
      );
      // Nothing for the family the pod does not have, and nothing in iptables.
      await assert.rejects(nsExec(host, 'nft', 'list', 'table', 'ip6', 'cni_hostport'), /No such file or directory/);
      assert.doesNotMatch(await natTable(host, 4), /CNI-/);
    });

    it('forwards the host ports (outside, hostIP, localhost, hairpin)', async () => {
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8080), 'pod:80 peer=192.168.50.2');
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8081), 'pod:81 peer=192.168.50.2');
      assert.equal(await connect(host, 'tcp', '127.0.0.1', 8080), 'pod:80 peer=10.244.77.1');
      assert.equal(await connect(pod.ns, 'tcp', '10.244.77.1', 8080), 'pod:80 peer=10.244.77.1');
    });

    it('CHECK passes; a repeated ADD does not duplicate rules', async () => {
      assert.equal((await portmap(ours, 'CHECK', host, 'ctr-nft', pod.ns, conf())).exitCode, 0);
      assert.equal((await portmap(ours, 'ADD', host, 'ctr-nft', pod.ns, conf())).exitCode, 0);
      const listed = await nsExec(host, 'nft', 'list', 'chain', 'ip', 'cni_hostport', 'hostports');
      assert.equal(listed.split('\n').filter((l) => l.includes('comment "ctr-nft"')).length, 2);
    });

    it('DEL removes the container rules and the port closes; DEL again succeeds', async () => {
      const r = await portmap(ours, 'DEL', host, 'ctr-nft', pod.ns, conf());
      assert.deepEqual([r.exitCode, r.stdout], [0, '']);
      assert.doesNotMatch(await nsExec(host, 'nft', 'list', 'table', 'ip', 'cni_hostport'), /ctr-nft/);
      assert.equal(await connect(client, 'tcp', '192.168.50.1', 8080), 'ERR ECONNREFUSED');
      const check = await portmap(ours, 'CHECK', host, 'ctr-nft', pod.ns, conf());
      assert.equal(check.exitCode, 1);
      assert.match((check.json as { msg: string }).msg, /^missing hostport rules: rule "tcp dport 8080 dnat to 10\.244\.77\.2:80 comment "ctr-nft"" not found/);
      assert.equal((await portmap(ours, 'DEL', host, 'ctr-nft', null, portmapConf(null, MAPPINGS, { backend: 'nftables' }))).exitCode, 0);
    });
  });
});
