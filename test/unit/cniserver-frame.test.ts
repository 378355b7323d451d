// The CNI server's framing and request validation (src/cniserver/frame.ts): lengths, limits and
// every way a request can be malformed, each with its CNI error code.
import assert from 'node:assert/strict';
import {
  encodeFrame,
  errorReply,
  HEADER_BYTES,
  MAX_FRAME_BYTES,
  MAX_STDIN_BYTES,
  NOT_SERVING,
  parseReplyBody,
  parseRequestBody,
  ProtocolError,
  readFrame,
  serverErrorText,
  statusReply,
} from '../../src/cniserver/frame.js';

const body = (v: unknown): Buffer => Buffer.from(JSON.stringify(v), 'utf8');
const good = { v: 1, plugin: 'flannel', env: { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1' }, stdin: '{"cniVersion":"1.0.0"}' };

function refused(b: Uint8Array): ProtocolError {
  try {
    parseRequestBody(b);
  } catch (e) {
    assert.ok(e instanceof ProtocolError, `not a ProtocolError: ${String(e)}`);
    return e;
  }
  assert.fail('accepted');
}

describe('CNI server framing', () => {
  it('a frame is a 4-byte big-endian length and the JSON', () => {
    const f = encodeFrame({ a: 1 });
    assert.equal(f.readUInt32BE(0), f.length - HEADER_BYTES);
    assert.equal(f.subarray(HEADER_BYTES).toString(), '{"a":1}');
    const r = readFrame(f);
    assert.equal(r.kind, 'complete');
    assert.deepEqual(r.kind === 'complete' ? JSON.parse(r.body.toString()) : null, { a: 1 });
  });

  it('reads nothing from a partial header or body, and ignores bytes after the frame', () => {
    const f = encodeFrame({ hello: 'world' });
    for (let n = 0; n < f.length; n++) assert.equal(readFrame(f.subarray(0, n)).kind, 'incomplete', `at ${n} bytes`);
    const r = readFrame(Buffer.concat([f, Buffer.from('trailing')]));
    assert.equal(r.kind === 'complete' ? r.body.toString() : '', '{"hello":"world"}');
  });

  it('refuses an announced length above the limit from the header alone', () => {
    const h = Buffer.alloc(4);
    h.writeUInt32BE(MAX_FRAME_BYTES + 1, 0);
    assert.deepEqual(readFrame(h), { kind: 'oversize', length: MAX_FRAME_BYTES + 1 });
    h.writeUInt32BE(0xffffffff, 0);
    assert.equal(readFrame(h).kind, 'oversize');
    h.writeUInt32BE(MAX_FRAME_BYTES, 0);
    assert.equal(readFrame(h).kind, 'incomplete');
    assert.equal(readFrame(Buffer.from([0, 0, 0, 0])).kind, 'complete'); // an empty body: refused by the parser
  });

  it('will not encode a reply over the limit', () => {
    assert.throws(() => encodeFrame({ s: 'x'.repeat(MAX_FRAME_BYTES) }), RangeError);
  });

  it('accepts a well-formed request and keeps only what it names', () => {
    const r = parseRequestBody(body({ ...good, extra: 'ignored' }));
    assert.deepEqual(r, { plugin: 'flannel', env: { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1' }, stdin: good.stdin });
    // Any CNI_* variable a runtime has is taken (the plugins read only the spec's).
    assert.deepEqual(parseRequestBody(body({ ...good, env: { 'CNI_odd-name.x': 'v', CNI_: '' } })).env, { 'CNI_odd-name.x': 'v', CNI_: '' });
    assert.equal(Object.getPrototypeOf(r.env), Object.prototype);
  });

  it('accepts a config of exactly the stdin limit inside a frame of the frame limit', () => {
    const stdin = 'x'.repeat(MAX_STDIN_BYTES);
    const b = body({ ...good, stdin });
    assert.ok(b.length <= MAX_FRAME_BYTES, 'b.length <= MAX_FRAME_BYTES');
    assert.equal(parseRequestBody(b).stdin.length, MAX_STDIN_BYTES);
  });

  const cases: Array<[string, Uint8Array, number, RegExp]> = [
    ['empty body', Buffer.alloc(0), 6, /not JSON/],
    ['invalid UTF-8', Buffer.from([0x7b, 0xff, 0xfe, 0x7d]), 6, /not UTF-8/],
    ['not JSON', Buffer.from('{"v":1,'), 6, /not JSON/],
    ['a JSON array', body([1, 2]), 6, /not a JSON object/],
    ['null', body(null), 6, /not a JSON object/],
    ['no version', body({ ...good, v: undefined }), 6, /no protocol version/],
    ['version 2', body({ ...good, v: 2 }), 1, /unsupported CNI server protocol version 2/],
    ['version "1"', body({ ...good, v: '1' }), 1, /version "1"/],
    ['plugin not a string', body({ ...good, plugin: 7 }), 6, /"plugin" must be a string/],
    ['plugin with a slash', body({ ...good, plugin: '../bridge' }), 4, /invalid plugin name/],
    ['plugin empty', body({ ...good, plugin: '' }), 4, /invalid plugin name/],
    ['env an array', body({ ...good, env: [] }), 6, /"env" must be an object/],
    ['env with PATH', body({ ...good, env: { ...good.env, PATH: '/tmp' } }), 4, /only CNI_\* variables/],
    ['env with LD_PRELOAD', body({ ...good, env: { LD_PRELOAD: '/x.so' } }), 4, /only CNI_\*/],
    ['env with __proto__', Buffer.from('{"v":1,"plugin":"bridge","env":{"__proto__":{"x":1}},"stdin":""}'), 4, /only CNI_\*/],
    ['env key with "="', body({ ...good, env: { 'CNI_A=B': 'x' } }), 4, /invalid env variable/],
    ['env value a number', body({ ...good, env: { CNI_COMMAND: 1 } }), 4, /must be a string/],
    ['env value with NUL', body({ ...good, env: { CNI_ARGS: 'a\u0000b' } }), 4, /NUL/],
    ['too many env entries', body({ ...good, env: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`CNI_X${i}`, ''])) }), 4, /too many env/],
    ['stdin missing', body({ ...good, stdin: undefined }), 6, /"stdin" must be a string/],
    ['stdin over the limit', body({ ...good, stdin: 'é'.repeat(MAX_STDIN_BYTES / 2 + 1) }), 5, /network config too large/],
  ];
  for (const [what, b, code, msg] of cases) {
    it(`refuses ${what} with code ${code}`, () => {
      const e = refused(b);
      assert.equal(e.code, code);
      assert.match(e.message, msg);
    });
  }

  it('an error reply is exit status 1 with a CNI error (cniVersion, code, msg, details) on stdout', () => {
    const r = errorReply(new ProtocolError(5, 'request too large: 9 bytes', 'at most 8'));
    assert.ok('status' in r, '\'status\' in r');
    assert.equal(r.status, 1);
    assert.deepEqual(JSON.parse(r.stdout), { cniVersion: '1.0.0', code: 5, msg: 'request too large: 9 bytes', details: 'at most 8' });
    assert.deepEqual(JSON.parse(serverErrorText(11, 'later')), { cniVersion: '1.0.0', code: 11, msg: 'later' });
  });

  it('replies round-trip; a reply that is not one is refused', () => {
    const frames = [statusReply(0, '{"cniVersion":"1.0.0"}', 'warn\n'), NOT_SERVING];
    for (const r of frames) {
      const f = readFrame(encodeFrame(r));
      assert.ok(f.kind === 'complete', 'f.kind === \'complete\'');
      assert.deepEqual(parseReplyBody(f.body), r);
    }
    assert.throws(() => parseReplyBody(body({ v: 1, status: 256, stdout: '', stderr: '' })), ProtocolError);
    assert.throws(() => parseReplyBody(body({ v: 2, status: 0, stdout: '', stderr: '' })), ProtocolError);
    assert.throws(() => parseReplyBody(body({ v: 1, status: 0, stdout: 1, stderr: '' })), ProtocolError);
  });
});
