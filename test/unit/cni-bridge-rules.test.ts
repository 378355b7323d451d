// bridge ipMasq and macspoofchk rule rendering: the reference chain names and comments, the
// iptables-restore texts for setup and teardown, GC discovery, and the nftables JSON documents.
import assert from 'node:assert/strict';
import { splitRuleArgs } from '../../src/util/rule-args.js';
import {
  jumpsTo,
  masqAddr,
  masqChainName,
  masqComment,
  masqStateByContainer,
  nftInstanceHash,
  nftMasqComment,
  nftNetworkHash,
  nftRulesOf,
  renderMasqSetup,
  renderMasqTeardown,
  renderNftMasqSetup,
} from '../../cni-plugins/bridge/ipmasq.js';
import { renderSpoofSetup, renderSpoofTeardown, spoofChains, spoofRefId } from '../../cni-plugins/bridge/spoofcheck.js';

const C = 'name: \\"cniref-net\\" id: \\"ctr00\\"';

describe('bridge ipMasq: iptables', () => {
  it('names the chain as the reference (measured on Debian 1.1.1)', () => {
    assert.equal(masqChainName('cniref-net', 'ctr00'), 'CNI-3d646be8355665bddd96af35');
    assert.equal(masqChainName('cniref-net', 'tamper'), 'CNI-4be606f22ab759b092b22ccf');
    assert.equal(masqComment('cniref-net', 'ctr00'), 'name: "cniref-net" id: "ctr00"');
  });

  it('renders the setup transaction in iptables-save form', () => {
    const text = renderMasqSetup([masqAddr('10.244.77.2/24')], 'CNI-3d646be8355665bddd96af35', masqComment('cniref-net', 'ctr00'));
    assert.equal(
      text,
      [
        '*nat',
        ':CNI-3d646be8355665bddd96af35 - [0:0]',
        `-A CNI-3d646be8355665bddd96af35 -d 10.244.77.0/24 -m comment --comment "${C}" -j ACCEPT`,
        `-A CNI-3d646be8355665bddd96af35 ! -d 224.0.0.0/4 -m comment --comment "${C}" -j MASQUERADE`,
        `-A POSTROUTING -s 10.244.77.2/32 -m comment --comment "${C}" -j CNI-3d646be8355665bddd96af35`,
        'COMMIT',
        '',
      ].join('\n'),
    );
  });

  it('keeps the reference append order and uniqueness for two IPs of one family', () => {
    const text = renderMasqSetup([masqAddr('10.1.0.2/24'), masqAddr('10.2.0.2/24')], 'CNI-x', 'c');
    assert.deepEqual(text.split('\n').slice(2, 7), [
      '-A CNI-x -d 10.1.0.0/24 -m comment --comment c -j ACCEPT',
      '-A CNI-x ! -d 224.0.0.0/4 -m comment --comment c -j MASQUERADE',
      '-A CNI-x -d 10.2.0.0/24 -m comment --comment c -j ACCEPT',
      '-A POSTROUTING -s 10.1.0.2/32 -m comment --comment c -j CNI-x',
      '-A POSTROUTING -s 10.2.0.2/32 -m comment --comment c -j CNI-x',
    ]);
  });

  it('uses the IPv6 multicast prefix and /128 sources', () => {
    const text = renderMasqSetup([masqAddr('fd00::5/64')], 'CNI-y', 'c');
    assert.match(text, /^-A CNI-y ! -d ff00::\/8 -m comment --comment c -j MASQUERADE$/m);
    assert.match(text, /^-A POSTROUTING -s fd00::5\/128 -m comment --comment c -j CNI-y$/m);
  });

  it('splits rule lines with quoted, escaped comments', () => {
    assert.deepEqual(splitRuleArgs(`-A POSTROUTING -s 10.0.0.2/32 -m comment --comment "${C}" -j CNI-z`), [
      '-A',
      'POSTROUTING',
      '-s',
      '10.0.0.2/32',
      '-m',
      'comment',
      '--comment',
      'name: "cniref-net" id: "ctr00"',
      '-j',
      'CNI-z',
    ]);
  });

  it('finds every POSTROUTING jump to the chain (current and legacy forms) and nothing else', () => {
    const listing = [
      '-P POSTROUTING ACCEPT',
      `-A POSTROUTING -s 10.0.0.2/32 -m comment --comment "${C}" -j CNI-z`,
      `-A POSTROUTING -s 10.0.0.0/24 -m comment --comment "${C}" -j CNI-z`,
      '-A POSTROUTING -s 10.0.0.3/32 -j CNI-zz',
      '-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ',
    ];
    const jumps = jumpsTo(listing, 'CNI-z');
    assert.equal(jumps.length, 2);
    assert.equal(
      renderMasqTeardown(jumps, ['CNI-z']),
      [
        '*nat',
        ':CNI-z - [0:0]',
        `-D POSTROUTING -s 10.0.0.2/32 -m comment --comment "${C}" -j CNI-z`,
        `-D POSTROUTING -s 10.0.0.0/24 -m comment --comment "${C}" -j CNI-z`,
        '-X CNI-z',
        'COMMIT',
        '',
      ].join('\n'),
    );
  });

  it('finds the containers of one network in a save dump (for GC)', () => {
    const a = masqChainName('net1', 'ctr-a');
    const b = masqChainName('net1', 'ctr-b');
    const other = masqChainName('net2', 'ctr-c');
    const save = [
      '*nat',
      `-A POSTROUTING -s 10.0.0.2/32 -m comment --comment "name: \\"net1\\" id: \\"ctr-a\\"" -j ${a}`,
      `-A ${b} -d 10.0.0.0/24 -m comment --comment "name: \\"net1\\" id: \\"ctr-b\\"" -j ACCEPT`,
      `-A POSTROUTING -s 10.1.0.2/32 -m comment --comment "name: \\"net2\\" id: \\"ctr-c\\"" -j ${other}`,
      '-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \\"net1\\" id: \\"ctr-a\\"" -j CNI-DN-1',
      // a comment that claims our network but points elsewhere is not ours to touch
      '-A POSTROUTING -m comment --comment "name: \\"net1\\" id: \\"ctr-x\\"" -j ACCEPT',
      'COMMIT',
    ].join('\n');
    assert.deepEqual(
      [...masqStateByContainer(save, 'net1')],
      [
        ['ctr-a', a],
        ['ctr-b', b],
      ],
    );
  });
});

describe('bridge ipMasq: nftables', () => {
  it('derives the upstream comment: instance hash, names, 128 characters at most', () => {
    assert.equal(nftNetworkHash('net1').length, 16);
    assert.equal(nftInstanceHash('net1', 'eth0', 'ctr').length, 33);
    assert.ok(nftInstanceHash('net1', 'eth0', 'ctr').startsWith(`${nftNetworkHash('net1')}-`));
    assert.equal(nftMasqComment('net1', 'eth0', 'ctr'), `${nftInstanceHash('net1', 'eth0', 'ctr')}, net: net1, if: eth0, id: ctr`);
    assert.equal(nftMasqComment('net1', 'eth0', 'c'.repeat(200)).length, 128);
  });

  it('renders one transaction: table, chains, postrouting rewritten, stale rules out, one rule per IP', () => {
    const doc = renderNftMasqSetup([masqAddr('10.1.0.5/24'), masqAddr('fd00::5/64')], 'CMT', [7]) as { nftables: unknown[] };
    const cmds = doc.nftables.map((c) => JSON.stringify(c));
    assert.equal(cmds.length, 10);
    assert.equal(cmds[0], '{"add":{"table":{"family":"inet","name":"cni_plugins_masquerade"}}}');
    assert.equal(
      cmds[2],
      '{"add":{"chain":{"family":"inet","table":"cni_plugins_masquerade","name":"postrouting","type":"nat","hook":"postrouting","prio":100,"policy":"accept"}}}',
    );
    assert.equal(cmds[3], '{"flush":{"chain":{"family":"inet","table":"cni_plugins_masquerade","name":"postrouting"}}}');
    assert.equal(cmds[7], '{"delete":{"rule":{"family":"inet","table":"cni_plugins_masquerade","chain":"masq_checks","handle":7}}}');
    assert.equal(
      cmds[8],
      '{"add":{"rule":{"family":"inet","table":"cni_plugins_masquerade","chain":"masq_checks","comment":"CMT","expr":[' +
        '{"match":{"op":"==","left":{"payload":{"protocol":"ip","field":"saddr"}},"right":"10.1.0.5"}},' +
        '{"match":{"op":"!=","left":{"payload":{"protocol":"ip","field":"daddr"}},"right":{"prefix":{"addr":"10.1.0.0","len":24}}}},' +
        '{"masquerade":null}]}}}',
    );
    assert.match(cmds[9]!, /"protocol":"ip6","field":"saddr"}},"right":"fd00::5"/);
  });

  it('reads rule handles and comments from nft -j output', () => {
    const listing = {
      nftables: [
        { metainfo: { version: '1.0.6' } },
        { chain: { family: 'inet', table: 'cni_plugins_masquerade', name: 'masq_checks', handle: 1 } },
        { rule: { family: 'inet', chain: 'masq_checks', handle: 5, comment: 'abc, net: x' } },
        { rule: { family: 'inet', chain: 'masq_checks', handle: 6 } },
      ],
    };
    assert.deepEqual(nftRulesOf(listing), [
      { handle: 5, comment: 'abc, net: x' },
      { handle: 6, comment: '' },
    ]);
  });
});

describe('bridge macspoofchk', () => {
  it('names chains and comments as pkg/link/spoofcheck.go', () => {
    assert.equal(spoofRefId('ctr1', 'eth0'), 'ctr1-eth0');
    assert.deepEqual(spoofChains('ctr1-eth0'), {
      iface: 'cni-br-iface-ctr1-eth0',
      mac: 'cni-br-iface-ctr1-eth0-mac',
      comment: 'macspoofchk-ctr1-eth0',
    });
  });

  it('renders the setup: base chain at -300, iface jump, MAC return, drop', () => {
    const doc = renderSpoofSetup('veth01020304', '02:00:00:00:00:09', 'ctr1-eth0') as { nftables: unknown[] };
    const cmds = doc.nftables.map((c) => JSON.stringify(c));
    assert.equal(
      cmds[1],
      '{"add":{"chain":{"family":"bridge","table":"nat","name":"PREROUTING","type":"filter","hook":"prerouting","prio":-300,"policy":"accept"}}}',
    );
    assert.equal(
      cmds[6],
      '{"add":{"rule":{"family":"bridge","table":"nat","chain":"PREROUTING","comment":"macspoofchk-ctr1-eth0","expr":[' +
        '{"match":{"op":"==","left":{"meta":{"key":"iifname"}},"right":"veth01020304"}},{"jump":{"target":"cni-br-iface-ctr1-eth0"}}]}}}',
    );
    assert.equal(
      cmds[8],
      '{"add":{"rule":{"family":"bridge","table":"nat","chain":"cni-br-iface-ctr1-eth0-mac","comment":"macspoofchk-ctr1-eth0","expr":[' +
        '{"match":{"op":"==","left":{"payload":{"protocol":"ether","field":"saddr"}},"right":"02:00:00:00:00:09"}},{"return":null}]}}}',
    );
    assert.equal(cmds[9], '{"add":{"rule":{"family":"bridge","table":"nat","chain":"cni-br-iface-ctr1-eth0-mac","comment":"macspoofchk-ctr1-eth0","expr":[{"drop":null}]}}}');
  });

  it('tears down only what exists for the attachment', () => {
    const listing = {
      nftables: [
        { chain: { name: 'PREROUTING' } },
        { chain: { name: 'cni-br-iface-ctr1-eth0' } },
        { chain: { name: 'cni-br-iface-ctr1-eth0-mac' } },
        { rule: { chain: 'PREROUTING', handle: 4, comment: 'macspoofchk-ctr1-eth0' } },
        { rule: { chain: 'PREROUTING', handle: 9, comment: 'macspoofchk-ctr2-eth0' } },
      ],
    };
    const doc = renderSpoofTeardown(listing, 'ctr1-eth0') as { nftables: unknown[] };
    assert.deepEqual(
      doc.nftables.map((c) => Object.keys(c as object)[0] + ':' + JSON.stringify(Object.values(c as object)[0])),
      [
        'delete:{"rule":{"family":"bridge","table":"nat","chain":"PREROUTING","handle":4}}',
        'flush:{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctr1-eth0"}}',
        'delete:{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctr1-eth0"}}',
        'flush:{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctr1-eth0-mac"}}',
        'delete:{"chain":{"family":"bridge","table":"nat","name":"cni-br-iface-ctr1-eth0-mac"}}',
      ],
    );
    assert.equal(renderSpoofTeardown({ nftables: [{ chain: { name: 'PREROUTING' } }] }, 'ctr1-eth0'), null);
  });
});
