// A thin Kubernetes API client for the few calls the kube lease manager makes (get/list/watch Nodes,
// patch nodes/NAME/status, get a Pod), and the raw list/watch the NetworkPolicy source uses for
// Namespaces, Pods and NetworkPolicies. Authentication and TLS come from @kubernetes/client-node's
// KubeConfig; requests are plain node:http(s) so the patch body goes out byte for byte as built,
// objects stay raw JSON (the generated client turns condition times into Dates and drops fields),
// and a broken watch is told apart from a clean end.
import { request as httpRequest, type IncomingMessage, type RequestOptions } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { KubeConfig, type Cluster } from '@kubernetes/client-node';
import { errorMessage } from '../../util/errors.js';
import type { NodePatch } from './node.js';
import type { KubeNode, NodeCondition } from './objects.js';

export interface KubeConnectOptions {
  /** --kubeconfig-file */
  readonly kubeconfigFile?: string;
  /** --kube-api-url: overrides the kubeconfig's server, or alone names an API server without credentials. */
  readonly apiUrl?: string;
  /** A ready KubeConfig (tests); wins over the other two. */
  readonly kubeConfig?: KubeConfig;
}

/**
 * client-go's BuildConfigFromFlags: neither file nor URL → the pod's service account; a file →
 * that kubeconfig, its server replaced by `apiUrl` when given; only a URL → that server, no
 * credentials (plain http is allowed there, as client-go allows it).
 */
export function loadKubeConfig(opts: KubeConnectOptions): KubeConfig {
  if (opts.kubeConfig) return opts.kubeConfig;
  const kc = new KubeConfig();
  if (opts.kubeconfigFile) {
    kc.loadFromFile(opts.kubeconfigFile);
    if (opts.apiUrl) {
      const current = kc.getCurrentCluster();
      if (!current) throw new KubeConfigError(`kubeconfig ${opts.kubeconfigFile} has no current cluster`);
      const server = opts.apiUrl;
      const replaced: Cluster = { ...current, server, skipTLSVerify: current.skipTLSVerify || isHttp(server) };
      kc.loadFromOptions({
        clusters: kc.clusters.map((c) => (c.name === current.name ? replaced : c)),
        users: kc.users,
        contexts: kc.contexts,
        currentContext: kc.currentContext,
      });
    }
    return kc;
  }
  if (opts.apiUrl) {
    kc.loadFromClusterAndUser(
      { name: 'weft', server: opts.apiUrl, skipTLSVerify: isHttp(opts.apiUrl) },
      { name: 'weft' },
    );
    return kc;
  }
  if (!process.env.KUBERNETES_SERVICE_HOST || !process.env.KUBERNETES_SERVICE_PORT) {
    throw new KubeConfigError(
      'no --kubeconfig-file or --kube-api-url given and not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset)',
    );
  }
  kc.loadFromCluster();
  return kc;
}

function isHttp(url: string): boolean {
  return url.startsWith('http:');
}

export class KubeConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'KubeConfigError';
  }
}

/** The API server answered with an error status; `reason` and `message` come from its Status body. */
export class KubeApiError extends Error {
  constructor(
    readonly op: string,
    readonly code: number,
    readonly reason: string,
    readonly apiMessage: string,
  ) {
    super(`${op}: ${code} ${reason}${apiMessage ? `: ${apiMessage}` : ''}`);
    this.name = 'KubeApiError';
  }
}

/** The request never got an answer (connection refused, reset, timeout). */
export class KubeConnectionError extends Error {
  constructor(
    readonly op: string,
    cause: unknown,
  ) {
    super(`${op}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = 'KubeConnectionError';
  }
}

/** The server sent something that is not the object the API promises. */
export class KubeProtocolError extends Error {
  constructor(
    readonly op: string,
    message: string,
  ) {
    super(`${op}: ${message}`);
    this.name = 'KubeProtocolError';
  }
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK';

export interface NodeWatchEvent {
  readonly type: WatchEventType;
  readonly node: KubeNode;
}

/** How a watch ended without a transport error. */
export type WatchEnd = 'closed' | 'expired';

export interface NodeList {
  readonly items: KubeNode[];
  readonly resourceVersion: string;
}

export interface KubeClientOptions {
  /** Per request, watches excluded. Default 30 s. */
  readonly requestTimeoutMs?: number;
  /** Items per list page (client-go's pager uses 500). */
  readonly pageSize?: number;
}

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** One event of a watchRaw: the object as sent (for BOOKMARK, only its resourceVersion means anything). */
export interface RawWatchEvent {
  readonly type: WatchEventType;
  readonly object: Json;
  /** metadata.resourceVersion of the object ('' when it has none). */
  readonly resourceVersion: string;
}

export interface RawList {
  readonly items: JsonObject[];
  readonly resourceVersion: string;
}

export class KubeClient {
  private readonly timeoutMs: number;
  private readonly pageSize: number;

  constructor(
    readonly kubeConfig: KubeConfig,
    opts: KubeClientOptions = {},
  ) {
    this.timeoutMs = opts.requestTimeoutMs ?? 30_000;
    this.pageSize = opts.pageSize ?? 500;
  }

  get server(): string {
    const cluster = this.kubeConfig.getCurrentCluster();
    if (!cluster) throw new KubeConfigError('kubeconfig has no current cluster');
    return cluster.server.replace(/\/+$/, '');
  }

  async getNode(name: string, signal?: AbortSignal): Promise<KubeNode> {
    const op = `get node ${name}`;
    return asKubeNode(op, await this.call(op, 'GET', `/api/v1/nodes/${encodeURIComponent(name)}`, signal));
  }

  async patchNodeStatus(patch: NodePatch, signal?: AbortSignal): Promise<KubeNode> {
    const op = `patch node ${patch.node} status`;
    const path = `/api/v1/nodes/${encodeURIComponent(patch.node)}/${patch.subresource}`;
    return asKubeNode(op, await this.call(op, 'PATCH', path, signal, { contentType: patch.contentType, body: patch.body }));
  }

  /** Every node, page by page at one resourceVersion (a page token that expired fails with 410). */
  async listNodes(signal?: AbortSignal): Promise<NodeList> {
    const op = 'list nodes';
    const list = await this.listRaw(op, '/api/v1/nodes', 'NodeList', signal);
    return { items: list.items.map((item) => asKubeNode(op, item)), resourceVersion: list.resourceVersion };
  }

  /**
   * Every object of a collection (`path`, e.g. /api/v1/pods), page by page at one resourceVersion,
   * as raw JSON objects: callers parse and validate them one by one, so one bad object does not
   * fail the list. A page token that expired fails with 410, unless `fullListIfExpired`: then, as
   * client-go's pager does, the list starts again in one piece (no limit), which a server whose
   * history is being compacted still serves.
   */
  async listRaw(op: string, path: string, kind: string, signal?: AbortSignal, fullListIfExpired = false): Promise<RawList> {
    const items: JsonObject[] = [];
    let cont = '';
    let paged = true;
    for (;;) {
      const q = new URLSearchParams(paged ? { limit: String(this.pageSize) } : {});
      if (cont) q.set('continue', cont);
      let list: JsonObject;
      try {
        list = await this.call(op, 'GET', `${path}?${q.toString()}`, signal);
      } catch (e) {
        if (!(fullListIfExpired && cont && e instanceof KubeApiError && e.code === 410)) throw e;
        items.length = 0;
        cont = '';
        paged = false;
        continue;
      }
      const meta = isObject(list.metadata) ? list.metadata : {};
      if (!Array.isArray(list.items) || typeof meta.resourceVersion !== 'string') {
        throw new KubeProtocolError(op, `not a ${kind}`);
      }
      for (const item of list.items) {
        if (!isObject(item)) throw new KubeProtocolError(op, `${kind} item is not an object`);
        items.push(item);
      }
      cont = typeof meta.continue === 'string' ? meta.continue : '';
      if (!cont) return { items, resourceVersion: meta.resourceVersion };
    }
  }

  /** The pod's spec.nodeName ("" when unscheduled). */
  async getPodNodeName(namespace: string, name: string, signal?: AbortSignal): Promise<string> {
    const op = `get pod ${namespace}/${name}`;
    const pod = await this.call(op, 'GET', `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`, signal);
    const spec = isObject(pod.spec) ? pod.spec : {};
    return typeof spec.nodeName === 'string' ? spec.nodeName : '';
  }

  /**
   * Watches Nodes from `resourceVersion` with bookmarks, calling `onEvent` for each event in
   * order. Resolves 'closed' when the server ends the stream (its timeout: re-watch from the last
   * resourceVersion seen), 'expired' on 410 (list again); rejects on a broken stream or any other
   * error. `onOpen` runs once the server accepted the watch.
   */
  async watchNodes(
    resourceVersion: string,
    onEvent: (ev: NodeWatchEvent) => void,
    signal: AbortSignal,
    onOpen?: () => void,
  ): Promise<WatchEnd> {
    const op = 'watch nodes';
    return this.watchRaw(
      op,
      '/api/v1/nodes',
      resourceVersion,
      (ev) => onEvent({ type: ev.type, node: ev.type === 'BOOKMARK' ? asBookmark(op, ev.object) : asKubeNode(op, ev.object) }),
      signal,
      onOpen,
    );
  }

  /**
   * watchNodes for any collection (`path`, e.g. /apis/networking.k8s.io/v1/networkpolicies), with
   * raw objects. A BOOKMARK's `resourceVersion` is checked to be there; an exception thrown by
   * `onEvent` ends the watch with that error.
   */
  async watchRaw(
    op: string,
    path: string,
    resourceVersion: string,
    onEvent: (ev: RawWatchEvent) => void,
    signal: AbortSignal,
    onOpen?: () => void,
  ): Promise<WatchEnd> {
    // As client-go: a server-side timeout of 5–10 min spreads re-watches of many nodes over time.
    const timeoutSeconds = 300 + Math.floor(Math.random() * 300);
    const q = new URLSearchParams({
      watch: 'true',
      resourceVersion,
      allowWatchBookmarks: 'true',
      timeoutSeconds: String(timeoutSeconds),
    });
    const res = await this.open(op, 'GET', `${path}?${q.toString()}`, signal, undefined, (timeoutSeconds + 30) * 1000);
    if (res.statusCode !== 200) {
      const err = await errorFromResponse(op, res);
      if (err.code === 410) return 'expired';
      throw err;
    }
    onOpen?.();
    return new Promise<WatchEnd>((resolve, reject) => {
      let buf = '';
      let settled = false;
      const onAbort = () => finish(new KubeConnectionError(op, new Error('aborted')));
      signal.addEventListener('abort', onAbort, { once: true });
      const finish = (end: WatchEnd | Error) => {
        if (settled) return;
        settled = true;
        signal.removeEventListener('abort', onAbort);
        res.destroy();
        if (end instanceof Error) reject(end);
        else resolve(end);
      };
      const line = (text: string) => {
        if (text.trim() === '') return;
        let ev: Json;
        try {
          ev = JSON.parse(text) as Json;
        } catch {
          throw new KubeProtocolError(op, `watch event is not JSON: ${text.slice(0, 200)}`);
        }
        if (!isObject(ev) || typeof ev.type !== 'string') throw new KubeProtocolError(op, 'watch event without a type');
        if (ev.type === 'ERROR') {
          const st = isObject(ev.object) ? ev.object : {};
          const code = typeof st.code === 'number' ? st.code : 0;
          if (code === 410) return finish('expired');
          throw new KubeApiError(op, code, str(st.reason), str(st.message));
        }
        if (ev.type !== 'ADDED' && ev.type !== 'MODIFIED' && ev.type !== 'DELETED' && ev.type !== 'BOOKMARK') {
          throw new KubeProtocolError(op, `unknown watch event type ${ev.type}`);
        }
        const object = ev.object ?? null;
        const meta = isObject(object) && isObject(object.metadata) ? object.metadata : null;
        const rv = meta && typeof meta.resourceVersion === 'string' ? meta.resourceVersion : '';
        onEvent({ type: ev.type, object, resourceVersion: rv });
      };
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let nl: number;
        try {
          while (!settled && (nl = buf.indexOf('\n')) >= 0) {
            const text = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            line(text);
          }
        } catch (e) {
          finish(e instanceof Error ? e : new Error(String(e)));
        }
      });
      res.on('end', () => {
        try {
          if (!settled) line(buf);
          finish('closed');
        } catch (e) {
          finish(e instanceof Error ? e : new Error(String(e)));
        }
      });
      // A destroyed socket ends the response with 'aborted'/'error' and no 'end'.
      res.on('error', (e) => finish(new KubeConnectionError(op, e)));
      res.on('close', () => finish(new KubeConnectionError(op, new Error(signal.aborted ? 'aborted' : 'watch stream broken'))));
      if (signal.aborted) onAbort();
    });
  }

  private async call(
    op: string,
    method: string,
    path: string,
    signal: AbortSignal | undefined,
    body?: { contentType: string; body: string },
  ): Promise<JsonObject> {
    const res = await this.open(op, method, path, signal, body, this.timeoutMs);
    if (res.statusCode !== 200 && res.statusCode !== 201) throw await errorFromResponse(op, res);
    const text = await readBody(op, res);
    let parsed: Json;
    try {
      parsed = JSON.parse(text) as Json;
    } catch {
      throw new KubeProtocolError(op, `response is not JSON: ${text.slice(0, 200)}`);
    }
    if (!isObject(parsed)) throw new KubeProtocolError(op, 'response is not a JSON object');
    return parsed;
  }

  /** Sends a request with the kubeconfig's credentials and TLS settings; resolves with the response head. */
  private async open(
    op: string,
    method: string,
    path: string,
    signal: AbortSignal | undefined,
    body: { contentType: string; body: string } | undefined,
    timeoutMs: number,
  ): Promise<IncomingMessage> {
    if (signal?.aborted) throw new KubeConnectionError(op, new Error('aborted'));
    const url = new URL(this.server + path);
    const opts: RequestOptions = { method, headers: {} };
    try {
      await this.kubeConfig.applyToHTTPSOptions(opts);
    } catch (e) {
      throw new KubeConfigError(`${op}: credentials: ${errorMessage(e)}`);
    }
    const headers: Record<string, string> = {};
    if (opts.headers && !Array.isArray(opts.headers)) {
      for (const [k, v] of Object.entries(opts.headers)) if (v !== undefined) headers[k.toLowerCase()] = String(v);
    }
    headers.accept = 'application/json';
    headers['user-agent'] = 'weft';
    if (opts.auth) {
      headers.authorization = `Basic ${Buffer.from(opts.auth).toString('base64')}`;
      delete opts.auth;
    }
    if (body) {
      headers['content-type'] = body.contentType;
      headers['content-length'] = String(Buffer.byteLength(body.body));
    }
    opts.headers = headers;
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    return new Promise<IncomingMessage>((resolve, reject) => {
      const req = send(url, opts);
      const timer = setTimeout(() => req.destroy(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      const onAbort = () => req.destroy(new Error('aborted'));
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('close', () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      });
      req.on('error', (e) => reject(new KubeConnectionError(op, e)));
      req.on('response', resolve);
      req.end(body?.body);
    });
  }
}

async function readBody(op: string, res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  try {
    for await (const c of res) chunks.push(c as Buffer);
  } catch (e) {
    throw new KubeConnectionError(op, e);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function errorFromResponse(op: string, res: IncomingMessage): Promise<KubeApiError> {
  const code = res.statusCode ?? 0;
  let reason = res.statusMessage ?? '';
  let message = '';
  try {
    const st = JSON.parse(await readBody(op, res)) as Json;
    if (isObject(st)) {
      reason = str(st.reason) || reason;
      message = str(st.message);
    }
  } catch {
    // Not a Status body (a proxy's error page): the status line says enough.
  }
  return new KubeApiError(op, code, reason, message);
}

function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: Json | undefined): string {
  return typeof v === 'string' ? v : '';
}

function stringMap(op: string, name: string, what: string, v: Json | undefined): Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isObject(v)) throw new KubeProtocolError(op, `node ${name}: ${what} is not an object`);
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string') throw new KubeProtocolError(op, `node ${name}: ${what}.${k} is not a string`);
    out[k] = val;
  }
  return out;
}

/** Checks the fields weft reads and keeps only those. */
export function asKubeNode(op: string, v: Json | undefined): KubeNode {
  if (!isObject(v) || !isObject(v.metadata) || typeof v.metadata.name !== 'string') {
    throw new KubeProtocolError(op, 'not a Node (no metadata.name)');
  }
  const name = v.metadata.name;
  const metadata: { name: string; resourceVersion?: string; annotations?: Record<string, string> } = { name };
  if (typeof v.metadata.resourceVersion === 'string') metadata.resourceVersion = v.metadata.resourceVersion;
  const annotations = stringMap(op, name, 'metadata.annotations', v.metadata.annotations);
  if (annotations) metadata.annotations = annotations;
  const spec: { podCIDR?: string; podCIDRs?: string[] } = {};
  if (isObject(v.spec)) {
    if (typeof v.spec.podCIDR === 'string') spec.podCIDR = v.spec.podCIDR;
    const cidrs = v.spec.podCIDRs;
    if (Array.isArray(cidrs)) {
      if (!cidrs.every((c): c is string => typeof c === 'string')) {
        throw new KubeProtocolError(op, `node ${name}: spec.podCIDRs holds a non-string`);
      }
      spec.podCIDRs = cidrs;
    }
  }
  const conditions: NodeCondition[] = [];
  if (isObject(v.status) && Array.isArray(v.status.conditions)) {
    for (const c of v.status.conditions) {
      if (!isObject(c) || typeof c.type !== 'string' || typeof c.status !== 'string') continue;
      const cond: { -readonly [K in keyof NodeCondition]: NodeCondition[K] } = { type: c.type, status: c.status };
      if (typeof c.lastHeartbeatTime === 'string') cond.lastHeartbeatTime = c.lastHeartbeatTime;
      if (typeof c.lastTransitionTime === 'string') cond.lastTransitionTime = c.lastTransitionTime;
      if (typeof c.reason === 'string') cond.reason = c.reason;
      if (typeof c.message === 'string') cond.message = c.message;
      conditions.push(cond);
    }
  }
  return { metadata, spec, status: { conditions } };
}

/** A BOOKMARK's object: only metadata.resourceVersion means anything. */
function asBookmark(op: string, v: Json | undefined): KubeNode {
  const meta = isObject(v) && isObject(v.metadata) ? v.metadata : null;
  if (!meta || typeof meta.resourceVersion !== 'string') throw new KubeProtocolError(op, 'BOOKMARK without a resourceVersion');
  return { metadata: { name: '', resourceVersion: meta.resourceVersion } };
}

/**
 * flannel's node name: $NODE_NAME, else the spec.nodeName of the pod $POD_NAMESPACE/$POD_NAME
 * (flannel's error texts).
 */
export async function resolveNodeName(
  env: Readonly<Record<string, string | undefined>>,
  getPodNodeName: (namespace: string, name: string) => Promise<string>,
): Promise<string> {
  const nodeName = env.NODE_NAME ?? '';
  if (nodeName !== '') return nodeName;
  const podName = env.POD_NAME ?? '';
  const podNamespace = env.POD_NAMESPACE ?? '';
  if (podName === '' || podNamespace === '') {
    throw new NodeNameError('env variables POD_NAME and POD_NAMESPACE must be set');
  }
  let fromPod: string;
  try {
    fromPod = await getPodNodeName(podNamespace, podName);
  } catch (e) {
    throw new NodeNameError(`error retrieving pod spec for '${podNamespace}/${podName}': ${errorMessage(e)}`);
  }
  if (fromPod === '') throw new NodeNameError(`node name not present in pod spec '${podNamespace}/${podName}'`);
  return fromPod;
}

export class NodeNameError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NodeNameError';
  }
}
