// The CNI skeleton in-process: env rules, CNI_ARGS, error JSON, VERSION, verb gating by config
// version, result printing, prevResult, and in-process delegation. Messages and codes are the
// reference skel's (measured with Debian's 1.1.1 binaries where they agree with upstream HEAD).
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  DelegateLookupError,
  delegateAdd,
  delegateCheck,
  delegateDel,
  delegateGC,
  delegateStatus,
  findInPath,
  readBundleMarker,
  registerInProcess,
} from '../../cni-plugins/skel/delegate.js';
import { parseCniArgs, readCniEnv, splitCniPath, validateContainerId, validateInterfaceName } from '../../cni-plugins/skel/env.js';
import { invoke, parseRequest } from '../../cni-plugins/skel/run.js';
import { CniError, type CniPlugin, type CniRequest, type CniResult } from '../../cni-plugins/skel/types.js';
import { parseVersion, versionAtLeast } from '../../cni-plugins/skel/version.js';

const ALL = '["0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]';

function attachEnv(command: string, extra: Record<string, string> = {}): Record<string, string> {
  return { CNI_COMMAND: command, CNI_CONTAINERID: 'ctr1', CNI_NETNS: '/run/netns/wt-none', CNI_IFNAME: 'eth0', CNI_PATH: '/opt/cni/bin', ...extra };
}

function conf(version: string | undefined, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ ...(version === undefined ? {} : { cniVersion: version }), name: 'net1', type: 'fake', ...extra });
}

function errJSON(code: number, msg: string, details?: string): string {
  const o = details ? { code, msg, details } : { code, msg };
  return JSON.stringify(o, null, 4);
}

function throwsCni(fn: () => unknown, code: number, msg: string, details = ''): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof CniError, `expected CniError, got ${String(e)}`);
    assert.deepEqual([e.code, e.message, e.details], [code, msg, details]);
    return true;
  });
}

/** A plugin that records each request and returns a fixed result. */
class FakePlugin implements CniPlugin {
  readonly name = 'fake';
  readonly calls: CniRequest[] = [];
  fail: unknown = undefined;
  result: CniResult = {
    cniVersion: '1.1.0',
    interfaces: [{ name: 'eth0', mac: '0a:58:0a:01:00:05', mtu: 1450, sandbox: '/run/netns/wt-none' }],
    ips: [{ interface: 0, address: '10.1.0.5/16', gateway: '10.1.0.1' }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
  };
  constructor(readonly supportedVersions?: readonly string[]) {}
  private async record(req: CniRequest): Promise<void> {
    this.calls.push(req);
    // eslint-disable-next-line @typescript-eslint/only-throw-error -- tests make the plugin throw anything, a string included
    if (this.fail !== undefined) throw this.fail;
  }
  async add(req: CniRequest): Promise<CniResult> {
    await this.record(req);
    return this.result;
  }
  async del(req: CniRequest): Promise<void> {
    await this.record(req);
  }
  async check(req: CniRequest): Promise<void> {
    await this.record(req);
  }
  async gc(req: CniRequest): Promise<void> {
    await this.record(req);
  }
  async status(req: CniRequest): Promise<void> {
    await this.record(req);
  }
}

describe('cni skel', () => {
  describe('env', () => {
    it('lists every missing variable for ADD in the reference order and message', () => {
      throwsCni(() => readCniEnv({ CNI_COMMAND: 'ADD' }), 4, 'required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing');
      throwsCni(() => readCniEnv({}), 4, 'required env variables [CNI_COMMAND] missing');
      throwsCni(() => readCniEnv({ ...attachEnv('CHECK'), CNI_NETNS: '' }), 4, 'required env variables [CNI_NETNS] missing');
    });

    it('lets DEL go without CNI_NETNS, GC/STATUS need only CNI_PATH, VERSION nothing', () => {
      assert.equal(readCniEnv({ ...attachEnv('DEL'), CNI_NETNS: undefined }).netns, '');
      assert.deepEqual(readCniEnv({ CNI_COMMAND: 'GC', CNI_PATH: '/a', CNI_CONTAINERID: '-not-checked' }).containerId, '-not-checked');
      throwsCni(() => readCniEnv({ CNI_COMMAND: 'STATUS' }), 4, 'required env variables [CNI_PATH] missing');
      assert.equal(readCniEnv({ CNI_COMMAND: 'VERSION' }).command, 'VERSION');
    });

    it('validates CNI_CONTAINERID on the spot, before the missing-variable report', () => {
      throwsCni(() => readCniEnv({ CNI_COMMAND: 'ADD', CNI_CONTAINERID: '-bad' }), 4, 'invalid characters in containerID', '-bad');
      throwsCni(() => validateContainerId(''), 3, 'missing containerID');
      assert.doesNotThrow(() => validateContainerId('a1_b.c-d'));
    });

    it('applies the kernel interface-name rules to CNI_IFNAME', () => {
      validateInterfaceName('a23456789012345');
      const tooLong: [string, number, string, string] = [
        'a234567890123456',
        4,
        'interface name is too long',
        'interface name should be less than 16 characters',
      ];
      throwsCni(() => validateInterfaceName(tooLong[0]), tooLong[1], tooLong[2], tooLong[3]);
      // 8 two-byte characters: 16 bytes.
      throwsCni(() => validateInterfaceName('ääääääää'), 4, 'interface name is too long', 'interface name should be less than 16 characters');
      throwsCni(() => validateInterfaceName('..'), 4, 'interface name is . or ..');
      for (const bad of ['eth 0', 'a/b', 'a:b', 'a\tb', 'a\u00a0b', 'a\u0085b']) {
        throwsCni(() => validateInterfaceName(bad), 4, 'interface name contains / or : or whitespace characters');
      }
      throwsCni(() => readCniEnv(attachEnv('ADD', { CNI_IFNAME: 'eth0/' })), 4, 'interface name contains / or : or whitespace characters');
    });

    it('parses CNI_ARGS as the reference LoadArgs splits it', () => {
      assert.deepEqual(
        [...parseCniArgs('IgnoreUnknown=1;K8S_POD_NAME=web-0;IP=10.1.0.9;IP=10.1.0.7;E=')],
        [
          ['IgnoreUnknown', '1'],
          ['K8S_POD_NAME', 'web-0'],
          ['IP', '10.1.0.7'],
          ['E', ''],
        ],
      );
      assert.equal(parseCniArgs('').size, 0);
      throwsCni(() => parseCniArgs('a=b;c'), 999, 'ARGS: invalid pair "c"');
      throwsCni(() => parseCniArgs('a=b=c'), 999, 'ARGS: invalid pair "a=b=c"');
      throwsCni(() => parseCniArgs('a=b;'), 999, 'ARGS: invalid pair ""');
    });

    it('splits CNI_PATH and drops empty entries', () => {
      assert.deepEqual(splitCniPath('/opt/cni/bin::/usr/lib/cni:'), ['/opt/cni/bin', '/usr/lib/cni']);
      assert.deepEqual(splitCniPath(''), []);
    });

    it('compares versions as the reference ParseVersion does', () => {
      assert.deepEqual(parseVersion(''), [0, 1, 0]);
      assert.deepEqual(parseVersion('1'), [1, 0, 0]);
      assert.equal(versionAtLeast('0.10.0', '0.4.0'), true);
      assert.equal(versionAtLeast('0.3.1', '0.4.0'), false);
      throwsCni(() => parseVersion('1.2.3.4'), 6, 'invalid version "1.2.3.4": too many parts');
      throwsCni(() => parseVersion('1.x'), 6, 'failed to convert minor version part "x": strconv.Atoi: parsing "x": invalid syntax');
    });
  });

  describe('invoke', () => {
    it('VERSION prints the supported versions compactly with a newline and ignores stdin', async () => {
      const out = await invoke(new FakePlugin(), { CNI_COMMAND: 'VERSION' }, '{not json');
      assert.deepEqual(out, {
        exitCode: 0,
        stdout: '{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}\n',
        stderr: '',
      });
      const only = await invoke(new FakePlugin(['1.0.0']), { CNI_COMMAND: 'VERSION' }, '');
      assert.equal(only.stdout, '{"cniVersion":"1.1.0","supportedVersions":["1.0.0"]}\n');
    });

    it('without CNI_COMMAND prints the about text on stderr and succeeds (reference behaviour)', async () => {
      const out = await invoke(new FakePlugin(), {}, '');
      assert.equal(out.exitCode, 0);
      assert.equal(out.stdout, '');
      assert.match(out.stderr, /^CNI fake plugin \(weft [^)]+\)\nCNI protocol versions supported: 0\.3\.0, 0\.3\.1, 0\.4\.0, 1\.0\.0, 1\.1\.0\n$/);
    });

    it('prints env errors as the reference error JSON with exit status 1', async () => {
      const out = await invoke(new FakePlugin(), { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c', CNI_NETNS: '/x', CNI_PATH: '/p' }, conf('1.0.0'));
      assert.deepEqual(out, { exitCode: 1, stdout: errJSON(4, 'required env variables [CNI_IFNAME] missing'), stderr: '' });
    });

    it('bad stdin JSON → code 6; missing or bad name → code 7', async () => {
      const p = new FakePlugin();
      let jsonMsg = '';
      try {
        JSON.parse('{name');
      } catch (e) {
        jsonMsg = (e as Error).message;
      }
      assert.equal((await invoke(p, attachEnv('ADD'), '{name')).stdout, errJSON(6, `error unmarshall network config: ${jsonMsg}`));
      assert.equal((await invoke(p, attachEnv('ADD'), '[1]')).stdout, errJSON(6, 'error unmarshall network config: cannot unmarshal array into a network config object'));
      assert.equal((await invoke(p, attachEnv('ADD'), '{"cniVersion":"1.0.0"}')).stdout, errJSON(7, 'missing network name'));
      assert.equal((await invoke(p, attachEnv('ADD'), 'null')).stdout, errJSON(7, 'missing network name'));
      assert.equal((await invoke(p, attachEnv('DEL'), '{"name":"a b"}')).stdout, errJSON(7, 'invalid characters found in network name', 'a b'));
      assert.equal(p.calls.length, 0);
    });

    it('unknown CNI_COMMAND → code 4, after the stdin checks', async () => {
      const p = new FakePlugin();
      assert.equal((await invoke(p, attachEnv('FOO'), conf('1.0.0'))).stdout, errJSON(4, 'unknown CNI_COMMAND: FOO'));
      assert.equal((await invoke(p, attachEnv('FOO'), '{')).stdout.includes('"code": 6'), true);
    });

    it('ADD/DEL need the config version among the plugin versions (exact string)', async () => {
      const p = new FakePlugin();
      for (const [v, shown] of [
        ['9.9.9', '9.9.9'],
        ['0.2.0', '0.2.0'],
        ['1.0', '1.0'],
        [undefined, '0.1.0'],
      ] as const) {
        const out = await invoke(p, attachEnv('ADD'), conf(v));
        assert.deepEqual(out, { exitCode: 1, stdout: errJSON(1, 'incompatible CNI versions', `config is "${shown}", plugin supports ${ALL}`), stderr: '' });
      }
      const narrow = await invoke(new FakePlugin(['1.0.0']), attachEnv('DEL'), conf('0.4.0'));
      assert.equal(narrow.stdout, errJSON(1, 'incompatible CNI versions', 'config is "0.4.0", plugin supports ["1.0.0"]'));
      assert.equal(p.calls.length, 0);
    });

    it('gates CHECK at 0.4.0 and GC/STATUS at 1.1.0 with the reference messages', async () => {
      const p = new FakePlugin();
      const gcEnv = { CNI_COMMAND: 'GC', CNI_PATH: '/p' };
      const statusEnv = { CNI_COMMAND: 'STATUS', CNI_PATH: '/p' };
      assert.equal((await invoke(p, attachEnv('CHECK'), conf('0.3.1'))).stdout, errJSON(1, 'config version does not allow CHECK'));
      assert.equal((await invoke(p, attachEnv('CHECK'), conf('9.9.9'))).stdout, errJSON(1, 'plugin version does not allow CHECK'));
      assert.equal((await invoke(p, attachEnv('CHECK'), conf('1.0.5'))).stdout, errJSON(1, 'incompatible CNI versions', `config is "1.0.5", plugin supports ${ALL}`));
      assert.equal(
        (await invoke(p, attachEnv('CHECK'), conf('x.1'))).stdout,
        errJSON(6, 'failed to convert major version part "x": strconv.Atoi: parsing "x": invalid syntax'),
      );
      assert.equal((await invoke(p, gcEnv, conf('1.0.0'))).stdout, errJSON(1, 'config version does not allow GC'));
      assert.equal((await invoke(p, statusEnv, conf('0.4.0'))).stdout, errJSON(1, 'config version does not allow STATUS'));
      assert.equal((await invoke(new FakePlugin(['1.0.0']), gcEnv, conf('1.1.0'))).stdout, errJSON(1, 'plugin version does not allow GC'));
      assert.equal(p.calls.length, 0);

      for (const [env, v] of [
        [attachEnv('CHECK'), '0.4.0'],
        [gcEnv, '1.1.0'],
        [statusEnv, '1.1.0'],
      ] as const) {
        assert.deepEqual(await invoke(p, env, conf(v)), { exitCode: 0, stdout: '', stderr: '' });
      }
      assert.deepEqual(
        p.calls.map((c) => c.command),
        ['CHECK', 'GC', 'STATUS'],
      );
    });

    it('treats a missing gc/status handler as success', async () => {
      const bare: CniPlugin = {
        name: 'bare',
        add: () => Promise.reject(new Error('unused')),
        del: () => Promise.resolve(),
        check: () => Promise.resolve(),
      };
      assert.deepEqual(await invoke(bare, { CNI_COMMAND: 'GC', CNI_PATH: '/p' }, conf('1.1.0')), { exitCode: 0, stdout: '', stderr: '' });
      assert.deepEqual(await invoke(bare, { CNI_COMMAND: 'STATUS', CNI_PATH: '/p' }, conf('1.1.0')), { exitCode: 0, stdout: '', stderr: '' });
    });

    it('prints the ADD result converted to the config version', async () => {
      const p = new FakePlugin();
      const v04 = await invoke(p, attachEnv('ADD'), conf('0.4.0'));
      assert.equal(v04.exitCode, 0);
      assert.equal(
        v04.stdout,
        JSON.stringify(
          {
            cniVersion: '0.4.0',
            interfaces: [{ name: 'eth0', mac: '0a:58:0a:01:00:05', sandbox: '/run/netns/wt-none' }],
            ips: [{ version: '4', interface: 0, address: '10.1.0.5/16', gateway: '10.1.0.1' }],
            routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
            dns: {},
          },
          null,
          4,
        ),
      );
      const v11 = await invoke(p, attachEnv('ADD'), conf('1.1.0'));
      assert.equal(
        v11.stdout,
        JSON.stringify(
          {
            cniVersion: '1.1.0',
            interfaces: [{ name: 'eth0', mac: '0a:58:0a:01:00:05', mtu: 1450, sandbox: '/run/netns/wt-none' }],
            ips: [{ interface: 0, address: '10.1.0.5/16', gateway: '10.1.0.1' }],
            routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
          },
          null,
          4,
        ),
      );
      assert.deepEqual(await invoke(p, attachEnv('DEL'), conf('1.1.0')), { exitCode: 0, stdout: '', stderr: '' });
    });

    it('prints a CniError as is and anything else as code 999', async () => {
      const p = new FakePlugin();
      p.fail = new CniError(11, 'busy', 'try later');
      assert.deepEqual(await invoke(p, attachEnv('ADD'), conf('1.0.0')), { exitCode: 1, stdout: errJSON(11, 'busy', 'try later'), stderr: '' });
      p.fail = new Error('container veth name provided (eth0) already exists');
      assert.equal((await invoke(p, attachEnv('DEL'), conf('1.0.0'))).stdout, errJSON(999, 'container veth name provided (eth0) already exists'));
      p.fail = 'a string';
      assert.equal((await invoke(p, attachEnv('CHECK'), conf('1.0.0'))).stdout, errJSON(999, 'a string'));
      p.fail = undefined;
      p.result = { cniVersion: '1.1.0', ips: [{ address: 'nonsense' }] };
      const bad = await invoke(p, attachEnv('ADD'), conf('0.4.0'));
      assert.equal(bad.exitCode, 1);
      assert.equal(bad.stdout, errJSON(999, 'ips[0].address: invalid CIDR address: invalid CIDR "nonsense": missing "/prefix-length"'));
    });

    it('refuses ADD/DEL into its own netns unless CNI_NETNS_OVERRIDE is set', async () => {
      const p = new FakePlugin();
      const own = attachEnv('ADD', { CNI_NETNS: '/proc/self/ns/net' });
      assert.equal((await invoke(p, own, conf('1.0.0'))).stdout, errJSON(8, "plugin's netns and netns from CNI_NETNS should not be the same"));
      assert.equal((await invoke(p, { ...own, CNI_COMMAND: 'DEL' }, conf('1.0.0'))).stdout.includes('"code": 8'), true);
      assert.equal(p.calls.length, 0);
      assert.equal((await invoke(p, { ...own, CNI_NETNS_OVERRIDE: 'True' }, conf('1.0.0'))).exitCode, 0);
      assert.equal((await invoke(p, { ...own, CNI_COMMAND: 'CHECK' }, conf('1.0.0'))).exitCode, 0);
      assert.equal(p.calls.length, 2);
    });
  });

  describe('parseRequest', () => {
    it('builds the request from env and stdin', () => {
      const env = attachEnv('ADD', { CNI_ARGS: 'IgnoreUnknown=1;IP=10.1.0.9', CNI_PATH: '/a::/b', OTHER: 'kept' });
      const stdin = conf('1.0.0', { ipam: { type: 'host-local' } });
      const req = parseRequest(env, stdin);
      assert.equal(req.command, 'ADD');
      assert.equal(req.containerId, 'ctr1');
      assert.equal(req.netns, '/run/netns/wt-none');
      assert.equal(req.ifname, 'eth0');
      assert.deepEqual([...req.args], [
        ['IgnoreUnknown', '1'],
        ['IP', '10.1.0.9'],
      ]);
      assert.deepEqual(req.path, ['/a', '/b']);
      assert.equal(req.stdin, stdin);
      assert.deepEqual(req.config, { cniVersion: '1.0.0', name: 'net1', type: 'fake', ipam: { type: 'host-local' } });
      assert.equal(req.env.OTHER, 'kept');
    });

    it('converts prevResult of any version to the 1.1.0 shape; null means none', () => {
      const prev04 = { cniVersion: '0.4.0', ips: [{ version: '6', interface: 0, address: '2001:DB8::5/64' }], dns: {} };
      const req = parseRequest(attachEnv('CHECK'), conf('1.0.0', { prevResult: prev04 }));
      assert.deepEqual(req.config.prevResult, { cniVersion: '1.1.0', ips: [{ interface: 0, address: '2001:db8::5/64' }] });
      // No cniVersion in prevResult: the config's decides (here 0.4.0 drops the interface mtu).
      const noVer = parseRequest(attachEnv('DEL'), conf('0.4.0', { prevResult: { interfaces: [{ name: 'eth0', mtu: 1400 }] } }));
      assert.deepEqual(noVer.config.prevResult, { cniVersion: '1.1.0', interfaces: [{ name: 'eth0' }] });
      const none = parseRequest(attachEnv('DEL'), conf('1.0.0', { prevResult: null }));
      assert.equal('prevResult' in none.config, false);
      throwsCni(
        () => parseRequest(attachEnv('DEL'), conf('1.0.0', { prevResult: { ips: [{ address: '10.1.0.5' }] } })),
        999,
        'could not parse prevResult: ips[0].address: invalid CIDR address: invalid CIDR "10.1.0.5": missing "/prefix-length"',
      );
    });

    it('parses CNI_ARGS only for ADD/DEL/CHECK; a bad pair is the reference 999', () => {
      throwsCni(() => parseRequest(attachEnv('DEL', { CNI_ARGS: 'junk' }), conf('1.0.0')), 999, 'ARGS: invalid pair "junk"');
      const gc = parseRequest({ CNI_COMMAND: 'GC', CNI_PATH: '/p', CNI_ARGS: 'junk' }, conf('1.1.0'));
      assert.equal(gc.args.size, 0);
      assert.equal(gc.containerId, '');
    });

    it('rejects a non-string type or cniVersion as a decode failure', () => {
      throwsCni(() => parseRequest(attachEnv('ADD'), conf('1.0.0', { type: 5 })), 6, 'error unmarshall network config: "type" must be a string, got 5');
      throwsCni(
        () => parseRequest(attachEnv('ADD'), JSON.stringify({ cniVersion: 1, name: 'n' })),
        6,
        'decoding version from network config: "cniVersion" must be a string, got 1',
      );
    });
  });

  describe('delegation', () => {
    let dir: string;
    const echo = new FakePlugin();
    echo.result = { cniVersion: '1.1.0', interfaces: [{ name: 'eth0', mtu: 1400 }], ips: [{ address: '10.9.0.2/24', gateway: '10.9.0.1' }] };
    Object.defineProperty(echo, 'name', { value: 'weft-unit-echo' });

    before(() => {
      dir = mkdtempSync(join(tmpdir(), 'wt-cni-skel-'));
      mkdirSync(join(dir, 'a'));
      mkdirSync(join(dir, 'b'));
      mkdirSync(join(dir, 'a', 'is-a-dir'));
      // A weft bundle stand-in: the header the build writes, no code (it is never executed here).
      writeFileSync(join(dir, 'b', 'weft-unit-echo'), '#!/usr/bin/env -S -u NODE_EXTRA_CA_CERTS node\n// weft-cni-plugin: weft-unit-echo\n', { mode: 0o755 });
      writeFileSync(join(dir, 'a', 'noexec'), '', { mode: 0o644 });
      writeFileSync(join(dir, 'b', 'noexec'), '', { mode: 0o755 });
      writeFileSync(join(dir, 'b', 'is-a-dir'), '', { mode: 0o755 });
      writeFileSync(join(dir, 'b', 'other'), '#!/bin/false\n// not a weft bundle\n', { mode: 0o755 });
      chmodSync(join(dir, 'a', 'noexec'), 0o644);
      registerInProcess(echo);
    });

    after(() => rmSync(dir, { recursive: true, force: true }));

    it('finds the first regular executable along CNI_PATH and validates the name', () => {
      const path = [join(dir, 'missing'), join(dir, 'a'), join(dir, 'b')];
      assert.equal(findInPath('noexec', path), join(dir, 'b', 'noexec'));
      assert.equal(findInPath('is-a-dir', path), join(dir, 'b', 'is-a-dir'));
      for (const [type, msg] of [
        ['', 'no plugin name provided'],
        ['../b/other', 'invalid plugin name: ../b/other'],
        ['..', 'invalid plugin name: ..'],
        ['nope', `failed to find plugin "nope" in path [${path.join(' ')}]`],
      ]) {
        assert.throws(() => findInPath(type!, path), (e: unknown) => e instanceof DelegateLookupError && e.message === msg);
      }
      assert.throws(() => findInPath('other', []), (e: unknown) => e instanceof Error && e.message === 'no paths provided');
    });

    it('recognises weft bundles by their marker line', () => {
      assert.equal(readBundleMarker(join(dir, 'b', 'weft-unit-echo')), 'weft-unit-echo');
      assert.equal(readBundleMarker(join(dir, 'b', 'other')), null);
      assert.equal(readBundleMarker(join(dir, 'b', 'no-such-file')), null);
    });

    function request(command: string, version: string): CniRequest {
      return parseRequest(attachEnv(command, { CNI_PATH: `${join(dir, 'a')}:${join(dir, 'b')}`, CNI_ARGS: 'K=V' }), conf(version, { ipam: { type: 'weft-unit-echo' } }));
    }

    it('runs a registered weft bundle in-process with the verb set and the same env', async () => {
      echo.calls.length = 0;
      const req = request('ADD', '0.4.0');
      const result = await delegateAdd(req, 'weft-unit-echo', req.stdin);
      // Round-tripped through 0.4.0: the interface mtu is gone, as if printed and parsed back.
      assert.deepEqual(result, { cniVersion: '1.1.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '10.9.0.2/24', gateway: '10.9.0.1' }] });
      const del = request('ADD', '1.1.0'); // the verb comes from the delegate call, not the caller
      await delegateDel(del, 'weft-unit-echo', del.stdin);
      await delegateCheck(del, 'weft-unit-echo', del.stdin);
      await delegateGC(del, 'weft-unit-echo', del.stdin);
      await delegateStatus(del, 'weft-unit-echo', del.stdin);
      assert.deepEqual(
        echo.calls.map((c) => [c.command, c.env.CNI_COMMAND, c.containerId, c.args.get('K'), c.config.cniVersion]),
        [
          ['ADD', 'ADD', 'ctr1', 'V', '0.4.0'],
          ['DEL', 'DEL', 'ctr1', 'V', '1.1.0'],
          ['CHECK', 'CHECK', 'ctr1', 'V', '1.1.0'],
          ['GC', 'GC', 'ctr1', undefined, '1.1.0'],
          ['STATUS', 'STATUS', 'ctr1', undefined, '1.1.0'],
        ],
      );
    });

    it('passes the delegate error through with its own code and details', async () => {
      const req = request('ADD', '1.0.0');
      echo.fail = new CniError(7, 'bad ipam', 'range 0');
      await assert.rejects(delegateAdd(req, 'weft-unit-echo', req.stdin), (e: unknown) => e instanceof CniError && e.code === 7 && e.details === 'range 0');
      echo.fail = new Error('disk full');
      await assert.rejects(delegateDel(req, 'weft-unit-echo', req.stdin), (e: unknown) => e instanceof CniError && e.code === 999 && e.message === 'disk full');
      echo.fail = undefined;
      // The delegate applies its own checks: an unsupported version in the config it is given.
      const narrow = new FakePlugin(['1.0.0']);
      Object.defineProperty(narrow, 'name', { value: 'weft-unit-echo' });
      registerInProcess(narrow);
      try {
        const r11 = request('ADD', '1.1.0');
        await assert.rejects(
          delegateAdd(r11, 'weft-unit-echo', r11.stdin),
          (e: unknown) => e instanceof CniError && e.code === 1 && e.details === 'config is "1.1.0", plugin supports ["1.0.0"]',
        );
      } finally {
        registerInProcess(echo);
      }
    });
  });
});
