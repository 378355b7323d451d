// The VF netdev's trips between the host and the pod, through lib/ipbatch.ts as the bridge plugin
// does it (host side: `ip -batch`; pod side: `nsenter --net=<fd> ip -batch`).
//
// Into the pod, the VF passes through a temporary netns (sriov-cni does the same) so that its
// rename to CNI_IFNAME never happens in the host, where udev or NetworkManager would react to it
// and where CNI_IFNAME may already exist. The temporary netns belongs to an
// `unshare --net ip -force -batch -` process: it vanishes with that process, so nothing is left
// under /run/netns, and if the plugin dies mid-way the kernel returns a physical VF to the
// initial netns by itself.
//
// The temporary netns's process is the one program not started through src/util/exec.ts: the
// host side needs its pid (`link set netns <pid>`, /proc/<pid>/ns/net), which StartedProgram
// does not give.
import { statSync } from 'node:fs';
import { batchText, ipLine, named, type IpLine } from '../../src/render/ipbatch.js';
import { delay } from '../../src/util/backoff.js';
import { errorMessage } from '../../src/util/errors.js';
import { execProgram, startProgram } from '../../src/util/exec.js';
import { ipBatch, parseBatchStderr, podSysctls } from '../lib/ipbatch.js';
import { hasFlag, linksOf, type IpLink } from '../lib/ipjson.js';
import { linkSetLine, linkShowLine, linkUpLine, podAddressLines, podIPv6Sysctls, podRouteLines, type BatchLine } from '../lib/lines.js';
import { NetnsHandle } from '../lib/netns.js';
import type { CniIPConfig, CniRoute } from '../skel/types.js';

/** A step of moving or configuring the VF netdev failed. */
export class VfLinkError extends Error {
  constructor(
    readonly step: string,
    reason: string,
  ) {
    super(`${step}: ${reason}`);
    this.name = 'VfLinkError';
  }
}

/** sriov-cni retries a MAC the driver applies asynchronously (i40e/iavf) 20 × 100 ms. */
const MAC_ATTEMPTS = 20;
const MAC_RETRY_MS = 100;
/** sriov-cni waits this long for carrier before announcing the pod's addresses. */
const CARRIER_WAIT_MS = 200;
const TEMP_NETNS_READY_MS = 5000;

/** A host link by name, or null when it does not exist. */
export async function hostLink(name: string): Promise<IpLink | null> {
  const r = await ipBatch([linkShowLine(name)], { json: true });
  if (r.code !== 0) return null;
  return linksOf(r.docs)[0] ?? null;
}

/** A link inside a pod, or null. */
export async function podLink(ns: NetnsHandle, name: string): Promise<IpLink | null> {
  const r = await ipBatch([linkShowLine(name)], { netns: ns, json: true, details: true });
  if (r.code !== 0) return null;
  return linksOf(r.docs)[0] ?? null;
}

/** The PCI device behind a pod link (`ip -d` parentdev, kernel ≥ 5.14), or null. */
export async function podLinkParentDev(ns: NetnsHandle, name: string): Promise<string | null> {
  const r = await ipBatch([linkShowLine(name)], { netns: ns, json: true, details: true });
  const doc = r.docs[0];
  const first = Array.isArray(doc) ? (doc[0] as Record<string, unknown> | undefined) : undefined;
  return first && first.parentbus === 'pci' && typeof first.parentdev === 'string' ? first.parentdev : null;
}

interface TempNetns {
  readonly pid: number;
  feed(lines: readonly IpLine[]): void;
  readonly done: Promise<{ code: number; stderr: string }>;
}

/** `unshare --net -- ip -force -batch -` with the pod and host netns as its fds 3 and 4. */
function startTempNetns(pod: NetnsHandle, host: NetnsHandle): TempNetns {
  // No deadline: the batch waits for our lines, and the caller bounds the wait for the netns itself.
  // extraFds, not nsFds: the pid is needed now, and only Node's spawn has it at once.
  const p = startProgram('unshare', ['--net', '--', 'ip', '-force', '-batch', '-'], { extraFds: [pod.fd, host.fd], timeoutMs: 0 });
  const done = p.result.then(
    (r) => ({ code: r.code, stderr: r.stderr }),
    (e: unknown) => {
      throw new VfLinkError('failed to create the temporary netns', errorMessage(e));
    },
  );
  done.catch(() => undefined);
  return {
    pid: p.pid ?? -1,
    feed: (lines) => p.feed(batchText(lines)),
    done,
  };
}

/** Waits until process `pid` is in a netns other than ours (unshare has run). */
async function waitOwnNetns(pid: number): Promise<void> {
  const own = statSync('/proc/self/ns/net').ino;
  const deadline = Date.now() + TEMP_NETNS_READY_MS;
  while (true) {
    try {
      if (statSync(`/proc/${pid}/ns/net`).ino !== own) return;
    } catch {
      throw new VfLinkError('failed to create the temporary netns', `process ${pid} exited`);
    }
    if (Date.now() > deadline) throw new VfLinkError('failed to create the temporary netns', `unshare did not enter a new netns within ${TEMP_NETNS_READY_MS} ms`);
    await delay(2);
  }
}

/**
 * Moves host netdev `vf` into the pod as `ifname`: down in the host, into a temporary netns,
 * renamed there (and its altname equal to the old name dropped), into the pod. When the last
 * move fails, the temporary netns renames it back and returns it to the host.
 */
export async function moveVfIntoPod(vf: string, ifname: string, pod: NetnsHandle): Promise<void> {
  const host = NetnsHandle.open('/proc/self/ns/net');
  try {
    const temp = startTempNetns(pod, host);
    if (temp.pid < 0) throw new VfLinkError('failed to create the temporary netns', 'unshare did not start');
    try {
      await waitOwnNetns(temp.pid);
      const r = await ipBatch([linkSetLine(vf, 'down'), linkSetLine(vf, 'netns', temp.pid)]);
      if (r.code !== 0) throw new VfLinkError(`failed to move IF ${vf} to the temporary netns`, r.message);
    } catch (e) {
      temp.feed([]);
      await temp.done.catch(() => undefined);
      throw e;
    }
    const lines = [
      linkSetLine(vf, 'name', named('CNI_IFNAME', ifname)),
      vf !== ifname ? ipLine('link', 'property', 'del', 'dev', named('CNI_IFNAME', ifname), 'altname', named('VF netdev', vf)) : linkShowLine(ifname),
      linkSetLine(ifname, 'netns', '/proc/self/fd/3'),
      // Reached with effect only when the move into the pod failed: back to the host as it was.
      linkSetLine(ifname, 'name', named('VF netdev', vf)),
      linkSetLine(vf, 'netns', '/proc/self/fd/4'),
    ];
    temp.feed(lines);
    const out = await temp.done;
    const { failedLines, byLine, message } = parseBatchStderr(out.stderr);
    if (failedLines.includes(1)) throw new VfLinkError(`error setting container interface name ${ifname} for ${vf}`, byLine.get(1) || message);
    if (failedLines.includes(3)) {
      const back = failedLines.includes(5) ? ` (and it could not be returned to the host: ${byLine.get(5) ?? ''})` : '';
      throw new VfLinkError(`failed to move IF ${ifname} to netns`, `${byLine.get(3) || message}${back}`);
    }
  } finally {
    host.close();
  }
}

/** The pod link after `lines` (which end with `link show`), or the failing line's error. */
async function podBatch(ns: NetnsHandle, lines: readonly BatchLine[]): Promise<IpLink | null> {
  const r = await ipBatch(
    lines.map((l) => l.line),
    { netns: ns, json: true },
  );
  if (r.code !== 0) {
    const n = r.failedLines[0] ?? 0;
    const what = n > 0 ? lines[n - 1]?.what : undefined;
    throw new VfLinkError(what ?? 'pod netns', r.message || `exit status ${r.code}`);
  }
  return linksOf(r.docs).at(-1) ?? null;
}

/**
 * In the pod: arp_notify and ndisc_notify (the kernel then announces the addresses when the link
 * comes up or its MAC changes), optimistic DAD, the configured MAC (retried until the driver
 * shows it), link up. Returns the link as read back.
 */
export async function setupPodLink(ns: NetnsHandle, ifname: string, mac: string | null): Promise<IpLink> {
  await podSysctls(ns, [
    [`net/ipv4/conf/${ifname}/arp_notify`, '1'],
    [`net/ipv6/conf/${ifname}/ndisc_notify`, '1'],
    [`net/ipv6/conf/${ifname}/optimistic_dad`, '1'],
  ]);
  for (let attempt = 1; ; attempt++) {
    const lines: BatchLine[] = [];
    if (mac) lines.push({ line: linkSetLine(ifname, 'address', named('MAC', mac)), what: `failed to set netlink MAC address to ${mac}` });
    lines.push({ line: linkUpLine(ifname), what: `error bringing interface up in container ns` });
    lines.push({ line: linkShowLine(ifname), what: `failed to get netlink device with name ${ifname}` });
    const link = await podBatch(ns, lines);
    if (!link) throw new VfLinkError(`failed to get netlink device with name ${ifname}`, 'not in ip output');
    if (!mac || link.address === mac) return link;
    if (attempt >= MAC_ATTEMPTS) throw new VfLinkError(`failed to set netlink MAC address to ${mac}`, `the device still has ${link.address}`);
    await delay(MAC_RETRY_MS);
  }
}

/** ipam.ConfigureIface in the pod: addresses, up, routes. */
export async function configurePodAddresses(ns: NetnsHandle, ifname: string, ips: readonly CniIPConfig[], routes: readonly CniRoute[]): Promise<void> {
  if (ips.some((i) => i.address.includes(':'))) await podSysctls(ns, podIPv6Sysctls(ifname));
  await podBatch(ns, [...podAddressLines(ifname, ips, true), ...podRouteLines(ifname, ips, routes), { line: linkShowLine(ifname), what: 'failed to retrieve link' }]);
}

/**
 * Announces the pod's addresses (gratuitous ARP, unsolicited NA), best effort: waits up to 200 ms
 * for carrier, then sets the MAC the link already has, which makes the kernel send the
 * announcements of arp_notify / ndisc_notify (NETDEV_CHANGEADDR) now that frames can leave.
 */
export async function announce(ns: NetnsHandle, ifname: string, mac: string): Promise<boolean> {
  const deadline = Date.now() + CARRIER_WAIT_MS;
  let carrier = false;
  while (!carrier) {
    const link = await podLink(ns, ifname);
    carrier = link !== null && hasFlag(link, 'LOWER_UP');
    if (carrier || Date.now() > deadline) break;
    await delay(20);
  }
  const r = await ipBatch([linkSetLine(ifname, 'address', named('MAC', mac))], { netns: ns });
  return carrier && r.code === 0;
}

/** The name a VF gets back in the host when its own is unknown: the systemd style <pf>v<N>. */
export function fallbackHostName(pf: string, vfIndex: number): string {
  const suffix = `v${vfIndex}`;
  return `${pf.slice(0, 15 - suffix.length)}${suffix}`;
}

export interface HostIdentity {
  /** The name the VF goes back to in the host. */
  readonly name: string;
  /** MAC to restore ('' = leave). */
  readonly mac: string;
  /** MTU to restore (0 = leave). */
  readonly mtu: number;
}

/**
 * sriov-cni ReleaseVF: in the pod, link down, renamed to its host name, MAC and MTU restored,
 * moved to the plugin's netns. Returns false when the pod has no such link (already released).
 * A host link already holding the name makes the VF come back as `fallbackName` instead.
 */
export async function releaseVf(ns: NetnsHandle, ifname: string, to: HostIdentity, fallbackName: string): Promise<boolean> {
  const present = await podLink(ns, ifname);
  if (!present) return false;
  const host = NetnsHandle.open('/proc/self/ns/net');
  try {
    const attempt = async (name: string): Promise<{ ok: boolean; exists: boolean; msg: string }> => {
      const lines = [linkSetLine(ifname, 'down')];
      if (name !== ifname) lines.push(linkSetLine(ifname, 'name', named('host name', name)));
      if (to.mac) lines.push(linkSetLine(name, 'address', named('MAC', to.mac)));
      if (to.mtu > 0) lines.push(linkSetLine(name, 'mtu', to.mtu));
      lines.push(linkSetLine(name, 'netns', '/proc/self/fd/4'));
      const r = await execProgram('nsenter', [`--net=${NetnsHandle.CHILD_PATH}`, 'ip', '-batch', '-'], {
        input: batchText(lines),
        nsFds: [ns.fd, host.fd],
      });
      if (r.code === 0) return { ok: true, exists: false, msg: '' };
      const { failedLines, message } = parseBatchStderr(r.stderr);
      // Undo the rename so a second attempt (or DEL) finds the link under its pod name.
      if (name !== ifname) await ipBatch([linkSetLine(name, 'name', named('CNI_IFNAME', ifname))], { netns: ns });
      return { ok: false, exists: failedLines.includes(lines.length) && /File exists/.test(message), msg: message || r.stderr.trim() };
    };
    let r = await attempt(to.name);
    if (!r.ok && r.exists && fallbackName !== to.name) r = await attempt(fallbackName);
    if (!r.ok) throw new VfLinkError(`failed to move interface ${to.name} to init netns`, r.msg);
    return true;
  } finally {
    host.close();
  }
}

/** A VF netdev that is in the host (e.g. returned by the kernel when its pod netns died): renamed and restored. */
export async function restoreHostVf(current: string, to: HostIdentity): Promise<void> {
  const lines = [linkSetLine(current, 'down')];
  if (current !== to.name) lines.push(linkSetLine(current, 'name', named('host name', to.name)));
  if (to.mac) lines.push(linkSetLine(to.name, 'address', named('MAC', to.mac)));
  if (to.mtu > 0) lines.push(linkSetLine(to.name, 'mtu', to.mtu));
  const r = await ipBatch(lines);
  if (r.code !== 0) throw new VfLinkError(`failed to restore VF netdev ${current} as ${to.name}`, r.message);
}

