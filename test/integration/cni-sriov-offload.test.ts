// The sriov plugin's OVS hardware-offload mode end to end, on the ovs backend's test set-up
// (hosts as namespaces, a private netdev Open vSwitch per host with eth0 on br-phy, real etcd,
// weftd with the ovs backend). On host 1 a veth pair stands in for the VF and its representor:
// `ens1f0v0` is the VF netdev, its peer `pf0vf0` the representor, named by a fake switchdev sysfs
// tree. The veth pair carries the traffic the eswitch would carry between a real VF and its
// representor. Host 2 has a pod attached through the flannel bundle (weft-ovs). Host 3 only
// hosts an Open vSwitch that is stopped, for the "OVS not running" case.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { buildCniBundles } from '../../cni-plugins/build.js';
import { defaultVfConfig } from '../../cni-plugins/sriov/vfcontrol.js';
import { Category, cookieOf, OBJECT_MASK } from '../../src/backend/ovs/pipeline.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { IPNet } from '../../src/util/ip.js';
import { Cluster, type Host } from '../helpers/cluster.js';
import { cniBinDir, runCni, type CniRun } from '../helpers/cni.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';
import { ipn, lines, nsExec } from '../helpers/netns.js';
import { OvsInstance } from '../helpers/ovs.js';
import { startHostOvs, startOvsWeftd } from '../helpers/ovs-cluster.js';
import { attachOvsPod, type OvsPod } from '../helpers/ovs-pod.js';
import { waitFor } from '../helpers/wait.js';
import { readPfState, writePfState } from '../fixtures/sriov/file-pf.js';

const ROOT = join(import.meta.dirname, '../..');
const CONFIG = {
  Network: '10.244.0.0/16',
  SubnetLen: 24,
  Backend: { Type: 'ovs', DatapathType: 'netdev', VNI: 1 },
};
const VF_PCI = '0000:3b:02.0';
const VF = 'ens1f0v0';
const REP = 'pf0vf0';
const VF_MAC = '02:5e:00:00:00:10';
const VF_MTU = 1400;
const CID = 'ctr-sriov';
const POD_NAME = 'sriov-pod-0';
/** Antrea's rule: 8 characters of the pod name, '-', 6 hex characters of sha1(container ID). */
const HOST_IFACE = `${POD_NAME.slice(0, 8)}-${createHash('sha1').update(CID).digest('hex').slice(0, 6)}`;

type Json = Record<string, unknown>;

interface LinkJson {
  ifname: string;
  address: string;
  mtu: number;
  flags: string[];
}

describe('sriov plugin, OVS hardware-offload mode (integration: ovs backend in namespaces, veth VF/representor)', function () {
  this.timeout(90_000);
  let cluster: Cluster;
  const instances: OvsInstance[] = [];
  let ovs1: OvsInstance;
  let ovs2: OvsInstance;
  let stopped: OvsInstance;
  let h1: Host;
  let bin = '';
  let fixtureBin = '';
  let binTmp = '';
  let dir = '';
  let lease: IPNet;
  let remote: OvsPod;

  const sysfs = () => join(dir, 'sys');
  const dataDir = () => join(dir, 'state');
  const ipamDir = () => join(dir, 'ipam');
  const pfFile = () => join(dir, 'pf.json');
  const sriovIP = () => lease.nth(100n).toString();

  before(async function () {
    const built = Promise.all([
      cniBinDir(),
      (async () => {
        binTmp = mkdtempSync(join(tmpdir(), 'wt-sriov-offload-'));
        const d = binTmp;
        await buildCniBundles(d, [{ name: 'sriov', entry: join(ROOT, 'test/fixtures/sriov/weft-test-sriov-offload/main.ts') }]);
        return join(d, 'sriov');
      })(),
    ]);
    cluster = await Cluster.create({ hosts: 3, tag: 'svo', config: CONFIG });
    dir = join(cluster.dir, 'sriov');
    h1 = cluster.hosts[0]!;
    const [h1Ovs, h2Ovs] = [await startHostOvs(cluster, cluster.hosts[0]!), await startHostOvs(cluster, cluster.hosts[1]!)];
    const started = [h1Ovs, h2Ovs, await OvsInstance.start(cluster.hosts[2]!.ns, join(cluster.dir, 'ovs3'))];
    instances.push(...started);
    [ovs1, ovs2, stopped] = started as [OvsInstance, OvsInstance, OvsInstance];
    // The stopped OVS keeps its run dir (pidfiles, no daemons), as after `systemctl stop`.
    await stopped.vsctl('add-br', 'br-int', '--', 'set', 'bridge', 'br-int', 'datapath_type=netdev');
    await stopped.stop();
    await Promise.all([ovs1, ovs2].map((ovs, i) => startOvsWeftd({ host: cluster.hosts[i]!, ovs })));
    [bin, fixtureBin] = await built;
    remote = await attachOvsPod(cluster.hosts[1]!, ovs2, 'pod-b');
    lease = IPNet.parse(h1.subnetEnv().FLANNEL_SUBNET!);

    // The VF and its representor: a veth pair in host 1, the VF with a MAC and MTU of its own.
    await ipn(h1.ns, 'link', 'add', VF, 'type', 'veth', 'peer', 'name', REP);
    await ipn(h1.ns, 'link', 'set', VF, 'address', VF_MAC, 'mtu', String(VF_MTU));
    // Representors are up while their VF is not attached anywhere (switchdev set-up scripts do it).
    await ipn(h1.ns, 'link', 'set', REP, 'up');
    mkdirSync(dir, { recursive: true });
    buildFakeSysfs(sysfs(), [
      {
        pci: '0000:3b:00.0',
        netdev: 'ens1f0',
        switchdev: { switchId: '6c2a0003e4b8', port: 0 },
        vfs: [{ pci: VF_PCI, netdev: VF, driver: 'mlx5_core', representor: REP }],
      },
    ]);
    writePfState(pfFile(), { vfs: { 'ens1f0/0': defaultVfConfig(0) }, calls: [], refuse: null });
  });

  after(async function () {
    await Promise.allSettled(cluster?.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve()) ?? []);
    await Promise.allSettled(instances.map((o) => o.stop()));
    await cluster?.destroy();
    if (binTmp) await rm(binTmp, { recursive: true, force: true });
  });

  function conf(ovs: Json = {}): Json {
    return {
      cniVersion: '1.0.0',
      name: 'sriov-offload',
      type: 'sriov',
      deviceID: VF_PCI,
      sysfsRoot: sysfs(),
      dataDir: dataDir(),
      ovs: { bridge: 'br-int', ovsRunDir: ovs1.runDir, datapathType: 'netdev', ...ovs },
      ipam: {
        type: 'host-local',
        dataDir: ipamDir(),
        ranges: [[{ subnet: lease.toString(), rangeStart: sriovIP(), gateway: lease.nth(1n).toString() }]],
        routes: [{ dst: '0.0.0.0/0' }],
      },
    };
  }

  function run(command: string, stdin: Json): Promise<CniRun> {
    return runCni(
      {
        bin: fixtureBin,
        path: bin,
        command,
        containerId: CID,
        netns: `/run/netns/${h1.podNs}`,
        ifname: 'eth0',
        args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=${POD_NAME}`,
        hostNs: h1.ns,
        env: { WEFT_TEST_SRIOV_PF: pfFile() },
      },
      JSON.stringify(stdin),
    );
  }

  function ok(r: CniRun): Json {
    assert.equal(r.exitCode, 0, `plugin failed: ${r.stdout}${r.stderr}`);
    return (r.json ?? {}) as Json;
  }

  async function link(ns: string, name: string): Promise<LinkJson | undefined> {
    return (JSON.parse(await ipn(ns, '-j', 'link', 'show')) as LinkJson[]).find((l) => l.ifname === name);
  }

  async function txChecksum(ns: string, ifname: string): Promise<string> {
    return /^tx-checksumming: (\S+)/m.exec(await nsExec(ns, 'ethtool', '-k', ifname))?.[1] ?? '';
  }

  const client = () => new OvsClient({ runDir: ovs1.runDir });
  const podFlows = (ofport: number) => client().dumpFlows('br-int', `cookie=0x${cookieOf(0, Category.Pod, ofport).toString(16)}/0x${OBJECT_MASK.toString(16)}`);
  const brIntPorts = async () => lines(await ovs1.vsctl('list-ports', 'br-int')).sort();

  function files(d: string): string[] {
    if (!existsSync(d)) return [];
    return readdirSync(d, { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => join(e.parentPath, e.name).slice(d.length + 1))
      .sort();
  }

  const reservedIps = () => files(join(ipamDir(), 'sriov-offload')).filter((f) => f !== 'lock' && !f.startsWith('last_reserved_ip'));

  /** The VF is back in host 1 as it was, the representor too (up, ARP on), nothing left behind. */
  async function assertReleased(): Promise<void> {
    const vf = await link(h1.ns, VF);
    assert.ok(vf, `${VF} is back in the host`);
    assert.deepEqual([vf.address, vf.mtu], [VF_MAC, VF_MTU]);
    assert.equal(await txChecksum(h1.ns, VF), 'on');
    const rep = await link(h1.ns, REP);
    assert.ok(rep, `${REP} has its name back`);
    assert.deepEqual([rep.flags.includes('UP'), rep.flags.includes('NOARP')], [true, false]);
    assert.equal(await link(h1.ns, HOST_IFACE), undefined);
    assert.deepEqual((JSON.parse(await ipn(h1.podNs, '-j', 'link', 'show')) as LinkJson[]).map((l) => l.ifname), ['lo']);
    assert.deepEqual(await brIntPorts(), ['weft-gw0', 'weft-tun0']);
    assert.equal((await ovs1.vsctl('--columns=name', 'find', 'interface', `name=${HOST_IFACE}`, '--', '--columns=name', 'find', 'interface', `external_ids:weft-container-id=${CID}`)).trim(), '');
    assert.deepEqual(files(dataDir()), [`pci/vf_lock/${VF_PCI}.lock`]);
    assert.deepEqual(reservedIps(), []);
  }

  it('ADD: the renamed representor is on br-int with the pod external_ids and flows; the remote pod reaches the VF through the tunnel; DEL returns everything', async () => {
    const result = ok(await run('ADD', conf()));
    const rep = await link(h1.ns, HOST_IFACE);
    assert.ok(rep, `the representor is ${HOST_IFACE}`);
    assert.deepEqual(result, {
      cniVersion: '1.0.0',
      interfaces: [
        { name: HOST_IFACE, mac: rep.address },
        { name: 'eth0', mac: VF_MAC, mtu: VF_MTU, sandbox: `/run/netns/${h1.podNs}` },
      ],
      ips: [{ interface: 1, address: `${sriovIP()}/24`, gateway: lease.nth(1n).toString() }],
      routes: [{ dst: '0.0.0.0/0' }],
    });
    assert.equal(await link(h1.ns, REP), undefined);
    assert.deepEqual([rep.flags.includes('UP'), rep.flags.includes('NOARP')], [true, true]);
    assert.equal(await txChecksum(h1.podNs, 'eth0'), 'off');

    assert.equal((await ovs1.vsctl('port-to-br', HOST_IFACE)).trim(), 'br-int');
    const row = JSON.parse(await ovs1.vsctl('--format=json', '--columns=external_ids,ofport', 'list', 'interface', HOST_IFACE)) as {
      data: [[['map', Array<[string, string]>], number]];
    };
    const [[ids, ofport]] = row.data;
    assert.deepEqual(Object.fromEntries(ids[1]), {
      'attached-mac': VF_MAC,
      'weft-container-id': CID,
      'weft-ifname': 'eth0',
      'weft-ip': sriovIP(),
      'weft-pod-name': POD_NAME,
      'weft-pod-namespace': 'default',
    });
    const flows = await podFlows(ofport);
    assert.equal(flows.length, 5, flows.join('\n'));
    assert.ok(flows.some((f) => f.includes(`in_port=${ofport}`) && f.includes(`dl_src=${VF_MAC}`) && f.includes(`nw_src=${sriovIP()}`)), flows.join('\n'));
    ok(await run('CHECK', { ...conf(), prevResult: result }));

    const ping = (from: string, ip: string) => nsExec(from, 'ping', '-c', '1', '-W', '1', ip).then(() => true, () => false);
    await waitFor(() => ping(remote.ns, sriovIP()), { timeoutMs: 20_000, what: `the SR-IOV pod ${sriovIP()} to answer pod-b` });
    await waitFor(() => ping(h1.podNs, remote.ip), { timeoutMs: 10_000, what: `pod-b ${remote.ip} to answer the SR-IOV pod` });
    // The traffic crossed the representor's port (the datapath flows name it as input).
    const ports = await ovs1.appctl('dpif/show');
    const dpPort = new RegExp(`${HOST_IFACE} (\\d+)/(\\d+)`).exec(ports)?.[2];
    assert.ok(dpPort, ports);
    assert.match(await ovs1.appctl('dpctl/dump-flows'), new RegExp(`in_port\\(${dpPort}\\)`));

    ok(await run('DEL', { ...conf(), prevResult: result }));
    assert.deepEqual(await podFlows(ofport), []);
    await assertReleased();
    // The PF got its settings (VLAN 0 as sriov-cni always sets) and was reset.
    assert.deepEqual(
      readPfState(pfFile()).calls.filter((c) => c.op === 'apply').map((c) => JSON.stringify(c.changes)),
      [JSON.stringify([{ kind: 'vlan', vlan: 0, qos: 0, proto: '802.1q' }]), JSON.stringify([{ kind: 'vlan', vlan: 0, qos: 0, proto: '802.1q' }])],
    );
    // DEL again: nothing left, still success.
    ok(await run('DEL', { ...conf(), prevResult: result }));
  });

  it('DEL without the state file still finds the port by its external_ids and renames the representor back from sysfs', async () => {
    const result = ok(await run('ADD', conf()));
    await rm(join(dataDir(), `${CID}-eth0`));
    ok(await run('DEL', { ...conf(), prevResult: result }));
    // Its TX checksum setting is not known without the state: put it back for the next cases.
    await nsExec(h1.ns, 'ethtool', '-K', VF, 'tx', 'on');
    await assertReleased();
  });

  it('a bridge that does not exist, a stopped OVS, or a failure after the rename: error JSON and everything back', async () => {
    const cases: Array<[string, Json, Json]> = [
      [
        'no bridge',
        conf({ bridge: 'br-nope' }),
        { code: 999, msg: `failed to attach VF representor ${REP} to Open vSwitch bridge br-nope: bridge br-nope does not exist in ${ovs1.runDir}/db.sock (has weftd started with the ovs backend?)` },
      ],
      [
        'OVS stopped',
        conf({ ovsRunDir: stopped.runDir }),
        {
          code: 999,
          msg:
            `failed to attach VF representor ${REP} to Open vSwitch bridge br-int: ovs-vsctl via ${stopped.runDir}/db.sock: Open vSwitch is not reachable ` +
            `(is ovsdb-server running with its socket at ${stopped.runDir}/db.sock?): ovs-vsctl: unix:${stopped.runDir}/db.sock: database connection failed (No such file or directory)`,
        },
      ],
    ];
    for (const [what, c, want] of cases) {
      const r = await run('ADD', c);
      assert.equal(r.exitCode, 1, `${what}: ${r.stdout}${r.stderr}`);
      assert.deepEqual(r.json, want, what);
      await assertReleased();
    }

    // A stale port of the host interface's name on another bridge: add-port fails after the
    // representor was renamed and the VF's TX checksum turned off; both are undone.
    await ovs1.vsctl('add-br', 'br-stale', '--', 'set', 'bridge', 'br-stale', 'datapath_type=netdev', '--', 'add-port', 'br-stale', HOST_IFACE);
    try {
      const r = await run('ADD', conf());
      assert.equal(r.exitCode, 1, `${r.stdout}${r.stderr}`);
      assert.deepEqual(r.json, {
        code: 999,
        msg:
          `failed to attach VF representor ${REP} to Open vSwitch bridge br-int: ovs-vsctl via ${ovs1.runDir}/db.sock: ` +
          `ovs-vsctl: "--may-exist add-port br-int ${HOST_IFACE}" but ${HOST_IFACE} is actually attached to bridge br-stale`,
      });
    } finally {
      await ovs1.vsctl('--if-exists', 'del-br', 'br-stale');
    }
    await assertReleased();
  });
});
