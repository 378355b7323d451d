// The plugin's own (host) netns through /proc: sysctls written directly under /proc/sys, and the
// names of its links from /proc/net/dev (per netns of the reader), both without a child process.
import { readFileSync, writeFileSync } from 'node:fs';

/** Writes a host sysctl (the plugin runs in the host netns); path relative to /proc/sys. */
export function writeHostSysctl(key: string, value: string): void {
  writeFileSync(`/proc/sys/${key}`, value);
}

export function readHostSysctl(key: string): string {
  return readFileSync(`/proc/sys/${key}`, 'utf8').trim();
}

/** Sets a host sysctl unless it already has the value (as the reference's echo1). */
export function ensureHostSysctl(key: string, value: string): void {
  if (readHostSysctl(key) !== value) writeHostSysctl(key, value);
}

/** Names of the links in the plugin's own netns (/proc/net/dev is per netns of the reader). */
export function hostLinkNames(): Set<string> {
  const names = new Set<string>();
  for (const line of readFileSync('/proc/net/dev', 'utf8').split('\n').slice(2)) {
    const colon = line.indexOf(':');
    if (colon > 0) names.add(line.slice(0, colon).trim());
  }
  return names;
}
