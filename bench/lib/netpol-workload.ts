// The NetworkPolicy workload of bench/netpol-nft.ts: 20 namespaces (labels team=t0…t4), 100 apps,
// 10 000 pods on 100 nodes (100 per node, one of each app), 1 000 policies. The policy shape is
// the one of the former measuring case in test/integration/policy-nft.test.ts: an ingress rule
// with a podSelector peer and a namespaceSelector+podSelector peer on one TCP port, an egress rule
// to an ipBlock with an except, and an egress rule to a podSelector peer on the named port `http`.
//
// Placement: pod i lives in namespace ns(i mod 20) with app(i mod 100) (an app lives in one
// namespace: app a in ns(a mod 20)), on node n(1 + ⌊i / 100⌋) with address 10.64.⌊i / 100⌋.(10 + i
// mod 100): each node owns the podCIDR 10.64.(n − 1).0/24, as flannel's host-gw would give it.
// Policy k lives in ns(k mod 20) and selects app(k mod 100): the ten policies k ≡ a (mod 100)
// select every pod of app a, so every local pod is selected by ten policies in each direction.
//
// Peers. The test's generator chose the peer apps k + 1, k + 7 (namespaceSelector team t(k mod 5))
// and k + 3: with an app living in ns(a mod 20), none of them can ever match (app k + 1 lives in
// another namespace than the policy; app k + 7's namespace has another team), so every address and
// named-port set was empty. `matching` (the default) uses k + 20 (same namespace), k + 5 (a
// namespace of team t(k mod 5)) and k + 40 (same namespace): each ingress set holds the 200
// addresses of two apps, each egress named-port set the 100 (address, tcp, 8080) of one app.
// `empty` reproduces the test's offsets.
//
// bench/netpol-ovs.ts (issue 19) uses the same generator with 200 pods per node (the `perNode`
// argument of the placement functions; ≤ 244 so a node's addresses stay in its /24) on 11 nodes:
// node n1's 200 local pods and 2 000 remote ones, and the first 500 policies.
import { parseNamespace, parseNetworkPolicy, parsePod, type Namespace, type NetworkPolicy, type Pod } from '../../src/policy/objects.js';

export const NAMESPACES = 20;
export const APPS = 100;
export const PODS = 10_000;
export const POLICIES = 1_000;
export const PODS_PER_NODE = 100;
/** The container port every pod has, named `http`: what the egress named-port rule resolves to. */
export const HTTP_PORT = 8080;
/** The TCP port of every policy's ingress rule until a policy change moves it. */
export const INGRESS_PORT = 80;

export type PeerMode = 'matching' | 'empty';

const OFFSETS: Record<PeerMode, { ingress: number; nsSel: number; egress: number }> = {
  matching: { ingress: 20, nsSel: 5, egress: 40 },
  empty: { ingress: 1, nsSel: 7, egress: 3 },
};

/** "n1" … "n100" (with `perNode` pods per node). */
export const nodeOfPod = (i: number, perNode = PODS_PER_NODE): string => `n${1 + Math.floor(i / perNode)}`;
/** The pods of node n (1-based): indexes (n − 1)·perNode … n·perNode − 1. */
export const podsOfNode = (n: number, perNode = PODS_PER_NODE): number[] => Array.from({ length: perNode }, (_, j) => (n - 1) * perNode + j);
export const podIP = (i: number, perNode = PODS_PER_NODE): string => `10.64.${Math.floor(i / perNode)}.${10 + (i % perNode)}`;
/** Node n's podCIDR and its bridge address (the pods' gateway). */
export const nodeCidr = (n: number): string => `10.64.${n - 1}.0/24`;
export const nodeGateway = (n: number): string => `10.64.${n - 1}.1`;
export const appOfPod = (i: number): number => i % APPS;
export const nsOfPod = (i: number): string => `ns${i % NAMESPACES}`;
export const podKeyOf = (i: number): string => `${nsOfPod(i)}/p${i}`;

export function namespaces(): Namespace[] {
  return Array.from({ length: NAMESPACES }, (_, n) => parseNamespace({ metadata: { name: `ns${n}`, labels: { team: `t${n % 5}` } } }));
}

/** Pod i with label app=app`app` (by default its own app; a label change gives it another). */
export function pod(i: number, app = appOfPod(i), perNode = PODS_PER_NODE): Pod {
  if (!(perNode >= 1 && perNode <= 244)) throw new RangeError(`perNode ${perNode}: a node's addresses must fit in its /24 (1 … 244)`);
  return parsePod({
    metadata: { namespace: nsOfPod(i), name: `p${i}`, labels: { app: `app${app}` } },
    spec: { nodeName: nodeOfPod(i, perNode), containers: [{ name: 'c', ports: [{ name: 'http', containerPort: HTTP_PORT, protocol: 'TCP' }] }] },
    status: { phase: 'Running', podIPs: [{ ip: podIP(i, perNode) }] },
  });
}

/**
 * The label a change gives pod i, alternating: app a ↔ app a + 20 (the same namespace, so the pod
 * leaves and joins podSelector peer sets and is selected by ten other policies).
 */
export const toggledApp = (i: number, current: number): number => (current === appOfPod(i) ? (current + NAMESPACES) % APPS : appOfPod(i));

export function policy(k: number, mode: PeerMode, port = INGRESS_PORT): NetworkPolicy {
  const o = OFFSETS[mode];
  return parseNetworkPolicy({
    metadata: { namespace: `ns${k % NAMESPACES}`, name: `np${k}` },
    spec: {
      podSelector: { matchLabels: { app: `app${k % APPS}` } },
      ingress: [
        {
          from: [
            { podSelector: { matchLabels: { app: `app${(k + o.ingress) % APPS}` } } },
            { namespaceSelector: { matchLabels: { team: `t${k % 5}` } }, podSelector: { matchLabels: { app: `app${(k + o.nsSel) % APPS}` } } },
          ],
          ports: [{ port, protocol: 'TCP' }],
        },
      ],
      egress: [
        { to: [{ ipBlock: { cidr: '10.0.0.0/8', except: [`10.${k % 200}.0.0/16`] } }] },
        { to: [{ podSelector: { matchLabels: { app: `app${(k + o.egress) % APPS}` } } }], ports: [{ port: 'http' }] },
      ],
    },
  });
}

/**
 * The two iperf3 pods of the throughput part, both workload pods: the client is pod 64 (app64,
 * ns4, node n1, 10.64.0.74), the server pod 144 (app44, ns4, node n2, 10.64.1.54). With `matching`
 * peers the ten policies selecting app44 allow TCP 80 from app64 (44 + 20), and the ten selecting
 * app64 allow egress to 10.0.0.0/8 (half of them except 10.64.0.0/16, half not): both pods are
 * isolated in both directions and allowed to talk on TCP 80.
 */
export const IPERF = { client: 64, server: 144, port: INGRESS_PORT } as const;
