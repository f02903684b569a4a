/* tests/test_kernels.c — checks every CPU kernel: forward against a naive
 * double-precision reference, backward against central finite differences
 * of L = sum(forward_output * R) for a fixed random R, and the "backward adds
 * into its outputs" convention (with its exceptions: the products' and
 * attention's input gradients are overwritten). Prints one line per check, then
 * "N passed, M failed"; exits non-zero when anything failed. */
#define _GNU_SOURCE
#include "fp8.h"
#include "kernels.h"
#include "util.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

static const Kernels *K;
static int npass, nfail;

// ----------------------------------------------------------------------------
// helpers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { // uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}
static int irand(int n) { return (int)((frand() * 0.5f + 0.5f) * n) % n; }

static float *randv(size_t n, float scale) {
    float *x = malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}
static float *zerov(size_t n) { return calloc_check(n, sizeof(float)); }
static float *dup(const float *x, size_t n) {
    float *y = malloc_check(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static void report(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %s ", ok ? "ok  " : "FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) npass++; else nfail++;
}

/* gradient vs finite differences: relative L2 error of the whole vector, and
 * the worst element against the largest gradient magnitude */
static void check_grad(const char *name, const float *a, const float *f, size_t n) {
    double num = 0, den = 0, maxabs = 0, maxf = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - f[i];
        num += d * d;
        den += (double)f[i] * f[i];
        if (fabs(d) > maxabs) maxabs = fabs(d);
        if (fabs(f[i]) > maxf) maxf = fabs(f[i]);
    }
    double rel = sqrt(num) / (sqrt(den) + 1e-30);
    int ok = isfinite(rel) && rel < 1e-2 && maxabs <= 1e-2 * maxf + 1e-4;
    report(ok, name, "rel_err=%.1e max_abs_err=%.1e", rel, maxabs);
}

/* forward output vs a double reference: worst error relative to the largest value */
static void check_close(const char *name, const float *got, const double *ref, size_t n,
                        double tol) {
    double maxabs = 0, maxr = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) finite = 0;
        double d = fabs(got[i] - ref[i]);
        if (d > maxabs) maxabs = d;
        if (fabs(ref[i]) > maxr) maxr = fabs(ref[i]);
    }
    double rel = maxabs / (maxr + 1e-30);
    report(finite && rel < tol, name, "rel_err=%.1e max_abs_err=%.1e", rel, maxabs);
}

/* backward must ADD: a second call on the same buffers doubles them (up to
 * rounding: sgemm with beta = 1 may round differently on a non-zero start) */
static void check_doubles(const char *name, const float *once, const float *twice, size_t n) {
    double maxd = 0, maxv = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)twice[i] - 2.0 * once[i]);
        if (d > maxd) maxd = d;
        if (fabs(once[i]) > maxv) maxv = fabs(once[i]);
    }
    report(maxv > 0 && maxd <= 1e-5 * maxv, name, "max_abs_err=%.1e (max %.1e)", maxd, maxv);
}

static double dot_r(const float *out, const float *R, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * R[i];
    return s;
}

/* central differences of loss() w.r.t. each of x[0..n) */
typedef double (*LossFn)(void *ctx);
static void fd_grad(LossFn loss, void *ctx, float *x, size_t n, float eps, float *g) {
    for (size_t i = 0; i < n; i++) {
        float orig = x[i];
        float xp = orig + eps, xm = orig - eps;
        x[i] = xp;
        double lp = loss(ctx);
        x[i] = xm;
        double lm = loss(ctx);
        x[i] = orig;
        g[i] = (float)((lp - lm) / ((double)xp - xm));
    }
}

// ----------------------------------------------------------------------------
// embeddings

typedef struct { float *out, *wte, *wpe, *R; int *tokens; const int *pos; int N, T, C; } EmbedCtx;
static double embed_loss(void *p) {
    EmbedCtx *c = p;
    K->embed_forward(c->out, c->tokens, c->pos, c->wte, c->wpe, c->N, c->T, c->C);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}

/* The rows' positions: pos NULL (n % T), or reset after token 3 as
 * train.reset_position_ids gives them (row 0: 1 [3] | 1 -> 0 1 0; row 1:
 * 0 [3] | [3] -> 0 1 0), so position 2 gets no gradient */
static const int EMBED_RESET_POS[6] = {0, 1, 0, 0, 1, 0};

static void test_embed_case(const char *tag, const int *pos) {
    int B = 2, T = 3, N = B * T, C = 8, V = 4;
    int tokens[6] = {1, 3, 1, 0, 3, 3}; // repeats: the scatter-add must sum them
    char name[96];
    EmbedCtx c = {zerov(N * C), randv(V * C, 1), randv(T * C, 1), randv(N * C, 1), tokens, pos, N, T, C};
    // forward vs reference, with and without wpe
    double *ref = malloc_check(sizeof(double) * N * C);
    K->embed_forward(c.out, tokens, pos, c.wte, c.wpe, N, T, C);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            ref[n * C + i] = (double)c.wte[tokens[n] * C + i] + c.wpe[(pos ? pos[n] : n % T) * C + i];
    snprintf(name, sizeof name, "embed_forward%s", tag);
    check_close(name, c.out, ref, N * C, 1e-6);
    K->embed_forward(c.out, tokens, pos, c.wte, NULL, N, T, C);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) ref[n * C + i] = c.wte[tokens[n] * C + i];
    snprintf(name, sizeof name, "embed_forward no-wpe%s", tag);
    check_close(name, c.out, ref, N * C, 1e-6);

    float *dwte = zerov(V * C), *dwpe = zerov(T * C), *fwte = zerov(V * C), *fwpe = zerov(T * C);
    K->embed_backward(dwte, dwpe, c.R, tokens, pos, N, T, C);
    fd_grad(embed_loss, &c, c.wte, V * C, 1e-2f, fwte);
    fd_grad(embed_loss, &c, c.wpe, T * C, 1e-2f, fwpe);
    snprintf(name, sizeof name, "embed_backward dwte%s", tag);
    check_grad(name, dwte, fwte, V * C);
    snprintf(name, sizeof name, "embed_backward dwpe%s", tag);
    check_grad(name, dwpe, fwpe, T * C);
    if (pos) { /* position 2 is no row's: its gradient stays 0, positions 0 and 1 take both rows' */
        int zero = 1;
        for (int i = 2 * C; i < 3 * C; i++) zero &= dwpe[i] == 0.0f;
        double want = (double)c.R[0] + c.R[2 * C] + c.R[3 * C] + c.R[5 * C]; /* channel 0 of the four position-0 rows */
        report(zero && fabs(dwpe[0] - want) < 1e-5, "embed_backward dwpe under reset positions",
               "(row 2 untouched %d; position 0 channel 0: %g, expected %g)", zero, dwpe[0], want);
    }
    float *once = dup(dwte, V * C);
    K->embed_backward(dwte, NULL, c.R, tokens, pos, N, T, C);
    snprintf(name, sizeof name, "embed_backward adds (dwpe NULL)%s", tag);
    check_doubles(name, once, dwte, V * C);
    free(ref); free(dwte); free(dwpe); free(fwte); free(fwpe); free(once);
    free(c.out); free(c.wte); free(c.wpe); free(c.R);
}

static void test_embed(void) {
    test_embed_case("", NULL);
    test_embed_case(" (positions reset at each document)", EMBED_RESET_POS);
}

/* vocab-parallel embedding: P slices of the vocabulary, summed as the TP
 * all-reduce would (wpe on slice 0 only), must equal the full lookup; each
 * slice's backward must equal its rows of the full backward */
static void test_embed_vp_case(const char *tag, const int *pos) {
    int B = 2, T = 3, N = B * T, C = 8, V = 6, P = 3, Vl = V / P;
    int tokens[6] = {1, 5, 1, 0, 3, 5};
    char name[96];
    float *wte = randv(V * C, 1), *wpe = randv(T * C, 1), *dout = randv(N * C, 1);
    float *full = zerov(N * C), *part = zerov(N * C), *sum = zerov(N * C);
    K->embed_forward(full, tokens, pos, wte, wpe, N, T, C);
    double *ref = malloc_check(sizeof(double) * N * C);
    for (int i = 0; i < N * C; i++) ref[i] = full[i];
    float *dfull = zerov(V * C), *dwpe = zerov(T * C), *dpart = zerov(V * C), *dwpe_p = zerov(T * C);
    K->embed_backward(dfull, dwpe, dout, tokens, pos, N, T, C);
    for (int r = 0; r < P; r++) {
        K->embed_forward_vp(part, tokens, pos, wte + (size_t)r * Vl * C, r == 0 ? wpe : NULL, N, T, C, r * Vl, Vl);
        for (int i = 0; i < N * C; i++) sum[i] += part[i];
        memset(dwpe_p, 0, sizeof(float) * T * C);
        K->embed_backward_vp(dpart + (size_t)r * Vl * C, dwpe_p, dout, tokens, pos, N, T, C, r * Vl, Vl);
        for (int i = 0; i < T * C; i++) dwpe_p[i] -= dwpe[i];
        int same = 1;
        for (int i = 0; i < T * C; i++) same &= fabsf(dwpe_p[i]) <= 1e-6f;
        report(same, "embed_backward_vp dwpe equals full", "(slice %d%s)", r, tag);
    }
    snprintf(name, sizeof name, "embed_forward_vp summed over slices%s", tag);
    check_close(name, sum, ref, N * C, 1e-6);
    double *dref = malloc_check(sizeof(double) * V * C);
    for (int i = 0; i < V * C; i++) dref[i] = dfull[i];
    snprintf(name, sizeof name, "embed_backward_vp slices = full dwte%s", tag);
    check_close(name, dpart, dref, V * C, 1e-6);
    free(wte); free(wpe); free(dout); free(full); free(part); free(sum); free(ref);
    free(dfull); free(dwpe); free(dpart); free(dwpe_p); free(dref);
}

static void test_embed_vp(void) {
    test_embed_vp_case("", NULL);
    test_embed_vp_case(", positions reset", EMBED_RESET_POS);
}

// ----------------------------------------------------------------------------
// norms

typedef struct { float *out, *mean, *rstd, *inp, *w, *b, *R; int N, C; } NormCtx;
static double layernorm_loss(void *p) {
    NormCtx *c = p;
    K->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5f);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}
static double rmsnorm_loss(void *p) {
    NormCtx *c = p;
    K->rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5f);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}

static void test_layernorm(void) {
    int N = 6, C = 8;
    NormCtx c = {zerov(N * C), zerov(N), zerov(N), randv(N * C, 2), randv(C, 1), randv(C, 1),
                 randv(N * C, 1), N, C};
    for (int i = 0; i < C; i++) c.inp[i] += 100.0f; // a row with a large mean
    double *ref = malloc_check(sizeof(double) * N * C);
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += c.inp[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (c.inp[n * C + i] - m) * (c.inp[n * C + i] - m);
        double rs = 1.0 / sqrt(v / C + 1e-5);
        for (int i = 0; i < C; i++) ref[n * C + i] = (c.inp[n * C + i] - m) * rs * c.w[i] + c.b[i];
    }
    layernorm_loss(&c);
    check_close("layernorm_forward", c.out, ref, N * C, 1e-5);
    // back to O(1) inputs: at |x| ~ 100 float finite differences are mostly noise
    for (int i = 0; i < C; i++) c.inp[i] -= 100.0f;

    float *dinp = zerov(N * C), *dw = zerov(C), *db = zerov(C);
    float *finp = zerov(N * C), *fw = zerov(C), *fb = zerov(C);
    layernorm_loss(&c);
    K->layernorm_backward(dinp, NULL, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    fd_grad(layernorm_loss, &c, c.inp, N * C, 1e-3f, finp);
    fd_grad(layernorm_loss, &c, c.w, C, 1e-3f, fw);
    fd_grad(layernorm_loss, &c, c.b, C, 1e-3f, fb);
    layernorm_loss(&c);
    check_grad("layernorm_backward dinp", dinp, finp, N * C);
    check_grad("layernorm_backward dw", dw, fw, C);
    check_grad("layernorm_backward db", db, fb, C);
    float *o1 = dup(dinp, N * C), *o2 = dup(dw, C), *o3 = dup(db, C), *da = randv(N * C, 5);
    K->layernorm_backward(dinp, da, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    check_doubles("layernorm_backward adds dinp", o1, dinp, N * C);
    report(memcmp(da, dinp, (size_t)N * C * sizeof(float)) == 0, "layernorm_backward dinp_a = dinp after the add",
           "fp32 [a]");
    check_doubles("layernorm_backward adds dw", o2, dw, C);
    check_doubles("layernorm_backward adds db", o3, db, C);
    // NULL outputs are skipped, the others still accumulate
    memcpy(dw, o2, C * sizeof(float));
    K->layernorm_backward(NULL, NULL, dw, NULL, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    check_doubles("layernorm_backward NULL dinp/db", o2, dw, C);
    free(ref); free(dinp); free(dw); free(db); free(finp); free(fw); free(fb);
    free(o1); free(o2); free(o3); free(da);
    free(c.out); free(c.mean); free(c.rstd); free(c.inp); free(c.w); free(c.b); free(c.R);
}

static void test_rmsnorm(void) {
    int N = 6, C = 8;
    NormCtx c = {zerov(N * C), NULL, zerov(N), randv(N * C, 2), randv(C, 1), NULL,
                 randv(N * C, 1), N, C};
    double *ref = malloc_check(sizeof(double) * N * C);
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)c.inp[n * C + i] * c.inp[n * C + i];
        double rs = 1.0 / sqrt(ss / C + 1e-5);
        for (int i = 0; i < C; i++) ref[n * C + i] = c.inp[n * C + i] * rs * c.w[i];
    }
    rmsnorm_loss(&c);
    check_close("rmsnorm_forward", c.out, ref, N * C, 1e-5);

    float *dinp = zerov(N * C), *dw = zerov(C), *finp = zerov(N * C), *fw = zerov(C);
    K->rmsnorm_backward(dinp, NULL, dw, c.R, c.inp, c.w, c.rstd, N, C);
    fd_grad(rmsnorm_loss, &c, c.inp, N * C, 1e-3f, finp);
    fd_grad(rmsnorm_loss, &c, c.w, C, 1e-3f, fw);
    rmsnorm_loss(&c);
    check_grad("rmsnorm_backward dinp", dinp, finp, N * C);
    check_grad("rmsnorm_backward dw", dw, fw, C);
    float *o1 = dup(dinp, N * C), *da = randv(N * C, 5);
    K->rmsnorm_backward(dinp, da, NULL, c.R, c.inp, c.w, c.rstd, N, C);
    check_doubles("rmsnorm_backward adds dinp (dw NULL)", o1, dinp, N * C);
    report(memcmp(da, dinp, (size_t)N * C * sizeof(float)) == 0, "rmsnorm_backward dinp_a = dinp after the add",
           "fp32 [a]");
    free(ref); free(dinp); free(dw); free(finp); free(fw); free(o1); free(da);
    free(c.out); free(c.rstd); free(c.inp); free(c.w); free(c.R);
}

// ----------------------------------------------------------------------------
// matmul

typedef struct { float *out, *inp, *w, *bias, *R; int N, C, OC; } MatmulCtx;
static double matmul_loss(void *p) {
    MatmulCtx *c = p;
    K->matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
    return dot_r(c->out, c->R, (size_t)c->N * c->OC);
}

static void test_matmul(void) {
    int N = 6, C = 8, OC = 5;
    MatmulCtx c = {zerov(N * OC), randv(N * C, 1), randv(OC * C, 1), randv(OC, 1),
                   randv(N * OC, 1), N, C, OC};
    double *ref = malloc_check(sizeof(double) * N * OC);
    for (int pass = 0; pass < 2; pass++) {
        const float *bias = pass == 0 ? c.bias : NULL;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double s = bias ? bias[o] : 0.0;
                for (int i = 0; i < C; i++) s += (double)c.inp[n * C + i] * c.w[o * C + i];
                ref[n * OC + o] = s;
            }
        K->matmul_forward(c.out, c.inp, c.w, bias, N, C, OC);
        check_close(pass == 0 ? "matmul_forward bias" : "matmul_forward no-bias", c.out, ref,
                    N * OC, 1e-5);
    }
    float *dinp = zerov(N * C), *dw = zerov(OC * C), *db = zerov(OC);
    float *finp = zerov(N * C), *fw = zerov(OC * C), *fb = zerov(OC);
    K->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, C, OC);
    fd_grad(matmul_loss, &c, c.inp, N * C, 1e-2f, finp);
    fd_grad(matmul_loss, &c, c.w, OC * C, 1e-2f, fw);
    fd_grad(matmul_loss, &c, c.bias, OC, 1e-2f, fb);
    check_grad("matmul_backward dinp", dinp, finp, N * C);
    check_grad("matmul_backward dweight", dw, fw, OC * C);
    check_grad("matmul_backward dbias", db, fb, OC);
    float *o1 = dup(dinp, N * C), *o2 = dup(dw, OC * C), *o3 = dup(db, OC);
    K->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, C, OC);
    /* dinp is overwritten (the first call's, exactly), the others added into */
    report(memcmp(dinp, o1, (size_t)N * C * sizeof(float)) == 0, "matmul_backward overwrites dinp", "%s",
           memcmp(dinp, o1, (size_t)N * C * sizeof(float)) ? "(differs from one call's)" : "(one call's, bit for bit)");
    check_doubles("matmul_backward adds dweight", o2, dw, OC * C);
    check_doubles("matmul_backward adds dbias", o3, db, OC);
    memcpy(dw, o2, OC * C * sizeof(float));
    K->matmul_backward(NULL, dw, NULL, c.R, c.inp, c.w, N, C, OC);
    check_doubles("matmul_backward NULL dinp/dbias", o2, dw, OC * C);
    free(ref); free(dinp); free(dw); free(db); free(finp); free(fw); free(fb);
    free(o1); free(o2); free(o3);
    free(c.out); free(c.inp); free(c.w); free(c.bias); free(c.R);
}

/* sizes big enough for the threaded sgemm path (sliced along M or N),
 * against double-precision reference products */
static void test_matmul_large(int N, int C, int OC) {
    char name[96];
    float *inp = randv((size_t)N * C, 1), *w = randv((size_t)OC * C, 1), *bias = randv(OC, 1);
    float *out = zerov((size_t)N * OC), *dout = randv((size_t)N * OC, 1);
    float *dinp = randv((size_t)N * C, 1), *dw = randv((size_t)OC * C, 1), *db = randv(OC, 1);
    double *ro = malloc_check(sizeof(double) * N * OC), *ri = malloc_check(sizeof(double) * N * C);
    double *rw = malloc_check(sizeof(double) * OC * C), *rb = malloc_check(sizeof(double) * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias[o];
            for (int i = 0; i < C; i++) acc += (double)inp[n * C + i] * w[o * C + i];
            ro[n * OC + o] = acc;
        }
    // the gradients start non-zero: backward adds, except into dinp (overwritten)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            double acc = 0;
            for (int o = 0; o < OC; o++) acc += (double)dout[n * OC + o] * w[o * C + i];
            ri[n * C + i] = acc;
        }
    for (int o = 0; o < OC; o++) {
        double accb = db[o];
        for (int n = 0; n < N; n++) accb += dout[n * OC + o];
        rb[o] = accb;
        for (int i = 0; i < C; i++) {
            double acc = dw[o * C + i];
            for (int n = 0; n < N; n++) acc += (double)dout[n * OC + o] * inp[n * C + i];
            rw[o * C + i] = acc;
        }
    }
    K->matmul_forward(out, inp, w, bias, N, C, OC);
    K->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    snprintf(name, sizeof name, "matmul_forward N=%d C=%d OC=%d", N, C, OC);
    check_close(name, out, ro, (size_t)N * OC, 1e-5);
    snprintf(name, sizeof name, "matmul_backward dinp N=%d C=%d OC=%d", N, C, OC);
    check_close(name, dinp, ri, (size_t)N * C, 1e-5);
    snprintf(name, sizeof name, "matmul_backward dweight N=%d C=%d OC=%d", N, C, OC);
    check_close(name, dw, rw, (size_t)OC * C, 1e-5);
    snprintf(name, sizeof name, "matmul_backward dbias N=%d C=%d OC=%d", N, C, OC);
    check_close(name, db, rb, OC, 1e-5);
    free(inp); free(w); free(bias); free(out); free(dout); free(dinp); free(dw); free(db);
    free(ro); free(ri); free(rw); free(rb);
}

// ----------------------------------------------------------------------------
// attention

typedef struct { float *out, *lse, *qkv, *R; const int *qs; int B, T, nh, nkv, hd; } AttnCtx;
static double attn_loss(void *p) {
    AttnCtx *c = p;
    K->attention_forward(c->out, c->lse, c->qkv, c->qs, c->B, c->T, c->nh, c->nkv, c->hd);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->nh * c->hd);
}

/* naive attention in double: out and each row's log-sum-exp; row t of
 * sequence b attends to [qs[b*T + t], t] (qs NULL: [0, t]) */
static void attn_ref(double *out, double *lse, const float *qkv, const int *qs, int B, int T, int nh, int nkv,
                     int hd) {
    int S = (nh + 2 * nkv) * hd;
    double *s = malloc_check(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * S + h * hd;
                const int u0 = qs ? qs[b * T + t] : 0;
                double m = -INFINITY, z = 0;
                for (int u = u0; u <= t; u++) {
                    const float *k = qkv + ((size_t)b * T + u) * S + (nh + kh) * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)q[i] * k[i];
                    s[u] = d / sqrt((double)hd);
                    if (s[u] > m) m = s[u];
                }
                for (int u = u0; u <= t; u++) { s[u] = exp(s[u] - m); z += s[u]; }
                lse[((size_t)b * nh + h) * T + t] = m + log(z);
                double *o = out + ((size_t)b * T + t) * nh * hd + h * hd;
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int u = u0; u <= t; u++)
                        acc += s[u] / z * qkv[((size_t)b * T + u) * S + (nh + nkv + kh) * hd + i];
                    o[i] = acc;
                }
            }
        }
    free(s);
}

/* Documents of random lengths 1..maxlen packed into B rows of T: qs[b*T +
 * t] = the first position of t's document (the block-causal mask's qstart;
 * model.c derives it from the eod tokens the same way) */
static int *random_docs(int B, int T, int maxlen) {
    int *qs = malloc_check(sizeof(int) * (size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, s = 0, end = 1 + irand(maxlen); t < T; t++) {
            if (t == end) s = t, end = t + 1 + irand(maxlen);
            qs[b * T + t] = s;
        }
    return qs;
}

/* nsub > 0: finite differences only at nsub random qkv entries (large T);
 * doclen > 0: a block-causal mask of random documents up to doclen long */
static void test_attention(int B, int T, int nh, int nkv, int hd, int nsub, int doclen) {
    char name[192], shape[64];
    size_t nqkv = (size_t)B * T * (nh + 2 * nkv) * hd, nout = (size_t)B * T * nh * hd;
    size_t nlse = (size_t)B * nh * T;
    int *qs = doclen ? random_docs(B, T, doclen) : NULL;
    AttnCtx c = {zerov(nout), zerov(nlse), randv(nqkv, 1.5f), randv(nout, 1), qs, B, T, nh, nkv, hd};
    snprintf(shape, sizeof shape, "T=%d nh=%d nkv=%d%s", T, nh, nkv, doclen ? " block-causal" : "");
    double *rout = malloc_check(sizeof(double) * nout), *rlse = malloc_check(sizeof(double) * nlse);
    attn_ref(rout, rlse, c.qkv, qs, B, T, nh, nkv, hd);
    attn_loss(&c);
    snprintf(name, sizeof name, "attention_forward out %s", shape);
    check_close(name, c.out, rout, nout, 1e-5);
    snprintf(name, sizeof name, "attention_forward lse %s", shape);
    check_close(name, c.lse, rlse, nlse, 1e-5);
    if (qs) { /* the mask did something: plain causal attention gives other outputs */
        float *causal = zerov(nout), *clse = zerov(nlse);
        K->attention_forward(causal, clse, c.qkv, NULL, B, T, nh, nkv, hd);
        double diff = 0;
        for (size_t i = 0; i < nout; i++) diff = fmax(diff, fabs((double)causal[i] - c.out[i]));
        snprintf(name, sizeof name, "attention_forward %s differs from causal", shape);
        report(diff > 1e-2, name, "(max |difference| %.3g)", diff);
        free(causal); free(clse);
    }

    float *dqkv = zerov(nqkv);
    K->attention_backward(dqkv, c.R, c.qkv, c.out, c.lse, qs, B, T, nh, nkv, hd);
    float *fd = zerov(nqkv);
    if (nsub == 0) {
        fd_grad(attn_loss, &c, c.qkv, nqkv, 1e-3f, fd);
        snprintf(name, sizeof name, "attention_backward dqkv %s", shape);
        check_grad(name, dqkv, fd, nqkv);
    } else {
        float *a = zerov(nsub);
        for (int j = 0; j < nsub; j++) {
            size_t i = (size_t)irand((int)nqkv);
            fd_grad(attn_loss, &c, c.qkv + i, 1, 1e-2f, fd + j);
            a[j] = dqkv[i];
        }
        snprintf(name, sizeof name, "attention_backward dqkv %s (%d entries)", shape, nsub);
        check_grad(name, a, fd, nsub);
        free(a);
    }
    attn_loss(&c);
    float *once = dup(dqkv, nqkv);
    K->attention_backward(dqkv, c.R, c.qkv, c.out, c.lse, qs, B, T, nh, nkv, hd);
    snprintf(name, sizeof name, "attention_backward overwrites %s", shape);
    report(memcmp(once, dqkv, nqkv * sizeof(float)) == 0, name, "%s",
           memcmp(once, dqkv, nqkv * sizeof(float)) ? "(differs from one call's)" : "(one call's, bit for bit)");
    free(rout); free(rlse); free(dqkv); free(fd); free(once); free(qs);
    free(c.out); free(c.lse); free(c.qkv); free(c.R);
}

/* Context parallelism's attention parts: a sequence of T = 2 cp Tc rows cut
 * into 2 cp chunks, "rank" r holding chunks r and 2cp-1-r (cp.c's order);
 * each rank's queries attend to every rank's key/value block a segment pair
 * at a time (pairs wholly in the future skipped, the blocks visited in ring
 * order r, r-1, ...), merged by attention_part_forward, must give
 * attention_forward's out and lse on the whole sequence; the part backwards
 * (dQ per rank, dK/dV per block) its dqkv. */
static void cp_rows(int cp, int Tc, int r, int *g) { /* local row -> position */
    for (int i = 0; i < 2 * Tc; i++) g[i] = (i < Tc ? r : 2 * cp - 1 - r) * Tc + i % Tc;
}

static void test_attention_parts(int B, int cp, int Tc, int nh, int nkv, int hd, int doclen) {
    char name[192], shape[96];
    const int T = 2 * cp * Tc, Tl = 2 * Tc, S = (nh + 2 * nkv) * hd, KS = 2 * nkv * hd, OS = nh * hd;
    size_t nqkv = (size_t)B * T * S, nout = (size_t)B * T * OS, nlse = (size_t)B * nh * T;
    int *qs = doclen ? random_docs(B, T, doclen) : NULL;
    float *qkv = randv(nqkv, 1.5f), *dout = randv(nout, 1), *out = zerov(nout), *lse = zerov(nlse), *dqkv = zerov(nqkv);
    K->attention_forward(out, lse, qkv, qs, B, T, nh, nkv, hd);
    K->attention_backward(dqkv, dout, qkv, out, lse, qs, B, T, nh, nkv, hd);
    /* every rank's local rows and packed k|v block */
    float *lq = zerov((size_t)cp * B * Tl * S), *lkv = zerov((size_t)cp * B * Tl * KS), *ldkv = zerov((size_t)cp * B * Tl * KS);
    float *lo = zerov((size_t)cp * B * Tl * OS), *ll = zerov((size_t)cp * B * nh * Tl), *ldo = zerov((size_t)cp * B * Tl * OS);
    float *ldq = zerov((size_t)cp * B * Tl * S);
    int *lqs = malloc_check(sizeof(int) * (size_t)cp * B * Tl), g[4096];
    for (int r = 0; r < cp; r++) {
        cp_rows(cp, Tc, r, g);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                size_t src = (size_t)b * T + g[i], dst = ((size_t)r * B + b) * Tl + i;
                memcpy(lq + dst * S, qkv + src * S, sizeof(float) * S);
                memcpy(lkv + dst * KS, qkv + src * S + nh * hd, sizeof(float) * KS);
                memcpy(ldo + dst * OS, dout + src * OS, sizeof(float) * OS);
                lqs[dst] = qs ? qs[src] : 0;
            }
    }
    for (int r = 0; r < cp; r++) { /* the forward's ring, then the backward's */
        size_t off = (size_t)r * B * Tl;
        int init[2] = {0, 0};
        for (int pass = 0; pass < 2; pass++)
            for (int s = 0; s < cp; s++)
                for (int pair = 0, j = (r - s + cp) % cp; pair < 4; pair++) {
                    int a = pair / 2, qc = a ? 2 * cp - 1 - r : r, kc = pair % 2 ? 2 * cp - 1 - j : j;
                    float *kvj = lkv + (size_t)j * B * Tl * KS, *lr = ll + (size_t)r * B * nh * Tl;
                    if (kc > qc) continue;
                    if (pass == 0)
                        K->attention_part_forward(lo + off * OS, lr, lq + off * S, a * Tc, qc * Tc, Tc, kvj, pair % 2 * Tc,
                                                  kc * Tc, Tc, qs ? lqs + off : NULL, B, Tl, Tl, nh, nkv, hd, init[a]);
                    else
                        K->attention_part_backward(ldq + off * S, ldkv + (size_t)j * B * Tl * KS, ldo + off * OS,
                                                   lq + off * S, lo + off * OS, lr, a * Tc, qc * Tc, Tc, kvj, pair % 2 * Tc,
                                                   kc * Tc, Tc, qs ? lqs + off : NULL, B, Tl, Tl, nh, nkv, hd);
                    init[a] = 1;
                }
    }
    /* back to sequence order, against the whole-sequence kernels */
    float *go = zerov(nout), *gl = zerov(nlse), *gd = zerov(nqkv);
    for (int r = 0; r < cp; r++) {
        cp_rows(cp, Tc, r, g);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                size_t dst = (size_t)b * T + g[i], src = ((size_t)r * B + b) * Tl + i;
                memcpy(go + dst * OS, lo + src * OS, sizeof(float) * OS);
                memcpy(gd + dst * S, ldq + src * S, sizeof(float) * nh * hd);
                memcpy(gd + dst * S + nh * hd, ldkv + src * KS, sizeof(float) * KS);
                for (int h = 0; h < nh; h++) gl[((size_t)b * nh + h) * T + g[i]] = ll[(((size_t)r * B + b) * nh + h) * Tl + i];
            }
    }
    snprintf(shape, sizeof shape, "cp=%d Tc=%d nh=%d nkv=%d%s", cp, Tc, nh, nkv, doclen ? " block-causal" : "");
    double *ref = malloc_check(sizeof(double) * nqkv);
    for (size_t i = 0; i < nout; i++) ref[i] = out[i];
    snprintf(name, sizeof name, "attention_part_forward out %s", shape);
    check_close(name, go, ref, nout, 1e-5);
    for (size_t i = 0; i < nlse; i++) ref[i] = lse[i];
    snprintf(name, sizeof name, "attention_part_forward lse %s", shape);
    check_close(name, gl, ref, nlse, 1e-5);
    for (size_t i = 0; i < nqkv; i++) ref[i] = dqkv[i];
    snprintf(name, sizeof name, "attention_part_backward dqkv %s", shape);
    check_close(name, gd, ref, nqkv, 1e-4);
    free(ref); free(go); free(gl); free(gd); free(lq); free(lkv); free(ldkv); free(lo); free(ll); free(ldo); free(ldq);
    free(lqs); free(qkv); free(dout); free(out); free(lse); free(dqkv); free(qs);
}

// ----------------------------------------------------------------------------
// rope

typedef struct { float *x, *tmp, *R; int B, T, nh, nkv, hd; const int *pos; const Rope *rope; } RopeCtx;
static double rope_loss(void *p) {
    RopeCtx *c = p;
    size_t n = (size_t)c->B * c->T * (c->nh + 2 * c->nkv) * c->hd;
    memcpy(c->tmp, c->x, n * sizeof(float));
    K->rope_forward(c->tmp, c->pos, c->B, c->T, c->nh, c->nkv, c->hd, c->rope);
    return dot_r(c->tmp, c->R, n);
}

/* YaRN's index at which a frequency turns rot times over the context ctx
 * (Hugging Face's find_correction_dim) */
static double yarn_correction_dim(double rot, int hd, double theta, double ctx) {
    return hd * log(ctx / (rot * 2 * M_PI)) / (2 * log(theta));
}

/* The frequencies as Hugging Face's _compute_llama3_parameters (two
 * torch.where passes) and _compute_yarn_parameters (interpolation and
 * extrapolation mixed by 1 - ramp) write them, not as kernels.h does; *band
 * counts which of kept (0), blended (1) and divided (2) frequency i falls in. */
static double ref_inv_freq(const Rope *r, int i, int hd, int *band) {
    double inv = 1.0 / pow((double)r->theta, (double)(2 * i) / hd);
    if (r->scaling == ROPE_YARN) {
        double low = yarn_correction_dim(r->beta_fast, hd, r->theta, r->original_max_seq_len);
        double high = yarn_correction_dim(r->beta_slow, hd, r->theta, r->original_max_seq_len);
        if (r->truncate) { low = floor(low); high = ceil(high); }
        low = fmax(low, 0); high = fmin(high, hd - 1);
        if (low == high) high += 0.001;
        double ramp = fmin(fmax((i - low) / (high - low), 0), 1), extra = 1 - ramp;
        band[extra == 1 ? 0 : extra == 0 ? 2 : 1]++;
        return inv / r->factor * (1 - extra) + inv * extra;
    }
    if (r->scaling != ROPE_LLAMA3) { band[0]++; return inv; }
    double wavelen = 2 * M_PI / inv, old = r->original_max_seq_len;
    double low_wavelen = old / r->low_freq_factor, high_wavelen = old / r->high_freq_factor;
    double llama = wavelen > low_wavelen ? inv / r->factor : inv;
    double smooth = (old / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    double smoothed = (1 - smooth) * llama / r->factor + smooth * llama;
    int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    band[medium ? 1 : wavelen > low_wavelen ? 2 : 0]++;
    return medium ? smoothed : llama;
}

/* pos: each row's position (NULL: n % T) */
static void test_rope_case(const char *tag, int hd, const Rope *rope, const int *pos) {
    int B = 2, T = 5, nh = 4, nkv = 2, S = (nh + 2 * nkv) * hd, half = hd / 2;
    size_t n = (size_t)B * T * S;
    char name[160];
    RopeCtx c = {randv(n, 1), zerov(n), randv(n, 1), B, T, nh, nkv, hd, pos, rope};
    double *ref = malloc_check(sizeof(double) * n), inv[64];
    int band[3] = {0, 0, 0};
    for (int i = 0; i < half; i++) inv[i] = ref_inv_freq(rope, i, hd, band);
    /* YaRN's factor on cos and sin: its attention_factor, or 0.1 ln(factor) + 1 */
    double m = rope->scaling != ROPE_YARN ? 1 : rope->attention_factor > 0 ? rope->attention_factor
                                                                           : 0.1 * log(rope->factor) + 1;
    if (rope->scaling == ROPE_LLAMA3 || rope->scaling == ROPE_YARN) {
        snprintf(name, sizeof name, "rope %s: the frequencies fall in all three bands (kept %d, blended %d, divided %d)", tag,
                 band[0], band[1], band[2]);
        report(band[0] > 0 && band[1] > 0 && band[2] > 0, name, "%s", "");
    }
    for (int r = 0; r < B * T; r++)
        for (int hh = 0; hh < nh + 2 * nkv; hh++) {
            const float *x = c.x + (size_t)r * S + hh * hd;
            double *o = ref + (size_t)r * S + hh * hd;
            for (int i = 0; i < half; i++) {
                if (hh >= nh + nkv) { o[i] = x[i]; o[i + half] = x[i + half]; continue; }
                double at = pos ? pos[r] : r % T;
                if (rope->scaling == ROPE_LINEAR) at /= rope->factor; /* position interpolation */
                double ang = at * inv[i];
                o[i] = m * (x[i] * cos(ang) - x[i + half] * sin(ang));
                o[i + half] = m * (x[i + half] * cos(ang) + x[i] * sin(ang));
            }
        }
    rope_loss(&c);
    snprintf(name, sizeof name, "rope_forward %s", tag);
    check_close(name, c.tmp, ref, n, 1e-5);

    // forward then backward is the identity (the rotation is orthogonal),
    // times m^2 on the q and k heads under YaRN
    K->rope_backward(c.tmp, pos, B, T, nh, nkv, hd, rope);
    for (size_t i = 0; i < n; i++) ref[i] = (int)(i % S) < (nh + nkv) * hd ? m * m * c.x[i] : c.x[i];
    snprintf(name, sizeof name, "rope_forward+backward identity%s %s", m != 1 ? " x m^2" : "", tag);
    check_close(name, c.tmp, ref, n, 1e-5);

    float *g = dup(c.R, n), *fd = zerov(n);
    K->rope_backward(g, pos, B, T, nh, nkv, hd, rope);
    fd_grad(rope_loss, &c, c.x, n, 1e-2f, fd);
    snprintf(name, sizeof name, "rope_backward dqkv %s", tag);
    check_grad(name, g, fd, n);
    free(ref); free(g); free(fd); free(c.x); free(c.tmp); free(c.R);
}

static void test_rope(void) {
    /* positions from an array: reset at documents (row 0), and large ones
     * whose angles reach thousands of radians (row 1) */
    static const int pos[10] = {0, 1, 2, 0, 1, 3000, 3001, 0, 1, 2};
    Rope plain = {.theta = 10000.0f, .scaling = ROPE_NONE};
    test_rope_case("(theta 1e4)", 8, &plain, NULL);
    test_rope_case("(theta 1e4, positions from an array)", 8, &plain, pos);
    /* Llama 3's scaling with a short original context, so that the 8
     * frequencies of hd 16 at theta 5e5 reach every band: wavelengths
     * 6.3 and 32 kept (below 256 / 4), 159 blended, 803 and up divided */
    Rope llama3 = {.theta = 500000.0f, .scaling = ROPE_LLAMA3, .factor = 32.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_max_seq_len = 256};
    test_rope_case("(llama3 scaling)", 16, &llama3, NULL);
    test_rope_case("(llama3 scaling, positions from an array)", 16, &llama3, pos);
    /* the CPU keeps its cos/sin table while the RoPE and head dim stay: a
     * RoPE that differs only in its frequencies must not read llama3's */
    test_rope_case("(theta 1e4 at head dim 16, right after llama3's)", 16, &plain, NULL);
    /* linear scaling (position interpolation), against positions divided by its factor */
    Rope linear = {.theta = 10000.0f, .scaling = ROPE_LINEAR, .factor = 4.0f};
    test_rope_case("(linear scaling by 4)", 8, &linear, NULL);
    test_rope_case("(linear scaling by 4, positions from an array)", 8, &linear, pos);
    /* YaRN over an original context of 256 at theta 1e4: hd 16's 8
     * frequencies have lo = floor(0.21) = 0 and hi = ceil(3.2) = 4, so
     * index 0 is kept, 1 to 3 blended and 4 to 7 divided; its attention
     * factor by default (0.1 ln 4 + 1), then given, then with betas 16
     * and 2 and the ends not rounded (lo 0.81, hi 2.62: 0 kept, 1 and 2
     * blended, 3 to 7 divided) */
    Rope yarn = {.theta = 10000.0f, .scaling = ROPE_YARN, .factor = 4.0f, .original_max_seq_len = 256, .beta_fast = 32.0f, .beta_slow = 1.0f, .truncate = 1};
    test_rope_case("(yarn by 4)", 16, &yarn, NULL);
    test_rope_case("(yarn by 4, positions from an array)", 16, &yarn, pos);
    Rope yarn_af = yarn, yarn_nt = yarn;
    yarn_af.attention_factor = 0.7f;
    test_rope_case("(yarn by 4, attention factor 0.7)", 16, &yarn_af, pos);
    yarn_nt.truncate = 0;
    yarn_nt.beta_fast = 16.0f;
    yarn_nt.beta_slow = 2.0f;
    test_rope_case("(yarn by 4, untruncated, betas 16/2)", 16, &yarn_nt, NULL);
}

// ----------------------------------------------------------------------------
// pointwise

typedef struct { float *out, *inp, *R; size_t n; int N, F; } PwCtx;
static double gelu_loss(void *p) {
    PwCtx *c = p;
    K->gelu_forward(c->out, c->inp, c->n);
    return dot_r(c->out, c->R, c->n);
}
static double swiglu_loss(void *p) {
    PwCtx *c = p;
    K->swiglu_forward(c->out, c->inp, c->N, c->F);
    return dot_r(c->out, c->R, (size_t)c->N * c->F);
}

static void test_gelu(void) {
    size_t n = 97;
    PwCtx c = {zerov(n), randv(n, 5), randv(n, 1), n, 0, 0};
    c.inp[0] = -30.0f; c.inp[1] = 30.0f; c.inp[2] = 0.0f; c.inp[3] = 1e-6f;
    double *ref = malloc_check(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) {
        double x = c.inp[i];
        ref[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    gelu_loss(&c);
    check_close("gelu_forward", c.out, ref, n, 1e-5);
    float *d = zerov(n), *fd = zerov(n);
    K->gelu_backward(d, c.inp, c.R, n);
    fd_grad(gelu_loss, &c, c.inp, n, 1e-3f, fd);
    check_grad("gelu_backward dinp", d, fd, n);
    float *once = dup(d, n);
    K->gelu_backward(d, c.inp, c.R, n);
    check_doubles("gelu_backward adds", once, d, n);
    free(ref); free(d); free(fd); free(once); free(c.out); free(c.inp); free(c.R);
}

/* The fused forwards are their parts, bit for bit (so the CPU trains
 * exactly as before each fused entry): matmul_gelu_forward is
 * matmul_forward then gelu_forward (GPT-2's MLP), matmul_forward_res is
 * matmul_forward then add(res, product) (the output projections, which
 * write the residual stream; out starts as garbage). Small shapes (one
 * sgemm) and large ones (sgemm sliced over the threads), with and without
 * a bias */
static void test_matmul_fused(int N, int C, int OC, int with_bias) {
    float *inp = randv((size_t)N * C, 2), *w = randv((size_t)OC * C, 0.5f), *bias = with_bias ? randv(OC, 1) : NULL;
    size_t n = (size_t)N * OC;
    float *pre = randv(n, 1), *out = randv(n, 1), *pre2 = zerov(n), *out2 = zerov(n), *res = randv(n, 3);
    K->matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC);
    K->matmul_forward(pre2, inp, w, bias, N, C, OC);
    K->gelu_forward(out2, pre2, n);
    char name[96];
    snprintf(name, sizeof name, "matmul_gelu_forward %dx%dx%d%s", N, C, OC, with_bias ? " +bias" : "");
    int same = memcmp(pre, pre2, n * sizeof(float)) == 0 && memcmp(out, out2, n * sizeof(float)) == 0;
    report(same, name, "%s", same ? "pre and out bit-identical to matmul_forward + gelu_forward" : "differs from matmul_forward + gelu_forward");
    /* pre2 is the product; out is garbage again */
    for (size_t i = 0; i < n; i++) out[i] = 100.0f;
    K->matmul_forward_res(out, res, inp, w, bias, N, C, OC);
    K->add(out2, res, pre2, n);
    snprintf(name, sizeof name, "matmul_forward_res %dx%dx%d%s", N, C, OC, with_bias ? " +bias" : "");
    same = memcmp(out, out2, n * sizeof(float)) == 0;
    report(same, name, "%s", same ? "bit-identical to matmul_forward + add" : "differs from matmul_forward + add");
    free(inp); free(w); free(bias); free(pre); free(out); free(pre2); free(out2); free(res);
}

/* matmul_gelu_backward / matmul_swiglu_backward are matmul_backward into a
 * zeroed buffer, then gelu_backward / swiglu_backward into a zeroed dpre,
 * bit for bit: dpre starts as garbage (it is overwritten), dw and dbias
 * with values (they are added into); small and thread-sliced shapes */
static void test_matmul_act_backward(int N, int C, int OC, int swiglu, int with_bias) {
    size_t np = (size_t)N * C * (swiglu ? 2 : 1), nc = (size_t)N * C, nw = (size_t)OC * C;
    float *dout = randv((size_t)N * OC, 1), *inp = randv(nc, 1), *w = randv(nw, 0.5f), *pre = randv(np, 2);
    float *dpre = randv(np, 100), *dw = randv(nw, 1), *db = with_bias ? randv(OC, 1) : NULL;
    float *dw2 = dup(dw, nw), *db2 = with_bias ? dup(db, OC) : NULL, *dh = zerov(nc), *dpre2 = zerov(np);
    if (swiglu) K->matmul_swiglu_backward(dpre, dw, db, dout, NULL, inp, w, pre, N, C, OC);
    else K->matmul_gelu_backward(dpre, dw, db, dout, NULL, inp, w, pre, N, C, OC);
    K->matmul_backward(dh, dw2, db2, dout, inp, w, N, C, OC);
    if (swiglu) K->swiglu_backward(dpre2, pre, dh, N, C);
    else K->gelu_backward(dpre2, pre, dh, nc);
    int same = memcmp(dpre, dpre2, np * sizeof(float)) == 0 && memcmp(dw, dw2, nw * sizeof(float)) == 0 &&
               (!with_bias || memcmp(db, db2, OC * sizeof(float)) == 0);
    char name[96];
    snprintf(name, sizeof name, "matmul_%s_backward %dx%dx%d%s", swiglu ? "swiglu" : "gelu", N, C, OC,
             with_bias ? " +bias" : "");
    report(same, name, "%s", same ? "dpre (overwritten), dw and dbias bit-identical to matmul_backward + the activation's"
                                  : "differs from matmul_backward + the activation's backward");
    /* without dpre: only the weight gradients, added again */
    if (swiglu) K->matmul_swiglu_backward(NULL, dw, db, dout, NULL, inp, w, pre, N, C, OC);
    else K->matmul_gelu_backward(NULL, dw, db, dout, NULL, inp, w, pre, N, C, OC);
    K->matmul_backward(NULL, dw2, db2, dout, inp, w, N, C, OC);
    same = memcmp(dw, dw2, nw * sizeof(float)) == 0 && (!with_bias || memcmp(db, db2, OC * sizeof(float)) == 0);
    report(same, name, "%s", same ? "with dpre NULL: dw and dbias added into again" : "with dpre NULL: differs");
    free(dout); free(inp); free(w); free(pre); free(dpre); free(dw); free(db); free(dw2); free(db2); free(dh); free(dpre2);
}

/* FP8 linears (Kernels.fp8_setup / fp8_scope): each of the three products
 * reads its operands fake-quantized by fp8.c (tests/test_fp8.py checks fp8.c
 * itself) in the format and with the groups docs/fp8.md gives, written out
 * here per product: forward x and w E4M3 along C, the input gradient's dout
 * E5M2 along OC and w E4M3 along OC, the weight gradient's dout E5M2 and x
 * E4M3 along N; the bias gradient sums the unquantized dout. Then the weight
 * copies: one a stable range and orientation, made again after the range
 * is declared anew, none kept outside a range; out of scope, the plain
 * products bit for bit. */
static void fq_ref(double *dst, const float *src, int rows, int cols, int gr, int gc, Fp8Format f) {
    size_t n = (size_t)rows * cols;
    float *q = zerov(n), *sc = zerov(fp8_n_groups(rows, cols, gr, gc));
    fp8_fake_quant(q, src, sc, rows, cols, gr, gc, f);
    for (size_t i = 0; i < n; i++) dst[i] = q[i];
    free(q); free(sc);
}

static void test_fp8_products(int N, int C, int OC, int recipe) {
    static const char *names[] = {"tensorwise", "blockwise", "rowwise"};
    /* {gr, gc} of x and w forward, dout and w (input gradient), dout and x (weight gradient) */
    int g[3][6][2] = {{{N, C}, {OC, C}, {N, OC}, {OC, C}, {N, OC}, {N, C}},
                      {{1, 128}, {128, 128}, {1, 128}, {128, 128}, {128, 1}, {128, 1}},
                      {{1, C}, {1, C}, {1, OC}, {OC, 1}, {N, 1}, {N, 1}}};
    int (*G)[2] = g[recipe];
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = randv(nx, 1), *w = randv(nw, 0.5f), *b = randv(OC, 1), *dout = randv(ny, 1e-3f);
    for (size_t i = 0; i < nx; i += 7) x[i] *= 40; /* outliers: groups differ in scale */
    float *y = zerov(ny), *dx = zerov(nx), *dw = zerov(nw), *db = zerov(OC), *y0 = zerov(ny), *y1 = zerov(ny);
    double *xf = calloc_check(nx, sizeof(double)), *wf = calloc_check(nw, sizeof(double));
    double *dyr = calloc_check(ny, sizeof(double)), *wr = calloc_check(nw, sizeof(double));
    double *dyc = calloc_check(ny, sizeof(double)), *xc = calloc_check(nx, sizeof(double));
    double *ry = calloc_check(ny, sizeof(double)), *rdx = calloc_check(nx, sizeof(double));
    double *rdw = calloc_check(nw, sizeof(double)), *rdb = calloc_check(OC, sizeof(double));
    fq_ref(xf, x, N, C, G[0][0], G[0][1], FP8_E4M3);
    fq_ref(wf, w, OC, C, G[1][0], G[1][1], FP8_E4M3);
    fq_ref(dyr, dout, N, OC, G[2][0], G[2][1], FP8_E5M2);
    fq_ref(wr, w, OC, C, G[3][0], G[3][1], FP8_E4M3);
    fq_ref(dyc, dout, N, OC, G[4][0], G[4][1], FP8_E5M2);
    fq_ref(xc, x, N, C, G[5][0], G[5][1], FP8_E4M3);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double a = b[o];
            for (int c = 0; c < C; c++) a += xf[(size_t)n * C + c] * wf[(size_t)o * C + c];
            ry[(size_t)n * OC + o] = a;
            rdb[o] += dout[(size_t)n * OC + o];
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int o = 0; o < OC; o++) a += dyr[(size_t)n * OC + o] * wr[(size_t)o * C + c];
            rdx[(size_t)n * C + c] = a;
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int n = 0; n < N; n++) a += dyc[(size_t)n * OC + o] * xc[(size_t)n * C + c];
            rdw[(size_t)o * C + c] = a;
        }
    Fp8Sizes z = {(size_t)N * (C > OC ? C : OC), nw, nw, 1, N > C ? (N > OC ? N : OC) : (C > OC ? C : OC)};
    K->matmul_forward(y0, x, w, b, N, C, OC); /* before FP8: the plain product */
    K->fp8_setup(recipe, &z);
    K->weights_stable(w, nw);
    K->fp8_scope(1);
    long made0, hits0, made1, hits1, made2, hits2, made3;
    made0 = kernels_cpu_fp8_weight_copies(&hits0);
    K->matmul_forward(y, x, w, b, N, C, OC);
    K->matmul_backward(dx, dw, db, dout, x, w, N, C, OC);
    made1 = kernels_cpu_fp8_weight_copies(&hits1);
    char name[96];
    snprintf(name, sizeof name, "fp8 %s %dx%dx%d", names[recipe], N, C, OC);
    const char *what[] = {"out", "dinp", "dweight", "dbias (unquantized dout)"};
    const float *got[] = {y, dx, dw, db};
    const double *want[] = {ry, rdx, rdw, rdb};
    size_t cnt[] = {ny, nx, nw, (size_t)OC};
    for (int i = 0; i < 4; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s %s", name, what[i]);
        check_close(nm, got[i], want[i], cnt[i], 1e-5);
    }
    K->matmul_forward(y1, x, w, b, N, C, OC); /* a second micro-batch: the copies again */
    K->matmul_backward(dx, NULL, NULL, dout, x, w, N, C, OC);
    made2 = kernels_cpu_fp8_weight_copies(&hits2);
    int orient = recipe == FP8_ROWWISE ? 2 : 1;
    report(made1 - made0 == orient && hits1 - hits0 == 2 - orient && made2 == made1 && hits2 - hits1 == 2 &&
               memcmp(y, y1, ny * sizeof(float)) == 0,
           name, "weight copies: %ld made by the first forward and backward (%ld reused), then %ld more and %ld reused",
           made1 - made0, hits1 - hits0, made2 - made1, hits2 - hits1);
    K->weights_stable(w, nw); /* written again: made again */
    K->matmul_forward(y1, x, w, b, N, C, OC);
    made3 = kernels_cpu_fp8_weight_copies(NULL);
    K->weights_stable(NULL, 0); /* no range: nothing kept */
    K->matmul_forward(y1, x, w, b, N, C, OC);
    K->matmul_forward(y1, x, w, b, N, C, OC);
    report(made3 == made2 + 1 && kernels_cpu_fp8_weight_copies(NULL) == made3 && memcmp(y, y1, ny * sizeof(float)) == 0, name,
           "a range declared anew makes the copy again; outside any range none is kept; the same bits each time");
    K->fp8_scope(0);
    K->matmul_forward(y1, x, w, b, N, C, OC);
    report(memcmp(y0, y1, ny * sizeof(float)) == 0, name, "out of scope (the LM head's) the plain product, bit for bit");
    K->fp8_setup(-1, NULL);
    free(x); free(w); free(b); free(dout); free(y); free(dx); free(dw); free(db); free(y0); free(y1);
    free(xf); free(wf); free(dyr); free(wr); free(dyc); free(xc); free(ry); free(rdx); free(rdw); free(rdb);
}

/* Under context parallelism (Kernels.fp8_cp) a product hands the callback
 * the amaxes of the groups that span the tokens (an activation's or dout's
 * rows), never a weight's: tensorwise each such operand's one, rowwise the
 * weight gradient's (dout's OC columns, then x's C), blockwise none; and
 * quantizes with what comes back: here each amax times 3, as another rank
 * with larger values would make it (not a power of 2, which would give the
 * same values), so the forward is checked against x quantized with 3 x its
 * amax (tensorwise) or its own (the others). */
static size_t cp_sent[8];
static int cp_calls;
static void cp_amax_x3(void *ctx, float *amax, size_t n) {
    (void)ctx;
    if (cp_calls < 8) cp_sent[cp_calls] = n;
    cp_calls++;
    for (size_t i = 0; i < n; i++) amax[i] *= 3;
}

static void test_fp8_cp_groups(int N, int C, int OC, int recipe) {
    const size_t want[3][4] = {{1, 1, 1, 1}, {0}, {(size_t)OC, (size_t)C}};
    const int n_want[3] = {4, 0, 2};
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = randv(nx, 1), *w = randv(nw, 0.5f), *dout = randv(ny, 1e-3f), *y = zerov(ny), *dx = zerov(nx), *dw = zerov(nw);
    float *xq = zerov(nx), *wq = zerov(nw), *sc = zerov(nx + nw);
    double *ry = calloc_check(ny, sizeof(double));
    int gr, gc;
    fp8_groups(recipe, 0, 1, N, C, &gr, &gc);
    size_t ng = fp8_n_groups(N, C, gr, gc);
    fp8_group_amax(sc, x, N, C, gr, gc);
    for (size_t i = 0; i < ng && recipe == FP8_TENSORWISE; i++) sc[i] *= 3;
    fp8_amax_scales(sc, ng, FP8_E4M3);
    fp8_apply(xq, x, sc, N, C, gr, gc, FP8_E4M3);
    fp8_groups(recipe, 1, 1, OC, C, &gr, &gc);
    fp8_fake_quant(wq, w, sc, OC, C, gr, gc, FP8_E4M3);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double a = 0;
            for (int c = 0; c < C; c++) a += (double)xq[(size_t)n * C + c] * wq[(size_t)o * C + c];
            ry[(size_t)n * OC + o] = a;
        }
    Fp8Sizes z = {(size_t)N * (C > OC ? C : OC), nw, nw, 1, N > C ? (N > OC ? N : OC) : (C > OC ? C : OC)};
    K->fp8_setup(recipe, &z);
    K->fp8_cp(cp_amax_x3, NULL);
    K->fp8_scope(1);
    cp_calls = 0;
    memset(cp_sent, 0, sizeof cp_sent);
    K->matmul_forward(y, x, w, NULL, N, C, OC);
    K->matmul_backward(dx, dw, NULL, dout, x, w, N, C, OC);
    int ok = cp_calls == n_want[recipe];
    for (int i = 0; i < cp_calls && i < 8 && ok; i++) ok = cp_sent[i] == want[recipe][i];
    char name[96];
    const char *rn = recipe == FP8_TENSORWISE ? "tensorwise" : recipe == FP8_ROWWISE ? "rowwise" : "blockwise";
    snprintf(name, sizeof name, "fp8 cp %s %dx%dx%d", rn, N, C, OC);
    report(ok, name, "%d amax all-reduces (%zu, %zu, ... floats), expected %d (%zu, %zu, ...)", cp_calls, cp_sent[0], cp_sent[1],
           n_want[recipe], want[recipe][0], want[recipe][1]);
    check_close(name, y, ry, ny, 1e-5);
    K->fp8_scope(0);
    K->fp8_setup(-1, NULL);
    free(x); free(w); free(dout); free(y); free(dx); free(dw); free(xq); free(wq); free(sc); free(ry);
}

/* add_layernorm_forward / add_rmsnorm_forward are add then the norm, bit for
 * bit, also in place (res aliasing a), with and without a bias */
static void test_add_norm(int N, int C, int rms, int with_bias, int in_place) {
    size_t n = (size_t)N * C;
    float *a = randv(n, 3), *b = randv(n, 1), *w = randv(C, 1), *bias = with_bias ? randv(C, 1) : NULL;
    float *res = in_place ? dup(a, n) : randv(n, 1), *out = randv(n, 1), *mean = randv(N, 1), *rstd = randv(N, 1);
    float *res2 = zerov(n), *out2 = zerov(n), *mean2 = zerov(N), *rstd2 = zerov(N);
    const float *first = in_place ? res : a; /* the fused call reads a through res */
    K->add(res2, a, b, n);
    if (rms) {
        K->add_rmsnorm_forward(res, out, rstd, first, b, w, N, C, 1e-5f);
        K->rmsnorm_forward(out2, rstd2, res2, w, N, C, 1e-5f);
    } else {
        K->add_layernorm_forward(res, out, mean, rstd, first, b, w, bias, N, C, 1e-5f);
        K->layernorm_forward(out2, mean2, rstd2, res2, w, bias, N, C, 1e-5f);
    }
    int same = memcmp(res, res2, n * sizeof(float)) == 0 && memcmp(out, out2, n * sizeof(float)) == 0 &&
               memcmp(rstd, rstd2, N * sizeof(float)) == 0 && (rms || memcmp(mean, mean2, N * sizeof(float)) == 0);
    char name[96];
    snprintf(name, sizeof name, "add_%s_forward %dx%d%s%s", rms ? "rmsnorm" : "layernorm", N, C, with_bias ? " +bias" : "",
             in_place ? " in place" : "");
    report(same, name, "%s", same ? "res, out and statistics bit-identical to add + norm" : "differs from add + norm");
    free(a); free(b); free(w); free(bias); free(res); free(out); free(mean); free(rstd);
    free(res2); free(out2); free(mean2); free(rstd2);
}

static void test_swiglu(void) {
    int N = 6, F = 8;
    PwCtx c = {zerov(N * F), randv(N * 2 * F, 4), randv(N * F, 1), 0, N, F};
    double *ref = malloc_check(sizeof(double) * N * F);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < F; j++) {
            double g = c.inp[r * 2 * F + j], u = c.inp[r * 2 * F + F + j];
            ref[r * F + j] = g / (1.0 + exp(-g)) * u;
        }
    swiglu_loss(&c);
    check_close("swiglu_forward", c.out, ref, N * F, 1e-5);
    float *d = zerov(N * 2 * F), *fd = zerov(N * 2 * F);
    K->swiglu_backward(d, c.inp, c.R, N, F);
    fd_grad(swiglu_loss, &c, c.inp, N * 2 * F, 1e-3f, fd);
    check_grad("swiglu_backward dinp", d, fd, N * 2 * F);
    float *once = dup(d, N * 2 * F);
    K->swiglu_backward(d, c.inp, c.R, N, F);
    check_doubles("swiglu_backward adds", once, d, N * 2 * F);
    free(ref); free(d); free(fd); free(once); free(c.out); free(c.inp); free(c.R);
}

// ----------------------------------------------------------------------------
// cross-entropy

typedef struct { float *logits, *tmp, *losses, r; int *targets; int N, V; } CeCtx;
static double ce_loss(void *p) {
    CeCtx *c = p;
    memcpy(c->tmp, c->logits, sizeof(float) * c->N * c->V);
    K->crossentropy_forward(c->losses, c->tmp, c->targets, c->N, c->V);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += (double)c->losses[n] * c->r;
    return s;
}

static void ce_ref(double *probs, double *losses, const float *logits, const int *targets,
                   int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        double m = -INFINITY, z = 0;
        for (int j = 0; j < V; j++) if (x[j] > m) m = x[j];
        for (int j = 0; j < V; j++) z += exp(x[j] - m);
        for (int j = 0; j < V; j++) probs[(size_t)n * V + j] = exp(x[j] - m) / z;
        losses[n] = targets[n] == CE_NO_TARGET ? 0.0 : log(z) - (x[targets[n]] - m);
    }
}

static void test_crossentropy(void) {
    int N = 6, V = 11; /* row 2 without a target: no loss, a zero gradient (finite differences say so) */
    int targets[6] = {0, 10, CE_NO_TARGET, 3, 7, 1};
    CeCtx c = {randv(N * V, 3), zerov(N * V), zerov(N), 0.37f, targets, N, V};
    double *rp = malloc_check(sizeof(double) * N * V), rl[6];
    ce_ref(rp, rl, c.logits, targets, N, V);
    ce_loss(&c);
    check_close("crossentropy_forward probs", c.tmp, rp, N * V, 1e-5);
    check_close("crossentropy_forward losses", c.losses, rl, N, 1e-5);
    K->crossentropy_backward(c.tmp, targets, c.r, N, V);
    float *fd = zerov(N * V), *g = dup(c.tmp, N * V);
    fd_grad(ce_loss, &c, c.logits, N * V, 1e-3f, fd);
    check_grad("crossentropy_backward dlogits", g, fd, N * V);
    free(rp); free(fd); free(g); free(c.logits); free(c.tmp); free(c.losses);

    // a real vocabulary, with logits far from zero: stable, and exp accurate
    N = 4; V = 50257;
    float *x = randv((size_t)N * V, 20), *t = zerov((size_t)N * V), l[4];
    for (int j = 0; j < V; j++) x[j] += 1000.0f; // row 0 would overflow a naive exp
    x[(size_t)2 * V + 5] = 80.0f;               // row 2: one dominant logit
    int tg[4] = {5, 50256, 5, 12345};
    double *bp = malloc_check(sizeof(double) * N * V), bl[4];
    ce_ref(bp, bl, x, tg, N, V);
    memcpy(t, x, sizeof(float) * N * V);
    K->crossentropy_forward(l, t, tg, N, V);
    check_close("crossentropy_forward probs V=50257", t, bp, (size_t)N * V, 1e-5);
    // every probability, however small, to 1e-5 relative (the exp must be accurate)
    double prel = 0;
    for (size_t i = 0; i < (size_t)N * V; i++)
        if (bp[i] > 1e-30) prel = fmax(prel, fabs(t[i] - bp[i]) / bp[i]);
    report(prel < 1e-5, "crossentropy_forward probs V=50257 elementwise", "rel_err=%.1e", prel);
    double worst = 0;
    int finite = 1;
    for (int n = 0; n < N; n++) {
        if (!isfinite(l[n])) finite = 0;
        double e = fabs(l[n] - bl[n]) / fmax(fabs(bl[n]), 1e-3);
        if (e > worst) worst = e;
    }
    report(finite && worst < 1e-5, "crossentropy_forward losses V=50257", "rel_err=%.1e (loss0 %.3g)",
           worst, bl[0]);
    free(x); free(t); free(bp);
}

/* vocab-parallel cross-entropy: P column slices with the reductions done
 * here (max, then sums) must give the reference probabilities and losses,
 * and the slices' backward the finite-difference gradient of the full loss */
/* crossentropy_fused is crossentropy_forward then crossentropy_backward,
 * bit for bit (losses and d(logits)) */
static void test_crossentropy_fused(int N, int V) {
    size_t n = (size_t)N * V;
    float *a = randv(n, 4), *b = dup(a, n), *la = zerov(N), *lb = zerov(N);
    int *tg = malloc_check((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 3 ? CE_NO_TARGET : (int)((i * 7919u + 13u) % (unsigned)V);
    K->crossentropy_fused(la, a, tg, 0.03f, N, V);
    K->crossentropy_forward(lb, b, tg, N, V);
    K->crossentropy_backward(b, tg, 0.03f, N, V);
    int same = memcmp(a, b, n * sizeof(float)) == 0 && memcmp(la, lb, N * sizeof(float)) == 0;
    char name[64];
    snprintf(name, sizeof name, "crossentropy_fused %dx%d", N, V);
    report(same, name, "%s", same ? "losses and dlogits bit-identical to forward + backward" : "differs from forward + backward");
    free(a); free(b); free(la); free(lb); free(tg);
}

static void test_crossentropy_vp(void) {
    int N = 6, V = 12, P = 3, Vl = V / P;
    int targets[6] = {0, 11, 3, CE_NO_TARGET, 7, 8};
    CeCtx c = {randv(N * V, 3), zerov(N * V), zerov(N), 0.37f, targets, N, V};
    double *rp = malloc_check(sizeof(double) * N * V), rl[6];
    ce_ref(rp, rl, c.logits, targets, N, V);
    float *sl[3], mx[6], gmax[6], sums[12], acc[12], losses[6];
    for (int n = 0; n < N; n++) gmax[n] = -INFINITY;
    for (int i = 0; i < 2 * N; i++) acc[i] = 0;
    for (int r = 0; r < P; r++) { /* local column slices */
        sl[r] = zerov(N * Vl);
        for (int n = 0; n < N; n++) memcpy(sl[r] + n * Vl, c.logits + n * V + r * Vl, sizeof(float) * Vl);
        K->crossentropy_vp_max(mx, sl[r], N, Vl);
        for (int n = 0; n < N; n++) gmax[n] = fmaxf(gmax[n], mx[n]);
    }
    for (int r = 0; r < P; r++) {
        K->crossentropy_vp_expsum(sums, sums + N, sl[r], gmax, targets, N, Vl, r * Vl);
        for (int i = 0; i < 2 * N; i++) acc[i] += sums[i];
    }
    float *probs = zerov(N * V);
    for (int r = 0; r < P; r++) {
        K->crossentropy_vp_finish(losses, sl[r], gmax, acc, acc + N, targets, N, Vl);
        K->crossentropy_vp_backward(sl[r], targets, c.r, N, Vl, r * Vl);
        for (int n = 0; n < N; n++) memcpy(probs + n * V + r * Vl, sl[r] + n * Vl, sizeof(float) * Vl);
    }
    check_close("crossentropy_vp losses", losses, rl, N, 1e-5);
    float *fd = zerov(N * V);
    fd_grad(ce_loss, &c, c.logits, N * V, 1e-3f, fd);
    check_grad("crossentropy_vp_backward dlogits (slices)", probs, fd, N * V);
    for (int r = 0; r < P; r++) free(sl[r]);
    free(rp); free(fd); free(probs); free(c.logits); free(c.tmp); free(c.losses);
}

// ----------------------------------------------------------------------------
// optimizer, reductions, memory

static void test_adamw(void) {
    size_t n = 1000;
    float *p = randv(n, 1), *m = zerov(n), *v = zerov(n);
    double *pd = malloc_check(sizeof(double) * n), *md = calloc_check(n, sizeof(double)),
           *vd = calloc_check(n, sizeof(double));
    for (size_t i = 0; i < n; i++) pd[i] = p[i];
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    for (int t = 1; t <= 3; t++) {
        float *g = randv(n, 2);
        g[0] = 0.0f; // zero gradient: m = v = 0 path
        K->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            pd[i] -= (double)lr * wd * pd[i];
            md[i] = (double)b1 * md[i] + (1.0 - b1) * gi;
            vd[i] = (double)b2 * vd[i] + (1.0 - b2) * gi * gi;
            double mh = md[i] / (1.0 - pow(b1, t)), vh = vd[i] / (1.0 - pow(b2, t));
            pd[i] -= (double)lr * mh / (sqrt(vh) + eps);
        }
        free(g);
    }
    // the update itself is ~lr: judge the error against it, not against |p|
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(p[i] - pd[i]));
    report(worst < 1e-3 * lr * 3, "adamw 3 steps vs double", "max_abs_err=%.1e (lr %.0e)", worst, lr);
    free(p); free(m); free(v); free(pd); free(md); free(vd);
}

/* adamw_multi over several ranges (an empty one, a gap, different decays)
 * equals adamw per range, bit for bit, and leaves the gaps alone */
static void test_adamw_multi(void) {
    size_t n = 5000;
    float *p = randv(n, 1), *g = randv(n, 2), *m = randv(n, 0.1f), *v = randv(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *p2 = dup(p, n), *m2 = dup(m, n), *v2 = dup(v, n);
    AdamWRange r[4] = {{0, 1000, 0.1f, 0}, {1000, 0, 0.1f, 0}, {1200, 2000, 0.0f, 0}, {3500, 1500, 0.05f, 0}};
    K->adamw_multi(p, g, m, v, r, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 4, 0.7f, NULL);
    for (int i = 0; i < 4; i++)
        K->adamw(p2 + r[i].offset, g + r[i].offset, m2 + r[i].offset, v2 + r[i].offset, r[i].n, 1e-3f, 0.9f, 0.95f,
                 1e-8f, r[i].wd, 4, 0.7f);
    int same = memcmp(p, p2, n * sizeof(float)) == 0 && memcmp(m, m2, n * sizeof(float)) == 0 &&
               memcmp(v, v2, n * sizeof(float)) == 0;
    report(same, "adamw_multi equals adamw per range", "%s", same ? "bit-identical" : "differs");
    /* the sum of squares of the updated weights over the ranges with norm
     * set (the third not), against a plain double sum; the same update and
     * the same bits twice; and the CPU keeps no copies (returns 0) */
    AdamWRange rn[4] = {{0, 1000, 0.1f, 1}, {1000, 0, 0.1f, 1}, {1200, 2000, 0.0f, 0}, {3500, 1500, 0.05f, 1}};
    float *p3 = dup(p, n), *m3 = dup(m, n), *v3 = dup(v, n), *p4 = dup(p, n), *m4 = dup(m, n), *v4 = dup(v, n);
    double sq = -1, sq2 = -2, want = 0;
    int kept = K->adamw_multi(p3, g, m3, v3, rn, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 5, 0.7f, &sq);
    K->adamw_multi(p4, g, m4, v4, rn, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 5, 0.7f, &sq2);
    K->adamw_multi(p, g, m, v, rn, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 5, 0.7f, NULL);
    for (int i = 0; i < 4; i++)
        for (size_t j = rn[i].offset; rn[i].norm && j < rn[i].offset + rn[i].n; j++) want += (double)p3[j] * p3[j];
    double rel = fabs(sq - want) / want;
    same = memcmp(p, p3, n * sizeof(float)) == 0 && memcmp(m, m3, n * sizeof(float)) == 0 &&
           memcmp(v, v3, n * sizeof(float)) == 0;
    report(rel < 1e-12 && memcmp(&sq, &sq2, sizeof sq) == 0 && same && kept == 0, "adamw_multi sum of squares",
           "%.17g vs %.17g (rel %.1e), again %.17g, update %s, returned %d", sq, want, rel, sq2,
           same ? "as without it" : "differs", kept);
    free(p); free(g); free(m); free(v); free(p2); free(m2); free(v2);
    free(p3); free(m3); free(v3); free(p4); free(m4); free(v4);
}

static void test_misc(void) {
    size_t n = 100003;
    float *x = randv(n, 3), *y = randv(n, 1), *z = zerov(n);
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++) { s += x[i]; ss += (double)x[i] * x[i]; }
    double gs = K->sum(x, n), gss = K->sumsq(x, n);
    report(fabs(gs - s) <= 1e-9 * fabs(ss), "sum", "got=%.9g want=%.9g", gs, s);
    report(fabs(gss - ss) <= 1e-12 * ss, "sumsq", "got=%.9g want=%.9g", gss, ss);
    /* sumsq_queue: sumsq's bits in the slot named, taken together */
    double slots[3] = {-1, -1, -1}, got[3];
    K->sumsq_queue(x + 7, n - 7, &slots[2]);
    K->sumsq_queue(x, 0, &slots[0]);
    K->sumsq_queue(x, n / 2, &slots[1]);
    K->sumsq_take(got, slots, 3);
    double w1 = K->sumsq(x, n / 2), w2 = K->sumsq(x + 7, n - 7);
    report(got[0] == 0.0 && memcmp(&got[1], &w1, sizeof w1) == 0 && memcmp(&got[2], &w2, sizeof w2) == 0, "sumsq_queue",
           "slots %.17g %.17g %.17g, sumsq %.17g %.17g", got[0], got[1], got[2], w1, w2);
    double *ref = malloc_check(sizeof(double) * n);
    K->add(z, x, y, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)x[i] + y[i];
    check_close("add", z, ref, n, 1e-7);
    K->add(x, x, y, n); // out aliases a
    check_close("add in place", x, ref, n, 1e-7);
    K->scale(z, 0.25f, n);
    for (size_t i = 0; i < n; i++) ref[i] *= 0.25;
    check_close("scale", z, ref, n, 1e-7);

    size_t bytes = 10u << 20;
    unsigned char *a = K->alloc(bytes);
    int zero = ((uintptr_t)a % 64) == 0;
    for (size_t i = 0; i < bytes; i++) zero &= a[i] == 0;
    report(zero, "alloc zero-filled and 64-byte aligned", "(%zu MiB)", bytes >> 20);
    memset(a, 7, bytes);
    K->zero(a, bytes);
    int zeroed = 1;
    for (size_t i = 0; i < bytes; i++) zeroed &= a[i] == 0;
    K->copy(a, x, n * sizeof(float));
    zeroed &= memcmp(a, x, n * sizeof(float)) == 0;
    report(zeroed, "zero and copy", "(%zu MiB)", bytes >> 20);
    /* grads_fresh: the CPU zeroes the gradients there and then (a backward
     * adds into them at once); grads_settle leaves what is there */
    memset(a, 7, bytes);
    K->grads_fresh((float *)a, bytes / sizeof(float) - 1);
    int fresh = a[bytes - 4] == 7 && a[bytes - 1] == 7;
    for (size_t i = 0; i + 4 < bytes; i++) fresh &= a[i] == 0;
    a[8] = 1;
    K->grads_settle((float *)a, bytes / sizeof(float) - 1);
    fresh &= a[8] == 1 && a[7] == 0;
    report(fresh, "grads_fresh zeroes its range (and no more), grads_settle leaves it", "(%zu MiB)", bytes >> 20);
    K->free(a);

    const char *info = kernels_cpu_blas_info();
    report(info && strstr(info, "OpenBLAS") != NULL, "blas_info", "(%s)", info);
    free(x); free(y); free(z); free(ref);
}

// round_bf16: nearest-even against an independent reference (bf16's
// neighbours of x from frexp, the nearer one, ties to the even mantissa);
// stochastic: always one of the two neighbours, up with the probability the
// dropped bits say (mean over many seeds unbiased), deterministic per
// (seed, index); values already in bf16 and NaN/Inf kept.
static float bf16_floor(float x) { // toward zero, 8 mantissa bits
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static double ref_nearest(float x) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexp(fabs((double)x), &e);            // |x| = m 2^e, m in [0.5, 1)
    double ulp = ldexp(1.0, e - 8);        // 8 significant bits,
    if (ulp < ldexp(1.0, -133)) ulp = ldexp(1.0, -133); // or bf16's subnormal spacing
    double lo = floor(fabs((double)x) / ulp) * ulp, hi = lo + ulp;
    double d_lo = fabs((double)x) - lo, d_hi = hi - fabs((double)x);
    double r;
    if (d_lo < d_hi) r = lo;
    else if (d_hi < d_lo) r = hi;
    else r = fmod(lo / ulp, 2.0) == 0 ? lo : hi; // tie: even mantissa
    return x < 0 ? -r : r;
}
static void test_round_bf16(void) {
    enum { N = 4096 };
    float *x = malloc_check(N * sizeof(float)), *y = malloc_check(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = frand() * ldexpf(1.0f, irand(40) - 20);
    x[0] = 1.0f + ldexpf(1.0f, -8);            // exact tie, even below: 1.0
    x[1] = 1.0f + 3 * ldexpf(1.0f, -8);        // exact tie, even above: 1 + 2^-6
    x[2] = -(1.0f + ldexpf(1.0f, -8));
    x[3] = 1.0e-40f;                           // subnormal
    x[4] = 0.0f;
    int bad = 0;
    K->round_bf16(y, x, N, 0, 0);
    for (int i = 0; i < N; i++)
        if ((double)y[i] != ref_nearest(x[i])) bad++;
    report(bad == 0, "round_bf16 nearest", "%d of %d differ from the frexp reference", bad, N);
    float sp[4] = {INFINITY, -INFINITY, NAN, 3.0f}, so[4];
    K->round_bf16(so, sp, 4, 0, 0);
    report(isinf(so[0]) && so[0] > 0 && isinf(so[1]) && so[1] < 0 && isnan(so[2]) && so[3] == 3.0f, "round_bf16 specials",
           "inf, -inf, nan, 3 -> %g %g %g %g", so[0], so[1], so[2], so[3]);
    // stochastic: each result is a neighbour; the mean over seeds is x
    float v[3] = {1.0f + 0.3f * ldexpf(1.0f, -7), -2.5f - 0.77f * ldexpf(1.0f, -6), 0.1f}, out;
    int neighbours = 1, worst_i = 0;
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        float lo = bf16_floor(v[k]);
        double ulp = ldexp(1.0, ilogb(v[k]) - 7);
        double sum = 0;
        const int S = 20000;
        for (int s = 1; s <= S; s++) {
            K->round_bf16(&out, &v[k], 1, (uint64_t)s * 7919u, 12345);
            double d = fabs((double)out - (double)lo);
            if (!(d == 0 || fabs(d - ulp) < 1e-3 * ulp)) neighbours = 0;
            sum += out;
        }
        double bias = fabs(sum / S - v[k]) / ulp; // in ulps; sampling noise ~ 0.5/sqrt(S) = 0.0035
        if (bias > worst) { worst = bias; worst_i = k; }
    }
    report(neighbours && worst < 0.02, "round_bf16 stochastic", "neighbours only: %d, mean bias %.4f ulp (value %d)", neighbours,
           worst, worst_i);
    float a[64], b[64], c2[64];
    K->round_bf16(a, x, 64, 99, 1000);
    K->round_bf16(b, x, 64, 99, 1000);
    K->round_bf16(c2, x, 64, 98, 1000);
    int same = memcmp(a, b, sizeof a) == 0, differ = memcmp(a, c2, sizeof a) != 0;
    // the draw depends on (seed, index) only: element i of a call at index0 = element 0 of a call at index0 + i
    int keyed = 1;
    for (int i = 0; i < 64; i++) {
        K->round_bf16(&out, &x[i], 1, 99, 1000 + (uint64_t)i);
        if (memcmp(&out, &a[i], 4) != 0) keyed = 0;
    }
    K->round_bf16(y, x, N, 0, 0);
    K->round_bf16(a, y, 64, 99, 0); // already bf16: unchanged by either rounding
    report(same && differ && keyed && memcmp(a, y, sizeof a) == 0, "round_bf16 stochastic determinism",
           "same seed same bits %d, other seed differs %d, keyed by index %d, bf16 values kept", same, differ, keyed);
    // pack_bf16 stores the same rounding as bf16 words; unpack_bf16 widens them exactly:
    // unpack(pack(x)) is round_bf16(x) bit for bit (specials included), every word is
    // round_bf16's high half, and widening any word sets only the high half
    float *xs = malloc_check((N + 4) * sizeof(float)), *w = malloc_check((N + 4) * sizeof(float));
    float *yr = malloc_check((N + 4) * sizeof(float));
    uint16_t *h16 = malloc_check((N + 4) * sizeof(uint16_t));
    memcpy(xs, x, N * sizeof(float));
    memcpy(xs + N, sp, sizeof sp);
    int packed = 1, high = 1;
    for (int k = 0; k < 2; k++) {
        uint64_t seed = k ? 0x5eedull : 0;
        K->round_bf16(yr, xs, N + 4, seed, 31);
        K->pack_bf16(h16, xs, N + 4, seed, 31);
        K->unpack_bf16(w, h16, N + 4);
        for (int i = 0; i < N + 4; i++) {
            uint32_t yu, wu;
            memcpy(&yu, &yr[i], 4);
            memcpy(&wu, &w[i], 4);
            if (yu != wu || h16[i] != (uint16_t)(yu >> 16)) packed = 0;
        }
    }
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t word = (uint16_t)u;
        float f;
        uint32_t fu;
        K->unpack_bf16(&f, &word, 1);
        memcpy(&fu, &f, 4);
        if (fu != u << 16) high = 0;
    }
    report(packed && high, "pack_bf16 / unpack_bf16", "unpack(pack(x)) == round_bf16(x) bitwise, nearest and stochastic: %d; "
           "every word widened to word << 16: %d", packed, high);
    // in place: the words in the upper half of the float buffer they are widened into
    // (halving passes, then one by one) give the out-of-place result, for sizes that
    // end in the one-by-one tail at once, after one pass and after several
    int inplace = 1;
    size_t sizes[5] = {1, 2, 4097, 9000, 100003};
    for (int z = 0; z < 5; z++) {
        size_t m = sizes[z];
        uint16_t *words = malloc_check(m * sizeof(uint16_t));
        float *ref = malloc_check(m * sizeof(float)), *buf = malloc_check(m * sizeof(float));
        for (size_t i = 0; i < m; i++) words[i] = (uint16_t)(i * 40503u + 7);
        K->unpack_bf16(ref, words, m);
        memcpy((uint16_t *)(void *)buf + m, words, m * sizeof(uint16_t));
        K->unpack_bf16(buf, (uint16_t *)(void *)buf + m, m);
        if (memcmp(ref, buf, m * sizeof(float)) != 0) inplace = 0;
        free(words);
        free(ref);
        free(buf);
    }
    report(inplace, "unpack_bf16 in place", "words in the upper half widened in place == out of place for n = 1, 2, 4097, 9000, 100003");
    free(xs);
    free(yr);
    free(w);
    free(h16);
    free(x);
    free(y);
}

int main(int argc, char **argv) {
    (void)argc;
    kernels_cpu_select_blas_core(argv);
    K = kernels_cpu();
    test_embed();
    test_embed_vp();
    test_layernorm();
    test_rmsnorm();
    test_matmul();
    test_matmul_large(64, 96, 200);
    test_matmul_large(300, 64, 40);
    test_attention(2, 5, 4, 2, 8, 0, 0);   // GQA
    test_attention(2, 5, 2, 2, 8, 0, 0);   // plain multi-head
    test_attention(1, 4, 3, 1, 4, 0, 0);   // multi-query
    test_attention(1, 300, 2, 1, 8, 60, 0); // more rows than one attention block
    test_attention(2, 9, 4, 2, 8, 0, 3);   // block-causal: documents of 1..3 tokens
    test_attention(2, 300, 2, 1, 8, 60, 90); // block-causal, documents across attention blocks
    test_attention_parts(2, 2, 4, 4, 2, 8, 0);  // context parallelism: cp 2, GQA
    test_attention_parts(1, 4, 3, 2, 2, 8, 0);  // cp 4
    test_attention_parts(2, 3, 5, 4, 1, 8, 7);  // cp 3, block-causal documents across chunks
    test_attention_parts(1, 2, 150, 2, 1, 8, 0); // chunks over one attention block
    test_rope();
    test_gelu();
    test_matmul_fused(7, 5, 9, 1);
    test_matmul_fused(64, 96, 200, 1);
    test_matmul_fused(300, 64, 40, 0);
    test_matmul_fused(300, 256, 768, 0);
    test_matmul_act_backward(7, 5, 9, 0, 1);
    test_matmul_act_backward(64, 96, 200, 0, 1);
    test_matmul_act_backward(300, 64, 40, 0, 0);
    test_matmul_act_backward(7, 5, 9, 1, 0);
    test_matmul_act_backward(64, 96, 200, 1, 0);
    test_matmul_act_backward(300, 64, 40, 1, 1);
    for (int r = FP8_TENSORWISE; r <= FP8_ROWWISE; r++) {
        test_fp8_products(7, 5, 9, r);
        test_fp8_products(150, 130, 260, r); /* off the 128 grid every way */
        test_fp8_cp_groups(150, 130, 260, r);
    }
    { /* the fused MLP backwards under FP8: the unfused calls' bits still */
        Fp8Sizes z = {300 * 200, 200 * 96, 200 * 96, 1, 300};
        K->fp8_setup(FP8_BLOCKWISE, &z);
        K->fp8_scope(1);
        test_matmul_act_backward(64, 96, 200, 0, 1);
        test_matmul_act_backward(64, 96, 200, 1, 0);
        K->fp8_setup(-1, NULL);
    }
    test_add_norm(7, 33, 0, 1, 0);
    test_add_norm(64, 768, 0, 0, 1);
    test_add_norm(7, 33, 1, 0, 0);
    test_add_norm(64, 2048, 1, 0, 1);
    test_swiglu();
    test_crossentropy();
    test_crossentropy_vp();
    test_crossentropy_fused(5, 11);
    test_crossentropy_fused(64, 50257);
    test_adamw();
    test_adamw_multi();
    test_round_bf16();
    test_misc();
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
