// The offload step's part of the sriov state file (weft.offload): what detach needs to undo an
// attach, and its lenient reading (a state that lacks what detach needs reads as none).
import { isValidIfName } from '../../src/util/names.js';
import type { OffloadDatapathType } from './config.js';

/** What detach needs, saved in the sriov state file (weft.offload). */
export interface OffloadState {
  /** The representor's name before attach (what detach renames it back to). */
  readonly representor: string;
  /** The name it had on the bridge. */
  readonly hostIface: string;
  readonly bridge: string;
  readonly ovsRunDir: string;
  readonly datapathType: OffloadDatapathType;
  /** The representor's admin state and ARP before attach. */
  readonly wasUp: boolean;
  readonly arpWasOn: boolean;
  /** attach turned the VF's TX checksum offload off (netdev) and detach turns it back on. */
  readonly txChecksumOff: boolean;
}

export function encodeOffloadState(s: OffloadState): Record<string, unknown> {
  return { ...s };
}

/** The state attach saved, or null when there is none or it lacks what detach needs. */
export function decodeOffloadState(raw: Record<string, unknown> | null): OffloadState | null {
  if (raw === null) return null;
  const name = (v: unknown): string | null => (isValidIfName(v) ? v : null);
  const representor = name(raw.representor);
  const hostIface = name(raw.hostIface);
  const bridge = name(raw.bridge);
  const ovsRunDir = typeof raw.ovsRunDir === 'string' && raw.ovsRunDir.startsWith('/') ? raw.ovsRunDir : null;
  if (representor === null || hostIface === null || bridge === null || ovsRunDir === null) return null;
  return {
    representor,
    hostIface,
    bridge,
    ovsRunDir,
    datapathType: raw.datapathType === 'netdev' ? 'netdev' : 'system',
    wasUp: raw.wasUp !== false,
    arpWasOn: raw.arpWasOn !== false,
    txChecksumOff: raw.txChecksumOff === true,
  };
}
