// Runs `bin/weft` from source (inside a namespace when given) and resolves with its exit code,
// whatever it is, and both output streams.
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { fromSource } from './weftd.js';

const WEFT = fileURLToPath(new URL('../../bin/weft', import.meta.url));

export interface WeftRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function runWeft(ns: string | null, ...args: string[]): Promise<WeftRun> {
  const [cmd, argv] = ns ? ['ip', ['netns', 'exec', ns, WEFT, ...args]] : [WEFT, args];
  return new Promise((resolve) => {
    execFile(cmd, argv, { env: { ...process.env, WEFT_FROM_SOURCE: fromSource() }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr });
    });
  });
}
