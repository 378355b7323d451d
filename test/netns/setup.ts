// Mocha root hook plugin for test/netns: these tests program the kernel of the process's own
// network namespace, so they refuse to run unless that namespace is a private one
// (`unshare --net`). Run as:
//   unshare --net -- npx mocha --require test/netns/setup.ts 'test/netns/**/*.test.ts'
import { execFile } from 'node:child_process';
import { readFileSync, readlinkSync } from 'node:fs';
import { promisify } from 'node:util';

const run = promisify(execFile);

export class RootNamespaceError extends Error {
  constructor(readonly detail: string) {
    super(`test/netns must run inside \`unshare --net\`: ${detail}`);
    this.name = 'RootNamespaceError';
  }
}

function netnsOf(pid: string): string | null {
  try {
    return readlinkSync(`/proc/${pid}/ns/net`);
  } catch {
    return null;
  }
}

function commOf(pid: string): string | null {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return null;
  }
}

/**
 * Throws RootNamespaceError unless this process's network namespace differs from the machine's.
 * The machine's is read from PID 1; where that link is unreadable (no ptrace access to PID 1,
 * which happens even for root in some sandboxes) from kthreadd (PID 2), a kernel thread that
 * always lives in the initial network namespace.
 */
export function assertPrivateNetns(): void {
  const self = readlinkSync('/proc/self/ns/net');
  let ref = netnsOf('1');
  let refName = 'PID 1';
  if (ref === null && commOf('2') === 'kthreadd') {
    ref = netnsOf('2');
    refName = 'kthreadd (PID 2)';
  }
  if (ref === null) {
    throw new RootNamespaceError('cannot read /proc/1/ns/net or /proc/2/ns/net to tell whether this is the root network namespace');
  }
  if (ref === self) {
    throw new RootNamespaceError(`this process shares its network namespace ${self} with ${refName}`);
  }
}

export const mochaHooks = {
  async beforeAll(): Promise<void> {
    assertPrivateNetns();
    await run('ip', ['link', 'set', 'lo', 'up']);
  },
};
