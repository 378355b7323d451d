// Policy snapshots as plain sorted data, so deepEqual compares meaning, not insertion order.
import type { MutableSnapshot, PolicySnapshot } from '../../src/policy/model.js';

export function plainSnapshot(s: PolicySnapshot | MutableSnapshot): unknown {
  const sets = [...s.sets]
    .map(([id, c]) => [
      id,
      c.kind === 'addresses' ? ['a', [...c.elements].sort()] : c.kind === 'peerPorts' ? ['p', [...c.elements.keys()].sort()] : ['i', c.intervals.map((i) => `${i.family}:${i.first}-${i.last}`)],
    ])
    .sort((a, b) => String(a[0]).localeCompare(String(b[0])));
  const rules = [...s.rules].sort((a, b) => a[0].localeCompare(b[0]));
  const pods = [...s.pods].sort((a, b) => a[0].localeCompare(b[0]));
  return JSON.parse(JSON.stringify({ sets, rules, pods })) as unknown;
}
