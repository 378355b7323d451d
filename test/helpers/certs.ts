// A throwaway PKI made with openssl: a CA, a server cert for 127.0.0.1, a client cert, and an unrelated
// second CA for negative tests. EC P-256 keys keep generation fast.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export class OpensslError extends Error {
  constructor(
    readonly args: readonly string[],
    readonly stderr: string,
  ) {
    super(`openssl ${args.join(' ')} failed: ${stderr.trim()}`);
    this.name = 'OpensslError';
  }
}

export interface TestPki {
  readonly dir: string;
  readonly caFile: string;
  readonly caKeyFile: string;
  /** Server cert for IP:127.0.0.1 and DNS:localhost; also usable as a client cert (etcd dials itself with it). */
  readonly serverCertFile: string;
  readonly serverKeyFile: string;
  readonly clientCertFile: string;
  readonly clientKeyFile: string;
  /** A CA that signed none of the above. */
  readonly otherCaFile: string;
  readonly otherCaKeyFile: string;
  /** A client cert signed by the other CA. */
  readonly otherClientCertFile: string;
  readonly otherClientKeyFile: string;
  cleanup(): void;
}

async function openssl(args: readonly string[]): Promise<void> {
  try {
    await run('openssl', [...args]);
  } catch (e) {
    const stderr = (e as { stderr?: string }).stderr ?? (e as Error).message;
    throw new OpensslError(args, stderr);
  }
}

async function makeCa(dir: string, name: string): Promise<{ cert: string; key: string }> {
  const key = join(dir, `${name}.key`);
  const cert = join(dir, `${name}.crt`);
  await openssl(['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', key]);
  await openssl([
    'req', '-x509', '-new', '-key', key, '-sha256', '-days', '2', '-subj', `/CN=${name}`,
    '-addext', 'basicConstraints=critical,CA:TRUE',
    '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
    '-out', cert,
  ]);
  return { cert, key };
}

async function makeLeaf(
  dir: string,
  name: string,
  ca: { cert: string; key: string },
  extensions: string,
): Promise<{ cert: string; key: string }> {
  const key = join(dir, `${name}.key`);
  const csr = join(dir, `${name}.csr`);
  const cert = join(dir, `${name}.crt`);
  const ext = join(dir, `${name}.ext`);
  writeFileSync(ext, extensions);
  await openssl(['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', key]);
  await openssl(['req', '-new', '-key', key, '-subj', `/CN=${name}`, '-out', csr]);
  await openssl([
    'x509', '-req', '-in', csr, '-CA', ca.cert, '-CAkey', ca.key,
    // Random serials: leaves are signed concurrently, so a shared -CAcreateserial file would race.
    '-set_serial', `0x${randomBytes(8).toString('hex')}`,
    '-days', '2', '-sha256', '-extfile', ext, '-out', cert,
  ]);
  return { cert, key };
}

const CLIENT_EXT = 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n';

/** Generates the PKI into a fresh temp dir; call `cleanup()` in an `after` hook. */
export async function makeTestPki(): Promise<TestPki> {
  const dir = mkdtempSync(join(tmpdir(), 'weft-pki-'));
  try {
    const [ca, other] = await Promise.all([makeCa(dir, 'weft-test-ca'), makeCa(dir, 'weft-other-ca')]);
    const [server, client, otherClient] = await Promise.all([
      makeLeaf(
        dir,
        'server',
        ca,
        'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' +
          'extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n',
      ),
      makeLeaf(dir, 'client', ca, CLIENT_EXT),
      makeLeaf(dir, 'other-client', other, CLIENT_EXT),
    ]);
    return {
      dir,
      caFile: ca.cert,
      caKeyFile: ca.key,
      serverCertFile: server.cert,
      serverKeyFile: server.key,
      clientCertFile: client.cert,
      clientKeyFile: client.key,
      otherCaFile: other.cert,
      otherCaKeyFile: other.key,
      otherClientCertFile: otherClient.cert,
      otherClientKeyFile: otherClient.key,
      cleanup: () => rmSync(dir, { recursive: true, force: true }),
    };
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}
