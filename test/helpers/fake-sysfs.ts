// A fake sysfs tree for the sriov plugin, laid out like the kernel's (the paths sriov-cni's
// pkg/utils/testing.go and sriovnet read), under a temp directory:
//
//   devices/pci0000:00/<pci>/                         every PF and VF
//   devices/pci0000:00/<pf>/{sriov_numvfs,virtfn<N> -> ../<vf>,net/<pfname>/,net/<rep>/}
//   devices/pci0000:00/<vf>/{physfn -> ../<pf>,net/<netdev>/,driver -> …/drivers/<drv>}
//   bus/pci/devices/<pci> -> ../../../devices/pci0000:00/<pci>
//   bus/pci/drivers/<drv>/
//   class/net/<name> -> ../../devices/pci0000:00/<pci>/net/<name>   (+ device -> ../../../<pci>)
//   class/net/<name>/{phys_switch_id,phys_port_name}                  switchdev uplink and representors
//
// The netdev names are whatever the test made them (veth ends in its namespaces).
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface FakeVf {
  readonly pci: string;
  /** The VF's netdev; null/absent: none (DPDK, or unbound). */
  readonly netdev?: string | null;
  /** Driver bound to the VF (e.g. "iavf", "vfio-pci"); absent: none. */
  readonly driver?: string;
  /** Offload mode: this VF's representor netdev (phys_port_name pf<P>vf<N>). */
  readonly representor?: string;
}

export interface FakePf {
  readonly pci: string;
  readonly netdev: string;
  readonly vfs: readonly FakeVf[];
  /** sriov_numvfs; default vfs.length. */
  readonly numVfs?: number;
  /** virtfn<N> indices per VF (default 0, 1, …), to model a VF its PF does not list. */
  readonly virtfnIndex?: readonly (number | null)[];
  /** Offload mode: the PF is a switchdev uplink with this switch id and port name "p<port>". */
  readonly switchdev?: { readonly switchId: string; readonly port: number; readonly pfIndex?: number };
}

const PCI_ROOT = 'devices/pci0000:00';

function netdevDir(root: string, pci: string, name: string, attrs: Record<string, string> = {}): void {
  const dir = join(root, PCI_ROOT, pci, 'net', name);
  mkdirSync(dir, { recursive: true });
  for (const [k, v] of Object.entries(attrs)) writeFileSync(join(dir, k), `${v}\n`);
  symlinkSync('../../../' + pci, join(dir, 'device'));
  symlinkSync(`../../${PCI_ROOT}/${pci}/net/${name}`, join(root, 'class/net', name));
}

function pciDevice(root: string, pci: string): string {
  const dir = join(root, PCI_ROOT, pci);
  mkdirSync(dir, { recursive: true });
  symlinkSync(`../../../${PCI_ROOT}/${pci}`, join(root, 'bus/pci/devices', pci));
  return dir;
}

/** Builds the tree for `pfs` under `root` (which must be empty or missing). */
export function buildFakeSysfs(root: string, pfs: readonly FakePf[]): void {
  mkdirSync(join(root, 'bus/pci/devices'), { recursive: true });
  mkdirSync(join(root, 'bus/pci/drivers'), { recursive: true });
  mkdirSync(join(root, 'class/net'), { recursive: true });
  for (const pf of pfs) {
    const pfDir = pciDevice(root, pf.pci);
    writeFileSync(join(pfDir, 'sriov_numvfs'), `${pf.numVfs ?? pf.vfs.length}\n`);
    const sw = pf.switchdev;
    netdevDir(root, pf.pci, pf.netdev, sw ? { phys_switch_id: sw.switchId, phys_port_name: `p${sw.port}` } : {});
    pf.vfs.forEach((vf, i) => {
      const vfDir = pciDevice(root, vf.pci);
      const index = pf.virtfnIndex ? pf.virtfnIndex[i] : i;
      if (index !== null && index !== undefined) symlinkSync(`../${vf.pci}`, join(pfDir, `virtfn${index}`));
      symlinkSync(`../${pf.pci}`, join(vfDir, 'physfn'));
      if (vf.netdev) netdevDir(root, vf.pci, vf.netdev);
      else mkdirSync(join(vfDir, 'net'), { recursive: true });
      if (vf.driver) {
        mkdirSync(join(root, 'bus/pci/drivers', vf.driver), { recursive: true });
        symlinkSync(`../../../bus/pci/drivers/${vf.driver}`, join(vfDir, 'driver'));
      }
      if (vf.representor && sw) {
        netdevDir(root, pf.pci, vf.representor, { phys_switch_id: sw.switchId, phys_port_name: `pf${sw.pfIndex ?? 0}vf${index ?? i}` });
      }
    });
  }
}
