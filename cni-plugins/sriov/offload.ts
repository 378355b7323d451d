// The OVS hardware-offload step of the sriov plugin, Antrea's path (configureContainerLinkSriov →
// connectInterfaceToOVS → InstallPodFlows) on the ovs backend's bridge: once the VF is in the pod
// with its address, the VF's representor takes the pod's host interface name, joins the bridge
// with the pod's external_ids, and the pod's flows go in through the same code the weft-ovs
// plugin uses for veth pods (src/backend/ovs/podport.ts). The NIC's eswitch then offloads what
// OVS forwards between the representor and the rest of the bridge.
//
// attach  OVS reachable and the bridge present (checked before anything changes) → representor
//         down, renamed, [netdev: arp off], up → [netdev: TX checksum offload off on the VF in
//         the pod] → attachPodPort (port + external_ids + the pod's 5 flows, under the flow lock).
//         A failing attach undoes its own steps before it reports, newest first.
// detach  detachPodPort (the pod's flows by cookie, then the port), TX checksum offload back on,
//         the representor renamed back with its ARP and admin state. Without state (ADD never
//         saved it, or it was lost): the port found by container ID + ifname, the representor's
//         original name rediscovered in sysfs (or read from its phys_port_name, pfXvfN).
// check   the port named in the state is on the bridge with the pod's external_ids (container
//         ID, ifname, IP and MAC of the prevResult).
//
// What it derives before changing anything is offload-names.ts's, what it saves for detach
// offload-state.ts's, and the link changes (ip, ethtool) offload-links.ts's.
import { listPodInterfaces, type PodInterface } from '../../src/backend/ovs/bridge.js';
import { attachPodPort, detachPodPort, findPodInterfaces } from '../../src/backend/ovs/podport.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { errorMessage } from '../../src/util/errors.js';
import { isValidIfName } from '../../src/util/names.js';
import { podIdentity } from '../lib/podargs.js';
import { tryStep, Undo } from '../lib/rollback.js';
import { CniError, ErrorCode, type CniRequest } from '../skel/types.js';
import { loadSriovConf, type OvsOffloadConf } from './config.js';
import type { OffloadAttachContext, OffloadAttachment, OffloadDetachContext, OffloadHooks } from './deps.js';
import { ipLinks, type OffloadLinks } from './offload-links.js';
import { hostIfaceName, offloadSettings, podAddress } from './offload-names.js';
import { decodeOffloadState, encodeOffloadState, type OffloadState } from './offload-state.js';
import { discoverRepresentor, Sysfs } from './sysfs.js';

const VF_REPRESENTOR_PORT_RE = /^(?:c\d+)?pf\d+vf\d+$/;

// ---- errors ----

/** The offload attach failed; what it had changed is undone (cleanup failures in details). */
export class OffloadAttachError extends CniError {
  constructor(
    readonly representor: string,
    readonly bridge: string,
    reason: string,
    details = '',
    code: number = ErrorCode.Internal,
  ) {
    super(code, `failed to attach VF representor ${representor} to Open vSwitch bridge ${bridge}: ${reason}`, details);
    this.name = 'OffloadAttachError';
  }
}

/** One or more detach steps failed (the others were still done). */
export class OffloadDetachError extends CniError {
  constructor(
    readonly containerId: string,
    readonly ifName: string,
    reasons: readonly string[],
  ) {
    super(ErrorCode.Internal, `failed to detach the VF representor of container ${containerId} interface ${ifName}: ${reasons.join('; ')}`);
    this.name = 'OffloadDetachError';
  }
}

/** CHECK found the offload side not as ADD left it. */
export class OffloadCheckError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'OffloadCheckError';
  }
}

// ---- the hooks ----

export interface OvsOffloadDeps {
  /** The Open vSwitch client for a run dir (default: src/ovs/cli.ts's OvsClient). */
  readonly ovs?: (runDir: string) => OvsClient;
  readonly links?: OffloadLinks;
}

/** The bridge must exist in a reachable OVSDB before anything changes. */
async function requireBridge(ovs: OvsClient, bridge: string): Promise<void> {
  const bridges = (await ovs.vsctl(['list-br'])).split('\n').map((l) => l.trim());
  if (!bridges.includes(bridge)) throw new Error(`bridge ${bridge} does not exist in ${ovs.dbSocket} (has weftd started with the ovs backend?)`);
}

/**
 * Gives the representor back its name, ARP and admin state, wherever it is: under `hostIface`
 * (renamed) or already under its own name. Nothing to do when neither exists.
 */
async function restoreRepresentor(links: OffloadLinks, hostIface: string, orig: { name: string; up: boolean; arp: boolean }): Promise<void> {
  const current = (await links.host(hostIface)) ?? (hostIface !== orig.name ? await links.host(orig.name) : null);
  if (current === null) return;
  if (current.name === orig.name && current.up === orig.up && current.arp === orig.arp) return;
  await links.rename(current.name, orig.name, { arp: orig.arp, up: orig.up });
}

/** The representor's own name, rediscovered without state: sysfs first, then its phys_port_name. */
function originalName(sysfs: Sysfs, deviceID: string, discovered: string | null, current: string): string | null {
  if (discovered !== null && discovered !== current) return discovered;
  const port = sysfs.netAttr(current, 'phys_port_name');
  return port !== null && VF_REPRESENTOR_PORT_RE.test(port) ? port : null;
}

export function createOvsOffload(deps: OvsOffloadDeps = {}): OffloadHooks {
  const links = deps.links ?? ipLinks;
  const client = (runDir: string): OvsClient => (deps.ovs ? deps.ovs(runDir) : new OvsClient({ runDir }));

  async function attach(ctx: OffloadAttachContext): Promise<OffloadAttachment> {
    const { req } = ctx;
    const cfg = offloadSettings(ctx.ovs);
    const rep = ctx.ports.representor;
    const fail = (reason: string, details = '', code: number = ErrorCode.Internal) => new OffloadAttachError(rep, cfg.bridge, reason, details, code);
    const addr = podAddress(ctx.ips);
    if (addr === null) {
      const got = ctx.ips.map((i) => i.address).join(', ') || 'none';
      throw fail(`the pod flows need an IPv4 address from IPAM (the ovs backend is IPv4-only), got ${got}`, '', ErrorCode.InvalidNetworkConfig);
    }
    const mac = ctx.podInterface.mac.toLowerCase();
    if (mac === '') throw fail(`the VF in the pod (${ctx.podInterface.name}) has no MAC address`);
    // CNI_ARGS' pod name and namespace name the host interface and go on the port (loadSriovConf checked them).
    const pod = podIdentity(req.args);
    const hostIface = hostIfaceName(pod.podName, req.containerId, req.ifname);
    const ovs = client(cfg.ovsRunDir);
    try {
      await requireBridge(ovs, cfg.bridge);
    } catch (e) {
      throw fail(errorMessage(e));
    }
    const before = await links.host(rep);
    if (before === null) throw fail(`the representor ${rep} is not in the host network namespace`);
    if (hostIface !== rep && (await links.host(hostIface)) !== null) {
      throw fail(`its host interface name ${hostIface} is already taken by another link`);
    }

    const netdev = cfg.datapathType === 'netdev';
    const undo = new Undo();
    try {
      undo.push(`rename ${hostIface} back to ${rep}`, () => restoreRepresentor(links, hostIface, { name: rep, up: before.up, arp: before.arp }));
      // netdev: the host kernel must not answer ARP on a port OVS reads with AF_PACKET.
      const renamed = await links.rename(rep, hostIface, { arp: netdev ? false : before.arp, up: true });
      let txChecksumOff = false;
      if (netdev) {
        // The userspace datapath hands on packets with unfinished checksums (as weft-ovs on veths).
        const was = await links.txChecksum(req.netns, req.ifname);
        if (was !== false) {
          if (was === true) undo.push(`TX checksum offload back on for ${req.ifname}`, () => links.setTxChecksum(req.netns, req.ifname, true));
          await links.setTxChecksum(req.netns, req.ifname, false);
          txChecksumOff = was === true;
        }
      }
      undo.push(`remove port ${hostIface}`, () => detachPodPort(ovs, cfg.bridge, { containerId: req.containerId, ifName: req.ifname }));
      await attachPodPort(ovs, {
        bridge: cfg.bridge,
        hostIface,
        containerId: req.containerId,
        ifName: req.ifname,
        ip: addr.ip,
        mac,
        gateway: addr.gateway,
        ...pod,
      });
      const state: OffloadState = {
        representor: rep,
        hostIface,
        bridge: cfg.bridge,
        ovsRunDir: cfg.ovsRunDir,
        datapathType: cfg.datapathType,
        wasUp: before.up,
        arpWasOn: before.arp,
        txChecksumOff,
      };
      return { hostInterface: { name: hostIface, mac: renamed.mac }, state: encodeOffloadState(state) };
    } catch (e) {
      const cleanup = await undo.run();
      throw fail(errorMessage(e), cleanup.length > 0 ? `undoing the attach also failed: ${cleanup.join('; ')}` : '');
    }
  }

  async function detachWithState(req: CniRequest, s: OffloadState): Promise<void> {
    const ovs = client(s.ovsRunDir);
    const errors: string[] = [];
    await tryStep(errors, `remove port ${s.hostIface} and its flows from ${s.bridge}`, () => detachPodPort(ovs, s.bridge, { containerId: req.containerId, ifName: req.ifname }));
    if (s.txChecksumOff && req.netns !== '') {
      // Best effort: the VF works either way, and the pod (with the VF) may already be gone.
      await links.setTxChecksum(req.netns, req.ifname, true).catch(() => undefined);
    }
    await tryStep(errors, `rename ${s.hostIface} back to ${s.representor}`, () => restoreRepresentor(links, s.hostIface, { name: s.representor, up: s.wasUp, arp: s.arpWasOn }));
    if (errors.length > 0) throw new OffloadDetachError(req.containerId, req.ifname, errors);
  }

  async function detachWithoutState(req: CniRequest, deviceID: string): Promise<void> {
    let ovsConf: OvsOffloadConf | null;
    let sysfsRoot: string;
    try {
      const conf = loadSriovConf(req.config, req.args, req.env);
      ovsConf = conf.ovs;
      sysfsRoot = conf.sysfsRoot;
    } catch {
      return; // a config that names no offload bridge: nothing of ours can be found
    }
    if (ovsConf === null) return;
    const cfg = offloadSettings(ovsConf);
    const ovs = client(cfg.ovsRunDir);
    const pod = { containerId: req.containerId, ifName: req.ifname };
    const errors: string[] = [];
    const names = new Set<string>([hostIfaceName(podIdentity(req.args).podName, req.containerId, req.ifname)]);
    try {
      for (const row of await findPodInterfaces(ovs, pod)) if (isValidIfName(row.name)) names.add(row.name);
      await detachPodPort(ovs, cfg.bridge, pod);
    } catch (e) {
      errors.push(`remove the port of container ${req.containerId} interface ${req.ifname} from ${cfg.bridge}: ${errorMessage(e)}`);
    }
    const sysfs = new Sysfs(sysfsRoot);
    let discovered: string | null = null;
    try {
      discovered = (await discoverRepresentor(sysfs, deviceID, null)).representor;
    } catch {
      // not switchdev any more, or the VF is gone: phys_port_name may still tell
    }
    for (const name of names) {
      const link = await links.host(name);
      if (link === null) continue;
      const orig = originalName(sysfs, deviceID, discovered, name);
      // Unknown, or already taken (then `name` is not the representor we renamed): leave it.
      if (orig === null || (await links.host(orig)) !== null) continue;
      try {
        await links.rename(name, orig, { arp: true, up: link.up });
      } catch (e) {
        errors.push(`rename ${name} back to ${orig}: ${errorMessage(e)}`);
      }
    }
    if (errors.length > 0) throw new OffloadDetachError(req.containerId, req.ifname, errors);
  }

  async function detach(ctx: OffloadDetachContext): Promise<void> {
    const s = decodeOffloadState(ctx.state);
    if (s !== null) await detachWithState(ctx.req, s);
    else await detachWithoutState(ctx.req, ctx.deviceID);
  }

  async function check(ctx: OffloadDetachContext): Promise<void> {
    const { req } = ctx;
    const s = decodeOffloadState(ctx.state);
    if (s === null) throw new OffloadCheckError(`no offload state for container ${req.containerId} interface ${req.ifname}`);
    let ports: PodInterface[];
    try {
      ports = await listPodInterfaces(client(s.ovsRunDir), s.bridge);
    } catch (e) {
      throw new OffloadCheckError(`failed to list the ports of Open vSwitch bridge ${s.bridge}: ${errorMessage(e)}`);
    }
    const port = ports.find((p) => p.name === s.hostIface);
    if (!port) throw new OffloadCheckError(`no Open vSwitch port ${s.hostIface} with the pod's external_ids on bridge ${s.bridge}`);
    if (port.containerId !== req.containerId || port.ifName !== req.ifname) {
      throw new OffloadCheckError(`Open vSwitch port ${port.name} belongs to container ${port.containerId} interface ${port.ifName}, not ${req.containerId} ${req.ifname}`);
    }
    const prev = req.config.prevResult;
    if (!prev) throw new OffloadCheckError('Required prevResult missing');
    const ifaces = prev.interfaces ?? [];
    const host = ifaces.find((i) => i.sandbox === undefined || i.sandbox === '');
    if (host && host.name !== port.name) throw new OffloadCheckError(`Open vSwitch port of ${req.ifname} is ${port.name}, but prevResult names ${host.name}`);
    const podIdx = ifaces.findIndex((i) => i.name === req.ifname && i.sandbox === req.netns);
    const podIface = ifaces[podIdx];
    if (podIface?.mac !== undefined && podIface.mac.toLowerCase() !== port.mac) {
      throw new OffloadCheckError(`Open vSwitch port ${port.name} carries MAC ${port.mac}, but prevResult has ${podIface.mac}`);
    }
    const want = podAddress((prev.ips ?? []).filter((i) => i.interface === undefined || i.interface === podIdx));
    if (want === null) throw new OffloadCheckError(`prevResult has no IPv4 address for ${req.ifname}`);
    if (!port.ip.equals(want.ip)) throw new OffloadCheckError(`Open vSwitch port ${port.name} carries IP ${port.ip.toString()}, but prevResult has ${want.ip.toString()}`);
  }

  return { attach, detach, check };
}

/** The real offload step: OVS through its command-line tools, links through ip and ethtool. */
export const ovsOffload: OffloadHooks = createOvsOffload();
