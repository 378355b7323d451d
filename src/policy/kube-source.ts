// Feeds the policy engine from the Kubernetes API: one list+watch loop per resource (Namespaces,
// Pods of every node — local pods' peers live anywhere — and NetworkPolicies), with the Node
// watcher's discipline (src/subnet/kube/manager.ts): a paged list at one resourceVersion, a watch
// from it with bookmarks, a re-list on 410 or a broken stream, diffed against what is known so an
// object deleted while nobody watched leaves the engine too, and a capped backoff while the API
// server fails. The engine's deltas go to the listener batched per tick, in order.
//
// An object that does not parse keeps its last valid version in the engine: dropping a policy
// because one update of it is bad would fail open. It is logged once per resourceVersion.
import { AbortedError, Backoff } from '../util/backoff.js';
import { errorMessage } from '../util/errors.js';
import { rateLimited, type Logger } from '../util/log.js';
import { KubeApiError, KubeProtocolError, type Json, type JsonObject, type KubeClient, type RawWatchEvent } from '../subnet/kube/client.js';
import { WATCH_RETRY_INITIAL_MS, WATCH_RETRY_MAX_MS } from '../subnet/kube/manager.js';
import type { PolicyEngine } from './engine.js';
import { isEmptyDelta, type PolicyDelta } from './model.js';
import { parseNamespace, parseNetworkPolicy, parsePod } from './objects.js';

export type PolicyResource = 'namespaces' | 'pods' | 'networkpolicies';

export const POLICY_RESOURCES: readonly PolicyResource[] = ['namespaces', 'pods', 'networkpolicies'];

export interface KubePolicySourceOptions {
  readonly client: KubeClient;
  readonly engine: PolicyEngine;
  readonly logger: Logger;
  /** The engine's non-empty deltas, in the order they happened, batched per tick. */
  readonly onDeltas: (deltas: readonly PolicyDelta[]) => void;
  /** Called for every failed list or watch (metrics). */
  readonly onStoreError?: (resource: PolicyResource) => void;
}

interface Kind {
  readonly resource: PolicyResource;
  readonly path: string;
  readonly listKind: string;
  readonly namespaced: boolean;
  /**
   * Parses `raw` (throwing PolicyInputError for a bad object) and returns how to apply it: parse
   * errors are the input's, errors of the engine are not, so they are kept apart.
   */
  parse(raw: JsonObject, warn: (warnings: readonly string[]) => void): (engine: PolicyEngine) => PolicyDelta;
  remove(engine: PolicyEngine, key: string): PolicyDelta;
}

const splitKey = (key: string): [string, string] => {
  const i = key.indexOf('/');
  return [key.slice(0, i), key.slice(i + 1)];
};

const KINDS: Readonly<Record<PolicyResource, Kind>> = {
  namespaces: {
    resource: 'namespaces',
    path: '/api/v1/namespaces',
    listKind: 'NamespaceList',
    namespaced: false,
    parse: (raw) => {
      const ns = parseNamespace(raw);
      return (engine) => engine.upsertNamespace(ns);
    },
    remove: (engine, key) => engine.deleteNamespace(key),
  },
  pods: {
    resource: 'pods',
    path: '/api/v1/pods',
    listKind: 'PodList',
    namespaced: true,
    parse: (raw) => {
      const pod = parsePod(raw);
      return (engine) => engine.upsertPod(pod);
    },
    remove: (engine, key) => engine.deletePod(...splitKey(key)),
  },
  networkpolicies: {
    resource: 'networkpolicies',
    path: '/apis/networking.k8s.io/v1/networkpolicies',
    listKind: 'NetworkPolicyList',
    namespaced: true,
    parse: (raw, warn) => {
      const np = parseNetworkPolicy(raw);
      if (np.warnings.length > 0) warn(np.warnings);
      return (engine) => engine.upsertPolicy(np);
    },
    remove: (engine, key) => engine.deletePolicy(...splitKey(key)),
  },
};

/** What the source knows of one resource: per object key, the resourceVersion in the engine. */
interface Known {
  /** key → resourceVersion of the version the engine holds (a valid one). */
  readonly applied: Map<string, string>;
  /** key → resourceVersion last logged as invalid, so each bad version is logged once. */
  readonly invalid: Map<string, string>;
  /** key → resourceVersion last logged for its warnings. */
  readonly warned: Map<string, string>;
}

function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** "namespace/name" (or "name"), and resourceVersion, read without trusting the rest of the object. */
function identity(kind: Kind, raw: Json): { key: string; rv: string } | null {
  if (!isObject(raw) || !isObject(raw.metadata)) return null;
  const { name, namespace, resourceVersion } = raw.metadata;
  if (typeof name !== 'string' || name === '') return null;
  const rv = typeof resourceVersion === 'string' ? resourceVersion : '';
  if (!kind.namespaced) return { key: name, rv };
  if (typeof namespace !== 'string' || namespace === '') return null;
  return { key: `${namespace}/${name}`, rv };
}

export class KubePolicySource {
  /** Resolves once each of the three resources has been listed and applied once (rejects on stop before that). */
  readonly synced: Promise<void>;
  private resolveSynced!: () => void;
  private rejectSynced!: (e: Error) => void;
  private readonly listed = new Set<PolicyResource>();
  private readonly known = new Map<PolicyResource, Known>(
    POLICY_RESOURCES.map((r) => [r, { applied: new Map(), invalid: new Map(), warned: new Map() }]),
  );
  private pending: PolicyDelta[] = [];
  private flushScheduled = false;
  private readonly stopper = new AbortController();
  private loops: Promise<void>[] = [];

  constructor(private readonly opts: KubePolicySourceOptions) {
    this.synced = new Promise<void>((resolve, reject) => {
      this.resolveSynced = resolve;
      this.rejectSynced = reject;
    });
    // A caller that never awaits `synced` must not see an unhandled rejection at stop.
    this.synced.catch(() => undefined);
  }

  /** Starts the three list+watch loops (once). */
  start(): void {
    if (this.loops.length > 0 || this.stopper.signal.aborted) return;
    this.loops = POLICY_RESOURCES.map((r) => this.run(KINDS[r], this.stopper.signal));
  }

  isSynced(): boolean {
    return this.listed.size === POLICY_RESOURCES.length;
  }

  /** Number of objects of each resource the engine holds. */
  counts(): Record<PolicyResource, number> {
    const n = (r: PolicyResource) => this.known.get(r)!.applied.size;
    return { namespaces: n('namespaces'), pods: n('pods'), networkpolicies: n('networkpolicies') };
  }

  /** Ends the loops; deltas still pending are delivered first. */
  async stop(): Promise<void> {
    this.stopper.abort();
    await Promise.all(this.loops);
    this.flush();
    if (!this.isSynced()) this.rejectSynced(new AbortedError());
  }

  private async run(kind: Kind, signal: AbortSignal): Promise<void> {
    const { client, logger } = this.opts;
    const say = rateLimited(logger, 30_000);
    const backoff = new Backoff(WATCH_RETRY_INITIAL_MS, WATCH_RETRY_MAX_MS);
    const op = `watch ${kind.resource}`;
    let rv: string | null = null;
    let openedAt = 0;
    let events = 0;
    // As the Node watcher: a watch that brought events, or ran a while (a clean end after 1 s),
    // was progress and restarts the backoff; one that fails at once keeps growing it.
    const progressed = (cleanEnd: boolean) => openedAt > 0 && (events > 0 || Date.now() - openedAt > (cleanEnd ? 1000 : 10_000));
    while (!signal.aborted) {
      try {
        if (rv === null) {
          const list = await client.listRaw(`list ${kind.resource}`, kind.path, kind.listKind, signal, true);
          this.reset(kind, list.items);
          rv = list.resourceVersion;
          this.markListed(kind.resource);
        }
        openedAt = 0;
        events = 0;
        const onEvent = (ev: RawWatchEvent) => {
          events++;
          if (ev.type === 'BOOKMARK') {
            if (!ev.resourceVersion) throw new KubeProtocolError(op, 'BOOKMARK without a resourceVersion');
            rv = ev.resourceVersion;
            return;
          }
          this.apply(kind, ev.type, ev.object);
          if (ev.resourceVersion) rv = ev.resourceVersion;
        };
        const end = await client.watchRaw(op, kind.path, rv, onEvent, signal, () => (openedAt = Date.now()));
        if (end === 'expired') {
          say('expired', 'info', `${kind.resource} watch expired (410); listing again`, { resourceVersion: rv });
          rv = null;
        }
        if (progressed(end === 'closed')) backoff.reset();
        else await backoff.wait(signal).catch(() => undefined);
      } catch (e) {
        if (signal.aborted) break;
        this.opts.onStoreError?.(kind.resource);
        if (progressed(false)) backoff.reset();
        openedAt = 0;
        const error = errorMessage(e);
        const level = e instanceof KubeApiError && e.code === 403 ? 'error' : 'warn';
        say(`watch ${error}`, level, `${kind.resource} list/watch failed; listing again`, { error });
        rv = null;
        await backoff.wait(signal).catch(() => undefined);
      }
    }
  }

  /** A full list: upsert what changed, delete what is gone (including objects that were invalid all along). */
  private reset(kind: Kind, items: readonly JsonObject[]): void {
    const known = this.known.get(kind.resource)!;
    const seen = new Set<string>();
    for (const item of items) {
      const id = identity(kind, item);
      if (id) seen.add(id.key);
      this.upsert(kind, known, item, id);
    }
    for (const key of [...known.applied.keys()]) if (!seen.has(key)) this.remove(kind, known, key);
    for (const map of [known.invalid, known.warned]) for (const key of [...map.keys()]) if (!seen.has(key)) map.delete(key);
    this.flush();
  }

  private apply(kind: Kind, type: 'ADDED' | 'MODIFIED' | 'DELETED', raw: Json): void {
    const known = this.known.get(kind.resource)!;
    const id = identity(kind, raw);
    if (!id) throw new KubeProtocolError(`watch ${kind.resource}`, `${type} event without metadata.name/namespace`);
    if (type === 'DELETED') this.remove(kind, known, id.key);
    else this.upsert(kind, known, raw as JsonObject, id);
  }

  private upsert(kind: Kind, known: Known, raw: JsonObject, id: { key: string; rv: string } | null): void {
    if (!id) {
      this.opts.logger.warn(`${kind.resource}: object without a usable name ignored`);
      return;
    }
    // Same version as the engine holds (a re-list): nothing to do.
    if (id.rv !== '' && known.applied.get(id.key) === id.rv) return;
    let applyTo: (engine: PolicyEngine) => PolicyDelta;
    try {
      applyTo = kind.parse(raw, (warnings) => {
        if (known.warned.get(id.key) === id.rv) return;
        known.warned.set(id.key, id.rv);
        this.opts.logger.warn(`${kind.resource}: accepted with warnings`, { object: id.key, resourceVersion: id.rv, warnings: warnings.join('; ') });
      });
    } catch (e) {
      if (known.invalid.get(id.key) !== id.rv) {
        known.invalid.set(id.key, id.rv);
        const keeping = known.applied.has(id.key);
        this.opts.logger.warn(
          keeping ? `${kind.resource}: invalid update ignored; keeping the last valid version` : `${kind.resource}: invalid object ignored`,
          { object: id.key, resourceVersion: id.rv, error: errorMessage(e) },
        );
      }
      return;
    }
    known.invalid.delete(id.key);
    // An engine error here is a bug, not input: it fails the watch, and the re-list tries again.
    const delta = applyTo(this.opts.engine);
    known.applied.set(id.key, id.rv);
    this.emit(delta);
  }

  private remove(kind: Kind, known: Known, key: string): void {
    known.invalid.delete(key);
    known.warned.delete(key);
    if (!known.applied.delete(key)) return;
    this.emit(kind.remove(this.opts.engine, key));
  }

  private emit(delta: PolicyDelta): void {
    if (isEmptyDelta(delta)) return;
    this.pending.push(delta);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => this.flush());
    }
  }

  /** Hands the deltas gathered so far to onDeltas now (also done on the next tick by itself). */
  flush(): void {
    this.flushScheduled = false;
    if (this.pending.length === 0) return;
    const batch = this.pending;
    this.pending = [];
    try {
      this.opts.onDeltas(batch);
    } catch (e) {
      // The listener's failure is its own to repair (its periodic compare); the source keeps going.
      this.opts.logger.error('network policy delta listener failed', { error: errorMessage(e) });
    }
  }

  private markListed(resource: PolicyResource): void {
    if (this.listed.has(resource)) return;
    this.listed.add(resource);
    this.opts.logger.info(`${resource} listed`, { count: this.known.get(resource)!.applied.size });
    if (this.isSynced()) this.resolveSynced();
  }
}
