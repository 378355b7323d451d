// flannel's kube subnet manager (pkg/subnet/kube/kube.go): the node's subnet is its spec.podCIDR(s),
// peers are the Nodes carrying flannel's annotations. Differences from flannel: its own list+watch
// instead of an informer (client-node's stops on connection errors), re-listing after a broken watch
// or 410 with the difference computed by the LeaseWatcher; no fixed-size event queue; a peer whose
// annotations turn to garbage keeps its last good lease; every update that changes what a backend
// programs (v6 data, podCIDRs) is an event.
import { readFile } from 'node:fs/promises';
import type { KubeConfig } from '@kubernetes/client-node';
import { AbortedError, Backoff, delay } from '../../util/backoff.js';
import { errnoCode, errorMessage } from '../../util/errors.js';
import type { IPAddr } from '../../util/ip.js';
import { rateLimited, type Logger } from '../../util/log.js';
import { AsyncQueue } from '../../util/queue.js';
import { ConfigError, parseNetworkConfig, type NetworkConfig } from '../config.js';
import { leaseId, type Lease, type LeaseAttrs } from '../lease.js';
import {
  ConfigNotFoundError,
  StoreUnavailableError,
  type AcquireHow,
  type AcquiredLease,
  type SubnetManager,
} from '../manager.js';
import type { RawLeaseEvent, WatchResult } from '../watcher.js';
import { annotationNames, desiredAnnotations, readOverwrites, type AnnotationNames } from './annotations.js';
import {
  KubeApiError,
  KubeClient,
  KubeConnectionError,
  KubeProtocolError,
  loadKubeConfig,
  type KubeConnectOptions,
  type NodeWatchEvent,
} from './client.js';
import { annotationPatch, leaseChanged, networkUnavailablePatch, nodeToLease, ownPodCIDRs } from './node.js';
import type { KubeNode } from './objects.js';

export const DEFAULT_NET_CONFIG_PATH = '/etc/kube-flannel/net-conf.json';

export interface KubeManagerOptions extends KubeConnectOptions {
  readonly nodeName: string;
  /** --net-config-path */
  readonly netConfigPath: string;
  /** --kube-annotation-prefix (flannel's normalisation applies). */
  readonly annotationPrefix: string;
  /** --set-node-network-unavailable */
  readonly setNodeNetworkUnavailable: boolean;
  readonly logger: Logger;
  /** Backend types the config parser accepts. */
  readonly knownBackends: readonly string[];
  /** A ready client (tests, or the CLI that already made one to resolve the node name). */
  readonly client?: KubeClient;
  /** How long acquireLease waits for the own Node to exist (flannel: 30 s). */
  readonly nodeWaitTimeoutMs?: number;
  /** Lost patch races (409) to retry before giving up. */
  readonly maxConflictRetries?: number;
  /** Called for every failed API request (metrics). */
  readonly onStoreError?: (op: string) => void;
  /** Clock for the NetworkUnavailable condition's times (tests). */
  readonly now?: () => Date;
}

/** The own Node did not appear in time (wrong NODE_NAME, or the kubelet never registered it). */
export class NodeNotFoundError extends Error {
  constructor(
    readonly node: string,
    readonly waitedMs: number,
  ) {
    super(`node "${node}" not found after waiting ${Math.round(waitedMs / 1000)} s (is NODE_NAME right?)`);
    this.name = 'NodeNotFoundError';
  }
}

/** The annotation patch kept losing to concurrent writers. */
export class PatchConflictError extends Error {
  constructor(
    readonly node: string,
    readonly attempts: number,
  ) {
    super(`node "${node}": annotation patch refused with 409 Conflict ${attempts} times in a row`);
    this.name = 'PatchConflictError';
  }
}

/**
 * Waits between list/watch attempts while the API server fails. The cap bounds catch-up: once the
 * server is back (restarted, its 410 burst over, no longer slow) every node re-lists within one
 * wait — at most 3 s with the jitter — and so programs what changed within 5 s (issue 16's bound;
 * a 5 s cap, 6 s with jitter, could not keep it). A failed attempt costs little (a refused
 * connection; in a 410 burst one list and one watch per node per 2.5 s), nothing like a hot loop.
 */
export const WATCH_RETRY_INITIAL_MS = 100;
export const WATCH_RETRY_MAX_MS = 2500;

/** Status codes worth retrying: the server is away, overloaded, or (RBAC being applied) not yet letting us in. */
function retryable(e: unknown): boolean {
  if (e instanceof KubeConnectionError || e instanceof KubeProtocolError) return true;
  if (e instanceof KubeApiError) return e.code === 401 || e.code === 403 || e.code === 429 || e.code >= 500 || e.code === 0;
  return false;
}

export class KubeSubnetManager implements SubnetManager {
  readonly name = 'kube';
  readonly client: KubeClient;
  readonly names: AnnotationNames;
  private config: NetworkConfig | null = null;
  private readonly closed = new AbortController();

  constructor(private readonly opts: KubeManagerOptions) {
    this.names = annotationNames(opts.annotationPrefix);
    this.client = opts.client ?? new KubeClient(loadKubeConfig(opts));
  }

  get kubeConfig(): KubeConfig {
    return this.client.kubeConfig;
  }

  async getNetworkConfig(): Promise<NetworkConfig> {
    const path = this.opts.netConfigPath;
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (e) {
      // The ConfigMap volume may not be there yet: the daemon waits for it.
      if (errnoCode(e) === 'ENOENT') throw new ConfigNotFoundError(`network config file ${path} not found`);
      throw new ConfigError(null, `reading network config file ${path}: ${errorMessage(e)}`);
    }
    // Subnet ranges mean nothing here: the controller manager allocates the podCIDRs.
    const cfg = parseNetworkConfig(text, { knownBackends: this.opts.knownBackends, checkSubnets: false });
    this.config = cfg;
    return cfg;
  }

  async acquireLease(attrs: LeaseAttrs, signal?: AbortSignal): Promise<AcquiredLease> {
    const cfg = this.config ?? (await this.getNetworkConfig());
    const maxRetries = this.opts.maxConflictRetries ?? 20;
    const name = this.opts.nodeName;
    for (let retries = 0; ; retries++) {
      if (signal?.aborted) throw new AbortedError();
      if (retries > maxRetries) throw new PatchConflictError(name, retries);
      const node = await this.waitForOwnNode(signal);
      // Errors here are the node's configuration (no podCIDR, a typo in an overwrite): fatal, as in flannel.
      const { subnet, ipv6Subnet } = ownPodCIDRs(node, cfg);
      const overwrites = readOverwrites(node, this.names);
      const desired = desiredAnnotations(this.names, attrs, attrs.backendType ?? '', overwrites);
      const patch = annotationPatch(node, desired);
      let current = node;
      if (patch) {
        try {
          current = await this.client.patchNodeStatus(patch, signal);
        } catch (e) {
          // 409: the Node changed since we read it (resourceVersion precondition); 404: it was deleted.
          if (e instanceof KubeApiError && (e.code === 409 || e.code === 404)) {
            this.opts.logger.debug('node changed while publishing annotations; reading it again', { node: name, code: e.code });
            continue;
          }
          throw this.storeError('patch node annotations', e);
        }
        this.opts.logger.info('published node annotations', { node: name, patch: patch.body });
      }
      if (this.opts.setNodeNetworkUnavailable) {
        try {
          await this.client.patchNodeStatus(networkUnavailablePatch(current, (this.opts.now ?? (() => new Date()))()), signal);
        } catch (e) {
          throw this.storeError('set NetworkUnavailable=False', e);
        }
      }
      // No expiry in kube mode: the Node is the lease (flannel reports a nominal now+24h).
      const lease: Lease = { subnet, ipv6Subnet, attrs, reservation: false, expiration: null };
      const how: AcquireHow = patch ? 'new' : 'reuse';
      return { lease, how, retries };
    }
  }

  /** Our Node as a lease, for the VTEP MAC kept across restarts; the node is ours whatever its public IP. */
  async findOwnLease(_publicIP: IPAddr): Promise<Lease | null> {
    const cfg = this.config ?? (await this.getNetworkConfig());
    let node: KubeNode;
    try {
      node = await this.client.getNode(this.opts.nodeName);
    } catch (e) {
      if (e instanceof KubeApiError && e.code === 404) return null;
      throw this.storeError('get own node', e);
    }
    const result = nodeToLease(node, this.names, cfg);
    if ('lease' in result) return result.lease;
    if (result.managed) this.opts.logger.warn('own node annotations unusable; not keeping the VTEP MAC', { reason: result.skip });
    return null;
  }

  /** Nothing expires in kube mode. */
  renewLease(lease: Lease): Promise<Lease> {
    return Promise.resolve(lease);
  }

  /** flannel does nothing here either: the annotations stay until the Node is deleted. */
  async keepLease(_lease: Lease, _onChange: (lease: Lease, how: AcquireHow) => void, signal: AbortSignal): Promise<void> {
    if (signal.aborted) return;
    await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
  }

  watchLeases(signal: AbortSignal): AsyncIterable<WatchResult> {
    const queue = new AsyncQueue<WatchResult>();
    const stop = AbortSignal.any([signal, this.closed.signal]);
    // An abort listener added to an already-aborted signal never runs: end at once.
    if (stop.aborted) {
      queue.close();
      return queue;
    }
    void this.runWatch(queue, stop).then(
      () => queue.close(),
      (e: Error) => queue.close(e),
    );
    return queue;
  }

  close(): Promise<void> {
    this.closed.abort();
    return Promise.resolve();
  }

  private async runWatch(queue: AsyncQueue<WatchResult>, signal: AbortSignal): Promise<void> {
    const log = this.opts.logger;
    const cfg = this.config ?? (await this.getNetworkConfig());
    const tracker = new NodeLeases(this.names, cfg, log);
    const backoff = new Backoff(WATCH_RETRY_INITIAL_MS, WATCH_RETRY_MAX_MS);
    const say = rateLimited(log, 30_000);
    let rv: string | null = null;
    // The current watch: when the server accepted it, and how many events it brought.
    let openedAt = 0;
    let events = 0;
    // A watch that brought events or ran for a while was a success: the backoff starts afresh.
    // One that ends or breaks right after opening keeps growing it, so a flapping server is not
    // hammered with lists. A clean end (the server's timeout, or its graceful shutdown) after a
    // second of streaming is a success too: counting only events and 10 s, a quiet watch that a
    // restarting server ended kept the backoff of an earlier outage, and both the re-watch and the
    // re-list after its 410 waited a full capped delay (5.6 s to catch up, beyond issue 16's 5 s).
    const progressed = (cleanEnd: boolean) =>
      openedAt > 0 && (events > 0 || Date.now() - openedAt > (cleanEnd ? 1000 : 10_000));
    while (!signal.aborted) {
      try {
        if (rv === null) {
          const list = await this.client.listNodes(signal);
          queue.push({ kind: 'snapshot', leases: tracker.reset(list.items) });
          rv = list.resourceVersion;
        }
        let pending: RawLeaseEvent[] = [];
        let scheduled = false;
        // Events of one read are one batch: a burst of thousands of nodes is a handful of pushes.
        const flush = () => {
          scheduled = false;
          if (pending.length === 0) return;
          queue.push({ kind: 'events', events: pending });
          pending = [];
        };
        const onEvent = (ev: NodeWatchEvent) => {
          events++;
          if (ev.node.metadata.resourceVersion) rv = ev.node.metadata.resourceVersion;
          if (ev.type === 'BOOKMARK') return;
          pending.push(...tracker.apply(ev.type, ev.node));
          if (!scheduled && pending.length > 0) {
            scheduled = true;
            setImmediate(flush);
          }
        };
        openedAt = 0;
        events = 0;
        let end;
        try {
          end = await this.client.watchNodes(rv, onEvent, signal, () => (openedAt = Date.now()));
        } finally {
          flush();
        }
        if (end === 'expired') {
          // Rate-limited like failures: a burst of 410s (compaction repeated) must not fill the log either.
          say('expired', 'info', 'node watch expired (410); listing again', { resourceVersion: rv });
          rv = null;
        }
        // 'closed': the server's timeout; watch again from the last resourceVersion seen.
        if (progressed(end === 'closed')) backoff.reset();
        else await backoff.wait(signal).catch(() => undefined);
      } catch (e) {
        if (signal.aborted) break;
        this.opts.onStoreError?.('watch');
        if (progressed(false)) backoff.reset();
        openedAt = 0;
        const error = errorMessage(e);
        // An outage of minutes must not fill the log: each distinct failure once per 30 s.
        say(`watch ${error}`, 'warn', 'node list/watch failed; listing again', { error });
        rv = null;
        await backoff.wait(signal).catch(() => undefined);
      }
    }
  }

  /** The own Node, polling while it does not exist yet (flannel: every 3 s for up to 30 s). */
  private async waitForOwnNode(signal?: AbortSignal): Promise<KubeNode> {
    const name = this.opts.nodeName;
    const limit = this.opts.nodeWaitTimeoutMs ?? 30_000;
    const started = Date.now();
    const backoff = new Backoff(250, 3000);
    let said = false;
    while (true) {
      try {
        return await this.client.getNode(name, signal);
      } catch (e) {
        if (signal?.aborted) throw new AbortedError();
        if (!(e instanceof KubeApiError && e.code === 404)) throw this.storeError('get own node', e);
      }
      const waited = Date.now() - started;
      if (waited >= limit) throw new NodeNotFoundError(name, waited);
      if (!said) this.opts.logger.warn('waiting for our Node object to exist', { node: name });
      said = true;
      await delay(Math.min(backoff.next(), limit - waited), signal);
    }
  }

  /** API failures worth retrying become StoreUnavailableError (the daemon retries); others pass through. */
  private storeError(op: string, e: unknown): Error {
    if (e instanceof AbortedError) return e;
    this.opts.onStoreError?.(op);
    if (retryable(e)) return new StoreUnavailableError(op, e);
    return e instanceof Error ? e : new Error(String(e));
  }
}

/**
 * Every node's lease as last seen, turning list results into snapshots and watch events into
 * lease events. A managed node whose annotations stop parsing keeps its last good lease (a typo
 * must not tear down its tunnels) and is warned about once per reason.
 *
 * Two Nodes may carry the same podCIDR(s) (a misconfiguration, or a Node created to take over
 * another's traffic). Only the older claim (creation time, then name) becomes a lease; the other
 * is logged once and takes over only when the older one goes away.
 */
export class NodeLeases {
  private readonly known = new Map<string, Lease>();
  /** lease id → the nodes claiming it. */
  private readonly claims = new Map<string, Set<string>>();
  /** node → the reason last warned about, so each bad state is logged once. */
  private readonly warned = new Map<string, string>();

  constructor(
    private readonly names: AnnotationNames,
    private readonly config: Pick<NetworkConfig, 'enableIPv4' | 'enableIPv6'>,
    private readonly log: Logger,
  ) {}

  get size(): number {
    return this.known.size;
  }

  /** A full listing: the new set of leases (ours included; the LeaseWatcher leaves it out). */
  reset(nodes: readonly KubeNode[]): Lease[] {
    const seen = new Set<string>();
    for (const node of nodes) {
      const name = node.metadata.name;
      seen.add(name);
      this.update(node);
    }
    for (const name of [...this.known.keys()]) if (!seen.has(name)) this.forget(name);
    for (const name of [...this.warned.keys()]) if (!seen.has(name)) this.warned.delete(name);
    return [...this.claims.keys()].map((id) => this.visible(id)).filter((l): l is Lease => l !== null);
  }

  apply(type: 'ADDED' | 'MODIFIED' | 'DELETED', node: KubeNode): RawLeaseEvent[] {
    const name = node.metadata.name;
    const prev = this.known.get(name);
    const ids = new Set(prev ? [leaseId(prev)] : []);
    const before = new Map([...ids].map((id) => [id, this.visible(id)]));
    if (type === 'DELETED') {
      this.forget(name);
      this.warned.delete(name);
    } else {
      const next = this.update(node);
      if (next) {
        const id = leaseId(next);
        if (!before.has(id)) before.set(id, this.visibleWithout(id, name));
        ids.add(id);
      }
    }
    const added: RawLeaseEvent[] = [];
    const removed: RawLeaseEvent[] = [];
    for (const id of ids) {
      const was = before.get(id) ?? null;
      const now = this.visible(id);
      if (now && (!was || leaseChanged(was, now))) added.push({ type: 'added', lease: now });
      else if (!now && was) removed.push({ type: 'removed', lease: was });
    }
    // A new podCIDR is a new lease identity: the old one goes first.
    return [...removed, ...added];
  }

  /** The lease of the oldest node claiming `id`, or null. */
  private visible(id: string): Lease | null {
    return this.visibleWithout(id, null);
  }

  private visibleWithout(id: string, skip: string | null): Lease | null {
    let best: { name: string; lease: Lease } | null = null;
    for (const name of this.claims.get(id) ?? []) {
      if (name === skip) continue;
      const lease = this.known.get(name);
      if (lease && (!best || olderClaim(name, lease, best.name, best.lease))) best = { name, lease };
    }
    return best?.lease ?? null;
  }

  /** Records a node's lease; true when an older Node's claim on the same podCIDR shadows it. */
  private remember(name: string, lease: Lease): boolean {
    this.forget(name);
    this.known.set(name, lease);
    const id = leaseId(lease);
    let set = this.claims.get(id);
    if (!set) this.claims.set(id, (set = new Set()));
    set.add(name);
    if (set.size === 1) return false;
    const winner = [...set].find((n) => this.known.get(n) === this.visible(id));
    for (const n of set) {
      if (n === winner) continue;
      const why = `its podCIDR is the older Node "${winner ?? '?'}"'s`;
      if (this.warned.get(n) === why) continue;
      this.warned.set(n, why);
      this.log.warn('node ignored: another Node claims the same podCIDR', { node: n, reason: why });
    }
    return name !== winner;
  }

  private forget(name: string): void {
    const prev = this.known.get(name);
    if (!prev) return;
    this.known.delete(name);
    const id = leaseId(prev);
    const set = this.claims.get(id);
    set?.delete(name);
    if (set?.size === 0) this.claims.delete(id);
  }

  /** Records the node's lease; returns it, or null when the node is (no longer) a peer. */
  private update(node: KubeNode): Lease | null {
    const name = node.metadata.name;
    const result = nodeToLease(node, this.names, this.config);
    if ('lease' in result) {
      if (!this.remember(name, result.lease)) this.warned.delete(name);
      return result.lease;
    }
    if (!result.managed) {
      this.forget(name);
      this.warned.delete(name);
      return null;
    }
    const prev = this.known.get(name) ?? null;
    if (this.warned.get(name) !== result.skip) {
      this.warned.set(name, result.skip);
      this.log.warn(prev ? 'node annotations unusable; keeping its last good lease' : 'node annotations unusable; skipping the node', {
        node: name,
        reason: result.skip,
      });
    }
    return prev;
  }
}

/** Of two Nodes claiming one podCIDR the one created first wins; ties go to the smaller name. */
function olderClaim(a: string, la: Lease, b: string, lb: Lease): boolean {
  if (la.claimedAt !== undefined && lb.claimedAt !== undefined && la.claimedAt !== lb.claimedAt) return la.claimedAt < lb.claimedAt;
  return a < b;
}
