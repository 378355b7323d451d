import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import {
  DaemonUnreachableError,
  fetchStatus,
  formatDuration,
  parseStatus,
  renderStatus,
  statusCommand,
  StatusResponseError,
  statusUrl,
} from '../../src/cli/status.js';
import { HealthServer } from '../../src/daemon/http.js';
import { DaemonMetrics } from '../../src/daemon/metrics.js';
import { buildStatus, DaemonActivity, type StatusInput, type StatusSnapshot } from '../../src/daemon/status.js';
import { parseNetworkConfig } from '../../src/subnet/config.js';
import type { Lease } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import type { Logger } from '../../src/util/log.js';

const quiet: Logger = { error() {}, warn() {}, info() {}, debug() {}, child: () => quiet };
const T0 = new Date('2025-03-01T12:00:00.000Z');
const at = (s: number) => new Date(T0.getTime() + s * 1000);

function lease(subnet: string, publicIP: string, mac: string): Lease {
  return {
    subnet: IPNet.parse(subnet),
    ipv6Subnet: null,
    attrs: { publicIP: IPAddr.parse(publicIP), publicIPv6: null, backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: mac } },
    reservation: false,
    expiration: null,
  };
}

function input(activity: DaemonActivity, over: Partial<StatusInput> = {}): StatusInput {
  return {
    weftVersion: '0.1.0',
    subnetFile: '/run/flannel/subnet.env',
    config: parseNetworkConfig(JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'vxlan' } }), { knownBackends: ['vxlan'] }),
    backendType: 'vxlan',
    lease: lease('10.5.1.0/24', '10.250.0.1', '0e:00:00:00:00:01'),
    peers: [lease('10.5.2.0/24', '10.250.0.2', '0e:00:00:00:00:02')],
    rejected: [{ lease: lease('8.8.8.0/24', '10.250.0.9', '0e:00:00:00:00:09'), reason: 'outside-network', detail: 'subnet 8.8.8.0/24 is outside the cluster network 10.5.0.0/16', since: at(-20) }],
    masquerade: true,
    forwardRules: true,
    rulesResync: 5,
    reconcileInterval: 10,
    activity,
    ...over,
  };
}

/** Metrics and activity of a daemon that has run a while: a repair, a rule repair, a rule error. */
function busyDaemon(): { metrics: DaemonMetrics; activity: DaemonActivity } {
  const metrics = new DaemonMetrics({ processMetrics: false });
  metrics.ready.set(1);
  metrics.leaseExpiry.set(T0.getTime() / 1000 + 86_000);
  metrics.peers.set(1);
  metrics.peersRejected.set(1);
  metrics.backendFailures.inc(2);
  metrics.recordProgramming(1, { added: 3, changed: 1, removed: 2 }, 1);
  for (let i = 0; i < 4; i++) metrics.ruleChecks.inc();
  metrics.recordRuleRepair('iptables');
  metrics.recordRuleError();
  const activity = new DaemonActivity();
  activity.backendPass('apply', null, at(-30));
  activity.backendPass('reconcile', null, at(-4));
  activity.rulePass({ problems: ['FLANNEL-POSTRTG: chain missing'] }, at(-60)); // the install: not a repair
  activity.rulePass({ problems: ['ipv4 nat: FLANNEL-POSTRTG: missing rule: -A X'] }, at(-7));
  activity.rulePass({ problems: [] }, at(-2));
  return { metrics, activity };
}

describe('status snapshot', () => {
  it('records repairs only after the first rule pass, and clears errors on success', () => {
    const a = new DaemonActivity();
    a.rulePass({ problems: ['chain missing'] }, at(0));
    assert.equal(a.lastRuleRepair, null);
    a.rulePass(new Error('iptables-restore: exit status 1'), at(1));
    assert.deepEqual(a.ruleError, { at: at(1), message: 'iptables-restore: exit status 1' });
    assert.deepEqual(a.lastRuleCheck, at(0));
    a.rulePass({ problems: ['rule missing'] }, at(2));
    assert.deepEqual(a.lastRuleRepair, { at: at(2), problems: ['rule missing'] });
    assert.equal(a.ruleError, null);
    a.backendPass('reconcile', new Error('netlink: EBUSY'), at(3));
    assert.deepEqual([a.lastReconcile, a.backendError?.message], [null, 'netlink: EBUSY']);
    a.backendPass('reconcile', null, at(4));
    assert.deepEqual([a.lastReconcile, a.backendError], [at(4), null]);
  });

  it('takes every count from the metrics and every time from the activity', async () => {
    const { metrics, activity } = busyDaemon();
    const s = await buildStatus(input(activity), metrics, { now: T0 });
    const want: StatusSnapshot = {
      kind: 'weft-status',
      version: 1,
      weftVersion: '0.1.0',
      time: '2025-03-01T12:00:00.000Z',
      ready: true,
      subnetFile: '/run/flannel/subnet.env',
      network: { network: '10.5.0.0/16', ipv6Network: null, backendType: 'vxlan', enableNFTables: false },
      lease: {
        subnet: '10.5.1.0/24',
        ipv6Subnet: null,
        publicIP: '10.250.0.1',
        publicIPv6: null,
        backendType: 'vxlan',
        vtepMAC: '0e:00:00:00:00:01',
        vtepMACv6: null,
        reservation: false,
        expiration: '2025-03-02T11:53:20.000Z',
      },
      backend: {
        type: 'vxlan',
        peersKnown: 1,
        peersProgrammed: 1,
        peersRejected: 1,
        rejectedPeers: [
          {
            subnet: '8.8.8.0/24',
            ipv6Subnet: null,
            publicIP: '10.250.0.9',
            publicIPv6: null,
            backendType: 'vxlan',
            vtepMAC: '0e:00:00:00:00:09',
            vtepMACv6: null,
            reason: 'outside-network',
            detail: 'subnet 8.8.8.0/24 is outside the cluster network 10.5.0.0/16',
            since: '2025-03-01T11:59:40.000Z',
          },
        ],
        failures: 2,
        lastApply: '2025-03-01T11:59:30.000Z',
        lastReconcile: '2025-03-01T11:59:56.000Z',
        reconcileInterval: 10,
        repairs: { added: 3, changed: 1, removed: 2, device: 1 },
        lastError: null,
      },
      ipmasq: {
        masquerade: true,
        forwardRules: true,
        mode: 'iptables',
        resyncSeconds: 5,
        lastCheck: '2025-03-01T11:59:58.000Z',
        lastRepair: '2025-03-01T11:59:53.000Z',
        lastRepairProblems: ['ipv4 nat: FLANNEL-POSTRTG: missing rule: -A X'],
        checks: 4,
        repairs: 1,
        errors: 1,
        lastError: null,
      },
    };
    assert.deepEqual(s, want);
    const withPeers = await buildStatus(input(activity), metrics, { now: T0, peers: true });
    assert.deepEqual(withPeers.peers, [
      { subnet: '10.5.2.0/24', ipv6Subnet: null, publicIP: '10.250.0.2', publicIPv6: null, backendType: 'vxlan', vtepMAC: '0e:00:00:00:00:02', vtepMACv6: null },
    ]);
  });

  it('is honest before the daemon has a lease', async () => {
    const metrics = new DaemonMetrics({ processMetrics: false });
    const s = await buildStatus(input(new DaemonActivity(), { config: null, backendType: null, lease: null, peers: [] }), metrics, { now: T0 });
    assert.deepEqual([s.ready, s.network, s.lease, s.backend, s.ipmasq.mode, s.ipmasq.lastCheck], [false, null, null, null, null, null]);
    assert.equal(
      renderStatus(s),
      [
        'weftd       0.1.0, NOT READY',
        'lease       none yet',
        'backend     not started yet',
        'ipmasq      masquerade on, forward rules on',
        'rules       last check never (every 5s), last repair never; 0 checks, 0 repairs, 0 errors',
        'subnet file /run/flannel/subnet.env',
        '',
      ].join('\n'),
    );
  });

  it('renders one labelled line per aspect', async () => {
    const { metrics, activity } = busyDaemon();
    activity.backendPass('apply', new Error('route-replace 10.5.2.0/24: EINVAL'), at(-1));
    const s = await buildStatus(input(activity), metrics, { now: T0 });
    assert.equal(
      renderStatus(s),
      [
        'weftd       0.1.0, ready',
        'lease       10.5.1.0/24, public IP 10.250.0.1, expires 2025-03-02T11:53:20.000Z (in 23h53m)',
        'network     10.5.0.0/16, backend vxlan',
        'backend     vxlan: 1 peers known, 1 programmed, 1 rejected',
        '  rejected  8.8.8.0/24 (public IP 10.250.0.9): outside-network: subnet 8.8.8.0/24 is outside the cluster network 10.5.0.0/16, since 20s ago',
        'reconcile   last apply 30s ago, last reconcile 4s ago (every 10s)',
        'repairs     added 3, changed 1, removed 2, devices rebuilt 1; 2 operations refused',
        'backend err route-replace 10.5.2.0/24: EINVAL (1s ago)',
        'ipmasq      masquerade on, forward rules on, iptables',
        'rules       last check 2s ago (every 5s), last repair 7s ago; 4 checks, 1 repairs, 1 errors',
        '  repaired  ipv4 nat: FLANNEL-POSTRTG: missing rule: -A X',
        'subnet file /run/flannel/subnet.env',
        '',
      ].join('\n'),
    );
  });

  it('formats durations', () => {
    assert.deepEqual([0, 59_400, 125_000, 3_600_000 * 4 + 7 * 60_000, 86_400_000 * 2 + 3 * 3_600_000].map(formatDuration), ['0s', '59s', '2m05s', '4h07m', '2d03h']);
  });
});

describe('status over HTTP', () => {
  const servers: HealthServer[] = [];
  after(async () => {
    for (const s of servers) await s.stop();
  });

  async function serve(withStatus: boolean): Promise<number> {
    const { metrics, activity } = busyDaemon();
    const server = new HealthServer({
      host: '127.0.0.1',
      port: 0,
      isReady: () => true,
      metrics,
      logger: quiet,
      ...(withStatus ? { status: (o: { peers?: boolean }) => buildStatus(input(activity), metrics, { ...o, now: T0 }) } : {}),
    });
    servers.push(server);
    return (await server.start()).port;
  }

  it('serves /status as JSON, with peers only when asked', async () => {
    const port = await serve(true);
    const res = await fetch(`http://127.0.0.1:${port}/status`);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'application/json; charset=utf-8');
    const body = (await res.json()) as StatusSnapshot;
    assert.deepEqual([body.kind, body.lease?.subnet, body.backend?.peersKnown, 'peers' in body], ['weft-status', '10.5.1.0/24', 1, false]);
    const full = await fetchStatus(`http://127.0.0.1:${port}`, { peers: true });
    assert.deepEqual(full.peers?.map((p) => p.subnet), ['10.5.2.0/24']);
  });

  it('answers 404 for /status without a provider, and fetchStatus says why', async () => {
    const port = await serve(false);
    assert.equal((await fetch(`http://127.0.0.1:${port}/status`)).status, 404);
    await assert.rejects(fetchStatus(`http://127.0.0.1:${port}`), (e: unknown) => e instanceof StatusResponseError && /does not serve \/status/.test(e.message));
  });

  it('exits 1 with a clear message when nothing listens', async () => {
    const server = new HealthServer({ host: '127.0.0.1', port: 0, isReady: () => true, metrics: new DaemonMetrics({ processMetrics: false }), logger: quiet });
    const { port } = await server.start();
    await server.stop(); // the port is now free: nothing answers there
    const out = new PassThrough();
    const err = new PassThrough();
    let errText = '';
    err.on('data', (d: Buffer) => (errText += d.toString()));
    const code = await statusCommand({ endpoint: `http://127.0.0.1:${port}`, output: 'text' }, out, err);
    assert.equal(code, 1);
    assert.equal(
      errText,
      `weft status: cannot reach weftd at http://127.0.0.1:${port}/status: ECONNREFUSED (is weftd running here, with --healthz-port matching --endpoint?)\n`,
    );
    await assert.rejects(fetchStatus(`http://127.0.0.1:${port}`), DaemonUnreachableError);
  });

  it('builds the URL and refuses documents that are not a status', () => {
    assert.equal(statusUrl('http://127.0.0.1:8081', false), 'http://127.0.0.1:8081/status');
    assert.equal(statusUrl('http://[::1]:8081/weft/', true), 'http://[::1]:8081/weft/status?peers=true');
    assert.throws(() => statusUrl('127.0.0.1:8081', false), DaemonUnreachableError);
    assert.throws(() => parseStatus({ kind: 'other' }, 'u'), { message: 'u: not a weft-status document' });
    assert.throws(() => parseStatus({ kind: 'weft-status', version: 2 }, 'u'), { message: 'u: status version 2; this weft reads version 1' });
    assert.throws(() => parseStatus({ kind: 'weft-status', version: 1, ready: true, time: 'x', ipmasq: {}, lease: 'x' }, 'u'), {
      message: 'u: status field lease is neither an object nor null',
    });
  });
});
