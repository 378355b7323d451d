// The flannel plugin's verb logic over fake delegates and a temp dataDir: what is stored, what the
// delegate receives, when state is kept or dropped, and which error codes come back.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { createFlannelPlugin, type Delegates } from '../../cni-plugins/flannel/verbs.js';
import { CniError, type CniCommand, type CniRequest, type CniResult } from '../../cni-plugins/skel/types.js';

interface Call {
  verb: string;
  type: string;
  stdin: string;
  containerId: string;
}

const RESULT: CniResult = {
  cniVersion: '1.0.0',
  interfaces: [{ name: 'cni0', mac: '02:00:00:00:00:01' }],
  ips: [{ interface: 0, address: '10.1.17.2/24', gateway: '10.1.17.1' }],
};

class FakeDelegates implements Delegates {
  calls: Call[] = [];
  failures = new Map<string, CniError>();

  private record(verb: string, req: CniRequest, type: string, stdin: string): void {
    this.calls.push({ verb, type, stdin, containerId: req.containerId });
    const f = this.failures.get(verb);
    if (f) throw f;
  }
  async add(req: CniRequest, type: string, stdin: string): Promise<CniResult> {
    this.record('add', req, type, stdin);
    return RESULT;
  }
  async del(req: CniRequest, type: string, stdin: string): Promise<void> {
    this.record('del', req, type, stdin);
  }
  async check(req: CniRequest, type: string, stdin: string): Promise<void> {
    this.record('check', req, type, stdin);
  }
  async gc(req: CniRequest, type: string, stdin: string): Promise<void> {
    this.record('gc', req, type, stdin);
  }
  async status(req: CniRequest, type: string, stdin: string): Promise<void> {
    this.record('status', req, type, stdin);
  }
}

const ENV_TEXT = 'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n';

describe('flannel CNI plugin (fake delegates)', () => {
  let root = '';
  let subnetFile = '';
  let dataDir = '';
  let fake: FakeDelegates;
  let plugin: ReturnType<typeof createFlannelPlugin>;

  function request(command: CniCommand, extra: Record<string, unknown> = {}, containerId = 'ctr1'): CniRequest {
    const config = { cniVersion: '1.0.0', name: 'cbr0', type: 'flannel', subnetFile, dataDir, ...extra };
    const stdin = JSON.stringify(config);
    return {
      command,
      containerId,
      netns: '/run/netns/x',
      ifname: 'eth0',
      args: new Map(),
      path: ['/opt/cni/bin'],
      stdin,
      config: JSON.parse(stdin) as CniRequest['config'],
      env: {},
    };
  }

  async function rejectsWith(p: Promise<unknown>, code: number, message: string | RegExp): Promise<void> {
    await assert.rejects(p, (e: unknown) => {
      assert.ok(e instanceof CniError, `expected CniError, got ${String(e)}`);
      assert.equal(e.code, code);
      if (typeof message === 'string') assert.equal(e.message, message);
      else assert.match(e.message, message);
      return true;
    });
  }

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'wt-flannel-plugin-'));
    subnetFile = join(root, 'subnet.env');
    dataDir = join(root, 'data', 'flannel');
    await writeFile(subnetFile, ENV_TEXT);
    fake = new FakeDelegates();
    plugin = createFlannelPlugin(fake);
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const EXPECTED_CONFIG =
    '{"cniVersion":"1.0.0","hairpinMode":true,"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],' +
    '"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},"isDefaultGateway":true,"isGateway":true,"mtu":1450,' +
    '"name":"cbr0","type":"bridge"}';
  const K8S = { delegate: { hairpinMode: true, isDefaultGateway: true } };

  it('ADD stores the delegate config (0600 in a 0700 dir) and returns the delegate result', async () => {
    const result = await plugin.add(request('ADD', K8S));
    assert.deepEqual(result, RESULT);
    assert.deepEqual(fake.calls, [{ verb: 'add', type: 'bridge', stdin: EXPECTED_CONFIG, containerId: 'ctr1' }]);
    assert.equal(await readFile(join(dataDir, 'ctr1'), 'utf8'), EXPECTED_CONFIG);
    assert.equal((await stat(join(dataDir, 'ctr1'))).mode & 0o777, 0o600);
    assert.equal((await stat(dataDir)).mode & 0o777, 0o700);
    assert.deepEqual(await readdir(dataDir), ['ctr1']);
  });

  it('ADD without subnet.env fails with code 11, calls no delegate and stores nothing', async () => {
    await rm(subnetFile);
    await rejectsWith(plugin.add(request('ADD')), 11, /^subnet file .*subnet\.env does not exist: weftd \(flanneld\)/);
    assert.deepEqual(fake.calls, []);
    await assert.rejects(stat(dataDir), { code: 'ENOENT' });
  });

  it('ADD with an invalid subnet.env fails with code 999 naming the variable', async () => {
    await writeFile(subnetFile, 'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPMASQ=true\n');
    await assert.rejects(plugin.add(request('ADD')), (e: unknown) => {
      assert.ok(e instanceof CniError);
      assert.equal(e.code, 999);
      assert.equal(e.message, `${subnetFile} is missing FLANNEL_MTU`);
      assert.equal(e.details, 'variables: FLANNEL_MTU');
      return true;
    });
  });

  it('ADD with a bad delegate key fails with code 7', async () => {
    await rejectsWith(
      plugin.add(request('ADD', { delegate: { name: 'x' } })),
      7,
      "'delegate' dictionary must not have 'name' field, it'll be set by flannel",
    );
    assert.deepEqual(fake.calls, []);
  });

  it('a failed delegate ADD is rolled back with a DEL of the same config and leaves no state', async () => {
    fake.failures.set('add', new CniError(11, 'busy', 'later'));
    await assert.rejects(plugin.add(request('ADD', K8S)), (e: unknown) => {
      assert.ok(e instanceof CniError);
      assert.equal(e.code, 11);
      assert.equal(e.message, 'failed to delegate add to bridge: busy');
      assert.equal(e.details, 'later');
      return true;
    });
    assert.deepEqual(
      fake.calls.map((c) => [c.verb, c.stdin]),
      [
        ['add', EXPECTED_CONFIG],
        ['del', EXPECTED_CONFIG],
      ],
    );
    assert.deepEqual(await readdir(dataDir), []);
  });

  it('when the rollback DEL fails too, the state stays for the runtime DEL, which replays it', async () => {
    fake.failures.set('add', new CniError(999, 'boom'));
    fake.failures.set('del', new CniError(999, 'still broken'));
    await rejectsWith(plugin.add(request('ADD', K8S)), 999, 'failed to delegate add to bridge: boom');
    assert.equal(await readFile(join(dataDir, 'ctr1'), 'utf8'), EXPECTED_CONFIG);

    fake.failures.clear();
    fake.calls = [];
    await plugin.del(request('DEL'));
    assert.deepEqual(fake.calls, [{ verb: 'del', type: 'bridge', stdin: EXPECTED_CONFIG, containerId: 'ctr1' }]);
    assert.deepEqual(await readdir(dataDir), []);
  });

  it('DEL replays the stored bytes (not the current config) and removes the state', async () => {
    await plugin.add(request('ADD', K8S));
    // The config and subnet.env changed since ADD: DEL must not care.
    await rm(subnetFile);
    fake.calls = [];
    await plugin.del(request('DEL', { delegate: { type: 'ipvlan' } }));
    assert.deepEqual(fake.calls, [{ verb: 'del', type: 'bridge', stdin: EXPECTED_CONFIG, containerId: 'ctr1' }]);
    assert.deepEqual(await readdir(dataDir), []);
  });

  it('DEL forwards the runtime prevResult when it has the same cniVersion as the stored config', async () => {
    await plugin.add(request('ADD', K8S));
    fake.calls = [];
    const prevResult = { cniVersion: '1.0.0', ips: [{ address: '10.1.17.2/24' }] };
    await plugin.del(request('DEL', { prevResult }));
    const sent = JSON.parse(fake.calls[0]!.stdin) as Record<string, unknown>;
    assert.deepEqual(sent.prevResult, prevResult);
    assert.deepEqual({ ...sent, prevResult: undefined }, { ...(JSON.parse(EXPECTED_CONFIG) as object), prevResult: undefined });
  });

  it('DEL without state, twice, or with an empty or corrupt state file succeeds', async () => {
    await plugin.del(request('DEL'));
    await plugin.del(request('DEL'));
    assert.deepEqual(fake.calls, []);

    await mkdir(dataDir, { recursive: true });
    await writeFile(join(dataDir, 'ctr1'), ''); // flannel#1662
    await writeFile(join(dataDir, 'ctr2'), '{"name":"x"}');
    await plugin.del(request('DEL'));
    await plugin.del(request('DEL', {}, 'ctr2'));
    assert.deepEqual(fake.calls, []);
    assert.deepEqual(await readdir(dataDir), []);
  });

  it('DEL only needs dataDir: a config that no longer validates does not block deletion', async () => {
    await plugin.add(request('ADD', K8S));
    fake.calls = [];
    await plugin.del(request('DEL', { delegate: { name: 'now invalid' }, ipam: 'junk' }));
    assert.equal(fake.calls.length, 1);
    assert.deepEqual(await readdir(dataDir), []);
  });

  it('a failed delegate DEL keeps the state so the retry replays it', async () => {
    await plugin.add(request('ADD', K8S));
    fake.failures.set('del', new CniError(999, 'netlink busy'));
    await rejectsWith(plugin.del(request('DEL')), 999, 'failed to delegate del to bridge: netlink busy');
    assert.deepEqual(await readdir(dataDir), ['ctr1']);
    fake.failures.clear();
    await plugin.del(request('DEL'));
    assert.deepEqual(await readdir(dataDir), []);
  });

  it('CHECK hands the stored config plus prevResult to the delegate', async () => {
    await plugin.add(request('ADD', K8S));
    fake.calls = [];
    const prevResult = { cniVersion: '1.0.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '10.1.17.2/24', interface: 0 }] };
    await plugin.check(request('CHECK', { prevResult }));
    assert.equal(fake.calls.length, 1);
    assert.equal(fake.calls[0]!.verb, 'check');
    assert.equal(
      fake.calls[0]!.stdin,
      EXPECTED_CONFIG.replace(
        '"name":"cbr0",',
        '"name":"cbr0","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],' +
          '"ips":[{"address":"10.1.17.2/24","interface":0}]},',
      ),
    );
  });

  it('CHECK without state is code 3; a delegate CHECK failure is passed on', async () => {
    await rejectsWith(plugin.check(request('CHECK')), 3, /^no flannel state for container ctr1 in /);
    await plugin.add(request('ADD', K8S));
    fake.failures.set('check', new CniError(999, 'veth gone'));
    await rejectsWith(plugin.check(request('CHECK')), 999, 'failed to delegate check to bridge: veth gone');
  });

  it('GC drops state of attachments not in valid-attachments and delegates GC with the list', async () => {
    for (const id of ['keep1', 'gone1', 'gone2']) await plugin.add(request('ADD', K8S, id));
    await writeFile(join(dataDir, '.gone3.tmp-1-abcd'), ''); // an interrupted write (a torn one is left: see cni-flannel-state)
    await writeFile(join(dataDir, 'README.txt~'), 'not ours');
    await mkdir(join(dataDir, 'subdir'));
    fake.calls = [];
    const valid = [{ containerID: 'keep1', ifname: 'eth0' }];
    await plugin.gc!(request('GC', { 'cni.dev/valid-attachments': valid }, ''));
    assert.deepEqual((await readdir(dataDir)).sort(), ['README.txt~', 'keep1', 'subdir']);
    assert.equal(fake.calls.length, 1);
    assert.equal(fake.calls[0]!.verb, 'gc');
    assert.equal(
      fake.calls[0]!.stdin,
      EXPECTED_CONFIG.replace(
        '{"cniVersion"',
        '{"cni.dev/valid-attachments":[{"containerID":"keep1","ifname":"eth0"}],"cniVersion"',
      ).replace(/"hairpinMode":true,|"isDefaultGateway":true,/g, ''),
    );
  });

  it('GC with an empty valid list drops all state; without a list it does nothing', async () => {
    await plugin.add(request('ADD', K8S));
    await plugin.gc!(request('GC', {}, ''));
    assert.deepEqual(await readdir(dataDir), ['ctr1']);
    await plugin.gc!(request('GC', { 'cni.dev/attachments': [] }, ''));
    assert.deepEqual(await readdir(dataDir), []);
    await rejectsWith(
      plugin.gc!(request('GC', { 'cni.dev/valid-attachments': [{ ifname: 'eth0' }] }, '')),
      7,
      'cni.dev/valid-attachments must be a list of {"containerID": string, "ifname": string}, got {"ifname":"eth0"}',
    );
  });

  it('STATUS is code 50 while subnet.env is missing or invalid, and asks the delegate otherwise', async () => {
    await rm(subnetFile);
    await rejectsWith(plugin.status!(request('STATUS', {}, '')), 50, /^subnet file .* does not exist: weftd/);
    await writeFile(subnetFile, 'FLANNEL_MTU=1450\n');
    await rejectsWith(
      plugin.status!(request('STATUS', {}, '')),
      50,
      `${subnetFile} is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_IPMASQ`,
    );
    assert.deepEqual(fake.calls, []);
    await writeFile(subnetFile, ENV_TEXT);
    await plugin.status!(request('STATUS', K8S, ''));
    assert.deepEqual(fake.calls, [{ verb: 'status', type: 'bridge', stdin: EXPECTED_CONFIG, containerId: '' }]);
    fake.failures.set('status', new CniError(50, 'bridge not ready'));
    await rejectsWith(plugin.status!(request('STATUS', K8S, '')), 50, 'failed to delegate status to bridge: bridge not ready');
  });
});
