// The names a sriov state file hands to `ip` and to paths (the PF, the VF's host and pod names,
// the VF's PCI address): a file weft or sriov-cni wrote holds interface names and a PCI address,
// so a file with anything else is foreign (StateFileError) and none of it is acted on.
import { ifNameProblem, pciAddressProblem } from '../../src/util/names.js';
import { StateFileError, type SriovState } from './state.js';

/** `s` when its names are usable; StateFileError naming the field and value otherwise. */
export function checkStateNames(path: string, s: SriovState): SriovState {
  const fields: Array<[string, string, (v: string) => string | null]> = [
    ['deviceID', s.deviceID, pciAddressProblem],
    ['Master', s.pf, ifNameProblem],
  ];
  // '' in DPDK mode and in files without it.
  if (s.orig.hostIfName !== '') fields.push(['OrigVfState.HostIFName', s.orig.hostIfName, ifNameProblem]);
  if (s.podIfName !== '') fields.push(['ContIFNames', s.podIfName, ifNameProblem]);
  for (const [field, value, problem] of fields) {
    const why = problem(value);
    if (why !== null) throw new StateFileError(path, `${field} ${JSON.stringify(value)}: ${why}`);
  }
  return s;
}
