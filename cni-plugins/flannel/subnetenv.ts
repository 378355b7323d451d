// Reading subnet.env the way flannel's CNI plugin does (flannel.go loadFlannelSubnetEnv): one
// KEY=VALUE per line, unknown lines ignored, a later line wins over an earlier one. weftd writes
// the file (src/daemon/subnetenv.ts); this side only reads it. weftd's own WEFT_* lines (after
// flannel's; e.g. WEFT_BACKEND=ovs with the bridge the weft-ovs plugin attaches pods to) are
// kept as given: the delegate that uses them validates them.
import { readFileSync } from 'node:fs';

import { IPNet, type Family } from '../../src/util/ip.js';

export interface FlannelSubnetEnv {
  /** FLANNEL_NETWORK: comma list, deduplicated, in file order (networks, host bits cleared). */
  readonly networks: readonly IPNet[];
  /** FLANNEL_SUBNET as a network: `10.1.17.1/24` → 10.1.17.0/24. */
  readonly subnet: IPNet | null;
  readonly ipv6Networks: readonly IPNet[];
  readonly ipv6Subnet: IPNet | null;
  readonly mtu: number;
  /** True only for the exact text `true`, as flannel compares it. */
  readonly ipMasq: boolean;
  /** weftd's backend keys; all null in a file written by flanneld. */
  readonly weft: WeftSubnetEnv;
}

/** The WEFT_* keys weftd appends (src/backend/ovs/ovs.ts prepare()); null when absent or empty. */
export interface WeftSubnetEnv {
  /** WEFT_BACKEND: the backend type, e.g. "ovs". */
  readonly backend: string | null;
  /** WEFT_OVS_BRIDGE: the integration bridge, e.g. "br-int". */
  readonly ovsBridge: string | null;
  /** WEFT_OVS_RUNDIR: the OVS run directory (db.sock, <bridge>.mgmt). */
  readonly ovsRunDir: string | null;
  /** WEFT_OVS_DATAPATH: "system" or "netdev". */
  readonly ovsDatapath: string | null;
}

/**
 * Why subnet.env could not be used. `missing`: the file does not exist, so weftd/flanneld has not
 * acquired a lease on this node yet (transient). `unreadable`: any other I/O error. `invalid`: the
 * content is wrong; `variables` names the offending keys.
 */
export type SubnetEnvProblem = 'missing' | 'unreadable' | 'invalid';

export class SubnetEnvError extends Error {
  constructor(
    readonly file: string,
    readonly problem: SubnetEnvProblem,
    readonly variables: readonly string[],
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'SubnetEnvError';
  }
}

const MAX_UINT32 = 4294967295;

function parseCidr(file: string, key: string, text: string, family: Family): IPNet {
  const net = IPNet.tryParse(text);
  if (net === null) {
    throw new SubnetEnvError(file, 'invalid', [key], `${file}: ${key} has an invalid CIDR "${text}"`);
  }
  if (net.family !== family) {
    throw new SubnetEnvError(file, 'invalid', [key], `${file}: ${key} must be an IPv${family} CIDR, got "${text}"`);
  }
  return net;
}

function parseCidrList(file: string, key: string, text: string, family: Family): IPNet[] {
  const out: IPNet[] = [];
  for (const entry of text.split(',')) {
    const net = parseCidr(file, key, entry.trim(), family);
    if (!out.some((n) => n.equals(net))) out.push(net);
  }
  return out;
}

/** Parses the file content; `file` is only used in messages. Throws SubnetEnvError('invalid'). */
export function parseFlannelSubnetEnv(text: string, file: string): FlannelSubnetEnv {
  let networks: IPNet[] = [];
  let ipv6Networks: IPNet[] = [];
  let subnet: IPNet | null = null;
  let ipv6Subnet: IPNet | null = null;
  let mtu: number | null = null;
  let ipMasq: boolean | null = null;
  const weft: { -readonly [K in keyof WeftSubnetEnv]: WeftSubnetEnv[K] } = { backend: null, ovsBridge: null, ovsRunDir: null, ovsDatapath: null };

  for (const rawLine of text.split('\n')) {
    const line = rawLine.replace(/\r$/, '');
    const eq = line.indexOf('=');
    if (eq < 0) continue;
    const key = line.slice(0, eq).trim();
    const value = line.slice(eq + 1).trim();
    switch (key) {
      case 'FLANNEL_NETWORK':
        networks = parseCidrList(file, key, value, 4);
        break;
      case 'FLANNEL_SUBNET':
        subnet = parseCidr(file, key, value, 4);
        break;
      case 'FLANNEL_IPV6_NETWORK':
        ipv6Networks = parseCidrList(file, key, value, 6);
        break;
      case 'FLANNEL_IPV6_SUBNET':
        ipv6Subnet = parseCidr(file, key, value, 6);
        break;
      case 'FLANNEL_MTU': {
        // strconv.ParseUint(v, 10, 32): decimal digits only.
        const n = /^\d{1,10}$/.test(value) ? Number(value) : NaN;
        if (!(n <= MAX_UINT32)) {
          throw new SubnetEnvError(file, 'invalid', [key], `${file}: ${key} must be an unsigned integer, got "${value}"`);
        }
        mtu = n;
        break;
      }
      case 'FLANNEL_IPMASQ':
        ipMasq = value === 'true';
        break;
      case 'WEFT_BACKEND':
        weft.backend = value || null;
        break;
      case 'WEFT_OVS_BRIDGE':
        weft.ovsBridge = value || null;
        break;
      case 'WEFT_OVS_RUNDIR':
        weft.ovsRunDir = value || null;
        break;
      case 'WEFT_OVS_DATAPATH':
        weft.ovsDatapath = value || null;
        break;
      default:
        break;
    }
  }

  // Same check and wording as flannel's subnetEnv.missing().
  const missing: string[] = [];
  if (networks.length === 0 && ipv6Networks.length === 0) missing.push('FLANNEL_NETWORK', 'FLANNEL_IPV6_NETWORK');
  if (subnet === null && ipv6Subnet === null) missing.push('FLANNEL_SUBNET', 'FLANNEL_IPV6_SUBNET');
  if (mtu === null) missing.push('FLANNEL_MTU');
  if (ipMasq === null) missing.push('FLANNEL_IPMASQ');
  if (mtu === null || ipMasq === null || missing.length > 0) {
    throw new SubnetEnvError(file, 'invalid', missing, `${file} is missing ${missing.join(', ')}`);
  }
  return { networks, subnet, ipv6Networks, ipv6Subnet, mtu, ipMasq, weft };
}

/** Reads and parses the file; every failure is a SubnetEnvError naming the file. */
export async function loadFlannelSubnetEnv(file: string): Promise<FlannelSubnetEnv> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8'); // sync: node:fs/promises costs ~1.5 ms to load
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'ENOENT' || err.code === 'ENOTDIR') {
      throw new SubnetEnvError(
        file,
        'missing',
        [],
        `subnet file ${file} does not exist: weftd (flanneld) has not started or has not acquired a subnet lease ` +
          'on this node yet; check the weftd/flannel log for this node',
        { cause: e },
      );
    }
    throw new SubnetEnvError(file, 'unreadable', [], `cannot read subnet file ${file}: ${err.message}`, { cause: e });
  }
  return parseFlannelSubnetEnv(text, file);
}
