// The sriov plugin's pure parts: sysfs discovery (plain, DPDK, switchdev representors) over a
// fake sysfs tree, the PF interface's iproute2 parser and recording implementation, the state
// file (weft's and sriov-cni's), and which PF changes ADD applies and DEL resets.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { appliedFrom, decodeState, encodeState, type SriovState } from '../../cni-plugins/sriov/state.js';
import { fallbackHostName } from '../../cni-plugins/sriov/link.js';
import { changesToApply, changesToNeutral, changesToReset, mismatch } from '../../cni-plugins/sriov/pf-settings.js';
import {
  discoverRepresentor,
  findUplink,
  findVfRepresentor,
  parseDevlinkPorts,
  RepresentorNotFoundError,
  Sysfs,
  vfIndexByPhysfn,
  type DevlinkPort,
} from '../../cni-plugins/sriov/sysfs.js';
import { defaultVfConfig, ipVfLine, parseIpVfInfo, RecordingPfVfControl, VfChangeError } from '../../cni-plugins/sriov/vfcontrol.js';
import { loadSriovConf } from '../../cni-plugins/sriov/config.js';
import { CniError } from '../../cni-plugins/skel/types.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';

const FIXTURES = join(import.meta.dirname, '../fixtures/sriov');

describe('sriov discovery (fake sysfs)', () => {
  let root = '';
  let sys: Sysfs;

  before(() => {
    root = mkdtempSync(join(tmpdir(), 'wt-sriov-sysfs-'));
    buildFakeSysfs(root, [
      {
        pci: '0000:3b:00.0',
        netdev: 'ens1f0',
        vfs: [
          { pci: '0000:3b:02.0', netdev: 'ens1f0v0', driver: 'iavf' },
          { pci: '0000:3b:02.1', driver: 'vfio-pci' },
          { pci: '0000:3b:02.2' },
        ],
      },
      // A PF that lists only two of its three VFs (VF index not found) and says it has 2.
      { pci: '0000:5e:00.0', netdev: 'ens2f0', numVfs: 2, virtfnIndex: [0, 1, null], vfs: [{ pci: '0000:5e:02.0' }, { pci: '0000:5e:02.1' }, { pci: '0000:5e:02.7', netdev: 'lost0' }] },
      {
        pci: '0000:d8:00.0',
        netdev: 'enp216s0f0np0',
        switchdev: { switchId: '6c2a0003e4b8', port: 0 },
        vfs: [
          { pci: '0000:d8:00.2', netdev: 'enp216s0f0v0', representor: 'eth5' },
          { pci: '0000:d8:00.3', netdev: 'enp216s0f0v1', representor: 'eth6' },
        ],
      },
    ]);
    sys = new Sysfs(root);
  });

  after(() => rmSync(root, { recursive: true, force: true }));

  it('finds the PF and the VF index, the netdev and the driver', () => {
    assert.deepEqual(sys.locate('0000:3b:02.0'), { pf: 'ens1f0', vfIndex: 0 });
    assert.deepEqual(sys.locate('0000:3b:02.2'), { pf: 'ens1f0', vfIndex: 2 });
    assert.equal(sys.vfNetdev('0000:3b:02.0'), 'ens1f0v0');
    assert.equal(sys.vfNetdev('0000:3b:02.1'), null);
    assert.deepEqual([sys.driver('0000:3b:02.0'), sys.isDpdkDriver('0000:3b:02.0')], ['iavf', false]);
    assert.deepEqual([sys.driver('0000:3b:02.1'), sys.isDpdkDriver('0000:3b:02.1')], ['vfio-pci', true]);
    assert.deepEqual([sys.driver('0000:3b:02.2'), sys.isDpdkDriver('0000:3b:02.2')], [null, false]);
    assert.equal(sys.numVfs('ens1f0'), 3);
  });

  it("reports an unknown device and a VF its PF does not list with sriov-cni's messages", () => {
    assert.throws(
      () => sys.locate('0000:99:00.1'),
      (e: unknown) =>
        e instanceof CniError &&
        e.code === 999 &&
        e.message ===
          `SRIOV-CNI failed to load netconf: LoadConf(): failed to get VF information: "lstat ${root}/bus/pci/devices/0000:99:00.1/physfn/net: no such file or directory"`,
    );
    assert.throws(
      () => sys.locate('0000:5e:02.7'),
      (e: unknown) =>
        e instanceof CniError &&
        e.message === 'SRIOV-CNI failed to load netconf: LoadConf(): failed to get VF information: "unable to get VF ID with PF: ens2f0 and VF pci address 0000:5e:02.7"',
    );
  });

  it('skips VF representors when picking the PF netdev of a switchdev NIC', () => {
    assert.deepEqual(sys.locate('0000:d8:00.3'), { pf: 'enp216s0f0np0', vfIndex: 1 });
  });

  it('finds the switchdev uplink, the VF index and its representor through sysfs', async () => {
    assert.equal(findUplink(sys, '0000:d8:00.3'), 'enp216s0f0np0');
    assert.equal(vfIndexByPhysfn(sys, '0000:d8:00.3'), 1);
    assert.deepEqual(await discoverRepresentor(sys, '0000:d8:00.3', null), { uplink: 'enp216s0f0np0', vfIndex: 1, representor: 'eth6' });
    assert.deepEqual(await discoverRepresentor(sys, '0000:d8:00.2', null), { uplink: 'enp216s0f0np0', vfIndex: 0, representor: 'eth5' });
  });

  it('asks devlink first and falls back to sysfs when it has no answer', async () => {
    const asked: string[] = [];
    const ports: DevlinkPort[] = [
      { netdev: 'enp216s0f0np0', flavour: 'physical', controller: null, pfnum: 0, vfnum: null },
      { netdev: 'pf0vf1rep', flavour: 'pcivf', controller: 0, pfnum: 0, vfnum: 1 },
      { netdev: 'ext-vf1', flavour: 'pcivf', controller: 1, pfnum: 0, vfnum: 1 },
    ];
    const devlink = async (pci: string) => {
      asked.push(pci);
      return ports;
    };
    assert.equal(await findVfRepresentor(sys, 'enp216s0f0np0', 1, devlink), 'pf0vf1rep');
    assert.equal(await findVfRepresentor(sys, 'enp216s0f0np0', 0, devlink), 'eth5'); // devlink has no VF 0
    assert.equal(await findVfRepresentor(sys, 'enp216s0f0np0', 1, async () => null), 'eth6');
    assert.deepEqual(asked, ['0000:d8:00.0', '0000:d8:00.0']);
  });

  it('refuses a non-switchdev uplink and a VF without representor', async () => {
    assert.throws(() => findUplink(sys, '0000:3b:02.0'), (e: unknown) => e instanceof RepresentorNotFoundError && /no switchdev netdev with phys_port_name p<N>/.test(e.message));
    await assert.rejects(findVfRepresentor(sys, 'enp216s0f0np0', 7, null), new RepresentorNotFoundError('failed to find the representor of VF 7 on uplink enp216s0f0np0', ''));
    await assert.rejects(findVfRepresentor(sys, 'ens1f0', 0, null), /uplink ens1f0 is not in switchdev mode/);
  });

  it('parses devlink port JSON for one device', () => {
    const doc = JSON.parse(readFileSync(join(FIXTURES, 'devlink-ports.json'), 'utf8')) as unknown;
    assert.deepEqual(parseDevlinkPorts(doc, '0000:d8:00.0'), [
      { netdev: 'enp216s0f0np0', flavour: 'physical', controller: null, pfnum: null, vfnum: null },
      { netdev: 'eth5', flavour: 'pcivf', controller: 0, pfnum: 0, vfnum: 0 },
      { netdev: 'eth6', flavour: 'pcivf', controller: 0, pfnum: 0, vfnum: 1 },
    ]);
    assert.deepEqual(parseDevlinkPorts({}, '0000:d8:00.0'), []);
  });
});

describe('sriov PF interface', () => {
  it("reads iproute2's vfinfo_list (new and old field names)", () => {
    const [link] = JSON.parse(readFileSync(join(FIXTURES, 'ip-link-pf.json'), 'utf8')) as Array<{ vfinfo_list: unknown[] }>;
    assert.deepEqual(link!.vfinfo_list.map(parseIpVfInfo), [
      { vf: 0, mac: '02:aa:bb:cc:dd:01', vlan: 100, qos: 3, vlanProto: '802.1ad', spoofchk: false, trust: true, linkState: 'enable', minTxRate: 10, maxTxRate: 1000 },
      { vf: 1, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: true, trust: false, linkState: 'auto', minTxRate: 0, maxTxRate: 0 },
      { vf: 2, mac: '0a:00:00:00:00:02', vlan: 7, qos: 0, vlanProto: '802.1q', spoofchk: null, trust: null, linkState: null, minTxRate: 0, maxTxRate: 500 },
    ]);
  });

  it('writes one `ip link set … vf` line per change', () => {
    assert.deepEqual(
      [
        ipVfLine('ens1f0', 3, { kind: 'vlan', vlan: 10, qos: 0, proto: '802.1q' }),
        ipVfLine('ens1f0', 3, { kind: 'vlan', vlan: 10, qos: 4, proto: '802.1ad' }),
        ipVfLine('ens1f0', 3, { kind: 'mac', mac: '02:00:00:00:00:09' }),
        ipVfLine('ens1f0', 3, { kind: 'rate', minTxRate: 0, maxTxRate: 100 }),
        ipVfLine('ens1f0', 3, { kind: 'spoofchk', on: false }),
        ipVfLine('ens1f0', 3, { kind: 'trust', on: true }),
        ipVfLine('ens1f0', 3, { kind: 'linkState', state: 'disable' }),
      ],
      [
        'link set dev ens1f0 vf 3 vlan 10 qos 0',
        'link set dev ens1f0 vf 3 vlan 10 qos 4 proto 802.1ad',
        'link set dev ens1f0 vf 3 mac 02:00:00:00:00:09',
        'link set dev ens1f0 vf 3 min_tx_rate 0 max_tx_rate 100',
        'link set dev ens1f0 vf 3 spoofchk off',
        'link set dev ens1f0 vf 3 trust on',
        'link set dev ens1f0 vf 3 state disable',
      ],
    );
  });

  it('records calls and behaves like a driver, refusing what it is told to', async () => {
    const pf = new RecordingPfVfControl({ vfs: { 'ens1f0/0': defaultVfConfig(0) }, refuse: { kind: 'trust', reason: 'Operation not supported' } });
    await pf.apply('ens1f0', 0, [{ kind: 'vlan', vlan: 5, qos: 1, proto: '802.1q' }]);
    await assert.rejects(
      pf.apply('ens1f0', 0, [
        { kind: 'trust', on: true },
        { kind: 'spoofchk', on: false },
      ]),
      new VfChangeError('ens1f0', 0, { kind: 'trust', on: true }, 'Operation not supported'),
    );
    // keepGoing applies the rest and still reports the refusal.
    await assert.rejects(pf.apply('ens1f0', 0, [{ kind: 'trust', on: true }, { kind: 'linkState', state: 'enable' }], { keepGoing: true }), /failed to set vf 0 trust flag to on: Operation not supported/);
    assert.deepEqual(await pf.read('ens1f0', 0), { ...defaultVfConfig(0), vlan: 5, qos: 1, linkState: 'enable' });
    assert.equal(await pf.read('ens1f0', 9), null);
    assert.deepEqual(
      pf.calls.map((c) => `${c.op} ${c.pf}/${c.vf} ${(c.changes ?? []).map((x) => x.kind).join(',')}`),
      ['apply ens1f0/0 vlan', 'apply ens1f0/0 trust,spoofchk', 'apply ens1f0/0 trust,linkState', 'read ens1f0/0 ', 'read ens1f0/9 '],
    );
  });
});

describe('sriov PF changes', () => {
  const conf = (extra: Record<string, unknown>) => appliedFrom(loadSriovConf({ cniVersion: '1.0.0', name: 'n', type: 'sriov', deviceID: '0000:3b:02.0', ...extra }, new Map()));
  const orig = { vf: 0, mac: '02:00:00:00:00:aa', vlan: 7, qos: 1, vlanProto: '802.1q' as const, spoofchk: true, trust: null, linkState: null, minTxRate: 5, maxTxRate: 50 };

  it('applies VLAN 0 even unconfigured, and only the configured rest, in sriov-cni order', () => {
    assert.deepEqual(changesToApply(conf({})), [{ kind: 'vlan', vlan: 0, qos: 0, proto: '802.1q' }]);
    assert.deepEqual(changesToApply(conf({ vlan: 9, vlanQoS: 2, mac: '02:00:00:00:00:01', max_tx_rate: 100, spoofchk: 'off', trust: 'on', link_state: 'disable' })), [
      { kind: 'vlan', vlan: 9, qos: 2, proto: '802.1q' },
      { kind: 'mac', mac: '02:00:00:00:00:01' },
      { kind: 'rate', minTxRate: 0, maxTxRate: 100 },
      { kind: 'spoofchk', on: false },
      { kind: 'trust', on: true },
      { kind: 'linkState', state: 'disable' },
    ]);
  });

  it('resets to the original values what ADD changed (unknown trust → off, link state → auto)', () => {
    assert.deepEqual(changesToReset(conf({}), orig), [{ kind: 'vlan', vlan: 7, qos: 1, proto: '802.1q' }]);
    assert.deepEqual(changesToReset(conf({ vlan: 9, mac: '02:00:00:00:00:01', min_tx_rate: 1, spoofchk: 'off', trust: 'on', link_state: 'disable' }), orig), [
      { kind: 'vlan', vlan: 7, qos: 1, proto: '802.1q' },
      { kind: 'spoofchk', on: true },
      { kind: 'mac', mac: '02:00:00:00:00:aa' },
      { kind: 'trust', on: false },
      { kind: 'rate', minTxRate: 5, maxTxRate: 50 },
      { kind: 'linkState', state: 'auto' },
    ]);
    assert.deepEqual(changesToNeutral(conf({ mac: '02:00:00:00:00:01', trust: 'on' }), 3), [
      { kind: 'vlan', vlan: 0, qos: 0, proto: '802.1q' },
      { kind: 'mac', mac: '00:00:00:00:00:00' },
      { kind: 'trust', on: false },
    ]);
  });

  it('says what differs for CHECK', () => {
    assert.equal(mismatch(orig, { kind: 'vlan', vlan: 7, qos: 1, proto: '802.1q' }), null);
    assert.equal(mismatch(orig, { kind: 'vlan', vlan: 8, qos: 1, proto: '802.1q' }), 'vlan 7 qos 1 proto 802.1q, expected vlan 8 qos 1 proto 802.1q');
    assert.equal(mismatch(orig, { kind: 'mac', mac: '02:00:00:00:00:01' }), 'MAC 02:00:00:00:00:aa, expected 02:00:00:00:00:01');
    assert.equal(mismatch(orig, { kind: 'trust', on: true }), null); // not reported by the driver
  });

  it('names a VF returned without its own name after its PF, systemd style', () => {
    assert.equal(fallbackHostName('ens1f0', 3), 'ens1f0v3');
    assert.equal(fallbackHostName('enp216s0f0np0', 12), 'enp216s0f0npv12');
  });
});

describe('sriov state file', () => {
  const state: SriovState = {
    deviceID: '0000:3b:02.0',
    pf: 'ens1f0',
    vfIndex: 0,
    dpdk: false,
    podIfName: 'net1',
    netns: '/run/netns/pod1',
    applied: { vlan: 100, vlanQoS: 2, vlanProto: '802.1ad', mac: '02:00:00:00:00:01', spoofchk: 'off', trust: 'on', linkState: null, minTxRate: null, maxTxRate: 1000 },
    orig: {
      hostIfName: 'ens1f0v0',
      effectiveMac: '9e:00:00:00:00:0a',
      mtu: 9000,
      pf: { vf: 0, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: true, trust: false, linkState: null, minTxRate: 0, maxTxRate: 0 },
    },
    offload: null,
  };
  const config = { cniVersion: '1.0.0', name: 'sriov-net', type: 'sriov', deviceID: '0000:3b:02.0', mac: '02:00:00:00:00:01', ipam: { type: 'host-local' }, prevResult: { cniVersion: '1.0.0' } };

  it("writes sriov-cni's fields and weft's, and reads them back", () => {
    const text = encodeState(state, config);
    const o = JSON.parse(text) as Record<string, unknown>;
    assert.deepEqual(o.OrigVfState, {
      HostIFName: 'ens1f0v0',
      SpoofChk: true,
      Trust: false,
      AdminMAC: '00:00:00:00:00:00',
      EffectiveMAC: '9e:00:00:00:00:0a',
      Vlan: 0,
      VlanQoS: 0,
      MinTxRate: 0,
      MaxTxRate: 0,
      LinkState: 0,
      MTU: 9000,
    });
    assert.deepEqual(
      [o.DPDKMode, o.Master, o.MAC, o.VFID, o.ContIFNames, o.deviceID, o.vlan, o.vlanQoS, o.vlanProto, o.spoofchk, o.trust, o.max_tx_rate, o.min_tx_rate, o.mac, o.prevResult],
      [false, 'ens1f0', '02:00:00:00:00:01', 0, 'net1', '0000:3b:02.0', 100, 2, '802.1ad', 'off', 'on', 1000, null, undefined, undefined],
    );
    assert.deepEqual(o.ipam, { type: 'host-local' });
    assert.deepEqual(decodeState('/x', text), state);
  });

  it('reads a file sriov-cni wrote (no weft object)', () => {
    const text = readFileSync(join(FIXTURES, 'sriov-cni-state.json'), 'utf8');
    assert.deepEqual(decodeState('/x', text), {
      deviceID: '0000:af:06.0',
      pf: 'enp175s0f1',
      vfIndex: 0,
      dpdk: false,
      podIfName: 'net1',
      netns: null,
      applied: { vlan: 1000, vlanQoS: 0, vlanProto: '802.1q', mac: null, spoofchk: 'on', trust: null, linkState: null, minTxRate: null, maxTxRate: null },
      orig: {
        hostIfName: 'enp175s6',
        effectiveMac: 'c6:c8:7f:1f:21:90',
        mtu: 1500,
        pf: { vf: 0, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: true, trust: false, linkState: 'auto', minTxRate: 0, maxTxRate: 0 },
      },
      offload: null,
    } satisfies SriovState);
  });

  it('refuses what is not a state file', () => {
    assert.throws(() => decodeState('/s', '{"OrigVfState":{}}'), /invalid sriov state file \/s: deviceID, Master or VFID missing/);
    assert.throws(() => decodeState('/s', '{}'), /no OrigVfState/);
    assert.throws(() => decodeState('/s', ''), /invalid sriov state file \/s: Unexpected end of JSON input/);
  });
});
