/* kernels/moe.cuh — the mixture-of-experts kernels (kernels_ops.h's moe_* entries; moe.c): the router's softmax and top-k, its backward with the balance losses' terms, the probabilities' column sums, and the permutation of token rows to their experts and back.
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own.
 *
 * Every result is the CPU backend's (kernels_cpu_moe.c) to fp32 rounding,
 * and none depends on the grid or on scheduling: a token's work is one
 * warp's or one block's, in a fixed order, and no float is added by an
 * atomic. The router's softmax, like the CPU's, sums its exponentials in
 * double (here in a warp's fixed butterfly order instead of the CPU's
 * sequence: the probabilities round to the same floats but where two
 * sums fall on either side of a rounding boundary); the weighted sums of
 * the experts' outputs and the permutation's backward add their terms in
 * the CPU's order, an fp32 product and an fp32 addition each (__fadd_rn:
 * never fused), so they are the CPU's bits. */

// ----------------------------------------------------------------------------
// the router: a warp per token, the tokens' warps taking rows in turn

#define MOE_WARPS 8 /* tokens a block */

static unsigned moe_token_blocks(int N) {
    const unsigned want = (unsigned)((N + MOE_WARPS - 1) / MOE_WARPS), fill = (unsigned)resident_blocks(32 * MOE_WARPS);
    return want < 1 ? 1 : want < fill ? want : fill;
}

__device__ __forceinline__ int sign_set(float v) { return (int)(__float_as_uint(v) >> 31); }
__device__ __forceinline__ float sign_flip(float v) { return __uint_as_float(__float_as_uint(v) ^ 0x80000000u); }

/* probs, lse, idx and wts as kernels_ops.h's moe_route. The lane of
 * expert e is e % 32: it alone reads and writes probs[n, e], so the top-k
 * marks an expert it has taken by the sign bit of its probability (a
 * softmax output is +0 or more) and clears the marks after the k rounds;
 * each round is a warp argmax of probs + bias over the unmarked experts,
 * the larger value winning and of equal values the lower index. bias is
 * finite. */
__global__ void moe_route_k(float *probs, float *lse, int *idx, float *wts, const float *logits, const float *bias,
                            int N, int E, int k, int norm_topk) {
    const int lane = threadIdx.x & 31;
    for (int n = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5); n < N; n += gridDim.x * MOE_WARPS) {
        const float *x = logits + (size_t)n * E;
        float *p = probs + (size_t)n * E;
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]);
        mx = warp_max(mx);
        double s = 0.0;
        for (int e = lane; e < E; e += 32) s += exp((double)x[e] - mx);
        s = warp_sum(s);
        for (int e = lane; e < E; e += 32) p[e] = (float)(exp((double)x[e] - mx) / s);
        if (lane == 0) lse[n] = (float)(mx + log(s));
        int *id = idx + (size_t)n * k;
        float *w = wts + (size_t)n * k;
        double sum = 0.0;
        for (int j = 0; j < k; j++) {
            float bv = 0.0f;
            int be = -1;
            for (int e = lane; e < E; e += 32) {
                const float pe = p[e];
                if (sign_set(pe)) continue; /* taken */
                const float v = pe + (bias ? bias[e] : 0.0f);
                if (be < 0 || v > bv) { bv = v; be = e; }
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oe = __shfl_xor_sync(0xffffffffu, be, o);
                if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) { bv = ov; be = oe; }
            }
            const int owner = be & 31;
            const float pb = __shfl_sync(0xffffffffu, lane == owner ? p[be] : 0.0f, owner);
            if (lane == owner) p[be] = sign_flip(pb);
            if (lane == 0) { id[j] = be; w[j] = pb; }
            sum += pb;
        }
        for (int e = lane; e < E; e += 32)
            if (sign_set(p[e])) p[e] = sign_flip(p[e]);
        if (norm_topk && lane == 0)
            for (int j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
    }
}

/* dlogits as kernels_ops.h's moe_route_backward: each lane its experts'
 * d(probs) (dprob, plus the top-k weights' term of the choice that names
 * it), then the softmax's backward over the warp's dot product */
__global__ void moe_route_bwd_k(float *dlogits, const float *probs, const float *lse, const int *idx, const float *wts,
                                const float *dwts, const float *dprob, float dz, int N, int E, int k, int norm_topk) {
    const int lane = threadIdx.x & 31;
    for (int n = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5); n < N; n += gridDim.x * MOE_WARPS) {
        const float *p = probs + (size_t)n * E;
        const int *id = idx + (size_t)n * k;
        const float *w = wts + (size_t)n * k, *dw = dwts + (size_t)n * k;
        float *dl = dlogits + (size_t)n * E;
        double s = 0.0, dot = 0.0; /* w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S */
        if (norm_topk)
            for (int j = 0; j < k; j++) { s += p[id[j]]; dot += (double)dw[j] * w[j]; }
        double pdot = 0.0;
        for (int e = lane; e < E; e += 32) {
            float d = dprob ? dprob[e] : 0.0f;
            for (int j = 0; j < k; j++)
                if (id[j] == e) d += norm_topk ? (float)((dw[j] - dot) / s) : dw[j];
            dl[e] = d;
            pdot += (double)p[e] * d;
        }
        pdot = warp_sum(pdot);
        const double z = 2.0 * (double)dz * lse[n];
        for (int e = lane; e < E; e += 32) dl[e] = (float)(p[e] * (dl[e] - pdot + z));
    }
}

static void cu_moe_route(float *probs, float *lse, int *idx, float *wts, const float *logits, const float *bias, int N,
                         int E, int k, int norm_topk) {
    if (N <= 0 || E <= 0) return;
    moe_route_k<<<moe_token_blocks(N), 32 * MOE_WARPS>>>(probs, lse, idx, wts, logits, bias, N, E, k, norm_topk);
    LAUNCH_CHECK();
}

static void cu_moe_route_backward(float *dlogits, const float *probs, const float *lse, const int *idx,
                                  const float *wts, const float *dwts, const float *dprob, float dz, int N, int E,
                                  int k, int norm_topk) {
    if (N <= 0 || E <= 0) return;
    moe_route_bwd_k<<<moe_token_blocks(N), 32 * MOE_WARPS>>>(dlogits, probs, lse, idx, wts, dwts, dprob, dz, N, E, k,
                                                             norm_topk);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// the probabilities' column sums: a block a column, its threads' double
// sums over rows t, t + 256, ... then the block's fixed-order sum

#define MOE_COL_THREADS 256

__global__ void moe_colsum_k(float *out, const float *x, int N, int E) {
    const int e = blockIdx.x;
    double s = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) s += x[(size_t)n * E + e];
    s = block_sum(s);
    if (threadIdx.x == 0) out[e] = (float)s;
}

static void cu_moe_colsum(float *out, const float *x, int N, int E) {
    if (E <= 0) return;
    moe_colsum_k<<<(unsigned)E, MOE_COL_THREADS>>>(out, x, N, E);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// the permutation: [a] rows copied as words (bf16 or fp32 alike: no
// conversion), 16 bytes a thread where the rows and both buffers allow

template <typename W> __global__ void moe_permute_k(W *xp, const W *x, const int *src, int n, size_t words) {
    GRID_STRIDE(i, (size_t)n * words) {
        const size_t r = i / words, c = i % words;
        xp[i] = x[(size_t)src[r] * words + c];
    }
}

static long moe_vec_calls;
extern "C" long kernels_cuda_moe_vec_calls(void) { return moe_vec_calls; }

static void cu_moe_permute(float *xp, const float *x, const int *src, int n, int C) {
    if (n <= 0 || C <= 0) return;
    const size_t row = (size_t)C * (act_bf16() ? 2u : 4u);
    if (row % 16 == 0 && aligned16(xp) && aligned16(x)) {
        moe_permute_k<uint4><<<grid_for((size_t)n * (row / 16), 256), 256>>>((uint4 *)(void *)xp,
                                                                            (const uint4 *)(const void *)x, src, n, row / 16);
        moe_vec_calls++;
    } else if (row % 4 == 0 && ((uintptr_t)xp & 3u) == 0 && ((uintptr_t)x & 3u) == 0) {
        moe_permute_k<uint32_t><<<grid_for((size_t)n * (row / 4), 256), 256>>>((uint32_t *)(void *)xp,
                                                                              (const uint32_t *)(const void *)x, src, n,
                                                                              row / 4);
    } else {
        moe_permute_k<uint16_t><<<grid_for((size_t)n * (row / 2), 256), 256>>>((uint16_t *)(void *)xp,
                                                                              (const uint16_t *)(const void *)x, src, n,
                                                                              row / 2);
    }
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// the experts' outputs back to their tokens, and the backward of both

/* V consecutive fp32 elements (V 4: 16-byte aligned) */
template <int V> __device__ __forceinline__ void moe_ld(const float *p, float *v) {
    if constexpr (V == 4) ld16(p, v);
    else v[0] = *p;
}
template <int V> __device__ __forceinline__ void moe_st(float *p, const float *v) {
    if constexpr (V == 4) st16(p, v);
    else *p = v[0];
}

/* a thread per V columns of a token: out = res (or 0), then each kept
 * choice's weight times its row, in increasing j; out may alias res (each
 * element is read and written by the one thread) */
template <int V>
__global__ void moe_combine_k(float *out, const float *res, const float *yp, const float *wts, const int *slot, int N,
                              int k, int C) {
    const int CV = C / V;
    GRID_STRIDE(i, (size_t)N * CV) {
        const size_t n = i / CV, c = (i % CV) * V;
        float o[V], y[V];
        if (res) {
            moe_ld<V>(res + n * C + c, o);
        } else {
#pragma unroll
            for (int u = 0; u < V; u++) o[u] = 0.0f;
        }
        for (int j = 0; j < k; j++) {
            const int r = slot[n * k + j];
            if (r < 0) continue;
            const float w = wts[n * k + j];
            moe_ld<V>(yp + (size_t)r * C + c, y);
#pragma unroll
            for (int u = 0; u < V; u++) o[u] = __fadd_rn(o[u], w * y[u]);
        }
        moe_st<V>(out + n * C + c, o);
    }
}

/* dx += each kept choice's row of dxp, in increasing j */
template <int V> __global__ void moe_unpermute_add_k(float *dx, const float *dxp, const int *slot, int N, int k, int C) {
    const int CV = C / V;
    GRID_STRIDE(i, (size_t)N * CV) {
        const size_t n = i / CV, c = (i % CV) * V;
        float o[V], s[V];
        moe_ld<V>(dx + n * C + c, o);
        for (int j = 0; j < k; j++) {
            const int r = slot[n * k + j];
            if (r < 0) continue;
            moe_ld<V>(dxp + (size_t)r * C + c, s);
#pragma unroll
            for (int u = 0; u < V; u++) o[u] = __fadd_rn(o[u], s[u]);
        }
        moe_st<V>(dx + n * C + c, o);
    }
}

/* a block per token, its choices in turn: dyp's row of each kept choice
 * and the weight's gradient, dout's row . yp's row, a double sum per
 * thread then the block's fixed-order sum */
__global__ void moe_combine_bwd_k(float *dyp, float *dwts, const float *dout, const float *yp, const float *wts,
                                  const int *slot, int N, int k, int C) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const float *d = dout + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int r = slot[(size_t)n * k + j];
            if (r < 0) { /* the block alike */
                if (threadIdx.x == 0) dwts[(size_t)n * k + j] = 0.0f;
                continue;
            }
            const float *y = yp + (size_t)r * C;
            float *dy = dyp + (size_t)r * C;
            const float w = wts[(size_t)n * k + j];
            double dot = 0.0;
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                const float dv = d[c];
                dot += (double)dv * y[c];
                dy[c] = w * dv;
            }
            dot = block_sum(dot);
            if (threadIdx.x == 0) dwts[(size_t)n * k + j] = (float)dot;
        }
    }
}

static void cu_moe_combine(float *out, const float *res, const float *yp, const float *wts, const int *slot, int N,
                           int k, int C) {
    if (N <= 0 || C <= 0) return;
    if (C % 4 == 0 && aligned16(out) && (!res || aligned16(res)) && aligned16(yp)) {
        moe_combine_k<4><<<grid_for((size_t)N * (C / 4), 256), 256>>>(out, res, yp, wts, slot, N, k, C);
        moe_vec_calls++;
    } else moe_combine_k<1><<<grid_for((size_t)N * C, 256), 256>>>(out, res, yp, wts, slot, N, k, C);
    LAUNCH_CHECK();
}

static void cu_moe_combine_backward(float *dyp, float *dwts, const float *dout, const float *yp, const float *wts,
                                    const int *slot, int N, int k, int C) {
    if (N <= 0 || k <= 0) return;
    const unsigned fill = (unsigned)resident_blocks(MOE_COL_THREADS);
    moe_combine_bwd_k<<<(unsigned)N < fill ? (unsigned)N : fill, MOE_COL_THREADS>>>(dyp, dwts, dout, yp, wts, slot, N, k,
                                                                                     C);
    LAUNCH_CHECK();
}

static void cu_moe_unpermute_add(float *dx, const float *dxp, const int *slot, int N, int k, int C) {
    if (N <= 0 || C <= 0) return;
    grad_ready(dx, (size_t)N * C * sizeof(float));
    if (C % 4 == 0 && aligned16(dx) && aligned16(dxp)) {
        moe_unpermute_add_k<4><<<grid_for((size_t)N * (C / 4), 256), 256>>>(dx, dxp, slot, N, k, C);
        moe_vec_calls++;
    } else moe_unpermute_add_k<1><<<grid_for((size_t)N * C, 256), 256>>>(dx, dxp, slot, N, k, C);
    LAUNCH_CHECK();
}
