// Bundles every entry point cni-plugins/cmd/<name>.ts into one executable file <outDir>/<name>:
//
//   #!/usr/bin/env -S -u NODE_EXTRA_CA_CERTS node     (that variable costs ~80 ms of Node start-up)
//   // weft-cni-plugin: <name>                          (marker: delegation calls it in-process)
//   "use strict";var require=(id)=>process.getBuiltinModule(id);
//   …minified CommonJS…
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
// Usage: node --import=tsx cni-plugins/build.ts [outDir]   (default dist/cni/bin)
import { build, type Message, type Metafile, type Plugin } from 'esbuild';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { chmod, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { errorMessage } from '../src/util/errors.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');

export const SHEBANG = '#!/usr/bin/env -S -u NODE_EXTRA_CA_CERTS node';
export const MARKER_PREFIX = '// weft-cni-plugin: ';

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

async function bundleOne(outDir: string, e: BundleEntry, version: string): Promise<string> {
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
  const target = join(outDir, e.name);
  // Written next to the target and renamed: a running plugin never sees a half-written file.
  const tmp = `${target}.tmp-${process.pid}`;
  await writeFile(tmp, `${SHEBANG}\n${MARKER_PREFIX}${e.name}\n${file.text}`, { mode: 0o755 });
  await chmod(tmp, 0o755);
  await rename(tmp, target);
  return target;
}

export interface BuildReport {
  /** Paths of the bundles written. */
  readonly written: string[];
  /** One error per bundle that failed; the others are still written. */
  readonly failures: CniBuildError[];
}

/** Bundles each entry (independently, in parallel) into `<outDir>/<name>`, mode 0755. */
export async function buildCniBundlesReport(outDirArg: string, entries: readonly BundleEntry[]): Promise<BuildReport> {
  const outDir = resolve(outDirArg);
  for (const e of entries) {
    if (!NAME_RE.test(e.name)) throw new CniBuildError(e.name, 'bundle names must be plain lower-case file names');
  }
  await mkdir(outDir, { recursive: true });
  // Keeps Node on its CommonJS fast path when outDir is inside a "type": "module" package.
  await writeFile(join(outDir, 'package.json'), '{"type":"commonjs"}\n');
  const version = packageVersion();
  const settled = await Promise.allSettled(entries.map((e) => bundleOne(outDir, e, version)));
  const written: string[] = [];
  const failures: CniBuildError[] = [];
  settled.forEach((s, i) => {
    if (s.status === 'fulfilled') written.push(s.value);
    else failures.push(s.reason instanceof CniBuildError ? s.reason : new CniBuildError(entries[i]!.name, errorMessage(s.reason)));
  });
  return { written, failures };
}

/** Like buildCniBundlesReport, but throws (after writing the good ones) if any bundle failed. */
export async function buildCniBundles(outDir: string, entries: readonly BundleEntry[]): Promise<string[]> {
  const { written, failures } = await buildCniBundlesReport(outDir, entries);
  if (failures.length === 1) throw failures[0]!;
  if (failures.length > 1) throw new CniBuildError(failures.map((f) => f.bundle).join(', '), failures.map((f) => f.message).join('\n'));
  return written;
}

/** Bundles every plugin under cni-plugins/ into `outDir`. Returns the written paths. */
export async function buildCniPlugins(outDir: string): Promise<string[]> {
  return buildCniBundles(outDir, findPluginEntries());
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const outDir = resolve(process.argv[2] ?? join(ROOT, 'dist/cni/bin'));
  const entries = findPluginEntries();
  const { written, failures } = await buildCniBundlesReport(outDir, entries);
  for (const p of written) console.log(p);
  for (const f of failures) console.error(f.message);
  if (entries.length === 0) console.error(`no cni-plugins/cmd/*.ts found; nothing written to ${outDir}`);
  if (failures.length > 0) process.exitCode = 1;
}
