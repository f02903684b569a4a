/* kernels/attention_flash.cuh — fused flash-style attention in fp32 / TF32 (wmma) tiles, forward and backward (train.attention_kernel flash; head dims 32, 64, 128).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

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

/* D[(b*nh + h)*T + t] = dout[b,t,h,:] . out[b,t,h,:] for t in [t0, t0 +
 * nt) (the whole sequence: 0, T); one warp per row. OT, DT: float, or
 * bf16 for [a] out and dout under bf16 */
template <typename OT, typename DT>
__global__ void flash_dot_k(float *__restrict__ D, const OT *__restrict__ out, const DT *__restrict__ dout,
                            int B, int T, int nh, int hd, int t0, int nt) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = (int)(threadIdx.x & 31);
    if (row >= (size_t)B * nh * nt) return; /* the whole warp */
    const int t = t0 + (int)(row % nt), h = (int)(row / nt % nh), b = (int)(row / nt / nh);
    const size_t off = ((size_t)b * T + t) * nh * hd + (size_t)h * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s = fmaf(act_ld(out, off + d), act_ld(dout, off + d), s);
    s += __shfl_xor_sync(0xffffffffu, s, 16);
    s += __shfl_xor_sync(0xffffffffu, s, 8);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (lane == 0) D[((size_t)b * nh + h) * T + t] = s;
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
    launch_smem(flash_dot_k<float, float>, dim3((unsigned)((rows + 7) / 8)), 256, 0, D, out, dout, B, T, nh, HD, 0, T);
    launch_smem(flash_bwd_dq_k<TC, HD, C::DQ_M, C::DQ_N>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem_dq,
              dqkv, dout, qkv, lse, (const float *)D, qstart, T, nh, nkv, scale);
    launch_smem(flash_bwd_dkv_k<TC, HD, C::DKV_N, C::DKV_M>, dim3((unsigned)(B * nkv), (unsigned)nkt), FL_THREADS,
              smem_dkv, dqkv, dout, qkv, lse, (const float *)D, qstart, T, nh, nkv, scale);
    return 1;
}
