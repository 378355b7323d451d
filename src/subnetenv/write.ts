// Writing subnet.env (weftd only).
import { randomBytes } from 'node:crypto';
import { chmod, mkdir, open, rename, rm } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';

import { renderSubnetEnv, type SubnetEnv } from './format.js';
import { SubnetFileError } from './read.js';

/**
 * Writes the file atomically (temp file in the same directory, fsync, rename), mode 0644
 * regardless of umask, so a reader (the CNI plugin) sees either the old or the new content.
 */
export async function writeSubnetEnv(path: string, env: SubnetEnv): Promise<void> {
  const data = renderSubnetEnv(env);
  const target = resolve(path);
  const dir = dirname(target);
  const tmp = join(dir, `.${basename(target)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  let tmpCreated = false;
  try {
    const firstCreated = await mkdir(dir, { recursive: true, mode: 0o755 });
    if (firstCreated !== undefined) await chmodCreatedDirs(firstCreated, dir);
    // 'wx': never follow or reuse something already at the temp name.
    const fh = await open(tmp, 'wx', 0o644);
    tmpCreated = true;
    try {
      await fh.writeFile(data, 'utf8');
      await fh.chmod(0o644);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, target);
    tmpCreated = false;
  } catch (e) {
    if (tmpCreated) await rm(tmp, { force: true }).catch(() => undefined);
    throw new SubnetFileError(path, 'write', e);
  }
  await syncDir(dir);
}

/** mkdir's mode is filtered by the umask; set 0755 on the directories this call created. */
async function chmodCreatedDirs(firstCreated: string, leaf: string): Promise<void> {
  let d = leaf;
  const created: string[] = [];
  for (;;) {
    created.push(d);
    if (d === firstCreated) break;
    const parent = dirname(d);
    if (parent === d) break;
    d = parent;
  }
  for (const c of created) await chmod(c, 0o755);
}

/** Makes the rename durable; failure here does not undo a completed write, so it is ignored. */
async function syncDir(dir: string): Promise<void> {
  try {
    const fh = await open(dir, 'r');
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch {
    // Some filesystems refuse fsync on directories; the file itself is already synced.
  }
}
