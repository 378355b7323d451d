// The kernel's part of the path (the vxlan and host-gw backends, and the ovs backend where the kernel
// routes): the matching route and whose lease it serves, the VXLAN neighbour and FDB entries and the
// underlay route, a plain next hop, and the MTUs along the way.
import { GATEWAY_PORT_NAME } from '../../backend/ovs/bridge.js';
import { gatewayOf } from '../../backend/ovs/pipeline.js';
import { VXLAN_OVERHEAD } from '../../backend/mtu.js';
import { NUD, WEFT_ROUTE_PROTOCOL, type LinkInfo, type NeighEntry } from '../../netlink/index.js';
import { vtepMacOf, type Lease } from '../../subnet/lease.js';
import type { IPAddr } from '../../util/ip.js';
import { publicOf, subnetOf, type Classified, type Context, type OkRoute } from './context.js';
import type { Hop, RouteLookup } from './types.js';

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

/** A route out of a plain device: its next hop (if it has a gateway) and the device's MTU. */
export function plainEgressHops(c: Context, hops: Hop[], r: OkRoute, dst: Classified): void {
  if (r.gateway && r.device) {
    nexthopHop(c, hops, r.device, r.gateway, dst.lease, null);
    mtuHop(c, hops, r.device, null);
  } else if (r.device && dst.cls !== 'local-pod') {
    mtuHop(c, hops, r.device, null);
  }
}

/**
 * 2. The kernel's route. Returns it when the path goes on, null when the hop is broken (the
 * analysis stops there). `forwardingOff`: the packet is forwarded by a node with ip_forward off.
 */
export function routeHop(c: Context, hops: Hop[], dst: Classified, forwardingOff: boolean): OkRoute | null {
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
      if (r.protocol !== String(WEFT_ROUTE_PROTOCOL)) {
        status = 'warning';
        notes.push(`not programmed by weft (proto ${String(r.protocol)}, weft uses ${WEFT_ROUTE_PROTOCOL})`);
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
      weftOwned: r.protocol === String(WEFT_ROUTE_PROTOCOL),
      nexthopId: r.nexthopId,
      onlink: r.onlink,
      expected,
    },
  });
  return status === 'broken' ? null : r;
}

export function vxlanHops(c: Context, hops: Hop[], dev: LinkInfo, gateway: IPAddr, lease: Lease | null): void {
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
export function nexthopHop(c: Context, hops: Hop[], device: string, gateway: IPAddr, lease: Lease | null, answeredBy: string | null): void {
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
export function mtuHop(c: Context, hops: Hop[], device: string, underlay: string | null): void {
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
