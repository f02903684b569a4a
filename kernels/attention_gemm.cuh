/* kernels/attention_gemm.cuh — attention through strided-batched GEMMs and hand-written causal softmax kernels (any head dim; train.attention_kernel gemm).
 * Part of kernels.cu, the CUDA backend's one compile unit: included there
 * in order, after the files before it in its list; not a header of its own. */

// ----------------------------------------------------------------------------
// attention: batched GEMMs + causal softmax kernels, probabilities in scratch

/* The (b, h) pairs are covered by nh "passes", one per query head h, each a
 * strided-batched GEMM over the B sequences: GQA (h reads kv head h/group)
 * rules out one stride over all heads, and batching over b keeps every
 * batch entry's output in its own non-overlapping block. A pass's scores /
 * probabilities are a [B, T, T] scratch block (never saved: the forward
 * keeps each row's log-sum-exp, the backward recomputes P = exp(s - lse)),
 * so attention memory is O(T) per head. Offsets and strides are in floats. */
typedef struct {
    size_t q, k, v, o; /* base offsets of q/k/v (in qkv) and of out */
    long long sqkv, so, sp;
    int count;
} AttPass;

static AttPass att_pass(int h, int B, int T, int nh, int nkv, int hd) {
    int group = nh / nkv, kh = h / group, S = (nh + 2 * nkv) * hd, OS = nh * hd;
    AttPass a;
    a.q = (size_t)h * hd;
    a.k = (size_t)(nh + kh) * hd;
    a.v = (size_t)(nh + nkv + kh) * hd;
    a.o = (size_t)h * hd;
    a.sqkv = (long long)T * S;
    a.so = (long long)T * OS;
    a.sp = (long long)T * T;
    a.count = B;
    return a;
}

/* The first key query q of a sequence may attend to: qs[q] (qs its row of
 * a block-causal mask's qstart, its document's first token), or 0 without
 * one (qs NULL); rows past T, which are never stored, take 0 */
__device__ __forceinline__ int att_start(const int *qs, int q, int T) { return qs && q < T ? qs[q] : 0; }

/* one block per row of a pass's scores ([B*T] rows of T): softmax over
 * [s, t] (s = att_start), zero elsewhere; the scores arrive scaled.
 * lse[(e*nh + h)*T + t] gets the row's log-sum-exp. */
__global__ void causal_softmax_lse_k(float *p, float *lse, const int *qstart, int T, int nh, int h) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T), s0 = att_start(qstart ? qstart + e * T : NULL, t, T);
    float *x = p + row * T;
    float m = -INFINITY;
    for (int j = s0 + (int)threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m);
    float s = 0.0f;
    for (int j = s0 + (int)threadIdx.x; j <= t; j += blockDim.x) s += expf(x[j] - m);
    s = block_sum(s);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < T; j += blockDim.x) x[j] = j >= s0 && j <= t ? expf(x[j] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[(e * nh + h) * T + t] = m + logf(s);
}

/* the backward's probabilities again: scaled scores -> exp(s - lse) on
 * [s, t], zero elsewhere */
__global__ void causal_exp_lse_k(float *p, const float *lse, const int *qstart, int T, int nh, int h) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T), s0 = att_start(qstart ? qstart + e * T : NULL, t, T);
    float *x = p + row * T;
    float l = lse[(e * nh + h) * T + t];
    for (int j = threadIdx.x; j < T; j += blockDim.x) x[j] = j >= s0 && j <= t ? expf(x[j] - l) : 0.0f;
}

/* dP -> dS in place for one pass: dS = P * (dP - D) * scale with D the row's
 * dO . O (= sum P * dP); row r belongs to batch entry e = r / T, whose out
 * and dout rows start at e*so + t*OS + o. P is zero outside [s, t], so dS is. */
__global__ void causal_softmax_bwd_k(float *ds, const float *p, const float *out, const float *dout, long long so,
                                     int OS, size_t o, int hd, int T, float scale) {
    size_t row = blockIdx.x, e = row / T;
    int t = (int)(row % T);
    float *d = ds + row * T;
    const float *pr = p + row * T;
    size_t orow = e * (size_t)so + (size_t)t * OS + o;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dot += out[orow + i] * dout[orow + i];
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < T; j += blockDim.x) d[j] = j <= t ? pr[j] * (d[j] - dot) * scale : 0.0f;
}

static int row_threads(int T) {
    int th = 32;
    while (th < T && th < 256) th <<= 1;
    return th;
}

static void check_heads(int nh, int nkv) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0)
        die(EXIT_INTERNAL, "attention: n_head %d is not a multiple of n_kv_head %d", nh, nkv);
}
