// flannel's Node annotations (pkg/subnet/kube/annotations.go, kube.go): their names under
// --kube-annotation-prefix, the values a node publishes about itself, and the values it reads back
// from its own Node at start-up (VTEP MACs, node-public-ip). Pure: no API calls.
import { errorMessage } from '../../util/errors.js';
import { checkUnicastMac } from '../../util/mac.js';
import type { Mac } from '../../netlink/types.js';
import { IPAddr, type Family } from '../../util/ip.js';
import { goJson } from '../codec.js';
import type { JsonValue, LeaseAttrs } from '../lease.js';
import type { KubeNode } from './objects.js';

export const DEFAULT_ANNOTATION_PREFIX = 'flannel.alpha.coreos.com';

export interface AnnotationNames {
  /** The prefix after flannel's normalisation, e.g. `flannel.alpha.coreos.com/` or `example.com/foo-`. */
  readonly prefix: string;
  readonly kubeSubnetManager: string;
  readonly backendType: string;
  readonly backendData: string;
  readonly backendV6Data: string;
  readonly publicIP: string;
  readonly publicIPv6: string;
  readonly publicIPOverwrite: string;
  readonly publicIPv6Overwrite: string;
  readonly nodePublicIP: string;
  readonly nodePublicIPv6: string;
}

export class AnnotationPrefixError extends Error {
  constructor(
    readonly prefix: string,
    readonly reason: string,
  ) {
    super(`kube annotation prefix ${JSON.stringify(prefix)}: ${reason}`);
    this.name = 'AnnotationPrefixError';
  }
}

/** An annotation on a Node whose value cannot be used; names the node, the key and the value. */
export class AnnotationValueError extends Error {
  constructor(
    readonly node: string,
    readonly annotation: string,
    readonly value: string,
    readonly reason: string,
  ) {
    super(`node ${JSON.stringify(node)}: annotation ${annotation}=${JSON.stringify(value)}: ${reason}`);
    this.name = 'AnnotationValueError';
  }
}

// flannel's pattern, anchored at the start as well: flannel's is not, but every prefix that only
// the unanchored form accepts starts with a character the API server refuses in a key prefix.
const PREFIX_RE = /^(?:[a-z0-9_-]+\.)+[a-z0-9_-]+\/(?:[a-z0-9_-]+-)?$/;

// The longest name flannel appends; the part after "/" of a key may be at most 63 characters.
const LONGEST_SUFFIX = 'public-ipv6-overwrite';
const MAX_NAME_LEN = 63;

/**
 * flannel's newAnnotations: no "/" → append "/"; one "/" not at the end and no trailing "-" →
 * append "-"; more than one "/" is an error; the result must match flannel's pattern.
 */
export function annotationNames(prefix: string = DEFAULT_ANNOTATION_PREFIX): AnnotationNames {
  const slashes = prefix.split('/').length - 1;
  if (slashes > 1) {
    throw new AnnotationPrefixError(prefix, 'subnet/kube: prefix can contain at most single slash');
  }
  let p = prefix;
  if (slashes === 0) p += '/';
  if (!p.endsWith('/') && !p.endsWith('-')) p += '-';
  if (!PREFIX_RE.test(p)) {
    throw new AnnotationPrefixError(prefix, 'subnet/kube: prefix must be in a format: fqdn/[0-9a-z-_]*');
  }
  // weft addition: flannel would only learn this from the API server's refusal of its patch.
  const namePart = p.slice(p.indexOf('/') + 1);
  if (namePart.length + LONGEST_SUFFIX.length > MAX_NAME_LEN) {
    throw new AnnotationPrefixError(
      prefix,
      `the part after "/" makes "${namePart}${LONGEST_SUFFIX}" longer than ${MAX_NAME_LEN} characters`,
    );
  }
  return {
    prefix: p,
    kubeSubnetManager: `${p}kube-subnet-manager`,
    backendType: `${p}backend-type`,
    backendData: `${p}backend-data`,
    backendV6Data: `${p}backend-v6-data`,
    publicIP: `${p}public-ip`,
    publicIPv6: `${p}public-ipv6`,
    publicIPOverwrite: `${p}public-ip-overwrite`,
    publicIPv6Overwrite: `${p}public-ipv6-overwrite`,
    nodePublicIP: `${p}node-public-ip`,
    nodePublicIPv6: `${p}node-public-ipv6`,
  };
}

/** The annotations of a node, never undefined. */
export function annotationsOf(node: KubeNode): Readonly<Record<string, string>> {
  return node.metadata.annotations ?? {};
}

/** The value of an annotation; an absent key reads as "", as a Go map lookup does. */
function get(node: KubeNode, key: string): string {
  return Object.hasOwn(annotationsOf(node), key) ? (annotationsOf(node)[key] ?? '') : '';
}

// ---- what a node publishes about itself ---------------------------------------------------

/** The user-set `public-ip-overwrite` / `public-ipv6-overwrite` values, parsed. */
export interface Overwrites {
  readonly publicIP: IPAddr | null;
  readonly publicIPv6: IPAddr | null;
}

export const NO_OVERWRITES: Overwrites = { publicIP: null, publicIPv6: null };

/**
 * Reads the own node's overwrite annotations. flannel publishes whatever text is there, so a
 * typo makes every peer drop the node; weft refuses it instead (AnnotationValueError).
 */
export function readOverwrites(node: KubeNode, names: AnnotationNames): Overwrites {
  return {
    publicIP: optionalIP(node, names.publicIPOverwrite, 4),
    publicIPv6: optionalIP(node, names.publicIPv6Overwrite, 6),
  };
}

/** The annotation values flannel's AcquireLease makes the own Node carry; keys not listed are left alone. */
export type DesiredAnnotations = Readonly<Record<string, string>>;

/**
 * What flannel's AcquireLease writes, as a key → value map:
 * - `backend-type` and `kube-subnet-manager: "true"` always;
 * - `backend-data` + `public-ip` when `(vxlan && data != null) || (wireguard && data != null) || type != vxlan`;
 * - `backend-v6-data` + `public-ipv6` when `(vxlan && v6data != null) || (wireguard && v6data != null &&
 *   PublicIPv6 != nil) || (host-gw && PublicIPv6 != nil) || (extension && PublicIPv6 != nil)`;
 * - an overwrite annotation replaces the detected public IP.
 * `backendType` is the value published ("" for alloc/udp, whose LeaseAttrs omit it); the data are
 * encoded as Go's json.RawMessage.MarshalJSON does (`null` when absent).
 */
export function desiredAnnotations(
  names: AnnotationNames,
  attrs: LeaseAttrs,
  backendType: string,
  overwrites: Overwrites = NO_OVERWRITES,
): DesiredAnnotations {
  if (attrs.backendType !== undefined && attrs.backendType !== backendType) {
    throw new TypeError(`backendType "${backendType}" differs from the lease's "${attrs.backendType}"`);
  }
  if (overwrites.publicIP && overwrites.publicIP.family !== 4) throw new TypeError('public-ip overwrite must be IPv4');
  if (overwrites.publicIPv6 && overwrites.publicIPv6.family !== 6) {
    throw new TypeError('public-ipv6 overwrite must be IPv6');
  }
  const bd = rawJson(attrs.backendData);
  const v6bd = rawJson(attrs.backendV6Data);
  const hasV6IP = attrs.publicIPv6 !== null;
  const out: Record<string, string> = {};
  out[names.backendType] = backendType;

  // The wireguard clause of flannel's condition is implied by `type != vxlan`.
  if (backendType !== 'vxlan' || bd !== 'null') {
    out[names.backendData] = bd;
    out[names.publicIP] = (overwrites.publicIP ?? attrs.publicIP).toString();
  }
  const v6 =
    (backendType === 'vxlan' && v6bd !== 'null') ||
    (backendType === 'wireguard' && v6bd !== 'null' && hasV6IP) ||
    (backendType === 'host-gw' && hasV6IP) ||
    (backendType === 'extension' && hasV6IP);
  if (v6) {
    out[names.backendV6Data] = v6bd;
    // flannel would print a nil address here (vxlan v6 data without a v6 public IP); weft writes none.
    const ip6 = overwrites.publicIPv6 ?? attrs.publicIPv6;
    if (ip6) out[names.publicIPv6] = ip6.toString();
  }
  out[names.kubeSubnetManager] = 'true';
  return out;
}

function rawJson(v: JsonValue | undefined): string {
  return v === undefined ? 'null' : goJson(v);
}

// ---- what a node reads back from its own Node ---------------------------------------------

export interface StoredMacs {
  /** VtepMAC of `backend-data`, lower-case colon form; null when absent or unusable. */
  readonly v4: Mac | null;
  readonly v6: Mac | null;
  /** Why a present annotation was not used, one line each, for a warning. */
  readonly problems: readonly string[];
}

/**
 * The VTEP MACs the node published before a restart (flannel's GetStoredMacAddresses), parsed as
 * JSON rather than by flannel's string splitting, under the configured prefix (flannel looks under
 * `<raw prefix>/backend-data`, which is only right for a prefix without "/").
 */
export function storedVtepMacs(node: KubeNode, names: AnnotationNames): StoredMacs {
  const problems: string[] = [];
  const v4 = storedMac(node, names.backendData, problems);
  const v6 = storedMac(node, names.backendV6Data, problems);
  return { v4, v6, problems };
}

function storedMac(node: KubeNode, key: string, problems: string[]): Mac | null {
  if (!Object.hasOwn(annotationsOf(node), key)) return null;
  const text = get(node, key);
  const fail = (reason: string): null => {
    problems.push(new AnnotationValueError(node.metadata.name, key, text, reason).message);
    return null;
  };
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (e) {
    return fail(`not valid JSON (${errorMessage(e)})`);
  }
  // host-gw and friends publish "null": no MAC to keep, nothing wrong.
  if (data === null) return null;
  if (typeof data !== 'object' || Array.isArray(data)) return fail('not a JSON object');
  // Go's encoding/json matches keys case-insensitively.
  const entry = Object.entries(data as Record<string, unknown>).find(([k]) => k.toLowerCase() === 'vtepmac');
  if (!entry) return null;
  const mac: unknown = entry[1];
  const checked = checkUnicastMac(mac);
  return 'mac' in checked ? checked.mac : fail(`VtepMAC ${checked.problem}`);
}

export interface StoredPublicIPs {
  readonly v4: IPAddr | null;
  readonly v6: IPAddr | null;
}

/**
 * The user-set `node-public-ip` / `node-public-ipv6` (flannel's GetStoredPublicIP), used as
 * --public-ip / --public-ipv6. flannel passes the text on unparsed; a bad value is an
 * AnnotationValueError here.
 */
export function storedPublicIPs(node: KubeNode, names: AnnotationNames): StoredPublicIPs {
  return { v4: optionalIP(node, names.nodePublicIP, 4), v6: optionalIP(node, names.nodePublicIPv6, 6) };
}

/** An address annotation: absent or "" → null; otherwise it must be an address of `family`. */
function optionalIP(node: KubeNode, key: string, family: Family): IPAddr | null {
  const text = get(node, key);
  if (text === '') return null;
  const ip = IPAddr.tryParse(text);
  if (!ip || ip.family !== family) {
    throw new AnnotationValueError(node.metadata.name, key, text, `not an IPv${family} address`);
  }
  return ip;
}
