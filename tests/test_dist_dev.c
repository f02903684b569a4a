/* test_dist_dev.c — parallel.c's routing of collectives to an attached
 * DistDevComm (what the CUDA backend's NCCL layer plugs into), checked
 * without a GPU by a recording fake: the float32 collectives on backend
 * memory go to it with the right operation, group, buffers and handle
 * (started, waited once, released for reuse; the blocking and non-blocking
 * data-parallel all-reduce too), one-member groups copy
 * through it, byte accounting is the MPI path's, and the float64
 * reductions, gathers and broadcasts stay on MPI (the fake sees nothing and
 * their results are right); the health check times through it; the
 * watchdog calls its abort before exiting 5; dist_finalize closes it.
 *
 *   mpirun -np N tests/test_dist_dev TP S      routing for the layout tp x shard S
 *   mpirun -np N tests/test_dist_dev ep TP CP EP  the expert group of tp x cp x dp with ep:
 *                                              membership, counts and all-to-all over MPI
 *                                              (or TCP under a torchrun-style launch),
 *                                              then routed to the device
 *   mpirun -np 2 tests/test_dist_dev ephang     rank 0 waits in an all-to-all rank 1 never
 *                                              joins: its watchdog names it, exit 5
 *   mpirun -np 2 tests/test_dist_dev watchdog FILE   rank 1's watchdog fires (exit 5) after
 *                                              writing "abort" into FILE.rank
 * Rank 0 prints "N passed, M failed" over every rank's checks (its own
 * after dist_finalize); any failing rank exits 1. */
#include "parallel.h"
#include "util.h"
#include "a2a_check.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int pass, fail;
static int g_rank;
#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (cond) pass++;                                                             \
        else { fail++; printf("FAIL rank %d: ", g_rank); printf(__VA_ARGS__); printf("\n"); } \
    } while (0)

/* The fake: every call recorded. */
typedef struct Call { char what; int h, op, group; const void *send; void *recv; size_t n; } Call;
static Call calls[64];
static int n_calls, live[64], closed, timed[DIST_N_GROUPS_CP];
static const size_t *a2a_args[4]; /* the last all-to-all's scount, sdispl, rcount, rdispl */
static char abort_path[512];

static void rec(Call c) {
    if (n_calls < 64) calls[n_calls++] = c;
}
static void fk_start(void *ctx, int h, int op, int g, const void *send, void *recv, size_t n) {
    (void)ctx;
    if (h >= 0 && h < 64) live[h]++;
    rec((Call){'s', h, op, g, send, recv, n});
}
static void fk_wait(void *ctx, int h) {
    (void)ctx;
    if (h >= 0 && h < 64) live[h]--;
    rec((Call){'w', h, 0, 0, NULL, NULL, 0});
}
static int fk_test(void *ctx, int h) {
    (void)ctx;
    rec((Call){'t', h, 0, 0, NULL, NULL, 0});
    return 1;
}
static void fk_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
    rec((Call){'c', -1, 0, 0, src, dst, bytes});
}
static double fk_time(void *ctx, int g, size_t n, int warmup, int iters) {
    (void)ctx; (void)n; (void)warmup; (void)iters;
    timed[g]++;
    return 1e-3;
}
static void fk_abort(void *ctx) { /* the watchdog thread: leave a mark */
    (void)ctx;
    int fd = open(abort_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { if (write(fd, "abort\n", 6) != 6) { /* the test sees the file empty */ } close(fd); }
}
static void fk_close(void *ctx) { (void)ctx; closed++; }
static void fk_alltoallv(void *ctx, int h, int g, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                         const size_t *rcount, const size_t *rdispl) {
    (void)ctx;
    if (h >= 0 && h < 64) live[h]++;
    a2a_args[0] = scount, a2a_args[1] = sdispl, a2a_args[2] = rcount, a2a_args[3] = rdispl;
    rec((Call){'a', h, -1, g, send, recv, 0});
}
static const DistDevComm fake = {NULL, "fake 1.0", fk_start, fk_wait, fk_test, fk_copy, fk_time, fk_abort, fk_close, fk_alltoallv};

/* The last call was a start of op on group g with these buffers, followed
 * (when blocking) by the wait of its handle, which is then free. */
static void expect_blocking(const char *what, int first, int op, int g, const void *send, const void *recv, size_t n) {
    CHECK(n_calls == first + 2, "%s: %d calls, expected a start and a wait", what, n_calls - first);
    if (n_calls != first + 2) return;
    Call s = calls[first], w = calls[first + 1];
    CHECK(s.what == 's' && s.op == op && s.group == g && s.send == send && s.recv == recv && s.n == n,
          "%s: started op %d group %d n %zu, expected op %d group %d n %zu", what, s.op, s.group, s.n, op, g, n);
    CHECK(w.what == 'w' && w.h == s.h && live[s.h] == 0, "%s: handle %d waited as %d (live %d)", what, s.h, w.h, live[s.h]);
}

static void routing(Dist *d, int tp, int S) {
    dist_set_tp(d, tp);
    dist_setup_groups(d, S);
    dist_attach_device(d, &fake);
    int R = d->replicate_size, dp = d->dp;
    size_t n = 6;
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(d->rank * 100 + i);
    dist_comm_reset(d);

    int c0 = n_calls;
    dist_allreduce(d, DIST_GROUP_DP, DIST_F32, DIST_SUM, x, n);
    if (dp > 1) expect_blocking("dist_allreduce dp", c0, DIST_OP_ALLREDUCE_SUM, DIST_GROUP_DP, x, x, n);
    else CHECK(n_calls == c0, "dist_allreduce dp with dp 1 called the device");
    CHECK(d->bytes_allreduce == (dp > 1 ? 2.0 * (dp - 1) / dp * n * sizeof(float) : 0), "allreduce bytes %g", d->bytes_allreduce);
    /* its non-blocking form (NO_SHARD's all-reduce of a chunk's gradients):
     * started on the data-parallel group in place, tested, waited later */
    c0 = n_calls;
    int ha = dist_iallreduce(d, DIST_GROUP_DP, x, n);
    if (dp > 1) {
        CHECK(ha >= 0 && n_calls == c0 + 1 && calls[c0].what == 's' && calls[c0].h == ha && calls[c0].op == DIST_OP_ALLREDUCE_SUM &&
                  calls[c0].group == DIST_GROUP_DP && calls[c0].send == x && calls[c0].recv == x && calls[c0].n == n,
              "dist_iallreduce dp: not one start of an in-place all-reduce on the dp group (handle %d)", ha);
        CHECK(dist_test(d, ha) == 1 && calls[n_calls - 1].what == 't' && calls[n_calls - 1].h == ha, "dist_iallreduce dp: test not routed");
        dist_wait(d, ha);
        CHECK(ha >= 0 && ha < 64 && live[ha] == 0 && calls[n_calls - 1].what == 'w' && calls[n_calls - 1].h == ha,
              "dist_iallreduce dp: handle %d not waited once", ha);
    } else {
        CHECK(ha == -1 && n_calls == c0, "dist_iallreduce dp with dp 1: handle %d, %d device calls", ha, n_calls - c0);
    }
    CHECK(d->bytes_allreduce == (dp > 1 ? 2 * 2.0 * (dp - 1) / dp * n * sizeof(float) : 0), "allreduce bytes %g after the non-blocking one",
          d->bytes_allreduce);

    c0 = n_calls;
    dist_allreduce(d, DIST_GROUP_TP, DIST_F32, DIST_MAX, x, n);
    if (tp > 1) expect_blocking("dist_allreduce tp max", c0, DIST_OP_ALLREDUCE_MAX, DIST_GROUP_TP, x, x, n);
    c0 = n_calls;
    dist_allreduce(d, DIST_GROUP_TP, DIST_F32, DIST_SUM, x, n);
    if (tp > 1) expect_blocking("dist_allreduce tp sum", c0, DIST_OP_ALLREDUCE_SUM, DIST_GROUP_TP, x, x, n);
    else CHECK(n_calls == c0, "tp all-reduce with tp 1 called the device");
    CHECK(d->bytes_tp_allreduce == (tp > 1 ? 2 * 2.0 * (tp - 1) / tp * n * sizeof(float) : 0), "tp bytes %g", d->bytes_tp_allreduce);

    /* sequence parallelism's TP-group all-gathers (float32, bf16 words) and reduce-scatter */
    c0 = n_calls;
    dist_allgather(d, DIST_GROUP_TP, DIST_F32, x, y, n);
    if (tp > 1) expect_blocking("dist_allgather tp f32", c0, DIST_OP_ALLGATHER, DIST_GROUP_TP, x, y, n);
    else CHECK(n_calls == c0 + 1 && calls[c0].what == 'c' && calls[c0].recv == y, "tp 1 all-gather: not one device copy");
    c0 = n_calls;
    dist_allgather(d, DIST_GROUP_TP, DIST_BF16, x, y, n);
    if (tp > 1) expect_blocking("dist_allgather tp bf16", c0, DIST_OP_ALLGATHER_BF16, DIST_GROUP_TP, x, y, n);
    c0 = n_calls;
    dist_reduce_scatter(d, DIST_GROUP_TP, x, y, n);
    if (tp > 1) expect_blocking("dist_reduce_scatter tp", c0, DIST_OP_REDUCE_SCATTER, DIST_GROUP_TP, x, y, n);
    else CHECK(n_calls == c0 + 1 && calls[c0].what == 'c' && calls[c0].recv == y, "tp 1 reduce-scatter: not one device copy");
    CHECK(d->bytes_tp_allgather == (tp - 1) * (double)n * (4 + 2) && d->bytes_tp_reduce_scatter == (tp - 1) * (double)n * 4,
          "tp all-gather bytes %g, reduce-scatter bytes %g", d->bytes_tp_allgather, d->bytes_tp_reduce_scatter);

    c0 = n_calls;
    dist_allreduce(d, DIST_GROUP_REPLICATE, DIST_F32, DIST_SUM, x, n);
    if (R > 1) expect_blocking("dist_allreduce replicate", c0, DIST_OP_ALLREDUCE_SUM, DIST_GROUP_REPLICATE, x, x, n);
    else CHECK(n_calls == c0, "replicate all-reduce with R 1 called the device");
    /* its non-blocking form (HYBRID_SHARD's all-reduce of a chunk's
     * gradient shard over the replicas): started on the replicate group in
     * place, tested, waited later, counted as the blocking one */
    double ar0 = d->bytes_allreduce;
    c0 = n_calls;
    int hr = dist_iallreduce(d, DIST_GROUP_REPLICATE, x + 1, n);
    if (R > 1) {
        CHECK(hr >= 0 && n_calls == c0 + 1 && calls[c0].what == 's' && calls[c0].h == hr && calls[c0].op == DIST_OP_ALLREDUCE_SUM &&
                  calls[c0].group == DIST_GROUP_REPLICATE && calls[c0].send == x + 1 && calls[c0].recv == x + 1 && calls[c0].n == n,
              "dist_iallreduce replicate: not one start of an in-place all-reduce on the replicate group (handle %d)", hr);
        CHECK(dist_test(d, hr) == 1 && calls[n_calls - 1].what == 't' && calls[n_calls - 1].h == hr,
              "dist_iallreduce replicate: test not routed");
        dist_wait(d, hr);
        CHECK(hr < 64 && live[hr] == 0 && calls[n_calls - 1].what == 'w' && calls[n_calls - 1].h == hr,
              "dist_iallreduce replicate: handle %d not waited once", hr);
    } else {
        CHECK(hr == -1 && n_calls == c0, "dist_iallreduce replicate with R 1: handle %d, %d device calls", hr, n_calls - c0);
    }
    CHECK(d->bytes_allreduce - ar0 == (R > 1 ? 2.0 * (R - 1) / R * n * sizeof(float) : 0), "replicate all-reduce bytes %g",
          d->bytes_allreduce - ar0);

    c0 = n_calls;
    dist_allgather(d, DIST_GROUP_SHARD, DIST_F32, x, y, n);
    if (S > 1) {
        expect_blocking("dist_allgather shard f32", c0, DIST_OP_ALLGATHER, DIST_GROUP_SHARD, x, y, n);
    } else {
        CHECK(n_calls == c0 + 1 && calls[c0].what == 'c' && calls[c0].recv == y && memcmp(x, y, n * sizeof(float)) == 0,
              "one-member all-gather: not one device copy");
    }
    c0 = n_calls;
    dist_reduce_scatter(d, DIST_GROUP_SHARD, x, y, n);
    if (S > 1) expect_blocking("dist_reduce_scatter shard", c0, DIST_OP_REDUCE_SCATTER, DIST_GROUP_SHARD, x, y, n);
    double ag = S > 1 ? (double)(S - 1) * n * sizeof(float) : 0;
    CHECK(d->bytes_allgather == ag && d->bytes_reduce_scatter == ag, "shard bytes %g %g, expected %g", d->bytes_allgather,
          d->bytes_reduce_scatter, ag);
    /* bf16 words: the bf16 op on the same buffers, 2 bytes an element counted; a one-member group copies 2n bytes */
    uint16_t x16[64], y16[64];
    for (size_t i = 0; i < 64; i++) x16[i] = (uint16_t)(d->rank * 64 + i);
    c0 = n_calls;
    dist_allgather(d, DIST_GROUP_SHARD, DIST_BF16, x16, y16, n);
    if (S > 1) {
        expect_blocking("dist_allgather shard bf16", c0, DIST_OP_ALLGATHER_BF16, DIST_GROUP_SHARD, x16, y16, n);
        c0 = n_calls;
        int hb = dist_iallgather(d, DIST_GROUP_SHARD, DIST_BF16, x16, y16, n);
        CHECK(hb >= 0 && n_calls == c0 + 1 && calls[c0].op == DIST_OP_ALLGATHER_BF16 && calls[c0].h == hb, "bf16 non-blocking start");
        dist_wait(d, hb);
    } else {
        CHECK(n_calls == c0 + 1 && calls[c0].what == 'c' && calls[c0].recv == y16 && calls[c0].n == n * 2 &&
                  memcmp(x16, y16, n * 2) == 0,
              "one-member bf16 all-gather: not one device copy of 2n bytes");
        CHECK(dist_iallgather(d, DIST_GROUP_SHARD, DIST_BF16, x16, y16, n) == -1, "one-member bf16 all-gather: a handle");
    }
    CHECK(d->bytes_allgather == ag + 2 * (S > 1 ? (double)(S - 1) * n * 2 : 0), "bf16 all-gather bytes %g, expected %g",
          d->bytes_allgather, ag + 2 * (S > 1 ? (double)(S - 1) * n * 2 : 0));
    d->bytes_allgather = ag;

    /* non-blocking: started now, tested, waited later, handles reused */
    c0 = n_calls;
    int h1 = dist_iallgather(d, DIST_GROUP_SHARD, DIST_F32, x, y, n);
    int h2 = dist_ireduce_scatter(d, DIST_GROUP_SHARD, x, x, n); /* in place: the device gets recv == send */
    if (S > 1) {
        CHECK(h1 >= 0 && h2 >= 0 && h1 != h2, "handles %d %d", h1, h2);
        CHECK(n_calls == c0 + 2 && calls[c0].op == DIST_OP_ALLGATHER && calls[c0 + 1].op == DIST_OP_REDUCE_SCATTER &&
              calls[c0 + 1].send == x && calls[c0 + 1].recv == x && calls[c0].h == h1 && calls[c0 + 1].h == h2,
              "non-blocking starts not routed as expected");
        CHECK(dist_test(d, h1) == 1 && calls[n_calls - 1].what == 't' && calls[n_calls - 1].h == h1, "dist_test not routed");
        dist_wait(d, h2);
        dist_wait(d, h1);
        CHECK(live[h1] == 0 && live[h2] == 0, "handles not waited once each");
        int h3 = dist_iallgather(d, DIST_GROUP_SHARD, DIST_F32, x, y, n);
        CHECK(h3 == h1 || h3 == h2, "handle %d not reused (%d, %d free)", h3, h1, h2);
        dist_wait(d, h3);
    } else {
        CHECK(h1 == -1 && h2 == -1, "one-member group: handles %d %d", h1, h2);
    }

    /* host memory: MPI, never the device */
    c0 = n_calls;
    double v = 1.0, w[2] = {1.0, (double)d->rank};
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, &v, 1);
    CHECK(v == d->world, "dist_allreduce world f64: %g", v);
    v = 1.0;
    dist_allreduce(d, DIST_GROUP_TP, DIST_F64, DIST_SUM, &v, 1);
    CHECK(v == tp, "dist_allreduce tp f64: %g", v);
    v = 1.0;
    dist_allreduce(d, DIST_GROUP_SHARD, DIST_F64, DIST_SUM, &v, 1);
    CHECK(v == S, "dist_allreduce shard f64: %g", v);
    double all[2 * 64];
    dist_gather(d, DIST_GROUP_WORLD, DIST_F64, w, all, 2);
    if (d->rank == 0) CHECK(all[2 * (d->world - 1) + 1] == d->world - 1, "dist_gather world f64");
    float mine = (float)d->rank, got[64];
    dist_gather(d, DIST_GROUP_TP, DIST_F32, &mine, got, 1);
    if (d->tp_rank == 0) CHECK(got[tp - 1] == (float)(d->rank + tp - 1), "dist_gather tp: %g", got[tp - 1]);
    dist_gather(d, DIST_GROUP_SHARD, DIST_F32, &mine, got, 1);
    if (d->shard_index == 0 && S > 1) CHECK(got[1] == (float)(d->rank + tp), "dist_gather shard: %g", got[1]);
    char b[8] = {0};
    if (d->rank == 0) strcpy(b, "hello");
    dist_bcast(d, DIST_GROUP_WORLD, b, sizeof b);
    CHECK(strcmp(b, "hello") == 0, "dist_bcast world");
    int gr, gs;
    dist_group_rank(d, DIST_GROUP_SHARD, &gr, &gs);
    char id[16] = {0};
    if (gr == 0) snprintf(id, sizeof id, "s%d", d->rank);
    dist_bcast(d, DIST_GROUP_SHARD, id, sizeof id);
    char want[16];
    snprintf(want, sizeof want, "s%d", d->rank - d->shard_index * tp);
    CHECK(gs == S && gr == d->shard_index && strcmp(id, want) == 0, "dist_bcast over the shard group: '%s'", id);
    dist_barrier(d);
    CHECK(n_calls == c0, "host collectives called the device %d times", n_calls - c0);

    /* the health check times the device's all-reduce on every multi-rank group */
    CHECK(dist_health_check(d, 4096, 0) == 1, "health check failed");
    int sizes[DIST_N_GROUPS] = {tp, S, R, dp};
    for (int g = 0; g < DIST_N_GROUPS; g++)
        CHECK(timed[g] == (sizes[g] > 1), "health check timed group %d %d times (size %d)", g, timed[g], sizes[g]);
}

/* ------------------------------------------------------------------ */
/* the expert group: membership and the all-to-all of variable sizes    */

/* The expert group of layout tp x cp x (world / tp / cp) with ep: who is in
 * it and in what order (an all-to-all of each member's world rank, and a
 * broadcast from its first member, against the formula), then the
 * exchange over the host transport, then routed to an attached device. */
static void a2a(Dist *d, int tp, int cp, int ep) {
    dist_set_tp(d, tp);
    dist_set_cp(d, cp);
    dist_set_ep(d, ep);
    dist_setup_groups(d, 1);
    int gr, gs;
    dist_group_rank(d, DIST_GROUP_EP, &gr, &gs);
    CHECK(d->ep == ep && d->ep_rank == d->rank / tp % ep && gr == d->ep_rank && gs == ep,
          "ep %d: ep_rank %d (group rank %d of %d), expected %d", ep, d->ep_rank, gr, gs, d->rank / tp % ep);
    /* membership: every member's world rank to every member, in member order */
    char why[256] = "";
    CHECK(a2a_members(d, tp, ep, why, sizeof why), "%s", why);
    char id[16] = {0};
    if (gr == 0) snprintf(id, sizeof id, "e%d", d->rank);
    dist_bcast(d, DIST_GROUP_EP, id, sizeof id);
    char want[16];
    snprintf(want, sizeof want, "e%d", a2a_member(d->rank, tp, ep, 0));
    CHECK(strcmp(id, want) == 0, "dist_bcast over the expert group: '%s', expected '%s'", id, want);
    dist_comm_reset(d);
    A2aRound got;
    for (int r = 0; r < 4; r++) CHECK(a2a_round(d, tp, ep, r, &got, why, sizeof why), "%s", why);
    dist_comm_reset(d);
    CHECK(d->bytes_ep == 0, "dist_comm_reset left bytes_ep %g", d->bytes_ep);

    /* routed to the device: one alltoallv start on the expert group with
     * the caller's buffers and arrays, then the wait of its handle; a
     * group of one copies its own block through the device */
    dist_attach_device(d, &fake);
    unsigned char s8[64], r8[64];
    size_t sc[64], sd[64], rc[64], rd[64], sent = 0;
    for (int j = 0; j < ep; j++) sc[j] = rc[j] = (size_t)(j + 1), sd[j] = rd[j] = (size_t)(2 * j), sent += j == gr ? 0 : sc[j];
    for (int i = 0; i < 64; i++) s8[i] = (unsigned char)i;
    int c0 = n_calls;
    dist_alltoallv(d, DIST_GROUP_EP, s8, sc, sd, r8, rc, rd);
    if (ep > 1) {
        CHECK(n_calls == c0 + 2 && calls[c0].what == 'a' && calls[c0].group == DIST_GROUP_EP && calls[c0].send == s8 &&
                  calls[c0].recv == r8 && a2a_args[0] == sc && a2a_args[1] == sd && a2a_args[2] == rc && a2a_args[3] == rd &&
                  calls[c0 + 1].what == 'w' && calls[c0 + 1].h == calls[c0].h && live[calls[c0].h] == 0,
              "ep %d: dist_alltoallv on the device: not one all-to-all start on the expert group and its wait", ep);
    } else {
        CHECK(n_calls == c0 + 1 && calls[c0].what == 'c' && calls[c0].send == s8 && calls[c0].recv == r8 && calls[c0].n == 1,
              "ep 1: dist_alltoallv on the device: not one copy of its own block");
    }
    CHECK(d->bytes_ep == (double)sent, "ep %d: device bytes_ep %g, expected %zu", ep, d->bytes_ep, sent);
    CHECK(dist_health_check(d, 4096, 0) == 1 && timed[DIST_GROUP_EP] == (ep > 1), "health check timed the expert group %d times",
          timed[DIST_GROUP_EP]);
    /* LLMTRAIN_COMM_TRACE: one line an all-to-all over more than one
     * member, N the bytes sent to the others (membership, 4 rounds, device) */
    const char *tr = getenv("LLMTRAIN_COMM_TRACE");
    if (tr && *tr && ep > 1) {
        char path[600], line[128], want_line[128];
        snprintf(path, sizeof path, "%s.%d", tr, d->rank);
        FILE *f = fopen(path, "r");
        size_t bytes[6] = {(size_t)(ep - 1) * sizeof(int), 0, 0, 0, 0, sent};
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < ep; j++) bytes[1 + r] += j == gr ? 0 : a2a_count(d->rank, j, r);
        int n = 0, same = f != NULL;
        while (f && fgets(line, sizeof line, f)) {
            snprintf(want_line, sizeof want_line, "step 0 phase setup start alltoallv ep %zu h-1\n", n < 6 ? bytes[n] : 0);
            same &= n < 6 && strcmp(line, want_line) == 0;
            n++;
        }
        if (f) fclose(f);
        CHECK(same && n == 6, "comm trace %s: %d lines, not the 6 all-to-alls' (bytes sent %zu, ...)", path, n, bytes[0]);
    }
}

int main(int argc, char **argv) {
    Dist d;
    dist_init(&d, &argc, &argv);
    g_rank = d.rank;
    if (argc == 3 && strcmp(argv[1], "watchdog") == 0) {
        snprintf(abort_path, sizeof abort_path, "%s.%d", argv[2], d.rank);
        dist_setup_groups(&d, 1);
        dist_watchdog_start(&d, d.rank == 1 ? 0.3 : 30);
        dist_attach_device(&d, &fake);
        dist_phase(&d, 1, "forward");
        sleep(5); /* rank 1's watchdog ends the job with exit 5 */
        printf("rank %d: the watchdog did not fire\n", d.rank);
        dist_abort(&d, 1);
    }
    if (argc == 2 && strcmp(argv[1], "ephang") == 0) { /* rank 0 waits in the all-to-all rank 1 never joins */
        dist_set_ep(&d, 2);
        dist_setup_groups(&d, 1);
        dist_watchdog_start(&d, d.rank == 0 ? 0.5 : 30);
        dist_phase(&d, 1, "moe_dispatch");
        size_t c[2] = {4, 4}, o[2] = {0, 4};
        char s8[8] = {0}, r8[8];
        if (d.rank == 1) { /* long enough for rank 0's watchdog */
            sleep(3);
            _exit(0);
        }
        dist_alltoallv(&d, DIST_GROUP_EP, s8, c, o, r8, c, o); /* its watchdog ends the job with exit 5 */
        printf("rank %d: the watchdog did not fire\n", d.rank);
        dist_abort(&d, 1);
    }
    if (argc == 5 && strcmp(argv[1], "ep") == 0) {
        if (d.rank == 0) printf("launch: %s\n", d.launch); /* MPI, or the TCP rendezvous */
        a2a(&d, atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    } else if (argc == 3) routing(&d, atoi(argv[1]), atoi(argv[2]));
    else die(EXIT_USAGE, "usage: test_dist_dev TP S | test_dist_dev ep TP CP EP | test_dist_dev watchdog FILE");
    double tot[2] = {pass, fail};
    dist_allreduce(&d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, tot, 2); /* every rank's counts */
    dist_finalize(&d);
    int before = fail;
    CHECK(closed == 1 && d.dev == NULL, "dist_finalize: close called %d times", closed);
    if (d.rank == 0) printf("%d passed, %d failed\n", (int)tot[0] + 1, (int)tot[1] + fail - before);
    return fail ? 1 : 0;
}
