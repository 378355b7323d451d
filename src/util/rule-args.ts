// Splits an iptables-save / `iptables -S` rule line into its arguments, honouring "…" with \"
// escapes (the quoting iptables-save uses for comments). Shared by the bridge plugin and `weft trace`.
export function splitRuleArgs(line: string): string[] {
  const out: string[] = [];
  let cur = '';
  let inToken = false;
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quoted) {
      if (c === '\\' && i + 1 < line.length) cur += line[++i]!;
      else if (c === '"') quoted = false;
      else cur += c;
    } else if (c === '"') {
      quoted = true;
      inToken = true;
    } else if (c === ' ' || c === '\t') {
      if (inToken) out.push(cur);
      cur = '';
      inToken = false;
    } else {
      cur += c;
      inToken = true;
    }
  }
  if (inToken) out.push(cur);
  return out;
}
