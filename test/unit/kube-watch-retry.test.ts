// The kube lease manager's list/watch loop against a scripted client: a burst of 410s is retried
// with backoff (no hot loop re-listing), and the wait between attempts is capped low enough that a
// node catches up within issue 16's 5 s once the API server is healthy again.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';

import { KubeConfig } from '@kubernetes/client-node';

import { KubeConnectionError, type KubeClient, type NodeList, type NodeWatchEvent, type WatchEnd } from '../../src/subnet/kube/client.js';
import { KubeSubnetManager, WATCH_RETRY_INITIAL_MS, WATCH_RETRY_MAX_MS } from '../../src/subnet/kube/manager.js';
import type { KubeNode } from '../../src/subnet/kube/objects.js';
import type { WatchResult } from '../../src/subnet/watcher.js';
import { Backoff } from '../../src/util/backoff.js';
import { createLogger } from '../../src/util/log.js';
import { waitFor } from '../helpers/wait.js';

const A = 'flannel.alpha.coreos.com/';

function node(name: string, podCIDR: string, publicIP: string): KubeNode {
  return {
    metadata: {
      name,
      resourceVersion: '1',
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

/**
 * The first `failLists` lists fail as a server that is away does; watches follow `watchScript`
 * (410, or a clean end after that many ms without events), then are answered 410 while
 * `expiring`, else stay open until aborted.
 */
class ScriptedClient {
  readonly kubeConfig = new KubeConfig();
  readonly lists: number[] = [];
  readonly watchEnds: number[] = [];
  watches = 0;
  openWatches = 0;
  expiring = true;
  failLists = 0;
  watchScript: ('expired' | number)[] = [];
  private rv = 100;

  listNodes(): Promise<NodeList> {
    if (this.failLists > 0) {
      this.failLists--;
      return Promise.reject(new KubeConnectionError('list nodes', new Error('connect ECONNREFUSED 10.250.0.254:6443')));
    }
    this.lists.push(Date.now());
    return Promise.resolve({ items: [node('n1', '10.244.1.0/24', '192.168.50.1')], resourceVersion: String(++this.rv) });
  }

  async watchNodes(_rv: string, _onEvent: (ev: NodeWatchEvent) => void, signal: AbortSignal, onOpen?: () => void): Promise<WatchEnd> {
    this.watches++;
    onOpen?.();
    const step = this.watchScript.shift();
    if (typeof step === 'number') {
      await new Promise((resolve) => setTimeout(resolve, step));
      this.watchEnds.push(Date.now());
      return 'closed';
    }
    if (step === 'expired' || this.expiring) return 'expired';
    this.openWatches++;
    await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
    this.openWatches--;
    throw new Error('aborted');
  }
}

describe('kube manager: list/watch retries', function () {
  this.timeout(20_000);
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'weft-kube-retry-'));
    writeFileSync(join(dir, 'net-conf.json'), JSON.stringify({ Network: '10.244.0.0/16', Backend: { Type: 'vxlan' } }));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the wait between attempts stays under 3 s, so a healthy server is used again within 5 s', () => {
    const b = new Backoff(WATCH_RETRY_INITIAL_MS, WATCH_RETRY_MAX_MS);
    const waits = Array.from({ length: 200 }, () => b.next());
    assert.ok(Math.max(...waits) <= 3000, `longest wait ${Math.max(...waits)} ms`);
    assert.ok(waits.slice(-20).every((w) => w >= WATCH_RETRY_MAX_MS * 0.8), 'grows to the cap');
  });

  /** Runs the manager's watch on `client` until `body` is done. */
  async function watching(client: ScriptedClient, body: (results: WatchResult[], logs: string[]) => Promise<void>): Promise<void> {
    const logs: string[] = [];
    const logger = createLogger({ level: 'info', stream: new Writable({ write: (c: Buffer, _e, done) => (logs.push(c.toString()), done()) }) });
    const m = new KubeSubnetManager({
      nodeName: 'n1',
      netConfigPath: join(dir, 'net-conf.json'),
      annotationPrefix: 'flannel.alpha.coreos.com',
      setNodeNetworkUnavailable: false,
      logger,
      knownBackends: ['vxlan'],
      client: client as unknown as KubeClient,
    });
    const ctl = new AbortController();
    const results: WatchResult[] = [];
    const consumed = (async () => {
      for await (const r of m.watchLeases(ctl.signal)) results.push(r);
    })();
    try {
      await body(results, logs);
    } finally {
      ctl.abort();
      await consumed;
      await m.close();
    }
  }

  it('a burst of 410s is re-listed with backoff, not in a hot loop, and the watch resumes after it', async () => {
    const client = new ScriptedClient();
    await watching(client, async (results, logs) => {
      const start = Date.now();
      await waitFor(() => Date.now() - start >= 1500, { timeoutMs: 5000, intervalMs: 100, what: '1.5 s of 410s' });
      const during = client.lists.length;
      // With backoff from 100 ms: lists at about 0, 0.1, 0.3, 0.7 and 1.5 s. A hot loop makes thousands.
      assert.ok(during >= 2 && during <= 8, `${during} lists in 1.5 s of 410s`);
      const gaps = client.lists.slice(1).map((t, i) => t - client.lists[i]!);
      assert.ok(gaps.every((g) => g >= WATCH_RETRY_INITIAL_MS * 0.8 - 1), `gaps ${gaps.join(',')}`);
      // Each attempt is one list and one watch; the log says so once, not once per attempt.
      assert.equal(client.watches, during);
      assert.equal(logs.filter((l) => l.includes('node watch expired (410)')).length, 1);

      client.expiring = false;
      const ended = Date.now();
      await waitFor(() => client.openWatches === 1, { timeoutMs: 5000, what: 'a watch that stays open' });
      const caughtUp = Date.now() - ended;
      assert.ok(caughtUp <= 5000, `watch open again ${caughtUp} ms after the 410s ended`);
      assert.equal(results.filter((r) => r.kind === 'snapshot').length, client.lists.length);
    });
  });

  it('a quiet watch the server ends cleanly is a success: after an outage, a restart with a fresh watch cache is caught up at once', async () => {
    // An outage grows the backoff (lists refused for 0.1 + 0.2 + 0.4 + 0.8 s); the watch after it
    // brings no event and the restarting server ends it after 1.2 s; the re-watch meets a fresh
    // watch cache (410) and lists again.
    const client = new ScriptedClient();
    client.expiring = false;
    client.failLists = 4;
    client.watchScript = [1200, 'expired'];
    await watching(client, async () => {
      await waitFor(() => client.lists.length === 2 && client.openWatches === 1, { timeoutMs: 10_000, what: 'the re-list and a watch that stays open' });
      const gap = client.lists[1]! - client.watchEnds[0]!;
      // Still counted as a failure, the end would wait one backoff (1.6 s ± 20%) and the 410 another.
      assert.ok(gap < 1000, `listed again ${gap} ms after the clean end`);
    });
  });
});
