// Structured logging over winston. Like flannel (klog), everything goes to stderr by default.
import winston from 'winston';

export type LogFormat = 'text' | 'json';
export type LogLevel = 'error' | 'warn' | 'info' | 'debug';
export type LogFields = Record<string, unknown>;

export interface Logger {
  error(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  debug(msg: string, fields?: LogFields): void;
  /** A logger that adds `fields` to every entry (entry fields win on key clashes). */
  child(fields: LogFields): Logger;
}

export interface LoggerOptions {
  format?: LogFormat;
  level?: LogLevel;
  stream?: NodeJS.WritableStream;
  /** Clock for the `time` of each entry; tests inject a fixed one. */
  clock?: () => Date;
}

const LEVELS: Record<LogLevel, number> = { error: 0, warn: 1, info: 2, debug: 3 };
/** Keys the json format owns; a field with one of these names is written as `field.<name>`. */
const RESERVED = new Set(['time', 'level', 'msg']);
/** Where our entry travels inside winston's info object, away from winston's own keys. */
const ENTRY = 'weftEntry';

interface Entry {
  time: string;
  level: LogLevel;
  msg: string;
  fields: LogFields;
}

/** JSON.stringify replacer: bigints and Errors have no useful JSON form of their own. */
function jsonReplacer(_key: string, value: unknown): unknown {
  if (typeof value === 'bigint') return value.toString();
  if (value instanceof Error) return value.message;
  return value;
}

function safeStringify(value: unknown): string {
  try {
    return JSON.stringify(value, jsonReplacer) ?? String(value);
  } catch {
    // Circular structures: a log line must never throw.
    return '[unserializable]';
  }
}

/** True when an object carries its own textual form (IPAddr, IPNet, URL, ...). */
function hasOwnToString(value: object): boolean {
  const fn = (value as { toString?: unknown }).toString;
  return typeof fn === 'function' && fn !== Object.prototype.toString && fn !== Array.prototype.toString;
}

function textValue(value: unknown): string {
  let s: string;
  if (typeof value === 'string') s = value;
  else if (value instanceof Error) s = value.message;
  else if (value instanceof Date) s = value.toISOString();
  else if (value !== null && typeof value === 'object') {
    if (hasOwnToString(value)) s = (value as { toString(): string }).toString();
    else {
      // JSON is already delimited; quote it only when it holds whitespace (inside its strings).
      const json = safeStringify(value);
      return /\s/.test(json) ? JSON.stringify(json) : json;
    }
  } else s = String(value);
  // Quote anything that would make the key=value list ambiguous or span lines.
  return s === '' || /[\s"=\\]/.test(s) || /\p{Cc}/u.test(s) ? JSON.stringify(s) : s;
}

function renderText(e: Entry): string {
  const parts = [e.time, e.level.padEnd(5), e.msg.replace(/\r?\n/g, '\\n')];
  for (const [k, v] of Object.entries(e.fields)) {
    if (v === undefined) continue;
    parts.push(`${k}=${textValue(v)}`);
  }
  return parts.join(' ');
}

function renderJson(e: Entry): string {
  const out: LogFields = { time: e.time, level: e.level, msg: e.msg };
  for (const [k, v] of Object.entries(e.fields)) {
    out[RESERVED.has(k) ? `field.${k}` : k] = v;
  }
  return safeStringify(out);
}

class WinstonLogger implements Logger {
  constructor(
    private readonly w: winston.Logger,
    private readonly base: LogFields,
    private readonly clock: () => Date,
  ) {}

  private log(level: LogLevel, msg: string, fields?: LogFields): void {
    if (!this.w.isLevelEnabled(level)) return;
    const entry: Entry = { time: this.clock().toISOString(), level, msg, fields: { ...this.base, ...fields } };
    this.w.log({ level, message: msg, [ENTRY]: entry });
  }

  error(msg: string, fields?: LogFields): void {
    this.log('error', msg, fields);
  }
  warn(msg: string, fields?: LogFields): void {
    this.log('warn', msg, fields);
  }
  info(msg: string, fields?: LogFields): void {
    this.log('info', msg, fields);
  }
  debug(msg: string, fields?: LogFields): void {
    this.log('debug', msg, fields);
  }
  child(fields: LogFields): Logger {
    return new WinstonLogger(this.w, { ...this.base, ...fields }, this.clock);
  }
}

/** Creates a logger writing one line per entry to `stream` (stderr by default), `text` format, `info` level. */
export function createLogger(opts: LoggerOptions = {}): Logger {
  const render = (opts.format ?? 'text') === 'json' ? renderJson : renderText;
  const w = winston.createLogger({
    levels: LEVELS,
    level: opts.level ?? 'info',
    exitOnError: false,
    format: winston.format.printf((info) => render(info[ENTRY] as Entry)),
    transports: [new winston.transports.Stream({ stream: opts.stream ?? process.stderr })],
  });
  return new WinstonLogger(w, {}, opts.clock ?? (() => new Date()));
}

/**
 * Logs a message at most once per `intervalMs` per key (for retry loops: "config not found, retrying").
 * The first message after a quiet period carries `suppressed=N` when N messages were dropped meanwhile.
 */
export function rateLimited(
  logger: Logger,
  intervalMs: number,
  now: () => number = Date.now,
): (key: string, level: LogLevel, msg: string, fields?: LogFields) => void {
  const state = new Map<string, { last: number; suppressed: number }>();
  return (key, level, msg, fields) => {
    const t = now();
    const s = state.get(key);
    if (s !== undefined && t - s.last < intervalMs) {
      s.suppressed++;
      return;
    }
    const suppressed = s?.suppressed ?? 0;
    state.set(key, { last: t, suppressed: 0 });
    // Keys are meant to be a small fixed set; still, forget ones that went quiet so the map cannot grow forever.
    if (state.size > 1000) {
      for (const [k, v] of state) if (t - v.last >= intervalMs) state.delete(k);
    }
    logger[level](msg, suppressed > 0 ? { ...fields, suppressed } : fields);
  };
}
