// `weft install-cni` copies, per plugin, the native client `<name>` and the Node.js bundle
// `<name>.cjs` it falls back to, executable, and each answers VERSION from its new home (through
// the fallback: WEFT_CNI_SOCKET names no socket); a source built without the client installs its
// bundles under the plain names; a source missing files is refused with a clear message.
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildCniBundlesReport, findPluginEntries } from '../../cni-plugins/build.js';
import { cniBinDir, runCni } from '../helpers/cni.js';
import { runWeft } from '../helpers/weft-cli.js';

const weft = (args: string[]) => runWeft(null, ...args);
const NAMES = ['bridge', 'flannel', 'host-local', 'portmap', 'sriov', 'weft-ovs'];
const SUPPORTED = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'];

describe('weft install-cni', function () {
  this.timeout(120_000);
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'weft-install-cni-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  async function version(bin: string): Promise<void> {
    const v = await runCni({ bin, command: 'VERSION', env: { WEFT_CNI_SOCKET: join(dir, 'no-server.sock') } }, '');
    assert.equal(v.exitCode, 0, `${bin}: ${v.stdout} ${v.stderr}`);
    assert.deepEqual((v.json as { supportedVersions: string[] }).supportedVersions, SUPPORTED);
  }

  it('installs the client and the bundle of bridge, flannel, host-local, portmap, sriov and weft-ovs, each runnable', async () => {
    const source = await cniBinDir();
    const dest = join(dir, 'opt-cni-bin');
    const r = await weft(['install-cni', '--source', source, '--dest', dest]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      r.stdout.trim().split('\n'),
      NAMES.flatMap((n) => [`installed ${join(dest, `${n}.cjs`)}`, `installed ${join(dest, n)}`]),
    );
    for (const name of NAMES) {
      for (const f of [name, `${name}.cjs`]) assert.equal(statSync(join(dest, f)).mode & 0o777, 0o755, f);
      assert.ok(readFileSync(join(dest, name)).subarray(0, 4).equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46])), `${name} is the client`);
      assert.ok(readFileSync(join(dest, `${name}.cjs`), 'utf8').startsWith('#!'), `${name}.cjs is the bundle`);
      await version(join(dest, name));
      await version(join(dest, `${name}.cjs`));
    }
    // Again over the installed files: replaced in place.
    const again = await weft(['install-cni', '--source', source, '--dest', dest]);
    assert.equal(again.code, 0, again.stderr);
  });

  it('installs a source built without the client (--no-native) as bundles under the plain names', async () => {
    const source = join(dir, 'no-native');
    const { failures } = await buildCniBundlesReport(source, findPluginEntries(), { native: false });
    assert.deepEqual(failures, []);
    const dest = join(dir, 'dest-no-native');
    const r = await weft(['install-cni', '--source', source, '--dest', dest]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split('\n'), NAMES.map((n) => `installed ${join(dest, n)}`));
    await version(join(dest, 'host-local'));
  });

  it('fails with a clear message and exit status 1 when the bundles are not built', async () => {
    const r = await weft(['install-cni', '--source', join(dir, 'nothing'), '--dest', join(dir, 'dest2')]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /lacks bridge, flannel, host-local, portmap, sriov, weft-ovs: run `npm run build` first/);
  });

  it('refuses clients without their bundles', async () => {
    const source = await cniBinDir();
    const partial = join(dir, 'partial');
    mkdirSync(partial);
    for (const n of NAMES) copyFileSync(join(source, n), join(partial, n));
    copyFileSync(join(source, 'bridge.cjs'), join(partial, 'bridge.cjs'));
    const r = await weft(['install-cni', '--source', partial, '--dest', join(dir, 'dest3')]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /lacks flannel\.cjs, host-local\.cjs, portmap\.cjs, sriov\.cjs, weft-ovs\.cjs \(the clients' Node\.js bundles\)/);
  });
});
