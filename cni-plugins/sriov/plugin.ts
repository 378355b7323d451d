// The sriov plugin: a Virtual Function instead of a veth, as k8snetworkplumbingwg/sriov-cni does
// it (same config keys, state files, messages), in three modes:
//
//   plain    the VF netdev moves into the pod (through a temporary netns), renamed to CNI_IFNAME;
//            its MAC, VLAN, spoof check, trust, link state and rates are set through the PF.
//   DPDK     the VF is bound to vfio-pci / uio_pci_generic / igb_uio (no netdev): PF settings
//            and IPAM only, nothing moves.
//   offload  (`ovs: {bridge, ovsRunDir, datapathType}`) as plain, plus the VF representor on the
//            OVS bridge with the pod's flows. The step is a hook (SriovDeps.offload, OffloadHooks;
//            the real one is offload.ts, wired in cmd/sriov.ts); without one, ADD refuses the key.
//
// ADD   config → locate the VF in sysfs → lock <dataDir>/pci/vf_lock/<vf>.lock → refuse a VF
//       allocated to a live netns → read the VF through the PF → apply the settings → move the
//       VF into the pod → MAC, sysctls, up → IPAM → addresses → [offload attach] → state files →
//       announce. Any failure undoes what was done, newest first (IPAM release, VF back to the
//       host as it was, PF settings reset), so a failed ADD leaves no state file.
// DEL   idempotent. With the state file: [offload detach], IPAM DEL, PF reset (before the move,
//       as sriov-cni: some drivers refuse a MAC change with trust off), VF back to the host with
//       its name, MAC and MTU. Without it (sriov-cni gives up): IPAM DEL, and the VF found from
//       the config's deviceID and prevResult is still returned and reset.
// CHECK the VF is in the pod with the result's MAC and addresses, and the PF reports the
//       configured settings.
//
// Each verb has its file: add.ts, del.ts, check.ts; the PF's VF settings are pf-settings.ts's,
// the VF netdev's moves link.ts's, the state files state.ts's.
import { leftAloneLine, warnOnStderr } from '../lib/owned-files.js';
import { internalError, tryStep } from '../lib/rollback.js';
import { CniError, ErrorCode, type CniPlugin, type CniRequest, type NetConf } from '../skel/types.js';
import { add } from './add.js';
import { check } from './check.js';
import { del, ipamTypeOf } from './del.js';
import type { SriovDeps } from './deps.js';
import { stateDirOf, sweepStateDir, type StaleAttachment } from './state.js';
import { checkStateNames } from './state-names.js';

/**
 * GC's list of live attachments as state file names (`<containerID>-<ifname>`); null when the
 * request has none, so nothing is known to be garbage.
 */
function validStateNames(config: NetConf): Set<string> | null {
  const key = config['cni.dev/valid-attachments'] !== undefined ? 'cni.dev/valid-attachments' : 'cni.dev/attachments';
  const list = config[key];
  if (list === undefined || list === null) return null;
  const bad = new CniError(ErrorCode.InvalidNetworkConfig, `${key} must be a list of {"containerID": string, "ifname": string}`);
  if (!Array.isArray(list)) throw bad;
  const names = new Set<string>();
  for (const a of list as unknown[]) {
    const { containerID, ifname } = (typeof a === 'object' && a !== null ? a : {}) as Record<string, unknown>;
    if (typeof containerID !== 'string' || typeof ifname !== 'string') throw bad;
    names.add(`${containerID}-${ifname}`);
  }
  return names;
}

/** The DEL that releases a stale attachment: its IDs, no netns (GC cannot vouch for one), no IPAM (GC'd below). */
function releaseRequest(req: CniRequest, a: StaleAttachment): CniRequest {
  const { ipam: _ipam, 'cni.dev/valid-attachments': _v, 'cni.dev/attachments': _a, ...config } = req.config;
  return { ...req, command: 'DEL', containerId: a.containerId, ifname: a.ifname, netns: '', config, stdin: JSON.stringify(config) };
}

/**
 * GC: every state file of an attachment the runtime no longer lists is released as a DEL without
 * netns would (PF settings reset and the VF netdev restored when it is still ours, then the file
 * removed), unless its recorded pod netns still exists; stale temp files go too. Only files that
 * are sriov state by name and content are touched (sweepStateDir); one line names the others
 * that look like it. Then IPAM GC. A release that fails keeps its state and fails the GC.
 */
async function gc(deps: SriovDeps, warn: (line: string) => void, req: CniRequest): Promise<void> {
  const valid = validStateNames(req.config);
  const errors: string[] = [];
  if (valid !== null) {
    const dataDir = stateDirOf(req.config, req.env);
    // A state DEL would refuse as foreign (checkStateNames) is not one GC hands to DEL.
    const sweep = sweepStateDir(dataDir, valid, checkStateNames);
    for (const a of sweep.stale) await tryStep(errors, `release ${a.containerId}-${a.ifname}`, () => del(deps, releaseRequest(req, a)));
    const lines = [leftAloneLine('sriov', dataDir, 'sriov state (<containerID>-<ifname>)', sweep.leftAlone)];
    if (sweep.podAlive.length > 0) {
      const kept = `kept the state of ${sweep.podAlive.map((n) => JSON.stringify(n)).join(', ')}: its pod netns still exists (a DEL releases it)`;
      lines.push(lines[0] === '' ? `sriov GC: ${kept}` : kept);
    }
    const line = lines.filter((l) => l !== '').join('; ');
    if (line !== '') warn(line);
  }
  const t = ipamTypeOf(req.config);
  if (t !== '') await deps.ipam.gc(req, t, req.stdin);
  if (errors.length > 0) throw internalError(`sriov GC: ${errors.join('; ')}`);
}

async function status(deps: SriovDeps, req: CniRequest): Promise<void> {
  const t = ipamTypeOf(req.config);
  if (t !== '') await deps.ipam.status(req, t, req.stdin);
}

export interface SriovPluginOptions {
  /** Where GC's one line about what it left alone goes (default: stderr). */
  readonly warn?: (line: string) => void;
}

/** Builds the plugin over its dependencies (the real ones, or recording/fake ones in tests). */
export function createSriovPlugin(deps: SriovDeps, opts: SriovPluginOptions = {}): CniPlugin {
  const warn = opts.warn ?? warnOnStderr;
  return {
    name: 'sriov',
    add: (req) => add(deps, req),
    del: (req) => del(deps, req),
    check: (req) => check(deps, req),
    gc: (req) => gc(deps, warn, req),
    status: (req) => status(deps, req),
  };
}
