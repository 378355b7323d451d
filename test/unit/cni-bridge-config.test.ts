// bridge config: defaults, Go-style type errors, the reference's validation messages, VLAN trunk
// collection, MAC precedence and CNI_ARGS strictness, DNS override.
import assert from 'node:assert/strict';
import { collectVlanTrunk, containerMac, loadBridgeConf, validateForAdd, type BridgeConf } from '../../cni-plugins/bridge/config.js';
import type { NetConf } from '../../cni-plugins/skel/types.js';
import { assertCniError } from '../helpers/cni-assert.js';

function conf(extra: Record<string, unknown> = {}): NetConf {
  return { cniVersion: '1.0.0', name: 'net1', type: 'bridge', ...extra };
}

function load(extra: Record<string, unknown> = {}, args: Record<string, string> = {}): BridgeConf {
  return loadBridgeConf(conf(extra), new Map(Object.entries(args)));
}

const rejects = assertCniError;

describe('bridge config', () => {
  it('has the reference defaults', () => {
    const c = load();
    assert.deepEqual(
      { ...c },
      {
        name: 'net1',
        cniVersion: '1.0.0',
        bridge: 'cni0',
        isGateway: false,
        isDefaultGateway: false,
        forceAddress: false,
        ipMasq: false,
        ipMasqBackend: null,
        mtu: 0,
        hairpinMode: false,
        promiscMode: false,
        vlan: 0,
        vlanTrunk: [],
        preserveDefaultVlan: true,
        macspoofchk: false,
        enabledad: false,
        disableContainerInterface: false,
        portIsolation: false,
        mac: '',
        ipamType: '',
        dns: null,
      },
    );
  });

  it('reads every key', () => {
    const c = load({
      bridge: 'br7',
      isGateway: true,
      forceAddress: true,
      ipMasq: true,
      ipMasqBackend: 'nftables',
      mtu: 1400,
      hairpinMode: true,
      vlan: 100,
      preserveDefaultVlan: false,
      macspoofchk: true,
      enabledad: true,
      portIsolation: true,
      ipam: { type: 'host-local', subnet: '10.0.0.0/24' },
    });
    assert.equal(c.bridge, 'br7');
    assert.equal(c.isGateway, true);
    assert.equal(c.forceAddress, true);
    assert.equal(c.ipMasq, true);
    assert.equal(c.ipMasqBackend, 'nftables');
    assert.equal(c.mtu, 1400);
    assert.equal(c.hairpinMode, true);
    assert.equal(c.vlan, 100);
    assert.equal(c.preserveDefaultVlan, false);
    assert.equal(c.macspoofchk, true);
    assert.equal(c.enabledad, true);
    assert.equal(c.portIsolation, true);
    assert.equal(c.ipamType, 'host-local');
  });

  it('makes isDefaultGateway imply isGateway', () => {
    const c = load({ isDefaultGateway: true });
    assert.equal(c.isGateway, true);
    assert.equal(c.isDefaultGateway, true);
  });

  it('keeps the default for null, as Go does', () => {
    const c = load({ bridge: null, mtu: null, preserveDefaultVlan: null });
    assert.equal(c.bridge, 'cni0');
    assert.equal(c.mtu, 0);
    assert.equal(c.preserveDefaultVlan, true);
  });

  it('reports a wrong JSON type with Go encoding/json wording', () => {
    rejects(() => load({ mtu: '1500' }), 'failed to load netconf: json: cannot unmarshal string into Go struct field NetConf.mtu of type int');
    rejects(() => load({ mtu: 1500.5 }), 'failed to load netconf: json: cannot unmarshal number 1500.5 into Go struct field NetConf.mtu of type int');
    rejects(() => load({ isGateway: 'true' }), 'failed to load netconf: json: cannot unmarshal string into Go struct field NetConf.isGateway of type bool');
    rejects(() => load({ bridge: 5 }), 'failed to load netconf: json: cannot unmarshal number 5 into Go struct field NetConf.bridge of type string');
    rejects(() => load({ ipam: { type: 3 } }), 'failed to load netconf: json: cannot unmarshal number 3 into Go struct field IPAM.ipam.type of type string');
  });

  it('checks the VLAN range', () => {
    rejects(() => load({ vlan: 4095 }), 'invalid VLAN ID 4095 (must be between 0 and 4094)');
    rejects(() => load({ vlan: -1 }), 'invalid VLAN ID -1 (must be between 0 and 4094)');
    assert.equal(load({ vlan: 4094 }).vlan, 4094);
  });

  it('collects trunk VLANs sorted and unique', () => {
    assert.deepEqual(collectVlanTrunk([{ id: 42 }, { minID: 10, maxID: 12 }, { id: 11 }]), [10, 11, 12, 42]);
    assert.deepEqual(collectVlanTrunk(undefined), []);
    assert.deepEqual(load({ vlanTrunk: [{ id: 5 }] }).vlanTrunk, [5]);
  });

  it('rejects bad trunk entries with the reference messages', () => {
    rejects(() => load({ vlanTrunk: [{ minID: 0, maxID: 5 }] }), 'incorrect trunk minID parameter');
    rejects(() => load({ vlanTrunk: [{ minID: 1, maxID: 4095 }] }), 'incorrect trunk maxID parameter');
    rejects(() => load({ vlanTrunk: [{ minID: 9, maxID: 5 }] }), 'minID is greater than maxID in trunk parameter');
    rejects(() => load({ vlanTrunk: [{ maxID: 5 }] }), 'minID and maxID should be configured simultaneously, minID is missing');
    rejects(() => load({ vlanTrunk: [{ minID: 5 }] }), 'minID and maxID should be configured simultaneously, maxID is missing');
    rejects(() => load({ vlanTrunk: [{ id: 4095 }] }), 'incorrect trunk id parameter');
    rejects(() => load({ vlanTrunk: [{ id: 0 }] }), 'incorrect trunk id parameter');
  });

  it('takes the MAC from CNI_ARGS, then args.cni.mac, then runtimeConfig.mac', () => {
    const args = { IgnoreUnknown: '1', MAC: '02:00:00:00:00:01' };
    assert.equal(load({}, args).mac, '02:00:00:00:00:01');
    assert.equal(load({ args: { cni: { mac: '02:00:00:00:00:02' } } }, args).mac, '02:00:00:00:00:02');
    assert.equal(load({ args: { cni: { mac: '02:00:00:00:00:02' } }, runtimeConfig: { mac: '02:00:00:00:00:03' } }, args).mac, '02:00:00:00:00:03');
  });

  it('refuses unknown CNI_ARGS keys unless IgnoreUnknown is true, as types.LoadArgs', () => {
    rejects(() => load({}, { K8S_POD_NAME: 'web' }), 'ARGS: unknown args ["K8S_POD_NAME=web"]');
    assert.equal(load({}, { IgnoreUnknown: 'true', K8S_POD_NAME: 'web' }).mac, '');
    rejects(() => load({}, { IgnoreUnknown: 'maybe' }), 'ARGS: error parsing value of pair "IgnoreUnknown=maybe": boolean unmarshal error: invalid input maybe');
  });

  it('normalises the container MAC and rejects a bad one at ADD', () => {
    assert.equal(containerMac(load({ runtimeConfig: { mac: '02-AB-00-00-00-01' } })), '02:ab:00:00:00:01');
    assert.equal(containerMac(load()), null);
    rejects(() => validateForAdd(load({ runtimeConfig: { mac: 'zz:00' } })), 'address zz:00: invalid MAC address');
  });

  it('refuses conflicting modes at ADD with the reference messages', () => {
    rejects(() => validateForAdd(load({ hairpinMode: true, promiscMode: true })), 'cannot set hairpin mode and promiscuous mode at the same time');
    rejects(
      () => validateForAdd(load({ disableContainerInterface: true, ipam: { type: 'host-local' } })),
      'cannot use IPAM when DisableContainerInterface flag is set',
    );
    rejects(() => validateForAdd(load({ ipMasqBackend: 'pf' })), 'unknown ipmasq backend "pf"');
    assert.doesNotThrow(() => validateForAdd(load({ disableContainerInterface: true, ipam: {} })));
  });

  it('refuses names the kernel or an ip batch cannot take', () => {
    rejects(() => validateForAdd(load({ bridge: 'a-very-long-bridge-name' })), 'failed to create bridge "a-very-long-bridge-name": invalid interface name');
    rejects(() => validateForAdd(load({ bridge: 'br 0' })), 'failed to create bridge "br 0": invalid interface name');
    rejects(() => validateForAdd(load({ bridge: 'br0123456789ab', vlan: 4000, isGateway: true })), 'failed to create vlan interface: name "br0123456789ab.4000" is not a valid interface name');
    rejects(() => validateForAdd(load({ mtu: 70000 })), 'invalid MTU 70000 (must be between 0 and 65535)');
  });

  it('lets a non-empty dns replace the IPAM one, and ignores an empty one', () => {
    assert.equal(load({ dns: {} }).dns, null);
    assert.equal(load({ dns: { domain: '' } }).dns, null);
    assert.deepEqual(load({ dns: { nameservers: ['10.0.0.10'], search: ['svc.local'] } }).dns, { nameservers: ['10.0.0.10'], search: ['svc.local'] });
    rejects(() => load({ dns: { nameservers: 'x' } }), 'failed to load netconf: json: cannot unmarshal string into Go struct field DNS.dns.nameservers of type []string');
  });
});
