// Neighbours (ARP/NDP entries) and bridge forwarding (FDB) entries of one device.
import { rt } from 'netlink';

import { AF_BRIDGE, afOf, fdbFromMessage, neighFromMessage, u32ne } from './codec.js';
import type { NetlinkConnection } from './connection.js';
import type { FdbEntry, NeighEntry } from './types.js';

/** ARP (4) or NDP (6) entries of one device, in every state. */
export async function listNeighbours(conn: NetlinkConnection, ifindex: number, family: 4 | 6): Promise<NeighEntry[]> {
  const af = afOf(family);
  const msgs = await conn.dump(
    () => `neigh dump ipv${family} dev ${ifindex}`,
    rt.MessageType.GETNEIGH,
    // NDA_IFINDEX lets the kernel filter; we filter again in case it did not.
    (out) => rt.formatNeighborMessage({ kind: 'neighbor', data: { family: af }, attrs: { ifindex: u32ne(ifindex) } }, out),
    rt.parseNeighborMessage,
  );
  const out: NeighEntry[] = [];
  for (const m of msgs) {
    if (m.data.ifindex !== ifindex || m.data.family !== af) continue;
    const n = neighFromMessage(m);
    if (n) out.push(n);
  }
  return out;
}

/** Bridge forwarding entries (AF_BRIDGE) of one device; for vxlan, one entry per remote. */
export async function listFdb(conn: NetlinkConnection, ifindex: number): Promise<FdbEntry[]> {
  const msgs = await conn.dump(
    () => `fdb dump dev ${ifindex}`,
    rt.MessageType.GETNEIGH,
    (out) => rt.formatNeighborMessage({ kind: 'neighbor', data: { family: AF_BRIDGE }, attrs: {} }, out),
    rt.parseNeighborMessage,
  );
  const out: FdbEntry[] = [];
  for (const m of msgs) {
    if (m.data.ifindex !== ifindex || m.data.family !== AF_BRIDGE) continue;
    const f = fdbFromMessage(m);
    if (f) out.push(f);
  }
  return out;
}
