// The policy table's nft text: a small snapshot and two deltas rendered exactly, and API strings
// (namespace and pod names, labels) that never reach the text — chains are hashes, sets engine ids.
import assert from 'node:assert/strict';

import { PolicyEngine } from '../../src/policy/engine.js';
import { applyDelta, copySnapshot } from '../../src/policy/model.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { podChainName } from '../../src/policy/nft/layout.js';
import { renderDelta, renderFull } from '../../src/policy/nft/render.js';

const pod = (ns: string, name: string, ip: string, app: string) =>
  parsePod({
    metadata: { namespace: ns, name, labels: { app } },
    spec: { nodeName: 'n1', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
    status: { phase: 'Running', podIPs: [{ ip }] },
  });

const T = 'inet weft_policy';
const SET = 'r2d27d8f36fc2ec182e44_pods';
const B = 'pod_b68ad6bd697197954524_in';

describe('policy nft rendering', () => {
  const e = new PolicyEngine('n1');
  e.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
  e.upsertPod(pod('x', 'a', '10.88.0.2', 'a'));
  e.upsertPod(pod('x', 'b', '10.88.0.3', 'b'));
  e.upsertPolicy(
    parseNetworkPolicy({
      metadata: { namespace: 'x', name: 'allow-a' },
      spec: { podSelector: { matchLabels: { app: 'b' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }, { port: 8080, endPort: 8090 }, { protocol: 'UDP' }] }] },
    }),
  );
  const snap0 = e.snapshot();
  const state = copySnapshot(snap0);

  it('renders a snapshot as the whole table', () => {
    assert.equal(B, podChainName('x/b', 'ingress'));
    const dispatch = (chain: string, lines: string[]) => lines.map((l) => `add rule ${T} ${chain} ${l}`);
    const expected = [
      `add table ${T} { comment "weft NetworkPolicy" ; }`,
      `add set ${T} ${SET}_v4 { type ipv4_addr ; }`,
      `add element ${T} ${SET}_v4 { 10.88.0.2 }`,
      `add set ${T} ${SET}_v6 { type ipv6_addr ; }`,
      `add map ${T} ingress_v4 { type ipv4_addr : verdict ; }`,
      `add map ${T} ingress_v6 { type ipv6_addr : verdict ; }`,
      `add map ${T} egress_v4 { type ipv4_addr : verdict ; }`,
      `add map ${T} egress_v6 { type ipv6_addr : verdict ; }`,
      `add chain ${T} ${B}`,
      // A port range is a match of its own: an anonymous set with ranges is an interval set,
      // which nft 1.0 reads back before every element command (render.ts, createSet).
      `add rule ${T} ${B} ip saddr @${SET}_v4 tcp dport 80 counter return comment "r2d27d8f36fc2ec182e44 2a6ac9c3dc29"`,
      `add rule ${T} ${B} ip saddr @${SET}_v4 tcp dport 8080-8090 counter return comment "r2d27d8f36fc2ec182e44 6398661c265b"`,
      `add rule ${T} ${B} ip saddr @${SET}_v4 meta l4proto udp counter return comment "r2d27d8f36fc2ec182e44 3be45bc43009"`,
      `add rule ${T} ${B} ip6 saddr @${SET}_v6 tcp dport 80 counter return comment "r2d27d8f36fc2ec182e44 a874e6ee1029"`,
      `add rule ${T} ${B} ip6 saddr @${SET}_v6 tcp dport 8080-8090 counter return comment "r2d27d8f36fc2ec182e44 755a494e5b3b"`,
      `add rule ${T} ${B} ip6 saddr @${SET}_v6 meta l4proto udp counter return comment "r2d27d8f36fc2ec182e44 273e8535b9ec"`,
      `add rule ${T} ${B} counter drop comment "default-deny 31e1ec47c048"`,
      `add element ${T} ingress_v4 { 10.88.0.3 : jump ${B} }`,
      `add chain ${T} pod_forward { type filter hook forward priority filter - 10 ; policy accept ; }`,
      ...dispatch('pod_forward', [
        'ct state established,related accept comment "ct d715fd9ae664"',
        'ct state invalid drop comment "ct efca34c884c5"',
        'ip saddr vmap @egress_v4 comment "dispatch 7c9a60f531bf"',
        'ip6 saddr vmap @egress_v6 comment "dispatch e804290c46e0"',
        'ip daddr vmap @ingress_v4 comment "dispatch c16d1c591381"',
        'ip6 daddr vmap @ingress_v6 comment "dispatch 6e608af61829"',
      ]),
      `add chain ${T} pod_input { type filter hook input priority filter - 10 ; policy accept ; }`,
      ...dispatch('pod_input', [
        'ct state established,related accept comment "ct d715fd9ae664"',
        'ct state invalid drop comment "ct efca34c884c5"',
        'ip saddr vmap @egress_v4 comment "dispatch 7c9a60f531bf"',
        'ip6 saddr vmap @egress_v6 comment "dispatch e804290c46e0"',
      ]),
    ];
    assert.equal(renderFull(e.snapshot()).script, expected.join('\n') + '\n');
    const replaced = renderFull(e.snapshot(), {}, true).script.split('\n');
    assert.deepEqual(replaced.slice(0, 3), [expected[0], `delete table ${T}`, expected[0]]);
  });

  it('renders deltas as only the changed elements, chains and sets', () => {
    const d1 = e.upsertPod(pod('x', 'c', '10.88.0.4', 'a'));
    assert.equal(renderDelta(state, d1), `add element ${T} ${SET}_v4 { 10.88.0.4 }\n`);
    applyDelta(state, d1);
    const d2 = e.deletePolicy('x', 'allow-a');
    assert.equal(
      renderDelta(state, d2),
      [`delete element ${T} ingress_v4 { 10.88.0.3 }`, `delete chain ${T} ${B}`, `delete set ${T} ${SET}_v4`, `delete set ${T} ${SET}_v6`, ''].join('\n'),
    );
    applyDelta(state, d2);
    // An event that changes nothing enforced renders nothing.
    assert.equal(renderDelta(state, e.upsertPod(pod('x', 'a', '10.88.0.2', 'a'))), null);
  });

  it('writes ipBlocks into the rules as ranges (no interval sets), and only the families asked for', () => {
    const e2 = new PolicyEngine('n1');
    e2.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
    e2.upsertPod(pod('x', 'a', '10.88.0.2', 'a'));
    e2.upsertPolicy(
      parseNetworkPolicy({
        metadata: { namespace: 'x', name: 'cidr' },
        spec: {
          podSelector: { matchLabels: { app: 'a' } },
          policyTypes: ['Egress'],
          egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8', except: ['10.88.0.0/16'] } }, { ipBlock: { cidr: '192.168.1.0/24' } }, { ipBlock: { cidr: 'fd00::/64' } }] }],
        },
      }),
    );
    const text = renderFull(e2.snapshot(), { families: [4] }).script;
    const A = podChainName('x/a', 'egress');
    assert.deepEqual(
      text.split('\n').filter((l) => l.startsWith(`add rule ${T} ${A} `)),
      [
        `add rule ${T} ${A} ip daddr 10.0.0.0-10.87.255.255 counter return comment "r4c97db0c9126046e3204 36f0092b684b"`,
        `add rule ${T} ${A} ip daddr 10.89.0.0-10.255.255.255 counter return comment "r4c97db0c9126046e3204 5c8c3faf6dc4"`,
        `add rule ${T} ${A} ip daddr 192.168.1.0-192.168.1.255 counter return comment "r4c97db0c9126046e3204 e813db802b4e"`,
        `add rule ${T} ${A} counter drop comment "default-deny 31e1ec47c048"`,
      ],
    );
    assert.doesNotMatch(text, /flags interval|_cidrs_|ip6|_v6/);
    // Deleting the policy deletes the chain and no set: the ipBlock had none.
    const prev = copySnapshot(e2.snapshot());
    assert.equal(renderDelta(prev, e2.deletePolicy('x', 'cidr'), { families: [4] }), [`delete element ${T} egress_v4 { 10.88.0.2 }`, `delete chain ${T} ${A}`, ''].join('\n'));
  });

  it('declares no set for the pods of an egress rule whose ports are all named (its peerPorts set matches)', () => {
    const e2 = new PolicyEngine('n1');
    e2.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
    e2.upsertPod(pod('x', 'a', '10.88.0.2', 'a'));
    e2.upsertPod(pod('x', 'b', '10.88.0.3', 'b'));
    e2.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'named' }, spec: { podSelector: { matchLabels: { app: 'a' } }, policyTypes: ['Egress'], egress: [{ to: [{ podSelector: { matchLabels: { app: 'b' } } }], ports: [{ port: 'http' }] }] } }));
    const opts = { families: [4] as const };
    const full = renderFull(e2.snapshot(), opts).script;
    assert.match(full, /add set inet weft_policy r[0-9a-f]+_ports_v4 \{ type ipv4_addr \. inet_proto \. inet_service ; \}/);
    assert.doesNotMatch(full, /_pods_v4/);
    // A new peer pod changes the peerPorts set only; its deletion removes the rule's one set.
    const prev = copySnapshot(e2.snapshot());
    const d = e2.upsertPod(pod('x', 'b2', '10.88.0.5', 'b'));
    assert.match(renderDelta(prev, d, opts) ?? '', /^add element inet weft_policy r[0-9a-f]+_ports_v4 \{ 10\.88\.0\.5 \. tcp \. 80 \}\n$/);
    applyDelta(prev, d);
    const gone = renderDelta(prev, e2.deletePolicy('x', 'named'), opts) ?? '';
    assert.deepEqual(gone.split('\n').filter((l) => l.startsWith('delete set')).map((l) => l.replace(/r[0-9a-f]+/, 'R')), [`delete set ${T} R_ports_v4`]);
  });

  it('maps an address two local pods claim to one of them, and to the other when that one goes', () => {
    const e2 = new PolicyEngine('n1');
    e2.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
    e2.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'deny' }, spec: { podSelector: {}, policyTypes: ['Ingress'] } }));
    // p-old terminates with 10.88.0.7 still in its status; p-new got the address from host-local.
    e2.upsertPod(pod('x', 'p-old', '10.88.0.7', 'a'));
    e2.upsertPod(pod('x', 'p-new', '10.88.0.7', 'a'));
    const opts = { families: [4] as const };
    const full = renderFull(e2.snapshot(), opts);
    assert.deepEqual(full.script.split('\n').filter((l) => l.startsWith(`add element ${T} ingress_v4`)), [`add element ${T} ingress_v4 { 10.88.0.7 : jump ${podChainName('x/p-new', 'ingress')} }`]);
    assert.deepEqual([...full.desired.maps.get('ingress_v4')!], [['10.88.0.7', podChainName('x/p-new', 'ingress')]]);
    // p-new leaves: the entry moves to p-old in the same transaction, before p-new's chain goes.
    const prev = copySnapshot(e2.snapshot());
    const text = renderDelta(prev, e2.deletePod('x', 'p-new'), opts) ?? '';
    assert.deepEqual(text.split('\n').filter((l) => l !== ''), [
      `delete element ${T} ingress_v4 { 10.88.0.7 }`,
      `add element ${T} ingress_v4 { 10.88.0.7 : jump ${podChainName('x/p-old', 'ingress')} }`,
      `delete chain ${T} ${podChainName('x/p-new', 'ingress')}`,
    ]);
  });

  it('never puts API strings into the text, even ones the parser would refuse', () => {
    // The parser refuses such names; the renderer must not depend on it: pods are keyed by hash.
    const hostile = ['q"uote', 'semi;colon', 'new\nline', 'br{ace}', 'at@set', 'dollar$x', 'flush ruleset'];
    const snap = snap0;
    const b = snap.pods.get('x/b')!;
    const pods = new Map(hostile.map((s, i) => [`${s}/${s}`, { ...b, namespace: s, name: s, ips: [`10.9.0.${i + 1}`] }]));
    const full = renderFull({ ...snap, pods }).script;
    assert.equal(full.match(/: jump pod_[0-9a-f]{20}_in/g)?.length, hostile.length);
    const prev = copySnapshot({ ...snap, pods: new Map() });
    const delta = renderDelta(prev, { setsCreated: [], setChanges: [], rulesAdded: [], pods: [...pods].map(([key, policy]) => ({ key, policy })), rulesRemoved: [], setsDeleted: [] })!;
    for (const t of [full, delta]) for (const s of hostile) assert.ok(!t.includes(s), `${JSON.stringify(s)} in the text`);
  });
});
