// The links the offload step changes, through `ip` (the representor in the host: renamed, ARP
// and admin state) and `nsenter … ethtool` (TX checksum offload of the VF in the pod); behind an
// interface so the unit tests can pass fakes.
import { named } from '../../src/render/ipbatch.js';
import { errorMessage } from '../../src/util/errors.js';
import { execProgram } from '../../src/util/exec.js';
import { ipBatch } from '../lib/ipbatch.js';
import { hasFlag, linksOf, type IpLink } from '../lib/ipjson.js';
import { linkSetLine, linkShowLine, linkUpLine } from '../lib/lines.js';
import { NetnsHandle } from '../lib/netns.js';
import { hostLink } from './link.js';

/** An `ip` or `ethtool` step on the representor or the VF failed. */
export class OffloadLinkError extends Error {
  constructor(
    readonly step: string,
    reason: string,
  ) {
    super(`${step}: ${reason}`);
    this.name = 'OffloadLinkError';
  }
}

export interface RepresentorLink {
  readonly name: string;
  readonly mac: string;
  readonly up: boolean;
  readonly arp: boolean;
}

/** The link operations the offload step needs; `ipLinks` is the real one, tests pass fakes. */
export interface OffloadLinks {
  /** A link in the plugin's (host) netns, or null. */
  host(name: string): Promise<RepresentorLink | null>;
  /** Host link `from`: down, renamed `to`, ARP and admin state as given; the link read back. */
  rename(from: string, to: string, set: { readonly arp: boolean; readonly up: boolean }): Promise<RepresentorLink>;
  /** TX checksum offload of a pod interface: true/false, null when ethtool does not say. */
  txChecksum(netns: string, ifname: string): Promise<boolean | null>;
  setTxChecksum(netns: string, ifname: string, on: boolean): Promise<void>;
}

function toRepresentor(l: IpLink): RepresentorLink {
  return { name: l.ifname, mac: l.address, up: hasFlag(l, 'UP'), arp: !hasFlag(l, 'NOARP') };
}

async function inPod<T>(netns: string, fn: (ns: NetnsHandle) => Promise<T>): Promise<T> {
  const ns = NetnsHandle.open(netns);
  try {
    return await fn(ns);
  } finally {
    ns.close();
  }
}

async function podEthtool(netns: string, args: readonly string[]): Promise<string> {
  const what = `ethtool ${args.join(' ')}`;
  return inPod(netns, async (ns) => {
    let r;
    try {
      r = await execProgram('nsenter', [`--net=${NetnsHandle.CHILD_PATH}`, 'ethtool', ...args], { nsFds: [ns.fd] });
    } catch (e) {
      throw new OffloadLinkError(what, errorMessage(e));
    }
    if (r.code !== 0) {
      const why = r.stderr.trim() || r.stdout.trim() || `exit status ${r.code}`;
      const hint = /No such file|not found/i.test(why) ? ' (the netdev datapath needs ethtool: apt-get install ethtool)' : '';
      throw new OffloadLinkError(what, why + hint);
    }
    return r.stdout;
  });
}

export const ipLinks: OffloadLinks = {
  async host(name) {
    const l = await hostLink(name);
    return l ? toRepresentor(l) : null;
  },
  async rename(from, to, set) {
    const lines = [linkSetLine(from, 'down')];
    if (from !== to) lines.push(linkSetLine(from, 'name', named('new name', to)));
    lines.push(linkSetLine(to, 'arp', set.arp ? 'on' : 'off'));
    if (set.up) lines.push(linkUpLine(to));
    lines.push(linkShowLine(to));
    const r = await ipBatch(lines, { json: true });
    const step = from === to ? `failed to set up ${to}` : `failed to rename ${from} to ${to}`;
    if (r.code !== 0) throw new OffloadLinkError(step, r.message || `ip exited with status ${r.code}`);
    const l = linksOf(r.docs).find((x) => x.ifname === to);
    if (!l) throw new OffloadLinkError(step, `${to} is not in ip's output`);
    return toRepresentor(l);
  },
  async txChecksum(netns, ifname) {
    const m = /^tx-checksumming:\s*(on|off)/m.exec(await podEthtool(netns, ['-k', ifname]));
    return m ? m[1] === 'on' : null;
  },
  async setTxChecksum(netns, ifname, on) {
    await podEthtool(netns, ['-K', ifname, 'tx', on ? 'on' : 'off']);
  },
};
