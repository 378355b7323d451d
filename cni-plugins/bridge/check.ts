// CHECK, as the reference cmdCheck: the bridge, the container veth, its host peer on the bridge,
// then every prevResult address and route inside the pod — judged here over the kernel state the
// plugin read (pure, so every message is unit-tested), with the reference's messages.
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { CniError, ErrorCode, type CniInterface, type CniResult, type CniRoute } from '../skel/types.js';
import type { BridgeConf } from './config.js';
import { hasFlag, type IpLink, type IpRoute } from '../lib/ipjson.js';

/** A CHECK that found the attachment not as ADD left it (the reference's plain error: 999). */
export class BridgeCheckError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'BridgeCheckError';
  }
}

export interface CheckState {
  readonly conf: Pick<BridgeConf, 'bridge' | 'promiscMode'>;
  readonly ifname: string;
  readonly netns: string;
  readonly prev: CniResult;
  /** Host links by name (the bridge and any other result interface that exists). */
  readonly hostLinks: ReadonlyMap<string, IpLink>;
  /** The container interface with its addresses, or null when it is missing. */
  readonly podLink: IpLink | null;
  /** The pod's routes (all tables; only main counts, as the netlink library's default filter). */
  readonly podRoutes: readonly IpRoute[];
}

interface Found {
  found: boolean;
  ifindex: number;
  peerIndex: number;
  name: string;
}

const none = (): Found => ({ found: false, ifindex: 0, peerIndex: 0, name: '' });

function lookupHost(s: CheckState, intf: CniInterface): IpLink {
  if (!intf.name) throw new BridgeCheckError('Interface name missing ');
  const link = s.hostLinks.get(intf.name);
  if (!link) throw new BridgeCheckError(`Interface name ${intf.name} not found`);
  if (intf.sandbox) throw new BridgeCheckError(`Interface ${intf.name} should not be in sandbox`);
  return link;
}

function checkBridge(s: CheckState, intf: CniInterface): Found {
  const link = lookupHost(s, intf);
  if (link.kind !== 'bridge') throw new BridgeCheckError(`Interface ${intf.name} does not have link type of bridge`);
  if (intf.mac && intf.mac !== link.address) throw new BridgeCheckError(`Bridge interface ${intf.name} Mac doesn't match: ${intf.mac}`);
  const promisc = hasFlag(link, 'PROMISC');
  if (promisc !== s.conf.promiscMode) {
    throw new BridgeCheckError(
      `Bridge interface ${intf.name} configured Promisc Mode ${String(s.conf.promiscMode)} doesn't match current state: ${String(promisc)} `,
    );
  }
  return { found: true, ifindex: link.ifindex, peerIndex: 0, name: link.ifname };
}

function checkContainer(s: CheckState, intf: CniInterface): Found {
  if (!intf.name) throw new BridgeCheckError('Interface name missing ');
  const link = s.podLink;
  if (!link || link.ifname !== intf.name) throw new BridgeCheckError(`Interface name ${intf.name} not found`);
  if (!intf.sandbox) throw new BridgeCheckError(`Interface ${intf.name} is expected to be in a sandbox`);
  if (link.kind !== 'veth') throw new BridgeCheckError(`Error: Container interface ${link.ifname} not of type veth`);
  if (link.linkIndex === null) throw new BridgeCheckError(`Unable to obtain veth peer index for veth ${link.ifname}`);
  if (intf.mac && intf.mac !== link.address) {
    throw new BridgeCheckError(`Interface ${intf.name} Mac ${intf.mac} doesn't match container Mac: ${link.address}`);
  }
  return { found: true, ifindex: link.ifindex, peerIndex: link.linkIndex, name: link.ifname };
}

function checkHostVeth(s: CheckState, intf: CniInterface, br: Found, cont: Found): Found {
  const link = lookupHost(s, intf);
  if (link.kind !== 'veth') return none(); // not what CNI created: skipped
  if (link.linkIndex === null) throw new BridgeCheckError(`Unable to obtain veth peer index for veth ${link.ifname}`);
  if (link.ifindex !== cont.peerIndex || cont.ifindex !== link.linkIndex) return none();
  if (link.master !== br.name) return none();
  if (intf.mac && intf.mac !== link.address) throw new BridgeCheckError(`Interface ${intf.name} Mac doesn't match: ${intf.mac} not found`);
  return { found: true, ifindex: link.ifindex, peerIndex: link.linkIndex, name: link.ifname };
}

/** Go's net.IP / IPMask text inside a %+v of the v1.x types.Route. */
function goRoute(r: CniRoute): string {
  const net = IPNet.tryParse(r.dst);
  const ip = net ? net.ip.toString() : r.dst;
  let mask = '';
  if (net) {
    const bits = net.bits;
    const m = ((1n << BigInt(bits)) - 1n) ^ ((1n << BigInt(bits - net.prefix)) - 1n);
    mask = m.toString(16).padStart(bits / 4, '0');
  }
  return `{Dst:{IP:${ip} Mask:${mask}} GW:${r.gw ?? '<nil>'}}`;
}

function routeDst(r: IpRoute): IPNet | null {
  if (r.dst === 'default') return IPNet.of(IPAddr.of(r.family, 0n), 0);
  if (r.dst.includes('/')) return IPNet.tryParse(r.dst);
  const ip = IPAddr.tryParse(r.dst);
  return ip ? IPNet.of(ip, ip.bits) : null;
}

function mainRoutes(s: CheckState, family: 4 | 6): IpRoute[] {
  return s.podRoutes.filter((r) => r.family === family && r.table === 'main');
}

/** ip.ValidateExpectedInterfaceIPs: each address present, and a route for its prefix. */
function checkAddresses(s: CheckState): void {
  const link = s.podLink;
  for (const ipc of s.prev.ips ?? []) {
    if (!link) throw new BridgeCheckError(`Cannot find container link ${s.ifname}`);
    const { ip, net } = IPNet.parseWithHost(ipc.address);
    const want = `${ip.toString()}/${net.prefix}`;
    const match = link.addrs.some((a) => {
      const have = IPAddr.tryParse(a.local);
      return have !== null && have.equals(ip) && a.prefixlen === net.prefix;
    });
    if (!match) throw new BridgeCheckError(`Failed to match addr ${want} on interface ${s.ifname}`);
    const hasPrefixRoute = mainRoutes(s, ip.family).some((r) => {
      const d = routeDst(r);
      return d !== null && d.equals(net);
    });
    if (!hasPrefixRoute) throw new BridgeCheckError(`Failed to find Gateway ${ipc.gateway ?? '<nil>'} for interface ${s.ifname}`);
  }
}

/** ip.ValidateExpectedRoute: a default route only needs to exist; others need dst (and gw when set). */
function checkRoutes(s: CheckState): void {
  for (const r of s.prev.routes ?? []) {
    const dst = IPNet.tryParse(r.dst);
    if (!dst) throw new BridgeCheckError(`Invalid static route found ${goRoute(r)}`);
    const isDefault = dst.prefix === 0;
    const gw = r.gw !== undefined ? IPAddr.tryParse(r.gw) : null;
    const ok = mainRoutes(s, dst.family).some((k) => {
      const kd = routeDst(k);
      if (kd === null || !kd.equals(dst)) return false;
      if (isDefault || gw === null) return true;
      const kgw = k.gateway !== null ? IPAddr.tryParse(k.gateway) : null;
      return kgw !== null && kgw.equals(gw);
    });
    if (!ok) throw new BridgeCheckError(`Expected Route ${goRoute(r)} not found in routing table`);
  }
}

export function checkAttachment(s: CheckState): void {
  const interfaces = s.prev.interfaces ?? [];
  let brMap: CniInterface = { name: '' };
  let contMap: CniInterface = { name: '' };
  for (const intf of interfaces) {
    if (intf.name === s.conf.bridge) brMap = intf;
    else if (intf.name === s.ifname && intf.sandbox === s.netns) contMap = intf;
  }
  const br = checkBridge(s, brMap);
  if (s.netns !== (contMap.sandbox ?? '')) {
    throw new BridgeCheckError(`Sandbox in prevResult ${contMap.sandbox ?? ''} doesn't match configured netns: ${s.netns}`);
  }
  const cont = checkContainer(s, contMap);
  let veth = none();
  for (const intf of interfaces) {
    if (intf.name === brMap.name || intf.name === contMap.name) continue;
    veth = checkHostVeth(s, intf, br, cont);
    if (veth.found) break;
  }
  if (!br.found) throw new BridgeCheckError(`CNI created bridge ${s.conf.bridge} in host namespace was not found`);
  if (!cont.found) throw new BridgeCheckError(`CNI created interface in container ${s.ifname} not found`);
  if (!veth.found) throw new BridgeCheckError(`CNI veth created for bridge ${s.conf.bridge} was not found`);
  checkAddresses(s);
  checkRoutes(s);
}
