// `weft install-cni`: copies the CNI plugins into the runtime's plugin directory: per plugin the
// native client `<name>` and the Node.js bundle `<name>.cjs` it falls back to (see
// cni-plugins/build.ts), the bundle first, so a client is never there without its fallback. A
// source built without the client (`<name>` is itself a bundle) is installed as it is. Each file
// is written beside its final name and renamed, so a runtime never executes a half-written plugin.
import { chmod, copyFile, mkdir, open, readdir, rename, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { BUNDLE_SUFFIX } from '../../cni-plugins/skel/delegate.js';
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


/** Whether `file` is a script (a Node.js bundle) rather than the native client. */
export async function isScript(file: string): Promise<boolean> {
  const fh = await open(file, 'r');
  try {
    const buf = Buffer.alloc(2);
    const { bytesRead } = await fh.read(buf, 0, 2, 0);
    return bytesRead === 2 && buf.toString('latin1') === '#!';
  } finally {
    await fh.close();
  }
}

/** The files to install for each plugin, in order (the bundle before the client). */
async function pluginFiles(source: string): Promise<string[]> {
  const present = new Set(await readdir(source).catch(() => [] as string[]));
  const missing = CNI_PLUGIN_NAMES.filter((n) => !present.has(n));
  if (missing.length > 0) {
    throw new InstallCniError(`${source} lacks ${missing.join(', ')}: run \`npm run build\` first`);
  }
  const files: string[] = [];
  const noBundle: string[] = [];
  for (const name of CNI_PLUGIN_NAMES) {
    const bundle = name + BUNDLE_SUFFIX;
    if (present.has(bundle)) files.push(bundle, name);
    else if (await isScript(join(source, name)).catch(() => false)) files.push(name);
    else noBundle.push(bundle);
  }
  if (noBundle.length > 0) {
    throw new InstallCniError(`${source} lacks ${noBundle.join(', ')} (the clients' Node.js bundles): run \`npm run build\` first`);
  }
  return files;
}

/** Copies every plugin from `source` to `dest`; returns the installed paths. */
export async function installCni(source: string, dest: string): Promise<string[]> {
  const files = await pluginFiles(source);
  await mkdir(dest, { recursive: true, mode: 0o755 });
  const out: string[] = [];
  for (const name of files) {
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
