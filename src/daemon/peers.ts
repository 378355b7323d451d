// The daemon's view of its peers: the lease watcher (what the store holds) followed by the peer
// gate (what may be programmed). Rejections are logged once per change, counted by reason and
// kept for `weft status`.
import type { Backend } from '../backend/backend.js';
import type { NetworkConfig } from '../subnet/config.js';
import { leaseId, type Lease, type LeaseEvent } from '../subnet/lease.js';
import { PeerGate, type Rejection } from '../subnet/peer-gate.js';
import { LeaseWatcher, type WatchResult } from '../subnet/watcher.js';
import type { IPAddr } from '../util/ip.js';
import type { Logger } from '../util/log.js';
import type { DaemonMetrics } from './metrics.js';

export interface PeersOptions {
  readonly config: NetworkConfig;
  readonly backend: Pick<Backend, 'peerProblem'>;
  readonly ownLease: () => Lease | null;
  readonly localAddresses: () => readonly IPAddr[];
  readonly logger: Logger;
  readonly metrics: DaemonMetrics;
}

export class Peers {
  private readonly watcher: LeaseWatcher;
  private readonly gate: PeerGate;

  constructor(private readonly opts: PeersOptions) {
    const { config, backend, logger, metrics } = opts;
    this.watcher = new LeaseWatcher(opts.ownLease);
    this.gate = new PeerGate(
      {
        network: config.enableIPv4 ? config.network : null,
        subnetLen: config.subnetLen,
        ipv6Network: config.enableIPv6 ? config.ipv6Network : null,
        ipv6SubnetLen: config.ipv6SubnetLen,
        ownLease: opts.ownLease,
        localAddresses: opts.localAddresses,
        backendProblem: (l) => backend.peerProblem(l),
      },
      {
        onReject: (r) => {
          metrics.leasesRejected.inc({ reason: r.reason });
          logger.warn('rejected a peer lease; it is not programmed', { lease: leaseId(r.lease), publicIP: r.lease.attrs.publicIP.toString(), reason: r.reason, detail: r.detail });
        },
        onClear: (l) => logger.info('a rejected peer lease is no longer rejected', { lease: leaseId(l) }),
      },
    );
  }

  /** The leases the backend programs. */
  get accepted(): Lease[] {
    return this.gate.peers;
  }

  get rejections(): Rejection[] {
    return this.gate.rejections;
  }

  /** A store report in; the backend's events out (accepted leases only). */
  apply(result: WatchResult): LeaseEvent[] {
    const seen = this.watcher.apply(result);
    for (const ev of seen) this.opts.metrics.eventsReceived.inc({ type: ev.type });
    return this.settle(this.gate.apply(seen));
  }

  /** Our lease moved (or our addresses changed): the old subnet may be a peer now, and every check depends on ours. */
  recheck(): LeaseEvent[] {
    const moved = this.gate.apply(this.watcher.apply({ kind: 'events', events: [] }));
    return this.settle([...moved, ...this.gate.recheckAll()]);
  }

  private settle(events: LeaseEvent[]): LeaseEvent[] {
    this.opts.metrics.peers.set(this.gate.knownCount);
    this.opts.metrics.peersRejected.set(this.gate.rejectedCount);
    return events;
  }
}
