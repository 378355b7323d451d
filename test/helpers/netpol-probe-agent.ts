// The agent of one pod of the NetworkPolicy matrix, run inside the pod's network namespace
// (`ip netns exec <pod-ns> node --import=tsx netpol-probe-agent.ts 80 81`, started by
// netpol-probe.ts). It serves TCP (accept, close) and UDP (echo) on the given ports on every
// address, prints one line `{"ready":true}` once all listen, then reads commands as JSON lines on
// stdin and answers each with one JSON line on stdout:
//   → {"id":1,"timeoutMs":1000,"probes":[{"ip":"10.13.1.3","port":80,"protocol":"TCP"},…]}
//   ← {"id":1,"results":[{"ok":true,"detail":"connected"},…]}   (in the order of the probes)
// All probes of a command run at once, each on a NEW socket bound to a source port the agent has
// not used before (the next of 10000–59999, in turn; a run uses a few thousand): conntrack sees a
// new connection. With ports picked by the kernel a UDP probe now and then reused the source port
// of an earlier, allowed probe to the same server whose conntrack entry (30 s) was still there, and
// passed as `established` what policy now denies. TCP is a connect (the kernel's first SYN
// retransmission comes after the 1 s timeout), UDP one datagram that must come back from the echo
// server (not resent: a probe passes only if the rules in place when it was sent let it through,
// so the round a matrix first matches bounds when the rules were in place). Stdin closing (the test
// process gone) ends the agent.
import { createSocket } from 'node:dgram';
import { createServer, connect } from 'node:net';
import { createInterface } from 'node:readline';

interface ProbeSpec {
  ip: string;
  port: number;
  protocol: 'TCP' | 'UDP';
}
interface Command {
  id: number;
  timeoutMs: number;
  probes: ProbeSpec[];
}
interface Result {
  ok: boolean;
  detail: string;
}

const ports = process.argv.slice(2).map(Number);

const FIRST_SOURCE_PORT = 10_000;
const LAST_SOURCE_PORT = 59_999;
let nextSourcePort = FIRST_SOURCE_PORT;
function sourcePort(): number {
  const p = nextSourcePort;
  nextSourcePort = p >= LAST_SOURCE_PORT ? FIRST_SOURCE_PORT : p + 1;
  return p;
}

function serve(port: number): Promise<void>[] {
  const tcp = createServer((s) => {
    s.on('error', () => undefined);
    s.end();
  });
  const udp = createSocket('udp4');
  udp.on('message', (msg, rinfo) => udp.send(msg, rinfo.port, rinfo.address));
  udp.on('error', (e) => {
    process.stderr.write(`udp ${port}: ${e.message}\n`);
  });
  return [
    new Promise<void>((resolve, reject) => {
      tcp.once('error', reject);
      tcp.listen(port, '0.0.0.0', () => resolve());
    }),
    new Promise<void>((resolve, reject) => {
      udp.once('error', reject);
      udp.bind(port, '0.0.0.0', () => resolve());
    }),
  ];
}

function probeTcp(p: ProbeSpec, timeoutMs: number): Promise<Result> {
  return new Promise((resolve) => {
    const started = Date.now();
    const s = connect({ host: p.ip, port: p.port, localPort: sourcePort() });
    const done = (r: Result) => {
      clearTimeout(timer);
      s.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => done({ ok: false, detail: `no answer in ${timeoutMs} ms` }), timeoutMs);
    s.once('connect', () => done({ ok: true, detail: `connected in ${Date.now() - started} ms` }));
    s.once('error', (e: NodeJS.ErrnoException) => done({ ok: false, detail: e.code ?? e.message }));
  });
}

function probeUdp(p: ProbeSpec, timeoutMs: number): Promise<Result> {
  return new Promise((resolve) => {
    const started = Date.now();
    const sock = createSocket('udp4');
    const payload = Buffer.from(`probe ${process.pid} ${started} ${Math.random()}`);
    let finished = false;
    const done = (r: Result) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      sock.close();
      resolve(r);
    };
    sock.on('message', (msg) => {
      if (msg.equals(payload)) done({ ok: true, detail: `echoed in ${Date.now() - started} ms` });
    });
    sock.on('error', (e: NodeJS.ErrnoException) => done({ ok: false, detail: e.code ?? e.message }));
    const timer = setTimeout(() => done({ ok: false, detail: `no echo in ${timeoutMs} ms` }), timeoutMs);
    // Sent only once bound: a send before would bind a port of the kernel's choosing.
    sock.bind(sourcePort(), () => {
      if (!finished) sock.send(payload, p.port, p.ip, (e) => e && done({ ok: false, detail: (e as NodeJS.ErrnoException).code ?? e.message }));
    });
  });
}

async function run(cmd: Command): Promise<void> {
  const results = await Promise.all(cmd.probes.map((p) => (p.protocol === 'TCP' ? probeTcp(p, cmd.timeoutMs) : probeUdp(p, cmd.timeoutMs))));
  process.stdout.write(`${JSON.stringify({ id: cmd.id, results })}\n`);
}

async function main(): Promise<void> {
  await Promise.all(ports.flatMap(serve));
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  const rl = createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    if (!line.trim()) return;
    let cmd: Command;
    try {
      cmd = JSON.parse(line) as Command;
    } catch {
      process.stderr.write(`not a command: ${line}\n`);
      return;
    }
    run(cmd).catch((e: Error) => process.stdout.write(`${JSON.stringify({ id: cmd.id, error: e.message })}\n`));
  });
  rl.on('close', () => process.exit(0));
}

main().catch((e: Error) => {
  process.stderr.write(`agent failed: ${e.message}\n`);
  process.exit(1);
});
