// The pod a runtime names in CNI_ARGS (K8S_POD_NAME, K8S_POD_NAMESPACE), for the plugins that
// record it: the OVS pod port carries it as external_ids, which weftd reads back to rebuild the
// pod's flows, and the offload step derives the representor's host name from it. Checked where
// it enters, before anything is made: Kubernetes names (DNS-1123), else code 4 naming the value.
import { k8sNamespaceProblem, k8sObjectNameProblem } from '../../src/util/names.js';
import { CniError, ErrorCode } from '../skel/types.js';

export const POD_NAME_ARG = 'K8S_POD_NAME';
export const POD_NAMESPACE_ARG = 'K8S_POD_NAMESPACE';

export interface PodIdentity {
  /** Absent when CNI_ARGS has none (or an empty one). */
  readonly podName?: string;
  readonly podNamespace?: string;
}

function checked(args: ReadonlyMap<string, string>, key: string, problem: (v: string) => string | null): string | undefined {
  const v = args.get(key);
  if (v === undefined || v === '') return undefined;
  const why = problem(v);
  if (why !== null) throw new CniError(ErrorCode.InvalidEnvironment, `invalid CNI_ARGS ${key} ${JSON.stringify(v)}: ${why}`);
  return v;
}

/** The pod's name and namespace from CNI_ARGS; throws CniError code 4 for a value that is not a Kubernetes name. */
export function podIdentity(args: ReadonlyMap<string, string>): PodIdentity {
  const podName = checked(args, POD_NAME_ARG, k8sObjectNameProblem);
  const podNamespace = checked(args, POD_NAMESPACE_ARG, k8sNamespaceProblem);
  return { ...(podName !== undefined ? { podName } : {}), ...(podNamespace !== undefined ? { podNamespace } : {}) };
}
