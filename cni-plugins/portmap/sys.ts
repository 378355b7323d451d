// The host-side effects portmap needs besides netfilter: finding the tools (runtimes often exec
// plugins with a short PATH), route_localnet on the interface that routes to the container, and
// flushing stale UDP conntrack entries of the mapped ports. All of it acts on the netns this
// process runs in (the host's).
import { accessSync, constants, readFileSync, writeFileSync } from 'node:fs';
import { endianness } from 'node:os';
import { delimiter, join } from 'node:path';

import { CommandError, runCommand } from '../../src/util/exec.js';
import type { Family, IPAddr } from '../../src/util/ip.js';
import type { IptablesPayload } from '../../src/render/iptables.js';
import type { NftScript } from '../../src/render/nft.js';
import { errorMessage } from '../../src/util/errors.js';
import { pluginStderr } from '../skel/stderr.js';

const FALLBACK_DIRS = ['/usr/sbin', '/sbin', '/usr/bin', '/bin', '/usr/local/sbin', '/usr/local/bin'];
const found = new Map<string, string>();

/** The executable's path from PATH, then the usual system directories; null when absent. */
export function findBinary(name: string): string | null {
  const hit = found.get(name);
  if (hit !== undefined) return hit;
  const dirs = [...(process.env['PATH'] ?? '').split(delimiter).filter((d) => d !== ''), ...FALLBACK_DIRS];
  let path: string | null = null;
  for (const d of dirs) {
    try {
      accessSync(join(d, name), constants.X_OK);
      path = join(d, name);
      break;
    } catch {
      // not here
    }
  }
  // Only hits are kept: in weftd's CNI server this process lives on, and a tool installed after a
  // miss must be found by the next request.
  if (path !== null) found.set(name, path);
  return path;
}

export class ToolMissingError extends Error {
  constructor(readonly tool: string) {
    super(`${tool} not found in PATH or the system directories`);
    this.name = 'ToolMissingError';
  }
}

/**
 * Runs a tool found by `findBinary`; stdout on success, a CommandError otherwise. Standard input is
 * only ever a rendered `nft -f` script or iptables-restore payload, never raw text.
 */
export async function runTool(name: string, args: readonly string[], stdin?: NftScript | IptablesPayload): Promise<string> {
  const path = findBinary(name);
  if (!path) throw new ToolMissingError(name);
  return runCommand(path, args, stdin === undefined ? {} : { input: stdin });
}

/**
 * Diagnostics that must not fail the verb (the reference logs them too). Never stdout. Through
 * skel/stderr.ts so that, in weftd's CNI server, they reach the request's caller.
 */
export function warn(msg: string): void {
  pluginStderr(`portmap: ${msg}\n`);
}

// ---- route_localnet ----

interface V4Route {
  readonly iface: string;
  readonly dst: number;
  readonly mask: number;
  readonly metric: number;
}

const RTF_UP = 0x1;

function hexAddr(hex: string): number {
  const v = Number.parseInt(hex, 16) >>> 0;
  // /proc/net/route prints the network-order word as a host-order integer.
  if (endianness() === 'BE') return v;
  return (((v & 0xff) << 24) | ((v & 0xff00) << 8) | ((v >>> 8) & 0xff00) | (v >>> 24)) >>> 0;
}

/** Parses /proc/net/route (the main IPv4 table). */
export function parseProcRoutes(text: string): V4Route[] {
  const out: V4Route[] = [];
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 8) continue;
    const flags = Number.parseInt(f[3]!, 16);
    if (!(flags & RTF_UP)) continue;
    out.push({ iface: f[0]!, dst: hexAddr(f[1]!), mask: hexAddr(f[7]!), metric: Number(f[6]) });
  }
  return out;
}

/**
 * The interface the host routes `ip` through: longest prefix, then lowest metric. (The reference
 * asks the kernel with RTM_GETROUTE; for a container behind a bridge or veth both give the
 * connected route's device.)
 */
export function routeInterface(routes: readonly V4Route[], ip: IPAddr): string | null {
  const a = Number(ip.value);
  let best: V4Route | null = null;
  const bits = (m: number): number => m.toString(2).replace(/0/g, '').length;
  for (const r of routes) {
    if (((a & r.mask) >>> 0) !== r.dst) continue;
    if (!best || bits(r.mask) > bits(best.mask) || (bits(r.mask) === bits(best.mask) && r.metric < best.metric)) best = r;
  }
  return best ? best.iface : null;
}

export class SysctlError extends Error {
  constructor(
    readonly path: string,
    reason: string,
  ) {
    super(`unable to enable route_localnet: ${path}: ${reason}`);
    this.name = 'SysctlError';
  }
}

/** Lets 127.0.0.1-sourced (localhost hostPort) traffic be routed to the container. Returns the interface. */
export function enableRouteLocalnet(ip: IPAddr): string | null {
  const iface = routeInterface(parseProcRoutes(readFileSync('/proc/net/route', 'utf8')), ip);
  if (!iface) return null;
  if (!/^[^/\s]{1,15}$/.test(iface) || iface === '.' || iface === '..') throw new SysctlError(iface, 'bad interface name');
  const path = `/proc/sys/net/ipv4/conf/${iface}/route_localnet`;
  try {
    writeFileSync(path, '1');
  } catch (e) {
    throw new SysctlError(path, errorMessage(e));
  }
  return iface;
}

// ---- conntrack ----

/** Above this many tracked connections, scanning /proc costs more than running conntrack(8). */
const PROC_SCAN_LIMIT = 20_000;

/**
 * The ports of `ports` that have UDP entries of `family` in a /proc/net/nf_conntrack listing
 * (the original direction's dport, the first one on the line).
 */
export function udpPortsInConntrack(listing: string, family: Family, ports: readonly number[]): number[] {
  const want = new Set(ports);
  const hit = new Set<number>();
  const l3 = family === 4 ? 'ipv4' : 'ipv6';
  for (const line of listing.split('\n')) {
    const f = line.split(/\s+/, 3);
    if (f[0] !== l3 || f[2] !== 'udp') continue;
    const m = / dport=(\d+) /.exec(line);
    if (m && want.has(Number(m[1]))) hit.add(Number(m[1]));
  }
  return [...hit];
}

/**
 * Which ports need a conntrack(8) run: none when the netns tracks nothing (or conntrack is not
 * loaded), those with entries when the table is small enough to scan, all of them otherwise.
 */
function portsToFlush(family: Family, ports: readonly number[]): readonly number[] {
  let count: number;
  try {
    count = Number(readFileSync('/proc/sys/net/netfilter/nf_conntrack_count', 'utf8').trim());
  } catch {
    return []; // nf_conntrack not loaded: there is no entry to delete
  }
  if (count === 0) return [];
  if (!(count <= PROC_SCAN_LIMIT)) return ports;
  try {
    return udpPortsInConntrack(readFileSync('/proc/net/nf_conntrack', 'utf8'), family, ports);
  } catch {
    return ports;
  }
}

/**
 * Deletes the UDP conntrack entries whose original destination port is one of `ports`, so that
 * a flow that hit the host port before the mapping existed does not keep bypassing it (#553).
 * conntrack(8) runs only for ports that have entries, one process per port, in parallel;
 * failures are only reported, as in the reference.
 */
export async function flushUdpConntrack(family: Family, ports: readonly number[]): Promise<void> {
  const todo = [...new Set(portsToFlush(family, ports))];
  if (todo.length === 0) return;
  if (!findBinary('conntrack')) {
    warn('conntrack not found: stale UDP conntrack entries were not flushed');
    return;
  }
  await Promise.all(
    todo.map(async (port) => {
      try {
        await runTool('conntrack', ['-D', '-p', 'udp', '--orig-port-dst', String(port), '-f', family === 4 ? 'ipv4' : 'ipv6']);
      } catch (e) {
        // Exit status 1 with "0 flow entries have been deleted" is the normal nothing-to-do case.
        if (e instanceof CommandError && e.exitCode === 1 && /0 flow entries/.test(e.stderr)) return;
        warn(`failed to delete stale UDP conntrack entries for port ${port} (IPv${family}): ${errorMessage(e)}`);
      }
    }),
  );
}
