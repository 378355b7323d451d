// Health and metrics HTTP server. /healthz and /readyz follow flannel's mustRunHealthz (main.go);
// /metrics and /status (the JSON snapshot `weft status` reads) are weft's additions.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../util/log.js';
import type { DaemonMetrics } from './metrics.js';
import type { StatusOptions, StatusSnapshot } from './status.js';
import { errnoCode, errorMessage } from '../util/errors.js';

export interface HealthServerOptions {
  host: string;
  port: number;
  isReady: () => boolean;
  metrics: DaemonMetrics;
  logger: Logger;
  /**
   * Serves /status when given (`?peers=true` adds the peer list, to loopback clients only);
   * /status is 404 without it.
   */
  status?: (opts: StatusOptions) => Promise<StatusSnapshot>;
  /**
   * Serves /policy when given (--network-policy; loopback clients only: it tells which policies
   * select which pods): the NetworkPolicy decision for the packet in the query, for `weft trace`.
   */
  policy?: (query: URLSearchParams) => { readonly status: number; readonly body: unknown };
  /** How long stop() lets in-flight requests finish before cutting connections. Flannel uses 3 s. */
  shutdownTimeoutMs?: number;
}

export class HealthServerError extends Error {
  constructor(
    message: string,
    readonly host: string,
    readonly port: number,
    readonly code: string | undefined,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = 'HealthServerError';
  }
}

/** `host:port`, with IPv6 hosts bracketed. */
function joinHostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

const TEXT = 'text/plain; charset=utf-8';
const JSON_TYPE = 'application/json; charset=utf-8';

export class HealthServer {
  private server: http.Server | undefined;
  private stopping: Promise<void> | undefined;
  private readonly shutdownTimeoutMs: number;

  constructor(private readonly opts: HealthServerOptions) {
    this.shutdownTimeoutMs = opts.shutdownTimeoutMs ?? 3000;
  }

  /** Listens; port 0 picks an ephemeral port. Resolves with the address actually bound. */
  async start(): Promise<{ host: string; port: number }> {
    if (this.server !== undefined) {
      throw new HealthServerError(
        `health server on ${joinHostPort(this.opts.host, this.opts.port)} already started`,
        this.opts.host,
        this.opts.port,
        undefined,
      );
    }
    const server = http.createServer((req, res) => {
      this.handle(req, res).catch((err: unknown) => {
        this.opts.logger.error('health server request failed', { url: req.url, err });
        if (!res.headersSent) send(res, req.method === 'HEAD', 500, TEXT, 'internal error');
        else res.destroy();
      });
    });
    const { host, port } = this.opts;
    this.server = server; // claimed before awaiting, so a concurrent start() is refused
    this.stopping = undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          resolve();
        });
      });
    } catch (err) {
      this.server = undefined;
      const code = errnoCode(err) ?? undefined;
      throw new HealthServerError(
        `cannot listen on ${joinHostPort(host, port)}: ${code ?? errorMessage(err)}`,
        host,
        port,
        code,
        { cause: err },
      );
    }
    // After listening, a server error is not fatal to the daemon; log it rather than crash on 'error'.
    server.on('error', (err) => this.opts.logger.error('health server error', { err }));
    const addr = server.address() as AddressInfo;
    this.opts.logger.info('health server listening', { address: joinHostPort(addr.address, addr.port) });
    return { host: addr.address, port: addr.port };
  }

  /** Stops listening and resolves once closed; connections still open after the timeout are destroyed. */
  stop(): Promise<void> {
    const server = this.server;
    if (server === undefined) return Promise.resolve();
    this.stopping ??= new Promise<void>((resolve) => {
      const timer = setTimeout(() => server.closeAllConnections(), this.shutdownTimeoutMs);
      server.close(() => {
        clearTimeout(timer);
        this.server = undefined;
        resolve();
      });
      // Idle keep-alive sockets would otherwise hold close() open until they time out.
      server.closeIdleConnections();
    });
    return this.stopping;
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const path = url.pathname;
    const head = req.method === 'HEAD';
    const route = ROUTES.has(path) || path === '/status' || path === '/policy';
    this.opts.logger.debug('health server request', { method: req.method, path });
    if (!route) {
      send(res, head, 404, TEXT, '404 page not found\n');
      return;
    }
    if (req.method !== 'GET' && !head) {
      res.setHeader('Allow', 'GET, HEAD');
      send(res, false, 405, TEXT, 'method not allowed\n');
      return;
    }
    switch (path) {
      case '/healthz':
        send(res, head, 200, TEXT, 'weftd is running');
        return;
      case '/readyz':
        if (this.opts.isReady()) send(res, head, 200, TEXT, 'weftd is ready');
        else send(res, head, 503, TEXT, 'weftd is not ready yet');
        return;
      case '/metrics': {
        const body = await this.opts.metrics.text();
        send(res, head, 200, this.opts.metrics.contentType, body);
        return;
      }
      case '/status': {
        const status = this.opts.status;
        if (!status) {
          send(res, head, 404, TEXT, '404 page not found\n');
          return;
        }
        const peers = ['true', '1'].includes(url.searchParams.get('peers') ?? '');
        // Every node's public address and subnet is a map of the cluster: only for this host.
        if (peers && !isLoopbackClient(req.socket.remoteAddress)) {
          send(res, head, 403, TEXT, 'the peer list (/status?peers=true) is served to clients on this host (loopback) only\n');
          return;
        }
        const snapshot = await status({ peers });
        send(res, head, 200, JSON_TYPE, `${JSON.stringify(snapshot, null, 2)}\n`);
        return;
      }
      case '/policy': {
        if (!this.opts.policy) {
          send(res, head, 404, TEXT, '404 page not found (weftd runs without --network-policy)\n');
          return;
        }
        if (!isLoopbackClient(req.socket.remoteAddress)) {
          send(res, head, 403, TEXT, '/policy is served to clients on this host (loopback) only\n');
          return;
        }
        const answer = this.opts.policy(url.searchParams);
        send(res, head, answer.status, JSON_TYPE, `${JSON.stringify(answer.body, null, 2)}\n`);
        return;
      }
    }
  }
}

const ROUTES = new Set(['/healthz', '/readyz', '/metrics']);

/** Whether a client's address is this host's loopback: 127.0.0.0/8, ::1, or 127.x in its IPv4-mapped form. */
export function isLoopbackClient(address: string | undefined): boolean {
  if (address === undefined) return false;
  return address === '::1' || /^(::ffff:)?127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/i.test(address);
}

function send(res: http.ServerResponse, head: boolean, status: number, contentType: string, body: string): void {
  const buf = Buffer.from(body, 'utf8');
  res.writeHead(status, {
    'Content-Type': contentType,
    'Content-Length': buf.length,
    'Cache-Control': 'no-store',
  });
  res.end(head ? undefined : buf);
}
