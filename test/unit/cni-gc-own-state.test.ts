// GC removes only what the plugin wrote (issue 14): for flannel, host-local and sriov, a data
// directory holds the plugin's real state of a live and a dead attachment next to foreign things
// (passwd, lock, a file named like an IP, one named like the plugin's state with other content,
// and — named like its state — a symlink to a file outside, a directory and a fifo). GC runs
// through the plugin's verbs in-process; afterwards exactly the dead attachment's state is gone,
// every foreign thing is byte-identical (same inode), the symlink target is untouched, and at most
// one warning names the look-alikes. No network state is touched (sriov: DPDK-mode state only,
// a recording PF, a fake sysfs).
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';

import { createFlannelPlugin, type Delegates } from '../../cni-plugins/flannel/verbs.js';
import { createHostLocalPlugin } from '../../cni-plugins/host-local/plugin.js';
import { readSmallRegularFile, removeIfSameFile } from '../../cni-plugins/lib/owned-files.js';
import { invoke } from '../../cni-plugins/skel/run.js';
import type { CniCommand, CniRequest, CniResult } from '../../cni-plugins/skel/types.js';
import { createSriovPlugin } from '../../cni-plugins/sriov/plugin.js';
import { encodeState, type SriovState } from '../../cni-plugins/sriov/state.js';
import { defaultVfConfig, RecordingPfVfControl } from '../../cni-plugins/sriov/vfcontrol.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';
import { LOOKALIKES, plantForeign, snapshot } from '../helpers/foreign-files.js';

const ENV_TEXT = 'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n';

function recordingDelegates(log: string[]): Delegates {
  const rec = (verb: string) => async (req: CniRequest, type: string) => {
    log.push(`${verb} ${type} ${req.containerId}`);
  };
  return {
    add: async (req: CniRequest, type: string): Promise<CniResult> => {
      log.push(`add ${type} ${req.containerId}`);
      return { cniVersion: '1.1.0', ips: [{ address: '10.1.17.2/24' }] };
    },
    del: rec('del'),
    check: rec('check'),
    gc: rec('gc'),
    status: rec('status'),
  };
}

/** One in-process run of a plugin through the skeleton (what a runtime sees). */
async function run(plugin: Parameters<typeof invoke>[0], command: CniCommand, config: object, containerId = '', ifname = 'eth0') {
  const env: Record<string, string> = { CNI_COMMAND: command, CNI_PATH: '/nonexistent' };
  if (command !== 'GC' && command !== 'STATUS') Object.assign(env, { CNI_CONTAINERID: containerId, CNI_IFNAME: ifname, CNI_NETNS: '/run/netns/wt-gc-none' });
  return invoke(plugin, env, JSON.stringify(config));
}

function names(dir: string): string[] {
  return readdirSync(dir).sort();
}

describe('GC removes only what the plugin wrote', () => {
  let root = '';
  let outside = '';
  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'wt-gc-own-'));
    outside = join(root, 'outside');
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  describe('flannel', () => {
    it('drops the dead container state and its temp file; keeps the live one and every foreign thing', async () => {
      const subnetFile = join(root, 'subnet.env');
      writeFileSync(subnetFile, ENV_TEXT);
      const dataDir = join(root, 'flannel');
      const log: string[] = [];
      const warnings: string[] = [];
      const plugin = createFlannelPlugin(recordingDelegates(log), { warn: (l) => warnings.push(l) });
      const conf = { cniVersion: '1.1.0', name: 'cbr0', type: 'flannel', subnetFile, dataDir };
      const req = (command: CniCommand, containerId: string, extra: object = {}): CniRequest => {
        const stdin = JSON.stringify({ ...conf, ...extra });
        return { command, containerId, netns: '/run/netns/x', ifname: 'eth0', args: new Map(), path: [], stdin, config: JSON.parse(stdin) as CniRequest['config'], env: {} };
      };
      for (const id of ['ctr-live', 'ctr-dead']) await plugin.add(req('ADD', id));
      const deadState = readFileSync(join(dataDir, 'ctr-dead'), 'utf8');
      const liveState = readFileSync(join(dataDir, 'ctr-live'), 'utf8');
      writeFileSync(join(dataDir, '.ctr-dead.tmp-4242-0a0b0c0d'), ''); // an interrupted write of the dead one
      writeFileSync(join(dataDir, '.ctr-live.tmp-4243-0a0b0c0e'), ''); // the live one's: not garbage
      const planted = plantForeign(dataDir, outside, { ...LOOKALIKES.flannel, staleText: deadState });
      const before = snapshot(dataDir, planted.names, [planted.target]);
      log.length = 0;

      await plugin.gc!(req('GC', '', { 'cni.dev/valid-attachments': [{ containerID: 'ctr-live', ifname: 'eth0' }] }));

      assert.deepEqual(names(dataDir), [...planted.names, '.ctr-live.tmp-4243-0a0b0c0e', 'ctr-live'].sort());
      assert.equal(readFileSync(join(dataDir, 'ctr-live'), 'utf8'), liveState);
      assert.deepEqual(snapshot(dataDir, planted.names, [planted.target]), before);
      assert.equal(readFileSync(planted.target, 'utf8'), deadState);
      assert.deepEqual(log, ['gc bridge ']);
      assert.deepEqual(warnings, [
        `flannel GC: left alone 4 file(s) in ${dataDir} named like flannel state (a container ID) but not holding it: "0123456789abcdef", "10.1.2.99", "lock", "passwd"`,
      ]);

      // Again with nothing valid: the rest of flannel's goes, the foreign things stay, one warning again.
      await plugin.gc!(req('GC', '', { 'cni.dev/valid-attachments': [] }));
      assert.deepEqual(names(dataDir), [...planted.names].sort());
      assert.deepEqual(snapshot(dataDir, planted.names, [planted.target]), before);
      assert.equal(warnings.length, 2);
    });

    it('says nothing when the directory holds only its own state', async () => {
      const subnetFile = join(root, 'subnet.env');
      writeFileSync(subnetFile, ENV_TEXT);
      const dataDir = join(root, 'flannel');
      const warnings: string[] = [];
      const plugin = createFlannelPlugin(recordingDelegates([]), { warn: (l) => warnings.push(l) });
      const stdin = JSON.stringify({ cniVersion: '1.1.0', name: 'cbr0', type: 'flannel', subnetFile, dataDir });
      const add = await run(plugin, 'ADD', JSON.parse(stdin) as object, 'ctr-1');
      assert.equal(add.exitCode, 0, add.stdout);
      const gc = await run(plugin, 'GC', { ...(JSON.parse(stdin) as object), 'cni.dev/valid-attachments': [] });
      assert.deepEqual(gc, { exitCode: 0, stdout: '', stderr: '' });
      assert.deepEqual(names(dataDir), []);
      assert.deepEqual(warnings, []);
    });
  });

  describe('host-local', () => {
    it('frees the dead reservation only; lock, last_reserved_ip.0 and every foreign thing stay', async () => {
      const dataDir = join(root, 'networks');
      const dir = join(dataDir, 'net1');
      const warnings: string[] = [];
      const plugin = createHostLocalPlugin({ warn: (l) => warnings.push(l) });
      const conf = { cniVersion: '1.1.0', name: 'net1', type: 'bridge', ipam: { type: 'host-local', dataDir, subnet: '10.1.2.0/24' } };
      for (const id of ['c-live', 'c-dead']) {
        const r = await run(plugin, 'ADD', conf, id);
        assert.equal(r.exitCode, 0, r.stdout);
      }
      assert.equal(readFileSync(join(dir, '10.1.2.3'), 'utf8'), 'c-dead\r\neth0');
      const planted = plantForeign(dir, outside, { ...LOOKALIKES.hostLocal, staleText: 'c-dead\r\neth0' });
      // Named like a container ID, holding exactly the dead attachment's reservation text.
      writeFileSync(join(dir, 'c0ffee'), 'c-dead\r\neth0');
      const foreign = [...planted.names, 'c0ffee'];
      const before = snapshot(dir, [...foreign, 'last_reserved_ip.0'], [planted.target]);

      const gc = await run(plugin, 'GC', { ...conf, 'cni.dev/valid-attachments': [{ containerID: 'c-live', ifname: 'eth0' }] });
      assert.deepEqual(gc, { exitCode: 0, stdout: '', stderr: '' });

      assert.deepEqual(names(dir), [...foreign, '10.1.2.2', 'last_reserved_ip.0'].sort());
      assert.equal(readFileSync(join(dir, '10.1.2.2'), 'utf8'), 'c-live\r\neth0');
      assert.deepEqual(snapshot(dir, [...foreign, 'last_reserved_ip.0'], [planted.target]), before);
      assert.deepEqual(warnings, [
        `host-local GC: left alone 2 file(s) in ${dir} named like a reservation (an IP address) but not holding it: "10.1.2.98", "10.1.2.99"`,
      ]);
      // The freed address is handed out again; the foreign IP-named things are never taken over.
      const again = await run(plugin, 'ADD', conf, 'c-new');
      assert.equal((JSON.parse(again.stdout) as CniResult).ips?.[0]?.address, '10.1.2.4/24');
    });

    it('a reservation named in a non-canonical form, or holding an invalid container ID or interface name, is not one', async () => {
      const dataDir = join(root, 'networks');
      const dir = join(dataDir, 'net1');
      mkdirSync(dir, { recursive: true });
      const kept: Record<string, string> = {
        '10.1.2.010': 'c-x\r\neth0', // Go prints 10.1.2.10
        'fd00:0::5': 'c-x\r\neth0', // Go prints fd00::5
        '10.1.2.20': '-x\r\neth0',
        '10.1.2.21': 'c-x\r\neth0/1',
        '10.1.2.22': 'c-x\r\nan-interface-name-too-long',
        '10.1.2.23': 'c-x\r\neth0\r\nmore',
      };
      const freed: Record<string, string> = { '10.1.2.30': 'c-x\r\neth0', 'fd00::5': 'c-x\r\nnet1', '10.1.2.31': ' legacy-id \n' };
      for (const [f, t] of Object.entries({ ...kept, ...freed })) writeFileSync(join(dir, f), t);
      const warnings: string[] = [];
      const gc = await run(createHostLocalPlugin({ warn: (l) => warnings.push(l) }), 'GC', {
        cniVersion: '1.1.0',
        name: 'net1',
        type: 'bridge',
        ipam: { type: 'host-local', dataDir, subnet: '10.1.2.0/24' },
        'cni.dev/valid-attachments': [],
      });
      assert.equal(gc.exitCode, 0, gc.stdout);
      assert.deepEqual(names(dir), [...Object.keys(kept), 'lock'].sort());
      for (const [f, t] of Object.entries(kept)) assert.equal(readFileSync(join(dir, f), 'utf8'), t);
      assert.equal(warnings.length, 1);
    });
  });

  describe('sriov', () => {
    const PF_PCI = '0000:3b:00.0';
    const VF = '0000:3b:02.0';
    const DPDK_VF = '0000:3b:02.1';
    const GONE_NS = '/run/netns/wt-gc-unit-gone';
    /** Opens as a live netns without us changing anything: our own. */
    const LIVE_NS = '/proc/self/ns/net';

    function dpdkState(netns: string | null): SriovState {
      return {
        deviceID: DPDK_VF,
        pf: 'wtpf0',
        vfIndex: 1,
        dpdk: true,
        podIfName: 'net1',
        netns,
        applied: { vlan: 7, vlanQoS: 0, vlanProto: '802.1q', mac: null, spoofchk: null, trust: null, linkState: null, minTxRate: null, maxTxRate: null },
        orig: { hostIfName: '', effectiveMac: '', mtu: 0, pf: defaultVfConfig(1) },
        offload: null,
      };
    }

    it('releases the dead attachment (PF reset, allocation and state removed) and touches nothing foreign', async () => {
      const sysfs = join(root, 'sys');
      const dataDir = join(root, 'sriov');
      buildFakeSysfs(sysfs, [{ pci: PF_PCI, netdev: 'wtpf0', vfs: [{ pci: VF, netdev: 'wtvf0' }, { pci: DPDK_VF, driver: 'vfio-pci' }] }]);
      const config = { cniVersion: '1.1.0', name: 'sn', type: 'sriov', deviceID: DPDK_VF, sysfsRoot: sysfs, dataDir, ipam: { type: 'fake-ipam' } };
      const stored = { cniVersion: '1.1.0', name: 'sn', type: 'sriov', deviceID: DPDK_VF };
      mkdirSync(join(dataDir, 'pci', 'vf_lock'), { recursive: true });
      const deadText = encodeState(dpdkState(GONE_NS), stored);
      writeFileSync(join(dataDir, 'c-dead-net1'), deadText, { mode: 0o600 });
      writeFileSync(join(dataDir, 'pci', DPDK_VF), GONE_NS);
      writeFileSync(join(dataDir, 'c-live-net1'), encodeState(dpdkState(GONE_NS), stored), { mode: 0o600 });
      writeFileSync(join(dataDir, 'c-alive-net1'), encodeState(dpdkState(LIVE_NS), stored), { mode: 0o600 });
      // Decodes, but names a PF no DEL would hand to `ip`: foreign, not DEL's to remove as torn.
      writeFileSync(join(dataDir, 'c-badnames-net1'), encodeState({ ...dpdkState(GONE_NS), pf: 'wt pf0' }, stored));
      // A real state under a name that is not its attachment's (a copy of c-dead2's net2 state).
      writeFileSync(join(dataDir, 'c-copy-net1'), encodeState({ ...dpdkState(GONE_NS), podIfName: 'net2' }, stored));
      writeFileSync(join(dataDir, 'c-dead2-net2.tmp-0badc0de'), ''); // an interrupted write
      writeFileSync(join(dataDir, 'c-live-net1.tmp-0badc0df'), ''); // the live one's: not garbage
      const planted = plantForeign(dataDir, outside, { ...LOOKALIKES.sriov, staleText: deadText });
      const foreign = [...planted.names, 'c-badnames-net1', 'c-copy-net1'];
      const before = snapshot(dataDir, foreign, [planted.target]);
      const ipam: string[] = [];
      const pf = new RecordingPfVfControl({ vfs: { 'wtpf0/0': defaultVfConfig(0), 'wtpf0/1': { ...defaultVfConfig(1), vlan: 7 } } });
      const fakeIpam: Delegates = {
        add: () => Promise.reject(new Error('not in this test')),
        del: async (_r, t) => void ipam.push(`del ${t}`),
        check: async (_r, t) => void ipam.push(`check ${t}`),
        gc: async (_r, t, stdin) => void ipam.push(`gc ${t} ${(JSON.parse(stdin) as Record<string, unknown>)['cni.dev/valid-attachments'] ? 'with list' : ''}`),
        status: async (_r, t) => void ipam.push(`status ${t}`),
      };
      const warnings: string[] = [];
      const plugin = createSriovPlugin({ ipam: fakeIpam, vf: pf, devlink: null }, { warn: (l) => warnings.push(l) });

      const valid = [
        { containerID: 'c-live', ifname: 'net1' },
        { containerID: 'c-other', ifname: 'net9' },
      ];
      const gc = await run(plugin, 'GC', { ...config, 'cni.dev/valid-attachments': valid });
      assert.deepEqual(gc, { exitCode: 0, stdout: '', stderr: '' });

      assert.deepEqual(names(dataDir), [...foreign, 'c-alive-net1', 'c-live-net1', 'c-live-net1.tmp-0badc0df', 'pci'].sort());
      assert.deepEqual(readdirSync(join(dataDir, 'pci'), { recursive: true }).sort(), ['vf_lock', `vf_lock/${DPDK_VF}.lock`]);
      assert.deepEqual(snapshot(dataDir, foreign, [planted.target]), before);
      assert.equal(readFileSync(planted.target, 'utf8'), deadText);
      // The dead attachment's VF got its VLAN back through the PF; IPAM GC ran once with the list.
      assert.deepEqual(pf.calls.map((c) => `${c.op} ${c.pf}/${c.vf}`), ['apply wtpf0/1']);
      assert.equal(pf.vfs.get('wtpf0/1')?.vlan, 0);
      assert.deepEqual(ipam, ['gc fake-ipam with list']);
      assert.deepEqual(warnings, [
        `sriov GC: left alone 3 file(s) in ${dataDir} named like sriov state (<containerID>-<ifname>) but not holding it: "c-badnames-net1", "c-copy-net1", "c0ffee-net1"; ` +
          'kept the state of "c-alive-net1": its pod netns still exists (a DEL releases it)',
      ]);
    });

    it('without a list it only asks IPAM; a malformed list is code 7 and touches nothing', async () => {
      const dataDir = join(root, 'sriov');
      mkdirSync(dataDir, { recursive: true });
      const text = encodeState(dpdkState(GONE_NS), { cniVersion: '1.1.0', name: 'sn', type: 'sriov' });
      writeFileSync(join(dataDir, 'c-dead-net1'), text);
      const ipam: string[] = [];
      const pf = new RecordingPfVfControl({ vfs: {} });
      const plugin = createSriovPlugin({ ipam: recordingDelegates(ipam), vf: pf, devlink: null }, { warn: () => assert.fail('no warning expected') });
      const base = { cniVersion: '1.1.0', name: 'sn', type: 'sriov', dataDir, ipam: { type: 'fake-ipam' } };
      assert.deepEqual(await run(plugin, 'GC', base), { exitCode: 0, stdout: '', stderr: '' });
      const bad = await run(plugin, 'GC', { ...base, 'cni.dev/valid-attachments': [{ containerID: 'c1' }] });
      assert.deepEqual(JSON.parse(bad.stdout), { code: 7, msg: 'cni.dev/valid-attachments must be a list of {"containerID": string, "ifname": string}' });
      assert.deepEqual([names(dataDir), readFileSync(join(dataDir, 'c-dead-net1'), 'utf8'), pf.calls, ipam], [['c-dead-net1'], text, [], ['gc fake-ipam ']]);
    });

    it('a release that fails keeps its state and fails the GC after IPAM GC ran', async () => {
      const sysfs = join(root, 'sys');
      const dataDir = join(root, 'sriov');
      buildFakeSysfs(sysfs, [{ pci: PF_PCI, netdev: 'wtpf0', vfs: [{ pci: VF, netdev: 'wtvf0' }, { pci: DPDK_VF, driver: 'vfio-pci' }] }]);
      mkdirSync(dataDir, { recursive: true });
      const text = encodeState(dpdkState(null), { cniVersion: '1.1.0', name: 'sn', type: 'sriov' });
      writeFileSync(join(dataDir, 'c-dead-net1'), text);
      const ipam: string[] = [];
      const fakeIpam = recordingDelegates(ipam);
      // The recording PF does not know VF 1: the reset fails.
      const plugin = createSriovPlugin({ ipam: fakeIpam, vf: new RecordingPfVfControl({ vfs: {} }), devlink: null }, { warn: () => assert.fail('no warning expected') });
      const gc = await run(plugin, 'GC', { cniVersion: '1.1.0', name: 'sn', type: 'sriov', sysfsRoot: sysfs, dataDir, ipam: { type: 'fake-ipam' }, 'cni.dev/valid-attachments': [] });
      assert.equal(gc.exitCode, 1);
      assert.match((JSON.parse(gc.stdout) as { msg: string }).msg, /^sriov GC: release c-dead-net1: reset VF: /);
      assert.equal(readFileSync(join(dataDir, 'c-dead-net1'), 'utf8'), text);
      assert.deepEqual(ipam, ['gc fake-ipam ']);
    });
  });

  describe('the file primitives GC uses', () => {
    it('read only regular files: not through a symlink, not a fifo (without blocking), not a directory, not a large file', () => {
      const dir = join(root, 'd');
      mkdirSync(dir);
      writeFileSync(join(root, 'target'), 'x');
      symlinkSync(join(root, 'target'), join(dir, 'link'));
      execFileSync('mkfifo', [join(dir, 'fifo')]);
      mkdirSync(join(dir, 'sub'));
      writeFileSync(join(dir, 'big'), 'y'.repeat(101));
      writeFileSync(join(dir, 'small'), 'y'.repeat(100));
      for (const n of ['link', 'fifo', 'sub', 'big', 'missing']) assert.equal(readSmallRegularFile(dir, n, 100), null, n);
      assert.equal(readSmallRegularFile(dir, 'small', 100)?.text, 'y'.repeat(100));
    });

    it('remove a name only while it is the file that was read', () => {
      const dir = join(root, 'd');
      mkdirSync(dir);
      writeFileSync(join(dir, 'a'), 'ours');
      const a = readSmallRegularFile(dir, 'a', 100)!;
      // Replaced by another file after the read: left alone.
      unlinkSync(join(dir, 'a'));
      writeFileSync(join(dir, 'a'), 'someone else');
      assert.equal(removeIfSameFile(dir, a), 'replaced');
      assert.equal(readFileSync(join(dir, 'a'), 'utf8'), 'someone else');
      // Replaced by a symlink: left alone, and so is its target.
      const b = readSmallRegularFile(dir, 'a', 100)!;
      unlinkSync(join(dir, 'a'));
      writeFileSync(join(root, 't'), 'target');
      symlinkSync(join(root, 't'), join(dir, 'a'));
      assert.equal(removeIfSameFile(dir, b), 'replaced');
      assert.equal(readFileSync(join(root, 't'), 'utf8'), 'target');
      unlinkSync(join(dir, 'a'));
      assert.equal(removeIfSameFile(dir, b), 'gone');
      writeFileSync(join(dir, 'c'), 'ours');
      assert.equal(removeIfSameFile(dir, readSmallRegularFile(dir, 'c', 100)!), 'removed');
      assert.equal(existsSync(join(dir, 'c')), false);
    });
  });
});
