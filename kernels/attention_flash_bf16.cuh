/* kernels/attention_flash_bf16.cuh — fused flash-attention-2 style kernels on bf16 tensor cores (mma.sync) under compute dtype bf16.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

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
