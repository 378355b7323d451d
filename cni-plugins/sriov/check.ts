// The sriov plugin's CHECK (plugin.ts's header), and the offload step's own check when it has one.
import { ipBatch } from '../lib/ipbatch.js';
import { linksOf } from '../lib/ipjson.js';
import { addrShowLine } from '../lib/lines.js';
import { NetnsHandle } from '../lib/netns.js';
import { internalError } from '../lib/rollback.js';
import type { CniRequest } from '../skel/types.js';
import { loadSriovConf } from './config.js';
import type { SriovDeps } from './deps.js';
import { podLink } from './link.js';
import { changesToApply, mismatch } from './pf-settings.js';
import { checkStateNames } from './state-names.js';
import { appliedFrom, decodeState, readStateText, stateFile } from './state.js';

export async function check(deps: SriovDeps, req: CniRequest): Promise<void> {
  const conf = loadSriovConf(req.config, req.args, req.env);
  const file = stateFile(conf.dataDir, req.containerId, req.ifname);
  const text = readStateText(file);
  if (text === null) throw internalError(`no sriov state for container ${req.containerId} interface ${req.ifname} (${file})`);
  const s = checkStateNames(file, decodeState(file, text));
  const prev = req.config.prevResult;
  if (!prev) throw internalError('Required prevResult missing');
  if (conf.ipamType !== '') await deps.ipam.check(req, conf.ipamType, req.stdin);
  const cfg = await deps.vf.read(s.pf, s.vfIndex);
  if (cfg === null) throw internalError(`VF ${s.vfIndex} of ${s.pf} not found`);
  const want = changesToApply(appliedFrom(conf));
  for (const c of want) {
    const bad = mismatch(cfg, c);
    if (bad) throw internalError(`VF ${s.vfIndex} of ${s.pf}: ${bad}`);
  }
  if (!s.dpdk) {
    const ns = NetnsHandle.openForPod(req.netns);
    try {
      const r = await podLink(ns, req.ifname);
      if (!r) throw internalError(`Interface name ${req.ifname} not found`);
      const intf = (prev.interfaces ?? []).find((i) => i.name === req.ifname && i.sandbox === req.netns);
      if (!intf) throw internalError(`prevResult has no interface ${req.ifname} in sandbox ${req.netns}`);
      if (intf.mac && intf.mac !== r.address) throw internalError(`Interface ${req.ifname} Mac ${intf.mac} doesn't match container Mac: ${r.address}`);
      const addrs = await podAddresses(ns, req.ifname);
      for (const ipc of prev.ips ?? []) {
        if (!addrs.includes(ipc.address)) throw internalError(`Failed to match addr ${ipc.address} on interface ${req.ifname}`);
      }
    } finally {
      ns.close();
    }
  }
  if (s.offload !== null && deps.offload?.check) await deps.offload.check({ req, deviceID: s.deviceID, state: s.offload });
}

async function podAddresses(ns: NetnsHandle, ifname: string): Promise<string[]> {
  const r = await ipBatch([addrShowLine(ifname)], { netns: ns, json: true });
  return (linksOf(r.docs)[0]?.addrs ?? []).map((a) => `${a.local}/${a.prefixlen}`);
}
