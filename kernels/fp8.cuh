/* kernels/fp8.cuh — FP8 linears (train.compute_dtype fp8; docs/fp8.md): the recipes' scales and casts, the weights' kept FP8 copies and cuBLASLt's FP8 GEMMs.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own.
 *
 * Under fp8 the backend runs as under bf16 (the [a] activations bf16, the
 * LM head and attention as ever), and a transformer layer's linears
 * (Kernels.fp8_scope) quantize both operands and multiply the 8-bit codes:
 *   scale = fmax / amax over each of the recipe's groups (fp8_groups: the
 *   tensor; a row of the operand as the product reads it; 1 x 128 blocks
 *   along K, a weight's 128 x 128 tiles), fp8.h's rules (1 for an all-zero
 *   or non-finite amax, FLT_MAX where it overflows), codes by
 *   __nv_cvt_float_to_fp8 (cvt.rn.satfinite: fp8_encode's codes), then
 *   cublasLtMatmul with E4M3 / E5M2 A and B, the inverse scales as its
 *   A_SCALE / B_SCALE pointers in the recipe's scale mode (SCALAR_32F,
 *   OUTER_VEC_32F, VEC128_32F / BLK128x128_32F: f8_inv_count's layouts),
 *   fp32 compute, FAST_ACCUM 0 (docs/fp8.md).
 * cuBLASLt's FP8 kernels on Hopper take only the "TN" layout: both
 * operands with the contraction (K) contiguous. For row-major
 * C[M, N] = X[M, K] Y[K, N] that is X as [M, K] and Y stored as [N, K]:
 *   forward  out = inp w^T   inp [N, C], w [OC, C]: both as they are;
 *   dgrad    dinp = dout w   dout [N, OC] as it is, w transposed [C, OC];
 *   wgrad    dw = dout^T inp dout transposed [OC, N], inp transposed [C, N].
 * K is padded to a multiple of 16 (zero codes) in every copy: FP8 GEMMs
 * want 16-byte leading dimensions. A weight's copy (both layouts; one pass
 * where the groups are the same either way, tensorwise and blockwise) is
 * made once while a weights_stable range holds it, in memory fp8_setup
 * allocated; the step allocates nothing. rowwise and blockwise need sm_90
 * (cuBLASLt has those scale modes on Hopper only): elsewhere one line and
 * exit 2. */
#include <cuda_fp8.h>
#include <float.h>
extern "C" {
#include "fp8.h"
}

#define F8_PARTS CUDA_FP8_PARTS /* kernels_cuda_sizes.h, which `llmtrain check` sizes the buffers by */
enum { F8_X, F8_XT, F8_D, F8_DT, F8_W, F8_NINV }; /* the scratch operands: activation, output gradient (each both layouts), a weight */
static_assert(F8_NINV == CUDA_FP8_INV, "kernels_cuda_sizes.h counts an inverse-scale buffer per scratch operand");

/* FP8 leading dimensions: a multiple of 16 elements (bytes) */
static int f8_pad(int n) { return (n + 15) & ~15; }

typedef struct {
    const float *w; /* the weight (NULL: a free entry) */
    size_t n;
    uint8_t *q, *qt; /* [rows, pad(cols)] and [cols, pad(rows)] in the arena */
    float *iq, *iqt; /* their inverse scales as cuBLASLt reads them (device) */
    int valid;
} F8Copy;

static struct {
    int set, recipe, on; /* fp8_setup ran with a recipe, which; in a layer's linears */
    int wanted;          /* train.compute_dtype fp8 (kernels_cuda_set_compute_dtype) */
    uint8_t *x, *xt, *d, *dt, *w; /* scratch codes: activation, output gradient (each both layouts), a weight */
    float *gs;       /* the scales of the operand being quantized, fp8.c's group order */
    float *inv[F8_NINV]; /* the scratch operands' inverse scales, in cuBLASLt's layout */
    size_t g_cap;    /* floats of gs and of each inv */
    uint32_t *part;  /* amax partials */
    float *stage;    /* fp32 product before the bias / an unaligned output */
    size_t act_cap, w_cap, stage_cap; /* bytes of x..dt, of w; floats of stage */
    uint8_t *arena;
    size_t arena_cap, arena_used;
    float *csc;      /* the copies' inverse scales: two each under tensorwise */
    float *cinv;     /* and under rowwise and blockwise (cuBLASLt's layouts, both orientations) */
    size_t cinv_cap, cinv_used;
    F8Copy *copies;
    int n_copies, cap_copies;
    long made, hits, staged;
    void *mem[24]; /* what fp8_setup allocated, and the bytes */
    size_t mem_bytes[24];
    int n_mem;
} F8;

extern "C" void kernels_cuda_fp8_stats(long *made, long *hits, long *staged) {
    if (made) *made = F8.made;
    if (hits) *hits = F8.hits;
    if (staged) *staged = F8.staged;
}

static int f8_active(void) { return F8.set && F8.on; }

static void f8_want(int on) { F8.wanted = on; }

/* ---- quantization ---- */

__device__ __forceinline__ uint8_t f8_cast(float v, int e5m2) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

/* fp8_scale's rules: fmax / amax, 1 for an amax that is 0 or not finite,
 * FLT_MAX where the quotient overflows */
__device__ __forceinline__ float f8_scale_of_amax(float a, float fmax) {
    float v = 1.0f;
    if (a > 0.0f && a <= FLT_MAX) {
        v = fmax / a;
        if (!(v <= FLT_MAX)) v = FLT_MAX;
    }
    return v;
}

/* the largest of the block's v, to every thread (as block_max) */
__device__ uint32_t f8_block_umax(uint32_t v) {
    __shared__ uint32_t sh[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0u;
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* part[block] = the largest |x| of the block's elements as fp32 bits (a
 * NaN's bits exceed every number's, so a NaN wins, as fp8.c's amax) */
template <typename ST> __global__ void f8_amax_k(const ST *x, size_t n, uint32_t *part) {
    uint32_t m = 0;
    GRID_STRIDE(i, n) {
        uint32_t u = __float_as_uint(act_ld(x, i)) & 0x7fffffffu;
        m = u > m ? u : m;
    }
    m = f8_block_umax(m);
    if (threadIdx.x == 0) part[blockIdx.x] = m;
}

/* the one scale of the np partials into s[0], its inverse into inv0[0]
 * and inv1[0] (either NULL: not wanted) */
__global__ void f8_scale_k(const uint32_t *part, int np, float fmax, float *s0, float *inv0, float *inv1) {
    uint32_t m = 0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) m = part[i] > m ? part[i] : m;
    m = f8_block_umax(m);
    if (threadIdx.x == 0) {
        float v = f8_scale_of_amax(__uint_as_float(m), fmax);
        s0[0] = v;
        if (inv0) inv0[0] = 1.0f / v;
        if (inv1) inv1[0] = 1.0f / v;
    }
}

/* gs[g] = the amax of group g (gr x gc, row-major by group, nct groups a
 * row of groups) of x [rows, cols], a block of 256 threads a group */
template <typename ST> __global__ void f8_gamax_k(const ST *x, int rows, int cols, int gr, int gc, int nct, float *gs) {
    const size_t g = blockIdx.x;
    const int r0 = (int)(g / nct) * gr, c0 = (int)(g % nct) * gc;
    const int h = min(gr, rows - r0), w = min(gc, cols - c0);
    uint32_t m = 0;
    for (int i = threadIdx.x; i < h * w; i += blockDim.x) {
        uint32_t u = __float_as_uint(act_ld(x, (size_t)(r0 + i / w) * cols + c0 + i % w)) & 0x7fffffffu;
        m = u > m ? u : m;
    }
    m = f8_block_umax(m);
    if (threadIdx.x == 0) gs[g] = __uint_as_float(m);
}

/* the same for groups one column wide (gc 1): a thread a column, down the
 * group's rows (blockIdx.y the row of groups) */
template <typename ST> __global__ void f8_gamax_col_k(const ST *x, int rows, int cols, int gr, float *gs) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, r0 = blockIdx.y * gr, r1 = min(rows, r0 + gr);
    if (c >= cols) return;
    uint32_t m = 0;
    for (int r = r0; r < r1; r++) {
        uint32_t u = __float_as_uint(act_ld(x, (size_t)r * cols + c)) & 0x7fffffffu;
        m = u > m ? u : m;
    }
    gs[(size_t)blockIdx.y * cols + c] = __uint_as_float(m);
}

/* n amaxes into their scales, in place */
__global__ void f8_gscale_k(float *gs, size_t n, float fmax) {
    GRID_STRIDE(i, n) gs[i] = f8_scale_of_amax(gs[i], fmax);
}

static int f8_cdiv(int a, int b) { return (a + b - 1) / b; }
static int f8_r4(int n) { return (n + 3) & ~3; }

/* The scale mode of an operand under the recipe: tensorwise a scalar;
 * rowwise a scale a row of the operand as cuBLASLt reads it (K
 * contiguous); blockwise 1 x 128 blocks along K, a weight 128 x 128 tiles */
static int f8_mode(int weight) {
    return F8.recipe == FP8_ROWWISE     ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
           : F8.recipe == FP8_BLOCKWISE ? (weight ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                  : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
                                        : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

/* How many floats the inverse scales of an R x K operand (K contiguous)
 * take in cuBLASLt's layout for the mode (a multiple of 4, so that the
 * next starts 16-byte aligned):
 *   OUTER_VEC_32F   one a row: [R], padded to 4;
 *   VEC128_32F      one a 1 x 128 block: [ceil(K / 128)][R'], R' = R
 *                   padded to 4, the rows contiguous ((i, kb) at kb R' + i);
 *   BLK128x128_32F  one a 128 x 128 tile: [ceil(R / 128)][K'], K' =
 *                   ceil(K / 128) padded to 4, the K blocks contiguous
 *                   ((ib, kb) at ib K' + kb). */
static size_t f8_inv_count(int mode, int R, int K) {
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return (size_t)f8_r4(R);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return (size_t)f8_cdiv(K, FP8_BLOCK) * f8_r4(R);
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return (size_t)f8_cdiv(R, FP8_BLOCK) * f8_r4(f8_cdiv(K, FP8_BLOCK));
    default: return 4;
    }
}

/* inv = 1 / the scales gs (nct groups a row of groups of the source) laid
 * out for an R x K operand whose groups are gR x gK (f8_inv_count's
 * layouts): the source as it is (trans 0: R its rows) or transposed (1) */
__global__ void f8_inv_k(float *inv, const float *gs, int mode, int R, int K, int gR, int gK, int nct, int trans) {
    const int nR = (R + gR - 1) / gR, nK = (K + gK - 1) / gK;
    GRID_STRIDE(i, (size_t)nR * nK) {
        const int ib = (int)(i / nK), kb = (int)(i % nK);
        const float v = 1.0f / gs[trans ? (size_t)kb * nct + ib : (size_t)ib * nct + kb];
        size_t o = 0;
        if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) o = ib;
        else if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) o = (size_t)kb * ((R + 3) & ~3) + ib;
        else if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) o = (size_t)ib * ((nK + 3) & ~3) + kb;
        inv[o] = v;
    }
}

/* q [rows, ldq] = codes of x [rows, cols] times its group's scale (gs,
 * gr x gc groups, nct a row of groups), zero past cols */
template <typename ST>
__global__ void f8_cast_k(uint8_t *q, int ldq, const ST *x, int rows, int cols, const float *gs, int gr, int gc, int nct,
                          int e5m2) {
    GRID_STRIDE(i, (size_t)rows * ldq) {
        size_t r = i / (size_t)ldq;
        int c = (int)(i - r * (size_t)ldq);
        q[i] = c < cols ? f8_cast(act_ld(x, r * (size_t)cols + c) * gs[(r / gr) * nct + c / gc], e5m2) : (uint8_t)0;
    }
}

/* qt [cols, ldt] = the codes of x [rows, cols] transposed, zero past rows:
 * 32 x 32 tiles through shared memory, blocks of 32 x 8 threads */
template <typename ST>
__global__ void f8_cast_t_k(uint8_t *qt, int ldt, const ST *x, int rows, int cols, const float *gs, int gr, int gc,
                            int nct, int e5m2) {
    __shared__ uint8_t t[32][33];
    const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        int r = r0 + k, c = c0 + threadIdx.x;
        t[k][threadIdx.x] = r < rows && c < cols
                                ? f8_cast(act_ld(x, (size_t)r * cols + c) * gs[(size_t)(r / gr) * nct + c / gc], e5m2)
                                : (uint8_t)0;
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        int c = c0 + k, r = r0 + threadIdx.x;
        if (c < cols && r < ldt) qt[(size_t)c * ldt + r] = t[threadIdx.x][k];
    }
}

/* ---- the amaxes' agreement (Kernels.fp8_tp, fp8_cp; docs/fp8.md) ----
 * Under tp / cp a scale group that spans a split takes the max of its
 * ranks' amaxes: reduce [0] (the TP group's all-reduce max) and [1] (the
 * context group's), on the amaxes in device memory, queued on the stream
 * (no host sync). Which dimension splits which operand: the weight's rows
 * (column-parallel) or columns (row-parallel) the TP group; the input's
 * columns (row-parallel) the TP group and its rows (tokens) the context
 * group; dout's columns (column-parallel) the TP group and its rows the
 * context group. A tensorwise group spans every split of its operand; a
 * rowwise group (a row of the operand as the product reads it) the split
 * of K, the contraction, and then every group of the pass spans it;
 * blockwise groups never span one (model_fp8 refuses the layouts where
 * one would): kernels_cpu.c's fp8_spans. */
enum { F8_SPLIT_TP_R = 1, F8_SPLIT_TP_C = 2, F8_SPLIT_CP = 4 }; /* an operand's splits: its rows or columns over TP, rows over cp */
enum { F8_RED_TP = 1, F8_RED_CP = 2 };                           /* a pass's all-reduces */
static struct {
    void (*fn[2])(void *ctx, float *amax, size_t n);
    void *ctx[2];
} F8R;
static int f8_split_w(void) { return F8.on == FP8_COLUMN ? F8_SPLIT_TP_R : F8.on == FP8_ROW ? F8_SPLIT_TP_C : 0; }
static int f8_split_x(void) { return (F8.on == FP8_ROW ? F8_SPLIT_TP_C : 0) | F8_SPLIT_CP; }
static int f8_split_d(void) { return (F8.on == FP8_COLUMN ? F8_SPLIT_TP_C : 0) | F8_SPLIT_CP; }

/* the all-reduces (F8_RED_*) of a pass over an operand split as split
 * (F8_SPLIT_*) contracted along its columns (kdim 1) or rows (0), those
 * whose callback is set */
static int f8_reduces(int split, int kdim) {
    int tp = 0, cp = 0;
    if (F8.recipe == FP8_TENSORWISE) {
        tp = (split & (F8_SPLIT_TP_R | F8_SPLIT_TP_C)) != 0;
        cp = (split & F8_SPLIT_CP) != 0;
    } else if (F8.recipe == FP8_ROWWISE) {
        tp = (split & (kdim ? F8_SPLIT_TP_C : F8_SPLIT_TP_R)) != 0;
        cp = !kdim && (split & F8_SPLIT_CP);
    }
    return (tp && F8R.fn[0] ? F8_RED_TP : 0) | (cp && F8R.fn[1] ? F8_RED_CP : 0);
}

/* part[0] = the largest of np partials as a float the all-reduce (max)
 * takes: a NaN's bits become +inf's (which takes scale 1, as NaN does) */
__global__ void f8_fold_k(uint32_t *part, int np) {
    uint32_t m = 0;
    for (int i = 0; i < np; i++) m = part[i] > m ? part[i] : m;
    part[0] = m > 0x7f800000u ? 0x7f800000u : m;
}

/* the same for n group amaxes (non-negative fp32 bits), in place */
__global__ void f8_nan_inf_k(float *gs, size_t n) {
    uint32_t *u = (uint32_t *)gs;
    GRID_STRIDE(i, n) if (u[i] > 0x7f800000u) u[i] = 0x7f800000u;
}

/* n amaxes in device memory (no NaN) all-reduced (max) over the TP group
 * and then the context group, as red (F8_RED_*) says */
static void f8_agree(float *amax, size_t n, int red) {
    if (red & F8_RED_TP) F8R.fn[0](F8R.ctx[0], amax, n);
    if (red & F8_RED_CP) F8R.fn[1](F8R.ctx[1], amax, n);
}

/* One pass of x [rows, cols] (bf16 when x16) with groups gr x gc: the
 * scales into F8.gs, then the codes into q [rows, pad(cols)] (q not
 * NULL), with their inverse scales into iq in the layout of mode, and
 * into qt [cols, pad(rows)], inverse scales iqt (mode t); red
 * (F8_RED_*, f8_reduces): the groups whose amaxes the TP and context
 * groups all-reduce (max) before they become scales */
static void f8_pass(const float *x, int x16, int rows, int cols, int e5m2, int gr, int gc, uint8_t *q, float *iq,
                    int mq, uint8_t *qt, float *iqt, int mt, int red) {
    const int nrt = f8_cdiv(rows, gr), nct = f8_cdiv(cols, gc);
    const size_t n = (size_t)nrt * nct;
    const float fmax = e5m2 ? 57344.0f : 448.0f;
    if (n == 1) { /* tensorwise (or one group): a two-pass amax */
        size_t ne = (size_t)rows * cols;
        unsigned g = grid_for(ne, 256);
        if (g > F8_PARTS) g = F8_PARTS;
        if (x16) f8_amax_k<__nv_bfloat16><<<g, 256>>>(CACT16(x), ne, F8.part);
        else f8_amax_k<float><<<g, 256>>>(x, ne, F8.part);
        LAUNCH_CHECK();
        if (red) {
            f8_fold_k<<<1, 1>>>(F8.part, (int)g);
            LAUNCH_CHECK();
            f8_agree((float *)F8.part, 1, red);
            g = 1;
        }
        f8_scale_k<<<1, 256>>>(F8.part, (int)g, fmax, F8.gs, q ? iq : NULL, qt ? iqt : NULL);
        LAUNCH_CHECK();
    } else {
        if (n > F8.g_cap) die(EXIT_INTERNAL, "fp8: a %d x %d operand has %zu scale groups, room for %zu", rows, cols, n, F8.g_cap);
        if (gc == 1) {
            if (nrt > 65535) die(EXIT_INTERNAL, "fp8: %d rows of scale groups", nrt);
            dim3 grid((unsigned)f8_cdiv(cols, 256), (unsigned)nrt);
            if (x16) f8_gamax_col_k<__nv_bfloat16><<<grid, 256>>>(CACT16(x), rows, cols, gr, F8.gs);
            else f8_gamax_col_k<float><<<grid, 256>>>(x, rows, cols, gr, F8.gs);
        } else {
            if (x16) f8_gamax_k<__nv_bfloat16><<<(unsigned)n, 256>>>(CACT16(x), rows, cols, gr, gc, nct, F8.gs);
            else f8_gamax_k<float><<<(unsigned)n, 256>>>(x, rows, cols, gr, gc, nct, F8.gs);
        }
        LAUNCH_CHECK();
        if (red) {
            f8_nan_inf_k<<<grid_for(n, 256), 256>>>(F8.gs, n);
            LAUNCH_CHECK();
            f8_agree(F8.gs, n, red);
        }
        f8_gscale_k<<<grid_for(n, 256), 256>>>(F8.gs, n, fmax);
        LAUNCH_CHECK();
        if (q) f8_inv_k<<<grid_for(n, 256), 256>>>(iq, F8.gs, mq, rows, cols, gr, gc, nct, 0);
        if (qt) f8_inv_k<<<grid_for(n, 256), 256>>>(iqt, F8.gs, mt, cols, rows, gc, gr, nct, 1);
        LAUNCH_CHECK();
    }
    const int nc = n == 1 ? 1 : nct, hr = n == 1 ? rows : gr, hc = n == 1 ? cols : gc;
    if (q) {
        size_t ne = (size_t)rows * f8_pad(cols);
        if (x16) f8_cast_k<__nv_bfloat16><<<grid_for(ne, 256), 256>>>(q, f8_pad(cols), CACT16(x), rows, cols, F8.gs, hr, hc, nc, e5m2);
        else f8_cast_k<float><<<grid_for(ne, 256), 256>>>(q, f8_pad(cols), x, rows, cols, F8.gs, hr, hc, nc, e5m2);
        LAUNCH_CHECK();
    }
    if (qt) {
        dim3 grid((unsigned)(cols + 31) / 32, (unsigned)(f8_pad(rows) + 31) / 32), block(32, 8);
        if (grid.y > 65535u) die(EXIT_INTERNAL, "fp8: %d rows to transpose", rows);
        if (x16) f8_cast_t_k<__nv_bfloat16><<<grid, block>>>(qt, f8_pad(rows), CACT16(x), rows, cols, F8.gs, hr, hc, nc, e5m2);
        else f8_cast_t_k<float><<<grid, block>>>(qt, f8_pad(rows), x, rows, cols, F8.gs, hr, hc, nc, e5m2);
        LAUNCH_CHECK();
    }
}

/* x [rows, cols] (bf16 when x16; a weight when weight) quantized with the
 * recipe's groups (fp8_groups): into q [rows, pad(cols)], the layout of a
 * product whose K is x's columns, inverse scales iq; and into qt [cols,
 * pad(rows)], K its rows, inverse scales iqt (either pair NULL: not
 * wanted). Both in one pass where the groups and their all-reduces agree
 * (tensorwise, a blockwise weight's tiles), else a pass each. split
 * (F8_SPLIT_*): the dimensions the TP and context groups split. */
static void f8_quant(const float *x, int x16, int rows, int cols, int e5m2, int weight, uint8_t *q, float *iq,
                     uint8_t *qt, float *iqt, int split) {
    int r1, c1, r0, c0;
    fp8_groups(F8.recipe, weight, 1, rows, cols, &r1, &c1);
    fp8_groups(F8.recipe, weight, 0, rows, cols, &r0, &c0);
    const int m = f8_mode(weight), red1 = f8_reduces(split, 1), red0 = f8_reduces(split, 0);
    if (q && qt && r1 == r0 && c1 == c0 && red1 == red0)
        return f8_pass(x, x16, rows, cols, e5m2, r1, c1, q, iq, m, qt, iqt, m, red1);
    if (q) f8_pass(x, x16, rows, cols, e5m2, r1, c1, q, iq, m, NULL, NULL, m, red1);
    if (qt) f8_pass(x, x16, rows, cols, e5m2, r0, c0, NULL, NULL, m, qt, iqt, m, red0);
}

/* tests: the tensorwise codes of n device values (bf16 when x16) in host
 * memory, and their scale */
extern "C" void kernels_cuda_fp8_codes(uint8_t *host, const float *x, int x16, size_t n, int e5m2, float *scale) {
    if (!F8.set) die(EXIT_INTERNAL, "kernels_cuda_fp8_codes before fp8_setup");
    if (n > F8.act_cap) die(EXIT_INTERNAL, "kernels_cuda_fp8_codes: %zu values, room for %zu", n, F8.act_cap);
    f8_pass(x, x16, 1, (int)n, e5m2, 1, (int)n, F8.x, F8.inv[F8_X], CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, NULL, NULL, 0, 0);
    cu_to_host(host, F8.x, n);
    cu_to_host(scale, F8.gs, sizeof(float));
}

/* tests: x [rows, cols] quantized as an operand (a weight when weight)
 * whose K is its columns (kdim 1) or rows (0) under fp8_setup's recipe:
 * its codes as the product reads them ([rows, pad(cols)] or [cols,
 * pad(rows)]) and its inverse scales in cuBLASLt's layout (*n_inv of them)
 * into host memory */
extern "C" void kernels_cuda_fp8_quant(uint8_t *codes, float *inv, size_t *n_inv, const float *x, int x16, int rows,
                                       int cols, int e5m2, int weight, int kdim) {
    if (!F8.set) die(EXIT_INTERNAL, "kernels_cuda_fp8_quant before fp8_setup");
    size_t nq = kdim ? (size_t)rows * f8_pad(cols) : (size_t)cols * f8_pad(rows);
    if (nq > F8.act_cap) die(EXIT_INTERNAL, "kernels_cuda_fp8_quant: %zu codes, room for %zu", nq, F8.act_cap);
    const int m = f8_mode(weight);
    size_t ni = kdim ? f8_inv_count(m, rows, cols) : f8_inv_count(m, cols, rows);
    if (m == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) ni = 1;
    if (ni > F8.g_cap) die(EXIT_INTERNAL, "kernels_cuda_fp8_quant: %zu scales, room for %zu", ni, F8.g_cap);
    cu_zero(F8.inv[F8_X], ni * sizeof(float)); /* the padding reads back as 0 */
    if (kdim) f8_quant(x, x16, rows, cols, e5m2, weight, F8.x, F8.inv[F8_X], NULL, NULL, 0);
    else f8_quant(x, x16, rows, cols, e5m2, weight, NULL, NULL, F8.x, F8.inv[F8_X], 0);
    cu_to_host(codes, F8.x, nq);
    cu_to_host(inv, F8.inv[F8_X], ni * sizeof(float));
    *n_inv = ni;
}

/* ---- the weights' copies ---- */

/* copies inside [p, p + bytes) are stale (p NULL: all) */
static void f8_stale(const void *p, size_t bytes) {
    for (int i = 0; i < F8.n_copies; i++)
        if (!p || overlaps(F8.copies[i].w, F8.copies[i].n * sizeof(float), p, bytes)) F8.copies[i].valid = 0;
}

/* w [rows, cols] in E4M3: the forward's layout (trans 0) or the input
 * gradient's (1), with *inv its inverse scales as cuBLASLt reads them: the
 * kept copy while a stable range holds w (made now if stale), else
 * quantized into scratch */
static const uint8_t *f8_weight(const float *w, int rows, int cols, int trans, const float **inv) {
    size_t n = (size_t)rows * cols, qn = (size_t)rows * f8_pad(cols), tn = (size_t)cols * f8_pad(rows);
    int held = 0;
    for (int i = 0; i < wc_nr && !held && wc_enabled(); i++) held = inside(w, n, wc_range[i].p, wc_range[i].n);
    F8Copy *c = NULL;
    for (int i = 0; held && i < F8.n_copies && !c; i++)
        if (F8.copies[i].w == w && F8.copies[i].n == n) c = &F8.copies[i];
    size_t need = (qn + 255) / 256 * 256 + (tn + 255) / 256 * 256;
    const int m = f8_mode(1), tw = m == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const size_t ni = tw ? 0 : f8_inv_count(m, rows, cols), nt = tw ? 0 : f8_inv_count(m, cols, rows);
    if (held && !c && F8.n_copies < F8.cap_copies && F8.arena_used + need <= F8.arena_cap &&
        F8.cinv_used + ni + nt <= F8.cinv_cap) {
        c = &F8.copies[F8.n_copies];
        c->w = w;
        c->n = n;
        c->q = F8.arena + F8.arena_used;
        c->qt = c->q + (qn + 255) / 256 * 256;
        c->iq = tw ? F8.csc + 2 * F8.n_copies : F8.cinv + F8.cinv_used;
        c->iqt = tw ? c->iq + 1 : c->iq + ni;
        F8.n_copies++;
        c->valid = 0;
        F8.arena_used += need;
        F8.cinv_used += ni + nt;
    }
    if (!c) { /* no kept copy: the one layout wanted, into scratch */
        f8_quant(w, 0, rows, cols, 0, 1, trans ? NULL : F8.w, F8.inv[F8_W], trans ? F8.w : NULL, F8.inv[F8_W], f8_split_w());
        *inv = F8.inv[F8_W];
        return F8.w;
    }
    if (c->valid) {
        F8.hits++;
    } else {
        f8_quant(w, 0, rows, cols, 0, 1, c->q, c->iq, c->qt, c->iqt, f8_split_w());
        c->valid = 1;
        F8.made++;
    }
    *inv = trans ? c->iqt : c->iq;
    return trans ? c->qt : c->q;
}

/* ---- the GEMM ---- */

typedef struct {
    int used, M, N, K, ldx, ldy, ldc, e5x, e5y, mx, my, c_bf16, al_c;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} F8Plan;
#define F8_PLANS 64
static F8Plan f8_plans[F8_PLANS];
static int f8_plan_next;

static void f8_plan_build(F8Plan *p) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t opA = CUBLAS_OP_T, opB = CUBLAS_OP_N, ma = p->my, mb = p->mx;
    int8_t fast = 0; /* fp32 promotion of the tensor cores' partial sums (docs/fp8.md) */
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    /* cuBLAS A := Y [N, K] read K-major (K x N column-major, transposed),
     * cuBLAS B := X [M, K] (K x M column-major), D := C^T (N x M) */
    layout_create(&p->la, p->e5y ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, p->K, p->N, p->ldy, 1, 0);
    layout_create(&p->lb, p->e5x ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, p->K, p->M, p->ldx, 1, 0);
    layout_create(&p->lc, p->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, p->N, p->M, p->ldc, 1, 0);
    p->used = 1;
    if (!lt_algo(p->desc, p->la, p->lb, p->lc, 16, 16, (uint32_t)p->al_c, &p->algo))
        die(EXIT_INTERNAL, "cuBLASLt has no FP8 algorithm for a %dx%dx%d GEMM (%s x %s -> %s, ld %d/%d/%d, scale modes %d/%d)",
            p->M, p->N, p->K, p->e5x ? "E5M2" : "E4M3", p->e5y ? "E5M2" : "E4M3", p->c_bf16 ? "bf16" : "fp32", p->ldx,
            p->ldy, p->ldc, p->mx, p->my);
}

/* out [M, N] (ld ldc; bf16 when c_bf16) = X Y^T + bias[N] + beta c (c_in,
 * else out itself): X [M, K] and Y [N, K] codes (K a multiple of 16, the
 * leading dimension both), ix / iy their inverse scales in scale modes mx
 * / my (f8_inv_count's layouts).
 * cuBLASLt writes out straight when it is 16-byte aligned with a 16-byte
 * row stride and there is no bias; else the fp32 product goes to the
 * stage and a kernel adds and stores (the result rounded once). */
template <typename OT> __global__ void f8_finish_k(OT *out, int ldc, const float *c_in, float beta, const float *st,
                                                   int lds, const float *bias, int M, int N) {
    GRID_STRIDE(i, (size_t)M * N) {
        size_t r = i / (size_t)N, c = i - r * (size_t)N, o = r * (size_t)ldc + c;
        float v = st[r * (size_t)lds + c];
        if (beta != 0.0f) v += beta * (c_in ? c_in[o] : act_ld(out, o));
        if (bias) v += bias[c];
        act_st(out, o, v);
    }
}

static void f8_gemm(int M, int N, int K, const uint8_t *X, int e5x, const float *ix, int mx, const uint8_t *Y, int e5y,
                    const float *iy, int my, float beta, void *out, int ldc, int c_bf16, const float *c_in,
                    const float *bias) {
    if (M <= 0 || N <= 0) return;
    const int es = c_bf16 ? 2 : 4;
    const int direct = !bias && (size_t)ldc * es % 16 == 0 && aligned16(out) && (!c_in || aligned16(c_in));
    const int lds = (N + 3) & ~3; /* the stage's rows: 16 bytes each */
    if (!direct && (size_t)M * lds > F8.stage_cap) die(EXIT_INTERNAL, "fp8: a %d x %d product past the stage", M, N);
    F8Plan key;
    memset(&key, 0, sizeof key);
    key.M = M; key.N = N; key.K = K; key.ldx = K; key.ldy = K;
    key.ldc = direct ? ldc : lds;
    key.e5x = e5x; key.e5y = e5y;
    key.mx = mx; key.my = my;
    key.c_bf16 = direct && c_bf16;
    key.al_c = 16;
    F8Plan *p = NULL;
    for (int i = 0; i < F8_PLANS && f8_plans[i].used && !p; i++) {
        F8Plan *q = &f8_plans[i];
        if (q->M == M && q->N == N && q->K == K && q->ldc == key.ldc && q->e5x == e5x && q->e5y == e5y &&
            q->mx == mx && q->my == my && q->c_bf16 == key.c_bf16 && q->al_c == key.al_c)
            p = q;
    }
    if (!p) {
        p = &f8_plans[f8_plan_next];
        f8_plan_next = (f8_plan_next + 1) % F8_PLANS;
        if (p->used) {
            CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
            CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
            CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
            CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
        }
        *p = key;
        f8_plan_build(p);
    }
    const float *ia = iy, *ib = ix;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ia, sizeof ia));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ib, sizeof ib));
    const float one = 1.0f, zero = 0.0f;
    void *D = direct ? out : (void *)F8.stage;
    const void *Cp = direct && c_in ? (const void *)c_in : (const void *)D;
    CUBLAS_CHECK(cublasLtMatmul(G.lt, p->desc, &one, Y, p->la, X, p->lb, direct ? &beta : &zero, Cp, p->lc, D, p->lc,
                                &p->algo, G.ws, G.ws_bytes, 0));
    launch_check_("cublasLtMatmul (FP8)", __FILE__, __LINE__);
    if (direct) return;
    F8.staged++;
    if (c_bf16) f8_finish_k<__nv_bfloat16><<<grid_for((size_t)M * N, 256), 256>>>(ACT16(out), ldc, c_in, beta, F8.stage, lds, bias, M, N);
    else f8_finish_k<float><<<grid_for((size_t)M * N, 256), 256>>>((float *)out, ldc, c_in, beta, F8.stage, lds, bias, M, N);
    LAUNCH_CHECK();
}

/* ---- the products (matmul.cuh's entry points call these in fp8_scope) ---- */

/* out [N, OC] (bf16 when out16) = inp [N, C] w^T + bias (+ c_in): inp [a] */
static void f8_forward(void *out, int out16, const float *c_in, const float *inp, const float *w, const float *bias,
                       int N, int C, int OC) {
    f8_quant(inp, act_bf16(), N, C, 0, 0, F8.x, F8.inv[F8_X], NULL, NULL, f8_split_x());
    const float *iw;
    const uint8_t *wq = f8_weight(w, OC, C, 0, &iw);
    f8_gemm(N, OC, f8_pad(C), F8.x, 0, F8.inv[F8_X], f8_mode(0), wq, 0, iw, f8_mode(1), c_in ? 1.0f : 0.0f, out, OC,
            out16, c_in, bias);
}

/* dinp [N, C] (ld ldd; bf16 when dinp16) = dout w, overwritten; dw [OC, C]
 * += dout^T inp (stored when fresh): dout E5M2 (bf16 when dout16), inp [a]
 * and w E4M3 */
static void f8_backward(float *dinp, int ldd, int dinp16, float *dw, const float *dout, int dout16, const float *inp,
                        const float *w, int N, int C, int OC) {
    f8_quant(dout, dout16, N, OC, 1, 0, dinp ? F8.d : NULL, F8.inv[F8_D], dw ? F8.dt : NULL, F8.inv[F8_DT], f8_split_d());
    if (dinp) {
        const float *iw;
        const uint8_t *wt = f8_weight(w, OC, C, 1, &iw);
        f8_gemm(N, C, f8_pad(OC), F8.d, 1, F8.inv[F8_D], f8_mode(0), wt, 0, iw, f8_mode(1), 0.0f, dinp, ldd, dinp16,
                NULL, NULL);
    }
    if (dw) {
        f8_quant(inp, act_bf16(), N, C, 0, 0, NULL, NULL, F8.xt, F8.inv[F8_XT], f8_split_x());
        const float beta = grad_first(dw, (size_t)OC * C) ? 0.0f : 1.0f;
        f8_gemm(OC, C, f8_pad(N), F8.dt, 1, F8.inv[F8_DT], f8_mode(0), F8.xt, 0, F8.inv[F8_XT], f8_mode(0), beta, dw, C,
                0, NULL, NULL);
    }
}

/* ---- Kernels.fp8_setup / fp8_scope ---- */

static void f8_free_all(void) {
    for (int i = 0; i < F8.n_mem; i++) dev_free(F8.mem[i], F8.mem_bytes[i]);
    free(F8.copies);
    memset(&F8R, 0, sizeof F8R);
    const int wanted = F8.wanted;
    memset(&F8, 0, sizeof F8);
    F8.wanted = wanted;
}

static void *f8_alloc(size_t bytes) {
    void *p = NULL;
    DEV_MALLOC(&p, bytes + CUDA_FP8_ALLOC_PAD);
    F8.mem[F8.n_mem] = p;
    F8.mem_bytes[F8.n_mem++] = bytes + CUDA_FP8_ALLOC_PAD;
    return p;
}

static void cu_fp8_setup(int recipe, const Fp8Sizes *z) {
    f8_free_all();
    if (recipe < 0) return;
    const int cc = G.prop.major * 10 + G.prop.minor;
    if (cc < 89)
        die(EXIT_USAGE, "train.compute_dtype \"fp8\": device %d (%s, compute capability %d.%d) has no FP8 tensor cores "
            "(sm_89 or newer)", G.dev, G.prop.name, G.prop.major, G.prop.minor);
    if (recipe != FP8_TENSORWISE && cc != 90)
        die(EXIT_USAGE, "train.fp8_recipe \"%s\": device %d (%s, compute capability %d.%d) has no cuBLASLt %s scaling "
            "(sm_90 only; \"tensorwise\" runs on sm_89 and newer)", recipe == FP8_BLOCKWISE ? "blockwise" : "rowwise",
            G.dev, G.prop.name, G.prop.major, G.prop.minor, recipe == FP8_BLOCKWISE ? "128-block" : "outer-vector");
    if (!F8.wanted) die(EXIT_INTERNAL, "fp8_setup without kernels_cuda_set_compute_dtype(\"fp8\")");
    const CudaFp8Caps cap = cuda_fp8_caps(z->act_floats, z->weight_max, z->weight_floats, z->n_weights, z->max_dim,
                                          recipe != FP8_TENSORWISE);
    F8.act_cap = cap.act;
    F8.w_cap = cap.w;
    F8.stage_cap = cap.stage_floats;
    F8.x = (uint8_t *)f8_alloc(F8.act_cap);
    F8.xt = (uint8_t *)f8_alloc(F8.act_cap);
    F8.d = (uint8_t *)f8_alloc(F8.act_cap);
    F8.dt = (uint8_t *)f8_alloc(F8.act_cap);
    F8.w = (uint8_t *)f8_alloc(F8.w_cap);
    F8.g_cap = cap.groups;
    F8.gs = (float *)f8_alloc(F8.g_cap * sizeof(float));
    for (int i = 0; i < F8_NINV; i++) F8.inv[i] = (float *)f8_alloc(F8.g_cap * sizeof(float));
    F8.part = (uint32_t *)f8_alloc(F8_PARTS * sizeof(uint32_t));
    F8.stage = (float *)f8_alloc(F8.stage_cap * sizeof(float));
    F8.cap_copies = (int)cap.n_copies;
    F8.arena_cap = cap.arena;
    F8.arena = (uint8_t *)f8_alloc(F8.arena_cap);
    F8.csc = (float *)f8_alloc(2 * (cap.n_copies + 1) * sizeof(float));
    F8.cinv_cap = cap.copy_groups;
    if (F8.cinv_cap) F8.cinv = (float *)f8_alloc(F8.cinv_cap * sizeof(float));
    size_t got = 0;
    for (int i = 0; i < F8.n_mem; i++) got += F8.mem_bytes[i];
    if (got != cuda_fp8_bytes(&cap)) /* what llmtrain check counts must be what is allocated */
        die(EXIT_INTERNAL, "fp8_setup: %zu bytes allocated, kernels_cuda_sizes.h cuda_fp8_bytes counts %zu", got,
            cuda_fp8_bytes(&cap));
    F8.copies = (F8Copy *)calloc((size_t)z->n_weights + 1, sizeof(F8Copy));
    if (!F8.copies) die(EXIT_INTERNAL, "fp8: out of host memory");
    F8.recipe = recipe;
    F8.set = 1;
}

static void cu_fp8_scope(int on) { F8.on = on; }

static void cu_fp8_tp(void (*reduce)(void *ctx, float *amax, size_t n), void *ctx) {
    F8R.fn[0] = reduce;
    F8R.ctx[0] = ctx;
}

static void cu_fp8_cp(void (*reduce)(void *ctx, float *amax, size_t n), void *ctx) {
    F8R.fn[1] = reduce;
    F8R.ctx[1] = ctx;
}
