// What this node's CNI requests say of its pods' addresses, ahead of the API: an ADD's addresses
// stand for the pod's own until the pod (that UID, when the runtime names it) is deleted from the
// API, so its rules exist before its first packet (the API learns the address only after the ADD
// returns); its DEL takes them away again. Kept beside the API's own view of each pod, which the
// engine re-applies when what the CNI says changes.
import type { IPAddr } from '../util/ip.js';
import type { Pod } from './objects.js';

/** A pod as a CNI request names it: CNI_ARGS' namespace, name and (when given) UID, and the sandbox. */
export interface CniPod {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string | null;
  /** The container ID of the pod sandbox (CNI_CONTAINERID). */
  readonly sandbox: string;
}

/** What a CNI ADD said of a local pod: its addresses, or (after its DEL, `ips` null) those it had. */
interface Said {
  readonly sandbox: string;
  readonly uid: string | null;
  readonly ips: readonly IPAddr[] | null;
  readonly released: readonly IPAddr[];
}

export class LocalAddressBook {
  private readonly said = new Map<string, Said>();
  /** The pods as the API last gave them, by "namespace/name". */
  private readonly api = new Map<string, Pod>();

  constructor(private readonly nodeName: string) {}

  /** The API's pod `key`, as last seen. */
  apiPod(key: string): Pod | undefined {
    return this.api.get(key);
  }

  /** The API's `pod` (stored) with the addresses the CNI gave it when it is ours. */
  effective(key: string, pod: Pod): Pod {
    this.api.set(key, pod);
    const s = this.said.get(key);
    if (s === undefined || pod.nodeName !== this.nodeName || (s.uid !== null && s.uid !== pod.uid)) return pod;
    return { ...pod, ips: s.ips ?? pod.ips.filter((ip) => !s.released.some((r) => r.equals(ip))) };
  }

  /** A CNI ADD of sandbox `pod.sandbox` gave the pod `ips`. */
  added(key: string, pod: CniPod, ips: readonly IPAddr[]): void {
    this.said.set(key, { sandbox: pod.sandbox, uid: pod.uid, ips, released: [] });
  }

  /**
   * A CNI DEL of sandbox `pod.sandbox`: the addresses it gave are gone, even if the API's status
   * still lists them (it may list others later: a sandbox whose ADD weftd did not see). Another
   * sandbox's DEL (a repeated DEL of an old one) changes nothing: false.
   */
  deleted(key: string, pod: CniPod): boolean {
    const s = this.said.get(key);
    if (s?.sandbox !== pod.sandbox || s.ips === null) return false;
    this.said.set(key, { ...s, ips: null, released: s.ips });
    return true;
  }

  /** The API deleted pod `key`; what the CNI said stays when it is of a pod re-created under that name. */
  apiDeleted(key: string): void {
    const s = this.said.get(key);
    if (s !== undefined && (s.uid === null || s.uid === this.api.get(key)?.uid)) this.said.delete(key);
    this.api.delete(key);
  }

  /** Whether the API shows `pod` (by UID when given) bound to this node. */
  isLocal(key: string, pod: Pick<CniPod, 'uid'>): boolean {
    const api = this.api.get(key);
    return api !== undefined && api.nodeName === this.nodeName && (pod.uid === null || api.uid === pod.uid);
  }
}
