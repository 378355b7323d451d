// Lays out <outDir> (default dist/cni/bin) for every entry point cni-plugins/cmd/<name>.ts:
//
//   <name>       the native client (cni-plugins/native/weft-cni.c, one executable hard-linked
//                under every name): forwards the request to weftd's CNI server, or, when none
//                answers, execs <name>.cjs next to it (issue 17)
//   <name>.cjs   the Node.js bundle of the plugin, one executable file:
//
//   #!/usr/bin/env -S -u NODE_EXTRA_CA_CERTS node     (that variable costs ~80 ms of Node start-up)
//   // weft-cni-plugin: <name>                          (marker: delegation calls it in-process)
//   "use strict";var require=(id)=>process.getBuiltinModule(id);
//   …minified CommonJS…
//
// With `native: false` (`--no-native`) it is the layout from before the client: <name> is the
// bundle. The client is compiled with $CC (default cc, else gcc) `-O2 -Wall -Wextra -Werror`,
// statically linked when libc.a is there (≈ 0.5 ms less per exec than the dynamic one). Should it
// not compile, the build fails but still leaves a working directory: the bundle under both names.
//
// Why `.cjs`: Node runs a main file by its extension, and `.node` would be dlopen'ed as an addon;
// `.cjs` is CommonJS whatever package.json scope the file lands in.
//
// Format: CommonJS with no import/export syntax at all, so the extensionless file runs whatever
// package.json scope it lands in (Node detects it as CommonJS where there is none, e.g.
// /opt/cni/bin). Builtins come from process.getBuiltinModule, which exists in both module systems
// (every other dependency is bundled). Measured here, VERSION through the shebang: CommonJS ≈ bare
// `node -e` start-up (~43 ms median), ESM ≈ +10-20 ms (the ESM loader), so CommonJS it is. Under
// a "type": "module" package.json Node would load it through the ESM loader (+10 ms), hence the
// `{"type":"commonjs"}` package.json written next to the bundles (dist/cni/bin sits in this repo).
//
// CommonJS has no top-level await: an entry point's `await runPlugin(plugin)` is built as
// `void runPlugin(plugin)` (runPlugin never rejects and is the last statement); any other
// top-level await fails the build with a clear message. So does `import.meta` (empty in CommonJS).
//
// Usage: node --import=tsx cni-plugins/build.ts [outDir] [--no-native] [--spawn-helper=<file> | --no-spawn-helper]
//   (default dist/cni/bin). The CLI also compiles the CNI plugin process's spawn helper
//   (cni-plugins/native/weft-spawn.c) into <outDir>/../../native/weft-spawn (dist/native/weft-spawn
//   by default), unless --no-native or --no-spawn-helper.
import { build, type Message, type Metafile, type Plugin } from 'esbuild';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { chmod, copyFile, link, mkdir, open, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { errorMessage } from '../src/util/errors.js';
import { CommandError, execProgram } from '../src/util/exec.js';
import { MAX_FRAME_BYTES } from '../src/cniserver/frame.js';
import { BUNDLE_SUFFIX, CLIENT_MARKER } from './skel/delegate.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');

export const SHEBANG = '#!/usr/bin/env -S -u NODE_EXTRA_CA_CERTS node';
export const MARKER_PREFIX = '// weft-cni-plugin: ';
export { BUNDLE_SUFFIX };
/** In the client's first 4 KiB (an ELF note), NUL-terminated: how delegation recognizes it. */
export { CLIENT_MARKER };
export const CLIENT_SOURCE = join(HERE, 'native', 'weft-cni.c');
export const SPAWN_HELPER_SOURCE = join(HERE, 'native', 'weft-spawn.c');
// The server's cap on a request goes into the client, so the two cannot drift apart.
const CLIENT_FLAGS = ['-O2', '-Wall', '-Wextra', '-Werror', '-s', `-DWEFT_MAX_REQUEST=${MAX_FRAME_BYTES}`];

/** Packages a plugin bundle must not contain (slow to load, and plugins need none of them). */
const FORBIDDEN_PACKAGES = ['winston', 'etcd3', '@grpc', 'prom-client', 'yargs', 'cockatiel'];

export interface BundleEntry {
  /** Bundle file name (= the CNI `type`), e.g. "host-local". */
  readonly name: string;
  /** The entry module, e.g. cni-plugins/cmd/host-local.ts. */
  readonly entry: string;
}

export class CniBuildError extends Error {
  constructor(
    readonly bundle: string,
    message: string,
  ) {
    super(`building CNI plugin ${bundle}: ${message}`);
    this.name = 'CniBuildError';
  }
}

const NAME_RE = /^[a-z0-9][a-z0-9_.-]*$/;

/** The entry points (composition roots) live in cni-plugins/cmd/, each file named after its bundle. */
const ENTRY_DIR = 'cmd';

/** cni-plugins/cmd/<name>.ts for every bundle: `<name>` is the bundle's (and the CNI `type`'s) name. */
export function findPluginEntries(pluginsDir = HERE): BundleEntry[] {
  const dir = join(pluginsDir, ENTRY_DIR);
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true })
    .filter((d) => d.isFile() && d.name.endsWith('.ts') && !d.name.endsWith('.d.ts'))
    .map((d) => ({ name: d.name.slice(0, -'.ts'.length), entry: join(dir, d.name) }))
    .sort((a, b) => a.name.localeCompare(b.name));
}

function packageVersion(): string {
  try {
    return (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version?: string }).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

function forbiddenInputs(meta: Metafile, output: string): string[] {
  const inputs = Object.keys(meta.outputs[output]?.inputs ?? {});
  return FORBIDDEN_PACKAGES.filter((p) => inputs.some((i) => i.includes(`node_modules/${p}/`)));
}

/** Entry points end with `await runPlugin(…)`; CommonJS needs it without the await. */
function mainRewrite(entries: ReadonlySet<string>): Plugin {
  return {
    name: 'weft-cni-main',
    setup(b) {
      b.onLoad({ filter: /\.ts$/ }, async (args) => {
        if (!entries.has(resolve(args.path))) return undefined;
        const source = await readFile(args.path, 'utf8');
        return { contents: source.replace(/^await(\s+runPlugin\s*\()/m, 'void$1'), loader: 'ts' };
      });
    },
  };
}

function describeMessages(msgs: readonly Message[]): string {
  return msgs.map((m) => `${m.location ? `${m.location.file}:${m.location.line}: ` : ''}${m.text}`).join('; ');
}

/** Writes `data` as `target` (mode 0755) through a temp file and a rename. */
async function writeExecutable(target: string, data: string): Promise<void> {
  // Written next to the target and renamed: a running plugin never sees a half-written file.
  const tmp = `${target}.tmp-${process.pid}`;
  await writeFile(tmp, data, { mode: 0o755 });
  await chmod(tmp, 0o755);
  await rename(tmp, target);
}

async function bundleOne(outDir: string, e: BundleEntry, version: string, fileName: string): Promise<string> {
  let result;
  try {
    result = await build({
      entryPoints: { [e.name]: e.entry },
      bundle: true,
      platform: 'node',
      target: 'node20',
      format: 'cjs',
      minify: true,
      legalComments: 'none',
      write: false,
      outdir: outDir,
      metafile: true,
      logLevel: 'silent',
      absWorkingDir: ROOT,
      define: { __WEFT_VERSION__: JSON.stringify(version) },
      banner: { js: '"use strict";var require=(id)=>process.getBuiltinModule(id);' },
      plugins: [mainRewrite(new Set([resolve(e.entry)]))],
    });
  } catch (err) {
    const errors = (err as { errors?: Message[] }).errors ?? [];
    const text = errors.length > 0 ? describeMessages(errors) : errorMessage(err);
    const hint = /top-level await/i.test(text) ? ' (an entry point may only `await runPlugin(plugin)` at top level)' : '';
    throw new CniBuildError(e.name, text + hint);
  }
  const importMeta = result.warnings.filter((w) => w.id === 'empty-import-meta');
  if (importMeta.length > 0) throw new CniBuildError(e.name, `import.meta is empty in a bundle: ${describeMessages(importMeta)}`);
  const file = result.outputFiles.find((f) => f.path === join(outDir, `${e.name}.js`));
  if (!file) throw new CniBuildError(e.name, 'esbuild produced no output');
  const metaKey = Object.keys(result.metafile.outputs).find((k) => resolve(ROOT, k) === file.path) ?? '';
  const heavy = forbiddenInputs(result.metafile, metaKey);
  if (heavy.length > 0) throw new CniBuildError(e.name, `bundle pulls in ${heavy.join(', ')}; import only what the plugin needs`);
  const target = join(outDir, fileName);
  await writeExecutable(target, `${SHEBANG}\n${MARKER_PREFIX}${e.name}\n${file.text}`);
  return target;
}

/** The compilers to try: $CC, else cc, then gcc. */
function compilers(): string[] {
  const cc = process.env.CC?.trim();
  return cc ? [cc] : ['cc', 'gcc'];
}

/** Whether `file` has the client's marker in its first 4 KiB (what delegation reads). */
async function hasClientMarker(file: string): Promise<boolean> {
  const fh = await open(file, 'r');
  try {
    const buf = Buffer.alloc(4096);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    return buf.subarray(0, bytesRead).includes(`${CLIENT_MARKER}\0`);
  } finally {
    await fh.close();
  }
}

/**
 * Compiles `source` into `outFile` with CLIENT_FLAGS (+ `extraFlags`): static when the C library
 * allows it, else dynamic. `check` vets the output before it is renamed into place. Throws a
 * CniBuildError (named `what`) with the compiler's messages.
 */
async function compileNative(what: string, source: string, outFile: string, check?: (tmp: string, cc: string) => Promise<void>): Promise<void> {
  const tmp = `${outFile}.tmp-${process.pid}`;
  let last = '';
  try {
    for (const cc of compilers()) {
      for (const linkage of [['-static'], []]) {
        let r;
        try {
          r = await execProgram(cc, [...CLIENT_FLAGS, ...linkage, '-o', tmp, source], { timeoutMs: 120_000 });
        } catch (err) {
          last = err instanceof CommandError && err.notFound ? `${cc}: not found (install gcc: \`make deps\`)` : errorMessage(err);
          break; // this compiler cannot run: try the next one
        }
        if (r.code === 0) {
          await check?.(tmp, cc);
          await chmod(tmp, 0o755);
          await rename(tmp, outFile);
          return;
        }
        last = `${cc} ${[...CLIENT_FLAGS, ...linkage].join(' ')}: ${(r.stderr || r.stdout).trim()}`;
      }
    }
  } finally {
    await rm(tmp, { force: true });
  }
  throw new CniBuildError(what, `compiling ${what === 'weft-cni' ? 'the native client ' : ''}${source}: ${last}`);
}

/**
 * Compiles the native client (cni-plugins/native/weft-cni.c) into `outFile`: static when the
 * C library allows it, else dynamic. Throws a CniBuildError with the compiler's messages.
 */
export async function compileClient(outFile: string, source = CLIENT_SOURCE): Promise<void> {
  await compileNative('weft-cni', source, outFile, async (tmp, cc) => {
    if (!(await hasClientMarker(tmp))) throw new CniBuildError('weft-cni', `${cc} produced a client without its marker in the first 4 KiB`);
  });
}

/**
 * Compiles the CNI plugin process's spawn helper (cni-plugins/native/weft-spawn.c, see
 * src/util/spawn-helper.ts) into `outFile`, creating its directory; static when possible.
 */
export async function compileSpawnHelper(outFile: string, source = SPAWN_HELPER_SOURCE): Promise<void> {
  await mkdir(dirname(resolve(outFile)), { recursive: true });
  await compileNative('weft-spawn', source, resolve(outFile));
}

/** `source` as `target` (a hard link when possible), through a temp name and a rename. */
async function placeCopy(source: string, target: string): Promise<void> {
  const tmp = `${target}.tmp-${process.pid}`;
  await rm(tmp, { force: true });
  try {
    await link(source, tmp);
  } catch {
    await copyFile(source, tmp);
    await chmod(tmp, 0o755);
  }
  await rename(tmp, target);
}

export interface BuildReport {
  /** Paths of the bundles written. */
  readonly written: string[];
  /** One error per bundle that failed; the others are still written. */
  readonly failures: CniBuildError[];
}

export interface BuildOptions {
  /**
   * true (default): `<name>` is the native client and `<name>.cjs` the bundle. false: `<name>` is
   * the bundle (no client, no compiler needed), the layout from before the client.
   */
  readonly native?: boolean;
}

/**
 * Bundles each entry (independently, in parallel) into `<outDir>/<name>.cjs` and puts the native
 * client at `<outDir>/<name>` (or, with `native: false`, the bundle at `<outDir>/<name>`), mode 0755.
 */
export async function buildCniBundlesReport(outDirArg: string, entries: readonly BundleEntry[], opts: BuildOptions = {}): Promise<BuildReport> {
  const outDir = resolve(outDirArg);
  const native = opts.native ?? true;
  for (const e of entries) {
    if (!NAME_RE.test(e.name)) throw new CniBuildError(e.name, 'bundle names must be plain lower-case file names');
  }
  await mkdir(outDir, { recursive: true });
  // Keeps Node on its CommonJS fast path when outDir is inside a "type": "module" package.
  await writeFile(join(outDir, 'package.json'), '{"type":"commonjs"}\n');
  const version = packageVersion();
  const clientFile = join(outDir, `.weft-cni-client-${process.pid}`);
  const client = native && entries.length > 0 ? compileClient(clientFile) : Promise.resolve();
  client.catch(() => undefined); // awaited below, after the bundles
  const settled = await Promise.allSettled(entries.map((e) => bundleOne(outDir, e, version, native ? e.name + BUNDLE_SUFFIX : e.name)));
  const written: string[] = [];
  const failures: CniBuildError[] = [];
  const bundled: BundleEntry[] = [];
  settled.forEach((s, i) => {
    if (s.status === 'fulfilled') {
      written.push(s.value);
      bundled.push(entries[i]!);
    } else {
      failures.push(s.reason instanceof CniBuildError ? s.reason : new CniBuildError(entries[i]!.name, errorMessage(s.reason)));
    }
  });
  if (!native) return { written, failures };
  // The clients go in after their bundles: a client never runs without its fallback.
  let compiled = true;
  try {
    await client;
  } catch (err) {
    compiled = false;
    failures.push(err instanceof CniBuildError ? err : new CniBuildError('weft-cni', errorMessage(err)));
  }
  try {
    for (const e of bundled) {
      const target = join(outDir, e.name);
      // No client: the bundle under its plain name too, so the directory still works as before.
      await placeCopy(compiled ? clientFile : join(outDir, e.name + BUNDLE_SUFFIX), target);
      written.push(target);
    }
  } catch (err) {
    failures.push(new CniBuildError('weft-cni', `installing the client: ${errorMessage(err)}`));
  } finally {
    await rm(clientFile, { force: true });
  }
  return { written, failures };
}

/** Like buildCniBundlesReport, but throws (after writing the good ones) if any bundle failed. */
export async function buildCniBundles(outDir: string, entries: readonly BundleEntry[], opts: BuildOptions = {}): Promise<string[]> {
  const { written, failures } = await buildCniBundlesReport(outDir, entries, opts);
  if (failures.length === 1) throw failures[0]!;
  if (failures.length > 1) throw new CniBuildError(failures.map((f) => f.bundle).join(', '), failures.map((f) => f.message).join('\n'));
  return written;
}

/** Bundles every plugin under cni-plugins/ into `outDir` (and the client, see BuildOptions). Returns the written paths. */
export async function buildCniPlugins(outDir: string, opts: BuildOptions = {}): Promise<string[]> {
  return buildCniBundles(outDir, findPluginEntries(), opts);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const args = process.argv.slice(2);
  const native = !args.includes('--no-native');
  const outDir = resolve(args.find((a) => !a.startsWith('--')) ?? join(ROOT, 'dist/cni/bin'));
  const entries = findPluginEntries();
  // The spawn helper goes to <outDir>/../../native/weft-spawn (dist/native/weft-spawn for the
  // default outDir, where the plugin process looks for it), or --spawn-helper=<file>.
  const helperArg = args.find((a) => a.startsWith('--spawn-helper='))?.slice('--spawn-helper='.length);
  const helperOut = native && !args.includes('--no-spawn-helper') ? resolve(helperArg ?? join(outDir, '..', '..', 'native', 'weft-spawn')) : undefined;
  const helper = helperOut ? compileSpawnHelper(helperOut) : Promise.resolve();
  helper.catch(() => undefined); // awaited below
  const { written, failures } = await buildCniBundlesReport(outDir, entries, { native });
  try {
    await helper;
    if (helperOut) written.push(helperOut);
  } catch (err) {
    failures.push(err instanceof CniBuildError ? err : new CniBuildError('weft-spawn', errorMessage(err)));
  }
  for (const p of written) console.log(p);
  for (const f of failures) console.error(f.message);
  if (entries.length === 0) console.error(`no cni-plugins/cmd/*.ts found; nothing written to ${outDir}`);
  if (failures.length > 0) process.exitCode = 1;
}
