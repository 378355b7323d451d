import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { etcdConnectOptions, FlagError, leaseTiming, normalizeGoFlags, parseFlags } from '../../src/cli/flags.js';

/** Asserts a FlagError whose message matches `message`. */
function rejects(argv: string[], message: RegExp): void {
  assert.throws(
    () => parseFlags(argv),
    (e: unknown) => {
      assert.ok(e instanceof FlagError, `expected FlagError for ${JSON.stringify(argv)}, got ${String(e)}`);
      assert.equal(e.name, 'FlagError');
      assert.match(e.message, message);
      return true;
    },
  );
}

const pick = (f: ReturnType<typeof parseFlags>) => ({ ipMasq: f.ipMasq, ipMasqConfig: f.ipMasqConfig });

describe('parseFlags', () => {
  // Keep the tests independent of the caller's FLANNELD_* environment, and restore it afterwards.
  let saved: Record<string, string | undefined> = {};
  beforeEach(() => {
    saved = {};
    for (const k of Object.keys(process.env)) {
      if (k.startsWith('FLANNELD_')) {
        saved[k] = process.env[k];
        delete process.env[k];
      }
    }
  });
  afterEach(() => {
    for (const k of Object.keys(process.env)) if (k.startsWith('FLANNELD_')) delete process.env[k];
    for (const [k, v] of Object.entries(saved)) process.env[k] = v;
  });

  it("has flanneld's defaults", () => {
    const f = parseFlags([]);
    assert.deepEqual(f, {
      etcdEndpoints: ['http://127.0.0.1:4001', 'http://127.0.0.1:2379'],
      etcdPrefix: '/coreos.com/network',
      etcdKeyfile: '',
      etcdCertfile: '',
      etcdCafile: '',
      etcdUsername: '',
      etcdPassword: '',
      etcdPasswordFile: '',
      iface: [],
      ifaceRegex: [],
      ifaceCanReach: '',
      subnetFile: '/run/flannel/subnet.env',
      publicIp: '',
      publicIpv6: '',
      subnetLeaseRenewMargin: 60,
      subnetLeaseTTL: 86400,
      subnetLeaseRenewMarginSeconds: 3600,
      ipMasq: false,
      ipMasqConfig: '',
      ipMasqFullyRandomDisable: false,
      kubeSubnetMgr: false,
      kubeApiUrl: '',
      kubeAnnotationPrefix: 'flannel.alpha.coreos.com',
      kubeconfigFile: '',
      networkPolicy: false,
      networkPolicyLog: false,
      healthzIp: '0.0.0.0',
      healthzPort: 0,
      iptablesResync: 5,
      iptablesForwardRules: true,
      ipBlackholeRoute: false,
      netConfigPath: '/etc/kube-flannel/net-conf.json',
      setNodeNetworkUnavailable: true,
      logFormat: 'text',
      logLevel: 'info',
      reconcileInterval: 10,
      serviceCidrs: [],
      cniSocket: '/run/weft/cni.sock',
      v: 0,
      help: false,
      version: false,
    });
  });

  it('--network-policy and --network-policy-log: kube mode only', () => {
    const f = parseFlags(['--kube-subnet-mgr', '--network-policy', '--network-policy-log']);
    assert.deepEqual([f.networkPolicy, f.networkPolicyLog], [true, true]);
    assert.equal(parseFlags(['-kube-subnet-mgr', '-network-policy']).networkPolicy, true);
    assert.equal(parseFlags(['--kube-subnet-mgr', '--network-policy=false']).networkPolicy, false);
    assert.deepEqual(parseFlags(['--service-cidr', '10.96.0.0/12, 10.100.0.0/16']).serviceCidrs.map(String), ['10.96.0.0/12', '10.100.0.0/16']);
    rejects(['--network-policy'], /--network-policy needs --kube-subnet-mgr/);
    rejects(['--network-policy', '--etcd-endpoints=http://x:1'], /--network-policy needs --kube-subnet-mgr/);
    rejects(['--kube-subnet-mgr', '--network-policy-log'], /--network-policy-log needs --network-policy/);
    rejects(['--service-cidr', '10.96.0.1/12'], /--service-cidr: "10.96.0.1\/12" is not an IPv4 prefix without host bits/);
    rejects(['--service-cidr', 'fd00::/108'], /--service-cidr/);
    rejects(['--service-cidr', '10.96.0.0/12,;rm'], /--service-cidr: ";rm"/);
    process.env.FLANNELD_NETWORK_POLICY = 'true';
    rejects([], /--network-policy needs --kube-subnet-mgr/);
    assert.equal(parseFlags(['--kube-subnet-mgr']).networkPolicy, true);
  });

  it('takes Go-style single-dash flags as well as double-dash ones', () => {
    assert.deepEqual(parseFlags(['-etcd-endpoints=http://x:1']).etcdEndpoints, ['http://x:1']);
    assert.equal(parseFlags(['-etcd-prefix', '/p']).etcdPrefix, '/p');
    assert.equal(parseFlags(['-ip-masq']).ipMasq, true);
    assert.equal(parseFlags(['-subnet-lease-renew-margin=30']).subnetLeaseRenewMargin, 30);
    assert.equal(parseFlags(['-kube-subnet-mgr', '-healthz-port=8081']).healthzPort, 8081);
    assert.equal(parseFlags(['-version']).version, true);
    const f = parseFlags(['--public-ip', '10.0.0.1', '--public-ipv6=fd00::1', '--iface-can-reach', '8.8.8.8']);
    assert.deepEqual([f.publicIp, f.publicIpv6, f.ifaceCanReach], ['10.0.0.1', 'fd00::1', '8.8.8.8']);
  });

  it('normalizeGoFlags turns Go single-dash long flags into double-dash ones', () => {
    assert.deepEqual(normalizeGoFlags(['-etcd-prefix=/x', '-iface', 'eth0', '-v', '4', '-unknown-flag', '--ip-masq', 'value']), [
      '--etcd-prefix=/x',
      '--iface',
      'eth0',
      '-v',
      '4',
      '--unknown-flag',
      '--ip-masq',
      'value',
    ]);
  });

  it('booleans: bare flag is true, --flag=false turns it off', () => {
    assert.equal(parseFlags(['--ip-masq']).ipMasq, true);
    assert.equal(parseFlags(['--ip-masq=false']).ipMasq, false);
    assert.equal(parseFlags(['--ip-masq=true']).ipMasq, true);
    assert.equal(parseFlags(['--iptables-forward-rules=false']).iptablesForwardRules, false);
    assert.equal(parseFlags(['-set-node-network-unavailable=false']).setNodeNetworkUnavailable, false);
    assert.equal(parseFlags(['--ip-masq', '--ip-masq=false']).ipMasq, false, 'the last one wins');
  });

  it('--etcd-endpoints and --iface take comma lists and repeats, in order', () => {
    assert.deepEqual(parseFlags(['--etcd-endpoints', 'http://a:1,http://b:2', '--etcd-endpoints=http://c:3']).etcdEndpoints, [
      'http://a:1',
      'http://b:2',
      'http://c:3',
    ]);
    assert.deepEqual(parseFlags(['--etcd-endpoints=https://a:2379, https://b:2379']).etcdEndpoints, ['https://a:2379', 'https://b:2379']);
    assert.deepEqual(parseFlags(['--iface', 'eth0', '--iface=eth1,eth2', '-iface', '10.0.0.1']).iface, ['eth0', 'eth1', 'eth2', '10.0.0.1']);
    // A regex may contain commas, so --iface-regex is repeat-only.
    assert.deepEqual(parseFlags(['--iface-regex', 'eth[0-9]{1,2}', '--iface-regex', '^en']).ifaceRegex, ['eth[0-9]{1,2}', '^en']);
  });

  it('reads FLANNELD_* environment variables; the command line wins', () => {
    process.env.FLANNELD_ETCD_PREFIX = '/env/prefix';
    process.env.FLANNELD_ETCD_ENDPOINTS = 'http://e1:2379,http://e2:2379';
    process.env.FLANNELD_IP_MASQ = 'true';
    process.env.FLANNELD_IFACE = 'eth9';
    process.env.FLANNELD_SUBNET_LEASE_RENEW_MARGIN = '120';
    process.env.FLANNELD_HEALTHZ_PORT = '8081';
    const f = parseFlags([]);
    assert.equal(f.etcdPrefix, '/env/prefix');
    assert.deepEqual(f.etcdEndpoints, ['http://e1:2379', 'http://e2:2379']);
    assert.equal(f.ipMasq, true);
    assert.deepEqual(f.iface, ['eth9']);
    assert.equal(f.subnetLeaseRenewMargin, 120);
    assert.equal(f.healthzPort, 8081);
    assert.equal(parseFlags(['--etcd-prefix=/cli']).etcdPrefix, '/cli');
    assert.equal(parseFlags(['--ip-masq=false']).ipMasq, false);
  });

  it('validates environment values like flags', () => {
    process.env.FLANNELD_SUBNET_LEASE_RENEW_MARGIN = '0';
    rejects([], /^--subnet-lease-renew-margin 0: must be an integer from 1 to 1439$/);
  });

  it('--subnet-lease-renew-margin must be 1..1439', () => {
    rejects(['--subnet-lease-renew-margin', '0'], /^--subnet-lease-renew-margin 0: must be an integer from 1 to 1439$/);
    rejects(['--subnet-lease-renew-margin', '1440'], /^--subnet-lease-renew-margin 1440: must be an integer from 1 to 1439$/);
    rejects(['--subnet-lease-renew-margin=-5'], /--subnet-lease-renew-margin/);
    rejects(['--subnet-lease-renew-margin', '1.5'], /--subnet-lease-renew-margin/);
    rejects(['--subnet-lease-renew-margin', 'soon'], /--subnet-lease-renew-margin/);
    assert.equal(parseFlags(['--subnet-lease-renew-margin', '1']).subnetLeaseRenewMargin, 1);
    assert.equal(parseFlags(['--subnet-lease-renew-margin', '1439']).subnetLeaseRenewMargin, 1439);
  });

  describe('--subnet-lease-ttl', () => {
    const timing = (f: ReturnType<typeof parseFlags>) => [f.subnetLeaseTTL, f.subnetLeaseRenewMarginSeconds];

    it("is flannel's 24 h with a 60-minute margin by default", () => {
      assert.deepEqual(timing(parseFlags([])), [86400, 3600]);
      assert.deepEqual(leaseTiming(undefined, undefined), { ttl: 86400, margin: 3600 });
    });

    it('takes Go durations, from the command line or FLANNELD_SUBNET_LEASE_TTL', () => {
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '6h'])), [21600, 3600]);
      assert.deepEqual(timing(parseFlags(['-subnet-lease-ttl=1h30m'])), [5400, 2700], 'the margin defaults to half a TTL under 2 h');
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl=1.5h'])), [5400, 2700]);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '90s'])), [90, 45]);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '25s'])), [25, 12]);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '2h', '--subnet-lease-ttl', '3h'])), [10800, 3600], 'the last one wins');
      process.env.FLANNELD_SUBNET_LEASE_TTL = '10m';
      assert.deepEqual(timing(parseFlags([])), [600, 300]);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl=20m'])), [1200, 600], 'the command line wins');
    });

    it('keeps a given margin, which must be below the TTL', () => {
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '30m', '--subnet-lease-renew-margin', '10'])), [1800, 600]);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '2m', '--subnet-lease-renew-margin', '1'])), [120, 60]);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-renew-margin', '120'])), [86400, 7200]);
      rejects(
        ['--subnet-lease-ttl', '30m', '--subnet-lease-renew-margin', '30'],
        /^--subnet-lease-renew-margin 30 \(minutes\) must be below --subnet-lease-ttl 30m \(1800s\): /,
      );
      rejects(['--subnet-lease-ttl', '45s', '--subnet-lease-renew-margin', '1'], /^--subnet-lease-renew-margin 1 \(minutes\) must be below --subnet-lease-ttl 45s \(45s\)/);
      process.env.FLANNELD_SUBNET_LEASE_RENEW_MARGIN = '60';
      rejects(['--subnet-lease-ttl', '1h'], /must be below --subnet-lease-ttl 1h/);
    });

    it('rejects what is not a duration of whole seconds between 20 s and etcd\'s maximum', () => {
      rejects(['--subnet-lease-ttl', '3600'], /^--subnet-lease-ttl "3600": not a duration \(write it as Go does: 24h, 30m, 1h30m, 90s\)$/);
      rejects(['--subnet-lease-ttl', '1d'], /not a duration/);
      rejects(['--subnet-lease-ttl', ''], /subnet-lease-ttl/);
      rejects(['--subnet-lease-ttl', '-1h'], /must be at least 20s/);
      rejects(['--subnet-lease-ttl', '0'], /^--subnet-lease-ttl "0": must be at least 20s, /);
      rejects(['--subnet-lease-ttl', '19s'], /must be at least 20s/);
      rejects(['--subnet-lease-ttl', '20500ms'], /^--subnet-lease-ttl "20500ms": must be a whole number of seconds/);
      rejects(['--subnet-lease-ttl', '3000000h'], /etcd takes at most 9000000000s/);
      rejects(['--subnet-lease-ttl'], /subnet-lease-ttl/);
      assert.deepEqual(timing(parseFlags(['--subnet-lease-ttl', '20s'])), [20, 10]);
    });
  });

  it('--healthz-port must be a port number', () => {
    rejects(['--healthz-port', '65536'], /^--healthz-port 65536: must be 0\.\.65535$/);
    rejects(['--healthz-port', '-1'], /--healthz-port/);
    assert.equal(parseFlags(['--healthz-port', '65535']).healthzPort, 65535);
  });

  it('rejects unknown flags and stray arguments', () => {
    rejects(['--bogus'], /^Unknown argument: bogus$/);
    rejects(['--etcd-endpoint=http://x:1'], /etcd-endpoint/);
    rejects(['stray'], /stray/);
    rejects(['--etcd_endpoints', 'http://q:1'], /etcd_endpoints/);
  });

  it('names a mistyped Go-style single-dash flag in the error', () => {
    // flanneld would say "flag provided but not defined: -etcd-endpont"; yargs splits it into
    // short flags and reports "Unknown arguments: e, t, c, d".
    rejects(['-etcd-endpont=http://x:1'], /etcd-endpont/);
    rejects(['-bogus'], /bogus/);
  });

  it('--log-level, -v and --log-format', () => {
    assert.equal(parseFlags(['--log-level', 'debug']).logLevel, 'debug');
    assert.equal(parseFlags(['--log-level=error']).logLevel, 'error');
    const v4 = parseFlags(['-v', '4']);
    assert.equal(v4.logLevel, 'debug');
    assert.equal(v4.v, 4);
    assert.equal(parseFlags(['-v=10']).logLevel, 'debug');
    assert.equal(parseFlags(['-v', '3']).logLevel, 'info');
    assert.equal(parseFlags(['--log-level=warn', '-v', '2']).logLevel, 'warn');
    assert.equal(parseFlags(['--log-format', 'json']).logFormat, 'json');
    rejects(['--log-format', 'xml'], /log-format.*xml/s);
    rejects(['--log-level', 'trace'], /log-level.*trace/s);
  });

  it('a repeated single-valued flag keeps the last value, like Go flag', () => {
    // yargs collects repeats into an array, which breaks the declared string/number types.
    assert.equal(parseFlags(['--etcd-prefix', '/a', '--etcd-prefix', '/b']).etcdPrefix, '/b');
    assert.equal(parseFlags(['--subnet-file', '/a', '--subnet-file=/b']).subnetFile, '/b');
    assert.equal(parseFlags(['--log-level', 'info', '--log-level', 'debug']).logLevel, 'debug');
    assert.equal(parseFlags(['--healthz-port', '1', '--healthz-port', '2']).healthzPort, 2);
  });

  it('--ip-masq-config selects ip-masq-agent mode, from the command line or FLANNELD_IP_MASQ_CONFIG', () => {
    assert.equal(parseFlags(['--ip-masq-config', '/etc/config/ip-masq-agent']).ipMasqConfig, '/etc/config/ip-masq-agent');
    assert.equal(parseFlags(['-ip-masq-config=/a', '--ip-masq-config=/b']).ipMasqConfig, '/b');
    process.env.FLANNELD_IP_MASQ_CONFIG = '/env/ip-masq-agent';
    assert.equal(parseFlags([]).ipMasqConfig, '/env/ip-masq-agent');
    rejects(['--ip-masq-config'], /ip-masq-config/);
  });

  it('--ip-masq and --ip-masq-config are exclusive, however they are given', () => {
    const msg = /^--ip-masq and --ip-masq-config are exclusive: --ip-masq installs flannel's masquerade rules, --ip-masq-config ip-masq-agent's; choose one$/;
    rejects(['--ip-masq', '--ip-masq-config', '/x'], msg);
    rejects(['-ip-masq-config=/x', '-ip-masq'], msg);
    process.env.FLANNELD_IP_MASQ = 'true';
    rejects(['--ip-masq-config=/x'], msg);
    // Turning one off is fine.
    assert.deepEqual(pick(parseFlags(['--ip-masq-config=/x', '--ip-masq=false'])), { ipMasq: false, ipMasqConfig: '/x' });
  });

  it('--cni-socket: an absolute path that fits a unix socket, or empty to disable the CNI server', () => {
    assert.equal(parseFlags(['--cni-socket', '/tmp/x/cni.sock']).cniSocket, '/tmp/x/cni.sock');
    assert.equal(parseFlags(['--cni-socket=']).cniSocket, '');
    assert.equal(parseFlags(['--cni-socket', '']).cniSocket, '');
    assert.equal(parseFlags(['--cni-socket=/a.sock', '--cni-socket=/b.sock']).cniSocket, '/b.sock');
    rejects(['--cni-socket', 'relative.sock'], /absolute path/);
    rejects(['--cni-socket', `/${'x'.repeat(107)}`], /at most 107 bytes/);
  });

  it('a value flag without its value is an error, like Go flag ("flag needs an argument")', () => {
    rejects(['--etcd-prefix'], /etcd-prefix/);
    rejects(['--subnet-file'], /subnet-file/);
    rejects(['--etcd-prefix', '--ip-masq'], /etcd-prefix/);
  });

  describe('the etcd password', () => {
    let dir = '';
    before(() => {
      dir = mkdtempSync(join(tmpdir(), 'weft-flags-'));
    });
    after(() => rmSync(dir, { recursive: true, force: true }));
    const file = (name: string, content: string, mode = 0o600): string => {
      const path = join(dir, name);
      writeFileSync(path, content, { mode });
      return path;
    };
    /**
     * What a message about a file without a password in it must not show — a string no temp
     * directory name can contain (a single letter once matched one: mkdtemp's random part).
     */
    const NO_CONTENT = '<no-content>';
    /** A FlagError matching `message` whose text does not leak `secret`. */
    const rejectsWithout = (argv: string[], message: RegExp, secret: string) => {
      assert.throws(
        () => parseFlags(argv),
        (e: unknown) => {
          assert.ok(e instanceof FlagError, String(e));
          assert.match(e.message, message);
          assert.ok(!e.message.includes(secret), `the message shows the password: ${e.message}`);
          return true;
        },
      );
    };

    it('FLANNELD_ETCD_PASSWORD sets it, like --etcd-password, and reaches the etcd options', () => {
      process.env.FLANNELD_ETCD_USERNAME = 'weft';
      process.env.FLANNELD_ETCD_PASSWORD = 's3cret pw';
      const f = parseFlags([]);
      assert.deepEqual([f.etcdUsername, f.etcdPassword, f.etcdPasswordFile], ['weft', 's3cret pw', '']);
      const o = etcdConnectOptions(f);
      assert.deepEqual([o.username, o.password], ['weft', 's3cret pw']);
      assert.equal(parseFlags(['--etcd-password', 'cli']).etcdPassword, 'cli', 'the command line wins');
    });

    it('--etcd-password-file reads the file at start, without one trailing newline', () => {
      assert.equal(parseFlags(['--etcd-password-file', file('lf', 'pw-lf\n')]).etcdPassword, 'pw-lf');
      assert.equal(parseFlags(['--etcd-password-file', file('crlf', 'pw-crlf\r\n')]).etcdPassword, 'pw-crlf');
      assert.equal(parseFlags([`-etcd-password-file=${file('bare', 'pw bare')}`]).etcdPassword, 'pw bare');
      assert.equal(parseFlags(['--etcd-password-file', file('spaces', '  pw with spaces  \n')]).etcdPassword, '  pw with spaces  ', 'only the line break goes');
      assert.equal(parseFlags(['--etcd-password-file', file('utf8', 'pässwörd🙂\n')]).etcdPassword, 'pässwörd🙂');
      const f = parseFlags(['--etcd-password-file', file('lf', 'pw-lf\n')]);
      assert.equal(f.etcdPasswordFile, join(dir, 'lf'));
      assert.equal(etcdConnectOptions(f).password, 'pw-lf');
    });

    it('FLANNELD_ETCD_PASSWORD_FILE works as the flag does', () => {
      process.env.FLANNELD_ETCD_PASSWORD_FILE = file('env', 'from-env-file\n');
      assert.equal(parseFlags([]).etcdPassword, 'from-env-file');
    });

    it('is exclusive with --etcd-password, however each is given', () => {
      const path = file('x', 'file-secret\n');
      const msg = /^--etcd-password and --etcd-password-file are exclusive/;
      rejectsWithout(['--etcd-password', 'cli-secret', '--etcd-password-file', path], msg, 'cli-secret');
      process.env.FLANNELD_ETCD_PASSWORD = 'env-secret';
      rejectsWithout(['--etcd-password-file', path], msg, 'env-secret');
      delete process.env.FLANNELD_ETCD_PASSWORD;
      process.env.FLANNELD_ETCD_PASSWORD_FILE = path;
      rejectsWithout(['--etcd-password', 'cli-secret'], msg, 'cli-secret');
    });

    it('an unreadable, empty or multi-line file is a flag error naming the file, never the content', () => {
      rejectsWithout(['--etcd-password-file', join(dir, 'missing')], new RegExp(`^--etcd-password-file ${join(dir, 'missing')}: cannot read it: no such file$`), NO_CONTENT);
      mkdirSync(join(dir, 'adir'));
      rejectsWithout(['--etcd-password-file', join(dir, 'adir')], /: cannot read it: is a directory$/, NO_CONTENT);
      rejectsWithout(['--etcd-password-file', file('empty', '')], /: the file is empty$/, NO_CONTENT);
      rejectsWithout(['--etcd-password-file', file('nl', '\n')], /: the file is empty$/, NO_CONTENT);
      rejectsWithout(['--etcd-password-file', file('two', 'line-one-secret\nline-two-secret\n')], /: holds more than one line/, 'secret');
      rejectsWithout(['--etcd-password-file', file('cr', 'cr-secret\rmore')], /: holds more than one line/, 'secret');
      rejects(['--etcd-password-file'], /etcd-password-file/);
      // A path through a regular file: unreadable for root too (ENOTDIR, reported with the system's words).
      rejectsWithout(['--etcd-password-file', join(file('plain', 'plain-secret\n'), 'below')], /: cannot read it: ENOTDIR: not a directory/, 'plain-secret');
    });
  });
});
