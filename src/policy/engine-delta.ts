// Turning the engine's changes into output (model.ts): the per-event collector, a rule's sets, a
// local pod's view, and the delta of one event.
import type { DirectionPolicy, Direction, LocalPodPolicy, PeerPort, PodRuleRef, PolicyDelta, RuleInfo, SetChange, SetContent } from './model.js';
import { type PortRange, resolvePorts } from './ports.js';
import { EMPTY, mapOf, type PodState, type RuleState } from './engine-state.js';

export /** Collects one event's changes; add-then-remove of one element within the event cancels. */
class DeltaBuilder {
  readonly created = new Set<string>();
  readonly deleted = new Set<string>();
  readonly adds = new Map<string, Map<string, string | PeerPort>>();
  readonly removes = new Map<string, Map<string, string | PeerPort>>();
  readonly rulesAdded = new Map<string, RuleState>();
  readonly rulesRemoved = new Set<string>();
  readonly touched = new Set<string>();

  add(set: string, key: string, el: string | PeerPort): void {
    if (this.created.has(set)) return; // a new set is sent whole
    if (this.removes.get(set)?.delete(key)) return;
    mapOf(this.adds, set).set(key, el);
  }

  remove(set: string, key: string, el: string | PeerPort): void {
    if (this.created.has(set) || this.deleted.has(set)) return;
    if (this.adds.get(set)?.delete(key)) return;
    mapOf(this.removes, set).set(key, el);
  }
}

/** The sets of a rule with their current content. */
export function ruleSets(r: RuleState): Array<[string, SetContent]> {
  const out: Array<[string, SetContent]> = [];
  const p = r.info.peers;
  if (p !== 'any' && p.pods) out.push([p.pods, { kind: 'addresses', elements: new Set(r.addrs.keys()) }]);
  if (p !== 'any' && p.cidrs) out.push([p.cidrs, { kind: 'intervals', intervals: r.blocks }]);
  if (r.info.namedPeerPorts) out.push([r.info.namedPeerPorts, { kind: 'peerPorts', elements: new Map([...r.tuples].map(([k, v]) => [k, v.pp])) }]);
  return out;
}

/** A local pod's rule lists as the model has them. */
export function podView(ps: PodState): LocalPodPolicy {
  const policies = [...ps.selectedBy].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  const direction = (dir: Direction): DirectionPolicy => {
    const applying = policies.filter((p) => (dir === 'ingress' ? p.policy.ingress : p.policy.egress) !== null);
    if (!applying.length) return { isolated: false };
    const rules: PodRuleRef[] = [];
    for (const p of applying) {
      for (const r of p.rules) {
        if (r.direction !== dir) continue;
        if (r.rule.ports === null) {
          rules.push({ rule: r.id, ports: 'any' });
          continue;
        }
        const ports: PortRange[] = resolvePorts(r.rule.ports, dir === 'ingress' ? ps.pod.ports : null);
        if (ports.length || r.info.namedPeerPorts) rules.push({ rule: r.id, ports });
      }
    }
    return { isolated: true, rules };
  };
  return { namespace: ps.pod.namespace, name: ps.pod.name, ips: ps.ipTexts, ingress: direction('ingress'), egress: direction('egress') };
}

/** The delta of one event from what it collected; a local pod is listed only when its view changed. */
export function finishDelta(d: DeltaBuilder, podsByKey: ReadonlyMap<string, PodState>, lastViews: Map<string, string>): PolicyDelta {
  const setsCreated: Array<{ id: string; content: SetContent }> = [];
  const rulesAdded: RuleInfo[] = [];
  for (const r of d.rulesAdded.values()) {
    rulesAdded.push(r.info);
    for (const [id, content] of ruleSets(r)) if (d.created.has(id)) setsCreated.push({ id, content });
  }
  const setChanges: SetChange[] = [];
  const ids = new Set([...d.adds.keys(), ...d.removes.keys()]);
  for (const id of ids) {
    if (d.created.has(id) || d.deleted.has(id)) continue;
    const add = [...(d.adds.get(id)?.values() ?? EMPTY)];
    const remove = [...(d.removes.get(id)?.values() ?? EMPTY)];
    if (!add.length && !remove.length) continue;
    if (id.endsWith('_ports')) setChanges.push({ id, kind: 'peerPorts', add: add as PeerPort[], remove: remove as PeerPort[] });
    else setChanges.push({ id, kind: 'addresses', add: add as string[], remove: remove as string[] });
  }
  const pods: Array<{ key: string; policy: LocalPodPolicy | null }> = [];
  for (const key of d.touched) {
    const ps = podsByKey.get(key);
    if (ps?.local) {
      const view = podView(ps);
      const sig = JSON.stringify(view);
      if (lastViews.get(key) !== sig) {
        lastViews.set(key, sig);
        pods.push({ key, policy: view });
      }
    } else if (lastViews.delete(key)) {
      pods.push({ key, policy: null });
    }
  }
  return { setsCreated, setChanges, rulesAdded, pods, rulesRemoved: [...d.rulesRemoved], setsDeleted: [...d.deleted] };
}
