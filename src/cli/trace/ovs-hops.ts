// The ovs backend's part of the path: the bridge's pipeline as ofproto/trace walks it (tables, spoof
// guard, output), and where the kernel's route hands the packet to the bridge or takes it from it.
import { GATEWAY_PORT_NAME, TUNNEL_PORT_NAME } from '../../backend/ovs/bridge.js';
import { gatewayOf, GLOBAL_VIRTUAL_MAC, TABLES } from '../../backend/ovs/pipeline.js';
import type { Lease } from '../../subnet/lease.js';
import { errorMessage } from '../../util/errors.js';
import type { IPAddr } from '../../util/ip.js';
import { publicOf, subnetOf, type Classified, type Context } from './context.js';
import { parseOfTrace, summarizeOvsTrace, tableName, type OfTrace, type OvsPath } from './ovs.js';
import { mtuHop, nexthopHop, plainEgressHops, routeHop } from './route-hops.js';
import { addRuleHops } from './rule-hops.js';
import type { Hop, OvsFacts, OvsTraceFacts } from './types.js';

/**
 * A pod's packet, or one out of the tunnel, meets the bridge first and reaches the kernel only if
 * the bridge hands it to the gateway port; the host's (or a forwarded) packet meets the kernel's
 * route first and the bridge only if that route leaves through the gateway port.
 */
export function ovsPath(c: Context, hops: Hop[], src: Classified, dst: Classified, forwarded: boolean): void {
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
      conntrack: null,
      policy: [],
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
    pipelineError(hops, o, t, errorMessage(e));
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
    const steps = path.tables.map((s, i) => {
      const owner = s.owner && s.owner !== 'node' ? ` [${s.owner}]` : '';
      const miss = s.match === null ? ' [no match]' : '';
      // The pipeline resumed after conntrack, as the trace followed it.
      const resumed = i > 0 && s.recirc !== null && path.tables[i - 1]!.recirc !== s.recirc ? `ct(${path.conntrack?.ctState ?? `recirc ${s.recirc}`}) -> ` : '';
      return `${resumed}${s.name}${owner}${miss}`;
    });
    let summary = `${o.bridge} in_port ${String(t.inPort)} (${String(t.inPortName)}): ${steps.join(' -> ')}`;
    if (path.conntrack && path.conntrack.recirc === null) summary += `; the trace does not follow the conntrack recirculation of table ${path.conntrack.table}`;
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
        conntrack: path.conntrack,
        policy: path.policy,
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
      const policyDrop = path.policy.find((p) => p.verdict === 'drop' && p.table === table);
      if (policyDrop) {
        const pod = headerOf(policyDrop.match, policyDrop.direction === 'egress' ? 'nw_src' : 'nw_dst');
        summary += policyDrop.table === TABLES.egressDefaultRule || policyDrop.table === TABLES.ingressDefaultRule
          ? `: the NetworkPolicy default deny of ${pod ? `pod ${pod}` : 'the pod'} (${policyDrop.direction}; cookie ${String(policyDrop.cookie)})`
          : `: no flow of the ${policyDrop.direction} rules matched`;
      } else if (table === TABLES.conntrackState) summary += ': conntrack finds the packet invalid';
      else if (path.conntrack?.recirc === null && table === path.conntrack.table) summary += ': the trace does not follow the conntrack recirculation';
      else if (t.entry === 'tunnel' && table === TABLES.classifier) summary += `: no classifier flow for tun_id ${String(headerOf(t.flow, 'tun_id'))} on the tunnel port (a VNI other than this node's?)`;
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
