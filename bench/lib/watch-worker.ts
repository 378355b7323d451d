// A worker thread of the dataplane bench's helper: a bare etcd watch client (etcd3, its own gRPC
// connection) on the subnet prefix, stamping each event with CLOCK_MONOTONIC as it arrives. It
// does nothing else, so it shows the floor the store sets for anyone watching the leases.
import { parentPort, workerData } from 'node:worker_threads';

import { Etcd3, type Watcher } from 'etcd3';

import { mono } from './common.js';
import { EventLog, type ExpectResult } from './event-log.js';
import { serve } from './rpc.js';

export type WatchOps = {
  start: { req: { prefix: string }; res: Record<string, never> };
  stop: { req: Record<string, never>; res: Record<string, never> };
  reset: { req: Record<string, never>; res: Record<string, never> };
  expect: { req: { keys: string[]; timeoutMs: number }; res: ExpectResult };
  take: { req: Record<string, never>; res: { log: Array<[string, number[]]>; events: number } };
};

/** Log keys: p<key> for a put, d<key> for a delete. */
export const watchKey = {
  put: (k: string) => `p${k}`,
  del: (k: string) => `d${k}`,
};

function main(): void {
  const { endpoint } = workerData as { endpoint: string };
  // A channel option no other client has: a connection of its own.
  const etcd = new Etcd3({ hosts: endpoint, dialTimeout: 3000, grpcOptions: { 'weft.bench.reference-watch': 1 } });
  const log = new EventLog();
  let watcher: Watcher | null = null;
  serve<WatchOps>(
    {
      start: async ({ prefix }) => {
        await watcher?.cancel();
        log.reset();
        const w = await etcd.watch().prefix(prefix).create();
        w.on('put', (kv) => log.record(watchKey.put(kv.key.toString()), mono()));
        w.on('delete', (kv) => log.record(watchKey.del(kv.key.toString()), mono()));
        watcher = w;
        return {};
      },
      stop: async () => {
        await watcher?.cancel();
        watcher = null;
        return {};
      },
      reset: async () => {
        log.reset();
        return {};
      },
      expect: ({ keys, timeoutMs }) => log.expect(keys, timeoutMs),
      take: async () => ({ log: log.snapshot(), events: log.events }),
    },
    parentPort,
  );
}

if (parentPort) main();
