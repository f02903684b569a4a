/* tests/test_gpu.h — what tests/test_gpu.c shares with the checks in files
 * of their own (tests/test_gpu_layers.c, _matmul.c, _model.c, _cp.c): the
 * two backends, the counters, the tolerances, the random inputs, device
 * copies and the comparisons (see test_gpu.c's first comment for the error
 * metric and the tolerances), and the checks main runs. */
#ifndef LLMTRAIN_TESTS_TEST_GPU_H
#define LLMTRAIN_TESTS_TEST_GPU_H
#include "kernels.h"
#include <stddef.h>
#include <stdint.h>

#define TOL_F32 1e-5    /* fp32 kernels */
#define TOL_TF32 5e-3   /* TF32 matmuls and attention */
#define TOL_RED 1e-9    /* sum / sumsq (double accumulation) */
#define TOL_BF16 1e-2   /* products of bf16 operands with fp32 accumulation */
#define TOL_FP32MM 1e-4 /* plain fp32 products: only the summation order differs */

extern const Kernels *KC, *KG; /* the CPU backend (the reference) and CUDA */
extern int pass, fail;
extern double tol_mm;  /* the linear layers' GEMMs, by compute dtype */
extern double tol_att; /* attention (always TF32 unless fp32) */
uint32_t rnd_u32(void);
/* n host floats, normal with deviation sd (malloc'd) */
float *hrand(size_t n, float sd);
float *hdup(const float *h, size_t n);
/* Positions counted from each document's start: B x T ints (free them) */
int *doc_positions(int B, int T);
/* device copies (freed at exit): fp32, ints, and an [a] buffer (bf16 when act16) */
float *dcopy(const float *h, size_t n);
int *dcopy_int(const int *h, size_t n);
float *dcopy_act(const float *h, size_t n);
/* the same off floats (elements) into a larger allocation: unaligned operands */
float *dcopy_off(const float *h, size_t n, int off);
float *dcopy_act_off(const float *h, size_t n, int off);
int act16(void);
/* h rounded in place as an [a] buffer holds it; a device [a] buffer's values (malloc'd) */
void act_round(float *h, size_t n);
float *act_to_host(const float *dev, size_t n);
/* max |dev - ref| / max(max |ref|, floor) within tol: one ok / FAIL line */
void check_host_floor(const char *name, const float *ref, const float *h, size_t n, double tol, double floor);
void check(const char *name, const float *ref, const float *dev, size_t n, double tol);
void check_host(const char *name, const float *ref, const float *h, size_t n, double tol);
void check_floor(const char *name, const float *ref, const float *dev, size_t n, double tol, double floor);
void check_act(const char *name, const float *ref, const float *dev, size_t n, double tol);
/* an [a] output computed in fp32: the CPU's rounded to nearest under bf16
 * (test_gpu.c says how exactly); _sum: one rounded from an fp32 sum */
void check_act_rn_floor_pct(const char *name, const float *ref, const float *dev, size_t n, double floor,
                            size_t min_exact_pct);
void check_act_rn(const char *name, const float *ref, const float *dev, size_t n);
void check_act_rn_sum(const char *name, const float *ref, const float *dev, size_t n);
void check_scalar(const char *name, double ref, double got, double tol);
/* bitwise: the count of words that differ; one ok / FAIL line */
size_t bits_differ(const float *host, const float *dev, size_t n);
void check_bits(const char *name, const float *host, const float *dev, size_t n);
void check_act_bits(const char *name, const float *dev_a, const float *dev_b, size_t n);

/* tests/test_gpu_layers.c: the layer kernels other than the GEMMs.
 * test_norms_case's form: the one-pass backward's expected form */
enum { NBW_NONE, NBW_SCALAR, NBW_REGS, NBW_REREAD };
void test_embed(void);
void test_embed_det(int B, int T, int C, int vocab, int v0, int Vl, int reset);
void test_norms_case(int N, int C, int form);
void test_norm_dinp_a_case(int N, int C, int vec, int off);
void test_add_norms(int N, int C);
void test_attention(void);
void test_rope(void);
void test_headnorm(int N, int nh, int nkv, int hd);
void test_pointwise(void);
void test_swiglu(int N, int F);
void test_crossentropy(int N, int V);
/* the mixture-of-experts kernels (moe_*) */
void test_moe(void);

/* tests/test_gpu_matmul.c: the linear layers' GEMMs */
void test_dout_a_case(int kind, int N, int C, int OC, int with_bias);
void test_matmul_case(int N, int C, int OC, int off, int with_bias);
void test_act_storage(int bf16_mode);
void test_matmul_res_case(int N, int C, int OC, int off, int with_bias);
void test_matmul_dinp_a_case(int N, int C, int OC, int with_bias);
void test_matmul_gelu_case(int N, int C, int OC, int off, int with_bias, int fused);
void test_matmul_act_bwd_case(int N, int C, int OC, int off, int swiglu, int with_bias, int fused);
void test_gelu_epilogue_variant(void);
void test_dgelu_epilogue_variant(void);
void test_lm_head_case(int N, int C, int V, int with_bias, int bias_off);

/* tests/test_gpu_model.c: weights, gradients, AdamW; model.c on the device */
void test_weight_cache(void);
void test_model_weight_copies(void);
void test_adamw_weight_copies(void);
void test_fresh_grads(void);
void test_model_fresh_grads(void);
void test_model_dres_copy(void);
void test_model_recompute(void);
void test_adamw(void);

/* tests/test_gpu_cp.c: context parallelism's attention parts against the
 * CPU's; and `tests/test_gpu cp-bench ...`, their speed (returns the exit
 * status) */
void test_attention_parts(void);
int cp_bench(int argc, char **argv);
#endif
