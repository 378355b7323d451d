// A small client of weftd's CNI server for tests (the native client is cni-plugins/native): sends
// one frame (or any bytes) over the unix socket and reads the one reply frame, with a deadline.
import { readdirSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { encodeFrame, HEADER_BYTES, MAX_REPLY_BYTES, parseReplyBody, readFrame, type Reply } from '../../src/cniserver/frame.js';

export interface CniCall {
  readonly plugin: string;
  readonly env: Readonly<Record<string, string>>;
  readonly stdin: string;
  /** Protocol version to send; default 1. */
  readonly v?: unknown;
  /** The client's network namespace to send (`net:[inode]`); none by default. */
  readonly netns?: string;
}

/** What came back: the reply, or how the connection ended without one. */
export type RawOutcome = { readonly reply: Reply } | { readonly error: string };

/**
 * Writes `bytes`, half-closes unless `keepOpen`, and reads one reply frame. Resolves (never
 * rejects) with the reply, or with the error when the connection failed or ended without one.
 */
export function rawCall(socket: string, bytes: Buffer, opts: { timeoutMs?: number; keepOpen?: boolean } = {}): Promise<RawOutcome> {
  return new Promise((resolve) => {
    const c = createConnection(socket);
    let buf: Buffer = Buffer.alloc(0);
    let settled = false;
    const finish = (o: RawOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      c.destroy();
      resolve(o);
    };
    const timer = setTimeout(() => finish({ error: `no reply within ${opts.timeoutMs ?? 90_000} ms` }), opts.timeoutMs ?? 90_000);
    c.on('connect', () => {
      // A write the server stops reading (oversized request) may fail; the reply is still read.
      c.write(bytes, () => {
        if (!opts.keepOpen) c.end();
      });
    });
    c.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const f = readFrame(buf, MAX_REPLY_BYTES);
      if (f.kind === 'oversize') finish({ error: `reply too large: ${f.length}` });
      else if (f.kind === 'complete') {
        try {
          finish({ reply: parseReplyBody(f.body) });
        } catch (e) {
          finish({ error: (e as Error).message });
        }
      }
    });
    c.on('error', (e: NodeJS.ErrnoException) => {
      // EPIPE while writing: the server answered early; keep reading what it sent.
      if (e.code === 'EPIPE' || e.code === 'ECONNRESET') {
        if (buf.length >= HEADER_BYTES) return;
      }
      finish({ error: e.code ?? e.message });
    });
    c.on('close', () => finish({ error: `closed after ${buf.length} reply bytes` }));
  });
}

export function requestFrame(call: CniCall): Buffer {
  const netns = call.netns !== undefined ? { netns: call.netns } : {};
  return encodeFrame({ v: call.v ?? 1, plugin: call.plugin, env: call.env, stdin: call.stdin, ...netns }, Number.MAX_SAFE_INTEGER);
}

/** One request; rejects when no reply came back. */
export async function cniCall(socket: string, call: CniCall, timeoutMs?: number): Promise<Reply> {
  const o = await rawCall(socket, requestFrame(call), { timeoutMs });
  if ('error' in o) throw new Error(`CNI server ${socket}: ${o.error}`);
  return o.reply;
}

/** The CNI error a status reply carries on stdout (code 0 when none). */
export function replyError(r: Reply): { code: number; msg: string; cniVersion?: string } {
  if (!('status' in r) || r.status === 0) return { code: 0, msg: '' };
  return JSON.parse(r.stdout) as { code: number; msg: string; cniVersion?: string };
}

/** The host-local reservations in `<dataDir>/<network>` (the files named as IPv4 addresses). */
export function hostLocalReservations(dataDir: string, network: string): string[] {
  try {
    return readdirSync(join(dataDir, network)).filter((n) => /^\d+\.\d+\.\d+\.\d+$/.test(n));
  } catch {
    return [];
  }
}
