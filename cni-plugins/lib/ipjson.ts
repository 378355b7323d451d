// Typed views of `ip -j` output: links with their addresses and link-kind details, and routes,
// read leniently (a field of the wrong type is left at its default, an entry without its key
// fields is skipped).

export interface IpAddrInfo {
  readonly family: 'inet' | 'inet6';
  readonly local: string;
  readonly prefixlen: number;
  readonly scope: string;
  readonly tentative: boolean;
  readonly dadfailed: boolean;
}

export interface IpLink {
  readonly ifindex: number;
  readonly ifname: string;
  readonly flags: readonly string[];
  readonly mtu: number;
  readonly operstate: string;
  readonly address: string;
  readonly master: string | null;
  /** The veth peer's ifindex (in the peer's netns). */
  readonly linkIndex: number | null;
  readonly kind: string | null;
  readonly infoData: Readonly<Record<string, unknown>>;
  readonly slaveData: Readonly<Record<string, unknown>>;
  readonly addrs: readonly IpAddrInfo[];
}

export interface IpRoute {
  readonly dst: string;
  readonly gateway: string | null;
  readonly dev: string | null;
  readonly table: string;
  readonly family: 4 | 6;
  readonly scope: string | null;
  readonly protocol: string | null;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' ? v : null;
}

function parseAddrInfo(v: unknown): IpAddrInfo | null {
  if (!isRecord(v)) return null;
  const family = v.family;
  const local = str(v.local);
  const prefixlen = num(v.prefixlen);
  if ((family !== 'inet' && family !== 'inet6') || local === null || prefixlen === null) return null;
  return { family, local, prefixlen, scope: str(v.scope) ?? '', tentative: v.tentative === true, dadfailed: v.dadfailed === true };
}

export function parseLink(v: unknown): IpLink | null {
  if (!isRecord(v)) return null;
  const ifindex = num(v.ifindex);
  const ifname = str(v.ifname);
  if (ifindex === null || ifname === null) return null;
  const info = isRecord(v.linkinfo) ? v.linkinfo : {};
  const addrs = Array.isArray(v.addr_info) ? v.addr_info.map(parseAddrInfo).filter((a): a is IpAddrInfo => a !== null) : [];
  return {
    ifindex,
    ifname,
    flags: Array.isArray(v.flags) ? v.flags.filter((f): f is string => typeof f === 'string') : [],
    mtu: num(v.mtu) ?? 0,
    operstate: str(v.operstate) ?? 'UNKNOWN',
    address: str(v.address) ?? '',
    master: str(v.master),
    linkIndex: num(v.link_index),
    kind: str(info.info_kind),
    infoData: isRecord(info.info_data) ? info.info_data : {},
    slaveData: isRecord(info.info_slave_data) ? info.info_slave_data : {},
    addrs,
  };
}

/** All links found in a batch's documents (each `link show` / `addr show` prints an array). */
export function linksOf(docs: readonly unknown[]): IpLink[] {
  const out: IpLink[] = [];
  for (const d of docs) {
    if (!Array.isArray(d)) continue;
    for (const item of d) {
      const l = parseLink(item);
      if (l) out.push(l);
    }
  }
  return out;
}

export function parseRoute(v: unknown): IpRoute | null {
  if (!isRecord(v)) return null;
  const dst = str(v.dst);
  if (dst === null) return null;
  const gateway = str(v.gateway);
  // `ip -j route` carries no family; IPv6 routes always have a preference attribute.
  const family: 4 | 6 = dst.includes(':') || (gateway !== null && gateway.includes(':')) || 'pref' in v ? 6 : 4;
  return {
    dst,
    gateway,
    dev: str(v.dev),
    table: str(v.table) ?? (typeof v.table === 'number' ? String(v.table) : 'main'),
    family,
    scope: str(v.scope),
    protocol: str(v.protocol),
  };
}

/** Routes from a `route show` document, recognised by having `dst` and no `ifindex`. */
export function routesOf(doc: unknown): IpRoute[] {
  if (!Array.isArray(doc)) return [];
  return doc.map(parseRoute).filter((r): r is IpRoute => r !== null);
}

export function hasFlag(link: IpLink, flag: string): boolean {
  return link.flags.includes(flag);
}
