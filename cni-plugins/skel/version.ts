// CNI spec version strings, compared the way the reference library does (pkg/version): "X[.Y[.Z]]"
// with integer parts, an empty string meaning 0.1.0. Used for the CHECK/GC/STATUS version gates
// and the "incompatible CNI versions" error.
import { CniError, ErrorCode } from './types.js';

/** Go's `%q` of a string list, as in the reference details text: `["0.3.0" "1.0.0"]`. */
export function goQuoteList(items: readonly string[]): string {
  return `[${items.map((s) => JSON.stringify(s)).join(' ')}]`;
}

/** Parses "X.Y.Z" like the reference ParseVersion; a bad string is a decode failure (code 6). */
export function parseVersion(version: string): [number, number, number] {
  if (version === '') return [0, 1, 0];
  const parts = version.split('.');
  if (parts.length >= 4) throw new CniError(ErrorCode.DecodeFailure, `invalid version ${JSON.stringify(version)}: too many parts`);
  const names = ['major', 'minor', 'micro'] as const;
  const out: [number, number, number] = [0, 0, 0];
  parts.forEach((p, i) => {
    // strconv.Atoi: optional sign, decimal digits only.
    if (!/^[+-]?\d+$/.test(p) || !Number.isSafeInteger(Number(p))) {
      throw new CniError(
        ErrorCode.DecodeFailure,
        `failed to convert ${names[i]} version part ${JSON.stringify(p)}: strconv.Atoi: parsing ${JSON.stringify(p)}: invalid syntax`,
      );
    }
    out[i] = Number(p);
  });
  return out;
}

/** a >= b, both parsed with parseVersion (throws CniError code 6 on a malformed one). */
export function versionAtLeast(a: string, b: string): boolean {
  const [x, y] = [parseVersion(a), parseVersion(b)];
  for (let i = 0; i < 3; i++) {
    if (x[i]! !== y[i]!) return x[i]! > y[i]!;
  }
  return true;
}

/** The reference reconciler: the config version must be one of the plugin's, by exact string. */
export function checkSupported(configVersion: string, supported: readonly string[]): void {
  if (!supported.includes(configVersion)) {
    throw new CniError(
      ErrorCode.IncompatibleVersion,
      'incompatible CNI versions',
      `config is ${JSON.stringify(configVersion)}, plugin supports ${goQuoteList(supported)}`,
    );
  }
}
