// Things a plugin's GC must leave alone in its data directory: files other programs keep there
// (`passwd`, `lock`, a file named like an IP, one named like the plugin's own state but holding
// something else), a symlink to a file outside the directory, a subdirectory and a fifo, the
// last three named like the plugin's own state. plantForeign puts them there; snapshot records
// every byte, type and link target so a test can assert that GC changed none of it.
import { execFileSync } from 'node:child_process';
import { lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface ForeignNames {
  /** A file named like the plugin's state (a container ID, `<cid>-<ifname>`, an IP) with foreign content. */
  readonly lookalike: string;
  readonly lookalikeText: string;
  /** Named like the plugin's state: a symlink to `outside/target`, a directory, a fifo. */
  readonly symlink: string;
  readonly directory: string;
  readonly fifo: string;
  /** What the symlink target and the file inside the directory hold (make it a stale state of the plugin's). */
  readonly staleText: string;
}

/** Look-alike names per plugin: its state's name pattern, foreign content or file type. */
export const LOOKALIKES = {
  /** flannel: `<dataDir>/<containerID>`. */
  flannel: { lookalike: '0123456789abcdef', lookalikeText: '{"kind":"not flannel","type":"bridge"}', symlink: 'ctr-link', directory: 'ctr-dir', fifo: 'ctr-fifo' },
  /** host-local: `<dataDir>/<network>/<ip>`. */
  hostLocal: { lookalike: '10.1.2.98', lookalikeText: '<?xml version="1.0"?>\n<printer/>\n', symlink: '10.1.2.77', directory: '10.1.2.66', fifo: 'fd00:2::55' },
  /** sriov: `<dataDir>/<containerID>-<ifname>`. */
  sriov: { lookalike: 'c0ffee-net1', lookalikeText: '{"OrigVfState":"not sriov","deviceID":"x"}', symlink: 'ctr-link-net1', directory: 'ctr-dir-net1', fifo: 'ctr-fifo-net1' },
} as const satisfies Record<string, Omit<ForeignNames, 'staleText'>>;

export interface Planted {
  /** The foreign names directly in the directory. */
  readonly names: readonly string[];
  /** The file the symlink points at (outside the directory). */
  readonly target: string;
}

export function plantForeign(dir: string, outside: string, n: ForeignNames): Planted {
  mkdirSync(dir, { recursive: true });
  mkdirSync(outside, { recursive: true });
  writeFileSync(join(dir, 'passwd'), 'root:x:0:0:root:/root:/bin/bash\nweft:x:1000:1000::/home/weft:/bin/sh\n', { mode: 0o644 });
  writeFileSync(join(dir, 'lock'), '');
  writeFileSync(join(dir, '10.1.2.99'), 'not a reservation: 10.1.2.99 is the printer\n');
  writeFileSync(join(dir, n.lookalike), n.lookalikeText);
  const target = join(outside, 'target');
  writeFileSync(target, n.staleText);
  symlinkSync(target, join(dir, n.symlink));
  mkdirSync(join(dir, n.directory));
  writeFileSync(join(dir, n.directory, 'inside'), n.staleText);
  execFileSync('mkfifo', ['-m', '0600', join(dir, n.fifo)]);
  const names = ['passwd', 'lock', '10.1.2.99', n.lookalike, n.symlink, n.directory, n.fifo];
  return { names, target };
}

/** Type and content of `path` (recursively for a directory), never following a symlink. */
export function describePath(path: string): string {
  const st = lstatSync(path);
  if (st.isSymbolicLink()) return `symlink -> ${readlinkSync(path)}`;
  if (st.isFIFO()) return `fifo ${(st.mode & 0o7777).toString(8)}`;
  if (st.isDirectory()) {
    const inner = readdirSync(path)
      .sort()
      .map((e) => `${e}: ${describePath(join(path, e))}`);
    return `dir [${inner.join('; ')}]`;
  }
  if (st.isFile()) return `file ${(st.mode & 0o7777).toString(8)} ino ${st.ino} ${JSON.stringify(readFileSync(path).toString('latin1'))}`;
  return `other ${st.mode.toString(8)}`;
}

/** Every name in `dir` (and `extra` paths) described; a missing name is "missing". */
export function snapshot(dir: string, names: readonly string[], extra: readonly string[] = []): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of [...names.map((n) => join(dir, n)), ...extra]) {
    try {
      out[p] = describePath(p);
    } catch {
      out[p] = 'missing';
    }
  }
  return out;
}
