// The sriov plugin's verbs in-process with a recording PF and fake IPAM, on the paths that never
// change the kernel: what is refused before anything is touched, the allocation check, and the
// DEL decisions (torn state file, a VF another live pod holds, nothing to tie a VF to us).
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { OffloadHooks } from '../../cni-plugins/sriov/deps.js';
import { createSriovPlugin } from '../../cni-plugins/sriov/plugin.js';
import { encodeState } from '../../cni-plugins/sriov/state.js';
import { defaultVfConfig, RecordingPfVfControl } from '../../cni-plugins/sriov/vfcontrol.js';
import { invoke } from '../../cni-plugins/skel/run.js';
import type { CniRequest, CniResult, Delegates } from '../../cni-plugins/skel/types.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';

const VF = '0000:3b:02.0';
const DPDK_VF = '0000:3b:02.1';
/** A path that opens as a live netns without us changing anything: our own. */
const LIVE_NS = '/proc/self/ns/net';

function fakeIpam(log: string[]): Delegates {
  const rec = (verb: string) => async (_req: CniRequest, type: string) => {
    log.push(`${verb} ${type}`);
  };
  return {
    add: async (_req: CniRequest, type: string): Promise<CniResult> => {
      log.push(`add ${type}`);
      return { cniVersion: '1.1.0', ips: [{ address: '10.9.0.5/24' }] };
    },
    del: rec('del'),
    check: rec('check'),
    gc: rec('gc'),
    status: rec('status'),
  };
}

describe('sriov plugin verbs (no kernel changes)', () => {
  let root = '';
  let sysfs = '';
  let dataDir = '';

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'wt-sriov-unit-'));
    sysfs = join(root, 'sys');
    dataDir = join(root, 'state');
    buildFakeSysfs(sysfs, [{ pci: '0000:3b:00.0', netdev: 'wtpf0', vfs: [{ pci: VF, netdev: 'wtvf0' }, { pci: DPDK_VF, driver: 'vfio-pci' }] }]);
  });

  afterEach(() => rmSync(root, { recursive: true, force: true }));

  function env(command: string, extra: Record<string, string> = {}): Record<string, string> {
    return { CNI_COMMAND: command, CNI_CONTAINERID: 'c1', CNI_IFNAME: 'net1', CNI_PATH: '/nonexistent', ...extra };
  }

  function conf(extra: Record<string, unknown> = {}): string {
    return JSON.stringify({ cniVersion: '1.0.0', name: 'sn', type: 'sriov', deviceID: VF, sysfsRoot: sysfs, dataDir, ipam: { type: 'fake-ipam' }, ...extra });
  }

  function setup(offload?: OffloadHooks) {
    const ipam: string[] = [];
    const pf = new RecordingPfVfControl({ vfs: { 'wtpf0/0': defaultVfConfig(0) } });
    const plugin = createSriovPlugin({ ipam: fakeIpam(ipam), vf: pf, devlink: null, ...(offload ? { offload } : {}) });
    return { plugin, ipam, pf };
  }

  it('refuses the offload mode without the offload step (code 2), before touching anything', async () => {
    const { plugin, ipam, pf } = setup();
    const out = await invoke(plugin, env('ADD', { CNI_NETNS: '/run/netns/wt-sriov-unit-none' }), conf({ ovs: { bridge: 'br-int' }, sysfsRoot: '/nonexistent' }));
    assert.deepEqual(JSON.parse(out.stdout), { code: 2, msg: 'offload mode not implemented yet ("ovs": {"bridge":"br-int"})' });
    assert.deepEqual([ipam, pf.calls, existsSync(dataDir)], [[], [], false]);
  });

  it('refuses a VF allocated to a live netns before any PF call', async () => {
    mkdirSync(join(dataDir, 'pci'), { recursive: true });
    writeFileSync(join(dataDir, 'pci', VF), LIVE_NS);
    const { plugin, ipam, pf } = setup();
    const out = await invoke(plugin, env('ADD', { CNI_NETNS: LIVE_NS, CNI_NETNS_OVERRIDE: '1' }), conf());
    assert.deepEqual(JSON.parse(out.stdout), { code: 999, msg: `SRIOV-CNI failed to load netconf: pci address ${VF} is already allocated` });
    assert.deepEqual([ipam, pf.calls], [[], []]);
  });

  it('forgets a stale allocation (its netns is gone) and goes on to the PF', async () => {
    mkdirSync(join(dataDir, 'pci'), { recursive: true });
    writeFileSync(join(dataDir, 'pci', DPDK_VF), '/run/netns/wt-sriov-unit-gone');
    const { plugin, ipam, pf } = setup();
    // The recording PF does not know VF 1: the ADD stops at the read, before any change.
    const out = await invoke(plugin, env('ADD', { CNI_NETNS: LIVE_NS, CNI_NETNS_OVERRIDE: '1' }), conf({ deviceID: DPDK_VF }));
    assert.deepEqual(JSON.parse(out.stdout), { code: 999, msg: 'failed to get original vf information: failed to find vf 1' });
    assert.equal(existsSync(join(dataDir, 'pci', DPDK_VF)), false);
    assert.deepEqual([ipam, pf.calls], [[], [{ op: 'read', pf: 'wtpf0', vf: 1 }]]);
  });

  it('ADD into a missing netns fails before the lock, IPAM or the PF', async () => {
    const { plugin, ipam, pf } = setup();
    const ns = '/run/netns/wt-sriov-unit-no-such';
    const out = await invoke(plugin, env('ADD', { CNI_NETNS: ns }), conf());
    assert.deepEqual(JSON.parse(out.stdout), { code: 999, msg: `failed to open netns "${ns}": failed to Statfs "${ns}": no such file or directory` });
    assert.deepEqual([ipam, pf.calls, existsSync(dataDir)], [[], [], false]);
  });

  it('DEL with a torn state file removes it and still releases the IP', async () => {
    mkdirSync(dataDir, { recursive: true });
    writeFileSync(join(dataDir, 'c1-net1'), '{"OrigVfSt');
    const { plugin, ipam, pf } = setup();
    const out = await invoke(plugin, env('DEL'), conf({ deviceID: undefined }));
    assert.deepEqual(out, { exitCode: 0, stdout: '', stderr: '' });
    assert.deepEqual([ipam, pf.calls, existsSync(join(dataDir, 'c1-net1'))], [['del fake-ipam'], [], false]);
  });

  it('DEL leaves a VF that another live pod now holds (sriov-cni#313) and drops only its own state', async () => {
    mkdirSync(join(dataDir, 'pci'), { recursive: true });
    writeFileSync(join(dataDir, 'pci', VF), LIVE_NS);
    const state = {
      deviceID: VF,
      pf: 'wtpf0',
      vfIndex: 0,
      dpdk: false,
      podIfName: 'net1',
      netns: '/run/netns/wt-sriov-unit-old-pod',
      applied: { vlan: 5, vlanQoS: 0, vlanProto: '802.1q' as const, mac: null, spoofchk: null, trust: null, linkState: null, minTxRate: null, maxTxRate: null },
      orig: { hostIfName: 'wtvf0', effectiveMac: '02:00:00:00:00:01', mtu: 1500, pf: defaultVfConfig(0) },
      offload: null,
    };
    writeFileSync(join(dataDir, 'c1-net1'), encodeState(state, { cniVersion: '1.0.0', name: 'sn', type: 'sriov' }));
    const { plugin, ipam, pf } = setup();
    const out = await invoke(plugin, env('DEL'), conf());
    assert.deepEqual(out, { exitCode: 0, stdout: '', stderr: '' });
    assert.deepEqual([ipam, pf.calls], [['del fake-ipam'], []]);
    assert.deepEqual([existsSync(join(dataDir, 'c1-net1')), existsSync(join(dataDir, 'pci', VF))], [false, true]);
  });

  it('DEL without state and without anything tying the VF to this attachment only releases the IP', async () => {
    const { plugin, ipam, pf } = setup();
    const out = await invoke(plugin, env('DEL'), conf({ vlan: 5 }));
    assert.deepEqual(out, { exitCode: 0, stdout: '', stderr: '' });
    assert.deepEqual([ipam, pf.calls], [['del fake-ipam'], []]);
  });

  it('DEL with state hands the offload state to detach() first, and says so when there is no offload step', async () => {
    const state = {
      deviceID: VF,
      pf: 'wtpf0',
      vfIndex: 0,
      dpdk: true,
      podIfName: 'net1',
      netns: null,
      applied: { vlan: null, vlanQoS: 0, vlanProto: '802.1q' as const, mac: null, spoofchk: null, trust: null, linkState: null, minTxRate: null, maxTxRate: null },
      orig: { hostIfName: '', effectiveMac: '', mtu: 0, pf: { ...defaultVfConfig(0), vlan: 3 } },
      offload: { port: 'pod1-abc123', ofport: 7 },
    };
    const write = () => writeFileSync(join(dataDir, 'c1-net1'), encodeState(state, { cniVersion: '1.0.0', name: 'sn', type: 'sriov' }));
    mkdirSync(dataDir, { recursive: true });
    write();
    const order: string[] = [];
    const hooks: OffloadHooks = {
      attach: () => Promise.reject(new Error('not in this test')),
      detach: async (ctx) => {
        order.push(`detach ${ctx.deviceID} ${JSON.stringify(ctx.state)}`);
      },
    };
    const a = setup(hooks);
    const ipamLog = a.ipam;
    const out = await invoke(a.plugin, env('DEL'), conf());
    assert.deepEqual(out, { exitCode: 0, stdout: '', stderr: '' });
    assert.deepEqual(order, [`detach ${VF} {"port":"pod1-abc123","ofport":7}`]);
    assert.deepEqual(ipamLog, ['del fake-ipam']);
    // DPDK: the PF reset is all there is to undo on the VF (VLAN back to 3).
    assert.deepEqual(a.pf.calls.map((c) => [c.op, c.changes]), [['apply', [{ kind: 'vlan', vlan: 3, qos: 0, proto: '802.1q' }]]]);

    write();
    const b = setup();
    const failed = await invoke(b.plugin, env('DEL'), conf());
    assert.deepEqual(JSON.parse(failed.stdout), { code: 999, msg: 'offload detach: the state has offload data but this plugin has no offload mode' });
    assert.equal(existsSync(join(dataDir, 'c1-net1')), true, 'kept for a DEL that can finish the job');
  });

  it('CHECK without state says which attachment it has none for', async () => {
    const { plugin } = setup();
    const out = await invoke(plugin, env('CHECK', { CNI_NETNS: LIVE_NS }), conf({ prevResult: { cniVersion: '1.0.0' } }));
    assert.deepEqual(JSON.parse(out.stdout), { code: 999, msg: `no sriov state for container c1 interface net1 (${join(dataDir, 'c1-net1')})` });
  });
});
