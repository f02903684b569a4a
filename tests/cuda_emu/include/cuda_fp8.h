/* the host emulation of CUDA's FP8 conversions (cuda_fp8.h) that kernels.cu
 * uses: __nv_cvt_float_to_fp8 to E4M3 / E5M2, rounding to nearest even,
 * saturating under __NV_SATFINITE (the cast fp8.h specifies), and the
 * decoding emu.cpp's cuBLASLt reads FP8 operands with. Written apart from
 * fp8.c (double arithmetic and rint, not fp8.c's fp32 addition trick), so
 * that tests/test_gpu comparing the two checks something. */
#ifndef LLMTRAIN_CUDA_EMU_CUDA_FP8_H
#define LLMTRAIN_CUDA_EMU_CUDA_FP8_H
#include <math.h>
#include <stdint.h>

typedef unsigned char __nv_fp8_storage_t;
typedef enum { __NV_NOSAT = 0, __NV_SATFINITE = 1 } __nv_saturation_t;
typedef enum { __NV_E4M3 = 0, __NV_E5M2 = 1 } __nv_fp8_interpretation_t;

/* mantissa bits, exponent bias, largest finite value, its code */
static inline void emu_fp8_format(__nv_fp8_interpretation_t t, int *mbits, int *bias, double *max, int *maxcode) {
    *mbits = t == __NV_E5M2 ? 2 : 3;
    *bias = t == __NV_E5M2 ? 15 : 7;
    *max = t == __NV_E5M2 ? 57344.0 : 448.0;
    *maxcode = t == __NV_E5M2 ? 0x7b : 0x7e;
}

static inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t t) {
    int mbits, bias, maxcode;
    double max;
    emu_fp8_format(t, &mbits, &bias, &max, &maxcode);
    const int sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return (__nv_fp8_storage_t)(sign | 0x7f);
    const int over = sat == __NV_SATFINITE ? maxcode : t == __NV_E5M2 ? 0x7c : 0x7f;
    double v = fabs((double)x);
    if (isinf(v)) return (__nv_fp8_storage_t)(sign | over);
    if (v == 0.0) return (__nv_fp8_storage_t)sign;
    int e;
    frexp(v, &e);
    e -= 1; /* v in [2^e, 2^(e+1)) */
    const int emin = 1 - bias;
    if (e < emin) e = emin; /* subnormals: the smallest normal's step */
    double step = ldexp(1.0, e - mbits), r = rint(v / step) * step; /* ties to even */
    if (r > max) return (__nv_fp8_storage_t)(sign | over);
    if (r == 0.0) return (__nv_fp8_storage_t)sign;
    if (r < ldexp(1.0, emin)) return (__nv_fp8_storage_t)(sign | (int)(r / ldexp(1.0, emin - mbits)));
    frexp(r, &e);
    e -= 1;
    int m = (int)(r / ldexp(1.0, e - mbits)) - (1 << mbits);
    return (__nv_fp8_storage_t)(sign | ((e + bias) << mbits) | m);
}

/* a code's value (NaN codes: NaN; E5M2's infinities) */
static inline float emu_fp8_to_float(__nv_fp8_storage_t c, __nv_fp8_interpretation_t t) {
    int mbits, bias, maxcode;
    double max;
    emu_fp8_format(t, &mbits, &bias, &max, &maxcode);
    const double s = c & 0x80 ? -1.0 : 1.0;
    const int E = (c & 0x7f) >> mbits, m = c & ((1 << mbits) - 1), Emax = 0x7f >> mbits;
    if (t == __NV_E4M3 && (c & 0x7f) == 0x7f) return NAN;
    if (t == __NV_E5M2 && E == Emax) return m ? NAN : (float)(s * INFINITY);
    if (E == 0) return (float)(s * ldexp((double)m, 1 - bias - mbits));
    return (float)(s * ldexp((double)(m + (1 << mbits)), E - bias - mbits));
}
#endif
