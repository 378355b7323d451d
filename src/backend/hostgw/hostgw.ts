// flannel's host-gw backend: one route per peer subnet via the peer's public IP on the external
// interface (through a weft nexthop object per peer where the kernel has them: several times
// cheaper to insert than a gateway per route). Needs L2 adjacency, so it refuses a public IP that
// is not the interface's own (NAT). Events apply deltas; the full diff is the timer's.
import { IPAddr, type IPNet } from '../../util/ip.js';
import { leaseId, type Lease, type LeaseEvent } from '../../subnet/lease.js';
import { PeerSet } from '../peer-set.js';
import type { PeerProblem } from '../../subnet/peer-gate.js';
import { Netlink } from '../../netlink/index.js';
import type { Backend, BackendContext, BackendPass, Prepared } from '../backend.js';
import type { RouteSpec } from '../kernel/diff.js';
import { KernelDataplane } from '../kernel/dataplane.js';
import type { PeerEntries } from '../kernel/model.js';
import type { ProgramScope } from '../kernel/programmer.js';
import { SerialQueue } from '../serial.js';

export class HostGwNatError extends Error {
  constructor(family: 4 | 6, publicIP: IPAddr | null, ifaceIP: IPAddr | null) {
    super(
      `host-gw: the public IPv${family} address ${String(publicIP)} is not the interface address ${String(ifaceIP)}; ` +
        'host-gw needs the nodes on one L2 segment and does not work behind NAT (use vxlan)',
    );
    this.name = 'HostGwNatError';
  }
}

export class HostGwBackend implements Backend {
  readonly type = 'host-gw';
  private readonly nl: Netlink;
  private readonly serial = new SerialQueue();
  private readonly peers = new PeerSet();
  private readonly dataplane: KernelDataplane;
  /** Whether the kernel has nexthop objects (5.3+); probed on the first pass. */
  private nexthops: boolean | null = null;

  constructor(
    private readonly ctx: BackendContext,
    netlink?: Netlink,
  ) {
    const { extIface, config } = ctx;
    if (config.enableIPv4 && !sameIP(extIface.extAddr, extIface.ifaceAddr)) {
      throw new HostGwNatError(4, extIface.extAddr, extIface.ifaceAddr);
    }
    if (config.enableIPv6 && !sameIP(extIface.extV6Addr, extIface.ifaceV6Addr)) {
      throw new HostGwNatError(6, extIface.extV6Addr, extIface.ifaceV6Addr);
    }
    this.nl = netlink ?? Netlink.open();
    this.dataplane = new KernelDataplane(this.nl, ctx.logger);
  }

  prepare(): Promise<Prepared> {
    const { extIface, config } = this.ctx;
    return Promise.resolve({
      attrs: {
        publicIP: extIface.extAddr ?? IPAddr.parse('0.0.0.0'),
        publicIPv6: config.enableIPv6 ? extIface.extV6Addr : null,
        backendType: 'host-gw',
      },
      mtu: extIface.mtu,
    });
  }

  peerProblem(peer: Lease): PeerProblem | null {
    return peer.attrs.backendType === 'host-gw' ? null : { reason: 'backend-type', detail: `backend type "${peer.attrs.backendType ?? ''}" is not host-gw` };
  }

  start(): Promise<void> {
    const ext = this.ctx.extIface;
    // host-gw owns routes (and their nexthops) only: no neighbour or FDB monitor.
    this.dataplane.watchDrift({
      families: [],
      fdb: false,
      devIndex: (dev) => (dev === ext.name ? ext.index : null),
      scope: () => this.scope(),
      exclusive: (fn) => this.serial.run(fn),
      fullPass: async () => this.dataplane.full(await this.scope(), this.allEntries()),
      onRepairs: (repairs) => this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, repairs, 0),
    });
    return Promise.resolve();
  }

  /** Only the batch's peers: their old routes out, their new ones in. */
  apply(batch: readonly LeaseEvent[]): Promise<BackendPass> {
    const changes = this.peers.apply(batch);
    return this.serial.run(async () => {
      const pass = await this.dataplane.delta(
        await this.scope(),
        changes.map((c) => ({ id: c.id, entries: c.after ? this.entriesOf(c.after) : null })),
        () => this.allEntries(),
      );
      this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, pass.repairs, 0);
      return { failures: pass.failures };
    });
  }

  /** The timer's full comparison: read while events go on, compared with the model. */
  async reconcile(peers: readonly Lease[]): Promise<BackendPass> {
    if (!this.peers.sameAs(peers)) this.dataplane.invalidate();
    this.peers.reset(peers);
    const pass = await this.dataplane.verify(await this.scope(), (fn) => this.serial.run(fn), () => this.allEntries());
    this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, pass.repairs, 0);
    return { failures: pass.failures };
  }

  /** Routes via peers on the external interface go through weft's nexthop objects where the kernel has them. */
  private async scope(): Promise<ProgramScope> {
    this.nexthops ??= await this.nl.supportsNexthops();
    const { config, extIface } = this.ctx;
    const networks = [config.network, config.ipv6Network].filter((n): n is IPNet => n !== null);
    return { networks, l2Devices: [], useNexthops: this.nexthops, nexthopDevices: [extIface.index] };
  }

  private allEntries(): Map<string, PeerEntries> {
    const out = new Map<string, PeerEntries>();
    for (const peer of this.peers.values()) {
      const e = this.entriesOf(peer);
      if (e) out.set(leaseId(peer), e);
    }
    return out;
  }

  async close(): Promise<void> {
    await this.dataplane.stopDriftWatch();
    await this.serial.idle();
    this.nl.close();
  }

  /** One peer's routes (one per family it has); null when it has nothing to program. */
  private entriesOf(peer: Lease): PeerEntries | null {
    if (this.peerProblem(peer)) return null;
    const { config, extIface } = this.ctx;
    const routes: RouteSpec[] = [];
    if (config.enableIPv4 && peer.subnet && !peer.attrs.publicIP.isUnspecified()) {
      routes.push({ dst: peer.subnet, gateway: peer.attrs.publicIP, oif: extIface.index, onlink: false });
    }
    if (config.enableIPv6 && peer.ipv6Subnet && peer.attrs.publicIPv6) {
      routes.push({ dst: peer.ipv6Subnet, gateway: peer.attrs.publicIPv6, oif: extIface.index, onlink: false });
    }
    return routes.length > 0 ? { routes, neighbours: [], fdb: [] } : null;
  }
}

function sameIP(a: IPAddr | null, b: IPAddr | null): boolean {
  return a !== null && b !== null && a.equals(b);
}
