// The etcd password off the command line: bin/weftd and bin/weft against a real etcd with v3
// username/password auth, given the password through FLANNELD_ETCD_PASSWORD or
// --etcd-password-file. They get in; the password is not in their command line, their log (at
// debug level), /status, or any error; a bad file or both sources at once stop them with exit 2.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { EtcdServer, freePort } from '../helpers/etcd.js';
import { httpGet } from '../helpers/http.js';
import { waitFor } from '../helpers/wait.js';
import { fromSource, WeftdProcess } from '../helpers/weftd.js';

const PREFIX = '/pwtest/coreos.com/network';
const CONFIG = '{"Network":"10.8.0.0/16","Backend":{"Type":"alloc"}}';
const PASSWORD = 'Pw-9f3c-d4e1-never-printed';
const WEFT = fileURLToPath(new URL('../../bin/weft', import.meta.url));

interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

function weft(args: readonly string[], env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((resolve) => {
    execFile(WEFT, args, { env: { ...process.env, WEFT_FROM_SOURCE: fromSource(), ...env }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr });
    });
  });
}

describe('etcd password from the environment or a file (bin/weftd, bin/weft)', function () {
  this.timeout(120_000);
  let etcd: EtcdServer;
  let dir: string;
  const procs: WeftdProcess[] = [];

  /** weftd as the weft user, without --etcd-username/--etcd-password on its command line. */
  function weftd(publicIP: string, port: number, args: readonly string[], env: NodeJS.ProcessEnv): WeftdProcess {
    const p = WeftdProcess.start(
      ['--etcd-endpoints', etcd.endpoint, '--etcd-prefix', PREFIX, '--iface', 'lo', '--public-ip', publicIP, '--healthz-ip', '127.0.0.1',
        '--healthz-port', String(port), '--subnet-file', join(dir, publicIP, 'subnet.env'), '--log-level', 'debug', ...args],
      { FLANNELD_ETCD_USERNAME: 'weft', ...env },
    );
    procs.push(p);
    return p;
  }

  /** Ready, then nothing it shows anywhere holds the password. */
  async function assertReadyWithoutLeak(p: WeftdProcess, port: number): Promise<void> {
    await waitFor(async () => {
      if (!p.running) throw new Error(`weftd exited: ${p.output}`);
      return (await httpGet(port, '/readyz'))?.status === 200;
    }, { timeoutMs: 60_000, what: 'weftd ready' });
    const cmdline = readFileSync(`/proc/${p.proc.pid}/cmdline`, 'utf8');
    assert.match(cmdline, /weftd/);
    assert.ok(!cmdline.includes(PASSWORD), 'the password is in the process list');
    const status = await httpGet(port, '/status?peers=true');
    assert.equal(status?.status, 200);
    assert.ok(!status.body.includes(PASSWORD), 'the password is in /status');
    assert.ok(!(await httpGet(port, '/metrics'))!.body.includes(PASSWORD), 'the password is in /metrics');
    assert.match(p.output, /acquired lease/);
    assert.ok(!p.output.includes(PASSWORD), `the password is in the log:\n${p.output}`);
    assert.equal((await p.stop()).code, 0, p.output);
  }

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'weft-etcd-pw-'));
    etcd = await EtcdServer.start();
    await etcd.etcdctl(['user', 'add', 'root:rootpw', '--interactive=false']);
    await etcd.etcdctl(['user', 'grant-role', 'root', 'root']);
    await etcd.etcdctl(['user', 'add', `weft:${PASSWORD}`, '--interactive=false']);
    await etcd.etcdctl(['role', 'add', 'weft']);
    await etcd.etcdctl(['role', 'grant-permission', 'weft', '--prefix=true', 'readwrite', `${PREFIX}/`]);
    await etcd.etcdctl(['user', 'grant-role', 'weft', 'weft']);
    await etcd.etcdctl(['auth', 'enable']);
    await etcd.etcdctl(['--user', 'root:rootpw', 'put', `${PREFIX}/config`, CONFIG]);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop().catch(() => undefined)));
    await etcd?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('weftd takes FLANNELD_ETCD_PASSWORD and shows it nowhere', async () => {
    const port = await freePort();
    await assertReadyWithoutLeak(weftd('10.0.2.1', port, [], { FLANNELD_ETCD_PASSWORD: PASSWORD }), port);
  });

  it('weftd takes --etcd-password-file (trailing newline dropped) and shows it nowhere', async () => {
    const file = join(dir, 'etcd-password');
    writeFileSync(file, `${PASSWORD}\n`, { mode: 0o600 });
    const port = await freePort();
    await assertReadyWithoutLeak(weftd('10.0.2.2', port, ['--etcd-password-file', file], {}), port);
  });

  it('weftd exits 2 naming the file when it cannot be read, and when a password is given twice', async () => {
    const missing = join(dir, 'no-such-file');
    const a = weftd('10.0.2.3', await freePort(), ['--etcd-password-file', missing], {});
    assert.equal((await a.exited).code, 2, a.output);
    assert.equal(a.output, `weftd: --etcd-password-file ${missing}: cannot read it: no such file\n`);
    const file = join(dir, 'etcd-password-2');
    writeFileSync(file, `${PASSWORD}\n`, { mode: 0o600 });
    const b = weftd('10.0.2.4', await freePort(), ['--etcd-password-file', file], { FLANNELD_ETCD_PASSWORD: PASSWORD });
    assert.equal((await b.exited).code, 2, b.output);
    assert.match(b.output, /^weftd: --etcd-password and --etcd-password-file are exclusive/);
    assert.ok(!b.output.includes(PASSWORD));
  });

  it('weft leases takes FLANNELD_ETCD_PASSWORD_FILE and FLANNELD_ETCD_PASSWORD; a wrong one fails without showing it', async () => {
    const file = join(dir, 'etcd-password-3');
    writeFileSync(file, `${PASSWORD}\r\n`, { mode: 0o600 });
    const base = ['leases', '--etcd-endpoints', etcd.endpoint, '--etcd-prefix', PREFIX, '-o', 'json'];
    for (const env of [{ FLANNELD_ETCD_PASSWORD_FILE: file }, { FLANNELD_ETCD_PASSWORD: PASSWORD }]) {
      const r = await weft(base, { FLANNELD_ETCD_USERNAME: 'weft', ...env });
      assert.equal(r.code, 0, r.stderr);
      const leases = JSON.parse(r.stdout) as Array<{ publicIP: string }>;
      assert.deepEqual(leases.map((l) => l.publicIP).sort(), ['10.0.2.1', '10.0.2.2']);
    }
    const wrong = join(dir, 'wrong-password');
    writeFileSync(wrong, 'not-the-password\n', { mode: 0o600 });
    const bad = await weft([...base, '--etcd-password-file', wrong], { FLANNELD_ETCD_USERNAME: 'weft' });
    assert.equal(bad.code, 1, bad.stderr);
    assert.match(bad.stderr, /^weft leases: .*authentication failed, invalid user ID or password/);
    assert.ok(!bad.stderr.includes('not-the-password'));
  });
});
