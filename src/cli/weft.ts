// weft: the operator CLI. `weft leases` shows every lease in the store, `weft status` this node's
// daemon, `weft trace` one packet's path through this node.
import yargs from 'yargs';
import { DEFAULT_ETCD_ENDPOINTS, DEFAULT_ETCD_PREFIX } from '../subnet/etcd/defaults.js';
import { EtcdSubnetManager } from '../subnet/etcd/manager.js';
import { createLogger } from '../util/log.js';
import { VERSION } from '../version.js';
import { terminalJson, terminalText } from '../render/terminal.js';
import { etcdConnectOptions, normalizeGoFlags, resolveEtcdPassword, type EtcdFlags } from './flags.js';
import { defaultBundleDir, installCni } from './install-cni.js';
import { leaseRow, renderTable, sortRows } from './leases-table.js';
import { DEFAULT_STATUS_ENDPOINT, statusCommand } from './status.js';
import { PROTOS, traceCommand } from './trace/command.js';
import { errorMessage } from '../util/errors.js';

/** An error for the operator's terminal: messages may quote store values. */
function fail(command: string, e: unknown): void {
  process.stderr.write(`${command}: ${terminalText(errorMessage(e))}\n`);
}

async function leasesCommand(flags: () => EtcdFlags, output: 'table' | 'json'): Promise<number> {
  let manager: EtcdSubnetManager;
  try {
    manager = EtcdSubnetManager.connect({
      ...etcdConnectOptions(flags()),
      knownBackends: [],
      logger: createLogger({ level: 'error' }),
    });
  } catch (e) {
    fail('weft leases', e);
    return 2;
  }
  try {
    const rows = sortRows((await manager.listLeases()).map(leaseRow));
    process.stdout.write(output === 'json' ? `${terminalJson(rows)}\n` : renderTable(rows));
    return 0;
  } catch (e) {
    fail('weft leases', e);
    return 1;
  } finally {
    await manager.close();
  }
}

/** The global etcd flags as weft's commands take them; reads --etcd-password-file (FlagError when it cannot). */
function etcdFlags(a: {
  'etcd-endpoints': Array<string | number>;
  'etcd-prefix': string;
  'etcd-cafile': string;
  'etcd-certfile': string;
  'etcd-keyfile': string;
  'etcd-username': string;
  'etcd-password': string;
  'etcd-password-file': string;
}): EtcdFlags {
  return {
    etcdEndpoints: a['etcd-endpoints'].flatMap((e) => String(e).split(',')).filter(Boolean),
    etcdPrefix: a['etcd-prefix'],
    etcdCafile: a['etcd-cafile'],
    etcdCertfile: a['etcd-certfile'],
    etcdKeyfile: a['etcd-keyfile'],
    etcdUsername: a['etcd-username'],
    etcdPassword: resolveEtcdPassword(a['etcd-password'], a['etcd-password-file']),
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
      .option('etcd-password', { type: 'string', default: '', describe: 'visible in the process list: prefer FLANNELD_ETCD_PASSWORD or --etcd-password-file' })
      .option('etcd-password-file', { type: 'string', default: '', describe: 'file holding the etcd password (trailing newline dropped); exclusive with --etcd-password' })
      .command(
        'leases',
        'list the subnet leases in the store',
        (y) => y.option('output', { alias: 'o', choices: ['table', 'json'] as const, default: 'table' as const }),
        async (a) => {
          code = await leasesCommand(() => etcdFlags(a), a.output);
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
            fail('weft install-cni', e);
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
            .option('endpoint', { type: 'string', default: DEFAULT_STATUS_ENDPOINT, describe: "weftd's health server, for the rule mode, NetworkPolicy decisions and (without etcd) the leases" })
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
    fail('weft', e);
    return 2;
  }
  return code;
}

process.exitCode = await main(process.argv.slice(2));
setImmediate(() => process.exit());
