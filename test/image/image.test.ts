// The container image (issue 20). image/build.sh builds it (the Debian base layer from its cache
// under /var/cache/weft-image when the pinned inputs match, else debootstrap) into a podman
// storage of this test's own (a temporary --root/--runroot/--tmpdir: the machine's storage is
// never touched) and saves the docker-archive; podman with runc then runs it:
//   - weftd --version (the entrypoint) and weft --help; the tools weftd runs are there, and no
//     compiler, npm, dev dependency or documentation;
//   - the manifest's two init containers as written in deploy/kubernetes/weft.yml: install-cni
//     into a temporary /opt/cni/bin, whose plugins answer VERSION (the host's node and the
//     image's), and the conflist copy;
//   - weftd as a vxlan node in a network namespace of the test's (--network ns:/run/netns/...,
//     NET_ADMIN and NET_RAW only) against a real etcd in another: it takes a lease, writes
//     subnet.env into the mounted /run/flannel, programs a fake peer's FDB entry, neighbour and
//     route on flannel.1 and removes them with the lease, and exits 0 on `podman stop`;
//   - the archive loads into a second, empty storage under both tags.
// Every container runs with --network none or in the test's namespace, so nothing is created in
// the machine's network namespace; that is checked too.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import yaml from 'js-yaml';
import { Cluster, ETCD_IP } from '../helpers/cluster.js';
import { ipn, lines, nsExec, sh } from '../helpers/netns.js';
import { WaitAbort, waitFor } from '../helpers/wait.js';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const VERSION = (JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
const IMAGE = `localhost/weft:${VERSION}`;
const PLUGINS = ['bridge', 'flannel', 'host-local', 'portmap', 'sriov', 'weft-ovs'];
const CNI_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'];
// This machine's quirks: crun fails on its hybrid cgroups (runc, set globally below), and podman's
// default ulimits exceed what a process without CAP_SYS_RESOURCE may set.
const RUN = ['run', '--rm', '--pull=never', '--ulimit', 'nofile=20000:20000', '--ulimit', 'nproc=32768:32768'];

interface Result {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a program to its end; never rejects for a non-zero exit (the caller asserts). */
function exec(cmd: string, args: readonly string[], opts: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, [...args], { env: opts.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** A podman storage of the test's own, with this machine's runtime settings. */
class Podman {
  readonly global: string[];

  constructor(readonly dir: string) {
    this.global = [
      '--root', join(dir, 'root'), '--runroot', join(dir, 'run'), '--tmpdir', join(dir, 'tmp'),
      '--runtime', 'runc', '--cgroup-manager', 'cgroupfs', '--events-backend', 'file',
    ];
  }

  run(args: readonly string[], timeoutMs = 120_000): Promise<Result> {
    return exec('podman', [...this.global, ...args], { timeoutMs });
  }

  /** stdout of a podman command that must succeed. */
  async ok(args: readonly string[], timeoutMs = 120_000): Promise<string> {
    const r = await this.run(args, timeoutMs);
    if (r.code !== 0) throw new Error(`podman ${args.join(' ')} exited with ${r.code}: ${r.stderr.trim()}\n${r.stdout.trim()}`);
    return r.stdout;
  }

  spawn(args: readonly string[]): ChildProcess {
    return spawn('podman', [...this.global, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  }

  /** Removes every container and image, unmounts what the storage mounted under its directory, and deletes it. */
  async destroy(): Promise<void> {
    await this.run(['rm', '--all', '--force', '--time', '0'], 60_000).catch(() => undefined);
    await this.run(['rmi', '--all', '--force'], 60_000).catch(() => undefined);
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4] ?? '')
      .filter((m) => m.startsWith(`${this.dir}/`))
      .sort((a, b) => b.length - a.length);
    for (const m of mounts) {
      if ((await exec('umount', [m])).code !== 0) await exec('umount', ['-l', m]);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Links in the machine's own network namespace that podman or CNI would have made. */
async function rootNsContainerLinks(): Promise<string[]> {
  const out = await sh('ip', ['-o', 'link', 'show']);
  return lines(out)
    .map((l) => l.split(':')[1]!.trim().split('@')[0]!)
    .filter((n) => /^(cni|podman|veth)/.test(n))
    .sort();
}

/** CNI_COMMAND=VERSION of one plugin executable; its supported versions. */
async function cniVersion(bin: string): Promise<string[]> {
  // An empty WEFT_CNI_SOCKET: no server, so the native client execs <name>.cjs (Node.js) beside it.
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', CNI_COMMAND: 'VERSION', WEFT_CNI_SOCKET: '' };
  const r = await exec(bin, [], { env, timeoutMs: 30_000 });
  assert.equal(r.code, 0, `${bin}: ${r.stdout} ${r.stderr}`);
  return (JSON.parse(r.stdout) as { supportedVersions: string[] }).supportedVersions;
}

interface ManifestContainer {
  name: string;
  image: string;
  command: string[];
  args?: string[];
}

/** The DaemonSet's containers and the ConfigMap's data, as deploy/kubernetes/weft.yml has them. */
function manifest(): { init: ManifestContainer[]; weftd: ManifestContainer; data: Record<string, string> } {
  const docs = yaml.loadAll(readFileSync(join(REPO, 'deploy/kubernetes/weft.yml'), 'utf8')) as { kind?: string }[];
  const ds = docs.find((d) => d?.kind === 'DaemonSet') as {
    spec: { template: { spec: { initContainers: ManifestContainer[]; containers: ManifestContainer[] } } };
  };
  const cm = docs.find((d) => d?.kind === 'ConfigMap') as { data: Record<string, string> };
  const pod = ds.spec.template.spec;
  return { init: pod.initContainers, weftd: pod.containers.find((c) => c.name === 'weftd')!, data: cm.data };
}

describe('container image: image/build.sh, run with podman + runc', function () {
  this.timeout(600_000);
  let dir: string;
  let podman: Podman;
  let archive: string;
  let linksBefore: string[];
  let imageId = '';

  before(async function () {
    this.timeout(1_200_000);
    linksBefore = await rootNsContainerLinks();
    dir = mkdtempSync(join(tmpdir(), 'weft-image-test-'));
    podman = new Podman(join(dir, 'storage'));
    archive = join(dir, `weft-${VERSION}.tar`);
    const t0 = Date.now();
    const r = await exec('bash', [join(REPO, 'image/build.sh'), '--save', archive], {
      env: { ...process.env, WEFT_PODMAN_OPTS: podman.global.join(' ') },
      timeoutMs: 1_100_000,
    });
    assert.equal(r.code, 0, `image/build.sh failed:\n${r.stderr}\n${r.stdout.slice(-3000)}`);
    const [id, size] = (await podman.ok(['image', 'inspect', '--format', '{{.Id}} {{.Size}}', IMAGE])).trim().split(' ') as [string, string];
    imageId = id;
    console.log(
      `      image/build.sh: ${((Date.now() - t0) / 1000).toFixed(0)} s (${/Debian base layer \S+: cached/.test(r.stdout) ? 'cached' : 'new'} base layer); ` +
        `${IMAGE} ${id.slice(0, 12)}: ${(Number(size) / 1e6).toFixed(0)} MB uncompressed, archive ${(statSync(archive).size / 1e6).toFixed(0)} MB`,
    );
  });

  after(async () => {
    await podman?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
    // Nothing was created in the machine's network namespace.
    assert.deepEqual(await rootNsContainerLinks(), linksBefore);
  });

  it('runs weftd --version (the entrypoint) and weft --help', async () => {
    const v = await podman.ok([...RUN, '--network', 'none', IMAGE, '--version']);
    assert.equal(v.trim(), VERSION);
    const help = await podman.ok([...RUN, '--network', 'none', '--entrypoint', '/opt/weft/bin/weft', IMAGE, '--help']);
    for (const cmd of ['install-cni', 'leases', 'status']) assert.match(help, new RegExp(`weft ${cmd}`));
    const inspect = JSON.parse(await podman.ok(['image', 'inspect', IMAGE])) as { Config: { Entrypoint: string[] } }[];
    assert.deepEqual(inspect[0]!.Config.Entrypoint, ['/opt/weft/bin/weftd']);
    const tags = (await podman.ok(['images', '--format', '{{.Repository}}:{{.Tag}}', '--filter', 'reference=localhost/weft'])).trim().split('\n').sort();
    assert.deepEqual(tags, [IMAGE, 'localhost/weft:latest'].sort());
  });

  it('holds the tools weftd and the plugins run, and no compiler, npm, dev dependency or docs', async () => {
    const script = [
      'for c in node ip bridge devlink iptables iptables-save iptables-restore ip6tables-restore nft ethtool conntrack sysctl nsenter flock env cp; do',
      '  command -v "$c" >/dev/null || echo "missing $c"; done',
      'for c in gcc cc cpp make npm npx; do command -v "$c" >/dev/null && echo "unwanted $c"; done',
      'for d in typescript mocha esbuild tsx eslint @types; do [ -e "/opt/weft/node_modules/$d" ] && echo "dev dependency $d"; done',
      '[ -e /root/.npm ] && echo "npm cache"',
      'find /usr/share/doc -type f ! -name copyright | head -3 | sed "s/^/doc /"',
      'find /usr/share/man /usr/share/info -type f | head -3 | sed "s/^/doc /"',
      'find /opt/weft -name "*.map" -o -name "*.d.ts" | head -3 | sed "s/^/unwanted /"',
      'node --version; iptables --version; cat /opt/weft/image/build-info',
    ].join('\n');
    const out = await podman.ok([...RUN, '--network', 'none', '--entrypoint', '/bin/bash', IMAGE, '-c', script]);
    const problems = lines(out).filter((l) => /^(missing|unwanted|dev dependency|npm cache|doc) /.test(l) || l === 'npm cache');
    assert.deepEqual(problems, []);
    const pinned = /^NODE_VERSION=(\S+)$/m.exec(readFileSync(join(REPO, 'image/inputs.env'), 'utf8'))![1]!;
    assert.match(out, new RegExp(`^v${pinned.replace(/\./g, '\\.')}$`, 'm'));
    assert.match(out, /^weft=\S+$/m);
  });

  it("runs the manifest's init containers: install-cni (plugins answer VERSION) and the conflist copy", async () => {
    const { init, data } = manifest();
    assert.equal(init.length, 2);
    // The manifest's image name is what `make image` tags and `make image-save` archives.
    for (const c of init) assert.equal(c.image, 'localhost/weft:latest');
    const cniBin = join(dir, 'opt-cni-bin');
    mkdirSync(cniBin);
    const install = init[0]!;
    assert.deepEqual(install.command.slice(1, 4), ['install-cni', '--dest', '/opt/cni/bin']);
    const out = await podman.ok([
      ...RUN, '--network', 'none', '-v', `${cniBin}:/opt/cni/bin`,
      '--entrypoint', install.command[0]!, install.image, ...install.command.slice(1),
    ]);
    assert.deepEqual(lines(out), PLUGINS.flatMap((n) => [`installed /opt/cni/bin/${n}.cjs`, `installed /opt/cni/bin/${n}`]));
    for (const name of PLUGINS) {
      assert.ok(readFileSync(join(cniBin, name)).subarray(0, 4).equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46])), `${name} is the native client`);
      assert.equal(statSync(join(cniBin, name)).mode & 0o777, 0o755);
      // On the host: the static client, falling back to the bundle under the host's Node.js.
      assert.deepEqual(await cniVersion(join(cniBin, name)), CNI_VERSIONS, name);
      assert.deepEqual(await cniVersion(join(cniBin, `${name}.cjs`)), CNI_VERSIONS, `${name}.cjs`);
    }
    // In the image too (its own Node.js), as weftd's CNI server would run them.
    const inImage = await podman.ok([
      ...RUN, '--network', 'none', '-v', `${cniBin}:/host-cni:ro`, '-e', 'CNI_COMMAND=VERSION', '-e', 'WEFT_CNI_SOCKET=',
      '--entrypoint', '/host-cni/flannel', IMAGE,
    ]);
    assert.deepEqual((JSON.parse(inImage) as { supportedVersions: string[] }).supportedVersions, CNI_VERSIONS);

    const conf = init[1]!;
    const cfg = join(dir, 'kube-flannel');
    const netd = join(dir, 'cni-net.d');
    mkdirSync(cfg);
    mkdirSync(netd);
    writeFileSync(join(cfg, 'cni-conf.json'), data['cni-conf.json']!);
    await podman.ok([
      ...RUN, '--network', 'none', '-v', `${cfg}:/etc/kube-flannel/:ro`, '-v', `${netd}:/etc/cni/net.d`,
      '--entrypoint', conf.command[0]!, conf.image, ...conf.command.slice(1),
    ]);
    assert.equal(readFileSync(join(netd, '10-flannel.conflist'), 'utf8'), data['cni-conf.json']);
  });

  describe('weftd from the image as a vxlan node in a network namespace', () => {
    const PEER = { subnet: '10.5.200.0', ip: '10.250.0.200', mac: '0e:77:00:00:02:00' };
    let c: Cluster | null = null;
    let container: ChildProcess | null = null;
    let output = '';
    const name = `weft-image-test-${process.pid}`;

    after(async () => {
      await podman?.run(['rm', '--force', '--time', '0', name], 60_000).catch(() => undefined);
      container?.kill('SIGKILL');
      await c?.destroy();
    });

    it('takes a lease, writes subnet.env into the mounted /run/flannel, programs a peer and exits 0 on stop', async () => {
      c = await Cluster.create({
        hosts: 1,
        tag: 'img',
        config: { Network: '10.5.0.0/16', SubnetMax: '10.5.99.0', Backend: { Type: 'vxlan' } },
      });
      const host = c.hosts[0]!;
      const runFlannel = join(dir, 'run-flannel');
      mkdirSync(runFlannel);
      const xtablesLock = join(dir, 'xtables.lock');
      writeFileSync(xtablesLock, '');
      const { weftd } = manifest();
      container = podman.spawn([
        ...RUN, '--name', name, '--network', `ns:/run/netns/${host.ns}`, '--cap-add', 'NET_ADMIN,NET_RAW',
        '-v', `${runFlannel}:/run/flannel`, '-v', `${xtablesLock}:/run/xtables.lock`,
        '--entrypoint', weftd.command[0]!, IMAGE,
        '--etcd-endpoints', `http://${ETCD_IP}:2379`, '--iface', 'eth0', '--ip-masq',
        '--healthz-ip=127.0.0.1', '--healthz-port=8081', '--reconcile-interval', '1',
      ]);
      const proc = container;
      proc.stdout!.on('data', (d: Buffer) => (output += d.toString()));
      proc.stderr!.on('data', (d: Buffer) => (output += d.toString()));
      const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
      const subnetEnv = join(runFlannel, 'subnet.env');
      await waitFor(
        () => {
          if (proc.exitCode !== null) throw new WaitAbort(`the container exited with ${proc.exitCode}:\n${output}`);
          return /acquired lease/.test(output) && existsSync(subnetEnv);
        },
        { timeoutMs: 60_000, what: 'weftd in the container to write subnet.env' },
      ).catch((e: Error) => {
        throw new Error(`${e.message}\n${output.split('\n').slice(-20).join('\n')}`);
      });

      const env = Object.fromEntries(lines(readFileSync(subnetEnv, 'utf8')).map((l) => l.split('=') as [string, string]));
      assert.equal(env.FLANNEL_NETWORK, '10.5.0.0/16');
      assert.match(env.FLANNEL_SUBNET ?? '', /^10\.5\.\d+\.1\/24$/);
      assert.equal(env.FLANNEL_MTU, '1450');
      assert.equal(env.FLANNEL_IPMASQ, 'true');
      const subnet = env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0');
      const stored = await c.etcdctl('get', `/coreos.com/network/subnets/${subnet}-24`);
      assert.equal((JSON.parse(lines(stored)[1]!) as { PublicIP: string }).PublicIP, host.underlayIP);
      assert.match(await ipn(host.ns, '-d', 'link', 'show', 'flannel.1'), /vxlan id 1 /);
      await waitFor(() => nsExec(host.ns, process.execPath, '-e', "fetch('http://127.0.0.1:8081/healthz').then(r=>process.exit(r.ok?0:1))").then(() => true), {
        timeoutMs: 20_000,
        what: "weftd's /healthz in the namespace",
      });
      // --ip-masq: the masquerade rules, read with the image's own iptables.
      assert.match(await podman.ok(['exec', name, 'iptables-save', '-t', 'nat']), /MASQUERADE/);

      // A peer's lease, in flannel's format: its FDB entry, neighbour and route on flannel.1.
      await c.etcdctl('put', `/coreos.com/network/subnets/${PEER.subnet}-24`,
        JSON.stringify({ PublicIP: PEER.ip, PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: PEER.mac } }));
      const programmed = async () => {
        const fdb = lines(await sh('bridge', ['-n', host.ns, 'fdb', 'show', 'dev', 'flannel.1']));
        const neigh = lines(await ipn(host.ns, 'neigh', 'show', 'dev', 'flannel.1'));
        const routes = lines(await ipn(host.ns, 'route', 'show', `${PEER.subnet}/24`)).map((l) => l.replace(/nhid \d+ /, ''));
        return {
          fdb: fdb.includes(`${PEER.mac} dst ${PEER.ip} self permanent`),
          neigh: neigh.includes(`${PEER.subnet} lladdr ${PEER.mac} PERMANENT`),
          route: routes.some((r) => r.startsWith(`${PEER.subnet}/24 via ${PEER.subnet} dev flannel.1`)),
        };
      };
      await waitFor(async () => Object.values(await programmed()).every(Boolean), { timeoutMs: 30_000, what: "the peer's vxlan entries" });
      await c.etcdctl('del', `/coreos.com/network/subnets/${PEER.subnet}-24`);
      await waitFor(async () => !Object.values(await programmed()).some(Boolean), { timeoutMs: 30_000, what: "the peer's entries removed" });

      // SIGTERM to weftd (PID 1 in the container): a clean exit well before podman's 20 s SIGKILL.
      const t0 = Date.now();
      await podman.ok(['stop', '--time', '20', name], 60_000);
      assert.equal(await exited, 0, output.split('\n').slice(-20).join('\n'));
      assert.ok(Date.now() - t0 < 15_000, `weftd took ${Date.now() - t0} ms to stop`);
      container = null;
    });
  });

  it('saves a docker-archive with both tags that loads into a fresh storage', async () => {
    const manifestJson = (await exec('tar', ['-xOf', archive, 'manifest.json'])).stdout;
    const entries = JSON.parse(manifestJson) as { RepoTags: string[]; Layers: string[] }[];
    assert.equal(entries.length, 1);
    assert.deepEqual(entries[0]!.RepoTags.sort(), [IMAGE, 'localhost/weft:latest'].sort());
    assert.equal(entries[0]!.Layers.length, 2, 'the Debian base layer and the weft layer');
    const fresh = new Podman(join(dir, 'storage-fresh'));
    try {
      await fresh.ok(['load', '--input', archive], 300_000);
      const tags = (await fresh.ok(['images', '--format', '{{.Repository}}:{{.Tag}}'])).trim().split('\n').sort();
      assert.deepEqual(tags, [IMAGE, 'localhost/weft:latest'].sort());
      assert.equal((await fresh.ok(['image', 'inspect', '--format', '{{.Id}}', 'localhost/weft:latest'])).trim(), imageId, 'the same image');
      assert.equal((await fresh.ok([...RUN, '--network', 'none', 'localhost/weft:latest', '--version'])).trim(), VERSION);
    } finally {
      await fresh.destroy();
    }
  });
});
