// The real OvsBackend in a child process inside a test namespace (test/helpers/ovs-driver-child.ts),
// driven call by call from the test: prepare, start, apply(batch), reconcile(peers), and the list
// of OVS processes and netlink calls each pass made. The backend programs routes and weft-gw0
// through netlink in its own namespace, which is why it cannot run in the test process.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { waitFor } from './wait.js';

const CHILD = fileURLToPath(new URL('./ovs-driver-child.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const REPLY_TIMEOUT_MS = 60_000;
const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of live) c.kill('SIGKILL');
});

/** A lease as the driver takes it (VNI 1 and backend type ovs unless given). */
export interface WireLease {
  readonly subnet: string;
  readonly publicIP: string;
  readonly backendType?: string;
  readonly vni?: number;
}

export type DriverRequest = { readonly id: number } & (
  | { readonly cmd: 'init'; readonly config: Record<string, unknown>; readonly iface: string }
  | { readonly cmd: 'start'; readonly lease: WireLease }
  | { readonly cmd: 'apply'; readonly events: ReadonlyArray<{ readonly type: 'added' | 'removed'; readonly lease: WireLease }> }
  | { readonly cmd: 'reconcile'; readonly peers: readonly WireLease[] }
  | { readonly cmd: 'calls' }
  | { readonly cmd: 'close' }
);

export type DriverResponse = { readonly id: number } & ({ readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly error: string });

/** What the backend ran since the last look: `ovs-vsctl <command>`, `ovs-ofctl [--bundle] <command>`, `netlink <method>`. */
export interface DriverCalls {
  readonly ovs: string[];
  readonly netlink: string[];
}

export class OvsDriverError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OvsDriverError';
  }
}

type Distribute<T> = T extends unknown ? Omit<T, 'id'> : never;

export class OvsBackendDriver {
  /** The child's stderr: the backend's log. */
  log = '';
  private stdout = '';
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private exited = false;

  private constructor(private readonly child: ChildProcess) {
    live.add(child);
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.log += d));
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      this.stdout += d;
      let nl: number;
      while ((nl = this.stdout.indexOf('\n')) >= 0) {
        const line = this.stdout.slice(0, nl);
        this.stdout = this.stdout.slice(nl + 1);
        if (line.trim()) this.reply(JSON.parse(line) as DriverResponse);
      }
    });
    child.once('exit', (code, signal) => {
      this.exited = true;
      live.delete(child);
      for (const w of this.waiting.values()) w.reject(new OvsDriverError(`the driver exited (${signal ?? code}) before answering:\n${this.log}`));
      this.waiting.clear();
    });
  }

  /** Starts the child in `ns`, talking to the Open vSwitch whose sockets are in `runDir`. */
  static start(ns: string, runDir: string): OvsBackendDriver {
    const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', CHILD, '--run-dir', runDir], {
      cwd: ROOT,
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, OVS_RUNDIR: runDir },
    });
    return new OvsBackendDriver(child);
  }

  private reply(r: DriverResponse): void {
    const w = this.waiting.get(r.id);
    if (!w) return;
    this.waiting.delete(r.id);
    if (r.ok) w.resolve(r.value);
    else w.reject(new OvsDriverError(r.error));
  }

  private request<T>(req: Distribute<DriverRequest>): Promise<T> {
    if (this.exited) return Promise.reject(new OvsDriverError(`the driver has exited:\n${this.log}`));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new OvsDriverError(`no answer to ${req.cmd} within ${REPLY_TIMEOUT_MS} ms:\n${this.log}`));
      }, REPLY_TIMEOUT_MS);
      this.waiting.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.child.stdin!.write(`${JSON.stringify({ ...req, id })}\n`);
    });
  }

  /** Constructs the backend over `iface` (the node's uplink, holding its IPv4 address) and runs prepare(). */
  init(config: Record<string, unknown>, iface: string): Promise<{ publicIP: string; mtu: number }> {
    return this.request({ cmd: 'init', config, iface });
  }

  start(lease: WireLease): Promise<null> {
    return this.request({ cmd: 'start', lease });
  }

  apply(events: ReadonlyArray<{ readonly type: 'added' | 'removed'; readonly lease: WireLease }>): Promise<{ failures: number }> {
    return this.request({ cmd: 'apply', events });
  }

  reconcile(peers: readonly WireLease[]): Promise<{ failures: number }> {
    return this.request({ cmd: 'reconcile', peers });
  }

  /** The calls made since the last look (and forgets them). */
  calls(): Promise<DriverCalls> {
    return this.request({ cmd: 'calls' });
  }

  /** close() on the backend, then the child ends (killed if it does not within a few seconds). */
  async stop(): Promise<void> {
    if (!this.exited) await this.request({ cmd: 'close' }).catch(() => undefined);
    this.child.stdin?.end();
    const gone = () => this.exited;
    if (await waitFor(gone, { timeoutMs: 5_000 }).then(() => true, () => false)) return;
    this.child.kill('SIGKILL');
    await waitFor(gone, { timeoutMs: 5_000, what: 'the ovs driver to exit after SIGKILL' });
  }
}
