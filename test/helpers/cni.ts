// Running CNI plugins from tests: weft's bundles (built once per test process into a temp dir)
// and Debian's reference plugins, as real processes with the CNI env, optionally inside a "host"
// netns the test created (`ip netns exec`), so links, sysctls and iptables land there.
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { buildCniBundlesReport, findPluginEntries } from '../../cni-plugins/build.js';

/** Debian's containernetworking-plugins 1.1.1: the oracle for differential tests. */
export const REFERENCE_CNI_DIR = '/usr/lib/cni';

let built: Promise<string> | undefined;

/**
 * A directory with every weft plugin bundle (`bridge`, `host-local`, …), built on first call into
 * `<tmpdir>/weft-cni-<pid>` and removed when the process exits. A plugin that does not build is
 * reported on stderr and left out (the others are still usable); a test that runs it then fails
 * with ENOENT after that message.
 */
export function cniBinDir(): Promise<string> {
  built ??= (async () => {
    const dir = join(tmpdir(), `weft-cni-${process.pid}`);
    await rm(dir, { recursive: true, force: true });
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    const { failures } = await buildCniBundlesReport(dir, findPluginEntries());
    for (const f of failures) process.stderr.write(`cniBinDir: ${f.message}\n`);
    return dir;
  })().catch((err: unknown) => {
    built = undefined; // let a later call try again
    throw err;
  });
  return built;
}

export interface RunCniOptions {
  /** Full path of the plugin executable. */
  readonly bin: string;
  readonly command: string;
  /** Defaults to "wt-ctr" for ADD/DEL/CHECK. '' leaves CNI_CONTAINERID unset (same for the others). */
  readonly containerId?: string;
  /** CNI_NETNS; unset unless given. */
  readonly netns?: string;
  /** Defaults to "eth0" for ADD/DEL/CHECK. */
  readonly ifname?: string;
  /** CNI_ARGS; unset unless given. */
  readonly args?: string;
  /** CNI_PATH; defaults to the directory of `bin`. */
  readonly path?: string;
  /** Run inside `ip netns exec <hostNs>`. */
  readonly hostNs?: string;
  /** Extra environment (wins over everything above). The base env is only PATH. */
  readonly env?: Readonly<Record<string, string>>;
  /** Kill the plugin (by its pid) after this long; default 60 s. */
  readonly timeoutMs?: number;
}

export interface CniRun {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  /** stdout parsed as JSON; undefined when empty or not JSON. */
  readonly json: unknown;
}

export class CniRunTimeout extends Error {
  constructor(
    readonly opts: RunCniOptions,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(`${opts.bin} ${opts.command} did not finish within ${opts.timeoutMs ?? 60_000} ms; stderr: ${stderr.trim()}`);
    this.name = 'CniRunTimeout';
  }
}

const VERBS_WITH_ATTACHMENT = new Set(['ADD', 'DEL', 'CHECK']);

/** The env a runtime would pass; PATH only otherwise (no NODE_OPTIONS from the test runner). */
export function cniEnv(opts: RunCniOptions): Record<string, string> {
  const env: Record<string, string> = { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', CNI_COMMAND: opts.command };
  const attach = VERBS_WITH_ATTACHMENT.has(opts.command);
  const set = (key: string, value: string | undefined): void => {
    if (value !== undefined && value !== '') env[key] = value;
  };
  set('CNI_CONTAINERID', opts.containerId ?? (attach ? 'wt-ctr' : undefined));
  set('CNI_NETNS', opts.netns);
  set('CNI_IFNAME', opts.ifname ?? (attach ? 'eth0' : undefined));
  set('CNI_ARGS', opts.args);
  set('CNI_PATH', opts.path ?? dirname(opts.bin));
  return { ...env, ...opts.env };
}

/** Runs one plugin invocation with `stdin` as its config. Resolves whatever the exit status. */
export function runCni(opts: RunCniOptions, stdin: string): Promise<CniRun> {
  const [cmd, args] = opts.hostNs ? ['ip', ['netns', 'exec', opts.hostNs, opts.bin]] : [opts.bin, []];
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: cniEnv(opts), stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
      reject(new CniRunTimeout(opts, stdout, stderr));
    }, opts.timeoutMs ?? 60_000);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      let json: unknown;
      if (stdout.trim() !== '') {
        try {
          json = JSON.parse(stdout);
        } catch {
          json = undefined;
        }
      }
      resolve({ exitCode: code ?? (signal ? 128 : -1), stdout, stderr, json });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(stdin);
  });
}
