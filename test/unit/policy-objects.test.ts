// Parsing Namespaces, Pods and NetworkPolicies from the API server's JSON: what the API
// server's validation accepts parses (with its defaults), anything else is refused with an error
// naming the object and the field. Plus the pieces: selectors, CIDRs and excepts, port ranges.
import assert from 'node:assert/strict';

import { PolicyInputError } from '../../src/policy/fields.js';
import { carve, intervalText, mergeIntervals, parsePolicyCIDR } from '../../src/policy/ipblock.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { normalizePorts, resolvePorts } from '../../src/policy/ports.js';
import { matches } from '../../src/policy/selector.js';
import { IPNet } from '../../src/util/ip.js';

function policy(spec: unknown, meta: Record<string, unknown> = { namespace: 'x', name: 'p' }): unknown {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: meta, spec };
}

/** Asserts a PolicyInputError about `field` whose message matches `reason`. */
function refused(fn: () => unknown, field: string, reason: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof PolicyInputError, `not a PolicyInputError: ${String(e)}`);
    assert.equal(e.field, field, e.message);
    assert.match(e.reason, reason);
    return true;
  });
}

const ingressPeer = (peer: unknown) => policy({ podSelector: {}, ingress: [{ from: [peer] }] });
const ingressPort = (port: unknown) => policy({ podSelector: {}, ingress: [{ ports: [port] }] });

describe('policy objects: NetworkPolicy parsing', () => {
  it('parses a full policy with the API defaults (protocol TCP, policyTypes from the rules)', () => {
    const np = parseNetworkPolicy(
      policy({
        podSelector: { matchLabels: { app: 'db' } },
        ingress: [
          {
            from: [
              { ipBlock: { cidr: '172.17.0.0/16', except: ['172.17.1.0/24'] } },
              { namespaceSelector: { matchLabels: { project: 'myproject' } } },
              { podSelector: { matchLabels: { role: 'frontend' } } },
              { namespaceSelector: {}, podSelector: { matchExpressions: [{ key: 'tier', operator: 'NotIn', values: ['web'] }] } },
            ],
            ports: [{ protocol: 'TCP', port: 6379 }, { port: 'metrics' }, { protocol: 'UDP', port: 32000, endPort: 32768 }, { protocol: 'SCTP' }],
          },
        ],
        egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/24' } }] }, {}],
      }),
    );
    assert.equal(np.namespace, 'x');
    assert.ok(np.ingress && np.egress, 'Ingress always, Egress because egress rules exist');
    const r = np.ingress[0]!;
    assert.equal(r.peers?.length, 4);
    const p1 = r.peers?.[1];
    assert.ok(p1?.kind === 'pods' && p1.namespaces !== null && p1.pods.requirements.length === 0, 'namespaceSelector alone: every pod of the matching namespaces');
    assert.equal(r.peers?.[2]?.kind === 'pods' && r.peers[2].namespaces, null, 'podSelector alone: own namespace');
    assert.deepEqual(r.ports, [
      { kind: 'range', protocol: 'TCP', first: 6379, last: 6379 },
      { kind: 'named', protocol: 'TCP', name: 'metrics' },
      { kind: 'range', protocol: 'UDP', first: 32000, last: 32768 },
      { kind: 'range', protocol: 'SCTP', first: 0, last: 65535 },
    ]);
    assert.equal(np.egress[1]!.peers, null, 'empty `to` is every destination');
    assert.equal(np.egress[1]!.ports, null, 'empty `ports` is every port');
  });

  it('applies policyTypes: no egress rules means Ingress only; an undeclared direction is ignored', () => {
    assert.equal(parseNetworkPolicy(policy({ podSelector: {} })).egress, null);
    assert.deepEqual(parseNetworkPolicy(policy({ podSelector: {}, egress: [] })).egress, null, 'egress: [] does not make it an Egress policy');
    const np = parseNetworkPolicy(policy({ podSelector: {}, policyTypes: ['Egress'], ingress: [{}] }));
    assert.equal(np.ingress, null);
    assert.deepEqual(np.egress, []);
    refused(() => parseNetworkPolicy(policy({ policyTypes: ['ingress'] })), 'spec.policyTypes[0]', /not supported/);
    refused(() => parseNetworkPolicy(policy({ policyTypes: ['Ingress', 'Egress', 'Ingress'] })), 'spec.policyTypes', /more than two/);
  });

  it('refuses bad label keys and values in selectors', () => {
    const bad: Array<[Record<string, unknown>, string, RegExp]> = [
      [{ 'a/b/c': 'v' }, 'spec.podSelector.matchLabels["a/b/c"]', /qualified name/],
      [{ '-app': 'v' }, 'spec.podSelector.matchLabels["-app"]', /start and end with an alphanumeric/],
      [{ ['k'.repeat(64)]: 'v' }, `spec.podSelector.matchLabels["${'k'.repeat(64)}"]`, /63 characters/],
      [{ 'Example.com/app': 'v' }, 'spec.podSelector.matchLabels["Example.com/app"]', /prefix part must be a lowercase RFC 1123 subdomain/],
      [{ '/app': 'v' }, 'spec.podSelector.matchLabels["/app"]', /prefix part must not be empty/],
      [{ app: 'v'.repeat(64) }, 'spec.podSelector.matchLabels["app"]', /no more than 63/],
      [{ app: 'bad value' }, 'spec.podSelector.matchLabels["app"]', /label value/],
      [{ app: 7 }, 'spec.podSelector.matchLabels["app"]', /must be a string/],
    ];
    for (const [labels, field, reason] of bad) refused(() => parseNetworkPolicy(policy({ podSelector: { matchLabels: labels } })), field, reason);
    // "__proto__" from JSON is an own key like any other, and not a valid label key.
    refused(() => parseNetworkPolicy(JSON.parse('{"metadata":{"namespace":"x","name":"p"},"spec":{"podSelector":{"matchLabels":{"__proto__":"v"}}}}')), 'spec.podSelector.matchLabels["__proto__"]', /alphanumeric/);
    // Valid edge cases: empty value, prefixed keys, 63-character values.
    const ok = parseNetworkPolicy(policy({ podSelector: { matchLabels: { 'example.com/app': '', 'a.b_c-d': 'v'.repeat(63), constructor: 'x' } } }));
    assert.equal(matches(ok.podSelector, new Map([['example.com/app', ''], ['a.b_c-d', 'v'.repeat(63)], ['constructor', 'x']])), true);
  });

  it('refuses bad matchExpressions (operator, values rules, keys)', () => {
    const expr = (e: unknown) => policy({ podSelector: { matchExpressions: [e] } });
    refused(() => parseNetworkPolicy(expr({ key: 'a', operator: 'in', values: ['x'] })), 'spec.podSelector.matchExpressions[0].operator', /not a valid selector operator/);
    refused(() => parseNetworkPolicy(expr({ key: 'a', operator: 'In' })), 'spec.podSelector.matchExpressions[0].values', /must be specified/);
    refused(() => parseNetworkPolicy(expr({ key: 'a', operator: 'NotIn', values: [] })), 'spec.podSelector.matchExpressions[0].values', /must be specified/);
    refused(() => parseNetworkPolicy(expr({ key: 'a', operator: 'Exists', values: ['x'] })), 'spec.podSelector.matchExpressions[0].values', /may not be specified/);
    refused(() => parseNetworkPolicy(expr({ key: 'a b', operator: 'Exists' })), 'spec.podSelector.matchExpressions[0].key', /alphanumeric/);
    refused(() => parseNetworkPolicy(expr({ key: 'a', operator: 'In', values: [1] })), 'spec.podSelector.matchExpressions[0].values[0]', /must be a string/);
    refused(() => parseNetworkPolicy(policy({ podSelector: { matchExpressions: {} } })), 'spec.podSelector.matchExpressions', /must be a list/);
    // Values that are not valid label values are kept (the server tolerates them on old objects): they never match.
    const np = parseNetworkPolicy(expr({ key: 'a', operator: 'NotIn', values: ['not a label value!'] }));
    assert.equal(matches(np.podSelector, new Map([['a', 'x']])), true);
    const sel = parseNetworkPolicy(
      policy({
        podSelector: {
          matchLabels: { a: '1' },
          matchExpressions: [
            { key: 'b', operator: 'In', values: ['2', '3'] },
            { key: 'c', operator: 'Exists' },
            { key: 'd', operator: 'DoesNotExist' },
          ],
        },
      }),
    ).podSelector;
    const L = (o: Record<string, string>) => new Map(Object.entries(o));
    assert.equal(matches(sel, L({ a: '1', b: '3', c: '' })), true);
    assert.equal(matches(sel, L({ a: '1', b: '4', c: '' })), false);
    assert.equal(matches(sel, L({ a: '1', b: '2' })), false);
    assert.equal(matches(sel, L({ a: '1', b: '2', c: 'x', d: 'y' })), false);
  });

  it('refuses peers the API refuses: empty, ipBlock mixed with selectors', () => {
    refused(() => parseNetworkPolicy(ingressPeer({})), 'spec.ingress[0].from[0]', /must specify a peer/);
    refused(() => parseNetworkPolicy(ingressPeer({ podSelector: null })), 'spec.ingress[0].from[0]', /must specify a peer/);
    refused(() => parseNetworkPolicy(ingressPeer({ ipBlock: { cidr: '10.0.0.0/8' }, podSelector: {} })), 'spec.ingress[0].from[0]', /both ipBlock and another peer/);
    refused(() => parseNetworkPolicy(policy({ podSelector: {}, egress: [{ to: [{ ipBlock: {} }] }] })), 'spec.egress[0].to[0].ipBlock.cidr', /must be a string/);
    refused(() => parseNetworkPolicy(policy({ podSelector: {}, egress: [{ to: [{ ipBlock: { cidr: '' } }] }] })), 'spec.egress[0].to[0].ipBlock.cidr', /Required/);
  });

  it('refuses bad CIDRs and excepts that are not a strict subset of the cidr', () => {
    const block = (cidr: string, except?: string[]) => parseNetworkPolicy(ingressPeer({ ipBlock: { cidr, except } }));
    for (const bad of ['10.0.0.0', '10.0.0.0/33', '300.0.0.0/8', '::/129', '10.0.0.0/8 ', 'abc/8', '1.2.3.4/-1', 'fe80::1%eth0/64', `${'1'.repeat(100000)}/8`]) {
      refused(() => block(bad), 'spec.ingress[0].from[0].ipBlock.cidr', /valid CIDR/);
    }
    refused(() => block('10.0.0.0/16', ['10.1.0.0/24']), 'spec.ingress[0].from[0].ipBlock.except[0]', /strict subset/);
    refused(() => block('10.0.0.0/16', ['10.0.0.0/16']), 'spec.ingress[0].from[0].ipBlock.except[0]', /strict subset/);
    refused(() => block('10.0.0.0/16', ['10.0.0.0/8']), 'spec.ingress[0].from[0].ipBlock.except[0]', /strict subset/);
    refused(() => block('10.0.0.0/16', ['fd00::/64']), 'spec.ingress[0].from[0].ipBlock.except[0]', /IPv6/);
    refused(() => block('10.0.0.0/16', ['10.0.1.0/24', 'x']), 'spec.ingress[0].from[0].ipBlock.except[1]', /valid CIDR/);
    // Accepted as the server's legacy validation does, with a warning: host bits, leading zeros, IPv4-mapped.
    const np = block('10.0.0.5/8', ['010.1.0.0/16']);
    assert.equal(np.warnings.length, 2);
    assert.match(np.warnings[0]!, /NetworkPolicy x\/p: spec.ingress\[0\].from\[0\].ipBlock.cidr: "10.0.0.5\/8" has host bits set; using the network 10.0.0.0\/8/);
    const peer = np.ingress![0]!.peers![0]!;
    assert.ok(peer.kind === 'ipBlock');
    assert.equal(peer.cidr.toString(), '10.0.0.0/8');
    assert.equal(peer.except[0]!.toString(), '10.1.0.0/16');
    assert.equal(parsePolicyCIDR('::ffff:10.0.0.0/104').net.toString(), '10.0.0.0/8');
    assert.equal(parsePolicyCIDR('2001:DB8::/32').net.toString(), '2001:db8::/32');
  });

  it('enforces the port rules: 1-65535, endPort only with a numeric port and not below it, protocols', () => {
    const P = 'spec.ingress[0].ports[0]';
    refused(() => parseNetworkPolicy(ingressPort({ port: 0 })), `${P}.port`, /between 1 and 65535/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 65536 })), `${P}.port`, /between 1 and 65535/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 80.5 })), `${P}.port`, /integer/);
    refused(() => parseNetworkPolicy(ingressPort({ port: '80' })), `${P}.port`, /at least one letter/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 'a--b' })), `${P}.port`, /consecutive hyphens/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 'a-very-long-port-name' })), `${P}.port`, /1 to 15/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 'HTTP' })), `${P}.port`, /lowercase/);
    refused(() => parseNetworkPolicy(ingressPort({ endPort: 90 })), `${P}.endPort`, /`port` is not specified/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 'http', endPort: 90 })), `${P}.endPort`, /non-numeric/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 90, endPort: 80 })), `${P}.endPort`, /greater than or equal/);
    refused(() => parseNetworkPolicy(ingressPort({ port: 90, endPort: 65536 })), `${P}.endPort`, /between 1 and 65535/);
    refused(() => parseNetworkPolicy(ingressPort({ protocol: 'tcp', port: 80 })), `${P}.protocol`, /must be TCP, UDP or SCTP/);
    refused(() => parseNetworkPolicy(ingressPort({ protocol: 'ICMP' })), `${P}.protocol`, /must be TCP, UDP or SCTP/);
    const np = parseNetworkPolicy(ingressPort({ port: 80, endPort: 80 }));
    assert.deepEqual(np.ingress![0]!.ports, [{ kind: 'range', protocol: 'TCP', first: 80, last: 80 }]);
  });

  it('refuses hostile metadata and shapes with a clear, bounded message', () => {
    refused(() => parseNetworkPolicy(null), '(object)', /must be an object, got null/);
    refused(() => parseNetworkPolicy([]), '(object)', /got a list/);
    refused(() => parseNetworkPolicy({ metadata: { namespace: 'x' } }), 'metadata.name', /must be a string/);
    refused(() => parseNetworkPolicy(policy({}, { namespace: 'X', name: 'p' })), 'metadata.namespace', /RFC 1123 label/);
    refused(() => parseNetworkPolicy(policy({}, { namespace: 'x', name: '../etc' })), 'metadata.name', /RFC 1123 subdomain/);
    refused(() => parseNetworkPolicy(policy({}, { namespace: 'x', name: 'a\nb' })), 'metadata.name', /RFC 1123 subdomain/);
    refused(() => parseNetworkPolicy(policy({}, { namespace: 'x', name: 'a'.repeat(1_000_000) })), 'metadata.name', /253/);
    refused(() => parseNetworkPolicy(policy({ ingress: {} })), 'spec.ingress', /must be a list/);
    refused(() => parseNetworkPolicy(policy({ ingress: [null] })), 'spec.ingress[0]', /must be an object/);
    try {
      parseNetworkPolicy(policy({ podSelector: { matchLabels: { ['\u001b[31m' + 'x'.repeat(500)]: 'v' } } }));
      assert.fail('accepted');
    } catch (e) {
      assert.ok(e instanceof PolicyInputError);
      assert.ok(e.message.length < 400, e.message);
      assert.ok(!e.message.includes('\u001b'), 'control characters are escaped');
      assert.match(e.message, /^NetworkPolicy x\/p: spec\.podSelector\.matchLabels\[/);
    }
  });
});

describe('policy objects: Pod and Namespace parsing', () => {
  const pod = (over: { metadata?: Record<string, unknown>; spec?: Record<string, unknown>; status?: Record<string, unknown> }) => ({
    metadata: { namespace: 'x', name: 'a', uid: 'u1', labels: { pod: 'a' }, ...over.metadata },
    spec: { nodeName: 'node-1', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80 }, { containerPort: 53, protocol: 'UDP' }] }], ...over.spec },
    status: { phase: 'Running', podIP: '10.0.0.1', podIPs: [{ ip: '10.0.0.1' }, { ip: 'FD00::1' }], ...over.status },
  });

  it('reads addresses, ports, node, host network and lifecycle', () => {
    const p = parsePod(pod({}));
    assert.deepEqual(p.ips.map(String), ['10.0.0.1', 'fd00::1']);
    assert.deepEqual(p.ports, [
      { name: 'http', port: 80, protocol: 'TCP' },
      { name: null, port: 53, protocol: 'UDP' },
    ]);
    assert.equal(p.nodeName, 'node-1');
    assert.equal(p.hostNetwork, false);
    assert.equal(p.terminating, false);
    assert.deepEqual(parsePod(pod({ status: { podIPs: null, podIP: '10.0.0.2' } })).ips.map(String), ['10.0.0.2'], 'podIP when podIPs is absent');
    assert.deepEqual(parsePod(pod({ status: { podIPs: [{ ip: '10.0.0.1' }, { ip: '10.0.0.1' }] } })).ips.map(String), ['10.0.0.1'], 'deduplicated');
    assert.deepEqual(parsePod({ metadata: { namespace: 'x', name: 'pending' } }).ips, [], 'a pod without an address is known, with none');
    assert.equal(parsePod(pod({ metadata: { deletionTimestamp: '2026-01-01T00:00:00Z' } })).terminating, true);
  });

  it('refuses bad addresses, ports, labels and node names', () => {
    refused(() => parsePod(pod({ status: { podIPs: [{ ip: '10.0.0.256' }] } })), 'status.podIPs[0].ip', /not an IP address/);
    refused(() => parsePod(pod({ status: { podIPs: [{}] } })), 'status.podIPs[0].ip', /must be a string/);
    refused(() => parsePod(pod({ spec: { containers: [{ ports: [{ containerPort: 0 }] }] } })), 'spec.containers[0].ports[0].containerPort', /between 1 and 65535/);
    refused(() => parsePod(pod({ spec: { containers: [{ ports: [{ containerPort: 80, name: 'Web' }] }] } })), 'spec.containers[0].ports[0].name', /lowercase/);
    refused(() => parsePod(pod({ spec: { containers: [{ ports: [{ containerPort: 80, protocol: 'ICMP' }] }] } })), 'spec.containers[0].ports[0].protocol', /must be TCP/);
    refused(() => parsePod(pod({ metadata: { labels: { pod: 'a b' } } })), 'metadata.labels["pod"]', /label value/);
    refused(() => parsePod(pod({ spec: { nodeName: 'Node_1' } })), 'spec.nodeName', /subdomain/);
    refused(() => parsePod(pod({ spec: { hostNetwork: 'yes' } })), 'spec.hostNetwork', /boolean/);
  });

  it('forces the namespace name label, as the API server does', () => {
    const ns = parseNamespace({ metadata: { name: 'x', labels: { 'kubernetes.io/metadata.name': 'other', team: 'a' } } });
    assert.equal(ns.labels.get('kubernetes.io/metadata.name'), 'x');
    assert.equal(ns.labels.get('team'), 'a');
    refused(() => parseNamespace({ metadata: { name: 'a.b' } }), 'metadata.name', /RFC 1123 label/);
  });
});

describe('policy objects: intervals and ports', () => {
  it('carves excepts out of a CIDR as disjoint intervals (IPv4 and IPv6), and merges unions', () => {
    const iv = carve(IPNet.parse('10.0.0.0/24'), [IPNet.parse('10.0.0.0/26'), IPNet.parse('10.0.0.128/32'), IPNet.parse('10.0.0.130/31')]);
    assert.deepEqual(iv.map(intervalText), ['10.0.0.64-10.0.0.127', '10.0.0.129', '10.0.0.132-10.0.0.255']);
    const v6 = carve(IPNet.parse('fd00::/64'), [IPNet.parse('fd00::/65')]);
    assert.deepEqual(v6.map(intervalText), ['fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff']);
    // Overlapping blocks of one rule: the union, with one block's except filled by the other.
    const merged = mergeIntervals([...carve(IPNet.parse('10.0.0.0/24'), [IPNet.parse('10.0.0.0/25')]), ...carve(IPNet.parse('10.0.0.0/25'), []), ...v6]);
    assert.deepEqual(merged.map(intervalText), ['10.0.0.0-10.0.0.255', 'fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff']);
    assert.deepEqual(carve(IPNet.parse('10.0.0.0/31'), [IPNet.parse('10.0.0.0/32'), IPNet.parse('10.0.0.1/32')]), []);
  });

  it('resolves named ports by name and protocol, and normalizes ranges', () => {
    const target = [
      { name: 'http', port: 80, protocol: 'TCP' as const },
      { name: 'dns', port: 53, protocol: 'UDP' as const },
    ];
    assert.deepEqual(
      resolvePorts(
        [
          { kind: 'named', protocol: 'TCP', name: 'http' },
          { kind: 'named', protocol: 'TCP', name: 'dns' },
          { kind: 'range', protocol: 'TCP', first: 81, last: 90 },
          { kind: 'named', protocol: 'UDP', name: 'dns' },
        ],
        target,
      ),
      [
        { protocol: 'TCP', first: 80, last: 90 },
        { protocol: 'UDP', first: 53, last: 53 },
      ],
    );
    assert.deepEqual(resolvePorts([{ kind: 'named', protocol: 'TCP', name: 'http' }], null), []);
    assert.deepEqual(
      normalizePorts([
        { protocol: 'UDP', first: 5, last: 9 },
        { protocol: 'TCP', first: 10, last: 20 },
        { protocol: 'TCP', first: 1, last: 12 },
      ]),
      [
        { protocol: 'TCP', first: 1, last: 20 },
        { protocol: 'UDP', first: 5, last: 9 },
      ],
    );
  });
});
