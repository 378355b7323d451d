// Byte-compatible codecs for flannel's etcd keys (`10.5.52.0-24&fd00:5::-64`) and lease values
// (`{"PublicIP":…,"PublicIPv6":…,"BackendType":…,"BackendData":…,"BackendV6Data":…}`).
import { errorMessage } from '../util/errors.js';
import { IPAddr, IPNet } from '../util/ip.js';
import type { JsonValue, LeaseAttrs } from './lease.js';

export class LeaseKeyError extends Error {
  constructor(readonly key: string, reason: string) {
    super(`lease key "${key}": ${reason}`);
    this.name = 'LeaseKeyError';
  }
}

export class LeaseValueError extends Error {
  constructor(readonly value: string, readonly reason: string) {
    super(`lease value ${truncate(value)}: ${reason}`);
    this.name = 'LeaseValueError';
  }
}

export interface SubnetKey {
  readonly subnet: IPNet;
  readonly ipv6Subnet: IPNet | null;
}

export function makeSubnetKey(subnet: IPNet, ipv6Subnet: IPNet | null): string {
  const v4 = `${subnet.ip.toString()}-${subnet.prefix}`;
  return ipv6Subnet ? `${v4}&${ipv6Subnet.ip.toString()}-${ipv6Subnet.prefix}` : v4;
}

// flannel's pattern, anchored at both ends (flannel's is not anchored at the start and has unescaped dots).
const KEY_RE = /^(\d+\.\d+\.\d+\.\d+)-(\d+)(?:&([a-f\d:]+)-(\d+))?$/;

/** Parses the last path element of `<prefix>/subnets/<key>`; the address must be the network address. */
export function parseSubnetKey(key: string): SubnetKey {
  const m = KEY_RE.exec(key);
  if (!m) throw new LeaseKeyError(key, 'does not match <IPv4>-<len>[&<IPv6>-<len>]');
  const subnet = parseKeyNet(key, m[1]!, m[2]!, 4);
  const ipv6Subnet = m[3] !== undefined ? parseKeyNet(key, m[3], m[4]!, 6) : null;
  return { subnet, ipv6Subnet };
}

function parseKeyNet(key: string, addr: string, len: string, family: 4 | 6): IPNet {
  let ip: IPAddr;
  try {
    ip = IPAddr.parseFamily(addr, family);
  } catch (e) {
    throw new LeaseKeyError(key, errorMessage(e));
  }
  const prefix = Number(len);
  if (prefix > ip.bits) throw new LeaseKeyError(key, `prefix length ${len} out of range`);
  const net = IPNet.of(ip, prefix);
  if (!net.ip.equals(ip)) throw new LeaseKeyError(key, `${addr} is not the network address of /${len}`);
  return net;
}

/** Encodes lease attributes exactly as Go's json.Marshal(lease.LeaseAttrs) does. */
export function encodeLeaseAttrs(attrs: LeaseAttrs): string {
  if (attrs.publicIP.family !== 4) throw new TypeError('PublicIP must be IPv4');
  if (attrs.publicIPv6 && attrs.publicIPv6.family !== 6) throw new TypeError('PublicIPv6 must be IPv6');
  let out = `{"PublicIP":${goJson(attrs.publicIP.toString())}`;
  out += `,"PublicIPv6":${attrs.publicIPv6 ? goJson(attrs.publicIPv6.toString()) : 'null'}`;
  if (attrs.backendType) out += `,"BackendType":${goJson(attrs.backendType)}`;
  // json.RawMessage with omitempty is omitted only when it has no bytes; a JSON null is written.
  if (attrs.backendData !== undefined) out += `,"BackendData":${goJson(attrs.backendData)}`;
  if (attrs.backendV6Data !== undefined) out += `,"BackendV6Data":${goJson(attrs.backendV6Data)}`;
  return out + '}';
}

/**
 * Decodes a lease value with flannel's rules: keys match case-insensitively, PublicIP must be
 * an IPv4 string (flannel's ip.IP4 rejects anything else), PublicIPv6 null or an IPv6 string.
 */
export function decodeLeaseAttrs(text: string): LeaseAttrs {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new LeaseValueError(text, `not valid JSON (${errorMessage(e)})`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new LeaseValueError(text, 'not a JSON object');
  }
  const fields = new Map<string, JsonValue>();
  for (const [k, v] of Object.entries(parsed as Record<string, JsonValue>)) fields.set(k.toLowerCase(), v);

  const publicIPRaw = fields.get('publicip');
  if (typeof publicIPRaw !== 'string') throw new LeaseValueError(text, 'PublicIP must be an IPv4 address string');
  const publicIP = IPAddr.tryParse(publicIPRaw);
  if (!publicIP || publicIP.family !== 4) throw new LeaseValueError(text, `PublicIP "${publicIPRaw}" is not an IPv4 address`);

  const v6Raw = fields.get('publicipv6');
  let publicIPv6: IPAddr | null = null;
  if (v6Raw !== undefined && v6Raw !== null) {
    if (typeof v6Raw !== 'string') throw new LeaseValueError(text, 'PublicIPv6 must be null or an IPv6 address string');
    publicIPv6 = IPAddr.tryParse(v6Raw);
    if (!publicIPv6 || publicIPv6.family !== 6) throw new LeaseValueError(text, `PublicIPv6 "${v6Raw}" is not an IPv6 address`);
  }

  const typeRaw = fields.get('backendtype');
  if (typeRaw !== undefined && typeRaw !== null && typeof typeRaw !== 'string') {
    throw new LeaseValueError(text, 'BackendType must be a string');
  }
  const attrs: { -readonly [K in keyof LeaseAttrs]: LeaseAttrs[K] } = { publicIP, publicIPv6 };
  if (typeRaw) attrs.backendType = typeRaw;
  if (fields.has('backenddata')) attrs.backendData = fields.get('backenddata')!;
  if (fields.has('backendv6data')) attrs.backendV6Data = fields.get('backendv6data')!;
  return attrs;
}

/** JSON text as Go's encoder writes it: compact, with <, >, & and U+2028/9 escaped. */
export function goJson(value: JsonValue): string {
  return JSON.stringify(value).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

function truncate(s: string): string {
  return JSON.stringify(s.length > 120 ? `${s.slice(0, 117)}...` : s);
}
