/* test_gpu_layers.c — the CUDA backend's layer kernels other than the
 * GEMMs against the CPU's: the embedding (and its deterministic backward),
 * layernorm / rmsnorm with their fused forms, attention (gemm, flash,
 * cudnn), RoPE, QK-norm, the pointwise kernels and reductions, SwiGLU and the
 * cross-entropy. Run by tests/test_gpu's main (tests/test_gpu.c: the error
 * metric and the tolerances); helpers in tests/test_gpu.h. */
#include "kernels.h"
#include "test_gpu.h"
#include "util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void test_embed(void) {
    int B = 3, T = 37, C = 100, V = 211, N = B * T;
    int tok[3 * 37];
    for (int i = 0; i < N; i++) tok[i] = (int)(rnd_u32() % 40) * 5 % V; /* repeats */
    float *wte = hrand((size_t)V * C, 1), *wpe = hrand((size_t)T * C, 1), *dout = hrand((size_t)N * C, 1);
    int *dtok = dcopy_int(tok, N);
    float *gwte = dcopy(wte, (size_t)V * C), *gwpe = dcopy(wpe, (size_t)T * C), *gdout = dcopy(dout, (size_t)N * C);
    float *out = hrand((size_t)N * C, 1), *gout = dcopy(out, (size_t)N * C);
    KC->embed_forward(out, tok, NULL, wte, wpe, N, T, C);
    KG->embed_forward(gout, dtok, NULL, gwte, gwpe, N, T, C);
    check("embed_forward", out, gout, (size_t)N * C, TOL_F32);
    KC->embed_forward(out, tok, NULL, wte, NULL, N, T, C);
    KG->embed_forward(gout, dtok, NULL, gwte, NULL, N, T, C);
    check("embed_forward (no wpe)", out, gout, (size_t)N * C, TOL_F32);
    int *pos = doc_positions(B, T), *dpos = dcopy_int(pos, N);
    KC->embed_forward(out, tok, pos, wte, wpe, N, T, C);
    KG->embed_forward(gout, dtok, dpos, gwte, gwpe, N, T, C);
    check("embed_forward (reset positions)", out, gout, (size_t)N * C, TOL_F32);
    float *dwte = hrand((size_t)V * C, 1), *dwpe = hrand((size_t)T * C, 1);
    float *gdwte = dcopy(dwte, (size_t)V * C), *gdwpe = dcopy(dwpe, (size_t)T * C);
    KC->embed_backward(dwte, dwpe, dout, tok, NULL, N, T, C);
    KG->embed_backward(gdwte, gdwpe, gdout, dtok, NULL, N, T, C);
    check("embed_backward dwte", dwte, gdwte, (size_t)V * C, TOL_F32);
    check("embed_backward dwpe", dwpe, gdwpe, (size_t)T * C, TOL_F32);
    KC->embed_backward(dwte, dwpe, dout, tok, pos, N, T, C);
    KG->embed_backward(gdwte, gdwpe, gdout, dtok, dpos, N, T, C);
    check("embed_backward dwpe (reset positions)", dwpe, gdwpe, (size_t)T * C, TOL_F32);
    /* vocabulary rows [v0, v0 + Vl) only */
    int v0 = 60, Vl = 80;
    float *wl = hrand((size_t)Vl * C, 1), *gwl = dcopy(wl, (size_t)Vl * C);
    KC->embed_forward_vp(out, tok, NULL, wl, wpe, N, T, C, v0, Vl);
    KG->embed_forward_vp(gout, dtok, NULL, gwl, gwpe, N, T, C, v0, Vl);
    check("embed_forward_vp", out, gout, (size_t)N * C, TOL_F32);
    KC->embed_forward_vp(out, tok, pos, wl, wpe, N, T, C, v0, Vl);
    KG->embed_forward_vp(gout, dtok, dpos, gwl, gwpe, N, T, C, v0, Vl);
    check("embed_forward_vp (reset positions)", out, gout, (size_t)N * C, TOL_F32);
    float *dwl = hrand((size_t)Vl * C, 1), *gdwl = dcopy(dwl, (size_t)Vl * C);
    KC->embed_backward_vp(dwl, NULL, dout, tok, NULL, N, T, C, v0, Vl);
    KG->embed_backward_vp(gdwl, NULL, gdout, dtok, NULL, N, T, C, v0, Vl);
    check("embed_backward_vp dwte", dwl, gdwl, (size_t)Vl * C, TOL_F32);
    free(pos);
}


/* The embedding backward is deterministic: on heavily repeated tokens two
 * calls on the same inputs give the same bits, and, since every gradient row
 * adds its dout rows in the CPU's order (increasing row), the CPU's bits.
 * Tokens from a vocabulary of `vocab` (skewed: every fourth token from its
 * first 50 ids), the vocab-parallel slice [v0, v0 + Vl) when Vl > 0; reset:
 * positions counted from documents' starts (doc_positions; dwpe through the
 * sort, as dwte), else n % T. */
void test_embed_det(int B, int T, int C, int vocab, int v0, int Vl, int reset) {
    int N = B * T, rows = Vl > 0 ? Vl : vocab;
    char name[96];
    int *tok = malloc_check((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tok[i] = (int)(rnd_u32() % 4 == 0 ? rnd_u32() % (vocab < 50 ? vocab : 50) : rnd_u32() % vocab);
    float *dout = hrand((size_t)N * C, 1), *dwte = hrand((size_t)rows * C, 1), *dwpe = hrand((size_t)T * C, 1);
    int *gtok = dcopy_int(tok, N), *pos = reset ? doc_positions(B, T) : NULL, *gpos = pos ? dcopy_int(pos, N) : NULL;
    float *gdout = dcopy(dout, (size_t)N * C);
    float *g1 = dcopy(dwte, (size_t)rows * C), *g2 = dcopy(dwte, (size_t)rows * C);
    float *p1 = dcopy(dwpe, (size_t)T * C), *p2 = dcopy(dwpe, (size_t)T * C);
    if (Vl > 0) {
        KC->embed_backward_vp(dwte, dwpe, dout, tok, pos, N, T, C, v0, Vl);
        KG->embed_backward_vp(g1, p1, gdout, gtok, gpos, N, T, C, v0, Vl);
        KG->embed_backward_vp(g2, p2, gdout, gtok, gpos, N, T, C, v0, Vl);
    } else {
        KC->embed_backward(dwte, dwpe, dout, tok, pos, N, T, C);
        KG->embed_backward(g1, p1, gdout, gtok, gpos, N, T, C);
        KG->embed_backward(g2, p2, gdout, gtok, gpos, N, T, C);
    }
    const char *vp = Vl > 0 ? (reset ? " vp reset" : " vp") : (reset ? " reset" : "");
    snprintf(name, sizeof name, "embed_bwd%s dwte N%d V%d", vp, N, vocab);
    check(name, dwte, g1, (size_t)rows * C, TOL_F32);
    snprintf(name, sizeof name, "embed_bwd%s dwpe N%d V%d", vp, N, vocab);
    check(name, dwpe, p1, (size_t)T * C, TOL_F32);
    float *h1 = malloc_check((size_t)rows * C * sizeof(float)), *q1 = malloc_check((size_t)T * C * sizeof(float));
    KG->to_host(h1, g1, (size_t)rows * C * sizeof(float));
    KG->to_host(q1, p1, (size_t)T * C * sizeof(float));
    snprintf(name, sizeof name, "embed_bwd%s run twice dwte N%d V%d", vp, N, vocab);
    check_bits(name, h1, g2, (size_t)rows * C);
    snprintf(name, sizeof name, "embed_bwd%s run twice dwpe N%d V%d", vp, N, vocab);
    check_bits(name, q1, p2, (size_t)T * C);
    snprintf(name, sizeof name, "embed_bwd%s = CPU bits dwte N%d V%d", vp, N, vocab);
    check_bits(name, dwte, g1, (size_t)rows * C);
    snprintf(name, sizeof name, "embed_bwd%s = CPU bits dwpe N%d V%d", vp, N, vocab);
    check_bits(name, dwpe, p1, (size_t)T * C);
    free(tok); free(dout); free(dwte); free(dwpe); free(h1); free(q1); free(pos);
}

/* The norms against the CPU. The backward's one-pass form
 * (kernels_cuda_fused_norm_bwd_calls) must run for every width whose
 * accumulators fit in a block's shared memory, in the form expected
 * (NBW_*: float4 with a thread's columns in registers, float4 reading the
 * row twice, the scalar loop for a width not a multiple of 4, or none), and
 * a second call from the same values must give the same bits (no atomics).
 * Shapes: one block; several rows a block over 75 blocks; the 1024-block
 * cap with a ragged last block and threads without a column; 1, 2 and 4
 * float4 a thread, up to the widest; the re-reading form, ragged, then with
 * over 48 KB of shared memory; too wide for the one-pass form. */
void test_norms_case(int N, int C, int form) {
    char name[96];
    size_t NC = (size_t)N * C;
    float *x = hrand(NC, 2), *w = hrand(C, 1), *b = hrand(C, 1), *dout = hrand(NC, 1);
    for (size_t i = 0; i < NC; i++) x[i] += 3.0f; /* a mean away from zero */
    float *gx = dcopy(x, NC), *gw = dcopy(w, C), *gb = dcopy(b, C), *gdout = dcopy(dout, NC);
    float *out = hrand(NC, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1);
    float *gout = dcopy_act(out, NC), *gmean = dcopy(mean, N), *grstd = dcopy(rstd, N);
    const long fw0 = kernels_cuda_vec_norm_fwd_calls();
    KC->layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5f);
    KG->layernorm_forward(gout, gmean, grstd, gx, gw, gb, N, C, 1e-5f);
    snprintf(name, sizeof name, "layernorm_fwd out %dx%d", N, C);
    check_act_rn_sum(name, out, gout, NC);
    check("layernorm_forward mean", mean, gmean, N, TOL_F32);
    check("layernorm_forward rstd", rstd, grstd, N, TOL_F32);
    float *dinp = hrand(NC, 1), *dw = hrand(C, 1), *db = hrand(C, 1);
    float *gdinp = dcopy(dinp, NC), *gdw = dcopy(dw, C), *gdb = dcopy(db, C);
    float *gdinp2 = dcopy(dinp, NC), *gdw2 = dcopy(dw, C), *gdb2 = dcopy(db, C);
    long f0 = kernels_cuda_fused_norm_bwd_calls(), v0 = kernels_cuda_vec_norm_bwd_calls(0),
         v1 = kernels_cuda_vec_norm_bwd_calls(1);
    KC->layernorm_backward(dinp, NULL, dw, db, dout, x, w, mean, rstd, N, C);
    KG->layernorm_backward(gdinp, NULL, gdw, gdb, gdout, gx, gw, gmean, grstd, N, C);
    KG->layernorm_backward(gdinp2, NULL, gdw2, gdb2, gdout, gx, gw, gmean, grstd, N, C);
    long fl = kernels_cuda_fused_norm_bwd_calls() - f0;
    const char *how = fl ? "one pass" : "three kernels";
    snprintf(name, sizeof name, "layernorm_bwd dinp %dx%d (%s)", N, C, how);
    check(name, dinp, gdinp, NC, TOL_F32);
    snprintf(name, sizeof name, "layernorm_bwd dw %dx%d", N, C);
    check(name, dw, gdw, C, TOL_F32);
    snprintf(name, sizeof name, "layernorm_bwd db %dx%d", N, C);
    check(name, db, gdb, C, TOL_F32);
    float *h = malloc_check(NC * sizeof(float) + 16);
    KG->to_host(h, gdinp, NC * sizeof(float));
    size_t bad = bits_differ(h, gdinp2, NC);
    KG->to_host(h, gdw, C * sizeof(float));
    bad += bits_differ(h, gdw2, C);
    KG->to_host(h, gdb, C * sizeof(float));
    bad += bits_differ(h, gdb2, C);
    printf("%s layernorm_bwd %dx%d run twice: %zu words differ\n", bad ? "FAIL" : "ok  ", N, C, bad);
    if (bad) fail++; else pass++;

    KC->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    KG->rmsnorm_forward(gout, grstd, gx, gw, N, C, 1e-5f);
    snprintf(name, sizeof name, "rmsnorm_fwd out %dx%d", N, C);
    check_act_rn_sum(name, out, gout, NC);
    check("rmsnorm_forward rstd", rstd, grstd, N, TOL_F32);
    /* both device runs from the CPU's values */
    KG->from_host(gdinp, dinp, NC * sizeof(float));
    KG->from_host(gdinp2, dinp, NC * sizeof(float));
    KG->from_host(gdw, dw, C * sizeof(float));
    KG->from_host(gdw2, dw, C * sizeof(float));
    KC->rmsnorm_backward(dinp, NULL, dw, dout, x, w, rstd, N, C);
    KG->rmsnorm_backward(gdinp, NULL, gdw, gdout, gx, gw, grstd, N, C);
    KG->rmsnorm_backward(gdinp2, NULL, gdw2, gdout, gx, gw, grstd, N, C);
    fl = kernels_cuda_fused_norm_bwd_calls() - f0;
    snprintf(name, sizeof name, "rmsnorm_bwd dinp %dx%d", N, C);
    check(name, dinp, gdinp, NC, TOL_F32);
    snprintf(name, sizeof name, "rmsnorm_bwd dw %dx%d", N, C);
    check(name, dw, gdw, C, TOL_F32);
    KG->to_host(h, gdinp, NC * sizeof(float));
    bad = bits_differ(h, gdinp2, NC);
    KG->to_host(h, gdw, C * sizeof(float));
    bad += bits_differ(h, gdw2, C);
    printf("%s rmsnorm_bwd %dx%d run twice: %zu words differ\n", bad ? "FAIL" : "ok  ", N, C, bad);
    if (bad) fail++; else pass++;
    const long regs = kernels_cuda_vec_norm_bwd_calls(0) - v0, reread = kernels_cuda_vec_norm_bwd_calls(1) - v1;
    static const char *const form_name[] = {"none: too wide for shared memory", "scalar", "float4, columns in registers",
                                            "float4, row read twice"};
    int ok = fl == (form == NBW_NONE ? 0 : 4) && regs == (form == NBW_REGS ? 4 : 0) &&
             reread == (form == NBW_REREAD ? 4 : 0);
    const long fwv = kernels_cuda_vec_norm_fwd_calls() - fw0, fw_want = C % 4 == 0 ? 2 : 0;
    printf("%s norm forward %dx%d: %ld of 2 calls 16 bytes at a time (expected %ld)\n", fwv == fw_want ? "ok  " : "FAIL",
           N, C, fwv, fw_want);
    if (fwv == fw_want) pass++; else fail++;
    printf("%s norm backward %dx%d: %ld of 4 calls in one pass, %ld float4 in registers, %ld float4 read twice "
           "(expected %s)\n",
           ok ? "ok  " : "FAIL", N, C, fl, regs, reread, form_name[form]);
    if (ok) pass++; else fail++;
    free(h); free(x); free(w); free(b); free(dout); free(out); free(mean); free(rstd); free(dinp); free(dw); free(db);
}


/* A norm backward's dinp_a (kernels.h): dinp's final values as [a]. With it
 * dinp, dw and db keep the bits of the same call without it, and dinp_a
 * (started full of other values) holds dinp rounded to nearest even under
 * bf16 (dinp itself under fp32 [a]), every element. Under bf16 the float4
 * forms write it from the registers that hold dinp
 * (kernels_cuda_fused_dinp_a_calls: vec), the others convert dinp after;
 * off: dinp_a one element off 8-byte alignment, converted after. */
void test_norm_dinp_a_case(int N, int C, int vec, int off) {
    size_t NC = (size_t)N * C;
    float *x = hrand(NC, 2), *w = hrand(C, 1), *dout = hrand(NC, 1), *dinp = hrand(NC, 1), *dw = hrand(C, 1);
    float *db = hrand(C, 1), *mean = hrand(N, 0.1f), *rstd = hrand(N, 0.2f), *other = hrand(NC, 5);
    for (int i = 0; i < N; i++) rstd[i] = 0.5f + fabsf(rstd[i]);
    float *gx = dcopy(x, NC), *gw = dcopy(w, C), *gdout = dcopy(dout, NC), *gmean = dcopy(mean, N);
    float *grstd = dcopy(rstd, N), *h = malloc_check(NC * sizeof(float) + 16), *hw = malloc_check(2 * C * sizeof(float));
    for (int ln = 0; ln < 2; ln++) {
        float *gd0 = dcopy(dinp, NC), *gd1 = dcopy(dinp, NC), *gw0 = dcopy(dw, C), *gw1 = dcopy(dw, C);
        float *gb0 = dcopy(db, C), *gb1 = dcopy(db, C), *ga = dcopy_act_off(other, NC, off);
        const long f0 = kernels_cuda_fused_dinp_a_calls();
        if (ln) {
            KG->layernorm_backward(gd0, NULL, gw0, gb0, gdout, gx, gw, gmean, grstd, N, C);
            KG->layernorm_backward(gd1, ga, gw1, gb1, gdout, gx, gw, gmean, grstd, N, C);
        } else {
            KG->rmsnorm_backward(gd0, NULL, gw0, gdout, gx, gw, grstd, N, C);
            KG->rmsnorm_backward(gd1, ga, gw1, gdout, gx, gw, grstd, N, C);
        }
        const long fused = kernels_cuda_fused_dinp_a_calls() - f0, want = act16() && vec && !off;
        KG->to_host(hw, gw0, C * sizeof(float));
        KG->to_host(hw + C, gb0, C * sizeof(float));
        size_t same = bits_differ(hw, gw1, C) + (ln ? bits_differ(hw + C, gb1, C) : 0);
        KG->to_host(h, gd0, NC * sizeof(float));
        same += bits_differ(h, gd1, NC);
        act_round(h, NC);
        float *ha = act_to_host(ga, NC);
        size_t bad = 0;
        for (size_t i = 0; i < NC; i++) bad += memcmp(&h[i], &ha[i], 4) != 0;
        const int ok = !same && !bad && fused == want;
        printf("%s %s_bwd %dx%d dinp_a%s: %zu of %zu elements differ from dinp as [a], %zu words of dinp / dw / db "
               "from the call without it; %s (expected %s)\n", ok ? "ok  " : "FAIL", ln ? "layernorm" : "rmsnorm", N, C,
               off ? " one element off" : "", bad, NC, same, fused ? "in the pass" : "converted after",
               want ? "in the pass" : "converted after");
        if (ok) pass++; else fail++;
        free(ha);
    }
    free(x); free(w); free(dout); free(dinp); free(dw); free(db); free(mean); free(rstd); free(other); free(h); free(hw);
}


/* the residual add fused with the norm: res = a + b (exact), out and the
 * statistics as the CPU's fused kernel; in place (res = a) for rmsnorm */
void test_add_norms(int N, int C) {
    size_t NC = (size_t)N * C;
    char name[96];
    const long fw0 = kernels_cuda_vec_norm_fwd_calls();
    float *a = hrand(NC, 2), *b = hrand(NC, 1), *w = hrand(C, 1), *bias = hrand(C, 1);
    for (size_t i = 0; i < NC; i++) a[i] += 3.0f;
    float *ga = dcopy(a, NC), *gb = dcopy(b, NC), *gw = dcopy(w, C), *gbias = dcopy(bias, C);
    float *res = hrand(NC, 1), *out = hrand(NC, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1);
    float *gres = dcopy(res, NC), *gout = dcopy_act(out, NC), *gmean = dcopy(mean, N), *grstd = dcopy(rstd, N);
    KC->add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, 1e-5f);
    KG->add_layernorm_forward(gres, gout, gmean, grstd, ga, gb, gw, gbias, N, C, 1e-5f);
    snprintf(name, sizeof name, "add_layernorm_forward res %dx%d", N, C);
    check(name, res, gres, NC, 0.0);
    snprintf(name, sizeof name, "add_layernorm_forward out %dx%d", N, C);
    check_act_rn_sum(name, out, gout, NC);
    snprintf(name, sizeof name, "add_layernorm_forward mean %dx%d", N, C);
    check(name, mean, gmean, N, TOL_F32);
    snprintf(name, sizeof name, "add_layernorm_forward rstd %dx%d", N, C);
    check(name, rstd, grstd, N, TOL_F32);
    KC->add_rmsnorm_forward(a, out, rstd, a, b, w, N, C, 1e-5f);
    KG->add_rmsnorm_forward(ga, gout, grstd, ga, gb, gw, N, C, 1e-5f);
    snprintf(name, sizeof name, "add_rmsnorm_forward res in place %dx%d", N, C);
    check(name, a, ga, NC, 0.0);
    snprintf(name, sizeof name, "add_rmsnorm_forward out %dx%d", N, C);
    check_act_rn_sum(name, out, gout, NC);
    snprintf(name, sizeof name, "add_rmsnorm_forward rstd %dx%d", N, C);
    check(name, rstd, grstd, N, TOL_F32);
    const long fwv = kernels_cuda_vec_norm_fwd_calls() - fw0, fw_want = C % 4 == 0 ? 2 : 0;
    printf("%s add + norm forward %dx%d: %ld of 2 calls 16 bytes at a time (expected %ld)\n",
           fwv == fw_want ? "ok  " : "FAIL", N, C, fwv, fw_want);
    if (fwv == fw_want) pass++; else fail++;
}

/* Attention under mode "gemm", "flash" or "cudnn" (kernels_cuda_set_attention)
 * against the CPU kernel: out, lse and dqkv (added into random values).
 * flash: the fused kernels must have run for head dims 32/64/128 (and not
 * for others, which take the GEMMs), and two backward calls on the same
 * inputs must give the same bits. cudnn: cuDNN must have run both calls
 * for head dims 64 and 128 (the models' shapes); for other multiples of 8
 * it may decline a shape (a note, and the fused kernels' result is held to
 * their tolerance); its backward accumulates dQ in any order, so no
 * bit-for-bit repeat. doclen > 0: a block-causal mask (qstart) of
 * documents 1..doclen long, the same on both backends; cuDNN's graphs are
 * causal only, so under cudnn the fused kernels must run instead. */
static void test_attention_case(const char *mode, int B, int T, int nh, int nkv, int hd, int doclen) {
    char name[128], shape[80];
    int S = (nh + 2 * nkv) * hd, OS = nh * hd;
    int flash = strcmp(mode, "flash") == 0, dnn = strcmp(mode, "cudnn") == 0;
    int fusable = hd == 32 || hd == 64 || hd == 128, fused = flash && fusable;
    int dn_may = dnn && !doclen && hd % 8 == 0 && hd <= 128, dn_must = dn_may && (hd == 64 || hd == 128);
    int *qs = NULL, *gqs = NULL;
    if (doclen) {
        qs = malloc_check((size_t)B * T * sizeof(int));
        uint64_t r = 0x9e3779b97f4a7c15ull * (uint64_t)(T + doclen);
        for (int b = 0; b < B; b++)
            for (int t = 0, s0 = 0, end = -1; t < T; t++) {
                if (t > end) { /* a new document, 1..doclen tokens */
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    s0 = t;
                    end = t + (int)((r >> 33) % (uint64_t)doclen);
                }
                qs[b * T + t] = s0;
            }
        gqs = dcopy_int(qs, (size_t)B * T);
    }
    size_t nqkv = (size_t)B * T * S, nout = (size_t)B * T * OS, nlse = (size_t)B * nh * T;
    kernels_cuda_set_attention(mode);
    float *qkv = hrand(nqkv, 1), *dout = hrand(nout, 1);
    /* qkv and dout are [a]: under bf16 the CPU starts from the device's
     * bf16 values */
    float *gqkv = dcopy_act(qkv, nqkv), *gdout = dcopy_act(dout, nout);
    act_round(qkv, nqkv);
    act_round(dout, nout);
    float *out = hrand(nout, 1), *lse = hrand(nlse, 1);
    float *gout = dcopy_act(out, nout), *glse = dcopy(lse, nlse);
    long calls0 = kernels_cuda_flash_attention_calls(), dn0 = kernels_cuda_cudnn_attention_calls();
    KC->attention_forward(out, lse, qkv, qs, B, T, nh, nkv, hd);
    KG->attention_forward(gout, glse, gqkv, gqs, B, T, nh, nkv, hd);
    /* dqkv is [a] (overwritten: starts as other values) */
    float *dqkv = hrand(nqkv, 1), *gdqkv = dcopy_act(dqkv, nqkv), *gdqkv2 = flash ? dcopy_act(dqkv, nqkv) : NULL;
    KC->attention_backward(dqkv, dout, qkv, out, lse, qs, B, T, nh, nkv, hd);
    KG->attention_backward(gdqkv, gdout, gqkv, gout, glse, gqs, B, T, nh, nkv, hd);
    long calls = kernels_cuda_flash_attention_calls() - calls0, dn = kernels_cuda_cudnn_attention_calls() - dn0;
    /* what ran decides the tolerance: cuDNN and the bf16 fused kernels
     * round Q, K, V, dO, P and dS to bf16 */
    if (dnn && dn == 0 && fusable) fused = 1;
    double tol = dn > 0 || (fused && tol_mm == TOL_BF16) ? TOL_BF16 : tol_att;
    snprintf(shape, sizeof shape, "%s%s B%d T%d h%d/%d hd%d%s", mode,
             dnn ? (dn == 2 ? "" : dn_may ? "(declined)" : "(not taken)") : flash && !fused ? "(GEMMs)" : "", B, T,
             nh, nkv, hd, doclen ? " block-causal" : "");
    snprintf(name, sizeof name, "attention_fwd out %s", shape);
    check_act(name, out, gout, nout, tol);
    /* lse is a logarithm: an error d scales the probabilities by e^d, so
     * it is held to tol absolutely where every |lse| is below 1 (T = 1 has
     * lse = the one score, whose bf16 rounding error is no smaller for
     * being a small number) */
    snprintf(name, sizeof name, "attention_fwd lse %s", shape);
    check_floor(name, lse, glse, nlse, tol, 1.0);
    /* bf16 [a] dqkv: each gradient also rounded once where it is stored */
    snprintf(name, sizeof name, "attention_bwd dqkv %s%s", shape, act16() ? " (bf16 [a])" : "");
    check_act(name, dqkv, gdqkv, nqkv, act16() && tol < TOL_BF16 ? TOL_BF16 : tol);
    if (dnn && doclen) {
        int ok = dn == 0 && calls == (fusable ? 2 : 0);
        printf("%s attention %s: %ld of 2 calls ran cuDNN (expected 0), %ld the fused kernels (expected %d)\n",
               ok ? "ok  " : "FAIL", shape, dn, calls, fusable ? 2 : 0);
        if (ok) pass++; else fail++;
    } else if (dnn) {
        int ok = dn_must ? dn == 2 : dn_may ? dn == 0 || dn == 2 : dn == 0;
        printf("%s attention %s: %ld of 2 calls ran cuDNN%s\n", ok ? "ok  " : "FAIL", shape, dn,
               dn_must ? " (expected 2)" : dn_may ? (dn ? "" : ": note: cuDNN declined this shape") : " (expected 0)");
        if (ok) pass++; else fail++;
    } else if (flash) {
        int ok = calls == (fused ? 2 : 0) && dn == 0;
        printf("%s attention %s: %ld of 2 calls ran the fused kernels (expected %d)\n", ok ? "ok  " : "FAIL", shape,
               calls, fused ? 2 : 0);
        if (ok) pass++; else fail++;
        /* deterministic: the same bits again from the same starting values */
        const size_t words = act16() ? nqkv / 2 : nqkv; /* [a]: nqkv is even */
        float *h1 = malloc_check(words * sizeof(float));
        KG->to_host(h1, gdqkv, words * sizeof(float));
        KG->attention_backward(gdqkv2, gdout, gqkv, gout, glse, gqs, B, T, nh, nkv, hd);
        snprintf(name, sizeof name, "attention_bwd twice %s", shape);
        check_bits(name, h1, gdqkv2, words);
        free(h1);
    } else if (calls != 0 || dn != 0) {
        printf("FAIL attention %s ran the fused kernels or cuDNN in gemm mode\n", shape);
        fail++;
    }
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(qs);
}

void test_attention(void) {
    static const int cases[][6] = {
        /* B, T, nh, nkv, hd, block-causal documents up to this long (0: causal) */
        {3, 40, 4, 2, 16, 0},    /* GQA, batched over 3 sequences (flash: takes the GEMMs) */
        {1, 64, 4, 2, 16, 0},    /* GQA, one sequence (unbatched GEMMs) */
        {2, 130, 6, 6, 32, 0},   /* MHA, T past two 64-row tiles */
        {1, 17, 8, 1, 8, 0},     /* MQA, T not a multiple of anything */
        {2, 200, 4, 2, 64, 0},   /* GQA, ragged last tile, B > 1 */
        {1, 256, 4, 1, 64, 0},   /* MQA, T a multiple of the tile */
        {2, 100, 4, 4, 128, 0},  /* MHA, head dim 128 (32-wide key tiles), ragged */
        {1, 97, 8, 2, 128, 0},   /* GQA groups of 4, head dim 128 */
        {1, 1, 2, 1, 64, 0},     /* a single token */
        {2, 1024, 12, 12, 64, 0}, /* GPT-2 124M's attention shape at B = 2 */
        {1, 1000, 8, 2, 128, 0}, /* Llama-like, ragged */
        /* block-causal (train.attention_mask): documents inside and across tiles */
        {2, 130, 6, 6, 32, 50},  /* MHA, documents across 64-row tiles */
        {1, 40, 4, 2, 16, 9},    /* head dim 16 (flash: the GEMMs' softmax kernels) */
        {2, 200, 4, 2, 64, 70},  /* GQA, ragged last tile */
        {1, 256, 4, 1, 64, 150}, /* MQA, long documents: key tiles skipped whole */
        {1, 192, 4, 2, 64, 1},   /* every token its own document */
        {2, 100, 4, 4, 128, 30}, /* head dim 128 (32-wide tiles) */
        {1, 1000, 8, 2, 128, 300}, /* Llama-like */
    };
    const char *modes[3] = {"gemm", "flash", "cudnn"};
    /* TEST_GPU_MAX_T: leave out the longer sequences (the host emulation of
     * tests/cuda_emu runs the shapes up to 256, which cover every tiling
     * case; the GPU suite runs them all) */
    const char *mt = getenv("TEST_GPU_MAX_T");
    int max_T = mt && *mt ? atoi(mt) : 1 << 30, left_out = 0;
    for (int m = 0; m < 3; m++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (cases[i][1] > max_T) {
                left_out++;
                continue;
            }
            test_attention_case(modes[m], cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], cases[i][5]);
        }
    if (left_out) printf("note attention: %d cases with T > %d left out (TEST_GPU_MAX_T)\n", left_out, max_T);
    /* the header line names the mode; auto is cudnn under bf16 GEMMs, else flash */
    kernels_cuda_set_attention("flash");
    int ok = strstr(kernels_cuda_device_info(), "attention flash") != NULL;
    /* under bf16 GEMMs the fused attention is the bf16 mma.sync kernels */
    ok = ok && (tol_mm == TOL_BF16) == (strstr(kernels_cuda_device_info(), "bf16 tensor cores through mma.sync") != NULL);
    kernels_cuda_set_attention("gemm");
    ok = ok && strstr(kernels_cuda_device_info(), "attention gemm") != NULL;
    kernels_cuda_set_attention("cudnn");
    ok = ok && strstr(kernels_cuda_device_info(), "attention cudnn (cuDNN ") != NULL;
    kernels_cuda_set_attention("auto");
    ok = ok && strstr(kernels_cuda_device_info(), tol_mm == TOL_BF16 ? "attention cudnn" : "attention flash") != NULL;
    printf("%s kernels_cuda_device_info names the attention mode (flash, gemm, cudnn, auto)\n", ok ? "ok  " : "FAIL");
    if (ok) pass++; else fail++;
    kernels_cuda_set_attention("auto");
}


/* One RoPE shape under four scalings. The device's 16-byte form (head_dim a
 * multiple of 16, qkv 16-byte aligned: kernels_cuda_vec_pointwise_calls)
 * must give the CPU's values rounded as the element-at-a-time form's, and
 * the very bits that form gives on a copy one element off the 16-byte grid
 * (which must take it). */
static void test_rope_shape(int B, int T, int nh, int nkv, int hd) {
    int S = (nh + 2 * nkv) * hd;
    size_t n = (size_t)B * T * S;
    /* rope_forward's qkv and rope_backward's dqkv are [a]: under bf16 the
     * device rotates the bf16 words in fp32 and rounds each once, the CPU
     * the same rounded values. Unscaled (the backward at another theta),
     * then Llama 3's scaling (hd 16: kept, blended and divided frequencies),
     * then linear scaling (position interpolation), then YaRN. */
    const Rope plain = {.theta = 10000.0f, .scaling = ROPE_NONE}, plain5 = {.theta = 500000.0f, .scaling = ROPE_NONE};
    const Rope llama3 = {.theta = 500000.0f, .scaling = ROPE_LLAMA3, .factor = 32.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_max_seq_len = 256};
    const Rope linear = {.theta = 10000.0f, .scaling = ROPE_LINEAR, .factor = 4.0f};
    /* YaRN by 4 over an original context of 256 (hd 16: kept, blended and
     * divided frequencies), the ends not rounded, cos and sin times 1.1386 */
    const Rope yarn = {.theta = 10000.0f, .scaling = ROPE_YARN, .factor = 4.0f, .original_max_seq_len = 256,
                       .beta_fast = 32.0f, .beta_slow = 1.0f, .truncate = 0};
    /* positions: each row's (NULL), documents' (reset), and documents' with
     * row b's shifted by 3000 b (angles of thousands of radians) */
    int *reset = doc_positions(B, T), *far = doc_positions(B, T);
    for (int i = 0; i < B * T; i++) far[i] += 3000 * (i / T);
    int *greset = dcopy_int(reset, (size_t)B * T), *gfar = dcopy_int(far, (size_t)B * T);
    const struct { const char *tag; const Rope *fwd, *bwd; const int *pos_fwd, *pos_bwd, *gpos_fwd, *gpos_bwd; } cases[] = {
        {"positions: the rows' forward, the documents' backward", &plain, &plain5, NULL, reset, NULL, greset},
        {"llama3 scaling, positions to 3000+", &llama3, &llama3, far, far, gfar, gfar},
        {"linear scaling by 4, document positions", &linear, &linear, reset, reset, greset, greset},
        {"yarn by 4, positions to 3000+", &yarn, &yarn, far, far, gfar, gfar}};
    const int vec = hd % 16 == 0;
    long forms = 0, forms_off = 0, calls = 0;
    float *x = hrand(n, 1);
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        char name[192];
        for (int dir = 0; dir < 2; dir++) {
            const char *what = dir ? "rope_backward" : "rope_forward";
            float *gx = dcopy_act(x, n), *gxo = dcopy_act_off(x, n, 1);
            act_round(x, n);
            const long v0 = kernels_cuda_vec_pointwise_calls();
            if (dir) {
                KC->rope_backward(x, cases[c].pos_bwd, B, T, nh, nkv, hd, cases[c].bwd);
                KG->rope_backward(gx, cases[c].gpos_bwd, B, T, nh, nkv, hd, cases[c].bwd);
            } else {
                KC->rope_forward(x, cases[c].pos_fwd, B, T, nh, nkv, hd, cases[c].fwd);
                KG->rope_forward(gx, cases[c].gpos_fwd, B, T, nh, nkv, hd, cases[c].fwd);
            }
            forms += kernels_cuda_vec_pointwise_calls() - v0;
            calls++;
            const long v1 = kernels_cuda_vec_pointwise_calls();
            if (dir) KG->rope_backward(gxo, cases[c].gpos_bwd, B, T, nh, nkv, hd, cases[c].bwd);
            else KG->rope_forward(gxo, cases[c].gpos_fwd, B, T, nh, nkv, hd, cases[c].fwd);
            forms_off += kernels_cuda_vec_pointwise_calls() - v1; /* must be none */
            snprintf(name, sizeof name, "%s hd %d, nh %d, nkv %d (%s) ([a])", what, hd, nh, nkv, cases[c].tag);
            check_act_rn_sum(name, x, gx, n);
            snprintf(name, sizeof name, "%s hd %d (%s): %s form = element form", what, hd, cases[c].tag,
                     vec ? "16-byte" : "element");
            check_act_bits(name, gx, gxo, n);
        }
    }
    const int ok = forms == (vec ? calls : 0) && forms_off == 0;
    printf("%s rope hd %d, nh %d, nkv %d: %ld of %ld aligned calls in the 16-byte form (%ld wanted), "
           "%ld of the unaligned ones (0 wanted)\n", ok ? "ok  " : "FAIL", hd, nh, nkv, forms, calls, vec ? calls : 0,
           forms_off);
    if (ok) pass++; else fail++;
    free(x); free(reset); free(far);
}

/* QK-norm (headnorm_forward / _backward) against the CPU: out ([a]) and
 * rstd, then d(qkv) in place ([a]: q and k heads changed, v heads kept)
 * and the two weights' gradients (added to what they held); the backward
 * twice from the same values gives the same bits. hd 12: a warp's lanes
 * partly idle; 128: four values a lane (Qwen3's head). */
void test_headnorm(int N, int nh, int nkv, int hd) {
    const int S = (nh + 2 * nkv) * hd, H = nh + nkv;
    const size_t n = (size_t)N * S, nr = (size_t)N * H;
    char name[128];
    float *x = hrand(n, 2), *qw = hrand((size_t)hd, 1), *kw = hrand((size_t)hd, 1), *out = hrand(n, 1), *rstd = hrand(nr, 1);
    float *gx = dcopy_act(x, n), *gqw = dcopy(qw, (size_t)hd), *gkw = dcopy(kw, (size_t)hd), *gout = dcopy_act(out, n),
          *grstd = dcopy(rstd, nr);
    act_round(x, n);
    KC->headnorm_forward(out, rstd, x, qw, kw, N, nh, nkv, hd, 1e-6f);
    KG->headnorm_forward(gout, grstd, gx, gqw, gkw, N, nh, nkv, hd, 1e-6f);
    snprintf(name, sizeof name, "headnorm_forward out N %d, heads %d/%d, hd %d ([a])", N, nh, nkv, hd);
    check_act_rn_sum(name, out, gout, n);
    snprintf(name, sizeof name, "headnorm_forward rstd N %d, hd %d", N, hd);
    check(name, rstd, grstd, nr, TOL_F32);
    float *d = hrand(n, 1), *dqw = hrand((size_t)hd, 1), *dkw = hrand((size_t)hd, 1);
    float *gd = dcopy_act(d, n), *gd2 = dcopy_act(d, n), *gdqw = dcopy(dqw, (size_t)hd), *gdkw = dcopy(dkw, (size_t)hd);
    float *gdqw2 = dcopy(dqw, (size_t)hd), *gdkw2 = dcopy(dkw, (size_t)hd);
    act_round(d, n);
    KC->headnorm_backward(d, dqw, dkw, x, qw, kw, rstd, N, nh, nkv, hd);
    KG->headnorm_backward(gd, gdqw, gdkw, gx, gqw, gkw, grstd, N, nh, nkv, hd);
    KG->headnorm_backward(gd2, gdqw2, gdkw2, gx, gqw, gkw, grstd, N, nh, nkv, hd);
    snprintf(name, sizeof name, "headnorm_backward dqkv N %d, heads %d/%d, hd %d ([a], in place)", N, nh, nkv, hd);
    check_act_rn_sum(name, d, gd, n);
    snprintf(name, sizeof name, "headnorm_backward dqw hd %d", hd);
    check(name, dqw, gdqw, (size_t)hd, TOL_F32);
    snprintf(name, sizeof name, "headnorm_backward dkw hd %d", hd);
    check(name, dkw, gdkw, (size_t)hd, TOL_F32);
    snprintf(name, sizeof name, "headnorm_backward hd %d run twice: the same bits", hd);
    check_act_bits(name, gd, gd2, n);
    float *h = malloc_check(2 * (size_t)hd * sizeof(float));
    KG->to_host(h, gdqw, (size_t)hd * sizeof(float));
    KG->to_host(h + hd, gdkw, (size_t)hd * sizeof(float));
    size_t bad = bits_differ(h, gdqw2, (size_t)hd) + bits_differ(h + hd, gdkw2, (size_t)hd);
    printf("%s headnorm_backward hd %d run twice: %zu weight-gradient words differ\n", bad ? "FAIL" : "ok  ", hd, bad);
    if (bad) fail++; else pass++;
    free(h); free(x); free(qw); free(kw); free(out); free(rstd); free(d); free(dqw); free(dkw);
}

void test_rope(void) {
    test_rope_shape(2, 33, 4, 2, 16);  /* 16-byte form, 6 threads a row */
    test_rope_shape(1, 9, 33, 1, 128); /* 16-byte form, 272 items over 256 threads */
    test_rope_shape(2, 17, 4, 2, 12);  /* element at a time */
    test_rope_shape(1, 9000, 1, 1, 16); /* 16-byte form, more rows than blocks (132 SMs x 64 on the emulation) */
}

/* sumsq_queue beside the compute stream: each slot holds sumsq's bits for its
 * range (the same kernels and grid on the side stream): unaligned ranges, an
 * empty one (0), and one the compute stream wrote just before the queue
 * (scale() by 2, so 4x the CPU's sum: the side stream starts after the work
 * queued so far); a slot never queued keeps alloc's zero. */
static void test_sumsq_queue(const float *y, const float *gy, size_t big) {
    const size_t offs[] = {0, 1, 3, 0, 0}, lens[] = {big, big - 1, 1000002, 0, 5}, nz = 1000003;
    double *gslots = KG->alloc(7 * sizeof(double)), got[7], want[7] = {0};
    float *gz = dcopy(y, nz);
    /* a block for every 16384 elements: each of the side stream's blocks
     * holds its SM only while it reads 64 KB (not a grid the size of the
     * device, each block striding over the whole range) */
    int grids_ok = 1;
    for (int i = 0; i < 5; i++) {
        KG->sumsq_queue(gy + offs[i], lens[i], gslots + i);
        const unsigned want_grid = lens[i] ? (unsigned)((lens[i] + 16383) / 16384) : 0;
        if (lens[i] && kernels_cuda_last_reduce_grid() != want_grid) {
            printf("FAIL sumsq_queue of %zu elements: a grid of %u blocks, want %u (16384 elements a block)\n", lens[i],
                   kernels_cuda_last_reduce_grid(), want_grid);
            grids_ok = 0;
        }
    }
    if (grids_ok) printf("ok   sumsq_queue grids: a block for every 16384 elements (%zu elements: %u blocks)\n", lens[0],
                         (unsigned)((lens[0] + 16383) / 16384));
    if (grids_ok) pass++; else fail++;
    KG->scale(gz, 2.0f, nz);
    KG->sumsq_queue(gz, nz, gslots + 5);
    KG->sumsq_take(got, gslots, 7);
    for (int i = 0; i < 5; i++) want[i] = lens[i] ? KG->sumsq(gy + offs[i], lens[i]) : 0.0;
    want[5] = KG->sumsq(gz, nz);
    int same = memcmp(got, want, sizeof got) == 0;
    double cpu5 = 4.0 * KC->sumsq(y, nz);
    int ok = same && fabs(got[5] - cpu5) <= TOL_RED * cpu5;
    printf("%s sumsq_queue: 6 sums beside the compute stream (unaligned, empty, one after scale()) %s sumsq's; "
           "the scaled one %.17g, 4x the CPU's %.17g; a slot never queued %g\n", ok ? "ok  " : "FAIL",
           same ? "==" : "differ from", got[5], cpu5, got[6]);
    if (ok) pass++; else fail++;
    KG->free(gslots); /* gz: with dcopy's others at the end */
}
void test_pointwise(void) {
    int N = 50, F = 123;
    size_t n = (size_t)N * F;
    float *x = hrand(2 * n, 2), *d = hrand(2 * n, 1), *o = hrand(2 * n, 1), *di = hrand(2 * n, 1);
    float *gx = dcopy(x, 2 * n), *gd = dcopy(d, 2 * n), *go = dcopy(o, 2 * n), *gdi = dcopy(di, 2 * n);
    { /* gelu_forward's inp and out are [a]: under bf16 the device reads the
       * rounded inputs the CPU gets, and stores its result rounded */
        float *xa = malloc_check(2 * n * sizeof(float)), *oa = malloc_check(2 * n * sizeof(float));
        memcpy(xa, x, 2 * n * sizeof(float));
        float *gxa = dcopy_act(xa, 2 * n), *goa = dcopy_act(o, 2 * n);
        act_round(xa, 2 * n);
        KC->gelu_forward(oa, xa, 2 * n);
        KG->gelu_forward(goa, gxa, 2 * n);
        check_act_rn("gelu_forward ([a] in and out)", oa, goa, 2 * n);
        free(xa); free(oa);
    }
    KC->gelu_backward(di, x, d, 2 * n);
    KG->gelu_backward(gdi, gx, gd, 2 * n);
    check("gelu_backward", di, gdi, 2 * n, TOL_F32);
    KC->add(o, o, x, 2 * n); /* out aliases a */
    KG->add(go, go, gx, 2 * n);
    check("add (aliased)", o, go, 2 * n, TOL_F32);
    KC->scale(o, 0.37f, 2 * n);
    KG->scale(go, 0.37f, 2 * n);
    check("scale", o, go, 2 * n, TOL_F32);
    check_scalar("sum", KC->sum(o, 2 * n), KG->sum(go, 2 * n), TOL_RED);
    check_scalar("sumsq", KC->sumsq(o, 2 * n), KG->sumsq(go, 2 * n), TOL_RED);
    size_t big = (size_t)3 << 20; /* more than one element per reduction thread */
    float *y = hrand(big, 1), *gy = dcopy(y, big);
    check_scalar("sumsq (3M)", KC->sumsq(y, big), KG->sumsq(gy, big), TOL_RED);
    /* the 16-byte loads (four a round, the rounds' remainder, the n % 4
     * tail) from an aligned start, and the scalar loop from unaligned ones */
    const size_t offs[] = {0, 0, 1, 3, 0}, lens[] = {big - 1, big - 3, big - 1, 1000002, 5};
    for (int i = 0; i < 5; i++) {
        char name[64];
        snprintf(name, sizeof name, "sumsq [%zu, +%zu)", offs[i], lens[i]);
        check_scalar(name, KC->sumsq(y + offs[i], lens[i]), KG->sumsq(gy + offs[i], lens[i]), TOL_RED);
        snprintf(name, sizeof name, "sum [%zu, +%zu)", offs[i], lens[i]);
        check_scalar(name, KC->sum(y + offs[i], lens[i]), KG->sum(gy + offs[i], lens[i]), TOL_RED);
    }
    test_sumsq_queue(y, gy, big);
}

/* swiglu_forward and swiglu_backward at [N, 2F] against the CPU. The
 * device's 16-byte form (F a multiple of 8, 16-byte aligned operands:
 * kernels_cuda_vec_pointwise_calls) must give the very bits the
 * element-at-a-time form gives on copies one element off the 16-byte grid
 * (which must take it). */
void test_swiglu(int N, int F) {
    size_t n = (size_t)N * F;
    char name[128];
    float *x = hrand(2 * n, 2), *d = hrand(n, 1), *o = hrand(n, 1), *di = hrand(2 * n, 1);
    /* inp and out are [a]: under bf16 the device reads the bf16
     * pre-activation, and the CPU computes from the same rounded values */
    float *gx = dcopy_act(x, 2 * n), *gxo = dcopy_act_off(x, 2 * n, 1), *go = dcopy_act(o, n);
    float *goo = dcopy_act_off(o, n, 1), *gd = dcopy(d, n), *gdo = dcopy_off(d, n, 1);
    float *gdi = dcopy(di, 2 * n), *gdio = dcopy_off(di, 2 * n, 1);
    act_round(x, 2 * n);
    const int vec = F % 8 == 0;
    const long v0 = kernels_cuda_vec_pointwise_calls();
    KC->swiglu_forward(o, x, N, F);
    KG->swiglu_forward(go, gx, N, F);
    KC->swiglu_backward(di, x, d, N, F);
    KG->swiglu_backward(gdi, gx, gd, N, F);
    const long v1 = kernels_cuda_vec_pointwise_calls();
    KG->swiglu_forward(goo, gxo, N, F);
    KG->swiglu_backward(gdio, gxo, gdo, N, F);
    const long v2 = kernels_cuda_vec_pointwise_calls();
    snprintf(name, sizeof name, "swiglu_forward %dx%d ([a] in and out)", N, F);
    check_act_rn(name, o, go, n);
    snprintf(name, sizeof name, "swiglu_backward %dx%d ([a] inp)", N, F);
    check(name, di, gdi, 2 * n, TOL_F32);
    snprintf(name, sizeof name, "swiglu_forward %dx%d: %s form = element form", N, F, vec ? "16-byte" : "element");
    check_act_bits(name, go, goo, n);
    float *hdio = malloc_check(2 * n * sizeof(float) + 16);
    KG->to_host(hdio, gdio, 2 * n * sizeof(float));
    snprintf(name, sizeof name, "swiglu_backward %dx%d: %s form = element form", N, F, vec ? "16-byte" : "element");
    check_bits(name, hdio, gdi, 2 * n);
    const int ok = v1 - v0 == (vec ? 2 : 0) && v2 == v1;
    printf("%s swiglu %dx%d: %ld of 2 aligned calls in the 16-byte form (%d wanted), %ld of the unaligned ones "
           "(0 wanted)\n", ok ? "ok  " : "FAIL", N, F, v1 - v0, vec ? 2 : 0, v2 - v1);
    if (ok) pass++; else fail++;
    free(x); free(d); free(o); free(di); free(hdio);
}

/* The logits are [a] (kernels.h): under bf16 the device reads and writes
 * bf16 logits, the CPU fp32 ones, both starting from the same (rounded)
 * values. The losses and row sums are fp32 either way (TOL_F32); an output
 * computed in fp32 and stored once (the probabilities, the exponentials) is
 * the CPU's value rounded to nearest (check_act_rn); one computed from a
 * stored bf16 value (the gradients, the normalised vocab-parallel
 * probabilities) is within a bf16 unit of the largest (TOL_BF16). */
/* The rows without a target (CE_NO_TARGET) on the device: every d(logits)
 * element of them exactly 0 ([a] dl, when given), and their losses (when
 * given) exactly 0. A gradient left as p * dloss would be within the
 * tolerance of the CPU's zeros, so this is checked by itself. */
static void check_no_target_rows(const char *name, const float *dl, const float *dloss_dev, const int *tgt, int N, int V) {
    size_t n = (size_t)N * V, bad = 0, rows = 0;
    float *h = dl ? act_to_host(dl, n) : NULL, *l = malloc_check((size_t)N * sizeof(float));
    if (dloss_dev) KG->to_host(l, dloss_dev, (size_t)N * sizeof(float));
    for (int r = 0; r < N; r++) {
        if (tgt[r] != CE_NO_TARGET) continue;
        rows++;
        for (int j = 0; h && j < V; j++) bad += h[(size_t)r * V + j] != 0.0f;
        bad += dloss_dev && l[r] != 0.0f;
    }
    int ok = rows > 0 && bad == 0;
    printf("%s %-34s %zu rows without a target: %zu values not exactly 0\n", ok ? "ok  " : "FAIL", name, rows, bad);
    if (ok) pass++; else fail++;
    free(h);
    free(l);
}

/* V = 1037: an element at a time; 1040: 16 bytes at a time
 * (kernels_cuda_vec_ce_calls: both calls, or neither). 300 rows of V =
 * 24,384: more 16-byte words in a row (3,048 bf16, 6,096 fp32) than a
 * 1024-thread block's threads, so each thread's passes take several */
void test_crossentropy(int N, int V) {
    const long v0_calls = kernels_cuda_vec_ce_calls();
    size_t n = (size_t)N * V;
    const double tol2 = act16() ? TOL_BF16 : TOL_F32;
    int *tgt = (int *)malloc_check((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tgt[i] = (int)(rnd_u32() % V);
    tgt[5] = tgt[17] = CE_NO_TARGET; /* no loss, a zero gradient row (train.eod_mask_loss) */
    int *gtgt = dcopy_int(tgt, N);
    float *lg = hrand(n, 3), *loss = hrand(N, 1), *gloss = dcopy(loss, N);
    /* the CUDA forward keeps a running max and rescales its running sum as
     * the max grows: row 0 rises along its length (a new max at every
     * element), row 1 falls, row 2 has masked (-inf) logits where they are
     * no target, one at its first column, row 3 its first 24 (whole groups
     * of 16 bytes first in the row) */
    for (int j = 0; j < V; j++) {
        lg[j] = 60.0f * (float)j / (float)V;
        lg[(size_t)V + j] = -60.0f * (float)j / (float)V;
        if (j % 7 == 0 && j != tgt[2]) lg[(size_t)2 * V + j] = -INFINITY;
        if (j < 24 && j != tgt[3]) lg[(size_t)3 * V + j] = -INFINITY;
    }
    act_round(lg, n);
    float *glg = dcopy_act(lg, n), *gfu = dcopy_act(lg, n), *fu = malloc_check(n * sizeof(float));
    memcpy(fu, lg, n * sizeof(float));
    KC->crossentropy_forward(loss, lg, tgt, N, V);
    KG->crossentropy_forward(gloss, glg, gtgt, N, V);
    check("crossentropy_forward losses", loss, gloss, N, TOL_F32);
    check_act_rn("crossentropy_forward probs", lg, glg, n);
    check_no_target_rows("crossentropy_forward no target", NULL, gloss, tgt, N, V);
    KC->crossentropy_backward(lg, tgt, 0.01f, N, V);
    KG->crossentropy_backward(glg, gtgt, 0.01f, N, V);
    check_act("crossentropy_backward", lg, glg, n, tol2);
    check_no_target_rows("crossentropy_backward no target", glg, NULL, tgt, N, V);
    /* crossentropy_fused: the CPU's within tolerance, and the bits of the
     * device's own forward + backward */
    float *floss = hrand(N, 1), *gfloss = dcopy(floss, N), *hg = malloc_check(n * sizeof(float));
    KC->crossentropy_fused(floss, fu, tgt, 0.01f, N, V);
    KG->crossentropy_fused(gfloss, gfu, gtgt, 0.01f, N, V);
    check("crossentropy_fused losses", floss, gfloss, N, TOL_F32);
    check_act("crossentropy_fused dlogits", fu, gfu, n, tol2);
    check_no_target_rows("crossentropy_fused no target", gfu, gfloss, tgt, N, V);
    check_act_bits("crossentropy_fused = fwd + bwd", glg, gfu, n);
    KG->to_host(hg, gloss, N * sizeof(float));
    check_bits("crossentropy_fused losses = fwd's", hg, gfloss, N);
    free(fu); free(floss); free(hg);
    const long vec_calls = kernels_cuda_vec_ce_calls() - v0_calls, want = V % 8 == 0 ? 2 : 0;
    printf("%s crossentropy V=%d: %ld of 2 calls 16 bytes at a time (expected %ld)\n", vec_calls == want ? "ok  " : "FAIL",
           V, vec_calls, want);
    if (vec_calls == want) pass++; else fail++;
    /* vocab-parallel pieces on the columns [v0, v0 + Vl) */
    int v0 = 300, Vl = 400;
    size_t nl = (size_t)N * Vl;
    float *l2 = hrand(nl, 3);
    act_round(l2, nl);
    float *gl2 = dcopy_act(l2, nl);
    float *mx = hrand(N, 1), *sm = hrand(N, 1), *tg = hrand(N, 1);
    float *gmx = dcopy(mx, N), *gsm = dcopy(sm, N), *gtg = dcopy(tg, N);
    KC->crossentropy_vp_max(mx, l2, N, Vl);
    KG->crossentropy_vp_max(gmx, gl2, N, Vl);
    check("crossentropy_vp_max", mx, gmx, N, TOL_F32);
    KC->crossentropy_vp_expsum(sm, tg, l2, mx, tgt, N, Vl, v0);
    KG->crossentropy_vp_expsum(gsm, gtg, gl2, gmx, gtgt, N, Vl, v0);
    check("crossentropy_vp_expsum sums", sm, gsm, N, TOL_F32);
    check("crossentropy_vp_expsum tgt", tg, gtg, N, TOL_F32);
    check_act_rn("crossentropy_vp_expsum exp", l2, gl2, nl);
    KC->crossentropy_vp_finish(loss, l2, mx, sm, tg, tgt, N, Vl);
    KG->crossentropy_vp_finish(gloss, gl2, gmx, gsm, gtg, gtgt, N, Vl);
    check("crossentropy_vp_finish losses", loss, gloss, N, TOL_F32);
    check_act("crossentropy_vp_finish probs", l2, gl2, nl, tol2);
    check_no_target_rows("crossentropy_vp_finish no target", NULL, gloss, tgt, N, Vl);
    KC->crossentropy_vp_backward(l2, tgt, 0.5f, N, Vl, v0);
    KG->crossentropy_vp_backward(gl2, gtgt, 0.5f, N, Vl, v0);
    check_act("crossentropy_vp_backward", l2, gl2, nl, tol2);
    check_no_target_rows("crossentropy_vp_backward no target", gl2, NULL, tgt, N, Vl);
    free(tgt);
}


/* ---- mixture of experts (kernels_ops.h's moe_*; kernels/moe.cuh) ----
 * The routing's host side as moe.c's route_host does it, written again
 * here: each expert's count, the capacity (cap choices an expert; <= 0:
 * none) taken in token order, and the permuted layout (expert by expert,
 * tokens in order): slot[n k + j] the row of token n's choice j (-1:
 * dropped), src[r] the token of row r. Returns the rows; counts[E] the
 * choices routed to each expert before the cut. */
static int moe_layout(const int *idx, int N, int k, int E, long cap, int *slot, int *src, int *counts) {
    int *start = calloc_check((size_t)E, sizeof(int)), *fill = calloc_check((size_t)E, sizeof(int)), rows = 0;
    memset(counts, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < N * k; i++) counts[idx[i]]++;
    for (int e = 0; e < E; e++) {
        int kept = cap > 0 && counts[e] > cap ? (int)cap : counts[e];
        start[e] = fill[e] = rows;
        rows += kept;
    }
    for (int i = 0; i < N * k; i++) {
        int e = idx[i], kept = cap > 0 && counts[e] > cap ? (int)cap : counts[e];
        if (fill[e] - start[e] < kept) { slot[i] = fill[e]; src[fill[e]++] = i / k; }
        else slot[i] = -1;
    }
    free(start);
    free(fill);
    return rows;
}

/* host ints equal to a device array's: one ok / FAIL line */
static void check_ints(const char *name, const int *ref, const int *dev, size_t n) {
    int *h = malloc_check(n * sizeof(int) + 16);
    KG->to_host(h, dev, n * sizeof(int));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != ref[i] && !bad++) first = i;
    printf("%s %-34s %zu of %zu differ", bad ? "FAIL" : "ok  ", name, bad, n);
    if (bad) printf(" (first [%zu]: gpu %d cpu %d)", first, h[first], ref[first]);
    printf("\n");
    if (bad) fail++; else pass++;
    free(h);
}

/* The seven moe_* kernels against the CPU's on N tokens choosing k of E
 * experts, C channels, capacity factor cf (0: dropless), off: every
 * operand one element off the 16-byte grid (the word / element forms;
 * aligned with C a multiple of 4 the 16-byte forms: kernels_cuda_moe_vec_
 * calls). The router is far from uniform (a skew across the experts, the
 * last two far below the rest, so that they get no token when E > k + 2),
 * rows 0 and 1 hold ties (every logit equal; two experts equal at the top)
 * that go to the lower index. The routing, the permutation, the weighted
 * sum and the permutation's backward are the CPU's bits (copies, and fp32
 * products and additions in its order); the rest within TOL_F32. */
static void test_moe_case(int N, int E, int k, int C, int off, float cf) {
    char name[128], tag[64];
    snprintf(tag, sizeof tag, "N%d E%d k%d C%d%s%s", N, E, k, C, off ? " unaligned" : "", cf > 0 ? " capacity" : "");
    const size_t NE = (size_t)N * E, Nk = (size_t)N * k, NC = (size_t)N * C, RC = Nk * C;
    float *lg = hrand(NE, 2);
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++) lg[(size_t)n * E + e] += 3.0f - 6.0f * e / E - (E > k + 2 && e >= E - 2 ? 40.0f : 0.0f);
    for (int e = 0; e < E; e++) lg[e] = 0.5f;                  /* row 0: all equal: experts 0 .. k-1 */
    lg[(size_t)E + 1] = lg[(size_t)E + 3] = 30.0f;             /* row 1: 1 and 3 tied at the top */
    float *bias = hrand((size_t)E, 0.05f);
    float *glg = dcopy_off(lg, NE, off), *gbias = dcopy_off(bias, (size_t)E, off);
    float *probs = calloc_check(NE, sizeof(float)), *lse = calloc_check((size_t)N, sizeof(float));
    float *wts = calloc_check(Nk, sizeof(float));
    int *idx = calloc_check(Nk, sizeof(int));
    float *gprobs = dcopy_off(probs, NE, off), *glse = dcopy_off(lse, (size_t)N, off), *gwts = dcopy_off(wts, Nk, off);
    int *gidx = (int *)dcopy_off((const float *)idx, Nk, off), *idx_bias = malloc_check(Nk * sizeof(int)), moved = 0;
    /* with a bias (it only chooses), then without, for each normalisation */
    for (int norm = 1; norm >= 0; norm--)
        for (int b = 1; b >= 0; b--) {
            KC->moe_route(probs, lse, idx, wts, lg, b ? bias : NULL, N, E, k, norm);
            KG->moe_route(gprobs, glse, gidx, gwts, glg, b ? gbias : NULL, N, E, k, norm);
            const char *what = b ? "bias" : (norm ? "norm_topk" : "no norm");
            snprintf(name, sizeof name, "moe_route %s idx (%s)", tag, what);
            check_ints(name, idx, gidx, Nk);
            if (b) { memcpy(idx_bias, idx, Nk * sizeof(int)); continue; }
            for (size_t i = 0; norm && i < Nk; i++) moved += idx_bias[i] != idx[i];
            snprintf(name, sizeof name, "moe_route %s probs (%s)", tag, what);
            check(name, probs, gprobs, NE, TOL_F32);
            snprintf(name, sizeof name, "moe_route %s lse (%s)", tag, what);
            check(name, lse, glse, (size_t)N, TOL_F32);
            snprintf(name, sizeof name, "moe_route %s wts (%s)", tag, what);
            check(name, wts, gwts, Nk, TOL_F32);
            /* the router's backward from the same forward: with the aux
             * loss's per-expert term, then without */
            float *dw = hrand(Nk, 1), *dprob = hrand((size_t)E, 0.1f), *dl = hrand(NE, 1);
            float *gdw = dcopy_off(dw, Nk, off), *gdprob = dcopy_off(dprob, (size_t)E, off), *gdl = dcopy_off(dl, NE, off);
            for (int a = 1; a >= 0; a--) {
                KC->moe_route_backward(dl, probs, lse, idx, wts, dw, a ? dprob : NULL, 0.01f, N, E, k, norm);
                KG->moe_route_backward(gdl, gprobs, glse, gidx, gwts, gdw, a ? gdprob : NULL, 0.01f, N, E, k, norm);
                snprintf(name, sizeof name, "moe_route_backward %s (%s%s)", tag, what, a ? ", dprob" : "");
                check(name, dl, gdl, NE, TOL_F32);
            }
            free(dw); free(dprob); free(dl);
        }
    /* the probabilities' column sums */
    float *ps = hrand((size_t)E, 1), *gps = dcopy_off(ps, (size_t)E, off);
    KC->moe_colsum(ps, probs, N, E);
    KG->moe_colsum(gps, gprobs, N, E);
    snprintf(name, sizeof name, "moe_colsum %s", tag);
    check(name, ps, gps, (size_t)E, TOL_F32);
    /* the layout from the CPU's choices (the last: norm_topk off) */
    int *slot = malloc_check(Nk * sizeof(int)), *src = malloc_check(Nk * sizeof(int)), *cnt = malloc_check((size_t)E * sizeof(int));
    long cap = cf > 0 ? (long)ceil((double)cf * N * k / E) : 0;
    const int rows = moe_layout(idx, N, k, E, cap, slot, src, cnt);
    int empty = 0;
    for (int e = 0; e < E; e++) empty += cnt[e] == 0;
    const int want_empty = E > k + 2, ok_in = (empty > 0) == want_empty && (cf > 0) == (rows < (int)Nk) && idx[0] == 0 &&
                           (k < 2 || idx[1] == 1) && idx[k] == 1 && (k < 2 || idx[k + 1] == 3) && moved > 0;
    printf("%s moe %s inputs: %d of %d experts without a token (%s wanted), %d of %zu choices dropped, ties as the "
           "CPU breaks them (row 0: 0, 1; row 1: 1, 3), %d choices the bias moved\n", ok_in ? "ok  " : "FAIL", tag, empty, E,
           want_empty ? "some" : "none", (int)Nk - rows, Nk, moved);
    if (ok_in) pass++; else fail++;
    int *gslot = (int *)dcopy_off((const float *)slot, Nk, off), *gsrc = (int *)dcopy_off((const float *)src, Nk, off);
    const long v0 = kernels_cuda_moe_vec_calls();
    /* the permutation: [a] rows, exact copies */
    float *x = hrand(NC, 1), *xp = hrand(RC, 1);
    float *gx = dcopy_act_off(x, NC, off), *gxp = dcopy_act_off(xp, RC, off);
    act_round(x, NC);
    act_round(xp, RC);
    KC->moe_permute(xp, x, src, rows, C);
    KG->moe_permute(gxp, gx, gsrc, rows, C);
    float *hxp = act_to_host(gxp, RC);
    snprintf(name, sizeof name, "moe_permute %s ([a] rows)", tag);
    check_host(name, xp, hxp, RC, 0.0);
    free(hxp);
    /* the weighted sum: no residual, one apart, one aliased (out = res) */
    float *yp = hrand(RC, 1), *res = hrand(NC, 1), *out = hrand(NC, 1), *out2 = hdup(res, NC);
    float *gyp = dcopy_off(yp, RC, off), *gres = dcopy_off(res, NC, off), *gout = dcopy_off(out, NC, off);
    float *gout2 = dcopy_off(res, NC, off);
    for (int r = 0; r < 3; r++) {
        float *o = r == 2 ? out2 : out, *go = r == 2 ? gout2 : gout;
        KC->moe_combine(o, r == 0 ? NULL : r == 1 ? res : out2, yp, wts, slot, N, k, C);
        KG->moe_combine(go, r == 0 ? NULL : r == 1 ? gres : gout2, gyp, gwts, gslot, N, k, C);
        snprintf(name, sizeof name, "moe_combine %s (%s)", tag, r == 0 ? "no res" : r == 1 ? "res" : "out = res");
        check_bits(name, o, go, NC);
    }
    /* its backward: dyp's rows past the layout's untouched */
    float *dout = hrand(NC, 1), *dyp = hrand(RC, 1), *dwts = hrand(Nk, 1);
    float *gdout = dcopy_off(dout, NC, off), *gdyp = dcopy_off(dyp, RC, off), *gdwts = dcopy_off(dwts, Nk, off);
    KC->moe_combine_backward(dyp, dwts, dout, yp, wts, slot, N, k, C);
    KG->moe_combine_backward(gdyp, gdwts, gdout, gyp, gwts, gslot, N, k, C);
    snprintf(name, sizeof name, "moe_combine_backward %s dyp", tag);
    check_bits(name, dyp, gdyp, RC);
    snprintf(name, sizeof name, "moe_combine_backward %s dwts", tag);
    check(name, dwts, gdwts, Nk, TOL_F32);
    float *hdw = malloc_check(Nk * sizeof(float));
    KG->to_host(hdw, gdwts, Nk * sizeof(float));
    size_t dropped = 0, nonzero = 0;
    for (size_t i = 0; i < Nk; i++)
        if (slot[i] < 0) { dropped++; nonzero += hdw[i] != 0.0f; }
    printf("%s moe_combine_backward %s: %zu of %zu dropped choices' dwts not exactly 0\n", nonzero ? "FAIL" : "ok  ", tag,
           nonzero, dropped);
    if (nonzero) fail++; else pass++;
    free(hdw);
    /* the permutation's backward, added into dx */
    float *dx = hrand(NC, 1), *dxp = hrand(RC, 1);
    float *gdx = dcopy_off(dx, NC, off), *gdxp = dcopy_off(dxp, RC, off);
    KC->moe_unpermute_add(dx, dxp, slot, N, k, C);
    KG->moe_unpermute_add(gdx, gdxp, gslot, N, k, C);
    snprintf(name, sizeof name, "moe_unpermute_add %s", tag);
    check_bits(name, dx, gdx, NC);
    /* permute's rows are C x act_bytes: a multiple of 16 when C is of 8 (bf16) or 4 (fp32) */
    const long vec = kernels_cuda_moe_vec_calls() - v0;
    const long want = off ? 0 : (C % (act16() ? 8 : 4) == 0) + 4 * (C % 4 == 0);
    printf("%s moe %s: %ld of 5 calls moved 16 bytes a thread (%ld wanted)\n", vec == want ? "ok  " : "FAIL", tag, vec, want);
    if (vec == want) pass++; else fail++;
    free(lg); free(bias); free(probs); free(lse); free(wts); free(idx); free(idx_bias); free(ps); free(slot); free(src); free(cnt);
    free(x); free(xp); free(yp); free(res); free(out); free(out2); free(dout); free(dyp); free(dwts); free(dx); free(dxp);
}

void test_moe(void) {
    test_moe_case(300, 8, 2, 64, 0, 0.0f);   /* dropless, Mixtral's 8 choose 2 */
    test_moe_case(300, 8, 2, 64, 0, 1.0f);   /* capacity 1: the favoured experts drop */
    test_moe_case(257, 8, 1, 72, 0, 1.25f);  /* k 1 (Switch) */
    test_moe_case(77, 40, 2, 37, 1, 1.0f);   /* 40 experts: two a lane; odd C, unaligned */
    test_moe_case(64, 4, 2, 12, 1, 0.0f);    /* every expert gets tokens */
}
