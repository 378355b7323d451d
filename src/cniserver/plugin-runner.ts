// The CNI plugin process's loop: started by weftd's CNI server (plugin-process.ts) with an IPC
// channel (entry: plugin-runner-main.ts), it runs each request it is sent with the plugins in this
// process, concurrently, and answers with what the plugin's own process would have printed. It
// exits when weftd closes the channel (or dies).
//
// An exception thrown from one request's asynchronous work fails that request only; any other
// uncaught exception ends this process (weftd fails its requests and starts a new one). A promise
// rejected with nobody waiting is logged, not fatal: the request that made it has its answer.
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { errorMessage } from '../util/errors.js';
import { enableSpawnHelper } from '../util/spawn-helper.js';
import { InProcessExecutor, type PluginRegistry } from './executor.js';
import type { FromRunner, ToRunner } from './plugin-process.js';

function send(m: FromRunner, then?: () => void): void {
  if (process.connected && process.send) process.send(m, undefined, {}, () => then?.());
  else then?.();
}

function log(level: 'info' | 'warn' | 'error', msg: string, fields: Record<string, unknown> = {}, then?: () => void): void {
  send({ t: 'log', level, msg, fields }, then);
}

/** Serves requests on this process's IPC channel with the plugins `load` gives. */
export function runPluginProcess(load: () => PluginRegistry | Promise<PluginRegistry>): void {
  process.title = 'weftd: cni plugins';
  // The plugins' programs start from weft-spawn, not by forking this process (src/util/spawn-helper.ts):
  // dist/native/weft-spawn, next to dist/src/ when built, or from the sources.
  const here = dirname(fileURLToPath(import.meta.url));
  enableSpawnHelper([resolve(here, '../../native/weft-spawn'), resolve(here, '../../dist/native/weft-spawn')]);
  const executor = new InProcessExecutor(load);
  process.on('uncaughtException', (e) => {
    const error = e instanceof Error ? (e.stack ?? e.message) : String(e);
    if (executor.claimUncaught(e)) {
      log('error', 'a CNI request failed with an uncaught exception; the request is answered with an error', { error });
      return;
    }
    // Exit once the log line is on its way (weftd fails this process's requests and starts another).
    log('error', 'CNI plugin process: uncaught exception; exiting', { error }, () => process.exit(70));
    setTimeout(() => process.exit(70), 1000).unref();
  });
  process.on('unhandledRejection', (e) => log('warn', 'CNI plugin process: a rejected promise nobody waited for', { error: errorMessage(e) }));
  process.on('disconnect', () => process.exit(0));

  process.on('message', (m: ToRunner) => {
    if (m.t === 'ping') {
      send({ t: 'pong' });
      return;
    }
    executor.run(m.plugin, m.env, m.stdin).then(
      (out) => send({ t: 'done', id: m.id, out }),
      (e: unknown) => send({ t: 'failed', id: m.id, message: errorMessage(e) }),
    );
  });

  executor.start();
  send({ t: 'ready' });
}
