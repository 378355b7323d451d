// Every backend weft ships, by the `Backend.Type` name used in the network config.
import { AllocBackend } from './alloc/alloc.js';
import { BackendRegistry } from './backend.js';

export function defaultBackends(): BackendRegistry {
  return new BackendRegistry().register('alloc', (_cfg, ctx) => new AllocBackend(ctx));
}
