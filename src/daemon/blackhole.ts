// `--ip-blackhole-route`: a blackhole route for this node's own pod subnet(s), so traffic to an
// unassigned pod address is dropped here instead of following the default route out of the node.
// The route has the highest metric, so cni0's connected route for the same prefix (metric 0) wins
// whenever the bridge exists; the blackhole answers when it does not. Re-checked every resync, as flannel.
// The route keeps the kernel's default protocol: weft's backends own only proto-88 routes, so a
// reconcile never removes it.
import type { IPNet } from '../util/ip.js';
import { runCommand } from '../util/exec.js';

export type Run = (command: string, args: readonly string[]) => Promise<string>;

const METRIC = '4294967295';

const defaultRun: Run = (command, args) => runCommand(command, args);

export class BlackholeRoutes {
  private wanted: readonly IPNet[] = [];

  constructor(private readonly run: Run = defaultRun) {}

  /** The subnets of the current lease; routes of a previous lease are removed at the next sync. */
  async sync(subnets: readonly IPNet[]): Promise<{ added: string[]; removed: string[] }> {
    const added: string[] = [];
    const removed: string[] = [];
    const keep = new Set(subnets.map(String));
    for (const old of this.wanted) {
      if (keep.has(String(old))) continue;
      if (await this.present(old)) {
        await this.run('ip', [`-${old.family}`, 'route', 'del', 'blackhole', String(old), 'metric', METRIC]);
        removed.push(String(old));
      }
    }
    for (const net of subnets) {
      if (await this.present(net)) continue;
      await this.run('ip', [`-${net.family}`, 'route', 'replace', 'blackhole', String(net), 'metric', METRIC]);
      added.push(String(net));
    }
    this.wanted = subnets;
    return { added, removed };
  }

  private async present(net: IPNet): Promise<boolean> {
    const out = await this.run('ip', [`-${net.family}`, '-j', 'route', 'show', 'type', 'blackhole', 'exact', String(net)]);
    const routes = JSON.parse(out || '[]') as unknown[];
    return routes.length > 0;
  }
}
