// One validator per kind of name (src/util/names.ts) and the places the plugins apply it where a
// value enters: CNI_* env, prevResult, CNI_ARGS' pod identity, sysfs entries, sriov state files.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  containerIdProblem,
  ifNameProblem,
  isPciAddress,
  k8sNamespaceProblem,
  k8sObjectNameProblem,
  netnsPathProblem,
  pciAddressProblem,
  sandboxProblem,
} from '../../src/util/names.js';
import { podIdentity } from '../../cni-plugins/lib/podargs.js';
import { parseResult } from '../../cni-plugins/skel/convert.js';
import { readCniEnv, validateInterfaceName } from '../../cni-plugins/skel/env.js';
import { CniError } from '../../cni-plugins/skel/types.js';
import { checkStateNames } from '../../cni-plugins/sriov/state-names.js';
import { StateFileError, type SriovState } from '../../cni-plugins/sriov/state.js';
import { SriovDiscoveryError, Sysfs } from '../../cni-plugins/sriov/sysfs.js';
import { defaultVfConfig } from '../../cni-plugins/sriov/vfcontrol.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';

function cniError(fn: () => unknown, code: number, msg: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof CniError, `not a CniError: ${String(e)}`);
    assert.equal(e.code, code);
    assert.match(e.message, msg);
    return true;
  });
}

describe('names: one validator per kind', () => {
  it('interface names: the kernel rules, what batch syntax reads specially, and kernel name templates', () => {
    for (const ok of ['eth0', 'a23456789012345', 'café', 'br-int', 'veth0a1b2c3d', 'x.y', '\u200e']) assert.equal(ifNameProblem(ok), null, ok);
    const bad: Array<[string, RegExp]> = [
      ['', /empty/],
      ['a234567890123456', /15 bytes/],
      ['é'.repeat(8), /15 bytes/],
      ['.', /reserved/],
      ['..', /reserved/],
      ['a/b', /whitespace/],
      ['a:b', /whitespace/],
      ['a b', /whitespace/],
      ['a\nb', /whitespace/],
      ['a\u2028', /whitespace/],
      ['a\u200b', /white space/],
      ['a\x01', /control/],
      ['a\x7f', /control/],
      ['a\u0085', /whitespace|control/],
      ['a\ud800', /surrogate/],
      ['à', /0xA0/],
      ['net%d', /template/],
      ['a#b', /"#"/],
      ['a"b', /"\\""/],
      ["a'b", /"'"/],
      ['a\\b', /"\\\\"/],
      ['a;b', /";"/],
    ];
    for (const [name, why] of bad) assert.match(ifNameProblem(name) ?? 'accepted', why, JSON.stringify(name));
  });

  it('PCI addresses, netns paths, sandboxes, container IDs and Kubernetes names', () => {
    assert.equal(pciAddressProblem('0000:3b:02.0'), null);
    assert.equal(pciAddressProblem('10000:00:01.7'), null); // a VMD domain
    for (const bad of ['', '0000:3b:02.8', '0000:3B:02.0', '../../etc', '0000:3b:02.0\n', '3b:02.0']) assert.notEqual(pciAddressProblem(bad), null, JSON.stringify(bad));
    assert.equal(isPciAddress(42), false);
    assert.equal(netnsPathProblem('/run/netns/cni-1234'), null);
    assert.equal(netnsPathProblem('/var/run/netns/with space#and;more'), null); // a path, handed over as an fd
    for (const [bad, why] of [['', /empty/], ['run/netns/x', /absolute/], ['/run/netns/x\n', /control/], [`/${'a'.repeat(4095)}`, /4095/]] as const) {
      assert.match(netnsPathProblem(bad) ?? 'accepted', why);
    }
    assert.equal(sandboxProblem('kata-vm-1f2e'), null); // a VM sandbox's ID is not a path
    assert.match(sandboxProblem('/run/netns/x\x1b[2J') ?? 'accepted', /control/);
    assert.equal(containerIdProblem('a1_b.c-d'), null);
    for (const bad of ['', '-a', '.a', 'a b', 'a\nb', 'a#b', 'a/b']) assert.notEqual(containerIdProblem(bad), null, bad);
    assert.equal(k8sObjectNameProblem('web-0.abc'), null);
    assert.equal(k8sNamespaceProblem('kube-system'), null);
    for (const bad of ['', 'Web', '-a', 'a-', 'a..b', 'a_b', 'w'.repeat(254), 'a\nb', 'a"b']) assert.notEqual(k8sObjectNameProblem(bad), null, bad);
    for (const bad of ['kube.system', 'n'.repeat(64), 'a b']) assert.notEqual(k8sNamespaceProblem(bad), null, bad);
  });
});

describe('names where they enter', () => {
  const env = (extra: Record<string, string>) => ({ CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1', CNI_NETNS: '/run/netns/x', CNI_IFNAME: 'eth0', CNI_PATH: '/opt/cni/bin', ...extra });

  it('CNI_IFNAME: beyond the reference, what a batch line reads specially → code 4 naming the value', () => {
    cniError(() => validateInterfaceName('eth#0'), 4, /^invalid interface name "eth#0": contains "#"$/);
    cniError(() => validateInterfaceName('net%d'), 4, /^invalid interface name "net%d": contains "%"/);
    cniError(() => readCniEnv(env({ CNI_IFNAME: 'e\x01' })), 4, /^invalid interface name "e\\u0001": contains a control character$/);
  });

  it('CNI_NETNS: checked when set for ADD, CHECK and DEL → code 4', () => {
    cniError(() => readCniEnv(env({ CNI_NETNS: 'rel/ns' })), 4, /^invalid CNI_NETNS "rel\/ns": not an absolute path$/);
    cniError(() => readCniEnv(env({ CNI_COMMAND: 'DEL', CNI_NETNS: '/run/netns/x\nlink add' })), 4, /^invalid CNI_NETNS .*control character$/);
    assert.equal(readCniEnv(env({ CNI_COMMAND: 'DEL', CNI_NETNS: '' })).netns, '');
    // GC and STATUS do not look at it.
    assert.equal(readCniEnv({ CNI_COMMAND: 'GC', CNI_PATH: '/p', CNI_NETNS: 'rel' }).netns, 'rel');
  });

  it('prevResult: interface names and sandboxes, with the field named', () => {
    const prev = (iface: Record<string, unknown>) => ({ cniVersion: '1.0.0', interfaces: [{ name: 'eth0' }, iface] });
    assert.throws(() => parseResult(prev({ name: 'v\nlink add' }), '1.0.0'), /^CniResultError: interfaces\[1\]\.name: invalid interface name "v\\nlink add": contains/);
    assert.throws(() => parseResult(prev({ name: 'eth0', sandbox: '/run/netns/a\u0000' }), '1.0.0'), /^CniResultError: interfaces\[1\]\.sandbox: invalid sandbox "\/run\/netns\/a\\u0000": contains a control character/);
    // An empty name is the plugin's CHECK to report ("Interface name missing"), as the reference.
    assert.deepEqual(parseResult(prev({ name: '' }), '1.0.0').interfaces?.[1], { name: '' });
  });

  it('CNI_ARGS: the pod name and namespace must be Kubernetes names → code 4', () => {
    assert.deepEqual(podIdentity(new Map([['K8S_POD_NAME', 'web-0'], ['K8S_POD_NAMESPACE', 'prod']])), { podName: 'web-0', podNamespace: 'prod' });
    assert.deepEqual(podIdentity(new Map([['K8S_POD_NAME', '']])), {});
    cniError(() => podIdentity(new Map([['K8S_POD_NAME', 'web"0']])), 4, /^invalid CNI_ARGS K8S_POD_NAME "web\\"0": not a DNS-1123 subdomain/);
    cniError(() => podIdentity(new Map([['K8S_POD_NAMESPACE', 'a.b']])), 4, /^invalid CNI_ARGS K8S_POD_NAMESPACE "a\.b": not a DNS-1123 label/);
  });

  describe('sysfs entries and state files', () => {
    let root = '';
    before(() => {
      root = mkdtempSync(join(tmpdir(), 'wt-names-sysfs-'));
    });
    after(() => rmSync(root, { recursive: true, force: true }));

    it('a VF or PF netdev directory that is not a netdev name stops discovery with the directory and value named', () => {
      const vfRoot = join(root, 'vf');
      buildFakeSysfs(vfRoot, [{ pci: '0000:3b:00.0', netdev: 'ens1f0', vfs: [{ pci: '0000:3b:02.0', netdev: 'v0\nlink add x type bridge' }] }]);
      assert.throws(
        () => new Sysfs(vfRoot).vfNetdev('0000:3b:02.0'),
        (e: unknown) => e instanceof SriovDiscoveryError && /lists "v0\\nlink add x type bridge", which is not a network device name/.test(e.message),
      );
      const pfRoot = join(root, 'pf');
      buildFakeSysfs(pfRoot, [{ pci: '0000:3b:00.0', netdev: 'pf#0', vfs: [{ pci: '0000:3b:02.0', netdev: 'v0' }] }]);
      assert.throws(
        () => new Sysfs(pfRoot).locate('0000:3b:02.0'),
        (e: unknown) => e instanceof SriovDiscoveryError && /pf#0.*which is not a network device name/.test(e.message),
      );
    });

    it('a state file whose PF, VF names or PCI address are not names is foreign (StateFileError)', () => {
      const s: SriovState = {
        deviceID: '0000:3b:02.0',
        pf: 'ens1f0',
        vfIndex: 0,
        dpdk: false,
        podIfName: 'net1',
        netns: null,
        applied: { vlan: null, vlanQoS: 0, vlanProto: '802.1q', mac: null, spoofchk: null, trust: null, linkState: null, minTxRate: null, maxTxRate: null },
        orig: { hostIfName: 'ens1f0v0', effectiveMac: '', mtu: 0, pf: defaultVfConfig(0) },
        offload: null,
      };
      assert.equal(checkStateNames('f', s), s);
      // DPDK mode and sriov-cni's files leave the VF's names empty.
      const unnamed: SriovState = { ...s, podIfName: '', orig: { ...s.orig, hostIfName: '' } };
      assert.equal(checkStateNames('f', unnamed), unnamed);
      const bad: Array<[Partial<SriovState>, RegExp]> = [
        [{ pf: 'ens1f0\nlink add x type bridge' }, /Master "ens1f0\\nlink add x type bridge"/],
        [{ podIfName: 'net#1' }, /ContIFNames "net#1"/],
        [{ orig: { ...s.orig, hostIfName: 'v 0' } }, /OrigVfState\.HostIFName "v 0"/],
        [{ deviceID: '../../../etc/passwd' }, /deviceID "\.\.\/\.\.\/\.\.\/etc\/passwd"/],
      ];
      for (const [edit, why] of bad) {
        assert.throws(
          () => checkStateNames('f', { ...s, ...edit }),
          (e: unknown) => e instanceof StateFileError && why.test(e.message),
        );
      }
    });
  });
});
