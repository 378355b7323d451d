// `weft trace` on an ovs node whose pipeline enforces NetworkPolicy: ofproto/trace texts captured
// on a real Open vSwitch 3.1 (test/fixtures/trace/capture-ovs-policy.ts: br-int built by the ovs
// backend's own code with the policy tables' frame, `desiredFlows(1, node, pods, [], { policy:
// true })`, and the rule flows programmed by PolicyOvsDriver from the policy engine; netdev
// datapath). An IP packet goes through ct(table=51) in table 50: the trace forks a recirculated
// pipeline ("recirc(0x1) - resume conntrack with default ct_state=trk|new") whose tables decide.
//
// The node: lease 10.244.1.0/24 (gateway 10.244.1.1), pods x/a 10.244.1.2 (vpod2, ofport 1),
// x/b 10.244.1.3 (vpod3, ofport 2), x/c 10.244.1.4 (vpod4, ofport 3), x/d 10.244.1.5 (vpod5,
// ofport 4). Policies in namespace x: b-ingress (pods app=b: ingress from app=a on TCP 80: a
// conjunction of pod, peer and port), c-egress (pods app=c, Egress and Ingress: egress to
// anything, a flow whose only clause is the pod, priority 210; ingress nothing: default deny) and
// d-egress (pods app=d, Egress, no rules: default deny).
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

import { analyze } from '../../src/cli/trace/analyze.js';
import { parseSubnetEnvFacts } from '../../src/cli/trace/collect.js';
import { parsePacket } from '../../src/cli/trace/command.js';
import { bridgePolicy, cookieOwner, ovsEntry, parseOfTrace, planOvsTrace, summarizeOvsTrace, TABLE_NAMES } from '../../src/cli/trace/ovs.js';
import { fetchPolicy } from '../../src/cli/trace/policy-hops.js';
import { renderTrace } from '../../src/cli/trace/render.js';
import type { Hop, HopKind, OvsPodPortFacts, RouteLookup, TraceFacts, TraceReport } from '../../src/cli/trace/types.js';
import { TABLES } from '../../src/backend/ovs/pipeline.js';
import { PolicyEngine } from '../../src/policy/engine.js';
import { explainPacket, type PolicyAnswer, type PolicyDecision } from '../../src/policy/explain.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from '../../src/policy/objects.js';
import { PolicyFlowModel } from '../../src/policy/ovs/flows.js';
import type { Lease } from '../../src/subnet/lease.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { validate } from '../fixtures/trace/validate.js';

/** Allowed by b-ingress: `ofproto/trace br-int in_port=1,tcp,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_ttl=64,tp_dst=80`. */
const A_TO_B_80 = `Flow: tcp,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
 0. in_port=1, priority 190, cookie 0x1030000000001
    set_field:0x3/0xf->reg0
    goto_table:10
10. ip,in_port=1,dl_src=0a:58:0a:f4:01:02,nw_src=10.244.1.2, priority 200, cookie 0x1030000000001
    goto_table:30
30. priority 0, cookie 0x1010000000000
    goto_table:40
40. dl_dst=0a:58:0a:f4:01:03, priority 200, cookie 0x1030000000002
    set_field:0x2->reg1
    set_field:0x100/0x100->reg0
    goto_table:50
50. ip,reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    ct(table=51,zone=65520)
    drop
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: tcp,reg0=0x103,reg1=0x2,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0,eth,ip,in_port=1,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_frag=no
Datapath actions: ct(zone=65520),recirc(0x1)

===============================================================================
recirc(0x1) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x1,ct_state=new|trk,ct_zone=65520,eth,tcp,reg0=0x103,reg1=0x2,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
    thaw
        Resuming from table 51
51. priority 0, cookie 0x1010000000000
    goto_table:52
52. priority 0, cookie 0x1010000000000
    goto_table:53
53. priority 0, cookie 0x1010000000000
    goto_table:54
54. conj_id=2414492591,ip, priority 200, cookie 0x104008fea3baf
    set_field:0x8fea3baf->reg3
    goto_table:56
56. ct_state=+new+trk,ip, priority 200, cookie 0x1010000000000
    ct(commit,zone=65520,exec(move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31],move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63]))
    move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31]
     -> NXM_NX_CT_LABEL[0..31] is now 0
    move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63]
     -> NXM_NX_CT_LABEL[32..63] is now 0x8fea3baf
     -> Sets the packet to an untracked state, and clears all the conntrack fields.
    goto_table:60
60. reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    output:NXM_NX_REG1[]
     -> output port is 2

Final flow: recirc_id=0x1,eth,tcp,reg0=0x103,reg1=0x2,reg3=0x8fea3baf,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0x1,ct_state=+new-inv+trk,eth,tcp,in_port=1,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_frag=no,tp_dst=80
Datapath actions: ct(commit,zone=65520,label=0x8fea3baf00000000/0xffffffffffffffff),5
`;

/** Dropped: b ingress default deny: `ofproto/trace br-int in_port=1,tcp,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_ttl=64,tp_dst=81`. */
const A_TO_B_81 = `Flow: tcp,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=81,tcp_flags=0

bridge("br-int")
----------------
 0. in_port=1, priority 190, cookie 0x1030000000001
    set_field:0x3/0xf->reg0
    goto_table:10
10. ip,in_port=1,dl_src=0a:58:0a:f4:01:02,nw_src=10.244.1.2, priority 200, cookie 0x1030000000001
    goto_table:30
30. priority 0, cookie 0x1010000000000
    goto_table:40
40. dl_dst=0a:58:0a:f4:01:03, priority 200, cookie 0x1030000000002
    set_field:0x2->reg1
    set_field:0x100/0x100->reg0
    goto_table:50
50. ip,reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    ct(table=51,zone=65520)
    drop
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: tcp,reg0=0x103,reg1=0x2,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=81,tcp_flags=0
Megaflow: recirc_id=0,eth,ip,in_port=1,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_frag=no
Datapath actions: ct(zone=65520),recirc(0x2)

===============================================================================
recirc(0x2) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x2,ct_state=new|trk,ct_zone=65520,eth,tcp,reg0=0x103,reg1=0x2,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=81,tcp_flags=0

bridge("br-int")
----------------
    thaw
        Resuming from table 51
51. priority 0, cookie 0x1010000000000
    goto_table:52
52. priority 0, cookie 0x1010000000000
    goto_table:53
53. priority 0, cookie 0x1010000000000
    goto_table:54
54. priority 0, cookie 0x1010000000000
    goto_table:55
55. ip,nw_dst=10.244.1.3, priority 200, cookie 0x1040000000000
    drop

Final flow: unchanged
Megaflow: recirc_id=0x2,ct_state=+new-inv+trk,eth,tcp,in_port=1,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_frag=no,tp_dst=81
Datapath actions: drop
`;

/** Allowed by c-egress, pod-only flow: `ofproto/trace br-int in_port=3,tcp,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_ttl=64,tp_dst=80`. */
const C_TO_A_80 = `Flow: tcp,in_port=3,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
 0. in_port=3, priority 190, cookie 0x1030000000003
    set_field:0x3/0xf->reg0
    goto_table:10
10. ip,in_port=3,dl_src=0a:58:0a:f4:01:04,nw_src=10.244.1.4, priority 200, cookie 0x1030000000003
    goto_table:30
30. priority 0, cookie 0x1010000000000
    goto_table:40
40. dl_dst=0a:58:0a:f4:01:02, priority 200, cookie 0x1030000000001
    set_field:0x1->reg1
    set_field:0x100/0x100->reg0
    goto_table:50
50. ip,reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    ct(table=51,zone=65520)
    drop
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: tcp,reg0=0x103,reg1=0x1,in_port=3,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0,eth,ip,in_port=3,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_frag=no
Datapath actions: ct(zone=65520),recirc(0x3)

===============================================================================
recirc(0x3) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x3,ct_state=new|trk,ct_zone=65520,eth,tcp,reg0=0x103,reg1=0x1,in_port=3,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
    thaw
        Resuming from table 51
51. priority 0, cookie 0x1010000000000
    goto_table:52
52. ip,reg0=0x3/0xf,nw_src=10.244.1.4, priority 210, cookie 0x104005a2ad1d9
    set_field:0x5a2ad1d9->reg2
    goto_table:54
54. priority 0, cookie 0x1010000000000
    goto_table:55
55. priority 0, cookie 0x1010000000000
    goto_table:56
56. ct_state=+new+trk,ip, priority 200, cookie 0x1010000000000
    ct(commit,zone=65520,exec(move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31],move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63]))
    move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31]
     -> NXM_NX_CT_LABEL[0..31] is now 0x5a2ad1d9
    move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63]
     -> NXM_NX_CT_LABEL[32..63] is now 0
     -> Sets the packet to an untracked state, and clears all the conntrack fields.
    goto_table:60
60. reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    output:NXM_NX_REG1[]
     -> output port is 1

Final flow: recirc_id=0x3,eth,tcp,reg0=0x103,reg1=0x1,reg2=0x5a2ad1d9,in_port=3,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0x3,ct_state=+new-inv+trk,eth,tcp,in_port=3,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_frag=no,tp_dst=80
Datapath actions: ct(commit,zone=65520,label=0x5a2ad1d9/0xffffffffffffffff),4
`;

/** Dropped: c ingress default deny: `ofproto/trace br-int in_port=1,tcp,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.2,nw_dst=10.244.1.4,nw_ttl=64,tp_dst=80`. */
const A_TO_C_80 = `Flow: tcp,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.2,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
 0. in_port=1, priority 190, cookie 0x1030000000001
    set_field:0x3/0xf->reg0
    goto_table:10
10. ip,in_port=1,dl_src=0a:58:0a:f4:01:02,nw_src=10.244.1.2, priority 200, cookie 0x1030000000001
    goto_table:30
30. priority 0, cookie 0x1010000000000
    goto_table:40
40. dl_dst=0a:58:0a:f4:01:04, priority 200, cookie 0x1030000000003
    set_field:0x3->reg1
    set_field:0x100/0x100->reg0
    goto_table:50
50. ip,reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    ct(table=51,zone=65520)
    drop
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: tcp,reg0=0x103,reg1=0x3,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.2,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0,eth,ip,in_port=1,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.2,nw_frag=no
Datapath actions: ct(zone=65520),recirc(0x4)

===============================================================================
recirc(0x4) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x4,ct_state=new|trk,ct_zone=65520,eth,tcp,reg0=0x103,reg1=0x3,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.2,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
    thaw
        Resuming from table 51
51. priority 0, cookie 0x1010000000000
    goto_table:52
52. priority 0, cookie 0x1010000000000
    goto_table:53
53. priority 0, cookie 0x1010000000000
    goto_table:54
54. priority 0, cookie 0x1010000000000
    goto_table:55
55. ip,nw_dst=10.244.1.4, priority 200, cookie 0x1040000000000
    drop

Final flow: unchanged
Megaflow: recirc_id=0x4,ct_state=+new-inv+trk,eth,tcp,in_port=1,nw_src=10.244.1.2,nw_dst=10.244.1.4,nw_frag=no,tp_dst=80
Datapath actions: drop
`;

/** Dropped: d egress default deny: `ofproto/trace br-int in_port=4,tcp,dl_src=0a:58:0a:f4:01:05,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.5,nw_dst=10.244.1.2,nw_ttl=64,tp_dst=80`. */
const D_TO_A_80 = `Flow: tcp,in_port=4,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:05,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.5,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
 0. in_port=4, priority 190, cookie 0x1030000000004
    set_field:0x3/0xf->reg0
    goto_table:10
10. ip,in_port=4,dl_src=0a:58:0a:f4:01:05,nw_src=10.244.1.5, priority 200, cookie 0x1030000000004
    goto_table:30
30. priority 0, cookie 0x1010000000000
    goto_table:40
40. dl_dst=0a:58:0a:f4:01:02, priority 200, cookie 0x1030000000001
    set_field:0x1->reg1
    set_field:0x100/0x100->reg0
    goto_table:50
50. ip,reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    ct(table=51,zone=65520)
    drop
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: tcp,reg0=0x103,reg1=0x1,in_port=4,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:05,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.5,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0,eth,ip,in_port=4,dl_src=0a:58:0a:f4:01:05,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.5,nw_frag=no
Datapath actions: ct(zone=65520),recirc(0x5)

===============================================================================
recirc(0x5) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x5,ct_state=new|trk,ct_zone=65520,eth,tcp,reg0=0x103,reg1=0x1,in_port=4,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:05,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.5,nw_dst=10.244.1.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
    thaw
        Resuming from table 51
51. priority 0, cookie 0x1010000000000
    goto_table:52
52. priority 0, cookie 0x1010000000000
    goto_table:53
53. ip,reg0=0x3/0xf,nw_src=10.244.1.5, priority 200, cookie 0x1040000000000
    drop

Final flow: unchanged
Megaflow: recirc_id=0x5,ct_state=+new-inv+trk,eth,ip,in_port=4,nw_src=10.244.1.5,nw_frag=no
Datapath actions: drop
`;

/** The node skips ingress rules: `ofproto/trace br-int in_port=32769,tcp,dl_src=0a:58:0a:f4:01:01,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.1,nw_dst=10.244.1.4,nw_ttl=64,tp_dst=80`. */
const HOST_TO_C_80 = `Flow: tcp,in_port=32769,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:01,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.1,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
 0. in_port=32769, priority 200, cookie 0x1010000000000
    set_field:0x2/0xf->reg0
    goto_table:10
10. ip,in_port=32769, priority 200, cookie 0x1010000000000
    goto_table:30
30. priority 0, cookie 0x1010000000000
    goto_table:40
40. dl_dst=0a:58:0a:f4:01:04, priority 200, cookie 0x1030000000003
    set_field:0x3->reg1
    set_field:0x100/0x100->reg0
    goto_table:50
50. ip,reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    ct(table=51,zone=65520)
    drop
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: tcp,reg0=0x102,reg1=0x3,in_port=32769,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:01,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.1,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0,eth,ip,in_port=32769,dl_dst=0a:58:0a:f4:01:04,nw_frag=no
Datapath actions: ct(zone=65520),recirc(0x6)

===============================================================================
recirc(0x6) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x6,ct_state=new|trk,ct_zone=65520,eth,tcp,reg0=0x102,reg1=0x3,in_port=32769,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:01,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.1,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0

bridge("br-int")
----------------
    thaw
        Resuming from table 51
51. priority 0, cookie 0x1010000000000
    goto_table:52
52. priority 0, cookie 0x1010000000000
    goto_table:53
53. priority 0, cookie 0x1010000000000
    goto_table:54
54. ip,reg0=0x2/0xf,nw_src=10.244.1.1, priority 220, cookie 0x1010000000000
    goto_table:56
56. ct_state=+new+trk,ip, priority 200, cookie 0x1010000000000
    ct(commit,zone=65520,exec(move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31],move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63]))
    move:NXM_NX_REG2[]->NXM_NX_CT_LABEL[0..31]
     -> NXM_NX_CT_LABEL[0..31] is now 0
    move:NXM_NX_REG3[]->NXM_NX_CT_LABEL[32..63]
     -> NXM_NX_CT_LABEL[32..63] is now 0
     -> Sets the packet to an untracked state, and clears all the conntrack fields.
    goto_table:60
60. reg0=0x100/0x100, priority 200, cookie 0x1010000000000
    output:NXM_NX_REG1[]
     -> output port is 3

Final flow: recirc_id=0x6,eth,tcp,reg0=0x102,reg1=0x3,in_port=32769,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:01,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.1,nw_dst=10.244.1.4,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0
Megaflow: recirc_id=0x6,ct_state=+new-inv+trk,eth,ip,in_port=32769,nw_src=10.244.1.1,nw_frag=no
Datapath actions: ct(commit,zone=65520,label=0/0xffffffffffffffff),6
`;

/** The conjunction ids the captured flows carry (FNV-1a of rule id and ports: the same on every run). */
const B_INGRESS_CONJ = 2414492591; // 0x8fea3baf
const C_EGRESS_CONJ = 1512755673; // 0x5a2ad1d9

const NETWORK = IPNet.parse('10.244.0.0/16');
const SUBNET = IPNet.parse('10.244.1.0/24');
const GW_MAC = '0a:58:0a:f4:01:01';
const PODS: OvsPodPortFacts[] = [
  { name: 'vpod2', ofport: 1, ip: IPAddr.parse('10.244.1.2'), mac: '0a:58:0a:f4:01:02', containerId: 'ctr-pod2' },
  { name: 'vpod3', ofport: 2, ip: IPAddr.parse('10.244.1.3'), mac: '0a:58:0a:f4:01:03', containerId: 'ctr-pod3' },
  { name: 'vpod4', ofport: 3, ip: IPAddr.parse('10.244.1.4'), mac: '0a:58:0a:f4:01:04', containerId: 'ctr-pod4' },
  { name: 'vpod5', ofport: 4, ip: IPAddr.parse('10.244.1.5'), mac: '0a:58:0a:f4:01:05', containerId: 'ctr-pod5' },
];
const PORTS = { tunnel: 32768, gateway: 32769, pods: new Set(PODS.map((p) => p.ofport)) };

/** The engine's state of the capture, and the OVS flow model PolicyOvsDriver keeps from it. */
function captureModel(): PolicyFlowModel {
  const e = new PolicyEngine('n1');
  e.upsertNamespace(parseNamespace({ metadata: { name: 'x', labels: { team: 'x' } } }));
  for (const [name, i] of [['a', 2], ['b', 3], ['c', 4], ['d', 5]] as const) {
    e.upsertPod(
      parsePod({
        metadata: { namespace: 'x', name, labels: { app: name } },
        spec: { nodeName: 'n1', containers: [{ name: 'c', ports: [{ name: 'http', containerPort: 80, protocol: 'TCP' }] }] },
        status: { phase: 'Running', podIPs: [{ ip: SUBNET.nth(BigInt(i)).toString() }] },
      }),
    );
  }
  const policy = (name: string, spec: Record<string, unknown>) => e.upsertPolicy(parseNetworkPolicy({ metadata: { namespace: 'x', name }, spec }));
  policy('b-ingress', { podSelector: { matchLabels: { app: 'b' } }, policyTypes: ['Ingress'], ingress: [{ from: [{ podSelector: { matchLabels: { app: 'a' } } }], ports: [{ port: 80, protocol: 'TCP' }] }] });
  policy('c-egress', { podSelector: { matchLabels: { app: 'c' } }, policyTypes: ['Egress', 'Ingress'], egress: [{}] });
  policy('d-egress', { podSelector: { matchLabels: { app: 'd' } }, policyTypes: ['Egress'] });
  const m = new PolicyFlowModel();
  m.reset(e.snapshot());
  return m;
}

/** weftd's /policy answer on the capture's node, as the enforcer's explain() makes it on an ovs node. */
function answerOf(m: PolicyFlowModel, src: string, dst: string, dport: number): PolicyAnswer {
  const conj = new Map([...m.conjunctions()].map(([id, rule]) => [id, rule.id]));
  return { programmed: true, decisions: explainPacket(m.state, IPAddr.parse(src), IPAddr.parse(dst), 'TCP', dport, conj) };
}

function route(prefix: string, gateway: string | null, device: string): RouteLookup {
  return { ok: true, type: 'unicast', prefix: IPNet.parse(prefix), gateway: gateway ? IPAddr.parse(gateway) : null, device, protocol: 'kernel', onlink: false, nexthopId: null, prefsrc: null, table: null };
}
const LEASE: Lease = {
  subnet: SUBNET,
  ipv6Subnet: null,
  attrs: { publicIP: IPAddr.parse('10.250.0.1'), publicIPv6: null, backendType: 'ovs', backendData: { VNI: 1 } },
  reservation: false,
  expiration: null,
};

/** Facts as collect gathers them on the node: the flow from planOvsTrace (asserted to be the one captured), the trace text, weftd's answer. */
function facts(src: string, dst: string, dport: number, output: string, policy: PolicyAnswer | null): TraceFacts {
  const packet = parsePacket(src, dst, 'tcp', dport);
  const addresses = [
    { ifindex: 1, ip: IPAddr.parse('127.0.0.1') },
    { ifindex: 4, ip: IPAddr.parse('10.244.1.1') },
  ];
  const srcIsNode = addresses.some((a) => a.ip.equals(packet.src));
  const r = route('10.244.1.0/24', null, 'weft-gw0');
  const entryInput = { packet, srcIsNode, subnet: SUBNET, srcLease: null, route: r, gatewayDevice: 'weft-gw0' };
  const entry = ovsEntry(entryInput)!;
  const plan = planOvsTrace({ ...entryInput, entry, publicIP: IPAddr.parse('10.250.0.1'), pods: PODS, gatewayMac: GW_MAC, tunnelPort: 32768, gatewayPort: 32769, vni: 1, neighbours: [] });
  if (FLOWS.has(output)) assert.equal(plan.flow, FLOWS.get(output), 'trace picks the headers the capture traced');
  return {
    packet,
    subnetFile: '/run/flannel/subnet.env',
    env: { ...parseSubnetEnvFacts('FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\nWEFT_BACKEND=ovs\nWEFT_OVS_BRIDGE=br-int\nWEFT_OVS_RUNDIR=/var/run/openvswitch\nWEFT_OVS_DATAPATH=netdev\n') },
    config: { network: NETWORK, ipv6Network: null, backendType: 'ovs', enableNFTables: false },
    daemonBackend: 'ovs',
    leases: [LEASE],
    leaseSource: 'etcd',
    addresses,
    links: [
      { index: 1, name: 'lo', mtu: 65536, mac: null, adminUp: true, operState: 'UP', kind: null, vxlan: null },
      { index: 4, name: 'weft-gw0', mtu: 1450, mac: GW_MAC, adminUp: true, operState: 'UP', kind: 'tun', vxlan: null },
    ],
    ingress: srcIsNode ? null : 'weft-gw0',
    route: r,
    neighbours: [],
    fdb: [],
    underlay: new Map(),
    bridge: null,
    rules: { mode: 'iptables', modeSource: 'daemon', iptablesNat: null, iptablesFilter: null, nft: null, forwardRules: true, errors: [] },
    ipForward: true,
    policy,
    ovs: { bridge: 'br-int', runDir: '/var/run/openvswitch', datapath: 'netdev', tunnelPort: 32768, gatewayPort: 32769, gatewayMac: GW_MAC, pods: PODS, vni: 1, trace: { entry, inPort: plan.inPort, inPortName: plan.inPortName, flow: plan.flow, note: plan.note, output, error: null }, error: null },
    notes: [],
  };
}

/** The flow each capture traced (the comment above its text). */
const FLOWS = new Map<string, string>([
  [A_TO_B_80, 'in_port=1,tcp,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_ttl=64,tp_dst=80'],
  [A_TO_B_81, 'in_port=1,tcp,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_ttl=64,tp_dst=81'],
  [C_TO_A_80, 'in_port=3,tcp,dl_src=0a:58:0a:f4:01:04,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.4,nw_dst=10.244.1.2,nw_ttl=64,tp_dst=80'],
  [A_TO_C_80, 'in_port=1,tcp,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.2,nw_dst=10.244.1.4,nw_ttl=64,tp_dst=80'],
  [D_TO_A_80, 'in_port=4,tcp,dl_src=0a:58:0a:f4:01:05,dl_dst=0a:58:0a:f4:01:02,nw_src=10.244.1.5,nw_dst=10.244.1.2,nw_ttl=64,tp_dst=80'],
  [HOST_TO_C_80, 'in_port=32769,tcp,dl_src=0a:58:0a:f4:01:01,dl_dst=0a:58:0a:f4:01:04,nw_src=10.244.1.1,nw_dst=10.244.1.4,nw_ttl=64,tp_dst=80'],
]);

function hop<K extends HopKind>(r: TraceReport, kind: K, i = 0): Extract<Hop, { kind: K }> {
  const h = r.hops.filter((x) => x.kind === kind)[i];
  assert.ok(h, `no ${kind} hop in ${r.hops.map((x) => x.kind).join(',')}`);
  return h as Extract<Hop, { kind: K }>;
}
function checked(f: TraceFacts): TraceReport {
  const r = analyze(f);
  assert.deepEqual(validate(JSON.parse(JSON.stringify(r))), []);
  return r;
}

const A = '10.244.1.2';
const B = '10.244.1.3';
const C = '10.244.1.4';
const D = '10.244.1.5';
const NODE = '10.244.1.1';
const lines = (r: TraceReport): string[] => renderTrace(r).trimEnd().split('\n');

describe('trace ovs policy: reading a trace through conntrack', () => {
  it('follows the ct(table=51) fork into the recirculated pipeline: steps of both passes, the first pass\'s flow, the last pass\'s datapath actions', () => {
    const t = parseOfTrace(A_TO_B_80);
    assert.equal(t.flow, 'tcp,in_port=1,vlan_tci=0x0000,dl_src=0a:58:0a:f4:01:02,dl_dst=0a:58:0a:f4:01:03,nw_src=10.244.1.2,nw_dst=10.244.1.3,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=0,tp_dst=80,tcp_flags=0');
    assert.deepEqual(
      t.steps.map((s) => `${s.recirc ?? '-'}:${s.table}`),
      ['-:0', '-:10', '-:30', '-:40', '-:50', '0x1:51', '0x1:52', '0x1:53', '0x1:54', '0x1:56', '0x1:60'],
    );
    // The banner, "thaw" and "Resuming from table 51" belong to no step.
    assert.deepEqual(t.steps[4]!.actions, ['ct(table=51,zone=65520)', 'drop']);
    assert.deepEqual(t.steps[4]!.notes, ['A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 51.', 'Sets the packet to an untracked state, and clears all the conntrack fields.']);
    assert.deepEqual(t.steps[5], { bridge: 'br-int', table: 51, match: '', priority: 0, cookie: '0x1010000000000', actions: ['goto_table:52'], notes: [], recirc: '0x1' });
    assert.deepEqual(t.steps[8], { bridge: 'br-int', table: 54, match: 'conj_id=2414492591,ip', priority: 200, cookie: '0x104008fea3baf', actions: ['set_field:0x8fea3baf->reg3', 'goto_table:56'], notes: [], recirc: '0x1' });
    assert.deepEqual(
      t.sections.map((s) => [s.recirc, s.ctState, s.datapathActions]),
      [
        [null, null, 'ct(zone=65520),recirc(0x1)'],
        ['0x1', 'trk|new', 'ct(commit,zone=65520,label=0x8fea3baf00000000/0xffffffffffffffff),5'],
      ],
    );
    assert.match(t.sections[1]!.flow ?? '', /^recirc_id=0x1,ct_state=new\|trk,ct_zone=65520,/);
    assert.equal(t.datapathActions, 'ct(commit,zone=65520,label=0x8fea3baf00000000/0xffffffffffffffff),5');
    assert.equal(parseOfTrace(A_TO_B_81).finalFlow, 'unchanged');
  });

  it('names the policy tables and the policy flows\' owners', () => {
    for (const [key, table] of Object.entries(TABLES)) assert.ok(TABLE_NAMES.has(table), `TABLES.${key} (${table}) has a name`);
    assert.deepEqual([51, 52, 53, 54, 55, 56, 60].map((t) => TABLE_NAMES.get(t)), ['conntrack state', 'egress rules', 'egress default', 'ingress rules', 'ingress default', 'conntrack commit', 'policy output']);
    const none = () => null;
    assert.equal(cookieOwner('0x104008fea3baf', none, 54), 'policy conj_id 2414492591');
    assert.equal(cookieOwner('0x104005a2ad1d9', none, 52), 'policy conj_id 1512755673');
    assert.equal(cookieOwner('0x1040000000000', none, 55), 'policy default deny');
    assert.equal(cookieOwner('0x1040000000000', none, 53), 'policy default deny');
    assert.equal(cookieOwner('0x1040000000000', none, 54), 'policy clause');
  });

  it('summarises the new-connection path: output, drop point and the policy tables\' decisions', () => {
    const s = (text: string) => summarizeOvsTrace(parseOfTrace(text), PORTS, () => null);
    const allowed = s(A_TO_B_80);
    assert.deepEqual([allowed.spoofGuard, allowed.action, allowed.outputPort, allowed.droppedIn], ['pass', 'pod', 2, null]);
    assert.deepEqual(allowed.conntrack, { table: 50, recirc: '0x1', ctState: 'trk|new' });
    assert.deepEqual(
      allowed.tables.map((x) => `${x.table}:${x.owner}`),
      ['0:pod ofport 1', '10:pod ofport 1', '30:node', '40:pod ofport 2', '50:node', '51:node', '52:node', '53:node', '54:policy conj_id 2414492591', '56:node', '60:node'],
    );
    assert.deepEqual(allowed.policy, [
      { direction: 'egress', verdict: 'pass', table: 53, conjunction: null, cookie: '0x1010000000000', priority: 0, match: '' },
      { direction: 'ingress', verdict: 'allow', table: 54, conjunction: B_INGRESS_CONJ, cookie: '0x104008fea3baf', priority: 200, match: 'conj_id=2414492591,ip' },
    ]);
    const dropped = s(A_TO_B_81);
    assert.deepEqual([dropped.action, dropped.outputPort, dropped.droppedIn, dropped.datapathActions], ['drop', null, 55, 'drop']);
    assert.deepEqual(dropped.policy[1], { direction: 'ingress', verdict: 'drop', table: 55, conjunction: null, cookie: '0x1040000000000', priority: 200, match: 'ip,nw_dst=10.244.1.3' });
    const podOnly = s(C_TO_A_80);
    assert.deepEqual([podOnly.action, podOnly.outputPort], ['pod', 1]);
    assert.deepEqual(podOnly.policy.map((p) => [p.direction, p.verdict, p.table, p.conjunction, p.priority]), [['egress', 'allow', 52, C_EGRESS_CONJ, 210], ['ingress', 'pass', 55, null, 0]]);
    const node = s(HOST_TO_C_80);
    assert.deepEqual(node.policy.map((p) => [p.direction, p.verdict, p.table, p.priority]), [['egress', 'pass', 53, 0], ['ingress', 'node', 54, 220]]);
    assert.deepEqual(s(A_TO_C_80).policy.map((p) => [p.verdict, p.table]), [['pass', 53], ['drop', 55]]);
  });

  it('a trace that stops at the fork (no recirculated pipeline printed): dropped at the ct table, said so', () => {
    const cut = A_TO_B_80.slice(0, A_TO_B_80.indexOf('====='));
    const p = summarizeOvsTrace(parseOfTrace(cut), PORTS, () => null);
    assert.deepEqual([p.action, p.droppedIn, p.conntrack, p.policy], ['drop', 50, { table: 50, recirc: null, ctState: null }, []]);
    const m = captureModel();
    const r = checked(facts(A, B, 80, cut, answerOf(m, A, B, 80)));
    assert.match(hop(r, 'pipeline').summary, /; the trace does not follow the conntrack recirculation of table 50$/);
    assert.equal(hop(r, 'ovs-output').summary, 'dropped in output (table 50): the trace does not follow the conntrack recirculation');
    // Nothing to compare the decisions with.
    assert.deepEqual(r.hops.filter((h) => h.kind === 'policy').map((h) => [h.status, h.evidence.agrees, h.evidence.bridge?.verdict]), [['ok', null, 'not-reached'], ['ok', null, 'not-reached']]);
  });

  it('bridgePolicy: no conntrack on the path, no decisions', () => {
    assert.deepEqual(bridgePolicy([{ table: 50, match: 'reg0=0x100/0x100', priority: 200, cookie: '0x1010000000000', actions: ['output:NXM_NX_REG1[]'] }]), []);
  });
});

describe('trace ovs policy: weftd\'s answer carries the rules\' conjunction ids', () => {
  it('the flow model of the capture\'s state has the conjunction ids the captured flows carry', () => {
    const m = captureModel();
    const conj = new Map([...m.conjunctions()].map(([id, rule]) => [id, `${rule.policy.namespace}/${rule.policy.name} ${rule.direction}[${rule.index}]`]));
    assert.deepEqual(conj, new Map([[B_INGRESS_CONJ, 'x/b-ingress ingress[0]'], [C_EGRESS_CONJ, 'x/c-egress egress[0]']]));
  });

  it('explainPacket names the deciding rule\'s conjunctions (ovs), and none without the map (nftables)', () => {
    const m = captureModel();
    const allowed = answerOf(m, A, B, 80).decisions;
    assert.deepEqual(allowed, [
      { direction: 'egress', pod: 'x/a', allowed: true, by: 'unrestricted' },
      { direction: 'ingress', pod: 'x/b', allowed: true, by: { namespace: 'x', policy: 'b-ingress', rule: 0 }, conjunctions: [B_INGRESS_CONJ], otherConjunctions: [] },
    ]);
    assert.deepEqual(answerOf(m, A, B, 81).decisions[1], { direction: 'ingress', pod: 'x/b', allowed: false, by: 'default-deny', otherConjunctions: [] });
    const nft = explainPacket(m.state, IPAddr.parse(A), IPAddr.parse(B), 'TCP', 80);
    assert.deepEqual(nft[1], { direction: 'ingress', pod: 'x/b', allowed: true, by: { namespace: 'x', policy: 'b-ingress', rule: 0 } });
  });
});

describe('trace ovs policy: reading weftd\'s /policy answer', () => {
  /** weftd's /policy on a local port, answering `body` (and recording the query). */
  async function serve(body: unknown, fn: (endpoint: string) => Promise<void>): Promise<string[]> {
    const queries: string[] = [];
    const server = createServer((req, res) => {
      queries.push(req.url ?? '');
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      await fn(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
    return queries;
  }
  const packet = parsePacket(A, B, 'tcp', 80);

  it('keeps the conjunction ids of an ovs node\'s decisions', async () => {
    const answer = answerOf(captureModel(), A, B, 80);
    const notes: string[] = [];
    const queries = await serve(answer, async (endpoint) => assert.deepEqual(await fetchPolicy(endpoint, packet, notes), answer));
    assert.deepEqual([queries, notes], [['/policy?src=10.244.1.2&dst=10.244.1.3&proto=tcp&dport=80'], []]);
  });

  it('refuses conjunction ids that are not non-negative integers', async () => {
    const notes: string[] = [];
    const bad = { programmed: true, decisions: [{ direction: 'ingress', pod: 'x/b', allowed: true, by: 'unrestricted', conjunctions: ['0x8fea3baf'] }] };
    await serve(bad, async (endpoint) => assert.equal(await fetchPolicy(endpoint, packet, notes), null));
    assert.match(notes[0] ?? '', /^daemon \/policy: not a policy decision: /);
  });
});

describe('trace ovs policy: the policy hops name the flow that decided', () => {
  it('allowed: the rule\'s conjunction id met in the ingress rules (text output)', () => {
    const r = checked(facts(A, B, 80, A_TO_B_80, answerOf(captureModel(), A, B, 80)));
    assert.equal(r.verdict, 'ok');
    assert.deepEqual(lines(r), [
      'trace 10.244.1.2 -> 10.244.1.3 tcp dport 80 on node 10.250.0.1 (lease 10.244.1.0/24, network 10.244.0.0/16, backend ovs, leases from etcd)',
      '  ok          source     10.244.1.2 is a pod of this node (lease 10.244.1.0/24), enters br-int on vpod2 (ofport 1)',
      '  ok          pipeline   br-int in_port 1 (vpod2): classifier [pod ofport 1] -> spoof guard [pod ofport 1] -> L3 forwarding -> L2 forwarding [pod ofport 2] -> output -> ct(trk|new) -> conntrack state -> egress rules -> egress default -> ingress rules [policy conj_id 2414492591] -> conntrack commit -> policy output',
      '  ok          spoofguard 10.244.1.2 from 0a:58:0a:f4:01:02 on vpod2 (ofport 1) passes: the address and MAC of its pod',
      '  ok          ovs-output to vpod3 (ofport 2), the port of pod 10.244.1.3',
      '  ok          policy     egress at pod x/a: not isolated (no NetworkPolicy selects it for egress), allowed; br-int: no egress flow for the pod, passed on by egress default (table 53)',
      '  ok          policy     ingress at pod x/b: allowed by NetworkPolicy x/b-ingress (ingress[0]); br-int: allowed by conj_id 2414492591 in ingress rules (table 54), a flow of this rule',
      'result: ok',
    ]);
    const p = hop(r, 'pipeline').evidence;
    assert.deepEqual(p.conntrack, { table: 50, recirc: '0x1', ctState: 'trk|new' });
    assert.equal(p.datapathActions, 'ct(commit,zone=65520,label=0x8fea3baf00000000/0xffffffffffffffff),5');
    assert.deepEqual(hop(r, 'policy', 1).evidence, {
      direction: 'ingress',
      pod: 'x/b',
      allowed: true,
      policy: 'x/b-ingress',
      rule: 0,
      reason: 'rule',
      programmed: true,
      conjunctions: [B_INGRESS_CONJ],
      otherConjunctions: [],
      bridge: { direction: 'ingress', verdict: 'allow', table: 54, conjunction: B_INGRESS_CONJ, cookie: '0x104008fea3baf', priority: 200, match: 'conj_id=2414492591,ip' },
      agrees: true,
    });
  });

  it('dropped: the pod\'s default deny flow in the ingress default table (text output)', () => {
    const r = checked(facts(A, B, 81, A_TO_B_81, answerOf(captureModel(), A, B, 81)));
    assert.equal(r.verdict, 'broken');
    assert.deepEqual(lines(r).slice(4), [
      '  BROKEN      ovs-output dropped in ingress default (table 55): the NetworkPolicy default deny of pod 10.244.1.3 (ingress; cookie 0x1040000000000)',
      '  ok          policy     egress at pod x/a: not isolated (no NetworkPolicy selects it for egress), allowed; br-int: no egress flow for the pod, passed on by egress default (table 53)',
      '  BROKEN      policy     ingress at pod x/b: dropped by the default deny (NetworkPolicies select it for ingress and none of their rules allows this packet); br-int: dropped by the pod\'s default deny flow in ingress default (table 55)',
      'result: broken (2 broken hops)',
    ]);
    assert.deepEqual(hop(r, 'ovs-output').evidence.droppedIn, 55);
    assert.equal(hop(r, 'policy', 1).evidence.agrees, true);
  });

  it('allowed by a rule whose only clause is the pod: the priority-210 flow\'s conjunction id', () => {
    const r = checked(facts(C, A, 80, C_TO_A_80, answerOf(captureModel(), C, A, 80)));
    assert.equal(r.verdict, 'ok');
    assert.equal(hop(r, 'policy').summary, 'egress at pod x/c: allowed by NetworkPolicy x/c-egress (egress[0]); br-int: allowed by conj_id 1512755673 in egress rules (table 52), a flow of this rule');
    assert.equal(hop(r, 'policy', 1).summary, 'ingress at pod x/a: not isolated (no NetworkPolicy selects it for ingress), allowed; br-int: no ingress flow for the pod, passed on by ingress default (table 55)');
  });

  it('dropped at the source: the pod\'s default deny flow in the egress default table; the ingress tables are not reached', () => {
    const r = checked(facts(D, A, 80, D_TO_A_80, answerOf(captureModel(), D, A, 80)));
    assert.deepEqual(lines(r).slice(4), [
      '  BROKEN      ovs-output dropped in egress default (table 53): the NetworkPolicy default deny of pod 10.244.1.5 (egress; cookie 0x1040000000000)',
      '  BROKEN      policy     egress at pod x/d: dropped by the default deny (NetworkPolicies select it for egress and none of their rules allows this packet); br-int: dropped by the pod\'s default deny flow in egress default (table 53)',
      '  ok          policy     ingress at pod x/a: not isolated (no NetworkPolicy selects it for ingress), allowed; br-int: the ingress tables were not reached',
      'result: broken (2 broken hops)',
    ]);
    assert.deepEqual(r.hops.filter((h) => h.kind === 'policy').map((h) => h.evidence.agrees), [true, null]);
  });

  it('the node\'s own traffic skips ingress rules: not dropped although the pod\'s rules alone would', () => {
    const r = checked(facts(NODE, C, 80, HOST_TO_C_80, answerOf(captureModel(), NODE, C, 80)));
    assert.equal(r.verdict, 'ok');
    const h = hop(r, 'policy');
    assert.equal(h.status, 'ok');
    assert.equal(h.summary, 'ingress at pod x/c: allowed: from the node itself, which ingress rules do not apply to (its rules alone would drop it: default deny); br-int: the node\'s own traffic skips the ingress rules (table 54, priority 220)');
    assert.deepEqual([h.evidence.allowed, h.evidence.bridge?.verdict, h.evidence.agrees], [false, 'node', null]);
  });

  it('marks the hop broken when the bridge and weftd disagree', () => {
    const m = captureModel();
    const decision = (over: Partial<PolicyDecision>): PolicyAnswer => ({ programmed: true, decisions: [{ direction: 'ingress', pod: 'x/b', allowed: true, by: { namespace: 'x', policy: 'b-ingress', rule: 0 }, conjunctions: [B_INGRESS_CONJ], otherConjunctions: [], ...over }] });
    const judged = (output: string, dport: number, answer: PolicyAnswer, src = A, dst = B) => {
      const h = hop(checked(facts(src, dst, dport, output, answer)), 'policy');
      return [h.status, h.evidence.agrees, h.summary];
    };
    // weftd: allowed by b-ingress; the bridge dropped it in 55.
    assert.deepEqual(judged(A_TO_B_81, 81, decision({})), [
      'broken',
      false,
      'ingress at pod x/b: allowed by NetworkPolicy x/b-ingress (ingress[0]); but br-int: dropped by the pod\'s default deny flow in ingress default (table 55) (the rule\'s conjunctions: [2414492591])',
    ]);
    // weftd names conjunction 7 for the rule; the bridge met 2414492591.
    assert.deepEqual(judged(A_TO_B_80, 80, decision({ conjunctions: [7] })), [
      'broken',
      false,
      'ingress at pod x/b: allowed by NetworkPolicy x/b-ingress (ingress[0]); but br-int: allowed by conj_id 2414492591 in ingress rules (table 54), which is not one of the rule\'s conjunctions [7]',
    ]);
    // Another rule of the pod that allows the packet too: the bridge may meet its flow first.
    assert.deepEqual(judged(A_TO_B_80, 80, decision({ conjunctions: [7], otherConjunctions: [B_INGRESS_CONJ] })).slice(0, 2), ['ok', true]);
    // weftd: default deny; the bridge allowed it by a conjunction.
    assert.deepEqual(judged(A_TO_B_80, 80, decision({ allowed: false, by: 'default-deny', conjunctions: undefined })), [
      'broken',
      false,
      'ingress at pod x/b: dropped by the default deny (NetworkPolicies select it for ingress and none of their rules allows this packet); but br-int: allowed by conj_id 2414492591 in ingress rules (table 54), although no rule of the pod allows the packet',
    ]);
    // weftd: not isolated; the bridge dropped it.
    assert.deepEqual(judged(A_TO_B_81, 81, decision({ by: 'unrestricted', conjunctions: undefined })), [
      'broken',
      false,
      'ingress at pod x/b: not isolated (no NetworkPolicy selects it for ingress), allowed; but br-int: dropped by the pod\'s default deny flow in ingress default (table 55), although no NetworkPolicy selects the pod for ingress',
    ]);
    // weftd: the pod isolated with a default deny; the bridge has no flow for it.
    assert.deepEqual(judged(A_TO_B_80, 80, { programmed: true, decisions: [{ direction: 'egress', pod: 'x/a', allowed: false, by: 'default-deny', otherConjunctions: [] }] }), [
      'broken',
      false,
      'egress at pod x/a: dropped by the default deny (NetworkPolicies select it for egress and none of their rules allows this packet); but br-int: no egress flow for the pod, passed on by egress default (table 53): the default deny is missing',
    ]);
    // weftd: allowed by a rule of an isolated pod; the bridge has no flow for the pod.
    assert.deepEqual(judged(C_TO_A_80, 80, { programmed: true, decisions: [{ direction: 'ingress', pod: 'x/a', allowed: true, by: { namespace: 'x', policy: 'a-in', rule: 0 }, conjunctions: [9], otherConjunctions: [] }] }, C, A), [
      'broken',
      false,
      'ingress at pod x/a: allowed by NetworkPolicy x/a-in (ingress[0]); but br-int: no ingress flow for the pod, passed on by ingress default (table 55): the pod is not isolated there',
    ]);
    // An answer without conjunction ids (a weftd that does not send them): the verdicts agree, the rule is not checked.
    const nft = answerOf(m, A, B, 80);
    const plain: PolicyAnswer = { programmed: true, decisions: nft.decisions.map(({ conjunctions: _c, otherConjunctions: _o, ...d }) => d) };
    assert.deepEqual(judged(A_TO_B_80, 80, plain).slice(0, 2), ['ok', true]);
    const ingress = hop(checked(facts(A, B, 80, A_TO_B_80, plain)), 'policy', 1);
    assert.deepEqual([ingress.status, ingress.evidence.agrees, ingress.evidence.conjunctions], ['ok', null, null]);
  });
});
