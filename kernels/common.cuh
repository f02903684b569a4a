/* kernels/common.cuh — common device state: error checks, the device, device memory and scratch, [a] activations, memory copies, gradient memory that starts at zero, dynamic shared memory, warp/block reductions and deterministic column sums.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

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
        size_t cap = cuda_scratch_grow(bytes);
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
#define RED_MAX_BLOCKS CUDA_RED_MAX_BLOCKS
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
static void cu_grads_fresh(float *g, size_t n) {
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
static void cu_grads_settle(float *g, size_t n) {
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
    int rows_per = CUDA_COLSUM_ROWS;
    int RB = (N + rows_per - 1) / rows_per;
    if (RB > CUDA_COLSUM_MAX_BLOCKS) { RB = CUDA_COLSUM_MAX_BLOCKS; rows_per = (N + RB - 1) / RB; }
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
