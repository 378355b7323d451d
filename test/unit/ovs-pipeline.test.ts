import assert from 'node:assert/strict';

import { nextRound, parseRound } from '../../src/backend/ovs/bridge.js';
import { countDiff, parseOvsOptions } from '../../src/backend/ovs/ovs.js';
import {
  Category,
  cookieOf,
  desiredFlows,
  macFromIP,
  OBJECT_MASK,
  CATEGORY_ONLY_MASK,
  peerFlows,
  pipelineFlows,
  TABLES,
  podFlows,
  renderFlows,
  roundCookie,
  roundOf,
  ROUND_MASK,
} from '../../src/backend/ovs/pipeline.js';
import { ConfigError } from '../../src/subnet/config.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';

const node = {
  vni: 7,
  tunnelPort: 32768,
  gatewayPort: 32769,
  gatewayIP: IPAddr.parse('10.244.1.1'),
  gatewayMAC: '0a:58:0a:f4:01:01',
};
const pod = { ofport: 3, ip: IPAddr.parse('10.244.1.2'), mac: '0a:58:0a:f4:01:02' };
const peer = { subnet: IPNet.parse('10.244.2.0/24'), publicIP: IPAddr.parse('192.168.50.2') };

describe('ovs pipeline (pure)', () => {
  it('packs round, category and object id into the cookie', () => {
    const c = cookieOf(0x12, Category.Peer, Number(IPAddr.parse('10.244.2.0').value));
    assert.equal(c, 0x0012_02_00_0af40200n);
    assert.equal(roundOf(c), 0x12);
    assert.equal(c & ROUND_MASK, roundCookie(0x12));
    assert.equal(c & OBJECT_MASK, cookieOf(0, Category.Peer, 0x0af40200));
  });

  it('takes rounds 1..65535 and wraps past the last one', () => {
    assert.deepEqual([nextRound(null), nextRound(1), nextRound(0xfffe), nextRound(0xffff)], [1, 2, 0xffff, 1]);
  });

  it('reads a round as ovs-vsctl prints it, and nothing else', () => {
    assert.deepEqual(['"7"\n', '7', '', '\n', '"0"', '"65536"', '"x"'].map(parseRound), [7, 7, null, null, null, null, null]);
  });

  it('derives MACs from IPv4 addresses (0a:58 + address bytes)', () => {
    assert.equal(macFromIP(IPAddr.parse('10.244.255.1')), '0a:58:0a:f4:ff:01');
    assert.throws(() => macFromIP(IPAddr.parse('fd00::1')), /IPv4/);
  });

  it('renders a pod its five flows under its own cookie', () => {
    assert.equal(
      renderFlows(podFlows(2, node, pod)),
      [
        'cookie=0x2030000000003,table=0,priority=190,in_port=3,actions=set_field:0x3/0xf->reg0,goto_table:10',
        'cookie=0x2030000000003,table=10,priority=200,ip,in_port=3,dl_src=0a:58:0a:f4:01:02,nw_src=10.244.1.2,actions=goto_table:30',
        'cookie=0x2030000000003,table=10,priority=200,arp,in_port=3,arp_spa=10.244.1.2,arp_sha=0a:58:0a:f4:01:02,actions=goto_table:20',
        'cookie=0x2030000000003,table=30,priority=200,ip,dl_dst=aa:bb:cc:dd:ee:ff,nw_dst=10.244.1.2,actions=set_field:0a:58:0a:f4:01:01->eth_src,set_field:0a:58:0a:f4:01:02->eth_dst,dec_ttl,goto_table:40',
        'cookie=0x2030000000003,table=40,priority=200,dl_dst=0a:58:0a:f4:01:02,actions=set_field:0x3->reg1,set_field:0x100/0x100->reg0,goto_table:50',
        '',
      ].join('\n'),
    );
  });

  it('sends a peer subnet into the tunnel with its VNI, decrementing TTL only for pod traffic', () => {
    const lines = renderFlows(peerFlows(1, node, peer)).trim().split('\n');
    assert.equal(lines.length, 3);
    assert.match(lines[0]!, /^cookie=0x102000af40200,table=20,priority=200,arp,arp_op=1,arp_tpa=10\.244\.2\.1,actions=.*set_field:aa:bb:cc:dd:ee:ff->arp_sha.*set_field:10\.244\.2\.1->arp_spa,IN_PORT$/);
    assert.equal(
      lines[1],
      'cookie=0x102000af40200,table=30,priority=200,ip,reg0=0x3/0xf,nw_dst=10.244.2.0/24,actions=set_field:0a:58:0a:f4:01:01->eth_src,set_field:aa:bb:cc:dd:ee:ff->eth_dst,set_field:192.168.50.2->tun_dst,set_field:0x7->tun_id,dec_ttl,goto_table:40',
    );
    assert.equal(
      lines[2],
      'cookie=0x102000af40200,table=30,priority=200,ip,reg0=0x2/0xf,nw_dst=10.244.2.0/24,actions=set_field:0a:58:0a:f4:01:01->eth_src,set_field:aa:bb:cc:dd:ee:ff->eth_dst,set_field:192.168.50.2->tun_dst,set_field:0x7->tun_id,goto_table:40',
    );
  });

  it('orders the whole table by table and priority, with one drop default per checking table', () => {
    const text = renderFlows(desiredFlows(1, node, [pod], [peer]));
    const lines = text.trim().split('\n');
    assert.equal(lines.length, 16 + 5 + 3);
    const tables = lines.map((l) => Number(/table=(\d+)/.exec(l)![1]));
    assert.deepEqual(tables, [...tables].sort((a, b) => a - b));
    assert.deepEqual(lines.filter((l) => l.endsWith('actions=drop')).map((l) => /table=(\d+)/.exec(l)![1]), ['0', '10', '20', '50']);
    assert.ok(lines.includes('cookie=0x1010000000000,table=0,priority=200,in_port=32768,tun_id=0x7,actions=set_field:0x1/0xf->reg0,goto_table:30'));
  });

  it('without {policy: true} the frame is exactly the pre-policy pipeline (nothing past table 50)', () => {
    const text = renderFlows(pipelineFlows(1, node));
    assert.equal(
      text,
      [
        'cookie=0x1010000000000,table=0,priority=200,in_port=32768,tun_id=0x7,actions=set_field:0x1/0xf->reg0,goto_table:30',
        'cookie=0x1010000000000,table=0,priority=200,in_port=32769,actions=set_field:0x2/0xf->reg0,goto_table:10',
        'cookie=0x1010000000000,table=0,priority=0,actions=drop',
        'cookie=0x1010000000000,table=10,priority=200,ip,in_port=32769,actions=goto_table:30',
        'cookie=0x1010000000000,table=10,priority=200,arp,in_port=32769,actions=goto_table:20',
        'cookie=0x1010000000000,table=10,priority=0,actions=drop',
        'cookie=0x1010000000000,table=20,priority=200,arp,arp_op=1,arp_tpa=10.244.1.1,actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:0a:58:0a:f4:01:01->eth_src,set_field:2->arp_op,move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],set_field:0a:58:0a:f4:01:01->arp_sha,move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],set_field:10.244.1.1->arp_spa,IN_PORT',
        'cookie=0x1010000000000,table=20,priority=190,arp,actions=NORMAL',
        'cookie=0x1010000000000,table=20,priority=0,actions=drop',
        'cookie=0x1010000000000,table=30,priority=210,ip,dl_dst=aa:bb:cc:dd:ee:ff,nw_dst=10.244.1.1,actions=set_field:0a:58:0a:f4:01:01->eth_dst,goto_table:40',
        'cookie=0x1010000000000,table=30,priority=0,actions=goto_table:40',
        'cookie=0x1010000000000,table=40,priority=200,dl_dst=0a:58:0a:f4:01:01,actions=set_field:0x8001->reg1,set_field:0x100/0x100->reg0,goto_table:50',
        'cookie=0x1010000000000,table=40,priority=200,dl_dst=aa:bb:cc:dd:ee:ff,actions=set_field:0x8000->reg1,set_field:0x100/0x100->reg0,goto_table:50',
        'cookie=0x1010000000000,table=40,priority=0,actions=goto_table:50',
        'cookie=0x1010000000000,table=50,priority=200,reg0=0x100/0x100,actions=output:NXM_NX_REG1[]',
        'cookie=0x1010000000000,table=50,priority=0,actions=drop',
        '',
      ].join('\n'),
    );
    assert.equal(renderFlows(pipelineFlows(1, node, { policy: false })), text);
    assert.equal(renderFlows(desiredFlows(1, node, [pod], [peer], {})), renderFlows(desiredFlows(1, node, [pod], [peer])));
    assert.ok(desiredFlows(1, node, [pod], [peer]).every((f) => TABLES[f.table] <= TABLES.output));
  });

  it('with {policy: true}: tables 0–40 unchanged, and the frame of the policy tables (conntrack, defaults, gateway bypass, commit)', () => {
    const plain = pipelineFlows(1, node);
    const withPolicy = pipelineFlows(1, node, { policy: true });
    const before = (fs: typeof plain) => renderFlows(fs.filter((f) => TABLES[f.table] < TABLES.output));
    assert.equal(before(withPolicy), before(plain));
    const lines = renderFlows(withPolicy.filter((f) => TABLES[f.table] >= TABLES.output)).trim().split('\n');
    assert.deepEqual(lines, [
      // IP packets with a known output port go through conntrack; everything else leaves as before.
      'cookie=0x1010000000000,table=50,priority=210,ip,reg0=0x100/0x100,actions=ct(table=51,zone=65520)',
      'cookie=0x1010000000000,table=50,priority=190,reg0=0x100/0x100,actions=output:NXM_NX_REG1[]',
      'cookie=0x1010000000000,table=50,priority=0,actions=drop',
      // Invalid dropped, established/related/replies straight to the output, new ones to the rules.
      'cookie=0x1010000000000,table=51,priority=210,ct_state=+inv+trk,ip,actions=drop',
      'cookie=0x1010000000000,table=51,priority=200,ct_state=-new+trk,ip,actions=goto_table:60',
      'cookie=0x1010000000000,table=51,priority=0,actions=goto_table:52',
      // The rule tables pass everything on by default (the enforcer adds rules and drops).
      'cookie=0x1010000000000,table=52,priority=0,actions=goto_table:53',
      'cookie=0x1010000000000,table=53,priority=0,actions=goto_table:54',
      // The node's own address skips the ingress rules.
      'cookie=0x1010000000000,table=54,priority=220,ip,reg0=0x2/0xf,nw_src=10.244.1.1,actions=goto_table:56',
      'cookie=0x1010000000000,table=54,priority=0,actions=goto_table:55',
      'cookie=0x1010000000000,table=55,priority=0,actions=goto_table:56',
      // New connections committed with the deciding rules' conjunction ids in ct_label.
      'cookie=0x1010000000000,table=56,priority=200,ct_state=+new+trk,ip,actions=ct(commit,zone=65520,exec(move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31],move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63])),goto_table:60',
      'cookie=0x1010000000000,table=56,priority=0,actions=goto_table:60',
      'cookie=0x1010000000000,table=60,priority=200,reg0=0x100/0x100,actions=output:NXM_NX_REG1[]',
      'cookie=0x1010000000000,table=60,priority=0,actions=drop',
    ]);
    // Every table the frame uses has one default, every goto lands on a table of the frame, and no
    // frame flow carries the Policy category (the enforcer's sweeps delete by that category).
    const tables = new Set<number>(withPolicy.map((f) => TABLES[f.table]));
    for (const t of tables) assert.equal(withPolicy.filter((f) => TABLES[f.table] === t && f.priority === 0 && f.match.length === 0).length, 1, `table ${t}`);
    for (const f of withPolicy) {
      for (const a of f.actions) {
        if (a.type === 'goto_table' || (a.type === 'ct' && a.table !== undefined)) assert.ok(tables.has(a.table!), `${renderFlows([f])}: table ${a.table} is not in the frame`);
      }
      assert.notEqual(f.cookie & CATEGORY_ONLY_MASK, cookieOf(0, Category.Policy, 0), renderFlows([f]));
    }
    // With the Services' ranges, packets to them skip the egress rules (judged after the host's DNAT).
    const svc = pipelineFlows(1, node, { policy: true, serviceCIDRs: [IPNet.parse('10.96.0.0/12')] }).filter((f) => f.table === 'conntrackState');
    assert.ok(renderFlows(svc).includes('table=51,priority=190,ip,nw_dst=10.96.0.0/12,actions=goto_table:54'), renderFlows(svc));
  });

  it('counts diff-flows output as added, changed and removed flows', () => {
    const diff = [
      '-table=30 priority=200,ip,reg0=0x3/0xf,nw_dst=10.244.2.0/24 cookie=0x1 actions=drop',
      '+table=30 priority=200,ip,reg0=0x3/0xf,nw_dst=10.244.2.0/24 cookie=0x2 actions=drop',
      '+table=40 priority=200,dl_dst=0a:58:0a:f4:01:02 cookie=0x2 actions=goto_table:50',
      '-table=50 priority=5,ip cookie=0x1 actions=drop',
      '-table=50 priority=6,ip cookie=0x1 actions=drop',
    ];
    assert.deepEqual(countDiff(diff), { added: 1, changed: 1, removed: 2 });
    assert.deepEqual(countDiff([]), { added: 0, changed: 0, removed: 0 });
  });

  it('parses the backend options with defaults and named errors', () => {
    assert.deepEqual(parseOvsOptions({ Type: 'ovs' }), { vni: 1, port: 4789, bridge: 'br-int', datapathType: 'system', mtu: null });
    assert.deepEqual(parseOvsOptions({ Type: 'ovs', vni: 9, Port: 8472, Bridge: 'br0', DatapathType: 'netdev', MTU: 9000 }), {
      vni: 9,
      port: 8472,
      bridge: 'br0',
      datapathType: 'netdev',
      mtu: 9000,
    });
    assert.throws(() => parseOvsOptions({ DatapathType: 'dpdk' }), (e: Error) => e instanceof ConfigError && /Backend.DatapathType "dpdk": must be one of system, netdev/.test(e.message));
    assert.throws(() => parseOvsOptions({ Bridge: 'a-very-long-bridge-name' }), /Backend.Bridge "a-very-long-bridge-name": must be an interface name/);
    assert.throws(() => parseOvsOptions({ VNI: -1 }), /Backend.VNI -1: must be from 0 to 16777215/);
  });
});
