// weftd's CNI server without the rest of weftd, for the CNI suites' server mode
// (WEFT_TEST_CNI_VIA=server, test/helpers/cni.ts). The server runs the plugins in its own network
// namespace, so the harness starts one per "host" namespace, inside it:
//
//   ip netns exec <ns> node --import=tsx test/helpers/cni-server-standalone.ts <socket> [<ns>]
//
// with the server module in $WEFT_TEST_CNI_SERVER_MODULE (a file URL; default the source). Under
// `make test` (WEFT_TEST_BUILT=1) the harness runs this file as plain JavaScript (esbuild-stripped)
// against dist/, what ships: no tsx in the server nor in the plugin process it forks (tsx costs
// seconds per server start on a loaded 2-core machine).
//
// Always ready (no lease to wait for). It writes one JSON line per event on stdout, which the
// harness reads:
//   {"event":"serving","netns":<inode of its network namespace>}   once, when it listens
//   {"event":"request","plugin":…,"verb":…,"result":…,"containerId":…}  each request answered
//     (result "not_serving": refused, the client ran the bundle itself — e.g. a caller in
//     another network namespace)
//   {"event":"failed","reason":…}                                   could not listen (exit 2)
//   {"event":"exit","why":…}                                        before any exit of its own
// It stops (socket removed) on SIGTERM/SIGINT, when its stdin closes (the test process is gone)
// and when /run/netns/<ns> is deleted or names another namespace: a server must not outlive its
// namespace (it would keep it alive and could serve a later namespace of the same name).
import { statSync } from 'node:fs';

import type * as ServerModule from '../../src/cniserver/server.js';
import type { CniRequestResult } from '../../src/cniserver/types.js';
import type { LogFields, Logger } from '../../src/util/log.js';

const [socketPath, netnsName] = process.argv.slice(2);
if (!socketPath) {
  process.stderr.write('usage: cni-server-standalone.ts <socket> [<netns name>]\n');
  process.exit(64);
}

const emit = (o: Record<string, unknown>): void => {
  // stdout is a pipe to the harness: synchronous on Linux, so a line is out before the next step.
  process.stdout.write(`${JSON.stringify(o)}\n`);
};

/** Warnings and errors on stderr (the harness keeps them for its messages); the request log is counted. */
function logger(base: LogFields = {}): Logger {
  const line = (level: string, msg: string, fields?: LogFields) => process.stderr.write(`${level}: ${msg} ${JSON.stringify({ ...base, ...fields })}\n`);
  return {
    error: (msg, fields) => line('error', msg, fields),
    warn: (msg, fields) => line('warn', msg, fields),
    info: () => {},
    debug: (msg, fields) => {
      if (msg !== 'CNI request') return;
      emit({ event: 'request', plugin: fields?.plugin, verb: fields?.verb, result: fields?.result, containerId: fields?.containerId });
    },
    child: (fields) => logger({ ...base, ...fields }),
  };
}

const modUrl = process.env.WEFT_TEST_CNI_SERVER_MODULE || new URL('../../src/cniserver/server.ts', import.meta.url).href;
const { CniServer } = (await import(modUrl)) as typeof ServerModule;

const ownNetns = statSync('/proc/self/ns/net').ino;
const server = new CniServer({
  socketPath,
  logger: logger(),
  metrics: { recordCniRequest: (_p: string, _v: string, _r: CniRequestResult, _s: number) => {} },
  isReady: () => true,
  // The harness stops a server only when nothing is in flight; a short grace keeps stops quick.
  stopGraceMs: 2000,
});

// Plugin work runs in the server's plugin process (or, in older servers, here: claimUncaught).
process.on('uncaughtException', (e: Error) => {
  if ((server as { claimUncaught?: (err: unknown) => boolean }).claimUncaught?.(e)) return;
  process.stderr.write(`cni-server-standalone: unexpected error: ${e.stack ?? String(e)}\n`);
  emit({ event: 'exit', why: 'uncaught exception' });
  process.exit(1);
});

let stopping = false;
let watch: NodeJS.Timeout | undefined;
async function stop(why: string): Promise<void> {
  if (stopping) return;
  stopping = true;
  clearInterval(watch);
  // server.stop() bounds its own wait (stopGraceMs); this bounds everything else.
  setTimeout(() => process.exit(0), 10_000).unref();
  await server.stop();
  emit({ event: 'exit', why });
  process.exit(0);
}

const phase = await server.start();
if (phase !== 'serving') {
  emit({ event: 'failed', reason: `${phase}: ${server.state().reason ?? 'another server holds the socket'}` });
  await server.stop();
  process.exit(2);
}
emit({ event: 'serving', netns: ownNetns });

process.on('SIGTERM', () => void stop('SIGTERM'));
process.on('SIGINT', () => void stop('SIGINT'));
process.stdin.on('end', () => void stop('stdin closed')).on('error', () => void stop('stdin error'));
process.stdin.resume();
// `ip netns del` only unmounts the name: the namespace lives on while a process is in it.
if (netnsName) {
  watch = setInterval(() => {
    const st = statSync(`/run/netns/${netnsName}`, { throwIfNoEntry: false });
    if (!st || st.ino !== ownNetns) void stop(`netns ${netnsName} is gone`);
  }, 200);
}
