// The CNI skeleton through real bundles: build (shebang, marker, mode), VERSION and error output
// of a spawned bundle, and delegation both ways — exec of Debian's reference host-local, and a
// weft bundle called in-process (same pid) or spawned (WEFT_CNI_NO_INPROCESS=1, other pid).
// host-local only writes its dataDir (a temp dir); the netns check uses two namespaces of its own.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { BUNDLE_SUFFIX, buildCniBundles, CLIENT_MARKER, MARKER_PREFIX, SHEBANG } from '../../cni-plugins/build.js';
import { REFERENCE_CNI_DIR, runCni, type CniRun } from '../helpers/cni.js';
import { addNetns, delNetns, nsPrefix } from '../helpers/netns.js';

const FIXTURES = resolve(import.meta.dirname, '../fixtures/cni');

function errJSON(code: number, msg: string, details?: string): string {
  return JSON.stringify(details ? { code, msg, details } : { code, msg }, null, 4);
}

/** "weft-test-echo ADD 123" lines of the record file, as [plugin, verb, pid]. */
function records(file: string): string[][] {
  return readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map((l) => l.split(' '));
}

describe('cni skel (bundles)', function () {
  this.timeout(60_000);
  let work: string;
  let bin: string;
  let echo: string;
  let delegator: string;

  before(async () => {
    work = mkdtempSync(join(tmpdir(), `wt-cni-skel-${process.pid}-`));
    bin = join(work, 'bin');
    const written = await buildCniBundles(bin, [
      { name: 'weft-test-echo', entry: join(FIXTURES, 'weft-test-echo/main.ts') },
      { name: 'weft-test-delegator', entry: join(FIXTURES, 'weft-test-delegator/main.ts') },
    ]);
    // The shipped layout (build.ts): `<name>` is the native client, `<name>.cjs` the bundle it
    // runs when no CNI server answers (cniEnv sets WEFT_CNI_SOCKET empty: straight to the bundle).
    [echo, delegator] = [join(bin, 'weft-test-echo'), join(bin, 'weft-test-delegator')];
    assert.deepEqual([...written].sort(), [echo, `${echo}.cjs`, delegator, `${delegator}.cjs`].sort());
  });

  after(() => rmSync(work, { recursive: true, force: true }));

  it('writes executable bundles with the shebang and marker lines', () => {
    for (const [client, name] of [
      [echo, 'weft-test-echo'],
      [delegator, 'weft-test-delegator'],
    ] as const) {
      assert.equal(statSync(client).mode & 0o777, 0o755);
      assert.ok(readFileSync(client).subarray(0, 4096).includes(`${CLIENT_MARKER}\0`), `${client} is not the native client`);
      const file = `${client}${BUNDLE_SUFFIX}`;
      assert.equal(statSync(file).mode & 0o777, 0o755);
      const lines = readFileSync(file, 'utf8').split('\n');
      assert.equal(lines[0], SHEBANG);
      assert.equal(lines[1], `${MARKER_PREFIX}${name}`);
      // Valid as CommonJS and as ESM: no module syntax (see build.ts).
      assert.doesNotMatch(lines.slice(2).join('\n'), /\bimport\s*[{*]|\bexport\s*[{*]|\bimport\.meta\b/);
    }
    assert.equal(readFileSync(join(bin, 'package.json'), 'utf8'), '{"type":"commonjs"}\n');
  });

  it('VERSION through the bundle: exit 0, the exact JSON, stdin ignored', async () => {
    const out = await runCni({ bin: echo, command: 'VERSION', env: { NODE_EXTRA_CA_CERTS: '/nonexistent/ca.pem' } }, '{garbage');
    assert.deepEqual(out, {
      exitCode: 0,
      stdout: '{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}\n',
      stderr: '',
      json: { cniVersion: '1.1.0', supportedVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] },
    });
  });

  it('bad stdin → code 6 on stdout and exit status 1; missing env → code 4', async () => {
    let jsonMsg = '';
    try {
      JSON.parse('{"cniVersion":');
    } catch (e) {
      jsonMsg = (e as Error).message;
    }
    const bad = await runCni({ bin: echo, command: 'ADD', netns: '/run/netns/wt-none' }, '{"cniVersion":');
    assert.equal(bad.exitCode, 1);
    assert.equal(bad.stdout, errJSON(6, `error unmarshall network config: ${jsonMsg}`));
    assert.equal(bad.stderr, '');

    const noNetns = await runCni({ bin: echo, command: 'ADD' }, '{"cniVersion":"1.0.0","name":"n"}');
    assert.deepEqual([noNetns.exitCode, noNetns.stdout], [1, errJSON(4, 'required env variables [CNI_NETNS] missing')]);

    const about = await runCni({ bin: echo, command: '' }, '');
    assert.equal(about.exitCode, 0);
    assert.equal(about.stdout, '');
    assert.match(about.stderr, /^CNI weft-test-echo plugin \(weft \S+\)\nCNI protocol versions supported: 0\.3\.0, 0\.3\.1, 0\.4\.0, 1\.0\.0, 1\.1\.0\n$/);
  });

  describe('CNI_NETNS that is the plugin\'s own netns', () => {
    const host = `${nsPrefix('skel')}-host`;
    const pod = `${nsPrefix('skel')}-pod`;

    before(async () => {
      await addNetns(host);
      await addNetns(pod);
    });

    after(async () => {
      await delNetns(host);
      await delNetns(pod);
    });

    it('is refused with code 8 for ADD and DEL unless CNI_NETNS_OVERRIDE is set', async () => {
      const stdin = '{"cniVersion":"1.0.0","name":"n","type":"weft-test-echo"}';
      const same = await runCni({ bin: echo, command: 'ADD', hostNs: host, netns: `/run/netns/${host}` }, stdin);
      assert.deepEqual([same.exitCode, same.stdout], [1, errJSON(8, "plugin's netns and netns from CNI_NETNS should not be the same")]);
      const del = await runCni({ bin: echo, command: 'DEL', hostNs: host, netns: `/run/netns/${host}` }, stdin);
      assert.equal(del.exitCode, 1);
      const other = await runCni({ bin: echo, command: 'ADD', hostNs: host, netns: `/run/netns/${pod}` }, stdin);
      assert.equal(other.exitCode, 0, other.stdout);
      const override = await runCni(
        { bin: echo, command: 'ADD', hostNs: host, netns: `/run/netns/${host}`, env: { CNI_NETNS_OVERRIDE: '1' } },
        stdin,
      );
      assert.equal(override.exitCode, 0, override.stdout);
    });
  });

  describe('delegation to the reference host-local (exec)', () => {
    let dataDir: string;
    const config = (version: string): string =>
      JSON.stringify({
        cniVersion: version,
        name: 'wtnet',
        type: 'weft-test-delegator',
        delegateType: 'host-local',
        ipam: { type: 'host-local', subnet: '10.250.7.0/24', dataDir },
      });
    const run = (command: string, stdin: string, containerId = 'ctr-ref'): Promise<CniRun> =>
      runCni({ bin: delegator, command, containerId, netns: '/run/netns/wt-none', path: `${bin}:${REFERENCE_CNI_DIR}` }, stdin);

    before(() => {
      dataDir = join(work, 'ipam');
    });

    it('ADD returns the delegate result in the config version; DEL releases the IP', async () => {
      const add = await run('ADD', config('0.4.0'));
      assert.equal(add.stderr, '');
      assert.equal(add.exitCode, 0, add.stdout);
      const search = (add.json as { dns: { search: string[] } }).dns.search;
      assert.equal(search.length, 1);
      assert.match(search[0]!, /^delegator-pid-\d+$/);
      assert.deepEqual(add.json, {
        cniVersion: '0.4.0',
        ips: [{ version: '4', address: '10.250.7.2/24', gateway: '10.250.7.1' }],
        dns: { search },
      });
      assert.equal(readFileSync(join(dataDir, 'wtnet', '10.250.7.2'), 'utf8'), 'ctr-ref\r\neth0');

      const add10 = await run('ADD', config('1.0.0'), 'ctr-ref2');
      assert.equal(add10.exitCode, 0, add10.stdout);
      assert.deepEqual((add10.json as { ips: unknown }).ips, [{ address: '10.250.7.3/24', gateway: '10.250.7.1' }]);

      for (const cid of ['ctr-ref', 'ctr-ref2']) {
        const del = await run('DEL', config('1.0.0'), cid);
        assert.deepEqual([del.exitCode, del.stdout], [0, '']);
      }
      assert.equal(existsSync(join(dataDir, 'wtnet', '10.250.7.2')), false);
      assert.equal(existsSync(join(dataDir, 'wtnet', '10.250.7.3')), false);
    });

    it("passes the delegate's error code, msg and details through unchanged", async () => {
      // Debian's host-local speaks up to 1.0.0: our 1.1.0 config is refused by it, not by us.
      const add = await run('ADD', config('1.1.0'));
      assert.equal(add.exitCode, 1);
      assert.equal(
        add.stdout,
        errJSON(1, 'incompatible CNI versions', 'config is "1.1.0", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0"]'),
      );
      const missing = await runCni({ bin: delegator, command: 'ADD', netns: '/run/netns/wt-none', path: bin }, config('1.0.0'));
      assert.equal(missing.exitCode, 1);
      assert.equal(missing.stdout, errJSON(999, `failed to find plugin "host-local" in path [${bin}]`));
    });
  });

  describe('delegation to a weft bundle', () => {
    let recordFile: string;
    let n = 0;
    const config = (version: string, extra: Record<string, unknown> = {}): string =>
      JSON.stringify({ cniVersion: version, name: 'wtnet', type: 'weft-test-delegator', delegateType: 'weft-test-echo', recordFile, ...extra });
    const run = (command: string, stdin: string, env: Record<string, string> = {}): Promise<CniRun> =>
      runCni({ bin: delegator, command, netns: '/run/netns/wt-none', path: `${join(work, 'nothing-here')}:${bin}`, env }, stdin);

    beforeEach(() => {
      recordFile = join(work, `record-${++n}`);
    });

    it('runs it in-process: the delegate sees the same pid, for every verb', async () => {
      const add = await run('ADD', config('1.1.0'));
      assert.equal(add.exitCode, 0, add.stdout);
      const dns = (add.json as { dns: { domain: string; search: string[] } }).dns;
      const pid = dns.domain.replace('pid-', '');
      assert.deepEqual(dns, { domain: `pid-${pid}`, search: [`delegator-pid-${pid}`] });
      assert.deepEqual(add.json, {
        cniVersion: '1.1.0',
        interfaces: [{ name: 'eth0', mac: '02:00:00:00:00:01', mtu: 1400, sandbox: '/run/netns/wt-none' }],
        ips: [{ interface: 0, address: '10.250.0.5/24', gateway: '10.250.0.1' }],
        routes: [{ dst: '0.0.0.0/0', gw: '10.250.0.1' }],
        dns,
      });
      for (const verb of ['DEL', 'CHECK', 'GC', 'STATUS']) {
        const out = await run(verb, config('1.1.0'));
        assert.deepEqual([verb, out.exitCode, out.stdout], [verb, 0, '']);
      }
      const rec = records(recordFile);
      assert.deepEqual(
        rec.map(([p, v]) => `${p} ${v}`),
        ['ADD', 'DEL', 'CHECK', 'GC', 'STATUS'].flatMap((v) => [`weft-test-delegator ${v}`, `weft-test-echo ${v}`]),
      );
      // Each pair ran in one process.
      for (let i = 0; i < rec.length; i += 2) assert.equal(rec[i]![2], rec[i + 1]![2]);
    });

    it('spawns it with WEFT_CNI_NO_INPROCESS=1: another pid, same result', async () => {
      const add = await run('ADD', config('0.3.1'), { WEFT_CNI_NO_INPROCESS: '1' });
      assert.equal(add.exitCode, 0, add.stdout);
      const dns = (add.json as { dns: { domain: string; search: string[] } }).dns;
      const [echoPid, delegatorPid] = [dns.domain.replace('pid-', ''), dns.search[0]!.replace('delegator-pid-', '')];
      assert.notEqual(echoPid, delegatorPid);
      assert.deepEqual(add.json, {
        cniVersion: '0.3.1',
        interfaces: [{ name: 'eth0', mac: '02:00:00:00:00:01', sandbox: '/run/netns/wt-none' }],
        ips: [{ version: '4', interface: 0, address: '10.250.0.5/24', gateway: '10.250.0.1' }],
        routes: [{ dst: '0.0.0.0/0', gw: '10.250.0.1' }],
        dns: { domain: `pid-${echoPid}`, search: [`delegator-pid-${delegatorPid}`] },
      });
      const del = await run('DEL', config('0.3.1'), { WEFT_CNI_NO_INPROCESS: '1' });
      assert.deepEqual([del.exitCode, del.stdout], [0, '']);
      const rec = records(recordFile);
      assert.deepEqual(
        rec.map(([p, v]) => `${p} ${v}`),
        ['weft-test-delegator ADD', 'weft-test-echo ADD', 'weft-test-delegator DEL', 'weft-test-echo DEL'],
      );
      assert.notEqual(rec[2]![2], rec[3]![2]);
    });

    it('reports the delegate error the same way on both paths', async () => {
      const failing = config('1.0.0', { echoFailWith: { code: 11, msg: 'try again', details: 'store locked' } });
      const plain = config('1.0.0', { echoFailPlain: 'veth exists' });
      for (const env of [{}, { WEFT_CNI_NO_INPROCESS: '1' }] as Record<string, string>[]) {
        const a = await run('ADD', failing, env);
        assert.deepEqual([a.exitCode, a.stdout], [1, errJSON(11, 'try again', 'store locked')]);
        const b = await run('DEL', plain, env);
        assert.deepEqual([b.exitCode, b.stdout], [1, errJSON(999, 'veth exists')]);
      }
    });
  });
});
