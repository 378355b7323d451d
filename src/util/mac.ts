// MAC addresses: text in Go's net.HardwareAddr.String() form, bytes on the wire.
/** Lower-case colon hex, e.g. "0e:00:00:00:00:01". */
export type Mac = string;

export class InvalidMacError extends Error {
  constructor(readonly input: string) {
    super(`invalid MAC address "${input}": expected six hex octets separated by ":" or "-"`);
    this.name = 'InvalidMacError';
  }
}

// Six two-digit hex octets with one separator kind throughout, like Go's net.ParseMAC for
// 48-bit addresses. Upper case is accepted (values written by others), output is lower case.
const MAC_RE = /^[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(?:\1[0-9a-fA-F]{2}){4}$/;

export function isValidMac(text: unknown): text is Mac {
  return typeof text === 'string' && MAC_RE.test(text);
}

/** Normalises to lower-case colon form; throws InvalidMacError on anything else. */
export function parseMac(text: string): Mac {
  if (!isValidMac(text)) throw new InvalidMacError(String(text));
  return text.toLowerCase().replaceAll('-', ':');
}

/**
 * A MAC a vxlan peer may be given as its VTEP: valid text, unicast and not all zeros (the kernel
 * refuses a multicast or all-zero address on a device). Lower-case colon form, or why not.
 */
export function checkUnicastMac(text: unknown): { readonly mac: Mac } | { readonly problem: string } {
  if (!isValidMac(text)) return { problem: `${JSON.stringify(text)} is not a MAC address` };
  const mac = parseMac(text);
  if ((parseInt(mac.slice(0, 2), 16) & 1) === 1) return { problem: `${text} is a multicast address` };
  if (mac === '00:00:00:00:00:00') return { problem: `${text} is all zeros` };
  return { mac };
}

export function macToBuffer(mac: Mac): Buffer {
  return Buffer.from(parseMac(mac).split(':').map((h) => parseInt(h, 16)));
}

/** Lower-case colon hex of a 6-byte hardware address; null for any other length. */
export function macFromBuffer(buf: Uint8Array | undefined): Mac | null {
  if (!buf || buf.length !== 6) return null;
  let out = '';
  for (let i = 0; i < 6; i++) {
    if (i > 0) out += ':';
    out += buf[i]!.toString(16).padStart(2, '0');
  }
  return out;
}
