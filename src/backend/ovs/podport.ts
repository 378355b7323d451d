// A pod's port on the ovs backend's bridge, for the CNI plugins (veth pods and SR-IOV representors):
// attach = add the host-side interface with the pod's external_ids and install the pod's flows;
// detach = remove the flows (by the pod's cookie) and the port. Each touches only that pod: no
// other port is read and no other flow is written (a pod's flows are found by its cookie, category
// 3 with the ofport as id). Both run under the flow lock the daemon holds while it rewrites the
// whole table (start-up, a repair), so neither undoes the other. The daemon rebuilds the same flows
// from the same external_ids on every full pass, so what is installed here is never drift.
import { type IPAddr } from '../../util/ip.js';
import { withFileLock } from '../../util/flock.js';
import type { OvsClient } from '../../ovs/cli.js';
import { flowLockPath, MAX_OFPORT, parseRound, podIdsProblem, portNameProblem, POD_IDS, ROUND_KEY } from './bridge.js';
import { macFromIP, OBJECT_MASK, podCookie, podFlows, renderFlowMods, type FlowMod } from './pipeline.js';

export interface PodPortSpec {
  readonly bridge: string;
  /** The host-side interface (veth end or VF representor), already in the bridge's namespace. */
  readonly hostIface: string;
  readonly containerId: string;
  readonly ifName: string;
  readonly ip: IPAddr;
  readonly mac: string;
  /** The node's gateway address (first address of the lease subnet). */
  readonly gateway: IPAddr;
  readonly podName?: string;
  readonly podNamespace?: string;
}

export class PodPortError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PodPortError';
  }
}

const quote = (s: string) => JSON.stringify(s);

function lockOf<T>(ovs: OvsClient, bridge: string, fn: () => Promise<T>): Promise<T> {
  return withFileLock(flowLockPath(ovs.runDir, bridge), fn, { timeoutSeconds: 30 });
}

/** Adds the port (idempotent: an existing port of the same name is updated) and its flows; returns the ofport. */
export function attachPodPort(ovs: OvsClient, spec: PodPortSpec): Promise<number> {
  const { bridge, hostIface } = spec;
  // What is written here is read back by every daemon pass; refuse now what a pass would skip.
  const nameProblem = portNameProblem(hostIface);
  if (nameProblem !== null) return Promise.reject(new PodPortError(`cannot attach ${JSON.stringify(hostIface)}: the interface name ${nameProblem}`));
  const problem = podIdsProblem({
    containerId: spec.containerId,
    ifName: spec.ifName,
    ip: spec.ip.toString(),
    mac: spec.mac.toLowerCase(),
    podName: spec.podName || undefined,
    podNamespace: spec.podNamespace || undefined,
  });
  if (problem !== null) return Promise.reject(new PodPortError(`cannot attach ${hostIface}: ${problem}`));
  const ids: Array<[string, string]> = [
    [POD_IDS.containerId, spec.containerId],
    [POD_IDS.ifName, spec.ifName],
    [POD_IDS.ip, spec.ip.toString()],
    [POD_IDS.mac, spec.mac.toLowerCase()],
  ];
  if (spec.podName) ids.push([POD_IDS.podName, spec.podName]);
  if (spec.podNamespace) ids.push([POD_IDS.podNamespace, spec.podNamespace]);
  return lockOf(ovs, bridge, async () => {
    await ovs.vsctl([
      '--may-exist', 'add-port', bridge, hostIface,
      '--', 'set', 'interface', hostIface, ...ids.map(([k, v]) => `external_ids:${k}=${quote(v)}`),
    ]);
    // After the commit (add-port waited for ovs-vswitchd): the ofport it got, and the flow round.
    const [ofportText = '', roundText = ''] = (
      await ovs.vsctl(['get', 'interface', hostIface, 'ofport', '--', '--if-exists', 'get', 'bridge', bridge, `external_ids:${ROUND_KEY}`])
    ).split('\n');
    const ofport = Number(ofportText.trim());
    if (!Number.isInteger(ofport) || ofport <= 0 || ofport > MAX_OFPORT) {
      throw new PodPortError(`Open vSwitch did not attach ${hostIface} to ${bridge} (ofport ${ofportText.trim() || 'unset'})`);
    }
    // The round of the table: what weftd persisted once its table converged (a weftd starting
    // right now rewrites these flows under its new round in its first full pass, under this lock).
    const round = parseRound(roundText) ?? 1;
    const flows = podFlows(round, { gatewayMAC: macFromIP(spec.gateway) }, { ofport, ip: spec.ip, mac: spec.mac.toLowerCase() });
    // One bundle: whatever a port that had this ofport before left (any round), then this pod's flows.
    const mods: FlowMod[] = [{ op: 'delete', cookie: podCookie(0, ofport), mask: OBJECT_MASK }, ...flows.map((flow): FlowMod => ({ op: 'add', flow }))];
    await ovs.bundleFlowMods(bridge, renderFlowMods(mods));
    return ofport;
  });
}

/** Removes the pod's flows and port, found by container ID and interface name. Nothing to remove is not an error. */
export function detachPodPort(ovs: OvsClient, bridge: string, pod: { containerId: string; ifName: string }): Promise<boolean> {
  return lockOf(ovs, bridge, async () => {
    const rows = await findPodInterfaces(ovs, pod);
    for (const { name, ofport } of rows) {
      if (ofport > 0) await ovs.delFlowsByCookie(bridge, podCookie(0, ofport), OBJECT_MASK);
      await ovs.vsctl(['--if-exists', 'del-port', name]); // whichever bridge it is on
    }
    return rows.length > 0;
  });
}

/**
 * The interface rows OVS holds for one pod attachment (normally one). A row whose name is no
 * interface name is left out (it cannot be passed to ovs-vsctl safely); an ofport that is no
 * switch port reads as -1 (no flows to delete by it).
 */
export async function findPodInterfaces(ovs: OvsClient, pod: { containerId: string; ifName: string }): Promise<Array<{ name: string; ofport: number }>> {
  const out = await ovs.vsctl([
    '--format=json', '--columns=name,ofport', 'find', 'interface',
    `external_ids:${POD_IDS.containerId}=${quote(pod.containerId)}`, `external_ids:${POD_IDS.ifName}=${quote(pod.ifName)}`,
  ]);
  const data = (JSON.parse(out) as { data: Array<[unknown, unknown]> }).data;
  return data
    .filter((row): row is [string, unknown] => typeof row[0] === 'string' && portNameProblem(row[0]) === null)
    .map(([name, ofport]) => ({ name, ofport: typeof ofport === 'number' && Number.isInteger(ofport) && ofport > 0 && ofport <= MAX_OFPORT ? ofport : -1 }));
}
