/* kernels_cpu_attention.c — the CPU backend's attention (kernels.h):
 * causal and block-causal attention over whole sequences, flash-style with
 * sgemm score blocks, and context parallelism's attention parts merged by
 * their log-sum-exp. */
#include "kernels.h"
#include "kernels_cpu.h"
#include "util.h"
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows are processed in blocks of ATT_BLOCK queries so that the causal upper
 * triangle costs at most one block of wasted sgemm work instead of half. */
#define ATT_BLOCK 256

static void check_heads(int nh, int nkv) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0)
        die(EXIT_INTERNAL, "attention: n_head %d is not a multiple of n_kv_head %d", nh, nkv);
}

/* Scratch of one thread, it only grows, so steady-state steps never allocate:
 * a block of probabilities (P) and, in the backward, of dP / dS. */
static _Thread_local float *att_scratch;
static _Thread_local size_t att_scratch_cap;

static float *att_scratch_get(size_t n) {
    if (n > att_scratch_cap) {
        free(att_scratch);
        att_scratch = malloc_check(n * sizeof(float));
        att_scratch_cap = n;
    }
    return att_scratch;
}

/* Scores of query rows [r0, r1) against keys [c0, r1): P[M, r1 - c0] = scale q k^T */
static void att_scores(float *P, const float *q, const float *k, int S, int r0, int r1, int c0, int hd,
                       float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1 - c0, hd, scale, q + (size_t)r0 * S, S,
                k + (size_t)c0 * S, S, 0.0f, P, r1 - c0);
}

/* The first key of query t of one row: its document's first token under a
 * block-causal mask (qs, the row's qstart), else 0 */
static inline int att_start(const int *qs, int t) { return qs ? qs[t] : 0; }

/* Flash-style attention: the probabilities of a block of ATT_BLOCK query
 * rows live only in the thread's scratch, the forward saves each row's
 * log-sum-exp, and the backward recomputes P = exp(s - lse). Memory is
 * O(T) per head instead of the T x T probabilities. A block's keys start at
 * its first row's qstart (the smallest: qstart never decreases along a row),
 * its column j is key c0 + j, and row t's probabilities are zero outside
 * [qstart[t], t]. */
void cpu_attention_forward(float *out, float *lse, const float *qkv, const int *qstart,
                           int B, int T, int nh, int nkv, int hd) {
    check_heads(nh, nkv);
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t need = (size_t)(T < ATT_BLOCK ? T : ATT_BLOCK) * T;
    // each thread owns whole (b,h) pairs: single-threaded sgemms, no sharing
    #pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < nh; h++) {
            float *P = att_scratch_get(need);
            int kh = h / group;
            const int *qs = qstart ? qstart + (size_t)b * T : NULL;
            const float *q = qkv + (size_t)b * T * S + (size_t)h * hd;
            const float *k = qkv + (size_t)b * T * S + (size_t)(nh + kh) * hd;
            const float *v = qkv + (size_t)b * T * S + (size_t)(nh + nkv + kh) * hd;
            float *o = out + (size_t)b * T * OS + (size_t)h * hd;
            float *L = lse + ((size_t)b * nh + h) * T;
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, M = r1 - r0, c0 = att_start(qs, r0), W = r1 - c0;
                att_scores(P, q, k, S, r0, r1, c0, hd, scale);
                for (int t = r0; t < r1; t++) {
                    // softmax over [s, t], zero elsewhere
                    float *row = P + (size_t)(t - r0) * W;
                    int s0 = att_start(qs, t) - c0, n = t - c0 + 1;
                    float m = row_max(row + s0, n - s0);
                    double z = row_exp_sum(row + s0, n - s0, m);
                    float inv = (float)(1.0 / z);
                    for (int j = 0; j < s0; j++) row[j] = 0.0f;
                    for (int j = s0; j < n; j++) row[j] *= inv;
                    for (int j = n; j < W; j++) row[j] = 0.0f;
                    L[t] = m + (float)log(z);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, W,
                            1.0f, P, W, v + (size_t)c0 * S, S, 0.0f, o + (size_t)r0 * OS, OS);
            }
        }
    }
}

void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int *qstart, int B, int T, int nh, int nkv, int hd) {
    if (!dqkv) return;
    check_heads(nh, nkv);
    const int S = (nh + 2 * nkv) * hd, OS = nh * hd, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t blk = (size_t)(T < ATT_BLOCK ? T : ATT_BLOCK) * T;
    // the query heads of one kv head all add into its dK and dV, so a thread
    // owns a whole (b, kv head) group, and zeroes its columns first (dqkv is
    // overwritten)
    #pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int kh = 0; kh < nkv; kh++) {
            float *P = att_scratch_get(2 * blk), *dS = P + blk;
            size_t base = (size_t)b * T * S;
            const int *qs = qstart ? qstart + (size_t)b * T : NULL;
            const float *k = qkv + base + (size_t)(nh + kh) * hd;
            const float *v = qkv + base + (size_t)(nh + nkv + kh) * hd;
            float *dk = dqkv + base + (size_t)(nh + kh) * hd;
            float *dv = dqkv + base + (size_t)(nh + nkv + kh) * hd;
            for (int t = 0; t < T; t++) { /* overwritten: this group's columns start at zero */
                memset(dqkv + base + (size_t)t * S + (size_t)kh * group * hd, 0, (size_t)group * hd * sizeof(float));
                memset(dk + (size_t)t * S, 0, (size_t)hd * sizeof(float));
                memset(dv + (size_t)t * S, 0, (size_t)hd * sizeof(float));
            }
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                const float *q = qkv + base + (size_t)h * hd;
                float *dq = dqkv + base + (size_t)h * hd;
                const float *L = lse + ((size_t)b * nh + h) * T;
                const float *O = out + (size_t)b * T * OS + (size_t)h * hd;
                const float *dO = dout + (size_t)b * T * OS + (size_t)h * hd;
                for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                    int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, M = r1 - r0;
                    int c0 = att_start(qs, r0), W = r1 - c0;
                    // P = exp(s - lse) again, zero outside [qstart, t]
                    att_scores(P, q, k, S, r0, r1, c0, hd, scale);
                    for (int t = r0; t < r1; t++) {
                        float *row = P + (size_t)(t - r0) * W, l = L[t];
                        int s0 = att_start(qs, t) - c0, n = t - c0 + 1;
                        for (int j = 0; j < s0; j++) row[j] = 0.0f;
                        for (int j = s0; j < n; j++) row[j] = exp_f(row[j] - l);
                        for (int j = n; j < W; j++) row[j] = 0.0f;
                    }
                    // dP = dO V^T, dV += P^T dO
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, W, hd,
                                1.0f, dO + (size_t)r0 * OS, OS, v + (size_t)c0 * S, S, 0.0f, dS, W);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, W, hd, M,
                                1.0f, P, W, dO + (size_t)r0 * OS, OS, 1.0f, dv + (size_t)c0 * S, S);
                    // dS = P * (dP - D) * scale with D = rowsum(P * dP) = dO . O
                    for (int t = r0; t < r1; t++) {
                        const float *p = P + (size_t)(t - r0) * W, *ot = O + (size_t)t * OS, *gt = dO + (size_t)t * OS;
                        float *ds = dS + (size_t)(t - r0) * W;
                        double dd = 0.0;
                        #pragma omp simd reduction(+:dd)
                        for (int i = 0; i < hd; i++) dd += (double)ot[i] * gt[i];
                        float D = (float)dd;
                        int s0 = att_start(qs, t) - c0, n = t - c0 + 1;
                        for (int j = 0; j < s0; j++) ds[j] = 0.0f;
                        for (int j = s0; j < n; j++) ds[j] = p[j] * (ds[j] - D) * scale;
                        for (int j = n; j < W; j++) ds[j] = 0.0f;
                    }
                    // dQ += dS K, dK += dS^T Q
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, W,
                                1.0f, dS, W, k + (size_t)c0 * S, S, 1.0f, dq + (size_t)r0 * S, S);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, W, hd, M,
                                1.0f, dS, W, q + (size_t)r0 * S, S, 1.0f, dk + (size_t)c0 * S, S);
                }
            }
        }
    }
}

/* Context parallelism's attention parts (kernels.h): a segment of queries
 * against a segment of keys, merged into out and lse by the online
 * softmax. A query at position p sees the segment's keys [lo, hi) (local
 * indices): those at positions [qstart, p]. */
static inline void att_part_range(const int *qs, int t, int p, int k0, int nk, int *lo, int *hi) {
    int a = (qs ? qs[t] : 0) - k0, b = p - k0 + 1;
    *lo = a > 0 ? a : 0;
    *hi = b < nk ? b : nk;
}

/* Scores of a segment's query rows [r0, r0 + M) against its nk keys: P[M, nk] = scale q k^T */
static void att_part_scores(float *P, const float *q, const float *k, int S, int KS, int r0, int M, int nk, int hd,
                            float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, hd, scale, q + (size_t)r0 * S, S, k, KS, 0.0f, P, nk);
}

void cpu_attention_part_forward(float *out, float *lse, const float *qkv, int qrow, int q0, int nq, const float *kv,
                                int krow, int k0, int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv,
                                int hd, int merge) {
    check_heads(nh, nkv);
    const int S = (nh + 2 * nkv) * hd, KS = 2 * nkv * hd, OS = nh * hd, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t need = (size_t)(nq < ATT_BLOCK ? nq : ATT_BLOCK) * nk;
    #pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < nh; h++) {
            float *P = att_scratch_get(need);
            int kh = h / group;
            const int *qs = qstart ? qstart + (size_t)b * Tq + qrow : NULL;
            const float *q = qkv + ((size_t)b * Tq + qrow) * S + (size_t)h * hd;
            const float *k = kv + ((size_t)b * Tk + krow) * KS + (size_t)kh * hd;
            const float *v = kv + ((size_t)b * Tk + krow) * KS + (size_t)(nkv + kh) * hd;
            float *o = out + ((size_t)b * Tq + qrow) * OS + (size_t)h * hd;
            float *L = lse + ((size_t)b * nh + h) * Tq + qrow;
            for (int r0 = 0; r0 < nq; r0 += ATT_BLOCK) {
                int r1 = r0 + ATT_BLOCK < nq ? r0 + ATT_BLOCK : nq, M = r1 - r0;
                att_part_scores(P, q, k, S, KS, r0, M, nk, hd, scale);
                for (int t = r0; t < r1; t++) {
                    float *row = P + (size_t)(t - r0) * nk, *ot = o + (size_t)t * OS;
                    int lo, hi;
                    att_part_range(qs, t, q0 + t, k0, nk, &lo, &hi);
                    double old = merge ? (double)L[t] : -INFINITY, nw = old;
                    if (hi > lo) { /* this part's log-sum-exp, then the merged one */
                        float m = row_max(row + lo, hi - lo);
                        double part = m + log(row_exp_sum(row + lo, hi - lo, m));
                        nw = old == -INFINITY ? part : old > part ? old + log1p(exp(part - old)) : part + log1p(exp(old - part));
                        float e = (float)exp((double)m - nw); /* row holds exp(s - m): P = exp(s - nw) */
                        for (int j = lo; j < hi; j++) row[j] *= e;
                    }
                    for (int j = 0; j < lo && j < nk; j++) row[j] = 0.0f;
                    for (int j = hi > lo ? hi : lo; j < nk; j++) row[j] = 0.0f;
                    if (old == -INFINITY) memset(ot, 0, (size_t)hd * sizeof(float));
                    else if (nw != old) {
                        float f = (float)exp(old - nw);
                        for (int i = 0; i < hd; i++) ot[i] *= f;
                    }
                    L[t] = (float)nw;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, nk, 1.0f, P, nk, v, KS, 1.0f,
                            o + (size_t)r0 * OS, OS);
            }
        }
    }
}

void cpu_attention_part_backward(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out,
                                 const float *lse, int qrow, int q0, int nq, const float *kv, int krow, int k0, int nk,
                                 const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd) {
    check_heads(nh, nkv);
    const int S = (nh + 2 * nkv) * hd, KS = 2 * nkv * hd, OS = nh * hd, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t blk = (size_t)(nq < ATT_BLOCK ? nq : ATT_BLOCK) * nk;
    /* a kv head's query heads all add into its dK and dV: a thread owns a (b, kv head) */
    #pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int kh = 0; kh < nkv; kh++) {
            float *P = att_scratch_get(2 * blk), *dS = P + blk;
            const int *qs = qstart ? qstart + (size_t)b * Tq + qrow : NULL;
            size_t kbase = ((size_t)b * Tk + krow) * KS, qbase = ((size_t)b * Tq + qrow) * S;
            const float *k = kv + kbase + (size_t)kh * hd, *v = kv + kbase + (size_t)(nkv + kh) * hd;
            float *dk = dkv + kbase + (size_t)kh * hd, *dv = dkv + kbase + (size_t)(nkv + kh) * hd;
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                const float *q = qkv + qbase + (size_t)h * hd;
                float *dq = dqkv + qbase + (size_t)h * hd;
                const float *L = lse + ((size_t)b * nh + h) * Tq + qrow;
                const float *O = out + ((size_t)b * Tq + qrow) * OS + (size_t)h * hd;
                const float *dO = dout + ((size_t)b * Tq + qrow) * OS + (size_t)h * hd;
                for (int r0 = 0; r0 < nq; r0 += ATT_BLOCK) {
                    int r1 = r0 + ATT_BLOCK < nq ? r0 + ATT_BLOCK : nq, M = r1 - r0;
                    att_part_scores(P, q, k, S, KS, r0, M, nk, hd, scale);
                    for (int t = r0; t < r1; t++) { /* P = exp(s - lse), zero outside the row's keys */
                        float *row = P + (size_t)(t - r0) * nk, l = L[t];
                        int lo, hi;
                        att_part_range(qs, t, q0 + t, k0, nk, &lo, &hi);
                        for (int j = 0; j < nk; j++) row[j] = j >= lo && j < hi ? exp_f(row[j] - l) : 0.0f;
                    }
                    /* dP = dO V^T, dV += P^T dO */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, hd, 1.0f, dO + (size_t)r0 * OS, OS, v, KS,
                                0.0f, dS, nk);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, M, 1.0f, P, nk, dO + (size_t)r0 * OS, OS,
                                1.0f, dv, KS);
                    /* dS = P (dP - D) scale, D = dO . O (the final output's) */
                    for (int t = r0; t < r1; t++) {
                        const float *p = P + (size_t)(t - r0) * nk, *ot = O + (size_t)t * OS, *gt = dO + (size_t)t * OS;
                        float *ds = dS + (size_t)(t - r0) * nk;
                        double dd = 0.0;
                        #pragma omp simd reduction(+:dd)
                        for (int i = 0; i < hd; i++) dd += (double)ot[i] * gt[i];
                        float D = (float)dd;
                        for (int j = 0; j < nk; j++) ds[j] = p[j] * (ds[j] - D) * scale;
                    }
                    /* dQ += dS K, dK += dS^T Q */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, nk, 1.0f, dS, nk, k, KS, 1.0f,
                                dq + (size_t)r0 * S, S);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, M, 1.0f, dS, nk, q + (size_t)r0 * S, S,
                                1.0f, dk, KS);
                }
            }
        }
    }
}
