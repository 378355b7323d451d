// Hosts of a test cluster (test/helpers/cluster.ts) turned into ovs-backend nodes: each gets its
// own Open vSwitch (userspace datapath, private dirs) and its underlay NIC on br-phy, which is
// where userspace VXLAN sends from; weftd then runs with `--iface br-phy` and OVS_RUNDIR.
import { join } from 'node:path';

import { IPNet } from '../../src/util/ip.js';
import { ETCD_IP, type Cluster, type Host } from './cluster.js';
import { nsExec } from './netns.js';
import { moveUnderlayToBrPhy, OvsInstance } from './ovs.js';
import type { OvsPod } from './ovs-pod.js';

export interface OvsHost {
  readonly host: Host;
  readonly ovs: OvsInstance;
  pod: OvsPod | null;
}

/** The host's lease subnet, from the subnet.env its weftd wrote. */
export function subnetOf(h: Host): IPNet {
  const text = h.subnetEnv().FLANNEL_SUBNET;
  if (!text) throw new Error(`${h.ns} has no FLANNEL_SUBNET`);
  return IPNet.parse(text);
}

/** Starts the host's Open vSwitch (in `<cluster dir>/ovs<i>`) and moves its eth0 onto br-phy. */
export async function startHostOvs(cluster: Cluster, host: Host): Promise<OvsInstance> {
  const ovs = await OvsInstance.start(host.ns, join(cluster.dir, `ovs${host.i}`));
  await moveUnderlayToBrPhy(ovs, 'eth0', `${host.underlayIP}/24`, ETCD_IP);
  // eth0 is now read by OVS through AF_PACKET, which hands on checksum-offloaded (partial)
  // packets unfixed: the underlay side must send complete checksums.
  await nsExec(cluster.underlay, 'ethtool', '-K', `h${host.i}`, 'tx', 'off');
  return ovs;
}

/** weftd on an ovs host: the node address is on br-phy, OVS is found through OVS_RUNDIR. */
export function startOvsWeftd(n: { readonly host: Host; readonly ovs: OvsInstance }, extra: readonly string[] = []): Promise<void> {
  return n.host.startWeftd(['--iface', 'br-phy', ...extra], { OVS_RUNDIR: n.ovs.runDir });
}
