import assert from 'node:assert/strict';
import { leaseFromPeer, mergeRouteLookup, parseSubnetEnvFacts } from '../../src/cli/trace/collect.js';

// Output of iproute2 6.1 `ip -j route get [fibmatch] ...`, captured in a namespace.
const GET_VXLAN = '[{"dst":"10.5.2.3","from":"10.5.1.2","gateway":"10.5.2.0","dev":"flannel.1","flags":[],"cache":[],"iif":"cni0"}]';
const FIB_VXLAN = '[{"dst":"10.5.2.0/24","nhid":1459617792,"gateway":"10.5.2.0","dev":"flannel.1","protocol":"88","flags":["onlink"]}]';
const GET_DEFAULT = '[{"dst":"8.8.8.8","from":"10.5.1.2","gateway":"10.250.0.254","dev":"eth0","flags":[],"cache":[],"iif":"cni0"}]';
const FIB_DEFAULT = '[{"dst":"default","gateway":"10.250.0.254","dev":"eth0","flags":[]}]';
const GET_LOCAL = '[{"type":"local","dst":"10.5.1.1","dev":"lo","prefsrc":"10.5.1.1","flags":[],"uid":0,"cache":["local"]}]';
const FIB_LOCAL = '[{"type":"local","dst":"10.5.1.1","dev":"cni0","protocol":"kernel","scope":"host","prefsrc":"10.5.1.1","flags":[]}]';
const GET_UNDERLAY = '[{"dst":"10.250.0.2","dev":"eth0","prefsrc":"10.250.0.1","flags":[],"uid":0,"cache":[]}]';
const FIB_UNDERLAY = '[{"dst":"10.250.0.0/24","dev":"eth0","protocol":"kernel","scope":"link","prefsrc":"10.250.0.1","flags":[]}]';

describe('trace collect: ip -j route get', () => {
  it('merges the resolved route with the matching table entry', () => {
    const r = mergeRouteLookup(GET_VXLAN, FIB_VXLAN, 4);
    assert.ok(r.ok);
    assert.deepEqual(
      [r.type, r.prefix.toString(), String(r.gateway), r.device, r.protocol, r.onlink, r.nexthopId, r.prefsrc, r.table],
      ['unicast', '10.5.2.0/24', '10.5.2.0', 'flannel.1', '88', true, 1459617792, null, null],
    );
  });

  it('reads default, local and connected routes', () => {
    const d = mergeRouteLookup(GET_DEFAULT, FIB_DEFAULT, 4);
    assert.ok(d.ok);
    assert.deepEqual([d.prefix.toString(), String(d.gateway), d.device, d.protocol], ['0.0.0.0/0', '10.250.0.254', 'eth0', null]);
    const l = mergeRouteLookup(GET_LOCAL, FIB_LOCAL, 4);
    assert.ok(l.ok);
    assert.deepEqual([l.type, l.prefix.toString(), l.device], ['local', '10.5.1.1/32', 'lo']);
    const u = mergeRouteLookup(GET_UNDERLAY, FIB_UNDERLAY, 4);
    assert.ok(u.ok);
    assert.deepEqual([u.prefix.toString(), u.gateway, u.device, String(u.prefsrc), u.protocol], ['10.250.0.0/24', null, 'eth0', '10.250.0.1', 'kernel']);
    const v6 = mergeRouteLookup('[{"dst":"2001:db8::1","dev":"eth0"}]', '[{"dst":"default","dev":"eth0"}]', 6);
    assert.ok(v6.ok);
    assert.equal(v6.prefix.toString(), '::/0');
  });

  it('says when the output cannot be read', () => {
    assert.deepEqual(mergeRouteLookup('', FIB_VXLAN, 4), { ok: false, error: 'unreadable output of ip -j route get' });
    assert.deepEqual(mergeRouteLookup(GET_VXLAN, '[{"dst":"10.5.2.0/99"}]', 4), { ok: false, error: 'unreadable route prefix 10.5.2.0/99' });
  });
});

describe('trace collect: subnet.env and the daemon\'s leases', () => {
  it('reads networks, MTU and the masquerade flag', () => {
    const env = parseSubnetEnvFacts('FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n');
    assert.deepEqual([String(env.network), String(env.subnet), env.ipv6Network, env.mtu, env.ipMasq], ['10.5.0.0/16', '10.5.1.0/24', null, 1450, true]);
    const bare = parseSubnetEnvFacts('FLANNEL_MTU=abc\n');
    assert.deepEqual([bare.network, bare.mtu, bare.ipMasq], [null, null, null]);
  });

  it('turns the peers /status reports into leases', () => {
    const l = leaseFromPeer({ subnet: '10.5.2.0/24', ipv6Subnet: null, publicIP: '10.250.0.2', publicIPv6: null, backendType: 'vxlan', vtepMAC: '0e:00:00:00:00:02', vtepMACv6: null });
    assert.ok(l);
    assert.deepEqual(
      [String(l.subnet), l.ipv6Subnet, String(l.attrs.publicIP), l.attrs.backendType, l.attrs.backendData, l.attrs.backendV6Data],
      ['10.5.2.0/24', null, '10.250.0.2', 'vxlan', { VtepMAC: '0e:00:00:00:00:02' }, undefined],
    );
    assert.equal(leaseFromPeer({ subnet: null, ipv6Subnet: null, publicIP: 'bogus', publicIPv6: null, backendType: null, vtepMAC: null, vtepMACv6: null }), null);
  });
});
