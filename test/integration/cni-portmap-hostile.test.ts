// portmap fed hostile configs, through the built bundle, inside a "host" namespace of its own:
// conditionsV4/V6 that try to end the rule (`;`, newline, `#`, `{ }`, quotes), change the verdict
// (`accept`, `-j ACCEPT`, `--ju`), run another command (`flush ruleset`, `-F`, `-X`, `-t`), or hide
// in control characters and Unicode spaces; and hostile chain- and comment-bearing names (network
// name, container ID, externalSetMarkChain). Each must fail with the CNI error code of its check,
// naming the field and the value, before anything runs: wrappers on PATH log every nft, iptables*
// and conntrack call (none is allowed), and `nft list ruleset`, iptables-save and ip6tables-save
// are the same before and after — a planted foreign nft table, foreign iptables chains and a
// mapping of another container made by a valid ADD all survive. A valid ADD at the end shows
// that the wrappers and the comparison do see a plugin that runs and changes something.
import assert from 'node:assert/strict';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cniBinDir, runCni, type CniRun } from '../helpers/cni.js';
import { addNetns, delNetns, nsExec, nsPrefix, sh } from '../helpers/netns.js';

const PREFIX = nsPrefix('pmh');
const NET = 'wt-pmh-net';
const TOOLS = ['nft', 'iptables', 'iptables-save', 'iptables-restore', 'ip6tables', 'ip6tables-save', 'ip6tables-restore', 'conntrack'];

const PREV = {
  cniVersion: '1.0.0',
  interfaces: [{ name: 'eth0', sandbox: '/run/netns/none' }],
  ips: [
    { address: '10.244.77.9/24', interface: 0 },
    { address: 'fd00:77::9/64', interface: 0 },
  ],
};
const MAPPINGS = [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }];

function conf(extra: Record<string, unknown>, name = NET): string {
  return JSON.stringify({ cniVersion: '1.0.0', name, type: 'portmap', snat: true, runtimeConfig: { portMappings: MAPPINGS }, prevResult: PREV, ...extra });
}

interface Case {
  readonly what: string;
  readonly verb: 'ADD' | 'DEL' | 'CHECK';
  readonly config: string;
  readonly code: number;
  /** What the message (or the details) must contain: the field and the value. */
  readonly says: readonly string[];
  readonly containerId?: string;
}

const conditionsCase =
  (backend: 'iptables' | 'nftables') =>
  (tokens: string[], bad: string, key: 'conditionsV4' | 'conditionsV6' = 'conditionsV4', verb: Case['verb'] = 'ADD'): Case => ({
    what: `${backend} ${key} ${JSON.stringify(tokens)} (${verb})`,
    verb,
    config: conf({ backend, [key]: tokens }),
    code: 7,
    says: [`${key}: token ${JSON.stringify(bad)}`],
  });
const nftCase = conditionsCase('nftables');
const xtCase = conditionsCase('iptables');

const CASES: Case[] = [
  // nftables conditions: a new command, a block, a comment, quotes, variables, sets, verdicts, statements
  nftCase(['ip', 'daddr', '1.2.3.4', ';', 'flush', 'ruleset'], ';'),
  nftCase(['ip', 'daddr', '1.2.3.4;', 'delete', 'table', 'inet', 'wtforeign'], '1.2.3.4;'),
  nftCase(['ip daddr 1.2.3.4; delete table inet wtforeign'], 'ip daddr 1.2.3.4; delete table inet wtforeign'),
  nftCase(['ip', 'daddr', '1.2.3.4\ndelete table inet wtforeign'], '1.2.3.4\ndelete table inet wtforeign'),
  nftCase(['ip', 'daddr', '1.2.3.4\u0000'], '1.2.3.4\u0000'),
  nftCase(['ip', 'daddr', '1.2.3.4', '#'], '#'),
  nftCase(['ip', 'daddr', '{', '1.2.3.4', '}'], '{'),
  nftCase(['}', ';', 'delete', 'table', 'inet', 'wtforeign', ';', '{'], '}'),
  nftCase(['meta', 'iifname', '"eth0"'], '"eth0"'),
  nftCase(['meta', 'iifname', "'eth0'"], "'eth0'"),
  nftCase(['ip', 'daddr', '1.2.3.4', 'accept'], 'accept'),
  nftCase(['ip', 'daddr', '1.2.3.4', 'jump', 'hostports'], 'jump'),
  nftCase(['flush', 'ruleset'], 'flush'),
  nftCase(['ip', 'daddr', '$x'], '$x'),
  nftCase(['ip', 'daddr', '@s'], '@s'),
  nftCase(['ip', 'daddr', '1.2.3.4\u001b[2J'], '1.2.3.4\u001b[2J'),
  nftCase(['ip', 'daddr', '1.2.3.4\u007f'], '1.2.3.4\u007f'),
  nftCase(['ip\u00a0daddr', '1.2.3.4'], 'ip\u00a0daddr'),
  nftCase(['ip', 'daddr', '1.2.3.4\u2028delete'], '1.2.3.4\u2028delete'),
  nftCase(['ip', 'daddr', '1.2.3.4\\'], '1.2.3.4\\'),
  nftCase(['meta', 'mark', 'set', '1'], 'set'),
  nftCase(['ip6', 'daddr', '::1', ';', 'flush', 'ruleset'], ';', 'conditionsV6'),
  nftCase(['ip', 'daddr', '1.2.3.4', ';', 'flush', 'ruleset'], ';', 'conditionsV4', 'DEL'),
  nftCase(['ip', 'daddr', '1.2.3.4', ';', 'flush', 'ruleset'], ';', 'conditionsV4', 'CHECK'),
  // iptables conditions: verdicts, jumps (also abbreviated or attached), commands, tables, quoting
  xtCase(['-d', '1.2.3.4', '-j', 'ACCEPT'], '-j'),
  xtCase(['--jump', 'ACCEPT'], '--jump'),
  xtCase(['--ju', 'ACCEPT'], '--ju'),
  xtCase(['-g', 'WTFOREIGN'], '-g'),
  xtCase(['-jACCEPT'], '-jACCEPT'),
  xtCase(['--jump=ACCEPT'], '--jump=ACCEPT'),
  xtCase(['-t', 'filter'], '-t'),
  xtCase(['-d', '1.2.3.4', '-A', 'PREROUTING'], '-A'),
  xtCase(['-F'], '-F'),
  xtCase(['-d', '1.2.3.4', '-X', 'WTFOREIGN'], '-X'),
  xtCase(['-d', '1.2.3.4\n-A INPUT -j DROP'], '1.2.3.4\n-A INPUT -j DROP'),
  xtCase(['-d', '1.2.3.4\rCOMMIT'], '1.2.3.4\rCOMMIT'),
  xtCase(['-m', 'comment', '--comment', 'x -j ACCEPT'], 'x -j ACCEPT'),
  xtCase(['-m', 'comment', '--comment', '"x"'], '"x"'),
  xtCase(['-d', '1.2.3.4#'], '1.2.3.4#'),
  xtCase(['-s', "1.2.3.4'"], "1.2.3.4'"),
  xtCase(['-d', '1.2.3.4\u0085'], '1.2.3.4\u0085'),
  xtCase(['-d', '2001:db8::1', '-j', 'DROP'], '-j', 'conditionsV6'),
  xtCase(['-d', '1.2.3.4', '-j', 'ACCEPT'], '-j', 'conditionsV4', 'DEL'),
  xtCase(['-d', '1.2.3.4', '-j', 'ACCEPT'], '-j', 'conditionsV4', 'CHECK'),
  // nftables conditions under the iptables backend: the reference's own refusal (code 999)
  {
    what: 'nftables conditions with the iptables backend',
    verb: 'ADD',
    config: conf({ backend: 'iptables', conditionsV4: ['ip', 'daddr', '1.2.3.4;', 'flush', 'ruleset'] }),
    code: 999,
    says: ['iptables backend was requested but configuration contains nftables-specific options [conditionsV4]'],
  },
  // chain- and comment-bearing names
  ...['WT#X', 'WT\\X', 'ACCEPT', 'x"y', '-j', 'WT X', 'x'.repeat(29)].map(
    (chain): Case => ({
      what: `externalSetMarkChain ${JSON.stringify(chain)}`,
      verb: 'ADD',
      config: conf({ backend: 'iptables', externalSetMarkChain: chain }),
      code: 7,
      says: [`externalSetMarkChain ${JSON.stringify(chain)} is not a valid iptables chain name`],
    }),
  ),
  ...['net;flush', 'a"b', 'a b', 'a\nb', 'x\\" -j ACCEPT'].map(
    (name): Case => ({ what: `network name ${JSON.stringify(name)}`, verb: 'ADD', config: conf({ backend: 'iptables' }, name), code: 7, says: ['invalid characters found in network name', name] }),
  ),
  ...['ctr;x', 'ctr"x', 'ctr x'].map(
    (id): Case => ({ what: `container ID ${JSON.stringify(id)}`, verb: 'ADD', config: conf({ backend: 'nftables' }), containerId: id, code: 4, says: ['invalid characters in containerID', id] }),
  ),
];

describe('CNI portmap plugin: hostile configs', function () {
  this.timeout(240_000);
  let tmp = '';
  let ours = '';
  let host = '';
  let pod = '';
  let log = '';
  let path = '';

  const run = (verb: string, containerId: string, config: string): Promise<CniRun> =>
    runCni({ bin: ours, command: verb, containerId, hostNs: host, netns: `/run/netns/${pod}`, env: { PATH: path } }, config);

  /** Everything netfilter holds in the host namespace, counters zeroed. */
  const snapshot = async (): Promise<string> => {
    const parts = [await nsExec(host, 'nft', 'list', 'ruleset'), await nsExec(host, 'iptables-save'), await nsExec(host, 'ip6tables-save')];
    return parts
      .join('\n')
      .split('\n')
      .filter((l) => !l.startsWith('#'))
      .map((l) => l.replace(/\[\d+:\d+\]/g, '[0:0]').replace(/packets \d+ bytes \d+/g, 'packets 0 bytes 0'))
      .join('\n');
  };
  const calls = async (): Promise<string[]> => (await readFile(log, 'utf8')).split('\n').filter((l) => l !== '');

  before(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'wt-pmh-'));
    ours = join(await cniBinDir(), 'portmap');
    host = await addNetns(`${PREFIX}-host`);
    pod = await addNetns(`${PREFIX}-pod`);
    // Wrappers that log every call of a netfilter tool before running the real one.
    log = join(tmp, 'calls.log');
    await writeFile(log, '');
    const wrappers = join(tmp, 'bin');
    await sh('mkdir', ['-p', wrappers]);
    for (const tool of TOOLS) {
      const real = (await sh('sh', ['-c', `command -v ${tool}`])).trim();
      await writeFile(join(wrappers, tool), `#!/bin/sh\necho "${tool} $*" >> '${log}'\nexec '${real}' "$@"\n`);
      await chmod(join(wrappers, tool), 0o755);
    }
    path = `${wrappers}:${process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin'}`;

    // Foreign state that must survive: an nft table, iptables and ip6tables chains with jumps.
    await nsExec(host, 'nft', 'add table inet wtforeign');
    await nsExec(host, 'nft', 'add chain inet wtforeign c { type filter hook input priority 0 ; }');
    await nsExec(host, 'nft', 'add rule inet wtforeign c tcp dport 22 counter accept comment "foreign"');
    for (const xt of ['iptables', 'ip6tables']) {
      for (const table of ['nat', 'filter']) {
        await nsExec(host, xt, '-w', '-t', table, '-N', 'WTFOREIGN');
        await nsExec(host, xt, '-w', '-t', table, '-A', 'WTFOREIGN', '-m', 'comment', '--comment', 'foreign', '-j', 'RETURN');
        await nsExec(host, xt, '-w', '-t', table, '-A', table === 'nat' ? 'PREROUTING' : 'INPUT', '-j', 'WTFOREIGN');
      }
    }
    // Another container's mappings, made by valid ADDs with conditions, in both backends.
    for (const extra of [
      { backend: 'iptables', conditionsV4: ['!', '-d', '192.0.2.0/24'] },
      { backend: 'nftables', conditionsV4: ['ip', 'daddr', '!=', '192.0.2.0/24'] },
    ]) {
      const r = await run('ADD', 'ctr-ok', conf(extra));
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    }
    assert.match(await nsExec(host, 'nft', 'list', 'table', 'ip', 'cni_hostport'), /ip daddr != 192\.0\.2\.0\/24 fib daddr type local jump hostports_all/);
    assert.match(await nsExec(host, 'iptables-save', '-t', 'nat'), /! -d 192\.0\.2\.0\/24 -p tcp .* -j CNI-DN-/);
    await writeFile(log, '');
  });

  after(async function () {
    this.timeout(60_000);
    for (const ns of [pod, host]) if (ns) await delNetns(ns);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  it(`refuses each of ${CASES.length} hostile configs with its error, runs nothing and changes nothing`, async () => {
    const before = await snapshot();
    const counts = new Map<number, number>();
    for (const c of CASES) {
      const r = await run(c.verb, c.containerId ?? 'ctr-ok', c.config);
      const json = r.json as { code?: number; msg?: string; details?: string } | undefined;
      assert.equal(r.exitCode, 1, `${c.what}: ${r.stdout}${r.stderr}`);
      assert.equal(json?.code, c.code, `${c.what}: ${r.stdout}`);
      const text = `${json?.msg ?? ''}\n${json?.details ?? ''}`;
      for (const s of c.says) assert.ok(text.includes(s) || text.includes(JSON.stringify(s)), `${c.what}: ${JSON.stringify(json)} does not say ${JSON.stringify(s)}`);
      assert.deepEqual(await calls(), [], `${c.what}: a netfilter tool ran`);
      assert.equal(await snapshot(), before, `${c.what}: netfilter state changed`);
      counts.set(c.code, (counts.get(c.code) ?? 0) + 1);
    }
    console.log(`      hostile portmap configs: ${CASES.length} (${[...counts].map(([code, n]) => `code ${code}: ${n}`).join(', ')}), no tool run, no change`);
  });

  it('sees a plugin that does run: a valid ADD calls the tools and changes the state', async () => {
    const before = await snapshot();
    const r = await run('ADD', 'ctr-new', conf({ backend: 'nftables', conditionsV4: ['ip', 'daddr', '!=', '198.51.100.0/24'] }));
    assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    assert.ok((await calls()).some((l) => l.startsWith('nft -f -')), (await calls()).join('\n'));
    const after = await snapshot();
    assert.notEqual(after, before);
    assert.match(after, /ip daddr != 198\.51\.100\.0\/24 fib daddr type local jump hostports_all/);
    assert.match(after, /comment "foreign"/);
  });
});
