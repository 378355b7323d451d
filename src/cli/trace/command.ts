// `weft trace <src-ip> <dst-ip>`: the path of one packet through this node. Exit 0 when every hop
// is fine, 1 when a hop is broken, 3 when part of the path cannot be traced (IPv6 on an ovs node),
// 2 for bad arguments or when the node cannot be read at all.
import type { EtcdConnectOptions } from '../../subnet/etcd/registry.js';
import { errorMessage } from '../../util/errors.js';
import { IPAddr } from '../../util/ip.js';
import { analyze } from './analyze.js';
import { collectFacts, type Runner } from './collect.js';
import { renderTrace } from './render.js';
import type { Packet, Proto, TraceReport } from './types.js';

export const PROTOS: readonly Proto[] = ['tcp', 'udp', 'icmp'];

export class TraceArgumentError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TraceArgumentError';
  }
}

export interface TraceArgs {
  readonly src: string;
  readonly dst: string;
  readonly proto: Proto;
  readonly dport: number | null;
  readonly output: 'text' | 'json';
  readonly subnetFile: string;
  /** null: do not ask etcd (leases then come from the daemon). */
  readonly etcd: EtcdConnectOptions | null;
  readonly etcdTimeoutMs: number;
  /** The daemon's health endpoint for /status; null: do not ask it. */
  readonly endpoint: string | null;
  readonly runner?: Runner;
}

export function parsePacket(src: string, dst: string, proto: Proto, dport: number | null): Packet {
  const s = IPAddr.tryParse(src);
  const d = IPAddr.tryParse(dst);
  if (!s) throw new TraceArgumentError(`source "${src}" is not an IP address`);
  if (!d) throw new TraceArgumentError(`destination "${dst}" is not an IP address`);
  if (s.family !== d.family) throw new TraceArgumentError(`source ${src} and destination ${dst} are of different address families`);
  if (!PROTOS.includes(proto)) throw new TraceArgumentError(`--proto ${String(proto)}: must be one of ${PROTOS.join(', ')}`);
  if (dport !== null) {
    if (proto === 'icmp') throw new TraceArgumentError('--dport needs --proto tcp or udp');
    if (!Number.isInteger(dport) || dport < 1 || dport > 65535) throw new TraceArgumentError(`--dport ${dport}: must be 1..65535`);
  }
  return { src: s, dst: d, proto, dport };
}

export function exitCodeOf(report: TraceReport): number {
  return report.verdict === 'ok' ? 0 : report.verdict === 'broken' ? 1 : 3;
}

export async function traceCommand(args: TraceArgs, out: NodeJS.WritableStream = process.stdout, err: NodeJS.WritableStream = process.stderr): Promise<number> {
  let packet: Packet;
  try {
    packet = parsePacket(args.src, args.dst, args.proto, args.dport);
  } catch (e) {
    err.write(`weft trace: ${errorMessage(e)}\n`);
    return 2;
  }
  let report: TraceReport;
  try {
    const facts = await collectFacts({
      packet,
      subnetFile: args.subnetFile,
      etcd: args.etcd,
      etcdTimeoutMs: args.etcdTimeoutMs,
      endpoint: args.endpoint,
      ...(args.runner ? { runner: args.runner } : {}),
    });
    report = analyze(facts);
  } catch (e) {
    err.write(`weft trace: cannot read this node's network state: ${errorMessage(e)}\n`);
    return 2;
  }
  out.write(args.output === 'json' ? `${JSON.stringify(report, null, 2)}\n` : renderTrace(report));
  return exitCodeOf(report);
}
