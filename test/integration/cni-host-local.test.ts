// host-local against the reference /usr/lib/cni/host-local (Debian 1.1.1): same configs give the
// same IP sequences, results, errors and store bytes; each reads and frees the other's store; the
// bundle stays correct under 50 concurrent ADDs/DELs and mixed with the reference; the flock
// excludes the reference. Pure file operations on temp dirs: no network state is touched.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { withFileLock } from '../../cni-plugins/skel/lock.js';
import { cniBinDir, REFERENCE_CNI_DIR, runCni, type CniRun } from '../helpers/cni.js';
import { waitFor } from '../helpers/wait.js';

const REFERENCE = join(REFERENCE_CNI_DIR, 'host-local');

type RunResult = CniRun;

/** One plugin run as a runtime would do it (real process, CNI env, config on stdin). */
function run(bin: string, command: string, config: object, containerId = '', ifname = 'eth0', cniArgs = ''): Promise<RunResult> {
  return runCni(
    {
      bin,
      command,
      containerId,
      netns: command === 'ADD' || command === 'CHECK' ? '/run/netns/wt-hostlocal-none' : undefined,
      ifname: command === 'GC' ? undefined : ifname,
      args: cniArgs,
      path: REFERENCE_CNI_DIR,
    },
    JSON.stringify(config),
  );
}

/** A result or error as comparable JSON: Debian 1.1.1 prints an empty `dns: {}`, current code omits it. */
function normalise(r: RunResult): unknown {
  const j = r.json as Record<string, unknown> | undefined;
  if (j && typeof j === 'object' && j['dns'] && Object.keys(j['dns']).length === 0) {
    const { dns: _dns, ...rest } = j;
    return { exit: r.exitCode, ...rest };
  }
  return { exit: r.exitCode, ...(j ?? {}) };
}

async function storeFiles(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  if (!existsSync(dir)) return out;
  for (const f of (await readdir(dir)).sort()) out[f] = await readFile(join(dir, f), 'latin1');
  return out;
}

function ipOf(r: RunResult, i = 0): string {
  const ips = (r.json as { ips?: { address: string }[] } | undefined)?.ips;
  const a = ips?.[i]?.address;
  assert.ok(a, `no address in ${r.stdout}`);
  return a.split('/')[0]!;
}

describe('host-local vs the reference plugin', function () {
  this.timeout(180_000);
  let root: string;
  let ours: string;
  let n = 0;

  const netConf = (dataDir: string, ipam: Record<string, unknown>, extra: Record<string, unknown> = {}, cniVersion = '1.0.0'): object => ({
    cniVersion,
    name: 'wtnet',
    type: 'bridge',
    ipam: { type: 'host-local', dataDir, ...ipam },
    ...extra,
  });
  const freshDir = (): string => join(root, `d${++n}`);

  before(async function () {
    if (!existsSync(REFERENCE)) this.skip();
    root = await mkdtemp(join(tmpdir(), 'wt-hostlocal-int-'));
    ours = join(await cniBinDir(), 'host-local');
  });
  after(async () => {
    if (root) await rm(root, { recursive: true, force: true });
  });

  type Step = [command: 'ADD' | 'DEL' | 'CHECK', containerId: string, cniArgs?: string];

  /** Runs the same steps through both plugins on fresh dirs; returns both transcripts and stores. */
  async function differential(ipam: Record<string, unknown>, steps: Step[], extra: Record<string, unknown> = {}, cniVersion = '1.0.0'): Promise<void> {
    const transcripts: unknown[][] = [];
    const stores: Record<string, string>[] = [];
    for (const bin of [REFERENCE, ours]) {
      const dir = freshDir();
      const t: unknown[] = [];
      for (const [command, cid, args] of steps) t.push([command, cid, normalise(await run(bin, command, netConf(dir, ipam, extra, cniVersion), cid, 'eth0', args ?? ''))]);
      transcripts.push(t);
      // Debian 1.1.1 writes 0644, we write 0600 (upstream HEAD): contents must be equal.
      stores.push(await storeFiles(join(dir, 'wtnet')));
    }
    assert.deepEqual(transcripts[1], transcripts[0]);
    assert.deepEqual(stores[1], stores[0]);
  }

  it('hands out the same sequence, with DEL, wrap-around and exhaustion (IPv4 /29)', async () => {
    await differential({ subnet: '10.1.2.0/29', routes: [{ dst: '0.0.0.0/0' }, { dst: '10.0.0.1/8', gw: '10.1.2.1' }] }, [
      ['ADD', 'a1'],
      ['ADD', 'a2'],
      ['ADD', 'a3'],
      ['DEL', 'a2'],
      ['ADD', 'a4'],
      ['ADD', 'a5'],
      ['ADD', 'a6'],
      ['ADD', 'a7'],
      ['ADD', 'a8'],
      ['CHECK', 'a1'],
      ['CHECK', 'a2'],
      ['ADD', 'a1'],
      ['DEL', 'a1'],
      ['DEL', 'a1'],
      ['ADD', 'a9'],
    ]);
  });

  it('hands out the same sequence for a multi-range set and a dual-stack config', async () => {
    await differential({ ranges: [[{ subnet: '10.1.2.0/30' }, { subnet: '10.1.3.0/29', rangeStart: '10.1.3.4' }], [{ subnet: 'fd00::/125', gateway: 'fd00::3' }]] }, [
      ['ADD', 'a1'],
      ['ADD', 'a2'],
      ['ADD', 'a3'],
      ['DEL', 'a1'],
      ['ADD', 'a4'],
      ['ADD', 'a5'],
      ['ADD', 'a6'],
      ['ADD', 'a7'],
    ]);
  });

  it('prints the same dual-stack result, routes and dns at cniVersion 0.3.1 and 0.4.0', async () => {
    const resolv = join(root, 'resolv.conf');
    await writeFile(resolv, 'nameserver 10.96.0.10\nsearch a.svc b.svc\noptions ndots:5\n');
    const ipam = { ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: 'fd00:1::/64' }]], routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0' }], resolvConf: resolv };
    for (const v of ['0.3.1', '0.4.0']) await differential(ipam, [['ADD', 'v1'], ['ADD', 'v2'], ['DEL', 'v1']], {}, v);
  });

  it('agrees on requested IPs (CNI_ARGS, args, runtimeConfig) and their errors', async () => {
    await differential({ subnet: '10.1.2.0/24' }, [
      ['ADD', 'r1', 'IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.1.2.50'],
      ['ADD', 'r2', 'IP=10.1.2.50'],
      ['ADD', 'r3', 'IP=10.1.2.1'],
      ['ADD', 'r4', 'IP=10.1.9.9'],
      ['ADD', 'r5', 'K8S_POD_NAME=x'],
      ['ADD', 'r6', 'IP=zz'],
      ['ADD', 'r7'],
    ]);
    await differential({ subnet: '10.1.2.0/24' }, [['ADD', 'r1']], { args: { cni: { ips: ['10.1.2.9'] } } });
    await differential({ subnet: '10.1.2.0/24' }, [['ADD', 'r1']], { runtimeConfig: { ips: ['10.1.2.9/24'], ipRanges: [[{ subnet: '10.5.0.0/24' }]] } });
  });

  it('reports an exhausted second range set with the reference code and message and leaves nothing behind', async () => {
    await differential({ ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: 'fd00::/126' }]] }, [
      ['ADD', 'e1'],
      ['ADD', 'e2'],
      ['ADD', 'e3'],
      ['CHECK', 'e3'],
    ]);
  });

  it('shares a store with the reference: each continues the other\'s round robin and frees the other\'s reservations', async () => {
    const dir = freshDir();
    const conf = netConf(dir, { subnet: '10.1.2.0/24' });
    const store = join(dir, 'wtnet');
    assert.equal(ipOf(await run(REFERENCE, 'ADD', conf, 'ref1')), '10.1.2.2');
    assert.equal(ipOf(await run(REFERENCE, 'ADD', conf, 'ref2')), '10.1.2.3');
    assert.equal(ipOf(await run(ours, 'ADD', conf, 'our1')), '10.1.2.4');
    assert.equal(ipOf(await run(REFERENCE, 'ADD', conf, 'ref3')), '10.1.2.5');
    // Both see each other's reservations.
    assert.equal((await run(ours, 'CHECK', conf, 'ref1')).exitCode, 0);
    assert.equal((await run(REFERENCE, 'CHECK', conf, 'our1')).exitCode, 0);
    // A requested IP the reference holds is not available to ours.
    assert.deepEqual((await run(ours, 'ADD', conf, 'our2', 'eth0', 'IP=10.1.2.3')).json, {
      code: 999,
      msg: 'failed to allocate for range 0: requested IP address 10.1.2.3 is not available in range set 10.1.2.1-10.1.2.254',
    });
    // Ours frees a reference reservation and the reference frees ours.
    assert.equal((await run(ours, 'DEL', conf, 'ref2')).exitCode, 0);
    assert.equal((await run(REFERENCE, 'DEL', conf, 'our1')).exitCode, 0);
    assert.deepEqual(await storeFiles(store), {
      '10.1.2.2': 'ref1\r\neth0',
      '10.1.2.5': 'ref3\r\neth0',
      'last_reserved_ip.0': '10.1.2.5',
      lock: '',
    });
    assert.equal(ipOf(await run(ours, 'ADD', conf, 'our3')), '10.1.2.6');
    assert.equal((await stat(join(store, '10.1.2.6'))).mode & 0o777, 0o600);
  });

  it('gives 50 concurrent ADDs of the bundle 50 distinct IPs, and 50 DELs empty the store', async () => {
    const dir = freshDir();
    const conf = netConf(dir, { subnet: '10.1.0.0/24' });
    const ids = Array.from({ length: 50 }, (_, i) => `ctr${i}`);
    const adds = await Promise.all(ids.map((id) => run(ours, 'ADD', conf, id)));
    for (const r of adds) assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    const ips = adds.map((r) => ipOf(r));
    assert.equal(new Set(ips).size, 50);
    // Round robin from the start with nothing skipped: exactly .2 … .51.
    assert.deepEqual([...ips].sort(), Array.from({ length: 50 }, (_, i) => `10.1.0.${i + 2}`).sort());
    const files = await storeFiles(join(dir, 'wtnet'));
    for (const [i, id] of ids.entries()) assert.equal(files[ips[i]!], `${id}\r\neth0`);
    const dels = await Promise.all(ids.map((id) => run(ours, 'DEL', conf, id)));
    for (const r of dels) assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    assert.deepEqual(Object.keys(await storeFiles(join(dir, 'wtnet'))), ['last_reserved_ip.0', 'lock']);
  });

  it('never hands out one IP twice when ours and the reference run concurrently', async () => {
    const dir = freshDir();
    const conf = netConf(dir, { subnet: '10.1.0.0/24' });
    const jobs = Array.from({ length: 40 }, (_, i) => ({ bin: i % 2 === 0 ? ours : REFERENCE, id: `mix${i}` }));
    const adds = await Promise.all(jobs.map((j) => run(j.bin, 'ADD', conf, j.id)));
    for (const r of adds) assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    const ips = adds.map((r) => ipOf(r));
    assert.equal(new Set(ips).size, 40);
    const files = await storeFiles(join(dir, 'wtnet'));
    for (const [i, j] of jobs.entries()) assert.equal(files[ips[i]!], `${j.id}\r\neth0`);
    const dels = await Promise.all(jobs.map((j, i) => run(i % 2 === 0 ? REFERENCE : ours, 'DEL', conf, j.id)));
    for (const r of dels) assert.equal(r.exitCode, 0);
    assert.deepEqual(Object.keys(await storeFiles(join(dir, 'wtnet'))), ['last_reserved_ip.0', 'lock']);
  });

  it('holds off the reference while our flock is held', async () => {
    const dir = freshDir();
    const conf = netConf(dir, { subnet: '10.1.2.0/24' });
    // Let the reference create the directory and lock file first.
    assert.equal((await run(REFERENCE, 'ADD', conf, 'first')).exitCode, 0);
    const lockPath = join(dir, 'wtnet', 'lock');
    const ino = (await stat(lockPath)).ino;
    let referenceDone = false;
    let pending: Promise<RunResult> | undefined;
    await withFileLock(lockPath, async () => {
      pending = run(REFERENCE, 'ADD', conf, 'blocked').then((r) => {
        referenceDone = true;
        return r;
      });
      // The reference blocks in flock(2) on the same inode (shown as a waiter in /proc/locks).
      await waitFor(
        async () => (await readFile('/proc/locks', 'utf8')).split('\n').some((l) => l.includes('->') && l.includes('FLOCK') && l.includes(`:${ino} `)),
        { what: 'the reference host-local to wait for our lock', timeoutMs: 20_000, intervalMs: 10 },
      );
      assert.equal(referenceDone, false);
    });
    const r = await pending!;
    assert.equal(r.exitCode, 0, r.stdout);
    assert.equal(ipOf(r), '10.1.2.3');
  });

  it('GC (spec 1.1) frees reference-written reservations of attachments that are gone', async () => {
    const dir = freshDir();
    const conf = netConf(dir, { subnet: '10.1.2.0/24' });
    for (const id of ['g1', 'g2', 'g3']) assert.equal((await run(REFERENCE, 'ADD', conf, id)).exitCode, 0);
    assert.equal((await run(REFERENCE, 'ADD', conf, 'g1', 'net1')).exitCode, 0);
    const gc = netConf(dir, { subnet: '10.1.2.0/24' }, { 'cni.dev/valid-attachments': [{ containerID: 'g2', ifname: 'eth0' }, { containerID: 'g1', ifname: 'net1' }] }, '1.1.0');
    const r = await run(ours, 'GC', gc);
    assert.equal(r.exitCode, 0, r.stdout);
    assert.equal(r.stdout, '');
    assert.deepEqual(await storeFiles(join(dir, 'wtnet')), {
      '10.1.2.3': 'g2\r\neth0',
      '10.1.2.5': 'g1\r\nnet1',
      'last_reserved_ip.0': '10.1.2.5',
      lock: '',
    });
    // The reference (spec ≤ 1.0.0) refuses GC, so the next ADD by it continues the round robin.
    assert.equal(ipOf(await run(REFERENCE, 'ADD', conf, 'g4')), '10.1.2.6');
  });
});
