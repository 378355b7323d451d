// `make demo` (first stage): a local etcd, three weftd daemons with the alloc backend, and the
// lease table they produce. Everything runs on loopback in a temporary directory and is stopped
// at the end (or on Ctrl-C).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Etcd3 } from 'etcd3';
import { EtcdServer } from '../test/helpers/etcd.js';
import { WaitAbort, waitFor } from '../test/helpers/wait.js';
import { WeftdProcess } from '../test/helpers/weftd.js';

const WEFT = fileURLToPath(new URL('../bin/weft', import.meta.url));
const CONFIG = '{"Network":"10.5.0.0/16","Backend":{"Type":"alloc"}}';

function step(msg: string): void {
  process.stdout.write(`\n==> ${msg}\n`);
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'weft-demo-'));
  const daemons: WeftdProcess[] = [];
  let etcd: EtcdServer | null = null;
  const cleanup = async () => {
    await Promise.all(daemons.map((d) => d.stop()));
    await etcd?.destroy();
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('SIGINT', () => void cleanup().then(() => process.exit(130)));
  try {
    step('starting etcd on loopback');
    etcd = await EtcdServer.start();
    process.stdout.write(`etcd ${etcd.endpoint} (pid ${etcd.pid})\n`);

    step(`writing the network config to /coreos.com/network/config: ${CONFIG}`);
    const client = new Etcd3({ hosts: etcd.endpoint });
    await client.put('/coreos.com/network/config').value(CONFIG);
    client.close();

    step('starting three weftd daemons (alloc backend: leases only, no dataplane)');
    for (let i = 1; i <= 3; i++) {
      const subnetFile = join(dir, `node${i}`, 'subnet.env');
      const d = WeftdProcess.start([
        '--etcd-endpoints', etcd.endpoint, '--iface', 'lo', '--public-ip', `198.51.100.${i}`, '--subnet-file', subnetFile,
      ]);
      daemons.push(d);
      await waitFor(() => {
        if (!d.running) throw new WaitAbort(`weftd node${i} exited:\n${d.output}`);
        return /acquired lease/.test(d.output);
      }, { timeoutMs: 30_000, what: `node${i} to acquire a lease` });
      process.stdout.write(`node${i}: ${/acquired lease (.*)/.exec(d.output)![1]}\n`);
      process.stdout.write(`${readFileSync(subnetFile, 'utf8').trimEnd().replace(/^/gm, `  node${i} subnet.env: `)}\n`);
    }

    step(`weft leases --etcd-endpoints ${etcd.endpoint}`);
    process.stdout.write(execFileSync(WEFT, ['leases', '--etcd-endpoints', etcd.endpoint], { encoding: 'utf8' }));

    step('stopping the daemons (leases stay in etcd) and etcd');
  } finally {
    await cleanup();
  }
  step('demo finished');
}

await main();
