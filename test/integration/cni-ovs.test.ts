// The weft-ovs plugin bundle against a real Open vSwitch (userspace netdev datapath) running in a
// private node netns: the bridge, gateway port and pipeline flows are set up here the way weftd's
// ovs backend sets them up; the plugin runs inside the node netns (`ip netns exec`, where
// ovs-vswitchd sees the veth host ends); pods are namespaces created here. Also: flannel's bundle
// delegating to weft-ovs (in-process) when subnet.env says WEFT_BACKEND=ovs.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { buildCniBundles } from '../../cni-plugins/build.js';
import { hostVethName } from '../../cni-plugins/ovs/plan.js';
import { ensureBridge, listPodInterfaces, saveRound, setGatewayMac } from '../../src/backend/ovs/bridge.js';
import { findPodInterfaces } from '../../src/backend/ovs/podport.js';
import { Category, cookieOf, macFromIP, pipelineFlows, podFlows, renderFlows, type NodePorts } from '../../src/backend/ovs/pipeline.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { IPAddr } from '../../src/util/ip.js';
import { runCni, type CniRun } from '../helpers/cni.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from '../helpers/netns.js';
import { OvsInstance } from '../helpers/ovs.js';
import { waitFor } from '../helpers/wait.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const NETWORK = 'wtovs';
const BRIDGE = 'br-int';
const GATEWAY = IPAddr.parse('10.244.1.1');
const ROUND = 1;
const ARGS = (pod: string) => `IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=${pod}`;

type Json = Record<string, unknown>;

interface Pod {
  readonly ns: string;
  readonly containerId: string;
  readonly name: string;
}

describe('weft-ovs CNI plugin (integration, private Open vSwitch, netdev datapath)', function () {
  this.timeout(120_000);
  const prefix = nsPrefix('co');
  const namespaces: string[] = [];
  let tmp = '';
  let binDir = '';
  let ipamDir = '';
  let node = '';
  let ovs: OvsInstance | null = null;
  let client: OvsClient;
  let nodePorts: NodePorts;
  let seq = 0;

  async function netns(tag: string): Promise<string> {
    const name = `${prefix}-${tag}${seq++}`;
    namespaces.push(name);
    return addNetns(name);
  }

  async function pod(name: string): Promise<Pod> {
    return { ns: await netns('p'), containerId: `ctr-${name}-${seq}`, name };
  }

  function conf(extra: Json = {}): Json {
    return {
      cniVersion: '1.0.0',
      name: NETWORK,
      type: 'weft-ovs',
      bridge: BRIDGE,
      ovsRunDir: ovs!.runDir,
      datapathType: 'netdev',
      mtu: 1450,
      isDefaultGateway: true,
      ipam: { type: 'host-local', dataDir: ipamDir, ranges: [[{ subnet: '10.244.1.0/24' }]], routes: [{ dst: '10.244.0.0/16' }] },
      ...extra,
    };
  }

  function plugin(p: Pod, command: string, stdin: Json, o: { netns?: string | null; bin?: string } = {}): Promise<CniRun> {
    const netnsPath = o.netns === null ? undefined : (o.netns ?? `/run/netns/${p.ns}`);
    return runCni(
      {
        bin: o.bin ?? join(binDir, 'weft-ovs'),
        path: binDir,
        command,
        hostNs: node,
        containerId: p.containerId,
        args: ARGS(p.name),
        ...(netnsPath !== undefined ? { netns: netnsPath } : {}),
      },
      JSON.stringify(stdin),
    );
  }

  function ok(r: CniRun): Json {
    assert.equal(r.exitCode, 0, `plugin failed: ${r.stdout}${r.stderr}`);
    return (r.json ?? {}) as Json;
  }

  function fails(r: CniRun): { code: number; msg: string; details?: string } {
    assert.equal(r.exitCode, 1, `expected a failure, got: ${r.stdout}${r.stderr}`);
    return r.json as { code: number; msg: string; details?: string };
  }

  async function linkMac(ns: string, dev: string): Promise<string> {
    const [l] = JSON.parse(await ipn(ns, '-j', 'link', 'show', 'dev', dev)) as Array<{ address: string }>;
    return l!.address;
  }

  async function linkExists(ns: string, dev: string): Promise<boolean> {
    const links = JSON.parse(await ipn(ns, '-j', 'link', 'show')) as Array<{ ifname: string }>;
    return links.some((l) => l.ifname === dev);
  }

  async function reservations(): Promise<string[]> {
    const dir = join(ipamDir, NETWORK);
    if (!existsSync(dir)) return [];
    return (await readdir(dir)).filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f)).sort();
  }

  async function externalIds(iface: string): Promise<Record<string, string>> {
    const out = await client.vsctl(['--format=json', '--columns=external_ids', 'list', 'interface', iface]);
    const row = (JSON.parse(out) as { data: Array<[['map', Array<[string, string]>]]> }).data[0]!;
    return Object.fromEntries(row[0][1]);
  }

  async function podFlowLines(ofport: number): Promise<string[]> {
    const cookie = cookieOf(ROUND, Category.Pod, ofport);
    return client.dumpFlows(BRIDGE, `cookie=0x${cookie.toString(16)}/-1`);
  }

  async function ping(from: string, to: string): Promise<void> {
    await waitFor(() => nsExec(from, 'ping', '-c', '1', '-W', '1', to).then(() => true), { timeoutMs: 15_000, what: `ping ${from} → ${to}` });
  }

  before(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'wt-cni-ovs-'));
    ipamDir = join(tmp, 'ipam');
    // Only the bundles used here, under the names a runtime would look up (build.ts names bundles
    // after their directory, which would make this one `ovs`).
    binDir = join(tmp, 'bin');
    const bundles = buildCniBundles(binDir, [
      { name: 'weft-ovs', entry: join(ROOT, 'cni-plugins/cmd/weft-ovs.ts') },
      { name: 'host-local', entry: join(ROOT, 'cni-plugins/cmd/host-local.ts') },
      { name: 'flannel', entry: join(ROOT, 'cni-plugins/cmd/flannel.ts') },
    ]);
    node = await netns('n');
    ovs = await OvsInstance.start(node, join(tmp, 'ovs'));
    client = new OvsClient({ runDir: ovs.runDir });
    const ports = await ensureBridge(client, { bridge: BRIDGE, datapathType: 'netdev', vni: 1, udpPort: 4789, mtu: 1450 });
    const gatewayMAC = macFromIP(GATEWAY);
    await setGatewayMac(client, gatewayMAC);
    await waitFor(async () => (await linkMac(node, 'weft-gw0')) === gatewayMAC, { what: 'the weft-gw0 MAC' });
    await ipn(node, 'addr', 'add', '10.244.1.1/24', 'dev', 'weft-gw0');
    await ipn(node, 'link', 'set', 'weft-gw0', 'mtu', '1450', 'up');
    nodePorts = { vni: 1, tunnelPort: ports.tunnel, gatewayPort: ports.gateway, gatewayIP: GATEWAY, gatewayMAC };
    await client.addFlows(BRIDGE, renderFlows(pipelineFlows(ROUND, nodePorts)));
    await saveRound(client, BRIDGE, ROUND);
    await bundles;
  });

  after(async () => {
    if (ovs) await ovs.stop();
    for (const ns of namespaces) await delNetns(ns);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  describe('ADD two pods, traffic, CHECK, DEL', () => {
    let a: Pod;
    let b: Pod;
    let resultA: Json;
    let resultB: Json;

    before(async () => {
      a = await pod('a');
      b = await pod('b');
    });

    it('ADD prints the result: host veth, pod interface (MAC from its IP) in its sandbox, IP, routes', async () => {
      resultA = ok(await plugin(a, 'ADD', conf()));
      resultB = ok(await plugin(b, 'ADD', conf()));
      const expected = async (p: Pod, ip: string, mac: string): Promise<Json> => {
        const host = hostVethName(p.containerId, 'eth0');
        return {
          cniVersion: '1.0.0',
          interfaces: [
            { name: host, mac: await linkMac(node, host) },
            { name: 'eth0', mac, sandbox: `/run/netns/${p.ns}` },
          ],
          ips: [{ interface: 1, address: `${ip}/24`, gateway: '10.244.1.1' }],
          routes: [{ dst: '10.244.0.0/16' }, { dst: '0.0.0.0/0', gw: '10.244.1.1' }],
        };
      };
      assert.deepEqual(resultA, await expected(a, '10.244.1.2', '0a:58:0a:f4:01:02'));
      assert.deepEqual(resultB, await expected(b, '10.244.1.3', '0a:58:0a:f4:01:03'));
      assert.deepEqual(await reservations(), ['10.244.1.2', '10.244.1.3']);
    });

    it('the pod interface: MAC, MTU, address, routes, TX checksum offload off; the host end has ARP off', async () => {
      const [l] = JSON.parse(await ipn(a.ns, '-j', 'addr', 'show', 'dev', 'eth0')) as Array<{
        address: string;
        mtu: number;
        operstate: string;
        addr_info: Array<{ family: string; local: string; prefixlen: number }>;
      }>;
      assert.equal(l!.address, '0a:58:0a:f4:01:02');
      assert.equal(l!.mtu, 1450);
      assert.equal(l!.operstate, 'UP');
      assert.deepEqual(
        l!.addr_info.filter((x) => x.family === 'inet').map((x) => `${x.local}/${x.prefixlen}`),
        ['10.244.1.2/24'],
      );
      const routes = JSON.parse(await ipn(a.ns, '-j', 'route', 'show')) as Array<{ dst: string; gateway?: string }>;
      assert.deepEqual(
        routes.map((r) => `${r.dst}${r.gateway ? ` via ${r.gateway}` : ''}`),
        ['default via 10.244.1.1', '10.244.0.0/16 via 10.244.1.1', '10.244.1.0/24'],
      );
      const features = await nsExec(a.ns, 'ethtool', '-k', 'eth0');
      assert.match(features, /^tx-checksumming: off$/m);
      const host = hostVethName(a.containerId, 'eth0');
      const [h] = JSON.parse(await ipn(node, '-j', 'link', 'show', 'dev', host)) as Array<{ flags: string[]; mtu: number }>;
      assert.ok(h!.flags.includes('NOARP'), `flags of ${host}: ${h!.flags.join(',')}`);
      assert.equal(h!.mtu, 1450);
    });

    it('the ports carry the pod’s external_ids and the flow table is exactly the pipeline + 5 flows per pod', async () => {
      const ports = await listPodInterfaces(client, BRIDGE);
      const hostA = hostVethName(a.containerId, 'eth0');
      const hostB = hostVethName(b.containerId, 'eth0');
      assert.deepEqual(
        ports.map((p) => ({ name: p.name, ip: p.ip.toString(), mac: p.mac, containerId: p.containerId, ifName: p.ifName })),
        [
          { name: hostA, ip: '10.244.1.2', mac: '0a:58:0a:f4:01:02', containerId: a.containerId, ifName: 'eth0' },
          { name: hostB, ip: '10.244.1.3', mac: '0a:58:0a:f4:01:03', containerId: b.containerId, ifName: 'eth0' },
        ],
      );
      assert.deepEqual(await externalIds(hostA), {
        'attached-mac': '0a:58:0a:f4:01:02',
        'weft-container-id': a.containerId,
        'weft-ifname': 'eth0',
        'weft-ip': '10.244.1.2',
        'weft-pod-name': 'a',
        'weft-pod-namespace': 'default',
      });
      for (const p of ports) assert.equal((await podFlowLines(p.ofport)).length, 5, `pod flows of ${p.name}`);
      const desired = [...pipelineFlows(ROUND, nodePorts), ...ports.flatMap((p) => podFlows(ROUND, nodePorts, p))];
      assert.deepEqual(await client.diffFlows(BRIDGE, renderFlows(desired)), []);
    });

    it('each pod reaches the gateway (the node) and the other pod through OVS', async () => {
      await ping(a.ns, '10.244.1.1');
      await ping(b.ns, '10.244.1.1');
      await ping(a.ns, '10.244.1.3');
      await ping(b.ns, '10.244.1.2');
      // The pod learnt the gateway from OVS's ARP responder, not from the node kernel on the veth.
      const neigh = await ipn(a.ns, 'neigh', 'show', '10.244.1.1');
      assert.match(neigh, new RegExp(`lladdr ${macFromIP(GATEWAY)}`));
    });

    it('CHECK passes for the ADD result and names a changed MAC', async () => {
      ok(await plugin(a, 'CHECK', { ...conf(), prevResult: resultA }));
      await ipn(a.ns, 'link', 'set', 'eth0', 'address', '02:00:00:00:00:99');
      try {
        const e = fails(await plugin(a, 'CHECK', { ...conf(), prevResult: resultA }));
        assert.deepEqual(e, { code: 999, msg: "Interface eth0 Mac 0a:58:0a:f4:01:02 doesn't match container Mac: 02:00:00:00:00:99" });
      } finally {
        await ipn(a.ns, 'link', 'set', 'eth0', 'address', '0a:58:0a:f4:01:02');
      }
    });

    it('a second ADD of the same attachment fails and leaves the first one working', async () => {
      const e = fails(await plugin(a, 'ADD', conf()));
      assert.equal(e.code, 999);
      assert.match(e.msg, /duplicate allocation|already attached/);
      assert.deepEqual(await reservations(), ['10.244.1.2', '10.244.1.3']);
      assert.equal((await findPodInterfaces(client, { containerId: a.containerId, ifName: 'eth0' })).length, 1);
      await ping(a.ns, '10.244.1.1');
    });

    it('DEL removes the port, its flows, the veth and the IP reservation; a second DEL succeeds', async () => {
      const [portA] = await findPodInterfaces(client, { containerId: a.containerId, ifName: 'eth0' });
      assert.ok(portA, 'no OVS port of pod A');
      ok(await plugin(a, 'DEL', { ...conf(), prevResult: resultA }));
      assert.deepEqual(await findPodInterfaces(client, { containerId: a.containerId, ifName: 'eth0' }), []);
      assert.equal((await client.vsctl(['list-ports', BRIDGE])).split('\n').includes(portA.name), false);
      assert.deepEqual(await podFlowLines(portA.ofport), []);
      assert.equal(await linkExists(node, portA.name), false);
      assert.equal(await linkExists(a.ns, 'eth0'), false);
      assert.deepEqual(await reservations(), ['10.244.1.3']);
      ok(await plugin(a, 'DEL', conf()));
      ok(await plugin(a, 'DEL', conf(), { netns: null }));
      // The other pod is untouched.
      await ping(b.ns, '10.244.1.1');
    });

    it('DEL with the pod netns gone still removes the port, its flows and the IP', async () => {
      const [portB] = await findPodInterfaces(client, { containerId: b.containerId, ifName: 'eth0' });
      assert.ok(portB, 'no OVS port of pod B');
      await delNetns(b.ns);
      ok(await plugin(b, 'DEL', conf()));
      assert.deepEqual(await findPodInterfaces(client, { containerId: b.containerId, ifName: 'eth0' }), []);
      assert.deepEqual(await podFlowLines(portB.ofport), []);
      assert.equal(await linkExists(node, portB.name), false);
      assert.deepEqual(await reservations(), []);
      ok(await plugin(b, 'DEL', conf()));
    });
  });

  // Nested suites run in order, after the pods above (mocha runs a suite's own tests first).
  describe('STATUS', () => {
    it('succeeds when the bridge exists; code 50 while it does not (weftd not ready)', async () => {
      const p: Pod = { ns: '', containerId: 'unused', name: 'status' };
      const o = { netns: null };
      ok(await plugin(p, 'STATUS', conf({ cniVersion: '1.1.0' }), o));
      const e = fails(await plugin(p, 'STATUS', conf({ cniVersion: '1.1.0', bridge: 'br-nope' }), o));
      assert.deepEqual(e, {
        code: 50,
        msg: `weft-ovs: Open vSwitch is not ready: bridge br-nope does not exist in ${ovs!.dbSocket} (has weftd started with the ovs backend?)`,
      });
      const down = fails(await plugin(p, 'STATUS', conf({ cniVersion: '1.1.0', ovsRunDir: join(tmp, 'no-ovs') }), o));
      assert.equal(down.code, 50);
      assert.match(down.msg, /^weft-ovs: Open vSwitch is not ready: ovs-vsctl via .*\/no-ovs\/db\.sock: Open vSwitch is not reachable/);
    });
  });

  describe('failures roll back', () => {
    it('a failure mid-ADD (bridge does not exist → attach fails) leaves no veth, no IP, no port', async () => {
      const p = await pod('f');
      const e = fails(await plugin(p, 'ADD', conf({ bridge: 'br-nope' })));
      const host = hostVethName(p.containerId, 'eth0');
      assert.equal(e.code, 999);
      assert.match(e.msg, new RegExp(`^failed to attach ${host} to Open vSwitch bridge br-nope: ovs-vsctl via .*db\\.sock: .*br-nope`));
      assert.equal(e.details, undefined, 'the rollback itself failed');
      assert.equal(await linkExists(node, host), false);
      assert.equal(await linkExists(p.ns, 'eth0'), false);
      assert.deepEqual(await reservations(), []);
      assert.deepEqual(await findPodInterfaces(client, { containerId: p.containerId, ifName: 'eth0' }), []);
    });

    it('an IPv6-only IPAM config is refused and rolled back', async () => {
      const p = await pod('v6');
      const c = conf({ ipam: { type: 'host-local', dataDir: ipamDir, ranges: [[{ subnet: 'fd00:244::/64' }]] } });
      const e = fails(await plugin(p, 'ADD', c));
      assert.deepEqual(e, {
        code: 7,
        msg: 'weft-ovs supports IPv4 only (the ovs backend is IPv4-only), but IPAM returned fd00:244::2/64; configure only IPv4 ranges',
      });
      assert.equal(await linkExists(node, hostVethName(p.containerId, 'eth0')), false);
      assert.equal(await linkExists(p.ns, 'eth0'), false);
      assert.deepEqual(await readdir(join(ipamDir, NETWORK)).then((f) => f.filter((n) => n.includes(':'))), []);
    });
  });

  describe('through the flannel bundle', () => {
    it('flannel with an ovs subnet.env delegates to weft-ovs: the pod joins br-int and reaches the gateway', async () => {
      const dir = join(tmp, 'flannel');
      await mkdir(dir, { recursive: true });
      const subnetFile = join(dir, 'subnet.env');
      await writeFile(
        subnetFile,
        'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n' +
          `WEFT_BACKEND=ovs\nWEFT_OVS_BRIDGE=${BRIDGE}\nWEFT_OVS_RUNDIR=${ovs!.runDir}\nWEFT_OVS_DATAPATH=netdev\n`,
      );
      const stateDir = join(dir, 'state');
      const flannelConf = {
        cniVersion: '1.0.0',
        name: NETWORK,
        type: 'flannel',
        subnetFile,
        dataDir: stateDir,
        delegate: { hairpinMode: true, isDefaultGateway: true },
        ipam: { dataDir: ipamDir },
      };
      const p = await pod('fl');
      const flannel = join(binDir, 'flannel');
      const result = ok(await plugin(p, 'ADD', flannelConf, { bin: flannel }));
      const host = hostVethName(p.containerId, 'eth0');
      const [port] = await listPodInterfaces(client, BRIDGE).then((ps) => ps.filter((x) => x.containerId === p.containerId));
      assert.ok(port, 'no port for the flannel pod');
      const ip = port.ip.toString();
      assert.equal(port.name, host);
      assert.equal(port.mac, macFromIP(port.ip));
      assert.deepEqual(result, {
        cniVersion: '1.0.0',
        interfaces: [
          { name: host, mac: await linkMac(node, host) },
          { name: 'eth0', mac: port.mac, sandbox: `/run/netns/${p.ns}` },
        ],
        ips: [{ interface: 1, address: `${ip}/24`, gateway: '10.244.1.1' }],
        routes: [{ dst: '10.244.0.0/16' }, { dst: '0.0.0.0/0', gw: '10.244.1.1' }],
      });
      assert.equal((await podFlowLines(port.ofport)).length, 5);
      await ping(p.ns, '10.244.1.1');
      const stored = JSON.parse(await sh('cat', [join(stateDir, p.containerId)])) as Json;
      assert.equal(stored.type, 'weft-ovs');
      assert.equal(stored.ovsRunDir, ovs!.runDir);
      ok(await plugin(p, 'DEL', flannelConf, { bin: flannel }));
      assert.deepEqual(await findPodInterfaces(client, { containerId: p.containerId, ifName: 'eth0' }), []);
      assert.equal(await linkExists(node, host), false);
      assert.equal((await reservations()).includes(ip), false);
    });
  });
});
