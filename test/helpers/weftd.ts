// Runs bin/weftd (from source, so tests see the current code) as a child process.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

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
    const safeArgs = netns ? args : [...args, '--iptables-forward-rules=false', '--ip-masq=false'];
    const daemon = nodeArgs.length > 0 ? [process.execPath, ...nodeArgs, BIN, ...safeArgs] : [BIN, ...safeArgs];
    const [cmd, argv] = netns ? ['ip', ['netns', 'exec', netns, ...daemon]] : [daemon[0]!, daemon.slice(1)];
    return new WeftdProcess(
      spawn(cmd, argv, { env: { ...process.env, WEFT_FROM_SOURCE: '1', ...env }, stdio: ['ignore', 'pipe', 'pipe'] }),
    );
  }

  get running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** SIGTERM, then wait for the exit. */
  async stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.running) this.proc.kill('SIGTERM');
    return this.exited;
  }

  kill(): void {
    if (this.running) this.proc.kill('SIGKILL');
  }
}
