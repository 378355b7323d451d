// ipBlock CIDRs as the API server accepts them, and an ipBlock as disjoint address intervals with
// its `except` prefixes carved out (what an nftables interval set or an OVS range match holds).
import { type Family, IPAddr, IPNet } from '../util/ip.js';

/** Inclusive address interval of one family. */
export interface IPInterval {
  readonly family: Family;
  readonly first: bigint;
  readonly last: bigint;
}

export class CIDRError extends Error {
  constructor(readonly input: string, readonly reason: string) {
    super(`invalid CIDR ${JSON.stringify(input.length > 80 ? input.slice(0, 80) + '…' : input)}: ${reason}`);
    this.name = 'CIDRError';
  }
}

/**
 * Parses an ipBlock `cidr`/`except` value the way the API server's legacy-field validation
 * (IsValidCIDRForLegacyField, netutils.ParseCIDRSloppy) does when StrictIPCIDRValidation is off,
 * and the way every Go implementation then reads it (net.ParseCIDR yields the network):
 *  - host bits set ("10.0.0.5/8") are accepted and cleared (the server warns, strict mode rejects);
 *  - IPv4 octets with leading zeros ("010.0.0.0/8") are read as decimal, as ParseIPSloppy does;
 *  - an IPv4-mapped IPv6 prefix ("::ffff:10.0.0.0/104") is the IPv4 prefix it maps, as Go's
 *    IPNet.Contains treats it (strict mode rejects it).
 * Each such leniency is reported in `warnings` so the daemon can log it once.
 */
export function parsePolicyCIDR(text: string): { net: IPNet; warnings: string[] } {
  if (typeof text !== 'string' || text.length === 0) throw new CIDRError(String(text), 'must not be empty');
  if (text.length > 64) throw new CIDRError(text, 'too long to be a CIDR');
  const warnings: string[] = [];
  let t = text;
  const slash = t.indexOf('/');
  if (slash >= 0 && !t.slice(0, slash).includes(':')) {
    const addr = t.slice(0, slash);
    const parts = addr.split('.');
    if (parts.length === 4 && parts.every((p) => /^\d{1,3}$/.test(p)) && parts.some((p) => p.length > 1 && p.startsWith('0'))) {
      t = `${parts.map((p) => String(Number(p))).join('.')}${t.slice(slash)}`;
      warnings.push(`${JSON.stringify(text)} has leading zeros in an IPv4 octet; read as decimal ${t}`);
    }
  }
  let parsed: { net: IPNet; hostBitsSet: boolean };
  try {
    parsed = IPNet.parseWithHost(t);
  } catch (e) {
    throw new CIDRError(text, e instanceof Error && 'reason' in e && typeof e.reason === 'string' ? e.reason : 'not a CIDR');
  }
  let net = parsed.net;
  if (parsed.hostBitsSet) warnings.push(`${JSON.stringify(text)} has host bits set; using the network ${net}`);
  const mapped = IPNet.parse('::ffff:0:0/96');
  if (net.family === 6 && net.prefix >= 96 && mapped.containsNet(net)) {
    net = IPNet.of(IPAddr.of(4, net.ip.value & 0xffffffffn), net.prefix - 96);
    warnings.push(`${JSON.stringify(text)} is an IPv4-mapped IPv6 prefix; using ${net}`);
  }
  return { net, warnings };
}

/** `except` is valid only as a strict subset of `cidr` (ValidateIPBlock). */
export function exceptProblem(cidr: IPNet, except: IPNet): string | null {
  if (except.family !== cidr.family) return `must be a strict subset of \`cidr\` (${cidr}), but is IPv${except.family}`;
  if (!cidr.containsNet(except) || except.prefix <= cidr.prefix) return `must be a strict subset of \`cidr\` (${cidr})`;
  return null;
}

export function netInterval(net: IPNet): IPInterval {
  return { family: net.family, first: net.first, last: net.last };
}

/** `cidr` minus every `except`, as sorted disjoint intervals. */
export function carve(cidr: IPNet, excepts: readonly IPNet[]): IPInterval[] {
  let out: IPInterval[] = [netInterval(cidr)];
  for (const e of excepts) {
    if (e.family !== cidr.family) continue;
    const next: IPInterval[] = [];
    for (const iv of out) {
      if (e.last < iv.first || e.first > iv.last) {
        next.push(iv);
        continue;
      }
      if (e.first > iv.first) next.push({ family: iv.family, first: iv.first, last: e.first - 1n });
      if (e.last < iv.last) next.push({ family: iv.family, first: e.last + 1n, last: iv.last });
    }
    out = next;
  }
  return out;
}

/** The union of intervals: sorted by family then address, overlapping and adjacent ones merged. */
export function mergeIntervals(list: readonly IPInterval[]): IPInterval[] {
  const sorted = [...list].sort((a, b) => a.family - b.family || (a.first < b.first ? -1 : a.first > b.first ? 1 : 0));
  const out: IPInterval[] = [];
  for (const iv of sorted) {
    const last = out[out.length - 1];
    if (last && last.family === iv.family && iv.first <= last.last + 1n) {
      if (iv.last > last.last) out[out.length - 1] = { family: last.family, first: last.first, last: iv.last };
    } else {
      out.push(iv);
    }
  }
  return out;
}

export function intervalsContain(list: readonly IPInterval[], ip: IPAddr): boolean {
  for (const iv of list) if (iv.family === ip.family && ip.value >= iv.first && ip.value <= iv.last) return true;
  return false;
}

/** "a.b.c.d-e.f.g.h" (nftables interval syntax); a single address prints alone. */
export function intervalText(iv: IPInterval): string {
  const a = IPAddr.of(iv.family, iv.first).toString();
  return iv.first === iv.last ? a : `${a}-${IPAddr.of(iv.family, iv.last).toString()}`;
}
