// portmap's conditionsV4/V6 grammar: one rule-match fragment and nothing else, refused at config
// load (code 7, the field and the token named) in both forms; what the reference documents and
// weft's tests use is still accepted.
import assert from 'node:assert/strict';

import { iptablesConditionsProblem, nftConditionsProblem } from '../../cni-plugins/portmap/conditions.js';
import { parseConfig, PortMapConfigError, type Backend } from '../../cni-plugins/portmap/config.js';
import type { NetConf } from '../../cni-plugins/skel/types.js';

const conf = (extra: Record<string, unknown>): NetConf => ({
  cniVersion: '1.0.0',
  name: 'net1',
  type: 'portmap',
  runtimeConfig: { portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }] },
  ...extra,
});
const parse = (c: NetConf) => parseConfig(c, { defaultBackend: (): Backend => 'iptables' });

function refusedAtLoad(backend: Backend, key: 'conditionsV4' | 'conditionsV6', tokens: string[], bad: string, why: RegExp): void {
  assert.throws(
    () => parse(conf({ backend, [key]: tokens })),
    (e: unknown) => {
      assert.ok(e instanceof PortMapConfigError, String(e));
      assert.equal(e.code, 7);
      assert.ok(e.message.startsWith(`${key}: token ${JSON.stringify(bad)} `), e.message);
      assert.match(e.message, why);
      assert.ok(e.message.includes(JSON.stringify(tokens)), e.message);
      return true;
    },
  );
}

describe('portmap conditions grammar: iptables', () => {
  it('accepts match options with plain arguments, negated either way', () => {
    for (const ok of [
      ['-d', '192.0.2.0/24'],
      ['!', '-d', '192.0.2.0/24'],
      ['-m', 'addrtype', '--src-type', 'LOCAL', '-d', '192.0.2.9', '-i', 'eth0'],
      ['-m', 'addrtype', '!', '--dst-type', 'LOCAL'],
      ['-p', 'tcp', '--tcp-flags', 'SYN,ACK', 'SYN'],
      ['-m', 'conntrack', '--ctstate', 'NEW', '-m', 'mark', '!', '--mark', '0x1/0x1'],
      ['--destination', '2001:db8::/48', '-o', 'eth+'],
    ]) {
      assert.equal(iptablesConditionsProblem(ok), null, JSON.stringify(ok));
      assert.deepEqual(parse(conf({ conditionsV4: ok })).conditionsV4, ok);
    }
  });

  it('refuses verdicts, jumps, commands, tables and anything that is not one plain argument', () => {
    const cases: [string[], string, RegExp][] = [
      [['-d', '1.2.3.4', '-j', 'ACCEPT'], '-j', /not a match option/],
      [['-d', '1.2.3.4', '--jump', 'ACCEPT'], '--jump', /--jump/],
      [['-d', '1.2.3.4', '--ju', 'ACCEPT'], '--ju', /takes it as --jump/],
      [['-g', 'KUBE-X'], '-g', /not a match option/],
      [['--goto', 'KUBE-X'], '--goto', /--goto/],
      [['-jACCEPT'], '-jACCEPT', /not an option/],
      [['--jump=ACCEPT'], '--jump=ACCEPT', /not an option/],
      [['-t', 'filter'], '-t', /not a match option/],
      [['--table', 'filter'], '--table', /--table/],
      [['-A', 'INPUT'], '-A', /not a match option/],
      [['-F'], '-F', /not a match option/],
      [['-d', '1.2.3.4', '--flush'], '--flush', /--flush/],
      [['-d', '1.2.3.4', '--set-counters', '1', '2'], '--set-counters', /--set-counters/],
      [['-m', 'comment', '--comment', '"x" -j ACCEPT'], '"x" -j ACCEPT', /white space|"\\""/],
      [['-d', '1.2.3.4#'], '1.2.3.4#', /"#"/],
      [['-s', "1.2.3.4'"], "1.2.3.4'", /"'"/],
      [['-s', '1.2.3.4\\'], '1.2.3.4\\', /"\\\\"/],
      [['-d', '1.2.3.4\u001b[2J'], '1.2.3.4\u001b[2J', /control/],
      [['-d', '1.2.3.4\u2028'], '1.2.3.4\u2028', /white space/],
      [['-d', ''], '', /empty/],
      [['-d', '1.2.3.4', '!'], '!', /without an option/],
      [['-s', '10.0.0.0/8', '!', '!', '-d', '1.2.3.4'], '!', /second "!"/],
      [['--', '-j', 'ACCEPT'], '--', /not an option/],
    ];
    for (const [tokens, bad, why] of cases) refusedAtLoad('iptables', 'conditionsV4', tokens, bad, why);
    refusedAtLoad('iptables', 'conditionsV6', ['-d', '2001:db8::1', '-j', 'DROP'], '-j', /not a match option/);
  });
});

describe('portmap conditions grammar: nftables', () => {
  it('accepts match expressions', () => {
    for (const ok of [
      ['ip', 'daddr', '!=', '192.0.2.0/24'],
      ['ip6', 'daddr', '!=', '2001:db8::/32'],
      ['meta', 'iifname', 'eth0', 'ct', 'state', 'new'],
      ['meta', 'mark', '&', '0x1', '==', '0x1', 'meta', 'priority', '1:2'],
    ]) {
      assert.equal(nftConditionsProblem(ok), null, JSON.stringify(ok));
      assert.deepEqual(parse(conf({ backend: 'nftables', conditionsV4: ok })).conditionsV4, ok);
    }
  });

  it('refuses new commands, blocks, comments, quotes, variables, sets, verdicts and statements', () => {
    const cases: [string[], string, RegExp][] = [
      [['ip', 'daddr', '1.2.3.4', ';', 'flush', 'ruleset'], ';', /";"/],
      [['ip', 'daddr', '1.2.3.4;', 'flush', 'ruleset'], '1.2.3.4;', /";"/],
      [['ip daddr 1.2.3.4; flush ruleset'], 'ip daddr 1.2.3.4; flush ruleset', /white space/],
      [['ip', 'daddr', '{', '1.2.3.4', '}'], '{', /"\{"/],
      [['}', ';', 'delete', 'table', 'inet', 'x'], '}', /"\}"/],
      [['ip', 'daddr', '1.2.3.4', '#'], '#', /"#"/],
      [['meta', 'iifname', '"eth0"'], '"eth0"', /"\\""/],
      [['meta', 'iifname', "'eth0'"], "'eth0'", /"'"/],
      [['ip', 'daddr', '$addr'], '$addr', /"\$"/],
      [['ip', 'daddr', '@allowed'], '@allowed', /"@"/],
      [['ip', 'daddr', '1.2.3.4\\'], '1.2.3.4\\', /"\\\\"/],
      [['ip', 'daddr', '1.2.3.4', 'accept'], 'accept', /not part of a match/],
      [['ip', 'daddr', '1.2.3.4', 'jump', 'x'], 'jump', /not part of a match/],
      [['ip', 'daddr', '1.2.3.4', 'drop'], 'drop', /not part of a match/],
      [['flush', 'ruleset'], 'flush', /not part of a match/],
      [['meta', 'mark', 'set', '1'], 'set', /not part of a match/],
      [['ip', 'daddr', '1.2.3.4', 'counter'], 'counter', /not part of a match/],
      [['ip', 'daddr', '1.2.3.4', 'dnat', 'to', '1.1.1.1'], 'dnat', /not part of a match/],
      [['ip', 'daddr', 'vmap', 'x'], 'vmap', /not part of a match/],
      [['ip\u00a0daddr'], 'ip\u00a0daddr', /white space/],
      [['ip', 'daddr', '1.2.3.4\u001b'], '1.2.3.4\u001b', /control/],
    ];
    for (const [tokens, bad, why] of cases) refusedAtLoad('nftables', 'conditionsV4', tokens, bad, why);
    refusedAtLoad('nftables', 'conditionsV6', ['ip6', 'daddr', '::1', ';', 'flush', 'ruleset'], ';', /";"/);
  });

  it('keeps the line-break message for line breaks and NUL', () => {
    assert.throws(() => parse(conf({ backend: 'nftables', conditionsV4: ['ip', 'daddr', '1.2.3.4\nflush ruleset'] })), /conditionsV4: token "1.2.3.4\\nflush ruleset" contains a line break or NUL/);
  });
});
