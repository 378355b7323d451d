// The soak's 60-second version (bench/soak.ts runs it for 10 minutes): 3 vxlan hosts + a 3-member
// etcd with lease churn, CNI ADD/DEL of pods on every host, an etcd leader kill, one weftd kill -9
// and hand-made drift at once; no invariant may be violated (test/helpers/soak.ts lists them).
// The figures are printed, not asserted.
import assert from 'node:assert/strict';
import { runSoak } from '../helpers/soak.js';

describe('soak (60 s): lease churn, pods, leader kill, weftd kill -9 and drift at once', function () {
  this.timeout(360_000);

  it('violates no invariant', async () => {
    const r = await runSoak({ durationMs: 60_000, tag: 'sk', log: (l) => console.log(`      ${l}`) });
    console.log(`      ${r.summary}`);
    assert.deepEqual(r.violations, [], 'no invariant violated');
  });
});
