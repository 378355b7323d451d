// The flannel meta plugin end to end, as a bundle run inside a private "host" netns:
//  - delegating to the reference bridge + host-local (/usr/lib/cni, v1.1.1, so cniVersion 1.0.0);
//  - delegating to weft's own bridge + host-local (in-process), compared with the reference chain.
// Every link, address and route lives in namespaces created here; host-local and flannel state
// live under a temp dir.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { buildCniBundles } from '../../cni-plugins/build.js';
import { cniBinDir, REFERENCE_CNI_DIR, runCni, type RunCniOptions } from '../helpers/cni.js';
import { addNetns, delNetns, ipn, nsPrefix } from '../helpers/netns.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const NETWORK = 'wtflannel';
const SUBNET_ENV = 'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n';

/**
 * flannel's real entry point (cni-plugins/cmd/flannel.ts) also bundles weft's bridge and
 * host-local; while those do not build, the reference-chain tests still run against a flannel-only
 * bundle made from a throwaway entry.
 */
async function flannelOnlyBundle(dir: string): Promise<string> {
  const entry = join(dir, 'flannel-entry.ts');
  await writeFile(
    entry,
    `import { runPlugin } from ${JSON.stringify(join(ROOT, 'cni-plugins/skel/run.ts'))};\n` +
      `import { flannelPlugin } from ${JSON.stringify(join(ROOT, 'cni-plugins/flannel/plugin.ts'))};\n` +
      'void runPlugin(flannelPlugin);\n',
  );
  const [bin] = await buildCniBundles(join(dir, 'bin'), [{ name: 'flannel', entry }]);
  assert.ok(bin !== undefined, 'flannel-only bundle was not written');
  return bin;
}

interface PodState {
  addresses: string[];
  routes: string[];
  mtu: number;
}

async function podState(ns: string): Promise<PodState> {
  const links = JSON.parse(await ipn(ns, '-j', 'addr', 'show', 'dev', 'eth0')) as {
    mtu: number;
    addr_info: { family: string; local: string; prefixlen: number; scope: string }[];
  }[];
  const link = links[0];
  assert.ok(link, `no eth0 in ${ns}`);
  const routes = JSON.parse(await ipn(ns, '-j', 'route', 'show')) as {
    dst: string;
    gateway?: string;
    dev: string;
    prefsrc?: string;
  }[];
  return {
    addresses: link.addr_info.filter((a) => a.family === 'inet').map((a) => `${a.local}/${a.prefixlen}`),
    routes: routes.map((r) => [r.dst, r.gateway ? `via ${r.gateway}` : '', `dev ${r.dev}`, r.prefsrc ? `src ${r.prefsrc}` : ''].filter(Boolean).join(' ')),
    mtu: link.mtu,
  };
}

async function vethsIn(ns: string): Promise<string[]> {
  const links = JSON.parse(await ipn(ns, '-j', 'link', 'show', 'type', 'veth')) as { ifname: string }[];
  return links.map((l) => l.ifname);
}

/** A result with MACs and the host veth name replaced, so two chains can be compared. */
function normalise(result: unknown): unknown {
  return JSON.parse(
    JSON.stringify(result)
      .replace(/"mac":"[0-9a-f:]{17}"/g, '"mac":"MAC"')
      .replace(/"name":"veth[0-9a-f]+"/g, '"name":"VETH"'),
  ) as unknown;
}

describe('flannel CNI plugin (integration, namespaces)', function () {
  this.timeout(120_000);
  const prefix = nsPrefix('fl');
  const namespaces: string[] = [];
  let tmp = '';
  let binDir = '';
  let flannelBin = '';
  /** Whether weft's bridge and host-local bundles built (else only the reference chain runs). */
  let weftChain = false;

  async function netns(suffix: string): Promise<string> {
    const name = await addNetns(`${prefix}-${suffix}`);
    namespaces.push(name);
    return name;
  }

  /** A fresh host netns, subnet.env, flannel dataDir and host-local dataDir for one scenario. */
  async function scenario(tag: string, cniVersion = '1.0.0') {
    const host = await netns(`${tag}h`);
    const dir = join(tmp, tag);
    await mkdir(dir, { recursive: true });
    const subnetFile = join(dir, 'subnet.env');
    await writeFile(subnetFile, SUBNET_ENV);
    const dataDir = join(dir, 'flannel');
    const ipamDir = join(dir, 'ipam');
    const conf = {
      cniVersion,
      name: NETWORK,
      type: 'flannel',
      subnetFile,
      dataDir,
      delegate: { hairpinMode: true, isDefaultGateway: true },
      ipam: { dataDir: ipamDir },
    };
    const expectedState =
      `{"cniVersion":"${cniVersion}","hairpinMode":true,"ipMasq":false,"ipam":{"dataDir":${JSON.stringify(ipamDir)},` +
      '"ranges":[[{"subnet":"10.1.17.0/24"}]],"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},' +
      `"isDefaultGateway":true,"isGateway":true,"mtu":1450,"name":"${NETWORK}","type":"bridge"}`;
    return { host, subnetFile, dataDir, ipamDir, conf, stdin: JSON.stringify(conf), expectedState };
  }

  type Scenario = Awaited<ReturnType<typeof scenario>>;

  function flannel(s: Scenario, path: string, command: string, extra: Partial<RunCniOptions> = {}, stdin = s.stdin) {
    return runCni({ bin: flannelBin, command, hostNs: s.host, path, ...extra }, stdin);
  }

  before(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'wt-flannel-int-'));
    binDir = await cniBinDir();
    flannelBin = join(binDir, 'flannel');
    weftChain = existsSync(flannelBin) && existsSync(join(binDir, 'bridge')) && existsSync(join(binDir, 'host-local'));
    if (!existsSync(flannelBin)) flannelBin = await flannelOnlyBundle(tmp);
  });

  after(async () => {
    for (const ns of namespaces) await delNetns(ns);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  const chains = [
    { label: 'the reference bridge + host-local', tag: 'r', reference: true },
    { label: "weft's bridge + host-local (in-process)", tag: 'w', reference: false },
  ];
  for (const chain of chains) {
    describe(`delegating to ${chain.label}`, () => {
      const cniPath = (): string => (chain.reference ? REFERENCE_CNI_DIR : binDir);
      before(function () {
        if (!chain.reference && !weftChain) this.skip();
      });

      it('ADD: pod address in FLANNEL_SUBNET, routes via the gateway, MTU, state file; DEL removes it all', async () => {
        const s = await scenario(`${chain.tag}a`);
        const pod = await netns(`${chain.tag}a1`);
        const add = await flannel(s, cniPath(), 'ADD', { containerId: 'ctr-a1', netns: `/run/netns/${pod}` });
        assert.equal(add.exitCode, 0, add.stdout + add.stderr);
        assert.deepEqual(normalise(add.json), {
          cniVersion: '1.0.0',
          interfaces: [
            { name: 'cni0', mac: 'MAC' },
            { name: 'VETH', mac: 'MAC' },
            { name: 'eth0', mac: 'MAC', sandbox: `/run/netns/${pod}` },
          ],
          ips: [{ interface: 2, address: '10.1.17.2/24', gateway: '10.1.17.1' }],
          routes: [{ dst: '10.1.0.0/16' }, { dst: '0.0.0.0/0', gw: '10.1.17.1' }],
          // The reference bridge prints "dns": {}; weft's skel drops an empty dns (current libcni).
        });
        assert.deepEqual(await podState(pod), {
          addresses: ['10.1.17.2/24'],
          routes: ['default via 10.1.17.1 dev eth0', '10.1.0.0/16 via 10.1.17.1 dev eth0', '10.1.17.0/24 dev eth0 src 10.1.17.2'],
          mtu: 1450,
        });
        assert.equal(await readFile(join(s.dataDir, 'ctr-a1'), 'utf8'), s.expectedState);
        assert.deepEqual(await readdir(join(s.ipamDir, NETWORK)).then((f) => f.filter((n) => n.startsWith('10.'))), ['10.1.17.2']);
        assert.equal((await vethsIn(s.host)).length, 1);

        // CHECK replays the state with the runtime's prevResult.
        const checkStdin = JSON.stringify({ ...s.conf, prevResult: add.json });
        const checkOpts = { containerId: 'ctr-a1', netns: `/run/netns/${pod}` };
        const check = await flannel(s, cniPath(), 'CHECK', checkOpts, checkStdin);
        if (chain.reference) {
          // The reference bridge gets as far as the routes (so it had the prevResult), then trips
          // over its own bug: it looks for the gateway-less result route 10.1.0.0/16, but
          // ConfigureIface installed it via the gateway.
          assert.equal(check.exitCode, 1);
          assert.deepEqual(check.json, {
            code: 999,
            msg: 'failed to delegate check to bridge: Expected Route {Dst:{IP:10.1.0.0 Mask:ffff0000} GW:<nil>} not found in routing table',
          });
        } else {
          assert.equal(check.exitCode, 0, check.stdout + check.stderr);
          // A pod that lost its address no longer checks out.
          await ipn(pod, 'addr', 'flush', 'dev', 'eth0');
          const broken = await flannel(s, cniPath(), 'CHECK', checkOpts, checkStdin);
          assert.equal(broken.exitCode, 1);
          assert.match((broken.json as { msg: string }).msg, /^failed to delegate check to bridge: .*10\.1\.17\.2/);
        }

        const del = await flannel(s, cniPath(), 'DEL', { containerId: 'ctr-a1', netns: `/run/netns/${pod}` });
        assert.equal(del.exitCode, 0, del.stdout + del.stderr);
        assert.equal(del.stdout, '');
        assert.deepEqual(await vethsIn(s.host), []);
        assert.deepEqual(await vethsIn(pod), []);
        assert.deepEqual(await readdir(s.dataDir), []);
        assert.deepEqual(await readdir(join(s.ipamDir, NETWORK)).then((f) => f.filter((n) => n.startsWith('10.'))), []);

        // A second DEL finds no state and succeeds without touching anything.
        const again = await flannel(s, cniPath(), 'DEL', { containerId: 'ctr-a1', netns: `/run/netns/${pod}` });
        assert.equal(again.exitCode, 0, again.stdout);
      });

      it('DEL with an empty CNI_NETNS (netns already gone) frees the IP and the state', async () => {
        const s = await scenario(`${chain.tag}b`);
        const pod = await netns(`${chain.tag}b1`);
        const add = await flannel(s, cniPath(), 'ADD', { containerId: 'ctr-b1', netns: `/run/netns/${pod}` });
        assert.equal(add.exitCode, 0, add.stdout + add.stderr);
        await delNetns(pod);
        const del = await flannel(s, cniPath(), 'DEL', { containerId: 'ctr-b1', netns: '' });
        assert.equal(del.exitCode, 0, del.stdout + del.stderr);
        assert.deepEqual(await readdir(s.dataDir), []);
        assert.deepEqual(await readdir(join(s.ipamDir, NETWORK)).then((f) => f.filter((n) => n.startsWith('10.'))), []);
        // The veth pair went with the pod's netns.
        assert.deepEqual(await vethsIn(s.host), []);
      });

      it('DEL after the state file was removed succeeds (nothing to replay, as flannel)', async () => {
        const s = await scenario(`${chain.tag}c`);
        const pod = await netns(`${chain.tag}c1`);
        const add = await flannel(s, cniPath(), 'ADD', { containerId: 'ctr-c1', netns: `/run/netns/${pod}` });
        assert.equal(add.exitCode, 0, add.stdout + add.stderr);
        await rm(join(s.dataDir, 'ctr-c1'));
        const del = await flannel(s, cniPath(), 'DEL', { containerId: 'ctr-c1', netns: `/run/netns/${pod}` });
        assert.equal(del.exitCode, 0, del.stdout + del.stderr);
        // Without the state nothing was delegated: the pod keeps its interface (flannel's known leak).
        assert.equal((await podState(pod)).addresses[0], '10.1.17.2/24');
      });

      it('a failing delegate ADD is rolled back: no veth, no IP, no state', async () => {
        const s = await scenario(`${chain.tag}d`);
        const pod = await netns(`${chain.tag}d1`);
        // The pod already has an eth0, so the bridge cannot create its end of the veth pair.
        await ipn(pod, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'other0');
        const add = await flannel(s, cniPath(), 'ADD', { containerId: 'ctr-d1', netns: `/run/netns/${pod}` });
        assert.equal(add.exitCode, 1);
        const err = add.json as { code: number; msg: string };
        assert.equal(err.code, 999);
        assert.match(err.msg, /^failed to delegate add to bridge: .*eth0/);
        assert.deepEqual(await readdir(s.dataDir), []);
        assert.deepEqual(await readdir(join(s.ipamDir, NETWORK)).then((f) => f.filter((n) => n.startsWith('10.'))), []);
        assert.deepEqual(await vethsIn(s.host), []);
        // The rollback DEL, like any runtime DEL, removed the pod's eth0 (bridge DEL semantics).
        assert.deepEqual(await vethsIn(pod), []);
      });

      it('missing subnet.env: ADD fails with code 11, STATUS with code 50, nothing is created', async () => {
        const s = await scenario(`${chain.tag}e`, '1.0.0');
        await rm(s.subnetFile);
        const pod = await netns(`${chain.tag}e1`);
        const add = await flannel(s, cniPath(), 'ADD', { containerId: 'ctr-e1', netns: `/run/netns/${pod}` });
        assert.equal(add.exitCode, 1);
        assert.deepEqual(add.json, {
          code: 11,
          msg:
            `subnet file ${s.subnetFile} does not exist: weftd (flanneld) has not started or has not acquired a ` +
            'subnet lease on this node yet; check the weftd/flannel log for this node',
        });
        assert.equal(existsSync(s.dataDir), false);
        assert.deepEqual(await vethsIn(s.host), []);

        const status = await flannel(s, cniPath(), 'STATUS', {}, JSON.stringify({ ...s.conf, cniVersion: '1.1.0' }));
        assert.equal(status.exitCode, 1);
        assert.equal((status.json as { code: number }).code, 50);
        assert.match((status.json as { msg: string }).msg, /^subnet file .* does not exist: weftd \(flanneld\)/);
      });
    });
  }

  describe('weft chain: side by side with the reference chain; STATUS and GC', () => {
    before(function () {
      if (!weftChain) this.skip();
    });

    it('gives the same result, pod state and state file as the reference chain', async () => {
      const ref = await scenario('xr');
      const weft = await scenario('xw');
      const refPod = await netns('xr1');
      const weftPod = await netns('xw1');
      const refAdd = await flannel(ref, REFERENCE_CNI_DIR, 'ADD', { containerId: 'ctr-1', netns: `/run/netns/${refPod}` });
      const weftAdd = await flannel(weft, binDir, 'ADD', { containerId: 'ctr-1', netns: `/run/netns/${weftPod}` });
      assert.equal(refAdd.exitCode, 0, refAdd.stdout + refAdd.stderr);
      assert.equal(weftAdd.exitCode, 0, weftAdd.stdout + weftAdd.stderr);
      const sandbox = (r: unknown, pod: string) => JSON.parse(JSON.stringify(normalise(r)).replace(`/run/netns/${pod}`, 'SANDBOX')) as unknown;
      assert.deepEqual(sandbox(weftAdd.json, weftPod), sandbox(refAdd.json, refPod));
      assert.deepEqual(await podState(weftPod), await podState(refPod));
      assert.equal(
        await readFile(join(weft.dataDir, 'ctr-1'), 'utf8'),
        weft.expectedState,
      );

      const weftDel = await flannel(weft, binDir, 'DEL', { containerId: 'ctr-1', netns: `/run/netns/${weftPod}` });
      assert.equal(weftDel.exitCode, 0, weftDel.stdout + weftDel.stderr);
      assert.deepEqual(await vethsIn(weft.host), []);
      assert.deepEqual(await readdir(weft.dataDir), []);
      assert.deepEqual(await readdir(join(weft.ipamDir, NETWORK)).then((f) => f.filter((n) => n.startsWith('10.'))), []);
      const refDel = await flannel(ref, REFERENCE_CNI_DIR, 'DEL', { containerId: 'ctr-1', netns: `/run/netns/${refPod}` });
      assert.equal(refDel.exitCode, 0, refDel.stdout + refDel.stderr);
    });

    it('STATUS (1.1.0) succeeds once subnet.env exists; GC drops state of unknown attachments', async () => {
      const s = await scenario('g', '1.1.0');
      const pods = [await netns('g1'), await netns('g2')];
      for (const [i, pod] of pods.entries()) {
        const add = await flannel(s, binDir, 'ADD', { containerId: `ctr-g${i}`, netns: `/run/netns/${pod}` });
        assert.equal(add.exitCode, 0, add.stdout + add.stderr);
      }
      const status = await flannel(s, binDir, 'STATUS');
      assert.equal(status.exitCode, 0, status.stdout + status.stderr);

      const gcStdin = JSON.stringify({ ...s.conf, 'cni.dev/valid-attachments': [{ containerID: 'ctr-g0', ifname: 'eth0' }] });
      const gc = await flannel(s, binDir, 'GC', {}, gcStdin);
      assert.equal(gc.exitCode, 0, gc.stdout + gc.stderr);
      assert.deepEqual(await readdir(s.dataDir), ['ctr-g0']);
      // host-local (the delegate's IPAM) released ctr-g1's address.
      assert.deepEqual(await readdir(join(s.ipamDir, NETWORK)).then((f) => f.filter((n) => n.startsWith('10.'))), ['10.1.17.2']);

      await rm(s.subnetFile);
      const notReady = await flannel(s, binDir, 'STATUS');
      assert.equal(notReady.exitCode, 1);
      assert.equal((notReady.json as { code: number }).code, 50);
    });
  });
});
