import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import {
  collectGarbage,
  isDelegateConfText,
  readState,
  removeState,
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

  it('GC removes state and leftover temp files of invalid containers by name and content, ignoring anything else', async () => {
    const dataDir = join(root, 'd');
    assert.deepEqual(collectGarbage(dataDir, new Set()), { removed: [], leftAlone: [] });
    await mkdir(join(dataDir, 'subdir'), { recursive: true });
    const conf = '{"cniVersion":"1.0.0","ipam":{"type":"host-local"},"name":"cbr0","type":"bridge"}';
    for (const f of ['b2', 'a1', 'c3']) await writeFile(join(dataDir, f), conf);
    for (const f of ['.a1.tmp-12-beef', '.other', 'x~y', 'empty']) await writeFile(join(dataDir, f), '');
    await writeFile(join(dataDir, '.b2.tmp-13-cafe'), 'partial');
    assert.deepEqual(collectGarbage(dataDir, new Set(['c3'])), { removed: ['.a1.tmp-12-beef', 'a1', 'b2'], leftAlone: ['.b2.tmp-13-cafe', 'empty'] });
    assert.deepEqual((await readdir(dataDir)).sort(), ['.b2.tmp-13-cafe', '.other', 'c3', 'empty', 'subdir', 'x~y']);
    assert.equal(await readFile(join(dataDir, 'c3'), 'utf8'), conf);
    assert.equal(await readFile(join(dataDir, '.b2.tmp-13-cafe'), 'utf8'), 'partial');
  });

  it('the state shape is a delegate netconf: an object with string name, non-empty string type and an ipam object', () => {
    assert.equal(isDelegateConfText('{"name":"cbr0","type":"bridge","ipam":{"type":"host-local"}}'), true);
    assert.equal(isDelegateConfText('{"name":"","type":"weft-ovs","ipam":{}}'), true);
    for (const bad of ['', 'partial', '[]', 'null', '"x"', '{"name":"cbr0","type":"bridge"}', '{"name":"cbr0","type":"","ipam":{}}', '{"type":"bridge","ipam":{}}', '{"name":"n","type":"bridge","ipam":[]}', 'ctr1\r\neth0']) {
      assert.equal(isDelegateConfText(bad), false, bad);
    }
  });
});
