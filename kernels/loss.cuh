/* kernels/loss.cuh — the loss: softmax cross-entropy, one block a row of logits (chunked LM head, masks).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

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

static void cu_crossentropy_forward(float *losses, float *logits, const int *targets, int N, int V) {
    ce_fwd(losses, logits, targets, N, V, 0, 0.0f);
}

static void cu_crossentropy_fused(float *losses, float *logits, const int *targets, float dloss, int N, int V) {
    ce_fwd(losses, logits, targets, N, V, 1, dloss);
}

static void cu_crossentropy_vp_backward(float *probs, const int *targets, float dloss, int N, int V, int v0) {
    if (N <= 0) return;
    const unsigned grid = grid_for((size_t)N * V, 256);
    if (act_bf16()) ce_bwd_k<__nv_bfloat16><<<grid, 256>>>(ACT16(probs), targets, dloss, N, V, v0);
    else ce_bwd_k<float><<<grid, 256>>>(probs, targets, dloss, N, V, v0);
    LAUNCH_CHECK();
}

static void cu_crossentropy_backward(float *probs, const int *targets, float dloss, int N, int V) {
    cu_crossentropy_vp_backward(probs, targets, dloss, N, V, 0);
}

static void cu_crossentropy_vp_max(float *rowmax, const float *logits, int N, int V) {
    if (N <= 0) return;
    if (act_bf16()) ce_vp_max_k<__nv_bfloat16><<<N, CE_THREADS>>>(rowmax, CACT16(logits), V);
    else ce_vp_max_k<float><<<N, CE_THREADS>>>(rowmax, logits, V);
    LAUNCH_CHECK();
}

static void cu_crossentropy_vp_expsum(float *sums, float *tgt, float *logits, const float *rowmax, const int *targets,
                                   int N, int V, int v0) {
    if (N <= 0) return;
    if (act_bf16()) ce_vp_expsum_k<__nv_bfloat16><<<N, CE_THREADS>>>(sums, tgt, ACT16(logits), rowmax, targets, V, v0);
    else ce_vp_expsum_k<float><<<N, CE_THREADS>>>(sums, tgt, logits, rowmax, targets, V, v0);
    LAUNCH_CHECK();
}

static void cu_crossentropy_vp_finish(float *losses, float *logits, const float *rowmax, const float *sums,
                                   const float *tgt, const int *targets, int N, int V) {
    if (N <= 0) return;
    if (act_bf16())
        ce_vp_finish_k<__nv_bfloat16><<<N, CE_THREADS>>>(losses, ACT16(logits), rowmax, sums, tgt, targets, V);
    else ce_vp_finish_k<float><<<N, CE_THREADS>>>(losses, logits, rowmax, sums, tgt, targets, V);
    LAUNCH_CHECK();
}
