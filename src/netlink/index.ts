// Public API of weft's netlink layer.
export {
  MAIN_TABLE,
  NetlinkError,
  NUD,
  WEFT_ROUTE_PROTOCOL,
  type AddrEntry,
  type ApplyResult,
  type FdbEntry,
  type LinkEvent,
  type LinkInfo,
  type Mac,
  type NeighEntry,
  type NetlinkOp,
  type NexthopEntry,
  type NexthopReplace,
  type RouteDelete,
  type RouteEntry,
  type RouteReplace,
  type VxlanAttrs,
  type VxlanSpec,
  type Watch,
} from './types.js';
export { InvalidMacError, isValidMac, parseMac } from '../util/mac.js';
export { describeOp } from './ops.js';
export {
  DEFAULT_MAX_IN_FLIGHT,
  DEFAULT_PACK_SIZE,
  DEFAULT_REQUEST_TIMEOUT_MS,
  SOCKET_BUFFER_BYTES,
  type NetlinkOptions,
} from './connection.js';
export { isValidIfName } from './links.js';
export { type NexthopFilter, type RouteFilter } from './addresses-routes.js';
export { Netlink } from './netlink.js';
