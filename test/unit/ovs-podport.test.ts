// The checks on a pod port's OVSDB values (src/backend/ovs/bridge.ts): what the weft-ovs plugin
// writes and every daemon pass reads back, and the one-warning-per-port filter.
import assert from 'node:assert/strict';

import { podIdsProblem, PodPortFilter, portNameProblem, type SkippedPodPort } from '../../src/backend/ovs/bridge.js';
import type { LogFields, Logger } from '../../src/util/log.js';

const GOOD = {
  containerId: 'ctr-0123abc_x.y-z',
  ifName: 'eth0',
  ip: '10.244.1.2',
  mac: '0a:58:0a:f4:01:02',
  podName: 'web-0',
  podNamespace: 'default',
};

function recording(): { logger: Logger; warnings: Array<{ msg: string; fields: LogFields | undefined }> } {
  const warnings: Array<{ msg: string; fields: LogFields | undefined }> = [];
  const logger: Logger = {
    error: () => undefined,
    warn: (msg, fields) => warnings.push({ msg, fields }),
    info: () => undefined,
    debug: () => undefined,
    child: () => logger,
  };
  return { logger, warnings };
}

describe('ovs pod ports: the values weft reads back from OVSDB', () => {
  it('accepts what the plugin writes, with or without the optional ids', () => {
    assert.equal(podIdsProblem(GOOD), null);
    assert.equal(podIdsProblem({ ...GOOD, ifName: undefined, podName: undefined, podNamespace: undefined }), null);
    assert.equal(podIdsProblem({ ...GOOD, ip: '192.168.255.254', mac: '02:ff:ff:ff:ff:fe' }), null);
  });

  it('names the external_id, its value and why for each bad value', () => {
    const cases: Array<[Partial<typeof GOOD> & Record<string, string | undefined>, RegExp]> = [
      [{ containerId: undefined }, /^no weft-container-id$/],
      [{ containerId: 'ctr\u001b[2J' }, /^weft-container-id "ctr\\u001b\[2J" is not a container ID/],
      [{ containerId: '-ctr' }, /is not a container ID/],
      [{ containerId: 'c d' }, /is not a container ID/],
      [{ ifName: 'eth0\nx' }, /^weft-ifname "eth0\\nx" is not an interface name/],
      [{ ifName: 'a-very-long-interface' }, /^weft-ifname .* is not an interface name \(longer than 15 bytes\)/],
      [{ ip: undefined }, /^no weft-ip$/],
      [{ ip: '10.244.1.2,actions=NORMAL' }, /^weft-ip "10\.244\.1\.2,actions=NORMAL" is not an IPv4 address/],
      [{ ip: '010.244.1.2' }, /is not an IPv4 address in dotted-quad form/],
      [{ ip: '10.244.1.2/24' }, /is not an IPv4 address/],
      [{ ip: 'fd00::2' }, /is not an IPv4 address/],
      [{ ip: '224.0.0.1' }, /is not a unicast address/],
      [{ ip: '255.255.255.255' }, /is not a unicast address/],
      [{ ip: '0.0.0.0' }, /is not a unicast address/],
      [{ ip: '127.0.0.1' }, /is not a unicast address/],
      [{ mac: undefined }, /^no attached-mac$/],
      [{ mac: '0a:58:0a:f4:01:02\nadd table=0,actions=NORMAL' }, /^attached-mac .* is not a MAC address/],
      [{ mac: '0a:58:0a:f4:01' }, /is not a MAC address/],
      [{ mac: '01:00:5e:00:00:01' }, /is a multicast MAC address/],
      [{ mac: 'ff:ff:ff:ff:ff:ff' }, /is a multicast MAC address/],
      [{ mac: '00:00:00:00:00:00' }, /is the zero MAC address/],
      [{ podName: 'web\u202e0' }, /^weft-pod-name "web\u202e0" contains a format character/],
      [{ podName: 'web 0' }, /contains white space/],
      [{ podNamespace: 'ns\n' }, /^weft-pod-namespace .* contains a control character/],
      [{ podName: 'x'.repeat(254) }, /longer than 253 bytes/],
    ];
    for (const [change, reason] of cases) {
      const problem = podIdsProblem({ ...GOOD, ...change });
      assert.ok(problem !== null, `accepted ${JSON.stringify(change)}`);
      assert.match(problem, reason, JSON.stringify(change));
    }
  });

  it('takes port names that are interface names and not options', () => {
    for (const ok of ['weft52cc6f6f531', 'eth0_1', 'pf0vf1', 'enp3s0f0np0']) assert.equal(portNameProblem(ok), null, ok);
    for (const bad of ['', '-x', '--all', 'a b', 'a/b', 'a:b', 'a#b', 'a"b', 'a\\b', 'a;b', 'a\nb', '1234567890123456', '.', '..']) {
      assert.notEqual(portNameProblem(bad), null, JSON.stringify(bad));
    }
  });

  it('warns once per port and reason; a fixed or gone port is forgotten', () => {
    const { logger, warnings } = recording();
    const filter = new PodPortFilter(logger);
    const a: SkippedPodPort = { name: 'wtbad', ofport: 7, reason: 'weft-ip "x" is not an IPv4 address' };
    const b: SkippedPodPort = { name: 'wtdup', ofport: 8, reason: 'claims the IP 10.244.1.2 of port wt1 (ofport 3)' };
    filter.report([a, b]);
    filter.report([a, b]);
    filter.report([b, a]);
    assert.deepEqual(
      warnings.map((w) => w.fields),
      [
        { port: 'wtbad', ofport: 7, reason: a.reason },
        { port: 'wtdup', ofport: 8, reason: b.reason },
      ],
    );
    assert.ok(warnings.every((w) => w.msg === 'skipping pod port: no flows for it'));
    filter.report([{ ...a, reason: 'attached-mac "y" is not a MAC address' }, b]);
    assert.equal(warnings.length, 3, 'a new reason is a new warning');
    filter.report([b]);
    filter.report([b, a]);
    assert.equal(warnings.length, 4, 'a port that went away and came back is reported again');
    filter.report([]);
    assert.equal(warnings.length, 4);
  });
});
