// Makes a TCP service of the test process (root namespace, 127.0.0.1) reachable at an address
// inside a test namespace: a unix socket (a file, so visible from every namespace) bridges a
// small forwarder process in the namespace to the service. Nothing listens in the root
// namespace except on the unix socket.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createConnection, createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WaitAbort, waitFor } from './wait.js';

// Runs inside the namespace: listen on host:port, pipe every connection to the unix socket.
const FORWARDER = `
const net = require('node:net');
const [sock, host, port] = process.argv.slice(1);
net.createServer((c) => { const u = net.createConnection(sock); c.pipe(u).pipe(c); u.on('error', () => c.destroy()); c.on('error', () => u.destroy()); })
  .listen(Number(port), host, () => process.stdout.write('ready\\n'));
`;

export class NetnsForward {
  private constructor(
    private readonly dir: string,
    private readonly unix: Server,
    private readonly child: ChildProcess,
  ) {}

  static async start(ns: string, listen: { host: string; port: number }, target: { host: string; port: number }): Promise<NetnsForward> {
    const dir = mkdtempSync(join(tmpdir(), 'weft-fwd-'));
    const path = join(dir, 'sock');
    const unix = createServer((c) => {
      const t = createConnection(target.port, target.host);
      c.pipe(t).pipe(c);
      t.on('error', () => c.destroy());
      c.on('error', () => t.destroy());
    });
    await new Promise<void>((resolve) => unix.listen(path, resolve));
    const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', FORWARDER, path, listen.host, String(listen.port)], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const fwd = new NetnsForward(dir, unix, child);
    try {
      await waitFor(() => {
        if (child.exitCode !== null) throw new WaitAbort(`forwarder in ${ns} exited: ${out}`);
        return out.includes('ready');
      }, { what: `the forwarder in ${ns}` });
    } catch (e) {
      await fwd.stop();
      throw e;
    }
    return fwd;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise((resolve) => this.child.once('exit', resolve));
      this.child.kill('SIGKILL');
      await exited;
    }
    await new Promise<void>((resolve) => this.unix.close(() => resolve()));
    rmSync(this.dir, { recursive: true, force: true });
  }
}
