// host-local allocation order (pure iterator) and the plugin verbs on a temporary store: exact
// file bytes, round robin, exhaustion, rollback, requested IPs, DEL, CHECK and GC selection.
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { candidates } from '../../cni-plugins/host-local/allocator.js';
import { loadConfig, type RangeSet } from '../../cni-plugins/host-local/config.js';
import { hostLocalPlugin } from '../../cni-plugins/host-local/plugin.js';
import { invoke } from '../../cni-plugins/skel/run.js';
import type { CniCommand, CniResult, NetConf } from '../../cni-plugins/skel/types.js';
import { IPAddr } from '../../src/util/ip.js';

function set(...ranges: Record<string, unknown>[]): RangeSet {
  return loadConfig({ cniVersion: '1.0.0', name: 'n', type: 'x', ipam: { ranges: [ranges] } }).rangeSets[0]!;
}

function order(s: RangeSet, last: string | null): string[] {
  return [...candidates(s, last ? IPAddr.parse(last) : null)].map((c) => c.ip.toString());
}

describe('host-local allocation order', () => {
  it('starts at rangeStart and skips the gateway', () => {
    assert.deepEqual(order(set({ subnet: '10.0.0.0/29' }), null), ['10.0.0.2', '10.0.0.3', '10.0.0.4', '10.0.0.5', '10.0.0.6']);
    assert.deepEqual(order(set({ subnet: 'fd00::/125', gateway: 'fd00::5' }), null), ['fd00::1', 'fd00::2', 'fd00::3', 'fd00::4', 'fd00::6', 'fd00::7']);
  });

  it('continues after the last reserved IP and wraps, trying the last one last', () => {
    assert.deepEqual(order(set({ subnet: '10.0.0.0/29' }), '10.0.0.4'), ['10.0.0.5', '10.0.0.6', '10.0.0.2', '10.0.0.3', '10.0.0.4']);
  });

  it('ignores a last reserved IP outside the set', () => {
    assert.deepEqual(order(set({ subnet: '10.0.0.0/29' }), '10.9.0.4'), ['10.0.0.2', '10.0.0.3', '10.0.0.4', '10.0.0.5', '10.0.0.6']);
    assert.deepEqual(order(set({ subnet: '10.0.0.0/29', rangeStart: '10.0.0.3' }), '10.0.0.2'), ['10.0.0.3', '10.0.0.4', '10.0.0.5', '10.0.0.6']);
  });

  it('moves from a range end into the next range of the set and stops when back at its start (plugins#594)', () => {
    const s = set({ subnet: '10.1.2.0/30' }, { subnet: '10.1.3.0/30' });
    assert.deepEqual(order(s, null), ['10.1.2.2', '10.1.3.2']);
    assert.deepEqual(order(s, '10.1.2.2'), ['10.1.3.2', '10.1.2.2']);
    assert.deepEqual(order(s, '10.1.3.2'), ['10.1.2.2', '10.1.3.2']);
    const three = set({ subnet: '10.1.2.0/29', rangeEnd: '10.1.2.3' }, { subnet: '10.1.4.0/29', rangeStart: '10.1.4.5' }, { subnet: '10.1.6.0/30' });
    assert.deepEqual(order(three, '10.1.4.6'), ['10.1.6.2', '10.1.2.2', '10.1.2.3', '10.1.4.5', '10.1.4.6']);
  });

  it('hands out the network and broadcast address when rangeStart/rangeEnd include them, like the reference', () => {
    const s = set({ subnet: '10.1.2.0/30', rangeStart: '10.1.2.0', rangeEnd: '10.1.2.3' });
    assert.deepEqual(order(s, null), ['10.1.2.0', '10.1.2.2', '10.1.2.3']);
  });
});

interface Ctx {
  dir: string;
  conf(ipam?: Record<string, unknown>, extra?: Record<string, unknown>): NetConf;
}

interface CallOutput {
  exitCode: number;
  stdout: string;
  json: unknown;
}

/** One plugin run in-process through the skeleton (env + stdin → stdout + exit code). */
async function call(command: CniCommand, config: NetConf, containerId = 'c1', ifname = 'eth0', cniArgs = ''): Promise<CallOutput> {
  const env: Record<string, string> = {
    CNI_COMMAND: command,
    CNI_CONTAINERID: command === 'GC' ? '' : containerId,
    CNI_NETNS: command === 'ADD' || command === 'CHECK' ? '/run/netns/wt-hostlocal-none' : '',
    CNI_IFNAME: command === 'GC' ? '' : ifname,
    CNI_ARGS: cniArgs,
    CNI_PATH: '/usr/lib/cni',
  };
  const out = await invoke(hostLocalPlugin, env, JSON.stringify(config));
  return { ...out, json: out.stdout ? (JSON.parse(out.stdout) as unknown) : undefined };
}

async function add(config: NetConf, containerId = 'c1', ifname = 'eth0', cniArgs = ''): Promise<CniResult> {
  const out = await call('ADD', config, containerId, ifname, cniArgs);
  assert.equal(out.exitCode, 0, out.stdout);
  return out.json as CniResult;
}

async function addFails(config: NetConf, containerId: string, msg: string, cniArgs = '', code = 999): Promise<void> {
  const out = await call('ADD', config, containerId, 'eth0', cniArgs);
  assert.equal(out.exitCode, 1);
  assert.deepEqual(out.json, { code, msg });
}

/** A verb that prints nothing on success; returns the error JSON otherwise. */
async function quiet(command: CniCommand, config: NetConf, containerId = 'c1', ifname = 'eth0', cniArgs = ''): Promise<unknown> {
  const out = await call(command, config, containerId, ifname, cniArgs);
  if (out.exitCode === 0) assert.equal(out.stdout, '');
  return out.exitCode === 0 ? null : out.json;
}

function addresses(r: CniResult): string[] {
  return (r.ips ?? []).map((ip) => ip.address);
}

describe('host-local plugin on a temporary store', () => {
  let root: string;
  let n = 0;
  const ctx = (): Ctx => {
    const dir = join(root, `d${++n}`);
    return {
      dir,
      conf: (ipam = { subnet: '10.1.2.0/24' }, extra = {}) => ({
        cniVersion: '1.1.0',
        name: 'net1',
        type: 'bridge',
        ipam: { type: 'host-local', dataDir: dir, ...ipam },
        ...extra,
      }),
    };
  };
  const files = async (c: Ctx): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    for (const f of (await readdir(join(c.dir, 'net1'))).sort()) out[f] = await readFile(join(c.dir, 'net1', f), 'latin1');
    return out;
  };

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'wt-hostlocal-unit-'));
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('writes the reference store: "cid\\r\\nifname", last_reserved_ip.N, lock', async () => {
    const c = ctx();
    const r = await add(c.conf(), 'c1');
    assert.deepEqual(r, { cniVersion: '1.1.0', ips: [{ address: '10.1.2.2/24', gateway: '10.1.2.1' }] });
    assert.deepEqual(await files(c), { '10.1.2.2': 'c1\r\neth0', 'last_reserved_ip.0': '10.1.2.2', lock: '' });
    assert.equal((await stat(join(c.dir, 'net1', '10.1.2.2'))).mode & 0o777, 0o600);
    assert.equal((await stat(join(c.dir, 'net1', 'lock'))).mode & 0o777, 0o750 & ~process.umask());
    assert.equal((await stat(join(c.dir, 'net1'))).mode & 0o777, 0o755 & ~process.umask());
  });

  it('allocates round robin: a freed address is not reused before the range wraps', async () => {
    const c = ctx();
    const got: string[] = [];
    for (const cid of ['a1', 'a2', 'a3', 'a4', 'a5']) got.push(...addresses(await add(c.conf(), cid)));
    assert.deepEqual(got, ['10.1.2.2/24', '10.1.2.3/24', '10.1.2.4/24', '10.1.2.5/24', '10.1.2.6/24']);
    assert.equal(await quiet('DEL', c.conf(), 'a2'), null);
    assert.deepEqual(addresses(await add(c.conf(), 'a6')), ['10.1.2.7/24']);
  });

  it('wraps around to the start and finds the freed addresses, then reports exhaustion', async () => {
    const c = ctx();
    const conf = c.conf({ subnet: '10.1.2.0/29' });
    for (const cid of ['a1', 'a2', 'a3', 'a4', 'a5']) await add(conf, cid);
    assert.equal(await quiet('DEL', conf, 'a2'), null);
    assert.equal(await quiet('DEL', conf, 'a4'), null);
    assert.deepEqual(addresses(await add(conf, 'b1')), ['10.1.2.3/29']);
    assert.deepEqual(addresses(await add(conf, 'b2')), ['10.1.2.5/29']);
    await addFails(conf, 'b3', 'failed to allocate for range 0: no IP addresses available in range set: 10.1.2.1-10.1.2.6');
    assert.equal((await files(c))['last_reserved_ip.0'], '10.1.2.5');
  });

  it('terminates on an exhausted multi-range set whose last reserved IP is a range end', async () => {
    const c = ctx();
    const conf = c.conf({ ranges: [[{ subnet: '10.1.2.0/30' }, { subnet: '10.1.3.0/30' }]] });
    assert.deepEqual(addresses(await add(conf, 'a1')), ['10.1.2.2/30']);
    assert.deepEqual(addresses(await add(conf, 'a2')), ['10.1.3.2/30']);
    await addFails(conf, 'a3', 'failed to allocate for range 0: no IP addresses available in range set: 10.1.2.1-10.1.2.2,10.1.3.1-10.1.3.2');
  });

  it('gives one IP per range set (dual stack) and returns routes and dns', async () => {
    const c = ctx();
    const resolv = join(c.dir + '-resolv.conf');
    await writeFile(resolv, 'nameserver 10.96.0.10\nsearch svc.cluster.local cluster.local\noptions ndots:5\n');
    const conf = c.conf({
      ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: 'fd00:1::/64' }]],
      routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0', gw: 'fd00:1::1' }],
      resolvConf: resolv,
    });
    assert.deepEqual(await add(conf, 'c1'), {
      cniVersion: '1.1.0',
      ips: [
        { address: '10.1.2.2/24', gateway: '10.1.2.1' },
        { address: 'fd00:1::2/64', gateway: 'fd00:1::1' },
      ],
      routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0', gw: 'fd00:1::1' }],
      dns: { nameservers: ['10.96.0.10'], search: ['svc.cluster.local', 'cluster.local'], options: ['ndots:5'] },
    });
    assert.deepEqual(await files(c), {
      '10.1.2.2': 'c1\r\neth0',
      'fd00:1::2': 'c1\r\neth0',
      'last_reserved_ip.0': '10.1.2.2',
      'last_reserved_ip.1': 'fd00:1::2',
      lock: '',
    });
    await addFails(c.conf({ subnet: '10.1.2.0/24', resolvConf: join(c.dir, 'nope') }), 'c9', `open ${join(c.dir, 'nope')}: no such file or directory`);
  });

  it('releases what it reserved when a later range set is exhausted', async () => {
    const c = ctx();
    // fd00::/126 has fd00::2 and fd00::3 (fd00::1 is the gateway): the third ADD fails in set 1.
    const conf = c.conf({ ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: 'fd00::/126' }]] });
    await add(conf, 'c1');
    await add(conf, 'c2');
    await addFails(conf, 'c3', 'failed to allocate for range 1: no IP addresses available in range set: fd00::1-fd00::3');
    assert.deepEqual(await files(c), {
      '10.1.2.2': 'c1\r\neth0',
      '10.1.2.3': 'c2\r\neth0',
      'fd00::2': 'c1\r\neth0',
      'fd00::3': 'c2\r\neth0',
      'last_reserved_ip.0': '10.1.2.4',
      'last_reserved_ip.1': 'fd00::3',
      lock: '',
    });
  });

  it('refuses a second ADD of the same attachment but allows another ifname', async () => {
    const c = ctx();
    await add(c.conf(), 'c1');
    await addFails(c.conf(), 'c1', 'failed to allocate for range 0: 10.1.2.2 has been allocated to c1, duplicate allocation is not allowed');
    assert.deepEqual(addresses(await add(c.conf(), 'c1', 'net1')), ['10.1.2.3/24']);
  });

  it('reserves requested IPs and reports the reference errors', async () => {
    const c = ctx();
    assert.deepEqual(addresses(await add(c.conf(), 'c1', 'eth0', 'IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.1.2.7')), ['10.1.2.7/24']);
    assert.deepEqual(addresses(await add(c.conf({ subnet: '10.1.2.0/24' }, { runtimeConfig: { ips: ['10.1.2.9/24'] } }), 'c2')), ['10.1.2.9/24']);
    await addFails(c.conf(), 'c3', 'failed to allocate for range 0: requested ip 10.1.2.1 is subnet\'s gateway', 'IP=10.1.2.1');
    await addFails(
      c.conf(),
      'c3',
      'failed to allocate for range 0: requested IP address 10.1.2.7 is not available in range set 10.1.2.1-10.1.2.254',
      'IP=10.1.2.7',
    );
    await addFails(c.conf({ subnet: '10.1.2.0/24' }, { args: { cni: { ips: ['10.1.2.20', '10.1.2.21', '10.9.9.9'] } } }), 'c3', 'failed to allocate all requested IPs: 10.1.2.21 10.9.9.9');
    // The round-robin pointer still moves on a rolled-back ADD, as upstream; nothing of c3 is left.
    assert.deepEqual(await files(c), {
      '10.1.2.7': 'c1\r\neth0',
      '10.1.2.9': 'c2\r\neth0',
      'last_reserved_ip.0': '10.1.2.20',
      lock: '',
    });
    // CNI_ARGS without IgnoreUnknown is an error on ADD, as in the reference.
    await addFails(c.conf(), 'c4', 'ARGS: unknown args ["K8S_POD_NAME=p"]', 'K8S_POD_NAME=p');
  });

  it('DEL frees every IP of the attachment, is idempotent, and works with legacy CID-only files', async () => {
    const c = ctx();
    const conf = c.conf({ ranges: [[{ subnet: '10.1.2.0/24' }], [{ subnet: 'fd00::/64' }]] });
    await add(conf, 'c1');
    await add(conf, 'c1', 'net1');
    await add(conf, 'c2');
    assert.equal(await quiet('DEL', conf, 'c1'), null);
    assert.equal(await quiet('DEL', conf, 'c1'), null);
    assert.deepEqual(await files(c), {
      '10.1.2.3': 'c1\r\nnet1',
      '10.1.2.4': 'c2\r\neth0',
      'fd00::3': 'c1\r\nnet1',
      'fd00::4': 'c2\r\neth0',
      'last_reserved_ip.0': '10.1.2.4',
      'last_reserved_ip.1': 'fd00::4',
      lock: '',
    });
    // A legacy file (container ID only) goes when the attachment has no new-format file.
    await writeFile(join(c.dir, 'net1', '10.1.2.99'), 'c3\n');
    // DEL with CNI_ARGS the ADD would refuse, and with ranges that no longer validate, still frees.
    assert.equal(await quiet('DEL', c.conf({ subnet: '10.1.2.0/31' }), 'c3', 'eth0', 'X=1'), null);
    assert.equal((await files(c))['10.1.2.99'], undefined);
  });

  it('CHECK finds the reservation and compares prevResult', async () => {
    const c = ctx();
    const r = await add(c.conf(), 'c1');
    assert.equal(await quiet('CHECK', c.conf(), 'c1'), null);
    assert.equal(await quiet('CHECK', c.conf({ subnet: '10.1.2.0/24' }, { prevResult: r }), 'c1'), null);
    assert.deepEqual(await quiet('CHECK', c.conf(), 'c7'), { code: 999, msg: 'host-local: Failed to find address added by container c7' });
    const other: CniResult = { cniVersion: '1.1.0', ips: [{ address: '10.1.2.77/24', gateway: '10.1.2.1' }] };
    assert.deepEqual(await quiet('CHECK', c.conf({ subnet: '10.1.2.0/24' }, { prevResult: other }), 'c1'), {
      code: 999,
      msg: 'host-local: address 10.1.2.77 of container c1 (eth0) is not reserved for it',
    });
  });

  it('STATUS (spec 1.1) succeeds for a valid config and reports an invalid one as code 7', async () => {
    const c = ctx();
    assert.equal(await quiet('STATUS', c.conf()), null);
    assert.deepEqual(await quiet('STATUS', c.conf({ subnet: '10.1.2.0/31' })), {
      code: 7,
      msg: 'invalid range set 0: Network 10.1.2.0/31 too small to allocate from',
    });
  });

  describe('GC', () => {
    const gcConf = (c: Ctx, key: string, list: unknown): NetConf => c.conf({ subnet: '10.1.2.0/24' }, { [key]: list });
    const setup = async (c: Ctx): Promise<void> => {
      await add(c.conf(), 'c1');
      await add(c.conf(), 'c1', 'net1');
      await add(c.conf(), 'c2');
      await writeFile(join(c.dir, 'net1', '10.1.2.50'), 'old1');
      await writeFile(join(c.dir, 'net1', '10.1.2.51'), 'old2');
      await writeFile(join(c.dir, 'net1', 'notes.txt'), 'c9\r\neth0');
    };

    it('frees what no valid attachment owns, keeping lock, last_reserved_ip.* and foreign files', async () => {
      const c = ctx();
      await setup(c);
      const valid = [
        { containerID: 'c1', ifname: 'eth0' },
        { containerID: 'old1', ifname: 'eth0' },
      ];
      assert.equal(await quiet('GC', gcConf(c, 'cni.dev/valid-attachments', valid)), null);
      assert.deepEqual(await files(c), {
        '10.1.2.2': 'c1\r\neth0',
        '10.1.2.50': 'old1',
        'last_reserved_ip.0': '10.1.2.4',
        lock: '',
        'notes.txt': 'c9\r\neth0',
      });
    });

    it('treats an empty list as "nothing is valid" and accepts the legacy key', async () => {
      const c = ctx();
      await setup(c);
      assert.equal(await quiet('GC', gcConf(c, 'cni.dev/attachments', [])), null);
      assert.deepEqual(Object.keys(await files(c)), ['last_reserved_ip.0', 'lock', 'notes.txt']);
    });

    it('does nothing without a list and rejects a malformed one', async () => {
      const c = ctx();
      await setup(c);
      const before = await files(c);
      assert.equal(await quiet('GC', c.conf()), null);
      assert.deepEqual(await files(c), before);
      assert.deepEqual(await quiet('GC', gcConf(c, 'cni.dev/valid-attachments', [{ containerID: 'c1' }])), {
        code: 7,
        msg: 'cni.dev/valid-attachments must be a list of {"containerID": string, "ifname": string}',
      });
      assert.deepEqual(await files(c), before);
    });
  });
});
