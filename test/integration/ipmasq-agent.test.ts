// ip-masq-agent mode (--ip-masq-config): the config file watcher on a real filesystem (a
// Kubernetes ConfigMap volume's symlink swap, in-place edits, removal), then weftd in host
// namespaces: the exact rules the kernel holds (iptables, ip6tables, nftables) against the golden
// files the unit test renders, real pod traffic kept or masqueraded by destination, live reloads
// without a restart, a bad file keeping the previous rules, and switching modes without leftovers.
import assert from 'node:assert/strict';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, renameSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { watchConfigFile, type FileState } from '../../src/ipmasq/config-watch.js';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { ipn, lines, nsExec, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';
import { WeftdProcess } from '../helpers/weftd.js';

const FIXTURES = new URL('../fixtures/ipmasq-agent/', import.meta.url);
const fixture = (name: string): string => readFileSync(new URL(name, FIXTURES), 'utf8');
const fixtureLines = (name: string): string[] => fixture(name).trimEnd().split('\n');

/**
 * A directory laid out as kubelet lays out a ConfigMap volume (AtomicWriter): `<key>` is a
 * symlink to `..data/<key>`, `..data` a symlink to a timestamped directory; an update writes a new
 * directory and renames a fresh `..data_tmp` symlink over `..data`.
 */
class ConfigMapDir {
  private n = 0;
  constructor(
    readonly dir: string,
    readonly key = 'ip-masq-agent',
  ) {}

  get path(): string {
    return join(this.dir, this.key);
  }

  swap(content: string): void {
    const ts = `..2026_01_01_00_00_00.${++this.n}`;
    mkdirSync(join(this.dir, ts));
    writeFileSync(join(this.dir, ts, this.key), content);
    const data = join(this.dir, '..data');
    const old = existsSync(data) ? readlinkSync(data) : null;
    symlinkSync(ts, join(this.dir, '..data_tmp'));
    renameSync(join(this.dir, '..data_tmp'), data);
    if (!lstatSync(this.path, { throwIfNoEntry: false })) symlinkSync(`..data/${this.key}`, this.path);
    if (old) rmSync(join(this.dir, old), { recursive: true, force: true });
  }

  /** The ConfigMap deleted (an optional volume): every file goes. */
  remove(): void {
    const data = join(this.dir, '..data');
    const old = existsSync(data) ? readlinkSync(data) : null;
    for (const p of [this.path, data]) if (lstatSync(p, { throwIfNoEntry: false })) unlinkSync(p);
    if (old) rmSync(join(this.dir, old), { recursive: true, force: true });
  }
}

describe('ipmasq agent: the config file watcher', function () {
  this.timeout(30_000);
  let root: string;
  let stop: AbortController;
  let seen: FileState[];
  let done: Promise<void>;
  const texts = () => seen.map((s) => (s.kind === 'content' ? s.text : s.kind));

  const start = (path: string, initial: string | null): void => {
    seen = [];
    stop = new AbortController();
    done = watchConfigFile(path, { signal: stop.signal, initial, onChange: (s) => void seen.push(s), pollIntervalMs: () => 60_000 });
  };

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'weft-ipmasq-watch-'));
  });
  afterEach(async () => {
    stop.abort();
    await done;
    rmSync(root, { recursive: true, force: true });
  });

  it('notices a ConfigMap symlink swap, and only real content changes', async () => {
    const cm = new ConfigMapDir(root);
    cm.swap('a: 1\n');
    start(cm.path, 'a: 1\n');
    // Same content in a new version: nothing to report.
    cm.swap('a: 1\n');
    cm.swap('a: 2\n');
    // The watch reacts in ~100-200 ms (measured); the deadline only bounds a hang on a loaded machine.
    await waitFor(() => seen.length > 0, { timeoutMs: 5000, what: 'the swap noticed' });
    assert.deepEqual(texts(), ['a: 2\n']);
  });

  it('notices an in-place edit through the symlink, a removal and a re-creation', async () => {
    const cm = new ConfigMapDir(root);
    cm.swap('a: 1\n');
    start(cm.path, 'a: 1\n');
    writeFileSync(cm.path, 'a: 3\n');
    await waitFor(() => seen.length === 1, { timeoutMs: 5000, what: 'the edit' });
    cm.remove();
    await waitFor(() => seen.length === 2, { timeoutMs: 5000, what: 'the removal' });
    cm.swap('a: 4\n');
    await waitFor(() => seen.length === 3, { timeoutMs: 5000, what: 'the new file' });
    assert.deepEqual(texts(), ['a: 3\n', 'missing', 'a: 4\n']);
  });

  it('picks up a directory that appears later, and reports an unreadable file once', async () => {
    const dir = join(root, 'later');
    // The initial content differs from what is there (nothing): the first report says the first read is done.
    start(join(dir, 'cfg'), 'a: 1\n');
    await waitFor(() => seen.length === 1, { timeoutMs: 5000, what: 'the first read' });
    mkdirSync(dir);
    writeFileSync(join(dir, 'cfg'), 'b: 1\n');
    await waitFor(() => seen.length === 2, { timeoutMs: 8000, what: 'the file, without a watch (1 s polling)' });
    rmSync(join(dir, 'cfg'));
    mkdirSync(join(dir, 'cfg'));
    await waitFor(() => seen.length === 3, { timeoutMs: 5000, what: 'the read error' });
    rmSync(join(dir, 'cfg'), { recursive: true });
    writeFileSync(join(dir, 'cfg'), 'c: 1\n');
    await waitFor(() => seen.length === 4, { timeoutMs: 5000, what: 'the readable file again' });
    assert.deepEqual(texts().slice(0, 2), ['missing', 'b: 1\n']);
    assert.equal(seen[2]?.kind, 'error');
    assert.match(seen[2]?.kind === 'error' ? seen[2].error.message : '', /EISDIR/);
    assert.equal(texts()[3], 'c: 1\n');
  });

  it('stops when aborted: no more reports', async () => {
    const file = join(root, 'cfg');
    writeFileSync(file, 'x\n');
    start(file, 'x\n');
    stop.abort();
    await done;
    // A second watcher of the same file shows when a report would have arrived.
    const sentinel: FileState[] = [];
    const stop2 = new AbortController();
    const done2 = watchConfigFile(file, { signal: stop2.signal, initial: 'x\n', onChange: (s) => void sentinel.push(s), pollIntervalMs: () => 60_000 });
    try {
      await waitFor(async () => {
        writeFileSync(file, `y${Date.now()}\n`);
        return sentinel.length > 0;
      }, { timeoutMs: 8000, intervalMs: 200, what: 'the sentinel watcher' });
    } finally {
      stop2.abort();
      await done2;
    }
    assert.deepEqual(seen, []);
  });
});

const CONFIG = { Network: '10.8.0.0/16', EnableIPv6: true, IPv6Network: 'fd08::/48', Backend: { Type: 'vxlan' } };
/** "Outside" addresses in the underlay namespace: one in the default list, one in the custom list. */
const IN_DEFAULT = '203.0.113.10';
const IN_CUSTOM = '100.128.0.10';

/** Our chain, its jump and every rule of it, as iptables-save prints them. */
async function agentRules(h: Host, family: 4 | 6): Promise<string[]> {
  const save = await nsExec(h.ns, family === 4 ? 'iptables-save' : 'ip6tables-save', '-t', 'nat');
  return lines(save).filter((l) => l.startsWith(':WEFT-IP-MASQ') || (l.startsWith('-A') && l.includes('WEFT-IP-MASQ')));
}

async function flannelRules(h: Host, family: 4 | 6): Promise<string[]> {
  const save = await nsExec(h.ns, family === 4 ? 'iptables-save' : 'ip6tables-save', '-t', 'nat');
  return lines(save).filter((l) => /FLANNEL-POSTRTG/.test(l));
}

async function rulesAre(h: Host, name: 'default' | 'custom'): Promise<boolean> {
  const same = (a: string[], b: string[]) => a.join('\n') === b.join('\n');
  return same(await agentRules(h, 4), fixtureLines(`${name}-v4.iptables`)) && same(await agentRules(h, 6), fixtureLines(`${name}-v6.iptables`));
}



/** Pings `dst` from the host's pod and says which source address the conntrack entry shows the far end. */
async function sourceSeen(h: Host, dst: string): Promise<'pod IP' | 'masqueraded'> {
  await nsExec(h.ns, 'conntrack', '-D', '-p', 'icmp', '-d', dst).catch(() => undefined);
  assert.ok(await h.ping(dst), `ping ${dst} from the pod of ${h.ns}`);
  const entries = lines(await nsExec(h.ns, 'conntrack', '-L', '-p', 'icmp', '-d', dst)).filter((l) => l.includes(`src=${h.podIP} dst=${dst} `));
  assert.equal(entries.length, 1, entries.join('\n'));
  if (entries[0]!.includes(`src=${dst} dst=${h.podIP} `)) return 'pod IP';
  if (entries[0]!.includes(`src=${dst} dst=${h.underlayIP} `)) return 'masqueraded';
  throw new Error(`unexpected conntrack entry ${entries[0]}`);
}

describe('ipmasq agent mode: weftd in host namespaces', function () {
  this.timeout(180_000);
  let c: Cluster;
  let h: Host;
  let cm: ConfigMapDir;
  let cfgRoot: string;
  const agentArgs = () => ['--ip-masq-config', cm.path];

  before(async () => {
    cfgRoot = mkdtempSync(join(tmpdir(), 'weft-ipmasq-agent-'));
    cm = new ConfigMapDir(cfgRoot);
    c = await Cluster.create({ hosts: 2, tag: 'ma', ipv6: true, config: CONFIG, weftdArgs: ['--iptables-resync', '1'] });
    // No config file yet: ip-masq-agent's defaults.
    for (const x of c.hosts) await x.startWeftd(agentArgs());
    for (const x of c.hosts) await x.attachPod();
    h = c.hosts[0]!;
    await ipn(c.underlay, 'addr', 'add', `${IN_DEFAULT}/32`, 'dev', 'lo');
    await ipn(c.underlay, 'addr', 'add', `${IN_CUSTOM}/32`, 'dev', 'lo');
    // The outside can answer an unmasqueraded pod: its subnet is routed to its host.
    for (const x of c.hosts) await ipn(c.underlay, 'route', 'add', `${x.podIP!.replace(/\.\d+$/, '.0')}/24`, 'via', x.underlayIP);
  });
  after(async () => {
    await c?.destroy();
    rmSync(cfgRoot, { recursive: true, force: true });
  });

  it('without a config file: the golden default rules in iptables and ip6tables, FLANNEL_IPMASQ=true', async () => {
    await waitFor(() => rulesAre(h, 'default'), { timeoutMs: 10_000, what: 'the default rules' }).catch(() => undefined);
    assert.deepEqual(await agentRules(h, 4), fixtureLines('default-v4.iptables'));
    assert.deepEqual(await agentRules(h, 6), fixtureLines('default-v6.iptables'));
    assert.deepEqual(await flannelRules(h, 4), []);
    assert.equal(h.subnetEnv().FLANNEL_IPMASQ, 'true');
    assert.equal((h.subnetEnv() as Record<string, string>).WEFT_IPMASQ, 'agent');
    assert.match(h.weftd!.output, /no ip-masq config file; using the ip-masq-agent defaults/);
    assert.equal(await h.metric('weft_ipmasq_config_last_reload_successful'), 1);
  });

  it('a pod keeps its IP towards a non-masquerade CIDR and the cluster, and is masqueraded elsewhere', async () => {
    assert.equal(await sourceSeen(h, IN_DEFAULT), 'pod IP');
    assert.equal(await sourceSeen(h, IN_CUSTOM), 'masqueraded');
    const b = c.hosts[1]!;
    await waitFor(() => h.ping(b.podIP!), { timeoutMs: 10_000, what: 'pod to pod' });
    const seen = lines(await nsExec(b.ns, 'conntrack', '-L', '-p', 'icmp', '-d', b.podIP!));
    assert.ok(seen.some((l) => l.includes(`src=${h.podIP} dst=${b.podIP}`) && l.includes(`src=${b.podIP} dst=${h.podIP}`)), seen.join('\n'));
  });

  it('follows a ConfigMap symlink swap without a restart', async () => {
    const pid = h.weftd!.proc.pid;
    cm.swap(fixture('custom.yaml'));
    // (How fast is measured, not asserted: ~200 ms here, see the README.)
    await waitFor(() => rulesAre(h, 'custom'), { timeoutMs: 15_000, intervalMs: 20, what: 'the custom rules' });
    assert.equal(h.weftd!.proc.pid, pid);
    assert.ok(h.weftd!.running);
    // The log lines come through a pipe, possibly after the rules are already in the kernel.
    await waitFor(() => /updated masquerade\/forward rules/.test(h.weftd!.output), { timeoutMs: 10_000, what: 'the update log line' });
    assert.match(h.weftd!.output, /reloaded the ip-masq config.*nonMasqueradeCIDRs added: 100\.128\.0\.0\/16, 10\.8\.0\.0\/16, fd99::\/64/);
    assert.equal(await h.metric('weft_ipmasq_config_reloads_total{result="applied"}'), 1);
    assert.equal(await h.metric('weft_ipmasq_repairs_total{mode="iptables"}'), 0, 'a reload is not a repair');
    // The traffic follows: what was kept is masqueraded now, and the other way round.
    assert.equal(await sourceSeen(h, IN_DEFAULT), 'masqueraded');
    assert.equal(await sourceSeen(h, IN_CUSTOM), 'pod IP');
  });

  it('follows an in-place edit of the file (JSON)', async () => {
    writeFileSync(cm.path, JSON.stringify({ nonMasqueradeCIDRs: ['100.128.0.0/16', '203.0.113.0/24'], masqLinkLocal: true }));
    const want = [...fixtureLines('custom-v4.iptables').slice(0, -1), '-A WEFT-IP-MASQ -d 203.0.113.0/24 -m comment --comment "weft-ip-masq: nonMasqueradeCIDRs traffic is not subject to MASQUERADE" -j RETURN', fixtureLines('custom-v4.iptables').at(-1)!];
    await waitFor(async () => (await agentRules(h, 4)).join('\n') === want.join('\n'), { timeoutMs: 5000, what: 'the edited rules' });
    assert.equal(await sourceSeen(h, IN_DEFAULT), 'pod IP');
  });

  it('keeps the previous rules when the file turns invalid, logs and counts why; a fix applies', async () => {
    cm.swap(fixture('custom.yaml'));
    await waitFor(() => rulesAre(h, 'custom'), { timeoutMs: 5000, what: 'the custom rules' });
    const errors = await h.metric('weft_ipmasq_config_reloads_total{result="error"}');
    cm.swap('nonMasqueradeCIDRs:\n  - 100.128.0.0/16\n  - 10.0.0.1/8\n');
    await waitFor(async () => (await h.metric('weft_ipmasq_config_reloads_total{result="error"}')) === errors + 1, { timeoutMs: 5000, what: 'the error counted' });
    assert.equal(await h.metric('weft_ipmasq_config_last_reload_successful'), 0);
    assert.match(h.weftd!.output, /ip-masq config not applied; the previous rules stay.*nonMasqueradeCIDRs\[1\] \\?"10\.0\.0\.1\/8\\?" is not aligned to a CIDR block/);
    await h.rulePasses(2);
    assert.ok(await rulesAre(h, 'custom'), 'the previous rules are still there');
    assert.equal(await sourceSeen(h, IN_CUSTOM), 'pod IP');
    cm.swap(fixture('custom.yaml').replace('100.128.0.0/16', '100.128.0.0/17'));
    await waitFor(async () => (await agentRules(h, 4)).some((l) => l.includes('-d 100.128.0.0/17 ')), { timeoutMs: 5000, what: 'the fixed file applied' });
    assert.equal(await h.metric('weft_ipmasq_config_last_reload_successful'), 1);
  });

  it('repairs drift of the agent chain within one resync', async () => {
    cm.swap(fixture('custom.yaml'));
    await waitFor(() => rulesAre(h, 'custom'), { timeoutMs: 5000, what: 'the custom rules' });
    const repairs = await h.metric('weft_ipmasq_repairs_total{mode="iptables"}');
    await nsExec(h.ns, 'iptables', '-t', 'nat', '-D', 'WEFT-IP-MASQ', '1');
    await waitFor(async () => (await h.metric('weft_ipmasq_repairs_total{mode="iptables"}')) === repairs + 1, { timeoutMs: 5000, what: 'the repair' });
    await waitFor(() => rulesAre(h, 'custom'), { timeoutMs: 5000, what: 'the repaired rules' });
  });

  it('goes back to the defaults when the ConfigMap is deleted', async () => {
    cm.remove();
    await waitFor(() => rulesAre(h, 'default'), { timeoutMs: 5000, what: 'the default rules' });
    assert.match(h.weftd!.output, /ip-masq config file removed; using the ip-masq-agent defaults/);
  });

  it('switching to flannel\'s --ip-masq removes the agent chain; flannel\'s goes when the agent mode is back', async () => {
    cm.swap(fixture('custom.yaml'));
    await waitFor(() => rulesAre(h, 'custom'), { timeoutMs: 5000, what: 'the custom rules' });
    await h.weftd!.stop();
    await h.startWeftd(['--ip-masq']);
    await waitFor(async () => (await flannelRules(h, 4)).length > 0 && (await flannelRules(h, 6)).length > 0, { timeoutMs: 10_000, what: 'flannel rules' });
    await waitFor(async () => [...(await agentRules(h, 4)), ...(await agentRules(h, 6))].length === 0, { timeoutMs: 5000, what: 'agent rules removed' });
    assert.equal(h.subnetEnv().FLANNEL_IPMASQ, 'true');
    // Back to the agent mode, in nftables this time: flannel's iptables chains go with the first pass.
    await h.weftd!.stop();
    await c.writeConfig({ ...CONFIG, EnableNFTables: true });
    await h.startWeftd(agentArgs());
    const list = (fam: string, name: string) => nsExec(h.ns, 'nft', 'list', 'table', fam, name).catch(() => '');
    await waitFor(async () => (await list('ip6', 'flannel-ipv6')) === fixture('custom-v6.nft-list'), { timeoutMs: 10_000, what: 'the nft rules' }).catch(() => undefined);
    assert.deepEqual([...(await flannelRules(h, 4)), ...(await flannelRules(h, 6))], []);
  });

  it('writes the same model in nftables (golden listing), reloads there too, and leaves no iptables rules behind', async () => {
    const list = (fam: string, name: string) => nsExec(h.ns, 'nft', 'list', 'table', fam, name).catch(() => '');
    assert.equal(await list('ip', 'flannel-ipv4'), fixture('custom-v4.nft-list'));
    assert.equal(await list('ip6', 'flannel-ipv6'), fixture('custom-v6.nft-list'));
    assert.deepEqual([...(await agentRules(h, 4)), ...(await agentRules(h, 6))], []);
    assert.equal(await sourceSeen(h, IN_DEFAULT), 'masqueraded');
    assert.equal(await sourceSeen(h, IN_CUSTOM), 'pod IP');
    cm.swap('nonMasqueradeCIDRs: [203.0.113.0/24]\n');
    await waitFor(async () => (await list('ip', 'flannel-ipv4')).includes('ip daddr 203.0.113.0/24 return'), { timeoutMs: 5000, what: 'the nft reload' });
    assert.ok(!(await list('ip', 'flannel-ipv4')).includes('100.128.0.0/16'));
    assert.equal(await sourceSeen(h, IN_DEFAULT), 'pod IP');

    // Back to iptables: the nft tables go.
    await h.weftd!.stop();
    await c.writeConfig(CONFIG);
    cm.swap(fixture('custom.yaml'));
    await h.startWeftd(agentArgs());
    await waitFor(() => rulesAre(h, 'custom'), { timeoutMs: 10_000, what: 'iptables rules back' });
    await waitFor(async () => !(await nsExec(h.ns, 'nft', 'list', 'tables')).includes('flannel'), { what: 'nft tables removed' });
  });

  it('refuses both modes (exit 2) and an invalid file at start (exit 1), before touching anything', async () => {
    const base = ['--etcd-endpoints', `http://${ETCD_IP}:2379`, '--iface', 'eth0', '--subnet-file', join(cfgRoot, 'unused.env')];
    const bad = join(cfgRoot, 'bad.yaml');
    writeFileSync(bad, 'nonMasqueradeCIDRs: [10.0.0.0/8, nope]\n');
    const both = WeftdProcess.start([...base, '--ip-masq', ...agentArgs()], {}, h.ns);
    const invalid = WeftdProcess.start([...base, '--ip-masq-config', bad], {}, h.ns);
    assert.deepEqual(await both.exited, { code: 2, signal: null });
    assert.match(both.output, /--ip-masq and --ip-masq-config are exclusive/);
    assert.deepEqual(await invalid.exited, { code: 1, signal: null });
    assert.match(invalid.output, /invalid ip-masq config: .*bad\.yaml: nonMasqueradeCIDRs\[1\] \\?"nope\\?" is not a CIDR/);
    assert.ok(!existsSync(join(cfgRoot, 'unused.env')));
  });

  it('never touched the machine\'s own namespace', async () => {
    assert.ok(!/WEFT-IP-MASQ|weft-ip-masq/.test(await sh('iptables-save', [])));
    assert.ok(!/WEFT-IP-MASQ|weft-ip-masq/.test(await sh('ip6tables-save', [])));
  });
});
