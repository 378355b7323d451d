// TCP request/response latency for bench/netpol-ovs.ts (netperf's TCP_RR and TCP_CRR, which
// Debian does not ship): compiled by the bench with gcc (a dependency of `npm run build` already)
// into its temporary directory and run inside the pod namespaces.
//
//   tcp-rr -s PORT                    server: accepts one connection at a time, echoes what it reads
//   tcp-rr -c ADDR PORT N SIZE        RR: one connection, N round trips of SIZE bytes (after N/10 warm-up)
//   tcp-rr -C ADDR PORT N             CRR: N times connect, 1-byte round trip, close
//
// The client prints one JSON line: {"n":N,"p50":µs,"p90":µs,"p99":µs,"mean":µs,"max":µs}, times
// from CLOCK_MONOTONIC around each round trip (CRR: from connect() to close()).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
  fprintf(stderr, "tcp-rr: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("TCP_NODELAY");
}

static int read_full(int fd, char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r == 0) return 0;
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  return 1;
}

static int write_full(int fd, const char *buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t w = write(fd, buf + put, n - put);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    put += (size_t)w;
  }
  return 1;
}

static _Noreturn void server(int port) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) die("socket");
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
  if (listen(ls, 128) < 0) die("listen");
  static char buf[65536];
  for (;;) {
    int c = accept(ls, NULL, NULL);
    if (c < 0) {
      if (errno == EINTR) continue;
      die("accept");
    }
    nodelay(c);
    for (;;) {
      ssize_t r = read(c, buf, sizeof buf);
      if (r <= 0) break;
      if (write_full(c, buf, (size_t)r) < 0) break;
    }
    close(c);
  }
}

static int connect_to(const char *addr, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    fprintf(stderr, "tcp-rr: bad address %s\n", addr);
    exit(2);
  }
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
  nodelay(fd);
  return fd;
}

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static void report(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += t[i];
  // Nearest rank, as bench/lib/common.ts percentile().
#define RANK(p) t[(int)((p) * n + 0.999999) - 1 < 0 ? 0 : (int)((p) * n + 0.999999) - 1]
  printf("{\"n\":%d,\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"mean\":%.1f,\"max\":%.1f}\n", n, RANK(0.5), RANK(0.9), RANK(0.99), sum / n, t[n - 1]);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "-s") == 0) server(atoi(argv[2]));
  if (argc == 6 && strcmp(argv[1], "-c") == 0) {
    int n = atoi(argv[4]), size = atoi(argv[5]);
    if (n < 1 || size < 1 || size > 65536) return 2;
    char *buf = calloc((size_t)size, 1);
    double *t = calloc((size_t)n, sizeof *t);
    int fd = connect_to(argv[2], atoi(argv[3]));
    for (int i = -(n / 10); i < n; i++) {
      double s = now_us();
      if (write_full(fd, buf, (size_t)size) < 0 || read_full(fd, buf, (size_t)size) != 1) die("round trip");
      if (i >= 0) t[i] = now_us() - s;
    }
    close(fd);
    report(t, n);
    return 0;
  }
  if (argc == 5 && strcmp(argv[1], "-C") == 0) {
    int n = atoi(argv[4]);
    if (n < 1) return 2;
    double *t = calloc((size_t)n, sizeof *t);
    char b = 'x';
    for (int i = 0; i < n; i++) {
      double s = now_us();
      int fd = connect_to(argv[2], atoi(argv[3]));
      if (write_full(fd, &b, 1) < 0 || read_full(fd, &b, 1) != 1) die("round trip");
      close(fd);
      t[i] = now_us() - s;
    }
    report(t, n);
    return 0;
  }
  fprintf(stderr, "usage: tcp-rr -s PORT | -c ADDR PORT N SIZE | -C ADDR PORT N\n");
  return 2;
}
