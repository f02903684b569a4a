/* tests/test_gpu.h — what tests/test_gpu.c shares with the checks in files
 * of their own (tests/test_gpu_cp.c): the two backends, the counters, the
 * random inputs, device copies and the comparisons (see test_gpu.c's
 * first comment for the error metric and the tolerances). */
#ifndef LLMTRAIN_TESTS_TEST_GPU_H
#define LLMTRAIN_TESTS_TEST_GPU_H
#include "kernels.h"
#include <stddef.h>
#include <stdint.h>

#define TOL_BF16 1e-2   /* products of bf16 operands with fp32 accumulation */
#define TOL_FP32MM 1e-4 /* plain fp32 products: only the summation order differs */

extern const Kernels *KC, *KG; /* the CPU backend (the reference) and CUDA */
extern int pass, fail;
uint32_t rnd_u32(void);
/* n host floats, normal with deviation sd (malloc'd) */
float *hrand(size_t n, float sd);
/* device copies (freed at exit): fp32, ints, and an [a] buffer (bf16 when act16) */
float *dcopy(const float *h, size_t n);
int *dcopy_int(const int *h, size_t n);
float *dcopy_act(const float *h, size_t n);
int act16(void);
/* h rounded in place as an [a] buffer holds it; a device [a] buffer's values (malloc'd) */
void act_round(float *h, size_t n);
float *act_to_host(const float *dev, size_t n);
/* max |dev - ref| / max(max |ref|, floor) within tol: one ok / FAIL line */
void check_host_floor(const char *name, const float *ref, const float *h, size_t n, double tol, double floor);
void check(const char *name, const float *ref, const float *dev, size_t n, double tol);
void check_act(const char *name, const float *ref, const float *dev, size_t n, double tol);

/* tests/test_gpu_cp.c: context parallelism's attention parts against the
 * CPU's; and `tests/test_gpu cp-bench ...`, their speed (returns the exit
 * status) */
void test_attention_parts(void);
int cp_bench(int argc, char **argv);
#endif
