import assert from 'node:assert/strict';

import { backendOfConditions, containerAddrs, parseConfig, PortMapConfigError, type Backend } from '../../cni-plugins/portmap/config.js';
import type { CniResult, NetConf } from '../../cni-plugins/skel/types.js';

const iptablesDefault = { defaultBackend: (): Backend => 'iptables' };

function conf(extra: Record<string, unknown> = {}, mappings: unknown[] = [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }]): NetConf {
  return { cniVersion: '1.0.0', name: 'net1', type: 'portmap', runtimeConfig: { portMappings: mappings }, ...extra };
}

function rejects(c: NetConf, code: number, msg: string): void {
  assert.throws(
    () => parseConfig(c, iptablesDefault),
    (e: unknown) => {
      assert.ok(e instanceof PortMapConfigError, String(e));
      assert.equal(e.message, msg);
      assert.equal(e.code, code);
      return true;
    },
  );
}

describe('portmap config', () => {
  it('applies the reference defaults', () => {
    const c = parseConfig(conf(), iptablesDefault);
    assert.equal(c.name, 'net1');
    assert.equal(c.backend, 'iptables');
    assert.equal(c.snat, true);
    assert.equal(c.masqAll, false);
    assert.equal(c.markMasqBit, 13);
    assert.equal(c.externalSetMarkChain, null);
    assert.deepEqual(c.conditionsV4, []);
    assert.deepEqual(c.conditionsV6, []);
    assert.equal(c.portMappings.length, 1);
    assert.deepEqual({ ...c.portMappings[0]!, hostIP: null }, { hostPort: 8080, containerPort: 80, protocol: 'tcp', hostIP: null });
  });

  it('takes the default backend from the detector only when none is named', () => {
    assert.equal(parseConfig(conf(), { defaultBackend: () => 'nftables' }).backend, 'nftables');
    assert.equal(parseConfig(conf({ backend: 'iptables' }), { defaultBackend: () => 'nftables' }).backend, 'iptables');
  });

  it('reads hostIP, lower-cases the protocol and keeps an empty mapping list', () => {
    const c = parseConfig(conf({}, [{ hostPort: 53, containerPort: 5353, protocol: 'UDP', hostIP: '192.0.2.7' }]), iptablesDefault);
    assert.equal(c.portMappings[0]!.protocol, 'udp');
    assert.equal(c.portMappings[0]!.hostIP?.toString(), '192.0.2.7');
    assert.deepEqual(parseConfig({ cniVersion: '1.0.0', name: 'n', type: 'portmap' }, iptablesDefault).portMappings, []);
  });

  it('rejects what the reference rejects, with its messages and code 999', () => {
    rejects(conf({ markMasqBit: 5, externalSetMarkChain: 'KUBE-MARK-MASQ' }), 999, 'Cannot specify externalSetMarkChain and markMasqBit');
    rejects(conf({ markMasqBit: 32 }), 999, 'MasqMarkBit must be between 0 and 31');
    rejects(conf({ markMasqBit: -1 }), 999, 'MasqMarkBit must be between 0 and 31');
    rejects(conf({}, [{ hostPort: 8080, containerPort: 0, protocol: 'tcp' }]), 999, 'Invalid container port number: 0');
    rejects(conf({}, [{ hostPort: -3, containerPort: 80, protocol: 'tcp' }]), 999, 'Invalid host port number: -3');
    rejects(conf({}, [{ containerPort: 80, protocol: 'tcp' }]), 999, 'Invalid host port number: 0');
    rejects(conf({ backend: 'ipvs' }), 999, 'unrecognized backend "ipvs"');
    rejects(
      conf({ backend: 'nftables', externalSetMarkChain: 'KUBE-MARK-MASQ' }),
      999,
      'nftables backend was requested but configuration contains iptables-specific options [externalSetMarkChain]',
    );
    rejects(
      conf({ backend: 'iptables', conditionsV4: ['ip', 'daddr', '!=', '192.0.2.0/24'], conditionsV6: ['ip6', 'daddr', '!=', '2001:db8::/32'] }),
      999,
      'iptables backend was requested but configuration contains nftables-specific options [conditionsV4 conditionsV6]',
    );
  });

  it('rejects up front, with code 7, what the reference leaves iptables to fail on', () => {
    rejects(conf({}, [{ hostPort: 70000, containerPort: 80, protocol: 'tcp' }]), 7, 'Invalid host port number: 70000');
    rejects(conf({}, [{ hostPort: 80, containerPort: 65536, protocol: 'tcp' }]), 7, 'Invalid container port number: 65536');
    rejects(conf({}, [{ hostPort: 80, containerPort: 80, protocol: 'icmp' }]), 7, 'Invalid protocol "icmp" for host port 80: must be tcp, udp or sctp');
    rejects(conf({}, [{ hostPort: 80, containerPort: 80, protocol: '' }]), 7, 'Invalid protocol "" for host port 80: must be tcp, udp or sctp');
    rejects(conf({}, [{ hostPort: 80, containerPort: 80, protocol: 'tcp', hostIP: 'localhost' }]), 7, 'Invalid host IP in runtimeConfig.portMappings[0]: "localhost"');
    rejects(conf({ conditionsV4: ['-d', '1.2.3.4\n-A INPUT -j DROP'] }), 7, 'conditionsV4: token "1.2.3.4\\n-A INPUT -j DROP" contains a line break or NUL');
    rejects(conf({ snat: 'yes' }), 7, 'failed to parse network configuration: snat must be a boolean');
    rejects(conf({ markMasqBit: 1.5 }), 7, 'failed to parse network configuration: markMasqBit must be an integer');
    rejects(conf({ externalSetMarkChain: 'two words' }), 7, 'externalSetMarkChain "two words" is not a valid iptables chain name');
  });

  it('tells iptables conditions from nftables ones, "!" included', () => {
    assert.equal(backendOfConditions(null), null);
    assert.equal(backendOfConditions([]), null);
    assert.equal(backendOfConditions(['']), null);
    assert.equal(backendOfConditions(['-d', '192.0.2.0/24']), 'iptables');
    assert.equal(backendOfConditions(['!', '-d', '192.0.2.0/24']), 'iptables');
    assert.equal(backendOfConditions(['ip', 'daddr', '!=', '192.0.2.0/24']), 'nftables');
    assert.equal(parseConfig(conf({ conditionsV4: ['!', '-d', '192.0.2.0/24'] }), iptablesDefault).conditionsV4.join(' '), '! -d 192.0.2.0/24');
  });
});

describe('portmap container addresses', () => {
  const prev: CniResult = {
    cniVersion: '1.1.0',
    interfaces: [{ name: 'cni0', mac: '02:00:00:00:00:01' }, { name: 'veth1' }, { name: 'eth0', sandbox: '/run/netns/x' }, { name: 'net1', sandbox: '/run/netns/x' }],
    ips: [
      { interface: 0, address: '10.9.0.1/24' },
      { interface: 3, address: '10.8.0.5/16' },
      { interface: 2, address: '10.244.77.2/24', gateway: '10.244.77.1' },
      { interface: 2, address: '10.244.77.3/24' },
      { interface: 2, address: 'fd00:77::2/64' },
    ],
  };

  it('takes the first address per family on the sandbox interface named CNI_IFNAME', () => {
    const a = containerAddrs(prev, 'eth0');
    assert.equal(a.v4?.ip.toString(), '10.244.77.2');
    assert.equal(a.v4?.net.toString(), '10.244.77.0/24');
    assert.equal(a.v6?.ip.toString(), 'fd00:77::2');
    assert.equal(a.v6?.net.toString(), 'fd00:77::/64');
    const b = containerAddrs(prev, 'net1');
    assert.equal(b.v4?.ip.toString(), '10.8.0.5');
    assert.equal(b.v6, null);
  });

  it('accepts IPs without an interface index (IPAM-style results), and none at all', () => {
    const a = containerAddrs({ cniVersion: '1.1.0', ips: [{ address: '192.168.5.9/32' }] }, 'eth0');
    assert.equal(a.v4?.net.toString(), '192.168.5.9/32');
    assert.deepEqual(containerAddrs({ cniVersion: '1.1.0' }, 'eth0'), { v4: null, v6: null });
  });
});
