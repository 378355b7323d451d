// subnet.env: the file flannel's CNI plugin (and mk-docker-opts.sh) reads to learn this node's
// subnet and MTU. Format and write order follow flannel's WriteSubnetFile; the read-back follows
// main.go's ReadCIDR(s)FromSubnetFile, which flannel uses to find the previous lease subnet and
// the masquerade rules to clean up.
import { randomBytes } from 'node:crypto';
import { chmod, mkdir, open, readFile, rename, rm } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';

import { IPNet, type Family } from '../util/ip.js';

export interface SubnetEnv {
  network: IPNet | null;
  /** The lease subnet; written as its first address (the bridge gateway) with the prefix length. */
  subnet: IPNet | null;
  ipv6Network: IPNet | null;
  ipv6Subnet: IPNet | null;
  mtu: number;
  ipMasq: boolean;
  /**
   * Backend-specific lines after flannel's (e.g. the ovs backend's bridge for the CNI plugin).
   * flannel's readers skip keys they do not know, so these never break a flannel plugin.
   */
  extra?: ReadonlyArray<readonly [string, string]>;
}

export interface PreviousSubnets {
  network: IPNet | null;
  subnet: IPNet | null;
  ipv6Network: IPNet | null;
  ipv6Subnet: IPNet | null;
}

export class SubnetFileError extends Error {
  constructor(
    readonly path: string,
    readonly operation: 'read' | 'write',
    cause: unknown,
  ) {
    super(`cannot ${operation} subnet file ${path}: ${describe(cause)}`, { cause });
    this.name = 'SubnetFileError';
  }
}

function describe(cause: unknown): string {
  const text = cause instanceof Error ? cause.message : String(cause);
  // Keep the message on one line: it ends up in a single log line.
  return text.replace(/\s*\n\s*/g, ' ');
}

function checkFamily(name: string, net: IPNet | null, family: Family): void {
  if (net !== null && net.family !== family) {
    throw new RangeError(`${name} must be an IPv${family} prefix, got ${net.toString()}`);
  }
}

/** The exact file content flannel writes; only the families present in `env` appear. */
export function renderSubnetEnv(env: SubnetEnv): string {
  checkFamily('network', env.network, 4);
  checkFamily('subnet', env.subnet, 4);
  checkFamily('ipv6Network', env.ipv6Network, 6);
  checkFamily('ipv6Subnet', env.ipv6Subnet, 6);
  if (!Number.isInteger(env.mtu) || env.mtu <= 0) {
    throw new RangeError(`mtu must be a positive integer, got ${env.mtu}`);
  }
  const lines: string[] = [];
  if (env.network) lines.push(`FLANNEL_NETWORK=${env.network.toString()}`);
  if (env.subnet) lines.push(`FLANNEL_SUBNET=${env.subnet.nth(1n).toString()}/${env.subnet.prefix}`);
  if (env.ipv6Network) lines.push(`FLANNEL_IPV6_NETWORK=${env.ipv6Network.toString()}`);
  if (env.ipv6Subnet) {
    lines.push(`FLANNEL_IPV6_SUBNET=${env.ipv6Subnet.nth(1n).toString()}/${env.ipv6Subnet.prefix}`);
  }
  lines.push(`FLANNEL_MTU=${env.mtu}`);
  lines.push(`FLANNEL_IPMASQ=${env.ipMasq ? 'true' : 'false'}`);
  for (const [key, value] of env.extra ?? []) {
    if (!/^WEFT_[A-Z0-9_]+$/.test(key) || /[\n=]/.test(value)) throw new RangeError(`bad subnet.env line ${key}=${value}`);
    lines.push(`${key}=${value}`);
  }
  return lines.map((l) => `${l}\n`).join('');
}

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

/** Unquoted values may carry a trailing ` # comment` (godotenv behaviour). */
function parseValue(raw: string): string {
  const v = raw.trim();
  const q = v[0];
  if ((q === '"' || q === "'") && v.length >= 2) {
    const end = v.indexOf(q, 1);
    if (end > 0) return v.slice(1, end);
  }
  const hash = v.search(/\s#/);
  return (hash >= 0 ? v.slice(0, hash) : v).trim();
}

function parseEnvLines(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const rawLine of text.split(/\r?\n/)) {
    let line = rawLine.trim();
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith('export ')) line = line.slice('export '.length).trimStart();
    const eq = line.indexOf('=');
    if (eq <= 0) continue;
    const key = line.slice(0, eq).trim();
    if (!/^[A-Za-z_][A-Za-z0-9_.]*$/.test(key)) continue;
    out.set(key, parseValue(line.slice(eq + 1)));
  }
  return out;
}

/**
 * flannel's ReadCIDRFromSubnetFile: the value is a comma-separated list, entries that are not
 * a CIDR of the wanted family are skipped, and anything but exactly one valid entry means none.
 * The result is the network (FLANNEL_SUBNET=10.42.0.1/24 → 10.42.0.0/24).
 */
function singleCidr(value: string | undefined, family: Family): IPNet | null {
  if (value === undefined) return null;
  const valid: IPNet[] = [];
  for (const entry of value.split(',')) {
    const net = IPNet.tryParse(entry.trim());
    if (net !== null && net.family === family) valid.push(net);
  }
  return valid.length === 1 ? (valid[0] ?? null) : null;
}

/** Never throws: a damaged file just means "no previous subnets". */
export function parseSubnetEnv(text: string): PreviousSubnets {
  const vars = parseEnvLines(typeof text === 'string' ? text : '');
  return {
    network: singleCidr(vars.get('FLANNEL_NETWORK'), 4),
    subnet: singleCidr(vars.get('FLANNEL_SUBNET'), 4),
    ipv6Network: singleCidr(vars.get('FLANNEL_IPV6_NETWORK'), 6),
    ipv6Subnet: singleCidr(vars.get('FLANNEL_IPV6_SUBNET'), 6),
  };
}

/** A missing file means a first start (all null); any other read failure is a SubnetFileError. */
export async function readPreviousSubnets(path: string): Promise<PreviousSubnets> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') {
      return { network: null, subnet: null, ipv6Network: null, ipv6Subnet: null };
    }
    throw new SubnetFileError(path, 'read', e);
  }
  return parseSubnetEnv(text);
}
