// Link (interface) names: what the kernel accepts (dev_valid_name) and `ip -batch` can carry
// unquoted, so a name from a config or a runtime is checked before it goes into a batch line.

/** Interface names the kernel accepts and `ip -batch` can carry unquoted. */
const IFNAME_RE = /^[^\s/:"'#\\]{1,15}$/;

export function isValidLinkName(name: string): boolean {
  return IFNAME_RE.test(name) && name !== '.' && name !== '..' && Buffer.byteLength(name) <= 15;
}
