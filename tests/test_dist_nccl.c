/* test_dist_nccl.c — dist_nccl.c run without a GPU: compiled against the
 * fake CUDA runtime and NCCL of tests/fake_cuda (defined below: "device"
 * memory is host memory, streams run at once, collectives are MPI with
 * NCCL's buffer rules and a non-blocking communicator's ncclInProgress
 * answers), driven through parallel.c as the trainer drives it. It checks
 * dist_nccl.c's own logic, not NCCL or the GPU: which communicators it
 * creates (one per distinct group, non-blocking, NCCL rank = index in the
 * group), the results of every collective (in-place reduce-scatter
 * included), the stream and event order of each, polling to completion,
 * errors and the watchdog's abort.
 *
 *   mpirun -np N test_dist_nccl TP S       layout tp x shard S: results, communicators, streams
 *   mpirun -np N test_dist_nccl cp CP      context groups of CP: the ring shift, all-gather, reduce-scatter
 *   mpirun -np N test_dist_nccl ep TP CP EP  expert groups of EP: communicators, the all-to-all
 *   mpirun -np 2 test_dist_nccl error      an asynchronous error met in a host wait: one line, exit 6
 *   mpirun -np 2 test_dist_nccl hang FILE  rank 1's host wait never ends: its watchdog aborts the
 *                                          communicators (writes FILE.1) and exits 5
 * Rank 0 prints "N passed, M failed" over every rank's checks (its own
 * after dist_finalize). */
#include "dist_nccl.h"
#include "kernels.h"
#include "parallel.h"
#include "util.h"
#include "a2a_check.h"
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int pass, fail, g_rank;
#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (cond) pass++;                                                                         \
        else { fail++; printf("FAIL rank %d: ", g_rank); printf(__VA_ARGS__); printf("\n"); }     \
    } while (0)

/* ------------------------------------------------------------------ */
/* the fake CUDA runtime                                               */

struct FakeStream { int flags; };
struct FakeEvent { int dummy; };
static cudaError_t last_err;
static int not_ready;     /* queries answering not-ready still to come (-1: forever) */
static char trace[64];    /* R/r: record on the compute / another stream; W/w: wait of compute / another; N: collective; c: copy on another stream */
static void tr(char c) { size_t n = strlen(trace); if (n + 1 < sizeof trace) { trace[n] = c; trace[n + 1] = 0; } }

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : e == cudaErrorNotReady ? "device not ready" : "fake CUDA error"; }
cudaError_t cudaGetLastError(void) { cudaError_t e = last_err; last_err = cudaSuccess; return e; }
cudaError_t cudaGetDevice(int *dev) { *dev = 0; return cudaSuccess; }
cudaError_t cudaSetDevice(int dev) { (void)dev; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = calloc(1, sizeof **s);
    (*s)->flags = (int)flags;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) { (void)flags; *e = calloc(1, sizeof **e); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)e; tr(s ? 'r' : 'R'); return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t e) {
    (void)e;
    if (!not_ready) return cudaSuccess;
    if (not_ready > 0) not_ready--;
    last_err = cudaErrorNotReady; /* as the real runtime records it */
    return cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) { (void)e; (void)flags; tr(s ? 'w' : 'W'); return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t bytes) { *p = malloc(bytes); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaMemset(void *p, int v, size_t bytes) { memset(p, v, bytes); return cudaSuccess; }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)kind;
    memmove(dst, src, bytes);
    tr(s ? 'c' : 'C');
    return cudaSuccess;
}

/* the CUDA backend's side: the compute stream and the host wait (as kernels.cu's) */
static void (*g_poll)(void *);
static void *g_poll_ctx;
static int n_polls;
void *kernels_cuda_stream(void) { return NULL; }
void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx) { g_poll = poll; g_poll_ctx = ctx; }
static void host_wait(void) {
    struct FakeEvent ev;
    while (g_poll && cudaEventQuery(&ev) == cudaErrorNotReady) {
        (void)cudaGetLastError();
        n_polls++;
        g_poll(g_poll_ctx);
    }
}

/* ------------------------------------------------------------------ */
/* the fake NCCL: MPI underneath, NCCL's buffer rules                   */

struct FakeComm { MPI_Comm comm; int rank, size, pending; ncclResult_t async; };
static struct FakeComm *comms[16];
static int n_comms, n_destroyed, nonblocking_inits, rank_ok;
static char abort_path[512];

const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : r == ncclRemoteError ? "remote process exited or there was a network error" : "fake NCCL error";
}
const char *ncclGetLastError(ncclComm_t c) { (void)c; return "fake detail\nsecond line"; }
ncclResult_t ncclGetVersion(int *v) { *v = 22809; return ncclSuccess; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    r += 1;
    memcpy(id->internal, &r, sizeof r);
    return ncclSuccess;
}
/* every rank creates its communicators in the same order, so a split of the world forms them */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    struct FakeComm *f = calloc(1, sizeof *f);
    int color;
    memcpy(&color, id.internal, sizeof color);
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &f->comm);
    MPI_Comm_rank(f->comm, &f->rank);
    MPI_Comm_size(f->comm, &f->size);
    rank_ok += f->rank == rank && f->size == nranks && color > 0;
    nonblocking_inits += cfg->blocking == 0;
    f->pending = 2; /* "in progress" twice before it is ready */
    comms[n_comms++] = f;
    *c = f;
    return ncclInProgress;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
    if (c->pending > 0) { c->pending--; *st = ncclInProgress; }
    else *st = c->async;
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t c) { MPI_Barrier(c->comm); c->pending = 1; return ncclInProgress; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { MPI_Comm_free(&c->comm); free(c); n_destroyed++; return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t c) { /* the watchdog thread: leave a mark, no MPI */
    (void)c;
    int fd = open(abort_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { if (write(fd, "abort\n", 6) != 6) { /* the shell sees fewer lines */ } close(fd); }
    return ncclSuccess;
}
static int overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}
/* a call while the communicator is in progress is a misuse NCCL forbids */
static ncclResult_t begin(ncclComm_t c, ncclDataType_t t, int bf16_ok) {
    if (c->pending) return ncclInvalidUsage;
    if (!(t == ncclFloat32 || (bf16_ok && t == ncclBfloat16))) return ncclInvalidArgument;
    tr('N');
    return ncclSuccess;
}
static ncclResult_t done(ncclComm_t c) { c->pending = 1; return ncclInProgress; }
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = begin(c, t, 0);
    if (r != ncclSuccess || !s || s->flags != cudaStreamNonBlocking) return r ? r : ncclInvalidArgument;
    if (send != recv && overlap(send, n * 4, recv, n * 4)) return ncclInvalidArgument;
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)n, MPI_FLOAT, op == ncclMax ? MPI_MAX : MPI_SUM, c->comm);
    return done(c);
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = begin(c, t, 1);
    if (r != ncclSuccess || !s) return r ? r : ncclInvalidArgument;
    size_t es = t == ncclBfloat16 ? 2 : 4;
    MPI_Datatype mt = t == ncclBfloat16 ? MPI_UINT16_T : MPI_FLOAT;
    int in_place = (const char *)send == (char *)recv + (size_t)c->rank * n * es;
    if (!in_place && overlap(send, n * es, recv, n * es * (size_t)c->size)) return ncclInvalidArgument;
    MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)n, mt, recv, (int)n, mt, c->comm);
    return done(c);
}
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = begin(c, t, 0);
    if (r != ncclSuccess || !s || op != ncclSum) return r ? r : ncclInvalidArgument;
    int in_place = (float *)recv == (const float *)send + (size_t)c->rank * n;
    if (!in_place && overlap(send, n * 4 * (size_t)c->size, recv, n * 4)) return ncclInvalidArgument;
    float *tmp = malloc(n * sizeof(float));
    MPI_Reduce_scatter_block(send, tmp, (int)n, MPI_FLOAT, MPI_SUM, c->comm);
    memcpy(recv, tmp, n * sizeof(float));
    free(tmp);
    return done(c);
}

/* point-to-point: queued between ncclGroupStart and ncclGroupEnd, run at
 * the end (MPI_Isend / MPI_Irecv, then a wait); the group end answers
 * ncclInProgress as a non-blocking communicator's does */
typedef struct { int send, peer; void *buf; size_t n; ncclComm_t c; } FakeP2p;
static FakeP2p p2p[32];
static int n_p2p, in_group, n_group_calls;
ncclResult_t ncclGroupStart(void) { in_group++; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) {
    if (!in_group) return ncclInvalidUsage;
    if (--in_group) return ncclSuccess;
    MPI_Request req[32];
    for (int i = 0; i < n_p2p; i++) {
        if (p2p[i].send) MPI_Isend(p2p[i].buf, (int)p2p[i].n, MPI_BYTE, p2p[i].peer, 9, p2p[i].c->comm, &req[i]);
        else MPI_Irecv(p2p[i].buf, (int)p2p[i].n, MPI_BYTE, p2p[i].peer, 9, p2p[i].c->comm, &req[i]);
    }
    MPI_Waitall(n_p2p, req, MPI_STATUSES_IGNORE);
    ncclComm_t c = n_p2p ? p2p[0].c : NULL;
    n_p2p = 0;
    n_group_calls++;
    if (c) c->pending = 1;
    return c ? ncclInProgress : ncclSuccess;
}
static ncclResult_t p2p_add(int send, const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    if (!in_group || n_p2p == 32 || c->pending) return ncclInvalidUsage; /* only grouped here (a lone send would block) */
    if (n == 0) return ncclInvalidArgument; /* dist_nccl.c posts none: a zero-byte pair is work for nothing */
    if (t != ncclInt8 || !s || peer < 0 || peer >= c->size) return ncclInvalidArgument;
    tr('N');
    p2p[n_p2p++] = (FakeP2p){send, peer, (void *)buf, n, c};
    return ncclSuccess;
}
ncclResult_t ncclSend(const void *send, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    return p2p_add(1, send, n, t, peer, c, s);
}
ncclResult_t ncclRecv(void *recv, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    return p2p_add(0, recv, n, t, peer, c, s);
}

/* ------------------------------------------------------------------ */
/* the checks                                                          */

static double total[2];

static float val(int rank, size_t i) { return (float)(rank * 1000 + (int)i); }

static void layout(Dist *d, int tp, int S) {
    dist_set_tp(d, tp);
    dist_setup_groups(d, S);
    dist_nccl_attach(d);
    int dp = d->dp, R = d->replicate_size;
    int want = (dp > 1) + (S > 1 && S != dp) + (R > 1 && R != dp) + (tp > 1);
    CHECK(n_comms == want && nonblocking_inits == want && rank_ok == want,
          "%d communicators (%d non-blocking, %d with the group's rank and size), expected %d", n_comms, nonblocking_inits, rank_ok, want);
    CHECK(d->dev && strcmp(d->dev->name, "NCCL 2.28.9") == 0 && g_poll, "not attached, or no host-wait poll");
    enum { n = 5 };
    float x[64], y[64];
    for (size_t i = 0; i < 64; i++) x[i] = val(d->rank, i);

    if (dp > 1) {
        trace[0] = 0;
        dist_allreduce(d, DIST_GROUP_DP, DIST_F32, DIST_SUM, x, n);
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int j = 0; j < dp; j++) s += val(j * tp + d->tp_rank, i);
            ok &= x[i] == s;
        }
        CHECK(ok, "dp all-reduce: x[0] %g", x[0]);
        CHECK(strcmp(trace, "RwNrW") == 0, "dp all-reduce: stream trace %s, expected RwNrW (ordered after the compute stream, waited by it)", trace);
    }
    if (tp > 1) {
        for (size_t i = 0; i < n; i++) x[i] = val(d->rank, i);
        dist_allreduce(d, DIST_GROUP_TP, DIST_F32, DIST_MAX, x, n);
        CHECK(x[0] == val(d->dp_rank * tp + tp - 1, 0) && x[n - 1] == val(d->dp_rank * tp + tp - 1, n - 1), "tp max: %g", x[0]);
        for (size_t i = 0; i < n; i++) x[i] = 1;
        dist_allreduce(d, DIST_GROUP_TP, DIST_F32, DIST_SUM, x, n);
        CHECK(x[0] == tp, "tp sum: %g", x[0]);
    }
    if (R > 1) {
        for (size_t i = 0; i < n; i++) x[i] = 1;
        dist_allreduce(d, DIST_GROUP_REPLICATE, DIST_F32, DIST_SUM, x, n);
        CHECK(x[0] == R && x[n - 1] == R, "replicate sum: %g", x[0]);
    }
    if (S > 1) {
        int base = d->shard_group * S; /* dp rank of the group's first member */
        for (size_t i = 0; i < 64; i++) x[i] = val(d->rank, i);
        dist_allgather(d, DIST_GROUP_SHARD, DIST_F32, x, y, n);
        int ok = 1;
        for (int k = 0; k < S; k++)
            for (size_t i = 0; i < n; i++) ok &= y[k * n + i] == val((base + k) * tp + d->tp_rank, i);
        CHECK(ok, "shard all-gather: block order");
        /* bf16 words (ncclBfloat16): 2 bytes per element, the same block order, non-blocking too */
        uint16_t x16[64], y16[64 * 4];
        for (size_t i = 0; i < 64; i++) x16[i] = (uint16_t)(0x3f80 + d->rank * 64 + i);
        memset(y16, 0, sizeof y16);
        double ag0 = d->bytes_allgather;
        dist_allgather(d, DIST_GROUP_SHARD, DIST_BF16, x16, y16, n);
        int h16 = dist_iallgather(d, DIST_GROUP_SHARD, DIST_BF16, x16 + 8, y16 + 64, 3);
        dist_wait(d, h16);
        ok = 1;
        for (int k = 0; k < S; k++) {
            int src = (base + k) * tp + d->tp_rank;
            for (size_t i = 0; i < n; i++) ok &= y16[k * n + i] == (uint16_t)(0x3f80 + src * 64 + i);
            for (size_t i = 0; i < 3; i++) ok &= y16[64 + k * 3 + i] == (uint16_t)(0x3f80 + src * 64 + 8 + i);
        }
        ok &= y16[S * n] == 0; /* nothing past the S blocks */
        CHECK(ok, "shard bf16 all-gather: words or block order wrong");
        CHECK(d->bytes_allgather - ag0 == (double)(S - 1) * (n + 3) * 2, "bf16 all-gather bytes %g, expected %g",
              d->bytes_allgather - ag0, (double)(S - 1) * (n + 3) * 2);
        /* reduce-scatter, into another buffer and in place (result at send[0, n)) */
        for (int inplace = 0; inplace < 2; inplace++) {
            for (size_t i = 0; i < 64; i++) x[i] = val(d->rank, i);
            trace[0] = 0;
            int h = dist_ireduce_scatter(d, DIST_GROUP_SHARD, x, inplace ? x : y, n);
            CHECK(dist_test(d, h) == 1, "dist_test of a finished reduce-scatter");
            dist_wait(d, h);
            const float *r = inplace ? x : y;
            ok = 1;
            for (size_t i = 0; i < n; i++) {
                float s = 0;
                for (int k = 0; k < S; k++) s += val((base + k) * tp + d->tp_rank, d->shard_index * n + i);
                ok &= r[i] == s;
            }
            CHECK(ok, "shard reduce-scatter (%s): r[0] %g", inplace ? "in place" : "out of place", r[0]);
            const char *want_tr = inplace && d->shard_index > 0 ? "RwNcrW" : "RwNrW";
            CHECK(strcmp(trace, want_tr) == 0, "reduce-scatter (%s) trace %s, expected %s", inplace ? "in place" : "out of place", trace, want_tr);
        }
        /* several in flight, tested before their wait (not ready at first: polled) */
        not_ready = 1;
        int h1 = dist_iallgather(d, DIST_GROUP_SHARD, DIST_F32, x, y, n), h2 = dist_iallgather(d, DIST_GROUP_SHARD, DIST_F32, x + 8, y + 32, 2);
        CHECK(dist_test(d, h1) == 0 && cudaGetLastError() == cudaSuccess, "not-ready test: answered done, or left the last error set");
        CHECK(dist_test(d, h2) == 1, "ready test answered not done");
        dist_wait(d, h2);
        dist_wait(d, h1);
        CHECK(y[32] == val(base * tp + d->tp_rank, 8), "second gather in flight: %g", y[32]);
    }
    /* the backend's host wait polls dist_nccl (no error: returns) */
    not_ready = 3;
    n_polls = 0;
    host_wait();
    CHECK(n_polls == 3, "host wait polled %d times, expected 3", n_polls);
    /* the health check times NCCL on device memory; its drain polls and clears not-ready */
    not_ready = 2;
    CHECK(dist_health_check(d, 4096, 0) == 1 && cudaGetLastError() == cudaSuccess, "health check");
    total[0] = pass;
    total[1] = fail;
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, total, 2); /* every rank's counts, while MPI is up */
    pass = fail = 0;
    dist_finalize(d);
    CHECK(n_destroyed == want && d->dev == NULL && g_poll == NULL, "finalize: %d of %d communicators destroyed", n_destroyed, want);
}

/* Every rank's counts to rank 0 while MPI is up, then dist_finalize,
 * which destroys the want communicators. */
static void finish(Dist *d, int want) {
    total[0] = pass;
    total[1] = fail;
    dist_allreduce(d, DIST_GROUP_WORLD, DIST_F64, DIST_SUM, total, 2);
    pass = fail = 0;
    dist_finalize(d);
    CHECK(n_destroyed == want, "finalize: %d of %d communicators destroyed", n_destroyed, want);
}

/* Context parallelism of degree cp (tp 1, no sharding): the ring shift's
 * send to the next member and receive from the previous one (one group
 * call of ncclSend and ncclRecv on the communication stream, after the
 * compute stream, waited by it), the all-gather of bytes and the
 * reduce-scatter over the context group; its communicator is the dp one
 * when every data-parallel rank is a context rank, else its own. */
static void cp_layout(Dist *d, int cp) {
    dist_set_tp(d, 1);
    dist_set_cp(d, cp);
    dist_setup_groups(d, 1);
    dist_nccl_attach(d);
    int dp = d->dp, want = (dp > 1) + (cp > 1 && cp != dp), base = d->dp_rank / cp * cp;
    CHECK(n_comms == want && rank_ok == want, "cp %d: %d communicators (%d with the group's rank and size), expected %d", cp, n_comms,
          rank_ok, want);
    float x[8], y[64];
    for (int i = 0; i < 8; i++) x[i] = val(d->rank, (size_t)i);
    trace[0] = 0;
    int calls0 = n_group_calls;
    double b0 = d->bytes_cp;
    int h = dist_shift_start(d, DIST_GROUP_CP, x, y, 5 * sizeof(float));
    CHECK(h >= 0, "cp shift over NCCL: handle %d (expected one to wait for)", h);
    /* started: queued on the communication stream, the compute stream not
     * held until the wait (cp.c's parts run between the two) */
    CHECK(strcmp(trace, "RwNNr") == 0, "cp shift started: stream trace %s, expected RwNNr (the compute stream waits only in dist_shift_wait)",
          trace);
    dist_shift_wait(d, h);
    int prev = base + (d->cp_rank + cp - 1) % cp, ok = 1;
    for (int i = 0; i < 5; i++) ok &= y[i] == val(prev, (size_t)i);
    CHECK(ok, "cp shift: got %g, expected rank %d's %g", y[0], prev, val(prev, 0));
    CHECK(strcmp(trace, "RwNNrW") == 0 && n_group_calls == calls0 + 1,
          "cp shift: stream trace %s, expected RwNNrW (send and recv in one group call after the compute stream, waited by it)", trace);
    CHECK(d->bytes_cp - b0 == 5 * sizeof(float), "cp shift: %g bytes counted, expected 20", d->bytes_cp - b0);
    unsigned char xb[6], yb[6 * 8];
    for (int i = 0; i < 6; i++) xb[i] = (unsigned char)(d->rank * 16 + i);
    dist_allgather(d, DIST_GROUP_CP, DIST_BYTE, xb, yb, 6);
    ok = 1;
    for (int k = 0; k < cp; k++)
        for (int i = 0; i < 6; i++) ok &= yb[k * 6 + i] == (unsigned char)((base + k) * 16 + i);
    CHECK(ok, "cp all-gather of bytes: block order");
    for (int i = 0; i < 64; i++) y[i] = val(d->rank, (size_t)i);
    dist_reduce_scatter(d, DIST_GROUP_CP, y, x, 2);
    ok = 1;
    for (int i = 0; i < 2; i++) {
        float s = 0;
        for (int k = 0; k < cp; k++) s += val(base + k, (size_t)(d->cp_rank * 2 + i));
        ok &= x[i] == s;
    }
    CHECK(ok, "cp reduce-scatter: x[0] %g", x[0]);
    CHECK(dist_health_check(d, 4096, 0) == 1, "health check with a context group");
    finish(d, want);
}

/* The expert group (tp x cp x dp with ep): its communicator (the dp one
 * when ep is dp, the context one when ep is cp, else its own), its members
 * through the all-to-all, and rounds of random sizes: each one group call
 * of one ncclSend / ncclRecv per peer with bytes to move (none when
 * nothing moves), this rank's own block a copy on the communication
 * stream, after the compute stream and waited by it (the event trace);
 * every byte and bytes_ep against a2a_check.h's. */
static void ep_layout(Dist *d, int tp, int cp, int ep) {
    dist_set_tp(d, tp);
    dist_set_cp(d, cp);
    dist_set_ep(d, ep);
    dist_setup_groups(d, 1);
    dist_nccl_attach(d);
    int dp = d->dp, want = (dp > 1) + (tp > 1) + (cp > 1 && cp != dp) + (ep > 1 && ep != dp && ep != cp);
    CHECK(n_comms == want && rank_ok == want, "tp %d cp %d ep %d: %d communicators (%d with the group's rank and size), expected %d",
          tp, cp, ep, n_comms, rank_ok, want);
    char why[256] = "";
    CHECK(a2a_members(d, tp, ep, why, sizeof why), "%s", why);
    for (int r = 0; r < 4; r++) {
        A2aRound got;
        trace[0] = 0;
        int calls0 = n_group_calls;
        CHECK(a2a_round(d, tp, ep, r, &got, why, sizeof why), "%s", why);
        /* ep 1: the own block copied on the compute stream (dist_copy), no NCCL */
        char tr_want[64] = "";
        if (ep == 1 && got.self_bytes) strcpy(tr_want, "C");
        if (ep > 1) {
            strcpy(tr_want, got.self_bytes ? "Rwc" : "Rw");
            for (int i = 0; i < got.peer_ops; i++) strcat(tr_want, "N");
            strcat(tr_want, "rW");
        }
        CHECK(strcmp(trace, tr_want) == 0 && n_group_calls == calls0 + (got.peer_ops > 0),
              "ep %d round %d: stream trace %s (%d group calls), expected %s (%d)", ep, r, trace, n_group_calls - calls0, tr_want,
              got.peer_ops > 0);
    }
    CHECK(dist_health_check(d, 4096, 0) == 1, "health check with an expert group");
    finish(d, want);
}

int main(int argc, char **argv) {
    Dist d;
    dist_init(&d, &argc, &argv);
    g_rank = d.rank;
    if (argc == 2 && strcmp(argv[1], "error") == 0) { /* a peer's failure seen in a host wait */
        dist_setup_groups(&d, 1);
        dist_nccl_attach(&d);
        float x[4] = {1, 2, 3, 4};
        dist_allreduce(&d, DIST_GROUP_REPLICATE, DIST_F32, DIST_SUM, x, 4); /* the replicate group is the dp communicator */
        comms[0]->async = ncclRemoteError;
        not_ready = -1;
        host_wait(); /* ends the job: exit 6 */
        printf("rank %d: the error was not reported\n", d.rank);
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "hang") == 0) {
        snprintf(abort_path, sizeof abort_path, "%s.%d", argv[2], d.rank);
        dist_setup_groups(&d, 1);
        dist_watchdog_start(&d, d.rank == 1 ? 0.5 : 30);
        dist_nccl_attach(&d);
        dist_phase(&d, 1, "backward");
        if (d.rank == 1) {
            not_ready = -1;
            host_wait(); /* polls until the watchdog aborts and exits 5 */
        }
        sleep(10);
        printf("rank %d: the watchdog did not end the job\n", d.rank);
        return 1;
    }
    if (argc == 5 && strcmp(argv[1], "ep") == 0) ep_layout(&d, atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    else if (argc != 3) die(EXIT_USAGE, "usage: test_dist_nccl TP S | cp CP | ep TP CP EP | error | hang FILE");
    else if (strcmp(argv[1], "cp") == 0) cp_layout(&d, atoi(argv[2]));
    else layout(&d, atoi(argv[1]), atoi(argv[2]));
    /* every rank's counts before dist_finalize, rank 0's own after it */
    if (d.rank == 0) printf("%d passed, %d failed\n", (int)total[0] + pass, (int)total[1] + fail);
    return fail || total[1] ? 1 : 0;
}
