// A loopback TCP proxy that a test can cut (closing every connection and refusing new ones)
// and restore, to disconnect one client from a server that stays up.
import { createServer, connect, type Server, type Socket } from 'node:net';

export class TcpProxy {
  private readonly sockets = new Set<Socket>();
  private paused = false;

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(targetPort: number): Promise<TcpProxy> {
    let proxy: TcpProxy | null = null;
    const server = createServer((client) => {
      if (!proxy || proxy.paused) {
        client.destroy();
        return;
      }
      const upstream = connect(targetPort, '127.0.0.1');
      for (const s of [client, upstream]) {
        proxy.sockets.add(s);
        s.on('close', () => proxy?.sockets.delete(s));
        s.on('error', () => undefined);
      }
      client.pipe(upstream).pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const addr = server.address();
    proxy = new TcpProxy(server, typeof addr === 'object' && addr ? addr.port : 0);
    return proxy;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  pause(): void {
    this.paused = true;
    for (const s of this.sockets) s.destroy();
  }

  resume(): void {
    this.paused = false;
  }

  async close(): Promise<void> {
    this.pause();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
