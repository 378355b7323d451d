// withFileLock is a real flock(2): flock(1) (and so the Go plugins' go-filemutex) sees our lock and
// we see theirs; our own processes and concurrent callers in one process never overlap.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FileLockError, withFileLock } from '../../cni-plugins/skel/lock.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
const LOCK_TS = fileURLToPath(new URL('../../cni-plugins/skel/lock.ts', import.meta.url));

/** Exit status of `flock -n <path> true`: 0 when the lock is free, 1 when someone holds it. */
function tryFlock(path: string): Promise<number> {
  return new Promise((resolve) => {
    execFile('flock', ['-n', path, 'true'], (err) => resolve(err ? Number((err as { code?: number }).code ?? -1) : 0));
  });
}

function run(cmd: string, args: string[], cwd?: string): Promise<{ code: number; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('close', (code) => resolve({ code: code ?? -1, stderr }));
  });
}

async function pollUntil(what: string, cond: () => Promise<boolean>, deadlineMs = 10_000): Promise<void> {
  const end = Date.now() + deadlineMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** True when /proc/locks shows a process blocked on a flock of this inode. */
async function hasWaiter(path: string): Promise<boolean> {
  const ino = (await stat(path)).ino;
  const locks = await readFile('/proc/locks', 'utf8');
  return locks.split('\n').some((l) => l.includes('->') && l.includes('FLOCK') && l.includes(`:${ino} `));
}

describe('withFileLock (flock(2) through flock(1))', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'wt-hostlocal-lock-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('holds the lock for the duration of fn: flock -n fails inside, succeeds after', async () => {
    const path = join(dir, 'lock1');
    const inside = await withFileLock(path, async () => tryFlock(path));
    assert.equal(inside, 1);
    assert.equal(await tryFlock(path), 0);
    // Created like go-filemutex: empty, 0750 before umask.
    const st = await stat(path);
    assert.equal(st.size, 0);
    assert.equal(st.mode & 0o777, 0o750 & ~process.umask());
  });

  it('releases the lock when fn throws', async () => {
    const path = join(dir, 'lock2');
    await assert.rejects(
      withFileLock(path, async () => {
        throw new Error('boom');
      }),
      { message: 'boom' },
    );
    assert.equal(await tryFlock(path), 0);
  });

  it('waits while flock(1) holds the lock and enters only after it is released', async () => {
    const path = join(dir, 'lock3');
    await writeFile(path, '');
    // flock(1) holds the lock while `cat` runs; cat ends when we close its stdin.
    const holder = spawn('flock', [path, 'cat'], { stdio: ['pipe', 'ignore', 'ignore'] });
    try {
      await pollUntil('flock(1) to take the lock', async () => (await tryFlock(path)) === 1);
      let released = false;
      const entered = withFileLock(path, async () => released);
      // Deterministic: /proc/locks lists our flock child as blocked on the inode.
      await pollUntil('our flock to block', () => hasWaiter(path));
      released = true;
      holder.stdin.end();
      assert.equal(await entered, true);
    } finally {
      holder.kill();
    }
  });

  it('gives up after timeoutSeconds with a FileLockError naming the file', async () => {
    const path = join(dir, 'lock4');
    await withFileLock(path, async () => {
      await assert.rejects(withFileLock(path, async () => 'never', { timeoutSeconds: 0.2 }), (e: unknown) => {
        assert.ok(e instanceof FileLockError);
        assert.equal(e.path, path);
        assert.equal(e.message, `failed to lock ${path}: still held by another process after 0.2s`);
        return true;
      });
    });
  });

  it('fails with a FileLockError when the lock file cannot be created', async () => {
    const path = join(dir, 'missing-dir', 'lock');
    await assert.rejects(withFileLock(path, async () => 1), (e: unknown) => e instanceof FileLockError && e.path === path);
  });

  it('serialises concurrent callers in one process', async () => {
    const path = join(dir, 'lock5');
    let inside = 0;
    let maxInside = 0;
    const order: number[] = [];
    await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        withFileLock(path, async () => {
          inside++;
          maxInside = Math.max(maxInside, inside);
          await new Promise((r) => setImmediate(r));
          order.push(i);
          inside--;
        }),
      ),
    );
    assert.equal(maxInside, 1);
    assert.equal(order.length, 20);
    assert.deepEqual([...order].sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => i));
  });

  it('never lets two of our processes overlap', async () => {
    const path = join(dir, 'lock6');
    const log = join(dir, 'log6');
    const script = join(dir, 'locker.mts');
    await writeFile(
      script,
      [
        `import { appendFile } from 'node:fs/promises';`,
        `import { withFileLock } from ${JSON.stringify(LOCK_TS)};`,
        `const [lock, log, n] = process.argv.slice(2) as [string, string, string];`,
        `for (let i = 0; i < Number(n); i++) {`,
        `  await withFileLock(lock, async () => {`,
        `    await appendFile(log, 'S ' + process.pid + '\\n');`,
        `    await new Promise((r) => setImmediate(r));`,
        `    await appendFile(log, 'E ' + process.pid + '\\n');`,
        `  });`,
        `}`,
      ].join('\n'),
    );
    const results = await Promise.all([1, 2, 3].map(() => run(process.execPath, ['--import', 'tsx', script, path, log, '15'], REPO)));
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    const lines = (await readFile(log, 'utf8')).trim().split('\n');
    assert.equal(lines.length, 3 * 15 * 2);
    const pids = new Set<string>();
    for (let i = 0; i < lines.length; i += 2) {
      const [s, spid] = lines[i]!.split(' ');
      const [e, epid] = lines[i + 1]!.split(' ');
      assert.equal(s, 'S', `line ${i}: ${lines[i]}`);
      assert.equal(e, 'E', `line ${i + 1}: ${lines[i + 1]}`);
      assert.equal(epid, spid, `critical sections overlap at line ${i}`);
      pids.add(spid!);
    }
    assert.equal(pids.size, 3);
  });
});
