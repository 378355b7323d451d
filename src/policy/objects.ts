// Namespaces, Pods and networking.k8s.io/v1 NetworkPolicies as the policy engine needs them,
// parsed from the JSON the API server sends. Validation follows the API server's
// (pkg/apis/networking/validation, apimachinery label and name rules) so that anything the server
// can hold parses, and anything else is refused with an error naming the object and field.
// Differences from the server are noted where they are.
import { IPAddr, type IPNet } from '../util/ip.js';
import { checkOrFail, dnsLabelProblem, dnsSubdomainProblem, Fields, portNameProblem, quote } from './fields.js';
import { CIDRError, exceptProblem, parsePolicyCIDR } from './ipblock.js';
import { type ContainerPort, isProtocol, type PolicyPort, type Protocol } from './ports.js';
import { type Labels, type LabelSelector, parseSelector } from './selector.js';

/** The label the API server puts on every namespace (immutable, equal to its name). */
export const NAMESPACE_NAME_LABEL = 'kubernetes.io/metadata.name';

export interface Namespace {
  readonly name: string;
  readonly labels: Labels;
}

export interface Pod {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string | null;
  readonly labels: Labels;
  /** Deduplicated, IPv4 and IPv6; empty until the pod has an address. */
  readonly ips: readonly IPAddr[];
  readonly nodeName: string | null;
  readonly hostNetwork: boolean;
  readonly phase: string;
  /** deletionTimestamp is set: still running its grace period. */
  readonly terminating: boolean;
  readonly ports: readonly ContainerPort[];
}

/**
 * A pod takes part in policy (as a selected pod or a peer) until it has finished: Succeeded and
 * Failed pods have released their address, which a new pod may already hold. A terminating pod
 * still runs (grace period) with its address, so it stays.
 */
export function podActive(p: Pod): boolean {
  return p.phase !== 'Succeeded' && p.phase !== 'Failed';
}

/**
 * A peer: pods chosen by selectors, or an ipBlock (the API forbids mixing them in one peer).
 * `namespaces` null means the policy's own namespace (podSelector alone).
 */
export type PolicyPeer =
  | { readonly kind: 'pods'; readonly namespaces: LabelSelector | null; readonly pods: LabelSelector }
  | { readonly kind: 'ipBlock'; readonly cidr: IPNet; readonly except: readonly IPNet[] };

export interface PolicyRule {
  /** null: `from`/`to` empty or absent, every source/destination. */
  readonly peers: readonly PolicyPeer[] | null;
  /** null: `ports` empty or absent, every port and protocol. */
  readonly ports: readonly PolicyPort[] | null;
  /** A canonical text of the rule's meaning, for identity and change detection. */
  readonly canonical: string;
}

export interface NetworkPolicy {
  readonly namespace: string;
  readonly name: string;
  readonly podSelector: LabelSelector;
  /** null when the policy does not apply to that direction (policyTypes). */
  readonly ingress: readonly PolicyRule[] | null;
  readonly egress: readonly PolicyRule[] | null;
  /** Accepted leniencies (sloppy CIDRs) worth logging once. */
  readonly warnings: readonly string[];
}

function metadata(raw: unknown, kindName: string, namespaced: boolean): { f: Fields; meta: Record<string, unknown>; namespace: string; name: string } {
  const f = new Fields(kindName);
  const obj = f.record(raw, '(object)');
  const meta = f.record(obj['metadata'], 'metadata');
  const name = f.string(meta['name'], 'metadata.name');
  const namespace = namespaced ? f.string(meta['namespace'], 'metadata.namespace') : '';
  if (namespaced) {
    checkOrFail(f, 'metadata.namespace', dnsLabelProblem(namespace));
    checkOrFail(f, 'metadata.name', dnsSubdomainProblem(name));
    f.object = `${kindName} ${namespace}/${name}`;
  } else {
    checkOrFail(f, 'metadata.name', dnsLabelProblem(name));
    f.object = `${kindName} ${name}`;
  }
  return { f, meta, namespace, name };
}

export function parseNamespace(raw: unknown): Namespace {
  const { f, meta, name } = metadata(raw, 'Namespace', false);
  const labels = f.labels(meta['labels'], 'metadata.labels');
  // The API server sets this label on every namespace and refuses to change it; an object that
  // says otherwise is not from it. Forcing it also lets a pod seen before its namespace match.
  labels.set(NAMESPACE_NAME_LABEL, name);
  return { name, labels };
}

export function parsePod(raw: unknown): Pod {
  const { f, meta, namespace, name } = metadata(raw, 'Pod', true);
  const obj = raw as Record<string, unknown>;
  const uid = f.optString(meta['uid'], 'metadata.uid') ?? null;
  const labels = f.labels(meta['labels'], 'metadata.labels');
  const terminating = meta['deletionTimestamp'] !== undefined && meta['deletionTimestamp'] !== null;
  const spec = f.optRecord(obj['spec'], 'spec') ?? {};
  const status = f.optRecord(obj['status'], 'status') ?? {};
  const nodeName = f.optString(spec['nodeName'], 'spec.nodeName') || null;
  if (nodeName !== null) checkOrFail(f, 'spec.nodeName', dnsSubdomainProblem(nodeName));
  const hostNetwork = f.bool(spec['hostNetwork'], 'spec.hostNetwork');
  const phase = f.optString(status['phase'], 'status.phase') ?? 'Pending';
  if (phase.length > 64) f.fail('status.phase', 'too long');

  const ips: IPAddr[] = [];
  const addIP = (text: unknown, path: string) => {
    const s = f.string(text, path);
    const ip = IPAddr.tryParse(s) ?? f.fail(path, `${quote(s)} is not an IP address`);
    if (!ips.some((x) => x.equals(ip))) ips.push(ip);
  };
  const podIPs = f.array(status['podIPs'], 'status.podIPs');
  podIPs.forEach((e, i) => addIP(f.record(e, `status.podIPs[${i}]`)['ip'], `status.podIPs[${i}].ip`));
  // Older servers and some fakes fill only status.podIP.
  if (podIPs.length === 0 && status['podIP'] !== undefined && status['podIP'] !== null && status['podIP'] !== '') addIP(status['podIP'], 'status.podIP');

  // Named ports resolve against regular containers (what kube-proxy and the e2e suite use).
  const ports: ContainerPort[] = [];
  f.array(spec['containers'], 'spec.containers').forEach((c, i) => {
    const cr = f.record(c, `spec.containers[${i}]`);
    f.array(cr['ports'], `spec.containers[${i}].ports`).forEach((pr, j) => {
      const p = `spec.containers[${i}].ports[${j}]`;
      const rec = f.record(pr, p);
      const port = f.int(rec['containerPort'], `${p}.containerPort`, 1, 65535);
      const protocol = protocolOf(f, rec['protocol'], `${p}.protocol`);
      const pname = f.optString(rec['name'], `${p}.name`) || null;
      if (pname !== null) checkOrFail(f, `${p}.name`, portNameProblem(pname));
      ports.push({ name: pname, port, protocol });
    });
  });
  return { namespace, name, uid, labels, ips, nodeName, hostNetwork, phase, terminating, ports };
}

function protocolOf(f: Fields, v: unknown, path: string): Protocol {
  const s = f.optString(v, path) ?? 'TCP';
  if (s === '') return 'TCP';
  if (!isProtocol(s)) f.fail(path, `${quote(s)} is not supported: must be TCP, UDP or SCTP`);
  return s;
}

export function parseNetworkPolicy(raw: unknown): NetworkPolicy {
  const { f, namespace, name } = metadata(raw, 'NetworkPolicy', true);
  const obj = raw as Record<string, unknown>;
  const spec = f.optRecord(obj['spec'], 'spec') ?? {};
  const warnings: string[] = [];
  const podSelector = parseSelector(spec['podSelector'], f, 'spec.podSelector');

  const rawTypes = f.array(spec['policyTypes'], 'spec.policyTypes');
  if (rawTypes.length > 2) f.fail('spec.policyTypes', 'may not specify more than two policyTypes');
  const types = new Set<string>();
  rawTypes.forEach((t, i) => {
    const s = f.string(t, `spec.policyTypes[${i}]`);
    if (s !== 'Ingress' && s !== 'Egress') f.fail(`spec.policyTypes[${i}]`, `${quote(s)} is not supported: must be Ingress or Egress`);
    types.add(s);
  });
  const rawIngress = f.array(spec['ingress'], 'spec.ingress');
  const rawEgress = f.array(spec['egress'], 'spec.egress');
  // SetDefaults_NetworkPolicy: no policyTypes means Ingress, plus Egress when egress rules exist.
  if (types.size === 0) {
    types.add('Ingress');
    if (rawEgress.length > 0) types.add('Egress');
  }
  // Rules of a direction the policy does not declare are validated but have no effect.
  const ingress = rawIngress.map((r, i) => parseRule(f, r, `spec.ingress[${i}]`, 'from', warnings));
  const egress = rawEgress.map((r, i) => parseRule(f, r, `spec.egress[${i}]`, 'to', warnings));
  return {
    namespace,
    name,
    podSelector,
    ingress: types.has('Ingress') ? ingress : null,
    egress: types.has('Egress') ? egress : null,
    warnings,
  };
}

function parseRule(f: Fields, raw: unknown, path: string, peersField: 'from' | 'to', warnings: string[]): PolicyRule {
  const rec = f.record(raw, path);
  const rawPeers = f.array(rec[peersField], `${path}.${peersField}`);
  const rawPorts = f.array(rec['ports'], `${path}.ports`);
  const peers = rawPeers.map((p, i) => parsePeer(f, p, `${path}.${peersField}[${i}]`, warnings));
  const ports = rawPorts.map((p, i) => parsePort(f, p, `${path}.ports[${i}]`));
  const r = { peers: peers.length ? peers : null, ports: ports.length ? ports : null };
  return { ...r, canonical: canonicalRule(r) };
}

function parsePeer(f: Fields, raw: unknown, path: string, warnings: string[]): PolicyPeer {
  const rec = f.record(raw, path);
  const hasPods = rec['podSelector'] !== undefined && rec['podSelector'] !== null;
  const hasNs = rec['namespaceSelector'] !== undefined && rec['namespaceSelector'] !== null;
  const block = f.optRecord(rec['ipBlock'], `${path}.ipBlock`);
  if (!hasPods && !hasNs && !block) f.fail(path, 'must specify a peer');
  if (block) {
    if (hasPods || hasNs) f.fail(path, 'may not specify both ipBlock and another peer');
    const cidrText = f.string(block['cidr'], `${path}.ipBlock.cidr`);
    if (cidrText === '') f.fail(`${path}.ipBlock.cidr`, 'Required value');
    const cidr = cidrOf(f, cidrText, `${path}.ipBlock.cidr`, warnings);
    const except = f.array(block['except'], `${path}.ipBlock.except`).map((e, i) => {
      const p = `${path}.ipBlock.except[${i}]`;
      const net = cidrOf(f, f.string(e, p), p, warnings);
      checkOrFail(f, p, exceptProblem(cidr, net));
      return net;
    });
    return { kind: 'ipBlock', cidr, except };
  }
  return {
    kind: 'pods',
    namespaces: hasNs ? parseSelector(rec['namespaceSelector'], f, `${path}.namespaceSelector`) : null,
    pods: parseSelector(rec['podSelector'], f, `${path}.podSelector`),
  };
}

function cidrOf(f: Fields, text: string, path: string, warnings: string[]): IPNet {
  try {
    const { net, warnings: w } = parsePolicyCIDR(text);
    for (const m of w) warnings.push(`${f.object}: ${path}: ${m}`);
    return net;
  } catch (e) {
    if (e instanceof CIDRError) f.fail(path, `${quote(text)} must be a valid CIDR value (e.g. 10.9.8.0/24 or 2001:db8::/64): ${e.reason}`);
    throw e;
  }
}

function parsePort(f: Fields, raw: unknown, path: string): PolicyPort {
  const rec = f.record(raw, path);
  const protocol = protocolOf(f, rec['protocol'], `${path}.protocol`);
  const port = rec['port'];
  const endPort = rec['endPort'];
  const hasEnd = endPort !== undefined && endPort !== null;
  if (port === undefined || port === null) {
    if (hasEnd) f.fail(`${path}.endPort`, 'may not be specified when `port` is not specified');
    return { kind: 'range', protocol, first: 0, last: 65535 };
  }
  if (typeof port === 'string') {
    // intstr: a JSON string is a name even when it looks like a number ("80" has no letter: invalid).
    if (hasEnd) f.fail(`${path}.endPort`, 'may not be specified when `port` is non-numeric');
    checkOrFail(f, `${path}.port`, portNameProblem(port));
    return { kind: 'named', protocol, name: port };
  }
  const first = f.int(port, `${path}.port`, 1, 65535);
  if (!hasEnd) return { kind: 'range', protocol, first, last: first };
  const last = f.int(endPort, `${path}.endPort`, 1, 65535);
  if (last < first) f.fail(`${path}.endPort`, 'must be greater than or equal to `port`');
  return { kind: 'range', protocol, first, last };
}

function canonicalRule(r: { peers: readonly PolicyPeer[] | null; ports: readonly PolicyPort[] | null }): string {
  const peers = r.peers?.map((p) =>
    p.kind === 'pods' ? ['pods', p.namespaces?.canonical ?? null, p.pods.canonical] : ['ipBlock', p.cidr.toString(), p.except.map((e) => e.toString())],
  );
  const ports = r.ports?.map((p) => (p.kind === 'range' ? [p.protocol, p.first, p.last] : [p.protocol, p.name]));
  return JSON.stringify([peers ?? null, ports ?? null]);
}
