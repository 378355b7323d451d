// flannel's host-gw backend: one route per peer subnet via the peer's public IP on the external
// interface. Needs L2 adjacency, so it refuses a public IP that is not the interface's own (NAT).
import { IPAddr, type IPNet } from '../../util/ip.js';
import type { Lease, LeaseEvent } from '../../subnet/lease.js';
import { PeerSet } from '../peer-set.js';
import type { PeerProblem } from '../../subnet/peer-gate.js';
import { Netlink } from '../../netlink/index.js';
import type { Backend, BackendContext, BackendPass, Prepared } from '../backend.js';
import type { RouteSpec } from '../kernel/diff.js';
import { program } from '../kernel/programmer.js';
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

  async start(): Promise<void> {}

  apply(batch: readonly LeaseEvent[]): Promise<BackendPass> {
    this.peers.apply(batch);
    return this.reconcile([...this.peers.values()]);
  }

  reconcile(peers: readonly Lease[]): Promise<BackendPass> {
    return this.serial.run(async () => {
      const { routes, programmed } = this.desiredRoutes(peers);
      const { config } = this.ctx;
      const networks = [config.network, config.ipv6Network].filter((n): n is IPNet => n !== null);
      const result = await program(this.nl, { networks, l2Devices: [], useNexthops: false }, { routes, neighbours: [], fdb: [] }, this.ctx.logger);
      this.ctx.metrics?.recordProgramming(programmed, result.repairs, 0);
      return { failures: result.failures };
    });
  }

  async close(): Promise<void> {
    await this.serial.idle();
    this.nl.close();
  }

  private desiredRoutes(peers: readonly Lease[]): { routes: RouteSpec[]; programmed: number } {
    const { config, extIface } = this.ctx;
    const routes: RouteSpec[] = [];
    let programmed = 0;
    for (const peer of peers) {
      if (this.peerProblem(peer)) continue;
      let any = false;
      if (config.enableIPv4 && peer.subnet && !peer.attrs.publicIP.isUnspecified()) {
        routes.push({ dst: peer.subnet, gateway: peer.attrs.publicIP, oif: extIface.index, onlink: false });
        any = true;
      }
      if (config.enableIPv6 && peer.ipv6Subnet && peer.attrs.publicIPv6) {
        routes.push({ dst: peer.ipv6Subnet, gateway: peer.attrs.publicIPv6, oif: extIface.index, onlink: false });
        any = true;
      }
      if (any) programmed++;
    }
    return { routes, programmed };
  }
}

function sameIP(a: IPAddr | null, b: IPAddr | null): boolean {
  return a !== null && b !== null && a.equals(b);
}
