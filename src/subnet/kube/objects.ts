// The parts of Kubernetes API objects weft reads, shared by the pure Node conversions (node.ts,
// annotations.ts) and the API client (client.ts). Types only.

/** The part of a core/v1 Node weft reads. Annotation values are strings, as the API server keeps them. */
export interface KubeNode {
  readonly metadata: {
    readonly name: string;
    readonly resourceVersion?: string;
    readonly creationTimestamp?: string | null;
    readonly annotations?: Readonly<Record<string, string>>;
  };
  readonly spec?: {
    readonly podCIDR?: string;
    readonly podCIDRs?: readonly string[];
  };
  readonly status?: {
    readonly conditions?: readonly NodeCondition[];
  };
}

export interface NodeCondition {
  readonly type: string;
  readonly status: string;
  readonly lastHeartbeatTime?: string;
  readonly lastTransitionTime?: string;
  readonly reason?: string;
  readonly message?: string;
}
