// The OVS test harness itself: two private Open vSwitch instances (userspace datapath) in two
// fresh namespaces at once, a vswitchd restart, flow-restore-wait, the br-phy underlay and a
// clean stop by pid.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { addNetns, delNetns, ipn, lines, nsExec, nsPrefix } from '../helpers/netns.js';
import { moveUnderlayToBrPhy, OvsInstance } from '../helpers/ovs.js';
import { waitFor } from '../helpers/wait.js';

/** Gone or a zombie (exited, not yet reaped by PID 1): read straight from /proc, not via the helper. */
function exited(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return true;
  }
}

/** The network namespace a process lives in, as the inode of its nsfs file. */
function netnsInode(path: string): number {
  return statSync(path).ino;
}

describe('ovs harness (private ovsdb-server + ovs-vswitchd per namespace, netdev datapath)', function () {
  const prefix = nsPrefix('ovsh');
  const nsA = `${prefix}-a`;
  const nsB = `${prefix}-b`;
  let dir = '';
  let a: OvsInstance | undefined;
  let b: OvsInstance | undefined;
  let failed = false;

  const A = (): OvsInstance => a ?? assert.fail('instance A did not start');
  const B = (): OvsInstance => b ?? assert.fail('instance B did not start');
  const FLOW_A = 'cookie=0xa1,table=0,priority=100,ip,nw_dst=10.244.1.0/24,actions=drop';
  const FLOW_B = 'cookie=0xb2,table=3,priority=7,arp,actions=drop';

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'wt-ovsh-'));
    await addNetns(nsA);
    await addNetns(nsB);
    [a, b] = await Promise.all([OvsInstance.start(nsA, join(dir, 'a')), OvsInstance.start(nsB, join(dir, 'b'))]);
  });

  afterEach(function () {
    if (this.currentTest?.state === 'failed') failed = true;
  });

  after(async () => {
    await Promise.allSettled([a?.stop(), b?.stop()]);
    await delNetns(nsA);
    await delNetns(nsB);
    // Keep the logs of a failed run for debugging.
    if (failed) console.log(`ovs harness: logs kept in ${dir}/{a,b}/log`);
    else if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('runs two instances at once, each daemon inside its own namespace with sockets in its own run dir', async () => {
    for (const [ovs, ns, sub] of [[A(), nsA, 'a'], [B(), nsB, 'b']] as const) {
      assert.equal(ovs.ns, ns);
      assert.equal(ovs.runDir, join(dir, sub, 'run'));
      assert.equal(ovs.dbSocket, join(dir, sub, 'run', 'db.sock'));
      const { ovsdbServer, vswitchd } = ovs.pids;
      assert.ok(ovsdbServer !== null && vswitchd !== null);
      for (const pid of [ovsdbServer, vswitchd]) assert.equal(netnsInode(`/proc/${pid}/ns/net`), netnsInode(`/run/netns/${ns}`));
      // OVS's own naming: pidfiles <daemon>.pid, control sockets <daemon>.<pid>.ctl.
      assert.equal(readFileSync(join(ovs.runDir, 'ovs-vswitchd.pid'), 'utf8').trim(), String(vswitchd));
      assert.equal(readFileSync(join(ovs.runDir, 'ovsdb-server.pid'), 'utf8').trim(), String(ovsdbServer));
      assert.ok(existsSync(join(ovs.runDir, `ovs-vswitchd.${vswitchd}.ctl`)));
      assert.ok(existsSync(join(ovs.runDir, `ovsdb-server.${ovsdbServer}.ctl`)));
      assert.match(await ovs.appctl('version'), /^ovs-vswitchd \(Open vSwitch\) \d+\.\d+\.\d+\n$/);
      assert.equal(ovs.env().OVS_RUNDIR, ovs.runDir);
      assert.equal(await ovs.vsctl('list-br'), '');
    }
    assert.notEqual(A().pids.vswitchd, B().pids.vswitchd);
  });

  it('adds a secure netdev bridge and one flow per instance; dumpFlows shows exactly that flow', async () => {
    for (const [ovs, flow, round] of [[A(), FLOW_A, 'r1'], [B(), FLOW_B, 'r2']] as const) {
      await ovs.vsctl('add-br', 'br-int', '--', 'set', 'bridge', 'br-int', 'datapath_type=netdev', 'fail-mode=secure', `external_ids:weft-round=${round}`);
      await ovs.ofctl('-O', 'OpenFlow15', 'add-flow', 'br-int', flow);
      assert.equal(await ovs.vsctl('get', 'bridge', 'br-int', 'fail_mode'), 'secure\n');
      assert.equal(await ovs.vsctl('get', 'bridge', 'br-int', 'datapath_type'), 'netdev\n');
      assert.ok(existsSync(join(ovs.runDir, 'br-int.mgmt')));
    }
    // Each bridge holds only its own flow: the instances share nothing.
    assert.deepEqual(await A().dumpFlows('br-int'), ['cookie=0xa1, priority=100,ip,nw_dst=10.244.1.0/24 actions=drop']);
    assert.deepEqual(await B().dumpFlows('br-int'), ['cookie=0xb2, table=3, priority=7,arp actions=drop']);
  });

  it('killVswitchd + startVswitchd: flows are gone, the bridge and its external_ids stay, the other instance is untouched', async () => {
    const ovs = A();
    const oldPid = ovs.pids.vswitchd;
    assert.ok(oldPid !== null);
    await ovs.killVswitchd();
    assert.equal(exited(oldPid), true);
    assert.equal(ovs.pids.vswitchd, null);
    assert.equal(ovs.pids.ovsdbServer !== null && !exited(ovs.pids.ovsdbServer), true);
    // A clean exit removes vswitchd's sockets and pidfile.
    assert.equal(existsSync(join(ovs.runDir, 'br-int.mgmt')), false);
    assert.equal(existsSync(join(ovs.runDir, 'ovs-vswitchd.pid')), false);
    await ovs.startVswitchd();
    const newPid = ovs.pids.vswitchd;
    assert.ok(newPid !== null && newPid !== oldPid && !exited(newPid));
    assert.deepEqual(await ovs.dumpFlows('br-int'), []);
    assert.equal(await ovs.vsctl('list-br'), 'br-int\n');
    assert.equal(await ovs.vsctl('get', 'bridge', 'br-int', 'external_ids:weft-round'), 'r1\n');
    assert.equal(await ovs.vsctl('get', 'bridge', 'br-int', 'fail_mode'), 'secure\n');
    assert.deepEqual(await B().dumpFlows('br-int'), ['cookie=0xb2, table=3, priority=7,arp actions=drop']);
  });

  it('flowRestoreWait sets other_config:flow-restore-wait before vswitchd starts; false removes it', async () => {
    const ovs = A();
    const key = ['--if-exists', 'get', 'open_vswitch', '.', 'other_config:flow-restore-wait'];
    assert.equal(await ovs.vsctl(...key), '\n');
    await ovs.killVswitchd();
    await ovs.startVswitchd({ flowRestoreWait: true });
    assert.equal(await ovs.vsctl(...key), '"true"\n');
    await ovs.killVswitchd();
    await ovs.startVswitchd({ flowRestoreWait: false });
    assert.equal(await ovs.vsctl(...key), '\n');
    assert.deepEqual(await ovs.dumpFlows('br-int'), []);
  });

  it('moveUnderlayToBrPhy: the node address and default route move to br-phy, and the namespaces ping each other through OVS', async () => {
    await ipn(nsA, 'link', 'add', 'uA', 'type', 'veth', 'peer', 'name', 'uB', 'netns', nsB);
    await ipn(nsA, 'addr', 'add', '10.250.0.1/24', 'dev', 'uA');
    await ipn(nsB, 'addr', 'add', '10.250.0.2/24', 'dev', 'uB');
    await ipn(nsA, 'link', 'set', 'uA', 'up');
    await ipn(nsB, 'link', 'set', 'uB', 'up');
    await ipn(nsA, 'route', 'add', 'default', 'via', '10.250.0.2', 'dev', 'uA');

    // A: default gateway found on the NIC; B: given explicitly (B had no default route).
    await moveUnderlayToBrPhy(A(), 'uA', '10.250.0.1/24');
    await moveUnderlayToBrPhy(B(), 'uB', '10.250.0.2/24', '10.250.0.1');

    for (const [ovs, ns, nic, ip, gw] of [
      [A(), nsA, 'uA', '10.250.0.1/24', '10.250.0.2'],
      [B(), nsB, 'uB', '10.250.0.2/24', '10.250.0.1'],
    ] as const) {
      assert.equal(await ovs.vsctl('list-ports', 'br-phy'), `${nic}\n`);
      assert.equal(await ovs.vsctl('get', 'bridge', 'br-phy', 'datapath_type'), 'netdev\n');
      assert.deepEqual(lines(await ipn(ns, '-4', '-o', 'addr', 'show', 'dev', nic)), []);
      assert.match(await ipn(ns, '-4', '-o', 'addr', 'show', 'dev', 'br-phy'), new RegExp(`inet ${ip.replace(/\./g, '\\.')} `));
      assert.match(await ipn(ns, 'link', 'show', nic), /<[^>]*NOARP[^>]*UP[^>]*>/);
      assert.equal((await ipn(ns, 'route', 'show', 'default')).trim(), `default via ${gw} dev br-phy`);
    }

    await waitFor(() => nsExec(nsA, 'ping', '-c', '1', '-W', '1', '10.250.0.2').then(() => true), {
      timeoutMs: 10_000,
      what: 'ping A -> B over br-phy',
    });
    const out = await nsExec(nsB, 'ping', '-c', '1', '-W', '2', '10.250.0.1');
    assert.match(out, /1 packets transmitted, 1 received/);
    // The frames crossed OVS: A's br-phy learned B's br-phy MAC on its port uA.
    const macB = /link\/ether ([0-9a-f:]{17})/.exec(await ipn(nsB, 'link', 'show', 'br-phy'))?.[1];
    assert.ok(macB);
    const ofportA = (await A().vsctl('get', 'interface', 'uA', 'ofport')).trim();
    const fdb = lines(await A().appctl('fdb/show', 'br-phy'));
    assert.ok(
      fdb.some((l) => l.split(/\s+/)[0] === ofportA && l.split(/\s+/)[2] === macB),
      `fdb of br-phy in A lacks ${macB} on port ${ofportA}:\n${fdb.join('\n')}`,
    );
  });

  it('stop() ends both daemons of both instances (checked by pid) and is idempotent', async () => {
    const pids = [A(), B()].flatMap((o) => [o.pids.ovsdbServer, o.pids.vswitchd]).filter((p) => p !== null);
    assert.equal(pids.length, 4);
    for (const pid of pids) assert.equal(exited(pid), false);
    await Promise.all([A().stop(), B().stop()]);
    for (const pid of pids) assert.equal(exited(pid), true, `pid ${pid} still runs`);
    assert.deepEqual(A().pids, { ovsdbServer: null, vswitchd: null });
    await A().stop();
    assert.deepEqual(A().pids, { ovsdbServer: null, vswitchd: null });
    // Both daemons remove their sockets and pidfiles on a clean exit.
    for (const ovs of [A(), B()]) assert.deepEqual(readdirSync(ovs.runDir), []);
  });
});
