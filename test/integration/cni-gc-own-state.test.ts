// GC removes only what the plugin wrote (issue 14), through the built bundles as a runtime runs
// them:
//  - flannel whose dataDir is host-local's network directory (the shared-directory case the
//    issue was found with): real state of a live and a dead pod written by ADD (flannel → weft's
//    bridge → host-local, in-process, in a "host" netns made here), plus foreign things; GC must
//    remove exactly the dead pod's flannel state and host-local reservation;
//  - host-local alone, on a plain temp directory.
// Afterwards every foreign thing is byte-identical (same inode), the symlink target untouched,
// and each plugin wrote at most one warning line. (sriov's case is in cni-sriov.test.ts, with
// its harness.)
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cniBinDir, runCni, type CniRun } from '../helpers/cni.js';
import { LOOKALIKES, plantForeign, snapshot } from '../helpers/foreign-files.js';
import { addNetns, delNetns, nsPrefix } from '../helpers/netns.js';

const NETWORK = 'wtgc';
const SUBNET_ENV = 'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n';

function ok(r: CniRun): void {
  assert.equal(r.exitCode, 0, r.stdout + r.stderr);
}

/** The non-empty stderr lines of a run. */
function warnings(r: CniRun): string[] {
  return r.stderr.split('\n').filter((l) => l !== '');
}

/**
 * Runs GC and asserts that afterwards `dir` holds exactly `kept`, each byte-identical (same
 * inode) to before, and `target` (the symlink's, outside) untouched. Returns the run.
 */
async function gcKeepsExactly(dir: string, kept: readonly string[], target: string, gc: () => Promise<CniRun>): Promise<CniRun> {
  const before = snapshot(dir, kept, [target]);
  const r = await gc();
  ok(r);
  assert.equal(r.stdout, '');
  assert.deepEqual((await readdir(dir)).sort(), [...kept].sort());
  assert.deepEqual(snapshot(dir, kept, [target]), before);
  return r;
}

describe('GC through the bundles removes only what the plugin wrote', function () {
  this.timeout(120_000);
  const prefix = nsPrefix('gc');
  const namespaces: string[] = [];
  let tmp = '';
  let binDir = '';

  before(async function () {
    binDir = await cniBinDir();
    if (!['flannel', 'bridge', 'host-local'].every((p) => existsSync(join(binDir, p)))) this.skip();
    tmp = await mkdtemp(join(tmpdir(), 'wt-gc-int-'));
  });

  after(async () => {
    for (const ns of namespaces) await delNetns(ns);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  async function netns(suffix: string): Promise<string> {
    const name = await addNetns(`${prefix}-${suffix}`);
    namespaces.push(name);
    return name;
  }

  it('flannel sharing host-local\'s directory: the dead pod\'s flannel state and IP go, nothing else', async () => {
    const host = await netns('h');
    const dir = join(tmp, 'flannel');
    await mkdir(dir, { recursive: true });
    const subnetFile = join(dir, 'subnet.env');
    await writeFile(subnetFile, SUBNET_ENV);
    const ipamDir = join(dir, 'ipam');
    const shared = join(ipamDir, NETWORK);
    const conf = { cniVersion: '1.1.0', name: NETWORK, type: 'flannel', subnetFile, dataDir: shared, ipam: { dataDir: ipamDir } };
    const flannel = (command: string, stdin: object, containerId?: string, pod?: string): Promise<CniRun> =>
      runCni({ bin: join(binDir, 'flannel'), command, hostNs: host, path: binDir, ...(containerId ? { containerId } : {}), ...(pod ? { netns: `/run/netns/${pod}` } : {}) }, JSON.stringify(stdin));

    for (const id of ['ctr-live', 'ctr-dead']) ok(await flannel('ADD', conf, id, await netns(id.slice(4))));
    // flannel's state and host-local's store, side by side.
    assert.deepEqual((await readdir(shared)).sort(), ['10.1.17.2', '10.1.17.3', 'ctr-dead', 'ctr-live', 'last_reserved_ip.0', 'lock']);
    assert.equal(await readFile(join(shared, '10.1.17.3'), 'utf8'), 'ctr-dead\r\neth0');
    const deadState = await readFile(join(shared, 'ctr-dead'), 'utf8');
    const planted = plantForeign(shared, join(dir, 'outside'), { ...LOOKALIKES.flannel, staleText: deadState });
    const kept = [...planted.names, '10.1.17.2', 'ctr-live', 'last_reserved_ip.0'];
    const valid = [{ containerID: 'ctr-live', ifname: 'eth0' }];
    const gc = await gcKeepsExactly(shared, kept, planted.target, () => flannel('GC', { ...conf, 'cni.dev/valid-attachments': valid }));
    assert.equal(await readFile(planted.target, 'utf8'), deadState);
    // One line from each plugin: flannel names what is named like a container ID (host-local's
    // files among them); host-local the IP-named file that is no reservation.
    assert.deepEqual(warnings(gc), [
      `flannel GC: left alone 7 file(s) in ${shared} named like flannel state (a container ID) but not holding it: ` +
        '"0123456789abcdef", "10.1.17.2", "10.1.17.3", "10.1.2.99", "last_reserved_ip.0", "lock", "passwd"',
      `host-local GC: left alone 1 file(s) in ${shared} named like a reservation (an IP address) but not holding it: "10.1.2.99"`,
    ]);

    // The live pod still deletes cleanly afterwards.
    ok(await flannel('DEL', conf, 'ctr-live', 'live'));
    assert.deepEqual((await readdir(shared)).sort(), [...planted.names, 'last_reserved_ip.0'].sort());
  });

  it('host-local: the dead reservation goes; lock, last_reserved_ip.0 and foreign things stay', async () => {
    const dataDir = join(tmp, 'hl');
    const dir = join(dataDir, NETWORK);
    const conf = { cniVersion: '1.1.0', name: NETWORK, type: 'bridge', ipam: { type: 'host-local', dataDir, ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: 'fd00:2::/64' }]] } };
    const hostLocal = (command: string, stdin: object, containerId?: string): Promise<CniRun> =>
      runCni({ bin: join(binDir, 'host-local'), command, ...(containerId ? { containerId, netns: '/run/netns/wt-gc-none' } : {}) }, JSON.stringify(stdin));
    for (const id of ['c-live', 'c-dead']) ok(await hostLocal('ADD', conf, id));
    assert.deepEqual((await readdir(dir)).sort(), ['10.1.2.2', '10.1.2.3', 'fd00:2::2', 'fd00:2::3', 'last_reserved_ip.0', 'last_reserved_ip.1', 'lock']);
    const planted = plantForeign(dir, join(dataDir, 'outside'), { ...LOOKALIKES.hostLocal, staleText: 'c-dead\r\neth0' });
    await writeFile(join(dir, 'c0ffee'), 'c-dead\r\neth0'); // not named as an IP: not a reservation
    const kept = [...planted.names, 'c0ffee', '10.1.2.2', 'fd00:2::2', 'last_reserved_ip.0', 'last_reserved_ip.1'];
    const valid = [{ containerID: 'c-live', ifname: 'eth0' }];
    const gc = await gcKeepsExactly(dir, kept, planted.target, () => hostLocal('GC', { ...conf, 'cni.dev/valid-attachments': valid }));
    assert.equal(await readFile(planted.target, 'utf8'), 'c-dead\r\neth0');
    assert.deepEqual(warnings(gc), [
      `host-local GC: left alone 2 file(s) in ${dir} named like a reservation (an IP address) but not holding it: "10.1.2.98", "10.1.2.99"`,
    ]);
  });
});
