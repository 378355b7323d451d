// Pods for the NetworkPolicy matrix (test/integration/netpol-matrix.test.ts): more than one pod per
// node on the node's cni0 bridge, each with a long-lived agent in its network namespace
// (netpol-probe-agent.ts) that serves TCP and UDP on the suite's ports and probes other pods on
// request; and the matrix probe itself (every pod → every other pod, every protocol/port, at once).
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import type { Host } from './cluster.js';
import { cniBinDir, runCni } from './cni.js';
import { addNetns, delNetns, ipn } from './netns.js';
import { portKey, type Observed, type ProbePort } from './netpol-reach.js';
import { NetnsAgent } from './netns-agent.js';

const AGENT = fileURLToPath(new URL('./netpol-probe-agent.ts', import.meta.url));

/** `a.b.c.d` + n (within the last octets; the leases here are /24s). */
function addToV4(ip: string, n: number): string {
  const v = ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0) + n;
  return [24, 16, 8, 0].map((s) => Math.floor(v / 2 ** s) % 256).join('.');
}

/**
 * Attaches pods to a node's cni0, as the bridge CNI plugin would: the first pod through
 * `Host.attachPod()` (which makes cni0 with the lease's gateway and the pod in `host.podNs`), every
 * further one as a veth from cni0 into a namespace of its own, with the next free address of the
 * lease (from subnet.env) and a default route via the cni0 gateway. `destroy()` deletes the
 * namespaces it made (their veths go with them); `host.podNs` belongs to the cluster.
 */
export class PodAttacher implements MatrixPodAttacher {
  private readonly count = new Map<Host, number>();
  private readonly made: string[] = [];

  async attach(host: Host, nsName: string): Promise<{ netns: string; ip: string }> {
    const n = this.count.get(host) ?? 0;
    this.count.set(host, n + 1);
    if (n === 0) {
      await host.attachPod();
      if (!host.podIP) throw new Error(`no FLANNEL_SUBNET for ${host.ns}`);
      return { netns: host.podNs, ip: host.podIP };
    }
    const env = host.subnetEnv();
    if (!env.FLANNEL_SUBNET) throw new Error(`no FLANNEL_SUBNET for ${host.ns}`);
    const mtu = env.FLANNEL_MTU ?? '1450';
    const [gw, len] = env.FLANNEL_SUBNET.split('/') as [string, string];
    // attachPod took gw+1; pod n (0-based) takes gw+1+n.
    const ip = addToV4(gw, n + 1);
    const netns = await addNetns(nsName);
    this.made.push(netns);
    const veth = `vp${n}`;
    await ipn(host.ns, 'link', 'add', veth, 'mtu', mtu, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns);
    await ipn(host.ns, 'link', 'set', veth, 'master', 'cni0', 'up');
    await ipn(netns, 'link', 'set', 'eth0', 'mtu', mtu, 'up');
    await ipn(netns, 'addr', 'add', `${ip}/${len}`, 'dev', 'eth0');
    await ipn(netns, 'route', 'add', 'default', 'via', gw);
    return { netns, ip };
  }

  async destroy(): Promise<void> {
    for (const ns of this.made.splice(0)) await delNetns(ns);
  }
}

/** Attaches a pod to a node: its network namespace and its address. */
export interface MatrixPodAttacher {
  attach(host: Host, nsName: string): Promise<{ netns: string; ip: string }>;
  destroy(): Promise<void>;
}

/**
 * Attaches pods to an ovs node's br-int the way a runtime does (test/helpers/ovs-pod.ts does it for
 * the host's one pod namespace): a namespace per pod, then CNI ADD of the flannel bundle, which
 * reads the subnet.env weftd wrote (WEFT_BACKEND=ovs) and delegates to weft-ovs (veth into the
 * pod, its host end on br-int with the pod's flows, host-local IPAM). `destroy()` runs CNI DEL for
 * each pod (its port and flows leave br-int) and deletes the namespaces; every step runs even when
 * one fails, the first failure is thrown at the end.
 */
export class OvsPodAttacher implements MatrixPodAttacher {
  private readonly made: Array<{ readonly host: Host; readonly netns: string; readonly containerId: string; added: boolean }> = [];

  private conf(host: Host): string {
    return JSON.stringify({
      cniVersion: '1.0.0',
      name: 'weft-ovs-netpol',
      type: 'flannel',
      subnetFile: host.subnetFile,
      dataDir: join(host.cluster.dir, `h${host.i}`, 'flannel'),
      delegate: { isDefaultGateway: true },
      ipam: { dataDir: join(host.cluster.dir, `h${host.i}`, 'ipam') },
    });
  }

  private run(host: Host, command: 'ADD' | 'DEL', netns: string, containerId: string) {
    return cniBinDir().then((bin) =>
      runCni(
        {
          bin: join(bin, 'flannel'),
          command,
          containerId,
          netns: `/run/netns/${netns}`,
          args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=${netns}`,
          hostNs: host.ns,
        },
        this.conf(host),
      ),
    );
  }

  async attach(host: Host, nsName: string): Promise<{ netns: string; ip: string }> {
    const netns = await addNetns(nsName);
    const containerId = `ctr-${nsName}`;
    const entry = { host, netns, containerId, added: false };
    this.made.push(entry);
    const r = await this.run(host, 'ADD', netns, containerId);
    if (r.exitCode !== 0) throw new Error(`CNI ADD of ${nsName} on ${host.ns} failed: ${r.stdout}${r.stderr}`);
    entry.added = true;
    const ip = (r.json as { ips?: Array<{ address?: string }> } | undefined)?.ips?.[0]?.address?.split('/')[0];
    if (!ip) throw new Error(`CNI ADD of ${nsName} on ${host.ns} returned no address: ${r.stdout}`);
    return { netns, ip };
  }

  async destroy(): Promise<void> {
    const errors: Error[] = [];
    for (const p of this.made.splice(0)) {
      if (p.added) {
        const r = await this.run(p.host, 'DEL', p.netns, p.containerId).catch((e: Error) => ({ exitCode: -1, stdout: e.message, stderr: '' }));
        if (r.exitCode !== 0) errors.push(new Error(`CNI DEL of ${p.netns} on ${p.host.ns} failed: ${r.stdout}${r.stderr}`));
      }
      await delNetns(p.netns);
    }
    if (errors[0]) throw errors[0];
  }
}

export interface ProbeSpec {
  readonly ip: string;
  readonly port: number;
  readonly protocol: 'TCP' | 'UDP';
}

export interface ProbeResult {
  readonly ok: boolean;
  readonly detail: string;
}

/** One pod's agent: servers on `ports` (TCP and UDP) and probes on request, over stdin/stdout. */
export class ProbeAgent {
  private constructor(private readonly agent: NetnsAgent) {}

  /** Starts the agent in `netns` and waits until its servers listen. */
  static async start(netns: string, ports: readonly number[]): Promise<ProbeAgent> {
    return new ProbeAgent(await NetnsAgent.start(AGENT, netns, ports.map(String), 'probe agent'));
  }

  get running(): boolean {
    return this.agent.running;
  }

  /** Runs the probes at once (each on a new socket); the results in the same order. */
  async probe(probes: readonly ProbeSpec[], timeoutMs: number): Promise<ProbeResult[]> {
    const msg = await this.agent.request({ timeoutMs, probes });
    if (!Array.isArray(msg['results'])) throw new Error(`agent in ${this.agent.netns}: no results`);
    return msg['results'] as ProbeResult[];
  }

  /** Closes stdin (the agent exits), SIGKILL after 2 s. */
  stop(): Promise<void> {
    return this.agent.stop();
  }
}

/** A pod of the matrix: "ns/name", where it runs, its address and its agent. */
export interface MatrixPod {
  readonly key: string;
  readonly ip: string;
  readonly agent: ProbeAgent;
}

/**
 * One matrix probe: every pod → every other pod (self skipped), every protocol/port, all at once
 * (each agent runs its probes concurrently, the agents in parallel). Returns what was seen, per
 * `portKey`, per "from>to".
 */
export async function probeMatrix(pods: readonly MatrixPod[], ports: readonly ProbePort[], timeoutMs = 1_000): Promise<Observed> {
  const seen = new Map<string, Map<string, ProbeResult>>(ports.map((p) => [portKey(p), new Map()]));
  await Promise.all(
    pods.map(async (from) => {
      const cells = pods.filter((to) => to !== from).flatMap((to) => ports.map((p) => ({ to, p })));
      const results = await from.agent.probe(
        cells.map(({ to, p }) => ({ ip: to.ip, port: p.port, protocol: p.protocol })),
        timeoutMs,
      );
      cells.forEach(({ to, p }, i) => seen.get(portKey(p))!.set(`${from.key}>${to.key}`, results[i]!));
    }),
  );
  return seen;
}

/** What a NetworkPolicy cluster test set up, to be torn down in order. */
export interface PolicyClusterParts {
  readonly agents: ReadonlyArray<{ stop(): Promise<void> }>;
  readonly attacher: MatrixPodAttacher;
  readonly hosts: ReadonlyArray<{ readonly weftd?: { stop(): Promise<unknown> } | null | undefined }>;
  readonly switches: Iterable<{ stop(): Promise<void> }>;
  readonly others: ReadonlyArray<(() => Promise<unknown>) | undefined>;
}

/**
 * Tears a policy cluster down: the pods' agents, the pods (CNI DEL, while OVS still runs), weftd,
 * then the switches (weftd before OVS), then `others` in order (cluster, forwarder, API). Every step
 * runs even when one before it fails; the first failure is thrown at the end.
 */
export async function tearDownPolicyCluster(parts: PolicyClusterParts): Promise<void> {
  const results: PromiseSettledResult<unknown>[][] = [await Promise.allSettled(parts.agents.map((a) => a.stop()))];
  const stopWeftd = async () => void (await Promise.all(parts.hosts.map((h) => h.weftd?.stop() ?? Promise.resolve())));
  const stopOvs = async () => void (await Promise.all([...parts.switches].map((o) => o.stop())));
  for (const stop of [() => parts.attacher.destroy(), stopWeftd, stopOvs, ...parts.others]) if (stop) results.push(await Promise.allSettled([stop()]));
  const failed = results.flat().find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}
