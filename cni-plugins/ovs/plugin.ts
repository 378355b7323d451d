// The weft-ovs plugin: attaches a pod to the ovs backend's bridge (br-int) with a veth pair. It
// runs in the node netns, where ovs-vswitchd runs (the host end must be visible to it).
//
//   ADD   host: one `ip -batch`: veth pair (pod end created directly in the pod netns), `arp off`
//               on the host end (netdev), up      ‖ IPAM ADD (in-process for weft's host-local)
//         then  pod: one `nsenter ip -batch`: MAC = macFromIP(IPv4), address, up, routes
//               ‖ `nsenter ethtool -K <ifname> tx off` (netdev)
//               ‖ attachPodPort: port with the pod's external_ids + the pod's flows, under the
//                 flow lock the daemon also takes (src/backend/ovs/podport.ts)
//         Any failure undoes what was made (port + flows, veth, IPAM reservation), newest first.
//   DEL   at once: IPAM DEL, detachPodPort, the pod end deleted from inside the netns (or, with
//         the netns gone, the host end by its deterministic name). Nothing there is success.
//   CHECK IPAM CHECK; the port with the prevResult's name, IP and MAC; the pod interface with that
//         MAC and address.
//   GC    IPAM GC. STATUS: IPAM STATUS, then the bridge must exist (code 50 when OVS is not ready).
import { findPodInterfaces, attachPodPort, detachPodPort } from '../../src/backend/ovs/podport.js';
import { listPodInterfaces, type PodInterface } from '../../src/backend/ovs/bridge.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { errorMessage } from '../../src/util/errors.js';
import { execProgram } from '../../src/util/exec.js';
import { isValidIfName } from '../../src/util/names.js';
import { hostLinkNames } from '../lib/hostns.js';
import { batchFailure, ipBatch, startPodIpBatch, type IpBatchResult, type PendingPodBatch } from '../lib/ipbatch.js';
import { linksOf, type IpLink } from '../lib/ipjson.js';
import { addrShowLine, linkDelLine, type BatchLine } from '../lib/lines.js';
import { NetnsHandle } from '../lib/netns.js';
import { podIdentity, type PodIdentity } from '../lib/podargs.js';
import { internalError, Undo, withCleanup } from '../lib/rollback.js';
import { cniPathDelegates } from '../skel/delegate.js';
import { CniError, ErrorCode, type CniPlugin, type CniRequest, type CniResult, type Delegates } from '../skel/types.js';
import { loadOvsConf, OVS_PLUGIN_TYPE, type OvsConf } from './config.js';
import { buildResult, checkOvsAttachment, hostBatch, hostVethName, planAddressing, podBatch, type PodAddressing } from './plan.js';

export interface OvsPluginDeps {
  readonly ipam: Delegates;
  /** The Open vSwitch client for a run dir (default: src/ovs/cli.ts's OvsClient). */
  readonly ovs?: (runDir: string) => OvsClient;
}

/** IPAM plugins that refuse a second allocation for the same attachment (host-local does). */
const REFUSES_DUPLICATES = new Set(['host-local']);

/** An `ip` batch or a pod-side program refused a step. */
export class OvsLinkSetupError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'OvsLinkSetupError';
  }
}

/** Open vSwitch refused or could not be reached for a step of the attachment. */
export class OvsAttachError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'OvsAttachError';
  }
}

function batchError(r: IpBatchResult, lines: readonly BatchLine[]): OvsLinkSetupError {
  return new OvsLinkSetupError(batchFailure(r, lines));
}

function ovsClient(deps: OvsPluginDeps, conf: OvsConf): OvsClient {
  return deps.ovs ? deps.ovs(conf.ovsRunDir) : new OvsClient({ runDir: conf.ovsRunDir });
}

/** The veth pair with its pod end in the pod netns, host end up (and `arp off` for netdev). */
async function plugHost(req: CniRequest, conf: OvsConf, ns: NetnsHandle, hostVeth: string, undo: Undo): Promise<IpLink> {
  const b = hostBatch({ hostVeth, ifname: req.ifname, mtu: conf.mtu, arpOff: conf.datapathType === 'netdev', peerNetns: NetnsHandle.CHILD_PATH });
  const r = await ipBatch(
    b.lines.map((l) => l.line),
    { json: true, passNetns: ns },
  );
  const failedAt = r.code === 0 ? null : (r.failedLines[0] ?? 0);
  // Line 0: `ip` failed without naming a line, so the veth may exist; unless the name was taken
  // (another attachment's veth, which must stay).
  const vethFailed = failedAt !== null && (failedAt === b.vethAdd || (failedAt === 0 && /File exists/.test(r.message)));
  if (!vethFailed) {
    // Deleting the host end removes both ends.
    undo.push(`delete ${hostVeth}`, async () => {
      const d = await ipBatch([linkDelLine(hostVeth)]);
      if (d.code !== 0 && !/Cannot find device|does not exist/.test(d.message)) throw new Error(d.message);
    });
  }
  if (r.code !== 0) {
    if (vethFailed && /File exists/.test(r.message)) {
      // The name is derived from container ID + ifname: taken means this attachment exists.
      if (hostLinkNames().has(hostVeth)) {
        throw internalError(`container ${req.containerId} interface ${req.ifname} is already attached (host interface ${hostVeth} exists)`);
      }
      throw internalError(`container veth name provided (${req.ifname}) already exists`);
    }
    throw batchError(r, b.lines);
  }
  const link = linksOf(r.docs).find((l) => l.ifname === hostVeth);
  if (!link) throw internalError(`failed to lookup "${hostVeth}": not in ip's output`);
  return link;
}

/** The pod side: MAC, address, up, routes; the interface as read back. */
async function configurePod(req: CniRequest, a: PodAddressing, pending: PendingPodBatch): Promise<IpLink> {
  const lines = podBatch(req.ifname, a);
  const r = await pending.run(lines.map((l) => l.line));
  if (r.code !== 0) throw batchError(r, lines);
  const link = linksOf(r.docs).find((l) => l.ifname === req.ifname);
  if (!link) throw internalError(`failed to retrieve link ${req.ifname}: not in ip's output`);
  return link;
}

/**
 * netdev only: a veth with TX checksum offload hands OVS's userspace datapath packets with
 * unfinished checksums (TCP fails, ICMP works). Antrea does the same.
 */
async function txChecksumOff(ns: NetnsHandle, ifname: string): Promise<void> {
  const args = [`--net=${NetnsHandle.CHILD_PATH}`, 'ethtool', '-K', ifname, 'tx', 'off'];
  let r;
  try {
    r = await execProgram('nsenter', args, { nsFds: [ns.fd] });
  } catch (e) {
    throw new OvsLinkSetupError(`failed to turn TX checksum offload off on "${ifname}": ${errorMessage(e)}`);
  }
  if (r.code !== 0) {
    const why = r.stderr.trim() || r.stdout.trim() || `exit status ${r.code}`;
    const hint = /No such file|not found/i.test(why) ? ' (the netdev datapath needs ethtool: apt-get install ethtool)' : '';
    throw new OvsLinkSetupError(`failed to turn TX checksum offload off on "${ifname}" (ethtool -K ${ifname} tx off): ${why}${hint}`);
  }
}

/** The pod-side `ip -batch`, started early so its start-up overlaps the host batch and IPAM. */
class EarlyPod {
  private started: PendingPodBatch | null = null;

  constructor(private readonly ns: NetnsHandle) {}

  start(): PendingPodBatch {
    this.started ??= startPodIpBatch(this.ns, { json: true });
    return this.started;
  }

  cancel(): void {
    this.started?.cancel();
  }

  async done(): Promise<void> {
    await this.started?.done();
  }
}

async function add(deps: OvsPluginDeps, req: CniRequest): Promise<CniResult> {
  const conf = loadOvsConf(req.config);
  // The pod's name and namespace go on the port as external_ids (CNI_ARGS, from kubelet/CRI).
  const pod = podIdentity(req.args);
  const ns = NetnsHandle.openForPod(req.netns);
  const undo = new Undo();
  const early = new EarlyPod(ns);
  try {
    return await addIn(deps, req, conf, pod, ns, undo, early);
  } catch (e) {
    early.cancel(); // before the undo: nothing more may happen in the pod
    throw withCleanup(e, await undo.run());
  } finally {
    early.cancel();
    await early.done();
    ns.close();
  }
}

async function addIn(deps: OvsPluginDeps, req: CniRequest, conf: OvsConf, pod: PodIdentity, ns: NetnsHandle, undo: Undo, early: EarlyPod): Promise<CniResult> {
  const hostVeth = hostVethName(req.containerId, req.ifname);
  const ovs = ovsClient(deps, conf);
  const hostP = plugHost(req, conf, ns, hostVeth, undo);
  const pending = early.start();
  const ipamAdd = async (): Promise<CniResult> => {
    const r = await deps.ipam.add(req, conf.ipamType, req.stdin);
    undo.push(`release IP (${conf.ipamType} DEL)`, () => deps.ipam.del(req, conf.ipamType, req.stdin));
    return r;
  };
  // As the bridge plugin: an IPAM that refuses a duplicate attachment runs alongside the veth;
  // any other waits for it, so a duplicate ADD fails (on the veth name) before allocating.
  const ipamP = REFUSES_DUPLICATES.has(conf.ipamType) ? ipamAdd() : hostP.then(ipamAdd);
  const addrP = ipamP.then((r) => planAddressing(r, conf));
  const setup = await Promise.allSettled([hostP, ipamP, addrP]);
  const failed = setup.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
  const host = await hostP;
  const ipam = await ipamP;
  const a = await addrP;

  // Pushed before the attach starts: a port added by a call that then fails must go too.
  undo.push(`detach ${hostVeth} from ${conf.bridge}`, () => detachPodPort(ovs, conf.bridge, { containerId: req.containerId, ifName: req.ifname }));
  const attach = async (): Promise<number> => {
    try {
      return await attachPodPort(ovs, {
        bridge: conf.bridge,
        hostIface: hostVeth,
        containerId: req.containerId,
        ifName: req.ifname,
        ip: a.ip,
        mac: a.mac,
        gateway: a.gateway,
        ...pod,
      });
    } catch (e) {
      throw new OvsAttachError(`failed to attach ${hostVeth} to Open vSwitch bridge ${conf.bridge}: ${errorMessage(e)}`);
    }
  };
  const steps = await Promise.allSettled([
    configurePod(req, a, pending),
    conf.datapathType === 'netdev' ? txChecksumOff(ns, req.ifname) : Promise.resolve(),
    attach(),
  ]);
  for (const s of steps) if (s.status === 'rejected') throw s.reason;
  const podLink = (steps[0] as PromiseFulfilledResult<IpLink>).value;
  // We held the netns open throughout; if its path was deleted meanwhile, the pod is gone.
  if (!ns.stillMounted()) throw internalError(`failed to open netns "${req.netns}": the netns was deleted during ADD`);
  return buildResult({ name: host.ifname, mac: host.address }, { name: req.ifname, mac: podLink.address, sandbox: req.netns }, a, conf.dns ?? ipam.dns);
}

/** Deletes the pod interface from inside the netns (its veth peer goes with it). */
async function deletePodLink(ns: NetnsHandle, ifname: string): Promise<void> {
  const r = await ipBatch([linkDelLine(ifname)], { netns: ns });
  if (r.code !== 0 && !/does not exist|Cannot find device/.test(r.message)) throw internalError(`failed to delete "${ifname}": ${r.message}`);
}

/** With the pod netns gone: the host end, by its deterministic name and as OVS knows it. */
async function deleteHostVeths(ovs: OvsClient, req: CniRequest): Promise<void> {
  const names = new Set([hostVethName(req.containerId, req.ifname)]);
  try {
    for (const row of await findPodInterfaces(ovs, { containerId: req.containerId, ifName: req.ifname })) {
      if (isValidIfName(row.name)) names.add(row.name);
    }
  } catch {
    // OVS unreachable: the detach reports it; the deterministic name is still tried
  }
  const r = await ipBatch(
    [...names].map((n) => linkDelLine(n)),
    { force: true },
  );
  const real = r.message
    .split('; ')
    .filter((m) => m !== '' && !/does not exist|Cannot find device/.test(m));
  if (r.code !== 0 && real.length > 0) throw internalError(`failed to delete ${[...names].join(', ')}: ${real.join('; ')}`);
}

async function del(deps: OvsPluginDeps, req: CniRequest): Promise<void> {
  const conf = loadOvsConf(req.config);
  const ovs = ovsClient(deps, conf);
  const ns = NetnsHandle.openIfPresent(req.netns);
  try {
    const detach = detachPodPort(ovs, conf.bridge, { containerId: req.containerId, ifName: req.ifname }).catch((e: unknown) => {
      throw new OvsAttachError(`failed to detach container ${req.containerId} interface ${req.ifname} from Open vSwitch bridge ${conf.bridge}: ${errorMessage(e)}`);
    });
    const results = await Promise.allSettled([
      deps.ipam.del(req, conf.ipamType, req.stdin),
      detach,
      ns ? deletePodLink(ns, req.ifname) : deleteHostVeths(ovs, req),
    ]);
    const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed.length === 1 && failed[0]!.reason instanceof CniError) throw failed[0]!.reason;
    if (failed.length > 0) throw internalError(failed.map((f) => errorMessage(f.reason)).join('; '));
  } finally {
    ns?.close();
  }
}

async function check(deps: OvsPluginDeps, req: CniRequest): Promise<void> {
  const conf = loadOvsConf(req.config);
  const ns = NetnsHandle.openForPod(req.netns);
  try {
    await deps.ipam.check(req, conf.ipamType, req.stdin);
    const prev = req.config.prevResult;
    if (!prev) throw internalError('Required prevResult missing');
    const ovs = ovsClient(deps, conf);
    const [ports, podR] = await Promise.all([
      listPodInterfaces(ovs, conf.bridge).catch((e: unknown): PodInterface[] => {
        throw new OvsAttachError(`failed to list the ports of Open vSwitch bridge ${conf.bridge}: ${errorMessage(e)}`);
      }),
      ipBatch([addrShowLine(req.ifname)], { netns: ns, json: true, force: true }),
    ]);
    const port = ports.find((p) => p.containerId === req.containerId && p.ifName === req.ifname) ?? null;
    const podLink = linksOf(podR.docs).find((l) => l.ifname === req.ifname) ?? null;
    checkOvsAttachment({ bridge: conf.bridge, containerId: req.containerId, ifname: req.ifname, netns: req.netns, prev, port, podLink });
  } finally {
    ns.close();
  }
}

async function gc(deps: OvsPluginDeps, req: CniRequest): Promise<void> {
  // Ports are not collected here: other networks' attachments may share the bridge, and the
  // runtime's valid list covers only this network.
  const conf = loadOvsConf(req.config);
  await deps.ipam.gc(req, conf.ipamType, req.stdin);
}

async function status(deps: OvsPluginDeps, req: CniRequest): Promise<void> {
  const conf = loadOvsConf(req.config);
  await deps.ipam.status(req, conf.ipamType, req.stdin);
  const ovs = ovsClient(deps, conf);
  const notReady = (why: string) => new CniError(ErrorCode.PluginNotAvailable, `${OVS_PLUGIN_TYPE}: Open vSwitch is not ready: ${why}`);
  let bridges: string[];
  try {
    // list-br, not br-exists: the latter's "no" is an exit status, which reads like any failure.
    bridges = (await ovs.vsctl(['list-br'])).split('\n').map((l) => l.trim());
  } catch (e) {
    throw notReady(errorMessage(e));
  }
  if (!bridges.includes(conf.bridge)) throw notReady(`bridge ${conf.bridge} does not exist in ${ovs.dbSocket} (has weftd started with the ovs backend?)`);
}

/** Builds the plugin over its IPAM delegates (the real ones, or fakes in tests). */
export function createOvsPlugin(deps: OvsPluginDeps): CniPlugin {
  return {
    name: OVS_PLUGIN_TYPE,
    add: (req) => add(deps, req),
    del: (req) => del(deps, req),
    check: (req) => check(deps, req),
    gc: (req) => gc(deps, req),
    status: (req) => status(deps, req),
  };
}

export const ovsPlugin: CniPlugin = createOvsPlugin({
  ipam: cniPathDelegates,
});
