// The ovs backend: one Open vSwitch bridge per node with a flow-based VXLAN port and a gateway
// internal port, an OpenFlow pipeline computed from the lease set and the pod ports, and a host
// route per peer subnet through the gateway port.
//
// Flows are desired state, applied three ways:
// - Start: a new round number is taken and the node's and pods' flows are added under it (adding
//   never removes, so the previous run's peer flows keep forwarding). The first full pass after
//   the lease list makes the table exactly the desired set in one atomic `--bundle replace-flows`
//   (which sweeps the previous round), clears flow-restore-wait, and only then persists the round.
// - Lease events (apply): a delta. The backend keeps the peers it has programmed (its model); a
//   batch deletes the changed peers' flows by cookie and adds their new ones in one atomic
//   `--bundle add-flows`, and replaces or deletes only their host routes in one netlink batch. No
//   pod port, flow table or route table is read. A refused operation leaves the model uncertain:
//   the pass reports failures (the daemon retries with a full reconcile) and every pass until a
//   full one succeeds is itself full, so no delta ever builds on a half-applied one.
// - The timer (reconcile), and any pass while the model is uncertain: the full comparison. The
//   pod ports are read back, the table is compared with `diff-flows` and rewritten atomically only
//   when something drifted (a restarted ovs-vswitchd, an empty table, is one such drift); the
//   host routes are dumped and diffed.
import { writeFile } from 'node:fs/promises';

import { IPAddr, type IPNet } from '../../util/ip.js';
import { VXLAN_OVERHEAD } from '../mtu.js';
import type { JsonValue, Lease, LeaseAttrs, LeaseEvent } from '../../subnet/lease.js';
import { errorMessage } from '../../util/errors.js';
import { PeerSet } from '../peer-set.js';
import type { PeerProblem } from '../../subnet/peer-gate.js';
import { vniProblem } from '../peer-data.js';
import { withFileLock } from '../../util/flock.js';
import { describeOp, Netlink } from '../../netlink/index.js';
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
import { applyDelta, deltaFlowMods, deltaRouteOps, isEmptyDelta, peerKey, planPeerDelta, type PeerDelta } from './delta.js';
import {
  Category,
  CATEGORY_ONLY_MASK,
  cookieOf,
  desiredFlows,
  gatewayOf,
  macFromIP,
  pipelineFlows,
  podFlows,
  renderFlowMods,
  renderFlows,
  ROUND_MASK,
  roundCookie,
  type NodePorts,
  type PeerNode,
} from './pipeline.js';
import { renderCookieMatch } from '../../render/ofctl.js';

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
  /** weft-gw0's ifindex as the last full pass saw it (the delta's routes go through it). */
  private gatewayIndex: number | null = null;
  private round = 0;
  /** The first full pass after start made the table this round's (and persisted the round). */
  private converged = false;
  /**
   * The model: the peers whose flows (under `round`) and host route are programmed, by subnet.
   * Trusted only while `certain`; a pass that left anything unknown clears it, and only a full
   * pass that succeeds sets it again.
   */
  private readonly programmed = new Map<string, PeerNode>();
  private certain = false;
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
      // A new lease (subnet) changes the node's flows and every peer flow's source MAC: the next
      // pass compares everything.
      this.certain = false;
      await this.ensureGateway();
      if (this.round === 0) {
        const previous = await readRound(this.ovs, this.opts.bridge);
        this.round = nextRound(previous);
        // Leftovers of an earlier start that took this round and died before persisting it.
        await this.ovs.delFlowsByCookie(this.opts.bridge, roundCookie(this.round), ROUND_MASK);
        this.ctx.logger.info('ovs: starting a new flow round', { bridge: this.opts.bridge, round: this.round, previous });
        this.ctx.policyFlows?.attach(this.policyHost(this.round));
      }
      // Node and pod flows now, under the new round; peers follow with the first full pass.
      await this.withFlowLock(async () => {
        const node = this.nodePorts();
        const pods = await listPodInterfaces(this.ovs, this.opts.bridge, this.podPorts);
        const flows = [...pipelineFlows(this.round, node, this.pipelineOptions), ...pods.flatMap((p) => podFlows(this.round, node, p))];
        await this.ovs.addFlows(this.opts.bridge, renderFlows(flows));
      });
    });
  }

  /** Lease events: only the changed peers' flows and routes, unless the model is not to be trusted. */
  apply(batch: readonly LeaseEvent[]): Promise<BackendPass> {
    const changes = this.peerSet.apply(batch);
    return this.serial.run(async () => {
      if (!this.lease) return CLEAN_PASS;
      if (!this.converged || !this.certain) return this.fullPass('apply');
      const delta = planPeerDelta(this.programmed, changes, (l) => this.peerNode(l));
      if (isEmptyDelta(delta)) return CLEAN_PASS;
      return this.applyDelta(delta);
    });
  }

  /** The timer (or a retry after refused operations): the full comparison; any difference is drift. */
  reconcile(peers: readonly Lease[]): Promise<BackendPass> {
    this.peerSet.reset(peers);
    return this.serial.run(() => (this.lease ? this.fullPass('reconcile') : Promise.resolve(CLEAN_PASS)));
  }

  /**
   * One bundle for all flow changes of the batch, then one netlink batch for its routes. The model
   * moves only when both were accepted; otherwise it is marked uncertain and the failure reported,
   * so the next pass is a full one.
   *
   * Flows first, routes after, not side by side: ovs-vswitchd re-reads the whole routing table on
   * every route change it is told about (its tunnel route cache), and an OpenFlow request that
   * arrives meanwhile waits for that (~150 ms at 1 000 routes, measured).
   */
  private async applyDelta(delta: PeerDelta): Promise<BackendPass> {
    const { bridge } = this.opts;
    this.certain = false;
    const mods = renderFlowMods(deltaFlowMods(delta, this.round, this.nodePorts()));
    const ops = deltaRouteOps(delta, this.gatewayIndex!);
    let failures = 0;
    try {
      await this.ovs.bundleFlowMods(bridge, mods);
    } catch (e) {
      failures++;
      this.ctx.logger.warn('ovs: flow bundle refused; the next pass compares everything', { bridge, error: errorMessage(e) });
    }
    try {
      const routes = await this.nl.apply(ops);
      failures += routes.failures.length;
      for (const f of routes.failures.slice(0, 10)) {
        this.ctx.logger.warn('kernel operation failed; the next pass compares everything', { op: describeOp(f.op), errno: f.error.errno });
      }
    } catch (e) {
      failures += ops.length;
      this.ctx.logger.warn('ovs: host route changes failed; the next pass compares everything', { error: errorMessage(e) });
    }
    if (failures > 0) return { failures };
    applyDelta(this.programmed, delta);
    this.certain = true;
    this.ctx.metrics?.recordProgramming(this.programmed.size, { added: 0, changed: 0, removed: 0 }, 0);
    return CLEAN_PASS;
  }

  /** Everything compared with what is there and corrected: bridge, gateway, flows, routes. */
  private async fullPass(why: 'apply' | 'reconcile'): Promise<BackendPass> {
    this.certain = false;
    let deviceRepairs = 0;
    // The bridge, its ports and the gateway are checked by full passes only.
    const ports = await ensureBridge(this.ovs, this.bridgeSpec());
    if (this.ports && (ports.tunnel !== this.ports.tunnel || ports.gateway !== this.ports.gateway)) deviceRepairs++;
    this.ports = ports;
    if (await this.ensureGateway()) deviceRepairs++;
    const wanted = this.peerNodes([...this.peerSet.values()]);
    const flowRepairs = await this.programFlows(wanted);
    const routes = await this.programRoutes(wanted);
    const repairs: Repairs = {
      added: flowRepairs.added + routes.repairs.added,
      changed: flowRepairs.changed + routes.repairs.changed,
      removed: flowRepairs.removed + routes.repairs.removed,
    };
    this.programmed.clear();
    for (const p of wanted) this.programmed.set(peerKey(p), p);
    this.certain = routes.failures === 0;
    if (why === 'apply' && this.certain) this.ctx.logger.debug('ovs: full pass on lease events (start-up or after a refused operation)', { peers: wanted.length });
    this.ctx.metrics?.recordProgramming(wanted.length, repairs, deviceRepairs);
    return { failures: routes.failures };
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

  /** With --network-policy the pipeline has the policy tables' frame, and the section's flows are part of the table. */
  private get policy(): boolean {
    return this.ctx.policyFlows !== undefined;
  }

  private get pipelineOptions() {
    return { policy: this.policy, serviceCIDRs: this.ctx.policyFlows?.serviceCIDRs ?? [] };
  }

  /**
   * The flow lock (the CNI plugin's pod flows), and with policy the section's turn, for a
   * compare-and-replace of the whole table: a policy bundle never lands between the two.
   */
  private withFlowLock<T>(fn: () => Promise<T>): Promise<T> {
    const section = this.ctx.policyFlows;
    const locked = section ? () => section.exclusive(fn) : fn;
    return withFileLock(flowLockPath(this.ovs.runDir, this.opts.bridge), locked, { timeoutSeconds: 30 });
  }

  /** What the policy enforcer writes through: this run's round, bundles, and the bridge's policy flows. */
  private policyHost(round: number) {
    const { bridge } = this.opts;
    const anyRoundPolicy = renderCookieMatch(cookieOf(0, Category.Policy, 0), CATEGORY_ONLY_MASK);
    return {
      round,
      bundle: async (mods: string) => {
        await this.ovs.bundleFlowMods(bridge, mods);
        await this.purgeStaleDatapathFlows();
      },
      dumpPolicyFlows: (withStats: boolean) => this.ovs.dumpFlows(bridge, anyRoundPolicy, withStats),
    };
  }

  /**
   * After policy flows changed: every cached datapath flow is dropped, so the next packet of each
   * flow is translated against the new tables. Measured here (OVS 3.1, userspace datapath):
   * without it, a cached flow that allowed a pair of pods kept allowing new connections after a
   * policy denied them — through later changes and `revalidator/wait` — next to the right drop
   * flow under another recirculation id. The cause is not found; until it is, the kernel datapath
   * (not testable here: this kernel has no openvswitch module) is purged too. The cost: every
   * flow's next packet takes the slow path once per policy write (writes coalesce under load).
   */
  private async purgeStaleDatapathFlows(): Promise<void> {
    await this.ovs.unixctl('revalidator/purge');
  }

  /**
   * The whole desired table, from the pod ports as OVSDB has them now. With policy, the section's
   * flows; before the enforcer programmed them, the policy flows on the bridge as they are (lines
   * ovs-vswitchd printed, handed back to it unchanged: ovs-ofctl reads its own dump format).
   */
  private async desiredTable(peers: readonly PeerNode[]): Promise<{ text: string; flows: number; pods: number }> {
    const pods = await listPodInterfaces(this.ovs, this.opts.bridge, this.podPorts);
    const flows = desiredFlows(this.round, this.nodePorts(), pods, peers, this.pipelineOptions);
    const section = this.ctx.policyFlows;
    const policyFlows = section?.flows(this.round) ?? null;
    if (policyFlows) flows.push(...policyFlows);
    const kept = section && !policyFlows ? await this.policyHost(this.round).dumpPolicyFlows(false) : [];
    return { text: renderFlows(flows) + kept.map((l) => `${l}\n`).join(''), flows: flows.length + kept.length, pods: pods.length };
  }

  /** Makes the flow table the desired set; returns what differed. */
  private async programFlows(peers: readonly PeerNode[]): Promise<Repairs> {
    const { bridge } = this.opts;
    if (!this.converged) {
      // The first full pass: one atomic swap to this round's complete table, then persist.
      return this.withFlowLock(async () => {
        const table = await this.desiredTable(peers);
        const repairs = countDiff(await this.ovs.diffFlows(bridge, table.text));
        await this.ovs.replaceFlows(bridge, table.text);
        if (this.policy) await this.purgeStaleDatapathFlows();
        this.converged = true;
        if (await clearFlowRestoreWait(this.ovs)) this.ctx.logger.info('ovs: flows restored; cleared flow-restore-wait');
        await saveRound(this.ovs, bridge, this.round);
        this.ctx.logger.info('ovs: flow table converged', { round: this.round, flows: table.flows, pods: table.pods, peers: peers.length });
        return repairs;
      });
    }
    // Compared without the lock first: a pass that finds nothing to do never makes a CNI ADD or
    // DEL wait. A difference may be a pod attaching right now; it is judged again under the lock.
    const first = await this.desiredTable(peers);
    if ((await this.ovs.diffFlows(bridge, first.text)).length === 0) return { added: 0, changed: 0, removed: 0 };
    return this.withFlowLock(async () => {
      const table = await this.desiredTable(peers);
      const diff = await this.ovs.diffFlows(bridge, table.text);
      const repairs = countDiff(diff);
      if (diff.length === 0) return repairs;
      const empty = repairs.removed === 0 && repairs.changed === 0 && repairs.added === table.flows;
      if (empty) this.ctx.logger.warn('ovs: flow table is empty (ovs-vswitchd restarted?); replaying it', { bridge, flows: table.flows });
      else this.ctx.logger.warn('ovs: flow table drifted from the desired set; rewriting it', { bridge, ...repairs });
      await this.ovs.replaceFlows(bridge, table.text);
      if (this.policy) await this.purgeStaleDatapathFlows();
      if (await clearFlowRestoreWait(this.ovs)) this.ctx.logger.info('ovs: flows restored; cleared flow-restore-wait');
      return repairs;
    });
  }

  /** `peer subnet via peer gateway dev weft-gw0 onlink`, so host traffic takes the tunnel too. */
  private async programRoutes(peers: readonly PeerNode[]): Promise<ProgramResult> {
    const gw = await this.nl.link(GATEWAY_PORT_NAME);
    if (!gw) throw new OvsConfigError(`ovs backend: the gateway device ${GATEWAY_PORT_NAME} is missing`);
    this.gatewayIndex = gw.index;
    const routes: RouteSpec[] = peers.map((p) => ({ dst: p.subnet, gateway: gatewayOf(p.subnet), oif: gw.index, onlink: true }));
    const networks = [this.ctx.config.network].filter((n): n is IPNet => n !== null);
    return program(this.nl, { networks, l2Devices: [], useNexthops: false }, { routes, neighbours: [], fdb: [] }, this.ctx.logger);
  }

  private peerNodes(peers: readonly Lease[]): PeerNode[] {
    return peers.map((p) => this.peerNode(p)).filter((p): p is PeerNode => p !== null);
  }

  /** The peer a lease programs, or null when this backend cannot use it. */
  private peerNode(peer: Lease): PeerNode | null {
    return this.peerProblem(peer) === null && peer.subnet ? { subnet: peer.subnet, publicIP: peer.attrs.publicIP } : null;
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
