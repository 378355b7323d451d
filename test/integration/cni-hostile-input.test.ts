// Hostile input at every boundary where a name or value enters the CNI plugins, through the built
// bundles against real kernel objects in namespaces made here (issue 14). Each case is a value
// that, spliced into an `ip -batch` line or a path, would add a command (newline, CR), cut a line
// (`#`), open a quoted word, join lines (backslash), or be ambiguous to the kernel (control
// characters, Unicode spaces, `/`, `:`, `%`, overlong, empty); many carry a second command that
// would create a link (`evil…`) or, through `ip netns exec`, a file (the marker). Every case must:
//   - fail with the CNI error JSON and code the boundary promises, naming the field;
//   - execute nothing: no `evil…` link anywhere, no marker file;
//   - change nothing: links and addresses of every namespace, and the plugins' files, are as
//     before (for the bridge boundaries that is a live attachment, which must survive intact).
// Boundaries: CNI env (CNI_IFNAME, CNI_NETNS, CNI_CONTAINERID), stdin config (bridge names, the
// sriov deviceID), prevResult (interface names, sandboxes), sysfs names (sriov, fake tree),
// CNI_ARGS (the pod name and namespace weft-ovs records on the OVS port).
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cniBinDir, runCni, type CniRun, type RunCniOptions } from '../helpers/cni.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';
import { addNetns, delNetns, ipn, nsPrefix } from '../helpers/netns.js';

const PREFIX = nsPrefix('hx');
let seq = 0;
const namespaces: string[] = [];
let tmp = '';
let binDir = '';
let marker = '';

type Json = Record<string, unknown>;
type Verb = 'ADD' | 'CHECK' | 'DEL';

async function netns(tag: string): Promise<string> {
  const name = `${PREFIX}-${tag}${seq++}`;
  namespaces.push(name);
  return addNetns(name);
}

interface Hostile {
  readonly label: string;
  readonly value: string;
}

/**
 * Values that are not a name, for a boundary whose names go to `ip` in namespace `host`. The
 * second commands create `evil<N>` links or, run by `ip netns exec`, the marker file.
 */
function hostileNames(host: string, opts: { env?: boolean } = {}): Hostile[] {
  const out: Hostile[] = [
    { label: 'newline + netns exec touch', value: `x\nnetns exec ${host} touch ${marker}` },
    { label: 'newline + netns exec ip link add', value: `x\nnetns exec ${host} ip link add name evil5 type bridge` },
    { label: 'newline + link add', value: 'x\nlink add name evil0 type bridge' },
    { label: 'CR + link add', value: 'x\rlink add name evil1 type bridge' },
    { label: '"#" cuts the line', value: 'eth#0' },
    { label: 'double quote', value: '"eth0' },
    { label: 'single quote', value: "'eth0" },
    { label: 'trailing backslash joins the next line', value: 'eth0\\' },
    { label: 'backslash', value: 'et\\h0' },
    { label: '";"', value: 'eth0;x' },
    { label: 'SOH control', value: 'eth\x01' },
    { label: 'ESC sequence', value: 'e\x1b[2Jx' },
    { label: 'DEL', value: 'eth\x7f' },
    { label: 'C1 NEL', value: 'eth\u0085' },
    { label: 'tab', value: 'eth\t0' },
    { label: 'space', value: 'eth 0' },
    { label: 'NBSP', value: 'eth\u00a0' },
    { label: 'LINE SEPARATOR', value: 'eth\u2028' },
    { label: 'ZERO WIDTH SPACE', value: 'eth\u200b' },
    { label: 'overlong (16 bytes)', value: 'a'.repeat(16) },
    { label: 'overlong (8 x 2-byte chars)', value: 'é'.repeat(8) },
    { label: '"."', value: '.' },
    { label: '".."', value: '..' },
    { label: '"/"', value: 'a/b' },
    { label: '":"', value: 'a:b' },
    { label: 'kernel name template "%d"', value: 'net%d' },
    { label: 'byte 0xA0 (a space to the kernel)', value: 'à' },
  ];
  // Not expressible in an environment variable (execve strings end at NUL), only in JSON.
  if (!opts.env) out.push({ label: 'NUL', value: 'eth\u00000' }, { label: 'lone surrogate', value: 'eth\ud800' });
  return out;
}

// ---- observation ----

interface Snap {
  readonly namespaces: Record<string, unknown>;
  readonly files: Record<string, string[]>;
}

interface AddrJson {
  ifname: string;
  flags: string[];
  mtu: number;
  master?: string;
  address?: string;
  linkinfo?: { info_kind?: string };
  addr_info?: Array<{ local: string; prefixlen: number; scope: string }>;
}

/** Links and addresses, without what the kernel changes on its own (carrier, link-local addresses). */
async function nsState(ns: string): Promise<unknown> {
  const links = JSON.parse(await ipn(ns, '-j', '-d', 'address', 'show')) as AddrJson[];
  return links
    .map((l) => ({
      name: l.ifname,
      kind: l.linkinfo?.info_kind ?? null,
      up: l.flags.includes('UP'),
      mtu: l.mtu,
      master: l.master ?? null,
      mac: l.address ?? null,
      addrs: (l.addr_info ?? []).filter((a) => a.scope !== 'link').map((a) => `${a.local}/${a.prefixlen}`),
    }))
    .sort((a, b) => a.name.localeCompare(b.name));
}

function files(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .map((d) => `${join(d.parentPath, d.name).slice(dir.length + 1)}${d.isDirectory() ? '/' : ''}`)
    .sort();
}

async function snap(nss: readonly string[], dirs: readonly string[]): Promise<Snap> {
  const out: Snap = { namespaces: {}, files: {} };
  for (const ns of nss) out.namespaces[ns] = await nsState(ns);
  for (const d of dirs) out.files[d] = files(d);
  return out;
}

/** No link named evil… in any namespace of this run, and no marker file. */
async function nothingExecuted(): Promise<void> {
  assert.equal(existsSync(marker), false, `the marker ${marker} exists: an injected command ran`);
  for (const ns of namespaces) {
    const names = (JSON.parse(await ipn(ns, '-j', 'link', 'show')) as Array<{ ifname: string }>).map((l) => l.ifname);
    assert.deepEqual(
      names.filter((n) => n.startsWith('evil')),
      [],
      `injected links in ${ns}`,
    );
  }
}

interface Expect {
  readonly code: number;
  /** The message (msg + details) must match, e.g. name the field. */
  readonly msg: RegExp;
}

function assertSpecError(r: CniRun, e: Expect, what: string): void {
  assert.equal(r.exitCode, 1, `${what}: expected a failure, got exit ${r.exitCode}: ${r.stdout}${r.stderr}`);
  const j = r.json as { code?: unknown; msg?: unknown; details?: unknown } | undefined;
  assert.ok(j && typeof j.code === 'number' && typeof j.msg === 'string', `${what}: not a CNI error JSON: ${r.stdout}`);
  assert.deepEqual(Object.keys(j).filter((k) => !['code', 'msg', 'details'].includes(k)), [], `${what}: extra keys in ${r.stdout}`);
  assert.equal(j.code, e.code, `${what}: ${r.stdout}`);
  assert.match(`${j.msg} ${typeof j.details === 'string' ? j.details : ''}`, e.msg, `${what}: ${r.stdout}`);
}

/** Counts per boundary, printed at the end. */
const counts = new Map<string, number>();

interface Watch {
  readonly nss: readonly string[];
  readonly dirs: readonly string[];
}

/** Runs one hostile case: the error, nothing executed, nothing changed. */
async function hostileCase(boundary: string, what: string, w: Watch, run: () => Promise<CniRun>, e: Expect): Promise<void> {
  counts.set(boundary, (counts.get(boundary) ?? 0) + 1);
  const before = await snap(w.nss, w.dirs);
  const r = await run();
  assertSpecError(r, e, what);
  await nothingExecuted();
  assert.deepEqual(await snap(w.nss, w.dirs), before, `${what}: something changed`);
}

function withPrev(c: Json, prev: Json): Json {
  return { ...c, prevResult: prev };
}

describe('hostile input at the CNI boundaries (bundles, real kernel, own namespaces)', function () {
  this.timeout(600_000);

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'wt-hostile-'));
    marker = join(tmp, 'injected-command-ran');
    binDir = await cniBinDir();
    for (const b of ['bridge', 'host-local', 'weft-ovs', 'sriov']) assert.ok(existsSync(join(binDir, b)), `the ${b} bundle was not built`);
  });

  after(async () => {
    for (const n of namespaces) await delNetns(n);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    const total = [...counts.values()].reduce((a, b) => a + b, 0);
    process.stdout.write(`      hostile cases per boundary: ${[...counts].map(([k, v]) => `${k} ${v}`).join(', ')}; ${total} in all\n`);
  });

  // ---- the bridge plugin over a live attachment: env, stdin config, prevResult ----

  describe('bridge (a live attachment that every case must leave intact)', () => {
    let host = '';
    let pod = '';
    let dataDir = '';
    let conf: Json = {};
    let live: Json = {};
    let watch: Watch = { nss: [], dirs: [] };

    const bridge = (command: Verb, stdin: Json, o: Partial<RunCniOptions> = {}): Promise<CniRun> =>
      runCni({ bin: join(binDir, 'bridge'), path: binDir, command, hostNs: host, containerId: 'hx-live', ifname: 'eth0', netns: `/run/netns/${pod}`, ...o }, JSON.stringify(stdin));
    /** The config each verb gets: ADD without prevResult, CHECK and DEL with the live result. */
    const stdinFor = (verb: Verb, c: Json = conf): Json => (verb === 'ADD' ? c : withPrev(c, live));

    before(async () => {
      host = await netns('brh');
      pod = await netns('brp');
      dataDir = join(tmp, 'bridge-ipam');
      conf = { cniVersion: '1.0.0', name: 'hxnet', type: 'bridge', bridge: 'hxbr0', isGateway: true, ipam: { type: 'host-local', dataDir, ranges: [[{ subnet: '10.77.0.0/24' }]] } };
      const r = await bridge('ADD', conf);
      assert.equal(r.exitCode, 0, r.stdout);
      live = r.json as Json;
      assert.equal((await bridge('CHECK', withPrev(conf, live))).exitCode, 0);
      watch = { nss: [host, pod], dirs: [dataDir, tmp] };
    });

    after(async () => {
      // The attachment survived everything: CHECK passes, and a plain DEL removes it.
      const check = await bridge('CHECK', withPrev(conf, live));
      assert.equal(check.exitCode, 0, `the live attachment no longer checks out: ${check.stdout}`);
      assert.equal((await bridge('DEL', withPrev(conf, live))).exitCode, 0);
    });

    const verbs: readonly Verb[] = ['ADD', 'CHECK', 'DEL'];

    describe('CNI_IFNAME → code 4', () => {
      for (const verb of verbs) {
        it(`${verb}: every hostile interface name, and an empty one`, async () => {
          for (const h of [...hostileNames(host, { env: true }), { label: 'empty', value: '' }]) {
            await hostileCase('CNI_IFNAME', `${verb} CNI_IFNAME ${h.label}`, watch, () => bridge(verb, stdinFor(verb), { ifname: h.value }), {
              code: 4,
              msg: h.value === '' ? /required env variables \[CNI_IFNAME\] missing/ : /interface name/,
            });
          }
        });
      }
    });

    describe('CNI_CONTAINERID → code 4', () => {
      const ids = (): Hostile[] => [
        ...hostileNames(host, { env: true }).filter((h) => !/^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/.test(h.value)),
        { label: 'leading "-"', value: '-hx-live' },
        { label: 'leading "."', value: '.hx-live' },
        { label: 'shell metacharacters', value: 'hx-live$(touch x)' },
        { label: 'empty', value: '' },
      ];
      for (const verb of verbs) {
        it(`${verb}: every hostile container ID, and an empty one`, async () => {
          for (const h of ids()) {
            await hostileCase('CNI_CONTAINERID', `${verb} CNI_CONTAINERID ${h.label}`, watch, () => bridge(verb, stdinFor(verb), { containerId: h.value }), {
              code: 4,
              msg: h.value === '' ? /required env variables \[CNI_CONTAINERID\] missing/ : /invalid characters in containerID/,
            });
          }
        });
      }
    });

    describe('CNI_NETNS → code 4 (or the netns cannot be opened: 999)', () => {
      const paths = (): Array<Hostile & { code?: number }> => [
        { label: 'newline + netns exec touch', value: `/run/netns/${pod}\nnetns exec ${host} touch ${marker}` },
        { label: 'newline + link add', value: `/run/netns/${pod}\nlink add name evil2 type bridge` },
        { label: 'relative path', value: `run/netns/${pod}` },
        { label: 'SOH control', value: `/run/netns/${pod}\x01` },
        { label: 'ESC sequence', value: '/run/netns/\x1b[2J' },
        { label: 'tab', value: `/run/netns/\t${pod}` },
        { label: 'overlong (5000 bytes)', value: `/${'a'.repeat(4999)}` },
        // A path may hold these (the netns goes to programs as a file descriptor, never as text):
        // refused only because no such netns exists.
        { label: '"#", quotes, backslash, ";" (not a netns)', value: `/run/netns/${pod}#"'\\;`, code: 999 },
      ];
      for (const verb of ['ADD', 'CHECK'] as const) {
        it(`${verb}: every hostile netns path, and an empty one`, async () => {
          for (const h of [...paths(), { label: 'empty', value: '' }]) {
            const msg = h.value === '' ? /required env variables \[CNI_NETNS\] missing/ : 'code' in h ? /failed to open netns/ : /CNI_NETNS/;
            await hostileCase('CNI_NETNS', `${verb} CNI_NETNS ${h.label}`, watch, () => bridge(verb, stdinFor(verb), { netns: h.value }), { code: ('code' in h ? h.code : undefined) ?? 4, msg });
          }
        });
      }
      it('DEL: every netns path that is not one (a path that could be one would be a legitimate DEL)', async () => {
        for (const h of paths().filter((p) => !('code' in p))) {
          await hostileCase('CNI_NETNS', `DEL CNI_NETNS ${h.label}`, watch, () => bridge('DEL', stdinFor('DEL'), { netns: h.value }), { code: 4, msg: /CNI_NETNS/ });
        }
      });
    });

    describe('stdin config: the bridge name → code 7', () => {
      // DEL never names the bridge to ip (the pod end and IPAM identify the attachment).
      for (const verb of ['ADD', 'CHECK'] as const) {
        it(`${verb}: every hostile bridge name, and an empty one`, async () => {
          for (const h of [...hostileNames(host), { label: 'empty', value: '' }]) {
            await hostileCase('stdin config', `${verb} bridge ${h.label}`, watch, () => bridge(verb, stdinFor(verb, { ...conf, bridge: h.value })), { code: 7, msg: /bridge/ });
          }
        });
      }
      it('ADD: a VLAN gateway name <bridge>.<vlan> that is not an interface name', async () => {
        await hostileCase('stdin config', 'ADD vlan gateway name', watch, () => bridge('ADD', { ...conf, bridge: 'hxbr0123456', vlan: 4000 }), {
          code: 7,
          msg: /failed to create vlan interface: name "hxbr0123456\.4000" is not a valid interface name/,
        });
      });
    });

    describe('prevResult → code 999 "could not parse prevResult", naming the field', () => {
      const prevWith = (edit: (p: { interfaces: Json[] }) => void): Json => {
        const p = JSON.parse(JSON.stringify(live)) as { interfaces: Json[] };
        edit(p);
        return p;
      };
      for (const verb of verbs) {
        it(`${verb}: a host interface name from the attack (CHECK reads every host interface the result names)`, async () => {
          for (const h of hostileNames(host)) {
            const prev = prevWith((p) => (p.interfaces[1]!.name = h.value));
            await hostileCase('prevResult', `${verb} prevResult interfaces[1].name ${h.label}`, watch, () => bridge(verb, withPrev(conf, prev)), {
              code: 999,
              msg: /^could not parse prevResult: interfaces\[1\]\.name: invalid interface name /,
            });
          }
        });
        it(`${verb}: the bridge and the container interface names too, and sandbox paths`, async () => {
          const cases: Array<{ label: string; prev: Json; field: RegExp }> = [
            { label: 'bridge name, newline + link add', prev: prevWith((p) => (p.interfaces[0]!.name = 'hxbr0\nlink add name evil3 type bridge')), field: /interfaces\[0\]\.name/ },
            { label: 'container name, "#"', prev: prevWith((p) => (p.interfaces[2]!.name = 'eth0#')), field: /interfaces\[2\]\.name/ },
            { label: 'sandbox, newline + netns exec', prev: prevWith((p) => (p.interfaces[2]!.sandbox = `/run/netns/${pod}\nnetns exec ${host} touch ${marker}`)), field: /interfaces\[2\]\.sandbox/ },
            { label: 'sandbox, ESC sequence', prev: prevWith((p) => (p.interfaces[2]!.sandbox = '/run/netns/\x1b[2J')), field: /interfaces\[2\]\.sandbox/ },
            { label: 'sandbox, NUL', prev: prevWith((p) => (p.interfaces[2]!.sandbox = `/run/netns/${pod}\u0000`)), field: /interfaces\[2\]\.sandbox/ },
            { label: 'sandbox, overlong (5000 bytes)', prev: prevWith((p) => (p.interfaces[2]!.sandbox = `/${'s'.repeat(4999)}`)), field: /interfaces\[2\]\.sandbox/ },
          ];
          for (const c of cases) {
            await hostileCase('prevResult', `${verb} prevResult ${c.label}`, watch, () => bridge(verb, withPrev(conf, c.prev)), {
              code: 999,
              msg: new RegExp(`^could not parse prevResult: ${c.field.source}: invalid `),
            });
          }
        });
      }
    });
  });

  // ---- weft-ovs: its bridge key, and the pod identity it records as external_ids ----

  describe('weft-ovs (refused before IPAM, the veth or Open vSwitch)', () => {
    let host = '';
    let pod = '';
    let dataDir = '';
    let conf: Json = {};
    let watch: Watch = { nss: [], dirs: [] };
    const ovs = (command: Verb, stdin: Json, args = ''): Promise<CniRun> =>
      runCni(
        { bin: join(binDir, 'weft-ovs'), path: binDir, command, hostNs: host, containerId: 'hx-ovs', ifname: 'eth0', netns: `/run/netns/${pod}`, ...(args ? { args } : {}) },
        JSON.stringify(stdin),
      );

    before(async () => {
      host = await netns('ovh');
      pod = await netns('ovp');
      dataDir = join(tmp, 'ovs-ipam');
      conf = { cniVersion: '1.0.0', name: 'hxovs', type: 'weft-ovs', bridge: 'br-int', ovsRunDir: join(tmp, 'no-ovs'), ipam: { type: 'host-local', dataDir, ranges: [[{ subnet: '10.78.0.0/24' }]] } };
      watch = { nss: [host, pod], dirs: [dataDir, tmp] };
    });

    for (const verb of ['ADD', 'CHECK', 'DEL'] as const) {
      it(`stdin config, ${verb}: every hostile OVS bridge name → code 7`, async () => {
        for (const h of [...hostileNames(host), { label: 'empty', value: '' }]) {
          // '' is Go's zero value for a string key: the default bridge, a valid config.
          if (h.value === '') continue;
          await hostileCase('stdin config', `weft-ovs ${verb} bridge ${h.label}`, watch, () => ovs(verb, { ...conf, bridge: h.value }), { code: 7, msg: /'bridge' must be an interface name/ });
        }
      });
    }

    it('CNI_ARGS, ADD: K8S_POD_NAME and K8S_POD_NAMESPACE that are not Kubernetes names → code 4 (999 where they break the K=V;… grammar)', async () => {
      const bad: Array<{ label: string; value: string; code?: number }> = [
        { label: 'newline + netns exec touch', value: `web\nnetns exec ${host} touch ${marker}` },
        { label: 'double quote', value: 'web"0' },
        { label: 'backslash', value: 'web\\0' },
        { label: '"#"', value: 'web#0' },
        { label: 'ESC sequence', value: 'web\x1b[2J' },
        { label: 'space', value: 'web 0' },
        { label: 'upper case', value: 'Web-0' },
        { label: 'leading "-"', value: '-web' },
        { label: 'unicode', value: 'wéb' },
        { label: 'overlong (254)', value: 'w'.repeat(254) },
        { label: '";" ends the pair', value: 'web;x', code: 999 },
        { label: '"=" makes a pair of three', value: 'web=x', code: 999 },
      ];
      for (const key of ['K8S_POD_NAME', 'K8S_POD_NAMESPACE'] as const) {
        const list = key === 'K8S_POD_NAMESPACE' ? [...bad, { label: 'a dot (a subdomain, not a label)', value: 'kube.system' }, { label: 'overlong (64)', value: 'n'.repeat(64) }] : bad;
        for (const h of list) {
          const other = key === 'K8S_POD_NAME' ? 'K8S_POD_NAMESPACE=default' : 'K8S_POD_NAME=web-0';
          const args = `IgnoreUnknown=1;${other};${key}=${h.value}`;
          await hostileCase('CNI_ARGS', `weft-ovs ADD ${key} ${h.label}`, watch, () => ovs('ADD', conf, args), {
            code: h.code ?? 4,
            msg: h.code === 999 ? /ARGS: invalid pair/ : new RegExp(`invalid CNI_ARGS ${key} `),
          });
        }
      }
    });
  });

  // ---- sriov: names read from sysfs, and its config's names ----

  describe('sriov (the iproute2 bundle over a fake sysfs; veths stand in for the PF and VF)', () => {
    const PF_PCI = '0000:3b:00.0';
    const VF_PCI = '0000:3b:02.0';
    let host = '';
    let pod = '';
    let dataDir = '';
    let ipamDir = '';
    let n = 0;
    let watch: Watch = { nss: [], dirs: [] };

    const conf = (sysfsRoot: string, extra: Json = {}): Json => ({
      cniVersion: '1.0.0',
      name: 'hxsriov',
      type: 'sriov',
      deviceID: VF_PCI,
      sysfsRoot,
      dataDir,
      ipam: { type: 'host-local', dataDir: ipamDir, ranges: [[{ subnet: '10.79.0.0/24' }]] },
      ...extra,
    });
    const sriov = (command: Verb, stdin: Json): Promise<CniRun> =>
      runCni({ bin: join(binDir, 'sriov'), path: binDir, command, hostNs: host, containerId: 'hx-sriov', ifname: 'net1', netns: `/run/netns/${pod}` }, JSON.stringify(stdin));
    /** A fresh fake sysfs whose PF and VF netdevs are named as given. */
    const sysfs = (pf: string, vf: string): string => {
      const root = join(tmp, 'sysfs', String(n++));
      mkdirSync(root, { recursive: true });
      buildFakeSysfs(root, [{ pci: PF_PCI, netdev: pf, vfs: [{ pci: VF_PCI, netdev: vf, driver: 'iavf' }] }]);
      return root;
    };

    before(async () => {
      host = await netns('svh');
      pod = await netns('svp');
      dataDir = join(tmp, 'sriov-state');
      ipamDir = join(tmp, 'sriov-ipam');
      await ipn(host, 'link', 'add', 'wtpf0', 'type', 'veth', 'peer', 'name', 'wtvf0');
      await ipn(host, 'link', 'set', 'wtpf0', 'up');
      // sysfs trees are made per case under tmp/sysfs: watched apart from the plugin's own files.
      watch = { nss: [host, pod], dirs: [dataDir, ipamDir] };
    });

    // '.' and '..' cannot be directory entries, '/' and NUL not part of one.
    const sysfsNames = (): Hostile[] => hostileNames(host, { env: true }).filter((h) => !['.', '..'].includes(h.value) && !h.value.includes('/'));

    it('sysfs, ADD: a VF netdev directory named anything but a netdev name → 999, before the lock file', async () => {
      for (const h of sysfsNames()) {
        const root = sysfs('wtpf0', h.value);
        await hostileCase('sysfs names', `sriov ADD VF netdev ${h.label}`, watch, () => sriov('ADD', conf(root)), { code: 999, msg: /which is not a network device name/ });
      }
    });

    it('sysfs, ADD: a PF netdev directory named anything but a netdev name → 999', async () => {
      for (const h of sysfsNames()) {
        const root = sysfs(h.value, 'wtvf0');
        await hostileCase('sysfs names', `sriov ADD PF netdev ${h.label}`, watch, () => sriov('ADD', conf(root)), { code: 999, msg: /which is not a network device name/ });
      }
    });

    it('stdin config, ADD: a deviceID that is not a PCI address, an offload bridge that is not an interface name → code 7', async () => {
      const root = sysfs('wtpf0', 'wtvf0');
      const ids: Hostile[] = [
        { label: 'newline + link add', value: `${VF_PCI}\nlink add name evil4 type bridge` },
        { label: 'path traversal', value: '../../../../etc' },
        { label: '"#"', value: '0000:3b:02.0#' },
        { label: 'ESC sequence', value: '0000:3b:02.\x1b' },
        { label: 'overlong', value: `0000:3b:02.0${'0'.repeat(100)}` },
      ];
      for (const h of ids) {
        await hostileCase('stdin config', `sriov ADD deviceID ${h.label}`, watch, () => sriov('ADD', conf(root, { deviceID: h.value })), { code: 7, msg: /invalid PCI address/ });
      }
      for (const h of hostileNames(host)) {
        await hostileCase('stdin config', `sriov ADD ovs.bridge ${h.label}`, watch, () => sriov('ADD', conf(root, { ovs: { bridge: h.value } })), { code: 7, msg: /"bridge" must be an interface name/ });
      }
    });
  });
});
