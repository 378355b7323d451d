// weft's OVS client, recording every ovs-vsctl / ovs-ofctl process it runs as `ovs-vsctl <command>`
// or `ovs-ofctl [options] <command>`: what a pass or a CNI call ran, for tests to assert on.
import { OvsClient } from '../../src/ovs/cli.js';

export class RecordingOvsClient extends OvsClient {
  readonly calls: string[] = [];

  /** The calls so far, forgotten. */
  take(): string[] {
    return this.calls.splice(0);
  }

  override vsctl(a: readonly string[]): Promise<string> {
    this.calls.push(`ovs-vsctl ${a.find((x) => !x.startsWith('-')) ?? ''}`);
    return super.vsctl(a);
  }

  override ofctl(command: string, bridge: string, a: readonly string[] = [], stdin?: string, options: readonly string[] = []): Promise<string> {
    this.calls.push(`ovs-ofctl ${[...options, command].join(' ')}`);
    return super.ofctl(command, bridge, a, stdin, options);
  }

  override diffFlows(bridge: string, flows: string): Promise<string[]> {
    this.calls.push('ovs-ofctl diff-flows');
    return super.diffFlows(bridge, flows);
  }
}
