// The bridge plugin's pod side: the pod-side programs of an ADD started early (EarlyPod), the
// addresses, link up and routes in one `nsenter ip -batch` (ipam.ConfigureIface), the wait for
// IPv6 DAD to settle and for our port to come up; for DEL, the pod end deleted from inside the netns.
import { delay } from '../../src/util/backoff.js';
import type { Family } from '../../src/util/ip.js';
import { ipBatch, podSysctls, startPodIpBatch, startPodSysctls, type PendingPodBatch, type PendingPodSysctls } from '../lib/ipbatch.js';
import { linksOf, type IpLink } from '../lib/ipjson.js';
import { addrShowLine, linkDelLine, linkShowLine, linkUpLine, podAddressLines, podIPv6Sysctls, podRouteLines, type BatchLine } from '../lib/lines.js';
import type { NetnsHandle } from '../lib/netns.js';
import { internalError } from '../lib/rollback.js';
import type { CniRequest } from '../skel/types.js';
import type { BridgeConf } from './config.js';
import { batchError } from './host.js';
import type { Gateways } from './plan.js';

/** The reference's waits for the host veth to become operationally up. */
const OPER_UP_SLEEPS_MS = [0, 50, 500, 1000, 1000];
const SETTLE_TIMEOUT_MS = 5000;

/** ip.SettleAddresses: wait until no IPv6 address of the interface is tentative (DAD on). */
async function settleAddresses(ns: NetnsHandle, ifname: string): Promise<void> {
  const deadline = Date.now() + SETTLE_TIMEOUT_MS;
  while (true) {
    const r = await ipBatch([addrShowLine(ifname)], { netns: ns, json: true });
    const link = linksOf(r.docs)[0];
    const pending = (link?.addrs ?? []).some((a) => a.family === 'inet6' && (a.tentative || a.dadfailed));
    if (!pending) return;
    if (Date.now() > deadline) throw internalError(`link ${ifname} still has tentative addresses after ${SETTLE_TIMEOUT_MS / 1000} seconds`);
    await delay(50);
  }
}

/**
 * The pod side after IPAM: addresses, up, routes; returns the container interface as read back.
 * The first batch goes to `pending`, the pod-side `ip` started at the beginning of the ADD.
 */
export async function configurePod(req: CniRequest, conf: BridgeConf, gws: Gateways | null, ns: NetnsHandle, pending: PendingPodBatch): Promise<IpLink> {
  const ifname = req.ifname;
  const up = !conf.disableContainerInterface;
  const lines: BatchLine[] = [];
  let settle = false;
  if (gws) {
    const hasV6 = gws.ips.some((i) => i.address.includes(':'));
    // ipam.ConfigureIface: IPv6 must be enabled on lo and the interface before adding v6 addresses.
    if (hasV6) await podSysctls(ns, podIPv6Sysctls(ifname));
    lines.push(...podAddressLines(ifname, gws.ips, up));
    // With DAD on, routes via an IPv6 gateway wait for the addresses to settle, as the reference.
    settle = conf.enabledad && hasV6 && gws.ips.some((i) => i.gateway?.includes(':') === true);
    if (!settle) lines.push(...podRouteLines(ifname, gws.ips, gws.routes));
  } else if (up) {
    lines.push({ line: linkUpLine(ifname), what: `failed to set "${ifname}" up` });
  }
  lines.push({ line: linkShowLine(ifname), what: 'failed to retrieve link' });
  let r = await pending.run(lines.map((l) => l.line));
  if (r.code !== 0) throw batchError(r, lines);
  if (settle && gws) {
    await settleAddresses(ns, ifname);
    const more = [...podRouteLines(ifname, gws.ips, gws.routes), { line: linkShowLine(ifname), what: 'failed to retrieve link' }];
    r = await ipBatch(
      more.map((l) => l.line),
      { netns: ns, json: true },
    );
    if (r.code !== 0) throw batchError(r, more);
  }
  const link = linksOf(r.docs).find((l) => l.ifname === ifname);
  if (!link) throw internalError(`failed to retrieve link ${ifname}: not in ip's output`);
  return link;
}

/** The reference waits (0, 50, 500, 1000, 1000 ms) for the host veth to be operationally up. */
export async function waitPortUp(hostVeth: string, podLink: IpLink): Promise<void> {
  // The pod end is UP exactly when its peer (our port) is up too: usually nothing to wait for.
  if (podLink.operstate === 'UP') return;
  let state = 'UNKNOWN';
  for (const ms of OPER_UP_SLEEPS_MS) {
    await delay(ms);
    const r = await ipBatch([linkShowLine(hostVeth)], { json: true });
    const l = linksOf(r.docs)[0];
    if (!l) throw internalError(`failed to lookup "${hostVeth}": ${r.message}`);
    state = l.operstate;
    if (state === 'UP') return;
  }
  throw internalError(`bridge port in error state: ${state.toLowerCase()}`);
}

/**
 * The pod-side programs of an ADD (`ip -batch`, and `sysctl` for layer 3), started right after
 * the host batch and given their input when it is known, so that their start-up (fork, nsenter,
 * exec) overlaps the host batch and IPAM instead of following them. Whatever was not given its
 * input is cancelled (it exits doing nothing) when the ADD ends.
 */
export class EarlyPod {
  private started: { readonly batch: PendingPodBatch; readonly sysctls: PendingPodSysctls | null } | null = null;

  constructor(
    private readonly ns: NetnsHandle,
    private readonly layer3: boolean,
  ) {}

  start(): { readonly batch: PendingPodBatch; readonly sysctls: PendingPodSysctls | null } {
    this.started ??= { batch: startPodIpBatch(this.ns, { json: true }), sysctls: this.layer3 ? startPodSysctls(this.ns) : null };
    return this.started;
  }

  cancel(): void {
    this.started?.batch.cancel();
    this.started?.sysctls?.cancel();
  }

  async done(): Promise<void> {
    await Promise.all([this.started?.batch.done(), this.started?.sysctls?.done()]);
  }
}

/** Deletes the container interface from inside the netns; returns the families of its global addresses. */
export async function deletePodLink(ns: NetnsHandle, ifname: string): Promise<Family[]> {
  const lines = [addrShowLine(ifname), linkDelLine(ifname)];
  const r = await ipBatch(lines, { netns: ns, json: true });
  if (r.code !== 0) {
    // Already gone: DEL may run any number of times.
    if (r.failedLines[0] === 1 && /does not exist|Cannot find device/.test(r.message)) return [];
    throw internalError(`failed to delete "${ifname}": ${r.message}`);
  }
  const link = linksOf(r.docs)[0];
  const fams = new Set<Family>();
  for (const a of link?.addrs ?? []) if (a.scope === 'global') fams.add(a.family === 'inet' ? 4 : 6);
  return [...fams];
}
