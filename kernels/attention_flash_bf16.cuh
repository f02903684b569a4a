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
 * instruction with the same layouts (tests/cuda_emu).
 *
 * The same kernels run context parallelism's attention parts
 * (attention_part.cuh): FbSeg says where a call's queries and keys lie
 * (the whole sequence is one pair of segments), masks compare sequence
 * positions, and with merge the forward merges into out and lse by the
 * log-sum-exp and the backward adds into dqkv and the fp32 k|v gradient. */

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

/* Where a call's queries and keys lie: the whole sequence (fb_whole), or
 * one of context parallelism's segment pairs (kernels/attention_part.cuh).
 * Query i (0 <= i < nq) is row qrow + i of its batch row of qkv (Tq rows a
 * batch row) at sequence position q0 + i, with document start qstart[b Tq
 * + qrow + i]; out, dout, lse and D rows are indexed as the queries'. Key j
 * (0 <= j < nk) is row krow + j of kv (Tk rows a batch row, KS elements a
 * row: kv head kh's K at column kh HD, its V at (nkv + kh) HD) at position
 * k0 + j. merge: the forward merges with what out and lse hold
 * (kernels.h attention_part_forward, merge 1) and the backward adds dQ
 * into dqkv and dK, dV into the fp32 dkv (attention_part_backward); else
 * the forward overwrites (a row that sees no key: out 0, lse -inf) and the
 * backward writes dQ, dK and dV into dqkv. */
struct FbSeg {
    const __nv_bfloat16 *kv;
    size_t KS;
    int qrow, q0, nq, krow, k0, nk, Tq, Tk, merge;
};

/* A block of the forward or dQ kernel, grid (B * nh, query tiles), the
 * last query tile first: sequence b, query head h, its kv head kh, query
 * rows [i0, i0 + FB_BM) of the segment, key tiles [kt0, nkt) of BN keys
 * (from the one holding the first row's document start, the smallest of
 * the block's, to the one holding the last row's position; none when kt0
 * >= nkt); qs: sequence b's document starts from query 0, or NULL. */
struct FbQBlock {
    int b, h, kh, i0, kt0, nkt;
    const int *qs;
};

template <int BN> __device__ __forceinline__ FbQBlock fb_qblock(const int *qstart, const FbSeg &g, int nh, int nkv) {
    FbQBlock k;
    const int bh = (int)blockIdx.x, nqt = (g.nq + FB_BM - 1) / FB_BM;
    k.b = bh / nh;
    k.h = bh % nh;
    k.kh = k.h / (nh / nkv);
    k.i0 = (nqt - 1 - (int)blockIdx.y) * FB_BM;
    k.qs = qstart ? qstart + (size_t)k.b * g.Tq + g.qrow : NULL;
    const int first = att_start(k.qs, k.i0, g.nq) - g.k0;
    const int kend = min(g.nk, g.q0 + min(k.i0 + FB_BM, g.nq) - g.k0); /* keys after the last row are masked */
    k.kt0 = first > 0 ? first / BN : 0;
    k.nkt = kend > 0 ? (kend - 1) / BN + 1 : 0;
    return k;
}

/* the warp's query rows in the forward and dQ: indices row[2] (lane's g
 * and g + 8) from w0, their positions pos[2] and document starts qs[2],
 * and the span [ws0, ws1] of its rows' document starts (key tiles before
 * ws0 are skipped, those that begin before ws1 masked) */
struct FbRows {
    int w0, pw, row[2], pos[2], qs[2], ws0, ws1;
};

__device__ __forceinline__ FbRows fb_rows(const FbQBlock &blk, const FbSeg &g, int warp, int lane) {
    FbRows r;
    r.w0 = blk.i0 + warp * 16;
    r.pw = g.q0 + r.w0;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        r.row[i] = r.w0 + (lane >> 2) + 8 * i;
        r.pos[i] = g.q0 + r.row[i];
        r.qs[i] = att_start(blk.qs, r.row[i], g.nq);
    }
    r.ws0 = att_start(blk.qs, r.w0, g.nq);
    r.ws1 = att_start(blk.qs, (r.w0 + 15 < g.nq ? r.w0 + 15 : g.nq - 1), g.nq);
    return r;
}

/* a row's log-sum-exp in base 2; a row that sees no key at all (-inf)
 * gives +inf, so that its P = 2^(s - it) is 0 */
__device__ __forceinline__ float fb_lse2(float l) { return l == -INFINITY ? INFINITY : l * FB_LOG2E; }

/* the two bf16 of a word as floats */
__device__ __forceinline__ float fb_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float fb_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* forward: grid (B * nh, query tiles), the last query tile first */
template <int HD, int BN>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bf16_fwd_k(__nv_bfloat16 *__restrict__ out, float *__restrict__ lse, const __nv_bfloat16 *__restrict__ qkv,
                     const int *__restrict__ qstart, FbSeg g, int nh, int nkv, float scale) {
    constexpr int LDW = HD / 2 + 4, KC = HD / 16, NT = BN / 8, OT = HD / 8;
    uint32_t *Qs = fb_base(), *Ks = Qs + fb_words<HD, FB_BM>(), *Vs = Ks + fb_words<HD, BN>();
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const FbQBlock blk = fb_qblock<BN>(qstart, g, nh, nkv);
    const size_t S = (size_t)(nh + 2 * nkv) * HD, OS = (size_t)nh * HD;
    const __nv_bfloat16 *kseq = g.kv + ((size_t)blk.b * g.Tk + g.krow) * g.KS;
    fb_load<HD, FB_BM>(Qs, qkv + ((size_t)blk.b * g.Tq + g.qrow) * S + (size_t)blk.h * HD, S, blk.i0, g.nq, tid);
    const FbRows w = fb_rows(blk, g, warp, lane);
    float *L[2], old[2]; /* merge: what lse holds, read before the barriers (one lane of a row writes it) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        L[i] = lse + ((size_t)blk.b * nh + blk.h) * g.Tq + g.qrow + w.row[i];
        old[i] = g.merge && w.row[i] < g.nq ? *L[i] : -INFINITY;
    }
    __syncthreads();
    uint32_t qa[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) fb_frag_a<LDW>(qa[kc], Qs, warp * 16, kc, lane);
    const float sl2 = scale * FB_LOG2E;
    float o[OT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    fb_zero(o);
    for (int kt = blk.kt0; kt < blk.nkt; kt++) {
        const int j0 = kt * BN, kp = g.k0 + j0; /* the tile's first key: index, position */
        __syncthreads(); /* the previous tile's readers of Ks and Vs are done */
        fb_load<HD, BN>(Ks, kseq + (size_t)blk.kh * HD, g.KS, j0, g.nk, tid);
        fb_load<HD, BN>(Vs, kseq + (size_t)(nkv + blk.kh) * HD, g.KS, j0, g.nk, tid);
        __syncthreads();
        if (kp > w.pw + 15 || kp + BN <= w.ws0) continue; /* every key after every row of the warp, or before */
        float s[NT][4];
        fb_scores<KC, NT, LDW>(s, qa, Ks, lane);
        const bool edge = kp + BN - 1 > w.pw || j0 + BN > g.nk || kp < w.ws1;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int jj = j0 + 8 * j + 2 * t + (e & 1), k = g.k0 + jj;
                float v = s[j][e] * sl2;
                if (edge && (k > w.pos[e >> 1] || k < w.qs[e >> 1] || jj >= g.nk)) v = -INFINITY;
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
    if (g.merge) __syncthreads(); /* every lane has read old (no key tile: no barrier since) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int q = w.row[i];
        if (q >= g.nq) continue;
        /* this call's lse (natural log; -inf: the row saw no key), merged
         * with old: lse' = log(e^old + e^part), out' = out e^(old - lse') +
         * o e^(m - lse') (o / l when there is nothing to merge) */
        const float part = l[i] > 0.0f ? m[i] * FB_LN2 + logf(l[i]) : -INFINITY, od = old[i];
        float nw = part, fo = 0.0f, fa = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        if (od != -INFINITY) {
            nw = part == -INFINITY ? od : od > part ? od + log1pf(expf(part - od)) : part + log1pf(expf(od - part));
            fo = expf(od - nw);
            fa = part == -INFINITY ? 0.0f : exp2f(m[i] - nw * FB_LOG2E);
        }
        /* out is [a], bf16 here (these kernels run under bf16 only) */
        uint32_t *orow = reinterpret_cast<uint32_t *>(
            static_cast<void *>(out + ((size_t)blk.b * g.Tq + g.qrow + q) * OS + (size_t)blk.h * HD + 2 * t));
#pragma unroll
        for (int jd = 0; jd < OT; jd++) {
            float a = o[jd][2 * i] * fa, c = o[jd][2 * i + 1] * fa;
            if (fo != 0.0f) {
                const uint32_t wd = orow[4 * jd];
                a += fb_lo(wd) * fo;
                c += fb_hi(wd) * fo;
            }
            orow[4 * jd] = fb_pack(a, c);
        }
        if (t == 0) *L[i] = nw;
    }
}

/* dQ: grid (B * nh, query tiles), last query tile first */
template <int HD, int BN>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bf16_dq_k(__nv_bfloat16 *__restrict__ dqkv, const __nv_bfloat16 *__restrict__ dout,
                    const __nv_bfloat16 *__restrict__ qkv, const float *__restrict__ lse,
                    const float *__restrict__ Dr, const int *__restrict__ qstart, FbSeg g, int nh, int nkv,
                    float scale) {
    constexpr int LDW = HD / 2 + 4, KC = HD / 16, NT = BN / 8, OT = HD / 8;
    uint32_t *Qs = fb_base(), *dOs = Qs + fb_words<HD, FB_BM>(), *Ks = dOs + fb_words<HD, FB_BM>();
    uint32_t *Vs = Ks + fb_words<HD, BN>();
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const FbQBlock blk = fb_qblock<BN>(qstart, g, nh, nkv);
    const size_t S = (size_t)(nh + 2 * nkv) * HD, OS = (size_t)nh * HD, r0 = (size_t)blk.b * g.Tq + g.qrow;
    const __nv_bfloat16 *kseq = g.kv + ((size_t)blk.b * g.Tk + g.krow) * g.KS;
    fb_load<HD, FB_BM>(Qs, qkv + r0 * S + (size_t)blk.h * HD, S, blk.i0, g.nq, tid);
    fb_load<HD, FB_BM>(dOs, dout + r0 * OS + (size_t)blk.h * HD, OS, blk.i0, g.nq, tid);
    __syncthreads();
    uint32_t qa[KC][4], da[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        fb_frag_a<LDW>(qa[kc], Qs, warp * 16, kc, lane);
        fb_frag_a<LDW>(da[kc], dOs, warp * 16, kc, lane);
    }
    const FbRows w = fb_rows(blk, g, warp, lane);
    const float sl2 = scale * FB_LOG2E;
    float l2[2], dd[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const size_t li = ((size_t)blk.b * nh + blk.h) * g.Tq + g.qrow + w.row[i];
        l2[i] = w.row[i] < g.nq ? fb_lse2(lse[li]) : 0.0f;
        dd[i] = w.row[i] < g.nq ? Dr[li] : 0.0f;
    }
    float dq[OT][4];
    fb_zero(dq);
    for (int kt = blk.kt0; kt < blk.nkt; kt++) {
        const int j0 = kt * BN, kp = g.k0 + j0;
        __syncthreads(); /* the previous tile's readers of Ks and Vs are done */
        fb_load<HD, BN>(Ks, kseq + (size_t)blk.kh * HD, g.KS, j0, g.nk, tid);
        fb_load<HD, BN>(Vs, kseq + (size_t)(nkv + blk.kh) * HD, g.KS, j0, g.nk, tid);
        __syncthreads();
        if (kp > w.pw + 15 || kp + BN <= w.ws0) continue;
        float s[NT][4], dp[NT][4];
        fb_scores<KC, NT, LDW>(s, qa, Ks, lane);
        fb_scores<KC, NT, LDW>(dp, da, Vs, lane);
        const bool edge = kp + BN - 1 > w.pw || j0 + BN > g.nk || kp < w.ws1;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int jj = j0 + 8 * j + 2 * t + (e & 1), k = g.k0 + jj, q = w.row[e >> 1];
                const float p = (!edge || (k <= w.pos[e >> 1] && k >= w.qs[e >> 1] && jj < g.nk)) && q < g.nq
                                    ? exp2f(s[j][e] * sl2 - l2[e >> 1])
                                    : 0.0f;
                s[j][e] = p * (dp[j][e] - dd[e >> 1]);
            }
        fb_accum<NT / 2, OT, LDW>(dq, s, Ks, lane);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int q = w.row[i];
        if (q >= g.nq) continue;
        __nv_bfloat16 *r = dqkv + (r0 + q) * S + (size_t)blk.h * HD + 2 * t;
#pragma unroll
        for (int jd = 0; jd < OT; jd++) {
            float a = dq[jd][2 * i] * scale, c = dq[jd][2 * i + 1] * scale;
            if (g.merge) { /* added to what dqkv holds, rounded once */
                const uint32_t wd = *reinterpret_cast<const uint32_t *>(static_cast<const void *>(r + 8 * jd));
                a += fb_lo(wd);
                c += fb_hi(wd);
            }
            fb_put2(r + 8 * jd, a, c);
        }
    }
}

/* dK, dV: grid (B * nkv, key tiles of 64 keys), the first key tile first;
 * rows of the score tiles are keys: S^T = K Q^T. KREG: K and V stay in
 * registers as A fragments (head dims up to 64; 128 reads them from shared
 * memory for each product, which keeps dK and dV's 128 accumulators in
 * registers). Writes dK and dV into dqkv's k and v columns, or with
 * g.merge adds them into the fp32 dkv (laid out as g.kv). */
template <int HD, int BM>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bf16_dkv_k(__nv_bfloat16 *__restrict__ dqkv, float *__restrict__ dkv, const __nv_bfloat16 *__restrict__ dout,
                     const __nv_bfloat16 *__restrict__ qkv, const float *__restrict__ lse,
                     const float *__restrict__ Dr, const int *__restrict__ qstart, FbSeg g, int nh, int nkv,
                     float scale) {
    constexpr int BN = FB_BM, LDW = HD / 2 + 4, KC = HD / 16, NT = BM / 8, OT = HD / 8;
    constexpr bool KREG = HD <= 64;
    uint32_t *Ks = fb_base(), *Vs = Ks + fb_words<HD, BN>(), *Qs = Vs + fb_words<HD, BN>();
    uint32_t *dOs = Qs + fb_words<HD, BM>();
    float *ls = reinterpret_cast<float *>(dOs + fb_words<HD, BM>()), *Ds = ls + BM;
    int *qss = reinterpret_cast<int *>(Ds + BM);
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const int bk = (int)blockIdx.x, b = bk / nkv, kh = bk % nkv, group = nh / nkv;
    const int j0 = (int)blockIdx.y * BN, kp0 = g.k0 + j0, nqt = (g.nq + BM - 1) / BM;
    const int *qsrow = qstart ? qstart + (size_t)b * g.Tq + g.qrow : NULL;
    /* query tiles from the one holding position kp0 (those before end
     * above the diagonal) to fl_qend's (see flash_bwd_dkv_k) */
    const int qt0 = kp0 > g.q0 ? (kp0 - g.q0) / BM : 0, qend = fl_qend<BM>(qsrow, kp0 + BN - 1, qt0, nqt, g.nq);
    const size_t S = (size_t)(nh + 2 * nkv) * HD, OS = (size_t)nh * HD, r0 = (size_t)b * g.Tq + g.qrow;
    const size_t kr0 = (size_t)b * g.Tk + g.krow;
    const __nv_bfloat16 *kseq = g.kv + kr0 * g.KS;
    fb_load<HD, BN>(Ks, kseq + (size_t)kh * HD, g.KS, j0, g.nk, tid);
    fb_load<HD, BN>(Vs, kseq + (size_t)(nkv + kh) * HD, g.KS, j0, g.nk, tid);
    __syncthreads();
    uint32_t ka[KREG ? KC : 1][4], va[KREG ? KC : 1][4];
    if constexpr (KREG) {
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            fb_frag_a<LDW>(ka[kc], Ks, warp * 16, kc, lane);
            fb_frag_a<LDW>(va[kc], Vs, warp * 16, kc, lane);
        }
    }
    /* the warp's keys: index w0 on, positions pw on; the lane's two keys' positions */
    const int w0 = j0 + warp * 16, pw = g.k0 + w0, key[2] = {pw + (lane >> 2), pw + (lane >> 2) + 8};
    const float sl2 = scale * FB_LOG2E;
    float dk[OT][4], dv[OT][4];
    fb_zero(dk);
    fb_zero(dv);
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        for (int qt = qt0; qt < qend; qt++) {
            const int i0 = qt * BM, qp = g.q0 + i0; /* the tile's first query: index, position */
            __syncthreads(); /* the previous step's readers are done */
            fb_load<HD, BM>(Qs, qkv + r0 * S + (size_t)h * HD, S, i0, g.nq, tid);
            fb_load<HD, BM>(dOs, dout + r0 * OS + (size_t)h * HD, OS, i0, g.nq, tid);
            for (int r = tid; r < BM; r += FL_THREADS) {
                const int q = i0 + r;
                const size_t li = ((size_t)b * nh + h) * g.Tq + g.qrow + q;
                ls[r] = q < g.nq ? fb_lse2(lse[li]) : 0.0f;
                Ds[r] = q < g.nq ? Dr[li] : 0.0f;
                qss[r] = att_start(qsrow, q, g.nq);
            }
            __syncthreads();
            /* every query before every key of the warp, or its document
             * after them (the tile's first query's qstart is its smallest) */
            if (qp + BM - 1 < pw || qss[0] > pw + 15) continue;
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
            /* masked: the diagonal, the segment's end, or a document that
             * starts after the warp's first key (qss[BM - 1], the tile's
             * largest qstart) */
            const bool edge = qp < pw + 15 || i0 + BM > g.nq || qss[BM - 1] > pw;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 8 * j + 2 * t + (e & 1), q = qp + c;
                    const float p = !edge || (key[e >> 1] <= q && key[e >> 1] >= qss[c] && i0 + c < g.nq)
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
        const int k = w0 + (lane >> 2) + 8 * i;
        if (k >= g.nk) continue;
        if (g.merge) {
            float *rk = dkv + (kr0 + k) * g.KS + (size_t)kh * HD + 2 * t, *rv = rk + (size_t)nkv * HD;
#pragma unroll
            for (int jd = 0; jd < OT; jd++) {
                float2 a = *(float2 *)(void *)(rk + 8 * jd), c = *(float2 *)(void *)(rv + 8 * jd);
                a.x += dk[jd][2 * i] * scale;
                a.y += dk[jd][2 * i + 1] * scale;
                c.x += dv[jd][2 * i];
                c.y += dv[jd][2 * i + 1];
                *(float2 *)(void *)(rk + 8 * jd) = a;
                *(float2 *)(void *)(rv + 8 * jd) = c;
            }
        } else {
            __nv_bfloat16 *r = dqkv + (kr0 + k) * S + 2 * t;
            __nv_bfloat16 *rk = r + (size_t)(nh + kh) * HD, *rv = r + (size_t)(nh + nkv + kh) * HD;
#pragma unroll
            for (int jd = 0; jd < OT; jd++) {
                fb_put2(rk + 8 * jd, dk[jd][2 * i] * scale, dk[jd][2 * i + 1] * scale);
                fb_put2(rv + 8 * jd, dv[jd][2 * i], dv[jd][2 * i + 1]);
            }
        }
    }
}

/* tiles: forward keys BN, dQ keys, dK/dV query rows (all 64 but head dim
 * 128's backward, 32: registers) */
template <int HD> struct FbCfg {
    static constexpr int FWD_N = 64, DQ_N = HD > 64 ? 32 : 64, DKV_M = HD > 64 ? 32 : 64;
};

/* the whole sequence of T rows as one segment pair (overwriting) */
static FbSeg fb_whole(const float *qkv, int T, int nh, int nkv, int hd) {
    return FbSeg{CACT16(qkv) + (size_t)nh * hd, (size_t)(nh + 2 * nkv) * hd, 0, 0, T, 0, 0, T, T, T, 0};
}

/* 0 when the shape is past these kernels' limits (shared memory, the
 * grid): nothing ran */
template <int HD>
static int fb_forward(float *out, float *lse, const float *qkv, const int *qstart, const FbSeg &g, int B, int nh,
                      int nkv) {
    constexpr int BN = FbCfg<HD>::FWD_N;
    const size_t smem =
        (size_t)(fb_words<HD, FB_BM>() + 2 * fb_words<HD, BN>()) * 4 + FL_SMEM_SLACK;
    const int nqt = (g.nq + FB_BM - 1) / FB_BM;
    if (smem > smem_limit() || nqt > 65535) return 0;
    if (B > 0 && nqt > 0)
        launch_smem(flash_bf16_fwd_k<HD, BN>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem, ACT16(out),
                    lse, CACT16(qkv), qstart, g, nh, nkv, 1.0f / sqrtf((float)HD));
    return 1;
}

/* dqkv: dQ's destination, and with !g.merge dK's and dV's; dkv: theirs
 * with g.merge. Either NULL: that kernel does not run. */
template <int HD>
static int fb_backward(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out, const float *lse,
                       const int *qstart, const FbSeg &g, int B, int nh, int nkv) {
    constexpr int DQ_N = FbCfg<HD>::DQ_N, DKV_M = FbCfg<HD>::DKV_M;
    const size_t smem_dq =
        (size_t)(2 * fb_words<HD, FB_BM>() + 2 * fb_words<HD, DQ_N>()) * 4 + FL_SMEM_SLACK;
    const size_t smem_dkv =
        (size_t)(2 * fb_words<HD, FB_BM>() + 2 * fb_words<HD, DKV_M>() + 3 * DKV_M) * 4 + FL_SMEM_SLACK; /* ls, Ds, qss */
    const int nqt = (g.nq + FB_BM - 1) / FB_BM, nkt = (g.nk + FB_BM - 1) / FB_BM;
    if (smem_dq > smem_limit() || smem_dkv > smem_limit() || nqt > 65535 || nkt > 65535) return 0;
    float *dk = g.merge ? dkv : dqkv;
    if (B <= 0 || nqt <= 0 || nkt <= 0 || (!dqkv && !dk)) return 1;
    const float scale = 1.0f / sqrtf((float)HD);
    /* D = dO . O of the segment's rows, indexed as lse */
    float *D = fl_scratch((size_t)B * nh * g.Tq * sizeof(float));
    const size_t rows = (size_t)B * nh * g.nq;
    launch_smem(flash_dot_k<__nv_bfloat16, __nv_bfloat16>, dim3((unsigned)((rows + 7) / 8)), 256, 0, D, CACT16(out),
                CACT16(dout), B, g.Tq, nh, HD, g.qrow, g.nq);
    if (dqkv)
        launch_smem(flash_bf16_dq_k<HD, DQ_N>, dim3((unsigned)(B * nh), (unsigned)nqt), FL_THREADS, smem_dq,
                    ACT16(dqkv), CACT16(dout), CACT16(qkv), lse, (const float *)D, qstart, g, nh, nkv, scale);
    if (dk)
        launch_smem(flash_bf16_dkv_k<HD, DKV_M>, dim3((unsigned)(B * nkv), (unsigned)nkt), FL_THREADS, smem_dkv,
                    g.merge ? NULL : ACT16(dqkv), g.merge ? dkv : NULL, CACT16(dout), CACT16(qkv), lse,
                    (const float *)D, qstart, g, nh, nkv, scale);
    return 1;
}
// ---- bf16 tensor-core flash attention region: end ----
