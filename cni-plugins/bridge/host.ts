// The bridge plugin's ADD on the host side: the one host batch before IPAM (bridge created or
// read as it was before our port joined, veth pair with the container end directly in the pod
// netns, port flags), the port's VLANs (`bridge -batch`), and after IPAM the gateway address on
// the bridge or its `<bridge>.<vlan>` gateway port with the reference's conflict rules and MAC pin.
import { errorMessage } from '../../src/util/errors.js';
import { ensureHostSysctl, hostLinkNames, writeHostSysctl } from '../lib/hostns.js';
import { batchFailure, bridgeBatch, ipBatch, type IpBatchResult } from '../lib/ipbatch.js';
import { linksOf, type IpLink } from '../lib/ipjson.js';
import { ipLine, named } from '../../src/render/ipbatch.js';
import { addrReplaceLine, linkDelLine, linkShowLine, type BatchLine } from '../lib/lines.js';
import { NetnsHandle } from '../lib/netns.js';
import { internalError, type Undo } from '../lib/rollback.js';
import { randomBytesSync } from '../skel/random.js';
import { CniError, ErrorCode, type CniRequest } from '../skel/types.js';
import { containerMac, type BridgeConf } from './config.js';
import { hostBatch, planGatewayAddrs, portVlanLines, randomVethName, vlanGatewayLines, type Gateways } from './plan.js';

const VETH_NAME_ATTEMPTS = 10;

/** What a host-side or pod-side `ip` batch refused, in the reference's words plus ip's own. */
export class LinkSetupError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'LinkSetupError';
  }
}

export function batchError(r: IpBatchResult, lines: readonly BatchLine[]): LinkSetupError {
  return new LinkSetupError(batchFailure(r, lines));
}

export interface HostDone {
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
export async function plugHost(req: CniRequest, conf: BridgeConf, ns: NetnsHandle, undo: Undo): Promise<HostDone> {
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
        const d = await ipBatch([linkDelLine(hostVeth)]);
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

export async function applyVlans(conf: BridgeConf, host: HostDone, port: string): Promise<void> {
  const pvid = typeof host.bridgeBefore.infoData.vlan_default_pvid === 'number' ? host.bridgeBefore.infoData.vlan_default_pvid : 1;
  const isGwPort = port !== host.hostVeth.ifname;
  const lines = portVlanLines(port, conf.vlan, isGwPort ? [] : conf.vlanTrunk, conf.preserveDefaultVlan, pvid);
  if (lines.length === 0) return;
  const r = await bridgeBatch(lines);
  if (r.code !== 0) throw new LinkSetupError(`failed to setup vlan tag on interface "${port}": ${r.message}`);
}

export interface GatewayDone {
  /** The bridge as read after the gateway changes (its MAC goes in the result). */
  readonly bridge: IpLink;
  readonly gwIface: IpLink | null;
}

/**
 * After IPAM: the gateway address(es) on the bridge — or on the `<bridge>.<vlan>` gateway port,
 * created if missing — with the reference's conflict rules and MAC pin, and forwarding on. One
 * more `ip` batch, only when something has to change (usually just for the first pod).
 */
export async function configureGateway(conf: BridgeConf, host: HostDone, gws: Gateways): Promise<GatewayDone> {
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
  for (const d of plan.del) lines.push({ line: ipLine('address', 'del', named('address', d), 'dev', named('device', dev)), what: `${errorPrefix}: could not remove IP address from "${dev}"` });
  for (const a of plan.add) lines.push({ line: addrReplaceLine(a, dev), what: `${errorPrefix}: could not add IP address to "${dev}"` });
  // Pin the MAC to its value from before our port joined, or the bridge takes the lowest port MAC
  // and changes as ports churn. A bridge without ports may report all zeros (plugins#1265).
  if (plan.pin && pinMac && pinMac !== '00:00:00:00:00:00') {
    lines.push({ line: ipLine('link', 'set', 'dev', named('device', dev), 'address', named('MAC', pinMac)), what: `${errorPrefix}: could not set bridge's mac` });
  }
  let bridge = host.bridge;
  let gwIface = host.vlanGw;
  if (lines.length > 0) {
    lines.push({ line: linkShowLine(conf.bridge), what: `could not lookup "${conf.bridge}"` });
    if (dev !== conf.bridge) lines.push({ line: linkShowLine(dev), what: `failed to lookup "${dev}"` });
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
    throw internalError(`failed to enable forwarding: ${errorMessage(e)}`);
  }
  return { bridge, gwIface: dev !== conf.bridge ? gwIface : null };
}
