/*
 * weft-cni: the native thin CNI client (issue 17). One executable installed under every plugin
 * name (flannel, bridge, host-local, portmap, weft-ovs, sriov); the plugin it stands for is
 * basename(argv[0]). It forwards the request to weftd's CNI server, which runs the plugin code
 * in a process that is already running, and prints what the server answers:
 *
 *   socket   $WEFT_CNI_SOCKET, default /run/weft/cni.sock (unix stream; one request per
 *            connection; an empty $WEFT_CNI_SOCKET means "no server")
 *   request  4-byte big-endian length N, then N bytes of UTF-8 JSON:
 *            {"v":1,"plugin":"<name>","env":{<every CNI_* variable>},"stdin":"<stdin>",
 *             "netns":"<readlink /proc/self/ns/net>"}
 *   reply    4-byte big-endian length + {"v":1,"status":<int>,"stdout":"…","stderr":"…"}
 *            → stderr and stdout are written, the exit status is `status`;
 *            or {"v":1,"serving":false} → fallback.
 *
 * Fallback: when no server answers (no socket, connect refused or failing in any way, connect
 * not accepted within $WEFT_CNI_CONNECT_TIMEOUT_MS, default 5 s), it says serving:false (weftd
 * stopping or busy, or in another network namespace than ours), or the
 * request is larger than the server takes (1 MiB + 64 KiB, after JSON escaping), the
 * Node.js bundle of the plugin, `<name>.cjs` next to this executable (the directory of argv[0],
 * else of /proc/self/exe), is exec'd in this process with the same environment and, on a pipe,
 * the stdin already read. Once the request is sent, anything other than a well-formed reply
 * (a malformed or oversized reply, the connection closed early, no reply within
 * $WEFT_CNI_TIMEOUT_MS, default 90 s) is a CNI error (code 999) and exit status 1, never a
 * fallback: the server may have done the work.
 *
 * stdin is read (at most 1 MiB) unless CNI_COMMAND is VERSION or empty, as the reference
 * plugins do. Nothing here reads without a bound or waits without a deadline, except reading
 * stdin itself (as every CNI plugin does) and writing stdout/stderr.
 *
 * Only libc; built by cni-plugins/build.ts with `cc -O2 -Wall -Wextra -Werror`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Delegation (cni-plugins/skel/delegate.ts) recognizes this executable by the NUL-terminated
 * string "weft-cni-client: v1" in its first 4 KiB: an ELF note, which linkers place right after
 * the program headers (at ~0x300-0x400). "v1" is the protocol version. */
__asm__(".pushsection .note.weft,\"a\",@note\n"
        ".balign 4\n"
        ".long 5\n"  /* name size: "weft" + NUL */
        ".long 20\n" /* descriptor size: the marker + NUL */
        ".long 1\n"  /* type */
        ".asciz \"weft\"\n"
        ".balign 4\n"
        ".asciz \"weft-cni-client: v1\"\n"
        ".balign 4\n"
        ".popsection\n");

#define DEFAULT_SOCKET "/run/weft/cni.sock"
#define BUNDLE_SUFFIX ".cjs"
#define MAX_STDIN ((size_t)1 << 20)
/* The server's cap on a request body (src/cniserver/frame.ts MAX_FRAME_BYTES, which build.ts
 * passes as WEFT_MAX_REQUEST): a larger request (a config near 1 MiB that escaping makes longer)
 * goes to the Node.js bundle instead. */
#ifdef WEFT_MAX_REQUEST
#define MAX_REQUEST ((size_t)WEFT_MAX_REQUEST)
#else
#define MAX_REQUEST (((size_t)1 << 20) + ((size_t)64 << 10))
#endif
#define MAX_REPLY ((size_t)16 << 20)
#define MAX_NAME 200
#define MAX_JSON_DEPTH 32
#define DEFAULT_CONNECT_TIMEOUT_MS 5000L
#define DEFAULT_REPLY_TIMEOUT_MS 90000L

extern char **environ;

/* ---------------------------------------------------------------- output and errors */

/* Writes all of buf to fd; waits (poll) on a non-blocking fd. 0 or -1 (errno set). */
static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            (void)poll(&p, 1, -1);
        } else {
            if (n == 0) errno = EIO;
            return -1;
        }
    }
    return 0;
}

struct buf {
    char *p;
    size_t len, cap;
};

static void die_oom(void);

static void buf_reserve(struct buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) die_oom();
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) die_oom();
    b->p = p;
    b->cap = cap;
}

static void buf_add(struct buf *b, const void *data, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_addc(struct buf *b, char c) {
    buf_reserve(b, 1);
    b->p[b->len++] = c;
}

static void buf_adds(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* The length of the valid UTF-8 sequence at s (1-4), or 0 when invalid; then *bad is the
 * length of its maximal subpart (≥ 1), which decoders replace with one U+FFFD (WHATWG, and
 * what Node's Buffer#toString('utf8') does). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (size_t k = 0; k < need; k++, i++) {
        unsigned char l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
        if (i >= n || s[i] < l || s[i] > h) {
            *bad = i;
            return 0;
        }
    }
    return i;
}

/* A JSON string literal of s[0..n): '"' and '\' escaped, bytes < 0x20 as \u00XX, invalid UTF-8
 * as U+FFFD (so the frame is valid UTF-8 and decodes as Node would decode the same bytes);
 * with go_safe also < > & U+2028 U+2029 as \uXXXX, as the plugins print errors (goJSON). */
static void json_string(struct buf *b, const char *str, size_t n, int go_safe) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    buf_reserve(b, n + 2);
    buf_addc(b, '"');
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            buf_add(b, e, 2);
            i++;
        } else if (c < 0x20 || (go_safe && (c == '<' || c == '>' || c == '&'))) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            buf_add(b, e, 6);
            i++;
        } else if (c < 0x80) {
            buf_addc(b, (char)c);
            i++;
        } else {
            size_t bad = 1, len = utf8_seq(s + i, n - i, &bad);
            if (len == 0) {
                buf_add(b, "\xEF\xBF\xBD", 3);
                i += bad;
            } else if (go_safe && len == 3 && c == 0xE2 && s[i + 1] == 0x80 && (s[i + 2] == 0xA8 || s[i + 2] == 0xA9)) {
                buf_adds(b, s[i + 2] == 0xA8 ? "\\u2028" : "\\u2029");
                i += 3;
            } else {
                buf_add(b, s + i, len);
                i += len;
            }
        }
    }
    buf_addc(b, '"');
}

/* Prints a CNI error as the plugins do ({code,msg[,details]}, 4-space indent, no newline) on
 * stdout and exits 1. */
__attribute__((noreturn, format(printf, 3, 4))) static void cni_error(int code, const char *details, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct buf b = {0};
    char num[32];
    snprintf(num, sizeof num, "%d", code);
    buf_adds(&b, "{\n    \"code\": ");
    buf_adds(&b, num);
    buf_adds(&b, ",\n    \"msg\": ");
    json_string(&b, msg, strlen(msg), 1);
    if (details && *details) {
        buf_adds(&b, ",\n    \"details\": ");
        json_string(&b, details, strlen(details), 1);
    }
    buf_adds(&b, "\n}");
    (void)write_all(STDOUT_FILENO, b.p, b.len);
    _exit(1);
}

static void die_oom(void) {
    static const char oom[] = "{\n    \"code\": 999,\n    \"msg\": \"weft: out of memory\"\n}";
    (void)write_all(STDOUT_FILENO, oom, sizeof oom - 1);
    _exit(1);
}

/* ---------------------------------------------------------------- small helpers */

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* A positive decimal from the environment (at most 24 h), else dflt. */
static long env_ms(const char *name, long dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return dflt;
        v = v * 10 + (*p - '0');
        if (v > 86400000L) return dflt;
    }
    return v > 0 ? v : dflt;
}

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '_' || c == '.' || c == '-'));
        if (!ok) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- stdin */

/* Reads fd 0 to EOF into b; 0, -1 (errno) or -2 (more than MAX_STDIN bytes). */
static int read_stdin(struct buf *b) {
    for (;;) {
        buf_reserve(b, 65536);
        size_t room = b->cap - b->len;
        if (room > MAX_STDIN + 1 - b->len) room = MAX_STDIN + 1 - b->len;
        ssize_t n = read(STDIN_FILENO, b->p + b->len, room);
        if (n > 0) {
            b->len += (size_t)n;
            if (b->len > MAX_STDIN) return -2;
        } else if (n == 0) {
            return 0;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
            (void)poll(&p, 1, -1);
        } else {
            return -1;
        }
    }
}

/* ---------------------------------------------------------------- fallback */

/* Makes a pipe holding data[0..n) the process's stdin (a writer process when it does not fit). */
static int stdin_from(const char *data, size_t n) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) return -1;
    int rfd = fds[0], wfd = fds[1];
    if (n > 65536) (void)fcntl(wfd, F_SETPIPE_SZ, (int)n);
    int fl = fcntl(wfd, F_GETFL);
    if (fl >= 0) (void)fcntl(wfd, F_SETFL, fl | O_NONBLOCK);
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(wfd, data + off, n - off);
        if (w > 0) off += (size_t)w;
        else if (w < 0 && errno == EINTR) continue;
        else break; /* full (EAGAIN): the rest goes through a writer */
    }
    if (off < n) {
        /* A grandchild (reparented, so nobody has to reap it) writes the rest and exits; it
         * dies of EPIPE if the bundle exits without reading. */
        pid_t pid = fork();
        if (pid < 0) {
            close(rfd);
            close(wfd);
            return -1;
        }
        if (pid == 0) {
            if (fork() == 0) {
                close(rfd);
                if (fl >= 0) (void)fcntl(wfd, F_SETFL, fl & ~O_NONBLOCK);
                (void)write_all(wfd, data + off, n - off);
                _exit(0);
            }
            _exit(0);
        }
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    close(wfd);
    if (rfd != STDIN_FILENO) {
        if (dup2(rfd, STDIN_FILENO) < 0) return -1; /* dup2 clears close-on-exec */
        close(rfd);
    } else {
        (void)fcntl(rfd, F_SETFD, 0);
    }
    return 0;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Execs <dir>/<name>.cjs with our environment and (when read) stdin. Returns only to fail. */
__attribute__((noreturn)) static void fallback(const char *argv0, const char *name, const struct buf *in, int in_read,
                                               const char *sock, const char *why) {
    char cand[2][PATH_MAX];
    int ncand = 0;
    const char *slash = strrchr(argv0, '/');
    if (slash) {
        int len = snprintf(cand[ncand], PATH_MAX, "%.*s/%s%s", (int)(slash - argv0), argv0, name, BUNDLE_SUFFIX);
        if (len > 0 && len < PATH_MAX) ncand++;
    }
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) {
        self[sl] = 0;
        char *s = strrchr(self, '/');
        if (s) {
            *s = 0;
            int len = snprintf(cand[ncand], PATH_MAX, "%s/%s%s", self, name, BUNDLE_SUFFIX);
            if (len > 0 && len < PATH_MAX && (ncand == 0 || strcmp(cand[0], cand[ncand]) != 0)) ncand++;
        }
    }
    const char *bundle = NULL;
    for (int i = 0; i < ncand && !bundle; i++)
        if (exists(cand[i])) bundle = cand[i];
    if (!bundle)
        cni_error(999, why, "weft: no CNI server answered at %s and the Node.js bundle %s was not found", sock,
                  ncand ? cand[0] : name);
    if (in_read && stdin_from(in->p ? in->p : "", in->len) < 0)
        cni_error(999, why, "weft: no CNI server answered at %s and passing stdin to %s failed: %s", sock, bundle, strerror(errno));
    char *const args[] = {(char *)bundle, NULL};
    execve(bundle, args, environ);
    cni_error(999, why, "weft: no CNI server answered at %s and the Node.js bundle %s could not run: %s", sock, bundle,
              strerror(errno));
}

/* ---------------------------------------------------------------- the server */

/* A connected socket, or -1 with a reason in why (then nothing was sent: fall back). */
static int connect_server(const char *path, long timeout_ms, char *why, size_t whylen) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, whylen, "socket path too long: %s", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return -1;
    }
    /* A unix connect blocks only while the listener's backlog is full, for at most SO_SNDTIMEO,
     * then fails with EAGAIN. */
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int r;
    do r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        if (e == EAGAIN || e == EINPROGRESS)
            snprintf(why, whylen, "connect %s: not accepted within %ld ms", path, timeout_ms);
        else
            snprintf(why, whylen, "connect %s: %s", path, strerror(e));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        snprintf(why, whylen, "fcntl: %s", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* 0 when sent; -1 (errno; ETIMEDOUT at the deadline). */
static int send_all(int fd, const char *p, size_t n, long deadline) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        long left = deadline - now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, left > INT_MAX ? INT_MAX : (int)left) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

/* Reads exactly n bytes: 1 done, 0 EOF first (*got says how many came), -1 error (errno;
 * ETIMEDOUT at the deadline). */
static int recv_exact(int fd, char *p, size_t n, long deadline, size_t *got) {
    *got = 0;
    while (*got < n) {
        ssize_t r = recv(fd, p + *got, n - *got, 0);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) return 0;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        long left = deadline - now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, left > INT_MAX ? INT_MAX : (int)left) < 0 && errno != EINTR) return -1;
    }
    return 1;
}

/* ---------------------------------------------------------------- the reply */

struct reply {
    int has_v, has_status, has_stdout, has_stderr, has_serving;
    long v, status;
    int serving;
    struct buf out, err;
};

struct parser {
    const unsigned char *p, *end;
    const char *error;
};

static void skip_ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int fail(struct parser *ps, const char *why) {
    if (!ps->error) ps->error = why;
    return -1;
}

static void put_utf8(struct buf *b, unsigned long cp) {
    char u[4];
    if (cp < 0x80) {
        buf_addc(b, (char)cp);
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        buf_add(b, u, 2);
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        buf_add(b, u, 3);
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        buf_add(b, u, 4);
    }
}

static int hex4(struct parser *ps, unsigned long *out) {
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    unsigned long v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = ps->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(ps, "bad \\u escape");
        v = v * 16 + (unsigned long)d;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

/* A string at ps->p (the opening quote), unescaped into out (NULL: skipped). A lone surrogate
 * becomes U+FFFD, as Node writes such a string. */
static int parse_string(struct parser *ps, struct buf *out) {
    struct buf scratch = {0};
    struct buf *b = out ? out : &scratch;
    ps->p++;
    for (;;) {
        if (ps->p >= ps->end) return fail(ps, "unterminated string");
        unsigned char c = *ps->p++;
        if (c == '"') break;
        if (c < 0x20) return fail(ps, "control character in a string");
        if (c != '\\') {
            if (out) buf_addc(b, (char)c);
            continue;
        }
        if (ps->p >= ps->end) return fail(ps, "unterminated string");
        c = *ps->p++;
        char e;
        switch (c) {
        case '"': e = '"'; break;
        case '\\': e = '\\'; break;
        case '/': e = '/'; break;
        case 'b': e = '\b'; break;
        case 'f': e = '\f'; break;
        case 'n': e = '\n'; break;
        case 'r': e = '\r'; break;
        case 't': e = '\t'; break;
        case 'u': {
            unsigned long cp;
            if (hex4(ps, &cp) < 0) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                const unsigned char *save = ps->p;
                unsigned long lo;
                ps->p += 2;
                if (hex4(ps, &lo) < 0) return -1;
                if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else ps->p = save; /* the next escape is read on its own */
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
            if (out) put_utf8(b, cp);
            continue;
        }
        default:
            return fail(ps, "bad escape in a string");
        }
        if (out) buf_addc(b, e);
    }
    free(scratch.p);
    return 0;
}

/* An integer (JSON number without fraction or exponent) in [min, max]. */
static int parse_int(struct parser *ps, long min, long max, long *out) {
    int neg = 0;
    if (ps->p < ps->end && *ps->p == '-') neg = 1, ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "expected an integer");
    if (*ps->p == '0' && ps->end - ps->p > 1 && ps->p[1] >= '0' && ps->p[1] <= '9') return fail(ps, "leading zero");
    long v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > 1000000000L) return fail(ps, "integer out of range");
    }
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E')) return fail(ps, "expected an integer");
    if (neg) v = -v;
    if (v < min || v > max) return fail(ps, "integer out of range");
    *out = v;
    return 0;
}

static int literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return fail(ps, "bad literal");
    ps->p += n;
    return 0;
}

/* Any JSON value, checked and skipped (a field this client does not know). */
static int skip_value(struct parser *ps, int depth) {
    if (depth > MAX_JSON_DEPTH) return fail(ps, "nested too deeply");
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "truncated");
    unsigned char c = *ps->p;
    if (c == '"') return parse_string(ps, NULL);
    if (c == 't') return literal(ps, "true");
    if (c == 'f') return literal(ps, "false");
    if (c == 'n') return literal(ps, "null");
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (c == '-') ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
        if (*ps->p == '0') ps->p++;
        else
            while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
        if (ps->p < ps->end && *ps->p == '.') {
            ps->p++;
            if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
            while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
        }
        if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
            ps->p++;
            if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
            if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
            while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
        }
        return 0;
    }
    if (c == '[' || c == '{') {
        unsigned char close = c == '[' ? ']' : '}';
        ps->p++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 0;
        }
        for (;;) {
            if (close == '}') {
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a key");
                if (parse_string(ps, NULL) < 0) return -1;
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':'");
                ps->p++;
            }
            if (skip_value(ps, depth + 1) < 0) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end) return fail(ps, "truncated");
            if (*ps->p == close) {
                ps->p++;
                return 0;
            }
            if (*ps->p != ',') return fail(ps, "expected ',' or the end of a container");
            ps->p++;
        }
    }
    return fail(ps, "unexpected character");
}

/* The reply object; 0, or -1 with *error set. */
static int parse_reply(const char *data, size_t n, struct reply *r, const char **error) {
    struct parser ps = {.p = (const unsigned char *)data, .end = (const unsigned char *)data + n, .error = NULL};
    struct parser *p = &ps;
    *error = NULL;
#define FAIL(why) (*error = (p->error ? p->error : (why)), -1)
    struct buf key = {0};
    memset(r, 0, sizeof *r);
    skip_ws(p);
    if (p->p >= p->end || *p->p != '{') return FAIL("not a JSON object");
    p->p++;
    skip_ws(p);
    int first = 1;
    for (;;) {
        skip_ws(p);
        if (p->p >= p->end) return FAIL("truncated");
        if (*p->p == '}' && first) {
            p->p++;
            break;
        }
        if (*p->p != '"') return FAIL("expected a key");
        key.len = 0;
        if (parse_string(p, &key) < 0) return FAIL("malformed");
        skip_ws(p);
        if (p->p >= p->end || *p->p != ':') return FAIL("expected ':'");
        p->p++;
        skip_ws(p);
        int rc;
#define KEY(k) (key.len == sizeof(k) - 1 && memcmp(key.p, k, key.len) == 0)
#define ONCE(flag)                                                                                                             \
    do {                                                                                                                       \
        if (r->flag) return FAIL("duplicate key");                                                                      \
        r->flag = 1;                                                                                                           \
    } while (0)
        if (KEY("v")) {
            ONCE(has_v);
            rc = parse_int(p, LONG_MIN / 2, LONG_MAX / 2, &r->v);
        } else if (KEY("status")) {
            ONCE(has_status);
            rc = parse_int(p, 0, 255, &r->status);
        } else if (KEY("stdout") || KEY("stderr")) {
            int out = KEY("stdout");
            if (out) ONCE(has_stdout);
            else ONCE(has_stderr);
            if (p->p >= p->end || *p->p != '"') return FAIL("stdout and stderr must be strings");
            rc = parse_string(p, out ? &r->out : &r->err);
        } else if (KEY("serving")) {
            ONCE(has_serving);
            if (p->p < p->end && *p->p == 't') rc = literal(p, "true"), r->serving = 1;
            else if (p->p < p->end && *p->p == 'f') rc = literal(p, "false"), r->serving = 0;
            else rc = fail(p, "serving must be true or false");
        } else {
            rc = skip_value(p, 1);
        }
#undef ONCE
#undef KEY
        if (rc < 0) return FAIL("malformed");
        first = 0;
        skip_ws(p);
        if (p->p >= p->end) return FAIL("truncated");
        if (*p->p == '}') {
            p->p++;
            break;
        }
        if (*p->p != ',') return FAIL("expected ',' or '}'");
        p->p++;
    }
    skip_ws(p);
    if (p->p != p->end) return FAIL("data after the JSON object");
    free(key.p);
    if (!r->has_v || r->v != 1) return FAIL("no \"v\":1");
    if (r->has_serving && !r->serving) return 0;
    if (!r->has_status) return FAIL("no status");
    return 0;
#undef FAIL
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    /* fds 0-2 open, so that no socket or pipe of ours lands on them. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int n = open("/dev/null", O_RDWR);
            if (n > 2) close(n);
        }

    const char *argv0 = argc > 0 && argv[0] ? argv[0] : "";
    const char *slash = strrchr(argv0, '/');
    const char *name = slash ? slash + 1 : argv0;
    if (!valid_name(name)) cni_error(999, NULL, "weft: cannot tell which CNI plugin to run from the program name %s", argv0);

    const char *sockenv = getenv("WEFT_CNI_SOCKET");
    const char *sock = sockenv ? sockenv : DEFAULT_SOCKET;

    const char *command = getenv("CNI_COMMAND");
    int in_read = command && *command && strcmp(command, "VERSION") != 0;
    struct buf in = {0};
    if (in_read) {
        int rc = read_stdin(&in);
        if (rc == -2) cni_error(5, NULL, "error reading from stdin: the network configuration is larger than %zu bytes", MAX_STDIN);
        if (rc < 0) cni_error(5, NULL, "error reading from stdin: %s", strerror(errno));
    }

    char why[PATH_MAX + 128];
    if (!*sock) {
        snprintf(why, sizeof why, "WEFT_CNI_SOCKET is empty");
        fallback(argv0, name, &in, in_read, "(none)", why);
    }
    long connect_ms = env_ms("WEFT_CNI_CONNECT_TIMEOUT_MS", DEFAULT_CONNECT_TIMEOUT_MS);
    long reply_ms = env_ms("WEFT_CNI_TIMEOUT_MS", DEFAULT_REPLY_TIMEOUT_MS);

    /* The request, with 4 bytes left for its length. */
    struct buf req = {0};
    buf_add(&req, "\0\0\0\0", 4);
    buf_adds(&req, "{\"v\":1,\"plugin\":");
    json_string(&req, name, strlen(name), 0);
    buf_adds(&req, ",\"env\":{");
    int nenv = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "CNI_", 4) != 0 || !eq) continue;
        size_t klen = (size_t)(eq - *e);
        int dup = 0; /* a name twice in environ: the first wins, as with getenv */
        for (char **f = environ; f < e && !dup; f++)
            dup = strncmp(*f, *e, klen) == 0 && (*f)[klen] == '=';
        if (dup) continue;
        if (nenv++) buf_addc(&req, ',');
        json_string(&req, *e, klen, 0);
        buf_addc(&req, ':');
        json_string(&req, eq + 1, strlen(eq + 1), 0);
    }
    buf_adds(&req, "},\"stdin\":");
    json_string(&req, in.p ? in.p : "", in.len, 0);
    /* Our network namespace: a server in another one answers serving:false (its plugins would act
       on its namespace, not ours) and we run the bundle here. */
    char netns[64];
    ssize_t nslen = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
    if (nslen > 0 && (size_t)nslen < sizeof netns - 1) {
        buf_adds(&req, ",\"netns\":");
        json_string(&req, netns, (size_t)nslen, 0);
    }
    buf_addc(&req, '}');
    size_t body = req.len - 4;
    if (body > MAX_REQUEST) {
        snprintf(why, sizeof why, "the request is larger than the server takes (%zu bytes)", MAX_REQUEST);
        fallback(argv0, name, &in, in_read, sock, why);
    }
    req.p[0] = (char)(body >> 24);
    req.p[1] = (char)(body >> 16);
    req.p[2] = (char)(body >> 8);
    req.p[3] = (char)body;

    int fd = connect_server(sock, connect_ms, why, sizeof why);
    if (fd < 0) fallback(argv0, name, &in, in_read, sock, why);

    long deadline = now_ms() + reply_ms;
    if (send_all(fd, req.p, req.len, deadline) < 0) {
        if (errno == ETIMEDOUT) cni_error(999, NULL, "weft: the CNI server at %s did not answer within %ld ms", sock, reply_ms);
        cni_error(999, NULL, "weft: sending the request to the CNI server at %s: %s", sock, strerror(errno));
    }
    free(req.p);

    unsigned char hdr[4];
    size_t got;
    int rc = recv_exact(fd, (char *)hdr, 4, deadline, &got);
    if (rc < 0 && errno == ETIMEDOUT) cni_error(999, NULL, "weft: the CNI server at %s did not answer within %ld ms", sock, reply_ms);
    if (rc < 0) cni_error(999, NULL, "weft: reading the reply of the CNI server at %s: %s", sock, strerror(errno));
    if (rc == 0 && got == 0) cni_error(999, NULL, "weft: the CNI server at %s closed the connection without a reply", sock);
    if (rc == 0) cni_error(999, "truncated length prefix", "weft: bad reply from the CNI server");
    size_t n = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | (size_t)hdr[3];
    if (n == 0) cni_error(999, "empty reply", "weft: bad reply from the CNI server");
    if (n > MAX_REPLY) {
        char d[96];
        snprintf(d, sizeof d, "reply of %zu bytes (at most %zu)", n, MAX_REPLY);
        cni_error(999, d, "weft: bad reply from the CNI server");
    }
    char *data = malloc(n);
    if (!data) die_oom();
    rc = recv_exact(fd, data, n, deadline, &got);
    if (rc < 0 && errno == ETIMEDOUT) cni_error(999, NULL, "weft: the CNI server at %s did not answer within %ld ms", sock, reply_ms);
    if (rc < 0) cni_error(999, NULL, "weft: reading the reply of the CNI server at %s: %s", sock, strerror(errno));
    if (rc == 0) {
        char d[96];
        snprintf(d, sizeof d, "connection closed after %zu of %zu bytes", got, n);
        cni_error(999, d, "weft: bad reply from the CNI server");
    }
    close(fd);

    struct reply r;
    const char *perr;
    if (parse_reply(data, n, &r, &perr) < 0) cni_error(999, perr, "weft: bad reply from the CNI server");
    free(data);
    if (r.has_serving && !r.serving) {
        snprintf(why, sizeof why, "the CNI server at %s is not serving", sock);
        fallback(argv0, name, &in, in_read, sock, why);
    }
    if (r.err.len) (void)write_all(STDERR_FILENO, r.err.p, r.err.len);
    if (r.out.len) (void)write_all(STDOUT_FILENO, r.out.p, r.out.len);
    return (int)r.status;
}
