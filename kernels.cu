/* kernels.cu — the CUDA backend of kernels.h (fp32 storage; under
 * train.compute_dtype bf16, the default, the [a] activations, which only
 * products read, are bf16).
 *
 * Every pointer is device memory; all work goes to the legacy default stream
 * in issue order, so the kernels.h contract (forward overwrites, backward adds,
 * calls see each other's results) holds without extra synchronisation.
 * to_host and the reductions that return a number synchronise (by polling
 * when a communication library set a host-wait hook: host_wait below).
 *
 * Matrix products: cuBLASLt. Under compute dtype bf16 (matmul_mode below)
 * the linear layers' GEMMs multiply bf16 operands with fp32 accumulation,
 * the [a] activations stored as bf16 by the kernels that write them; under
 * tf32, CUBLAS_COMPUTE_32F_FAST_TF32 — fp32 in and out, tensor cores read
 * the inputs rounded to TF32 (10-bit mantissa) and accumulate in fp32, no
 * conversion pass and no scratch copy, at half the bf16 tensor rate; under
 * fp32, plain fp32 without tensor cores.
 *
 * Attention: cuDNN's fused attention (the default under bf16, where it
 * reads the bf16 [a] qkv and out as they are), fused flash-style kernels
 * (tiles of queries x keys in shared memory and registers, online softmax,
 * no T x T scratch; TF32 tensor cores through wmma, fp32 FMA under compute
 * dtype fp32, bf16 tensor cores through mma.sync with the scores in
 * registers under bf16; head dims 32,
 * 64, 128): see the "attention, fused" section and the bf16 region after
 * it. Other head dims, and every shape under train.attention_kernel gemm,
 * take strided-batched
 * cuBLASLt GEMMs on the full T x T square (the masked half is computed and
 * thrown away), one query head at a time, with hand-written causal softmax
 * and softmax-backward kernels; the probabilities live in a [B, T, T]
 * scratch: the forward saves each row's log-sum-exp, the backward recomputes
 * them. On an H100 the fused kernels were 6% faster for the Llama 3.2 1B
 * shape at T=4096 and level with the GEMMs for GPT-2 124M at T=1024.
 *
 * Everything that needs scratch memory (cuBLASLt workspace, reduction
 * partials, attention's P and dP blocks, column-sum partials, AdamW
 * range tables, the embedding backward's sort keys) allocates at first use
 * and only grows, so steady-state steps never allocate. Every CUDA and
 * cuBLASLt call is checked: a failure prints one line with file:line and
 * exits (70; 3 for out of memory). */
#include <cub/device/device_radix_sort.cuh>
#include <cublasLt.h>
#include <cudnn.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
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
    double *red_partial; /* [RED_MAX_BLOCKS] */
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

/* The reductions' grid: a block for every RED_SPAN elements (64 KB of
 * fp32, four rounds of four 16-byte loads a thread), up to RED_MAX_BLOCKS
 * (past 128 M elements the blocks take more). A function of n alone, so the
 * same bits on every device; and short-lived blocks, so that one of
 * sumsq_queue's, which runs beside the compute and is never preempted, holds
 * an SM for microseconds, not for the whole pass as a grid of the blocks the
 * device holds at once, each striding over all of x, would. */
#define RED_SPAN 16384
#define RED_MAX_BLOCKS 8192
#define RED_THREADS 256

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* a pointer 16-byte loads and stores may use */
static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static int aligned8(const void *p) { return ((uintptr_t)p & 7u) == 0; }

static unsigned grid_for(size_t n, int threads) {
    size_t g = (n + (size_t)threads - 1) / (size_t)threads;
    if (g < 1) g = 1;
    if (g > (1u << 20)) g = 1u << 20; /* grid-stride loops cover the rest */
    return (unsigned)g;
}

/* the blocks of `threads` threads the device holds at once (2048 threads an
 * SM): the grid of a kernel whose blocks take their work in turn */
static int resident_blocks(int threads) { return G.prop.multiProcessorCount * (2048 / threads); }

static unsigned last_red_grid;
static unsigned red_grid(size_t n) {
    const size_t g = (n + RED_SPAN - 1) / RED_SPAN;
    last_red_grid = (unsigned)(g < 1 ? 1 : g > RED_MAX_BLOCKS ? RED_MAX_BLOCKS : g);
    return last_red_grid;
}
extern "C" unsigned kernels_cuda_last_reduce_grid(void) { return last_red_grid; }

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
// [a] activations (kernels.h): the buffers only matrix products read are
// bf16 under compute dtype bf16 (act_bf16()), else fp32. Kernels that
// write or read one are templated on its element type; act_st rounds to
// nearest even, as the GEMMs' operand conversion does.

static int matmul_bf16(void);
static int act_bf16(void) { return matmul_bf16(); }

__device__ __forceinline__ void act_st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void act_st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ float act_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float act_ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }

/* two floats as one word of two bf16 (nearest even), lo in the low half */
__device__ __forceinline__ uint32_t fb_pack(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
#elif defined(LLMTRAIN_CUDA_EMU_H)
    return (uint32_t)__float2bfloat16_rn(lo).x | (uint32_t)__float2bfloat16_rn(hi).x << 16;
#else
    (void)lo;
    (void)hi;
    return 0u;
#endif
}

/* four outputs at float4 index q of a row (16-byte aligned fp32, 8-byte
 * aligned bf16), rounded as act_st */
__device__ __forceinline__ void act_st4(float *o, int q, float4 v) { ((float4 *)(void *)o)[q] = v; }
__device__ __forceinline__ void act_st4(__nv_bfloat16 *o, int q, float4 v) {
    ((uint2 *)(void *)o)[q] = make_uint2(fb_pack(v.x, v.y), fb_pack(v.z, v.w));
}

/* 16 bytes of T (4 fp32 or 8 bf16, 16-byte aligned) as floats, and back
 * (bf16 rounded to nearest even, as act_st) */
__device__ __forceinline__ void ld16(const float *p, float *v) {
    const float4 a = *(const float4 *)(const void *)p;
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
}
__device__ __forceinline__ void ld16(const __nv_bfloat16 *p, float *v) {
    const uint4 a = *(const uint4 *)(const void *)p;
    const uint32_t wd[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = __uint_as_float(wd[i] << 16);
        v[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void st16(float *p, const float *v) {
    *(float4 *)(void *)p = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st16(__nv_bfloat16 *p, const float *v) {
    *(uint4 *)(void *)p = make_uint4(fb_pack(v[0], v[1]), fb_pack(v[2], v[3]), fb_pack(v[4], v[5]), fb_pack(v[6], v[7]));
}

/* E consecutive elements of T from 16-byte aligned p (E * sizeof(T) a
 * multiple of 16), 16 bytes a load, as floats, and back */
template <int E, typename T> __device__ __forceinline__ void ldn(const T *p, float *v) {
    static_assert(E * sizeof(T) % 16 == 0, "ldn: whole 16-byte words");
#pragma unroll
    for (int k = 0; k < E; k += (int)(16 / sizeof(T))) ld16(p + k, v + k);
}
template <int E, typename T> __device__ __forceinline__ void stn(T *p, const float *v) {
    static_assert(E * sizeof(T) % 16 == 0, "stn: whole 16-byte words");
#pragma unroll
    for (int k = 0; k < E; k += (int)(16 / sizeof(T))) st16(p + k, v + k);
}

/* The pointwise kernels' 16-byte form (the conversions', RoPE's,
 * SwiGLU's): PW_E consecutive elements a thread (ldn / stn), every operand
 * 16-byte aligned, each element computed by the same expression as the
 * element-at-a-time form's, so the same bits */
#define PW_E 8

/* an [a] argument as its element type */
#define ACT16(p) ((__nv_bfloat16 *)(void *)(p))
#define CACT16(p) ((const __nv_bfloat16 *)(const void *)(p))

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

static void wc_forget(const void *p, size_t bytes);
static void gf_forget(const void *p, size_t bytes);

static void cu_free(void *p) {
    if (!p) return;
    size_t i = Live.n;
    while (i > 0 && Live.p[i - 1] != p) i--;
    if (i == 0) die(EXIT_INTERNAL, "cuda free: %p was not allocated by this backend", p);
    wc_forget(p, Live.bytes[i - 1]);
    gf_forget(p, Live.bytes[i - 1]);
    dev_free(p, Live.bytes[i - 1]);
    Live.n--;
    Live.p[i - 1] = Live.p[Live.n];
    Live.bytes[i - 1] = Live.bytes[Live.n];
}

static void cu_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
}

// ----------------------------------------------------------------------------
// gradient memory that starts at zero without a zeroing pass
// (Kernels.grads_fresh / grads_settle)

/* A fresh region holds gradients that are logically zero whatever its bytes
 * are. It keeps the spans written since it was declared (sorted, disjoint,
 * adjacent ones merged): a kernel that stores a whole tensor instead of
 * adding into it (grad_first), or a gap zeroed because a kernel must add into
 * it (grad_ready). Settling zeroes the gaps left and ends the region. */
#define GF_REGIONS 32
#define GF_SPANS 512
typedef struct {
    uintptr_t lo, hi;
    int n;                      /* spans written */
    uintptr_t s[GF_SPANS][2];   /* [lo, hi) each, in order */
} GradRegion;
static GradRegion gf[GF_REGIONS];
static int gf_n;
static long gf_first_writes, gf_zeroed_bytes;

extern "C" long kernels_cuda_fresh_grad_stats(int *regions, size_t *zeroed_bytes) {
    if (regions) *regions = gf_n;
    if (zeroed_bytes) *zeroed_bytes = (size_t)gf_zeroed_bytes;
    return gf_first_writes;
}

static void gf_zero(uintptr_t lo, uintptr_t hi) {
    if (hi <= lo) return;
    CUDA_CHECK(cudaMemsetAsync((void *)lo, 0, hi - lo, 0));
    gf_zeroed_bytes += (long)(hi - lo);
}

/* [lo, hi) (inside r) written: merged into r's spans; when they run out, the
 * whole region is zeroed where unwritten and becomes one span */
static void gf_mark(GradRegion *r, uintptr_t lo, uintptr_t hi) {
    int i = 0;
    while (i < r->n && r->s[i][1] < lo) i++; /* the first span that ends at or after lo */
    int j = i;
    while (j < r->n && r->s[j][0] <= hi) { /* those touching [lo, hi) join it */
        if (r->s[j][0] < lo) lo = r->s[j][0];
        if (r->s[j][1] > hi) hi = r->s[j][1];
        j++;
    }
    if (j == i && r->n == GF_SPANS) {
        uintptr_t at = r->lo;
        for (int k = 0; k < r->n; k++) {
            gf_zero(at, r->s[k][0]);
            at = r->s[k][1];
        }
        gf_zero(at, r->hi);
        r->n = 1;
        r->s[0][0] = r->lo;
        r->s[0][1] = r->hi;
        return;
    }
    /* spans i..j-1 become one: [lo, hi) */
    memmove(&r->s[i + 1], &r->s[j], (size_t)(r->n - j) * sizeof r->s[0]);
    r->n += 1 - (j - i);
    r->s[i][0] = lo;
    r->s[i][1] = hi;
}

/* zero what is unwritten of [lo, hi) (inside r) and mark it written */
static void gf_fill(GradRegion *r, uintptr_t lo, uintptr_t hi) {
    uintptr_t at = lo;
    for (int k = 0; k < r->n && at < hi; k++) {
        if (r->s[k][1] <= at) continue;
        if (r->s[k][0] >= hi) break;
        if (r->s[k][0] > at) gf_zero(at, r->s[k][0]);
        at = r->s[k][1];
    }
    if (at < hi) gf_zero(at, hi);
    gf_mark(r, lo, hi);
}

static void gf_remove(int i) {
    gf[i] = gf[--gf_n];
}

/* The bytes [p, p + bytes) are about to be added into or read: whatever of
 * them lies in a fresh region unwritten is zeroed first. */
static void grad_ready(const void *p, size_t bytes) {
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    for (int i = 0; i < gf_n; i++) {
        GradRegion *r = &gf[i];
        if (r->lo < hi && lo < r->hi) gf_fill(r, lo > r->lo ? lo : r->lo, hi < r->hi ? hi : r->hi);
    }
}

/* From p to the end of the fresh region holding p (an embedding's gradient,
 * whose size embed_backward is not told: the embeddings come last in a
 * backward, so no later kernel loses a first write to it). */
static void grad_ready_to_end(const void *p) {
    uintptr_t lo = (uintptr_t)p;
    for (int i = 0; i < gf_n; i++)
        if (gf[i].lo <= lo && lo < gf[i].hi) gf_fill(&gf[i], lo, gf[i].hi);
}

/* A kernel is about to add a gradient into the whole tensor [g, g + n): 1
 * when it may store it instead (the tensor lies in one fresh region and no
 * byte of it was written since), and it is marked written; else 0, its
 * fresh parts zeroed (grad_ready) for the add. */
static int grad_first(const float *g, size_t n) {
    uintptr_t lo = (uintptr_t)g, hi = lo + n * sizeof(float);
    if (!g || !n) return 0;
    for (int i = 0; i < gf_n; i++) {
        GradRegion *r = &gf[i];
        if (!(r->lo <= lo && hi <= r->hi)) continue;
        int k = 0;
        while (k < r->n && r->s[k][1] <= lo) k++;
        if (k < r->n && r->s[k][0] < hi) break; /* partly written: add */
        gf_mark(r, lo, hi);
        gf_first_writes++;
        return 1;
    }
    grad_ready(g, n * sizeof(float));
    return 0;
}

/* Kernels.grads_fresh: the regions it overlaps end first (one it does not
 * contain settled: its part outside keeps its meaning) */
static void grads_fresh(float *g, size_t n) {
    uintptr_t lo = (uintptr_t)g, hi = lo + n * sizeof(float);
    if (!g || !n) return;
    for (int i = gf_n - 1; i >= 0; i--) {
        if (!(gf[i].lo < hi && lo < gf[i].hi)) continue;
        if (gf[i].lo < lo || gf[i].hi > hi) gf_fill(&gf[i], gf[i].lo, gf[i].hi);
        gf_remove(i);
    }
    if (gf_n == GF_REGIONS) { /* no room: zero it as the CPU does */
        gf_zero(lo, hi);
        return;
    }
    GradRegion *r = &gf[gf_n++];
    r->lo = lo;
    r->hi = hi;
    r->n = 0;
}

/* Kernels.grads_settle: the unwritten parts zeroed; a region left all
 * written ends */
static void grads_settle(float *g, size_t n) {
    if (!g || !n) return;
    grad_ready(g, n * sizeof(float));
    for (int i = gf_n - 1; i >= 0; i--)
        if (gf[i].n == 1 && gf[i].s[0][0] == gf[i].lo && gf[i].s[0][1] == gf[i].hi) gf_remove(i);
}

/* freed memory: its regions end, nothing zeroed */
static void gf_forget(const void *p, size_t bytes) {
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    for (int i = gf_n - 1; i >= 0; i--)
        if (gf[i].lo < hi && lo < gf[i].hi) gf_remove(i);
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

__global__ void embed_fwd_k(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                            int T, int C, int v0, int V) {
    size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(i / C), c = (int)(i % C);
        int t = tokens[n] - v0;
        float x = (t >= 0 && t < V) ? wte[(size_t)t * C + c] : 0.0f;
        if (wpe) x += wpe[(size_t)(pos ? pos[n] : n % T) * C + c];
        out[i] = x;
    }
}

/* Embedding backward, deterministic: every gradient row receives its rows of
 * dout in increasing row order n, one float addition after another, starting
 * from the row's current value: the CPU backend's order, so the result does
 * not depend on scheduling and equals the CPU's bits (only additions).
 *
 * dwpe without a position array: position t's rows are n = t, t + T,
 * t + 2T, ...: one thread per (t, channel) walks them in order.
 *
 * dwte: a token can be anywhere in the batch, so the rows are grouped by
 * token first: key(n) = (vocabulary row r, or V for a token outside
 * [v0, v0 + V)) << pos_bits | n, sorted with CUB's radix sort over the bits
 * in use. The keys are unique and the row index is in the low bits, so the
 * sorted order is (token, n) whatever the sort's stability. Then one block
 * per (sorted position, 128 channels) where a token's run starts adds that
 * run's dout rows in order into dwte[r]; the other blocks return at once.
 * dwpe with a position array (positions reset at each document) is the same
 * with the positions for tokens and T rows. The keys and CUB's temporary
 * storage live in a scratch buffer that only grows, so the step loop
 * allocates nothing after the first step. */

static int bit_length(unsigned long long x) {
    int b = 0;
    while (x) { b++; x >>= 1; }
    return b;
}

__global__ void embed_keys_k(unsigned long long *keys, const int *ids, int N, int v0, int V, int pos_bits) {
    GRID_STRIDE(i, (size_t)N) {
        long long t = (long long)ids[i] - v0;
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

static void embed_forward_vp(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                             int T, int C, int v0, int V) {
    if (N <= 0 || C <= 0) return;
    embed_fwd_k<<<grid_for((size_t)N * C, 256), 256>>>(out, tokens, pos, wte, wpe, N, T, C, v0, V);
    LAUNCH_CHECK();
}

/* dst[ids[n] - v0,:] += dout[n,:] for the ids in [v0, v0 + V), each row's
 * in increasing n: the sort above */
static void embed_sorted_add(float *dst, const float *dout, const int *ids, int N, int C, int v0, int V) {
    int pos_bits = bit_length((unsigned long long)N - 1), end_bit = pos_bits + bit_length((unsigned long long)V);
    cub::DoubleBuffer<unsigned long long> keys(NULL, NULL);
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(NULL, temp_bytes, keys, N, 0, end_bit, 0));
    size_t key_bytes = ((size_t)N * sizeof(unsigned long long) + 255) / 256 * 256;
    char *sc = (char *)scratch_get(&sc_embed, 2 * key_bytes + temp_bytes);
    keys = cub::DoubleBuffer<unsigned long long>((unsigned long long *)sc, (unsigned long long *)(sc + key_bytes));
    embed_keys_k<<<grid_for((size_t)N, 256), 256>>>(keys.Current(), ids, N, v0, V, pos_bits);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(sc + 2 * key_bytes, temp_bytes, keys, N, 0, end_bit, 0));
    LAUNCH_CHECK();
    dim3 grid((unsigned)N, (unsigned)((C + EMB_THREADS - 1) / EMB_THREADS));
    embed_bwd_wte_k<<<grid, EMB_THREADS>>>(dst, dout, keys.Current(), N, C, V, pos_bits);
    LAUNCH_CHECK();
}

static void embed_backward_vp(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos, int N,
                              int T, int C, int v0, int V) {
    if (N <= 0 || C <= 0) return;
    /* rows added into: a fresh gradient zeroed (embed_backward's vocabulary
     * is not given: to the end of its fresh region) */
    if (dwpe && T > 0) grad_ready(dwpe, (size_t)T * C * sizeof(float));
    if (dwte && V > 0) {
        if (V == 0x7fffffff) grad_ready_to_end(dwte);
        else grad_ready(dwte, (size_t)V * C * sizeof(float));
    }
    if (dwpe && T > 0) {
        if (pos) {
            embed_sorted_add(dwpe, dout, pos, N, C, 0, T);
        } else {
            embed_bwd_wpe_k<<<grid_for((size_t)(N < T ? N : T) * C, 256), 256>>>(dwpe, dout, N, T, C);
            LAUNCH_CHECK();
        }
    }
    if (dwte && V > 0) embed_sorted_add(dwte, dout, tokens, N, C, v0, V);
}

static void embed_forward(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                          int T, int C) {
    embed_forward_vp(out, tokens, pos, wte, wpe, N, T, C, 0, 0x7fffffff);
}

static void embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos, int N, int T,
                           int C) {
    embed_backward_vp(dwte, dwpe, dout, tokens, pos, N, T, C, 0, 0x7fffffff);
}

// ----------------------------------------------------------------------------
// dynamic shared memory

/* the most one block may take (with the opt-in) */
static size_t smem_limit(void) { return (size_t)G.prop.sharedMemPerBlockOptin; }

/* launch with smem bytes of dynamic shared memory, raising the kernel's
 * limit above the default 48 KB when a launch needs more than it was
 * last raised to (a kernel launched with several widths) */
template <typename... KA, typename... A>
static void launch_smem(void (*kernel)(KA...), dim3 grid, int threads, size_t smem, A... args) {
    if (smem > 48 * 1024) {
        static const void *raised[32];
        static size_t raised_to[32];
        static int nraised;
        int i = 0;
        while (i < nraised && raised[i] != (const void *)kernel) i++;
        if (i == nraised || raised_to[i] < smem) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            if (i == nraised && nraised < 32) nraised++;
            if (i < 32) {
                raised[i] = (const void *)kernel;
                raised_to[i] = smem;
            }
        }
    }
    kernel<<<grid, threads, smem>>>(args...);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// column sums (bias and norm-weight gradients): deterministic two-pass
// reduction, per row-chunk partials then a fixed-order sum per column

enum { COL_PLAIN = 0, COL_LN = 1, COL_RMS = 2 };
#define COL_TX 32
#define COL_TY 8

/* grid (ceil(C/32), RB); partial0/1 are [RB, C]; DT: d's element type
 * (bf16 for the plain sum of an [a] gradient). copy (COL_PLAIN of an fp32
 * d only, else NULL): also writes d rounded to bf16 there, [N, C] (each
 * element is read by exactly one thread) */
template <int MODE, typename DT>
__global__ void colsum_partial_k(float *partial0, float *partial1, const DT *d, const float *x, const float *mean,
                                 const float *rstd, int N, int C, int rows_per, __nv_bfloat16 *copy) {
    __shared__ float s0[COL_TY][COL_TX + 1], s1[COL_TY][COL_TX + 1];
    int c = blockIdx.x * COL_TX + threadIdx.x;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += COL_TY) {
            size_t i = (size_t)r * C + c;
            float dv = act_ld(d, i);
            if (MODE == COL_PLAIN) {
                a0 += dv;
                if (copy) copy[i] = __float2bfloat16_rn(dv);
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

/* dst0[c] (and dst1[c]) += the sum over the RB partials [RB, C] (= under
 * set0 / set1: a fresh gradient's first write, grad_first): block x
 * takes 32 columns, its thread (x, y) sums the partials y, y + 32, ... of
 * column x, then thread (x, 0) adds the 32 sums in order: a fixed order, the
 * same bits every run. (One thread a column summing all RB in turn ran the
 * norms' 512-1024 partials on C / 256 blocks: 3 SMs for C = 768.) */
#define FIN_TY 32
__global__ void __launch_bounds__(32 * FIN_TY)
    colsum_finish_k(float *dst0, float *dst1, const float *partial0, const float *partial1, int RB, int C, int set0,
                    int set1) {
    __shared__ float s0[FIN_TY][33], s1[FIN_TY][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float t0 = 0.0f, t1 = 0.0f;
    if (c < C)
        for (int y = threadIdx.y; y < RB; y += FIN_TY) {
            t0 += partial0[(size_t)y * C + c];
            if (partial1) t1 += partial1[(size_t)y * C + c];
        }
    s0[threadIdx.y][threadIdx.x] = t0;
    s1[threadIdx.y][threadIdx.x] = t1;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float u0 = 0.0f, u1 = 0.0f;
        for (int y = 0; y < FIN_TY; y++) {
            u0 += s0[y][threadIdx.x];
            u1 += s1[y][threadIdx.x];
        }
        if (dst0) dst0[c] = set0 ? u0 : dst0[c] + u0;
        if (dst1) dst1[c] = set1 ? u1 : dst1[c] + u1;
    }
}

static void colsum_finish(float *dst0, float *dst1, const float *p0, const float *p1, int RB, int C) {
    const int set0 = grad_first(dst0, (size_t)C), set1 = grad_first(dst1, (size_t)C);
    colsum_finish_k<<<(unsigned)((C + 31) / 32), dim3(32, FIN_TY)>>>(dst0, dst1, p0, p1, RB, C, set0, set1);
    LAUNCH_CHECK();
}

static long colsum_copy_calls;
extern "C" long kernels_cuda_colsum_copy_calls(void) { return colsum_copy_calls; }

/* dst0 += column sums of the MODE expression; dst1 (LN only) += sum of d;
 * d_bf16 (COL_PLAIN only): d is bf16; copy (COL_PLAIN of an fp32 d only):
 * d rounded to bf16 is written there in the same pass (a bias gradient and
 * the bf16 operand of the backward's GEMMs from one read of the fp32 output
 * gradient) */
static void colsum_add_copy(int mode, float *dst0, float *dst1, const float *d, const float *x, const float *mean,
                            const float *rstd, int N, int C, int d_bf16, __nv_bfloat16 *copy) {
    if (N <= 0 || C <= 0) return;
    int rows_per = 256;
    int RB = (N + rows_per - 1) / rows_per;
    if (RB > 128) { RB = 128; rows_per = (N + RB - 1) / RB; }
    int two = mode == COL_LN;
    float *part = (float *)scratch_get(&sc_col, (size_t)(two ? 2 : 1) * RB * C * sizeof(float));
    float *p0 = part, *p1 = two ? part + (size_t)RB * C : NULL;
    dim3 grid((C + COL_TX - 1) / COL_TX, RB), block(COL_TX, COL_TY);
    if (d_bf16 && mode != COL_PLAIN) die(EXIT_INTERNAL, "cuda colsum: a bf16 d with a norm's expression");
    if (copy && (d_bf16 || mode != COL_PLAIN)) die(EXIT_INTERNAL, "cuda colsum: a bf16 copy of other than a plain fp32 d");
    /* copy is NULL but for a plain fp32 d (above) */
    if (d_bf16)
        colsum_partial_k<COL_PLAIN, __nv_bfloat16><<<grid, block>>>(p0, p1, CACT16(d), x, mean, rstd, N, C, rows_per, copy);
    else if (mode == COL_PLAIN)
        colsum_partial_k<COL_PLAIN, float><<<grid, block>>>(p0, p1, d, x, mean, rstd, N, C, rows_per, copy);
    else if (mode == COL_LN) colsum_partial_k<COL_LN, float><<<grid, block>>>(p0, p1, d, x, mean, rstd, N, C, rows_per, copy);
    else colsum_partial_k<COL_RMS, float><<<grid, block>>>(p0, p1, d, x, mean, rstd, N, C, rows_per, copy);
    LAUNCH_CHECK();
    if (copy) colsum_copy_calls++;
    colsum_finish(dst0, dst1, p0, p1, RB, C);
}

static void colsum_add(int mode, float *dst0, float *dst1, const float *d, const float *x, const float *mean,
                       const float *rstd, int N, int C, int d_bf16) {
    colsum_add_copy(mode, dst0, dst1, d, x, mean, rstd, N, C, d_bf16, NULL);
}

// ----------------------------------------------------------------------------
// norms: one warp per row, statistics in fp32

#define NORM_THREADS 256
#define ROWS_PER_BLOCK (NORM_THREADS / 32)

/* one row by one warp: x -> o ([a]: fp32 or bf16), mean and rstd saved by lane 0 */
template <typename OT>
__device__ void layernorm_row_warp(OT *o, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                   int row, int lane, int C, float eps) {
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = x[c] - m; v += d * d; }
    float rs = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane; c < C; c += 32) {
        float y = (x[c] - m) * rs * w[c];
        act_st(o, c, b ? y + b[c] : y);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

template <typename OT>
__device__ void rmsnorm_row_warp(OT *o, float *rstd, const float *x, const float *w, int row, int lane, int C,
                                 float eps) {
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    float rs = rsqrtf(warp_sum(ss) / C + eps);
    for (int c = lane; c < C; c += 32) act_st(o, c, x[c] * rs * w[c]);
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

template <typename OT>
__global__ void layernorm_fwd_k(OT *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    layernorm_row_warp(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, w, b, row, lane, C, eps);
}

template <typename OT>
__global__ void add_layernorm_fwd_k(float *res, OT *out, float *mean, float *rstd, const float *a, const float *b,
                                    const float *w, const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = residual_row_warp(res, a, b, row, lane, C);
    layernorm_row_warp(out + (size_t)row * C, mean, rstd, x, w, bias, row, lane, C, eps);
}

/* The norms' forward with 16-byte loads (C % 4 == 0, every row 16-byte
 * aligned): one warp a row as the kernels above, lane l's float4 columns
 * l, l + 32, ...; NCH > 0 (C up to 128 NCH): all of them loaded at once and
 * kept in registers for the statistics and the output; NCH = 0: read again
 * for each pass. LN: layernorm (mean saved), else rmsnorm. ADD: the row is
 * a + b, written to res first (res may be a: each lane reads back only
 * what it wrote); else it is a. The element arithmetic is the scalar
 * kernels'; the sums' order is the lanes' own. */
__device__ __forceinline__ float4 f4_zero(void) { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ float4 f4_add(float4 x, float4 y) {
    return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}
/* a float4's share of the first sum: LN the values, else their squares */
template <int LN> __device__ __forceinline__ float nfw_sum(float4 x) {
    if (LN) return x.x + x.y + x.z + x.w;
    return x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
}
__device__ __forceinline__ float nfw_dev(float4 x, float m) {
    const float a = x.x - m, b = x.y - m, c = x.z - m, d = x.w - m;
    return a * a + b * b + c * c + d * d;
}
template <int LN>
__device__ __forceinline__ float4 nfw_out(float4 x, float4 w, const float4 *bias, int q, float m, float rs) {
    if (!LN) return make_float4(x.x * rs * w.x, x.y * rs * w.y, x.z * rs * w.z, x.w * rs * w.w);
    float4 y = make_float4((x.x - m) * rs * w.x, (x.y - m) * rs * w.y, (x.z - m) * rs * w.z, (x.w - m) * rs * w.w);
    return bias ? f4_add(y, bias[q]) : y;
}

template <typename OT, int LN, int ADD, int NCH>
__global__ void __launch_bounds__(NORM_THREADS)
    norm_fwd_vec_k(float *res, OT *out, float *mean, float *rstd, const float *a, const float *b, const float *w,
                   const float *bias, int N, int C, float eps) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31, C4 = C >> 2;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const float4 *a4 = (const float4 *)(const void *)(a + off), *w4 = (const float4 *)(const void *)w;
    const float4 *b4 = ADD ? (const float4 *)(const void *)(b + off) : NULL;
    const float4 *bi4 = LN && bias ? (const float4 *)(const void *)bias : NULL;
    float4 *r4 = ADD ? (float4 *)(void *)(res + off) : NULL;
    const float4 *x4 = ADD ? r4 : a4; /* where the re-reading form finds the row */
    OT *o = out + off;
    float s = 0.0f, m = 0.0f, rs;
    if (NCH > 0) {
        float4 xr[NCH > 0 ? NCH : 1];
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int q = lane + 32 * k;
            xr[k] = f4_zero();
            if (q < C4) {
                xr[k] = ADD ? f4_add(a4[q], b4[q]) : a4[q];
                if (ADD) r4[q] = xr[k];
            }
        }
#pragma unroll
        for (int k = 0; k < NCH; k++)
            if (lane + 32 * k < C4) s += nfw_sum<LN>(xr[k]);
        if (LN) {
            m = warp_sum(s) / C;
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < NCH; k++)
                if (lane + 32 * k < C4) v += nfw_dev(xr[k], m);
            rs = rsqrtf(warp_sum(v) / C + eps);
        } else {
            rs = rsqrtf(warp_sum(s) / C + eps);
        }
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int q = lane + 32 * k;
            if (q < C4) act_st4(o, q, nfw_out<LN>(xr[k], w4[q], bi4, q, m, rs));
        }
    } else {
        for (int q = lane; q < C4; q += 32) {
            const float4 x = ADD ? f4_add(a4[q], b4[q]) : a4[q];
            if (ADD) r4[q] = x;
            s += nfw_sum<LN>(x);
        }
        if (LN) {
            m = warp_sum(s) / C;
            float v = 0.0f;
            for (int q = lane; q < C4; q += 32) v += nfw_dev(x4[q], m);
            rs = rsqrtf(warp_sum(v) / C + eps);
        } else {
            rs = rsqrtf(warp_sum(s) / C + eps);
        }
        for (int q = lane; q < C4; q += 32) act_st4(o, q, nfw_out<LN>(x4[q], w4[q], bi4, q, m, rs));
    }
    if (lane == 0) {
        if (LN && mean) mean[row] = m;
        if (rstd) rstd[row] = rs;
    }
}

/* One row's backward by one warp (MODE COL_LN or COL_RMS): the input
 * gradient added into dinp; with a0 != NULL the row's terms of the weight
 * gradient also added into a0[c] (and, LN, the bias gradient's into a1[c]),
 * the same terms as colsum_partial_k's. mean is unused for RMS. */
template <int MODE>
__device__ void norm_bwd_row(float *dinp, float *a0, float *a1, const float *dout, const float *inp, const float *w,
                             const float *mean, const float *rstd, int row, int lane, int C) {
    const int two = MODE == COL_LN;
    const float *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    float *g = dinp + (size_t)row * C;
    const float rs = rstd[row], m = two ? mean[row] : 0.0f;
    float sd = 0.0f, sdx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = d[c] * w[c];
        if (two) sd += dn;
        sdx += dn * (two ? (x[c] - m) * rs : x[c] * rs);
    }
    const float md = two ? warp_sum(sd) / C : 0.0f, mdx = warp_sum(sdx) / C;
    for (int c = lane; c < C; c += 32) {
        float dv = d[c], xh = two ? (x[c] - m) * rs : x[c] * rs;
        g[c] += two ? rs * (dv * w[c] - md - xh * mdx) : rs * (dv * w[c] - xh * mdx);
        if (a0) a0[c] += dv * xh;
        if (two && a1) a1[c] += dv;
    }
}

__global__ void layernorm_bwd_k(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                                const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    norm_bwd_row<COL_LN>(dinp, NULL, NULL, dout, inp, w, mean, rstd, row, lane, C);
}

template <typename OT>
__global__ void rmsnorm_fwd_k(OT *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    rmsnorm_row_warp(out + (size_t)row * C, rstd, inp + (size_t)row * C, w, row, lane, C, eps);
}

template <typename OT>
__global__ void add_rmsnorm_fwd_k(float *res, OT *out, float *rstd, const float *a, const float *b, const float *w,
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
    norm_bwd_row<COL_RMS>(dinp, NULL, NULL, dout, inp, w, NULL, rstd, row, lane, C);
}

/* The norms' backward with their weight (and bias) gradients in the same
 * pass over dout and inp (MODE COL_LN or COL_RMS). Block b takes rows
 * [b rows_per, (b + 1) rows_per), its warp k the rows k, k + NBW_WARPS, ...
 * of them (norm_bwd_row, as layernorm_bwd_k / rmsnorm_bwd_k), each row's
 * terms of the column sums added, in row order, into the warp's own shared
 * row of C (two for layernorm: weight, then bias). Then the block writes the sum of its warps' rows,
 * warp 0 first, as its partial [b, C], and colsum_finish_k adds the
 * partials in block order: no atomics, the same bits every run. */
#define NBW_WARPS 4
/* 1024 (was 512): GPT-2 124M's layernorm_backward on an H200 went from 3.46
 * to 3.20 ms a step (1455 to 1573 GB/s), the Llama 1B shape's
 * rmsnorm_backward stayed at 3.5-3.6 ms: one row per warp, two passes, is
 * latency-bound either way */
#define NBW_MAX_BLOCKS 1024
template <int MODE>
__global__ void __launch_bounds__(NBW_WARPS * 32)
    norm_bwd_fused_k(float *dinp, float *part0, float *part1, const float *dout, const float *inp, const float *w,
                     const float *mean, const float *rstd, int N, int C, int rows_per) {
    extern __shared__ float nbw_sm[];
    const int two = MODE == COL_LN, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *a0 = nbw_sm + (size_t)warp * (two ? 2 : 1) * C, *a1 = a0 + C;
    for (int c = lane; c < C; c += 32) {
        a0[c] = 0.0f;
        if (two) a1[c] = 0.0f;
    }
    const int r0 = blockIdx.x * rows_per, r1 = min(N, r0 + rows_per);
    for (int row = r0 + warp; row < r1; row += NBW_WARPS)
        norm_bwd_row<MODE>(dinp, a0, two ? a1 : NULL, dout, inp, w, mean, rstd, row, lane, C);
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int k = 0; k < NBW_WARPS; k++) {
            t0 += nbw_sm[(size_t)k * (two ? 2 : 1) * C + c];
            if (two) t1 += nbw_sm[(size_t)k * 2 * C + C + c];
        }
        part0[(size_t)blockIdx.x * C + c] = t0;
        if (two) part1[(size_t)blockIdx.x * C + c] = t1;
    }
}

/* The same pass with 16-byte loads (C % 4 == 0, every row 16-byte aligned),
 * a block to a row at a time: thread t of the block's TH owns the float4
 * columns t, t + TH, ..., so its weight (and bias) gradient terms stay its
 * own for every row of the block, and a row's two sums are the block's
 * (each warp's, then the warps' in order through shared memory: one
 * __syncthreads a row, the buffer alternating). V > 0: at most V float4
 * a thread (TH <= 256), its d, x and dinp loaded together before the first
 * sum (one round trip to memory a row), w and the column sums in
 * registers; V = 0 (rows wider than 4 x 256 float4): both passes read d and
 * x from memory and the column sums live in shared memory. The earlier form,
 * a warp to a row with the lane's share of d and x kept between the
 * passes (16 float4 each at C = 2048) and dinp read after the row's sums,
 * ran the Llama 1B shape's rmsnorm_backward at 2.06 TB/s on an H200 (43% of
 * its bandwidth; GPT-2 124M's layernorm_backward at 2.75 TB/s). */
/* one float4's share of the first pass: sd += d w, sdx += d w xhat */
template <int MODE>
__device__ __forceinline__ void nbw_pass1(float &sd, float &sdx, float4 d, float4 x, float4 w, float m, float rs) {
    const float dn[4] = {d.x * w.x, d.y * w.y, d.z * w.z, d.w * w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (MODE == COL_LN) sd += dn[i];
        sdx += dn[i] * (MODE == COL_LN ? (xv[i] - m) * rs : xv[i] * rs);
    }
}

/* one float4's share of the second pass: g += the input gradient, a0 (and
 * a1) += the weight (and bias) gradient terms, as norm_bwd_row */
template <int MODE>
__device__ __forceinline__ void nbw_pass2(float4 &g, float4 &a0, float4 &a1, float4 d, float4 x, float4 w, float m,
                                          float rs, float md, float mdx) {
    float *gv = &g.x, *p0 = &a0.x, *p1 = &a1.x;
    const float dv[4] = {d.x, d.y, d.z, d.w}, xv[4] = {x.x, x.y, x.z, x.w}, wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float xh = MODE == COL_LN ? (xv[i] - m) * rs : xv[i] * rs;
        gv[i] += MODE == COL_LN ? rs * (dv[i] * wv[i] - md - xh * mdx) : rs * (dv[i] * wv[i] - xh * mdx);
        p0[i] += dv[i] * xh;
        if (MODE == COL_LN) p1[i] += dv[i];
    }
}

#define NBR_MAX_THREADS 256
template <int MODE, int V>
__global__ void __launch_bounds__(NBR_MAX_THREADS)
    norm_bwd_rows_k(float *__restrict__ dinp, __nv_bfloat16 *__restrict__ dcopy, float *__restrict__ part0,
                    float *__restrict__ part1, const float *__restrict__ dout, const float *__restrict__ inp,
                    const float *__restrict__ w, const float *__restrict__ mean, const float *__restrict__ rstd, int N,
                    int C, int rows_per) {
    extern __shared__ float nbr_sm[]; /* V = 0: the block's column sums, [two ? 2 : 1][C] */
    __shared__ float red[2][NBR_MAX_THREADS / 32][2];
    constexpr int R = V > 0 ? V : 1;
    const int two = MODE == COL_LN, C4 = C >> 2, TH = blockDim.x, t = threadIdx.x, lane = t & 31;
    const float4 *w4 = (const float4 *)(const void *)w;
    float4 *c0 = (float4 *)(void *)nbr_sm, *c1 = c0 + C4; /* V = 0 */
    float4 wr[R], s0[R], s1[R];
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int q = t + TH * k;
        wr[k] = V > 0 && q < C4 ? w4[q] : f4_zero();
        s0[k] = f4_zero();
        s1[k] = f4_zero();
    }
    if (V == 0)
        for (int q = t; q < C4; q += TH) {
            c0[q] = f4_zero();
            if (two) c1[q] = f4_zero();
        }
    const int r0 = blockIdx.x * rows_per, r1 = min(N, r0 + rows_per);
    int buf = 0;
    for (int row = r0; row < r1; row++, buf ^= 1) {
        const float4 *d4 = (const float4 *)(const void *)(dout + (size_t)row * C);
        const float4 *x4 = (const float4 *)(const void *)(inp + (size_t)row * C);
        float4 *g4 = (float4 *)(void *)(dinp + (size_t)row * C);
        __nv_bfloat16 *cp = dcopy ? dcopy + (size_t)row * C : NULL; /* dinp's bf16 copy (8-byte aligned rows) */
        const float rs = rstd[row], m = two ? mean[row] : 0.0f;
        float sd = 0.0f, sdx = 0.0f;
        float4 dr[R], xr[R], gr[R];
        if (V > 0) {
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int q = t + TH * k;
                const int in = q < C4;
                dr[k] = in ? d4[q] : f4_zero();
                xr[k] = in ? x4[q] : f4_zero();
                gr[k] = in ? g4[q] : f4_zero();
            }
#pragma unroll
            for (int k = 0; k < R; k++)
                if (t + TH * k < C4) nbw_pass1<MODE>(sd, sdx, dr[k], xr[k], wr[k], m, rs);
        } else {
#pragma unroll 4
            for (int q = t; q < C4; q += TH) nbw_pass1<MODE>(sd, sdx, d4[q], x4[q], w4[q], m, rs);
        }
        if (two) sd = warp_sum(sd);
        sdx = warp_sum(sdx);
        if (lane == 0) {
            red[buf][t >> 5][0] = sd;
            red[buf][t >> 5][1] = sdx;
        }
        __syncthreads();
        float bsd = 0.0f, bsdx = 0.0f;
        for (int k = 0; k < TH >> 5; k++) {
            if (two) bsd += red[buf][k][0];
            bsdx += red[buf][k][1];
        }
        const float md = two ? bsd / C : 0.0f, mdx = bsdx / C;
        if (V > 0) {
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int q = t + TH * k;
                if (q < C4) {
                    nbw_pass2<MODE>(gr[k], s0[k], s1[k], dr[k], xr[k], wr[k], m, rs, md, mdx);
                    g4[q] = gr[k];
                    if (cp) act_st4(cp, q, gr[k]);
                }
            }
        } else {
#pragma unroll 4
            for (int q = t; q < C4; q += TH) {
                float4 g = g4[q], a0 = c0[q], a1 = two ? c1[q] : f4_zero();
                nbw_pass2<MODE>(g, a0, a1, d4[q], x4[q], w4[q], m, rs, md, mdx);
                g4[q] = g;
                if (cp) act_st4(cp, q, g);
                c0[q] = a0;
                if (two) c1[q] = a1;
            }
        }
    }
    /* the block's partial: a thread's own columns (no other thread wrote them) */
    float4 *p0 = (float4 *)(void *)(part0 + (size_t)blockIdx.x * C);
    float4 *p1 = two ? (float4 *)(void *)(part1 + (size_t)blockIdx.x * C) : NULL;
    if (V > 0) {
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int q = t + TH * k;
            if (q < C4) {
                p0[q] = s0[k];
                if (two) p1[q] = s1[k];
            }
        }
    } else {
        for (int q = t; q < C4; q += TH) {
            p0[q] = c0[q];
            if (two) p1[q] = c1[q];
        }
    }
}

static long fused_norm_bwd_calls, vec_norm_bwd_calls[2], fused_dinp_a_calls;
extern "C" long kernels_cuda_fused_norm_bwd_calls(void) { return fused_norm_bwd_calls; }
extern "C" long kernels_cuda_fused_dinp_a_calls(void) { return fused_dinp_a_calls; }
/* which: 0 the float4 form with a thread's columns in registers, 1 the
 * float4 form reading the row twice (wider than 4096) */
extern "C" long kernels_cuda_vec_norm_bwd_calls(int which) { return vec_norm_bwd_calls[which != 0]; }

template <int MODE>
static void launch_norm_bwd_rows(int V, int RB, int TH, size_t smem, float *dinp, __nv_bfloat16 *dcopy, float *p0,
                                 float *p1, const float *dout, const float *inp, const float *w, const float *mean,
                                 const float *rstd, int N, int C, int rows_per) {
    const dim3 grid(RB);
#define NBR_CASE(K)                                                                                                   \
    case K:                                                                                                           \
        launch_smem(norm_bwd_rows_k<MODE, K>, grid, TH, smem, dinp, dcopy, p0, p1, dout, inp, w, mean, rstd, N, C,     \
                    rows_per);                                                                                        \
        break
    switch (V) {
        NBR_CASE(1); NBR_CASE(2); NBR_CASE(4);
        default: NBR_CASE(0);
    }
#undef NBR_CASE
}

/* the norm's backward in one pass (norm_bwd_rows_k, or norm_bwd_fused_k for
 * a width not a multiple of 4 or a row not 16-byte aligned) when its column
 * sums fit in a block's shared memory (the float4 form's reading-twice
 * variant: one row of them; the scalar form: a row a warp); returns 0
 * (nothing done) otherwise. *dinp_a: the [a] copy of dinp wanted; the
 * float4 form writes a bf16 one beside dinp and sets it NULL (done). */
static int norm_backward_fused(int mode, float *dinp, float **dinp_a, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean, const float *rstd, int N, int C) {
    const int two = mode == COL_LN;
    if (!dinp || !dw || (two && !db)) return 0;
    int RB = (N + 7) / 8;
    if (RB > NBW_MAX_BLOCKS) RB = NBW_MAX_BLOCKS;
    const int rows_per = (N + RB - 1) / RB;
    RB = (N + rows_per - 1) / rows_per;
    const int C4 = C / 4, vec = C % 4 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    /* float4 columns a thread: 1, 2 or 4 in registers, 0 = the reading-twice form */
    const int V = C4 <= NBR_MAX_THREADS ? 1 : C4 <= 2 * NBR_MAX_THREADS ? 2 : C4 <= 4 * NBR_MAX_THREADS ? 4 : 0;
    const size_t smem = vec ? (V ? 0 : (size_t)(two ? 2 : 1) * C * sizeof(float))
                            : (size_t)NBW_WARPS * (two ? 2 : 1) * C * sizeof(float);
    if (smem > smem_limit()) return 0;
    float *part = (float *)scratch_get(&sc_col, (size_t)(two ? 2 : 1) * RB * C * sizeof(float));
    float *p0 = part, *p1 = two ? part + (size_t)RB * C : NULL;
    if (vec) {
        const int th = V ? ((C4 + V - 1) / V + 31) / 32 * 32 : NBR_MAX_THREADS;
        __nv_bfloat16 *cp = *dinp_a && act_bf16() && aligned8(*dinp_a) ? ACT16(*dinp_a) : NULL;
        if (two) launch_norm_bwd_rows<COL_LN>(V, RB, th, smem, dinp, cp, p0, p1, dout, inp, w, mean, rstd, N, C, rows_per);
        else launch_norm_bwd_rows<COL_RMS>(V, RB, th, smem, dinp, cp, p0, p1, dout, inp, w, mean, rstd, N, C, rows_per);
        vec_norm_bwd_calls[V == 0]++;
        if (cp) {
            fused_dinp_a_calls++;
            *dinp_a = NULL;
        }
    } else if (two) {
        launch_smem(norm_bwd_fused_k<COL_LN>, dim3(RB), NBW_WARPS * 32, smem, dinp, p0, p1, dout, inp, w, mean, rstd, N, C, rows_per);
    } else {
        launch_smem(norm_bwd_fused_k<COL_RMS>, dim3(RB), NBW_WARPS * 32, smem, dinp, p0, p1, dout, inp, w, mean, rstd, N, C, rows_per);
    }
    colsum_finish(dw, db, p0, p1, RB, C);
    fused_norm_bwd_calls++;
    return 1;
}

static unsigned norm_grid(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

static long vec_norm_fwd_calls;
extern "C" long kernels_cuda_vec_norm_fwd_calls(void) { return vec_norm_fwd_calls; }

template <typename OT, int LN, int ADD>
static void launch_norm_fwd_vec(int nch, float *res, OT *out, float *mean, float *rstd, const float *a, const float *b,
                                const float *w, const float *bias, int N, int C, float eps) {
    switch (nch) {
    case 4: norm_fwd_vec_k<OT, LN, ADD, 4><<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps); break;
    case 8: norm_fwd_vec_k<OT, LN, ADD, 8><<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps); break;
    case 16: norm_fwd_vec_k<OT, LN, ADD, 16><<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps); break;
    default: norm_fwd_vec_k<OT, LN, ADD, 0><<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps);
    }
    LAUNCH_CHECK();
}

/* a norm's forward (ln: layernorm, add: of a + b into res) by
 * norm_fwd_vec_k when C is a multiple of 4 and every row is 16-byte
 * aligned: float4 a lane up to 4, 8 or 16 of them kept in registers (C up
 * to 512, 1024, 2048), else read again for each pass; returns 0 (nothing
 * done) otherwise */
static int norm_forward_vec(int ln, int add, float *res, float *out, float *mean, float *rstd, const float *a,
                            const float *b, const float *w, const float *bias, int N, int C, float eps) {
    if (C % 4 || !aligned16(out) || !aligned16(a) || !aligned16(w) || (bias && !aligned16(bias)) ||
        (add && (!aligned16(b) || !aligned16(res))))
        return 0;
    const int need = (C / 4 + 31) / 32, nch = need <= 4 ? 4 : need <= 8 ? 8 : need <= 16 ? 16 : 0;
#define NFW(OT, O, L, A) launch_norm_fwd_vec<OT, L, A>(nch, res, O, mean, rstd, a, b, w, bias, N, C, eps)
    if (act_bf16()) {
        if (ln) add ? NFW(__nv_bfloat16, ACT16(out), 1, 1) : NFW(__nv_bfloat16, ACT16(out), 1, 0);
        else add ? NFW(__nv_bfloat16, ACT16(out), 0, 1) : NFW(__nv_bfloat16, ACT16(out), 0, 0);
    } else {
        if (ln) add ? NFW(float, out, 1, 1) : NFW(float, out, 1, 0);
        else add ? NFW(float, out, 0, 1) : NFW(float, out, 0, 0);
    }
#undef NFW
    vec_norm_fwd_calls++;
    return 1;
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                              int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(1, 0, NULL, out, mean, rstd, inp, NULL, w, b, N, C, eps)) return;
    if (act_bf16())
        layernorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(ACT16(out), mean, rstd, inp, w, b, N, C, eps);
    else layernorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(out, mean, rstd, inp, w, b, N, C, eps);
    LAUNCH_CHECK();
}

static void to_bf16(void *dst, const float *src, size_t n);

/* a norm backward's dinp_a where its kernel did not write it: dinp's n
 * values as [a], converted (bf16) or copied (fp32) after it */
static void dinp_a_after(float *dinp_a, const float *dinp, size_t n) {
    if (!dinp_a) return;
    if (!dinp) die(EXIT_INTERNAL, "cuda norm backward: dinp_a without dinp");
    if (act_bf16()) to_bf16(dinp_a, dinp, n);
    else cu_copy(dinp_a, dinp, n * sizeof(float));
}

static void layernorm_backward(float *dinp, float *dinp_a, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0) return;
    if (!norm_backward_fused(COL_LN, dinp, &dinp_a, dw, db, dout, inp, w, mean, rstd, N, C)) {
        if (dinp) {
            layernorm_bwd_k<<<norm_grid(N), NORM_THREADS>>>(dinp, dout, inp, w, mean, rstd, N, C);
            LAUNCH_CHECK();
        }
        if (dw || db) colsum_add(COL_LN, dw, db, dout, inp, mean, rstd, N, C, 0);
    }
    dinp_a_after(dinp_a, dinp, (size_t)N * C);
}

static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(0, 0, NULL, out, NULL, rstd, inp, NULL, w, NULL, N, C, eps)) return;
    if (act_bf16()) rmsnorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(ACT16(out), rstd, inp, w, N, C, eps);
    else rmsnorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(out, rstd, inp, w, N, C, eps);
    LAUNCH_CHECK();
}

static void add_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                  const float *w, const float *bias, int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(1, 1, res, out, mean, rstd, a, b, w, bias, N, C, eps)) return;
    if (act_bf16())
        add_layernorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(res, ACT16(out), mean, rstd, a, b, w, bias, N,
                                                                           C, eps);
    else add_layernorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps);
    LAUNCH_CHECK();
}

static void add_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(0, 1, res, out, NULL, rstd, a, b, w, NULL, N, C, eps)) return;
    if (act_bf16())
        add_rmsnorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(res, ACT16(out), rstd, a, b, w, N, C, eps);
    else add_rmsnorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(res, out, rstd, a, b, w, N, C, eps);
    LAUNCH_CHECK();
}

static void rmsnorm_backward(float *dinp, float *dinp_a, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int C) {
    if (N <= 0) return;
    if (!norm_backward_fused(COL_RMS, dinp, &dinp_a, dw, NULL, dout, inp, w, NULL, rstd, N, C)) {
        if (dinp) {
            rmsnorm_bwd_k<<<norm_grid(N), NORM_THREADS>>>(dinp, dout, inp, w, rstd, N, C);
            LAUNCH_CHECK();
        }
        if (dw) colsum_add(COL_RMS, dw, NULL, dout, inp, NULL, rstd, N, C, 0);
    }
    dinp_a_after(dinp_a, dinp, (size_t)N * C);
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
    int c_bf16; /* C and D bf16 (the LM head's [a] logits), else fp32 */
    int gelu, al_aux; /* gelu: the GELU epilogue wanted and allowed, GEMM_GELU_AUX or GEMM_DGELU (rm_gemm_core) */
    long long sA, sB, sC;
    /* value */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int epi_bias; /* the bias is fused; else added by a kernel */
    int epi_gelu; /* GEMM_GELU_AUX: GELU_AUX(_BIAS), D = gelu(...), aux = its input; GEMM_DGELU: D = (...) *
                   * gelu'(aux); 0: a kernel applies it */
} GemmPlan;

enum { GEMM_GELU_AUX = 1, GEMM_DGELU = 2 };

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
 * epi_gelu: GEMM_GELU_AUX, the GELU_AUX epilogue writing the GELU's input
 * to aux, or GEMM_DGELU, the DGELU epilogue reading it from aux (ld = ldc;
 * the heuristic reads aux's alignment from the pointer). */
static int plan_build(GemmPlan *p, int epi_bias, int epi_gelu, const void *aux, cublasComputeType_t compute) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    int32_t opA = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opB = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    if (epi_bias || epi_gelu) {
        if (epi_gelu == GEMM_DGELU && epi_bias) die(EXIT_INTERNAL, "cuda gemm: DGELU with a bias");
        uint32_t epi = !epi_gelu                 ? CUBLASLT_EPILOGUE_BIAS
                       : epi_gelu == GEMM_DGELU ? CUBLASLT_EPILOGUE_DGELU
                       : epi_bias               ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                : CUBLASLT_EPILOGUE_GELU_AUX;
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
    layout_create(&p->lc, p->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, p->N, p->M, p->ldc, p->batch, p->sC);
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

/* out (fp32, or bf16 rounded to nearest) += bias, row by row */
template <typename OT> __global__ void add_bias_k(OT *out, const float *bias, int M, int N, int ldc) {
    size_t total = (size_t)M * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / N), c = (int)(i % N);
        size_t j = (size_t)r * ldc + c;
        act_st(out, j, act_ld(out, j) + bias[c]);
    }
}

/* train.compute_dtype (kernels_cuda_set_compute_dtype) picks the GEMM
 * arithmetic and the width of the [a] buffers:
 *   bf16  (the default) the linear layers' GEMMs run bf16 x bf16 -> fp32
 *         with fp32 accumulation. Their activation operand is an [a]
 *         buffer, bf16 already (the norms, the GELU / SwiGLU and attention
 *         write it so);
 *         an output gradient is converted into scratch first (a backward's
 *         dout once for both of its products; the LM head's logits and their
 *         gradients are [a], bf16 already), the weights into the copies of
 *         weights_stable (wc_get) or, outside a stable range, into scratch;
 *         the fused attention takes its bf16 mma.sync kernels (the GEMM
 *         attention stays TF32, on an fp32 copy of its [a] output);
 *   tf32  fp32 storage, the GEMMs on TF32 tensor cores (see the top of this
 *         file);
 *   fp32  every GEMM in plain fp32 without tensor cores: for telling TF32
 *         rounding from a bug when comparing with the CPU.
 * Fixed once kernels_cuda() has handed out act_bytes. */
enum { MM_TF32 = 0, MM_BF16 = 1, MM_FP32 = 2 };
static int mm_mode = MM_BF16, mm_fixed;

static int mm_parse(const char *e) {
    return !e ? -2 : strcmp(e, "bf16") == 0 ? MM_BF16 : strcmp(e, "tf32") == 0 ? MM_TF32 : strcmp(e, "fp32") == 0 ? MM_FP32 : -2;
}

static int matmul_mode(void) { return mm_mode; }

extern "C" void kernels_cuda_set_compute_dtype(const char *dtype) {
    int m = mm_parse(dtype);
    if (m == -2) die(EXIT_INTERNAL, "kernels_cuda_set_compute_dtype(\"%s\"): expected bf16, tf32 or fp32", dtype ? dtype : "(null)");
    if (mm_fixed && m != mm_mode)
        die(EXIT_INTERNAL, "kernels_cuda_set_compute_dtype(\"%s\") after kernels_cuda() (the [a] buffers' width is handed out)", dtype);
    mm_mode = m;
}

static int matmul_bf16(void) { return matmul_mode() == MM_BF16; }

/* dst[i] = src[i] as DT (fp32 to bf16 to nearest even, bf16 to fp32
 * exactly); VEC: PW_E elements a thread up to the last whole group, both
 * pointers 16-byte aligned, then the n % PW_E left an element a thread */
template <bool VEC, typename DT, typename ST> __global__ void convert_k(DT *dst, const ST *src, size_t n) {
    size_t done = 0;
    if constexpr (VEC) {
        done = n / PW_E * PW_E;
        GRID_STRIDE(g, n / PW_E) {
            float v[PW_E];
            ldn<PW_E>(src + g * PW_E, v);
            stn<PW_E>(dst + g * PW_E, v);
        }
    }
    GRID_STRIDE(i, n - done) act_st(dst, done + i, act_ld(src, done + i));
}

static long vec_convert_calls;
extern "C" long kernels_cuda_vec_convert_calls(void) { return vec_convert_calls; }

template <typename DT, typename ST> static void convert(DT *dst, const ST *src, size_t n) {
    if (!n) return;
    if (aligned16(dst) && aligned16(src)) {
        convert_k<true, DT, ST><<<grid_for(n / PW_E + 1, 256), 256>>>(dst, src, n);
        vec_convert_calls++;
    } else convert_k<false, DT, ST><<<grid_for(n, 256), 256>>>(dst, src, n);
    LAUNCH_CHECK();
}

/* n floats to n bf16 at dst (to nearest even), and back */
static void to_bf16(void *dst, const float *src, size_t n) { convert((__nv_bfloat16 *)dst, src, n); }

static void to_f32(float *dst, const void *src, size_t n) { convert(dst, (const __nv_bfloat16 *)src, n); }

static Scratch sc_bf16_a, sc_bf16_b;

static const void *bf16_copy(Scratch *s, const float *x, size_t n) {
    void *d = scratch_get(s, n * sizeof(__nv_bfloat16));
    to_bf16(d, x, n);
    return d;
}

/* n bf16 values at x widened into fp32 scratch (an [a] buffer for kernels
 * that read fp32) */
static const float *f32_copy(Scratch *s, const void *x, size_t n) {
    float *d = (float *)scratch_get(s, n * sizeof(float));
    to_f32(d, x, n);
    return d;
}

/* ---- bf16 copies of stable weights (Kernels.weights_stable) ----
 * Under bf16 GEMMs a product's weight operand is converted to bf16 first.
 * Inside a range the model has declared stable the conversion is kept,
 * keyed by the weight's pointer and size, and every later product that
 * reads the same weights takes it until a call overlapping the range, or
 * the memory's free, says they changed: the backward's input-gradient GEMM
 * and an activation-checkpointing recompute read the forward's copy. A
 * copy's memory is allocated at its key's first use and kept (the pool
 * slots of sharded training reuse theirs), so later steps allocate nothing;
 * past WC_ENTRIES keys products convert into scratch as outside a range.
 * Past WC_RANGES ranges the oldest ends (a model declares each chunk just
 * before its products).
 * The flat copy: when adamw_multi updates weights that start a declared
 * range and products have copied some of them (an unsharded model's), the
 * range gets one bf16 copy of all its weights (wc_flat), the entries inside
 * it become views of it (their own copies freed first), and AdamW writes
 * the copy of each weight it updates in the same pass, so the next step
 * converts nothing (adamw_multi returns 1 and the trainer keeps the
 * declaration). At most one flat copy; it goes with its weights' memory. */
#define WC_RANGES 256
#define WC_ENTRIES 4096
typedef struct {
    const float *w;
    size_t n;
    void *bf;
    int current;
    int view; /* bf points into wc_flat, not a copy of its own */
} WcEntry;
static WcEntry wc[WC_ENTRIES];
static int wc_n;
static struct {
    const float *p;
    size_t n;
    __nv_bfloat16 *bf;
} wc_flat;
static struct {
    const float *p;
    size_t n;
} wc_range[WC_RANGES];
static int wc_nr;
static long wc_hits, wc_made;
static size_t wc_bytes;

extern "C" void kernels_cuda_weight_cache_stats(long *hits, long *made, size_t *bytes) {
    if (hits) *hits = wc_hits;
    if (made) *made = wc_made;
    if (bytes) *bytes = wc_bytes;
}

/* byte ranges [a, a + na) and [b, b + nb) share a byte */
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    return (const char *)a < (const char *)b + nb && (const char *)b < (const char *)a + na;
}

/* every copy overlapping [p, p + bytes) is stale; p NULL: every copy */
static void wc_stale(const void *p, size_t bytes) {
    for (int i = 0; i < wc_n; i++)
        if (!p || overlaps(wc[i].w, wc[i].n * sizeof(float), p, bytes)) wc[i].current = 0;
}

/* every range overlapping [p, p + bytes) ends; p NULL: every range */
static void wc_end_ranges(const void *p, size_t bytes) {
    int k = 0;
    for (int i = 0; p && i < wc_nr; i++)
        if (!overlaps(wc_range[i].p, wc_range[i].n * sizeof(float), p, bytes)) wc_range[k++] = wc_range[i];
    wc_nr = k;
}

static void cu_weights_stable(const float *p, size_t n) {
    wc_stale(p, n * sizeof(float));
    wc_end_ranges(p, n * sizeof(float));
    if (!p || !n) return;
    if (wc_nr == WC_RANGES) { /* full: the oldest range ends (its products are long done) */
        wc_stale(wc_range[0].p, wc_range[0].n * sizeof(float));
        memmove(wc_range, wc_range + 1, (WC_RANGES - 1) * sizeof wc_range[0]);
        wc_nr--;
    }
    wc_range[wc_nr].p = p;
    wc_range[wc_nr].n = n;
    wc_nr++;
}

/* the flat copy goes, and the entries that are views of it */
static void wc_flat_drop(void) {
    if (!wc_flat.bf) return;
    for (int i = 0; i < wc_n;) {
        if (wc[i].view) wc[i] = wc[--wc_n];
        else i++;
    }
    dev_free(wc_flat.bf, wc_flat.n * sizeof(__nv_bfloat16));
    wc_bytes -= wc_flat.n * sizeof(__nv_bfloat16);
    memset(&wc_flat, 0, sizeof wc_flat);
}

/* cu_free of [p, p + bytes): its copies go with it, and its ranges */
static void wc_forget(const void *p, size_t bytes) {
    if (wc_flat.bf && overlaps(wc_flat.p, wc_flat.n * sizeof(float), p, bytes)) wc_flat_drop();
    for (int i = 0; i < wc_n;) {
        if (overlaps(wc[i].w, wc[i].n * sizeof(float), p, bytes)) {
            if (!wc[i].view) {
                dev_free(wc[i].bf, wc[i].n * sizeof(__nv_bfloat16));
                wc_bytes -= wc[i].n * sizeof(__nv_bfloat16);
            }
            wc[i] = wc[--wc_n];
        } else {
            i++;
        }
    }
    wc_end_ranges(p, bytes);
}

/* [w, w + n) lies in [p, p + np) */
static int inside(const float *w, size_t n, const float *p, size_t np) { return w >= p && w + n <= p + np; }

/* the copy of [w, w + n) can be a view of the flat copy: inside it and
 * 16-byte aligned there, as a copy of its own is (the products' fast
 * algorithms need it); any other keeps a copy of its own, which an AdamW
 * over its weights leaves stale */
static int flat_view_ok(const float *w, size_t n) {
    return inside(w, n, wc_flat.p, wc_flat.n) && (w - wc_flat.p) % 8 == 0;
}

static int wc_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMTRAIN_CUDA_WEIGHT_CACHE");
        on = !e || !*e || strcmp(e, "1") == 0 ? 1 : strcmp(e, "0") == 0 ? 0 : -2;
        if (on == -2) die(EXIT_USAGE, "LLMTRAIN_CUDA_WEIGHT_CACHE=%s: expected 0 or 1", e);
    }
    return on;
}

/* The bf16 copy of the n weights at w for a bf16 product: current, made
 * now, or NULL when w is in no stable range (the caller converts into
 * scratch) */
static const void *wc_get(const float *w, size_t n) {
    if (!wc_enabled()) return NULL;
    int stable = 0;
    for (int i = 0; i < wc_nr && !stable; i++)
        stable = inside(w, n, wc_range[i].p, wc_range[i].n);
    if (!stable) return NULL;
    WcEntry *e = NULL;
    for (int i = 0; i < wc_n && !e; i++)
        if (wc[i].w == w && wc[i].n == n) e = &wc[i];
    if (!e) {
        if (wc_n == WC_ENTRIES) return NULL;
        e = &wc[wc_n++];
        e->w = w;
        e->n = n;
        e->current = 0;
        e->view = wc_flat.bf && flat_view_ok(w, n);
        if (e->view) {
            e->bf = wc_flat.bf + (w - wc_flat.p);
        } else {
            DEV_MALLOC(&e->bf, n * sizeof(__nv_bfloat16));
            wc_bytes += n * sizeof(__nv_bfloat16);
        }
    }
    if (e->current) {
        wc_hits++;
        return e->bf;
    }
    to_bf16(e->bf, w, n);
    e->current = 1;
    wc_made++;
    return e->bf;
}

static void gelu_into(float *out, const float *pre, size_t n, int bf16);
static void dgelu_inplace(float *d, const float *pre, size_t n, int bf16);
static Scratch sc_bias16;
static long fused_gelu_calls, fused_dgelu_calls;

extern "C" long kernels_cuda_fused_gelu_calls(void) { return fused_gelu_calls; }
extern "C" long kernels_cuda_fused_dgelu_calls(void) { return fused_dgelu_calls; }

/* Row-major, like cblas: C[M,N] = alpha op(A) op(B) + beta C (+ bias[N] per
 * row), batched with element strides sA, sB, sC. In column-major terms this
 * is C^T = op(B)^T op(A)^T, so cuBLAS sees m = N, n = M. bf16: convert A
 * and B (unbatched, each a dense rows x ld block) to bf16 first.
 * gelu_pre != NULL (unbatched, beta 0, ldc = N): gelu_pre receives that
 * result and C its GELU: one GEMM with the GELU_AUX(_BIAS) epilogue when
 * cuBLASLt allows it (aux ld a multiple of 8, C and aux 16-byte aligned, a
 * fused or no bias, and an algorithm for it), else the GEMM into gelu_pre
 * and the GELU kernel.
 * dgelu_pre != NULL (unbatched, beta 0, no bias; dgelu_pre [M, N] with ld
 * ldc): C = the product times gelu'(dgelu_pre), the GELU's backward: one
 * GEMM with the DGELU epilogue when cuBLASLt allows it (ldc a multiple of
 * 8, dgelu_pre 16-byte aligned, an algorithm for it), else the GEMM and an
 * in-place kernel.
 * c_bf16 (unbatched bf16 operands, beta 0): C is bf16, cuBLASLt rounding
 * the fp32 result to nearest, and so are gelu_pre and dgelu_pre (the GELU
 * epilogues' aux has D's type); the bias epilogue takes a bf16 copy of the
 * fp32 bias (its vector has D's type too), and the unfused forms round
 * each kernel's fp32 result once more.
 * c_in != NULL (unbatched, fp32 C): the beta term reads c_in (with C's ld)
 * instead of C, and the result goes to C (cuBLASLt's separate C and D: the
 * residual add fused into the product, matmul_forward_res). */
static void rm_gemm_core(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long long sA,
                         const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch,
                         const float *bias, int bf16, float *gelu_pre, const void *A_bf16, const void *B_bf16,
                         const float *dgelu_pre, int c_bf16, const float *c_in) {
    if (M <= 0 || N <= 0) return;
    if (c_in && (batch != 1 || c_bf16 || gelu_pre || dgelu_pre))
        die(EXIT_INTERNAL, "cuda gemm: a separate C input wants an unbatched fp32 product without a GELU");
    if (c_bf16 && (!bf16 || batch != 1 || beta != 0.0f))
        die(EXIT_INTERNAL, "cuda gemm: a bf16 output wants bf16 operands, no batch and beta 0");
    if (K <= 0) die(EXIT_INTERNAL, "cuda gemm: K = %d", K);
    if (bf16 && batch != 1) die(EXIT_INTERNAL, "cuda gemm: bf16 operands for a batched GEMM");
    if (gelu_pre && (batch != 1 || beta != 0.0f || ldc != N))
        die(EXIT_INTERNAL, "cuda gemm: the GELU form wants an unbatched dense product with beta 0");
    if (dgelu_pre && (batch != 1 || beta != 0.0f || bias || gelu_pre))
        die(EXIT_INTERNAL, "cuda gemm: the GELU backward form wants an unbatched product with beta 0 and no bias");
    const void *Ap = A, *Bp = B;
    if (bf16) { /* A_bf16 / B_bf16: that operand is bf16 already (an [a] activation, or converted by the caller) */
        Ap = A_bf16 ? A_bf16 : bf16_copy(&sc_bf16_a, A, (size_t)(ta ? K : M) * (size_t)lda);
        Bp = B_bf16 ? B_bf16 : bf16_copy(&sc_bf16_b, B, (size_t)(tb ? N : K) * (size_t)ldb);
    }
    /* the epilogue's bias: fp32, or under a bf16 C a bf16 copy */
    const void *bias_ep = bias && c_bf16 ? bf16_copy(&sc_bias16, bias, (size_t)N) : (const void *)bias;
    GemmPlan key;
    memset(&key, 0, sizeof key);
    key.bf16 = bf16;
    key.c_bf16 = c_bf16;
    key.ta = ta; key.tb = tb; key.M = M; key.N = N; key.K = K;
    /* bias: 0 none, 1 added by a kernel, 2 fused epilogue (16-byte aligned
     * vectors only: cuBLASLt has no alignment preference for the bias) */
    key.bias = !bias ? 0 : ((uintptr_t)bias_ep % 16 == 0 && batch == 1) ? 2 : 1;
    key.lda = lda; key.ldb = ldb; key.ldc = ldc; key.batch = batch;
    key.sA = batch > 1 ? sA : 0; key.sB = batch > 1 ? sB : 0; key.sC = batch > 1 ? sC : 0;
    int es = bf16 ? 2 : 4;
    key.al_a = alignment_of(Ap, lda, key.sA, es);
    key.al_b = alignment_of(Bp, ldb, key.sB, es);
    key.al_c = alignment_of(C, ldc, key.sC, c_bf16 ? 2 : 4);
    if (c_in) { /* C and D share the layout and the algorithm: the alignment both have */
        int al_in = alignment_of(c_in, ldc, 0, 4);
        if (al_in < key.al_c) key.al_c = al_in;
    }
    if (gelu_pre) { /* D is C or, unfused, gelu_pre: the alignment both have */
        key.al_aux = alignment_of(gelu_pre, ldc, 0, c_bf16 ? 2 : 4);
        if (key.al_aux < key.al_c) key.al_c = key.al_aux;
        key.gelu = ldc % 8 == 0 && key.al_c >= 16 && key.bias != 1 ? GEMM_GELU_AUX : 0;
    }
    if (dgelu_pre) { /* aux is only read: C keeps its own alignment */
        key.al_aux = alignment_of(dgelu_pre, ldc, 0, c_bf16 ? 2 : 4);
        key.gelu = ldc % 8 == 0 && key.al_aux >= 16 ? GEMM_DGELU : 0;
    }
    GemmPlan *p = NULL;
    for (int i = 0; i < MAX_PLANS && plans[i].used; i++) {
        GemmPlan *q = &plans[i];
        if (q->ta == key.ta && q->tb == key.tb && q->M == M && q->N == N && q->K == K && q->lda == lda &&
            q->ldb == ldb && q->ldc == ldc && q->batch == batch && q->bias == key.bias && q->sA == key.sA &&
            q->sB == key.sB && q->sC == key.sC && q->al_a == key.al_a && q->al_b == key.al_b && q->al_c == key.al_c &&
            q->bf16 == key.bf16 && q->c_bf16 == key.c_bf16 && q->gelu == key.gelu && q->al_aux == key.al_aux) {
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
        const void *aux = key.gelu == GEMM_DGELU ? (const void *)dgelu_pre : gelu_pre;
        for (int c = 0; c < 2 && !ok; c++)
            ok = (key.gelu && plan_build(p, key.bias == 2, key.gelu, aux, ct[c])) ||
                 (key.bias == 2 && plan_build(p, 1, 0, NULL, ct[c])) || plan_build(p, 0, 0, NULL, ct[c]);
        if (!ok)
            die(EXIT_INTERNAL, "cuBLASLt has no algorithm for a %dx%dx%d %s GEMM (ta %d tb %d, batch %d, alignment %d/%d/%d)",
                M, N, K, c_bf16 ? "bf16 -> bf16" : bf16 ? "bf16" : "fp32", ta, tb, batch, key.al_a, key.al_b, key.al_c);
    }
    if (p->epi_bias) {
        const void *bp = bias_ep;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    }
    if (p->epi_gelu) {
        const void *ap = p->epi_gelu == GEMM_DGELU ? (const void *)dgelu_pre : gelu_pre;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof ap));
        if (p->epi_gelu == GEMM_DGELU) fused_dgelu_calls++;
        else fused_gelu_calls++;
    }
    float *D = gelu_pre && !p->epi_gelu ? gelu_pre : C; /* unfused GELU: the product goes to gelu_pre */
    const void *Cp = c_in ? (const void *)c_in : (const void *)D;
    CUBLAS_CHECK(cublasLtMatmul(G.lt, p->desc, &alpha, Bp, p->la, Ap, p->lb, &beta, Cp, p->lc, D, p->lc, &p->algo,
                                G.ws, G.ws_bytes, 0));
    launch_check_("cublasLtMatmul", __FILE__, __LINE__);
    if (bias && !p->epi_bias) {
        if (batch > 1) die(EXIT_INTERNAL, "cuda gemm: unfused bias with a batched GEMM");
        if (c_bf16) add_bias_k<__nv_bfloat16><<<grid_for((size_t)M * N, 256), 256>>>(ACT16(D), bias, M, N, ldc);
        else add_bias_k<float><<<grid_for((size_t)M * N, 256), 256>>>(D, bias, M, N, ldc);
        LAUNCH_CHECK();
    }
    if (gelu_pre && !p->epi_gelu) gelu_into(C, gelu_pre, (size_t)M * N, c_bf16);
    if (dgelu_pre && !p->epi_gelu) {
        if (ldc != N) die(EXIT_INTERNAL, "cuda gemm: the unfused GELU backward wants a dense product");
        dgelu_inplace(C, dgelu_pre, (size_t)M * N, c_bf16);
    }
}

static void rm_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long long sA,
                    const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch,
                    const float *bias) {
    rm_gemm_core(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, bias, 0, NULL, NULL, NULL,
                 NULL, 0, NULL);
}

/* inp is [a]: under bf16 it goes to cuBLASLt as it is */
static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    const int bf16 = act_bf16();
    rm_gemm_core(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, bf16, NULL, bf16 ? inp : NULL,
                 bf16 ? wc_get(w, (size_t)OC * C) : NULL, NULL, 0, NULL);
}

/* out = res + inp @ w^T (+ bias): one GEMM, beta 1 reading res as its C
 * and writing out as its D, so the product never goes through memory on
 * its own (inp is [a]; res and out fp32, the residual stream) */
static void matmul_forward_res(float *out, const float *res, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    const int bf16 = act_bf16();
    rm_gemm_core(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 1.0f, out, OC, 0, 1, bias, bf16, NULL, bf16 ? inp : NULL,
                 bf16 ? wc_get(w, (size_t)OC * C) : NULL, NULL, 0, res);
}

/* pre = inp @ w^T + bias, out = gelu(pre): one GEMM with cuBLASLt's GELU
 * epilogue where it applies (see rm_gemm_core), else matmul + the GELU
 * kernel. inp, pre and out are [a]: under bf16 the epilogue writes both
 * outputs as bf16 (pre rounded, out the GELU of the fp32 pre rounded; the
 * bias a bf16 copy), and the next GEMM reads out, the backward's DGELU
 * epilogue pre, with no conversion pass. */
static void matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w, const float *bias, int N,
                                int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    const int bf16 = act_bf16();
    rm_gemm_core(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, bf16, pre, bf16 ? inp : NULL,
                 bf16 ? wc_get(w, (size_t)OC * C) : NULL, NULL, bf16, NULL);
}

static long dout_convert_calls;
extern "C" long kernels_cuda_dout_convert_calls(void) { return dout_convert_calls; }

/* matmul_backward's three products; dinp (ld ldd) is overwritten with
 * dout @ w, times gelu'(dgelu_pre) when that is given.
 * dout_bf16: dout is bf16 itself (an [a] buffer under bf16; the bias
 * gradient sums those bf16 values); dinp_bf16: dinp (and dgelu_pre) are
 * bf16, the GEMM rounding its fp32 result (the GELU MLP's [a] d(pre));
 * dout_a: an fp32 dout's values as [a] (kernels.h), which the bf16 GEMMs
 * read instead of a conversion of dout (NULL: none) */
static void matmul_backward_core(float *dinp, int ldd, const float *dgelu_pre, float *dw, float *dbias,
                                 const float *dout, const float *dout_a, const float *inp, const float *w, int N,
                                 int C, int OC, int dout_bf16, int dinp_bf16) {
    int bf16 = matmul_bf16();
    if (dout_bf16 && !bf16) die(EXIT_INTERNAL, "cuda matmul backward: a bf16 dout without bf16 GEMMs");
    /* bf16: dout, the A operand of both products, is converted once (but
     * where the caller has its copy, dout_a); with a bias gradient of an
     * fp32 dout, by the bias gradient's pass over it */
    const int have_a = bf16 && !dout_bf16 && dout_a;
    const int sum_copy = bf16 && !dout_bf16 && !have_a && dbias && (dinp || dw);
    const void *db = dout_bf16 ? (const void *)dout : have_a ? (const void *)dout_a : NULL;
    if (sum_copy) {
        __nv_bfloat16 *c = (__nv_bfloat16 *)scratch_get(&sc_bf16_a, (size_t)N * OC * sizeof(__nv_bfloat16));
        colsum_add_copy(COL_PLAIN, dbias, NULL, dout, NULL, NULL, NULL, N, OC, 0, c);
        db = c;
        dout_convert_calls++;
    } else if (bf16 && !dout_bf16 && !have_a && dinp && dw) {
        db = bf16_copy(&sc_bf16_a, dout, (size_t)N * OC);
        dout_convert_calls++;
    }
    if (dinp)
        rm_gemm_core(0, 0, N, C, OC, 1.0f, dout, OC, 0, w, C, 0, 0.0f, dinp, ldd, 0, 1, NULL, bf16, NULL, db,
                     bf16 ? wc_get(w, (size_t)OC * C) : NULL, dgelu_pre, dinp_bf16, NULL);
    /* inp is [a]: bf16 as it is under bf16; a fresh dw's first product
     * stores it (beta 0: the gradient memory is neither zeroed nor read) */
    if (dw)
        rm_gemm_core(1, 0, OC, C, N, 1.0f, dout, OC, 0, inp, C, 0, grad_first(dw, (size_t)OC * C) ? 0.0f : 1.0f, dw,
                     C, 0, 1, NULL, bf16, NULL, db, bf16 ? inp : NULL, NULL, 0, NULL);
    if (dbias && !sum_copy) colsum_add(COL_PLAIN, dbias, NULL, dout, NULL, NULL, NULL, N, OC, dout_bf16);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                            int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    matmul_backward_core(dinp, C, NULL, dw, dbias, dout, NULL, inp, w, N, C, OC, 0, 0);
}

/* [a] out / dout (kernels.h; the LM head, the SwiGLU up-projection, the qkv
 * projection): under bf16 the GEMM writes bf16 out (cuBLASLt rounds the
 * fp32 accumulator plus the bias, a bf16 copy, to nearest), and the
 * backward reads the bf16 dout as it is (its bias gradient too) */
static void matmul_forward_a(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (!act_bf16()) {
        matmul_forward(out, inp, w, bias, N, C, OC);
        return;
    }
    rm_gemm_core(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, 1, NULL, inp,
                 wc_get(w, (size_t)OC * C), NULL, 1, NULL);
}

static void matmul_backward_a(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                              const float *w, int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    matmul_backward_core(dinp, C, NULL, dw, dbias, dout, NULL, inp, w, N, C, OC, act_bf16(), 0);
}

/* dinp is [a] (the attention output projection's: attention_backward's
 * dout): under bf16 the input-gradient GEMM writes it as bf16, cuBLASLt
 * rounding the fp32 accumulator to nearest */
static void matmul_backward_dinp_a(float *dinp, float *dw, float *dbias, const float *dout, const float *dout_a,
                                   const float *inp, const float *w, int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    matmul_backward_core(dinp, C, NULL, dw, dbias, dout, dout_a, inp, w, N, C, OC, 0, act_bf16());
}

static void swiglu_bwd_inplace(float *d, const float *pre, int N, int F);
static void swiglu_bwd_act(float *dpre, const float *dh, const float *pre, int N, int F);
static Scratch sc_dh;

/* dpre = gelu'(pre) . (dout @ w), overwritten: the DGELU epilogue on the
 * input-gradient GEMM (or the GEMM and dgelu_inplace). pre and dpre are
 * [a]: under bf16 the epilogue reads the bf16 pre and writes the bf16
 * gradient, which the up-projection's matmul_backward_a takes as it is */
static void matmul_gelu_backward(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
                                 const float *inp, const float *w, const float *pre, int N, int C, int OC) {
    if (N <= 0 || C <= 0) return;
    if (OC <= 0) {
        if (dpre) cu_zero(dpre, (size_t)N * C * (act_bf16() ? 2 : 4));
        return;
    }
    matmul_backward_core(dpre, C, dpre ? pre : NULL, dw, dbias, dout, dout_a, inp, w, N, C, OC, 0, act_bf16());
}

/* pre and dpre [N, 2C] ([a]): dh = dout @ w, then (d gate | d up) from dh
 * and pre. fp32 [a]: dh goes into dpre's gate columns (ld 2C, beta 0) and
 * becomes the gradients in place; bf16 [a]: the GEMM writes dh as bf16
 * scratch (rounded once from its fp32 accumulator, as every activation
 * gradient the bf16 GEMMs hand on), and one kernel writes the bf16
 * gradients from it and the bf16 pre (each rounded once from its fp32
 * arithmetic, the up-projection's backward then reading them with no
 * conversion pass). dh in bf16, not fp32: on the Llama 1B shape a
 * layer's dh is 134 MB as fp32, written by the GEMM and read back. */
static void matmul_swiglu_backward(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
                                   const float *inp, const float *w, const float *pre, int N, int C, int OC) {
    if (N <= 0 || C <= 0) return;
    if (OC <= 0) {
        if (dpre) cu_zero(dpre, (size_t)N * 2 * C * (act_bf16() ? 2 : 4));
        return;
    }
    if (act_bf16() && dpre) {
        float *dh = (float *)scratch_get(&sc_dh, (size_t)N * C * sizeof(__nv_bfloat16));
        matmul_backward_core(dh, C, NULL, dw, dbias, dout, dout_a, inp, w, N, C, OC, 0, 1);
        swiglu_bwd_act(dpre, dh, pre, N, C);
        return;
    }
    matmul_backward_core(dpre, 2 * C, NULL, dw, dbias, dout, dout_a, inp, w, N, C, OC, 0, 0);
    if (dpre) swiglu_bwd_inplace(dpre, pre, N, C);
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

/* The first key query q of a sequence may attend to: qs[q] (qs its row of
 * a block-causal mask's qstart, its document's first token), or 0 without
 * one (qs NULL); rows past T, which are never stored, take 0 */
__device__ __forceinline__ int att_start(const int *qs, int q, int T) { return qs && q < T ? qs[q] : 0; }

/* one block per row of a pass's scores ([B*T] rows of T): softmax over
 * [s, t] (s = att_start), zero elsewhere; the scores arrive scaled.
 * lse[(e*nh + h)*T + t] gets the row's log-sum-exp. */
__global__ void causal_softmax_lse_k(float *p, float *lse, const int *qstart, int T, int nh, int h) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T), s0 = att_start(qstart ? qstart + e * T : NULL, t, T);
    float *x = p + row * T;
    float m = -INFINITY;
    for (int j = s0 + (int)threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = s0 + (int)threadIdx.x; j <= t; j += blockDim.x) s += expf(x[j] - m);
    s = block_sum(s);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < T; j += blockDim.x) x[j] = j >= s0 && j <= t ? expf(x[j] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[(e * nh + h) * T + t] = m + logf(s);
}

/* the backward's probabilities again: scaled scores -> exp(s - lse) on
 * [s, t], zero elsewhere */
__global__ void causal_exp_lse_k(float *p, const float *lse, const int *qstart, int T, int nh, int h) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T), s0 = att_start(qstart ? qstart + e * T : NULL, t, T);
    float *x = p + row * T;
    float l = lse[(e * nh + h) * T + t];
    for (int j = threadIdx.x; j < T; j += blockDim.x) x[j] = j >= s0 && j <= t ? expf(x[j] - l) : 0.0f;
}

/* dP -> dS in place for one pass: dS = P * (dP - D) * scale with D the row's
 * dO . O (= sum P * dP); row r belongs to batch entry e = r / T, whose out
 * and dout rows start at e*so + t*OS + o. P is zero outside [s, t], so dS is. */
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

// ----------------------------------------------------------------------------
// attention, fused (train.attention_kernel flash): flash-style kernels that
// never hold more than one tile of scores
//
// Hooks of the region below, which compiles as plain C++ too (a host
// emulation of the kernels runs it with threads for the threads of a block):
// the dynamic shared memory and a scratch buffer (its per-block limit and
// the launch are smem_limit and launch_smem, above).

__device__ __forceinline__ float *fl_smem() {
    extern __shared__ __align__(16) float fl_dyn_smem[];
    return fl_dyn_smem;
}

/* TF32 tensor cores (sm_80 and newer) unless compute dtype fp32,
 * which keeps every product in plain fp32, the fused attention's too */
static int fl_tensor_cores(void) { return G.prop.major >= 8 && matmul_mode() != MM_FP32; }

/* bf16 tensor cores (mma.sync, the region after the TF32 kernels) under
 * compute dtype bf16 on sm_80 and newer */
static int fl_bf16(void) { return G.prop.major >= 8 && matmul_bf16(); }

static Scratch sc_flash;
static float *fl_scratch(size_t bytes) { return (float *)scratch_get(&sc_flash, bytes); }

// ---- flash attention region: begin ----
/* Causal attention in tiles, fp32 in and out. A block of FL_THREADS = 128
 * threads (4 warps) is also a 16 x 8 grid: thread (ty, tx) = (tid / 8,
 * tid % 8) owns RM = rows / 16 consecutive rows ty*RM .. ty*RM+RM-1 of its
 * block's row tile; in a score tile it holds the columns tx, tx + 8, tx +
 * 16, ..., and in a head-dim-wide accumulator the columns tx*4 + 32*jj +
 * {0,1,2,3}. The 8 threads of a row group are 8 consecutive lanes of one
 * warp, so row maxima and sums are 3 shuffles. Shared tiles are row-major
 * with rows padded by 4 floats (HD + 4: the 8 lanes of a 16-byte access
 * phase read 8 different rows in 8 different bank quads); probability / dS
 * tiles are stored transposed, [key][row], so a thread reads its RM rows as
 * one vector.
 *
 * The tile products come in two forms (template parameter TC): plain fp32
 * FMA, scores and accumulators in registers (fl_dot, fl_acc); or TF32
 * tensor cores through wmma (m16n16k8, operands rounded to TF32 with
 * cvt.rna, fp32 accumulation; sm_80 and newer), each warp taking every 4th
 * 16 x 16 output tile: score tiles are stored to shared memory in the
 * transposed layout above and read back by their owner threads (the mask
 * and softmax code is the same for both forms), dQ/dK/dV accumulate in
 * fragments for the whole block, and the forward's output, which the online
 * softmax rescales row by row, adds each tile's P V through shared memory.
 * The wmma fragment layouts are never assumed: only load/store/mma.
 *
 * Forward: one block per (b, h, query tile), the key tiles up to the
 * diagonal with an online softmax (running max m and sum l per row, the
 * output rescaled by exp(m_old - m_new)); saves lse = m + log(l).
 * Backward: D = rowsum(dO * O) first (flash_dot_k), then
 *   dQ:     one block per (b, h, query tile) over its key tiles;
 *   dK, dV: one block per (b, kv head, key tile) over the group's query
 *           heads in order and, for each, the query tiles from the
 *           diagonal on;
 * both recompute P = exp(s - lse), dS = P * (dO.V - D) * scale. Every
 * output row is owned by one block that sums in a fixed order: no atomics,
 * the same bits from run to run. Tiles wholly above the diagonal are never
 * visited; rows past T are loaded as zeros and masked. */

#define FL_THREADS 128

/* Dynamic shared memory is asked for with FL_SMEM_SLACK bytes to spare and
 * used from the first 128-byte boundary (wmma wants 32-byte aligned tiles;
 * the language promises less for the base than it usually gets) */
#define FL_SMEM_SLACK 128
__device__ __forceinline__ float *fl_base() {
    float *p = fl_smem();
    return p + ((128u - ((unsigned)(uintptr_t)p & 127u)) & 127u) / sizeof(float);
}

/* N (4 or 2) consecutive floats, aligned to N floats */
template <int N> __device__ __forceinline__ void fl_ld(float (&r)[N], const float *p) {
    if constexpr (N == 4) {
        float4 v = *(const float4 *)p;
        r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
    } else {
        static_assert(N == 2, "fl_ld: 2 or 4 floats");
        float2 v = *(const float2 *)p;
        r[0] = v.x; r[1] = v.y;
    }
}

template <int N> __device__ __forceinline__ void fl_st(float *p, const float (&r)[N]) {
    if constexpr (N == 4) {
        *(float4 *)p = make_float4(r[0], r[1], r[2], r[3]);
    } else {
        static_assert(N == 2, "fl_st: 2 or 4 floats");
        *(float2 *)p = make_float2(r[0], r[1]);
    }
}

/* max and sum over the 8 lanes of a row group (lanes differing in bits 0-2) */
__device__ __forceinline__ float fl_max8(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
}

__device__ __forceinline__ float fl_sum8(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

/* Rows [r0, r0 + R) of one head's [T, HD] slice of a row-major array (row
 * stride `stride` floats, g at row 0 of the head) into sm[R][HD + 4]; rows
 * at or past T as zeros. 16-byte loads, consecutive threads along a row. */
template <int HD, int R>
__device__ __forceinline__ void fl_load(float *sm, const float *__restrict__ g, size_t stride, int r0, int T,
                                        int tid) {
    constexpr int V4 = HD / 4;
    for (int f = tid; f < R * V4; f += FL_THREADS) {
        const int r = f / V4, c = (f % V4) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r0 + r < T) v = *(const float4 *)(g + (size_t)(r0 + r) * stride + c);
        *(float4 *)(sm + r * (HD + 4) + c) = v;
    }
}

/* the K and V rows [k0, k0 + R) of kv head kh of one sequence (seq at its
 * row 0 in qkv) into Ks and Vs */
template <int HD, int R>
__device__ __forceinline__ void fl_load_kv(float *Ks, float *Vs, const float *__restrict__ seq, int nh, int nkv,
                                           int kh, int k0, int T, int tid) {
    const size_t S = (size_t)(nh + 2 * nkv) * HD;
    fl_load<HD, R>(Ks, seq + (size_t)(nh + kh) * HD, S, k0, T, tid);
    fl_load<HD, R>(Vs, seq + (size_t)(nh + nkv + kh) * HD, S, k0, T, tid);
}

/* row[tx*4 + 32jj + e] = a[4jj + e] (row at column tx*4 of a head; dqkv
 * is overwritten, each element by the one block that computes it whole) */
template <int HD> __device__ __forceinline__ void fl_put_row(float *row, const float (&a)[HD / 8]) {
#pragma unroll
    for (int jj = 0; jj < HD / 32; jj++)
        *(float4 *)(row + 32 * jj) = make_float4(a[4 * jj], a[4 * jj + 1], a[4 * jj + 2], a[4 * jj + 3]);
}

/* A block of the forward or dQ kernel, grid (B * nh, query tiles), the
 * last query tile (most key tiles) first: sequence b, query head h, its kv
 * head kh, query rows [q0, q0 + BM), key tiles [kt0, nkt) up to the
 * diagonal (kt0 0, or under a block-causal mask the tile of the first
 * row's qstart, the smallest of the block's); qs: row b's qstart or NULL;
 * qkv rows are S floats, out / dout rows OS. */
struct FlQBlock {
    int b, h, kh, q0, kt0, nkt;
    size_t S, OS;
    const int *qs;
};

template <int HD, int BM, int BN>
__device__ __forceinline__ FlQBlock fl_qblock(const int *qstart, int T, int nh, int nkv) {
    FlQBlock k;
    const int bh = (int)blockIdx.x, nqt = (T + BM - 1) / BM;
    k.b = bh / nh;
    k.h = bh % nh;
    k.kh = k.h / (nh / nkv);
    k.q0 = (nqt - 1 - (int)blockIdx.y) * BM;
    k.qs = qstart ? qstart + (size_t)k.b * T : NULL;
    k.kt0 = att_start(k.qs, k.q0, T) / BN;
    k.nkt = ((k.q0 + BM < T ? k.q0 + BM : T) - 1) / BN + 1;
    k.S = (size_t)(nh + 2 * nkv) * HD;
    k.OS = (size_t)nh * HD;
    return k;
}

template <int R, int C> __device__ __forceinline__ void fl_zero(float (&a)[R][C]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < C; c++) a[i][c] = 0.0f;
}

/* The thread's elements of a score tile held transposed in shared memory,
 * X[c][r] with row stride LDX: s[i][j] is row ty*RM + i, column tx + 8j */
template <int RM, int CN, int LDX> __device__ __forceinline__ void fl_get(float (&s)[RM][CN], const float *X, int tid) {
    const int tx = tid & 7, ty = tid >> 3;
#pragma unroll
    for (int j = 0; j < CN; j++) {
        float t[RM];
        fl_ld<RM>(t, X + (tx + 8 * j) * LDX + ty * RM);
#pragma unroll
        for (int i = 0; i < RM; i++) s[i][j] = t[i];
    }
}

template <int RM, int CN, int LDX> __device__ __forceinline__ void fl_put(float *X, const float (&s)[RM][CN], int tid) {
    const int tx = tid & 7, ty = tid >> 3;
#pragma unroll
    for (int j = 0; j < CN; j++) {
        float t[RM];
#pragma unroll
        for (int i = 0; i < RM; i++) t[i] = s[i][j];
        fl_st<RM>(X + (tx + 8 * j) * LDX + ty * RM, t);
    }
}

/* FMA: acc[i][j] = sum_d A[i][d] * Bt[8j][d], d < HD: A at the thread's
 * first row, Bt at its first column's row, both with row stride HD + 4 */
template <int HD, int RM, int CN>
__device__ __forceinline__ void fl_dot(float (&acc)[RM][CN], const float *A, const float *Bt) {
    constexpr int LDH = HD + 4;
    fl_zero(acc);
#pragma unroll 2
    for (int d = 0; d < HD; d += 4) {
        float4 a[RM], b[CN];
#pragma unroll
        for (int i = 0; i < RM; i++) a[i] = *(const float4 *)(A + i * LDH + d);
#pragma unroll
        for (int j = 0; j < CN; j++) b[j] = *(const float4 *)(Bt + 8 * j * LDH + d);
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < CN; j++) {
                acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
                acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
                acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
                acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
            }
    }
}

/* FMA: acc[i][4jj + e] += sum_n Pt[n][i] * M[n][32jj + e], n < NN: Pt at
 * the thread's first row of a transposed [NN][LDP] tile, M at column tx*4
 * of a [NN][HD + 4] tile */
template <int HD, int RM, int LDP, int NN>
__device__ __forceinline__ void fl_acc(float (&acc)[RM][HD / 8], const float *Pt, const float *M) {
    constexpr int LDH = HD + 4;
#pragma unroll 4
    for (int n = 0; n < NN; n++) {
        float p[RM];
        fl_ld<RM>(p, Pt + n * LDP);
#pragma unroll
        for (int jj = 0; jj < HD / 32; jj++) {
            const float4 v = *(const float4 *)(M + n * LDH + 32 * jj);
#pragma unroll
            for (int i = 0; i < RM; i++) {
                acc[i][4 * jj + 0] = fmaf(p[i], v.x, acc[i][4 * jj + 0]);
                acc[i][4 * jj + 1] = fmaf(p[i], v.y, acc[i][4 * jj + 1]);
                acc[i][4 * jj + 2] = fmaf(p[i], v.z, acc[i][4 * jj + 2]);
                acc[i][4 * jj + 3] = fmaf(p[i], v.w, acc[i][4 * jj + 3]);
            }
        }
    }
}

/* Tensor cores. 16 x 16 output tile t of a tile grid TR tiles high:
 * rows 16 * (t % TR), columns 16 * (t / TR); warp w takes t = w, w + 4, ... */
namespace wm = nvcuda::wmma;
typedef wm::fragment<wm::accumulator, 16, 16, 8, float> FlFrag;

template <typename F> __device__ __forceinline__ void fl_tf32(F &f) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#pragma unroll
    for (int e = 0; e < f.num_elements; e++) f.x[e] = wm::__float_to_tf32(f.x[e]);
#endif
}

/* acc += A B for the 16 x 8 tile of A at pa and the 8 x 16 tile of B at
 * pb, in layouts LA and LB (row_major / col_major), operands to TF32 */
template <typename LA, typename LB>
__device__ __forceinline__ void fl_mma(FlFrag &acc, const float *pa, int lda, const float *pb, int ldb) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, LA> a;
    wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, LB> b;
    wm::load_matrix_sync(a, pa, lda);
    wm::load_matrix_sync(b, pb, ldb);
    fl_tf32(a);
    fl_tf32(b);
    wm::mma_sync(acc, a, b, acc);
#endif
}

/* X[c][r] = sum_d A[r][d] * Bt[c][d] (d < HD) for r < R, c < N, stored
 * transposed (row stride R + 4): A, Bt row-major with stride HD + 4 */
template <int HD, int R, int N>
__device__ __forceinline__ void fl_dot_tc(float *X, const float *A, const float *Bt, int warp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap(); /* the host runs the FMA kernels below sm_80 */
#else
    constexpr int LDH = HD + 4, LDX = R + 4, TR = R / 16, TILES = TR * (N / 16);
    static_assert(TILES % 4 == 0, "fl_dot_tc: a whole number of tiles per warp");
#pragma unroll
    for (int u = 0; u < TILES / 4; u++) {
        const int t = warp + 4 * u, r0 = t % TR * 16, c0 = t / TR * 16;
        FlFrag acc;
        wm::fill_fragment(acc, 0.0f);
#pragma unroll 2
        for (int k = 0; k < HD; k += 8)
            fl_mma<wm::row_major, wm::col_major>(acc, A + r0 * LDH + k, LDH, Bt + c0 * LDH + k, LDH);
        wm::store_matrix_sync(X + c0 * LDX + r0, acc, LDX, wm::mem_col_major);
    }
#endif
}

/* f (the warp's tiles of an R x HD accumulator) += P M: P [R][NN] given
 * transposed (Pt[n][r], row stride LDP), M [NN][HD + 4] */
template <int HD, int R, int NN, int LDP>
__device__ __forceinline__ void fl_acc_tc(FlFrag (&f)[R * HD / 1024], const float *Pt, const float *M, int warp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    constexpr int LDH = HD + 4, TR = R / 16;
    static_assert(R * HD % 1024 == 0, "fl_acc_tc: a whole number of tiles per warp");
#pragma unroll
    for (int u = 0; u < R * HD / 1024; u++) {
        const int t = warp + 4 * u, r0 = t % TR * 16, c0 = t / TR * 16;
#pragma unroll 2
        for (int k = 0; k < NN; k += 8)
            fl_mma<wm::col_major, wm::row_major>(f[u], Pt + k * LDP + r0, LDP, M + k * LDH + c0, LDH);
    }
#endif
}

template <int N> __device__ __forceinline__ void fl_frag_zero(FlFrag (&f)[N]) {
#pragma unroll
    for (int u = 0; u < N; u++) wm::fill_fragment(f[u], 0.0f);
}

/* the accumulator tiles f of an R x HD product into X[R][HD + 4], then
 * (after a barrier) acc[i][c] += the thread's elements of it; X must be
 * free, and is again after the next barrier */
template <int HD, int R>
__device__ __forceinline__ void fl_frag_add(float (&acc)[R / 16][HD / 8], const FlFrag (&f)[R * HD / 1024], float *X,
                                            int tid) {
    constexpr int LDH = HD + 4, TR = R / 16, RM = R / 16;
    const int warp = tid >> 5, tx = tid & 7, ty = tid >> 3;
#pragma unroll
    for (int u = 0; u < R * HD / 1024; u++) {
        const int t = warp + 4 * u, r0 = t % TR * 16, c0 = t / TR * 16;
        wm::store_matrix_sync(X + r0 * LDH + c0, f[u], LDH, wm::mem_row_major);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int jj = 0; jj < HD / 32; jj++) {
            const float4 v = *(const float4 *)(X + (ty * RM + i) * LDH + tx * 4 + 32 * jj);
            acc[i][4 * jj] += v.x;
            acc[i][4 * jj + 1] += v.y;
            acc[i][4 * jj + 2] += v.z;
            acc[i][4 * jj + 3] += v.w;
        }
}

/* s = the thread's scores A[ty*RM + i] . Bt[tx + 8j] of an R x N tile. TC:
 * the warps' tiles go to X (transposed, row stride R + 4; it must be free)
 * and a barrier makes them visible first */
template <bool TC, int HD, int R, int N>
__device__ __forceinline__ void fl_scores(float (&s)[R / 16][N / 8], const float *A, const float *Bt, float *X,
                                          int tid) {
    if constexpr (TC) {
        fl_dot_tc<HD, R, N>(X, A, Bt, tid >> 5);
        __syncthreads();
        fl_get<R / 16, N / 8, R + 4>(s, X, tid);
    } else {
        fl_dot<HD, R / 16, N / 8>(s, A + (tid >> 3) * (R / 16) * (HD + 4), Bt + (tid & 7) * (HD + 4));
    }
}

/* shared floats of each kernel */
template <bool TC, int HD, int BM, int BN> constexpr size_t fl_fwd_floats() {
    return (size_t)(BM + 2 * BN + (TC ? BM : 0)) * (HD + 4) + (size_t)BN * (BM + 4);
}
template <bool TC, int HD, int BM, int BN> constexpr size_t fl_dq_floats() {
    return (size_t)(2 * BM + 2 * BN) * (HD + 4) + (size_t)(TC ? 2 : 1) * BN * (BM + 4);
}
template <int HD, int BN, int BM> constexpr size_t fl_dkv_floats() {
    return (size_t)(2 * BN + 2 * BM) * (HD + 4) + (size_t)2 * BM * (BN + 4) + 3 * BM; /* ls, Ds, qss */
}

/* dK / dV's query tiles of BM rows end at the first from q0 / BM = qt0 on
 * whose first row's qstart (the smallest of the tile's) is past key kl:
 * qstart never decreases along a row, so no later row attends to kl or an
 * earlier key. nqt without a block-causal mask (qs NULL). The same for every
 * thread of a block. */
template <int BM> __device__ __forceinline__ int fl_qend(const int *qs, int kl, int qt0, int nqt, int T) {
    if (!qs) return nqt;
    int qt = qt0;
    while (qt < nqt && att_start(qs, qt * BM, T) <= kl) qt++;
    return qt;
}

/* forward: grid (B * nh, query tiles), the last query tile first */
template <bool TC, int HD, int BM, int BN>
__global__ void __launch_bounds__(FL_THREADS)
    flash_fwd_k(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ qkv,
                const int *__restrict__ qstart, int T, int nh, int nkv, float scale) {
    constexpr int LDH = HD + 4, LDP = BM + 4, RM = BM / 16, CN = BN / 8, OC = HD / 8;
    static_assert(BM % 16 == 0 && BN % 16 == 0 && HD % 32 == 0 && (RM == 2 || RM == 4), "flash tile shape");
    /* Ts (tensor cores only): one tile's P V */
    float *Qs = fl_base(), *Ks = Qs + BM * LDH, *Vs = Ks + BN * LDH, *Pt = Vs + BN * LDH, *Ts = Pt + BN * LDP;
    const int tid = (int)threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const FlQBlock blk = fl_qblock<HD, BM, BN>(qstart, T, nh, nkv);
    const int b = blk.b, h = blk.h, kh = blk.kh, q0 = blk.q0;
    const float *seq = qkv + (size_t)b * T * blk.S;
    fl_load<HD, BM>(Qs, seq + (size_t)h * HD, blk.S, q0, T, tid);
    float o[RM][OC], m[RM], l[RM];
    int qs[RM];
    fl_zero(o);
#pragma unroll
    for (int i = 0; i < RM; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        qs[i] = att_start(blk.qs, q0 + ty * RM + i, T);
    }
    for (int kt = blk.kt0; kt < blk.nkt; kt++) {
        const int k0 = kt * BN;
        __syncthreads(); /* the previous tile's readers of Ks, Vs, Pt, Ts are done */
        fl_load_kv<HD, BN>(Ks, Vs, seq, nh, nkv, kh, k0, T, tid);
        __syncthreads();
        float s[RM][CN];
        fl_scores<TC, HD, BM, BN>(s, Qs, Ks, Pt, tid);
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int q = q0 + ty * RM + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < CN; j++) {
                const int k = k0 + tx + 8 * j;
                s[i][j] = k <= q && k >= qs[i] && k < T ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = fl_max8(mx);
            /* a row with nothing unmasked yet keeps m = -inf: exponents
             * against 0 then give p = 0 and alpha = 0 instead of NaN */
            const float mn = fmaxf(m[i], mx), mu = mn == -INFINITY ? 0.0f : mn;
            const float alpha = expf(m[i] - mu);
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < CN; j++) {
                s[i][j] = expf(s[i][j] - mu);
                rs += s[i][j];
            }
            l[i] = l[i] * alpha + fl_sum8(rs);
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < OC; c++) o[i][c] *= alpha;
        }
        fl_put<RM, CN, LDP>(Pt, s, tid); /* TC: over the thread's own scores */
        __syncthreads();
        if constexpr (TC) {
            FlFrag f[BM * HD / 1024];
            fl_frag_zero(f);
            fl_acc_tc<HD, BM, BN, LDP>(f, Pt, Vs, tid >> 5);
            fl_frag_add<HD, BM>(o, f, Ts, tid);
        } else {
            fl_acc<HD, RM, LDP, BN>(o, Pt + ty * RM, Vs + tx * 4);
        }
    }
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int q = q0 + ty * RM + i;
        if (q >= T) continue;
        const float inv = 1.0f / l[i];
        float *orow = out + ((size_t)b * T + q) * blk.OS + (size_t)h * HD + tx * 4;
#pragma unroll
        for (int jj = 0; jj < HD / 32; jj++)
            *(float4 *)(orow + 32 * jj) = make_float4(o[i][4 * jj] * inv, o[i][4 * jj + 1] * inv,
                                                      o[i][4 * jj + 2] * inv, o[i][4 * jj + 3] * inv);
        if (tx == 0) lse[((size_t)b * nh + h) * T + q] = m[i] + logf(l[i]);
    }
}

/* D[(b*nh + h)*T + t] = dout[b,t,h,:] . out[b,t,h,:]; one warp per row.
 * OT, DT: float, or bf16 for [a] out and dout under bf16 */
template <typename OT, typename DT>
__global__ void flash_dot_k(float *__restrict__ D, const OT *__restrict__ out, const DT *__restrict__ dout,
                            int B, int T, int nh, int hd) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = (int)(threadIdx.x & 31);
    if (row >= (size_t)B * nh * T) return; /* the whole warp */
    const int t = (int)(row % T), h = (int)(row / T % nh), b = (int)(row / T / nh);
    const size_t off = ((size_t)b * T + t) * nh * hd + (size_t)h * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s = fmaf(act_ld(out, off + d), act_ld(dout, off + d), s);
    s += __shfl_xor_sync(0xffffffffu, s, 16);
    s += __shfl_xor_sync(0xffffffffu, s, 8);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (lane == 0) D[row] = s;
}

/* dQ: grid (B * nh, query tiles), last query tile first; dq += sum over
 * key tiles of dS K */
template <bool TC, int HD, int BM, int BN>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dq_k(float *__restrict__ dqkv, const float *__restrict__ dout, const float *__restrict__ qkv,
                   const float *__restrict__ lse, const float *__restrict__ Dr, const int *__restrict__ qstart, int T,
                   int nh, int nkv, float scale) {
    constexpr int LDH = HD + 4, LDP = BM + 4, RM = BM / 16, CN = BN / 8, OC = HD / 8;
    static_assert(BM % 16 == 0 && BN % 16 == 0 && HD % 32 == 0 && (RM == 2 || RM == 4), "flash tile shape");
    /* dPt (tensor cores only): the dP tile, transposed */
    float *Qs = fl_base(), *dOs = Qs + BM * LDH, *Ks = dOs + BM * LDH, *Vs = Ks + BN * LDH, *dSt = Vs + BN * LDH;
    float *dPt = dSt + BN * LDP;
    const int tid = (int)threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const FlQBlock blk = fl_qblock<HD, BM, BN>(qstart, T, nh, nkv);
    const int b = blk.b, h = blk.h, kh = blk.kh, q0 = blk.q0;
    const float *seq = qkv + (size_t)b * T * blk.S;
    fl_load<HD, BM>(Qs, seq + (size_t)h * HD, blk.S, q0, T, tid);
    fl_load<HD, BM>(dOs, dout + (size_t)b * T * blk.OS + (size_t)h * HD, blk.OS, q0, T, tid);
    float lr[RM], dr[RM], dq[RM][OC];
    int qs[RM];
    FlFrag f[TC ? BM * HD / 1024 : 1];
    fl_zero(dq);
    if constexpr (TC) fl_frag_zero(f);
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int q = q0 + ty * RM + i;
        const size_t li = ((size_t)b * nh + h) * T + q;
        lr[i] = q < T ? lse[li] : 0.0f;
        dr[i] = q < T ? Dr[li] : 0.0f;
        qs[i] = att_start(blk.qs, q, T);
    }
    for (int kt = blk.kt0; kt < blk.nkt; kt++) {
        const int k0 = kt * BN;
        __syncthreads(); /* the previous tile's readers of Ks, Vs, dSt, dPt are done */
        fl_load_kv<HD, BN>(Ks, Vs, seq, nh, nkv, kh, k0, T, tid);
        __syncthreads();
        float s[RM][CN], dp[RM][CN];
        fl_scores<TC, HD, BM, BN>(s, Qs, Ks, dSt, tid);
        fl_scores<TC, HD, BM, BN>(dp, dOs, Vs, dPt, tid);
#pragma unroll
        for (int j = 0; j < CN; j++) {
            const int k = k0 + tx + 8 * j;
#pragma unroll
            for (int i = 0; i < RM; i++) {
                const int q = q0 + ty * RM + i;
                const float p = k <= q && k >= qs[i] && q < T ? expf(s[i][j] * scale - lr[i]) : 0.0f;
                s[i][j] = p * (dp[i][j] - dr[i]) * scale;
            }
        }
        fl_put<RM, CN, LDP>(dSt, s, tid); /* TC: over the thread's own scores */
        __syncthreads();
        if constexpr (TC) fl_acc_tc<HD, BM, BN, LDP>(f, dSt, Ks, tid >> 5);
        else fl_acc<HD, RM, LDP, BN>(dq, dSt + ty * RM, Ks + tx * 4);
    }
    if constexpr (TC) {
        __syncthreads(); /* Qs is free */
        fl_frag_add<HD, BM>(dq, f, Qs, tid);
    }
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int q = q0 + ty * RM + i;
        if (q < T) fl_put_row<HD>(dqkv + ((size_t)b * T + q) * blk.S + (size_t)h * HD + tx * 4, dq[i]);
    }
}

/* dK, dV: grid (B * nkv, key tiles of BN keys), the first key tile (most
 * query tiles) first. Rows of the score tiles are keys here: st = K Q^T. */
template <bool TC, int HD, int BN, int BM>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dkv_k(float *__restrict__ dqkv, const float *__restrict__ dout, const float *__restrict__ qkv,
                    const float *__restrict__ lse, const float *__restrict__ Dr, const int *__restrict__ qstart, int T,
                    int nh, int nkv, float scale) {
    constexpr int LDH = HD + 4, LDP = BN + 4, RM = BN / 16, CN = BM / 8, OC = HD / 8;
    static_assert(BN % 16 == 0 && BM % 16 == 0 && HD % 32 == 0 && (RM == 2 || RM == 4) && BN <= BM,
                  "flash tile shape");
    float *Ks = fl_base(), *Vs = Ks + BN * LDH, *Qs = Vs + BN * LDH, *dOs = Qs + BM * LDH;
    float *Pt = dOs + BM * LDH, *dSt = Pt + BM * LDP, *ls = dSt + BM * LDP, *Ds = ls + BM;
    int *qss = reinterpret_cast<int *>(Ds + BM);
    const int tid = (int)threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int bk = (int)blockIdx.x, b = bk / nkv, kh = bk % nkv, group = nh / nkv;
    const int k0 = (int)blockIdx.y * BN, nqt = (T + BM - 1) / BM;
    const size_t S = (size_t)(nh + 2 * nkv) * HD, OS = (size_t)nh * HD;
    const int *qsrow = qstart ? qstart + (size_t)b * T : NULL;
    /* under a block-causal mask, the query tiles from qend on start their
     * documents after this key tile's last key: none of them attends to it */
    const int qend = fl_qend<BM>(qsrow, k0 + BN - 1, k0 / BM, nqt, T);
    const float *seq = qkv + (size_t)b * T * S;
    const float *dseq = dout + (size_t)b * T * OS;
    fl_load_kv<HD, BN>(Ks, Vs, seq, nh, nkv, kh, k0, T, tid);
    float dk[RM][OC], dv[RM][OC];
    FlFrag fk[TC ? BN * HD / 1024 : 1], fv[TC ? BN * HD / 1024 : 1];
    fl_zero(dk);
    fl_zero(dv);
    if constexpr (TC) {
        fl_frag_zero(fk);
        fl_frag_zero(fv);
    }
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int qt = k0 / BM; qt < qend; qt++) { /* tiles before k0 / BM end above the diagonal */
            const int q0 = qt * BM;
            __syncthreads(); /* the previous step's readers of Qs, dOs, Pt, dSt, ls, Ds, qss are done */
            fl_load<HD, BM>(Qs, seq + (size_t)h * HD, S, q0, T, tid);
            fl_load<HD, BM>(dOs, dseq + (size_t)h * HD, OS, q0, T, tid);
            for (int r = tid; r < BM; r += FL_THREADS) {
                const int q = q0 + r;
                const size_t li = ((size_t)b * nh + h) * T + q;
                ls[r] = q < T ? lse[li] : 0.0f;
                Ds[r] = q < T ? Dr[li] : 0.0f;
                qss[r] = att_start(qsrow, q, T);
            }
            __syncthreads();
            float st[RM][CN], dpt[RM][CN];
            fl_scores<TC, HD, BN, BM>(st, Ks, Qs, Pt, tid);
            fl_scores<TC, HD, BN, BM>(dpt, Vs, dOs, dSt, tid);
#pragma unroll
            for (int j = 0; j < CN; j++) {
                const int c = tx + 8 * j, q = q0 + c;
                const float lq = ls[c], dd = Ds[c];
                const int qsc = qss[c];
#pragma unroll
                for (int i = 0; i < RM; i++) {
                    const int k = k0 + ty * RM + i;
                    const float p = k <= q && k >= qsc && q < T ? expf(st[i][j] * scale - lq) : 0.0f;
                    st[i][j] = p;
                    dpt[i][j] = p * (dpt[i][j] - dd) * scale;
                }
            }
            fl_put<RM, CN, LDP>(Pt, st, tid); /* TC: over the thread's own scores */
            fl_put<RM, CN, LDP>(dSt, dpt, tid);
            __syncthreads();
            if constexpr (TC) {
                fl_acc_tc<HD, BN, BM, LDP>(fv, Pt, dOs, tid >> 5);
                fl_acc_tc<HD, BN, BM, LDP>(fk, dSt, Qs, tid >> 5);
            } else {
                fl_acc<HD, RM, LDP, BM>(dv, Pt + ty * RM, dOs + tx * 4);
                fl_acc<HD, RM, LDP, BM>(dk, dSt + ty * RM, Qs + tx * 4);
            }
        }
    }
    if constexpr (TC) {
        __syncthreads(); /* Qs and dOs are free (BN <= BM rows) */
        fl_frag_add<HD, BN>(dk, fk, Qs, tid);
        fl_frag_add<HD, BN>(dv, fv, dOs, tid);
    }
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int k = k0 + ty * RM + i;
        if (k >= T) continue;
        float *row = dqkv + ((size_t)b * T + k) * S + tx * 4;
        fl_put_row<HD>(row + (size_t)(nh + kh) * HD, dk[i]);
        fl_put_row<HD>(row + (size_t)(nh + nkv + kh) * HD, dv[i]);
    }
}

/* Tile shapes per head dim (TC: tensor cores): forward (query rows x
 * keys), dQ (the same), dK/dV (keys x query rows). Head dim 128 takes
 * 32-wide tiles where the shared memory (and, in dK/dV, registers: two
 * 128-wide accumulators) would otherwise leave one block per multiprocessor. */
template <bool TC, int HD> struct FlCfg {
    static constexpr int FWD_M = 64, FWD_N = 64, DQ_M = 64, DQ_N = 64, DKV_N = 64, DKV_M = 64;
};
template <bool TC> struct FlCfg<TC, 128> {
    static constexpr int FWD_M = 64, FWD_N = 32, DQ_M = TC ? 32 : 64, DQ_N = 32, DKV_N = 32, DKV_M = 32;
};

/* 0 when this shape does not fit (the caller takes the GEMM path) */
template <bool TC, int HD>
static int fl_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh, int nkv) {
    constexpr int BM = FlCfg<TC, HD>::FWD_M, BN = FlCfg<TC, HD>::FWD_N;
    const size_t smem = fl_fwd_floats<TC, HD, BM, BN>() * sizeof(float) + FL_SMEM_SLACK;
    const int nqt = (T + BM - 1) / BM;
    if (smem > smem_limit() || nqt > 65535) return 0;
    launch_smem(flash_fwd_k<TC, HD, BM, BN>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem, out, lse, qkv,
                qstart, T, nh, nkv, 1.0f / sqrtf((float)HD));
    return 1;
}

template <bool TC, int HD>
static int fl_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                       const int *qstart, int B, int T, int nh, int nkv) {
    typedef FlCfg<TC, HD> C;
    const size_t smem_dq = fl_dq_floats<TC, HD, C::DQ_M, C::DQ_N>() * sizeof(float) + FL_SMEM_SLACK;
    const size_t smem_dkv = fl_dkv_floats<HD, C::DKV_N, C::DKV_M>() * sizeof(float) + FL_SMEM_SLACK;
    const int nqt = (T + C::DQ_M - 1) / C::DQ_M, nkt = (T + C::DKV_N - 1) / C::DKV_N;
    if (smem_dq > smem_limit() || smem_dkv > smem_limit() || nqt > 65535 || nkt > 65535) return 0;
    const float scale = 1.0f / sqrtf((float)HD);
    const size_t rows = (size_t)B * nh * T;
    float *D = fl_scratch(rows * sizeof(float));
    launch_smem(flash_dot_k<float, float>, dim3((unsigned)((rows + 7) / 8)), 256, 0, D, out, dout, B, T, nh, HD);
    launch_smem(flash_bwd_dq_k<TC, HD, C::DQ_M, C::DQ_N>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem_dq,
              dqkv, dout, qkv, lse, (const float *)D, qstart, T, nh, nkv, scale);
    launch_smem(flash_bwd_dkv_k<TC, HD, C::DKV_N, C::DKV_M>, dim3((unsigned)(B * nkv), (unsigned)nkt), FL_THREADS,
              smem_dkv, dqkv, dout, qkv, lse, (const float *)D, qstart, T, nh, nkv, scale);
    return 1;
}

// ---- bf16 tensor-core flash attention region: begin ----
/* The fused attention under compute dtype bf16 on sm_80 and newer:
 * flash-attention-2 style kernels on mma.sync.m16n8k16 (bf16 operands, fp32
 * accumulation); qkv, out, dout and dqkv, [a] buffers, are bf16 (these run
 * under bf16 only). Each global tile of qkv and dout is copied as it is
 * (16 bytes a thread) once into shared memory as bf16 words, row-major
 * [row][d] (two values per 32-bit word, rows padded by 4 words so that the
 * 8 rows of a fragment or ldmatrix load fall in 8 different bank quads); B
 * fragments come through ldmatrix.x4, with .trans where the tile's rows are
 * the product's k (V in the forward, K in dQ, Q and dO in dK/dV), so no
 * transposed copy is made. A block is 4 warps; each warp owns
 * 16 rows of the block's 64 (queries in the forward and dQ, keys in dK/dV)
 * and keeps its row operand (Q, dO or K, V) in registers as A fragments.
 * Scores stay in registers: the fp32 accumulator fragment of S (or dS) of
 * two adjacent 8-key tiles is exactly the A fragment of the next product
 * once packed to bf16, so P V, dS K, P^T dO and dS^T Q never touch shared
 * memory. The online softmax runs in base 2 (scores times scale * log2 e);
 * row maxima and sums are 2 shuffles over the 4 lanes of a row. Warps whose
 * rows lie wholly before a key tile skip it; masks are applied only on tiles
 * that cross the diagonal or T. The schedule (grid order, one owner per
 * output row, fixed summation order, no atomics) is the TF32 kernels'.
 *
 * PTX fragment layouts (lane = 4 g + t): A 16 x 16: a0 (row g, k 2t..2t+1),
 * a1 (row g+8), a2 (row g, k 2t+8..2t+9), a3 (row g+8, k 2t+8..); B 16 x 8:
 * b0 (k 2t..2t+1, column g), b1 (k 2t+8..); C 16 x 8: c0, c1 (row g,
 * columns 2t, 2t+1), c2, c3 (row g+8). The host emulation implements the
 * instruction with the same layouts (tests/cuda_emu). */

/* two adjacent bf16 gradients (dqkv, [a] under bf16), each rounded once */
__device__ __forceinline__ void fb_put2(__nv_bfloat16 *p, float lo, float hi) {
    *reinterpret_cast<uint32_t *>(static_cast<void *>(p)) = fb_pack(lo, hi);
}

/* d += a b, one m16n8k16 product of the warp */
__device__ __forceinline__ void fb_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
    __trap(); /* the host runs the TF32 / FMA kernels below sm_80 */
#elif defined(LLMTRAIN_CUDA_EMU_H)
    const uint32_t b[2] = {b0, b1};
    ::emu::mma_bf16_m16n8k16(d, a, b);
#else
    (void)d;
    (void)a;
    (void)b0;
    (void)b1;
#endif
}

__device__ __forceinline__ uint32_t *fb_base() { return reinterpret_cast<uint32_t *>(fl_base()); }

/* Rows [r0, r0 + R) of one head's [T, HD] bf16 slice ([a] qkv or dout;
 * row stride `stride` elements, g at row 0) into sm[R][HD/2 + 4 words] as
 * they are, 16 bytes a thread; rows past T as zeros */
template <int HD, int R>
__device__ __forceinline__ void fb_load(uint32_t *sm, const __nv_bfloat16 *__restrict__ g, size_t stride, int r0,
                                        int T, int tid) {
    constexpr int V8 = HD / 8, LDW = HD / 2 + 4;
    for (int f = tid; f < R * V8; f += FL_THREADS) {
        const int r = f / V8, c = f % V8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < T) v = *(const uint4 *)(const void *)(g + (size_t)(r0 + r) * stride + 8 * c);
        *(uint4 *)(void *)(sm + r * LDW + 4 * c) = v;
    }
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the
 * address of row l % 8 of matrix l / 8 (16-byte aligned); r[j] is this
 * lane's word of matrix j (row g, elements 2t..2t+1; .trans: rows 2t and
 * 2t+1 of column g) */
template <bool TRANS> __device__ __forceinline__ void fb_ldsm4(uint32_t (&r)[4], const uint32_t *row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
#elif defined(__CUDA_ARCH__)
    (void)row;
    r[0] = r[1] = r[2] = r[3] = 0u;
    __trap();
#elif defined(LLMTRAIN_CUDA_EMU_H)
    ::emu::ldmatrix(r, 4, TRANS, row);
#else
    (void)row;
    r[0] = r[1] = r[2] = r[3] = 0u;
#endif
}

/* the A fragment of rows r0..r0+15, k chunk kc (16 columns) of a row-major
 * word tile with LD words a row */
template <int LD>
__device__ __forceinline__ void fb_frag_a(uint32_t (&a)[4], const uint32_t *sm, int r0, int kc, int lane) {
    const uint32_t *p = sm + (r0 + (lane >> 2)) * LD + kc * 8 + (lane & 3);
    a[0] = p[0];
    a[1] = p[8 * LD];
    a[2] = p[4];
    a[3] = p[8 * LD + 4];
}

/* acc[j] += A B for k chunk kc and the N*8 columns whose k runs along the
 * rows of a row-major [n][k] word tile (B^T): one ldmatrix.x4 brings b0 and
 * b1 of two 8-column tiles (matrices: rows n0..n0+7 at k 0..7 and 8..15,
 * then rows n0+8..n0+15 likewise) */
template <int N, int LD>
__device__ __forceinline__ void fb_mma_nk(float (&acc)[N][4], const uint32_t (&a)[4], const uint32_t *sm, int kc,
                                          int lane) {
    const int m = lane >> 3, i = lane & 7;
#pragma unroll
    for (int j = 0; j < N; j += 2) {
        uint32_t b[4];
        fb_ldsm4<false>(b, sm + (8 * j + (m >> 1) * 8 + i) * LD + kc * 8 + (m & 1) * 4);
        fb_mma(acc[j], a, b[0], b[1]);
        fb_mma(acc[j + 1], a, b[2], b[3]);
    }
}

/* the A fragment of k chunk kk from the accumulator fragments of two
 * adjacent 8-column tiles (scores or dS) */
__device__ __forceinline__ void fb_c2a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = fb_pack(c0[0], c0[1]);
    a[1] = fb_pack(c0[2], c0[3]);
    a[2] = fb_pack(c1[0], c1[1]);
    a[3] = fb_pack(c1[2], c1[3]);
}

template <int N> __device__ __forceinline__ void fb_zero(float (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0.0f;
}

/* acc[N][4] = A (16 x HD, KC A fragments) times the transposes of the N*8
 * rows of an [n][HD] word tile */
template <int KC, int N, int LD>
__device__ __forceinline__ void fb_scores(float (&acc)[N][4], const uint32_t (&a)[KC][4], const uint32_t *sm,
                                          int lane) {
    fb_zero(acc);
#pragma unroll
    for (int kc = 0; kc < KC; kc++) fb_mma_nk<N, LD>(acc, a[kc], sm, kc, lane);
}

/* acc[OT][4] += X V where X (16 x 16 NK) is given as accumulator fragments
 * x[2 NK][4] and V as a row-major [16 NK][OT*8] word tile: ldmatrix.x4.trans
 * brings b0 and b1 of two 8-column tiles (matrices: rows 16kk..16kk+7 and
 * 16kk+8..16kk+15 at columns 8jd.., then at 8jd+8..) */
template <int NK, int OT, int LD>
__device__ __forceinline__ void fb_accum(float (&acc)[OT][4], const float (&x)[2 * NK][4], const uint32_t *sm,
                                         int lane) {
    const int m = lane >> 3, i = lane & 7;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        uint32_t a[4];
        fb_c2a(a, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
        for (int jd = 0; jd < OT; jd += 2) {
            uint32_t b[4];
            fb_ldsm4<true>(b, sm + (16 * kk + (m & 1) * 8 + i) * LD + (jd + (m >> 1)) * 4);
            fb_mma(acc[jd], a, b[0], b[1]);
            fb_mma(acc[jd + 1], a, b[2], b[3]);
        }
    }
}

__device__ __forceinline__ float fb_max4(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float fb_sum4(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#define FB_BM 64 /* rows of a block: 4 warps of 16 */
#define FB_LOG2E 1.4426950408889634f
#define FB_LN2 0.6931471805599453f

/* a row-major [R][HD] bf16 tile, in words */
template <int HD, int R> __host__ __device__ constexpr int fb_words() { return R * (HD / 2 + 4); }

/* forward: grid (B * nh, query tiles), the last query tile first */
template <int HD, int BN>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bf16_fwd_k(float *__restrict__ out, float *__restrict__ lse, const __nv_bfloat16 *__restrict__ qkv,
                     const int *__restrict__ qstart, int T, int nh, int nkv, float scale) {
    constexpr int LDW = HD / 2 + 4, KC = HD / 16, NT = BN / 8, OT = HD / 8;
    uint32_t *Qs = fb_base(), *Ks = Qs + fb_words<HD, FB_BM>(), *Vs = Ks + fb_words<HD, BN>();
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const FlQBlock blk = fl_qblock<HD, FB_BM, BN>(qstart, T, nh, nkv);
    const __nv_bfloat16 *seq = qkv + (size_t)blk.b * T * blk.S;
    fb_load<HD, FB_BM>(Qs, seq + (size_t)blk.h * HD, blk.S, blk.q0, T, tid);
    __syncthreads();
    uint32_t qa[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) fb_frag_a<LDW>(qa[kc], Qs, warp * 16, kc, lane);
    const int w0 = blk.q0 + warp * 16, row[2] = {w0 + (lane >> 2), w0 + (lane >> 2) + 8};
    const int qs[2] = {att_start(blk.qs, row[0], T), att_start(blk.qs, row[1], T)};
    /* the warp's rows' qstart span [ws0, ws1]: tiles before ws0 are skipped,
     * tiles that begin before ws1 are masked */
    const int ws0 = att_start(blk.qs, w0, T), ws1 = att_start(blk.qs, (w0 + 15 < T ? w0 + 15 : T - 1), T);
    const float sl2 = scale * FB_LOG2E;
    float o[OT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    fb_zero(o);
    for (int kt = blk.kt0; kt < blk.nkt; kt++) {
        const int k0 = kt * BN;
        __syncthreads(); /* the previous tile's readers of Ks and Vs are done */
        fb_load<HD, BN>(Ks, seq + (size_t)(nh + blk.kh) * HD, blk.S, k0, T, tid);
        fb_load<HD, BN>(Vs, seq + (size_t)(nh + nkv + blk.kh) * HD, blk.S, k0, T, tid);
        __syncthreads();
        if (k0 > w0 + 15 || k0 + BN <= ws0) continue; /* every key after every row of the warp, or before */
        float s[NT][4];
        fb_scores<KC, NT, LDW>(s, qa, Ks, lane);
        const bool edge = k0 + BN - 1 > w0 || k0 + BN > T || k0 < ws1;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = k0 + 8 * j + 2 * t + (e & 1);
                float v = s[j][e] * sl2;
                if (edge && (k > row[e >> 1] || k < qs[e >> 1] || k >= T)) v = -INFINITY;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float alpha[2], mu[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* a row with nothing unmasked yet keeps m = -inf (see flash_fwd_k) */
            const float mn = fmaxf(m[i], fb_max4(mx[i]));
            mu[i] = mn == -INFINITY ? 0.0f : mn;
            alpha[i] = exp2f(m[i] - mu[i]);
            m[i] = mn;
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] - mu[e >> 1]);
                rs[e >> 1] += s[j][e];
            }
#pragma unroll
        for (int i = 0; i < 2; i++) l[i] = l[i] * alpha[i] + fb_sum4(rs[i]);
#pragma unroll
        for (int jd = 0; jd < OT; jd++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[jd][e] *= alpha[e >> 1];
        fb_accum<NT / 2, OT, LDW>(o, s, Vs, lane);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int q = row[i];
        if (q >= T) continue;
        const float inv = 1.0f / l[i];
        /* out is [a], bf16 here (this kernel runs under bf16 only) */
        __nv_bfloat16 *orow = ACT16(out) + ((size_t)blk.b * T + q) * blk.OS + (size_t)blk.h * HD + 2 * t;
#pragma unroll
        for (int jd = 0; jd < OT; jd++)
            *(uint32_t *)(orow + 8 * jd) = fb_pack(o[jd][2 * i] * inv, o[jd][2 * i + 1] * inv);
        if (t == 0) lse[((size_t)blk.b * nh + blk.h) * T + q] = m[i] * FB_LN2 + logf(l[i]);
    }
}

/* dQ: grid (B * nh, query tiles), last query tile first */
template <int HD, int BN>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bf16_dq_k(__nv_bfloat16 *__restrict__ dqkv, const __nv_bfloat16 *__restrict__ dout,
                    const __nv_bfloat16 *__restrict__ qkv, const float *__restrict__ lse,
                    const float *__restrict__ Dr, const int *__restrict__ qstart, int T, int nh, int nkv,
                    float scale) {
    constexpr int LDW = HD / 2 + 4, KC = HD / 16, NT = BN / 8, OT = HD / 8;
    uint32_t *Qs = fb_base(), *dOs = Qs + fb_words<HD, FB_BM>(), *Ks = dOs + fb_words<HD, FB_BM>();
    uint32_t *Vs = Ks + fb_words<HD, BN>();
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const FlQBlock blk = fl_qblock<HD, FB_BM, BN>(qstart, T, nh, nkv);
    const __nv_bfloat16 *seq = qkv + (size_t)blk.b * T * blk.S;
    fb_load<HD, FB_BM>(Qs, seq + (size_t)blk.h * HD, blk.S, blk.q0, T, tid);
    fb_load<HD, FB_BM>(dOs, dout + (size_t)blk.b * T * blk.OS + (size_t)blk.h * HD, blk.OS, blk.q0, T, tid);
    __syncthreads();
    uint32_t qa[KC][4], da[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        fb_frag_a<LDW>(qa[kc], Qs, warp * 16, kc, lane);
        fb_frag_a<LDW>(da[kc], dOs, warp * 16, kc, lane);
    }
    const int w0 = blk.q0 + warp * 16, row[2] = {w0 + (lane >> 2), w0 + (lane >> 2) + 8};
    const int qs[2] = {att_start(blk.qs, row[0], T), att_start(blk.qs, row[1], T)};
    const int ws0 = att_start(blk.qs, w0, T), ws1 = att_start(blk.qs, (w0 + 15 < T ? w0 + 15 : T - 1), T);
    const float sl2 = scale * FB_LOG2E;
    float l2[2], dd[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const size_t li = ((size_t)blk.b * nh + blk.h) * T + row[i];
        l2[i] = row[i] < T ? lse[li] * FB_LOG2E : 0.0f;
        dd[i] = row[i] < T ? Dr[li] : 0.0f;
    }
    float dq[OT][4];
    fb_zero(dq);
    for (int kt = blk.kt0; kt < blk.nkt; kt++) {
        const int k0 = kt * BN;
        __syncthreads(); /* the previous tile's readers of Ks and Vs are done */
        fb_load<HD, BN>(Ks, seq + (size_t)(nh + blk.kh) * HD, blk.S, k0, T, tid);
        fb_load<HD, BN>(Vs, seq + (size_t)(nh + nkv + blk.kh) * HD, blk.S, k0, T, tid);
        __syncthreads();
        if (k0 > w0 + 15 || k0 + BN <= ws0) continue;
        float s[NT][4], dp[NT][4];
        fb_scores<KC, NT, LDW>(s, qa, Ks, lane);
        fb_scores<KC, NT, LDW>(dp, da, Vs, lane);
        const bool edge = k0 + BN - 1 > w0 || k0 < ws1;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = k0 + 8 * j + 2 * t + (e & 1), q = row[e >> 1];
                const float p =
                    (!edge || (k <= q && k >= qs[e >> 1])) && q < T ? exp2f(s[j][e] * sl2 - l2[e >> 1]) : 0.0f;
                s[j][e] = p * (dp[j][e] - dd[e >> 1]);
            }
        fb_accum<NT / 2, OT, LDW>(dq, s, Ks, lane);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int q = row[i];
        if (q >= T) continue;
        __nv_bfloat16 *r = dqkv + ((size_t)blk.b * T + q) * blk.S + (size_t)blk.h * HD + 2 * t;
#pragma unroll
        for (int jd = 0; jd < OT; jd++) fb_put2(r + 8 * jd, dq[jd][2 * i] * scale, dq[jd][2 * i + 1] * scale);
    }
}

/* dK, dV: grid (B * nkv, key tiles of 64 keys), the first key tile first;
 * rows of the score tiles are keys: S^T = K Q^T. KREG: K and V stay in
 * registers as A fragments (head dims up to 64; 128 reads them from shared
 * memory for each product, which keeps dK and dV's 128 accumulators in
 * registers) */
template <int HD, int BM>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bf16_dkv_k(__nv_bfloat16 *__restrict__ dqkv, const __nv_bfloat16 *__restrict__ dout,
                     const __nv_bfloat16 *__restrict__ qkv, const float *__restrict__ lse,
                     const float *__restrict__ Dr, const int *__restrict__ qstart, int T, int nh, int nkv,
                     float scale) {
    constexpr int BN = FB_BM, LDW = HD / 2 + 4, KC = HD / 16, NT = BM / 8, OT = HD / 8;
    constexpr bool KREG = HD <= 64;
    uint32_t *Ks = fb_base(), *Vs = Ks + fb_words<HD, BN>(), *Qs = Vs + fb_words<HD, BN>();
    uint32_t *dOs = Qs + fb_words<HD, BM>();
    float *ls = reinterpret_cast<float *>(dOs + fb_words<HD, BM>()), *Ds = ls + BM;
    int *qss = reinterpret_cast<int *>(Ds + BM);
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const int bk = (int)blockIdx.x, b = bk / nkv, kh = bk % nkv, group = nh / nkv;
    const int k0 = (int)blockIdx.y * BN, nqt = (T + BM - 1) / BM;
    const int *qsrow = qstart ? qstart + (size_t)b * T : NULL;
    const int qend = fl_qend<BM>(qsrow, k0 + BN - 1, k0 / BM, nqt, T); /* see flash_bwd_dkv_k */
    const size_t S = (size_t)(nh + 2 * nkv) * HD, OS = (size_t)nh * HD;
    const __nv_bfloat16 *seq = qkv + (size_t)b * T * S, *dseq = dout + (size_t)b * T * OS;
    fb_load<HD, BN>(Ks, seq + (size_t)(nh + kh) * HD, S, k0, T, tid);
    fb_load<HD, BN>(Vs, seq + (size_t)(nh + nkv + kh) * HD, S, k0, T, tid);
    __syncthreads();
    uint32_t ka[KREG ? KC : 1][4], va[KREG ? KC : 1][4];
    if constexpr (KREG) {
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            fb_frag_a<LDW>(ka[kc], Ks, warp * 16, kc, lane);
            fb_frag_a<LDW>(va[kc], Vs, warp * 16, kc, lane);
        }
    }
    const int w0 = k0 + warp * 16, key[2] = {w0 + (lane >> 2), w0 + (lane >> 2) + 8};
    const float sl2 = scale * FB_LOG2E;
    float dk[OT][4], dv[OT][4];
    fb_zero(dk);
    fb_zero(dv);
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int qt = k0 / BM; qt < qend; qt++) { /* tiles before k0 / BM end above the diagonal */
            const int q0 = qt * BM;
            __syncthreads(); /* the previous step's readers are done */
            const __nv_bfloat16 *qg = seq + (size_t)h * HD, *dg = dseq + (size_t)h * HD;
            fb_load<HD, BM>(Qs, qg, S, q0, T, tid);
            fb_load<HD, BM>(dOs, dg, OS, q0, T, tid);
            for (int r = tid; r < BM; r += FL_THREADS) {
                const int q = q0 + r;
                const size_t li = ((size_t)b * nh + h) * T + q;
                ls[r] = q < T ? lse[li] * FB_LOG2E : 0.0f;
                Ds[r] = q < T ? Dr[li] : 0.0f;
                qss[r] = att_start(qsrow, q, T);
            }
            __syncthreads();
            /* every query before every key of the warp, or its document
             * after them (the tile's first query's qstart is its smallest) */
            if (q0 + BM - 1 < w0 || qss[0] > w0 + 15) continue;
            float st[NT][4], dpt[NT][4];
            if constexpr (KREG) {
                fb_scores<KC, NT, LDW>(st, ka, Qs, lane);
                fb_scores<KC, NT, LDW>(dpt, va, dOs, lane);
            } else {
                fb_zero(st);
                fb_zero(dpt);
#pragma unroll
                for (int kc = 0; kc < KC; kc++) {
                    uint32_t a[4];
                    fb_frag_a<LDW>(a, Ks, warp * 16, kc, lane);
                    fb_mma_nk<NT, LDW>(st, a, Qs, kc, lane);
                    fb_frag_a<LDW>(a, Vs, warp * 16, kc, lane);
                    fb_mma_nk<NT, LDW>(dpt, a, dOs, kc, lane);
                }
            }
            /* masked: the diagonal, T, or a document that starts after the
             * warp's first key (qss[BM - 1], the tile's largest qstart) */
            const bool edge = q0 < w0 + 15 || q0 + BM > T || qss[BM - 1] > w0;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 8 * j + 2 * t + (e & 1), q = q0 + c;
                    const float p = !edge || (key[e >> 1] <= q && key[e >> 1] >= qss[c] && q < T)
                                        ? exp2f(st[j][e] * sl2 - ls[c])
                                        : 0.0f;
                    st[j][e] = p;
                    dpt[j][e] = p * (dpt[j][e] - Ds[c]);
                }
            fb_accum<NT / 2, OT, LDW>(dv, st, dOs, lane);
            fb_accum<NT / 2, OT, LDW>(dk, dpt, Qs, lane);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int k = key[i];
        if (k >= T) continue;
        __nv_bfloat16 *r = dqkv + ((size_t)b * T + k) * S + 2 * t;
        __nv_bfloat16 *rk = r + (size_t)(nh + kh) * HD, *rv = r + (size_t)(nh + nkv + kh) * HD;
#pragma unroll
        for (int jd = 0; jd < OT; jd++) {
            fb_put2(rk + 8 * jd, dk[jd][2 * i] * scale, dk[jd][2 * i + 1] * scale);
            fb_put2(rv + 8 * jd, dv[jd][2 * i], dv[jd][2 * i + 1]);
        }
    }
}

/* tiles: forward keys BN, dQ keys, dK/dV query rows (all 64 but head dim
 * 128's backward, 32: registers) */
template <int HD> struct FbCfg {
    static constexpr int FWD_N = 64, DQ_N = HD > 64 ? 32 : 64, DKV_M = HD > 64 ? 32 : 64;
};

template <int HD>
static int fb_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh, int nkv) {
    constexpr int BN = FbCfg<HD>::FWD_N;
    const size_t smem =
        (size_t)(fb_words<HD, FB_BM>() + 2 * fb_words<HD, BN>()) * 4 + FL_SMEM_SLACK;
    const int nqt = (T + FB_BM - 1) / FB_BM;
    if (smem > smem_limit() || nqt > 65535) return 0;
    launch_smem(flash_bf16_fwd_k<HD, BN>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem, out, lse,
                CACT16(qkv), qstart, T, nh, nkv, 1.0f / sqrtf((float)HD));
    return 1;
}

template <int HD>
static int fb_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                       const int *qstart, int B, int T, int nh, int nkv) {
    constexpr int DQ_N = FbCfg<HD>::DQ_N, DKV_M = FbCfg<HD>::DKV_M;
    const size_t smem_dq =
        (size_t)(2 * fb_words<HD, FB_BM>() + 2 * fb_words<HD, DQ_N>()) * 4 + FL_SMEM_SLACK;
    const size_t smem_dkv =
        (size_t)(2 * fb_words<HD, FB_BM>() + 2 * fb_words<HD, DKV_M>() + 3 * DKV_M) * 4 + FL_SMEM_SLACK; /* ls, Ds, qss */
    const int nqt = (T + FB_BM - 1) / FB_BM, nkt = (T + FB_BM - 1) / FB_BM;
    if (smem_dq > smem_limit() || smem_dkv > smem_limit() || nqt > 65535) return 0;
    const float scale = 1.0f / sqrtf((float)HD);
    const size_t rows = (size_t)B * nh * T;
    float *D = fl_scratch(rows * sizeof(float));
    launch_smem(flash_dot_k<__nv_bfloat16, __nv_bfloat16>, dim3((unsigned)((rows + 7) / 8)), 256, 0, D, CACT16(out),
                CACT16(dout), B, T, nh, HD);
    launch_smem(flash_bf16_dq_k<HD, DQ_N>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem_dq, ACT16(dqkv),
                CACT16(dout), CACT16(qkv), lse, (const float *)D, qstart, T, nh, nkv, scale);
    launch_smem(flash_bf16_dkv_k<HD, DKV_M>, dim3((unsigned)(B * nkv), (unsigned)nkt), FL_THREADS, smem_dkv,
                ACT16(dqkv), CACT16(dout), CACT16(qkv), lse, (const float *)D, qstart, T, nh, nkv, scale);
    return 1;
}
// ---- bf16 tensor-core flash attention region: end ----

/* The fused forward when it takes this shape (head dim 32, 64 or 128,
 * 16-byte aligned operands, B * heads and tiles within the grid limits);
 * else 0 and nothing ran. Tensor cores when fl_tensor_cores() says so. */
static int flash_attention_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
                                   int nkv, int hd) {
    if (B <= 0 || T <= 0) return 1;
    if (!aligned16(qkv) || !aligned16(out) || (size_t)B * nh > 0x7fffffffu) return 0;
    const int tc = fl_tensor_cores();
    if (fl_bf16()) switch (hd) {
        case 32: return fb_forward<32>(out, lse, qkv, qstart, B, T, nh, nkv);
        case 64: return fb_forward<64>(out, lse, qkv, qstart, B, T, nh, nkv);
        case 128: return fb_forward<128>(out, lse, qkv, qstart, B, T, nh, nkv);
        default: return 0;
        }
#define FL_FWD(TC, HD) fl_forward<TC, HD>(out, lse, qkv, qstart, B, T, nh, nkv)
    switch (hd) {
    case 32: return tc ? FL_FWD(true, 32) : FL_FWD(false, 32);
    case 64: return tc ? FL_FWD(true, 64) : FL_FWD(false, 64);
    case 128: return tc ? FL_FWD(true, 128) : FL_FWD(false, 128);
    default: return 0;
    }
#undef FL_FWD
}

static int flash_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return 1;
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out) ||
        (size_t)B * nh > 0x7fffffffu)
        return 0;
    const int tc = fl_tensor_cores();
    if (fl_bf16()) switch (hd) {
        case 32: return fb_backward<32>(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv);
        case 64: return fb_backward<64>(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv);
        case 128: return fb_backward<128>(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv);
        default: return 0;
        }
#define FL_BWD(TC, HD) fl_backward<TC, HD>(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv)
    switch (hd) {
    case 32: return tc ? FL_BWD(true, 32) : FL_BWD(false, 32);
    case 64: return tc ? FL_BWD(true, 64) : FL_BWD(false, 64);
    case 128: return tc ? FL_BWD(true, 128) : FL_BWD(false, 128);
    default: return 0;
    }
#undef FL_BWD
}
// ---- flash attention region: end ----

/* train.attention_kernel (kernels_cuda_set_attention) picks the attention
 * kernels: cudnn (cuDNN's fused attention on bf16 qkv, the section below;
 * the shapes it declines take the fused kernels), flash (the fused kernels
 * of the region above, for head dims 32, 64 and 128; other shapes take the
 * GEMMs; TF32 tensor cores, or fp32 FMA under compute dtype fp32 or below
 * sm_80, or bf16 mma.sync under bf16) or gemm (the cuBLASLt GEMMs above, for
 * every shape). auto (the default): cudnn under bf16, whose numerics it
 * shares, else flash (TF32 keeps more of the scores' precision than bf16
 * operands). */
enum { ATT_GEMM = 0, ATT_FLASH = 1, ATT_CUDNN = 2, ATT_AUTO = 3 };
static int att_mode = ATT_AUTO;
static long flash_calls;

static int att_parse(const char *e) {
    return !e                        ? -2
           : strcmp(e, "auto") == 0  ? ATT_AUTO
           : strcmp(e, "flash") == 0 ? ATT_FLASH
           : strcmp(e, "gemm") == 0  ? ATT_GEMM
           : strcmp(e, "cudnn") == 0 ? ATT_CUDNN
                                     : -2;
}

static int attention_mode(void) { return att_mode == ATT_AUTO ? (matmul_bf16() ? ATT_CUDNN : ATT_FLASH) : att_mode; }

extern "C" void kernels_cuda_set_attention(const char *mode) {
    att_mode = att_parse(mode);
    if (att_mode == -2)
        die(EXIT_INTERNAL, "kernels_cuda_set_attention(\"%s\"): expected auto, cudnn, flash or gemm", mode ? mode : "(null)");
}

extern "C" long kernels_cuda_flash_attention_calls(void) { return flash_calls; }

// ----------------------------------------------------------------------------
// attention through cuDNN (train.attention_kernel cudnn; the default under
// compute dtype bf16): cuDNN's fused flash attention on bf16 qkv
//
// The graphs are cuDNN's "composite" scaled-dot-product attention, built
// through the backend API (plain C; the C++ frontend is not a dependency):
// the operations the frontend's SDPA node lowers to for cuDNN 9, which the
// library's fused attention engines recognise as one kernel.
//   forward:  S = Q K^T * scale, causal (row >= column, else -inf),
//             Stats = max + log(sum exp(S - max)), O = (exp(S - max) / sum) V
//   backward: P = exp(S - Stats) (recomputed), dV = P^T dO,
//             dS = P * (dO V^T - rowsum(dO * O)) * scale, dQ = dS K, dK = dS^T Q
// Q, K and V are views by strides of qkv ([B, T, (nh + 2 nkv) hd]) itself
// when it is [a] bf16, else of one bf16 copy of it; GQA through K and V
// having nkv heads; O and dO are out and dout themselves when they are [a]
// bf16 (else bf16 copies); Stats is lse ([B, nh, T], natural log), so the
// forward and backward interoperate with the other paths' lse. dQ, dK and dV
// land in dqkv itself when it is [a] bf16, else in a bf16 copy widened into
// it (overwritten, kernels.h).
// A plan per shape is built at first use and kept (at most DN_PLANS: a
// training run has two, for its forward and backward, and sampling one per
// context length; past them the fused kernels, with one line); a
// shape cuDNN declines (no engine, or one needing more than DN_WS_CAP of
// workspace) is remembered and takes the fused kernels, with one line on
// stderr; so does every shape when the library cannot start.

#define DN_PLANS 32
#define DN_WS_CAP ((int64_t)64 << 20)

/* the tensors the caller binds at execution, by unique id */
enum {
    DN_Q = 1, DN_K, DN_V, DN_O, DN_STATS, DN_DO, DN_DQ, DN_DK, DN_DV, DN_SCALE, DN_NEG_INF, DN_ONE,
    DN_SOFTMAX_SUM, DN_DQ_ACCUM, DN_VIRTUAL0 = 100
};

typedef struct {
    int bwd, B, T, nh, nkv, hd;
    int ok; /* 1 planned, -1 declined */
    cudnnBackendDescriptor_t plan;
    int64_t ws;
} DnPlan;

static struct {
    int state; /* 0 not tried, 1 handle ready, -1 unavailable */
    cudnnHandle_t h;
    DnPlan plans[DN_PLANS];
    int n;
    long calls;
} DN;

static Scratch sc_dn_qkv, sc_dn_o, sc_dn_do, sc_dn_dqkv, sc_dn_ws, sc_dn_sum, sc_dn_dq;

extern "C" long kernels_cuda_cudnn_attention_calls(void) { return DN.calls; }

/* Builder state: the first failing call is kept (and what it was), and
 * every descriptor created, to destroy them when a build fails. */
typedef struct {
    cudnnStatus_t err;
    const char *what;
    int line;
    cudnnBackendDescriptor_t made[160];
    int n_made;
    cudnnBackendDescriptor_t ops[48];
    int n_ops;
    int64_t next_virtual;
} DnBuild;

static void dn_note(DnBuild *b, cudnnStatus_t s, const char *what, int line) {
    if (s != CUDNN_STATUS_SUCCESS && b->err == CUDNN_STATUS_SUCCESS) {
        b->err = s;
        b->what = what;
        b->line = line;
    }
}
#define DN_CALL(b, x) dn_note((b), (x), #x, __LINE__)

static cudnnBackendDescriptor_t dn_new(DnBuild *b, cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (b->err != CUDNN_STATUS_SUCCESS) return NULL;
    if (b->n_made == (int)(sizeof b->made / sizeof b->made[0])) {
        dn_note(b, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors", __LINE__);
        return NULL;
    }
    DN_CALL(b, cudnnBackendCreateDescriptor(type, &d));
    if (b->err == CUDNN_STATUS_SUCCESS) b->made[b->n_made++] = d;
    return d;
}

static void dn_set(DnBuild *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                   int64_t n, const void *v) {
    if (b->err == CUDNN_STATUS_SUCCESS) DN_CALL(b, cudnnBackendSetAttribute(d, a, t, n, v));
}

static void dn_fin(DnBuild *b, cudnnBackendDescriptor_t d) {
    if (b->err == CUDNN_STATUS_SUCCESS) DN_CALL(b, cudnnBackendFinalize(d));
}

static void dn_free(DnBuild *b) {
    for (int i = b->n_made - 1; i >= 0; i--) (void)cudnnBackendDestroyDescriptor(b->made[i]);
    b->n_made = 0;
}

/* a tensor of rank nd (4, or 1 for a scalar); uid 0 = virtual (an
 * intermediate the engine keeps) */
static cudnnBackendDescriptor_t dn_tensor_nd(DnBuild *b, int64_t uid, cudnnDataType_t dt, int nd, const int64_t *dims,
                                             const int64_t *strides, int by_value) {
    const int64_t align = 16;
    const bool virt = uid == 0, byv = by_value != 0;
    if (virt) uid = b->next_virtual++;
    cudnnBackendDescriptor_t t = dn_new(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    dn_set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    dn_set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims);
    dn_set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides);
    dn_set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    dn_set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (virt) dn_set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    dn_set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byv);
    dn_fin(b, t);
    return t;
}

static cudnnBackendDescriptor_t dn_tensor(DnBuild *b, int64_t uid, cudnnDataType_t dt, int64_t d0, int64_t d1,
                                          int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    const int64_t dims[4] = {d0, d1, d2, d3}, strides[4] = {s0, s1, s2, s3};
    return dn_tensor_nd(b, uid, dt, 4, dims, strides, 0);
}

/* a virtual fp32 tensor with dense strides */
static cudnnBackendDescriptor_t dn_virt(DnBuild *b, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return dn_tensor(b, 0, CUDNN_DATA_FLOAT, d0, d1, d2, d3, d1 * d2 * d3, d2 * d3, d3, 1);
}

/* a one-element fp32 tensor passed by value (its host address is bound at
 * execution), [1, 1, 1, 1]: cuDNN's pointwise operations want every operand
 * of the output's rank (9.14 on an H200 declined a rank-1 scalar: "xDesc.getNbDims()
 * != bDesc.getNbDims()") */
static cudnnBackendDescriptor_t dn_scalar(DnBuild *b, int64_t uid) {
    const int64_t ones[4] = {1, 1, 1, 1};
    return dn_tensor_nd(b, uid, CUDNN_DATA_FLOAT, 4, ones, ones, 1);
}

/* an operation of this type with its ports (attribute, descriptor; a NULL
 * descriptor is left unset), finalized and added to the graph's list */
static void dn_op(DnBuild *b, cudnnBackendDescriptorType_t type, int n, const cudnnBackendAttributeName_t *ports,
                  const cudnnBackendDescriptor_t *descs) {
    cudnnBackendDescriptor_t op = dn_new(b, type);
    for (int i = 0; i < n; i++)
        if (descs[i]) dn_set(b, op, ports[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &descs[i]);
    dn_fin(b, op);
    if (b->err != CUDNN_STATUS_SUCCESS) return;
    if (b->n_ops == (int)(sizeof b->ops / sizeof b->ops[0])) {
        dn_note(b, CUDNN_STATUS_INTERNAL_ERROR, "too many operations", __LINE__);
        return;
    }
    b->ops[b->n_ops++] = op;
}

/* a finalized descriptor of an operation's parameters: one data type
 * attribute (the precision) and optionally a second attribute */
static cudnnBackendDescriptor_t dn_params(DnBuild *b, cudnnBackendDescriptorType_t type,
                                          cudnnBackendAttributeName_t prec_attr, cudnnDataType_t prec,
                                          cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t attr_type,
                                          const void *value) {
    cudnnBackendDescriptor_t d = dn_new(b, type);
    if (value) dn_set(b, d, attr, attr_type, 1, value);
    dn_set(b, d, prec_attr, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    dn_fin(b, d);
    return d;
}

/* y = mode(x[, b2][, t]) in fp32 (comparisons: boolean); GEN_INDEX takes an
 * axis (else pass -1) */
static void dn_pw(DnBuild *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b2,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
    const cudnnDataType_t prec = mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = dn_new(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    dn_set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    dn_set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) dn_set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    dn_fin(b, pw);
    const cudnnBackendAttributeName_t ports[] = {
        CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC};
    const cudnnBackendDescriptor_t descs[] = {pw, x, b2, t, y};
    dn_op(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 5, ports, descs);
}

/* y = reduce(x) over the dimensions where y is 1 */
static void dn_reduce(DnBuild *b, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnBackendAttributeName_t ports[] = {CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                 CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                 CUDNN_ATTR_OPERATION_REDUCTION_DESC};
    const cudnnBackendDescriptor_t descs[] = {
        x, y,
        dn_params(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT,
                  CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &red)};
    dn_op(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, ports, descs);
}

/* c = a b, batched over the first two dimensions (fp32 accumulation) */
static void dn_matmul(DnBuild *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm, cudnnBackendDescriptor_t c) {
    const cudnnBackendAttributeName_t ports[] = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                 CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC};
    const cudnnBackendDescriptor_t descs[] = {
        a, bm, c,
        dn_params(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT,
                  CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, NULL)};
    dn_op(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, ports, descs);
}

/* y: the elements of x seen through y's dimensions and strides */
static void dn_reshape(DnBuild *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnBackendAttributeName_t ports[] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
    const cudnnBackendDescriptor_t descs[] = {x, y};
    dn_op(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2, ports, descs);
}

/* s (fp32 [B, nh, T, T]) with the causal mask: -inf above the diagonal */
static cudnnBackendDescriptor_t dn_causal(DnBuild *b, cudnnBackendDescriptor_t s, int64_t B, int64_t nh, int64_t T) {
    const int64_t sh = T * T, sb = nh * sh;
    cudnnBackendDescriptor_t row = dn_tensor(b, 0, CUDNN_DATA_INT32, B, nh, T, T, sb, sh, T, 1);
    cudnnBackendDescriptor_t col = dn_tensor(b, 0, CUDNN_DATA_INT32, B, nh, T, T, sb, sh, T, 1);
    cudnnBackendDescriptor_t keep = dn_tensor(b, 0, CUDNN_DATA_BOOLEAN, B, nh, T, T, sb, sh, T, 1);
    cudnnBackendDescriptor_t ninf = dn_scalar(b, DN_NEG_INF), out = dn_virt(b, B, nh, T, T);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, row, 2);
    dn_pw(b, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, col, 3);
    dn_pw(b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, -1);
    dn_pw(b, CUDNN_POINTWISE_BINARY_SELECT, s, ninf, keep, out, -1);
    return out;
}

/* the plan of a finished operation list: the heuristics' engine configs in
 * their order, the first that finalizes with workspace within DN_WS_CAP */
static cudnnBackendDescriptor_t dn_plan(DnBuild *b, int64_t *ws) {
    if (b->err != CUDNN_STATUS_SUCCESS) return NULL;
    cudnnBackendDescriptor_t graph = dn_new(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    dn_set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &DN.h);
    dn_set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->n_ops, b->ops);
    dn_fin(b, graph);
    const cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = dn_new(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    dn_set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    dn_set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    dn_fin(b, heur);
    int64_t n = 0;
    if (b->err == CUDNN_STATUS_SUCCESS)
        DN_CALL(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                            NULL));
    if (n > 8) n = 8;
    cudnnBackendDescriptor_t cfg[8];
    for (int64_t i = 0; i < n; i++) cfg[i] = dn_new(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (n > 0 && b->err == CUDNN_STATUS_SUCCESS)
        DN_CALL(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                            cfg));
    if (b->err != CUDNN_STATUS_SUCCESS) return NULL;
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
            continue;
        int64_t w = 0, cnt = 0;
        if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &DN.h) ==
                CUDNN_STATUS_SUCCESS &&
            cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfg[i]) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &w) ==
                CUDNN_STATUS_SUCCESS &&
            w >= 0 && w <= DN_WS_CAP) {
            *ws = w;
            return plan;
        }
        (void)cudnnBackendDestroyDescriptor(plan);
    }
    dn_note(b, CUDNN_STATUS_NOT_SUPPORTED,
            got ? "no engine configuration finalized within the workspace cap" : "the heuristics offered no engine",
            __LINE__);
    return NULL;
}

/* strides of Q, K and V (views of qkv, [B, T, S]) and of O / dO ([B, T, OS]) */
#define DN_QKV_STRIDES(T, S, hd) (int64_t)(T) * (S), (int64_t)(hd), (int64_t)(S), 1
#define DN_KT_STRIDES(T, S, hd) (int64_t)(T) * (S), (int64_t)(hd), 1, (int64_t)(S)

static void dn_build_forward(DnBuild *b, int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd) {
    const int64_t S = (nh + 2 * nkv) * hd, OS = nh * hd;
    cudnnBackendDescriptor_t q = dn_tensor(b, DN_Q, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t kt = dn_tensor(b, DN_K, CUDNN_DATA_BFLOAT16, B, nkv, hd, T, DN_KT_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t v = dn_tensor(b, DN_V, CUDNN_DATA_BFLOAT16, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t o = dn_tensor(b, DN_O, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, OS, hd));
    cudnnBackendDescriptor_t stats = dn_tensor(b, DN_STATS, CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    cudnnBackendDescriptor_t scale = dn_scalar(b, DN_SCALE);
    cudnnBackendDescriptor_t s = dn_virt(b, B, nh, T, T), ss = dn_virt(b, B, nh, T, T);
    dn_matmul(b, q, kt, s);
    dn_pw(b, CUDNN_POINTWISE_MUL, s, scale, NULL, ss, -1);
    cudnnBackendDescriptor_t sm = dn_causal(b, ss, B, nh, T);
    /* softmax with its statistics */
    cudnnBackendDescriptor_t mx = dn_virt(b, B, nh, T, 1), sub = dn_virt(b, B, nh, T, T), e = dn_virt(b, B, nh, T, T);
    cudnnBackendDescriptor_t sum = dn_virt(b, B, nh, T, 1), lg = dn_virt(b, B, nh, T, 1);
    cudnnBackendDescriptor_t p = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, T, nh * T * T, T * T, T, 1);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_MAX, sm, mx);
    dn_pw(b, CUDNN_POINTWISE_SUB, sm, mx, NULL, sub, -1);
    dn_pw(b, CUDNN_POINTWISE_EXP, sub, NULL, NULL, e, -1);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    dn_pw(b, CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg, -1);
    dn_pw(b, CUDNN_POINTWISE_ADD, mx, lg, NULL, stats, -1);
    dn_pw(b, CUDNN_POINTWISE_DIV, e, sum, NULL, p, -1);
    dn_matmul(b, p, v, o);
}

static void dn_build_backward(DnBuild *b, int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd) {
    const int64_t S = (nh + 2 * nkv) * hd, OS = nh * hd, TT = T * T;
    cudnnBackendDescriptor_t q = dn_tensor(b, DN_Q, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t kt = dn_tensor(b, DN_K, CUDNN_DATA_BFLOAT16, B, nkv, hd, T, DN_KT_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t vt = dn_tensor(b, DN_V, CUDNN_DATA_BFLOAT16, B, nkv, hd, T, DN_KT_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t o = dn_tensor(b, DN_O, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, OS, hd));
    cudnnBackendDescriptor_t d_o = dn_tensor(b, DN_DO, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, OS, hd));
    cudnnBackendDescriptor_t stats = dn_tensor(b, DN_STATS, CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    cudnnBackendDescriptor_t dq = dn_tensor(b, DN_DQ, CUDNN_DATA_BFLOAT16, B, nh, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t dk = dn_tensor(b, DN_DK, CUDNN_DATA_BFLOAT16, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t dv = dn_tensor(b, DN_DV, CUDNN_DATA_BFLOAT16, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    cudnnBackendDescriptor_t scale = dn_scalar(b, DN_SCALE), one = dn_scalar(b, DN_ONE);
    /* rowsum(dO * O), kept in memory the caller provides */
    cudnnBackendDescriptor_t doo = dn_tensor(b, 0, CUDNN_DATA_FLOAT, B, nh, T, hd, nh * T * hd, T * hd, nh * hd, 1);
    cudnnBackendDescriptor_t rs = dn_virt(b, B, nh, T, 1);
    cudnnBackendDescriptor_t ssum = dn_tensor(b, DN_SOFTMAX_SUM, CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    dn_pw(b, CUDNN_POINTWISE_MUL, d_o, o, NULL, doo, -1);
    dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, doo, rs);
    dn_pw(b, CUDNN_POINTWISE_MUL, rs, one, NULL, ssum, -1);
    /* P = exp(S * scale - Stats), causal */
    cudnnBackendDescriptor_t s = dn_virt(b, B, nh, T, T), ss = dn_virt(b, B, nh, T, T), sub = dn_virt(b, B, nh, T, T);
    dn_matmul(b, q, kt, s);
    dn_pw(b, CUDNN_POINTWISE_MUL, s, scale, NULL, ss, -1);
    dn_pw(b, CUDNN_POINTWISE_SUB, ss, stats, NULL, sub, -1);
    cudnnBackendDescriptor_t sm = dn_causal(b, sub, B, nh, T), p = dn_virt(b, B, nh, T, T);
    dn_pw(b, CUDNN_POINTWISE_EXP, sm, NULL, NULL, p, -1);
    /* dV = P^T dO (per query head, summed over a kv head's group) */
    cudnnBackendDescriptor_t pt = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, T, nh * TT, TT, 1, T);
    dn_reshape(b, p, pt);
    if (nh == nkv) {
        dn_matmul(b, pt, d_o, dv);
    } else {
        cudnnBackendDescriptor_t dvh = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
        dn_matmul(b, pt, d_o, dvh);
        dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
    }
    /* dS = P * (dO V^T - rowsum) * scale */
    cudnnBackendDescriptor_t dp = dn_virt(b, B, nh, T, T), dps = dn_virt(b, B, nh, T, T), dpp = dn_virt(b, B, nh, T, T);
    cudnnBackendDescriptor_t ds = dn_virt(b, B, nh, T, T);
    dn_matmul(b, d_o, vt, dp);
    dn_pw(b, CUDNN_POINTWISE_SUB, dp, ssum, NULL, dps, -1);
    dn_pw(b, CUDNN_POINTWISE_MUL, dps, p, NULL, dpp, -1);
    dn_pw(b, CUDNN_POINTWISE_MUL, dpp, scale, NULL, ds, -1);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, T, nh * TT, TT, 1, T);
    dn_reshape(b, ds, dst);
    if (nh == nkv) {
        dn_matmul(b, dst, q, dk);
    } else {
        cudnnBackendDescriptor_t dkh = dn_tensor(b, 0, CUDNN_DATA_BFLOAT16, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
        dn_matmul(b, dst, q, dkh);
        dn_reduce(b, CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
    }
    /* dQ = dS K, accumulated in fp32 memory the caller provides */
    cudnnBackendDescriptor_t k = dn_tensor(b, 0, CUDNN_DATA_FLOAT, B, nkv, T, hd, DN_QKV_STRIDES(T, S, hd));
    dn_reshape(b, kt, k);
    cudnnBackendDescriptor_t dqa =
        dn_tensor(b, DN_DQ_ACCUM, CUDNN_DATA_FLOAT, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
    dn_matmul(b, ds, k, dqa);
    dn_pw(b, CUDNN_POINTWISE_IDENTITY, dqa, NULL, NULL, dq, -1);
}

/* cuDNN's handle on the backend's stream, once; NULL when the library
 * cannot start here (then every shape takes the fused kernels) */
static cudnnHandle_t dn_handle(void) {
    if (DN.state == 0) {
        cudnnStatus_t s = cudnnCreate(&DN.h);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(DN.h, 0);
        DN.state = s == CUDNN_STATUS_SUCCESS ? 1 : -1;
        if (DN.state < 0)
            warnf("cuDNN %zu did not start (%s): attention takes the fused kernels", (size_t)cudnnGetVersion(),
                  cudnnGetErrorString(s));
    }
    return DN.state > 0 ? DN.h : NULL;
}

/* The plan for this shape, built at first use; NULL when cuDNN declined it
 * (then or before). Head dims cuDNN's fused attention takes: multiples of 8
 * up to 128. */
static DnPlan *dn_get(int bwd, int B, int T, int nh, int nkv, int hd) {
    if (hd % 8 != 0 || hd > 128 || !dn_handle()) return NULL;
    for (int i = 0; i < DN.n; i++) {
        DnPlan *p = &DN.plans[i];
        if (p->bwd == bwd && p->B == B && p->T == T && p->nh == nh && p->nkv == nkv && p->hd == hd)
            return p->ok > 0 ? p : NULL;
    }
    if (DN.n == DN_PLANS) { /* more shapes than a training run has (sampling's growing contexts) */
        static int said;
        if (!said++) warnf("cuDNN attention: %d shapes planned; further shapes take the fused kernels", DN_PLANS);
        return NULL;
    }
    DnPlan *p = &DN.plans[DN.n++];
    memset(p, 0, sizeof *p);
    p->bwd = bwd, p->B = B, p->T = T, p->nh = nh, p->nkv = nkv, p->hd = hd;
    DnBuild b;
    memset(&b, 0, sizeof b);
    b.next_virtual = DN_VIRTUAL0;
    if (bwd) dn_build_backward(&b, B, T, nh, nkv, hd);
    else dn_build_forward(&b, B, T, nh, nkv, hd);
    p->plan = dn_plan(&b, &p->ws);
    /* a plan's descriptors (its engine configuration, the graph, the
     * tensors) stay alive as long as the plan, which is the process */
    if (!p->plan) dn_free(&b);
    p->ok = p->plan ? 1 : -1;
    if (!p->plan) {
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        warnf("cuDNN %zu declined attention %s B%d T%d heads %d/%d hd %d (%s: %s%s%s): the fused kernels take it",
              (size_t)cudnnGetVersion(), bwd ? "backward" : "forward", B, T, nh, nkv, hd,
              cudnnGetErrorString(b.err), b.what ? b.what : "?", msg[0] ? "; " : "", msg);
    }
    return p->plan ? p : NULL;
}

static void dn_execute(DnPlan *p, int n, const int64_t *uids, void **ptrs) {
    void *ws = p->ws ? scratch_get(&sc_dn_ws, (size_t)p->ws) : NULL;
    DnBuild b;
    memset(&b, 0, sizeof b);
    cudnnBackendDescriptor_t vp = dn_new(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    dn_set(&b, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    dn_set(&b, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    dn_set(&b, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    dn_fin(&b, vp);
    if (b.err == CUDNN_STATUS_SUCCESS) DN_CALL(&b, cudnnBackendExecute(DN.h, p->plan, vp));
    dn_free(&b);
    if (b.err != CUDNN_STATUS_SUCCESS) {
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        die(EXIT_INTERNAL, "cuDNN error at %s:%d: %s (%s)%s%s", __FILE__, b.line, cudnnGetErrorString(b.err), b.what,
            msg[0] ? ": " : "", msg);
    }
    LAUNCH_CHECK();
}

/* qkv as cuDNN reads it: the [a] buffer itself under act_bf16(), else a
 * bf16 copy */
static const __nv_bfloat16 *dn_qkv16(const float *qkv, size_t nq) {
    return act_bf16() ? CACT16(qkv) : (const __nv_bfloat16 *)bf16_copy(&sc_dn_qkv, qkv, nq);
}

/* The forward through cuDNN when it takes the shape; else 0 and nothing ran.
 * qkv and out are [a]: under act_bf16() cuDNN reads and writes them as they
 * are, else it reads a bf16 copy and writes a bf16 scratch, widened. */
static int dn_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return 0;
    DnPlan *p = dn_get(0, B, T, nh, nkv, hd);
    if (!p) return 0;
    const int S = (nh + 2 * nkv) * hd;
    const size_t nq = (size_t)B * T * S, no = (size_t)B * T * nh * hd;
    const __nv_bfloat16 *q16 = dn_qkv16(qkv, nq);
    void *o16 = act_bf16() ? (void *)out : scratch_get(&sc_dn_o, no * sizeof(__nv_bfloat16));
    float scale = 1.0f / sqrtf((float)hd), ninf = -INFINITY;
    const int64_t uids[] = {DN_Q, DN_K, DN_V, DN_O, DN_STATS, DN_SCALE, DN_NEG_INF};
    void *ptrs[] = {(void *)q16, (void *)(q16 + (size_t)nh * hd), (void *)(q16 + (size_t)(nh + nkv) * hd), o16,
                    (void *)lse, &scale, &ninf};
    dn_execute(p, 7, uids, ptrs);
    if (o16 != (void *)out) to_f32(out, o16, no);
    return 1;
}

static int dn_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                                 int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return 0;
    DnPlan *p = dn_get(1, B, T, nh, nkv, hd);
    if (!p) return 0;
    const int S = (nh + 2 * nkv) * hd;
    const size_t nq = (size_t)B * T * S, no = (size_t)B * T * nh * hd, rows = (size_t)B * nh * T;
    const __nv_bfloat16 *q16 = dn_qkv16(qkv, nq);
    const void *o16 = act_bf16() ? (const void *)out : bf16_copy(&sc_dn_o, out, no);
    const void *do16 = act_bf16() ? (const void *)dout : bf16_copy(&sc_dn_do, dout, no);
    /* dqkv is [a]: under bf16 cuDNN writes it in place */
    __nv_bfloat16 *dq16 =
        act_bf16() ? ACT16(dqkv) : (__nv_bfloat16 *)scratch_get(&sc_dn_dqkv, nq * sizeof(__nv_bfloat16));
    float *ssum = (float *)scratch_get(&sc_dn_sum, rows * sizeof(float));
    float *dqa = (float *)scratch_get(&sc_dn_dq, no * sizeof(float));
    /* cuDNN's frontend leaves this accumulator to the library from 9.6 on;
     * zeroed anyway (one pass of B*nh*T*hd floats) until a GPU run shows
     * the library overwrites it */
    cu_zero(dqa, no * sizeof(float));
    float scale = 1.0f / sqrtf((float)hd), ninf = -INFINITY, one = 1.0f;
    const int64_t uids[] = {DN_Q, DN_K, DN_V, DN_O, DN_DO, DN_STATS, DN_DQ, DN_DK, DN_DV,
                            DN_SCALE, DN_NEG_INF, DN_ONE, DN_SOFTMAX_SUM, DN_DQ_ACCUM};
    const size_t ko = (size_t)nh * hd, vo = (size_t)(nh + nkv) * hd;
    void *ptrs[] = {(void *)q16, (void *)(q16 + ko), (void *)(q16 + vo), (void *)o16, (void *)do16, (void *)lse,
                    (void *)dq16, (void *)(dq16 + ko), (void *)(dq16 + vo), &scale, &ninf, &one, (void *)ssum,
                    (void *)dqa};
    dn_execute(p, 14, uids, ptrs);
    if (!act_bf16()) to_f32(dqkv, dq16, nq); /* overwritten */
    return 1;
}

/* the attention output's and input's fp32 copies where out and qkv are [a]
 * bf16 but the kernels that run write or read fp32 (the GEMM path, the
 * TF32 / fp32 fused kernels) */
static Scratch sc_att32, sc_att_qkv32;

static void attention_forward_gemm(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
                                   int nkv, int hd) {
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *P = (float *)scratch_get(&sc_attp, (size_t)B * T * T * sizeof(float));
    for (int h = 0; h < nh; h++) {
        AttPass a = att_pass(h, B, T, nh, nkv, hd);
        /* P = softmax(scale * Q K^T) over the full square, then P V */
        rm_gemm(0, 1, T, T, hd, scale, qkv + a.q, S, a.sqkv, qkv + a.k, S, a.sqkv, 0.0f, P, T, a.sp, a.count, NULL);
        causal_softmax_lse_k<<<(unsigned)((size_t)B * T), row_threads(T)>>>(P, lse, qstart, T, nh, h);
        LAUNCH_CHECK();
        rm_gemm(0, 0, T, hd, T, 1.0f, P, T, a.sp, qkv + a.v, S, a.sqkv, 0.0f, out + a.o, OS, a.so, a.count, NULL);
    }
}

/* qkv and out are [a]: under bf16 cuDNN and the bf16 fused kernels read
 * and write them as bf16; any other path reads an fp32 copy of qkv and
 * writes fp32 into sc_att32, converted after. cuDNN's graphs are causal
 * only: a block-causal mask (qstart) takes the fused kernels. */
static void attention_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
                              int nkv, int hd) {
    check_heads(nh, nkv);
    const int mode = attention_mode(), flash = mode != ATT_GEMM;
    if (mode == ATT_CUDNN && !qstart && dn_attention_forward(out, lse, qkv, B, T, nh, nkv, hd)) {
        DN.calls++;
        return;
    }
    if (flash && fl_bf16() && flash_attention_forward(out, lse, qkv, qstart, B, T, nh, nkv, hd)) {
        flash_calls++;
        return;
    }
    const size_t n = (size_t)B * T * nh * hd, nq = (size_t)B * T * (nh + 2 * nkv) * hd;
    float *o = act_bf16() ? (float *)scratch_get(&sc_att32, n * sizeof(float)) : out;
    const float *q = act_bf16() ? f32_copy(&sc_att_qkv32, qkv, nq) : qkv;
    if (flash && !fl_bf16() && flash_attention_forward(o, lse, q, qstart, B, T, nh, nkv, hd)) flash_calls++;
    else attention_forward_gemm(o, lse, q, qstart, B, T, nh, nkv, hd);
    if (o != out) to_bf16(out, o, n);
}

static void attention_backward_gemm(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd) {
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *P = (float *)scratch_get(&sc_attp, (size_t)B * T * T * sizeof(float));
    float *dS = (float *)scratch_get(&sc_att, (size_t)B * T * T * sizeof(float));
    /* passes run one after another on the stream, so the query heads of one
     * kv head add into its dK and dV in turn (from zero: dqkv is
     * overwritten), and the scratch is reused */
    cu_zero(dqkv, (size_t)B * T * S * sizeof(float));
    for (int h = 0; h < nh; h++) {
        AttPass a = att_pass(h, B, T, nh, nkv, hd);
        const float *dO = dout + a.o;
        rm_gemm(0, 1, T, T, hd, scale, qkv + a.q, S, a.sqkv, qkv + a.k, S, a.sqkv, 0.0f, P, T, a.sp, a.count, NULL);
        causal_exp_lse_k<<<(unsigned)((size_t)B * T), row_threads(T)>>>(P, lse, qstart, T, nh, h);
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

/* dqkv's and dout's fp32 forms where they are [a] bf16 but the kernels
 * that run write or read fp32 (the GEMM path, the TF32 / fp32 fused
 * kernels) */
static Scratch sc_att_dqkv, sc_att_do32;

/* qkv, out, dout and dqkv are [a]: cuDNN and the bf16 fused kernels read
 * qkv, out and dout and write dqkv as bf16; any other path under bf16 reads
 * fp32 copies of qkv, out and dout and writes fp32 scratch, rounded into
 * dqkv after */
static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               const int *qstart, int B, int T, int nh, int nkv, int hd) {
    if (!dqkv) return;
    check_heads(nh, nkv);
    const int mode = attention_mode(), flash = mode != ATT_GEMM;
    if (mode == ATT_CUDNN && !qstart && dn_attention_backward(dqkv, dout, qkv, out, lse, B, T, nh, nkv, hd)) {
        DN.calls++;
        return;
    }
    if (flash && fl_bf16() && flash_attention_backward(dqkv, dout, qkv, out, lse, qstart, B, T, nh, nkv, hd)) {
        flash_calls++;
        return;
    }
    const float *o = out, *q = qkv, *dO = dout;
    float *dq = dqkv;
    const size_t nq = (size_t)B * T * (nh + 2 * nkv) * hd;
    if (act_bf16()) {
        const size_t n = (size_t)B * T * nh * hd;
        o = f32_copy(&sc_att32, out, n);
        dO = f32_copy(&sc_att_do32, dout, n);
        q = f32_copy(&sc_att_qkv32, qkv, nq);
        dq = (float *)scratch_get(&sc_att_dqkv, nq * sizeof(float));
    }
    if (flash && !fl_bf16() && flash_attention_backward(dq, dO, q, o, lse, qstart, B, T, nh, nkv, hd)) flash_calls++;
    else attention_backward_gemm(dq, dO, q, o, lse, qstart, B, T, nh, nkv, hd);
    if (dq != dqkv) to_bf16(dqkv, dq, nq);
}

/* calls of the pointwise kernels' 16-byte form (PW_E): RoPE's, SwiGLU's */
static long vec_pointwise_calls;
extern "C" long kernels_cuda_vec_pointwise_calls(void) { return vec_pointwise_calls; }

// ----------------------------------------------------------------------------
// RoPE (rotate-half) of every q and k head: a block a row, 8 elements a
// thread (rope_row_k) where head_dim is a multiple of 16, else a thread per
// (row, frequency) (rope_k); cos and sin times rope_mscale, as the CPU's
// table holds them

/* one pair (a, c) = (x[i], x[i + half]) rotated by the angle of cos cs and
 * sin sn (times rope_mscale; sn negated for the backward) */
__device__ __forceinline__ void rope_rot(float &a, float &c, float cs, float sn) {
    const float a0 = a;
    a = a0 * cs - c * sn;
    c = c * cs + a0 * sn;
}

/* T: float, or bf16 for the [a] qkv and dqkv under bf16 (rotated in fp32,
 * each element rounded once where it is stored) */
template <typename T_>
__global__ void rope_k(T_ *x, const int *pos, int N, int T, int nh, int nkv, int hd, Rope rope, float dir) {
    int half = hd / 2, S = (nh + 2 * nkv) * hd, nrot = nh + nkv;
    size_t total = (size_t)N * half;
    double m = rope_mscale(&rope);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(idx / half), i = (int)(idx % half);
        /* angles in double: pos * inv_freq reaches thousands of radians */
        double inv_freq = rope_inv_freq(&rope, i, hd);
        double ang = (double)(pos ? pos[n] : n % T) * inv_freq;
        double sd, cd;
        sincos(ang, &sd, &cd);
        float cs = (float)(cd * m), sn = dir * (float)(sd * m);
        T_ *row = x + (size_t)n * S;
        for (int hh = 0; hh < nrot; hh++) {
            T_ *v = row + (size_t)hh * hd;
            float a = act_ld(v, (size_t)i), c = act_ld(v, (size_t)(i + half));
            rope_rot(a, c, cs, sn);
            act_st(v, (size_t)i, a);
            act_st(v, (size_t)(i + half), c);
        }
    }
}

/* The 16-byte form (hd / 2 a multiple of PW_E, x 16-byte aligned): a
 * block a row at a time, its cos and sin computed once into shared memory
 * (as rope_k computes them), then PW_E frequencies of one head a thread;
 * each element the same expression as rope_k's, so the same bits */
template <typename T_>
__global__ void rope_row_k(T_ *x, const int *pos, int N, int T, int nh, int nkv, int hd, Rope rope, float dir) {
    extern __shared__ float rope_cs[]; /* cos [half], then dir * sin [half] */
    const int half = hd / 2, S = (nh + 2 * nkv) * hd, nrot = nh + nkv, HE = half / PW_E;
    const double m = rope_mscale(&rope);
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        __syncthreads(); /* the previous row's readers are done with the table */
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            double ang = (double)(pos ? pos[n] : n % T) * rope_inv_freq(&rope, i, hd);
            double sd, cd;
            sincos(ang, &sd, &cd);
            rope_cs[i] = (float)(cd * m);
            rope_cs[half + i] = dir * (float)(sd * m);
        }
        __syncthreads();
        T_ *row = x + (size_t)n * S;
        for (int it = threadIdx.x; it < nrot * HE; it += blockDim.x) {
            T_ *v = row + (size_t)(it / HE) * hd;
            const int i = (it % HE) * PW_E;
            float a[PW_E], c[PW_E];
            ldn<PW_E>(v + i, a);
            ldn<PW_E>(v + half + i, c);
#pragma unroll
            for (int k = 0; k < PW_E; k++) rope_rot(a[k], c[k], rope_cs[i + k], rope_cs[half + i + k]);
            stn<PW_E>(v + i, a);
            stn<PW_E>(v + half + i, c);
        }
    }
}

/* x16: x is an [a] buffer in bf16 */
static void rope_apply(float *x, int x16, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope,
                       float dir) {
    if (hd % 2 != 0) die(EXIT_INTERNAL, "rope: head_dim %d must be even", hd);
    size_t total = (size_t)B * T * (hd / 2);
    if (!total) return;
    if (hd % (2 * PW_E) == 0 && hd <= 4096 && aligned16(x)) {
        /* a thread per PW_E frequencies of a head, up to 256 a block; as
         * many blocks as the device holds at once (2048 threads an SM), each
         * taking rows in turn */
        const int items = (nh + nkv) * (hd / 2 / PW_E), threads = items >= 256 ? 256 : (items + 31) / 32 * 32;
        const int N = B * T, fill = resident_blocks(threads), blocks = N < fill ? N : fill;
        const size_t smem = (size_t)hd * sizeof(float);
        if (x16) rope_row_k<__nv_bfloat16><<<blocks, threads, smem>>>(ACT16(x), pos, N, T, nh, nkv, hd, *rope, dir);
        else rope_row_k<float><<<blocks, threads, smem>>>(x, pos, N, T, nh, nkv, hd, *rope, dir);
        vec_pointwise_calls++;
    } else if (x16) rope_k<__nv_bfloat16><<<grid_for(total, 256), 256>>>(ACT16(x), pos, B * T, T, nh, nkv, hd, *rope, dir);
    else rope_k<float><<<grid_for(total, 256), 256>>>(x, pos, B * T, T, nh, nkv, hd, *rope, dir);
    LAUNCH_CHECK();
}

/* qkv is [a] */
static void rope_forward(float *qkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope) {
    rope_apply(qkv, act_bf16(), pos, B, T, nh, nkv, hd, rope, 1.0f);
}

/* dqkv is [a] */
static void rope_backward(float *dqkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope) {
    rope_apply(dqkv, act_bf16(), pos, B, T, nh, nkv, hd, rope, -1.0f);
}

// ----------------------------------------------------------------------------
// pointwise

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

template <typename OT, typename IT> __global__ void gelu_fwd_k(OT *out, const IT *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = act_ld(inp, i);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        act_st(out, i, x / (1.0f + expf(-2.0f * u)));
    }
}

/* d gelu(x) / dx */
__device__ __forceinline__ float gelu_grad(float x) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float e = expf(-2.0f * u);
    float sg = 1.0f / (1.0f + e);
    float omsg = e * sg;
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return sg + 2.0f * x * sg * omsg * du;
}

__global__ void gelu_bwd_k(float *dinp, const float *inp, const float *dout, size_t n) {
    GRID_STRIDE(i, n) dinp[i] += dout[i] * gelu_grad(inp[i]);
}

/* the unfused DGELU epilogue: d *= gelu'(pre) (both fp32, or both bf16) */
template <typename T> __global__ void dgelu_inplace_k(T *d, const T *pre, size_t n) {
    GRID_STRIDE(i, n) act_st(d, i, act_ld(d, i) * gelu_grad(act_ld(pre, i)));
}

/* silu(g) * u, the SwiGLU of one gate g and up u */
__device__ __forceinline__ float swiglu_val(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* inp (gate | up) and out are [a]: float or bf16 alike */
template <typename T> __global__ void swiglu_fwd_k(T *out, const T *inp, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        act_st(out, i, swiglu_val(act_ld(inp, r * 2 * F + j), act_ld(inp, r * 2 * F + F + j)));
    }
}

template <typename T> __global__ void swiglu_fwd_vec_k(T *out, const T *inp, int N, int F) {
    const int FE = F / PW_E;
    GRID_STRIDE(i, (size_t)N * FE) {
        size_t r = i / FE, j = (i % FE) * PW_E;
        float g[PW_E], u[PW_E];
        ldn<PW_E>(inp + r * 2 * F + j, g);
        ldn<PW_E>(inp + r * 2 * F + F + j, u);
#pragma unroll
        for (int k = 0; k < PW_E; k++) g[k] = swiglu_val(g[k], u[k]);
        stn<PW_E>(out + r * F + j, g);
    }
}

/* SwiGLU's backward for one element: the gradients of gate g and up u
 * for the output gradient d */
__device__ __forceinline__ void swiglu_grads(float g, float u, float d, float *dg, float *du) {
    float e = expf(-g);
    float sg = 1.0f / (1.0f + e);
    *dg = d * u * sg * (1.0f + g * e * sg);
    *du = d * g * sg;
}

/* dinp [N, 2F] gets (d gate | d up) from dout [N, F] (row stride ldo; DT:
 * float or bf16) and the [a] pre-activation inp (IT: float or bf16): added
 * into (ADD, the kernels.h swiglu_backward) or stored, rounded once (the
 * bf16 [a] dpre of matmul_swiglu_backward, from its bf16 dh). dout may be
 * dinp's own gate columns (ldo 2F, fp32 [a]): the thread that reads a
 * d(out) writes its two gradients. */
template <typename T, bool ADD, typename IT, typename DT>
__global__ void swiglu_bwd_k(T *dinp, const IT *inp, const DT *dout, size_t ldo, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        float dg, du;
        swiglu_grads(act_ld(inp, r * 2 * F + j), act_ld(inp, r * 2 * F + F + j), act_ld(dout, r * ldo + j), &dg, &du);
        if constexpr (ADD) { /* __fadd_rn: never fused with the gradient's last product, in either form */
            dinp[r * 2 * F + j] = __fadd_rn(dinp[r * 2 * F + j], dg);
            dinp[r * 2 * F + F + j] = __fadd_rn(dinp[r * 2 * F + F + j], du);
        } else {
            act_st(dinp, r * 2 * F + j, dg);
            act_st(dinp, r * 2 * F + F + j, du);
        }
    }
}

template <typename T, bool ADD, typename IT, typename DT>
__global__ void swiglu_bwd_vec_k(T *dinp, const IT *inp, const DT *dout, size_t ldo, int N, int F) {
    const int FE = F / PW_E;
    GRID_STRIDE(i, (size_t)N * FE) {
        size_t r = i / FE, j = (i % FE) * PW_E;
        float g[PW_E], u[PW_E], d[PW_E];
        ldn<PW_E>(inp + r * 2 * F + j, g);
        ldn<PW_E>(inp + r * 2 * F + F + j, u);
        ldn<PW_E>(dout + r * ldo + j, d);
#pragma unroll
        for (int k = 0; k < PW_E; k++) swiglu_grads(g[k], u[k], d[k], &g[k], &u[k]);
        if constexpr (ADD) {
            float a[PW_E], b[PW_E];
            ldn<PW_E>(dinp + r * 2 * F + j, a);
            ldn<PW_E>(dinp + r * 2 * F + F + j, b);
#pragma unroll
            for (int k = 0; k < PW_E; k++) {
                g[k] = __fadd_rn(a[k], g[k]);
                u[k] = __fadd_rn(b[k], u[k]);
            }
        }
        stn<PW_E>(dinp + r * 2 * F + j, g);
        stn<PW_E>(dinp + r * 2 * F + F + j, u);
    }
}

__global__ void add_k(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_k(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}

/* out = gelu(pre); bf16: both bf16 (the unfused GELU_AUX epilogue of a
 * bf16 product) */
static void gelu_into(float *out, const float *pre, size_t n, int bf16) {
    if (!n) return;
    if (bf16) gelu_fwd_k<__nv_bfloat16, __nv_bfloat16><<<grid_for(n, 256), 256>>>(ACT16(out), CACT16(pre), n);
    else gelu_fwd_k<float, float><<<grid_for(n, 256), 256>>>(out, pre, n);
    LAUNCH_CHECK();
}

static void gelu_forward(float *out, const float *inp, size_t n) { gelu_into(out, inp, n, act_bf16()); }

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (!n || !dinp) return;
    gelu_bwd_k<<<grid_for(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK();
}

static void dgelu_inplace(float *d, const float *pre, size_t n, int bf16) {
    if (!n) return;
    if (bf16) dgelu_inplace_k<__nv_bfloat16><<<grid_for(n, 256), 256>>>(ACT16(d), CACT16(pre), n);
    else dgelu_inplace_k<float><<<grid_for(n, 256), 256>>>(d, pre, n);
    LAUNCH_CHECK();
}

/* whether a [N, 2F] SwiGLU call takes the PW_E-element form */
static int swiglu_vec(int F, const void *a, const void *b, const void *c) {
    const int v = F % PW_E == 0 && aligned16(a) && aligned16(b) && aligned16(c);
    vec_pointwise_calls += v;
    return v;
}

template <typename T, bool ADD, typename IT, typename DT>
static void swiglu_bwd_launch(T *dinp, const IT *inp, const DT *dout, size_t ldo, int N, int F) {
    if (N <= 0 || F <= 0) return;
    if (swiglu_vec(F, dinp, inp, dout))
        swiglu_bwd_vec_k<T, ADD, IT, DT><<<grid_for((size_t)N * (F / PW_E), 256), 256>>>(dinp, inp, dout, ldo, N, F);
    else swiglu_bwd_k<T, ADD, IT, DT><<<grid_for((size_t)N * F, 256), 256>>>(dinp, inp, dout, ldo, N, F);
    LAUNCH_CHECK();
}

/* d [N, 2F] (fp32) holds dh in its gate columns: the gradients in place */
static void swiglu_bwd_inplace(float *d, const float *pre, int N, int F) {
    swiglu_bwd_launch<float, false, float, float>(d, pre, d, 2 * (size_t)F, N, F);
}

/* dh [N, F] is bf16 (the input-gradient GEMM's output, rounded once) */
static void swiglu_bwd_act(float *dpre, const float *dh, const float *pre, int N, int F) {
    swiglu_bwd_launch<__nv_bfloat16, false, __nv_bfloat16, __nv_bfloat16>(ACT16(dpre), CACT16(pre), CACT16(dh),
                                                                          (size_t)F, N, F);
}

template <typename T> static void swiglu_fwd_launch(T *out, const T *inp, int N, int F) {
    if (swiglu_vec(F, out, inp, inp)) swiglu_fwd_vec_k<T><<<grid_for((size_t)N * (F / PW_E), 256), 256>>>(out, inp, N, F);
    else swiglu_fwd_k<T><<<grid_for((size_t)N * F, 256), 256>>>(out, inp, N, F);
    LAUNCH_CHECK();
}

static void swiglu_forward(float *out, const float *inp, int N, int F) {
    if (N <= 0 || F <= 0) return;
    if (act_bf16()) swiglu_fwd_launch(ACT16(out), CACT16(inp), N, F);
    else swiglu_fwd_launch(out, inp, N, F);
}

static void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
    if (!dinp) return;
    if (act_bf16()) swiglu_bwd_launch<float, true, __nv_bfloat16, float>(dinp, CACT16(inp), dout, (size_t)F, N, F);
    else swiglu_bwd_launch<float, true, float, float>(dinp, inp, dout, (size_t)F, N, F);
}

static void add(float *out, const float *a, const float *b, size_t n) {
    if (!n) return;
    /* a fresh gradient read (model.c's sequence-parallel norm weights) */
    grad_ready(a, n * sizeof(float));
    grad_ready(b, n * sizeof(float));
    if (out != a && out != b) grad_ready(out, n * sizeof(float));
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

/* VEC: PW_E words a thread (16 bytes of bf16 stored at once) up to the last
 * whole group, both pointers 16-byte aligned, as convert_k */
template <bool VEC>
__global__ void pack_bf16_k(uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    size_t done = 0;
    if constexpr (VEC) {
        done = n / PW_E * PW_E;
        GRID_STRIDE(g, n / PW_E) {
            float v[PW_E];
            uint32_t w[PW_E / 2];
            static_assert(PW_E == 8, "pack_bf16_k stores one uint4");
            ldn<PW_E>(src + g * PW_E, v);
#pragma unroll
            for (int k = 0; k < PW_E; k += 2)
                w[k / 2] = round_bf16_word(__float_as_uint(v[k]), seed, index0 + g * PW_E + k) >> 16 |
                           (round_bf16_word(__float_as_uint(v[k + 1]), seed, index0 + g * PW_E + k + 1) & 0xffff0000u);
            *(uint4 *)(void *)(dst + g * PW_E) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
    GRID_STRIDE(i, n - done)
        dst[done + i] = (uint16_t)(round_bf16_word(__float_as_uint(src[done + i]), seed, index0 + done + i) >> 16);
}

static void pack_bf16(uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    if (!n) return;
    if (aligned16(dst) && aligned16(src)) {
        pack_bf16_k<true><<<grid_for(n / PW_E + 1, 256), 256>>>(dst, src, n, seed, index0);
        vec_convert_calls++;
    } else pack_bf16_k<false><<<grid_for(n, 256), 256>>>(dst, src, n, seed, index0);
    LAUNCH_CHECK();
}

/* In place, elements [lo, n) in one block, tile by ascending tile: every
 * thread reads its word before the barrier and writes after it (a tile's
 * writes land on words <= its own, already read: kernels_cpu.c). */
__global__ void unpack_bf16_tail_k(float *dst, const uint16_t *src, size_t lo, size_t n) {
    for (size_t i0 = lo; i0 < n; i0 += blockDim.x) {
        size_t i = i0 + threadIdx.x;
        uint16_t w = i < n ? src[i] : 0;
        __syncthreads();
        if (i < n) dst[i] = __uint_as_float((uint32_t)w << 16);
        __syncthreads();
    }
}

/* to_f32 (bf16 -> fp32 is exact). In place (src == (uint16_t *)dst + n):
 * halves of what is left, each a to_f32 whose writes miss every word not
 * yet read, then the tail in one block (the CPU backend's order). */
static void unpack_bf16(float *dst, const uint16_t *src, size_t n) {
    if (src != (const uint16_t *)(void *)dst + n) {
        to_f32(dst, src, n);
        return;
    }
    size_t lo = 0;
    while (n - lo > 65536) {
        size_t h = (n - lo) / 2;
        to_f32(dst + lo, src + lo, h);
        lo += h;
    }
    if (lo == n) return;
    unpack_bf16_tail_k<<<1, 1024>>>(dst, src, lo, n);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// loss: one block per row of logits

#define CE_THREADS 512

/* running (max, sum of exp(x - max)) of a stream of logits: the sum is
 * rescaled when the max grows; -inf terms add nothing, NaN propagates */
__device__ __forceinline__ void ce_online(float &m, float &s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f; /* m = -inf: s is 0 */
        m = v;
    } else {
        s += v == -INFINITY ? 0.0f : expf(v - m);
    }
}

/* two partial (max, sum) pairs as one */
__device__ __forceinline__ void ce_merge(float &m, float &s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
    m = mn;
}

/* the warp's pairs merged, the result in every lane */
__device__ __forceinline__ void ce_warp_merge(float &m, float &s) {
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ce_merge(m, s, m2, s2);
    }
}

/* full-vocabulary softmax + loss; an out-of-range target gives a NaN loss,
 * CE_NO_TARGET a loss of 0 (and with grad a zero row).
 * Two passes over the row instead of three: the max and the sum in one
 * (online), then the probabilities. CE_FWD_THREADS = 1024: fewer rows in
 * flight, so the second pass finds more of its row in L2. */
#define CE_FWD_THREADS 1024
/* grad: the second pass writes (p - onehot(target)) * dloss instead of p
 * (crossentropy_fused: ce_bwd_k's arithmetic, without its pass) */
/* The logits are [a]: T is float or bf16 (act_ld / act_st); with bf16 the
 * gradient is taken from the probability as stored (rounded to bf16 first),
 * so that it has the bits of ce_fwd_k then ce_bwd_k (kernels.h) */
__device__ __forceinline__ float as_stored(const float *, float v) { return v; }
__device__ __forceinline__ float as_stored(const __nv_bfloat16 *, float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

/* ce_online over E logits at once: the sum rescaled once to their max, then
 * their E exponentials (independent, so in flight together) added */
template <int E> __device__ __forceinline__ void ce_online_n(float &m, float &s, const float *v) {
    float vm = v[0];
#pragma unroll
    for (int i = 1; i < E; i++) vm = fmaxf(vm, v[i]);
    if (vm > m) {
        s *= expf(m - vm); /* m = -inf: s is 0 */
        m = vm;
    }
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < E; i++) t += v[i] == -INFINITY ? 0.0f : expf(v[i] - m);
    s += t;
}

/* logit v of column j as the forward stores it: its probability, or with
 * grad the loss gradient (p - onehot(target)) * dloss, 0 for CE_NO_TARGET */
template <typename T>
__device__ __forceinline__ float ce_prob(const T *x, float v, float m, float inv, int j, int tg, int grad, float dloss) {
    float p = expf(v - m) * inv;
    if (grad) {
        p = as_stored(x, p);
        if (j == tg) p -= 1.0f;
        p = tg == CE_NO_TARGET ? 0.0f : p * dloss;
    }
    return p;
}

/* VEC: V a multiple of 16 / sizeof(T) and the logits 16-byte aligned, so
 * every row is: each thread takes 16 bytes at a time (ld16 / st16;
 * ce_online_n). One 2-byte load in flight a thread read GPT-2's bf16 logits
 * at 1.2 TB/s on an H200. */
template <typename T, int VEC>
__global__ void __launch_bounds__(CE_FWD_THREADS) ce_fwd_k(float *losses, T *logits, const int *targets, int V,
                                                           int grad, float dloss) {
    constexpr int E = 16 / (int)sizeof(T);
    __shared__ float shm[32], shs[32];
    T *x = logits + (size_t)blockIdx.x * V;
    const int tg = targets[blockIdx.x], lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY, s = 0.0f;
    if (VEC) {
        for (int q = threadIdx.x; q < V / E; q += blockDim.x) {
            float v[E];
            ld16(x + (size_t)q * E, v);
            ce_online_n<E>(m, s, v);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) ce_online(m, s, act_ld(x, j));
    }
    ce_warp_merge(m, s);
    if (lane == 0) {
        shm[wid] = m;
        shs[wid] = s;
    }
    __syncthreads();
    m = lane < nw ? shm[lane] : -INFINITY;
    s = lane < nw ? shs[lane] : 0.0f;
    ce_warp_merge(m, s);
    /* read the target's logit before the row is overwritten */
    const float xt = (tg >= 0 && tg < V) ? act_ld(x, tg) : NAN;
    __syncthreads();
    const float inv = 1.0f / s;
    if (VEC) {
        for (int q = threadIdx.x; q < V / E; q += blockDim.x) {
            float v[E];
            ld16(x + (size_t)q * E, v);
#pragma unroll
            for (int i = 0; i < E; i++) v[i] = ce_prob(x, v[i], m, inv, q * E + i, tg, grad, dloss);
            st16(x + (size_t)q * E, v);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) act_st(x, j, ce_prob(x, act_ld(x, j), m, inv, j, tg, grad, dloss));
    }
    if (threadIdx.x == 0) losses[blockIdx.x] = tg == CE_NO_TARGET ? 0.0f : (float)(log((double)s) - ((double)xt - m));
}

/* probs -> (probs - onehot(target - v0)) * dloss (0 for CE_NO_TARGET) */
template <typename T> __global__ void ce_bwd_k(T *probs, const int *targets, float dloss, int N, int V, int v0) {
    size_t n = (size_t)N * V;
    GRID_STRIDE(i, n) {
        int r = (int)(i / V), j = (int)(i % V);
        float p = act_ld(probs, i);
        if (targets[r] - v0 == j) p -= 1.0f;
        act_st(probs, i, targets[r] == CE_NO_TARGET ? 0.0f : p * dloss);
    }
}

template <typename T> __global__ void ce_vp_max_k(float *rowmax, const T *logits, int V) {
    const T *x = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, act_ld(x, j));
    m = block_max(m);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

/* the sum is of the exponentials as computed; the stored ones (bf16 [a])
 * are rounded */
template <typename T>
__global__ void ce_vp_expsum_k(float *sums, float *tgt, T *logits, const float *rowmax, const int *targets, int V,
                               int v0) {
    T *x = logits + (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x] - v0;
    float xt = (t >= 0 && t < V) ? act_ld(x, t) : 0.0f;
    __syncthreads();
    float m = rowmax[blockIdx.x], s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float e = expf(act_ld(x, j) - m);
        act_st(x, j, e);
        s += e;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        sums[blockIdx.x] = s;
        tgt[blockIdx.x] = xt;
    }
}

template <typename T>
__global__ void ce_vp_finish_k(float *losses, T *logits, const float *rowmax, const float *sums, const float *tgt,
                               const int *targets, int V) {
    T *x = logits + (size_t)blockIdx.x * V;
    float inv = (float)(1.0 / (double)sums[blockIdx.x]);
    for (int j = threadIdx.x; j < V; j += blockDim.x) act_st(x, j, act_ld(x, j) * inv);
    if (threadIdx.x == 0)
        losses[blockIdx.x] = targets[blockIdx.x] == CE_NO_TARGET
                                 ? 0.0f
                                 : (float)(log((double)sums[blockIdx.x]) - ((double)tgt[blockIdx.x] - rowmax[blockIdx.x]));
}

static long vec_ce_calls;
extern "C" long kernels_cuda_vec_ce_calls(void) { return vec_ce_calls; }

static void ce_fwd(float *losses, float *logits, const int *targets, int N, int V, int grad, float dloss) {
    if (N <= 0) return;
    const int vec = aligned16(logits) && V % (act_bf16() ? 8 : 4) == 0;
    if (act_bf16() && vec)
        ce_fwd_k<__nv_bfloat16, 1><<<N, CE_FWD_THREADS>>>(losses, ACT16(logits), targets, V, grad, dloss);
    else if (act_bf16())
        ce_fwd_k<__nv_bfloat16, 0><<<N, CE_FWD_THREADS>>>(losses, ACT16(logits), targets, V, grad, dloss);
    else if (vec) ce_fwd_k<float, 1><<<N, CE_FWD_THREADS>>>(losses, logits, targets, V, grad, dloss);
    else ce_fwd_k<float, 0><<<N, CE_FWD_THREADS>>>(losses, logits, targets, V, grad, dloss);
    LAUNCH_CHECK();
    if (vec) vec_ce_calls++;
}

static void crossentropy_forward(float *losses, float *logits, const int *targets, int N, int V) {
    ce_fwd(losses, logits, targets, N, V, 0, 0.0f);
}

static void crossentropy_fused(float *losses, float *logits, const int *targets, float dloss, int N, int V) {
    ce_fwd(losses, logits, targets, N, V, 1, dloss);
}

static void crossentropy_vp_backward(float *probs, const int *targets, float dloss, int N, int V, int v0) {
    if (N <= 0) return;
    const unsigned grid = grid_for((size_t)N * V, 256);
    if (act_bf16()) ce_bwd_k<__nv_bfloat16><<<grid, 256>>>(ACT16(probs), targets, dloss, N, V, v0);
    else ce_bwd_k<float><<<grid, 256>>>(probs, targets, dloss, N, V, v0);
    LAUNCH_CHECK();
}

static void crossentropy_backward(float *probs, const int *targets, float dloss, int N, int V) {
    crossentropy_vp_backward(probs, targets, dloss, N, V, 0);
}

static void crossentropy_vp_max(float *rowmax, const float *logits, int N, int V) {
    if (N <= 0) return;
    if (act_bf16()) ce_vp_max_k<__nv_bfloat16><<<N, CE_THREADS>>>(rowmax, CACT16(logits), V);
    else ce_vp_max_k<float><<<N, CE_THREADS>>>(rowmax, logits, V);
    LAUNCH_CHECK();
}

static void crossentropy_vp_expsum(float *sums, float *tgt, float *logits, const float *rowmax, const int *targets,
                                   int N, int V, int v0) {
    if (N <= 0) return;
    if (act_bf16()) ce_vp_expsum_k<__nv_bfloat16><<<N, CE_THREADS>>>(sums, tgt, ACT16(logits), rowmax, targets, V, v0);
    else ce_vp_expsum_k<float><<<N, CE_THREADS>>>(sums, tgt, logits, rowmax, targets, V, v0);
    LAUNCH_CHECK();
}

static void crossentropy_vp_finish(float *losses, float *logits, const float *rowmax, const float *sums,
                                   const float *tgt, const int *targets, int N, int V) {
    if (N <= 0) return;
    if (act_bf16())
        ce_vp_finish_k<__nv_bfloat16><<<N, CE_THREADS>>>(losses, ACT16(logits), rowmax, sums, tgt, targets, V);
    else ce_vp_finish_k<float><<<N, CE_THREADS>>>(losses, logits, rowmax, sums, tgt, targets, V);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// reductions: deterministic (a grid fixed by n, red_grid; per-block
// partials in double, a fixed-order final sum), returned to the host

/* Each thread: four 16-byte loads in flight per round (x 16-byte aligned;
 * else the scalar loop), four double sums, then the n % 4 tail. The order is
 * fixed by the grid, so the same bits every run. (The scalar loop, one load
 * in flight a thread, read the Llama 1B shape's 4.9 GB of gradients at 1.3
 * TB/s on an H200.) */
template <int SQ> __device__ __forceinline__ double red_term(float v) {
    double d = v;
    return SQ ? d * d : d;
}
template <int SQ> __device__ __forceinline__ double red_term4(float4 v) {
    return red_term<SQ>(v.x) + red_term<SQ>(v.y) + red_term<SQ>(v.z) + red_term<SQ>(v.w);
}

template <int SQ> __global__ void reduce_partial_k(const float *x, size_t n, double *partial) {
    double s = 0.0;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (((uintptr_t)x & 15) == 0) {
        const float4 *x4 = (const float4 *)x;
        const size_t n4 = n / 4;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        size_t i = tid;
        for (; i + 3 * stride < n4; i += 4 * stride) {
            const float4 a = x4[i], b = x4[i + stride], c = x4[i + 2 * stride], d = x4[i + 3 * stride];
            s0 += red_term4<SQ>(a);
            s1 += red_term4<SQ>(b);
            s2 += red_term4<SQ>(c);
            s3 += red_term4<SQ>(d);
        }
        for (; i < n4; i += stride) s0 += red_term4<SQ>(x4[i]);
        if (tid < n - n4 * 4) s0 += red_term<SQ>(x[n4 * 4 + tid]);
        s = (s0 + s1) + (s2 + s3);
    } else {
        GRID_STRIDE(i, n) s += red_term<SQ>(x[i]);
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
    const unsigned grid = red_grid(n);
    if (sq) reduce_partial_k<1><<<grid, RED_THREADS>>>(x, n, G.red_partial);
    else reduce_partial_k<0><<<grid, RED_THREADS>>>(x, n, G.red_partial);
    LAUNCH_CHECK();
    reduce_final_k<<<1, RED_THREADS>>>(G.red_partial, (int)grid, G.red_out);
    LAUNCH_CHECK();
    double h = 0.0;
    cu_to_host(&h, G.red_out, sizeof h);
    return h;
}

static double sumsq(const float *x, size_t n) { return reduce(x, n, 1); }

/* sumsq beside the compute: the same two kernels and grid on a
 * non-blocking stream of the lowest priority (the compute stream's pending
 * blocks go first wherever an SM frees; a side block already running is
 * not preempted, but red_grid keeps each one's work to 64 KB), ordered
 * after the compute queued so far by an event; its sums run in turn there,
 * so one partial buffer serves them all. The take
 * makes the compute stream wait for them, then copies through the host
 * wait (which polls collectives). */
static struct {
    cudaStream_t s;
    cudaEvent_t after_compute, done;
    double *partial; /* [RED_MAX_BLOCKS] */
} SIDE;

static void sumsq_queue(const float *x, size_t n, double *dst) {
    CUDA_CHECK(cudaEventRecord(SIDE.after_compute, 0));
    CUDA_CHECK(cudaStreamWaitEvent(SIDE.s, SIDE.after_compute, 0));
    if (!n) {
        CUDA_CHECK(cudaMemsetAsync(dst, 0, sizeof *dst, SIDE.s));
        return;
    }
    const unsigned grid = red_grid(n);
    reduce_partial_k<1><<<grid, RED_THREADS, 0, SIDE.s>>>(x, n, SIDE.partial);
    LAUNCH_CHECK();
    reduce_final_k<<<1, RED_THREADS, 0, SIDE.s>>>(SIDE.partial, (int)grid, dst);
    LAUNCH_CHECK();
}

static void sumsq_take(double *host, const double *dst, int n) {
    if (n <= 0) return;
    CUDA_CHECK(cudaEventRecord(SIDE.done, SIDE.s));
    CUDA_CHECK(cudaStreamWaitEvent(0, SIDE.done, 0));
    cu_to_host(host, dst, (size_t)n * sizeof *host);
}

static double sum(const float *x, size_t n) { return reduce(x, n, 0); }

// ----------------------------------------------------------------------------
// AdamW: torch.optim.AdamW (single-tensor path), operation for operation,
// over one range or (adamw_multi) several ranges of the same flat arrays in
// one launch

typedef struct {
    size_t offset, n, start; /* start: elements of all earlier ranges */
    float wd;                /* the kernel forms 1 - lr * wd as adamw does */
    int norm;                /* counts in the sum of squares */
} DevRange;

/* the constants of one step (AdamConsts and the hyperparameters) */
typedef struct {
    float beta1, beta2, ob1, ob2, eps, step_size, bc2_sqrt, grad_scale;
} AdamK;

/* one element, as torch's single-tensor AdamW. The sums are __fadd_rn /
 * __fsub_rn, never fused with a product into a multiply-add: nvcc fused
 * p * decay - step into one differently in adamw_k and adamw_multi_k (on an
 * H200, 22,857 of 100,003 weights a bit apart between the two kernels), and
 * every kernel here must give the same bits for the same element. */
__device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v, float decay, const AdamK &k) {
    const float gi = g * k.grad_scale;
    m = __fadd_rn(k.beta1 * m, k.ob1 * gi);
    v = __fadd_rn(k.beta2 * v, k.ob2 * gi * gi);
    p = __fsub_rn(p * decay, k.step_size * (m / (sqrtf(v) / k.bc2_sqrt + k.eps)));
}

/* element i; returns its new weight */
__device__ __forceinline__ float adamw_elem(float *p, const float *g, float *m, float *v, size_t i, float decay,
                                            const AdamK &k) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, decay, k);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    return pi;
}

/* four elements from i (a multiple of 4, the arrays 16-byte aligned) with
 * 16-byte loads and stores: adamw_one on each, the same bits as adamw_elem.
 * (The element-at-a-time kernels ran the Llama 1B shape's 1.24 B parameters,
 * 28 bytes each, at 3.15 TB/s on an H200.) */
__device__ __forceinline__ float4 adamw_elem4(float *p, const float *g, float *m, float *v, size_t i, float decay,
                                              const AdamK &k) {
    float4 p4 = *(float4 *)(void *)(p + i), m4 = *(float4 *)(void *)(m + i), v4 = *(float4 *)(void *)(v + i);
    const float4 g4 = *(const float4 *)(const void *)(g + i);
    adamw_one(p4.x, g4.x, m4.x, v4.x, decay, k);
    adamw_one(p4.y, g4.y, m4.y, v4.y, decay, k);
    adamw_one(p4.z, g4.z, m4.z, v4.z, decay, k);
    adamw_one(p4.w, g4.w, m4.w, v4.w, decay, k);
    *(float4 *)(void *)(m + i) = m4;
    *(float4 *)(void *)(v + i) = v4;
    *(float4 *)(void *)(p + i) = p4;
    return p4;
}

/* vec (p, g, m, v 16-byte aligned): thread-groups of 4 elements, then the
 * n % 4 tail one at a time */
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float decay, AdamK k, int vec) {
    if (vec) {
        GRID_STRIDE(q, n / 4) adamw_elem4(p, g, m, v, 4 * q, decay, k);
        const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < n % 4) adamw_elem(p, g, m, v, n / 4 * 4 + t, decay, k);
    } else {
        GRID_STRIDE(i, n) adamw_elem(p, g, m, v, i, decay, k);
    }
}

/* the last range with start <= i */
__device__ __forceinline__ int adam_range(const DevRange *r, int nr, size_t i) {
    int lo = 0, hi = nr - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (r[mid].start <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Thread-groups of 4 of the ranges' concatenated elements (total of them):
 * a group inside one range whose array index is a multiple of 4 (vec: the
 * arrays 16-byte aligned) in one adamw_elem4, any other (across a range's
 * end, or a range not starting on a multiple of 4) one element at a time.
 * w16 (not NULL): the bf16 copy of p (to nearest even, as to_bf16), each
 * updated weight's written too. partial (not NULL): the block's sum of
 * squares of the updated weights of the norm ranges, in double, at
 * partial[blockIdx.x] (a grid fixed by the device, so the same bits every
 * run). */
__global__ void adamw_multi_k(float *p, const float *g, float *m, float *v, const DevRange *r, int nr, size_t total,
                              float lr, AdamK k, int vec, __nv_bfloat16 *w16, double *partial) {
    double s = 0.0;
    GRID_STRIDE(q, (total + 3) / 4) {
        const size_t i0 = 4 * q;
        const int a = adam_range(r, nr, i0);
        const size_t j0 = r[a].offset + (i0 - r[a].start);
        if (vec && i0 + 4 <= r[a].start + r[a].n && j0 % 4 == 0) {
            const float4 u = adamw_elem4(p, g, m, v, j0, (float)(1.0 - (double)lr * r[a].wd), k);
            if (w16) *(uint2 *)(void *)(w16 + j0) = make_uint2(fb_pack(u.x, u.y), fb_pack(u.z, u.w));
            if (partial && r[a].norm)
                s += ((double)u.x * u.x + (double)u.y * u.y) + ((double)u.z * u.z + (double)u.w * u.w);
            continue;
        }
        for (size_t i = i0; i < i0 + 4 && i < total; i++) {
            const int b = adam_range(r, nr, i);
            const size_t j = r[b].offset + (i - r[b].start);
            const float u = adamw_elem(p, g, m, v, j, (float)(1.0 - (double)lr * r[b].wd), k);
            if (w16) w16[j] = __float2bfloat16_rn(u);
            if (partial && r[b].norm) s += (double)u * u;
        }
    }
    if (partial) { /* the same for every thread of the block */
        s = block_sum(s);
        if (threadIdx.x == 0) partial[blockIdx.x] = s;
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

static AdamK adam_k(AdamConsts c, float beta1, float beta2, float eps, float grad_scale) {
    AdamK k;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.ob1 = c.ob1;
    k.ob2 = c.ob2;
    k.eps = eps;
    k.step_size = c.step_size;
    k.bc2_sqrt = c.bc2_sqrt;
    k.grad_scale = grad_scale;
    return k;
}

static void adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, int t, float grad_scale) {
    if (!n) return;
    AdamConsts c = adam_consts(lr, beta1, beta2, t);
    float decay = (float)(1.0 - (double)lr * wd);
    const AdamK k = adam_k(c, beta1, beta2, eps, grad_scale);
    const int vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
    adamw_k<<<grid_for(vec ? (n + 3) / 4 : n, 256), 256>>>(p, g, m, v, n, decay, k, vec);
    LAUNCH_CHECK();
}

/* The weight cache's flat bf16 copy for an AdamW over p with the k ranges
 * r (see the weight cache): NULL unless p starts a declared range that holds
 * every range and products have copied weights inside it; made the first
 * time (the entries' own copies freed first, so the two never sit side by
 * side), its entries views of it. */
static __nv_bfloat16 *wc_flat_for(const float *p, const DevRange *r, int k) {
    if (!wc_enabled()) return NULL;
    size_t n = 0, end = 0;
    for (int i = 0; i < wc_nr && !n; i++)
        if (wc_range[i].p == p) n = wc_range[i].n;
    for (int i = 0; i < k; i++) end = r[i].offset + r[i].n > end ? r[i].offset + r[i].n : end;
    int copied = 0;
    for (int i = 0; i < wc_n && !copied; i++) copied = inside(wc[i].w, wc[i].n, p, n);
    if (!n || end > n || !copied) return NULL;
    if (wc_flat.bf && (wc_flat.p != p || wc_flat.n != n)) wc_flat_drop();
    const int make = !wc_flat.bf;
    wc_flat.p = p;
    wc_flat.n = n;
    for (int i = 0; i < wc_n; i++) {
        WcEntry *e = &wc[i];
        if (e->view || !flat_view_ok(e->w, e->n)) continue;
        dev_free(e->bf, e->n * sizeof(__nv_bfloat16));
        wc_bytes -= e->n * sizeof(__nv_bfloat16);
        e->bf = NULL;
        e->view = 1;
        e->current = 0;
    }
    if (make) {
        DEV_MALLOC(&wc_flat.bf, n * sizeof(__nv_bfloat16));
        wc_bytes += n * sizeof(__nv_bfloat16);
    }
    for (int i = 0; i < wc_n; i++)
        if (wc[i].view && !wc[i].bf) wc[i].bf = wc_flat.bf + (wc[i].w - p);
    return wc_flat.bf;
}

/* After the AdamW that wrote the flat copy: a view its ranges cover (they
 * do not overlap) is current (the rest of the copy is as it was, as are the
 * weights there); a copy of its own that shares a weight with a range is
 * stale */
static void wc_flat_written(const DevRange *r, int k) {
    for (int i = 0; i < wc_n; i++) {
        WcEntry *e = &wc[i];
        size_t covered = 0;
        for (int j = 0; j < k; j++) {
            const float *a = wc_flat.p + r[j].offset, *lo = a > e->w ? a : e->w;
            const float *hi = a + r[j].n < e->w + e->n ? a + r[j].n : e->w + e->n;
            covered += hi > lo ? (size_t)(hi - lo) : 0;
        }
        if (e->view && covered == e->n) e->current = 1;
        if (!e->view && covered) e->current = 0;
    }
}

static Scratch sc_adam_red;

/* The range table goes to the device only when it changes (the trainer's is
 * built once), so a step makes no synchronous upload. */
static int adamw_multi(float *p, const float *g, float *m, float *v, const AdamWRange *ranges, int nr, float lr,
                       float beta1, float beta2, float eps, int t, float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    if (nr <= 0) return 0;
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
        host[k].norm = ranges[i].norm != 0;
        total += ranges[i].n;
        k++;
    }
    if (!total) return 0;
    DevRange *dev = (DevRange *)scratch_get(&sc_adam, (size_t)k * sizeof *dev);
    if (k != n_sent || (void *)dev != sent_to || memcmp(host, sent, (size_t)k * sizeof *host) != 0) {
        cu_from_host(dev, host, (size_t)k * sizeof *dev);
        memcpy(sent, host, (size_t)k * sizeof *host);
        n_sent = k;
        sent_to = dev;
    }
    AdamConsts c = adam_consts(lr, beta1, beta2, t);
    const int vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
    __nv_bfloat16 *w16 = wc_flat_for(p, host, k);
    unsigned grid = grid_for((total + 3) / 4, 256);
    double *partial = NULL;
    if (sumsq) { /* as many blocks as the device holds at once (one wave), a partial each */
        const unsigned fill = (unsigned)resident_blocks(256);
        grid = grid < fill ? grid : fill;
        partial = (double *)scratch_get(&sc_adam_red, (size_t)grid * sizeof(double));
    }
    adamw_multi_k<<<grid, 256>>>(p, g, m, v, dev, k, total, lr, adam_k(c, beta1, beta2, eps, grad_scale), vec, w16,
                                 partial);
    LAUNCH_CHECK();
    if (w16) wc_flat_written(host, k);
    if (sumsq) {
        reduce_final_k<<<1, RED_THREADS>>>(partial, (int)grid, G.red_out);
        LAUNCH_CHECK();
        cu_to_host(sumsq, G.red_out, sizeof *sumsq);
    }
    return w16 != NULL;
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
// timing (log.profile_steps): events on the compute stream, each created at
// its slot's first mark and kept (host objects; no device memory)

static cudaEvent_t timer_ev[KERNEL_TIMER_SLOTS];

static void cu_timer_mark(int slot) {
    if (slot < 0 || slot >= KERNEL_TIMER_SLOTS) die(EXIT_INTERNAL, "timer_mark: slot %d out of range", slot);
    if (!timer_ev[slot]) CUDA_CHECK(cudaEventCreateWithFlags(&timer_ev[slot], cudaEventDefault));
    CUDA_CHECK(cudaEventRecord(timer_ev[slot], 0));
}

static void cu_timer_read(int n, double *ms) {
    if (n < 1 || n > KERNEL_TIMER_SLOTS || !timer_ev[n - 1]) die(EXIT_INTERNAL, "timer_read: %d slots", n);
    host_wait(); /* multi-rank: a hung collective is the watchdog's, not a wait in the driver */
    CUDA_CHECK(cudaEventSynchronize(timer_ev[n - 1])); /* the last mark: the stream runs in order */
    ms[0] = 0.0;
    for (int i = 1; i < n; i++) {
        float f = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&f, timer_ev[0], timer_ev[i]));
        ms[i] = f;
    }
}

// ----------------------------------------------------------------------------
// the table, device selection, probe and peak

/* not const: act_bytes follows the compute dtype, set by kernels_cuda() */
static Kernels cuda_kernels = {
    /* .name = */ "cuda",
    /* .act_bytes = */ 4,
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
    /* .matmul_forward_res = */ matmul_forward_res,
    /* .matmul_forward_a = */ matmul_forward_a,
    /* .matmul_backward_a = */ matmul_backward_a,
    /* .matmul_backward_dinp_a = */ matmul_backward_dinp_a,
    /* .attention_forward = */ attention_forward,
    /* .attention_backward = */ attention_backward,
    /* .rope_forward = */ rope_forward,
    /* .rope_backward = */ rope_backward,
    /* .gelu_forward = */ gelu_forward,
    /* .gelu_backward = */ gelu_backward,
    /* .matmul_gelu_forward = */ matmul_gelu_forward,
    /* .swiglu_forward = */ swiglu_forward,
    /* .swiglu_backward = */ swiglu_backward,
    /* .matmul_gelu_backward = */ matmul_gelu_backward,
    /* .matmul_swiglu_backward = */ matmul_swiglu_backward,
    /* .add = */ add,
    /* .crossentropy_forward = */ crossentropy_forward,
    /* .crossentropy_backward = */ crossentropy_backward,
    /* .crossentropy_fused = */ crossentropy_fused,
    /* .crossentropy_vp_max = */ crossentropy_vp_max,
    /* .crossentropy_vp_expsum = */ crossentropy_vp_expsum,
    /* .crossentropy_vp_finish = */ crossentropy_vp_finish,
    /* .crossentropy_vp_backward = */ crossentropy_vp_backward,
    /* .sumsq = */ sumsq,
    /* .sumsq_queue = */ sumsq_queue,
    /* .sumsq_take = */ sumsq_take,
    /* .sum = */ sum,
    /* .scale = */ scale,
    /* .adamw = */ adamw,
    /* .adamw_multi = */ adamw_multi,
    /* .round_bf16 = */ round_bf16,
    /* .pack_bf16 = */ pack_bf16,
    /* .unpack_bf16 = */ unpack_bf16,
    /* .weights_stable = */ cu_weights_stable,
    /* .grads_fresh = */ grads_fresh,
    /* .grads_settle = */ grads_settle,
    /* .host_alloc = */ cu_host_alloc,
    /* .host_free = */ cu_host_free,
    /* .offload_copy = */ cu_offload_copy,
    /* .offload_mark = */ cu_offload_mark,
    /* .offload_wait = */ cu_offload_wait,
    /* .timer_mark = */ cu_timer_mark,
    /* .timer_read = */ cu_timer_read,
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

extern "C" int kernels_cuda_device_uuid(char *out, size_t n) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, G.dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4],
             u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return 0;
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
    DEV_MALLOC(&G.red_partial, RED_MAX_BLOCKS * sizeof(double));
    DEV_MALLOC(&G.red_out, sizeof(double));
    DEV_MALLOC(&SIDE.partial, RED_MAX_BLOCKS * sizeof(double));
    int least, greatest; /* a larger number is a lower priority */
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&SIDE.s, cudaStreamNonBlocking, least));
    CUDA_CHECK(cudaEventCreateWithFlags(&SIDE.after_compute, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&SIDE.done, cudaEventDisableTiming));
    G.ready = 1;
}

extern "C" const Kernels *kernels_cuda(void) {
    cuda_init();
    mm_fixed = 1;
    cuda_kernels.act_bytes = act_bf16() ? 2 : 4;
    return &cuda_kernels;
}

extern "C" void *kernels_cuda_stream(void) { return (void *)0; /* the legacy default stream */ }

extern "C" void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx) {
    cuda_init();
    if (poll && !HW.ev) CUDA_CHECK(cudaEventCreateWithFlags(&HW.ev, cudaEventDisableTiming));
    HW.poll = poll;
    HW.ctx = ctx;
}

static const char *att_cudnn_info(void) {
    static char s[160];
    snprintf(s, sizeof s, "cudnn (cuDNN %zu fused attention on bf16 qkv, head dims 8..128 by 8; the fused kernels "
             "for shapes it declines; train.attention_kernel flash or gemm)", (size_t)cudnnGetVersion());
    return s;
}

extern "C" const char *kernels_cuda_device_info(void) {
    static char info[512];
    cuda_init();
    snprintf(info, sizeof info, "device %d: %.200s, %d SMs, cc %d.%d, %.1f GiB; matmuls %s (cuBLASLt %zu); attention %s",
             G.dev, G.prop.name, G.prop.multiProcessorCount, G.prop.major, G.prop.minor,
             (double)G.prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             matmul_mode() == MM_BF16   ? "bf16 tensor cores (train.compute_dtype bf16)"
             : matmul_mode() == MM_FP32 ? "plain fp32 (train.compute_dtype fp32)"
                                        : "TF32 tensor cores (train.compute_dtype tf32)",
             cublasLtGetVersion(),
             attention_mode() == ATT_CUDNN ? att_cudnn_info()
             : attention_mode() != ATT_FLASH ? "gemm (cuBLASLt GEMMs + softmax kernels)"
             : fl_bf16() ? "flash (fused kernels, bf16 tensor cores through mma.sync, head dims 32/64/128; train.attention_kernel gemm for the GEMMs)"
             : fl_tensor_cores() ? "flash (fused kernels, TF32 tensor cores, head dims 32/64/128; train.attention_kernel gemm for the GEMMs)"
                                 : "flash (fused kernels, fp32 FMA, head dims 32/64/128; train.attention_kernel gemm for the GEMMs)");
    return info;
}

/* HBM and GDDR move two words a memory clock on each bus line: an H100 SXM
 * (2619 MHz, 5120 bits) gives its datasheet's 3.35 TB/s. */
extern "C" double kernels_cuda_peak_gbs(void) {
    cuda_init();
    int clk_khz = 0, bus_bits = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, G.dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, G.dev));
    return 2.0 * clk_khz * 1e3 * (bus_bits / 8.0) * 1e-9;
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
