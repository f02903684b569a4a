/* kernels_cpu.c — the CPU backend of kernels.h: plain C loops parallelised
 * with OpenMP over rows/tokens, OpenBLAS sgemm for every matrix product. */
#define _GNU_SOURCE
#include "kernels.h"
#include "kernels_cpu.h"
#include "fp8.h"
#include "util.h"
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <limits.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// memory

static void *cpu_alloc(size_t bytes) {
    // aligned_alloc wants a multiple of the alignment; 64 B = one cache line / zmm
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz == 0) sz = 64;
    void *p = aligned_alloc(64, sz);
    if (!p) die(EXIT_IO, "out of memory allocating %zu bytes (kernels_cpu)", bytes);
    memset(p, 0, sz);
    return p;
}

static void cpu_free(void *p) { free(p); }

// ----------------------------------------------------------------------------
// FP8 linears (Kernels.fp8_setup / fp8_scope; docs/fp8.md): the operands of
// a layer's products fake-quantized (fp8.c) into scratch, then the fp32
// products below. A weight's copy is kept, keyed by its address and its
// groups, while a weights_stable range holds it.

typedef struct Fp8Copy {
    const float *w;     /* the weight it was made from (NULL: a free entry) */
    int gr, gc, valid;  /* its groups; made since w's range was declared */
    size_t n;           /* floats */
    float *q;           /* in the arena */
} Fp8Copy;

typedef struct Fp8State {
    int recipe, on;          /* -1: FP8 off; in a layer's linears (fp8_scope: 1, FP8_COLUMN, FP8_ROW) */
    void (*reduce)(void *ctx, float *amax, size_t n); /* tp > 1: the TP group's max (fp8_tp) */
    void *reduce_ctx;
    void (*reduce_cp)(void *ctx, float *amax, size_t n); /* cp > 1: the context group's (fp8_cp) */
    void *reduce_cp_ctx;
    float *x, *d, *w;        /* scratch: an activation, an output gradient, a weight with no kept copy */
    float *scales;           /* one group's scale each, scales_cap of them */
    size_t scales_cap;
    float *arena;            /* the kept weight copies */
    size_t arena_cap, arena_used;
    Fp8Copy *copies;
    int n_copies, cap_copies;
    const float **rng_p;     /* the weights_stable ranges that hold: [rng_p[i], +rng_n[i]) */
    size_t *rng_n;
    int n_rng, cap_rng;
    long made, hits;         /* weight copies made and reused (tests) */
} Fp8State;
static Fp8State f8 = {.recipe = -1};

static void fp8_forget(const float *p, size_t n) { /* copies inside [p, p + n) are stale; NULL: all */
    for (int i = 0; i < f8.n_copies; i++) {
        Fp8Copy *c = &f8.copies[i];
        if (!p || (c->w < p + n && p < c->w + c->n)) c->valid = 0;
    }
}

/* the CPU's products read the fp32 weights: nothing to keep but, under
 * FP8, the ranges the weights' quantized copies may be kept for */
static void cpu_weights_stable(const float *p, size_t n) {
    if (f8.recipe < 0) return;
    fp8_forget(p, n);
    if (!p) { f8.n_rng = 0; return; }
    int k = 0;
    for (int i = 0; i < f8.n_rng; i++) /* a new range ends the ones it overlaps */
        if (!(f8.rng_p[i] < p + n && p < f8.rng_p[i] + f8.rng_n[i])) f8.rng_p[k] = f8.rng_p[i], f8.rng_n[k++] = f8.rng_n[i];
    f8.n_rng = k;
    if (f8.n_rng == f8.cap_rng) { fp8_forget(NULL, 0); f8.n_rng = 0; } /* full: start again (copies are only ever dropped) */
    f8.rng_p[f8.n_rng] = p;
    f8.rng_n[f8.n_rng++] = n;
}

static void fp8_setup(int recipe, const Fp8Sizes *z) {
    float **bufs[] = {&f8.x, &f8.d, &f8.w, &f8.scales, &f8.arena};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(*bufs[i]), *bufs[i] = NULL;
    free(f8.copies);
    free(f8.rng_p);
    free(f8.rng_n);
    f8 = (Fp8State){.recipe = -1};
    if (recipe < 0) return;
    f8.recipe = recipe;
    f8.x = cpu_alloc(z->act_floats * sizeof(float));
    f8.d = cpu_alloc(z->act_floats * sizeof(float));
    f8.w = cpu_alloc(z->weight_max * sizeof(float));
    /* groups of an operand of e elements and largest dimension D: at most
     * e / 128 + D (1 x 128 blocks: rows x ceil(cols / 128)), or D (rowwise) */
    size_t e = z->act_floats > z->weight_max ? z->act_floats : z->weight_max;
    f8.scales_cap = e / FP8_BLOCK + 2 * (size_t)z->max_dim + 1;
    f8.scales = cpu_alloc(f8.scales_cap * sizeof(float));
    int orient = recipe == FP8_ROWWISE ? 2 : 1; /* rowwise: a copy for the forward and one for the input gradient */
    f8.arena_cap = z->weight_floats * orient;
    f8.arena = cpu_alloc(f8.arena_cap * sizeof(float));
    f8.cap_copies = z->n_weights * orient;
    f8.copies = cpu_alloc((size_t)f8.cap_copies * sizeof(Fp8Copy) + 1);
    f8.cap_rng = z->n_weights + 8;
    f8.rng_p = cpu_alloc((size_t)f8.cap_rng * sizeof *f8.rng_p);
    f8.rng_n = cpu_alloc((size_t)f8.cap_rng * sizeof *f8.rng_n);
}

static void fp8_scope(int on) { f8.on = on; }

static void fp8_tp(void (*reduce)(void *ctx, float *amax, size_t n), void *ctx) {
    f8.reduce = reduce;
    f8.reduce_ctx = ctx;
}

static void fp8_cp(void (*reduce)(void *ctx, float *amax, size_t n), void *ctx) {
    f8.reduce_cp = reduce;
    f8.reduce_cp_ctx = ctx;
}

/* The dimension of an operand the TP group splits (fp8_scope's on: column-
 * or row-parallel), -1 none: the weight's rows or columns, the input's
 * columns (row-parallel), dout's columns (column-parallel) */
#define SPLIT_W (f8.on == FP8_COLUMN ? 0 : f8.on == FP8_ROW ? 1 : -1)
#define SPLIT_X (f8.on == FP8_ROW ? 1 : -1)
#define SPLIT_D (f8.on == FP8_COLUMN ? 1 : -1)

static int fp8_active(void) { return f8.recipe >= 0 && f8.on; }

/* Whether a group of the recipe spans a split of dimension `split` of an
 * operand contracted along kdim: tensorwise's, and rowwise's along the
 * split K (blockwise blocks and tiles end at the split, model_fp8). */
static int fp8_spans(int split, int kdim) {
    return split >= 0 && (f8.recipe == FP8_TENSORWISE || (f8.recipe == FP8_ROWWISE && split == kdim));
}

/* src (rows x cols, contracted along its columns: kdim 1, or rows: 0)
 * fake-quantized into dst with the recipe's groups. split (SPLIT_*): the
 * dimension the TP group splits; the context group splits the rows (the
 * tokens) of an activation or gradient (not a weight). A group that spans
 * a split takes the group's max of the ranks' amaxes. */
static const float *fp8_q(float *dst, const float *src, int rows, int cols, int weight, int kdim, int split, Fp8Format f) {
    int gr, gc;
    fp8_groups(f8.recipe, weight, kdim, rows, cols, &gr, &gc);
    size_t n = fp8_n_groups(rows, cols, gr, gc);
    if (n > f8.scales_cap)
        die(EXIT_INTERNAL, "fp8: a %d x %d operand has more scale groups than fp8_setup made room for", rows, cols);
    fp8_group_amax(f8.scales, src, rows, cols, gr, gc);
    int tp = f8.reduce && fp8_spans(split, kdim), cp = f8.reduce_cp && !weight && fp8_spans(0, kdim);
    if (tp || cp) {
        for (size_t i = 0; i < n; i++) f8.scales[i] = f8.scales[i] != f8.scales[i] ? INFINITY : f8.scales[i];
        if (tp) f8.reduce(f8.reduce_ctx, f8.scales, n);
        if (cp) f8.reduce_cp(f8.reduce_cp_ctx, f8.scales, n);
    }
    fp8_amax_scales(f8.scales, n, f);
    fp8_apply(dst, src, f8.scales, rows, cols, gr, gc, f);
    return dst;
}

/* Weight w [rows, cols] in E4M3 for a product contracting its columns
 * (kdim 1: the forward) or its rows (0: the input gradient): the copy kept
 * while a weights_stable range holds w, made by the first product that
 * reads it (tensorwise and blockwise groups are the same both ways, so one
 * copy serves both); outside any range (or with no room left) made again
 * in scratch. */
static const float *fp8_weight(const float *w, int rows, int cols, int kdim) {
    size_t n = (size_t)rows * cols;
    int gr, gc, held = 0;
    fp8_groups(f8.recipe, 1, kdim, rows, cols, &gr, &gc);
    for (int i = 0; i < f8.n_rng && !held; i++) held = w >= f8.rng_p[i] && w + n <= f8.rng_p[i] + f8.rng_n[i];
    Fp8Copy *c = NULL;
    for (int i = 0; held && i < f8.n_copies && !c; i++)
        if (f8.copies[i].w == w && f8.copies[i].gr == gr && f8.copies[i].gc == gc && f8.copies[i].n == n) c = &f8.copies[i];
    if (held && !c && f8.n_copies < f8.cap_copies && f8.arena_used + n <= f8.arena_cap) {
        c = &f8.copies[f8.n_copies++];
        *c = (Fp8Copy){w, gr, gc, 0, n, f8.arena + f8.arena_used};
        f8.arena_used += n;
    }
    if (!c) return fp8_q(f8.w, w, rows, cols, 1, kdim, SPLIT_W, FP8_E4M3);
    if (c->valid) { f8.hits++; return c->q; }
    f8.made++;
    c->valid = 1;
    return fp8_q(c->q, w, rows, cols, 1, kdim, SPLIT_W, FP8_E4M3);
}

long kernels_cpu_fp8_weight_copies(long *hits) {
    if (hits) *hits = f8.hits;
    return f8.made;
}

/* Activation offload on the CPU: host and backend memory are the same, so a
 * copy is a memcpy that is complete when it returns. */
static void cpu_offload_copy(void *host, void *dev, size_t bytes, int to_host) {
    if (to_host) memcpy(host, dev, bytes);
    else memcpy(dev, host, bytes);
}
static int cpu_offload_mark(void) { return 0; }
static void cpu_offload_wait(int mark) { (void)mark; }

/* Gradient buffers are hundreds of MB and zeroed every step: one memset per
 * core gets more memory bandwidth than one. */
static void cpu_fill(void *dst, const void *src, size_t bytes) { /* src NULL: zero */
    const size_t chunk = (size_t)1 << 20;
    long nchunks = (long)((bytes + chunk - 1) / chunk);
    #pragma omp parallel for schedule(static) if (bytes >= 4 * chunk)
    for (long i = 0; i < nchunks; i++) {
        size_t off = (size_t)i * chunk;
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        if (src) memcpy((char *)dst + off, (const char *)src + off, len);
        else memset((char *)dst + off, 0, len);
    }
}

static void cpu_zero(void *p, size_t bytes) { cpu_fill(p, NULL, bytes); }

/* the CPU zeroes the gradients when told they start at zero: settled then */
static void cpu_grads_fresh(float *g, size_t n) { cpu_zero(g, n * sizeof(float)); }

static void cpu_grads_settle(float *g, size_t n) {
    (void)g;
    (void)n;
}

/* large copies (checkpoint staging, resume) are split over the threads too */
static void cpu_copy(void *dst, const void *src, size_t bytes) { cpu_fill(dst, src, bytes); }

// ----------------------------------------------------------------------------
// embeddings

static void embed_forward_vp(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                             int N, int T, int C, int v0, int V) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        int t = tokens[n] - v0;
        const float *pe = wpe ? wpe + (size_t)(pos ? pos[n] : n % T) * C : NULL;
        if (t >= 0 && t < V) {
            const float *we = wte + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = pe ? we[c] + pe[c] : we[c];
        } else {
            for (int c = 0; c < C; c++) o[c] = pe ? pe[c] : 0.0f;
        }
    }
}

/* Repeated tokens (and every batch row, or document, for wpe) hit the same gradient row,
 * so threads split the channels, not the tokens: race-free and deterministic. */
#define COLBLOCK 64

static void embed_backward_vp(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos,
                              int N, int T, int C, int v0, int V) {
    int nblocks = (C + COLBLOCK - 1) / COLBLOCK;
    #pragma omp parallel for
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * COLBLOCK, c1 = c0 + COLBLOCK < C ? c0 + COLBLOCK : C;
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            int t = tokens[n] - v0;
            if (dwte && t >= 0 && t < V) {
                float *g = dwte + (size_t)t * C;
                for (int c = c0; c < c1; c++) g[c] += d[c];
            }
            if (dwpe) {
                float *g = dwpe + (size_t)(pos ? pos[n] : n % T) * C;
                for (int c = c0; c < c1; c++) g[c] += d[c];
            }
        }
    }
}

/* Without tensor parallelism the whole vocabulary is this rank's slice. */
static void embed_forward(float *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int N,
                          int T, int C) {
    embed_forward_vp(out, tokens, pos, wte, wpe, N, T, C, 0, INT_MAX);
}

static void embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, const int *pos, int N,
                           int T, int C) {
    embed_backward_vp(dwte, dwpe, dout, tokens, pos, N, T, C, 0, INT_MAX);
}

// ----------------------------------------------------------------------------
// norms

/* One row: two passes in double (one-pass E[x^2]-E[x]^2 cancels badly on
 * large means). */
static inline void layernorm_row(float *o, float *mean, float *rstd, const float *x, const float *w,
                                 const float *b, int C, float eps) {
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int c = 0; c < C; c++) s += x[c];
    double m = s / C;
    double v = 0.0;
    #pragma omp simd reduction(+:v)
    for (int c = 0; c < C; c++) { double d = x[c] - m; v += d * d; }
    float mf = (float)m;
    float rs = (float)(1.0 / sqrt(v / C + eps));
    if (b) {
        for (int c = 0; c < C; c++) o[c] = (x[c] - mf) * rs * w[c] + b[c];
    } else {
        for (int c = 0; c < C; c++) o[c] = (x[c] - mf) * rs * w[c];
    }
    if (mean) *mean = mf;
    if (rstd) *rstd = rs;
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean ? mean + n : NULL, rstd ? rstd + n : NULL, inp + (size_t)n * C, w, b, C,
                      eps);
}

/* the row's sum first, then its norm while it is in cache */
static void add_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                  const float *w, const float *bias, int N, int C, float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *r = res + (size_t)n * C;
        const float *x = a + (size_t)n * C, *y = b + (size_t)n * C;
        for (int c = 0; c < C; c++) r[c] = x[c] + y[c];
        layernorm_row(out + (size_t)n * C, mean ? mean + n : NULL, rstd ? rstd + n : NULL, r, w, bias, C, eps);
    }
}

/* dw and db sum over rows, so they get their own pass split by channels;
 * dinp is per row. */
static void layernorm_backward(float *dinp, float *dinp_a, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C) {
    if (dinp) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
            float *g = dinp + (size_t)n * C;
            float m = mean[n], rs = rstd[n];
            double sd = 0.0, sdx = 0.0;
            #pragma omp simd reduction(+:sd, sdx)
            for (int c = 0; c < C; c++) {
                float dn = d[c] * w[c];
                sd += dn;
                sdx += dn * ((x[c] - m) * rs);
            }
            float md = (float)(sd / C), mdx = (float)(sdx / C);
            for (int c = 0; c < C; c++) {
                float xh = (x[c] - m) * rs;
                g[c] += rs * (d[c] * w[c] - md - xh * mdx);
            }
            if (dinp_a) memcpy(dinp_a + (size_t)n * C, g, (size_t)C * sizeof(float)); /* [a] is fp32 here */
        }
    }
    if (!dw && !db) return;
    int nblocks = (C + COLBLOCK - 1) / COLBLOCK;
    #pragma omp parallel for
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * COLBLOCK, nc = C - c0 < COLBLOCK ? C - c0 : COLBLOCK;
        double aw[COLBLOCK] = {0}, ab[COLBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C + c0, *x = inp + (size_t)n * C + c0;
            float m = mean[n], rs = rstd[n];
            for (int j = 0; j < nc; j++) {
                aw[j] += d[j] * ((x[j] - m) * rs);
                ab[j] += d[j];
            }
        }
        for (int j = 0; j < nc; j++) {
            if (dw) dw[c0 + j] += (float)aw[j];
            if (db) db[c0 + j] += (float)ab[j];
        }
    }
}

static inline void rmsnorm_row(float *o, float *rstd, const float *x, const float *w, int C, float eps) {
    double ss = 0.0;
    #pragma omp simd reduction(+:ss)
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    float rs = (float)(1.0 / sqrt(ss / C + eps));
    for (int c = 0; c < C; c++) o[c] = x[c] * rs * w[c];
    if (rstd) *rstd = rs;
}

static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                            int N, int C, float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) rmsnorm_row(out + (size_t)n * C, rstd ? rstd + n : NULL, inp + (size_t)n * C, w, C, eps);
}

static void add_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                int N, int C, float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *r = res + (size_t)n * C;
        const float *x = a + (size_t)n * C, *y = b + (size_t)n * C;
        for (int c = 0; c < C; c++) r[c] = x[c] + y[c];
        rmsnorm_row(out + (size_t)n * C, rstd ? rstd + n : NULL, r, w, C, eps);
    }
}

static void rmsnorm_backward(float *dinp, float *dinp_a, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C) {
    if (dinp) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
            float *g = dinp + (size_t)n * C;
            float rs = rstd[n];
            double s = 0.0;
            #pragma omp simd reduction(+:s)
            for (int c = 0; c < C; c++) s += d[c] * w[c] * (x[c] * rs);
            float mdx = (float)(s / C);
            // d/dx of x*rs: rs * (g - xhat * mean(g * xhat)), g = dout * w
            for (int c = 0; c < C; c++) g[c] += rs * (d[c] * w[c] - x[c] * rs * mdx);
            if (dinp_a) memcpy(dinp_a + (size_t)n * C, g, (size_t)C * sizeof(float));
        }
    }
    if (!dw) return;
    int nblocks = (C + COLBLOCK - 1) / COLBLOCK;
    #pragma omp parallel for
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * COLBLOCK, nc = C - c0 < COLBLOCK ? C - c0 : COLBLOCK;
        double aw[COLBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C + c0, *x = inp + (size_t)n * C + c0;
            float rs = rstd[n];
            for (int j = 0; j < nc; j++) aw[j] += d[j] * (x[j] * rs);
        }
        for (int j = 0; j < nc; j++) dw[c0 + j] += (float)aw[j];
    }
}

/* QK-norm: each q and k head of a row its own RMSNorm over hd values */
static void headnorm_forward(float *out, float *rstd, const float *inp, const float *qw, const float *kw, int N, int nh,
                             int nkv, int hd, float eps) {
    const size_t S = (size_t)(nh + 2 * nkv) * hd, H = (size_t)(nh + nkv);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * S;
        float *o = out + (size_t)n * S;
        for (size_t h = 0; h < H; h++)
            rmsnorm_row(o + h * hd, rstd + (size_t)n * H + h, x + h * hd, h < (size_t)nh ? qw : kw, hd, eps);
        memcpy(o + H * hd, x + H * hd, (size_t)nkv * hd * sizeof(float)); /* v */
    }
}

static void headnorm_backward(float *dqkv, float *dqw, float *dkw, const float *inp, const float *qw, const float *kw,
                              const float *rstd, int N, int nh, int nkv, int hd) {
    const size_t S = (size_t)(nh + 2 * nkv) * hd, H = (size_t)(nh + nkv);
    /* the weights' gradients first (they read d(out), which the input
     * gradient then overwrites): column j, q heads then k heads, the rows
     * and heads in order */
    if (dqw || dkw) {
        #pragma omp parallel for
        for (int j = 0; j < hd; j++) {
            double aq = 0.0, ak = 0.0;
            for (int n = 0; n < N; n++)
                for (size_t h = 0; h < H; h++) {
                    size_t i = (size_t)n * S + h * hd + (size_t)j;
                    double t = (double)dqkv[i] * (inp[i] * rstd[(size_t)n * H + h]);
                    if (h < (size_t)nh) aq += t;
                    else ak += t;
                }
            if (dqw) dqw[j] += (float)aq;
            if (dkw) dkw[j] += (float)ak;
        }
    }
    #pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (size_t h = 0; h < H; h++) {
            float *d = dqkv + (size_t)n * S + h * hd;
            const float *x = inp + (size_t)n * S + h * hd, *w = h < (size_t)nh ? qw : kw;
            float rs = rstd[(size_t)n * H + h];
            double s = 0.0;
            for (int c = 0; c < hd; c++) s += d[c] * w[c] * (x[c] * rs);
            float mdx = (float)(s / hd);
            for (int c = 0; c < hd; c++) d[c] = rs * (d[c] * w[c] - x[c] * rs * mdx); /* as rmsnorm_backward's */
        }
}

// ----------------------------------------------------------------------------
// matrix products

/* Debian's OpenBLAS is the pthread build: it keeps its own worker threads
 * next to OpenMP's, and both pools spin for a while after finishing work. On
 * a small machine they then fight over the cores, and every kernel that
 * follows a sgemm (or the sgemm that follows a kernel) slows down severalfold.
 * So OpenBLAS runs single-threaded and the threading is ours: every OpenMP
 * thread computes its own slice of C with a single-threaded sgemm. */
static void blas_init(void) {
    static int done;
    if (!done) {
        openblas_set_num_threads(1);
        done = 1;
    }
}

/* row-major C[M,N] = alpha op(A) op(B) + beta C, sliced over threads along
 * the larger of M and N (slice edges on multiples of 16 floats) */
static void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt == 1 || (double)M * N * K < 262144.0) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int split_n = N >= M, D = split_n ? N : M;
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < nt; i++) {
        int d0 = (int)((long)D * i / nt) & ~15;
        int d1 = i == nt - 1 ? D : (int)((long)D * (i + 1) / nt) & ~15;
        if (d1 <= d0) continue;
        if (split_n)
            cblas_sgemm(CblasRowMajor, ta, tb, M, d1 - d0, K, alpha, A, lda,
                        tb == CblasNoTrans ? B + d0 : B + (size_t)d0 * ldb, ldb, beta, C + d0, ldc);
        else
            cblas_sgemm(CblasRowMajor, ta, tb, d1 - d0, N, K, alpha,
                        ta == CblasNoTrans ? A + (size_t)d0 * lda : A + d0, lda, B, ldb, beta,
                        C + (size_t)d0 * ldc, ldc);
    }
}

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (fp8_active() && C > 0) { /* a layer's linear: E4M3 operands along C */
        inp = fp8_q(f8.x, inp, N, C, 0, 1, SPLIT_X, FP8_E4M3);
        w = fp8_weight(w, OC, C, 1);
    }
    float beta = 0.0f;
    if (bias) {
        // start from the bias and let sgemm accumulate onto it
        #pragma omp parallel for
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    sgemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

/* A layer's linear under FP8: the input gradient's operands, dout E5M2 and
 * w E4M3, grouped along OC, its contraction (dout into f8.d) */
static void fp8_dgrad_operands(const float **dout, const float **w, int N, int C, int OC) {
    if (!fp8_active()) return;
    *dout = fp8_q(f8.d, *dout, N, OC, 0, 1, SPLIT_D, FP8_E5M2);
    *w = fp8_weight(*w, OC, C, 0);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC) {
    if (N <= 0 || OC <= 0 || C <= 0) return;
    if (dinp) {
        const float *d = dout, *wq = w;
        fp8_dgrad_operands(&d, &wq, N, C, OC);
        sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, d, OC, wq, C, 0.0f, dinp, C); /* overwritten */
    }
    if (dw) {
        const float *d = dout, *x = inp;
        if (fp8_active()) { /* the weight gradient's: dout E5M2 and inp E4M3 along N, its contraction */
            d = fp8_q(f8.d, dout, N, OC, 0, 0, SPLIT_D, FP8_E5M2);
            x = fp8_q(f8.x, inp, N, C, 0, 0, SPLIT_X, FP8_E4M3);
        }
        sgemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, d, OC, x, C, 1.0f, dw, C);
    }
    if (dbias) {
        int nblocks = (OC + COLBLOCK - 1) / COLBLOCK;
        #pragma omp parallel for
        for (int cb = 0; cb < nblocks; cb++) {
            int c0 = cb * COLBLOCK, nc = OC - c0 < COLBLOCK ? OC - c0 : COLBLOCK;
            double acc[COLBLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC + c0;
                for (int j = 0; j < nc; j++) acc[j] += d[j];
            }
            for (int j = 0; j < nc; j++) dbias[c0 + j] += (float)acc[j];
        }
    }
}

/* the product, then res + it: the bits of matmul_forward then add */
static void matmul_forward_res(float *out, const float *res, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC) {
    matmul_forward(out, inp, w, bias, N, C, OC);
    const size_t n = (size_t)N * OC;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = res[i] + out[i];
}

/* [a] out / dout: fp32 here, so the plain products */
static void matmul_forward_a(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                             int OC) {
    matmul_forward(out, inp, w, bias, N, C, OC);
}

static void matmul_backward_a(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                              const float *w, int N, int C, int OC) {
    matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

/* dout_a (here and below): the same values as dout (fp32 [a]); read dout */
static void matmul_backward_dinp_a(float *dinp, float *dw, float *dbias, const float *dout, const float *dout_a,
                                   const float *inp, const float *w, int N, int C, int OC) {
    (void)dout_a;
    matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

static void cpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

/* Rotate the q and k heads of every row by its position's angles; dir = +1
 * forward, -1 the inverse (= transpose) rotation for the backward pass.
 * The rows read their position's cos and sin from a table over positions
 * [0, P) (P: T, or one past the largest of pos), computed once for a RoPE
 * and head dim and kept while later calls need no more positions: a
 * position array (documents' positions, which differ from row to row) costs
 * no more trigonometry than the rows' own. */
#define ROPE_MAX_HALF 512

static struct {
    Rope rope;
    int hd, P;
    float *cs, *sn; /* [P, hd/2]: cos and sin of p x rope_inv_freq(i), times rope_mscale */
} rope_tab;

static int rope_same(const Rope *a, const Rope *b) {
    return a->theta == b->theta && a->scaling == b->scaling && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->original_max_seq_len == b->original_max_seq_len && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->attention_factor == b->attention_factor && a->truncate == b->truncate;
}

static void rope_rotate(float *x, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope,
                        float dir) {
    if (hd % 2 != 0 || hd / 2 > ROPE_MAX_HALF)
        die(EXIT_INTERNAL, "rope: head_dim %d must be even and at most %d", hd, 2 * ROPE_MAX_HALF);
    const int half = hd / 2, S = (nh + 2 * nkv) * hd, nrot = nh + nkv;
    const size_t N = (size_t)B * T;
    int P = T;
    if (pos)
        for (size_t n = 0; n < N; n++) P = pos[n] >= P ? pos[n] + 1 : P;
    if (!rope_tab.cs || rope_tab.hd != hd || rope_tab.P < P || !rope_same(&rope_tab.rope, rope)) {
        double inv_freq[ROPE_MAX_HALF], m = rope_mscale(rope);
        for (int i = 0; i < half; i++) inv_freq[i] = rope_inv_freq(rope, i, hd);
        free(rope_tab.cs);
        free(rope_tab.sn);
        rope_tab.cs = malloc_check((size_t)P * half * sizeof(float));
        rope_tab.sn = malloc_check((size_t)P * half * sizeof(float));
        rope_tab.rope = *rope;
        rope_tab.hd = hd;
        rope_tab.P = P;
        #pragma omp parallel for
        for (int p = 0; p < P; p++)
            for (int i = 0; i < half; i++) { // angles in double: p * inv_freq reaches thousands of radians
                rope_tab.cs[(size_t)p * half + i] = (float)(m * cos((double)p * inv_freq[i]));
                rope_tab.sn[(size_t)p * half + i] = (float)(m * sin((double)p * inv_freq[i]));
            }
    }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        size_t p = (size_t)(pos ? pos[n] : (int)(n % T));
        const float *cs = rope_tab.cs + p * half, *sn0 = rope_tab.sn + p * half;
        float sn[ROPE_MAX_HALF];
        for (int i = 0; i < half; i++) sn[i] = dir * sn0[i]; /* exact: the backward's sin is the forward's negated */
        float *row = x + n * S;
        for (int hh = 0; hh < nrot; hh++) {
            float *v = row + (size_t)hh * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], c = v[i + half];
                v[i] = a * cs[i] - c * sn[i];
                v[i + half] = c * cs[i] + a * sn[i];
            }
        }
    }
}

static void rope_forward(float *qkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope) {
    rope_rotate(qkv, pos, B, T, nh, nkv, hd, rope, 1.0f);
}

static void rope_backward(float *dqkv, const int *pos, int B, int T, int nh, int nkv, int hd, const Rope *rope) {
    rope_rotate(dqkv, pos, B, T, nh, nkv, hd, rope, -1.0f);
}

// ----------------------------------------------------------------------------
// pointwise

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* 0.5x(1 + tanh(u)) == x * sigmoid(2u): one exp, and no cancellation near -1 */
static void gelu_forward(float *out, const float *inp, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + exp_f(-2.0f * u));
    }
}

/* d gelu(x) / dx */
static inline float gelu_grad(float x) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float e = exp_f(-2.0f * u);
    float sg = 1.0f / (1.0f + e);
    float omsg = e * sg; // 1 - sigmoid, without the cancellation
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return sg + 2.0f * x * sg * omsg * du;
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] += dout[i] * gelu_grad(inp[i]);
}

/* exactly the two calls: the CPU has nothing to fuse */
static void matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w, const float *bias,
                                int N, int C, int OC) {
    matmul_forward(pre, inp, w, bias, N, C, OC);
    gelu_forward(out, pre, (size_t)N * OC);
}

static void swiglu_forward(float *out, const float *inp, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        for (int j = 0; j < F; j++) o[j] = g[j] / (1.0f + exp_f(-g[j])) * u[j];
    }
}

/* SwiGLU's backward for one element: the gate's and the up projection's
 * gradients for the output gradient d */
static inline void swiglu_grads(float g, float u, float d, float *dg, float *du) {
    float e = exp_f(-g);
    float sg = 1.0f / (1.0f + e);
    float silu = g * sg;
    // silu'(g) = sg * (1 + g * (1 - sg)), with 1 - sg = e * sg
    *dg = d * u * sg * (1.0f + g * e * sg);
    *du = d * silu;
}

static void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
    if (!dinp) return;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F, *d = dout + (size_t)n * F;
        float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) {
            float a, b;
            swiglu_grads(g[j], u[j], d[j], &a, &b);
            dg[j] += a;
            du[j] += b;
        }
    }
}

/* dpre = gelu'(pre) . (dout @ w), overwritten: the product straight into
 * dpre (beta 0), then scaled in place; the same operations, in the same
 * order, as matmul_backward into zeros and gelu_backward into zeros */
static void matmul_gelu_backward(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
                                 const float *inp, const float *w, const float *pre, int N, int C, int OC) {
    (void)dout_a;
    if (N <= 0 || C <= 0) return;
    if (dpre && OC <= 0) memset(dpre, 0, (size_t)N * C * sizeof(float));
    if (OC <= 0) return;
    if (dpre) {
        const float *d = dout, *wq = w;
        fp8_dgrad_operands(&d, &wq, N, C, OC);
        sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, d, OC, wq, C, 0.0f, dpre, C);
        size_t n = (size_t)N * C;
        #pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) dpre[i] = dpre[i] * gelu_grad(pre[i]);
    }
    matmul_backward(NULL, dw, dbias, dout, inp, w, N, C, OC);
}

/* dpre [N, 2C]: the product dh = dout @ w goes into the gate columns (ld
 * 2C), then each row becomes (d gate | d up) in place */
static void matmul_swiglu_backward(float *dpre, float *dw, float *dbias, const float *dout, const float *dout_a,
                                   const float *inp, const float *w, const float *pre, int N, int C, int OC) {
    (void)dout_a;
    if (N <= 0 || C <= 0) return;
    if (dpre && OC <= 0) memset(dpre, 0, (size_t)N * 2 * C * sizeof(float));
    if (OC <= 0) return;
    if (dpre) {
        const float *d = dout, *wq = w;
        fp8_dgrad_operands(&d, &wq, N, C, OC);
        sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, d, OC, wq, C, 0.0f, dpre, 2 * C);
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float *g = pre + (size_t)n * 2 * C, *u = g + C;
            float *dg = dpre + (size_t)n * 2 * C, *du = dg + C;
            for (int j = 0; j < C; j++) swiglu_grads(g[j], u[j], dg[j], &dg[j], &du[j]);
        }
    }
    matmul_backward(NULL, dw, dbias, dout, inp, w, N, C, OC);
}

static void add(float *out, const float *a, const float *b, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// ----------------------------------------------------------------------------
// loss

/* probabilities of row x, in place; returns its loss for target t (0 for
 * CE_NO_TARGET) */
static float ce_row_forward(float *x, int V, int t) {
    float m = row_max(x, V);
    float xt = t == CE_NO_TARGET ? 0.0f : x[t];
    double s = row_exp_sum(x, V, m);
    float inv = (float)(1.0 / s);
    for (int j = 0; j < V; j++) x[j] *= inv;
    // log-sum-exp form: exact even when p[target] underflows to zero
    return t == CE_NO_TARGET ? 0.0f : (float)(log(s) - ((double)xt - m));
}

/* (p - onehot(t)) * dloss; a row without a target (CE_NO_TARGET) has no loss
 * and a zero gradient */
static void ce_row_backward(float *p, int V, int t, float dloss) {
    if (t == CE_NO_TARGET) {
        memset(p, 0, (size_t)V * sizeof(float));
        return;
    }
    p[t] -= 1.0f;
    for (int j = 0; j < V; j++) p[j] *= dloss;
}

static void ce_check_targets(const int *targets, int N, int V) {
    for (int n = 0; n < N; n++)
        if (targets[n] != CE_NO_TARGET && (targets[n] < 0 || targets[n] >= V))
            die(EXIT_INTERNAL, "crossentropy: target %d out of range [0, %d) (or CE_NO_TARGET)", targets[n], V);
}

static void crossentropy_forward(float *losses, float *logits, const int *targets, int N, int V) {
    ce_check_targets(targets, N, V);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) losses[n] = ce_row_forward(logits + (size_t)n * V, V, targets[n]);
}

static void crossentropy_backward(float *probs, const int *targets, float dloss, int N, int V) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) ce_row_backward(probs + (size_t)n * V, V, targets[n], dloss);
}

/* a row's backward right after its forward, while the row is in cache */
static void crossentropy_fused(float *losses, float *logits, const int *targets, float dloss, int N, int V) {
    ce_check_targets(targets, N, V);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        losses[n] = ce_row_forward(x, V, targets[n]);
        ce_row_backward(x, V, targets[n], dloss);
    }
}

static void crossentropy_vp_max(float *rowmax, const float *logits, int N, int V) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) rowmax[n] = row_max(logits + (size_t)n * V, V);
}

static void crossentropy_vp_expsum(float *sums, float *tgt, float *logits, const float *rowmax,
                                   const int *targets, int N, int V, int v0) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        int t = targets[n] - v0;
        tgt[n] = t >= 0 && t < V ? x[t] : 0.0f;
        sums[n] = (float)row_exp_sum(x, V, rowmax[n]);
    }
}

static void crossentropy_vp_finish(float *losses, float *logits, const float *rowmax, const float *sums,
                                   const float *tgt, const int *targets, int N, int V) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        float inv = (float)(1.0 / sums[n]);
        for (int j = 0; j < V; j++) x[j] *= inv;
        losses[n] = targets[n] == CE_NO_TARGET ? 0.0f : (float)(log((double)sums[n]) - ((double)tgt[n] - rowmax[n]));
    }
}

static void crossentropy_vp_backward(float *probs, const int *targets, float dloss, int N, int V, int v0) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * V;
        if (targets[n] == CE_NO_TARGET) {
            memset(p, 0, (size_t)V * sizeof(float));
            continue;
        }
        int t = targets[n] - v0;
        if (t >= 0 && t < V) p[t] -= 1.0f;
        for (int j = 0; j < V; j++) p[j] *= dloss;
    }
}

// ----------------------------------------------------------------------------
// reductions and optimizer

static double sumsq(const float *x, size_t n) {
    double s = 0.0;
    #pragma omp parallel for simd reduction(+:s) schedule(static)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

/* the CPU's calls are done when they return: nothing runs beside */
static void sumsq_queue(const float *x, size_t n, double *dst) { *dst = sumsq(x, n); }
static void sumsq_take(double *host, const double *dst, int n) { memcpy(host, dst, (size_t)n * sizeof *host); }

static double sum(const float *x, size_t n) {
    double s = 0.0;
    #pragma omp parallel for simd reduction(+:s) schedule(static)
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

static void scale(float *x, float s, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* sqrtf in a loop is only vectorised under -fno-math-errno (which cannot be
 * set per function), and a scalar sqrt makes adamw 5x slower, so the square
 * roots go through the vector instruction directly. */
static void sqrt_inplace(float *x, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

/* torch.optim.AdamW (single-tensor path), operation for operation:
 * p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps). */
#define ADAM_BLOCK 1024
#define ADAM_MAX_THREADS 256

/* One range; sq: returns the sum of squares of the updated p, each thread
 * summing its blocks (a static schedule: consecutive blocks) in order and
 * the threads' sums added in thread order, so the same bits every run at a
 * given thread count. */
static double adamw_range(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                          float beta2, float eps, float wd, int t, float grad_scale, int sq) {
    double bc1 = 1.0 - pow((double)beta1, t);
    double bc2 = 1.0 - pow((double)beta2, t);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - (double)lr * wd);
    const float ob1 = (float)(1.0 - (double)beta1), ob2 = (float)(1.0 - (double)beta2);
    long nblocks = (long)((n + ADAM_BLOCK - 1) / ADAM_BLOCK);
    double part[ADAM_MAX_THREADS] = {0};
    int nt = omp_get_max_threads();
    if (nt > ADAM_MAX_THREADS) nt = ADAM_MAX_THREADS;
    #pragma omp parallel num_threads(nt)
    {
        double s = 0.0;
        #pragma omp for schedule(static)
        for (long blk = 0; blk < nblocks; blk++) {
            size_t i0 = (size_t)blk * ADAM_BLOCK;
            int len = n - i0 < ADAM_BLOCK ? (int)(n - i0) : ADAM_BLOCK;
            float *pb = p + i0, *mb = m + i0, *vb = v + i0;
            const float *gb = g + i0;
            float den[ADAM_BLOCK];
            for (int i = 0; i < len; i++) {
                float gi = gb[i] * grad_scale;
                mb[i] = beta1 * mb[i] + ob1 * gi;
                vb[i] = beta2 * vb[i] + ob2 * gi * gi;
                den[i] = vb[i];
            }
            sqrt_inplace(den, len);
            for (int i = 0; i < len; i++)
                pb[i] = pb[i] * decay - step_size * (mb[i] / (den[i] / bc2_sqrt + eps));
            if (sq) {
                double bs = 0.0;
                #pragma omp simd reduction(+:bs)
                for (int i = 0; i < len; i++) bs += (double)pb[i] * pb[i];
                s += bs;
            }
        }
        part[omp_get_thread_num()] = s;
    }
    double total = 0.0;
    for (int i = 0; i < nt; i++) total += part[i];
    return total;
}

static void adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, int t, float grad_scale) {
    adamw_range(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, grad_scale, 0);
}

/* The CPU keeps no copies of the weights: returns 0. */
static int adamw_multi(float *p, const float *g, float *m, float *v, const AdamWRange *r, int nr, float lr,
                       float beta1, float beta2, float eps, int t, float grad_scale, double *sumsq) {
    double sq = 0.0;
    for (int i = 0; i < nr; i++)
        sq += adamw_range(p + r[i].offset, g + r[i].offset, m + r[i].offset, v + r[i].offset, r[i].n, lr, beta1,
                          beta2, eps, r[i].wd, t, grad_scale, sumsq && r[i].norm);
    if (sumsq) *sumsq = sq;
    return 0;
}

static void round_bf16(float *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        u = round_bf16_word(u, seed, index0 + i);
        memcpy(&dst[i], &u, 4);
    }
}

static void pack_bf16(uint16_t *dst, const float *src, size_t n, uint64_t seed, uint64_t index0) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        dst[i] = (uint16_t)(round_bf16_word(u, seed, index0 + i) >> 16);
    }
}

/* Word i widened; byte copies, as dst and src may share memory. */
static inline void unpack_one(float *dst, const uint16_t *src, size_t i) {
    uint16_t w;
    memcpy(&w, (const char *)src + 2 * i, 2);
    uint32_t u = (uint32_t)w << 16;
    memcpy((char *)dst + 4 * i, &u, 4);
}

static void unpack_range(float *dst, const uint16_t *src, size_t lo, size_t hi) {
#pragma omp parallel for schedule(static)
    for (size_t i = lo; i < hi; i++) unpack_one(dst, src, i);
}

/* In place (src == (uint16_t *)dst + n): with i words widened, element j
 * of the rest has its word at byte 2n + 2j; widening the next (n - i) / 2
 * writes below byte 2n + 2i, over words already read, so each such half
 * runs in parallel; the last few go one by one in ascending order (element
 * j overwrites words 2j - n and 2j - n + 1, both <= j: already read). */
static void unpack_bf16(float *dst, const uint16_t *src, size_t n) {
    size_t lo = 0;
    if (src == (const uint16_t *)(void *)dst + n) {
        while (n - lo > 4096) {
            size_t h = (n - lo) / 2;
            unpack_range(dst, src, lo, lo + h);
            lo += h;
        }
        for (; lo < n; lo++) unpack_one(dst, src, lo);
        return;
    }
    unpack_range(dst, src, 0, n);
}

// ----------------------------------------------------------------------------
// timing: every call is done when it returns, so a mark is the clock

static double cpu_marks[KERNEL_TIMER_SLOTS];

static void cpu_timer_mark(int slot) {
    if (slot < 0 || slot >= KERNEL_TIMER_SLOTS) die(EXIT_INTERNAL, "timer_mark: slot %d out of range", slot);
    cpu_marks[slot] = now_s();
}

static void cpu_timer_read(int n, double *ms) {
    if (n < 1 || n > KERNEL_TIMER_SLOTS) die(EXIT_INTERNAL, "timer_read: %d slots", n);
    for (int i = 0; i < n; i++) ms[i] = 1000.0 * (cpu_marks[i] - cpu_marks[0]);
}

// ----------------------------------------------------------------------------
// the table

static const Kernels cpu_kernels = {
    .name = "cpu",
    .act_bytes = 4,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .embed_forward_vp = embed_forward_vp,
    .embed_backward_vp = embed_backward_vp,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .add_layernorm_forward = add_layernorm_forward,
    .add_rmsnorm_forward = add_rmsnorm_forward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .matmul_forward_res = matmul_forward_res,
    .matmul_forward_a = matmul_forward_a,
    .matmul_backward_a = matmul_backward_a,
    .matmul_backward_dinp_a = matmul_backward_dinp_a,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .headnorm_forward = headnorm_forward,
    .headnorm_backward = headnorm_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .matmul_gelu_forward = matmul_gelu_forward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .matmul_gelu_backward = matmul_gelu_backward,
    .matmul_swiglu_backward = matmul_swiglu_backward,
    .add = add,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .crossentropy_fused = crossentropy_fused,
    .crossentropy_vp_max = crossentropy_vp_max,
    .crossentropy_vp_expsum = crossentropy_vp_expsum,
    .crossentropy_vp_finish = crossentropy_vp_finish,
    .crossentropy_vp_backward = crossentropy_vp_backward,
    .sumsq = sumsq,
    .sumsq_queue = sumsq_queue,
    .sumsq_take = sumsq_take,
    .sum = sum,
    .scale = scale,
    .adamw = adamw,
    .adamw_multi = adamw_multi,
    .round_bf16 = round_bf16,
    .pack_bf16 = pack_bf16,
    .unpack_bf16 = unpack_bf16,
    .weights_stable = cpu_weights_stable,
    .fp8_setup = fp8_setup,
    .fp8_scope = fp8_scope,
    .fp8_tp = fp8_tp,
    .fp8_cp = fp8_cp,
    .grads_fresh = cpu_grads_fresh,
    .grads_settle = cpu_grads_settle,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .offload_copy = cpu_offload_copy,
    .offload_mark = cpu_offload_mark,
    .offload_wait = cpu_offload_wait,
    .timer_mark = cpu_timer_mark,
    .timer_read = cpu_timer_read,
    .attention_part_forward = cpu_attention_part_forward,
    .attention_part_backward = cpu_attention_part_backward,
    .copy_2d = cpu_copy_2d,
    .moe_route = cpu_moe_route,
    .moe_route_backward = cpu_moe_route_backward,
    .moe_colsum = cpu_moe_colsum,
    .moe_permute = cpu_moe_permute,
    .moe_combine = cpu_moe_combine,
    .moe_combine_backward = cpu_moe_combine_backward,
    .moe_unpermute_add = cpu_moe_unpermute_add,
};

const Kernels *kernels_cpu(void) {
    blas_init();
    return &cpu_kernels;
}

// ----------------------------------------------------------------------------
// OpenBLAS core selection and speed

const char *kernels_cpu_blas_info(void) {
    static char info[160];
    blas_init();
    // openblas_get_config() is "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": keep name and version
    const char *cfg = openblas_get_config();
    int len = 0, words = 0;
    while (cfg[len] && !(cfg[len] == ' ' && ++words == 2)) len++;
    snprintf(info, sizeof info, "%.*s core %s, %d threads", len, cfg, openblas_get_corename(),
             omp_get_max_threads());
    return info;
}

/* OpenBLAS cores with AVX2/FMA or AVX-512 sgemm kernels. Anything else on a
 * CPU that has those instructions means DYNAMIC_ARCH did not recognise it and
 * fell back to an SSE-era kernel several times slower. */
static int blas_core_is_fast(const char *core) {
    static const char *fast[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++)
        if (strcasecmp(core, fast[i]) == 0) return 1;
    return 0;
}

/* OpenBLAS reads OPENBLAS_CORETYPE in a library constructor, before main, so
 * the only way to choose the core from inside the program is to set it and
 * exec ourselves again. LLMTRAIN_BLAS_REEXEC makes that happen at most once. */
void kernels_cpu_select_blas_core(char **argv) {
    if (!argv || !argv[0]) return;
    if (getenv("OPENBLAS_CORETYPE") || getenv("LLMTRAIN_BLAS_REEXEC")) return;
    const char *core = openblas_get_corename();
    if (core && blas_core_is_fast(core)) return;
    __builtin_cpu_init();
    const char *want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                     : NULL;
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("LLMTRAIN_BLAS_REEXEC", "1", 1);
    fflush(stdout);
    fflush(stderr);
    execv("/proc/self/exe", argv);
    // still here: exec failed, carry on with the slow core rather than stop
    warnf("could not re-exec to select OpenBLAS core %s (running with %s)", want,
          core ? core : "?");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kernels_cpu_sgemm_peak_gflops(int again) {
    static double cached = 0.0;
    if (cached > 0.0 && !again) return cached;
    blas_init();
    const int n = 1024;
    size_t nn = (size_t)n * n;
    float *a = malloc_check(nn * sizeof(float));
    float *b = malloc_check(nn * sizeof(float));
    float *c = malloc_check(nn * sizeof(float));
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 17) * 0.01f;
        b[i] = (float)(i % 13) * 0.01f;
    }
    // the shape of a linear layer (A B^T); warm up threads and caches first
    sgemm(CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    // the best of the repetitions: a noisy neighbour only ever slows a run down,
    // so the fastest one is the closest to what the cores can do
    enum { MAXREP = 32 };
    double rates[MAXREP];
    int reps = 0;
    double t_start = now_s();
    while (reps < MAXREP && (reps < 3 || now_s() - t_start < 0.25)) {
        double t0 = now_s();
        sgemm(CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = now_s() - t0;
        rates[reps++] = 2.0 * n * n * (double)n / (dt > 1e-9 ? dt : 1e-9) * 1e-9;
    }
    qsort(rates, (size_t)reps, sizeof rates[0], cmp_double);
    cached = rates[reps - 1];
    free(a);
    free(b);
    free(c);
    return cached;
}

int kernels_cpu_set_threads(int n, int ranks_on_node) {
    if (n <= 0) {
        const char *env = getenv("OMP_NUM_THREADS");
        if (env && *env) return omp_get_max_threads();
        int cores = omp_get_num_procs();
        n = cores / (ranks_on_node > 0 ? ranks_on_node : 1);
        if (n < 1) n = 1;
    }
    omp_set_num_threads(n);
    return n;
}
