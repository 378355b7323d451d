// The OVSDB side of the ovs backend: the integration bridge with its tunnel and gateway ports,
// the pod ports the CNI plugin attached (found by their external_ids), the round number kept on
// the bridge, and flow-restore-wait.
import { join } from 'node:path';

import { wordProblem } from '../../render/word.js';
import { IPAddr } from '../../util/ip.js';
import type { Logger } from '../../util/log.js';
import { ifNameProblem } from '../../util/names.js';
import type { OvsClient } from '../../ovs/cli.js';
import { GATEWAY_OFPORT, TUNNEL_OFPORT, type PodPort } from './pipeline.js';

export const TUNNEL_PORT_NAME = 'weft-tun0';
export const GATEWAY_PORT_NAME = 'weft-gw0';

/** external_ids the CNI plugin puts on a pod's interface row; the daemon rebuilds pod flows from them. */
export const POD_IDS = {
  containerId: 'weft-container-id',
  ifName: 'weft-ifname',
  ip: 'weft-ip',
  mac: 'attached-mac',
  podName: 'weft-pod-name',
  podNamespace: 'weft-pod-namespace',
} as const;

export interface BridgeSpec {
  readonly bridge: string;
  readonly datapathType: string;
  readonly vni: number;
  readonly udpPort: number;
  readonly mtu: number;
}

/** A pod interface row with everything its flows need. */
export interface PodInterface extends PodPort {
  readonly name: string;
  readonly containerId: string;
  readonly ifName: string;
}

export class OvsConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OvsConfigError';
  }
}

/** The lock the daemon and the CNI plugin hold around "read pod ports, write the flow table". */
export function flowLockPath(runDir: string, bridge: string): string {
  return join(runDir, `weft-${bridge}.flows.lock`);
}

const quote = (s: string) => JSON.stringify(s);

/**
 * Creates what is missing and corrects what differs, in one ovs-vsctl transaction: the bridge
 * (secure fail mode, OpenFlow 1.0/1.3/1.5, datapath type), the VXLAN port with flow-based remote
 * and key, and the gateway internal port. Returns the ports' actual ofports.
 */
export async function ensureBridge(ovs: OvsClient, spec: BridgeSpec): Promise<{ tunnel: number; gateway: number }> {
  const { bridge } = spec;
  const out = await ovs.vsctl([
    '--may-exist', 'add-br', bridge,
    '--', 'set', 'bridge', bridge, `datapath_type=${spec.datapathType}`, 'fail-mode=secure', 'protocols=OpenFlow10,OpenFlow13,OpenFlow15',
    '--', '--may-exist', 'add-port', bridge, TUNNEL_PORT_NAME,
    '--', 'set', 'interface', TUNNEL_PORT_NAME, 'type=vxlan', `ofport_request=${TUNNEL_OFPORT}`,
    'options:remote_ip=flow', 'options:key=flow', `options:dst_port=${spec.udpPort}`,
    '--', '--may-exist', 'add-port', bridge, GATEWAY_PORT_NAME,
    '--', 'set', 'interface', GATEWAY_PORT_NAME, 'type=internal', `ofport_request=${GATEWAY_OFPORT}`, `mtu_request=${spec.mtu}`,
    // Read in the same transaction: right for ports that existed already (the usual pass). A port
    // created just now has no ofport in this view yet; it is read again after the commit.
    '--', 'get', 'interface', TUNNEL_PORT_NAME, 'ofport',
    '--', 'get', 'interface', GATEWAY_PORT_NAME, 'ofport',
  ]);
  const [tunnelNow, gatewayNow] = out.split('\n').map((l) => Number(l.trim()));
  const attached = (n: number | undefined): n is number => n !== undefined && Number.isInteger(n) && n > 0;
  const [tunnel, gateway] = await Promise.all([
    attached(tunnelNow) ? tunnelNow : ofportOf(ovs, TUNNEL_PORT_NAME),
    attached(gatewayNow) ? gatewayNow : ofportOf(ovs, GATEWAY_PORT_NAME),
  ]);
  return { tunnel, gateway };
}

/** Pins the gateway's MAC (internal ports otherwise get a new one when the datapath rebuilds them). */
export async function setGatewayMac(ovs: OvsClient, mac: string): Promise<void> {
  await ovs.vsctl(['set', 'interface', GATEWAY_PORT_NAME, `mac=${quote(mac)}`]);
}

async function ofportOf(ovs: OvsClient, iface: string): Promise<number> {
  const text = (await ovs.vsctl(['get', 'interface', iface, 'ofport'])).trim();
  const ofport = Number(text);
  if (!Number.isInteger(ofport) || ofport <= 0) {
    const error = (await ovs.vsctl(['get', 'interface', iface, 'error']).catch(() => '')).trim();
    throw new OvsConfigError(`Open vSwitch did not attach ${iface} (ofport ${text || 'unset'}${error && error !== '[]' ? `, error ${error}` : ''})`);
  }
  return ofport;
}

type OvsdbValue = string | number | boolean | ['map', [string, string][]] | ['set', unknown[]] | ['uuid', string];

function mapOf(v: OvsdbValue | undefined): Map<string, string> {
  return Array.isArray(v) && v[0] === 'map' ? new Map(v[1]) : new Map<string, string>();
}

/** A pod port weft does not program, and why. */
export interface SkippedPodPort {
  readonly name: string;
  readonly ofport: number;
  readonly reason: string;
}

/** The largest switch port number (OFPP_MAX - 1; 0xff00 and up are OpenFlow's reserved ports). */
export const MAX_OFPORT = 0xfeff;
/** A CNI container ID (the reference utils.ValidateContainerID). */
const CONTAINER_ID = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
/** Kubernetes names are at most 253 bytes (DNS subdomain). */
const MAX_POD_NAME_BYTES = 253;

/** Why `name` cannot be a port weft passes to ovs-vsctl, or null: an interface name, not an option. */
export function portNameProblem(name: string): string | null {
  const problem = ifNameProblem(name);
  if (problem !== null) return problem;
  return name.startsWith('-') ? 'starts with "-"' : null;
}

/** Why `text` is not a pod's IPv4 address (canonical dotted quad, unicast), or null. */
function podIPProblem(text: string): string | null {
  const ip = IPAddr.tryParse(text);
  if (!ip || ip.family !== 4 || ip.toString() !== text) return 'is not an IPv4 address in dotted-quad form';
  const first = Number(ip.value >> 24n);
  if (ip.isUnspecified() || first === 127 || first >= 224) return 'is not a unicast address';
  return null;
}

/** Why `mac` (lower case) is not a pod's MAC (six hex pairs, unicast, not zero), or null. */
export function podMACProblem(mac: string): string | null {
  if (!MAC.test(mac)) return 'is not a MAC address (six hex pairs separated by ":")';
  if (parseInt(mac.slice(0, 2), 16) & 1) return 'is a multicast MAC address';
  if (mac === '00:00:00:00:00:00') return 'is the zero MAC address';
  return null;
}

/** Why a pod or namespace name cannot be stored with the port (control or format characters, white space, length), or null. */
export function podNameProblem(name: string): string | null {
  if (Buffer.byteLength(name, 'utf8') > MAX_POD_NAME_BYTES) return `is longer than ${MAX_POD_NAME_BYTES} bytes`;
  if (/\p{Cf}/u.test(name)) return 'contains a format character (bidi control, zero-width, ...)';
  return wordProblem(name, '');
}

/** Why the values of a pod's external_ids cannot be used, or null. Checked when weft writes them and when it reads them back. */
export function podIdsProblem(ids: {
  readonly containerId: string | undefined;
  readonly ifName: string | undefined;
  readonly ip: string | undefined;
  readonly mac: string | undefined;
  readonly podName: string | undefined;
  readonly podNamespace: string | undefined;
}): string | null {
  const key = (k: keyof typeof POD_IDS, v: string, why: string) => `${POD_IDS[k]} ${JSON.stringify(v)} ${why}`;
  if (ids.containerId === undefined) return `no ${POD_IDS.containerId}`;
  if (!CONTAINER_ID.test(ids.containerId)) return key('containerId', ids.containerId, 'is not a container ID (letters, digits, "_", "." or "-")');
  if (ids.ifName !== undefined) {
    const p = ifNameProblem(ids.ifName);
    if (p !== null) return key('ifName', ids.ifName, `is not an interface name (${p})`);
  }
  if (ids.ip === undefined) return `no ${POD_IDS.ip}`;
  const ipProblem = podIPProblem(ids.ip);
  if (ipProblem !== null) return key('ip', ids.ip, ipProblem);
  if (ids.mac === undefined) return `no ${POD_IDS.mac}`;
  const macProblem = podMACProblem(ids.mac);
  if (macProblem !== null) return key('mac', ids.mac, macProblem);
  for (const k of ['podName', 'podNamespace'] as const) {
    const v = ids[k];
    const p = v === undefined ? null : podNameProblem(v);
    if (v !== undefined && p !== null) return key(k, v, p);
  }
  return null;
}

/** Whether a row carries any of weft's own pod keys (`attached-mac` alone is OVS's convention, used by others too). */
function isWeftPodRow(ext: ReadonlyMap<string, string>): boolean {
  return Object.entries(POD_IDS).some(([k, id]) => k !== 'mac' && ext.has(id));
}

/**
 * The bridge's pod ports: interfaces with weft's external_ids and an ofport, each value checked
 * (interface name, ofport, container ID, interface name in the pod, IPv4 address, MAC, pod
 * names). A row that fails is skipped and returned in `skipped` with the reason, as is a port
 * claiming the IP or MAC of a port with a lower ofport. Rows without weft's keys (the tunnel,
 * the gateway, ports of others) and ports not attached yet (no ofport) are neither.
 */
export async function scanPodInterfaces(ovs: OvsClient, bridge: string): Promise<{ pods: PodInterface[]; skipped: SkippedPodPort[] }> {
  const [portList, out] = await Promise.all([
    ovs.vsctl(['list-ports', bridge]),
    ovs.vsctl(['--format=json', '--columns=name,ofport,external_ids', 'list', 'interface']),
  ]);
  const ports = new Set(portList.split('\n').map((l) => l.trim()).filter(Boolean));
  const table = JSON.parse(out) as { data: OvsdbValue[][] };
  const candidates: PodInterface[] = [];
  const skipped: SkippedPodPort[] = [];
  for (const [name, ofport, ids] of table.data) {
    if (typeof name !== 'string' || !ports.has(name)) continue;
    const ext = mapOf(ids);
    if (!isWeftPodRow(ext) || typeof ofport !== 'number' || ofport <= 0) continue;
    const mac = ext.get(POD_IDS.mac)?.toLowerCase();
    const nameProblem = portNameProblem(name);
    const reason =
      nameProblem !== null
        ? `interface name ${nameProblem}`
        : !Number.isInteger(ofport) || ofport > MAX_OFPORT
          ? `ofport ${ofport} is not a switch port number (1..${MAX_OFPORT})`
          : podIdsProblem({
              containerId: ext.get(POD_IDS.containerId),
              ifName: ext.get(POD_IDS.ifName),
              ip: ext.get(POD_IDS.ip),
              mac,
              podName: ext.get(POD_IDS.podName),
              podNamespace: ext.get(POD_IDS.podNamespace),
            });
    if (reason !== null) {
      skipped.push({ name, ofport, reason });
      continue;
    }
    candidates.push({ name, ofport, ip: IPAddr.parse(ext.get(POD_IDS.ip)!), mac: mac!, containerId: ext.get(POD_IDS.containerId)!, ifName: ext.get(POD_IDS.ifName) ?? '' });
  }
  // Two ports with one address would get flows with the same matches: the lower ofport keeps it.
  const byIP = new Map<string, PodInterface>();
  const byMAC = new Map<string, PodInterface>();
  const pods: PodInterface[] = [];
  for (const p of candidates.sort((a, b) => a.ofport - b.ofport)) {
    const owner = byIP.get(p.ip.toString()) ?? byMAC.get(p.mac);
    if (owner) {
      const what = byIP.has(p.ip.toString()) ? `IP ${p.ip.toString()}` : `MAC ${p.mac}`;
      skipped.push({ name: p.name, ofport: p.ofport, reason: `claims the ${what} of port ${owner.name} (ofport ${owner.ofport})` });
      continue;
    }
    byIP.set(p.ip.toString(), p);
    byMAC.set(p.mac, p);
    pods.push(p);
  }
  return { pods, skipped: skipped.sort((a, b) => a.ofport - b.ofport) };
}

/** The pod ports weft programs (scanPodInterfaces); the skipped ones go to `filter`, which warns once each. */
export async function listPodInterfaces(ovs: OvsClient, bridge: string, filter?: PodPortFilter): Promise<PodInterface[]> {
  const { pods, skipped } = await scanPodInterfaces(ovs, bridge);
  filter?.report(skipped);
  return pods;
}

/** One warning per skipped pod port and reason; a port that is fixed or gone is forgotten. */
export class PodPortFilter {
  private readonly warned = new Map<string, string>();

  constructor(private readonly logger: Logger) {}

  report(skipped: readonly SkippedPodPort[]): void {
    const now = new Set(skipped.map((s) => s.name));
    for (const name of this.warned.keys()) if (!now.has(name)) this.warned.delete(name);
    for (const s of skipped) {
      if (this.warned.get(s.name) === s.reason) continue;
      this.warned.set(s.name, s.reason);
      this.logger.warn('skipping pod port: no flows for it', { port: s.name, ofport: s.ofport, reason: s.reason });
    }
  }
}

export const ROUND_KEY = 'roundNum';

/** A round as `ovs-vsctl get` prints it (quoted); null when unset or not a round. */
export function parseRound(printed: string): number | null {
  const text = printed.trim().replace(/^"|"$/g, '');
  const n = Number(text);
  return text !== '' && Number.isInteger(n) && n > 0 && n <= 0xffff ? n : null;
}

/** The round persisted on the bridge by the last run that converged (null when never). */
export async function readRound(ovs: OvsClient, bridge: string): Promise<number | null> {
  return parseRound(await ovs.vsctl(['--if-exists', 'get', 'bridge', bridge, `external_ids:${ROUND_KEY}`]));
}

export async function saveRound(ovs: OvsClient, bridge: string, round: number): Promise<void> {
  await ovs.vsctl(['set', 'bridge', bridge, `external_ids:${ROUND_KEY}=${round}`]);
}

/** The round after `previous`: 1..65535, never 0 (a cookie round of 0 means "not weft's"). */
export function nextRound(previous: number | null): number {
  return previous === null || previous >= 0xffff ? 1 : previous + 1;
}

/**
 * Clears `other_config:flow-restore-wait` once our flows are in: while it is set, ovs-vswitchd
 * forwards nothing (the start script sets it so no packet meets a half-built table).
 */
export async function clearFlowRestoreWait(ovs: OvsClient): Promise<boolean> {
  const v = (await ovs.vsctl(['--if-exists', 'get', 'open_vswitch', '.', 'other_config:flow-restore-wait'])).trim().replace(/^"|"$/g, '');
  if (v !== 'true') return false;
  await ovs.vsctl(['remove', 'open_vswitch', '.', 'other_config', 'flow-restore-wait']);
  return true;
}
