/* fp8.h — the FP8 number formats and their scaling: E4M3 and E5M2 codes to
 * and from fp32, the scales of the recipes (tensorwise, rowwise, blockwise)
 * and the fake quantization (scale, cast, dequantize; fp32 out) that the CPU
 * backend runs before its fp32 products under train.compute_dtype fp8.
 *
 * Formats (OCP FP8, as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2):
 *   E4M3 ("fn"): bias 7, 3 mantissa bits, largest finite 448, no
 *        infinities, NaN is S.1111.111 (0x7f / 0xff); subnormals m * 2^-9.
 *   E5M2: bias 15, 2 mantissa bits, largest finite 57344, infinities
 *        S.11111.00, NaN S.11111.xx (xx != 0); subnormals m * 2^-16.
 * The cast (fp8_encode) rounds to nearest, ties to even, and saturates: a
 * value beyond the largest finite one, infinities included, becomes the
 * largest finite value of its sign; NaN stays NaN (0x7f with the sign).
 * That is PTX's cvt.rn.satfinite, the cast Transformer Engine and
 * cuBLASLt's FP8 outputs use: a scaled value a little above the format's
 * top (the amax times the scale rounds up) must not become NaN (E4M3) or
 * infinity (E5M2), and a gradient that overflowed is clipped to the top
 * rather than turned into a NaN that poisons the whole step.
 *
 * Scales: a group of elements (the whole tensor, a row, a column, a block)
 * takes scale = fmax / amax, its largest finite value over its largest
 * magnitude, so the group's amax lands on the format's top; an all-zero
 * group (or one whose amax is not finite) takes 1; a scale that overflows
 * fp32 (a subnormal amax) takes FLT_MAX. The quantized value is
 * q = encode(x * scale) and it dequantizes as decode(q) * (1 / scale), the
 * inverse scale being what cuBLASLt's A/B scale pointers take. */
#ifndef LLMTRAIN_FP8_H
#define LLMTRAIN_FP8_H
#include <stddef.h>
#include <stdint.h>

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } Fp8Format;

/* train.fp8_recipe's choices, in the order of their values */
#define FP8_RECIPES "tensorwise|blockwise|rowwise"
enum { FP8_TENSORWISE = 0, FP8_BLOCKWISE = 1, FP8_ROWWISE = 2 };
#define FP8_BLOCK 128 /* blockwise: 1 x 128 blocks of activations and gradients, 128 x 128 of weights */

/* The largest finite value: 448 (E4M3), 57344 (E5M2). */
float fp8_max(Fp8Format f);
/* fp32 to the nearest code, ties to even, saturating (above). */
uint8_t fp8_encode(float x, Fp8Format f);
/* A code's value, exactly. */
float fp8_decode(uint8_t code, Fp8Format f);
/* fmax / amax, 1 for amax 0 or not finite, FLT_MAX when it overflows. */
float fp8_scale(float amax, Fp8Format f);

/* The groups a recipe scales an operand of a product by, for a rows x cols
 * row-major operand whose contraction (K) dimension is its columns (kdim 1)
 * or its rows (kdim 0), a weight (weight 1) or an activation or gradient:
 *   tensorwise: the whole tensor;
 *   rowwise: one group per index of the dimension that is not contracted
 *            (so the scale factors out of every dot product: cuBLASLt's
 *            outer-vector scaling): a row (kdim 1) or a column (kdim 0);
 *   blockwise: a weight, 128 x 128 tiles whatever kdim; otherwise 128
 *            consecutive elements along K: 1 x 128 (kdim 1), 128 x 1 (0).
 * Groups at the right and bottom edges are cut short by the shape. Gives
 * the group's rows and columns (*gr, *gc). */
void fp8_groups(int recipe, int weight, int kdim, int rows, int cols, int *gr, int *gc);
/* How many groups of gr x gc cover rows x cols (their scales). */
size_t fp8_n_groups(int rows, int cols, int gr, int gc);
/* scales[g] of each gr x gc group of src (row-major by group: group (i, j)
 * at i * ceil(cols / gc) + j) */
void fp8_group_scales(float *scales, const float *src, int rows, int cols, int gr, int gc, Fp8Format f);
/* dst = decode(encode(src * scale)) * (1 / scale), scale its group's:
 * the fake quantization (dst == src allowed). */
void fp8_apply(float *dst, const float *src, const float *scales, int rows, int cols, int gr, int gc, Fp8Format f);
/* The two halves of fp8_group_scales: each group's amax (its largest
 * magnitude; NaN if it holds one) into amax, laid out as the scales; then
 * n amaxes into their scales in place (tensor parallelism reduces the
 * amaxes of split groups between the two). */
void fp8_group_amax(float *amax, const float *src, int rows, int cols, int gr, int gc);
void fp8_amax_scales(float *x, size_t n, Fp8Format f);
/* Both: the scales into scales (fp8_n_groups of them), then dst. */
void fp8_fake_quant(float *dst, const float *src, float *scales, int rows, int cols, int gr, int gc, Fp8Format f);

#endif
