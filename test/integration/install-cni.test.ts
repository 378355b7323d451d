// `weft install-cni` copies the four bundles, executable, and they answer VERSION from their new home.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cniBinDir, runCni } from '../helpers/cni.js';
import { runWeft } from '../helpers/weft-cli.js';

const weft = (args: string[]) => runWeft(null, ...args);

describe('weft install-cni', function () {
  this.timeout(120_000);
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'weft-install-cni-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('installs bridge, flannel, host-local, portmap, sriov and weft-ovs, each runnable', async () => {
    const source = await cniBinDir();
    const dest = join(dir, 'opt-cni-bin');
    const r = await weft(['install-cni', '--source', source, '--dest', dest]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split('\n'), ['bridge', 'flannel', 'host-local', 'portmap', 'sriov', 'weft-ovs'].map((n) => `installed ${join(dest, n)}`));
    for (const name of ['bridge', 'flannel', 'host-local', 'portmap', 'sriov', 'weft-ovs']) {
      assert.equal(statSync(join(dest, name)).mode & 0o777, 0o755);
      const v = await runCni({ bin: join(dest, name), command: 'VERSION' }, '');
      assert.equal(v.exitCode, 0, v.stderr);
      assert.deepEqual((v.json as { supportedVersions: string[] }).supportedVersions, ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0']);
    }
  });

  it('fails with a clear message and exit status 1 when the bundles are not built', async () => {
    const r = await weft(['install-cni', '--source', join(dir, 'nothing'), '--dest', join(dir, 'dest2')]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /lacks bridge, flannel, host-local, portmap, sriov, weft-ovs: run `npm run build` first/);
  });
});
