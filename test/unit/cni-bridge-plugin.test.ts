// The bridge plugin's verbs in-process with fake IPAM delegates, on the paths that never reach the
// kernel: what is refused before anything is made, and what is delegated to IPAM.
import assert from 'node:assert/strict';
import { createBridgePlugin, gcAttachments, type IpamDelegates } from '../../cni-plugins/bridge/plugin.js';
import { invoke } from '../../cni-plugins/skel/run.js';
import type { CniRequest, CniResult } from '../../cni-plugins/skel/types.js';

interface Call {
  verb: string;
  type: string;
  command: string;
}

function fakeIpam(calls: Call[], fail: Partial<Record<string, Error>> = {}): IpamDelegates {
  const record = (verb: string) => async (req: CniRequest, type: string) => {
    calls.push({ verb, type, command: req.command });
    const e = fail[verb];
    if (e) throw e;
  };
  return {
    add: async (req: CniRequest, type: string): Promise<CniResult> => {
      await record('add')(req, type);
      return { cniVersion: '1.1.0', ips: [{ address: '10.1.0.5/24' }] };
    },
    del: record('del'),
    check: record('check'),
    gc: record('gc'),
    status: record('status'),
  };
}

const MISSING = '/run/netns/wt-bridge-unit-no-such-netns';

function env(command: string, extra: Record<string, string> = {}): Record<string, string> {
  return { CNI_COMMAND: command, CNI_CONTAINERID: 'c1', CNI_IFNAME: 'eth0', CNI_PATH: '/nonexistent', ...extra };
}

const CONF = { cniVersion: '1.1.0', name: 'net1', type: 'bridge', ipam: { type: 'fake-ipam' } };

describe('bridge plugin verbs (no kernel)', () => {
  it('ADD into a missing netns fails before IPAM or any link is touched', async () => {
    const calls: Call[] = [];
    const out = await invoke(createBridgePlugin({ ipam: fakeIpam(calls) }), env('ADD', { CNI_NETNS: MISSING }), JSON.stringify(CONF));
    assert.equal(out.exitCode, 1);
    assert.deepEqual(JSON.parse(out.stdout), {
      code: 999,
      msg: `failed to open netns "${MISSING}": failed to Statfs "${MISSING}": no such file or directory`,
    });
    assert.deepEqual(calls, []);
  });

  it('ADD with an invalid config fails with code 7 before anything', async () => {
    const calls: Call[] = [];
    const out = await invoke(
      createBridgePlugin({ ipam: fakeIpam(calls) }),
      env('ADD', { CNI_NETNS: MISSING }),
      JSON.stringify({ ...CONF, vlanTrunk: [{ minID: 5 }] }),
    );
    assert.deepEqual(JSON.parse(out.stdout), { code: 7, msg: 'minID and maxID should be configured simultaneously, maxID is missing' });
    assert.deepEqual(calls, []);
  });

  it('DEL without a netns only releases the IP (layer 3, no ipMasq)', async () => {
    const calls: Call[] = [];
    const plugin = createBridgePlugin({ ipam: fakeIpam(calls) });
    const out = await invoke(plugin, env('DEL'), JSON.stringify(CONF));
    assert.deepEqual(out, { exitCode: 0, stdout: '', stderr: '' });
    const gone = await invoke(plugin, env('DEL', { CNI_NETNS: MISSING }), JSON.stringify(CONF));
    assert.equal(gone.exitCode, 0);
    assert.deepEqual(calls, [
      { verb: 'del', type: 'fake-ipam', command: 'DEL' },
      { verb: 'del', type: 'fake-ipam', command: 'DEL' },
    ]);
  });

  it('DEL reports an IPAM failure', async () => {
    const calls: Call[] = [];
    const out = await invoke(createBridgePlugin({ ipam: fakeIpam(calls, { del: new Error('store unreadable') }) }), env('DEL'), JSON.stringify(CONF));
    assert.deepEqual(JSON.parse(out.stdout), { code: 999, msg: 'store unreadable' });
  });

  it('CHECK needs the netns before asking IPAM', async () => {
    const calls: Call[] = [];
    const out = await invoke(createBridgePlugin({ ipam: fakeIpam(calls) }), env('CHECK', { CNI_NETNS: MISSING }), JSON.stringify(CONF));
    assert.equal((JSON.parse(out.stdout) as { msg: string }).msg, `failed to open netns "${MISSING}": failed to Statfs "${MISSING}": no such file or directory`);
    assert.deepEqual(calls, []);
  });

  it('STATUS and GC (without a valid list) are IPAM STATUS and IPAM GC; nothing for layer 2', async () => {
    const calls: Call[] = [];
    const plugin = createBridgePlugin({ ipam: fakeIpam(calls) });
    const verbEnv = (c: string) => ({ CNI_COMMAND: c, CNI_PATH: '/nonexistent' });
    assert.equal((await invoke(plugin, verbEnv('STATUS'), JSON.stringify(CONF))).exitCode, 0);
    assert.equal((await invoke(plugin, verbEnv('GC'), JSON.stringify(CONF))).exitCode, 0);
    assert.equal((await invoke(plugin, verbEnv('STATUS'), JSON.stringify({ ...CONF, ipam: {} }))).exitCode, 0);
    assert.deepEqual(calls, [
      { verb: 'status', type: 'fake-ipam', command: 'STATUS' },
      { verb: 'gc', type: 'fake-ipam', command: 'GC' },
    ]);
  });

  it('reads the GC attachment list (new key, then the legacy one)', () => {
    assert.equal(gcAttachments({}), null);
    assert.deepEqual(gcAttachments({ 'cni.dev/valid-attachments': [{ containerID: 'a', ifname: 'eth0' }, { bogus: 1 }] }), [{ containerId: 'a', ifname: 'eth0' }]);
    assert.deepEqual(gcAttachments({ 'cni.dev/attachments': [{ containerID: 'b' }] }), [{ containerId: 'b', ifname: '' }]);
  });
});
