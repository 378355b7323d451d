// bin/weftd processes with the alloc backend against one real etcd: leases, subnet.env,
// health and metrics endpoints, clean shutdown, restarts and bad input.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Etcd3 } from 'etcd3';
import { EtcdServer, freePort } from '../helpers/etcd.js';
import { waitFor } from '../helpers/wait.js';
import { WeftdProcess } from '../helpers/weftd.js';
import { httpGet } from '../helpers/http.js';

const LO_MTU = Number(readFileSync('/sys/class/net/lo/mtu', 'utf8'));
// One exposition line: `name{labels} value` (comments and blank lines aside).
const PROM_LINE = /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? -?([0-9.e+-]+|NaN|\+Inf|-Inf)$/;

describe('weftd daemons against etcd', function () {
  this.timeout(180_000);
  let etcd: EtcdServer;
  let client: Etcd3;
  let dir: string;
  const procs: WeftdProcess[] = [];
  let n = 0;
  let prefix = '';

  before(async () => {
    etcd = await EtcdServer.start();
    client = new Etcd3({ hosts: etcd.endpoint });
    dir = mkdtempSync(join(tmpdir(), 'weft-daemon-'));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    client.close();
    await etcd.destroy();
    rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(async () => {
    prefix = `/d${++n}/coreos.com/network`;
    await client.put(`${prefix}/config`).value('{"Network":"10.6.0.0/16","Backend":{"Type":"alloc"}}');
  });

  function weftd(args: string[]): WeftdProcess {
    const p = WeftdProcess.start(['--etcd-endpoints', etcd.endpoint, '--etcd-prefix', prefix, '--iface', 'lo', ...args]);
    procs.push(p);
    return p;
  }
  const leases = async () => client.getAll().prefix(`${prefix}/subnets/`).strings();

  it('runs 20 daemons with distinct leases, correct subnet.env files, /readyz and /metrics', async () => {
    const nodes = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const port = await freePort();
        const subnetFile = join(dir, `n${i}`, 'subnet.env');
        const ip = `10.20.0.${i + 1}`;
        const proc = weftd(['--public-ip', ip, '--subnet-file', subnetFile, '--healthz-ip', '127.0.0.1', '--healthz-port', String(port)]);
        return { port, subnetFile, ip, proc };
      }),
    );
    for (const node of nodes) {
      // 20 daemons starting at once on 2 cores: a generous deadline, and their output if it passes.
      await waitFor(async () => (await httpGet(node.port, '/readyz'))?.status === 200, {
        timeoutMs: 120_000,
        what: `readyz of ${node.ip}`,
      }).catch((e: Error) => {
        throw new Error(`${e.message}; its output:\n${node.proc.output}`);
      });
    }
    const stored = await leases();
    assert.equal(Object.keys(stored).length, 20);
    const byIP = new Map<string, string>();
    for (const [key, value] of Object.entries(stored)) {
      const ip = (JSON.parse(value) as { PublicIP: string }).PublicIP;
      byIP.set(ip, key.slice(key.lastIndexOf('/') + 1));
    }
    assert.equal(new Set(byIP.values()).size, 20, 'distinct subnets');
    for (const node of nodes) {
      const key = byIP.get(node.ip);
      assert.ok(key, `a lease for ${node.ip}`);
      const net = key.replace(/-24$/, '');
      const gw = net.replace(/\.0$/, '.1');
      assert.equal(
        readFileSync(node.subnetFile, 'utf8'),
        `FLANNEL_NETWORK=10.6.0.0/16\nFLANNEL_SUBNET=${gw}/24\nFLANNEL_MTU=${LO_MTU}\nFLANNEL_IPMASQ=false\n`,
      );
      assert.deepEqual(await httpGet(node.port, '/healthz'), { status: 200, body: 'weftd is running' });
    }
    // Every daemon learns its 19 peers.
    for (const node of nodes) {
      await waitFor(async () => /^weft_peers 19$/m.test((await httpGet(node.port, '/metrics'))?.body ?? ''), {
        timeoutMs: 30_000,
        what: `19 peers at ${node.ip}`,
      });
    }
    const metrics = (await httpGet(nodes[0]!.port, '/metrics'))!;
    assert.equal(metrics.status, 200);
    for (const line of metrics.body.split('\n')) {
      if (line === '' || line.startsWith('#')) continue;
      assert.match(line, PROM_LINE);
    }
    assert.match(metrics.body, /^weft_ready 1$/m);
    assert.match(metrics.body, /^weft_lease_acquisitions_total\{how="new"\} 1$/m);
    assert.match(metrics.body, /^weft_lease_events_received_total\{type="added"\} 19$/m);
    const expiry = Number(/^weft_lease_expiration_timestamp_seconds (\S+)$/m.exec(metrics.body)![1]);
    assert.ok(Math.abs(expiry - (Date.now() / 1000 + 86400)) < 120, 'lease expires in 24 h');

    // SIGTERM: exit 0, and the lease and subnet.env stay.
    const results = await Promise.all(nodes.map((node) => node.proc.stop()));
    assert.deepEqual(new Set(results.map((r) => r.code)), new Set([0]));
    assert.equal(Object.keys(await leases()).length, 20);
    for (const node of nodes) assert.ok(existsSync(node.subnetFile));

    // A restarted daemon keeps its subnet.
    const again = weftd(['--public-ip', nodes[3]!.ip, '--subnet-file', nodes[3]!.subnetFile, '--healthz-ip', '127.0.0.1', '--healthz-port', String(nodes[3]!.port)]);
    await waitFor(async () => (await httpGet(nodes[3]!.port, '/readyz'))?.status === 200, { timeoutMs: 30_000, what: 'restarted daemon ready' });
    const m = (await httpGet(nodes[3]!.port, '/metrics'))!.body;
    assert.match(m, /^weft_lease_acquisitions_total\{how="reuse"\} 1$/m);
    assert.equal(readFileSync(nodes[3]!.subnetFile, 'utf8').split('\n')[1], `FLANNEL_SUBNET=${byIP.get(nodes[3]!.ip)!.replace(/\.0-24$/, '.1/24')}`);
    assert.equal((await again.stop()).code, 0, again.output);
  });

  it('waits for a missing network config and starts once it is written', async () => {
    await client.delete().key(`${prefix}/config`);
    const port = await freePort();
    const subnetFile = join(dir, `late${n}`, 'subnet.env');
    const p = weftd(['--public-ip', '10.21.0.1', '--subnet-file', subnetFile, '--healthz-ip', '127.0.0.1', '--healthz-port', String(port)]);
    await waitFor(() => /waiting for the network config.*not found in etcd at \/d\d+\/coreos.com\/network\/config/.test(p.output), { timeoutMs: 30_000, what: 'the waiting message' });
    assert.equal((await httpGet(port, '/readyz'))?.status, 503);
    assert.equal(existsSync(subnetFile), false);
    await client.put(`${prefix}/config`).value('{"Network":"10.6.0.0/16","Backend":{"Type":"alloc"}}');
    await waitFor(async () => (await httpGet(port, '/readyz'))?.status === 200, { timeoutMs: 30_000, what: 'ready after config' });
    assert.ok(existsSync(subnetFile));
    assert.equal((await p.stop()).code, 0, p.output);
  });

  it('skips a lease value of the wrong shape written by someone else', async () => {
    await client.put(`${prefix}/subnets/10.6.9.0-24`).value('{"PublicIP":5}');
    await client.put(`${prefix}/subnets/10.6.10.0-24`).value('{"PublicIP":"10.22.0.9","PublicIPv6":null}');
    const port = await freePort();
    const p = weftd(['--public-ip', '10.22.0.1', '--subnet-file', join(dir, `shape${n}`, 'subnet.env'), '--healthz-ip', '127.0.0.1', '--healthz-port', String(port)]);
    await waitFor(async () => /^weft_peers 1$/m.test((await httpGet(port, '/metrics'))?.body ?? ''), { timeoutMs: 30_000, what: 'one peer' });
    const warnings = p.output.split('\n').filter((l) => l.includes('skipping unparsable lease entry'));
    assert.equal(warnings.length, 1, p.output);
    assert.match(warnings[0]!, /10\.6\.9\.0-24.*PublicIP must be an IPv4 address string/);
    assert.equal(await client.get(`${prefix}/subnets/10.6.9.0-24`).string(), '{"PublicIP":5}', 'left untouched');
    assert.equal((await p.stop()).code, 0, p.output);
  });

  describe('bad input', () => {
    it('exits 1 on an invalid network config, naming the key and rule, taking no lease', async () => {
      await client.put(`${prefix}/config`).value('{"Network":"10.6.0.0/16","SubnetLen":31,"Backend":{"Type":"alloc"}}');
      const subnetFile = join(dir, `bad${n}`, 'subnet.env');
      const p = weftd(['--public-ip', '10.23.0.1', '--subnet-file', subnetFile]);
      assert.equal((await p.exited).code, 1);
      const errors = p.output.split('\n').filter((l) => / error /.test(l));
      assert.equal(errors.length, 1, p.output);
      assert.match(errors[0]!, /invalid network config: SubnetLen 31: must be at most 30/);
      assert.deepEqual(await leases(), {});
      assert.equal(existsSync(subnetFile), false);
    });

    it('exits 1 on an unknown backend type, listing the known ones', async () => {
      await client.put(`${prefix}/config`).value('{"Network":"10.6.0.0/16","Backend":{"Type":"bogus"}}');
      const p = weftd(['--public-ip', '10.23.0.2', '--subnet-file', join(dir, `bk${n}`, 'subnet.env')]);
      assert.equal((await p.exited).code, 1);
      assert.match(p.output, /Backend\.Type "bogus": unknown backend type \(known types: alloc, host-gw, ovs, vxlan\)/);
      assert.deepEqual(await leases(), {});
    });

    it('exits 1 when the subnet file cannot be written, before taking a lease', async () => {
      const blocker = join(dir, `file${n}`);
      writeFileSync(blocker, 'not a directory');
      const p = weftd(['--public-ip', '10.23.0.3', '--subnet-file', join(blocker, 'subnet.env')]);
      assert.equal((await p.exited).code, 1);
      assert.match(p.output, new RegExp(`cannot write subnet file ${blocker}/subnet.env`));
      assert.deepEqual(await leases(), {});
    });

    it('keeps retrying an unreachable etcd, saying which, and never becomes ready', async () => {
      const dead = await freePort();
      const port = await freePort();
      const subnetFile = join(dir, `dead${n}`, 'subnet.env');
      const p = WeftdProcess.start([
        '--etcd-endpoints', `http://127.0.0.1:${dead}`, '--iface', 'lo', '--public-ip', '10.23.0.4',
        '--subnet-file', subnetFile, '--healthz-ip', '127.0.0.1', '--healthz-port', String(port),
      ]);
      procs.push(p);
      await waitFor(() => new RegExp(`waiting for the network config.*127\\.0\\.0\\.1:${dead}`).test(p.output), {
        timeoutMs: 30_000,
        what: 'the unreachable-etcd message',
      });
      assert.equal((await httpGet(port, '/readyz'))?.status, 503);
      assert.ok(p.running);
      assert.equal(existsSync(subnetFile), false);
      assert.equal((await p.stop()).code, 0, p.output);
    });

    it('exits 2 on bad flags with a one-line message', async () => {
      const p = weftd(['--subnet-lease-renew-margin', '0']);
      assert.equal((await p.exited).code, 2);
      assert.equal(p.output.trim(), 'weftd: --subnet-lease-renew-margin 0: must be an integer from 1 to 1439');
      const q = weftd(['--bogus-flag']);
      assert.equal((await q.exited).code, 2);
      assert.match(q.output.trim(), /^weftd: Unknown arguments?: bogus-flag/);
    });

    it('leaves no temporary files next to the subnet files', () => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        if (!entry.isDirectory()) continue;
        const files = readdirSync(join(dir, entry.name));
        assert.deepEqual(files.filter((f) => f !== 'subnet.env'), [], `only subnet.env in ${entry.name}`);
      }
    });
  });
});
