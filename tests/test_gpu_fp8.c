/* test_gpu_fp8.c — the CUDA backend's FP8 linears (kernels/fp8.cuh,
 * train.compute_dtype fp8, each recipe) against the CPU backend's, which
 * fake-quantize with fp8.c: `tests/test_gpu fp8` (tests/test_gpu.c's
 * main calls test_gpu_fp8; on the host emulation in make test).
 *
 *   codes   the device's casts and scales (kernels_cuda_fp8_codes) against
 *           fp8_encode(x * fp8_scale(amax)) and fp8_scale, every element
 *           and the scale's bits: random tensors, every tie between two
 *           neighbouring codes of each format, all-zero, NaN, infinity and
 *           subnormal-amax tensors, bf16 sources. Must be identical.
 *   groups  rowwise and blockwise (kernels_cuda_fp8_quant): each operand
 *           kind (activation or gradient, weight; K along its columns or
 *           its rows) of shapes on and off the 128 grid, with an all-zero
 *           row, column and 128 x 128 tile and an outlier in one block:
 *           the codes against fp8_encode with fp8.c's group scales
 *           (fp8_groups, fp8_group_scales) and the inverse scales against
 *           cuBLASLt's layout for the mode (OUTER_VEC_32F a row;
 *           VEC128_32F [K / 128][R padded to 4]; BLK128x128_32F [R /
 *           128][K / 128 padded to 4]) written here from its description,
 *           bit for bit: a mis-sized group or a transposed layout differs.
 *   products matmul_forward_res / _a, matmul_gelu_forward, matmul_backward
 *           and _a under fp8_scope against the CPU's on the same values
 *           (the [a] operands rounded to bf16 for both), shapes that are
 *           not multiples of 16 or 128, under each recipe (the emulated
 *           cuBLASLt reads the scales in the layout cuBLASLt documents,
 *           so a layout the products wrote wrong would show here; with
 *           zero groups and outliers in each operand). Error metric as test_gpu.c's
 *           (max |gpu - cpu| / max |cpu|), within TOL_FP8 1e-3 for fp32
 *           outputs: both sides multiply the same FP8 values (each a
 *           product of two FP8 numbers is exact in fp32), so only the
 *           accumulation differs: its order (the CPU's sgemm, the
 *           emulator's 8 lanes; about 1e-6 at these K) and on Hopper the
 *           tensor cores' accumulator between its fp32 promotions (about
 *           14 bits, 6e-5 relative a partial sum; docs/fp8.md). One code
 *           off by one step moves a product by 2^-3 (E4M3) of itself,
 *           around 1e-2 of these outputs: well past the tolerance. bf16
 *           outputs (the [a] ones) add their rounding, 2^-9 of an element:
 *           TOL_FP8_A 5e-3.
 *   copies  a weight's FP8 copy made once in a weights_stable range and
 *           reused by the next micro-batch's forward and the backward
 *           (kernels_cuda_fp8_stats), made again after weights_stable
 *           names it changed, never outside a range; the kept copy's
 *           products bit-identical to the scratch quantization's. */
#include "check.h"
#include "fp8.h"
#include "kernels.h"
#include "util.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_FP8 1e-3
#define TOL_FP8_A 5e-3

int test_gpu_fp8(const Kernels *kc, const Kernels *kg, int *npass, int *nfail);

static const Kernels *KC, *KG;
static int RECIPE;
static const char *RNAME = "tensorwise";
static uint64_t rs = 0x243F6A8885A308D3ull;

static float rnd_normal(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        u[i] = ((rs >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

static float bf16r(float f) { /* to bf16 to nearest even, as the [a] buffers hold it */
    uint32_t u;
    memcpy(&u, &f, 4);
    u = round_bf16_word(u, 0, 0);
    memcpy(&f, &u, 4);
    return f;
}

/* device copies: fp32, or an [a] buffer (bf16 words) */
static void *dev(const float *h, size_t n) {
    void *d = KG->alloc(n * 4 + 256);
    KG->from_host(d, h, n * 4);
    return d;
}
static void *dev16(const float *h, size_t n) {
    uint16_t *t = malloc_check(n * 2 + 16);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        float f = bf16r(h[i]);
        memcpy(&u, &f, 4);
        t[i] = (uint16_t)(u >> 16);
    }
    void *d = KG->alloc(n * 2 + 256);
    KG->from_host(d, t, n * 2);
    free(t);
    return d;
}
static float *host(const void *d, size_t n, int x16) {
    float *h = malloc_check(n * 4 + 16);
    if (!x16) {
        KG->to_host(h, d, n * 4);
        return h;
    }
    uint16_t *t = malloc_check(n * 2 + 16);
    KG->to_host(t, d, n * 2);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)t[i] << 16;
        memcpy(&h[i], &u, 4);
    }
    free(t);
    return h;
}

static double rel_err(const float *ref, const float *got, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(ref[i]) != isfinite(got[i])) return INFINITY;
        double d = fabs((double)ref[i] - got[i]);
        e = d > e ? d : e;
        m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    }
    return e / (m > 0 ? m : 1);
}

static void cmp(const char *what, const float *ref, const float *got, size_t n, double tol) {
    double e = rel_err(ref, got, n);
    check(e <= tol, "fp8 %-10s %-44s max err %.2e of max |cpu| (tol %.0e)", RNAME, what, e, tol);
}

/* ---- codes ---- */

static void codes_case(const char *what, const float *x, size_t n, int e5m2, int x16) {
    Fp8Format f = e5m2 ? FP8_E5M2 : FP8_E4M3;
    float *v = malloc_check(n * 4 + 16), amax = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = x16 ? bf16r(x[i]) : x[i];
        float a = fabsf(v[i]);
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    float want_scale = fp8_scale(nan ? NAN : amax, f), scale = 0;
    void *d = x16 ? dev16(x, n) : dev(x, n);
    uint8_t *q = malloc_check(n + 16);
    kernels_cuda_fp8_codes(q, d, x16, n, e5m2, &scale);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (q[i] != fp8_encode(v[i] * want_scale, f) && !bad++) first = i;
    int ok = !bad && memcmp(&scale, &want_scale, 4) == 0;
    check(ok, "fp8 codes %-30s %s%s: %zu values, %zu differ from fp8_encode, scale %g (fp8_scale %g)", what,
           e5m2 ? "E5M2" : "E4M3", x16 ? " from bf16" : "", n, bad, scale, want_scale);
    if (bad)
        printf("     first at [%zu]: x %g -> gpu 0x%02x, cpu 0x%02x\n", first, v[first], q[first],
               fp8_encode(v[first] * want_scale, f));
    KG->free(d);
    free(q);
    free(v);
}

static void test_codes(void) {
    size_t n = 5000;
    float *x = malloc_check(n * 4 + 16);
    for (int e5 = 0; e5 < 2; e5++) {
        Fp8Format f = e5 ? FP8_E5M2 : FP8_E4M3;
        for (size_t i = 0; i < n; i++) x[i] = rnd_normal() * (i % 7 == 0 ? 40.0f : 0.01f);
        codes_case("random", x, n, e5, 0);
        codes_case("random", x, n, e5, 1);
        /* the format's top as amax (scale 1 exactly): every code, and every
         * tie between two neighbours, rounded to the even one */
        size_t k = 0;
        for (int c = 0; c < 0x7f; c++) {
            float a = fp8_decode((uint8_t)c, f), b = fp8_decode((uint8_t)(c + 1), f);
            if (!isfinite(a)) continue;
            x[k++] = a, x[k++] = -a;
            if (isfinite(b)) x[k++] = 0.5f * (a + b), x[k++] = -0.5f * (a + b);
        }
        codes_case("each code and tie", x, k, e5, 0);
        for (size_t i = 0; i < 64; i++) x[i] = 0.0f;
        codes_case("all zero", x, 64, e5, 0);
        x[10] = NAN, x[11] = 3.0f, x[12] = -1e30f;
        codes_case("NaN (scale 1)", x, 64, e5, 0);
        x[10] = -INFINITY;
        codes_case("infinity, saturating", x, 64, e5, 0);
        for (size_t i = 0; i < 64; i++) x[i] = (float)(i + 1) * 1e-42f;
        codes_case("subnormal amax (FLT_MAX)", x, 64, e5, 0);
    }
    free(x);
}

/* ---- the groups of rowwise and blockwise ---- */

static int pad16(int n) { return (n + 15) & ~15; }
static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int r4(int n) { return (n + 3) & ~3; }

/* x [rows, cols] as an operand (weight, kdim as fp8_groups takes them)
 * against fp8.c and cuBLASLt's scale layouts */
static void quant_case(const float *x0, int rows, int cols, int weight, int kdim, int e5m2, int x16) {
    Fp8Format f = e5m2 ? FP8_E5M2 : FP8_E4M3;
    size_t n = (size_t)rows * cols;
    float *x = malloc_check(n * 4 + 16);
    for (size_t i = 0; i < n; i++) x[i] = x16 ? bf16r(x0[i]) : x0[i];
    int gr, gc;
    fp8_groups(RECIPE, weight, kdim, rows, cols, &gr, &gc);
    const int nct = cdiv(cols, gc);
    float *s = malloc_check(fp8_n_groups(rows, cols, gr, gc) * 4 + 16);
    fp8_group_scales(s, x, rows, cols, gr, gc, f);
    /* the operand as the product reads it: R x K, K contiguous */
    const int R = kdim ? rows : cols, K = kdim ? cols : rows, ld = kdim ? pad16(cols) : pad16(rows);
    size_t nq = (size_t)R * ld, want_n;
    if (RECIPE == FP8_ROWWISE) want_n = r4(R);
    else if (weight) want_n = (size_t)cdiv(R, 128) * r4(cdiv(K, 128));
    else want_n = (size_t)cdiv(K, 128) * r4(R);
    uint8_t *want_q = calloc(nq + 16, 1), *got_q = malloc_check(nq + 16);
    float *want_i = calloc(want_n + 16, 4), *got_i = malloc_check((want_n + 4096) * 4);
    for (int i = 0; i < R; i++)
        for (int p = 0; p < K; p++) {
            int r = kdim ? i : p, c = kdim ? p : i; /* the source element */
            float sc = s[(size_t)(r / gr) * nct + c / gc];
            want_q[(size_t)i * ld + p] = fp8_encode(x[(size_t)r * cols + c] * sc, f);
            size_t o = RECIPE == FP8_ROWWISE ? (size_t)i
                       : weight             ? (size_t)(i / 128) * r4(cdiv(K, 128)) + p / 128
                                            : (size_t)(p / 128) * r4(R) + i;
            want_i[o] = 1.0f / sc;
        }
    void *d = x16 ? dev16(x0, n) : dev(x0, n);
    size_t got_n = 0;
    kernels_cuda_fp8_quant(got_q, got_i, &got_n, d, x16, rows, cols, e5m2, weight, kdim);
    size_t bad_q = 0, bad_i = 0;
    for (size_t i = 0; i < nq; i++) bad_q += got_q[i] != want_q[i];
    for (size_t i = 0; got_n == want_n && i < want_n; i++) bad_i += memcmp(&got_i[i], &want_i[i], 4) != 0;
    check(!bad_q && !bad_i && got_n == want_n,
          "fp8 %-10s groups %3dx%-3d %s K its %s (%dx%d groups), %s%s: %zu of %zu codes, %zu of %zu inverse scales "
          "differ from fp8.c's in cuBLASLt's layout (%zu scales, want %zu)",
          RNAME, rows, cols, weight ? "weight,    " : "activation,", kdim ? "cols" : "rows", gr, gc,
          e5m2 ? "E5M2" : "E4M3", x16 ? " from bf16" : "", bad_q, nq, bad_i, want_n, got_n, want_n);
    KG->free(d);
    free(x), free(s), free(want_q), free(got_q), free(want_i), free(got_i);
}

static void test_groups(void) {
    const int shapes[][2] = {{130, 257}, {256, 384}, {37, 50}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const int rows = shapes[k][0], cols = shapes[k][1];
        float *x = malloc_check((size_t)rows * cols * 4 + 16);
        for (int r = 0; r < rows; r++) /* magnitudes that differ by row and by 128-block */
            for (int c = 0; c < cols; c++)
                x[(size_t)r * cols + c] = rnd_normal() * (float)(1 + r % 5) * (float)(1 + (c / 128 + r / 128) % 3);
        for (int c = 0; c < cols; c++) x[(size_t)2 * cols + c] = 0.0f; /* an all-zero row */
        for (int r = 0; r < rows; r++) x[(size_t)r * cols + 1] = 0.0f; /* and column */
        for (int r = 0; r < 128 && r < rows; r++) /* and 128 x 128 tile */
            for (int c = 128; c < 256 && c < cols; c++) x[(size_t)r * cols + c] = 0.0f;
        x[(size_t)5 * cols + cols - 1] = 700.0f; /* an outlier in one block */
        for (int weight = 0; weight < 2; weight++)
            for (int kdim = 0; kdim < 2; kdim++)
                for (int e5 = 0; e5 < (weight ? 1 : 2); e5++) quant_case(x, rows, cols, weight, kdim, e5, 0);
        quant_case(x, rows, cols, 0, 1, 0, 1);
        quant_case(x, rows, cols, 0, 0, 1, 1);
        free(x);
    }
}

/* ---- products ---- */

/* zero groups and outliers in each operand (spice): the scales of
 * neighbouring groups far apart, so one read for another shows */
static void spice_up(float *inp, float *w, float *dout, int N, int C, int OC) {
    for (int c = 0; c < C; c++) inp[(size_t)3 % N * C + c] = 0.0f;
    inp[(size_t)5 % N * C + (C > 130 ? 130 : C - 1)] = bf16r(300.0f);
    for (int r = 0; r < (OC < 128 ? OC : 128); r++)
        for (int c = 128; c < (C < 256 ? C : 256); c++) w[(size_t)r * C + c] = 0.0f;
    w[(size_t)1 % OC * C + 1 % C] = 5.0f;
    for (int c = 0; c < OC; c++) dout[(size_t)2 % N * OC + c] = 0.0f;
    dout[(size_t)7 % N * OC + 3 % OC] = 3.0f;
}

static void test_products(int N, int C, int OC, int spice) {
    char what[96];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = malloc_check(ni * 4 + 16), *w = malloc_check(nw * 4 + 16), *b = malloc_check(OC * 4 + 16);
    float *res = malloc_check(no * 4 + 16), *dout = malloc_check(no * 4 + 16), *dw0 = malloc_check(nw * 4 + 16);
    for (size_t i = 0; i < ni; i++) inp[i] = bf16r(rnd_normal());
    for (size_t i = 0; i < nw; i++) w[i] = 0.05f * rnd_normal();
    for (int i = 0; i < OC; i++) b[i] = 0.1f * rnd_normal();
    for (size_t i = 0; i < no; i++) res[i] = rnd_normal(), dout[i] = 0.01f * rnd_normal();
    for (size_t i = 0; i < nw; i++) dw0[i] = 0.01f * rnd_normal();
    if (spice) spice_up(inp, w, dout, N, C, OC);
    void *d_inp = dev16(inp, ni), *d_w = dev(w, nw), *d_b = dev(b, OC), *d_res = dev(res, no), *d_dout = dev(dout, no);
    float *ref = malloc_check((no > nw ? no : nw) * 4 + ni * 4 + 16), *got;
    void *d_out = KG->alloc(no * 4 + 256);

    /* forward: fp32 out with the residual (cuBLASLt's C), [a] out */
    KC->matmul_forward_res(ref, res, inp, w, b, N, C, OC);
    KG->matmul_forward_res(d_out, d_res, d_inp, d_w, d_b, N, C, OC);
    got = host(d_out, no, 0);
    snprintf(what, sizeof what, "forward_res %dx%dx%d", N, C, OC);
    cmp(what, ref, got, no, TOL_FP8);
    free(got);
    KC->matmul_forward(ref, inp, w, b, N, C, OC);
    KG->matmul_forward_a(d_out, d_inp, d_w, d_b, N, C, OC);
    got = host(d_out, no, 1);
    snprintf(what, sizeof what, "forward_a %dx%dx%d (bf16 out)", N, C, OC);
    cmp(what, ref, got, no, TOL_FP8_A);
    free(got);

    /* backward: fp32 dout (dinp fp32, dw added to, dbias), then [a] dout */
    float *dinp = malloc_check(ni * 4 + 16), *dw = malloc_check(nw * 4 + 16), *db = malloc_check(OC * 4 + 16);
    for (int pass = 0; pass < 2; pass++) {
        const int a = pass == 1;
        float *dref = malloc_check(no * 4 + 16);
        for (size_t i = 0; i < no; i++) dref[i] = a ? bf16r(dout[i]) : dout[i];
        void *d_d = a ? dev16(dout, no) : d_dout;
        memcpy(dw, dw0, nw * 4);
        memset(db, 0, OC * 4);
        void *g_dinp = KG->alloc(ni * 4 + 256), *g_dw = dev(dw0, nw), *g_db = dev(db, OC);
        KC->matmul_backward(dinp, dw, db, dref, inp, w, N, C, OC);
        if (a) KG->matmul_backward_a(g_dinp, g_dw, g_db, d_d, d_inp, d_w, N, C, OC);
        else KG->matmul_backward(g_dinp, g_dw, g_db, d_d, d_inp, d_w, N, C, OC);
        got = host(g_dinp, ni, 0);
        snprintf(what, sizeof what, "%s dinp %dx%dx%d", a ? "backward_a" : "backward", N, C, OC);
        cmp(what, dinp, got, ni, TOL_FP8);
        free(got);
        got = host(g_dw, nw, 0);
        for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i], got[i] -= dw0[i]; /* the product's part of the sum */
        snprintf(what, sizeof what, "%s dw (added to) %dx%dx%d", a ? "backward_a" : "backward", N, C, OC);
        cmp(what, dw, got, nw, TOL_FP8);
        free(got);
        got = host(g_db, OC, 0);
        snprintf(what, sizeof what, "%s dbias (unquantized dout)", a ? "backward_a" : "backward");
        cmp(what, db, got, OC, 1e-5);
        free(got);
        KG->free(g_dinp), KG->free(g_dw), KG->free(g_db);
        if (a) KG->free(d_d);
        free(dref);
    }
    KG->free(d_inp), KG->free(d_w), KG->free(d_b), KG->free(d_res), KG->free(d_dout), KG->free(d_out);
    free(inp), free(w), free(b), free(res), free(dout), free(dw0), free(ref), free(dinp), free(dw), free(db);
}

/* matmul_gelu_forward ([a] pre and out): the FP8 product and bias into
 * pre, then the GELU kernel, which reads pre rounded to bf16 and rounds
 * its output again: two bf16 roundings, 2 x TOL_FP8_A (as the bf16 path's
 * unfused form; the CPU keeps fp32 throughout) */
static void test_gelu(int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = malloc_check(ni * 4 + 16), *w = malloc_check(nw * 4 + 16), *b = malloc_check(OC * 4 + 16);
    for (size_t i = 0; i < ni; i++) inp[i] = bf16r(rnd_normal());
    for (size_t i = 0; i < nw; i++) w[i] = 0.05f * rnd_normal();
    for (int i = 0; i < OC; i++) b[i] = 0.1f * rnd_normal();
    float *pre = malloc_check(no * 4 + 16), *out = malloc_check(no * 4 + 16);
    void *d_inp = dev16(inp, ni), *d_w = dev(w, nw), *d_b = dev(b, OC);
    void *g_pre = KG->alloc(no * 2 + 256), *g_out = KG->alloc(no * 2 + 256);
    KC->matmul_gelu_forward(out, pre, inp, w, b, N, C, OC);
    KG->matmul_gelu_forward(g_out, g_pre, d_inp, d_w, d_b, N, C, OC);
    float *h = host(g_out, no, 1);
    char what[96];
    snprintf(what, sizeof what, "gelu_forward %dx%dx%d (bf16 out)", N, C, OC);
    cmp(what, out, h, no, 2 * TOL_FP8_A);
    free(h);
    /* the backward: dpre = gelu'(pre) . (dout w2) for the down-projection
     * w2 [C2 = C, F = OC]: dout [N, C], fp32, with its bias gradient */
    float *pre16 = host(g_pre, no, 1), *w2 = malloc_check(nw * 4 + 16), *dout = malloc_check(ni * 4 + 16);
    float *fch = malloc_check(no * 4 + 16), *dpre = malloc_check(no * 4 + 16), *dw = calloc(nw, 4), *db = calloc(C, 4);
    for (size_t i = 0; i < nw; i++) w2[i] = 0.05f * rnd_normal();
    for (size_t i = 0; i < ni; i++) dout[i] = 0.01f * rnd_normal();
    for (size_t i = 0; i < no; i++) fch[i] = bf16r(rnd_normal());
    void *d_w2 = dev(w2, nw), *d_dout = dev(dout, ni), *d_fch = dev16(fch, no), *d_pre = dev16(pre16, no);
    void *g_dpre = KG->alloc(no * 2 + 256), *g_dw = dev(dw, nw), *g_db = dev(db, C);
    KC->matmul_gelu_backward(dpre, dw, db, dout, NULL, fch, w2, pre16, N, OC, C);
    KG->matmul_gelu_backward(g_dpre, g_dw, g_db, d_dout, NULL, d_fch, d_w2, d_pre, N, OC, C);
    h = host(g_dpre, no, 1);
    snprintf(what, sizeof what, "gelu_backward dpre %dx%dx%d (bf16)", N, OC, C);
    cmp(what, dpre, h, no, 2 * TOL_FP8_A);
    free(h);
    h = host(g_dw, nw, 0);
    snprintf(what, sizeof what, "gelu_backward dw %dx%dx%d", N, OC, C);
    cmp(what, dw, h, nw, TOL_FP8);
    free(h);
    h = host(g_db, C, 0);
    cmp("gelu_backward dbias", db, h, C, 1e-5);
    free(h);
    KG->free(d_w2), KG->free(d_dout), KG->free(d_fch), KG->free(d_pre), KG->free(g_dpre), KG->free(g_dw), KG->free(g_db);
    free(pre16), free(w2), free(dout), free(fch), free(dpre), free(dw), free(db);
    KG->free(d_inp), KG->free(d_w), KG->free(d_b), KG->free(g_pre), KG->free(g_out);
    free(inp), free(w), free(b), free(pre), free(out);
}

/* ---- the weights' copies ---- */

static void test_copies(void) {
    const int N = 48, C = 80, OC = 112;
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = malloc_check(ni * 4 + 16), *w = malloc_check(nw * 4 + 16), *dout = malloc_check(no * 4 + 16);
    for (size_t i = 0; i < ni; i++) inp[i] = rnd_normal();
    for (size_t i = 0; i < nw; i++) w[i] = 0.05f * rnd_normal();
    for (size_t i = 0; i < no; i++) dout[i] = 0.01f * rnd_normal();
    void *d_inp = dev16(inp, ni), *d_w = dev(w, nw), *d_dout = dev(dout, no);
    void *o1 = KG->alloc(no * 2 + 256), *o2 = KG->alloc(no * 2 + 256), *dinp = KG->alloc(ni * 4 + 256);
    void *dw = KG->alloc(nw * 4 + 256);
    long m0, h0, m1, h1, m2, h2, m3, h3;
    kernels_cuda_fp8_stats(&m0, &h0, NULL);
    KG->matmul_forward_a(o1, d_inp, d_w, NULL, N, C, OC); /* outside any range: scratch */
    kernels_cuda_fp8_stats(&m1, &h1, NULL);
    KG->weights_stable(d_w, nw);
    KG->matmul_forward_a(o2, d_inp, d_w, NULL, N, C, OC);   /* micro-batch 1: made */
    KG->matmul_forward_a(o2, d_inp, d_w, NULL, N, C, OC);   /* micro-batch 2: reused */
    KG->matmul_backward(dinp, dw, NULL, d_dout, d_inp, d_w, N, C, OC); /* its transposed layout: reused */
    kernels_cuda_fp8_stats(&m2, &h2, NULL);
    float *a = host(o1, no, 1), *b = host(o2, no, 1);
    int same = memcmp(a, b, no * 4) == 0;
    KG->weights_stable(d_w, nw); /* the optimizer wrote them: made again */
    KG->matmul_forward_a(o2, d_inp, d_w, NULL, N, C, OC);
    kernels_cuda_fp8_stats(&m3, &h3, NULL);
    KG->weights_stable(NULL, 0);
    check(m1 == m0 && h1 == h0 && m2 - m1 == 1 && h2 - h1 == 2 && m3 - m2 == 1 && h3 == h2 && same,
           "fp8 %s weight copy: none outside a range (%ld made), made once for 2 micro-batches and the backward "
           "(%ld made, %ld reused), again after weights_stable (%ld); products %s the scratch copy's",
           RNAME, m1 - m0, m2 - m1, h2 - h1, m3 - m2, same ? "bit-identical to" : "DIFFER from");
    KG->free(d_inp), KG->free(d_w), KG->free(d_dout), KG->free(o1), KG->free(o2), KG->free(dinp), KG->free(dw);
    free(inp), free(w), free(dout), free(a), free(b);
}

/* the device is sm_90, where cuBLASLt has rowwise's and blockwise's scale
 * modes (tests/test_gpu.c runs none of this before sm_89) */
static int sm_90(void) {
    const char *cc = strstr(kernels_cuda_device_info(), ", cc ");
    int major = 0, minor = 0;
    return cc && sscanf(cc, ", cc %d.%d", &major, &minor) == 2 && major == 9 && minor == 0;
}

int test_gpu_fp8(const Kernels *kc, const Kernels *kg, int *npass, int *nfail) {
    KC = kc, KG = kg;
    Fp8Sizes z = {(size_t)256 * 768, (size_t)768 * 384, 4 * (size_t)768 * 384, 4, 8192};
    const int recipes[] = {FP8_TENSORWISE, FP8_BLOCKWISE, FP8_ROWWISE};
    const char *names[] = {"tensorwise", "blockwise", "rowwise"};
    for (int ri = 0; ri < 3; ri++) {
        const int tw = recipes[ri] == FP8_TENSORWISE;
        RECIPE = recipes[ri], RNAME = names[ri];
        if (!tw && !sm_90()) {
            printf("fp8 %s: cuBLASLt scales it on sm_90 only: not checked on this device\n", RNAME);
            continue;
        }
        KC->fp8_setup(RECIPE, &z);
        KG->fp8_setup(RECIPE, &z);
        KC->fp8_scope(1);
        KG->fp8_scope(1);
        if (tw) test_codes();
        else test_groups();
        test_products(64, 128, 96, 0);
        test_products(37, 50, 29, !tw);    /* nothing a multiple of 16: padded K, staged outputs */
        test_products(130, 200, 136, !tw); /* past 128 in every dimension, no multiple of it */
        test_products(256, 384, 768, !tw); /* dinp and dw written by cuBLASLt straight (16-byte rows, no bias) */
        test_gelu(64, 128, 96);
        if (tw) test_gelu(37, 50, 29);
        test_copies();
        long made, hits, staged;
        kernels_cuda_fp8_stats(&made, &hits, &staged);
        if (tw) check(staged > 0, "fp8 products with a bias or an unaligned output went through the fp32 stage (%ld)", staged);
        KC->fp8_scope(0);
        KG->fp8_scope(0);
        KC->fp8_setup(-1, NULL);
        KG->fp8_setup(-1, NULL);
    }
    *npass += n_pass;
    *nfail += n_fail;
    return n_fail;
}
