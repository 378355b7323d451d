// What a main plugin's ADD needs to fail cleanly: undo steps run newest first, and the original
// error kept as the cause with any clean-up failure added to its details.
import { CniError, ErrorCode } from './types.js';

/** Undo steps of an ADD, run newest first; their failures are collected, not thrown. */
export class Undo {
  private readonly steps: Array<{ what: string; run: () => Promise<unknown> }> = [];

  push(what: string, run: () => Promise<unknown>): void {
    this.steps.push({ what, run });
  }

  async run(): Promise<string[]> {
    const errors: string[] = [];
    for (const s of this.steps.reverse()) {
      try {
        await s.run();
      } catch (e) {
        errors.push(`${s.what}: ${(e as Error).message}`);
      }
    }
    return errors;
  }
}

/** The original error (its code and message stay the cause), any clean-up failure in its details. */
export function withCleanup(e: unknown, cleanup: readonly string[]): unknown {
  if (cleanup.length === 0) return e;
  const extra = `cleanup after the failed ADD also failed: ${cleanup.join('; ')}`;
  if (e instanceof CniError) return new CniError(e.code, e.message, e.details ? `${e.details}; ${extra}` : extra);
  return new CniError(ErrorCode.Internal, (e as Error).message, extra);
}

export function internalError(msg: string): CniError {
  return new CniError(ErrorCode.Internal, msg);
}

export function netnsError(path: string, e: unknown): CniError {
  return internalError(`failed to open netns "${path}": ${(e as Error).message}`);
}
