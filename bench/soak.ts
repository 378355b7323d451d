// The soak (issue 16, item 4): 3 vxlan weft hosts + a 3-member etcd, for minutes, with everything
// at once — fake peer lease churn, CNI ADD/DEL of pods on every host through the flannel plugin, an
// etcd leader SIGKILL every minute, one weftd kill -9 + restart, entries deleted by hand — and the
// invariants checked all along (test/helpers/soak.ts lists them). Progress lines while it runs, ONE
// summary line with every figure at the end; the exit status is 1 when an invariant was violated
// (each violation listed), 130 when interrupted.
//
//   node --import tsx bench/soak.ts [--minutes 10] [--seconds N] [--seed 1616]
//
// Run as root. The machine's own network namespace is never touched; namespaces, processes and
// temp dirs are removed at the end, on failure and on SIGINT/SIGTERM (a second signal exits at
// once, the helpers' exit hooks removing what is left).
import { parseArgs } from 'node:util';
import { runSoak } from '../test/helpers/soak.js';

const { values: args } = parseArgs({
  options: {
    minutes: { type: 'string', default: '10' },
    seconds: { type: 'string' },
    seed: { type: 'string', default: '1616' },
  },
});
const seconds = args.seconds !== undefined ? Number(args.seconds) : Number(args.minutes) * 60;
if (!Number.isFinite(seconds) || seconds < 30) {
  process.stderr.write('soak: --minutes/--seconds must give 30 s or more\n');
  process.exit(2);
}

const abort = new AbortController();
let signals = 0;
const onSignal = (sig: NodeJS.Signals): void => {
  if (++signals > 1) process.exit(130);
  process.stderr.write(`soak: ${sig}: stopping and removing everything (again to exit at once)\n`);
  abort.abort();
};
process.on('SIGINT', onSignal).on('SIGTERM', onSignal);

const stamp = () => new Date().toISOString().slice(11, 19);
const r = await runSoak({
  durationMs: seconds * 1000,
  seed: Number(args.seed),
  signal: abort.signal,
  log: (l) => process.stdout.write(`${stamp()} ${l}\n`),
});
for (const v of r.violations) process.stdout.write(`VIOLATION: ${v}\n`);
process.stdout.write(`${r.summary}\n`);
process.exit(r.interrupted ? 130 : r.violations.length > 0 ? 1 : 0);
