// `make demo` end to end: the demo script run as a child process, as `make demo` runs it (weft
// from source and CNI bundles freshly built from cni-plugins/, so the test sees the current
// code). Everything it makes lives in `weftdemo-*` namespaces and /run/weft-demo; the after hook
// removes whatever a failed run left behind.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { alive, demoNamespaces, ipn, removeDemo, STATE_DIR } from '../../demo/sys.js';
import { cniBinDir } from '../helpers/cni.js';
import { fromSource } from '../helpers/weftd.js';

const DEMO = fileURLToPath(new URL('../../demo/demo.ts', import.meta.url));
const POD_NAMES = ['n1-a', 'n1-b', 'n2-a', 'n2-b', 'n3-a', 'n3-b'];
const NODE_IPS = ['192.168.100.11', '192.168.100.12', '192.168.100.13'];

interface DemoRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs demo/demo.ts; after `timeoutMs` it gets SIGINT (it then removes what it made itself). */
function runDemo(args: readonly string[], timeoutMs = 120_000): Promise<DemoRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import=tsx', DEMO, ...args], {
      env: { ...process.env, WEFT_FROM_SOURCE: fromSource() },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGINT'), timeoutMs);
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

function show(r: DemoRun): string {
  return `exit ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;
}

/** The reachability grid: pod name → its address and its row of marks (one per column). */
function parseMatrix(stdout: string): Map<string, { ip: string; cells: string[] }> {
  const header = stdout.split('\n').find((l) => /^\s+from \\ to\s/.test(l));
  assert.ok(header, 'no matrix header in the output');
  assert.deepEqual(header.trim().split(/\s+/).slice(3), POD_NAMES);
  const rows = new Map<string, { ip: string; cells: string[] }>();
  for (const line of stdout.split('\n')) {
    const m = /^\s+(n\d-[ab]) (10\.244\.\d+\.\d+)\s+(\S.*)$/.exec(line);
    if (m) rows.set(m[1]!, { ip: m[2]!, cells: m[3]!.trim().split(/\s+/) });
  }
  return rows;
}

/** PIDs the demo printed for its weftd daemons and etcd. */
function daemonPids(stdout: string): number[] {
  return [...stdout.matchAll(/^\s+(?:n\d: pid|etcd \S+ \(pid) (\d+)/gm)].map((m) => Number(m[1]));
}

/** The Open vSwitch daemons the ovs demo printed when it started them: "n1: ovsdb-server 12, ovs-vswitchd 15". */
function ovsPids(stdout: string): Map<string, { ovsdbServer: number; vswitchd: number }> {
  const m = new Map<string, { ovsdbServer: number; vswitchd: number }>();
  for (const x of stdout.matchAll(/^\s+(n\d): ovsdb-server pid (\d+), ovs-vswitchd pid (\d+), OVS_RUNDIR=\/run\/weft-demo\/\1\/ovs\/run$/gm)) {
    m.set(x[1]!, { ovsdbServer: Number(x[2]), vswitchd: Number(x[3]) });
  }
  return m;
}

/** The names of the links in this (the machine's own) namespace. */
async function rootLinks(): Promise<string[]> {
  const out = await new Promise<string>((resolve, reject) => {
    execFile('ip', ['-j', 'link', 'show'], (err, stdout) => (err ? reject(new Error(err.message)) : resolve(stdout)));
  });
  return (JSON.parse(out) as { ifname: string }[]).map((l) => l.ifname).sort();
}

/**
 * What every backend must show: all `total` steps ✔, the grid all reachable with each pod in its
 * node's lease (subnet.env), the hostPort of n1-a from n2-a, masquerade to the "internet" from
 * every node, and the removal. Returns the grid.
 */
function assertProofs(r: DemoRun, total: number): Map<string, { ip: string; cells: string[] }> {
  const out = r.stdout;
  // Every numbered step finished with ✔.
  const steps = [...out.matchAll(new RegExp(`^\\[\\s*(\\d+)/${total}\\] .* … (✔|✘) \\d+\\.\\d\\ds$`, 'gm'))];
  assert.deepEqual(steps.map((m) => `${m[1]}${m[2]}`), Array.from({ length: total }, (_v, i) => `${i + 1}✔`), show(r));

  // Every pod's ADDs were served by its own node's weftd (the CNI server), none by the fallback.
  for (const n of [1, 2, 3]) {
    assert.ok(out.includes(`      ✔ n${n} (/run/weft-demo/n${n}/run/cni.sock): flannel ADD ok 2, portmap ADD ok 2\n`), `n${n}'s pods not served by its weftd\n${show(r)}`);
  }

  // Every pod reaches every other pod; the diagonal is the pod itself.
  const matrix = parseMatrix(out);
  assert.deepEqual([...matrix.keys()], POD_NAMES);
  POD_NAMES.forEach((name, i) => {
    const row = matrix.get(name)!;
    assert.deepEqual(row.cells, POD_NAMES.map((_p, j) => (i === j ? '·' : '✔')), `row ${name}`);
  });
  assert.match(out, /^\s+30\/30 pod pairs answer$/m);
  // Each pod's address lies in its node's lease (subnet.env), .2 and .3 for pods a and b.
  for (const n of [1, 2, 3]) {
    const subnet = new RegExp(`/run/weft-demo/n${n}/subnet.env:\\n\\s+FLANNEL_NETWORK=10\\.244\\.0\\.0/16\\n\\s+FLANNEL_SUBNET=(10\\.244\\.\\d+)\\.1/24\\n\\s+FLANNEL_MTU=1450\\n\\s+FLANNEL_IPMASQ=true\\n`).exec(out);
    assert.ok(subnet, `no subnet.env of n${n} in the output`);
    assert.equal(matrix.get(`n${n}-a`)!.ip, `${subnet[1]}.2`);
    assert.equal(matrix.get(`n${n}-b`)!.ip, `${subnet[1]}.3`);
  }

  // The hostPort of n1-a, from a pod on n2 (masqueraded by n2 on the way out).
  const n1a = matrix.get('n1-a')!.ip;
  const n2a = matrix.get('n2-a')!.ip;
  assert.ok(
    out.includes(`      ✔ hostPort n2-a (${n2a}) → 192.168.100.11:30080 (n1) → n1-a ${n1a}:8080; the pod saw the client as 192.168.100.12\n`),
    show(r),
  );

  // Pods reach the "internet" only through their node's masquerade.
  for (const n of [1, 2, 3]) {
    const ip = matrix.get(`n${n}-b`)!.ip;
    assert.ok(
      out.includes(`      ✔ masquerade n${n}-b (${ip}) → 203.0.113.1:80: the internet saw 192.168.100.1${n} = n${n}'s address\n`),
      show(r),
    );
  }
  assert.match(out, /^\s+stopped \d+ processes, deleted 11 namespaces, removed \/run\/weft-demo$/m);
  assert.match(out, /^demo passed in \d+\.\d\ds: /m);
  return matrix;
}

async function assertNothingLeft(pids: readonly number[]): Promise<void> {
  assert.deepEqual(await demoNamespaces(), []);
  assert.equal(existsSync(STATE_DIR), false, `${STATE_DIR} is still there`);
  assert.deepEqual(pids.filter(alive), [], 'demo processes still running');
}

describe('make demo (integration: namespaces, etcd, weftd, CNI plugins)', function () {
  this.timeout(300_000);
  let cniSource = '';
  let started = false;

  before(async function () {
    const left = await demoNamespaces();
    // A demo someone kept is not ours to remove.
    if (left.length > 0 || existsSync(STATE_DIR)) {
      throw new Error(`a demo is already there (${[...left, STATE_DIR].join(', ')}); remove it with \`make demo-clean\` first`);
    }
    cniSource = await cniBinDir();
  });

  after(async () => {
    if (started && ((await demoNamespaces()).length > 0 || existsSync(STATE_DIR))) await removeDemo();
  });

  it('builds the cluster, proves every path and removes everything', async () => {
    started = true;
    const r = await runDemo(['--cni-source', cniSource]);
    assert.equal(r.code, 0, show(r));
    const out = r.stdout;
    assertProofs(r, 13);

    // The lease table: one vxlan lease per node, with the node's underlay address.
    const leases = [...out.matchAll(/^\s+(10\.244\.\d+\.0\/24)\s+-\s+(192\.168\.100\.1\d)\s+vxlan\s+([0-9a-f:]{17})\s/gm)];
    assert.deepEqual(leases.map((m) => m[2]).sort(), NODE_IPS);

    const pids = daemonPids(out);
    assert.equal(pids.length, 4, 'expected the PIDs of etcd and three weftd in the output');
    await assertNothingLeft(pids);
  });

  it('--backend ovs: a private Open vSwitch per node, the same proofs, and OVS stopped last by PID', async () => {
    started = true;
    const linksBefore = await rootLinks();
    const r = await runDemo(['--backend', 'ovs', '--cni-source', cniSource], 90_000);
    assert.equal(r.code, 0, show(r));
    const out = r.stdout;
    assertProofs(r, 14);

    // Step 3 started the daemons and moved each node's eth0 onto br-phy.
    assert.match(out, /^\[ 3\/14\] Open vSwitch on n1, n2, n3: ovsdb-server \+ ovs-vswitchd \(netdev datapath\), eth0 onto br-phy … ✔/m);
    const ovs = ovsPids(out);
    assert.deepEqual([...ovs.keys()].sort(), ['n1', 'n2', 'n3'], show(r));
    assert.ok(out.includes('\n      /coreos.com/network/config = {"Network":"10.244.0.0/16","Backend":{"Type":"ovs","DatapathType":"netdev"}}\n'), show(r));
    assert.match(out, /^\[ 5\/14\] weftd on n1, n2, n3 \(ovs, --ip-masq\), each with 2 peers programmed … ✔/m);

    // One ovs lease per node, no VTEP MAC (the tunnel is flow-based), the node's underlay address.
    const leases = [...out.matchAll(/^\s+(10\.244\.\d+\.0\/24)\s+-\s+(192\.168\.100\.1\d)\s+ovs\s+-\s/gm)];
    assert.deepEqual(leases.map((m) => m[2]).sort(), NODE_IPS);
    // subnet.env tells the flannel plugin to delegate to weft-ovs, with the node's own OVS.
    for (const n of [1, 2, 3]) {
      assert.ok(
        out.includes(
          `        FLANNEL_IPMASQ=true\n        WEFT_BACKEND=ovs\n        WEFT_OVS_BRIDGE=br-int\n        WEFT_OVS_RUNDIR=/run/weft-demo/n${n}/ovs/run\n        WEFT_OVS_DATAPATH=netdev\n`,
        ),
        `subnet.env of n${n}: ${show(r)}`,
      );
    }
    assert.match(out, /^\s+\/run\/weft-demo\/n1\/cni\/bin, \/run\/weft-demo\/n2\/cni\/bin, \/run\/weft-demo\/n3\/cni\/bin: .*\bweft-ovs weft-ovs\.cjs$/m);

    // Removal: weftd, etcd and the servers first, then the six OVS daemons, named with the PIDs step 3 printed.
    assert.match(out, /^\[14\/14\] removing the demo: processes, then Open vSwitch \(by PID\), namespaces, state … ✔/m);
    const expected = ['n1', 'n2', 'n3'].map((n) => `${n}: ovsdb-server ${ovs.get(n)!.ovsdbServer}, ovs-vswitchd ${ovs.get(n)!.vswitchd}`).join('; ');
    assert.ok(out.includes(`      Open vSwitch went last, after the weftd using it: ${expected}\n`), show(r));

    const pids = daemonPids(out);
    assert.equal(pids.length, 4, 'expected the PIDs of etcd and three weftd in the output');
    await assertNothingLeft([...pids, ...[...ovs.values()].flatMap((o) => [o.ovsdbServer, o.vswitchd])]);
    // OVS's internal ports are persistent taps: they went with the node namespaces, none came to this one.
    assert.deepEqual(await rootLinks(), linksBefore);
  });

  it('--keep leaves a working demo (here host-gw), a second demo refuses to start, --clean removes it all', async () => {
    started = true;
    const kept = await runDemo(['--keep', '--backend', 'host-gw', '--cni-source', cniSource]);
    assert.equal(kept.code, 0, show(kept));
    assert.match(kept.stdout, /^\[13\/13\] keeping the demo \(--keep\) … ✔/m);
    const pids = daemonPids(kept.stdout);
    assert.equal(pids.length, 4, show(kept));
    assert.deepEqual(pids.filter((p) => !alive(p)), [], 'etcd and weftd keep running');
    assert.deepEqual(await demoNamespaces(), [
      'weftdemo-internet',
      'weftdemo-n1', 'weftdemo-n1-a', 'weftdemo-n1-b',
      'weftdemo-n2', 'weftdemo-n2-a', 'weftdemo-n2-b',
      'weftdemo-n3', 'weftdemo-n3-a', 'weftdemo-n3-b',
      'weftdemo-underlay',
    ]);
    // host-gw: n1 routes each peer's subnet via that peer's underlay address (weft's proto 88).
    const routes = JSON.parse(await ipn('weftdemo-n1', '-j', 'route', 'show', 'proto', '88')) as { gateway?: string; dev: string }[];
    assert.deepEqual(routes.map((x) => `${x.gateway} ${x.dev}`).sort(), ['192.168.100.12 eth0', '192.168.100.13 eth0']);

    // A kept demo blocks a new one (and the new one leaves it alone): step 1 fails, exit 1.
    const second = await runDemo(['--cni-source', cniSource]);
    assert.equal(second.code, 1, show(second));
    assert.match(second.stdout, /^\[ 1\/13\] preflight: .* … ✘/m);
    assert.match(second.stdout, /^demo FAILED after \d+\.\d\ds: step 1 \(preflight: root, programs, CNI bundles, no earlier demo\) failed: an earlier demo is still there \(weftdemo-internet, /m);
    assert.equal((await demoNamespaces()).length, 11);
    assert.deepEqual(pids.filter((p) => !alive(p)), []);

    const clean = await runDemo(['--clean']);
    assert.equal(clean.code, 0, show(clean));
    assert.match(clean.stdout, /^removed 11 namespaces, stopped \d+ processes, removed \/run\/weft-demo$/m);
    await assertNothingLeft(pids);

    const again = await runDemo(['--clean']);
    assert.equal(again.code, 0, show(again));
    assert.equal(again.stdout, 'no demo to remove\n');
  });

  it('rejects an unknown backend with exit 2 and changes nothing', async () => {
    const r = await runDemo(['--backend', 'udp']);
    assert.equal(r.code, 2, show(r));
    assert.match(r.stderr, /^--backend must be one of vxlan, host-gw, ovs, got "udp"$/m);
    assert.equal(r.stdout, '');
    assert.deepEqual(await demoNamespaces(), []);
  });
});
