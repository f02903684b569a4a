/* kernels/norm.cuh — LayerNorm and RMSNorm, forward and backward (one warp a row, statistics in fp32; the fused residual add and the fused backward).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

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
#define NBW_MAX_BLOCKS CUDA_NORM_BWD_MAX_BLOCKS
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

static void cu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
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

static void cu_layernorm_backward(float *dinp, float *dinp_a, float *dw, float *db, const float *dout, const float *inp,
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

static void cu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(0, 0, NULL, out, NULL, rstd, inp, NULL, w, NULL, N, C, eps)) return;
    if (act_bf16()) rmsnorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(ACT16(out), rstd, inp, w, N, C, eps);
    else rmsnorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(out, rstd, inp, w, N, C, eps);
    LAUNCH_CHECK();
}

static void cu_add_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                  const float *w, const float *bias, int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(1, 1, res, out, mean, rstd, a, b, w, bias, N, C, eps)) return;
    if (act_bf16())
        add_layernorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(res, ACT16(out), mean, rstd, a, b, w, bias, N,
                                                                           C, eps);
    else add_layernorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(res, out, mean, rstd, a, b, w, bias, N, C, eps);
    LAUNCH_CHECK();
}

static void cu_add_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                int N, int C, float eps) {
    if (N <= 0 || norm_forward_vec(0, 1, res, out, NULL, rstd, a, b, w, NULL, N, C, eps)) return;
    if (act_bf16())
        add_rmsnorm_fwd_k<__nv_bfloat16><<<norm_grid(N), NORM_THREADS>>>(res, ACT16(out), rstd, a, b, w, N, C, eps);
    else add_rmsnorm_fwd_k<float><<<norm_grid(N), NORM_THREADS>>>(res, out, rstd, a, b, w, N, C, eps);
    LAUNCH_CHECK();
}

static void cu_rmsnorm_backward(float *dinp, float *dinp_a, float *dw, const float *dout, const float *inp, const float *w,
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
// QK-norm: an RMSNorm over each q and k head (hd values) of a qkv row, a
// warp a head (v heads copied by a warp each); the weights' gradient as the
// column sums above: partial sums of every HN_TY-th row of a block of
// rows each (32 columns by HN_TY row threads a block), then colsum_finish

template <typename T_>
__global__ void headnorm_fwd_k(T_ *out, float *rstd, const T_ *inp, const float *qw, const float *kw, int N, int nh,
                               int nkv, int hd, float eps) {
    const int HA = nh + 2 * nkv, H = nh + nkv, lane = threadIdx.x & 31;
    const size_t item = (size_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (item >= (size_t)N * HA) return;
    const size_t n = item / HA;
    const int h = (int)(item % HA);
    const T_ *x = inp + item * hd;
    T_ *o = out + item * hd;
    if (h >= H) { /* v */
        for (int c = lane; c < hd; c += 32) o[c] = x[c];
        return;
    }
    const float *w = h < nh ? qw : kw;
    float ss = 0.0f;
    for (int c = lane; c < hd; c += 32) { float v = act_ld(x, (size_t)c); ss += v * v; }
    const float rs = rsqrtf(warp_sum(ss) / hd + eps);
    for (int c = lane; c < hd; c += 32) act_st(o, (size_t)c, act_ld(x, (size_t)c) * rs * w[c]);
    if (lane == 0) rstd[n * H + h] = rs;
}

template <typename T_>
__global__ void headnorm_bwd_k(T_ *d, const T_ *inp, const float *qw, const float *kw, const float *rstd, int N, int nh,
                               int nkv, int hd) {
    const int HA = nh + 2 * nkv, H = nh + nkv, lane = threadIdx.x & 31;
    const size_t item = (size_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (item >= (size_t)N * H) return;
    const size_t n = item / H;
    const int h = (int)(item % H);
    T_ *g = d + (n * HA + h) * hd;
    const T_ *x = inp + (n * HA + h) * hd;
    const float *w = h < nh ? qw : kw;
    const float rs = rstd[item];
    float s = 0.0f;
    for (int c = lane; c < hd; c += 32) s += act_ld(g, (size_t)c) * w[c] * (act_ld(x, (size_t)c) * rs);
    const float mdx = warp_sum(s) / hd;
    for (int c = lane; c < hd; c += 32)
        act_st(g, (size_t)c, rs * (act_ld(g, (size_t)c) * w[c] - act_ld(x, (size_t)c) * rs * mdx));
}

/* column j = 32 blockIdx.x + threadIdx.x, partial b = HN_TY blockIdx.y +
 * threadIdx.y: the q heads' terms of rows r0 + threadIdx.y, + HN_TY, ...
 * < r0 + rows_per (r0 = blockIdx.y rows_per) into p0[b, j], the k heads'
 * into p1[b, j], for colsum_finish to add in its order */
#define HN_TY 8
template <typename T_>
__global__ void __launch_bounds__(32 * HN_TY)
    headnorm_dw_partial_k(float *p0, float *p1, const T_ *d, const T_ *inp, const float *rstd, int N, int nh, int nkv,
                          int hd, int rows_per) {
    const int j = blockIdx.x * 32 + threadIdx.x, HA = nh + 2 * nkv, H = nh + nkv;
    if (j >= hd) return;
    const int n0 = blockIdx.y * rows_per, n1 = n0 + rows_per < N ? n0 + rows_per : N;
    float aq = 0.0f, ak = 0.0f;
    for (int n = n0 + (int)threadIdx.y; n < n1; n += HN_TY)
        for (int h = 0; h < H; h++) {
            const size_t i = ((size_t)n * HA + h) * hd + j;
            const float t = act_ld(d, i) * (act_ld(inp, i) * rstd[(size_t)n * H + h]);
            if (h < nh) aq += t;
            else ak += t;
        }
    const size_t b = (size_t)blockIdx.y * HN_TY + threadIdx.y;
    p0[b * hd + j] = aq;
    p1[b * hd + j] = ak;
}

/* out, inp: [a] */
static void cu_headnorm_forward(float *out, float *rstd, const float *inp, const float *qw, const float *kw, int N, int nh,
                                int nkv, int hd, float eps) {
    const size_t items = (size_t)N * (nh + 2 * nkv);
    if (!items) return;
    const unsigned grid = (unsigned)((items + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    if (act_bf16())
        headnorm_fwd_k<__nv_bfloat16><<<grid, NORM_THREADS>>>(ACT16(out), rstd, CACT16(inp), qw, kw, N, nh, nkv, hd, eps);
    else headnorm_fwd_k<float><<<grid, NORM_THREADS>>>(out, rstd, inp, qw, kw, N, nh, nkv, hd, eps);
    LAUNCH_CHECK();
}

/* dqkv, inp: [a]; the weights' gradient first (it reads d(out), which the
 * input gradient then overwrites) */
static void cu_headnorm_backward(float *dqkv, float *dqw, float *dkw, const float *inp, const float *qw, const float *kw,
                                 const float *rstd, int N, int nh, int nkv, int hd) {
    if (N <= 0) return;
    const int b16 = act_bf16();
    if (dqw || dkw) {
        int rows_per = CUDA_COLSUM_ROWS, RB = (N + rows_per - 1) / rows_per;
        if (RB > CUDA_COLSUM_MAX_BLOCKS) { RB = CUDA_COLSUM_MAX_BLOCKS; rows_per = (N + RB - 1) / RB; }
        const size_t P = (size_t)RB * HN_TY; /* partials */
        float *p0 = (float *)scratch_get(&sc_col, 2 * P * hd * sizeof(float)), *p1 = p0 + P * hd;
        dim3 grid((unsigned)((hd + 31) / 32), (unsigned)RB), block(32, HN_TY);
        if (b16)
            headnorm_dw_partial_k<__nv_bfloat16><<<grid, block>>>(p0, p1, CACT16(dqkv), CACT16(inp), rstd, N, nh, nkv, hd,
                                                                  rows_per);
        else headnorm_dw_partial_k<float><<<grid, block>>>(p0, p1, dqkv, inp, rstd, N, nh, nkv, hd, rows_per);
        LAUNCH_CHECK();
        colsum_finish(dqw, dkw, p0, dkw ? p1 : NULL, (int)P, hd);
    }
    const size_t items = (size_t)N * (nh + nkv);
    const unsigned grid = (unsigned)((items + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    if (b16) headnorm_bwd_k<__nv_bfloat16><<<grid, NORM_THREADS>>>(ACT16(dqkv), CACT16(inp), qw, kw, rstd, N, nh, nkv, hd);
    else headnorm_bwd_k<float><<<grid, NORM_THREADS>>>(dqkv, inp, qw, kw, rstd, N, nh, nkv, hd);
    LAUNCH_CHECK();
}
