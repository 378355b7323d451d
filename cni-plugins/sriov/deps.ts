// What the sriov plugin is built over (SriovDeps: IPAM delegates, the PF's VF control, devlink)
// and the contract of its OVS hardware-offload step (OffloadHooks; the real one is offload.ts,
// wired in cmd/sriov.ts): what attach() gets and returns, what detach() and check() get.
import type { CniIPConfig, CniInterface, CniRequest, Delegates } from '../skel/types.js';
import { CniError, ErrorCode } from '../skel/types.js';
import type { OvsOffloadConf, SriovConf } from './config.js';
import type { DevlinkPortLookup, OffloadPorts } from './sysfs.js';
import type { PfVfControl } from './vfcontrol.js';

/** What the offload step gets once the VF is in the pod with its addresses. */
export interface OffloadAttachContext {
  readonly req: CniRequest;
  readonly conf: SriovConf;
  readonly ovs: OvsOffloadConf;
  /** Uplink, VF index and representor netdev, found in sysfs before anything was changed. */
  readonly ports: OffloadPorts;
  /** The VF as the pod sees it: CNI_IFNAME, MAC, MTU. */
  readonly podInterface: Required<Pick<CniInterface, 'name' | 'mac' | 'mtu' | 'sandbox'>>;
  /** IPAM's addresses (interface index still 0) and routes. */
  readonly ips: readonly CniIPConfig[];
}

export interface OffloadAttachment {
  /** The host-side interface (the renamed representor): result interface 0, the VF becomes 1. */
  readonly hostInterface: CniInterface;
  /** Saved in the state file and handed back to detach(); JSON only. */
  readonly state: Record<string, unknown>;
}

export interface OffloadDetachContext {
  readonly req: CniRequest;
  readonly deviceID: string;
  /** What attach() returned as `state` (null when DEL runs without a state file). */
  readonly state: Record<string, unknown> | null;
}

/**
 * The OVS hardware-offload step (representor renamed and attached to the bridge, pod flows).
 * attach() runs after the VF is in the pod and IPAM is done; an attach() that throws has undone
 * its own steps. If anything after it fails, or on DEL, detach() undoes it; detach() must
 * tolerate repeated calls and a missing state (null: find what it can from the request).
 */
export interface OffloadHooks {
  attach(ctx: OffloadAttachContext): Promise<OffloadAttachment>;
  detach(ctx: OffloadDetachContext): Promise<void>;
  /** CHECK of the offload side; optional. */
  check?(ctx: OffloadDetachContext): Promise<void>;
}

export interface SriovDeps {
  readonly ipam: Delegates;
  /** The PF's VF-configuration calls. */
  readonly vf: PfVfControl;
  /** devlink port lookup for representors (null: sysfs only). */
  readonly devlink?: DevlinkPortLookup | null;
  /** The offload mode; absent: an `ovs` key is refused. */
  readonly offload?: OffloadHooks;
}

/** An `ovs` key in the config, but the plugin was built without the offload step. */
export class OffloadUnavailableError extends CniError {
  constructor(ovs: OvsOffloadConf) {
    super(ErrorCode.UnsupportedField, `offload mode not implemented yet ("ovs": ${JSON.stringify(ovs)})`);
    this.name = 'OffloadUnavailableError';
  }
}
