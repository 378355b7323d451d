// Batch lines with their failure context (BatchLine; the line itself is an IpLine, made by
// src/render/ipbatch.ts) and the line builders the main plugins share: addresses (with the
// broadcast the netlink library would compute), and ipam.ConfigureIface in the pod — IPv6
// sysctls, addresses, link up, routes — in the reference's words for each line's error.
// Pure: data in, lines out (every line made by src/render/ipbatch.ts from its words).
import { ipLine, ipLineOf, named, type IpLine, type IpWord } from '../../src/render/ipbatch.js';
import { IPNet, type Family } from '../../src/util/ip.js';
import type { CniIPConfig, CniRoute } from '../skel/types.js';

/** One line of an `ip -batch` and what a failure there means. */
export interface BatchLine {
  readonly line: IpLine;
  /** Context for an error on this line, in the reference's words. */
  readonly what: string;
}

/** Canonical text of a route destination, or the input when it does not parse. */
export function canonicalDst(dst: string): string {
  const n = IPNet.tryParse(dst);
  return n ? n.toString() : dst;
}

/** `brd +` for IPv4 prefixes that have a broadcast address (the netlink library computes it). */
function brd(cidr: string): string[] {
  const { ip, net } = IPNet.parseWithHost(cidr);
  return ip.family === 4 && net.prefix < 31 ? ['brd', '+'] : [];
}

function addrLine(verb: 'add' | 'replace', cidr: string, dev: string): IpLine {
  return ipLine('address', verb, named('address', cidr), ...brd(cidr), 'dev', named('device', dev));
}

export function addrAddLine(cidr: string, dev: string): IpLine {
  return addrLine('add', cidr, dev);
}

/** Add-or-keep: concurrent ADDs on one bridge may race to add the same gateway address. */
export function addrReplaceLine(cidr: string, dev: string): IpLine {
  return addrLine('replace', cidr, dev);
}

/** `link set dev <dev> <settings…>`, e.g. linkSetLine(vf, 'name', named('CNI_IFNAME', ifname)). */
export function linkSetLine(dev: string, ...settings: readonly IpWord[]): IpLine {
  return ipLine('link', 'set', 'dev', named('device', dev), ...settings);
}

/** `link set dev <dev> up`. */
export function linkUpLine(dev: string): IpLine {
  return linkSetLine(dev, 'up');
}

/** `link show dev <dev>`. */
export function linkShowLine(dev: string): IpLine {
  return ipLine('link', 'show', 'dev', named('device', dev));
}

/** `address show dev <dev>`. */
export function addrShowLine(dev: string): IpLine {
  return ipLine('address', 'show', 'dev', named('device', dev));
}

/** `link del dev <dev>`. */
export function linkDelLine(dev: string): IpLine {
  return ipLine('link', 'del', 'dev', named('device', dev));
}

/** ipam.ConfigureIface before adding IPv6 addresses: IPv6 on for lo and the interface; keep addresses on down. */
export function podIPv6Sysctls(ifname: string): Array<[string, string]> {
  return [
    ['net/ipv6/conf/lo/disable_ipv6', '0'],
    [`net/ipv6/conf/${ifname}/disable_ipv6`, '0'],
    [`net/ipv6/conf/${ifname}/keep_addr_on_down`, '1'],
  ];
}

function familyOfText(text: string): Family {
  return text.includes(':') ? 6 : 4;
}

/**
 * ipam.ConfigureIface as `ip` lines: the addresses, the link up, then the routes (a route without
 * gw uses the family's first gateway; without any gateway it is a universe-scoped device route, as
 * the netlink library adds it). A later IPv4 route to a destination already added is skipped
 * (the reference ignores EEXIST: first one wins); exact IPv6 duplicates likewise.
 */
export function podAddressLines(ifname: string, ips: readonly CniIPConfig[], up: boolean): BatchLine[] {
  const lines: BatchLine[] = [];
  for (const ipc of ips) {
    lines.push({ line: addrAddLine(ipc.address, ifname), what: `failed to add IP addr ${ipc.address} to "${ifname}"` });
  }
  if (up) lines.push({ line: linkUpLine(ifname), what: `failed to set "${ifname}" UP` });
  return lines;
}

export function podRouteLines(ifname: string, ips: readonly CniIPConfig[], routes: readonly CniRoute[]): BatchLine[] {
  const gw: Partial<Record<Family, string>> = {};
  for (const ipc of ips) {
    if (ipc.gateway === undefined) continue;
    const f = familyOfText(ipc.gateway);
    gw[f] ??= ipc.gateway;
  }
  const seen = new Set<string>();
  const lines: BatchLine[] = [];
  for (const r of routes) {
    const dst = canonicalDst(r.dst);
    const family = familyOfText(dst);
    const via = r.gw ?? gw[family];
    const key = family === 4 ? `${dst}|${r.table ?? ''}|${r.priority ?? ''}` : `${dst}|${via ?? ''}|${r.table ?? ''}|${r.priority ?? ''}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const words: IpWord[] = ['route', 'add', named('route destination', dst)];
    if (via !== undefined) words.push('via', named('gateway', via));
    words.push('dev', named('device', ifname));
    if (r.priority !== undefined) words.push('metric', r.priority);
    if (r.table !== undefined) words.push('table', r.table);
    if (r.scope !== undefined) words.push('scope', r.scope);
    else if (via === undefined) words.push('scope', 'global');
    if (r.mtu !== undefined) words.push('mtu', r.mtu);
    if (r.advmss !== undefined) words.push('advmss', r.advmss);
    lines.push({ line: ipLineOf(words), what: `failed to add route '${dst} via ${via ?? '<nil>'} dev ${ifname}'` });
  }
  return lines;
}
