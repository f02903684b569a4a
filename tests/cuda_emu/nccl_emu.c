/* tests/cuda_emu/nccl_emu.c — NCCL for the host emulation of CUDA: device
 * memory is host memory, so each collective is the MPI collective on the
 * same buffers, with NCCL's buffer rules (in-place forms: all-gather's send
 * at recv + rank * n, reduce-scatter's recv at send + rank * n; any other
 * overlap is ncclInvalidArgument). Communicators: every rank creates its
 * groups' communicators in the same order (dist_nccl.c does), so splitting
 * MPI_COMM_WORLD by the unique id's colour (its maker's world rank + 1)
 * forms them. Needs an MPI launch: without MPI (a torchrun-style launch)
 * ncclCommInitRankConfig fails with ncclSystemError and says why. Calls
 * complete at once; ncclCommAbort (the watchdog's) only marks the
 * communicator, as nothing can wait. Point-to-point: ncclSend and ncclRecv
 * between ncclGroupStart and ncclGroupEnd are queued and run at the end as
 * MPI_Isend / MPI_Irecv and one MPI_Waitall (so a ring of sends cannot
 * deadlock); outside a group each runs alone (blocking). A receive whose
 * count is not its sender's (which NCCL leaves undefined: a hang or
 * garbage on the hardware) is ncclInvalidUsage naming both counts. */
#include "nccl/nccl.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

struct EmuNcclComm {
    MPI_Comm comm;
    int rank, size, aborted;
};

static const char *last_error = "";

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "internal error";
    }
}

const char *ncclGetLastError(ncclComm_t c) {
    (void)c;
    return last_error;
}

ncclResult_t ncclGetVersion(int *v) {
    *v = 22800; /* 2.28.0: the emulation */
    return ncclSuccess;
}

static int mpi_up(void) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    return up && !down;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    if (!mpi_up()) {
        last_error = "the emulated NCCL (tests/cuda_emu) runs over MPI: launch with mpirun";
        return ncclSystemError;
    }
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    r += 1;
    memcpy(id->internal, "emu", 4);
    memcpy(id->internal + 4, &r, sizeof r);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    (void)cfg;
    *c = NULL;
    if (!mpi_up()) {
        last_error = "the emulated NCCL (tests/cuda_emu) runs over MPI: launch with mpirun";
        return ncclSystemError;
    }
    int color;
    if (memcmp(id.internal, "emu", 4) != 0) return ncclInvalidArgument;
    memcpy(&color, id.internal + 4, sizeof color);
    struct EmuNcclComm *f = calloc(1, sizeof *f);
    if (!f) return ncclSystemError;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &f->comm);
    MPI_Comm_rank(f->comm, &f->rank);
    MPI_Comm_size(f->comm, &f->size);
    if (f->rank != rank || f->size != nranks) {
        last_error = "communicator members disagree on its size or their ranks";
        return ncclInvalidUsage;
    }
    *c = f;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
    *st = c && c->aborted ? ncclInvalidUsage : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    if (mpi_up()) MPI_Comm_free(&c->comm);
    free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) { /* from the watchdog thread: no MPI */
    if (c) c->aborted = 1;
    return ncclSuccess;
}

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}

/* float32 everywhere; bf16 (2-byte words) only where no arithmetic is done (the all-gather) */
static ncclResult_t check(ncclComm_t c, ncclDataType_t t, size_t n, int bf16_ok) {
    if (!c || c->aborted) return ncclInvalidUsage;
    if (!(t == ncclFloat32 || (bf16_ok && t == ncclBfloat16)) || n > 0x7fffffff) return ncclInvalidArgument;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
    (void)s;
    ncclResult_t r = check(c, t, n, 0);
    if (r != ncclSuccess) return r;
    if (send != recv && overlap(send, n * 4, recv, n * 4)) return ncclInvalidArgument;
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)n, MPI_FLOAT, op == ncclMax ? MPI_MAX : MPI_SUM,
                  c->comm);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
    (void)s;
    ncclResult_t r = check(c, t, n, 1);
    if (r != ncclSuccess) return r;
    size_t es = t == ncclBfloat16 ? 2 : 4;
    MPI_Datatype mt = t == ncclBfloat16 ? MPI_UINT16_T : MPI_FLOAT;
    int in_place = (const char *)send == (char *)recv + (size_t)c->rank * n * es;
    if (!in_place && overlap(send, n * es, recv, n * es * (size_t)c->size)) return ncclInvalidArgument;
    MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)n, mt, recv, (int)n, mt, c->comm);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s) {
    (void)s;
    ncclResult_t r = check(c, t, n, 0);
    if (r != ncclSuccess) return r;
    if (op != ncclSum) return ncclInvalidArgument;
    int in_place = (float *)recv == (const float *)send + (size_t)c->rank * n;
    if (!in_place && overlap(send, n * 4 * (size_t)c->size, recv, n * 4)) return ncclInvalidArgument;
    float *tmp = malloc(n * sizeof(float) + 4);
    if (!tmp) return ncclSystemError;
    MPI_Reduce_scatter_block(send, tmp, (int)n, MPI_FLOAT, MPI_SUM, c->comm);
    memcpy(recv, tmp, n * sizeof(float));
    free(tmp);
    return ncclSuccess;
}

/* ---- point-to-point: the group calls' queue ---- */
typedef struct P2p {
    int send, peer;
    void *buf;
    size_t bytes;
    ncclComm_t c;
} P2p;
static P2p *p2p;
static int n_p2p, cap_p2p, group_depth;

static size_t elem_bytes(ncclDataType_t t) { return t == ncclInt8 ? 1 : t == ncclBfloat16 ? 2 : 4; }

static char p2p_error[200];

static ncclResult_t p2p_run(void) {
    MPI_Request *req = calloc((size_t)(n_p2p ? n_p2p : 1), sizeof *req);
    MPI_Status *st = calloc((size_t)(n_p2p ? n_p2p : 1), sizeof *st);
    if (!req || !st) {
        free(req);
        free(st);
        return ncclSystemError;
    }
    for (int i = 0; i < n_p2p; i++) {
        P2p *o = &p2p[i];
        if (o->send) MPI_Isend(o->buf, (int)o->bytes, MPI_BYTE, o->peer, 77, o->c->comm, &req[i]);
        else MPI_Irecv(o->buf, (int)o->bytes, MPI_BYTE, o->peer, 77, o->c->comm, &req[i]);
    }
    /* the sender's count against the receiver's: a shorter message is
     * counted, a longer one an error in its status (errors return: the
     * world's handler, which communicators inherit) */
    int rc = MPI_Waitall(n_p2p, req, st);
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n_p2p && r == ncclSuccess; i++) {
        P2p *o = &p2p[i];
        int got = (int)o->bytes;
        if (rc != MPI_SUCCESS && st[i].MPI_ERROR != MPI_SUCCESS) got = -1; /* a receive: the peer sent more */
        else if (!o->send) MPI_Get_count(&st[i], MPI_BYTE, &got);
        if (got == (int)o->bytes) continue;
        if (got < 0) snprintf(p2p_error, sizeof p2p_error, "%s of %zu bytes with peer %d failed (the peer's count is larger)",
                              o->send ? "ncclSend" : "ncclRecv", o->bytes, o->peer);
        else snprintf(p2p_error, sizeof p2p_error, "ncclRecv of %zu bytes from peer %d got %d (the peer's ncclSend count)", o->bytes,
                      o->peer, got);
        last_error = p2p_error;
        r = ncclInvalidUsage;
    }
    free(req);
    free(st);
    n_p2p = 0;
    return r;
}

static ncclResult_t p2p_add(int send, const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c) {
    if (!c || c->aborted) return ncclInvalidUsage;
    if (!(t == ncclInt8 || t == ncclFloat32 || t == ncclBfloat16) || n * elem_bytes(t) > 0x7fffffff) return ncclInvalidArgument;
    if (peer < 0 || peer >= c->size) return ncclInvalidArgument;
    if (n_p2p == cap_p2p) {
        int cap = cap_p2p ? 2 * cap_p2p : 8;
        P2p *np = realloc(p2p, (size_t)cap * sizeof *np);
        if (!np) return ncclSystemError;
        p2p = np;
        cap_p2p = cap;
    }
    p2p[n_p2p++] = (P2p){send, peer, (void *)(uintptr_t)buf, n * elem_bytes(t), c};
    return group_depth ? ncclSuccess : p2p_run();
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return ncclInvalidUsage;
    return --group_depth ? ncclSuccess : p2p_run();
}

ncclResult_t ncclSend(const void *send, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    (void)s;
    return p2p_add(1, send, n, t, peer, c);
}

ncclResult_t ncclRecv(void *recv, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    (void)s;
    return p2p_add(0, recv, n, t, peer, c);
}
