/* test_gpu_cp.c — context parallelism's attention parts on CUDA
 * (kernels.h attention_part_forward / attention_part_backward,
 * kernels/attention_part.cuh) against the CPU's (kernels_cpu_attention.c),
 * run by tests/test_gpu (make test-gpu; tests/test_gpu_emu on the host
 * emulation in make test); and `tests/test_gpu cp-bench`, the ring's part
 * calls' TFLOP/s against the whole-sequence attention's (make bench-gpu). */
#include "kernels.h"
#include "test_gpu.h"
#include "util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the device's compute capability's major number (from its info line) */
static int cc_major(void) {
    int maj = 0, min = 0;
    const char *cc = strstr(kernels_cuda_device_info(), ", cc ");
    return cc && sscanf(cc, ", cc %d.%d", &maj, &min) == 2 ? maj : 0;
}

/* One call of each part on both backends from the same random inputs
 * ([a] ones rounded as the device holds them): a segment of nq query rows
 * at sequence positions from q0 against nk key rows from k0, merged into
 * random out and lse (merge 1) or overwriting them (merge 0); block-causal
 * document starts (random, some past every key of the segment: those rows
 * see nothing); GQA. The backward from the CPU forward's out and lse adds
 * into random dqkv [a] and fp32 dkv. Rows outside the segment must stay as
 * they were (they are part of the compared buffers).
 *
 * Which kernels: under compute dtype bf16 on sm_80+ with head dim 32, 64
 * or 128, the bf16 tensor-core kernels (kernels_cuda_attention_part_tc_calls
 * must count both calls; any other case must leave it alone, the fp32
 * tiles). Tolerances: the fp32 tiles compute in fp32 from the same values,
 * so fp32 outputs within TOL_FP32MM (1e-4: summation order, expf), a bf16
 * [a] output within TOL_BF16 (its one rounding where it is stored), dkv
 * (fp32) within 1e-4. The tensor cores multiply bf16 operands exactly into
 * fp32 accumulators, but P (forward, dV) and dS (dQ, dK) are rounded to
 * bf16 before their products (unit roundoff 2^-9 relative an element):
 * out, dqkv and dkv within TOL_BF16 1e-2. lse within 1e-4 absolutely
 * (floor 1) on both paths: its scores are exact products summed in fp32,
 * its exponentials fp32. */
static void test_attention_part_case(int B, int Tq, int Tk, int qrow, int q0, int nq, int krow, int k0, int nk, int nh,
                                     int nkv, int hd, int docs, int merge) {
    char name[192], shape[112];
    const int tc = act16() && cc_major() >= 8 && (hd == 32 || hd == 64 || hd == 128);
    const long tc0 = kernels_cuda_attention_part_tc_calls();
    const int S = (nh + 2 * nkv) * hd, KS = 2 * nkv * hd, OS = nh * hd;
    size_t nqkv = (size_t)B * Tq * S, nkv_ = (size_t)B * Tk * KS, nout = (size_t)B * Tq * OS, nlse = (size_t)B * nh * Tq;
    int *qs = NULL, *gqs = NULL;
    if (docs) {
        /* each row's document start (never decreasing along a sequence):
         * documents of 1 to `docs` positions, except one from a random
         * key of the segment to a random query after its first, so that
         * rows from there on see fewer keys (none when the keys end
         * before it) and the rows before it some */
        qs = malloc_check((size_t)B * Tq * sizeof(int));
        for (int b = 0; b < B; b++) {
            int s1 = k0 + (int)(rnd_u32() % (uint32_t)nk), s2 = q0 + 1 + (int)(rnd_u32() % (uint32_t)(nq > 1 ? nq - 1 : 1));
            if (s2 <= s1) s2 = s1 + 1;
            for (int p = 0, s = 0, len = 1 + (int)(rnd_u32() % (uint32_t)docs); p < q0 + Tq - qrow; p++) {
                if (p == s1 || p == s2 || (p - s == len && (p < s1 || p > s2))) {
                    s = p;
                    len = 1 + (int)(rnd_u32() % (uint32_t)docs);
                }
                if (p >= q0 - qrow) qs[b * Tq + p - (q0 - qrow)] = s;
            }
        }
        gqs = dcopy_int(qs, (size_t)B * Tq);
    }
    float *qkv = hrand(nqkv, 1), *kv = hrand(nkv_, 1), *out = hrand(nout, 1), *lse = hrand(nlse, 1);
    for (size_t i = 0; i < nlse; i++) lse[i] += 2.0f;
    float *gqkv = dcopy_act(qkv, nqkv), *gkv = dcopy_act(kv, nkv_), *gout = dcopy_act(out, nout), *glse = dcopy(lse, nlse);
    act_round(qkv, nqkv);
    act_round(kv, nkv_);
    act_round(out, nout);
    KC->attention_part_forward(out, lse, qkv, qrow, q0, nq, kv, krow, k0, nk, qs, B, Tq, Tk, nh, nkv, hd, merge);
    KG->attention_part_forward(gout, glse, gqkv, qrow, q0, nq, gkv, krow, k0, nk, gqs, B, Tq, Tk, nh, nkv, hd, merge);
    double tol = act16() ? TOL_BF16 : TOL_FP32MM;
    snprintf(shape, sizeof shape, "B%d q[%d+%d @%d] k[%d+%d @%d] h%d/%d hd%d%s merge %d", B, qrow, nq, q0, krow, nk, k0, nh,
             nkv, hd, docs ? " docs" : "", merge);
    snprintf(name, sizeof name, "attention_part_fwd out %s", shape);
    check_act(name, out, gout, nout, tol);
    /* -inf (a row that saw nothing) must be -inf on both sides */
    float *hl = malloc_check(nlse * sizeof(float));
    KG->to_host(hl, glse, nlse * sizeof(float));
    size_t inf_diff = 0, ninf = 0;
    for (size_t i = 0; i < nlse; i++) {
        ninf += isinf(lse[i]) != 0;
        inf_diff += (isinf(lse[i]) != 0) != (isinf(hl[i]) != 0);
        if (isinf(lse[i])) hl[i] = lse[i] = 0.0f;
    }
    snprintf(name, sizeof name, "attention_part_fwd lse %s", shape);
    if (inf_diff) {
        printf("FAIL %s: %zu rows -inf on one side only\n", name, inf_diff);
        fail++;
    } else check_host_floor(name, lse, hl, nlse, 1e-4, 1.0);
    if (docs && !merge && (ninf == 0 || ninf == (size_t)B * nh * nq)) {
        printf("FAIL %s: %zu rows without keys (the case is meant to have some, not all)\n", name, ninf);
        fail++;
    }
    /* the backward under the CPU's out (as the device holds it) and lse */
    act_round(out, nout);
    float *dout = hrand(nout, 1), *dqkv = hrand(nqkv, 1), *dkv = hrand(nkv_, 1);
    float *gdout = dcopy_act(dout, nout), *gdqkv = dcopy_act(dqkv, nqkv), *gdkv = dcopy(dkv, nkv_);
    act_round(dout, nout);
    act_round(dqkv, nqkv);
    float *gout2 = dcopy_act(out, nout), *glse2 = dcopy(lse, nlse);
    for (size_t i = 0; i < nlse; i++) /* the rows without keys again: no part of the backward reads them */
        if (hl[i] == 0.0f && lse[i] == 0.0f) lse[i] = -INFINITY;
    KG->from_host(glse2, lse, nlse * sizeof(float));
    KC->attention_part_backward(dqkv, dkv, dout, qkv, out, lse, qrow, q0, nq, kv, krow, k0, nk, qs, B, Tq, Tk, nh, nkv, hd);
    KG->attention_part_backward(gdqkv, gdkv, gdout, gqkv, gout2, glse2, qrow, q0, nq, gkv, krow, k0, nk, gqs, B, Tq, Tk, nh, nkv,
                                hd);
    snprintf(name, sizeof name, "attention_part_bwd dqkv %s", shape);
    check_act(name, dqkv, gdqkv, nqkv, tol);
    snprintf(name, sizeof name, "attention_part_bwd dkv (fp32) %s", shape);
    check(name, dkv, gdkv, nkv_, tc ? TOL_BF16 : 1e-4);
    const long ntc = kernels_cuda_attention_part_tc_calls() - tc0;
    if (ntc == (tc ? 2 : 0)) pass++;
    else fail++;
    printf("%s attention_part %s: %ld of 2 calls on the tensor cores (expected %d)\n", ntc == (tc ? 2 : 0) ? "ok  " : "FAIL",
           shape, ntc, tc ? 2 : 0);
    free(hl); free(qkv); free(kv); free(out); free(lse); free(dout); free(dqkv); free(dkv); free(qs);
}

void test_attention_parts(void) {
    /* B, Tq, Tk, qrow, q0, nq, krow, k0, nk, nh, nkv, hd, docs, merge */
    test_attention_part_case(2, 48, 48, 24, 72, 24, 0, 24, 24, 4, 2, 16, 0, 1);      /* keys all before the queries, GQA */
    test_attention_part_case(1, 80, 80, 0, 40, 40, 40, 40, 40, 4, 1, 32, 0, 0);      /* the causal diagonal over 2 tiles, MQA */
    test_attention_part_case(2, 64, 64, 32, 96, 32, 0, 32, 32, 4, 2, 16, 60, 1);     /* documents: some rows see none of it */
    test_attention_part_case(2, 64, 64, 32, 96, 32, 0, 32, 32, 4, 2, 16, 60, 0);     /* ... overwriting: out 0, lse -inf */
    test_attention_part_case(1, 70, 66, 0, 100, 70, 33, 60, 33, 8, 2, 64, 0, 1);     /* ragged tiles, keys past some queries */
    test_attention_part_case(1, 40, 40, 0, 7, 33, 0, 0, 40, 2, 1, 128, 0, 0);        /* head dim 128 */
    /* the tensor-core kernels under bf16 (64-row query tiles; 64 keys a
     * tile, 32 in head dim 128's dQ and dK/dV): segments, q0 and k0 not
     * multiples of the tiles */
    test_attention_part_case(2, 160, 160, 80, 240, 80, 0, 80, 80, 4, 2, 64, 0, 1);   /* keys all before the queries, GQA */
    test_attention_part_case(1, 200, 200, 0, 100, 100, 100, 100, 100, 4, 1, 32, 0, 0); /* the causal diagonal over tiles, MQA */
    test_attention_part_case(2, 192, 192, 96, 288, 96, 0, 96, 96, 4, 2, 64, 150, 1); /* documents: some rows see none of it */
    test_attention_part_case(2, 192, 192, 96, 288, 96, 0, 96, 96, 4, 2, 64, 150, 0); /* ... overwriting: out 0, lse -inf */
    test_attention_part_case(1, 150, 140, 0, 200, 150, 37, 170, 70, 8, 2, 64, 0, 1);  /* ragged, GQA 4, keys past queries */
    test_attention_part_case(1, 100, 100, 0, 13, 83, 0, 0, 100, 2, 1, 128, 0, 0);     /* head dim 128 */
    test_attention_part_case(1, 130, 130, 30, 45, 100, 0, 5, 120, 4, 1, 128, 40, 1);  /* head dim 128, documents, merged */
}


/* ---- cp-bench: the ring's part calls against the whole-sequence call ----
 * `tests/test_gpu cp-bench [T [nh nkv hd [B]]]` (default 16384, 32 / 8,
 * 128, 1: Llama 3.1 8B's attention heads), under compute dtype bf16 with
 * train.attention_kernel flash (the bf16 mma.sync kernels): the whole
 * sequence's causal attention_forward and attention_backward, then for cp
 * 2 and 4 the part calls context rank 0 makes over the ring's cp steps
 * (cp.c's schedule: its chunks 0 and 2cp-1 of T / 2cp rows against every
 * rank's two chunks, the pairs whose keys are not all after the queries),
 * which together do 1/cp of the whole call's causal work. The whole call
 * is timed on cuDNN's fused attention too (what one GPU runs under bf16 by
 * default, attention_kernel auto), and each line gives the parts' rate
 * against both. Each is timed over `reps` runs after one warm-up (CUDA
 * events); TFLOP/s counts the
 * visible (query, key) pairs: the forward 4 hd flops a pair and head (Q K^T
 * and P V), the backward 10 (the scores again, dP, dV, dK, dQ). One line
 * per cp and direction: both times, both TFLOP/s and the parts' share of
 * the whole call's rate. */

/* visible (query, key) pairs of a causal segment pair: nq queries from
 * position q0 against n keys from k0 (no documents) */
static double cp_visible(int q0, int nq, int k0, int n) {
    double v = 0.0;
    for (int i = 0; i < nq; i++) {
        int last = q0 + i - k0; /* the last key index the query sees */
        v += last < 0 ? 0 : last >= n ? n : last + 1;
    }
    return v;
}

typedef struct CpBenchPair { int qrow, q0, krow, k0, a; } CpBenchPair;

/* rank 0's pairs over the ring's cp steps (as cp.c's cp_pairs), Tc rows a chunk */
static int cp_bench_pairs(int cp, int Tc, CpBenchPair *p) {
    int n = 0;
    for (int s = 0; s < cp; s++) {
        int j = (cp - s) % cp;
        for (int a = 0; a < 2; a++)
            for (int c = 0; c < 2; c++) {
                int qc = a ? 2 * cp - 1 : 0, kc = c ? 2 * cp - 1 - j : j;
                if (kc <= qc) p[n++] = (CpBenchPair){a * Tc, qc * Tc, c * Tc, kc * Tc, a};
            }
    }
    return n;
}

static double cp_elapsed_ms(void) {
    double ms[2];
    KG->timer_read(2, ms);
    return ms[1];
}

static int cp_arg(int argc, char **argv, int i, int dflt) {
    if (argc <= i) return dflt;
    char *end;
    long v = strtol(argv[i], &end, 10);
    if (*end || v <= 0 || v > (1 << 24)) {
        fprintf(stderr, "test_gpu cp-bench: argument %d \"%s\": expected a positive integer (usage: cp-bench [T [nh nkv hd [B]]])\n",
                i - 1, argv[i]);
        exit(EXIT_USAGE);
    }
    return (int)v;
}

/* ms[0], ms[1]: the whole sequence's attention forward and backward under
 * the attention kernel set, the mean of reps runs after one warm-up */
static void cp_time_whole(double ms[2], float *out, float *lse, const float *qkv, float *dqkv, const float *dout, int B,
                          int T, int nh, int nkv, int hd, int reps) {
    ms[0] = ms[1] = 0.0;
    for (int r = 0; r <= reps; r++) { /* r 0: the warm-up */
        KG->timer_mark(0);
        KG->attention_forward(out, lse, qkv, NULL, B, T, nh, nkv, hd);
        KG->timer_mark(1);
        if (r) ms[0] += cp_elapsed_ms() / reps;
        KG->timer_mark(0);
        KG->attention_backward(dqkv, dout, qkv, out, lse, NULL, B, T, nh, nkv, hd);
        KG->timer_mark(1);
        if (r) ms[1] += cp_elapsed_ms() / reps;
    }
}

int cp_bench(int argc, char **argv) {
    const int T = cp_arg(argc, argv, 2, 16384), nh = cp_arg(argc, argv, 3, 32), nkv = cp_arg(argc, argv, 4, 8);
    const int hd = cp_arg(argc, argv, 5, 128), B = cp_arg(argc, argv, 6, 1), reps = T >= 4096 ? 5 : 1;
    if (argc > 7 || T % 8 || nh % nkv || (hd != 32 && hd != 64 && hd != 128)) {
        fprintf(stderr, "test_gpu cp-bench: T %d, heads %d / %d, head dim %d: expected T a multiple of 8, nh a multiple of "
                        "nkv, head dim 32, 64 or 128 (usage: cp-bench [T [nh nkv hd [B]]])\n", T, nh, nkv, hd);
        return EXIT_USAGE;
    }
    if (!act16()) {
        fprintf(stderr, "test_gpu cp-bench: runs under compute dtype bf16 (the tensor-core parts)\n");
        return EXIT_USAGE;
    }
    kernels_cuda_set_attention("flash");
    const int S = (nh + 2 * nkv) * hd, KS = 2 * nkv * hd, OS = nh * hd;
    const size_t nq = (size_t)B * T * S, no = (size_t)B * T * OS;
    float *h = hrand(nq, 1.0f);
    float *qkv = dcopy_act(h, nq), *dqkv = dcopy_act(h, nq), *out = dcopy_act(h, no), *dout = dcopy_act(h, no);
    float *lse = dcopy(h, (size_t)B * nh * T), *dkv = dcopy(h, (size_t)B * T * KS), *kv = dcopy_act(h, (size_t)B * T * KS);
    const double whole = (double)B * nh * hd * cp_visible(0, T, 0, T);
    double wms[2], dms[2];
    cp_time_whole(wms, out, lse, qkv, dqkv, dout, B, T, nh, nkv, hd, reps);
    /* the whole call as one GPU runs it by default under bf16 (attention_kernel auto: cuDNN's fused attention) */
    kernels_cuda_set_attention("cudnn");
    const long dn0 = kernels_cuda_cudnn_attention_calls();
    cp_time_whole(dms, out, lse, qkv, dqkv, dout, B, T, nh, nkv, hd, reps);
    const long dn = kernels_cuda_cudnn_attention_calls() - dn0;
    kernels_cuda_set_attention("flash");
    const double wtf[2] = {4.0 * whole / (wms[0] * 1e9), 10.0 * whole / (wms[1] * 1e9)};
    const double dtf[2] = {4.0 * whole / (dms[0] * 1e9), 10.0 * whole / (dms[1] * 1e9)};
    if (dn > 0)
        printf("cp-bench whole sequence on cudnn: B %d T %d heads %d/%d hd %d: forward %.3f ms %.4g TFLOP/s, backward %.3f ms "
               "%.4g TFLOP/s\n", B, T, nh, nkv, hd, dms[0], dtf[0], dms[1], dtf[1]);
    else
        printf("cp-bench whole sequence on cudnn: not run (cuDNN's fused attention declined the shape)\n");
    const long tc0 = kernels_cuda_attention_part_tc_calls();
    for (int cp = 2; cp <= 4; cp *= 2) {
        if (T % (2 * cp)) continue;
        const int Tl = T / cp, Tc = Tl / 2;
        CpBenchPair p[16];
        const int n = cp_bench_pairs(cp, Tc, p);
        double work = 0.0, pf = 0.0, pb = 0.0;
        for (int i = 0; i < n; i++) work += (double)B * nh * hd * cp_visible(p[i].q0, Tc, p[i].k0, Tc);
        for (int r = 0; r <= reps; r++) {
            int merge[2] = {0, 0};
            KG->timer_mark(0);
            for (int i = 0; i < n; i++) {
                KG->attention_part_forward(out, lse, qkv, p[i].qrow, p[i].q0, Tc, kv, p[i].krow, p[i].k0, Tc, NULL, B, Tl, Tl,
                                           nh, nkv, hd, merge[p[i].a]);
                merge[p[i].a] = 1;
            }
            KG->timer_mark(1);
            if (r) pf += cp_elapsed_ms() / reps;
            KG->timer_mark(0);
            for (int i = 0; i < n; i++)
                KG->attention_part_backward(dqkv, dkv, dout, qkv, out, lse, p[i].qrow, p[i].q0, Tc, kv, p[i].krow, p[i].k0, Tc,
                                            NULL, B, Tl, Tl, nh, nkv, hd);
            KG->timer_mark(1);
            if (r) pb += cp_elapsed_ms() / reps;
        }
        const double ptf[2] = {4.0 * work / (pf * 1e9), 10.0 * work / (pb * 1e9)}, pms[2] = {pf, pb};
        for (int d = 0; d < 2; d++)
            printf("cp-bench %s cp %d: B %d T %d heads %d/%d hd %d: whole sequence %.3f ms %.4g TFLOP/s; ring parts "
                   "(rank 0, %d pairs of %d rows) %.3f ms %.4g TFLOP/s; parts/whole %.3f; parts/cudnn %.3f\n",
                   d ? "backward" : "forward", cp, B, T, nh, nkv, hd, wms[d], wtf[d], n, Tc, pms[d], ptf[d], ptf[d] / wtf[d],
                   dn > 0 ? ptf[d] / dtf[d] : 0.0);
    }
    const long tc = kernels_cuda_attention_part_tc_calls() - tc0;
    printf("cp-bench: %ld part calls on the tensor cores\n", tc);
    free(h);
    return tc > 0 ? 0 : 1;
}
