/* test_gpu.c — tests/test_gpu: every kernel of the CUDA backend against
 * the CPU backend on the same random inputs. This file holds main (the
 * modes, and every check in the order it runs: the order fixes the random
 * inputs), the helpers the other files share (tests/test_gpu.h), and the
 * device memory's own checks (mem_stats, the offload copies, round_bf16,
 * unpack_bf16 in place). The checks themselves, by concern:
 * tests/test_gpu_layers.c (embedding, norms, attention, RoPE, pointwise,
 * SwiGLU, cross-entropy), tests/test_gpu_matmul.c (the linear layers'
 * GEMMs), tests/test_gpu_model.c (weight copies, fresh gradients, AdamW,
 * model.c on the device), tests/test_gpu_cp.c, tests/test_gpu_fp8.c.
 * Needs a GPU: without one it FAILS (exit 1, one line), it does not skip.
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
#include "util.h"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


double tol_mm = TOL_TF32;  /* the linear layers' GEMMs */
double tol_att = TOL_TF32; /* attention (always TF32 unless fp32) */

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
float *hdup(const float *h, size_t n) {
    float *d = malloc_check(n * sizeof(float) + 16);
    memcpy(d, h, n * sizeof(float));
    return d;
}
/* device copy; off > 0 shifts the pointer by off floats inside a larger
 * allocation to exercise unaligned operands (the base is kept for free) */
static float *dbase[4096];
static int nbase;
float *dcopy_off(const float *h, size_t n, int off) {
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
int *doc_positions(int B, int T) {
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
float *dcopy_act_off(const float *h, size_t n, int off) {
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

void check_host(const char *name, const float *ref, const float *h, size_t n, double tol) {
    check_host_floor(name, ref, h, n, tol, 1e-30);
}

void check_floor(const char *name, const float *ref, const float *dev, size_t n, double tol, double floor) {
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
static void check_act_rn_floor(const char *name, const float *ref, const float *dev, size_t n, double floor) {
    check_act_rn_floor_pct(name, ref, dev, n, floor, 99);
}

/* min_exact_pct: the share of elements that must be exactly the CPU's
 * rounded value (99 for our kernels; a library's epilogue, which computes
 * its activation's derivative its own way, is held to less) */
void check_act_rn_floor_pct(const char *name, const float *ref, const float *dev, size_t n, double floor,
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

void check_act_rn(const char *name, const float *ref, const float *dev, size_t n) {
    check_act_rn_floor(name, ref, dev, n, 0.0);
}

/* The same for an output rounded once from an fp32 sum (a product's K
 * terms, a norm's scaled input plus its bias): where the terms cancel to a
 * value far below the largest, the two fp32 evaluations differ by more
 * than that value's bf16 unit, so an absolute 1e-4 of the largest |ref| (a
 * fortieth of its unit) is allowed beside the unit; the 99% exact stays. */
void check_act_rn_sum(const char *name, const float *ref, const float *dev, size_t n) {
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    check_act_rn_floor(name, ref, dev, n, 1e-4 * mx);
}

void check_scalar(const char *name, double ref, double got, double tol) {
    double rel = fabs(got - ref) / (fabs(ref) > 1e-30 ? fabs(ref) : 1.0);
    if (rel <= tol) { printf("ok   %-34s rel err %.2e (tol %.0e)\n", name, rel, tol); pass++; }
    else { printf("FAIL %-34s gpu %.17g cpu %.17g rel %.2e (tol %.0e)\n", name, got, ref, rel, tol); fail++; }
}

/* Bitwise comparison of a device buffer with a host one: the count of
 * differing words. */
size_t bits_differ(const float *host, const float *dev, size_t n) {
    float *h = malloc_check(n * sizeof(float) + 16);
    KG->to_host(h, dev, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&host[i], &h[i], 4) != 0;
    free(h);
    return bad;
}

void check_bits(const char *name, const float *host, const float *dev, size_t n) {
    size_t bad = bits_differ(host, dev, n);
    printf("%s %-34s %zu of %zu words differ\n", bad ? "FAIL" : "ok  ", name, bad, n);
    if (bad) fail++; else pass++;
}

/* two device [a] buffers hold the same bits */
void check_act_bits(const char *name, const float *dev_a, const float *dev_b, size_t n) {
    size_t bytes = n * (size_t)KG->act_bytes, bad = 0;
    unsigned char *a = malloc_check(bytes + 16), *b = malloc_check(bytes + 16);
    KG->to_host(a, dev_a, bytes);
    KG->to_host(b, dev_b, bytes);
    for (size_t i = 0; i < n; i++) bad += memcmp(a + i * KG->act_bytes, b + i * KG->act_bytes, KG->act_bytes) != 0;
    printf("%s %-34s %zu of %zu [a] elements differ\n", bad ? "FAIL" : "ok  ", name, bad, n);
    if (bad) fail++; else pass++;
    free(a); free(b);
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
    test_headnorm(37, 4, 2, 12);
    test_headnorm(300, 16, 8, 128); /* Qwen3-0.6B's heads; 300 rows: two blocks of the weight-gradient sums */
    test_pointwise();
    test_swiglu(50, 123); /* element at a time */
    test_swiglu(50, 128);
    test_swiglu(50, 132); /* a multiple of 4, not of 8: element at a time */
    test_swiglu(7, 8200); /* 1025 eight-element groups a row: rows straddle blocks */
    test_crossentropy(45, 1037);
    test_crossentropy(45, 1040);
    test_crossentropy(300, 24384);
    test_moe();
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
