// The sriov plugin's OVS offload step with a fake Open vSwitch (an OvsClient whose ovs-vsctl and
// ovs-ofctl calls land in an in-memory table) and fake links: the host interface name (Antrea's
// rule), the `ovs` config, what attach changes and in which order, that a failing attach leaves
// everything as it found it, detach with and without state, and CHECK.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Category, cookieOf } from '../../src/backend/ovs/pipeline.js';
import { OvsClient, OvsError, OvsUnreachableError } from '../../src/ovs/cli.js';
import { loadSriovConf } from '../../cni-plugins/sriov/config.js';
import { createOvsOffload, OffloadAttachError } from '../../cni-plugins/sriov/offload.js';
import type { OffloadLinks, RepresentorLink } from '../../cni-plugins/sriov/offload-links.js';
import { hostIfaceName, offloadSettings, podAddress } from '../../cni-plugins/sriov/offload-names.js';
import { decodeOffloadState } from '../../cni-plugins/sriov/offload-state.js';
import type { OffloadAttachContext } from '../../cni-plugins/sriov/deps.js';
import { CniError, type CniRequest, type CniResult, type NetConf } from '../../cni-plugins/skel/types.js';
import { buildFakeSysfs } from '../helpers/fake-sysfs.js';

const VF = '0000:3b:02.0';
const POD_MAC = '0a:58:0a:f4:01:64';
const CID = 'c0ffee0123456789';
const sha1 = (s: string) => createHash('sha1').update(s).digest('hex');

interface Iface {
  bridge: string;
  ofport: number;
  ids: Map<string, string>;
}

/** An in-memory OVSDB and flow table behind OvsClient's entry points. */
class FakeOvs extends OvsClient {
  readonly bridges = new Set(['br-int']);
  readonly ifaces = new Map<string, Iface>();
  readonly flows: string[] = [];
  readonly calls: string[] = [];
  unreachable = false;
  /** add-port fails with this (after the pre-checks passed). */
  addPortError: string | null = null;
  private nextOfport = 7;

  override async vsctl(args: readonly string[]): Promise<string> {
    this.calls.push(args.filter((a) => !a.startsWith('external_ids:')).join(' '));
    if (this.unreachable) throw new OvsUnreachableError(this.dbSocket, 'ovs-vsctl', `${this.dbSocket}: database connection failed (No such file or directory)`);
    const a = [...args];
    if (a[0] === 'list-br') return [...this.bridges].join('\n') + '\n';
    if (a[0] === '--may-exist' && a[1] === 'add-port') {
      const [bridge, name] = [a[2]!, a[3]!];
      if (!this.bridges.has(bridge)) throw new OvsError(this.dbSocket, 'ovs-vsctl', `ovs-vsctl: no bridge named ${bridge}`);
      if (this.addPortError) throw new OvsError(this.dbSocket, 'ovs-vsctl', this.addPortError);
      const ids = new Map<string, string>();
      for (const x of a.filter((s) => s.startsWith('external_ids:'))) {
        const m = /^external_ids:([^=]+)=(.*)$/.exec(x)!;
        ids.set(m[1]!, JSON.parse(m[2]!) as string);
      }
      this.ifaces.set(name, { bridge, ofport: this.ifaces.get(name)?.ofport ?? this.nextOfport++, ids });
      return '';
    }
    if (a[0] === 'get' && a[1] === 'interface') return `${this.ifaces.get(a[2]!)?.ofport ?? '[]'}\n`;
    if (a[0] === '--if-exists' && a[1] === 'get' && a[2] === 'bridge') return '';
    if (a[0] === '--format=json' && a[2] === 'find') {
      const want = a.slice(4).map((x) => /^external_ids:([^=]+)=(.*)$/.exec(x)!).map((m) => [m[1]!, JSON.parse(m[2]!) as string] as const);
      const data = [...this.ifaces].filter(([, i]) => want.every(([k, v]) => i.ids.get(k) === v)).map(([n, i]) => [n, i.ofport]);
      return JSON.stringify({ headings: ['name', 'ofport'], data });
    }
    if (a[0] === '--if-exists' && a[1] === 'del-port') {
      // `del-port <port>` or `del-port <bridge> <port>`: the port is the last argument.
      this.ifaces.delete(a[a.length - 1]!);
      return '';
    }
    if (a[0] === 'list-ports') return [...this.ifaces].filter(([, i]) => i.bridge === a[1]).map(([n]) => n).join('\n');
    if (a[0] === '--format=json' && a[2] === 'list') {
      const data = [...this.ifaces].map(([n, i]) => [n, i.ofport, ['map', [...i.ids]]]);
      return JSON.stringify({ headings: ['name', 'ofport', 'external_ids'], data });
    }
    throw new Error(`FakeOvs: unexpected ovs-vsctl ${a.join(' ')}`);
  }

  override async addFlows(_bridge: string, flows: string): Promise<string> {
    this.flows.push(...flows.split('\n').filter(Boolean));
    return '';
  }

  override async delFlowsByCookie(_bridge: string, cookie: bigint, mask: bigint): Promise<string> {
    const gone = this.flows.filter((f) => (BigInt(/cookie=(0x[0-9a-f]+)/.exec(f)![1]!) & mask) === (cookie & mask));
    for (const f of gone) this.flows.splice(this.flows.indexOf(f), 1);
    return '';
  }

  /** `add <flow>` and `delete cookie=C/M` lines, in order (as one bundle applies them). */
  override async bundleFlowMods(bridge: string, mods: string): Promise<string> {
    for (const line of mods.split('\n').filter(Boolean)) {
      const del = /^delete cookie=(0x[0-9a-f]+)\/(0x[0-9a-f]+)$/.exec(line);
      if (del) await this.delFlowsByCookie(bridge, BigInt(del[1]!), BigInt(del[2]!));
      else if (line.startsWith('add ')) this.flows.push(line.slice(4));
      else throw new Error(`FakeOvs: unexpected flow mod ${line}`);
    }
    return '';
  }
}

/** Host links by name, TX checksum per pod interface, and a log of every change. */
class FakeLinks implements OffloadLinks {
  readonly links = new Map<string, RepresentorLink>();
  readonly tx = new Map<string, boolean>();
  readonly log: string[] = [];
  renameError: string | null = null;

  async host(name: string): Promise<RepresentorLink | null> {
    return this.links.get(name) ?? null;
  }

  async rename(from: string, to: string, set: { arp: boolean; up: boolean }): Promise<RepresentorLink> {
    const l = this.links.get(from);
    if (!l) throw new Error(`Cannot find device "${from}"`);
    if (this.renameError) throw new Error(this.renameError);
    this.log.push(`rename ${from} ${to} arp=${set.arp ? 'on' : 'off'} ${set.up ? 'up' : 'down'}`);
    this.links.delete(from);
    const n = { name: to, mac: l.mac, up: set.up, arp: set.arp };
    this.links.set(to, n);
    return n;
  }

  async txChecksum(netns: string, ifname: string): Promise<boolean | null> {
    return this.tx.get(`${netns}/${ifname}`) ?? null;
  }

  async setTxChecksum(netns: string, ifname: string, on: boolean): Promise<void> {
    this.log.push(`tx ${ifname} ${on ? 'on' : 'off'}`);
    this.tx.set(`${netns}/${ifname}`, on);
  }
}

describe('sriov offload step (fake OVS and links)', () => {
  let root = '';
  let runDir = '';
  let sysfs = '';
  let ovs: FakeOvs;
  let links: FakeLinks;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'wt-sriov-offload-'));
    runDir = join(root, 'run');
    sysfs = join(root, 'sys');
    mkdirSync(runDir);
    buildFakeSysfs(sysfs, [
      { pci: '0000:3b:00.0', netdev: 'ens1f0', switchdev: { switchId: '6c2a0003e4b8', port: 0 }, vfs: [{ pci: VF, netdev: 'ens1f0v0', driver: 'mlx5_core', representor: 'pf0vf0' }] },
    ]);
    ovs = new FakeOvs({ runDir });
    links = new FakeLinks();
    links.links.set('pf0vf0', { name: 'pf0vf0', mac: '6e:11:22:33:44:55', up: false, arp: true });
    links.tx.set('/run/netns/pod/eth0', true);
  });

  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const hooks = () => createOvsOffload({ ovs: () => ovs, links });

  function config(ovsKey: Record<string, unknown> = {}, extra: Record<string, unknown> = {}): NetConf {
    return { cniVersion: '1.0.0', name: 'sriov-net', type: 'sriov', deviceID: VF, sysfsRoot: sysfs, dataDir: join(root, 'state'), ovs: { ovsRunDir: runDir, ...ovsKey }, ...extra };
  }

  function request(cfg: NetConf, over: Partial<CniRequest> = {}): CniRequest {
    return {
      command: 'ADD',
      containerId: CID,
      netns: '/run/netns/pod',
      ifname: 'eth0',
      args: new Map([['IgnoreUnknown', '1'], ['K8S_POD_NAME', 'frontend-7d9c8b5f6-x2x9q'], ['K8S_POD_NAMESPACE', 'shop']]),
      path: [],
      stdin: JSON.stringify(cfg),
      config: cfg,
      env: {},
      ...over,
    };
  }

  function attachCtx(cfg: NetConf, req = request(cfg)): OffloadAttachContext {
    const conf = loadSriovConf(cfg, req.args);
    return {
      req,
      conf,
      ovs: conf.ovs!,
      ports: { uplink: 'ens1f0', vfIndex: 0, representor: 'pf0vf0' },
      podInterface: { name: 'eth0', mac: POD_MAC, mtu: 1450, sandbox: '/run/netns/pod' },
      ips: [{ interface: 0, address: '10.244.1.100/24', gateway: '10.244.1.1' }],
    };
  }

  const HOST = `frontend-${sha1(CID).slice(0, 6)}`;

  describe('names, config, addressing', () => {
    it("names the host interface by Antrea's rule: 8 characters of the pod name, '-', 6 hex of sha1(container ID)", () => {
      assert.equal(hostIfaceName('frontend-7d9c8b5f6-x2x9q', CID, 'eth0'), HOST);
      assert.equal(HOST.length, 15);
      assert.equal(hostIfaceName('db', CID, 'eth0'), `db-${sha1(CID).slice(0, 6)}`);
      // A second interface of the same pod hashes its name in as well.
      assert.equal(hostIfaceName('frontend-7d9c8b5f6-x2x9q', CID, 'net1'), `frontend-${sha1(`${CID}net1`).slice(0, 6)}`);
      // Leading '-' trimmed; no usable pod name: the container ID stands in.
      assert.equal(hostIfaceName('--abcdefgh', CID, 'eth0'), `abcdef-${sha1(CID).slice(0, 6)}`);
      assert.equal(hostIfaceName(undefined, CID, 'eth0'), `c0ffee01-${sha1(CID).slice(0, 6)}`);
      assert.equal(hostIfaceName('a b', CID, 'eth0'), `c0ffee01-${sha1(CID).slice(0, 6)}`);
    });

    it('reads the ovs key with its defaults and refuses bad values (code 7)', () => {
      const load = (ovsKey: unknown) => loadSriovConf({ cniVersion: '1.0.0', name: 'n', type: 'sriov', deviceID: VF, ovs: ovsKey }, new Map()).ovs;
      assert.deepEqual(load({}), { bridge: 'br-int' });
      assert.deepEqual(offloadSettings(load({})!), { bridge: 'br-int', ovsRunDir: '/var/run/openvswitch', datapathType: 'system' });
      assert.deepEqual(load({ bridge: 'br-x', ovsRunDir: '/run/ovs/', datapathType: 'netdev' }), { bridge: 'br-x', ovsRunDir: '/run/ovs', datapathType: 'netdev' });
      const refused: Array<[unknown, string]> = [
        [{ ovsRunDir: 'run/ovs' }, 'invalid "ovs" config: "ovsRunDir" must be an absolute path, got "run/ovs"'],
        [{ datapathType: 'dpdk' }, 'invalid "ovs" config: "datapathType" must be "system" or "netdev", got "dpdk"'],
        [{ bridge: 'br int' }, 'invalid "ovs" config: "bridge" must be an interface name, got "br int"'],
        [{ ovsRunDir: 5 }, 'SRIOV-CNI failed to load netconf: LoadConf(): failed to load netconf: json: cannot unmarshal number 5 into Go struct field NetConf.ovs.ovsRunDir of type string'],
      ];
      for (const [o, msg] of refused) {
        assert.throws(
          () => load(o),
          (e: unknown) => e instanceof CniError && e.code === 7 && e.message === msg,
          JSON.stringify(o),
        );
      }
    });

    it("takes the pod's IPv4 address, and IPAM's gateway or else the subnet's first address", () => {
      const a = podAddress([{ address: 'fd00::5/64' }, { address: '10.244.1.100/24', gateway: '10.244.1.254' }]);
      assert.deepEqual([a?.ip.toString(), a?.gateway.toString()], ['10.244.1.100', '10.244.1.254']);
      const b = podAddress([{ address: '10.244.1.100/24' }]);
      assert.deepEqual([b?.ip.toString(), b?.gateway.toString()], ['10.244.1.100', '10.244.1.1']);
      assert.equal(podAddress([{ address: 'fd00::5/64' }]), null);
    });
  });

  describe('attach', () => {
    it('system datapath: renames the representor, sets it up, adds the port with the pod external_ids and 5 pod flows', async () => {
      const att = await hooks().attach(attachCtx(config()));
      assert.deepEqual(att.hostInterface, { name: HOST, mac: '6e:11:22:33:44:55' });
      assert.deepEqual(att.state, {
        representor: 'pf0vf0',
        hostIface: HOST,
        bridge: 'br-int',
        ovsRunDir: runDir,
        datapathType: 'system',
        wasUp: false,
        arpWasOn: true,
        txChecksumOff: false,
      });
      assert.deepEqual(links.log, [`rename pf0vf0 ${HOST} arp=on up`]);
      const port = ovs.ifaces.get(HOST)!;
      assert.equal(port.bridge, 'br-int');
      assert.deepEqual(Object.fromEntries(port.ids), {
        'weft-container-id': CID,
        'weft-ifname': 'eth0',
        'weft-ip': '10.244.1.100',
        'attached-mac': POD_MAC,
        'weft-pod-name': 'frontend-7d9c8b5f6-x2x9q',
        'weft-pod-namespace': 'shop',
      });
      const cookie = `cookie=0x${cookieOf(1, Category.Pod, port.ofport).toString(16)}`;
      assert.equal(ovs.flows.length, 5);
      assert.ok(ovs.flows.every((f) => f.startsWith(`${cookie},`)), ovs.flows.join('\n'));
      assert.ok(ovs.flows.some((f) => f.includes(`in_port=${port.ofport}`) && f.includes(`dl_src=${POD_MAC}`) && f.includes('nw_src=10.244.1.100')));
      // The bridge was checked before anything changed.
      assert.equal(ovs.calls[0], 'list-br');
    });

    it('netdev datapath: ARP off on the representor and TX checksum offload off on the VF in the pod', async () => {
      const att = await hooks().attach(attachCtx(config({ datapathType: 'netdev' })));
      assert.deepEqual(links.log, [`rename pf0vf0 ${HOST} arp=off up`, 'tx eth0 off']);
      assert.deepEqual([att.state.datapathType, att.state.txChecksumOff], ['netdev', true]);
    });

    it('a failing add-port leaves the representor, the VF and OVS as they were', async () => {
      ovs.addPortError = `ovs-vsctl: "--may-exist add-port br-int ${HOST}" but ${HOST} is actually attached to bridge br-phy`;
      await assert.rejects(hooks().attach(attachCtx(config({ datapathType: 'netdev' }))), (e: unknown) => {
        assert.ok(e instanceof OffloadAttachError);
        assert.deepEqual([e.code, e.message, e.details], [999, `failed to attach VF representor pf0vf0 to Open vSwitch bridge br-int: ovs-vsctl via ${runDir}/db.sock: ${ovs.addPortError}`, '']);
        return true;
      });
      assert.deepEqual(links.log, [`rename pf0vf0 ${HOST} arp=off up`, 'tx eth0 off', 'tx eth0 on', `rename ${HOST} pf0vf0 arp=on down`]);
      assert.deepEqual([...links.links.values()], [{ name: 'pf0vf0', mac: '6e:11:22:33:44:55', up: false, arp: true }]);
      assert.deepEqual([[...ovs.ifaces.keys()], ovs.flows], [[], []]);
    });

    it('a missing bridge, an unreachable OVS, a taken host name or a missing representor: refused before any change', async () => {
      const reject = async (cfg: NetConf, msg: string) => {
        await assert.rejects(hooks().attach(attachCtx(cfg)), (e: unknown) => e instanceof OffloadAttachError && e.code === 999 && e.message === msg);
      };
      const pre = 'failed to attach VF representor pf0vf0 to Open vSwitch bridge';
      await reject(config({ bridge: 'br-nope' }), `${pre} br-nope: bridge br-nope does not exist in ${runDir}/db.sock (has weftd started with the ovs backend?)`);
      ovs.unreachable = true;
      await reject(
        config(),
        `${pre} br-int: ovs-vsctl via ${runDir}/db.sock: Open vSwitch is not reachable (is ovsdb-server running with its socket at ${runDir}/db.sock?): ${runDir}/db.sock: database connection failed (No such file or directory)`,
      );
      ovs.unreachable = false;
      links.links.set(HOST, { name: HOST, mac: '02:00:00:00:00:09', up: true, arp: true });
      await reject(config(), `${pre} br-int: its host interface name ${HOST} is already taken by another link`);
      links.links.clear();
      await reject(config(), `${pre} br-int: the representor pf0vf0 is not in the host network namespace`);
      assert.deepEqual([links.log, [...ovs.ifaces.keys()]], [[], []]);
    });

    it('refuses an IPAM result without IPv4 (code 7)', async () => {
      const ctx = { ...attachCtx(config()), ips: [{ interface: 0, address: 'fd00::5/64' }] };
      await assert.rejects(hooks().attach(ctx), (e: unknown) => e instanceof OffloadAttachError && e.code === 7 && /need an IPv4 address from IPAM .* got fd00::5\/64$/.test(e.message));
    });
  });

  describe('detach and check', () => {
    it('with state: removes the flows and the port, renames the representor back, TX checksum back on; again is a no-op', async () => {
      const h = hooks();
      const cfg = config({ datapathType: 'netdev' });
      const att = await h.attach(attachCtx(cfg));
      const ofport = ovs.ifaces.get(HOST)!.ofport;
      ovs.flows.push(`cookie=0x${cookieOf(1, Category.Pod, ofport + 1).toString(16)}, table=0, priority=190,in_port=${ofport + 1} actions=drop`);
      links.log.length = 0;
      const del = { req: request(cfg, { command: 'DEL' }), deviceID: VF, state: att.state };
      await h.detach(del);
      assert.deepEqual([...ovs.ifaces.keys()], []);
      // Only this pod's flows went (by its cookie under OBJECT_MASK).
      assert.equal(ovs.flows.length, 1);
      assert.ok(ovs.flows[0]!.includes(`in_port=${ofport + 1}`));
      assert.deepEqual(links.log, ['tx eth0 on', `rename ${HOST} pf0vf0 arp=on down`]);
      links.log.length = 0;
      await h.detach(del);
      assert.deepEqual(links.log, ['tx eth0 on']);
    });

    it('without state: finds the port by container ID and ifname, and the representor name in sysfs', async () => {
      const h = hooks();
      const cfg = config();
      await h.attach(attachCtx(cfg));
      links.log.length = 0;
      await h.detach({ req: request(cfg, { command: 'DEL' }), deviceID: VF, state: null });
      assert.deepEqual([[...ovs.ifaces.keys()], ovs.flows], [[], []]);
      assert.deepEqual(links.log, [`rename ${HOST} pf0vf0 arp=on up`]);
      // A config without `ovs`, or one that does not load, leaves everything alone.
      await h.detach({ req: request({ cniVersion: '1.0.0', name: 'n', type: 'sriov' }, { command: 'DEL' }), deviceID: VF, state: null });
      assert.deepEqual(links.log, [`rename ${HOST} pf0vf0 arp=on up`]);
    });

    it('detach reports an unreachable OVS (DEL must be retried) but still renames the representor back', async () => {
      const h = hooks();
      const cfg = config();
      const att = await h.attach(attachCtx(cfg));
      ovs.unreachable = true;
      await assert.rejects(h.detach({ req: request(cfg, { command: 'DEL' }), deviceID: VF, state: att.state }), (e: unknown) => {
        assert.ok(e instanceof CniError);
        assert.match(e.message, new RegExp(`^failed to detach the VF representor of container ${CID} interface eth0: remove port ${HOST} and its flows from br-int: `));
        return true;
      });
      assert.deepEqual([...links.links.keys()], ['pf0vf0']);
    });

    it('CHECK: the port with the pod external_ids, matching prevResult; a mismatch or a missing port is an error', async () => {
      const h = hooks();
      const cfg = config();
      const att = await h.attach(attachCtx(cfg));
      const prev: CniResult = {
        cniVersion: '1.1.0',
        interfaces: [{ name: HOST, mac: '6e:11:22:33:44:55' }, { name: 'eth0', mac: POD_MAC, sandbox: '/run/netns/pod' }],
        ips: [{ interface: 1, address: '10.244.1.100/24', gateway: '10.244.1.1' }],
      };
      const checkWith = (p: CniResult) => h.check!({ req: request({ ...cfg, prevResult: p }, { command: 'CHECK' }), deviceID: VF, state: att.state });
      await checkWith(prev);
      await assert.rejects(checkWith({ ...prev, ips: [{ interface: 1, address: '10.244.1.101/24' }] }), {
        message: `Open vSwitch port ${HOST} carries IP 10.244.1.100, but prevResult has 10.244.1.101`,
      });
      ovs.ifaces.delete(HOST);
      await assert.rejects(checkWith(prev), { message: `no Open vSwitch port ${HOST} with the pod's external_ids on bridge br-int` });
    });

    it('decodes only a state with what detach needs', () => {
      assert.equal(decodeOffloadState(null), null);
      assert.equal(decodeOffloadState({ port: 'x' }), null);
      assert.deepEqual(decodeOffloadState({ representor: 'pf0vf0', hostIface: HOST, bridge: 'br-int', ovsRunDir: '/run/ovs' }), {
        representor: 'pf0vf0',
        hostIface: HOST,
        bridge: 'br-int',
        ovsRunDir: '/run/ovs',
        datapathType: 'system',
        wasUp: true,
        arpWasOn: true,
        txChecksumOff: false,
      });
    });
  });
});
