// A pod on an ovs-backend host, attached the way a runtime attaches one: the flannel CNI bundle
// reads the subnet.env weftd wrote (WEFT_BACKEND=ovs) and delegates to weft-ovs, which puts a veth
// into the pod and its host end onto br-int with the pod's flows.
import { join } from 'node:path';

import { listPodInterfaces } from '../../src/backend/ovs/bridge.js';
import { OvsClient } from '../../src/ovs/cli.js';
import type { Host } from './cluster.js';
import { cniBinDir, runCni } from './cni.js';
import type { OvsInstance } from './ovs.js';

export interface OvsPod {
  readonly ns: string;
  readonly ip: string;
  readonly mac: string;
  readonly ofport: number;
}

export class OvsPodError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OvsPodError';
  }
}

/** ADD through the flannel bundle into the host's pod namespace; returns the pod as OVS sees it. */
export async function attachOvsPod(host: Host, ovs: OvsInstance, name: string): Promise<OvsPod> {
  const bin = await cniBinDir();
  const containerId = `ctr-${name}`;
  const conf = {
    cniVersion: '1.0.0',
    name: 'weft-ovs-test',
    type: 'flannel',
    subnetFile: host.subnetFile,
    dataDir: join(host.cluster.dir, `h${host.i}`, 'flannel'),
    delegate: { isDefaultGateway: true },
    ipam: { dataDir: join(host.cluster.dir, `h${host.i}`, 'ipam') },
  };
  const r = await runCni(
    {
      bin: join(bin, 'flannel'),
      command: 'ADD',
      containerId,
      netns: `/run/netns/${host.podNs}`,
      args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name}`,
      hostNs: host.ns,
    },
    JSON.stringify(conf),
  );
  if (r.exitCode !== 0) throw new OvsPodError(`CNI ADD of ${name} on ${host.ns} failed: ${r.stdout}${r.stderr}`);
  const ports = await listPodInterfaces(new OvsClient({ runDir: ovs.runDir }), 'br-int');
  const port = ports.find((p) => p.containerId === containerId);
  if (!port) throw new OvsPodError(`no OVS port for ${containerId} after ADD`);
  host.podIP = port.ip.toString();
  return { ns: host.podNs, ip: port.ip.toString(), mac: port.mac, ofport: port.ofport };
}
