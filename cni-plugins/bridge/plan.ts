// Pure planning for ADD: gateways and default routes from the IPAM result (the reference
// calcGateways), the bridge address changes (ensureAddr), the `ip` / `bridge` batch lines for
// the host and the pod's sysctls (the pod's address and route lines are lib/lines.ts's).
// Everything here is data in, lines out (made by src/render/ipbatch.ts), so it is unit-tested
// without root.
import { ipLine, named, type IpLine, type IpWord } from '../../src/render/ipbatch.js';
import { IPAddr, IPNet, type Family } from '../../src/util/ip.js';
import { errorMessage } from '../../src/util/errors.js';
import type { IpAddrInfo } from '../lib/ipjson.js';
import { addrShowLine, canonicalDst, linkShowLine, linkUpLine, type BatchLine } from '../lib/lines.js';
import { CniError, ErrorCode } from '../skel/types.js';
import type { CniIPConfig, CniResult, CniRoute } from '../skel/types.js';
import type { BridgeConf } from './config.js';

export const CONTAINER_IFACE_INDEX = 2;

/** A gateway address to put on the bridge (or the VLAN gateway port): gateway IP + the pod's prefix length. */
export interface GatewayAddr {
  readonly ip: IPAddr;
  readonly prefix: number;
}

export interface Gateways {
  readonly ips: CniIPConfig[];
  readonly routes: CniRoute[];
  readonly v4: GatewayAddr[];
  readonly v6: GatewayAddr[];
}

/** The bridge already has another address (the reference's plain error: 999). */
export class GatewayConflictError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'GatewayConflictError';
  }
}

/** A malformed IPAM result (the reference: "Unknown IP object", ParseCIDR errors). */
export class IpamResultError extends Error {
  constructor(msg: string) {
    super(msg);
    this.name = 'IpamResultError';
  }
}

function parseAddress(text: string): { ip: IPAddr; net: IPNet } {
  try {
    const { ip, net } = IPNet.parseWithHost(text);
    return { ip, net };
  } catch (e) {
    throw new IpamResultError(`IPAM returned an invalid address ${JSON.stringify(text)}: ${errorMessage(e)}`);
  }
}

function defaultDst(family: Family): string {
  return family === 4 ? '0.0.0.0/0' : '::/0';
}

/**
 * The reference calcGateways: every IP is the container interface's (index 2); a missing gateway
 * is network+1 when the bridge is a gateway; isDefaultGateway adds a default route per family
 * unless IPAM already returned one with a gateway; the gateway addresses for the bridge.
 */
export function calcGateways(ipam: CniResult, conf: Pick<BridgeConf, 'isGateway' | 'isDefaultGateway'>): Gateways {
  const ips: CniIPConfig[] = [];
  const routes: CniRoute[] = (ipam.routes ?? []).map((r) => ({ ...r }));
  const found: Record<Family, boolean> = { 4: false, 6: false };
  const gws: Record<Family, GatewayAddr[]> = { 4: [], 6: [] };
  for (const orig of ipam.ips ?? []) {
    const ipc: CniIPConfig = { ...orig, interface: CONTAINER_IFACE_INDEX };
    const { ip, net } = parseAddress(ipc.address);
    const family = ip.family;
    if (ipc.gateway === undefined && conf.isGateway) ipc.gateway = net.nth(1n).toString();
    if (conf.isDefaultGateway) {
      const dflt = defaultDst(family);
      if (routes.some((r) => r.gw !== undefined && canonicalDst(r.dst) === dflt)) found[family] = true;
      if (!found[family]) {
        const route: CniRoute = { dst: dflt };
        if (ipc.gateway !== undefined) route.gw = ipc.gateway;
        routes.push(route);
        found[family] = true;
      }
    }
    if (conf.isGateway && ipc.gateway !== undefined) {
      let gw: IPAddr;
      try {
        gw = IPAddr.parseFamily(ipc.gateway, family);
      } catch (e) {
        throw new IpamResultError(`IPAM returned an invalid gateway ${JSON.stringify(ipc.gateway)}: ${errorMessage(e)}`);
      }
      gws[family].push({ ip: gw, prefix: net.prefix });
    }
    ips.push(ipc);
  }
  return { ips, routes, v4: gws[4], v6: gws[6] };
}

export interface AddrPlan {
  /** `ip/prefix` strings to delete (forceAddress; all pre-existing), then to add. */
  readonly del: string[];
  readonly add: string[];
  /** The reference pins the device's MAC whenever it adds an address. */
  readonly pin: boolean;
}

function addrText(a: { ip: IPAddr; prefix: number }): string {
  return `${a.ip.toString()}/${a.prefix}`;
}

/**
 * The reference ensureAddr, applied to each gateway in turn against the device's addresses of
 * that family: an equal address is kept; for IPv4 any other address, for IPv6 an overlapping
 * one, is a conflict — removed with forceAddress, an error otherwise.
 */
export function planGatewayAddrs(
  device: string,
  existing: readonly IpAddrInfo[],
  gateways: readonly GatewayAddr[],
  forceAddress: boolean,
  errorPrefix: string,
): AddrPlan {
  const current = existing
    .map((a) => {
      const ip = IPAddr.tryParse(a.local);
      return ip ? { ip, prefix: a.prefixlen } : null;
    })
    .filter((a): a is { ip: IPAddr; prefix: number } => a !== null);
  const del: string[] = [];
  const add: string[] = [];
  let pin = false;
  for (const gw of gateways) {
    const want = addrText(gw);
    const wantNet = IPNet.of(gw.ip, gw.prefix);
    let present = false;
    for (const a of [...current]) {
      if (a.ip.family !== gw.ip.family) continue;
      if (addrText(a) === want) {
        present = true;
        break;
      }
      const aNet = IPNet.of(a.ip, a.prefix);
      if (gw.ip.family === 4 || aNet.contains(gw.ip) || wantNet.contains(a.ip)) {
        if (!forceAddress) {
          throw new GatewayConflictError(`${errorPrefix}: "${device}" already has an IP address different from ${want}`);
        }
        // Net effect only: deleting what this plan itself added just drops that add.
        const text = addrText(a);
        if (add.includes(text)) add.splice(add.indexOf(text), 1);
        else del.push(text);
        current.splice(current.indexOf(a), 1);
      }
    }
    if (present) continue;
    add.push(want);
    current.push({ ip: gw.ip, prefix: gw.prefix });
    pin = true;
  }
  return { del, add, pin };
}

/** Everything the host-side batch needs. */
export interface HostBatchSpec {
  readonly bridge: string;
  /** Bridge MTU when it has to be created (0: kernel default). */
  readonly mtu: number;
  readonly vlanFiltering: boolean;
  /** Also read this VLAN gateway port (it may not exist yet). */
  readonly vlanGw: string | null;
  readonly hostVeth: string;
  readonly ifname: string;
  readonly mac: string | null;
  readonly hairpin: boolean;
  readonly isolated: boolean;
  readonly promisc: boolean;
  /** Where the peer goes (the pod netns as seen by the `ip` child). */
  readonly peerNetns: string;
}

export interface HostBatch {
  readonly lines: BatchLine[];
  /** 1-based line numbers (as `ip -batch` reports them) of the steps the caller judges. */
  readonly bridgeAdd: number;
  readonly bridgeRead: number;
  readonly vlanGwRead: number | null;
  readonly vethAdd: number;
}

/**
 * The one host batch before IPAM (run with -force, judged line by line): create the bridge if
 * missing and read it as it was before our port joined (type, MAC, addresses), bring it up, create
 * the veth pair with its container end directly in the pod netns, put the host end on the bridge
 * with the port flags, up, and read back the host end and the bridge.
 * Veth ends get txqueuelen 0 as the reference's netlink library creates them.
 */
export function hostBatch(s: HostBatchSpec): HostBatch {
  const mtu: IpWord[] = s.mtu > 0 ? ['mtu', s.mtu] : [];
  const mac: IpWord[] = s.mac ? ['address', named('container MAC', s.mac)] : [];
  const br = named('bridge', s.bridge);
  const veth = named('host veth', s.hostVeth);
  const lines: BatchLine[] = [];
  const push = (line: IpLine, what: string): number => lines.push({ line, what });
  const bridgeAdd = push(ipLine('link', 'add', 'name', br, ...mtu, 'type', 'bridge', ...(s.vlanFiltering ? ['vlan_filtering', 1] : [])), `could not add "${s.bridge}"`);
  const bridgeRead = push(addrShowLine(s.bridge), `could not lookup "${s.bridge}"`);
  const vlanGwRead = s.vlanGw ? push(addrShowLine(s.vlanGw), `failed to find interface "${s.vlanGw}"`) : null;
  if (s.promisc) push(ipLine('link', 'set', 'dev', br, 'promisc', 'on'), `could not set promiscuous mode on "${s.bridge}"`);
  push(linkUpLine(s.bridge), `failed to set "${s.bridge}" up`);
  const vethAdd = push(
    ipLine('link', 'add', 'name', veth, ...mtu, 'txqueuelen', 0, 'type', 'veth', 'peer', 'name', named('CNI_IFNAME', s.ifname), ...mtu, 'txqueuelen', 0, ...mac, 'netns', named('peer netns', s.peerNetns)),
    'failed to make veth pair',
  );
  push(ipLine('link', 'set', 'dev', veth, 'master', br), `failed to connect "${s.hostVeth}" to bridge ${s.bridge}`);
  const port: string[] = [];
  if (s.hairpin) port.push('hairpin', 'on');
  if (s.isolated) port.push('isolated', 'on');
  if (port.length > 0) push(ipLine('link', 'set', 'dev', veth, 'type', 'bridge_slave', ...port), `failed to setup hairpin mode / isolation for ${s.hostVeth}`);
  push(linkUpLine(s.hostVeth), `failed to set "${s.hostVeth}" up`);
  push(linkShowLine(s.hostVeth), `failed to lookup "${s.hostVeth}"`);
  push(linkShowLine(s.bridge), `could not lookup "${s.bridge}"`);
  return { lines, bridgeAdd, bridgeRead, vlanGwRead, vethAdd };
}

/** The VLAN gateway port `<bridge>.<vlan>`: a veth in the host whose peer is an access port on the bridge. */
export function vlanGatewayLines(bridge: string, name: string, peer: string, mtu: number): BatchLine[] {
  const m: IpWord[] = mtu > 0 ? ['mtu', mtu] : [];
  const what = `failed to create vlan interface: faild to create vlan gateway "${name}"`;
  const gw = named('vlan gateway', name);
  const p = named('vlan gateway peer', peer);
  return [
    { line: ipLine('link', 'add', 'name', gw, ...m, 'txqueuelen', 0, 'type', 'veth', 'peer', 'name', p, ...m, 'txqueuelen', 0), what },
    { line: ipLine('link', 'set', 'dev', p, 'master', named('bridge', bridge)), what },
    { line: linkUpLine(peer), what },
    { line: linkUpLine(name), what },
  ];
}

/**
 * `bridge vlan` lines for a port: without preserveDefaultVlan the bridge's default PVID is removed;
 * `vlan` becomes the PVID (untagged); trunk VLANs are tagged. A trunk without `vlan` keeps VLAN 1
 * as its native VLAN, as upstream does.
 */
export function portVlanLines(port: string, vlan: number, trunk: readonly number[], preserveDefaultVlan: boolean, defaultPvid: number): IpLine[] {
  if (vlan === 0 && trunk.length === 0) return [];
  const dev = named('bridge port', port);
  const lines: IpLine[] = [];
  if (!preserveDefaultVlan && defaultPvid > 0) lines.push(ipLine('vlan', 'del', 'dev', dev, 'vid', defaultPvid, 'master'));
  const native = vlan !== 0 ? vlan : 1;
  lines.push(ipLine('vlan', 'add', 'dev', dev, 'vid', native, 'pvid', 'untagged', 'master'));
  for (const [lo, hi] of vlanRanges(trunk.filter((v) => v !== native))) {
    lines.push(ipLine('vlan', 'add', 'dev', dev, 'vid', lo === hi ? lo : `${lo}-${hi}`, 'master'));
  }
  return lines;
}

/** Sorted IDs folded into inclusive ranges (one `bridge vlan add` per range). */
export function vlanRanges(ids: readonly number[]): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const id of [...ids].sort((a, b) => a - b)) {
    const last = out[out.length - 1];
    if (last && id === last[1] + 1) last[1] = id;
    else if (!last || id > last[1]) out.push([id, id]);
  }
  return out;
}

/** The container-side sysctls the reference sets before configuring addresses (layer 3 only). */
export function podSysctlSettings(ifname: string, enabledad: boolean): Array<[string, string]> {
  const s: Array<[string, string]> = [];
  if (enabledad) {
    s.push([`net/ipv6/conf/${ifname}/enhanced_dad`, '1'], [`net/ipv6/conf/${ifname}/accept_dad`, '1']);
  } else {
    s.push([`net/ipv6/conf/${ifname}/accept_dad`, '0']);
  }
  s.push([`net/ipv4/conf/${ifname}/arp_notify`, '1']);
  return s;
}

/** A random host veth name as the reference makes it: "veth" + 4 random bytes in hex. */
export function randomVethName(bytes: Uint8Array): string {
  return `veth${Buffer.from(bytes.subarray(0, 4)).toString('hex')}`;
}
