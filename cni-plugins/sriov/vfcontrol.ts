// The PF's VF-configuration calls as one small interface: read a VF's config, apply changes.
//
//  - IpPfVfControl (what the plugin bundle uses): `ip link set dev <pf> vf N …` in one
//    `ip -batch` (iproute2 encodes the RTM_SETLINK IFLA_VFINFO_LIST / IFLA_VF_* attributes) and
//    `ip -d -j link show dev <pf>` to read the PF's vfinfo_list. A CNI bundle cannot load the
//    native `netlink` addon, so iproute2 is its door to rtnetlink, as for the bridge plugin;
//    src/netlink/vf.ts has the byte-level codec for code that does have a netlink socket.
//  - RecordingPfVfControl: an in-memory PF for tests without SR-IOV hardware; it records every
//    call and behaves like a driver (a change is visible to the next read).
import { type VfChange, type VfConfig, type VfLinkState, type VlanProto } from '../../src/netlink/vf.js';
import { named, type IpLine, type IpWord } from '../../src/render/ipbatch.js';
import { ipBatch } from '../lib/ipbatch.js';
import { linksOf } from '../lib/ipjson.js';
import { linkSetLine, linkShowLine } from '../lib/lines.js';

/** The PF cannot be read (missing link, `ip` failure). */
export class PfReadError extends Error {
  constructor(
    readonly pf: string,
    reason: string,
  ) {
    super(`failed to lookup master ${JSON.stringify(pf)}: ${reason}`);
    this.name = 'PfReadError';
  }
}

/** The PF (driver) refused a change; `change` is the first one refused. */
export class VfChangeError extends Error {
  constructor(
    readonly pf: string,
    readonly vf: number,
    readonly change: VfChange,
    readonly reason: string,
  ) {
    super(describeChangeFailure(vf, change, reason));
    this.name = 'VfChangeError';
  }
}

const LINK_STATE_NUMBER: Record<VfLinkState, number> = { auto: 0, enable: 1, disable: 2 };

/** sriov-cni's message for a failed ApplyVFConfig / ResetVFConfig step. */
export function describeChangeFailure(vf: number, c: VfChange, reason: string): string {
  switch (c.kind) {
    case 'vlan':
      return `failed to set vf ${vf} vlan configuration: ${reason}`;
    case 'mac':
      return `failed to set MAC address to ${c.mac}: ${reason}`;
    case 'rate':
      return `failed to set vf ${vf} min_tx_rate to ${c.minTxRate} Mbps: max_tx_rate to ${c.maxTxRate} Mbps: ${reason}`;
    case 'spoofchk':
      return `failed to set vf ${vf} spoofchk flag to ${c.on ? 'on' : 'off'}: ${reason}`;
    case 'trust':
      return `failed to set vf ${vf} trust flag to ${c.on ? 'on' : 'off'}: ${reason}`;
    case 'linkState':
      return `failed to set vf ${vf} link state to ${LINK_STATE_NUMBER[c.state]}: ${reason}`;
  }
}

export interface ApplyOptions {
  /** Try every change even after one fails (resets); the first failure is still thrown. */
  readonly keepGoing?: boolean;
}

export interface PfVfControl {
  /** VF `vf` as PF `pf` reports it; null when the PF lists no such VF. Throws PfReadError. */
  read(pf: string, vf: number): Promise<VfConfig | null>;
  /** Applies `changes` in order; throws VfChangeError for the first one refused. */
  apply(pf: string, vf: number, changes: readonly VfChange[], opts?: ApplyOptions): Promise<void>;
}

// ---- iproute2 ----

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function int(v: unknown): number {
  return typeof v === 'number' && Number.isInteger(v) ? v : 0;
}

function bool(v: unknown): boolean | null {
  return typeof v === 'boolean' ? v : null;
}

/**
 * One entry of `ip -j link show`'s vfinfo_list (iproute2 print_vfinfo): `vf`, the MAC as
 * `address` (newer) or `mac` (older), `vlan_list` [{vlan, qos, protocol}] or flat `vlan`/`qos`,
 * `rate` {max_tx, min_tx} or the legacy `tx_rate`, `spoofchk`, `trust` (booleans), `link_state`.
 * iproute2 leaves out zero VLAN/QoS and the default 802.1Q protocol.
 */
export function parseIpVfInfo(v: unknown): VfConfig | null {
  if (!isRecord(v) || typeof v.vf !== 'number') return null;
  const macText = typeof v.address === 'string' ? v.address : typeof v.mac === 'string' ? v.mac : '00:00:00:00:00:00';
  let vlan = int(v.vlan);
  let qos = int(v.qos);
  let vlanProto: VlanProto = '802.1q';
  if (Array.isArray(v.vlan_list) && isRecord(v.vlan_list[0])) {
    const first = v.vlan_list[0];
    vlan = int(first.vlan);
    qos = int(first.qos);
    if (typeof first.protocol === 'string' && first.protocol.toLowerCase() === '802.1ad') vlanProto = '802.1ad';
  }
  const rate = isRecord(v.rate) ? v.rate : null;
  const ls = v.link_state;
  return {
    vf: v.vf,
    mac: macText.toLowerCase(),
    vlan,
    qos,
    vlanProto,
    spoofchk: bool(v.spoofchk),
    trust: bool(v.trust),
    linkState: ls === 'auto' || ls === 'enable' || ls === 'disable' ? ls : null,
    minTxRate: rate ? int(rate.min_tx) : 0,
    maxTxRate: rate ? int(rate.max_tx) : int(v.tx_rate),
  };
}

/** The `ip link set` words after `vf N` for one change. */
function vfSettings(c: VfChange): IpWord[] {
  switch (c.kind) {
    case 'vlan':
      // The legacy attribute (no proto) for 802.1Q: drivers without VLAN-list support accept it.
      return ['vlan', c.vlan, 'qos', c.qos, ...(c.proto === '802.1ad' ? ['proto', '802.1ad'] : [])];
    case 'mac':
      return ['mac', named('VF MAC', c.mac)];
    case 'rate':
      return ['min_tx_rate', c.minTxRate, 'max_tx_rate', c.maxTxRate];
    case 'spoofchk':
      return ['spoofchk', c.on ? 'on' : 'off'];
    case 'trust':
      return ['trust', c.on ? 'on' : 'off'];
    case 'linkState':
      return ['state', c.state];
  }
}

/** The `ip link set` line for one change. */
export function ipVfLine(pf: string, vf: number, c: VfChange): IpLine {
  return linkSetLine(pf, 'vf', vf, ...vfSettings(c));
}

export class IpPfVfControl implements PfVfControl {
  async read(pf: string, vf: number): Promise<VfConfig | null> {
    const r = await ipBatch([linkShowLine(pf)], { json: true, details: true });
    if (r.code !== 0) throw new PfReadError(pf, r.message || `ip exited with status ${r.code}`);
    const doc = r.docs[0];
    const link: unknown = Array.isArray(doc) ? doc[0] : undefined;
    if (!isRecord(link) || linksOf(r.docs).length === 0) throw new PfReadError(pf, 'Link not found');
    const list = Array.isArray(link.vfinfo_list) ? link.vfinfo_list : [];
    for (const entry of list) {
      const cfg = parseIpVfInfo(entry);
      if (cfg?.vf === vf) return cfg;
    }
    return null;
  }

  async apply(pf: string, vf: number, changes: readonly VfChange[], opts: ApplyOptions = {}): Promise<void> {
    if (changes.length === 0) return;
    const r = await ipBatch(
      changes.map((c) => ipVfLine(pf, vf, c)),
      { force: opts.keepGoing === true },
    );
    if (r.code === 0) return;
    const n = r.failedLines.find((l) => l > 0) ?? 1;
    const change = changes[n - 1] ?? changes[0]!;
    throw new VfChangeError(pf, vf, change, r.byLine.get(n) || r.message || `ip exited with status ${r.code}`);
  }
}

// ---- recording (tests) ----

export interface RecordedCall {
  readonly op: 'read' | 'apply';
  readonly pf: string;
  readonly vf: number;
  readonly changes?: readonly VfChange[];
}

export interface RecordingPfState {
  /** VF configs by `<pf>/<vf>`. */
  readonly vfs: Record<string, VfConfig>;
  readonly calls: RecordedCall[];
  /** Refuse changes of this kind with this reason (what a driver without support says). */
  readonly refuse?: { readonly kind: VfChange['kind']; readonly reason: string } | null;
}

/** The VF as the default of a freshly created VF on most drivers. */
export function defaultVfConfig(vf: number): VfConfig {
  return { vf, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: true, trust: false, linkState: 'auto', minTxRate: 0, maxTxRate: 0 };
}

function applyOne(cfg: VfConfig, c: VfChange): VfConfig {
  switch (c.kind) {
    case 'vlan':
      return { ...cfg, vlan: c.vlan, qos: c.qos, vlanProto: c.proto };
    case 'mac':
      return { ...cfg, mac: c.mac };
    case 'rate':
      return { ...cfg, minTxRate: c.minTxRate, maxTxRate: c.maxTxRate };
    case 'spoofchk':
      return { ...cfg, spoofchk: c.on };
    case 'trust':
      return { ...cfg, trust: c.on };
    case 'linkState':
      return { ...cfg, linkState: c.state };
  }
}

export class RecordingPfVfControl implements PfVfControl {
  readonly vfs: Map<string, VfConfig>;
  readonly calls: RecordedCall[];
  refuse: RecordingPfState['refuse'];

  constructor(state: Partial<RecordingPfState> = {}) {
    this.vfs = new Map(Object.entries(state.vfs ?? {}));
    this.calls = [...(state.calls ?? [])];
    this.refuse = state.refuse ?? null;
  }

  static key(pf: string, vf: number): string {
    return `${pf}/${vf}`;
  }

  read(pf: string, vf: number): Promise<VfConfig | null> {
    this.calls.push({ op: 'read', pf, vf });
    return Promise.resolve(this.vfs.get(RecordingPfVfControl.key(pf, vf)) ?? null);
  }

  apply(pf: string, vf: number, changes: readonly VfChange[], opts: ApplyOptions = {}): Promise<void> {
    this.calls.push({ op: 'apply', pf, vf, changes: [...changes] });
    const key = RecordingPfVfControl.key(pf, vf);
    let cfg = this.vfs.get(key);
    if (!cfg) return Promise.reject(new VfChangeError(pf, vf, changes[0] ?? { kind: 'trust', on: false }, 'no such VF'));
    let first: VfChangeError | null = null;
    for (const c of changes) {
      if (this.refuse && this.refuse.kind === c.kind) {
        first ??= new VfChangeError(pf, vf, c, this.refuse.reason);
        if (!opts.keepGoing) break;
        continue;
      }
      cfg = applyOne(cfg, c);
    }
    this.vfs.set(key, cfg);
    return first ? Promise.reject(first) : Promise.resolve();
  }

  snapshot(): RecordingPfState {
    return { vfs: Object.fromEntries(this.vfs), calls: [...this.calls], refuse: this.refuse ?? null };
  }
}

