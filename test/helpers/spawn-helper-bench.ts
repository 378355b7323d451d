// The spawn helper's micro-benchmark (test/unit/spawn-helper.test.ts runs it): `true` via Node's
// spawn vs via weft-spawn, from a process of ~60 MB RSS like the CNI plugin process (fork cost
// grows with the forking process's memory). Prints one JSON line.
// Usage: node --import=tsx test/helpers/spawn-helper-bench.ts <weft-spawn>
import { execProgram, useSpawnHelper } from '../../src/util/exec.js';
import { SpawnHelper } from '../../src/util/spawn-helper.js';

const helper = new SpawnHelper(process.argv[2]!);
const TARGET = 60 * 1024 * 1024;
const ballast = Buffer.alloc(Math.max(0, TARGET - process.memoryUsage().rss)).fill(1);

async function measure(backend: SpawnHelper | undefined, n: number): Promise<Record<string, number>> {
  useSpawnHelper(backend);
  let blocked = 0; // event-loop time inside the call (Node spawn's fork happens there)
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const s = process.hrtime.bigint();
    const p = execProgram('true', []);
    blocked += Number(process.hrtime.bigint() - s);
    await p;
  }
  const seq = Number(process.hrtime.bigint() - t0) / n / 1e6;
  const c0 = process.hrtime.bigint();
  let cblocked = 0;
  const ps = [];
  for (let i = 0; i < 50; i++) {
    const s = process.hrtime.bigint();
    ps.push(execProgram('true', []));
    cblocked += Number(process.hrtime.bigint() - s);
  }
  await Promise.all(ps);
  const round = (x: number) => Math.round(x * 1000) / 1000;
  return { wallMsPerCall: round(seq), loopMsPerCall: round(blocked / n / 1e6), fiftyWallMs: round(Number(process.hrtime.bigint() - c0) / 1e6), fiftyLoopMs: round(cblocked / 1e6) };
}

await measure(helper, 20); // warm-up
await measure(undefined, 20);
const rssMb = Math.round(process.memoryUsage().rss / 1048576);
const node = await measure(undefined, 200);
const viaHelper = await measure(helper, 200);
helper.close();
console.log(JSON.stringify({ rssMb, node, helper: viaHelper, ballastMb: Math.round(ballast.length / 1048576) }));
