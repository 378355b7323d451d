// Network namespaces for tests: created with a unique prefix, used through `ip -n` / `ip netns
// exec`, and deleted even when a test fails (and at process exit as a last resort).
import { execFile, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);
const created = new Set<string>();
process.once('exit', () => {
  for (const ns of created) {
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // already gone
    }
  }
});

/** Runs a command and returns stdout; a failure says which command and what it printed. */
export async function sh(cmd: string, args: readonly string[], opts: { timeoutMs?: number } = {}): Promise<string> {
  try {
    const { stdout } = await run(cmd, [...args], { timeout: opts.timeoutMs ?? 30_000, maxBuffer: 64 << 20 });
    return stdout;
  } catch (e) {
    const err = e as Error & { stderr?: string };
    throw new Error(`${cmd} ${args.join(' ')} failed: ${err.stderr?.trim() || err.message}`);
  }
}

/** `ip` inside a namespace. */
export function ipn(ns: string, ...args: string[]): Promise<string> {
  return sh('ip', ['-n', ns, ...args]);
}

/** Any command inside a namespace. */
export function nsExec(ns: string, cmd: string, ...args: string[]): Promise<string> {
  return sh('ip', ['netns', 'exec', ns, cmd, ...args]);
}

export async function addNetns(name: string): Promise<string> {
  if (name.length > 40 || !/^[a-zA-Z0-9_.-]+$/.test(name)) throw new Error(`bad namespace name ${name}`);
  await sh('ip', ['netns', 'add', name]);
  created.add(name);
  await ipn(name, 'link', 'set', 'lo', 'up');
  return name;
}

export async function delNetns(name: string): Promise<void> {
  await sh('ip', ['netns', 'del', name]).catch(() => undefined);
  created.delete(name);
}

/** A short unique prefix for this process's namespaces. */
export function nsPrefix(tag: string): string {
  return `wt-${tag}-${process.pid.toString(36)}`;
}

/** Command output as trimmed, non-empty lines. */
export function lines(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '');
}
