// The IFLA_VFINFO_LIST codec (src/netlink/vf.ts) on bytes laid out as the kernel writes them
// (rtnl_fill_vfinfo): decoding, encoding for RTM_SETLINK, and a whole RTM_NEWLINK body.
import assert from 'node:assert/strict';
import {
  decodeLinkVfInfo,
  decodeVfInfoList,
  encodeVfChange,
  encodeVfInfoList,
  parseAttrs,
  VfCodecError,
  type VfChange,
} from '../../src/netlink/vf.js';

function attr(type: number, data: Buffer): Buffer {
  const len = 4 + data.length;
  const out = Buffer.alloc((len + 3) & ~3);
  out.writeUInt16LE(len, 0);
  out.writeUInt16LE(type, 2);
  data.copy(out, 4);
  return out;
}

function u32s(...v: number[]): Buffer {
  const b = Buffer.alloc(v.length * 4);
  v.forEach((x, i) => b.writeUInt32LE(x >>> 0, i * 4));
  return b;
}

function vfMac(vf: number, mac: number[]): Buffer {
  const d = Buffer.alloc(36);
  d.writeUInt32LE(vf, 0);
  Buffer.from(mac).copy(d, 4);
  return attr(1, d);
}

function vlanInfo(vf: number, vlan: number, qos: number, proto: number): Buffer {
  const d = Buffer.alloc(14);
  d.writeUInt32LE(vf, 0);
  d.writeUInt32LE(vlan, 4);
  d.writeUInt32LE(qos, 8);
  d.writeUInt16BE(proto, 12);
  return attr(1, d);
}

/** Two VFs as a modern kernel reports them (VF 0 with a VLAN list and 802.1ad, VF 1 plain). */
function kernelList(): Buffer {
  const vf0 = Buffer.concat([
    vfMac(0, [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01]),
    attr(13, Buffer.alloc(32, 0xff)), // IFLA_VF_BROADCAST: ignored
    attr(2, u32s(0, 100, 3)), // legacy IFLA_VF_VLAN
    attr(12 | 0x8000, vlanInfo(0, 100, 3, 0x88a8)), // IFLA_VF_VLAN_LIST (nested flag set)
    attr(3, u32s(0, 900)), // IFLA_VF_TX_RATE
    attr(6, u32s(0, 100, 900)), // IFLA_VF_RATE
    attr(4, u32s(0, 0)), // spoofchk off
    attr(5, u32s(0, 2)), // link state disable
    attr(7, u32s(0, 0xffffffff)), // RSS query: ignored
    attr(9, u32s(0, 1)), // trust on
  ]);
  const vf1 = Buffer.concat([
    vfMac(1, [0, 0, 0, 0, 0, 0]),
    attr(2, u32s(1, 0, 0)),
    attr(3, u32s(1, 0)),
    attr(4, u32s(1, 0xffffffff)), // driver does not report spoofchk
    attr(5, u32s(1, 0)),
  ]);
  return Buffer.concat([attr(1 | 0x8000, vf0), attr(1 | 0x8000, vf1)]);
}

describe('IFLA_VFINFO_LIST codec', () => {
  it('decodes every VF with its MAC, VLAN list, rates, flags and link state', () => {
    assert.deepEqual(decodeVfInfoList(kernelList()), [
      { vf: 0, mac: '02:aa:bb:cc:dd:01', vlan: 100, qos: 3, vlanProto: '802.1ad', spoofchk: false, trust: true, linkState: 'disable', minTxRate: 100, maxTxRate: 900 },
      // No IFLA_VF_RATE: the legacy tx rate is the max; an unreported (u32)-1 setting is null; no trust attr.
      { vf: 1, mac: '00:00:00:00:00:00', vlan: 0, qos: 0, vlanProto: '802.1q', spoofchk: null, trust: null, linkState: 'auto', minTxRate: 0, maxTxRate: 0 },
    ]);
  });

  it('decodes an RTM_NEWLINK body: index, name, IFLA_NUM_VF and the VF list', () => {
    const ifi = Buffer.alloc(16);
    ifi.writeInt32LE(7, 4);
    const body = Buffer.concat([ifi, attr(3, Buffer.from('ens1f0\0')), attr(21, u32s(2)), attr(22 | 0x8000, kernelList())]);
    const info = decodeLinkVfInfo(body);
    assert.equal(info.ifindex, 7);
    assert.equal(info.ifname, 'ens1f0');
    assert.equal(info.numVf, 2);
    assert.deepEqual(
      info.vfs.map((v) => [v.vf, v.mac, v.vlan]),
      [
        [0, '02:aa:bb:cc:dd:01', 100],
        [1, '00:00:00:00:00:00', 0],
      ],
    );
  });

  it('reports truncated attributes with where and what', () => {
    const bad = attr(1, Buffer.alloc(8));
    bad.writeUInt16LE(40, 0); // claims more than there is
    assert.throws(() => decodeVfInfoList(bad), new VfCodecError('IFLA_VFINFO_LIST', 'attribute 1 at offset 0 has length 40 (12 bytes left)'));
    assert.throws(() => decodeVfInfoList(attr(1, attr(4, u32s(0, 1)))), /IFLA_VF_INFO: no IFLA_VF_MAC/);
    assert.throws(() => decodeVfInfoList(attr(1, Buffer.concat([vfMac(0, [1, 2, 3, 4, 5, 6]), attr(6, u32s(0))]))), new VfCodecError('IFLA_VF_RATE', '4 bytes, expected at least 12'));
  });

  it('encodes each change as the struct do_setvfinfo() reads', () => {
    assert.equal(encodeVfChange(3, { kind: 'spoofchk', on: true }).toString('hex'), '0c000400' + '03000000' + '01000000');
    assert.equal(encodeVfChange(3, { kind: 'linkState', state: 'disable' }).toString('hex'), '0c000500' + '03000000' + '02000000');
    assert.equal(encodeVfChange(3, { kind: 'rate', minTxRate: 10, maxTxRate: 500 }).toString('hex'), '10000600' + '03000000' + '0a000000' + 'f4010000');
    const mac = encodeVfChange(3, { kind: 'mac', mac: '02:AA:bb:cc:dd:01' });
    assert.equal(mac.length, 40);
    assert.equal(mac.subarray(0, 14).toString('hex'), '28000100' + '03000000' + '02aabbccdd01');
    assert.ok(mac.subarray(14).every((b) => b === 0));
    // VLAN list nest: len 24, type 12|NLA_F_NESTED; entry len 18, proto big-endian 0x8100.
    assert.equal(encodeVfChange(3, { kind: 'vlan', vlan: 10, qos: 2, proto: '802.1q' }).toString('hex'), '18000c80' + '12000100' + '03000000' + '0a000000' + '02000000' + '8100' + '0000');
  });

  it('round-trips a full set of changes through encode and decode', () => {
    const changes: VfChange[] = [
      { kind: 'vlan', vlan: 4094, qos: 7, proto: '802.1ad' },
      { kind: 'mac', mac: '0a:00:00:00:00:05' },
      { kind: 'rate', minTxRate: 0, maxTxRate: 10000 },
      { kind: 'spoofchk', on: false },
      { kind: 'trust', on: true },
      { kind: 'linkState', state: 'enable' },
    ];
    const list = encodeVfInfoList(5, changes);
    const [outer] = parseAttrs(list, 'test');
    assert.equal(outer!.type, 22);
    assert.deepEqual(decodeVfInfoList(outer!.data), [
      { vf: 5, mac: '0a:00:00:00:00:05', vlan: 4094, qos: 7, vlanProto: '802.1ad', spoofchk: false, trust: true, linkState: 'enable', minTxRate: 0, maxTxRate: 10000 },
    ]);
  });
});
