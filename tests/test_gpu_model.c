/* test_gpu_model.c — the CUDA backend's weights, gradients and optimizer
 * across a step, and model.c's use of them on the device: the bf16 weight
 * copies (weights_stable), fresh gradients (grads_fresh / grads_settle),
 * AdamW and its copies, the residual gradient's [a] copy and selective
 * checkpointing's recompute. Run by tests/test_gpu's main
 * (tests/test_gpu.c: the error metric and the tolerances); helpers in
 * tests/test_gpu.h. */
#include "kernels.h"
#include "test_gpu.h"
#include "model.h"
#include "util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* weights_stable (kernels.h): under bf16 GEMMs a product inside a stable
 * range converts its weights once and keeps the copy: a second forward and
 * the backward's input-gradient product find it (hits), it takes exactly 2
 * bytes a weight of device memory, and a product outside every range keeps
 * nothing. New weights declared stable give the new product (a stale copy
 * would give the old one), so does a product after every range is released,
 * and freeing the weights frees the copy. Under TF32 and fp32 nothing is
 * kept. Each product is checked against the CPU's on the weights the device
 * holds at that point (rounded to bf16 under bf16). */
void test_weight_cache(void) {
    int N = 64, C = 96, OC = 80;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    const int bf = act16();
    const double tol = bf ? TOL_FP32MM : tol_mm;
    float *inp = hrand(nx, 1), *w1 = hrand(nw, 0.1f), *w2 = hrand(nw, 0.1f), *dout = hrand(no, 1);
    act_round(inp, nx);
    act_round(dout, no); /* the bf16 backward's conversion of its output gradient */
    float *ginp = dcopy_act(inp, nx), *gout = dcopy(dout, no), *gdout = dcopy(dout, no);
    float *out = malloc_check(no * sizeof(float)), *dinp = calloc(nx, sizeof(float)), *gdinp = dcopy(dinp, nx);
    float *r1 = malloc_check(nw * sizeof(float)), *r2 = malloc_check(nw * sizeof(float));
    memcpy(r1, w1, nw * sizeof(float));
    memcpy(r2, w2, nw * sizeof(float));
    act_round(r1, nw);
    act_round(r2, nw);
    float *gw = KG->alloc(nw * sizeof(float)); /* ours to free */
    KG->from_host(gw, w1, nw * sizeof(float));
    long h0, m0, h, m;
    size_t b0, b;
    kernels_cuda_weight_cache_stats(&h0, &m0, &b0);
#define WC_EXPECT(what, dh, dm, db)                                                                              \
    do {                                                                                                         \
        kernels_cuda_weight_cache_stats(&h, &m, &b);                                                             \
        int ok_ = h - h0 == (bf ? (dh) : 0) && m - m0 == (bf ? (dm) : 0) && b - b0 == (bf ? (size_t)(db) : 0);   \
        printf("%s weight copies: %-26s hits +%ld, made +%ld, bytes +%zu\n", ok_ ? "ok  " : "FAIL", what, h - h0, \
               m - m0, b - b0);                                                                                  \
        if (ok_) pass++; else fail++;                                                                            \
    } while (0)
    KG->matmul_forward(gout, ginp, gw, NULL, N, C, OC);
    KC->matmul_forward(out, inp, r1, NULL, N, C, OC);
    check("wcache: outside a range", out, gout, no, tol);
    WC_EXPECT("outside a range", 0, 0, 0);
    KG->weights_stable(gw, nw);
    KG->matmul_forward(gout, ginp, gw, NULL, N, C, OC);
    KG->matmul_forward(gout, ginp, gw, NULL, N, C, OC);
    check("wcache: forward, copy kept", out, gout, no, tol);
    KG->matmul_backward(gdinp, NULL, NULL, gdout, ginp, gw, N, C, OC);
    KC->matmul_backward(dinp, NULL, NULL, dout, inp, r1, N, C, OC);
    check("wcache: backward on the copy", dinp, gdinp, nx, tol);
    WC_EXPECT("two forwards, a backward", 2, 1, nw * 2);
    KG->from_host(gw, w2, nw * sizeof(float));
    KG->weights_stable(gw, nw);
    KG->matmul_forward(gout, ginp, gw, NULL, N, C, OC);
    KC->matmul_forward(out, inp, r2, NULL, N, C, OC);
    check("wcache: new weights declared", out, gout, no, tol);
    WC_EXPECT("new weights: made again", 2, 2, nw * 2);
    KG->weights_stable(NULL, 0);
    KG->from_host(gw, w1, nw * sizeof(float));
    KG->matmul_forward(gout, ginp, gw, NULL, N, C, OC);
    KC->matmul_forward(out, inp, r1, NULL, N, C, OC);
    check("wcache: after every range ended", out, gout, no, tol);
    WC_EXPECT("released: not used", 2, 2, nw * 2);
    size_t in0, in1;
    kernels_cuda_mem_stats(&in0, NULL);
    KG->free(gw);
    kernels_cuda_mem_stats(&in1, NULL);
    WC_EXPECT("freed with the weights", 2, 2, 0);
    int ok = in0 - in1 == nw * sizeof(float) + (bf ? nw * 2 : 0);
    printf("%s wcache: the free returns %zu bytes (the weights' %zu + the copy's %zu)\n", ok ? "ok  " : "FAIL",
           in0 - in1, nw * sizeof(float), bf ? nw * 2 : (size_t)0);
    if (ok) pass++; else fail++;
#undef WC_EXPECT
    free(inp); free(w1); free(w2); free(dout); free(out); free(dinp); free(r1); free(r2);
}

/* model.c's weights_stable calls on a CUDA model (one rank, no chunk hook):
 * under bf16, a training forward and backward of a 2-layer Llama make one
 * bf16 copy per weight matrix the products read (4 a layer and the untied
 * LM head: 9), and the backward's input-gradient products find them (9
 * hits); with full activation checkpointing the layers' recompute finds
 * theirs too (4 more: layer 0's; the last layer is not recomputed). The next forward makes them again (whatever ran in between, the
 * optimizer, may have changed the weights), and freeing the model frees
 * them. Under TF32 and fp32 nothing is kept. */
void test_model_weight_copies(void) {
    ModelConfig c = {0};
    c.arch = ARCH_LLAMA;
    c.n_layer = 2; c.n_embd = 64; c.n_head = 4; c.n_kv_head = 2; c.ffn_hidden = 128; c.vocab_size = 96;
    c.max_seq_len = 32; c.norm_eps = 1e-5f; c.rope_theta = 10000.0f; c.tie_embeddings = 0;
    const int B = 2, T = 16, N = B * T;
    int tok[32], tgt[32];
    for (int i = 0; i < N; i++) { tok[i] = (int)(rnd_u32() % 96); tgt[i] = (int)(rnd_u32() % 96); }
    for (int ck = 0; ck < 2; ck++) {
        Model m;
        model_build_tp(&m, &c, KG, B, T, 1, 1, 1, 0, (ModelMem){ck ? ACT_FULL : ACT_NONE, 0, 0, 0, 0, 0, 0, 0, 0});
        model_init_random(&m, 0.02f, 7);
        long h0, m0, h1, m1, h2, m2, h3, m3;
        size_t b0, b1, b2;
        float loss[3];
        kernels_cuda_weight_cache_stats(&h0, &m0, &b0);
        for (int step = 0; step < 3; step++) {
            m.loss_scale = 1.0f / N;
            m.same_weights = step == 2; /* a second micro-batch: step 1's copies still hold */
            loss[step] = model_forward(&m, tok, tgt);
            model_backward(&m, 1.0f / N);
            if (step == 0) kernels_cuda_weight_cache_stats(&h1, &m1, &b1);
            if (step == 1) kernels_cuda_weight_cache_stats(&h2, &m2, &b2);
        }
        kernels_cuda_weight_cache_stats(&h3, &m3, NULL);
        const int bf = act16();
        const long made = bf ? 9 : 0, hits = bf ? (ck ? 13 : 9) : 0;
        /* AdamW over every weight, as an unsharded trainer's step: under bf16
         * it keeps the copies (returns 1), so a forward that does not declare
         * the weights again (same_weights, as the trainer then sets) makes
         * none and gives the loss of one that does, bit for bit */
        AdamWRange all = {0, m.n_params, 0.1f, 1};
        int kept = KG->adamw_multi(m.params, m.grads, m.m, m.v, &all, 1, 1e-2f, 0.9f, 0.95f, 1e-8f, 1, 1.0f, NULL);
        long h4, m4, h5, m5;
        m.same_weights = kept;
        float la = model_forward(&m, tok, tgt);
        model_backward(&m, 1.0f / N);
        kernels_cuda_weight_cache_stats(&h4, &m4, NULL);
        m.same_weights = 0;
        float lb = model_forward(&m, tok, tgt);
        model_backward(&m, 1.0f / N);
        kernels_cuda_weight_cache_stats(&h5, &m5, NULL);
        const int oka = kept == bf && m4 - m3 == (kept ? 0 : made) && h4 - h3 == (kept ? made + hits : hits) &&
             m5 - m4 == made && memcmp(&la, &lb, sizeof la) == 0 && la != loss[2];
        printf("%s model weight copies%s, after AdamW: returned %d; made %ld, hit %ld (expected %ld, %ld); loss %.9g, "
               "declared again %.9g, before the update %.9g\n", oka ? "ok  " : "FAIL", ck ? " (full ckpt)" : "", kept,
               m4 - m3, h4 - h3, kept ? 0 : made, kept ? made + hits : hits, (double)la, (double)lb, (double)loss[2]);
        if (oka) pass++; else fail++;
        model_free(&m);
        size_t b3;
        kernels_cuda_weight_cache_stats(NULL, NULL, &b3);
        const size_t bytes = bf ? 2 * (2 * ((size_t)128 * 64 + 64 * 64 + 256 * 64 + 64 * 128) + 96 * 64) : 0;
        int ok = m1 - m0 == made && h1 - h0 == hits && b1 - b0 == bytes && m2 - m1 == made && h2 - h1 == hits &&
                 b2 == b1 && b3 == b0;
        printf("%s model weight copies%s: a step made %ld, hit %ld, %zu bytes (expected %ld, %ld, %zu); the next "
               "made %ld, hit %ld; %zu bytes left after model_free\n", ok ? "ok  " : "FAIL", ck ? " (full ckpt)" : "",
               m1 - m0, h1 - h0, b1 - b0, made, hits, bytes, m2 - m1, h2 - h1, b3 - b0);
        if (ok) pass++; else fail++;
        /* same_weights: the forward finds the copies the last one made, and
         * computes what it did (nothing wrote the weights in between) */
        ok = m3 - m2 == 0 && h3 - h2 == made + hits && memcmp(&loss[2], &loss[1], sizeof(float)) == 0 &&
             memcmp(&loss[1], &loss[0], sizeof(float)) == 0;
        printf("%s model weight copies%s, same_weights: made %ld, hit %ld (expected 0, %ld); loss %.9g, before %.9g\n",
               ok ? "ok  " : "FAIL", ck ? " (full ckpt)" : "", m3 - m2, h3 - h2, made + hits, (double)loss[2],
               (double)loss[1]);
        if (ok) pass++; else fail++;
    }
}

/* grads_fresh / grads_settle (kernels.h). Gradient memory full of NaN is
 * declared fresh and the backward kernels write tensors inside it as a step
 * would: a product's weight and bias gradients, a layernorm's weight and
 * bias, an RMSNorm's weight over the first half of a tensor that a product
 * then adds into whole, position rows, an embedding's scattered rows, the
 * first product again (a second micro-batch), and a tensor no kernel
 * writes. Settled, the
 * memory must hold what the same calls give in zeroed memory (==), with the
 * 5 tensors written whole first stored (counted), and the rest zeroed: the
 * half the RMSNorm left, the positions' tensor, the embedding's to the end
 * of the region and the unwritten tensor, bytes counted. Then: a fresh range that overlaps part of
 * a pending one settles that one first, and freeing memory ends its region. */
static void fresh_grads_run(float *G, int fresh, const size_t *o, float *const *d, const int *gtok, int N, int C,
                            int OC, int T, size_t tot, const float *nan_host) {
    if (fresh) {
        KG->from_host(G, nan_host, tot * sizeof(float));
        KG->grads_fresh(G, tot);
    } else {
        KG->zero(G, tot * sizeof(float));
    }
    /* d: 0 dinp [N,C], 1 dout [N,OC], 2 inp [a] [N,C], 3 w [OC,C], 4 x [N,C], 5 norm w [C], 6 mean, 7 rstd,
     * 8 rms rstd, 9 dout2 [N,2], 10 w2 [2,C], 11 dnorm [N,C], 12 embedding dout [N,C] */
    KG->matmul_backward(d[0], G + o[0], G + o[1], d[1], d[2], d[3], N, C, OC);
    KG->zero(d[0], (size_t)N * C * sizeof(float));
    KG->layernorm_backward(d[0], NULL, G + o[2], G + o[3], d[11], d[4], d[5], d[6], d[7], N, C);
    KG->rmsnorm_backward(d[0], NULL, G + o[4], d[11], d[4], d[5], d[8], N, C);
    KG->matmul_backward(d[0], G + o[4], NULL, d[9], d[2], d[10], N, C, 2);
    KG->embed_backward(NULL, G + o[5], d[12], gtok, NULL, N, T, C); /* position rows */
    KG->embed_backward(G + o[7], NULL, d[12], gtok, NULL, N, T, C);
    KG->matmul_backward(d[0], G + o[0], G + o[1], d[1], d[2], d[3], N, C, OC);
    if (fresh) KG->grads_settle(G, tot);
}

static int same_floats(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i])) return 0;
    return 1;
}

void test_fresh_grads(void) {
    const int N = 48, C = 64, OC = 40, V = 30, T = 16;
    /* dw | db | layernorm w | b | RMSNorm w, then a [2, C] product | positions | unwritten | embedding | the
     * region's tail */
    size_t o[9];
    o[0] = 0;
    o[1] = o[0] + (size_t)OC * C;
    o[2] = o[1] + OC;
    o[3] = o[2] + C;
    o[4] = o[3] + C;
    o[5] = o[4] + 2 * (size_t)C;
    o[6] = o[5] + (size_t)T * C;
    o[7] = o[6] + 100;
    o[8] = o[7] + (size_t)V * C;
    const size_t tot = o[8] + 40;
    int tok[48];
    for (int i = 0; i < N; i++) tok[i] = (int)(rnd_u32() % 12); /* rows 12.. of the embedding untouched */
    float *x = hrand((size_t)N * C, 1), *nw = hrand(C, 1);
    float *d[13];
    d[0] = dcopy(hrand((size_t)N * C, 1), (size_t)N * C);
    d[1] = dcopy(hrand((size_t)N * OC, 1), (size_t)N * OC);
    d[2] = dcopy_act(hrand((size_t)N * C, 1), (size_t)N * C);
    d[3] = dcopy(hrand((size_t)OC * C, 1), (size_t)OC * C);
    d[4] = dcopy(x, (size_t)N * C);
    d[5] = dcopy(nw, C);
    d[6] = dcopy(hrand(N, 1), N);
    d[7] = dcopy(hrand(N, 1), N);
    d[8] = dcopy(hrand(N, 1), N);
    d[9] = dcopy(hrand((size_t)N * 2, 1), (size_t)N * 2);
    d[10] = dcopy(hrand(2 * (size_t)C, 1), 2 * (size_t)C);
    d[11] = dcopy(hrand((size_t)N * C, 1), (size_t)N * C);
    d[12] = dcopy(hrand((size_t)N * C, 1), (size_t)N * C);
    float *gout = dcopy_act(hrand((size_t)N * C, 1), (size_t)N * C);
    KG->layernorm_forward(gout, d[6], d[7], d[4], d[5], d[5], N, C, 1e-5f); /* real statistics */
    KG->rmsnorm_forward(gout, d[8], d[4], d[5], N, C, 1e-5f);
    int *gtok = dcopy_int(tok, N);
    float *nan_host = malloc(tot * sizeof(float));
    for (size_t i = 0; i < tot; i++) nan_host[i] = NAN;
    float *G = dcopy(nan_host, tot), *R = dcopy(nan_host, tot);
    float *hg = malloc(tot * sizeof(float)), *hr = malloc(tot * sizeof(float));

    size_t z0, z1;
    int r0, r1, r2;
    long w0 = kernels_cuda_fresh_grad_stats(&r0, &z0);
    fresh_grads_run(R, 0, o, d, gtok, N, C, OC, T, tot, nan_host);
    long w1 = kernels_cuda_fresh_grad_stats(&r1, &z1);
    fresh_grads_run(G, 1, o, d, gtok, N, C, OC, T, tot, nan_host);
    size_t z2;
    long w2 = kernels_cuda_fresh_grad_stats(&r2, &z2);
    KG->to_host(hg, G, tot * sizeof(float));
    KG->to_host(hr, R, tot * sizeof(float));
    size_t zeroed = ((size_t)C + (size_t)T * C + 100 + (size_t)V * C + 40) * sizeof(float);
    int ok = same_floats(hg, hr, tot) && w1 == w0 && z1 == z0 && w2 - w1 == 5 && z2 - z1 == zeroed && r2 == r0;
    printf("%s grads_fresh: NaN memory, 8 backward calls, settled: %s the zeroed memory's; %ld stored first "
           "(expected 5), %zu bytes zeroed (expected %zu), %d regions left (expected %d)\n", ok ? "ok  " : "FAIL",
           same_floats(hg, hr, tot) ? "==" : "differs from", w2 - w1, z2 - z1, zeroed, r2, r0);
    if (ok) pass++; else fail++;

    /* a fresh range over part of a pending one: that one is settled first
     * (all but its stored product zeroed), then the new one */
    KG->zero(R, tot * sizeof(float));
    KG->matmul_backward(d[0], R + o[0], R + o[1], d[1], d[2], d[3], N, C, OC);
    KG->from_host(G, nan_host, tot * sizeof(float));
    KG->grads_fresh(G, tot);
    KG->matmul_backward(d[0], G + o[0], G + o[1], d[1], d[2], d[3], N, C, OC);
    int r3, r4, r5;
    kernels_cuda_fresh_grad_stats(&r3, NULL);
    KG->grads_fresh(G + o[6], 100);
    kernels_cuda_fresh_grad_stats(&r4, NULL);
    KG->grads_settle(G + o[6], 100);
    kernels_cuda_fresh_grad_stats(&r5, NULL);
    KG->to_host(hg, G, tot * sizeof(float));
    KG->to_host(hr, R, tot * sizeof(float));
    ok = same_floats(hg, hr, tot) && r3 == r0 + 1 && r4 == r0 + 1 && r5 == r0;
    printf("%s grads_fresh over part of a pending range: %s a product into zeroed memory; regions %d, %d, %d "
           "(expected %d, %d, %d)\n", ok ? "ok  " : "FAIL", same_floats(hg, hr, tot) ? "==" : "differs from",
           r3 - r0, r4 - r0, r5 - r0, 1, 1, 0);
    if (ok) pass++; else fail++;

    /* freeing fresh memory ends its region, zeroing nothing */
    float *F = KG->alloc(1000 * sizeof(float));
    size_t z6, z7;
    int r6, r7;
    KG->grads_fresh(F, 1000);
    kernels_cuda_fresh_grad_stats(&r6, &z6);
    KG->free(F);
    kernels_cuda_fresh_grad_stats(&r7, &z7);
    ok = r6 == r0 + 1 && r7 == r0 && z7 == z6;
    printf("%s grads_fresh then free: regions %d then %d (expected 1, 0), %zu bytes zeroed (expected 0)\n",
           ok ? "ok  " : "FAIL", r6 - r0, r7 - r0, z7 - z6);
    if (ok) pass++; else fail++;
    free(x); free(nw); free(nan_host); free(hg); free(hr);
}

/* the small models of the model-level checks: 2 layers, 64 wide, vocabulary
 * 96; GPT-2 tied, Llama untied with 2 kv heads */
static ModelConfig small_model(int llama) {
    ModelConfig c = {0};
    c.arch = llama ? ARCH_LLAMA : ARCH_GPT2;
    c.n_layer = 2; c.n_embd = 64; c.n_head = 4; c.n_kv_head = llama ? 2 : 4; c.ffn_hidden = llama ? 128 : 256;
    c.vocab_size = 96; c.max_seq_len = 32; c.norm_eps = 1e-5f; c.rope_theta = 10000.0f; c.tie_embeddings = !llama;
    return c;
}

/* The same through model.c: two micro-batches' forward and backward of a
 * 2-layer GPT-2 (tied, biases) and Llama (untied) into gradients that were
 * NaN and declared fresh, settled, against the same into zeroed gradients:
 * equal (==), with every tensor a product or a column sum writes stored
 * first (GPT-2 12 a layer, the final norm's 2 and the tied LM head's; the
 * Llama's 6 a layer, 1 and its LM head's) and the embeddings zeroed. */
void test_model_fresh_grads(void) {
    for (int llama = 0; llama < 2; llama++) {
        ModelConfig c = small_model(llama);
        const int B = 2, T = 16, N = B * T;
        int tok[2][32], tgt[2][32];
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < N; i++) { tok[j][i] = (int)(rnd_u32() % 96); tgt[j][i] = (int)(rnd_u32() % 96); }
        Model m;
        model_build_tp(&m, &c, KG, B, T, 1, 1, 1, 0, (ModelMem){ACT_NONE, 0, 0, 0, 0, 0, 0, 0, 0});
        model_init_random(&m, 0.02f, 7);
        float *h[2];
        long w[3];
        for (int fresh = 0; fresh < 2; fresh++) {
            h[fresh] = malloc_check(m.n_params * sizeof(float));
            for (size_t i = 0; i < m.n_params; i++) h[fresh][i] = NAN;
            w[fresh] = kernels_cuda_fresh_grad_stats(NULL, NULL);
            if (fresh) {
                KG->from_host(m.grads, h[fresh], m.n_params * sizeof(float));
                KG->grads_fresh(m.grads, m.n_params);
            } else {
                KG->zero(m.grads, m.n_params * sizeof(float));
            }
            for (int j = 0; j < 2; j++) {
                m.loss_scale = 1.0f / (2 * N);
                m.same_weights = j > 0;
                model_forward(&m, tok[j], tgt[j]);
                model_backward(&m, 1.0f / (2 * N));
            }
            if (fresh) KG->grads_settle(m.grads, m.n_params);
            KG->to_host(h[fresh], m.grads, m.n_params * sizeof(float));
        }
        w[2] = kernels_cuda_fresh_grad_stats(NULL, NULL);
        const long want = llama ? 6 * 2 + 1 + 1 : 12 * 2 + 2 + 1;
        int same = same_floats(h[0], h[1], m.n_params), ok = same && w[1] == w[0] && w[2] - w[1] == want;
        printf("%s model gradients in fresh memory (%s, 2 micro-batches): %s the zeroed memory's; %ld stored first "
               "(expected %ld)\n", ok ? "ok  " : "FAIL", llama ? "Llama, untied" : "GPT-2, tied",
               same ? "==" : "differ from", w[2] - w[1], want);
        if (ok) pass++; else fail++;
        free(h[0]); free(h[1]);
        model_free(&m);
    }
}

/* The residual gradient's [a] copy (Model.dres_a) in a model's backward:
 * under bf16 the norm backwards into the residual gradient write it in their
 * pass (the final norm's and 2 a layer but layer 0's first, whose gradient
 * only the embeddings' backward reads, in fp32) and the output projections'
 * backward convert no dout (2 a layer without it); the gradients are those
 * of the same model with the copy taken away (dres_a NULL: the projections
 * convert dres themselves), bit for bit. Llama (no biases) and GPT-2 (the
 * projections' bias gradients from the fp32 dres). Under fp32 [a] a model
 * has no copy. */
void test_model_dres_copy(void) {
    for (int llama = 0; llama < 2; llama++) {
        ModelConfig c = small_model(llama);
        const int B = 2, T = 16, N = B * T;
        int tok[32], tgt[32];
        for (int i = 0; i < N; i++) { tok[i] = (int)(rnd_u32() % 96); tgt[i] = (int)(rnd_u32() % 96); }
        Model m;
        model_build_tp(&m, &c, KG, B, T, 1, 1, 1, 0, (ModelMem){ACT_NONE, 0, 0, 0, 0, 0, 0, 0, 0});
        model_init_random(&m, 0.02f, 7);
        float *copy = m.dres_a, *h[2];
        long conv[2], fused[2];
        for (int with = 1; with >= 0; with--) {
            m.dres_a = with ? copy : NULL;
            KG->zero(m.grads, m.n_params * sizeof(float));
            const long c0 = kernels_cuda_dout_convert_calls(), f0 = kernels_cuda_fused_dinp_a_calls();
            m.loss_scale = 1.0f / N;
            m.same_weights = 0;
            model_forward(&m, tok, tgt);
            model_backward(&m, 1.0f / N);
            conv[with] = kernels_cuda_dout_convert_calls() - c0;
            fused[with] = kernels_cuda_fused_dinp_a_calls() - f0;
            h[with] = malloc_check(m.n_params * sizeof(float));
            KG->to_host(h[with], m.grads, m.n_params * sizeof(float));
        }
        m.dres_a = copy;
        const int bf = act16(), L = c.n_layer, same = same_floats(h[0], h[1], m.n_params);
        const int ok = same && (bf ? copy != NULL : copy == NULL) && conv[1] == 0 && conv[0] == (bf ? 2 * L : 0) &&
                       fused[1] == (bf ? 2 * L : 0) && fused[0] == 0;
        printf("%s model residual gradient's [a] copy (%s): %s; gradients %s those without it; dout converted %ld "
               "times with it, %ld without (expected 0, %d); %ld norm backwards wrote it (expected %d)\n",
               ok ? "ok  " : "FAIL", llama ? "Llama" : "GPT-2", copy ? "kept" : "none", same ? "==" : "differ from",
               conv[1], conv[0], bf ? 2 * L : 0, fused[1], bf ? 2 * L : 0);
        if (ok) pass++; else fail++;
        free(h[0]); free(h[1]);
        model_free(&m);
    }
}

/* Selective checkpointing's recompute (ModelMem.recompute: attention, norm,
 * mlp_act together) through model.c on the device: the loss and every
 * gradient equal (==) those of the model that keeps everything, and the
 * recomputed buffers are shared between the layers (layer 1's ln1, ln2,
 * attention output and MLP activation are layer 0's). GPT-2's reference
 * runs the GELU as mlp_act has the forward run it, as its own kernel (set
 * by hand: Model.recompute with nothing dropped; the GEMM's GELU epilogue
 * rounds otherwise). Attention "gemm": deterministic. */
void test_model_recompute(void) {
    kernels_cuda_set_attention("gemm");
    for (int llama = 0; llama < 2; llama++) {
        ModelConfig c = small_model(llama);
        const int B = 2, T = 16, N = B * T;
        int tok[32], tgt[32];
        for (int i = 0; i < N; i++) { tok[i] = (int)(rnd_u32() % 96); tgt[i] = (int)(rnd_u32() % 96); }
        Model m[2];
        float *h[2], loss[2];
        for (int r = 0; r < 2; r++) {
            model_build_tp(&m[r], &c, KG, B, T, 1, 1, 1, 0,
                           (ModelMem){r ? ACT_SELECTIVE : ACT_NONE, 0, 0, 0, 0, RC_ATTENTION | RC_NORM | RC_MLP_ACT, 0, 0, 0});
            if (!r) m[r].recompute = RC_MLP_ACT; /* nothing dropped (carved above): only the forward's GELU kernel */
            model_init_random(&m[r], 0.02f, 7);
            KG->zero(m[r].grads, m[r].n_params * sizeof(float));
            m[r].loss_scale = 1.0f / N;
            loss[r] = model_forward(&m[r], tok, tgt);
            model_backward(&m[r], 1.0f / N);
            h[r] = malloc_check(m[r].n_params * sizeof(float));
            KG->to_host(h[r], m[r].grads, m[r].n_params * sizeof(float));
        }
        const LayerActs *a = m[1].la, *k = m[0].la;
        const int shared = a[1].ln1 == a[0].ln1 && a[1].ln2 == a[0].ln2 && a[1].atty == a[0].atty &&
                           a[1].fch_act == a[0].fch_act && a[1].fch != a[0].fch && a[1].qkv != a[0].qkv;
        const int kept = k[1].ln1 != k[0].ln1 && k[1].fch_act != k[0].fch_act && k[1].atty != k[0].atty;
        const int same = same_floats(h[0], h[1], m[0].n_params) && loss[0] == loss[1];
        const int ok = same && shared && kept;
        printf("%s model recompute of attention, norm and mlp_act (%s): loss %.9g vs %.9g, gradients %s; "
               "recomputed buffers %s between layers, kept ones per layer%s\n", ok ? "ok  " : "FAIL",
               llama ? "Llama" : "GPT-2", (double)loss[1], (double)loss[0], same ? "==" : "differ", shared ? "shared" : "NOT shared",
               kept ? "" : " (NOT in the reference)");
        if (ok) pass++; else fail++;
        for (int r = 0; r < 2; r++) { free(h[r]); model_free(&m[r]); }
    }
    kernels_cuda_set_attention("auto");
}

/* adamw_multi's sum of squares: against a double sum of the device's own
 * updated weights over the ranges with norm set (to 1e-12: the order
 * differs), and the CPU's (1e-6: the weights may differ in the last bit);
 * with no weights declared it keeps no copies (returns 0) */
static void check_sumsq(const char *name, const float *dev_p, const AdamWRange *r, int nr, double gsq, double csq,
                        int kept) {
    double want = 0;
    for (int i = 0; i < nr; i++) {
        if (!r[i].norm || !r[i].n) continue;
        float *h = malloc_check(r[i].n * sizeof(float));
        KG->to_host(h, dev_p + r[i].offset, r[i].n * sizeof(float));
        for (size_t j = 0; j < r[i].n; j++) want += (double)h[j] * h[j];
        free(h);
    }
    double rel = fabs(gsq - want) / want, relc = fabs(gsq - csq) / csq;
    int ok = rel < 1e-12 && relc < 1e-6 && kept == 0;
    printf("%s %-34s %.17g, its weights' %.17g (rel %.1e), the CPU's rel %.1e; returned %d\n", ok ? "ok  " : "FAIL", name,
           gsq, want, rel, relc, kept);
    if (ok) pass++; else fail++;
}

void test_adamw(void) {
    size_t n = 100003;
    float *p = hrand(n, 1), *g = hrand(n, 1), *m = hrand(n, 0.1f), *v = hrand(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *gp = dcopy(p, n), *gg = dcopy(g, n), *gm = dcopy(m, n), *gv = dcopy(v, n);
    KC->adamw(p, g, m, v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.8f);
    KG->adamw(gp, gg, gm, gv, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.8f);
    check("adamw p", p, gp, n, TOL_F32);
    check("adamw m", m, gm, n, TOL_F32);
    check("adamw v", v, gv, n, TOL_F32);
    AdamWRange r[4] = {{0, 1000, 0.1f, 1}, {1000, 0, 0.1f, 1}, {2000, 50000, 0.0f, 0}, {60000, 40003, 0.05f, 1}};
    double csq = 0, gsq = 0;
    KC->adamw_multi(p, g, m, v, r, 4, 1e-3f, 0.9f, 0.999f, 1e-8f, 7, 1.0f, &csq);
    int kept = KG->adamw_multi(gp, gg, gm, gv, r, 4, 1e-3f, 0.9f, 0.999f, 1e-8f, 7, 1.0f, &gsq);
    check_sumsq("adamw_multi sum of squares", gp, r, 4, gsq, csq, kept);
    check("adamw_multi p", p, gp, n, TOL_F32);
    check("adamw_multi m", m, gm, n, TOL_F32);
    check("adamw_multi v", v, gv, n, TOL_F32);
    /* ranges off the 16-byte grid, ending inside a group of 4 and shorter
     * than one: against the CPU, and the same bits as the device's adamw
     * range by range (16-byte groups and single elements alike) */
    AdamWRange r2[4] = {{0, 998, 0.1f, 1}, {1000, 3, 0.0f, 1}, {1006, 50001, 0.05f, 0}, {60002, 40001, 0.1f, 1}};
    float *hp = malloc_check(n * sizeof(float)), *hm = malloc_check(n * sizeof(float)),
          *hv = malloc_check(n * sizeof(float));
    KG->to_host(hp, gp, n * sizeof(float));
    KG->to_host(hm, gm, n * sizeof(float));
    KG->to_host(hv, gv, n * sizeof(float));
    float *sp = dcopy(hp, n), *sm = dcopy(hm, n), *sv = dcopy(hv, n);
    KC->adamw_multi(p, g, m, v, r2, 4, 1e-3f, 0.9f, 0.999f, 1e-8f, 8, 0.9f, &csq);
    kept = KG->adamw_multi(gp, gg, gm, gv, r2, 4, 1e-3f, 0.9f, 0.999f, 1e-8f, 8, 0.9f, &gsq);
    check_sumsq("adamw_multi unaligned sum of squares", gp, r2, 4, gsq, csq, kept);
    for (int i = 0; i < 4; i++) {
        size_t o = r2[i].offset;
        KG->adamw(sp + o, gg + o, sm + o, sv + o, r2[i].n, 1e-3f, 0.9f, 0.999f, 1e-8f, r2[i].wd, 8, 0.9f);
    }
    check("adamw_multi unaligned p", p, gp, n, TOL_F32);
    check("adamw_multi unaligned m", m, gm, n, TOL_F32);
    check("adamw_multi unaligned v", v, gv, n, TOL_F32);
    KG->to_host(hp, sp, n * sizeof(float));
    KG->to_host(hm, sm, n * sizeof(float));
    KG->to_host(hv, sv, n * sizeof(float));
    check_bits("adamw_multi = adamw per range p", hp, gp, n);
    check_bits("adamw_multi = adamw per range m", hm, gm, n);
    check_bits("adamw_multi = adamw per range v", hv, gv, n);
    free(hp); free(hm); free(hv);
    /* more groups of 4 than the threads of the grid the sum of squares
     * caps (the blocks the device holds at once: 132 x 8 of 256 on the
     * emulation): each thread takes several */
    size_t nb = 2300003;
    float *bp = hrand(nb, 1), *bg = hrand(nb, 1), *bm = hrand(nb, 0.1f), *bv = hrand(nb, 0.1f);
    for (size_t i = 0; i < nb; i++) bv[i] = fabsf(bv[i]);
    float *hb[4] = {bp, bg, bm, bv}, *db[4];
    for (int i = 0; i < 4; i++) { /* freed below, not at the end with dcopy's */
        db[i] = KG->alloc(nb * sizeof(float));
        KG->from_host(db[i], hb[i], nb * sizeof(float));
    }
    float *gbp = db[0], *gbg = db[1], *gbm = db[2], *gbv = db[3];
    AdamWRange rb[2] = {{0, 1200000, 0.1f, 1}, {1200001, nb - 1200001, 0.0f, 1}};
    KC->adamw_multi(bp, bg, bm, bv, rb, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 2, 1.0f, &csq);
    kept = KG->adamw_multi(gbp, gbg, gbm, gbv, rb, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 2, 1.0f, &gsq);
    check_sumsq("adamw_multi 2.3M sum of squares", gbp, rb, 2, gsq, csq, kept);
    check("adamw_multi 2.3M p", bp, gbp, nb, TOL_F32);
    free(bp); free(bg); free(bm); free(bv);
    KG->free(gbp); KG->free(gbg); KG->free(gbm); KG->free(gbv);
}

/* AdamW over weights declared stable whose products were copied (an
 * unsharded model's step; kernels.h adamw_multi). Under bf16 it writes the
 * bf16 copy of every weight it updates beside it and returns 1: the copies
 * of the weights at multiples of 8 floats from the start become views of
 * one flat copy of the range (their own memory freed first), the next
 * product of them converts nothing and gives, bit for bit, what a fresh
 * conversion gives; a weight off that grid keeps a copy of its own, which
 * the update leaves stale (made again); a weight first read after the
 * update is a view made then; the weights' free takes it all. Under TF32
 * and fp32 nothing is kept and it returns 0. */
void test_adamw_weight_copies(void) {
    int N = 64, C = 96, OC = 80;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC, tot = 4 * nw + 16;
    /* a view, its own copy (off the 8-float grid), a view made later, a view
     * the update covers half of */
    size_t off[4] = {0, nw + 4, 2 * nw + 8, 3 * nw + 16};
    const int bf = act16();
    const double tol = bf ? TOL_FP32MM : tol_mm;
    float *inp = hrand(nx, 1), *w = hrand(tot, 0.1f), *g = hrand(tot, 1), *mo = hrand(tot, 0.01f),
          *vo = hrand(tot, 0.01f);
    for (size_t i = 0; i < tot; i++) vo[i] = fabsf(vo[i]);
    act_round(inp, nx);
    float *ginp = dcopy_act(inp, nx), *gw = KG->alloc(tot * sizeof(float)), *gg = dcopy(g, tot), *gm = dcopy(mo, tot),
          *gv = dcopy(vo, tot);
    KG->from_host(gw, w, tot * sizeof(float));
    float *gout[4], *out = malloc_check(no * sizeof(float)), *hw = malloc_check(tot * sizeof(float));
    for (int i = 0; i < 4; i++) gout[i] = KG->alloc(no * sizeof(float));
    long h0, m0, h, m;
    size_t b0, b;
    int step = 0;
    kernels_cuda_weight_cache_stats(&h0, &m0, &b0);
#define WC_EXPECT(what, dh, dm, db)                                                                                  do {                                                                                                                 kernels_cuda_weight_cache_stats(&h, &m, &b);                                                                     int ok_ = h - h0 == (bf ? (dh) : 0) && m - m0 == (bf ? (dm) : 0) && b - b0 == (bf ? (size_t)(db) : 0);           printf("%s adamw weight copies: %-30s hits +%ld, made +%ld, bytes +%zu\n", ok_ ? "ok  " : "FAIL", what,                   h - h0, m - m0, b - b0);                                                                                  if (ok_) pass++; else fail++;                                                                                } while (0)
    KG->weights_stable(gw, tot);
    KG->matmul_forward(gout[0], ginp, gw + off[0], NULL, N, C, OC);
    KG->matmul_forward(gout[0], ginp, gw + off[1], NULL, N, C, OC);
    KG->matmul_forward(gout[0], ginp, gw + off[3], NULL, N, C, OC);
    WC_EXPECT("three products: own copies", 0, 3, 3 * nw * 2);
    /* the third weight in two ranges, the second starting off the 4-float
     * grid: AdamW writes its copy an element at a time */
    AdamWRange r[5] = {{off[0], nw, 0.1f, 1},
                       {off[1], nw, 0.0f, 1},
                       {off[2], 2, 0.1f, 0},
                       {off[2] + 2, nw - 2, 0.1f, 0},
                       {off[3], nw / 2, 0.1f, 1}};
    double sq = 0;
    int kept = KG->adamw_multi(gw, gg, gm, gv, r, 5, 1e-2f, 0.9f, 0.95f, 1e-8f, ++step, 1.0f, &sq);
    printf("%s adamw weight copies: adamw_multi returned %d (expected %d)\n", kept == bf ? "ok  " : "FAIL", kept, bf);
    if (kept == bf) pass++; else fail++;
    WC_EXPECT("after AdamW: the flat copy", 0, 3, (tot + nw) * 2);
    /* no new declaration: what the trainer does after a 1 */
    for (int i = 0; i < 4; i++) KG->matmul_forward(gout[i], ginp, gw + off[i], NULL, N, C, OC);
    WC_EXPECT("products after it", 1, 6, (tot + nw) * 2);
    KG->to_host(hw, gw, tot * sizeof(float));
    act_round(hw, tot);
    const char *names[4] = {"adamw wcache: the view", "adamw wcache: own copy again", "adamw wcache: a later view",
                            "adamw wcache: half covered, again"};
    for (int i = 0; i < 4; i++) {
        KC->matmul_forward(out, inp, hw + off[i], NULL, N, C, OC);
        check(names[i], out, gout[i], no, tol);
    }
    /* declared again: the view converted afresh gives the same bits */
    KG->weights_stable(gw, tot);
    KG->matmul_forward(gout[3], ginp, gw + off[0], NULL, N, C, OC);
    WC_EXPECT("declared again: made afresh", 1, 7, (tot + nw) * 2);
    float *a = malloc_check(no * sizeof(float));
    KG->to_host(a, gout[0], no * sizeof(float));
    check_bits("adamw wcache: AdamW's copy = to_bf16", a, gout[3], no);
    /* a second update: the views it covers are current again (the third
     * written element by element), and hold what fresh conversions give */
    KG->adamw_multi(gw, gg, gm, gv, r, 4, 1e-2f, 0.9f, 0.95f, 1e-8f, ++step, 1.0f, NULL); /* not the half */
    KG->matmul_forward(gout[0], ginp, gw + off[0], NULL, N, C, OC);
    KG->matmul_forward(gout[2], ginp, gw + off[2], NULL, N, C, OC);
    WC_EXPECT("a second update", 3, 7, (tot + nw) * 2);
    KG->to_host(hw, gw, tot * sizeof(float));
    act_round(hw, tot);
    KC->matmul_forward(out, inp, hw + off[2], NULL, N, C, OC);
    check("adamw wcache: the later view updated", out, gout[2], no, tol);
    KG->weights_stable(gw, tot);
    KG->matmul_forward(gout[1], ginp, gw + off[0], NULL, N, C, OC);
    KG->matmul_forward(gout[3], ginp, gw + off[2], NULL, N, C, OC);
    WC_EXPECT("declared again: both afresh", 3, 9, (tot + nw) * 2);
    KG->to_host(a, gout[0], no * sizeof(float));
    check_bits("adamw wcache: 2nd copy = to_bf16", a, gout[1], no);
    KG->to_host(a, gout[2], no * sizeof(float));
    check_bits("adamw wcache: 1 by 1 copy = to_bf16", a, gout[3], no);
    KG->free(gw);
    WC_EXPECT("freed with the weights", 3, 9, 0);
#undef WC_EXPECT
    for (int i = 0; i < 4; i++) KG->free(gout[i]);
    free(inp); free(w); free(g); free(mo); free(vo); free(out); free(hw); free(a);
}

