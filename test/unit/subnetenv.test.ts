import assert from 'node:assert/strict';
import { link, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { NO_WEFT_LINES, parseSubnetEnv as parseLines, previousSubnets, renderSubnetEnv, type PreviousSubnets, type SubnetEnv } from '../../src/subnetenv/format.js';
import { readPreviousSubnets, SubnetFileError } from '../../src/subnetenv/read.js';
import { writeSubnetEnv } from '../../src/subnetenv/write.js';
import { IPNet } from '../../src/util/ip.js';

const net = (s: string): IPNet => IPNet.parse(s);

// flannel's documented dual-stack example (Documentation/configuration.md).
const DUAL: SubnetEnv = {
  networks: [net('10.42.0.0/16')],
  subnet: net('10.42.0.0/24'),
  ipv6Networks: [net('2001:cafe:42::/56')],
  ipv6Subnet: net('2001:cafe:42::/64'),
  mtu: 1450,
  ipMasq: true,
  weft: NO_WEFT_LINES,
};
const DUAL_TEXT =
  'FLANNEL_NETWORK=10.42.0.0/16\n' +
  'FLANNEL_SUBNET=10.42.0.1/24\n' +
  'FLANNEL_IPV6_NETWORK=2001:cafe:42::/56\n' +
  'FLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\n' +
  'FLANNEL_MTU=1450\n' +
  'FLANNEL_IPMASQ=true\n';

const V4: SubnetEnv = { ...DUAL, ipv6Networks: [], ipv6Subnet: null, mtu: 1472, ipMasq: false };

/** weftd's reading of its previous subnets. */
const parseSubnetEnv = (text: string): PreviousSubnets => previousSubnets(parseLines(text));

/** Comparable form of PreviousSubnets. */
function show(p: PreviousSubnets): Record<string, string | null> {
  return {
    network: p.network?.toString() ?? null,
    subnet: p.subnet?.toString() ?? null,
    ipv6Network: p.ipv6Network?.toString() ?? null,
    ipv6Subnet: p.ipv6Subnet?.toString() ?? null,
  };
}

const NONE = { network: null, subnet: null, ipv6Network: null, ipv6Subnet: null };

describe('subnetenv: render', () => {
  it('renders the dual-stack example exactly', () => {
    assert.equal(renderSubnetEnv(DUAL), DUAL_TEXT);
  });

  it('renders IPv4 only', () => {
    assert.equal(
      renderSubnetEnv({ ...V4, networks: [net('10.1.0.0/16')], subnet: net('10.1.74.0/24') }),
      'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n',
    );
  });

  it('renders IPv6 only', () => {
    assert.equal(
      renderSubnetEnv({ ...DUAL, networks: [], subnet: null }),
      'FLANNEL_IPV6_NETWORK=2001:cafe:42::/56\nFLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\n' +
        'FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n',
    );
  });

  it('rejects a wrong family or a bad MTU', () => {
    assert.throws(() => renderSubnetEnv({ ...DUAL, subnet: net('fd00::/64') }), {
      name: 'RangeError',
      message: 'subnet must be an IPv4 prefix, got fd00::/64',
    });
    assert.throws(() => renderSubnetEnv({ ...DUAL, mtu: 0 }), {
      name: 'RangeError',
      message: 'mtu must be a positive integer, got 0',
    });
  });
});

describe('subnetenv: parse', () => {
  it('reads back the network of the written gateway address', () => {
    assert.deepEqual(show(parseSubnetEnv(DUAL_TEXT)), {
      network: '10.42.0.0/16',
      subnet: '10.42.0.0/24',
      ipv6Network: '2001:cafe:42::/56',
      ipv6Subnet: '2001:cafe:42::/64',
    });
  });

  it('ignores blanks and comments, strips quotes, export and inline comments', () => {
    const text = [
      '# written by weft',
      '',
      '   ',
      'export FLANNEL_NETWORK="10.5.0.0/16"',
      "FLANNEL_SUBNET='10.5.3.1/24'",
      'FLANNEL_IPV6_NETWORK = fd00:5::/48   # trailing comment',
      '\tFLANNEL_IPV6_SUBNET=fd00:5:0:3::1/64\r',
      '#FLANNEL_NETWORK=10.99.0.0/16',
      'FLANNEL_MTU=1450',
    ].join('\n');
    assert.deepEqual(show(parseSubnetEnv(text)), {
      network: '10.5.0.0/16',
      subnet: '10.5.3.0/24',
      ipv6Network: 'fd00:5::/48',
      ipv6Subnet: 'fd00:5:0:3::/64',
    });
  });

  it('skips invalid list entries and treats more than one valid entry as none', () => {
    assert.deepEqual(
      show(parseSubnetEnv('FLANNEL_SUBNET=not-a-cidr, 10.244.1.1/24 ,10.244.2.300/24\n')),
      { ...NONE, subnet: '10.244.1.0/24' },
    );
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_SUBNET=10.244.1.0/24,not-a-cidr,10.244.2.0/24\n')), NONE);
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_IPV6_SUBNET=fd00::/64,not-a-cidr,fd01::/64\n')), NONE);
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_SUBNET=not-a-cidr\n')), NONE);
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_SUBNET=\n')), NONE);
  });

  it('requires the family of the variable', () => {
    assert.deepEqual(
      show(parseSubnetEnv('FLANNEL_SUBNET=2001:cafe:42::1/64\nFLANNEL_IPV6_SUBNET=10.42.0.1/24\n')),
      NONE,
    );
    // A wrong-family entry in a list is just an invalid entry.
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_NETWORK=fd00::/48,10.42.0.0/16\n')), {
      ...NONE,
      network: '10.42.0.0/16',
    });
  });

  it('never throws on garbage', () => {
    for (const text of ['', '=', '====', '\u0000\u0001', 'FLANNEL_SUBNET', 'FLANNEL_SUBNET==10.0.0.1/24', '"']) {
      assert.deepEqual(show(parseSubnetEnv(text)), NONE, JSON.stringify(text));
    }
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_SUBNET=10.0.0.1/33\nFLANNEL_NETWORK=10.0.0.0\n')), NONE);
  });

  it('the last assignment of a key wins', () => {
    assert.deepEqual(show(parseSubnetEnv('FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_NETWORK=10.2.0.0/16\n')), {
      ...NONE,
      network: '10.2.0.0/16',
    });
  });
});

describe('subnetenv: files', () => {
  let dir = '';

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weft-subnetenv-'));
  });
  after(async () => {
    if (dir !== '') await rm(dir, { recursive: true, force: true });
  });

  it('writes, creates the parent directories, and reads back', async () => {
    const path = join(dir, 'rw', 'run', 'flannel', 'subnet.env');
    await writeSubnetEnv(path, DUAL);
    assert.equal(await readFile(path, 'utf8'), DUAL_TEXT);
    assert.deepEqual(await readdir(join(dir, 'rw', 'run', 'flannel')), ['subnet.env']);
    assert.deepEqual(show(await readPreviousSubnets(path)), {
      network: '10.42.0.0/16',
      subnet: '10.42.0.0/24',
      ipv6Network: '2001:cafe:42::/56',
      ipv6Subnet: '2001:cafe:42::/64',
    });
  });

  it('a missing file reads as no previous subnets', async () => {
    assert.deepEqual(show(await readPreviousSubnets(join(dir, 'does-not-exist', 'subnet.env'))), NONE);
  });

  it('an unreadable path is a SubnetFileError', async () => {
    const path = join(dir, 'is-a-dir');
    await mkdir(path);
    await assert.rejects(readPreviousSubnets(path), (e: unknown) => {
      assert.ok(e instanceof SubnetFileError);
      assert.equal(e.path, path);
      assert.match(e.message, new RegExp(`^cannot read subnet file ${path}: EISDIR`));
      return true;
    });
  });

  it('uses mode 0644 and 0755 directories regardless of umask', async () => {
    const path = join(dir, 'umask', 'a', 'subnet.env');
    const old = process.umask(0o077);
    try {
      await writeSubnetEnv(path, V4);
    } finally {
      process.umask(old);
    }
    assert.equal((await stat(path)).mode & 0o7777, 0o644);
    assert.equal((await stat(join(dir, 'umask', 'a'))).mode & 0o7777, 0o755);
    assert.equal((await stat(join(dir, 'umask'))).mode & 0o7777, 0o755);
  });

  it('fails with SubnetFileError when the parent is a regular file, leaving nothing behind', async () => {
    const blocker = join(dir, 'blocker');
    await writeFile(blocker, 'x');
    const path = join(blocker, 'sub', 'subnet.env');
    await assert.rejects(writeSubnetEnv(path, V4), (e: unknown) => {
      assert.ok(e instanceof SubnetFileError);
      assert.equal(e.path, path);
      assert.equal(e.message.includes('\n'), false);
      assert.match(e.message, new RegExp(`^cannot write subnet file ${path}: ENOTDIR`));
      return true;
    });
    assert.equal(await readFile(blocker, 'utf8'), 'x');
    assert.deepEqual((await readdir(dir)).filter((n) => n.includes('.tmp-')), []);
  });

  it('removes its temp file when the final rename fails', async () => {
    const d = join(dir, 'rename-fails');
    const path = join(d, 'subnet.env');
    // A non-empty directory at the target: the temp file is written, the rename is refused.
    await mkdir(join(path, 'inner'), { recursive: true });
    await assert.rejects(writeSubnetEnv(path, V4), (e: unknown) => {
      assert.ok(e instanceof SubnetFileError);
      assert.match(e.message, new RegExp(`^cannot write subnet file ${path}: E(ISDIR|NOTEMPTY|EXIST)`));
      return true;
    });
    assert.deepEqual(await readdir(d), ['subnet.env']);
    assert.deepEqual(await readdir(path), ['inner']);
  });

  it('replaces an existing file atomically: readers see old or new, never partial', async () => {
    const d = join(dir, 'replace');
    const path = join(d, 'subnet.env');
    await writeSubnetEnv(path, V4);
    const oldText = renderSubnetEnv(V4);
    // A hard link keeps the old inode: a rename leaves it untouched, an in-place rewrite would not.
    await link(path, join(d, 'old-inode'));

    const texts = [oldText, DUAL_TEXT];
    let writing = true;
    const seen = new Set<string>();
    const reader = (async () => {
      while (writing) {
        const t = await readFile(path, 'utf8');
        assert.ok(texts.includes(t), `partial or unexpected content: ${JSON.stringify(t)}`);
        seen.add(t);
      }
    })();
    try {
      for (let i = 0; i < 40; i++) await writeSubnetEnv(path, i % 2 === 0 ? DUAL : V4);
      await writeSubnetEnv(path, DUAL);
    } finally {
      writing = false;
    }
    await reader;

    assert.equal(await readFile(path, 'utf8'), DUAL_TEXT);
    assert.equal(await readFile(join(d, 'old-inode'), 'utf8'), oldText);
    assert.ok(seen.size >= 1);
    assert.deepEqual((await readdir(d)).sort(), ['old-inode', 'subnet.env']);
    assert.equal((await stat(path)).mode & 0o7777, 0o644);
  });
});
