// Gathers what `weft trace` needs from the node it runs on (its network namespace): subnet.env,
// the leases (etcd, else the daemon's /status), links, addresses, neighbours and FDB entries
// (netlink dumps), the kernel's route decisions (`ip -j route get`, plain and fibmatch), the live
// masquerade/forward rules (iptables-save, nft -j) and the forwarding sysctl; on an ovs node also
// the bridge's pod ports (OVSDB) and one `ovs-appctl ofproto/trace` of the packet.
import { readFile } from 'node:fs/promises';
import { GATEWAY_PORT_NAME, listPodInterfaces, TUNNEL_PORT_NAME } from '../../backend/ovs/bridge.js';
import { GATEWAY_OFPORT, gatewayOf, macFromIP, TUNNEL_OFPORT } from '../../backend/ovs/pipeline.js';
import type { RulesMode } from '../../ipmasq/keeper.js';
import { xtablesCommands } from '../../ipmasq/iptables.js';
import { nftTable } from '../../ipmasq/nftables.js';
import { Netlink, type LinkInfo } from '../../netlink/index.js';
import { parseSubnetEnv, previousSubnets } from '../../subnetenv/format.js';
import type { PeerStatus, StatusSnapshot } from '../../daemon/status.js';
import { EtcdSubnetManager } from '../../subnet/etcd/manager.js';
import type { EtcdConnectOptions } from '../../subnet/etcd/registry.js';
import type { NetworkConfig } from '../../subnet/config.js';
import { vtepMacOf, type Lease } from '../../subnet/lease.js';
import { DEFAULT_OVS_RUNDIR, OvsClient } from '../../ovs/cli.js';
import { errnoCode, errorMessage } from '../../util/errors.js';
import { CommandError, runCommand } from '../../util/exec.js';
import { IPAddr, IPNet, type Family } from '../../util/ip.js';
import { createLogger } from '../../util/log.js';
import { fetchStatus } from '../status.js';
import { fetchPolicy } from './policy-hops.js';
import { ovsEntry, planOvsTrace } from './ovs.js';
import type { ConfigFacts, LeaseSource, OvsFacts, OvsTraceFacts, Packet, RouteLookup, RuleFacts, SubnetEnvFacts, TraceFacts } from './types.js';

/** Runs a program with an argument array; resolves with stdout. Injected by tests. */
export type Runner = (command: string, args: readonly string[]) => Promise<string>;

export interface CollectOptions {
  readonly packet: Packet;
  readonly subnetFile: string;
  /** null: do not ask etcd. */
  readonly etcd: EtcdConnectOptions | null;
  readonly etcdTimeoutMs: number;
  /** The daemon's health endpoint; null: do not ask it. */
  readonly endpoint: string | null;
  readonly runner?: Runner;
}

/** Every backend type flannel or weft knows: trace only reads the config, it does not run the backend. */
const ANY_BACKEND = ['alloc', 'extension', 'gce', 'host-gw', 'ipip', 'ipsec', 'ovs', 'tencent-vpc', 'udp', 'vxlan', 'wireguard', 'ali-vpc', 'aws-vpc'];

const defaultRunner: Runner = (command, args) => runCommand(command, args, { timeoutMs: 10_000 });

class Timeout extends Error {
  constructor(what: string, ms: number) {
    super(`${what}: no answer within ${ms} ms`);
    this.name = 'Timeout';
  }
}

async function withTimeout<T>(what: string, ms: number, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Timeout(what, ms)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

export function parseSubnetEnvFacts(text: string): SubnetEnvFacts {
  const parsed = parseSubnetEnv(text);
  const nets = previousSubnets(parsed);
  return {
    network: nets.network,
    subnet: nets.subnet,
    ipv6Network: nets.ipv6Network,
    ipv6Subnet: nets.ipv6Subnet,
    mtu: parsed.mtu !== null && parsed.mtu > 0 ? parsed.mtu : null,
    ipMasq: parsed.ipMasq,
    ...parsed.weft,
  };
}

/** A lease as the daemon reports it (no expiry needed here). */
export function leaseFromPeer(p: PeerStatus): Lease | null {
  const publicIP = IPAddr.tryParse(p.publicIP);
  if (!publicIP) return null;
  const data = (mac: string | null) => (mac ? { VtepMAC: mac } : undefined);
  return {
    subnet: p.subnet ? IPNet.tryParse(p.subnet) : null,
    ipv6Subnet: p.ipv6Subnet ? IPNet.tryParse(p.ipv6Subnet) : null,
    attrs: {
      publicIP,
      publicIPv6: p.publicIPv6 ? IPAddr.tryParse(p.publicIPv6) : null,
      ...(p.backendType ? { backendType: p.backendType } : {}),
      ...(data(p.vtepMAC) ? { backendData: data(p.vtepMAC) } : {}),
      ...(data(p.vtepMACv6) ? { backendV6Data: data(p.vtepMACv6) } : {}),
    },
    reservation: false,
    expiration: null,
  };
}

interface IpRouteJson {
  type?: string;
  dst?: string;
  gateway?: string;
  via?: { family?: string; host?: string };
  dev?: string;
  protocol?: string;
  prefsrc?: string;
  nhid?: number;
  table?: string;
  flags?: string[];
}

function parseRouteJson(text: string): IpRouteJson | null {
  try {
    const doc = JSON.parse(text) as unknown;
    if (Array.isArray(doc) && doc.length > 0 && typeof doc[0] === 'object' && doc[0] !== null) return doc[0] as IpRouteJson;
  } catch {
    // fall through
  }
  return null;
}

function prefixOf(dst: string | undefined, family: Family): IPNet | null {
  if (dst === undefined || dst === 'default') return IPNet.parse(family === 4 ? '0.0.0.0/0' : '::/0');
  if (dst.includes('/')) return IPNet.tryParse(dst);
  const ip = IPAddr.tryParse(dst);
  return ip ? IPNet.of(ip, ip.bits) : null;
}

/** Merges `ip -j route get` (resolved route) and its fibmatch form (the matching table entry). */
export function mergeRouteLookup(getText: string, fibText: string, family: Family): RouteLookup {
  const get = parseRouteJson(getText);
  const fib = parseRouteJson(fibText);
  if (!get || !fib) return { ok: false, error: 'unreadable output of ip -j route get' };
  const prefix = prefixOf(fib.dst, family);
  if (!prefix) return { ok: false, error: `unreadable route prefix ${String(fib.dst)}` };
  const gw = get.gateway ?? get.via?.host ?? fib.gateway ?? fib.via?.host;
  const prefsrc = get.prefsrc ?? fib.prefsrc;
  return {
    ok: true,
    type: get.type ?? fib.type ?? 'unicast',
    prefix,
    gateway: gw ? IPAddr.tryParse(gw) : null,
    device: get.dev ?? fib.dev ?? null,
    protocol: fib.protocol ?? null,
    onlink: (fib.flags ?? []).includes('onlink'),
    nexthopId: typeof fib.nhid === 'number' ? fib.nhid : null,
    prefsrc: prefsrc ? IPAddr.tryParse(prefsrc) : null,
    table: fib.table && fib.table !== 'main' ? fib.table : null,
  };
}

function commandFailure(e: unknown): string {
  if (e instanceof CommandError) return e.stderr.trim().split('\n')[0] || e.message;
  return errorMessage(e);
}

async function routeLookup(run: Runner, family: Family, selector: readonly string[]): Promise<RouteLookup> {
  const base = ['-j', family === 4 ? '-4' : '-6', 'route', 'get'];
  try {
    const [get, fib] = await Promise.all([run('ip', [...base, ...selector]), run('ip', [...base, 'fibmatch', ...selector])]);
    return mergeRouteLookup(get, fib, family);
  } catch (e) {
    return { ok: false, error: commandFailure(e) };
  }
}

async function readEtcd(opts: EtcdConnectOptions, timeoutMs: number): Promise<{ leases: Lease[]; config: NetworkConfig | null; configError: string | null }> {
  const manager = EtcdSubnetManager.connect({ ...opts, knownBackends: ANY_BACKEND, logger: createLogger({ level: 'error' }) });
  try {
    const leases = await withTimeout(`etcd at ${opts.endpoints.join(',')}`, timeoutMs, manager.listLeases());
    let config: NetworkConfig | null = null;
    let configError: string | null = null;
    try {
      config = await withTimeout('etcd network config', timeoutMs, manager.getNetworkConfig());
    } catch (e) {
      configError = errorMessage(e);
    }
    return { leases, config, configError };
  } finally {
    // Closing can wait on gRPC; do not let it hold the trace.
    void manager.close().catch(() => undefined);
  }
}

async function readForwarding(family: Family): Promise<boolean | null> {
  const path = family === 4 ? '/proc/sys/net/ipv4/ip_forward' : '/proc/sys/net/ipv6/conf/all/forwarding';
  try {
    return (await readFile(path, 'utf8')).trim() === '1';
  } catch {
    return null;
  }
}

/** `known` is the mode the daemon or config says; without one, weft's nft table existing means nftables. */
async function readRules(run: Runner, family: Family, known: { mode: RulesMode; source: 'daemon' | 'config' } | null, forwardRules: boolean | null): Promise<RuleFacts> {
  const cmd = xtablesCommands(family);
  const errors: string[] = [];
  const save = async (table: string): Promise<string | null> => {
    try {
      return await run(cmd.save, ['-t', table]);
    } catch (e) {
      errors.push(`${cmd.save} -t ${table}: ${commandFailure(e)}`);
      return null;
    }
  };
  const t = nftTable(family);
  let nft: string | null = null;
  if (known?.mode !== 'iptables') {
    try {
      nft = await run('nft', ['-j', 'list', 'table', t.family, t.name]);
    } catch (e) {
      // No table is an answer (iptables mode, or the table deleted); anything else is not.
      if (!(e instanceof CommandError && /No such file or directory/.test(e.stderr))) errors.push(`nft -j list table ${t.family} ${t.name}: ${commandFailure(e)}`);
    }
  }
  const [iptablesNat, iptablesFilter] = await Promise.all([save('nat'), save('filter')]);
  const mode = known?.mode ?? (nft !== null ? 'nftables' : 'iptables');
  return { mode, modeSource: known?.source ?? 'detected', iptablesNat, iptablesFilter, nft, forwardRules, errors };
}

function vniOf(l: Lease | null): number | null {
  const data = l?.attrs.backendData;
  if (!data || typeof data !== 'object' || Array.isArray(data)) return null;
  return typeof data.VNI === 'number' && Number.isInteger(data.VNI) ? data.VNI : null;
}

interface OvsInput {
  readonly packet: Packet;
  readonly env: SubnetEnvFacts | null;
  readonly subnet: IPNet | null;
  readonly ownLease: Lease | null;
  readonly leases: readonly Lease[];
  readonly srcIsNode: boolean;
  readonly route: RouteLookup;
  readonly neighbours: TraceFacts['neighbours'];
  readonly links: readonly LinkInfo[];
}

/**
 * The bridge's pod ports and actual tunnel/gateway ofports from OVSDB, and one
 * `ovs-appctl ofproto/trace` of the packet where it meets the bridge (OVS_RUNDIR from subnet.env).
 * Nothing here throws: what cannot be read is said in `error`.
 */
async function collectOvs(i: OvsInput): Promise<OvsFacts> {
  const bridge = i.env?.ovsBridge ?? 'br-int';
  const runDir = i.env?.ovsRunDir ?? DEFAULT_OVS_RUNDIR;
  // Short timeouts: a node whose OVS hangs should still get its trace.
  const client = new OvsClient({ runDir, timeoutSeconds: 5 });
  const gwLink = i.links.find((l) => l.name === GATEWAY_PORT_NAME) ?? null;
  const gatewayMac = gwLink?.mac ?? (i.subnet ? macFromIP(gatewayOf(i.subnet)) : null);
  const srcLease = i.leases.find((l) => l !== i.ownLease && l.subnet?.contains(i.packet.src)) ?? null;
  const vni = vniOf(i.ownLease);
  const base = { bridge, runDir, datapath: i.env?.ovsDatapath ?? null, gatewayMac, vni };
  let pods: OvsFacts['pods'] = null;
  let tunnelPort = TUNNEL_OFPORT;
  let gatewayPort = GATEWAY_OFPORT;
  let error: string | null = null;
  try {
    const ofport = async (iface: string, fallback: number): Promise<number> => {
      const n = Number((await client.vsctl(['--if-exists', 'get', 'interface', iface, 'ofport'])).trim());
      return Number.isInteger(n) && n > 0 ? n : fallback;
    };
    const [p, t, g] = await Promise.all([listPodInterfaces(client, bridge), ofport(TUNNEL_PORT_NAME, TUNNEL_OFPORT), ofport(GATEWAY_PORT_NAME, GATEWAY_OFPORT)]);
    pods = p.map((x) => ({ name: x.name, ofport: x.ofport, ip: x.ip, mac: x.mac, containerId: x.containerId }));
    [tunnelPort, gatewayPort] = [t, g];
  } catch (e) {
    error = errorMessage(e);
  }
  const entryInput = { packet: i.packet, srcIsNode: i.srcIsNode, subnet: i.subnet, srcLease, route: i.route, gatewayDevice: GATEWAY_PORT_NAME };
  const entry = ovsEntry(entryInput);
  let trace: OvsTraceFacts | null = null;
  if (entry && pods && !gatewayMac) {
    trace = { entry, inPort: null, inPortName: null, flow: null, note: null, output: null, error: `no ${GATEWAY_PORT_NAME} device and no subnet: the gateway's MAC is unknown` };
  } else if (entry && pods && gatewayMac) {
    const plan = planOvsTrace({
      ...entryInput,
      entry,
      publicIP: i.ownLease?.attrs.publicIP ?? null,
      pods,
      gatewayMac,
      tunnelPort,
      gatewayPort,
      // A peer's VNI is as good as ours (weft skips peers whose VNI differs); 1 is the backend's default.
      vni: vni ?? vniOf(srcLease) ?? 1,
      neighbours: i.neighbours,
    });
    let output: string | null = null;
    let traceError = plan.error;
    if (plan.flow) {
      try {
        output = await client.appctl(['ofproto/trace', bridge, plan.flow]);
      } catch (e) {
        traceError = errorMessage(e);
      }
    }
    trace = { entry, inPort: plan.inPort, inPortName: plan.inPortName, flow: plan.flow, note: plan.note, output, error: traceError };
  } else if (entry) {
    trace = { entry, inPort: null, inPortName: null, flow: null, note: null, output: null, error };
  }
  return { ...base, tunnelPort, gatewayPort, pods, trace, error };
}

export async function collectFacts(opts: CollectOptions): Promise<TraceFacts> {
  const run = opts.runner ?? defaultRunner;
  const { packet } = opts;
  const family = packet.dst.family;
  const notes: string[] = [];

  let env: SubnetEnvFacts | null = null;
  try {
    env = parseSubnetEnvFacts(await readFile(opts.subnetFile, 'utf8'));
  } catch (e) {
    notes.push(`cannot read ${opts.subnetFile}: ${errnoCode(e) ?? errorMessage(e)}`);
  }

  const [status, etcd, policy] = await Promise.all([
    opts.endpoint
      ? fetchStatus(opts.endpoint, { peers: true, timeoutMs: 2000 }).catch((e: unknown) => {
          notes.push(`daemon status: ${errorMessage(e)}`);
          return null;
        })
      : Promise.resolve(null as StatusSnapshot | null),
    opts.etcd
      ? readEtcd(opts.etcd, opts.etcdTimeoutMs).catch((e: unknown) => {
          notes.push(`etcd: ${errorMessage(e)}`);
          return null;
        })
      : Promise.resolve(null),
    opts.endpoint ? fetchPolicy(opts.endpoint, packet, notes) : Promise.resolve(null),
  ]);

  let leases: Lease[] = [];
  let leaseSource: LeaseSource = 'none';
  if (etcd) {
    leases = etcd.leases;
    leaseSource = 'etcd';
    if (etcd.configError) notes.push(`etcd network config: ${etcd.configError}`);
  } else if (status) {
    const fromDaemon = [...(status.lease ? [status.lease] : []), ...(status.peers ?? [])].map(leaseFromPeer);
    leases = fromDaemon.filter((l): l is Lease => l !== null);
    leaseSource = 'daemon';
    notes.push('leases as the daemon knows them (etcd not reachable)');
  } else {
    notes.push('no leases: neither etcd nor the daemon answered; lease ownership is not checked');
  }

  let config: ConfigFacts | null = null;
  if (etcd?.config) {
    const c = etcd.config;
    config = { network: c.network, ipv6Network: c.ipv6Network, backendType: c.backend.type, enableNFTables: c.enableNFTables };
  } else if (status?.network) {
    const n = status.network;
    config = {
      network: n.network ? IPNet.tryParse(n.network) : null,
      ipv6Network: n.ipv6Network ? IPNet.tryParse(n.ipv6Network) : null,
      backendType: n.backendType,
      enableNFTables: n.enableNFTables,
    };
  }

  const nl = Netlink.open();
  let links: LinkInfo[];
  let addresses: Array<{ ifindex: number; ip: IPAddr }>;
  try {
    const [l, a] = await Promise.all([nl.links(), nl.addresses()]);
    links = l;
    addresses = a.map((x) => ({ ifindex: x.index, ip: x.ip }));
    const isLocal = (ip: IPAddr) => addresses.some((x) => x.ip.equals(ip));
    const proto = ['ipproto', packet.proto, ...(packet.dport !== null ? ['dport', String(packet.dport)] : [])];

    // Packets of a non-local source come in where the route back to it points.
    let ingress: string | null = null;
    if (!isLocal(packet.src)) {
      const back = await routeLookup(run, family, [packet.src.toString()]);
      if (back.ok && back.type !== 'local') ingress = back.device;
      else if (!back.ok) notes.push(`no route back to the source ${packet.src.toString()}: ${back.error}`);
    }
    const selector = [packet.dst.toString(), 'from', packet.src.toString(), ...(ingress ? ['iif', ingress] : []), ...proto];
    const route = await routeLookup(run, family, selector);

    const egress = route.ok ? (links.find((x) => x.name === route.device) ?? null) : null;
    const neighbours = egress ? await nl.neighbours(egress.index, family) : [];
    const fdb = egress?.kind === 'vxlan' ? await nl.fdb(egress.index) : [];

    // The remote VTEPs worth a route lookup: those of the gateway's MAC and of the destination's lease.
    const underlay = new Map<string, RouteLookup>();
    if (route.ok && egress?.kind === 'vxlan') {
      const macs = new Set<string>();
      const gw = route.gateway;
      const n = gw ? neighbours.find((x) => x.ip.equals(gw)) : undefined;
      if (n?.mac) macs.add(n.mac);
      for (const l of leases) {
        const sub = family === 4 ? l.subnet : l.ipv6Subnet;
        const mac = sub?.contains(packet.dst) ? vtepMacOf(l, family) : null;
        if (mac) macs.add(mac);
      }
      const remotes = new Set(fdb.filter((e) => macs.has(e.mac) && e.dst).map((e) => e.dst!.toString()));
      for (const remote of remotes) underlay.set(remote, await routeLookup(run, IPAddr.parse(remote).family, [remote]));
    }

    const ownSubnet = (family === 4 ? env?.subnet : env?.ipv6Subnet) ?? null;
    const gwAddr = ownSubnet ? ownSubnet.nth(1n) : null;
    const bridgeIndex = gwAddr ? addresses.find((x) => x.ip.equals(gwAddr))?.ifindex : undefined;
    const bridge = links.find((x) => x.index === bridgeIndex) ?? links.find((x) => x.name === 'cni0') ?? null;

    const known = status?.ipmasq.mode
      ? { mode: status.ipmasq.mode, source: 'daemon' as const }
      : typeof config?.enableNFTables === 'boolean'
        ? { mode: config.enableNFTables ? ('nftables' as const) : ('iptables' as const), source: 'config' as const }
        : null;
    const rules = await readRules(run, family, known, status ? status.ipmasq.forwardRules : null);
    notes.push(...rules.errors);

    const ownLease =
      (ownSubnet ? leases.find((l) => (family === 4 ? l.subnet : l.ipv6Subnet)?.equals(ownSubnet)) : undefined) ??
      leases.find((l) => isLocal(l.attrs.publicIP)) ??
      null;
    const backend = ownLease?.attrs.backendType ?? env?.backend ?? status?.backend?.type ?? config?.backendType ?? null;
    const ovs =
      backend === 'ovs' && family === 4
        ? await collectOvs({
            packet,
            env,
            subnet: ownSubnet,
            ownLease,
            leases,
            srcIsNode: isLocal(packet.src),
            route,
            neighbours,
            links,
          })
        : null;

    return {
      packet,
      subnetFile: opts.subnetFile,
      env,
      config,
      daemonBackend: status?.backend?.type ?? null,
      leases,
      leaseSource,
      addresses,
      links,
      ingress,
      route,
      neighbours,
      fdb,
      underlay,
      bridge,
      rules,
      ipForward: await readForwarding(family),
      ovs,
      policy,
      notes,
    };
  } finally {
    nl.close();
  }
}
