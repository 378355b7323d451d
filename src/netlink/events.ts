// Kernel notifications: link events (RTMGRP_LINK) on a socket of their own.
import { rt } from 'netlink';

import { linkFromMessage, toNetlinkError } from './codec.js';
import { openSocket, type NetlinkConnection } from './connection.js';
import { NetlinkError, type LinkEvent, type LinkInfo, type Watch } from './types.js';

const RTM_NEWLINK = 16;
const RTM_DELLINK = 17;

/**
 * Link notifications (RTMGRP_LINK) on a socket of their own. 'new' covers creation and every
 * change. onError gets socket failures (after which the watch is closed: reopen it and resync)
 * and notifications that could not be decoded; without it they become process warnings.
 *
 * The callbacks run outside the library's native callback: an exception thrown inside that
 * would abort the process (C++ terminate), so one thrown by onEvent/onError is rethrown from
 * setImmediate, where it is an ordinary uncaught exception.
 */
export function watchLinks(
  conn: NetlinkConnection,
  onEvent: (ev: LinkEvent) => void,
  onError?: (err: NetlinkError) => void,
): Watch {
  if (conn.closed) throw new NetlinkError('ECANCELED', 'link watch', 'netlink handle is closed');
  const rethrow = (e: unknown): void => {
    setImmediate(() => {
      throw e;
    });
  };
  const report = (err: NetlinkError): void => {
    try {
      if (onError) onError(err);
      else process.emitWarning(err.message, 'NetlinkWarning');
    } catch (e) {
      rethrow(e);
    }
  };
  const s = openSocket(true);
  let open = true;
  const watch: Watch = {
    close: () => {
      if (!open) return;
      open = false;
      conn.watches.delete(watch);
      s.socket.close();
    },
  };
  // The parsed 'message' event drops nlmsg_type, so NEW and DEL look the same.
  s.socket.on('message', (msgs) => {
    for (const m of msgs) {
      if (!open) return;
      if (m.type !== RTM_NEWLINK && m.type !== RTM_DELLINK) continue;
      let link: LinkInfo;
      try {
        link = linkFromMessage(rt.parseLinkMessage(m.data));
      } catch (e) {
        report(toNetlinkError(e, 'link watch: decode notification'));
        continue;
      }
      try {
        onEvent({ type: m.type === RTM_NEWLINK ? 'new' : 'del', link });
      } catch (e) {
        rethrow(e);
      }
    }
  });
  s.socket.on('error', (e) => {
    watch.close();
    report(new NetlinkError(e.code || 'EIO', 'link watch', e.message));
  });
  try {
    s.addMembership('LINK');
  } catch (e) {
    s.socket.close();
    throw toNetlinkError(e, 'link watch: join RTMGRP_LINK');
  }
  conn.watches.add(watch);
  return watch;
}
