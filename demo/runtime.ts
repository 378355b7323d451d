// Just enough of a container runtime (libcni's AddNetworkList) to attach the demo's pods: read the
// conflist, and for each plugin in order exec `<CNI_PATH>/<type>` inside the node's namespace with
// the CNI environment and a config that is the plugin's entry plus the list's `name` and
// `cniVersion`, the previous plugin's result as `prevResult`, and `runtimeConfig` holding the
// capability arguments the plugin declares (here portMappings for portmap). Each plugin gets the
// node's CNI server socket as WEFT_CNI_SOCKET, so weft's client forwards the call to that node's
// weftd.
import { execFile } from 'node:child_process';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { JsonValue } from '../src/subnet/lease.js';
import { childPath } from './sys.js';
import type { Node } from './topology.js';

export type JsonObject = { [k: string]: JsonValue };

export interface PortMapping {
  readonly hostPort: number;
  readonly containerPort: number;
  readonly protocol: 'tcp' | 'udp';
}

export interface Pod {
  readonly node: Node;
  /** "n1-a" */
  readonly name: string;
  /** The pod's namespace, "weftdemo-n1-a". */
  readonly ns: string;
  readonly containerId: string;
  readonly portMappings: readonly PortMapping[];
}

export interface Attached {
  readonly pod: Pod;
  /** The pod's address without prefix length, from the result. */
  readonly ip: string;
  readonly result: JsonObject;
}

export const NETWORK_NAME = 'cbr0';
export const CNI_VERSION = '1.0.0';

/** A plugin that failed: which one, for which pod, and the CNI error it printed. */
export class CniPluginError extends Error {
  constructor(
    readonly pod: string,
    readonly plugin: string,
    readonly exitCode: number | string | null,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(`${plugin} ADD for pod ${pod} exited ${exitCode}: ${describeCniError(stdout, stderr)}`);
    this.name = 'CniPluginError';
  }
}

function describeCniError(stdout: string, stderr: string): string {
  try {
    const e = JSON.parse(stdout) as { code?: number; msg?: string; details?: string };
    if (typeof e.msg === 'string') return `code ${e.code ?? '?'}: ${e.msg}${e.details ? ` (${e.details})` : ''}`;
  } catch {
    // not a CNI error object: show what it printed
  }
  return (stdout.trim() || stderr.trim() || 'no output').split('\n').slice(-5).join(' | ');
}

/** The node's conflist: flannel (→ bridge + host-local in-process) chained with portmap. */
export function conflist(node: Node): JsonObject {
  return {
    cniVersion: CNI_VERSION,
    name: NETWORK_NAME,
    plugins: [
      {
        type: 'flannel',
        subnetFile: node.subnetFile,
        dataDir: join(node.dir, 'cni', 'flannel'),
        // flannel does not pass its dataDir on to host-local (plugins#619): without this, every
        // node's addresses would be recorded in the machine's /var/lib/cni/networks.
        ipam: { dataDir: join(node.dir, 'cni', 'ipam') },
        delegate: { hairpinMode: true, isDefaultGateway: true },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  };
}

export async function writeConflist(node: Node): Promise<string> {
  const text = `${JSON.stringify(conflist(node), null, 2)}\n`;
  await mkdir(dirname(node.conflistFile), { recursive: true });
  await writeFile(node.conflistFile, text);
  return text;
}

interface Exec {
  readonly code: number | string | null;
  readonly stdout: string;
  readonly stderr: string;
}

function execPlugin(node: Node, pod: Pod, type: string, stdin: string): Promise<Exec> {
  const env: NodeJS.ProcessEnv = {
    PATH: childPath(),
    CNI_COMMAND: 'ADD',
    CNI_CONTAINERID: pod.containerId,
    CNI_NETNS: `/run/netns/${pod.ns}`,
    CNI_IFNAME: 'eth0',
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=${pod.name};K8S_POD_INFRA_CONTAINER_ID=${pod.containerId}`,
    CNI_PATH: node.cniBinDir,
    // The plugin executables are weft's native client: it forwards the call to this node's weftd
    // (which runs the plugin in the node's namespace) and runs the Node.js bundle only when that
    // weftd does not answer.
    WEFT_CNI_SOCKET: node.cniSocket,
  };
  return new Promise((resolve) => {
    const child = execFile(
      'ip',
      ['netns', 'exec', node.ns, join(node.cniBinDir, type)],
      { env, timeout: 30_000, maxBuffer: 4 << 20 },
      (err, stdout, stderr) => {
        const e = err as (Error & { code?: number | string; killed?: boolean }) | null;
        resolve({ code: e ? (e.killed ? 'timeout' : (e.code ?? null)) : 0, stdout, stderr });
      },
    );
    child.stdin?.end(stdin);
  });
}

function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The first address of the result on the pod's interface (a `sandbox` one), without the prefix length. */
export function podAddress(result: JsonObject): string | null {
  const ifaces = Array.isArray(result.interfaces) ? result.interfaces : [];
  const ips = Array.isArray(result.ips) ? result.ips : [];
  for (const ip of ips) {
    if (!isObject(ip) || typeof ip.address !== 'string') continue;
    const iface = typeof ip.interface === 'number' ? ifaces[ip.interface] : undefined;
    if (iface !== undefined && !(isObject(iface) && typeof iface.sandbox === 'string' && iface.sandbox !== '')) continue;
    return ip.address.replace(/\/\d+$/, '');
  }
  return null;
}

/** ADD of the whole conflist for one pod, as a runtime does it. */
export async function addPod(pod: Pod): Promise<Attached> {
  const list = JSON.parse(await readFile(pod.node.conflistFile, 'utf8')) as JsonObject;
  const plugins = Array.isArray(list.plugins) ? list.plugins : [];
  const capabilityArgs: JsonObject = { portMappings: pod.portMappings.map((m) => ({ ...m })) };
  let prev: JsonObject | null = null;
  for (const entry of plugins) {
    if (!isObject(entry) || typeof entry.type !== 'string') throw new Error(`${pod.node.conflistFile}: a plugin without a type`);
    const conf: JsonObject = { ...entry, name: list.name ?? NETWORK_NAME, cniVersion: list.cniVersion ?? CNI_VERSION };
    const caps = isObject(entry.capabilities) ? entry.capabilities : {};
    const runtimeConfig: JsonObject = {};
    for (const [cap, on] of Object.entries(caps)) {
      const arg = capabilityArgs[cap];
      if (on === true && arg !== undefined) runtimeConfig[cap] = arg;
    }
    if (Object.keys(runtimeConfig).length > 0) conf.runtimeConfig = runtimeConfig;
    if (prev) conf.prevResult = prev;
    const r = await execPlugin(pod.node, pod, entry.type, JSON.stringify(conf));
    let parsed: unknown;
    try {
      parsed = JSON.parse(r.stdout);
    } catch {
      parsed = undefined;
    }
    if (r.code !== 0 || !isObject(parsed)) throw new CniPluginError(pod.name, entry.type, r.code, r.stdout, r.stderr);
    prev = parsed;
  }
  if (!prev) throw new Error(`${pod.node.conflistFile} lists no plugins`);
  const ip = podAddress(prev);
  if (!ip) throw new Error(`the result for pod ${pod.name} has no address on its interface: ${JSON.stringify(prev)}`);
  return { pod, ip, result: prev };
}
