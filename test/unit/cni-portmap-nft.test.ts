import assert from 'node:assert/strict';

import { parseConfig, type ContainerAddr, type PortMapConfig } from '../../cni-plugins/portmap/config.js';
import { checkNft, desiredNft, parseNftTable, renderNftAdd, renderNftDelete, rulesOfContainer } from '../../cni-plugins/portmap/nftrules.js';
import { parseProcRoutes, routeInterface, udpPortsInConntrack } from '../../cni-plugins/portmap/sys.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

function config(extra: Record<string, unknown>, mappings: unknown[]): PortMapConfig {
  return parseConfig(
    { cniVersion: '1.0.0', name: 'n1', type: 'portmap', backend: 'nftables', runtimeConfig: { portMappings: mappings }, ...extra },
    { defaultBackend: () => 'iptables' },
  );
}

const V4: ContainerAddr = { ip: IPAddr.parse('10.244.77.2'), net: IPNet.parse('10.244.77.2/24') };
const V6: ContainerAddr = { ip: IPAddr.parse('fd00::2'), net: IPNet.parse('fd00::2/64') };
const MAPPINGS = [
  { hostPort: 8080, containerPort: 80, protocol: 'tcp' },
  { hostPort: 8081, containerPort: 81, protocol: 'sctp', hostIP: '10.0.0.1' },
  { hostPort: 8082, containerPort: 82, protocol: 'udp', hostIP: 'fd00::1' },
];

/** `nft -a list table ip cni_hostport` after an ADD of ctr00 (nft 1.0.6). */
const LISTED = `table ip cni_hostport { # handle 7
	comment "CNI portmap plugin"
	chain hostports { # handle 1
		tcp dport 8080 dnat to 10.244.77.2:80 comment "ctr00" # handle 11
		ip daddr 10.0.0.1 sctp dport 8081 dnat to 10.244.77.2:81 comment "ctr00" # handle 12
		tcp dport 9090 dnat to 10.244.77.9:90 comment "other" # handle 17
	}

	chain hostip_hostports { # handle 2
	}

	chain hostports_all { # handle 3
		jump hostip_hostports # handle 4
		jump hostports # handle 5
	}

	chain prerouting { # handle 6
		type nat hook prerouting priority dstnat; policy accept;
		fib daddr type local jump hostports_all # handle 7
	}

	chain output { # handle 8
		type nat hook output priority -100; policy accept;
		fib daddr type local jump hostports_all # handle 9
	}

	chain masquerading { # handle 10
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.244.77.2 ip daddr 10.244.77.2 masquerade comment "ctr00" # handle 13
		ip saddr 127.0.0.1 ip daddr 10.244.77.2 masquerade comment "ctr00" # handle 14
	}
}
`;

describe('portmap nftables rules', () => {
  it('renders one rule per mapping of the family and the masquerade rules', () => {
    const c = config({}, MAPPINGS);
    const v4 = desiredNft(c, 'ctr00', 4, V4);
    assert.deepEqual(v4.hostports, [
      'tcp dport 8080 dnat to 10.244.77.2:80 comment "ctr00"',
      'ip daddr 10.0.0.1 sctp dport 8081 dnat to 10.244.77.2:81 comment "ctr00"',
    ]);
    assert.deepEqual(v4.masquerading, [
      'ip saddr 10.244.77.2 ip daddr 10.244.77.2 masquerade comment "ctr00"',
      'ip saddr 127.0.0.1 ip daddr 10.244.77.2 masquerade comment "ctr00"',
    ]);
    const v6 = desiredNft(c, 'ctr00', 6, V6);
    assert.deepEqual(v6.hostports, ['tcp dport 8080 dnat to [fd00::2]:80 comment "ctr00"', 'ip6 daddr fd00::1 udp dport 8082 dnat to [fd00::2]:82 comment "ctr00"']);
    assert.deepEqual(v6.masquerading, ['ip6 saddr fd00::2 ip6 daddr fd00::2 masquerade comment "ctr00"']);
    assert.deepEqual(desiredNft(config({ masqAll: true }, MAPPINGS), 'c', 4, V4).masquerading, ['ip saddr 0.0.0.0/0 ip daddr 10.244.77.2 masquerade comment "c"']);
    assert.deepEqual(desiredNft(config({ snat: false }, MAPPINGS), 'c', 4, V4).masquerading, []);
  });

  it('writes one script: structure, hooks with conditions, stale rules out, new rules in', () => {
    const c = config({ conditionsV4: ['ip', 'daddr', '!=', '192.0.2.0/24'] }, [MAPPINGS[0]]);
    const table = parseNftTable('ip', LISTED);
    const script = renderNftAdd([desiredNft(c, 'ctr00', 4, V4)], new Map([['ip', rulesOfContainer(table, 'ctr00')]]));
    assert.equal(
      script,
      [
        'add table ip cni_hostport { comment "CNI portmap plugin" ; }',
        'add chain ip cni_hostport hostports',
        'add chain ip cni_hostport hostip_hostports',
        'add chain ip cni_hostport hostports_all',
        'flush chain ip cni_hostport hostports_all',
        'add rule ip cni_hostport hostports_all jump hostip_hostports',
        'add rule ip cni_hostport hostports_all jump hostports',
        'add chain ip cni_hostport prerouting { type nat hook prerouting priority dstnat ; }',
        'flush chain ip cni_hostport prerouting',
        'add rule ip cni_hostport prerouting ip daddr != 192.0.2.0/24 fib daddr type local jump hostports_all',
        'add chain ip cni_hostport output { type nat hook output priority -100 ; }',
        'flush chain ip cni_hostport output',
        'add rule ip cni_hostport output ip daddr != 192.0.2.0/24 fib daddr type local jump hostports_all',
        'add chain ip cni_hostport masquerading { type nat hook postrouting priority srcnat ; }',
        'delete rule ip cni_hostport hostports handle 11',
        'delete rule ip cni_hostport hostports handle 12',
        'delete rule ip cni_hostport masquerading handle 13',
        'delete rule ip cni_hostport masquerading handle 14',
        'add rule ip cni_hostport hostports tcp dport 8080 dnat to 10.244.77.2:80 comment "ctr00"',
        'add rule ip cni_hostport masquerading ip saddr 10.244.77.2 ip daddr 10.244.77.2 masquerade comment "ctr00"',
        'add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr 10.244.77.2 masquerade comment "ctr00"',
        '',
      ].join('\n'),
    );
  });

  it('parses a listed table and deletes only the container’s rules', () => {
    const table = parseNftTable('ip', LISTED);
    assert.deepEqual([...table.chains.keys()], ['hostports', 'hostip_hostports', 'hostports_all', 'prerouting', 'output', 'masquerading']);
    assert.deepEqual(table.chains.get('hostip_hostports'), []);
    assert.deepEqual(table.chains.get('prerouting'), [{ text: 'fib daddr type local jump hostports_all', handle: 7, comment: null }]);
    assert.equal(
      renderNftDelete(new Map([['ip', rulesOfContainer(table, 'other')]])),
      'delete rule ip cni_hostport hostports handle 17\n',
    );
    assert.equal(renderNftDelete(new Map([['ip', rulesOfContainer(table, 'gone')]])), null);
  });

  it('checks the listed table against the wanted rules', () => {
    const c = config({}, MAPPINGS);
    const table = parseNftTable('ip', LISTED);
    assert.deepEqual(checkNft(desiredNft(c, 'ctr00', 4, V4), table), []);
    assert.deepEqual(checkNft(desiredNft(c, 'ctr00', 4, V4), null), ['table ip cni_hostport not found']);
    const broken = parseNftTable('ip', LISTED.replace(/\t\tip saddr 127.*\n/, '').replace(/\t\tfib daddr type local jump hostports_all # handle 9\n/, ''));
    assert.deepEqual(checkNft(desiredNft(c, 'ctr00', 4, V4), broken), [
      'rule "ip saddr 127.0.0.1 ip daddr 10.244.77.2 masquerade comment "ctr00"" not found in chain ip cni_hostport masquerading',
      'no jump to hostports_all in chain ip cni_hostport output',
    ]);
  });
});

describe('portmap route_localnet interface lookup', () => {
  const PROC_ROUTE = [
    'Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT',
    'eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0',
    'cni0\t004DF40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0',
    'wide\t0000F40A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0',
    'down\t024DF40A\t00000000\t0000\t0\t0\t0\tFFFFFFFF\t0\t0\t0',
    '',
  ].join('\n');

  it('picks the longest matching up route', () => {
    const routes = parseProcRoutes(PROC_ROUTE);
    assert.equal(routes.length, 3);
    assert.equal(routeInterface(routes, IPAddr.parse('10.244.77.2')), 'cni0');
    assert.equal(routeInterface(routes, IPAddr.parse('10.244.1.2')), 'wide');
    assert.equal(routeInterface(routes, IPAddr.parse('8.8.8.8')), 'eth0');
    assert.equal(routeInterface(parseProcRoutes(PROC_ROUTE.split('\n').slice(0, 1).join('\n')), IPAddr.parse('8.8.8.8')), null);
  });
});

describe('portmap conntrack scan', () => {
  const LISTING = [
    'ipv6     10 udp      17 99 src=fd00:0000:0000:0000:0000:0000:0000:0002 dst=fd00:0000:0000:0000:0000:0000:0000:0001 sport=40000 dport=8054 [UNREPLIED] src=fd00::1 dst=fd00::2 sport=8054 dport=40000 mark=0 zone=0 use=2',
    'ipv4     2 udp      17 99 src=192.168.50.2 dst=192.168.50.1 sport=40000 dport=8053 [UNREPLIED] src=192.168.50.1 dst=192.168.50.2 sport=8053 dport=40000 mark=0 zone=0 use=2',
    'ipv4     2 udp      17 99 src=192.168.50.2 dst=192.168.50.1 sport=8055 dport=9 [UNREPLIED] src=192.168.50.1 dst=192.168.50.2 sport=9 dport=8055 mark=0 zone=0 use=2',
    'ipv4     2 tcp      6 99 ESTABLISHED src=192.168.50.2 dst=192.168.50.1 sport=40000 dport=8056 src=192.168.50.1 dst=192.168.50.2 sport=8056 dport=40000 mark=0 zone=0 use=2',
    '',
  ].join('\n');

  it('finds the mapped UDP ports that have entries, by family and original destination port', () => {
    assert.deepEqual(udpPortsInConntrack(LISTING, 4, [8053, 8054, 8055, 8056]), [8053]);
    assert.deepEqual(udpPortsInConntrack(LISTING, 6, [8053, 8054]), [8054]);
    assert.deepEqual(udpPortsInConntrack('', 4, [8053]), []);
  });
});
