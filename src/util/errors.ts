// What a caught value says about itself: `catch (e)` gives `unknown`, and a library may throw a
// string or a plain object. One helper instead of `(e as Error).message` casts that print
// "undefined" for anything that is not an Error.

/** The message of an Error, or the value as text. */
export function errorMessage(e: unknown): string {
  if (e instanceof Error) return e.message;
  if (typeof e === 'string') return e;
  try {
    return JSON.stringify(e) ?? String(e);
  } catch {
    return String(e);
  }
}

/** The `code` of a Node.js system error (ENOENT, EACCES, …), or null. */
export function errnoCode(e: unknown): string | null {
  if (typeof e !== 'object' || e === null || !('code' in e)) return null;
  return typeof e.code === 'string' ? e.code : null;
}
