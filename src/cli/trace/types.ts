// `weft trace`: what it reads from the node (TraceFacts) and what it reports (TraceReport). The
// report's JSON form is described by test/fixtures/trace/schema.json.
import type { RulesMode } from '../../ipmasq/keeper.js';
import type { FdbEntry, LinkInfo, NeighEntry } from '../../netlink/index.js';
import type { Lease } from '../../subnet/lease.js';
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
  | HopOf<'backend', BackendEvidence>;

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
