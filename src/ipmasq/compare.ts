// Ordered comparison of rule lists: a chain is right when it has exactly the wanted rules, once
// each, in the wanted order. Each difference gets its own line for the log.

/** `show` turns a rule key into text for the message (identity for iptables lines). */
export function diffOrdered(
  name: string,
  expected: readonly string[],
  actual: readonly string[],
  show: (key: string) => string = (k) => k,
): string[] {
  const out: string[] = [];
  const count = new Map<string, number>();
  for (const a of actual) count.set(a, (count.get(a) ?? 0) + 1);
  for (const e of expected) {
    const c = count.get(e) ?? 0;
    if (c === 0) out.push(`${name}: missing rule: ${show(e)}`);
    else if (c > 1) out.push(`${name}: rule present ${c} times: ${show(e)}`);
  }
  const want = new Set(expected);
  for (const a of new Set(actual)) if (!want.has(a)) out.push(`${name}: unexpected rule: ${show(a)}`);
  if (out.length === 0 && actual.join('\n') !== expected.join('\n')) out.push(`${name}: rules out of order`);
  return out;
}
