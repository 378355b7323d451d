// The OVSDB side of the ovs backend: the integration bridge with its tunnel and gateway ports,
// the pod ports the CNI plugin attached (found by their external_ids), the round number kept on
// the bridge, and flow-restore-wait.
import { join } from 'node:path';

import { IPAddr } from '../../util/ip.js';
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

/** The bridge's pod ports: interfaces with weft's external_ids and an ofport. Malformed rows are skipped. */
export async function listPodInterfaces(ovs: OvsClient, bridge: string): Promise<PodInterface[]> {
  const [portList, out] = await Promise.all([
    ovs.vsctl(['list-ports', bridge]),
    ovs.vsctl(['--format=json', '--columns=name,ofport,external_ids', 'list', 'interface']),
  ]);
  const ports = new Set(portList.split('\n').map((l) => l.trim()).filter(Boolean));
  const table = JSON.parse(out) as { data: OvsdbValue[][] };
  const pods: PodInterface[] = [];
  for (const [name, ofport, ids] of table.data) {
    if (typeof name !== 'string' || !ports.has(name) || typeof ofport !== 'number' || ofport <= 0) continue;
    const ext = mapOf(ids);
    const ip = IPAddr.tryParse(ext.get(POD_IDS.ip) ?? '');
    const mac = ext.get(POD_IDS.mac)?.toLowerCase();
    const containerId = ext.get(POD_IDS.containerId);
    if (!ip || ip.family !== 4 || !mac || !/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/.test(mac) || !containerId) continue;
    pods.push({ name, ofport, ip, mac, containerId, ifName: ext.get(POD_IDS.ifName) ?? '' });
  }
  return pods.sort((a, b) => a.ofport - b.ofport);
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
