// The child side of test/helpers/ovs-driver.ts: the real OvsBackend, run in the network namespace
// of a private Open vSwitch (`ip netns exec <ns> node --import tsx <this file> --run-dir <dir>`),
// driven by JSON lines on stdin, answering with JSON lines on stdout. Every ovs-vsctl/ovs-ofctl
// process the backend runs and every netlink call it makes is recorded, so a test can say what a
// pass did, not only what it left behind. Logs go to stderr. Refuses to run in the machine's own
// network namespace.
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';

import type { Lease, LeaseEvent } from '../../src/subnet/lease.js';
import { OvsBackend, parseOvsOptions } from '../../src/backend/ovs/ovs.js';
import { Netlink } from '../../src/netlink/index.js';
import { parseNetworkConfig } from '../../src/subnet/config.js';
import { errorMessage } from '../../src/util/errors.js';
import { IPAddr, IPNet } from '../../src/util/ip.js';
import { createLogger } from '../../src/util/log.js';
import { assertPrivateNetns } from '../netns/setup.js';
import type { DriverRequest, DriverResponse, WireLease } from './ovs-driver.js';
import { RecordingOvsClient } from './ovs-recording.js';

/** The handle with every method call recorded by name. */
function recordingNetlink(nl: Netlink, calls: string[]): Netlink {
  return new Proxy(nl, {
    get(target, prop, receiver) {
      const v: unknown = Reflect.get(target, prop, receiver);
      if (typeof v !== 'function' || typeof prop !== 'string') return v;
      return (...args: unknown[]): unknown => {
        if (prop !== 'close') calls.push(`netlink ${prop}`);
        return (v as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
}

function leaseOf(w: WireLease): Lease {
  return {
    subnet: IPNet.parse(w.subnet),
    ipv6Subnet: null,
    attrs: { publicIP: IPAddr.parse(w.publicIP), publicIPv6: null, backendType: w.backendType ?? 'ovs', backendData: { VNI: w.vni ?? 1 } },
    reservation: false,
    expiration: null,
  };
}

async function main(): Promise<void> {
  assertPrivateNetns();
  const { values } = parseArgs({ options: { 'run-dir': { type: 'string' } } });
  const runDir = values['run-dir'];
  if (!runDir) throw new Error('--run-dir is required');
  const ovs = new RecordingOvsClient({ runDir });
  const nlCalls: string[] = [];
  const nl = recordingNetlink(Netlink.open(), nlCalls);
  const logger = createLogger({ level: 'debug' });
  const state: { backend: OvsBackend | null; closed: boolean } = { backend: null, closed: false };
  const need = (): OvsBackend => {
    if (!state.backend) throw new Error('init first');
    return state.backend;
  };

  const handle = async (req: DriverRequest): Promise<unknown> => {
    switch (req.cmd) {
      case 'init': {
        const config = parseNetworkConfig(JSON.stringify(req.config), { knownBackends: ['ovs'] });
        const link = await nl.link(req.iface);
        if (!link) throw new Error(`no interface ${req.iface}`);
        const addr = (await nl.addresses(link.index)).find((a) => a.ip.family === 4);
        if (!addr) throw new Error(`${req.iface} has no IPv4 address`);
        const extIface = { name: link.name, index: link.index, mtu: link.mtu, ifaceAddr: addr.ip, ifaceV6Addr: null, extAddr: addr.ip, extV6Addr: null };
        const backend = new OvsBackend(parseOvsOptions(config.backend.options), { config, extIface, logger }, { ovs, netlink: nl });
        state.backend = backend;
        const prepared = await backend.prepare();
        return { publicIP: prepared.attrs.publicIP.toString(), mtu: prepared.mtu };
      }
      case 'start':
        await need().start(leaseOf(req.lease));
        return null;
      case 'apply': {
        const batch: LeaseEvent[] = req.events.map((e) => ({ type: e.type, lease: leaseOf(e.lease) }));
        return need().apply(batch);
      }
      case 'reconcile':
        return need().reconcile(req.peers.map(leaseOf));
      case 'calls': {
        return { ovs: ovs.take(), netlink: nlCalls.splice(0) };
      }
      case 'close':
        if (state.backend) {
          await state.backend.close();
          state.closed = true;
        }
        state.backend = null;
        return null;
    }
  };

  const send = (r: DriverResponse): void => {
    process.stdout.write(`${JSON.stringify(r)}\n`);
  };
  // One request at a time, in order, as the daemon calls a backend.
  let queue = Promise.resolve();
  for await (const line of createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    const req = JSON.parse(line) as DriverRequest;
    queue = queue.then(() =>
      handle(req).then(
        (value) => send({ id: req.id, ok: true, value }),
        (e: unknown) => send({ id: req.id, ok: false, error: errorMessage(e) }),
      ),
    );
  }
  await queue;
  // The backend's close() closes the netlink handle; without a backend it is closed here.
  if (state.backend) await state.backend.close();
  else if (!state.closed) nl.close();
}

main().catch((e: unknown) => {
  process.stderr.write(`ovs driver: ${errorMessage(e)}\n`);
  process.exitCode = 1;
});
