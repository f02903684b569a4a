/* kernels.h — the compute interface every backend implements.
 *
 * model.c calls only these functions (through a Kernels table), so a new
 * backend (kernels.cu) plugs in without touching the model. Pointers are
 * backend memory (host for CPU, device for CUDA). Shapes are row-major.
 *
 * Conventions, the same for every kernel:
 *   - N = number of token rows (B*T), C = channels, OC = output channels.
 *   - Linear weights are stored [OC, C] (out, in), as torch.nn.Linear.
 *   - Forward kernels OVERWRITE their outputs.
 *   - Backward kernels ADD into every gradient output (dinp, dweight, dbias):
 *     callers zero a buffer that must start empty (a gradient buffer:
 *     grads_fresh, then grads_settle before it is read). This is what makes
 *     gradient accumulation across micro-batches and the residual stream free.
 *     The exceptions are the in-place kernels, marked "in place", and the
 *     input gradients of the matrix products and of attention
 *     (the matmul_backward family's dinp, attention_backward's dqkv,
 *     marked OVERWRITTEN): every caller wanted them alone, and an
 *     added-into one cost a zeroing pass and a read of it.
 *   - Any gradient output may be NULL, meaning "not needed".
 */
#ifndef LLMTRAIN_KERNELS_H
#define LLMTRAIN_KERNELS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* One range of the flat parameter arrays for adamw_multi: elements
 * [offset, offset + n), weight decay wd (0 for ranges not decayed); norm:
 * its updated weights count in adamw_multi's sum of squares. */
typedef struct AdamWRange {
    size_t offset, n;
    float wd;
    int norm;
} AdamWRange;

/* A cross-entropy target that asks for no loss (PyTorch's ignore_index):
 * the prediction after an end-of-document token under train.eod_mask_loss. */
#define CE_NO_TARGET (-1)

/* RoPE's frequencies: inv_freq[i] = theta^(-2i/hd) for i < hd/2; under
 * scaling ROPE_LINEAR each divided by factor (position interpolation:
 * Hugging Face's rope_type "linear", Megatron's
 * --rotary-seq-len-interpolation-factor); under ROPE_LLAMA3 Llama 3.1's
 * rescaling of them (Hugging Face's
 * rope_type "llama3"): with wavelength w = 2 pi / inv_freq and the
 * wavelengths L = original_max_seq_len / low_freq_factor and
 * H = original_max_seq_len / high_freq_factor, a frequency with w < H (a
 * short wavelength) is kept, one with w > L is divided by factor, and
 * between them s = (original_max_seq_len / w - low_freq_factor) /
 * (high_freq_factor - low_freq_factor) blends the two:
 * (1 - s) inv_freq / factor + s inv_freq.
 * Under ROPE_YARN, YaRN's (Peng et al. 2023; Hugging Face's rope_type
 * "yarn"): with d(r) = hd ln(original_max_seq_len / (2 pi r)) / (2 ln theta),
 * the index at which a frequency turns r times over the original context,
 * lo = d(beta_fast) and hi = d(beta_slow) (rounded down and up unless
 * !truncate, then clamped to [0, hd - 1]; hi = lo + 0.001 where they meet),
 * and the ramp s = clamp((i - lo) / (hi - lo), 0, 1): inv_freq / factor s +
 * inv_freq (1 - s), so the fast frequencies (i <= lo) are kept and the slow
 * ones (i >= hi) divided by factor. YaRN also scales cos and sin by
 * rope_mscale: attention_factor, or where that is 0 its default
 * 0.1 ln(factor) + 1 (which scales the attention logits by its square). */
enum { ROPE_NONE = 0, ROPE_LLAMA3 = 1, ROPE_LINEAR = 2, ROPE_YARN = 3 }; /* model.rope_scaling's none|llama3|linear|yarn */
typedef struct Rope {
    float theta;
    int scaling; /* ROPE_NONE | ROPE_LLAMA3 | ROPE_LINEAR | ROPE_YARN */
    float factor, low_freq_factor, high_freq_factor;
    int original_max_seq_len;
    float beta_fast, beta_slow, attention_factor; /* ROPE_YARN's */
    int truncate;                                 /* ROPE_YARN's: round lo down and hi up */
} Rope;

/* The one definition of the frequencies, for both backends (in double: an
 * angle pos * inv_freq reaches thousands of radians). */
#ifdef __CUDACC__
#define ROPE_HOST_DEVICE __host__ __device__
#else
#define ROPE_HOST_DEVICE
#endif
static inline ROPE_HOST_DEVICE double rope_inv_freq(const Rope *r, int i, int hd) {
    double f = pow((double)r->theta, -2.0 * i / hd);
    if (r->scaling == ROPE_LINEAR) return f / r->factor;
    if (r->scaling == ROPE_YARN) {
        double orig = (double)r->original_max_seq_len, two_ln_theta = 2.0 * log((double)r->theta);
        double lo = hd * log(orig / (6.283185307179586 * r->beta_fast)) / two_ln_theta;
        double hi = hd * log(orig / (6.283185307179586 * r->beta_slow)) / two_ln_theta;
        if (r->truncate) lo = floor(lo), hi = ceil(hi);
        lo = lo > 0 ? lo : 0;
        hi = hi < hd - 1 ? hi : hd - 1;
        if (lo == hi) hi += 0.001;
        double s = (i - lo) / (hi - lo);
        s = s < 0 ? 0 : s > 1 ? 1 : s;
        return f / r->factor * s + f * (1.0 - s);
    }
    if (r->scaling != ROPE_LLAMA3) return f;
    double w = 6.283185307179586 / f, orig = (double)r->original_max_seq_len;
    if (w < orig / r->high_freq_factor) return f;
    if (w > orig / r->low_freq_factor) return f / r->factor;
    double s = (orig / w - r->low_freq_factor) / ((double)r->high_freq_factor - r->low_freq_factor);
    return (1.0 - s) * f / r->factor + s * f;
}

/* The factor on cos and sin: YaRN's attention factor (1 otherwise). */
static inline ROPE_HOST_DEVICE double rope_mscale(const Rope *r) {
    if (r->scaling != ROPE_YARN) return 1.0;
    if (r->attention_factor > 0) return r->attention_factor;
    return r->factor <= 1 ? 1.0 : 0.1 * log((double)r->factor) + 1.0;
}

/* What a backend's FP8 products need room for (Kernels.fp8_setup), in
 * floats: the largest activation or output-gradient operand of a layer's
 * linear products (rows x width) and the largest weight; the weights of
 * those products together and how many there are; the largest dimension
 * of any of their operands. */
/* Kernels.fp8_scope's on under tensor parallelism: which linear follows */
enum { FP8_COLUMN = 2, FP8_ROW = 3 };
typedef struct Fp8Sizes {
    size_t act_floats, weight_max, weight_floats;
    int n_weights, max_dim;
} Fp8Sizes;

typedef struct Kernels {
    const char *name; /* "cpu", "cuda" */
    /* Bytes per element of the [a] buffers: the activations that only
     * matrix products (and attention's backward) read: the norms' outputs,
     * attention's output, the MLP activation's output, SwiGLU's input (the
     * up-projection's output, which only SwiGLU's forward and backward
     * read); the LM head's logits, with the probabilities or gradients the
     * cross-entropy leaves in them (which only the LM head's backward
     * reads); attention's input qkv (the qkv projection's output, which only
     * RoPE and attention read), its output's gradient and its input's
     * gradient d(qkv). 4 (fp32) on the CPU
     * and on CUDA under compute dtype tf32 or fp32; 2 (bf16, rounded to
     * nearest even) on CUDA under bf16 (the default; see
     * kernels_cuda_set_compute_dtype), so that its bf16 GEMMs read them with
     * no conversion pass and they take half the memory. They are still
     * passed as float *: the caller never reads their elements, and sizes
     * and offsets them by act_bytes. Arguments marked [a] below. */
    int act_bytes;

    /* ---- memory (never called inside the step loop except zero/copy) ---- */
    void *(*alloc)(size_t bytes);           /* zero-filled */
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); /* within backend memory */
    void (*to_host)(void *host_dst, const void *src, size_t bytes);
    void (*from_host)(void *dst, const void *host_src, size_t bytes);

    /* ---- embeddings ----
     * out[n,:] = wte[tokens[n],:] + (wpe ? wpe[p(n),:] : 0), where row n's
     * position p(n) is pos[n] (0 <= pos[n] < T; an int array in the
     * backend's memory: train.reset_position_ids) or, pos NULL, n % T */
    void (*embed_forward)(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                          int N, int T, int C);
    /* dwte[tokens[n],:] += dout[n,:]; dwpe[p(n),:] += dout[n,:] (dwpe may be
     * NULL); each gradient row adds its rows of dout in increasing n */
    void (*embed_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos,
                           int N, int T, int C);

    /* Vocab-parallel (tensor parallel) forms: wte holds only vocabulary rows
     * [v0, v0 + V); a token outside contributes zero (wpe is still added when
     * given), backward adds only rows in range. The caller sums over ranks. */
    void (*embed_forward_vp)(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                             int N, int T, int C, int v0, int V);
    void (*embed_backward_vp)(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos,
                              int N, int T, int C, int v0, int V);

    /* ---- norms (statistics in fp32; mean/rstd saved for backward, [N]);
     * the forwards' out is [a]. The backwards' dinp_a (NULL: none; not
     * without dinp) receives dinp's final values (after the add) as [a]:
     * the residual stream's gradient, which the next output projection's
     * backward reads as its dout_a (below), so that it is not converted
     * again there; CUDA writes it from the same registers under bf16. ---- */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_backward)(float *dinp, float *dinp_a, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
    /* out = inp * rsqrt(mean(inp^2) + eps) * w */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w,
                            int N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dinp_a, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C);
    /* The residual add fused with the norm after it: res = a + b (res may
     * alias a), then out = layernorm / rmsnorm of res exactly as the
     * kernels above (one pass over the rows instead of two). */
    void (*add_layernorm_forward)(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                  const float *w, const float *bias, int N, int C, float eps);
    void (*add_rmsnorm_forward)(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                int N, int C, float eps);

    /* ---- matrix products (inp is [a] in every one of them) ----
     * out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias[OC] when bias != NULL)   */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC);
    /* dinp[N,C] = dout @ w (OVERWRITTEN); dw[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);
    /* out[N,OC] = res + inp @ w^T (+ bias): matmul_forward with the
     * residual add after it in the same call (res and out fp32; out must not
     * overlap res). The layers' output projections write the residual
     * stream with it; CUDA runs it as one GEMM reading res as its C input
     * (beta 1), so the product is never stored and read back on its own.
     * The CPU computes the product, then res + product: the bits of
     * matmul_forward then add. */
    void (*matmul_forward_res)(float *out, const float *res, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC);
    /* matmul_forward and matmul_backward (dinp OVERWRITTEN) with out (the
     * forward's) and dout (the backward's) [a] as well: on
     * CUDA under bf16 the GEMM writes bf16 and the backward's two GEMMs read
     * the bf16 dout as it is, with no conversion pass. The LM head's (the
     * logits, and the gradients the cross-entropy leaves in them: the
     * largest activation of a step is never held, read or converted in
     * fp32), the SwiGLU MLP's up-projection (its out is swiglu_forward's
     * inp, its backward's dout matmul_swiglu_backward's dpre, both [a]),
     * the backward of GPT-2's up-projection (its dout is
     * matmul_gelu_backward's dpre, [a]) and the qkv projection (its out is
     * attention's qkv, its dout attention_backward's dqkv, both [a]). The
     * forward's bias, when given, is added before the one rounding (under
     * bf16 CUDA adds a bf16 copy of it); the backward's dbias, when given,
     * sums that dout. */
    void (*matmul_forward_a)(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                             int OC);
    void (*matmul_backward_a)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                              const float *w, int N, int C, int OC);
    /* matmul_backward with dinp (OVERWRITTEN) [a]: the attention output
     * projection's, whose input gradient is attention_backward's dout, [a]
     * (under bf16 the GEMM rounds it to bf16 once where it is stored, and
     * attention reads it with no conversion pass).
     * dout_a here and in the two below (NULL: none): dout's values as [a],
     * exactly (a norm backward's dinp_a); the products read it instead of
     * converting dout (CUDA under bf16; the CPU reads dout), and a bias
     * gradient still sums the fp32 dout. */
    void (*matmul_backward_dinp_a)(float *dinp, float *dw, float *dbias, const float *dout, const float *dout_a,
                                   const float *inp, const float *w, int N, int C, int OC);

    /* ---- attention ----
     * qkv is [B, T, (nh + 2*nkv) * hd]: per token all q heads, then all k
     * heads, then all v heads. Query head h uses kv head h / (nh / nkv) (GQA).
     * Causal softmax(q k^T / sqrt(hd)) v. out is [B, T, nh*hd].
     * lse [B, nh, T] saves each query row's log-sum-exp of its scaled
     * scores (natural log), so the probabilities never need to be stored:
     * the backward recomputes them as exp(q.k / sqrt(hd) - lse) (flash
     * attention's form; O(T) memory per head instead of O(T^2)).
     * qkv and out are [a] (forward and backward).
     * qstart, when not NULL, masks by document (train.attention_mask
     * block_causal): qstart[b*T + t] is the first position of row b that
     * query t may attend to (its document's first token), so it attends to
     * [qstart, t]; it is non-decreasing along a row and at most t. NULL: 0
     * for every query (plain causal). An int array in the backend's memory. */
    void (*attention_forward)(float *out, float *lse, const float *qkv, const int *qstart,
                              int B, int T, int nh, int nkv, int hd);
    /* dqkv = d(out)/d(qkv) . dout (OVERWRITTEN), from the forward's out and
     * lse, under the forward's qstart; dout and dqkv are [a] (dout as the output projection's
     * matmul_backward_dinp_a stores it; under bf16 each gradient in dqkv
     * rounded once where it is stored; rope_backward and the qkv
     * projection's matmul_backward_a read it as it is) */
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd);
    /* Rotary embedding, Hugging Face rotate-half convention, on the q and k
     * heads of qkv ([B,T,(nh+2nkv)*hd]), in place; row n's position p is
     * pos[n] (pos >= 0; an int array in the backend's memory:
     * train.reset_position_ids) or, pos NULL, n % T; its angles are p x
     * rope_inv_freq(rope, i, hd), i < hd/2, and its cos and sin are
     * scaled by rope_mscale(rope) (1 but under YaRN). qkv is [a] (rotated
     * in fp32, each element rounded once where it is stored).
     * rope_backward applies the transpose (the inverse rotation, times
     * rope_mscale) to dqkv ([a]), in place. */
    void (*rope_forward)(float *qkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope);
    void (*rope_backward)(float *dqkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope);

    /* ---- pointwise ---- */
    /* GELU, tanh approximation (GPT-2's gelu_new); gelu_forward's inp and
     * out are [a] (GPT-2's MLP activation, which selective checkpointing's
     * mlp_act recomputes from the kept pre-activation), gelu_backward's fp32 */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    /* GPT-2's MLP up-projection and its GELU in one call (inp, pre and
     * out [a]): pre[N,OC] = inp @ w^T (+ bias) (kept for the backward),
     * out[N,OC] = gelu(pre), each rounded once where it is stored (under
     * bf16 CUDA adds a bf16 copy of the bias). Equal to matmul_forward then
     * gelu_forward (on the CPU that is what it runs, bit for bit); CUDA
     * fuses the GELU into the GEMM's epilogue when it can. */
    void (*matmul_gelu_forward)(float *out, float *pre, const float *inp, const float *w, const float *bias,
                                int N, int C, int OC);
    /* inp is [N, 2F]: gate in columns [0,F), up in [F,2F).
     * out[N,F] = silu(gate) * up; inp and out are [a] (swiglu_backward's
     * inp too; its dinp is fp32, added into) */
    void (*swiglu_forward)(float *out, const float *inp, int N, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int N, int F);
    /* The MLP down-projection's backward and its activation's in one call,
     * for out = act(pre) @ w^T (+ bias) with inp = act(pre) [N, C], w [OC, C]:
     * dpre = act'(pre) . (dout @ w), OVERWRITTEN (an exception to add-into:
     * the caller zeroes nothing); dw += dout^T @ inp, dbias += sum_n dout.
     *   gelu:   pre, dpre [N, C], both [a] (the up-projection's
     *           matmul_backward_a reads dpre);
     *   swiglu: pre, dpre [N, 2C] (gate | up, as swiglu_forward's inp);
     *           both [a] (the up-projection's matmul_backward_a reads dpre).
     * Equal to matmul_backward into a zeroed buffer, then gelu_backward /
     * swiglu_backward into a zeroed dpre (on the CPU bit for bit); CUDA runs
     * the GELU's as the GEMM's epilogue when it can, and the SwiGLU's on
     * the GEMM's output (fp32: in place, written into dpre's gate columns;
     * under bf16 from the GEMM's bf16 dh, so dpre differs from the CPU's by
     * that rounding too). */
    void (*matmul_gelu_backward)(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
                                 const float *inp, const float *w, const float *pre, int N, int C, int OC);
    void (*matmul_swiglu_backward)(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
                                   const float *inp, const float *w, const float *pre, int N, int C, int OC);
    /* out = a + b (out may alias a) */
    void (*add)(float *out, const float *a, const float *b, size_t n);

    /* ---- loss (logits are [a] in every one of them; the arithmetic is
     * fp32, each value rounded once where it is stored) ----
     * logits [N, V] are replaced by softmax probabilities (in place);
     * losses[n] = -log p[n, targets[n]]. A row whose target is
     * CE_NO_TARGET (a masked prediction: train.eod_mask_loss) has loss 0
     * and a zero gradient row; it still gets its probabilities.          */
    void (*crossentropy_forward)(float *losses, float *logits, const int *targets, int N, int V);
    /* probs [N,V] -> dlogits = (probs - onehot(target)) * dloss, in place */
    void (*crossentropy_backward)(float *probs, const int *targets, float dloss, int N, int V);
    /* crossentropy_forward then crossentropy_backward in one call (one pass
     * fewer over the logits): losses as the forward's, logits replaced by
     * (softmax - onehot(target)) * dloss in place; the same bits as the two
     * calls on the same backend (with bf16 [a], the probability is rounded
     * to bf16 before the subtraction, as the two calls store it). */
    void (*crossentropy_fused)(float *losses, float *logits, const int *targets, float dloss, int N, int V);

    /* Vocab-parallel cross-entropy over local logits [N, V] holding the
     * vocabulary columns [v0, v0 + V); the caller reduces over ranks between
     * the steps: rowmax = max over the row (then all-reduce MAX);
     * expsum: logits = exp(logits - rowmax) in place, sums[n] = row sum and
     * tgt[n] = the target's logit when this rank owns it, else 0 (then
     * all-reduce SUM of both); finish: logits /= sums (probabilities, in
     * place) and losses[n] = log(sums) + rowmax - tgt (0 for CE_NO_TARGET);
     * backward: probs -> (probs - onehot_local) * dloss, in place. */
    void (*crossentropy_vp_max)(float *rowmax, const float *logits, int N, int V);
    void (*crossentropy_vp_expsum)(float *sums, float *tgt, float *logits, const float *rowmax,
                                   const int *targets, int N, int V, int v0);
    void (*crossentropy_vp_finish)(float *losses, float *logits, const float *rowmax, const float *sums,
                                   const float *tgt, const int *targets, int N, int V);
    void (*crossentropy_vp_backward)(float *probs, const int *targets, float dloss, int N, int V, int v0);

    /* ---- optimizer and reductions over flat parameter ranges ---- */
    /* sum of squares, accumulated in double */
    double (*sumsq)(const float *x, size_t n);
    /* The same sum of squares beside the compute: sumsq_queue(x, n, dst)
     * queues sumsq(x, n) (the same bits) to start after every kernel queued
     * so far and run beside later ones (a second stream of low priority on
     * CUDA: the gradient norm's passes overlap the backward of the layers
     * below; at once on the CPU), its result in backend memory dst (one
     * double, from alloc); x must stay as it is until the next sumsq_take.
     * sumsq_take(host, dst, n): waits for every queued sum and copies the n
     * doubles at dst to host. */
    void (*sumsq_queue)(const float *x, size_t n, double *dst);
    void (*sumsq_take)(double *host, const double *dst, int n);
    /* sum (double) */
    double (*sum)(const float *x, size_t n);
    void (*scale)(float *x, float s, size_t n);
    /* torch.optim.AdamW for one range. step t is 1-based; wd already 0 for
     * ranges that are not decayed. grad_scale multiplies g first (clipping). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, int t, float grad_scale);
    /* The same update over several ranges of the same flat arrays (p, g, m, v
     * are the array bases) in one call: one launch on CUDA, a loop of adamw
     * on the CPU. Results equal calling adamw per range. sumsq != NULL:
     * *sumsq = the sum of squares (double) of the updated p over the ranges
     * with norm set, taken in the same pass (log.param_norm without a
     * second read of the weights), the same bits every run. Returns 1 when
     * the backend's copies derived from p (weights_stable) were updated in
     * the same pass and still hold (a caller may skip declaring the weights
     * again: Model.same_weights); 0 when they are stale, as after any write.
     * CUDA under bf16 GEMMs returns 1 when p is the start of a declared
     * range whose weights the products have copied: it writes the bf16
     * copy of every updated weight beside it. */
    int (*adamw_multi)(float *p, const float *g, float *m, float *v, const AdamWRange *ranges, int n_ranges,
                       float lr, float beta1, float beta2, float eps, int t, float grad_scale, double *sumsq);
    /* dst = src rounded to bfloat16 precision (8-bit mantissa; the low 16 bits
     * of each fp32 word cleared; dst == src allowed). seed 0: to nearest, ties
     * to even. seed != 0: stochastically, up with probability (dropped bits)
     * / 2^16, from 16 random bits that are a fixed function of (seed, index0 +
     * i), the same on every backend (round_bf16_word below). NaN stays NaN,
     * infinities stay. */
    void (*round_bf16)(float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0);
    /* The same rounding stored as bf16 words: dst[i] is the high half of
     * round_bf16's result for src[i] (the sharded working weights that the
     * FSDP all-gathers send under train.param_dtype bf16). unpack_bf16:
     * dst[i] = the fp32 value of bf16 word src[i], exactly (its low 16 bits
     * zero). So unpack(pack(x)) is round_bf16(x), bit for bit. In place
     * too: src == (uint16_t *)dst + n, the n words in the upper half of
     * dst's 4n bytes (where a gather lands in the buffer it is widened in). */
    void (*pack_bf16)(uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0);
    void (*unpack_bf16)(float *dst, const uint16_t *src, size_t n);

    /* ---- weights that stay put ----
     * weights_stable(p, n): the n floats at p were just written (any copy a
     * backend derived from them is stale) and stay as they are until the next
     * call whose range overlaps theirs, or change only through an
     * adamw_multi that returns 1 (it updated the copies with them);
     * weights_stable(NULL, 0) ends every range. While a range holds, a
     * backend may keep derived copies of the w operands of the matrix
     * products (matmul_*) inside it:
     * CUDA under bf16 GEMMs keeps their bf16 conversion, made by the first
     * product that reads them instead of by each (the backward's, the
     * recompute's). Freeing the memory drops its copies. The CPU keeps none. */
    void (*weights_stable)(const float *p, size_t n);

    /* ---- FP8 linears (train.compute_dtype fp8; docs/fp8.md) ----
     * Both NULL in a backend without FP8 products (model_build then exits
     * 2). fp8_setup(recipe, sizes): from model_build, once, before any
     * product: recipe FP8_TENSORWISE, FP8_BLOCKWISE or FP8_ROWWISE (fp8.h),
     * or -1: FP8 off and what it held freed; the backend allocates what the
     * products need here, never in the step. fp8_scope(on): the matrix
     * products (matmul_*) called from now to the next fp8_scope are a
     * transformer layer's linears (on 1), whose operands are quantized
     * with the recipe's scales, dequantized, then multiplied as ever:
     * activations and weights E4M3, output gradients (dout) E5M2, each
     * grouped along the product's contraction dimension (fp8.h); a weight's
     * copy is made once while weights_stable's range holds it (once a step
     * unsharded). Or not (0; the default): every other product (the LM
     * head) in the backend's precision. A bias gradient sums the
     * unquantized dout. Under tensor parallelism on is FP8_COLUMN or
     * FP8_ROW: the next products are a column-parallel linear's (the
     * weight's rows and dout's columns split over the TP group; the input
     * whole) or a row-parallel one's (the weight's and the input's columns
     * split; dout whole). fp8_tp(reduce, ctx) (NULL: the backend's FP8
     * runs no tensor parallelism; model_fp8 exits 2): from model_fp8 under
     * tp > 1; every scale group that spans the split takes its amax over
     * the group: reduce(ctx, amax, n) all-reduces n amaxes (a NaN given as
     * +inf) with max over the TP group before the scales are computed, so
     * the quantized values are the 1-rank run's. fp8_cp(reduce, ctx) (NULL:
     * no context parallelism; model_fp8 exits 2): likewise from model_fp8
     * under cp > 1 for the context group, which splits the tokens (the
     * rows) of every activation and output gradient: each group of theirs
     * that spans the tokens (tensorwise; rowwise contracting over them, the
     * weight gradient's) takes its max over the context group, after the
     * TP group's where both split it (max of maxes: the tp x cp max).
     * Blockwise 1 x 128 blocks along the tokens are each rank's own
     * (model_fp8 makes the chunks whole blocks). reduce may do nothing
     * (the model runs alone: sampling); it is called on every rank of the
     * group in the same order. */
    void (*fp8_setup)(int recipe, const struct Fp8Sizes *sizes);
    void (*fp8_scope)(int on);
    void (*fp8_tp)(void (*reduce)(void *ctx, float *amax, size_t n), void *ctx);
    void (*fp8_cp)(void (*reduce)(void *ctx, float *amax, size_t n), void *ctx);

    /* ---- gradients that start at zero without a zeroing pass ----
     * grads_fresh(g, n): the n floats at g are gradient memory that is to
     * start the backward at zero (in place of zero()); what it holds no
     * longer matters. A backend may leave it as it is and have the first
     * backward kernel that adds into a whole tensor there store instead
     * (CUDA: the weight-gradient GEMM with beta 0, the column sums of the
     * biases and norm weights), zeroing only what a kernel must add into
     * (an embedding's scattered rows). grads_settle(g, n): the range is
     * read next (a reduction, the gradient norm, AdamW): whatever of it no
     * kernel has written since becomes zero. In between, only the backward
     * kernels' gradient outputs (dw, dbias, the norms' and the embeddings')
     * and add() may touch it. The CPU zeroes at grads_fresh and its
     * grads_settle does nothing. Freeing the memory ends its state. */
    void (*grads_fresh)(float *g, size_t n);
    void (*grads_settle)(float *g, size_t n);

    /* ---- activation offload (train.activation_offload) ----
     * host_alloc: zero-filled host memory for the copies (page-locked on
     * CUDA, so they run asynchronously). offload_copy queues a copy of bytes
     * between host memory and backend memory (to_host 1: dev -> host, 0:
     * host -> dev) that starts after every kernel queued so far and runs
     * beside later ones (a copy stream on CUDA, a memcpy on the CPU); copies
     * run in the order queued. offload_mark names the completion of every
     * copy queued so far; offload_wait(mark) makes kernels queued after it
     * wait for that completion. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    void (*offload_copy)(void *host, void *dev, size_t bytes, int to_host);
    int (*offload_mark)(void);
    void (*offload_wait)(int mark);

    /* ---- timing (log.profile_steps, profile.c) ----
     * timer_mark(i): slot i (0 <= i < KERNEL_TIMER_SLOTS) takes the moment
     * everything queued so far on the compute stream has run: an event
     * recorded on it on CUDA, the clock now on the CPU (whose calls are done
     * when they return). timer_read(n, ms): waits for slots 0..n-1 and gives
     * each one's time in milliseconds after slot 0's. A slot keeps its last
     * mark until the next. */
    void (*timer_mark)(int slot);
    void (*timer_read)(int n, double *ms);

    /* ---- context parallelism (cp.c's ring attention; last in the table,
     * so a backend without them leaves them NULL) ----
     * attention_part_forward: the attention of one segment of a rank's
     * queries to one segment of keys and values, merged into what out and
     * lse hold, so that a query's attention over several key segments is
     * built a segment at a time (the online softmax). Queries: rows [qrow,
     * qrow + nq) of each batch row of qkv [a] ([B, Tq, (nh + 2 nkv) hd],
     * heads as attention_forward's), at positions q0 .. q0 + nq - 1 of their
     * sequence. Keys and values: rows [krow, krow + nk) of kv [a] ([B, Tk,
     * 2 nkv hd]: the k heads, then the v heads), at positions k0 .. k0 +
     * nk - 1. A query at position p sees the keys at positions [qstart, p]
     * (qstart[b * Tq + row]: a position in the sequence, in the backend's
     * memory; NULL: 0). out [a] [B, Tq, nh hd] and lse [B, nh, Tq], fp32:
     * with merge 0 the segment's rows are overwritten by this part (a row
     * that sees no key: out 0, lse -inf); with merge 1 combined with it:
     * lse' = log(e^lse + e^part's lse), out' = out e^(lse - lse') + P V with
     * P = e^(s - lse') (computed in fp32; a bf16 out is rounded where it is
     * stored, once a call). Rows outside the segment are untouched. */
    void (*attention_part_forward)(float *out, float *lse, const float *qkv, int qrow, int q0, int nq, const float *kv,
                                   int krow, int k0, int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv,
                                   int hd, int merge);
    /* Its backward under the final (merged) out and lse: the segment
     * pair's dQ is ADDED into dqkv [a]'s q columns (rows [qrow, qrow +
     * nq)), its dK and dV into dkv (rows [krow, krow + nk), laid out as kv
     * but fp32 whatever act_bytes is: it sums the parts of every rank).
     * dout, qkv, out and kv are [a]. */
    void (*attention_part_backward)(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, int qrow, int q0, int nq, const float *kv, int krow, int k0, int nk,
                                    const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd);
    /* rows x width bytes from src (rows spitch bytes apart) to dst (dpitch
     * apart), in backend memory: the k and v columns out of qkv, their
     * gradients back into dqkv's */
    void (*copy_2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
} Kernels;

#define KERNEL_TIMER_SLOTS 8192

/* Shared by the backends so that they round to the same bits. */
#ifdef __CUDACC__
#define KERNELS_HD __host__ __device__
#else
#define KERNELS_HD
#endif
/* splitmix64's finaliser of z + golden ratio: a well-mixed 64-bit hash. */
static inline KERNELS_HD uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* The fp32 bit pattern u rounded to bf16 precision: to nearest even (seed
 * 0), or up with probability (low 16 bits) / 2^16 from the 16 random bits of
 * (seed, idx). NaN stays (quiet) NaN, infinities stay. */
static inline KERNELS_HD uint32_t round_bf16_word(uint32_t u, uint64_t seed, uint64_t idx) {
    if ((u & 0x7f800000u) == 0x7f800000u) return (u & 0x007fffffu) ? (u | 0x00400000u) & 0xffff0000u : u;
    uint32_t add = seed ? (uint32_t)(splitmix64(seed ^ splitmix64(idx)) & 0xffffu) : 0x7fffu + ((u >> 16) & 1u);
    return (u + add) & 0xffff0000u;
}

/* The CPU backend (kernels_cpu.c). Always available. */
const Kernels *kernels_cpu(void);
/* Threads for the CPU kernels (OpenMP). n <= 0: cores / ranks on this
 * node, unless OMP_NUM_THREADS is set. Returns the count in use. */
int kernels_cpu_set_threads(int n, int ranks_on_node);
/* The CPU's FP8 weight copies (Kernels.fp8_setup) made so far, and in
 * *hits (may be NULL) how many products found one already made; for tests. */
long kernels_cpu_fp8_weight_copies(long *hits);
/* Name of the BLAS core in use, e.g. "OpenBLAS 0.3.21 SkylakeX (2 threads)". */
const char *kernels_cpu_blas_info(void);
/* Call first thing in main(): when OpenBLAS would not recognise this CPU and
 * fall back to a slow kernel, pick the right core type and re-exec. */
void kernels_cpu_select_blas_core(char **argv);
/* Measured single-precision GEMM throughput of this machine (GFLOP/s),
 * from a short timed sgemm; used as the CPU peak for MFU. The first call
 * measures; later ones return it, or with again != 0 measure anew. */
double kernels_cpu_sgemm_peak_gflops(int again);

/* The CUDA backend's scratch memory beside the layout's buffers for one
 * rank's shape (kernels_cuda_sizes.c, from the sizes kernels.cu allocates
 * by): in every build, so `llmtrain check` sizes a CUDA run anywhere. The
 * widths are the rank's local (TP) ones. */
typedef struct CudaScratchShape {
    int B, T, C;                        /* micro-batch, sequence length, width */
    int nh, hd, qkv_dim, fc_dim, F, V;  /* heads, head dim, qkv and up-projection widths, SwiGLU hidden, vocab */
    size_t n_params;                    /* the local flat array */
    int gpt2, bf16;                     /* GPT-2 (else Llama); compute dtype bf16 */
    const char *attention;              /* train.attention_kernel */
    int weight_copies;                  /* layers whose weights' bf16 copies are kept (sharded: the pool's slots - 2) */
    int sharded, off_grid;              /* sharded weights; a 2-D weight off the 8-float grid */
    int cp;                             /* parallel.context (T is then the rank's seq_len / cp): > 1, the attention
                                         * parts run instead of the whole-sequence attention, with no scratch */
    const Fp8Sizes *fp8;                /* train.compute_dtype fp8: the FP8 buffers' sizes (model_fp8_sizes); else NULL */
    int fp8_recipe;                     /* with fp8: train.fp8_recipe (fp8.h FP8_TENSORWISE, ...) */
} CudaScratchShape;
double kernels_cuda_scratch_bytes(const CudaScratchShape *s);

/* The CUDA backend (kernels.cu), defined only in CUDA builds (the build
 * defines LLMTRAIN_CUDA). Nothing touches the CUDA driver before
 * kernels_cuda_available() or kernels_cuda() is called, so CPU runs of a
 * CUDA build work on machines without a GPU or driver. */
#ifdef LLMTRAIN_CUDA
/* CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 with
 * the reason in why when there are none or no driver. */
int kernels_cuda_device_count(char *why, size_t n);
/* The device kernels_cuda() initialises (default 0; call before it). */
void kernels_cuda_set_device(int dev);
/* 1 when the chosen device is usable; else 0 and the reason in why. */
int kernels_cuda_available(char *why, size_t n);
/* The chosen device's UUID as nvidia-smi prints it ("GPU-8c1f...-..."),
 * the same in every process whatever CUDA_VISIBLE_DEVICES maps it to (a
 * device query, asked before kernels_cuda_available): 0, or -1 when it
 * cannot be read. */
int kernels_cuda_device_uuid(char *out, size_t n);
/* The matrix products' arithmetic and the [a] buffers' width
 * (train.compute_dtype): "bf16" (the default: bf16 operands, fp32
 * accumulation, [a] buffers bf16, act_bytes 2), "tf32" (fp32 storage, TF32
 * tensor cores) or "fp32" (plain fp32). Call before kernels_cuda(), which
 * fixes it. */
void kernels_cuda_set_compute_dtype(const char *dtype);
/* Initialises the chosen device (dies with exit 2 when there is none). */
const Kernels *kernels_cuda(void);
/* The stream every kernel runs on, as a cudaStream_t (the legacy default
 * stream): a communication library orders its work after it with events. */
void *kernels_cuda_stream(void);
/* With poll set, the backend's host waits (to_host, from_host, the
 * reductions that return a number) wait for the stream by querying it and
 * calling poll(ctx) between queries instead of blocking in the driver, so
 * that a communication library can check for asynchronous errors while the
 * stream waits on its collectives. NULL: block (the default). */
void kernels_cuda_set_host_wait(void (*poll)(void *ctx), void *ctx);
/* "device 0: NVIDIA H200, 132 SMs, cc 9.0, 139.8 GiB; matmuls ..." */
const char *kernels_cuda_device_info(void);
/* Dense bf16 tensor-core peak of the device in GFLOP/s, for MFU; *source
 * (optional) says where the figure comes from. */
double kernels_cuda_peak_gflops(const char **source);
/* The device's peak memory bandwidth in GB/s (2 transfers a memory clock x
 * the bus width), for log.profile_steps' memory-bound entries. */
double kernels_cuda_peak_gbs(void);
/* Device memory this backend holds now (*in_use) and at most so far (*peak),
 * in bytes: every alloc() (until its free()), the scratch buffers that only
 * grow, the cuBLASLt workspace. Not the CUDA context or library-internal
 * memory, so nvidia-smi shows more. Either pointer may be NULL. */
void kernels_cuda_mem_stats(size_t *in_use, size_t *peak);
/* How many matmul_gelu_forward calls so far ran as one cuBLASLt GEMM with
 * the GELU epilogue (the rest: GEMM, then the GELU kernel); for tests. */
long kernels_cuda_fused_gelu_calls(void);
/* How many matmul_gelu_backward calls so far ran their input-gradient GEMM
 * with the DGELU epilogue (the rest: GEMM, then an in-place kernel). */
long kernels_cuda_fused_dgelu_calls(void);
/* How many layernorm_backward / rmsnorm_backward calls so far computed the
 * input gradient and the weight (and bias) gradients in one pass over dout
 * and inp (the rest: three kernels, for a C too wide for shared memory) */
long kernels_cuda_fused_norm_bwd_calls(void);
/* Of those, how many took the float4 form (a width a multiple of 4, rows
 * 16-byte aligned; a block to a row): which 0 with a thread's columns in
 * registers (C up to 4096), 1 reading the row twice. */
long kernels_cuda_vec_norm_bwd_calls(int which);
/* How many crossentropy_forward / crossentropy_fused calls so far read and
 * wrote the logits 16 bytes at a time (V a multiple of 8 under bf16 [a], of
 * 4 under fp32, the logits 16-byte aligned); the rest: an element at a time */
long kernels_cuda_vec_ce_calls(void);
/* How many layernorm / rmsnorm forward calls (the residual add's too) so far
 * read and wrote 16 bytes at a time (C a multiple of 4, rows 16-byte
 * aligned); the rest: an element at a time */
long kernels_cuda_vec_norm_fwd_calls(void);
/* How many swiglu_forward / swiglu_backward calls (matmul_swiglu_backward's
 * too) and rope_forward / rope_backward calls so far took the pointwise
 * kernels' 16-byte form: 8 elements a thread (SwiGLU: F a multiple of 8;
 * RoPE: head_dim a multiple of 16; every operand 16-byte aligned); the
 * rest: an element at a time */
long kernels_cuda_vec_pointwise_calls(void);
/* The grid of the last sum / sumsq / sumsq_queue reduction: a block for
 * every 16384 elements, at most 8192 blocks (each block's work bounded, so
 * the side stream's never holds an SM long); for tests */
unsigned kernels_cuda_last_reduce_grid(void);
/* How many fp32 <-> bf16 conversions (the bf16 GEMMs' operand copies, the
 * weight cache's, unpack_bf16's) and pack_bf16 calls so far took the
 * 16-byte form (8 elements a thread up to the last whole 8, both pointers
 * 16-byte aligned); the rest: an element at a time */
long kernels_cuda_vec_convert_calls(void);
/* How many bias gradients so far were summed from an fp32 output gradient
 * in the same pass that wrote its bf16 copy for the backward's GEMMs (under
 * bf16; the rest: a conversion pass and a bias pass) */
long kernels_cuda_colsum_copy_calls(void);
/* How many times so far a product's backward converted an fp32 dout to
 * bf16 for its GEMMs (under bf16; with a bias gradient, in its pass:
 * colsum_copy_calls counts those too); a dout_a given converts nothing.
 * And how many norm backwards wrote their dinp_a in the pass that wrote
 * dinp (under bf16; the rest: a conversion after it). */
long kernels_cuda_dout_convert_calls(void);
long kernels_cuda_fused_dinp_a_calls(void);
/* How many weight, bias and norm-weight gradients so far were stored by
 * their first backward product or column sum in fresh gradient memory
 * (Kernels.grads_fresh) instead of added into zeroed memory; *regions: the
 * fresh ranges not yet settled (or freed); *zeroed_bytes: the bytes of
 * fresh memory zeroed so far (settled, or added into by an embedding's
 * backward). Either pointer may be NULL. For tests. */
long kernels_cuda_fresh_grad_stats(int *regions, size_t *zeroed_bytes);
/* The attention kernels (train.attention_kernel): "cudnn" (cuDNN's fused
 * attention on bf16 qkv, head dims 8..128 by 8; the shapes it declines
 * take "flash"), "flash" (fused kernels, head dims 32/64/128; other shapes
 * take the GEMMs), "gemm" (cuBLASLt GEMMs on the full T x T square) or
 * "auto" (the default: cudnn under compute dtype bf16, else flash). May
 * change between calls (tests). */
void kernels_cuda_set_attention(const char *mode);
/* How many attention_forward / attention_backward calls so far ran the
 * fused kernels (the rest took cuDNN or the GEMMs); for tests. */
long kernels_cuda_flash_attention_calls(void);
/* How many attention_part_forward / attention_part_backward calls so far
 * ran on the bf16 tensor-core kernels (the rest took the fp32 tiles); for
 * tests. */
long kernels_cuda_attention_part_tc_calls(void);
/* How many ran through cuDNN; for tests. */
long kernels_cuda_cudnn_attention_calls(void);
/* The bf16 weight copies of Kernels.weights_stable: products that found a
 * current copy (*hits), that made one (*made), and the device bytes the
 * copies hold now (*bytes); for tests. Any pointer may be NULL. The
 * environment variable LLMTRAIN_CUDA_WEIGHT_CACHE=0 turns the copies off
 * (every bf16 product converts its weights into scratch again). */
void kernels_cuda_weight_cache_stats(long *hits, long *made, size_t *bytes);
/* FP8 (train.compute_dtype fp8, kernels/fp8.cuh): the weights' FP8 copies
 * made so far (*made), the products that found one current (*hits), and
 * the products whose output went through the fp32 stage (a bias, or an
 * output cuBLASLt's FP8 kernels cannot write: *staged); for tests. Any
 * pointer may be NULL. */
void kernels_cuda_fp8_stats(long *made, long *hits, long *staged);
/* The tensorwise FP8 codes (E5M2 when e5m2, else E4M3) of the n device
 * values at x (bf16 words when x16) into host memory, and the scale in
 * *scale: the casts the products run, for tests (after fp8_setup). */
void kernels_cuda_fp8_codes(uint8_t *host, const float *x, int x16, size_t n, int e5m2, float *scale);
/* x [rows, cols] on the device (bf16 words when x16) quantized under
 * fp8_setup's recipe as an operand (a weight when weight) whose K is its
 * columns (kdim 1) or its rows (kdim 0): its codes as the product reads
 * them ([rows, pad16(cols)] or [cols, pad16(rows)]) into codes, and its
 * inverse scales in cuBLASLt's layout for the recipe's scale mode
 * (docs/fp8.md; padding 0) into inv, *n_inv of them; for tests. */
void kernels_cuda_fp8_quant(uint8_t *codes, float *inv, size_t *n_inv, const float *x, int x16, int rows, int cols,
                            int e5m2, int weight, int kdim);
#endif

#endif
