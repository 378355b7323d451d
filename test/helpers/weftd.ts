// Runs bin/weftd (from source, so tests see the current code) as a child process.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/**
 * bin/weftd runs dist/ when it exists unless WEFT_FROM_SOURCE is set: tests run the source, except
 * under `make test` (WEFT_TEST_BUILT=1), which has just built dist/ from it.
 */
export function fromSource(): string {
  return process.env.WEFT_TEST_BUILT === '1' ? '' : '1';
}

const BIN = fileURLToPath(new URL('../../bin/weftd', import.meta.url));
const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of live) p.kill('SIGKILL');
});

export class WeftdProcess {
  output = '';
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  private constructor(readonly proc: ChildProcess) {
    live.add(proc);
    proc.stdout?.on('data', (d: Buffer) => (this.output += d.toString()));
    proc.stderr?.on('data', (d: Buffer) => (this.output += d.toString()));
    this.exited = new Promise((resolve) =>
      proc.once('exit', (code, signal) => {
        live.delete(proc);
        resolve({ code, signal });
      }),
    );
  }

  /**
   * With `netns`, runs under `ip netns exec`, which execs weftd itself (signals reach it directly).
   * `nodeArgs` (e.g. --cpu-prof, which NODE_OPTIONS refuses) run bin/weftd through node with them.
   */
  static start(
    args: readonly string[],
    env: NodeJS.ProcessEnv = {},
    netns?: string,
    nodeArgs: readonly string[] = [],
  ): WeftdProcess {
    // Outside a namespace of the test's own, weftd must not write rules into the machine's netfilter tables.
    const netfilterSafe = netns ? args : [...args, '--iptables-forward-rules=false', '--ip-masq=false'];
    // Many weftd run at once and the filesystem is shared across namespaces: no CNI server on the
    // machine's /run/weft/cni.sock unless the test gives its own --cni-socket (Host.startWeftd does).
    const ownSocket = args.some((a) => a === '--cni-socket' || a.startsWith('--cni-socket='));
    const safeArgs = ownSocket ? netfilterSafe : [...netfilterSafe, '--cni-socket='];
    const daemon = nodeArgs.length > 0 ? [process.execPath, ...nodeArgs, BIN, ...safeArgs] : [BIN, ...safeArgs];
    const [cmd, argv] = netns ? ['ip', ['netns', 'exec', netns, ...daemon]] : [daemon[0]!, daemon.slice(1)];
    return new WeftdProcess(
      spawn(cmd, argv, { env: { ...process.env, WEFT_FROM_SOURCE: fromSource(), ...env }, stdio: ['ignore', 'pipe', 'pipe'] }),
    );
  }

  get running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /**
   * SIGTERM, then wait for the exit. A daemon that has not exited after `graceMs` is killed and the
   * returned promise rejects with its output: a hanging shutdown is a bug to see, not a test timeout.
   */
  async stop(graceMs = 20_000): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (!this.running) return this.exited;
    this.proc.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), graceMs)));
    const first = await Promise.race([this.exited, late]);
    clearTimeout(timer);
    if (first !== 'late') return first;
    this.proc.kill('SIGKILL');
    await this.exited;
    throw new Error(`weftd did not exit within ${graceMs} ms of SIGTERM; its output:\n${this.output.slice(-3000)}`);
  }

  /** SIGSTOP: the daemon stops reacting (its kernel notifications queue up in their pipes). */
  pause(): void {
    if (this.running) this.proc.kill('SIGSTOP');
  }

  resume(): void {
    if (this.running) this.proc.kill('SIGCONT');
  }

  kill(): void {
    if (this.running) this.proc.kill('SIGKILL');
  }
}
