/* test_gpu.c — every kernel of the CUDA backend against the CPU backend on
 * the same random inputs. Needs a GPU: without one it FAILS (exit 1, one
 * line), it does not skip.
 *
 * Error metric: max |gpu - cpu| / max |cpu| over the output (outputs that
 * are accumulated into start from the same random values on both sides, so
 * the "adds, not overwrites" contract is checked too). Tolerances:
 *   TOL_F32  1e-5  fp32 kernels (fp32 statistics vs the CPU's double ones,
 *                  expf vs the CPU's polynomial exp)
 *   TOL_TF32 5e-3  matmuls and attention: cuBLASLt reads its inputs as TF32
 *                  (10-bit mantissa, unit roundoff 2^-11 = 4.9e-4) and
 *                  accumulates in fp32; K-term sums of random-sign products
 *                  stay within a few units of that
 *   TOL_BF16 1e-2  matmuls under compute dtype bf16: both operands
 *                  rounded to bf16 (8-bit mantissa, unit roundoff 2^-8 =
 *                  3.9e-3), fp32 accumulation; the fused attention too
 *                  (bf16 mma.sync: Q, K, V, dO, P and dS rounded to bf16),
 *                  the GEMM attention stays TF32
 *   TOL_FP32MM 1e-4 matmuls and attention under compute dtype fp32
 *                  (plain fp32 GEMMs: only the summation order differs)
 *   attention runs in both modes, gemm and flash (the fused kernels), at
 *   the same tolerance: both use TF32 tensor cores, and plain fp32 (FMA in
 *   the fused kernels) under compute dtype fp32
 *   TOL_RED  1e-9  sum / sumsq (both accumulate in double)  */
#include "kernels.h"
#include "test_gpu.h"
#include "model.h"
#include "util.h"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_F32 1e-5
#define TOL_TF32 5e-3
#define TOL_RED 1e-9

static double tol_mm = TOL_TF32;  /* the linear layers' GEMMs */
static double tol_att = TOL_TF32; /* attention (always TF32 unless fp32) */

const Kernels *KC, *KG;
int pass, fail;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_uniform(void) { return (float)(rnd_u32() & 0xFFFFFF) / 16777216.0f; }
static float rnd_normal(void) {
    float u = rnd_uniform() + 1e-7f, v = rnd_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

float *hrand(size_t n, float sd) {
    float *x = malloc_check(n * sizeof(float) + 16);
    for (size_t i = 0; i < n; i++) x[i] = sd * rnd_normal();
    return x;
}
static float *hdup(const float *h, size_t n) {
    float *d = malloc_check(n * sizeof(float) + 16);
    memcpy(d, h, n * sizeof(float));
    return d;
}
/* device copy; off > 0 shifts the pointer by off floats inside a larger
 * allocation to exercise unaligned operands (the base is kept for free) */
static float *dbase[4096];
static int nbase;
static float *dcopy_off(const float *h, size_t n, int off) {
    float *base = KG->alloc((n + (size_t)off) * sizeof(float) + 16);
    dbase[nbase++] = base;
    KG->from_host(base + off, h, n * sizeof(float));
    return base + off;
}
float *dcopy(const float *h, size_t n) { return dcopy_off(h, n, 0); }
int *dcopy_int(const int *h, size_t n) {
    int *d = KG->alloc(n * sizeof(int));
    dbase[nbase++] = (float *)d;
    KG->from_host(d, h, n * sizeof(int));
    return d;
}

/* Positions counted from each document's start (train.reset_position_ids),
 * documents of 1 to 64 tokens, each row's first token starting one: B x T
 * ints (free them) */
static int *doc_positions(int B, int T) {
    int *pos = malloc_check((size_t)B * T * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int t = 0, s = 0, len = 1 + (int)(rnd_u32() % 64); t < T; t++) {
            if (t - s == len) { s = t; len = 1 + (int)(rnd_u32() % 64); }
            pos[(size_t)b * T + t] = t - s;
        }
    return pos;
}

/* [a] buffers (kernels.h): KG->act_bytes an element, bf16 under
 * compute dtype bf16. A host float to bf16 to nearest even (the
 * rounding of kernels.h's round_bf16_word, seed 0) and back. */
static uint16_t bf16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(round_bf16_word(u, 0, 0) >> 16);
}
static float bf16_val(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
int act16(void) { return KG->act_bytes == 2; }

/* a device [a] buffer holding h (rounded to bf16 when [a] is bf16); off
 * shifts it by off elements, as dcopy_off */
static float *dcopy_act_off(const float *h, size_t n, int off) {
    if (!act16()) return dcopy_off(h, n, off);
    uint16_t *t = malloc_check(n * 2 + 16);
    for (size_t i = 0; i < n; i++) t[i] = bf16_rn(h[i]);
    char *base = KG->alloc((n + (size_t)off) * 2 + 16);
    dbase[nbase++] = (float *)base;
    KG->from_host(base + (size_t)off * 2, t, n * 2);
    free(t);
    return (float *)(base + (size_t)off * 2);
}
float *dcopy_act(const float *h, size_t n) { return dcopy_act_off(h, n, 0); }

/* the values of a device [a] buffer, widened to floats (malloc'd) */
float *act_to_host(const float *dev, size_t n) {
    float *h = malloc_check(n * sizeof(float) + 16);
    if (!act16()) {
        KG->to_host(h, dev, n * sizeof(float));
        return h;
    }
    uint16_t *t = malloc_check(n * 2 + 16);
    KG->to_host(t, dev, n * 2);
    for (size_t i = 0; i < n; i++) h[i] = bf16_val(t[i]);
    free(t);
    return h;
}

/* max |gpu - cpu| / max(max |cpu|, floor) within tol */
void check_host_floor(const char *name, const float *ref, const float *h, size_t n, double tol, double floor) {
    double maxerr = 0.0, maxref = 0.0;
    size_t worst = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(h[i]) && isfinite(ref[i])) nonfinite = 1;
        double e = fabs((double)h[i] - ref[i]);
        if (e > maxerr) { maxerr = e; worst = i; }
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    double rel = maxerr / (maxref > floor ? maxref : floor > 1e-30 ? floor : 1.0);
    if (!nonfinite && rel <= tol) {
        printf("ok   %-34s max err %.2e of max |ref| %.2e (tol %.0e)\n", name, rel, maxref, tol);
        pass++;
    } else {
        printf("FAIL %-34s max err %.2e of max |ref| %.2e (tol %.0e)%s; worst [%zu]: gpu %g cpu %g\n", name, rel,
               maxref, tol, nonfinite ? ", non-finite" : "", worst, h[worst], ref[worst]);
        fail++;
    }
}

static void check_host(const char *name, const float *ref, const float *h, size_t n, double tol) {
    check_host_floor(name, ref, h, n, tol, 1e-30);
}

static void check_floor(const char *name, const float *ref, const float *dev, size_t n, double tol, double floor) {
    float *h = malloc_check(n * sizeof(float) + 16);
    KG->to_host(h, dev, n * sizeof(float));
    check_host_floor(name, ref, h, n, tol, floor);
    free(h);
}

void check(const char *name, const float *ref, const float *dev, size_t n, double tol) {
    check_floor(name, ref, dev, n, tol, 1e-30);
}

/* n floats rounded to bf16 in place when [a] is bf16 (what dcopy_act
 * stores), so the CPU starts from the device's values */
void act_round(float *h, size_t n) {
    if (act16())
        for (size_t i = 0; i < n; i++) h[i] = bf16_val(bf16_rn(h[i]));
}

/* a device [a] buffer against the CPU's values */
void check_act(const char *name, const float *ref, const float *dev, size_t n, double tol) {
    float *h = act_to_host(dev, n);
    check_host(name, ref, h, n, tol);
    free(h);
}

/* An [a] output of a kernel that computes in fp32 and stores: fp32 [a]
 * within TOL_F32 of the CPU; bf16 [a] must be the CPU's value rounded to
 * nearest even, within one bf16 unit everywhere (the fp32 values may fall
 * on either side of a rounding boundary) and exactly in 99% of the
 * elements (truncation, or fp32 bytes read as bf16, would miss that).
 * Below 1e-37 both count as zero: the CPU's exp gives e^-87 for anything
 * smaller (kernels_cpu.c's exp_f), e^-inf included, where CUDA's gives 0.
 * floor: an absolute error allowed beside the unit (check_act_rn_sum). */
static void check_act_rn_floor_pct(const char *name, const float *ref, const float *dev, size_t n, double floor,
                                   size_t min_exact_pct);
static void check_act_rn_floor(const char *name, const float *ref, const float *dev, size_t n, double floor) {
    check_act_rn_floor_pct(name, ref, dev, n, floor, 99);
}

/* min_exact_pct: the share of elements that must be exactly the CPU's
 * rounded value (99 for our kernels; a library's epilogue, which computes
 * its activation's derivative its own way, is held to less) */
static void check_act_rn_floor_pct(const char *name, const float *ref, const float *dev, size_t n, double floor,
                                   size_t min_exact_pct) {
    if (!act16()) {
        check(name, ref, dev, n, TOL_F32);
        return;
    }
    float *h = act_to_host(dev, n);
    size_t exact = 0, far = 0, worst = 0, inward = 0;
    for (size_t i = 0; i < n; i++) {
        float r = bf16_val(bf16_rn(ref[i]));
        double ulp = ldexp(1.0, ilogb(r == 0.0f ? 1e-30f : r) - 7);
        if (h[i] == r || (fabsf(h[i]) < 1e-37f && fabsf(r) < 1e-37f)) exact++;
        else {
            if (fabsf(h[i]) < fabsf(r)) inward++;
            if (!(fabs((double)h[i] - r) <= ulp + floor)) { far++; worst = i; }
        }
    }
    /* held to less than 99% exact, the rest must not lean toward zero as
     * truncation's would (all of it; cuBLASLt's DGELU on an H200: 50% and 61%) */
    int ok = far == 0 && exact * 100 >= n * min_exact_pct &&
             (min_exact_pct >= 99 || n - exact < 100 || inward * 100 <= (n - exact) * 80);
    printf("%s %-34s bf16: %zu of %zu = the CPU's rounded to nearest (%zu%% needed; of the rest %zu toward zero), "
           "%zu more than 1 unit off\n", ok ? "ok  " : "FAIL", name, exact, n, min_exact_pct, inward, far);
    if (far) printf("     worst [%zu]: gpu %g cpu %g\n", worst, h[worst], ref[worst]);
    if (ok) pass++; else fail++;
    free(h);
}

static void check_act_rn(const char *name, const float *ref, const float *dev, size_t n) {
    check_act_rn_floor(name, ref, dev, n, 0.0);
}

/* The same for an output rounded once from an fp32 sum (a product's K
 * terms, a norm's scaled input plus its bias): where the terms cancel to a
 * value far below the largest, the two fp32 evaluations differ by more
 * than that value's bf16 unit, so an absolute 1e-4 of the largest |ref| (a
 * fortieth of its unit) is allowed beside the unit; the 99% exact stays. */
static void check_act_rn_sum(const char *name, const float *ref, const float *dev, size_t n) {
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    check_act_rn_floor(name, ref, dev, n, 1e-4 * mx);
}

static void check_scalar(const char *name, double ref, double got, double tol) {
    double rel = fabs(got - ref) / (fabs(ref) > 1e-30 ? fabs(ref) : 1.0);
    if (rel <= tol) { printf("ok   %-34s rel err %.2e (tol %.0e)\n", name, rel, tol); pass++; }
    else { printf("FAIL %-34s gpu %.17g cpu %.17g rel %.2e (tol %.0e)\n", name, got, ref, rel, tol); fail++; }
}

static void test_embed(void) {
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

/* Bitwise comparison of a device buffer with a host one: the count of
 * differing words. */
static size_t bits_differ(const float *host, const float *dev, size_t n) {
    float *h = malloc_check(n * sizeof(float) + 16);
    KG->to_host(h, dev, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&host[i], &h[i], 4) != 0;
    free(h);
    return bad;
}

static void check_bits(const char *name, const float *host, const float *dev, size_t n) {
    size_t bad = bits_differ(host, dev, n);
    printf("%s %-34s %zu of %zu words differ\n", bad ? "FAIL" : "ok  ", name, bad, n);
    if (bad) fail++; else pass++;
}

/* two device [a] buffers hold the same bits */
static void check_act_bits(const char *name, const float *dev_a, const float *dev_b, size_t n) {
    size_t bytes = n * (size_t)KG->act_bytes, bad = 0;
    unsigned char *a = malloc_check(bytes + 16), *b = malloc_check(bytes + 16);
    KG->to_host(a, dev_a, bytes);
    KG->to_host(b, dev_b, bytes);
    for (size_t i = 0; i < n; i++) bad += memcmp(a + i * KG->act_bytes, b + i * KG->act_bytes, KG->act_bytes) != 0;
    printf("%s %-34s %zu of %zu [a] elements differ\n", bad ? "FAIL" : "ok  ", name, bad, n);
    if (bad) fail++; else pass++;
    free(a); free(b);
}

/* The embedding backward is deterministic: on heavily repeated tokens two
 * calls on the same inputs give the same bits, and, since every gradient row
 * adds its dout rows in the CPU's order (increasing row), the CPU's bits.
 * Tokens from a vocabulary of `vocab` (skewed: every fourth token from its
 * first 50 ids), the vocab-parallel slice [v0, v0 + Vl) when Vl > 0; reset:
 * positions counted from documents' starts (doc_positions; dwpe through the
 * sort, as dwte), else n % T. */
static void test_embed_det(int B, int T, int C, int vocab, int v0, int Vl, int reset) {
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
enum { NBW_NONE, NBW_SCALAR, NBW_REGS, NBW_REREAD };
static void test_norms_case(int N, int C, int form) {
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

/* the residual add fused with the norm: res = a + b (exact), out and the
 * statistics as the CPU's fused kernel; in place (res = a) for rmsnorm */
/* A norm backward's dinp_a (kernels.h): dinp's final values as [a]. With it
 * dinp, dw and db keep the bits of the same call without it, and dinp_a
 * (started full of other values) holds dinp rounded to nearest even under
 * bf16 (dinp itself under fp32 [a]), every element. Under bf16 the float4
 * forms write it from the registers that hold dinp
 * (kernels_cuda_fused_dinp_a_calls: vec), the others convert dinp after;
 * off: dinp_a one element off 8-byte alignment, converted after. */
static void test_norm_dinp_a_case(int N, int C, int vec, int off) {
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

/* dout_a (kernels.h) of the output projections' backward: the same call
 * with the [a] copy of dout gives the same bits (dinp or dpre, dw, dbias:
 * the bias still summing the fp32 dout) and converts no dout
 * (kernels_cuda_dout_convert_calls: one conversion without it under bf16,
 * none under fp32 [a]). kind 0 matmul_backward_dinp_a, 1
 * matmul_gelu_backward, 2 matmul_swiglu_backward. */
static void test_dout_a_case(int kind, int N, int C, int OC, int with_bias) {
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

static void test_add_norms(int N, int C) {
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

static void test_matmul_case(int N, int C, int OC, int off, int with_bias) {
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
static void test_act_storage(int bf16_mode) {
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
static void test_matmul_res_case(int N, int C, int OC, int off, int with_bias) {
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
static void test_matmul_dinp_a_case(int N, int C, int OC, int with_bias) {
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
static void test_matmul_gelu_case(int N, int C, int OC, int off, int with_bias, int fused) {
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
static void test_matmul_act_bwd_case(int N, int C, int OC, int off, int swiglu, int with_bias, int fused) {
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
static void test_gelu_epilogue_variant(void) {
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
static void test_dgelu_epilogue_variant(void) {
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

static void test_attention(void) {
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

/* activation offload copies: out to pinned host memory and back into another
 * device buffer, ordered by marks; the round trip is exact */
static void test_offload(void) {
    size_t n = (1u << 20) + 3;
    float *h = hrand(n, 1), *d = dcopy(h, n), *d2 = (float *)KG->alloc(n * sizeof(float));
    float *pinned = (float *)KG->host_alloc(n * sizeof(float));
    KG->offload_copy(pinned, d, n * sizeof(float), 1);
    int out = KG->offload_mark();
    KG->offload_wait(out);
    KG->zero(d, n * sizeof(float)); /* queued after the copy out has completed */
    KG->offload_copy(pinned, d2, n * sizeof(float), 0);
    KG->offload_wait(KG->offload_mark());
    float *back = (float *)malloc_check(n * sizeof(float)), *zero = (float *)malloc_check(n * sizeof(float));
    KG->to_host(back, d2, n * sizeof(float));
    KG->to_host(zero, d, n * sizeof(float));
    int same = memcmp(back, h, n * sizeof(float)) == 0 && memcmp(pinned, h, n * sizeof(float)) == 0, zeroed = 1;
    for (size_t i = 0; i < n; i++) zeroed &= zero[i] == 0.0f;
    if (same && zeroed) {
        printf("ok   offload_copy round trip: %zu floats out and back bit-exact, source zeroed after the wait\n", n);
        pass++;
    } else {
        printf("FAIL offload_copy round trip: bit-exact %d, source zeroed %d\n", same, zeroed);
        fail++;
    }
    KG->host_free(pinned);
    KG->free(d2); /* d is freed with the other dcopy buffers */
    free(h); free(back); free(zero);
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

static void test_rope(void) {
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
static void test_pointwise(void) {
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
static void test_swiglu(int N, int F) {
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
static void test_crossentropy(int N, int V) {
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
static void test_lm_head_case(int N, int C, int V, int with_bias, int bias_off) {
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

/* weights_stable (kernels.h): under bf16 GEMMs a product inside a stable
 * range converts its weights once and keeps the copy: a second forward and
 * the backward's input-gradient product find it (hits), it takes exactly 2
 * bytes a weight of device memory, and a product outside every range keeps
 * nothing. New weights declared stable give the new product (a stale copy
 * would give the old one), so does a product after every range is released,
 * and freeing the weights frees the copy. Under TF32 and fp32 nothing is
 * kept. Each product is checked against the CPU's on the weights the device
 * holds at that point (rounded to bf16 under bf16). */
static void test_weight_cache(void) {
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
static void test_model_weight_copies(void) {
    ModelConfig c = {0};
    c.arch = ARCH_LLAMA;
    c.n_layer = 2; c.n_embd = 64; c.n_head = 4; c.n_kv_head = 2; c.ffn_hidden = 128; c.vocab_size = 96;
    c.max_seq_len = 32; c.norm_eps = 1e-5f; c.rope_theta = 10000.0f; c.tie_embeddings = 0;
    const int B = 2, T = 16, N = B * T;
    int tok[32], tgt[32];
    for (int i = 0; i < N; i++) { tok[i] = (int)(rnd_u32() % 96); tgt[i] = (int)(rnd_u32() % 96); }
    for (int ck = 0; ck < 2; ck++) {
        Model m;
        model_build_tp(&m, &c, KG, B, T, 1, 1, 1, 0, (ModelMem){ck ? ACT_FULL : ACT_NONE, 0, 0, 0, 0, 0});
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

static void test_fresh_grads(void) {
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
static void test_model_fresh_grads(void) {
    for (int llama = 0; llama < 2; llama++) {
        ModelConfig c = small_model(llama);
        const int B = 2, T = 16, N = B * T;
        int tok[2][32], tgt[2][32];
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < N; i++) { tok[j][i] = (int)(rnd_u32() % 96); tgt[j][i] = (int)(rnd_u32() % 96); }
        Model m;
        model_build_tp(&m, &c, KG, B, T, 1, 1, 1, 0, (ModelMem){ACT_NONE, 0, 0, 0, 0, 0});
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
static void test_model_dres_copy(void) {
    for (int llama = 0; llama < 2; llama++) {
        ModelConfig c = small_model(llama);
        const int B = 2, T = 16, N = B * T;
        int tok[32], tgt[32];
        for (int i = 0; i < N; i++) { tok[i] = (int)(rnd_u32() % 96); tgt[i] = (int)(rnd_u32() % 96); }
        Model m;
        model_build_tp(&m, &c, KG, B, T, 1, 1, 1, 0, (ModelMem){ACT_NONE, 0, 0, 0, 0, 0});
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
static void test_model_recompute(void) {
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
                           (ModelMem){r ? ACT_SELECTIVE : ACT_NONE, 0, 0, 0, 0, RC_ATTENTION | RC_NORM | RC_MLP_ACT});
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

static void test_adamw(void) {
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
static void test_adamw_weight_copies(void) {
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

/* round_bf16 must give the CPU's bits exactly (the random bits are a fixed
 * function of seed and index on both backends) */
static void test_round_bf16(void) {
    size_t n = 100003;
    float *x = hrand(n, 3), *y = malloc_check(n * sizeof(float)), *h = malloc_check(n * sizeof(float));
    uint64_t seeds[2] = {0, 0x1234abcdull};
    for (int k = 0; k < 2; k++) {
        float *d = dcopy(x, n);
        KC->round_bf16(y, x, n, seeds[k], 777);
        KG->round_bf16(d, d, n, seeds[k], 777);
        KG->to_host(h, d, n * sizeof(float));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += memcmp(&y[i], &h[i], 4) != 0;
        printf("%s round_bf16 %s: %zu of %zu words differ from the CPU's\n", bad ? "FAIL" : "ok  ", k ? "stochastic" : "nearest", bad, n);
        if (bad) fail++; else pass++;
        /* pack_bf16: the CPU's bf16 words; unpack_bf16 of them: the CPU's
         * fp32 words. Both 16-byte aligned (the 16-byte form up to the last
         * whole 8 words, n % 8 = 3 left), then one element off (an element
         * at a time): kernels_cuda_vec_convert_calls counts the form */
        uint16_t *c16 = malloc_check(n * sizeof(uint16_t)), *g16 = malloc_check(n * sizeof(uint16_t));
        float *cw = malloc_check(n * sizeof(float));
        KC->pack_bf16(c16, x, n, seeds[k], 777);
        KC->unpack_bf16(cw, c16, n);
        for (int off = 0; off < 2; off++) {
            uint16_t *dpb = (uint16_t *)KG->alloc((n + 8) * sizeof(uint16_t)), *dp = dpb + off;
            float *dx = dcopy_off(x, n, off), *dwb = (float *)KG->alloc((n + 8) * sizeof(float)), *dw = dwb + off;
            const long v0 = kernels_cuda_vec_convert_calls();
            KG->pack_bf16(dp, dx, n, seeds[k], 777);
            KG->to_host(g16, dp, n * sizeof(uint16_t));
            KG->unpack_bf16(dw, dp, n);
            const long vec = kernels_cuda_vec_convert_calls() - v0;
            KG->to_host(h, dw, n * sizeof(float));
            size_t bad16 = 0, badw = 0;
            for (size_t i = 0; i < n; i++) {
                bad16 += c16[i] != g16[i];
                badw += memcmp(&cw[i], &h[i], 4) != 0;
            }
            const int ok = !bad16 && !badw && vec == (off ? 0 : 2);
            printf("%s pack_bf16 / unpack_bf16 %s%s: %zu bf16 words and %zu widened words of %zu differ from the "
                   "CPU's; %ld of 2 calls in the 16-byte form (%d wanted)\n", ok ? "ok  " : "FAIL",
                   k ? "stochastic" : "nearest", off ? ", one element off" : "", bad16, badw, n, vec, off ? 0 : 2);
            if (ok) pass++; else fail++;
            KG->free(dpb); /* dx: dcopy's, freed with the rest */
            KG->free(dwb);
        }
        free(c16);
        free(g16);
        free(cw);
    }
    free(x);
    free(y);
    free(h);
}

/* unpack_bf16 in place on the device (the words in the upper half of the
 * float buffer, as the FSDP gathers leave them): the CPU's out-of-place
 * words, for a size the one-block tail takes alone, one halving pass and
 * several */
static void test_unpack_inplace(void) {
    size_t sizes[3] = {1000, 100003, 300001};
    for (int z = 0; z < 3; z++) {
        size_t m = sizes[z];
        uint16_t *words = malloc_check(m * sizeof(uint16_t));
        float *ref = malloc_check(m * sizeof(float)), *h = malloc_check(m * sizeof(float));
        for (size_t i = 0; i < m; i++) words[i] = (uint16_t)(i * 40503u + 7);
        KC->unpack_bf16(ref, words, m);
        float *d = (float *)KG->alloc(m * sizeof(float));
        KG->from_host((uint16_t *)(void *)d + m, words, m * sizeof(uint16_t));
        KG->unpack_bf16(d, (uint16_t *)(void *)d + m, m);
        KG->to_host(h, d, m * sizeof(float));
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) bad += memcmp(&ref[i], &h[i], 4) != 0;
        printf("%s unpack_bf16 in place n=%zu: %zu of %zu words differ from the CPU's out-of-place ones\n", bad ? "FAIL" : "ok  ",
               m, bad, m);
        if (bad) fail++; else pass++;
        KG->free(d);
        free(words);
        free(ref);
        free(h);
    }
}

/* kernels_cuda_mem_stats: alloc raises the in-use count by exactly the bytes
 * asked for and free lowers it by as much; the peak follows; and the device's
 * own count of used memory (cudaMemGetInfo) moves by the same amount up to
 * the allocator's granularity: cudaMalloc rounds a large allocation up to
 * 2 MiB pages, so 100 MiB + 12345 bytes should take 102 MiB; the tolerance
 * is 4 MiB (that rounding plus one page of slack). */
static void test_mem_stats(void) {
    const size_t MiB = (size_t)1 << 20;
    size_t u0, p0, u1, p1, u2, p2, f0, f1, f2, tot;
    cudaDeviceSynchronize();
    kernels_cuda_mem_stats(&u0, &p0);
    void *small = KG->alloc(1000);
    kernels_cuda_mem_stats(&u1, &p1);
    KG->free(small);
    kernels_cuda_mem_stats(&u2, &p2);
    int ok = u1 - u0 == 1000 && u2 == u0 && p1 >= u1 && p2 == p1;
    printf("%s mem_stats 1000-byte alloc: in use %+lld then %+lld bytes, peak %zu >= %zu\n", ok ? "ok  " : "FAIL",
           (long long)u1 - (long long)u0, (long long)u2 - (long long)u0, p1, u1);
    if (ok) pass++; else fail++;

    size_t big = 100 * MiB + 12345;
    cudaMemGetInfo(&f0, &tot);
    kernels_cuda_mem_stats(&u0, &p0);
    void *b = KG->alloc(big);
    cudaDeviceSynchronize();
    cudaMemGetInfo(&f1, &tot);
    kernels_cuda_mem_stats(&u1, &p1);
    KG->free(b);
    cudaDeviceSynchronize();
    cudaMemGetInfo(&f2, &tot);
    kernels_cuda_mem_stats(&u2, &p2);
    ok = u1 - u0 == big && u2 == u0 && p1 >= u1 && p1 >= p0;
    printf("%s mem_stats 100 MiB alloc: counter %+lld then %+lld bytes (expected %zu), peak %zu >= in use %zu\n",
           ok ? "ok  " : "FAIL", (long long)u1 - (long long)u0, (long long)u2 - (long long)u0, big, p1, u1);
    if (ok) pass++; else fail++;
    double used = (double)f0 - (double)f1, back = (double)f2 - (double)f1, diff = used - (double)big;
    ok = fabs(diff) <= 4.0 * MiB && fabs(back - used) <= 4.0 * MiB;
    printf("%s mem_stats vs cudaMemGetInfo: used %+.0f bytes for %zu counted (%+.2f MiB), %.0f given back (tol 4 MiB)\n",
           ok ? "ok  " : "FAIL", used, big, diff / MiB, back);
    if (ok) pass++; else fail++;
}

int test_gpu_fp8(const Kernels *kc, const Kernels *kg, int *npass, int *nfail); /* tests/test_gpu_fp8.c */

/* tests/test_gpu [bf16|tf32|fp32|fp8]: the compute dtype (train.compute_dtype)
 * the CUDA kernels run under; bf16, the backend's default, when not given.
 * fp8: only the FP8 linears' checks (tests/test_gpu_fp8.c) */
int main(int argc, char **argv) {
    const char *mm = argc > 1 ? argv[1] : "bf16";
    const int fp8 = strcmp(mm, "fp8") == 0, bench = strcmp(mm, "cp-bench") == 0;
    if (bench) mm = "bf16";
    if ((argc > 2 && !bench) || (strcmp(mm, "bf16") != 0 && strcmp(mm, "tf32") != 0 && strcmp(mm, "fp32") != 0 && !fp8)) {
        fprintf(stderr, "usage: %s [bf16|tf32|fp32|fp8] (the compute dtype; default bf16) | cp-bench [T [nh nkv hd [B]]]\n",
                argv[0]);
        return 2;
    }
    char why[320];
    if (!kernels_cuda_available(why, sizeof why)) {
        fprintf(stderr, "test_gpu: FAIL: no usable CUDA device (%s); the CUDA tests need a GPU\n", why);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    if (strcmp(mm, "bf16") == 0) tol_mm = TOL_BF16;
    if (strcmp(mm, "fp32") == 0) tol_mm = tol_att = TOL_FP32MM;
    kernels_cuda_set_compute_dtype(mm);
    KC = kernels_cpu();
    KG = kernels_cuda();
    printf("device: %s\n", kernels_cuda_device_info());
    int ccmaj = 0, ccmin = 0;
    const char *cc = strstr(kernels_cuda_device_info(), ", cc ");
    if (fp8 && cc && sscanf(cc, ", cc %d.%d", &ccmaj, &ccmin) == 2 && ccmaj * 10 + ccmin < 89) {
        printf("fp8: compute capability %d.%d has no FP8 tensor cores: nothing to check (train.compute_dtype fp8 "
               "is exit 2 there)\n0 passed, 0 failed\n", ccmaj, ccmin);
        return 0;
    }
    if (bench) return cp_bench(argc, argv);
    if (fp8) {
        test_gpu_fp8(KC, KG, &pass, &fail);
        printf("%d passed, %d failed\n", pass, fail);
        return fail ? 1 : 0;
    }
    test_mem_stats();
    test_embed();
    test_embed_det(16, 1024, 64, 7, 0, 0, 0);       /* N = 16384 tokens from a vocabulary of 7 */
    test_embed_det(16, 1024, 64, 7, 3, 3, 0);       /* its vocab-parallel slice [3, 6) */
    test_embed_det(16, 1024, 64, 7, 0, 0, 1);       /* positions reset at documents */
    test_embed_det(16, 1024, 64, 7, 3, 3, 1);
    test_embed_det(16, 1024, 768, 50304, 0, 0, 0);  /* GPT-2 124M's shape */
    test_embed_det(2, 1024, 768, 50304, 25152, 25152, 0); /* its second half under tp 2 */
    test_embed_det(2, 1024, 768, 50304, 0, 0, 1);
    test_norms_case(70, 300, NBW_REGS);
    test_norms_case(600, 512, NBW_REGS);
    test_norms_case(9001, 64, NBW_REGS);
    test_norms_case(70, 302, NBW_SCALAR);
    test_norms_case(40, 1600, NBW_REGS);   /* 2 float4 a thread, 224 threads */
    test_norms_case(24, 2048, NBW_REGS);   /* 2, 256 threads */
    test_norms_case(9, 2176, NBW_REGS);    /* 4, 160 threads: 64 of them with 4 columns, 96 with 3 */
    test_norms_case(12, 4096, NBW_REGS);   /* 4, 256 threads: the widest in registers */
    test_norms_case(9, 4100, NBW_REREAD);  /* 1025 float4: the row read twice */
    test_norms_case(5, 16384, NBW_REREAD); /* 128 KB of layernorm column sums (the launch's limit raised) */
    test_norms_case(3, 65536, NBW_NONE);   /* over shared memory, for rmsnorm too */
    test_norm_dinp_a_case(70, 300, 1, 0);   /* float4, in registers */
    test_norm_dinp_a_case(9, 4100, 1, 0);   /* float4, the row read twice */
    test_norm_dinp_a_case(70, 300, 1, 1);   /* dinp_a not 8-byte aligned: converted after */
    test_norm_dinp_a_case(70, 302, 0, 0);   /* the scalar one-pass form */
    test_norm_dinp_a_case(3, 65536, 0, 0);  /* three kernels */
    test_add_norms(70, 300);  /* float4, in registers */
    test_add_norms(70, 302);  /* an element at a time */
    test_add_norms(9, 2176);  /* float4, read again for each pass */
    test_act_storage(tol_mm == TOL_BF16);
    test_matmul_case(64, 128, 96, 0, 1);
    test_matmul_case(100, 72, 130, 0, 1);
    test_matmul_case(37, 50, 29, 1, 1); /* odd sizes, 4-byte aligned operands */
    test_matmul_case(256, 768, 2304, 0, 0);
    test_matmul_res_case(64, 128, 96, 0, 1);
    test_matmul_res_case(37, 50, 29, 1, 1);    /* odd sizes, 4-byte aligned operands */
    test_matmul_res_case(256, 3072, 768, 0, 0); /* GPT-2's MLP down-projection */
    test_matmul_dinp_a_case(64, 128, 96, 1);
    test_matmul_dinp_a_case(256, 768, 768, 0); /* GPT-2's attention output projection, no bias */
    test_matmul_gelu_case(64, 128, 96, 0, 1, 1);
    test_matmul_gelu_case(64, 128, 96, 0, 0, 1);   /* GELU_AUX without a bias */
    test_matmul_gelu_case(256, 768, 3072, 0, 1, 1); /* GPT-2's c_fc */
    test_matmul_gelu_case(100, 72, 130, 0, 1, 0);  /* OC not a multiple of 8: matmul + GELU kernel */
    test_matmul_gelu_case(37, 50, 29, 1, 1, 0);    /* unaligned */
    if (tol_mm == TOL_TF32) test_gelu_epilogue_variant();
    test_matmul_act_bwd_case(64, 128, 96, 0, 0, 1, 1);
    test_matmul_act_bwd_case(256, 3072, 768, 0, 0, 1, 1); /* GPT-2's c_proj and GELU */
    test_matmul_act_bwd_case(100, 130, 72, 0, 0, 0, 0);   /* C not a multiple of 8: GEMM + kernel */
    test_matmul_act_bwd_case(37, 29, 50, 1, 0, 1, 0);     /* unaligned */
    test_matmul_act_bwd_case(64, 128, 96, 0, 1, 0, 0);
    test_matmul_act_bwd_case(100, 130, 72, 0, 1, 1, 0);
    test_matmul_act_bwd_case(37, 29, 50, 1, 1, 0, 0);
    if (tol_mm == TOL_TF32) test_dgelu_epilogue_variant();
    for (int kind = 0; kind < 3; kind++) {
        test_dout_a_case(kind, 64, 128, 96, 1);
        test_dout_a_case(kind, 64, 128, 96, 0);
    }
    test_attention();
    test_attention_parts();
    test_offload();
    test_rope();
    test_pointwise();
    test_swiglu(50, 123); /* element at a time */
    test_swiglu(50, 128);
    test_swiglu(50, 132); /* a multiple of 4, not of 8: element at a time */
    test_swiglu(7, 8200); /* 1025 eight-element groups a row: rows straddle blocks */
    test_crossentropy(45, 1037);
    test_crossentropy(45, 1040);
    test_crossentropy(300, 24384);
    test_lm_head_case(64, 128, 1000, 0, 0);
    test_lm_head_case(37, 72, 96, 0, 0);
    test_lm_head_case(64, 128, 384, 1, 0); /* the qkv projection: a bias, [a] out */
    /* ragged rows, the bias 4 bytes off 16-byte alignment (under tf32 and
     * fp32 a kernel adds it; the bf16 epilogue's copy is aligned) */
    test_lm_head_case(37, 72, 200, 1, 1);
    test_weight_cache();
    test_model_weight_copies();
    test_adamw_weight_copies();
    test_fresh_grads();
    test_model_fresh_grads();
    test_model_dres_copy();
    test_model_recompute();
    test_adamw();
    test_round_bf16();
    test_unpack_inplace();
    for (int i = 0; i < nbase; i++) KG->free(dbase[i]);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
