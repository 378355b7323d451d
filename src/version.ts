// The version from package.json, found from the source tree (src/) or the build (dist/src/).
import { existsSync, readFileSync } from 'node:fs';

function readVersion(): string {
  for (const rel of ['../package.json', '../../package.json']) {
    const url = new URL(rel, import.meta.url);
    if (existsSync(url)) {
      const pkg = JSON.parse(readFileSync(url, 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'weft' && pkg.version) return pkg.version;
    }
  }
  return 'unknown';
}

export const VERSION = readVersion();
