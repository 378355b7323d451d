// Masquerade and forward rules written by weftd inside host namespaces: exact rule text (iptables
// and nftables, both families), drift repair within one resync, no writes when nothing changed,
// real masquerading, a lease change and switching implementations without leftovers.
import assert from 'node:assert/strict';
import { Cluster, ETCD_IP, type Host } from '../helpers/cluster.js';
import { lines, nsExec, sh } from '../helpers/netns.js';
import { waitFor } from '../helpers/wait.js';

const CONFIG = { Network: '10.8.0.0/16', EnableIPv6: true, IPv6Network: 'fd08::/48', Backend: { Type: 'vxlan' } };

/** Our chains and every rule that mentions them, as iptables-save prints them. */
async function flannelRules(h: Host, family: 4 | 6, table: 'nat' | 'filter'): Promise<string[]> {
  const save = await nsExec(h.ns, family === 4 ? 'iptables-save' : 'ip6tables-save', '-t', table);
  return lines(save).filter((l) => l.startsWith(':FLANNEL') || (l.startsWith('-A') && /FLANNEL|flanneld/.test(l)));
}

function subnets(h: Host): { v4: string; v6: string } {
  const env = h.subnetEnv();
  const v4 = env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
  const v6 = env.FLANNEL_IPV6_SUBNET!.replace(/::1\/64$/, '::/64');
  return { v4, v6 };
}

function expectedNat(family: 4 | 6, network: string, subnet: string, fullyRandom = true): string[] {
  const c = '-m comment --comment "flanneld masq"';
  const mcast = family === 4 ? '224.0.0.0/4' : 'ff00::/8';
  const rf = fullyRandom ? ' --random-fully' : '';
  return [
    ':FLANNEL-POSTRTG - [0:0]',
    `-A POSTROUTING ${c} -j FLANNEL-POSTRTG`,
    `-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 ${c} -j RETURN`,
    `-A FLANNEL-POSTRTG -s ${subnet} -d ${network} ${c} -j RETURN`,
    `-A FLANNEL-POSTRTG -s ${network} -d ${subnet} ${c} -j RETURN`,
    `-A FLANNEL-POSTRTG ! -s ${network} -d ${subnet} ${c} -j RETURN`,
    `-A FLANNEL-POSTRTG -s ${network} ! -d ${mcast} ${c} -j MASQUERADE${rf}`,
    `-A FLANNEL-POSTRTG ! -s ${network} -d ${network} ${c} -j MASQUERADE${rf}`,
  ];
}

function expectedFilter(network: string): string[] {
  const c = '-m comment --comment "flanneld forward"';
  return [':FLANNEL-FWD - [0:0]', `-A FORWARD ${c} -j FLANNEL-FWD`, `-A FLANNEL-FWD -s ${network} ${c} -j ACCEPT`, `-A FLANNEL-FWD -d ${network} ${c} -j ACCEPT`];
}

function expectedNft(family: 4 | 6, network: string, subnet: string): string {
  const [fam, name, p, mcast] = family === 4 ? ['ip', 'flannel-ipv4', 'ip', '224.0.0.0/4'] : ['ip6', 'flannel-ipv6', 'ip6', 'ff00::/8'];
  return [
    `table ${fam} ${name} {`,
    `\tcomment "rules for ${name}"`,
    '\tchain postrtg {',
    '\t\tcomment "chain to manage traffic masquerading by flannel"',
    '\t\ttype nat hook postrouting priority srcnat; policy accept;',
    '\t\tmeta mark & 0x00004000 == 0x00004000 return',
    `\t\t${p} saddr ${subnet} ${p} daddr ${network} return`,
    `\t\t${p} saddr ${network} ${p} daddr ${subnet} return`,
    `\t\t${p} saddr != ${network} ${p} daddr ${subnet} return`,
    `\t\t${p} saddr ${network} ${p} daddr != ${mcast} masquerade fully-random`,
    `\t\t${p} saddr != ${network} ${p} daddr ${network} masquerade fully-random`,
    '\t}',
    '',
    '\tchain forward {',
    '\t\tcomment "chain to accept flannel traffic"',
    '\t\ttype filter hook forward priority filter; policy accept;',
    `\t\t${p} saddr ${network} accept`,
    `\t\t${p} daddr ${network} accept`,
    '\t}',
    '}',
    '',
  ].join('\n');
}



async function iptablesMatches(h: Host): Promise<boolean> {
  const { v4, v6 } = subnets(h);
  const same = (a: string[], b: string[]) => a.join('\n') === b.join('\n');
  return (
    same(await flannelRules(h, 4, 'nat'), expectedNat(4, '10.8.0.0/16', v4)) &&
    same(await flannelRules(h, 4, 'filter'), expectedFilter('10.8.0.0/16')) &&
    same(await flannelRules(h, 6, 'nat'), expectedNat(6, 'fd08::/48', v6)) &&
    same(await flannelRules(h, 6, 'filter'), expectedFilter('fd08::/48'))
  );
}

async function nftTables(h: Host): Promise<string[]> {
  return lines(await nsExec(h.ns, 'nft', 'list', 'tables'));
}

describe('ipmasq: masquerade and forward rules in host namespaces', function () {
  this.timeout(240_000);
  let c: Cluster;
  let h: Host;

  before(async () => {
    c = await Cluster.create({ hosts: 2, tag: 'mq', ipv6: true, config: CONFIG, weftdArgs: ['--ip-masq', '--iptables-resync', '1'] });
    await c.startAll();
    h = c.hosts[0]!;
  });
  after(async () => {
    await c?.destroy();
  });

  it('writes flannel\'s exact iptables and ip6tables rules, and nothing in nftables', async () => {
    await waitFor(() => iptablesMatches(h), { timeoutMs: 10_000, what: 'the rules' }).catch(() => undefined);
    const { v4, v6 } = subnets(h);
    assert.deepEqual(await flannelRules(h, 4, 'nat'), expectedNat(4, '10.8.0.0/16', v4));
    assert.deepEqual(await flannelRules(h, 4, 'filter'), expectedFilter('10.8.0.0/16'));
    assert.deepEqual(await flannelRules(h, 6, 'nat'), expectedNat(6, 'fd08::/48', v6));
    assert.deepEqual(await flannelRules(h, 6, 'filter'), expectedFilter('fd08::/48'));
    assert.ok(!(await nftTables(h)).some((t) => t.includes('flannel')));
  });

  it('masquerades pods leaving the cluster and keeps pod source addresses between nodes', async () => {
    const [a, b] = c.hosts as [Host, Host];
    // The underlay has no route to the pod network: only a masqueraded ping can be answered.
    await waitFor(() => a.ping(ETCD_IP), { timeoutMs: 10_000, what: 'a pod reaching the underlay' });
    const natted = lines(await nsExec(a.ns, 'conntrack', '-L', '-p', 'icmp', '-d', ETCD_IP));
    assert.ok(natted.some((l) => l.includes(`src=${a.podIP}`) && l.includes(`src=${ETCD_IP} dst=${a.underlayIP}`)), natted.join('\n'));
    await waitFor(() => a.ping(b.podIP!), { timeoutMs: 10_000, what: 'pod to pod' });
    const seen = lines(await nsExec(b.ns, 'conntrack', '-L', '-p', 'icmp', '-d', b.podIP!));
    assert.ok(seen.some((l) => l.includes(`src=${a.podIP} dst=${b.podIP}`) && l.includes(`src=${b.podIP} dst=${a.podIP}`)), seen.join('\n'));
  });

  it('does not rewrite anything while the rules are right', async () => {
    await waitFor(() => iptablesMatches(h), { what: 'the rules' });
    const writes = await h.metric('weft_ipmasq_writes_total{mode="iptables"}');
    await h.rulePasses(3);
    assert.equal(await h.metric('weft_ipmasq_writes_total{mode="iptables"}'), writes);
  });

  const tamper: Record<string, (h: Host) => Promise<unknown>> = {
    'a deleted rule': (x) => nsExec(x.ns, 'iptables', '-t', 'nat', '-D', 'FLANNEL-POSTRTG', '1'),
    'a duplicated rule': (x) => nsExec(x.ns, 'iptables', '-t', 'nat', '-A', 'FLANNEL-POSTRTG', '-m', 'mark', '--mark', '0x4000/0x4000', '-m', 'comment', '--comment', 'flanneld masq', '-j', 'RETURN'),
    'two rules swapped': async (x) => {
      await nsExec(x.ns, 'iptables', '-t', 'nat', '-D', 'FLANNEL-POSTRTG', '1');
      await nsExec(x.ns, 'iptables', '-t', 'nat', '-I', 'FLANNEL-POSTRTG', '2', '-m', 'mark', '--mark', '0x4000/0x4000', '-m', 'comment', '--comment', 'flanneld masq', '-j', 'RETURN');
    },
    'a flushed chain': (x) => nsExec(x.ns, 'ip6tables', '-t', 'nat', '-F', 'FLANNEL-POSTRTG'),
    'a deleted jump': (x) => nsExec(x.ns, 'iptables', '-D', 'FORWARD', '-m', 'comment', '--comment', 'flanneld forward', '-j', 'FLANNEL-FWD'),
    'a second jump': (x) => nsExec(x.ns, 'iptables', '-t', 'nat', '-I', 'POSTROUTING', '-m', 'comment', '--comment', 'flanneld masq', '-j', 'FLANNEL-POSTRTG'),
  };
  for (const [what, act] of Object.entries(tamper)) {
    it(`repairs ${what} within one resync and counts the repair`, async () => {
      await waitFor(() => iptablesMatches(h), { what: 'the rules before tampering' });
      const repairs = await h.metric('weft_ipmasq_repairs_total{mode="iptables"}');
      await act(h);
      // The counted repair proves the tampering was seen (the daemon may fix it before we could look).
      await waitFor(async () => (await h.metric('weft_ipmasq_repairs_total{mode="iptables"}')) >= repairs + 1, { timeoutMs: 5_000, what: 'the repair counted' });
      await waitFor(() => iptablesMatches(h), { timeoutMs: 5_000, what: 'the repair' });
      assert.match(h.weftd!.output, /repaired masquerade\/forward rules/);
    });
  }

  it('switches to nftables and back without leaving the other implementation\'s rules', async () => {
    await h.weftd!.stop();
    await c.writeConfig({ ...CONFIG, EnableNFTables: true });
    await h.startWeftd();
    const { v4, v6 } = subnets(h);
    const nftList = (fam: string, name: string) => nsExec(h.ns, 'nft', 'list', 'table', fam, name).catch(() => '');
    // The first pass writes each family's nft table and then cleans that family's iptables: the
    // pass is over when it has been counted.
    await waitFor(async () => (await h.metric('weft_ipmasq_checks_total', 0)) >= 1, { what: 'the first rule pass' });
    assert.equal(await nftList('ip6', 'flannel-ipv6'), expectedNft(6, 'fd08::/48', v6));
    assert.equal(await nftList('ip', 'flannel-ipv4'), expectedNft(4, '10.8.0.0/16', v4));
    for (const f of [4, 6] as const) for (const t of ['nat', 'filter'] as const) assert.deepEqual(await flannelRules(h, f, t), [], `ipv${f} ${t} cleaned`);
    await waitFor(() => h.ping(ETCD_IP), { what: 'masquerade through nftables' });

    // Drift in nftables: a deleted rule comes back, and nothing is written while the table is right.
    const listing = JSON.parse(await nsExec(h.ns, 'nft', '-j', 'list', 'chain', 'ip', 'flannel-ipv4', 'postrtg')) as { nftables: { rule?: { handle: number } }[] };
    const handle = listing.nftables.find((i) => i.rule)!.rule!.handle;
    await nsExec(h.ns, 'nft', 'delete', 'rule', 'ip', 'flannel-ipv4', 'postrtg', 'handle', String(handle));
    await waitFor(async () => (await nsExec(h.ns, 'nft', 'list', 'table', 'ip', 'flannel-ipv4')) === expectedNft(4, '10.8.0.0/16', v4), { timeoutMs: 5_000, what: 'nft repair' });
    const writes = await h.metric('weft_ipmasq_writes_total{mode="nftables"}');
    await h.rulePasses(3);
    assert.equal(await h.metric('weft_ipmasq_writes_total{mode="nftables"}'), writes);

    await h.weftd!.stop();
    await c.writeConfig(CONFIG);
    await h.startWeftd();
    await waitFor(() => iptablesMatches(h), { what: 'iptables rules back' });
    await waitFor(async () => !(await nftTables(h)).some((t) => t.includes('flannel')), { what: 'nft tables removed' });
  });

  it('leaves the rules in place when weftd stops', async () => {
    await waitFor(() => iptablesMatches(h), { what: 'the rules' });
    await h.weftd!.stop();
    assert.ok(await iptablesMatches(h));
    await h.startWeftd();
  });

  // Last: the pod keeps its address from the old subnet, so later pings would mean nothing.
  it('replaces the rules of the old subnet when the lease moves to a new one', async () => {
    const old = subnets(h);
    // Our lease disappears and another node takes its subnet: the daemon must acquire a different one.
    const keys = lines(await c.etcdctl('get', '--prefix', '--keys-only', '/coreos.com/network/subnets/'));
    // Dual-stack keys are `<v4>&<v6>`, as flannel writes them.
    const key = keys.find((k) => k.startsWith(`/coreos.com/network/subnets/${old.v4.replace('/', '-')}&`))!;
    assert.ok(key, keys.join('\n'));
    const other = JSON.stringify({ PublicIP: '10.250.0.99', PublicIPv6: null, BackendType: 'vxlan', BackendData: { VNI: 1, VtepMAC: '0e:aa:00:00:00:99' } });
    await c.etcdctl('del', key);
    await c.etcdctl('put', key, other);
    await waitFor(() => subnets(h).v4 !== old.v4, { timeoutMs: 30_000, what: 'a new subnet in subnet.env' });
    await waitFor(() => iptablesMatches(h), { timeoutMs: 10_000, what: 'rules for the new subnet' });
    const all = [...(await flannelRules(h, 4, 'nat')), ...(await flannelRules(h, 6, 'nat'))].join('\n');
    assert.ok(!all.includes(` ${old.v4} `), 'no rule of the old IPv4 subnet');
    await c.etcdctl('del', key);
  });

  it('never touched the machine\'s own namespace', async () => {
    // Reading the root namespace's rules is harmless; finding ours there is a failure.
    assert.ok(!/flanneld|FLANNEL/.test(await sh('iptables-save', [])));
    assert.ok(!/flannel/.test(await sh('nft', ['list', 'tables'])));
  });
});
