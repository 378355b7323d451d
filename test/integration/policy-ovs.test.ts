// The NetworkPolicy OVS dataplane against a real Open vSwitch (userspace datapath, private
// daemons in a test namespace): the ovs backend's pipeline with the policy tables' frame on a
// bridge, the policy section attached to it as the backend attaches it, and the policy engine's
// random events applied through PolicyOvsDriver — every bundle must be accepted, the bridge must
// read back equal to the model, and the model kept by deltas must equal one built from the
// engine's snapshot. Real traffic through these flows: netpol-matrix (ovs nodes).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { Category, CATEGORY_ONLY_MASK, cookieOf, macFromIP, pipelineFlows, renderFlow, renderFlows } from '../../src/backend/ovs/pipeline.js';
import { PolicyFlowSection } from '../../src/backend/ovs/policy-section.js';
import { OvsClient } from '../../src/ovs/cli.js';
import { renderCookieMatch } from '../../src/render/ofctl.js';
import { PolicyEngine } from '../../src/policy/engine.js';
import type { PolicyDelta } from '../../src/policy/model.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { PolicyFlowModel } from '../../src/policy/ovs/flows.js';
import { parseDumpedFlow, PolicyOvsDriver } from '../../src/policy/ovs/driver.js';
import { IPAddr } from '../../src/util/ip.js';
import { addNetns, delNetns, nsPrefix } from '../helpers/netns.js';
import { OvsInstance } from '../helpers/ovs.js';
import { prng } from '../helpers/prng.js';

const P = nsPrefix('povs');
const BRIDGE = 'br-int';
const ROUND = 7;

describe('NetworkPolicy OVS dataplane (real Open vSwitch)', function () {
  this.timeout(120_000);
  let ovs: OvsInstance | undefined;
  let dir: string | undefined;
  const ns = `${P}-n`;

  before(async () => {
    await addNetns(ns);
    dir = mkdtempSync(join(tmpdir(), 'weft-povs-'));
    ovs = await OvsInstance.start(ns, join(dir, 'ovs'));
    await ovs.vsctl('add-br', BRIDGE, '--', 'set', 'bridge', BRIDGE, 'datapath_type=netdev', 'fail-mode=secure', 'protocols=OpenFlow10,OpenFlow13,OpenFlow15');
  });
  after(async () => {
    await ovs?.stop();
    await delNetns(ns);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** The section as the ovs backend attaches it, on the test's bridge. */
  async function attachedSection(round = ROUND): Promise<{ section: PolicyFlowSection; client: OvsClient }> {
    const client = new OvsClient({ runDir: ovs!.runDir });
    const gatewayIP = IPAddr.parse('10.88.0.1');
    const frame = pipelineFlows(round, { vni: 1, tunnelPort: 32768, gatewayPort: 32769, gatewayIP, gatewayMAC: macFromIP(gatewayIP) }, { policy: true });
    await client.replaceFlows(BRIDGE, renderFlows(frame));
    const section = new PolicyFlowSection();
    const anyRound = renderCookieMatch(cookieOf(0, Category.Policy, 0), CATEGORY_ONLY_MASK);
    section.attach({
      round,
      bundle: async (mods) => void (await client.bundleFlowMods(BRIDGE, mods)),
      dumpPolicyFlows: (withStats) => client.dumpFlows(BRIDGE, anyRound, withStats),
    });
    return { section, client };
  }

  it('applies 300 random events, each one bundle OVS accepts; the bridge reads back equal, and the delta-kept model equals the snapshot-built one (seeded)', async () => {
    const seed = Number(process.env['WEFT_FUZZ_SEED'] ?? Date.now() % 0x100000000);
    const r = prng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const { section, client } = await attachedSection();
    const e = new PolicyEngine('n1');
    for (const n of ['x', 'y']) e.upsertNamespace(parseNamespace({ metadata: { name: n, labels: { team: n } } }));
    const d = new PolicyOvsDriver(section, new AbortController().signal);
    await d.sync(e.snapshot());
    const addrs = ['10.88.0.2', '10.88.0.3', '10.88.0.4', '10.88.0.5', '10.89.0.7', 'fd88::2'];
    const sel = () => pick([{}, { matchLabels: { app: pick(['a', 'b', 'c']) } }, { matchExpressions: [{ key: 'app', operator: 'In', values: ['a', 'b'] }] }]);
    const peer = () =>
      pick([
        { podSelector: sel() },
        { namespaceSelector: { matchLabels: { team: pick(['x', 'y']) } }, podSelector: sel() },
        { ipBlock: { cidr: '10.0.0.0/8', except: ['10.88.0.4/32', '10.89.0.0/17'] } },
        { ipBlock: { cidr: '0.0.0.0/0' } },
      ]);
    const ports = () => pick([undefined, [{ port: 80, protocol: 'TCP' }], [{ port: 'http' }], [{ port: 8000, endPort: 8010, protocol: 'UDP' }, { port: 'dns', protocol: 'UDP' }], [{ protocol: 'UDP' }]]);
    const pending: PolicyDelta[] = [];
    const event = (): string => {
      const k = r();
      if (k < 0.55) {
        const name = `p${Math.floor(r() * 10)}`;
        const ips = r() < 0.2 ? [pick(addrs), pick(addrs)] : [pick(addrs)];
        pending.push(
          e.upsertPod(
            parsePod({
              metadata: { namespace: pick(['x', 'y']), name, labels: { app: pick(['a', 'b', 'c']) } },
              spec: { nodeName: r() < 0.7 ? 'n1' : 'n2', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: pick([80, 81]), protocol: 'TCP' }, { name: 'dns', containerPort: 53, protocol: 'UDP' }] }] },
              status: { phase: pick(['Running', 'Running', 'Pending']), podIPs: [...new Set(ips)].map((ip) => ({ ip })) },
            }),
          ),
        );
        return `pod ${name}`;
      }
      if (k < 0.65) {
        const name = `p${Math.floor(r() * 10)}`;
        pending.push(e.deletePod(pick(['x', 'y']), name));
        return `delete pod ${name}`;
      }
      const name = `np${Math.floor(r() * 4)}`;
      if (k < 0.92) {
        const spec: Record<string, unknown> = { podSelector: sel(), policyTypes: pick([['Ingress'], ['Egress'], ['Ingress', 'Egress']]) };
        if (r() < 0.8) spec['ingress'] = [{ from: r() < 0.2 ? undefined : [peer(), ...(r() < 0.3 ? [peer()] : [])], ports: ports() }];
        if (r() < 0.8) spec['egress'] = [{ to: r() < 0.2 ? undefined : [peer()], ports: ports() }];
        pending.push(e.upsertPolicy(parseNetworkPolicy(JSON.parse(JSON.stringify({ metadata: { namespace: pick(['x', 'y']), name }, spec })))));
        return `policy ${name}`;
      }
      pending.push(e.deletePolicy(pick(['x', 'y']), name));
      return `delete policy ${name}`;
    };
    const onBridge = async () =>
      (await client.dumpFlows(BRIDGE, renderCookieMatch(cookieOf(0, Category.Policy, 0), CATEGORY_ONLY_MASK)))
        .map(parseDumpedFlow)
        .map((f) => `${f!.key} actions=${f!.actions}`)
        .sort();
    const fromSnapshot = () => {
      const fresh = new PolicyFlowModel();
      fresh.reset(e.snapshot());
      return fresh
        .flows(ROUND)
        .map((f) => `${PolicyFlowModel.keyOf(f)} actions=${renderFlow(f).split(',actions=')[1]}`)
        .sort();
    };
    for (let i = 1; i <= 300; i++) {
      const what = event();
      if (r() < 0.8 || i % 20 === 0) {
        try {
          await d.applyAll(pending.splice(0));
        } catch (err) {
          assert.fail(`event ${i} (${what}, seed ${seed}): OVS refused the bundle: ${String(err)}`);
        }
      }
      if (i % 20 === 0) {
        assert.deepEqual(await d.check(), [], `after event ${i} (seed ${seed})`);
        assert.deepEqual(await onBridge(), fromSnapshot(), `the bridge (kept by deltas) and the engine's snapshot differ after event ${i} (seed ${seed})`);
      }
    }
  });
});
