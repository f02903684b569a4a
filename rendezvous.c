/* rendezvous.c — the TCP rendezvous for launches without MPI: the torchrun
 * variables, forming the group at MASTER_ADDR:MASTER_PORT, and bcast /
 * allgather / barrier over it (a star through rank 0). Owns its sockets and
 * its wire format; no MPI, no CUDA. Interface and guarantees: rendezvous.h.
 *
 * Wire format (integers big-endian):
 *   hello, a connecting rank's first 24 bytes: magic, version, world, rank
 *     (u32 each) and the job key (u64: FNV-1a of the job id, see
 *     rdzv_open_job; version 1's hello had no key and 16 bytes);
 *   then frames, a 16-byte header (op u32, seq u32, len u64) and len bytes.
 *     Rank 0 answers a hello with WELCOME (seq 0, len 0) once every rank has
 *     arrived, or ABORT (the payload is the reason, text); a hello with
 *     another job key gets REFUSE (the payload is rank 0's job id) and the
 *     connection closed, and rank 0 goes on waiting for its own ranks. Collective k
 *     (counted from 1 on every rank) is BCAST (rank 0 -> each rank: n bytes),
 *     ALLGATHER (each rank -> rank 0: n bytes; rank 0 -> each rank:
 *     world * n bytes), BARRIER (ALLGATHER of 0 bytes), GATHER (each rank ->
 *     rank 0: n bytes) or SCATTER (rank 0 -> rank i: its n bytes). When rank 0 fails
 *     it sends ABORT with its reason to every rank whose stream is at a frame
 *     boundary, so they fail with the reason that names the culprit; a rank
 *     other than 0 that fails closes its connection, which rank 0 sees.
 * Sockets are non-blocking; every read and write waits in poll() against a
 * deadline, retries EINTR, and sends with MSG_NOSIGNAL (a vanished peer is
 * an error, never SIGPIPE). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rendezvous.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RDZV_MAGIC 0x4c545256u /* "LTRV" */
#define RDZV_VERSION 2u
#define HELLO_BYTES 24
#define HELLO_V1_BYTES 16 /* magic, version, world, rank: enough to tell the version */
#define HDR_BYTES 16
#define REASON_MAX 1024
/* Ranks other than 0 wait this much longer than their timeout for rank 0's
 * answer, so that when both give up rank 0's reason (which knows who is
 * missing) arrives first. */
#define GRACE_S 0.5
/* How long rank 0 spends telling the others why it failed. */
#define ABORT_S 0.5
/* Connections accepted but not yet identified (strays included). */
#define PENDING_EXTRA 16

enum { OP_WELCOME = 1, OP_ABORT, OP_BCAST, OP_ALLGATHER, OP_BARRIER, OP_GATHER, OP_SCATTER, OP_REFUSE };

struct Rendezvous {
    int rank, world;
    double timeout_s;
    int *fd;       /* rank 0: fd[i] is rank i's connection (fd[0] = -1); others: fd[0] is rank 0's */
    unsigned seq;  /* collectives started */
    int broken;
    char reason[REASON_MAX];
    char where[128]; /* "addr:port", for messages */
    char job[RDZV_JOB_MAX]; /* the job id (rdzv_open_job), "" none */
    uint64_t job_key;       /* its FNV-1a hash, in the hello */
};

/* a job id for messages: "id" (cut at 60 bytes), or none */
static const char *quoted_id(const char *id, char *out, size_t n) {
    if (*id) snprintf(out, n, "\"%.60s\"", id);
    else snprintf(out, n, "none");
    return out;
}


static void say(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t n, const char *fmt, ...) {
    if (!why || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vformat_line(why, n, fmt, ap);
    va_end(ap);
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (24 - 8 * i));
}
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static void put_hdr(unsigned char *p, uint32_t op, uint32_t seq, uint64_t len) {
    put32(p, op);
    put32(p + 4, seq);
    put32(p + 8, (uint32_t)(len >> 32));
    put32(p + 12, (uint32_t)len);
}
static void get_hdr(const unsigned char *p, uint32_t *op, uint32_t *seq, uint64_t *len) {
    *op = get32(p);
    *seq = get32(p + 4);
    *len = (uint64_t)get32(p + 8) << 32 | get32(p + 12);
}

static const char *op_name(uint32_t op) {
    switch (op) {
    case OP_WELCOME: return "welcome";
    case OP_ABORT: return "abort";
    case OP_BCAST: return "bcast";
    case OP_ALLGATHER: return "allgather";
    case OP_BARRIER: return "barrier";
    case OP_GATHER: return "gather";
    case OP_SCATTER: return "scatter";
    case OP_REFUSE: return "refuse";
    default: return "unknown frame";
    }
}

/* ---- deadline-bound I/O ---- */

enum { IO_OK = 0, IO_TIMEOUT = -1, IO_CLOSED = -2, IO_ERROR = -3 };

/* poll()'s timeout for a deadline: rounded up, at most a minute at a time
 * (callers loop), so a huge timeout_s cannot overflow an int. */
static int ms_left(double deadline) {
    double ms = (deadline - now_s()) * 1000.0 + 1.0;
    return ms < 1 ? 1 : ms > 60000 ? 60000 : (int)ms;
}

/* Wait until fd is ready for events or the deadline passes: 1 ready (or in
 * error: the next read/write says which), 0 timed out, -1 poll failed. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int k = poll(&p, 1, ms_left(deadline));
        if (k > 0) return 1;
        if (k < 0 && errno != EINTR) return -1;
    }
}

/* Read or write exactly n bytes before the deadline. IO_CLOSED: the peer
 * closed or reset the connection; IO_ERROR: errno says why. */
static int io_full(int fd, void *buf, size_t n, int writing, double deadline) {
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = writing ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
        if (k > 0) { done += (size_t)k; continue; }
        if (k == 0) return IO_CLOSED;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(fd, writing ? POLLOUT : POLLIN, deadline);
            if (w == 0) return IO_TIMEOUT;
            if (w < 0) return IO_ERROR;
            continue;
        }
        if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN) return IO_CLOSED;
        return IO_ERROR;
    }
    return IO_OK;
}

/* What went wrong with a peer, as the end of a sentence ("rank 3 " + this). */
static const char *io_what(int rc, int err, double timeout_s, char *tmp, size_t n) {
    if (rc == IO_CLOSED) return "closed its connection (exited?)";
    if (rc == IO_TIMEOUT) { snprintf(tmp, n, "did not answer within %g s", timeout_s); return tmp; }
    snprintf(tmp, n, "connection failed: %s", strerror(err));
    return tmp;
}

static int send_frame(int fd, uint32_t op, uint32_t seq, const void *data, size_t len, double deadline) {
    unsigned char h[HDR_BYTES];
    put_hdr(h, op, seq, len);
    int rc = io_full(fd, h, sizeof h, 1, deadline);
    return rc ? rc : io_full(fd, (void *)data, len, 1, deadline);
}

/* Read an ABORT frame's text after its header (at most REASON_MAX - 1 bytes
 * of it; the rest is left unread, the connection is finished anyway). */
static void read_abort_text(int fd, uint64_t len, char *text, size_t n, double deadline) {
    size_t k = len < n - 1 ? (size_t)len : n - 1;
    if (io_full(fd, text, k, 0, deadline) != IO_OK) k = 0;
    text[k] = 0;
    if (!k) snprintf(text, n, "(no reason received)");
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Close after sending: half-close, then read and discard what the peers
 * send until each closes its end or the deadline passes. Closing with unread
 * bytes makes the kernel reset the connection, and a reset can discard what
 * was just sent (an ABORT's reason) before the peer reads it; a peer that
 * reads an ABORT closes its end, so this rarely waits. */
static void linger_close(int *fd, int count, double deadline) {
    struct pollfd p[64];
    for (int i = 0; i < count; i++)
        if (fd[i] >= 0) shutdown(fd[i], SHUT_WR);
    for (int base = 0; base < count; base += 64) {
        int m = count - base < 64 ? count - base : 64;
        for (;;) {
            int open = 0;
            for (int i = 0; i < m; i++) {
                int *f = &fd[base + i];
                if (*f >= 0) {
                    char junk[4096];
                    ssize_t k;
                    int reads = 0; /* at most 1 MiB a pass, so the deadline is seen */
                    do k = recv(*f, junk, sizeof junk, MSG_DONTWAIT);
                    while ((k > 0 && ++reads < 256) || (k < 0 && errno == EINTR));
                    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) close_fd(f); /* its end is closed */
                }
                p[i] = (struct pollfd){.fd = *f, .events = POLLIN};
                open += *f >= 0;
            }
            double left = deadline - now_s();
            if (!open || left <= 0) break;
            if (poll(p, (nfds_t)m, ms_left(deadline)) < 0 && errno != EINTR) break;
        }
        for (int i = 0; i < m; i++) close_fd(&fd[base + i]);
    }
}

static int set_socket_options(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small frames: no Nagle delay */
    return 0;
}

/* ---- failure: record, tell the others (rank 0), close (other ranks) ---- */

/* Rank 0 sends ABORT with the reason to every connected rank except skip
 * (a rank whose stream may be mid-frame) and closes every connection, within
 * ABORT_S in all. */
static void abort_peers(int *fd, int world, int skip, const char *reason) {
    double deadline = now_s() + ABORT_S;
    for (int i = 1; i < world; i++)
        if (fd[i] >= 0 && (i == skip || send_frame(fd[i], OP_ABORT, 0, reason, strlen(reason), deadline) != IO_OK))
            close_fd(&fd[i]);
    linger_close(fd + 1, world - 1, deadline);
}

/* Mark r broken with the reason, tell the others, copy it to why; -1. */
static int fail(Rendezvous *r, int skip, char *why, size_t wn, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail(Rendezvous *r, int skip, char *why, size_t wn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vformat_line(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
    r->broken = 1;
    if (r->rank == 0) abort_peers(r->fd, r->world, skip, r->reason);
    else close_fd(&r->fd[0]); /* rank 0 sees the connection end */
    say(why, wn, "%s", r->reason);
    return -1;
}

/* ---- rdzv_env ---- */

/* Reject what is plainly not an address before asking the resolver (a
 * name of digits and dots only is meant as IPv4, and no host name is);
 * what names it in the message ("rendezvous address ", "MASTER_ADDR="). */
static int check_addr(const char *what, const char *addr, char *why, size_t n) {
    if (!addr || !*addr) { say(why, n, "the rendezvous address is empty (expected MASTER_ADDR, rank 0's host)"); return -1; }
    int dotted = 1;
    for (const char *q = addr; *q; q++) {
        if ((unsigned char)*q <= ' ' || *q == 0x7f) {
            say(why, n, "%s'%.60s' contains a space or control character (expected a host name or IP address)", what, addr);
            return -1;
        }
        if (!(*q == '.' || (*q >= '0' && *q <= '9'))) dotted = 0;
    }
    struct in_addr tmp;
    if (dotted && inet_pton(AF_INET, addr, &tmp) != 1) {
        say(why, n, "%s'%.60s' is not a valid IPv4 address (expected a host name or IP address)", what, addr);
        return -1;
    }
    return 0;
}

/* A decimal integer in [lo, hi]: 1 read, 0 unset (only when optional), -1
 * with the reason. ctx says where the range comes from (may be ""). */
static int env_int_in(const char *name, int optional, long lo, long hi, const char *ctx, int *out, char *why,
                      size_t n) {
    const char *s = getenv(name);
    if (!s || !*s) {
        if (optional) return 0;
        say(why, n, "%s is not set (expected an integer in %ld..%ld%s)", name, lo, hi, ctx);
        return -1;
    }
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    int digits = 1;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') digits = 0;
    if (!*p || !digits) {
        say(why, n, "%s='%.40s' is not a number (expected an integer in %ld..%ld%s)", name, s, lo, hi, ctx);
        return -1;
    }
    errno = 0;
    long v = strtol(s, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) {
        say(why, n, "%s=%.40s is out of range (expected an integer in %ld..%ld%s)", name, s, lo, hi, ctx);
        return -1;
    }
    *out = (int)v;
    return 1;
}

/* MASTER_ADDR's value a into e, checked before any rendezvous (a bad one is
 * exit 2, not a failed rendezvous) */
static int set_master_addr(RdzvEnv *e, const char *a, char *why, size_t n) {
    if (strlen(a) >= sizeof e->master_addr) {
        say(why, n, "MASTER_ADDR is %zu characters long (expected a host name or IP address, at most %zu)", strlen(a),
            sizeof e->master_addr - 1);
        return -1;
    }
    if (check_addr("MASTER_ADDR=", a, why, n) < 0) return -1;
    strcpy(e->master_addr, a);
    return 0;
}

/* RdzvEnv.job: LLMTRAIN_RDZV_ID, else the launcher's: an srun step's
 * SLURM_JOB_ID.SLURM_STEP_ID, torchrun's TORCHELASTIC_RUN_ID (its --rdzv-id;
 * "none", its default, counts as unset), else SLURM_JOB_ID (torchrun
 * started inside a Slurm job) */
static void set_job(RdzvEnv *e, int srun_step) {
    const char *id = getenv("LLMTRAIN_RDZV_ID"), *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (id && *id) snprintf(e->job, sizeof e->job, "%s", id);
    else if (srun_step) snprintf(e->job, sizeof e->job, "%s.%s", job ? job : "", step ? step : "");
    else if ((id = getenv("TORCHELASTIC_RUN_ID")) && *id && strcmp(id, "none") != 0) /* torchrun's default: none given */
        snprintf(e->job, sizeof e->job, "%s", id);
    else snprintf(e->job, sizeof e->job, "%s", job ? job : "");
}

int rdzv_env_world(int *world, char *why, size_t n) { return env_int_in("WORLD_SIZE", 1, 1, 1 << 20, "", world, why, n); }

int rdzv_env(RdzvEnv *e, char *why, size_t n) {
    memset(e, 0, sizeof *e);
    e->local_world = -1;
    char ctx[64];
    if (env_int_in("WORLD_SIZE", 0, 1, 1 << 20, "", &e->world, why, n) < 0) return -1;
    snprintf(ctx, sizeof ctx, " for WORLD_SIZE=%d", e->world);
    if (env_int_in("RANK", 0, 0, e->world - 1, ctx, &e->rank, why, n) < 0) return -1;
    if (env_int_in("LOCAL_WORLD_SIZE", 1, 1, e->world, ctx, &e->local_world, why, n) < 0) return -1;
    if (e->local_world > 0) snprintf(ctx, sizeof ctx, " for LOCAL_WORLD_SIZE=%d", e->local_world);
    if (env_int_in("LOCAL_RANK", 0, 0, (e->local_world > 0 ? e->local_world : e->world) - 1, ctx, &e->local_rank,
                   why, n) < 0)
        return -1;
    const char *a = getenv("MASTER_ADDR");
    if (!a || !*a) {
        say(why, n, "MASTER_ADDR is not set (expected the host name or IP address of rank 0)");
        return -1;
    }
    if (set_master_addr(e, a, why, n) < 0) return -1;
    if (env_int_in("MASTER_PORT", 0, 1, 65535, " (a TCP port)", &e->master_port, why, n) < 0) return -1;
    set_job(e, 0);
    return 0;
}

/* ---- Slurm ---- */

int rdzv_hostlist_first(const char *list, char *out, size_t outn, char *why, size_t n) {
    size_t o = 0;
    if (!list || !*list) {
        say(why, n, "the node list is empty (expected Slurm's node list, e.g. node[01-04])");
        return -1;
    }
    for (const char *p = list; *p && *p != ','; ) {
        const char *from = p, *to = p + 1; /* the bytes to copy */
        if (*p == '[') { /* a bracket's first number, its zero padding kept */
            const char *q = p + 1;
            while (*q >= '0' && *q <= '9') q++;
            const char *r = q;
            while ((*r >= '0' && *r <= '9') || *r == '-' || *r == ',') r++;
            if (q == p + 1 || *r != ']') {
                say(why, n, "node list '%.80s' is malformed at '%.20s' (expected [N], [N-M] or [N-M,K,...] after a name)", list, p);
                return -1;
            }
            from = p + 1;
            to = q;
            p = r + 1;
        } else if (*p == ']') {
            say(why, n, "node list '%.80s' has a ']' without its '['", list);
            return -1;
        } else {
            p++;
        }
        if (o + (size_t)(to - from) >= outn) {
            say(why, n, "node list '%.80s': its first host name is longer than %zu characters", list, outn - 1);
            return -1;
        }
        memcpy(out + o, from, (size_t)(to - from));
        o += (size_t)(to - from);
    }
    out[o] = 0;
    if (!o) {
        say(why, n, "node list '%.80s' starts with an empty name (expected Slurm's node list, e.g. node[01-04])", list);
        return -1;
    }
    return 0;
}

int rdzv_env_slurm(RdzvEnv *e, char *why, size_t n) {
    memset(e, 0, sizeof *e);
    e->world = 1;
    e->local_world = -1; /* from the host names: SLURM_NODEID counts the job's nodes, not the step's */
    int rc = env_int_in("SLURM_STEP_NUM_TASKS", 1, 1, 1 << 20, "", &e->world, why, n);
    if (rc <= 0) return rc; /* not a task of an srun step */
    if (e->world == 1) return 1; /* alone (also salloc's interactive step): nothing else is read */
    char ctx[64];
    snprintf(ctx, sizeof ctx, " for SLURM_STEP_NUM_TASKS=%d", e->world);
    if (env_int_in("SLURM_PROCID", 0, 0, e->world - 1, ctx, &e->rank, why, n) < 0) return -1;
    if (env_int_in("SLURM_LOCALID", 0, 0, e->world - 1, ctx, &e->local_rank, why, n) < 0) return -1;
    const char *a = getenv("MASTER_ADDR");
    if (a && *a) { /* the user's choice of rank 0's address (e.g. another network's name) */
        if (set_master_addr(e, a, why, n) < 0) return -1;
    } else { /* rank 0 runs on the step's first node */
        const char *var = getenv("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
        const char *list = getenv(var);
        char sub[300];
        if (!list || !*list) {
            say(why, n, "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set (expected the step's nodes; or set MASTER_ADDR)");
            return -1;
        }
        if (rdzv_hostlist_first(list, e->master_addr, sizeof e->master_addr, sub, sizeof sub) < 0) {
            say(why, n, "%s: %s", var, sub);
            return -1;
        }
        snprintf(ctx, sizeof ctx, "%s's first host ", var);
        if (check_addr(ctx, e->master_addr, why, n) < 0) return -1;
    }
    if (env_int_in("MASTER_PORT", 1, 1, 65535, " (a TCP port)", &e->master_port, why, n) < 0) return -1;
    if (!e->master_port) { /* one port per job and step, below Linux's ephemeral range (32768-60999) */
        int job = 0;
        if (env_int_in("SLURM_JOB_ID", 0, 0, INT_MAX, " (or set MASTER_PORT)", &job, why, n) < 0) return -1;
        /* a step id is 32 bits unsigned (Slurm's special steps are near 2^32); only its value mod 8 is used */
        const char *st = getenv("SLURM_STEP_ID");
        unsigned long step = 0;
        if (st && *st) {
            char *end;
            errno = 0;
            step = strtoul(st, &end, 10);
            if (*st < '0' || *st > '9' || *end || errno == ERANGE || step > 0xffffffffUL) {
                say(why, n, "SLURM_STEP_ID='%.40s' is not a step id (expected an integer in 0..4294967295)", st);
                return -1;
            }
        }
        e->master_port = RDZV_SLURM_PORT(job, step);
    }
    set_job(e, 1);
    return 1;
}

/* ---- rdzv_open ---- */

/* "2" or "2, 5-7": the ranks 1..world-1 whose fd is -1 (the list is cut
 * with ", ..." past 200 characters); returns how many. */
static int missing_ranks(const int *fd, int world, char *out, size_t n) {
    int count = 0, cut = 0;
    out[0] = 0;
    for (int i = 1; i < world; i++) {
        if (fd[i] >= 0) continue;
        int j = i;
        while (j + 1 < world && fd[j + 1] < 0) j++;
        count += j - i + 1;
        size_t len = strlen(out);
        if (len > 200) {
            if (!cut) snprintf(out + len, n - len, ", ...");
            cut = 1;
        } else if (j == i) {
            snprintf(out + len, n - len, "%s%d", len ? ", " : "", i);
        } else {
            snprintf(out + len, n - len, "%s%d-%d", len ? ", " : "", i, j);
        }
        i = j;
    }
    return count;
}

static int resolve(const char *addr, int port, int flags, struct addrinfo **res) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = flags;
    return getaddrinfo(addr, ps, &hints, res);
}

/* A listening socket for rank 0 (see rendezvous.h for the bind address),
 * or -1 with the reason. */
static int listen_on(const char *addr, int port, int backlog, char *why, size_t n) {
    struct addrinfo *res = NULL;
    int numeric = resolve(addr, port, AI_NUMERICHOST, &res) == 0;
    if (!numeric) {
        int g = resolve(addr, port, 0, &res);
        if (g) {
            say(why, n, "rank 0 cannot resolve the rendezvous address '%.60s': %s", addr, gai_strerror(g));
            return -1;
        }
    }
    struct sockaddr_storage sa;
    socklen_t salen = (socklen_t)res->ai_addrlen;
    memcpy(&sa, res->ai_addr, res->ai_addrlen);
    int family = res->ai_family;
    freeaddrinfo(res);
    for (int attempt = 0; attempt < 2; attempt++) {
        int wildcard = !numeric || attempt == 1;
        if (wildcard) {
            if (family == AF_INET6) {
                struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&sa;
                s6->sin6_addr = in6addr_any;
                s6->sin6_scope_id = 0;
            } else {
                ((struct sockaddr_in *)&sa)->sin_addr.s_addr = htonl(INADDR_ANY);
            }
        }
        int fd = socket(family, SOCK_STREAM, 0);
        if (fd < 0) {
            say(why, n, "rank 0 cannot create a socket: %s", strerror(errno));
            return -1;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (family == AF_INET6 && wildcard) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, (struct sockaddr *)&sa, salen) == 0 && listen(fd, backlog) == 0 && set_socket_options(fd) == 0)
            return fd;
        int err = errno;
        close(fd);
        if (err == EADDRNOTAVAIL && !wildcard) continue; /* not this host's address: the wildcard */
        say(why, n, "rank 0 cannot listen on %s%.60s:%d: %s%s", wildcard ? "all addresses for " : "", addr, port,
            strerror(err), err == EADDRINUSE ? " (another job or service on that port? MASTER_PORT or LLMTRAIN_RDZV_PORT chooses another)" : "");
        return -1;
    }
    return -1; /* not reached */
}

typedef struct Pending {
    int fd;
    size_t got;
    unsigned char hello[HELLO_BYTES];
    char from[80];
} Pending;

static void peer_name(int fd, char *out, size_t n) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[64], serv[16];
    if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 &&
        getnameinfo((struct sockaddr *)&sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(out, n, "%s:%s", host, serv);
    else
        snprintf(out, n, "an unknown address");
}

/* Rank 0: accept the other ranks on lfd (a listening socket it takes over;
 * -1: listen on addr:port first). 0, or -1 with the reason (already sent to
 * every connected rank). */
static int accept_ranks(Rendezvous *r, int lfd, const char *addr, int port, double deadline, char *why, size_t wn) {
    int W = r->world;
    if (lfd < 0) lfd = listen_on(addr, port, W + PENDING_EXTRA, r->reason, sizeof r->reason);
    if (lfd < 0) {
        say(why, wn, "%s", r->reason);
        return -1;
    }
    int np_max = W + PENDING_EXTRA, np = 0, arrived = 0, dropped = 0, refused = 0, rc = -1;
    int bad_fd = -1; /* a connection to tell why before closing */
    Pending *pend = calloc((size_t)np_max, sizeof *pend);
    struct pollfd *pfd = calloc((size_t)(1 + np_max + W), sizeof *pfd);
    char (*from)[80] = calloc((size_t)W, sizeof *from); /* where each rank connected from */
    if (!pend || !pfd || !from) {
        snprintf(r->reason, sizeof r->reason, "rank 0: out of memory");
        goto out;
    }
    while (arrived < W - 1) {
        double left = deadline - now_s();
        if (left <= 0) {
            char miss[256];
            int m = missing_ranks(r->fd, W, miss, sizeof miss);
            char other[200] = "", id[80];
            if (refused)
                snprintf(other, sizeof other, "; %d connection%s of another job (not job id %s) turned away", refused,
                         refused > 1 ? "s" : "", quoted_id(r->job, id, sizeof id));
            snprintf(r->reason, sizeof r->reason,
                     "rendezvous at %s timed out after %g s: rank%s %.220s never arrived (%d of %d ranks present)%s%s",
                     r->where, r->timeout_s, m > 1 ? "s" : "", miss, W - m, W,
                     dropped ? "; connections that did not speak this protocol were dropped" : "", other);
            goto out;
        }
        int k = 0;
        pfd[k++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < np; i++) pfd[k++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        for (int i = 1; i < W; i++) pfd[k++] = (struct pollfd){.fd = r->fd[i], .events = POLLIN}; /* -1: ignored */
        int pr = poll(pfd, (nfds_t)k, ms_left(deadline));
        if (pr < 0 && errno != EINTR) {
            snprintf(r->reason, sizeof r->reason, "rank 0: poll failed: %s", strerror(errno));
            goto out;
        }
        if (pr <= 0) continue;
        /* An arrived rank sends nothing before WELCOME: readable means it
         * left (forget it: it may connect again) or broke the protocol. */
        for (int i = 1; i < W; i++) {
            if (r->fd[i] < 0 || !pfd[1 + np + i - 1].revents) continue;
            char c;
            ssize_t got = recv(r->fd[i], &c, 1, MSG_DONTWAIT);
            if (got > 0) {
                snprintf(r->reason, sizeof r->reason, "rank %d sent data before the rendezvous was complete", i);
                goto out;
            }
            if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                close_fd(&r->fd[i]);
                arrived--;
            }
        }
        /* Identify pending connections; walk backwards so removal is safe. */
        for (int i = np - 1; i >= 0; i--) {
            if (!pfd[1 + i].revents) continue;
            Pending *p = &pend[i];
            ssize_t got = recv(p->fd, p->hello + p->got, HELLO_BYTES - p->got, MSG_DONTWAIT);
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            int drop = got <= 0;
            if (got > 0) p->got += (size_t)got;
            if (!drop && p->got < HELLO_V1_BYTES) continue;
            if (!drop && get32(p->hello) != RDZV_MAGIC) drop = 1; /* not ours: a stray, keep waiting */
            if (drop) {
                close_fd(&p->fd);
                dropped++;
                pend[i] = pend[--np];
                continue;
            }
            uint32_t ver = get32(p->hello + 4), world = get32(p->hello + 8), rank = get32(p->hello + 12);
            if (ver == RDZV_VERSION && p->got < HELLO_BYTES) continue; /* the job key is still to come */
            uint64_t key = (uint64_t)get32(p->hello + 16) << 32 | get32(p->hello + 20);
            if (ver == RDZV_VERSION && key != r->job_key) {
                /* a rank of another job that found this port (two jobs on one
                 * MASTER_PORT): tell it, and go on waiting for this job's */
                double until = now_s() + ABORT_S;
                send_frame(p->fd, OP_REFUSE, 0, r->job, strlen(r->job), until);
                linger_close(&p->fd, 1, until);
                refused++;
                pend[i] = pend[--np];
                continue;
            }
            if (ver != RDZV_VERSION)
                snprintf(r->reason, sizeof r->reason, "a peer from %s speaks rendezvous version %u, rank 0 version %u",
                         p->from, ver, RDZV_VERSION);
            else if (world != (uint32_t)W)
                snprintf(r->reason, sizeof r->reason,
                         "world size mismatch: rank %u (from %s) has WORLD_SIZE=%u, rank 0 has WORLD_SIZE=%d", rank, p->from,
                         world, W);
            else if (rank < 1 || rank >= (uint32_t)W)
                snprintf(r->reason, sizeof r->reason, "a peer from %s says it is rank %u (expected 1..%d)", p->from, rank,
                         W - 1);
            else if (r->fd[rank] >= 0)
                snprintf(r->reason, sizeof r->reason, "rank %u connected twice (from %s and from %s): duplicate RANK",
                         rank, from[rank], p->from);
            else {
                r->fd[rank] = p->fd;
                snprintf(from[rank], sizeof from[rank], "%s", p->from);
                arrived++;
                pend[i] = pend[--np];
                continue;
            }
            bad_fd = p->fd;
            p->fd = -1;
            goto out;
        }
        /* Accept what is waiting. */
        if (pfd[0].revents) {
            for (;;) {
                int c = accept(lfd, NULL, NULL);
                if (c < 0) {
                    if (errno == EINTR) continue;
                    break; /* EAGAIN, or a connection that died in the backlog */
                }
                if (set_socket_options(c) < 0) { close(c); continue; }
                if (np == np_max) { /* too many unidentified: drop one */
                    close_fd(&pend[0].fd);
                    dropped++;
                    pend[0] = pend[--np];
                }
                pend[np] = (Pending){.fd = c};
                peer_name(c, pend[np].from, sizeof pend[np].from);
                np++;
            }
        }
    }
    /* Everyone is here. */
    for (int i = 1; i < W; i++) {
        int io = send_frame(r->fd[i], OP_WELCOME, 0, NULL, 0, deadline + GRACE_S);
        if (io != IO_OK) {
            char tmp[96];
            snprintf(r->reason, sizeof r->reason, "rank %d %s while the rendezvous completed", i,
                     io_what(io, errno, r->timeout_s, tmp, sizeof tmp));
            close_fd(&r->fd[i]);
            goto out;
        }
    }
    rc = 0;
out:
    if (rc < 0) {
        r->broken = 1;
        if (bad_fd >= 0) { /* it waits for an answer: tell it first */
            double deadline = now_s() + ABORT_S;
            send_frame(bad_fd, OP_ABORT, 0, r->reason, strlen(r->reason), deadline);
            linger_close(&bad_fd, 1, deadline);
        }
        abort_peers(r->fd, W, -1, r->reason);
        say(why, wn, "%s", r->reason);
    }
    for (int i = 0; pend && i < np; i++) close_fd(&pend[i].fd);
    close(lfd);
    free(pend);
    free(pfd);
    free(from);
    return rc;
}

/* One connection attempt to any address of addr:port before the deadline:
 * the socket, or -1 with errno's message in err. */
static int connect_once(const char *addr, int port, double deadline, char *err, size_t en) {
    struct addrinfo *res = NULL;
    int g = resolve(addr, port, 0, &res);
    if (g) {
        snprintf(err, en, "cannot resolve '%.60s': %s", addr, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM, 0);
        if (fd < 0 || set_socket_options(fd) < 0) {
            snprintf(err, en, "%s", strerror(errno));
            close_fd(&fd);
            continue;
        }
        int c = connect(fd, a->ai_addr, a->ai_addrlen);
        if (c < 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) c = 0;
            else errno = w == 1 ? soerr : ETIMEDOUT;
        }
        if (c < 0) {
            snprintf(err, en, "%s", strerror(errno));
            close_fd(&fd);
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* Other ranks: connect (retrying until the deadline), say hello, wait for
 * rank 0's answer. 0, or -1 with the reason. */
static int join_rank0(Rendezvous *r, const char *addr, int port, double deadline, char *why, size_t wn) {
    char err[160] = "no attempt";
    double backoff = 0.05;
    int fd = -1;
    for (;;) {
        fd = connect_once(addr, port, deadline, err, sizeof err);
        if (fd >= 0) break;
        double left = deadline - now_s();
        if (left > 0) { /* rank 0 may not be listening yet: wait a little longer each time */
            double d = backoff < left ? backoff : left;
            struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
            backoff = backoff * 2 < 1.0 ? backoff * 2 : 1.0;
        }
        if (now_s() >= deadline) {
            say(why, wn, "rank 0 never arrived: nothing answered at %s within %g s (last attempt: %s)", r->where,
                r->timeout_s, err);
            return -1;
        }
    }
    r->fd[0] = fd;
    unsigned char h[HELLO_BYTES > HDR_BYTES ? HELLO_BYTES : HDR_BYTES];
    put32(h, RDZV_MAGIC);
    put32(h + 4, RDZV_VERSION);
    put32(h + 8, (uint32_t)r->world);
    put32(h + 12, (uint32_t)r->rank);
    put32(h + 16, (uint32_t)(r->job_key >> 32));
    put32(h + 20, (uint32_t)r->job_key);
    int io = io_full(fd, h, HELLO_BYTES, 1, deadline);
    if (io == IO_OK) io = io_full(fd, h, HDR_BYTES, 0, deadline + GRACE_S);
    if (io != IO_OK) {
        if (io == IO_TIMEOUT)
            say(why, wn, "connected to rank 0 at %s, but the group was not complete within %g s (rank 0's "
                "message names the ranks that never arrived)", r->where, r->timeout_s);
        else
            say(why, wn, "rank 0 at %s %s before the group was complete", r->where,
                io == IO_CLOSED ? "closed the connection" : strerror(errno));
        close_fd(&r->fd[0]);
        return -1;
    }
    uint32_t op, seq;
    uint64_t len;
    get_hdr(h, &op, &seq, &len);
    if (op == OP_ABORT) {
        char text[REASON_MAX - 40];
        read_abort_text(fd, len, text, sizeof text, now_s() + ABORT_S);
        say(why, wn, "rank 0 ended the rendezvous: %s", text);
        close_fd(&r->fd[0]);
        return -1;
    }
    if (op == OP_REFUSE) {
        char theirs[RDZV_JOB_MAX] = "";
        if (len) read_abort_text(fd, len, theirs, sizeof theirs, now_s() + ABORT_S);
        char a[80], b[80];
        say(why, wn, "%s is the rendezvous of another job (its job id %s, this rank's %s; the id comes from "
            "LLMTRAIN_RDZV_ID, else TORCHELASTIC_RUN_ID, else SLURM_JOB_ID): give this job a MASTER_PORT of its own", r->where,
            quoted_id(theirs, a, sizeof a), quoted_id(r->job, b, sizeof b));
        close_fd(&r->fd[0]);
        return -1;
    }
    if (op != OP_WELCOME || seq != 0 || len != 0) {
        say(why, wn, "%s answered with something that is not this rendezvous protocol (another service on MASTER_PORT?)",
            r->where);
        close_fd(&r->fd[0]);
        return -1;
    }
    return 0;
}

/* rdzv_open, or for rank 0 with lfd >= 0 (a listening socket it takes
 * over) accepting there instead of listening on addr:port. */
static Rendezvous *open_on(int lfd, const char *addr, int port, int rank, int world, const char *job, double timeout_s,
                           char *why, size_t n) {
    if (world < 1 || rank < 0 || rank >= world) {
        say(why, n, "rendezvous: rank %d is not in 0..%d for world size %d", rank, world - 1, world);
        goto bad;
    }
    if (world > 1 && (port < 1 || port > 65535)) {
        say(why, n, "rendezvous port %d is out of range (expected 1..65535)", port);
        goto bad;
    }
    if (!(timeout_s > 0)) {
        say(why, n, "rendezvous timeout %g s must be positive", timeout_s);
        goto bad;
    }
    if (world > 1 && check_addr("rendezvous address ", addr, why, n) < 0) goto bad;
    Rendezvous *r = calloc(1, sizeof *r);
    int *fd = malloc((size_t)world * sizeof *fd);
    if (!r || !fd) {
        free(r);
        free(fd);
        say(why, n, "rendezvous: out of memory");
        goto bad;
    }
    for (int i = 0; i < world; i++) fd[i] = -1;
    r->fd = fd;
    r->rank = rank;
    r->world = world;
    r->timeout_s = timeout_s;
    snprintf(r->job, sizeof r->job, "%s", job ? job : "");
    r->job_key = fnv1a64(r->job);
    snprintf(r->where, sizeof r->where, "%s%.100s%s:%d", addr && strchr(addr, ':') ? "[" : "", addr ? addr : "",
             addr && strchr(addr, ':') ? "]" : "", port);
    if (world == 1) return r;
    double deadline = now_s() + timeout_s;
    int rc = rank == 0 ? accept_ranks(r, lfd, addr, port, deadline, why, n) : join_rank0(r, addr, port, deadline, why, n);
    if (rc < 0) {
        rdzv_close(r);
        return NULL;
    }
    return r;
bad:
    if (lfd >= 0) close(lfd);
    return NULL;
}

Rendezvous *rdzv_open_job(const char *addr, int port, int rank, int world, const char *job, double timeout_s, char *why,
                          size_t n) {
    return open_on(-1, addr, port, rank, world, job, timeout_s, why, n);
}

Rendezvous *rdzv_open(const char *addr, int port, int rank, int world, double timeout_s, char *why, size_t n) {
    return open_on(-1, addr, port, rank, world, "", timeout_s, why, n);
}

/* ---- collectives ---- */

static int usable(Rendezvous *r, char *why, size_t wn) {
    if (!r) { say(why, wn, "rendezvous: no handle (rdzv_open failed)"); return 0; }
    if (r->broken) { say(why, wn, "%s", r->reason); return 0; }
    return 1;
}

/* A rank other than 0 reads rank 0's header for collective (op, seq) and
 * checks it announces len bytes. 0, or -1 (r failed with the reason). */
static int recv_hdr_from0(Rendezvous *r, uint32_t op, uint32_t seq, uint64_t len, double deadline, char *why,
                          size_t wn) {
    unsigned char h[HDR_BYTES];
    int io = io_full(r->fd[0], h, HDR_BYTES, 0, deadline + GRACE_S);
    if (io != IO_OK) {
        char tmp[96];
        return fail(r, -1, why, wn, "rank 0 %s during %s #%u", io_what(io, errno, r->timeout_s, tmp, sizeof tmp),
                    op_name(op), seq);
    }
    uint32_t gop, gseq;
    uint64_t glen;
    get_hdr(h, &gop, &gseq, &glen);
    if (gop == OP_ABORT) {
        char text[REASON_MAX - 40];
        read_abort_text(r->fd[0], glen, text, sizeof text, now_s() + ABORT_S);
        return fail(r, -1, why, wn, "rank 0 ended the rendezvous: %s", text);
    }
    if (gop != op || gseq != seq || glen != len)
        return fail(r, -1, why, wn,
                    "mismatched collectives: rank 0 sent %s #%u of %llu bytes while rank %d is in %s #%u of %llu bytes",
                    op_name(gop), gseq, (unsigned long long)glen, r->rank, op_name(op), seq, (unsigned long long)len);
    return 0;
}

/* Rank 0 to every rank (op BCAST: the same n bytes of `from`, stride 0;
 * op SCATTER: block i of `from`, stride n) into each other rank's `to`. */
static int fan_out(Rendezvous *r, uint32_t op, const void *from, size_t stride, void *to, size_t n, char *why, size_t wn) {
    if (!usable(r, why, wn)) return -1;
    uint32_t seq = ++r->seq;
    if (r->world == 1) return 0;
    double deadline = now_s() + r->timeout_s;
    char tmp[96];
    if (r->rank == 0) {
        const unsigned char *in = from;
        for (int i = 1; i < r->world; i++) {
            int io = send_frame(r->fd[i], op, seq, in + (size_t)i * stride, n, deadline);
            if (io != IO_OK)
                return fail(r, i, why, wn, "rank %d %s during %s #%u", i,
                            io_what(io, errno, r->timeout_s, tmp, sizeof tmp), op_name(op), seq);
        }
        return 0;
    }
    if (recv_hdr_from0(r, op, seq, n, deadline, why, wn) < 0) return -1;
    int io = io_full(r->fd[0], to, n, 0, deadline + GRACE_S);
    if (io != IO_OK)
        return fail(r, -1, why, wn, "rank 0 %s during %s #%u", io_what(io, errno, r->timeout_s, tmp, sizeof tmp),
                    op_name(op), seq);
    return 0;
}

int rdzv_bcast(Rendezvous *r, void *buf, size_t n, char *why, size_t wn) {
    return fan_out(r, OP_BCAST, buf, 0, buf, n, why, wn);
}

/* Allgather (op ALLGATHER), barrier (op BARRIER, n = 0) or gather (op
 * GATHER): each rank's n bytes to rank 0; except for GATHER, rank 0's
 * assembled world * n bytes back to each rank (a gather's other ranks
 * return once theirs is sent, and only rank 0's recv is touched). */
static int gather_all(Rendezvous *r, uint32_t op, const void *send, void *recv, size_t n, char *why, size_t wn) {
    if (!usable(r, why, wn)) return -1;
    uint32_t seq = ++r->seq;
    int W = r->world;
    if (n && (size_t)W > SIZE_MAX / n) return fail(r, -1, why, wn, "%s #%u: %zu bytes x %d ranks overflows", op_name(op), seq, n, W);
    size_t total = n * (size_t)W;
    unsigned char *out = recv;
    int back = op != OP_GATHER;
    if (n && (back || r->rank == 0)) memmove(out + (size_t)r->rank * n, send, n);
    if (W == 1) return 0;
    double deadline = now_s() + r->timeout_s;
    char tmp[96];
    if (r->rank == 0) {
        for (int i = 1; i < W; i++) {
            unsigned char h[HDR_BYTES];
            int io = io_full(r->fd[i], h, HDR_BYTES, 0, deadline);
            uint32_t gop, gseq;
            uint64_t glen;
            if (io == IO_OK) {
                get_hdr(h, &gop, &gseq, &glen);
                if (gop != op || gseq != seq || glen != n)
                    return fail(r, -1, why, wn,
                                "mismatched collectives: rank %d is in %s #%u of %llu bytes while rank 0 is in %s #%u of "
                                "%zu bytes", i, op_name(gop), gseq, (unsigned long long)glen, op_name(op), seq, n);
                io = io_full(r->fd[i], out + (size_t)i * n, n, 0, deadline);
            }
            if (io != IO_OK)
                return fail(r, -1, why, wn, "rank %d %s during %s #%u", i,
                            io_what(io, errno, r->timeout_s, tmp, sizeof tmp), op_name(op), seq);
        }
        for (int i = 1; back && i < W; i++) {
            int io = send_frame(r->fd[i], op, seq, out, total, deadline);
            if (io != IO_OK)
                return fail(r, i, why, wn, "rank %d %s during %s #%u", i,
                            io_what(io, errno, r->timeout_s, tmp, sizeof tmp), op_name(op), seq);
        }
        return 0;
    }
    int io = send_frame(r->fd[0], op, seq, send, n, deadline);
    if (io != IO_OK)
        return fail(r, -1, why, wn, "rank 0 %s during %s #%u", io_what(io, errno, r->timeout_s, tmp, sizeof tmp),
                    op_name(op), seq);
    if (!back) return 0;
    if (recv_hdr_from0(r, op, seq, total, deadline, why, wn) < 0) return -1;
    io = io_full(r->fd[0], out, total, 0, deadline + GRACE_S);
    if (io != IO_OK)
        return fail(r, -1, why, wn, "rank 0 %s during %s #%u", io_what(io, errno, r->timeout_s, tmp, sizeof tmp),
                    op_name(op), seq);
    return 0;
}

int rdzv_allgather(Rendezvous *r, const void *send, void *recv, size_t n, char *why, size_t wn) {
    return gather_all(r, OP_ALLGATHER, send, recv, n, why, wn);
}

int rdzv_barrier(Rendezvous *r, char *why, size_t wn) {
    return gather_all(r, OP_BARRIER, NULL, NULL, 0, why, wn);
}

int rdzv_gather(Rendezvous *r, const void *send, void *recv, size_t n, char *why, size_t wn) {
    return gather_all(r, OP_GATHER, send, recv, n, why, wn);
}

/* Scatter (op SCATTER): rank 0's send[world * n], block i to rank i's recv. */
int rdzv_scatter(Rendezvous *r, const void *send, void *recv, size_t n, char *why, size_t wn) {
    if (r && !r->broken && r->rank == 0 && n) memmove(recv, send, n);
    return fan_out(r, OP_SCATTER, send, n, recv, n, why, wn);
}

int rdzv_rank(const Rendezvous *r) { return r->rank; }
int rdzv_world(const Rendezvous *r) { return r->world; }
void rdzv_set_timeout(Rendezvous *r, double timeout_s) {
    if (r && timeout_s > 0) r->timeout_s = timeout_s;
}

/* ---- rdzv_split ---- */

static int is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return 0;
}

/* The numeric address other ranks can reach this one at: the local end of
 * its connection in the parent group (the interface it reached rank 0
 * through; rank 0: the end of rank 1's connection). When that is a loopback
 * address (MASTER_ADDR names this host), the first interface that is up and
 * not loopback, of the same family, so ranks on other hosts can connect; on a
 * host with only loopback, loopback. 0, or -1 with the reason. */
static int reachable_addr(const Rendezvous *parent, char *out, size_t n, int *family, char *why, size_t wn) {
    int fd = parent->rank == 0 ? parent->fd[1] : parent->fd[0];
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        say(why, wn, "rendezvous split: no local address (%s)", fd < 0 ? "no connection" : strerror(errno));
        return -1;
    }
    *family = sa.ss_family;
    if (is_loopback((struct sockaddr *)&sa)) {
        struct ifaddrs *ifs = NULL, *it;
        if (getifaddrs(&ifs) == 0) {
            for (it = ifs; it; it = it->ifa_next) {
                if (!it->ifa_addr || it->ifa_addr->sa_family != sa.ss_family || !(it->ifa_flags & IFF_UP) ||
                    (it->ifa_flags & IFF_LOOPBACK) || is_loopback(it->ifa_addr))
                    continue;
                if (sa.ss_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr))
                    continue;
                size_t l = sa.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
                memcpy(&sa, it->ifa_addr, l);
                len = (socklen_t)l;
                break;
            }
            freeifaddrs(ifs);
        }
    }
    int g = getnameinfo((struct sockaddr *)&sa, len, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST);
    if (g) {
        say(why, wn, "rendezvous split: cannot print the local address: %s", gai_strerror(g));
        return -1;
    }
    return 0;
}

/* A listening socket on every address of `family`, on a port the kernel
 * picks; the socket and *port, or -1 with the reason. */
static int listen_ephemeral(int family, int backlog, int *port, char *why, size_t wn) {
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    socklen_t len;
    if (family == AF_INET6) {
        ((struct sockaddr_in6 *)&sa)->sin6_family = AF_INET6;
        ((struct sockaddr_in6 *)&sa)->sin6_addr = in6addr_any;
        len = sizeof(struct sockaddr_in6);
    } else {
        ((struct sockaddr_in *)&sa)->sin_family = AF_INET;
        ((struct sockaddr_in *)&sa)->sin_addr.s_addr = htonl(INADDR_ANY);
        len = sizeof(struct sockaddr_in);
    }
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, backlog) < 0 || set_socket_options(fd) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        say(why, wn, "rendezvous split: cannot listen on a free port: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    *port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

#define SPLIT_ADDR 64
typedef struct SplitInfo {
    unsigned char color[4], key[4], port[4];
    char addr[SPLIT_ADDR];
} SplitInfo;

Rendezvous *rdzv_split(Rendezvous *parent, int color, int key, double timeout_s, char *why, size_t wn) {
    if (!usable(parent, why, wn)) return NULL;
    int W = parent->world, me = parent->rank;
    SplitInfo *all = calloc((size_t)W, sizeof *all);
    SplitInfo mine;
    if (!all) {
        say(why, wn, "rendezvous split: out of memory");
        return NULL;
    }
    Rendezvous *sub = NULL;
    int lfd = -1;
    /* round 1: every rank's color and key */
    memset(&mine, 0, sizeof mine);
    put32(mine.color, (uint32_t)color);
    put32(mine.key, (uint32_t)key);
    if (rdzv_allgather(parent, &mine, all, sizeof mine, why, wn) < 0) goto out;
    /* my group, ordered by (key, parent rank); its first member leads */
    int sub_rank = 0, sub_world = 0, leader = -1;
    for (int i = 0; i < W; i++) {
        if ((int)get32(all[i].color) != color) continue;
        int ki = (int)get32(all[i].key);
        if (ki < key || (ki == key && i < me)) sub_rank++;
        sub_world++;
        if (leader < 0 || ki < (int)get32(all[leader].key)) leader = i;
    }
    if (leader < 0 || sub_world < 1) { /* this rank's own entry always matches */
        say(why, wn, "rendezvous split: rank %d is missing from its own group", me);
        goto out;
    }
    /* round 2: leaders of groups of more than one listen and say where */
    memset(&mine, 0, sizeof mine);
    if (sub_rank == 0 && sub_world > 1) {
        int family = AF_INET, port = 0;
        if (reachable_addr(parent, mine.addr, sizeof mine.addr, &family, why, wn) < 0) goto fail_round2;
        lfd = listen_ephemeral(family, sub_world + PENDING_EXTRA, &port, why, wn);
        if (lfd < 0) goto fail_round2;
        put32(mine.port, (uint32_t)port);
    }
    if (rdzv_allgather(parent, &mine, all, sizeof mine, why, wn) < 0) goto out;
    all[leader].addr[SPLIT_ADDR - 1] = 0;
    if (sub_world > 1 && get32(all[leader].port) == 0) {
        say(why, wn, "rendezvous split: the leader of this rank's group (parent rank %d) could not listen", leader);
        goto out;
    }
    sub = open_on(sub_rank == 0 ? lfd : -1, all[leader].addr, (int)get32(all[leader].port), sub_rank, sub_world, parent->job,
                  timeout_s, why, wn);
    lfd = -1; /* open_on took it */
    if (!sub && why && wn) { /* its "rank 0" is the group's first member: name it */
        char inner[REASON_MAX];
        snprintf(inner, sizeof inner, "%s", why);
        say(why, wn, "the group led by parent rank %d (member %d of %d here) at %.64s:%u: %s", leader, sub_rank, sub_world,
            all[leader].addr, (unsigned)get32(all[leader].port), inner);
    }
    goto out;
fail_round2:
    /* still take part in round 2 (port 0 tells the members), then fail */
    {
        char keep[REASON_MAX];
        snprintf(keep, sizeof keep, "%s", why ? why : "");
        memset(&mine, 0, sizeof mine);
        if (rdzv_allgather(parent, &mine, all, sizeof mine, why, wn) == 0) say(why, wn, "%s", keep);
    }
out:
    if (lfd >= 0) close(lfd);
    free(all);
    return sub;
}

void rdzv_close(Rendezvous *r) {
    if (!r) return;
    linger_close(r->fd, r->world, now_s()); /* no waiting: in order, nothing is left unread */
    free(r->fd);
    free(r);
}
