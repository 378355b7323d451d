// `weft install-cni`: copies the bundled CNI plugins into the runtime's plugin directory. Each file
// is written beside its final name and renamed, so a runtime never executes a half-written plugin.
import { chmod, copyFile, mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { errorMessage } from '../util/errors.js';

export const CNI_PLUGIN_NAMES = ['bridge', 'flannel', 'host-local', 'portmap', 'sriov', 'weft-ovs'] as const;

export class InstallCniError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'InstallCniError';
  }
}

/** `dist/cni/bin` of the package this module belongs to (source or compiled). */
export function defaultBundleDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  return join(dir, 'dist', 'cni', 'bin');
}

/** Copies every plugin from `source` to `dest`; returns the installed paths. */
export async function installCni(source: string, dest: string): Promise<string[]> {
  const present = new Set(await readdir(source).catch(() => [] as string[]));
  const missing = CNI_PLUGIN_NAMES.filter((n) => !present.has(n));
  if (missing.length > 0) {
    throw new InstallCniError(`${source} lacks ${missing.join(', ')}: run \`npm run build\` first`);
  }
  await mkdir(dest, { recursive: true, mode: 0o755 });
  const out: string[] = [];
  for (const name of CNI_PLUGIN_NAMES) {
    const target = join(dest, name);
    const tmp = join(dest, `.${name}.weft-tmp`);
    try {
      await copyFile(join(source, name), tmp);
      await chmod(tmp, 0o755);
      await rename(tmp, target);
    } catch (e) {
      await rm(tmp, { force: true });
      throw new InstallCniError(`installing ${name} into ${dest}: ${errorMessage(e)}`);
    }
    if (!(await stat(target)).isFile()) throw new InstallCniError(`${target} is not a file`);
    out.push(target);
  }
  return out;
}
