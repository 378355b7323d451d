// What the CNI server tells the rest of weftd: its metrics seam and its state for `weft status`.
// No imports, so the daemon's metrics and status modules can use these without a cycle.

/** weftd's --cni-socket default (and the native client's, unless WEFT_CNI_SOCKET is set). */
export const DEFAULT_CNI_SOCKET = '/run/weft/cni.sock';

/** How a request ended, the `result` label of weft_cni_requests_total. */
export type CniRequestResult =
  /** The plugin ran and exited 0. */
  | 'ok'
  /** The plugin ran and reported an error (exit status 1). */
  | 'error'
  /** Refused before any plugin ran: bad frame, JSON, version, env or plugin name. */
  | 'invalid'
  /** ADD waited for weftd's lease and subnet.env and answered "try again later" (code 11). */
  | 'not_ready'
  /** Not run: weftd was stopping (the client runs the plugin itself). */
  | 'not_serving'
  /** Did not finish within the server's time bound; its work was abandoned. */
  | 'timeout';

export const CNI_REQUEST_RESULTS: readonly CniRequestResult[] = ['ok', 'error', 'invalid', 'not_ready', 'not_serving', 'timeout'];

/** The plugin names the server serves (also the only `plugin` label values besides "unknown"). */
export const CNI_SERVER_PLUGINS = ['flannel', 'bridge', 'host-local', 'portmap', 'weft-ovs', 'sriov'] as const;

/** The CNI verbs (also the only `verb` label values besides "unknown"). */
export const CNI_VERBS = ['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION'] as const;

export interface CniServerMetrics {
  /** One finished request; `plugin` and `verb` are already reduced to known values or "unknown". */
  recordCniRequest(plugin: string, verb: string, result: CniRequestResult, seconds: number): void;
}

/** Where the server is in its life. */
export type CniServerPhase =
  /** Not started (or --cni-socket is empty). */
  | 'off'
  /** Another live server answers on the socket path; retried until it goes away. */
  | 'waiting'
  | 'serving'
  /** Could not listen (the reason says why); clients fall back to the bundles. */
  | 'failed'
  | 'stopping'
  | 'stopped';

export interface CniServerRequestError {
  /** ISO time. */
  readonly time: string;
  readonly plugin: string;
  readonly verb: string;
  readonly containerId: string;
  /** The CNI error code (0 when the reply carried no CNI error JSON). */
  readonly code: number;
  readonly message: string;
}

/** The server's own view; the counts come from the metrics (daemon/status.ts). */
export interface CniServerState {
  readonly socket: string;
  readonly phase: CniServerPhase;
  /** Why it is waiting or failed. */
  readonly reason: string | null;
  /** Requests being read, waiting or running. */
  readonly inFlight: number;
  /** Requests answered with a timeout whose plugin work has not settled yet. */
  readonly abandoned: number;
  /** The most recent failed requests, newest first. */
  readonly lastErrors: readonly CniServerRequestError[];
}
