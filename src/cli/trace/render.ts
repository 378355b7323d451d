// The text form of a trace: a header, one line per hop (status, hop, evidence), the verdict, notes.
// Each line is escaped for the terminal: hops quote leases, names and rules read from the node.
import { terminalText } from '../../render/terminal.js';
import type { HopStatus, TraceReport } from './types.js';

const LABEL: Record<HopStatus, string> = {
  ok: 'ok',
  broken: 'BROKEN',
  warning: 'warning',
  info: 'info',
  unsupported: 'UNSUPPORTED',
};

export function renderTrace(r: TraceReport): string {
  const p = r.packet;
  const what = `${p.proto}${p.dport !== null ? ` dport ${p.dport}` : ''}`;
  const node = [
    r.node.subnet ? `lease ${r.node.subnet}` : 'no lease known',
    r.node.network ? `network ${r.node.network}` : null,
    r.node.backend ? `backend ${r.node.backend}` : null,
    `leases from ${r.node.leaseSource}`,
  ].filter((x): x is string => x !== null);
  const lines = [`trace ${p.src} -> ${p.dst} ${what} on node ${r.node.publicIP ?? '(unknown public IP)'} (${node.join(', ')})`];
  for (const h of r.hops) lines.push(`  ${LABEL[h.status].padEnd(11)} ${h.kind.padEnd(10)} ${h.summary}`);
  lines.push(`result: ${r.verdict}${r.problems.length > 0 ? ` (${r.problems.length} broken hop${r.problems.length > 1 ? 's' : ''})` : ''}`);
  for (const n of r.notes) lines.push(`note: ${n}`);
  return `${lines.map(terminalText).join('\n')}\n`;
}
