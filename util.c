/* util.c — checked-call helpers: every failure reports where it happened. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "util.h"
#include <unistd.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio_ext.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int g_linger; /* see die_replicated */

void die_replicated(int linger) { g_linger = linger; }

static void (*g_cleanup)(void);
void die_set_cleanup(void (*fn)(void)) { g_cleanup = fn; }

void vformat_line(char *out, size_t n, const char *fmt, va_list ap) {
    if (!n) return;
    char msg[4096];
    if (vsnprintf(msg, sizeof msg, fmt, ap) < 0) msg[0] = '\0';
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
        char esc[5] = {(char)*c, 0};
        if (*c == '\n') memcpy(esc, "\\n", 3);
        else if (*c < 0x20 || *c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", *c);
        size_t e = strlen(esc);
        if (o + e >= n) break;
        memcpy(out + o, esc, e);
        o += e;
    }
    out[o] = '\0';
}

void die_format(char *line, size_t n, const char *fmt, va_list ap) {
    size_t o = (size_t)snprintf(line, n, "llmtrain: ");
    if (o < n) vformat_line(line + o, n - o, fmt, ap);
}

void die(int code, const char *fmt, ...) {
    /* An error every rank meets alike is rank 0's to print: when it fails
     * too, mpirun ends this rank during the wait and the job says it once;
     * an error of this rank alone (a file missing on its host) still shows.
     * mpirun ends it with SIGTERM: the trainer's stop handler (which would
     * cut the sleep short and print) gives way to the default action. */
    if (g_linger) {
        const int stop[4] = {SIGTERM, SIGUSR1, SIGINT, SIGHUP};
        for (int i = 0; i < 4; i++) { /* the trainer's stop handler gives way (an ignored one stays ignored) */
            struct sigaction old;
            if (sigaction(stop[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) signal(stop[i], SIG_DFL);
        }
        sleep(3);
    }
    void (*cleanup)(void) = g_cleanup;
    g_cleanup = NULL; /* once: a die inside it ends the process as usual */
    if (cleanup) cleanup();
    /* one write: the lines of ranks that fail together into one stderr do
     * not interleave */
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    die_format(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    fflush(stdout);
    fflush(stderr);
    ssize_t w = write(2, line, len); /* nothing to do if stderr is gone */
    (void)w;
    exit(code);
}

void warnf(const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vformat_line(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "llmtrain: warning: %s\n", line);
}

void *malloc_check_(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);
    if (!p) die(EXIT_IO, "out of memory allocating %zu bytes (%s:%d)", size, file, line);
    return p;
}

void *calloc_check_(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die(EXIT_IO, "out of memory allocating %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}

FILE *fopen_check_(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) die(mode[0] == 'r' ? EXIT_USAGE : EXIT_IO, "%s: cannot open (%s) (%s:%d)", path, strerror(errno), file, line);
    return f;
}

void fwrite_check_(const void *p, size_t size, size_t n, FILE *f, const char *path, const char *file, int line) {
    if (n && fwrite(p, size, n, f) != n)
        die(EXIT_IO, "%s: write failed (%s) (%s:%d)", path, strerror(errno), file, line);
}

void fclose_check_(FILE *f, const char *path, const char *file, int line) {
    if (fclose(f) != 0) die(EXIT_IO, "%s: close failed (%s) (%s:%d)", path, strerror(errno), file, line);
}

long long log_end(FILE *f) {
    struct stat st;
    return fstat(fileno(f), &st) == 0 ? (long long)st.st_size : 0;
}

int log_record_end(FILE *f, int wrote, long long *good) {
    int err = wrote ? 0 : errno ? errno : EIO;
    if (!err && fflush(f) != 0) err = errno ? errno : EIO;
    if (!err && ferror(f)) err = EIO;
    if (!err) {
        *good = log_end(f);
        return 0;
    }
    __fpurge(f); /* what is left of the record must not reach the file at fclose */
    clearerr(f);
    if (ftruncate(fileno(f), (off_t)*good) != 0) { /* the half record stays: a reader skips a line that is not JSON */ }
    return err;
}

static char g_read_why[160]; /* read_text_why */

const char *read_text_why(void) { return g_read_why; }

/* NULL with g_read_why (and errno) saying why */
static char *read_text_fail(int fd, int err, const char *why) {
    if (fd >= 0) close(fd);
    snprintf(g_read_why, sizeof g_read_why, "%s", why ? why : strerror(err ? err : EIO));
    errno = err;
    return NULL;
}

char *read_text_file(const char *path, size_t *len) {
    *len = 0;
    /* O_NONBLOCK: opening a FIFO would wait for a writer; it is refused below */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return read_text_fail(-1, errno, NULL);
    struct stat st;
    if (fstat(fd, &st) != 0) return read_text_fail(fd, errno, NULL);
    if (S_ISDIR(st.st_mode)) return read_text_fail(fd, EISDIR, "is a directory, expected a file");
    if (!S_ISREG(st.st_mode))
        return read_text_fail(fd, EINVAL, S_ISFIFO(st.st_mode) ? "is a FIFO, expected a regular file"
                                                               : "is a socket or device, expected a regular file");
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc_check(n + 1);
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            return read_text_fail(fd, r < 0 ? errno : EIO, r < 0 ? NULL : "shorter than its size (changed while read?)");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *len = n;
    return buf;
}

int sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    if (rc != 0 && errno == EINVAL) rc = 0; /* some filesystems cannot sync directories */
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

void path_parent(char *out, size_t n, const char *path) {
    snprintf(out, n, "%s", path);
    char *slash = strrchr(out, '/');
    while (slash && slash > out && slash[1] == '\0') { /* "a/b/": the parent of b */
        *slash = '\0';
        slash = strrchr(out, '/');
    }
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

int sync_parent(const char *path) {
    char dir[4096];
    if (strlen(path) >= sizeof dir) { errno = ENAMETOOLONG; return -1; }
    path_parent(dir, sizeof dir, path);
    return sync_dir(dir);
}

/* One directory of mkdir -p: made (and, durable, its entry synced), or there. */
static int mkdir_one(const char *dir, bool durable) {
    if (mkdir(dir, 0755) == 0) return durable ? sync_parent(dir) : 0;
    return errno == EEXIST ? 0 : -1;
}

static int mkdir_tree(const char *path, bool durable) {
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) { errno = ENAMETOOLONG; return -1; }
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir_one(tmp, durable) != 0) return -1;
        *p = '/';
    }
    return mkdir_one(tmp, durable);
}

int mkdir_p(const char *path) { return mkdir_tree(path, false); }
int mkdir_p_durable(const char *path) { return mkdir_tree(path, true); }

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
double unix_time_s(void) { return clock_s(CLOCK_REALTIME); }

void buf_add(Buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (w < 0) die(EXIT_INTERNAL, "vsnprintf failed");
        if (b->s && b->len + (size_t)w < b->cap) { b->len += (size_t)w; return; }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)w;
        char *s = realloc(b->s, cap);
        if (!s) die(EXIT_IO, "out of memory building a JSON text");
        b->s = s;
        b->cap = cap;
    }
}

uint64_t fnv1a64(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) h = (h ^ *c) * 1099511628211ull;
    return h;
}

void host_name(char *out, size_t n) {
    if (!n) return;
    memset(out, 0, n);
    if (gethostname(out, n - 1) < 0) snprintf(out, n, "?");
}

void buf_json_string(Buf *b, const char *s) {
    buf_add(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') buf_add(b, "\\%c", *p);
        else if (*p < 0x20) buf_add(b, "\\u%04x", *p);
        else buf_add(b, "%c", *p);
    }
    buf_add(b, "\"");
}

int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* the length of the well-formed UTF-8 sequence at s (n bytes left) of a
 * printable character, else 0: no overlong forms, surrogates or code points
 * past U+10FFFF; C0 controls but tab and newline, DEL and C1 are not printable */
static size_t utf8_printable(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f);
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const unsigned lowest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < lowest[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f)) return 0;
    return len;
}

void fwrite_printable(const char *s, size_t n, FILE *f) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_printable(p + i, n - i);
        if (len) fwrite(p + i, 1, len, f);
        else fprintf(f, "\\x%02x", p[i]);
        i += len ? len : 1;
    }
}
