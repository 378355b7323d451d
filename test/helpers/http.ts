/** GET on a loopback port; null when nothing answers (yet). */
export async function httpGet(port: number, path: string): Promise<{ status: number; body: string } | null> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}${path}`);
    return { status: res.status, body: await res.text() };
  } catch {
    return null;
  }
}
