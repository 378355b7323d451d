// The CNI plugin process's spawn helper (cni-plugins/native/weft-spawn.c, client
// src/util/spawn-helper.ts): the real binary, compiled into a temp dir, running real programs
// through exec.ts's seam. Ends with a micro-benchmark (printed, not asserted).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { compileSpawnHelper } from '../../cni-plugins/build.js';
import { CommandError, execProgram, runCommand, startProgram, useSpawnHelper } from '../../src/util/exec.js';
import { encodeStart, REQ_START, ReplyReader, SpawnHelper, type HelperReply } from '../../src/util/spawn-helper.js';

const BENCH = fileURLToPath(new URL('../helpers/spawn-helper-bench.ts', import.meta.url));
const NETNS = `weft-sh-${process.pid}-${randomBytes(3).toString('hex')}`;

async function rejected(p: Promise<unknown>): Promise<CommandError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof CommandError, `not a CommandError: ${String(e)}`);
    return e;
  }
  assert.fail('resolved');
}

describe('spawn helper (weft-spawn)', function () {
  this.timeout(120_000);
  let dir: string;
  let bin: string;
  let helper: SpawnHelper;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'weft-spawn-'));
    bin = join(dir, 'native', 'weft-spawn');
    await compileSpawnHelper(bin);
    helper = new SpawnHelper(bin);
    useSpawnHelper(helper);
  });

  after(async () => {
    useSpawnHelper(undefined);
    helper?.close();
    rmSync(dir, { recursive: true, force: true });
    await execProgram('ip', ['netns', 'del', NETNS]).catch(() => undefined);
  });

  it('runs programs: exit status, stdout, stderr', async () => {
    const before = helper.stats.started;
    assert.deepEqual(await execProgram('true', []), { code: 0, stdout: '', stderr: '' });
    assert.equal((await execProgram('false', [])).code, 1);
    assert.deepEqual(await execProgram('sh', ['-c', 'echo out; echo err >&2; exit 7']), { code: 7, stdout: 'out\n', stderr: 'err\n' });
    assert.equal(helper.stats.started - before, 3);
    assert.ok(helper.pid !== undefined);
  });

  it('feeds stdin now or later', async () => {
    assert.equal(await runCommand('cat', [], { input: 'now\n' }), 'now\n');
    const p = startProgram('cat', []);
    await new Promise((r) => setTimeout(r, 50));
    p.feed('later é\n');
    p.feed('ignored');
    assert.deepEqual(await p.result, { code: 0, stdout: 'later é\n', stderr: '' });
    const empty = startProgram('cat', []);
    empty.feed('');
    assert.equal((await empty.result).stdout, '');
  });

  it('a missing program is notFound, as with Node spawn', async () => {
    const e = await rejected(execProgram('weft-no-such-program', ['x']));
    assert.equal(e.notFound, true);
    assert.equal(e.exitCode, null);
    assert.equal(e.message, 'weft-no-such-program x: spawn weft-no-such-program ENOENT');
    assert.equal((await rejected(execProgram('/nonexistent/prog', []))).notFound, true);
  });

  it('a program killed by a signal, and a deadline', async () => {
    const e = await rejected(execProgram('sh', ['-c', 'echo before; kill -USR1 $$']));
    assert.equal(e.signal, 'SIGUSR1');
    assert.equal(e.exitCode, null);
    assert.match(e.message, /killed by SIGUSR1/);
    assert.equal(e.stdout, 'before\n');
    const t0 = Date.now();
    const d = await rejected(execProgram('sleep', ['10'], { timeoutMs: 200 }));
    assert.equal(d.signal, 'SIGTERM');
    assert.ok(Date.now() - t0 < 5000);
  });

  it('large output (1 MiB; over 16 MiB fails) and 200 concurrent calls', async () => {
    const big = await execProgram('sh', ['-c', 'head -c 1048576 /dev/zero | tr "\\0" a']);
    assert.equal(big.stdout.length, 1 << 20);
    assert.ok(/^a+$/.test(big.stdout));
    const over = await rejected(execProgram('head', ['-c', String((16 << 20) + 1), '/dev/zero']));
    assert.equal(over.exitCode, null);
    assert.match(over.message, /stdout over 16 MiB/);
    const rs = await Promise.all(Array.from({ length: 200 }, (_, i) => execProgram('sh', ['-c', 'echo $0; echo e$0 >&2', String(i)])));
    rs.forEach((r, i) => assert.deepEqual(r, { code: 0, stdout: `${i}\n`, stderr: `e${i}\n` }));
  });

  it('passes the environment, with LC_ALL=C', async () => {
    const r = await execProgram('sh', ['-c', 'echo "$LC_ALL $FOO $HOME"'], { env: { FOO: 'b a r', LC_ALL: 'de_DE.UTF-8', PATH: process.env.PATH } });
    assert.equal(r.stdout, 'C b a r \n');
    assert.equal((await execProgram('sh', ['-c', 'echo $LC_ALL'])).stdout, 'C\n');
  });

  it('passes a netns fd as fd 3; other fds go to Node spawn', async function () {
    try {
      await runCommand('ip', ['netns', 'add', NETNS]);
    } catch (e) {
      this.skip(); // not root / no netns support
      throw e;
    }
    const fd = openSync(`/run/netns/${NETNS}`, 'r');
    try {
      const moved = helper.stats.moved;
      const r = await execProgram('nsenter', ['--net=/proc/self/fd/3', 'ip', '-o', 'link'], { nsFds: [fd] });
      assert.equal(r.code, 0, r.stderr);
      const names = r.stdout.trim().split('\n').map((l) => l.split(':')[1]?.trim());
      assert.deepEqual(names, ['lo']);
      assert.equal(helper.stats.moved, moved, 'the helper ran it itself');
    } finally {
      closeSync(fd);
    }
    // Not a namespace file: the helper hands it back, Node's spawn passes the fd itself.
    const file = openSync(join(dir, 'plain'), 'w+');
    try {
      const moved = helper.stats.moved;
      const r = await execProgram('sh', ['-c', 'echo via3 >&3; echo ok'], { nsFds: [file] });
      assert.equal(r.stdout, 'ok\n');
      assert.equal(helper.stats.moved, moved + 1);
    } finally {
      closeSync(file);
    }
  });

  it('the helper killed mid-call: the call fails, the next one restarts it', async () => {
    const first = helper.pid;
    assert.ok(first !== undefined);
    const p = execProgram('sleep', ['2']);
    await new Promise((r) => setTimeout(r, 100));
    process.kill(first, 'SIGKILL');
    const e = await rejected(p);
    assert.equal(e.exitCode, null);
    assert.equal(e.notFound, false);
    assert.match(e.message, /spawn helper was killed by SIGKILL/);
    assert.equal((await execProgram('echo', ['again'])).stdout, 'again\n');
    assert.ok(helper.pid !== undefined && helper.pid !== first);
    assert.equal(helper.usable, true);
  });

  it('a missing helper binary: Node spawn for good', async () => {
    const missing = new SpawnHelper(join(dir, 'not-built'));
    useSpawnHelper(missing);
    try {
      assert.equal((await execProgram('echo', ['x'])).stdout, 'x\n');
      assert.equal(missing.usable, false);
      assert.equal((await runCommand('cat', [], { input: 'y' })), 'y');
      assert.equal((await rejected(execProgram('weft-no-such-program', []))).notFound, true);
    } finally {
      useSpawnHelper(helper);
    }
  });

  it('garbage on its stdin: error replies, no crash', async () => {
    const child = spawn(bin, [], { stdio: ['pipe', 'pipe', 'inherit'] });
    const reader = new ReplyReader();
    const replies: HelperReply[] = [];
    child.stdout.on('data', (c: Buffer) => replies.push(...reader.push(c)));
    const exited = new Promise<[number | null, string | null]>((r) => child.on('close', (code, sig) => r([code, sig])));
    const frame = (body: Buffer) => Buffer.concat([Buffer.from(new Uint32Array([body.length]).buffer), body]);
    const u32 = (n: number) => Buffer.from(new Uint32Array([n]).buffer);
    const good = encodeStart(99, { argv: ['true'], env: ['PATH=/usr/bin:/bin'], pipeStdin: false, timeoutMs: 1000, nsFds: [] });
    child.stdin.write(frame(Buffer.from([1, 2]))); // shorter than a header
    child.stdin.write(frame(Buffer.concat([Buffer.from([9]), u32(77)]))); // unknown type
    child.stdin.write(frame(Buffer.concat([Buffer.from([REQ_START]), u32(78), Buffer.from([1, 0])]))); // truncated
    child.stdin.write(frame(Buffer.concat([Buffer.from([REQ_START]), u32(79), Buffer.alloc(12)]))); // argc 0
    const cut = encodeStart(80, { argv: ['true'], env: [], pipeStdin: false, timeoutMs: 0, nsFds: [] }).subarray(4, 4 + 5 + 10);
    child.stdin.write(frame(Buffer.concat([cut, u32(0xfffffff0)]))); // a string past the end
    child.stdin.write(good);
    child.stdin.write(u32(0xfffffff0)); // oversized: its bytes are skipped
    child.stdin.write(randomBytes(256 * 1024));
    const t0 = Date.now();
    while (!replies.some((r) => r.id === 99) && Date.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 200));
    const byId = new Map(replies.map((r) => [r.id, r]));
    assert.deepEqual(
      [0, 77, 78, 79, 80].map((id) => byId.get(id)?.t),
      ['error', 'error', 'error', 'error', 'error'],
    );
    const ok = byId.get(99);
    assert.ok(ok?.t === 'exit' && ok.code === 0 && ok.signal === null, JSON.stringify(ok));
    assert.ok(replies.filter((r) => r.id === 0).length >= 2, 'the short frame and the oversized one');
    assert.equal(child.exitCode, null, 'still running');
    child.stdin.end(); // its parent gone: it exits
    assert.deepEqual(await exited, [0, null]);
  });

  it('micro-benchmark: `true` via Node spawn vs via the helper (printed)', async () => {
    // In a process of its own: this one (mocha) is bigger than the plugin process's ~60 MB.
    const out = await runCommand(process.execPath, ['--import=tsx', BENCH, bin], { timeoutMs: 120_000 });
    const r = JSON.parse(out) as { rssMb: number; node: Record<string, number>; helper: Record<string, number> };
    const line = (m: Record<string, number>) =>
      `${m.wallMsPerCall} ms/call wall, ${m.loopMsPerCall} ms/call on the event loop; 50 at once: ${m.fiftyWallMs} ms wall, ${m.fiftyLoopMs} ms on the loop`;
    console.log(`      RSS ${r.rssMb} MB; \`true\`, 200 calls one after another, then 50 at once:`);
    console.log(`      node spawn: ${line(r.node)}`);
    console.log(`      helper:     ${line(r.helper)}`);
    assert.ok(r.helper.wallMsPerCall! > 0);
  });
});
