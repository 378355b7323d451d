// The VF's settings as the PF applies them (`ip link set <pf> vf N …`): the changes ADD makes in
// sriov-cni's order, the changes that restore what the PF reported before ADD (or the driver
// defaults without it), the wait for an admin MAC some drivers apply asynchronously, and CHECK's
// comparison of the PF's report with the configured settings.
import type { VfChange, VfConfig } from '../../src/netlink/vf.js';
import { delay } from '../../src/util/backoff.js';
import { internalError } from '../lib/rollback.js';
import type { AppliedSettings } from './state.js';
import { VfChangeError, type PfVfControl } from './vfcontrol.js';

const MAC_ATTEMPTS = 20;
const MAC_RETRY_MS = 100;

/** sriov-cni ApplyVFConfig's changes, in its order: VLAN (always), MAC, rates, spoofchk, trust, link state. */
export function changesToApply(a: AppliedSettings): VfChange[] {
  const out: VfChange[] = [{ kind: 'vlan', vlan: a.vlan ?? 0, qos: a.vlanQoS, proto: a.vlanProto }];
  if (a.mac) out.push({ kind: 'mac', mac: a.mac });
  if (a.minTxRate !== null || a.maxTxRate !== null) out.push({ kind: 'rate', minTxRate: a.minTxRate ?? 0, maxTxRate: a.maxTxRate ?? 0 });
  if (a.spoofchk) out.push({ kind: 'spoofchk', on: a.spoofchk === 'on' });
  if (a.trust) out.push({ kind: 'trust', on: a.trust === 'on' });
  if (a.linkState) out.push({ kind: 'linkState', state: a.linkState });
  return out;
}

/**
 * What restores the VF: the VLAN always (ADD always sets it; sriov-cni only restores a
 * configured one), then spoofchk, admin MAC, trust, rates and link state where ADD changed them,
 * to what the PF reported before ADD.
 */
export function changesToReset(a: AppliedSettings, orig: VfConfig): VfChange[] {
  const out: VfChange[] = [{ kind: 'vlan', vlan: orig.vlan, qos: orig.qos, proto: orig.vlanProto }];
  if (a.spoofchk && orig.spoofchk !== null) out.push({ kind: 'spoofchk', on: orig.spoofchk });
  if (a.mac) out.push({ kind: 'mac', mac: orig.mac });
  if (a.trust) out.push({ kind: 'trust', on: orig.trust ?? false });
  if (a.minTxRate !== null || a.maxTxRate !== null) out.push({ kind: 'rate', minTxRate: orig.minTxRate, maxTxRate: orig.maxTxRate });
  if (a.linkState) out.push({ kind: 'linkState', state: orig.linkState ?? 'auto' });
  return out;
}

/** Without the original state (no state file): the driver defaults for what the config changes. */
export function changesToNeutral(a: AppliedSettings, vf: number): VfChange[] {
  return changesToReset(a, { vf, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: true, trust: false, linkState: 'auto', minTxRate: 0, maxTxRate: 0 });
}

export async function resetVf(ctl: PfVfControl, pf: string, vf: number, changes: readonly VfChange[]): Promise<void> {
  try {
    await ctl.apply(pf, vf, changes, { keepGoing: true });
  } catch (e) {
    if (e instanceof VfChangeError) throw internalError(`error reseting VF: ${JSON.stringify(e.message)}`);
    throw e;
  }
}

/** Waits until the PF reports the admin MAC just set (some drivers apply it asynchronously). */
export async function waitAdminMac(ctl: PfVfControl, pf: string, vf: number, mac: string): Promise<void> {
  let seen = '';
  for (let i = 0; i < MAC_ATTEMPTS; i++) {
    const cfg = await ctl.read(pf, vf);
    seen = cfg?.mac ?? '';
    if (seen === mac) return;
    await delay(MAC_RETRY_MS);
  }
  throw internalError(`SRIOV-CNI failed to configure VF "failed to set MAC address to ${mac}: the PF still reports ${seen || 'nothing'}"`);
}

/** What differs between the PF's report and one configured change, or null. */
export function mismatch(cfg: VfConfig, c: VfChange): string | null {
  switch (c.kind) {
    case 'vlan':
      if (cfg.vlan !== c.vlan || cfg.qos !== c.qos || cfg.vlanProto !== c.proto) {
        return `vlan ${cfg.vlan} qos ${cfg.qos} proto ${cfg.vlanProto}, expected vlan ${c.vlan} qos ${c.qos} proto ${c.proto}`;
      }
      return null;
    case 'mac':
      return cfg.mac === c.mac ? null : `MAC ${cfg.mac}, expected ${c.mac}`;
    case 'rate':
      return cfg.minTxRate === c.minTxRate && cfg.maxTxRate === c.maxTxRate ? null : `rates ${cfg.minTxRate}/${cfg.maxTxRate} Mbps, expected ${c.minTxRate}/${c.maxTxRate}`;
    case 'spoofchk':
      return cfg.spoofchk === null || cfg.spoofchk === c.on ? null : `spoofchk ${cfg.spoofchk ? 'on' : 'off'}, expected ${c.on ? 'on' : 'off'}`;
    case 'trust':
      return cfg.trust === null || cfg.trust === c.on ? null : `trust ${cfg.trust ? 'on' : 'off'}, expected ${c.on ? 'on' : 'off'}`;
    case 'linkState':
      return cfg.linkState === null || cfg.linkState === c.state ? null : `link state ${cfg.linkState}, expected ${c.state}`;
  }
}
