// Pure conversions between Kubernetes Node objects and weft leases, following flannel's
// pkg/subnet/kube/kube.go (nodeToLease, AcquireLease, CompleteLease, handleUpdateLeaseEvent).
// No API calls: the lease manager feeds Nodes in and sends the patches built here.
import { errorMessage } from '../../util/errors.js';
import { IPAddr, IPNet } from '../../util/ip.js';
import { goJson } from '../codec.js';
import type { NetworkConfig } from '../config.js';
import type { JsonValue, Lease, LeaseAttrs, LeaseSubnets } from '../lease.js';
import { AnnotationValueError, annotationsOf, type AnnotationNames, type DesiredAnnotations } from './annotations.js';
import type { KubeNode } from './objects.js';

export type PodCIDRProblem = 'not-assigned' | 'invalid' | 'count' | 'family-missing' | 'outside-network';

/** The node's spec.podCIDR(s) cannot give it a subnet. Messages are flannel's where flannel has one. */
export class PodCIDRError extends Error {
  constructor(
    readonly node: string,
    readonly problem: PodCIDRProblem,
    message: string,
  ) {
    super(message);
    this.name = 'PodCIDRError';
  }
}

type FamilyConfig = Pick<NetworkConfig, 'enableIPv4' | 'enableIPv6'>;

// ---- podCIDRs -----------------------------------------------------------------------------

interface PodCIDRs {
  readonly v4: IPNet | null;
  readonly v6: IPNet | null;
}

/**
 * spec.podCIDRs, or spec.podCIDR when the list is empty, split by family. More than two entries,
 * or two of one family (which the API server never allows), is flannel's "dualstack" error.
 */
function podCIDRsOf(node: KubeNode): PodCIDRs {
  const name = node.metadata.name;
  const listed = node.spec?.podCIDRs ?? [];
  const single = node.spec?.podCIDR ?? '';
  const texts = listed.length > 0 ? listed : single !== '' ? [single] : [];
  if (texts.length === 0) throw new PodCIDRError(name, 'not-assigned', `node "${name}" pod cidr not assigned`);
  const dualstack = () =>
    new PodCIDRError(name, 'count', `node "${name}" pod cidrs should be IPv4/IPv6 only or dualstack`);
  if (texts.length > 2) throw dualstack();
  let v4: IPNet | null = null;
  let v6: IPNet | null = null;
  for (const text of texts) {
    const net = IPNet.tryParse(text);
    // Go's net.ParseCIDR error text, with the node it came from.
    if (!net) throw new PodCIDRError(name, 'invalid', `node "${name}": invalid CIDR address: ${text}`);
    if (net.family === 4) {
      if (v4) throw dualstack();
      v4 = net;
    } else {
      if (v6) throw dualstack();
      v6 = net;
    }
  }
  return { v4, v6 };
}

/**
 * The own node's subnets, with flannel's AcquireLease checks and texts: spec.podCIDR must be set,
 * each used CIDR must lie inside Network / IPv6Network. A CIDR of a disabled family is ignored, as
 * flannel does. weft addition: an enabled family without a CIDR is an error (flannel goes on with an
 * empty subnet).
 */
export function ownPodCIDRs(
  node: KubeNode,
  config: FamilyConfig & Pick<NetworkConfig, 'network' | 'ipv6Network'>,
): LeaseSubnets {
  const name = node.metadata.name;
  // flannel looks at spec.podCIDR first, even when spec.podCIDRs is set.
  if ((node.spec?.podCIDR ?? '') === '') {
    throw new PodCIDRError(name, 'not-assigned', `node "${name}" pod cidr not assigned`);
  }
  const { v4, v6 } = podCIDRsOf(node);
  const shown = JSON.stringify(node.spec?.podCIDRs?.length ? node.spec.podCIDRs : [node.spec?.podCIDR]);
  let subnet: IPNet | null = null;
  let ipv6Subnet: IPNet | null = null;
  if (config.enableIPv4) {
    if (!v4) {
      throw new PodCIDRError(name, 'family-missing', `node "${name}" has no IPv4 pod cidr (${shown}) but EnableIPv4 is true`);
    }
    if (!config.network || !config.network.containsNet(v4)) {
      throw new PodCIDRError(
        name,
        'outside-network',
        `subnet "${config.network?.toString() ?? '0.0.0.0/0'}" specified in the flannel net config doesn't contain ` +
          `"${v4.toString()}" PodCIDR of the "${name}" node`,
      );
    }
    subnet = v4;
  }
  if (config.enableIPv6) {
    if (!v6) {
      throw new PodCIDRError(name, 'family-missing', `node "${name}" has no IPv6 pod cidr (${shown}) but EnableIPv6 is true`);
    }
    if (!config.ipv6Network || !config.ipv6Network.containsNet(v6)) {
      throw new PodCIDRError(
        name,
        'outside-network',
        `subnet "${config.ipv6Network?.toString() ?? '::/0'}" specified in the flannel net config doesn't contain ` +
          `"${v6.toString()}" IPv6 PodCIDR of the "${name}" node`,
      );
    }
    ipv6Subnet = v6;
  }
  return { subnet, ipv6Subnet };
}

// ---- peers --------------------------------------------------------------------------------

/**
 * A peer's Node as a lease, or why it is not one. `managed: false` is the quiet case (a node
 * without `kube-subnet-manager: "true"`, which flannel ignores); `managed: true` means the node
 * claims to be managed but an annotation or its podCIDRs do not parse: warn once, keep no lease.
 */
export type NodeLeaseResult = { readonly lease: Lease } | { readonly skip: string; readonly managed: boolean };

/**
 * flannel's nodeToLease: per enabled family, `public-ip(v6)` must parse, the first podCIDR of the
 * family is the subnet, `backend-(v6-)data` is the backend data; `backend-type` as written.
 * Differences: backend data must be valid JSON (flannel passes the text on unchecked); an absent
 * backend-data annotation is no data; a CIDR of the wrong family in spec.podCIDR is refused (flannel
 * would put an IPv6 net in the IPv4 subnet). Peers have no expiry in kube mode: `expiration` is null
 * (flannel leaves it zero; only its own lease gets a nominal now+24h).
 */
export function nodeToLease(node: KubeNode, names: AnnotationNames, config: FamilyConfig): NodeLeaseResult {
  const name = node.metadata.name;
  const ann = annotationsOf(node);
  if (ann[names.kubeSubnetManager] !== 'true') {
    return { skip: `node "${name}": no annotation ${names.kubeSubnetManager}="true"`, managed: false };
  }
  try {
    const cidrs = podCIDRsOf(node);
    let publicIP = IPAddr.of(4, 0n);
    let publicIPv6: IPAddr | null = null;
    let subnet: IPNet | null = null;
    let ipv6Subnet: IPNet | null = null;
    let backendData: JsonValue | undefined;
    let backendV6Data: JsonValue | undefined;
    if (config.enableIPv4) {
      publicIP = requiredIP(node, names.publicIP, 4);
      backendData = optionalJson(node, names.backendData);
      if (!cidrs.v4) throw missingFamily(node, 4);
      subnet = cidrs.v4;
    }
    if (config.enableIPv6) {
      publicIPv6 = requiredIP(node, names.publicIPv6, 6);
      backendV6Data = optionalJson(node, names.backendV6Data);
      if (!cidrs.v6) throw missingFamily(node, 6);
      ipv6Subnet = cidrs.v6;
    }
    const attrs: { -readonly [K in keyof LeaseAttrs]: LeaseAttrs[K] } = { publicIP, publicIPv6 };
    const backendType = ann[names.backendType] ?? '';
    if (backendType !== '') attrs.backendType = backendType;
    if (backendData !== undefined) attrs.backendData = backendData;
    if (backendV6Data !== undefined) attrs.backendV6Data = backendV6Data;
    const created = Date.parse(node.metadata.creationTimestamp ?? '');
    const claimedAt = Number.isFinite(created) ? { claimedAt: BigInt(created) } : {};
    return { lease: { subnet, ipv6Subnet, attrs, reservation: false, expiration: null, ...claimedAt } };
  } catch (e) {
    if (e instanceof AnnotationValueError || e instanceof PodCIDRError) return { skip: e.message, managed: true };
    throw e;
  }
}

function missingFamily(node: KubeNode, family: 4 | 6): PodCIDRError {
  const name = node.metadata.name;
  return new PodCIDRError(name, 'family-missing', `node "${name}": missing IPv${family} address on spec.podCIDRs`);
}

function requiredIP(node: KubeNode, key: string, family: 4 | 6): IPAddr {
  const ann = annotationsOf(node);
  const text = ann[key];
  if (text === undefined) throw new AnnotationValueError(node.metadata.name, key, '', 'missing');
  const ip = IPAddr.tryParse(text);
  if (!ip || ip.family !== family) {
    throw new AnnotationValueError(node.metadata.name, key, text, `not an IPv${family} address`);
  }
  return ip;
}

function optionalJson(node: KubeNode, key: string): JsonValue | undefined {
  const text = annotationsOf(node)[key];
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text) as JsonValue;
  } catch (e) {
    throw new AnnotationValueError(node.metadata.name, key, text, `not valid JSON (${errorMessage(e)})`);
  }
}

/**
 * Whether an updated peer lease must be sent to the backend again: backend type or data (v4 or
 * v6), public IP (v4 or v6), or either subnet differ. flannel compares only the annotation text
 * and misses v6-only changes in dual-stack and podCIDR changes. Data compare as JSON values, so
 * key order and spacing do not count. A changed subnet changes the lease's identity: the caller
 * removes the old lease before adding the new one.
 */
export function leaseChanged(a: Lease, b: Lease): boolean {
  return (
    !sameNet(a.subnet, b.subnet) ||
    !sameNet(a.ipv6Subnet, b.ipv6Subnet) ||
    !a.attrs.publicIP.equals(b.attrs.publicIP) ||
    !sameIP(a.attrs.publicIPv6, b.attrs.publicIPv6) ||
    (a.attrs.backendType ?? '') !== (b.attrs.backendType ?? '') ||
    !jsonEqual(a.attrs.backendData ?? null, b.attrs.backendData ?? null) ||
    !jsonEqual(a.attrs.backendV6Data ?? null, b.attrs.backendV6Data ?? null)
  );
}

function sameNet(a: IPNet | null, b: IPNet | null): boolean {
  return a === null || b === null ? a === b : a.equals(b);
}

function sameIP(a: IPAddr | null, b: IPAddr | null): boolean {
  return a === null || b === null ? a === b : a.equals(b);
}

function jsonEqual(a: JsonValue, b: JsonValue): boolean {
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return a === b;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((v, i) => jsonEqual(v, b[i]!));
  }
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.hasOwn(b, k) && jsonEqual(a[k]!, b[k]!));
}

// ---- patches ------------------------------------------------------------------------------

export const STRATEGIC_MERGE_PATCH = 'application/strategic-merge-patch+json';

/** A PATCH of `nodes/NAME/status`, as flannel sends both of its writes. */
export interface NodePatch {
  readonly node: string;
  readonly subresource: 'status';
  readonly contentType: typeof STRATEGIC_MERGE_PATCH;
  /** The JSON body, keys in Go's order (sorted map keys, struct field order). */
  readonly body: string;
}

export interface AnnotationPatchOptions {
  /**
   * Add `metadata.resourceVersion` (when the node has one) so the API server refuses the patch with
   * 409 if the Node changed since it was read; the caller re-reads and recomputes. Default true.
   * false gives flannel's exact body (a two-way merge patch never carries it).
   */
  readonly precondition?: boolean;
}

/**
 * The strategic-merge patch that makes the node carry `desired` (what flannel's
 * CreateTwoWayMergePatch yields: only the annotations whose value differs), or null when the node
 * already carries them all. flannel sends its patch even when it is empty.
 */
export function annotationPatch(
  node: KubeNode,
  desired: DesiredAnnotations,
  opts: AnnotationPatchOptions = {},
): NodePatch | null {
  const current = annotationsOf(node);
  const changed = Object.keys(desired)
    .filter((k) => !Object.hasOwn(current, k) || current[k] !== desired[k])
    .sort();
  if (changed.length === 0) return null;
  const annotations = `{${changed.map((k) => `${goJson(k)}:${goJson(desired[k]!)}`).join(',')}}`;
  const rv = node.metadata.resourceVersion;
  const precondition = (opts.precondition ?? true) && rv !== undefined && rv !== '';
  const metadata = precondition
    ? `{"annotations":${annotations},"resourceVersion":${goJson(rv)}}`
    : `{"annotations":${annotations}}`;
  return { node: node.metadata.name, subresource: 'status', contentType: STRATEGIC_MERGE_PATCH, body: `{"metadata":${metadata}}` };
}

export const NETWORK_UNAVAILABLE = 'NetworkUnavailable';
export const FLANNEL_IS_UP_REASON = 'FlannelIsUp';
export const FLANNEL_IS_UP_MESSAGE = 'Flannel is running on this node';

/**
 * flannel's CompleteLease patch: `{"status":{"conditions":[{NetworkUnavailable=False, FlannelIsUp}]}}`
 * (strategic merge keys conditions by type). Both times are `now` in metav1.Time's form
 * (RFC 3339, whole seconds, UTC), as flannel sets them — except that a condition already False
 * keeps its lastTransitionTime, since nothing transitioned (flannel resets it on every start).
 */
export function networkUnavailablePatch(node: KubeNode, now: Date): NodePatch {
  const stamp = metaTime(now);
  const existing = node.status?.conditions?.find((c) => c.type === NETWORK_UNAVAILABLE);
  const transition =
    existing && existing.status === 'False' && existing.lastTransitionTime ? existing.lastTransitionTime : stamp;
  // Field order of Go's v1.NodeCondition.
  const condition =
    `{"type":${goJson(NETWORK_UNAVAILABLE)},"status":"False",` +
    `"lastHeartbeatTime":${goJson(stamp)},"lastTransitionTime":${goJson(transition)},` +
    `"reason":${goJson(FLANNEL_IS_UP_REASON)},"message":${goJson(FLANNEL_IS_UP_MESSAGE)}}`;
  return {
    node: node.metadata.name,
    subresource: 'status',
    contentType: STRATEGIC_MERGE_PATCH,
    body: `{"status":{"conditions":[${condition}]}}`,
  };
}

/** metav1.Time's JSON form: RFC 3339 in UTC with whole seconds, "2024-05-06T07:08:09Z". */
export function metaTime(t: Date): string {
  if (Number.isNaN(t.getTime())) throw new RangeError('invalid Date');
  return `${new Date(Math.floor(t.getTime() / 1000) * 1000).toISOString().slice(0, 19)}Z`;
}
