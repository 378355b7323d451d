// What the CNI server does around a Kubernetes pod's ADD and DEL besides running the plugins. With
// --network-policy the pod's addresses go to the policy enforcer at ADD, and the ADD is answered
// only once the pod's rules are in the table (as Antrea's cniserver waits for the pod's flows):
// the API learns the pod's address only after the ADD returns, too late for its first packet.
import { parseCniArgs } from '../../cni-plugins/skel/env.js';
import { podIdentity } from '../../cni-plugins/lib/podargs.js';
import { IPAddr } from '../util/ip.js';

export interface CniPodHooks {
  /**
   * After a successful ADD of sandbox (container ID) `sandbox`; resolves when what depends on the
   * pod's addresses is in place.
   */
  podAdded(namespace: string, name: string, sandbox: string, ips: readonly IPAddr[], signal: AbortSignal): Promise<void>;
  /** After a DEL, whatever its result: the addresses sandbox `sandbox` gave the pod are going away. */
  podDeleted(namespace: string, name: string, sandbox: string): void;
}

/** The pod CNI_ARGS names; null when it names none (not a Kubernetes pod). Throws CniError on a bad name. */
export function podOfRequest(env: Readonly<Record<string, string>>): { namespace: string; name: string } | null {
  const id = podIdentity(parseCniArgs(env.CNI_ARGS ?? ''));
  return id.podName !== undefined && id.podNamespace !== undefined ? { namespace: id.podNamespace, name: id.podName } : null;
}

/** The addresses of a CNI ADD result (`ips[].address`, "a/len"); a result without any gives []. */
export function resultAddresses(stdout: string): IPAddr[] {
  const doc = JSON.parse(stdout) as { ips?: unknown };
  if (!Array.isArray(doc.ips)) return [];
  const out: IPAddr[] = [];
  for (const entry of doc.ips as unknown[]) {
    const address = (entry as { address?: unknown } | null)?.address;
    if (typeof address !== 'string') throw new Error(`result ips entry without an address: ${JSON.stringify(entry)}`);
    const ip = IPAddr.tryParse(address.split('/')[0]!);
    if (!ip) throw new Error(`result address ${JSON.stringify(address)} is not an address/prefix`);
    out.push(ip);
  }
  return out;
}
