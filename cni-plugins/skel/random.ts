// Random bytes for names (veth names, temp files) without node:crypto: loading crypto (or Web
// Crypto, which loads the same code in Node 20) costs a plugin process 4–6 ms of start-up; one
// read of /dev/urandom costs ~0.1 ms and gives the same kernel CSPRNG output. node:crypto is only
// loaded if /dev/urandom cannot be read (an unusual chroot).
import { closeSync, openSync, readSync } from 'node:fs';

/** `n` bytes from the kernel's CSPRNG. */
export function randomBytesSync(n: number): Buffer {
  const buf = Buffer.alloc(n);
  let fd: number | null = null;
  try {
    fd = openSync('/dev/urandom', 'r');
    let got = 0;
    while (got < n) {
      const r = readSync(fd, buf, got, n - got, null);
      if (r <= 0) throw new Error('short read from /dev/urandom');
      got += r;
    }
    return buf;
  } catch {
    return process.getBuiltinModule('node:crypto').randomBytes(n);
  } finally {
    if (fd !== null) closeSync(fd);
  }
}
