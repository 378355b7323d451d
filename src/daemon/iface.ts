// External interface selection: flannel's pkg/ipmatch LookupExtIface plus the loop over
// --iface / --iface-regex / --iface-can-reach in its main.go. The system is seen through a
// small SystemView so the selection logic is pure and testable with a fake; the real view
// runs `ip -j` (optionally inside a network namespace).
import type { ExternalInterface } from '../backend/backend.js';
import { errorMessage } from '../util/errors.js';
import { CommandError, runCommand } from '../util/exec.js';
import { IPAddr, IPNet, type Family } from '../util/ip.js';
import { ifNameProblem } from '../util/names.js';

export interface IfaceOptions {
  iface: string[];
  ifaceRegex: string[];
  ifaceCanReach?: string;
  publicIP?: string;
  publicIPv6?: string;
  enableIPv4: boolean;
  enableIPv6: boolean;
}

export interface LinkAddr {
  ip: IPAddr;
  prefix: number;
  /** `ip addr` scope: global, link, host, site, or a number. */
  scope: string;
  /** Deprecated (preferred lifetime over) addresses are never chosen as the IPv6 address. */
  deprecated?: boolean;
}

export interface LinkInfo {
  name: string;
  index: number;
  mtu: number;
  up: boolean;
  loopback: boolean;
  addrs: LinkAddr[];
}

/** How the selection sees the system; the real one runs `ip -j` (optionally `ip -n <netns>`). */
export interface SystemView {
  links(): Promise<LinkInfo[]>;
  /** Dev of the default route in the main table, null when there is none. */
  defaultRouteLink(family: 4 | 6): Promise<string | null>;
  /** Dev that `ip route get` picks, null when the destination is unreachable. */
  routeGetLink(dst: IPAddr): Promise<string | null>;
}

export class InterfaceSelectionError extends Error {
  constructor(
    message: string,
    /** One entry per option value tried, e.g. `--iface eth9: no such interface`. */
    readonly attempts: readonly string[] = [],
  ) {
    super(message);
    this.name = 'InterfaceSelectionError';
  }
}

const NETNS_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$/;

// ---------------------------------------------------------------------------------------------
// The real view: `ip -j`.

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function parseJsonArray(args: readonly string[], stdout: string): Record<string, unknown>[] {
  // `ip -j` prints nothing at all for some empty results.
  if (stdout.trim() === '') return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(stdout);
  } catch (e) {
    throw new CommandError('ip', args, 0, '', `unparseable JSON output: ${errorMessage(e)}`);
  }
  if (!Array.isArray(parsed)) throw new CommandError('ip', args, 0, '', 'JSON output is not an array');
  return parsed.filter(isRecord);
}

function toLinkInfo(o: Record<string, unknown>): LinkInfo | null {
  const { ifname, ifindex, mtu, flags, link_type: linkType, addr_info: addrInfo } = o;
  if (typeof ifname !== 'string' || typeof ifindex !== 'number') return null;
  const flagList = Array.isArray(flags) ? flags.filter((f): f is string => typeof f === 'string') : [];
  const addrs: LinkAddr[] = [];
  for (const a of Array.isArray(addrInfo) ? addrInfo : []) {
    if (!isRecord(a) || typeof a.local !== 'string' || typeof a.prefixlen !== 'number') continue;
    const ip = IPAddr.tryParse(a.local);
    if (ip === null) continue;
    const scope = typeof a.scope === 'string' || typeof a.scope === 'number' ? String(a.scope) : 'global';
    const addr: LinkAddr = { ip, prefix: a.prefixlen, scope };
    if (a.deprecated === true) addr.deprecated = true;
    addrs.push(addr);
  }
  return {
    name: ifname,
    index: ifindex,
    mtu: typeof mtu === 'number' ? mtu : 0,
    up: flagList.includes('UP'),
    loopback: flagList.includes('LOOPBACK') || linkType === 'loopback',
    addrs,
  };
}

/** A unicast route's dev; multipath routes name it in their first next hop. */
function routeDev(r: Record<string, unknown>): string | null {
  if (r.type !== undefined && r.type !== 'unicast' && r.type !== 'local') return null;
  if (typeof r.dev === 'string') return r.dev;
  if (Array.isArray(r.nexthops)) {
    for (const nh of r.nexthops) {
      if (isRecord(nh) && typeof nh.dev === 'string') return nh.dev;
    }
  }
  return null;
}

export function ipCommandView(netns?: string): SystemView {
  if (netns !== undefined && !NETNS_NAME.test(netns)) {
    throw new InterfaceSelectionError(`invalid network namespace name "${netns}"`);
  }
  const prefix = netns !== undefined ? ['-n', netns, '-j'] : ['-j'];

  const run = (args: string[]): Promise<string> => runCommand('ip', [...prefix, ...args]);

  return {
    async links() {
      const args = ['addr', 'show'];
      const out = parseJsonArray([...prefix, ...args], await run(args));
      return out.map(toLinkInfo).filter((l): l is LinkInfo => l !== null);
    },
    async defaultRouteLink(family) {
      const args = [`-${family}`, 'route', 'show', 'default'];
      for (const r of parseJsonArray([...prefix, ...args], await run(args))) {
        const dev = routeDev(r);
        if (dev !== null) return dev;
      }
      return null;
    },
    async routeGetLink(dst) {
      const args = ['route', 'get', dst.toString()];
      let stdout: string;
      try {
        stdout = await run(args);
      } catch (e) {
        // "RTNETLINK answers: Network is unreachable" and friends: no route, not a failure.
        if (e instanceof CommandError && /RTNETLINK answers/.test(e.stderr)) return null;
        throw e;
      }
      for (const r of parseJsonArray([...prefix, ...args], stdout)) {
        const dev = routeDev(r);
        if (dev !== null) return dev;
      }
      return null;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Selection (pure over a SystemView).

const V4_LOOPBACK = IPNet.parse('127.0.0.0/8');
const V4_LINK_LOCAL = IPNet.parse('169.254.0.0/16');
const V6_LINK_LOCAL = IPNet.parse('fe80::/10');

function usableV4(a: LinkAddr): boolean {
  return a.ip.family === 4 && a.scope !== 'host' && !V4_LOOPBACK.contains(a.ip) && !a.ip.isUnspecified();
}

function usableV6(a: LinkAddr): boolean {
  return (
    a.ip.family === 6 &&
    a.scope === 'global' &&
    !V6_LINK_LOCAL.contains(a.ip) &&
    a.deprecated !== true &&
    !a.ip.isUnspecified() &&
    a.ip.value !== 1n
  );
}

/** IPv4 addresses in preference order: non-link-local first, link-local as a last resort (flannel). */
function v4Candidates(link: LinkInfo): IPAddr[] {
  const usable = link.addrs.filter(usableV4);
  return [
    ...usable.filter((a) => !V4_LINK_LOCAL.contains(a.ip)),
    ...usable.filter((a) => V4_LINK_LOCAL.contains(a.ip)),
  ].map((a) => a.ip);
}

function v6Candidates(link: LinkInfo): IPAddr[] {
  return link.addrs.filter(usableV6).map((a) => a.ip);
}

function linkHasAddr(link: LinkInfo, ip: IPAddr): boolean {
  return link.addrs.some((a) => a.ip.equals(ip));
}

interface Settings {
  enableIPv4: boolean;
  enableIPv6: boolean;
  publicIP: IPAddr | null;
  publicIPv6: IPAddr | null;
}

/** A link found by some option plus the addresses that identified it, if any. */
interface Candidate {
  link: LinkInfo;
  matched?: IPAddr;
  /** For --iface-can-reach: prefer the address whose subnet holds the destination. */
  towards?: IPAddr;
  /** Named by --iface: then, as with flannel, a loopback address is acceptable (single-host setups, tests). */
  explicit?: boolean;
}

type Completion = { ok: true; value: ExternalInterface } | { ok: false; reason: string };

function pickAddr(
  family: Family,
  c: Candidate,
  publicAddr: IPAddr | null,
): IPAddr | null {
  let candidates = family === 4 ? v4Candidates(c.link) : v6Candidates(c.link);
  if (candidates.length === 0 && c.explicit && family === 4) {
    candidates = c.link.addrs.filter((a) => a.ip.family === 4 && V4_LOOPBACK.contains(a.ip)).map((a) => a.ip);
  }
  const { matched, towards } = c;
  if (matched !== undefined && matched.family === family && candidates.some((a) => a.equals(matched))) {
    return matched;
  }
  // The public address, when it is local to this interface, is the one peers will use.
  if (publicAddr !== null && candidates.some((a) => a.equals(publicAddr))) return publicAddr;
  if (towards !== undefined && towards.family === family) {
    const onLink = c.link.addrs.find(
      (a) => candidates.some((x) => x.equals(a.ip)) && IPNet.of(a.ip, a.prefix).contains(towards),
    );
    if (onLink) return onLink.ip;
  }
  return candidates[0] ?? null;
}

function complete(c: Candidate, s: Settings): Completion {
  const { link } = c;
  const v4 = s.enableIPv4 ? pickAddr(4, c, s.publicIP) : null;
  const v6 = s.enableIPv6 ? pickAddr(6, c, s.publicIPv6) : null;
  const missing: string[] = [];
  if (s.enableIPv4 && v4 === null) missing.push('IPv4 address');
  if (s.enableIPv6 && v6 === null) missing.push('global IPv6 address');
  if (missing.length > 0) {
    return { ok: false, reason: `interface ${link.name} has no ${missing.join(' and no ')}` };
  }
  if (!Number.isInteger(link.mtu) || link.mtu <= 0) {
    return { ok: false, reason: `cannot determine the MTU of interface ${link.name}` };
  }
  return {
    ok: true,
    value: {
      name: link.name,
      index: link.index,
      mtu: link.mtu,
      ifaceAddr: v4,
      ifaceV6Addr: v6,
      extAddr: s.publicIP ?? v4,
      extV6Addr: s.publicIPv6 ?? v6,
    },
  };
}

function parsePublic(text: string | undefined, family: Family, flag: string): IPAddr | null {
  if (text === undefined || text === '') return null;
  const ip = IPAddr.tryParse(text.trim());
  if (ip === null || ip.family !== family) {
    throw new InterfaceSelectionError(`invalid ${flag} "${text}": not an IPv${family} address`);
  }
  return ip;
}

type IfaceEntry = { text: string; ip: IPAddr } | { text: string; name: string };

function parseIfaceEntries(entries: readonly string[]): IfaceEntry[] {
  return entries.map((raw) => {
    const text = raw.trim();
    const ip = IPAddr.tryParse(text);
    if (ip !== null) return { text, ip };
    const problem = ifNameProblem(text);
    if (problem !== null) {
      throw new InterfaceSelectionError(
        `invalid --iface "${raw}": neither an IP address nor a valid interface name (${problem})`,
      );
    }
    return { text, name: text };
  });
}

function compileRegexes(sources: readonly string[]): { text: string; re: RegExp }[] {
  return sources.map((text) => {
    try {
      return { text, re: new RegExp(text) };
    } catch (e) {
      throw new InterfaceSelectionError(`invalid --iface-regex "${text}": ${errorMessage(e)}`);
    }
  });
}

/** The regex is tried against every interface's usable addresses first, then against names. */
function matchRegex(re: RegExp, links: readonly LinkInfo[], s: Settings): Candidate | null {
  for (const link of links) {
    const addrs = [...(s.enableIPv4 ? v4Candidates(link) : []), ...(s.enableIPv6 ? v6Candidates(link) : [])];
    const hit = addrs.find((a) => re.test(a.toString()));
    if (hit !== undefined) return { link, matched: hit };
  }
  const byName = links.find((l) => re.test(l.name));
  return byName ? { link: byName } : null;
}

export async function selectExternalInterface(
  opts: IfaceOptions,
  view: SystemView = ipCommandView(),
): Promise<ExternalInterface> {
  if (!opts.enableIPv4 && !opts.enableIPv6) {
    throw new InterfaceSelectionError('neither IPv4 nor IPv6 is enabled');
  }
  // Validate every option before looking at the system: bad input fails the same way everywhere.
  const s: Settings = {
    enableIPv4: opts.enableIPv4,
    enableIPv6: opts.enableIPv6,
    publicIP: parsePublic(opts.publicIP, 4, '--public-ip'),
    publicIPv6: parsePublic(opts.publicIPv6, 6, '--public-ipv6'),
  };
  const ifaceEntries = parseIfaceEntries(opts.iface);
  const regexes = compileRegexes(opts.ifaceRegex);
  let canReach: IPAddr | null = null;
  if (opts.ifaceCanReach !== undefined && opts.ifaceCanReach !== '') {
    canReach = IPAddr.tryParse(opts.ifaceCanReach.trim());
    if (canReach === null) {
      throw new InterfaceSelectionError(`invalid --iface-can-reach "${opts.ifaceCanReach}": not an IP address`);
    }
  }

  const links = await view.links();
  const byName = (name: string): LinkInfo | undefined => links.find((l) => l.name === name);
  const byAddr = (ip: IPAddr): LinkInfo | undefined => links.find((l) => linkHasAddr(l, ip));

  if (ifaceEntries.length > 0 || regexes.length > 0 || canReach !== null) {
    // Each tried value is recorded; unmatched ones are grouped per flag for a short message.
    const attempts: string[] = [];
    const unmatched = new Map<string, string[]>();
    let onlyUnmatched = true;
    const noMatch = (flag: string, value: string, reason: string): void => {
      attempts.push(`${flag} ${value}: ${reason}`);
      unmatched.set(flag, [...(unmatched.get(flag) ?? []), value]);
    };
    const unusable = (flag: string, value: string, reason: string): void => {
      attempts.push(`${flag} ${value}: ${reason}`);
      onlyUnmatched = false;
    };

    for (const entry of ifaceEntries) {
      const link = 'ip' in entry ? byAddr(entry.ip) : byName(entry.name);
      if (!link) {
        noMatch('--iface', entry.text, 'ip' in entry ? 'no interface has this address' : 'no such interface');
        continue;
      }
      const r = complete('ip' in entry ? { link, matched: entry.ip, explicit: true } : { link, explicit: true }, s);
      if (r.ok) return r.value;
      unusable('--iface', entry.text, r.reason);
    }
    for (const { text, re } of regexes) {
      const cand = matchRegex(re, links, s);
      if (!cand) {
        noMatch('--iface-regex', text, 'matches no interface address or name');
        continue;
      }
      const r = complete(cand, s);
      if (r.ok) return r.value;
      unusable('--iface-regex', text, r.reason);
    }
    if (canReach !== null) {
      const dev = await view.routeGetLink(canReach);
      const link = dev !== null ? byName(dev) : undefined;
      if (dev === null) {
        noMatch('--iface-can-reach', canReach.toString(), 'no route');
      } else if (!link) {
        unusable('--iface-can-reach', canReach.toString(), `route uses ${dev}, which is not listed`);
      } else {
        const r = complete({ link, towards: canReach }, s);
        if (r.ok) return r.value;
        unusable('--iface-can-reach', canReach.toString(), r.reason);
      }
    }
    const message = onlyUnmatched
      ? `no interface matches ${[...unmatched].map(([flag, values]) => `${flag} ${values.join(', ')}`).join('; ')}`
      : `no usable interface: ${attempts.join('; ')}`;
    throw new InterfaceSelectionError(message, attempts);
  }

  // No interface option: the interface that owns the public address, else the default route's.
  for (const [pub, flag] of [
    [s.publicIP, '--public-ip'],
    [s.publicIPv6, '--public-ipv6'],
  ] as const) {
    if (pub === null) continue;
    const link = byAddr(pub);
    if (!link) continue;
    const r = complete({ link, matched: pub }, s);
    if (r.ok) return r.value;
    const attempt = `${flag} ${pub.toString()}: ${r.reason}`;
    throw new InterfaceSelectionError(`no usable interface: ${attempt}`, [attempt]);
  }
  const family: Family = s.enableIPv4 ? 4 : 6;
  const dev = await view.defaultRouteLink(family);
  if (dev === null) {
    throw new InterfaceSelectionError(
      `no default route (IPv${family}); pass --iface, --iface-regex or --iface-can-reach`,
      [`default route (IPv${family}): none`],
    );
  }
  const link = byName(dev);
  if (!link) {
    const attempt = `default route (IPv${family}): uses ${dev}, which is not listed`;
    throw new InterfaceSelectionError(`no usable interface: ${attempt}`, [attempt]);
  }
  const r = complete({ link }, s);
  if (r.ok) return r.value;
  const attempt = `default route (IPv${family}) via ${dev}: ${r.reason}`;
  throw new InterfaceSelectionError(`no usable interface: ${attempt}`, [attempt]);
}
