// `weft leases` against a real etcd holding leases whose values another node (or anyone with write
// access to the store) filled with terminal controls: the table shows them escaped, one lease per
// line; `-o json` is JSON with the same values.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { EtcdServer } from '../helpers/etcd.js';
import { fromSource } from '../helpers/weftd.js';

const PREFIX = '/termtest/coreos.com/network';
const WEFT = fileURLToPath(new URL('../../bin/weft', import.meta.url));

function weft(args: readonly string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(WEFT, args, { env: { ...process.env, WEFT_FROM_SOURCE: fromSource() }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr });
    });
  });
}

describe('weft leases with hostile store values (etcd)', function () {
  this.timeout(60_000);
  let etcd: EtcdServer;
  const BACKEND = '\u001b[2J\u001b[Hvxlan\r\nfake row';
  const MAC = '\u202e02:00:00:00:00:01\u009b31m';

  before(async () => {
    etcd = await EtcdServer.start();
    await etcd.etcdctl(['put', `${PREFIX}/config`, '{"Network":"10.9.0.0/16","Backend":{"Type":"vxlan"}}']);
    await etcd.etcdctl(['put', `${PREFIX}/subnets/10.9.1.0-24`, JSON.stringify({ PublicIP: '192.168.7.1', PublicIPv6: null, BackendType: BACKEND, BackendData: { VNI: 1, VtepMAC: MAC } })]);
    await etcd.etcdctl(['put', `${PREFIX}/subnets/10.9.2.0-24`, JSON.stringify({ PublicIP: '192.168.7.2', PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: '02:00:00:00:00:02' } })]);
  });
  after(async () => {
    await etcd?.destroy();
  });

  it('prints the values escaped, one lease per line', async () => {
    const r = await weft(['leases', '--etcd-endpoints', etcd.endpoint, '--etcd-prefix', PREFIX]);
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stdout.replace(/\n/g, ''), /[\p{Cc}\p{Cf}]/u, JSON.stringify(r.stdout));
    const lines = r.stdout.trimEnd().split('\n');
    assert.equal(lines.length, 3, r.stdout);
    assert.match(lines[1]!, /^10\.9\.1\.0\/24 +- +192\.168\.7\.1 +\\x1b\[2J\\x1b\[Hvxlan\\r\\nfake row +\\u202e02:00:00:00:00:01\\x9b31m +reserved$/);
    assert.match(lines[2]!, /^10\.9\.2\.0\/24 +- +192\.168\.7\.2 +vxlan +02:00:00:00:00:02 +reserved$/);
  });

  it('-o json keeps the values, escaped so that the terminal shows them as text', async () => {
    const r = await weft(['leases', '--etcd-endpoints', etcd.endpoint, '--etcd-prefix', PREFIX, '-o', 'json']);
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stdout.replace(/\n/g, ''), /[\p{Cc}\p{Cf}]/u);
    const rows = JSON.parse(r.stdout) as Array<{ backendType: string; vtepMAC: string }>;
    assert.deepEqual(rows.map((x) => [x.backendType, x.vtepMAC]), [[BACKEND, MAC], ['vxlan', '02:00:00:00:00:02']]);
  });
});
