// The NetworkPolicy nftables dataplane on a bridge node, with real traffic: a node namespace with
// bridge cni0 (br_netfilter on) and three pod namespaces a, b, c. The engine's snapshot programs
// `inet weft_policy`; deltas (a label change, a policy deleted) change what passes, each in one
// `nft -f` transaction; a table flushed by hand is found by the read-back and repaired. Programming
// at 1 000 policies and 10 000 pods is measured by bench/netpol-nft.ts, not here.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';

import { PolicyEngine } from '../../src/policy/engine.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { type NftRun, PolicyNftDriver } from '../../src/policy/nft/driver.js';
import { execChecked, execProgram } from '../../src/util/exec.js';
import { addNetns, delNetns, ipn, nsExec, nsPrefix } from '../helpers/netns.js';
import { prng } from '../helpers/prng.js';
import { waitFor } from '../helpers/wait.js';

const P = nsPrefix('pnft');
const NODE = `${P}-n`;
const PODS = { a: '10.88.0.2', b: '10.88.0.3', c: '10.88.0.4' } as const;
type PodName = keyof typeof PODS;
const podNs = (p: PodName) => `${P}-${p}`;

/** nft inside the node namespace; counts `-f` transactions. */
function nodeNft(ns: string, calls: string[][]): NftRun {
  return async (args, input) => {
    calls.push([...args]);
    const r = await execChecked('ip', ['netns', 'exec', ns, 'nft', ...args], input === undefined ? {} : { input });
    return r.stdout;
  };
}

/** Whether a TCP connection from `from` (a pod, or the node) to b:port is established within a second. */
async function connects(from: PodName | 'node', port: number): Promise<boolean> {
  const ns = from === 'node' ? NODE : podNs(from);
  const r = await execProgram('ip', ['netns', 'exec', ns, 'timeout', '1', 'bash', '-c', `exec 3<>/dev/tcp/${PODS.b}/${port}`]);
  if (r.code !== 0 && r.code !== 124) throw new Error(`connect from ${from} to b:${port}: exit ${r.code}: ${r.stderr.trim()}`);
  return r.code === 0;
}

async function expectReach(want: Partial<Record<`${PodName | 'node'}:${number}`, boolean>>): Promise<void> {
  await waitFor(
    async () => {
      for (const [k, v] of Object.entries(want)) {
        const [from, port] = k.split(':') as [PodName | 'node', string];
        if ((await connects(from, Number(port))) !== v) throw new Error(`${from} → b:${port} should ${v ? 'pass' : 'be dropped'}`);
      }
      return true;
    },
    { timeoutMs: 3000, what: JSON.stringify(want) },
  );
}

const pod = (name: string, ip: string, app: string, node = 'n1') =>
  parsePod({
    metadata: { namespace: 'x', name, labels: { app } },
    spec: { nodeName: node, containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
    status: { phase: 'Running', podIPs: [{ ip }] },
  });

describe('NetworkPolicy nftables dataplane (bridge node, real traffic)', function () {
  this.timeout(120_000);
  let server: ChildProcess | null = null;
  const calls: string[][] = [];
  let driver: PolicyNftDriver;
  const engine = new PolicyEngine('n1');

  before(async () => {
    await addNetns(NODE);
    assert.equal((await nsExec(NODE, 'cat', '/proc/sys/net/bridge/bridge-nf-call-iptables')).trim(), '1');
    await ipn(NODE, 'link', 'add', 'cni0', 'type', 'bridge');
    await ipn(NODE, 'addr', 'add', '10.88.0.1/24', 'dev', 'cni0');
    await ipn(NODE, 'link', 'set', 'cni0', 'up');
    for (const [name, ip] of Object.entries(PODS) as [PodName, string][]) {
      const ns = await addNetns(podNs(name));
      await ipn(NODE, 'link', 'add', `veth${name}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
      await ipn(NODE, 'link', 'set', `veth${name}`, 'master', 'cni0', 'up');
      await ipn(ns, 'addr', 'add', `${ip}/24`, 'dev', 'eth0');
      await ipn(ns, 'link', 'set', 'eth0', 'up');
      await ipn(ns, 'route', 'add', 'default', 'via', '10.88.0.1');
    }
    // b serves TCP 80 and 81 (accepts and closes).
    const code = "for (const p of [80, 81]) require('net').createServer((s) => s.end()).listen(p, '0.0.0.0'); console.log('up');";
    server = spawn('ip', ['netns', 'exec', podNs('b'), process.execPath, '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => server!.stdout!.once('data', () => resolve()));
    driver = new PolicyNftDriver(nodeNft(NODE, calls));
  });

  after(async () => {
    if (server?.pid !== undefined) server.kill();
    for (const p of Object.keys(PODS) as PodName[]) await delNetns(podNs(p));
    await delNetns(NODE);
  });

  it('enforces the snapshot, each delta in one transaction, and repairs a flushed table', async () => {
    const d0 = engine.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
    void d0;
    for (const [name, ip] of Object.entries(PODS)) engine.upsertPod(pod(name, ip, name));
    engine.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'deny-b' }, spec: { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress'] } }));
    // a is ingress-isolated too: b's replies to a pass only as conntrack replies.
    engine.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name: 'deny-a' }, spec: { podSelector: { matchLabels: { app: 'a' } }, policyTypes: ['Ingress'] } }));
    engine.upsertPolicy(
      parseNetworkPolicy({
        metadata: { namespace: 'x', name: 'allow-a' },
        spec: { podSelector: { matchLabels: { app: 'b' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }] }] },
      }),
    );
    await expectReach({ 'c:80': true, 'a:81': true });
    await driver.sync(engine.snapshot());
    await expectReach({ 'a:80': true, 'c:80': false, 'a:81': false, 'node:80': true, 'node:81': true });
    assert.deepEqual(await driver.check(), []);

    // c takes a's label: one transaction, and c may now talk to b:80.
    let before = calls.filter((c) => c[0] === '-f').length;
    await driver.apply(engine.upsertPod(pod('c', PODS.c, 'a')));
    assert.equal(calls.filter((c) => c[0] === '-f').length, before + 1);
    await expectReach({ 'c:80': true, 'c:81': false });
    assert.deepEqual(await driver.check(), []);

    // Drift: the table flushed by hand lets everything through until repair.
    await nsExec(NODE, 'nft', 'flush', 'table', 'inet', 'weft_policy');
    await expectReach({ 'a:81': true });
    const problems = await driver.check();
    assert.ok(problems.length > 0, 'a flushed table must be reported');
    assert.deepEqual(await driver.repair(), problems);
    assert.deepEqual(await driver.check(), []);
    await expectReach({ 'a:80': true, 'a:81': false });

    // The allowing policy goes: b is deny-all again, node traffic still passes.
    before = calls.filter((c) => c[0] === '-f').length;
    await driver.apply(engine.deletePolicy('x', 'allow-a'));
    assert.equal(calls.filter((c) => c[0] === '-f').length, before + 1);
    await expectReach({ 'a:80': false, 'c:80': false, 'node:80': true });
    assert.deepEqual(await driver.check(), []);

    // Counters are readable: the default-deny drop of b's chain counted something.
    const listed = JSON.parse(await nsExec(NODE, 'nft', '-j', 'list', 'table', 'inet', 'weft_policy')) as { nftables: { rule?: { comment?: string; expr: unknown[] } }[] };
    const drops = listed.nftables.filter((i) => i.rule?.comment?.startsWith('default-deny ')).map((i) => JSON.stringify(i.rule!.expr));
    assert.ok(drops.some((e) => /"packets":[1-9]/.test(e)), `no drop counted: ${drops.join(' ')}`);

    // Every pod policy gone: the delta empties the maps and chains.
    await driver.apply(engine.deletePolicy('x', 'deny-b'));
    await expectReach({ 'a:81': true, 'c:81': true });
    assert.deepEqual(await driver.check(), []);
  });

  it('takes a dual-stack rule set with ipBlocks of both families and drop logging, and reads it back equal', async () => {
    const ns = `${P}-v6`;
    await addNetns(ns);
    try {
      const e = new PolicyEngine('n1');
      e.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
      const dual = (name: string, v4: string, v6: string, app: string) =>
        parsePod({
          metadata: { namespace: 'x', name, labels: { app } },
          spec: { nodeName: 'n1', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
          status: { phase: 'Running', podIPs: [{ ip: v4 }, { ip: v6 }] },
        });
      e.upsertPod(dual('a', '10.88.0.2', 'fd88::2', 'a'));
      e.upsertPod(dual('b', '10.88.0.3', 'fd88::3', 'b'));
      e.upsertPolicy(
        parseNetworkPolicy({
          metadata: { namespace: 'x', name: 'mixed' },
          spec: {
            podSelector: { matchLabels: { app: 'b' } },
            policyTypes: ['Ingress', 'Egress'],
            ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }, { ipBlock: { cidr: 'fd00::/8', except: ['fd88::/64'] } }], ports: [{ port: 'http' }, { port: 8000, endPort: 8100 }] }],
            egress: [{ to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8'] } }, { ipBlock: { cidr: '::/0', except: ['fd00::/8'] } }] }, { ports: [{ port: 'http' }] }],
          },
        }),
      );
      const d = new PolicyNftDriver(nodeNft(ns, []), { families: [4, 6], logDrops: true });
      await d.sync(e.snapshot());
      assert.deepEqual(await d.check(), []);
      const table = await nsExec(ns, 'nft', 'list', 'table', 'inet', 'weft_policy');
      assert.match(table, /ip6 saddr fd00::-fd87:ffff:ffff:ffff:ffff:ffff:ffff:ffff /);
      assert.match(table, /ip6 daddr . meta l4proto . th dport @r[0-9a-f]+_ports_v6/);
      assert.match(table, /log prefix "weft-policy drop: "/);
      assert.doesNotMatch(table, /flags interval/);
      // A delta on the dual-stack table: b loses its label, both families' entries go at once.
      await d.apply(e.upsertPod(dual('b', '10.88.0.3', 'fd88::3', 'none')));
      assert.deepEqual(await d.check(), []);
      assert.doesNotMatch(await nsExec(ns, 'nft', 'list', 'map', 'inet', 'weft_policy', 'ingress_v6'), /fd88::3/);
    } finally {
      await delNetns(ns);
    }
  });

  it('takes deltas that delete and re-create the same sets, chains and map entries in one transaction', async () => {
    const ns = `${P}-batch`;
    await addNetns(ns);
    try {
      const e = new PolicyEngine('n1');
      e.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: {} } }));
      for (const [name, ip] of Object.entries(PODS)) e.upsertPod(pod(name, ip, name));
      const allow = parseNetworkPolicy({
        metadata: { namespace: 'x', name: 'allow-a' },
        spec: { podSelector: { matchLabels: { app: 'b' } }, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }] }], egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8', except: ['10.88.0.4/32'] } }] }] },
      });
      e.upsertPolicy(allow);
      const calls: string[][] = [];
      const d = new PolicyNftDriver(nodeNft(ns, calls), { families: [4] });
      await d.sync(e.snapshot());
      // The policy deleted and put back as it was, pod b deleted and put back, pod a's label away
      // and back: every name goes and comes again within the one batch.
      const batch = [
        e.deletePolicy('x', 'allow-a'),
        e.upsertPolicy(allow),
        e.deletePod('x', 'b'),
        e.upsertPod(pod('b', PODS.b, 'b')),
        e.upsertPod(pod('a', PODS.a, 'none')),
        e.upsertPod(pod('a', PODS.a, 'a')),
      ];
      const before = calls.length;
      await d.applyAll(batch);
      assert.equal(calls.length, before + 1, 'one transaction');
      assert.deepEqual(await d.check(), []);
    } finally {
      await delNetns(ns);
    }
  });

  it('applies 400 random events, each one transaction nft accepts, and reads back equal every 20 (seeded)', async () => {
    // Small pools, so selectors hit, pods share addresses, rules come and go and chains with them.
    const seed = Number(process.env['WEFT_FUZZ_SEED'] ?? Date.now() % 0x100000000);
    const r = prng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const ns = `${P}-fuzz`;
    await addNetns(ns);
    try {
      const e = new PolicyEngine('n1');
      for (const n of ['x', 'y']) e.upsertNamespace(parseNamespace({ metadata: { name: n, labels: { team: n } } }));
      const calls: string[][] = [];
      const d = new PolicyNftDriver(nodeNft(ns, calls), { families: [4, 6] });
      await d.sync(e.snapshot());
      const addrs = ['10.88.0.2', '10.88.0.3', '10.88.0.4', '10.88.0.5', 'fd88::2', 'fd88::3'];
      const sel = () => pick([{}, { matchLabels: { app: pick(['a', 'b', 'c']) } }, { matchExpressions: [{ key: 'app', operator: 'In', values: ['a', 'b'] }] }]);
      const peer = () => pick([{ podSelector: sel() }, { namespaceSelector: { matchLabels: { team: pick(['x', 'y']) } }, podSelector: sel() }, { ipBlock: { cidr: '10.0.0.0/8', except: ['10.88.0.4/32'] } }, { ipBlock: { cidr: 'fd00::/8' } }]);
      const ports = () => pick([undefined, [{ port: 80, protocol: 'TCP' }], [{ port: 'http' }], [{ port: 8000, endPort: 8010, protocol: 'UDP' }, { port: 'dns', protocol: 'UDP' }]]);
      const event = (): string => {
        const k = r();
        if (k < 0.55) {
          const name = `p${Math.floor(r() * 10)}`;
          const ips = r() < 0.2 ? [pick(addrs), pick(addrs)] : [pick(addrs)];
          const phase = pick(['Running', 'Running', 'Running', 'Pending', 'Succeeded']);
          applyTo(e.upsertPod(parsePod({
            metadata: { namespace: pick(['x', 'y']) === 'x' ? 'x' : 'y', name, labels: { app: pick(['a', 'b', 'c']) } },
            spec: { nodeName: r() < 0.7 ? 'n1' : 'n2', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: pick([80, 81]), protocol: 'TCP' }, { name: 'dns', containerPort: 53, protocol: 'UDP' }] }] },
            status: { phase, podIPs: [...new Set(ips)].map((ip) => ({ ip })) },
          })));
          return `pod ${name}`;
        }
        if (k < 0.65) {
          const name = `p${Math.floor(r() * 10)}`;
          applyTo(e.deletePod(pick(['x', 'y']), name));
          return `delete pod ${name}`;
        }
        if (k < 0.92) {
          const name = `np${Math.floor(r() * 4)}`;
          const spec: Record<string, unknown> = { podSelector: sel(), policyTypes: pick([['Ingress'], ['Egress'], ['Ingress', 'Egress']]) };
          if (r() < 0.8) spec['ingress'] = [{ from: r() < 0.2 ? undefined : [peer(), ...(r() < 0.3 ? [peer()] : [])], ports: ports() }];
          if (r() < 0.8) spec['egress'] = [{ to: r() < 0.2 ? undefined : [peer()], ports: ports() }];
          applyTo(e.upsertPolicy(parseNetworkPolicy(JSON.parse(JSON.stringify({ metadata: { namespace: pick(['x', 'y']), name }, spec })))));
          return `policy ${name}`;
        }
        const name = `np${Math.floor(r() * 4)}`;
        applyTo(e.deletePolicy(pick(['x', 'y']), name));
        return `delete policy ${name}`;
      };
      const pending: Parameters<PolicyNftDriver['apply']>[0][] = [];
      const applyTo = (delta: Parameters<PolicyNftDriver['apply']>[0]) => void pending.push(delta);
      for (let i = 1; i <= 400; i++) {
        const what = event();
        // Mostly one delta per transaction; now and then a batch of several, as the enforcer makes.
        if (r() < 0.8 || i % 20 === 0) {
          const batch = pending.splice(0);
          try {
            await d.applyAll(batch);
          } catch (err) {
            assert.fail(`event ${i} (${what}, seed ${seed}): nft refused the transaction: ${String(err)}`);
          }
        }
        if (i % 20 === 0) assert.deepEqual(await d.check(), [], `after event ${i} (seed ${seed})`);
      }
    } finally {
      await delNetns(ns);
    }
  });
});
