// What the CNI server does around a Kubernetes pod's ADD and DEL besides running the plugins. With
// --network-policy the pod's addresses go to the policy enforcer at ADD, and the ADD is answered
// only once the pod's rules are in the table (as Antrea's cniserver waits for the pod's flows):
// the API learns the pod's address only after the ADD returns, too late for its first packet.
// Only the pod's own network (eth0) counts: a second attachment's addresses are not the pod's
// cluster address and must not replace it.
import { parseCniArgs } from '../../cni-plugins/skel/env.js';
import { podIdentity } from '../../cni-plugins/lib/podargs.js';
import { CniError, ErrorCode } from '../../cni-plugins/skel/types.js';
import type { CniPod } from '../policy/engine.js';
import { AbortedError, untilAborted } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import { IPAddr } from '../util/ip.js';
import type { Logger } from '../util/log.js';

export interface CniPodHooks {
  /** After a successful ADD of the pod's network; resolves when what depends on its addresses is in place. */
  podAdded(pod: CniPod, ips: readonly IPAddr[], signal: AbortSignal): Promise<void>;
  /** After a DEL of the pod's network, whatever its result: the addresses its sandbox had are going away. */
  podDeleted(pod: CniPod): void;
}

/** The interface the kubelet asks for a pod's own network (CNI_IFNAME); other attachments (Multus' net1, …) are not the pod's cluster address. */
export const POD_NETWORK_IFNAME = 'eth0';

const UID_RE = /^[0-9A-Za-z-]{1,64}$/;

/**
 * The pod a request is for: CNI_ARGS' namespace, name and UID (K8S_POD_UID, when the runtime
 * gives it), and the sandbox (CNI_CONTAINERID). Null when it names no pod, or is not the pod's
 * own network (CNI_IFNAME other than eth0). Throws CniError on a value that is not a Kubernetes name.
 */
export function podOfRequest(env: Readonly<Record<string, string>>): CniPod | null {
  if ((env.CNI_IFNAME ?? '') !== POD_NETWORK_IFNAME) return null;
  const args = parseCniArgs(env.CNI_ARGS ?? '');
  const id = podIdentity(args);
  if (id.podName === undefined || id.podNamespace === undefined) return null;
  const uid = args.get('K8S_POD_UID') ?? '';
  if (uid !== '' && !UID_RE.test(uid)) throw new CniError(ErrorCode.InvalidEnvironment, `invalid CNI_ARGS K8S_POD_UID ${JSON.stringify(uid)}`);
  return { namespace: id.podNamespace, name: id.podName, uid: uid === '' ? null : uid, sandbox: env.CNI_CONTAINERID ?? '' };
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

/**
 * After the plugins ran: a DEL tells the hooks the pod's addresses go; a successful ADD waits, up
 * to `boundMs` or until `waits` aborts (the request answered, weftd stopping), until the hooks have
 * put in place what depends on them. The error the ADD is answered with instead, or null.
 */
export async function runPodHooks(
  hooks: CniPodHooks,
  verb: string,
  env: Readonly<Record<string, string>>,
  out: { readonly exitCode: number; readonly stdout: string },
  waits: AbortSignal,
  opts: { readonly boundMs: number; readonly logger: Logger },
): Promise<CniError | null> {
  if (verb !== 'ADD' && verb !== 'DEL') return null;
  let pod: CniPod | null;
  try {
    pod = podOfRequest(env);
  } catch (e) {
    // The plugins accepted CNI_ARGS; a pod name that is not a Kubernetes name is no pod of ours.
    return verb === 'ADD' && out.exitCode === 0 && e instanceof CniError ? e : null;
  }
  if (pod === null) return null;
  if (verb === 'DEL') {
    hooks.podDeleted(pod);
    return null;
  }
  if (out.exitCode !== 0) return null;
  const what = `pod ${pod.namespace}/${pod.name}`;
  let ips: IPAddr[];
  try {
    ips = resultAddresses(out.stdout);
  } catch (e) {
    return new CniError(ErrorCode.Internal, `weftd: the result of the ADD of ${what} cannot be read: ${errorMessage(e)}`);
  }
  // Per request, so AbortSignal.any keeps nothing on a long-lived signal.
  const signal = AbortSignal.any([waits, AbortSignal.timeout(opts.boundMs)]);
  try {
    await untilAborted(hooks.podAdded(pod, ips, signal), signal);
    return null;
  } catch (e) {
    const why = waits.aborted
      ? 'weftd is stopping'
      : e instanceof AbortedError || signal.aborted
        ? `the API server does not show the pod on this node, or its rules were not written, within ${opts.boundMs / 1000} s`
        : errorMessage(e);
    opts.logger.warn('CNI ADD answered with an error: the pod\'s NetworkPolicy is not in place', { pod: what, error: why });
    return new CniError(ErrorCode.TryAgainLater, `weftd: the NetworkPolicy of ${what} is not in place: ${why}`);
  }
}
