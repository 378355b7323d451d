// What weft prints to an operator's terminal: values from the store and other nodes never reach it
// as control, C1 or format characters (src/render/terminal.ts), in `weft leases`, `weft status`
// and `weft trace` text; their JSON stays JSON that parses back to the same values.
import assert from 'node:assert/strict';

import { renderTable, type LeaseRow } from '../../src/cli/leases-table.js';
import { renderStatus } from '../../src/cli/status.js';
import { renderTrace } from '../../src/cli/trace/render.js';
import type { TraceReport } from '../../src/cli/trace/types.js';
import { STATUS_KIND, STATUS_VERSION, type StatusSnapshot } from '../../src/daemon/status.js';
import { terminalJson, terminalText } from '../../src/render/terminal.js';

const range = (from: number, to: number): number[] => Array.from({ length: to - from + 1 }, (_, i) => from + i);
const hex = (cp: number, width: number) => cp.toString(16).padStart(width, '0');

/** Every character a terminal obeys or hides, with the escape expected for it. */
const C0 = range(0x00, 0x1f);
const C1 = range(0x80, 0x9f);
const FORMAT = [0x00ad, 0x061c, 0x180e, 0x200b, 0x200c, 0x200d, 0x200e, 0x200f, ...range(0x202a, 0x202e), ...range(0x2060, 0x2064), ...range(0x2066, 0x2069), 0xfeff, 0xfff9, 0xfffa, 0xfffb];
const SEPARATORS = [0x2028, 0x2029];
const ASTRAL_FORMAT = [0x110bd, 0x1d173, 0xe0001, 0xe007f];
const SHORT: Record<number, string> = { 0x0a: '\\n', 0x0d: '\\r', 0x09: '\\t' };

function expectedEscape(cp: number): string {
  if (SHORT[cp] !== undefined) return SHORT[cp];
  if (cp <= 0xff) return `\\x${hex(cp, 2)}`;
  if (cp <= 0xffff) return `\\u${hex(cp, 4)}`;
  return `\\u{${cp.toString(16)}}`;
}

/** No raw character of any class the helper must escape. */
function assertNoRawControls(text: string, what: string): void {
  const raw = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/u.exec(text.replace(/\n/g, ''));
  assert.equal(raw, null, `${what} holds U+${hex(raw?.[0]?.codePointAt(0) ?? 0, 4)}: ${JSON.stringify(text)}`);
}

/** The hostile values: one per character above, inside text, plus a whole ANSI sequence. */
const HOSTILE: string[] = [
  ...[...C0, 0x7f, ...C1, ...FORMAT, ...SEPARATORS, ...ASTRAL_FORMAT].map((cp) => `a${String.fromCodePoint(cp)}b`),
  '\u001b[2J\u001b[H10.0.0.1',
  '10.0.0.1\r\nfake-row',
  '\u202e1.0.0.01',
  '\ud800lone',
  'lone\udfff',
];

describe('terminal text (src/render/terminal.ts)', () => {
  it('writes each C0 control, DEL, C1 control, format character and separator as a visible escape', () => {
    const all = [...C0, 0x7f, ...C1, ...FORMAT, ...SEPARATORS, ...ASTRAL_FORMAT];
    assert.equal(all.length, 32 + 1 + 32 + FORMAT.length + 2 + 4);
    for (const cp of all) {
      const c = String.fromCodePoint(cp);
      assert.equal(terminalText(`a${c}b`), `a${expectedEscape(cp)}b`, `U+${hex(cp, 4)}`);
    }
    assert.equal(terminalText('\u001b[31mred\u001b[0m'), '\\x1b[31mred\\x1b[0m');
    assert.equal(terminalText('\u009b2J'), '\\x9b2J');
    assert.equal(terminalText('evil\u202eexe.txt'), 'evil\\u202eexe.txt');
    assert.equal(terminalText('x\ud800y\udc00'), 'x\\ud800y\\udc00', 'lone surrogates');
  });

  it('leaves plain text as it is, non-ASCII letters, symbols and emoji included', () => {
    const plain = [
      '',
      '10.244.1.0/24',
      'fd00::1',
      '0a:58:0a:f4:01:02',
      'vxlan',
      '2026-11-23T03:56:30.747Z',
      'etcd get config (http://10.250.0.254:2379): 14 UNAVAILABLE: No connection established',
      'naïve café → Straße 東京 مرحبا עברית',
      'emoji 🙂 and a pair 𝄞',
      'back\\slash "quotes" \'single\' #hash ~!@$%^&*()_+{}|:<>?[];,./`',
      ' spaces\u00a0and nbsp ',
    ];
    for (const p of plain) assert.equal(terminalText(p), p);
    // Every printable code point of the Basic Multilingual Plane outside the escaped classes.
    let changed = 0;
    for (let cp = 0x20; cp <= 0xffff; cp++) {
      if (cp >= 0xd800 && cp <= 0xdfff) continue;
      const c = String.fromCharCode(cp);
      if (/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u.test(c)) continue;
      if (terminalText(c) !== c) changed++;
    }
    assert.equal(changed, 0);
  });

  it('JSON: same values after parsing, with DEL, C1, format characters and separators escaped', () => {
    for (const v of HOSTILE) {
      const text = terminalJson({ publicIP: v, list: [v] });
      assert.deepEqual(JSON.parse(text), { publicIP: v, list: [v] });
      assertNoRawControls(text, 'JSON');
    }
    assert.equal(terminalJson({ a: 'x\u202ey' }, 0), '{"a":"x\\u202ey"}');
    assert.equal(terminalJson({ a: '\u009b\u007f' }, 0), '{"a":"\\u009b\\u007f"}');
    assert.equal(terminalJson({ a: '\u{e0001}' }, 0), '{"a":"\\udb40\\udc01"}');
    const plain = { subnet: '10.244.1.0/24', note: 'naïve 🙂' };
    assert.equal(terminalJson(plain), JSON.stringify(plain, null, 2));
  });
});

function row(overrides: Partial<LeaseRow>): LeaseRow {
  return { subnet: '10.244.1.0/24', ipv6Subnet: null, publicIP: '192.168.1.1', publicIPv6: null, backendType: 'vxlan', vtepMAC: '0a:58:0a:f4:01:02', expires: 'reserved', ...overrides };
}

describe('weft leases: the table escapes every cell', () => {
  it('prints hostile store values escaped, one lease per line, aligned by the escaped width', () => {
    for (const v of HOSTILE) {
      for (const field of ['subnet', 'ipv6Subnet', 'publicIP', 'backendType', 'vtepMAC', 'expires'] as const) {
        const text = renderTable([row({ [field]: v }), row({})]);
        assertNoRawControls(text, `table with ${field} ${JSON.stringify(v)}`);
        const lines = text.trimEnd().split('\n');
        assert.equal(lines.length, 3, `header + 2 rows for ${field} ${JSON.stringify(v)}`);
        assert.ok(lines[1]!.includes(terminalText(v)));
        // Columns still line up: the second row's cells start where the header's do.
        assert.equal(lines[0]!.indexOf('PUBLIC IP'), lines[2]!.indexOf('192.168.1.1'));
      }
    }
  });

  it('prints plain rows exactly as before', () => {
    assert.equal(
      renderTable([row({})]),
      'SUBNET         IPV6 SUBNET  PUBLIC IP    BACKEND  VTEP MAC           EXPIRES\n10.244.1.0/24  -            192.168.1.1  vxlan    0a:58:0a:f4:01:02  reserved\n',
    );
  });
});

function snapshot(v: string): StatusSnapshot {
  const error = { message: `store said ${v}`, time: '2026-01-01T00:00:00.000Z' };
  return {
    kind: STATUS_KIND,
    version: STATUS_VERSION,
    weftVersion: `0.1.0${v}`,
    time: '2026-01-01T00:00:10.000Z',
    ready: true,
    subnetFile: `/run/flannel/subnet.env${v}`,
    lease: { subnet: `10.244.1.0/24${v}`, ipv6Subnet: null, publicIP: `192.168.1.1${v}`, publicIPv6: null, backendType: `vxlan${v}`, vtepMAC: `0a:58${v}`, reservation: false, expiration: '2026-01-02T00:00:00.000Z' },
    network: { network: `10.244.0.0/16${v}`, ipv6Network: null, backendType: `vxlan${v}` },
    backend: {
      type: `vxlan${v}`,
      peersKnown: 2,
      peersProgrammed: 1,
      peersRejected: 1,
      rejectedPeers: [{ subnet: `8.8.8.0/24${v}`, ipv6Subnet: null, publicIP: `10.0.0.9${v}`, publicIPv6: null, backendType: `vxlan${v}`, vtepMAC: null, vtepMACv6: null, reason: `outside-network${v}`, detail: `detail ${v}`, since: '2026-01-01T00:00:00.000Z' }],
      failures: 0,
      reconcileInterval: 10, lastApply: null, lastReconcile: null, repairs: { added: 0, changed: 0, removed: 0, device: 0 }, lastError: error },
    ipmasq: { masquerade: true, forwardRules: true, mode: `iptables${v}`, resyncSeconds: 5, lastCheck: null, lastRepair: null, checks: 0, repairs: 0, errors: 1, lastRepairProblems: [`problem ${v}`], lastError: error },
  } as unknown as StatusSnapshot;
}

describe('weft status: the text escapes every value', () => {
  it('keeps one labelled line per aspect whatever the daemon reports', () => {
    const plainLines = renderStatus(snapshot('')).split('\n').length;
    for (const v of HOSTILE) {
      const text = renderStatus(snapshot(v));
      assertNoRawControls(text, `status with ${JSON.stringify(v)}`);
      assert.equal(text.split('\n').length, plainLines, `line count with ${JSON.stringify(v)}`);
      assert.ok(text.includes(`public IP 192.168.1.1${terminalText(v)}`), text);
      assert.ok(text.includes(`store said ${terminalText(v)}`), text);
    }
  });
});

describe('weft trace: the text escapes every line', () => {
  it('keeps one line per hop whatever the hops quote', () => {
    const report = (v: string) =>
      ({
        packet: { src: '10.244.1.2', dst: '10.244.2.2', proto: 'icmp', dport: null },
        node: { subnet: `10.244.1.0/24${v}`, network: '10.244.0.0/16', backend: `vxlan${v}`, publicIP: `192.168.1.1${v}`, leaseSource: 'etcd' },
        hops: [{ status: 'ok', kind: 'fdb', summary: `fdb entry to ${v}` }],
        verdict: 'ok',
        problems: [],
        notes: [`note ${v}`],
      }) as unknown as TraceReport;
    const plainLines = renderTrace(report('')).split('\n').length;
    for (const v of HOSTILE) {
      const text = renderTrace(report(v));
      assertNoRawControls(text, `trace with ${JSON.stringify(v)}`);
      assert.equal(text.split('\n').length, plainLines);
      assert.ok(text.includes(`fdb entry to ${terminalText(v)}`));
    }
  });
});
