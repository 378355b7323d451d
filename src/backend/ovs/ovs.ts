// The ovs backend: one Open vSwitch bridge per node with a flow-based VXLAN port and a gateway
// internal port, an OpenFlow pipeline computed from the lease set and the pod ports, and a host
// route per peer subnet through the gateway port.
//
// Flows are desired state. On start a new round number is taken and the node's and pods' flows
// are added under it (adding never removes, so the previous run's peer flows keep forwarding).
// The first full pass after the lease list makes the table exactly the desired set in one atomic
// `--bundle replace-flows` (which sweeps the previous round), clears flow-restore-wait, and only
// then persists the round. Afterwards every pass compares the table with `diff-flows` and rewrites
// it when anything drifted — a restarted ovs-vswitchd (empty table) is one such drift.
import { writeFile } from 'node:fs/promises';

import { IPAddr, type IPNet } from '../../util/ip.js';
import { VXLAN_OVERHEAD } from '../mtu.js';
import type { JsonValue, Lease, LeaseAttrs, LeaseEvent } from '../../subnet/lease.js';
import { PeerSet } from '../peer-set.js';
import type { PeerProblem } from '../../subnet/peer-gate.js';
import { vniProblem } from '../peer-data.js';
import { withFileLock } from '../../util/flock.js';
import { Netlink } from '../../netlink/index.js';
import { OvsClient } from '../../ovs/cli.js';
import { CLEAN_PASS, type Backend, type BackendContext, type BackendPass, type Prepared } from '../backend.js';
import type { Repairs, RouteSpec } from '../kernel/diff.js';
import { program, type ProgramResult } from '../kernel/programmer.js';
import { BackendOptions } from '../options.js';
import { SerialQueue } from '../serial.js';
import {
  clearFlowRestoreWait,
  ensureBridge,
  flowLockPath,
  GATEWAY_PORT_NAME,
  listPodInterfaces,
  PodPortFilter,
  nextRound,
  OvsConfigError,
  readRound,
  saveRound,
  setGatewayMac,
} from './bridge.js';
import { desiredFlows, gatewayOf, macFromIP, pipelineFlows, podFlows, renderFlows, ROUND_MASK, roundCookie, type NodePorts, type PeerNode } from './pipeline.js';

export const DEFAULT_OVS_UDP_PORT = 4789;
/** VXLAN over IPv4: outer Ethernet 14 + IP 20 + UDP 8 + VXLAN 8. */

export interface OvsOptions {
  readonly vni: number;
  readonly port: number;
  readonly bridge: string;
  readonly datapathType: 'system' | 'netdev';
  readonly mtu: number | null;
}

export function parseOvsOptions(options: Readonly<Record<string, JsonValue>>): OvsOptions {
  const o = new BackendOptions('ovs', options);
  const mtu = o.integer('MTU', 0, 0, 65535);
  return {
    vni: o.integer('VNI', 1, 0, 16_777_215),
    port: o.integer('Port', DEFAULT_OVS_UDP_PORT, 1, 65535),
    bridge: o.string('Bridge', 'br-int', { pattern: /^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,14}$/, rule: 'must be an interface name of at most 15 letters, digits, "_", "-" or "."' }),
    datapathType: o.string('DatapathType', 'system', { allowed: ['system', 'netdev'] }) as 'system' | 'netdev',
    mtu: mtu === 0 ? null : mtu,
  };
}

export class OvsBackend implements Backend {
  readonly type = 'ovs';
  private readonly nl: Netlink;
  private readonly ovs: OvsClient;
  private readonly serial = new SerialQueue();
  private lease: Lease | null = null;
  private ports: { tunnel: number; gateway: number } | null = null;
  private round = 0;
  private converged = false;
  private readonly peerSet = new PeerSet();
  /** Pod ports whose OVSDB values are unusable get no flows and one warning each. */
  private readonly podPorts: PodPortFilter;

  constructor(
    private readonly opts: OvsOptions,
    private readonly ctx: BackendContext,
    deps: { netlink?: Netlink; ovs?: OvsClient } = {},
  ) {
    const { config, extIface } = ctx;
    if (config.enableIPv6) throw new OvsConfigError('ovs backend: IPv6 is not supported yet (set EnableIPv6 false or use vxlan)');
    if (!config.enableIPv4 || !config.network) throw new OvsConfigError('ovs backend: needs an IPv4 Network');
    if (!extIface.extAddr) throw new OvsConfigError('ovs backend: no public IPv4 address for the tunnel');
    this.ovs = deps.ovs ?? new OvsClient();
    this.nl = deps.netlink ?? Netlink.open();
    this.podPorts = new PodPortFilter(ctx.logger);
  }

  private get mtu(): number {
    return (this.opts.mtu ?? this.ctx.extIface.mtu) - VXLAN_OVERHEAD[4];
  }

  async prepare(): Promise<Prepared> {
    this.ports = await ensureBridge(this.ovs, this.bridgeSpec());
    const attrs: LeaseAttrs = {
      publicIP: this.ctx.extIface.extAddr ?? IPAddr.parse('0.0.0.0'),
      publicIPv6: null,
      backendType: 'ovs',
      backendData: { VNI: this.opts.vni },
    };
    return {
      attrs,
      mtu: this.mtu,
      subnetEnv: { backend: 'ovs', ovsBridge: this.opts.bridge, ovsRunDir: this.ovs.runDir, ovsDatapath: this.opts.datapathType },
    };
  }

  start(lease: Lease): Promise<void> {
    this.lease = lease;
    return this.serial.run(async () => {
      await this.ensureGateway();
      if (this.round === 0) {
        const previous = await readRound(this.ovs, this.opts.bridge);
        this.round = nextRound(previous);
        // Leftovers of an earlier start that took this round and died before persisting it.
        await this.ovs.delFlowsByCookie(this.opts.bridge, roundCookie(this.round), ROUND_MASK);
        this.ctx.logger.info('ovs: starting a new flow round', { bridge: this.opts.bridge, round: this.round, previous });
      }
      // Node and pod flows now, under the new round; peers follow with the first full pass.
      await this.withFlowLock(async () => {
        const node = this.nodePorts();
        const pods = await listPodInterfaces(this.ovs, this.opts.bridge, this.podPorts);
        const flows = [...pipelineFlows(this.round, node), ...pods.flatMap((p) => podFlows(this.round, node, p))];
        await this.ovs.addFlows(this.opts.bridge, renderFlows(flows));
      });
    });
  }

  /** Lease events: the table changes because the peers did. */
  apply(batch: readonly LeaseEvent[]): Promise<BackendPass> {
    this.peerSet.apply(batch);
    return this.pass([...this.peerSet.values()], 'apply');
  }

  /** The timer: any difference now is drift. */
  reconcile(peers: readonly Lease[]): Promise<BackendPass> {
    return this.pass(peers, 'reconcile');
  }

  private pass(peers: readonly Lease[], why: 'apply' | 'reconcile'): Promise<BackendPass> {
    return this.serial.run(async () => {
      if (!this.lease) return CLEAN_PASS;
      let deviceRepairs = 0;
      // Lease events change flows and routes only; the bridge, its ports and the gateway are
      // checked by the timer (and by the first pass, which converges everything).
      if (why === 'reconcile' || !this.converged) {
        const ports = await ensureBridge(this.ovs, this.bridgeSpec());
        if (this.ports && (ports.tunnel !== this.ports.tunnel || ports.gateway !== this.ports.gateway)) deviceRepairs++;
        this.ports = ports;
        if (await this.ensureGateway()) deviceRepairs++;
      }
      const wanted = this.peerNodes(peers);
      const flowRepairs = await this.withFlowLock(() => this.programFlows(wanted, why));
      const routes = await this.programRoutes(wanted);
      const repairs: Repairs = {
        added: flowRepairs.added + routes.repairs.added,
        changed: flowRepairs.changed + routes.repairs.changed,
        removed: flowRepairs.removed + routes.repairs.removed,
      };
      this.ctx.metrics?.recordProgramming(wanted.length, repairs, deviceRepairs);
      return { failures: routes.failures };
    });
  }

  async close(): Promise<void> {
    await this.serial.idle();
    this.nl.close();
  }

  private bridgeSpec() {
    const { bridge, datapathType, vni, port } = this.opts;
    return { bridge, datapathType, vni, udpPort: port, mtu: this.mtu };
  }

  private nodePorts(): NodePorts {
    if (!this.lease?.subnet || !this.ports) throw new Error('ovs backend: no lease or ports yet');
    const gatewayIP = gatewayOf(this.lease.subnet);
    return { vni: this.opts.vni, tunnelPort: this.ports.tunnel, gatewayPort: this.ports.gateway, gatewayIP, gatewayMAC: macFromIP(gatewayIP) };
  }

  private withFlowLock<T>(fn: () => Promise<T>): Promise<T> {
    return withFileLock(flowLockPath(this.ovs.runDir, this.opts.bridge), fn, { timeoutSeconds: 30 });
  }

  /** Makes the flow table the desired set; returns what differed. */
  private async programFlows(peers: readonly PeerNode[], why: 'apply' | 'reconcile'): Promise<Repairs> {
    const { bridge } = this.opts;
    const pods = await listPodInterfaces(this.ovs, bridge, this.podPorts);
    const flows = desiredFlows(this.round, this.nodePorts(), pods, peers);
    const text = renderFlows(flows);
    if (why === 'apply' && this.converged) {
      // replace-flows sends only the difference itself; comparing first would double the work.
      await this.ovs.replaceFlows(bridge, text);
      return { added: 0, changed: 0, removed: 0 };
    }
    const diff = await this.ovs.diffFlows(bridge, text);
    const repairs = countDiff(diff);
    if (!this.converged) {
      // The first full pass: one atomic swap to this round's complete table, then persist.
      await this.ovs.replaceFlows(bridge, text);
      this.converged = true;
      if (await clearFlowRestoreWait(this.ovs)) this.ctx.logger.info('ovs: flows restored; cleared flow-restore-wait');
      await saveRound(this.ovs, bridge, this.round);
      this.ctx.logger.info('ovs: flow table converged', { round: this.round, flows: flows.length, pods: pods.length, peers: peers.length });
      return repairs;
    }
    if (diff.length === 0) return repairs;
    const empty = repairs.removed === 0 && repairs.changed === 0 && repairs.added === flows.length;
    if (empty) this.ctx.logger.warn('ovs: flow table is empty (ovs-vswitchd restarted?); replaying it', { bridge, flows: flows.length });
    else this.ctx.logger.warn('ovs: flow table drifted from the desired set; rewriting it', { bridge, ...repairs });
    await this.ovs.replaceFlows(bridge, text);
    if (await clearFlowRestoreWait(this.ovs)) this.ctx.logger.info('ovs: flows restored; cleared flow-restore-wait');
    return repairs;
  }

  /** `peer subnet via peer gateway dev weft-gw0 onlink`, so host traffic takes the tunnel too. */
  private async programRoutes(peers: readonly PeerNode[]): Promise<ProgramResult> {
    const gw = await this.nl.link(GATEWAY_PORT_NAME);
    if (!gw) throw new OvsConfigError(`ovs backend: the gateway device ${GATEWAY_PORT_NAME} is missing`);
    const routes: RouteSpec[] = peers.map((p) => ({ dst: p.subnet, gateway: gatewayOf(p.subnet), oif: gw.index, onlink: true }));
    const networks = [this.ctx.config.network].filter((n): n is IPNet => n !== null);
    return program(this.nl, { networks, l2Devices: [], useNexthops: false }, { routes, neighbours: [], fdb: [] }, this.ctx.logger);
  }

  private peerNodes(peers: readonly Lease[]): PeerNode[] {
    const out: PeerNode[] = [];
    for (const peer of peers) {
      if (this.peerProblem(peer) === null && peer.subnet) out.push({ subnet: peer.subnet, publicIP: peer.attrs.publicIP });
    }
    return out;
  }

  peerProblem(peer: Lease): PeerProblem | null {
    if (peer.attrs.backendType !== 'ovs') return { reason: 'backend-type', detail: `backend type "${peer.attrs.backendType ?? ''}" is not ovs` };
    if (!peer.subnet || peer.subnet.family !== 4) return { reason: 'backend-data', detail: 'no IPv4 subnet (the ovs backend is IPv4 only)' };
    return vniProblem(peer.attrs.backendData, this.opts.vni);
  }

  /** The gateway port: lease gateway address with the subnet's prefix, pinned MAC, MTU, up. */
  private async ensureGateway(): Promise<boolean> {
    const { gatewayIP, gatewayMAC } = this.nodePorts();
    const subnet = this.lease!.subnet!;
    const network = this.ctx.config.network!;
    let changed = false;
    const link = await this.nl.link(GATEWAY_PORT_NAME);
    if (!link) throw new OvsConfigError(`ovs backend: Open vSwitch did not create the gateway device ${GATEWAY_PORT_NAME}`);
    if (link.mac?.toString() !== gatewayMAC) {
      await setGatewayMac(this.ovs, gatewayMAC);
      changed = true;
    }
    for (const a of await this.nl.addresses(link.index)) {
      if (a.ip.family !== 4) continue;
      const wanted = a.ip.equals(gatewayIP) && a.prefix === subnet.prefix;
      if (!wanted && network.contains(a.ip)) {
        await this.nl.deleteAddress(link.index, a.ip, a.prefix);
        changed = true;
      }
    }
    if (!(await this.nl.addresses(link.index)).some((a) => a.ip.equals(gatewayIP) && a.prefix === subnet.prefix)) {
      await this.nl.addAddress(link.index, gatewayIP, subnet.prefix);
      changed = true;
    }
    if (!link.adminUp || link.mtu !== this.mtu) {
      await this.nl.setLink(link.index, { up: true, mtu: this.mtu });
      changed = true;
    }
    // Answer ARP on the gateway only with its own address (Antrea's setupGatewayInterface).
    await writeFile(`/proc/sys/net/ipv4/conf/${GATEWAY_PORT_NAME}/arp_announce`, '1').catch(() => undefined);
    return changed;
  }
}

/** Counts a diff-flows output: a match on both sides changed, on one side added or removed. */
export function countDiff(lines: readonly string[]): Repairs {
  const key = (l: string) => l.slice(1).replace(/ cookie=\S+ actions=.*$/, '');
  const removed = new Set(lines.filter((l) => l.startsWith('-')).map(key));
  const added = new Set(lines.filter((l) => l.startsWith('+')).map(key));
  let changed = 0;
  for (const k of added) if (removed.has(k)) changed++;
  return { added: added.size - changed, changed, removed: removed.size - changed };
}
