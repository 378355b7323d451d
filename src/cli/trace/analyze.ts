// The path of one packet through this node, hop by hop, from the facts collected on the node: the
// matching route and whose lease it serves, the VXLAN neighbour and FDB entries (or the host-gw next
// hop), the ovs backend's bridge as ofproto/trace walks it (tables, spoof guard, output), MTUs, and
// the masquerade (flannel's chain or ip-masq-agent mode's) and forward decisions on weft's rule
// model cross-checked against the live rules. Pure: facts in, report out.
import { parseSave, planTable, ruleSpec } from '../../ipmasq/iptables.js';
import { agentRules, FOREIGN_AGENT_CHAIN, LINK_LOCAL } from '../../ipmasq/agent-rules.js';
import { CHAIN_NAMES, desiredChains, forwardRules, masqRules, type ChainKind, type ChainSpec, type Rule } from '../../ipmasq/model.js';
import { compareTable, nftTable, parseListTable, ruleText, type ListedTable } from '../../ipmasq/nftables.js';
import { GATEWAY_PORT_NAME, TUNNEL_PORT_NAME } from '../../backend/ovs/bridge.js';
import { gatewayOf, GLOBAL_VIRTUAL_MAC, TABLES } from '../../backend/ovs/pipeline.js';
import { NUD, type LinkInfo, type NeighEntry } from '../../netlink/index.js';
import type { JsonValue, Lease } from '../../subnet/lease.js';
import { IPNet, type Family, type IPAddr } from '../../util/ip.js';
import { parseOfTrace, summarizeOvsTrace, tableName, type OfTrace, type OvsPath } from './ovs.js';
import { evalNftChain, evalNftRules, evalXtChain, firstModelMatch, parseNftChain, parseXtTable, type RulePacket } from './rules.js';
import {
  TRACE_KIND,
  TRACE_VERSION,
  type AddressClass,
  type ForwardEvidence,
  type Hop,
  type LiveState,
  type MasqueradeEvidence,
  type OvsFacts,
  type OvsTraceFacts,
  type RouteLookup,
  type TraceFacts,
  type TraceReport,
} from './types.js';

const MULTICAST: Record<Family, string> = { 4: '224.0.0.0/4', 6: 'ff00::/8' };
/** Bytes VXLAN adds over an IPv4 / IPv6 underlay (what the backend subtracts from the device MTU). */
const VXLAN_OVERHEAD: Record<Family, number> = { 4: 50, 6: 70 };
const WEFT_PROTOCOL = '88';

const subnetOf = (l: Lease, f: Family): IPNet | null => (f === 4 ? l.subnet : l.ipv6Subnet);
const publicOf = (l: Lease, f: Family): IPAddr | null => (f === 4 ? l.attrs.publicIP : l.attrs.publicIPv6);

function vtepMacOf(l: Lease, f: Family): string | null {
  const data: JsonValue | undefined = f === 4 ? l.attrs.backendData : l.attrs.backendV6Data;
  if (!data || typeof data !== 'object' || Array.isArray(data)) return null;
  return typeof data.VtepMAC === 'string' ? data.VtepMAC.toLowerCase() : null;
}

export function neighState(n: NeighEntry): string {
  const names = (Object.entries(NUD) as Array<[string, number]>).filter(([, bit]) => (n.state & bit) !== 0).map(([name]) => name);
  return names.length > 0 ? names.join(',') : 'NONE';
}

function describeRoute(r: Extract<RouteLookup, { ok: true }>): string {
  const parts = [r.prefix.prefix === 0 ? 'default' : r.prefix.toString()];
  if (r.type !== 'unicast') parts.unshift(r.type);
  if (r.nexthopId !== null) parts.push(`nhid ${r.nexthopId}`);
  if (r.gateway) parts.push(`via ${r.gateway.toString()}`);
  if (r.device) parts.push(`dev ${r.device}`);
  if (r.onlink) parts.push('onlink');
  if (r.protocol) parts.push(`proto ${r.protocol}`);
  if (r.table) parts.push(`table ${r.table}`);
  return parts.join(' ');
}

class Context {
  readonly family: Family;
  readonly network: IPNet | null;
  readonly subnet: IPNet | null;
  readonly ownLease: Lease | null;
  readonly backend: string | null;
  /** Without leases, "no lease has it" would be a guess: ownership is then not judged. */
  readonly leasesKnown: boolean;
  private readonly local: ReadonlySet<string>;

  constructor(readonly f: TraceFacts) {
    this.family = f.packet.dst.family;
    const env = f.env;
    this.network = (this.family === 4 ? (env?.network ?? f.config?.network) : (env?.ipv6Network ?? f.config?.ipv6Network)) ?? null;
    this.local = new Set(f.addresses.map((a) => a.ip.toString()));
    const envSubnet = (this.family === 4 ? env?.subnet : env?.ipv6Subnet) ?? null;
    this.ownLease =
      (envSubnet ? f.leases.find((l) => subnetOf(l, this.family)?.equals(envSubnet)) : undefined) ??
      f.leases.find((l) => {
        const p = publicOf(l, this.family);
        return p !== null && this.local.has(p.toString());
      }) ??
      null;
    this.subnet = envSubnet ?? (this.ownLease ? subnetOf(this.ownLease, this.family) : null);
    // The same order as collect's (which decided whether to read OVS).
    this.backend = this.ownLease?.attrs.backendType ?? f.env?.backend ?? f.daemonBackend ?? f.config?.backendType ?? null;
    this.leasesKnown = f.leaseSource !== 'none';
  }

  isLocal(ip: IPAddr): boolean {
    return this.local.has(ip.toString());
  }

  leaseContaining(ip: IPAddr): Lease | null {
    return this.f.leases.find((l) => subnetOf(l, this.family)?.contains(ip)) ?? null;
  }

  leaseByPublicIP(ip: IPAddr): Lease | null {
    return this.f.leases.find((l) => publicOf(l, ip.family)?.equals(ip)) ?? null;
  }

  classify(ip: IPAddr): { cls: AddressClass; lease: Lease | null } {
    if (this.isLocal(ip)) return { cls: 'node', lease: null };
    if (this.subnet?.contains(ip)) return { cls: 'local-pod', lease: this.ownLease };
    const lease = this.leaseContaining(ip);
    if (lease) return { cls: 'remote-pod', lease };
    if (this.network?.contains(ip)) return { cls: 'cluster', lease: null };
    return { cls: 'external', lease: null };
  }

  link(name: string | null): LinkInfo | null {
    return name === null ? null : (this.f.links.find((l) => l.name === name) ?? null);
  }

  /** The first address of a device in the packet's family (what MASQUERADE picks, roughly). */
  firstAddress(device: string | null): IPAddr | null {
    const link = this.link(device);
    if (!link) return null;
    const linkLocal = IPNet.parse('fe80::/10');
    return this.f.addresses.find((a) => a.ifindex === link.index && a.ip.family === this.family && !linkLocal.contains(a.ip))?.ip ?? null;
  }

  leaseName(l: Lease | null): string | null {
    const s = l ? subnetOf(l, this.family) : null;
    return s ? s.toString() : null;
  }

  /** The lease an address belongs to: this node's subnet counts even when the lease list is unknown. */
  leaseNameOf(x: { cls: AddressClass; lease: Lease | null }): string | null {
    return x.cls === 'local-pod' && this.subnet ? this.subnet.toString() : this.leaseName(x.lease);
  }
}

type Classified = { cls: AddressClass; lease: Lease | null };
type OkRoute = Extract<RouteLookup, { ok: true }>;

export function analyze(f: TraceFacts): TraceReport {
  const c = new Context(f);
  const hops: Hop[] = [];
  const { packet } = f;
  const src = c.classify(packet.src);
  const dst = c.classify(packet.dst);
  const forwarded = src.cls !== 'node';
  // On ovs a pod's packet (or one out of the tunnel) meets the bridge before any kernel routing.
  const bridgeFirst = c.backend === 'ovs' && (f.ovs?.trace?.entry === 'pod' || f.ovs?.trace?.entry === 'tunnel');

  sourceHop(c, hops, src, forwarded && !bridgeFirst);
  if (c.backend === 'ovs') {
    ovsPath(c, hops, src, dst, forwarded);
    return finish(c, hops);
  }

  const r = routeHop(c, hops, dst, false);
  if (!r) return finish(c, hops);
  if (r.type === 'local') {
    addRuleHops(c, hops, src.cls, dst.cls, r, forwarded);
    return finish(c, hops);
  }
  const egress = c.link(r.device);
  if (egress?.kind === 'vxlan' && r.gateway) {
    vxlanHops(c, hops, egress, r.gateway, dst.lease);
  } else {
    plainEgressHops(c, hops, r, dst);
  }
  addRuleHops(c, hops, src.cls, dst.cls, r, forwarded);
  return finish(c, hops);
}

/** A route out of a plain device: its next hop (if it has a gateway) and the device's MTU. */
function plainEgressHops(c: Context, hops: Hop[], r: OkRoute, dst: Classified): void {
  if (r.gateway && r.device) {
    nexthopHop(c, hops, r.device, r.gateway, dst.lease, null);
    mtuHop(c, hops, r.device, null);
  } else if (r.device && dst.cls !== 'local-pod') {
    mtuHop(c, hops, r.device, null);
  }
}

/** 1. Where the packet comes from. `judgeForwarding`: the kernel forwards it, so ip_forward matters. */
function sourceHop(c: Context, hops: Hop[], src: Classified, judgeForwarding: boolean): void {
  const { f } = c;
  const { packet } = f;
  const broken = judgeForwarding && f.ipForward === false;
  let where =
    src.cls === 'node'
      ? 'an address of this node (locally generated)'
      : src.cls === 'local-pod'
        ? `a pod of this node (lease ${c.leaseName(src.lease) ?? String(c.subnet)})`
        : src.cls === 'remote-pod'
          ? `a pod of lease ${c.leaseName(src.lease)} (node ${String(src.lease && publicOf(src.lease, c.family))})`
          : src.cls === 'cluster'
            ? `inside the cluster network ${String(c.network)}${c.leasesKnown ? ' but in no lease' : ''}`
            : 'outside the cluster network';
  // On ovs a pod's or a peer's packet enters the bridge, not the kernel.
  const t = c.backend === 'ovs' ? f.ovs?.trace : null;
  const noPod = t?.entry === 'pod' && f.ovs?.pods && !f.ovs.pods.some((p) => p.ip.equals(packet.src));
  if (noPod) where = `in this node's subnet ${String(c.subnet)} but no pod port on ${f.ovs?.bridge ?? 'br-int'} has it`;
  const bridge = f.ovs?.bridge ?? 'br-int';
  let ingress = f.ingress;
  let enters = f.ingress ? `enters on ${f.ingress}` : null;
  if (t?.entry === 'pod') {
    ingress = t.inPortName;
    enters = t.inPortName ? `enters ${bridge} on ${noPod ? 'pod port ' : ''}${t.inPortName} (ofport ${String(t.inPort)})` : `enters ${bridge} from a pod port`;
  } else if (t?.entry === 'tunnel') {
    ingress = t.inPortName ?? TUNNEL_PORT_NAME;
    enters = `enters ${bridge} from the tunnel ${ingress}${src.lease ? ` (VXLAN from ${String(publicOf(src.lease, c.family))})` : ''}`;
  }
  let summary = `${packet.src.toString()} is ${where}`;
  if (enters) summary += `, ${enters}`;
  if (broken) summary += `; IP forwarding is off on this node, so forwarded packets are dropped`;
  hops.push({
    kind: 'source',
    status: broken ? 'broken' : src.cls === 'cluster' && c.leasesKnown ? 'warning' : 'ok',
    summary,
    evidence: { address: packet.src.toString(), class: src.cls, lease: c.leaseNameOf(src), ingress, ipForward: f.ipForward },
  });
}

/**
 * 2. The kernel's route. Returns it when the path goes on, null when the hop is broken (the
 * analysis stops there). `forwardingOff`: the packet is forwarded by a node with ip_forward off.
 */
function routeHop(c: Context, hops: Hop[], dst: Classified, forwardingOff: boolean): OkRoute | null {
  const { packet } = c.f;
  const r = c.f.route;
  const dLease = dst.lease;
  const dSubnet = dLease ? subnetOf(dLease, c.family) : null;
  const dPublic = dLease ? publicOf(dLease, c.family) : null;
  const routeEvidence = {
    destination: packet.dst.toString(),
    destinationClass: dst.cls,
    lease: c.leaseNameOf(dst),
    leasePublicIP: dPublic ? dPublic.toString() : null,
  };
  if (!r.ok) {
    hops.push({
      kind: 'route',
      status: 'broken',
      summary: `no route to ${packet.dst.toString()}: ${r.error}`,
      evidence: { ...routeEvidence, type: null, prefix: null, gateway: null, device: null, protocol: null, weftOwned: false, nexthopId: null, onlink: false, expected: null },
    });
    return null;
  }
  const egress = c.link(r.device);
  const isVxlanDev = egress?.kind === 'vxlan';
  let status: Hop['status'] = 'ok';
  let expected: string | null = null;
  const notes: string[] = [];
  if (['blackhole', 'unreachable', 'prohibit', 'throw'].includes(r.type)) {
    status = 'broken';
    notes.push(`the packet is dropped (${r.type} route)`);
  } else if (r.type === 'local') {
    notes.push('delivered to this node');
  } else if (dst.cls === 'remote-pod' && dLease && dSubnet) {
    const peerBackend = dLease.attrs.backendType ?? '';
    const viaTunnel = `${dSubnet.toString()} via ${dSubnet.ip.toString()} dev ${egress?.kind === 'vxlan' ? egress.name : 'flannel.<VNI>'} onlink`;
    const viaHost = `${dSubnet.toString()} via ${String(dPublic)}`;
    // ovs: the peer's gateway on the gateway port, answered by the bridge's ARP responder.
    const viaBridge = `${dSubnet.toString()} via ${gatewayOf(dSubnet).toString()} dev ${GATEWAY_PORT_NAME} onlink`;
    const wanted =
      c.backend === 'host-gw'
        ? [viaHost]
        : c.backend === 'vxlan'
          ? [viaTunnel, `${viaHost} (DirectRouting)`]
          : c.backend === 'ovs'
            ? [viaBridge]
            : [dSubnet.toString()];
    const gwOk =
      c.backend === 'host-gw'
        ? r.gateway !== null && dPublic !== null && r.gateway.equals(dPublic)
        : c.backend === 'vxlan'
          ? (isVxlanDev && r.gateway !== null && r.gateway.equals(dSubnet.ip)) || (r.gateway !== null && dPublic !== null && r.gateway.equals(dPublic))
          : c.backend === 'ovs'
            ? r.device === GATEWAY_PORT_NAME && r.gateway !== null && r.gateway.equals(gatewayOf(dSubnet))
            : true;
    if (!r.prefix.equals(dSubnet)) {
      status = 'broken';
      expected = wanted.join(' or ');
      notes.push(`no route for lease ${dSubnet.toString()} (node ${String(dPublic)}): the packet follows ${describeRoute(r)} instead; expected ${expected}`);
    } else if (!gwOk) {
      status = 'broken';
      expected = wanted.join(' or ');
      notes.push(`the route does not lead to lease ${dSubnet.toString()}'s node ${String(dPublic)}; expected ${expected}`);
    } else {
      notes.push(`lease ${dSubnet.toString()} of node ${String(dPublic)}`);
      if (r.protocol !== WEFT_PROTOCOL) {
        status = 'warning';
        notes.push(`not programmed by weft (proto ${String(r.protocol)}, weft uses ${WEFT_PROTOCOL})`);
      }
    }
    if (c.backend && peerBackend !== c.backend) {
      if (status === 'ok') status = 'warning';
      notes.push(`the peer's lease uses backend "${peerBackend}", this node "${c.backend}"`);
    }
  } else if (dst.cls === 'local-pod') {
    if (c.subnet && !(r.prefix.equals(c.subnet) && r.gateway === null)) {
      status = 'warning';
      expected = `${c.subnet.toString()} dev ${c.f.bridge?.name ?? (c.backend === 'ovs' ? GATEWAY_PORT_NAME : 'cni0')}`;
      notes.push(`a pod of this node, but not through this node's subnet route (expected ${expected})`);
    } else {
      notes.push('a pod of this node');
    }
  } else if (dst.cls === 'cluster') {
    status = c.leasesKnown ? 'warning' : 'info';
    notes.push(c.leasesKnown ? `inside the cluster network ${String(c.network)} but no lease has it` : `inside the cluster network ${String(c.network)} (leases unknown)`);
  } else if (dst.cls === 'external') {
    notes.push('leaves the cluster network');
  }
  if (forwardingOff && r.type !== 'local' && status !== 'broken') {
    status = 'broken';
    notes.push('IP forwarding is off on this node, so the kernel drops the packet instead of routing it');
  }
  hops.push({
    kind: 'route',
    status,
    summary: `${describeRoute(r)}${notes.length ? `: ${notes.join('; ')}` : ''}`,
    evidence: {
      ...routeEvidence,
      type: r.type,
      prefix: r.prefix.toString(),
      gateway: r.gateway ? r.gateway.toString() : null,
      device: r.device,
      protocol: r.protocol,
      weftOwned: r.protocol === WEFT_PROTOCOL,
      nexthopId: r.nexthopId,
      onlink: r.onlink,
      expected,
    },
  });
  return status === 'broken' ? null : r;
}

// ---------------------------------------------------------------------------------------------
// The ovs backend: the bridge's pipeline as ofproto/trace walks it

/**
 * A pod's packet, or one out of the tunnel, meets the bridge first and reaches the kernel only if
 * the bridge hands it to the gateway port; the host's (or a forwarded) packet meets the kernel's
 * route first and the bridge only if that route leaves through the gateway port.
 */
function ovsPath(c: Context, hops: Hop[], src: Classified, dst: Classified, forwarded: boolean): void {
  const f = c.f;
  const o = f.ovs;
  if (!o) {
    hops.push({
      kind: 'backend',
      status: 'unsupported',
      summary: `ovs backend: the bridge was not traced (${c.family === 6 ? 'the ovs backend carries no IPv6' : 'no Open vSwitch facts'})`,
      evidence: { type: 'ovs', supported: false },
    });
    return;
  }
  const t = o.trace;
  if (t && (t.entry === 'pod' || t.entry === 'tunnel')) {
    const path = bridgeHops(c, hops, o, t, dst);
    // Done unless the bridge hands the packet to the host on purpose (a lease without flows is broken there).
    if (path?.action !== 'gateway' || hops.at(-1)?.status === 'broken') return;
    // From here on the kernel routes it like any packet arriving on weft-gw0.
    const r = routeHop(c, hops, dst, forwarded && f.ipForward === false);
    if (!r) return;
    if (r.type !== 'local') {
      if (r.gateway && r.device && r.device !== GATEWAY_PORT_NAME) nexthopHop(c, hops, r.device, r.gateway, dst.lease, null);
      if (r.device && r.device !== GATEWAY_PORT_NAME) mtuHop(c, hops, r.device, null);
    }
    addRuleHops(c, hops, src.cls, dst.cls, r, forwarded);
    return;
  }
  const r = routeHop(c, hops, dst, false);
  if (!r) return;
  if (r.type !== 'local') {
    if (r.device === GATEWAY_PORT_NAME) {
      // The peer's gateway is answered by the bridge's ARP responder; the peer's flow rewrites the MAC anyway.
      if (r.gateway) nexthopHop(c, hops, r.device, r.gateway, dst.lease, dst.cls === 'remote-pod' ? `the bridge's ARP responder answers ${GLOBAL_VIRTUAL_MAC}` : null);
      if (t) bridgeHops(c, hops, o, t, dst);
      else pipelineError(hops, o, null, `the route leaves through ${GATEWAY_PORT_NAME}, but the bridge was not traced`);
    } else {
      plainEgressHops(c, hops, r, dst);
    }
  }
  addRuleHops(c, hops, src.cls, dst.cls, r, forwarded);
}

function pipelineError(hops: Hop[], o: OvsFacts, t: OvsTraceFacts | null, why: string): void {
  hops.push({
    kind: 'pipeline',
    status: 'broken',
    summary: `cannot trace the packet through ${o.bridge}: ${why}`,
    evidence: {
      bridge: o.bridge,
      datapath: o.datapath,
      runDir: o.runDir,
      entry: t?.entry ?? null,
      inPort: t?.inPort ?? null,
      inPortName: t?.inPortName ?? null,
      flow: t?.flow ?? null,
      tables: [],
      datapathActions: null,
      trace: t?.output ?? null,
      error: why,
    },
  });
}

const headerOf = (flow: string | null, field: string): string | null => (flow ? (new RegExp(`(?:^|,)${field}=([^,]+)`).exec(flow)?.[1] ?? null) : null);

/** The bridge's hops: the tables passed, the spoof guard (pod and gateway ports), the output. */
function bridgeHops(c: Context, hops: Hop[], o: OvsFacts, t: OvsTraceFacts, dst: Classified): OvsPath | null {
  if (t.output === null) {
    pipelineError(hops, o, t, t.error ?? o.error ?? 'ofproto/trace gave no output');
    return null;
  }
  let parsed: OfTrace;
  try {
    parsed = parseOfTrace(t.output);
  } catch (e) {
    pipelineError(hops, o, t, (e as Error).message);
    return null;
  }
  const pods = o.pods ?? [];
  const peerLease = (net: IPAddr) => c.leaseName(c.f.leases.find((l) => subnetOf(l, 4)?.ip.equals(net)) ?? null);
  const path = summarizeOvsTrace(parsed, { tunnel: o.tunnelPort, gateway: o.gatewayPort, pods: new Set(pods.map((p) => p.ofport)) }, peerLease);
  const portName = (ofport: number | null): string | null =>
    ofport === null ? null : ofport === o.tunnelPort ? TUNNEL_PORT_NAME : ofport === o.gatewayPort ? GATEWAY_PORT_NAME : (pods.find((p) => p.ofport === ofport)?.name ?? null);
  const { packet } = c.f;

  // The tables.
  {
    const steps = path.tables.map((s) => {
      const owner = s.owner && s.owner !== 'node' ? ` [${s.owner}]` : '';
      const miss = s.match === null ? ' [no match]' : '';
      return `${s.name}${owner}${miss}`;
    });
    let summary = `${o.bridge} in_port ${String(t.inPort)} (${String(t.inPortName)}): ${steps.join(' -> ')}`;
    if (t.note) summary += `; ${t.note}`;
    hops.push({
      kind: 'pipeline',
      status: 'ok',
      summary,
      evidence: {
        bridge: o.bridge,
        datapath: o.datapath,
        runDir: o.runDir,
        entry: t.entry,
        inPort: t.inPort,
        inPortName: t.inPortName,
        flow: t.flow,
        tables: path.tables,
        datapathActions: path.datapathActions,
        trace: t.output,
        error: null,
      },
    });
  }

  // The spoof guard: what a pod port may send from (the gateway port, the host, may send from anything).
  if (t.entry !== 'tunnel' && t.inPort !== null) {
    const pod = t.entry === 'pod' ? (pods.find((p) => p.ofport === t.inPort) ?? null) : null;
    const srcMac = headerOf(t.flow, 'dl_src');
    const where = `${String(t.inPortName)} (ofport ${t.inPort})`;
    const verdict = path.spoofGuard === 'not-applied' ? 'pass' : path.spoofGuard;
    let status: Hop['status'] = 'ok';
    let summary: string;
    if (verdict === 'pass') {
      summary = pod
        ? `${packet.src.toString()} from ${String(srcMac)} on ${where} passes: the address and MAC of its pod`
        : `from the gateway port ${where}: the host may send from any address`;
    } else if (verdict === 'drop' && pod && !pod.ip.equals(packet.src)) {
      status = 'broken';
      summary = `dropped: ${where} may send only from its pod's ${pod.ip.toString()} / ${pod.mac}, not from ${packet.src.toString()} (a pod using an address it was not given)`;
    } else if (verdict === 'drop') {
      status = 'broken';
      summary = `dropped: no spoof-guard flow lets ${packet.src.toString()} from ${String(srcMac)} out of ${where}${pod ? `, its own pod's port: the pod's flows are missing (weftd rebuilds them from the port's external_ids on its next pass)` : ''}`;
    } else {
      status = 'broken';
      const at = path.droppedIn !== null ? `${tableName(path.droppedIn)} (table ${path.droppedIn})` : 'an earlier table';
      summary = `not reached: the packet is dropped in ${at} before the spoof guard (no classifier flow for in_port ${t.inPort}?)`;
    }
    hops.push({
      kind: 'spoofguard',
      status,
      summary,
      evidence: {
        inPort: t.inPort,
        port: t.inPortName,
        verdict,
        allowedIP: pod ? pod.ip.toString() : null,
        allowedMac: pod ? pod.mac : null,
        src: packet.src.toString(),
        srcMac,
      },
    });
    if (status === 'broken') return path;
  }

  // The output.
  {
    const dLease = dst.cls === 'remote-pod' ? dst.lease : null;
    const expectedDst = dLease ? publicOf(dLease, c.family) : null;
    const expectedVni = dLease ? (o.vni ?? vniOfLease(dLease)) : null;
    const outName = portName(path.outputPort);
    const at = `${String(outName ?? 'port')} (ofport ${String(path.outputPort)})`;
    const dstPod = pods.find((p) => p.ip.equals(packet.dst)) ?? null;
    const isGatewayIP = c.subnet !== null && gatewayOf(c.subnet).equals(packet.dst);
    let status: Hop['status'] = 'ok';
    let summary: string;
    let matches: boolean | null = null;
    if (path.action === 'drop') {
      status = 'broken';
      const table = path.droppedIn;
      summary = `dropped in ${table !== null ? `${tableName(table)} (table ${table})` : 'the pipeline'}`;
      if (t.entry === 'tunnel' && table === TABLES.classifier) summary += `: no classifier flow for tun_id ${String(headerOf(t.flow, 'tun_id'))} on the tunnel port (a VNI other than this node's?)`;
      else if (dst.cls === 'local-pod' && !dstPod) summary += `: no pod port on ${o.bridge} has ${packet.dst.toString()}`;
    } else if (path.action === 'tunnel') {
      const tun = path.tunnelDst;
      summary = `into the tunnel ${at}: tun_dst ${String(tun)}, vni ${String(path.vni)}`;
      if (expectedDst && tun) {
        matches = tun.equals(expectedDst) && (expectedVni === null || path.vni === expectedVni);
        if (!tun.equals(expectedDst)) {
          status = 'broken';
          const owner = c.leaseByPublicIP(tun);
          summary += `, but lease ${String(c.leaseName(dLease))} is at ${expectedDst.toString()}${owner ? ` (${tun.toString()} is lease ${String(c.leaseName(owner))}'s node)` : ' (a stale peer flow?)'}`;
        } else if (expectedVni !== null && path.vni !== expectedVni) {
          status = 'broken';
          summary += `, but the VNI is ${expectedVni}`;
        } else {
          summary += `: the public IP of lease ${String(c.leaseName(dLease))}`;
        }
      } else if (dst.cls !== 'remote-pod') {
        status = 'broken';
        summary += `, although ${packet.dst.toString()} is in no other node's lease`;
      }
      if (status !== 'broken' && path.tunnelFailure) {
        // Native tunnelling resolves the remote end itself; the packet that finds no entry is lost.
        const miss = /cache miss/i.test(path.tunnelFailure);
        status = miss ? 'warning' : 'broken';
        summary += `; ${path.tunnelFailure}${miss ? ' (this packet is lost; the next one goes out once the node answers)' : ''}`;
      } else if (status !== 'broken') {
        const via = path.tunnelNotes.find((n) => n.startsWith('tunneling to '));
        if (via) summary += `; ${via}`;
      }
    } else if (path.action === 'gateway') {
      summary = `to the host through ${at}`;
      if (dLease) {
        status = 'broken';
        summary += `: ${o.bridge} has no flow for lease ${String(c.leaseName(dLease))} (node ${String(expectedDst)}), so the packet goes to the host instead of into the tunnel`;
      } else if (dst.cls === 'local-pod' && !isGatewayIP) {
        status = 'broken';
        summary += dstPod ? `, not to ${dstPod.name}, the port of pod ${packet.dst.toString()}` : `: no pod port on ${o.bridge} has ${packet.dst.toString()}`;
      } else {
        summary += dst.cls === 'node' || isGatewayIP ? ': an address of this node' : ': the kernel routes it on';
      }
    } else if (path.action === 'pod') {
      const pod = pods.find((p) => p.ofport === path.outputPort) ?? null;
      summary = `to ${at}, the port of pod ${String(pod?.ip)}`;
      if (!pod || !pod.ip.equals(packet.dst)) {
        status = 'broken';
        summary += dstPod ? `, not to ${dstPod.name} (ofport ${dstPod.ofport}) of ${packet.dst.toString()}` : `; no pod port on ${o.bridge} has ${packet.dst.toString()}`;
      }
    } else {
      status = 'warning';
      summary = `to ${at}, a port that is neither a pod's, the gateway nor the tunnel`;
    }
    hops.push({
      kind: 'ovs-output',
      status,
      summary,
      evidence: {
        action: path.action,
        outputPort: path.outputPort,
        outputPortName: outName,
        droppedIn: path.droppedIn,
        tunnelDst: path.tunnelDst ? path.tunnelDst.toString() : null,
        vni: path.vni,
        lease: c.leaseName(dLease),
        expectedTunnelDst: expectedDst ? expectedDst.toString() : null,
        expectedVni,
        tunnelMatchesLease: path.action === 'tunnel' ? matches : null,
        tunnelNotes: path.tunnelNotes,
      },
    });
  }
  return path;
}

function vniOfLease(l: Lease): number | null {
  const data = l.attrs.backendData;
  if (!data || typeof data !== 'object' || Array.isArray(data)) return null;
  return typeof data.VNI === 'number' ? data.VNI : null;
}

function vxlanHops(c: Context, hops: Hop[], dev: LinkInfo, gateway: IPAddr, lease: Lease | null): void {
  const f = c.f;
  const expectedMac = lease ? vtepMacOf(lease, c.family) : null;
  const leaseName = c.leaseName(lease);
  const n = f.neighbours.find((x) => x.ip.equals(gateway)) ?? null;
  const bad = n !== null && (n.mac === null || (n.state & (NUD.FAILED | NUD.INCOMPLETE)) !== 0);
  {
    let status: Hop['status'] = 'ok';
    let summary: string;
    if (!n || bad) {
      status = 'broken';
      summary = `${n ? `neighbour entry ${gateway.toString()} on ${dev.name} is ${neighState(n)}` : `no neighbour entry for ${gateway.toString()} on ${dev.name}`}: the inner frame has no destination MAC and the packet is dropped${expectedMac ? ` (lease ${leaseName} publishes VtepMAC ${expectedMac}; weftd re-adds it on its next reconcile)` : ''}`;
    } else if (expectedMac && n.mac !== expectedMac) {
      status = 'broken';
      summary = `${gateway.toString()} lladdr ${String(n.mac)} on ${dev.name}, but lease ${leaseName} publishes VtepMAC ${expectedMac}`;
    } else {
      summary = `${gateway.toString()} lladdr ${String(n.mac)} ${neighState(n)} on ${dev.name}${expectedMac ? `: the VtepMAC of lease ${leaseName}` : ''}`;
      if (!n.permanent) {
        status = 'warning';
        summary += '; not a permanent entry (weft programs permanent ones)';
      }
    }
    hops.push({
      kind: 'neighbour',
      status,
      summary,
      evidence: { device: dev.name, address: gateway.toString(), mac: n?.mac ?? null, state: n ? neighState(n) : null, expectedMac },
    });
  }

  const mac = n?.mac ?? expectedMac;
  if (!mac) return;
  const vni = dev.vxlan?.vni ?? null;
  const port = dev.vxlan?.port ?? null;
  const entries = f.fdb.filter((e) => e.mac === mac && e.dst !== null);
  const expectedRemote = lease ? publicOf(lease, c.family) : null;
  const e = entries.find((x) => expectedRemote !== null && x.dst!.equals(expectedRemote)) ?? entries[0] ?? null;
  const owner = e?.dst ? c.leaseByPublicIP(e.dst) : null;
  {
    let status: Hop['status'] = 'ok';
    let summary: string;
    const where = `on ${dev.name} (vni ${String(vni)}, port ${String(port)})`;
    if (!e || !e.dst) {
      status = 'broken';
      summary = `no FDB entry for ${mac} ${where}: the kernel does not know which node to send the VXLAN packet to${expectedRemote ? ` (lease ${leaseName} is at ${expectedRemote.toString()})` : ''}`;
    } else if (!owner && !c.leasesKnown) {
      status = 'info';
      summary = `${mac} dst ${e.dst.toString()} ${where} (leases unknown: whose public IP this is was not checked)`;
    } else if (!owner) {
      status = 'broken';
      summary = `${mac} dst ${e.dst.toString()} ${where}: no lease has public IP ${e.dst.toString()} (a stale entry of a node that left?)`;
    } else if (lease && owner !== lease) {
      status = 'broken';
      summary = `${mac} dst ${e.dst.toString()} ${where} points at the node of lease ${c.leaseName(owner)}, but lease ${leaseName} is at ${String(expectedRemote)}`;
    } else {
      summary = `${mac} dst ${e.dst.toString()} ${where}: public IP of lease ${c.leaseName(owner)}`;
      if (entries.length > 1) {
        status = 'warning';
        summary += `; ${entries.length} entries for this MAC (${entries.map((x) => x.dst!.toString()).join(', ')})`;
      }
    }
    hops.push({
      kind: 'fdb',
      status,
      summary,
      evidence: {
        device: dev.name,
        mac,
        remoteIP: e?.dst ? e.dst.toString() : null,
        vni,
        port,
        lease: c.leaseName(owner),
        expectedRemoteIP: expectedRemote ? expectedRemote.toString() : null,
      },
    });
  }

  let underlayDev: string | null = null;
  if (e?.dst) {
    const u = f.underlay.get(e.dst.toString());
    const remote = e.dst.toString();
    if (!u) {
      hops.push({ kind: 'underlay', status: 'info', summary: `route to ${remote} not looked up`, evidence: { remoteIP: remote, port, device: null, gateway: null, source: null } });
    } else if (!u.ok || u.type !== 'unicast') {
      hops.push({
        kind: 'underlay',
        status: 'broken',
        summary: `the VXLAN packet to ${remote}:${String(port)} cannot leave: ${u.ok ? `${u.type} route` : u.error}`,
        evidence: { remoteIP: remote, port, device: u.ok ? u.device : null, gateway: u.ok && u.gateway ? u.gateway.toString() : null, source: null },
      });
    } else {
      underlayDev = u.device;
      const via = u.gateway ? ` via ${u.gateway.toString()}` : '';
      hops.push({
        kind: 'underlay',
        status: 'ok',
        summary: `VXLAN packet to ${remote}:${String(port)} leaves${via} dev ${String(u.device)}${u.prefsrc ? ` from ${u.prefsrc.toString()}` : ''}`,
        evidence: { remoteIP: remote, port, device: u.device, gateway: u.gateway ? u.gateway.toString() : null, source: u.prefsrc ? u.prefsrc.toString() : null },
      });
    }
  }
  mtuHop(c, hops, dev.name, underlayDev);
}

/** `answeredBy`: who answers ARP for the next hop when nobody has yet (ovs: the bridge's ARP responder, for a peer's gateway). */
function nexthopHop(c: Context, hops: Hop[], device: string, gateway: IPAddr, lease: Lease | null, answeredBy: string | null): void {
  const n = c.f.neighbours.find((x) => x.ip.equals(gateway)) ?? null;
  const failed = n !== null && (n.state & NUD.FAILED) !== 0;
  const owner = c.leaseByPublicIP(gateway);
  let summary = `next hop ${gateway.toString()} on ${device}`;
  if (owner) summary += ` (public IP of lease ${c.leaseName(owner)})`;
  else if (answeredBy && lease) summary += ` (gateway of lease ${c.leaseName(lease)})`;
  summary += n ? `: lladdr ${String(n.mac)} ${neighState(n)}` : `: not resolved yet (ARP/ND on the first packet${answeredBy ? `; ${answeredBy}` : ''})`;
  if (failed) summary += `; ${gateway.toString()} does not answer ARP/ND`;
  hops.push({
    kind: 'nexthop',
    status: failed ? 'broken' : n ? 'ok' : 'info',
    summary,
    evidence: { device, gateway: gateway.toString(), mac: n?.mac ?? null, state: n ? neighState(n) : null, lease: c.leaseName(owner ?? lease) },
  });
}

/** cni0 must not exceed the egress device; a VXLAN device plus its overhead must fit the underlay. */
function mtuHop(c: Context, hops: Hop[], device: string, underlay: string | null): void {
  const dev = c.link(device);
  if (!dev) return;
  const bridge = c.f.bridge;
  const under = c.link(underlay);
  const envMtu = c.f.env?.mtu ?? null;
  const problems: string[] = [];
  if (bridge && bridge.mtu > dev.mtu) problems.push(`MTU mismatch: ${bridge.name} MTU ${bridge.mtu} > ${dev.name} MTU ${dev.mtu}; pods send packets ${dev.name} cannot carry`);
  if (dev.kind === 'vxlan' && under && dev.mtu + VXLAN_OVERHEAD[c.family] > under.mtu) {
    problems.push(`${dev.name} MTU ${dev.mtu} + ${VXLAN_OVERHEAD[c.family]} bytes of VXLAN exceeds ${under.name} MTU ${under.mtu}`);
  }
  if (envMtu !== null && dev.kind === 'vxlan' && envMtu > dev.mtu) problems.push(`subnet.env FLANNEL_MTU=${envMtu} > ${dev.name} MTU ${dev.mtu}: new pods get too large an MTU`);
  const parts = [bridge ? `${bridge.name} ${bridge.mtu}` : null, `${dev.name} ${dev.mtu}`, under ? `${under.name} ${under.mtu}` : null].filter((x): x is string => x !== null);
  hops.push({
    kind: 'mtu',
    status: problems.length > 0 ? 'broken' : 'ok',
    summary: problems.length > 0 ? problems.join('; ') : `MTU ${parts.join(', ')}${envMtu !== null ? ` (subnet.env ${envMtu})` : ''}: consistent`,
    evidence: {
      bridge: bridge?.name ?? null,
      bridgeMtu: bridge?.mtu ?? null,
      device: dev.name,
      deviceMtu: dev.mtu,
      underlay: under?.name ?? null,
      underlayMtu: under?.mtu ?? null,
      subnetEnvMtu: envMtu,
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Masquerade and forward rules

interface LiveRules {
  readonly nat: ReturnType<typeof parseXtTable> | null;
  readonly natSave: ReturnType<typeof parseSave> | null;
  readonly filterSave: ReturnType<typeof parseSave> | null;
  readonly nft: ListedTable | null;
  readonly fullyRandom: boolean;
}

function readLive(c: Context): LiveRules {
  const r = c.f.rules;
  let nft: ListedTable | null = null;
  try {
    nft = r.nft ? parseListTable(r.nft) : null;
  } catch {
    nft = null;
  }
  const natSave = r.iptablesNat !== null ? parseSave(r.iptablesNat) : null;
  // The daemon probes --random-fully; whatever it wrote is the model's choice.
  const fullyRandom =
    r.mode === 'iptables'
      ? (natSave?.appends.some((l) => l.startsWith(`-A ${CHAIN_NAMES.masq.chain} `) && l.includes('--random-fully')) ?? true)
      : nft
        ? [...nft.rules.values()].flat().some((e) => JSON.stringify(e).includes('fully-random'))
        : true;
  return {
    nat: r.iptablesNat !== null ? parseXtTable(r.iptablesNat) : null,
    natSave,
    filterSave: r.iptablesFilter !== null ? parseSave(r.iptablesFilter) : null,
    nft,
    fullyRandom,
  };
}

function modelRuleText(c: Context, kind: ChainKind, rule: Rule): string {
  const n = CHAIN_NAMES[kind];
  return c.f.rules.mode === 'iptables' ? `-A ${n.chain} ${ruleSpec(rule, n.comment)}` : ruleText(c.family, rule);
}

function chainLabel(c: Context, kind: ChainKind): string {
  const n = CHAIN_NAMES[kind];
  if (c.f.rules.mode === 'iptables') return n.chain;
  const t = nftTable(c.family);
  return `${t.family} ${t.name} ${n.nftChain}`;
}

/** The keeper's problem lines, said from trace's side (trace removes nothing). */
const asFinding = (p: string): string => p.replace(/: not wanted, removing$/, ': present although not wanted');

/**
 * Live check of one chain against the model: iptables read back per table, nft per whole table.
 * `unwanted`: weft's chains that must not be there (flannel's chain in agent mode and the other way round).
 */
function liveCheck(
  c: Context,
  live: LiveRules,
  kind: ChainKind,
  spec: ChainSpec | null,
  nftWant: readonly ChainSpec[],
  unwanted: readonly ChainKind[] = [],
): { state: LiveState; problems: string[] } {
  const r = c.f.rules;
  if (r.mode === 'iptables') {
    const save = CHAIN_NAMES[kind].table === 'nat' ? live.natSave : live.filterSave;
    if (!save) return { state: 'unknown', problems: [] };
    const plan = planTable(CHAIN_NAMES[kind].table, spec ? [spec] : [], spec ? unwanted : [kind, ...unwanted], save);
    if (plan.problems.length === 0) return { state: spec ? 'present' : 'not-applicable', problems: [] };
    const missing = plan.problems.some((p) => p.endsWith('chain missing') || / jump to \S+ missing$/.test(p));
    return { state: missing ? 'missing' : 'differs', problems: plan.problems.map(asFinding) };
  }
  if (r.nft === null && r.errors.some((e) => e.startsWith('nft'))) return { state: 'unknown', problems: [] };
  const name = CHAIN_NAMES[kind].nftChain;
  // Problems of this chain, and those of the table as a whole.
  const chainNames = Object.values(CHAIN_NAMES).map((n) => n.nftChain).join('|');
  const other = new RegExp(`(/|chain )(${chainNames})\\b`);
  const mine = (p: string) => p.includes(`/${name}:`) || p.includes(`chain ${name} `) || p.endsWith(`chain ${name}`);
  const theirs = (p: string) => unwanted.some((k) => p.endsWith(`unexpected chain ${CHAIN_NAMES[k].nftChain}`));
  const problems = compareTable(c.family, nftWant, live.nft).filter((p) => mine(p) || theirs(p) || !other.test(p));
  if (problems.length === 0) return { state: spec ? 'present' : 'not-applicable', problems: [] };
  const missing = problems.some((p) => /(^table .* missing|chain \S+ missing)$/.test(p));
  return { state: missing ? 'missing' : 'differs', problems: problems.map(asFinding) };
}

/** What ip-masq-agent mode's chain says, read from the live rules (its config file is the daemon's, not trace's). */
interface AgentModel {
  /** The model rebuilt with the live chain's CIDRs: the shape (order, cluster network, MASQUERADE last) is checked, not the config. */
  readonly spec: ChainSpec;
  /** The destinations the live chain returns for, in order; null when the chain is missing. */
  readonly returns: readonly IPNet[] | null;
}

function agentModel(c: Context, live: LiveRules, network: IPNet): AgentModel {
  const family = c.family;
  let returns: IPNet[] | null = null;
  let fullyRandom = true;
  if (c.f.rules.mode === 'iptables') {
    const chain = live.nat?.chains.get(CHAIN_NAMES.agent.chain);
    if (chain) {
      returns = chain.filter((r) => r.target === 'RETURN' && r.unknown.length === 0 && r.conds.length === 1 && r.conds[0]!.kind === 'dst' && !r.conds[0]!.negate).map((r) => (r.conds[0] as { net: IPNet }).net);
      const masq = chain.find((r) => r.target === 'MASQUERADE');
      if (masq) fullyRandom = masq.text.includes('--random-fully');
    }
  } else if (live.nft) {
    const rules = parseNftChain(live.nft, CHAIN_NAMES.agent.nftChain, family);
    if (rules) {
      returns = rules.filter((r) => r.verdict === 'RETURN' && r.conds?.length === 1 && r.conds[0]!.kind === 'dst' && !r.conds[0]!.negate).map((r) => (r.conds![0] as { net: IPNet }).net);
      const masq = rules.find((r) => r.verdict === 'MASQUERADE');
      if (masq) fullyRandom = masq.fullyRandom;
    }
  }
  const linkLocal = LINK_LOCAL[family];
  const configured = (returns ?? []).filter((n) => !n.equals(network) && !n.equals(linkLocal));
  const masqLinkLocal = returns !== null && !returns.some((n) => n.equals(linkLocal));
  const rules = agentRules(network, { nonMasqueradeCIDRs: configured, masqLinkLocal, masqLinkLocalIPv6: masqLinkLocal }, fullyRandom);
  return { spec: { family, kind: 'agent', rules }, returns };
}

function addRuleHops(c: Context, hops: Hop[], srcCls: AddressClass, dstCls: AddressClass, r: Extract<RouteLookup, { ok: true }>, forwarded: boolean): void {
  if (r.type === 'local') return; // delivered here: no POSTROUTING, no FORWARD
  if (!c.network || !c.subnet) {
    hops.push({
      kind: 'masquerade',
      status: 'warning',
      summary: `cannot evaluate the masquerade rules: the cluster network or this node's subnet is unknown (no subnet.env at ${c.f.subnetFile}?)`,
      evidence: emptyMasq(c),
    });
    return;
  }
  const live = readLive(c);
  const input = [{ network: c.network, subnet: c.subnet }];
  const agentMode = c.f.env?.ipMasqMode === 'agent';
  const masqEnabled = c.f.env?.ipMasq ?? null;
  // Only the daemon knows --iptables-forward-rules; a chain that is there says "on", a missing one proves nothing.
  const fwdPresent = c.f.rules.mode === 'iptables' ? live.filterSave?.chains.has(CHAIN_NAMES.forward.chain) : live.nft?.chains.some((x) => x.name === CHAIN_NAMES.forward.nftChain);
  const fwdEnabled = c.f.rules.forwardRules ?? (fwdPresent ? true : null);
  const specs = desiredChains({ families: input, masq: !agentMode && masqEnabled !== false, forward: fwdEnabled !== false, fullyRandom: live.fullyRandom });
  const masqSpec = agentMode || masqEnabled === false ? null : (specs.find((s) => s.kind === 'masq') ?? null);
  const agent = agentMode ? agentModel(c, live, c.network) : null;
  const fwdSpec = fwdEnabled === false ? null : (specs.find((s) => s.kind === 'forward') ?? null);
  const nftWant = [masqSpec, agent?.spec ?? null, fwdSpec].filter((s): s is ChainSpec => s !== null);
  const packet: RulePacket = { src: c.f.packet.src, dst: c.f.packet.dst, proto: c.f.packet.proto, dport: c.f.packet.dport, iif: c.f.ingress, oif: r.device, mark: 0, dstLocal: false };

  if (agent) agentMasqHop(c, hops, live, agent, nftWant, packet, srcCls, dstCls, r);
  else flannelMasqHop(c, hops, live, masqSpec, nftWant, packet, srcCls, dstCls, r, masqEnabled);

  // Forward.
  if (forwarded) {
    const chain = chainLabel(c, 'forward');
    const rules = forwardRules(c.network);
    const m = firstModelMatch(rules, packet);
    const check = liveCheck(c, live, 'forward', fwdSpec, nftWant);
    const ev: ForwardEvidence = {
      mode: c.f.rules.mode,
      enabled: fwdEnabled,
      verdict: fwdEnabled !== false && m ? 'ACCEPT' : 'none',
      chain,
      rule: fwdEnabled !== false ? (m?.index ?? null) : null,
      ruleText: fwdEnabled !== false && m ? modelRuleText(c, 'forward', m.rule) : null,
      live: fwdEnabled === false ? 'not-applicable' : check.state,
      liveProblems: check.problems,
    };
    if (fwdEnabled === false) {
      hops.push({ kind: 'forward', status: 'info', summary: `weft's forward rules are off (--iptables-forward-rules=false): the FORWARD chain's own rules and policy decide`, evidence: ev });
    } else if (fwdEnabled === null && check.state === 'missing') {
      hops.push({ kind: 'forward', status: 'warning', summary: `no weft forward rules in ${chain}: off (--iptables-forward-rules=false) or deleted; the daemon did not say which`, evidence: ev });
    } else if (check.problems.length > 0) {
      hops.push({ kind: 'forward', status: 'broken', summary: `forward rules differ from the model: ${check.problems.join('; ')}`, evidence: ev });
    } else if (m) {
      hops.push({ kind: 'forward', status: 'ok', summary: `accepted by rule ${m.index} of ${chain}: ${modelRuleText(c, 'forward', m.rule)} (live: ${check.state})`, evidence: ev });
    } else {
      hops.push({ kind: 'forward', status: 'info', summary: `not cluster traffic: no rule of ${chain} accepts it; the FORWARD chain's other rules and policy decide`, evidence: ev });
    }
  }
}

const inCluster = (cls: AddressClass) => cls === 'local-pod' || cls === 'remote-pod' || cls === 'cluster';

/** flannel's --ip-masq chain (FLANNEL-POSTRTG / postrtg). */
function flannelMasqHop(
  c: Context,
  hops: Hop[],
  live: LiveRules,
  masqSpec: ChainSpec | null,
  nftWant: readonly ChainSpec[],
  packet: RulePacket,
  srcCls: AddressClass,
  dstCls: AddressClass,
  r: Extract<RouteLookup, { ok: true }>,
  masqEnabled: boolean | null,
): void {
  const network = c.network!;
  const subnet = c.subnet!;
  const rules = masqRules(network, subnet, IPNet.parse(MULTICAST[c.family]), live.fullyRandom);
  const m = firstModelMatch(rules, packet);
  const check = liveCheck(c, live, 'masq', masqSpec, nftWant, ['agent']);
  const decision = liveDecision(c, live, packet, network, subnet, 'masq');
  const verdict = m ? (m.rule.verdict as 'MASQUERADE' | 'RETURN') : 'none';
  const toSource = c.firstAddress(r.device);
  const problems: string[] = [];
  const nat = decision.verdict === 'MASQUERADE' || decision.verdict === 'SNAT';
  if (nat && inCluster(srcCls) && inCluster(dstCls)) {
    problems.push(`masquerade would hide pod IP ${c.f.packet.src.toString()} from ${c.f.packet.dst.toString()} inside the cluster (${decision.label})`);
  }
  if (masqEnabled !== false && check.problems.length > 0) problems.push(`live rules differ from the model: ${check.problems.join('; ')}`);
  else if (masqEnabled !== false && decision.verdict !== 'unknown' && (verdict === 'MASQUERADE') !== nat) {
    problems.push(`the model says ${verdict === 'MASQUERADE' ? 'masquerade' : 'no masquerade'} but the live rules ${nat ? `masquerade (${decision.label})` : 'do not'}`);
  }
  let summary: string;
  const chain = chainLabel(c, 'masq');
  let leftover = false;
  if (masqEnabled === false) {
    leftover = check.problems.length > 0;
    summary = `masquerade is off (FLANNEL_IPMASQ=false)`;
    if (leftover) summary += `, but weft's masquerade rules are still there (${check.problems.join('; ')})`;
    if (nat) summary += `; the live rules NAT it (${decision.label})`;
  } else if (m && verdict === 'MASQUERADE') {
    summary = `masqueraded${toSource ? ` to ${toSource.toString()}` : ''} by rule ${m.index} of ${chain}: ${modelRuleText(c, 'masq', m.rule)}`;
  } else if (m) {
    summary = `not masqueraded: rule ${m.index} of ${chain} returns: ${modelRuleText(c, 'masq', m.rule)}`;
  } else {
    summary = `not masqueraded: no rule of ${chain} matches`;
  }
  if (masqEnabled !== false) summary += ` (live: ${check.state})`;
  if (problems.length > 0) summary += `; ${problems.join('; ')}`;
  hops.push({
    kind: 'masquerade',
    status: problems.length > 0 ? 'broken' : leftover ? 'warning' : 'ok',
    summary,
    evidence: {
      mode: c.f.rules.mode,
      ipMasqMode: 'flannel',
      nonMasqueradeCIDRs: null,
      matchedCIDR: null,
      enabled: masqEnabled,
      verdict: masqEnabled === false ? 'none' : verdict,
      chain,
      rule: masqEnabled === false ? null : (m?.index ?? null),
      ruleText: masqEnabled === false || !m ? null : modelRuleText(c, 'masq', m.rule),
      live: masqEnabled === false ? 'not-applicable' : check.state,
      liveProblems: check.problems,
      liveVerdict: decision.verdict,
      liveChain: decision.chain,
      liveRule: decision.index,
      liveRuleText: decision.text,
      unevaluated: decision.unevaluated,
      toSource: toSource ? toSource.toString() : null,
    },
  });
}

/**
 * ip-masq-agent mode (WEFT_IPMASQ=agent): WEFT-IP-MASQ returns for link-local, the cluster network and
 * each nonMasqueradeCIDR, and masquerades the rest; only non-local destinations enter it.
 */
function agentMasqHop(
  c: Context,
  hops: Hop[],
  live: LiveRules,
  agent: AgentModel,
  nftWant: readonly ChainSpec[],
  packet: RulePacket,
  srcCls: AddressClass,
  dstCls: AddressClass,
  r: Extract<RouteLookup, { ok: true }>,
): void {
  const network = c.network!;
  const dst = c.f.packet.dst;
  const chain = chainLabel(c, 'agent');
  const check = liveCheck(c, live, 'agent', agent.spec, nftWant, ['masq']);
  const decision = liveDecision(c, live, packet, network, c.subnet!, 'agent');
  const m = firstModelMatch(agent.spec.rules, packet);
  // The nft chain starts with "fib daddr type local return" (the iptables jump carries that test instead).
  const offset = c.f.rules.mode === 'nftables' ? 1 : 0;
  const verdict = m ? (m.rule.verdict as 'MASQUERADE' | 'RETURN') : 'none';
  const matchNet = m?.rule.matches[0]?.kind === 'dst' ? m.rule.matches[0].net : null;
  const toSource = c.firstAddress(r.device);
  const nat = decision.verdict === 'MASQUERADE' || decision.verdict === 'SNAT';
  const problems: string[] = [];
  const notes: string[] = [];
  let summary: string;
  if (agent.returns === null) {
    summary = `ip-masq-agent mode (WEFT_IPMASQ=agent), but ${chain} is missing: weft masquerades nothing, and the nonMasqueradeCIDRs of weftd's --ip-masq-config file are unknown here`;
    if (check.problems.length > 0) problems.push(`live rules differ from the model: ${check.problems.join('; ')}`);
  } else {
    const what = !matchNet
      ? null
      : matchNet.equals(network)
        ? `the cluster network ${matchNet.toString()}`
        : matchNet.equals(LINK_LOCAL[c.family])
          ? `link-local ${matchNet.toString()}`
          : `nonMasqueradeCIDR ${matchNet.toString()}`;
    if (m && verdict === 'MASQUERADE') {
      summary = `masqueraded${toSource ? ` to ${toSource.toString()}` : ''} by rule ${m.index + offset} of ${chain}: ${modelRuleText(c, 'agent', m.rule)}: ${dst.toString()} is in none of its ${agent.returns.length} non-masquerade CIDRs`;
    } else if (m) {
      summary = `not masqueraded: ${dst.toString()} is in ${String(what)}: rule ${m.index + offset} of ${chain} returns: ${modelRuleText(c, 'agent', m.rule)}`;
    } else {
      summary = `not masqueraded: no rule of ${chain} matches`;
    }
    summary += ` (ip-masq-agent mode, live: ${check.state})`;
    if (check.problems.length > 0) problems.push(`live rules differ from the model: ${check.problems.join('; ')}`);
    else if (decision.verdict !== 'unknown' && (verdict === 'MASQUERADE') !== nat) {
      problems.push(`the chain says ${verdict === 'MASQUERADE' ? 'masquerade' : 'no masquerade'} but the live rules ${nat ? `masquerade (${decision.label})` : 'do not'}`);
    }
  }
  if (nat && inCluster(srcCls) && inCluster(dstCls)) {
    problems.push(`masquerade would hide pod IP ${c.f.packet.src.toString()} from ${dst.toString()} inside the cluster (${decision.label})`);
  }
  if (c.f.rules.mode === 'iptables' && live.natSave?.chains.has(FOREIGN_AGENT_CHAIN)) {
    notes.push(`a real ip-masq-agent's chain ${FOREIGN_AGENT_CHAIN} is there too (it runs before or after weft's, whichever jump comes first)`);
  }
  if (problems.length > 0) summary += `; ${problems.join('; ')}`;
  if (notes.length > 0) summary += `; ${notes.join('; ')}`;
  hops.push({
    kind: 'masquerade',
    status: problems.length > 0 ? 'broken' : notes.length > 0 ? 'warning' : 'ok',
    summary,
    evidence: {
      mode: c.f.rules.mode,
      ipMasqMode: 'agent',
      nonMasqueradeCIDRs: agent.returns ? agent.returns.map((n) => n.toString()) : null,
      matchedCIDR: verdict === 'RETURN' && matchNet ? matchNet.toString() : null,
      enabled: c.f.env?.ipMasq ?? null,
      verdict,
      chain,
      rule: m ? m.index + offset : null,
      ruleText: m ? modelRuleText(c, 'agent', m.rule) : null,
      live: check.state,
      liveProblems: check.problems,
      liveVerdict: decision.verdict,
      liveChain: decision.chain,
      liveRule: decision.index,
      liveRuleText: decision.text,
      unevaluated: decision.unevaluated,
      toSource: toSource ? toSource.toString() : null,
    },
  });
}

interface LiveDecision {
  readonly verdict: MasqueradeEvidence['liveVerdict'];
  readonly chain: string | null;
  readonly index: number | null;
  readonly text: string | null;
  readonly label: string;
  readonly unevaluated: string[];
}

/**
 * What the live rules do: nat POSTROUTING (iptables, whoever wrote it), then weft's nft chain in
 * nftables mode (`kind`: flannel's postrtg, or ip-masq-agent mode's chain).
 */
function liveDecision(c: Context, live: LiveRules, p: RulePacket, network: IPNet, subnet: IPNet, kind: 'masq' | 'agent'): LiveDecision {
  const unevaluated: string[] = [];
  const nft = c.f.rules.mode === 'nftables';
  const of = (verdict: LiveDecision['verdict'], chain: string | null, index: number | null, text: string | null): LiveDecision => ({
    verdict,
    chain,
    index,
    text,
    label: index !== null ? `rule ${index} of ${String(chain)}: ${String(text)}` : 'no rule',
    unevaluated,
  });
  if (live.nat) {
    const d = evalXtChain(live.nat, 'POSTROUTING', p);
    unevaluated.push(...d.unevaluated.map((u) => u.text));
    const rule = d.rule ?? d.returnedBy;
    const verdict = d.verdict === 'none' ? (d.returnedBy ? 'RETURN' : 'none') : d.verdict === 'DROP' ? 'ACCEPT' : d.verdict;
    // In nftables mode only a NAT done by someone's iptables rules matters; weft's own table follows.
    if (!nft || verdict === 'MASQUERADE' || verdict === 'SNAT') return of(verdict, rule?.chain ?? null, rule?.index ?? null, rule?.text ?? null);
  }
  if (nft && live.nft) {
    const chain = chainLabel(c, kind);
    if (kind === 'agent') {
      const rules = parseNftChain(live.nft, CHAIN_NAMES.agent.nftChain, c.family) ?? [];
      const d = evalNftRules(rules, p);
      unevaluated.push(...d.unevaluated.map((i) => `rule ${i} of ${chain}`));
      const verdict = d.verdict === 'MASQUERADE' ? 'MASQUERADE' : d.verdict === 'RETURN' ? 'RETURN' : 'none';
      return of(verdict, d.rule ? chain : null, d.rule?.index ?? null, d.rule?.text ?? null);
    }
    const multicast = IPNet.parse(MULTICAST[c.family]);
    const candidates = [true, false].flatMap((fr) => masqRules(network, subnet, multicast, fr));
    const d = evalNftChain(live.nft, CHAIN_NAMES.masq.nftChain, c.family, candidates, p);
    unevaluated.push(...d.unevaluated.map((i) => `rule ${i} of ${chain}`));
    const verdict = d.verdict === 'MASQUERADE' ? 'MASQUERADE' : d.verdict === 'RETURN' ? 'RETURN' : 'none';
    return of(verdict, d.index !== null ? chain : null, d.index, d.rule ? ruleText(c.family, d.rule) : null);
  }
  return live.nat || (nft && c.f.rules.nft === null && !c.f.rules.errors.some((e) => e.startsWith('nft'))) ? of('none', null, null, null) : of('unknown', null, null, null);
}

function emptyMasq(c: Context): MasqueradeEvidence {
  const agent = c.f.env?.ipMasqMode === 'agent';
  return {
    mode: c.f.rules.mode,
    ipMasqMode: agent ? 'agent' : 'flannel',
    nonMasqueradeCIDRs: null,
    matchedCIDR: null,
    enabled: c.f.env?.ipMasq ?? null,
    verdict: 'none',
    chain: chainLabel(c, agent ? 'agent' : 'masq'),
    rule: null,
    ruleText: null,
    live: 'unknown',
    liveProblems: [],
    liveVerdict: 'unknown',
    liveChain: null,
    liveRule: null,
    liveRuleText: null,
    unevaluated: [],
    toSource: null,
  };
}

function finish(c: Context, hops: Hop[]): TraceReport {
  const f = c.f;
  const broken = hops.filter((h) => h.status === 'broken');
  const verdict = broken.length > 0 ? 'broken' : hops.some((h) => h.status === 'unsupported') ? 'incomplete' : 'ok';
  const pub = c.ownLease ? publicOf(c.ownLease, c.family) : null;
  return {
    kind: TRACE_KIND,
    version: TRACE_VERSION,
    packet: { src: f.packet.src.toString(), dst: f.packet.dst.toString(), proto: f.packet.proto, dport: f.packet.dport },
    node: {
      subnet: c.subnet ? c.subnet.toString() : null,
      network: c.network ? c.network.toString() : null,
      publicIP: pub ? pub.toString() : null,
      backend: c.backend,
      leaseSource: f.leaseSource,
      subnetFile: f.subnetFile,
    },
    verdict,
    hops,
    problems: broken.map((h) => `${h.kind}: ${h.summary}`),
    notes: [...f.notes],
  };
}
