/* kernels_ops.h — the op list: every entry of the kernel table (kernels.h's
 * Kernels), in table order, with its signature and its contract. Written
 * once here, it is read by each user that lists the ops, which defines the
 * three entry macros before including this file (no include guard: it is
 * meant to be read again) and undefines them after:
 *
 *   KERNEL_OP(ret, name, params, args)      work on the backend, no result
 *   KERNEL_OP_RET(ret, name, params, args)  work on the backend, a result
 *   KERNEL_CTL(ret, name, params, args)     memory, modes and timers: no
 *                                           kernel of its own to time
 *
 * params is the parenthesised parameter list, args the same names as a call
 * passes them. kernels.h makes the table's members of them, kernels.cu its
 * table (the CUDA backend's function for op NAME is cu_NAME), profile.c its
 * timing wrappers (KERNEL_OP and KERNEL_OP_RET, each with its cost there:
 * a new op that lacks one does not compile). kernels_cpu.c names its
 * functions in a designated table. A new op: an entry here, its functions
 * in both backends, its cost in profile.c.
 *
 * Conventions (forward overwrites, backward adds, [a] buffers): kernels.h. */
/* ---- memory (never called inside the step loop except zero/copy) ---- */
KERNEL_CTL(void *, alloc, (size_t bytes), (bytes))       /* zero-filled */
KERNEL_CTL(void, free, (void *p), (p))
KERNEL_OP(void, zero, (void *p, size_t bytes), (p, bytes))
KERNEL_OP(void, copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes)) /* within backend memory */
KERNEL_OP(void, to_host, (void *host_dst, const void *src, size_t bytes), (host_dst, src, bytes))
KERNEL_OP(void, from_host, (void *dst, const void *host_src, size_t bytes), (dst, host_src, bytes))

/* ---- embeddings ----
 * out[n,:] = wte[tokens[n],:] + (wpe ? wpe[p(n),:] : 0), where row n's
 * position p(n) is pos[n] (0 <= pos[n] < T; an int array in the
 * backend's memory: train.reset_position_ids) or, pos NULL, n % T */
KERNEL_OP(void, embed_forward, (float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
    int N, int T, int C), (out, tokens, pos, wte, wpe, N, T, C))
/* dwte[tokens[n],:] += dout[n,:]; dwpe[p(n),:] += dout[n,:] (dwpe may be
 * NULL); each gradient row adds its rows of dout in increasing n */
KERNEL_OP(void, embed_backward, (float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos,
    int N, int T, int C), (dwte, dwpe, dout, tokens, pos, N, T, C))

/* Vocab-parallel (tensor parallel) forms: wte holds only vocabulary rows
 * [v0, v0 + V); a token outside contributes zero (wpe is still added when
 * given), backward adds only rows in range. The caller sums over ranks. */
KERNEL_OP(void, embed_forward_vp, (float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
    int N, int T, int C, int v0, int V), (out, tokens, pos, wte, wpe, N, T, C, v0, V))
KERNEL_OP(void, embed_backward_vp, (float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos,
    int N, int T, int C, int v0, int V), (dwte, dwpe, dout, tokens, pos, N, T, C, v0, V))

/* ---- norms (statistics in fp32; mean/rstd saved for backward, [N]);
 * the forwards' out is [a]. The backwards' dinp_a (NULL: none; not
 * without dinp) receives dinp's final values (after the add) as [a]:
 * the residual stream's gradient, which the next output projection's
 * backward reads as its dout_a (below), so that it is not converted
 * again there; CUDA writes it from the same registers under bf16. ---- */
KERNEL_OP(void, layernorm_forward, (float *out, float *mean, float *rstd, const float *inp, const float *w,
    const float *b, int N, int C, float eps), (out, mean, rstd, inp, w, b, N, C, eps))
KERNEL_OP(void, layernorm_backward, (float *dinp, float *dinp_a, float *dw, float *db, const float *dout,
    const float *inp, const float *w, const float *mean, const float *rstd, int N, int C), (dinp, dinp_a, dw, db,
    dout, inp, w, mean, rstd, N, C))
/* out = inp * rsqrt(mean(inp^2) + eps) * w */
KERNEL_OP(void, rmsnorm_forward, (float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps),
    (out, rstd, inp, w, N, C, eps))
KERNEL_OP(void, rmsnorm_backward, (float *dinp, float *dinp_a, float *dw, const float *dout, const float *inp,
    const float *w, const float *rstd, int N, int C), (dinp, dinp_a, dw, dout, inp, w, rstd, N, C))
/* The residual add fused with the norm after it: res = a + b (res may
 * alias a), then out = layernorm / rmsnorm of res exactly as the
 * kernels above (one pass over the rows instead of two). */
KERNEL_OP(void, add_layernorm_forward, (float *res, float *out, float *mean, float *rstd, const float *a,
    const float *b, const float *w, const float *bias, int N, int C, float eps), (res, out, mean, rstd, a, b, w, bias,
    N, C, eps))
KERNEL_OP(void, add_rmsnorm_forward, (float *res, float *out, float *rstd, const float *a, const float *b,
    const float *w, int N, int C, float eps), (res, out, rstd, a, b, w, N, C, eps))

/* ---- matrix products (inp is [a] in every one of them) ----
 * out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias[OC] when bias != NULL)   */
KERNEL_OP(void, matmul_forward, (float *out, const float *inp, const float *w, const float *bias, int N, int C,
    int OC), (out, inp, w, bias, N, C, OC))
/* dinp[N,C] = dout @ w (OVERWRITTEN); dw[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout */
KERNEL_OP(void, matmul_backward, (float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
    const float *w, int N, int C, int OC), (dinp, dw, dbias, dout, inp, w, N, C, OC))
/* out[N,OC] = res + inp @ w^T (+ bias): matmul_forward with the
 * residual add after it in the same call (res and out fp32; out must not
 * overlap res). The layers' output projections write the residual
 * stream with it; CUDA runs it as one GEMM reading res as its C input
 * (beta 1), so the product is never stored and read back on its own.
 * The CPU computes the product, then res + product: the bits of
 * matmul_forward then add. */
KERNEL_OP(void, matmul_forward_res, (float *out, const float *res, const float *inp, const float *w,
    const float *bias, int N, int C, int OC), (out, res, inp, w, bias, N, C, OC))
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
KERNEL_OP(void, matmul_forward_a, (float *out, const float *inp, const float *w, const float *bias, int N, int C,
    int OC), (out, inp, w, bias, N, C, OC))
KERNEL_OP(void, matmul_backward_a, (float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
    const float *w, int N, int C, int OC), (dinp, dw, dbias, dout, inp, w, N, C, OC))
/* matmul_backward with dinp (OVERWRITTEN) [a]: the attention output
 * projection's, whose input gradient is attention_backward's dout, [a]
 * (under bf16 the GEMM rounds it to bf16 once where it is stored, and
 * attention reads it with no conversion pass).
 * dout_a here and in the two below (NULL: none): dout's values as [a],
 * exactly (a norm backward's dinp_a); the products read it instead of
 * converting dout (CUDA under bf16; the CPU reads dout), and a bias
 * gradient still sums the fp32 dout. */
KERNEL_OP(void, matmul_backward_dinp_a, (float *dinp, float *dw, float *dbias, const float *dout, const float *dout_a,
    const float *inp, const float *w, int N, int C, int OC), (dinp, dw, dbias, dout, dout_a, inp, w, N, C, OC))

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
KERNEL_OP(void, attention_forward, (float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh,
    int nkv, int hd), (out, lse, qkv, qstart, B, T, nh, nkv, hd))
/* dqkv = d(out)/d(qkv) . dout (OVERWRITTEN), from the forward's out and
 * lse, under the forward's qstart; dout and dqkv are [a] (dout as the output projection's
 * matmul_backward_dinp_a stores it; under bf16 each gradient in dqkv
 * rounded once where it is stored; rope_backward and the qkv
 * projection's matmul_backward_a read it as it is) */
KERNEL_OP(void, attention_backward, (float *dqkv, const float *dout, const float *qkv, const float *out,
    const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd), (dqkv, dout, qkv, out, lse, qstart,
    B, T, nh, nkv, hd))
/* Rotary embedding, Hugging Face rotate-half convention, on the q and k
 * heads of qkv ([B,T,(nh+2nkv)*hd]), in place; row n's position p is
 * pos[n] (pos >= 0; an int array in the backend's memory:
 * train.reset_position_ids) or, pos NULL, n % T; its angles are p x
 * rope_inv_freq(rope, i, hd), i < hd/2, and its cos and sin are
 * scaled by rope_mscale(rope) (1 but under YaRN). qkv is [a] (rotated
 * in fp32, each element rounded once where it is stored).
 * rope_backward applies the transpose (the inverse rotation, times
 * rope_mscale) to dqkv ([a]), in place. */
KERNEL_OP(void, rope_forward, (float *qkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope),
    (qkv, pos, B, T, nh, nkv, hd, rope))
KERNEL_OP(void, rope_backward, (float *dqkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope),
    (dqkv, pos, B, T, nh, nkv, hd, rope))
/* QK-norm (Qwen3's q_norm and k_norm): each of the nh q heads and nkv k
 * heads of a row of inp ([N, (nh+2nkv)*hd], [a], as the QKV product wrote
 * it) RMS-normalized over its hd values, statistics in fp32, times qw
 * (q heads) or kw (k heads), both [hd]: out's head = head *
 * rsqrt(mean(head^2) + eps) * w; out's v heads are inp's (out [a], not
 * inp). rstd [N, nh + nkv] saves each head's rsqrt, heads in row order.
 * headnorm_backward: in place, dqkv's q and k heads from d(out) to
 * d(inp) (its v heads untouched), from the forward's inp and rstd; dqw
 * and dkw (NULL: not needed) += the weights' gradients, summed over the
 * rows and heads. */
KERNEL_OP(void, headnorm_forward, (float *out, float *rstd, const float *inp, const float *qw, const float *kw, int N,
    int nh, int nkv, int hd, float eps), (out, rstd, inp, qw, kw, N, nh, nkv, hd, eps))
KERNEL_OP(void, headnorm_backward, (float *dqkv, float *dqw, float *dkw, const float *inp, const float *qw,
    const float *kw, const float *rstd, int N, int nh, int nkv, int hd), (dqkv, dqw, dkw, inp, qw, kw, rstd, N, nh,
    nkv, hd))

/* ---- pointwise ---- */
/* GELU, tanh approximation (GPT-2's gelu_new); gelu_forward's inp and
 * out are [a] (GPT-2's MLP activation, which selective checkpointing's
 * mlp_act recomputes from the kept pre-activation), gelu_backward's fp32 */
KERNEL_OP(void, gelu_forward, (float *out, const float *inp, size_t n), (out, inp, n))
KERNEL_OP(void, gelu_backward, (float *dinp, const float *inp, const float *dout, size_t n), (dinp, inp, dout, n))
/* GPT-2's MLP up-projection and its GELU in one call (inp, pre and
 * out [a]): pre[N,OC] = inp @ w^T (+ bias) (kept for the backward),
 * out[N,OC] = gelu(pre), each rounded once where it is stored (under
 * bf16 CUDA adds a bf16 copy of the bias). Equal to matmul_forward then
 * gelu_forward (on the CPU that is what it runs, bit for bit); CUDA
 * fuses the GELU into the GEMM's epilogue when it can. */
KERNEL_OP(void, matmul_gelu_forward, (float *out, float *pre, const float *inp, const float *w, const float *bias,
    int N, int C, int OC), (out, pre, inp, w, bias, N, C, OC))
/* inp is [N, 2F]: gate in columns [0,F), up in [F,2F).
 * out[N,F] = silu(gate) * up; inp and out are [a] (swiglu_backward's
 * inp too; its dinp is fp32, added into) */
KERNEL_OP(void, swiglu_forward, (float *out, const float *inp, int N, int F), (out, inp, N, F))
KERNEL_OP(void, swiglu_backward, (float *dinp, const float *inp, const float *dout, int N, int F), (dinp, inp, dout,
    N, F))
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
KERNEL_OP(void, matmul_gelu_backward, (float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
    const float *inp, const float *w, const float *pre, int N, int C, int OC), (dpre, dw, dbias, dout, dout_a, inp, w,
    pre, N, C, OC))
KERNEL_OP(void, matmul_swiglu_backward, (float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
    const float *inp, const float *w, const float *pre, int N, int C, int OC), (dpre, dw, dbias, dout, dout_a, inp, w,
    pre, N, C, OC))
/* out = a + b (out may alias a) */
KERNEL_OP(void, add, (float *out, const float *a, const float *b, size_t n), (out, a, b, n))

/* ---- loss (logits are [a] in every one of them; the arithmetic is
 * fp32, each value rounded once where it is stored) ----
 * logits [N, V] are replaced by softmax probabilities (in place);
 * losses[n] = -log p[n, targets[n]]. A row whose target is
 * CE_NO_TARGET (a masked prediction: train.eod_mask_loss) has loss 0
 * and a zero gradient row; it still gets its probabilities.          */
KERNEL_OP(void, crossentropy_forward, (float *losses, float *logits, const int *targets, int N, int V), (losses,
    logits, targets, N, V))
/* probs [N,V] -> dlogits = (probs - onehot(target)) * dloss, in place */
KERNEL_OP(void, crossentropy_backward, (float *probs, const int *targets, float dloss, int N, int V), (probs, targets,
    dloss, N, V))
/* crossentropy_forward then crossentropy_backward in one call (one pass
 * fewer over the logits): losses as the forward's, logits replaced by
 * (softmax - onehot(target)) * dloss in place; the same bits as the two
 * calls on the same backend (with bf16 [a], the probability is rounded
 * to bf16 before the subtraction, as the two calls store it). */
KERNEL_OP(void, crossentropy_fused, (float *losses, float *logits, const int *targets, float dloss, int N, int V),
    (losses, logits, targets, dloss, N, V))

/* Vocab-parallel cross-entropy over local logits [N, V] holding the
 * vocabulary columns [v0, v0 + V); the caller reduces over ranks between
 * the steps: rowmax = max over the row (then all-reduce MAX);
 * expsum: logits = exp(logits - rowmax) in place, sums[n] = row sum and
 * tgt[n] = the target's logit when this rank owns it, else 0 (then
 * all-reduce SUM of both); finish: logits /= sums (probabilities, in
 * place) and losses[n] = log(sums) + rowmax - tgt (0 for CE_NO_TARGET);
 * backward: probs -> (probs - onehot_local) * dloss, in place. */
KERNEL_OP(void, crossentropy_vp_max, (float *rowmax, const float *logits, int N, int V), (rowmax, logits, N, V))
KERNEL_OP(void, crossentropy_vp_expsum, (float *sums, float *tgt, float *logits, const float *rowmax,
    const int *targets, int N, int V, int v0), (sums, tgt, logits, rowmax, targets, N, V, v0))
KERNEL_OP(void, crossentropy_vp_finish, (float *losses, float *logits, const float *rowmax, const float *sums,
    const float *tgt, const int *targets, int N, int V), (losses, logits, rowmax, sums, tgt, targets, N, V))
KERNEL_OP(void, crossentropy_vp_backward, (float *probs, const int *targets, float dloss, int N, int V, int v0),
    (probs, targets, dloss, N, V, v0))

/* ---- optimizer and reductions over flat parameter ranges ---- */
/* sum of squares, accumulated in double */
KERNEL_OP_RET(double, sumsq, (const float *x, size_t n), (x, n))
/* The same sum of squares beside the compute: sumsq_queue(x, n, dst)
 * queues sumsq(x, n) (the same bits) to start after every kernel queued
 * so far and run beside later ones (a second stream of low priority on
 * CUDA: the gradient norm's passes overlap the backward of the layers
 * below; at once on the CPU), its result in backend memory dst (one
 * double, from alloc); x must stay as it is until the next sumsq_take.
 * sumsq_take(host, dst, n): waits for every queued sum and copies the n
 * doubles at dst to host. */
KERNEL_OP(void, sumsq_queue, (const float *x, size_t n, double *dst), (x, n, dst))
KERNEL_OP(void, sumsq_take, (double *host, const double *dst, int n), (host, dst, n))
/* sum (double) */
KERNEL_OP_RET(double, sum, (const float *x, size_t n), (x, n))
KERNEL_OP(void, scale, (float *x, float s, size_t n), (x, s, n))
/* torch.optim.AdamW for one range. step t is 1-based; wd already 0 for
 * ranges that are not decayed. grad_scale multiplies g first (clipping). */
KERNEL_OP(void, adamw, (float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
    float eps, float wd, int t, float grad_scale), (p, g, m, v, n, lr, beta1, beta2, eps, wd, t, grad_scale))
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
KERNEL_OP_RET(int, adamw_multi, (float *p, const float *g, float *m, float *v, const AdamWRange *ranges, int n_ranges,
    float lr, float beta1, float beta2, float eps, int t, float grad_scale, double *sumsq), (p, g, m, v, ranges,
    n_ranges, lr, beta1, beta2, eps, t, grad_scale, sumsq))
/* dst = src rounded to bfloat16 precision (8-bit mantissa; the low 16 bits
 * of each fp32 word cleared; dst == src allowed). seed 0: to nearest, ties
 * to even. seed != 0: stochastically, up with probability (dropped bits)
 * / 2^16, from 16 random bits that are a fixed function of (seed, index0 +
 * i), the same on every backend (round_bf16_word below). NaN stays NaN,
 * infinities stay. */
KERNEL_OP(void, round_bf16, (float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0), (dst, src, n,
    seed, index0))
/* The same rounding stored as bf16 words: dst[i] is the high half of
 * round_bf16's result for src[i] (the sharded working weights that the
 * FSDP all-gathers send under train.param_dtype bf16). unpack_bf16:
 * dst[i] = the fp32 value of bf16 word src[i], exactly (its low 16 bits
 * zero). So unpack(pack(x)) is round_bf16(x), bit for bit. In place
 * too: src == (uint16_t *)dst + n, the n words in the upper half of
 * dst's 4n bytes (where a gather lands in the buffer it is widened in). */
KERNEL_OP(void, pack_bf16, (uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0), (dst, src, n,
    seed, index0))
KERNEL_OP(void, unpack_bf16, (float *dst, const uint16_t *src, size_t n), (dst, src, n))

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
KERNEL_CTL(void, weights_stable, (const float *p, size_t n), (p, n))

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
KERNEL_CTL(void, fp8_setup, (int recipe, const struct Fp8Sizes *sizes), (recipe, sizes))
KERNEL_CTL(void, fp8_scope, (int on), (on))
KERNEL_CTL(void, fp8_tp, (void (*reduce)(void *ctx, float *amax, size_t n), void *ctx), (reduce, ctx))
KERNEL_CTL(void, fp8_cp, (void (*reduce)(void *ctx, float *amax, size_t n), void *ctx), (reduce, ctx))

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
KERNEL_OP(void, grads_fresh, (float *g, size_t n), (g, n))
KERNEL_OP(void, grads_settle, (float *g, size_t n), (g, n))

/* ---- activation offload (train.activation_offload) ----
 * host_alloc: zero-filled host memory for the copies (page-locked on
 * CUDA, so they run asynchronously). offload_copy queues a copy of bytes
 * between host memory and backend memory (to_host 1: dev -> host, 0:
 * host -> dev) that starts after every kernel queued so far and runs
 * beside later ones (a copy stream on CUDA, a memcpy on the CPU); copies
 * run in the order queued. offload_mark names the completion of every
 * copy queued so far; offload_wait(mark) makes kernels queued after it
 * wait for that completion. */
KERNEL_CTL(void *, host_alloc, (size_t bytes), (bytes))
KERNEL_CTL(void, host_free, (void *p), (p))
KERNEL_OP(void, offload_copy, (void *host, void *dev, size_t bytes, int to_host), (host, dev, bytes, to_host))
KERNEL_CTL(int, offload_mark, (void), (void))
KERNEL_OP(void, offload_wait, (int mark), (mark))

/* ---- timing (log.profile_steps, profile.c) ----
 * timer_mark(i): slot i (0 <= i < KERNEL_TIMER_SLOTS) takes the moment
 * everything queued so far on the compute stream has run: an event
 * recorded on it on CUDA, the clock now on the CPU (whose calls are done
 * when they return). timer_read(n, ms): waits for slots 0..n-1 and gives
 * each one's time in milliseconds after slot 0's. A slot keeps its last
 * mark until the next. */
KERNEL_CTL(void, timer_mark, (int slot), (slot))
KERNEL_CTL(void, timer_read, (int n, double *ms), (n, ms))

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
KERNEL_OP(void, attention_part_forward, (float *out, float *lse, const float *qkv, int qrow, int q0, int nq,
    const float *kv, int krow, int k0, int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd,
    int merge), (out, lse, qkv, qrow, q0, nq, kv, krow, k0, nk, qstart, B, Tq, Tk, nh, nkv, hd, merge))
/* Its backward under the final (merged) out and lse: the segment
 * pair's dQ is ADDED into dqkv [a]'s q columns (rows [qrow, qrow +
 * nq)), its dK and dV into dkv (rows [krow, krow + nk), laid out as kv
 * but fp32 whatever act_bytes is: it sums the parts of every rank).
 * dout, qkv, out and kv are [a]. */
KERNEL_OP(void, attention_part_backward, (float *dqkv, float *dkv, const float *dout, const float *qkv,
    const float *out, const float *lse, int qrow, int q0, int nq, const float *kv, int krow, int k0, int nk,
    const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd), (dqkv, dkv, dout, qkv, out, lse, qrow, q0, nq,
    kv, krow, k0, nk, qstart, B, Tq, Tk, nh, nkv, hd))
/* rows x width bytes from src (rows spitch bytes apart) to dst (dpitch
 * apart), in backend memory: the k and v columns out of qkv, their
 * gradients back into dqkv's */
KERNEL_OP(void, copy_2d, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows), (dst,
    dpitch, src, spitch, width, rows))

/* ---- mixture of experts (moe.c; docs/moe.md). A layer's N tokens each
 * choose k of E experts; the chosen (token, choice) pairs are laid out
 * expert by expert in a permuted buffer of rows, and slot[n * k + j] is
 * the row of token n's choice j there (-1: dropped by the capacity, it
 * reaches no expert). idx, slot and src are int arrays in the backend's
 * memory. ----
 * The router: probs[N, E] = softmax(logits[N, E]) (fp32), lse[N] the
 * rows' log-sum-exp of logits (the z-loss), idx[N, k] the k experts of
 * largest probs + bias (bias[E], NULL: none; it only chooses; ties to the
 * lower index) in that order, wts[N, k] their probabilities, divided by
 * their sum when norm_topk. */
KERNEL_OP(void, moe_route, (float *probs, float *lse, int *idx, float *wts, const float *logits, const float *bias,
    int N, int E, int k, int norm_topk), (probs, lse, idx, wts, logits, bias, N, E, k, norm_topk))
/* Its backward, dlogits[N, E] OVERWRITTEN: d(probs) is dprob[e] for every
 * token (the load-balancing loss's term; NULL: 0) plus what dwts[N, k]
 * gives through the top-k weights (and their renormalisation); then the
 * softmax's backward, plus the z-loss dz * lse^2's 2 dz lse probs. */
KERNEL_OP(void, moe_route_backward, (float *dlogits, const float *probs, const float *lse, const int *idx,
    const float *wts, const float *dwts, const float *dprob, float dz, int N, int E, int k, int norm_topk), (dlogits,
    probs, lse, idx, wts, dwts, dprob, dz, N, E, k, norm_topk))
/* out[e] = sum over n of x[n, e] (OVERWRITTEN, fp32): the router
 * probabilities' column sums */
KERNEL_OP(void, moe_colsum, (float *out, const float *x, int N, int E), (out, x, N, E))
/* xp[r, :] = x[src[r], :] for r < n (both [a], C wide): tokens to their
 * experts' rows */
KERNEL_OP(void, moe_permute, (float *xp, const float *x, const int *src, int n, int C), (xp, x, src, n, C))
/* out[n, :] = res[n, :] (NULL: 0; out may alias res) + sum over j of
 * wts[n, j] yp[slot[n, j], :] in increasing j (fp32; dropped choices
 * add nothing): the experts' outputs back to their tokens */
KERNEL_OP(void, moe_combine, (float *out, const float *res, const float *yp, const float *wts, const int *slot, int N,
    int k, int C), (out, res, yp, wts, slot, N, k, C))
/* Its backward (fp32): dyp[slot[n, j], :] = wts[n, j] dout[n, :]
 * (OVERWRITTEN; rows no slot names untouched) and dwts[n, j] =
 * dout[n, :] . yp[slot[n, j], :] (0 for a dropped choice) */
KERNEL_OP(void, moe_combine_backward, (float *dyp, float *dwts, const float *dout, const float *yp, const float *wts,
    const int *slot, int N, int k, int C), (dyp, dwts, dout, yp, wts, slot, N, k, C))
/* dx[n, :] += sum over j of dxp[slot[n, j], :] in increasing j (fp32):
 * the permutation's backward */
KERNEL_OP(void, moe_unpermute_add, (float *dx, const float *dxp, const int *slot, int N, int k, int C), (dx, dxp, slot,
    N, k, C))
