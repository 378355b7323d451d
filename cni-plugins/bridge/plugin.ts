// The bridge plugin: a drop-in for the reference plugins/main/bridge (same keys, result, kernel
// objects and chain names), built to spawn few processes:
//
//   ADD  host:  one `ip -force -batch`: bridge created or read (as it was before our port joined),
//               veth pair with the container end created directly in the pod netns (held open as
//               fd 3), port flags, up                    ‖ IPAM ADD (in-process for weft's host-local)
//        then   `nsenter sysctl -p-` (layer 3)  ‖ `bridge -batch` (VLANs only)
//        then   `nsenter ip -batch`: addresses, up, routes, read back
//               (both pod-side programs are started right after the host batch and wait on
//               stdin: only their input, not their start-up, is on the critical path)
//               ‖ one `ip -batch` for the gateway address + MAC pin (only when it changes)
//               ‖ ipMasq: one `iptables-restore` per family (or one `nft -j`)
//        Any failure undoes what was made (veth, IPAM reservation, rules) and reports the first
//        error; a netns deleted meanwhile is detected at the end and fails the ADD the same way.
//   DEL  at once: IPAM DEL (never needs the netns), the pod end deleted from inside the netns
//        (when there is one), the ipMasq chain found by its name — so the rules go even when the
//        netns is gone or CNI_NETNS is empty (reference bug #810).
//   CHECK as the reference; GC: IPAM GC + this network's ipMasq state of stale containers;
//   STATUS: IPAM STATUS.
import { ipLine } from '../../src/render/ipbatch.js';
import { errorMessage } from '../../src/util/errors.js';
import type { Family } from '../../src/util/ip.js';
import { ipBatch } from '../lib/ipbatch.js';
import { addrShowLine, linkShowLine } from '../lib/lines.js';
import { linksOf, routesOf, type IpLink } from '../lib/ipjson.js';
import { NetnsHandle } from '../lib/netns.js';
import { internalError, Undo, withCleanup } from '../lib/rollback.js';
import { cniPathDelegates } from '../skel/delegate.js';
import { CniError, type CniInterface, type CniPlugin, type CniRequest, type CniResult, type Delegates } from '../skel/types.js';
import { checkAttachment } from './check.js';
import { loadBridgeConf, validateForAdd, validateForCheck, type BridgeConf } from './config.js';
import { applyVlans, configureGateway, plugHost, type GatewayDone } from './host.js';
import {
  gcIptablesMasq,
  gcNftMasq,
  masqAddr,
  onPath,
  type MasqAddr,
  resolveMasqBackend,
  setupIptablesMasq,
  setupNftMasq,
  teardownIptablesMasq,
  teardownNftMasq,
} from './ipmasq.js';
import { calcGateways, podSysctlSettings, type Gateways } from './plan.js';
import { configurePod, deletePodLink, EarlyPod, waitPortUp } from './pod.js';
import { setupSpoofCheck, spoofRefId, teardownSpoofCheck } from './spoofcheck.js';

export type IpamDelegates = Delegates;

export interface BridgeDeps {
  readonly ipam: IpamDelegates;
}

async function setupMasq(req: CniRequest, conf: BridgeConf, gws: Gateways): Promise<void> {
  const addrs = gws.ips.map((i) => masqAddr(i.address));
  if (resolveMasqBackend(conf.ipMasqBackend) === 'nftables') await setupNftMasq(addrs, conf.name, req.ifname, req.containerId);
  else await setupIptablesMasq(addrs, conf.name, req.containerId);
}

/**
 * Removes the ipMasq state of the attachment in both backends, as upstream does (the pod may have
 * been set up by another version or config). Failures of the backend this config uses are
 * reported; the other backend is best effort, as is a family we only guessed.
 */
async function teardownMasq(req: CniRequest, conf: BridgeConf, families: readonly Family[], guessed: boolean, ips: readonly MasqAddr[] = []): Promise<void> {
  const primary = resolveMasqBackend(conf.ipMasqBackend);
  const tasks: Array<Promise<void>> = [];
  for (const f of families) {
    if (!onPath(f === 4 ? 'iptables' : 'ip6tables')) continue;
    const known = ips.filter((a) => a.family === f).map((a) => a.ip);
    tasks.push(
      teardownIptablesMasq(f, conf.name, req.containerId, known).catch((e: unknown) => {
        if (primary === 'iptables' && !guessed) throw e;
      }),
    );
  }
  if (onPath('nft')) {
    tasks.push(
      teardownNftMasq(conf.name, req.ifname, req.containerId).catch((e: unknown) => {
        if (primary === 'nftables') throw e;
      }),
    );
  }
  const results = await Promise.allSettled(tasks);
  const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed.length > 0) throw internalError(failed.map((f) => errorMessage(f.reason)).join('; '));
}

async function add(deps: BridgeDeps, req: CniRequest): Promise<CniResult> {
  const conf = loadBridgeConf(req.config, req.args);
  validateForAdd(conf);
  const ns = NetnsHandle.openForPod(req.netns);
  const undo = new Undo();
  const early = new EarlyPod(ns, conf.ipamType !== '');
  try {
    return await addIn(deps, req, conf, ns, undo, early);
  } catch (e) {
    early.cancel(); // before the undo: nothing more may happen in the pod
    throw withCleanup(e, await undo.run());
  } finally {
    early.cancel();
    await early.done();
    ns.close();
  }
}

/** IPAM plugins that refuse a second allocation for the same attachment (host-local does). */
const REFUSES_DUPLICATES = new Set(['host-local']);

async function addIn(deps: BridgeDeps, req: CniRequest, conf: BridgeConf, ns: NetnsHandle, undo: Undo, early: EarlyPod): Promise<CniResult> {
  const layer3 = conf.ipamType !== '';
  // The reference creates the veth before IPAM so that a duplicate ADD fails before it could
  // reach an IPAM DEL releasing the existing attachment's address. An IPAM that refuses the
  // duplicate itself cannot be released by mistake, so it runs alongside the host batch.
  const hostP = plugHost(req, conf, ns, undo);
  const pod = early.start(); // after the host batch's spawn: that one is on the critical path
  const ipamAdd = async (): Promise<CniResult | null> => {
    if (!layer3) return null;
    const r = await deps.ipam.add(req, conf.ipamType, req.stdin);
    undo.push(`release IP (${conf.ipamType} DEL)`, () => deps.ipam.del(req, conf.ipamType, req.stdin));
    return r;
  };
  const ipamP = REFUSES_DUPLICATES.has(conf.ipamType) ? ipamAdd() : hostP.then(ipamAdd);
  const gwsP = ipamP.then((ipam) => {
    if (!ipam) return null;
    if ((ipam.ips ?? []).length === 0) throw internalError('IPAM plugin returned missing IP config');
    try {
      return calcGateways(ipam, conf);
    } catch (e) {
      throw e instanceof CniError ? e : internalError(errorMessage(e));
    }
  });
  // The masquerade rules only need the addresses: they go in while the pod is configured.
  const masqP = gwsP.then((gws) => {
    if (!gws || !conf.ipMasq) return;
    const families = [...new Set(gws.ips.map((i) => masqAddr(i.address).family))];
    const addrs = gws.ips.map((i) => masqAddr(i.address));
    undo.push('remove ipMasq rules', () => teardownMasq(req, conf, families, false, addrs));
    return setupMasq(req, conf, gws);
  });
  masqP.catch(() => undefined); // handled when joined below; never an unhandled rejection meanwhile
  // The container sysctls (before its addresses) and the port's VLANs only need the veth.
  const sysP = hostP.then((): Promise<unknown> => (pod.sysctls ? pod.sysctls.run(podSysctlSettings(req.ifname, conf.enabledad)) : Promise.resolve()));
  const vlanP = hostP.then((host) => applyVlans(conf, host, host.hostVeth.ifname));
  const setup = await Promise.allSettled([hostP, ipamP, gwsP, sysP, vlanP]);
  const failed = setup.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await masqP.catch(() => undefined); // let it finish before the undo removes its rules
    throw failed.reason;
  }
  const host = await hostP;
  const ipam = await ipamP;
  const gws = await gwsP;

  const [gwR, podR, masqR] = await Promise.allSettled([
    gws ? configureGateway(conf, host, gws) : Promise.resolve({ bridge: host.bridge, gwIface: null }),
    configurePod(req, conf, gws, ns, pod.batch),
    masqP,
  ]);
  for (const r of [podR, gwR, masqR]) if (r.status === 'rejected') throw r.reason;
  const gw = (gwR as PromiseFulfilledResult<GatewayDone>).value;
  const podLink = (podR as PromiseFulfilledResult<IpLink>).value;

  if (conf.macspoofchk) {
    const refId = spoofRefId(req.containerId, req.ifname);
    undo.push('remove spoof-check rules', () => teardownSpoofCheck(refId));
    await setupSpoofCheck(host.hostVeth.ifname, podLink.address, refId);
  }
  if (!conf.disableContainerInterface) await waitPortUp(host.hostVeth.ifname, podLink);
  // We held the netns open throughout; if its path was deleted meanwhile, the pod is gone.
  if (!ns.stillMounted()) throw internalError(`failed to open netns "${req.netns}": the netns was deleted during ADD`);

  const interfaces: CniInterface[] = [
    { name: gw.bridge.ifname, mac: gw.bridge.address },
    { name: host.hostVeth.ifname, mac: host.hostVeth.address },
    { name: req.ifname, mac: podLink.address, sandbox: req.netns },
  ];
  if (gw.gwIface) interfaces.push({ name: gw.gwIface.ifname, mac: gw.gwIface.address });
  const result: CniResult = { cniVersion: '1.1.0', interfaces };
  if (gws) {
    result.ips = gws.ips;
    if (gws.routes.length > 0) result.routes = gws.routes;
  }
  const dns = conf.dns ?? ipam?.dns;
  if (dns) result.dns = dns;
  return result;
}

async function del(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  const layer3 = conf.ipamType !== '';
  const ns = NetnsHandle.openIfPresent(req.netns);
  try {
    // Everything at once: the IPAM release never waits for (or depends on) the netns, and the
    // ipMasq rules are found by chain name, so neither needs the pod.
    const podP = ns ? deletePodLink(ns, req.ifname) : null;
    const tasks: Array<Promise<unknown>> = [];
    if (layer3) tasks.push(deps.ipam.del(req, conf.ipamType, req.stdin));
    if (podP) tasks.push(podP);
    if (layer3 && conf.ipMasq) {
      tasks.push(
        (async () => {
          // The families to clean: from the stored result, else from the live interface, else both.
          const prevIps = (req.config.prevResult?.ips ?? []).flatMap((i) => {
            try {
              return [masqAddr(i.address)];
            } catch {
              return []; // an unparsable stored address: found by listing instead
            }
          });
          const fromResult = [...new Set(prevIps.map((a) => a.family))];
          if (fromResult.length > 0) return teardownMasq(req, conf, fromResult, false, prevIps);
          const live = podP ? await podP.catch(() => [] as Family[]) : [];
          if (live.length > 0) return teardownMasq(req, conf, live, false);
          return teardownMasq(req, conf, [4, 6], true);
        })(),
      );
    }
    if (conf.macspoofchk && onPath('nft')) tasks.push(teardownSpoofCheck(spoofRefId(req.containerId, req.ifname)));
    const results = await Promise.allSettled(tasks);
    const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed.length > 0) {
      const first = failed[0]!.reason as unknown;
      if (failed.length === 1 && first instanceof CniError) throw first;
      throw internalError(failed.map((f) => errorMessage(f.reason)).join('; '));
    }
  } finally {
    ns?.close();
  }
}

async function check(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  validateForCheck(conf);
  const ns = NetnsHandle.openForPod(req.netns);
  try {
    // The reference delegates CHECK even without IPAM (and so fails); a layer-2 config has nothing to check there.
    if (conf.ipamType !== '') await deps.ipam.check(req, conf.ipamType, req.stdin);
    const prev = req.config.prevResult;
    if (!prev) throw internalError('Required prevResult missing');
    const hostNames = new Set<string>([conf.bridge]);
    for (const i of prev.interfaces ?? []) if (!i.sandbox && i.name) hostNames.add(i.name);
    const [hostR, podR] = await Promise.all([
      ipBatch(
        [...hostNames].map((n) => linkShowLine(n)),
        { json: true, details: true, force: true },
      ),
      ipBatch([addrShowLine(req.ifname), ipLine('route', 'show', 'table', 'all')], { netns: ns, json: true, details: true, force: true }),
    ]);
    const hostLinks = new Map(linksOf(hostR.docs).map((l) => [l.ifname, l]));
    const podLink = linksOf(podR.docs).find((l) => l.ifname === req.ifname) ?? null;
    const podRoutes = podR.docs.flatMap((d) => routesOf(d));
    checkAttachment({ conf, ifname: req.ifname, netns: req.netns, prev, hostLinks, podLink, podRoutes });
  } finally {
    ns.close();
  }
}

/** The attachments a GC request says are still in use (null: the runtime sent none). */
export function gcAttachments(config: Record<string, unknown>): Array<{ containerId: string; ifname: string }> | null {
  const raw = config['cni.dev/valid-attachments'] ?? config['cni.dev/attachments'];
  if (!Array.isArray(raw)) return null;
  const out: Array<{ containerId: string; ifname: string }> = [];
  for (const a of raw) {
    if (typeof a !== 'object' || a === null) continue;
    const { containerID, ifname } = a as { containerID?: unknown; ifname?: unknown };
    if (typeof containerID === 'string') out.push({ containerId: containerID, ifname: typeof ifname === 'string' ? ifname : '' });
  }
  return out;
}

async function gc(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  const errors: unknown[] = [];
  if (conf.ipamType !== '') {
    try {
      await deps.ipam.gc(req, conf.ipamType, req.stdin);
    } catch (e) {
      errors.push(e);
    }
  }
  const valid = gcAttachments(req.config);
  // Without a valid list we cannot tell live from stale: leave the rules alone.
  if (valid !== null) {
    const keep = new Set(valid.map((a) => a.containerId));
    const tasks: Array<Promise<unknown>> = [];
    if (onPath('iptables-save')) tasks.push(gcIptablesMasq(4, conf.name, keep));
    if (onPath('ip6tables-save')) tasks.push(gcIptablesMasq(6, conf.name, keep).catch(() => [])); // IPv6 may be unusable
    if (onPath('nft')) tasks.push(gcNftMasq(conf.name, valid));
    for (const r of await Promise.allSettled(tasks)) if (r.status === 'rejected') errors.push(r.reason);
  }
  if (errors.length === 1 && errors[0] instanceof CniError) throw errors[0];
  if (errors.length > 0) throw internalError(errors.map((e) => errorMessage(e)).join('; '));
}

async function status(deps: BridgeDeps, req: CniRequest): Promise<void> {
  const conf = loadBridgeConf(req.config, req.args);
  if (conf.ipamType !== '') await deps.ipam.status(req, conf.ipamType, req.stdin);
}

/** Builds the plugin over its IPAM delegates (the real ones, or fakes in tests). */
export function createBridgePlugin(deps: BridgeDeps): CniPlugin {
  return {
    name: 'bridge',
    add: (req) => add(deps, req),
    del: (req) => del(deps, req),
    check: (req) => check(deps, req),
    gc: (req) => gc(deps, req),
    status: (req) => status(deps, req),
  };
}

export const bridgePlugin: CniPlugin = createBridgePlugin({
  ipam: cniPathDelegates,
});
