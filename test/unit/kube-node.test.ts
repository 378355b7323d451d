import assert from 'node:assert/strict';
import { encodeLeaseAttrs } from '../../src/subnet/codec.js';
import { parseNetworkConfig, type NetworkConfig } from '../../src/subnet/config.js';
import { annotationNames, desiredAnnotations } from '../../src/subnet/kube/annotations.js';
import {
  annotationPatch,
  leaseChanged,
  metaTime,
  networkUnavailablePatch,
  nodeToLease,
  ownPodCIDRs,
  PodCIDRError,
  STRATEGIC_MERGE_PATCH,
  type NodeLeaseResult,
} from '../../src/subnet/kube/node.js';
import type { KubeNode } from '../../src/subnet/kube/objects.js';
import type { Lease, LeaseAttrs } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const N = annotationNames();
const MAC = '12:c6:65:89:b4:e3';
const MAC6 = '6a:3e:11:22:33:44';

function config(text: string): NetworkConfig {
  return parseNetworkConfig(text, { knownBackends: ['vxlan', 'host-gw'], checkSubnets: false });
}
const V4 = config('{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}');
const DUAL = config('{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}');
const V6 = config('{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}');

/** A Node as flanneld v0.28 leaves it: kubelet's and flannel's annotations, podCIDR(s) set by kube-controller-manager. */
function flannelNode(): KubeNode {
  return {
    metadata: {
      name: 'worker-1',
      resourceVersion: '48211',
      annotations: {
        'flannel.alpha.coreos.com/backend-data': '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}',
        'flannel.alpha.coreos.com/backend-type': 'vxlan',
        'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
        'flannel.alpha.coreos.com/public-ip': '192.168.64.3',
        'kubeadm.alpha.kubernetes.io/cri-socket': 'unix:///var/run/containerd/containerd.sock',
        'node.alpha.kubernetes.io/ttl': '0',
        'volumes.kubernetes.io/controller-managed-attach-detach': 'true',
      },
    },
    spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24'] },
  };
}

function dualNode(): KubeNode {
  const n = flannelNode();
  return {
    metadata: {
      ...n.metadata,
      annotations: {
        ...n.metadata.annotations,
        'flannel.alpha.coreos.com/backend-v6-data': `{"VNI":1,"VtepMAC":"${MAC6}"}`,
        'flannel.alpha.coreos.com/public-ipv6': 'fd00::3',
      },
    },
    spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00:10:244:1::/64'] },
  };
}

function withAnnotations(n: KubeNode, changes: Record<string, string | null>): KubeNode {
  const annotations: Record<string, string> = { ...n.metadata.annotations };
  for (const [k, v] of Object.entries(changes)) {
    if (v === null) delete annotations[k];
    else annotations[k] = v;
  }
  return { ...n, metadata: { ...n.metadata, annotations } };
}

function withSpec(n: KubeNode, spec: KubeNode['spec']): KubeNode {
  return spec === undefined ? { metadata: n.metadata } : { ...n, spec };
}

function leaseOf(r: NodeLeaseResult): Lease {
  assert.ok('lease' in r, `expected a lease, got skip: ${'skip' in r ? r.skip : ''}`);
  return r.lease;
}

function skipOf(r: NodeLeaseResult): { skip: string; managed: boolean } {
  assert.ok('skip' in r, 'expected a skip');
  return r;
}

describe('kube nodeToLease', () => {
  it('accepts a Node as flanneld writes it', () => {
    const lease = leaseOf(nodeToLease(flannelNode(), N, V4));
    assert.equal(lease.subnet?.toString(), '10.244.1.0/24');
    assert.equal(lease.ipv6Subnet, null);
    assert.equal(lease.attrs.publicIP.toString(), '192.168.64.3');
    assert.equal(lease.attrs.publicIPv6, null);
    assert.equal(lease.attrs.backendType, 'vxlan');
    assert.deepEqual(lease.attrs.backendData, { VNI: 1, VtepMAC: MAC });
    assert.equal(lease.attrs.backendV6Data, undefined);
    assert.equal(lease.reservation, false);
    assert.equal(lease.expiration, null);
    // the same lease as flannel's etcd value (Documentation/reservations.md shape)
    assert.equal(
      encodeLeaseAttrs(lease.attrs),
      '{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}}',
    );
  });

  it('accepts a dual-stack Node, and ignores the family the config disables', () => {
    const lease = leaseOf(nodeToLease(dualNode(), N, DUAL));
    assert.equal(lease.subnet?.toString(), '10.244.1.0/24');
    assert.equal(lease.ipv6Subnet?.toString(), 'fd00:10:244:1::/64');
    assert.equal(lease.attrs.publicIPv6?.toString(), 'fd00::3');
    assert.deepEqual(lease.attrs.backendV6Data, { VNI: 1, VtepMAC: MAC6 });

    const v4only = leaseOf(nodeToLease(dualNode(), N, V4));
    assert.equal(v4only.ipv6Subnet, null);
    assert.equal(v4only.attrs.publicIPv6, null);
    assert.equal(v4only.attrs.backendV6Data, undefined);

    const v6only = leaseOf(nodeToLease(withAnnotations(dualNode(), { [N.publicIP]: 'garbage' }), N, V6));
    assert.equal(v6only.subnet, null);
    assert.equal(v6only.attrs.publicIP.toString(), '0.0.0.0');
    assert.equal(v6only.attrs.backendData, undefined);
    assert.equal(v6only.ipv6Subnet?.toString(), 'fd00:10:244:1::/64');
  });

  it('accepts what weft publishes, and flannel’s parse of it gives the same values', () => {
    const attrs: LeaseAttrs = {
      publicIP: IPAddr.parse('10.0.0.7'),
      publicIPv6: IPAddr.parse('fd00::7'),
      backendType: 'vxlan',
      backendData: { VNI: 1, VtepMAC: MAC },
      backendV6Data: { VNI: 1, VtepMAC: MAC6 },
    };
    const desired = desiredAnnotations(N, attrs, 'vxlan');
    const n: KubeNode = {
      metadata: { name: 'weft-1', annotations: desired },
      spec: { podCIDR: '10.244.7.0/24', podCIDRs: ['10.244.7.0/24', 'fd00:10:244:7::/64'] },
    };
    const lease = leaseOf(nodeToLease(n, N, DUAL));
    assert.deepEqual(lease.attrs, attrs);
    // flannel's rules: ip.ParseIP4 / ParseIP6 on the text, RawMessage of the data, VtepMAC a Go MAC string
    assert.match(desired[N.publicIP]!, /^\d+\.\d+\.\d+\.\d+$/);
    assert.equal(desired[N.publicIPv6], 'fd00::7');
    assert.equal(desired[N.backendData], '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}');
    assert.equal(desired[N.backendV6Data], '{"VNI":1,"VtepMAC":"6a:3e:11:22:33:44"}');
    assert.equal(desired[N.kubeSubnetManager], 'true');
  });

  it('takes spec.podCIDR when spec.podCIDRs is empty, masking host bits as Go does', () => {
    const lease = leaseOf(nodeToLease(withSpec(flannelNode(), { podCIDR: '10.244.1.5/24' }), N, V4));
    assert.equal(lease.subnet?.toString(), '10.244.1.0/24');
  });

  it('keeps absent backend-type and backend-data absent', () => {
    const n = withAnnotations(flannelNode(), { [N.backendType]: null, [N.backendData]: null });
    const lease = leaseOf(nodeToLease(n, N, V4));
    assert.deepEqual(lease.attrs, { publicIP: IPAddr.parse('192.168.64.3'), publicIPv6: null });
    const hostgw = leaseOf(nodeToLease(withAnnotations(flannelNode(), { [N.backendType]: 'host-gw', [N.backendData]: 'null' }), N, V4));
    assert.equal(hostgw.attrs.backendType, 'host-gw');
    assert.equal(hostgw.attrs.backendData, null);
  });

  it('quietly skips nodes not managed by flannel', () => {
    for (const v of [null, 'false', 'True', '']) {
      assert.deepEqual(nodeToLease(withAnnotations(flannelNode(), { [N.kubeSubnetManager]: v }), N, V4), {
        skip: 'node "worker-1": no annotation flannel.alpha.coreos.com/kube-subnet-manager="true"',
        managed: false,
      });
    }
    assert.equal(skipOf(nodeToLease({ metadata: { name: 'bare' } }, N, V4)).managed, false);
  });

  it('skips a managed node whose public IP does not parse, naming node and annotation', () => {
    const cases: Array<[NetworkConfig, Record<string, string | null>, string]> = [
      [V4, { [N.publicIP]: 'garbage' }, 'node "worker-1": annotation flannel.alpha.coreos.com/public-ip="garbage": not an IPv4 address'],
      [V4, { [N.publicIP]: 'fd00::3' }, 'node "worker-1": annotation flannel.alpha.coreos.com/public-ip="fd00::3": not an IPv4 address'],
      [V4, { [N.publicIP]: '' }, 'node "worker-1": annotation flannel.alpha.coreos.com/public-ip="": not an IPv4 address'],
      [V4, { [N.publicIP]: null }, 'node "worker-1": annotation flannel.alpha.coreos.com/public-ip="": missing'],
      [DUAL, { [N.publicIPv6]: null }, 'node "worker-1": annotation flannel.alpha.coreos.com/public-ipv6="": missing'],
      [DUAL, { [N.publicIPv6]: '10.1.1.1' }, 'node "worker-1": annotation flannel.alpha.coreos.com/public-ipv6="10.1.1.1": not an IPv6 address'],
    ];
    for (const [cfg, changes, reason] of cases) {
      assert.deepEqual(nodeToLease(withAnnotations(dualNode(), changes), N, cfg), { skip: reason, managed: true });
    }
  });

  it('skips a managed node whose backend data is not JSON', () => {
    const r = skipOf(nodeToLease(withAnnotations(flannelNode(), { [N.backendData]: '{"VNI":1,' }), N, V4));
    assert.equal(r.managed, true);
    assert.match(r.skip, /^node "worker-1": annotation flannel\.alpha\.coreos\.com\/backend-data="\{\\"VNI\\":1,": not valid JSON \(/);
    const r6 = skipOf(nodeToLease(withAnnotations(dualNode(), { [N.backendV6Data]: 'VtepMAC=x' }), N, DUAL));
    assert.match(r6.skip, /^node "worker-1": annotation flannel\.alpha\.coreos\.com\/backend-v6-data="VtepMAC=x": not valid JSON/);
  });

  it('skips a managed node whose podCIDRs do not give a subnet', () => {
    const cases: Array<[KubeNode['spec'], NetworkConfig, string]> = [
      [undefined, V4, 'node "worker-1" pod cidr not assigned'],
      [{ podCIDR: '' }, V4, 'node "worker-1" pod cidr not assigned'],
      [{ podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00::/64', '10.244.2.0/24'] }, V4,
        'node "worker-1" pod cidrs should be IPv4/IPv6 only or dualstack'],
      [{ podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', '10.244.2.0/24'] }, V4,
        'node "worker-1" pod cidrs should be IPv4/IPv6 only or dualstack'],
      [{ podCIDR: '10.244.1.0/33' }, V4, 'node "worker-1": invalid CIDR address: 10.244.1.0/33'],
      [{ podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'garbage'] }, V4, 'node "worker-1": invalid CIDR address: garbage'],
      [{ podCIDR: 'fd00:10:244:1::/64' }, V4, 'node "worker-1": missing IPv4 address on spec.podCIDRs'],
      [{ podCIDR: '10.244.1.0/24' }, DUAL, 'node "worker-1": missing IPv6 address on spec.podCIDRs'],
    ];
    for (const [spec, cfg, reason] of cases) {
      assert.deepEqual(nodeToLease(withSpec(dualNode(), spec), N, cfg), { skip: reason, managed: true }, reason);
    }
  });

  it('reads annotations under a custom prefix', () => {
    const n2 = annotationNames('example.com/net');
    const n: KubeNode = {
      metadata: {
        name: 'c1',
        annotations: {
          'example.com/net-kube-subnet-manager': 'true',
          'example.com/net-public-ip': '10.1.2.3',
          'example.com/net-backend-type': 'host-gw',
          'example.com/net-backend-data': 'null',
        },
      },
      spec: { podCIDR: '10.244.9.0/24' },
    };
    const lease = leaseOf(nodeToLease(n, n2, V4));
    assert.equal(lease.attrs.publicIP.toString(), '10.1.2.3');
    assert.equal(skipOf(nodeToLease(n, N, V4)).managed, false);
  });
});

describe('kube ownPodCIDRs', () => {
  function rejects(n: KubeNode, cfg: NetworkConfig, problem: string, message: string): void {
    assert.throws(
      () => ownPodCIDRs(n, cfg),
      (e: unknown) => {
        assert.ok(e instanceof PodCIDRError, String(e));
        assert.equal(e.name, 'PodCIDRError');
        assert.equal(e.node, 'worker-1');
        assert.equal(e.problem, problem);
        assert.equal(e.message, message);
        return true;
      },
    );
  }

  it('returns the subnets of the enabled families', () => {
    const v4 = ownPodCIDRs(flannelNode(), V4);
    assert.equal(v4.subnet?.toString(), '10.244.1.0/24');
    assert.equal(v4.ipv6Subnet, null);
    const dual = ownPodCIDRs(dualNode(), DUAL);
    assert.equal(dual.subnet?.toString(), '10.244.1.0/24');
    assert.equal(dual.ipv6Subnet?.toString(), 'fd00:10:244:1::/64');
    // a CIDR of a disabled family is ignored, as flannel does
    assert.equal(ownPodCIDRs(dualNode(), V4).ipv6Subnet, null);
    const v6 = ownPodCIDRs(withSpec(dualNode(), { podCIDR: 'fd00:10:244:1::/64' }), V6);
    assert.equal(v6.subnet, null);
    assert.equal(v6.ipv6Subnet?.toString(), 'fd00:10:244:1::/64');
    // the whole Network is a valid pod CIDR (containment includes equality)
    assert.equal(ownPodCIDRs(withSpec(flannelNode(), { podCIDR: '10.244.0.0/16' }), V4).subnet?.toString(), '10.244.0.0/16');
  });

  it('gives flannel’s error when spec.podCIDR is not set, even with spec.podCIDRs', () => {
    rejects(withSpec(flannelNode(), undefined), V4, 'not-assigned', 'node "worker-1" pod cidr not assigned');
    rejects(withSpec(flannelNode(), { podCIDR: '', podCIDRs: ['10.244.1.0/24'] }), V4, 'not-assigned',
      'node "worker-1" pod cidr not assigned');
  });

  it('gives flannel’s error for more than two pod CIDRs', () => {
    rejects(withSpec(flannelNode(), { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00::/64', '10.3.0.0/24'] }),
      V4, 'count', 'node "worker-1" pod cidrs should be IPv4/IPv6 only or dualstack');
  });

  it('gives flannel’s errors for a pod CIDR outside the configured network', () => {
    rejects(withSpec(flannelNode(), { podCIDR: '10.0.1.0/24' }), V4, 'outside-network',
      'subnet "10.244.0.0/16" specified in the flannel net config doesn\'t contain "10.0.1.0/24" PodCIDR of the "worker-1" node');
    // a larger prefix around the Network is not inside it
    rejects(withSpec(flannelNode(), { podCIDR: '10.0.0.0/8' }), V4, 'outside-network',
      'subnet "10.244.0.0/16" specified in the flannel net config doesn\'t contain "10.0.0.0/8" PodCIDR of the "worker-1" node');
    rejects(withSpec(dualNode(), { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00:99::/64'] }), DUAL,
      'outside-network',
      'subnet "fd00:10:244::/56" specified in the flannel net config doesn\'t contain "fd00:99::/64" IPv6 PodCIDR of the "worker-1" node');
  });

  it('refuses an enabled family without a pod CIDR (flannel goes on with an empty subnet)', () => {
    rejects(flannelNode(), DUAL, 'family-missing',
      'node "worker-1" has no IPv6 pod cidr (["10.244.1.0/24"]) but EnableIPv6 is true');
    rejects(withSpec(flannelNode(), { podCIDR: 'fd00:10:244:1::/64' }), V4, 'family-missing',
      'node "worker-1" has no IPv4 pod cidr (["fd00:10:244:1::/64"]) but EnableIPv4 is true');
  });

  it('refuses a pod CIDR that does not parse', () => {
    rejects(withSpec(flannelNode(), { podCIDR: '10.244.1/24' }), V4, 'invalid', 'node "worker-1": invalid CIDR address: 10.244.1/24');
  });
});

describe('kube annotationPatch', () => {
  const attrs: LeaseAttrs = {
    publicIP: IPAddr.parse('192.168.64.3'),
    publicIPv6: null,
    backendType: 'vxlan',
    backendData: { VNI: 1, VtepMAC: MAC },
  };
  const fresh: KubeNode = {
    metadata: { name: 'worker-1', resourceVersion: '77', annotations: { 'node.alpha.kubernetes.io/ttl': '0' } },
    spec: { podCIDR: '10.244.1.0/24' },
  };

  it('patches nodes/NAME/status with the changed annotations, keys sorted, with a resourceVersion precondition', () => {
    assert.deepEqual(annotationPatch(fresh, desiredAnnotations(N, attrs, 'vxlan')), {
      node: 'worker-1',
      subresource: 'status',
      contentType: 'application/strategic-merge-patch+json',
      body:
        '{"metadata":{"annotations":{' +
        '"flannel.alpha.coreos.com/backend-data":"{\\"VNI\\":1,\\"VtepMAC\\":\\"12:c6:65:89:b4:e3\\"}",' +
        '"flannel.alpha.coreos.com/backend-type":"vxlan",' +
        '"flannel.alpha.coreos.com/kube-subnet-manager":"true",' +
        '"flannel.alpha.coreos.com/public-ip":"192.168.64.3"},' +
        '"resourceVersion":"77"}}',
    });
    assert.equal(STRATEGIC_MERGE_PATCH, 'application/strategic-merge-patch+json');
  });

  it('gives flannel’s exact two-way merge patch body without the precondition', () => {
    const p = annotationPatch(fresh, desiredAnnotations(N, attrs, 'vxlan'), { precondition: false });
    assert.equal(
      p?.body,
      '{"metadata":{"annotations":{' +
        '"flannel.alpha.coreos.com/backend-data":"{\\"VNI\\":1,\\"VtepMAC\\":\\"12:c6:65:89:b4:e3\\"}",' +
        '"flannel.alpha.coreos.com/backend-type":"vxlan",' +
        '"flannel.alpha.coreos.com/kube-subnet-manager":"true",' +
        '"flannel.alpha.coreos.com/public-ip":"192.168.64.3"}}}',
    );
    // the body is what flannel would send, as a JSON value
    assert.deepEqual(JSON.parse(p.body), {
      metadata: { annotations: desiredAnnotations(N, attrs, 'vxlan') },
    });
  });

  it('is null when the node already carries every value (flannel’s own node included)', () => {
    assert.equal(annotationPatch(flannelNode(), desiredAnnotations(N, attrs, 'vxlan')), null);
  });

  it('carries only what differs', () => {
    const moved = { ...attrs, publicIP: IPAddr.parse('192.168.64.4') };
    assert.equal(
      annotationPatch(flannelNode(), desiredAnnotations(N, moved, 'vxlan'))?.body,
      '{"metadata":{"annotations":{"flannel.alpha.coreos.com/public-ip":"192.168.64.4"},"resourceVersion":"48211"}}',
    );
    // an overwrite already published leaves nothing to do; a new one is patched in
    const natted = withAnnotations(flannelNode(), { [N.publicIPOverwrite]: '203.0.113.7', [N.publicIP]: '203.0.113.7' });
    const over = { publicIP: IPAddr.parse('203.0.113.7'), publicIPv6: null };
    assert.equal(annotationPatch(natted, desiredAnnotations(N, attrs, 'vxlan', over)), null);
    assert.equal(
      annotationPatch(flannelNode(), desiredAnnotations(N, attrs, 'vxlan', over))?.body,
      '{"metadata":{"annotations":{"flannel.alpha.coreos.com/public-ip":"203.0.113.7"},"resourceVersion":"48211"}}',
    );
  });

  it('handles a node without annotations or resourceVersion', () => {
    const bare: KubeNode = { metadata: { name: 'n0' } };
    assert.equal(
      annotationPatch(bare, { [N.kubeSubnetManager]: 'true' })?.body,
      '{"metadata":{"annotations":{"flannel.alpha.coreos.com/kube-subnet-manager":"true"}}}',
    );
  });
});

describe('kube networkUnavailablePatch', () => {
  const now = new Date('2024-05-06T07:08:09.789Z');

  it('sets NetworkUnavailable=False as flannel’s CompleteLease does', () => {
    assert.deepEqual(networkUnavailablePatch(flannelNode(), now), {
      node: 'worker-1',
      subresource: 'status',
      contentType: 'application/strategic-merge-patch+json',
      body:
        '{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False",' +
        '"lastHeartbeatTime":"2024-05-06T07:08:09Z","lastTransitionTime":"2024-05-06T07:08:09Z",' +
        '"reason":"FlannelIsUp","message":"Flannel is running on this node"}]}}',
    });
  });

  it('keeps lastTransitionTime when the condition is already False, resets it otherwise', () => {
    const status = (s: string): KubeNode => ({
      ...flannelNode(),
      status: {
        conditions: [
          { type: 'Ready', status: 'True', lastTransitionTime: '2020-01-01T00:00:00Z' },
          { type: 'NetworkUnavailable', status: s, lastTransitionTime: '2024-01-01T00:00:00Z', reason: 'FlannelIsUp' },
        ],
      },
    });
    assert.match(networkUnavailablePatch(status('False'), now).body,
      /"lastHeartbeatTime":"2024-05-06T07:08:09Z","lastTransitionTime":"2024-01-01T00:00:00Z"/);
    assert.match(networkUnavailablePatch(status('True'), now).body,
      /"lastHeartbeatTime":"2024-05-06T07:08:09Z","lastTransitionTime":"2024-05-06T07:08:09Z"/);
  });

  it('formats times as metav1.Time does', () => {
    assert.equal(metaTime(new Date('1999-12-31T23:59:59.999Z')), '1999-12-31T23:59:59Z');
    assert.equal(metaTime(new Date(Date.UTC(2030, 0, 2, 3, 4, 5))), '2030-01-02T03:04:05Z');
    assert.throws(() => metaTime(new Date('nope')), RangeError);
  });
});

describe('kube leaseChanged', () => {
  const base = leaseOf(nodeToLease(dualNode(), N, DUAL));
  const changed = (changes: Record<string, string | null>, spec?: KubeNode['spec']): boolean => {
    let n = withAnnotations(dualNode(), changes);
    if (spec) n = withSpec(n, spec);
    return leaseChanged(base, leaseOf(nodeToLease(n, N, DUAL)));
  };

  it('is false for the same node, and for data that differs only in key order or spacing', () => {
    assert.equal(changed({}), false);
    assert.equal(changed({ [N.backendData]: ` { "VtepMAC" : "${MAC}", "VNI" : 1 } ` }), false);
    // unrelated annotations do not count
    assert.equal(changed({ 'node.alpha.kubernetes.io/ttl': '30' }), false);
  });

  it('is true when v4 backend data, type or public IP change', () => {
    assert.equal(changed({ [N.backendData]: '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e4"}' }), true);
    assert.equal(changed({ [N.backendData]: '{"VNI":2,"VtepMAC":"12:c6:65:89:b4:e3"}' }), true);
    assert.equal(changed({ [N.backendType]: 'host-gw' }), true);
    assert.equal(changed({ [N.publicIP]: '192.168.64.9' }), true);
  });

  it('is true for v6-only and podCIDR-only changes, which flannel misses', () => {
    assert.equal(changed({ [N.backendV6Data]: '{"VNI":1,"VtepMAC":"6a:3e:11:22:33:45"}' }), true);
    assert.equal(changed({ [N.publicIPv6]: 'fd00::4' }), true);
    assert.equal(changed({}, { podCIDR: '10.244.2.0/24', podCIDRs: ['10.244.2.0/24', 'fd00:10:244:1::/64'] }), true);
    assert.equal(changed({}, { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00:10:244:2::/64'] }), true);
  });

  it('treats an absent backend type like an empty one, and absent data like null', () => {
    const a: Lease = { subnet: IPNet.parse('10.244.1.0/24'), ipv6Subnet: null, reservation: false, expiration: null,
      attrs: { publicIP: IPAddr.parse('10.0.0.1'), publicIPv6: null } };
    const b: Lease = { ...a, attrs: { ...a.attrs, backendType: '', backendData: null } };
    assert.equal(leaseChanged(a, b), false);
    assert.equal(leaseChanged(a, { ...a, attrs: { ...a.attrs, backendData: [1] } }), true);
    assert.equal(leaseChanged({ ...a, attrs: { ...a.attrs, backendData: [1, 2] } }, { ...a, attrs: { ...a.attrs, backendData: [1, 3] } }), true);
    assert.equal(leaseChanged({ ...a, attrs: { ...a.attrs, backendData: { x: 1 } } }, { ...a, attrs: { ...a.attrs, backendData: { y: 1 } } }), true);
  });
});
