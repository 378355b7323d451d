// The demo's machines, all network namespaces named `weftdemo-*`:
//
//   weftdemo-n1 ─┐                    ┌─ weftdemo-internet  203.0.113.1/24
//   weftdemo-n2 ─┼─ br0 ─ weftdemo-underlay (192.168.100.1/24, etcd; 203.0.113.254/24)
//   weftdemo-n3 ─┘        routes between the node LAN and the "internet", nothing else
//
// Node i has eth0 = 192.168.100.1i/24 with a default route via the underlay. The internet
// namespace knows a route back to the node LAN only, never to the pod network: a pod's packet
// gets an answer from there only once its node has masqueraded it.
import { join } from 'node:path';
import { addNetns, ipn, nsRun, STATE_DIR, NS_PREFIX } from './sys.js';

export const UNDERLAY_NS = `${NS_PREFIX}underlay`;
export const INTERNET_NS = `${NS_PREFIX}internet`;
export const UNDERLAY_GW = '192.168.100.1';
export const ETCD_ENDPOINT = `http://${UNDERLAY_GW}:2379`;
export const INTERNET_IP = '203.0.113.1';
const INTERNET_GW = '203.0.113.254';
export const NETWORK = '10.244.0.0/16';

export interface Node {
  readonly index: number;
  /** "n1" */
  readonly name: string;
  readonly ns: string;
  /** Address of eth0, the interface weftd uses (its public IP). */
  readonly ip: string;
  readonly dir: string;
  readonly subnetFile: string;
  readonly cniBinDir: string;
  readonly conflistFile: string;
  /**
   * The node's weftd serves CNI requests here (`--cni-socket`), and the runtime hands it to the
   * plugin clients as WEFT_CNI_SOCKET: without it, every node's client would talk to the machine's
   * /run/weft/cni.sock, i.e. to one weftd, in its namespace.
   */
  readonly cniSocket: string;
}

export function nodes(count: number): Node[] {
  return Array.from({ length: count }, (_v, k) => {
    const index = k + 1;
    const name = `n${index}`;
    const dir = join(STATE_DIR, name);
    return {
      index,
      name,
      ns: `${NS_PREFIX}${name}`,
      ip: `192.168.100.${10 + index}`,
      dir,
      subnetFile: join(dir, 'subnet.env'),
      cniBinDir: join(dir, 'cni', 'bin'),
      conflistFile: join(dir, 'cni', 'net.d', '10-weft.conflist'),
      cniSocket: join(dir, 'run', 'cni.sock'),
    };
  });
}

function sysctl(ns: string, setting: string): Promise<string> {
  return nsRun(ns, 'sysctl', ['-q', '-w', setting]);
}

/** The underlay (bridge + router) and internet namespaces. */
export async function buildUnderlay(): Promise<void> {
  await addNetns(UNDERLAY_NS);
  await addNetns(INTERNET_NS);
  await ipn(UNDERLAY_NS, 'link', 'add', 'br0', 'type', 'bridge');
  await ipn(UNDERLAY_NS, 'addr', 'add', `${UNDERLAY_GW}/24`, 'dev', 'br0');
  await ipn(UNDERLAY_NS, 'link', 'set', 'br0', 'up');
  await ipn(UNDERLAY_NS, 'link', 'add', 'inet', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', INTERNET_NS);
  await ipn(UNDERLAY_NS, 'addr', 'add', `${INTERNET_GW}/24`, 'dev', 'inet');
  await ipn(UNDERLAY_NS, 'link', 'set', 'inet', 'up');
  await sysctl(UNDERLAY_NS, 'net.ipv4.ip_forward=1');
  await ipn(INTERNET_NS, 'addr', 'add', `${INTERNET_IP}/24`, 'dev', 'eth0');
  await ipn(INTERNET_NS, 'link', 'set', 'eth0', 'up');
  // Back to the node LAN only: pod addresses stay unroutable from the "internet".
  await ipn(INTERNET_NS, 'route', 'add', '192.168.100.0/24', 'via', INTERNET_GW);
}

/** A node namespace on the underlay bridge, forwarding on (it routes for its pods). */
export async function buildNode(n: Node): Promise<void> {
  await addNetns(n.ns);
  await ipn(UNDERLAY_NS, 'link', 'add', n.name, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', n.ns);
  await ipn(UNDERLAY_NS, 'link', 'set', n.name, 'master', 'br0', 'up');
  await ipn(n.ns, 'addr', 'add', `${n.ip}/24`, 'dev', 'eth0');
  await ipn(n.ns, 'link', 'set', 'eth0', 'up');
  await ipn(n.ns, 'route', 'add', 'default', 'via', UNDERLAY_GW);
  await sysctl(n.ns, 'net.ipv4.ip_forward=1');
}
