// ip-masq-agent mode without a kernel: the config file parser, the rule model's golden renderings
// (iptables and nftables, both families, default and custom config), the plan that switches
// between flannel's and the agent's rules, and the keeper's passes through a fake runner.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  AgentConfigError,
  DEFAULT_NON_MASQUERADE_CIDRS,
  defaultAgentConfig,
  describeAgentChange,
  parseAgentConfig,
  parseGoDuration,
  type AgentConfig,
} from '../../src/ipmasq/agent-config.js';
import { agentRules } from '../../src/ipmasq/agent-rules.js';
import { chainLines, jumpSpec, parseSave, planTable } from '../../src/ipmasq/iptables.js';
import { ConflictingMasqModesError, RuleKeeper, type IpMasqMetrics, type Runner } from '../../src/ipmasq/keeper.js';
import { desiredChains, type FamilyInput } from '../../src/ipmasq/model.js';
import { compareTable, parseListTable, renderTable } from '../../src/ipmasq/nftables.js';
import { CommandError } from '../../src/util/exec.js';
import { IPNet } from '../../src/util/ip.js';
import type { LogFields, Logger } from '../../src/util/log.js';

const FIXTURES = new URL('../fixtures/ipmasq-agent/', import.meta.url);
const fixture = (name: string): string => readFileSync(new URL(name, FIXTURES), 'utf8');
const fixtureLines = (name: string): string[] => fixture(name).trimEnd().split('\n');

// The same networks as the integration test, so its kernel read-back is compared with these files too.
const V4: FamilyInput = { network: IPNet.parse('10.8.0.0/16'), subnet: IPNet.parse('10.8.1.0/24') };
const V6: FamilyInput = { network: IPNet.parse('fd08::/48'), subnet: IPNet.parse('fd08:0:0:1::/64') };
const CUSTOM = parseAgentConfig(fixture('custom.yaml')).config;

function agentChains(agent: AgentConfig, fullyRandom = true) {
  return desiredChains({ families: [V4, V6], masq: false, forward: false, fullyRandom, agent });
}

/** The lines iptables-save prints for the agent chain: declaration, jump, rules. */
function saveLines(spec: ReturnType<typeof agentChains>[number]): string[] {
  return [':WEFT-IP-MASQ - [0:0]', `-A POSTROUTING ${jumpSpec('agent')}`, ...chainLines(spec)];
}

function rejects(text: string, message: RegExp): void {
  assert.throws(
    () => parseAgentConfig(text, '/etc/config/ip-masq-agent'),
    (e: unknown) => {
      assert.ok(e instanceof AgentConfigError, String(e));
      assert.equal(e.source, '/etc/config/ip-masq-agent');
      assert.match(e.message, message);
      return true;
    },
  );
}

describe('ipmasq agent config file', () => {
  it('has ip-masq-agent\'s defaults with every reserved range (its --nomasq-all-reserved-ranges list)', () => {
    const d = defaultAgentConfig();
    assert.deepEqual(d.nonMasqueradeCIDRs.map(String), [
      '10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '192.0.0.0/24', '192.0.2.0/24',
      '192.88.99.0/24', '198.18.0.0/15', '198.51.100.0/24', '203.0.113.0/24', '240.0.0.0/4',
    ]);
    assert.deepEqual([d.masqLinkLocal, d.masqLinkLocalIPv6, d.resyncIntervalMs, d.cidrLimit], [false, false, 60_000, 64]);
    assert.equal(DEFAULT_NON_MASQUERADE_CIDRS.length, 11);
  });

  it('an empty file, a comment-only file and null values mean the defaults', () => {
    for (const text of ['', '\n', '# nothing yet\n', 'null', '{}', 'nonMasqueradeCIDRs: null\nmasqLinkLocal: ~\nresyncInterval:\n']) {
      assert.deepEqual(parseAgentConfig(text), { config: defaultAgentConfig(), warnings: [] }, JSON.stringify(text));
    }
  });

  it('reads YAML and JSON with ip-masq-agent\'s keys; a given list replaces the defaults', () => {
    const y = parseAgentConfig('nonMasqueradeCIDRs: [10.1.0.0/24, "192.168.0.0/16", fd00::/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true\nresyncInterval: 1m30s\ncidrLimit: 3\n');
    assert.deepEqual(y.config.nonMasqueradeCIDRs.map(String), ['10.1.0.0/24', '192.168.0.0/16', 'fd00::/8']);
    assert.deepEqual([y.config.masqLinkLocal, y.config.masqLinkLocalIPv6, y.config.resyncIntervalMs, y.config.cidrLimit], [true, true, 90_000, 3]);
    const j = parseAgentConfig('{"nonMasqueradeCIDRs": ["10.1.0.0/24"], "masqLinkLocal": false, "resyncInterval": "500ms"}');
    assert.deepEqual(j.config.nonMasqueradeCIDRs.map(String), ['10.1.0.0/24']);
    assert.equal(j.config.resyncIntervalMs, 500);
    // An empty list: only link-local and the cluster network stay unmasqueraded.
    assert.deepEqual(parseAgentConfig('nonMasqueradeCIDRs: []').config.nonMasqueradeCIDRs, []);
    // resyncInterval "0" is the default, as in ip-masq-agent.
    assert.equal(parseAgentConfig('resyncInterval: "0"').config.resyncIntervalMs, 60_000);
  });

  it('names the bad entry of nonMasqueradeCIDRs', () => {
    rejects('nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0/8]', /^\/etc\/config\/ip-masq-agent: nonMasqueradeCIDRs\[1\] "10\.0\.0\/8" is not a CIDR: /);
    rejects('nonMasqueradeCIDRs: [10.0.0.1/8]', /^\/etc\/config\/ip-masq-agent: nonMasqueradeCIDRs\[0\] "10\.0\.0\.1\/8" is not aligned to a CIDR block \(the network is 10\.0\.0\.0\/8\)$/);
    rejects('nonMasqueradeCIDRs: [10.0.0.0]', /nonMasqueradeCIDRs\[0\] "10\.0\.0\.0" is not a CIDR: missing "\/prefix-length"$/);
    rejects('nonMasqueradeCIDRs: [10.0.0.0/33]', /nonMasqueradeCIDRs\[0\] "10\.0\.0\.0\/33" is not a CIDR: prefix length must be 0\.\.32$/);
    rejects('nonMasqueradeCIDRs: [fd00::1/8]', /nonMasqueradeCIDRs\[0\] "fd00::1\/8" is not aligned to a CIDR block \(the network is fd00::\/8\)$/);
    rejects('nonMasqueradeCIDRs: [10.0.0.0/8, 7]', /nonMasqueradeCIDRs\[1\] must be a string in CIDR notation, got number 7$/);
    rejects('nonMasqueradeCIDRs: 10.0.0.0/8', /nonMasqueradeCIDRs must be a list of CIDRs, got string "10\.0\.0\.0\/8"$/);
  });

  it('enforces cidrLimit (64 by default)', () => {
    const many = `nonMasqueradeCIDRs: [${Array.from({ length: 65 }, (_, i) => `10.${i}.0.0/16`).join(', ')}]`;
    rejects(many, /nonMasqueradeCIDRs has 65 entries; at most 64 are accepted \(raise cidrLimit if this is intended\)$/);
    assert.equal(parseAgentConfig(`${many}\ncidrLimit: 65`).config.nonMasqueradeCIDRs.length, 65);
    rejects('cidrLimit: 0', /cidrLimit must be a positive integer, got number 0$/);
  });

  it('rejects wrong types, bad durations, unknown keys and broken YAML', () => {
    rejects('masqLinkLocal: "yes"', /masqLinkLocal must be true or false, got string "yes"$/);
    rejects('masqLinkLocalIPv6: 1', /masqLinkLocalIPv6 must be true or false, got number 1$/);
    rejects('resyncInterval: 60', /resyncInterval must be a Go duration string such as "60s", got number 60$/);
    rejects('resyncInterval: 60 seconds', /resyncInterval "60 seconds" is not a Go duration/);
    rejects('resyncInterval: -5s', /resyncInterval "-5s" must not be negative$/);
    rejects('resyncInterval: 25h', /resyncInterval "25h" is longer than 24h$/);
    rejects('nonMasqueradeCidrs: [10.0.0.0/8]', /unknown key "nonMasqueradeCidrs" \(known: nonMasqueradeCIDRs, masqLinkLocal, masqLinkLocalIPv6, resyncInterval, cidrLimit\)$/);
    rejects('- 10.0.0.0/8', /must be a mapping of ip-masq-agent keys \(nonMasqueradeCIDRs, masqLinkLocal, \.\.\.\), got a list$/);
    rejects('nonMasqueradeCIDRs: [10.0.0.0/8', /^\/etc\/config\/ip-masq-agent: not valid YAML or JSON: /);
    rejects('masqLinkLocal: true\nmasqLinkLocal: false', /not valid YAML or JSON: duplicated mapping key/);
  });

  it('accepts ip-masq-agent keys weft does not implement, with a warning each', () => {
    const p = parseAgentConfig('nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqRandomFully: true\nsnatTarget: 10.0.0.1\n');
    assert.deepEqual(p.config.nonMasqueradeCIDRs.map(String), ['10.0.0.0/8']);
    assert.deepEqual(p.warnings, [
      'masqRandomFully is ignored: weft uses --random-fully whenever iptables has it (--ip-masq-fully-random-disable turns it off)',
      "snatTarget is ignored: weft masquerades; SNAT to a fixed address is not supported",
    ]);
  });

  it('parses Go durations', () => {
    const cases: [string, number | null][] = [
      ['60s', 60_000], ['1m30s', 90_000], ['1.5h', 5_400_000], ['300ms', 300], ['2us', 0.002], ['1µs', 0.001],
      ['.5s', 500], ['0', 0], ['+1s', 1000], ['-1s', -1000], ['1', null], ['', null], ['s', null], ['1d', null], ['1s ', null],
    ];
    for (const [text, ms] of cases) assert.equal(parseGoDuration(text), ms, text);
  });

  it('says what changed between two configs', () => {
    const d = defaultAgentConfig();
    assert.deepEqual(describeAgentChange(d, d), []);
    assert.deepEqual(describeAgentChange(d, CUSTOM), [
      'nonMasqueradeCIDRs added: 100.128.0.0/16, 10.8.0.0/16, fd99::/64',
      `nonMasqueradeCIDRs removed: ${DEFAULT_NON_MASQUERADE_CIDRS.join(', ')}`,
      'masqLinkLocal: false -> true',
      'resyncInterval: 60000ms -> 10000ms',
    ]);
    const reordered = { ...d, nonMasqueradeCIDRs: [...d.nonMasqueradeCIDRs].reverse() };
    assert.deepEqual(describeAgentChange(d, reordered), ['nonMasqueradeCIDRs reordered']);
  });
});

describe('ipmasq agent rules: golden renderings', () => {
  it('default config, iptables and ip6tables', () => {
    const [v4, v6] = agentChains(defaultAgentConfig());
    assert.deepEqual(saveLines(v4!), fixtureLines('default-v4.iptables'));
    assert.deepEqual(saveLines(v6!), fixtureLines('default-v6.iptables'));
  });

  it('custom config, iptables and ip6tables: masqLinkLocal, IPv6 entries, the cluster network not repeated', () => {
    const [v4, v6] = agentChains(CUSTOM);
    assert.deepEqual(saveLines(v4!), fixtureLines('custom-v4.iptables'));
    assert.deepEqual(saveLines(v6!), fixtureLines('custom-v6.iptables'));
  });

  it('default and custom config, nftables (ip and ip6)', () => {
    for (const [name, agent] of [['default', defaultAgentConfig()], ['custom', CUSTOM]] as const) {
      const [v4, v6] = agentChains(agent);
      assert.equal(renderTable(4, [v4!], false), fixture(`${name}-v4.nft`), `${name} v4`);
      assert.equal(renderTable(6, [v6!], false), fixture(`${name}-v6.nft`), `${name} v6`);
    }
  });

  it('masquerades without --random-fully when it is off, and masqLinkLocalIPv6 drops fe80::/10', () => {
    const [, v6] = agentChains({ ...defaultAgentConfig(), masqLinkLocalIPv6: true }, false);
    assert.deepEqual(chainLines(v6!), [
      '-A WEFT-IP-MASQ -d fd08::/48 -m comment --comment "weft-ip-masq: cluster network traffic is not subject to MASQUERADE" -j RETURN',
      '-A WEFT-IP-MASQ -m comment --comment "weft-ip-masq: outbound traffic is subject to MASQUERADE (must be last in chain)" -j MASQUERADE',
    ]);
  });

  it('lists each CIDR once, whatever the config repeats', () => {
    const agent = { ...defaultAgentConfig(), nonMasqueradeCIDRs: ['169.254.0.0/16', '10.0.0.0/8', '10.0.0.0/8'].map((c) => IPNet.parse(c)) };
    const dsts = agentRules(V4.network, agent, true).map((r) => r.matches.map((m) => (m.kind === 'dst' ? m.net.toString() : m.kind)).join());
    assert.deepEqual(dsts, ['169.254.0.0/16', '10.8.0.0/16', '10.0.0.0/8', '']);
  });

  it('exactly one masquerade mode: flannel\'s or the agent\'s chain, then forward', () => {
    const kinds = desiredChains({ families: [V4, V6], masq: false, forward: true, fullyRandom: true, agent: CUSTOM }).map((c) => `${c.family}/${c.kind}`);
    assert.deepEqual(kinds, ['4/agent', '4/forward', '6/agent', '6/forward']);
  });
});

describe('ipmasq agent rules: plan and comparison', () => {
  const [agentV4] = agentChains(CUSTOM);
  const [flannelV4] = desiredChains({ families: [V4], masq: true, forward: false, fullyRandom: true });
  const agentSave = ['*nat', ':POSTROUTING ACCEPT [0:0]', ...fixtureLines('custom-v4.iptables'), 'COMMIT', ''].join('\n');
  const flannelSave = ['*nat', ':POSTROUTING ACCEPT [0:0]', ':FLANNEL-POSTRTG - [0:0]', `-A POSTROUTING ${jumpSpec('masq')}`, ...chainLines(flannelV4!), 'COMMIT', ''].join('\n');

  it('writes nothing when the agent chain and its jump are exactly right', () => {
    assert.deepEqual(planTable('nat', [agentV4!], ['masq'], parseSave(agentSave)), { problems: [], payload: null });
  });

  it('switching from flannel mode installs the agent chain and removes flannel\'s, in one transaction', () => {
    const p = planTable('nat', [agentV4!], ['masq'], parseSave(flannelSave));
    assert.deepEqual(p.problems, ['WEFT-IP-MASQ: chain missing', 'POSTROUTING: jump to WEFT-IP-MASQ missing', 'FLANNEL-POSTRTG: not wanted, removing']);
    assert.equal(
      p.payload,
      [
        '*nat',
        ...fixtureLines('custom-v4.iptables').filter((l) => !l.startsWith('-A POSTROUTING')),
        `-A POSTROUTING ${jumpSpec('agent')}`,
        `-D POSTROUTING ${jumpSpec('masq')}`,
        ':FLANNEL-POSTRTG - [0:0]',
        '-X FLANNEL-POSTRTG',
        'COMMIT',
        '',
      ].join('\n'),
    );
  });

  it('switching back to flannel mode removes the agent chain, its jump first', () => {
    const p = planTable('nat', [], ['agent'], parseSave(agentSave));
    assert.equal(p.payload, ['*nat', `-D POSTROUTING ${jumpSpec('agent')}`, ':WEFT-IP-MASQ - [0:0]', '-X WEFT-IP-MASQ', 'COMMIT', ''].join('\n'));
  });

  it('a jump without the addrtype match is not ours: the right one is added', () => {
    const plain = agentSave.replace(' -m addrtype ! --dst-type LOCAL', '');
    const p = planTable('nat', [agentV4!], [], parseSave(plain));
    assert.deepEqual(p.problems, ['POSTROUTING: jump to WEFT-IP-MASQ missing']);
  });

  it('nftables: the chain starts with the local-destination return, compared as nft -j prints it', () => {
    const listing = (exprs: unknown[][]) =>
      JSON.stringify({
        nftables: [
          { table: { family: 'ip', name: 'flannel-ipv4' } },
          { chain: { family: 'ip', table: 'flannel-ipv4', name: 'ip-masq-agent', type: 'nat', hook: 'postrouting', prio: 100, policy: 'accept' } },
          ...exprs.map((expr) => ({ rule: { family: 'ip', table: 'flannel-ipv4', chain: 'ip-masq-agent', expr } })),
        ],
      });
    // As nft 1.0.6 prints the custom config's chain.
    const kernel: unknown[][] = [
      [{ match: { op: '==', left: { fib: { result: 'type', flags: ['daddr'] } }, right: 'local' } }, { return: null }],
      [{ match: { op: '==', left: { payload: { protocol: 'ip', field: 'daddr' } }, right: { prefix: { addr: '10.8.0.0', len: 16 } } } }, { return: null }],
      [{ match: { op: '==', left: { payload: { protocol: 'ip', field: 'daddr' } }, right: { prefix: { addr: '100.128.0.0', len: 16 } } } }, { return: null }],
      [{ masquerade: { flags: 'fully-random' } }],
    ];
    assert.deepEqual(compareTable(4, [agentV4!], parseListTable(listing(kernel))), []);
    assert.deepEqual(compareTable(4, [agentV4!], parseListTable(listing(kernel.slice(1)))), ['flannel-ipv4/ip-masq-agent: missing rule: fib daddr type local return']);
    // flannel's chain in the table (mode switched): the whole table is rewritten.
    const [flannelChain] = desiredChains({ families: [V4], masq: true, forward: false, fullyRandom: true });
    assert.deepEqual(compareTable(4, [flannelChain!], parseListTable(listing(kernel))), ['flannel-ipv4: unexpected chain ip-masq-agent', 'flannel-ipv4: chain postrtg missing']);
  });
});

/** A fake iptables: one nat table per family, kept as iptables-save text, changed only through restore payloads. */
class FakeXtables {
  readonly calls: string[] = [];
  readonly payloads: string[] = [];
  nat: Record<4 | 6, string[]> = { 4: [], 6: [] };
  extraChains: string[] = [];

  readonly runner: Runner = async (command, args, stdin) => {
    this.calls.push([command, ...args].join(' '));
    if (command === 'iptables' && args.includes('-h')) return 'MASQUERADE target options:\n --random-fully\n';
    if (command === 'nft') throw new CommandError('nft', args, 1, 'Error: No such file or directory', 'exit status 1');
    const family = command.startsWith('ip6') ? 6 : 4;
    if (command.endsWith('-save')) return this.save(family);
    if (command.endsWith('-restore')) {
      this.payloads.push(stdin ?? '');
      this.apply(family, stdin ?? '');
      return '';
    }
    throw new Error(`unexpected command ${command}`);
  };

  save(family: 4 | 6): string {
    const chains = new Set([...this.extraChains, ...this.nat[family].filter((l) => l.startsWith(':')).map((l) => l.slice(1).split(' ')[0]!)]);
    const appends = this.nat[family].filter((l) => l.startsWith('-A'));
    return ['*nat', ':POSTROUTING ACCEPT [0:0]', ...[...chains].map((c) => `:${c} - [0:0]`), ...appends, 'COMMIT', ''].join('\n');
  }

  /** Just enough of iptables-restore --noflush: declare (flush) a chain, append, delete a rule, delete a chain. */
  apply(family: 4 | 6, payload: string): void {
    let lines = this.nat[family];
    for (const l of payload.split('\n')) {
      if (l.startsWith(':')) {
        const c = l.slice(1).split(' ')[0]!;
        lines = lines.filter((x) => !x.startsWith(`-A ${c} `) && x !== `:${c} - [0:0]`);
        lines.push(`:${c} - [0:0]`);
      } else if (l.startsWith('-A ')) lines.push(l);
      else if (l.startsWith('-D ')) {
        const i = lines.indexOf(`-A ${l.slice(3)}`);
        if (i >= 0) lines.splice(i, 1);
      } else if (l.startsWith('-X ')) lines = lines.filter((x) => x !== `:${l.slice(3)} - [0:0]`);
    }
    this.nat[family] = lines;
  }
}

class RecordingLogger implements Logger {
  readonly entries: { level: string; msg: string; fields: LogFields }[] = [];
  error(msg: string, fields: LogFields = {}): void {
    this.entries.push({ level: 'error', msg, fields });
  }
  warn(msg: string, fields: LogFields = {}): void {
    this.entries.push({ level: 'warn', msg, fields });
  }
  info(msg: string, fields: LogFields = {}): void {
    this.entries.push({ level: 'info', msg, fields });
  }
  debug(msg: string, fields: LogFields = {}): void {
    this.entries.push({ level: 'debug', msg, fields });
  }
  child(): Logger {
    return this;
  }
}

describe('ipmasq agent mode in the RuleKeeper', () => {
  const counts = () => {
    const c = { writes: 0, repairs: 0, errors: 0 };
    const metrics: IpMasqMetrics = { recordRuleWrite: () => c.writes++, recordRuleRepair: () => c.repairs++, recordRuleError: () => c.errors++ };
    return { c, metrics };
  };
  const keeper = (fake: FakeXtables, log: Logger, metrics: IpMasqMetrics, agent: AgentConfig = defaultAgentConfig()) => {
    const k = new RuleKeeper({ mode: 'iptables', masq: false, agent, forward: false, fullyRandomDisable: false, logger: log, metrics, runner: fake.runner });
    k.setInput([V4, V6]);
    return k;
  };

  it('installs the golden chains in both families, then writes nothing while they are right', async () => {
    const fake = new FakeXtables();
    const { c, metrics } = counts();
    const k = keeper(fake, new RecordingLogger(), metrics);
    const first = await k.reconcile();
    assert.equal(first.writes, 2);
    const ours = (f: 4 | 6) => fake.nat[f].filter((l) => /WEFT-IP-MASQ/.test(l));
    assert.deepEqual(ours(4), [':WEFT-IP-MASQ - [0:0]', ...fixtureLines('default-v4.iptables').slice(2), fixtureLines('default-v4.iptables')[1]]);
    assert.deepEqual(ours(6), [':WEFT-IP-MASQ - [0:0]', ...fixtureLines('default-v6.iptables').slice(2), fixtureLines('default-v6.iptables')[1]]);
    assert.deepEqual(await k.reconcile(), { problems: [], writes: 0 });
    assert.deepEqual(c, { writes: 2, repairs: 0, errors: 0 });
  });

  it('a new config is an update (logged as such, not counted as a repair); drift is a repair', async () => {
    const fake = new FakeXtables();
    const { c, metrics } = counts();
    const log = new RecordingLogger();
    const k = keeper(fake, log, metrics);
    await k.reconcile();
    k.setAgent(CUSTOM);
    const r = await k.reconcile();
    assert.deepEqual(r.problems.slice(0, 1), ['ipv4 nat: WEFT-IP-MASQ: missing rule: -A WEFT-IP-MASQ -d 100.128.0.0/16 -m comment --comment "weft-ip-masq: nonMasqueradeCIDRs traffic is not subject to MASQUERADE" -j RETURN']);
    assert.equal(c.repairs, 0);
    assert.deepEqual(log.entries.map((e) => `${e.level} ${e.msg}`), ['info installed masquerade/forward rules', 'info updated masquerade/forward rules']);
    assert.deepEqual(fake.save(4).split('\n').filter((l) => l.startsWith('-A WEFT-IP-MASQ')), fixtureLines('custom-v4.iptables').slice(2));
    fake.nat[4] = fake.nat[4].filter((l) => !l.includes('100.128.0.0/16'));
    await k.reconcile();
    assert.equal(c.repairs, 1);
    assert.equal(log.entries.at(-1)?.msg, 'repaired masquerade/forward rules');
  });

  it('runs one pass at a time: concurrent requests never write the same jump twice', async () => {
    const fake = new FakeXtables();
    const k = keeper(fake, new RecordingLogger(), counts().metrics);
    await Promise.all([k.reconcile(), k.reconcile(), k.reconcile()]);
    assert.equal(fake.nat[4].filter((l) => l.startsWith('-A POSTROUTING')).length, 1);
    assert.equal(fake.payloads.length, 2, 'one write per family, by the first pass only');
  });

  it('warns once when a real ip-masq-agent\'s chain is there, and leaves it alone', async () => {
    const fake = new FakeXtables();
    fake.extraChains = ['IP-MASQ-AGENT'];
    const log = new RecordingLogger();
    const k = keeper(fake, log, counts().metrics);
    await k.reconcile();
    await k.reconcile();
    const warnings = log.entries.filter((e) => e.level === 'warn');
    assert.deepEqual(warnings.map((e) => e.msg), ['a IP-MASQ-AGENT chain exists: a real ip-masq-agent seems to run on this node too; its rules masquerade what weft\'s leave alone, so stop it']);
    assert.ok(fake.payloads.every((p) => !p.includes('IP-MASQ-AGENT')));
  });

  it('refuses both masquerade modes at once', () => {
    const make = () =>
      new RuleKeeper({ mode: 'iptables', masq: true, agent: defaultAgentConfig(), forward: false, fullyRandomDisable: false, logger: new RecordingLogger() });
    assert.throws(make, ConflictingMasqModesError);
    const flannel = new RuleKeeper({ mode: 'iptables', masq: true, forward: false, fullyRandomDisable: false, logger: new RecordingLogger() });
    assert.throws(() => flannel.setAgent(defaultAgentConfig()), /--ip-masq\) and ip-masq-agent mode \(--ip-masq-config\) are exclusive/);
  });
});
