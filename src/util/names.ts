// Names that come from outside (configs, CNI env and prevResult, sysfs, OVSDB, the store) and end
// up as arguments of root commands or words of their batch languages: one validator per kind,
// applied where the name enters.
import { wordProblem, LINE_SPECIAL } from '../render/word.js';

/**
 * Why `name` is not a usable network interface name, or null. The kernel's dev_valid_name
 * (1..15 bytes, not "." or "..", no "/", ":" or white space, byte 0xA0 included) plus what a
 * batch language would read specially (control characters, `#`, quotes, backslash, `;`): the
 * kernel would take those, but no tool weft drives could name such a device unambiguously.
 */
export function ifNameProblem(name: string): string | null {
  if (name.length === 0) return 'empty';
  if (Buffer.byteLength(name, 'utf8') > 15) return 'longer than 15 bytes';
  if (name === '.' || name === '..') return 'reserved name';
  if (/[/:\s]/u.test(name)) return 'contains "/", ":" or whitespace';
  if (/\p{Cs}/u.test(name)) return 'contains a lone UTF-16 surrogate';
  // The kernel's isspace() also holds for byte 0xA0, a UTF-8 continuation byte of e.g. "à".
  if (Buffer.from(name, 'utf8').includes(0xa0)) return 'contains a character whose UTF-8 has byte 0xA0 (a space to the kernel)';
  // A new link's name with "%" is a template to the kernel ("net%d" becomes "net0"), never itself.
  if (name.includes('%')) return 'contains "%" (a name template to the kernel)';
  return wordProblem(name, `${LINE_SPECIAL};`);
}

export function isValidIfName(name: unknown): name is string {
  return typeof name === 'string' && ifNameProblem(name) === null;
}

/**
 * A PCI address as sysfs names devices: `0000:3b:02.1` (`domain:bus:device.function`, lower
 * case; the domain has four hex digits, more on machines with PCI domains above 0xffff, e.g. VMD).
 */
export const PCI_ADDRESS = /^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/;

/** Why `s` is not a sysfs PCI address (which also keeps it a plain path component), or null. */
export function pciAddressProblem(s: string): string | null {
  if (s === '') return 'empty';
  return PCI_ADDRESS.test(s) ? null : 'not a PCI address (domain:bus:device.function, e.g. 0000:3b:02.0)';
}

export function isPciAddress(s: unknown): s is string {
  return typeof s === 'string' && pciAddressProblem(s) === null;
}

/** PATH_MAX - 1: the longest path the kernel takes. */
const MAX_PATH_BYTES = 4095;
const CONTROL = /\p{Cc}/u;

/**
 * Why `path` is not a usable network-namespace path (CNI_NETNS), or null: absolute, no control
 * characters (the path goes into results, state files and messages), at most PATH_MAX - 1 bytes.
 */
export function netnsPathProblem(path: string): string | null {
  if (path === '') return 'empty';
  if (!path.startsWith('/')) return 'not an absolute path';
  if (CONTROL.test(path)) return 'contains a control character';
  if (Buffer.byteLength(path, 'utf8') > MAX_PATH_BYTES) return `longer than ${MAX_PATH_BYTES} bytes`;
  return null;
}

/**
 * Why `sandbox` (a result interface's `sandbox`: a netns path, or a VM sandbox's ID for
 * hypervisor runtimes) is unusable, or null: no control characters, at most PATH_MAX - 1 bytes.
 */
export function sandboxProblem(sandbox: string): string | null {
  if (CONTROL.test(sandbox)) return 'contains a control character';
  if (Buffer.byteLength(sandbox, 'utf8') > MAX_PATH_BYTES) return `longer than ${MAX_PATH_BYTES} bytes`;
  return null;
}

/** Container IDs and network names as libcni validates them (utils.ValidateContainerID / ValidateNetworkName). */
export const CNI_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;

/** Why `id` is not a container ID (CNI_CONTAINERID, an OVS port's external_ids), or null. */
export function containerIdProblem(id: string): string | null {
  if (id === '') return 'empty';
  return CNI_NAME.test(id) ? null : 'invalid characters (allowed: letters, digits, "_", "." and "-", not first)';
}

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/** Why `ns` is not a Kubernetes namespace name (a DNS-1123 label: 1..63 of [a-z0-9-]), or null. */
export function k8sNamespaceProblem(ns: string): string | null {
  if (ns === '') return 'empty';
  if (ns.length > 63) return 'longer than 63 characters';
  return DNS1123_LABEL.test(ns) ? null : 'not a DNS-1123 label (lower-case letters, digits and "-", starting and ending with a letter or digit)';
}

/** Why `name` is not a Kubernetes object name such as a pod's (a DNS-1123 subdomain: 1..253, dot-separated labels), or null. */
export function k8sObjectNameProblem(name: string): string | null {
  if (name === '') return 'empty';
  if (name.length > 253) return 'longer than 253 characters';
  return name.split('.').every((l) => DNS1123_LABEL.test(l))
    ? null
    : 'not a DNS-1123 subdomain (lower-case letters, digits, "-" and ".", each part starting and ending with a letter or digit)';
}
