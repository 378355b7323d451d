// `weft trace`: what it reads from the node (TraceFacts) and what it reports (TraceReport). The
// report's JSON form is described by test/fixtures/trace/schema.json.
import type { RulesMode } from '../../ipmasq/keeper.js';
import type { FdbEntry, LinkInfo, NeighEntry } from '../../netlink/index.js';
import type { Lease } from '../../subnet/lease.js';
import type { PolicyAnswer } from '../../policy/explain.js';
import type { IPAddr, IPNet } from '../../util/ip.js';

export type Proto = 'tcp' | 'udp' | 'icmp';

export interface Packet {
  readonly src: IPAddr;
  readonly dst: IPAddr;
  readonly proto: Proto;
  /** tcp/udp only. */
  readonly dport: number | null;
}

/** One kernel route decision: `ip route get` (type, device, gateway) merged with its `fibmatch` form (the matching entry). */
export type RouteLookup =
  | {
      readonly ok: true;
      /** RTN type: unicast, local, blackhole, unreachable, prohibit, ... */
      readonly type: string;
      /** The matching route's prefix (0.0.0.0/0 for default). */
      readonly prefix: IPNet;
      readonly gateway: IPAddr | null;
      readonly device: string | null;
      /** As `ip` names it: "88", "kernel", "boot", "static", ... */
      readonly protocol: string | null;
      readonly onlink: boolean;
      readonly nexthopId: number | null;
      readonly prefsrc: IPAddr | null;
      /** null for the main table. */
      readonly table: string | null;
    }
  | { readonly ok: false; readonly error: string };

export interface SubnetEnvFacts {
  readonly network: IPNet | null;
  readonly subnet: IPNet | null;
  readonly ipv6Network: IPNet | null;
  readonly ipv6Subnet: IPNet | null;
  readonly mtu: number | null;
  readonly ipMasq: boolean | null;
  /** WEFT_IPMASQ: 'agent' when weftd runs with --ip-masq-config (chain WEFT-IP-MASQ instead of FLANNEL-POSTRTG). */
  readonly ipMasqMode: 'agent' | null;
  /** WEFT_BACKEND, e.g. "ovs". */
  readonly backend: string | null;
  /** WEFT_OVS_BRIDGE / WEFT_OVS_RUNDIR / WEFT_OVS_DATAPATH (ovs backend only). */
  readonly ovsBridge: string | null;
  readonly ovsRunDir: string | null;
  readonly ovsDatapath: string | null;
}

export interface ConfigFacts {
  readonly network: IPNet | null;
  readonly ipv6Network: IPNet | null;
  readonly backendType: string | null;
  readonly enableNFTables: boolean | null;
}

export interface RuleFacts {
  readonly mode: RulesMode;
  /** Where the mode came from. */
  readonly modeSource: 'daemon' | 'config' | 'detected';
  /** `iptables-save -t nat` / `-t filter` (ip6tables-save for IPv6); null when unreadable. */
  readonly iptablesNat: string | null;
  readonly iptablesFilter: string | null;
  /** `nft -j list table ip flannel-ipv4` (ip6 flannel-ipv6); null when the table does not exist or nft failed. */
  readonly nft: string | null;
  /** --iptables-forward-rules as the daemon reports it; null when unknown. */
  readonly forwardRules: boolean | null;
  /** Commands that failed, one line each. */
  readonly errors: readonly string[];
}

export type LeaseSource = 'etcd' | 'daemon' | 'none';

/** Where a packet enters the ovs backend's bridge: a pod's port, the gateway port (the host), the tunnel port. */
export type OvsEntry = 'pod' | 'gateway' | 'tunnel';

/** A pod port of the bridge as OVSDB lists it (interface external_ids written by the CNI plugin). */
export interface OvsPodPortFacts {
  readonly name: string;
  readonly ofport: number;
  readonly ip: IPAddr;
  readonly mac: string;
  readonly containerId: string;
}

/** The one `ovs-appctl ofproto/trace` trace ran, or why it ran none. */
export interface OvsTraceFacts {
  readonly entry: OvsEntry;
  /** null when no port could be chosen (then `error` says why). */
  readonly inPort: number | null;
  readonly inPortName: string | null;
  /** The flow handed to ofproto/trace. */
  readonly flow: string | null;
  /** Said about the choice of the packet's headers, e.g. that a source no pod has is traced from another pod's port. */
  readonly note: string | null;
  /** ofproto/trace's output, verbatim. */
  readonly output: string | null;
  readonly error: string | null;
}

export interface OvsFacts {
  readonly bridge: string;
  readonly runDir: string;
  readonly datapath: string | null;
  readonly tunnelPort: number;
  readonly gatewayPort: number;
  /** The MAC of the gateway port (weft-gw0); null when the device is missing. */
  readonly gatewayMac: string | null;
  /** null when OVSDB could not be read. */
  readonly pods: readonly OvsPodPortFacts[] | null;
  /** The VNI the node's lease announces (the ovs backend's BackendData.VNI); null when unknown. */
  readonly vni: number | null;
  /** null: the packet does not pass through the bridge on this node (`error` empty) or OVS could not be read. */
  readonly trace: OvsTraceFacts | null;
  /** Why OVS could not be read (not running, wrong run dir), one line. */
  readonly error: string | null;
}

/** Everything trace reads from the node, gathered once; the analysis is a pure function of this. */
export interface TraceFacts {
  readonly packet: Packet;
  readonly subnetFile: string;
  readonly env: SubnetEnvFacts | null;
  readonly config: ConfigFacts | null;
  /** The daemon's backend type (from /status), when it answered. */
  readonly daemonBackend: string | null;
  readonly leases: readonly Lease[];
  readonly leaseSource: LeaseSource;
  /** The node's own addresses. */
  readonly addresses: ReadonlyArray<{ readonly ifindex: number; readonly ip: IPAddr }>;
  readonly links: readonly LinkInfo[];
  /** The device the source is reached through (where its packets come in); null for the node's own addresses. */
  readonly ingress: string | null;
  readonly route: RouteLookup;
  /** Neighbours (of the destination's family) on the route's device. */
  readonly neighbours: readonly NeighEntry[];
  /** FDB entries of the route's device when it is a VXLAN device. */
  readonly fdb: readonly FdbEntry[];
  /** Route lookups towards the remote VTEPs named by the relevant FDB entries, by address text. */
  readonly underlay: ReadonlyMap<string, RouteLookup>;
  /** The bridge holding this node's subnet gateway (cni0). */
  readonly bridge: LinkInfo | null;
  readonly rules: RuleFacts;
  /** net.ipv4.ip_forward / net.ipv6.conf.all.forwarding; null when unreadable. */
  readonly ipForward: boolean | null;
  /** The ovs backend's bridge and the trace through it; null on other backends. */
  readonly ovs: OvsFacts | null;
  /** weftd's NetworkPolicy decisions for the packet (its /policy); null without --network-policy or without an answer. */
  readonly policy: PolicyAnswer | null;
  /** Things the collector could not read, said once each. */
  readonly notes: readonly string[];
}

export type HopStatus = 'ok' | 'broken' | 'warning' | 'info' | 'unsupported';

export type AddressClass = 'node' | 'local-pod' | 'remote-pod' | 'cluster' | 'external';

export interface SourceEvidence {
  readonly address: string;
  readonly class: AddressClass;
  /** The lease (subnet) the address belongs to. */
  readonly lease: string | null;
  readonly ingress: string | null;
  readonly ipForward: boolean | null;
}

export interface RouteEvidence {
  readonly destination: string;
  readonly destinationClass: AddressClass;
  readonly lease: string | null;
  readonly leasePublicIP: string | null;
  readonly type: string | null;
  readonly prefix: string | null;
  readonly gateway: string | null;
  readonly device: string | null;
  readonly protocol: string | null;
  readonly weftOwned: boolean;
  readonly nexthopId: number | null;
  readonly onlink: boolean;
  /** What the lease says the route should be, when it differs or is missing. */
  readonly expected: string | null;
}

export interface NeighbourEvidence {
  readonly device: string;
  readonly address: string;
  readonly mac: string | null;
  /** "PERMANENT", "REACHABLE", ... or null when there is no entry. */
  readonly state: string | null;
  readonly expectedMac: string | null;
}

export interface FdbEvidence {
  readonly device: string;
  readonly mac: string;
  readonly remoteIP: string | null;
  readonly vni: number | null;
  readonly port: number | null;
  /** The lease whose public IP the entry points at. */
  readonly lease: string | null;
  readonly expectedRemoteIP: string | null;
}

export interface UnderlayEvidence {
  readonly remoteIP: string;
  readonly port: number | null;
  readonly device: string | null;
  readonly gateway: string | null;
  readonly source: string | null;
}

export interface NexthopEvidence {
  readonly device: string;
  readonly gateway: string;
  readonly mac: string | null;
  readonly state: string | null;
  readonly lease: string | null;
}

export interface MtuEvidence {
  readonly bridge: string | null;
  readonly bridgeMtu: number | null;
  readonly device: string;
  readonly deviceMtu: number;
  readonly underlay: string | null;
  readonly underlayMtu: number | null;
  readonly subnetEnvMtu: number | null;
}

export type LiveState = 'present' | 'differs' | 'missing' | 'unknown' | 'not-applicable';

export interface MasqueradeEvidence {
  readonly mode: RulesMode;
  /** flannel: --ip-masq (FLANNEL-POSTRTG / postrtg); agent: ip-masq-agent mode (WEFT-IP-MASQ / ip-masq-agent). */
  readonly ipMasqMode: 'flannel' | 'agent';
  /** agent mode: the destinations kept unmasqueraded, as the live chain lists them; null in flannel mode or when unreadable. */
  readonly nonMasqueradeCIDRs: readonly string[] | null;
  /** agent mode: the CIDR of nonMasqueradeCIDRs the destination is in; null when none (or flannel mode). */
  readonly matchedCIDR: string | null;
  /** FLANNEL_IPMASQ from subnet.env; null when unknown. */
  readonly enabled: boolean | null;
  /** What the rule model decides: the first matching rule's verdict, or "none". */
  readonly verdict: 'MASQUERADE' | 'RETURN' | 'none';
  readonly chain: string;
  /** 1-based position in the chain. */
  readonly rule: number | null;
  readonly ruleText: string | null;
  /** Whether the live rules are exactly the model's. */
  readonly live: LiveState;
  readonly liveProblems: readonly string[];
  /** What the live rules do to the packet (all of nat POSTROUTING, and weft's nft table). */
  /** RETURN: a rule returned without NAT; none: no rule decided; unknown: the live rules could not be read. */
  readonly liveVerdict: 'MASQUERADE' | 'SNAT' | 'ACCEPT' | 'RETURN' | 'none' | 'unknown';
  readonly liveChain: string | null;
  readonly liveRule: number | null;
  readonly liveRuleText: string | null;
  /** Live rules that could not be evaluated (unknown matches), assumed not to match. */
  readonly unevaluated: readonly string[];
  /** The address MASQUERADE would pick (the egress device's first address). */
  readonly toSource: string | null;
}

export interface ForwardEvidence {
  readonly mode: RulesMode;
  readonly enabled: boolean | null;
  readonly verdict: 'ACCEPT' | 'none';
  readonly chain: string;
  readonly rule: number | null;
  readonly ruleText: string | null;
  readonly live: LiveState;
  readonly liveProblems: readonly string[];
}

export interface OvsTableStep {
  readonly table: number;
  /** The pipeline's name for the table ("spoof guard"), or "table N" for one weft does not use. */
  readonly name: string;
  /** The matching flow's match; null when no flow matched. */
  readonly match: string | null;
  readonly priority: number | null;
  readonly cookie: string | null;
  /** Whose flow it is, from the cookie: "node", "pod ofport N", "peer 10.244.2.0/24", "policy conj_id N", "policy default deny", "not weft's". */
  readonly owner: string | null;
  readonly actions: readonly string[];
  /** null: the packet's first pass; the recirculation id ("0x1") for the pipeline resumed after conntrack. */
  readonly recirc: string | null;
}

/** Where the bridge sent the packet through conntrack and how the trace followed it. */
export interface OvsConntrackEvidence {
  /** The table whose ct(table=...) forked the recirculated pipeline (50). */
  readonly table: number;
  /** The recirculation id the trace followed; null when it did not follow one (the trace ends there). */
  readonly recirc: string | null;
  /** The state the resumed pipeline was traced with ("trk|new": a new connection, what NetworkPolicy decides). */
  readonly ctState: string | null;
}

/**
 * What the bridge's policy tables did with the packet in one direction (egress: 52/53 for the source
 * pod, ingress: 54/55 for the destination pod).
 */
export interface OvsPolicyStep {
  readonly direction: 'ingress' | 'egress';
  /**
   * allow: a rule's flow in the rule table (its conjunction id loaded into reg2/reg3); drop: the
   * pod's default deny (or no flow at all); pass: neither (no pod of this node isolated in this
   * direction); node: the node's own traffic, which skips ingress rules; not-reached: the packet
   * did not get to the direction's tables (dropped before, or the bridge has no policy tables).
   */
  readonly verdict: 'allow' | 'drop' | 'pass' | 'node' | 'not-reached';
  /** The table that decided (rule or default table); null when not reached. */
  readonly table: number | null;
  /** allow: the conjunction id of the flow (reg2/reg3, the cookie's id). */
  readonly conjunction: number | null;
  readonly cookie: string | null;
  readonly priority: number | null;
  readonly match: string | null;
}

export interface PipelineEvidence {
  readonly bridge: string;
  readonly datapath: string | null;
  readonly runDir: string;
  readonly entry: OvsEntry | null;
  readonly inPort: number | null;
  readonly inPortName: string | null;
  /** The flow handed to `ovs-appctl ofproto/trace`. */
  readonly flow: string | null;
  /** The tables of the bridge the packet went through, in order (a recirculated pipeline after the table that forked it). */
  readonly tables: readonly OvsTableStep[];
  /** null: the packet did not pass conntrack (no policy tables, not IP, dropped before). */
  readonly conntrack: OvsConntrackEvidence | null;
  /** The policy tables' decisions, egress then ingress; [] when the bridge was not traced that far. */
  readonly policy: readonly OvsPolicyStep[];
  /** Of the last pass (after conntrack: the recirculated pipeline's). */
  readonly datapathActions: string | null;
  /** ofproto/trace's output, verbatim. */
  readonly trace: string | null;
  readonly error: string | null;
}

export interface SpoofGuardEvidence {
  readonly inPort: number;
  readonly port: string | null;
  /** pass / drop in table 10; not-reached: the packet was dropped before it. */
  readonly verdict: 'pass' | 'drop' | 'not-reached';
  /** What the port may send from (its pod's address and MAC); null for the gateway port (anything). */
  readonly allowedIP: string | null;
  readonly allowedMac: string | null;
  readonly src: string;
  readonly srcMac: string | null;
}

export interface OvsOutputEvidence {
  readonly action: 'pod' | 'gateway' | 'tunnel' | 'drop' | 'other';
  readonly outputPort: number | null;
  readonly outputPortName: string | null;
  /** drop: the table that dropped it. */
  readonly droppedIn: number | null;
  readonly tunnelDst: string | null;
  readonly vni: number | null;
  /** The destination lease and the public IP / VNI its tunnel should use. */
  readonly lease: string | null;
  readonly expectedTunnelDst: string | null;
  readonly expectedVni: number | null;
  /** null when not tunnelled or the destination's lease is unknown. */
  readonly tunnelMatchesLease: boolean | null;
  /** What ofproto/trace said about the tunnel output ("tunneling to 10.250.0.2 via br-phy", "native tunnel routing failed"). */
  readonly tunnelNotes: readonly string[];
}

export interface PolicyEvidence {
  readonly direction: 'ingress' | 'egress';
  /** "namespace/name" of this node's pod the direction applies to. */
  readonly pod: string;
  readonly allowed: boolean;
  /** "namespace/name" of the allowing policy; null when unrestricted or denied. */
  readonly policy: string | null;
  /** The allowing rule's index in the policy's ingress/egress list; null likewise. */
  readonly rule: number | null;
  /** Why: the policy's rule, 'unrestricted' (no policy selects the pod for this direction) or 'default-deny'. */
  readonly reason: 'rule' | 'unrestricted' | 'default-deny';
  /** weftd has programmed its whole rule set (before, nothing is enforced yet). */
  readonly programmed: boolean;
  /** ovs nodes: the conjunction ids of the deciding rule's flows, as weftd names them; null elsewhere (or no rule). */
  readonly conjunctions: readonly number[] | null;
  /** ovs nodes: the conjunction ids of the pod's other rules that allow the packet too; null elsewhere. */
  readonly otherConjunctions: readonly number[] | null;
  /** ovs nodes: what the bridge's policy tables did in this direction (from the trace); null when the bridge was not traced. */
  readonly bridge: OvsPolicyStep | null;
  /** Whether the bridge's decision is weftd's (the same verdict, by a flow of the same rule); null when there is nothing to compare. */
  readonly agrees: boolean | null;
}

export interface BackendEvidence {
  readonly type: string;
  readonly supported: boolean;
}

interface HopOf<K extends string, E> {
  readonly kind: K;
  readonly status: HopStatus;
  /** One line: what happens at this hop and the evidence for it. */
  readonly summary: string;
  readonly evidence: E;
}

export type Hop =
  | HopOf<'source', SourceEvidence>
  | HopOf<'route', RouteEvidence>
  | HopOf<'neighbour', NeighbourEvidence>
  | HopOf<'fdb', FdbEvidence>
  | HopOf<'underlay', UnderlayEvidence>
  | HopOf<'nexthop', NexthopEvidence>
  | HopOf<'mtu', MtuEvidence>
  | HopOf<'masquerade', MasqueradeEvidence>
  | HopOf<'forward', ForwardEvidence>
  | HopOf<'pipeline', PipelineEvidence>
  | HopOf<'spoofguard', SpoofGuardEvidence>
  | HopOf<'ovs-output', OvsOutputEvidence>
  | HopOf<'backend', BackendEvidence>
  | HopOf<'policy', PolicyEvidence>;

export type HopKind = Hop['kind'];

export const TRACE_KIND = 'weft-trace';
export const TRACE_VERSION = 1;

export interface TraceReport {
  readonly kind: typeof TRACE_KIND;
  readonly version: typeof TRACE_VERSION;
  readonly packet: { readonly src: string; readonly dst: string; readonly proto: Proto; readonly dport: number | null };
  readonly node: {
    readonly subnet: string | null;
    readonly network: string | null;
    readonly publicIP: string | null;
    readonly backend: string | null;
    readonly leaseSource: LeaseSource;
    readonly subnetFile: string;
  };
  /** broken: some hop is broken; incomplete: part of the path could not be traced (unsupported backend). */
  readonly verdict: 'ok' | 'broken' | 'incomplete';
  readonly hops: readonly Hop[];
  /** The summaries of the broken hops. */
  readonly problems: readonly string[];
  readonly notes: readonly string[];
}
