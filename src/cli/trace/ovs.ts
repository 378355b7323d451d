// The ovs backend's part of `weft trace`: which packet to hand to `ovs-appctl ofproto/trace`
// (in_port and the Ethernet addresses the packet really carries there), and what its output
// says — the tables passed, the spoof guard, and where the bridge sends the packet (a pod port,
// the gateway port, the tunnel with which tun_dst and VNI, or nowhere). Pure: text in, data out.
import { Category, GLOBAL_VIRTUAL_MAC, gatewayOf, macFromIP, TABLES } from '../../backend/ovs/pipeline.js';
import type { NeighEntry } from '../../netlink/index.js';
import type { Lease } from '../../subnet/lease.js';
import { IPAddr, type IPNet } from '../../util/ip.js';
import type { OvsConntrackEvidence, OvsEntry, OvsPodPortFacts, OvsPolicyStep, OvsTableStep, Packet, RouteLookup } from './types.js';

/** The pipeline's tables by number, as the summaries name them. */
export const TABLE_NAMES: ReadonlyMap<number, string> = new Map([
  [TABLES.classifier, 'classifier'],
  [TABLES.spoofGuard, 'spoof guard'],
  [TABLES.arpResponder, 'ARP responder'],
  [TABLES.l3Forwarding, 'L3 forwarding'],
  [TABLES.l2Forwarding, 'L2 forwarding'],
  [TABLES.output, 'output'],
  [TABLES.conntrackState, 'conntrack state'],
  [TABLES.egressRule, 'egress rules'],
  [TABLES.egressDefaultRule, 'egress default'],
  [TABLES.ingressRule, 'ingress rules'],
  [TABLES.ingressDefaultRule, 'ingress default'],
  [TABLES.conntrackCommit, 'conntrack commit'],
  [TABLES.policyOutput, 'policy output'],
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

/**
 * The packet's headers: TCP and UDP with their destination port (the policy tables match ports);
 * ICMP as plain IP (nothing in the pipeline matches ICMP fields, and a port rule never matches it).
 */
const headers = (p: Packet, dlSrc: string, dlDst: string): string => {
  const l4 = p.proto === 'icmp' ? null : p.proto;
  const ip = `dl_src=${dlSrc},dl_dst=${dlDst},nw_src=${p.src.toString()},nw_dst=${p.dst.toString()},nw_ttl=64`;
  return l4 ? `${l4},${ip}${p.dport !== null ? `,tp_dst=${p.dport}` : ''}` : `ip,${ip}`;
};

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
  /** The recirculation the step was traced in: null for the packet's first pass, its id ("0x1") for a pipeline resumed after conntrack. */
  readonly recirc: string | null;
}

/**
 * One pass of the packet: the first, or a recirculated pipeline ofproto/trace follows after an
 * action that forks one (`ct(table=N)`), printed below a "recirc(0x1) - resume conntrack with
 * default ct_state=trk|new" banner, with its own Flow, steps and datapath actions.
 */
export interface OfTraceSection {
  /** null for the first pass; else the recirculation id ("0x1"). */
  readonly recirc: string | null;
  /** The banner after the id ("resume conntrack with default ct_state=trk|new (use --ct-next to customize)"). */
  readonly banner: string | null;
  /** The conntrack state the resumed pipeline is traced with ("trk|new"); null when the banner names none. */
  readonly ctState: string | null;
  readonly flow: string | null;
  readonly finalFlow: string | null;
  readonly megaflow: string | null;
  readonly datapathActions: string | null;
}

export interface OfTrace {
  /** The flow line ("Flow: ...") of the first pass. */
  readonly flow: string | null;
  /** The steps of every pass, in the order printed (the first pass, then each recirculation). */
  readonly steps: readonly OfTraceStep[];
  /** Of the last pass: where the packet ends up. */
  readonly finalFlow: string | null;
  readonly megaflow: string | null;
  readonly datapathActions: string | null;
  readonly sections: readonly OfTraceSection[];
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
/** The banner of a recirculated pipeline: "recirc(0x1) - resume conntrack with default ct_state=trk|new (...)". */
const RECIRC_LINE = /^recirc\((0x[0-9a-f]+|\d+)\) - (.*)$/;

type MutableStep = { -readonly [K in keyof OfTraceStep]: OfTraceStep[K] } & { actions: string[]; notes: string[] };
type MutableSection = { -readonly [K in keyof OfTraceSection]: OfTraceSection[K] };

/**
 * Parses OVS's ofproto/trace text (OVS 2.x/3.x layout: "bridge(...)", numbered tables, indented
 * actions), following recirculations: each "recirc(...)" banner starts a section of its own, and
 * the lines a resumed pipeline prints before its first table ("thaw", "Resuming from table 51")
 * belong to no step.
 */
export function parseOfTrace(text: string): OfTrace {
  const lines = text.split('\n');
  const sections: MutableSection[] = [{ recirc: null, banner: null, ctState: null, flow: null, finalFlow: null, megaflow: null, datapathActions: null }];
  let bridge: string | null = null;
  const steps: MutableStep[] = [];
  /** Steps of the current section: lines before its first step are no step's. */
  let sectionSteps = 0;
  for (const raw of lines) {
    const line = raw.trimEnd();
    const trimmed = line.trim();
    if (trimmed === '' || /^-+$/.test(trimmed) || /^=+$/.test(trimmed)) continue;
    const section = sections.at(-1)!;
    const rc = RECIRC_LINE.exec(trimmed);
    if (rc) {
      sections.push({ recirc: rc[1]!, banner: rc[2]!, ctState: /ct_state=([a-z|+-]+)/.exec(rc[2]!)?.[1] ?? null, flow: null, finalFlow: null, megaflow: null, datapathActions: null });
      bridge = null;
      sectionSteps = 0;
      continue;
    }
    const field = /^(Flow|Final flow|Megaflow|Datapath actions): (.*)$/.exec(line);
    if (field) {
      const v = field[2]!.trim();
      if (field[1] === 'Flow') section.flow = v;
      else if (field[1] === 'Final flow') section.finalFlow = v;
      else if (field[1] === 'Megaflow') section.megaflow = v;
      else section.datapathActions = v;
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
      sectionSteps++;
      if (/^No match\.?$/.test(rest)) {
        steps.push({ bridge, table: Number(t[1]), match: null, priority: null, cookie: null, actions: [], notes: [], recirc: section.recirc });
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
        recirc: section.recirc,
      });
      continue;
    }
    const step = sectionSteps > 0 ? steps.at(-1) : undefined;
    if (!step) continue;
    const note = /^(->|>>+)\s*(.*?)\s*(<<+)?$/.exec(trimmed);
    if (note) step.notes.push(note[2]!);
    else step.actions.push(trimmed);
  }
  const first = sections[0]!;
  const last = sections.at(-1)!;
  if (first.flow === null && steps.length === 0) throw new OfTraceParseError(`no "Flow:" line and no tables in ${JSON.stringify(text.slice(0, 200))}`);
  return { flow: first.flow, steps, finalFlow: last.finalFlow, megaflow: last.megaflow, datapathActions: last.datapathActions, sections };
}

/**
 * Whose flow a cookie marks: weft's round << 48 | category << 40 | object id. A NetworkPolicy flow
 * (its id the conjunction id of an allow flow, 0 otherwise) is "policy conj_id N", or in the
 * default tables (`table`) "policy default deny".
 */
export function cookieOwner(cookie: string | null, peerLease: (network: IPAddr) => string | null, table: number | null = null): string {
  if (cookie === null) return "not weft's";
  const c = BigInt(cookie);
  const round = c >> 48n;
  const category = Number((c >> 40n) & 0xffn) as Category;
  const id = c & 0xffffffffffn;
  if (round === 0n) return "not weft's";
  if (category === Category.Pipeline) return 'node';
  if (category === Category.Pod) return `pod ofport ${id.toString()}`;
  if (category === Category.Policy) {
    if (id !== 0n) return `policy conj_id ${id.toString()}`;
    return table === TABLES.egressRule || table === TABLES.ingressRule ? 'policy clause' : 'policy default deny';
  }
  if (category === Category.Peer && id < 1n << 32n) {
    const net = IPAddr.of(4, id);
    return `peer ${peerLease(net) ?? net.toString()}`;
  }
  return "not weft's";
}

export interface OvsPath {
  /** The steps in the first bridge (the integration bridge), a recirculated pipeline's after the step that forked it. */
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
  /** Where the packet went through conntrack; null when it did not. */
  readonly conntrack: OvsConntrackEvidence | null;
  /** The policy tables' decisions (egress, ingress); [] when the packet never met conntrack. */
  readonly policy: readonly OvsPolicyStep[];
}

const SET_FIELD = /^set_field:([^-]+)->(\w+)$/;
/** An action that forks a recirculated pipeline: ct with a table to resume in. */
const CT_RECIRC = /^ct\((?:.*,)?table=(\d+)/;

const POLICY_TABLES = {
  egress: { rule: TABLES.egressRule, dflt: TABLES.egressDefaultRule, reg: 'reg2' },
  ingress: { rule: TABLES.ingressRule, dflt: TABLES.ingressDefaultRule, reg: 'reg3' },
} as const;

/** The step a flow drops the packet in (or that had no match). */
const dropsIn = (s: Pick<OvsTableStep, 'match' | 'actions'>): boolean => s.match === null || (s.actions.includes('drop') && !s.actions.some((a) => CT_RECIRC.test(a)));

/**
 * What the policy tables did with the packet, per direction, from the tables it passed (a
 * trace's new-connection path): a rule's allow flow in 52/54 (reg2/reg3 loaded with its
 * conjunction id, which is also its cookie's id), the pod's default drop in 53/55, or neither.
 */
export function bridgePolicy(tables: readonly Pick<OvsTableStep, 'table' | 'match' | 'priority' | 'cookie' | 'actions'>[]): OvsPolicyStep[] {
  if (!tables.some((s) => s.table === TABLES.conntrackState)) return [];
  const out: OvsPolicyStep[] = [];
  for (const direction of ['egress', 'ingress'] as const) {
    const { rule, dflt, reg } = POLICY_TABLES[direction];
    const step = (s: Pick<OvsTableStep, 'table' | 'match' | 'priority' | 'cookie'> | undefined, verdict: OvsPolicyStep['verdict'], conjunction: number | null = null): OvsPolicyStep =>
      s ? { direction, verdict, table: s.table, conjunction, cookie: s.cookie, priority: s.priority, match: s.match } : { direction, verdict, table: null, conjunction: null, cookie: null, priority: null, match: null };
    const r = tables.find((s) => s.table === rule);
    const d = tables.find((s) => s.table === dflt);
    if (!r) {
      out.push(step(undefined, 'not-reached'));
      continue;
    }
    if (dropsIn(r)) {
      out.push(step(r, 'drop'));
      continue;
    }
    const loaded = r.actions.map((a) => SET_FIELD.exec(a)).find((m) => m?.[2] === reg);
    if (loaded) {
      const id = Number(loaded[1]);
      out.push(step(r, 'allow', Number.isSafeInteger(id) ? id : null));
      continue;
    }
    // The ingress table's node flow: the node's own traffic skips ingress rules.
    if (direction === 'ingress' && !d && r.priority !== null && r.priority > 0) {
      out.push(step(r, 'node'));
      continue;
    }
    if (!d) out.push(step(undefined, 'not-reached'));
    else out.push(step(d, dropsIn(d) ? 'drop' : 'pass'));
  }
  return out;
}

/**
 * What the bridge does with the packet: the tables of the integration bridge (the first one the
 * trace shows; a native tunnel continues in br-phy), the spoof guard's verdict, and the output.
 * A `ct(table=N)` forks the pipeline through conntrack: the trace follows the fork as a new
 * connection (ofproto/trace's default ct_state trk|new), and its tables, drop and output are the
 * packet's (the first pass ends with a "drop" of the original, which is no drop).
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
    owner: s.match === null ? null : cookieOwner(s.cookie, peerLease, s.table),
    actions: s.actions,
    recirc: s.recirc,
  }));
  // The fork through conntrack, and the resumed pipeline the trace printed for it.
  let conntrack: OvsConntrackEvidence | null = null;
  const fork = own.find((s) => s.actions.some((a) => CT_RECIRC.test(a)));
  if (fork) {
    const resumed = trace.sections.find((x) => x.recirc !== null && x.recirc !== fork.recirc);
    conntrack = { table: fork.table, recirc: resumed?.recirc ?? null, ctState: resumed?.ctState ?? null };
  }
  const guard = own.find((s) => s.table === TABLES.spoofGuard);
  // A fork the trace did not follow ends the packet's path there.
  const dropped = (s: OfTraceStep) => dropsIn(s) || (s === fork && conntrack?.recirc === null);
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
  return { tables, spoofGuard, action, outputPort, droppedIn, tunnelDst, vni, tunnelNotes, tunnelFailure, datapathActions: dp, conntrack, policy: bridgePolicy(tables) };
}
