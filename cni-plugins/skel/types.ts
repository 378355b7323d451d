// The CNI contract shared by every weft plugin: request, result (spec 1.1.0 shape, converted to the
// request's version only when printed), errors with the spec's well-known codes, and the plugin
// interface the skeleton dispatches to. Plugins never print or exit themselves.

export const SUPPORTED_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export type CniVersion = (typeof SUPPORTED_VERSIONS)[number];
export const CURRENT_VERSION: CniVersion = '1.1.0';

export type CniCommand = 'ADD' | 'DEL' | 'CHECK' | 'VERSION' | 'GC' | 'STATUS';

/** Spec error codes (SPEC.md "Error"). 999 is libcni's ErrInternal: any other failure. */
export const ErrorCode = {
  IncompatibleVersion: 1,
  UnsupportedField: 2,
  UnknownContainer: 3,
  InvalidEnvironment: 4,
  IOFailure: 5,
  DecodeFailure: 6,
  InvalidNetworkConfig: 7,
  InvalidNetNS: 8,
  TryAgainLater: 11,
  PluginNotAvailable: 50,
  PluginNotAvailableLimited: 51,
  Internal: 999,
} as const;
export type ErrorCodeValue = (typeof ErrorCode)[keyof typeof ErrorCode];

/** An error a plugin reports to the runtime: printed as `{code,msg,details}` on stdout, exit status 1. */
export class CniError extends Error {
  constructor(
    readonly code: number,
    msg: string,
    readonly details = '',
  ) {
    super(msg);
    this.name = 'CniError';
  }

  toJSON(): { code: number; msg: string; details?: string } {
    return this.details ? { code: this.code, msg: this.message, details: this.details } : { code: this.code, msg: this.message };
  }
}

export interface CniInterface {
  name: string;
  mac?: string;
  mtu?: number;
  sandbox?: string;
  socketPath?: string;
  pciID?: string;
}

export interface CniIPConfig {
  /** Index into `interfaces`; absent in IPAM results. */
  interface?: number;
  /** CIDR with host bits, e.g. "10.1.0.5/24". */
  address: string;
  gateway?: string;
}

export interface CniRoute {
  dst: string;
  gw?: string;
  mtu?: number;
  advmss?: number;
  priority?: number;
  table?: number;
  scope?: number;
}

export interface CniDNS {
  nameservers?: string[];
  domain?: string;
  search?: string[];
  options?: string[];
}

/** A result in spec 1.1.0 form (the internal form; conversion happens when printing). */
export interface CniResult {
  cniVersion: string;
  interfaces?: CniInterface[];
  ips?: CniIPConfig[];
  routes?: CniRoute[];
  dns?: CniDNS;
}

/** The request config (stdin), as parsed JSON. Plugins validate their own keys. */
export interface NetConf {
  cniVersion: string;
  name: string;
  type: string;
  ipam?: { type?: string; [key: string]: unknown };
  dns?: CniDNS;
  prevResult?: CniResult;
  runtimeConfig?: Record<string, unknown>;
  args?: Record<string, unknown>;
  [key: string]: unknown;
}

/** One invocation: the env the runtime set, plus stdin (raw bytes and the parsed config). */
export interface CniRequest {
  readonly command: CniCommand;
  readonly containerId: string;
  /** Path of the container netns; empty on a DEL without netns. */
  readonly netns: string;
  readonly ifname: string;
  /** CNI_ARGS as key/value pairs (`K=V;K2=V2`). */
  readonly args: ReadonlyMap<string, string>;
  /** CNI_PATH split on ':'. */
  readonly path: readonly string[];
  /** stdin exactly as received (delegates get the same bytes unless a plugin builds a new config). */
  readonly stdin: string;
  /** Parsed stdin; `prevResult` already converted to the 1.1.0 shape. */
  readonly config: NetConf;
  /** The environment to pass on to delegates (CNI_* plus the rest of the process env). */
  readonly env: Readonly<Record<string, string | undefined>>;
}

/**
 * A plugin is a set of verb handlers. ADD returns the 1.1.0-shaped result; the skeleton converts it
 * to `config.cniVersion` and prints it. DEL, CHECK, GC and STATUS resolve on success and throw a
 * CniError (or any Error → code 999) on failure. Missing GC/STATUS handlers are a no-op success,
 * as in the reference skel.
 */
export interface CniPlugin {
  readonly name: string;
  readonly supportedVersions?: readonly string[];
  add(req: CniRequest): Promise<CniResult>;
  del(req: CniRequest): Promise<void>;
  check(req: CniRequest): Promise<void>;
  gc?(req: CniRequest): Promise<void>;
  status?(req: CniRequest): Promise<void>;
}

/**
 * How a plugin reaches another plugin (its IPAM, or flannel's delegate): `type` is the plugin name,
 * `stdin` the full config. skel/delegate.ts provides the real one; tests pass fakes.
 */
export interface Delegates {
  add(req: CniRequest, type: string, stdin: string): Promise<CniResult>;
  del(req: CniRequest, type: string, stdin: string): Promise<void>;
  check(req: CniRequest, type: string, stdin: string): Promise<void>;
  gc(req: CniRequest, type: string, stdin: string): Promise<void>;
  status(req: CniRequest, type: string, stdin: string): Promise<void>;
}
