// The part of the ovs backend's flow table that NetworkPolicy owns: the rule flows of tables 52–55
// (cookie category Policy). The backend owns the table and its full passes (diff-flows, then an
// atomic replace-flows of the whole desired table), so the section's flows are part of that
// desired table; the policy enforcer changes them between passes with bundles of its own. Both
// run their "compute, then write" steps through `exclusive`, so a full pass never writes a table
// computed before a policy bundle that landed after it.
//
// Until the enforcer has programmed the section once (after a restart it first needs the API's
// lists), a full pass keeps the policy flows the bridge has, whatever their round: a restart
// never opens a window without policy, and never deletes a rule flow that is still wanted.
import type { IPNet } from '../../util/ip.js';
import type { Logger } from '../../util/log.js';
import { SerialQueue } from '../serial.js';
import type { Flow } from './pipeline.js';

/** What the backend lends the section once its round is known. */
export interface PolicyFlowHost {
  /** The round of this run: every flow written carries it in its cookie. */
  readonly round: number;
  /** Applies `add`/`delete`/`delete_strict` lines in one atomic bundle. */
  bundle(mods: string): Promise<void>;
  /** The bridge's policy flows (any round), as dump-flows prints them; with stats when asked. */
  dumpPolicyFlows(withStats: boolean): Promise<string[]>;
}

export class PolicyFlowSection {
  private attached: PolicyFlowHost | null = null;
  private waiting: Array<(h: PolicyFlowHost) => void> = [];
  private source: ((round: number) => Flow[]) | null = null;
  private readonly serial = new SerialQueue();

  /**
   * The Services' ClusterIP ranges (--service-cidr): on their first pass packets to them skip the
   * egress rules, which judge them when they come back from the host after kube-proxy's DNAT.
   */
  constructor(
    private readonly logger?: Logger,
    readonly serviceCIDRs: readonly IPNet[] = [],
  ) {}

  /** The backend, once it has its round (start-up). */
  attach(host: PolicyFlowHost): void {
    this.attached = host;
    for (const w of this.waiting.splice(0)) w(host);
  }

  /** The enforcer: the backend to write through, once there is one. */
  host(signal: AbortSignal): Promise<PolicyFlowHost> {
    if (this.attached) return Promise.resolve(this.attached);
    if (signal.aborted) return Promise.reject(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        this.waiting = this.waiting.filter((w) => w !== ready);
        reject(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
      };
      const ready = (h: PolicyFlowHost) => {
        signal.removeEventListener('abort', onAbort);
        resolve(h);
      };
      this.waiting.push(ready);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Runs `fn` alone among the section's writers (the backend's locked compare-and-replace, the enforcer's bundles). */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return this.serial.run(fn);
  }

  /** The enforcer has programmed the section: from now on full passes write these flows. */
  provide(flows: (round: number) => Flow[]): void {
    if (!this.source) this.logger?.info('ovs: NetworkPolicy flows programmed; full passes include them');
    this.source = flows;
  }

  /** The section's flows for a full pass, or null while the enforcer has not programmed it (keep the bridge's). */
  flows(round: number): Flow[] | null {
    return this.source ? this.source(round) : null;
  }
}
