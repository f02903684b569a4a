/* kernels/pointwise.cuh — embeddings (forward, and the deterministic sorted backward), RoPE, and the pointwise kernels (GELU, SwiGLU, adds, casts, scales).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// embeddings

__global__ void embed_fwd_k(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                            int T, int C, int v0, int V) {
    size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(i / C), c = (int)(i % C);
        int t = tokens[n] - v0;
        float x = (t >= 0 && t < V) ? wte[(size_t)t * C + c] : 0.0f;
        if (wpe) x += wpe[(size_t)(pos ? pos[n] : n % T) * C + c];
        out[i] = x;
    }
}

/* Embedding backward, deterministic: every gradient row receives its rows of
 * dout in increasing row order n, one float addition after another, starting
 * from the row's current value: the CPU backend's order, so the result does
 * not depend on scheduling and equals the CPU's bits (only additions).
 *
 * dwpe without a position array: position t's rows are n = t, t + T,
 * t + 2T, ...: one thread per (t, channel) walks them in order.
 *
 * dwte: a token can be anywhere in the batch, so the rows are grouped by
 * token first: key(n) = (vocabulary row r, or V for a token outside
 * [v0, v0 + V)) << pos_bits | n, sorted with CUB's radix sort over the bits
 * in use. The keys are unique and the row index is in the low bits, so the
 * sorted order is (token, n) whatever the sort's stability. Then one block
 * per (sorted position, 128 channels) where a token's run starts adds that
 * run's dout rows in order into dwte[r]; the other blocks return at once.
 * dwpe with a position array (positions reset at each document) is the same
 * with the positions for tokens and T rows. The keys and CUB's temporary
 * storage live in a scratch buffer that only grows, so the step loop
 * allocates nothing after the first step. */

static int bit_length(unsigned long long x) {
    int b = 0;
    while (x) { b++; x >>= 1; }
    return b;
}

__global__ void embed_keys_k(unsigned long long *keys, const int *ids, int N, int v0, int V, int pos_bits) {
    GRID_STRIDE(i, (size_t)N) {
        long long t = (long long)ids[i] - v0;
        unsigned long long r = (t >= 0 && t < V) ? (unsigned long long)t : (unsigned long long)V;
        keys[i] = (r << pos_bits) | i;
    }
}

#define EMB_THREADS 128

/* grid (N, ceil(C / EMB_THREADS)); keys sorted */
__global__ void embed_bwd_wte_k(float *dwte, const float *dout, const unsigned long long *keys, int N, int C, int V,
                                int pos_bits) {
    int i = blockIdx.x;
    unsigned long long r = keys[i] >> pos_bits;
    if (r >= (unsigned long long)V) return;                     /* not this rank's vocabulary */
    if (i > 0 && (keys[i - 1] >> pos_bits) == r) return;        /* not the start of r's run */
    int c = blockIdx.y * EMB_THREADS + threadIdx.x;
    if (c >= C) return;
    int lo = i + 1, hi = N; /* the run ends at the first later key of another row */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if ((keys[mid] >> pos_bits) == r) lo = mid + 1;
        else hi = mid;
    }
    const unsigned long long mask = (1ull << pos_bits) - 1;
    float *g = dwte + (size_t)r * C + c;
    float acc = *g;
    int j = i;
    for (; j + 8 <= lo; j += 8) { /* the loads first, then the additions in order */
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = dout[(size_t)(keys[j + u] & mask) * C + c];
#pragma unroll
        for (int u = 0; u < 8; u++) acc += v[u];
    }
    for (; j < lo; j++) acc += dout[(size_t)(keys[j] & mask) * C + c];
    *g = acc;
}

__global__ void embed_bwd_wpe_k(float *dwpe, const float *dout, int N, int T, int C) {
    size_t total = (size_t)(N < T ? N : T) * C;
    GRID_STRIDE(i, total) {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (size_t n = t; n < (size_t)N; n += (size_t)T) acc += dout[n * C + c];
        dwpe[i] = acc;
    }
}

static Scratch sc_embed;

static void cu_embed_forward_vp(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                             int T, int C, int v0, int V) {
    if (N <= 0 || C <= 0) return;
    embed_fwd_k<<<grid_for((size_t)N * C, 256), 256>>>(out, tokens, pos, wte, wpe, N, T, C, v0, V);
    LAUNCH_CHECK();
}

/* dst[ids[n] - v0,:] += dout[n,:] for the ids in [v0, v0 + V), each row's
 * in increasing n: the sort above */
static void embed_sorted_add(float *dst, const float *dout, const int *ids, int N, int C, int v0, int V) {
    int pos_bits = bit_length((unsigned long long)N - 1), end_bit = pos_bits + bit_length((unsigned long long)V);
    cub::DoubleBuffer<unsigned long long> keys(NULL, NULL);
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(NULL, temp_bytes, keys, N, 0, end_bit, 0));
    size_t key_bytes = ((size_t)N * sizeof(unsigned long long) + 255) / 256 * 256;
    char *sc = (char *)scratch_get(&sc_embed, 2 * key_bytes + temp_bytes);
    keys = cub::DoubleBuffer<unsigned long long>((unsigned long long *)sc, (unsigned long long *)(sc + key_bytes));
    embed_keys_k<<<grid_for((size_t)N, 256), 256>>>(keys.Current(), ids, N, v0, V, pos_bits);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(sc + 2 * key_bytes, temp_bytes, keys, N, 0, end_bit, 0));
    LAUNCH_CHECK();
    dim3 grid((unsigned)N, (unsigned)((C + EMB_THREADS - 1) / EMB_THREADS));
    embed_bwd_wte_k<<<grid, EMB_THREADS>>>(dst, dout, keys.Current(), N, C, V, pos_bits);
    LAUNCH_CHECK();
}

static void cu_embed_backward_vp(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos, int N,
                              int T, int C, int v0, int V) {
    if (N <= 0 || C <= 0) return;
    /* rows added into: a fresh gradient zeroed (embed_backward's vocabulary
     * is not given: to the end of its fresh region) */
    if (dwpe && T > 0) grad_ready(dwpe, (size_t)T * C * sizeof(float));
    if (dwte && V > 0) {
        if (V == 0x7fffffff) grad_ready_to_end(dwte);
        else grad_ready(dwte, (size_t)V * C * sizeof(float));
    }
    if (dwpe && T > 0) {
        if (pos) {
            embed_sorted_add(dwpe, dout, pos, N, C, 0, T);
        } else {
            embed_bwd_wpe_k<<<grid_for((size_t)(N < T ? N : T) * C, 256), 256>>>(dwpe, dout, N, T, C);
            LAUNCH_CHECK();
        }
    }
    if (dwte && V > 0) embed_sorted_add(dwte, dout, tokens, N, C, v0, V);
}

static void cu_embed_forward(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                          int T, int C) {
    cu_embed_forward_vp(out, tokens, pos, wte, wpe, N, T, C, 0, 0x7fffffff);
}

static void cu_embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos, int N, int T,
                           int C) {
    cu_embed_backward_vp(dwte, dwpe, dout, tokens, pos, N, T, C, 0, 0x7fffffff);
}

// ----------------------------------------------------------------------------
// RoPE (rotate-half) of every q and k head: a block a row, 8 elements a
// thread (rope_row_k) where head_dim is a multiple of 16, else a thread per
// (row, frequency) (rope_k); cos and sin times rope_mscale, as the CPU's
// table holds them

/* one pair (a, c) = (x[i], x[i + half]) rotated by the angle of cos cs and
 * sin sn (times rope_mscale; sn negated for the backward) */
__device__ __forceinline__ void rope_rot(float &a, float &c, float cs, float sn) {
    const float a0 = a;
    a = a0 * cs - c * sn;
    c = c * cs + a0 * sn;
}

/* T: float, or bf16 for the [a] qkv and dqkv under bf16 (rotated in fp32,
 * each element rounded once where it is stored) */
template <typename T_>
__global__ void rope_k(T_ *x, const int *pos, int N, int T, int nh, int nkv, int hd, Rope rope, float dir) {
    int half = hd / 2, S = (nh + 2 * nkv) * hd, nrot = nh + nkv;
    size_t total = (size_t)N * half;
    double m = rope_mscale(&rope);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(idx / half), i = (int)(idx % half);
        /* angles in double: pos * inv_freq reaches thousands of radians */
        double inv_freq = rope_inv_freq(&rope, i, hd);
        double ang = (double)(pos ? pos[n] : n % T) * inv_freq;
        double sd, cd;
        sincos(ang, &sd, &cd);
        float cs = (float)(cd * m), sn = dir * (float)(sd * m);
        T_ *row = x + (size_t)n * S;
        for (int hh = 0; hh < nrot; hh++) {
            T_ *v = row + (size_t)hh * hd;
            float a = act_ld(v, (size_t)i), c = act_ld(v, (size_t)(i + half));
            rope_rot(a, c, cs, sn);
            act_st(v, (size_t)i, a);
            act_st(v, (size_t)(i + half), c);
        }
    }
}

/* The 16-byte form (hd / 2 a multiple of PW_E, x 16-byte aligned): a
 * block a row at a time, its cos and sin computed once into shared memory
 * (as rope_k computes them), then PW_E frequencies of one head a thread;
 * each element the same expression as rope_k's, so the same bits */
template <typename T_>
__global__ void rope_row_k(T_ *x, const int *pos, int N, int T, int nh, int nkv, int hd, Rope rope, float dir) {
    extern __shared__ float rope_cs[]; /* cos [half], then dir * sin [half] */
    const int half = hd / 2, S = (nh + 2 * nkv) * hd, nrot = nh + nkv, HE = half / PW_E;
    const double m = rope_mscale(&rope);
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        __syncthreads(); /* the previous row's readers are done with the table */
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            double ang = (double)(pos ? pos[n] : n % T) * rope_inv_freq(&rope, i, hd);
            double sd, cd;
            sincos(ang, &sd, &cd);
            rope_cs[i] = (float)(cd * m);
            rope_cs[half + i] = dir * (float)(sd * m);
        }
        __syncthreads();
        T_ *row = x + (size_t)n * S;
        for (int it = threadIdx.x; it < nrot * HE; it += blockDim.x) {
            T_ *v = row + (size_t)(it / HE) * hd;
            const int i = (it % HE) * PW_E;
            float a[PW_E], c[PW_E];
            ldn<PW_E>(v + i, a);
            ldn<PW_E>(v + half + i, c);
#pragma unroll
            for (int k = 0; k < PW_E; k++) rope_rot(a[k], c[k], rope_cs[i + k], rope_cs[half + i + k]);
            stn<PW_E>(v + i, a);
            stn<PW_E>(v + half + i, c);
        }
    }
}

/* x16: x is an [a] buffer in bf16 */
static void rope_apply(float *x, int x16, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope,
                       float dir) {
    if (hd % 2 != 0) die(EXIT_INTERNAL, "rope: head_dim %d must be even", hd);
    size_t total = (size_t)B * T * (hd / 2);
    if (!total) return;
    if (hd % (2 * PW_E) == 0 && hd <= 4096 && aligned16(x)) {
        /* a thread per PW_E frequencies of a head, up to 256 a block; as
         * many blocks as the device holds at once (2048 threads an SM), each
         * taking rows in turn */
        const int items = (nh + nkv) * (hd / 2 / PW_E), threads = items >= 256 ? 256 : (items + 31) / 32 * 32;
        const int N = B * T, fill = resident_blocks(threads), blocks = N < fill ? N : fill;
        const size_t smem = (size_t)hd * sizeof(float);
        if (x16) rope_row_k<__nv_bfloat16><<<blocks, threads, smem>>>(ACT16(x), pos, N, T, nh, nkv, hd, *rope, dir);
        else rope_row_k<float><<<blocks, threads, smem>>>(x, pos, N, T, nh, nkv, hd, *rope, dir);
        vec_pointwise_calls++;
    } else if (x16) rope_k<__nv_bfloat16><<<grid_for(total, 256), 256>>>(ACT16(x), pos, B * T, T, nh, nkv, hd, *rope, dir);
    else rope_k<float><<<grid_for(total, 256), 256>>>(x, pos, B * T, T, nh, nkv, hd, *rope, dir);
    LAUNCH_CHECK();
}

/* qkv is [a] */
static void cu_rope_forward(float *qkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope) {
    rope_apply(qkv, act_bf16(), pos, B, T, nh, nkv, hd, rope, 1.0f);
}

/* dqkv is [a] */
static void cu_rope_backward(float *dqkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope) {
    rope_apply(dqkv, act_bf16(), pos, B, T, nh, nkv, hd, rope, -1.0f);
}

// ----------------------------------------------------------------------------
// pointwise

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

template <typename OT, typename IT> __global__ void gelu_fwd_k(OT *out, const IT *inp, size_t n) {
    GRID_STRIDE(i, n) {
        float x = act_ld(inp, i);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        act_st(out, i, x / (1.0f + expf(-2.0f * u)));
    }
}

/* d gelu(x) / dx */
__device__ __forceinline__ float gelu_grad(float x) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float e = expf(-2.0f * u);
    float sg = 1.0f / (1.0f + e);
    float omsg = e * sg;
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return sg + 2.0f * x * sg * omsg * du;
}

__global__ void gelu_bwd_k(float *dinp, const float *inp, const float *dout, size_t n) {
    GRID_STRIDE(i, n) dinp[i] += dout[i] * gelu_grad(inp[i]);
}

/* the unfused DGELU epilogue: d *= gelu'(pre) (both fp32, or both bf16) */
template <typename T> __global__ void dgelu_inplace_k(T *d, const T *pre, size_t n) {
    GRID_STRIDE(i, n) act_st(d, i, act_ld(d, i) * gelu_grad(act_ld(pre, i)));
}

/* silu(g) * u, the SwiGLU of one gate g and up u */
__device__ __forceinline__ float swiglu_val(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* inp (gate | up) and out are [a]: float or bf16 alike */
template <typename T> __global__ void swiglu_fwd_k(T *out, const T *inp, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        act_st(out, i, swiglu_val(act_ld(inp, r * 2 * F + j), act_ld(inp, r * 2 * F + F + j)));
    }
}

template <typename T> __global__ void swiglu_fwd_vec_k(T *out, const T *inp, int N, int F) {
    const int FE = F / PW_E;
    GRID_STRIDE(i, (size_t)N * FE) {
        size_t r = i / FE, j = (i % FE) * PW_E;
        float g[PW_E], u[PW_E];
        ldn<PW_E>(inp + r * 2 * F + j, g);
        ldn<PW_E>(inp + r * 2 * F + F + j, u);
#pragma unroll
        for (int k = 0; k < PW_E; k++) g[k] = swiglu_val(g[k], u[k]);
        stn<PW_E>(out + r * F + j, g);
    }
}

/* SwiGLU's backward for one element: the gradients of gate g and up u
 * for the output gradient d */
__device__ __forceinline__ void swiglu_grads(float g, float u, float d, float *dg, float *du) {
    float e = expf(-g);
    float sg = 1.0f / (1.0f + e);
    *dg = d * u * sg * (1.0f + g * e * sg);
    *du = d * g * sg;
}

/* dinp [N, 2F] gets (d gate | d up) from dout [N, F] (row stride ldo; DT:
 * float or bf16) and the [a] pre-activation inp (IT: float or bf16): added
 * into (ADD, the kernels.h swiglu_backward) or stored, rounded once (the
 * bf16 [a] dpre of matmul_swiglu_backward, from its bf16 dh). dout may be
 * dinp's own gate columns (ldo 2F, fp32 [a]): the thread that reads a
 * d(out) writes its two gradients. */
template <typename T, bool ADD, typename IT, typename DT>
__global__ void swiglu_bwd_k(T *dinp, const IT *inp, const DT *dout, size_t ldo, int N, int F) {
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        float dg, du;
        swiglu_grads(act_ld(inp, r * 2 * F + j), act_ld(inp, r * 2 * F + F + j), act_ld(dout, r * ldo + j), &dg, &du);
        if constexpr (ADD) { /* __fadd_rn: never fused with the gradient's last product, in either form */
            dinp[r * 2 * F + j] = __fadd_rn(dinp[r * 2 * F + j], dg);
            dinp[r * 2 * F + F + j] = __fadd_rn(dinp[r * 2 * F + F + j], du);
        } else {
            act_st(dinp, r * 2 * F + j, dg);
            act_st(dinp, r * 2 * F + F + j, du);
        }
    }
}

template <typename T, bool ADD, typename IT, typename DT>
__global__ void swiglu_bwd_vec_k(T *dinp, const IT *inp, const DT *dout, size_t ldo, int N, int F) {
    const int FE = F / PW_E;
    GRID_STRIDE(i, (size_t)N * FE) {
        size_t r = i / FE, j = (i % FE) * PW_E;
        float g[PW_E], u[PW_E], d[PW_E];
        ldn<PW_E>(inp + r * 2 * F + j, g);
        ldn<PW_E>(inp + r * 2 * F + F + j, u);
        ldn<PW_E>(dout + r * ldo + j, d);
#pragma unroll
        for (int k = 0; k < PW_E; k++) swiglu_grads(g[k], u[k], d[k], &g[k], &u[k]);
        if constexpr (ADD) {
            float a[PW_E], b[PW_E];
            ldn<PW_E>(dinp + r * 2 * F + j, a);
            ldn<PW_E>(dinp + r * 2 * F + F + j, b);
#pragma unroll
            for (int k = 0; k < PW_E; k++) {
                g[k] = __fadd_rn(a[k], g[k]);
                u[k] = __fadd_rn(b[k], u[k]);
            }
        }
        stn<PW_E>(dinp + r * 2 * F + j, g);
        stn<PW_E>(dinp + r * 2 * F + F + j, u);
    }
}

__global__ void add_k(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_k(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}

/* out = gelu(pre); bf16: both bf16 (the unfused GELU_AUX epilogue of a
 * bf16 product) */
static void gelu_into(float *out, const float *pre, size_t n, int bf16) {
    if (!n) return;
    if (bf16) gelu_fwd_k<__nv_bfloat16, __nv_bfloat16><<<grid_for(n, 256), 256>>>(ACT16(out), CACT16(pre), n);
    else gelu_fwd_k<float, float><<<grid_for(n, 256), 256>>>(out, pre, n);
    LAUNCH_CHECK();
}

static void cu_gelu_forward(float *out, const float *inp, size_t n) { gelu_into(out, inp, n, act_bf16()); }

static void cu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (!n || !dinp) return;
    gelu_bwd_k<<<grid_for(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK();
}

static void dgelu_inplace(float *d, const float *pre, size_t n, int bf16) {
    if (!n) return;
    if (bf16) dgelu_inplace_k<__nv_bfloat16><<<grid_for(n, 256), 256>>>(ACT16(d), CACT16(pre), n);
    else dgelu_inplace_k<float><<<grid_for(n, 256), 256>>>(d, pre, n);
    LAUNCH_CHECK();
}

/* whether a [N, 2F] SwiGLU call takes the PW_E-element form */
static int swiglu_vec(int F, const void *a, const void *b, const void *c) {
    const int v = F % PW_E == 0 && aligned16(a) && aligned16(b) && aligned16(c);
    vec_pointwise_calls += v;
    return v;
}

template <typename T, bool ADD, typename IT, typename DT>
static void swiglu_bwd_launch(T *dinp, const IT *inp, const DT *dout, size_t ldo, int N, int F) {
    if (N <= 0 || F <= 0) return;
    if (swiglu_vec(F, dinp, inp, dout))
        swiglu_bwd_vec_k<T, ADD, IT, DT><<<grid_for((size_t)N * (F / PW_E), 256), 256>>>(dinp, inp, dout, ldo, N, F);
    else swiglu_bwd_k<T, ADD, IT, DT><<<grid_for((size_t)N * F, 256), 256>>>(dinp, inp, dout, ldo, N, F);
    LAUNCH_CHECK();
}

/* d [N, 2F] (fp32) holds dh in its gate columns: the gradients in place */
static void swiglu_bwd_inplace(float *d, const float *pre, int N, int F) {
    swiglu_bwd_launch<float, false, float, float>(d, pre, d, 2 * (size_t)F, N, F);
}

/* dh [N, F] is bf16 (the input-gradient GEMM's output, rounded once) */
static void swiglu_bwd_act(float *dpre, const float *dh, const float *pre, int N, int F) {
    swiglu_bwd_launch<__nv_bfloat16, false, __nv_bfloat16, __nv_bfloat16>(ACT16(dpre), CACT16(pre), CACT16(dh),
                                                                          (size_t)F, N, F);
}

template <typename T> static void swiglu_fwd_launch(T *out, const T *inp, int N, int F) {
    if (swiglu_vec(F, out, inp, inp)) swiglu_fwd_vec_k<T><<<grid_for((size_t)N * (F / PW_E), 256), 256>>>(out, inp, N, F);
    else swiglu_fwd_k<T><<<grid_for((size_t)N * F, 256), 256>>>(out, inp, N, F);
    LAUNCH_CHECK();
}

static void cu_swiglu_forward(float *out, const float *inp, int N, int F) {
    if (N <= 0 || F <= 0) return;
    if (act_bf16()) swiglu_fwd_launch(ACT16(out), CACT16(inp), N, F);
    else swiglu_fwd_launch(out, inp, N, F);
}

static void cu_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
    if (!dinp) return;
    if (act_bf16()) swiglu_bwd_launch<float, true, __nv_bfloat16, float>(dinp, CACT16(inp), dout, (size_t)F, N, F);
    else swiglu_bwd_launch<float, true, float, float>(dinp, inp, dout, (size_t)F, N, F);
}

static void cu_add(float *out, const float *a, const float *b, size_t n) {
    if (!n) return;
    /* a fresh gradient read (model.c's sequence-parallel norm weights) */
    grad_ready(a, n * sizeof(float));
    grad_ready(b, n * sizeof(float));
    if (out != a && out != b) grad_ready(out, n * sizeof(float));
    add_k<<<grid_for(n, 256), 256>>>(out, a, b, n);
    LAUNCH_CHECK();
}

static void cu_scale(float *x, float s, size_t n) {
    if (!n) return;
    scale_k<<<grid_for(n, 256), 256>>>(x, s, n);
    LAUNCH_CHECK();
}

/* bf16 precision in fp32 words: the same bits as the CPU backend (kernels.h) */
__global__ void round_bf16_k(float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    GRID_STRIDE(i, n) dst[i] = __uint_as_float(round_bf16_word(__float_as_uint(src[i]), seed, index0 + i));
}

static void cu_round_bf16(float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    if (!n) return;
    round_bf16_k<<<grid_for(n, 256), 256>>>(dst, src, n, seed, index0);
    LAUNCH_CHECK();
}

/* VEC: PW_E words a thread (16 bytes of bf16 stored at once) up to the last
 * whole group, both pointers 16-byte aligned, as convert_k */
template <bool VEC>
__global__ void pack_bf16_k(uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    size_t done = 0;
    if constexpr (VEC) {
        done = n / PW_E * PW_E;
        GRID_STRIDE(g, n / PW_E) {
            float v[PW_E];
            uint32_t w[PW_E / 2];
            static_assert(PW_E == 8, "pack_bf16_k stores one uint4");
            ldn<PW_E>(src + g * PW_E, v);
#pragma unroll
            for (int k = 0; k < PW_E; k += 2)
                w[k / 2] = round_bf16_word(__float_as_uint(v[k]), seed, index0 + g * PW_E + k) >> 16 |
                           (round_bf16_word(__float_as_uint(v[k + 1]), seed, index0 + g * PW_E + k + 1) & 0xffff0000u);
            *(uint4 *)(void *)(dst + g * PW_E) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
    GRID_STRIDE(i, n - done)
        dst[done + i] = (uint16_t)(round_bf16_word(__float_as_uint(src[done + i]), seed, index0 + done + i) >> 16);
}

static void cu_pack_bf16(uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
    if (!n) return;
    if (aligned16(dst) && aligned16(src)) {
        pack_bf16_k<true><<<grid_for(n / PW_E + 1, 256), 256>>>(dst, src, n, seed, index0);
        vec_convert_calls++;
    } else pack_bf16_k<false><<<grid_for(n, 256), 256>>>(dst, src, n, seed, index0);
    LAUNCH_CHECK();
}

/* In place, elements [lo, n) in one block, tile by ascending tile: every
 * thread reads its word before the barrier and writes after it (a tile's
 * writes land on words <= its own, already read: kernels_cpu.c). */
__global__ void unpack_bf16_tail_k(float *dst, const uint16_t *src, size_t lo, size_t n) {
    for (size_t i0 = lo; i0 < n; i0 += blockDim.x) {
        size_t i = i0 + threadIdx.x;
        uint16_t w = i < n ? src[i] : 0;
        __syncthreads();
        if (i < n) dst[i] = __uint_as_float((uint32_t)w << 16);
        __syncthreads();
    }
}

/* to_f32 (bf16 -> fp32 is exact). In place (src == (uint16_t *)dst + n):
 * halves of what is left, each a to_f32 whose writes miss every word not
 * yet read, then the tail in one block (the CPU backend's order). */
static void cu_unpack_bf16(float *dst, const uint16_t *src, size_t n) {
    if (src != (const uint16_t *)(void *)dst + n) {
        to_f32(dst, src, n);
        return;
    }
    size_t lo = 0;
    while (n - lo > 65536) {
        size_t h = (n - lo) / 2;
        to_f32(dst + lo, src + lo, h);
        lo += h;
    }
    if (lo == n) return;
    unpack_bf16_tail_k<<<1, 1024>>>(dst, src, lo, n);
    LAUNCH_CHECK();
}
