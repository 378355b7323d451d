// Mocha root hook plugin of the CNI suites' server mode (`npm run test:cni-server`):
//
//   WEFT_TEST_CNI_VIA=server mocha --require test/helpers/cni-server-mode.ts test/integration/cni-bridge.test.ts …
//
// After each file (root hooks run per file under --parallel, once per run otherwise) it stops the
// CNI test servers test/helpers/cni.ts started and checks that server mode was not fallback mode
// in disguise: calls were sent to servers, the servers served them, none was refused (a caller in
// another namespace than its server's) and no server died on its own. It prints one line of counts.
import { cniServerSummary, CNI_VIA, resetCniServerSummary, stopCniServers } from './cni.js';

export const mochaHooks = {
  async afterAll(this: Mocha.Context): Promise<void> {
    this.timeout(60_000);
    if (CNI_VIA !== 'server') throw new Error('cni-server-mode.ts is for WEFT_TEST_CNI_VIA=server runs');
    await stopCniServers();
    const s = cniServerSummary();
    resetCniServerSummary();
    const kept = Object.entries(s.fallback).map(([why, n]) => `${n}× ${why}`);
    console.log(
      `      CNI server mode: ${s.routed} plugin calls sent to ${s.started} servers, ${s.requests} requests served` +
        (kept.length > 0 ? `; kept on the fallback: ${kept.join('; ')}` : ''),
    );
    const wrong: string[] = [...s.problems, ...s.refused];
    // Every call sent to a server is one request at least (delegates run as programs add more).
    if (s.routed > 0 && s.requests < s.routed) wrong.push(`${s.routed} calls were sent to CNI servers, which served ${s.requests} requests: some calls fell back`);
    if (wrong.length > 0) throw new Error(`CNI server mode:\n${wrong.join('\n')}`);
  },
};
