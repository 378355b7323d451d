// The nft and iptables-restore renderers without a kernel: what each value position accepts and
// refuses (with the field and the value in the error), that only renderer-made pieces reach a
// script or payload, and that rule text kept as a string is checked again when it is written back.
// test/netns/render-*.test.ts puts the same renderers against the real tools.
import assert from 'node:assert/strict';

import {
  iptablesPayload,
  xt,
  xtAppend,
  xtChain,
  xtDeclare,
  xtDelete,
  xtInsert,
  xtJoin,
  xtQuote,
  xtSavedSpec,
  xtWord,
  type XtLine,
  type XtSpec,
} from '../../src/render/iptables.js';
import { nft, nftComment, nftJoin, nftJson, nftName, nftRule, nftRuleBody, nftScript, nftWord, nftWords, type NftPart } from '../../src/render/nft.js';
import { UnsafeValueError } from '../../src/render/word.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

function refused(f: () => unknown, protocol: string, field: string, value: string, reason: RegExp): void {
  assert.throws(f, (e: unknown) => {
    assert.ok(e instanceof UnsafeValueError, String(e));
    assert.equal(e.protocol, protocol);
    assert.equal(e.field, field);
    assert.equal(e.value, value);
    assert.match(e.reason, reason);
    assert.ok(e.message.includes(JSON.stringify(value)));
    return true;
  });
}

describe('nft renderer', () => {
  it('renders commands from literal text and checked values', () => {
    const t = nft`ip ${nftName('table', 'cni_hostport')}`;
    const script = nftScript([
      nft`add table ${t} { comment ${nftComment('comment', 'CNI portmap plugin')} ; }`,
      nft`add rule ${t} hostports ip daddr ${IPAddr.parse('10.0.0.1')} tcp dport ${8080} dnat to ${IPNet.parse('10.1.0.0/16')} comment ${nftComment('id', 'c1')}`,
    ]);
    assert.equal(
      script,
      'add table ip cni_hostport { comment "CNI portmap plugin" ; }\nadd rule ip cni_hostport hostports ip daddr 10.0.0.1 tcp dport 8080 dnat to 10.1.0.0/16 comment "c1"\n',
    );
    assert.equal(nftJoin([nft`a`, nftWords('w', []), nft`b`]).text, 'a b');
  });

  it('refuses names that nft would not read as that name', () => {
    for (const [name, why] of [
      ['a;b', /";"/],
      ['a b', /white space/],
      ['a\nb', /control/],
      ['1abc', /plain nft name/],
      ['-x', /plain nft name/],
      ['.', /plain nft name/],
      ['meta', /keyword/],
      ['ip6', /keyword/],
      ['x'.repeat(256), /longer than 255/],
      ['é', /plain nft name/],
      ['', /empty/],
    ] as const) {
      refused(() => nftName('chain', name), 'nft', 'chain', name, why);
    }
    for (const ok of ['postrtg', 'forward', 'hostports_all', 'flannel-ipv4', 'ip-masq-agent', 'cni-br-iface-ctr1-eth0', '_x.y', 'a/b']) {
      assert.equal(nftName('chain', ok).text, ok);
    }
  });

  it('quotes comments with what nft keeps verbatim, and refuses the rest', () => {
    assert.equal(nftComment('c', "a'b\\c$d@e#f;g{h}i").text, '"a\'b\\c$d@e#f;g{h}i"');
    refused(() => nftComment('c', 'x" ; flush ruleset ; "'), 'nft', 'c', 'x" ; flush ruleset ; "', /"\\""/);
    refused(() => nftComment('c', 'a\tb'), 'nft', 'c', 'a\tb', /control/);
    refused(() => nftComment('c', 'a\u00a0b'), 'nft', 'c', 'a\u00a0b', /white space/);
    refused(() => nftComment('c', 'x'.repeat(129)), 'nft', 'c', 'x'.repeat(129), /longer than 128/);
    refused(() => nftComment('c', ''), 'nft', 'c', '', /empty/);
  });

  it('refuses words with any character that ends, opens, comments, quotes or refers', () => {
    for (const c of [';', '{', '}', '#', '"', "'", '\\', '$', '@', ' ', '\n', '\r', '\0', '\u007f', '\u2028']) {
      refused(() => nftWord('conditionsV4', `a${c}b`), 'nft', 'conditionsV4', `a${c}b`, /./);
    }
    // Strings put into a template are words too; the field names the option they follow.
    refused(() => nft`add rule ip t c iifname ${'x;flush'}`, 'nft', 'value after iifname', 'x;flush', /";"/);
    assert.throws(() => nft`x ${1.5}`, UnsafeValueError);
  });

  it('lets only renderer-made pieces into a command or a script', () => {
    const forged = { text: 'flush ruleset' } as unknown as NftPart;
    assert.throws(() => nft`add rule ip t c ${forged}`, UnsafeValueError);
    assert.throws(() => nftScript([forged]), TypeError);
    assert.throws(() => nftScript(['flush ruleset' as unknown as NftPart]), TypeError);
  });

  it('checks rule text again when it goes back into a command', () => {
    const r = nftRule`ip saddr ${IPAddr.parse('10.0.0.2')} masquerade comment ${nftComment('id', 'c1')}`;
    assert.equal(r, 'ip saddr 10.0.0.2 masquerade comment "c1"');
    assert.equal(nft`add rule ip t c ${nftRuleBody('rule', r)}`.text, `add rule ip t c ${r}`);
    for (const bad of ['accept ; flush ruleset', 'x comment "a" ; flush ruleset', 'x comment "unclosed', 'x "a"b', 'a\nb', 'jump { x }']) {
      refused(() => nftRuleBody('rule', bad), 'nft', 'rule', bad, /./);
    }
  });

  it('checks every string of a JSON document for its place', () => {
    const doc = { nftables: [{ add: { rule: { family: 'bridge', table: 'nat', chain: 'PREROUTING', comment: 'macspoofchk-c-eth0', expr: [{ match: { op: '==', left: { meta: { key: 'iifname' } }, right: 'veth1' } }] } } }] };
    assert.equal(nftJson(doc), JSON.stringify(doc));
    const withRight = (right: string): unknown => ({ nftables: [{ add: { rule: { family: 'inet', table: 't', chain: 'c', expr: [{ match: { op: '==', left: { meta: { key: 'iifname' } }, right } }] } } }] });
    refused(() => nftJson(withRight('@allowed') as never), 'nft', 'nftables[0].add.rule.expr[0].match.right', '@allowed', /"@"/);
    refused(() => nftJson(withRight('$v') as never), 'nft', 'nftables[0].add.rule.expr[0].match.right', '$v', /"\$"/);
    refused(() => nftJson({ nftables: [{ add: { chain: { family: 'ip', table: 't', name: 'a b' } } }] }), 'nft', 'nftables[0].add.chain.name', 'a b', /white space/);
    refused(() => nftJson({ nftables: [{ add: { rule: { family: 'ip', table: 't', chain: 'c', comment: 'a"b', expr: [] } } }] }), 'nft', 'nftables[0].add.rule.comment', 'a"b', /"\\""/);
  });
});

describe('iptables-restore renderer', () => {
  it('renders rule specs as iptables-save prints them', () => {
    const spec = xt`-s ${IPNet.parse('10.5.0.0/16')} -m comment --comment ${xtQuote('comment', 'flanneld masq')} -j ${xtChain('chain', 'FLANNEL-POSTRTG')}`;
    assert.equal(spec, '-s 10.5.0.0/16 -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG');
    assert.equal(xtQuote('c', 'KUBE-MARK-MASQ').text, 'KUBE-MARK-MASQ');
    assert.equal(xtQuote('c', 'name: "n" id: \'c\' \\').text, '"name: \\"n\\" id: \\\'c\\\' \\\\"');
    assert.equal(xtQuote('c', '').text, '""');
    assert.equal(xtJoin([xt`-p tcp`, '' as XtSpec, xt`-j RETURN`]), '-p tcp -j RETURN');
    assert.equal(
      iptablesPayload('nat', [xtDeclare('CNI-x'), xtAppend('CNI-x', spec), xtInsert('POSTROUTING', 1, spec), xtDelete('POSTROUTING', spec)]),
      `*nat\n:CNI-x - [0:0]\n-A CNI-x ${spec}\n-I POSTROUTING 1 ${spec}\n-D POSTROUTING ${spec}\nCOMMIT\n`,
    );
  });

  it('refuses chain names iptables would not read back as that name', () => {
    for (const [name, why] of [
      ['a b', /white space/],
      ['a"b', /"\\""/],
      ["a'b", /"'"/],
      ['a\\b', /"\\\\"/],
      ['a#b', /"#"/],
      ['-j', /starts with/],
      ['!x', /starts with/],
      ['ACCEPT', /verdict/],
      ['x'.repeat(29), /longer than 28/],
      ['a\nCOMMIT', /control/],
    ] as const) {
      refused(() => xtChain('externalSetMarkChain', name), 'iptables-restore', 'externalSetMarkChain', name, why);
    }
    refused(() => xtDeclare('a b'), 'iptables-restore', 'chain', 'a b', /white space/);
  });

  it('refuses comments with control characters or non-blank white space, or too long', () => {
    for (const bad of ['a\nb', 'a\rb', 'a\0b', 'a\u0085b', 'a\u00a0b', 'a\tb', 'x'.repeat(256)]) refused(() => xtQuote('comment', bad), 'iptables-restore', 'comment', bad, /./);
  });

  it('refuses words that are not one plain argument; strings in templates are words', () => {
    for (const bad of ['a b', '"x"', "'", '\\', '#', '', 'a\nb']) refused(() => xtWord('conditionsV4', bad), 'iptables-restore', 'conditionsV4', bad, /./);
    refused(() => xt`-j ${'ACCEPT -m comment'}`, 'iptables-restore', 'value after -j', 'ACCEPT -m comment', /white space/);
  });

  it('lets only renderer-made lines into a payload, and checks specs again', () => {
    assert.throws(() => iptablesPayload('nat', [{ line: '-F' } as unknown as XtLine]), TypeError);
    assert.throws(() => xtAppend('c', '-j ACCEPT\n-A INPUT -j DROP' as XtSpec), UnsafeValueError);
    assert.throws(() => iptablesPayload('nat; -F' as 'nat', []), UnsafeValueError);
  });

  it('takes back what iptables-save printed, and nothing that is not one line of arguments', () => {
    const saved = '-p tcp -m comment --comment "dnat name: \\"n\\" id: \\"c\\"" -m multiport --dports 80 -j CNI-DN-1';
    assert.equal(xtSavedSpec(saved), saved);
    for (const bad of ['-m comment --comment "unclosed', '-m comment --comment "a"b', '-j X\n-A INPUT -j DROP', "-s 1.2.3.4'", '-m comment --comment "a\tb"']) {
      refused(() => xtSavedSpec(bad), 'iptables-restore', 'rule read back', bad, /./);
    }
  });
});
