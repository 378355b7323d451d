// The ovs backend's part of `weft trace`: which packet to hand to `ovs-appctl ofproto/trace`
// (in_port and the Ethernet addresses the packet really carries there), and what its output
// says — the tables passed, the spoof guard, and where the bridge sends the packet (a pod port,
// the gateway port, the tunnel with which tun_dst and VNI, or nowhere). Pure: text in, data out.
import { Category, GLOBAL_VIRTUAL_MAC, gatewayOf, macFromIP, TABLES } from '../../backend/ovs/pipeline.js';
import type { NeighEntry } from '../../netlink/index.js';
import type { Lease } from '../../subnet/lease.js';
import { IPAddr, type IPNet } from '../../util/ip.js';
import type { OvsEntry, OvsPodPortFacts, OvsTableStep, Packet, RouteLookup } from './types.js';

/** The pipeline's tables by number, as the summaries name them. */
export const TABLE_NAMES: ReadonlyMap<number, string> = new Map([
  [TABLES.classifier, 'classifier'],
  [TABLES.spoofGuard, 'spoof guard'],
  [TABLES.arpResponder, 'ARP responder'],
  [TABLES.l3Forwarding, 'L3 forwarding'],
  [TABLES.l2Forwarding, 'L2 forwarding'],
  [TABLES.output, 'output'],
]);

export function tableName(table: number): string {
  return TABLE_NAMES.get(table) ?? `table ${table}`;
}

// ---------------------------------------------------------------------------------------------
// Which packet to trace

export interface OvsEntryInput {
  readonly packet: Packet;
  /** The source is one of this node's addresses. */
  readonly srcIsNode: boolean;
  /** This node's lease subnet. */
  readonly subnet: IPNet | null;
  /** Another node's lease whose subnet holds the source. */
  readonly srcLease: Lease | null;
  /** The kernel's route for the packet (used when the host sends it). */
  readonly route: RouteLookup;
  /** The gateway port's device name (weft-gw0). */
  readonly gatewayDevice: string;
}

/**
 * Where the packet meets the bridge first: a pod of this node sends into its port; a pod of
 * another node arrives through the tunnel; anything else (the host, the outside) meets the bridge
 * only when the kernel routes it out of the gateway port. null: it never passes the bridge here.
 */
export function ovsEntry(i: OvsEntryInput): OvsEntry | null {
  const src = i.packet.src;
  if (!i.srcIsNode && i.subnet?.contains(src)) return 'pod';
  if (!i.srcIsNode && i.srcLease) return 'tunnel';
  const r = i.route;
  if (r.ok && r.type === 'unicast' && r.device === i.gatewayDevice) return 'gateway';
  return null;
}

export interface OvsPlanInput extends OvsEntryInput {
  readonly entry: OvsEntry;
  /** This node's public IP (the tunnel's local end). */
  readonly publicIP: IPAddr | null;
  readonly pods: readonly OvsPodPortFacts[];
  readonly gatewayMac: string;
  readonly tunnelPort: number;
  readonly gatewayPort: number;
  readonly vni: number;
  /** The kernel's neighbours on the gateway device. */
  readonly neighbours: readonly NeighEntry[];
}

export interface OvsPlan {
  readonly inPort: number | null;
  readonly inPortName: string | null;
  readonly flow: string | null;
  readonly note: string | null;
  /** Why no packet can be traced (no pod port to send from). */
  readonly error: string | null;
}

const headers = (p: Packet, dlSrc: string, dlDst: string): string =>
  `ip,dl_src=${dlSrc},dl_dst=${dlDst},nw_src=${p.src.toString()},nw_dst=${p.dst.toString()},nw_ttl=64`;

/**
 * The ofproto/trace flow for the packet as it enters at `entry`: the ports' real MACs, the MAC the
 * sender resolved for its next hop (the gateway's for a pod, the ARP responder's virtual MAC for a
 * peer gateway, a local pod's own), and for the tunnel the headers a peer's flows write.
 */
export function planOvsTrace(i: OvsPlanInput): OvsPlan {
  const { packet: p } = i;
  const podOf = (ip: IPAddr) => i.pods.find((x) => x.ip.equals(ip)) ?? null;
  const none = (error: string): OvsPlan => ({ inPort: null, inPortName: null, flow: null, note: null, error });
  const gwIP = i.subnet ? gatewayOf(i.subnet) : null;
  if (i.entry === 'pod') {
    let pod = podOf(p.src);
    let note: string | null = null;
    if (!pod) {
      // A pod sending from an address it was not given: any pod port shows what the spoof guard does.
      pod = i.pods[0] ?? null;
      if (!pod) return none(`no pod port has ${p.src.toString()}, and there is no pod port to send it from`);
      note = `no pod port has ${p.src.toString()}: traced as sent by ${pod.name} (ofport ${pod.ofport}, pod ${pod.ip.toString()})`;
    }
    // Pods of one subnet reach each other directly (their own MACs); anything else goes to the gateway.
    const local = i.subnet?.contains(p.dst) && !(gwIP?.equals(p.dst) ?? false) ? podOf(p.dst) : null;
    const dlDst = local ? local.mac : i.gatewayMac;
    return { inPort: pod.ofport, inPortName: pod.name, flow: `in_port=${pod.ofport},${headers(p, pod.mac, dlDst)}`, note, error: null };
  }
  if (i.entry === 'tunnel') {
    const lease = i.srcLease;
    const peerNet = lease?.subnet ?? null;
    if (!lease || !peerNet) return none(`no lease holds ${p.src.toString()}: unknown which node would tunnel it here`);
    // What a peer's flows write: its gateway's MAC as source, the virtual MAC as destination.
    const tun = [`tun_id=0x${i.vni.toString(16)}`, `tun_src=${lease.attrs.publicIP.toString()}`, ...(i.publicIP ? [`tun_dst=${i.publicIP.toString()}`] : [])];
    const flow = `in_port=${i.tunnelPort},${tun.join(',')},${headers(p, macFromIP(gatewayOf(peerNet)), GLOBAL_VIRTUAL_MAC)}`;
    return { inPort: i.tunnelPort, inPortName: 'weft-tun0', flow, note: null, error: null };
  }
  // The host (or a packet it forwards) sends out of the gateway port to the route's next hop.
  const r = i.route;
  let dlDst: string | null = null;
  let note: string | null = null;
  if (r.ok && r.gateway) {
    const gw = r.gateway;
    const n = i.neighbours.find((x) => x.ip.equals(gw) && x.mac !== null);
    if (n?.mac) dlDst = n.mac;
    else {
      dlDst = GLOBAL_VIRTUAL_MAC;
      note = `no neighbour entry for ${gw.toString()} on ${i.gatewayDevice} yet: traced with ${GLOBAL_VIRTUAL_MAC}, what the ARP responder answers for a peer's gateway`;
    }
  } else {
    const pod = podOf(p.dst);
    const n = i.neighbours.find((x) => x.ip.equals(p.dst) && x.mac !== null);
    dlDst = pod?.mac ?? n?.mac ?? null;
    if (!dlDst) return none(`no pod port on the bridge has ${p.dst.toString()} and the kernel has no neighbour entry for it`);
  }
  return { inPort: i.gatewayPort, inPortName: i.gatewayDevice, flow: `in_port=${i.gatewayPort},${headers(p, i.gatewayMac, dlDst)}`, note, error: null };
}

// ---------------------------------------------------------------------------------------------
// Reading ofproto/trace

export interface OfTraceStep {
  readonly bridge: string;
  readonly table: number;
  /** The matching flow's match ('' for a catch-all flow); null for "No match.". */
  readonly match: string | null;
  readonly priority: number | null;
  readonly cookie: string | null;
  readonly actions: readonly string[];
  /** "->" detail and ">>" error lines printed under the actions, without their markers, in order. */
  readonly notes: readonly string[];
}

export interface OfTrace {
  /** The flow line ("Flow: ..."). */
  readonly flow: string | null;
  readonly steps: readonly OfTraceStep[];
  readonly finalFlow: string | null;
  readonly megaflow: string | null;
  readonly datapathActions: string | null;
}

export class OfTraceParseError extends Error {
  constructor(detail: string) {
    super(`cannot read ofproto/trace output: ${detail}`);
    this.name = 'OfTraceParseError';
  }
}

const BRIDGE_LINE = /^bridge\("([^"]+)"\)$/;
const TABLE_LINE = /^\s*(\d+)\. (.*)$/;
const FLOW_TAIL = /^(.*?)(?:, )?priority (\d+)(?:, cookie (0x[0-9a-f]+))?$/;

/** Parses OVS's ofproto/trace text (OVS 2.x/3.x layout: "bridge(...)", numbered tables, indented actions). */
export function parseOfTrace(text: string): OfTrace {
  const lines = text.split('\n');
  let flow: string | null = null;
  let finalFlow: string | null = null;
  let megaflow: string | null = null;
  let datapathActions: string | null = null;
  let bridge: string | null = null;
  const steps: Array<{ bridge: string; table: number; match: string | null; priority: number | null; cookie: string | null; actions: string[]; notes: string[] }> = [];
  for (const raw of lines) {
    const line = raw.trimEnd();
    const trimmed = line.trim();
    if (trimmed === '' || /^-+$/.test(trimmed)) continue;
    const field = /^(Flow|Final flow|Megaflow|Datapath actions): (.*)$/.exec(line);
    if (field) {
      const v = field[2]!.trim();
      if (field[1] === 'Flow') flow = v;
      else if (field[1] === 'Final flow') finalFlow = v;
      else if (field[1] === 'Megaflow') megaflow = v;
      else datapathActions = v;
      continue;
    }
    const b = BRIDGE_LINE.exec(trimmed);
    if (b) {
      bridge = b[1]!;
      continue;
    }
    const t = TABLE_LINE.exec(line);
    if (t && bridge !== null) {
      const rest = t[2]!.trim();
      if (/^No match\.?$/.test(rest)) {
        steps.push({ bridge, table: Number(t[1]), match: null, priority: null, cookie: null, actions: [], notes: [] });
        continue;
      }
      const m = FLOW_TAIL.exec(rest);
      steps.push({
        bridge,
        table: Number(t[1]),
        match: m ? m[1]!.trim() : rest,
        priority: m ? Number(m[2]) : null,
        cookie: m?.[3] ?? null,
        actions: [],
        notes: [],
      });
      continue;
    }
    const step = steps.at(-1);
    if (!step) continue;
    const note = /^(->|>>+)\s*(.*?)\s*(<<+)?$/.exec(trimmed);
    if (note) step.notes.push(note[2]!);
    else step.actions.push(trimmed);
  }
  if (flow === null && steps.length === 0) throw new OfTraceParseError(`no "Flow:" line and no tables in ${JSON.stringify(text.slice(0, 200))}`);
  return { flow, steps, finalFlow, megaflow, datapathActions };
}

/** Whose flow a cookie marks: weft's round << 48 | category << 40 | object id. */
export function cookieOwner(cookie: string | null, peerLease: (network: IPAddr) => string | null): string {
  if (cookie === null) return "not weft's";
  const c = BigInt(cookie);
  const round = c >> 48n;
  const category = Number((c >> 40n) & 0xffn) as Category;
  const id = c & 0xffffffffffn;
  if (round === 0n) return "not weft's";
  if (category === Category.Pipeline) return 'node';
  if (category === Category.Pod) return `pod ofport ${id.toString()}`;
  if (category === Category.Peer && id < 1n << 32n) {
    const net = IPAddr.of(4, id);
    return `peer ${peerLease(net) ?? net.toString()}`;
  }
  return "not weft's";
}

export interface OvsPath {
  /** The steps in the first bridge (the integration bridge). */
  readonly tables: readonly OvsTableStep[];
  readonly spoofGuard: 'pass' | 'drop' | 'not-reached' | 'not-applied';
  readonly action: 'pod' | 'gateway' | 'tunnel' | 'drop' | 'other';
  readonly outputPort: number | null;
  /** drop: the table whose flow dropped it (or that had no match). */
  readonly droppedIn: number | null;
  readonly tunnelDst: IPAddr | null;
  readonly vni: number | null;
  /** Lines ofproto/trace printed about the tunnel output. */
  readonly tunnelNotes: readonly string[];
  /** The tunnel output produced no packet (neighbour cache miss, no route): what OVS said. */
  readonly tunnelFailure: string | null;
  readonly datapathActions: string | null;
}

const SET_FIELD = /^set_field:([^-]+)->(\w+)$/;

/**
 * What the bridge does with the packet: the tables of the integration bridge (the first one the
 * trace shows; a native tunnel continues in br-phy), the spoof guard's verdict, and the output.
 */
export function summarizeOvsTrace(trace: OfTrace, ports: { tunnel: number; gateway: number; pods: ReadonlySet<number> }, peerLease: (network: IPAddr) => string | null): OvsPath {
  const first = trace.steps[0]?.bridge ?? null;
  const own = trace.steps.filter((s) => s.bridge === first);
  const tables: OvsTableStep[] = own.map((s) => ({
    table: s.table,
    name: tableName(s.table),
    match: s.match,
    priority: s.priority,
    cookie: s.cookie,
    owner: s.match === null ? null : cookieOwner(s.cookie, peerLease),
    actions: s.actions,
  }));
  const guard = own.find((s) => s.table === TABLES.spoofGuard);
  const dropped = (s: OfTraceStep) => s.match === null || s.actions.includes('drop');
  let spoofGuard: OvsPath['spoofGuard'];
  if (guard) spoofGuard = dropped(guard) ? 'drop' : 'pass';
  else if (own.some((s) => s.table > TABLES.spoofGuard)) spoofGuard = 'not-applied';
  else spoofGuard = 'not-reached';

  let outputPort: number | null = null;
  let tunnelDst: IPAddr | null = null;
  let vni: number | null = null;
  const tunnelNotes: string[] = [];
  let inTunnelNotes = false;
  for (const s of own) {
    for (const a of s.actions) {
      const sf = SET_FIELD.exec(a);
      if (sf?.[2] === 'tun_dst') tunnelDst = IPAddr.tryParse(sf[1]!) ?? tunnelDst;
      if (sf?.[2] === 'tun_id') vni = Number(sf[1]);
      const out = /^output:(\d+)$/.exec(a);
      if (out) outputPort = Number(out[1]);
    }
    for (const n of s.notes) {
      const port = /^output port is (\d+)$/.exec(n);
      if (port) outputPort = Number(port[1]);
      if (/tunnel|tunneling|neighbor cache|Not tunneling/i.test(n)) inTunnelNotes = true;
      if (inTunnelNotes) tunnelNotes.push(n);
    }
  }
  const dp = trace.datapathActions;
  let action: OvsPath['action'];
  let droppedIn: number | null = null;
  if (outputPort === null) {
    action = 'drop';
    droppedIn = own.filter(dropped).at(-1)?.table ?? own.at(-1)?.table ?? null;
  } else if (outputPort === ports.tunnel) action = 'tunnel';
  else if (outputPort === ports.gateway) action = 'gateway';
  else if (ports.pods.has(outputPort)) action = 'pod';
  else action = 'other';
  // The tunnel's own lines say when it made no packet; "Datapath actions" without a push or an output confirms it.
  let tunnelFailure: string | null = null;
  if (action === 'tunnel') {
    const failure = tunnelNotes.find((n) => /routing failed|cache miss|lacks Ethernet|decided against|Not tunneling|Nonexistent/i.test(n));
    const sent = dp !== null && /tnl_push|set\(tunnel|,\s*\d+\s*$|^\d+$/.test(dp);
    if (failure) tunnelFailure = failure;
    else if (dp !== null && !sent) tunnelFailure = `no tunnel packet in the datapath actions (${dp})`;
  }
  if (vni === null && dp) {
    const v = /vni=(0x[0-9a-f]+|\d+)/.exec(dp) ?? /tun_id=(0x[0-9a-f]+|\d+)/.exec(dp);
    if (v) vni = Number(v[1]);
  }
  return { tables, spoofGuard, action, outputPort, droppedIn, tunnelDst, vni, tunnelNotes, tunnelFailure, datapathActions: dp };
}
