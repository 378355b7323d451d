// weft-ovs config: defaults, type errors and validation messages (code 7), DNS override.
import assert from 'node:assert/strict';
import { loadOvsConf, OvsPluginConfigError, type OvsConf } from '../../cni-plugins/ovs/config.js';
import type { NetConf } from '../../cni-plugins/skel/types.js';
import { assertCniError } from '../helpers/cni-assert.js';

function conf(extra: Record<string, unknown> = {}): NetConf {
  return { cniVersion: '1.0.0', name: 'net1', type: 'weft-ovs', ipam: { type: 'host-local' }, ...extra };
}

function load(extra: Record<string, unknown> = {}): OvsConf {
  return loadOvsConf(conf(extra));
}

function rejects(extra: Record<string, unknown>, msg: string, key: string): void {
  assertCniError(() => load(extra), msg, 7);
  assert.throws(
    () => load(extra),
    (e: unknown) => e instanceof OvsPluginConfigError && e.key === key,
  );
}

describe('weft-ovs config', () => {
  it('has the defaults: br-int, /var/run/openvswitch, system datapath, kernel MTU, no default route', () => {
    assert.deepEqual(
      { ...load() },
      {
        name: 'net1',
        cniVersion: '1.0.0',
        bridge: 'br-int',
        ovsRunDir: '/var/run/openvswitch',
        datapathType: 'system',
        mtu: 0,
        isDefaultGateway: false,
        ipamType: 'host-local',
        dns: null,
      },
    );
  });

  it('reads every key; null keeps the default and unknown keys (a flannel delegate’s) are ignored', () => {
    const c = load({
      bridge: 'br-pods',
      ovsRunDir: '/tmp/ovs/run',
      datapathType: 'netdev',
      mtu: 1450,
      isDefaultGateway: true,
      hairpinMode: true,
      ipMasq: false,
      dns: { nameservers: ['10.96.0.10'], search: ['svc.cluster.local'] },
    });
    assert.equal(c.bridge, 'br-pods');
    assert.equal(c.ovsRunDir, '/tmp/ovs/run');
    assert.equal(c.datapathType, 'netdev');
    assert.equal(c.mtu, 1450);
    assert.equal(c.isDefaultGateway, true);
    assert.deepEqual(c.dns, { nameservers: ['10.96.0.10'], search: ['svc.cluster.local'] });
    const d = load({ bridge: null, ovsRunDir: '', datapathType: null, mtu: null, dns: { domain: '' } });
    assert.equal(d.bridge, 'br-int');
    assert.equal(d.ovsRunDir, '/var/run/openvswitch');
    assert.equal(d.datapathType, 'system');
    assert.equal(d.mtu, 0);
    assert.equal(d.dns, null);
  });

  it('requires an ipam section with a type', () => {
    assertCniError(
      () => loadOvsConf({ cniVersion: '1.0.0', name: 'n', type: 'weft-ovs' }),
      "weft-ovs: an 'ipam' section is required (the pod's flows need its address)",
    );
    rejects({ ipam: {} }, `weft-ovs: 'ipam.type' must name the IPAM plugin (e.g. "host-local")`, 'ipam.type');
    rejects({ ipam: 'host-local' }, `weft-ovs: 'ipam' must be an object, got string "host-local"`, 'ipam');
    rejects({ ipam: { type: 5 } }, "weft-ovs: 'ipam.type' must be a string, got number 5", 'ipam.type');
  });

  it('rejects wrong types naming the key', () => {
    rejects({ bridge: 1 }, "weft-ovs: 'bridge' must be a string, got number 1", 'bridge');
    rejects({ ovsRunDir: ['x'] }, "weft-ovs: 'ovsRunDir' must be a string, got an array", 'ovsRunDir');
    rejects({ mtu: '1450' }, `weft-ovs: 'mtu' must be an integer, got string "1450"`, 'mtu');
    rejects({ mtu: 1450.5 }, "weft-ovs: 'mtu' must be an integer, got number 1450.5", 'mtu');
    rejects({ isDefaultGateway: 'yes' }, `weft-ovs: 'isDefaultGateway' must be a boolean, got string "yes"`, 'isDefaultGateway');
    rejects({ dns: [] }, "weft-ovs: 'dns' must be an object, got an array", 'dns');
    rejects({ dns: { nameservers: [1] } }, "weft-ovs: 'dns.nameservers' must be a list of strings, got an array", 'dns.nameservers');
  });

  it('rejects values the kernel or OVS would refuse', () => {
    rejects(
      { bridge: 'a-bridge-name-too-long' },
      `weft-ovs: 'bridge' must be an interface name of 1 to 15 characters without spaces, '/' or ':', got "a-bridge-name-too-long"`,
      'bridge',
    );
    rejects({ bridge: 'br int' }, `weft-ovs: 'bridge' must be an interface name of 1 to 15 characters without spaces, '/' or ':', got "br int"`, 'bridge');
    rejects({ ovsRunDir: 'run/openvswitch' }, `weft-ovs: 'ovsRunDir' must be an absolute path, got "run/openvswitch"`, 'ovsRunDir');
    rejects({ datapathType: 'kernel' }, `weft-ovs: 'datapathType' must be "system" or "netdev", got "kernel"`, 'datapathType');
    rejects({ mtu: 67 }, "weft-ovs: 'mtu' must be 0 (kernel default) or between 68 and 65535, got 67", 'mtu');
    rejects({ mtu: 65536 }, "weft-ovs: 'mtu' must be 0 (kernel default) or between 68 and 65535, got 65536", 'mtu');
    rejects({ mtu: -1 }, "weft-ovs: 'mtu' must be 0 (kernel default) or between 68 and 65535, got -1", 'mtu');
  });
});
