// NetworkPolicy ports: numeric ranges (port..endPort), whole protocols (no port) and named ports,
// which only mean something against a destination pod's container ports.

export type Protocol = 'TCP' | 'UDP' | 'SCTP';
export const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

export function isProtocol(s: string): s is Protocol {
  return s === 'TCP' || s === 'UDP' || s === 'SCTP';
}

/** Inclusive destination port range of one protocol; 0..65535 is "any port of this protocol". */
export interface PortRange {
  readonly protocol: Protocol;
  readonly first: number;
  readonly last: number;
}

export const ANY_PORT_FIRST = 0;
export const ANY_PORT_LAST = 65535;

/** One entry of a rule's `ports`, validated. */
export type PolicyPort =
  | { readonly kind: 'range'; readonly protocol: Protocol; readonly first: number; readonly last: number }
  | { readonly kind: 'named'; readonly protocol: Protocol; readonly name: string };

/** A container port of a pod, the target of named ports. */
export interface ContainerPort {
  readonly name: string | null;
  readonly port: number;
  readonly protocol: Protocol;
}

/** Named ports resolve by name AND protocol: {port: http, protocol: UDP} does not match a TCP "http". */
export function resolveNamed(name: string, protocol: Protocol, ports: readonly ContainerPort[]): number[] {
  const out: number[] = [];
  for (const cp of ports) if (cp.name === name && cp.protocol === protocol) out.push(cp.port);
  return out;
}

/** The numeric ranges of `ports`, plus its named ports resolved against `target`'s container ports. */
export function resolvePorts(ports: readonly PolicyPort[], target: readonly ContainerPort[] | null): PortRange[] {
  const out: PortRange[] = [];
  for (const p of ports) {
    if (p.kind === 'range') out.push({ protocol: p.protocol, first: p.first, last: p.last });
    else if (target) for (const n of resolveNamed(p.name, p.protocol, target)) out.push({ protocol: p.protocol, first: n, last: n });
  }
  return normalizePorts(out);
}

/** Sorted by protocol then port, overlapping and adjacent ranges merged: one form per meaning. */
export function normalizePorts(list: readonly PortRange[]): PortRange[] {
  const order = (p: Protocol) => PROTOCOLS.indexOf(p);
  const sorted = [...list].sort((a, b) => order(a.protocol) - order(b.protocol) || a.first - b.first || a.last - b.last);
  const out: PortRange[] = [];
  for (const r of sorted) {
    const last = out[out.length - 1];
    if (last && last.protocol === r.protocol && r.first <= last.last + 1) {
      if (r.last > last.last) out[out.length - 1] = { protocol: r.protocol, first: last.first, last: r.last };
    } else {
      out.push(r);
    }
  }
  return out;
}

export function portsContain(list: readonly PortRange[], protocol: Protocol, port: number): boolean {
  for (const r of list) if (r.protocol === protocol && port >= r.first && port <= r.last) return true;
  return false;
}
