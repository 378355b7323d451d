// flannel's alloc backend: takes a lease and programs nothing, so weftd runs without root.
import { IPAddr } from '../../util/ip.js';
import type { Backend, BackendContext, Prepared } from '../backend.js';

export class AllocBackend implements Backend {
  readonly type = 'alloc';

  constructor(private readonly ctx: BackendContext) {}

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

  async apply(): Promise<void> {}

  async reconcile(): Promise<void> {}

  async close(): Promise<void> {}
}
