// deploy/kubernetes/weft.yml: every document round-trips through client-node's typed models
// (a misspelled field would be dropped), and carries what kube mode needs: flannel's RBAC,
// ConfigMap keys that weft's own parsers accept, and a DaemonSet wired like kube-flannel's.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as k8s from '@kubernetes/client-node';
import yaml from 'js-yaml';
import { parseFlags } from '../../src/cli/flags.js';
import { parseNetworkConfig } from '../../src/subnet/config.js';

const FILE = fileURLToPath(new URL('../../deploy/kubernetes/weft.yml', import.meta.url));
const text = readFileSync(FILE, 'utf8');
const docs = text.split(/^---$/m).map((d) => d.trim()).filter((d) => d && !/^(#.*\n?)*$/.test(d));

const byKind = <T>(kind: string): T => {
  const found = docs.map((d) => k8s.loadYaml<{ kind?: string }>(d)).find((o) => o.kind === kind);
  assert.ok(found, `a ${kind}`);
  return found as T;
};

describe('deploy/kubernetes/weft.yml', () => {
  it('has the six objects, each valid for its typed model (round trip loses nothing)', () => {
    const kinds = docs.map((d) => k8s.loadYaml<{ kind: string }>(d).kind);
    assert.deepEqual(kinds, ['Namespace', 'ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'DaemonSet']);
    for (const d of docs) {
      // loadYaml types the object (fields the model does not know are dropped); dumpYaml serialises it back.
      const typed = yaml.load(k8s.dumpYaml(k8s.loadYaml<object>(d)));
      assert.deepEqual(typed, yaml.load(d));
    }
  });

  it('grants flannel\'s RBAC and, for --network-policy, get/list/watch on pods, namespaces and networkpolicies', () => {
    const role = byKind<k8s.V1ClusterRole>('ClusterRole');
    const rules = (role.rules ?? [])
      .map((r) => `${(r.apiGroups ?? []).join(',')}/${(r.resources ?? []).join(',')}:${(r.verbs ?? []).join(',')}`)
      .sort();
    assert.deepEqual(rules, [
      '/namespaces:get,list,watch',
      '/nodes/status:patch',
      '/nodes:get,list,watch',
      '/pods:get,list,watch',
      'networking.k8s.io/networkpolicies:get,list,watch',
    ]);
    const binding = byKind<k8s.V1ClusterRoleBinding>('ClusterRoleBinding');
    assert.deepEqual(JSON.parse(JSON.stringify(binding.subjects)), [{ kind: 'ServiceAccount', name: 'weft', namespace: 'kube-weft' }]);
  });

  it('ships a net-conf.json weft accepts and a flannel + portmap conflist', () => {
    const cm = byKind<k8s.V1ConfigMap>('ConfigMap');
    const cfg = parseNetworkConfig(cm.data!['net-conf.json']!, { knownBackends: ['vxlan', 'host-gw', 'alloc'], checkSubnets: false });
    assert.equal(String(cfg.network), '10.244.0.0/16');
    assert.equal(cfg.backend.type, 'vxlan');
    const conflist = JSON.parse(cm.data!['cni-conf.json']!) as { name: string; plugins: { type: string }[] };
    assert.equal(conflist.name, 'cbr0');
    assert.deepEqual(conflist.plugins.map((p) => p.type), ['flannel', 'portmap']);
  });

  it('runs weftd with --kube-subnet-mgr on the host network, with the mounts, capabilities and probes it needs', () => {
    const ds = byKind<k8s.V1DaemonSet>('DaemonSet');
    const pod = ds.spec!.template.spec!;
    assert.equal(pod.hostNetwork, true);
    assert.equal(pod.serviceAccountName, 'weft');
    const weftd = pod.containers.find((c) => c.name === 'weftd')!;
    assert.ok(weftd.args!.includes('--kube-subnet-mgr') && weftd.args!.includes('--ip-masq'));
    assert.ok(weftd.args!.includes('--network-policy'));
    assert.deepEqual(weftd.securityContext!.capabilities!.add, ['NET_ADMIN', 'NET_RAW']);
    assert.deepEqual(weftd.volumeMounts!.map((m) => m.mountPath).sort(), ['/etc/kube-flannel/', '/run/flannel', '/run/xtables.lock']);
    assert.equal(weftd.livenessProbe!.httpGet!.path, '/healthz');
    assert.equal(weftd.readinessProbe!.httpGet!.path, '/readyz');
    assert.deepEqual(weftd.env!.map((e) => e.name), ['POD_NAME', 'POD_NAMESPACE', 'NODE_NAME']);
    const init = pod.initContainers!.map((c) => c.command!.join(' '));
    assert.deepEqual(init, ['/opt/weft/bin/weft install-cni --dest /opt/cni/bin', 'cp -f /etc/kube-flannel/cni-conf.json /etc/cni/net.d/10-flannel.conflist']);
  });

  it('serves health, metrics and status on the node\'s loopback only, and probes them there', () => {
    const pod = byKind<k8s.V1DaemonSet>('DaemonSet').spec!.template.spec!;
    const weftd = pod.containers.find((c) => c.name === 'weftd')!;
    // weftd itself reads the arguments (the last --healthz-ip would win): loopback, port 8081.
    const saved = process.env.FLANNELD_HEALTHZ_IP;
    delete process.env.FLANNELD_HEALTHZ_IP;
    let flags: ReturnType<typeof parseFlags>;
    try {
      flags = parseFlags(weftd.args!);
    } finally {
      if (saved !== undefined) process.env.FLANNELD_HEALTHZ_IP = saved;
    }
    assert.equal(flags.healthzIp, '127.0.0.1');
    assert.equal(flags.healthzPort, 8081);
    assert.deepEqual(weftd.args!.filter((a) => /healthz-ip/.test(a)), ['--healthz-ip=127.0.0.1']);
    assert.ok(!weftd.env!.some((e) => e.name.startsWith('FLANNELD_')), 'no FLANNELD_* variable overrides the arguments');
    assert.equal(pod.hostNetwork, true, 'with hostNetwork the probes would otherwise go to the node address, where nothing listens');
    for (const probe of [weftd.livenessProbe!, weftd.readinessProbe!]) {
      assert.equal(probe.httpGet!.host, '127.0.0.1');
      assert.equal(probe.httpGet!.port, flags.healthzPort);
    }
    assert.equal(weftd.ports, undefined, 'no containerPort advertises the health port');
  });
});
