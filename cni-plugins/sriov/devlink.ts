// devlink's view of a switchdev NIC's ports (`devlink -j port show`), for finding a VF
// representor the way sriovnet does before it falls back to sysfs. null when devlink is not
// installed or fails (then sysfs decides).
import { execProgram } from '../../src/util/exec.js';
import { parseDevlinkPorts, type DevlinkPort, type DevlinkPortLookup } from './sysfs.js';

export const devlinkPortLookup: DevlinkPortLookup = async (pciAddress: string): Promise<readonly DevlinkPort[] | null> => {
  try {
    const r = await execProgram('devlink', ['-j', 'port', 'show'], { timeoutMs: 5000 });
    if (r.code !== 0) return null;
    return parseDevlinkPorts(JSON.parse(r.stdout) as unknown, pciAddress);
  } catch {
    return null;
  }
};
