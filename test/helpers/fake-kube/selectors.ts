// labelSelector / fieldSelector query parameters, parsed like apimachinery's labels.Parse and
// fields.ParseSelector (the subset of syntax clients use).

/** A selector string the real server would reject (400 BadRequest). */
export class SelectorError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SelectorError';
  }
}

export type Matcher = (fields: ReadonlyMap<string, string>) => boolean;

/** Splits on commas outside parentheses (`a in (x,y),b` → two requirements). */
function splitTop(text: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = '';
  for (const c of text) {
    if (c === '(') depth++;
    if (c === ')') depth--;
    if (c === ',' && depth === 0) {
      out.push(cur);
      cur = '';
    } else {
      cur += c;
    }
  }
  out.push(cur);
  return out.map((s) => s.trim()).filter((s) => s !== '');
}

const KEY = String.raw`[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?`;
const VALUE = String.raw`([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?`;

function requirement(req: string): (labels: ReadonlyMap<string, string>) => boolean {
  let m = new RegExp(`^!\\s*(${KEY})$`).exec(req);
  if (m?.[1] !== undefined) {
    const k = m[1];
    return (l) => !l.has(k);
  }
  m = new RegExp(`^(${KEY})$`).exec(req);
  if (m?.[1] !== undefined) {
    const k = m[1];
    return (l) => l.has(k);
  }
  m = new RegExp(`^(${KEY})\\s*(==|=|!=)\\s*(${VALUE})$`).exec(req);
  if (m?.[1] !== undefined && m[3] !== undefined) {
    const [k, op, v] = [m[1], m[3], m[4] ?? ''];
    return op === '!=' ? (l) => l.get(k) !== v : (l) => l.get(k) === v;
  }
  m = new RegExp(`^(${KEY})\\s+(in|notin)\\s*\\(([^)]*)\\)$`).exec(req);
  if (m?.[1] !== undefined && m[3] !== undefined && m[4] !== undefined) {
    const [k, op] = [m[1], m[3]];
    const values = m[4].split(',').map((s) => s.trim());
    if (values.some((v) => !new RegExp(`^${VALUE}$`).test(v))) {
      throw new SelectorError(`unable to parse requirement: invalid label value in ${JSON.stringify(req)}`);
    }
    return op === 'in' ? (l) => values.includes(l.get(k) ?? '\0') : (l) => !values.includes(l.get(k) ?? '\0');
  }
  m = new RegExp(`^(${KEY})\\s*(<|>)\\s*(-?[0-9]+)$`).exec(req);
  if (m?.[1] !== undefined && m[3] !== undefined && m[4] !== undefined) {
    const [k, op, n] = [m[1], m[3], Number(m[4])];
    return (l) => {
      const v = l.get(k);
      if (v === undefined || !/^-?[0-9]+$/.test(v)) return false;
      return op === '<' ? Number(v) < n : Number(v) > n;
    };
  }
  throw new SelectorError(`unable to parse requirement: ${JSON.stringify(req)}`);
}

export function parseLabelSelector(text: string): Matcher {
  const reqs = splitTop(text).map(requirement);
  return (labels) => reqs.every((r) => r(labels));
}

/** Field selectors: `f=v`, `f==v`, `f!=v`, comma-separated; only `supported` field names. */
export function parseFieldSelector(text: string, supported: readonly string[]): Matcher {
  const reqs = splitTop(text).map((req) => {
    const m = /^([^=!]+?)\s*(==|=|!=)\s*(.*)$/.exec(req);
    if (m?.[1] === undefined || m[2] === undefined || m[3] === undefined) {
      throw new SelectorError(`invalid selector: '${text}'; can't understand '${req}'`);
    }
    const [f, op, v] = [m[1], m[2], m[3]];
    if (!supported.includes(f)) throw new SelectorError(`field label not supported: ${f}`);
    return op === '!=' ? (x: ReadonlyMap<string, string>) => x.get(f) !== v : (x: ReadonlyMap<string, string>) => x.get(f) === v;
  });
  return (fields) => reqs.every((r) => r(fields));
}
