/* kernels/matmul.cuh — matrix products through cuBLASLt (bf16, TF32 or fp32; the epilogues, the bf16 copies, the workspace).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// matrix products through cuBLASLt (TF32 tensor cores, fp32 accumulate)

#define WORKSPACE_BYTES CUDA_WORKSPACE_BYTES
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

/* The heuristic's first algorithm for desc and the layouts (D as C) in the
 * workspace, the operands (cuBLASLt's A, B, C and D) aligned to al_a,
 * al_b and al_c bytes: 1, or 0 when it has none */
static int lt_algo(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                   cublasLtMatrixLayout_t lc, uint32_t al_a, uint32_t al_b, uint32_t al_c, cublasLtMatmulAlgo_t *algo) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = G.ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(G.lt, desc, la, lb, lc, lc, pref, 1, &res, &nres);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS || nres < 1) return 0;
    *algo = res.algo;
    return 1;
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
    p->used = 1;
    if (!lt_algo(p->desc, p->la, p->lb, p->lc, (uint32_t)p->al_b, (uint32_t)p->al_a, (uint32_t)p->al_c, &p->algo)) {
        plan_destroy(p);
        return 0;
    }
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
 *   fp8   as bf16, and a transformer layer's linears (Kernels.fp8_scope)
 *         multiply FP8 codes (kernels/fp8.cuh).
 * Fixed once kernels_cuda() has handed out act_bytes. */
enum { MM_TF32 = 0, MM_BF16 = 1, MM_FP32 = 2 };
static int mm_mode = MM_BF16, mm_fixed;

static int mm_parse(const char *e) {
    return !e ? -2 : strcmp(e, "bf16") == 0 ? MM_BF16 : strcmp(e, "tf32") == 0 ? MM_TF32 : strcmp(e, "fp32") == 0 ? MM_FP32 : -2;
}

static int matmul_mode(void) { return mm_mode; }

/* FP8 linears (kernels/fp8.cuh, after this file): under compute dtype fp8
 * the backend runs as under bf16, and the products of fp8_scope take these */
static void f8_want(int on);
static int f8_active(void);
static void f8_stale(const void *p, size_t bytes);
static void f8_forward(void *out, int out16, const float *c_in, const float *inp, const float *w, const float *bias,
                       int N, int C, int OC);
static void f8_backward(float *dinp, int ldd, int dinp16, float *dw, const float *dout, int dout16, const float *inp,
                        const float *w, int N, int C, int OC);

extern "C" void kernels_cuda_set_compute_dtype(const char *dtype) {
    const int fp8 = dtype && strcmp(dtype, "fp8") == 0;
    if (fp8) dtype = "bf16";
    int m = mm_parse(dtype);
    if (m == -2) die(EXIT_INTERNAL, "kernels_cuda_set_compute_dtype(\"%s\"): expected bf16, tf32 or fp32", dtype ? dtype : "(null)");
    if (mm_fixed && m != mm_mode)
        die(EXIT_INTERNAL, "kernels_cuda_set_compute_dtype(\"%s\") after kernels_cuda() (the [a] buffers' width is handed out)", dtype);
    mm_mode = m;
    f8_want(fp8);
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
#define WC_ENTRIES CUDA_WEIGHT_COPIES
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
    f8_stale(p, n * sizeof(float));
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
    f8_stale(p, bytes);
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
static void cu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (f8_active() && C > 0) return f8_forward(out, 0, NULL, inp, w, bias, N, C, OC);
    const int bf16 = act_bf16();
    rm_gemm_core(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, bf16, NULL, bf16 ? inp : NULL,
                 bf16 ? wc_get(w, (size_t)OC * C) : NULL, NULL, 0, NULL);
}

/* out = res + inp @ w^T (+ bias): one GEMM, beta 1 reading res as its C
 * and writing out as its D, so the product never goes through memory on
 * its own (inp is [a]; res and out fp32, the residual stream) */
static void cu_matmul_forward_res(float *out, const float *res, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (f8_active() && C > 0) return f8_forward(out, 0, res, inp, w, bias, N, C, OC);
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
static void cu_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w, const float *bias, int N,
                                int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (f8_active() && C > 0) { /* the product (and bias) into pre, then the GELU kernel */
        f8_forward(pre, act_bf16(), NULL, inp, w, bias, N, C, OC);
        gelu_into(out, pre, (size_t)N * OC, act_bf16());
        return;
    }
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
    if (f8_active()) { /* FP8 from dout itself (fp32 unless [a]), the GELU's backward and the bias after */
        f8_backward(dinp, ldd, dinp_bf16, dw, dout, dout_bf16, inp, w, N, C, OC);
        if (dinp && dgelu_pre) {
            if (ldd != C) die(EXIT_INTERNAL, "cuda fp8: the GELU backward wants a dense product");
            dgelu_inplace(dinp, dgelu_pre, (size_t)N * C, dinp_bf16);
        }
        if (dbias) colsum_add(COL_PLAIN, dbias, NULL, dout, NULL, NULL, NULL, N, OC, dout_bf16);
        return;
    }
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

static void cu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                            int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    matmul_backward_core(dinp, C, NULL, dw, dbias, dout, NULL, inp, w, N, C, OC, 0, 0);
}

/* [a] out / dout (kernels.h; the LM head, the SwiGLU up-projection, the qkv
 * projection): under bf16 the GEMM writes bf16 out (cuBLASLt rounds the
 * fp32 accumulator plus the bias, a bf16 copy, to nearest), and the
 * backward reads the bf16 dout as it is (its bias gradient too) */
static void cu_matmul_forward_a(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (f8_active() && C > 0) return f8_forward(out, act_bf16(), NULL, inp, w, bias, N, C, OC);
    if (!act_bf16()) {
        cu_matmul_forward(out, inp, w, bias, N, C, OC);
        return;
    }
    rm_gemm_core(0, 1, N, OC, C, 1.0f, inp, C, 0, w, C, 0, 0.0f, out, OC, 0, 1, bias, 1, NULL, inp,
                 wc_get(w, (size_t)OC * C), NULL, 1, NULL);
}

static void cu_matmul_backward_a(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                              const float *w, int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    matmul_backward_core(dinp, C, NULL, dw, dbias, dout, NULL, inp, w, N, C, OC, act_bf16(), 0);
}

/* dinp is [a] (the attention output projection's: attention_backward's
 * dout): under bf16 the input-gradient GEMM writes it as bf16, cuBLASLt
 * rounding the fp32 accumulator to nearest */
static void cu_matmul_backward_dinp_a(float *dinp, float *dw, float *dbias, const float *dout, const float *dout_a,
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
static void cu_matmul_gelu_backward(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
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
static void cu_matmul_swiglu_backward(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
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
