// flannel's alloc backend: takes a lease and programs nothing, so weftd runs without root.
import { IPAddr } from '../../util/ip.js';
import type { PeerProblem } from '../../subnet/peer-gate.js';
import { CLEAN_PASS, type Backend, type BackendContext, type BackendPass, type Prepared } from '../backend.js';

export class AllocBackend implements Backend {
  readonly type = 'alloc';

  constructor(private readonly ctx: BackendContext) {}

  /** alloc programs nothing: every lease is fine. */
  peerProblem(): PeerProblem | null {
    return null;
  }

  prepare(): Promise<Prepared> {
    const { extIface, config } = this.ctx;
    return Promise.resolve({
      // flannel's alloc leases carry no BackendType.
      attrs: {
        publicIP: extIface.extAddr ?? IPAddr.parse('0.0.0.0'),
        publicIPv6: config.enableIPv6 ? extIface.extV6Addr : null,
      },
      mtu: extIface.mtu,
    });
  }

  async start(): Promise<void> {}

  apply(): Promise<BackendPass> {
    return Promise.resolve(CLEAN_PASS);
  }

  reconcile(): Promise<BackendPass> {
    return Promise.resolve(CLEAN_PASS);
  }

  async close(): Promise<void> {}
}
