// weft: the operator CLI. `weft leases` shows every lease in the store, `weft status` this node's
// daemon, `weft trace` one packet's path through this node.
import yargs from 'yargs';
import { DEFAULT_ETCD_ENDPOINTS, DEFAULT_ETCD_PREFIX } from '../subnet/etcd/registry.js';
import { EtcdSubnetManager } from '../subnet/etcd/manager.js';
import { createLogger } from '../util/log.js';
import { VERSION } from '../version.js';
import { etcdConnectOptions, normalizeGoFlags, type EtcdFlags } from './flags.js';
import { defaultBundleDir, installCni } from './install-cni.js';
import { leaseRow, renderTable, sortRows } from './leases-table.js';
import { DEFAULT_STATUS_ENDPOINT, statusCommand } from './status.js';
import { PROTOS, traceCommand } from './trace/command.js';
import { errorMessage } from '../util/errors.js';

async function leasesCommand(args: EtcdFlags & { output: 'table' | 'json' }): Promise<number> {
  let manager: EtcdSubnetManager;
  try {
    manager = EtcdSubnetManager.connect({
      ...etcdConnectOptions(args),
      knownBackends: [],
      logger: createLogger({ level: 'error' }),
    });
  } catch (e) {
    process.stderr.write(`weft leases: ${errorMessage(e)}\n`);
    return 2;
  }
  try {
    const rows = sortRows((await manager.listLeases()).map(leaseRow));
    process.stdout.write(args.output === 'json' ? `${JSON.stringify(rows, null, 2)}\n` : renderTable(rows));
    return 0;
  } catch (e) {
    process.stderr.write(`weft leases: ${errorMessage(e)}\n`);
    return 1;
  } finally {
    await manager.close();
  }
}

/** The global etcd flags as weft's commands take them. */
function etcdFlags(a: {
  'etcd-endpoints': Array<string | number>;
  'etcd-prefix': string;
  'etcd-cafile': string;
  'etcd-certfile': string;
  'etcd-keyfile': string;
  'etcd-username': string;
  'etcd-password': string;
}): EtcdFlags {
  return {
    etcdEndpoints: a['etcd-endpoints'].flatMap((e) => String(e).split(',')).filter(Boolean),
    etcdPrefix: a['etcd-prefix'],
    etcdCafile: a['etcd-cafile'],
    etcdCertfile: a['etcd-certfile'],
    etcdKeyfile: a['etcd-keyfile'],
    etcdUsername: a['etcd-username'],
    etcdPassword: a['etcd-password'],
  };
}

async function main(argv: string[]): Promise<number> {
  let code = 0;
  try {
    await yargs(normalizeGoFlags(argv))
      .scriptName('weft')
      .usage('weft: operator commands for weft and flannel clusters')
      .env('FLANNELD')
      .option('etcd-endpoints', { type: 'string', array: true, default: DEFAULT_ETCD_ENDPOINTS, describe: 'comma-separated etcd endpoints' })
      .option('etcd-prefix', { type: 'string', default: DEFAULT_ETCD_PREFIX, describe: 'etcd prefix' })
      .option('etcd-cafile', { type: 'string', default: '' })
      .option('etcd-certfile', { type: 'string', default: '' })
      .option('etcd-keyfile', { type: 'string', default: '' })
      .option('etcd-username', { type: 'string', default: '' })
      .option('etcd-password', { type: 'string', default: '' })
      .command(
        'leases',
        'list the subnet leases in the store',
        (y) => y.option('output', { alias: 'o', choices: ['table', 'json'] as const, default: 'table' as const }),
        async (a) => {
          code = await leasesCommand({
            etcdEndpoints: a['etcd-endpoints'].flatMap((e) => String(e).split(',')).filter(Boolean),
            etcdPrefix: a['etcd-prefix'],
            output: a.output,
            etcdCafile: a['etcd-cafile'],
            etcdCertfile: a['etcd-certfile'],
            etcdKeyfile: a['etcd-keyfile'],
            etcdUsername: a['etcd-username'],
            etcdPassword: a['etcd-password'],
          });
        },
      )
      .command(
        'install-cni',
        'copy the CNI plugins (bridge, flannel, host-local, portmap, sriov, weft-ovs) into a CNI bin directory',
        (y) =>
          y
            .option('dest', { type: 'string', default: '/opt/cni/bin', describe: 'the runtime\'s CNI plugin directory' })
            .option('source', { type: 'string', default: defaultBundleDir(), describe: 'where `npm run build` put the bundles' }),
        async (a) => {
          try {
            for (const p of await installCni(a.source, a.dest)) process.stdout.write(`installed ${p}\n`);
          } catch (e) {
            process.stderr.write(`weft install-cni: ${errorMessage(e)}\n`);
            code = 1;
          }
        },
      )
      .command(
        'status',
        "this node's lease, backend, repairs and masquerade rules, from the running weftd (needs weftd --healthz-port)",
        (y) =>
          y
            .option('endpoint', { type: 'string', default: DEFAULT_STATUS_ENDPOINT, describe: "weftd's health server (--healthz-ip/--healthz-port)" })
            .option('output', { alias: 'o', choices: ['text', 'json'] as const, default: 'text' as const }),
        async (a) => {
          code = await statusCommand({ endpoint: a.endpoint, output: a.output });
        },
      )
      .command(
        'trace <src-ip> <dst-ip>',
        "the path of one packet through this node (run it in the node's network namespace), hop by hop with evidence",
        (y) =>
          y
            .positional('src-ip', { type: 'string', demandOption: true, describe: 'source address (a pod, this node, or outside)' })
            .positional('dst-ip', { type: 'string', demandOption: true, describe: 'destination address' })
            .option('proto', { choices: PROTOS, default: 'icmp' as const, describe: 'protocol of the packet' })
            .option('dport', { type: 'number', describe: 'destination port (tcp/udp)' })
            .option('output', { alias: 'o', choices: ['text', 'json'] as const, default: 'text' as const })
            .option('subnet-file', { type: 'string', default: '/run/flannel/subnet.env', describe: "this node's subnet.env" })
            .option('endpoint', { type: 'string', default: DEFAULT_STATUS_ENDPOINT, describe: "weftd's health server, for the rule mode and (without etcd) the leases" })
            .option('etcd-timeout', { type: 'number', default: 5, describe: 'seconds to wait for etcd before using the leases the daemon reports' }),
        async (a) => {
          code = await traceCommand({
            src: a['src-ip'],
            dst: a['dst-ip'],
            proto: a.proto,
            dport: a.dport ?? null,
            output: a.output,
            subnetFile: a['subnet-file'],
            etcd: etcdConnectOptions(etcdFlags(a)),
            etcdTimeoutMs: a['etcd-timeout'] * 1000,
            endpoint: a.endpoint,
          });
        },
      )
      .demandCommand(1, 'name a command (see --help)')
      .strict()
      .version(VERSION)
      .help()
      .fail((msg, err) => {
        throw err ?? new Error(msg);
      })
      .parseAsync();
  } catch (e) {
    process.stderr.write(`weft: ${errorMessage(e)}\n`);
    return 2;
  }
  return code;
}

process.exitCode = await main(process.argv.slice(2));
setImmediate(() => process.exit());
