// The etcd side of the lease store (the Registry of contract.ts): flannel's keys and values under
// <prefix>, every write a transaction (create-if-absent, compare-and-swap on modRevision), never a
// blind put.
import { readFileSync } from 'node:fs';
import { InterceptingCall, type Interceptor } from '@grpc/grpc-js';
import { ExponentialBackoff, type IBackoff } from 'cockatiel';
import { Etcd3, Range, type IEvent, type ILeaseKeepAliveResponse, type IOptions, type IKeyValue } from 'etcd3';
import { errorMessage } from '../../util/errors.js';
import type { Logger } from '../../util/log.js';
import type { IPNet } from '../../util/ip.js';
import { decodeLeaseAttrs, encodeLeaseAttrs, makeSubnetKey, parseSubnetKey } from '../codec.js';
import type { Lease, LeaseAttrs } from '../lease.js';
import { StoreUnavailableError } from '../manager.js';
import type { RawLeaseEvent } from '../watcher.js';
import {
  createdLease,
  type CreateRequest,
  type KeyWatchHandlers,
  type Listing,
  type Registry,
  type RegistryWatch,
  type StoredLease,
  type SubnetWatchHandlers,
} from './contract.js';
import { DEFAULT_LIVENESS, EndpointRotation, KEY_WATCH_LIVENESS, type LivenessTimings } from './watch-liveness.js';
import { LivelyWatch, type WatchConnection } from './watch-stream.js';

export { DEFAULT_ETCD_ENDPOINTS, DEFAULT_ETCD_PREFIX } from './defaults.js';

export interface EtcdConnectOptions {
  readonly endpoints: readonly string[];
  readonly prefix: string;
  readonly caFile?: string;
  readonly certFile?: string;
  readonly keyFile?: string;
  readonly username?: string;
  readonly password?: string;
  /** gRPC channel options (e.g. a distinct key to force a connection of one's own). */
  readonly grpcOptions?: IOptions['grpcOptions'];
  /** When a quiet watch is probed and declared dead, for both watches (tests shorten them). */
  readonly watchLiveness?: LivenessTimings;
}

/** The etcd connection flags do not make sense together; nothing was sent. */
export class EtcdOptionsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'EtcdOptionsError';
  }
}

/**
 * Unary requests give up after this long (etcd3 retries 3 times, each on a host picked at random
 * among those whose circuit breaker is closed); so does each lease keepalive exchange.
 */
const REQUEST_DEADLINE_MS = 5000;
/** A watch stream not created within this time is given up for the next endpoint. */
const WATCH_CREATE_TIMEOUT_MS = 5000;
/** Keepalive exchanges tried before a renewal fails, each with the next member in turn. */
const KEEPALIVE_ATTEMPTS = 3;

/**
 * HTTP/2 keepalive on every channel, the backstop for a member that goes silent under a stream
 * (the watches also probe, see watch-stream.ts): a ping every 10 s while calls are open, the
 * connection closed when one is not acknowledged within 5 s. etcd 3.4 answers pings more
 * frequent than --grpc-keepalive-min-time (5 s), or any ping while no stream is open, with
 * GOAWAY "too_many_pings", hence 10 s and no pings without calls.
 */
export const KEEPALIVE_GRPC_OPTIONS = {
  'grpc.keepalive_time_ms': 10_000,
  'grpc.keepalive_timeout_ms': 5000,
  'grpc.keepalive_permit_without_calls': 0,
} as const;

/**
 * etcd's "require leader" metadata (clientv3.WithRequireLeader): a member that has lost its
 * leader refuses the watch, and cancels it after three election timeouts without one, instead
 * of serving a watch that no longer sees the cluster's writes.
 */
export const requireLeader: Interceptor = (options, nextCall) =>
  new InterceptingCall(nextCall(options), {
    start(metadata, listener, next) {
      const md = metadata.clone();
      md.set('hasleader', 'true');
      next(md, listener);
    },
  });

export class EtcdRegistry implements Registry {
  private current: Etcd3;
  private readonly subnetsPrefix: string;
  private readonly reported = new Set<string>();
  /**
   * Where the next watch stream or lease keepalive goes: shared, so each avoids a member that
   * failed any of them lately.
   */
  private readonly rotation: EndpointRotation;
  private readonly watches = new Set<LivelyWatch>();
  /** Distinguishes each watch connection's channel options: a new one never reuses a dead one's HTTP/2 connection. */
  private watchConnections = 0;

  constructor(
    readonly opts: EtcdConnectOptions,
    private readonly logger: Logger,
  ) {
    this.subnetsPrefix = `${trimSlash(opts.prefix)}/subnets/`;
    this.current = new Etcd3(etcdClientOptions(opts, logger));
    // Members are taken in turn from a random one, spreading the nodes' watches over the cluster.
    this.rotation = new EndpointRotation(opts.endpoints, Math.floor(Math.random() * opts.endpoints.length));
  }

  get client(): Etcd3 {
    return this.current;
  }

  get configKey(): string {
    return `${trimSlash(this.opts.prefix)}/config`;
  }

  keyOf(subnet: IPNet, ipv6Subnet: IPNet | null): string {
    return this.subnetsPrefix + makeSubnetKey(subnet, ipv6Subnet);
  }

  async getConfig(): Promise<string | null> {
    return this.call('get config', () => this.client.get(this.configKey).string());
  }

  async list(): Promise<Listing> {
    const res = await this.call('list leases', () => this.client.getAll().prefix(this.subnetsPrefix).exec());
    const revision = res.header.revision;
    const leases: StoredLease[] = [];
    for (const kv of res.kvs) {
      const stored = this.parseKv(kv, revision);
      if (stored) leases.push(stored);
    }
    return { leases, revision };
  }

  async create(req: CreateRequest): Promise<StoredLease | null> {
    const { etcdLease, replaces } = req;
    const key = this.keyOf(req.subnet, req.ipv6Subnet);
    const value = encodeLeaseAttrs(req.attrs);
    const put = this.client.put(key).value(value);
    if (etcdLease !== '0') put.lease(etcdLease);
    const txn = this.client.if(key, 'Create', '==', 0);
    const ops = [put];
    if (replaces && replaces.key !== key) {
      txn.and(replaces.key, 'Mod', '==', replaces.modRevision);
      ops.push(this.client.delete().key(replaces.key) as never);
    }
    const res = await this.call('create lease', () => txn.then(...ops).commit());
    if (!res.succeeded) return null;
    return { lease: createdLease(req), key, modRevision: res.header.revision, etcdLease, revision: res.header.revision };
  }

  async reuse(stored: StoredLease, attrs: LeaseAttrs): Promise<StoredLease | null> {
    let expiration: Date | null = null;
    if (stored.etcdLease !== '0') {
      const ttl = await this.keepAlive(stored.etcdLease);
      if (ttl <= 0) return null;
      expiration = new Date(Date.now() + ttl * 1000);
    }
    const value = encodeLeaseAttrs(attrs);
    let { modRevision, revision } = stored;
    if (value !== encodeLeaseAttrs(stored.lease.attrs)) {
      const put = this.client.put(stored.key).value(value);
      if (stored.etcdLease !== '0') put.lease(stored.etcdLease);
      const res = await this.call('update lease', () =>
        this.client.if(stored.key, 'Mod', '==', stored.modRevision).then(put).commit(),
      );
      if (!res.succeeded) return null;
      modRevision = revision = res.header.revision;
    }
    return { ...stored, modRevision, revision, lease: { ...stored.lease, attrs, expiration } };
  }

  /** Deletes the key if unchanged since read. */
  async remove(stored: StoredLease): Promise<boolean> {
    const res = await this.call('delete lease', () =>
      this.client.if(stored.key, 'Mod', '==', stored.modRevision).then(this.client.delete().key(stored.key)).commit(),
    );
    return res.succeeded;
  }

  async grant(ttlSeconds: number): Promise<string> {
    const res = await this.call('grant lease', () => this.client.leaseClient.leaseGrant({ TTL: ttlSeconds, ID: 0 }));
    return res.ID;
  }

  async revoke(etcdLease: string): Promise<void> {
    await this.call('revoke lease', () => this.client.leaseClient.leaseRevoke({ ID: etcdLease }));
  }

  async keepAlive(etcdLease: string): Promise<number> {
    return this.call('renew lease', async () => {
      let last: unknown = null;
      for (let i = 0; i < KEEPALIVE_ATTEMPTS; i++) {
        const endpoint = this.rotation.pick(Date.now());
        try {
          return await this.keepAliveOnce(etcdLease, endpoint);
        } catch (e) {
          last = e;
          this.rotation.suspect(endpoint, Date.now());
          this.logger.debug('lease keepalive failed', { endpoint, attempt: i + 1, error: errorMessage(e) });
        }
      }
      throw last;
    });
  }

  /**
   * One keepalive exchange with `endpoint`, on a client of its own: etcd3's pool would pick a
   * member at random, possibly the one that just failed; here each attempt goes to the next
   * member not known to fail (the watches' rotation). The stream has the unary deadline: without
   * it a member that went silent would hold the renewal until TCP gives up. A fresh client also
   * authenticates afresh (etcd3 refreshes a stale token only for unary calls).
   */
  private async keepAliveOnce(etcdLease: string, endpoint: string): Promise<number> {
    const client = new Etcd3(etcdClientOptions({ ...this.opts, endpoints: [endpoint] }, this.logger, { quiet: true }));
    try {
      const stream = await client.leaseClient.leaseKeepAlive({ deadline: Date.now() + REQUEST_DEADLINE_MS });
      try {
        const res = await new Promise<ILeaseKeepAliveResponse>((resolve, reject) => {
          stream.on('data', resolve);
          stream.on('error', reject);
          stream.on('end', () => reject(new Error('etcd ended the keepalive stream without an answer')));
          stream.write({ ID: etcdLease });
        });
        const ttl = typeof res.TTL === 'string' && /^-?\d+$/.test(res.TTL) ? Number(res.TTL) : NaN;
        if (!Number.isSafeInteger(ttl)) throw new Error(`etcd answered the keepalive of lease ${etcdLease} with TTL ${JSON.stringify(res.TTL)}`);
        return ttl;
      } finally {
        // The listeners stay: the deadline may still fire after an answer, into a settled promise.
        stream.end();
      }
    } finally {
      retire(client);
    }
  }

  async timeToLive(etcdLease: string): Promise<number> {
    const res = await this.call('lease time to live', () =>
      this.client.leaseClient.leaseTimeToLive({ ID: etcdLease }),
    );
    return Number(res.TTL);
  }

  async watchSubnets(fromRevision: string, handlers: SubnetWatchHandlers): Promise<RegistryWatch> {
    const range = Range.prefix(this.subnetsPrefix);
    return this.watch('watch leases', 'leases', range.start, range.end, fromRevision, this.opts.watchLiveness ?? DEFAULT_LIVENESS, {
      onEvents: (events) => {
        const parsed = this.parseEvents(events);
        if (parsed.length > 0) handlers.onEvents(parsed);
      },
      onError: handlers.onError,
    });
  }

  async watchKey(key: string, fromRevision: string, handlers: KeyWatchHandlers): Promise<RegistryWatch> {
    return this.watch('watch lease', key, Buffer.from(key), undefined, fromRevision, this.opts.watchLiveness ?? KEY_WATCH_LIVENESS, {
      onEvents: (events) => {
        for (const ev of events) {
          if (ev.type === 'Delete') handlers.onChange(null);
          else if (typeof ev.kv?.lease === 'string') handlers.onChange(ev.kv.lease);
        }
      },
      onError: handlers.onError,
    });
  }

  /**
   * A watch on a stream and client of its own (watch-stream.ts): probed when quiet, moved to
   * another member when its member stops answering, resumed after the last event delivered.
   * Every connection is a new client, so it authenticates afresh: etcd3 1.1.2 refreshes an
   * expired or invalidated token (etcd restart, idle TTL) only for unary calls.
   */
  private async watch(
    op: string,
    what: string,
    key: Buffer,
    rangeEnd: Buffer | undefined,
    fromRevision: string,
    timings: LivenessTimings,
    handlers: { onEvents: (events: IEvent[]) => void; onError: (err: Error) => void },
  ): Promise<RegistryWatch> {
    const w: LivelyWatch = new LivelyWatch({
      what,
      key,
      ...(rangeEnd ? { rangeEnd } : {}),
      fromRevision,
      connect: (endpoint) => this.connectWatch(endpoint),
      rotation: this.rotation,
      endpointCount: this.opts.endpoints.length,
      logger: this.logger,
      createTimeoutMs: WATCH_CREATE_TIMEOUT_MS,
      timings,
      onEvents: handlers.onEvents,
      onError: (err) => {
        this.watches.delete(w);
        handlers.onError(err);
      },
    });
    this.watches.add(w);
    try {
      await this.call(op, () => w.start());
    } catch (e) {
      this.watches.delete(w);
      await w.cancel();
      throw e;
    }
    return {
      cancel: () => {
        this.watches.delete(w);
        return w.cancel();
      },
    };
  }

  /** A watch stream to one endpoint, on a client (and HTTP/2 connection) of its own. */
  private async connectWatch(endpoint: string): Promise<WatchConnection> {
    const grpcOptions = { ...this.opts.grpcOptions, 'weft.watch-connection': ++this.watchConnections };
    const client = new Etcd3(etcdClientOptions({ ...this.opts, endpoints: [endpoint], grpcOptions }, this.logger, { quiet: true }));
    try {
      const stream = await client.watchClient.watch({ interceptors: [requireLeader] });
      return { stream, close: () => retire(client) };
    } catch (e) {
      retire(client);
      throw e;
    }
  }

  /** Turns watch events into lease events; what does not parse is reported once and skipped. */
  private parseEvents(events: readonly IEvent[]): RawLeaseEvent[] {
    const out: RawLeaseEvent[] = [];
    for (const ev of events) {
      if (!ev?.kv || !Buffer.isBuffer(ev.kv.key)) continue;
      if (ev.type === 'Delete') {
        const keyText = ev.kv.key.toString();
        const sub = this.parseKey(keyText);
        if (sub) out.push({ type: 'removed', lease: sub });
      } else {
        const stored = this.parseKv(ev.kv, ev.kv.mod_revision);
        if (stored) out.push({ type: 'added', lease: stored.lease });
      }
    }
    return out;
  }

  async close(): Promise<void> {
    await Promise.all([...this.watches].map((w) => w.cancel()));
    this.watches.clear();
    retire(this.current);
  }

  private parseKey(keyText: string): Pick<Lease, 'subnet' | 'ipv6Subnet'> | null {
    if (!keyText.startsWith(this.subnetsPrefix)) return null;
    try {
      return parseSubnetKey(keyText.slice(this.subnetsPrefix.length));
    } catch (e) {
      this.reportOnce(keyText, '', e);
      return null;
    }
  }

  private parseKv(kv: IKeyValue, revision: string): StoredLease | null {
    const key = kv.key.toString();
    const sub = this.parseKey(key);
    if (!sub) return null;
    const value = kv.value.toString();
    try {
      const attrs = decodeLeaseAttrs(value);
      const reservation = kv.lease === '0';
      const lease: Lease = { ...sub, attrs, reservation, expiration: null, ...(/^\d+$/.test(kv.create_revision) ? { claimedAt: BigInt(kv.create_revision) } : {}) };
      return { lease, key, modRevision: kv.mod_revision, etcdLease: kv.lease, revision };
    } catch (e) {
      this.reportOnce(key, value, e);
      return null;
    }
  }

  /** A value written by someone else that we cannot read: say so once, never treat it as a removal. */
  private reportOnce(key: string, value: string, err: unknown): void {
    const id = `${key}\u0000${value}`;
    if (this.reported.has(id)) return;
    this.reported.add(id);
    this.logger.warn('skipping unparsable lease entry', { key, error: errorMessage(err) });
  }

  private async call<T>(op: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      throw new StoreUnavailableError(`etcd ${op} (${this.opts.endpoints.join(',')})`, e);
    }
  }
}

function trimSlash(p: string): string {
  return p.replace(/\/+$/, '');
}

/**
 * Closes a client for good. etcd3 keeps trying to re-establish watchers that were refused at
 * creation even after close(), which would keep the process alive: drop them first (weft's own
 * watches do not use etcd3's watchers; a caller of `client` might).
 */
function retire(client: Etcd3): void {
  const wm = (client as unknown as { watchManager?: { watchers?: unknown[] } }).watchManager;
  if (wm && Array.isArray(wm.watchers)) wm.watchers = [];
  client.close();
}

export function etcdClientOptions(opts: EtcdConnectOptions, logger: Logger, { quiet = false } = {}): IOptions {
  if (Boolean(opts.certFile) !== Boolean(opts.keyFile)) {
    throw new EtcdOptionsError(
      `--etcd-certfile and --etcd-keyfile go together (got ${opts.certFile ? 'a cert file without a key file' : 'a key file without a cert file'})`,
    );
  }
  // Unary calls get a deadline so a silent endpoint fails instead of hanging. Streams get none
  // here: a keepalive exchange sets its own, a watch is probed (watch-stream.ts).
  const callOptions = (ctx: { isStream: boolean }) =>
    ctx.isStream ? {} : { deadline: Date.now() + REQUEST_DEADLINE_MS };
  const o: IOptions = {
    hosts: [...opts.endpoints],
    defaultCallOptions: callOptions,
    grpcOptions: { ...KEEPALIVE_GRPC_OPTIONS, ...opts.grpcOptions },
    // flannel's watch reconnect backoff: 100 ms doubling up to 5 s.
    // etcd3 types this as IBackoff but calls .next() on it first, as on its own default factory.
    faultHandling: {
      watchBackoff: new ExponentialBackoff({ initialDelay: 100, maxDelay: 5000 }) as unknown as IBackoff<unknown>,
    },
  };
  if (opts.certFile && opts.keyFile) {
    o.credentials = {
      // grpc-js takes null for "the system CA store"; etcd3's type says Buffer.
      rootCertificate: opts.caFile ? readFileSync(opts.caFile) : (null as unknown as Buffer),
      privateKey: readFileSync(opts.keyFile),
      certChain: readFileSync(opts.certFile),
    };
  } else if (opts.caFile) {
    o.credentials = { rootCertificate: readFileSync(opts.caFile) };
  } else if (!quiet && opts.endpoints.some((e) => e.startsWith('https:'))) {
    logger.warn('https etcd endpoint without --etcd-cafile: using the system CA store');
  }
  if (opts.username) o.auth = { username: opts.username, password: opts.password ?? '', callOptions };
  return o;
}
