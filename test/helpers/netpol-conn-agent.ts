// The agent of one pod in test/integration/netpol-ovs.test.ts, run inside the pod's network
// namespace (`ip netns exec <pod-ns> node --import=tsx netpol-conn-agent.ts 80 8080`, started by
// netpol-conn.ts). It serves TCP echo (every byte received is sent back) on the given ports, prints
// `{"ready":true}` once they listen, then reads commands as JSON lines on stdin and answers each
// with one JSON line on stdout:
//   → {"id":1,"op":"probe","ip":"10.13.1.3","port":80,"timeoutMs":500}
//       a NEW connection (a source port this agent has not used before, so conntrack sees a new
//       connection), closed again once connected: ← {"id":1,"ok":true,"detail":"connected in 1 ms"}
//   → {"id":2,"op":"open","ip":"10.13.1.3","port":8080,"timeoutMs":2000}
//       a connection that stays open: ← {"id":2,"ok":true,"detail":"…","conn":1}
//   → {"id":3,"op":"send","conn":1,"timeoutMs":2000}
//       a line through connection 1 that must come back from the echo server within the timeout
//       (TCP resends a lost segment after ~200 ms; the default timeout leaves room for several)
// Stdin closing (the test process gone) ends the agent.
import { connect, createServer, type Socket } from 'node:net';
import { createInterface } from 'node:readline';

interface Command {
  id: number;
  op: 'probe' | 'open' | 'send';
  ip?: string;
  port?: number;
  conn?: number;
  timeoutMs: number;
}
interface Answer {
  ok: boolean;
  detail: string;
  conn?: number;
}

const ports = process.argv.slice(2).map(Number);

// Source ports of new connections, in turn (as netpol-probe-agent.ts: never a recent one again).
let nextSourcePort = 20_000;
const sourcePort = (): number => (nextSourcePort = nextSourcePort >= 59_999 ? 20_000 : nextSourcePort + 1);

interface Held {
  readonly socket: Socket;
  received: string;
  closed: string | null;
}
const held = new Map<number, Held>();
let nextConn = 1;
let seq = 0;

function serve(port: number): Promise<void> {
  const server = createServer((s) => {
    s.on('error', () => undefined);
    s.pipe(s);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '0.0.0.0', () => resolve());
  });
}

/** Connects from a fresh source port; resolves with the socket, or null and why not. */
function dial(ip: string, port: number, timeoutMs: number): Promise<{ socket: Socket | null; detail: string }> {
  return new Promise((resolve) => {
    const started = Date.now();
    const s = connect({ host: ip, port, localPort: sourcePort() });
    s.on('error', () => undefined);
    const timer = setTimeout(() => {
      s.destroy();
      resolve({ socket: null, detail: `no answer in ${timeoutMs} ms` });
    }, timeoutMs);
    s.once('connect', () => {
      clearTimeout(timer);
      resolve({ socket: s, detail: `connected in ${Date.now() - started} ms` });
    });
    s.once('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      s.destroy();
      resolve({ socket: null, detail: e.code ?? e.message });
    });
  });
}

async function run(cmd: Command): Promise<Answer> {
  if (cmd.op === 'probe' || cmd.op === 'open') {
    const { socket, detail } = await dial(cmd.ip!, cmd.port!, cmd.timeoutMs);
    if (!socket) return { ok: false, detail };
    if (cmd.op === 'probe') {
      socket.destroy();
      return { ok: true, detail };
    }
    const conn = nextConn++;
    const h: Held = { socket, received: '', closed: null };
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => (h.received += d));
    socket.once('close', () => (h.closed ??= 'closed by the peer'));
    socket.once('error', (e: NodeJS.ErrnoException) => (h.closed = e.code ?? e.message));
    held.set(conn, h);
    return { ok: true, detail, conn };
  }
  const h = held.get(cmd.conn!);
  if (!h) return { ok: false, detail: `no connection ${cmd.conn}` };
  if (h.closed) return { ok: false, detail: `connection ${cmd.conn} is gone: ${h.closed}` };
  const line = `data ${process.pid} ${++seq} ${Date.now()}\n`;
  const started = Date.now();
  h.socket.write(line);
  return new Promise((resolve) => {
    const check = setInterval(() => {
      if (h.received.includes(line)) {
        clearInterval(check);
        resolve({ ok: true, detail: `echoed in ${Date.now() - started} ms` });
      } else if (h.closed) {
        clearInterval(check);
        resolve({ ok: false, detail: `connection ${cmd.conn} is gone: ${h.closed}` });
      } else if (Date.now() - started > cmd.timeoutMs) {
        clearInterval(check);
        resolve({ ok: false, detail: `no echo in ${cmd.timeoutMs} ms` });
      }
    }, 5);
  });
}

async function main(): Promise<void> {
  await Promise.all(ports.map(serve));
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  const rl = createInterface({ input: process.stdin });
  rl.on('line', (text) => {
    if (!text.trim()) return;
    let cmd: Command;
    try {
      cmd = JSON.parse(text) as Command;
    } catch {
      process.stderr.write(`not a command: ${text}\n`);
      return;
    }
    run(cmd).then(
      (a) => process.stdout.write(`${JSON.stringify({ id: cmd.id, ...a })}\n`),
      (e: Error) => process.stdout.write(`${JSON.stringify({ id: cmd.id, error: e.message })}\n`),
    );
  });
  rl.on('close', () => process.exit(0));
}

main().catch((e: Error) => {
  process.stderr.write(`agent failed: ${e.message}\n`);
  process.exit(1);
});
