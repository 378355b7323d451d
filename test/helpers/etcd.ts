// A real etcd (Debian's etcd-server) on free loopback ports with a temporary data dir, stopped by PID.
// Plain http by default; with `tls` it serves https (optionally requiring client certificates).
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { waitFor } from './wait.js';

const execFileP = promisify(execFile);

export interface EtcdTlsOptions {
  readonly certFile: string;
  readonly keyFile: string;
  readonly trustedCaFile: string;
  /** etcd --client-cert-auth: refuse clients without a certificate signed by trustedCaFile. */
  readonly clientCertAuth: boolean;
  /** The identity the harness itself (health check, etcdctl) presents; defaults to certFile/keyFile. */
  readonly clientCertFile?: string;
  readonly clientKeyFile?: string;
}

export interface EtcdStartOptions {
  readonly tls?: EtcdTlsOptions;
}

export class EtcdctlError extends Error {
  constructor(
    readonly args: readonly string[],
    readonly stderr: string,
    readonly code: number | null,
  ) {
    // Passwords given as --user name:password stay out of the message.
    const shown = args.map((a, i) => (args[i - 1] === '--user' ? a.replace(/:.*/, ':***') : a));
    super(`etcdctl ${shown.join(' ')} exited with ${code}: ${stderr.trim()}`);
    this.name = 'EtcdctlError';
  }
}

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
    readonly tls: EtcdTlsOptions | null,
  ) {}

  static async start(opts: EtcdStartOptions = {}): Promise<EtcdServer> {
    const dir = mkdtempSync(join(tmpdir(), 'weft-etcd-'));
    const srv = new EtcdServer(dir, await freePort(), await freePort(), opts.tls ?? null);
    await srv.startProcess();
    return srv;
  }

  get endpoint(): string {
    return `${this.tls ? 'https' : 'http'}://127.0.0.1:${this.clientPort}`;
  }

  /**
   * Runs etcdctl (v3 API) against this server, with the harness's TLS identity when serving https.
   * `args` come after the connection flags, e.g. ['--user', 'root:pw', 'get', 'k'].
   */
  async etcdctl(args: readonly string[]): Promise<string> {
    const conn = ['--endpoints', this.endpoint, '--dial-timeout', '5s', '--command-timeout', '10s'];
    if (this.tls) {
      conn.push('--cacert', this.tls.trustedCaFile);
      conn.push('--cert', this.tls.clientCertFile ?? this.tls.certFile);
      conn.push('--key', this.tls.clientKeyFile ?? this.tls.keyFile);
    }
    const all = [...conn, ...args];
    try {
      const { stdout } = await execFileP('etcdctl', all, { env: { ...process.env, ETCDCTL_API: '3' } });
      return stdout;
    } catch (e) {
      const err = e as { stderr?: string; code?: number | string; message: string };
      throw new EtcdctlError(all, err.stderr ?? err.message, typeof err.code === 'number' ? err.code : null);
    }
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
    const args = [
      '--name', 'weft-test',
      '--data-dir', join(this.dataDir, 'data'),
      '--listen-client-urls', this.endpoint,
      '--advertise-client-urls', this.endpoint,
      '--listen-peer-urls', peer,
      '--initial-advertise-peer-urls', peer,
      '--initial-cluster', `weft-test=${peer}`,
      '--log-level', 'warn',
    ];
    if (this.tls) {
      args.push('--cert-file', this.tls.certFile, '--key-file', this.tls.keyFile, '--trusted-ca-file', this.tls.trustedCaFile);
      if (this.tls.clientCertAuth) args.push('--client-cert-auth');
    }
    const proc = spawn('etcd', args, { stdio: ['ignore', log, log] });
    closeSync(log);
    running.add(proc);
    this.proc = proc;
    let failed: Error | null = null;
    proc.once('error', (e) => (failed = e));
    proc.once('exit', (code) => (failed ??= new Error(`etcd exited with ${code}; see ${this.dataDir}/etcd.log`)));
    await waitFor(
      async () => {
        if (failed) throw failed;
        return this.healthy();
      },
      { timeoutMs: 20_000, what: `etcd healthy at ${this.endpoint}` },
    );
  }

  /** GET /health over http, or over https with the harness's CA and client identity. */
  private async healthy(): Promise<boolean> {
    const url = `${this.endpoint}/health`;
    if (!this.tls) {
      const res = await fetch(url).catch(() => null);
      return res !== null && res.ok;
    }
    const tls = this.tls;
    return new Promise<boolean>((resolve) => {
      const req = httpsRequest(
        url,
        {
          ca: readFileSync(tls.trustedCaFile),
          cert: readFileSync(tls.clientCertFile ?? tls.certFile),
          key: readFileSync(tls.clientKeyFile ?? tls.keyFile),
          timeout: 2000,
        },
        (res) => {
          res.resume();
          res.once('end', () => resolve(res.statusCode === 200));
          res.once('error', () => resolve(false));
        },
      );
      req.once('timeout', () => req.destroy());
      req.once('error', () => resolve(false));
      req.end();
    });
  }
}
