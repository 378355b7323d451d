// The path of one packet through this node, hop by hop, from the facts collected on the node: the
// matching route and whose lease it serves, the VXLAN neighbour and FDB entries (or the host-gw next
// hop), the ovs backend's bridge as ofproto/trace walks it (tables, spoof guard, output), MTUs, and
// the masquerade (flannel's chain or ip-masq-agent mode's) and forward decisions on weft's rule
// model cross-checked against the live rules, and (--network-policy) which NetworkPolicy allows
// or drops it. Pure: facts in, report out.
//
// This module walks the path and gives the verdict; the hops live in route-hops.ts (the kernel's
// route, neighbour, FDB, next hop, MTU), ovs-hops.ts (the ovs bridge) and rule-hops.ts
// (masquerade and forward), over the node's context in context.ts.
import { TUNNEL_PORT_NAME } from '../../backend/ovs/bridge.js';
import { Context, publicOf, type Classified } from './context.js';
import { ovsPath } from './ovs-hops.js';
import { policyHops } from './policy-hops.js';
import { plainEgressHops, routeHop, vxlanHops } from './route-hops.js';
import { addRuleHops } from './rule-hops.js';
import { TRACE_KIND, TRACE_VERSION, type Hop, type TraceFacts, type TraceReport } from './types.js';

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

function finish(c: Context, hops: Hop[]): TraceReport {
  const f = c.f;
  policyHops(f.policy, f.packet, hops);
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
