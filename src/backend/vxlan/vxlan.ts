// flannel's vxlan backend, computed as desired state: per peer one permanent neighbour (peer
// subnet address → peer VTEP MAC), one FDB entry (peer VTEP MAC → peer public IP) and one onlink
// route. A batch of events applies just its delta (kernel/dataplane.ts); the full diff runs at
// start, when a device was rebuilt or an operation refused, and on the reconcile timer.
import { IPAddr, IPNet } from '../../util/ip.js';
import { leaseId, vtepMacOfData, type JsonValue, type Lease, type LeaseAttrs, type LeaseEvent } from '../../subnet/lease.js';
import { errorMessage } from '../../util/errors.js';
import { PeerSet } from '../peer-set.js';
import type { PeerProblem } from '../../subnet/peer-gate.js';
import { vniProblem } from '../peer-data.js';
import { Netlink } from '../../netlink/index.js';
import type { Backend, BackendContext, BackendPass } from '../backend.js';
import type { FdbSpec, NeighSpec, RouteSpec } from '../kernel/diff.js';
import { KernelDataplane } from '../kernel/dataplane.js';
import type { PeerEntries } from '../kernel/model.js';
import type { ProgramScope } from '../kernel/programmer.js';
import { VXLAN_OVERHEAD } from '../mtu.js';
import { BackendOptions } from '../options.js';
import { SerialQueue } from '../serial.js';
import {
  disableAcceptRa,
  disableTxChecksumOffload,
  ensureDeviceAddress,
  ensureVxlanDevice,
  type EnsuredDevice,
} from './device.js';

export interface VxlanOptions {
  readonly vni: number;
  readonly port: number;
  readonly gbp: boolean;
  readonly learning: boolean;
  readonly directRouting: boolean;
  /** The MTU of the underlay to subtract the overhead from; default the external interface's. */
  readonly mtu: number | null;
  readonly disableTxChecksumOffload: boolean;
}

const DEFAULT_PORT = 8472; // the Linux kernel's default VXLAN port, which flannel relies on

export function parseVxlanOptions(options: Readonly<Record<string, JsonValue>>): VxlanOptions {
  const o = new BackendOptions('vxlan', options);
  const port = o.integer('Port', 0, 0, 65535);
  const mtu = o.integer('MTU', 0, 0, 65535);
  return {
    vni: o.integer('VNI', 1, 0, 16_777_215),
    port: port === 0 ? DEFAULT_PORT : port,
    gbp: o.boolean('GBP', false),
    learning: o.boolean('Learning', false),
    directRouting: o.boolean('DirectRouting', false),
    mtu: mtu === 0 ? null : mtu,
    disableTxChecksumOffload: o.boolean('DisableTxChecksumOffload', false),
  };
}

interface FamilyDevice {
  readonly family: 4 | 6;
  readonly name: string;
  index: number;
  mac: string;
}

/** Per-family view of a lease: its subnet, public address and backend data. */
function familyOf(lease: Lease, family: 4 | 6) {
  return family === 4
    ? { subnet: lease.subnet, publicIP: lease.attrs.publicIP, data: lease.attrs.backendData }
    : { subnet: lease.ipv6Subnet, publicIP: lease.attrs.publicIPv6, data: lease.attrs.backendV6Data };
}

export class VxlanBackend implements Backend {
  readonly type = 'vxlan';
  private readonly nl: Netlink;
  private readonly devices: FamilyDevice[] = [];
  private readonly serial = new SerialQueue();
  private lease: Lease | null = null;
  private readonly peerSet = new PeerSet();
  private readonly dataplane: KernelDataplane;
  /** DirectRouting: the external interface's connected prefixes, read by every full pass. */
  private direct: IPNet[] = [];
  private linkWatch: { close(): void } | null = null;
  /** Whether the kernel has nexthop objects (5.3+); probed on the first pass. */
  private nexthops: boolean | null = null;

  constructor(
    private readonly opts: VxlanOptions,
    private readonly ctx: BackendContext,
    netlink?: Netlink,
  ) {
    this.nl = netlink ?? Netlink.open();
    this.dataplane = new KernelDataplane(this.nl, ctx.logger);
  }

  private get families(): Array<4 | 6> {
    const f: Array<4 | 6> = [];
    if (this.ctx.config.enableIPv4) f.push(4);
    if (this.ctx.config.enableIPv6) f.push(6);
    return f;
  }

  private deviceName(family: 4 | 6): string {
    return family === 4 ? `flannel.${this.opts.vni}` : `flannel-v6.${this.opts.vni}`;
  }

  /** VXLAN adds 50 bytes over IPv4 and 70 over IPv6; pods get the smaller MTU of the devices. */
  private deviceMtu(family: 4 | 6): number {
    return (this.opts.mtu ?? this.ctx.extIface.mtu) - VXLAN_OVERHEAD[family];
  }

  async prepare(): Promise<{ attrs: LeaseAttrs; mtu: number }> {
    const previous = this.ctx.previousLease ?? null;
    for (const family of this.families) {
      const prevData = previous ? familyOf(previous, family).data : undefined;
      const { dev } = await this.ensureDevice(family, vtepMacOfData(prevData));
      this.devices.push(dev);
    }
    const v4 = this.devices.find((d) => d.family === 4);
    const v6 = this.devices.find((d) => d.family === 6);
    const { extIface } = this.ctx;
    const attrs: LeaseAttrs = {
      publicIP: extIface.extAddr ?? IPAddr.parse('0.0.0.0'),
      publicIPv6: v6 ? extIface.extV6Addr : null,
      backendType: 'vxlan',
      ...(v4 ? { backendData: { VNI: this.opts.vni, VtepMAC: v4.mac } } : {}),
      ...(v6 ? { backendV6Data: { VNI: this.opts.vni, VtepMAC: v6.mac } } : {}),
    };
    return { attrs, mtu: Math.min(...this.families.map((f) => this.deviceMtu(f))) };
  }

  peerProblem(peer: Lease): PeerProblem | null {
    if (peer.attrs.backendType !== 'vxlan') return { reason: 'backend-type', detail: `backend type "${peer.attrs.backendType ?? ''}" is not vxlan` };
    for (const dev of this.devices) {
      const p = familyOf(peer, dev.family);
      if (!p.subnet) continue;
      const vni = vniProblem(p.data, this.opts.vni);
      if (vni) return vni;
      if (!vtepMacOfData(p.data)) return { reason: 'backend-data', detail: `no valid VtepMAC (unicast, not zero) in its IPv${dev.family} backend data` };
    }
    return null;
  }

  async start(lease: Lease): Promise<void> {
    this.lease = lease;
    await this.serial.run(() => this.ensureAddresses());
    const ext = this.ctx.extIface;
    this.dataplane.watchDrift({
      families: this.families,
      fdb: true,
      devIndex: (dev) => (dev === ext.name ? ext.index : (this.devices.find((d) => d.name === dev)?.index ?? null)),
      scope: () => this.scope(),
      exclusive: (fn) => this.serial.run(fn),
      fullPass: () => this.fullPass(),
      onRepairs: (repairs) => this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, repairs, 0),
    });
    // A device deleted or taken down behind our back is rebuilt and every peer replayed.
    this.linkWatch ??= this.nl.watchLinks((ev) => {
      const dev = this.devices.find((d) => d.name === ev.link.name || d.index === ev.link.index);
      if (!dev || (ev.type === 'new' && ev.link.adminUp && ev.link.name === dev.name)) return;
      this.ctx.logger.warn('vxlan device changed behind our back; rebuilding it', { device: dev.name, event: ev.type });
      this.dataplane.invalidate();
      void this.reconcile([...this.peerSet.values()]).catch((e: unknown) =>
        this.ctx.logger.error('rebuilding the vxlan device failed', { error: errorMessage(e) }),
      );
    });
  }

  /** Only the batch's peers: their old entries out, their new ones in. */
  apply(batch: readonly LeaseEvent[]): Promise<BackendPass> {
    const changes = this.peerSet.apply(batch);
    return this.serial.run(async () => {
      if (this.dataplane.uncertain) return this.fullPass();
      const scope = await this.scope();
      const pass = await this.dataplane.delta(
        scope,
        changes.map((c) => ({ id: c.id, entries: c.after ? this.entriesOf(c.after) : null })),
        () => this.allEntries(),
      );
      this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, pass.repairs, 0);
      return { failures: pass.failures };
    });
  }

  /**
   * The timer's full comparison: devices and addresses, then every entry — read while events go
   * on, compared with the model (a full pass from the peers when the model cannot be trusted).
   */
  async reconcile(peers: readonly Lease[]): Promise<BackendPass> {
    if (!this.peerSet.sameAs(peers)) this.dataplane.invalidate();
    this.peerSet.reset(peers);
    const deviceRepairs = await this.serial.run(() => this.checkDevices());
    const pass = await this.dataplane.verify(await this.scope(), (fn) => this.serial.run(fn), () => this.allEntries());
    this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, pass.repairs, deviceRepairs);
    return { failures: pass.failures };
  }

  /** Devices rebuilt or fixed, addresses put back, DirectRouting prefixes re-read: any of it makes the model uncertain. */
  private async checkDevices(): Promise<number> {
    let deviceRepairs = 0;
    for (const dev of this.devices) {
      const r = await this.ensureDevice(dev.family, dev.mac);
      if (r.action !== 'kept') deviceRepairs++;
      dev.index = r.dev.index;
    }
    if (await this.ensureAddresses()) deviceRepairs++;
    const direct = this.opts.directRouting ? await this.onLinkPrefixes() : [];
    if (direct.map(String).join() !== this.direct.map(String).join()) this.dataplane.invalidate();
    this.direct = direct;
    if (deviceRepairs > 0) this.dataplane.invalidate();
    return deviceRepairs;
  }

  private async fullPass(): Promise<BackendPass> {
    const deviceRepairs = await this.checkDevices();
    const pass = await this.dataplane.full(await this.scope(), this.allEntries());
    this.ctx.metrics?.recordProgramming(this.dataplane.peerCount, pass.repairs, deviceRepairs);
    return { failures: pass.failures };
  }

  private allEntries(): Map<string, PeerEntries> {
    const out = new Map<string, PeerEntries>();
    for (const peer of this.peerSet.values()) {
      const e = this.entriesOf(peer);
      if (e) out.set(leaseId(peer), e);
    }
    return out;
  }

  async close(): Promise<void> {
    this.linkWatch?.close();
    this.linkWatch = null;
    await this.dataplane.stopDriftWatch();
    await this.serial.idle();
    this.nl.close();
  }

  private async scope(): Promise<ProgramScope> {
    this.nexthops ??= await this.nl.supportsNexthops();
    const { config } = this.ctx;
    const networks = [config.network, config.ipv6Network].filter((n): n is IPNet => n !== null);
    return { networks, l2Devices: this.devices.map((d) => ({ index: d.index, family: d.family })), useNexthops: this.nexthops };
  }

  private async ensureDevice(
    family: 4 | 6,
    mac: string | null,
  ): Promise<{ dev: FamilyDevice; action: EnsuredDevice['action'] }> {
    const { extIface, logger } = this.ctx;
    const local = family === 4 ? extIface.extAddr : extIface.extV6Addr;
    if (!local) throw new Error(`vxlan: no public IPv${family} address for the ${this.deviceName(family)} device`);
    const name = this.deviceName(family);
    const r = await ensureVxlanDevice(
      this.nl,
      {
        name,
        vni: this.opts.vni,
        local,
        link: extIface.index,
        port: this.opts.port,
        learning: this.opts.learning,
        gbp: this.opts.gbp,
        mtu: this.deviceMtu(family),
        ...(mac ? { mac } : {}),
      },
      logger,
    );
    if (r.action === 'created' || r.action === 'recreated') {
      if (family === 6) await disableAcceptRa(name);
      if (this.opts.disableTxChecksumOffload) await disableTxChecksumOffload(name);
    }
    return { dev: { family, name, index: r.index, mac: r.mac }, action: r.action };
  }

  private async ensureAddresses(): Promise<boolean> {
    const lease = this.lease;
    if (!lease) return false;
    let changed = false;
    for (const dev of this.devices) {
      const subnet = dev.family === 4 ? lease.subnet : lease.ipv6Subnet;
      const network = dev.family === 4 ? this.ctx.config.network : this.ctx.config.ipv6Network;
      if (subnet && network && (await ensureDeviceAddress(this.nl, dev.index, subnet, network))) changed = true;
    }
    return changed;
  }

  /** One peer's neighbours, FDB entries and routes; null when it has nothing to program. */
  private entriesOf(peer: Lease): PeerEntries | null {
    if (this.peerProblem(peer)) return null;
    const routes: RouteSpec[] = [];
    const neighbours: NeighSpec[] = [];
    const fdb: FdbSpec[] = [];
    const ext = this.ctx.extIface.index;
    for (const dev of this.devices) {
      const p = familyOf(peer, dev.family);
      if (!p.subnet || !p.publicIP || p.publicIP.isUnspecified()) continue;
      const mac = vtepMacOfData(p.data);
      if (!mac) continue;
      if (this.direct.some((n) => n.contains(p.publicIP!))) {
        routes.push({ dst: p.subnet, gateway: p.publicIP, oif: ext, onlink: false });
      } else {
        neighbours.push({ ifindex: dev.index, ip: p.subnet.ip, mac });
        fdb.push({ ifindex: dev.index, mac, dst: p.publicIP });
        routes.push({ dst: p.subnet, gateway: p.subnet.ip, oif: dev.index, onlink: true });
      }
    }
    return routes.length > 0 ? { routes, neighbours, fdb } : null;
  }

  /** The external interface's connected prefixes: peers inside them are reachable without a tunnel. */
  private async onLinkPrefixes(): Promise<IPNet[]> {
    const addrs = await this.nl.addresses(this.ctx.extIface.index);
    return addrs.map((a) => IPNet.of(a.ip, a.prefix));
  }
}

