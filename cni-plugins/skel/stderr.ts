// Where a plugin's diagnostics (stderr lines that are not its result) go. In a plugin process:
// the process's stderr, which the runtime logs. In weftd's CNI server many requests run in one
// process at once, so the server runs each one inside `captureStderr` and the lines written during
// it (found through AsyncLocalStorage, whatever the await chain) go back to that request's caller
// in the reply's stderr instead of weftd's own log.
import { AsyncLocalStorage } from 'node:async_hooks';

const sink = new AsyncLocalStorage<{ text: string }>();

/** Writes `text` to the current request's stderr (the process's stderr outside a capture). */
export function pluginStderr(text: string): void {
  const s = sink.getStore();
  if (s) s.text += text;
  else process.stderr.write(text);
}

/** Runs `fn` with its pluginStderr output collected; resolves with fn's value and that text. */
export async function captureStderr<T>(fn: () => Promise<T>): Promise<{ value: T; stderr: string }> {
  const s = { text: '' };
  const value = await sink.run(s, fn);
  return { value, stderr: s.text };
}
