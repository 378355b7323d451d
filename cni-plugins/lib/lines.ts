// The `ip -batch` line type and the line builders the main plugins share: addresses (with the
// broadcast the netlink library would compute), and ipam.ConfigureIface in the pod — IPv6
// sysctls, addresses, link up, routes — in the reference's words for each line's error.
// Pure: data in, text out.
import { IPNet, type Family } from '../../src/util/ip.js';
import type { CniIPConfig, CniRoute } from '../skel/types.js';

/** One line of an `ip -batch` and what a failure there means. */
export interface BatchLine {
  readonly line: string;
  /** Context for an error on this line, in the reference's words. */
  readonly what: string;
}

/** Canonical text of a route destination, or the input when it does not parse. */
export function canonicalDst(dst: string): string {
  const n = IPNet.tryParse(dst);
  return n ? n.toString() : dst;
}

/** `brd +` for IPv4 prefixes that have a broadcast address (the netlink library computes it). */
function brd(cidr: string): string {
  const { ip, net } = IPNet.parseWithHost(cidr);
  return ip.family === 4 && net.prefix < 31 ? ' brd +' : '';
}

export function addrAddLine(cidr: string, dev: string): string {
  return `address add ${cidr}${brd(cidr)} dev ${dev}`;
}

/** Add-or-keep: concurrent ADDs on one bridge may race to add the same gateway address. */
export function addrReplaceLine(cidr: string, dev: string): string {
  return `address replace ${cidr}${brd(cidr)} dev ${dev}`;
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
  if (up) lines.push({ line: `link set dev ${ifname} up`, what: `failed to set "${ifname}" UP` });
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
    let line = `route add ${dst}`;
    if (via !== undefined) line += ` via ${via}`;
    line += ` dev ${ifname}`;
    if (r.priority !== undefined) line += ` metric ${r.priority}`;
    if (r.table !== undefined) line += ` table ${r.table}`;
    if (r.scope !== undefined) line += ` scope ${r.scope}`;
    else if (via === undefined) line += ' scope global';
    if (r.mtu !== undefined) line += ` mtu ${r.mtu}`;
    if (r.advmss !== undefined) line += ` advmss ${r.advmss}`;
    lines.push({ line, what: `failed to add route '${dst} via ${via ?? '<nil>'} dev ${ifname}'` });
  }
  return lines;
}
