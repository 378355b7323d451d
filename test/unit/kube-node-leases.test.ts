import assert from 'node:assert/strict';
import { Writable } from 'node:stream';

import { annotationNames } from '../../src/subnet/kube/annotations.js';
import { NodeLeases } from '../../src/subnet/kube/manager.js';
import type { KubeNode } from '../../src/subnet/kube/objects.js';
import { leaseId } from '../../src/subnet/lease.js';
import type { RawLeaseEvent } from '../../src/subnet/watcher.js';
import { createLogger } from '../../src/util/log.js';

const A = 'flannel.alpha.coreos.com/';

function node(name: string, podCIDR: string, publicIP: string, created: string): KubeNode {
  return {
    metadata: {
      name,
      creationTimestamp: created,
      annotations: {
        [`${A}kube-subnet-manager`]: 'true',
        [`${A}backend-type`]: 'vxlan',
        [`${A}backend-data`]: '{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}',
        [`${A}public-ip`]: publicIP,
      },
    },
    spec: { podCIDR, podCIDRs: [podCIDR] },
  };
}

const show = (events: readonly RawLeaseEvent[]): string[] =>
  events.map((e) => `${e.type} ${leaseId(e.lease)}${'attrs' in e.lease ? ` ${e.lease.attrs.publicIP.toString()}` : ''}`);

describe('kube NodeLeases: two Nodes with one podCIDR', () => {
  const logs: string[] = [];
  const log = createLogger({ level: 'warn', stream: new Writable({ write: (chunk: Buffer, _enc, done) => (logs.push(chunk.toString()), done()) }) });
  const leases = () => new NodeLeases(annotationNames('flannel.alpha.coreos.com'), { enableIPv4: true, enableIPv6: false }, log);
  const OLD = node('old', '10.12.2.0/24', '10.250.0.2', '2025-01-01T00:00:00Z');
  const TWIN = node('twin', '10.12.2.0/24', '10.250.0.66', '2025-06-01T00:00:00Z');

  it('keeps the older Node\'s lease whichever arrives first, and warns about the newer one once', () => {
    logs.length = 0;
    const a = leases();
    assert.deepEqual(show(a.apply('ADDED', OLD)), ['added 10.12.2.0-24 10.250.0.2']);
    assert.deepEqual(show(a.apply('ADDED', TWIN)), []);
    assert.deepEqual(show(a.apply('MODIFIED', TWIN)), []);
    assert.equal(logs.filter((l) => l.includes('twin')).length, 1);
    const b = leases();
    assert.deepEqual(show(b.apply('ADDED', TWIN)), ['added 10.12.2.0-24 10.250.0.66']);
    assert.deepEqual(show(b.apply('ADDED', OLD)), ['added 10.12.2.0-24 10.250.0.2']);
    assert.deepEqual(leases().reset([TWIN, OLD]).map((l) => l.attrs.publicIP.toString()), ['10.250.0.2']);
  });

  it('hands the podCIDR to the newer Node when the older one goes, and back to nothing after', () => {
    const a = leases();
    a.reset([OLD, TWIN]);
    assert.deepEqual(show(a.apply('DELETED', OLD)), ['added 10.12.2.0-24 10.250.0.66']);
    assert.deepEqual(show(a.apply('DELETED', TWIN)), ['removed 10.12.2.0-24 10.250.0.66']);
  });

  it('a Node moving to another podCIDR removes the old lease first', () => {
    const a = leases();
    a.reset([OLD]);
    assert.deepEqual(show(a.apply('MODIFIED', node('old', '10.12.3.0/24', '10.250.0.2', '2025-01-01T00:00:00Z'))), ['removed 10.12.2.0-24 10.250.0.2', 'added 10.12.3.0-24 10.250.0.2']);
  });
});
