import assert from 'node:assert/strict';
import { chainLines, jumpSpec } from '../../src/ipmasq/iptables.js';
import { masqRules } from '../../src/ipmasq/model.js';
import { parseListTable, ruleExpr } from '../../src/ipmasq/nftables.js';
import { splitRuleArgs } from '../../src/util/rule-args.js';
import { evalNftChain, evalNftRules, evalXtChain, firstModelMatch, parseNftChain, parseXtRule, parseXtTable, type RulePacket } from '../../src/cli/trace/rules.js';
import { agentRules } from '../../src/ipmasq/agent-rules.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const NETWORK = IPNet.parse('10.5.0.0/16');
const SUBNET = IPNet.parse('10.5.1.0/24');
const MCAST = IPNet.parse('224.0.0.0/4');

function pkt(src: string, dst: string, extra: Partial<RulePacket> = {}): RulePacket {
  return { src: IPAddr.parse(src), dst: IPAddr.parse(dst), proto: 'icmp', dport: null, iif: 'cni0', oif: 'eth0', mark: 0, ...extra };
}

/** nat table as iptables-save prints it with weft's rules (and optionally others before them). */
function natSave(before: string[] = [], chains: string[] = []): string {
  const spec = { family: 4 as const, kind: 'masq' as const, rules: masqRules(NETWORK, SUBNET, MCAST, true) };
  return [
    '*nat',
    ':PREROUTING ACCEPT [0:0]',
    ':POSTROUTING ACCEPT [0:0]',
    ':FLANNEL-POSTRTG - [0:0]',
    ...chains.map((c) => `:${c} - [0:0]`),
    ...before,
    `-A POSTROUTING ${jumpSpec('masq')}`,
    ...chainLines(spec),
    'COMMIT',
  ].join('\n');
}

describe('trace rules: tokenize and parse iptables-save lines', () => {
  it('splits on blanks and unquotes comments', () => {
    assert.deepEqual(splitRuleArgs('-A X -m comment --comment "flanneld masq" -j RETURN'), ['-A', 'X', '-m', 'comment', '--comment', 'flanneld masq', '-j', 'RETURN']);
    assert.deepEqual(splitRuleArgs('-A X --comment "a \\"b\\" c" -j Y'), ['-A', 'X', '--comment', 'a "b" c', '-j', 'Y']);
  });

  it('reads addresses, negations, mark, interfaces, ports and the target', () => {
    const r = parseXtRule('-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.1.0/24 -m comment --comment "flanneld masq" -j RETURN', 4)!;
    assert.equal(r.chain, 'FLANNEL-POSTRTG');
    assert.equal(r.index, 4);
    assert.equal(r.target, 'RETURN');
    assert.deepEqual(r.unknown, []);
    assert.deepEqual(r.conds.map((c) => [c.kind, c.negate]), [['src', true], ['dst', false]]);

    const k = parseXtRule('-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN', 1)!;
    assert.deepEqual(k.conds, [{ kind: 'mark', value: 0x4000, mask: 0x4000, negate: true }]);

    const d = parseXtRule('-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -p tcp -m tcp --dport 80:90 -j MASQUERADE --random-fully', 2)!;
    assert.deepEqual(d.conds.map((c) => c.kind), ['src', 'oif', 'proto', 'dport']);
    assert.equal(d.target, 'MASQUERADE');
  });

  it('keeps matches it cannot evaluate, with their arguments', () => {
    const r = parseXtRule('-A POSTROUTING -m conntrack --ctstate DNAT -m addrtype --src-type LOCAL -j MASQUERADE', 1)!;
    // addrtype is read for --dst-type LOCAL only (ip-masq-agent's jump); its other options stay unknown.
    assert.deepEqual(r.unknown, ['-m conntrack --ctstate DNAT', '--src-type LOCAL']);
    const s = parseXtRule('-A POSTROUTING -p tcp --sport 22 -j SNAT --to-source 1.2.3.4', 1)!;
    assert.deepEqual(s.unknown, ['--sport 22']);
  });
});

describe('trace rules: evaluating nat POSTROUTING', () => {
  it('masquerades a pod leaving the cluster by rule 5 of FLANNEL-POSTRTG', () => {
    const d = evalXtChain(parseXtTable(natSave()), 'POSTROUTING', pkt('10.5.1.2', '203.0.113.5'));
    assert.equal(d.verdict, 'MASQUERADE');
    assert.equal(d.rule?.chain, 'FLANNEL-POSTRTG');
    assert.equal(d.rule?.index, 5);
    assert.equal(d.rule?.text, '-A FLANNEL-POSTRTG -s 10.5.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully');
  });

  it('returns pod-to-pod traffic unchanged and says which RETURN did it', () => {
    const d = evalXtChain(parseXtTable(natSave()), 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3'));
    assert.equal(d.verdict, 'none');
    assert.equal(d.returnedBy?.index, 2);
    assert.equal(d.returnedBy?.chain, 'FLANNEL-POSTRTG');
  });

  it('leaves multicast alone and masquerades the host talking to remote pods', () => {
    assert.equal(evalXtChain(parseXtTable(natSave()), 'POSTROUTING', pkt('10.5.1.2', '239.1.1.1')).verdict, 'none');
    const h = evalXtChain(parseXtTable(natSave()), 'POSTROUTING', pkt('10.250.0.1', '10.5.2.3', { iif: null }));
    assert.equal(h.verdict, 'MASQUERADE');
    assert.equal(h.rule?.index, 6);
  });

  it('sees a foreign rule before weft\'s jump that masquerades pod-to-pod traffic', () => {
    const save = natSave(['-A POSTROUTING -s 10.5.0.0/16 -o flannel.1 -j MASQUERADE']);
    const d = evalXtChain(parseXtTable(save), 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3', { oif: 'flannel.1' }));
    assert.equal(d.verdict, 'MASQUERADE');
    assert.equal(d.rule?.chain, 'POSTROUTING');
    assert.equal(d.rule?.index, 1);
    // Not on another device.
    assert.equal(evalXtChain(parseXtTable(save), 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3', { oif: 'eth0' })).verdict, 'none');
  });

  it('follows jumps into user chains, and kube-proxy\'s RETURN for unmarked packets', () => {
    const save = natSave(
      ['-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING', '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN', '-A KUBE-POSTROUTING -j MASQUERADE'],
      ['KUBE-POSTROUTING'],
    );
    const unmarked = evalXtChain(parseXtTable(save), 'POSTROUTING', pkt('10.5.1.2', '203.0.113.5'));
    assert.equal(unmarked.rule?.chain, 'FLANNEL-POSTRTG');
    const marked = evalXtChain(parseXtTable(save), 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3', { mark: 0x4000 }));
    assert.equal(marked.verdict, 'MASQUERADE');
    assert.equal(marked.rule?.chain, 'KUBE-POSTROUTING');
  });

  it('reports a rule it cannot evaluate and assumes it does not match', () => {
    const save = natSave(['-A POSTROUTING -s 10.5.0.0/16 -m conntrack --ctstate DNAT -j MASQUERADE']);
    const d = evalXtChain(parseXtTable(save), 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3'));
    assert.equal(d.verdict, 'none');
    assert.deepEqual(d.unevaluated.map((r) => r.index), [1]);
    // A rule whose known matches miss is simply not taken.
    assert.deepEqual(evalXtChain(parseXtTable(save), 'POSTROUTING', pkt('192.168.0.1', '10.5.2.3')).unevaluated, []);
  });

  it('matches protocol and port ranges', () => {
    const save = natSave(['-A POSTROUTING -s 10.5.1.0/24 -p udp -m udp --dport 50:60 -j SNAT --to-source 10.250.0.9']);
    const t = parseXtTable(save);
    assert.equal(evalXtChain(t, 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3', { proto: 'udp', dport: 53 })).verdict, 'SNAT');
    assert.equal(evalXtChain(t, 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3', { proto: 'udp', dport: 80 })).verdict, 'none');
    assert.equal(evalXtChain(t, 'POSTROUTING', pkt('10.5.1.2', '10.5.2.3', { proto: 'tcp', dport: 53 })).verdict, 'none');
  });
});

describe('trace rules: the model and weft\'s nft table', () => {
  it('finds the first model rule with its position', () => {
    const rules = masqRules(NETWORK, SUBNET, MCAST, false);
    assert.equal(firstModelMatch(rules, pkt('10.5.1.2', '203.0.113.5'))?.index, 5);
    assert.equal(firstModelMatch(rules, pkt('10.5.2.3', '10.5.1.2'))?.index, 3);
    assert.equal(firstModelMatch(rules, pkt('192.0.2.1', '10.5.1.2'))?.index, 4);
    assert.equal(firstModelMatch(rules, pkt('10.5.1.2', '10.5.1.3', { mark: 0x4000 }))?.index, 1);
    assert.equal(firstModelMatch(rules, pkt('192.0.2.1', '198.51.100.1')), null);
  });

  it('evaluates the listed nft chain by recognising the model\'s rules', () => {
    const rules = masqRules(NETWORK, SUBNET, MCAST, true);
    // `nft -j list table` output, with the expressions compareTable expects.
    const listed = parseListTable(
      JSON.stringify({
        nftables: [
          { table: { family: 'ip', name: 'flannel-ipv4' } },
          { chain: { family: 'ip', table: 'flannel-ipv4', name: 'postrtg', type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } },
          // An extra rule nobody rendered, first.
          { rule: { chain: 'postrtg', expr: [{ counter: null }] } },
          ...rules.map((r) => ({ rule: { chain: 'postrtg', expr: ruleExpr(4, r) } })),
        ],
      }),
    );
    const d = evalNftChain(listed, 'postrtg', 4, [...rules, ...masqRules(NETWORK, SUBNET, MCAST, false)], pkt('10.5.1.2', '203.0.113.5'));
    assert.equal(d.verdict, 'MASQUERADE');
    assert.equal(d.index, 6);
    assert.deepEqual(d.unevaluated, [1]);
    assert.equal(d.rule, rules[4]);
  });
});

describe('trace rules: ip-masq-agent mode', () => {
  const agentSave = (): string => {
    const spec = { family: 4 as const, kind: 'agent' as const, rules: agentRules(NETWORK, { nonMasqueradeCIDRs: [IPNet.parse('192.168.0.0/16')], masqLinkLocal: false, masqLinkLocalIPv6: false }, true) };
    return ['*nat', ':POSTROUTING ACCEPT [0:0]', ':WEFT-IP-MASQ - [0:0]', `-A POSTROUTING ${jumpSpec('agent')}`, ...chainLines(spec), 'COMMIT'].join('\n');
  };

  it('reads the jump\'s "-m addrtype ! --dst-type LOCAL" and skips the chain for local destinations', () => {
    const jump = parseXtRule(`-A POSTROUTING ${jumpSpec('agent')}`, 1)!;
    assert.deepEqual([jump.conds, jump.unknown, jump.target], [[{ kind: 'dstLocal', negate: true }], [], 'WEFT-IP-MASQ']);
    const t = parseXtTable(agentSave());
    const out = evalXtChain(t, 'POSTROUTING', pkt('10.5.1.2', '8.8.8.8'));
    assert.deepEqual([out.verdict, out.rule?.chain, out.rule?.index], ['MASQUERADE', 'WEFT-IP-MASQ', 4]);
    const kept = evalXtChain(t, 'POSTROUTING', pkt('10.5.1.2', '192.168.1.1'));
    assert.deepEqual([kept.verdict, kept.returnedBy?.index], ['none', 3]);
    // To an address of this node the jump is not taken at all.
    const local = evalXtChain(t, 'POSTROUTING', pkt('10.5.1.2', '8.8.8.8', { dstLocal: true }));
    assert.deepEqual([local.verdict, local.returnedBy, local.rule], ['none', null, null]);
  });

  it('reads the nft chain rule by rule: fib daddr type local, address matches, masquerade, and what it cannot read', () => {
    const listed = parseListTable(
      JSON.stringify({
        nftables: [
          { chain: { family: 'ip', table: 'flannel-ipv4', name: 'ip-masq-agent', type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } },
          { rule: { chain: 'ip-masq-agent', expr: [{ match: { op: '==', left: { fib: { result: 'type', flags: ['daddr'] } }, right: 'local' } }, { return: null }] } },
          { rule: { chain: 'ip-masq-agent', expr: [{ counter: { packets: 0, bytes: 0 } }, { return: null }] } },
          { rule: { chain: 'ip-masq-agent', expr: ruleExpr(4, { matches: [{ kind: 'dst', net: IPNet.parse('192.168.0.0/16'), negate: false }], verdict: 'RETURN', fullyRandom: false }) } },
          { rule: { chain: 'ip-masq-agent', expr: ruleExpr(4, { matches: [{ kind: 'dst', net: IPNet.parse('10.9.9.9/32'), negate: false }], verdict: 'RETURN', fullyRandom: false }) } },
          { rule: { chain: 'ip-masq-agent', expr: ruleExpr(4, { matches: [], verdict: 'MASQUERADE', fullyRandom: true }) } },
        ],
      }),
    );
    const rules = parseNftChain(listed, 'ip-masq-agent', 4)!;
    assert.deepEqual(rules.map((r) => r.text), ['fib daddr type local return', 'return (+ expressions trace does not read)', 'ip daddr 192.168.0.0/16 return', 'ip daddr 10.9.9.9 return', 'masquerade fully-random']);
    assert.equal(rules[1]!.conds, null);
    assert.deepEqual(evalNftRules(rules, pkt('10.5.1.2', '8.8.8.8')), { verdict: 'MASQUERADE', rule: rules[4], unevaluated: [2] });
    assert.equal(evalNftRules(rules, pkt('10.5.1.2', '10.9.9.9')).rule?.index, 4);
    assert.equal(evalNftRules(rules, pkt('10.5.1.2', '8.8.8.8', { dstLocal: true })).rule?.index, 1);
    assert.equal(parseNftChain(listed, 'postrtg', 4), null);
  });
});
