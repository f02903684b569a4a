/* kernels.cu — the CUDA backend of kernels.h (fp32 storage, first tranche).
 *
 * Every pointer is device memory; all work goes to the legacy default stream
 * in issue order, so the kernels.h contract (forward overwrites, backward adds,
 * calls see each other's results) holds without extra synchronisation.
 * to_host and the reductions that return a number synchronise (by polling
 * when a communication library set a host-wait hook: host_wait below).
 *
 * Matrix products: cuBLASLt with CUBLAS_COMPUTE_32F_FAST_TF32 — fp32 in and
 * out, tensor cores read the inputs rounded to TF32 (10-bit mantissa) and
 * accumulate in fp32. Chosen over converting to bf16 on the fly because the
 * storage is fp32 in this tranche: TF32 needs no conversion pass and no
 * scratch copy of the operands (the LM-head operand alone is N x V), and it
 * stays closer to the CPU reference. The price is half the bf16 tensor rate;
 * bf16 storage and bf16 GEMMs are the next tranche.
 *
 * Attention: scores and the products with V go through strided-batched
 * cuBLASLt GEMMs on the full T x T square (the masked half is computed and
 * thrown away), one query head at a time; the causal softmax and its backward
 * are hand-written kernels. The probabilities live in a [B, T, T] scratch:
 * the forward saves each row's log-sum-exp, the backward recomputes them.
 *
 * Everything that needs scratch memory (cuBLASLt workspace, reduction
 * partials, attention's P and dP blocks, column-sum partials, AdamW
 * range tables, the embedding backward's sort keys) allocates at first use
 * and only grows, so steady-state steps never allocate. Every CUDA and
 * cuBLASLt call is checked: a failure prints one line with file:line and
 * exits (70; 3 for out of memory). */
#include <cub/device/device_radix_sort.cuh>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels.h"
#include "util.h"
}

// ----------------------------------------------------------------------------
// error checking

static void cuda_check_(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    die(e == cudaErrorMemoryAllocation ? EXIT_IO : EXIT_INTERNAL, "CUDA error at %s:%d: %s (%s)", file, line,
        cudaGetErrorString(e), what);
}

static void cublas_check_(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    die(s == CUBLAS_STATUS_ALLOC_FAILED ? EXIT_IO : EXIT_INTERNAL, "cuBLASLt error at %s:%d: %s (%s)", file, line,
        cublasLtGetStatusString(s), what);
}

#define CUDA_CHECK(x) cuda_check_((x), #x, __FILE__, __LINE__)
#define CUBLAS_CHECK(x) cublas_check_((x), #x, __FILE__, __LINE__)

/* LLMTRAIN_CUDA_SYNC=1: synchronise after every kernel and GEMM, so an
 * asynchronous fault is reported at the line of the launch that caused it
 * (slow; for debugging). Without it a fault surfaces at the next
 * synchronising call. */
static int sync_debug = -1;

static void launch_check_(const char *what, const char *file, int line) {
    cuda_check_(cudaGetLastError(), what, file, line);
    if (sync_debug < 0) {
        const char *e = getenv("LLMTRAIN_CUDA_SYNC");
        sync_debug = e && *e && strcmp(e, "0") != 0;
    }
    if (sync_debug) cuda_check_(cudaDeviceSynchronize(), what, file, line);
}

/* after every kernel launch: a bad configuration is reported at its line */
#define LAUNCH_CHECK() launch_check_("kernel launch", __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// device state (one device per process in this tranche)

static struct {
    int ready;
    int dev;
    cudaDeviceProp prop;
    int clock_khz;
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    double *red_partial; /* [RED_BLOCKS] */
    double *red_out;     /* [1] */
} G;

// ----------------------------------------------------------------------------
// device memory: every cudaMalloc and cudaFree of this backend goes through
// dev_malloc / dev_free, which count the bytes in use and their peak
// (kernels_cuda_mem_stats; the trainer's `mem` on CUDA). Not counted: the
// CUDA context and what libraries allocate for themselves (cuBLASLt's handle).

static struct {
    size_t in_use, peak;
} Mem;

static void dev_malloc(void **p, size_t bytes, const char *file, int line) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&free_b, &total_b);
        die(EXIT_IO, "CUDA out of memory at %s:%d allocating %.2f GiB (%.2f of %.2f GiB free on the device, "
            "%.2f GiB held by llmtrain)", file, line, bytes / 1073741824.0, free_b / 1073741824.0,
            total_b / 1073741824.0, Mem.in_use / 1073741824.0);
    }
    cuda_check_(e, "cudaMalloc", file, line);
    Mem.in_use += bytes;
    if (Mem.in_use > Mem.peak) Mem.peak = Mem.in_use;
}

static void dev_free(void *p, size_t bytes) {
    if (!p) return;
    CUDA_CHECK(cudaFree(p));
    Mem.in_use -= bytes;
}

#define DEV_MALLOC(p, bytes) dev_malloc((void **)(p), (bytes), __FILE__, __LINE__)

extern "C" void kernels_cuda_mem_stats(size_t *in_use, size_t *peak) {
    if (in_use) *in_use = Mem.in_use;
    if (peak) *peak = Mem.peak;
}

/* Scratch buffers that only grow: a resize synchronises the device (cudaFree)
 * and happens in the first step only, as shapes repeat. */
typedef struct { void *p; size_t cap; } Scratch;

static void *scratch_get(Scratch *s, size_t bytes) {
    if (bytes > s->cap) {
        dev_free(s->p, s->cap);
        s->p = NULL;
        s->cap = 0;
        size_t cap = bytes + bytes / 8;
        DEV_MALLOC(&s->p, cap);
        s->cap = cap;
    }
    return s->p;
}

static Scratch sc_att, sc_attp, sc_col, sc_adam;

#define RED_BLOCKS 512
#define RED_THREADS 256

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

static unsigned grid_for(size_t n, int threads) {
    size_t g = (n + (size_t)threads - 1) / (size_t)threads;
    if (g < 1) g = 1;
    if (g > (1u << 20)) g = 1u << 20; /* grid-stride loops cover the rest */
    return (unsigned)g;
}

// ----------------------------------------------------------------------------
// warp and block reductions (blockDim.x a multiple of 32, at most 1024)

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* every thread of the block gets the total; safe to call back to back */
template <typename T> __device__ T block_sum(T v) {
    __shared__ T sh[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    return warp_sum(r);
}

__device__ float block_max(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(r);
}

// ----------------------------------------------------------------------------
// memory

/* The size of every live allocation of alloc(), for free() to uncount: a
 * plain array searched linearly (a few dozen live buffers in training;
 * alloc and free never run in the step loop). Freeing a pointer alloc()
 * did not return is an internal error. */
static struct {
    void **p;
    size_t *bytes;
    size_t n, cap;
} Live;

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    size_t sz = bytes ? bytes : 256;
    DEV_MALLOC(&p, sz);
    CUDA_CHECK(cudaMemset(p, 0, sz));
    if (Live.n == Live.cap) {
        size_t cap = Live.cap ? 2 * Live.cap : 64;
        void **np = (void **)malloc_check(cap * sizeof *np);
        size_t *nb = (size_t *)malloc_check(cap * sizeof *nb);
        if (Live.n) {
            memcpy(np, Live.p, Live.n * sizeof *np);
            memcpy(nb, Live.bytes, Live.n * sizeof *nb);
        }
        free(Live.p);
        free(Live.bytes);
        Live.p = np;
        Live.bytes = nb;
        Live.cap = cap;
    }
    Live.p[Live.n] = p;
    Live.bytes[Live.n] = sz;
    Live.n++;
    return p;
}

static void cu_free(void *p) {
    if (!p) return;
    size_t i = Live.n;
    while (i > 0 && Live.p[i - 1] != p) i--;
    if (i == 0) die(EXIT_INTERNAL, "cuda free: %p was not allocated by this backend", p);
    dev_free(p, Live.bytes[i - 1]);
    Live.n--;
    Live.p[i - 1] = Live.p[Live.n];
    Live.bytes[i - 1] = Live.bytes[Live.n];
}

static void cu_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
}

static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

/* Host waits. A synchronous copy waits for the stream's earlier work, which
 * may wait on collectives (multi-rank runs: dist_nccl.c). With a poll hook
 * set (kernels_cuda_set_host_wait), the stream is drained first by querying
 * an event and calling the hook between queries, so a failed or hung
 * collective is the hook's error or a watchdog abort instead of a wait in
 * the driver that never ends; the copy then finds the stream idle. */
static struct {
    void (*poll)(void *ctx);
    void *ctx;
    cudaEvent_t ev;
} HW;

static void host_wait(void) {
    if (!HW.poll) return;
    CUDA_CHECK(cudaEventRecord(HW.ev, 0));
    cudaError_t e;
    while ((e = cudaEventQuery(HW.ev)) == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not-ready is recorded as the thread's last error, which LAUNCH_CHECK reads: clear it */
        HW.poll(HW.ctx);
    }
    CUDA_CHECK(e);
}

static void cu_to_host(void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    host_wait();
    CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void cu_from_host(void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    host_wait();
    CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

// ----------------------------------------------------------------------------
// embeddings

__global__ void embed_fwd_k(float *out, const int *tokens, const float *wte, const float *wpe, int N, int T, int C,
                            int v0, int V) {
    size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(i / C), c = (int)(i % C);
        int t = tokens[n] - v0;
        float x = (t >= 0 && t < V) ? wte[(size_t)t * C + c] : 0.0f;
        if (wpe) x += wpe[(size_t)(n % T) * C + c];
        out[i] = x;
    }
}

/* Embedding backward, deterministic: every gradient row receives its rows of
 * dout in increasing row order n, one float addition after another, starting
 * from the row's current value: the CPU backend's order, so the result does
 * not depend on scheduling and equals the CPU's bits (only additions).
 *
 * dwpe: position t's rows are n = t, t + T, t + 2T, ...: one thread per
 * (t, channel) walks them in order.
 *
 * dwte: a token can be anywhere in the batch, so the rows are grouped by
 * token first: key(n) = (vocabulary row r, or V for a token outside
 * [v0, v0 + V)) << pos_bits | n, sorted with CUB's radix sort over the bits
 * in use. The keys are unique and the row index is in the low bits, so the
 * sorted order is (token, n) whatever the sort's stability. Then one block
 * per (sorted position, 128 channels) where a token's run starts adds that
 * run's dout rows in order into dwte[r]; the other blocks return at once.
 * The keys and CUB's temporary storage live in a scratch buffer that only
 * grows, so the step loop allocates nothing after the first step. */

static int bit_length(unsigned long long x) {
    int b = 0;
    while (x) { b++; x >>= 1; }
    return b;
}

__global__ void embed_keys_k(unsigned long long *keys, const int *tokens, int N, int v0, int V, int pos_bits) {
    GRID_STRIDE(i, (size_t)N) {
        long long t = (long long)tokens[i] - v0;
        unsigned long long r = (t >= 0 && t < V) ? (unsigned long long)t : (unsigned long long)V;
        keys[i] = (r << pos_bits) | i;
    }
}

#define EMB_THREADS 128

/* grid (N, ceil(C / EMB_THREADS)); keys sorted */
__global__ void embed_bwd_wte_k(float *dwte, const float *dout, const unsigned long long *keys, int N, int C, int V,
                                int pos_bits) {
    int i = blockIdx.x;
    unsigned long long r = keys[i] >> pos_bits;
    if (r >= (unsigned long long)V) return;                     /* not this rank's vocabulary */
    if (i > 0 && (keys[i - 1] >> pos_bits) == r) return;        /* not the start of r's run */
    int c = blockIdx.y * EMB_THREADS + threadIdx.x;
    if (c >= C) return;
    int lo = i + 1, hi = N; /* the run ends at the first later key of another row */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if ((keys[mid] >> pos_bits) == r) lo = mid + 1;
        else hi = mid;
    }
    const unsigned long long mask = (1ull << pos_bits) - 1;
    float *g = dwte + (size_t)r * C + c;
    float acc = *g;
    int j = i;
    for (; j + 8 <= lo; j += 8) { /* the loads first, then the additions in order */
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = dout[(size_t)(keys[j + u] & mask) * C + c];
#pragma unroll
        for (int u = 0; u < 8; u++) acc += v[u];
    }
    for (; j < lo; j++) acc += dout[(size_t)(keys[j] & mask) * C + c];
    *g = acc;
}

__global__ void embed_bwd_wpe_k(float *dwpe, const float *dout, int N, int T, int C) {
    size_t total = (size_t)(N < T ? N : T) * C;
    GRID_STRIDE(i, total) {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (size_t n = t; n < (size_t)N; n += (size_t)T) acc += dout[n * C + c];
        dwpe[i] = acc;
    }
}

static Scratch sc_embed;

static void embed_forward_vp(float *out, const int *tokens, const float *wte, const float *wpe, int N, int T, int C,
                             int v0, int V) {
    if (N <= 0 || C <= 0) return;
    embed_fwd_k<<<grid_for((size_t)N * C, 256), 256>>>(out, tokens, wte, wpe, N, T, C, v0, V);
    LAUNCH_CHECK();
}

static void embed_backward_vp(float *dwte, float *dwpe, const float *dout, const int *tokens, int N, int T, int C,
                              int v0, int V) {
    if (N <= 0 || C <= 0) return;
    if (dwpe && T > 0) {
        embed_bwd_wpe_k<<<grid_for((size_t)(N < T ? N : T) * C, 256), 256>>>(dwpe, dout, N, T, C);
        LAUNCH_CHECK();
    }
    if (!dwte || V <= 0) return;
    int pos_bits = bit_length((unsigned long long)N - 1), end_bit = pos_bits + bit_length((unsigned long long)V);
    cub::DoubleBuffer<unsigned long long> keys(NULL, NULL);
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(NULL, temp_bytes, keys, N, 0, end_bit, 0));
    size_t key_bytes = ((size_t)N * sizeof(unsigned long long) + 255) / 256 * 256;
    char *sc = (char *)scratch_get(&sc_embed, 2 * key_bytes + temp_bytes);
    keys = cub::DoubleBuffer<unsigned long long>((unsigned long long *)sc, (unsigned long long *)(sc + key_bytes));
    embed_keys_k<<<grid_for((size_t)N, 256), 256>>>(keys.Current(), tokens, N, v0, V, pos_bits);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(sc + 2 * key_bytes, temp_bytes, keys, N, 0, end_bit, 0));
    LAUNCH_CHECK();
    dim3 grid((unsigned)N, (unsigned)((C + EMB_THREADS - 1) / EMB_THREADS));
    embed_bwd_wte_k<<<grid, EMB_THREADS>>>(dwte, dout, keys.Current(), N, C, V, pos_bits);
    LAUNCH_CHECK();
}

static void embed_forward(float *out, const int *tokens, const float *wte, const float *wpe, int N, int T, int C) {
    embed_forward_vp(out, tokens, wte, wpe, N, T, C, 0, 0x7fffffff);
}

static void embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int N, int T, int C) {
    embed_backward_vp(dwte, dwpe, dout, tokens, N, T, C, 0, 0x7fffffff);
}

// ----------------------------------------------------------------------------
// column sums (bias and norm-weight gradients): deterministic two-pass
// reduction, per row-chunk partials then a fixed-order sum per column

enum { COL_PLAIN = 0, COL_LN = 1, COL_RMS = 2 };
#define COL_TX 32
#define COL_TY 8

/* grid (ceil(C/32), RB); partial0/1 are [RB, C] */
template <int MODE>
__global__ void colsum_partial_k(float *partial0, float *partial1, const float *d, const float *x, const float *mean,
                                 const float *rstd, int N, int C, int rows_per) {
    __shared__ float s0[COL_TY][COL_TX + 1], s1[COL_TY][COL_TX + 1];
    int c = blockIdx.x * COL_TX + threadIdx.x;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += COL_TY) {
            size_t i = (size_t)r * C + c;
            float dv = d[i];
            if (MODE == COL_PLAIN) {
                a0 += dv;
            } else if (MODE == COL_LN) {
                a0 += dv * ((x[i] - mean[r]) * rstd[r]);
                a1 += dv;
            } else {
                a0 += dv * (x[i] * rstd[r]);
            }
        }
    }
    s0[threadIdx.y][threadIdx.x] = a0;
    s1[threadIdx.y][threadIdx.x] = a1;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int y = 0; y < COL_TY; y++) { t0 += s0[y][threadIdx.x]; t1 += s1[y][threadIdx.x]; }
        partial0[(size_t)blockIdx.y * C + c] = t0;
        if (MODE == COL_LN) partial1[(size_t)blockIdx.y * C + c] = t1;
    }
}

__global__ void colsum_finish_k(float *dst0, float *dst1, const float *partial0, const float *partial1, int RB, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t0 = 0.0f, t1 = 0.0f;
    for (int y = 0; y < RB; y++) {
        t0 += partial0[(size_t)y * C + c];
        if (partial1) t1 += partial1[(size_t)y * C + c];
    }
    if (dst0) dst0[c] += t0;
    if (dst1) dst1[c] += t1;
}

/* dst0 += column sums of the MODE expression; dst1 (LN only) += sum of d */
static void colsum_add(int mode, float *dst0, float *dst1, const float *d, const float *x, const float *mean,
                       const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int rows_per = 256;
    int RB = (N + rows_per - 1) / rows_per;
    if (RB > 128) { RB = 128; rows_per = (N + RB - 1) / RB; }
    int two = mode == COL_LN;
    float *part = (float *)scratch_get(&sc_col, (size_t)(two ? 2 : 1) * RB * C * sizeof(float));
    float *p0 = part, *p1 = two ? part + (size_t)RB * C : NULL;
    dim3 grid((C + COL_TX - 1) / COL_TX, RB), block(COL_TX, COL_TY);
    if (mode == COL_PLAIN) colsum_partial_k<COL_PLAIN><<<grid, block>>>(p0, p1, d, x, mean, rstd, N, C, rows_per);
    else if (mode == COL_LN) colsum_partial_k<COL_LN><<<grid, block>>>(p0, p1, d, x, mean, rstd, N, C, rows_per);
    else colsum_partial_k<COL_RMS><<<grid, block>>>(p0, p1, d, x, mean, rstd, N, C, rows_per);
    LAUNCH_CHECK();
    colsum_finish_k<<<(C + 255) / 256, 256>>>(dst0, dst1, p0, p1, RB, C);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// norms: one warp per row, statistics in fp32

#define NORM_THREADS 256
#define ROWS_PER_BLOCK (NORM_THREADS / 32)

/* one row by one warp: x -> o, mean and rstd saved by lane 0 */
__device__ void layernorm_row_warp(float *o, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                   int row, int lane, int C, float eps) {
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = x[c] - m; v += d * d; }
    float rs = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane; c < C; c += 32) {
        float y = (x[c] - m) * rs * w[c];
        o[c] = b ? y + b[c] : y;
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

__device__ void rmsnorm_row_warp(float *o, float *rstd, const float *x, const float *w, int row, int lane, int C,
                                 float eps) {
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    float rs = rsqrtf(warp_sum(ss) / C + eps);
    for (int c = lane; c < C; c += 32) o[c] = x[c] * rs * w[c];
    if (lane == 0 && rstd) rstd[row] = rs;
}

/* res = a + b for one row; each lane later reads back only the elements it
 * wrote itself, so no synchronisation is needed */
__device__ const float *residual_row_warp(float *res, const float *a, const float *b, int row, int lane, int C) {
    float *r = res + (size_t)row * C;
    const float *x = a + (size_t)row * C, *y = b + (size_t)row * C;
    for (int c = lane; c < C; c += 32) r[c] = x[c] + y[c];
    return r;
}

__global__ void layernorm_fwd_k(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    layernorm_row_warp(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, w, b, row, lane, C, eps);
}

__global__ void add_layernorm_fwd_k(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                    const float *w, const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = residual_row_warp(res, a, b, row, lane, C);
    layernorm_row_warp(out + (size_t)row * C, mean, rstd, x, w, bias, row, lane, C, eps);
}

__global__ void layernorm_bwd_k(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                                const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    float *g = dinp + (size_t)row * C;
    float m = mean[row], rs = rstd[row];
    float sd = 0.0f, sdx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = d[c] * w[c];
        sd += dn;
        sdx += dn * ((x[c] - m) * rs);
    }
    float md = warp_sum(sd) / C, mdx = warp_sum(sdx) / C;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[c] - m) * rs;
        g[c] += rs * (d[c] * w[c] - md - xh * mdx);
    }
}

__global__ void rmsnorm_fwd_k(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    rmsnorm_row_warp(out + (size_t)row * C, rstd, inp + (size_t)row * C, w, row, lane, C, eps);
}

__global__ void add_rmsnorm_fwd_k(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                  int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = residual_row_warp(res, a, b, row, lane, C);
    rmsnorm_row_warp(out + (size_t)row * C, rstd, x, w, row, lane, C, eps);
}

__global__ void rmsnorm_bwd_k(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                              int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    float *g = dinp + (size_t)row * C;
    float rs = rstd[row];
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += d[c] * w[c] * (x[c] * rs);
    float mdx = warp_sum(s) / C;
    for (int c = lane; c < C; c += 32) g[c] += rs * (d[c] * w[c] - x[c] * rs * mdx);
}

static unsigned norm_grid(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                              int N, int C, float eps) {
    if (N <= 0) return;
    layernorm_fwd_k<<<norm_grid(N), NORM_THREADS>>>(out, mean, rstd, inp, w, b, N, C, eps);
    LAUNCH_CHECK();
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C) {
    if (N <= 0) return;
    if (dinp) {
        layernorm_bwd_k<<<norm_grid(N), NORM_THREADS>>>(dinp, dout, inp, w, mean, rstd, N, C);
        LAUNCH_CHECK();
    }
    if (dw || db) colsum_add(COL_LN, dw, db, dout, inp, mean, rstd, N, C);
}

static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    if (N <= 0) return;
    rmsnorm_fwd_k<<<norm_grid(N), NORM_THREADS>>>(out, rstd, inp, w, N, C, eps);
    LAUNCH_CHECK();
}

static void add_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                  const float *w, const float *bias, int N, int C, float eps) {
    if (N <= 0) return;
    add_layernorm_fwd_k<<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps);
    LAUNCH_CHECK();
}

static void add_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                int N, int C, float eps) {
    if (N <= 0) return;
    add_rmsnorm_fwd_k<<<norm_grid(N), NORM_THREADS>>>(res, out, rstd, a, b, w, N, C, eps);
    LAUNCH_CHECK();
}

static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int C) {
    if (N <= 0) return;
    if (dinp) {
        rmsnorm_bwd_k<<<norm_grid(N), NORM_THREADS>>>(dinp, dout, inp, w, rstd, N, C);
        LAUNCH_CHECK();
    }
    if (dw) colsum_add(COL_RMS, dw, NULL, dout, inp, NULL, rstd, N, C);
}

// ----------------------------------------------------------------------------
// matrix products through cuBLASLt (TF32 tensor cores, fp32 accumulate)

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_PLANS 256

/* A cached plan: descriptors and the heuristic's algorithm for one shape,
 * layout, alignment and epilogue. Created on first use of the shape. */
typedef struct {
    int used;
    /* key */
    int ta, tb, M, N, K, lda, ldb, ldc, batch, bias, al_a, al_b, al_c, bf16;
    int gelu, al_aux; /* gelu: the GELU epilogue is wanted and allowed (see rm_gemm_ex) */
    long long sA, sB, sC;
    /* value */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int epi_bias; /* the bias is fused; else added by a kernel */
    int epi_gelu; /* GELU_AUX(_BIAS): D = gelu(...), aux = its input; else a kernel applies it */
} GemmPlan;

static GemmPlan plans[MAX_PLANS];
static int plan_next;

/* largest power of two (<= 256 bytes) dividing every address the GEMM touches */
static int alignment_of(const void *p, long long ld, long long stride, int esize) {
    uintptr_t a = (uintptr_t)p | (uintptr_t)(ld * esize) | (uintptr_t)(stride * esize) | 256u;
    int al = 1;
    while (!(a & (uintptr_t)al)) al <<= 1;
    return al;
}

static void layout_create(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                          int batch, long long stride) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
    if (batch > 1) {
        int32_t bc = batch;
        int64_t st = stride;
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st));
    }
}

static void plan_destroy(GemmPlan *p) {
    if (!p->used) return;
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
    p->used = 0;
}

/* Build desc + layouts for the column-major product D[m=N, n=M] (see
 * rm_gemm) and ask the heuristic; returns 0 when it has no algorithm.
 * epi_gelu: the GELU_AUX epilogue writing the GELU's input to aux (ld = ldc;
 * the heuristic reads aux's alignment from the pointer). */
static int plan_build(GemmPlan *p, int epi_bias, int epi_gelu, const void *aux, cublasComputeType_t compute) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    int32_t opA = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opB = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    if (epi_bias || epi_gelu) {
        uint32_t epi = !epi_gelu ? CUBLASLT_EPILOGUE_BIAS
                       : epi_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    }
    if (epi_gelu) {
        int64_t ld = p->ldc;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    }
    /* cuBLAS A := row-major B, cuBLAS B := row-major A, D := C^T */
    cudaDataType_t in = p->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    layout_create(&p->la, in, p->tb ? p->K : p->N, p->tb ? p->N : p->K, p->ldb, p->batch, p->sB);
    layout_create(&p->lb, in, p->ta ? p->M : p->K, p->ta ? p->K : p->M, p->lda, p->batch, p->sA);
    layout_create(&p->lc, CUDA_R_32F, p->N, p->M, p->ldc, p->batch, p->sC);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = G.ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al_a = (uint32_t)p->al_b, al_b = (uint32_t)p->al_a, al_c = (uint32_t)p->al_c;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(G.lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->used = 1;
    if (st != CUBLAS_STATUS_SUCCESS || nres < 1) {
        plan_destroy(p);
        return 0;
    }
    p->algo = res.algo;
    p->epi_bias = epi_bias;
    p->epi_gelu = epi_gelu;
    return 1;
}

__global__ void add_bias_k(float *out, const float *bias, int M, int N, int ldc) {
    size_t total = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / N), c = (int)(i % N);
        out[(size_t)r * ldc + c] += bias[c];
    }
}

/* LLMTRAIN_CUDA_MATMUL picks the GEMM arithmetic (default tf32, see the top
 * of this file); the others are opt-in:
 *   bf16  the linear layers' GEMMs convert both fp32 operands to bf16 into
 *         scratch buffers first and run bf16 x bf16 -> fp32 with fp32
 *         accumulation (attention stays TF32): for measurements;
 *   fp32  every GEMM in plain fp32 without tensor cores: for telling TF32
 *         rounding from a bug when comparing with the CPU. */
enum { MM_TF32 = 0, MM_BF16 = 1, MM_FP32 = 2 };

static int matmul_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("LLMTRAIN_CUDA_MATMUL");
        mode = !e || !*e || strcmp(e, "tf32") == 0 ? MM_TF32 : strcmp(e, "bf16") == 0 ? MM_BF16
               : strcmp(e, "fp32") == 0 ? MM_FP32 : -2;
        if (mode == -2) die(EXIT_USAGE, "LLMTRAIN_CUDA_MATMUL=%s: expected tf32, bf16 or fp32", e);
    }
    return mode;
}

static int matmul_bf16(void) { return matmul_mode() == MM_BF16; }

__global__ void to_bf16_k(__nv_bfloat16 *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

static Scratch sc_bf16_a, sc_bf16_b;

static const void *bf16_copy(Scratch *s, const float *x, size_t n) {
    __nv_bfloat16 *d = (__nv_bfloat16 *)scratch_get(s, n * sizeof(__nv_bfloat16));
    to_bf16_k<<<grid_for(n, 256), 256>>>(d, x, n);
    LAUNCH_CHECK();
    return d;
}

static void gelu_forward(float *out, const float *inp, size_t n);
static long fused_gelu_calls;

extern "C" long kernels_cuda_fused_gelu_calls(void) { return fused_gelu_calls; }

/* Row-major, like cblas: C[M,N] = alpha op(A) op(B) + beta C (+ bias[N] per
 * row), batched with element strides sA, sB, sC. In column-major terms this
 * is C^T = op(B)^T op(A)^T, so cuBLAS sees m = N, n = M. bf16: convert A
 * and B (unbatched, each a dense rows x ld block) to bf16 first.
 * gelu_pre != NULL (unbatched, beta 0, ldc = N): gelu_pre receives that
 * result and C its GELU: one GEMM with the GELU_AUX(_BIAS) epilogue when
 * cuBLASLt allows it (aux ld a multiple of 8, C and aux 16-byte aligned, a
 * fused or no bias, and an algorithm for it), else the GEMM into gelu_pre
 * and the GELU kernel. */
static void rm_gemm_ex(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long long sA,
                       const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch,
                       const float *bias, int bf16, float *gelu_pre) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) die(EXIT_INTERNAL, "cuda gemm: K = %d", K);
    if (bf16 && batch != 1) die(EXIT_INTERNAL, "cuda gemm: bf16 operands for a batched GEMM");
    if (gelu_pre && (batch != 1 || beta != 0.0f || ldc != N))
        die(EXIT_INTERNAL, "cuda gemm: the GELU form wants an unbatched dense product with beta 0");
    const void *Ap = A, *Bp = B;
    if (bf16) {
        Ap = bf16_copy(&sc_bf16_a, A, (size_t)(ta ? K : M) * (size_t)lda);
        Bp = bf16_copy(&sc_bf16_b, B, (size_t)(tb ? N : K) * (size_t)ldb);
    }
    GemmPlan key;
    memset(&key, 0, sizeof key);
    key.bf16 = bf16;
    key.ta = ta; key.tb = tb; key.M = M; key.N = N; key.K = K;
    /* bias: 0 none, 1 added by a kernel, 2 fused epilogue (16-byte aligned
     * vectors only: cuBLASLt has no alignment preference for the bias) */
    key.bias = !bias ? 0 : ((uintptr_t)bias % 16 == 0 && batch == 1) ? 2 : 1;
    key.lda = lda; key.ldb = ldb; key.ldc = ldc; key.batch = batch;
    key.sA = batch > 1 ? sA : 0; key.sB = batch > 1 ? sB : 0; key.sC = batch > 1 ? sC : 0;
    int es = bf16 ? 2 : 4;
    key.al_a = alignment_of(Ap, lda, key.sA, es);
    key.al_b = alignment_of(Bp, ldb, key.sB, es);
    key.al_c = alignment_of(C, ldc, key.sC, 4);
    if (gelu_pre) { /* D is C or, unfused, gelu_pre: the alignment both have */
        key.al_aux = alignment_of(gelu_pre, ldc, 0, 4);
        if (key.al_aux < key.al_c) key.al_c = key.al_aux;
        key.gelu = ldc % 8 == 0 && key.al_c >= 16 && key.bias != 1;
    }
    GemmPlan *p = NULL;
    for (int i = 0; i < MAX_PLANS && plans[i].used; i++) {
        GemmPlan *q = &plans[i];
        if (q->ta == key.ta && q->tb == key.tb && q->M == M && q->N == N && q->K == K && q->lda == lda &&
            q->ldb == ldb && q->ldc == ldc && q->batch == batch && q->bias == key.bias && q->sA == key.sA &&
            q->sB == key.sB && q->sC == key.sC && q->al_a == key.al_a && q->al_b == key.al_b && q->al_c == key.al_c &&
            q->bf16 == key.bf16 && q->gelu == key.gelu && q->al_aux == key.al_aux) {
            p = q;
            break;
        }
    }
    if (!p) {
        p = &plans[plan_next];
        plan_next = (plan_next + 1) % MAX_PLANS;
        plan_destroy(p);
        *p = key;
        /* TF32 with the fused GELU (and bias), with the fused bias, without,
         * then the same in plain fp32 (a shape or alignment no tensor-core
         * kernel takes); bf16 inputs: fp32 compute */
        const cublasComputeType_t ct[2] = {
            bf16 || matmul_mode() == MM_FP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F};
        int ok = 0;
        for (int c = 0; c < 2 && !ok; c++)
            ok = (key.gelu && plan_build(p, key.bias == 2, 1, gelu_pre, ct[c])) ||
                 (key.bias == 2 && plan_build(p, 1, 0, NULL, ct[c])) || plan_build(p, 0, 0, NULL, ct[c]);
        if (!ok)
            die(EXIT_INTERNAL, "cuBLASLt has no algorithm for a %dx%dx%d %s GEMM (ta %d tb %d, batch %d, alignment %d/%d/%d)",
                M, N, K, bf16 ? "bf16" : "fp32", ta, tb, batch, key.al_a, key.al_b, key.al_c);
    }
    if (p->epi_bias) {
        const void *bp = bias;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    }
    if (p->epi_gelu) {
        const void *ap = gelu_pre;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof ap));
        fused_gelu_calls++;
    }
    float *D = gelu_pre && !p->epi_gelu ? gelu_pre : C; /* unfused GELU: the product goes to gelu_pre */
    CUBLAS_CHECK(cublasLtMatmul(G.lt, p->desc, &alpha, Bp, p->la, Ap, p->lb, &beta, D, p->lc, D, p->lc, &p->algo, G.ws,
                                G.ws_bytes, 0));
    launch_check_("cublasLtMatmul", __FILE__, __LINE__);
    if (bias && !p->epi_bias) {
        if (batch > 1) die(EXIT_INTERNAL, "cuda gemm: unfused bias with a batched GEMM");
        add_bias_k<<<grid_for((size_t)M * N, 256), 256>>>(D, bias, M, N, ldc);
        LAUNCH_CHECK();
    }
    if (gelu_pre && !p->epi_gelu) gelu_forward(C, gelu_pre, (size_t)M * N);
}

static void rm_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long long sA,
                    const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch,
                    const float *bias) {
    rm_gemm_ex(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, bias, 0, NULL);
}

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    rm_gemm_ex(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, matmul_bf16(), NULL);
}

/* pre = inp @ w^T + bias, out = gelu(pre): one GEMM with cuBLASLt's GELU
 * epilogue where it applies (see rm_gemm_ex), else matmul + the GELU kernel */
static void matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w, const float *bias, int N,
                                int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    rm_gemm_ex(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, matmul_bf16(), pre);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                            int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    int bf16 = matmul_bf16();
    if (dinp) rm_gemm_ex(0, 0, N, C, OC, 1.0f, dout, OC, 0, w, C, 0, 1.0f, dinp, C, 0, 1, NULL, bf16, NULL);
    if (dw) rm_gemm_ex(1, 0, OC, C, N, 1.0f, dout, OC, 0, inp, C, 0, 1.0f, dw, C, 0, 1, NULL, bf16, NULL);
    if (dbias) colsum_add(COL_PLAIN, dbias, NULL, dout, NULL, NULL, NULL, N, OC);
}

// ----------------------------------------------------------------------------
// attention: batched GEMMs + causal softmax kernels, probabilities in scratch

/* The (b, h) pairs are covered by nh "passes", one per query head h, each a
 * strided-batched GEMM over the B sequences: GQA (h reads kv head h/group)
 * rules out one stride over all heads, and batching over b keeps every
 * batch entry's output in its own non-overlapping block. A pass's scores /
 * probabilities are a [B, T, T] scratch block (never saved: the forward
 * keeps each row's log-sum-exp, the backward recomputes P = exp(s - lse)),
 * so attention memory is O(T) per head. Offsets and strides are in floats. */
typedef struct {
    size_t q, k, v, o; /* base offsets of q/k/v (in qkv) and of out */
    long long sqkv, so, sp;
    int count;
} AttPass;

static AttPass att_pass(int h, int B, int T, int nh, int nkv, int hd) {
    int group = nh / nkv, kh = h / group, S = (nh + 2 * nkv) * hd, OS = nh * hd;
    AttPass a;
    a.q = (size_t)h * hd;
    a.k = (size_t)(nh + kh) * hd;
    a.v = (size_t)(nh + nkv + kh) * hd;
    a.o = (size_t)h * hd;
    a.sqkv = (long long)T * S;
    a.so = (long long)T * OS;
    a.sp = (long long)T * T;
    a.count = B;
    return a;
}

/* one block per row of a pass's scores ([B*T] rows of T): softmax over
 * [0, t], zero beyond; the scores arrive scaled. lse[(e*nh + h)*T + t] gets
 * the row's log-sum-exp. */
__global__ void causal_softmax_lse_k(float *p, float *lse, int T, int nh, int h) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T);
    float *x = p + row * T;
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) s += expf(x[j] - m);
    s = block_sum(s);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < T; j += blockDim.x) x[j] = j <= t ? expf(x[j] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[(e * nh + h) * T + t] = m + logf(s);
}

/* the backward's probabilities again: scaled scores -> exp(s - lse) on
 * [0, t], zero beyond */
__global__ void causal_exp_lse_k(float *p, const float *lse, int T, int nh, int h) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T);
    float *x = p + row * T;
    float l = lse[(e * nh + h) * T + t];
    for (int j = threadIdx.x; j < T; j += blockDim.x) x[j] = j <= t ? expf(x[j] - l) : 0.0f;
}

/* dP -> dS in place for one pass: dS = P * (dP - D) * scale with D the row's
 * dO . O (= sum P * dP); row r belongs to batch entry e = r / T, whose out
 * and dout rows start at e*so + t*OS + o */
__global__ void causal_softmax_bwd_k(float *ds, const float *p, const float *out, const float *dout, long long so,
                                     int OS, size_t o, int hd, int T, float scale) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T);
    float *d = ds + row * T;
    const float *pr = p + row * T;
    size_t orow = e * (size_t)so + (size_t)t * OS + o;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dot += out[orow + i] * dout[orow + i];
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < T; j += blockDim.x) d[j] = j <= t ? pr[j] * (d[j] - dot) * scale : 0.0f;
}

static int row_threads(int T) {
    int th = 32;
    while (th < T && th < 256) th <<= 1;
    return th;
}

static void check_heads(int nh, int nkv) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0)
        die(EXIT_INTERNAL, "attention: n_head %d is not a multiple of n_kv_head %d", nh, nkv);
}

static void attention_forward(float *out, float *lse, const float *qkv, int B, int T, int nh, int nkv, int hd) {
    check_heads(nh, nkv);
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *P = (float *)scratch_get(&sc_attp, (size_t)B * T * T * sizeof(float));
    for (int h = 0; h < nh; h++) {
        AttPass a = att_pass(h, B, T, nh, nkv, hd);
        /* P = softmax(scale * Q K^T) over the full square, then P V */
        rm_gemm(0, 1, T, T, hd, scale, qkv + a.q, S, a.sqkv, qkv + a.k, S, a.sqkv, 0.0f, P, T, a.sp, a.count, NULL);
        causal_softmax_lse_k<<<(unsigned)((size_t)B * T), row_threads(T)>>>(P, lse, T, nh, h);
        LAUNCH_CHECK();
        rm_gemm(0, 0, T, hd, T, 1.0f, P, T, a.sp, qkv + a.v, S, a.sqkv, 0.0f, out + a.o, OS, a.so, a.count, NULL);
    }
}

static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               int B, int T, int nh, int nkv, int hd) {
    if (!dqkv) return;
    check_heads(nh, nkv);
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *P = (float *)scratch_get(&sc_attp, (size_t)B * T * T * sizeof(float));
    float *dS = (float *)scratch_get(&sc_att, (size_t)B * T * T * sizeof(float));
    /* passes run one after another on the stream, so the query heads of one
     * kv head add into its dK and dV in turn, and the scratch is reused */
    for (int h = 0; h < nh; h++) {
        AttPass a = att_pass(h, B, T, nh, nkv, hd);
        const float *dO = dout + a.o;
        rm_gemm(0, 1, T, T, hd, scale, qkv + a.q, S, a.sqkv, qkv + a.k, S, a.sqkv, 0.0f, P, T, a.sp, a.count, NULL);
        causal_exp_lse_k<<<(unsigned)((size_t)B * T), row_threads(T)>>>(P, lse, T, nh, h);
        LAUNCH_CHECK();
        /* dP = dO V^T; dV += P^T dO */
        rm_gemm(0, 1, T, T, hd, 1.0f, dO, OS, a.so, qkv + a.v, S, a.sqkv, 0.0f, dS, T, a.sp, a.count, NULL);
        rm_gemm(1, 0, T, hd, T, 1.0f, P, T, a.sp, dO, OS, a.so, 1.0f, dqkv + a.v, S, a.sqkv, a.count, NULL);
        causal_softmax_bwd_k<<<(unsigned)((size_t)a.count * T), row_threads(T)>>>(dS, P, out, dout, a.so, OS, a.o, hd,
                                                                                 T, scale);
        LAUNCH_CHECK();
        /* dQ += dS K; dK += dS^T Q */
        rm_gemm(0, 0, T, hd, T, 1.0f, dS, T, a.sp, qkv + a.k, S, a.sqkv, 1.0f, dqkv + a.q, S, a.sqkv, a.count, NULL);
        rm_gemm(1, 0, T, hd, T, 1.0f, dS, T, a.sp, qkv + a.q, S, a.sqkv, 1.0f, dqkv + a.k, S, a.sqkv, a.count, NULL);
    }
}

// ----------------------------------------------------------------------------
// RoPE (rotate-half), one thread per (row, frequency), every q and k head

__global__ void rope_k(float *x, int N, int T, int nh, int nkv, int hd, float theta, int pos0, float dir) {
    int half = hd / 2, S = (nh + 2 * nkv) * hd, nrot = nh + nkv;
    size_t total = (size_t)N * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(idx / half), i = (int)(idx % half);
        /* angles in double: pos * inv_freq reaches thousands of radians */
        double inv_freq = pow((double)theta, -2.0 * i / hd);
        double ang = ((double)pos0 + (n % T)) * inv_freq;
        double sd, cd;
        sincos(ang, &sd, &cd);
        float cs = (float)cd, sn = dir * (float)sd;
        float *row = x + (size_t)n * S;
        for (int hh = 0; hh < nrot; hh++) {
            float *v = row + (size_t)hh * hd;
            float a = v[i], c = v[i + half];
            v[i] = a * cs - c * sn;
            v[i + half] = c * cs + a * sn;
        }
    }
}

static void rope_apply(float *x, int B, int T, int nh, int nkv, int hd, float theta, int pos0, float dir) {
    if (hd % 2 != 0) die(EXIT_INTERNAL, "rope: head_dim %d must be even", hd);
    size_t total = (size_t)B * T * (hd / 2);
    if (!total) return;
    rope_k<<<grid_for(total, 256), 256>>>(x, B * T, T, nh, nkv, hd, theta, pos0, dir);
    LAUNCH_CHECK();
}

static void rope_forward(float *qkv, int B, int T, int nh, int nkv, int hd, float theta, int pos0) {
    rope_apply(qkv, B, T, nh, nkv, hd, theta, pos0, 1.0f);
}

static void rope_backward(float *dqkv, int B, int T, int nh, int nkv, int hd, float theta, int pos0) {
    rope_apply(dqkv, B, T, nh, nkv, hd, theta, pos0, -1.0f);
}

// ----------------------------------------------------------------------------
// pointwise

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

__global__ void gelu_fwd_k(float *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + expf(-2.0f * u));
    }
}

__global__ void gelu_bwd_k(float *dinp, const float *inp, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float e = expf(-2.0f * u);
        float sg = 1.0f / (1.0f + e);
        float omsg = e * sg;
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += dout[i] * (sg + 2.0f * x * sg * omsg * du);
    }
}

__global__ void swiglu_fwd_k(float *out, const float *inp, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

__global__ void swiglu_bwd_k(float *dinp, const float *inp, const float *dout, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j], d = dout[i];
        float e = expf(-g);
        float sg = 1.0f / (1.0f + e);
        dinp[r * 2 * F + j] += d * u * sg * (1.0f + g * e * sg);
        dinp[r * 2 * F + F + j] += d * g * sg;
    }
}

__global__ void add_k(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_k(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}

static void gelu_forward(float *out, const float *inp, size_t n) {
    if (!n) return;
    gelu_fwd_k<<<grid_for(n, 256), 256>>>(out, inp, n);
    LAUNCH_CHECK();
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (!n || !dinp) return;
    gelu_bwd_k<<<grid_for(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK();
}

static void swiglu_forward(float *out, const float *inp, int N, int F) {
    if (N <= 0 || F <= 0) return;
    swiglu_fwd_k<<<grid_for((size_t)N * F, 256), 256>>>(out, inp, N, F);
    LAUNCH_CHECK();
}

static void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
    if (!dinp || N <= 0 || F <= 0) return;
    swiglu_bwd_k<<<grid_for((size_t)N * F, 256), 256>>>(dinp, inp, dout, N, F);
    LAUNCH_CHECK();
}

static void add(float *out, const float *a, const float *b, size_t n) {
    if (!n) return;
    add_k<<<grid_for(n, 256), 256>>>(out, a, b, n);
    LAUNCH_CHECK();
}

static void scale(float *x, float s, size_t n) {
    if (!n) return;
    scale_k<<<grid_for(n, 256), 256>>>(x, s, n);
    LAUNCH_CHECK();
}

/* bf16 precision in fp32 words: the same bits as the CPU backend (kernels.h) */
__global__ void round_bf16_k(float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    GRID_STRIDE(i, n) dst[i] = __uint_as_float(round_bf16_word(__float_as_uint(src[i]), seed, index0 + i));
}

static void round_bf16(float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    if (!n) return;
    round_bf16_k<<<grid_for(n, 256), 256>>>(dst, src, n, seed, index0);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// loss: one block per row of logits

#define CE_THREADS 512

/* full-vocabulary softmax + loss; an out-of-range target gives a NaN loss */
__global__ void ce_fwd_k(float *losses, float *logits, const int *targets, int V) {
    float *x = logits + (size_t)blockIdx.x * V;
    int tg = targets[blockIdx.x];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - m);
    s = block_sum(s);
    /* read the target's logit before the row is overwritten */
    float xt = (tg >= 0 && tg < V) ? x[tg] : NAN;
    __syncthreads();
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = expf(x[j] - m) * inv;
    if (threadIdx.x == 0) losses[blockIdx.x] = (float)(log((double)s) - ((double)xt - m));
}

/* probs -> (probs - onehot(target - v0)) * dloss */
__global__ void ce_bwd_k(float *probs, const int *targets, float dloss, int N, int V, int v0) {
    size_t n = (size_t)N * V;
    GRID_STRIDE(i, n) {
        int r = (int)(i / V), j = (int)(i % V);
        float p = probs[i];
        if (targets[r] - v0 == j) p -= 1.0f;
        probs[i] = p * dloss;
    }
}

__global__ void ce_vp_max_k(float *rowmax, const float *logits, int V) {
    const float *x = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

__global__ void ce_vp_expsum_k(float *sums, float *tgt, float *logits, const float *rowmax, const int *targets, int V,
                               int v0) {
    float *x = logits + (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x] - v0;
    float xt = (t >= 0 && t < V) ? x[t] : 0.0f;
    __syncthreads();
    float m = rowmax[blockIdx.x], s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float e = expf(x[j] - m);
        x[j] = e;
        s += e;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        sums[blockIdx.x] = s;
        tgt[blockIdx.x] = xt;
    }
}

__global__ void ce_vp_finish_k(float *losses, float *logits, const float *rowmax, const float *sums, const float *tgt,
                               int V) {
    float *x = logits + (size_t)blockIdx.x * V;
    float inv = (float)(1.0 / (double)sums[blockIdx.x]);
    for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] *= inv;
    if (threadIdx.x == 0)
        losses[blockIdx.x] =
            (float)(log((double)sums[blockIdx.x]) - ((double)tgt[blockIdx.x] - rowmax[blockIdx.x]));
}

static void crossentropy_forward(float *losses, float *logits, const int *targets, int N, int V) {
    if (N <= 0) return;
    ce_fwd_k<<<N, CE_THREADS>>>(losses, logits, targets, V);
    LAUNCH_CHECK();
}

static void crossentropy_backward(float *probs, const int *targets, float dloss, int N, int V) {
    if (N <= 0) return;
    ce_bwd_k<<<grid_for((size_t)N * V, 256), 256>>>(probs, targets, dloss, N, V, 0);
    LAUNCH_CHECK();
}

static void crossentropy_vp_max(float *rowmax, const float *logits, int N, int V) {
    if (N <= 0) return;
    ce_vp_max_k<<<N, CE_THREADS>>>(rowmax, logits, V);
    LAUNCH_CHECK();
}

static void crossentropy_vp_expsum(float *sums, float *tgt, float *logits, const float *rowmax, const int *targets,
                                   int N, int V, int v0) {
    if (N <= 0) return;
    ce_vp_expsum_k<<<N, CE_THREADS>>>(sums, tgt, logits, rowmax, targets, V, v0);
    LAUNCH_CHECK();
}

static void crossentropy_vp_finish(float *losses, float *logits, const float *rowmax, const float *sums,
                                   const float *tgt, int N, int V) {
    if (N <= 0) return;
    ce_vp_finish_k<<<N, CE_THREADS>>>(losses, logits, rowmax, sums, tgt, V);
    LAUNCH_CHECK();
}

static void crossentropy_vp_backward(float *probs, const int *targets, float dloss, int N, int V, int v0) {
    if (N <= 0) return;
    ce_bwd_k<<<grid_for((size_t)N * V, 256), 256>>>(probs, targets, dloss, N, V, v0);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// reductions: deterministic (fixed grid, per-block partials in double, a
// fixed-order final sum), returned to the host

template <int SQ> __global__ void reduce_partial_k(const float *x, size_t n, double *partial) {
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = x[i];
        s += SQ ? v * v : v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void reduce_final_k(const double *partial, int n, double *out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = s;
}

static double reduce(const float *x, size_t n, int sq) {
    if (!n) return 0.0;
    if (sq) reduce_partial_k<1><<<RED_BLOCKS, RED_THREADS>>>(x, n, G.red_partial);
    else reduce_partial_k<0><<<RED_BLOCKS, RED_THREADS>>>(x, n, G.red_partial);
    LAUNCH_CHECK();
    reduce_final_k<<<1, RED_THREADS>>>(G.red_partial, RED_BLOCKS, G.red_out);
    LAUNCH_CHECK();
    double h = 0.0;
    cu_to_host(&h, G.red_out, sizeof h);
    return h;
}

static double sumsq(const float *x, size_t n) { return reduce(x, n, 1); }
static double sum(const float *x, size_t n) { return reduce(x, n, 0); }

// ----------------------------------------------------------------------------
// AdamW: torch.optim.AdamW (single-tensor path), operation for operation,
// over one range or (adamw_multi) several ranges of the same flat arrays in
// one launch

typedef struct {
    size_t offset, n, start; /* start: elements of all earlier ranges */
    float wd;                /* the kernel forms 1 - lr * wd as adamw does */
} DevRange;

__device__ __forceinline__ void adamw_elem(float *p, const float *g, float *m, float *v, size_t i, float decay,
                                           float beta1, float beta2, float ob1, float ob2, float eps,
                                           float step_size, float bc2_sqrt, float grad_scale) {
    float gi = g[i] * grad_scale;
    float mi = beta1 * m[i] + ob1 * gi;
    float vi = beta2 * v[i] + ob2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
}

__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float decay, float beta1, float beta2,
                        float ob1, float ob2, float eps, float step_size, float bc2_sqrt, float grad_scale) {
    GRID_STRIDE(i, n) adamw_elem(p, g, m, v, i, decay, beta1, beta2, ob1, ob2, eps, step_size, bc2_sqrt, grad_scale);
}

__global__ void adamw_multi_k(float *p, const float *g, float *m, float *v, const DevRange *r, int nr, size_t total,
                              float lr, float beta1, float beta2, float ob1, float ob2, float eps, float step_size,
                              float bc2_sqrt, float grad_scale) {
    GRID_STRIDE(i, total) {
        int lo = 0, hi = nr - 1; /* last range with start <= i */
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (r[mid].start <= i) lo = mid;
            else hi = mid - 1;
        }
        size_t j = r[lo].offset + (i - r[lo].start);
        float decay = (float)(1.0 - (double)lr * r[lo].wd);
        adamw_elem(p, g, m, v, j, decay, beta1, beta2, ob1, ob2, eps, step_size, bc2_sqrt, grad_scale);
    }
}

typedef struct { float step_size, bc2_sqrt, ob1, ob2; } AdamConsts;

static AdamConsts adam_consts(float lr, float beta1, float beta2, int t) {
    double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    AdamConsts c;
    c.step_size = (float)((double)lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.ob1 = (float)(1.0 - (double)beta1);
    c.ob2 = (float)(1.0 - (double)beta2);
    return c;
}

static void adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, int t, float grad_scale) {
    if (!n) return;
    AdamConsts c = adam_consts(lr, beta1, beta2, t);
    float decay = (float)(1.0 - (double)lr * wd);
    adamw_k<<<grid_for(n, 256), 256>>>(p, g, m, v, n, decay, beta1, beta2, c.ob1, c.ob2, eps, c.step_size, c.bc2_sqrt,
                                       grad_scale);
    LAUNCH_CHECK();
}

/* The range table goes to the device only when it changes (the trainer's is
 * built once), so a step makes no synchronous upload. */
static void adamw_multi(float *p, const float *g, float *m, float *v, const AdamWRange *ranges, int nr, float lr,
                        float beta1, float beta2, float eps, int t, float grad_scale) {
    if (nr <= 0) return;
    static DevRange *host, *sent;
    static int host_cap, n_sent = -1;
    static void *sent_to;
    if (nr > host_cap) {
        free(host);
        free(sent);
        host = (DevRange *)malloc_check((size_t)nr * sizeof *host);
        sent = (DevRange *)malloc_check((size_t)nr * sizeof *sent);
        host_cap = nr;
        n_sent = -1;
    }
    size_t total = 0;
    int k = 0;
    for (int i = 0; i < nr; i++) {
        if (!ranges[i].n) continue;
        memset(&host[k], 0, sizeof host[k]); /* padding too: the table is compared bytewise */
        host[k].offset = ranges[i].offset;
        host[k].n = ranges[i].n;
        host[k].start = total;
        host[k].wd = ranges[i].wd;
        total += ranges[i].n;
        k++;
    }
    if (!total) return;
    DevRange *dev = (DevRange *)scratch_get(&sc_adam, (size_t)k * sizeof *dev);
    if (k != n_sent || (void *)dev != sent_to || memcmp(host, sent, (size_t)k * sizeof *host) != 0) {
        cu_from_host(dev, host, (size_t)k * sizeof *dev);
        memcpy(sent, host, (size_t)k * sizeof *host);
        n_sent = k;
        sent_to = dev;
    }
    AdamConsts c = adam_consts(lr, beta1, beta2, t);
    adamw_multi_k<<<grid_for(total, 256), 256>>>(p, g, m, v, dev, k, total, lr, beta1, beta2, c.ob1, c.ob2, eps,
                                                 c.step_size, c.bc2_sqrt, grad_scale);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// activation offload: page-locked host memory and a copy stream

/* The copy stream is non-blocking, so it does not synchronise with the legacy
 * default stream the kernels run on; order between the two is by events
 * only. Marks are a ring of events: a mark is waited for within a few layers
 * of its recording, long before the ring comes round again. */
#define OFF_MARKS 1024
static cudaStream_t off_stream;
static cudaEvent_t off_after_compute, off_marks[OFF_MARKS];
static int off_next;

static void off_init(void) {
    if (off_stream) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&off_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&off_after_compute, cudaEventDisableTiming));
    for (int i = 0; i < OFF_MARKS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&off_marks[i], cudaEventDisableTiming));
}

static void *cu_host_alloc(size_t bytes) {
    void *p = NULL;
    size_t sz = bytes ? bytes : 256;
    cudaError_t e = cudaHostAlloc(&p, sz, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation)
        die(EXIT_IO, "out of page-locked host memory allocating %.2f GiB for activation offload", sz / 1073741824.0);
    CUDA_CHECK(e);
    memset(p, 0, sz);
    return p;
}

static void cu_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

static void cu_offload_copy(void *host, void *dev, size_t bytes, int to_host) {
    if (!bytes) return;
    off_init();
    CUDA_CHECK(cudaEventRecord(off_after_compute, 0));
    CUDA_CHECK(cudaStreamWaitEvent(off_stream, off_after_compute, 0));
    if (to_host) CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, off_stream));
    else CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, off_stream));
    launch_check_("offload copy", __FILE__, __LINE__);
}

static int cu_offload_mark(void) {
    off_init();
    int id = off_next;
    off_next = (off_next + 1) % OFF_MARKS;
    CUDA_CHECK(cudaEventRecord(off_marks[id], off_stream));
    return id;
}

static void cu_offload_wait(int mark) {
    if (mark < 0 || mark >= OFF_MARKS) die(EXIT_INTERNAL, "offload_wait: mark %d out of range", mark);
    CUDA_CHECK(cudaStreamWaitEvent(0, off_marks[mark], 0));
}

// ----------------------------------------------------------------------------
// the table, device selection, probe and peak

static const Kernels cuda_kernels = {
    /* .name = */ "cuda",
    /* .alloc = */ cu_alloc,
    /* .free = */ cu_free,
    /* .zero = */ cu_zero,
    /* .copy = */ cu_copy,
    /* .to_host = */ cu_to_host,
    /* .from_host = */ cu_from_host,
    /* .embed_forward = */ embed_forward,
    /* .embed_backward = */ embed_backward,
    /* .embed_forward_vp = */ embed_forward_vp,
    /* .embed_backward_vp = */ embed_backward_vp,
    /* .layernorm_forward = */ layernorm_forward,
    /* .layernorm_backward = */ layernorm_backward,
    /* .rmsnorm_forward = */ rmsnorm_forward,
    /* .rmsnorm_backward = */ rmsnorm_backward,
    /* .add_layernorm_forward = */ add_layernorm_forward,
    /* .add_rmsnorm_forward = */ add_rmsnorm_forward,
    /* .matmul_forward = */ matmul_forward,
    /* .matmul_backward = */ matmul_backward,
    /* .attention_forward = */ attention_forward,
    /* .attention_backward = */ attention_backward,
    /* .rope_forward = */ rope_forward,
    /* .rope_backward = */ rope_backward,
    /* .gelu_forward = */ gelu_forward,
    /* .gelu_backward = */ gelu_backward,
    /* .matmul_gelu_forward = */ matmul_gelu_forward,
    /* .swiglu_forward = */ swiglu_forward,
    /* .swiglu_backward = */ swiglu_backward,
    /* .add = */ add,
    /* .crossentropy_forward = */ crossentropy_forward,
    /* .crossentropy_backward = */ crossentropy_backward,
    /* .crossentropy_vp_max = */ crossentropy_vp_max,
    /* .crossentropy_vp_expsum = */ crossentropy_vp_expsum,
    /* .crossentropy_vp_finish = */ crossentropy_vp_finish,
    /* .crossentropy_vp_backward = */ crossentropy_vp_backward,
    /* .sumsq = */ sumsq,
    /* .sum = */ sum,
    /* .scale = */ scale,
    /* .adamw = */ adamw,
    /* .adamw_multi = */ adamw_multi,
    /* .round_bf16 = */ round_bf16,
    /* .host_alloc = */ cu_host_alloc,
    /* .host_free = */ cu_host_free,
    /* .offload_copy = */ cu_offload_copy,
    /* .offload_mark = */ cu_offload_mark,
    /* .offload_wait = */ cu_offload_wait,
};

/* No CUDA call happens before this, kernels_cuda_available or kernels_cuda:
 * a CPU run of a CUDA build never touches the driver. */
extern "C" int kernels_cuda_device_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        if (why && n) snprintf(why, n, "%s", cudaGetErrorString(e));
        (void)cudaGetLastError(); /* clear the probe's error */
        return 0;
    }
    if (count < 1 && why && n) snprintf(why, n, "no CUDA device found");
    return count;
}

extern "C" void kernels_cuda_set_device(int dev) {
    if (G.ready && dev != G.dev) die(EXIT_INTERNAL, "kernels_cuda_set_device(%d) after device %d was initialised", dev, G.dev);
    G.dev = dev;
}

extern "C" int kernels_cuda_available(char *why, size_t n) {
    int count = kernels_cuda_device_count(why, n);
    if (count < 1) return 0;
    if (G.dev >= count) {
        if (why && n) snprintf(why, n, "device %d asked for, %d visible", G.dev, count);
        return 0;
    }
    /* a kernel image for this GPU (sm_80/sm_90 machine code, PTX for newer) */
    cudaFuncAttributes fa;
    cudaError_t e = cudaSetDevice(G.dev);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, add_k);
    if (e != cudaSuccess) {
        cudaDeviceProp prop;
        int ok = cudaGetDeviceProperties(&prop, G.dev) == cudaSuccess;
        if (why && n)
            snprintf(why, n, "device %d%s%s (compute capability %d.%d): %s", G.dev, ok ? ": " : "", ok ? prop.name : "",
                     ok ? prop.major : 0, ok ? prop.minor : 0, cudaGetErrorString(e));
        (void)cudaGetLastError(); /* clear the probe's error */
        return 0;
    }
    if (why && n) snprintf(why, n, "%d device%s", count, count == 1 ? "" : "s");
    return 1;
}

static void cuda_init(void) {
    if (G.ready) return;
    char why[256];
    if (!kernels_cuda_available(why, sizeof why)) die(EXIT_USAGE, "CUDA backend: no usable CUDA device (%s)", why);
    CUDA_CHECK(cudaSetDevice(G.dev));
    CUDA_CHECK(cudaGetDeviceProperties(&G.prop, G.dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&G.clock_khz, cudaDevAttrClockRate, G.dev));
    CUBLAS_CHECK(cublasLtCreate(&G.lt));
    G.ws_bytes = WORKSPACE_BYTES;
    DEV_MALLOC(&G.ws, G.ws_bytes);
    DEV_MALLOC(&G.red_partial, RED_BLOCKS * sizeof(double));
    DEV_MALLOC(&G.red_out, sizeof(double));
    matmul_mode();
    G.ready = 1;
}

extern "C" const Kernels *kernels_cuda(void) {
    cuda_init();
    return &cuda_kernels;
}

extern "C" void *kernels_cuda_stream(void) { return (void *)0; /* the legacy default stream */ }

extern "C" void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx) {
    cuda_init();
    if (poll && !HW.ev) CUDA_CHECK(cudaEventCreateWithFlags(&HW.ev, cudaEventDisableTiming));
    HW.poll = poll;
    HW.ctx = ctx;
}

extern "C" const char *kernels_cuda_device_info(void) {
    static char info[512];
    cuda_init();
    snprintf(info, sizeof info, "device %d: %.200s, %d SMs, cc %d.%d, %.1f GiB; matmuls %s (cuBLASLt %zu)",
             G.dev, G.prop.name, G.prop.multiProcessorCount, G.prop.major, G.prop.minor,
             (double)G.prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             matmul_mode() == MM_BF16   ? "bf16 tensor cores (LLMTRAIN_CUDA_MATMUL=bf16)"
             : matmul_mode() == MM_FP32 ? "plain fp32 (LLMTRAIN_CUDA_MATMUL=fp32)"
                                        : "TF32 tensor cores",
             cublasLtGetVersion());
    return info;
}

/* Dense bf16 tensor-core peak (GFLOP/s) of the device: the datasheet figure
 * for the parts named, else SMs x clock x bf16 FLOPs per SM per clock of the
 * architecture. */
extern "C" double kernels_cuda_peak_gflops(const char **source) {
    cuda_init();
    const char *nm = G.prop.name;
    const char *src = "bf16 dense peak of the detected GPU";
    double peak = 0.0;
    if (strstr(nm, "H100") || strstr(nm, "H200") || strstr(nm, "GH200")) {
        if (strstr(nm, "PCIe")) peak = 756e3;
        else if (strstr(nm, "NVL")) peak = 835e3; /* H100 NVL and H200 NVL */
        else peak = 989e3; /* SXM */
    } else if (strstr(nm, "A100")) {
        peak = 312e3;
    } else {
        int per_clk = G.prop.major >= 10 ? 8192 : G.prop.major == 9 ? 4096 : (G.prop.major == 8 && G.prop.minor == 0) ? 2048
                      : G.prop.major == 8 ? 512 : 256;
        peak = (double)G.prop.multiProcessorCount * (G.clock_khz * 1e3) * per_clk * 1e-9;
        src = "bf16 dense peak estimated from SMs x clock";
    }
    if (source) *source = src;
    return peak;
}
