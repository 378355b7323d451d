// What a main plugin's ADD needs to fail cleanly: undo steps run newest first, and the original
// error kept as the cause with any clean-up failure added to its details; best-effort steps (undo,
// DEL) whose failures are collected instead of thrown.
import { errorMessage } from '../../src/util/errors.js';
import { CniError, ErrorCode } from '../skel/types.js';

/** A clean-up step: asynchronous, or synchronous (its throw counts as its failure). */
export type Step = () => Promise<unknown> | void;

/** Undo steps of an ADD, run newest first; their failures are collected, not thrown. */
export class Undo {
  private readonly steps: Array<{ what: string; run: Step }> = [];

  push(what: string, run: Step): void {
    this.steps.push({ what, run });
  }

  async run(): Promise<string[]> {
    const errors: string[] = [];
    for (const s of this.steps.reverse()) await tryStep(errors, s.what, s.run);
    return errors;
  }
}

/** Runs a best-effort step (undo, DEL): its failure goes to `errors` as "<what>: <message>", not thrown. */
export async function tryStep(errors: string[], what: string, run: Step): Promise<void> {
  try {
    await run();
  } catch (e) {
    errors.push(`${what}: ${errorMessage(e)}`);
  }
}

/** The original error (its code and message stay the cause), any clean-up failure in its details. */
export function withCleanup(e: unknown, cleanup: readonly string[]): unknown {
  if (cleanup.length === 0) return e;
  const extra = `cleanup after the failed ADD also failed: ${cleanup.join('; ')}`;
  if (e instanceof CniError) return new CniError(e.code, e.message, e.details ? `${e.details}; ${extra}` : extra);
  return new CniError(ErrorCode.Internal, errorMessage(e), extra);
}

export function internalError(msg: string): CniError {
  return new CniError(ErrorCode.Internal, msg);
}

export function netnsError(path: string, e: unknown): CniError {
  return internalError(`failed to open netns "${path}": ${errorMessage(e)}`);
}
