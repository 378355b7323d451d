// Asserts that a call throws the CniError a plugin would report: exact message and spec code.
import assert from 'node:assert/strict';
import { CniError } from '../../cni-plugins/skel/types.js';

export function assertCniError(fn: () => unknown, msg: string, code = 7): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof CniError, `not a CniError: ${String(e)}`);
    assert.equal(e.message, msg);
    assert.equal(e.code, code);
    return true;
  });
}
