// The sriov plugin as a bundle against real kernel objects in namespaces made here. Per case a
// "host" netns (the plugin runs in it via `ip netns exec`) holds a veth pair standing in for
// the NIC: `wtpf0` is the PF, `wtvf0` the VF netdev; a fake sysfs tree (temp dir) names them.
// `weft-test-sriov` is the plugin with a recording PF kept in a JSON file (no SR-IOV hardware
// here); the real `sriov` bundle (iproute2 PF calls) runs where a veth PF can answer.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildCniBundles } from '../../cni-plugins/build.js';
import { defaultVfConfig, type RecordedCall } from '../../cni-plugins/sriov/vfcontrol.js';
import { decodeLinkVfInfo, type VfChange } from '../../src/netlink/vf.js';
import { runCni, type CniRun } from '../helpers/cni.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';
import { LOOKALIKES, plantForeign, snapshot } from '../helpers/foreign-files.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';
import { readPfState, writePfState, type FilePfState } from '../fixtures/sriov/file-pf.js';

const PREFIX = nsPrefix('sv');
const ROOT = join(import.meta.dirname, '../..');
const VF_PCI = '0000:3b:02.0';
const DPDK_PCI = '0000:3b:02.1';
const LOST_PCI = '0000:3b:02.7';
const VF_MAC = '0a:58:0a:00:00:10';
const CONF_MAC = '02:aa:bb:cc:dd:01';

let tmp = '';
let binDir = '';
let seq = 0;
const namespaces: string[] = [];

type Json = Record<string, unknown>;

interface Site {
  readonly host: string;
  readonly pod: string;
  readonly dir: string;
  readonly sysfs: string;
  readonly dataDir: string;
  readonly ipamDir: string;
  readonly pfFile: string;
}

async function netns(tag: string): Promise<string> {
  const name = `${PREFIX}-${tag}${seq++}`;
  namespaces.push(name);
  await addNetns(name);
  return name;
}

/** A host netns with the PF/VF veth pair, a pod netns, the fake sysfs and a fresh recording PF. */
async function site(tag: string, opts: { switchdev?: boolean } = {}): Promise<Site> {
  const host = await netns(`${tag}h`);
  const pod = await netns(`${tag}p`);
  const dir = join(tmp, host);
  mkdirSync(dir, { recursive: true });
  await ipn(host, 'link', 'add', 'wtpf0', 'type', 'veth', 'peer', 'name', 'wtvf0');
  await ipn(host, 'link', 'set', 'wtvf0', 'address', VF_MAC, 'mtu', '1400');
  await ipn(host, 'link', 'set', 'wtpf0', 'up');
  await ipn(host, 'address', 'add', '10.99.0.1/24', 'dev', 'wtpf0');
  await nsExec(host, 'sysctl', '-q', '-w', 'net.ipv4.conf.wtpf0.arp_accept=1');
  const s: Site = {
    host,
    pod,
    dir,
    sysfs: join(dir, 'sys'),
    dataDir: join(dir, 'state'),
    ipamDir: join(dir, 'ipam'),
    pfFile: join(dir, 'pf.json'),
  };
  buildFakeSysfs(s.sysfs, [
    {
      pci: '0000:3b:00.0',
      netdev: 'wtpf0',
      numVfs: 2,
      virtfnIndex: [0, 1, null],
      ...(opts.switchdev ? { switchdev: { switchId: '6c2a0003e4b8', port: 0 } } : {}),
      vfs: [
        { pci: VF_PCI, netdev: 'wtvf0', driver: 'iavf', ...(opts.switchdev ? { representor: 'wtrep0' } : {}) },
        { pci: DPDK_PCI, driver: 'vfio-pci' },
        { pci: LOST_PCI, netdev: 'wtvf7' },
      ],
    },
  ]);
  writePfState(s.pfFile, { vfs: { 'wtpf0/0': defaultVfConfig(0), 'wtpf0/1': { ...defaultVfConfig(1), mac: '02:00:00:00:01:01' } }, calls: [], refuse: null });
  return s;
}

function conf(s: Site, extra: Json = {}): Json {
  return {
    cniVersion: '1.0.0',
    name: 'sriov-net',
    type: 'sriov',
    deviceID: VF_PCI,
    sysfsRoot: s.sysfs,
    dataDir: s.dataDir,
    ipam: { type: 'host-local', dataDir: s.ipamDir, ranges: [[{ subnet: '10.99.0.0/24' }]] },
    ...extra,
  };
}

const FULL = { vlan: 100, vlanQoS: 3, mac: CONF_MAC, spoofchk: 'off', trust: 'on', link_state: 'enable', min_tx_rate: 10, max_tx_rate: 1000 };

interface RunOpts {
  readonly containerId?: string;
  /** CNI_NETNS; default the site's pod; null leaves it unset. */
  readonly netns?: string | null;
  readonly plugin?: string;
  /** WEFT_TEST_SRIOV_OFFLOAD: the recording offload step's log. */
  readonly offloadLog?: string;
}

function run(s: Site, command: string, stdin: Json, o: RunOpts = {}): Promise<CniRun> {
  const netnsPath = o.netns === null ? undefined : (o.netns ?? `/run/netns/${s.pod}`);
  const plugin = o.plugin ?? 'weft-test-sriov';
  // The fixture's recording PF and offload step; the real plugin reads neither (and without them
  // its calls can go through a CNI server in server mode: only CNI_* crosses the socket).
  const fixtureEnv = { WEFT_TEST_SRIOV_PF: s.pfFile, ...(o.offloadLog ? { WEFT_TEST_SRIOV_OFFLOAD: o.offloadLog } : {}) };
  return runCni(
    {
      bin: join(binDir, plugin),
      path: binDir,
      command,
      hostNs: s.host,
      containerId: o.containerId ?? 'ctr1',
      ifname: 'net1',
      ...(netnsPath !== undefined ? { netns: netnsPath } : {}),
      ...(plugin === 'weft-test-sriov' ? { env: fixtureEnv } : {}),
    },
    JSON.stringify(stdin),
  );
}

function ok(r: CniRun): Json {
  assert.equal(r.exitCode, 0, `plugin failed: ${r.stdout}${r.stderr}`);
  return (r.json ?? {}) as Json;
}

function err(r: CniRun): Json {
  assert.equal(r.exitCode, 1, `expected a failure, got: ${r.stdout}${r.stderr}`);
  return r.json as Json;
}

interface LinkJson {
  ifname: string;
  address: string;
  mtu: number;
  flags: string[];
  addr_info?: Array<{ family: string; local: string; prefixlen: number }>;
}

async function links(ns: string): Promise<LinkJson[]> {
  return JSON.parse(await ipn(ns, '-j', 'address', 'show')) as LinkJson[];
}

async function link(ns: string, name: string): Promise<LinkJson | undefined> {
  return (await links(ns)).find((l) => l.ifname === name);
}

function calls(s: Site): RecordedCall[] {
  return readPfState(s.pfFile).calls;
}

function pf(s: Site): FilePfState {
  return readPfState(s.pfFile);
}

/** Calls in a compact form: "read 0" / "apply 0 vlan=100/3/802.1q,mac=…" (+ "!" for keepGoing resets). */
function describe_(c: RecordedCall): string {
  if (c.op === 'read') return `read ${c.vf}`;
  const one = (x: VfChange): string => {
    switch (x.kind) {
      case 'vlan':
        return `vlan=${x.vlan}/${x.qos}/${x.proto}`;
      case 'mac':
        return `mac=${x.mac}`;
      case 'rate':
        return `rate=${x.minTxRate}/${x.maxTxRate}`;
      case 'spoofchk':
        return `spoofchk=${x.on ? 'on' : 'off'}`;
      case 'trust':
        return `trust=${x.on ? 'on' : 'off'}`;
      case 'linkState':
        return `state=${x.state}`;
    }
  };
  return `apply ${c.vf} ${(c.changes ?? []).map(one).join(',')}`;
}

function files(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) => join(d.parentPath, d.name).slice(dir.length + 1))
    .sort();
}

/** host-local's reservations (everything but its lock and last-reserved files). */
function reservedIps(s: Site): string[] {
  return files(join(s.ipamDir, 'sriov-net')).filter((f) => f !== 'lock' && !f.startsWith('last_reserved_ip'));
}

async function sysctl(ns: string, key: string): Promise<string> {
  return (await nsExec(ns, 'sysctl', '-n', key)).trim();
}

describe('sriov plugin (bundles, fake sysfs, veth stand-ins)', function () {
  this.timeout(60_000);

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'wt-sriov-'));
    binDir = join(tmp, 'bin');
    await buildCniBundles(binDir, [
      { name: 'sriov', entry: join(ROOT, 'cni-plugins/cmd/sriov.ts') },
      { name: 'host-local', entry: join(ROOT, 'cni-plugins/cmd/host-local.ts') },
      { name: 'weft-test-sriov', entry: join(ROOT, 'test/fixtures/sriov/weft-test-sriov/main.ts') },
    ]);
  });

  after(async () => {
    for (const ns of namespaces) await delNetns(ns);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('ADD moves the VF into the pod with the IPAM address, its PF settings and MAC; CHECK; DEL returns it as it was', async () => {
    const s = await site('a');
    const c = conf(s, FULL);
    const result = ok(await run(s, 'ADD', c));
    assert.deepEqual(result, {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'net1', mac: CONF_MAC, mtu: 1400, sandbox: `/run/netns/${s.pod}` }],
      ips: [{ interface: 0, address: '10.99.0.2/24', gateway: '10.99.0.1' }],
    });

    // The VF left the host and is the pod's net1, up, with the MAC and address.
    assert.equal(await link(s.host, 'wtvf0'), undefined);
    const net1 = await link(s.pod, 'net1');
    assert.ok(net1, 'net1 in the pod');
    assert.deepEqual([net1.address, net1.mtu, net1.flags.includes('UP')], [CONF_MAC, 1400, true]);
    assert.deepEqual(
      (net1.addr_info ?? []).filter((a) => a.family === 'inet').map((a) => `${a.local}/${a.prefixlen}`),
      ['10.99.0.2/24'],
    );
    assert.deepEqual([await sysctl(s.pod, 'net.ipv4.conf.net1.arp_notify'), await sysctl(s.pod, 'net.ipv6.conf.net1.ndisc_notify')], ['1', '1']);

    // The PF got the settings, in sriov-cni's order, and the admin MAC was read back.
    assert.deepEqual(calls(s).map(describe_), [
      'read 0',
      `apply 0 vlan=100/3/802.1q,mac=${CONF_MAC},rate=10/1000,spoofchk=off,trust=on,state=enable`,
      'read 0',
    ]);
    assert.deepEqual(pf(s).vfs['wtpf0/0'], { vf: 0, mac: CONF_MAC, vlan: 100, qos: 3, vlanProto: '802.1q', spoofchk: false, trust: true, linkState: 'enable', minTxRate: 10, maxTxRate: 1000 });

    // State at sriov-cni's paths.
    assert.deepEqual(files(s.dataDir), ['ctr1-net1', `pci/${VF_PCI}`, `pci/vf_lock/${VF_PCI}.lock`]);
    assert.equal(readFileSync(join(s.dataDir, 'pci', VF_PCI), 'utf8'), `/run/netns/${s.pod}`);
    const state = JSON.parse(readFileSync(join(s.dataDir, 'ctr1-net1'), 'utf8')) as Json;
    assert.deepEqual(state.OrigVfState, {
      HostIFName: 'wtvf0',
      SpoofChk: true,
      Trust: false,
      AdminMAC: '00:00:00:00:00:00',
      EffectiveMAC: VF_MAC,
      Vlan: 0,
      VlanQoS: 0,
      MinTxRate: 0,
      MaxTxRate: 0,
      LinkState: 0,
      MTU: 1400,
    });
    assert.deepEqual([state.Master, state.VFID, state.DPDKMode, state.MAC, state.ContIFNames], ['wtpf0', 0, false, CONF_MAC, 'net1']);

    // The pod announced itself (gratuitous ARP), and the "PF" side reaches it through the VF.
    await waitFor(async () => (await ipn(s.host, 'neigh', 'show', '10.99.0.2', 'dev', 'wtpf0')).includes(CONF_MAC), { what: 'a neighbour entry from the GARP', timeoutMs: 5000 });
    await nsExec(s.host, 'ping', '-c', '1', '-W', '2', '10.99.0.2');

    ok(await run(s, 'CHECK', { ...c, prevResult: result }));

    // The workload changed the MTU; DEL restores name, MAC and MTU and resets the PF.
    await ipn(s.pod, 'link', 'set', 'net1', 'mtu', '1300');
    ok(await run(s, 'DEL', { ...c, prevResult: result }));
    assert.deepEqual((await links(s.pod)).map((l) => l.ifname), ['lo']);
    const back = await link(s.host, 'wtvf0');
    assert.ok(back, 'wtvf0 back in the host');
    assert.deepEqual([back.address, back.mtu], [VF_MAC, 1400]);
    // CHECK read the PF once; DEL reset what ADD set, to what the PF had before.
    assert.deepEqual(calls(s).map(describe_).slice(3), ['read 0', 'apply 0 vlan=0/0/802.1q,spoofchk=on,mac=00:00:00:00:00:00,trust=off,rate=0/0,state=auto']);
    assert.deepEqual(pf(s).vfs['wtpf0/0'], defaultVfConfig(0));
    assert.deepEqual(files(s.dataDir), [`pci/vf_lock/${VF_PCI}.lock`]);
    assert.deepEqual(reservedIps(s), []);

    // DEL again: nothing ties the VF to this attachment any more, so nothing is touched.
    ok(await run(s, 'DEL', { ...c, prevResult: result }));
    assert.equal(calls(s).length, 5);
    assert.ok(await link(s.host, 'wtvf0'), 'no wtvf0 in the host namespace');
  });

  it("refuses a second ADD of a VF a live pod holds, with sriov-cni's error, and that pod's DEL leaves it alone", async () => {
    const s = await site('b');
    const c = conf(s);
    const first = ok(await run(s, 'ADD', c));
    const pod2 = await netns('b2p');
    const second = await run(s, 'ADD', c, { containerId: 'ctr2', netns: `/run/netns/${pod2}` });
    assert.deepEqual(err(second), { code: 999, msg: `SRIOV-CNI failed to load netconf: pci address ${VF_PCI} is already allocated` });
    const before = calls(s).length;
    ok(await run(s, 'DEL', c, { containerId: 'ctr2', netns: `/run/netns/${pod2}` }));
    assert.equal(calls(s).length, before, 'no PF call for a VF another pod holds');
    assert.ok(await link(s.pod, 'net1'), 'the first pod keeps its VF');
    assert.deepEqual(reservedIps(s), ['10.99.0.2']);
    ok(await run(s, 'DEL', { ...c, prevResult: first }));
    assert.ok(await link(s.host, 'wtvf0'), 'no wtvf0 in the host namespace');
  });

  it('DPDK mode (vfio-pci, no netdev): PF settings and IPAM only, nothing moves', async () => {
    const s = await site('d');
    const c = conf(s, { deviceID: DPDK_PCI, vlan: 7 });
    const result = ok(await run(s, 'ADD', c));
    assert.deepEqual(result, {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'net1', mac: '02:00:00:00:01:01', mtu: 1500, sandbox: `/run/netns/${s.pod}` }],
      ips: [{ interface: 0, address: '10.99.0.2/24', gateway: '10.99.0.1' }],
    });
    assert.deepEqual((await links(s.pod)).map((l) => l.ifname), ['lo']);
    assert.ok(await link(s.host, 'wtvf0'), 'the other VF is untouched');
    assert.deepEqual(calls(s).map(describe_), ['read 1', 'apply 1 vlan=7/0/802.1q']);
    assert.equal((JSON.parse(readFileSync(join(s.dataDir, 'ctr1-net1'), 'utf8')) as Json).DPDKMode, true);
    ok(await run(s, 'DEL', { ...c, prevResult: result }));
    assert.deepEqual(calls(s).map(describe_).slice(2), ['apply 1 vlan=0/0/802.1q']);
    assert.deepEqual(files(s.dataDir), [`pci/vf_lock/${DPDK_PCI}.lock`]);
    assert.deepEqual(reservedIps(s), []);
  });

  describe('failures leave the VF in the host as it was and no state', () => {
    let s: Site;

    before(async () => {
      s = await site('f');
    });

    async function assertUntouched(): Promise<void> {
      const vf = await link(s.host, 'wtvf0');
      assert.ok(vf, 'wtvf0 in the host');
      assert.deepEqual([vf.address, vf.mtu], [VF_MAC, 1400]);
      assert.deepEqual((await links(s.pod)).map((l) => l.ifname), ['lo']);
      assert.deepEqual(pf(s).vfs['wtpf0/0'], defaultVfConfig(0));
      assert.deepEqual(
        files(s.dataDir).filter((f) => !f.startsWith('pci/vf_lock/')),
        [],
      );
      assert.deepEqual(reservedIps(s), []);
    }

    it('bad deviceID, unknown device, VF index not found, VLAN out of range: spec errors before any PF call', async () => {
      const cases: Array<[Json, Json]> = [
        [{ deviceID: '3b:02.0' }, { code: 7, msg: 'SRIOV-CNI failed to load netconf: LoadConf(): invalid PCI address "3b:02.0": expected domain:bus:device.function, e.g. 0000:af:06.0' }],
        [
          { deviceID: '0000:3b:09.0' },
          {
            code: 999,
            msg: `SRIOV-CNI failed to load netconf: LoadConf(): failed to get VF information: "lstat ${s.sysfs}/bus/pci/devices/0000:3b:09.0/physfn/net: no such file or directory"`,
          },
        ],
        [{ deviceID: LOST_PCI }, { code: 999, msg: `SRIOV-CNI failed to load netconf: LoadConf(): failed to get VF information: "unable to get VF ID with PF: wtpf0 and VF pci address ${LOST_PCI}"` }],
        [{ vlan: 4095 }, { code: 7, msg: 'SRIOV-CNI failed to load netconf: LoadConf(): vlan id 4095 invalid: value must be in the range 0-4094' }],
        [{ ovs: { bridge: 'br-int' } }, { code: 2, msg: 'offload mode not implemented yet ("ovs": {"bridge":"br-int"})' }],
      ];
      for (const [extra, want] of cases) assert.deepEqual(err(await run(s, 'ADD', conf(s, extra))), want, JSON.stringify(extra));
      assert.deepEqual(calls(s), []);
      await assertUntouched();
    });

    it('the pod netns deleted mid-ADD: error, VF returned and reset, IP released', async () => {
      const pod = await netns('fgone');
      writePfState(s.pfFile, { ...pf(s), calls: [], deleteNetnsOnApply: pod });
      const r = await run(s, 'ADD', conf(s, { mac: CONF_MAC, trust: 'on' }), { netns: `/run/netns/${pod}` });
      assert.deepEqual(err(r), { code: 999, msg: `failed to open netns "/run/netns/${pod}": the netns was deleted during ADD` });
      assert.equal(existsSync(`/run/netns/${pod}`), false);
      assert.deepEqual(calls(s).map(describe_), [
        'read 0',
        `apply 0 vlan=0/0/802.1q,mac=${CONF_MAC},trust=on`,
        'read 0',
        'apply 0 vlan=0/0/802.1q,mac=00:00:00:00:00:00,trust=off',
      ]);
      await assertUntouched();
    });

    it('the PF refuses a setting: error naming it, VF reset and never moved', async () => {
      writePfState(s.pfFile, { ...pf(s), calls: [], refuse: { kind: 'trust', reason: 'Operation not supported' } });
      const r = await run(s, 'ADD', conf(s, { trust: 'on', spoofchk: 'off' }));
      // The reset of trust is refused too and reported in details; everything else was restored.
      assert.deepEqual(err(r), {
        code: 999,
        msg: 'SRIOV-CNI failed to configure VF "failed to set vf 0 trust flag to on: Operation not supported"',
        details: 'cleanup after the failed ADD also failed: reset VF through the PF: error reseting VF: "failed to set vf 0 trust flag to off: Operation not supported"',
      });
      assert.deepEqual(calls(s).map(describe_), ['read 0', 'apply 0 vlan=0/0/802.1q,spoofchk=off,trust=on', 'apply 0 vlan=0/0/802.1q,spoofchk=on,trust=off']);
      writePfState(s.pfFile, { ...pf(s), refuse: null });
      await assertUntouched();
    });
  });

  it('DEL without the state file still releases the IP and returns and resets the VF found from deviceID', async () => {
    const s = await site('n');
    const c = conf(s, { mac: CONF_MAC, vlan: 12 });
    const result = ok(await run(s, 'ADD', c));
    rmSync(join(s.dataDir, 'ctr1-net1'));
    ok(await run(s, 'DEL', { ...c, prevResult: result }));
    assert.deepEqual((await links(s.pod)).map((l) => l.ifname), ['lo']);
    // Its own name is unknown without the state: it comes back named after its PF.
    const back = await link(s.host, 'wtpf0v0');
    assert.ok(back, 'the VF is back in the host as wtpf0v0');
    assert.deepEqual(calls(s).map(describe_).slice(3), ['apply 0 vlan=0/0/802.1q,mac=00:00:00:00:00:00']);
    assert.deepEqual(files(s.dataDir), [`pci/vf_lock/${VF_PCI}.lock`]);
    assert.deepEqual(reservedIps(s), []);
  });

  it('offload mode: the hook runs after the VF is in the pod with its IP, leads the result, and gets its state back on DEL', async () => {
    const s = await site('o', { switchdev: true });
    const log = join(s.dir, 'offload.jsonl');
    const records = (): Json[] => (existsSync(log) ? readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Json) : []);
    const c = conf(s, { ovs: { bridge: 'br-int' } });
    const result = ok(await run(s, 'ADD', c, { offloadLog: log }));
    assert.deepEqual(result, {
      cniVersion: '1.0.0',
      interfaces: [
        { name: 'wtrep0-h', mac: '02:00:00:00:0e:01' },
        { name: 'net1', mac: VF_MAC, mtu: 1400, sandbox: `/run/netns/${s.pod}` },
      ],
      ips: [{ interface: 1, address: '10.99.0.2/24', gateway: '10.99.0.1' }],
    });
    assert.deepEqual(records(), [
      {
        op: 'attach',
        bridge: 'br-int',
        ports: { uplink: 'wtpf0', vfIndex: 0, representor: 'wtrep0' },
        podInterface: { name: 'net1', mac: VF_MAC, mtu: 1400, sandbox: `/run/netns/${s.pod}` },
        ips: [{ interface: 0, address: '10.99.0.2/24', gateway: '10.99.0.1' }],
        containerId: 'ctr1',
      },
    ]);
    const state = JSON.parse(readFileSync(join(s.dataDir, 'ctr1-net1'), 'utf8')) as { weft: Json };
    assert.deepEqual(state.weft.offload, { port: 'wtrep0-h', representor: 'wtrep0' });
    ok(await run(s, 'DEL', { ...c, prevResult: result }, { offloadLog: log }));
    assert.deepEqual(records()[1], { op: 'detach', deviceID: VF_PCI, state: { port: 'wtrep0-h', representor: 'wtrep0' }, containerId: 'ctr1' });
    assert.ok(await link(s.host, 'wtvf0'), 'no wtvf0 in the host namespace');

    // A failure after attach undoes it (detach with what attach returned) along with the rest.
    const pod = await netns('ogone');
    writePfState(s.pfFile, { ...pf(s), deleteNetnsOnApply: pod });
    const failed = await run(s, 'ADD', c, { offloadLog: log, netns: `/run/netns/${pod}`, containerId: 'ctr3' });
    assert.equal(err(failed).code, 999);
    assert.deepEqual(
      records()
        .slice(2)
        .map((r) => `${String(r.op)} ${JSON.stringify(r.state ?? null)}`),
      ['attach null', 'detach {"port":"wtrep0-h","representor":"wtrep0"}'],
    );
    assert.ok(await link(s.host, 'wtvf0'), 'no wtvf0 in the host namespace');
    assert.deepEqual(files(s.dataDir), [`pci/vf_lock/${VF_PCI}.lock`]);
  });

  it('GC releases the dead attachment (VF reset, allocation, state, IP) and nothing else in dataDir', async () => {
    const s = await site('g');
    const live = ok(await run(s, 'ADD', conf(s), { containerId: 'ctr-live' }));
    const deadPod = await netns('gdp');
    ok(await run(s, 'ADD', conf(s, { deviceID: DPDK_PCI, vlan: 7 }), { containerId: 'ctr-dead', netns: `/run/netns/${deadPod}` }));
    await delNetns(deadPod); // the pod is gone without a DEL
    assert.deepEqual(reservedIps(s), ['10.99.0.2', '10.99.0.3']);
    const deadState = readFileSync(join(s.dataDir, 'ctr-dead-net1'), 'utf8');
    writeFileSync(join(s.dataDir, 'ctr-gone-net2.tmp-0badc0de'), ''); // an interrupted write
    const planted = plantForeign(s.dataDir, join(s.dir, 'outside'), { ...LOOKALIKES.sriov, staleText: deadState });
    const kept = [...planted.names, 'ctr-live-net1'];
    const before = snapshot(s.dataDir, kept, [planted.target, join(s.dataDir, 'pci', VF_PCI)]);
    const callsBefore = calls(s).length;

    const gc = await run(s, 'GC', { ...conf(s), cniVersion: '1.1.0', 'cni.dev/valid-attachments': [{ containerID: 'ctr-live', ifname: 'net1' }] }, { netns: null, containerId: '' });
    ok(gc);
    // The dead VF got its VLAN back; its allocation and state are gone, and host-local freed its IP.
    assert.deepEqual(calls(s).slice(callsBefore).map(describe_), ['apply 1 vlan=0/0/802.1q']);
    assert.deepEqual(
      files(s.dataDir).filter((f) => !f.startsWith('ctr-dir-net1/')),
      ['c0ffee-net1', 'ctr-live-net1', 'lock', 'passwd', 'pci/' + VF_PCI, `pci/vf_lock/${DPDK_PCI}.lock`, `pci/vf_lock/${VF_PCI}.lock`, '10.1.2.99'].sort(),
    );
    assert.deepEqual(snapshot(s.dataDir, kept, [planted.target, join(s.dataDir, 'pci', VF_PCI)]), before);
    assert.equal(readFileSync(planted.target, 'utf8'), deadState);
    assert.deepEqual(reservedIps(s), ['10.99.0.2']);
    assert.deepEqual(gc.stderr.split('\n').filter((l) => l !== ''), [
      `sriov GC: left alone 1 file(s) in ${s.dataDir} named like sriov state (<containerID>-<ifname>) but not holding it: "c0ffee-net1"`,
    ]);
    // The live pod keeps its VF and still deletes cleanly.
    assert.ok(await link(s.pod, 'net1'), 'no net1 in the pod namespace');
    ok(await run(s, 'DEL', { ...conf(s), prevResult: live }, { containerId: 'ctr-live' }));
    assert.ok(await link(s.host, 'wtvf0'), 'no wtvf0 in the host namespace');
  });

  it('the real bundle reads the PF through iproute2: a veth PF lists no VFs, so ADD fails before any change', async () => {
    const s = await site('r');
    const r = await run(s, 'ADD', conf(s, { vlan: 5 }), { plugin: 'sriov' });
    assert.deepEqual(err(r), { code: 999, msg: 'failed to get original vf information: failed to find vf 0' });
    assert.ok(await link(s.host, 'wtvf0'), 'no wtvf0 in the host namespace');
    assert.deepEqual(files(s.dataDir), [`pci/vf_lock/${VF_PCI}.lock`]);
    assert.deepEqual(reservedIps(s), []);
    await ipn(s.host, 'link', 'set', 'wtpf0', 'name', 'wtpfx');
    const gone = await run(s, 'ADD', conf(s, { vlan: 5 }), { plugin: 'sriov' });
    assert.deepEqual(err(gone), { code: 999, msg: 'failed to get original vf information: failed to lookup master "wtpf0": Device "wtpf0" does not exist.' });
    // DEL without state: nothing ties the VF to this attachment, so only IPAM is asked.
    ok(await run(s, 'DEL', conf(s, { vlan: 5 }), { plugin: 'sriov' }));
  });

  it('the kernel answers RTM_GETLINK for the PF with no VF list; the codec reads the real message', async () => {
    const s = await site('k');
    const hex = (await sh('ip', ['netns', 'exec', s.host, process.execPath, '--import', 'tsx', join(ROOT, 'test/fixtures/sriov/dump-link.ts'), 'wtpf0'])).trim();
    const info = decodeLinkVfInfo(Buffer.from(hex, 'hex'));
    const [want] = JSON.parse(await ipn(s.host, '-j', 'link', 'show', 'wtpf0')) as Array<{ ifindex: number }>;
    assert.deepEqual(info, { ifindex: want!.ifindex, ifname: 'wtpf0', numVf: null, vfs: [] });
  });
});
