// Every backend weft ships, by the `Backend.Type` name used in the network config.
import { AllocBackend } from './alloc/alloc.js';
import { BackendRegistry } from './backend.js';
import { HostGwBackend } from './hostgw/hostgw.js';
import { OvsBackend, parseOvsOptions } from './ovs/ovs.js';
import { parseVxlanOptions, VxlanBackend } from './vxlan/vxlan.js';

export function defaultBackends(): BackendRegistry {
  return new BackendRegistry()
    .register('alloc', (_cfg, ctx) => new AllocBackend(ctx))
    .register('host-gw', (_cfg, ctx) => new HostGwBackend(ctx))
    .register('ovs', (cfg, ctx) => new OvsBackend(parseOvsOptions(cfg.options), ctx))
    .register('vxlan', (cfg, ctx) => new VxlanBackend(parseVxlanOptions(cfg.options), ctx));
}
