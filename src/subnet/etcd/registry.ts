// The etcd side of the lease store (the Registry of contract.ts): flannel's keys and values under
// <prefix>, every write a transaction (create-if-absent, compare-and-swap on modRevision), never a
// blind put.
import { readFileSync } from 'node:fs';
import { ExponentialBackoff, type IBackoff } from 'cockatiel';
import { Etcd3, type IOptions, type IKeyValue, type Watcher } from 'etcd3';
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

export const DEFAULT_ETCD_PREFIX = '/coreos.com/network';
export const DEFAULT_ETCD_ENDPOINTS = ['http://127.0.0.1:4001', 'http://127.0.0.1:2379'];

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
}

/** The etcd connection flags do not make sense together; nothing was sent. */
export class EtcdOptionsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'EtcdOptionsError';
  }
}

/** Unary requests give up after this long (etcd3 retries 3 times); streams have no deadline. */
const REQUEST_DEADLINE_MS = 5000;
/** A watch that is not created within this time is stuck (see reconnect()). */
const WATCH_CREATE_TIMEOUT_MS = 10_000;

export class EtcdRegistry implements Registry {
  private current: Etcd3;
  private readonly subnetsPrefix: string;
  private readonly reported = new Set<string>();
  private reconnecting: Promise<void> | null = null;

  constructor(
    readonly opts: EtcdConnectOptions,
    private readonly logger: Logger,
  ) {
    this.subnetsPrefix = `${trimSlash(opts.prefix)}/subnets/`;
    this.current = new Etcd3(clientOptions(opts, logger));
  }

  get client(): Etcd3 {
    return this.current;
  }

  /**
   * Replaces the client. etcd3 1.1.2 refreshes an expired or invalidated auth token (etcd restart,
   * idle TTL) only for unary calls: a watch is refused with "invalid auth token" and, worse, every
   * later watch creation on that client hangs. A fresh client authenticates again.
   */
  private reconnect(reason: string): Promise<void> {
    this.reconnecting ??= Promise.resolve()
      .then(() => {
        this.logger.warn('reconnecting to etcd', { reason });
        const old = this.current;
        this.current = new Etcd3(clientOptions(this.opts, this.logger));
        retire(old);
      })
      .finally(() => (this.reconnecting = null));
    return this.reconnecting;
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
      const stream = await this.client.leaseClient.leaseKeepAlive();
      try {
        const res = await new Promise<{ TTL: string }>((resolve, reject) => {
          stream.on('data', resolve);
          stream.on('error', reject);
          stream.write({ ID: etcdLease });
        });
        return Number(res.TTL);
      } finally {
        stream.end();
      }
    });
  }

  async timeToLive(etcdLease: string): Promise<number> {
    const res = await this.call('lease time to live', () =>
      this.client.leaseClient.leaseTimeToLive({ ID: etcdLease }),
    );
    return Number(res.TTL);
  }

  async watchSubnets(fromRevision: string, handlers: SubnetWatchHandlers): Promise<RegistryWatch> {
    const w = await this.createWatch('watch leases', () =>
      this.client.watch().prefix(this.subnetsPrefix).startRevision(fromRevision).create(),
    );
    w.on('data', (res) => {
      const events = this.parseEvents(res.events);
      if (events.length > 0) handlers.onEvents(events);
    });
    w.on('disconnected', (err) => this.logger.debug('etcd watch disconnected', { error: err.message }));
    w.on('connected', () => this.logger.debug('etcd watch connected'));
    return this.ended(w, handlers.onError);
  }

  async watchKey(key: string, fromRevision: string, handlers: KeyWatchHandlers): Promise<RegistryWatch> {
    const w = await this.createWatch('watch lease', () => this.client.watch().key(key).startRevision(fromRevision).create());
    w.on('delete', () => handlers.onChange(null));
    w.on('put', (kv) => handlers.onChange(kv.lease));
    return this.ended(w, handlers.onError);
  }

  /**
   * The watch's end by the server (compaction, refused credentials): etcd3 has dropped the watcher
   * already, so it is only released here. A refused token needs a fresh client before the caller's
   * next watch.
   */
  private ended(w: Watcher, onError: (err: Error) => void): RegistryWatch {
    w.on('error', (err) => {
      void cancelWatcher(w);
      const again = isAuthError(err) ? this.reconnect(err.message) : Promise.resolve();
      void again.then(() => onError(err));
    });
    return { cancel: () => cancelWatcher(w) };
  }

  /** A watch creation that hangs means a wedged client: replace it and let the caller retry. */
  private async createWatch(op: string, create: () => Promise<Watcher>): Promise<Watcher> {
    let timer: NodeJS.Timeout | undefined;
    const pending = create();
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${WATCH_CREATE_TIMEOUT_MS} ms`)), WATCH_CREATE_TIMEOUT_MS);
    });
    try {
      return await this.call(op, () => Promise.race([pending, timeout]));
    } catch (e) {
      pending.then((w) => void cancelWatcher(w), () => undefined);
      await this.reconnect(`${op}: ${errorMessage(e)}`);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Turns watch events into lease events; what does not parse is reported once and skipped. */
  private parseEvents(events: ReadonlyArray<{ type: string; kv: IKeyValue }>): RawLeaseEvent[] {
    const out: RawLeaseEvent[] = [];
    for (const ev of events) {
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
    await this.reconnecting;
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

/**
 * Cancels a watcher without hanging: etcd3 waits for an 'end' that never comes when the server
 * has already cancelled the watch (compaction), so give up waiting after a second.
 */
async function cancelWatcher(w: Watcher): Promise<void> {
  w.removeAllListeners();
  w.on('error', () => undefined);
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    w.cancel().catch(() => undefined),
    new Promise<void>((resolve) => (timer = setTimeout(resolve, 1000))),
  ]);
  clearTimeout(timer);
}

/** Whether a watch error means the client must authenticate again. */
function isAuthError(err: Error): boolean {
  return /invalid auth token|Unauthenticated|auth token is expired/i.test(err.message);
}

function trimSlash(p: string): string {
  return p.replace(/\/+$/, '');
}

/**
 * Closes a client for good. etcd3 keeps trying to re-establish watchers that were refused at
 * creation even after close(), which would keep the process alive: drop them first.
 */
function retire(client: Etcd3): void {
  const wm = (client as unknown as { watchManager?: { watchers?: unknown[] } }).watchManager;
  if (wm && Array.isArray(wm.watchers)) wm.watchers = [];
  client.close();
}

function clientOptions(opts: EtcdConnectOptions, logger: Logger): IOptions {
  if (Boolean(opts.certFile) !== Boolean(opts.keyFile)) {
    throw new EtcdOptionsError(
      `--etcd-certfile and --etcd-keyfile go together (got ${opts.certFile ? 'a cert file without a key file' : 'a key file without a cert file'})`,
    );
  }
  // Unary calls get a deadline so a silent endpoint fails instead of hanging; streams do not.
  const callOptions = (ctx: { isStream: boolean }) =>
    ctx.isStream ? {} : { deadline: Date.now() + REQUEST_DEADLINE_MS };
  const o: IOptions = {
    hosts: [...opts.endpoints],
    defaultCallOptions: callOptions,
    ...(opts.grpcOptions ? { grpcOptions: opts.grpcOptions } : {}),
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
  } else if (opts.endpoints.some((e) => e.startsWith('https:'))) {
    logger.warn('https etcd endpoint without --etcd-cafile: using the system CA store');
  }
  if (opts.username) o.auth = { username: opts.username, password: opts.password ?? '', callOptions };
  return o;
}
