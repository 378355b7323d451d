// Label selectors (metav1.LabelSelector) as a list of requirements: matchLabels {k: v} is the
// requirement "k In (v)", so evaluation and indexing have one shape. An empty selector selects
// everything.
import { checkOrFail, type Fields, labelKeyProblem, quote } from './fields.js';

export type Labels = ReadonlyMap<string, string>;

export type Requirement =
  | { readonly key: string; readonly op: 'In' | 'NotIn'; readonly values: ReadonlySet<string> }
  | { readonly key: string; readonly op: 'Exists' | 'DoesNotExist' };

export interface LabelSelector {
  /** Sorted (key, op, values), so `canonical` compares selectors by meaning. */
  readonly requirements: readonly Requirement[];
  readonly canonical: string;
}

export const SELECT_ALL: LabelSelector = { requirements: [], canonical: '[]' };

// The API server keeps old objects whose selector values predate value validation
// (AllowInvalidLabelValueInSelector); such a value simply never equals a pod's valid label.
// A bound on their length keeps a hostile object small.
const MAX_SELECTOR_VALUE = 1024;

export function parseSelector(raw: unknown, f: Fields, path: string): LabelSelector {
  const rec = f.optRecord(raw, path);
  if (!rec) return SELECT_ALL;
  const reqs: Requirement[] = [];
  for (const [key, value] of f.labels(rec['matchLabels'], `${path}.matchLabels`)) {
    reqs.push({ key, op: 'In', values: new Set([value]) });
  }
  f.array(rec['matchExpressions'], `${path}.matchExpressions`).forEach((e, i) => {
    const p = `${path}.matchExpressions[${i}]`;
    const er = f.record(e, p);
    const key = f.string(er['key'], `${p}.key`);
    checkOrFail(f, `${p}.key`, labelKeyProblem(key));
    const op = f.string(er['operator'], `${p}.operator`);
    const values = f.array(er['values'], `${p}.values`).map((v, j) => {
      const s = f.string(v, `${p}.values[${j}]`);
      if (s.length > MAX_SELECTOR_VALUE) f.fail(`${p}.values[${j}]`, `must be no more than ${MAX_SELECTOR_VALUE} characters`);
      return s;
    });
    switch (op) {
      case 'In':
      case 'NotIn':
        if (values.length === 0) f.fail(`${p}.values`, "must be specified when `operator` is 'In' or 'NotIn'");
        reqs.push({ key, op, values: new Set(values) });
        break;
      case 'Exists':
      case 'DoesNotExist':
        if (values.length > 0) f.fail(`${p}.values`, "may not be specified when `operator` is 'Exists' or 'DoesNotExist'");
        reqs.push({ key, op });
        break;
      default:
        f.fail(`${p}.operator`, `${quote(op)} is not a valid selector operator (In, NotIn, Exists, DoesNotExist)`);
    }
  });
  return makeSelector(reqs);
}

export function makeSelector(reqs: readonly Requirement[]): LabelSelector {
  const keyed = reqs.map((r) => ({ r, text: JSON.stringify([r.key, r.op, 'values' in r ? [...r.values].sort() : []]) }));
  keyed.sort((a, b) => (a.text < b.text ? -1 : a.text > b.text ? 1 : 0));
  return { requirements: keyed.map((k) => k.r), canonical: `[${keyed.map((k) => k.text).join(',')}]` };
}

export function selectsAll(sel: LabelSelector): boolean {
  return sel.requirements.length === 0;
}

export function matches(sel: LabelSelector, labels: Labels): boolean {
  for (const r of sel.requirements) {
    const v = labels.get(r.key);
    switch (r.op) {
      case 'In':
        if (v === undefined || !r.values.has(v)) return false;
        break;
      case 'NotIn':
        if (v !== undefined && r.values.has(v)) return false;
        break;
      case 'Exists':
        if (v === undefined) return false;
        break;
      case 'DoesNotExist':
        if (v !== undefined) return false;
        break;
    }
  }
  return true;
}

/**
 * The "In" requirements, which an index of (key, value) → objects can answer: every match has
 * one of `values` under `key`. The caller picks the one with the fewest candidates.
 */
export function indexableRequirements(sel: LabelSelector): Array<{ key: string; values: ReadonlySet<string> }> {
  const out: Array<{ key: string; values: ReadonlySet<string> }> = [];
  for (const r of sel.requirements) if (r.op === 'In') out.push({ key: r.key, values: r.values });
  return out;
}
