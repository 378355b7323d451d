/*
 * weft-spawn: the CNI plugin process's spawn helper. A Node.js child_process.spawn is a fork of
 * the whole (~60 MB) Node process, ~3.7 ms of its event loop each; this tiny process starts the
 * programs instead (posix_spawn: vfork-like) and many at once, multiplexed with poll(2).
 * Client: src/util/spawn-helper.ts. Started once, it serves requests on stdin and replies on
 * stdout until stdin closes (the plugin process is gone); then it exits at once, and the programs
 * it started keep running (as children of a Node process survive it).
 *
 * Framing, both ways: u32 little-endian body length N (at most 32 MiB), then N bytes:
 *   u8 type, u32 id, then by type (integers little-endian, strings u32 length + bytes, no NUL):
 * requests
 *   1 START  u8 flags (1: stdin is a pipe, 2: the stdin bytes follow and it is closed after
 *            them), u32 timeout ms (0: none; then SIGTERM, SIGKILL 5 s later), u16 argc
 *            (argv[0] = the program, looked up in the request's PATH), u16 envc, u8 nfds,
 *            nfds x (u32 fd, u64 st_dev, u64 st_ino): namespace files of process argv[1]
 *            (reopened through /proc/<pid>/fd/<fd>, checked to be that same nsfs file) that the
 *            program gets as fd 3, 4, …; argc strings, envc strings ("K=V"), [stdin string]
 *   2 FEED   the rest of the body is the program's stdin, then closed (only the first counts)
 * replies
 *   1 EXIT   u8 how (0: exited, 1: killed by a signal), u32 status or signal number,
 *            stdout string, stderr string (each at most 16 MiB, else an ERROR 4 reply)
 *   2 ERROR  u8 code, i32 errno, message string; code 1: could not start the program (errno),
 *            2: malformed request (id 0 when it had none), 3: a namespace fd could not be
 *            reopened (the client runs it another way), 4: output over the cap (it was killed),
 *            5: too many programs at once
 * Every request gets exactly one reply (FEED none); a malformed one an ERROR, never a crash.
 *
 * Only libc; built by cni-plugins/build.ts (compileSpawnHelper) with `cc -O2 -Wall -Wextra -Werror`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME (32u << 20)
#define MAX_ARGS 4096u
#define MAX_ENV 4096u
#define MAX_NSFDS 8u
#define MAX_OUT (16u << 20)
#define MAX_CHILDREN 4096u
#define KILL_GRACE_MS 5000
#define NSFS_MAGIC 0x6e736673
#define HIGH_FD 64 /* reopened ns fds live above every dup2 target (0..2+MAX_NSFDS) */

enum { REQ_START = 1, REQ_FEED = 2 };
enum { REP_EXIT = 1, REP_ERROR = 2 };
enum { E_SPAWN = 1, E_BADREQ = 2, E_NSFD = 3, E_OUTPUT = 4, E_LIMIT = 5 };

extern char **environ;

struct buf {
  unsigned char *p;
  size_t len, cap, off;
};

struct child {
  uint32_t id;
  pid_t pid;
  int in_fd, out_fd, err_fd;
  struct buf in; /* pending stdin */
  int fed;
  struct buf out, err;
  int exited, status;
  int64_t deadline, kill_at;
  int overflow; /* 1: stdout, 2: stderr */
};

static pid_t owner_pid;
static int sig_pipe[2] = {-1, -1};
static struct child **kids;
static size_t nkids;
static struct buf inq, outq;
static uint64_t skip_bytes; /* the rest of an oversized frame, discarded */

static void die_oom(void) {
  static const char m[] = "weft-spawn: out of memory\n";
  ssize_t r = write(2, m, sizeof m - 1);
  (void)r;
  _exit(70);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void buf_reserve(struct buf *b, size_t extra) {
  if (b->len + extra <= b->cap) return;
  if (b->off > 0 && b->off >= b->len / 2) { /* compact before growing */
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
    if (b->len + extra <= b->cap) return;
  }
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra) cap *= 2;
  unsigned char *p = realloc(b->p, cap);
  if (!p) die_oom();
  b->p = p;
  b->cap = cap;
}

static void buf_put(struct buf *b, const void *d, size_t n) {
  if (n == 0) return;
  buf_reserve(b, n);
  memcpy(b->p + b->len, d, n);
  b->len += n;
}

static void buf_free(struct buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static void put_u8(struct buf *b, uint8_t v) { buf_put(b, &v, 1); }
static void put_u32(struct buf *b, uint32_t v) {
  unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  buf_put(b, x, 4);
}
static void put_bytes(struct buf *b, const void *d, size_t n) {
  put_u32(b, (uint32_t)n);
  buf_put(b, d, n);
}

/* Queues one reply; body = type, id, then `rest`. */
static void reply(uint8_t type, uint32_t id, const struct buf *rest) {
  size_t n = 5 + (rest ? rest->len - rest->off : 0);
  put_u32(&outq, (uint32_t)n);
  put_u8(&outq, type);
  put_u32(&outq, id);
  if (rest) buf_put(&outq, rest->p + rest->off, rest->len - rest->off);
}

static void reply_error(uint32_t id, uint8_t code, int err, const char *msg) {
  struct buf b = {0};
  put_u8(&b, code);
  put_u32(&b, (uint32_t)err);
  put_bytes(&b, msg, strlen(msg));
  reply(REP_ERROR, id, &b);
  buf_free(&b);
}

static void on_sigchld(int sig) {
  (void)sig;
  int saved = errno;
  ssize_t r = write(sig_pipe[1], "x", 1); /* full pipe: a wake-up is already pending */
  (void)r;
  errno = saved;
}

static void set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* ---- request parsing: a cursor that fails (never reads past the end) on any short field ---- */

struct cur {
  const unsigned char *p;
  size_t n;
  int bad;
};

static const unsigned char *take(struct cur *c, size_t k) {
  if (c->bad || c->n < k) {
    c->bad = 1;
    return NULL;
  }
  const unsigned char *r = c->p;
  c->p += k;
  c->n -= k;
  return r;
}
static uint8_t get_u8(struct cur *c) {
  const unsigned char *p = take(c, 1);
  return p ? p[0] : 0;
}
static uint16_t get_u16(struct cur *c) {
  const unsigned char *p = take(c, 2);
  return p ? (uint16_t)(p[0] | p[1] << 8) : 0;
}
static uint32_t get_u32(struct cur *c) {
  const unsigned char *p = take(c, 4);
  return p ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24 : 0;
}
static uint64_t get_u64(struct cur *c) {
  uint64_t lo = get_u32(c);
  return lo | (uint64_t)get_u32(c) << 32;
}
/* A NUL-terminated copy of a length-prefixed string; NULL (and bad) if it holds a NUL. */
static char *get_str(struct cur *c) {
  uint32_t n = get_u32(c);
  const unsigned char *p = take(c, n);
  if (!p || memchr(p, 0, n)) {
    c->bad = 1;
    return NULL;
  }
  char *s = malloc((size_t)n + 1);
  if (!s) die_oom();
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

static void free_strv(char **v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* The program's path as execvp would find it, but in the request's PATH (as libuv does). */
static int find_program(const char *cmd, char **envp, char *out, size_t outlen) {
  if (cmd[0] == 0) return ENOENT;
  if (strchr(cmd, '/')) {
    if (strlen(cmd) >= outlen) return ENAMETOOLONG;
    strcpy(out, cmd);
    return 0;
  }
  const char *path = "/usr/bin:/bin";
  for (char **e = envp; *e; e++) {
    if (strncmp(*e, "PATH=", 5) == 0) {
      path = *e + 5;
      break;
    }
  }
  int err = ENOENT;
  for (const char *p = path;; p++) {
    const char *end = strchr(p, ':');
    size_t dl = end ? (size_t)(end - p) : strlen(p);
    int n = dl == 0 ? snprintf(out, outlen, "%s", cmd) : snprintf(out, outlen, "%.*s/%s", (int)dl, p, cmd);
    if (n > 0 && (size_t)n < outlen) {
      struct stat st;
      if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
        if (access(out, X_OK) == 0) return 0;
        err = EACCES;
      }
    }
    if (!end) break;
    p = end;
  }
  return err;
}

/* Reopens namespace fd `fd` of the owner process and checks it is that same nsfs file. */
static int reopen_ns(uint32_t fd, uint64_t dev, uint64_t ino, int *out, char *why, size_t whylen) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%u", (int)owner_pid, fd);
  int f = open(path, O_RDONLY | O_CLOEXEC);
  if (f < 0) {
    int e = errno;
    snprintf(why, whylen, "open %s: %s", path, strerror(e));
    return e;
  }
  struct stat st;
  struct statfs sf;
  if (fstat(f, &st) != 0 || fstatfs(f, &sf) != 0 || (uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino ||
      (unsigned long)sf.f_type != NSFS_MAGIC) {
    close(f);
    snprintf(why, whylen, "%s is not the namespace file the caller holds", path);
    return EBADF;
  }
  int h = fcntl(f, F_DUPFD_CLOEXEC, HIGH_FD);
  int e = errno;
  close(f);
  if (h < 0) {
    snprintf(why, whylen, "dup %s: %s", path, strerror(e));
    return e;
  }
  *out = h;
  return 0;
}

static struct child *find_child(uint32_t id) {
  for (size_t i = 0; i < nkids; i++)
    if (kids[i]->id == id) return kids[i];
  return NULL;
}

static void feed(struct child *k, const unsigned char *d, size_t n) {
  if (k->fed || k->in_fd < 0) return;
  k->fed = 1;
  buf_put(&k->in, d, n);
  if (n == 0) close_fd(&k->in_fd); /* nothing to write: EOF now */
}

static void start(uint32_t id, struct cur *c) {
  uint8_t flags = get_u8(c);
  uint32_t timeout = get_u32(c);
  uint16_t argc = get_u16(c), envc = get_u16(c);
  uint8_t nfds = get_u8(c);
  if (c->bad || argc == 0 || argc > MAX_ARGS || envc > MAX_ENV || nfds > MAX_NSFDS || (flags & ~3u) ||
      ((flags & 2) && !(flags & 1))) {
    reply_error(id, E_BADREQ, EINVAL, "malformed start request");
    return;
  }
  uint32_t nsfd[MAX_NSFDS];
  uint64_t nsdev[MAX_NSFDS], nsino[MAX_NSFDS];
  for (unsigned i = 0; i < nfds; i++) {
    nsfd[i] = get_u32(c);
    nsdev[i] = get_u64(c);
    nsino[i] = get_u64(c);
  }
  char **argv = calloc((size_t)argc + 1, sizeof *argv);
  char **envp = calloc((size_t)envc + 1, sizeof *envp);
  if (!argv || !envp) die_oom();
  for (unsigned i = 0; i < argc && !c->bad; i++) argv[i] = get_str(c);
  for (unsigned i = 0; i < envc && !c->bad; i++) envp[i] = get_str(c);
  uint32_t inlen = 0;
  const unsigned char *input = NULL;
  if (flags & 2) {
    inlen = get_u32(c);
    input = take(c, inlen);
  }
  int hi[MAX_NSFDS];
  unsigned nhi = 0;
  int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  int fa_ok = 0, at_ok = 0;
  char path[4096], why[256];

  if (c->bad || c->n != 0) {
    reply_error(id, E_BADREQ, EINVAL, "malformed start request");
    goto out;
  }
  if (nkids >= MAX_CHILDREN) {
    reply_error(id, E_LIMIT, EAGAIN, "too many programs running at once");
    goto out;
  }
  if (find_child(id)) {
    reply_error(id, E_BADREQ, EEXIST, "request id already running");
    goto out;
  }
  int err = find_program(argv[0], envp, path, sizeof path);
  if (err) {
    reply_error(id, E_SPAWN, err, strerror(err));
    goto out;
  }
  for (; nhi < nfds; nhi++) {
    err = reopen_ns(nsfd[nhi], nsdev[nhi], nsino[nhi], &hi[nhi], why, sizeof why);
    if (err) {
      reply_error(id, E_NSFD, err, why);
      goto out;
    }
  }
  if (((flags & 1) && pipe2(pin, O_CLOEXEC) != 0) || pipe2(pout, O_CLOEXEC) != 0 || pipe2(perr, O_CLOEXEC) != 0) {
    err = errno;
    reply_error(id, E_SPAWN, err, strerror(err));
    goto out;
  }
  if ((err = posix_spawn_file_actions_init(&fa)) != 0) goto spawn_err;
  fa_ok = 1;
  if ((err = posix_spawnattr_init(&at)) != 0) goto spawn_err;
  at_ok = 1;
  /* stdio first: its pipe ends may be numbered 3..10, which the ns fds (>= 64) then replace. */
  if (flags & 1)
    err = posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
  else
    err = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!err) err = posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
  if (!err) err = posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
  for (unsigned i = 0; i < nhi && !err; i++) err = posix_spawn_file_actions_adddup2(&fa, hi[i], 3 + (int)i);
  if (err) goto spawn_err;
  /* Our SIGPIPE is ignored and ignored dispositions survive exec: give the program the defaults. */
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&at, &all);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid;
  err = posix_spawn(&pid, path, &fa, &at, argv, envp);
  if (err) goto spawn_err;

  struct child *k = calloc(1, sizeof *k);
  struct child **nk = realloc(kids, (nkids + 1) * sizeof *kids);
  if (!k || !nk) die_oom();
  kids = nk;
  kids[nkids++] = k;
  k->id = id;
  k->pid = pid;
  k->in_fd = pin[1];
  k->out_fd = pout[0];
  k->err_fd = perr[0];
  pin[1] = pout[0] = perr[0] = -1;
  if (k->in_fd >= 0) set_nonblock(k->in_fd);
  set_nonblock(k->out_fd);
  set_nonblock(k->err_fd);
  k->deadline = timeout ? now_ms() + timeout : 0;
  if (flags & 2) feed(k, input, inlen);
  goto out;

spawn_err:
  reply_error(id, E_SPAWN, err, strerror(err));
out:
  if (fa_ok) posix_spawn_file_actions_destroy(&fa);
  if (at_ok) posix_spawnattr_destroy(&at);
  for (unsigned i = 0; i < nhi; i++) close(hi[i]);
  for (int i = 0; i < 2; i++) {
    close_fd(&pin[i]);
    close_fd(&pout[i]);
    close_fd(&perr[i]);
  }
  free_strv(argv, argc);
  free_strv(envp, envc);
}

static void handle_frame(const unsigned char *p, size_t n) {
  struct cur c = {p, n, 0};
  uint8_t type = get_u8(&c);
  uint32_t id = get_u32(&c);
  if (c.bad) {
    reply_error(0, E_BADREQ, EINVAL, "frame shorter than its header");
    return;
  }
  if (type == REQ_START) {
    start(id, &c);
  } else if (type == REQ_FEED) {
    struct child *k = find_child(id);
    if (k) feed(k, c.p, c.n); /* an exited (already answered) program: nothing to feed */
  } else {
    reply_error(id, E_BADREQ, EINVAL, "unknown request type");
  }
}

/* Reads what stdin has; returns 0 at EOF. */
static int read_requests(void) {
  for (;;) {
    buf_reserve(&inq, 65536);
    ssize_t r = read(0, inq.p + inq.len, inq.cap - inq.len);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      return 0;
    }
    if (r == 0) return 0;
    inq.len += (size_t)r;
    if ((size_t)r < 65536) break;
  }
  for (;;) {
    size_t avail = inq.len - inq.off;
    if (skip_bytes > 0) {
      size_t k = skip_bytes < avail ? (size_t)skip_bytes : avail;
      inq.off += k;
      skip_bytes -= k;
      if (skip_bytes > 0) break;
      continue;
    }
    if (avail < 4) break;
    const unsigned char *h = inq.p + inq.off;
    uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    if (n > MAX_FRAME) {
      reply_error(0, E_BADREQ, E2BIG, "request frame over 32 MiB");
      inq.off += 4;
      skip_bytes = n;
      continue;
    }
    if (avail < 4 + (size_t)n) break;
    handle_frame(h + 4, n);
    inq.off += 4 + (size_t)n;
  }
  if (inq.off == inq.len) inq.off = inq.len = 0;
  return 1;
}

static void write_replies(void) {
  while (outq.off < outq.len) {
    ssize_t r = write(1, outq.p + outq.off, outq.len - outq.off);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      _exit(0); /* the reader is gone: so is the plugin process */
    }
    outq.off += (size_t)r;
  }
  outq.off = outq.len = 0;
  if (outq.cap > (1u << 20)) buf_free(&outq); /* do not keep a big reply's buffer */
}

static void drain(struct child *k, int *fd, struct buf *b, int which) {
  static unsigned char scratch[65536]; /* a buffer sized to what came, not 64 KiB per stream */
  for (;;) {
    ssize_t r = read(*fd, scratch, sizeof scratch);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      close_fd(fd);
      return;
    }
    if (r == 0) {
      close_fd(fd);
      return;
    }
    if (b->len + (size_t)r > MAX_OUT) {
      k->overflow = which;
      close_fd(fd);
      if (!k->exited) kill(k->pid, SIGKILL);
      return;
    }
    buf_put(b, scratch, (size_t)r);
  }
}

static void write_stdin(struct child *k) {
  while (k->in.off < k->in.len) {
    ssize_t r = write(k->in_fd, k->in.p + k->in.off, k->in.len - k->in.off);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      break; /* EPIPE: it exits without reading it all, as it may */
    }
    k->in.off += (size_t)r;
  }
  close_fd(&k->in_fd);
  buf_free(&k->in);
}

static void reap(void) {
  char x[64];
  while (read(sig_pipe[0], x, sizeof x) > 0) {
  }
  for (;;) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p < 0 && errno == EINTR) continue;
    if (p <= 0) return;
    for (size_t i = 0; i < nkids; i++) {
      if (kids[i]->pid == p && !kids[i]->exited) {
        kids[i]->exited = 1;
        kids[i]->status = st;
        break;
      }
    }
  }
}

/* Replies for and forgets child i once it has exited and both its pipes are closed. */
static int finish(size_t i) {
  struct child *k = kids[i];
  if (!k->exited || k->out_fd >= 0 || k->err_fd >= 0) return 0;
  if (k->overflow) {
    reply_error(k->id, E_OUTPUT, EFBIG, k->overflow == 1 ? "stdout over 16 MiB" : "stderr over 16 MiB");
  } else {
    struct buf b = {0};
    int sig = WIFSIGNALED(k->status);
    put_u8(&b, sig ? 1 : 0);
    put_u32(&b, (uint32_t)(sig ? WTERMSIG(k->status) : WEXITSTATUS(k->status)));
    put_bytes(&b, k->out.p, k->out.len);
    put_bytes(&b, k->err.p, k->err.len);
    reply(REP_EXIT, k->id, &b);
    buf_free(&b);
  }
  close_fd(&k->in_fd);
  buf_free(&k->in);
  buf_free(&k->out);
  buf_free(&k->err);
  free(k);
  kids[i] = kids[--nkids];
  return 1;
}

static void timers(int64_t now) {
  for (size_t i = 0; i < nkids; i++) {
    struct child *k = kids[i];
    if (!k->deadline || now < k->deadline) continue;
    if (k->exited) {
      /* A grandchild holds its pipes open past the deadline: answer with what we have. */
      close_fd(&k->out_fd);
      close_fd(&k->err_fd);
    } else if (!k->kill_at) {
      kill(k->pid, SIGTERM);
      k->kill_at = now + KILL_GRACE_MS;
    } else if (now >= k->kill_at) {
      kill(k->pid, SIGKILL);
      k->kill_at = INT64_MAX;
    }
  }
}

static int next_timeout(int64_t now) {
  int64_t t = -1;
  for (size_t i = 0; i < nkids; i++) {
    struct child *k = kids[i];
    int64_t at = !k->deadline ? -1 : (!k->kill_at || k->exited) ? k->deadline : k->kill_at;
    if (at < 0 || at == INT64_MAX) continue;
    if (t < 0 || at < t) t = at;
  }
  if (t < 0) return -1;
  return t <= now ? 0 : (t - now > 60000 ? 60000 : (int)(t - now));
}

int main(int argc, char **argv) {
  /* argv[1]: the pid whose namespace fds requests name (default: our parent). */
  owner_pid = argc > 1 ? (pid_t)atoi(argv[1]) : getppid();
  /* 0..2 must be open, or a pipe could land there and a child's dup2 would be a no-op. */
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) < 0) {
      int n = open("/dev/null", O_RDWR);
      if (n < 0) return 71;
    }
  }
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 71;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigchld;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  set_nonblock(0);
  set_nonblock(1);

  struct pollfd *pf = NULL;
  size_t pfcap = 0;
  for (;;) {
    size_t want = 3 + nkids * 3;
    if (want > pfcap) {
      struct pollfd *np = realloc(pf, want * sizeof *pf);
      if (!np) die_oom();
      pf = np;
      pfcap = want;
    }
    size_t n = 0;
    pf[n++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
    pf[n++] = (struct pollfd){.fd = 0, .events = POLLIN};
    pf[n++] = (struct pollfd){.fd = outq.len > outq.off ? 1 : -1, .events = POLLOUT};
    for (size_t i = 0; i < nkids; i++) {
      struct child *k = kids[i];
      int in_ready = k->in_fd >= 0 && k->in.len > k->in.off;
      pf[n++] = (struct pollfd){.fd = in_ready ? k->in_fd : -1, .events = POLLOUT};
      pf[n++] = (struct pollfd){.fd = k->out_fd, .events = POLLIN};
      pf[n++] = (struct pollfd){.fd = k->err_fd, .events = POLLIN};
    }
    int r = poll(pf, n, next_timeout(now_ms()));
    if (r < 0 && errno != EINTR) return 72;
    if (r > 0) {
      /* Children first (pf indexes match kids[] as they were when polling; nothing is removed yet). */
      size_t polled = (n - 3) / 3;
      for (size_t i = 0; i < polled; i++) {
        struct child *k = kids[i];
        struct pollfd *q = &pf[3 + i * 3];
        if (q[0].fd >= 0 && q[0].revents) write_stdin(k);
        if (q[1].fd >= 0 && q[1].revents && k->out_fd >= 0) drain(k, &k->out_fd, &k->out, 1);
        if (q[2].fd >= 0 && q[2].revents && k->err_fd >= 0) drain(k, &k->err_fd, &k->err, 2);
      }
      if (pf[1].revents && !read_requests()) _exit(0); /* the plugin process is gone */
    }
    reap();
    timers(now_ms());
    for (size_t i = 0; i < nkids;) {
      if (!finish(i)) i++;
    }
    if (outq.len > outq.off) write_replies();
  }
}
