/* kernels_cpu.h — what the CPU backend's files share (not an interface:
 * model code calls kernels.h's table): the vectorisable exp and row
 * reductions, and the attention kernels kernels_cpu_attention.c gives the
 * table in kernels_cpu.c. */
#ifndef LLMTRAIN_KERNELS_CPU_H
#define LLMTRAIN_KERNELS_CPU_H
#include <stdint.h>


/* glibc's expf is only vectorised under -ffast-math, and exp dominates the
 * 50257-wide softmax and the GELU/SiLU loops, so this is Cephes' expf (about
 * 1 ulp on the clamped range) written so gcc vectorises it: round-to-nearest
 * by the 1.5*2^23 trick, Cody-Waite reduction, degree-6 polynomial, and the
 * power of two built directly in the exponent bits. Inputs below -87 give
 * e^-87 (~1.6e-38) instead of denormals, which is zero for every use here. */
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = x * 1.44269504088896341f + 12582912.0f;
    n -= 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union { int32_t i; float f; } s;
    s.i = ((int32_t)n + 127) << 23;
    return p * s.f;
}

/* The exp is a loop of its own and the double sum a second one: gcc gives up
 * vectorising a loop that mixes exp_f's 16-lane int/float work with an
 * 8-lane double reduction, and a second pass over a row in L1/L2 is cheap. */
static inline float row_max(const float *x, int n) {
    float m = x[0];
    #pragma omp simd reduction(max:m)
    for (int j = 1; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

static inline double row_sum(const float *x, int n) {
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int j = 0; j < n; j++) s += x[j];
    return s;
}

/* x = exp(x - m) in place; returns the sum */
static inline double row_exp_sum(float *x, int n, float m) {
    for (int j = 0; j < n; j++) x[j] = exp_f(x[j] - m);
    return row_sum(x, n);
}

/* kernels.h's attention_forward, attention_backward and the context-parallel
 * attention parts (kernels_cpu_attention.c) */
void cpu_attention_forward(float *out, float *lse, const float *qkv, const int *qstart, int B, int T, int nh, int nkv, int hd);
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            const int *qstart, int B, int T, int nh, int nkv, int hd);
void cpu_attention_part_forward(float *out, float *lse, const float *qkv, int qrow, int q0, int nq, const float *kv, int krow,
                                int k0, int nk, const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd, int merge);
void cpu_attention_part_backward(float *dqkv, float *dkv, const float *dout, const float *qkv, const float *out,
                                 const float *lse, int qrow, int q0, int nq, const float *kv, int krow, int k0, int nk,
                                 const int *qstart, int B, int Tq, int Tk, int nh, int nkv, int hd);


/* kernels.h's mixture-of-experts entries (kernels_cpu_moe.c) */
void cpu_moe_route(float *probs, float *lse, int *idx, float *wts, const float *logits, const float *bias, int N, int E,
                   int k, int norm_topk);
void cpu_moe_route_backward(float *dlogits, const float *probs, const float *lse, const int *idx, const float *wts,
                            const float *dwts, const float *dprob, float dz, int N, int E, int k, int norm_topk);
void cpu_moe_colsum(float *out, const float *x, int N, int E);
void cpu_moe_permute(float *xp, const float *x, const int *src, int n, int C);
void cpu_moe_combine(float *out, const float *res, const float *yp, const float *wts, const int *slot, int N, int k,
                     int C);
void cpu_moe_combine_backward(float *dyp, float *dwts, const float *dout, const float *yp, const float *wts,
                              const int *slot, int N, int k, int C);
void cpu_moe_unpermute_add(float *dx, const float *dxp, const int *slot, int N, int k, int C);

#endif
