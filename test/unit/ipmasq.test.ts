import assert from 'node:assert/strict';
import { chainLines, parseSave, parseSaveTables, planTable } from '../../src/ipmasq/iptables.js';
import { desiredChains, type MasqInput } from '../../src/ipmasq/model.js';
import { canonical, compareTable, parseListTable, renderTable, ruleExpr } from '../../src/ipmasq/nftables.js';
import { IPNet } from '../../src/util/ip.js';

const v4 = { network: IPNet.parse('10.5.0.0/16'), subnet: IPNet.parse('10.5.1.0/24') };
const v6 = { network: IPNet.parse('fd05::/48'), subnet: IPNet.parse('fd05:0:0:1::/64') };
const input = (over: Partial<MasqInput> = {}): MasqInput => ({ families: [v4], masq: true, forward: true, fullyRandom: true, ...over });

const MASQ_V4 = [
  '-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN',
  '-A FLANNEL-POSTRTG -s 10.5.1.0/24 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j RETURN',
  '-A FLANNEL-POSTRTG -s 10.5.0.0/16 -d 10.5.1.0/24 -m comment --comment "flanneld masq" -j RETURN',
  '-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.1.0/24 -m comment --comment "flanneld masq" -j RETURN',
  '-A FLANNEL-POSTRTG -s 10.5.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully',
  '-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully',
];
const JUMP = '-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG';

function save(lines: string[], chains = ['FLANNEL-POSTRTG']): string {
  return ['*nat', ':POSTROUTING ACCEPT [0:0]', ...chains.map((c) => `:${c} - [0:0]`), ...lines, 'COMMIT', ''].join('\n');
}

describe('ipmasq rule model and renderings', () => {
  it('renders flannel\'s masquerade and forward rules as iptables-save prints them', () => {
    const [masq, fwd] = desiredChains(input());
    assert.deepEqual(chainLines(masq!), MASQ_V4);
    assert.deepEqual(chainLines(fwd!), [
      '-A FLANNEL-FWD -s 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT',
      '-A FLANNEL-FWD -d 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT',
    ]);
  });

  it('renders IPv6 with ff00::/8 and no --random-fully when it is off', () => {
    const [masq] = desiredChains(input({ families: [v6], forward: false, fullyRandom: false }));
    assert.equal(chainLines(masq!)[4], '-A FLANNEL-POSTRTG -s fd05::/48 ! -d ff00::/8 -m comment --comment "flanneld masq" -j MASQUERADE');
  });

  it('wants only the enabled chains, IPv4 before IPv6', () => {
    const kinds = desiredChains(input({ families: [v4, v6], forward: false })).map((c) => `${c.family}/${c.kind}`);
    assert.deepEqual(kinds, ['4/masq', '6/masq']);
    assert.deepEqual(desiredChains(input({ masq: false, forward: false })), []);
  });
});

describe('ipmasq iptables plan', () => {
  const [masq] = desiredChains(input({ forward: false }));
  const plan = (lines: string[], chains?: string[]) => planTable('nat', [masq!], ['forward'], parseSave(save(lines, chains)));

  it('writes nothing when the table is exactly right', () => {
    assert.deepEqual(plan([JUMP, ...MASQ_V4]), { problems: [], payload: null });
  });

  it('rewrites the whole chain in one transaction when it is missing', () => {
    const p = plan([], []);
    assert.deepEqual(p.problems, ['FLANNEL-POSTRTG: chain missing', 'POSTROUTING: jump to FLANNEL-POSTRTG missing']);
    assert.equal(p.payload, ['*nat', ':FLANNEL-POSTRTG - [0:0]', ...MASQ_V4, JUMP, 'COMMIT', ''].join('\n'));
  });

  it('names a missing, a duplicated, an unexpected rule and a wrong order', () => {
    assert.deepEqual(plan([JUMP, ...MASQ_V4.slice(1)]).problems, [`FLANNEL-POSTRTG: missing rule: ${MASQ_V4[0]}`]);
    assert.deepEqual(plan([JUMP, ...MASQ_V4, MASQ_V4[2]!]).problems, [`FLANNEL-POSTRTG: rule present 2 times: ${MASQ_V4[2]}`]);
    const extra = '-A FLANNEL-POSTRTG -s 10.9.0.0/16 -j RETURN';
    assert.deepEqual(plan([JUMP, ...MASQ_V4, extra]).problems, [`FLANNEL-POSTRTG: unexpected rule: ${extra}`]);
    const swapped = [MASQ_V4[1]!, MASQ_V4[0]!, ...MASQ_V4.slice(2)];
    const p = plan([JUMP, ...swapped]);
    assert.deepEqual(p.problems, ['FLANNEL-POSTRTG: rules out of order']);
    assert.ok(p.payload?.includes(':FLANNEL-POSTRTG - [0:0]'));
  });

  it('deletes duplicate jumps and keeps one', () => {
    const p = plan([JUMP, JUMP, JUMP, ...MASQ_V4]);
    assert.deepEqual(p.problems, ['POSTROUTING: jump to FLANNEL-POSTRTG present 3 times']);
    const del = '-D POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG';
    assert.equal(p.payload, ['*nat', del, del, 'COMMIT', ''].join('\n'));
  });

  it('removes an unwanted chain, its jumps first', () => {
    const p = planTable('nat', [], ['masq'], parseSave(save([JUMP, ...MASQ_V4])));
    const del = '-D POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG';
    assert.equal(p.payload, ['*nat', del, ':FLANNEL-POSTRTG - [0:0]', '-X FLANNEL-POSTRTG', 'COMMIT', ''].join('\n'));
    assert.deepEqual(planTable('nat', [], ['masq'], parseSave(save([], []))), { problems: [], payload: null });
  });

  it('splits one iptables-save of every table per table; a table it does not print is empty', () => {
    const text = ['# Generated', '*filter', ':FORWARD ACCEPT [0:0]', ':FLANNEL-FWD - [0:0]', '-A FORWARD -j FLANNEL-FWD', 'COMMIT', save([JUMP, ...MASQ_V4])].join('\n');
    const tables = parseSaveTables(text);
    assert.deepEqual(tables('nat'), parseSave(save([JUMP, ...MASQ_V4])));
    assert.deepEqual([...tables('filter').chains], ['FORWARD', 'FLANNEL-FWD']);
    assert.deepEqual(tables('filter').appends, ['-A FORWARD -j FLANNEL-FWD']);
    const none = parseSaveTables('');
    assert.deepEqual({ chains: [...none('nat').chains], appends: none('nat').appends }, { chains: [], appends: [] });
  });

  it('ignores rules of other chains and other owners', () => {
    const others = ['-A POSTROUTING -j KUBE-POSTROUTING', '-A KUBE-POSTROUTING -j MASQUERADE'];
    assert.equal(plan([...others, JUMP, ...MASQ_V4], ['KUBE-POSTROUTING', 'FLANNEL-POSTRTG']).payload, null);
  });
});

describe('ipmasq nftables rendering and comparison', () => {
  const chains = desiredChains(input());

  it('renders one transaction that replaces the table atomically', () => {
    const script = renderTable(4, chains, true).split('\n');
    assert.deepEqual(script.slice(0, 4), [
      'add table ip flannel-ipv4 { comment "rules for flannel-ipv4" ; }',
      'delete table ip flannel-ipv4',
      'add table ip flannel-ipv4 { comment "rules for flannel-ipv4" ; }',
      'add chain ip flannel-ipv4 postrtg { type nat hook postrouting priority srcnat ; policy accept ; comment "chain to manage traffic masquerading by flannel" ; }',
    ]);
    assert.deepEqual(script.slice(4, 10), [
      'add rule ip flannel-ipv4 postrtg meta mark & 0x00004000 == 0x00004000 return',
      'add rule ip flannel-ipv4 postrtg ip saddr 10.5.1.0/24 ip daddr 10.5.0.0/16 return',
      'add rule ip flannel-ipv4 postrtg ip saddr 10.5.0.0/16 ip daddr 10.5.1.0/24 return',
      // The iptables rule 4, not flannel's nftables one (see model.ts).
      'add rule ip flannel-ipv4 postrtg ip saddr != 10.5.0.0/16 ip daddr 10.5.1.0/24 return',
      'add rule ip flannel-ipv4 postrtg ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random',
      'add rule ip flannel-ipv4 postrtg ip saddr != 10.5.0.0/16 ip daddr 10.5.0.0/16 masquerade fully-random',
    ]);
  });

  it('finds nothing wrong with a listing that has exactly the rules, and names what differs', () => {
    const listing = (masqRules: unknown[][]) =>
      JSON.stringify({
        nftables: [
          { metainfo: { version: '1.0.6' } },
          { table: { family: 'ip', name: 'flannel-ipv4', handle: 1 } },
          { chain: { family: 'ip', table: 'flannel-ipv4', name: 'postrtg', type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } },
          { chain: { family: 'ip', table: 'flannel-ipv4', name: 'forward', type: 'filter', hook: 'forward', prio: 0, policy: 'accept' } },
          ...masqRules.map((expr, i) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'postrtg', handle: 10 + i, expr } })),
          ...chains[1]!.rules.map((r) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'forward', expr: ruleExpr(4, r) } })),
        ],
      });
    const exprs = chains[0]!.rules.map((r) => ruleExpr(4, r));
    assert.deepEqual(compareTable(4, chains, parseListTable(listing(exprs))), []);
    assert.deepEqual(compareTable(4, chains, parseListTable(listing(exprs.slice(1)))), [
      'flannel-ipv4/postrtg: missing rule: meta mark & 0x00004000 == 0x00004000 return',
    ]);
    assert.deepEqual(compareTable(4, chains, parseListTable(listing([exprs[1]!, exprs[0]!, ...exprs.slice(2)]))), [
      'flannel-ipv4/postrtg: rules out of order',
    ]);
    assert.deepEqual(compareTable(4, chains, null), ['table ip flannel-ipv4 missing']);
    assert.deepEqual(compareTable(4, [], parseListTable(listing(exprs))), ['table ip flannel-ipv4: not wanted, removing']);
  });

  it('compares expressions whatever the key order', () => {
    assert.equal(canonical({ b: 1, a: [{ d: null, c: 'x' }] }), canonical({ a: [{ c: 'x', d: null }], b: 1 }));
  });
});
