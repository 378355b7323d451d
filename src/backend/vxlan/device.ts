// The VXLAN device (flannel.<VNI> / flannel-v6.<VNI>): reuse a compatible one as flannel does,
// recreate an incompatible or missing one with the same MAC, and keep the node's address on it.
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { runCommand } from '../../util/exec.js';
import { IPNet } from '../../util/ip.js';
import type { Logger } from '../../util/log.js';
import type { LinkInfo, Netlink, VxlanSpec } from '../../netlink/index.js';

/** A random locally administered unicast MAC (flannel pkg/mac). */
export function randomVtepMac(): string {
  const b = randomBytes(6);
  b[0] = (b[0]! & 0xfe) | 0x02;
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

export class VxlanDeviceError extends Error {
  constructor(readonly device: string, message: string) {
    super(`vxlan device ${device}: ${message}`);
    this.name = 'VxlanDeviceError';
  }
}

function compatible(link: LinkInfo, spec: VxlanSpec): boolean {
  const v = link.vxlan;
  return (
    link.kind === 'vxlan' &&
    v !== null &&
    v.vni === spec.vni &&
    v.port === spec.port &&
    v.link === spec.link &&
    v.learning === spec.learning &&
    v.gbp === spec.gbp &&
    v.local !== null &&
    v.local.equals(spec.local)
  );
}

export interface EnsuredDevice {
  readonly index: number;
  readonly mac: string;
  /** What had to be done: nothing, created, recreated (incompatible) or brought up / fixed. */
  readonly action: 'kept' | 'created' | 'recreated' | 'fixed';
}

/**
 * Makes the device exist as `spec` says. A new device gets `spec.mac` (or a random MAC), set at
 * creation so udev/systemd cannot race us; the MAC is verified after the link is up.
 */
export async function ensureVxlanDevice(nl: Netlink, spec: VxlanSpec & { mtu: number }, logger: Logger): Promise<EnsuredDevice> {
  let link = await nl.link(spec.name);
  let action: EnsuredDevice['action'] = 'kept';
  if (link && !compatible(link, spec)) {
    logger.warn('existing vxlan device is incompatible; recreating it', { device: spec.name });
    await nl.deleteLink(link.index);
    link = null;
    action = 'recreated';
  }
  if (!link) {
    link = await nl.createVxlan({ ...spec, mac: spec.mac ?? randomVtepMac() });
    if (action === 'kept') action = 'created';
  }
  if (!link.adminUp || link.mtu !== spec.mtu) {
    await nl.setLink(link.index, { up: true, mtu: spec.mtu });
    if (action === 'kept') action = 'fixed';
  }
  // flannel #1795: some systems rewrite the MAC when the link comes up. Put ours back once.
  const expected = spec.mac ?? link.mac;
  let now = await nl.linkByIndex(link.index);
  if (expected && now?.mac !== expected) {
    await nl.setLink(link.index, { mac: expected });
    now = await nl.linkByIndex(link.index);
    if (now?.mac !== expected) {
      throw new VxlanDeviceError(spec.name, `MAC is ${now?.mac ?? 'unknown'} after up, expected ${expected}`);
    }
  }
  if (!now?.mac) throw new VxlanDeviceError(spec.name, 'has no MAC address');
  return { index: link.index, mac: now.mac, action };
}

/**
 * The lease's network address as /32 (/128) on the device, and no other address of that
 * family from the cluster network (flannel EnsureV4AddressOnLink / EnsureV6AddressOnLink).
 */
export async function ensureDeviceAddress(nl: Netlink, index: number, subnet: IPNet, network: IPNet): Promise<boolean> {
  const want = subnet.ip;
  const host = want.bits;
  const addrs = (await nl.addresses(index)).filter((a) => a.ip.family === want.family);
  let changed = false;
  for (const a of addrs) {
    const stale = !(a.ip.equals(want) && a.prefix === host);
    const ours = want.family === 4 ? network.contains(a.ip) : !IPNet.parse('fe80::/10').contains(a.ip);
    if (stale && ours) {
      await nl.deleteAddress(index, a.ip, a.prefix);
      changed = true;
    }
  }
  if (!addrs.some((a) => a.ip.equals(want) && a.prefix === host)) {
    await nl.addAddress(index, want, host);
    changed = true;
  }
  return changed;
}

/** IPv6 devices must not autoconfigure from router advertisements (flannel sets accept_ra=0). */
export async function disableAcceptRa(device: string): Promise<void> {
  await writeFile(`/proc/sys/net/ipv6/conf/${device}/accept_ra`, '0').catch(() => undefined);
}

/** The kernel bug behind flannel #1243/#1279: bad UDP checksums with TX offload on vxlan. */
export async function disableTxChecksumOffload(device: string): Promise<void> {
  await runCommand('ethtool', ['-K', device, 'tx-checksum-ip-generic', 'off']);
}
