// The native CNI client (cni-plugins/native/weft-cni.c, issue 17), as built by cni-plugins/build.ts:
// `<name>` is the client, `<name>.cjs` the Node.js bundle it falls back to.
//   - no server (WEFT_CNI_SOCKET names no socket, or a file that is not one): every plugin works
//     through the bundle, stdin included;
//   - a fake server written here (the wire protocol: 4-byte big-endian length + JSON each way):
//     the client forwards argv[0]'s name, exactly the CNI_* environment and stdin byte for byte,
//     prints the reply's stderr/stdout byte for byte and exits with its status; serving:false →
//     the bundle; no reply → an error after WEFT_CNI_TIMEOUT_MS; malformed or oversized replies →
//     error 999, never a crash and never a fallback; stdin over 1 MiB → error;
//   - delegation recognizes the client (readBundleMarker);
//   - the log shows VERSION timings: bundle, client → bundle, client → server.
// Pure file and socket operations on temp dirs (host-local inside a netns of its own).
// WEFT_TEST_CNI_BIN=<dir> tests that directory's layout instead of a fresh build (e.g. a client
// built with -fsanitize=address,undefined).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readlinkSync } from 'node:fs';
import { mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BUNDLE_SUFFIX, CLIENT_MARKER } from '../../cni-plugins/build.js';
import { readBundleMarker } from '../../cni-plugins/skel/delegate.js';
import { cniBinDir } from '../helpers/cni.js';
import { addNetns, delNetns, nsPrefix } from '../helpers/netns.js';
import type { PluginExecutor } from '../../src/cniserver/executor.js';
import { CniServer } from '../../src/cniserver/server.js';
import type { Logger } from '../../src/util/log.js';

const PLUGINS = ['bridge', 'flannel', 'host-local', 'portmap', 'sriov', 'weft-ovs'] as const;
const SUPPORTED = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'];
const MiB = 1024 * 1024;

interface Run {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: Buffer;
  readonly stderr: Buffer;
  readonly ms: number;
}

interface RunOpts {
  /** The whole environment (nothing is inherited). */
  readonly env: Record<string, string>;
  readonly stdin?: Buffer | string;
  /** argv[0] when it should differ from the file. */
  readonly argv0?: string;
  /** ip netns exec <ns> … */
  readonly ns?: string;
  readonly timeoutMs?: number;
}

/** One process; stdout/stderr as bytes. Killed (and the test failed) after timeoutMs. */
function exec(file: string, opts: RunOpts): Promise<Run> {
  const [cmd, args] = opts.ns ? ['ip', ['netns', 'exec', opts.ns, file]] : [file, []];
  const t0 = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: opts.env, stdio: ['pipe', 'pipe', 'pipe'], ...(opts.argv0 ? { argv0: opts.argv0 } : {}) });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${file} did not exit within ${opts.timeoutMs ?? 30_000} ms; stderr: ${Buffer.concat(err).toString()}`));
    }, opts.timeoutMs ?? 30_000);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err), ms: Number(process.hrtime.bigint() - t0) / 1e6 });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(opts.stdin ?? '');
  });
}

interface Seen {
  readonly body: Buffer;
  readonly request: { v: number; plugin: string; env: Record<string, string>; stdin: string; netns?: string };
}

/** A reply: a body (framed here), raw bytes, or 'hang'/'close'. */
type Answer = { readonly body: string } | { readonly raw: Buffer } | 'hang' | 'close';

/** A fake CNI server on a unix socket: records each request, answers with `answer(request)`. */
class FakeServer {
  readonly seen: Seen[] = [];
  private readonly sockets = new Set<Socket>();
  private server: Server | undefined;
  answer: (s: Seen) => Answer = () => ({ body: JSON.stringify({ v: 1, status: 0, stdout: '', stderr: '' }) });

  constructor(readonly path: string) {}

  async start(): Promise<void> {
    const server = createServer((sock) => {
      this.sockets.add(sock);
      sock.on('close', () => this.sockets.delete(sock));
      sock.on('error', () => {});
      let buf = Buffer.alloc(0);
      let done = false;
      sock.on('data', (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        if (done || buf.length < 4) return;
        const n = buf.readUInt32BE(0);
        if (buf.length < 4 + n) return;
        done = true;
        const body = buf.subarray(4, 4 + n);
        const seen: Seen = { body, request: JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body)) as Seen['request'] };
        this.seen.push(seen);
        const a = this.answer(seen);
        if (a === 'hang') return;
        if (a === 'close') {
          sock.end();
          return;
        }
        if ('raw' in a) {
          sock.end(a.raw);
          return;
        }
        const b = Buffer.from(a.body, 'utf8');
        const hdr = Buffer.alloc(4);
        hdr.writeUInt32BE(b.length);
        sock.end(Buffer.concat([hdr, b]));
      });
    });
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.path, () => resolve());
    });
  }

  async stop(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function cniErr(r: Run): { code: number; msg: string; details?: string } {
  return JSON.parse(r.stdout.toString('utf8')) as { code: number; msg: string; details?: string };
}

describe('native CNI client', function () {
  this.timeout(120_000);
  let bin: string;
  let tmp: string;
  let noSocket: string;
  const base = (extra: Record<string, string> = {}): Record<string, string> => ({
    PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    WEFT_CNI_SOCKET: noSocket,
    ...extra,
  });

  before(async () => {
    bin = process.env.WEFT_TEST_CNI_BIN || (await cniBinDir());
    tmp = await mkdtemp(join(tmpdir(), 'wt-cni-client-'));
    noSocket = join(tmp, 'no-such.sock');
  });
  after(async () => {
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  it('is laid out as <name> (the client) and <name>.cjs (the bundle), and delegation knows both', async () => {
    const files = await readdir(bin);
    for (const name of PLUGINS) {
      assert.ok(files.includes(name) && files.includes(name + BUNDLE_SUFFIX), `${name} and ${name}${BUNDLE_SUFFIX} in ${files.join(' ')}`);
      const client = readFileSync(join(bin, name));
      assert.deepEqual([...client.subarray(0, 4)], [0x7f, 0x45, 0x4c, 0x46], `${name} is an ELF executable`);
      assert.ok(client.subarray(0, 4096).includes(`${CLIENT_MARKER}\0`), `${name}: marker in the first 4 KiB`);
      assert.equal(readBundleMarker(join(bin, name)), name);
      assert.equal(readBundleMarker(join(bin, name + BUNDLE_SUFFIX)), name);
    }
  });

  describe('with no server', () => {
    it('answers VERSION for every plugin through the bundle (no socket, and a path that is not a socket)', async () => {
      const notSocket = join(tmp, 'plain-file.sock');
      await writeFile(notSocket, '');
      for (const sock of [noSocket, notSocket, '']) {
        for (const name of PLUGINS) {
          const r = await exec(join(bin, name), { env: base({ CNI_COMMAND: 'VERSION', WEFT_CNI_SOCKET: sock }) });
          assert.equal(r.code, 0, `${name} via ${sock}: ${r.stdout.toString()} ${r.stderr.toString()}`);
          assert.deepEqual((JSON.parse(r.stdout.toString()) as { supportedVersions: string[] }).supportedVersions, SUPPORTED);
        }
      }
    });

    it('prints the about text for an empty CNI_COMMAND, as the bundle does', async () => {
      const r = await exec(join(bin, 'portmap'), { env: base() });
      assert.equal(r.code, 0);
      assert.match(r.stderr.toString(), /^CNI portmap plugin \(weft .*\)\nCNI protocol versions supported: 0\.3\.0, /);
    });

    it('runs host-local ADD, CHECK and DEL in a netns with the config it read (a temp dataDir)', async () => {
      const ns = await addNetns(`${nsPrefix('ncli')}-h`);
      try {
        const dataDir = join(tmp, 'hl');
        const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'wtnc', type: 'bridge', ipam: { type: 'host-local', dataDir, subnet: '10.77.0.0/29' } });
        // The pod's netns is never opened by host-local: a path that does not exist will do.
        const env = (command: string) =>
          base({ CNI_COMMAND: command, CNI_CONTAINERID: 'ctr-ncli', CNI_NETNS: `/run/netns/${ns}-pod`, CNI_IFNAME: 'eth0', CNI_PATH: bin });
        const add = await exec(join(bin, 'host-local'), { env: env('ADD'), stdin: conf, ns });
        assert.equal(add.code, 0, add.stdout.toString() + add.stderr.toString());
        assert.equal((JSON.parse(add.stdout.toString()) as { ips: { address: string }[] }).ips[0]?.address, '10.77.0.2/29');
        assert.ok(existsSync(join(dataDir, 'wtnc', '10.77.0.2')));
        const check = await exec(join(bin, 'host-local'), { env: env('CHECK'), stdin: conf, ns });
        assert.equal(check.code, 0, check.stdout.toString());
        const del = await exec(join(bin, 'host-local'), { env: env('DEL'), stdin: conf, ns });
        assert.equal(del.code, 0, del.stdout.toString());
        assert.ok(!existsSync(join(dataDir, 'wtnc', '10.77.0.2')));
      } finally {
        await delNetns(ns);
      }
    });

    it('finds the bundle next to /proc/self/exe when argv[0] has no directory or is a symlink elsewhere', async () => {
      const r1 = await exec(join(bin, 'flannel'), { env: base({ CNI_COMMAND: 'VERSION' }), argv0: 'bridge' });
      assert.equal(r1.code, 0, r1.stdout.toString());
      const other = await mkdtemp(join(tmp, 'links-'));
      await symlink(join(bin, 'sriov'), join(other, 'sriov'));
      const r2 = await exec(join(other, 'sriov'), { env: base() });
      assert.equal(r2.code, 0, r2.stdout.toString());
      assert.match(r2.stderr.toString(), /^CNI sriov plugin/);
    });

    it('errors (code 999, exit 1) for an unknown plugin name with no bundle, and for a name that is not one', async () => {
      const other = await mkdtemp(join(tmp, 'names-'));
      await symlink(join(bin, 'bridge'), join(other, 'nosuch'));
      const r = await exec(join(other, 'nosuch'), { env: base({ CNI_COMMAND: 'VERSION' }) });
      assert.equal(r.code, 1);
      assert.equal(cniErr(r).code, 999);
      assert.match(cniErr(r).msg, /no CNI server answered at .* and the Node\.js bundle .*nosuch\.cjs was not found/);
      const bad = await exec(join(bin, 'bridge'), { env: base({ CNI_COMMAND: 'VERSION' }), argv0: 'Bad Name' });
      assert.equal(bad.code, 1);
      assert.match(cniErr(bad).msg, /cannot tell which CNI plugin/);
    });

    it('refuses stdin over 1 MiB (code 5, exit 1) and passes exactly 1 MiB to the bundle', async () => {
      const env = base({ CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c', CNI_NETNS: '/x', CNI_IFNAME: 'eth0', CNI_PATH: bin });
      const over = await exec(join(bin, 'host-local'), { env, stdin: Buffer.alloc(MiB + 1, 0x20) });
      assert.equal(over.code, 1);
      assert.equal(cniErr(over).code, 5);
      assert.match(cniErr(over).msg, /larger than 1048576 bytes/);
      // Exactly 1 MiB: a config padded with spaces reaches the bundle whole (its own error proves it parsed it).
      const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'wtbig', type: 'bridge', ipam: { type: 'host-local' } });
      const exact = await exec(join(bin, 'host-local'), { env, stdin: conf + ' '.repeat(MiB - conf.length) });
      assert.equal(exact.code, 1);
      assert.deepEqual(cniErr(exact), { code: 7, msg: 'no IP ranges specified' });
    });
  });

  describe('with a server', () => {
    let server: FakeServer;
    let sock: string;
    beforeEach(async () => {
      sock = join(tmp, `s${Date.now()}-${Math.random().toString(36).slice(2)}.sock`);
      server = new FakeServer(sock);
      await server.start();
    });
    afterEach(async () => {
      await server.stop();
    });

    // Every byte that needs care: quotes, backslashes, newlines, control characters (NUL included),
    // DEL, non-ASCII (2, 3 and 4 bytes), U+2028, and invalid UTF-8 (replaced as Node decodes it).
    const hostile = Buffer.concat([
      Buffer.from('{"cniVersion":"1.0.0","name":"a\\"b\\\\c","x":"\n\r\t\b\f/</script>&"}\n', 'utf8'),
      Buffer.from(Array.from({ length: 32 }, (_, i) => i)),
      Buffer.from([0x7f]),
      Buffer.from('é€😀\u2028\u2029ü', 'utf8'),
      Buffer.from([0xff, 0xc3, 0x28, 0xe2, 0x82, 0xf0, 0x9f, 0x98, 0xed, 0xa0, 0x80, 0xc0, 0xaf, 0x80, 0xf4, 0x90, 0x80, 0x80, 0xe0, 0x80]),
      Buffer.from('end\\', 'utf8'),
    ]);

    it('forwards argv[0]\'s name, exactly the CNI_* environment and stdin, and prints the reply byte for byte', async () => {
      const out = 'result: "q" \\ \u0000 \u0001 é 😀 \u2028 /\n';
      const err = 'warn\tline\r\n\u007f\u00ff';
      server.answer = () => ({ body: JSON.stringify({ v: 1, status: 3, stdout: out, stderr: err }) });
      const cniEnv = {
        CNI_COMMAND: 'ADD',
        CNI_CONTAINERID: 'ctr"\\1',
        CNI_NETNS: '/run/netns/x y',
        CNI_IFNAME: 'eth0',
        CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAME="p\\q"\n\u0001\u001féü😀',
        CNI_PATH: `${bin}:/usr/lib/cni`,
        CNI_EMPTY: '',
        CNI_X: 'a=b=c',
      };
      const env = { ...base({ WEFT_CNI_SOCKET: sock, NOT_CNI: 'secret', XCNI_Y: 'z', cni_lower: 'no' }), ...cniEnv };
      const r = await exec(join(bin, 'portmap'), { env, stdin: hostile });
      assert.equal(r.signal, null);
      assert.equal(r.code, 3, r.stdout.toString());
      assert.ok(r.stdout.equals(Buffer.from(out, 'utf8')), `stdout ${JSON.stringify(r.stdout.toString())}`);
      assert.ok(r.stderr.equals(Buffer.from(err, 'utf8')), `stderr ${JSON.stringify(r.stderr.toString())}`);
      assert.equal(server.seen.length, 1);
      const req = server.seen[0]!.request;
      assert.deepEqual(Object.keys(req).sort(), ['env', 'netns', 'plugin', 'stdin', 'v']);
      assert.equal(req.v, 1);
      // Its network namespace, so that a server in another one can send it back to the bundle.
      assert.equal(req.netns, readlinkSync('/proc/self/ns/net'));
      assert.equal(req.plugin, 'portmap');
      assert.deepEqual(req.env, cniEnv);
      // What the bundle would have read: the same bytes decoded as UTF-8 (invalid bytes → U+FFFD).
      assert.equal(req.stdin, hostile.toString('utf8'));
      // The frame itself is valid UTF-8 JSON (the server decodes it fatally).
      assert.doesNotThrow(() => new TextDecoder('utf-8', { fatal: true }).decode(server.seen[0]!.body));
    });

    it('forwards every plugin name; VERSION and an empty CNI_COMMAND do not read stdin', async () => {
      server.answer = (s) => ({ body: JSON.stringify({ v: 1, status: 0, stdout: `${s.request.plugin}:${s.request.stdin}`, stderr: '' }) });
      for (const name of PLUGINS) {
        const r = await exec(join(bin, name), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'VERSION' }), stdin: 'unread' });
        assert.equal(r.code, 0);
        assert.equal(r.stdout.toString(), `${name}:`);
      }
      const e = await exec(join(bin, 'bridge'), { env: base({ WEFT_CNI_SOCKET: sock }), stdin: 'unread' });
      assert.equal(e.stdout.toString(), 'bridge:');
      assert.deepEqual(server.seen.at(-1)!.request.env, {});
      const d = await exec(join(bin, 'bridge'), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'DEL' }), stdin: 'read' });
      assert.equal(d.stdout.toString(), 'bridge:read');
    });

    it('carries a config near 1 MiB to the server whole, and one that escaping makes too long to the bundle', async () => {
      server.answer = (s) => ({ body: JSON.stringify({ v: 1, status: 0, stdout: String(s.request.stdin.length), stderr: '' }) });
      const env = base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'DEL', CNI_CONTAINERID: 'c', CNI_IFNAME: 'eth0', CNI_PATH: bin });
      const big = `{"cniVersion":"1.0.0","name":"n","type":"host-local","pad":"${'x'.repeat(1000 * 1000)}"}`;
      const r = await exec(join(bin, 'host-local'), { env, stdin: big });
      assert.equal(r.code, 0);
      assert.equal(r.stdout.toString(), String(big.length));
      // 600 KB of quotes: 1.2 MB escaped, more than the server takes: the bundle gets it (and refuses it as bad JSON).
      const seen = server.seen.length;
      const quoted = await exec(join(bin, 'host-local'), { env, stdin: '"'.repeat(600_000) });
      assert.equal(server.seen.length, seen, 'not sent to the server');
      assert.equal(quoted.code, 1);
      assert.equal(cniErr(quoted).code, 6);
    });

    it('falls back to the bundle on serving:false, with the stdin it read', async () => {
      server.answer = () => ({ body: '{"v":1,"serving":false}' });
      const v = await exec(join(bin, 'flannel'), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'VERSION' }) });
      assert.equal(v.code, 0, v.stdout.toString());
      assert.deepEqual((JSON.parse(v.stdout.toString()) as { supportedVersions: string[] }).supportedVersions, SUPPORTED);
      const dataDir = join(tmp, 'hl-fallback');
      // Padded past a pipe's default 64 KiB: the whole config still reaches the bundle.
      const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'wtfb', type: 'bridge', ipam: { type: 'host-local', dataDir, subnet: '10.78.0.0/29' }, pad: 'p'.repeat(300_000) });
      const env = (command: string) => base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: command, CNI_CONTAINERID: 'ctr-fb', CNI_NETNS: '/x', CNI_IFNAME: 'eth0', CNI_PATH: bin });
      const add = await exec(join(bin, 'host-local'), { env: env('ADD'), stdin: conf });
      assert.equal(add.code, 0, add.stdout.toString());
      assert.equal((JSON.parse(add.stdout.toString()) as { ips: { address: string }[] }).ips[0]?.address, '10.78.0.2/29');
      const del = await exec(join(bin, 'host-local'), { env: env('DEL'), stdin: conf });
      assert.equal(del.code, 0, del.stdout.toString());
      assert.ok(!existsSync(join(dataDir, 'wtfb', '10.78.0.2')));
      assert.equal(server.seen.length, 3);
    });

    it('gives up on a server that never answers after WEFT_CNI_TIMEOUT_MS (error 999, no fallback)', async () => {
      server.answer = () => 'hang';
      const r = await exec(join(bin, 'host-local'), {
        env: base({ WEFT_CNI_SOCKET: sock, WEFT_CNI_TIMEOUT_MS: '400', CNI_COMMAND: 'DEL', CNI_CONTAINERID: 'c', CNI_IFNAME: 'eth0', CNI_PATH: bin }),
        stdin: '{}',
        timeoutMs: 10_000,
      });
      assert.equal(r.code, 1);
      assert.ok(r.ms >= 350 && r.ms < 8000, `took ${r.ms} ms`);
      assert.deepEqual(cniErr(r), { code: 999, msg: `weft: the CNI server at ${sock} did not answer within 400 ms` });
    });

    it('errors on a connection closed without a reply', async () => {
      server.answer = () => 'close';
      const r = await exec(join(bin, 'bridge'), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'VERSION' }) });
      assert.equal(r.code, 1);
      assert.deepEqual(cniErr(r), { code: 999, msg: `weft: the CNI server at ${sock} closed the connection without a reply` });
    });

    it('refuses malformed and oversized replies with error 999 (no crash, no fallback), and skips unknown fields', async () => {
      const frame = (n: number, body: string) => {
        const h = Buffer.alloc(4);
        h.writeUInt32BE(n);
        return Buffer.concat([h, Buffer.from(body, 'latin1')]);
      };
      const bad: ({ readonly body: string } | { readonly raw: Buffer })[] = [
        { body: 'not json' },
        { body: '' },
        { body: '[1]' },
        { body: '{"v":2,"status":0,"stdout":"","stderr":""}' },
        { body: '{"status":0}' },
        { body: '{"v":1}' },
        { body: '{"v":1,"serving":true}' },
        { body: '{"v":1,"status":256}' },
        { body: '{"v":1,"status":-1}' },
        { body: '{"v":1,"status":1.5}' },
        { body: '{"v":1,"status":"0"}' },
        { body: '{"v":1,"status":01}' },
        { body: '{"v":1,"status":0,"stdout":1}' },
        { body: '{"v":1,"status":0,"stdout":"raw\ncontrol"}' },
        { body: '{"v":1,"status":0,"stdout":"bad \\x escape"}' },
        { body: '{"v":1,"status":0,"stdout":"\\u12"}' },
        { body: '{"v":1,"status":0,"stdout":"unterminated' },
        { body: '{"v":1,"status":0,"status":0}' },
        { body: '{"v":1,"status":0} trailing' },
        { body: '{"v":1,"status":0,}' },
        { body: '{"v":1,"serving":0}' },
        { body: `{"v":1,"status":0,"deep":${'['.repeat(100)}${']'.repeat(100)}}` },
        { raw: frame(100, '{"v":1,') },
        { raw: Buffer.from([0, 0]) },
        { raw: frame(0x7fffffff, '{}') },
        { raw: frame(17 * MiB, '') },
      ];
      for (const a of bad) {
        server.answer = () => a;
        const r = await exec(join(bin, 'bridge'), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'VERSION' }) });
        const what = JSON.stringify('body' in a ? a.body.slice(0, 60) : 'raw');
        assert.equal(r.signal, null, what);
        assert.equal(r.code, 1, `${what}: ${r.stdout.toString()}`);
        const e = cniErr(r);
        assert.equal(e.code, 999, what);
        assert.equal(e.msg, 'weft: bad reply from the CNI server', `${what}: ${e.msg}`);
        assert.ok(e.details, `${what}: a reason`);
      }
      server.answer = () => ({ body: ' {"extra":{"a":[1,-2.5e3,null,true,false,"\\u00e9",{}],"b":[]},"stderr":"","v":1,"stdout":"\\ud83d\\ude00 \\ud800 \\/","status":0} ' });
      const ok = await exec(join(bin, 'bridge'), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'VERSION' }) });
      assert.equal(ok.code, 0, ok.stdout.toString());
      assert.equal(ok.stdout.toString('utf8'), '😀 \ufffd /');
    });

    it('logs VERSION timings: the bundle, the client through the bundle, the client through the server', async () => {
      server.answer = () => ({ body: JSON.stringify({ v: 1, status: 0, stdout: '{"cniVersion":"1.1.0"}', stderr: '' }) });
      const runs = { bundle: [] as number[], fallback: [] as number[], server: [] as number[] };
      for (let i = 0; i < 15; i++) {
        runs.bundle.push((await exec(join(bin, `host-local${BUNDLE_SUFFIX}`), { env: base({ CNI_COMMAND: 'VERSION' }) })).ms);
        runs.fallback.push((await exec(join(bin, 'host-local'), { env: base({ CNI_COMMAND: 'VERSION' }) })).ms);
        runs.server.push((await exec(join(bin, 'host-local'), { env: base({ WEFT_CNI_SOCKET: sock, CNI_COMMAND: 'VERSION' }) })).ms);
      }
      const f = (xs: number[]) => `${median(xs).toFixed(1)} ms`;
      console.log(
        `      VERSION (median of 15, spawn → close, from this test process): bundle ${f(runs.bundle)}, ` +
          `client → bundle (no server) ${f(runs.fallback)}, client → server ${f(runs.server)}`,
      );
    });
  });

  describe('with weftd\'s CNI server in another network namespace', () => {
    let server: CniServer;
    let served: string[] = [];
    before(async () => {
      // The server's plugin work is recorded, never done: the point is whether it is asked at all.
      const executor: PluginExecutor = {
        start: () => {},
        run: (plugin, env) => {
          served.push(`${plugin} ${env.CNI_COMMAND}`);
          return Promise.resolve({ exitCode: 0, stdout: '{"cniVersion":"1.0.0","served":true}', stderr: '' });
        },
        stop: () => Promise.resolve(),
      };
      const logger: Logger = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {}, child: () => logger };
      server = new CniServer({ socketPath: join(tmp, 'real', 'cni.sock'), logger, metrics: { recordCniRequest: () => {} }, isReady: () => true, executor });
      assert.equal(await server.start(), 'serving');
    });
    after(async () => {
      await server.stop();
    });

    it('a client in its namespace is served; one in another runs the bundle where it is', async () => {
      served = [];
      const ns = await addNetns(`${nsPrefix('ncli')}-o`);
      try {
        const dataDir = join(tmp, 'hl-other');
        const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'wtno', type: 'bridge', ipam: { type: 'host-local', dataDir, subnet: '10.78.0.0/29' } });
        const env = (command: string) =>
          base({ WEFT_CNI_SOCKET: server.socketPath, CNI_COMMAND: command, CNI_CONTAINERID: 'ctr-other', CNI_NETNS: `/run/netns/${ns}-pod`, CNI_IFNAME: 'eth0', CNI_PATH: bin });
        const here = await exec(join(bin, 'host-local'), { env: env('ADD'), stdin: conf });
        assert.equal(here.stdout.toString(), '{"cniVersion":"1.0.0","served":true}');
        assert.deepEqual(served, ['host-local ADD']);
        const there = await exec(join(bin, 'host-local'), { env: env('ADD'), stdin: conf, ns });
        assert.equal(there.code, 0, there.stdout.toString() + there.stderr.toString());
        assert.equal((JSON.parse(there.stdout.toString()) as { ips: { address: string }[] }).ips[0]?.address, '10.78.0.2/29');
        assert.ok(existsSync(join(dataDir, 'wtno', '10.78.0.2')));
        assert.deepEqual(served, ['host-local ADD'], 'the server was not asked to run it');
        assert.equal((await exec(join(bin, 'host-local'), { env: env('DEL'), stdin: conf, ns })).code, 0);
      } finally {
        await delNetns(ns);
      }
    });
  });
});
