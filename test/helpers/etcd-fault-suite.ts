// The set-up the etcd fault scenarios share: three vxlan weftd hosts on a 3-member etcd, a lease
// writer with a few fake peers, every scenario starting from a whole cluster and converged hosts,
// and after each one the members brought back (a failed scenario may leave them cut off or down).
import { Cluster } from './cluster.js';
import { divergence, LeaseWriter, type EtcdCluster, type Scenario } from './etcd-cluster.js';
import { waitFor } from './wait.js';

export interface FaultSuite {
  readonly c: Cluster;
  readonly etcd: EtcdCluster;
  readonly writer: LeaseWriter;
  /** The running scenario: stopped after each test. */
  scenario: Scenario | null;
  readonly etcdctl: (...args: string[]) => Promise<string>;
}

/** Registers the mocha hooks in the calling describe(); the returned fields are set once before() ran. */
export function etcdFaultSuite(opts: { tag: string; seed: number; weftdArgs?: string[] }): FaultSuite {
  const s = { scenario: null, etcdctl: (...a: string[]) => s.c.etcdctl(...a) } as unknown as { -readonly [K in keyof FaultSuite]: FaultSuite[K] };
  before(async () => {
    s.c = await Cluster.create({
      hosts: 3,
      tag: opts.tag,
      etcdMembers: 3,
      // Real nodes take 10.64.1-99.0/24; the writer's fakes are 10.65.0.0/24 upwards.
      config: { Network: '10.64.0.0/10', SubnetMax: '10.64.99.0', Backend: { Type: 'vxlan' } },
      ...(opts.weftdArgs ? { weftdArgs: opts.weftdArgs } : {}),
    });
    s.etcd = s.c.etcd!;
    await s.c.startAll();
    s.writer = new LeaseWriter(s.etcdctl, { seed: opts.seed });
    for (let i = 0; i < 6; i++) await s.writer.put();
    await waitFor(async () => (await divergence(s.c.hosts, s.etcdctl)).length === 0, { timeoutMs: 30_000, what: 'every host programmed' });
    await waitFor(() => s.c.allPodsReachable(), { timeoutMs: 30_000, what: 'pods reaching each other' });
  });
  beforeEach(async () => {
    await s.etcd.restoreAll();
    await s.etcd.waitHealthy();
    await waitFor(async () => (await divergence(s.c.hosts, s.etcdctl)).length === 0, { timeoutMs: 30_000, what: 'converged before the scenario' });
  });
  afterEach(async () => {
    s.scenario?.stop();
    s.scenario = null;
    // Bring members back so the writer's change in flight can finish, but never hang here.
    await s.etcd?.restoreAll(true);
    await s.writer?.stopWithin(30_000);
  });
  after(async () => {
    await s.c?.destroy();
  });
  return s;
}
