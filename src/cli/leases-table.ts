// The rows and text table of `weft leases`.
import { terminalText } from '../render/terminal.js';
import type { Lease } from '../subnet/lease.js';
import { IPNet } from '../util/ip.js';

export interface LeaseRow {
  subnet: string;
  ipv6Subnet: string | null;
  publicIP: string;
  publicIPv6: string | null;
  backendType: string;
  vtepMAC: string | null;
  /** ISO time, or 'reserved'. */
  expires: string;
}

export function leaseRow(lease: Lease): LeaseRow {
  const data = lease.attrs.backendData;
  const mac = data && typeof data === 'object' && !Array.isArray(data) ? data.VtepMAC : undefined;
  return {
    subnet: String(lease.subnet),
    ipv6Subnet: lease.ipv6Subnet ? String(lease.ipv6Subnet) : null,
    publicIP: String(lease.attrs.publicIP),
    publicIPv6: lease.attrs.publicIPv6 ? String(lease.attrs.publicIPv6) : null,
    backendType: lease.attrs.backendType ?? '',
    vtepMAC: typeof mac === 'string' ? mac : null,
    expires: lease.reservation ? 'reserved' : lease.expiration ? lease.expiration.toISOString() : 'unknown',
  };
}

/** A plain aligned table, one lease per line, sorted by subnet; every cell escaped for the terminal (values come from the store). */
export function renderTable(rows: readonly LeaseRow[]): string {
  const header = ['SUBNET', 'IPV6 SUBNET', 'PUBLIC IP', 'BACKEND', 'VTEP MAC', 'EXPIRES'];
  const cells = rows.map((r) => [r.subnet, r.ipv6Subnet ?? '-', r.publicIP, r.backendType || '-', r.vtepMAC ?? '-', r.expires].map(terminalText));
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: string[]) => c.map((v, i) => v.padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(header), ...cells.map(line)].join('\n') + '\n';
}

/** Sorted by IPv4 subnet address. */
export function sortRows(rows: readonly LeaseRow[]): LeaseRow[] {
  const key = (r: LeaseRow) => IPNet.tryParse(r.subnet)?.first ?? -1n;
  return [...rows].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}

