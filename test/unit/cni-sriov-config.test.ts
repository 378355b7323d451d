// The sriov plugin's config: sriov-cni's validation rules and messages, MAC precedence, and
// weft's keys (ovs, sysfsRoot, dataDir).
import assert from 'node:assert/strict';
import { loadSriovConf } from '../../cni-plugins/sriov/config.js';
import { assertCniError } from '../helpers/cni-assert.js';

const BASE = { cniVersion: '1.0.0', name: 'sriov-net', type: 'sriov', deviceID: '0000:AF:06.0' };
const LOAD = 'SRIOV-CNI failed to load netconf: LoadConf():';

function load(extra: Record<string, unknown> = {}, args: Record<string, string> = {}, env: Record<string, string> = {}) {
  return loadSriovConf({ ...BASE, ...extra }, new Map(Object.entries(args)), env);
}

describe('sriov config', () => {
  it('defaults: no VLAN, 802.1Q, nothing else set, /sys and /var/lib/cni/sriov', () => {
    assert.deepEqual(load(), {
      name: 'sriov-net',
      cniVersion: '1.0.0',
      deviceID: '0000:af:06.0',
      vlan: null,
      vlanQoS: 0,
      vlanProto: '802.1q',
      mac: null,
      spoofchk: null,
      trust: null,
      linkState: null,
      minTxRate: null,
      maxTxRate: null,
      ipamType: '',
      ovs: null,
      sysfsRoot: '/sys',
      dataDir: '/var/lib/cni/sriov',
    });
  });

  it('reads every key', () => {
    const c = load({
      vlan: 100,
      vlanQoS: 5,
      vlanProto: '802.1AD',
      mac: '02:AA:BB:CC:DD:01',
      spoofchk: 'off',
      trust: 'on',
      link_state: 'enable',
      min_tx_rate: 10,
      max_tx_rate: 1000,
      ipam: { type: 'host-local' },
      ovs: { bridge: 'br-int' },
      sysfsRoot: '/tmp/sys/',
      dataDir: '/tmp/state',
    });
    assert.deepEqual(
      [c.vlan, c.vlanQoS, c.vlanProto, c.mac, c.spoofchk, c.trust, c.linkState, c.minTxRate, c.maxTxRate, c.ipamType, c.ovs, c.sysfsRoot, c.dataDir],
      [100, 5, '802.1ad', '02:aa:bb:cc:dd:01', 'off', 'on', 'enable', 10, 1000, 'host-local', { bridge: 'br-int' }, '/tmp/sys', '/tmp/state'],
    );
  });

  it('takes the MAC from the config, then CNI_ARGS, then runtimeConfig', () => {
    assert.equal(load({ mac: '02:00:00:00:00:01' }).mac, '02:00:00:00:00:01');
    assert.equal(load({ mac: '02:00:00:00:00:01' }, { IgnoreUnknown: '1', K8S_POD_NAME: 'p', MAC: '02:00:00:00:00:02' }).mac, '02:00:00:00:00:02');
    assert.equal(load({ mac: '02:00:00:00:00:01', runtimeConfig: { mac: '02:00:00:00:00:03' } }, { MAC: '02:00:00:00:00:02' }).mac, '02:00:00:00:00:03');
  });

  it('takes deviceID from runtimeConfig (the deviceID capability) over the key', () => {
    assert.equal(load({ runtimeConfig: { deviceID: '0000:03:02.3' } }).deviceID, '0000:03:02.3');
    assert.equal(loadSriovConf({ cniVersion: '1.0.0', name: 'n', type: 'sriov', runtimeConfig: { deviceID: '0000:03:02.4' } }, new Map()).deviceID, '0000:03:02.4');
  });

  it('uses WEFT_SRIOV_SYSFS / WEFT_SRIOV_DATA_DIR below the config keys', () => {
    const env = { WEFT_SRIOV_SYSFS: '/host/sys', WEFT_SRIOV_DATA_DIR: '/run/sriov' };
    assert.deepEqual([load({}, {}, env).sysfsRoot, load({}, {}, env).dataDir], ['/host/sys', '/run/sriov']);
    assert.equal(load({ sysfsRoot: '/x' }, {}, env).sysfsRoot, '/x');
  });

  it("refuses what sriov-cni's LoadConf refuses, with its messages (code 7)", () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ deviceID: '' }, `${LOAD} VF pci addr is required`],
      [{ deviceID: '../../etc' }, `${LOAD} invalid PCI address "../../etc": expected domain:bus:device.function, e.g. 0000:af:06.0`],
      [{ vlanQoS: 1 }, `${LOAD} vlan id must be configured to set vlan QoS to a non-nil value`],
      [{ vlanProto: '802.1q' }, `${LOAD} vlan id must be configured to set vlan proto to a non-nil value`],
      [{ vlan: 4095 }, `${LOAD} vlan id 4095 invalid: value must be in the range 0-4094`],
      [{ vlan: -1 }, `${LOAD} vlan id -1 invalid: value must be in the range 0-4094`],
      [{ vlan: 5, vlanQoS: 8 }, `${LOAD} vlan QoS PCP 8 invalid: value must be in the range 0-7`],
      [{ vlan: 0, vlanQoS: 2 }, `${LOAD} non-zero vlan id must be configured to set vlan QoS to a non-zero value`],
      [{ vlan: 5, vlanProto: '802.1x' }, `${LOAD} vlan Proto 802.1x invalid: value must be '802.1Q' or '802.1ad'`],
      [{ vlan: 0, vlanProto: '802.1ad' }, `${LOAD} non-zero vlan id must be configured to set vlan proto 802.1ad`],
      [{ link_state: 'up' }, `${LOAD} invalid link_state value: up`],
      [{ spoofchk: 'true' }, `${LOAD} invalid spoofchk value: true (must be "on" or "off")`],
      [{ trust: 'yes' }, `${LOAD} invalid trust value: yes (must be "on" or "off")`],
      [{ min_tx_rate: -5 }, `${LOAD} invalid min_tx_rate -5: must be between 0 and 4294967295 Mbps`],
      [{ vlan: '5' }, `${LOAD} failed to load netconf: json: cannot unmarshal string into Go struct field NetConf.vlan of type int`],
      [{ mac: 'zz:00:00:00:00:00' }, 'failed to parse MAC address zz:00:00:00:00:00: address zz:00:00:00:00:00: invalid MAC address'],
      [{ ovs: { bridge: '' } }, 'invalid "ovs" config: "bridge" must be an interface name, got ""'],
      [{ ovs: { bridge: 'a/b' } }, 'invalid "ovs" config: "bridge" must be an interface name, got "a/b"'],
      [{ sysfsRoot: 'sys' }, 'invalid sysfsRoot "sys": must be an absolute path'],
    ];
    for (const [extra, msg] of cases) assertCniError(() => load(extra), msg, 7);
  });

  it('refuses unknown CNI_ARGS unless IgnoreUnknown, as types.LoadArgs', () => {
    assertCniError(() => load({}, { K8S_POD_NAME: 'p' }), 'SRIOV-CNI failed to parse args: ARGS: unknown args ["K8S_POD_NAME=p"]', 7);
    assertCniError(() => load({}, { IgnoreUnknown: 'maybe' }), 'SRIOV-CNI failed to parse args: ARGS: error parsing value of pair "IgnoreUnknown=maybe": boolean unmarshal error: invalid input maybe', 7);
  });
});
