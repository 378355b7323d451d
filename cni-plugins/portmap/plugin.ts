// portmap: forwards host ports to the container (DNAT), with the masquerade marks that make
// hairpin and localhost access work. A drop-in for the reference meta/portmap plugin: same
// config keys, chains, rules and comments, but one netfilter transaction per family instead of
// a process per rule, a CHECK that only looks at the families the container has (#819), a DEL
// that needs neither netns nor prevResult, and a GC for the iptables backend.
import { CniError, ErrorCode, type CniPlugin, type CniRequest, type CniResult } from '../skel/types.js';
import type { Family } from '../../src/util/ip.js';
import { addrOf, containerAddrs, parseConfig, type Backend, type ContainerAddrs, type PortMapConfig } from './config.js';
import { applyNat, IptablesUnusableError, readNat } from './iptables.js';
import { listNftTable, runNftScript } from './nftables.js';
import { checkNft, desiredNft, nftFamily, renderNftAdd, renderNftDelete, rulesOfContainer, type NftFamily, type NftRule, type NftTable } from './nftrules.js';
import {
  checkIptables,
  desiredIptables,
  dnatEntryRules,
  oldSnatChainName,
  ownedChains,
  planAdd,
  planAddBlind,
  planTeardown,
  planTeardownBlind,
  staleChains,
} from './rules.js';
import { enableRouteLocalnet, findBinary, flushUdpConntrack, warn } from './sys.js';
import { errorMessage } from '../../src/util/errors.js';
import { fromSync } from '../lib/promise.js';

const FAMILIES: readonly Family[] = [4, 6];
const ipv = (f: Family): string => (f === 4 ? 'ipv4' : 'ipv6');

/** Upstream's default: iptables, unless only nftables can be used (decided from the tools present). */
export function defaultBackend(): Backend {
  const xt = findBinary('iptables-restore') !== null && findBinary('iptables-save') !== null;
  return !xt && findBinary('nft') !== null ? 'nftables' : 'iptables';
}

/** Parses the config; `prefix` is the reference's per-verb prefix ("failed to parse config: " on ADD/DEL). */
function configOf(req: CniRequest, prefix: string): PortMapConfig {
  try {
    return parseConfig(req.config, { defaultBackend });
  } catch (e) {
    if (e instanceof CniError) throw new CniError(e.code, prefix + e.message, e.details);
    throw e;
  }
}

const familiesOf = (addrs: ContainerAddrs): Family[] => FAMILIES.filter((f) => addrOf(addrs, f) !== null);
const udpPorts = (conf: PortMapConfig): number[] => conf.portMappings.filter((pm) => pm.protocol === 'udp').map((pm) => pm.hostPort);

function internal(msg: string): CniError {
  return new CniError(ErrorCode.Internal, msg);
}

// ---- iptables ----

async function teardownIptables(family: Family, conf: PortMapConfig, containerId: string): Promise<void> {
  const { dnatChain, entryRules } = dnatEntryRules(conf, containerId, family);
  const blind = planTeardownBlind(dnatChain, entryRules, oldSnatChainName(conf.name, containerId));
  await applyNat(family, (saved) => planTeardown(ownedChains(conf.name, containerId), saved), { blind });
}

async function addIptables(conf: PortMapConfig, containerId: string, addrs: ContainerAddrs): Promise<void> {
  const families = familiesOf(addrs);
  const results = await Promise.allSettled(
    families.map(async (f) => {
      const want = desiredIptables(conf, containerId, f, addrOf(addrs, f)!);
      try {
        await applyNat(f, (saved) => planAdd(want, saved), { blind: planAddBlind(want) });
      } catch (e) {
        throw internal(`unable to set up ${ipv(f)} port mappings: ${errorMessage(e)}`);
      }
    }),
  );
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    // A failed ADD leaves nothing of this container behind, in either family.
    await Promise.all(families.map((f) => teardownIptables(f, conf, containerId).catch(() => undefined)));
    throw failed.reason;
  }
}

/**
 * The families DEL has to clean: with a prevResult that gives the container an address, only
 * those families (ADD wrote rules for no other); otherwise both.
 */
function delFamilies(prev: CniResult | undefined, ifname: string): Family[] {
  if (!prev) return [...FAMILIES];
  let addrs: ContainerAddrs;
  try {
    addrs = containerAddrs(prev, ifname);
  } catch {
    return [...FAMILIES]; // an unparsable prevResult must not keep DEL from cleaning up
  }
  const fams = familiesOf(addrs);
  return fams.length > 0 ? fams : [...FAMILIES];
}

async function delIptables(conf: PortMapConfig, containerId: string, families: readonly Family[]): Promise<void> {
  const attempted = [...families];
  let results = await Promise.allSettled(attempted.map((f) => teardownIptables(f, conf, containerId)));
  const isUnusable = (r: PromiseSettledResult<void>): boolean => r.status === 'rejected' && r.reason instanceof IptablesUnusableError;
  if (attempted.length < FAMILIES.length && results.every(isUnusable)) {
    // Only an unusable family was tried: decide as before, on both families, so that the outcome
    // (an error only when neither is usable) does not depend on the family skipped.
    const rest = FAMILIES.filter((f) => !attempted.includes(f));
    results = [...results, ...(await Promise.allSettled(rest.map((f) => teardownIptables(f, conf, containerId))))];
    attempted.push(...rest);
  }
  const unusable = results.filter(isUnusable);
  const failures = results.flatMap((r, i) =>
    r.status === 'rejected' && !(r.reason instanceof IptablesUnusableError) ? [`could not teardown ${ipv(attempted[i]!)} dnat: ${errorMessage(r.reason)}`] : [],
  );
  // Without mappings in the request there is nothing the runtime expects us to remove: best effort.
  const strict = conf.portMappings.length > 0;
  if (unusable.length === FAMILIES.length) {
    const why = unusable.map((r) => errorMessage((r as PromiseRejectedResult).reason)).join('; ');
    if (strict) throw internal(`neither iptables nor ip6tables usable: ${why}`);
    return;
  }
  if (failures.length > 0) {
    if (strict) throw internal(failures.join('; '));
    warn(failures.join('; '));
  }
}

async function checkIptablesFamilies(conf: PortMapConfig, containerId: string, addrs: ContainerAddrs): Promise<void> {
  for (const f of familiesOf(addrs)) {
    const want = desiredIptables(conf, containerId, f, addrOf(addrs, f)!);
    let problems: string[];
    try {
      problems = checkIptables(want, await readNat(f));
    } catch (e) {
      throw internal(`could not check ${ipv(f)} dnat: ${errorMessage(e)}`);
    }
    if (problems.length > 0) throw internal(`could not check ${ipv(f)} dnat: ${problems.join('; ')}`);
  }
}

// ---- nftables ----

type ContainerRules = Map<NftFamily, { chain: string; rule: NftRule }[]>;

async function containerNftRules(families: readonly Family[], containerId: string): Promise<ContainerRules> {
  const tables = await Promise.all(families.map((f) => listNftTable(nftFamily(f))));
  const out: ContainerRules = new Map();
  tables.forEach((t, i) => {
    if (t) out.set(nftFamily(families[i]!), rulesOfContainer(t, containerId));
  });
  return out;
}

async function delNft(containerId: string): Promise<void> {
  const script = renderNftDelete(await containerNftRules(FAMILIES, containerId));
  if (script) await runNftScript('error deleting nftables rules', script);
}

async function addNft(conf: PortMapConfig, containerId: string, addrs: ContainerAddrs): Promise<void> {
  const families = familiesOf(addrs);
  if (families.length === 0) return;
  const stale = await containerNftRules(families, containerId);
  const want = families.map((f) => desiredNft(conf, containerId, f, addrOf(addrs, f)!));
  await runNftScript('unable to set up nftables rules for port mappings', renderNftAdd(want, stale));
}

async function checkNftFamilies(conf: PortMapConfig, containerId: string, addrs: ContainerAddrs): Promise<void> {
  for (const f of familiesOf(addrs)) {
    const table: NftTable | null = await listNftTable(nftFamily(f));
    const problems = checkNft(desiredNft(conf, containerId, f, addrOf(addrs, f)!), table);
    if (problems.length > 0) throw internal(`missing hostport rules: ${problems.join('; ')}`);
  }
}

// ---- verbs ----

async function add(req: CniRequest): Promise<CniResult> {
  const conf = configOf(req, 'failed to parse config: ');
  const prev = req.config.prevResult;
  if (!prev) throw internal('must be called as chained plugin');
  if (conf.portMappings.length === 0) return prev;

  const addrs = containerAddrs(prev, req.ifname);
  const cid = req.containerId;
  if (conf.backend === 'iptables') await addIptables(conf, cid, addrs);
  else await addNft(conf, cid, addrs);

  try {
    // 127.0.0.1 may then cross to the container's interface (the localhost hostPort rule).
    if (addrs.v4 && conf.snat) enableRouteLocalnet(addrs.v4.ip);
  } catch (e) {
    if (conf.backend === 'iptables') await Promise.all(FAMILIES.map((f) => teardownIptables(f, conf, cid).catch(() => undefined)));
    else await delNft(cid).catch(() => undefined);
    throw internal(errorMessage(e));
  }

  // After the rules exist, so new packets of a stale flow meet them.
  await Promise.all(familiesOf(addrs).map((f) => flushUdpConntrack(f, udpPorts(conf))));
  return prev;
}

async function del(req: CniRequest): Promise<void> {
  const conf = configOf(req, 'failed to parse config: ');
  if (conf.backend === 'iptables') {
    await delIptables(conf, req.containerId, delFamilies(req.config.prevResult, req.ifname));
    return;
  }
  try {
    await delNft(req.containerId);
  } catch (e) {
    if (conf.portMappings.length > 0) throw internal(errorMessage(e));
    warn(errorMessage(e));
  }
}

async function check(req: CniRequest): Promise<void> {
  const conf = configOf(req, '');
  const prev = req.config.prevResult;
  if (!prev) throw internal('Required prevResult missing');
  if (conf.portMappings.length === 0) return;
  const addrs = containerAddrs(prev, req.ifname);
  if (conf.backend === 'iptables') await checkIptablesFamilies(conf, req.containerId, addrs);
  else await checkNftFamilies(conf, req.containerId, addrs);
}

/** The container IDs of `cni.dev/valid-attachments` (or the legacy `cni.dev/attachments`); null when absent. */
export function validContainerIds(config: Record<string, unknown>): Set<string> | null {
  const list = config['cni.dev/valid-attachments'] ?? config['cni.dev/attachments'];
  if (!Array.isArray(list)) return null;
  const ids = new Set<string>();
  for (const a of list) {
    if (typeof a === 'object' && a !== null && typeof (a as Record<string, unknown>)['containerID'] === 'string') {
      ids.add((a as Record<string, unknown>)['containerID'] as string);
    }
  }
  return ids;
}

async function gc(req: CniRequest): Promise<void> {
  const conf = configOf(req, '');
  const valid = validContainerIds(req.config);
  // Without the list nothing can be told stale; an empty list means none is valid.
  if (valid === null) return;
  // nftables rules are commented with the container ID only, not the network: they cannot be
  // told apart from another network's, so GC leaves them to DEL.
  if (conf.backend !== 'iptables') return;
  const errors: string[] = [];
  await Promise.all(
    FAMILIES.map(async (f) => {
      try {
        await applyNat(f, (saved) => planTeardown(staleChains(conf.name, (id) => valid.has(id), saved), saved));
      } catch (e) {
        if (!(e instanceof IptablesUnusableError)) errors.push(`${ipv(f)}: ${errorMessage(e)}`);
      }
    }),
  );
  if (errors.length > 0) throw internal(`could not remove stale port mappings: ${errors.join('; ')}`);
}

/** STATUS: the backend's programs are on PATH (a synchronous look-up). */
function status(req: CniRequest): Promise<void> {
  return fromSync(() => {
    const conf = configOf(req, '');
    const tools = conf.backend === 'iptables' ? ['iptables-save', 'iptables-restore'] : ['nft'];
    const missing = tools.filter((t) => findBinary(t) === null);
    if (missing.length > 0) throw new CniError(ErrorCode.PluginNotAvailable, `portmap ${conf.backend} backend not available: ${missing.join(', ')} not found`);
  });
}

export const portmapPlugin: CniPlugin = { name: 'portmap', add, del, check, gc, status };
