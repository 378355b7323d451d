// The CNI server's plugin process (src/cniserver/plugin-process.ts) with a fake plugin that
// misbehaves on request (test/helpers/fake-plugin-runner.ts): a real child process, real IPC.
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';

import type { InvokeOutput } from '../../cni-plugins/skel/run.js';
import { PluginRunError } from '../../src/cniserver/executor.js';
import { PluginProcess } from '../../src/cniserver/plugin-process.js';
import type { Logger } from '../../src/util/log.js';
import { waitFor } from '../helpers/wait.js';

const FAKE_RUNNER = fileURLToPath(new URL('../helpers/fake-plugin-runner.ts', import.meta.url));
const CONF = JSON.stringify({ cniVersion: '1.0.0', name: 'net', type: 'bridge' });

function env(containerId: string): Record<string, string> {
  return { CNI_COMMAND: 'ADD', CNI_CONTAINERID: containerId, CNI_IFNAME: 'eth0', CNI_NETNS: '/var/run/netns/x', CNI_PATH: '/opt/cni/bin' };
}

interface Logged {
  level: string;
  msg: string;
}

function recordingLogger(into: Logged[]): Logger {
  const at =
    (level: string) =>
    (msg: string): void => {
      into.push({ level, msg });
    };
  const l: Logger = { error: at('error'), warn: at('warn'), info: at('info'), debug: at('debug'), child: () => l };
  return l;
}

describe('CNI plugin process (a real child process, fake plugins)', function () {
  this.timeout(30_000);
  let proc: PluginProcess | null = null;
  let logged: Logged[] = [];

  function start(opts: { hangMs?: number; youngMs?: number } = {}): PluginProcess {
    logged = [];
    proc = new PluginProcess({ logger: recordingLogger(logged), modulePath: FAKE_RUNNER, pingMs: 100, ...opts });
    proc.start();
    return proc;
  }
  afterEach(async () => {
    await proc?.stop();
    proc = null;
  });

  const ok = (out: InvokeOutput) => {
    assert.equal(out.exitCode, 0, out.stdout);
    assert.equal((JSON.parse(out.stdout) as { ips: { address: string }[] }).ips[0]!.address, '10.0.0.2/24');
  };

  it('runs requests concurrently in one process other than ours, with their stderr', async () => {
    const p = start();
    const outs = await Promise.all(['a', 'b', 'slow', 'c'].map((id) => p.run('bridge', env(id), CONF)));
    outs.forEach(ok);
    const pids = new Set(outs.map((o) => /in (\d+)\n$/.exec(o.stderr)?.[1]));
    assert.equal(pids.size, 1);
    assert.notEqual([...pids][0], String(process.pid));
    assert.equal(p.starts, 1);
  });

  it('an exception thrown from one request\'s callback fails that request only; the process goes on', async () => {
    const p = start();
    const [boom, fine] = await Promise.allSettled([p.run('bridge', env('throw'), CONF), p.run('bridge', env('fine'), CONF)]);
    assert.equal(boom.status, 'rejected');
    assert.ok(boom.reason instanceof PluginRunError);
    assert.match(boom.reason.message, /exploded in a callback/);
    assert.equal(fine.status, 'fulfilled');
    ok(fine.value);
    ok(await p.run('bridge', env('after'), CONF));
    assert.equal(p.starts, 1);
    assert.ok(logged.some((l) => l.level === 'error' && /uncaught exception; the request is answered/.test(l.msg)));
  });

  it('a process that dies fails the requests it held; the next request gets a new process', async () => {
    const p = start({ youngMs: 0 });
    const first = p.pid;
    const [dies, slow] = await Promise.allSettled([p.run('bridge', env('exit'), CONF), p.run('bridge', env('slow'), CONF)]);
    for (const r of [dies, slow]) {
      assert.equal(r.status, 'rejected');
      assert.match(String(r.reason), /plugin process ended \(status 3\)/);
    }
    // Not young (youngMs 0): restarted at once.
    await waitFor(() => p.pid !== undefined && p.pid !== first, { timeoutMs: 10_000, what: 'a new plugin process' });
    ok(await p.run('bridge', env('after'), CONF));
    assert.equal(p.starts, 2);
  });

  it('a process stuck in a loop is killed after hangMs; its requests fail, the next one runs', async () => {
    const p = start({ hangMs: 1000 });
    const t0 = performance.now();
    await assert.rejects(p.run('bridge', env('hang'), CONF), /plugin process ended \(SIGKILL\)/);
    const took = performance.now() - t0;
    assert.ok(took >= 1000 && took < 10_000, `killed after ${Math.round(took)} ms`);
    assert.ok(logged.some((l) => l.level === 'error' && /unresponsive; killing it/.test(l.msg)));
    ok(await p.run('bridge', env('after'), CONF));
  });

  it('stop ends the process and fails what it still held', async () => {
    const p = start();
    ok(await p.run('bridge', env('a'), CONF));
    const held = p.run('bridge', env('slow'), CONF);
    await p.stop();
    await assert.rejects(held, PluginRunError);
    await assert.rejects(p.run('bridge', env('b'), CONF), /stopping/);
    assert.equal(p.pid, undefined);
  });
});
