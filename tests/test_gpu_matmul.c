/* test_gpu_matmul.c — the CUDA backend's GEMMs of the linear layers
 * against the CPU's: matmul_forward / _backward, the [a] storage they read,
 * the fused residual add, GELU and SwiGLU epilogues (and which GELU
 * cuBLASLt's epilogues compute), dout_a and the [a]-output forms of the LM
 * head and qkv projection. Run by tests/test_gpu's main (tests/test_gpu.c:
 * the error metric and the tolerances); helpers in tests/test_gpu.h. */
#include "kernels.h"
#include "test_gpu.h"
#include "util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dout_a (kernels.h) of the output projections' backward: the same call
 * with the [a] copy of dout gives the same bits (dinp or dpre, dw, dbias:
 * the bias still summing the fp32 dout) and converts no dout
 * (kernels_cuda_dout_convert_calls: one conversion without it under bf16,
 * none under fp32 [a]). kind 0 matmul_backward_dinp_a, 1
 * matmul_gelu_backward, 2 matmul_swiglu_backward. */
void test_dout_a_case(int kind, int N, int C, int OC, int with_bias) {
    static const char *const kname[] = {"matmul_bwd_dinp_a", "matmul_gelu_bwd", "matmul_swiglu_bwd"};
    size_t nd = (size_t)N * OC, nw = (size_t)OC * C, np = (size_t)N * C * (kind == 2 ? 2 : 1);
    float *dout = hrand(nd, 1), *inp = hrand((size_t)N * C, 1), *w = hrand(nw, 0.1f), *pre = hrand(np, 2);
    float *dw = hrand(nw, 1), *db = hrand(OC, 1), *other = hrand(np, 3);
    float *gdout = dcopy(dout, nd), *gdout_a = dcopy_act(dout, nd), *ginp = dcopy_act(inp, (size_t)N * C);
    float *gw = dcopy(w, nw), *gpre = dcopy_act(pre, np), *gd[2], *gdw[2], *gdb[2];
    long conv[2];
    for (int a = 0; a < 2; a++) {
        gd[a] = dcopy_act(other, np);
        gdw[a] = dcopy(dw, nw);
        gdb[a] = dcopy(db, OC);
        const long c0 = kernels_cuda_dout_convert_calls();
        const float *da = a ? gdout_a : NULL;
        float *b = with_bias ? gdb[a] : NULL;
        if (kind == 0) KG->matmul_backward_dinp_a(gd[a], gdw[a], b, gdout, da, ginp, gw, N, C, OC);
        else if (kind == 1) KG->matmul_gelu_backward(gd[a], gdw[a], b, gdout, da, ginp, gw, gpre, N, C, OC);
        else KG->matmul_swiglu_backward(gd[a], gdw[a], b, gdout, da, ginp, gw, gpre, N, C, OC);
        conv[a] = kernels_cuda_dout_convert_calls() - c0;
    }
    char name[128];
    snprintf(name, sizeof name, "%s %dx%dx%d%s dout_a: d(inp)", kname[kind], N, C, OC, with_bias ? " +bias" : "");
    check_act_bits(name, gd[0], gd[1], np);
    float *h = malloc_check(nw * sizeof(float));
    KG->to_host(h, gdw[0], nw * sizeof(float));
    size_t bad = bits_differ(h, gdw[1], nw);
    KG->to_host(h, gdb[0], OC * sizeof(float));
    bad += bits_differ(h, gdb[1], OC);
    const int ok = !bad && conv[0] == act16() && conv[1] == 0;
    printf("%s %s %dx%dx%d%s dout_a: %zu words of dw / dbias differ; dout converted %ld times without it, %ld with "
           "(expected %d, 0)\n", ok ? "ok  " : "FAIL", kname[kind], N, C, OC, with_bias ? " +bias" : "", bad, conv[0],
           conv[1], act16());
    if (ok) pass++; else fail++;
    free(h); free(dout); free(inp); free(w); free(pre); free(dw); free(db); free(other);
}


void test_matmul_case(int N, int C, int OC, int off, int with_bias) {
    char name[96];
    float *inp = hrand((size_t)N * C, 1), *w = hrand((size_t)OC * C, 0.1f), *bias = hrand(OC, 1);
    float *dout = hrand((size_t)N * OC, 1);
    float *ginp = dcopy_act_off(inp, (size_t)N * C, off), *gw = dcopy_off(w, (size_t)OC * C, off);
    float *gbias = dcopy_off(bias, OC, off), *gdout = dcopy_off(dout, (size_t)N * OC, off);
    float *out = hrand((size_t)N * OC, 1), *gout = dcopy_off(out, (size_t)N * OC, off);
    KC->matmul_forward(out, inp, w, with_bias ? bias : NULL, N, C, OC);
    KG->matmul_forward(gout, ginp, gw, with_bias ? gbias : NULL, N, C, OC);
    snprintf(name, sizeof name, "matmul_fwd %dx%dx%d%s%s", N, C, OC, with_bias ? " +bias" : "", off ? " unaligned" : "");
    check(name, out, gout, (size_t)N * OC, tol_mm);
    float *dinp = hrand((size_t)N * C, 1), *dw = hrand((size_t)OC * C, 1), *db = hrand(OC, 1);
    float *gdinp = dcopy_off(dinp, (size_t)N * C, off), *gdw = dcopy_off(dw, (size_t)OC * C, off);
    float *gdb = dcopy_off(db, OC, off);
    long sc0 = kernels_cuda_colsum_copy_calls();
    KC->matmul_backward(dinp, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC);
    KG->matmul_backward(gdinp, gdw, with_bias ? gdb : NULL, gdout, ginp, gw, N, C, OC);
    /* under bf16 a bias gradient's pass writes the GEMMs' bf16 copy of dout
     * (a wrong copy fails dinp and dw below) */
    long sc = kernels_cuda_colsum_copy_calls() - sc0;
    int sc_ok = sc == (with_bias && act16() ? 1 : 0);
    printf("%s matmul_bwd %dx%dx%d: %ld bias pass(es) wrote the bf16 copy of dout (expected %d)\n",
           sc_ok ? "ok  " : "FAIL", N, C, OC, sc, with_bias && act16() ? 1 : 0);
    if (sc_ok) pass++; else fail++;
    snprintf(name, sizeof name, "matmul_bwd dinp %dx%dx%d%s", N, C, OC, off ? " unaligned" : "");
    check(name, dinp, gdinp, (size_t)N * C, tol_mm);
    snprintf(name, sizeof name, "matmul_bwd dw %dx%dx%d%s", N, C, OC, off ? " unaligned" : "");
    check(name, dw, gdw, (size_t)OC * C, tol_mm);
    if (with_bias) {
        snprintf(name, sizeof name, "matmul_bwd dbias %dx%dx%d", N, C, OC);
        check(name, db, gdb, OC, TOL_F32);
    }
}

/* [a] storage: act_bytes is 4 on the CPU, 2 on CUDA exactly under
 * compute dtype bf16. Under bf16, a product's [a] input goes to the
 * bf16 GEMM as it is: matmul_forward and matmul_backward's dw equal the CPU's
 * on the operands rounded to bf16 up to the fp32 summation order (1e-4),
 * which fails if the bf16 words were converted again or read as fp32. */
void test_act_storage(int bf16_mode) {
    int ok = KC->act_bytes == 4 && KG->act_bytes == (bf16_mode ? 2 : 4);
    printf("%s act_bytes: cpu %d, cuda %d (expected %d under this compute dtype)\n", ok ? "ok  " : "FAIL",
           KC->act_bytes, KG->act_bytes, bf16_mode ? 2 : 4);
    if (ok) pass++; else fail++;
    if (!bf16_mode) return;
    int N = 96, C = 136, OC = 72;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = hrand(nx, 1), *w = hrand(nw, 0.1f), *dout = hrand(no, 1);
    float *out = hrand(no, 1), *dw = hrand(nw, 1);
    float *ginp = dcopy_act(inp, nx), *gw = dcopy(w, nw), *gdout = dcopy(dout, no), *gout = dcopy(out, no);
    float *gdw = dcopy(dw, nw);
    act_round(inp, nx);
    act_round(w, nw);
    act_round(dout, no);
    KC->matmul_forward(out, inp, w, NULL, N, C, OC);
    KG->matmul_forward(gout, ginp, gw, NULL, N, C, OC);
    check("matmul_fwd bf16 [a] = cpu on rounded", out, gout, no, TOL_FP32MM);
    KC->matmul_backward(NULL, dw, NULL, dout, inp, w, N, C, OC);
    KG->matmul_backward(NULL, gdw, NULL, gdout, ginp, gw, N, C, OC);
    check("matmul_bwd dw bf16 [a] = cpu on rounded", dw, gdw, nw, TOL_FP32MM);
    free(inp); free(w); free(dout); free(out); free(dw);
}

/* matmul_forward_res (the output projections: the residual add in the
 * GEMM, beta 1 reading res) against the CPU's product then add: out must
 * be res + the product (+ bias) within the matmul tolerance of the largest
 * value (under bf16 the CPU multiplies the operands rounded as the GPU's
 * GEMM reads them, and the fp32 sums differ only in order: TOL_FP32MM); off
 * shifts the operands off 16-byte alignment (a bias the epilogue cannot
 * take is added by a kernel after the GEMM). res must be left as it was. */
void test_matmul_res_case(int N, int C, int OC, int off, int with_bias) {
    char name[96];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = hrand(nx, 1), *w = hrand(nw, 0.1f), *bias = hrand(OC, 1), *res = hrand(no, 4);
    float *out = hrand(no, 1);
    float *ginp = dcopy_act_off(inp, nx, off), *gw = dcopy_off(w, nw, off), *gbias = dcopy_off(bias, OC, off);
    float *gres = dcopy_off(res, no, off), *gout = dcopy_off(out, no, off);
    act_round(inp, nx);
    if (act16()) act_round(w, nw);
    KC->matmul_forward_res(out, res, inp, w, with_bias ? bias : NULL, N, C, OC);
    KG->matmul_forward_res(gout, gres, ginp, gw, with_bias ? gbias : NULL, N, C, OC);
    snprintf(name, sizeof name, "matmul_fwd_res %dx%dx%d%s%s", N, C, OC, with_bias ? " +bias" : "",
             off ? " unaligned" : "");
    check(name, out, gout, no, act16() ? TOL_FP32MM : tol_mm);
    snprintf(name, sizeof name, "matmul_fwd_res %dx%dx%d res unchanged", N, C, OC);
    check(name, res, gres, no, 0.0);
    free(inp); free(w); free(bias); free(res); free(out);
}

/* matmul_backward_dinp_a (the attention output projection's backward):
 * matmul_backward with dinp [a], started full of other values (it is
 * overwritten). Under bf16 the CPU multiplies the operands as the GPU's
 * GEMMs read them (dout and w rounded to bf16, inp the [a] words) and dinp
 * must be its product rounded to nearest (fp32 words where bf16 belong,
 * or a second rounding, fail it); dw equals the CPU's up to the fp32
 * summation order, and dbias sums the fp32 dout as matmul_backward's does.
 * Under TF32 and fp32, matmul_backward's tolerances. */
void test_matmul_dinp_a_case(int N, int C, int OC, int with_bias) {
    char name[96];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = hrand(nx, 1), *w = hrand(nw, 0.1f), *dout = hrand(no, 1), *dout_r = hdup(dout, no);
    float *dinp = hrand(nx, 1), *dw = hrand(nw, 1), *db = hrand(OC, 1);
    float *ginp = dcopy_act(inp, nx), *gw = dcopy(w, nw), *gdout = dcopy(dout, no);
    float *gdinp = dcopy_act(dinp, nx), *gdw = dcopy(dw, nw), *gdb = dcopy(db, OC);
    act_round(inp, nx);
    act_round(w, nw);
    act_round(dout_r, no);
    KC->matmul_backward(dinp, dw, NULL, dout_r, inp, w, N, C, OC);
    if (with_bias) KC->matmul_backward(NULL, NULL, db, dout, inp, w, N, C, OC);
    KG->matmul_backward_dinp_a(gdinp, gdw, with_bias ? gdb : NULL, gdout, NULL, ginp, gw, N, C, OC);
    snprintf(name, sizeof name, "matmul_bwd_dinp_a dinp %dx%dx%d", N, C, OC);
    if (act16()) check_act_rn_sum(name, dinp, gdinp, nx);
    else check(name, dinp, gdinp, nx, tol_mm);
    snprintf(name, sizeof name, "matmul_bwd_dinp_a dw %dx%dx%d", N, C, OC);
    check(name, dw, gdw, nw, act16() ? TOL_FP32MM : tol_mm);
    if (with_bias) {
        snprintf(name, sizeof name, "matmul_bwd_dinp_a dbias %dx%dx%d", N, C, OC);
        check(name, db, gdb, OC, TOL_F32);
    }
    free(inp); free(w); free(dout); free(dout_r); free(dinp); free(dw); free(db);
}

/* matmul_gelu_forward against the CPU's matmul + gelu; fused: whether this
 * shape should take cuBLASLt's GELU epilogue (C, OC multiples of 8 and
 * aligned operands) in the TF32 and bf16 modes, checked with the backend's
 * count of fused calls (fp32 may fall back). pre and out are [a]: under
 * bf16 the CPU multiplies the bf16 operands (the weights and the bias as
 * the GPU rounds them), and the fused pre must be the CPU's rounded to
 * nearest (one rounding of the fp32 result; the unfused forms round the
 * bias sum again); out is held to the bf16 tolerance, whether cuBLASLt's
 * GELU reads the fp32 or the rounded pre. */
void test_matmul_gelu_case(int N, int C, int OC, int off, int with_bias, int fused) {
    char name[96];
    size_t n = (size_t)N * OC;
    float *inp = hrand((size_t)N * C, 1), *w = hrand((size_t)OC * C, 0.3f), *bias = hrand(OC, 1);
    float *ginp = dcopy_act_off(inp, (size_t)N * C, off), *gw = dcopy_off(w, (size_t)OC * C, off);
    float *gbias = dcopy_off(bias, OC, off);
    float *pre = hrand(n, 1), *out = hrand(n, 1), *gpre = dcopy_act_off(pre, n, off), *gout = dcopy_act_off(out, n, off);
    act_round(inp, (size_t)N * C);
    act_round(w, (size_t)OC * C);
    act_round(bias, OC);
    long f0 = kernels_cuda_fused_gelu_calls();
    KC->matmul_gelu_forward(out, pre, inp, w, with_bias ? bias : NULL, N, C, OC);
    KG->matmul_gelu_forward(gout, gpre, ginp, gw, with_bias ? gbias : NULL, N, C, OC);
    int did = kernels_cuda_fused_gelu_calls() > f0;
    snprintf(name, sizeof name, "matmul_gelu pre %dx%dx%d%s%s", N, C, OC, with_bias ? " +bias" : "", off ? " unaligned" : "");
    if (act16() && did) check_act_rn_sum(name, pre, gpre, n);
    else check_act(name, pre, gpre, n, tol_mm);
    snprintf(name, sizeof name, "matmul_gelu out %dx%dx%d%s (%s)", N, C, OC, with_bias ? " +bias" : "",
             did ? "fused" : "unfused");
    check_act(name, out, gout, n, tol_mm);
    if (fused && tol_mm != TOL_FP32MM) {
        printf("%s matmul_gelu %dx%dx%d takes the GELU epilogue: %s\n", did ? "ok  " : "FAIL", N, C, OC, did ? "yes" : "no");
        if (did) pass++; else fail++;
    }
    if (!fused && did) {
        printf("FAIL matmul_gelu %dx%dx%d took the epilogue, which it cannot\n", N, C, OC);
        fail++;
    }
}

/* matmul_gelu_backward / matmul_swiglu_backward against the CPU's: dpre
 * starts as garbage (overwritten), dw and dbias with values (added into).
 * fused (GELU only): whether the input-gradient GEMM should take cuBLASLt's
 * DGELU epilogue (C a multiple of 8, aligned pre) in the TF32 and bf16
 * modes, checked with the backend's count; unfused shapes must not take
 * it. */
void test_matmul_act_bwd_case(int N, int C, int OC, int off, int swiglu, int with_bias, int fused) {
    char name[160], shape[96];
    size_t np = (size_t)N * C * (swiglu ? 2 : 1), nc = (size_t)N * C, nw = (size_t)OC * C;
    float *dout = hrand((size_t)N * OC, 1), *inp = hrand(nc, 1), *w = hrand(nw, 0.1f), *pre = hrand(np, 2);
    float *dpre = hrand(np, 100), *dw = hrand(nw, 1), *db = hrand(OC, 1);
    float *gdout = dcopy_off(dout, (size_t)N * OC, off), *ginp = dcopy_act_off(inp, nc, off);
    /* pre and dpre are [a] (the CPU's pre rounded alike) */
    float *gw = dcopy_off(w, nw, off), *gpre = dcopy_act_off(pre, np, off), *gdpre = dcopy_act_off(dpre, np, off);
    act_round(pre, np);
    float *gdw = dcopy_off(dw, nw, off), *gdb = dcopy_off(db, OC, off);
    /* bf16: the CPU from the GEMMs' bf16 operands, so that dpre can be held
     * to the CPU's value rounded to nearest (GELU's: rounded once from the
     * fp32 gradient, not twice, though its unfused form rounds the product
     * first; SwiGLU's: from the CPU's dh rounded to bf16 as the GPU's GEMM
     * rounds it, below) */
    const int exact = act16();
    float *dout0 = exact ? hdup(dout, (size_t)N * OC) : NULL, *db0 = exact ? hdup(db, OC) : NULL;
    if (exact) { act_round(dout, (size_t)N * OC); act_round(w, nw); act_round(inp, nc); }
    long f0 = kernels_cuda_fused_dgelu_calls(), p0 = kernels_cuda_vec_pointwise_calls();
    if (swiglu) {
        KC->matmul_swiglu_backward(dpre, dw, with_bias ? db : NULL, dout, NULL, inp, w, pre, N, C, OC);
        KG->matmul_swiglu_backward(gdpre, gdw, with_bias ? gdb : NULL, gdout, NULL, ginp, gw, gpre, N, C, OC);
    } else {
        KC->matmul_gelu_backward(dpre, dw, with_bias ? db : NULL, dout, NULL, inp, w, pre, N, C, OC);
        KG->matmul_gelu_backward(gdpre, gdw, with_bias ? gdb : NULL, gdout, NULL, ginp, gw, gpre, N, C, OC);
    }
    if (exact) { /* the bias gradient sums the fp32 dout, not the rounded one */
        memcpy(db, db0, OC * sizeof(float));
        KC->matmul_backward(NULL, NULL, with_bias ? db : NULL, dout0, inp, w, N, C, OC);
    }
    if (exact && swiglu) { /* the GPU's GEMM rounds dh to bf16 before SwiGLU's backward: the CPU's dh rounded alike */
        float *dh = hrand(nc, 1);
        KC->matmul_backward(dh, NULL, NULL, dout, inp, w, N, C, OC);
        act_round(dh, nc);
        memset(dpre, 0, np * sizeof(float));
        KC->swiglu_backward(dpre, pre, dh, N, C);
        free(dh);
    }
    int did = kernels_cuda_fused_dgelu_calls() > f0;
    snprintf(shape, sizeof shape, "matmul_%s_bwd %dx%dx%d%s%s", swiglu ? "swiglu" : "gelu", N, C, OC,
             with_bias ? " +bias" : "", off ? " unaligned" : "");
    snprintf(name, sizeof name, "%s dpre (%s%s)", shape, exact ? "bf16 [a], " : "",
             swiglu ? (exact ? "from bf16 dh" : "in place") : did ? "DGELU epilogue" : "GEMM + kernel");
    if (exact && swiglu) check_act_rn_sum(name, dpre, gdpre, np);
    else if (exact && did) { /* cuBLASLt's DGELU: on an H200 (cuBLASLt 13.1) 73% and 96% exact, none more than a unit off */
        double mx = 0.0;
        for (size_t i = 0; i < np; i++) mx = fmax(mx, fabs(dpre[i]));
        check_act_rn_floor_pct(name, dpre, gdpre, np, 1e-4 * mx, 60);
    }
    else check_act(name, dpre, gdpre, np, tol_mm);
    snprintf(name, sizeof name, "%s dw", shape);
    check(name, dw, gdw, nw, tol_mm);
    if (with_bias) {
        snprintf(name, sizeof name, "%s dbias", shape);
        check(name, db, gdb, OC, TOL_F32);
    }
    if (fused && tol_mm != TOL_FP32MM) {
        printf("%s %s takes the DGELU epilogue: %s\n", did ? "ok  " : "FAIL", shape, did ? "yes" : "no");
        if (did) pass++; else fail++;
    }
    if (!fused && did) {
        printf("FAIL %s took the DGELU epilogue, which it cannot\n", shape);
        fail++;
    }
    /* SwiGLU's gradients from d(h): the 16-byte form where C % 8 == 0 and
     * the operands are aligned */
    const long pw = kernels_cuda_vec_pointwise_calls() - p0, pw_want = swiglu && C % 8 == 0 && !off;
    if (pw != pw_want) {
        printf("FAIL %s: %ld SwiGLU calls in the 16-byte form, %ld wanted\n", shape, pw, pw_want);
        fail++;
    } else if (swiglu) {
        printf("ok   %s: SwiGLU's gradients %s\n", shape, pw ? "in the 16-byte form" : "an element at a time");
        pass++;
    }
    free(dout); free(inp); free(w); free(pre); free(dpre); free(dw); free(db); free(dout0); free(db0);
}

/* Which GELU cuBLASLt's epilogue computes. Its documentation says only
 * "GELU"; GPT-2 needs the tanh approximation (gelu_forward), which differs
 * from the erf form by up to 4.7e-4. With inp = multiples of 1/32 in [-5, 5]
 * (exact in TF32 and bf16), w = identity and a zero bias, pre must be inp
 * exactly and out the GELU of it: the RMS distance of out from each form
 * (in double) says which one it is. Fails unless the GEMM took the epilogue
 * and is closer to the tanh form by 4x. */
void test_gelu_epilogue_variant(void) {
    int N = 128, C = 64;
    size_t n = (size_t)N * C;
    float *x = malloc_check(n * sizeof(float)), *w = malloc_check((size_t)C * C * sizeof(float));
    float *zero = malloc_check((size_t)C * sizeof(float)), *out = malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 321) - 160) / 32.0f;
    for (int i = 0; i < C * C; i++) w[i] = i / C == i % C ? 1.0f : 0.0f;
    for (int i = 0; i < C; i++) zero[i] = 0.0f;
    float *gx = dcopy_act(x, n), *gw = dcopy(w, (size_t)C * C), *gz = dcopy(zero, C);
    float *gpre = dcopy(x, n), *gout = dcopy_act(x, n);
    long f0 = kernels_cuda_fused_gelu_calls();
    KG->matmul_gelu_forward(gout, gpre, gx, gw, gz, N, C, C);
    int did = kernels_cuda_fused_gelu_calls() > f0;
    size_t bad = bits_differ(x, gpre, n);
    float *ho = act_to_host(gout, n);
    memcpy(out, ho, n * sizeof(float));
    free(ho);
    double se_tanh = 0, se_erf = 0;
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        double gt = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        double ge = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        se_tanh += (out[i] - gt) * (out[i] - gt);
        se_erf += (out[i] - ge) * (out[i] - ge);
    }
    double rt = sqrt(se_tanh / n), re = sqrt(se_erf / n);
    int ok = did && !bad && rt * 4 < re;
    printf("%s GELU epilogue (%s): pre = inp in %zu of %zu words; RMS distance from the tanh form %.2e, from the erf form "
           "%.2e: %s\n", ok ? "ok  " : "FAIL", did ? "fused" : "NOT fused, nothing to tell", n - bad, n, rt, re,
           rt < re ? "tanh approximation" : "erf (exact) GELU");
    if (ok) pass++; else fail++;
    free(x); free(w); free(zero); free(out);
}

/* The same question for the DGELU epilogue: with dout = 1 and w = identity
 * the product is exactly 1, so dpre is the GELU's derivative at pre (the
 * tanh form's, as gelu_backward; the erf form's Phi(x) + x phi(x) differs
 * from it by up to 8.7e-4 on [-5, 5]). Fails unless the GEMM took the epilogue and is closer to
 * the tanh form's by 4x. */
void test_dgelu_epilogue_variant(void) {
    int N = 128, C = 64;
    size_t n = (size_t)N * C;
    float *x = malloc_check(n * sizeof(float)), *w = malloc_check((size_t)C * C * sizeof(float));
    float *one = malloc_check(n * sizeof(float)), *d = malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 321) - 160) / 32.0f, one[i] = 1.0f;
    for (int i = 0; i < C * C; i++) w[i] = i / C == i % C ? 1.0f : 0.0f;
    float *gx = dcopy_act(x, n), *gw = dcopy(w, (size_t)C * C), *gone = dcopy(one, n), *gd = dcopy(one, n);
    float *gdw = dcopy(w, (size_t)C * C), *gpre = dcopy(x, n);
    long f0 = kernels_cuda_fused_dgelu_calls();
    KG->matmul_gelu_backward(gd, gdw, NULL, gone, NULL, gx, gw, gpre, N, C, C);
    int did = kernels_cuda_fused_dgelu_calls() > f0;
    KG->to_host(d, gd, n * sizeof(float));
    double se_tanh = 0, se_erf = 0;
    for (size_t i = 0; i < n; i++) {
        double v = x[i], k = 0.7978845608028654, t = tanh(k * (v + 0.044715 * v * v * v));
        double gt = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
        double ge = 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / 2.5066282746310002 /* sqrt(2 pi) */;
        se_tanh += (d[i] - gt) * (d[i] - gt);
        se_erf += (d[i] - ge) * (d[i] - ge);
    }
    double rt = sqrt(se_tanh / n), re = sqrt(se_erf / n);
    int ok = did && rt * 4 < re;
    printf("%s DGELU epilogue (%s): RMS distance from the tanh form's derivative %.2e, from the erf form's %.2e: %s\n",
           ok ? "ok  " : "FAIL", did ? "fused" : "NOT fused, nothing to tell", rt, re,
           rt < re ? "tanh approximation" : "erf (exact) GELU");
    if (ok) pass++; else fail++;
    free(x); free(w); free(one); free(d);
}


/* matmul_forward_a / matmul_backward_a: matmul_forward and
 * matmul_backward with [a] out and dout: the LM head's logits (no bias),
 * and with a bias the qkv projection's qkv (the bias gradient, as the qkv
 * projection's backward takes it, from the [a] gradients as stored). Under
 * bf16 the CPU takes the operands rounded to bf16 (what the GEMMs read; the
 * bias too, which the bf16 epilogue adds as a bf16 copy), so the bf16 out
 * must be its product rounded to nearest (check_act_rn: fp32 values read as
 * bf16, truncated, or the bias added after a first rounding, fail it) and
 * dinp / dw, from the bf16 gradients as stored, equal its own up to the
 * fp32 summation order (TOL_FP32MM); under TF32 and fp32 the matmul
 * tolerance. */
void test_lm_head_case(int N, int C, int V, int with_bias, int bias_off) {
    char name[96];
    const char *what = with_bias ? "qkv" : "lm_head";
    size_t nx = (size_t)N * C, nw = (size_t)V * C, no = (size_t)N * V;
    float *inp = hrand(nx, 1), *w = hrand(nw, 0.1f), *dl = hrand(no, 0.01f), *out = hrand(no, 1);
    float *bias = hrand(V, 1), *gbias = dcopy_off(bias, V, bias_off);
    act_round(inp, nx);
    act_round(dl, no);
    float *ginp = dcopy_act(inp, nx), *gw = dcopy(w, nw), *gdl = dcopy_act(dl, no), *gout = dcopy_act(out, no);
    act_round(w, nw); /* the bf16 GEMM's conversion of the weights */
    act_round(bias, V); /* and of the bias */
    KC->matmul_forward_a(out, inp, w, with_bias ? bias : NULL, N, C, V);
    KG->matmul_forward_a(gout, ginp, gw, with_bias ? gbias : NULL, N, C, V);
    snprintf(name, sizeof name, "%s_fwd %dx%dx%d", what, N, C, V);
    if (act16()) check_act_rn_sum(name, out, gout, no);
    else check(name, out, gout, no, tol_mm);
    float *dinp = hrand(nx, 1), *dw = hrand(nw, 1), *db = hrand(V, 1);
    float *gdinp = dcopy(dinp, nx), *gdw = dcopy(dw, nw), *gdb = dcopy(db, V);
    KC->matmul_backward_a(dinp, dw, db, dl, inp, w, N, C, V);
    KG->matmul_backward_a(gdinp, gdw, gdb, gdl, ginp, gw, N, C, V);
    const double tol = act16() ? TOL_FP32MM : tol_mm;
    snprintf(name, sizeof name, "%s_bwd dinp %dx%dx%d", what, N, C, V);
    check(name, dinp, gdinp, nx, tol);
    snprintf(name, sizeof name, "%s_bwd dw %dx%dx%d", what, N, C, V);
    check(name, dw, gdw, nw, tol);
    snprintf(name, sizeof name, "matmul_backward_a dbias %dx%dx%d (from [a] dout)", N, C, V);
    check(name, db, gdb, V, TOL_F32);
    free(inp); free(w); free(dl); free(out); free(dinp); free(dw); free(db); free(bias);
}

