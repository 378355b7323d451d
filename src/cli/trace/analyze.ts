// The path of one packet through this node, hop by hop, from the facts collected on the node: the
// matching route and whose lease it serves, the VXLAN neighbour and FDB entries (or the host-gw next
// hop), MTUs, and the masquerade and forward decisions on weft's rule model cross-checked against
// the live rules. Pure: facts in, report out.
import { parseSave, planTable, ruleSpec } from '../../ipmasq/iptables.js';
import { CHAIN_NAMES, desiredChains, forwardRules, masqRules, type ChainSpec, type Rule } from '../../ipmasq/model.js';
import { compareTable, nftTable, parseListTable, ruleText, type ListedTable } from '../../ipmasq/nftables.js';
import { NUD, type LinkInfo, type NeighEntry } from '../../netlink/index.js';
import type { JsonValue, Lease } from '../../subnet/lease.js';
import { IPNet, type Family, type IPAddr } from '../../util/ip.js';
import { evalNftChain, evalXtChain, firstModelMatch, parseXtTable, type RulePacket } from './rules.js';
import {
  TRACE_KIND,
  TRACE_VERSION,
  type AddressClass,
  type ForwardEvidence,
  type Hop,
  type LiveState,
  type MasqueradeEvidence,
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
    this.backend = this.ownLease?.attrs.backendType ?? f.daemonBackend ?? f.config?.backendType ?? null;
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

export function analyze(f: TraceFacts): TraceReport {
  const c = new Context(f);
  const hops: Hop[] = [];
  const { packet } = f;
  const src = c.classify(packet.src);
  const dst = c.classify(packet.dst);
  const forwarded = src.cls !== 'node';

  // 1. Where the packet comes from.
  {
    const broken = forwarded && f.ipForward === false;
    const where =
      src.cls === 'node'
        ? 'an address of this node (locally generated)'
        : src.cls === 'local-pod'
          ? `a pod of this node (lease ${c.leaseName(src.lease) ?? String(c.subnet)})`
          : src.cls === 'remote-pod'
            ? `a pod of lease ${c.leaseName(src.lease)} (node ${String(src.lease && publicOf(src.lease, c.family))})`
            : src.cls === 'cluster'
              ? `inside the cluster network ${String(c.network)}${c.leasesKnown ? ' but in no lease' : ''}`
              : 'outside the cluster network';
    let summary = `${packet.src.toString()} is ${where}`;
    if (f.ingress) summary += `, enters on ${f.ingress}`;
    if (broken) summary += `; IP forwarding is off on this node, so forwarded packets are dropped`;
    hops.push({
      kind: 'source',
      status: broken ? 'broken' : src.cls === 'cluster' && c.leasesKnown ? 'warning' : 'ok',
      summary,
      evidence: { address: packet.src.toString(), class: src.cls, lease: c.leaseNameOf(src), ingress: f.ingress, ipForward: f.ipForward },
    });
  }

  // 2. The route.
  const r = f.route;
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
    return finish(c, hops);
  }
  const egress = c.link(r.device);
  const isVxlanDev = egress?.kind === 'vxlan';
  {
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
      const wanted =
        c.backend === 'host-gw' ? [viaHost] : c.backend === 'vxlan' ? [viaTunnel, `${viaHost} (DirectRouting)`] : [dSubnet.toString()];
      const gwOk =
        c.backend === 'host-gw'
          ? r.gateway !== null && dPublic !== null && r.gateway.equals(dPublic)
          : c.backend === 'vxlan'
            ? (isVxlanDev && r.gateway !== null && r.gateway.equals(dSubnet.ip)) || (r.gateway !== null && dPublic !== null && r.gateway.equals(dPublic))
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
        expected = `${c.subnet.toString()} dev ${f.bridge?.name ?? 'cni0'}`;
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
    if (r.type === 'local' || status === 'broken') {
      if (status !== 'broken') addRuleHops(c, hops, src.cls, dst.cls, r, forwarded);
      return finish(c, hops);
    }
  }

  // 3. The backend's part of the path.
  if (c.backend === 'ovs') {
    hops.push({ kind: 'backend', status: 'unsupported', summary: 'ovs backend: not supported by this version', evidence: { type: 'ovs', supported: false } });
  } else if (isVxlanDev && egress && r.gateway) {
    vxlanHops(c, hops, egress, r.gateway, dLease);
  } else if (r.gateway && r.device) {
    nexthopHop(c, hops, r.device, r.gateway, dLease);
    mtuHop(c, hops, r.device, null);
  } else if (r.device && dst.cls !== 'local-pod') {
    mtuHop(c, hops, r.device, null);
  }

  addRuleHops(c, hops, src.cls, dst.cls, r, forwarded);
  return finish(c, hops);
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

function nexthopHop(c: Context, hops: Hop[], device: string, gateway: IPAddr, lease: Lease | null): void {
  const n = c.f.neighbours.find((x) => x.ip.equals(gateway)) ?? null;
  const failed = n !== null && (n.state & NUD.FAILED) !== 0;
  const owner = c.leaseByPublicIP(gateway);
  let summary = `next hop ${gateway.toString()} on ${device}`;
  if (owner) summary += ` (public IP of lease ${c.leaseName(owner)})`;
  summary += n ? `: lladdr ${String(n.mac)} ${neighState(n)}` : ': not resolved yet (ARP/ND on the first packet)';
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

function modelRuleText(c: Context, kind: 'masq' | 'forward', rule: Rule): string {
  const n = CHAIN_NAMES[kind];
  return c.f.rules.mode === 'iptables' ? `-A ${n.chain} ${ruleSpec(rule, n.comment)}` : ruleText(c.family, rule);
}

function chainLabel(c: Context, kind: 'masq' | 'forward'): string {
  const n = CHAIN_NAMES[kind];
  if (c.f.rules.mode === 'iptables') return n.chain;
  const t = nftTable(c.family);
  return `${t.family} ${t.name} ${n.nftChain}`;
}

/** The keeper's problem lines, said from trace's side (trace removes nothing). */
const asFinding = (p: string): string => p.replace(/: not wanted, removing$/, ': present although not wanted');

/** Live check of one chain against the model: iptables read back per table, nft per whole table. */
function liveCheck(c: Context, live: LiveRules, kind: 'masq' | 'forward', spec: ChainSpec | null, nftWant: readonly ChainSpec[]): { state: LiveState; problems: string[] } {
  const r = c.f.rules;
  if (r.mode === 'iptables') {
    const save = kind === 'masq' ? live.natSave : live.filterSave;
    if (!save) return { state: 'unknown', problems: [] };
    const plan = planTable(CHAIN_NAMES[kind].table, spec ? [spec] : [], spec ? [] : [kind], save);
    if (plan.problems.length === 0) return { state: spec ? 'present' : 'not-applicable', problems: [] };
    const missing = plan.problems.some((p) => p.endsWith('chain missing') || / jump to \S+ missing$/.test(p));
    return { state: missing ? 'missing' : 'differs', problems: plan.problems.map(asFinding) };
  }
  if (r.nft === null && r.errors.some((e) => e.startsWith('nft'))) return { state: 'unknown', problems: [] };
  const name = CHAIN_NAMES[kind].nftChain;
  // Problems of this chain, and those of the table as a whole.
  const chainNames = Object.values(CHAIN_NAMES).map((n) => n.nftChain).join('|');
  const other = new RegExp(`(/|chain )(${chainNames})\\b`);
  const problems = compareTable(c.family, nftWant, live.nft).filter((p) => p.includes(`/${name}:`) || p.includes(`chain ${name} `) || p.endsWith(`chain ${name}`) || !other.test(p));
  if (problems.length === 0) return { state: spec ? 'present' : 'not-applicable', problems: [] };
  const missing = problems.some((p) => /(^table .* missing|chain \S+ missing)$/.test(p));
  return { state: missing ? 'missing' : 'differs', problems: problems.map(asFinding) };
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
  const masqEnabled = c.f.env?.ipMasq ?? null;
  // Only the daemon knows --iptables-forward-rules; a chain that is there says "on", a missing one proves nothing.
  const fwdPresent = c.f.rules.mode === 'iptables' ? live.filterSave?.chains.has(CHAIN_NAMES.forward.chain) : live.nft?.chains.some((x) => x.name === CHAIN_NAMES.forward.nftChain);
  const fwdEnabled = c.f.rules.forwardRules ?? (fwdPresent ? true : null);
  const specs = desiredChains({ families: input, masq: masqEnabled !== false, forward: fwdEnabled !== false, fullyRandom: live.fullyRandom });
  const masqSpec = masqEnabled === false ? null : (specs.find((s) => s.kind === 'masq') ?? null);
  const fwdSpec = fwdEnabled === false ? null : (specs.find((s) => s.kind === 'forward') ?? null);
  const nftWant = [masqSpec, fwdSpec].filter((s): s is ChainSpec => s !== null);
  const packet: RulePacket = { src: c.f.packet.src, dst: c.f.packet.dst, proto: c.f.packet.proto, dport: c.f.packet.dport, iif: c.f.ingress, oif: r.device, mark: 0 };

  // Masquerade.
  {
    const rules = masqRules(c.network, c.subnet, IPNet.parse(MULTICAST[c.family]), live.fullyRandom);
    const m = firstModelMatch(rules, packet);
    const check = liveCheck(c, live, 'masq', masqSpec, nftWant);
    const decision = liveDecision(c, live, packet, c.network, c.subnet);
    const verdict = m ? (m.rule.verdict as 'MASQUERADE' | 'RETURN') : 'none';
    const toSource = c.firstAddress(r.device);
    const inCluster = (cls: AddressClass) => cls === 'local-pod' || cls === 'remote-pod' || cls === 'cluster';
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

interface LiveDecision {
  readonly verdict: MasqueradeEvidence['liveVerdict'];
  readonly chain: string | null;
  readonly index: number | null;
  readonly text: string | null;
  readonly label: string;
  readonly unevaluated: string[];
}

/** What the live rules do: nat POSTROUTING (iptables, whoever wrote it), then weft's nft table in nftables mode. */
function liveDecision(c: Context, live: LiveRules, p: RulePacket, network: IPNet, subnet: IPNet): LiveDecision {
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
    const multicast = IPNet.parse(MULTICAST[c.family]);
    const candidates = [true, false].flatMap((fr) => masqRules(network, subnet, multicast, fr));
    const d = evalNftChain(live.nft, CHAIN_NAMES.masq.nftChain, c.family, candidates, p);
    const chain = chainLabel(c, 'masq');
    unevaluated.push(...d.unevaluated.map((i) => `rule ${i} of ${chain}`));
    const verdict = d.verdict === 'MASQUERADE' ? 'MASQUERADE' : d.verdict === 'RETURN' ? 'RETURN' : 'none';
    return of(verdict, d.index !== null ? chain : null, d.index, d.rule ? ruleText(c.family, d.rule) : null);
  }
  return live.nat || (nft && c.f.rules.nft === null && !c.f.rules.errors.some((e) => e.startsWith('nft'))) ? of('none', null, null, null) : of('unknown', null, null, null);
}

function emptyMasq(c: Context): MasqueradeEvidence {
  return {
    mode: c.f.rules.mode,
    enabled: c.f.env?.ipMasq ?? null,
    verdict: 'none',
    chain: chainLabel(c, 'masq'),
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
