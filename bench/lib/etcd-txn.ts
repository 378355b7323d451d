// A lean etcd writer for sustained churn: one HTTP/2 connection (h2c, as gRPC clients use) and
// each transaction a gRPC unary call whose request bytes are encoded before the timing starts.
// grpc-js through etcd3 costs about a millisecond of CPU per call on this machine, so a writer at
// 1 000 changes/s would take a core away from the weftd and etcd it measures; this one needs a
// fraction of that.
import { connect, type ClientHttp2Session } from 'node:http2';

import { BenchError } from './common.js';

function varint(v: bigint | number): number[] {
  let x = BigInt(v);
  const out: number[] = [];
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x > 0n) b |= 0x80;
    out.push(b);
  } while (x > 0n);
  return out;
}

/** Field `field` of wire type 2 (length-delimited) holding `body`. */
function bytesField(field: number, body: Uint8Array): Buffer {
  return Buffer.concat([Buffer.from([(field << 3) | 2, ...varint(body.length)]), body]);
}

/** etcdserverpb.RequestOp{request_put: PutRequest{key, value, lease}}. */
export function putOp(key: string, value: string, lease: string): Buffer {
  const put = Buffer.concat([
    bytesField(1, Buffer.from(key)),
    bytesField(2, Buffer.from(value)),
    ...(BigInt(lease) !== 0n ? [Buffer.from([(3 << 3) | 0, ...varint(BigInt(lease))])] : []),
  ]);
  return bytesField(2, put);
}

/** etcdserverpb.RequestOp{request_delete_range: DeleteRangeRequest{key}}: one key. */
export function deleteOp(key: string): Buffer {
  return bytesField(3, bytesField(1, Buffer.from(key)));
}

/** A gRPC message frame of etcdserverpb.TxnRequest{success: ops} (no compares, no failure ops). */
export function txnFrame(ops: readonly Buffer[]): Buffer {
  const msg = Buffer.concat(ops.map((op) => bytesField(2, op)));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(msg.length, 1);
  return Buffer.concat([head, msg]);
}

export class RawTxnWriter {
  private readonly session: ClientHttp2Session;

  constructor(url: string) {
    this.session = connect(url);
    this.session.on('error', () => undefined); // each call reports its own failure
  }

  /** Sends one prepared TxnRequest frame; resolves when etcd answered with grpc-status 0. */
  txn(frame: Buffer): Promise<void> {
    return new Promise((resolve, reject) => {
      const req = this.session.request({
        ':method': 'POST',
        ':path': '/etcdserverpb.KV/Txn',
        'content-type': 'application/grpc',
        te: 'trailers',
      });
      let status: string | undefined;
      req.on('response', (headers) => {
        // A failure before any message comes as "trailers-only": grpc-status in the headers.
        if (headers['grpc-status'] !== undefined) status = String(headers['grpc-status']);
      });
      req.on('trailers', (trailers: Record<string, string | string[] | undefined>) => {
        status = String(trailers['grpc-status']);
        if (status !== '0') status += `: ${String(trailers['grpc-message'] ?? '')}`;
      });
      req.on('data', () => undefined);
      req.on('error', (e: Error) => reject(e));
      req.on('close', () => {
        if (status === '0') resolve();
        else reject(new BenchError(`etcd Txn failed: grpc-status ${status ?? 'missing'}`));
      });
      req.end(frame);
    });
  }

  close(): void {
    this.session.close();
  }
}
