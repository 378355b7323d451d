// The OpenFlow matches of NetworkPolicy's dimensions: a rule's pods (egress: the source, coming
// from a pod port; ingress: the destination), its peers (addresses, and ipBlock intervals as
// prefixes), its ports (ranges as masked tp_dst values) and egress named ports as one
// (address, protocol, port) match each. OpenFlow has no ranges: an interval is the fewest aligned
// prefixes that cover it exactly, a port range the fewest value/mask pairs.
import { M, type Match } from '../../backend/ovs/pipeline.js';
import type { IPInterval } from '../ipblock.js';
import type { Direction, PeerPort } from '../model.js';
import type { PortRange, Protocol } from '../ports.js';

const PROTO: Record<Protocol, Match> = { TCP: { field: 'tcp' }, UDP: { field: 'udp' }, SCTP: { field: 'sctp' } };

const v4Text = (v: bigint): string => [24n, 16n, 8n, 0n].map((s) => Number((v >> s) & 0xffn)).join('.');

/** The aligned prefixes that cover [first, last] of a `bits`-bit space exactly, fewest first-to-last. */
export function rangeToPrefixes(first: bigint, last: bigint, bits: number): Array<{ value: bigint; hostBits: number }> {
  const out: Array<{ value: bigint; hostBits: number }> = [];
  let cur = first;
  while (cur <= last) {
    let host = 0;
    // Grow the block while it stays aligned at `cur` and inside the range.
    while (host < bits && (cur & ((1n << BigInt(host + 1)) - 1n)) === 0n && cur + (1n << BigInt(host + 1)) - 1n <= last) host++;
    out.push({ value: cur, hostBits: host });
    cur += 1n << BigInt(host);
  }
  return out;
}

/** An IPv4 interval as `a.b.c.d` / `a.b.c.d/len` texts; "" for the whole space (no address field at all). */
export function intervalPrefixes(iv: IPInterval): string[] {
  if (iv.family !== 4) return [];
  return rangeToPrefixes(iv.first, iv.last, 32).map(({ value, hostBits }) => (hostBits === 32 ? '' : hostBits === 0 ? v4Text(value) : `${v4Text(value)}/${32 - hostBits}`));
}

/** A port range as matches: the protocol alone for every port, else one masked tp_dst per aligned block. */
export function portMatches(r: PortRange): Match[][] {
  if (r.first === 0 && r.last === 65535) return [[PROTO[r.protocol]]];
  return rangeToPrefixes(BigInt(r.first), BigInt(r.last), 16).map(({ value, hostBits }) => [
    PROTO[r.protocol],
    hostBits === 0 ? { field: 'tp_dst', value: Number(value) } : { field: 'tp_dst', value: Number(value), mask: 0xffff ^ ((1 << hostBits) - 1) },
  ]);
}

/**
 * The pod side of a rule: egress packets from the pod's address, ingress packets to it. Egress
 * does not ask which port the packet came in from: a pod's Service traffic comes back from the
 * gateway port after the host's DNAT and is judged then (pipeline.ts, policyScaffold); the spoof
 * guard keeps other pods from sending with this address.
 */
export function podMatch(direction: Direction, ip: string): Match[] {
  return [M.ip, { field: direction === 'egress' ? 'nw_src' : 'nw_dst', value: ip }];
}

/** The peer side: an address or prefix text as podMatch's opposite end ("" is every address). */
export function peerMatch(direction: Direction, addrOrPrefix: string): Match[] {
  if (addrOrPrefix === '') return [M.ip];
  return [M.ip, { field: direction === 'egress' ? 'nw_dst' : 'nw_src', value: addrOrPrefix }];
}

/** An egress named port resolved on one destination pod: (address, protocol, port) in one match. */
export function peerPortMatch(pp: PeerPort): Match[] {
  return [PROTO[pp.protocol], { field: 'nw_dst', value: pp.ip }, { field: 'tp_dst', value: pp.port }];
}

/** Whether `text` is an IPv4 address (the ovs backend is IPv4 only; a dual-stack engine's IPv6 addresses are not matched here). */
export function isV4(text: string): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(text);
}
