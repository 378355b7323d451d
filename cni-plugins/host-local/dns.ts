// resolvConf: the DNS settings of a resolv.conf file, read the way the reference's dns.go does
// (nameserver / domain / search / options; comments and short lines skipped).
import { readFileSync } from 'node:fs';
import { CniError, ErrorCode, type CniDNS } from '../skel/types.js';

export class ResolvConfError extends CniError {
  constructor(
    readonly path: string,
    reason: string,
  ) {
    // Go's *PathError text, e.g. "open /etc/x: no such file or directory".
    super(ErrorCode.Internal, `open ${path}: ${reason}`);
    this.name = 'ResolvConfError';
  }
}

const ERRNO_TEXT: Record<string, string> = {
  ENOENT: 'no such file or directory',
  EACCES: 'permission denied',
  EISDIR: 'is a directory',
  ENOTDIR: 'not a directory',
};

export function parseResolvConf(text: string): CniDNS {
  const dns: CniDNS = {};
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const fields = line.split(/\s+/);
    if (fields.length < 2) continue;
    const [key, first] = fields as [string, string];
    switch (key) {
      case 'nameserver':
        (dns.nameservers ??= []).push(first);
        break;
      case 'domain':
        dns.domain = first;
        break;
      case 'search':
        (dns.search ??= []).push(...fields.slice(1));
        break;
      case 'options':
        (dns.options ??= []).push(...fields.slice(1));
        break;
    }
  }
  return dns;
}

export function readResolvConf(path: string): CniDNS {
  let text: string;
  try {
    text = readFileSync(path, 'utf8'); // sync: node:fs/promises costs ~1.5 ms to load
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    throw new ResolvConfError(path, (err.code && ERRNO_TEXT[err.code]) ?? err.message);
  }
  return parseResolvConf(text);
}
