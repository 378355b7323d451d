// Finding a VF through sysfs only, under a root that defaults to /sys (tests and containers that
// mount the host's sysfs elsewhere point it at another directory). The paths are the ones
// sriov-cni (pkg/utils) and sriovnet (representors) read:
//
//   <root>/bus/pci/devices/<vf>/physfn/net/<pf>          PF netdev (first entry)
//   <root>/class/net/<pf>/device/sriov_numvfs            number of VFs
//   <root>/class/net/<pf>/device/virtfn<N> -> …/<vf>     VF index N
//   <root>/bus/pci/devices/<vf>/net/<netdev>             the VF's netdev (absent: maybe DPDK)
//   <root>/bus/pci/devices/<vf>/driver -> …/<driver>     vfio-pci / uio_pci_generic / igb_uio = DPDK
//   <root>/class/net/<dev>/{phys_switch_id,phys_port_name}  switchdev uplink (pN) and representors (pfXvfN)
//
// Reads are synchronous: a handful of small files, where loading node:fs/promises costs more.
//
// Every netdev name read here (directory entries, devlink's JSON) becomes an argument of `ip` and
// a path component, so each must be a plain interface name (src/util/names.ts): the kernel makes
// no other, and a tree that shows one is not to be acted on (SysfsNameError, nothing changed).
import { existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, realpathSync } from 'node:fs';
import { basename, join } from 'node:path';
import { errorMessage } from '../../src/util/errors.js';
import { ifNameProblem, isPciAddress } from '../../src/util/names.js';
import { CniError, ErrorCode } from '../skel/types.js';

/** Drivers that leave a VF without a netdev (sriov-cni's UserspaceDrivers). */
export const DPDK_DRIVERS: readonly string[] = ['vfio-pci', 'uio_pci_generic', 'igb_uio'];

/** A VF that cannot be found as configured; the message is sriov-cni's. Code 999 like sriov-cni's. */
export class SriovDiscoveryError extends CniError {
  constructor(
    msg: string,
    readonly deviceID: string,
  ) {
    super(ErrorCode.Internal, msg);
    this.name = 'SriovDiscoveryError';
  }
}

/** The switchdev side of a VF cannot be found (offload mode). */
export class RepresentorNotFoundError extends CniError {
  constructor(
    msg: string,
    readonly deviceID: string,
  ) {
    super(ErrorCode.Internal, msg);
    this.name = 'RepresentorNotFoundError';
  }
}

/** A sysfs directory lists a netdev name the kernel would never make (a fake or tampered tree). */
export class SysfsNameError extends Error {
  constructor(
    readonly dir: string,
    readonly entry: string,
    readonly problem: string,
  ) {
    super(`${dir} lists ${JSON.stringify(entry)}, which is not a network device name (${problem})`);
    this.name = 'SysfsNameError';
  }
}

/** `name` when it is a netdev name; SysfsNameError naming where it was read otherwise. */
export function sysfsNetdevName(dir: string, name: string): string {
  const problem = ifNameProblem(name);
  if (problem !== null) throw new SysfsNameError(dir, name, problem);
  return name;
}

/** Go's os error text for a failed path operation: "lstat <path>: no such file or directory". */
function goPathError(op: string, path: string, e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  const why: Record<string, string> = {
    ENOENT: 'no such file or directory',
    ENOTDIR: 'not a directory',
    EACCES: 'permission denied',
    EINVAL: 'invalid argument',
    EOPNOTSUPP: 'operation not supported',
  };
  return `${op} ${path}: ${(err.code && why[err.code]) ?? err.message}`;
}

const REPRESENTOR_PORT_RE = /^(?:c\d+)?pf\d+(?:vf|sf)\d+$/;
const UPLINK_PORT_RE = /^p(\d+)$/;
const VF_REP_PORT_RE = /^pf(\d+)vf(\d+)$/;

export class Sysfs {
  constructor(readonly root: string) {}

  pciDevice(pci: string): string {
    return join(this.root, 'bus/pci/devices', pci);
  }

  classNet(dev: string): string {
    return join(this.root, 'class/net', dev);
  }

  /** A netdev attribute file (trimmed); null when missing or unreadable (EOPNOTSUPP on non-switchdev). */
  netAttr(dev: string, attr: string): string | null {
    try {
      return readFileSync(join(this.classNet(dev), attr), 'utf8').trim();
    } catch {
      return null;
    }
  }

  /** The PF netdev of a VF (sriov-cni GetPfName), skipping representors listed beside it. */
  pfName(vfPci: string): string {
    const dir = join(this.pciDevice(vfPci), 'physfn', 'net');
    let names: string[];
    try {
      lstatSync(dir);
      names = readdirSync(dir).sort();
    } catch (e) {
      throw new Error(goPathError('lstat', dir, e));
    }
    names.forEach((n) => sysfsNetdevName(dir, n));
    if (names.length < 1) throw new Error('PF network device not found');
    // On a switchdev NIC the PF's net/ also lists VF representors; sriov-cni takes the first name.
    return names.find((n) => !REPRESENTOR_PORT_RE.test(this.netAttr(n, 'phys_port_name') ?? '')) ?? names[0]!;
  }

  /** sriov_numvfs of a PF (sriov-cni GetSriovNumVfs). */
  numVfs(pf: string): number {
    const file = join(this.classNet(pf), 'device', 'sriov_numvfs');
    let text: string;
    try {
      text = readFileSync(file, 'utf8').trim();
    } catch (e) {
      throw new Error(`failed to open the sriov_numfs of device ${JSON.stringify(pf)}: ${goPathError('lstat', file, e)}`);
    }
    if (text === '') throw new Error(`no data in the file ${JSON.stringify(file)}`);
    if (!/^\d+$/.test(text)) throw new Error(`failed to convert sriov_numfs(byte value) to int of device ${JSON.stringify(pf)}: ${text}`);
    return Number(text);
  }

  /** The VF's index on its PF (sriov-cni GetVfid: virtfn<N> links, N < sriov_numvfs). */
  vfIndex(vfPci: string, pf: string): number {
    const total = this.numVfs(pf);
    for (let n = 0; n < total; n++) {
      try {
        if (basename(readlinkSync(join(this.classNet(pf), 'device', `virtfn${n}`))) === vfPci) return n;
      } catch {
        // a missing link: keep looking
      }
    }
    throw new Error(`unable to get VF ID with PF: ${pf} and VF pci address ${vfPci}`);
  }

  /** PF netdev and VF index, or sriov-cni's "failed to get VF information" error. */
  locate(vfPci: string): { pf: string; vfIndex: number } {
    try {
      const pf = this.pfName(vfPci);
      return { pf, vfIndex: this.vfIndex(vfPci, pf) };
    } catch (e) {
      throw new SriovDiscoveryError(
        `SRIOV-CNI failed to load netconf: LoadConf(): failed to get VF information: ${JSON.stringify(errorMessage(e))}`,
        vfPci,
      );
    }
  }

  /**
   * The VF's netdev name (first entry of net/), or null when it has none (sriov-cni
   * GetVFLinkNames). Throws SriovDiscoveryError when net/ lists something that is not a netdev name.
   */
  vfNetdev(vfPci: string): string | null {
    const dir = join(this.pciDevice(vfPci), 'net');
    let names: string[];
    try {
      names = readdirSync(dir).sort();
    } catch {
      return null;
    }
    try {
      names.forEach((n) => sysfsNetdevName(dir, n));
    } catch (e) {
      throw new SriovDiscoveryError(`SRIOV-CNI failed to load netconf: LoadConf(): failed to get the netdev of VF ${vfPci}: ${errorMessage(e)}`, vfPci);
    }
    return names[0] ?? null;
  }

  /** Name of the driver bound to a PCI device, or null when none is bound. */
  driver(pci: string): string | null {
    try {
      return basename(realpathSync(join(this.pciDevice(pci), 'driver')));
    } catch {
      return null;
    }
  }

  isDpdkDriver(pci: string): boolean {
    const d = this.driver(pci);
    return d !== null && DPDK_DRIVERS.includes(d);
  }

  /** PCI address behind a netdev (basename of <class/net/dev>/device), or null (also when that is not a PCI address). */
  netdevPci(dev: string): string | null {
    try {
      const pci = basename(readlinkSync(join(this.classNet(dev), 'device')));
      return isPciAddress(pci) ? pci : null;
    } catch {
      return null;
    }
  }
}

// ---- offload mode: switchdev uplink and VF representor (sriovnet) ----

/** A devlink port as `devlink -j port show` describes it. */
export interface DevlinkPort {
  readonly netdev: string | null;
  readonly flavour: string;
  readonly controller: number | null;
  readonly pfnum: number | null;
  readonly vfnum: number | null;
}

/** Ports of one devlink device (`pci/<addr>`); null when devlink cannot be asked. */
export type DevlinkPortLookup = (pciAddress: string) => Promise<readonly DevlinkPort[] | null>;

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isInteger(v) ? v : null;
}

/** The ports of `pci/<pciAddress>` in `devlink -j port show` output. */
export function parseDevlinkPorts(doc: unknown, pciAddress: string): DevlinkPort[] {
  const ports = (doc as { port?: unknown } | null)?.port;
  if (typeof ports !== 'object' || ports === null) return [];
  const prefix = `pci/${pciAddress}/`;
  const out: DevlinkPort[] = [];
  for (const [key, raw] of Object.entries(ports as Record<string, unknown>)) {
    if (!key.startsWith(prefix) || typeof raw !== 'object' || raw === null) continue;
    const p = raw as Record<string, unknown>;
    out.push({
      netdev: typeof p.netdev === 'string' ? p.netdev : null,
      flavour: typeof p.flavour === 'string' ? p.flavour : '',
      controller: num(p.controller),
      pfnum: num(p.pfnum),
      vfnum: num(p.vfnum),
    });
  }
  return out;
}

/**
 * The switchdev uplink of a VF (sriovnet GetUplinkRepresentor): among the PF's netdevs (or the
 * VF's own, without physfn), the one with a phys_switch_id and a phys_port_name "p<N>".
 */
export function findUplink(sysfs: Sysfs, vfPci: string): string {
  const physfnNet = join(sysfs.pciDevice(vfPci), 'physfn', 'net');
  const dir = existsSync(physfnNet) ? physfnNet : join(sysfs.pciDevice(vfPci), 'net');
  let names: string[];
  try {
    names = readdirSync(dir).sort();
  } catch (e) {
    throw new RepresentorNotFoundError(`failed to find the uplink of VF ${vfPci}: ${goPathError('open', dir, e)}`, vfPci);
  }
  try {
    names.forEach((n) => sysfsNetdevName(dir, n));
  } catch (e) {
    throw new RepresentorNotFoundError(`failed to find the uplink of VF ${vfPci}: ${errorMessage(e)}`, vfPci);
  }
  for (const n of names) {
    const sw = sysfs.netAttr(n, 'phys_switch_id');
    if (sw && UPLINK_PORT_RE.test(sysfs.netAttr(n, 'phys_port_name') ?? '')) return n;
  }
  throw new RepresentorNotFoundError(`failed to find the uplink of VF ${vfPci}: no switchdev netdev with phys_port_name p<N> in ${dir}`, vfPci);
}

/** VF index from <vf>/physfn/virtfn* (sriovnet GetVfIndexByPciAddress). */
export function vfIndexByPhysfn(sysfs: Sysfs, vfPci: string): number {
  const physfn = join(sysfs.pciDevice(vfPci), 'physfn');
  let names: string[];
  try {
    names = readdirSync(physfn).filter((n) => /^virtfn\d+$/.test(n));
  } catch (e) {
    throw new RepresentorNotFoundError(`failed to find the index of VF ${vfPci}: ${goPathError('open', physfn, e)}`, vfPci);
  }
  for (const n of names) {
    try {
      if (readlinkSync(join(physfn, n)).includes(vfPci)) return Number(n.slice('virtfn'.length));
    } catch {
      // not a link
    }
  }
  throw new RepresentorNotFoundError(`failed to find the index of VF ${vfPci}: no virtfn link of its PF points to it`, vfPci);
}

/**
 * The representor netdev of VF `vfIndex` behind switchdev uplink `uplink` (sriovnet
 * GetVfRepresentor): devlink first (a PCI_VF port of controller 0 with that vfnum), then the
 * uplink device's net/ entries whose phys_port_name is pf<P>vf<vfIndex> on the same switch.
 */
export async function findVfRepresentor(sysfs: Sysfs, uplink: string, vfIndex: number, devlink: DevlinkPortLookup | null): Promise<string> {
  const switchId = sysfs.netAttr(uplink, 'phys_switch_id');
  if (!switchId) throw new RepresentorNotFoundError(`uplink ${uplink} is not in switchdev mode (no phys_switch_id)`, '');
  const uplinkPci = sysfs.netdevPci(uplink);
  if (uplinkPci !== null && devlink !== null) {
    const ports = await devlink(uplinkPci).catch(() => null);
    const hit = ports?.find((p) => p.flavour === 'pcivf' && (p.controller ?? 0) === 0 && p.vfnum === vfIndex && p.netdev !== null);
    if (hit?.netdev) {
      const problem = ifNameProblem(hit.netdev);
      if (problem !== null) throw new RepresentorNotFoundError(`devlink names ${JSON.stringify(hit.netdev)} as the representor of VF ${vfIndex}, which is not a network device name (${problem})`, '');
      return hit.netdev;
    }
  }
  const dir = join(sysfs.classNet(uplink), 'device', 'net');
  let names: string[] = [];
  try {
    names = readdirSync(dir).sort();
  } catch {
    // no device/net: nothing to match
  }
  try {
    names.forEach((n) => sysfsNetdevName(dir, n));
  } catch (e) {
    throw new RepresentorNotFoundError(`failed to find the representor of VF ${vfIndex} on uplink ${uplink}: ${errorMessage(e)}`, '');
  }
  for (const n of names) {
    if (n === uplink || sysfs.netAttr(n, 'phys_switch_id') !== switchId) continue;
    const m = VF_REP_PORT_RE.exec(sysfs.netAttr(n, 'phys_port_name') ?? '');
    if (m && Number(m[2]) === vfIndex) return n;
  }
  throw new RepresentorNotFoundError(`failed to find the representor of VF ${vfIndex} on uplink ${uplink}`, '');
}

export interface OffloadPorts {
  readonly uplink: string;
  readonly vfIndex: number;
  readonly representor: string;
}

/** Uplink, VF index and representor of a VF in offload mode. */
export async function discoverRepresentor(sysfs: Sysfs, vfPci: string, devlink: DevlinkPortLookup | null): Promise<OffloadPorts> {
  const uplink = findUplink(sysfs, vfPci);
  const vfIndex = vfIndexByPhysfn(sysfs, vfPci);
  try {
    return { uplink, vfIndex, representor: await findVfRepresentor(sysfs, uplink, vfIndex, devlink) };
  } catch (e) {
    if (e instanceof RepresentorNotFoundError) throw new RepresentorNotFoundError(`VF ${vfPci}: ${e.message}`, vfPci);
    throw e;
  }
}
