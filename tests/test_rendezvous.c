/* tests/test_rendezvous.c — rendezvous.c with real processes on 127.0.0.1:
 * groups of 1, 2, 4 and 8 fork()ed ranks open the rendezvous on a free port
 * (bound to port 0 to find one; a group whose rank 0 finds the port taken is
 * started again on another) and check bcast, allgather and barrier byte for
 * byte (rank 0's random 128-byte blob, per-rank blobs, 1 MiB and 64 KiB
 * messages, 0 bytes), with rank 0 starting late and ranks staggered. Failure
 * cases, each bounded in time: a rank that never arrives (rank 0 or another)
 * fails the others within timeout + 1 s naming it; a world-size mismatch, a
 * duplicate rank and mismatched collectives are rejected with the reason; a
 * rank that exits or hangs mid-protocol gives an error on the others, not a
 * hang; connections that do not speak the protocol are dropped while the
 * group still forms; the bind-address policy (an address not on this host,
 * a host name); argument checks; rdzv_env on good and bad variables.
 *
 * Build: make tests/test_rendezvous
 * Run:   tests/test_rendezvous   (one line per check, then "N passed, M
 *                                 failed"; exit 1 on failure) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rendezvous.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdarg.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

/* ---- expected bytes ---- */

static uint64_t seed; /* from /dev/urandom (or the clock) before any fork */
static unsigned char blob0[128];

static void fill(uint64_t key, unsigned char *out, size_t n) {
    uint64_t s = seed ^ (key * 0x9e3779b97f4a7c15ull) ^ 0x5851f42d4c957f2dull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out[i] = (unsigned char)(s >> 24);
    }
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* A port that was free a moment ago: bind port 0 and ask which one. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        perror("free_port");
        exit(99);
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* ---- running a group of processes ---- */

#define MAXP 12
#define MSG 700

/* A process of a scenario: its index among the processes (normally its
 * rank), the number of processes, the port; writes "ok" or what happened to
 * msg and returns 0 (did what it should) or 1. */
typedef int (*Body)(int idx, int nproc, int port, const void *arg, char *msg, size_t n);

typedef struct Result {
    int code;      /* exit code, or -signal */
    double secs;   /* from the group's start to the exit */
    char msg[MSG];
} Result;

/* Shared between the processes of a group (MAP_SHARED, set up before fork). */
static volatile int *shared_flags;

/* Run nproc processes of body; no_wait[i] marks processes expected to hang
 * (killed once every other one has exited). Every process is killed at
 * bound_s. A group whose rank 0 found the port in use runs again on another
 * port. Returns the wall time of the group. */
static double run_group(int nproc, Body body, const void *arg, const int *no_wait, double bound_s, Result *res) {
    for (int attempt = 0;; attempt++) {
        int port = free_port();
        int pfd[MAXP][2];
        pid_t pid[MAXP];
        for (int i = 0; i < MAXP; i++) shared_flags[i] = 0;
        fflush(stdout);
        double t0 = now_s();
        for (int i = 0; i < nproc; i++) {
            if (pipe(pfd[i]) < 0) { perror("pipe"); exit(99); }
            pid[i] = fork();
            if (pid[i] < 0) { perror("fork"); exit(99); }
            if (pid[i] == 0) {
                close(pfd[i][0]);
                char msg[MSG] = "";
                int rc = body(i, nproc, port, arg, msg, sizeof msg);
                if (i == 0 && strstr(msg, "Address already in use")) rc = 3;
                ssize_t w = write(pfd[i][1], msg, strlen(msg));
                (void)w;
                _exit(rc);
            }
            close(pfd[i][1]);
        }
        int done[MAXP] = {0}, left = nproc, port_taken = 0;
        for (int i = 0; i < nproc; i++) res[i] = (Result){.code = -SIGKILL, .secs = 0};
        while (left) {
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p > 0) {
                for (int i = 0; i < nproc; i++)
                    if (pid[i] == p) {
                        done[i] = 1;
                        left--;
                        res[i].code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
                        res[i].secs = now_s() - t0;
                        if (i == 0 && res[i].code == 3) port_taken = 1;
                    }
                continue;
            }
            int waiting = 0;
            for (int i = 0; i < nproc; i++) waiting += !done[i] && !(no_wait && no_wait[i]);
            if (!waiting || port_taken || now_s() - t0 > bound_s) {
                for (int i = 0; i < nproc; i++)
                    if (!done[i]) kill(pid[i], SIGKILL);
                for (int i = 0; i < nproc; i++)
                    if (!done[i]) {
                        waitpid(pid[i], NULL, 0);
                        res[i].secs = now_s() - t0;
                    }
                break;
            }
            sleep_s(0.005);
        }
        for (int i = 0; i < nproc; i++) {
            ssize_t k = read(pfd[i][0], res[i].msg, MSG - 1);
            res[i].msg[k > 0 ? k : 0] = 0;
            close(pfd[i][0]);
        }
        if (!port_taken || attempt == 4) return now_s() - t0;
    }
}

/* Write what went wrong into msg; returns 1 (the body's failure code). */
static int fails(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fails(char *msg, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
    return 1;
}
#define FAILS(...) fails(msg, n, __VA_ARGS__)

/* ---- the good path ---- */

typedef struct Happy {
    const char *addr0, *addr; /* rank 0's address and the others' */
    double delay0;            /* rank 0 starts this late */
    int stagger;              /* ranks start up to 80 ms apart */
} Happy;

static int expect_bytes(const unsigned char *got, uint64_t key, size_t n) {
    unsigned char *want = malloc(n ? n : 1);
    fill(key, want, n);
    int same = memcmp(got, want, n) == 0;
    free(want);
    return same;
}

static int body_happy(int rank, int world, int port, const void *arg, char *msg, size_t n) {
    const Happy *h = arg;
    char why[600];
    if (rank == 0 && h->delay0 > 0) sleep_s(h->delay0);
    if (h->stagger) sleep_s(0.01 * ((rank * 7) % 9));
    Rendezvous *r = rdzv_open(rank == 0 ? h->addr0 : h->addr, port, rank, world, 5.0, why, sizeof why);
    if (!r) return FAILS("rdzv_open: %s", why);
    int rc = 1;
    unsigned char small[128], *big = calloc(1 << 20, 1), *all = calloc((size_t)world << 16, 1);
    unsigned char mine[37], got[37 * MAXP], mine64[1 << 16];
    /* rank 0's random 128 bytes */
    memset(small, 0, sizeof small);
    if (rank == 0) memcpy(small, blob0, sizeof small);
    if (rdzv_bcast(r, small, sizeof small, why, sizeof why)) { FAILS("bcast: %s", why); goto out; }
    if (memcmp(small, blob0, sizeof small)) { FAILS("bcast: rank %d got other bytes than rank 0's blob", rank); goto out; }
    /* every rank's 37 bytes, in rank order */
    fill(100 + (uint64_t)rank, mine, sizeof mine);
    memset(got, 0, sizeof got);
    if (rdzv_allgather(r, mine, got, sizeof mine, why, sizeof why)) { FAILS("allgather: %s", why); goto out; }
    for (int i = 0; i < world; i++)
        if (!expect_bytes(got + 37 * i, 100 + (uint64_t)i, 37)) { FAILS("allgather: rank %d's slice %d is wrong", rank, i); goto out; }
    /* barrier: every rank has entered before any leaves */
    sleep_s(0.005 * rank);
    __atomic_store_n(&shared_flags[rank], 1, __ATOMIC_SEQ_CST);
    if (rdzv_barrier(r, why, sizeof why)) { FAILS("barrier: %s", why); goto out; }
    for (int i = 0; i < world; i++)
        if (!__atomic_load_n(&shared_flags[i], __ATOMIC_SEQ_CST)) { FAILS("barrier: rank %d left before rank %d entered", rank, i); goto out; }
    /* large messages: many partial reads and writes on non-blocking sockets */
    if (rank == 0) fill(7, big, 1 << 20);
    if (rdzv_bcast(r, big, 1 << 20, why, sizeof why)) { FAILS("bcast 1 MiB: %s", why); goto out; }
    if (!expect_bytes(big, 7, 1 << 20)) { FAILS("bcast 1 MiB: rank %d got other bytes", rank); goto out; }
    fill(200 + (uint64_t)rank, mine64, sizeof mine64);
    if (rdzv_allgather(r, mine64, all, sizeof mine64, why, sizeof why)) { FAILS("allgather 64 KiB: %s", why); goto out; }
    for (int i = 0; i < world; i++)
        if (!expect_bytes(all + ((size_t)i << 16), 200 + (uint64_t)i, 1 << 16)) { FAILS("allgather 64 KiB: slice %d wrong", i); goto out; }
    if (rdzv_bcast(r, NULL, 0, why, sizeof why) || rdzv_barrier(r, why, sizeof why)) { FAILS("0 bytes: %s", why); goto out; }
    rc = 0;
    snprintf(msg, n, "ok");
out:
    free(big);
    free(all);
    rdzv_close(r);
    return rc;
}

static int all_ok(const Result *res, int nproc, char *first, size_t n) {
    for (int i = 0; i < nproc; i++)
        if (res[i].code != 0 || strcmp(res[i].msg, "ok")) {
            snprintf(first, n, "rank %d: exit %d: %s", i, res[i].code, res[i].msg);
            return 0;
        }
    return 1;
}

static void test_happy(void) {
    static const int sizes[] = {1, 2, 4, 8};
    Result res[MAXP];
    int ok;
    char first[MSG + 40];
    for (int k = 0; k < 4; k++) {
        int N = sizes[k];
        Happy h = {"127.0.0.1", "127.0.0.1", 0, 0};
        double t = run_group(N, body_happy, &h, NULL, 20, res);
        ok = all_ok(res, N, first, sizeof first);
        check(ok, "%d rank%s: bcast 128 B random blob, allgather 37 B per rank, barrier, bcast 1 MiB, allgather 64 KiB, "
              "0 bytes (%.2f s)%s%s", N, N > 1 ? "s" : "", t, ok ? "" : ": ", ok ? "" : first);
    }
    Happy late = {"127.0.0.1", "127.0.0.1", 0.4, 1};
    double t = run_group(4, body_happy, &late, NULL, 20, res);
    ok = all_ok(res, 4, first, sizeof first);
    check(ok, "4 ranks, rank 0 starts 0.4 s late and ranks staggered: the others retry until it listens (%.2f s)%s%s", t,
          ok ? "" : ": ", ok ? "" : first);
    Happy wild = {"198.51.100.7", "127.0.0.1", 0, 0};
    t = run_group(2, body_happy, &wild, NULL, 20, res);
    ok = all_ok(res, 2, first, sizeof first);
    check(ok, "rank 0 given an address not on this host binds the wildcard; a peer reaches it at 127.0.0.1 (%.2f s)%s%s", t,
          ok ? "" : ": ", ok ? "" : first);
    Happy name = {"localhost", "localhost", 0, 0};
    t = run_group(2, body_happy, &name, NULL, 20, res);
    ok = all_ok(res, 2, first, sizeof first);
    check(ok, "host name 'localhost' (wildcard bind) (%.2f s)%s%s", t, ok ? "" : ": ", ok ? "" : first);
}

/* ---- ranks that never arrive, mismatches, strays ---- */

typedef struct Fault {
    int absent;      /* this rank never calls rdzv_open (-1: none) */
    int bad_world;   /* this rank claims world + 1 (-1: none) */
    int as_rank[MAXP]; /* process i opens as rank as_rank[i] (when use_as) */
    int use_as, world;
    double timeout;
} Fault;

static int body_open_fault(int idx, int nproc, int port, const void *arg, char *msg, size_t n) {
    const Fault *f = arg;
    int rank = f->use_as ? f->as_rank[idx] : idx;
    int world = f->world ? f->world : nproc;
    if (idx == f->absent) return snprintf(msg, n, "absent"), 0;
    if (idx == f->bad_world) world++;
    char why[600];
    Rendezvous *r = rdzv_open("127.0.0.1", port, rank, world, f->timeout, why, sizeof why);
    if (r) {
        rdzv_close(r);
        return FAILS("rdzv_open succeeded");
    }
    snprintf(msg, n, "%s", why);
    return 1; /* failed, as the scenario expects: the parent checks the reason */
}

/* Every process except skip failed (exit 1) within bound seconds with a
 * reason containing want (NULL: any). */
static int failed_with(const Result *res, int nproc, int skip, const char *want, double bound, char *first, size_t n) {
    for (int i = 0; i < nproc; i++) {
        if (i == skip) continue;
        if (res[i].code != 1 || res[i].secs > bound || (want && !strstr(res[i].msg, want))) {
            snprintf(first, n, "process %d: exit %d after %.2f s (bound %.1f, want '%s'): %s", i, res[i].code, res[i].secs,
                     bound, want ? want : "", res[i].msg);
            return 0;
        }
    }
    return 1;
}

static void test_open_faults(void) {
    Result res[MAXP];
    char first[MSG + 200];
    /* a rank that never arrives */
    Fault f = {.absent = 2, .bad_world = -1, .timeout = 1.5};
    double t = run_group(4, body_open_fault, &f, NULL, 10, res);
    int ok = failed_with(res, 4, 2, "rank 2 never arrived", f.timeout + 1, first, sizeof first);
    check(ok, "4 ranks, rank 2 never arrives: ranks 0, 1, 3 fail within timeout + 1 s naming rank 2 (%.2f s)%s%s", t,
          ok ? "" : ": ", ok ? "" : first);
    if (ok) printf("     rank 0 says: %s\n     rank 1 says: %s\n", res[0].msg, res[1].msg);
    f.absent = 0;
    t = run_group(3, body_open_fault, &f, NULL, 10, res);
    ok = failed_with(res, 3, 0, "rank 0 never arrived", f.timeout + 1, first, sizeof first);
    check(ok, "3 ranks, rank 0 never arrives: ranks 1, 2 fail within timeout + 1 s naming rank 0 (%.2f s)%s%s", t,
          ok ? "" : ": ", ok ? "" : first);
    if (ok) printf("     rank 1 says: %s\n", res[1].msg);
    /* several missing: the list is compact */
    Fault many = {.absent = -1, .bad_world = -1, .timeout = 1.0, .world = 8};
    t = run_group(3, body_open_fault, &many, NULL, 10, res);
    ok = failed_with(res, 3, -1, NULL, many.timeout + 1, first, sizeof first) && strstr(res[0].msg, "ranks 3-7 never arrived") &&
         strstr(res[0].msg, "3 of 8 ranks present");
    check(ok, "world 8 with ranks 0-2 present: rank 0 names 'ranks 3-7' (%.2f s)%s%s", t, ok ? "" : ": ",
          ok ? "" : (res[0].msg[0] ? res[0].msg : first));
    /* world-size mismatch */
    Fault mm = {.absent = -1, .bad_world = 2, .timeout = 1.5};
    t = run_group(3, body_open_fault, &mm, NULL, 10, res);
    ok = failed_with(res, 3, -1, NULL, mm.timeout + 1, first, sizeof first) &&
         strstr(res[0].msg, "world size mismatch: rank 2") && strstr(res[0].msg, "WORLD_SIZE=4") &&
         strstr(res[2].msg, "world size mismatch");
    check(ok, "rank 2 says WORLD_SIZE=4 to a world of 3: rejected on rank 0 and on rank 2 with the reason (%.2f s)%s%s", t,
          ok ? "" : ": ", ok ? "" : first);
    if (ok) printf("     rank 0 says: %s\n     rank 2 says: %s\n", res[0].msg, res[2].msg);
    /* duplicate rank */
    Fault dup = {.absent = -1, .bad_world = -1, .timeout = 1.5, .use_as = 1, .as_rank = {0, 1, 1}, .world = 3};
    t = run_group(3, body_open_fault, &dup, NULL, 10, res);
    ok = failed_with(res, 3, -1, NULL, dup.timeout + 1, first, sizeof first) && strstr(res[0].msg, "rank 1 connected twice");
    check(ok, "two processes both RANK=1: rank 0 rejects the duplicate (%.2f s)%s%s", t, ok ? "" : ": ",
          ok ? "" : (res[0].msg[0] ? res[0].msg : first));
}

/* Processes 0..1 form a world of 2; processes 2 and 3 are strays: 2 sends
 * an HTTP request, 3 connects and says nothing. */
static int body_strays(int idx, int nproc, int port, const void *arg, char *msg, size_t n) {
    (void)nproc;
    if (idx < 2) {
        sleep_s(idx == 1 ? 0.3 : 0); /* the strays get there first */
        return body_happy(idx, 2, port, arg, msg, n);
    }
    int fd = -1;
    double t0 = now_s();
    while (now_s() - t0 < 3) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) break;
        close(fd);
        fd = -1;
        sleep_s(0.02);
    }
    if (fd < 0) return FAILS("stray could not connect");
    if (idx == 2) {
        const char *req = "GET / HTTP/1.0\r\n\r\n";
        if (send(fd, req, strlen(req), MSG_NOSIGNAL) < 0) return FAILS("stray write failed");
    }
    char c;
    /* rank 0 drops us (idx 2; unread bytes make that a reset) or closes at the end (idx 3) */
    ssize_t k = read(fd, &c, 1);
    int e = errno;
    close(fd);
    if (k == 0 || (k < 0 && e == ECONNRESET)) return snprintf(msg, n, "ok"), 0;
    return FAILS("stray read returned %zd (%s)", k, k < 0 ? strerror(e) : "data");
}

static void test_strays(void) {
    Result res[MAXP];
    char first[MSG + 40];
    Happy h = {"127.0.0.1", "127.0.0.1", 0, 0};
    double t = run_group(4, body_strays, &h, NULL, 10, res);
    int ok = all_ok(res, 4, first, sizeof first);
    check(ok, "connections that do not speak the protocol (an HTTP request, a silent one) are dropped and the group of 2 "
          "still forms (%.2f s)%s%s", t, ok ? "" : ": ", ok ? "" : first);
}

/* ---- another job on the same port ---- */

/* Processes 0 and 1: job "jobA", a world of 2; process 2: rank 1 of job
 * "jobB" (a world of 3), there first (process 1 starts once process 2's
 * rdzv_open_job has returned: shared flag 2). With arg "timeout": process 1
 * never comes and rank 0 times out after 1 s. A job B of no id ("" as
 * arg) is named none. */
static int body_other_job(int idx, int nproc, int port, const void *arg, char *msg, size_t n) {
    (void)nproc;
    int timeout = arg && !strcmp(arg, "timeout");
    const char *b_id = arg && !timeout ? arg : "jobB";
    if (idx == 1 && timeout) return snprintf(msg, n, "absent"), 0;
    if (idx == 1)
        for (double t0 = now_s(); !shared_flags[2] && now_s() - t0 < 5;) sleep_s(0.01);
    if (idx == 2) sleep_s(0.1); /* after rank 0 listens */
    char why[600];
    Rendezvous *r = rdzv_open_job("127.0.0.1", port, idx == 2 ? 1 : idx, idx == 2 ? 3 : 2, idx == 2 ? b_id : "jobA",
                                  timeout ? 1.0 : 5.0, why, sizeof why);
    if (idx == 2) shared_flags[2] = 1;
    if (!r) return snprintf(msg, n, "%s", why), 1;
    int rc = rdzv_barrier(r, why, sizeof why);
    rdzv_close(r);
    if (rc < 0) return FAILS("barrier: %s", why);
    return snprintf(msg, n, "formed"), 0;
}

/* A version-1 hello (16 bytes, no job key): rank 0 ends the rendezvous
 * with the version, at once, not after its timeout. */
static int body_v1(int idx, int nproc, int port, const void *arg, char *msg, size_t n) {
    (void)nproc;
    (void)arg;
    char why[600];
    if (idx == 0) {
        Rendezvous *r = rdzv_open_job("127.0.0.1", port, 0, 2, "jobA", 5.0, why, sizeof why);
        if (r) { rdzv_close(r); return FAILS("rdzv_open succeeded"); }
        return snprintf(msg, n, "%s", why), 1;
    }
    int fd = -1;
    for (double t0 = now_s(); now_s() - t0 < 3 && fd < 0; sleep_s(0.02)) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { close(fd); fd = -1; }
    }
    if (fd < 0) return FAILS("could not connect");
    unsigned char h[16] = {0x4c, 0x54, 0x52, 0x56, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1}; /* "LTRV", version 1, world 2, rank 1 */
    if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h) return FAILS("send failed");
    char c[64];
    ssize_t k = read(fd, c, sizeof c); /* rank 0's ABORT, then the close */
    close(fd);
    return snprintf(msg, n, "read %zd", k), 0;
}

static void test_other_job(void) {
    Result res[MAXP];
    double t = run_group(3, body_other_job, NULL, NULL, 10, res);
    int ok = res[0].code == 0 && res[1].code == 0 && res[2].code == 1 && res[2].secs < 1.5 &&
             strstr(res[2].msg, "is the rendezvous of another job (its job id \"jobA\", this rank's \"jobB\"; the id comes from "
                                "LLMTRAIN_RDZV_ID, else TORCHELASTIC_RUN_ID, else SLURM_JOB_ID): give this job a MASTER_PORT of its own");
    check(ok, "a rank of job B (another world size) reaches job A's rank 0 first: turned away at once with both ids (%.2f s), "
          "job A forms (%.2f s): %s | rank 0: %s | rank 1: %s", res[2].secs, t, res[2].msg, res[0].msg, res[1].msg);
    t = run_group(3, body_other_job, "", NULL, 10, res);
    ok = res[0].code == 0 && res[1].code == 0 && res[2].code == 1 &&
         strstr(res[2].msg, "is the rendezvous of another job (its job id \"jobA\", this rank's none;");
    check(ok, "the same with job B of no id: named none (%.2f s): %s", t, res[2].msg);
    t = run_group(3, body_other_job, "timeout", NULL, 10, res);
    ok = res[0].code == 1 && res[0].secs < 2.5 && strstr(res[0].msg, "rank 1 never arrived (1 of 2 ranks present); 1 connection of "
                                                        "another job (not job id \"jobA\") turned away");
    check(ok, "job A's rank 1 never comes, job B's came: rank 0's timeout counts the connection it turned away (%.2f s): %s", t,
          res[0].msg);
    t = run_group(2, body_v1, NULL, NULL, 10, res);
    ok = res[0].code == 1 && res[0].secs < 1.5 && strstr(res[0].msg, "speaks rendezvous version 1, rank 0 version 2");
    check(ok, "a version-1 hello (16 bytes, no job key) ends the rendezvous at once with the versions (%.2f s): %s", t, res[0].msg);
}

/* ---- failures during collectives ---- */

typedef struct Mid {
    int culprit;   /* this rank misbehaves after the first bcast */
    int how;       /* 0: exits, 1: hangs, 2: allgather of another size */
    double timeout;
} Mid;

static int body_mid(int rank, int world, int port, const void *arg, char *msg, size_t n) {
    const Mid *m = arg;
    char why[600];
    Rendezvous *r = rdzv_open("127.0.0.1", port, rank, world, m->timeout, why, sizeof why);
    if (!r) return FAILS("rdzv_open: %s", why);
    unsigned char b[128] = {0}, got[16 * MAXP];
    if (rank == 0) memcpy(b, blob0, sizeof b);
    if (rdzv_bcast(r, b, sizeof b, why, sizeof why)) { rdzv_close(r); return FAILS("first bcast: %s", why); }
    if (rank == m->culprit && m->how == 0) _exit(0); /* vanish: the kernel closes the socket */
    if (rank == m->culprit && m->how == 1) { sleep_s(30); _exit(0); }
    size_t len = rank == m->culprit && m->how == 2 ? 8 : 16;
    int rc = rdzv_allgather(r, b, got, len, why, sizeof why);
    /* a broken handle keeps failing with the first reason */
    char again[600];
    int rc2 = rc ? rdzv_barrier(r, again, sizeof again) : 0;
    rdzv_close(r);
    if (!rc) return FAILS("allgather succeeded");
    if (rc2 == 0 || strcmp(again, why)) return FAILS("barrier after the failure: rc %d, '%s' (first: '%s')", rc2, again, why);
    snprintf(msg, n, "%s", why);
    return 1;
}

static void test_mid(void) {
    Result res[MAXP];
    char first[MSG + 200];
    Mid exit3 = {3, 0, 3.0};
    int skip3[MAXP] = {0, 0, 0, 1};
    double t = run_group(4, body_mid, &exit3, skip3, 10, res);
    int ok = failed_with(res, 4, 3, "rank 3 closed its connection", 1.5, first, sizeof first);
    check(ok, "4 ranks, rank 3 exits after the first bcast: the others' allgather fails at once naming it, well inside "
          "the 3 s timeout (%.2f s)%s%s", t, ok ? "" : ": ", ok ? "" : first);
    if (ok) printf("     rank 0 says: %s\n     rank 1 says: %s\n", res[0].msg, res[1].msg);
    Mid exit0 = {0, 0, 3.0};
    int skip0[MAXP] = {1, 0, 0};
    t = run_group(3, body_mid, &exit0, skip0, 10, res);
    ok = failed_with(res, 3, 0, "rank 0 closed its connection", 1.5, first, sizeof first);
    check(ok, "3 ranks, rank 0 exits after the first bcast: ranks 1, 2 fail at once (%.2f s)%s%s", t, ok ? "" : ": ",
          ok ? "" : first);
    Mid hang = {2, 1, 1.0};
    int skip2[MAXP] = {0, 0, 1};
    t = run_group(3, body_mid, &hang, skip2, 10, res);
    ok = failed_with(res, 3, 2, "rank 2 did not answer within 1 s", hang.timeout + 1, first, sizeof first);
    check(ok, "3 ranks, rank 2 hangs before the allgather: ranks 0, 1 fail within timeout + 1 s naming it (%.2f s)%s%s", t,
          ok ? "" : ": ", ok ? "" : first);
    Mid size = {1, 2, 3.0};
    t = run_group(3, body_mid, &size, NULL, 10, res);
    ok = failed_with(res, 3, -1, NULL, 1.5, first, sizeof first) &&
         strstr(res[0].msg, "mismatched collectives: rank 1 is in allgather #2 of 8 bytes while rank 0 is in allgather #2 of 16") &&
         strstr(res[2].msg, "mismatched collectives");
    check(ok, "rank 1 calls allgather with 8 bytes, the others with 16: every rank fails with the mismatch (%.2f s)", t);
    if (!ok)
        for (int i = 0; i < 3; i++) printf("     rank %d: exit %d: %s\n", i, res[i].code, res[i].msg);
}

/* ---- argument checks (no sockets involved) ---- */

static void expect_open_fails(const char *addr, int port, int rank, int world, double timeout, const char *want) {
    char why[600] = "";
    double t0 = now_s();
    Rendezvous *r = rdzv_open(addr, port, rank, world, timeout, why, sizeof why);
    int ok = !r && strstr(why, want) && now_s() - t0 < 0.5;
    rdzv_close(r);
    check(ok, "rdzv_open('%s', %d, rank %d, world %d): %s", addr ? addr : "(null)", port, rank, world, why);
}

static void test_args(void) {
    expect_open_fails("127.0.0.1", 29500, 2, 2, 1, "rank 2 is not in 0..1");
    expect_open_fails("127.0.0.1", 0, 1, 2, 1, "port 0 is out of range");
    expect_open_fails("127.0.0.1", 70000, 0, 2, 1, "port 70000 is out of range");
    expect_open_fails("999.1.1.1", 29500, 0, 2, 1, "'999.1.1.1' is not a valid IPv4 address");
    expect_open_fails("", 29500, 1, 2, 1, "address is empty");
    expect_open_fails("host name", 29500, 1, 2, 1, "contains a space");
    expect_open_fails("127.0.0.1", 29500, 0, 2, 0, "timeout 0 s must be positive");
    char why[200] = "";
    check(rdzv_bcast(NULL, NULL, 0, why, sizeof why) == -1 && strstr(why, "no handle"), "a NULL handle: %s", why);
}

/* ---- rdzv_env ---- */

static const char *VARS[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
                             "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_ID", "LLMTRAIN_RDZV_ID", "TORCHELASTIC_RUN_ID"};

/* Set the six variables from a spec "RANK=1 WORLD_SIZE=4 ..." (a variable
 * not named is unset; "X=" sets it empty). */
static void set_env(const char *spec) {
    for (size_t i = 0; i < sizeof VARS / sizeof *VARS; i++) unsetenv(VARS[i]);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        *eq = 0;
        setenv(tok, eq + 1, 1);
    }
}

#define GOOD "RANK=3 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=node-0.cluster MASTER_PORT=29500"

/* reader (rdzv_env or rdzv_env_slurm) refuses spec's variables with want */
static void refused(int (*reader)(RdzvEnv *, char *, size_t), const char *name, const char *spec, const char *want) {
    set_env(spec);
    RdzvEnv e;
    char why[300] = "";
    int rc = reader(&e, why, sizeof why);
    check(rc == -1 && strstr(why, want), "%s [%s]: %s", name, spec, why);
}
#define env_bad(spec, want) refused(rdzv_env, "rdzv_env", spec, want)
#define slurm_bad(spec, want) refused(rdzv_env_slurm, "rdzv_env_slurm", spec, want)

static void test_env(void) {
    RdzvEnv e;
    char why[300] = "";
    set_env(GOOD);
    int rc = rdzv_env(&e, why, sizeof why);
    check(rc == 0 && e.rank == 3 && e.world == 8 && e.local_rank == 1 && e.local_world == 2 &&
          !strcmp(e.master_addr, "node-0.cluster") && e.master_port == 29500,
          "rdzv_env reads a full torchrun set (%s)", rc ? why : "rank 3 of 8, local 1 of 2, node-0.cluster:29500");
    /* the job id: LLMTRAIN_RDZV_ID, else TORCHELASTIC_RUN_ID, else SLURM_JOB_ID, else "" */
    static const struct { const char *extra, *job; } ids[] = {
        {"", ""}, {" SLURM_JOB_ID=77 SLURM_STEP_ID=3", "77"}, {" TORCHELASTIC_RUN_ID=run-9 SLURM_JOB_ID=77", "run-9"},
        {" LLMTRAIN_RDZV_ID=mine TORCHELASTIC_RUN_ID=run-9 SLURM_JOB_ID=77", "mine"}, {" LLMTRAIN_RDZV_ID= SLURM_JOB_ID=77", "77"},
        {" TORCHELASTIC_RUN_ID=none SLURM_JOB_ID=77", "77"}, {" TORCHELASTIC_RUN_ID=none", ""},
    };
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        char spec[300];
        snprintf(spec, sizeof spec, "%s%s", GOOD, ids[i].extra);
        set_env(spec);
        rc = rdzv_env(&e, why, sizeof why);
        check(rc == 0 && !strcmp(e.job, ids[i].job), "rdzv_env's job id [%s]: \"%s\"", ids[i].extra, rc ? why : e.job);
    }
    set_env("RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1");
    rc = rdzv_env(&e, why, sizeof why);
    check(rc == 0 && e.local_world == -1 && e.world == 1 && e.master_port == 1,
          "rdzv_env without LOCAL_WORLD_SIZE: local_world -1 (%s)", rc ? why : "derive it later");
    env_bad("WORLD_SIZE=8 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "RANK is not set (expected an integer in 0..7 for WORLD_SIZE=8)");
    env_bad("RANK=abc WORLD_SIZE=8 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "RANK='abc' is not a number (expected an integer in 0..7");
    env_bad("RANK=8 WORLD_SIZE=8 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "RANK=8 is out of range (expected an integer in 0..7 for WORLD_SIZE=8)");
    env_bad("RANK=-1 WORLD_SIZE=8 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "RANK=-1 is out of range");
    env_bad("RANK=99999999999999999999 WORLD_SIZE=8 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "RANK=99999999999999999999 is out of range");
    env_bad("RANK=1 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "WORLD_SIZE is not set (expected an integer in 1..");
    env_bad("RANK=1 WORLD_SIZE=0 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "WORLD_SIZE=0 is out of range (expected an integer in 1..");
    env_bad("RANK=1 WORLD_SIZE=4x LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "WORLD_SIZE='4x' is not a number");
    env_bad("RANK=1 WORLD_SIZE= LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500", "WORLD_SIZE is not set");
    env_bad("RANK=1 WORLD_SIZE=8 MASTER_ADDR=a MASTER_PORT=29500", "LOCAL_RANK is not set (expected an integer in 0..7 for WORLD_SIZE=8)");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=a MASTER_PORT=29500", "LOCAL_RANK=2 is out of range (expected an integer in 0..1 for LOCAL_WORLD_SIZE=2)");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 LOCAL_WORLD_SIZE=9 MASTER_ADDR=a MASTER_PORT=29500", "LOCAL_WORLD_SIZE=9 is out of range (expected an integer in 1..8 for WORLD_SIZE=8)");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 LOCAL_WORLD_SIZE=two MASTER_ADDR=a MASTER_PORT=29500", "LOCAL_WORLD_SIZE='two' is not a number");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_PORT=29500", "MASTER_ADDR is not set (expected the host name or IP address of rank 0)");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR= MASTER_PORT=29500", "MASTER_ADDR is not set");
    set_env("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_PORT=29500");
    setenv("MASTER_ADDR", "node 0", 1); /* the spec splits on spaces */
    rc = rdzv_env(&e, why, sizeof why);
    check(rc == -1 && strstr(why, "MASTER_ADDR='node 0' contains a space"), "rdzv_env [MASTER_ADDR='node 0']: %s", why);
    /* a malformed address is the variable's error (exit 2), before any rendezvous */
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR=999.1.1.1 MASTER_PORT=29500",
            "MASTER_ADDR='999.1.1.1' is not a valid IPv4 address (expected a host name or IP address)");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR=1.2.3 MASTER_PORT=29500", "MASTER_ADDR='1.2.3' is not a valid IPv4 address");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR=a", "MASTER_PORT is not set (expected an integer in 1..65535 (a TCP port))");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR=a MASTER_PORT=0", "MASTER_PORT=0 is out of range (expected an integer in 1..65535");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR=a MASTER_PORT=65536", "MASTER_PORT=65536 is out of range");
    env_bad("RANK=1 WORLD_SIZE=8 LOCAL_RANK=0 MASTER_ADDR=a MASTER_PORT=http", "MASTER_PORT='http' is not a number");
    /* WORLD_SIZE alone (dist_init: a malformed one is exit 2, not a world of one) */
    static const struct { const char *spec, *want; int rc, world; } ws[] = {
        {"", "", 0, 1}, {"WORLD_SIZE=", "", 0, 1}, {"WORLD_SIZE=1", "", 1, 1}, {"WORLD_SIZE=4", "", 1, 4},
        {"WORLD_SIZE=abc", "WORLD_SIZE='abc' is not a number (expected an integer in 1..1048576)", -1, 1},
        {"WORLD_SIZE=2x", "WORLD_SIZE='2x' is not a number", -1, 1},
        {"WORLD_SIZE=-4", "WORLD_SIZE=-4 is out of range (expected an integer in 1..1048576)", -1, 1},
        {"WORLD_SIZE=0", "WORLD_SIZE=0 is out of range", -1, 1},
        {"WORLD_SIZE=99999999999", "WORLD_SIZE=99999999999 is out of range", -1, 1},
    };
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
        set_env(ws[i].spec);
        int world = 1;
        why[0] = 0;
        rc = rdzv_env_world(&world, why, sizeof why);
        check(rc == ws[i].rc && world == ws[i].world && strstr(why, ws[i].want), "rdzv_env_world [%s]: %d, world %d%s%s", ws[i].spec,
              rc, world, why[0] ? ": " : "", why);
    }
    set_env("");
}

/* ---- gather, scatter, split ---- */

/* World ranks of group `color` under split kind `kind` (0: color = rank %
 * 2, key = -rank, so members run in descending rank order; 1: color =
 * rank / 4, key = rank), in member order; returns the group's size. */
static int split_members(int kind, int world, int rank, int *out) {
    int m = 0;
    if (kind == 0) {
        for (int i = world - 1; i >= 0; i--)
            if (i % 2 == rank % 2) out[m++] = i;
    } else {
        for (int i = 0; i < world; i++)
            if (i / 4 == rank / 4) out[m++] = i;
    }
    return m;
}

static int body_split(int rank, int world, int port, const void *arg, char *msg, size_t n) {
    (void)arg;
    char why[600];
    Rendezvous *r = rdzv_open("127.0.0.1", port, rank, world, 5.0, why, sizeof why), *g[2] = {NULL, NULL};
    if (!r) return FAILS("rdzv_open: %s", why);
    int rc = 1;
    unsigned char mine[4096], *all = calloc((size_t)world, sizeof mine), got[4096];
    /* gather: every rank's 4 KiB in rank order at rank 0 only */
    fill(400 + (uint64_t)rank, mine, sizeof mine);
    memset(all, 0xee, (size_t)world * sizeof mine);
    if (rdzv_gather(r, mine, all, sizeof mine, why, sizeof why)) { FAILS("gather: %s", why); goto out; }
    for (int i = 0; i < world; i++)
        if (rank == 0 ? !expect_bytes(all + i * sizeof mine, 400 + (uint64_t)i, sizeof mine) : all[i * sizeof mine] != 0xee) {
            FAILS("gather: rank %d's slice %d is wrong", rank, i);
            goto out;
        }
    /* scatter: rank 0's block i to rank i */
    if (rank == 0)
        for (int i = 0; i < world; i++) fill(500 + (uint64_t)i, all + i * sizeof mine, sizeof mine);
    if (rdzv_scatter(r, all, got, sizeof got, why, sizeof why)) { FAILS("scatter: %s", why); goto out; }
    if (!expect_bytes(got, 500 + (uint64_t)rank, sizeof got)) { FAILS("scatter: rank %d got another block", rank); goto out; }
    /* two splits, then collectives on both groups and the parent interleaved */
    for (int k = 0; k < 2; k++) {
        g[k] = rdzv_split(r, k == 0 ? rank % 2 : rank / 4, k == 0 ? -rank : rank, 5.0, why, sizeof why);
        if (!g[k]) { FAILS("split %d: %s", k, why); goto out; }
    }
    for (int k = 0; k < 2; k++) {
        int mem[MAXP], m = split_members(k, world, rank, mem), me = -1;
        for (int i = 0; i < m; i++)
            if (mem[i] == rank) me = i;
        if (rdzv_world(g[k]) != m || rdzv_rank(g[k]) != me) {
            FAILS("split %d: rank %d is member %d of %d (expected %d of %d)", k, rank, rdzv_rank(g[k]), rdzv_world(g[k]), me, m);
            goto out;
        }
        fill(600 + (uint64_t)rank, mine, 64);
        if (rdzv_allgather(g[k], mine, all, 64, why, sizeof why)) { FAILS("split %d allgather: %s", k, why); goto out; }
        for (int i = 0; i < m; i++)
            if (!expect_bytes(all + 64 * i, 600 + (uint64_t)mem[i], 64)) { FAILS("split %d: member %d's bytes are not rank %d's", k, i, mem[i]); goto out; }
        if (rdzv_barrier(r, why, sizeof why)) { FAILS("parent barrier between groups: %s", why); goto out; }
        if (me == 0) fill(700 + (uint64_t)rank, mine, 64);
        if (rdzv_bcast(g[k], mine, 64, why, sizeof why)) { FAILS("split %d bcast: %s", k, why); goto out; }
        if (!expect_bytes(mine, 700 + (uint64_t)mem[0], 64)) { FAILS("split %d bcast: not member 0's bytes", k); goto out; }
    }
    rc = 0;
    snprintf(msg, n, "ok");
out:
    free(all);
    rdzv_close(g[0]);
    rdzv_close(g[1]);
    rdzv_close(r);
    return rc;
}

/* After a split, rank `dies` exits: the members of its groups fail (not hang). */
static int body_split_dies(int rank, int world, int port, const void *arg, char *msg, size_t n) {
    int dies = *(const int *)arg;
    char why[600];
    Rendezvous *r = rdzv_open("127.0.0.1", port, rank, world, 5.0, why, sizeof why);
    if (!r) return FAILS("rdzv_open: %s", why);
    Rendezvous *g = rdzv_split(r, rank / 2, rank, 5.0, why, sizeof why);
    if (!g) { rdzv_close(r); return FAILS("split: %s", why); }
    if (rank == dies) _exit(0);
    unsigned char b[16] = {0}, all[16 * MAXP];
    int rc = rdzv_allgather(g, b, all, sizeof b, why, sizeof why);
    snprintf(msg, n, "%s", rc ? why : "allgather returned");
    rdzv_close(g);
    rdzv_close(r);
    return rc ? 0 : 1;
}

static void test_split(void) {
    Result res[MAXP];
    char first[MSG + 40];
    double t = run_group(8, body_split, NULL, NULL, 20, res);
    int ok = all_ok(res, 8, first, sizeof first);
    check(ok, "8 ranks: gather 4 KiB to rank 0 only, scatter a block to each; split by rank %% 2 (descending key) and by "
          "rank / 4: each group's members in key order, allgather, bcast from its first member, parent collectives in "
          "between (%.2f s)%s%s", t, ok ? "" : ": ", ok ? "" : first);
    for (int dies = 0; dies < 2; dies++) {
        t = run_group(4, body_split_dies, &dies, NULL, 20, res);
        int partner = dies ^ 1;
        ok = res[partner].code == 0 && strstr(res[partner].msg, "closed its connection") && t < 5;
        check(ok, "split into pairs, then rank %d exits: its partner's allgather fails at once (%.2f s): %s", dies, t,
              res[partner].msg);
    }
}

/* ---- Slurm ---- */

static void test_slurm(void) {
    static const struct { const char *list, *first; } good[] = {
        {"node07", "node07"}, {"node[07-09,12]", "node07"}, {"node[007-010]", "node007"}, {"gpu1,gpu2", "gpu1"},
        {"a[3],b[1-2]", "a3"}, {"rack[2-3]-n[05-06]", "rack2-n05"}, {"n[1-2]-ib", "n1-ib"}, {"x[10,2-4]", "x10"},
        {"10.0.0.5", "10.0.0.5"}, {"h[0-1],i[4]", "h0"},
    };
    char out[256], why[300];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        int rc = rdzv_hostlist_first(good[i].list, out, sizeof out, why, sizeof why);
        check(rc == 0 && !strcmp(out, good[i].first), "hostlist '%s' -> '%s' (%s)", good[i].list, rc ? "-" : out,
              rc ? why : good[i].first);
    }
    static const struct { const char *list, *want; } bad[] = {
        {"", "the node list is empty"}, {"node[", "is malformed at '['"}, {"node[a-b]", "is malformed at '[a-b]'"},
        {"node[1-2", "is malformed at '[1-2'"}, {"node]1", "has a ']' without its '['"}, {",node1", "starts with an empty name"},
        {"n[1;2]", "is malformed"}, {"[]", "is malformed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = 0;
        int rc = rdzv_hostlist_first(bad[i].list, out, sizeof out, why, sizeof why);
        check(rc == -1 && strstr(why, bad[i].want), "hostlist '%s' is refused: %s", bad[i].list, why);
    }
    char longname[300];
    memset(longname, 'h', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    int rc = rdzv_hostlist_first(longname, out, 16, why, sizeof why);
    check(rc == -1 && strstr(why, "longer than 15 characters"), "a first host longer than the buffer is refused: %s", why);

    RdzvEnv e;
    set_env("SLURM_PROCID=0 SLURM_JOB_ID=77"); /* a batch script: not a task of an srun step */
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 0 && e.world == 1, "rdzv_env_slurm without SLURM_STEP_NUM_TASKS: not an srun step (%d)", rc);
    set_env("SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=5");
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 1 && e.world == 1, "rdzv_env_slurm: a step of one task is a world of one (%d, %d)", rc, e.world);
    set_env("SLURM_STEP_NUM_TASKS=16 SLURM_PROCID=9 SLURM_LOCALID=1 SLURM_STEP_NODELIST=gpu-[003-010],cpu1 "
            "SLURM_JOB_NODELIST=gpu-[001-010] SLURM_JOB_ID=123456 SLURM_STEP_ID=2");
    rc = rdzv_env_slurm(&e, why, sizeof why);
    int port = 15000 + (int)((123456ull * 8 + 2) % 17000);
    check(rc == 1 && e.world == 16 && e.rank == 9 && e.local_rank == 1 && e.local_world == -1 &&
          !strcmp(e.master_addr, "gpu-003") && e.master_port == port && port == 16650,
          "rdzv_env_slurm reads an srun task: rank 9 of 16, local 1, the step's first node gpu-003, port %d from job 123456 step 2 (%s)",
          e.master_port, rc == 1 ? e.master_addr : why);
    check(rc == 1 && !strcmp(e.job, "123456.2"), "rdzv_env_slurm's job id: SLURM_JOB_ID.SLURM_STEP_ID (\"%s\")", e.job);
    setenv("LLMTRAIN_RDZV_ID", "mine", 1);
    setenv("TORCHELASTIC_RUN_ID", "run-9", 1);
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 1 && !strcmp(e.job, "mine"), "rdzv_env_slurm: LLMTRAIN_RDZV_ID wins (\"%s\")", e.job);
    set_env("SLURM_STEP_NUM_TASKS=16 SLURM_PROCID=9 SLURM_LOCALID=1 SLURM_JOB_NODELIST=gpu-[001-010] SLURM_JOB_ID=123456");
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 1 && !strcmp(e.master_addr, "gpu-001") && e.master_port == 15000 + (int)(123456ull * 8 % 17000),
          "rdzv_env_slurm: no step node list, the job's first node; no SLURM_STEP_ID, step 0 (%s:%d)", e.master_addr, e.master_port);
    set_env("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=3 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n[1-2] SLURM_JOB_ID=9 "
            "MASTER_ADDR=10.1.2.3 MASTER_PORT=29400");
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 1 && !strcmp(e.master_addr, "10.1.2.3") && e.master_port == 29400,
          "rdzv_env_slurm: MASTER_ADDR and MASTER_PORT win over the node list and the job id (%s:%d)", e.master_addr, e.master_port);
    /* the ports of neighbouring jobs and of a job's steps differ */
    int clash = 0;
    for (int j = 0; j < 2125 && !clash; j++)
        for (int s2 = 0; s2 < 8; s2++)
            if ((j || s2) && RDZV_SLURM_PORT(1000000 + j, s2) == RDZV_SLURM_PORT(1000000, 0)) clash = 1;
    check(!clash && RDZV_SLURM_PORT(0, 0) == 15000 && RDZV_SLURM_PORT(2124, 7) == 31999 && RDZV_SLURM_PORT(INT_MAX, 7) >= 15000,
          "RDZV_SLURM_PORT: 15000..31999, no two of 2125 neighbouring jobs x 8 steps alike");
    slurm_bad("SLURM_STEP_NUM_TASKS=0 SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=0 is out of range (expected an integer in 1..1048576)");
    slurm_bad("SLURM_STEP_NUM_TASKS=4x", "SLURM_STEP_NUM_TASKS='4x' is not a number");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=1",
              "SLURM_PROCID is not set (expected an integer in 0..3 for SLURM_STEP_NUM_TASKS=4)");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=4 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=1", "SLURM_PROCID=4 is out of range");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=1", "SLURM_LOCALID is not set");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_JOB_ID=1",
              "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set (expected the step's nodes; or set MASTER_ADDR)");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n[1-2 SLURM_JOB_ID=1",
              "SLURM_STEP_NODELIST: node list 'n[1-2' is malformed");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=999.0.0[1-2] SLURM_JOB_ID=1",
              "SLURM_STEP_NODELIST's first host '999.0.01' is not a valid IPv4 address");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1",
              "SLURM_JOB_ID is not set (expected an integer in 0..2147483647 (or set MASTER_PORT))");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=1 SLURM_STEP_ID=batch",
              "SLURM_STEP_ID='batch' is not a step id (expected an integer in 0..4294967295)");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=1 SLURM_STEP_ID=4294967296",
              "SLURM_STEP_ID='4294967296' is not a step id");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=1 SLURM_STEP_ID=-1",
              "SLURM_STEP_ID='-1' is not a step id");
    set_env("SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_STEP_NODELIST=n1 SLURM_JOB_ID=10 SLURM_STEP_ID=4294967290");
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 1 && e.master_port == 15000 + (int)((10ull * 8 + 4294967290ull % 8) % 17000),
          "rdzv_env_slurm: a step id near 2^32 (Slurm's special steps) counts mod 8 (port %d)", e.master_port);
    /* salloc's interactive step (LaunchParameters=use_interactive_step): one task, a special step id;
     * a step of one reads nothing past the task count, so nothing there can fail it */
    set_env("SLURM_STEP_NUM_TASKS=1 SLURM_STEP_ID=interactive SLURM_PROCID=x SLURM_STEP_NODELIST=n[ MASTER_PORT=0");
    rc = rdzv_env_slurm(&e, why, sizeof why);
    check(rc == 1 && e.world == 1, "rdzv_env_slurm: a step of one task reads nothing else (%d: %s)", rc, rc < 0 ? why : "world 1");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=n1 MASTER_PORT=0", "MASTER_PORT=0 is out of range");
    slurm_bad("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=1 SLURM_LOCALID=0 MASTER_ADDR=1.2.3 SLURM_JOB_ID=1", "MASTER_ADDR='1.2.3' is not a valid IPv4 address");
    set_env("");
}

int main(void) {
    double t0 = now_s();
    /* SIGPIPE stays fatal: the library must never raise it */
    int ufd = open("/dev/urandom", O_RDONLY);
    if (ufd < 0 || read(ufd, &seed, sizeof seed) != (ssize_t)sizeof seed ||
        read(ufd, blob0, sizeof blob0) != (ssize_t)sizeof blob0) {
        seed = (uint64_t)time(NULL) * 2654435761u;
        fill(0, blob0, sizeof blob0);
    }
    if (ufd >= 0) close(ufd);
    shared_flags = mmap(NULL, MAXP * sizeof *shared_flags, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared_flags == MAP_FAILED) { perror("mmap"); return 99; }
    test_env();
    test_slurm();
    test_args();
    test_happy();
    test_strays();
    test_other_job();
    test_open_faults();
    test_mid();
    test_split();
    printf("(%.1f s)\n", now_s() - t0);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
