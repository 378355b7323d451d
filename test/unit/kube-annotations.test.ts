import assert from 'node:assert/strict';
import {
  annotationNames,
  AnnotationPrefixError,
  AnnotationValueError,
  DEFAULT_ANNOTATION_PREFIX,
  desiredAnnotations,
  NO_OVERWRITES,
  readOverwrites,
  storedPublicIPs,
  storedVtepMacs,
} from '../../src/subnet/kube/annotations.js';
import type { KubeNode } from '../../src/subnet/kube/objects.js';
import type { LeaseAttrs } from '../../src/subnet/lease.js';
import { IPAddr } from '../../src/util/ip.js';

/** flannel's annotations.go pattern, verbatim (no start anchor). */
const FLANNEL_PREFIX_RE = /(?:[a-z0-9_-]+\.)+[a-z0-9_-]+\/(?:[a-z0-9_-]+-)?$/;

const N = annotationNames();
const MAC = '12:c6:65:89:b4:e3';
const MAC6 = '6a:3e:11:22:33:44';
const ip = (s: string) => IPAddr.parse(s);

function node(annotations: Record<string, string> | undefined, name = 'node-a'): KubeNode {
  return { metadata: annotations === undefined ? { name } : { name, annotations } };
}

function rejectsPrefix(prefix: string, reason: string): void {
  assert.throws(
    () => annotationNames(prefix),
    (e: unknown) => {
      assert.ok(e instanceof AnnotationPrefixError, String(e));
      assert.equal(e.name, 'AnnotationPrefixError');
      assert.equal(e.prefix, prefix);
      assert.equal(e.reason, reason);
      assert.equal(e.message, `kube annotation prefix ${JSON.stringify(prefix)}: ${reason}`);
      return true;
    },
  );
}

const FORMAT = 'subnet/kube: prefix must be in a format: fqdn/[0-9a-z-_]*';
const SLASH = 'subnet/kube: prefix can contain at most single slash';

describe('kube annotationNames', () => {
  it('gives flannel’s default names', () => {
    assert.equal(DEFAULT_ANNOTATION_PREFIX, 'flannel.alpha.coreos.com');
    assert.deepEqual(annotationNames('flannel.alpha.coreos.com'), {
      prefix: 'flannel.alpha.coreos.com/',
      kubeSubnetManager: 'flannel.alpha.coreos.com/kube-subnet-manager',
      backendType: 'flannel.alpha.coreos.com/backend-type',
      backendData: 'flannel.alpha.coreos.com/backend-data',
      backendV6Data: 'flannel.alpha.coreos.com/backend-v6-data',
      publicIP: 'flannel.alpha.coreos.com/public-ip',
      publicIPv6: 'flannel.alpha.coreos.com/public-ipv6',
      publicIPOverwrite: 'flannel.alpha.coreos.com/public-ip-overwrite',
      publicIPv6Overwrite: 'flannel.alpha.coreos.com/public-ipv6-overwrite',
      nodePublicIP: 'flannel.alpha.coreos.com/node-public-ip',
      nodePublicIPv6: 'flannel.alpha.coreos.com/node-public-ipv6',
    });
    assert.deepEqual(annotationNames(), N);
  });

  it('appends "/" to a prefix without one', () => {
    assert.equal(annotationNames('example.com').prefix, 'example.com/');
    assert.equal(annotationNames('example.com').backendData, 'example.com/backend-data');
  });

  it('appends "-" to a prefix with one slash that ends in neither "/" nor "-"', () => {
    const n = annotationNames('example.com/foo');
    assert.equal(n.prefix, 'example.com/foo-');
    assert.equal(n.backendData, 'example.com/foo-backend-data');
    assert.equal(n.publicIPv6Overwrite, 'example.com/foo-public-ipv6-overwrite');
  });

  it('keeps a prefix ending in "/" or "-"', () => {
    assert.equal(annotationNames('example.com/').prefix, 'example.com/');
    assert.equal(annotationNames('example.com/foo-').prefix, 'example.com/foo-');
    assert.equal(annotationNames('a_b.c-d.io/x_y-').kubeSubnetManager, 'a_b.c-d.io/x_y-kube-subnet-manager');
  });

  it('refuses more than one slash', () => {
    rejectsPrefix('example.com/foo/bar', SLASH);
    rejectsPrefix('a//', SLASH);
  });

  it('refuses what flannel’s pattern refuses', () => {
    for (const p of ['', 'localhost', 'example.com/Foo', 'example.com/foo.bar', 'example.', '/foo']) {
      rejectsPrefix(p, FORMAT);
      // the same prefix after flannel's normalisation fails flannel's own pattern too
      let q = p.includes('/') ? p : `${p}/`;
      if (!q.endsWith('/') && !q.endsWith('-')) q += '-';
      assert.equal(FLANNEL_PREFIX_RE.test(q), false, q);
    }
  });

  it('anchors the pattern at the start (flannel does not), refusing only keys the API server refuses', () => {
    for (const p of ['Example.com', '.example.com', 'UPPER.example.com/foo', 'a..b.com', 'exa mple.com']) {
      rejectsPrefix(p, FORMAT);
      let q = p.includes('/') ? p : `${p}/`;
      if (!q.endsWith('/') && !q.endsWith('-')) q += '-';
      assert.equal(FLANNEL_PREFIX_RE.test(q), true, `flannel accepts ${q}`);
    }
  });

  it('refuses a name part that would make a key name longer than 63 characters', () => {
    const long = 'x'.repeat(42); // 42 + "-" + "public-ipv6-overwrite" = 64
    rejectsPrefix(
      `example.com/${long}`,
      `the part after "/" makes "${long}-public-ipv6-overwrite" longer than 63 characters`,
    );
    assert.equal(annotationNames(`example.com/${'x'.repeat(41)}`).prefix, `example.com/${'x'.repeat(41)}-`);
  });
});

describe('kube desiredAnnotations', () => {
  const vxlan4: LeaseAttrs = {
    publicIP: ip('192.168.64.3'),
    publicIPv6: null,
    backendType: 'vxlan',
    backendData: { VNI: 1, VtepMAC: MAC },
  };

  it('writes a vxlan node exactly as flanneld does', () => {
    assert.deepEqual(desiredAnnotations(N, vxlan4, 'vxlan'), {
      'flannel.alpha.coreos.com/backend-type': 'vxlan',
      'flannel.alpha.coreos.com/backend-data': '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}',
      'flannel.alpha.coreos.com/public-ip': '192.168.64.3',
      'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
    });
  });

  it('writes dual-stack vxlan with both data and both addresses', () => {
    const attrs: LeaseAttrs = {
      ...vxlan4,
      publicIPv6: ip('fd00:0:0:0::10'),
      backendV6Data: { VNI: 1, VtepMAC: MAC6 },
    };
    assert.deepEqual(desiredAnnotations(N, attrs, 'vxlan'), {
      'flannel.alpha.coreos.com/backend-type': 'vxlan',
      'flannel.alpha.coreos.com/backend-data': '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}',
      'flannel.alpha.coreos.com/public-ip': '192.168.64.3',
      'flannel.alpha.coreos.com/backend-v6-data': '{"VNI":1,"VtepMAC":"6a:3e:11:22:33:44"}',
      'flannel.alpha.coreos.com/public-ipv6': 'fd00::10',
      'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
    });
  });

  it('leaves out backend-data and public-ip for vxlan without v4 data (IPv6-only)', () => {
    const attrs: LeaseAttrs = {
      publicIP: ip('0.0.0.0'),
      publicIPv6: ip('fd00::10'),
      backendType: 'vxlan',
      backendV6Data: { VNI: 1, VtepMAC: MAC6 },
    };
    assert.deepEqual(desiredAnnotations(N, attrs, 'vxlan'), {
      'flannel.alpha.coreos.com/backend-type': 'vxlan',
      'flannel.alpha.coreos.com/backend-v6-data': '{"VNI":1,"VtepMAC":"6a:3e:11:22:33:44"}',
      'flannel.alpha.coreos.com/public-ipv6': 'fd00::10',
      'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
    });
  });

  it('writes "null" backend data for host-gw, and v6 keys only with a public IPv6', () => {
    const v4only: LeaseAttrs = { publicIP: ip('10.0.0.5'), publicIPv6: null, backendType: 'host-gw' };
    assert.deepEqual(desiredAnnotations(N, v4only, 'host-gw'), {
      'flannel.alpha.coreos.com/backend-type': 'host-gw',
      'flannel.alpha.coreos.com/backend-data': 'null',
      'flannel.alpha.coreos.com/public-ip': '10.0.0.5',
      'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
    });
    const dual: LeaseAttrs = { ...v4only, publicIPv6: ip('fd00::5') };
    assert.deepEqual(desiredAnnotations(N, dual, 'host-gw'), {
      'flannel.alpha.coreos.com/backend-type': 'host-gw',
      'flannel.alpha.coreos.com/backend-data': 'null',
      'flannel.alpha.coreos.com/public-ip': '10.0.0.5',
      'flannel.alpha.coreos.com/backend-v6-data': 'null',
      'flannel.alpha.coreos.com/public-ipv6': 'fd00::5',
      'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
    });
  });

  it('follows flannel’s v6 rule for wireguard, extension and the rest', () => {
    const v6keys = (attrs: LeaseAttrs, type: string) =>
      Object.keys(desiredAnnotations(N, attrs, type)).filter((k) => k.includes('v6'));
    const base = { publicIP: ip('10.0.0.5') };
    const withIP = { ...base, publicIPv6: ip('fd00::5') };
    const noIP = { ...base, publicIPv6: null };
    const both = [N.backendV6Data, N.publicIPv6];
    assert.deepEqual(v6keys({ ...withIP, backendType: 'wireguard', backendV6Data: { PublicKey: 'k' } }, 'wireguard'), both);
    assert.deepEqual(v6keys({ ...noIP, backendType: 'wireguard', backendV6Data: { PublicKey: 'k' } }, 'wireguard'), []);
    assert.deepEqual(v6keys({ ...withIP, backendType: 'wireguard' }, 'wireguard'), []);
    assert.deepEqual(v6keys({ ...withIP, backendType: 'extension' }, 'extension'), both);
    assert.deepEqual(v6keys({ ...noIP, backendType: 'extension' }, 'extension'), []);
    assert.deepEqual(v6keys({ ...withIP, backendType: 'ipip' }, 'ipip'), []);
    // wireguard without v4 data still writes backend-data ("null"): its type is not vxlan
    assert.equal(desiredAnnotations(N, { ...noIP, backendType: 'wireguard' }, 'wireguard')[N.backendData], 'null');
  });

  it('writes an empty backend-type for alloc, whose lease has none', () => {
    assert.deepEqual(desiredAnnotations(N, { publicIP: ip('10.0.0.5'), publicIPv6: null }, ''), {
      'flannel.alpha.coreos.com/backend-type': '',
      'flannel.alpha.coreos.com/backend-data': 'null',
      'flannel.alpha.coreos.com/public-ip': '10.0.0.5',
      'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
    });
  });

  it('publishes the overwrite addresses instead of the detected ones', () => {
    const attrs: LeaseAttrs = { ...vxlan4, publicIPv6: ip('fd00::10'), backendV6Data: { VNI: 1, VtepMAC: MAC6 } };
    const d = desiredAnnotations(N, attrs, 'vxlan', { publicIP: ip('203.0.113.7'), publicIPv6: ip('2001:db8::7') });
    assert.equal(d[N.publicIP], '203.0.113.7');
    assert.equal(d[N.publicIPv6], '2001:db8::7');
    assert.equal(desiredAnnotations(N, attrs, 'vxlan', NO_OVERWRITES)[N.publicIP], '192.168.64.3');
  });

  it('encodes data as Go does and uses the configured prefix', () => {
    const n = annotationNames('example.com/foo');
    const d = desiredAnnotations(n, { publicIP: ip('10.0.0.5'), publicIPv6: null, backendType: 'extension', backendData: { Cmd: 'a<b&c>' } }, 'extension');
    assert.deepEqual(d, {
      'example.com/foo-backend-type': 'extension',
      'example.com/foo-backend-data': '{"Cmd":"a\\u003cb\\u0026c\\u003e"}',
      'example.com/foo-public-ip': '10.0.0.5',
      'example.com/foo-kube-subnet-manager': 'true',
    });
  });

  it('refuses a backendType that contradicts the lease', () => {
    assert.throws(() => desiredAnnotations(N, vxlan4, 'host-gw'), {
      name: 'TypeError',
      message: 'backendType "host-gw" differs from the lease\'s "vxlan"',
    });
  });
});

describe('kube readOverwrites', () => {
  it('parses both overwrite annotations; absent or empty is none', () => {
    const o = readOverwrites(node({ [N.publicIPOverwrite]: '203.0.113.7', [N.publicIPv6Overwrite]: '2001:DB8::7' }), N);
    assert.equal(o.publicIP?.toString(), '203.0.113.7');
    assert.equal(o.publicIPv6?.toString(), '2001:db8::7');
    assert.deepEqual(readOverwrites(node({ [N.publicIPOverwrite]: '' }), N), NO_OVERWRITES);
    assert.deepEqual(readOverwrites(node(undefined), N), NO_OVERWRITES);
  });

  it('refuses a value that is not an address of the family', () => {
    assert.throws(
      () => readOverwrites(node({ [N.publicIPOverwrite]: 'my-nat-ip' }), N),
      (e: unknown) => {
        assert.ok(e instanceof AnnotationValueError);
        assert.equal(e.node, 'node-a');
        assert.equal(e.annotation, 'flannel.alpha.coreos.com/public-ip-overwrite');
        assert.equal(e.value, 'my-nat-ip');
        assert.equal(
          e.message,
          'node "node-a": annotation flannel.alpha.coreos.com/public-ip-overwrite="my-nat-ip": not an IPv4 address',
        );
        return true;
      },
    );
    assert.throws(() => readOverwrites(node({ [N.publicIPv6Overwrite]: '10.0.0.1' }), N), {
      message: 'node "node-a": annotation flannel.alpha.coreos.com/public-ipv6-overwrite="10.0.0.1": not an IPv6 address',
    });
  });
});

/** flannel's GetStoredMacAddresses string handling, verbatim (Trim "\"}" then split on `:"`). */
function flannelStoredMac(value: string): string {
  let s = value;
  while (s.length > 0 && '"}'.includes(s[0]!)) s = s.slice(1);
  while (s.length > 0 && '"}'.includes(s[s.length - 1]!)) s = s.slice(0, -1);
  const parts = s.split(':"');
  return parts.length === 2 ? parts[1]! : '';
}

describe('kube storedVtepMacs', () => {
  it('reads the MACs of the exact strings flanneld writes', () => {
    const golden = '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}';
    const got = storedVtepMacs(node({ [N.backendData]: golden, [N.backendV6Data]: `{"VNI":1,"VtepMAC":"${MAC6}"}` }), N);
    assert.deepEqual(got, { v4: MAC, v6: MAC6, problems: [] });
    // what we write is what flannel's own reader expects
    const written = desiredAnnotations(N, { publicIP: ip('10.0.0.5'), publicIPv6: null, backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: MAC } }, 'vxlan');
    assert.equal(written[N.backendData], golden);
    assert.equal(flannelStoredMac(golden), MAC);
  });

  it('parses JSON, so key order, spacing, case and "-" separators do not matter', () => {
    const value = '{ "vtepmac" : "12-C6-65-89-B4-E3", "VNI": 1 }';
    assert.notEqual(flannelStoredMac(value), MAC); // flannel's split gets this wrong
    assert.deepEqual(storedVtepMacs(node({ [N.backendData]: value }), N), { v4: MAC, v6: null, problems: [] });
  });

  it('finds nothing, quietly, when there is nothing to keep', () => {
    assert.deepEqual(storedVtepMacs(node(undefined), N), { v4: null, v6: null, problems: [] });
    assert.deepEqual(storedVtepMacs(node({ [N.backendData]: 'null', [N.backendV6Data]: '{"VNI":1}' }), N), {
      v4: null,
      v6: null,
      problems: [],
    });
  });

  it('reports unusable values by node, key and value', () => {
    const got = storedVtepMacs(
      node({
        [N.backendData]: '{"VNI":1,"VtepMAC":"13:c6:65:89:b4:e3"}',
        [N.backendV6Data]: '{"VNI":1,"VtepMAC":',
      }),
      N,
    );
    assert.equal(got.v4, null);
    assert.equal(got.v6, null);
    assert.equal(got.problems.length, 2);
    assert.equal(
      got.problems[0],
      'node "node-a": annotation flannel.alpha.coreos.com/backend-data="{\\"VNI\\":1,\\"VtepMAC\\":\\"13:c6:65:89:b4:e3\\"}": ' +
        'VtepMAC 13:c6:65:89:b4:e3 is a multicast address',
    );
    assert.match(
      got.problems[1]!,
      /^node "node-a": annotation flannel\.alpha\.coreos\.com\/backend-v6-data="\{\\"VNI\\":1,\\"VtepMAC\\":": not valid JSON \(/,
    );
    const more = storedVtepMacs(
      node({ [N.backendData]: '[1]', [N.backendV6Data]: '{"VtepMAC":"00:00:00:00:00:00"}' }),
      N,
    );
    assert.deepEqual(more.problems, [
      'node "node-a": annotation flannel.alpha.coreos.com/backend-data="[1]": not a JSON object',
      'node "node-a": annotation flannel.alpha.coreos.com/backend-v6-data="{\\"VtepMAC\\":\\"00:00:00:00:00:00\\"}": VtepMAC 00:00:00:00:00:00 is all zeros',
    ]);
    const bad = storedVtepMacs(node({ [N.backendData]: '{"VtepMAC":"12:c6:65:89:b4"}' }), N);
    assert.deepEqual(bad.problems, [
      'node "node-a": annotation flannel.alpha.coreos.com/backend-data="{\\"VtepMAC\\":\\"12:c6:65:89:b4\\"}": VtepMAC "12:c6:65:89:b4" is not a MAC address',
    ]);
  });

  it('looks under the configured prefix (flannel uses "<raw prefix>/backend-data")', () => {
    const n = annotationNames('example.com/foo');
    const value = `{"VNI":1,"VtepMAC":"${MAC}"}`;
    assert.equal(storedVtepMacs(node({ 'example.com/foo-backend-data': value }), n).v4, MAC);
    assert.equal(storedVtepMacs(node({ 'example.com/foo/backend-data': value }), n).v4, null);
  });
});

describe('kube storedPublicIPs', () => {
  it('reads node-public-ip and node-public-ipv6', () => {
    const got = storedPublicIPs(node({ [N.nodePublicIP]: '192.0.2.9', [N.nodePublicIPv6]: '2001:db8::9' }), N);
    assert.equal(got.v4?.toString(), '192.0.2.9');
    assert.equal(got.v6?.toString(), '2001:db8::9');
    assert.deepEqual(storedPublicIPs(node({}), N), { v4: null, v6: null });
  });

  it('refuses a value that is not an address', () => {
    assert.throws(() => storedPublicIPs(node({ [N.nodePublicIP]: '192.0.2.300' }), N), {
      name: 'AnnotationValueError',
      message: 'node "node-a": annotation flannel.alpha.coreos.com/node-public-ip="192.0.2.300": not an IPv4 address',
    });
  });
});
