/* kernels_cpu_moe.c — the CPU backend's mixture-of-experts kernels
 * (kernels_ops.h's moe_* entries): the router's softmax and top-k, its
 * backward with the balance losses' terms, and the permutation of token
 * rows to their experts and back. Plain loops over tokens, parallel with
 * OpenMP; every sum runs in a fixed order, so results do not depend on
 * the thread count. */
#define _GNU_SOURCE
#include "kernels.h"
#include "kernels_cpu.h"
#include <math.h>
#include <string.h>

void cpu_moe_route(float *probs, float *lse, int *idx, float *wts, const float *logits, const float *bias, int N, int E,
                   int k, int norm_topk) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * E;
        float *p = probs + (size_t)n * E;
        float mx = x[0];
        for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        double s = 0.0;
        for (int e = 0; e < E; e++) s += exp((double)x[e] - mx);
        for (int e = 0; e < E; e++) p[e] = (float)(exp((double)x[e] - mx) / s);
        lse[n] = (float)(mx + log(s));
        /* top-k by probability plus bias (the bias only chooses); ties to the lower index */
        int *id = idx + (size_t)n * k;
        float *w = wts + (size_t)n * k;
        double sum = 0.0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = 0.0f;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= id[i] == e;
                if (taken) continue;
                float v = p[e] + (bias ? bias[e] : 0.0f);
                if (best < 0 || v > bv) { best = e; bv = v; }
            }
            id[j] = best;
            w[j] = p[best];
            sum += p[best];
        }
        if (norm_topk)
            for (int j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
    }
}

void cpu_moe_route_backward(float *dlogits, const float *probs, const float *lse, const int *idx, const float *wts,
                            const float *dwts, const float *dprob, float dz, int N, int E, int k, int norm_topk) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * E;
        const int *id = idx + (size_t)n * k;
        const float *w = wts + (size_t)n * k, *dw = dwts + (size_t)n * k;
        float *dl = dlogits + (size_t)n * E;
        /* d(probs): the aux loss's per-expert term, then the chosen weights' */
        for (int e = 0; e < E; e++) dl[e] = dprob ? dprob[e] : 0.0f;
        if (norm_topk) { /* w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S */
            double s = 0.0, dot = 0.0;
            for (int j = 0; j < k; j++) { s += p[id[j]]; dot += (double)dw[j] * w[j]; }
            for (int j = 0; j < k; j++) dl[id[j]] += (float)((dw[j] - dot) / s);
        } else {
            for (int j = 0; j < k; j++) dl[id[j]] += dw[j];
        }
        /* softmax: dx_e = p_e (dp_e - sum p dp); the z-loss dz * lse^2 adds 2 dz lse p_e */
        double dot = 0.0;
        for (int e = 0; e < E; e++) dot += (double)p[e] * dl[e];
        double z = 2.0 * (double)dz * lse[n];
        for (int e = 0; e < E; e++) dl[e] = (float)(p[e] * (dl[e] - dot + z));
    }
}

void cpu_moe_colsum(float *out, const float *x, int N, int E) {
    for (int e = 0; e < E; e++) {
        double s = 0.0;
        for (int n = 0; n < N; n++) s += x[(size_t)n * E + e];
        out[e] = (float)s;
    }
}

void cpu_moe_permute(float *xp, const float *x, const int *src, int n, int C) {
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) memcpy(xp + (size_t)r * C, x + (size_t)src[r] * C, (size_t)C * sizeof(float));
}

void cpu_moe_combine(float *out, const float *res, const float *yp, const float *wts, const int *slot, int N, int k,
                     int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        if (res) { if (res != out) memcpy(o, res + (size_t)n * C, (size_t)C * sizeof(float)); }
        else memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            int r = slot[(size_t)n * k + j];
            if (r < 0) continue;
            const float *y = yp + (size_t)r * C;
            float w = wts[(size_t)n * k + j];
            for (int c = 0; c < C; c++) o[c] += w * y[c];
        }
    }
}

void cpu_moe_combine_backward(float *dyp, float *dwts, const float *dout, const float *yp, const float *wts,
                              const int *slot, int N, int k, int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            int r = slot[(size_t)n * k + j];
            if (r < 0) { dwts[(size_t)n * k + j] = 0.0f; continue; }
            const float *y = yp + (size_t)r * C;
            float *dy = dyp + (size_t)r * C, w = wts[(size_t)n * k + j];
            double dot = 0.0;
            for (int c = 0; c < C; c++) { dot += (double)d[c] * y[c]; dy[c] = w * d[c]; }
            dwts[(size_t)n * k + j] = (float)dot;
        }
    }
}

void cpu_moe_unpermute_add(float *dx, const float *dxp, const int *slot, int N, int k, int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = dx + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            int r = slot[(size_t)n * k + j];
            if (r < 0) continue;
            const float *s = dxp + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += s[c];
        }
    }
}
