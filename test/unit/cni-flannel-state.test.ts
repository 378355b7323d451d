import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import {
  listState,
  readState,
  removeState,
  removeTempFile,
  StateFileError,
  statePath,
  writeState,
} from '../../cni-plugins/flannel/state.js';

describe('flannel CNI: state files', () => {
  let root = '';
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'wt-flannel-state-'));
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('statePath is <dataDir>/<containerID> and refuses IDs that are not CNI container IDs', () => {
    assert.equal(statePath('/var/lib/cni/flannel', 'abc-1.2_x'), '/var/lib/cni/flannel/abc-1.2_x');
    for (const bad of ['', '../etc', '.hidden', 'a/b', '-x']) {
      assert.throws(() => statePath('/d', bad), { name: 'RangeError', message: `invalid container ID ${JSON.stringify(bad)}` });
    }
  });

  it('writes 0600 files in a created 0700 directory, replaces, reads back and removes', async () => {
    const dataDir = join(root, 'a', 'b');
    writeState(dataDir, 'c1', '{"type":"bridge"}');
    assert.equal((await stat(dataDir)).mode & 0o777, 0o700);
    assert.equal((await stat(join(dataDir, 'c1'))).mode & 0o777, 0o600);
    writeState(dataDir, 'c1', '{"type":"ipvlan"}');
    assert.equal(readState(dataDir, 'c1'), '{"type":"ipvlan"}');
    assert.deepEqual(await readdir(dataDir), ['c1']);
    removeState(dataDir, 'c1');
    removeState(dataDir, 'c1');
    assert.equal(readState(dataDir, 'c1'), null);
    assert.equal(readState(join(root, 'missing'), 'c1'), null);
  });

  it('a write that cannot happen is a StateFileError and leaves no temp file', async () => {
    const blocker = join(root, 'file');
    await writeFile(blocker, 'x');
    assert.throws(() => writeState(blocker, 'c1', '{}'), (e: unknown) => {
      assert.ok(e instanceof StateFileError);
      assert.equal(e.path, join(blocker, 'c1'));
      assert.equal(e.operation, 'write');
      assert.match(e.message, new RegExp(`^cannot write flannel state ${join(blocker, 'c1')}: `));
      return true;
    });
    const dataDir = join(root, 'd');
    await mkdir(join(dataDir, 'c2'), { recursive: true }); // a directory where the file should go
    assert.throws(() => writeState(dataDir, 'c2', '{}'), StateFileError);
    assert.deepEqual(await readdir(dataDir), ['c2']);
    assert.throws(() => readState(dataDir, 'c2'), { name: 'StateFileError', operation: 'read' });
  });

  it('lists container files and leftover temp files, ignoring anything else', async () => {
    const dataDir = join(root, 'd');
    assert.deepEqual(listState(dataDir), { containerIds: [], tempFiles: [] });
    await mkdir(join(dataDir, 'subdir'), { recursive: true });
    for (const f of ['b2', 'a1', '.a1.tmp-12-beef', '.other', 'x~y']) await writeFile(join(dataDir, f), '');
    assert.deepEqual(listState(dataDir), { containerIds: ['a1', 'b2'], tempFiles: ['.a1.tmp-12-beef'] });
    removeTempFile(dataDir, '.a1.tmp-12-beef');
    assert.throws(() => removeTempFile(dataDir, 'a1'), RangeError);
    assert.deepEqual((await readdir(dataDir)).sort(), ['.other', 'a1', 'b2', 'subdir', 'x~y']);
    assert.equal(await readFile(join(dataDir, 'a1'), 'utf8'), '');
  });
});
