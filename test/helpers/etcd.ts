// A real etcd (Debian's etcd-server) on free loopback ports with a temporary data dir, stopped by PID.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, closeSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { waitFor } from './wait.js';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of running) p.kill('SIGKILL');
});

export class EtcdServer {
  private proc: ChildProcess | null = null;

  private constructor(
    readonly dataDir: string,
    readonly clientPort: number,
    readonly peerPort: number,
  ) {}

  static async start(): Promise<EtcdServer> {
    const dir = mkdtempSync(join(tmpdir(), 'weft-etcd-'));
    const srv = new EtcdServer(dir, await freePort(), await freePort());
    await srv.startProcess();
    return srv;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${this.clientPort}`;
  }

  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** Stops etcd (SIGTERM, then SIGKILL after 10 s) and waits for it to exit. */
  async stop(): Promise<void> {
    const p = this.proc;
    if (!p) return;
    this.proc = null;
    if (p.exitCode === null && p.signalCode === null) {
      const exited = new Promise<void>((resolve) => p.once('exit', () => resolve()));
      p.kill('SIGTERM');
      const timer = setTimeout(() => p.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    running.delete(p);
  }

  /** Starts etcd again on the same ports and data dir. */
  async restart(): Promise<void> {
    await this.stop();
    await this.startProcess();
  }

  /** Stops etcd and removes its data dir. */
  async destroy(): Promise<void> {
    await this.stop();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  private async startProcess(): Promise<void> {
    const peer = `http://127.0.0.1:${this.peerPort}`;
    const log = openSync(join(this.dataDir, 'etcd.log'), 'a');
    const proc = spawn(
      'etcd',
      [
        '--name', 'weft-test',
        '--data-dir', join(this.dataDir, 'data'),
        '--listen-client-urls', this.endpoint,
        '--advertise-client-urls', this.endpoint,
        '--listen-peer-urls', peer,
        '--initial-advertise-peer-urls', peer,
        '--initial-cluster', `weft-test=${peer}`,
        '--log-level', 'warn',
      ],
      { stdio: ['ignore', log, log] },
    );
    closeSync(log);
    running.add(proc);
    this.proc = proc;
    let failed: Error | null = null;
    proc.once('error', (e) => (failed = e));
    proc.once('exit', (code) => (failed ??= new Error(`etcd exited with ${code}; see ${this.dataDir}/etcd.log`)));
    await waitFor(
      async () => {
        if (failed) throw failed;
        const res = await fetch(`${this.endpoint}/health`).catch(() => null);
        return res !== null && res.ok;
      },
      { timeoutMs: 20_000, what: `etcd healthy at ${this.endpoint}` },
    );
  }
}
