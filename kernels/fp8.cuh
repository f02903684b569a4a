/* kernels/fp8.cuh — FP8 linears (train.compute_dtype fp8; docs/fp8.md): the tensorwise scales and casts, the weights' kept FP8 copies and cuBLASLt's FP8 GEMMs.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own.
 *
 * Under fp8 the backend runs as under bf16 (the [a] activations bf16, the
 * LM head and attention as ever), and a transformer layer's linears
 * (Kernels.fp8_scope) quantize both operands and multiply the 8-bit codes:
 *   scale = fmax / amax over the tensor (fp8.h's rules: 1 for an all-zero
 *   or non-finite amax, FLT_MAX where it overflows), codes by
 *   __nv_cvt_float_to_fp8 (cvt.rn.satfinite: fp8_encode's codes), then
 *   cublasLtMatmul with E4M3 / E5M2 A and B, the inverse scales as its
 *   A_SCALE / B_SCALE pointers, fp32 compute, FAST_ACCUM 0 (docs/fp8.md).
 * cuBLASLt's FP8 kernels on Hopper take only the "TN" layout: both
 * operands with the contraction (K) contiguous. For row-major
 * C[M, N] = X[M, K] Y[K, N] that is X as [M, K] and Y stored as [N, K]:
 *   forward  out = inp w^T   inp [N, C], w [OC, C]: both as they are;
 *   dgrad    dinp = dout w   dout [N, OC] as it is, w transposed [C, OC];
 *   wgrad    dw = dout^T inp dout transposed [OC, N], inp transposed [C, N].
 * K is padded to a multiple of 16 (zero codes) in every copy: FP8 GEMMs
 * want 16-byte leading dimensions. A weight's copy (both layouts, one
 * scale: tensorwise codes are the same either way) is made once while a
 * weights_stable range holds it, in memory fp8_setup allocated; the step
 * allocates nothing. Tensorwise only so far: the blockwise and rowwise
 * recipes are one line and exit 2 on CUDA (docs/fp8.md). */
#include <cuda_fp8.h>
#include <float.h>
extern "C" {
#include "fp8.h"
}

#define F8_SLOTS CUDA_FP8_SLOTS /* kernels_cuda_sizes.h, which `llmtrain check` sizes the buffers by */
#define F8_PARTS CUDA_FP8_PARTS

/* FP8 leading dimensions: a multiple of 16 elements (bytes) */
static int f8_pad(int n) { return (n + 15) & ~15; }

typedef struct {
    const float *w; /* the weight (NULL: a free entry) */
    size_t n;
    uint8_t *q, *qt; /* [rows, pad(cols)] and [cols, pad(rows)] in the arena */
    float *sc;       /* its scale and inverse scale (device) */
    int valid;
} F8Copy;

static struct {
    int set, recipe, on; /* fp8_setup ran with a recipe, which; in a layer's linears */
    int wanted;          /* train.compute_dtype fp8 (kernels_cuda_set_compute_dtype) */
    uint8_t *x, *xt, *d, *dt, *w; /* scratch codes: activation, output gradient (each both layouts), a weight */
    float *sc;       /* F8_SLOTS x (scale, inverse) */
    uint32_t *part;  /* amax partials */
    float *stage;    /* fp32 product before the bias / an unaligned output */
    size_t act_cap, w_cap, stage_cap; /* bytes of x..dt, of w; floats of stage */
    uint8_t *arena;
    size_t arena_cap, arena_used;
    float *csc;      /* the copies' scales */
    F8Copy *copies;
    int n_copies, cap_copies;
    long made, hits, staged;
    void *mem[12]; /* what fp8_setup allocated, and the bytes */
    size_t mem_bytes[12];
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

/* part[block] = the largest |x| of the block's elements as fp32 bits (a
 * NaN's bits exceed every number's, so a NaN wins, as fp8.c's amax) */
template <typename ST> __global__ void f8_amax_k(const ST *x, size_t n, uint32_t *part) {
    __shared__ uint32_t s[256];
    uint32_t m = 0;
    GRID_STRIDE(i, n) {
        uint32_t u = __float_as_uint(act_ld(x, i)) & 0x7fffffffu;
        m = u > m ? u : m;
    }
    s[threadIdx.x] = m;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h && s[threadIdx.x + h] > s[threadIdx.x]) s[threadIdx.x] = s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = s[0];
}

/* sc[0] = fmax / amax of the np partials (fp8_scale's rules), sc[1] = 1 / sc[0] */
__global__ void f8_scale_k(const uint32_t *part, int np, float fmax, float *sc) {
    __shared__ uint32_t s[256];
    uint32_t m = 0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) m = part[i] > m ? part[i] : m;
    s[threadIdx.x] = m;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h && s[threadIdx.x + h] > s[threadIdx.x]) s[threadIdx.x] = s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float a = __uint_as_float(s[0]), v = 1.0f;
        if (a > 0.0f && a <= FLT_MAX) {
            v = fmax / a;
            if (!(v <= FLT_MAX)) v = FLT_MAX;
        }
        sc[0] = v;
        sc[1] = 1.0f / v;
    }
}

/* q [rows, ldq] = codes of x [rows, cols] times the scale, zero past cols */
template <typename ST> __global__ void f8_cast_k(uint8_t *q, int ldq, const ST *x, int rows, int cols, const float *sc, int e5m2) {
    const float s = sc[0];
    GRID_STRIDE(i, (size_t)rows * ldq) {
        size_t r = i / (size_t)ldq;
        int c = (int)(i - r * (size_t)ldq);
        q[i] = c < cols ? f8_cast(act_ld(x, r * (size_t)cols + c) * s, e5m2) : (uint8_t)0;
    }
}

/* qt [cols, ldt] = the codes of x [rows, cols] transposed, zero past rows:
 * 32 x 32 tiles through shared memory, blocks of 32 x 8 threads */
template <typename ST> __global__ void f8_cast_t_k(uint8_t *qt, int ldt, const ST *x, int rows, int cols, const float *sc, int e5m2) {
    __shared__ uint8_t t[32][33];
    const float s = sc[0];
    const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        int r = r0 + k, c = c0 + threadIdx.x;
        t[k][threadIdx.x] = r < rows && c < cols ? f8_cast(act_ld(x, (size_t)r * cols + c) * s, e5m2) : (uint8_t)0;
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        int c = c0 + k, r = r0 + threadIdx.x;
        if (c < cols && r < ldt) qt[(size_t)c * ldt + r] = t[threadIdx.x][k];
    }
}

/* sc = the tensorwise scale of x [rows, cols] (bf16 when x16) */
static void f8_scale_of(const float *x, int x16, size_t n, int e5m2, float *sc) {
    unsigned g = grid_for(n, 256);
    if (g > F8_PARTS) g = F8_PARTS;
    if (x16) f8_amax_k<__nv_bfloat16><<<g, 256>>>(CACT16(x), n, F8.part);
    else f8_amax_k<float><<<g, 256>>>(x, n, F8.part);
    LAUNCH_CHECK();
    f8_scale_k<<<1, 256>>>(F8.part, (int)g, e5m2 ? 57344.0f : 448.0f, sc);
    LAUNCH_CHECK();
}

/* x [rows, cols] with scale sc into q [rows, pad(cols)] (q not NULL) and
 * into qt [cols, pad(rows)] (qt not NULL) */
static void f8_cast(const float *x, int x16, int rows, int cols, int e5m2, const float *sc, uint8_t *q, uint8_t *qt) {
    if (q) {
        size_t n = (size_t)rows * f8_pad(cols);
        if (x16) f8_cast_k<__nv_bfloat16><<<grid_for(n, 256), 256>>>(q, f8_pad(cols), CACT16(x), rows, cols, sc, e5m2);
        else f8_cast_k<float><<<grid_for(n, 256), 256>>>(q, f8_pad(cols), x, rows, cols, sc, e5m2);
        LAUNCH_CHECK();
    }
    if (qt) {
        dim3 grid((unsigned)(cols + 31) / 32, (unsigned)(f8_pad(rows) + 31) / 32), block(32, 8);
        if (grid.y > 65535u) die(EXIT_INTERNAL, "fp8: %d rows to transpose", rows);
        if (x16) f8_cast_t_k<__nv_bfloat16><<<grid, block>>>(qt, f8_pad(rows), CACT16(x), rows, cols, sc, e5m2);
        else f8_cast_t_k<float><<<grid, block>>>(qt, f8_pad(rows), x, rows, cols, sc, e5m2);
        LAUNCH_CHECK();
    }
}

/* tests: the tensorwise codes of n device values (bf16 when x16) in host
 * memory, and their scale */
extern "C" void kernels_cuda_fp8_codes(uint8_t *host, const float *x, int x16, size_t n, int e5m2, float *scale) {
    if (!F8.set) die(EXIT_INTERNAL, "kernels_cuda_fp8_codes before fp8_setup");
    if (n > F8.act_cap) die(EXIT_INTERNAL, "kernels_cuda_fp8_codes: %zu values, room for %zu", n, F8.act_cap);
    f8_scale_of(x, x16, n, e5m2, F8.sc);
    f8_cast(x, x16, 1, (int)n, e5m2, F8.sc, F8.x, NULL);
    cu_to_host(host, F8.x, n);
    cu_to_host(scale, F8.sc, sizeof(float));
}

/* ---- the weights' copies ---- */

/* copies inside [p, p + bytes) are stale (p NULL: all) */
static void f8_stale(const void *p, size_t bytes) {
    for (int i = 0; i < F8.n_copies; i++)
        if (!p || overlaps(F8.copies[i].w, F8.copies[i].n * sizeof(float), p, bytes)) F8.copies[i].valid = 0;
}

/* w [rows, cols] in E4M3: the forward's layout (trans 0) or the input
 * gradient's (1), with *sc its scales: the kept copy while a stable range
 * holds w (made now if stale), else quantized into scratch */
static const uint8_t *f8_weight(const float *w, int rows, int cols, int trans, const float **sc) {
    size_t n = (size_t)rows * cols, qn = (size_t)rows * f8_pad(cols), tn = (size_t)cols * f8_pad(rows);
    int held = 0;
    for (int i = 0; i < wc_nr && !held && wc_enabled(); i++) held = inside(w, n, wc_range[i].p, wc_range[i].n);
    F8Copy *c = NULL;
    for (int i = 0; held && i < F8.n_copies && !c; i++)
        if (F8.copies[i].w == w && F8.copies[i].n == n) c = &F8.copies[i];
    size_t need = (qn + 255) / 256 * 256 + (tn + 255) / 256 * 256;
    if (held && !c && F8.n_copies < F8.cap_copies && F8.arena_used + need <= F8.arena_cap) {
        c = &F8.copies[F8.n_copies];
        c->w = w;
        c->n = n;
        c->q = F8.arena + F8.arena_used;
        c->qt = c->q + (qn + 255) / 256 * 256;
        c->sc = F8.csc + 2 * F8.n_copies++;
        c->valid = 0;
        F8.arena_used += need;
    }
    if (!c) { /* no kept copy: the one layout wanted, into scratch */
        float *s = F8.sc + 4;
        f8_scale_of(w, 0, n, 0, s);
        f8_cast(w, 0, rows, cols, 0, s, trans ? NULL : F8.w, trans ? F8.w : NULL);
        *sc = s;
        return F8.w;
    }
    if (c->valid) {
        F8.hits++;
    } else {
        f8_scale_of(w, 0, n, 0, c->sc);
        f8_cast(w, 0, rows, cols, 0, c->sc, c->q, c->qt);
        c->valid = 1;
        F8.made++;
    }
    *sc = c->sc;
    return trans ? c->qt : c->q;
}

/* ---- the GEMM ---- */

typedef struct {
    int used, M, N, K, ldx, ldy, ldc, e5x, e5y, c_bf16, al_c;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} F8Plan;
#define F8_PLANS 64
static F8Plan f8_plans[F8_PLANS];
static int f8_plan_next;

static void f8_plan_build(F8Plan *p) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t opA = CUBLAS_OP_T, opB = CUBLAS_OP_N, mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    int8_t fast = 0; /* fp32 promotion of the tensor cores' partial sums (docs/fp8.md) */
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    /* cuBLAS A := Y [N, K] read K-major (K x N column-major, transposed),
     * cuBLAS B := X [M, K] (K x M column-major), D := C^T (N x M) */
    layout_create(&p->la, p->e5y ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, p->K, p->N, p->ldy, 1, 0);
    layout_create(&p->lb, p->e5x ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, p->K, p->M, p->ldx, 1, 0);
    layout_create(&p->lc, p->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, p->N, p->M, p->ldc, 1, 0);
    p->used = 1;
    if (!lt_algo(p->desc, p->la, p->lb, p->lc, 16, 16, (uint32_t)p->al_c, &p->algo))
        die(EXIT_INTERNAL, "cuBLASLt has no FP8 algorithm for a %dx%dx%d GEMM (%s x %s -> %s, ld %d/%d/%d)", p->M, p->N,
            p->K, p->e5x ? "E5M2" : "E4M3", p->e5y ? "E5M2" : "E4M3", p->c_bf16 ? "bf16" : "fp32", p->ldx, p->ldy, p->ldc);
}

/* out [M, N] (ld ldc; bf16 when c_bf16) = X Y^T + bias[N] + beta c (c_in,
 * else out itself): X [M, K] and Y [N, K] codes (K a multiple of 16, the
 * leading dimension both), sx / sy their scales (the inverse at [1]).
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

static void f8_gemm(int M, int N, int K, const uint8_t *X, int e5x, const float *sx, const uint8_t *Y, int e5y,
                    const float *sy, float beta, void *out, int ldc, int c_bf16, const float *c_in, const float *bias) {
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
    key.c_bf16 = direct && c_bf16;
    key.al_c = 16;
    F8Plan *p = NULL;
    for (int i = 0; i < F8_PLANS && f8_plans[i].used && !p; i++) {
        F8Plan *q = &f8_plans[i];
        if (q->M == M && q->N == N && q->K == K && q->ldc == key.ldc && q->e5x == e5x && q->e5y == e5y &&
            q->c_bf16 == key.c_bf16 && q->al_c == key.al_c)
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
    const float *ia = sy + 1, *ib = sx + 1;
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
    const int x16 = act_bf16();
    f8_scale_of(inp, x16, (size_t)N * C, 0, F8.sc);
    f8_cast(inp, x16, N, C, 0, F8.sc, F8.x, NULL);
    const float *sw;
    const uint8_t *wq = f8_weight(w, OC, C, 0, &sw);
    f8_gemm(N, OC, f8_pad(C), F8.x, 0, F8.sc, wq, 0, sw, c_in ? 1.0f : 0.0f, out, OC, out16, c_in, bias);
}

/* dinp [N, C] (ld ldd; bf16 when dinp16) = dout w, overwritten; dw [OC, C]
 * += dout^T inp (stored when fresh): dout E5M2 (bf16 when dout16), inp [a]
 * and w E4M3 */
static void f8_backward(float *dinp, int ldd, int dinp16, float *dw, const float *dout, int dout16, const float *inp,
                        const float *w, int N, int C, int OC) {
    float *sd = F8.sc + 2;
    f8_scale_of(dout, dout16, (size_t)N * OC, 1, sd);
    f8_cast(dout, dout16, N, OC, 1, sd, dinp ? F8.d : NULL, dw ? F8.dt : NULL);
    if (dinp) {
        const float *sw;
        const uint8_t *wt = f8_weight(w, OC, C, 1, &sw);
        f8_gemm(N, C, f8_pad(OC), F8.d, 1, sd, wt, 0, sw, 0.0f, dinp, ldd, dinp16, NULL, NULL);
    }
    if (dw) {
        const int x16 = act_bf16();
        f8_scale_of(inp, x16, (size_t)N * C, 0, F8.sc);
        f8_cast(inp, x16, N, C, 0, F8.sc, NULL, F8.xt);
        const float beta = grad_first(dw, (size_t)OC * C) ? 0.0f : 1.0f;
        f8_gemm(OC, C, f8_pad(N), F8.dt, 1, sd, F8.xt, 0, F8.sc, beta, dw, C, 0, NULL, NULL);
    }
}

/* ---- Kernels.fp8_setup / fp8_scope ---- */

static void f8_free_all(void) {
    for (int i = 0; i < F8.n_mem; i++) dev_free(F8.mem[i], F8.mem_bytes[i]);
    free(F8.copies);
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
    if (recipe != FP8_TENSORWISE)
        die(EXIT_USAGE, "train.fp8_recipe \"%s\": the CUDA backend runs \"tensorwise\" only so far (train.device \"cpu\" "
            "runs every recipe)", recipe == FP8_BLOCKWISE ? "blockwise" : "rowwise");
    if (!F8.wanted) die(EXIT_INTERNAL, "fp8_setup without kernels_cuda_set_compute_dtype(\"fp8\")");
    const CudaFp8Caps cap = cuda_fp8_caps(z->act_floats, z->weight_max, z->weight_floats, z->n_weights, z->max_dim);
    F8.act_cap = cap.act;
    F8.w_cap = cap.w;
    F8.stage_cap = cap.stage_floats;
    F8.x = (uint8_t *)f8_alloc(F8.act_cap);
    F8.xt = (uint8_t *)f8_alloc(F8.act_cap);
    F8.d = (uint8_t *)f8_alloc(F8.act_cap);
    F8.dt = (uint8_t *)f8_alloc(F8.act_cap);
    F8.w = (uint8_t *)f8_alloc(F8.w_cap);
    F8.sc = (float *)f8_alloc(2 * F8_SLOTS * sizeof(float));
    F8.part = (uint32_t *)f8_alloc(F8_PARTS * sizeof(uint32_t));
    F8.stage = (float *)f8_alloc(F8.stage_cap * sizeof(float));
    F8.cap_copies = (int)cap.n_copies;
    F8.arena_cap = cap.arena;
    F8.arena = (uint8_t *)f8_alloc(F8.arena_cap);
    F8.csc = (float *)f8_alloc(2 * (cap.n_copies + 1) * sizeof(float));
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
