// Polls a condition until it holds or a deadline passes: tests wait on state, never on fixed sleeps.
export interface WaitOptions {
  readonly timeoutMs?: number;
  readonly intervalMs?: number;
  /** What is awaited, for the timeout message. */
  readonly what?: string;
}

/** Thrown from a check to stop waiting at once (the condition can no longer come true). */
export class WaitAbort extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WaitAbort';
  }
}

export async function waitFor<T>(
  check: () => T | null | undefined | false | Promise<T | null | undefined | false>,
  opts: WaitOptions = {},
): Promise<T> {
  const deadline = Date.now() + (opts.timeoutMs ?? 10_000);
  let lastError: unknown = null;
  while (true) {
    try {
      const v = await check();
      if (v !== null && v !== undefined && v !== false) return v;
    } catch (e) {
      if (e instanceof WaitAbort) throw e;
      lastError = e;
    }
    if (Date.now() > deadline) {
      const why = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      throw new Error(`timed out waiting for ${opts.what ?? 'condition'}${why}`);
    }
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? 50));
  }
}
