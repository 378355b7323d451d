// Links: read them, create a VXLAN device, change admin state, MTU and MAC, delete.
import { FlagsNew, ifla, rt } from 'netlink';

import { isValidMac, macToBuffer } from '../util/mac.js';
import { ipToBuffer, linkFromMessage, SKIP_STATS_MASK, streamToBuffer, u16be } from './codec.js';
import { invalid, type NetlinkConnection, type SocketCall } from './connection.js';
import { NetlinkError, type LinkInfo, type Mac, type VxlanSpec } from './types.js';

const { CREATE, EXCL } = FlagsNew;

import { isValidIfName } from '../util/names.js';

export { isValidIfName };

export async function listLinks(conn: NetlinkConnection): Promise<LinkInfo[]> {
  const msgs = await conn.dump(
    () => 'link dump',
    rt.MessageType.GETLINK,
    (out) => rt.formatLinkMessage({ kind: 'link', data: {}, attrs: { extMask: SKIP_STATS_MASK } }, out),
    rt.parseLinkMessage,
  );
  return msgs.map(linkFromMessage);
}

/** The link with this name, or null when there is none. */
export async function getLink(conn: NetlinkConnection, name: string): Promise<LinkInfo | null> {
  const op = `link-get ${name}`;
  if (!isValidIfName(name)) throw invalid(op, `bad interface name ${JSON.stringify(name)}`);
  return getOne(conn, op, (s, o) => s.getLink({}, { ifname: name, extMask: SKIP_STATS_MASK }, o));
}

export async function getLinkByIndex(conn: NetlinkConnection, index: number): Promise<LinkInfo | null> {
  const op = `link-get index ${index}`;
  if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
  return getOne(conn, op, (s, o) => s.getLink({ index }, { extMask: SKIP_STATS_MASK }, o));
}

async function getOne(conn: NetlinkConnection, op: string, fn: SocketCall<rt.LinkMessage[]>): Promise<LinkInfo | null> {
  try {
    const [m] = await conn.request(() => op, fn);
    return m ? linkFromMessage(m) : null;
  } catch (e) {
    if (e instanceof NetlinkError && e.errno === 'ENODEV') return null;
    throw e;
  }
}

/** Creates a VXLAN device (CREATE|EXCL: an existing name fails with EEXIST). It is left down. */
export async function createVxlan(conn: NetlinkConnection, spec: VxlanSpec): Promise<LinkInfo> {
  const op = `vxlan-create ${spec.name} id ${spec.vni} local ${String(spec.local)} dev ${spec.link} dstport ${spec.port}`;
  if (!isValidIfName(spec.name)) throw invalid(op, `bad interface name ${JSON.stringify(spec.name)}`);
  if (!Number.isInteger(spec.vni) || spec.vni < 0 || spec.vni >= 1 << 24) throw invalid(op, `VNI must be 0..16777215`);
  if (!Number.isInteger(spec.port) || spec.port < 0 || spec.port > 65535) throw invalid(op, `port must be 0..65535`);
  if (!Number.isInteger(spec.link) || spec.link <= 0) throw invalid(op, `bad underlay ifindex ${spec.link}`);
  if (spec.mtu !== undefined && (!Number.isInteger(spec.mtu) || spec.mtu < 68)) throw invalid(op, `bad MTU ${spec.mtu}`);
  if (spec.mac !== undefined && !isValidMac(spec.mac)) throw invalid(op, `bad MAC ${JSON.stringify(spec.mac)}`);

  const vx: ifla.Vxlan = { id: spec.vni, link: spec.link, learning: spec.learning ? 1 : 0 };
  if (spec.local.family === 4) vx.local = ipToBuffer(spec.local);
  else vx.local6 = ipToBuffer(spec.local);
  if (spec.port !== 0) vx.port = u16be(spec.port); // 0: the kernel's default (8472)
  if (spec.gbp) vx.gbp = true;
  const attrs: ifla.LinkAttrs = {
    ifname: spec.name,
    linkinfo: streamToBuffer(ifla.formatInfo({ kind: 'vxlan', data: streamToBuffer(ifla.formatVxlan(vx)) })),
  };
  if (spec.mtu !== undefined) attrs.mtu = spec.mtu;
  if (spec.mac !== undefined) attrs.address = macToBuffer(spec.mac);
  await conn.request(
    () => op,
    (s, o) => s.newLink({}, attrs, { ...o, flags: CREATE | EXCL }),
  );
  const link = await getLink(conn, spec.name);
  if (!link) throw new NetlinkError('ENODEV', op, 'created, but gone before it could be read back');
  return link;
}

export async function deleteLink(conn: NetlinkConnection, index: number): Promise<void> {
  const op = `link-delete index ${index}`;
  if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
  await conn.request(
    () => op,
    (s, o) => s.delLink({ index }, {}, o),
  );
}

/** What setLink() changes: fields left out stay as they are (none: nothing is sent). */
export interface LinkChange {
  up?: boolean;
  mtu?: number;
  mac?: Mac;
}

/** Changes admin state, MTU and/or MAC in one request (the kernel sets the MAC before the flags). */
export async function setLink(conn: NetlinkConnection, index: number, change: LinkChange): Promise<void> {
  const parts = [`link-set index ${index}`];
  if (change.up !== undefined) parts.push(change.up ? 'up' : 'down');
  if (change.mtu !== undefined) parts.push(`mtu ${change.mtu}`);
  if (change.mac !== undefined) parts.push(`address ${change.mac}`);
  const op = parts.join(' ');
  if (!Number.isInteger(index) || index <= 0) throw invalid(op, `bad ifindex ${index}`);
  if (change.mtu !== undefined && (!Number.isInteger(change.mtu) || change.mtu < 68)) throw invalid(op, `bad MTU ${change.mtu}`);
  if (change.mac !== undefined && !isValidMac(change.mac)) throw invalid(op, `bad MAC ${JSON.stringify(change.mac)}`);
  const data: rt.Link = { index };
  if (change.up !== undefined) {
    data.change = { up: true };
    data.flags = change.up ? { up: true } : {};
  }
  const attrs: ifla.LinkAttrs = {};
  if (change.mtu !== undefined) attrs.mtu = change.mtu;
  if (change.mac !== undefined) attrs.address = macToBuffer(change.mac);
  if (data.change === undefined && Object.keys(attrs).length === 0) return;
  await conn.request(
    () => op,
    (s, o) => s.setLink(data, attrs, o),
  );
}
