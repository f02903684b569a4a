/* fp8.c — the FP8 number formats and their scaling (fp8.h): the saturating
 * round-to-nearest-even cast to E4M3 and E5M2, decoding, the recipes'
 * scale groups and the fake quantization the CPU backend's FP8 products run. */
#include "fp8.h"
#include <float.h>
#include <math.h>
#include <string.h>

typedef struct Fmt {
    int mbits, bias;
    float max;
} Fmt;

static const Fmt FMTS[2] = {{3, 7, 448.0f}, {2, 15, 57344.0f}};

float fp8_max(Fp8Format f) { return FMTS[f].max; }

/* The magnitude a >= 0 (not NaN) rounded to the format's grid, to nearest
 * with ties to even, saturating at max (infinity too). The grid's step
 * near a is q = 2^(e - mbits), e a's exponent (at least the smallest
 * normal's: subnormals share its step); adding M = 2^23 q puts a's last
 * kept bit at the sum's last mantissa bit, so the fp32 add rounds a to a
 * multiple of q, to nearest even (the default rounding mode), and
 * subtracting M again is exact. */
static inline float round_mag(float a, const Fmt *p) {
    if (!(a < p->max)) return p->max;
    uint32_t u, mu;
    memcpy(&u, &a, sizeof u);
    int e = (int)(u >> 23) - 127, emin = 1 - p->bias;
    if (e < emin) e = emin;
    mu = (uint32_t)(e - p->mbits + 23 + 127) << 23;
    float M;
    memcpy(&M, &mu, sizeof M);
    float r = (a + M) - M;
    return r > p->max ? p->max : r;
}

/* x rounded to the format's grid (a value, not a code): NaN stays NaN */
static inline float round_fp8(float x, const Fmt *p) {
    if (x != x) return x;
    return copysignf(round_mag(fabsf(x), p), x);
}

uint8_t fp8_encode(float x, Fp8Format f) {
    const Fmt *p = &FMTS[f];
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (x != x) return (uint8_t)(sign | 0x7f);
    float v = round_mag(fabsf(x), p);
    if (v == 0.0f) return sign;
    int emin = 1 - p->bias, e;
    if (v < ldexpf(1.0f, emin)) return (uint8_t)(sign | (int)ldexpf(v, p->mbits - emin)); /* subnormal: m */
    frexpf(v, &e);
    e -= 1;
    int m = (int)ldexpf(v, p->mbits - e) - (1 << p->mbits);
    return (uint8_t)(sign | ((e + p->bias) << p->mbits) | m);
}

float fp8_decode(uint8_t code, Fp8Format f) {
    const Fmt *p = &FMTS[f];
    int mmask = (1 << p->mbits) - 1, emax_field = (0x7f >> p->mbits);
    int E = (code & 0x7f) >> p->mbits, m = code & mmask;
    float s = code & 0x80 ? -1.0f : 1.0f;
    if (f == FP8_E4M3 && (code & 0x7f) == 0x7f) return NAN;
    if (f == FP8_E5M2 && E == emax_field) return m ? NAN : s * INFINITY;
    if (E == 0) return s * ldexpf((float)m, 1 - p->bias - p->mbits);
    return s * ldexpf((float)(m + (1 << p->mbits)), E - p->bias - p->mbits);
}

float fp8_scale(float amax, Fp8Format f) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    float s = FMTS[f].max / amax;
    return isfinite(s) ? s : FLT_MAX;
}

void fp8_groups(int recipe, int weight, int kdim, int rows, int cols, int *gr, int *gc) {
    if (recipe == FP8_ROWWISE) {
        *gr = kdim ? 1 : rows;
        *gc = kdim ? cols : 1;
    } else if (recipe == FP8_BLOCKWISE) {
        *gr = weight || !kdim ? FP8_BLOCK : 1;
        *gc = weight || kdim ? FP8_BLOCK : 1;
    } else {
        *gr = rows;
        *gc = cols;
    }
    if (*gr > rows) *gr = rows > 0 ? rows : 1;
    if (*gc > cols) *gc = cols > 0 ? cols : 1;
}

size_t fp8_n_groups(int rows, int cols, int gr, int gc) {
    return (size_t)((rows + gr - 1) / gr) * (size_t)((cols + gc - 1) / gc);
}

/* a > m, or a NaN (which then stays: a NaN group takes scale 1) */
static inline float amax_step(float m, float x) {
    float a = fabsf(x);
    return a > m || a != a ? a : m;
}

void fp8_group_amax(float *amax, const float *src, int rows, int cols, int gr, int gc) {
    int nrt = (rows + gr - 1) / gr, nct = (cols + gc - 1) / gc;
    if (rows <= 0 || cols <= 0) return;
    if (nrt == 1 && nct == 1) { /* one group (tensorwise): the threads split the rows */
        float m = 0.0f;
        int nan = 0;
        #pragma omp parallel for reduction(max : m) reduction(| : nan) schedule(static)
        for (int r = 0; r < rows; r++) {
            const float *row = src + (size_t)r * cols;
            for (int c = 0; c < cols; c++) {
                float a = fabsf(row[c]);
                nan |= a != a;
                m = a > m ? a : m;
            }
        }
        amax[0] = nan ? NAN : m;
        return;
    }
    #pragma omp parallel for schedule(static) if (nrt > 1)
    for (int ti = 0; ti < nrt; ti++) {
        float *s = amax + (size_t)ti * nct;
        for (int j = 0; j < nct; j++) s[j] = 0.0f;
        int r1 = (ti + 1) * gr < rows ? (ti + 1) * gr : rows;
        for (int r = ti * gr; r < r1; r++) {
            const float *row = src + (size_t)r * cols;
            if (gc == 1) { /* a group a column (along the rows): one pass down the row */
                for (int c = 0; c < cols; c++) s[c] = amax_step(s[c], row[c]);
                continue;
            }
            for (int j = 0; j < nct; j++) {
                int c1 = (j + 1) * gc < cols ? (j + 1) * gc : cols;
                float m = s[j];
                for (int c = j * gc; c < c1; c++) m = amax_step(m, row[c]);
                s[j] = m;
            }
        }
    }
}

void fp8_amax_scales(float *x, size_t n, Fp8Format f) {
    for (size_t i = 0; i < n; i++) x[i] = fp8_scale(x[i], f);
}

void fp8_group_scales(float *scales, const float *src, int rows, int cols, int gr, int gc, Fp8Format f) {
    if (rows <= 0 || cols <= 0) return;
    fp8_group_amax(scales, src, rows, cols, gr, gc);
    fp8_amax_scales(scales, fp8_n_groups(rows, cols, gr, gc), f);
}

void fp8_apply(float *dst, const float *src, const float *scales, int rows, int cols, int gr, int gc, Fp8Format f) {
    const Fmt *p = &FMTS[f];
    int nct = (cols + gc - 1) / gc;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *s = scales + (size_t)(r / gr) * nct, *x = src + (size_t)r * cols;
        float *y = dst + (size_t)r * cols;
        if (gc == 1) {
            for (int c = 0; c < cols; c++) y[c] = round_fp8(x[c] * s[c], p) * (1.0f / s[c]);
            continue;
        }
        for (int j = 0; j < nct; j++) {
            float sc = s[j], inv = 1.0f / sc;
            int c1 = (j + 1) * gc < cols ? (j + 1) * gc : cols;
            for (int c = j * gc; c < c1; c++) y[c] = round_fp8(x[c] * sc, p) * inv;
        }
    }
}

void fp8_fake_quant(float *dst, const float *src, float *scales, int rows, int cols, int gr, int gc, Fp8Format f) {
    fp8_group_scales(scales, src, rows, cols, gr, gc, f);
    fp8_apply(dst, src, scales, rows, cols, gr, gc, f);
}
