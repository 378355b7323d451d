// The bridge plugin: a drop-in for the reference plugins/main/bridge (same keys, result, kernel
// objects and chain names), built to spawn few processes:
//
//   ADD  host:  one `ip -force -batch`: bridge created or read (as it was before our port joined),
//               veth pair with the container end created directly in the pod netns (held open as
//               fd 3), port flags, up                    ‖ IPAM ADD (in-process for weft's host-local)
//        then   `nsenter sysctl -p-` (layer 3)  ‖ `bridge -batch` (VLANs only)
//        then   `nsenter ip -batch`: addresses, up, routes, read back
//               (both pod-side programs are started right after the host batch and wait on
//               stdin: only their input, not their start-up, is on the critical path)
//               ‖ one `ip -batch` for the gateway address + MAC pin (only when it changes)
//               ‖ ipMasq: one `iptables-restore` per family (or one `nft -j`)
//        Any failure undoes what was made (veth, IPAM reservation, rules) and reports the first
//        error; a netns deleted meanwhile is detected at the end and fails the ADD the same way.
//   DEL  at once: IPAM DEL (never needs the netns), the pod end deleted from inside the netns
//        (when there is one), the ipMasq chain found by its name — so the rules go even when the
//        netns is gone or CNI_NETNS is empty (reference bug #810).
//   CHECK as the reference; GC: IPAM GC + this network's ipMasq state of stale containers;
//   STATUS: IPAM STATUS.
import type { Family } from '../../src/util/ip.js';
import { cniPathDelegates } from '../skel/delegate.js';
import { CniError, ErrorCode, type CniInterface, type CniPlugin, type CniRequest, type CniResult, type Delegates } from '../skel/types.js';
import { internalError, Undo, withCleanup } from '../skel/rollback.js';
import { checkAttachment } from './check.js';
import { containerMac, loadBridgeConf, validateForAdd, type BridgeConf } from './config.js';
import {
  bridgeBatch,
  ensureHostSysctl,
  hostLinkNames,
  ipBatch,
  linksOf,
  NetnsHandle,
  podSysctls,
  routesOf,
  startPodIpBatch,
  startPodSysctls,
  writeHostSysctl,
  type IpBatchResult,
  type PendingPodBatch,
  type PendingPodSysctls,
  type IpLink,
  batchFailure,
} from './iproute.js';
import {
  gcIptablesMasq,
  gcNftMasq,
  masqAddr,
  onPath,
  type MasqAddr,
  resolveMasqBackend,
  setupIptablesMasq,
  setupNftMasq,
  teardownIptablesMasq,
  teardownNftMasq,
} from './ipmasq.js';
import {
  addrReplaceLine,
  calcGateways,
  hostBatch,
  podAddressLines,
  podRouteLines,
  podIPv6Sysctls,
  podSysctlSettings,
  portVlanLines,
  planGatewayAddrs,
  randomVethName,
  vlanGatewayLines,
  type BatchLine,
  type Gateways,
} from './plan.js';
import { setupSpoofCheck, spoofRefId, teardownSpoofCheck } from './spoofcheck.js';
import { randomBytesSync } from '../skel/random.js';

export type IpamDelegates = Delegates;

export interface BridgeDeps {
  readonly ipam: IpamDelegates;
}

const VETH_NAME_ATTEMPTS = 10;
/** A plain timer: node:timers/promises would be one more module to load at start. */
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
/** The reference's waits for the host veth to become operationally up. */
const OPER_UP_SLEEPS_MS = [0, 50, 500, 1000, 1000];
const SETTLE_TIMEOUT_MS = 5000;

/** What a host-side or pod-side `ip` batch refused, in the reference's words plus ip's own. */
export class LinkSetupError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'LinkSetupError';
  }
}

function batchError(r: IpBatchResult, lines: readonly BatchLine[]): LinkSetupError {
  return new LinkSetupError(batchFailure(r, lines));
}

interface HostDone {
  /** The bridge as read before our port joined (type, MAC to pin, addresses). */
  readonly bridgeBefore: IpLink;
  /** The bridge and host veth as read at the end. */
  readonly bridge: IpLink;
  readonly hostVeth: IpLink;
  /** The VLAN gateway port `<bridge>.<vlan>` when it exists. */
  readonly vlanGw: IpLink | null;
}

/**
 * The host side before IPAM, in one `ip -force -batch`: bridge (create or read), veth pair with
 * the container end directly in the pod netns, port flags. A host veth name collision is retried
 * with a new name (as the reference, up to 10 times); "File exists" without a collision means
 * the pod already has CNI_IFNAME.
 */
async function plugHost(req: CniRequest, conf: BridgeConf, ns: NetnsHandle, undo: Undo): Promise<HostDone> {
  const br = conf.bridge;
  const vlanGwName = conf.ipamType !== '' && conf.isGateway && conf.vlan !== 0 ? `${br}.${conf.vlan}` : null;
  for (let attempt = 1; ; attempt++) {
    const hostVeth = randomVethName(randomBytesSync(4));
    const b = hostBatch({
      bridge: br,
      mtu: conf.mtu,
      vlanFiltering: conf.vlan !== 0 || conf.vlanTrunk.length > 0,
      vlanGw: vlanGwName,
      hostVeth,
      ifname: req.ifname,
      mac: containerMac(conf),
      hairpin: conf.hairpinMode,
      isolated: conf.portIsolation,
      promisc: conf.promiscMode,
      peerNetns: NetnsHandle.CHILD_PATH,
    });
    const r = await ipBatch(
      b.lines.map((l) => l.line),
      { json: true, details: true, force: true, passNetns: ns },
    );
    const msg = (n: number): string => r.byLine.get(n) ?? '';
    const vethMade = !r.failedLines.includes(b.vethAdd);
    if (vethMade) {
      // Deleting the host end removes both ends.
      undo.push(`delete ${hostVeth}`, async () => {
        const d = await ipBatch([`link del dev ${hostVeth}`]);
        if (d.code !== 0 && !/Cannot find device|does not exist/.test(d.message)) throw new Error(d.message);
      });
    }
    const links = linksOf(r.docs);
    // `address show` prints the bridge first as it was before the port joined; `link show` last.
    const bridgeBefore = links.find((l) => l.ifname === br);
    if (!bridgeBefore) {
      const why = r.failedLines.includes(b.bridgeAdd) ? `could not add "${br}": ${msg(b.bridgeAdd)}` : `could not lookup "${br}": ${msg(b.bridgeRead)}`;
      throw internalError(`failed to create bridge "${br}": ${why}`);
    }
    if (bridgeBefore.kind !== 'bridge') throw internalError(`failed to create bridge "${br}": "${br}" already exists but is not a bridge`);
    const unexpected = r.failedLines.filter(
      (n) => !(n === b.bridgeAdd && /File exists/.test(msg(n))) && n !== b.vlanGwRead,
    );
    if (unexpected.length > 0) {
      const n = unexpected[0]!;
      if (n === b.vethAdd && /File exists/.test(msg(n))) {
        const collided = hostLinkNames().has(hostVeth);
        if (collided && attempt < VETH_NAME_ATTEMPTS) continue;
        if (!collided) throw internalError(`container veth name provided (${req.ifname}) already exists`);
      }
      throw new LinkSetupError(`${b.lines[n - 1]?.what ?? 'ip'}: ${msg(n) || r.message}`);
    }
    const bridge = [...links].reverse().find((l) => l.ifname === br) ?? bridgeBefore;
    const veth = links.find((l) => l.ifname === hostVeth);
    if (!veth) throw internalError(`failed to lookup "${hostVeth}": not in ip's output`);
    try {
      writeHostSysctl(`net/ipv6/conf/${br}/accept_ra`, '0'); // we want to own the routes for these interfaces
      writeHostSysctl(`net/ipv6/conf/${hostVeth}/accept_ra`, '0');
    } catch {
      // IPv6 disabled: nothing to own
    }
    const vlanGw = vlanGwName ? (links.find((l) => l.ifname === vlanGwName) ?? null) : null;
    return { bridgeBefore, bridge, hostVeth: veth, vlanGw };
  }
}

async function applyVlans(conf: BridgeConf, host: HostDone, port: string): Promise<void> {
  const pvid = typeof host.bridgeBefore.infoData.vlan_default_pvid === 'number' ? host.bridgeBefore.infoData.vlan_default_pvid : 1;
  const isGwPort = port !== host.hostVeth.ifname;
  const lines = portVlanLines(port, conf.vlan, isGwPort ? [] : conf.vlanTrunk, conf.preserveDefaultVlan, pvid);
  if (lines.length === 0) return;
  const r = await bridgeBatch(lines);
  if (r.code !== 0) throw new LinkSetupError(`failed to setup vlan tag on interface "${port}": ${r.message}`);
}

interface GatewayDone {
  /** The bridge as read after the gateway changes (its MAC goes in the result). */
  readonly bridge: IpLink;
  readonly gwIface: IpLink | null;
}

/**
 * After IPAM: the gateway address(es) on the bridge — or on the `<bridge>.<vlan>` gateway port,
 * created if missing — with the reference's conflict rules and MAC pin, and forwarding on. One
 * more `ip` batch, only when something has to change (usually just for the first pod).
 */
async function configureGateway(conf: BridgeConf, host: HostDone, gws: Gateways): Promise<GatewayDone> {
  const gateways = [...gws.v4, ...gws.v6];
  if (!conf.isGateway || gateways.length === 0) return { bridge: host.bridge, gwIface: null };
  const lines: BatchLine[] = [];
  let dev = conf.bridge;
  let existing = host.bridgeBefore.addrs;
  let pinMac: string | null = host.bridgeBefore.address;
  let errorPrefix = 'failed to set bridge addr';
  let newPeer: string | null = null;
  if (conf.vlan !== 0) {
    dev = `${conf.bridge}.${conf.vlan}`;
    errorPrefix = 'failed to set vlan interface for bridge with addr';
    if (host.vlanGw) {
      existing = host.vlanGw.addrs;
      pinMac = host.vlanGw.address;
    } else {
      newPeer = randomVethName(randomBytesSync(4));
      lines.push(...vlanGatewayLines(conf.bridge, dev, newPeer, host.bridge.mtu));
      existing = [];
      pinMac = null; // a new veth's MAC does not float
    }
  }
  const plan = planGatewayAddrs(dev, existing, gateways, conf.forceAddress, errorPrefix);
  for (const d of plan.del) lines.push({ line: `address del ${d} dev ${dev}`, what: `${errorPrefix}: could not remove IP address from "${dev}"` });
  for (const a of plan.add) lines.push({ line: addrReplaceLine(a, dev), what: `${errorPrefix}: could not add IP address to "${dev}"` });
  // Pin the MAC to its value from before our port joined, or the bridge takes the lowest port MAC
  // and changes as ports churn. A bridge without ports may report all zeros (plugins#1265).
  if (plan.pin && pinMac && pinMac !== '00:00:00:00:00:00') {
    lines.push({ line: `link set dev ${dev} address ${pinMac}`, what: `${errorPrefix}: could not set bridge's mac` });
  }
  let bridge = host.bridge;
  let gwIface = host.vlanGw;
  if (lines.length > 0) {
    lines.push({ line: `link show dev ${conf.bridge}`, what: `could not lookup "${conf.bridge}"` });
    if (dev !== conf.bridge) lines.push({ line: `link show dev ${dev}`, what: `failed to lookup "${dev}"` });
    const r = await ipBatch(
      lines.map((l) => l.line),
      { json: true, details: true },
    );
    // The VLAN gateway port, like the bridge and its address, is shared and stays (as upstream).
    if (r.code !== 0) throw batchError(r, lines);
    const links = linksOf(r.docs);
    bridge = links.find((l) => l.ifname === conf.bridge) ?? bridge;
    if (dev !== conf.bridge) gwIface = links.find((l) => l.ifname === dev) ?? null;
    if (newPeer) await applyVlans(conf, host, newPeer);
  }
  try {
    if (gws.v4.length > 0) ensureHostSysctl('net/ipv4/ip_forward', '1');
    if (gws.v6.length > 0) ensureHostSysctl('net/ipv6/conf/all/forwarding', '1');
  } catch (e) {
    throw internalError(`failed to enable forwarding: ${(e as Error).message}`);
  }
  return { bridge, gwIface: dev !== conf.bridge ? gwIface : null };
}

/** ip.SettleAddresses: wait until no IPv6 address of the interface is tentative (DAD on). */
async function settleAddresses(ns: NetnsHandle, ifname: string): Promise<void> {
  const deadline = Date.now() + SETTLE_TIMEOUT_MS;
  while (true) {
    const r = await ipBatch([`address show dev ${ifname}`], { netns: ns, json: true });
    const link = linksOf(r.docs)[0];
    const pending = (link?.addrs ?? []).some((a) => a.family === 'inet6' && (a.tentative || a.dadfailed));
    if (!pending) return;
    if (Date.now() > deadline) throw internalError(`link ${ifname} still has tentative addresses after ${SETTLE_TIMEOUT_MS / 1000} seconds`);
    await sleep(50);
  }
}

/**
 * The pod side after IPAM: addresses, up, routes; returns the container interface as read back.
 * The first batch goes to `pending`, the pod-side `ip` started at the beginning of the ADD.
 */
async function configurePod(req: CniRequest, conf: BridgeConf, gws: Gateways | null, ns: NetnsHandle, pending: PendingPodBatch): Promise<IpLink> {
  const ifname = req.ifname;
  const up = !conf.disableContainerInterface;
  const lines: BatchLine[] = [];
  let settle = false;
  if (gws) {
    const hasV6 = gws.ips.some((i) => i.address.includes(':'));
    // ipam.ConfigureIface: IPv6 must be enabled on lo and the interface before adding v6 addresses.
    if (hasV6) await podSysctls(ns, podIPv6Sysctls(ifname));
    lines.push(...podAddressLines(ifname, gws.ips, up));
    // With DAD on, routes via an IPv6 gateway wait for the addresses to settle, as the reference.
    settle = conf.enabledad && hasV6 && gws.ips.some((i) => i.gateway?.includes(':') === true);
    if (!settle) lines.push(...podRouteLines(ifname, gws.ips, gws.routes));
  } else if (up) {
    lines.push({ line: `link set dev ${ifname} up`, what: `failed to set "${ifname}" up` });
  }
  lines.push({ line: `link show dev ${ifname}`, what: 'failed to retrieve link' });
  let r = await pending.run(lines.map((l) => l.line));
  if (r.code !== 0) throw batchError(r, lines);
  if (settle && gws) {
    await settleAddresses(ns, ifname);
    const more = [...podRouteLines(ifname, gws.ips, gws.routes), { line: `link show dev ${ifname}`, what: 'failed to retrieve link' }];
    r = await ipBatch(
      more.map((l) => l.line),
      { netns: ns, json: true },
    );
    if (r.code !== 0) throw batchError(r, more);
  }
  const link = linksOf(r.docs).find((l) => l.ifname === ifname);
  if (!link) throw internalError(`failed to retrieve link ${ifname}: not in ip's output`);
  return link;
}

/** The reference waits (0, 50, 500, 1000, 1000 ms) for the host veth to be operationally up. */
async function waitPortUp(hostVeth: string, podLink: IpLink): Promise<void> {
  // The pod end is UP exactly when its peer (our port) is up too: usually nothing to wait for.
  if (podLink.operstate === 'UP') return;
  let state = 'UNKNOWN';
  for (const ms of OPER_UP_SLEEPS_MS) {
    await sleep(ms);
    const r = await ipBatch([`link show dev ${hostVeth}`], { json: true });
    const l = linksOf(r.docs)[0];
    if (!l) throw internalError(`failed to lookup "${hostVeth}": ${r.message}`);
    state = l.operstate;
    if (state === 'UP') return;
  }
  throw internalError(`bridge port in error state: ${state.toLowerCase()}`);
}


async function setupMasq(req: CniRequest, conf: BridgeConf, gws: Gateways): Promise<void> {
  const addrs = gws.ips.map((i) => masqAddr(i.address));
  if (resolveMasqBackend(conf.ipMasqBackend) === 'nftables') await setupNftMasq(addrs, conf.name, req.ifname, req.containerId);
  else await setupIptablesMasq(addrs, conf.name, req.containerId);
}

/**
 * Removes the ipMasq state of the attachment in both backends, as upstream does (the pod may have
 * been set up by another version or config). Failures of the backend this config uses are
 * reported; the other backend is best effort, as is a family we only guessed.
 */
async function teardownMasq(req: CniRequest, conf: BridgeConf, families: readonly Family[], guessed: boolean, ips: readonly MasqAddr[] = []): Promise<void> {
  const primary = resolveMasqBackend(conf.ipMasqBackend);
  const tasks: Array<Promise<void>> = [];
  for (const f of families) {
    if (!onPath(f === 4 ? 'iptables' : 'ip6tables')) continue;
    const known = ips.filter((a) => a.family === f).map((a) => a.ip);
    tasks.push(
      teardownIptablesMasq(f, conf.name, req.containerId, known).catch((e: unknown) => {
        if (primary === 'iptables' && !guessed) throw e;
      }),
    );
  }
  if (onPath('nft')) {
    tasks.push(
      teardownNftMasq(conf.name, req.ifname, req.containerId).catch((e: unknown) => {
        if (primary === 'nftables') throw e;
      }),
    );
  }
  const results = await Promise.allSettled(tasks);
  const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed.length > 0) throw internalError(failed.map((f) => (f.reason as Error).message).join('; '));
}

async function add(deps: BridgeDeps, req: CniRequest): Promise<CniResult> {
  const conf = loadBridgeConf(req.config, req.args);
  validateForAdd(conf);
  const ns = NetnsHandle.openForPod(req.netns);
  const undo = new Undo();
  const early = new EarlyPod(ns, conf.ipamType !== '');
  try {
    return await addIn(deps, req, conf, ns, undo, early);
  } catch (e) {
    early.cancel(); // before the undo: nothing more may happen in the pod
    throw withCleanup(e, await undo.run());
  } finally {
    early.cancel();
    await early.done();
    ns.close();
  }
}

/**
 * The pod-side programs of an ADD (`ip -batch`, and `sysctl` for layer 3), started right after
 * the host batch and given their input when it is known, so that their start-up (fork, nsenter,
 * exec) overlaps the host batch and IPAM instead of following them. Whatever was not given its
 * input is cancelled (it exits doing nothing) when the ADD ends.
 */
class EarlyPod {
  private started: { readonly batch: PendingPodBatch; readonly sysctls: PendingPodSysctls | null } | null = null;

  constructor(
    private readonly ns: NetnsHandle,
    private readonly layer3: boolean,
  ) {}

  start(): { readonly batch: PendingPodBatch; readonly sysctls: PendingPodSysctls | null } {
    this.started ??= { batch: startPodIpBatch(this.ns, { json: true }), sysctls: this.layer3 ? startPodSysctls(this.ns) : null };
    return this.started;
  }

  cancel(): void {
    this.started?.batch.cancel();
    this.started?.sysctls?.cancel();
  }

  async done(): Promise<void> {
    await Promise.all([this.started?.batch.done(), this.started?.sysctls?.done()]);
  }
}

/** IPAM plugins that refuse a second allocation for the same attachment (host-local does). */
const REFUSES_DUPLICATES = new Set(['host-local']);

async function addIn(deps: BridgeDeps, req: CniRequest, conf: BridgeConf, ns: NetnsHandle, undo: Undo, early: EarlyPod): Promise<CniResult> {
  const layer3 = conf.ipamType !== '';
  // The reference creates the veth before IPAM so that a duplicate ADD fails before it could
  // reach an IPAM DEL releasing the existing attachment's address. An IPAM that refuses the
  // duplicate itself cannot be released by mistake, so it runs alongside the host batch.
  const hostP = plugHost(req, conf, ns, undo);
  const pod = early.start(); // after the host batch's spawn: that one is on the critical path
  const ipamAdd = async (): Promise<CniResult | null> => {
    if (!layer3) return null;
    const r = await deps.ipam.add(req, conf.ipamType, req.stdin);
    undo.push(`release IP (${conf.ipamType} DEL)`, () => deps.ipam.del(req, conf.ipamType, req.stdin));
    return r;
  };
  const ipamP = REFUSES_DUPLICATES.has(conf.ipamType) ? ipamAdd() : hostP.then(ipamAdd);
  const gwsP = ipamP.then((ipam) => {
    if (!ipam) return null;
    if ((ipam.ips ?? []).length === 0) throw internalError('IPAM plugin returned missing IP config');
    try {
      return calcGateways(ipam, conf);
    } catch (e) {
      throw e instanceof CniError ? e : internalError((e as Error).message);
    }
  });
  // The masquerade rules only need the addresses: they go in while the pod is configured.
  const masqP = gwsP.then((gws) => {
    if (!gws || !conf.ipMasq) return;
    const families = [...new Set(gws.ips.map((i) => masqAddr(i.address).family))];
    const addrs = gws.ips.map((i) => masqAddr(i.address));
    undo.push('remove ipMasq rules', () => teardownMasq(req, conf, families, false, addrs));
    return setupMasq(req, conf, gws);
  });
  masqP.catch(() => undefined); // handled when joined below; never an unhandled rejection meanwhile
  // The container sysctls (before its addresses) and the port's VLANs only need the veth.
  const sysP = hostP.then((): Promise<unknown> => (pod.sysctls ? pod.sysctls.run(podSysctlSettings(req.ifname, conf.enabledad)) : Promise.resolve()));
  const vlanP = hostP.then((host) => applyVlans(conf, host, host.hostVeth.ifname));
  const setup = await Promise.allSettled([hostP, ipamP, gwsP, sysP, vlanP]);
  const failed = setup.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await masqP.catch(() => undefined); // let it finish before the undo removes its rules
    throw failed.reason;
  }
  const host = await hostP;
  const ipam = await ipamP;
  const gws = await gwsP;

  const [gwR, podR, masqR] = await Promise.allSettled([
    gws ? configureGateway(conf, host, gws) : Promise.resolve({ bridge: host.bridge, gwIface: null }),
    configurePod(req, conf, gws, ns, pod.batch),
    masqP,
  ]);
  for (const r of [podR, gwR, masqR]) if (r.status === 'rejected') throw r.reason;
  const gw = (gwR as PromiseFulfilledResult<GatewayDone>).value;
  const podLink = (podR as PromiseFulfilledResult<IpLink>).value;

  if (conf.macspoofchk) {
    const refId = spoofRefId(req.containerId, req.ifname);
    undo.push('remove spoof-check rules', () => teardownSpoofCheck(refId));
    await setupSpoofCheck(host.hostVeth.ifname, podLink.address, refId);
  }
  if (!conf.disableContainerInterface) await waitPortUp(host.hostVeth.ifname, podLink);
  // We held the netns open throughout; if its path was deleted meanwhile, the pod is gone.
  if (!ns.stillMounted()) throw internalError(`failed to open netns "${req.netns}": the netns was deleted during ADD`);

  const interfaces: CniInterface[] = [
    { name: gw.bridge.ifname, mac: gw.bridge.address },
    { name: host.hostVeth.ifname, mac: host.hostVeth.address },
    { name: req.ifname, mac: podLink.address, sandbox: req.netns },
  ];
  if (gw.gwIface) interfaces.push({ name: gw.gwIface.ifname, mac: gw.gwIface.address });
  const result: CniResult = { cniVersion: '1.1.0', interfaces };
  if (gws) {
    result.ips = gws.ips;
    if (gws.routes.length > 0) result.routes = gws.routes;
  }
  const dns = conf.dns ?? ipam?.dns;
  if (dns) result.dns = dns;
  return result;
}

/** Deletes the container interface from inside the netns; returns the families of its global addresses. */
async function deletePodLink(ns: NetnsHandle, ifname: string): Promise<Family[]> {
  const lines = [`address show dev ${ifname}`, `link del dev ${ifname}`];
  const r = await ipBatch(lines, { netns: ns, json: true });
  if (r.code !== 0) {
    // Already gone: DEL may run any number of times.
    if (r.failedLines[0] === 1 && /does not exist|Cannot find device/.test(r.message)) return [];
    throw internalError(`failed to delete "${ifname}": ${r.message}`);
  }
  const link = linksOf(r.docs)[0];
  const fams = new Set<Family>();
  for (const a of link?.addrs ?? []) if (a.scope === 'global') fams.add(a.family === 'inet' ? 4 : 6);
  return [...fams];
}

async function del(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  const layer3 = conf.ipamType !== '';
  const ns = NetnsHandle.openIfPresent(req.netns);
  try {
    // Everything at once: the IPAM release never waits for (or depends on) the netns, and the
    // ipMasq rules are found by chain name, so neither needs the pod.
    const podP = ns ? deletePodLink(ns, req.ifname) : null;
    const tasks: Array<Promise<unknown>> = [];
    if (layer3) tasks.push(deps.ipam.del(req, conf.ipamType, req.stdin));
    if (podP) tasks.push(podP);
    if (layer3 && conf.ipMasq) {
      tasks.push(
        (async () => {
          // The families to clean: from the stored result, else from the live interface, else both.
          const prevIps = (req.config.prevResult?.ips ?? []).flatMap((i) => {
            try {
              return [masqAddr(i.address)];
            } catch {
              return []; // an unparsable stored address: found by listing instead
            }
          });
          const fromResult = [...new Set(prevIps.map((a) => a.family))];
          if (fromResult.length > 0) return teardownMasq(req, conf, fromResult, false, prevIps);
          const live = podP ? await podP.catch(() => [] as Family[]) : [];
          if (live.length > 0) return teardownMasq(req, conf, live, false);
          return teardownMasq(req, conf, [4, 6], true);
        })(),
      );
    }
    if (conf.macspoofchk && onPath('nft')) tasks.push(teardownSpoofCheck(spoofRefId(req.containerId, req.ifname)));
    const results = await Promise.allSettled(tasks);
    const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed.length > 0) {
      const first = failed[0]!.reason as unknown;
      if (failed.length === 1 && first instanceof CniError) throw first;
      throw internalError(failed.map((f) => (f.reason as Error).message).join('; '));
    }
  } finally {
    ns?.close();
  }
}

async function check(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  const ns = NetnsHandle.openForPod(req.netns);
  try {
    // The reference delegates CHECK even without IPAM (and so fails); a layer-2 config has nothing to check there.
    if (conf.ipamType !== '') await deps.ipam.check(req, conf.ipamType, req.stdin);
    const prev = req.config.prevResult;
    if (!prev) throw internalError('Required prevResult missing');
    const hostNames = new Set<string>([conf.bridge]);
    for (const i of prev.interfaces ?? []) if (!i.sandbox && i.name) hostNames.add(i.name);
    const [hostR, podR] = await Promise.all([
      ipBatch(
        [...hostNames].map((n) => `link show dev ${n}`),
        { json: true, details: true, force: true },
      ),
      ipBatch([`address show dev ${req.ifname}`, 'route show table all'], { netns: ns, json: true, details: true, force: true }),
    ]);
    const hostLinks = new Map(linksOf(hostR.docs).map((l) => [l.ifname, l]));
    const podLink = linksOf(podR.docs).find((l) => l.ifname === req.ifname) ?? null;
    const podRoutes = podR.docs.flatMap((d) => routesOf(d));
    checkAttachment({ conf, ifname: req.ifname, netns: req.netns, prev, hostLinks, podLink, podRoutes });
  } finally {
    ns.close();
  }
}

/** The attachments a GC request says are still in use (null: the runtime sent none). */
export function gcAttachments(config: Record<string, unknown>): Array<{ containerId: string; ifname: string }> | null {
  const raw = config['cni.dev/valid-attachments'] ?? config['cni.dev/attachments'];
  if (!Array.isArray(raw)) return null;
  const out: Array<{ containerId: string; ifname: string }> = [];
  for (const a of raw) {
    if (typeof a !== 'object' || a === null) continue;
    const { containerID, ifname } = a as { containerID?: unknown; ifname?: unknown };
    if (typeof containerID === 'string') out.push({ containerId: containerID, ifname: typeof ifname === 'string' ? ifname : '' });
  }
  return out;
}

async function gc(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  const errors: unknown[] = [];
  if (conf.ipamType !== '') {
    try {
      await deps.ipam.gc(req, conf.ipamType, req.stdin);
    } catch (e) {
      errors.push(e);
    }
  }
  const valid = gcAttachments(req.config);
  // Without a valid list we cannot tell live from stale: leave the rules alone.
  if (valid !== null) {
    const keep = new Set(valid.map((a) => a.containerId));
    const tasks: Array<Promise<unknown>> = [];
    if (onPath('iptables-save')) tasks.push(gcIptablesMasq(4, conf.name, keep));
    if (onPath('ip6tables-save')) tasks.push(gcIptablesMasq(6, conf.name, keep).catch(() => [])); // IPv6 may be unusable
    if (onPath('nft')) tasks.push(gcNftMasq(conf.name, valid));
    for (const r of await Promise.allSettled(tasks)) if (r.status === 'rejected') errors.push(r.reason);
  }
  if (errors.length === 1 && errors[0] instanceof CniError) throw errors[0];
  if (errors.length > 0) throw internalError(errors.map((e) => (e as Error).message).join('; '));
}

async function status(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  if (conf.ipamType !== '') await deps.ipam.status(req, conf.ipamType, req.stdin);
}

/** Builds the plugin over its IPAM delegates (the real ones, or fakes in tests). */
export function createBridgePlugin(deps: BridgeDeps): CniPlugin {
  return {
    name: 'bridge',
    add: (req) => add(deps, req),
    del: (req) => del(deps, req),
    check: (req) => check(deps, req),
    gc: (req) => gc(deps, req),
    status: (req) => status(deps, req),
  };
}

export const bridgePlugin: CniPlugin = createBridgePlugin({
  ipam: cniPathDelegates,
});
