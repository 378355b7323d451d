// IPv4/IPv6 addresses and prefixes as value types over bigint, so v4 and v6 share one code path
// for subnet arithmetic. Text forms follow Go's net package (flannel's formats): dotted quad,
// RFC 5952 compressed lower-case IPv6.

export type Family = 4 | 6;

const BITS: Record<Family, number> = { 4: 32, 6: 128 };

export class InvalidAddressError extends Error {
  constructor(readonly input: string, readonly reason: string) {
    super(`invalid IP address "${input}": ${reason}`);
    this.name = 'InvalidAddressError';
  }
}

export class InvalidPrefixError extends Error {
  constructor(readonly input: string, readonly reason: string) {
    super(`invalid CIDR "${input}": ${reason}`);
    this.name = 'InvalidPrefixError';
  }
}

export class IPAddr {
  private constructor(readonly family: Family, readonly value: bigint) {}

  static of(family: Family, value: bigint): IPAddr {
    if (value < 0n || value >= 1n << BigInt(BITS[family])) {
      throw new RangeError(`value out of range for IPv${family}`);
    }
    return new IPAddr(family, value);
  }

  static parse(text: string): IPAddr {
    if (typeof text !== 'string') throw new InvalidAddressError(String(text), 'not a string');
    if (text.includes(':')) return new IPAddr(6, parseV6(text));
    return new IPAddr(4, parseV4(text, text));
  }

  /** Parses and requires the given family. */
  static parseFamily(text: string, family: Family): IPAddr {
    const ip = IPAddr.parse(text);
    if (ip.family !== family) throw new InvalidAddressError(text, `not an IPv${family} address`);
    return ip;
  }

  static tryParse(text: string): IPAddr | null {
    try {
      return IPAddr.parse(text);
    } catch {
      return null;
    }
  }

  get bits(): number {
    return BITS[this.family];
  }

  add(n: bigint): IPAddr {
    return IPAddr.of(this.family, this.value + n);
  }

  equals(other: IPAddr): boolean {
    return this.family === other.family && this.value === other.value;
  }

  isUnspecified(): boolean {
    return this.value === 0n;
  }

  toString(): string {
    return this.family === 4 ? formatV4(this.value) : formatV6(this.value);
  }

  toJSON(): string {
    return this.toString();
  }
}

export class IPNet {
  private constructor(readonly ip: IPAddr, readonly prefix: number) {}

  /** Builds a prefix from an address; host bits are cleared. */
  static of(ip: IPAddr, prefix: number): IPNet {
    if (!Number.isInteger(prefix) || prefix < 0 || prefix > ip.bits) {
      throw new RangeError(`prefix length ${prefix} out of range for IPv${ip.family}`);
    }
    return new IPNet(IPAddr.of(ip.family, ip.value & maskOf(ip.bits, prefix)), prefix);
  }

  /**
   * Parses "a.b.c.d/n" or "x::/n". Like Go's net.ParseCIDR the result is the network
   * (host bits cleared); `hostBitsSet` tells the caller whether that changed anything.
   */
  static parseWithHost(text: string): { net: IPNet; ip: IPAddr; hostBitsSet: boolean } {
    if (typeof text !== 'string') throw new InvalidPrefixError(String(text), 'not a string');
    const slash = text.indexOf('/');
    if (slash < 0) throw new InvalidPrefixError(text, 'missing "/prefix-length"');
    const addrText = text.slice(0, slash);
    const lenText = text.slice(slash + 1);
    let ip: IPAddr;
    try {
      ip = IPAddr.parse(addrText);
    } catch (e) {
      throw new InvalidPrefixError(text, (e as InvalidAddressError).reason ?? String(e));
    }
    if (!/^\d{1,3}$/.test(lenText) || Number(lenText) > ip.bits) {
      throw new InvalidPrefixError(text, `prefix length must be 0..${ip.bits}`);
    }
    const net = IPNet.of(ip, Number(lenText));
    return { net, ip, hostBitsSet: net.ip.value !== ip.value };
  }

  static parse(text: string): IPNet {
    return IPNet.parseWithHost(text).net;
  }

  static tryParse(text: string): IPNet | null {
    try {
      return IPNet.parse(text);
    } catch {
      return null;
    }
  }

  get family(): Family {
    return this.ip.family;
  }

  get bits(): number {
    return this.ip.bits;
  }

  /** Number of addresses in the prefix. */
  get size(): bigint {
    return 1n << BigInt(this.bits - this.prefix);
  }

  get first(): bigint {
    return this.ip.value;
  }

  get last(): bigint {
    return this.ip.value + this.size - 1n;
  }

  contains(ip: IPAddr): boolean {
    return ip.family === this.family && ip.value >= this.first && ip.value <= this.last;
  }

  /** True when `other` lies entirely inside this prefix. */
  containsNet(other: IPNet): boolean {
    return other.family === this.family && other.prefix >= this.prefix && this.contains(other.ip);
  }

  overlaps(other: IPNet): boolean {
    return other.family === this.family && this.first <= other.last && other.first <= this.last;
  }

  equals(other: IPNet): boolean {
    return this.prefix === other.prefix && this.ip.equals(other.ip);
  }

  /** The n-th address of the prefix (n = 1 is the gateway address flannel writes to subnet.env). */
  nth(n: bigint): IPAddr {
    return this.ip.add(n);
  }

  toString(): string {
    return `${this.ip.toString()}/${this.prefix}`;
  }

  toJSON(): string {
    return this.toString();
  }
}

function maskOf(bits: number, prefix: number): bigint {
  const all = (1n << BigInt(bits)) - 1n;
  return all ^ ((1n << BigInt(bits - prefix)) - 1n);
}

function parseV4(text: string, whole: string): bigint {
  const parts = text.split('.');
  if (parts.length !== 4) throw new InvalidAddressError(whole, 'expected four dotted decimal octets');
  let v = 0n;
  for (const p of parts) {
    // Go rejects leading zeros ("010") since 1.17; so do we.
    if (!/^(0|[1-9]\d{0,2})$/.test(p) || Number(p) > 255) {
      throw new InvalidAddressError(whole, `bad octet "${p}"`);
    }
    v = (v << 8n) | BigInt(p);
  }
  return v;
}

function parseV6(text: string): bigint {
  if (text.includes('%')) throw new InvalidAddressError(text, 'zones are not supported');
  let head = text;
  let tailV4: bigint | null = null;
  const lastColon = text.lastIndexOf(':');
  if (text.slice(lastColon + 1).includes('.')) {
    tailV4 = parseV4(text.slice(lastColon + 1), text);
    // The dotted tail stands for the last two groups; parse it as two placeholder groups.
    head = text.slice(0, lastColon + 1) + '0:0';
  }
  const dbl = head.split('::');
  if (dbl.length > 2) throw new InvalidAddressError(text, 'more than one "::"');
  const parseGroups = (s: string): bigint[] => {
    if (s === '') return [];
    return s.split(':').map((g) => {
      if (!/^[0-9a-fA-F]{1,4}$/.test(g)) throw new InvalidAddressError(text, `bad group "${g}"`);
      return BigInt(parseInt(g, 16));
    });
  };
  const left = parseGroups(dbl[0]!);
  const right = dbl.length === 2 ? parseGroups(dbl[1]!) : [];
  let groups: bigint[];
  if (dbl.length === 2) {
    const missing = 8 - left.length - right.length;
    if (missing < 1) throw new InvalidAddressError(text, '"::" must stand for at least one group');
    groups = [...left, ...Array<bigint>(missing).fill(0n), ...right];
  } else {
    groups = left;
  }
  if (groups.length !== 8) throw new InvalidAddressError(text, 'expected eight 16-bit groups');
  let v = 0n;
  for (const g of groups) v = (v << 16n) | g;
  if (tailV4 !== null) v = (v & ~0xffffffffn) | tailV4;
  return v;
}

function formatV4(v: bigint): string {
  // Plain number arithmetic: every diff keys entries by this text, tens of thousands of times a pass.
  const n = Number(v);
  return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}

function formatV6(v: bigint): string {
  const groups: number[] = [];
  for (let i = 7; i >= 0; i--) groups.push(Number((v >> BigInt(i * 16)) & 0xffffn));
  // RFC 5952: the longest run (length >= 2) of zero groups becomes "::", the first one on a tie.
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (gs: number[]) => gs.map((g) => g.toString(16)).join(':');
  if (bestStart < 0) return hex(groups);
  return `${hex(groups.slice(0, bestStart))}::${hex(groups.slice(bestStart + bestLen))}`;
}

/** The multicast range of each family: masquerade rules never touch traffic to it. */
export const MULTICAST: Readonly<Record<Family, string>> = { 4: '224.0.0.0/4', 6: 'ff00::/8' };

const SPECIAL_RANGES: ReadonlyArray<readonly [string, string]> = [
  ['127.0.0.0/8', 'a loopback address'],
  ['169.254.0.0/16', 'a link-local address'],
  ['224.0.0.0/4', 'a multicast address'],
  ['255.255.255.255/32', 'the broadcast address'],
  ['::1/128', 'a loopback address'],
  ['fe80::/10', 'a link-local address'],
  ['ff00::/8', 'a multicast address'],
  ['::ffff:0:0/96', 'an IPv4-mapped address'],
];
let specialNets: Array<readonly [IPNet, string]> | null = null;

/**
 * Why `ip` cannot be a node's address that peers send tunnel or routed traffic to (unspecified,
 * loopback, link-local, multicast, broadcast, IPv4-mapped), or null for a unicast address.
 */
export function unicastProblem(ip: IPAddr): string | null {
  if (ip.isUnspecified()) return 'the unspecified address';
  specialNets ??= SPECIAL_RANGES.map(([net, what]) => [IPNet.parse(net), what] as const);
  for (const [net, what] of specialNets) if (net.contains(ip)) return what;
  return null;
}
