/* dist_nccl.c — the DistDevComm of the CUDA backend: float32 collectives
 * (and the bf16 all-gather of the working weights) on device memory through
 * NCCL, the context group's ring shift (ncclSend to the next member,
 * ncclRecv from the previous one, in one group call) and the expert group's
 * all-to-all (ncclSend and ncclRecv per peer with bytes to move, in one
 * group call; this rank's own block a copy on the communication stream).
 *
 * Communicators: one per process group with more than one member, created
 * at start in the same order on every rank (dp, shard, replicate, tp, cp, ep): the
 * group's first member makes the ncclUniqueId, the host transport (MPI, or
 * TCP under a launch without MPI) broadcasts it over the
 * group (parallel.c), each member joins with its index in the group as its
 * NCCL rank, so block i of an all-gather is member i's, as with MPI. A group
 * with the data-parallel group's members (the shard group of FULL_SHARD, the
 * replicate group of NO_SHARD, the context or expert group when every
 * data-parallel rank is in it) uses the dp communicator, and an expert
 * group of the context group's size (the same ep consecutive
 * data-parallel indices) the context group's. Communicators are
 * non-blocking (ncclConfig_t.blocking = 0): no NCCL call waits on a peer in
 * the host; the calls that answer ncclInProgress are polled to completion.
 *
 * Streams: the kernels run on the legacy default stream (kernels_cuda_stream);
 * every collective runs on one communication stream of its own
 * (non-blocking, so it does not synchronise with the legacy stream), in
 * issue order (one stream: the same order on every rank, and no NCCL
 * kernels of two communicators waiting on each other). A collective waits
 * for an event recorded on the compute stream when it is started (so it
 * reads what the kernels before it wrote, and writes nothing they still
 * read), and records its handle's completion event; dist_wait makes the
 * compute stream wait on that event, which costs the host nothing. The
 * host meets the result only through the backend's host waits (to_host,
 * the reductions), which poll (kernels_cuda_set_host_wait).
 *
 * Errors and hangs: every poll asks each communicator for its asynchronous
 * error (ncclCommGetAsyncError); an error is one line and dist_abort. On a
 * watchdog timeout the watchdog thread aborts every communicator
 * (ncclCommAbort) before it exits, so NCCL kernels waiting for a dead peer
 * end. Every NCCL call of the main thread holds a lock the abort takes
 * first; after an abort the main thread parks at its next NCCL call while
 * the watchdog exits. NCCL reads its own configuration (NCCL_*, and the
 * libfabric FI_* variables of EFA through its network plugin) from the
 * environment; nothing here sets any. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dist_nccl.h"
#include "kernels.h"
#include "util.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct DistNccl {
    Dist *d;
    DistDevComm dev;                  /* what parallel.c calls */
    ncclComm_t comm[DIST_N_GROUPS_CP]; /* NULL: a group of one */
    int owner[DIST_N_GROUPS_CP];       /* the group whose communicator comm[g] is (g, or DIST_GROUP_DP) */
    int rank[DIST_N_GROUPS_CP], size[DIST_N_GROUPS_CP];
    const char *last[DIST_N_GROUPS_CP]; /* per owner: the newest collective started on it, and on which group */
    int last_group[DIST_N_GROUPS_CP];
    int device;
    cudaStream_t compute, stream;     /* the kernels' stream; the collectives' stream */
    cudaEvent_t ready;                /* the compute stream's work up to a collective's start */
    cudaEvent_t *done;                /* [n_done]: handle h's completion on `stream` */
    int n_done;
    pthread_mutex_t mu;               /* held around every NCCL call; the watchdog's abort takes it */
    int aborting;                     /* under mu: the communicators are aborted */
    char name[32];                    /* "NCCL 2.28.9" */
} DistNccl;

static const char *group_name[DIST_N_GROUPS_CP] = {"tp", "shard", "replicate", "dp", "cp", "ep"};

static void cuda_check(cudaError_t e, const char *what, int line) {
    if (e == cudaSuccess) return;
    die(e == cudaErrorMemoryAllocation ? EXIT_IO : EXIT_INTERNAL, "CUDA error at dist_nccl.c:%d: %s (%s)", line,
        cudaGetErrorString(e), what);
}
#define CU(x) cuda_check((x), #x, __LINE__)

/* An NCCL failure: one line naming the collective, the group and NCCL's
 * reason, then every rank down (6 when a peer or the network failed, else
 * 70: a bug or a CUDA failure). */
static void nccl_fail(DistNccl *x, ncclResult_t r, const char *what, int g) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s", ncclGetLastError(x->comm[g]));
    for (char *p = detail; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "llmtrain: rank %d: NCCL error in %s on the %s group (%d ranks): %s%s%s%s\n", x->d->rank, what,
            group_name[g], x->size[g], ncclGetErrorString(r), detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
    dist_abort(x->d, r == ncclRemoteError || r == ncclSystemError ? EXIT_PEER : EXIT_INTERNAL);
}

/* The main thread's lock around NCCL calls. After the watchdog's abort the
 * communicators are gone: park here until the watchdog ends the process. */
static void nccl_lock(DistNccl *x) {
    pthread_mutex_lock(&x->mu);
    if (x->aborting) {
        pthread_mutex_unlock(&x->mu);
        for (;;) pause();
    }
}

static void nccl_unlock(DistNccl *x) { pthread_mutex_unlock(&x->mu); }

/* A pause between polls, with the lock released so the watchdog can abort. */
static void nap(DistNccl *x) {
    nccl_unlock(x);
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
    nccl_lock(x);
}

/* r from an NCCL call on group g's communicator: poll its state while it is
 * ncclInProgress (a non-blocking communicator's call is done when the state
 * leaves it); anything but success is fatal. */
static void settle(DistNccl *x, int g, ncclResult_t r, const char *what) {
    while (r == ncclInProgress) {
        nap(x);
        ncclResult_t st = ncclInProgress, e = ncclCommGetAsyncError(x->comm[g], &st);
        r = e != ncclSuccess ? e : st;
    }
    if (r != ncclSuccess) nccl_fail(x, r, what, g);
}

/* Every communicator's asynchronous error state (lock held). */
static void check_async(DistNccl *x) {
    for (int g = 0; g < DIST_N_GROUPS_CP; g++) {
        if (!x->comm[g] || x->owner[g] != g) continue;
        ncclResult_t st = ncclSuccess, e = ncclCommGetAsyncError(x->comm[g], &st);
        if (e != ncclSuccess) st = e;
        if (st != ncclSuccess && st != ncclInProgress)
            nccl_fail(x, st, x->last[g] ? x->last[g] : "setup", x->last[g] ? x->last_group[g] : g);
    }
}

/* The backend's host waits call this between queries of the stream. */
static void host_poll(void *ctx) {
    DistNccl *x = ctx;
    nccl_lock(x);
    check_async(x);
    nccl_unlock(x);
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* Block the host until the communication stream is idle, polling (lock held). */
static void drain(DistNccl *x) {
    CU(cudaEventRecord(x->ready, x->stream));
    cudaError_t e;
    while ((e = cudaEventQuery(x->ready)) == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not-ready is recorded as the thread's last error: clear it */
        check_async(x);
        nap(x);
    }
    CU(e);
}

static const char *op_name(int op) {
    return op == DIST_OP_ALLGATHER || op == DIST_OP_ALLGATHER_BF16 ? "ncclAllGather"
           : op == DIST_OP_REDUCE_SCATTER                        ? "ncclReduceScatter"
           : op == DIST_OP_SENDRECV                              ? "ncclSend/ncclRecv"
                                                                 : "ncclAllReduce";
}

/* A completion event for handle h (lock held). */
static void grow_done(DistNccl *x, int h) {
    if (h < x->n_done) return;
    int m = h + 16;
    x->done = realloc(x->done, (size_t)m * sizeof *x->done);
    if (!x->done) die(EXIT_INTERNAL, "out of host memory");
    for (int i = x->n_done; i < m; i++) CU(cudaEventCreateWithFlags(&x->done[i], cudaEventDisableTiming));
    x->n_done = m;
}

/* The ring shift: n bytes to the next member of group g, as many from the
 * previous one, one group call (both in flight at once, so no member
 * waits on its receiver). */
static ncclResult_t send_recv(DistNccl *x, int g, const void *send, void *recv, size_t n) {
    ncclComm_t c = x->comm[g];
    int next = (x->rank[g] + 1) % x->size[g], prev = (x->rank[g] + x->size[g] - 1) % x->size[g];
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    r = ncclSend(send, n, ncclInt8, next, c, x->stream);
    if (r == ncclSuccess || r == ncclInProgress) r = ncclRecv(recv, n, ncclInt8, prev, c, x->stream);
    ncclResult_t e = ncclGroupEnd(); /* always: a group started is ended */
    return r == ncclSuccess || r == ncclInProgress ? e : r;
}

#define ALLTOALL_NAME "ncclSend/ncclRecv (all-to-all)"

/* dist_alltoallv on group g under handle h, after the compute stream's work
 * so far: one group call of an ncclSend to each peer with bytes for it and
 * an ncclRecv from each with bytes for this rank (none when nothing moves);
 * this rank's own block a copy on the communication stream. */
static void nccl_alltoallv(void *ctx, int h, int g, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                           const size_t *rcount, const size_t *rdispl) {
    DistNccl *x = ctx;
    ncclComm_t c = x->comm[g];
    if (!c) die(EXIT_INTERNAL, "NCCL: " ALLTOALL_NAME " on the %s group, which has one member", group_name[g]);
    nccl_lock(x);
    grow_done(x, h);
    CU(cudaEventRecord(x->ready, x->compute));
    CU(cudaStreamWaitEvent(x->stream, x->ready, 0));
    int me = x->rank[g], n = x->size[g], peers = 0;
    if (scount[me])
        CU(cudaMemcpyAsync((char *)recv + rdispl[me], (const char *)send + sdispl[me], scount[me], cudaMemcpyDeviceToDevice, x->stream));
    for (int p = 0; p < n; p++) peers += p != me && (scount[p] || rcount[p]);
    if (peers) {
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; p < n && (r == ncclSuccess || r == ncclInProgress); p++) {
            if (p == me) continue;
            if (scount[p]) r = ncclSend((const char *)send + sdispl[p], scount[p], ncclInt8, p, c, x->stream);
            if (rcount[p] && (r == ncclSuccess || r == ncclInProgress))
                r = ncclRecv((char *)recv + rdispl[p], rcount[p], ncclInt8, p, c, x->stream);
        }
        ncclResult_t e = ncclGroupEnd(); /* always: a group started is ended */
        int o = x->owner[g];
        x->last[o] = ALLTOALL_NAME;
        x->last_group[o] = g;
        settle(x, g, r == ncclSuccess || r == ncclInProgress ? e : r, ALLTOALL_NAME);
    }
    CU(cudaEventRecord(x->done[h], x->stream));
    nccl_unlock(x);
}

/* Queue collective op on group g's communicator after the compute stream's
 * work so far (lock held). parallel.c's in-place reduce-scatter (recv ==
 * send) leaves the result at send[0, n); NCCL's in-place form leaves it at
 * send + rank * n, so it is moved after. */
static void enqueue(DistNccl *x, int op, int g, const void *send, void *recv, size_t n) {
    ncclComm_t c = x->comm[g];
    if (!c) die(EXIT_INTERNAL, "NCCL: %s on the %s group, which has one member", op_name(op), group_name[g]);
    CU(cudaEventRecord(x->ready, x->compute));
    CU(cudaStreamWaitEvent(x->stream, x->ready, 0));
    void *moved = NULL;
    ncclResult_t r;
    switch (op) {
    case DIST_OP_ALLREDUCE_SUM:
    case DIST_OP_ALLREDUCE_MAX:
        r = ncclAllReduce(send, recv, n, ncclFloat32, op == DIST_OP_ALLREDUCE_MAX ? ncclMax : ncclSum, c, x->stream);
        break;
    case DIST_OP_ALLGATHER:
    case DIST_OP_ALLGATHER_BF16:
        r = ncclAllGather(send, recv, n, op == DIST_OP_ALLGATHER_BF16 ? ncclBfloat16 : ncclFloat32, c, x->stream);
        break;
    case DIST_OP_REDUCE_SCATTER:
        if (recv == send && x->rank[g] > 0) {
            moved = recv;
            recv = (float *)recv + (size_t)x->rank[g] * n;
        }
        r = ncclReduceScatter(send, recv, n, ncclFloat32, ncclSum, c, x->stream);
        break;
    case DIST_OP_SENDRECV: r = send_recv(x, g, send, recv, n); break;
    default: die(EXIT_INTERNAL, "NCCL: unknown operation %d", op);
    }
    int o = x->owner[g];
    x->last[o] = op_name(op);
    x->last_group[o] = g;
    settle(x, g, r, op_name(op));
    if (moved) CU(cudaMemcpyAsync(moved, recv, n * sizeof(float), cudaMemcpyDeviceToDevice, x->stream));
}

static void nccl_start(void *ctx, int h, int op, int g, const void *send, void *recv, size_t n) {
    DistNccl *x = ctx;
    nccl_lock(x);
    grow_done(x, h);
    enqueue(x, op, g, send, recv, n);
    CU(cudaEventRecord(x->done[h], x->stream));
    nccl_unlock(x);
}

/* The compute stream's later work waits for handle h; the host does not. */
static void nccl_wait(void *ctx, int h) {
    DistNccl *x = ctx;
    nccl_lock(x);
    CU(cudaStreamWaitEvent(x->compute, x->done[h], 0));
    check_async(x);
    nccl_unlock(x);
}

static int nccl_test(void *ctx, int h) {
    DistNccl *x = ctx;
    nccl_lock(x);
    cudaError_t e = cudaEventQuery(x->done[h]);
    if (e == cudaErrorNotReady) (void)cudaGetLastError();
    else CU(e);
    check_async(x);
    nccl_unlock(x);
    return e == cudaSuccess;
}

static void nccl_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    DistNccl *x = ctx;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, x->compute));
}

/* Health check: seconds per all-reduce of n floats (device memory) on group
 * g, after `warmup` untimed ones; every member's timing starts when the
 * last warm-up all-reduce, which needs them all, has completed. */
static double nccl_time_allreduce(void *ctx, int g, size_t n, int warmup, int iters) {
    DistNccl *x = ctx;
    float *buf = NULL;
    CU(cudaMalloc((void **)&buf, (n ? n : 1) * sizeof(float)));
    CU(cudaMemset(buf, 0, (n ? n : 1) * sizeof(float)));
    nccl_lock(x);
    for (int i = 0; i < warmup; i++) enqueue(x, DIST_OP_ALLREDUCE_SUM, g, buf, buf, n);
    drain(x);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) enqueue(x, DIST_OP_ALLREDUCE_SUM, g, buf, buf, n);
    drain(x);
    double dt = (now_s() - t0) / (iters > 0 ? iters : 1);
    nccl_unlock(x);
    CU(cudaFree(buf));
    return dt;
}

/* The watchdog thread, on timeout: abort every communicator (their NCCL
 * kernels end) while the main thread is kept out. */
static void nccl_abort(void *ctx) {
    DistNccl *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->aborting = 1;
    (void)cudaSetDevice(x->device); /* this thread's device */
    for (int g = 0; g < DIST_N_GROUPS_CP; g++)
        if (x->comm[g] && x->owner[g] == g) (void)ncclCommAbort(x->comm[g]);
    pthread_mutex_unlock(&x->mu);
}

/* dist_finalize: flush and free the communicators (every rank gets here). */
static void nccl_close(void *ctx) {
    DistNccl *x = ctx;
    kernels_cuda_set_host_wait(NULL, NULL);
    nccl_lock(x);
    drain(x);
    for (int g = 0; g < DIST_N_GROUPS_CP; g++)
        if (x->comm[g] && x->owner[g] == g) settle(x, g, ncclCommFinalize(x->comm[g]), "ncclCommFinalize");
    for (int g = 0; g < DIST_N_GROUPS_CP; g++) {
        if (x->comm[g] && x->owner[g] == g) (void)ncclCommDestroy(x->comm[g]);
        x->comm[g] = NULL;
    }
    for (int i = 0; i < x->n_done; i++) CU(cudaEventDestroy(x->done[i]));
    CU(cudaEventDestroy(x->ready));
    CU(cudaStreamDestroy(x->stream));
    free(x->done);
    x->done = NULL;
    x->n_done = 0;
    nccl_unlock(x);
}

void dist_nccl_attach(Dist *d) {
    DistNccl *x = calloc_check(1, sizeof *x);
    x->d = d;
    pthread_mutex_init(&x->mu, NULL);
    CU(cudaGetDevice(&x->device));
    x->compute = (cudaStream_t)kernels_cuda_stream();
    CU(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming));
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) die(EXIT_INTERNAL, "NCCL: ncclGetVersion failed");
    snprintf(x->name, sizeof x->name, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    const int order[DIST_N_GROUPS_CP] = {DIST_GROUP_DP, DIST_GROUP_SHARD, DIST_GROUP_REPLICATE, DIST_GROUP_TP, DIST_GROUP_CP, DIST_GROUP_EP};
    for (int i = 0; i < DIST_N_GROUPS_CP; i++) {
        int g = order[i];
        dist_group_rank(d, g, &x->rank[g], &x->size[g]);
        x->owner[g] = g;
        if (x->size[g] < 2) continue;
        /* a shard, replicate, context or expert group as large as the
         * data-parallel group is it: the same ranks (those of this tp_rank)
         * in the same order; an expert group as large as the context group
         * is that (both: blocks of consecutive data-parallel indices) */
        int same = (g == DIST_GROUP_SHARD || g == DIST_GROUP_REPLICATE || g == DIST_GROUP_CP || g == DIST_GROUP_EP) &&
                           x->size[g] == x->size[DIST_GROUP_DP] ? DIST_GROUP_DP
                   : g == DIST_GROUP_EP && x->size[g] == x->size[DIST_GROUP_CP] ? DIST_GROUP_CP
                                                                                   : -1;
        if (same >= 0) {
            x->comm[g] = x->comm[same];
            x->owner[g] = x->owner[same];
            continue;
        }
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        if (x->rank[g] == 0) {
            ncclResult_t r = ncclGetUniqueId(&id);
            if (r != ncclSuccess) nccl_fail(x, r, "ncclGetUniqueId", g);
        }
        dist_bcast(d, g, &id, sizeof id);
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        nccl_lock(x);
        ncclResult_t r = ncclCommInitRankConfig(&x->comm[g], x->size[g], id, x->rank[g], &cfg);
        if (r != ncclInProgress && r != ncclSuccess) nccl_fail(x, r, "ncclCommInitRankConfig", g);
        settle(x, g, r, "ncclCommInitRankConfig");
        nccl_unlock(x);
    }
    x->dev = (DistDevComm){x, x->name, nccl_start, nccl_wait, nccl_test, nccl_copy, nccl_time_allreduce, nccl_abort, nccl_close,
                           nccl_alltoallv};
    kernels_cuda_set_host_wait(host_poll, x);
    dist_attach_device(d, &x->dev);
}
