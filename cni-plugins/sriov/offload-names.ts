// What the offload step derives before it changes anything: the `ovs` key with its defaults, the
// representor's name on the host (Antrea's rule), and the pod's IPv4 address and gateway.
import { gatewayOf } from '../../src/backend/ovs/pipeline.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { isValidIfName } from '../../src/util/names.js';
import type { CniIPConfig } from '../skel/types.js';
import { DEFAULT_OFFLOAD_BRIDGE, DEFAULT_OFFLOAD_OVS_RUNDIR, type OffloadDatapathType, type OvsOffloadConf } from './config.js';

/** Antrea's interfaceNamePrefixLength and interfaceKeyLength (8 + '-' + 6 = 15 = IFNAMSIZ - 1). */
const NAME_PREFIX_CHARS = 8;
const NAME_HASH_CHARS = 6;

export interface OvsOffloadSettings {
  readonly bridge: string;
  readonly ovsRunDir: string;
  readonly datapathType: OffloadDatapathType;
}

/** The `ovs` key with its defaults applied. */
export function offloadSettings(ovs: OvsOffloadConf): OvsOffloadSettings {
  return {
    bridge: ovs.bridge || DEFAULT_OFFLOAD_BRIDGE,
    ovsRunDir: ovs.ovsRunDir ?? DEFAULT_OFFLOAD_OVS_RUNDIR,
    datapathType: ovs.datapathType ?? 'system',
  };
}

function sha1Hex(text: string): string {
  // Loaded here only: node:crypto costs every plugin start a few ms, and only offload needs it.
  return process.getBuiltinModule('node:crypto').createHash('sha1').update(text).digest('hex');
}

/**
 * The representor's name on the host, Antrea's rule (GenerateContainerInterfaceName): the first
 * 8 characters of the pod name without leading '-', '-', then 6 hex characters of sha1 of the
 * container ID; 15 characters at most. An interface other than eth0 hashes container ID + ifname
 * (Antrea's secondary-interface key) so two attachments of one pod differ. Without a usable pod
 * name, the container ID stands in for it.
 */
export function hostIfaceName(podName: string | undefined, containerId: string, ifname: string): string {
  const hash = sha1Hex(ifname === 'eth0' ? containerId : containerId + ifname).slice(0, NAME_HASH_CHARS);
  const named = (name: string): string | null => {
    const prefix = name.slice(0, NAME_PREFIX_CHARS).replace(/^-+/, '');
    const out = `${prefix}-${hash}`;
    return prefix !== '' && isValidIfName(out) ? out : null;
  };
  return (podName ? named(podName) : null) ?? named(containerId) ?? `sriov-${hash}`;
}

export interface PodAddress {
  readonly ip: IPAddr;
  /** IPAM's gateway, or the subnet's first address (the node's weft-gw0) when it gave none. */
  readonly gateway: IPAddr;
}

/** The pod's IPv4 address and gateway from IPAM's result (the ovs backend's flows are IPv4-only). */
export function podAddress(ips: readonly CniIPConfig[]): PodAddress | null {
  for (const ipc of ips) {
    let parsed: { ip: IPAddr; net: IPNet };
    try {
      parsed = IPNet.parseWithHost(ipc.address);
    } catch {
      continue;
    }
    if (parsed.ip.family !== 4) continue;
    const gw = ipc.gateway !== undefined ? IPAddr.tryParse(ipc.gateway) : null;
    return { ip: parsed.ip, gateway: gw !== null && gw.family === 4 ? gw : gatewayOf(parsed.net) };
  }
  return null;
}
