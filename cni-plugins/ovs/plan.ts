// Pure planning for the weft-ovs plugin: the host veth's name, the pod's addressing from the IPAM
// result (one IPv4 address, its gateway = the node's weft-gw0 address, routes), the `ip` batch
// lines for the host and the pod, the ADD result, and CHECK's judgement over what was read back.
// Data in, lines out (made by src/render/ipbatch.ts): unit-tested without root.
import { ipLine, named, type IpWord } from '../../src/render/ipbatch.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { gatewayOf, macFromIP } from '../../src/backend/ovs/pipeline.js';
import type { PodInterface } from '../../src/backend/ovs/bridge.js';
import type { IpLink } from '../lib/ipjson.js';
import { addrAddLine, linkShowLine, linkUpLine, podRouteLines, type BatchLine } from '../lib/lines.js';
import { sha512Hex } from '../skel/sha512.js';
import { CniError, ErrorCode, type CniDNS, type CniIPConfig, type CniResult, type CniRoute } from '../skel/types.js';
import { OVS_PLUGIN_TYPE, type OvsConf } from './config.js';

/** interfaces[] of the result: 0 = host veth, 1 = pod interface (what ips[].interface points at). */
export const HOST_IFACE_INDEX = 0;
export const POD_IFACE_INDEX = 1;
const HOST_VETH_PREFIX = 'weft';
const HOST_VETH_HASH_CHARS = 11;

/**
 * The host end's name: `weft` + 11 hex characters of sha512(containerID ":" ifname), 15 in all
 * (IFNAMSIZ - 1). Deterministic, so DEL finds it without any state; ':' is in neither a container
 * ID nor an interface name, so the pair is unambiguous.
 */
export function hostVethName(containerId: string, ifname: string): string {
  return HOST_VETH_PREFIX + sha512Hex(`${containerId}:${ifname}`).slice(0, HOST_VETH_HASH_CHARS);
}

/** An IPAM result weft-ovs cannot use: no IPv4 address, IPv6, or more than one address. */
export class OvsAddressingError extends CniError {
  constructor(code: number, msg: string) {
    super(code, msg);
    this.name = 'OvsAddressingError';
  }
}

/** What the pod gets, from the IPAM result. */
export interface PodAddressing {
  readonly ip: IPAddr;
  readonly net: IPNet;
  /** The IPAM gateway (weft-gw0's address), or the subnet's first address when IPAM gave none. */
  readonly gateway: IPAddr;
  /** macFromIP(ip): the pod flows match it, and the daemon derives the same from the IP. */
  readonly mac: string;
  /** The result's ips (interface index 1, gateway filled in). */
  readonly ips: CniIPConfig[];
  readonly routes: CniRoute[];
}

function parseWithHost(text: string): { ip: IPAddr; net: IPNet } | null {
  try {
    return IPNet.parseWithHost(text);
  } catch {
    return null;
  }
}

function familyOf(text: string): 4 | 6 | null {
  return IPAddr.tryParse(text)?.family ?? IPNet.tryParse(text)?.family ?? null;
}

/**
 * One IPv4 address (the ovs backend is IPv4-only: its flows, spoof guard and tunnel carry IPv4),
 * its gateway, IPAM's routes plus a default route via the gateway when isDefaultGateway and IPAM
 * returned none with a gateway (the bridge plugin's rule).
 */
export function planAddressing(ipam: CniResult, conf: Pick<OvsConf, 'isDefaultGateway'>): PodAddressing {
  const all = ipam.ips ?? [];
  if (all.length === 0) throw new OvsAddressingError(ErrorCode.Internal, 'IPAM plugin returned missing IP config');
  const v6 = all.filter((i) => familyOf(i.address) === 6);
  if (v6.length > 0) {
    throw new OvsAddressingError(
      ErrorCode.InvalidNetworkConfig,
      `${OVS_PLUGIN_TYPE} supports IPv4 only (the ovs backend is IPv4-only), but IPAM returned ${v6.map((i) => i.address).join(', ')}; configure only IPv4 ranges`,
    );
  }
  if (all.length > 1) {
    throw new OvsAddressingError(
      ErrorCode.InvalidNetworkConfig,
      `${OVS_PLUGIN_TYPE} attaches one IPv4 address per interface, but IPAM returned ${all.map((i) => i.address).join(', ')}`,
    );
  }
  const orig = all[0]!;
  const parsed = parseWithHost(orig.address);
  if (parsed === null) throw new OvsAddressingError(ErrorCode.Internal, `IPAM returned an invalid address ${JSON.stringify(orig.address)}`);
  const { ip, net } = parsed;
  let gateway = gatewayOf(net);
  if (orig.gateway !== undefined) {
    const gw = IPAddr.tryParse(orig.gateway);
    if (gw === null || gw.family !== 4) throw new OvsAddressingError(ErrorCode.Internal, `IPAM returned an invalid IPv4 gateway ${JSON.stringify(orig.gateway)}`);
    gateway = gw;
  }
  const routes: CniRoute[] = (ipam.routes ?? []).map((r) => ({ ...r }));
  const v6Routes = routes.filter((r) => familyOf(r.dst) === 6);
  if (v6Routes.length > 0) {
    throw new OvsAddressingError(
      ErrorCode.InvalidNetworkConfig,
      `${OVS_PLUGIN_TYPE} supports IPv4 only, but IPAM returned the route(s) ${v6Routes.map((r) => r.dst).join(', ')}`,
    );
  }
  if (conf.isDefaultGateway) {
    const hasDefault = routes.some((r) => r.gw !== undefined && IPNet.tryParse(r.dst)?.toString() === '0.0.0.0/0');
    if (!hasDefault) routes.push({ dst: '0.0.0.0/0', gw: gateway.toString() });
  }
  const ipc: CniIPConfig = { ...orig, interface: POD_IFACE_INDEX, gateway: gateway.toString() };
  return { ip, net, gateway, mac: macFromIP(ip), ips: [ipc], routes };
}

export interface HostBatchSpec {
  readonly hostVeth: string;
  readonly ifname: string;
  /** 0: kernel default. */
  readonly mtu: number;
  /** netdev datapath: the node kernel must not answer ARP on the veth (OVS answers it). */
  readonly arpOff: boolean;
  /** Where the peer goes (the pod netns as the `ip` child sees it, e.g. /proc/self/fd/3). */
  readonly peerNetns: string;
}

export interface HostBatch {
  readonly lines: BatchLine[];
  /** 1-based line of the veth creation (a failure there means nothing was made). */
  readonly vethAdd: number;
}

/**
 * One `ip -batch` in the node netns: the veth pair with the pod end created directly in the pod
 * netns, `arp off` (netdev), up, and the host end read back (its MAC goes in the result).
 * txqueuelen 0 as the reference's netlink library creates veths.
 */
export function hostBatch(s: HostBatchSpec): HostBatch {
  const mtu: IpWord[] = s.mtu > 0 ? ['mtu', s.mtu] : [];
  const veth = named('host veth', s.hostVeth);
  const lines: BatchLine[] = [
    {
      line: ipLine('link', 'add', 'name', veth, ...mtu, 'txqueuelen', 0, 'type', 'veth', 'peer', 'name', named('CNI_IFNAME', s.ifname), ...mtu, 'txqueuelen', 0, 'netns', named('peer netns', s.peerNetns)),
      what: 'failed to make veth pair',
    },
  ];
  if (s.arpOff) lines.push({ line: ipLine('link', 'set', 'dev', veth, 'arp', 'off'), what: `failed to turn ARP off on "${s.hostVeth}"` });
  lines.push({ line: linkUpLine(s.hostVeth), what: `failed to set "${s.hostVeth}" up` });
  lines.push({ line: linkShowLine(s.hostVeth), what: `failed to lookup "${s.hostVeth}"` });
  return { lines, vethAdd: 1 };
}

/** The pod side in one `nsenter … ip -batch`: MAC, address, up, routes, read back. */
export function podBatch(ifname: string, a: PodAddressing): BatchLine[] {
  const lines: BatchLine[] = [
    { line: ipLine('link', 'set', 'dev', named('device', ifname), 'address', named('MAC', a.mac)), what: `failed to set the MAC of "${ifname}" to ${a.mac}` },
  ];
  for (const ipc of a.ips) lines.push({ line: addrAddLine(ipc.address, ifname), what: `failed to add IP addr ${ipc.address} to "${ifname}"` });
  lines.push({ line: linkUpLine(ifname), what: `failed to set "${ifname}" UP` });
  lines.push(...podRouteLines(ifname, a.ips, a.routes));
  lines.push({ line: linkShowLine(ifname), what: 'failed to retrieve link' });
  return lines;
}

/** The ADD result: [host veth, pod interface], the address on interface 1, routes, DNS. */
export function buildResult(host: { name: string; mac: string }, pod: { name: string; mac: string; sandbox: string }, a: PodAddressing, dns: CniDNS | null | undefined): CniResult {
  const result: CniResult = {
    cniVersion: '1.1.0',
    interfaces: [
      { name: host.name, mac: host.mac },
      { name: pod.name, mac: pod.mac, sandbox: pod.sandbox },
    ],
    ips: a.ips,
  };
  if (a.routes.length > 0) result.routes = a.routes;
  if (dns) result.dns = dns;
  return result;
}

/** CHECK found the attachment not as ADD left it (code 999, as the reference plugins' CHECK errors). */
export class OvsCheckError extends CniError {
  constructor(msg: string) {
    super(ErrorCode.Internal, msg);
    this.name = 'OvsCheckError';
  }
}

export interface OvsCheckState {
  readonly bridge: string;
  readonly containerId: string;
  readonly ifname: string;
  readonly netns: string;
  readonly prev: CniResult;
  /** The bridge's pod port for this attachment (listPodInterfaces), or null. */
  readonly port: PodInterface | null;
  /** The pod interface as read in the netns, or null when missing. */
  readonly podLink: IpLink | null;
}

/**
 * CHECK: the prevResult names the pod interface in this sandbox; the bridge has a port for the
 * attachment whose name, IP and MAC are the prevResult's; the pod interface has that MAC and
 * address.
 */
export function checkOvsAttachment(s: OvsCheckState): void {
  const ifaces = s.prev.interfaces ?? [];
  const podIdx = ifaces.findIndex((i) => i.name === s.ifname && i.sandbox === s.netns);
  if (podIdx < 0) throw new OvsCheckError(`prevResult has no interface ${s.ifname} in sandbox ${s.netns}`);
  const podIface = ifaces[podIdx]!;
  const hostIface = ifaces.find((i) => !i.sandbox && i.name);
  const addrs = (s.prev.ips ?? []).filter((i) => i.interface === undefined || i.interface === podIdx);
  const v4 = addrs.map((i) => parseWithHost(i.address)).filter((p): p is { ip: IPAddr; net: IPNet } => p !== null && p.ip.family === 4);
  const want = v4[0];
  if (!want) throw new OvsCheckError(`prevResult has no IPv4 address for ${s.ifname}`);

  const port = s.port;
  if (!port) throw new OvsCheckError(`no Open vSwitch port on bridge ${s.bridge} for container ${s.containerId} interface ${s.ifname}`);
  if (hostIface && port.name !== hostIface.name) {
    throw new OvsCheckError(`Open vSwitch port of ${s.ifname} is ${port.name}, but prevResult names ${hostIface.name}`);
  }
  if (!port.ip.equals(want.ip)) {
    throw new OvsCheckError(`Open vSwitch port ${port.name} carries IP ${port.ip.toString()}, but prevResult has ${want.ip.toString()}`);
  }
  if (podIface.mac !== undefined && port.mac !== podIface.mac.toLowerCase()) {
    throw new OvsCheckError(`Open vSwitch port ${port.name} carries MAC ${port.mac}, but prevResult has ${podIface.mac}`);
  }

  const link = s.podLink;
  if (!link) throw new OvsCheckError(`Interface name ${s.ifname} not found`);
  if (podIface.mac !== undefined && link.address !== podIface.mac.toLowerCase()) {
    throw new OvsCheckError(`Interface ${s.ifname} Mac ${podIface.mac} doesn't match container Mac: ${link.address}`);
  }
  for (const { ip, net } of v4) {
    const found = link.addrs.some((a) => a.prefixlen === net.prefix && IPAddr.tryParse(a.local)?.equals(ip) === true);
    if (!found) throw new OvsCheckError(`Failed to match addr ${ip.toString()}/${net.prefix} on interface ${s.ifname}`);
  }
}
